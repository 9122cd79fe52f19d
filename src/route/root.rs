//! The relay's `ahp-root://` (contract §6.1–6.2): the merge of the up hosts'
//! root states with names qualified, and the fan-out of watch-link events as
//! numbered root actions and catalog notifications.

use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::names::namer::ToClient;
use crate::names::translate;
use crate::relay::Relay;
use crate::session::{ClientSession, SessionCore};
use crate::upstream::hub::HostStatus;
use crate::upstream::watch::{RootField, WatchEvent};

impl Relay {
    fn root_field(&self, field: RootField, session: &ClientSession) -> Value {
        let identity = session.identity();
        let mut items = Vec::new();
        let mut active = 0i64;
        let who = session.subject();
        for hub in self.hubs.values() {
            let Some(grant) = self.grant_on(who, hub) else {
                continue;
            };
            if field == RootField::ActiveSessions {
                let visible = hub.read(|v| {
                    v.catalog
                        .keys()
                        .filter(|uri| self.sees_session(who, &grant, hub, uri))
                        .count()
                });
                active += visible as i64;
                continue;
            }
            let Some(root) = hub.read(|v| {
                (v.status == HostStatus::Up)
                    .then(|| v.root.clone())
                    .flatten()
            }) else {
                continue;
            };
            let namer = ToClient {
                host: &hub.id,
                store: self.store.as_ref(),
                identity: Some(identity),
            };
            let (list, shape) = match field {
                RootField::Agents => (serde_json::to_value(&root.agents), "@Agent"),
                _ => (
                    serde_json::to_value(root.terminals.unwrap_or_default()),
                    "@TerminalInfo",
                ),
            };
            for mut item in list
                .ok()
                .and_then(|v| v.as_array().cloned())
                .unwrap_or_default()
            {
                if field == RootField::Terminals
                    && !self.sees_terminal_info(who, &grant, hub, &item)
                {
                    continue;
                }
                if translate::translate(&mut item, shape, &namer).is_err() {
                    continue;
                }
                if field == RootField::Agents
                    && let Some(name) = item.get_mut("displayName")
                {
                    *name = json!(format!(
                        "{} ({})",
                        name.as_str().unwrap_or_default(),
                        hub.label()
                    ));
                }
                items.push(item);
            }
        }
        match field {
            RootField::ActiveSessions => json!(active),
            _ => Value::Array(items),
        }
    }

    /// The relay's root state for one session: agents of up hosts with
    /// qualified providers and labelled names, their terminals, and the
    /// count of listed sessions; never `config` or host `_meta` (§6.1).
    pub fn merged_root(&self, session: &ClientSession) -> Value {
        json!({
            "agents": self.root_field(RootField::Agents, session),
            "terminals": self.root_field(RootField::Terminals, session),
            "activeSessions": self.root_field(RootField::ActiveSessions, session),
        })
    }

    /// Consumes watch-link events forever, turning them into numbered root
    /// actions and catalog notifications for every session that follows root.
    pub async fn run_fanout(self: Arc<Self>, mut events: mpsc::UnboundedReceiver<WatchEvent>) {
        while let Some(ev) = events.recv().await {
            match ev {
                WatchEvent::Status { host, status } => {
                    self.metrics
                        .host_up
                        .with_label_values(&[&host])
                        .set(i64::from(status == HostStatus::Up));
                    let all = [
                        RootField::Agents,
                        RootField::Terminals,
                        RootField::ActiveSessions,
                    ];
                    self.fan_root(&all);
                    if status == HostStatus::Up {
                        self.resync_orphans(&host);
                    }
                }
                WatchEvent::Root { fields, .. } => self.fan_root(&fields),
                WatchEvent::Catalog {
                    host,
                    method,
                    params,
                } => {
                    self.fan_catalog(&host, method, params);
                    self.fan_root(&[RootField::ActiveSessions]);
                }
            }
        }
    }

    /// Host `host` is back: clients whose last `reconnect` had to omit its
    /// channels are told to reconnect (4000) and get their snapshots (S16).
    fn resync_orphans(&self, host: &str) {
        let orphans: Vec<Arc<ClientSession>> = self
            .sessions
            .iter()
            .filter(|s| s.lock().orphaned.contains(host))
            .map(|s| s.clone())
            .collect();
        for s in orphans {
            s.lock().orphaned.remove(host);
            self.metrics
                .resyncs
                .with_label_values(&["host_returned"])
                .inc();
            s.close(4000, "resync: a host is back; reconnect now");
        }
    }

    fn followers(&self) -> Vec<Arc<ClientSession>> {
        self.sessions
            .iter()
            .filter(|s| s.follows_root())
            .map(|s| s.clone())
            .collect()
    }

    /// The merged root for `session`, remembered as what its client has seen.
    pub fn root_snapshot(&self, session: &ClientSession, core: &mut SessionCore) -> Value {
        let root = self.merged_root(session);
        if let Value::Object(fields) = &root {
            core.root_seen = fields.clone();
        }
        root
    }

    /// Sends each root follower the fields that changed for it.
    pub(crate) fn fan_root(&self, fields: &[RootField]) {
        for s in self.followers() {
            for field in fields {
                let value = self.root_field(*field, &s);
                let key = match field {
                    RootField::Agents => "agents",
                    RootField::Terminals => "terminals",
                    RootField::ActiveSessions => "activeSessions",
                };
                let mut core = s.lock();
                // Checked again under the lock: a snapshot `reconnect` may
                // have stopped root delivery (its cut) since `followers()`.
                if !core.subs.contains(ahp_types::ROOT_RESOURCE_URI)
                    || core.root_seen.get(key) == Some(&value)
                {
                    continue;
                }
                core.root_seen.insert(key.to_string(), value.clone());
                let action = match field {
                    RootField::Agents => json!({"type": "root/agentsChanged", "agents": value}),
                    RootField::Terminals => {
                        json!({"type": "root/terminalsChanged", "terminals": value})
                    }
                    RootField::ActiveSessions => {
                        json!({"type": "root/activeSessionsChanged", "activeSessions": value})
                    }
                };
                s.push_envelope(&mut core, |n| {
                    Some(
                        json!({"jsonrpc": "2.0", "method": "action", "params": {
                        "channel": ahp_types::ROOT_RESOURCE_URI, "action": action, "serverSeq": n}})
                        .to_string(),
                    )
                });
            }
        }
    }

    /// Sends a catalog notification to the followers that can see its
    /// session, under the policy in force now (§6.4).
    fn fan_catalog(&self, host: &str, method: &str, mut params: Value) {
        let host_session = params
            .get("session")
            .or_else(|| params.pointer("/summary/resource"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let namer = ToClient {
            host,
            store: self.store.as_ref(),
            identity: None,
        };
        if translate::translate(&mut params, method, &namer).is_err() {
            return;
        }
        let frame = json!({"jsonrpc": "2.0", "method": method, "params": params}).to_string();
        let Some(hub) = self.hubs.get(host) else {
            return;
        };
        for s in self.followers() {
            let who = s.subject();
            let visible = self
                .grant_on(who, hub)
                .is_some_and(|g| self.sees_session(who, &g, hub, &host_session));
            if visible {
                let mut core = s.lock();
                if core.subs.contains(ahp_types::ROOT_RESOURCE_URI) {
                    s.push(&mut core, frame.clone());
                }
            }
        }
    }
}

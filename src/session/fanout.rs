//! The fan-out of watch-link events (contract §6.2, §6.4): host root
//! changes become numbered root actions with the merged value, catalog
//! events become `root/session*` notifications, each delivered to exactly
//! the root followers allowed to see it, under the policy in force.

use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::ClientSession;
use super::registry::Registry;
use crate::names::namer::ToClient;
use crate::names::translate;
use crate::route::root;
use crate::rpc::Close;
use crate::upstream::hub::{HostHub, HostStatus};
use crate::upstream::watch::{RootField, WatchEvent};

/// The most watch-link events one fan-out pass takes from the queue.
const FANOUT_BATCH: usize = 1024;

impl Registry {
    /// Consumes watch-link events forever, turning them into numbered root
    /// actions and catalog notifications for every session that follows
    /// root. Events are taken in batches of what is queued (up to
    /// [`FANOUT_BATCH`]) and coalesced ([`Batch`]): one host's churn costs
    /// every follower one notification per changed session and at most one
    /// recount of each root field per batch, not one per event.
    pub async fn run_fanout(self: Arc<Self>, mut events: mpsc::UnboundedReceiver<WatchEvent>) {
        let mut queued = Vec::with_capacity(FANOUT_BATCH);
        while events.recv_many(&mut queued, FANOUT_BATCH).await > 0 {
            let mut batch = Batch::default();
            for ev in queued.drain(..) {
                self.take(&mut batch, ev);
            }
            self.fan_batch(batch);
        }
    }

    /// Adds one event to `batch`; status changes and limit hits are
    /// counted at once.
    fn take(&self, batch: &mut Batch, ev: WatchEvent) {
        match ev {
            WatchEvent::Status { host, status } => {
                self.env
                    .metrics
                    .host_up
                    .with_label_values(&[&host])
                    .set(i64::from(status == HostStatus::Up));
                batch.dirty(&ALL_FIELDS);
                if status == HostStatus::Up {
                    batch.back_up.push(host);
                }
            }
            WatchEvent::Root { fields, .. } => batch.dirty(&fields),
            WatchEvent::LimitHit { limit, .. } => {
                self.env
                    .metrics
                    .limit_hits
                    .with_label_values(&[limit])
                    .inc();
            }
            WatchEvent::Catalog {
                host,
                method,
                params,
            } => batch.catalog(host, method, params),
        }
    }

    /// Delivers a coalesced batch: catalog notifications in order, then the
    /// root fields that changed, then the resync of hosts that came back.
    fn fan_batch(&self, batch: Batch) {
        for (host, method, params) in batch.notifications {
            // A host removed meanwhile has no hub: its events are moot.
            if let Some(hub) = self.env.hosts.get(&host) {
                self.fan_catalog(&hub, method, params);
            }
        }
        if !batch.fields.is_empty() {
            self.fan_root(&batch.fields);
        }
        for host in batch.back_up {
            self.resync_orphans(&host);
        }
    }

    /// Host `host` is back: clients whose last `reconnect` had to omit its
    /// channels are told to reconnect (4000) and get their snapshots (S16).
    fn resync_orphans(&self, host: &str) {
        let orphans: Vec<Arc<ClientSession>> = self
            .sessions
            .iter()
            .filter(|s| s.lock().channels.orphaned.contains(host))
            .map(|s| s.clone())
            .collect();
        for s in orphans {
            s.lock().channels.orphaned.remove(host);
            self.env
                .metrics
                .resyncs
                .with_label_values(&["host_returned"])
                .inc();
            s.close(Close::ResyncHostBack);
        }
    }

    fn followers(&self) -> Vec<Arc<ClientSession>> {
        self.sessions
            .iter()
            .filter(|s| s.follows_root())
            .map(|s| s.clone())
            .collect()
    }

    /// Sends each root follower the fields that changed for it.
    pub fn fan_root(&self, fields: &[RootField]) {
        for s in self.followers() {
            for field in fields {
                let value = root::root_field(&self.env, *field, s.who().caller());
                let key = match field {
                    RootField::Agents => "agents",
                    RootField::Terminals => "terminals",
                    RootField::ActiveSessions => "activeSessions",
                };
                let mut core = s.lock();
                // Checked again under the lock: a snapshot `reconnect` may
                // have stopped root delivery (its cut) since `followers()`.
                if !core.channels.subs.contains(ahp_types::ROOT_RESOURCE_URI)
                    || core.channels.root_seen.get(key) == Some(&value)
                {
                    continue;
                }
                core.channels
                    .root_seen
                    .insert(key.to_string(), value.clone());
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
    fn fan_catalog(&self, hub: &HostHub, method: &str, mut params: Value) {
        let host_session = params
            .get("session")
            .or_else(|| params.pointer("/summary/resource"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let namer = ToClient {
            host: &hub.id,
            store: self.env.store.as_ref(),
            identity: None,
        };
        if translate::translate(&mut params, method, &namer).is_err() {
            return;
        }
        let frame = crate::rpc::notification_frame(method, &params);
        for s in self.followers() {
            let now = s.who();
            let who = now.subject();
            let visible = self
                .env
                .access
                .grant_on(who, hub)
                .is_some_and(|g| self.env.access.sees_session(who, &g, hub, &host_session));
            if visible {
                let mut core = s.lock();
                if core.channels.subs.contains(ahp_types::ROOT_RESOURCE_URI) {
                    s.push(&mut core, frame.clone());
                }
            }
        }
    }

    /// Hosts left the configuration (or were replaced by a changed one,
    /// contract §8.1): each of their sessions leaves through
    /// `root/sessionRemoved` to the followers that could see it, every
    /// client session drops its link to them, clients that followed their
    /// channels are resynchronised (4000: their `reconnect` reports those
    /// channels missing), and root followers get the merged root without
    /// them. Nobody else is disconnected.
    pub fn hosts_removed(&self, removed: &[Arc<HostHub>]) {
        for hub in removed {
            let sessions: Vec<String> = hub.read(|v| v.catalog.keys().cloned().collect());
            for uri in sessions {
                let params = json!({"channel": ahp_types::ROOT_RESOURCE_URI, "session": uri});
                self.fan_catalog(hub, "root/sessionRemoved", params);
            }
            let all: Vec<Arc<ClientSession>> = self.sessions.iter().map(|s| s.clone()).collect();
            for s in all {
                if s.forget_host(&hub.id) {
                    let m = &self.env.metrics;
                    m.resyncs.with_label_values(&["host_removed"]).inc();
                    s.close(Close::ResyncHostRemoved);
                }
            }
            tracing::info!(host = %hub.id, "host removed");
        }
        self.fan_root(&[
            RootField::Agents,
            RootField::Terminals,
            RootField::ActiveSessions,
        ]);
    }
}

/// Every root field.
const ALL_FIELDS: [RootField; 3] = [
    RootField::Agents,
    RootField::Terminals,
    RootField::ActiveSessions,
];

/// Watch-link events taken together. Consecutive summary changes of one
/// session (no add or remove of it between) merge into one notification
/// whose `changes` hold the latest value of each field — what a client
/// reducing them one by one would end with. Only adds and removes change
/// `activeSessions`, so only they (and status and root events) mark root
/// fields for a recount, once per batch.
#[derive(Default)]
struct Batch {
    notifications: Vec<(Arc<str>, &'static str, Value)>,
    /// (host, session) → index of its last summary change in
    /// `notifications`, while nothing else about that session followed.
    open_summary: std::collections::HashMap<(Arc<str>, String), usize>,
    fields: Vec<RootField>,
    back_up: Vec<Arc<str>>,
}

impl Batch {
    fn dirty(&mut self, fields: &[RootField]) {
        for f in fields {
            if !self.fields.contains(f) {
                self.fields.push(*f);
            }
        }
    }

    fn catalog(&mut self, host: Arc<str>, method: &'static str, params: Value) {
        let session = params
            .get("session")
            .or_else(|| params.pointer("/summary/resource"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let key = (host.clone(), session);
        if method != "root/sessionSummaryChanged" {
            self.open_summary.remove(&key);
            self.dirty(&[RootField::ActiveSessions]);
            self.notifications.push((host, method, params));
            return;
        }
        let merged = self
            .open_summary
            .get(&key)
            .and_then(|&i| self.notifications.get_mut(i))
            .and_then(|(_, _, earlier)| earlier.get_mut("changes"))
            .and_then(Value::as_object_mut);
        match (merged, params.get("changes").and_then(Value::as_object)) {
            (Some(earlier), Some(later)) => {
                for (k, v) in later {
                    earlier.insert(k.clone(), v.clone());
                }
            }
            _ => {
                self.open_summary.insert(key, self.notifications.len());
                self.notifications.push((host, method, params));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(session: &str, changes: Value) -> Value {
        json!({"channel": "ahp-root://", "session": session, "changes": changes})
    }

    #[test]
    fn summary_changes_of_one_session_merge_to_the_latest_values() {
        let h: Arc<str> = "h1".into();
        let mut b = Batch::default();
        b.catalog(
            h.clone(),
            "root/sessionSummaryChanged",
            summary("s1", json!({"title": "a", "status": 1})),
        );
        b.catalog(
            h.clone(),
            "root/sessionSummaryChanged",
            summary("s2", json!({"title": "x"})),
        );
        b.catalog(
            h.clone(),
            "root/sessionSummaryChanged",
            summary("s1", json!({"title": "b"})),
        );
        assert_eq!(b.notifications.len(), 2);
        assert_eq!(
            b.notifications[0].2["changes"],
            json!({"title": "b", "status": 1})
        );
        assert_eq!(b.notifications[1].2["changes"], json!({"title": "x"}));
        assert!(b.fields.is_empty(), "summary changes recount nothing");
    }

    #[test]
    fn an_add_or_remove_between_keeps_order_and_recounts_once() {
        let h: Arc<str> = "h1".into();
        let mut b = Batch::default();
        b.catalog(
            h.clone(),
            "root/sessionSummaryChanged",
            summary("s1", json!({"title": "a"})),
        );
        b.catalog(
            h.clone(),
            "root/sessionRemoved",
            json!({"channel": "ahp-root://", "session": "s1"}),
        );
        b.catalog(
            h.clone(),
            "root/sessionAdded",
            json!({"channel": "ahp-root://", "summary": {"resource": "s1"}}),
        );
        b.catalog(
            h.clone(),
            "root/sessionSummaryChanged",
            summary("s1", json!({"title": "b"})),
        );
        let methods: Vec<&str> = b.notifications.iter().map(|n| n.1).collect();
        assert_eq!(
            methods,
            [
                "root/sessionSummaryChanged",
                "root/sessionRemoved",
                "root/sessionAdded",
                "root/sessionSummaryChanged"
            ]
        );
        assert_eq!(b.fields, vec![RootField::ActiveSessions]);
    }
}

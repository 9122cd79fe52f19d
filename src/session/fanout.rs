//! The fan-out of watch-link events (contract §6.2, §6.4): host root
//! changes become numbered root actions with the merged value, catalog
//! events become `root/session*` notifications, each delivered to exactly
//! the root followers allowed to see it, under the policy in force.

use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::ClientSession;
use super::registry::Registry;
use crate::names::namer::{REMOVALS, Removal, ToClient};
use crate::names::qualify::{ChannelKind, channel_kind};
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
    /// root. The queue is bounded (`limits.fanout_queue_events`): a full
    /// one makes the watch links wait, so hosts are read no faster than
    /// their events fan out. Events are taken in batches of what is queued (up to
    /// [`FANOUT_BATCH`]) and coalesced ([`Batch`]): one host's churn costs
    /// every follower one notification per changed session and at most one
    /// recount of each root field per batch, not one per event.
    pub async fn run_fanout(self: Arc<Self>, mut events: mpsc::Receiver<WatchEvent>) {
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
            WatchEvent::Root { host, fields } => {
                batch.dirty(&fields);
                if fields.contains(&RootField::Terminals) {
                    // A terminal's claim may have changed (§7.6).
                    batch.claims_changed(host);
                }
            }
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
                moved,
            } => batch.catalog(host, method, params, moved),
        }
    }

    /// Delivers a coalesced batch: catalog notifications in order, then the
    /// root fields that changed, then the re-evaluation of the
    /// subscriptions the batch may take from someone (§7.6) — terminals of
    /// hosts whose claims or sessions changed, chats listed under another
    /// session than before (they may have moved) — then the resync of hosts
    /// that came back.
    fn fan_batch(&self, batch: Batch) {
        // Who follows root, read once for the batch (each follower is checked
        // again under its lock before anything is pushed to it). With none,
        // the catalog notifications are neither translated nor written.
        let followers = self.followers();
        if !followers.is_empty() {
            for (host, method, params) in batch.notifications {
                // A host removed meanwhile has no hub: its events are moot.
                if let Some(hub) = self.env.hosts.get(&host) {
                    self.fan_catalog_to(&followers, &hub, method, params);
                }
            }
        }
        if !batch.fields.is_empty() {
            self.fan_root_to(&followers, &batch.fields);
        }
        for host in batch.claims {
            let listed = self.listed_terminal(&host);
            self.reevaluate_subscribers(&host, "terminal_claim", listed);
        }
        for (host, moved) in batch.moved_chats {
            self.reevaluate_subscribers(&host, "chat_moved", |uri| moved.iter().any(|c| c == uri));
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

    /// A session, chat or terminal created through the relay on `host` was
    /// disposed and its store entry tombstoned: until then the relay still
    /// counted it as "created, not listed yet", so the terminals it claimed
    /// are re-filtered for root followers and their subscribers
    /// re-evaluated now (§7.6).
    pub fn after_dispose(&self, host: &str) {
        self.fan_root(&[RootField::Terminals]);
        let listed = self.listed_terminal(host);
        self.reevaluate_subscribers(host, "terminal_claim", listed);
    }

    /// Chat `chat` (host form) of `host` moved to another session through
    /// the relay: its subscribers are re-evaluated (§7.6).
    pub fn chat_moved(&self, host: &str, chat: &str) {
        self.reevaluate_subscribers(host, "chat_moved", |uri| uri == chat);
    }

    /// Re-evaluates the sessions subscribed on `host` to a channel `which`
    /// selects (host form; one that still exists) after it may have changed
    /// hands — a terminal claimed anew, a chat moved to another session
    /// (contract §7.6). A session that can no longer see one of them forgets
    /// what it may no longer see ([`ClientSession::forget_invisible`], as
    /// after a policy change) and is closed with 4000, so its `reconnect`
    /// answers without it. A channel that is merely gone (disposed) closes
    /// nobody. Each call looks at every session's subscriptions on `host`
    /// once, so it runs only when something may have changed hands (a chat
    /// listed again under its own session does not); only those subscribers
    /// are evaluated and closed.
    fn reevaluate_subscribers(&self, host: &str, cause: &str, which: impl Fn(&str) -> bool) {
        let affected: Vec<(Arc<ClientSession>, Vec<String>)> = self
            .sessions
            .iter()
            .filter_map(|s| {
                let core = s.lock();
                let chans = core.channels.chans.get(host)?;
                let picked: Vec<String> = chans
                    .iter()
                    .filter(|(uri, _)| which(uri))
                    .map(|(_, chan)| chan.client().to_string())
                    .collect();
                (!picked.is_empty()).then(|| (s.clone(), picked))
            })
            .collect();
        for (s, picked) in affected {
            let now = s.who();
            let lost = picked
                .iter()
                .any(|c| crate::route::router::lost_to(&self.env, now.caller(), c));
            if lost && s.forget_invisible() {
                let m = &self.env.metrics;
                m.resyncs.with_label_values(&[cause]).inc();
                s.close(Close::ResyncAccess);
            }
        }
    }

    /// The terminals (host form) `host` lists now: the ones whose claim may
    /// have moved (a disposed terminal is gone, not moved).
    fn listed_terminal(&self, host: &str) -> impl Fn(&str) -> bool + use<> {
        let hub = self.env.hosts.get(host);
        move |uri: &str| {
            channel_kind(uri) == ChannelKind::Terminal
                && hub
                    .as_ref()
                    .is_some_and(|h| h.terminal_claim(uri).is_some())
        }
    }

    /// Sends each root follower the fields that changed for it.
    ///
    /// The value is computed under the session's lock, so what it compares
    /// with `root_seen` and sends is never older than what another fan-out
    /// (a policy reload, a dispose's tombstone, the watch links' task) or a
    /// `reconnect` snapshot wrote there meanwhile: each computes the state
    /// at the moment it holds the lock, and every change is followed by a
    /// fan-out, so the last value sent is the current one (found by
    /// `tests/relay_model.rs`: a value computed before a reload reached the
    /// client after the reload's).
    pub fn fan_root(&self, fields: &[RootField]) {
        self.fan_root_to(&self.followers(), fields);
    }

    /// [`Self::fan_root`] to `followers`, a recent [`Self::followers`].
    fn fan_root_to(&self, followers: &[Arc<ClientSession>], fields: &[RootField]) {
        for s in followers {
            for field in fields {
                let key = match field {
                    RootField::Agents => "agents",
                    RootField::Terminals => "terminals",
                    RootField::ActiveSessions => "activeSessions",
                };
                let mut core = s.lock();
                // Checked under the lock: a snapshot `reconnect` may have
                // stopped root delivery (its cut) since `followers()`.
                if !core.channels.subs.contains(ahp_types::ROOT_RESOURCE_URI) {
                    continue;
                }
                let value = root::root_field(&self.env, *field, s.who().caller());
                if core.channels.root_seen.get(key) == Some(&value) {
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
                    let n = n.value();
                    Some(
                        json!({"jsonrpc": "2.0", "method": "action", "params": {
                        "channel": ahp_types::ROOT_RESOURCE_URI, "action": action, "serverSeq": n}})
                        .to_string()
                        .into(),
                    )
                });
            }
        }
    }

    /// Sends a catalog notification to the followers that can see its
    /// session, under the policy in force now (§6.4).
    fn fan_catalog(&self, hub: &HostHub, method: &str, params: Value) {
        self.fan_catalog_to(&self.followers(), hub, method, params);
    }

    /// [`Self::fan_catalog`] to `followers`, a recent [`Self::followers`]
    /// (one that stopped following since is skipped under its lock).
    fn fan_catalog_to(
        &self,
        followers: &[Arc<ClientSession>],
        hub: &HostHub,
        method: &str,
        mut params: Value,
    ) {
        let host_session = params
            .get("session")
            .or_else(|| params.pointer("/summary/resource"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        // A chat whose dispose was answered is not shown again by a summary
        // still on its way (§6.3).
        hub.read(|v| {
            for container in ["changes", "summary"] {
                if let Some(c) = params.get_mut(container) {
                    v.drop_disposed_chats(c);
                }
            }
        });
        let to_client = ToClient {
            host: &hub.id,
            store: self.env.store.as_ref(),
            identity: None,
        };
        let translated = if REMOVALS.contains(&method) {
            let removal = Removal::new(&to_client, self.env.store.as_ref(), &hub.id);
            translate::translate(&mut params, method, &removal)
        } else {
            translate::translate(&mut params, method, &to_client)
        };
        if translated.is_err() {
            return;
        }
        let frame = crate::rpc::notification_frame(method, &params);
        for s in followers {
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
    /// Hosts whose terminal claims may have changed: a root `terminals`
    /// change, or a session of theirs that came or went.
    claims: Vec<Arc<str>>,
    /// Per host, the chats summary changes listed under another session
    /// than before (host form): they may have changed hands.
    moved_chats: Vec<(Arc<str>, Vec<String>)>,
}

impl Batch {
    fn dirty(&mut self, fields: &[RootField]) {
        for f in fields {
            if !self.fields.contains(f) {
                self.fields.push(*f);
            }
        }
    }

    fn claims_changed(&mut self, host: Arc<str>) {
        if !self.claims.contains(&host) {
            self.claims.push(host);
        }
    }

    fn catalog(&mut self, host: Arc<str>, method: &'static str, params: Value, moved: Vec<String>) {
        if !moved.is_empty() {
            self.moved_chats.push((host.clone(), moved));
        }
        let session = params
            .get("session")
            .or_else(|| params.pointer("/summary/resource"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let key = (host.clone(), session);
        if method != "root/sessionSummaryChanged" {
            self.open_summary.remove(&key);
            // A session that came or went changes the count and who sees
            // the terminals it claims.
            self.dirty(&[RootField::ActiveSessions, RootField::Terminals]);
            self.claims_changed(host.clone());
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
            Vec::new(),
        );
        b.catalog(
            h.clone(),
            "root/sessionSummaryChanged",
            summary("s2", json!({"title": "x"})),
            Vec::new(),
        );
        b.catalog(
            h.clone(),
            "root/sessionSummaryChanged",
            summary("s1", json!({"title": "b"})),
            Vec::new(),
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
            Vec::new(),
        );
        b.catalog(
            h.clone(),
            "root/sessionRemoved",
            json!({"channel": "ahp-root://", "session": "s1"}),
            Vec::new(),
        );
        b.catalog(
            h.clone(),
            "root/sessionAdded",
            json!({"channel": "ahp-root://", "summary": {"resource": "s1"}}),
            Vec::new(),
        );
        b.catalog(
            h.clone(),
            "root/sessionSummaryChanged",
            summary("s1", json!({"title": "b"})),
            Vec::new(),
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
        assert_eq!(
            b.fields,
            vec![RootField::ActiveSessions, RootField::Terminals]
        );
        assert_eq!(b.claims, vec![h]);
    }
}

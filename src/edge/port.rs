//! Everything the edge uses of the rest of the relay, in one place.
//!
//! The edge (listeners, layers, the upgrade and the socket loop) reaches the
//! relay only through [`RelayPort`], so replacing the relay behind it means
//! changing this file alone. The socket loop's calls into the session
//! (`on_client_frame`) go through the [`Conn`] made here.

use std::sync::Arc;

use tokio::sync::watch;

use super::history::{HostSample, Sample};
use crate::auth::{Authenticator, Principal};
use crate::config::{Limits, ListenConfig};
use crate::metrics::Metrics;
use crate::relay::Relay;
use crate::rpc::Close;

/// Seconds since the Unix epoch (the clock tokens are checked against).
pub use crate::identity::unix_now;
use crate::session::ClientSession;
use crate::session::outbox::Outbox;
/// Keeps a principal's connection slot for as long as its socket lives.
pub use crate::session::registry::ConnectionGuard;
use crate::session::request::Conn;

/// The edge's handle on the relay (cheap to clone).
#[derive(Clone)]
pub struct RelayPort {
    relay: Arc<Relay>,
}

impl std::fmt::Debug for RelayPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayPort").finish_non_exhaustive()
    }
}

impl RelayPort {
    /// The edge's handle on `relay`.
    pub fn new(relay: Arc<Relay>) -> Self {
        Self { relay }
    }

    /// The configured bounds.
    pub fn limits(&self) -> &Limits {
        &self.relay.cfg.limits
    }

    /// The listener settings.
    pub fn listen(&self) -> &ListenConfig {
        &self.relay.cfg.listen
    }

    /// The relay's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.relay.metrics
    }

    /// Token verification and revocation.
    pub fn auth(&self) -> &Authenticator {
        &self.relay.auth
    }

    /// Checks the store's health now and records the outcome and its
    /// duration in the metrics that `/metrics` and `/status` show (§12.1);
    /// blocks for a round trip with PostgreSQL: call it off the runtime.
    pub fn probe_store(&self) -> bool {
        let store = &self.relay.store;
        let started = std::time::Instant::now();
        let ok = store.health().is_ok();
        let took = started.elapsed();
        let m = self.metrics();
        m.store_up
            .with_label_values(&[store.backend()])
            .set(i64::from(ok));
        m.store_health_seconds.set(took.as_secs_f64());
        ok
    }

    /// The store's backend and its last probed health, for `/status`.
    fn store_row(&self) -> serde_json::Value {
        let m = self.metrics();
        let backend = self.relay.store.backend();
        let up = m
            .store_up
            .get_metric_with_label_values(&[backend])
            .is_ok_and(|g| g.get() == 1);
        serde_json::json!({
            "backend": backend,
            "healthy": up,
            "latency_ms": m.store_health_seconds.get() * 1000.0,
            "writes": m.store_write_seconds.get_sample_count(),
            "last_write_ms": m.store_last_write_seconds.get() * 1000.0,
        })
    }

    /// The hub of host `id` (connectors authenticate against its config).
    pub fn hub(&self, id: &str) -> Option<Arc<crate::upstream::hub::HostHub>> {
        self.relay.hub(id)
    }

    /// The attached connectors of dial-in hosts (contract §13).
    pub fn connectors(&self) -> Arc<crate::upstream::dial_in::Connectors> {
        self.relay.hosts.connectors().clone()
    }

    /// Whether new upgrades are refused for replay memory (contract §5.4).
    pub fn refuses_upgrades(&self) -> bool {
        self.relay.refuses_upgrades()
    }

    /// Counts a connection of `principal`, or `None` at its cap (§3.6).
    pub fn admit_connection(&self, principal: &Principal) -> Option<ConnectionGuard> {
        self.relay.registry.admit_connection(principal)
    }

    /// The session-side state of a new client socket: a fresh socket id,
    /// its outbox and close switch.
    pub fn open_conn(
        &self,
        principal: Principal,
        out: Outbox,
        kill: watch::Sender<Option<Close>>,
    ) -> Conn {
        Conn::new(self.relay.registry.clone(), principal, out, kill)
    }

    /// What the status page shows: hosts, client sessions per principal,
    /// reconnect outcomes and recent denials (read-only; no URL,
    /// credential, clientId or message text).
    pub fn status(&self) -> serde_json::Value {
        let m = self.metrics();
        m.status_builds.inc();
        let outcome = |o: &str| {
            m.reconnects
                .get_metric_with_label_values(&[o])
                .map_or(0, |c| c.get())
        };
        let (replay, snapshot) = (outcome("replay"), outcome("snapshot"));
        let ratio = if replay + snapshot == 0 {
            0.0
        } else {
            snapshot as f64 / (replay + snapshot) as f64
        };
        let hosts: Vec<_> = self.relay.hubs().map(|h| h.row()).collect();
        serde_json::json!({
            "relay": {"replica": &self.relay.replica, "version": env!("CARGO_PKG_VERSION")},
            "hosts": hosts,
            "principals": self.relay.registry.status_rows(),
            "reconnects": {"replay": replay, "snapshot": snapshot,
                "adopted": outcome("adopted"), "not_found": outcome("not_found"),
                "snapshot_fallback_ratio": ratio},
            "denials": crate::policy::recent::denials(),
            "store": self.store_row(),
        })
    }

    /// The counters and gauges the status page's history records once per
    /// interval (read-only; not counted in `status_builds`). A host's RTT is
    /// given only while it is up.
    pub fn sample(&self) -> Sample {
        let m = self.metrics();
        let outcome = |o: &str| {
            m.reconnects
                .get_metric_with_label_values(&[o])
                .map_or(0, |c| c.get())
        };
        let n = self.relay.registry.attachment();
        let hosts = self
            .relay
            .hubs()
            .map(|h| {
                let row = h.row();
                HostSample {
                    id: row.id,
                    rtt_ms: row.rtt_ms.filter(|_| row.state == "up"),
                    links: row.links,
                }
            })
            .collect();
        Sample {
            envelopes_relayed: m.envelopes_relayed.get(),
            attached: n.attached,
            detached: n.detached,
            retained: n.retained,
            reconnects: [
                outcome("replay"),
                outcome("snapshot"),
                outcome("adopted"),
                outcome("not_found"),
            ],
            hosts,
        }
    }

    /// Whether `principal` may see the status page on the client listener:
    /// an `admin` grant on every configured host (the page shows them all).
    pub fn is_admin(&self, principal: &Principal) -> bool {
        let key = crate::identity::PrincipalKey {
            issuer: principal.issuer.clone(),
            subject: principal.subject.clone(),
        };
        let who = crate::policy::Subject {
            principal: &key,
            groups: &principal.groups,
        };
        let policy = self.relay.access.policy();
        let mut hubs = self.relay.hubs().peekable();
        hubs.peek().is_some()
            && hubs.all(|h| {
                let host = crate::policy::HostRef {
                    id: &h.id,
                    label: h.cfg.label.as_deref(),
                };
                policy.grant(who, host).is_some_and(|g| g.dispose_others)
            })
    }

    /// Detaches `session` from `socket` (the socket closes or is closing).
    pub fn detach(&self, session: &Arc<ClientSession>, socket: u64) {
        self.relay.registry.detach(session, socket);
    }
}

//! The relay as a whole: configuration, secret, URI store, hosts, client
//! sessions, and what is computed across hosts — the merged root, the
//! merged session list, and the fan-out of watch-link events (contract §6).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use dashmap::DashMap;
use hmac::{Hmac, KeyInit, Mac};
use serde_json::json;
use sha2::Sha256;
use tokio::sync::mpsc;

use crate::config::RelayConfig;
use crate::edge::auth::Authenticator;
use crate::metrics::Metrics;
use crate::route::store::UriStore;
use crate::rpc::RpcError;
use crate::session::sequence::SequenceOrigins;
use crate::session::{ClientSession, PrincipalKey, SessionKey};
use crate::upstream::hub::{HostHub, HostStatus};
use crate::upstream::watch::WatchEvent;
use crate::wire::WireLimits;

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    jiff::Timestamp::now().as_second().max(0) as u64
}

/// The relay's shared state.
pub struct Relay {
    /// Validated configuration.
    pub cfg: Arc<RelayConfig>,
    pub(crate) mac_key: HmacSha256,
    /// The durable URI store.
    pub store: Arc<dyn UriStore>,
    pub(crate) hubs: BTreeMap<String, Arc<HostHub>>,
    pub(crate) sessions: DashMap<SessionKey, Arc<ClientSession>>,
    /// S0 allocator.
    pub origins: SequenceOrigins,
    /// Limits for client frames.
    pub client_limits: WireLimits,
    /// Limits for host frames.
    pub upstream_limits: WireLimits,
    /// Metrics.
    pub metrics: Metrics,
    /// Token verification.
    pub auth: Authenticator,
    policy: std::sync::RwLock<Arc<dyn crate::policy::Policy>>,
    next_socket: AtomicU64,
    watch_tasks: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    resyncs: std::sync::Mutex<(std::time::Instant, u32)>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("hosts", &self.hubs.keys().collect::<Vec<_>>())
            .field("sessions", &self.sessions.len())
            .finish_non_exhaustive()
    }
}

type HmacSha256 = Hmac<Sha256>;

/// Methods counted by name in metrics; anything else is `other`.
const METHOD_LABELS: &[&str] = &[
    "initialize",
    "reconnect",
    "ping",
    "subscribe",
    "listSessions",
    "createSession",
    "disposeSession",
    "createChat",
    "disposeChat",
    "createTerminal",
    "disposeTerminal",
    "fetchTurns",
    "completions",
    "moveChat",
    "resolveSessionConfig",
    "sessionConfigCompletions",
    "authenticate",
];

impl Relay {
    /// Builds the relay from a validated configuration and starts one watch
    /// link per host, whose events `run_fanout` must consume.
    pub fn new(
        cfg: RelayConfig,
        secret: Vec<u8>,
        store: Arc<dyn UriStore>,
        auth: Authenticator,
    ) -> Result<(Arc<Self>, mpsc::UnboundedReceiver<WatchEvent>), String> {
        let metrics = Metrics::new().map_err(|e| e.to_string())?;
        let mac_key = <HmacSha256 as KeyInit>::new_from_slice(&secret)
            .map_err(|e| format!("relay secret unusable as HMAC key: {e}"))?;
        let mut hubs = BTreeMap::new();
        for h in &cfg.hosts {
            let hub = HostHub::new(h.clone()).map_err(|e| format!("host {}: {e}", h.id))?;
            hubs.insert(h.id.clone(), Arc::new(hub));
        }
        let limits = &cfg.limits;
        let client_limits = WireLimits {
            max_frame_bytes: limits.max_frame_bytes,
            max_depth: limits.max_json_depth,
        };
        let upstream_limits = WireLimits {
            max_frame_bytes: 64 * 1024 * 1024,
            max_depth: 256,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let relay = Arc::new(Self {
            cfg: Arc::new(cfg),
            mac_key,
            store,
            hubs,
            sessions: DashMap::new(),
            origins: SequenceOrigins::new(),
            client_limits,
            upstream_limits,
            metrics,
            auth,
            policy: std::sync::RwLock::new(Arc::new(crate::policy::AllowAll)),
            next_socket: AtomicU64::new(1),
            watch_tasks: std::sync::Mutex::new(Vec::new()),
            resyncs: std::sync::Mutex::new((std::time::Instant::now(), 0)),
        });
        let tasks: Vec<_> = relay
            .hubs
            .values()
            .map(|hub| {
                let ping = relay.cfg.limits.link_ping();
                tokio::spawn(crate::upstream::watch::run(hub.clone(), tx.clone(), ping))
            })
            .collect();
        if let Ok(mut t) = relay.watch_tasks.lock() {
            *t = tasks;
        }
        Ok((relay, rx))
    }

    /// The access-control decision point in force.
    pub fn policy(&self) -> Arc<dyn crate::policy::Policy> {
        self.policy
            .read()
            .map(|p| p.clone())
            .unwrap_or_else(|e| e.into_inner().clone())
    }

    /// Replaces the policy; the next request is decided by the new one
    /// (contract §7.6).
    pub fn set_policy(&self, policy: Arc<dyn crate::policy::Policy>) {
        match self.policy.write() {
            Ok(mut p) => *p = policy,
            Err(e) => *e.into_inner() = policy,
        }
    }

    /// How long to wait before closing a client for resync (contract §5.8):
    /// the first `RESYNC_BURST` resyncs of any second go at once; beyond
    /// that, each is delayed by a pseudo-random share of
    /// `limits.resync_spread_ms` (keyed by the client), so a host restart
    /// does not make every client reconnect in the same instant.
    pub fn resync_delay(&self, key: &str) -> std::time::Duration {
        const RESYNC_BURST: u32 = 16;
        let now = std::time::Instant::now();
        let burst = match self.resyncs.lock() {
            Ok(mut w) => {
                if now.duration_since(w.0) > std::time::Duration::from_secs(1) {
                    *w = (now, 0);
                }
                w.1 += 1;
                w.1
            }
            Err(_) => 0,
        };
        if burst <= RESYNC_BURST {
            return std::time::Duration::ZERO;
        }
        let mut h = self.mac_key.clone();
        h.update(key.as_bytes());
        h.update(&burst.to_be_bytes());
        let bytes = h.finalize().into_bytes();
        let r = u64::from_be_bytes(
            bytes
                .get(..8)
                .and_then(|b| b.try_into().ok())
                .unwrap_or([0; 8]),
        );
        std::time::Duration::from_millis(r % (self.cfg.limits.resync_spread_ms + 1))
    }

    /// The principal that created `uri` on `host` through the relay, if one did.
    pub fn owner_of(&self, host: &str, uri: &str) -> Option<crate::route::store::Owner> {
        self.store
            .lookup(uri)
            .ok()
            .flatten()
            .filter(|e| e.host == host)
            .map(|e| e.owner)
    }

    /// Ends every client session (their links close).
    pub fn stop_sessions(&self) {
        let all: Vec<Arc<ClientSession>> = self.sessions.iter().map(|s| s.clone()).collect();
        self.sessions.clear();
        for s in all {
            s.close(1012, "relay restarting");
            s.shut();
        }
    }

    /// Stops every watch link (their host connections close).
    pub fn stop_watch_links(&self) {
        if let Ok(mut tasks) = self.watch_tasks.lock() {
            for t in tasks.drain(..) {
                t.abort();
            }
        }
    }

    /// A new socket id.
    pub fn next_socket(&self) -> u64 {
        self.next_socket.fetch_add(1, Ordering::Relaxed)
    }

    /// The hub of host `id`.
    pub fn hub(&self, id: &str) -> Option<&Arc<HostHub>> {
        self.hubs.get(id)
    }

    /// Every hub, by id.
    pub fn hubs(&self) -> impl Iterator<Item = &Arc<HostHub>> {
        self.hubs.values()
    }

    /// The metric label of a method.
    pub fn method_label(&self, method: &str) -> &'static str {
        METHOD_LABELS
            .iter()
            .find(|m| **m == method)
            .copied()
            .unwrap_or("other")
    }

    /// The upstream client id of session (P, c) (contract §2, B2):
    /// `r1.` + b64url(HMAC(k, P))[..11] + `.` + b64url(HMAC(k, P‖0x00‖c))[..16],
    /// where P is the issuer's length (4 bytes, big endian), the issuer and the subject.
    pub fn upstream_id(&self, p: &PrincipalKey, client_id: &str) -> String {
        let mut principal = (p.issuer.len() as u32).to_be_bytes().to_vec();
        principal.extend_from_slice(p.issuer.as_bytes());
        principal.extend_from_slice(p.subject.as_bytes());
        let mac = |parts: &[&[u8]]| -> String {
            let mut m = self.mac_key.clone();
            for part in parts {
                m.update(part);
            }
            B64.encode(m.finalize().into_bytes())
        };
        let who = mac(&[&principal]);
        let client = mac(&[&principal, &[0], client_id.as_bytes()]);
        format!(
            "r1.{}.{}",
            who.get(..11).unwrap_or(&who),
            client.get(..16).unwrap_or(&client)
        )
    }

    /// Registers a session, superseding (4009) one with the same key.
    pub fn attach(&self, session: Arc<ClientSession>) -> Result<(), RpcError> {
        let same_principal = self
            .sessions
            .iter()
            .filter(|s| s.key().principal == session.key.principal)
            .count();
        if same_principal >= self.cfg.limits.sessions_per_principal
            && !self.sessions.contains_key(&session.key)
        {
            return Err(RpcError::internal(
                "too many client sessions for this principal",
                Some(json!({"reason": "sessionLimit", "retryable": true})),
            ));
        }
        if let Some(old) = self.sessions.insert(session.key.clone(), session) {
            old.close(4009, "superseded by another socket of the same client");
            old.shut();
        }
        Ok(())
    }

    /// Removes a session when its socket closes (only if it is still the
    /// registered one) and closes its links.
    /// Socket `socket` of `session` closed (contract §5.7): the session
    /// stays, detached, with its links open and its buffer filling for
    /// `detach_grace_secs`; then its links close (continuity with the hosts
    /// is lost) and the record is kept for `retain_secs`, then dropped. A
    /// `reconnect` in between re-attaches it.
    pub fn detach(self: &Arc<Self>, session: &Arc<ClientSession>, socket: u64) {
        let Some(generation) = session.detach_socket(socket) else {
            return; // another socket took over
        };
        let grace = std::time::Duration::from_secs(self.cfg.limits.detach_grace_secs);
        let retain = std::time::Duration::from_secs(self.cfg.limits.retain_secs);
        // Weak handles: a stopped relay is not kept alive by its timers.
        let relay = Arc::downgrade(self);
        let weak = Arc::downgrade(session);
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            match weak.upgrade() {
                Some(s) if s.detached_since(generation) => s.drop_links(),
                _ => return,
            }
            tokio::time::sleep(retain).await;
            if let (Some(relay), Some(s)) = (relay.upgrade(), weak.upgrade())
                && s.detached_since(generation)
            {
                relay.sessions.remove_if(&s.key, |_, v| Arc::ptr_eq(v, &s));
            }
        });
    }

    /// The registered session for `key`.
    pub fn session_of(&self, key: &SessionKey) -> Option<Arc<ClientSession>> {
        self.sessions.get(key).map(|s| s.clone())
    }

    /// The host whose agent is the only one visible, if exactly one is.
    pub fn only_agent_host(&self) -> Option<Arc<HostHub>> {
        let mut with_agents = self
            .hubs
            .values()
            .filter(|h| h.view().root.is_some_and(|r| !r.agents.is_empty()));
        let first = with_agents.next()?;
        with_agents.next().is_none().then(|| first.clone())
    }

    /// `relay.default_host`, or the only host.
    pub fn default_host(&self) -> Option<Arc<HostHub>> {
        match &self.cfg.relay.default_host {
            Some(id) => self.hubs.get(id).cloned(),
            None if self.hubs.len() == 1 => self.hubs.values().next().cloned(),
            None => None,
        }
    }

    /// Union of the up hosts' completion trigger characters (§6.6).
    pub fn trigger_characters(&self) -> Vec<String> {
        let mut all: Vec<String> = self
            .hubs
            .values()
            .map(|h| h.view())
            .filter(|v| v.status == HostStatus::Up)
            .flat_map(|v| v.trigger_characters)
            .collect();
        all.sort();
        all.dedup();
        all
    }

    /// The hosts' terminal command prefix, only if every up host agrees (§6.6).
    pub fn terminal_command_prefix(&self) -> Option<String> {
        let mut prefixes = self
            .hubs
            .values()
            .map(|h| h.view())
            .filter(|v| v.status == HostStatus::Up)
            .map(|v| v.terminal_command_prefix);
        let first = prefixes.next()??;
        prefixes
            .all(|p| p.as_deref() == Some(first.as_str()))
            .then_some(first)
    }
}

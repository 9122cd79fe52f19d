//! The relay as a whole: configuration, secret, URI store, hosts, client
//! sessions, and what is computed across hosts — the merged root, the
//! merged session list, and the fan-out of watch-link events (contract §6).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;
use serde_json::json;
use tokio::sync::mpsc;

use crate::auth::Authenticator;
use crate::config::RelayConfig;
use crate::identity::PrincipalKey;
use crate::metrics::Metrics;
use crate::names::store::UriStore;
use crate::rpc::RpcError;
use crate::session::buffer::ReplayMemory;
use crate::session::sequence::SequenceOrigins;
use crate::session::{ClientSession, SessionKey};
use crate::upstream::hub::{HostHub, HostStatus};
use crate::upstream::watch::WatchEvent;
use crate::wire::WireLimits;

/// The relay's shared state.
pub struct Relay {
    /// Validated configuration.
    pub cfg: Arc<RelayConfig>,
    pub(crate) keys: crate::identity::Keys,
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
    /// Open client connections per principal (`connections_per_principal`).
    connections: Arc<DashMap<PrincipalKey, usize>>,
    watch_tasks: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    resyncs: std::sync::Mutex<(std::time::Instant, u32)>,
    /// Bytes held by every replay buffer, against `limits.replay_memory_bytes`.
    memory: Arc<ReplayMemory>,
    /// Detached sessions, the candidates for dropping under memory pressure
    /// (contract §5.4); entries of sessions attached again since are stale
    /// and skipped (their generation changed).
    detached: DashMap<SessionKey, Detached>,
    /// Order of detaches: lower means attached less recently.
    detach_order: AtomicU64,
}

/// A detached session in the pressure registry.
#[derive(Debug)]
struct Detached {
    /// When it detached, from `Relay::detach_order`.
    order: u64,
    /// The attach generation its detach returned.
    generation: u64,
    session: std::sync::Weak<ClientSession>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("hosts", &self.hubs.keys().collect::<Vec<_>>())
            .field("sessions", &self.sessions.len())
            .finish_non_exhaustive()
    }
}

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
        let keys = crate::identity::Keys::new(&secret)?;
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
        let policy = crate::policy::RulePolicy::new(&cfg.policy);
        limits.validate().map_err(|e| e.to_string())?;
        let (memory, mut pressure) =
            ReplayMemory::new(limits.replay_memory_bytes, limits.replay_memory_low_bytes());
        let (tx, rx) = mpsc::unbounded_channel();
        let relay = Arc::new(Self {
            cfg: Arc::new(cfg),
            keys,
            store,
            hubs,
            sessions: DashMap::new(),
            origins: SequenceOrigins::new(),
            client_limits,
            upstream_limits,
            metrics,
            auth,
            policy: std::sync::RwLock::new(Arc::new(policy)),
            next_socket: AtomicU64::new(1),
            connections: Arc::new(DashMap::new()),
            watch_tasks: std::sync::Mutex::new(Vec::new()),
            resyncs: std::sync::Mutex::new((std::time::Instant::now(), 0)),
            memory,
            detached: DashMap::new(),
            detach_order: AtomicU64::new(0),
        });
        // The pressure task: woken when replay memory crosses the budget or
        // a session detaches over it; ends when the relay and every buffer
        // are gone (the wake-up sender lives in the shared account).
        let weak = Arc::downgrade(&relay);
        tokio::spawn(async move {
            while pressure.recv().await.is_some() {
                let Some(relay) = weak.upgrade() else { break };
                relay.relieve_memory_pressure();
            }
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
    /// (contract §7.6). Root followers get the root fields that changed for
    /// them; a client that lost sight of a subscribed channel is closed with
    /// 4000, so its `reconnect` gets snapshots without that channel.
    pub fn set_policy(&self, policy: Arc<dyn crate::policy::Policy>) {
        match self.policy.write() {
            Ok(mut p) => *p = policy,
            Err(e) => *e.into_inner() = policy,
        }
        let sessions: Vec<Arc<ClientSession>> = self.sessions.iter().map(|s| s.clone()).collect();
        for s in sessions {
            if s.forget_invisible() {
                self.metrics.resyncs.with_label_values(&["policy"]).inc();
                s.close(4000, "resync: access policy changed; reconnect now");
            }
        }
        use crate::upstream::watch::RootField;
        self.fan_root(&[
            RootField::Agents,
            RootField::Terminals,
            RootField::ActiveSessions,
        ]);
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
        let bytes = self.keys.mac_bytes(&[key.as_bytes(), &burst.to_be_bytes()]);
        let r = u64::from_be_bytes(
            bytes
                .get(..8)
                .and_then(|b| b.try_into().ok())
                .unwrap_or([0; 8]),
        );
        std::time::Duration::from_millis(r % (self.cfg.limits.resync_spread_ms + 1))
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

    /// Sessions with a socket attached now.
    pub fn attached_sessions(&self) -> Vec<Arc<ClientSession>> {
        self.sessions
            .iter()
            .filter(|s| s.lock().socket_id().is_some())
            .map(|s| s.clone())
            .collect()
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

    /// The names of the relay's method table (§8.2), anything else `other`.
    pub fn method_label(&self, method: &str) -> &'static str {
        crate::policy::table::METHODS
            .iter()
            .find(|(m, _)| *m == method)
            .map_or("other", |(m, _)| m)
    }

    /// The part of every upstream id of principal `p` (see [`Keys::upstream_prefix`]).
    pub fn upstream_prefix(&self, p: &PrincipalKey) -> String {
        self.keys.upstream_prefix(p)
    }

    /// The upstream client id of session (P, c) (see [`Keys::upstream_id`]).
    pub fn upstream_id(&self, p: &PrincipalKey, client_id: &str) -> String {
        self.keys.upstream_id(p, client_id)
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
        session.lock().account_replay_memory(self.memory.clone());
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
        let order = self.detach_order.fetch_add(1, Ordering::Relaxed);
        self.detached.insert(
            session.key.clone(),
            Detached {
                order,
                generation,
                session: Arc::downgrade(session),
            },
        );
        if self.memory.over_target() {
            self.memory.wake();
        }
        let grace = std::time::Duration::from_secs(self.cfg.limits.detach_grace_secs);
        let retain = std::time::Duration::from_secs(self.cfg.limits.retain_secs);
        // Weak handles: a stopped relay is not kept alive by its timers.
        let relay = Arc::downgrade(self);
        let weak = Arc::downgrade(session);
        let key = session.key.clone();
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            let still = match weak.upgrade() {
                Some(s) if s.detached_since(generation) => {
                    s.drop_links();
                    true
                }
                _ => false,
            };
            if still {
                tokio::time::sleep(retain).await;
                if let (Some(relay), Some(s)) = (relay.upgrade(), weak.upgrade())
                    && s.detached_since(generation)
                {
                    relay.sessions.remove_if(&s.key, |_, v| Arc::ptr_eq(v, &s));
                }
            }
            if let Some(relay) = relay.upgrade() {
                relay
                    .detached
                    .remove_if(&key, |_, d| d.generation == generation && d.order == order);
            }
        });
    }

    /// The account of bytes held by every replay buffer.
    pub fn replay_memory(&self) -> &ReplayMemory {
        &self.memory
    }

    /// Whether a new WebSocket upgrade must be refused with 503 because
    /// attached sessions alone hold more replay memory than the budget, and
    /// memory has not yet fallen to the low watermark (contract §5.4).
    pub fn refuses_upgrades(&self) -> bool {
        self.memory.refusing()
    }

    /// Global memory pressure (contract §5.4): while replay memory is above
    /// its target (the budget; the low watermark while upgrades are
    /// refused), drops whole buffers of detached sessions, least recently
    /// attached first. If only attached sessions are left holding too much,
    /// upgrades are refused until memory falls to the low watermark.
    /// Attached sessions are never touched. Runs on the pressure task, only
    /// when the budget is crossed or a session detaches over it.
    pub fn relieve_memory_pressure(&self) {
        let memory = &self.memory;
        if memory.over_target() {
            let mut candidates: Vec<(u64, SessionKey, u64, std::sync::Weak<ClientSession>)> = self
                .detached
                .iter()
                .map(|e| {
                    let d = e.value();
                    (d.order, e.key().clone(), d.generation, d.session.clone())
                })
                .collect();
            candidates.sort_unstable_by_key(|c| c.0);
            for (order, key, generation, weak) in candidates {
                if !memory.over_target() {
                    break;
                }
                let freed = weak.upgrade().and_then(|s| {
                    let mut core = s.lock();
                    // Attached again (or ended) since: not a candidate.
                    (core.socket_id().is_none() && core.attach_gen() == generation).then(|| {
                        s.close_links(&mut core);
                        core.drop_replay_buffer()
                    })
                });
                match freed {
                    None => {
                        self.detached
                            .remove_if(&key, |_, d| d.order == order && d.generation == generation);
                    }
                    Some((_, 0)) => {}
                    Some((_, bytes)) => {
                        let m = &self.metrics;
                        m.pressure_dropped_buffers.inc();
                        m.pressure_freed_bytes.inc_by(bytes as u64);
                        m.buffer_bytes.sub(bytes as i64);
                        tracing::info!(
                            bytes,
                            used = memory.used(),
                            budget = memory.budget(),
                            "replay buffer of a detached session dropped under memory pressure"
                        );
                    }
                }
            }
        }
        let used = memory.used();
        if used > memory.budget() {
            if !memory.refusing() {
                tracing::warn!(
                    used,
                    budget = memory.budget(),
                    "attached sessions alone exceed the replay memory budget: refusing upgrades"
                );
            }
            memory.set_refusing(true);
        } else if used <= memory.low_watermark() {
            memory.set_refusing(false);
        }
    }

    /// Closes every session's idle links (§5.7), checking every quarter of
    /// `link_idle_secs`; runs until the relay is dropped.
    pub async fn sweep_idle_links(self: Arc<Self>) {
        let idle = std::time::Duration::from_secs(self.cfg.limits.link_idle_secs);
        let period = (idle / 4).clamp(
            std::time::Duration::from_millis(250),
            std::time::Duration::from_secs(30),
        );
        let weak = Arc::downgrade(&self);
        drop(self);
        loop {
            tokio::time::sleep(period).await;
            let Some(relay) = weak.upgrade() else { return };
            let now = std::time::Instant::now();
            let sessions: Vec<Arc<ClientSession>> =
                relay.sessions.iter().map(|s| s.clone()).collect();
            for s in sessions {
                let closed = s.close_idle_links(idle, now);
                relay.metrics.links_idle_closed.inc_by(closed as u64);
            }
        }
    }

    /// Counts a new connection of `principal`, or `None` if it already has
    /// `connections_per_principal` open (§3.6, S19). The count drops when
    /// the returned guard does.
    pub fn admit_connection(&self, principal: &crate::auth::Principal) -> Option<ConnectionGuard> {
        let key = PrincipalKey {
            issuer: principal.issuer.clone(),
            subject: principal.subject.clone(),
        };
        let mut n = self.connections.entry(key.clone()).or_insert(0);
        if *n >= self.cfg.limits.connections_per_principal {
            return None;
        }
        *n += 1;
        Some(ConnectionGuard {
            map: self.connections.clone(),
            key,
        })
    }

    /// The registered session for `key`.
    pub fn session_of(&self, key: &SessionKey) -> Option<Arc<ClientSession>> {
        self.sessions.get(key).map(|s| s.clone())
    }

    /// The host whose agent is the only one `who` can see, if exactly one is.
    pub fn only_agent_host(&self, who: crate::policy::Subject<'_>) -> Option<Arc<HostHub>> {
        let mut with_agents = self.hubs.values().filter(|h| {
            self.grant_on(who, h).is_some()
                && h.read(|v| v.root.as_ref().is_some_and(|r| !r.agents.is_empty()))
        });
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

    /// Union of the trigger characters of the up hosts `who` can see (§6.6).
    pub fn trigger_characters(&self, who: crate::policy::Subject<'_>) -> Vec<String> {
        let mut all: Vec<String> = self
            .hubs
            .values()
            .filter(|h| self.grant_on(who, h).is_some())
            .flat_map(|h| {
                h.read(|v| match v.status {
                    HostStatus::Up => v.trigger_characters.clone(),
                    _ => Vec::new(),
                })
            })
            .collect();
        all.sort();
        all.dedup();
        all
    }

    /// The terminal command prefix, only if every up host `who` can see
    /// agrees (§6.6).
    pub fn terminal_command_prefix(&self, who: crate::policy::Subject<'_>) -> Option<String> {
        let mut prefixes = self
            .hubs
            .values()
            .filter(|h| self.grant_on(who, h).is_some())
            .filter_map(|h| {
                h.read(|v| (v.status == HostStatus::Up).then(|| v.terminal_command_prefix.clone()))
            });
        let first = prefixes.next()??;
        prefixes
            .all(|p| p.as_deref() == Some(first.as_str()))
            .then_some(first)
    }
}

/// One admitted client connection; dropping it releases the principal's slot.
#[derive(Debug)]
pub struct ConnectionGuard {
    map: Arc<DashMap<PrincipalKey, usize>>,
    key: PrincipalKey,
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.map.remove_if_mut(&self.key, |_, n| {
            *n = n.saturating_sub(1);
            *n == 0
        });
    }
}

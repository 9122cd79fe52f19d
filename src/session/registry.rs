//! The registry of client sessions (contract §5.4, §5.6, §5.7, §3.6): one
//! session per `(principal, clientId)`, admission per principal, the detach
//! and retention timers, the global replay-memory budget, idle-link sweeps,
//! resync pacing and policy reloads.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;
use serde_json::json;

use super::buffer::ReplayMemory;
use super::sequence::SequenceOrigins;
use super::{ClientSession, SessionKey};
use crate::identity::PrincipalKey;
use crate::route::Env;
use crate::rpc::{Close, RpcError};

/// Every client session of the relay, and what governs their lives:
/// admission per principal, detach and retention timers, the global replay
/// memory budget and its pressure valve, idle-link sweeps, resync pacing.
pub struct Registry {
    /// What routing reads (shared with every session).
    pub env: Arc<Env>,
    pub(super) sessions: DashMap<SessionKey, Arc<ClientSession>>,
    /// S0 allocator.
    pub origins: SequenceOrigins,
    next_socket: AtomicU64,
    /// Open client connections per principal (`connections_per_principal`).
    connections: Arc<DashMap<PrincipalKey, usize>>,
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
    /// When it detached, from `Registry::detach_order`.
    order: u64,
    /// The attach generation its detach returned.
    generation: u64,
    session: std::sync::Weak<ClientSession>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("sessions", &self.sessions.len())
            .finish_non_exhaustive()
    }
}

impl Registry {
    /// An empty registry over `env`, with its memory-pressure task running
    /// (it ends when the registry and every buffer are gone).
    pub fn new(env: Arc<Env>) -> Result<Arc<Self>, String> {
        let limits = &env.cfg.limits;
        limits.validate().map_err(|e| e.to_string())?;
        let (memory, mut pressure) =
            ReplayMemory::new(limits.replay_memory_bytes, limits.replay_memory_low_bytes());
        let registry = Arc::new(Self {
            env,
            sessions: DashMap::new(),
            origins: SequenceOrigins::new(),
            next_socket: AtomicU64::new(1),
            connections: Arc::new(DashMap::new()),
            resyncs: std::sync::Mutex::new((std::time::Instant::now(), 0)),
            memory,
            detached: DashMap::new(),
            detach_order: AtomicU64::new(0),
        });
        let weak = Arc::downgrade(&registry);
        tokio::spawn(async move {
            while pressure.recv().await.is_some() {
                let Some(registry) = weak.upgrade() else {
                    break;
                };
                registry.relieve_memory_pressure();
            }
        });
        Ok(registry)
    }

    /// Replaces the policy; the next request is decided by the new one
    /// (contract §7.6). Root followers get the root fields that changed for
    /// them; a client that lost sight of a subscribed channel is closed with
    /// 4000, so its `reconnect` gets snapshots without that channel.
    pub fn set_policy(&self, policy: Arc<dyn crate::policy::Policy>) {
        self.env.access.set_policy(policy);
        let sessions: Vec<Arc<ClientSession>> = self.sessions.iter().map(|s| s.clone()).collect();
        for s in sessions {
            if s.forget_invisible() {
                self.env
                    .metrics
                    .resyncs
                    .with_label_values(&["policy"])
                    .inc();
                s.close(Close::ResyncPolicy);
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
        let bytes = self
            .env
            .keys
            .mac_bytes(&[key.as_bytes(), &burst.to_be_bytes()]);
        let r = u64::from_be_bytes(
            bytes
                .get(..8)
                .and_then(|b| b.try_into().ok())
                .unwrap_or([0; 8]),
        );
        std::time::Duration::from_millis(r % (self.env.cfg.limits.resync_spread_ms + 1))
    }

    /// Ends every client session (their links close).
    pub fn stop_sessions(&self) {
        let all: Vec<Arc<ClientSession>> = self.sessions.iter().map(|s| s.clone()).collect();
        self.sessions.clear();
        for s in all {
            s.close(Close::Restarting);
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

    /// A new socket id.
    pub fn next_socket(&self) -> u64 {
        self.next_socket.fetch_add(1, Ordering::Relaxed)
    }

    /// Registers a session, superseding (4009) one with the same key. At
    /// `sessions_per_principal` (contract §3.6) the principal's least
    /// recently detached session is dropped to make room (its next
    /// `reconnect` gets `NotFound`); only when every one of its sessions is
    /// attached does the new one fail with -32603 `sessionLimit`.
    pub fn attach(&self, session: Arc<ClientSession>) -> Result<(), RpcError> {
        if !self.sessions.contains_key(&session.key) {
            let mine: Vec<Arc<ClientSession>> = self
                .sessions
                .iter()
                .filter(|s| s.key().principal == session.key.principal)
                .map(|s| s.clone())
                .collect();
            if mine.len() >= self.env.cfg.limits.sessions_per_principal
                && !self.evict_least_recently_detached(&mine)
            {
                return Err(RpcError::internal(
                    "too many client sessions for this principal",
                    Some(json!({"reason": "sessionLimit", "retryable": true})),
                ));
            }
        }
        session.lock().account_replay_memory(self.memory.clone());
        if let Some(old) = self.sessions.insert(session.key.clone(), session) {
            old.close(Close::Superseded);
            old.shut();
        }
        Ok(())
    }

    /// Drops the detached session among `mine` that detached longest ago
    /// (one never seen detaching, e.g. superseded, counts as oldest);
    /// false if all of them are attached.
    fn evict_least_recently_detached(&self, mine: &[Arc<ClientSession>]) -> bool {
        let victim = mine
            .iter()
            .filter(|s| s.lock().socket_id().is_none())
            .min_by_key(|s| self.detached.get(&s.key).map_or(0, |d| d.order + 1));
        let Some(victim) = victim else {
            return false;
        };
        self.sessions
            .remove_if(&victim.key, |_, v| Arc::ptr_eq(v, victim));
        self.detached.remove(&victim.key);
        victim.shut();
        self.env.metrics.sessions_evicted.inc();
        true
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
        let grace = std::time::Duration::from_secs(self.env.cfg.limits.detach_grace_secs);
        let retain = std::time::Duration::from_secs(self.env.cfg.limits.retain_secs);
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
                        let m = &self.env.metrics;
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
        let idle = std::time::Duration::from_secs(self.env.cfg.limits.link_idle_secs);
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
                relay.env.metrics.links_idle_closed.inc_by(closed as u64);
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
        if *n >= self.env.cfg.limits.connections_per_principal {
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

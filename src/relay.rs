//! The relay assembled: builds the parts from a validated configuration and
//! wires them together — the routing environment ([`Env`]: hosts, access,
//! names, keys, metrics), the session [`Registry`], the token
//! [`Authenticator`] and one watch link per host. It holds no logic of its
//! own beyond that wiring; the edge and the operations code reach the parts
//! through it. Dereferences to the [`Env`].

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::auth::Authenticator;
use crate::config::RelayConfig;
use crate::identity::{Keys, PrincipalKey};
use crate::metrics::Metrics;
use crate::names::store::UriStore;
use crate::policy::{Access, Policy, RulePolicy};
use crate::route::Env;
use crate::session::buffer::ReplayMemory;
use crate::session::{ClientSession, Registry, SessionKey};
use crate::upstream::hub::{HostHub, Hosts, HubLimits};
use crate::upstream::watch::WatchEvent;
use crate::wire::WireLimits;

/// The running relay's parts.
#[derive(Debug)]
pub struct Relay {
    env: Arc<Env>,
    /// Every client session.
    pub registry: Arc<Registry>,
    /// Token verification at the upgrade.
    pub auth: Authenticator,
    /// Where watch links send their events (the registry's fan-out).
    events: mpsc::Sender<WatchEvent>,
    /// This replica's name (`[relay] replica`, resolved once at start).
    pub replica: String,
}

impl std::ops::Deref for Relay {
    type Target = Env;
    fn deref(&self) -> &Env {
        &self.env
    }
}

impl Relay {
    /// Builds the relay from a validated configuration and starts one watch
    /// link per host, whose events the registry's fan-out must consume
    /// ([`Registry::run_fanout`]).
    pub fn new(
        cfg: RelayConfig,
        secret: Vec<u8>,
        store: Arc<dyn UriStore>,
        auth: Authenticator,
    ) -> Result<(Arc<Self>, mpsc::Receiver<WatchEvent>), String> {
        let keys = Keys::new(&secret)?;
        Hosts::new(&cfg.hosts)?; // every host's settings usable, or no start
        let limits = &cfg.limits;
        let client_limits = WireLimits {
            max_frame_bytes: limits.max_frame_bytes,
            max_depth: limits.max_json_depth,
        };
        let upstream_limits = WireLimits {
            max_frame_bytes: limits.upstream_max_frame_bytes,
            max_depth: 256,
        };
        let hub_limits = HubLimits {
            max_message_bytes: Some(limits.upstream_max_frame_bytes),
            read_buffer_bytes: limits.upstream_read_buffer_bytes,
            max_sessions: limits.sessions_per_host,
        };
        let policy: Arc<dyn Policy> = Arc::new(RulePolicy::new(&cfg.policy));
        let env = Arc::new(Env {
            access: Access::new(policy, store.clone(), keys.clone()),
            cfg: Arc::new(cfg),
            hosts: Hosts::with_limits(hub_limits),
            store,
            keys,
            metrics: Metrics::new().map_err(|e| e.to_string())?,
            client_limits,
            upstream_limits,
        });
        let registry = Registry::new(env.clone())?;
        let (events, rx) = mpsc::channel(env.cfg.limits.fanout_queue_events.max(1));
        let replica = env.cfg.relay.replica();
        let info = [replica.as_str(), env.store.backend()];
        env.metrics.info.with_label_values(&info).set(1);
        let relay = Arc::new(Self {
            replica,
            env,
            registry,
            auth,
            events,
        });
        relay.reload_hosts(&relay.env.cfg.hosts.clone());
        Ok((relay, rx))
    }

    /// The routing environment.
    pub fn env(&self) -> &Arc<Env> {
        &self.env
    }

    /// Replaces the policy (see [`Registry::set_policy`]).
    pub fn set_policy(&self, policy: Arc<dyn Policy>) {
        self.registry.set_policy(policy);
    }

    /// The upstream client id of session (P, c) (see [`Keys::upstream_id`]).
    pub fn upstream_id(&self, p: &PrincipalKey, client_id: &str) -> String {
        self.env.keys.upstream_id(p, client_id)
    }

    /// Every hub now, by id.
    pub fn hubs(&self) -> impl Iterator<Item = Arc<HostHub>> {
        self.env.hosts.all().into_iter()
    }

    /// The hub of host `id`.
    pub fn hub(&self, id: &str) -> Option<Arc<HostHub>> {
        self.env.hosts.get(id)
    }

    /// The registered session for `key`.
    pub fn session_of(&self, key: &SessionKey) -> Option<Arc<ClientSession>> {
        self.registry.session_of(key)
    }

    /// Whether new upgrades are refused for replay memory (§5.4).
    pub fn refuses_upgrades(&self) -> bool {
        self.registry.refuses_upgrades()
    }

    /// The account of bytes held by every replay buffer.
    pub fn replay_memory(&self) -> &ReplayMemory {
        self.registry.replay_memory()
    }

    /// Stops every watch link (their host connections close).
    pub fn stop_watch_links(&self) {
        self.env.hosts.stop_watches();
    }

    /// Makes the relay's hosts those of `configs` (contract §8.1): added
    /// hosts' watch links start (their agents and sessions then reach every
    /// client that may see them, as after any watch link comes up); removed
    /// or changed hosts leave through [`Registry::hosts_removed`]. Nobody
    /// else is disconnected.
    pub fn reload_hosts(&self, configs: &[crate::upstream::hub::HostConfig]) {
        let events = self.events.clone();
        let ping = self.env.cfg.limits.link_ping();
        let start = move |hub: Arc<HostHub>| {
            let span = tracing::info_span!("watch", host = %hub.id);
            let watch = crate::upstream::watch::run(hub, events.clone(), ping);
            tokio::spawn(tracing::Instrument::instrument(watch, span))
        };
        let changes = self.env.hosts.apply(configs, &start);
        for hub in &changes.added {
            tracing::info!(host = %hub.id, "host added");
        }
        if !changes.removed.is_empty() {
            self.registry.hosts_removed(&changes.removed);
        }
    }
}

//! The router (contract §4.1, §6): which host a client request goes to and
//! under which permission ([`router`]), the merged root ([`root`]) and the
//! merged session list ([`catalog`]). Decisions here read the hosts'
//! mirrors, the policy and the names through an [`Env`], for a [`Caller`];
//! they never touch a client session's state — the session applies them.

pub mod catalog;
pub mod files;
pub mod methods;
pub mod plan;
pub mod root;
pub mod router;

use std::sync::Arc;

use crate::config::RelayConfig;
use crate::identity::Keys;
use crate::metrics::Metrics;
use crate::names::store::UriStore;
use crate::policy::{Access, Subject};
use crate::upstream::hub::Hosts;
use crate::wire::WireLimits;

/// What routing decisions read: shared, immutable handles (the policy
/// inside [`Access`] is swapped atomically on reload).
pub struct Env {
    /// Validated configuration.
    pub cfg: Arc<RelayConfig>,
    /// The hosts' hubs (mirrors of their root and catalog).
    pub hosts: Hosts,
    /// Visibility and permissions.
    pub access: Access,
    /// The durable URI store.
    pub store: Arc<dyn UriStore>,
    /// Keyed derivations (upstream ids, cursor MACs).
    pub keys: Keys,
    /// Metrics.
    pub metrics: Metrics,
    /// Limits for client frames.
    pub client_limits: WireLimits,
    /// Limits for host frames.
    pub upstream_limits: WireLimits,
}

impl std::fmt::Debug for Env {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Env").finish_non_exhaustive()
    }
}

/// Who a routing decision is for: the principal and the session's names.
#[derive(Debug, Clone, Copy)]
pub struct Caller<'a> {
    /// The principal and its groups.
    pub who: Subject<'a>,
    /// The session's upstream client id.
    pub upstream_id: &'a str,
    /// The client's own `clientId`.
    pub client_id: &'a str,
    /// The host objects the session was shown (§7.1): what it may name.
    pub seen: &'a crate::names::seen::Seen,
}

impl Caller<'_> {
    /// (upstream id, client id), for name translation.
    pub fn identity(&self) -> (&str, &str) {
        (self.upstream_id, self.client_id)
    }
}

//! Whether a long-lived socket still has the authority it was opened with.
//!
//! A token is checked once, at the upgrade; a socket can outlive it. Every
//! socket the edge keeps open for a principal — a client socket
//! (`ws::serve_client`) and a status feed (`status`) — holds a [`Standing`]
//! and closes when [`Standing::lost`] resolves: 4001 once `exp + leeway`
//! has passed, 4003 once its `jti` is on the deny list, and for a socket
//! opened under the `admin` grant (the status feed) 4000 once the policy no
//! longer gives it (a reconnect then gets 403). Revocation and the grant
//! are re-checked every [`RECHECK_EVERY`]; the deny list itself is reloaded
//! by `run::reload_files`.

use std::pin::Pin;
use std::time::Duration;

use tokio::time::{Interval, MissedTickBehavior, Sleep};

use super::port::{RelayPort, unix_now};
use crate::auth::Principal;
use crate::rpc::Close;

/// How often an open socket checks whether its token was revoked (and,
/// when it needs one, whether its grant still holds).
pub const RECHECK_EVERY: Duration = Duration::from_secs(2);

/// What a socket needs besides an unexpired, unrevoked token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// Nothing more: a client socket (each request is authorized by the
    /// policy on its own, and a policy reload resyncs with 4000).
    Token,
    /// The `admin` grant on every host (`RelayPort::is_admin`), as the
    /// status page asks at its upgrade.
    AdminGrant,
}

/// The authority of one open socket; see the module doc.
#[derive(Debug)]
pub struct Standing {
    principal: Principal,
    needs: Needs,
    expiry: Pin<Box<Sleep>>,
    recheck: Interval,
}

impl Standing {
    /// The standing of a socket opened now for `principal`.
    pub fn new(port: &RelayPort, principal: &Principal, needs: Needs) -> Self {
        let leeway = port.auth().config().leeway_secs;
        let expires_in = principal
            .expires_at
            .saturating_add(leeway)
            .saturating_sub(unix_now());
        let mut recheck = tokio::time::interval(RECHECK_EVERY);
        recheck.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Self {
            principal: principal.clone(),
            needs,
            expiry: Box::pin(tokio::time::sleep(Duration::from_secs(expires_in))),
            recheck,
        }
    }

    /// Resolves with the close the socket must send once its authority is
    /// gone. Cancel-safe (meant for a `select!` arm in a loop): the timers
    /// live in `self`, so dropping the future loses nothing.
    pub async fn lost(&mut self, port: &RelayPort) -> Close {
        loop {
            tokio::select! {
                () = &mut self.expiry => return Close::TokenExpired,
                _ = self.recheck.tick() => {
                    if let Some(close) = self.check(port) {
                        return close;
                    }
                }
            }
        }
    }

    /// The close due now for revocation or a withdrawn grant, if any.
    fn check(&self, port: &RelayPort) -> Option<Close> {
        let revoked = self
            .principal
            .jti
            .as_deref()
            .is_some_and(|j| port.auth().is_revoked(j));
        if revoked {
            return Some(Close::TokenRevoked);
        }
        if self.needs == Needs::AdminGrant && !port.is_admin(&self.principal) {
            return Some(Close::ResyncPolicy);
        }
        None
    }
}

/// [`Standing::lost`] of `standing`, or never for a socket without one (a
/// status feed on an admin listener whose status is open).
pub async fn lost_or_never(standing: &mut Option<Standing>, port: &RelayPort) -> Close {
    match standing {
        Some(s) => s.lost(port).await,
        None => std::future::pending().await,
    }
}

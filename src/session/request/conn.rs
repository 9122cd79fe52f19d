//! A client socket's state before and after `initialize`: who authenticated
//! at the upgrade, where its frames go, its rate, and its session.

use std::sync::Arc;

use tokio::sync::watch;

use crate::auth::Principal;
use crate::rpc::{Close, RpcError};
use crate::session::limits::RateBucket;
use crate::session::{ClientSession, PrincipalKey, SessionKey};

/// One client socket's state as seen by the router.
pub struct Conn {
    /// The registry of sessions.
    pub registry: Arc<crate::session::Registry>,
    /// Who authenticated at the upgrade.
    pub principal: Principal,
    /// This socket's id.
    pub socket: u64,
    /// Frames to the client.
    pub out: crate::session::outbox::Outbox,
    /// Closes the client socket.
    pub kill: watch::Sender<Option<Close>>,
    /// The session, once `initialize` succeeded on this socket.
    pub session: Option<Arc<ClientSession>>,
    /// This socket's frame rate (§3.6 requests per second).
    pub(super) bucket: RateBucket,
}

impl Conn {
    /// A connection of `principal` before `initialize`, writing to `out`.
    pub fn new(
        registry: Arc<crate::session::Registry>,
        principal: Principal,
        out: crate::session::outbox::Outbox,
        kill: watch::Sender<Option<Close>>,
    ) -> Self {
        let limits = &registry.env.cfg.limits;
        let bucket = RateBucket::new(limits.requests_per_second, limits.request_burst);
        Self {
            socket: registry.next_socket(),
            registry,
            principal,
            out,
            kill,
            session: None,
            bucket,
        }
    }

    /// The session key of `client_id` for this socket's principal.
    pub fn session_key(&self, client_id: &str) -> SessionKey {
        SessionKey {
            principal: PrincipalKey {
                issuer: self.principal.issuer.clone(),
                subject: self.principal.subject.clone(),
            },
            client_id: client_id.to_string(),
        }
    }

    /// This socket, for a session to write to.
    pub fn socket(&self) -> crate::session::Socket {
        crate::session::Socket {
            id: self.socket,
            out: self.out.clone(),
            kill: self.kill.clone(),
        }
    }

    pub(super) fn send(&self, frame: String) {
        if self.out.try_send(frame.into()).is_err() {
            self.kill.send_replace(Some(Close::SlowConsumer));
        }
    }

    pub(super) fn reply(&self, id: &str, result: Result<String, RpcError>) {
        match result {
            Ok(r) => self.send(format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{r}}}"#)),
            Err(e) => self.send(e.frame(id)),
        }
    }
}

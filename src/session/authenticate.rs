//! `authenticate` through the relay (contract §4.6, review M6).
//!
//! Tokens are per connection in AHP, so the relay treats them as belonging
//! to one client session: a token goes only over that session's own links,
//! only to hosts whose agents advertise the protected resource and on which
//! the principal may operate sessions (a viewer runs no agent, so no host
//! gets a viewer's token). The request succeeds if at least one host
//! accepts. The token is kept in memory for the session only — never in the
//! replay buffer, logs, metrics or store — and replayed with its remaining
//! `expiresIn` first thing on every link the session opens later to such a
//! host. It is forgotten when it expires or when a host reports
//! `auth/required` with `reason: expired` for its resource.
//!
//! When advertising hosts exist but the session has no link open to any of
//! them yet, the token is kept and the request succeeds: the hosts judge it
//! when the first link opens (a host that refuses it then says so with
//! `auth/required`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{ClientSession, Pending, PendingKind, SessionCore};
use crate::policy::Permission;
use crate::rpc::RpcError;
use crate::upstream::hub::HostHub;
use crate::upstream::link::{Link, LinkCmd};

/// A bearer token a client pushed; never printed.
#[derive(Clone)]
pub struct Token {
    token: String,
    /// When the token runs out, if the client said.
    expires: Option<Instant>,
    scopes: Option<Value>,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token").finish_non_exhaustive()
    }
}

impl Token {
    /// Seconds left, rounded up; `None` without an expiry; `Some(0)` once expired.
    fn remaining(&self, now: Instant) -> Option<u64> {
        self.expires.map(|e| {
            let left = e.saturating_duration_since(now);
            left.as_secs() + u64::from(left.subsec_nanos() > 0)
        })
    }
}

/// Tokens by protected resource, and the `authenticate` requests whose
/// hosts have not all answered yet.
#[derive(Debug, Default)]
pub struct Tokens {
    by_resource: HashMap<String, Token>,
    waits: HashMap<u64, Wait>,
    next_wait: u64,
}

/// One client `authenticate` fanned out to several links.
#[derive(Debug)]
struct Wait {
    client_id: String,
    outstanding: usize,
    accepted: bool,
    first_error: Option<RpcError>,
}

/// Whether `hub`'s agents advertise protected resource `resource`.
fn advertises(hub: &HostHub, resource: &str) -> bool {
    hub.read(|v| {
        v.root.as_ref().is_some_and(|r| {
            r.agents.iter().any(|a| {
                a.protected_resources
                    .iter()
                    .flatten()
                    .any(|p| p.resource == resource)
            })
        })
    })
}

/// The `authenticate` frame for link request `n`.
fn frame(n: u64, resource: &str, token: &Token, expires_in: Option<u64>) -> String {
    let mut params = json!({"channel": ahp_types::ROOT_RESOURCE_URI,
        "resource": resource, "token": token.token});
    if let Some(o) = params.as_object_mut() {
        if let Some(e) = expires_in {
            o.insert("expiresIn".into(), json!(e));
        }
        if let Some(s) = &token.scopes {
            o.insert("scopes".into(), s.clone());
        }
    }
    crate::rpc::request_frame(n, "authenticate", &params)
}

impl ClientSession {
    /// Handles a client `authenticate` (params already typed); the answer
    /// comes when the hosts have answered.
    pub(super) fn authenticate(&self, id: &str, params: &Value) -> Result<(), RpcError> {
        let resource = params
            .get("resource")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let token = params
            .get("token")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let expires_in = params.get("expiresIn").and_then(Value::as_u64);
        let hosts = self.token_hosts(resource);
        if hosts.is_empty() {
            return Err(RpcError::invalid_params(
                "no host on this connection advertises that protected resource",
            ));
        }
        let token = Token {
            token: token.to_string(),
            expires: expires_in.map(|s| Instant::now() + Duration::from_secs(s)),
            scopes: params.get("scopes").cloned(),
        };
        let mut core = self.lock();
        if token.token.is_empty() {
            core.tokens.by_resource.remove(resource);
        } else {
            core.tokens
                .by_resource
                .insert(resource.to_string(), token.clone());
        }
        let links: Vec<Arc<Link>> = hosts
            .iter()
            .filter_map(|h| core.links.get(&h.id).cloned())
            .collect();
        if links.is_empty() {
            self.respond(&mut core, id, "{}");
            return Ok(());
        }
        let group = core.tokens.next_wait;
        core.tokens.next_wait += 1;
        let mut sent = 0;
        for link in links {
            let n = link.next_id();
            let kind = PendingKind::Authenticate { group: Some(group) };
            let pending = Pending {
                client_id: String::new(),
                method: "authenticate".into(),
                kind,
            };
            core.pending.insert((link.id, n), pending);
            if link.send(LinkCmd::Frame(frame(n, resource, &token, expires_in))) {
                sent += 1;
            } else {
                core.pending.remove(&(link.id, n));
            }
        }
        if sent == 0 {
            return Err(RpcError::host_unavailable(&hosts[0].id));
        }
        let wait = Wait {
            client_id: id.to_string(),
            outstanding: sent,
            accepted: false,
            first_error: None,
        };
        core.tokens.waits.insert(group, wait);
        Ok(())
    }

    /// The hosts that may receive this session's tokens for `resource`.
    fn token_hosts(&self, resource: &str) -> Vec<Arc<HostHub>> {
        let now = self.who();
        let who = now.subject();
        self.env
            .hosts
            .all()
            .into_iter()
            .filter(|h| {
                self.env
                    .access
                    .grant_on(who, h)
                    .is_some_and(|g| g.permits(Permission::SessionsOperate))
                    && advertises(h, resource)
            })
            .collect()
    }

    /// A host answered one leg of `authenticate` `group` (`None`: a replay
    /// on a new link, whose answer nobody waits for). The client is answered
    /// once every leg has: success if any host accepted, else the first
    /// host's error.
    pub(super) fn answer_authenticate(
        &self,
        core: &mut SessionCore,
        group: Option<u64>,
        failure: Option<RpcError>,
    ) {
        let Some(group) = group else { return };
        let Some(wait) = core.tokens.waits.get_mut(&group) else {
            return;
        };
        wait.outstanding = wait.outstanding.saturating_sub(1);
        match failure {
            None => wait.accepted = true,
            Some(e) => {
                wait.first_error.get_or_insert(e);
            }
        }
        if wait.outstanding > 0 {
            return;
        }
        let Some(wait) = core.tokens.waits.remove(&group) else {
            return;
        };
        match (wait.accepted, wait.first_error) {
            (false, Some(err)) => self.respond_error(core, &wait.client_id, &err),
            _ => self.respond(core, &wait.client_id, "{}"),
        }
    }

    /// Queues this session's live tokens for `hub`'s resources on a link
    /// just opened to it, ahead of anything else the session sends there.
    pub(super) fn replay_tokens(&self, core: &mut SessionCore, hub: &HostHub, link: &Link) {
        let now = Instant::now();
        core.tokens
            .by_resource
            .retain(|_, t| t.remaining(now) != Some(0));
        let tokens: Vec<(String, Token)> = core
            .tokens
            .by_resource
            .iter()
            .filter(|(r, _)| advertises(hub, r))
            .map(|(r, t)| (r.clone(), t.clone()))
            .collect();
        for (resource, token) in tokens {
            let n = link.next_id();
            let pending = Pending {
                client_id: String::new(),
                method: "authenticate".into(),
                kind: PendingKind::Authenticate { group: None },
            };
            core.pending.insert((link.id, n), pending);
            let expires_in = token.remaining(now);
            link.send(LinkCmd::Frame(frame(n, &resource, &token, expires_in)));
        }
    }

    /// A host reported `auth/required` with `reason: expired` for `resource`:
    /// the kept token is stale and is not replayed again.
    pub(super) fn forget_token(&self, resource: &str) {
        self.lock().tokens.by_resource.remove(resource);
    }
}

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
//! host — decided again at that send, so a host where the principal only
//! views (or no longer operates) never receives it. It is forgotten when it
//! expires, or when a host's `auth/required {reason: expired}` for its
//! resource is found to concern it (`auth_required_concerns`: hosts that
//! broadcast the notification must not clear other sessions' tokens).
//!
//! After a policy change, a host that holds a token on an open link where
//! the principal no longer operates gets it revoked there (an empty token).
//!
//! When advertising hosts exist but the session has no link open to any of
//! them yet, the token is kept and the request succeeds: the hosts judge it
//! when the first link opens (a host that refuses it then says so with
//! `auth/required`).
//!
//! A host configured `authenticate = "host-wide"` (VS Code's agent host)
//! keeps one token store for the whole process: whatever token reaches it
//! on any connection serves every user of that host. There a token goes
//! only from a principal holding the admin role on that host (the role
//! that may change what the host holds for everyone); anyone else's
//! `authenticate` reaches no such host, and when no host is left for it the
//! request is refused with -32009 naming the shared credentials (audited,
//! rule `host-wide-authenticate-needs-admin`). Tokens stay per client
//! session as everywhere: one user's token is never sent on another user's
//! link. The host's `auth/required` broadcasts concern exactly the sessions
//! whose tokens may go there (its admins), whatever the reason: the host's
//! one token may be another admin's.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{ClientSession, Pending, PendingKind, ReplyTo, SessionCore};
use crate::policy::{Permission, audit};
use crate::rpc::RpcError;
use crate::upstream::hub::{AuthenticateScope, HostHub};
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
    /// (host, resource) pairs whose token the host holds on this session's
    /// open link to it: what a policy change may have to revoke.
    held: HashSet<(Arc<str>, String)>,
    waits: HashMap<u64, Wait>,
    next_wait: u64,
}

impl Tokens {
    /// `host` no longer holds any of this session's tokens (the connection
    /// that carried them is gone).
    pub(super) fn forget_held(&mut self, host: &str) {
        self.held.retain(|(h, _)| &**h != host);
    }
}

/// One client `authenticate` fanned out to several links.
#[derive(Debug)]
struct Wait {
    to: ReplyTo,
    outstanding: usize,
    accepted: bool,
    first_error: Option<RpcError>,
}

/// The audit rule of an `authenticate` refused on a `host-wide` host.
const HOST_WIDE_RULE: &str = "host-wide-authenticate-needs-admin";

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
    pub(super) fn authenticate(&self, to: &ReplyTo, params: &Value) -> Result<(), RpcError> {
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
            return Err(self.no_token_host(resource));
        }
        let token = Token {
            token: token.to_string(),
            expires: expires_in.map(|s| Instant::now() + Duration::from_secs(s)),
            scopes: params.get("scopes").cloned(),
        };
        let mut core = self.lock();
        if token.token.is_empty() {
            core.links.tokens.by_resource.remove(resource);
            core.links.tokens.held.retain(|(_, r)| r != resource);
        } else {
            core.links
                .tokens
                .by_resource
                .insert(resource.to_string(), token.clone());
        }
        let links: Vec<Arc<Link>> = hosts
            .iter()
            .filter_map(|h| core.links.open.get(&h.id).cloned())
            .collect();
        if links.is_empty() {
            self.respond(&mut core, &to.id, "{}");
            return Ok(());
        }
        let group = core.links.tokens.next_wait;
        core.links.tokens.next_wait += 1;
        let mut sent = 0;
        for link in links {
            let n = link.next_id();
            let kind = PendingKind::Authenticate { group: Some(group) };
            let pending = Pending {
                reply: ReplyTo::nobody(),
                method: "authenticate".into(),
                span: crate::otel::current_request(),
                kind,
            };
            core.links.pending.insert((link.id, n), pending);
            if link.send(LinkCmd::Frame(frame(n, resource, &token, expires_in))) {
                sent += 1;
                if !token.token.is_empty() {
                    let held = (link.host.id.clone(), resource.to_string());
                    core.links.tokens.held.insert(held);
                }
            } else {
                core.links.pending.remove(&(link.id, n));
            }
        }
        if sent == 0 {
            return Err(RpcError::host_unavailable(&hosts[0].id));
        }
        let wait = Wait {
            to: to.clone(),
            outstanding: sent,
            accepted: false,
            first_error: None,
        };
        core.links.tokens.waits.insert(group, wait);
        Ok(())
    }

    /// The hosts that may receive this session's tokens for `resource`.
    fn token_hosts(&self, resource: &str) -> Vec<Arc<HostHub>> {
        self.env
            .hosts
            .all()
            .into_iter()
            .filter(|h| self.token_goes_to(h, resource))
            .collect()
    }

    /// The one rule for every send of a token, the first and each replay
    /// (§4.6): `hub` advertises `resource` and the policy in force, for the
    /// identity this session has now, grants `sessions:operate` there — and,
    /// on a host whose tokens serve every user (`host-wide`), the admin role.
    fn token_goes_to(&self, hub: &HostHub, resource: &str) -> bool {
        self.env
            .access
            .grant_on(self.who().subject(), hub)
            .is_some_and(|g| {
                g.permits(Permission::SessionsOperate)
                    && (hub.cfg.authenticate == AuthenticateScope::PerConnection || g.is_admin())
            })
            && advertises(hub, resource)
    }

    /// The refusal of an `authenticate` for `resource` that goes to no host:
    /// -32009 when a visible `host-wide` host advertises it but the
    /// principal is not its admin (audited), else -32602.
    fn no_token_host(&self, resource: &str) -> RpcError {
        let who = self.who();
        let shared = self.env.hosts.all().into_iter().find(|h| {
            h.cfg.authenticate == AuthenticateScope::HostWide
                && advertises(h, resource)
                && self.env.access.grant_on(who.subject(), h).is_some()
        });
        let Some(hub) = shared else {
            return RpcError::invalid_params(
                "no host on this connection advertises that protected resource",
            );
        };
        audit::record(audit::Record {
            who: who.subject(),
            host: &hub.id,
            channel: ahp_types::ROOT_RESOURCE_URI,
            operation: "authenticate",
            decision: audit::Decision::Deny,
            rule: HOST_WIDE_RULE,
        });
        RpcError::permission_denied(&format!(
            "host {} keeps one set of credentials shared by every user of it \
             (authenticate = \"host-wide\"), so only its admins may authenticate there",
            hub.id
        ))
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
        let Some(wait) = core.links.tokens.waits.get_mut(&group) else {
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
        let Some(wait) = core.links.tokens.waits.remove(&group) else {
            return;
        };
        match (wait.accepted, wait.first_error) {
            (false, Some(err)) => self.respond_error_to(core, &wait.to, &err),
            _ => self.respond_to(core, &wait.to, "{}"),
        }
    }

    /// Queues this session's live tokens for `hub`'s resources on a link
    /// just opened to it, ahead of anything else the session sends there —
    /// only where [`Self::token_goes_to`] holds at this moment, so a host
    /// where the principal only views never receives one.
    pub(super) fn replay_tokens(&self, core: &mut SessionCore, hub: &HostHub, link: &Link) {
        let now = Instant::now();
        core.links
            .tokens
            .by_resource
            .retain(|_, t| t.remaining(now) != Some(0));
        let tokens: Vec<(String, Token)> = core
            .links
            .tokens
            .by_resource
            .iter()
            .filter(|(r, _)| self.token_goes_to(hub, r))
            .map(|(r, t)| (r.clone(), t.clone()))
            .collect();
        for (resource, token) in tokens {
            let n = link.next_id();
            let pending = Pending {
                reply: ReplyTo::nobody(),
                method: "authenticate".into(),
                span: crate::otel::current_request(),
                kind: PendingKind::Authenticate { group: None },
            };
            core.links.pending.insert((link.id, n), pending);
            let expires_in = token.remaining(now);
            if link.send(LinkCmd::Frame(frame(n, &resource, &token, expires_in))) {
                core.links.tokens.held.insert((hub.id.clone(), resource));
            }
        }
    }

    /// After a policy change (§4.6, §7.6): every token a host holds from
    /// this session although [`Self::token_goes_to`] no longer holds there
    /// (the principal stopped operating it, or lost the host) is revoked
    /// with an empty token, as a client revokes one: on the session's open
    /// link to it, or — on a `host-wide` host, whose one token store
    /// outlives the connection that filled it — on a link opened for it.
    /// The kept token stays for the hosts where it still goes; a link
    /// opened after the principal operates again gets it replayed.
    pub(crate) fn revoke_tokens_gone(self: &Arc<Self>) {
        let mut core = self.lock();
        let gone: Vec<(Arc<str>, String)> = core
            .links
            .tokens
            .held
            .iter()
            .filter(|(host, resource)| {
                self.env
                    .hosts
                    .get(host)
                    .is_none_or(|hub| !self.token_goes_to(&hub, resource))
            })
            .cloned()
            .collect();
        let revoke = Token {
            token: String::new(),
            expires: None,
            scopes: None,
        };
        for (host, resource) in gone {
            core.links
                .tokens
                .held
                .remove(&(host.clone(), resource.clone()));
            let Some(link) = self.link_to_revoke(&mut core, &host) else {
                continue;
            };
            let n = link.next_id();
            let pending = Pending {
                reply: ReplyTo::nobody(),
                method: "authenticate".into(),
                span: crate::otel::current_request(),
                kind: PendingKind::Authenticate { group: None },
            };
            core.links.pending.insert((link.id, n), pending);
            if !link.send(LinkCmd::Frame(frame(n, &resource, &revoke, None))) {
                core.links.pending.remove(&(link.id, n));
            }
        }
    }

    /// The link a revocation for `host` goes on: the open one, else a new
    /// one to a `host-wide` host that is up (a per-connection host dropped
    /// the token with the connection that carried it).
    fn link_to_revoke(self: &Arc<Self>, core: &mut SessionCore, host: &str) -> Option<Arc<Link>> {
        if let Some(link) = core.links.open.get(host) {
            return Some(link.clone());
        }
        let hub = self.env.hosts.get(host)?;
        let wide = hub.cfg.authenticate == AuthenticateScope::HostWide;
        if !wide || hub.status() == crate::upstream::hub::HostStatus::Down {
            return None;
        }
        let link = self.open_link_locked(core, &hub, Default::default());
        core.links.open.insert(hub.id.clone(), link.clone());
        Some(link)
    }

    /// Whether a host's `auth/required` for `resource` with `reason`, which
    /// arrived on this session's link to `hub`, concerns this session
    /// (§4.6, §6.4, §7.6); an `expired` one that does also forgets the
    /// kept token. Hosts that broadcast it (VS Code's) send a copy on every
    /// connection, so a copy on this link does not say whose token it is;
    /// the relay decides from what it knows of this session's own tokens:
    /// - only a session whose tokens go to `hub` ([`Self::token_goes_to`])
    ///   is concerned: a viewer never authenticates there;
    /// - `expired` concerns a session whose token for `resource` has run
    ///   out by the relay's clock (the host's clock started later, so it
    ///   runs out there after), or whose lifetime it was not told; only a
    ///   token known to have run out is forgotten — a broadcast about
    ///   someone else's token never clears this session's;
    /// - on a `host-wide` host every such session (its admins) is concerned
    ///   whatever the reason, since the host's one token may be another
    ///   admin's; still only a token known to have run out is forgotten;
    /// - any other reason (`required`) concerns every such session.
    pub(super) fn auth_required_concerns(
        &self,
        core: &mut SessionCore,
        hub: &HostHub,
        resource: &str,
        reason: Option<&str>,
    ) -> bool {
        if !self.token_goes_to(hub, resource) {
            return false;
        }
        let host_wide = hub.cfg.authenticate == AuthenticateScope::HostWide;
        if reason != Some("expired") {
            return true;
        }
        let left = core
            .links
            .tokens
            .by_resource
            .get(resource)
            .map(|t| t.remaining(Instant::now()));
        match left {
            None => host_wide,
            Some(None) => true,
            Some(Some(secs)) if secs <= 1 => {
                core.links.tokens.by_resource.remove(resource);
                true
            }
            Some(Some(_)) => host_wide,
        }
    }
}

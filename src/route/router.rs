//! Where a client request goes (contract §4.1, §4.3, §4.4, §7.3): the
//! host and host form of a channel the caller can see (invisible answers
//! exactly as nonexistent), the policy's word on an operation, client →
//! host translation that authorizes every URI it names, and the hosts
//! chosen for requests that name no channel. Nothing here touches a
//! session: the session forwards what these functions decide.

use std::sync::Arc;

use serde_json::{Value, json};

use super::files;
use super::methods::{self, Need};
use super::{Caller, Env};
use crate::names::client_uri::{validate_client_session_uri, validate_client_uri};
use crate::names::namer::{self, ToHost};
use crate::names::qualify::{
    ChannelKind, ClientName, channel_kind, chat_for_session, is_host_name, read_client_uri,
    session_of_chat_uri,
};
use crate::names::seen::is_object;
use crate::names::translate::{self, FieldKind, NameError, Namer};
use crate::policy::audit::{self, Decision};
use crate::policy::objects::{UriOwner, owner_of_uri};
use crate::policy::table;
use crate::policy::{Grant, Permission, Subject};
use crate::rpc::RpcError;
use crate::upstream::hub::{HostHub, HostStatus};

/// The hub and host form of a client channel URI the principal can see, or
/// the §4.4 answer for one that does not exist (-32001 for sessions, -32008
/// otherwise) — which is also the answer for one it cannot see, decided
/// without contacting any host.
pub fn host_for(
    env: &Env,
    caller: Caller<'_>,
    uri: &str,
) -> Result<(Arc<HostHub>, String), RpcError> {
    let (hub, host_uri) = namer::route(env.store.as_ref(), uri)
        .and_then(|(h, hu)| env.hosts.get(&h).map(|hub| (hub, hu)))
        .ok_or_else(|| not_found(uri))?;
    let who = caller.who;
    // A channel that is a host object (a resource watch) is also the
    // caller's only where it was shown to it (§4.3).
    let object = channel_kind(&host_uri) == ChannelKind::Other;
    let visible = env.access.grant_on(who, &hub).is_some_and(|g| {
        env.access.sees_channel(who, &g, &hub, &host_uri)
            && (!object
                || env
                    .access
                    .sees_named(who, &g, &hub, &host_uri, caller.seen.contains(uri)))
    });
    if !visible {
        count_invisible(env);
        return Err(not_found(uri));
    }
    Ok((hub, host_uri))
}

/// Whether `caller` lost `uri` (contract §7.6: a subscribed channel that
/// changed hands): it still names a channel, and [`host_for`] no longer
/// lets `caller` reach it. A channel the store says is gone (disposed) is
/// not lost to anyone — its subscribers hear of it from the host — however
/// the host's listing and the dispose's tombstone interleave; a name the
/// store cannot read now counts as lost (closing is the safe side).
pub fn lost_to(env: &Env, caller: Caller<'_>, uri: &str) -> bool {
    !namer::is_gone(env.store.as_ref(), uri) && host_for(env, caller, uri).is_err()
}

/// [`host_for`] for an operation `op` (a method or an action type): a
/// refusal of anything beyond reading is audited (§7.5, decisions on writes).
pub fn target_of(
    env: &Env,
    caller: Caller<'_>,
    uri: &str,
    op: &str,
) -> Result<(Arc<HostHub>, String), RpcError> {
    host_for(env, caller, uri).inspect_err(|_| {
        let read = matches!(
            methods::need(op),
            Some(Need::Permission(Permission::SessionsRead))
        );
        if !read {
            audit::record(audit::Record {
                who: caller.who,
                host: "",
                channel: uri,
                operation: op,
                decision: Decision::Invisible,
                rule: "-",
            });
        }
    })
}

/// The §4.4 answer for a channel that does not exist (or is invisible):
/// -32001 for sessions of every shape (VS Code's `copilot:/…` too), -32008
/// otherwise, always the same message.
pub fn not_found(uri: &str) -> RpcError {
    let session = channel_kind(uri) == ChannelKind::Session;
    RpcError::nonexistent(if session { "ahp-session:" } else { uri })
}

/// What the routed `method` needs on its host, from the one table.
pub fn method_permission(method: &str) -> Result<Permission, RpcError> {
    match methods::need(method) {
        Some(Need::Permission(p)) => Ok(p),
        _ => Err(RpcError::method_not_found(method)),
    }
}

/// Why the policy refused.
pub enum Denied {
    /// The host is invisible to the principal: answer as for nothing there.
    Invisible,
    /// Visible but not permitted: -32009 or a rejection echo.
    NotPermitted,
    /// Permitted, but disposing what another principal created, which
    /// needs the admin role (§7.1): -32009.
    NotCreator,
}

/// The policy's word on operation `op` (a method or an action type) on
/// `channel` of `hub`, needing `need` (contract §4.4, §7.3). Decisions on
/// writes, terminal subscriptions and every refusal are audited (§7.5).
pub fn gate(
    env: &Env,
    caller: Caller<'_>,
    hub: &HostHub,
    op: &str,
    channel: &str,
    need: Permission,
) -> Result<Grant, Denied> {
    gate_disposing(env, caller, hub, (op, channel), need, None)
}

/// [`gate`], and when `disposed` names the host form of the object the
/// operation disposes, the one dispose rule (`Access::may_dispose`): one
/// decision, one audit line, whichever part refused.
pub(super) fn gate_disposing(
    env: &Env,
    caller: Caller<'_>,
    hub: &HostHub,
    (op, channel): (&str, &str),
    need: Permission,
    disposed: Option<&str>,
) -> Result<Grant, Denied> {
    let who = caller.who;
    let grant = env.access.grant_on(who, hub);
    let mut denied_by = "-";
    let (decision, result) = match grant {
        None => (Decision::Invisible, Err(Denied::Invisible)),
        Some(g) if !g.permits(need) => (Decision::Deny, Err(Denied::NotPermitted)),
        Some(g) if disposed.is_some_and(|d| !env.access.may_dispose(who, &g, hub, d)) => {
            denied_by = DISPOSE_RULE;
            (Decision::Deny, Err(Denied::NotCreator))
        }
        Some(g) => (Decision::Allow, Ok(g)),
    };
    env.metrics
        .acl_decisions
        .with_label_values(&[decision.label()])
        .inc();
    let audited = need != Permission::SessionsRead
        || decision != Decision::Allow
        || channel_kind(channel) == ChannelKind::Terminal
        || op.starts_with("resource")
        || op == "createResourceWatch";
    if audited {
        let rule = match &result {
            Ok(g) => g.rule.clone(),
            Err(_) => denied_by.into(),
        };
        audit::record(audit::Record {
            who,
            host: &hub.id,
            channel,
            operation: op,
            decision,
            rule: &rule,
        });
    }
    result
}

/// The audit rule of a refusal by the dispose rule (§7.1).
const DISPOSE_RULE: &str = "dispose-others-needs-admin";

/// Why [`Authorizing`] refused a field, as the answer reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Malformed, another host's, or an invisible session, chat or
    /// terminal — answered as a name that does not translate (-32602).
    Untranslatable,
    /// A host object (content reference, changeset, canvas, watch, a URI
    /// derived from a session) the caller may not name: as nonexistent
    /// (-32008).
    Invisible,
    /// Visible but not permitted (-32009).
    Denied,
}

/// A client → host namer that authorizes every host URI it translates,
/// whatever its scheme (contract §4.3), against the object it belongs to
/// (`policy::Access::sees_named`): a session, chat or terminal must be
/// one the principal can see on the target host (else it is as unknown as a
/// URI that names nothing); a content reference, changeset, canvas or
/// watch must have been shown to this client in a channel it can read (or
/// derive from a session or chat it can see); and any host URI needs the
/// permission its field implies on that host. External and
/// client-published URIs name nothing on the host and pass. `target` is a
/// URI the caller has already authorized as the request's own target.
struct Authorizing<'a> {
    to_host: ToHost<'a>,
    env: &'a Env,
    caller: Caller<'a>,
    hub: &'a HostHub,
    grant: &'a Grant,
    target: Option<&'a str>,
}

impl Refusal {
    /// The answer a refused name gets.
    pub fn of(name: NameError) -> Self {
        match name {
            NameError::Invisible => Self::Invisible,
            NameError::Denied => Self::Denied,
            _ => Self::Untranslatable,
        }
    }
}

/// Counts a decision that something the caller named is invisible to it.
fn count_invisible(env: &Env) {
    env.metrics
        .acl_decisions
        .with_label_values(&[Decision::Invisible.label()])
        .inc();
}

impl Namer for Authorizing<'_> {
    fn translate(&self, kind: FieldKind, value: &str) -> Result<String, NameError> {
        self.to_host.translate(kind, value)
    }

    fn field(
        &self,
        shape: &str,
        path: &str,
        kind: FieldKind,
        value: &str,
    ) -> Result<String, NameError> {
        let host_value = self.to_host.translate(kind, value)?;
        let uri = matches!(
            kind,
            FieldKind::Uri | FieldKind::Ref | FieldKind::UriTemplate
        );
        if !uri || !is_host_name(&host_value) {
            return Ok(host_value);
        }
        // Only host objects are decided by the note: no lookup for others.
        let shown = self.target == Some(value)
            || (is_object(&host_value) && self.caller.seen.contains(value));
        let access = &self.env.access;
        if !access.sees_named(self.caller.who, self.grant, self.hub, &host_value, shown) {
            return match owner_of_uri(&host_value) {
                UriOwner::Itself => Err(NameError::Unknown),
                _ => {
                    count_invisible(self.env);
                    Err(NameError::Invisible)
                }
            };
        }
        if !self.grant.permits(field_need(shape, path)) {
            return Err(NameError::Denied);
        }
        if files::claims_directory(shape, path)
            && !files::may_claim(self.env, self.caller, (self.hub, self.grant), &host_value)
        {
            return Err(NameError::Denied);
        }
        Ok(host_value)
    }
}

/// The permission a URI field implies (contract §4.3): operate for targets
/// (working directories and terminal `cwd`, besides the policy's shapes:
/// move destinations and terminal claims), read for references.
fn field_need(shape: &str, path: &str) -> Permission {
    let last = path.rsplit('.').next().unwrap_or(path);
    let target = ["workingDirector", "directory", "replacement", "cwd"]
        .iter()
        .any(|t| last.starts_with(t));
    if target {
        Permission::SessionsOperate
    } else {
        table::field_need(shape)
    }
}

/// Translates `value` (already typed) to host names along `shape`,
/// authorizing every name in it ([`Authorizing`]); `target` was authorized
/// by the caller already. The error says why and which field.
pub fn translate_to_host(
    env: &Env,
    caller: Caller<'_>,
    (hub, grant): (&HostHub, &Grant),
    value: &mut Value,
    shape: &str,
    target: Option<&str>,
) -> Result<(), (Refusal, String)> {
    let namer = Authorizing {
        to_host: ToHost {
            host: &hub.id,
            store: env.store.as_ref(),
            identity: caller.identity(),
        },
        env,
        caller,
        hub,
        grant,
        target,
    };
    translate::translate(value, shape, &namer).map_err(|e| (Refusal::of(e.reason), e.to_string()))
}

/// Translates request `params` to host names along `shape` (fields
/// authorized), and sets the channel to its host form.
pub fn to_host(
    env: &Env,
    caller: Caller<'_>,
    hub: &HostHub,
    grant: &Grant,
    params: Value,
    shape: &str,
    host_channel: &str,
) -> Result<Value, RpcError> {
    to_host_with(env, caller, (hub, grant), params, shape, host_channel, None)
}

/// [`to_host`] for a request whose own `target` URI the caller authorized.
fn to_host_with(
    env: &Env,
    caller: Caller<'_>,
    on: (&HostHub, &Grant),
    mut params: Value,
    shape: &str,
    host_channel: &str,
    target: Option<&str>,
) -> Result<Value, RpcError> {
    translate_to_host(env, caller, on, &mut params, shape, target).map_err(|(why, e)| {
        match why {
            Refusal::Denied => RpcError::permission_denied(&e),
            // Same answer as for an object that does not exist (§4.4).
            Refusal::Invisible => RpcError::nonexistent(""),
            Refusal::Untranslatable => RpcError::invalid_params(e),
        }
    })?;
    if let Some(o) = params.as_object_mut() {
        o.insert("channel".into(), json!(host_channel));
    }
    Ok(params)
}

/// Checks a client-chosen URI's form (`<scheme>:/<id>`, id in
/// `[A-Za-z0-9._-]{1,128}`) before anything else looks at the request.
pub fn check_client_uri(uri: &str, schemes: &[&str]) -> Result<(), RpcError> {
    let parsed =
        validate_client_uri(uri).map_err(|e| RpcError::invalid_params(format!("{uri}: {e}")))?;
    if !schemes.contains(&parsed.scheme) {
        return Err(RpcError::invalid_params(format!(
            "expected a URI of scheme {}",
            schemes.join(" or ")
        )));
    }
    Ok(())
}

/// Checks a client-chosen session URI: `ahp-session:/<id>` or VS Code's
/// `<provider>:/<id>` (its client names a new session itself, contract
/// §4.2), id in `[A-Za-z0-9._-]{1,128}`; it keeps its exact form.
pub fn check_client_session_uri(uri: &str) -> Result<NewSession, RpcError> {
    let refused = |why: &dyn std::fmt::Display| {
        RpcError::invalid_params(format!(
            "{uri}: {why} (a session is ahp-session:/<id> or <provider>.<host>:/<id>, \
             the provider id as listed)"
        ))
    };
    let provider_form = uri
        .split_once(':')
        .is_some_and(|(scheme, _)| crate::names::qualify::is_provider_scheme(scheme));
    if !provider_form {
        validate_client_session_uri(uri).map_err(|e| refused(&e))?;
        return Ok(NewSession {
            key: uri.to_string(),
            host: None,
        });
    }
    let Ok(ClientName::Qualified { host, host_uri }) = read_client_uri(uri) else {
        return Err(refused(&"the scheme is not a provider id of a host"));
    };
    validate_client_session_uri(&host_uri).map_err(|e| refused(&e))?;
    Ok(NewSession {
        key: host_uri,
        host: Some(host),
    })
}

/// A session URI a client chose for `createSession` (§4.2), read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewSession {
    /// Its host form, which the URI store records: the URI itself for
    /// `ahp-session:/<id>` (kept verbatim), `<provider>:/<id>` for VS Code's
    /// `<provider>.<host>:/<id>`.
    pub key: String,
    /// The host its scheme names (provider-scheme sessions only): the
    /// create must go there.
    pub host: Option<String>,
}

/// Whether a client-chosen chat URI is VS Code's derived form of a chat of
/// `session` (client form): `ahp-chat://<id>/<b64(session)>`, `<id>` in
/// `[A-Za-z0-9._-]{1,128}`, nothing after. Such a URI is named by its
/// session (qualified or verbatim), so it needs no store entry: its host
/// form is computed ([`derived_chat_host_form`]).
pub fn is_derived_chat(chat: &str, session: &str) -> bool {
    let Some(rest) = chat.strip_prefix("ahp-chat://") else {
        return false;
    };
    let Some((id, b64)) = rest.split_once('/') else {
        return false;
    };
    !b64.contains('/')
        && validate_client_uri(&format!("ahp-chat:/{id}")).is_ok()
        && session_of_chat_uri(chat).as_deref() == Some(session)
}

/// The host form of a derived chat URI ([`is_derived_chat`]) of a session
/// whose host form is `host_session`.
pub fn derived_chat_host_form(chat: &str, host_session: &str) -> Option<String> {
    chat_for_session(chat, host_session)
}

/// The host whose agent is the only one `who` can see, if exactly one is.
pub fn only_agent_host(env: &Env, who: Subject<'_>) -> Option<Arc<HostHub>> {
    let hubs = env.hosts.all();
    let mut with_agents = hubs.iter().filter(|h| {
        env.access.grant_on(who, h).is_some()
            && h.read(|v| v.root.as_ref().is_some_and(|r| !r.agents.is_empty()))
    });
    let first = with_agents.next()?;
    with_agents.next().is_none().then(|| first.clone())
}

/// Union of the trigger characters of the up hosts `who` can see (§6.6).
pub fn trigger_characters(env: &Env, who: Subject<'_>) -> Vec<String> {
    let mut all: Vec<String> = env
        .hosts
        .all()
        .iter()
        .filter(|h| env.access.grant_on(who, h).is_some())
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
pub fn terminal_command_prefix(env: &Env, who: Subject<'_>) -> Option<String> {
    let hubs = env.hosts.all();
    let mut prefixes = hubs
        .iter()
        .filter(|h| env.access.grant_on(who, h).is_some())
        .filter_map(|h| {
            h.read(|v| (v.status == HostStatus::Up).then(|| v.terminal_command_prefix.clone()))
        });
    let first = prefixes.next()??;
    prefixes
        .all(|p| p.as_deref() == Some(first.as_str()))
        .then_some(first)
}

/// Where an authorized `dispatchAction` goes, in host names.
#[derive(Debug)]
pub struct DispatchTarget {
    /// The host.
    pub hub: Arc<HostHub>,
    /// The channel's host form.
    pub host_channel: String,
    /// The action translated to host names.
    pub action: Value,
    /// The action's type.
    pub action_type: String,
}

/// Why a dispatch is not forwarded.
#[derive(Debug)]
pub enum DispatchRefusal {
    /// The channel does not exist for the caller: no echo, as a host does.
    Silent,
    /// A rejection echo with this reason (§5.3).
    Reject(String),
}

/// Decides a client `dispatchAction` (contract §4.3, §4.4, §7.1): the
/// channel must be visible, the action a known client-dispatchable type
/// the caller's grant permits, and every name in it translatable and
/// authorized on the target host.
pub fn authorize_dispatch(
    env: &Env,
    caller: Caller<'_>,
    channel: &str,
    action: &Value,
) -> Result<DispatchTarget, DispatchRefusal> {
    use DispatchRefusal::{Reject, Silent};
    if channel == ahp_types::ROOT_RESOURCE_URI {
        return Err(Reject(
            "only root/configChanged may be dispatched to the root channel".into(),
        ));
    }
    let ty = action
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let (hub, host_channel) = target_of(env, caller, channel, ty).map_err(|_| Silent)?;
    let known = serde_json::from_value::<ahp_types::actions::StateAction>(action.clone())
        .ok()
        .filter(|a| !matches!(a, ahp_types::actions::StateAction::Unknown(_)))
        .ok_or_else(|| Reject(format!("unknown or malformed action type: {ty}")))?;
    let need = table::action_need(ty).ok_or_else(|| {
        Reject(format!(
            "{ty} cannot be dispatched by a client through the relay"
        ))
    })?;
    let grant = match gate(env, caller, &hub, ty, channel, need) {
        Ok(g) => g,
        Err(Denied::Invisible) => return Err(Silent),
        Err(Denied::NotPermitted | Denied::NotCreator) => {
            return Err(Reject("permission denied".into()));
        }
    };
    let mut host_action =
        serde_json::to_value(&known).map_err(|_| Reject("malformed action".into()))?;
    translate_to_host(env, caller, (&hub, &grant), &mut host_action, ty, None).map_err(
        |e| match e {
            (Refusal::Denied, e) => Reject(format!("permission denied: {e}")),
            (_, e) => Reject(format!("cannot translate {e}")),
        },
    )?;
    Ok(DispatchTarget {
        hub,
        host_channel,
        action: host_action,
        action_type: ty.to_string(),
    })
}

/// The hosts a client `root/configChanged` goes to: a host-wide setting
/// affects every user of a host, so only hosts on which the caller holds
/// the admin role, that are up and whose root has a `config` to change; a
/// rejection reason when there is none.
pub fn root_config_hosts(env: &Env, caller: Caller<'_>) -> Result<Vec<Arc<HostHub>>, String> {
    let hosts: Vec<Arc<HostHub>> = env
        .hosts
        .all()
        .into_iter()
        .filter(|h| h.status() == HostStatus::Up)
        .filter(|h| h.read(|v| v.root.as_ref().is_some_and(|r| r.config.is_some())))
        .filter(|h| {
            env.access
                .grant_on(caller.who, h)
                .is_some_and(|g| g.dispose_others)
        })
        .collect();
    if hosts.is_empty() {
        return Err("root/configChanged needs the admin role on a host with a root config".into());
    }
    Ok(hosts)
}

/// The host a root-scoped resource command goes to, from the URI it names
/// (contract §4.3, §7.1): a qualified URI names its host (`file://H/p`,
/// `ahp-content:/H~id`, a watch or changeset URI), a client-chosen one is
/// looked up in the store; a host the caller cannot see answers as
/// nonexistent (-32008). A bare `file:///p` names no host here (the
/// command has no channel to route it by): -32602 saying how to name one.
pub fn resource_host(env: &Env, caller: Caller<'_>, uri: &str) -> Result<Arc<HostHub>, RpcError> {
    use crate::names::qualify::{ClientName, read_client_uri};
    let host = match read_client_uri(uri) {
        Ok(ClientName::Qualified { host, .. }) => host,
        Ok(ClientName::Verbatim { .. }) => namer::route(env.store.as_ref(), uri)
            .map(|(h, _)| h)
            .ok_or_else(|| not_found(uri))?,
        Ok(ClientName::LocalFile { .. }) => {
            return Err(RpcError::invalid_params(
                "a file: URI through the relay names its host: file://<host id>/<path>",
            ));
        }
        Err(_) => return Err(RpcError::invalid_params("not a URI of any host")),
    };
    let hub = env.hosts.get(&host).ok_or_else(|| not_found(uri))?;
    if env.access.grant_on(caller.who, &hub).is_none() {
        return Err(not_found(uri));
    }
    Ok(hub)
}

/// Authorizes the root-scoped resource command `method` on its target
/// `uri` (client form) on `hub` and translates its `params` (contract
/// §7.1, §4.4). `resourceRead` of a host object the client was shown in a
/// channel it can read — a content reference — needs only `sessions:read`
/// (`methods::ON_SHOWN_OBJECT`); anything else needs its row's `files:*`.
/// An object the caller may not name — one whose session or chat it cannot
/// see, or one never shown to it without `files:*` — answers as
/// nonexistent (-32008): whether it exists is never revealed. A file it may
/// not read or write: -32009. A file the grant reaches only through its
/// session-directory scope is decided by [`files::scope`]; the paths it
/// returns must be confirmed inside on the host before forwarding.
pub fn resource_to_host(
    env: &Env,
    caller: Caller<'_>,
    hub: &HostHub,
    method: &str,
    uri: &str,
    params: Value,
) -> Result<(Value, Vec<files::Inside>), RpcError> {
    let host_uri = namer::to_host_uri(env.store.as_ref(), &hub.id, uri)
        .map_err(|e| RpcError::invalid_params(e.to_string()))?;
    let grant = env
        .access
        .grant_on(caller.who, hub)
        .ok_or_else(|| not_found(uri))?;
    let owner = owner_of_uri(&host_uri);
    let file = owner == UriOwner::Host;
    let shown = caller.seen.contains(uri);
    let visible = env
        .access
        .sees_named(caller.who, &grant, hub, &host_uri, shown);
    if !visible && owner != UriOwner::Shown {
        count_invisible(env);
        return Err(not_found(uri));
    }
    let shown_need = methods::need_on_shown(method).filter(|_| visible && !file);
    let need = match shown_need {
        Some(p) => p,
        None => method_permission(method)?,
    };
    let (grant, inside) = if file && !grant.permits(need) && grant.session_files {
        let inside = files::scope(env, caller, (hub, &grant), method, &params, need)?;
        (grant, inside)
    } else {
        match gate(env, caller, hub, method, uri, need) {
            Ok(g) => (g, Vec::new()),
            Err(Denied::NotPermitted) if file => return Err(RpcError::permission_denied(method)),
            Err(_) => return Err(not_found(uri)),
        }
    };
    let shape = format!("params:{method}");
    let root = ahp_types::ROOT_RESOURCE_URI;
    let params = to_host_with(env, caller, (hub, &grant), params, &shape, root, Some(uri))?;
    Ok((params, inside))
}

/// The host of a client-claimed terminal (no session names one): the host
/// its `cwd` names (`file://<host>/…`), else the only host the caller can
/// see, else `relay.default_host`, else -32602 saying how to name one.
pub fn client_terminal_host(
    env: &Env,
    caller: Caller<'_>,
    cwd: Option<&str>,
) -> Result<Arc<HostHub>, RpcError> {
    if let Some(cwd) = cwd
        && let Ok(crate::names::qualify::ClientName::Qualified { .. }) =
            crate::names::qualify::read_client_uri(cwd)
    {
        return resource_host(env, caller, cwd);
    }
    // The hosts where the principal may open a terminal: a configured
    // default among them wins; else the only one; else the configured
    // default (whose grant then answers), else the caller must say.
    let usable: Vec<Arc<HostHub>> = env
        .hosts
        .all()
        .into_iter()
        .filter(|h| {
            env.access
                .grant_on(caller.who, h)
                .is_some_and(|g| g.permits(crate::policy::Permission::TerminalsUse))
        })
        .collect();
    let configured = env
        .hosts
        .default_host(env.cfg.relay.default_host.as_deref());
    if let Some(d) = &configured
        && usable.iter().any(|h| h.id == d.id)
    {
        return Ok(d.clone());
    }
    if let [only] = usable.as_slice() {
        return Ok(only.clone());
    }
    configured.ok_or_else(|| {
        RpcError::invalid_params(
            "cannot choose a host for a client-claimed terminal: give cwd as \
                 file://<host id>/<path>, claim a session, or configure relay.default_host",
        )
    })
}

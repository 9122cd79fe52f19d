//! The one access decision on every forwarded client request (contract
//! §4.1–§4.4, §7.1, §7.3). [`plan`] takes a method's row of the table and
//! its params (already read through the row's typed params) and returns
//! where the request goes, its params with every name translated client →
//! host and authorized along the rewrite table, and what the session must
//! do around forwarding it ([`Effect`]). The permission comes from the
//! method table, the dispose rule is `Access::may_dispose`, visibility the
//! §4.4 answer; nothing else decides access, so the session only executes
//! a plan: hold, reserve, forward, answer.

use std::sync::Arc;

use ahp_types::commands::{
    CreateChatParams, CreateSessionParams, CreateTerminalParams, SubscribeParams,
};
use ahp_types::state::TerminalClaim;
use serde::Deserialize;
use serde_json::{Value, json};

use super::files::Inside;
use super::methods::{Created, Handling, Method, Then};
use super::router::{self, Denied};
use super::{Caller, Env};
use crate::names::qualify::{self as names, ChannelKind, ClientName, channel_kind};
use crate::policy::Grant;
use crate::rpc::RpcError;
use crate::upstream::hub::HostHub;

/// A request the router decided to forward.
#[derive(Debug)]
pub struct Plan {
    /// The target host.
    pub hub: Arc<HostHub>,
    /// The request's channel, host form.
    pub host_channel: String,
    /// The params to forward, every name in host form.
    pub params: Value,
    /// What the session does around forwarding.
    pub effect: Effect,
}

/// What forwarding a planned request involves besides sending it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Forward; relay the answer.
    Plain,
    /// A `subscribe`: hold the host channel's envelopes until the snapshot
    /// answer is written (§5.2).
    Subscribe {
        /// The channel, client form.
        client_channel: String,
    },
    /// A create of a client-chosen URI: `store_key` is reserved for the
    /// caller before the request is forwarded (§4.2).
    Create {
        /// The store key (the URI's host form, kept verbatim).
        store_key: String,
        /// A session create: `Taken` answers -32003 and the create is
        /// confirmed from the host's catalog.
        session: bool,
        /// `createSession`'s `progressToken`, to be scoped to the session's
        /// upstream id.
        progress_token: Option<String>,
    },
    /// A dispose: on success the client-chosen URI `store_key` (if the
    /// channel is one) is tombstoned.
    Dispose {
        /// The store key of a verbatim client-chosen URI.
        store_key: Option<String>,
    },
    /// A chat move: on success the chat is decided by the session the
    /// answer names at once (§7.6), before the host's summaries say so.
    Move,
    /// A file command the grant allows only inside sessions' working
    /// directories (§7.1, `route::files`): each of `paths` is resolved on
    /// the host (`resourceResolve`, symlinks followed) and forwarded only
    /// if its canonical form lies inside a granting directory's
    /// ([`files::confirmed`](super::files::confirmed)); else -32009.
    ConfirmInside {
        /// The paths to confirm, with their granting directories.
        paths: Vec<Inside>,
    },
}

/// Decides a forwarded request of `row` (`params` read through the row's
/// typed params). Methods the relay answers itself are not planned: -32601.
pub fn plan(env: &Env, caller: Caller<'_>, row: &Method, params: Value) -> Result<Plan, RpcError> {
    match row.handling {
        Handling::Subscribe => subscribe(env, caller, params),
        Handling::Create(Created::Session) => create_session(env, caller, params),
        Handling::Create(Created::Chat) => create_chat(env, caller, params),
        Handling::Create(Created::Terminal) => create_terminal(env, caller, params),
        Handling::Routed { .. } => routed(env, caller, row, params),
        Handling::ByProvider => by_provider(env, caller, row, params),
        Handling::ByUri => by_uri(env, caller, row, params),
        _ => Err(RpcError::method_not_found(row.name)),
    }
}

/// The policy's word on `method` over `channel` of `hub` as a JSON-RPC
/// answer: invisible → `invisible()` (the answer for something that does
/// not exist, §4.4), not permitted or not the creator → -32009.
fn allowed(
    env: &Env,
    caller: Caller<'_>,
    hub: &HostHub,
    (method, channel): (&str, &str),
    disposed: Option<&str>,
    invisible: impl FnOnce() -> RpcError,
) -> Result<Grant, RpcError> {
    let need = router::method_permission(method)?;
    match router::gate_disposing(env, caller, hub, (method, channel), need, disposed) {
        Ok(g) => Ok(g),
        Err(Denied::Invisible) => Err(invisible()),
        Err(Denied::NotCreator) => Err(RpcError::permission_denied(
            "disposing what another principal created needs the admin role",
        )),
        Err(Denied::NotPermitted) => Err(RpcError::permission_denied(method)),
    }
}

/// Reads the typed view of params the row already normalized.
fn view<'a, T: Deserialize<'a>>(params: &'a Value) -> Result<T, RpcError> {
    T::deserialize(params).map_err(|e| RpcError::invalid_params(format!("invalid params: {e}")))
}

/// `subscribe` of a host channel (the root is the relay's own); also each
/// host channel of `initialize`'s `initialSubscriptions`.
pub fn subscribe(env: &Env, caller: Caller<'_>, params: Value) -> Result<Plan, RpcError> {
    let channel = view::<SubscribeParams>(&params)?.channel;
    let (hub, host_channel) = router::host_for(env, caller, &channel)?;
    let grant = allowed(env, caller, &hub, ("subscribe", &channel), None, || {
        router::not_found(&channel)
    })?;
    let params = router::to_host(
        env,
        caller,
        &hub,
        &grant,
        params,
        "params:subscribe",
        &host_channel,
    )?;
    Ok(Plan {
        hub,
        host_channel,
        params,
        effect: Effect::Subscribe {
            client_channel: channel,
        },
    })
}

/// `createSession`: the host its `provider` names (else the only agent the
/// caller sees); a provider-scheme session URI must name the same host.
fn create_session(env: &Env, caller: Caller<'_>, params: Value) -> Result<Plan, RpcError> {
    let p = view::<CreateSessionParams>(&params)?;
    let name = router::check_client_session_uri(&p.channel)?;
    let hub = match p.provider.as_deref() {
        Some(provider) => names::read_provider(provider)
            .and_then(|(_, h)| env.hosts.get(&h))
            .ok_or_else(|| RpcError::provider_not_found(provider))?,
        None => router::only_agent_host(env, caller.who).ok_or_else(|| {
            RpcError::invalid_params(
                "several agents are available: give provider (<provider>.<host>)",
            )
        })?,
    };
    if name.host.as_deref().is_some_and(|h| h != &*hub.id) {
        return Err(RpcError::invalid_params(
            "the session URI's scheme names another host than the provider",
        ));
    }
    let provider = p.provider.clone().unwrap_or_default();
    let grant = allowed(
        env,
        caller,
        &hub,
        ("createSession", &p.channel),
        None,
        || RpcError::provider_not_found(&provider),
    )?;
    let progress_token = p.progress_token.clone();
    let params = router::to_host(
        env,
        caller,
        &hub,
        &grant,
        params,
        "params:createSession",
        &name.key,
    )?;
    refuse_host_object(env, &hub, &name.key)?;
    Ok(Plan {
        hub,
        host_channel: name.key.clone(),
        params,
        effect: Effect::Create {
            store_key: name.key,
            session: true,
            progress_token,
        },
    })
}

/// `createChat` in a session the caller operates. VS Code's derived chat
/// (`ahp-chat://<id>/<b64(session)>`) is named by its session: its host
/// form is computed and nothing is reserved.
fn create_chat(env: &Env, caller: Caller<'_>, params: Value) -> Result<Plan, RpcError> {
    let p = view::<CreateChatParams>(&params)?;
    let derived = router::is_derived_chat(&p.chat, &p.channel);
    if !derived {
        router::check_client_uri(&p.chat, &["ahp-chat"])?;
    }
    let (hub, host_session) = router::target_of(env, caller, &p.channel, "createChat")?;
    let grant = allowed(env, caller, &hub, ("createChat", &p.channel), None, || {
        router::not_found(&p.channel)
    })?;
    let chat = p.chat.clone();
    let mut params = router::to_host(
        env,
        caller,
        &hub,
        &grant,
        params,
        "params:createChat",
        &host_session,
    )?;
    let effect = if derived {
        let host_chat = router::derived_chat_host_form(&chat, &host_session);
        if let Some(o) = params.as_object_mut() {
            o.insert("chat".into(), json!(host_chat));
        }
        Effect::Plain
    } else {
        refuse_host_object(env, &hub, &chat)?;
        Effect::Create {
            store_key: chat,
            session: false,
            progress_token: None,
        }
    };
    Ok(Plan {
        hub,
        host_channel: host_session,
        params,
        effect,
    })
}

/// `createTerminal`: claimed by a session (the session's host) or by the
/// client (the host its `cwd` names, else the default one).
fn create_terminal(env: &Env, caller: Caller<'_>, params: Value) -> Result<Plan, RpcError> {
    let p = view::<CreateTerminalParams>(&params)?;
    // VS Code's workbench names its terminals `agenthost-terminal:/<uuid>`.
    router::check_client_uri(&p.channel, &["ahp-terminal", "agenthost-terminal"])?;
    let hub = match &p.claim {
        TerminalClaim::Session(c) => {
            router::target_of(env, caller, &c.session, "createTerminal")?.0
        }
        TerminalClaim::Client(_) => router::client_terminal_host(env, caller, p.cwd.as_deref())?,
    };
    let channel = p.channel.clone();
    let grant = allowed(
        env,
        caller,
        &hub,
        ("createTerminal", &channel),
        None,
        || router::not_found(&channel),
    )?;
    let params = router::to_host(
        env,
        caller,
        &hub,
        &grant,
        params,
        "params:createTerminal",
        &channel,
    )?;
    refuse_host_object(env, &hub, &channel)?;
    Ok(Plan {
        hub,
        host_channel: channel.clone(),
        params,
        effect: Effect::Create {
            store_key: channel,
            session: false,
            progress_token: None,
        },
    })
}

/// A create never adopts an object the host already has (§4.2): a URI the
/// host lists — a catalog session, a chat of a listed session, a root
/// terminal — is refused with the code the host itself would give (-32003
/// for sessions, -32010 otherwise) before anything is reserved, so no
/// store entry ever names a host object its creator did not make.
fn refuse_host_object(env: &Env, hub: &HostHub, uri: &str) -> Result<(), RpcError> {
    let kind = channel_kind(uri);
    let exists = match kind {
        ChannelKind::Session => hub.has_session(uri),
        ChannelKind::Chat => hub.session_of_chat(uri).is_some(),
        ChannelKind::Terminal => hub.terminal_claim(uri).is_some(),
        ChannelKind::Other => false,
    };
    if !exists {
        return Ok(());
    }
    env.metrics
        .limit_hits
        .with_label_values(&["host_object"])
        .inc();
    Err(if kind == ChannelKind::Session {
        RpcError::session_exists(uri)
    } else {
        RpcError::already_exists(uri)
    })
}

/// A request routed by its channel (`Handling::Routed`): the channel must
/// be visible (else answered as nonexistent, §4.4), the row's permission
/// granted on its host, and — for a row that disposes its channel — the
/// dispose rule of §7.1 met, one rule for sessions, chats and terminals
/// (-32009: the caller sees the target). Every name in the params is then
/// translated and authorized.
fn routed(env: &Env, caller: Caller<'_>, row: &Method, params: Value) -> Result<Plan, RpcError> {
    let method = row.name;
    let channel = channel_of(&params, "");
    let (hub, host_channel) = router::target_of(env, caller, &channel, method)?;
    let disposed = row.disposes().then_some(host_channel.as_str());
    let grant = allowed(env, caller, &hub, (method, &channel), disposed, || {
        router::not_found(&channel)
    })?;
    let shape = format!("params:{method}");
    let params = router::to_host(env, caller, &hub, &grant, params, &shape, &host_channel)?;
    let effect = match row.handling {
        Handling::Routed {
            then: Then::Dispose,
        } => {
            let verbatim = matches!(
                names::read_client_uri(&channel),
                Ok(ClientName::Verbatim { .. })
            );
            Effect::Dispose {
                store_key: verbatim.then_some(channel),
            }
        }
        Handling::Routed { then: Then::Move } => Effect::Move,
        _ => Effect::Plain,
    };
    Ok(Plan {
        hub,
        host_channel,
        params,
        effect,
    })
}

/// A request routed by its provider (`Handling::ByProvider`:
/// `resolveSessionConfig`, `sessionConfigCompletions`; contract §4.3).
/// The target host is the one that owns what the request names: the
/// session (or other channel) its `channel` names when it is not the root
/// — visible, else answered as nonexistent (§4.4) — else its `provider`'s
/// host, else the only agent the caller sees. The row's permission must
/// be granted there; then every name in the params — `provider`,
/// `workingDirectory`, the channel — is translated and authorized on that
/// host along the method's row of the rewrite table, so a name of another
/// host (a provider of h1 with a session of h2, a `file://h2/…` directory
/// sent to h1) is -32602 and nothing reaches a host.
fn by_provider(
    env: &Env,
    caller: Caller<'_>,
    row: &Method,
    params: Value,
) -> Result<Plan, RpcError> {
    let method = row.name;
    let root = ahp_types::ROOT_RESOURCE_URI;
    let channel = channel_of(&params, root);
    let provider = params
        .get("provider")
        .and_then(Value::as_str)
        .map(str::to_string);
    let (hub, host_channel) = if channel == root {
        let hub = provider_host(env, caller, provider.as_deref())?;
        (hub, root.to_string())
    } else {
        router::target_of(env, caller, &channel, method)?
    };
    let grant = allowed(env, caller, &hub, (method, &channel), None, || {
        if channel == root {
            RpcError::provider_not_found(provider.as_deref().unwrap_or_default())
        } else {
            router::not_found(&channel)
        }
    })?;
    let shape = format!("params:{method}");
    let params = router::to_host(env, caller, &hub, &grant, params, &shape, &host_channel)?;
    Ok(Plan {
        hub,
        host_channel,
        params,
        effect: Effect::Plain,
    })
}

/// The host a `provider` (`<provider>.<host>`) names, or without one the
/// only host whose agent the caller sees; else -32002 / -32602.
fn provider_host(
    env: &Env,
    caller: Caller<'_>,
    provider: Option<&str>,
) -> Result<Arc<HostHub>, RpcError> {
    match provider {
        Some(p) => names::read_provider(p)
            .and_then(|(_, h)| env.hosts.get(&h))
            .ok_or_else(|| RpcError::provider_not_found(p)),
        None => router::only_agent_host(env, caller.who)
            .ok_or_else(|| RpcError::invalid_params("give provider (<provider>.<host>)")),
    }
}

/// A root-scoped resource command (`resource*`, `createResourceWatch`),
/// routed by the URI it names; a copy or move must stay on one host
/// (another host's destination → -32602). Every name in it is translated
/// and authorized on that host (`router::resource_to_host`); decisions are
/// audited like writes.
fn by_uri(env: &Env, caller: Caller<'_>, row: &Method, params: Value) -> Result<Plan, RpcError> {
    let uri = params
        .get("uri")
        .or_else(|| params.get("source"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let hub = router::resource_host(env, caller, &uri)?;
    if let Some(dest) = params.get("destination").and_then(Value::as_str)
        && !Arc::ptr_eq(&router::resource_host(env, caller, dest)?, &hub)
    {
        return Err(RpcError::invalid_params(
            "source and destination are on different hosts",
        ));
    }
    let (params, paths) = router::resource_to_host(env, caller, &hub, row.name, &uri, params)?;
    let effect = if paths.is_empty() {
        Effect::Plain
    } else {
        Effect::ConfirmInside { paths }
    };
    Ok(Plan {
        hub,
        host_channel: ahp_types::ROOT_RESOURCE_URI.to_string(),
        params,
        effect,
    })
}

/// `params.channel`, or `default` when it is absent.
fn channel_of(params: &Value, default: &str) -> String {
    params
        .get("channel")
        .and_then(Value::as_str)
        .unwrap_or(default)
        .to_string()
}

//! The one table of client methods (contract §4.1, §7.1): for each method
//! the relay knows, how it is handled, the permission it needs on its
//! target host, and the typed params it is read through. A method not in
//! this table is refused with -32601 before anything else; metrics label
//! methods by it.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use ahp_types::commands as cmd;

use crate::policy::Permission::{self, *};
use crate::rpc::RpcError;

/// How the relay handles a method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handling {
    /// `initialize`: answered by the relay, opens the client session.
    Initialize,
    /// `reconnect`: answered by the relay from its buffer or fresh snapshots.
    Reconnect,
    /// `ping`: answered by the relay, also before `initialize`.
    Ping,
    /// `subscribe`: the root from the relay, other channels routed.
    Subscribe,
    /// `listSessions`: aggregated over the visible hosts.
    ListSessions,
    /// `authenticate`: aggregated over the client's open links.
    Authenticate,
    /// A create of a client-chosen URI, reserved in the store first.
    Create(Created),
    /// Routed by `params.channel`; what a success changes besides.
    Routed {
        /// What the relay does when the host answers with success.
        then: Then,
    },
    /// Routed by `params.provider` (or to the only visible agent).
    ByProvider,
    /// Root-scoped, routed by the URI it names (`uri`, or `source` and
    /// `destination` on one host).
    ByUri,
    /// Known, but not routed through the relay: -32601.
    NotRouted,
}

impl Handling {
    /// Whether the method names no channel of its own (§4.1): answered by
    /// the relay, aggregated, or routed by a provider or URI parameter. A
    /// request of such a method may leave out `params.channel` — VS Code's
    /// client sends `reconnect` without it — and reads as if it named the
    /// root; every other request must name its channel.
    pub fn root_scoped(self) -> bool {
        matches!(
            self,
            Self::Initialize
                | Self::Reconnect
                | Self::Ping
                | Self::ListSessions
                | Self::Authenticate
                | Self::ByProvider
                | Self::ByUri
        )
    }
}

/// What a routed request's success changes in the relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Then {
    /// Nothing.
    Plain,
    /// The channel is disposed: a client-chosen URI is tombstoned, and the
    /// object leaves listings at once.
    Dispose,
    /// The chat moved to the session the answer names: it is decided by
    /// that session at once (§7.6).
    Move,
}

/// What a create makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Created {
    /// `createSession`
    Session,
    /// `createChat`
    Chat,
    /// `createTerminal`
    Terminal,
}

/// What a method needs before the relay acts on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Checked against the target host's grant.
    Permission(Permission),
    /// Answered by the relay for the caller's own session; no host grant.
    Own,
    /// Aggregated over the hosts the caller may read, each by its grant.
    Aggregated,
}

/// One row of the method table.
#[derive(Debug, Clone, Copy)]
pub struct Method {
    /// The JSON-RPC method name.
    pub name: &'static str,
    /// How it is handled.
    pub handling: Handling,
    /// What it needs.
    pub need: Need,
    /// Reads `params` through the method's typed params and back, so fields
    /// the type does not know are dropped (`_meta` is a known field).
    pub params: fn(Value) -> Result<Value, RpcError>,
}

impl Method {
    /// Whether a success disposes the request's channel: such a method
    /// also obeys the dispose rule (contract §7.1, `Access::may_dispose`).
    pub fn disposes(&self) -> bool {
        matches!(
            self.handling,
            Handling::Routed {
                then: Then::Dispose
            }
        )
    }
}

const fn row(
    name: &'static str,
    handling: Handling,
    need: Need,
    params: fn(Value) -> Result<Value, RpcError>,
) -> Method {
    Method {
        name,
        handling,
        need,
        params,
    }
}

use Handling as H;
use Need::{Aggregated, Own};
const fn p(perm: Permission) -> Need {
    Need::Permission(perm)
}
const ROUTED: Handling = H::Routed { then: Then::Plain };
const DISPOSE: Handling = H::Routed {
    then: Then::Dispose,
};
const MOVE: Handling = H::Routed { then: Then::Move };

/// Every client method the relay knows.
pub const METHODS: &[Method] = &[
    row(
        "initialize",
        H::Initialize,
        Own,
        typed_value::<cmd::InitializeParams>,
    ),
    row(
        "reconnect",
        H::Reconnect,
        Own,
        typed_value::<cmd::ReconnectParams>,
    ),
    row("ping", H::Ping, Own, any),
    row("unsubscribe", H::NotRouted, Own, any),
    row("listSessions", H::ListSessions, Aggregated, any),
    row(
        "authenticate",
        H::Authenticate,
        Aggregated,
        typed_value::<cmd::AuthenticateParams>,
    ),
    row(
        "subscribe",
        H::Subscribe,
        p(SessionsRead),
        typed_value::<cmd::SubscribeParams>,
    ),
    row(
        "fetchTurns",
        ROUTED,
        p(SessionsRead),
        typed_value::<cmd::FetchTurnsParams>,
    ),
    row(
        "completions",
        ROUTED,
        p(SessionsOperate),
        typed_value::<cmd::CompletionsParams>,
    ),
    row(
        "createSession",
        H::Create(Created::Session),
        p(SessionsOperate),
        typed_value::<cmd::CreateSessionParams>,
    ),
    row(
        "disposeSession",
        DISPOSE,
        p(SessionsOperate),
        typed_value::<cmd::DisposeSessionParams>,
    ),
    row(
        "createChat",
        H::Create(Created::Chat),
        p(SessionsOperate),
        typed_value::<cmd::CreateChatParams>,
    ),
    row(
        "disposeChat",
        DISPOSE,
        p(SessionsOperate),
        typed_value::<cmd::DisposeChatParams>,
    ),
    row(
        "moveChat",
        MOVE,
        p(SessionsOperate),
        typed_value::<cmd::MoveChatParams>,
    ),
    row(
        "resolveSessionConfig",
        H::ByProvider,
        p(SessionsOperate),
        typed_value::<cmd::ResolveSessionConfigParams>,
    ),
    row(
        "sessionConfigCompletions",
        H::ByProvider,
        p(SessionsOperate),
        typed_value::<cmd::SessionConfigCompletionsParams>,
    ),
    row("dispatchAction", H::NotRouted, p(SessionsOperate), any),
    row(
        "createTerminal",
        H::Create(Created::Terminal),
        p(TerminalsUse),
        typed_value::<cmd::CreateTerminalParams>,
    ),
    row(
        "disposeTerminal",
        DISPOSE,
        p(TerminalsUse),
        typed_value::<cmd::DisposeTerminalParams>,
    ),
    row(
        "resourceRead",
        H::ByUri,
        p(FilesRead),
        typed_value::<cmd::ResourceReadParams>,
    ),
    row(
        "resourceList",
        H::ByUri,
        p(FilesRead),
        typed_value::<cmd::ResourceListParams>,
    ),
    row(
        "resourceResolve",
        H::ByUri,
        p(FilesRead),
        typed_value::<cmd::ResourceResolveParams>,
    ),
    row(
        "resourceRequest",
        H::ByUri,
        p(FilesRead),
        typed_value::<cmd::ResourceRequestParams>,
    ),
    row(
        "createResourceWatch",
        H::ByUri,
        p(FilesRead),
        typed_value::<cmd::CreateResourceWatchParams>,
    ),
    row(
        "resourceWrite",
        H::ByUri,
        p(FilesWrite),
        typed_value::<cmd::ResourceWriteParams>,
    ),
    row(
        "resourceCopy",
        H::ByUri,
        p(FilesWrite),
        typed_value::<cmd::ResourceCopyParams>,
    ),
    row(
        "resourceMove",
        H::ByUri,
        p(FilesWrite),
        typed_value::<cmd::ResourceMoveParams>,
    ),
    row(
        "resourceDelete",
        H::ByUri,
        p(FilesWrite),
        typed_value::<cmd::ResourceDeleteParams>,
    ),
    row(
        "resourceMkdir",
        H::ByUri,
        p(FilesWrite),
        typed_value::<cmd::ResourceMkdirParams>,
    ),
];

/// Methods whose target may be a host object the client was shown inside
/// a channel it can read (a content reference, contract §7.1), with what
/// they need then instead of their row's permission.
pub const ON_SHOWN_OBJECT: &[(&str, Permission)] = &[("resourceRead", SessionsRead)];

/// What `method` needs on a target object shown to the client, if it
/// differs from its row ([`ON_SHOWN_OBJECT`]).
pub fn need_on_shown(method: &str) -> Option<Permission> {
    ON_SHOWN_OBJECT
        .iter()
        .find(|(m, _)| *m == method)
        .map(|(_, p)| *p)
}

/// The row of `name`; `None` for a method the relay does not know.
pub fn method(name: &str) -> Option<&'static Method> {
    METHODS.iter().find(|m| m.name == name)
}

/// The label metrics use for `name`: its own name if the table has it,
/// else `other` (bounded label values, §8.2).
pub fn label(name: &str) -> &'static str {
    method(name).map_or("other", |m| m.name)
}

/// What `name` needs; `None` for a method the relay does not know.
pub fn need(name: &str) -> Option<Need> {
    method(name).map(|m| m.need)
}

/// Parses `params` into `T` and back (fields `T` does not know are dropped).
pub fn typed<T: DeserializeOwned + Serialize>(params: Value) -> Result<(T, Value), RpcError> {
    let t: T = serde_json::from_value(params)
        .map_err(|e| RpcError::invalid_params(format!("invalid params: {e}")))?;
    let v = serde_json::to_value(&t).map_err(|e| RpcError::internal(e.to_string(), None))?;
    Ok((t, v))
}

fn typed_value<T: DeserializeOwned + Serialize>(params: Value) -> Result<Value, RpcError> {
    typed::<T>(params).map(|(_, v)| v)
}

fn any(params: Value) -> Result<Value, RpcError> {
    Ok(params)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_method_has_exactly_one_row() {
        for (i, m) in METHODS.iter().enumerate() {
            assert!(
                !METHODS[i + 1..].iter().any(|o| o.name == m.name),
                "{} twice",
                m.name
            );
        }
    }

    #[test]
    fn unknown_is_refused_and_known_is_mapped() {
        assert!(method("frobnicate").is_none());
        assert_eq!(label("frobnicate"), "other");
        assert_eq!(need("createTerminal"), Some(Need::Permission(TerminalsUse)));
        assert_eq!(need("listSessions"), Some(Need::Aggregated));
        assert_eq!(
            method("disposeChat").map(|m| m.handling),
            Some(Handling::Routed {
                then: Then::Dispose
            })
        );
    }

    #[test]
    fn the_dispose_rule_covers_every_dispose_and_nothing_else() {
        for m in METHODS {
            assert_eq!(m.disposes(), m.name.starts_with("dispose"), "{}", m.name);
        }
        let disposing: Vec<&str> = METHODS
            .iter()
            .filter(|m| m.disposes())
            .map(|m| m.name)
            .collect();
        assert_eq!(
            disposing,
            ["disposeSession", "disposeChat", "disposeTerminal"]
        );
    }

    #[test]
    fn typed_params_drop_unknown_fields_and_refuse_bad_ones() {
        let m = method("fetchTurns").unwrap();
        let v = (m.params)(serde_json::json!({"channel": "ahp-chat:/a~b", "x": 1})).unwrap();
        assert!(v.get("x").is_none());
        assert!((m.params)(serde_json::json!({"channel": 5})).is_err());
    }
}

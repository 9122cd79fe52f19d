//! The rewrite table: every URI-, provider- and identity-bearing field of the
//! AHP v1.0.0 wire surface (`ahp/surface.md` §3–4), and one walker that
//! translates a JSON value host→client or client→host along it (contract §4.3).
//!
//! Each row names a *shape* (an action type, a notification, a params or
//! result type, or a state tree) and the paths of its fields with the kind of
//! value they hold. `a[]` steps into every element of array `a`; `@Shape`
//! continues with another shape's rows (state trees nest). A missing path is
//! skipped, so tagged unions need no conditions: `claim.clientId` exists only
//! on client claims. Client→host translation is fail-closed: any field whose
//! value does not translate fails the whole frame.

use serde_json::Value;

/// What a field holds, and so how it is translated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldKind {
    /// A channel or resource URI (host schemes qualified, others kept).
    Uri,
    /// An agent provider id (`copilot` ↔ `copilot@host`).
    Provider,
    /// An AHP client identity (upstream id ↔ the client's own id).
    ClientId,
}

/// One field of a shape: a path and its kind, or a nested shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Row {
    /// A leaf field (string or array of strings).
    Field(&'static str, FieldKind),
    /// A subtree that has the rows of another shape.
    Nested(&'static str, &'static str),
}

use FieldKind::{ClientId, Provider, Uri};
use Row::{Field, Nested};

/// The table. Keys are action types, notification and method names
/// (`params:<method>`, `result:<method>`) and state shapes (`@Name`).
pub const TABLE: &[(&str, &[Row])] = &[
    // ---- state trees -------------------------------------------------------
    (
        "@Agent",
        &[
            Field("provider", Provider),
            Field("models[].provider", Provider),
        ],
    ),
    (
        "@TerminalInfo",
        &[Field("resource", Uri), Nested("claim", "@Claim")],
    ),
    (
        "@Claim",
        &[
            Field("clientId", ClientId),
            Field("session", Uri),
            Field("chat", Uri),
        ],
    ),
    (
        "@Root",
        &[
            Nested("agents[]", "@Agent"),
            Nested("terminals[]", "@TerminalInfo"),
        ],
    ),
    ("@ChatOrigin", &[Field("chat", Uri)]),
    (
        "@ChatSummary",
        &[Field("resource", Uri), Nested("origin", "@ChatOrigin")],
    ),
    (
        "@SessionOrigin",
        &[Field("automation", Uri), Field("run", Uri)],
    ),
    (
        "@SessionSummary",
        &[
            Field("resource", Uri),
            Field("provider", Provider),
            Nested("chats[]", "@ChatSummary"),
            Field("defaultChat", Uri),
            Field("annotations.resource", Uri),
            Nested("origin", "@SessionOrigin"),
        ],
    ),
    (
        "@InputRequest",
        &[
            Field("chat", Uri),
            Field("clientId", ClientId),
            Nested("toolCall", "@ToolCall"),
        ],
    ),
    ("@Customization", &[Field("clientId", ClientId)]),
    (
        "@ActiveClient",
        &[
            Field("clientId", ClientId),
            Nested("customizations[]", "@Customization"),
        ],
    ),
    (
        "@Session",
        &[
            Field("provider", Provider),
            Nested("chats[]", "@ChatSummary"),
            Field("defaultChat", Uri),
            Field("annotations.resource", Uri),
            Nested("origin", "@SessionOrigin"),
            Nested("activeClients[]", "@ActiveClient"),
            Nested("inputNeeded[]", "@InputRequest"),
            Nested("customizations[]", "@Customization"),
        ],
    ),
    ("@Message", &[Field("attachments[].resource", Uri)]),
    ("@Contributor", &[Field("clientId", ClientId)]),
    ("@ToolResult", &[Field("content[].resource", Uri)]),
    (
        "@ToolCall",
        &[
            Nested("contributor", "@Contributor"),
            Field("content[].resource", Uri),
            Nested("result", "@ToolResult"),
            Nested("userSuggestion", "@Message"),
        ],
    ),
    (
        "@Part",
        &[Field("uri", Uri), Nested("toolCall", "@ToolCall")],
    ),
    (
        "@Turn",
        &[
            Nested("message", "@Message"),
            Nested("responseParts[]", "@Part"),
        ],
    ),
    ("@Pending", &[Nested("message", "@Message")]),
    ("@Work", &[Field("terminal", Uri), Field("chat", Uri)]),
    (
        "@Chat",
        &[
            Field("resource", Uri),
            Nested("origin", "@ChatOrigin"),
            Nested("turns[]", "@Turn"),
            Nested("activeTurn", "@Turn"),
            Nested("steeringMessage", "@Pending"),
            Nested("queuedMessages[]", "@Pending"),
            Nested("draft", "@Message"),
            Nested("backgroundWork[]", "@Work"),
            Field("canvases[].resource", Uri),
        ],
    ),
    ("@Terminal", &[Nested("claim", "@Claim")]),
    ("@Snapshot", &[Field("resource", Uri)]),
    // ---- actions (payload of `action`, relative to the action object) -------
    ("root/agentsChanged", &[Nested("agents[]", "@Agent")]),
    (
        "root/terminalsChanged",
        &[Nested("terminals[]", "@TerminalInfo")],
    ),
    ("session/chatAdded", &[Nested("summary", "@ChatSummary")]),
    ("session/chatRemoved", &[Field("chat", Uri)]),
    (
        "session/chatUpdated",
        &[Field("chat", Uri), Nested("changes", "@ChatSummary")],
    ),
    ("session/chatsReordered", &[Field("chats[]", Uri)]),
    ("session/defaultChatChanged", &[Field("defaultChat", Uri)]),
    (
        "session/activeClientSet",
        &[Nested("activeClient", "@ActiveClient")],
    ),
    (
        "session/activeClientRemoved",
        &[Field("clientId", ClientId)],
    ),
    (
        "session/inputNeededSet",
        &[Nested("request", "@InputRequest")],
    ),
    (
        "session/customizationsChanged",
        &[Nested("customizations[]", "@Customization")],
    ),
    (
        "session/customizationUpdated",
        &[Nested("customization", "@Customization")],
    ),
    ("chat/turnStarted", &[Nested("message", "@Message")]),
    ("chat/responsePart", &[Nested("part", "@Part")]),
    (
        "chat/toolCallStart",
        &[Nested("contributor", "@Contributor")],
    ),
    (
        "chat/toolCallReady",
        &[Nested("contributor", "@Contributor")],
    ),
    (
        "chat/toolCallConfirmed",
        &[Nested("userSuggestion", "@Message")],
    ),
    ("chat/toolCallComplete", &[Nested("result", "@ToolResult")]),
    (
        "chat/toolCallContentChanged",
        &[Field("content[].resource", Uri)],
    ),
    ("chat/backgroundWorkSet", &[Nested("work", "@Work")]),
    ("chat/canvasesChanged", &[Field("canvases[].resource", Uri)]),
    ("chat/turnsLoaded", &[Nested("turns[]", "@Turn")]),
    ("chat/pendingMessageSet", &[Nested("message", "@Message")]),
    ("chat/draftChanged", &[Nested("draft", "@Message")]),
    ("terminal/claimed", &[Nested("claim", "@Claim")]),
    // ---- notifications (params) --------------------------------------------
    ("root/sessionAdded", &[Nested("summary", "@SessionSummary")]),
    ("root/sessionRemoved", &[Field("session", Uri)]),
    (
        "root/sessionSummaryChanged",
        &[Field("session", Uri), Nested("changes", "@SessionSummary")],
    ),
    // ---- request params (client → host) -------------------------------------
    (
        "params:createSession",
        &[
            Field("provider", Provider),
            Nested("activeClient", "@ActiveClient"),
        ],
    ),
    (
        "params:createChat",
        &[
            Field("source.chat", Uri),
            Nested("initialMessage", "@Message"),
        ],
    ),
    (
        "params:moveChat",
        &[
            Field("destination.session", Uri),
            Field("destination.after", Uri),
        ],
    ),
    ("params:createTerminal", &[Nested("claim", "@Claim")]),
    // ---- results (host → client) --------------------------------------------
    ("result:moveChat", &[Field("session", Uri)]),
    (
        "result:listSessions",
        &[Nested("items[]", "@SessionSummary")],
    ),
];

/// The table indexed by shape, built once.
static INDEX: std::sync::LazyLock<std::collections::HashMap<&'static str, &'static [Row]>> =
    std::sync::LazyLock::new(|| TABLE.iter().copied().collect());

/// Looks up a shape's rows (a hash lookup: this runs for every envelope).
pub fn rows(shape: &str) -> Option<&'static [Row]> {
    INDEX.get(shape).copied()
}

/// The state shape a snapshot of `uri` holds, chosen by scheme.
pub fn state_shape(uri: &str) -> Option<&'static str> {
    if uri == ahp_types::ROOT_RESOURCE_URI {
        return Some("@Root");
    }
    let scheme = uri.split_once(':')?.0;
    match scheme {
        "ahp-session" => Some("@Session"),
        "ahp-chat" => Some("@Chat"),
        "ahp-terminal" => Some("@Terminal"),
        _ => None,
    }
}

/// Why a value could not be translated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct TranslateError {
    /// The offending field's path.
    pub field: String,
    /// What is wrong with its value.
    pub reason: String,
}

/// Translates single values of each kind, in one direction.
pub trait Namer {
    /// Translates one value of `kind`; `Err(reason)` fails the frame.
    fn translate(&self, kind: FieldKind, value: &str) -> Result<String, String>;

    /// Translates the value of field `path` of table row `shape`; a namer
    /// that authorizes each field (contract §4.3) overrides this.
    fn field(
        &self,
        shape: &str,
        path: &str,
        kind: FieldKind,
        value: &str,
    ) -> Result<String, String> {
        let _ = (shape, path);
        self.translate(kind, value)
    }
}

/// Translates every field of `shape` in `value` in place.
pub fn translate(value: &mut Value, shape: &str, namer: &dyn Namer) -> Result<(), TranslateError> {
    let Some(rows) = rows(shape) else {
        return Ok(());
    };
    for row in rows {
        match row {
            Field(path, kind) => walk(value, path, &mut |v, at| leaf(v, shape, *kind, namer, at))?,
            Nested(path, inner) => walk(value, path, &mut |v, _| translate(v, inner, namer))?,
        }
    }
    Ok(())
}

fn leaf(
    v: &mut Value,
    shape: &str,
    kind: FieldKind,
    namer: &dyn Namer,
    at: &str,
) -> Result<(), TranslateError> {
    let fail = |reason: String| TranslateError {
        field: at.to_string(),
        reason,
    };
    match v {
        Value::String(s) => {
            *s = namer.field(shape, at, kind, s).map_err(fail)?;
            Ok(())
        }
        Value::Null => Ok(()),
        _ => Err(fail("expected a string".into())),
    }
}

/// Visits every value at `path` (`a.b[].c`), calling `f` with it.
fn walk(
    value: &mut Value,
    path: &str,
    f: &mut dyn FnMut(&mut Value, &str) -> Result<(), TranslateError>,
) -> Result<(), TranslateError> {
    let (step, rest) = match path.split_once('.') {
        Some((s, r)) => (s, Some(r)),
        None => (path, None),
    };
    let (key, each) = match step.strip_suffix("[]") {
        Some(k) => (k, true),
        None => (step, false),
    };
    let Some(child) = value.get_mut(key) else {
        return Ok(());
    };
    let mut visit = |v: &mut Value| match rest {
        Some(r) => walk(v, r, f),
        None => f(v, path),
    };
    if each {
        match child {
            Value::Array(items) => items.iter_mut().try_for_each(&mut visit),
            Value::Null => Ok(()),
            _ => Err(TranslateError {
                field: key.to_string(),
                reason: "expected an array".into(),
            }),
        }
    } else {
        visit(child)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Marks values so a round trip is visible: to-client appends `!`.
    struct Mark;
    impl Namer for Mark {
        fn translate(&self, _k: FieldKind, v: &str) -> Result<String, String> {
            Ok(format!("{v}!"))
        }
    }

    #[test]
    fn every_nested_shape_exists() {
        for (shape, rows) in TABLE {
            for row in *rows {
                if let Nested(_, inner) = row {
                    assert!(
                        super::rows(inner).is_some(),
                        "{shape} nests unknown {inner}"
                    );
                }
            }
        }
    }

    #[test]
    fn walks_arrays_nested_shapes_and_skips_missing_paths() {
        let mut v = json!({"agents": [{"provider": "p", "models": [{"provider": "p"}]}],
                           "terminals": [{"resource": "t", "claim": {"kind": "client", "clientId": "c"}}]});
        translate(&mut v, "@Root", &Mark).unwrap();
        assert_eq!(v["agents"][0]["provider"], "p!");
        assert_eq!(v["agents"][0]["models"][0]["provider"], "p!");
        assert_eq!(v["terminals"][0]["resource"], "t!");
        assert_eq!(v["terminals"][0]["claim"]["clientId"], "c!");
        assert!(v["terminals"][0]["claim"].get("session").is_none());
    }

    #[test]
    fn wrong_types_fail_closed() {
        let mut v = json!({"chat": 5});
        assert!(translate(&mut v, "session/chatRemoved", &Mark).is_err());
        let mut v = json!({"chats": "x"});
        assert!(translate(&mut v, "session/chatsReordered", &Mark).is_err());
    }
}

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
    /// A channel, resource or file URI a host names (qualified per
    /// `qualify`, external URIs kept).
    Uri,
    /// A [`FieldKind::Uri`] that refers a client to a host object it may
    /// then use — a content reference, canvas, resource watch, attachment:
    /// translated like `Uri`, and noted as shown to the receiving client
    /// (`super::seen`), which authorizes its later use (contract §7.1).
    Ref,
    /// An RFC 6570 URI template (`Changeset.uriTemplate`): its literal part
    /// is translated so that expansion commutes with qualification; noted
    /// as shown, like a [`FieldKind::Ref`].
    UriTemplate,
    /// A URI a client published (plugin and automation URIs, contract
    /// §4.2): never translated, in either direction.
    Published,
    /// An agent provider id (`copilot` ↔ `copilot.host`, see `qualify_provider`).
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

use FieldKind::{ClientId, Provider, Published, Ref, Uri, UriTemplate};
use Row::{Field, Nested};

/// The table. Keys are action types, notification and method names
/// (`params:<method>`, `result:<method>`) and state shapes (`@Name`).
/// Every name-bearing field of `ahp-types` 1.0.0 (`ahp/surface.md` §3–4).
pub const TABLE: &[(&str, &[Row])] = &[
    // ---- state trees -------------------------------------------------------
    (
        "@Agent",
        &[
            Field("provider", Provider),
            Field("models[].provider", Provider),
            Nested("customizations[]", "@Customization"),
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
        &[
            Field("resource", Uri),
            Nested("origin", "@ChatOrigin"),
            Field("workingDirectories[]", Uri),
        ],
    ),
    (
        "@SessionOrigin",
        &[Field("automation", Published), Field("run", Uri)],
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
            Field("workingDirectories[]", Uri),
            Field("project.uri", Uri),
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
    ("@Enablement", &[Field("uri", Uri)]),
    (
        "@Customization",
        &[
            Field("uri", Uri),
            Field("clientId", ClientId),
            Field("channel", Uri),
            Nested("enablement[]", "@Enablement"),
            Nested("children[]", "@ChildCustomization"),
        ],
    ),
    (
        "@ChildCustomization",
        &[
            Field("uri", Uri),
            Field("channel", Uri),
            Nested("enablement[]", "@Enablement"),
        ],
    ),
    (
        "@ClientCustomization",
        &[
            Field("uri", Published),
            Field("clientId", ClientId),
            Nested("enablement[]", "@Enablement"),
            Field("children[].uri", Published),
            Field("children[].channel", Uri),
        ],
    ),
    (
        "@ActiveClient",
        &[
            Field("clientId", ClientId),
            Nested("customizations[]", "@ClientCustomization"),
        ],
    ),
    ("@Changeset", &[Field("uriTemplate", UriTemplate)]),
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
            Field("workingDirectories[]", Uri),
            Field("project.uri", Uri),
            Nested("changesets[]", "@Changeset"),
        ],
    ),
    ("@Attachment", &[Field("uri", Ref), Field("resource", Uri)]),
    (
        "@Message",
        &[
            Nested("attachments[]", "@Attachment"),
            Field("agent.uri", Uri),
        ],
    ),
    ("@Contributor", &[Field("clientId", ClientId)]),
    (
        "@FileEditSide",
        &[Field("uri", Uri), Field("content.uri", Ref)],
    ),
    (
        "@FileEdit",
        &[
            Nested("before", "@FileEditSide"),
            Nested("after", "@FileEditSide"),
        ],
    ),
    (
        "@ToolResultContent",
        &[
            Field("uri", Ref),
            Field("resource", Uri),
            Nested("before", "@FileEditSide"),
            Nested("after", "@FileEditSide"),
        ],
    ),
    ("@ToolResult", &[Nested("content[]", "@ToolResultContent")]),
    (
        "@ToolCall",
        &[
            Nested("contributor", "@Contributor"),
            Field("toolInput.uri", Ref),
            Nested("edits.items[]", "@FileEdit"),
            Nested("content[]", "@ToolResultContent"),
            Nested("result", "@ToolResult"),
            Nested("userSuggestion", "@Message"),
        ],
    ),
    (
        "@Part",
        &[Field("uri", Ref), Nested("toolCall", "@ToolCall")],
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
            Field("canvases[].resource", Ref),
            Field("workingDirectories[]", Uri),
            Nested("changesets[]", "@Changeset"),
        ],
    ),
    ("@Terminal", &[Nested("claim", "@Claim"), Field("cwd", Uri)]),
    ("@ChangesetState", &[Nested("files[].edit", "@FileEdit")]),
    (
        "@Annotation",
        &[
            Field("resource", Uri),
            Field("origin.session", Uri),
            Field("origin.chat", Uri),
        ],
    ),
    ("@Annotations", &[Nested("annotations[]", "@Annotation")]),
    ("@ResourceWatch", &[Field("root", Uri)]),
    (
        "@AutomationTemplate",
        &[
            Field("provider", Provider),
            Field("workingDirectories[]", Uri),
            Field("agent.uri", Uri),
            Nested("customizations[]", "@ClientCustomization"),
        ],
    ),
    (
        "@RunSummary",
        &[
            Field("resource", Uri),
            Field("automation", Published),
            Field("primarySession", Uri),
        ],
    ),
    (
        "@AutomationEntry",
        &[
            Field("resource", Published),
            Nested("definition.session", "@AutomationTemplate"),
            Nested("runs[]", "@RunSummary"),
            Nested("customizations[]", "@Customization"),
        ],
    ),
    ("@Automations", &[Nested("entries[]", "@AutomationEntry")]),
    (
        "@AutomationRun",
        &[
            Field("resource", Uri),
            Field("automation", Published),
            Field("sessions[]", Uri),
            Field("primarySession", Uri),
        ],
    ),
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
    (
        "session/customizationToggled",
        &[Nested("enablement[]", "@Enablement")],
    ),
    ("session/workingDirectorySet", &[Field("directory", Uri)]),
    (
        "session/workingDirectoryRemoved",
        &[Field("directory", Uri)],
    ),
    (
        "session/workingDirectoryReplaced",
        &[Field("directory", Uri), Field("replacement", Uri)],
    ),
    ("session/mcpServerStateChanged", &[Field("channel", Uri)]),
    (
        "session/changesetsChanged",
        &[Nested("changesets[]", "@Changeset")],
    ),
    ("chat/turnStarted", &[Nested("message", "@Message")]),
    ("chat/responsePart", &[Nested("part", "@Part")]),
    (
        "chat/toolCallStart",
        &[Nested("contributor", "@Contributor")],
    ),
    (
        "chat/toolCallReady",
        &[
            Nested("contributor", "@Contributor"),
            Field("toolInput.uri", Ref),
            Nested("edits.items[]", "@FileEdit"),
        ],
    ),
    (
        "chat/toolCallConfirmed",
        &[Nested("userSuggestion", "@Message")],
    ),
    ("chat/toolCallComplete", &[Nested("result", "@ToolResult")]),
    (
        "chat/toolCallContentChanged",
        &[Nested("content[]", "@ToolResultContent")],
    ),
    ("chat/backgroundWorkSet", &[Nested("work", "@Work")]),
    ("chat/canvasesChanged", &[Field("canvases[].resource", Ref)]),
    ("chat/turnsLoaded", &[Nested("turns[]", "@Turn")]),
    ("chat/pendingMessageSet", &[Nested("message", "@Message")]),
    ("chat/draftChanged", &[Nested("draft", "@Message")]),
    ("chat/workingDirectorySet", &[Field("directory", Uri)]),
    ("chat/workingDirectoryRemoved", &[Field("directory", Uri)]),
    (
        "chat/changesetsChanged",
        &[Nested("changesets[]", "@Changeset")],
    ),
    ("terminal/claimed", &[Nested("claim", "@Claim")]),
    ("terminal/cwdChanged", &[Field("cwd", Uri)]),
    ("changeset/fileSet", &[Nested("file.edit", "@FileEdit")]),
    (
        "changeset/contentChanged",
        &[Nested("files[].edit", "@FileEdit")],
    ),
    ("annotations/set", &[Nested("annotation", "@Annotation")]),
    (
        "annotations/updated",
        &[
            Field("resource", Uri),
            Field("origin.session", Uri),
            Field("origin.chat", Uri),
        ],
    ),
    (
        "resourceWatch/changed",
        &[Field("changes.items[].uri", Uri)],
    ),
    (
        "automation/createRequested",
        &[
            Field("resource", Published),
            Nested("definition.session", "@AutomationTemplate"),
        ],
    ),
    (
        "automation/updateRequested",
        &[
            Field("resource", Published),
            Nested("changes.session", "@AutomationTemplate"),
        ],
    ),
    (
        "automation/set",
        &[Nested("automation", "@AutomationEntry")],
    ),
    ("automation/removed", &[Field("resource", Published)]),
    ("automationRun/sessionSet", &[Field("session", Uri)]),
    ("automationRun/sessionRemoved", &[Field("session", Uri)]),
    (
        "automationRun/primarySessionChanged",
        &[Field("primarySession", Uri)],
    ),
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
            Field("workingDirectories[]", Uri),
        ],
    ),
    (
        "params:createChat",
        &[
            Field("source.chat", Uri),
            Nested("initialMessage", "@Message"),
            Field("workingDirectories[]", Uri),
        ],
    ),
    (
        "params:moveChat",
        &[
            Field("destination.session", Uri),
            Field("destination.after", Uri),
        ],
    ),
    (
        "params:createTerminal",
        &[Nested("claim", "@Claim"), Field("cwd", Uri)],
    ),
    (
        "params:resolveSessionConfig",
        &[Field("provider", Provider), Field("workingDirectory", Uri)],
    ),
    (
        "params:sessionConfigCompletions",
        &[Field("provider", Provider), Field("workingDirectory", Uri)],
    ),
    (
        "params:listAutomationTriggerDefinitions",
        &[Field("workingDirectories[]", Uri)],
    ),
    (
        "params:invokeChangesetOperation",
        &[Field("target.resource", Uri)],
    ),
    ("params:resourceRead", &[Field("uri", Uri)]),
    ("params:resourceWrite", &[Field("uri", Uri)]),
    ("params:resourceList", &[Field("uri", Uri)]),
    ("params:resourceDelete", &[Field("uri", Uri)]),
    ("params:resourceResolve", &[Field("uri", Uri)]),
    ("params:resourceMkdir", &[Field("uri", Uri)]),
    ("params:resourceRequest", &[Field("uri", Uri)]),
    (
        "params:resourceCopy",
        &[Field("source", Uri), Field("destination", Uri)],
    ),
    (
        "params:resourceMove",
        &[Field("source", Uri), Field("destination", Uri)],
    ),
    ("params:createResourceWatch", &[Field("uri", Uri)]),
    ("params:runAutomation", &[Field("automation", Published)]),
    (
        "params:fetchAutomationRuns",
        &[Field("automation", Published)],
    ),
    // ---- results (host → client) --------------------------------------------
    ("result:moveChat", &[Field("session", Uri)]),
    (
        "result:listSessions",
        &[Nested("items[]", "@SessionSummary")],
    ),
    (
        "result:completions",
        &[Nested("items[].attachment", "@Attachment")],
    ),
    ("result:resourceResolve", &[Field("uri", Uri)]),
    ("result:createResourceWatch", &[Field("channel", Ref)]),
    (
        "result:invokeChangesetOperation",
        &[Field("followUp.content.uri", Ref)],
    ),
    ("result:runAutomation", &[Field("resource", Uri)]),
];

/// The table by shape, built once. Hashed with foldhash, not SipHash: this
/// lookup runs for every relayed envelope, and its keys are the table's own
/// (a host's action type only selects a row, so seeded foldhash suffices).
type Index = std::collections::HashMap<&'static str, &'static [Row], foldhash::fast::RandomState>;
static INDEX: std::sync::LazyLock<Index> =
    std::sync::LazyLock::new(|| TABLE.iter().copied().collect());

/// Looks up a shape's rows. This runs for every envelope, and nearly every
/// envelope's shape (`chat/delta`) has none: a shape whose bit is not in
/// [`SHAPES`] is answered `None` at once; the others by a hash lookup.
pub fn rows(shape: &str) -> Option<&'static [Row]> {
    if !may_have_rows(shape.as_bytes()) {
        return None;
    }
    INDEX.get(shape).copied()
}

/// Whether `shape`'s bit is in [`SHAPES`] (always, for a shape of [`TABLE`]).
fn may_have_rows(shape: &[u8]) -> bool {
    let bit = shape_bit(shape);
    SHAPES[bit / 64] & (1 << (bit % 64)) != 0
}

/// A shape's bit in [`SHAPES`] (`0..512`), from its length and its last
/// and middle bytes, mixed by a multiplication.
const fn shape_bit(shape: &[u8]) -> usize {
    let key = match shape.len() {
        0 => 0,
        len => len as u32 | (shape[len - 1] as u32) << 8 | (shape[len / 2] as u32) << 16,
    };
    (key.wrapping_mul(0x9e37_79b1) >> 23) as usize
}

/// The bits of every shape of [`TABLE`], set at compile time: no shape of
/// the table is ever answered `None` by the filter in [`rows`].
const SHAPES: [u64; 8] = {
    let mut bits = [0u64; 8];
    let mut i = 0;
    while i < TABLE.len() {
        let bit = shape_bit(TABLE[i].0.as_bytes());
        bits[bit / 64] |= 1 << (bit % 64);
        i += 1;
    }
    bits
};

/// The state shape a snapshot of `uri` holds, chosen by scheme (compared
/// case-insensitively) and shape: provider-scheme session URIs are
/// sessions, both chat URI shapes are chats (`qualify::channel_kind`).
pub fn state_shape(uri: &str) -> Option<&'static str> {
    use super::qualify::{ChannelKind, UriParts, channel_kind};
    if uri == ahp_types::ROOT_RESOURCE_URI {
        return Some("@Root");
    }
    let is = |s: &str| {
        uri.split_once(':')
            .is_some_and(|(scheme, _)| scheme.eq_ignore_ascii_case(s))
    };
    match channel_kind(uri) {
        ChannelKind::Session if UriParts::parse(uri).is_some_and(|p| p.tail == "/annotations") => {
            Some("@Annotations")
        }
        ChannelKind::Session => Some("@Session"),
        ChannelKind::Chat => Some("@Chat"),
        ChannelKind::Terminal => Some("@Terminal"),
        ChannelKind::Other if is("ahp-changeset") => Some("@ChangesetState"),
        ChannelKind::Other if is("ahp-resource-watch") => Some("@ResourceWatch"),
        ChannelKind::Other if is("ahp-automation-run") => Some("@AutomationRun"),
        ChannelKind::Other if is("ahp-automations") => Some("@Automations"),
        ChannelKind::Other => None,
    }
}

/// Why a value could not be translated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct TranslateError {
    /// The offending field's path.
    pub field: String,
    /// What is wrong with its value.
    pub reason: NameError,
}

/// Why one name does not translate, or was refused by a namer that
/// authorizes what it translates. The message is what a client reads in
/// the -32602 (or -32009) it gets; `Invisible` reads exactly as `Unknown`,
/// so whether something exists is never revealed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// A name of nothing the relay knows on the target host.
    #[error("unknown URI")]
    Unknown,
    /// A name of another host than the one the frame goes to.
    #[error("URI names another host")]
    OtherHost,
    /// A URI template that does not parse.
    #[error("malformed URI template")]
    MalformedTemplate,
    /// A host URI of a shape the relay cannot qualify (host → client).
    #[error("a host URI of a shape the relay cannot qualify")]
    Unqualifiable,
    /// A provider id of another host.
    #[error("provider belongs to another host")]
    OtherHostsProvider,
    /// A provider id without its host.
    #[error("provider must be <provider>.<host>")]
    MalformedProvider,
    /// A client id other than the sender's own.
    #[error("must be the sender's own clientId")]
    NotOwnClientId,
    /// A value of the wrong JSON type where a name belongs.
    #[error("expected a string")]
    NotAString,
    /// A value of the wrong JSON type where a list of names belongs.
    #[error("expected an array")]
    NotAnArray,
    /// A name the caller may not see (answered as nonexistent).
    #[error("unknown URI")]
    Invisible,
    /// A name the caller sees but may not use so.
    #[error("permission denied")]
    Denied,
}

impl From<super::qualify::Unqualifiable> for NameError {
    fn from(_: super::qualify::Unqualifiable) -> Self {
        Self::Unqualifiable
    }
}

/// Translates single values of each kind, in one direction.
pub trait Namer {
    /// Translates one value of `kind`; `Err(reason)` fails the frame.
    fn translate(&self, kind: FieldKind, value: &str) -> Result<String, NameError>;

    /// Translates the value of field `path` of table row `shape`; a namer
    /// that authorizes each field (contract §4.3) overrides this.
    fn field(
        &self,
        shape: &str,
        path: &str,
        kind: FieldKind,
        value: &str,
    ) -> Result<String, NameError> {
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
    let fail = |reason: NameError| TranslateError {
        field: at.to_string(),
        reason,
    };
    match v {
        Value::String(s) => {
            *s = namer.field(shape, at, kind, s).map_err(fail)?;
            Ok(())
        }
        Value::Null => Ok(()),
        _ => Err(fail(NameError::NotAString)),
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
                reason: NameError::NotAnArray,
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
        fn translate(&self, _k: FieldKind, v: &str) -> Result<String, NameError> {
            Ok(format!("{v}!"))
        }
    }

    /// The filter in front of the lookup answers no shape of the table
    /// wrongly, and answers the shape a streaming host sends most without a
    /// lookup (another shape colliding with one of the table only costs that
    /// lookup; this checks the filter does its work where it counts).
    #[test]
    fn the_shape_filter_passes_every_shape_of_the_table_and_stops_streamed_ones() {
        for (shape, _) in TABLE {
            assert!(may_have_rows(shape.as_bytes()), "{shape}");
            assert!(rows(shape).is_some(), "{shape}");
        }
        assert!(
            !may_have_rows(b"chat/delta"),
            "the streamed shape is looked up"
        );
        assert!(rows("chat/delta").is_none());
        assert!(rows("").is_none());
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

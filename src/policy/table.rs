//! The one table of what every client method and every client-dispatchable
//! action type needs (contract §7.1). A method or action type that is not
//! here is refused (-32601 / a rejection echo) before anything else.

use super::Permission;
use Permission::{FilesRead, FilesWrite, SessionsOperate, SessionsRead, TerminalsUse};

/// What the relay requires before it acts on a method or action type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Checked against the target host's grant.
    Permission(Permission),
    /// Answered by the relay itself for the principal's own session
    /// (`initialize`, `reconnect`, `ping`, `unsubscribe`); no host grant.
    Own,
    /// Aggregated over the hosts the principal may read (`listSessions`,
    /// root subscribe, `authenticate`): each host filtered by its grant.
    Aggregated,
}

/// Every client method the relay knows, and what it needs. Methods not in
/// this table are refused with -32601.
pub const METHODS: &[(&str, Need)] = &[
    ("initialize", Need::Own),
    ("reconnect", Need::Own),
    ("ping", Need::Own),
    ("unsubscribe", Need::Own),
    ("listSessions", Need::Aggregated),
    ("authenticate", Need::Aggregated),
    ("subscribe", Need::Permission(SessionsRead)),
    ("fetchTurns", Need::Permission(SessionsRead)),
    ("completions", Need::Permission(SessionsOperate)),
    ("createSession", Need::Permission(SessionsOperate)),
    ("disposeSession", Need::Permission(SessionsOperate)),
    ("createChat", Need::Permission(SessionsOperate)),
    ("disposeChat", Need::Permission(SessionsOperate)),
    ("moveChat", Need::Permission(SessionsOperate)),
    ("resolveSessionConfig", Need::Permission(SessionsOperate)),
    (
        "sessionConfigCompletions",
        Need::Permission(SessionsOperate),
    ),
    ("dispatchAction", Need::Permission(SessionsOperate)),
    ("createTerminal", Need::Permission(TerminalsUse)),
    ("disposeTerminal", Need::Permission(TerminalsUse)),
    ("resourceRead", Need::Permission(FilesRead)),
    ("resourceList", Need::Permission(FilesRead)),
    ("resourceResolve", Need::Permission(FilesRead)),
    ("resourceRequest", Need::Permission(FilesRead)),
    ("createResourceWatch", Need::Permission(FilesRead)),
    ("resourceWrite", Need::Permission(FilesWrite)),
    ("resourceCopy", Need::Permission(FilesWrite)),
    ("resourceMove", Need::Permission(FilesWrite)),
    ("resourceDelete", Need::Permission(FilesWrite)),
    ("resourceMkdir", Need::Permission(FilesWrite)),
];

/// Every action type a client may dispatch (AHP v1.0.0) and the permission
/// it needs on the target host. `root/configChanged` is absent on purpose:
/// the relay's root has no configuration, so it is refused (§6.1).
pub const ACTIONS: &[(&str, Permission)] = &[
    ("session/titleChanged", SessionsOperate),
    ("session/isReadChanged", SessionsOperate),
    ("session/isArchivedChanged", SessionsOperate),
    ("session/configChanged", SessionsOperate),
    ("session/activeClientSet", SessionsOperate),
    ("session/activeClientRemoved", SessionsOperate),
    ("session/customizationToggled", SessionsOperate),
    ("session/defaultChatChanged", SessionsOperate),
    ("session/workingDirectorySet", SessionsOperate),
    ("session/workingDirectoryRemoved", SessionsOperate),
    ("session/workingDirectoryReplaced", SessionsOperate),
    ("session/mcpServerStartRequested", SessionsOperate),
    ("session/mcpServerStopRequested", SessionsOperate),
    ("session/mcpServerBackgroundRequested", SessionsOperate),
    ("chat/turnStarted", SessionsOperate),
    ("chat/turnCancelled", SessionsOperate),
    ("chat/turnResume", SessionsOperate),
    ("chat/truncated", SessionsOperate),
    ("chat/toolCallConfirmed", SessionsOperate),
    ("chat/toolCallResultConfirmed", SessionsOperate),
    ("chat/toolCallComplete", SessionsOperate),
    ("chat/toolCallContentChanged", SessionsOperate),
    ("chat/pendingMessageSet", SessionsOperate),
    ("chat/pendingMessageRemoved", SessionsOperate),
    ("chat/queuedMessagesReordered", SessionsOperate),
    ("chat/draftChanged", SessionsOperate),
    ("chat/isReadChanged", SessionsOperate),
    ("chat/isArchivedChanged", SessionsOperate),
    ("chat/inputAnswerChanged", SessionsOperate),
    ("chat/inputCompleted", SessionsOperate),
    ("chat/workingDirectorySet", SessionsOperate),
    ("chat/workingDirectoryRemoved", SessionsOperate),
    ("terminal/input", TerminalsUse),
    ("terminal/resized", TerminalsUse),
    ("terminal/claimed", TerminalsUse),
    ("terminal/titleChanged", TerminalsUse),
    ("terminal/cleared", TerminalsUse),
];

/// What `method` needs; `None` for a method the relay does not know.
pub fn method_need(method: &str) -> Option<Need> {
    METHODS.iter().find(|(m, _)| *m == method).map(|(_, n)| *n)
}

/// What dispatching action type `ty` needs; `None` for a type a client may
/// not dispatch through the relay.
pub fn action_need(ty: &str) -> Option<Permission> {
    ACTIONS.iter().find(|(t, _)| *t == ty).map(|(_, p)| *p)
}

/// The permission a translated channel URI in a client frame implies
/// (contract §4.3), by the rewrite-table row (`shape`) holding it: operate
/// for targets (move destinations, terminal claims), read for references
/// (attachments, fork and side-chat sources, content references, anything
/// else). Working directories are `file:` URIs, not channels: the method's
/// own permission covers them.
pub fn field_need(shape: &str) -> Permission {
    match shape {
        "params:moveChat" | "@Claim" => SessionsOperate,
        _ => SessionsRead,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_method_and_action_has_exactly_one_entry() {
        for (i, (m, _)) in METHODS.iter().enumerate() {
            assert!(!METHODS[i + 1..].iter().any(|(o, _)| o == m), "{m} twice");
        }
        for (i, (t, _)) in ACTIONS.iter().enumerate() {
            assert!(!ACTIONS[i + 1..].iter().any(|(o, _)| o == t), "{t} twice");
        }
    }

    #[test]
    fn unknown_is_refused_and_known_is_mapped() {
        assert_eq!(method_need("frobnicate"), None);
        assert_eq!(action_need("chat/delta"), None, "server-only action");
        assert_eq!(action_need("root/configChanged"), None);
        assert_eq!(
            method_need("createTerminal"),
            Some(Need::Permission(TerminalsUse))
        );
        assert_eq!(action_need("terminal/input"), Some(TerminalsUse));
        assert_eq!(action_need("chat/turnStarted"), Some(SessionsOperate));
    }

    #[test]
    fn every_action_type_in_the_table_is_an_ahp_v1_type() {
        for (ty, _) in ACTIONS {
            let parsed: ahp_types::actions::ActionType =
                serde_json::from_value(serde_json::json!(ty)).unwrap();
            assert!(
                !matches!(parsed, ahp_types::actions::ActionType::Unknown(_)),
                "{ty} unknown to ahp-types"
            );
        }
    }

    #[test]
    fn fields_imply_read_or_operate() {
        assert_eq!(field_need("params:moveChat"), SessionsOperate);
        assert_eq!(field_need("@Claim"), SessionsOperate);
        assert_eq!(field_need("@Message"), SessionsRead);
        assert_eq!(field_need("params:createChat"), SessionsRead);
        // every shape named here exists in the rewrite table
        for shape in ["params:moveChat", "@Claim", "@Message", "params:createChat"] {
            assert!(crate::names::translate::rows(shape).is_some(), "{shape}");
        }
    }
}

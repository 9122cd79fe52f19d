//! The one table of what every client-dispatchable action type needs
//! (contract §7.1), and the permission a URI field implies. An action type
//! that is not here is refused with a rejection echo. Methods have their
//! own table, with their permission as a column: `route::methods`.

use super::Permission;
use Permission::{SessionsOperate, SessionsRead, TerminalsUse};

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
    fn every_action_has_exactly_one_entry() {
        for (i, (t, _)) in ACTIONS.iter().enumerate() {
            assert!(!ACTIONS[i + 1..].iter().any(|(o, _)| o == t), "{t} twice");
        }
    }

    #[test]
    fn unknown_is_refused_and_known_is_mapped() {
        assert_eq!(action_need("chat/delta"), None, "server-only action");
        assert_eq!(action_need("root/configChanged"), None);
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

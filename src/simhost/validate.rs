//! The host's validation of client-dispatched actions (`dispatchAction`).
//!
//! Implements the spec's "Server Validation of Client Actions" table for the
//! chat channel, plus the rules the spec leaves to hosts and this one adopts
//! (the seed study §5.3): a second `chat/turnStarted` while a turn is active
//! is rejected, a reused `turnId` is rejected, server-only actions are
//! rejected, identity fields must name the dispatching client, and an action
//! must belong to the channel's scheme. Reducers never enforce these: they
//! apply whatever they are given.

use ahp_types::actions::StateAction;
use ahp_types::state::{ChatState, ResponsePart, TerminalClaim, TurnState};
use serde_json::Value;

use super::state::{ChannelKind, HostState};

/// What the host does with a dispatched action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Unknown channel: silently ignored, no echo (spec: MUST).
    Ignore,
    /// Echoed with this `rejectionReason` and not applied.
    Reject(String),
    /// Applied and echoed.
    Accept,
}

/// Action types a client may dispatch (AHP v1.0.0 guide, `actions.md`).
const CLIENT_DISPATCHABLE: &[&str] = &[
    "root/configChanged",
    "session/titleChanged",
    "session/isReadChanged",
    "session/isArchivedChanged",
    "session/configChanged",
    "session/activeClientSet",
    "session/activeClientRemoved",
    "session/customizationToggled",
    "session/defaultChatChanged",
    "session/workingDirectorySet",
    "session/workingDirectoryRemoved",
    "session/workingDirectoryReplaced",
    "session/mcpServerStartRequested",
    "session/mcpServerStopRequested",
    "session/mcpServerBackgroundRequested",
    "chat/turnStarted",
    "chat/turnCancelled",
    "chat/turnResume",
    "chat/truncated",
    "chat/toolCallConfirmed",
    "chat/toolCallResultConfirmed",
    "chat/toolCallComplete",
    "chat/toolCallContentChanged",
    "chat/pendingMessageSet",
    "chat/pendingMessageRemoved",
    "chat/queuedMessagesReordered",
    "chat/draftChanged",
    "chat/isReadChanged",
    "chat/isArchivedChanged",
    "chat/inputAnswerChanged",
    "chat/inputCompleted",
    "chat/workingDirectorySet",
    "chat/workingDirectoryRemoved",
    "terminal/input",
    "terminal/resized",
    "terminal/claimed",
    "terminal/titleChanged",
    "terminal/cleared",
];

/// Whether a client may dispatch actions of type `ty` at all.
pub fn is_client_dispatchable(ty: &str) -> bool {
    CLIENT_DISPATCHABLE.contains(&ty)
}

/// Judges `action` (of wire type `ty`) dispatched by `client` on `channel`.
pub fn validate(
    state: &HostState,
    channel: &str,
    ty: &str,
    action: &StateAction,
    client: &str,
) -> Verdict {
    if !state.has_channel(channel) {
        return Verdict::Ignore;
    }
    if matches!(action, StateAction::Unknown(_)) {
        return Verdict::Reject(format!("unknown action type: {ty}"));
    }
    if !is_client_dispatchable(ty) {
        return Verdict::Reject(format!("server-only action: {ty}"));
    }
    let kind = ChannelKind::of(channel);
    let scheme_ok = match kind {
        ChannelKind::Root => ty.starts_with("root/"),
        ChannelKind::Session => ty.starts_with("session/"),
        ChannelKind::Chat => ty.starts_with("chat/"),
        ChannelKind::Terminal => ty.starts_with("terminal/"),
        ChannelKind::ResourceWatch | ChannelKind::Other => false,
    };
    if !scheme_ok {
        return Verdict::Reject(format!("{ty} does not apply to {channel}"));
    }
    let reason = match kind {
        ChannelKind::Root => root_rule(state, action),
        ChannelKind::Session => session_rule(action, client),
        ChannelKind::Chat => match state.chats.get(channel) {
            Some(chat) => chat_rule(state, &chat.state, &chat.session, action, client),
            None => return Verdict::Ignore,
        },
        ChannelKind::Terminal => match state.terminals.get(channel) {
            Some(t) => terminal_rule(&t.claim, action, client),
            None => return Verdict::Ignore,
        },
        ChannelKind::ResourceWatch | ChannelKind::Other => return Verdict::Ignore,
    };
    reason.map_or(Verdict::Accept, Verdict::Reject)
}

/// `root/configChanged` needs a root `config` (VS Code mode) and may only
/// set properties its schema declares.
fn root_rule(state: &HostState, action: &StateAction) -> Option<String> {
    let Some(config) = &state.root.config else {
        return Some("this host has no root configuration".to_string());
    };
    match action {
        StateAction::RootConfigChanged(a) => a
            .config
            .keys()
            .find(|k| !config.schema.properties.contains_key(*k))
            .map(|k| format!("unknown root config property: {k}")),
        _ => None,
    }
}

fn session_rule(action: &StateAction, client: &str) -> Option<String> {
    match action {
        StateAction::SessionActiveClientSet(a) if a.active_client.client_id != client => {
            Some("activeClient.clientId must be the dispatching client".into())
        }
        StateAction::SessionActiveClientRemoved(a) if a.client_id != client => {
            Some("a client may only remove itself".into())
        }
        _ => None,
    }
}

fn chat_rule(
    state: &HostState,
    chat: &ChatState,
    session: &str,
    action: &StateAction,
    client: &str,
) -> Option<String> {
    match action {
        StateAction::ChatTurnStarted(a) => {
            let ready = state.sessions.get(session).is_some_and(|s| {
                matches!(s.state.lifecycle, ahp_types::state::SessionLifecycle::Ready)
            });
            if !ready {
                Some("session is not ready".into())
            } else if chat.active_turn.is_some() {
                Some("chat already has an active turn".into())
            } else if chat.turns.iter().any(|t| t.id == a.turn_id) {
                Some(format!("duplicate turnId: {}", a.turn_id))
            } else {
                None
            }
        }
        StateAction::ChatTurnCancelled(a) => match &chat.active_turn {
            Some(t) if t.id == a.turn_id => None,
            Some(_) => Some("turnId does not name the active turn".into()),
            None => Some("no active turn".into()),
        },
        StateAction::ChatTurnResume(a) => resume_rule(chat, &a.turn_id),
        StateAction::ChatToolCallConfirmed(a) => {
            match tool_call(chat, &a.turn_id, &a.tool_call_id) {
                Some(tc) if tc.status == "pending-confirmation" => None,
                _ => Some("tool call is not pending confirmation".into()),
            }
        }
        StateAction::ChatToolCallResultConfirmed(a) => {
            match tool_call(chat, &a.turn_id, &a.tool_call_id) {
                Some(tc) if tc.status == "pending-result-confirmation" => None,
                _ => Some("tool call is not pending result confirmation".into()),
            }
        }
        StateAction::ChatToolCallComplete(a) => {
            client_tool_rule(chat, &a.turn_id, &a.tool_call_id, client)
        }
        StateAction::ChatToolCallContentChanged(a) => {
            client_tool_rule(chat, &a.turn_id, &a.tool_call_id, client)
        }
        StateAction::ChatInputAnswerChanged(a) => input_rule(chat, &a.request_id),
        StateAction::ChatInputCompleted(a) => input_rule(chat, &a.request_id),
        StateAction::ChatPendingMessageRemoved(a) => {
            let queued = chat.queued_messages.iter().flatten();
            let present = match a.kind {
                ahp_types::state::PendingMessageKind::Queued => {
                    queued.into_iter().any(|m| m.id == a.id)
                }
                ahp_types::state::PendingMessageKind::Steering => {
                    chat.steering_message.as_ref().is_some_and(|m| m.id == a.id)
                }
            };
            (!present).then(|| format!("no pending message {}", a.id))
        }
        _ => None,
    }
}

fn resume_rule(chat: &ChatState, turn_id: &str) -> Option<String> {
    if chat.active_turn.is_some() {
        return Some("chat has an active turn".into());
    }
    let Some(last) = chat.turns.last() else {
        return Some("no errored turn to resume".into());
    };
    let resumable = matches!(
        last.response_parts.last(),
        Some(ResponsePart::Error(e)) if e.resumable == Some(true)
    );
    if last.id != turn_id || last.state != TurnState::Error || !resumable {
        return Some("turnId is not the latest resumable errored turn".into());
    }
    None
}

/// The fields of a tool call that validation needs.
struct ToolCallView {
    status: String,
    contributor_client: Option<String>,
}

fn tool_call(chat: &ChatState, turn_id: &str, tool_call_id: &str) -> Option<ToolCallView> {
    let turn = chat.active_turn.as_ref().filter(|t| t.id == turn_id)?;
    turn.response_parts.iter().find_map(|p| {
        let ResponsePart::ToolCall(tc) = p else {
            return None;
        };
        let v = serde_json::to_value(&tc.tool_call).ok()?;
        (v.get("toolCallId")?.as_str()? == tool_call_id).then(|| ToolCallView {
            status: str_at(&v, &["status"]).unwrap_or_default(),
            contributor_client: (str_at(&v, &["contributor", "kind"]).as_deref() == Some("client"))
                .then(|| str_at(&v, &["contributor", "clientId"]))
                .flatten(),
        })
    })
}

fn str_at(v: &Value, path: &[&str]) -> Option<String> {
    path.iter()
        .try_fold(v, |v, k| v.get(k))
        .and_then(Value::as_str)
        .map(str::to_string)
}

fn client_tool_rule(
    chat: &ChatState,
    turn_id: &str,
    tool_call_id: &str,
    client: &str,
) -> Option<String> {
    match tool_call(chat, turn_id, tool_call_id) {
        None => Some("no such tool call in the active turn".into()),
        Some(tc) if tc.contributor_client.as_deref() != Some(client) => {
            Some("tool call is not contributed by the dispatching client".into())
        }
        Some(tc) if tc.status != "running" => Some("tool call is not running".into()),
        Some(_) => None,
    }
}

fn input_rule(chat: &ChatState, request_id: &str) -> Option<String> {
    let open = chat.active_turn.iter().flat_map(|t| &t.response_parts).any(|p| {
        matches!(p, ResponsePart::InputRequest(r)
            if r.response.is_none()
            && serde_json::to_value(&r.request).ok().and_then(|v| str_at(&v, &["id"])).as_deref() == Some(request_id))
    });
    (!open).then(|| format!("no input request {request_id}"))
}

fn terminal_rule(claim: &TerminalClaim, action: &StateAction, client: &str) -> Option<String> {
    match action {
        StateAction::TerminalClaimed(a) => {
            let holds = matches!(claim, TerminalClaim::Client(c) if c.client_id == client);
            let names_self = matches!(&a.claim, TerminalClaim::Client(c) if c.client_id == client);
            if !holds {
                Some("the dispatching client does not hold the claim".into())
            } else if !names_self && !matches!(a.claim, TerminalClaim::Session(_)) {
                Some("a claim may only be handed to a session or kept".into())
            } else {
                None
            }
        }
        _ => None,
    }
}

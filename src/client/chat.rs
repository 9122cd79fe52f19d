//! Chat-channel logic shared by `client tail` and `client send`: reading the
//! subscription snapshot, classifying action envelopes, following one turn,
//! and building the typed actions the client dispatches.

use ahp_types::actions::{
    ActionEnvelope, ChatPendingMessageSetAction, ChatToolCallConfirmedAction,
    ChatTurnCancelledAction, ChatTurnStartedAction, StateAction,
};
use ahp_types::commands::SubscribeResult;
use ahp_types::state::{
    ActiveTurn, Message, MessageKind, MessageOrigin, PendingMessageKind, ResponsePart,
    SnapshotState, ToolCallCancellationReason, ToolCallConfirmationReason, ToolCallState,
};

/// How a turn finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum TurnEnd {
    /// `chat/turnComplete`.
    Complete,
    /// `chat/turnCancelled`.
    Cancelled,
    /// `chat/error`, with the error message.
    Error(String),
}

/// The parts of a chat action envelope the CLI reacts to.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum ChatEvent<'a> {
    /// Streamed reply text (`chat/delta`).
    Delta { turn_id: &'a str, text: &'a str },
    /// A turn started (`chat/turnStarted`), possibly from a queued message.
    TurnStarted {
        turn_id: &'a str,
        queued_message_id: Option<&'a str>,
    },
    /// A tool call started (`chat/toolCallStart`): its name, for messages.
    ToolCallStarted {
        turn_id: &'a str,
        tool_call_id: &'a str,
        tool_name: &'a str,
    },
    /// A tool call entered `pending-confirmation` (`chat/toolCallReady` without `confirmed`).
    ToolCallAwaitsConfirmation {
        turn_id: &'a str,
        tool_call_id: &'a str,
    },
    /// A tool call was confirmed or denied (`chat/toolCallConfirmed`).
    ToolCallConfirmed { tool_call_id: &'a str },
    /// A turn ended.
    TurnEnded { turn_id: &'a str, end: TurnEnd },
    /// Anything else, including every envelope carrying a `rejectionReason`.
    Other,
}

/// Classify an envelope; rejected envelopes are always [`ChatEvent::Other`]
/// because the server did not apply them.
pub(super) fn chat_event(env: &ActionEnvelope) -> ChatEvent<'_> {
    if env.rejection_reason.is_some() {
        return ChatEvent::Other;
    }
    match &env.action {
        StateAction::ChatDelta(a) => ChatEvent::Delta {
            turn_id: &a.turn_id,
            text: &a.content,
        },
        StateAction::ChatTurnStarted(a) => ChatEvent::TurnStarted {
            turn_id: &a.turn_id,
            queued_message_id: a.queued_message_id.as_deref(),
        },
        StateAction::ChatToolCallStart(a) => ChatEvent::ToolCallStarted {
            turn_id: &a.turn_id,
            tool_call_id: &a.tool_call_id,
            tool_name: &a.tool_name,
        },
        StateAction::ChatToolCallConfirmed(a) => ChatEvent::ToolCallConfirmed {
            tool_call_id: &a.tool_call_id,
        },
        StateAction::ChatToolCallReady(a) if a.confirmed.is_none() => {
            ChatEvent::ToolCallAwaitsConfirmation {
                turn_id: &a.turn_id,
                tool_call_id: &a.tool_call_id,
            }
        }
        StateAction::ChatTurnComplete(a) => ended(&a.turn_id, TurnEnd::Complete),
        StateAction::ChatTurnCancelled(a) => ended(&a.turn_id, TurnEnd::Cancelled),
        StateAction::ChatError(a) => {
            ended(&a.turn_id, TurnEnd::Error(a.part.error.message.clone()))
        }
        _ => ChatEvent::Other,
    }
}

/// Shorthand for [`ChatEvent::TurnEnded`].
fn ended(turn_id: &str, end: TurnEnd) -> ChatEvent<'_> {
    ChatEvent::TurnEnded { turn_id, end }
}

/// True when `env` is the echo of our own dispatch `(client_id, client_seq)`.
pub(super) fn is_echo_of(env: &ActionEnvelope, client_id: &str, client_seq: i64) -> bool {
    env.origin
        .as_ref()
        .is_some_and(|o| o.client_id == client_id && o.client_seq == client_seq)
}

/// What the `subscribe` result of a chat channel tells the CLI.
#[derive(Debug, Default)]
pub(super) struct ChatStart {
    /// `fromSeq` of the snapshot; envelopes at or below it are already in it.
    from_seq: Option<i64>,
    /// Markdown text already streamed in the snapshot's active turn, if any.
    pub(super) active_text: Option<String>,
    /// The id of the snapshot's active turn, if any.
    pub(super) active_turn: Option<String>,
    /// The tool calls of the active turn that wait for confirmation.
    pub(super) pending_tools: Vec<PendingTool>,
}

/// A tool call waiting for the user's confirmation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PendingTool {
    /// The turn it belongs to.
    pub(super) turn_id: String,
    /// Its `toolCallId`.
    pub(super) tool_call_id: String,
    /// Its tool's name.
    pub(super) tool_name: String,
}

impl ChatStart {
    /// Read a subscribe result. A missing snapshot is accepted (nothing to
    /// skip or replay); a snapshot of another channel kind is an error whose
    /// value names that kind.
    pub(super) fn from_subscribe(result: SubscribeResult) -> Result<Self, &'static str> {
        let Some(snapshot) = result.snapshot else {
            return Ok(Self::default());
        };
        match snapshot.state {
            SnapshotState::Chat(chat) => Ok(Self {
                from_seq: Some(snapshot.from_seq),
                active_text: chat.active_turn.as_ref().map(active_turn_text),
                active_turn: chat.active_turn.as_ref().map(|t| t.id.clone()),
                pending_tools: chat
                    .active_turn
                    .as_ref()
                    .map_or_else(Vec::new, pending_tools),
            }),
            other => Err(snapshot_kind(&other)),
        }
    }

    /// True when `env` is newer than the snapshot (so not already reflected in it).
    pub(super) fn is_live(&self, env: &ActionEnvelope) -> bool {
        match self.from_seq.map(u64::try_from) {
            Some(Ok(from)) => env.server_seq > from,
            _ => true,
        }
    }
}

/// Concatenated content of the markdown response parts of `turn`.
fn active_turn_text(turn: &ActiveTurn) -> String {
    turn.response_parts
        .iter()
        .filter_map(|part| match part {
            ResponsePart::Markdown(m) => Some(m.content.as_str()),
            _ => None,
        })
        .collect()
}

/// The tool calls of `turn` in `pending-confirmation`.
fn pending_tools(turn: &ActiveTurn) -> Vec<PendingTool> {
    turn.response_parts
        .iter()
        .filter_map(|part| match part {
            ResponsePart::ToolCall(t) => match &t.tool_call {
                ToolCallState::PendingConfirmation(p) => Some(PendingTool {
                    turn_id: turn.id.clone(),
                    tool_call_id: p.tool_call_id.clone(),
                    tool_name: p.tool_name.clone(),
                }),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// Human name of a snapshot's channel kind.
pub(super) fn snapshot_kind(state: &SnapshotState) -> &'static str {
    match state {
        SnapshotState::Session(_) => "session",
        SnapshotState::Chat(_) => "chat",
        SnapshotState::Canvas(_) => "canvas",
        SnapshotState::Terminal(_) => "terminal",
        SnapshotState::Changeset(_) => "changeset",
        SnapshotState::ResourceWatch(_) => "resource watch",
        SnapshotState::Annotations(_) => "annotations",
        SnapshotState::Automations(_) => "automations",
        SnapshotState::AutomationRun(_) => "automation run",
        SnapshotState::Root(_) => "root",
    }
}

/// Which turn `send --wait` follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Target {
    /// A turn we started ourselves.
    Turn(String),
    /// The turn the server will start from our queued message (id unknown yet).
    Queued { message_id: String },
}

/// What the CLI must do in reaction to one envelope while following a turn.
#[derive(Debug, PartialEq)]
pub(super) enum Step<'a> {
    /// Nothing.
    Ignore,
    /// Print this reply text.
    Print(&'a str),
    /// Approve this tool call of the followed turn (see [`approve_tool_call`]).
    Approve {
        turn_id: &'a str,
        tool_call_id: &'a str,
    },
    /// The followed turn now waits for the user to confirm this tool call.
    AwaitsApproval(PendingTool),
    /// The followed turn ended.
    Finished(TurnEnd),
}

/// Follows the reply of one turn: its text, its tool confirmations, its end.
#[derive(Debug)]
pub(super) struct TurnFollower {
    target: Target,
    approve_tools: bool,
    /// Names of the followed turn's tool calls, by `toolCallId`.
    tool_names: Vec<(String, String)>,
    /// The tool calls the turn waits on (not approved by the follower).
    waiting: Vec<PendingTool>,
}

impl TurnFollower {
    /// Follow `target`; approve its pending tool calls when `approve_tools`.
    pub(super) fn new(target: Target, approve_tools: bool) -> Self {
        Self {
            target,
            approve_tools,
            tool_names: Vec::new(),
            waiting: Vec::new(),
        }
    }

    /// The tool calls the followed turn waits on for the user's confirmation.
    pub(super) fn waiting(&self) -> &[PendingTool] {
        &self.waiting
    }

    /// React to one (live, chat-channel) envelope.
    pub(super) fn on_action<'a>(&mut self, env: &'a ActionEnvelope) -> Step<'a> {
        match chat_event(env) {
            ChatEvent::TurnStarted {
                turn_id,
                queued_message_id: Some(queued),
            } if self.target
                == Target::Queued {
                    message_id: queued.to_owned(),
                } =>
            {
                self.target = Target::Turn(turn_id.to_owned());
                Step::Ignore
            }
            ChatEvent::Delta { turn_id, text } if self.is_target(turn_id) => Step::Print(text),
            ChatEvent::ToolCallAwaitsConfirmation {
                turn_id,
                tool_call_id,
            } if self.is_target(turn_id) => self.on_confirmation(turn_id, tool_call_id),
            ChatEvent::ToolCallStarted {
                turn_id,
                tool_call_id,
                tool_name,
            } if self.is_target(turn_id) => {
                self.tool_names
                    .push((tool_call_id.to_owned(), tool_name.to_owned()));
                Step::Ignore
            }
            ChatEvent::ToolCallConfirmed { tool_call_id } => {
                self.waiting.retain(|p| p.tool_call_id != tool_call_id);
                Step::Ignore
            }
            ChatEvent::TurnEnded { turn_id, end } if self.is_target(turn_id) => Step::Finished(end),
            _ => Step::Ignore,
        }
    }

    /// A tool call of the followed turn asks for confirmation: approve it,
    /// or remember and report that the turn now waits for the user.
    fn on_confirmation<'a>(&mut self, turn_id: &'a str, tool_call_id: &'a str) -> Step<'a> {
        if self.approve_tools {
            return Step::Approve {
                turn_id,
                tool_call_id,
            };
        }
        let tool_name = self
            .tool_names
            .iter()
            .find(|(id, _)| id == tool_call_id)
            .map_or_else(|| tool_call_id.to_owned(), |(_, name)| name.clone());
        let pending = PendingTool {
            turn_id: turn_id.to_owned(),
            tool_call_id: tool_call_id.to_owned(),
            tool_name,
        };
        self.waiting.push(pending.clone());
        Step::AwaitsApproval(pending)
    }

    /// True when `turn_id` is the (resolved) followed turn.
    fn is_target(&self, turn_id: &str) -> bool {
        matches!(&self.target, Target::Turn(id) if id == turn_id)
    }
}

/// A user-origin message with just `text`.
fn user_message(text: String) -> Message {
    Message {
        text,
        origin: MessageOrigin {
            kind: MessageKind::User,
        },
        attachments: None,
        model: None,
        agent: None,
        meta: None,
    }
}

/// `chat/turnStarted` for a new user turn.
pub(super) fn start_turn(turn_id: String, started_at: String, text: String) -> StateAction {
    StateAction::ChatTurnStarted(ChatTurnStartedAction {
        turn_id,
        started_at,
        message: user_message(text),
        queued_message_id: None,
        meta: None,
    })
}

/// `chat/pendingMessageSet` queueing a user message.
pub(super) fn queue_message(id: String, text: String) -> StateAction {
    StateAction::ChatPendingMessageSet(ChatPendingMessageSetAction {
        kind: PendingMessageKind::Queued,
        id,
        message: user_message(text),
    })
}

/// `chat/toolCallConfirmed` approving a tool call.
pub(super) fn approve_tool_call(turn_id: &str, tool_call_id: &str) -> StateAction {
    confirm_tool_call(turn_id, tool_call_id, true)
}

/// `chat/toolCallConfirmed` approving (`approved`, by user action) or
/// denying (reason `denied`) a tool call.
pub(super) fn confirm_tool_call(turn_id: &str, tool_call_id: &str, approved: bool) -> StateAction {
    StateAction::ChatToolCallConfirmed(ChatToolCallConfirmedAction {
        turn_id: turn_id.to_owned(),
        tool_call_id: tool_call_id.to_owned(),
        meta: None,
        approved,
        confirmed: approved.then_some(ToolCallConfirmationReason::UserAction),
        reason: (!approved).then_some(ToolCallCancellationReason::Denied),
        edited_tool_input: None,
        user_suggestion: None,
        reason_message: None,
        selected_option_id: None,
    })
}

/// `chat/turnCancelled` for the active turn `turn_id`. The duration is the
/// producer's measure; a client that did not run the turn has none, so 0.
pub(super) fn cancel_turn(turn_id: &str) -> StateAction {
    StateAction::ChatTurnCancelled(ChatTurnCancelledAction {
        turn_id: turn_id.to_owned(),
        duration: 0,
        meta: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn env(seq: u64, action: Value) -> ActionEnvelope {
        serde_json::from_value(
            json!({"channel": "ahp-chat:/c", "serverSeq": seq, "action": action}),
        )
        .unwrap()
    }

    fn delta(turn: &str, text: &str) -> Value {
        json!({"type": "chat/delta", "turnId": turn, "partId": "p", "content": text})
    }

    #[test]
    fn rejected_envelopes_are_not_text() {
        let mut e = env(3, delta("t1", "hi"));
        assert_eq!(
            chat_event(&e),
            ChatEvent::Delta {
                turn_id: "t1",
                text: "hi"
            }
        );
        e.rejection_reason = Some("nope".into());
        assert_eq!(chat_event(&e), ChatEvent::Other);
    }

    #[test]
    fn turn_ends_are_classified() {
        let c = env(
            1,
            json!({"type": "chat/turnComplete", "turnId": "t", "duration": 5}),
        );
        let x = env(
            2,
            json!({"type": "chat/turnCancelled", "turnId": "t", "duration": 5}),
        );
        let e = env(
            3,
            json!({"type": "chat/error", "turnId": "t", "duration": 5,
            "part": {"kind": "error", "error": {"errorType": "x", "message": "boom"}}}),
        );
        let end = |ev: ChatEvent<'_>| match ev {
            ChatEvent::TurnEnded { end, .. } => Some(end),
            _ => None,
        };
        assert_eq!(end(chat_event(&c)), Some(TurnEnd::Complete));
        assert_eq!(end(chat_event(&x)), Some(TurnEnd::Cancelled));
        assert_eq!(end(chat_event(&e)), Some(TurnEnd::Error("boom".into())));
    }

    #[test]
    fn echo_matching_uses_client_id_and_seq() {
        let mut e = env(9, delta("t", "x"));
        assert!(!is_echo_of(&e, "cli-1", 1));
        e.origin = Some(ahp_types::ActionOrigin {
            client_id: "cli-1".into(),
            client_seq: 1,
        });
        assert!(is_echo_of(&e, "cli-1", 1));
        assert!(!is_echo_of(&e, "cli-1", 2));
        assert!(!is_echo_of(&e, "cli-2", 1));
    }

    #[test]
    fn snapshot_gives_active_text_and_filters_old_envelopes() {
        let result: SubscribeResult = serde_json::from_value(json!({"snapshot": {
            "resource": "ahp-chat:/c", "fromSeq": 10,
            "state": {"resource": "ahp-chat:/c", "title": "t", "status": 8,
                "modifiedAt": "2025-01-01T00:00:00.000Z", "turns": [],
                "activeTurn": {"id": "t1", "startedAt": "2025-01-01T00:00:00.000Z",
                    "message": {"text": "q", "origin": {"kind": "user"}},
                    "responseParts": [
                        {"kind": "markdown", "id": "a", "content": "Hello, "},
                        {"kind": "reasoning", "id": "r", "content": "hmm"},
                        {"kind": "markdown", "id": "b", "content": "world"}]}}}}))
        .unwrap();
        let start = ChatStart::from_subscribe(result).unwrap();
        assert_eq!(start.active_text.as_deref(), Some("Hello, world"));
        assert!(!start.is_live(&env(10, delta("t1", "x"))));
        assert!(start.is_live(&env(11, delta("t1", "x"))));
        let none = ChatStart::from_subscribe(SubscribeResult { snapshot: None }).unwrap();
        assert!(none.is_live(&env(0, delta("t1", "x"))));
    }

    #[test]
    fn follower_tracks_only_its_turn_and_approves_tools() {
        let mut f = TurnFollower::new(Target::Turn("t1".into()), true);
        assert_eq!(f.on_action(&env(1, delta("t0", "no"))), Step::Ignore);
        assert_eq!(f.on_action(&env(2, delta("t1", "yes"))), Step::Print("yes"));
        let ready = |confirmed: Option<&str>| {
            let mut a = json!({"type": "chat/toolCallReady", "turnId": "t1",
                "toolCallId": "tc", "invocationMessage": "run"});
            if let Some(c) = confirmed {
                a["confirmed"] = json!(c);
            }
            env(3, a)
        };
        assert_eq!(
            f.on_action(&ready(None)),
            Step::Approve {
                turn_id: "t1",
                tool_call_id: "tc"
            }
        );
        assert_eq!(f.on_action(&ready(Some("not-needed"))), Step::Ignore);
        let done = env(
            4,
            json!({"type": "chat/turnComplete", "turnId": "t1", "duration": 1}),
        );
        assert_eq!(f.on_action(&done), Step::Finished(TurnEnd::Complete));
    }

    /// Without `--approve-tools` the follower never approves: it reports
    /// the wait, with the tool's name, until the call is confirmed.
    #[test]
    fn follower_without_approval_reports_the_wait() {
        let mut f = TurnFollower::new(Target::Turn("t1".into()), false);
        let start = env(
            2,
            json!({"type": "chat/toolCallStart", "turnId": "t1", "toolCallId": "tc",
            "toolName": "sim_shell", "displayName": "Run command"}),
        );
        assert_eq!(f.on_action(&start), Step::Ignore);
        let ready = env(
            3,
            json!({"type": "chat/toolCallReady", "turnId": "t1",
            "toolCallId": "tc", "invocationMessage": "run"}),
        );
        let pending = PendingTool {
            turn_id: "t1".into(),
            tool_call_id: "tc".into(),
            tool_name: "sim_shell".into(),
        };
        assert_eq!(f.on_action(&ready), Step::AwaitsApproval(pending.clone()));
        assert_eq!(f.waiting(), [pending]);
        let confirmed = env(
            4,
            json!({"type": "chat/toolCallConfirmed", "turnId": "t1", "toolCallId": "tc",
            "approved": true}),
        );
        assert_eq!(f.on_action(&confirmed), Step::Ignore);
        assert!(f.waiting().is_empty());
    }

    #[test]
    fn follower_resolves_queued_message_to_its_turn() {
        let mut f = TurnFollower::new(
            Target::Queued {
                message_id: "m1".into(),
            },
            false,
        );
        let started = |turn: &str, queued: &str| {
            env(
                1,
                json!({"type": "chat/turnStarted", "turnId": turn,
                "startedAt": "2025-01-01T00:00:00.000Z", "queuedMessageId": queued,
                "message": {"text": "q", "origin": {"kind": "user"}}}),
            )
        };
        assert_eq!(f.on_action(&started("other", "m0")), Step::Ignore);
        assert_eq!(f.on_action(&delta_env("other")), Step::Ignore);
        assert_eq!(f.on_action(&started("t9", "m1")), Step::Ignore);
        assert_eq!(f.on_action(&delta_env("t9")), Step::Print("x"));
    }

    fn delta_env(turn: &str) -> ActionEnvelope {
        env(5, delta(turn, "x"))
    }

    #[test]
    fn built_actions_have_the_wire_shape() {
        let started = serde_json::to_value(start_turn(
            "turn-1".into(),
            "2025-01-01T00:00:00.000Z".into(),
            "hi".into(),
        ))
        .unwrap();
        assert_eq!(
            started,
            json!({"type": "chat/turnStarted", "turnId": "turn-1",
                "startedAt": "2025-01-01T00:00:00.000Z",
                "message": {"text": "hi", "origin": {"kind": "user"}}})
        );
        let queued = serde_json::to_value(queue_message("msg-1".into(), "hi".into())).unwrap();
        assert_eq!(
            queued,
            json!({"type": "chat/pendingMessageSet", "kind": "queued", "id": "msg-1",
                "message": {"text": "hi", "origin": {"kind": "user"}}})
        );
        let approve = serde_json::to_value(approve_tool_call("t", "tc")).unwrap();
        assert_eq!(
            approve,
            json!({"type": "chat/toolCallConfirmed", "turnId": "t", "toolCallId": "tc",
                "approved": true, "confirmed": "user-action"})
        );
        let deny = serde_json::to_value(confirm_tool_call("t", "tc", false)).unwrap();
        assert_eq!(
            deny,
            json!({"type": "chat/toolCallConfirmed", "turnId": "t", "toolCallId": "tc",
                "approved": false, "reason": "denied"})
        );
        let cancel = serde_json::to_value(cancel_turn("t")).unwrap();
        assert_eq!(
            cancel,
            json!({"type": "chat/turnCancelled", "turnId": "t", "duration": 0})
        );
    }
}

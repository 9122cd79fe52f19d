//! The commands that act on a chat's turns: `tail`, `send`, `cancel`,
//! `approve` and `deny`.

use ahp::SessionSubscription;
use ahp_types::actions::{ActionEnvelope, StateAction};
use tokio::time::Instant;

use super::chat::{
    ChatEvent, ChatStart, PendingTool, Step, Target, TurnEnd, TurnFollower, approve_tool_call,
    cancel_turn, chat_event, confirm_tool_call, is_echo_of, queue_message, start_turn,
};
use super::cli::CliError;
use super::conn::{Connection, emit, next_live_action, note};
use super::ids;

// ─── tail ───────────────────────────────────────────────────────────────────

/// `tail`: print the active turn's text so far, then follow the chat.
pub(super) async fn tail(
    conn: &Connection,
    chat: &str,
    turns: Option<u64>,
) -> Result<(), CliError> {
    let (start, mut sub) = conn.subscribe_chat(chat).await?;
    if let Some(text) = &start.active_text {
        emit(text)?;
    }
    tokio::select! {
        outcome = follow_chat(&mut sub, &start, chat, turns) => outcome,
        () = interrupted() => Ok(()),
    }
}

/// Print deltas and a newline per finished turn, and on stderr each tool
/// call that waits for approval with its command; return after `turns` turns.
async fn follow_chat(
    sub: &mut SessionSubscription,
    start: &ChatStart,
    chat: &str,
    turns: Option<u64>,
) -> Result<(), CliError> {
    let mut finished = 0u64;
    let mut names: Vec<(String, String)> = Vec::new();
    for pending in &start.pending_tools {
        note(&approval_line(chat, pending));
    }
    loop {
        let env = next_live_action(sub, start).await?;
        match chat_event(&env) {
            ChatEvent::Delta { text, .. } => emit(text)?,
            ChatEvent::ToolCallStarted {
                tool_call_id,
                tool_name,
                ..
            } => names.push((tool_call_id.to_owned(), tool_name.to_owned())),
            ChatEvent::ToolCallAwaitsConfirmation {
                turn_id,
                tool_call_id,
            } => {
                let tool_name = names
                    .iter()
                    .find(|(id, _)| id == tool_call_id)
                    .map_or_else(|| tool_call_id.to_owned(), |(_, n)| n.clone());
                let pending = PendingTool {
                    turn_id: turn_id.to_owned(),
                    tool_call_id: tool_call_id.to_owned(),
                    tool_name,
                };
                note(&approval_line(chat, &pending));
            }
            ChatEvent::TurnEnded { .. } => {
                emit("\n")?;
                finished += 1;
                if turns.is_some_and(|n| finished >= n) {
                    return Ok(());
                }
            }
            _ => {}
        }
    }
}

/// Resolves on Ctrl-C; never resolves if the signal cannot be watched.
async fn interrupted() {
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}

// ─── send ───────────────────────────────────────────────────────────────────

/// The arguments of `send`.
pub(super) struct SendRequest {
    pub(super) chat: String,
    pub(super) text: String,
    pub(super) wait: bool,
    pub(super) approve_tools: bool,
    pub(super) queue: bool,
}

/// `send`: dispatch, await the echo, optionally follow the reply. One
/// `--timeout` bounds everything after the dispatch: the echo, and with
/// `--wait` the whole turn.
pub(super) async fn send(conn: &Connection, req: SendRequest) -> Result<(), CliError> {
    let (start, mut sub) = conn.subscribe_chat(&req.chat).await?;
    let (id, action, target) = if req.queue {
        let id = ids::message_id();
        let action = queue_message(id.clone(), req.text);
        let target = Target::Queued {
            message_id: id.clone(),
        };
        (id, action, target)
    } else {
        let id = ids::turn_id();
        let action = start_turn(id.clone(), ids::now_iso8601(), req.text);
        (id.clone(), action, Target::Turn(id))
    };
    let deadline = Instant::now() + conn.timeout;
    let client_seq = conn.dispatch(&req.chat, action).await?;
    let echo = await_echo(conn, &mut sub, &start, client_seq, deadline).await?;
    if let Some(reason) = echo.rejection_reason {
        return Err(CliError::Rejected(reason));
    }
    note(&format!("accepted {id} serverSeq={}", echo.server_seq));
    if !req.wait {
        return Ok(());
    }
    let mut follower = TurnFollower::new(target, req.approve_tools);
    let followed = follow_turn(conn, &mut sub, &start, &req.chat, &mut follower);
    match tokio::time::timeout_at(deadline, followed).await {
        Ok(outcome) => outcome,
        Err(_) => Err(CliError::TurnTimeout {
            timeout: conn.timeout,
            waiting: follower
                .waiting()
                .iter()
                .map(|p| format!("tool `{}` ({})", p.tool_name, p.tool_call_id))
                .collect(),
        }),
    }
}

/// Wait until `deadline` for the envelope echoing our dispatch `client_seq`.
async fn await_echo(
    conn: &Connection,
    sub: &mut SessionSubscription,
    start: &ChatStart,
    client_seq: i64,
    deadline: Instant,
) -> Result<ActionEnvelope, CliError> {
    let wait = async {
        loop {
            let env = next_live_action(sub, start).await?;
            if is_echo_of(&env, &conn.client_id, client_seq) {
                return Ok(env);
            }
        }
    };
    tokio::time::timeout_at(deadline, wait)
        .await
        .map_err(|_| CliError::EchoTimeout(conn.timeout))?
}

/// Print the followed turn's reply, approve its tools if asked (else say
/// what it waits for and how to approve), until it ends.
async fn follow_turn(
    conn: &Connection,
    sub: &mut SessionSubscription,
    start: &ChatStart,
    chat: &str,
    follower: &mut TurnFollower,
) -> Result<(), CliError> {
    loop {
        let env = next_live_action(sub, start).await?;
        match follower.on_action(&env) {
            Step::Ignore => {}
            Step::Print(text) => emit(text)?,
            Step::Approve {
                turn_id,
                tool_call_id,
            } => {
                conn.dispatch(chat, approve_tool_call(turn_id, tool_call_id))
                    .await?;
            }
            Step::AwaitsApproval(pending) => note(&approval_line(chat, &pending)),
            Step::Finished(end) => {
                emit("\n")?;
                return turn_outcome(end);
            }
        }
    }
}

/// `waiting: tool `x` needs approval: <bin> client approve <chat> <id> (or deny)`.
pub(super) fn approval_line(chat: &str, pending: &PendingTool) -> String {
    let bin = this_binary();
    let (chat, id) = (shell_word(chat), shell_word(&pending.tool_call_id));
    format!(
        "waiting: tool `{}` needs approval: {bin} client approve {chat} {id}  \
         (or: {bin} client deny {chat} {id})",
        pending.tool_name
    )
}

/// How to call this program again: its path (after `cargo run` it is not on PATH).
fn this_binary() -> String {
    std::env::current_exe()
        .map(|p| shell_word(&p.display().to_string()))
        .unwrap_or_else(|_| "ahp-relay".into())
}

/// `word` as one shell word: unchanged when it holds only characters no
/// shell treats specially, else single-quoted.
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:~=+@%,".contains(&b));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// Success only for a completed turn.
pub(super) fn turn_outcome(end: TurnEnd) -> Result<(), CliError> {
    match end {
        TurnEnd::Complete => Ok(()),
        TurnEnd::Cancelled => Err(CliError::TurnCancelled),
        TurnEnd::Error(message) => Err(CliError::TurnFailed(message)),
    }
}

// ─── cancel, approve, deny ──────────────────────────────────────────────────

/// `cancel`: cancel the chat's active turn and wait for the echo.
pub(super) async fn cancel(conn: &Connection, chat: &str) -> Result<(), CliError> {
    let (start, mut sub) = conn.subscribe_chat(chat).await?;
    let turn = start
        .active_turn
        .clone()
        .ok_or_else(|| CliError::NoActiveTurn(chat.to_owned()))?;
    dispatch_and_confirm(conn, &mut sub, &start, chat, cancel_turn(&turn)).await?;
    note(&format!("cancelled {turn}"));
    Ok(())
}

/// `approve` / `deny`: confirm the named (or only) waiting tool call.
pub(super) async fn confirm(
    conn: &Connection,
    chat: &str,
    tool_call: Option<String>,
    approved: bool,
) -> Result<(), CliError> {
    let (start, mut sub) = conn.subscribe_chat(chat).await?;
    let pending = pick_pending(chat, &start.pending_tools, tool_call)?;
    let action = confirm_tool_call(&pending.turn_id, &pending.tool_call_id, approved);
    dispatch_and_confirm(conn, &mut sub, &start, chat, action).await?;
    let verb = if approved { "approved" } else { "denied" };
    note(&format!(
        "{verb} tool `{}` ({})",
        pending.tool_name, pending.tool_call_id
    ));
    Ok(())
}

/// The waiting tool call named `wanted`, or the only one.
fn pick_pending(
    chat: &str,
    pending: &[PendingTool],
    wanted: Option<String>,
) -> Result<PendingTool, CliError> {
    let none = |named| CliError::NoPendingTool {
        chat: chat.to_owned(),
        named,
    };
    match wanted {
        Some(id) => pending
            .iter()
            .find(|p| p.tool_call_id == id)
            .cloned()
            .ok_or_else(|| none(Some(id))),
        None => match pending {
            [] => Err(none(None)),
            [one] => Ok(one.clone()),
            many => Err(CliError::SeveralPendingTools {
                chat: chat.to_owned(),
                ids: many.iter().map(|p| p.tool_call_id.clone()).collect(),
            }),
        },
    }
}

/// Dispatch `action` on `chat` and wait (within `--timeout`) for its echo;
/// a rejection is an error.
async fn dispatch_and_confirm(
    conn: &Connection,
    sub: &mut SessionSubscription,
    start: &ChatStart,
    chat: &str,
    action: StateAction,
) -> Result<(), CliError> {
    let deadline = Instant::now() + conn.timeout;
    let client_seq = conn.dispatch(chat, action).await?;
    let echo = await_echo(conn, sub, start, client_seq, deadline).await?;
    match echo.rejection_reason {
        Some(reason) => Err(CliError::Rejected(reason)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(id: &str) -> PendingTool {
        PendingTool {
            turn_id: "t".into(),
            tool_call_id: id.into(),
            tool_name: "sim_shell".into(),
        }
    }

    #[test]
    fn the_only_or_the_named_pending_tool_is_picked() {
        assert_eq!(pick_pending("c", &[tool("a")], None).ok(), Some(tool("a")));
        let two = [tool("a"), tool("b")];
        assert_eq!(
            pick_pending("c", &two, Some("b".into())).ok(),
            Some(tool("b"))
        );
        assert!(matches!(
            pick_pending("c", &two, None),
            Err(CliError::SeveralPendingTools { ids, .. }) if ids == ["a", "b"]
        ));
        assert!(matches!(
            pick_pending("c", &[], None),
            Err(CliError::NoPendingTool { named: None, .. })
        ));
    }

    #[test]
    fn the_approval_line_is_a_runnable_command() {
        let line = approval_line("ahp-chat:/buildbox~x", &tool("t-tool"));
        assert!(
            line.starts_with("waiting: tool `sim_shell` needs approval: "),
            "{line}"
        );
        assert!(
            line.contains(" client approve ahp-chat:/buildbox~x t-tool"),
            "{line}"
        );
        assert_eq!(shell_word("it's"), r"'it'\''s'");
    }
}

//! `dispatchAction` and `unsubscribe`: the client notifications that
//! change host state.

use std::sync::Arc;

use ahp_types::actions::{ActionOrigin, StateAction};
use ahp_types::state::PendingMessageKind;
use serde_json::{Value, json};

use super::agent;
use super::client_tools;
use super::core::{ConnId, HostCore};
use super::server::Shared;
use super::state::ChannelKind;
use super::typed::typed_action;
use super::validate::{Verdict, validate};

/// Validates, numbers and echoes one dispatched action, then runs its side
/// effects (agent turns, queue consumption, terminal echo, catalog updates).
/// Malformed dispatches and dispatches before `initialize` are dropped (a
/// notification has no answer); the caller counts them.
pub fn dispatch_action(
    shared: &Arc<Shared>,
    core: &mut HostCore,
    conn: ConnId,
    params: &Value,
) -> Result<(), &'static str> {
    let client = core
        .client_of(conn)
        .ok_or("dispatchAction before initialize")?;
    let channel = params
        .get("channel")
        .and_then(Value::as_str)
        .ok_or("dispatchAction without channel")?;
    let client_seq = params
        .get("clientSeq")
        .and_then(Value::as_i64)
        .ok_or("dispatchAction without integer clientSeq")?;
    let raw = params
        .get("action")
        .ok_or("dispatchAction without action")?;
    let ty = raw
        .get("type")
        .and_then(Value::as_str)
        .ok_or("dispatchAction without action.type")?;
    let action: StateAction =
        serde_json::from_value(raw.clone()).unwrap_or_else(|_| StateAction::Unknown(raw.clone()));
    let mut verdict = validate(&core.state, channel, ty, &action, &client);
    if verdict == Verdict::Accept
        && matches!(action, StateAction::ChatTurnStarted(_))
        && let Some(resource) = super::auth::missing_token(core, conn)
    {
        verdict = Verdict::Reject(format!("authentication required for {resource}"));
    }
    let origin = ActionOrigin {
        client_id: client,
        client_seq,
    };
    match verdict {
        Verdict::Ignore => {}
        Verdict::Reject(reason) => {
            core.echo(channel, action, origin, Some(reason));
        }
        Verdict::Accept => {
            core.echo(channel, action.clone(), origin, None);
            after_accept(shared, core, channel, &action);
        }
    }
    Ok(())
}

fn after_accept(shared: &Arc<Shared>, core: &mut HostCore, channel: &str, action: &StateAction) {
    match action {
        StateAction::ChatTurnStarted(a) => agent::start_turn(shared, core, channel, &a.turn_id),
        StateAction::ChatToolCallConfirmed(_)
        | StateAction::ChatToolCallComplete(_)
        | StateAction::ChatToolCallResultConfirmed(_)
        | StateAction::ChatTurnCancelled(_) => {
            agent::wake(core, channel);
            if matches!(action, StateAction::ChatTurnCancelled(_)) {
                agent::consume_queue(shared, core, channel);
            }
        }
        StateAction::ChatPendingMessageSet(a) if a.kind == PendingMessageKind::Queued => {
            agent::consume_queue(shared, core, channel);
        }
        StateAction::SessionActiveClientSet(a) => {
            client_tools::client_rejoined(core, channel, &a.active_client.client_id);
        }
        StateAction::SessionActiveClientRemoved(a) => {
            client_tools::client_left(shared, core, channel, &a.client_id);
        }
        StateAction::TerminalInput(a) => {
            if let Some(echo) = typed_action(json!({"type": "terminal/data", "data": a.data})) {
                core.emit(channel, echo);
            }
        }
        StateAction::SessionTitleChanged(_)
        | StateAction::SessionIsReadChanged(_)
        | StateAction::SessionIsArchivedChanged(_) => core.notify_summary_changed(channel),
        _ => {}
    }
}

/// Releases a subscription; leaving a session channel also removes the
/// client from the session's active clients (the spec's SHOULD), which
/// starts the grace of its client tool calls there.
pub fn unsubscribe(
    shared: &Arc<Shared>,
    core: &mut HostCore,
    conn: ConnId,
    params: &Value,
) -> Result<(), &'static str> {
    let channel = params
        .get("channel")
        .and_then(Value::as_str)
        .ok_or("unsubscribe without channel")?;
    let client = core.client_of(conn);
    if let Some(entry) = core.conn_mut(conn) {
        entry.subs.remove(channel);
    }
    if ChannelKind::of(channel) == ChannelKind::ResourceWatch {
        super::files::release_unwatched(core);
    }
    let (Some(client), ChannelKind::Session) = (client, ChannelKind::of(channel)) else {
        return Ok(());
    };
    let active = core
        .state
        .sessions
        .get(channel)
        .is_some_and(|s| s.state.active_clients.iter().any(|c| c.client_id == client));
    if active
        && let Some(a) =
            typed_action(json!({"type": "session/activeClientRemoved", "clientId": client}))
    {
        core.emit(channel, a);
        client_tools::client_left(shared, core, channel, &client);
    }
    Ok(())
}

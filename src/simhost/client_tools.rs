//! Client-contributed tools: tools a client publishes in its
//! `SessionActiveClient.tools` (via `session/activeClientSet`), which the
//! agent calls with a client [`ToolCallContributor`] so that the client runs
//! them and reports with `chat/toolCallComplete`.
//!
//! The host's side of the contract (AHP `SessionActiveClientRemovedAction`,
//! `ChatToolCallCompleteAction`): only the contributor may complete its tool
//! call (checked in [`super::validate`]); a contributor that goes away — its
//! last connection closes, or it leaves the session's `activeClients` — gets
//! [`SimHostConfig::client_tool_grace_ms`] to come back, after which the host
//! removes it from `activeClients` (disconnect case) and fails its running
//! tool calls with `chat/toolCallComplete {result.success: false}`; the
//! agent then goes on with the turn. Decisions are listed in
//! `src/simhost/README.md`.
//!
//! [`ToolCallContributor`]: ahp_types::state::ToolCallContributor
//! [`SimHostConfig::client_tool_grace_ms`]: super::SimHostConfig::client_tool_grace_ms

use std::sync::Arc;

use ahp_types::state::ResponsePart;
use serde_json::{Value, json};

use super::agent;
use super::core::HostCore;
use super::server::Shared;
use super::typed::typed_action;

/// What a message writes to make the agent call a client tool:
/// `[client-tool:<name>]` anywhere in its text.
pub const MARKER: &str = "[client-tool:";

/// The tool name a message text asks for, if it carries [`MARKER`].
pub fn requested_tool(text: &str) -> Option<&str> {
    let start = text.find(MARKER)? + MARKER.len();
    let rest = text.get(start..)?;
    let name = rest.get(..rest.find(']')?)?;
    (!name.is_empty()).then_some(name)
}

/// The client that runs `tool` for `chat`, and the tool's display name: the
/// first of the chat's session's active clients (in `activeClients` order)
/// that offers a tool of that name.
pub fn contributor_for(core: &HostCore, chat: &str, tool: &str) -> Option<(String, String)> {
    let session = &core.state.chats.get(chat)?.session;
    let state = &core.state.sessions.get(session)?.state;
    state.active_clients.iter().find_map(|c| {
        c.tools.iter().find(|t| t.name == tool).map(|t| {
            let display = t.title.clone().unwrap_or_else(|| t.name.clone());
            (c.client_id.clone(), display)
        })
    })
}

/// A running tool call of some chat's active turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningCall {
    /// The chat.
    pub chat: String,
    /// The active turn.
    pub turn_id: String,
    /// The tool call.
    pub tool_call_id: String,
    /// The tool's name.
    pub tool_name: String,
}

/// The `running` tool calls contributed by `client`, in the chats of
/// `session` (or of every session).
pub fn running_calls_of(core: &HostCore, client: &str, session: Option<&str>) -> Vec<RunningCall> {
    let mut out = Vec::new();
    for (uri, entry) in &core.state.chats {
        if session.is_some_and(|s| s != entry.session) {
            continue;
        }
        let Some(turn) = &entry.state.active_turn else {
            continue;
        };
        for part in &turn.response_parts {
            let ResponsePart::ToolCall(tc) = part else {
                continue;
            };
            let Ok(v) = serde_json::to_value(&tc.tool_call) else {
                continue;
            };
            let text = |k: &str| v.get(k).and_then(Value::as_str);
            let contributor = v.get("contributor");
            let ours = contributor
                .and_then(|c| c.get("kind"))
                .and_then(Value::as_str)
                == Some("client")
                && contributor
                    .and_then(|c| c.get("clientId"))
                    .and_then(Value::as_str)
                    == Some(client);
            if ours
                && text("status") == Some("running")
                && let (Some(id), Some(name)) = (text("toolCallId"), text("toolName"))
            {
                out.push(RunningCall {
                    chat: uri.clone(),
                    turn_id: turn.id.clone(),
                    tool_call_id: id.to_string(),
                    tool_name: name.to_string(),
                });
            }
        }
    }
    out
}

/// Fails `client`'s running tool calls (in `session`'s chats, or all) with
/// a failed `chat/toolCallComplete`, and wakes the agents waiting on them.
pub fn fail_calls(core: &mut HostCore, client: &str, session: Option<&str>, why: &str) {
    for call in running_calls_of(core, client, session) {
        if let Some(a) = typed_action(json!({
            "type": "chat/toolCallComplete", "turnId": call.turn_id,
            "toolCallId": call.tool_call_id,
            "result": {"success": false,
                "pastTenseMessage": format!("`{}` did not run", call.tool_name),
                "error": {"message": why}}
        })) {
            core.emit(&call.chat, a);
        }
        agent::wake(core, &call.chat);
    }
}

/// The last connection of `client` closed: unless it comes back within the
/// grace, it leaves every session's `activeClients` and its running tool
/// calls fail.
pub fn client_gone(shared: &Arc<Shared>, core: &mut HostCore, client: &str) {
    let token = core.next_grace;
    core.next_grace += 1;
    core.gone.insert(client.to_string(), token);
    let (epoch, grace) = (core.epoch, core.cfg.client_tool_grace());
    let (shared, client) = (shared.clone(), client.to_string());
    tokio::spawn(async move {
        tokio::time::sleep(grace).await;
        let mut core = shared.lock();
        if core.epoch != epoch || core.gone.get(&client) != Some(&token) {
            return; // came back, went away again later, or the host restarted
        }
        core.gone.remove(&client);
        let sessions: Vec<String> = core
            .state
            .sessions
            .iter()
            .filter(|(_, s)| s.state.active_clients.iter().any(|c| c.client_id == client))
            .map(|(uri, _)| uri.clone())
            .collect();
        for session in sessions {
            if let Some(a) =
                typed_action(json!({"type": "session/activeClientRemoved", "clientId": client}))
            {
                core.emit(&session, a);
            }
        }
        fail_calls(
            &mut core,
            &client,
            None,
            "the contributing client disconnected",
        );
    });
}

/// `client` holds a connection again (`initialize` or `reconnect`): its
/// disconnect grace ends without effect.
pub fn client_back(core: &mut HostCore, client: &str) {
    core.gone.remove(client);
}

/// A contributor's tool call starts: a contributor without a live
/// connection (and no grace running) gets one grace to show up, so the turn
/// cannot wait forever (e.g. `activeClients` kept across a host restart).
pub fn watch_contributor(shared: &Arc<Shared>, core: &mut HostCore, client: &str) {
    if core.conns_of(client).is_empty() && !core.gone.contains_key(client) {
        client_gone(shared, core, client);
    }
}

/// `client` left `session`'s `activeClients` (`session/activeClientRemoved`
/// or `unsubscribe`): unless it sets itself again within the grace, its
/// running tool calls in that session's chats fail.
pub fn client_left(shared: &Arc<Shared>, core: &mut HostCore, session: &str, client: &str) {
    let key = (session.to_string(), client.to_string());
    let token = core.next_grace;
    core.next_grace += 1;
    core.left.insert(key.clone(), token);
    let (epoch, grace) = (core.epoch, core.cfg.client_tool_grace());
    let shared = shared.clone();
    tokio::spawn(async move {
        tokio::time::sleep(grace).await;
        let mut core = shared.lock();
        if core.epoch != epoch || core.left.get(&key) != Some(&token) {
            return;
        }
        core.left.remove(&key);
        let (session, client) = key;
        let back = core
            .state
            .sessions
            .get(&session)
            .is_some_and(|s| s.state.active_clients.iter().any(|c| c.client_id == client));
        if !back {
            fail_calls(
                &mut core,
                &client,
                Some(&session),
                "the contributing client left the session",
            );
        }
    });
}

/// `client` set itself active in `session` again: its leave grace ends
/// without effect.
pub fn client_rejoined(core: &mut HostCore, session: &str, client: &str) {
    core.left.remove(&(session.to_string(), client.to_string()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marker_names_the_tool() {
        assert_eq!(
            requested_tool("please [client-tool:read_tab] now"),
            Some("read_tab")
        );
        assert_eq!(requested_tool("[client-tool:a][client-tool:b]"), Some("a"));
        assert_eq!(requested_tool("[client-tool:]"), None);
        assert_eq!(requested_tool("[client-tool:open"), None);
        assert_eq!(requested_tool("no marker"), None);
    }
}

//! The commands about sessions, chats and providers: `sessions` (with
//! `--chats`), `providers`, `create-session`, `dispose-session`,
//! `create-chat`, `dispose-chat`.
//!
//! Chat URIs are never built by the user: `sessions --chats` and
//! `create-session` print them, the default chat first taken from the
//! session's state and, when the host names none, derived the way VS Code
//! does for a provider-scheme session (`ahp-chat://default/<b64url(session)>`).

use ahp_types::ROOT_RESOURCE_URI;
use ahp_types::commands::{
    CreateChatParams, CreateSessionParams, DisposeChatParams, DisposeSessionParams,
    ListSessionsParams, ListSessionsResult,
};
use ahp_types::state::{AgentInfo, SessionState, SessionSummary, SnapshotState};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use serde_json::{Value, json};

use super::chat::snapshot_kind;
use super::cli::CliError;
use super::conn::{Connection, note, print_json, print_lines};
use super::hints::policy_explain;
use super::{format, ids};
use crate::names::qualify::is_provider_scheme;

/// `sessions` stops paging after this many items.
const MAX_SESSIONS: usize = 10_000;

// ─── sessions ───────────────────────────────────────────────────────────────

/// `sessions`: the table (or JSON) of sessions, or with `chats` of their
/// chats; `N sessions` on stderr, with a hint when there are none.
pub(super) async fn sessions(
    conn: &Connection,
    limit: u32,
    chats: bool,
    json: bool,
) -> Result<(), CliError> {
    let all = list_sessions(conn, limit).await?;
    let mut rows = Vec::new();
    for s in &all {
        let state = if chats {
            Some(session_state(conn, &s.resource).await?)
        } else {
            None
        };
        rows.push((s, state));
    }
    if json {
        print_json(&Value::Array(rows.iter().map(session_json).collect()))?;
    } else if chats {
        let lines = rows
            .iter()
            .flat_map(|(s, st)| format::chat_lines(s, st.as_ref()));
        print_lines(std::iter::once(format::CHAT_HEADER.to_owned()).chain(lines))?;
    } else {
        let lines = all.iter().map(format::session_line);
        print_lines(std::iter::once(format::SESSION_HEADER.to_owned()).chain(lines))?;
    }
    note(&format!("{} sessions", all.len()));
    if all.is_empty() {
        note(&format!("hint: {}", empty_hint(conn).await?));
    }
    Ok(())
}

/// Why the listing is empty, and what to run: with no provider visible, the
/// policy grants this principal no host; else there is nothing yet.
async fn empty_hint(conn: &Connection) -> Result<String, CliError> {
    if root_agents(conn).await?.is_empty() {
        let explain = policy_explain(conn.subject.as_deref());
        return Ok(format!(
            "no host is visible to this principal (no policy rule grants it one, or its \
             hosts are down); `{explain}` shows what it holds on each host"
        ));
    }
    Ok("no session yet: `ahp-relay client create-session` makes one".into())
}

/// One session as JSON: its summary, and with `state` its chats and default chat.
fn session_json((summary, state): &(&SessionSummary, Option<SessionState>)) -> Value {
    let mut v = serde_json::to_value(summary).unwrap_or(Value::Null);
    if let (Some(state), Some(obj)) = (state, v.as_object_mut()) {
        let default = default_chat(&summary.resource, state);
        let chats: Vec<Value> = format::chats_of(state, default.as_deref())
            .into_iter()
            .map(|c| {
                json!({"resource": c.uri, "title": c.title, "status": c.status,
                       "default": c.default})
            })
            .collect();
        obj.insert("defaultChat".into(), json!(default));
        obj.insert("chats".into(), Value::Array(chats));
    }
    v
}

/// The default chat of `session`: the state's, else for a provider-scheme
/// session the VS Code-shaped `ahp-chat://default/<b64url(session)>`.
pub(super) fn default_chat(session: &str, state: &SessionState) -> Option<String> {
    if let Some(chat) = &state.default_chat {
        return Some(chat.clone());
    }
    let scheme = session.split_once(':')?.0;
    is_provider_scheme(scheme)
        .then(|| format!("ahp-chat://default/{}", B64.encode(session.as_bytes())))
}

/// Page through `listSessions` until no `nextCursor` (or an empty page), at
/// most [`MAX_SESSIONS`] items.
async fn list_sessions(conn: &Connection, limit: u32) -> Result<Vec<SessionSummary>, CliError> {
    let mut all = Vec::new();
    let mut cursor = None;
    loop {
        let params = ListSessionsParams {
            channel: ROOT_RESOURCE_URI.to_owned(),
            meta: None,
            limit: Some(i64::from(limit)),
            cursor: cursor.take(),
        };
        let page: ListSessionsResult = conn.call("listSessions", params).await?;
        let empty = page.items.is_empty();
        all.extend(page.items);
        if all.len() >= MAX_SESSIONS {
            all.truncate(MAX_SESSIONS);
            return Ok(all);
        }
        match page.next_cursor {
            Some(next) if !empty => cursor = Some(next),
            _ => return Ok(all),
        }
    }
}

/// The state of session `uri` (subscribe, read the snapshot, unsubscribe).
async fn session_state(conn: &Connection, uri: &str) -> Result<SessionState, CliError> {
    let (result, _sub) = conn.subscribe(uri).await?;
    conn.unsubscribe(uri).await;
    match result.snapshot.map(|s| s.state) {
        Some(SnapshotState::Session(state)) => Ok(*state),
        Some(other) => Err(CliError::NotASession {
            uri: uri.to_owned(),
            kind: snapshot_kind(&other),
        }),
        None => Err(CliError::NotASession {
            uri: uri.to_owned(),
            kind: "empty",
        }),
    }
}

// ─── providers ──────────────────────────────────────────────────────────────

/// The agents of the root state this principal sees.
async fn root_agents(conn: &Connection) -> Result<Vec<AgentInfo>, CliError> {
    let (result, _sub) = conn.subscribe(ROOT_RESOURCE_URI).await?;
    conn.unsubscribe(ROOT_RESOURCE_URI).await;
    Ok(match result.snapshot.map(|s| s.state) {
        Some(SnapshotState::Root(root)) => root.agents,
        _ => Vec::new(),
    })
}

/// `providers`: PROVIDER and NAME of every visible agent.
pub(super) async fn providers(conn: &Connection, json: bool) -> Result<(), CliError> {
    let agents = root_agents(conn).await?;
    if json {
        let list = agents
            .iter()
            .map(|a| json!({"provider": a.provider, "displayName": a.display_name}))
            .collect();
        return print_json(&Value::Array(list));
    }
    let lines = agents
        .iter()
        .map(|a| format::row(&[&a.provider, &a.display_name]));
    print_lines(std::iter::once("PROVIDER\tNAME".to_owned()).chain(lines))?;
    if agents.is_empty() {
        note(&format!("hint: {}", empty_hint(conn).await?));
    }
    Ok(())
}

// ─── create, dispose ────────────────────────────────────────────────────────

/// `create-session`: create it, then print its URI and its default chat's.
pub(super) async fn create_session(
    conn: &Connection,
    provider: Option<String>,
    uri: Option<String>,
    json: bool,
) -> Result<(), CliError> {
    let uri = uri.unwrap_or_else(|| format!("ahp-session:/{}", ids::client_id()));
    let params = CreateSessionParams {
        channel: uri.clone(),
        meta: None,
        provider,
        working_directories: None,
        config: None,
        active_client: None,
        progress_token: None,
    };
    let _: Value = conn.call("createSession", params).await?;
    let state = session_state(conn, &uri).await?;
    let chat = default_chat(&uri, &state);
    if json {
        return print_json(&json!({"session": uri, "defaultChat": chat,
                                  "provider": state.provider}));
    }
    print_lines(std::iter::once(format::row(&[
        &uri,
        chat.as_deref().unwrap_or("-"),
    ])))
}

/// `dispose-session`.
pub(super) async fn dispose_session(conn: &Connection, session: &str) -> Result<(), CliError> {
    let params = DisposeSessionParams {
        channel: session.to_owned(),
        meta: None,
    };
    let _: Value = conn.call("disposeSession", params).await?;
    note(&format!("disposed {session}"));
    Ok(())
}

/// `create-chat`: a chat URI in the session's shape (authority form with the
/// session inside for provider-scheme sessions), created and printed.
pub(super) async fn create_chat(
    conn: &Connection,
    session: &str,
    uri: Option<String>,
) -> Result<(), CliError> {
    let chat = uri.unwrap_or_else(|| new_chat_uri(session));
    let params = CreateChatParams {
        channel: session.to_owned(),
        meta: None,
        chat: chat.clone(),
        initial_message: None,
        source: None,
        working_directories: None,
    };
    let _: Value = conn.call("createChat", params).await?;
    print_lines(std::iter::once(chat))
}

/// A fresh chat URI for `session`: `ahp-chat://<id>/<b64url(session)>` for a
/// provider-scheme session (VS Code's shape), else `ahp-chat:/<id>`.
fn new_chat_uri(session: &str) -> String {
    let id = format!("chat-{}", ids::random_hex());
    let provider_scheme = session
        .split_once(':')
        .is_some_and(|(scheme, _)| is_provider_scheme(scheme));
    if provider_scheme {
        format!("ahp-chat://{id}/{}", B64.encode(session.as_bytes()))
    } else {
        format!("ahp-chat:/{id}")
    }
}

/// `dispose-chat`.
pub(super) async fn dispose_chat(conn: &Connection, chat: &str) -> Result<(), CliError> {
    let params = DisposeChatParams {
        channel: chat.to_owned(),
        meta: None,
    };
    let _: Value = conn.call("disposeChat", params).await?;
    note(&format!("disposed {chat}"));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(default: Option<&str>) -> SessionState {
        let mut v = json!({"provider": "copilot.gpu1", "title": "t", "status": 1,
            "lifecycle": "ready", "activeClients": [], "chats": []});
        if let Some(d) = default {
            v["defaultChat"] = json!(d);
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn the_default_chat_is_the_hosts_or_derived_for_provider_sessions() {
        assert_eq!(
            default_chat("ahp-session:/a", &state(Some("ahp-chat:/a-main"))).as_deref(),
            Some("ahp-chat:/a-main")
        );
        assert_eq!(default_chat("ahp-session:/a", &state(None)), None);
        assert_eq!(
            default_chat("copilot.gpu1:/abc", &state(None)).as_deref(),
            Some(format!("ahp-chat://default/{}", B64.encode("copilot.gpu1:/abc")).as_str())
        );
    }

    #[test]
    fn new_chats_take_the_sessions_shape() {
        assert!(new_chat_uri("ahp-session:/s").starts_with("ahp-chat:/chat-"));
        let vscode = new_chat_uri("copilot.gpu1:/abc");
        let b64 = B64.encode("copilot.gpu1:/abc");
        assert!(
            vscode.starts_with("ahp-chat://chat-") && vscode.ends_with(&format!("/{b64}")),
            "{vscode}"
        );
    }
}

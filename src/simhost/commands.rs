//! The host's answers to client requests (everything except `dispatchAction`
//! and `unsubscribe`, which are notifications).
//!
//! Each handler runs under the host lock and returns the serialized `result`
//! or an [`RpcError`]; envelopes a handler emits are queued before its
//! response, so e.g. `session/chatAdded` precedes the `createChat` result and
//! `chat/turnsLoaded` precedes the `fetchTurns` result.

use std::sync::Arc;

use ahp_types::commands::{
    ChatMoveDestination, CreateChatParams, CreateSessionParams, CreateTerminalParams,
    FetchTurnsParams, InitializeParams, InitializeResult, ListSessionsParams, MoveChatParams,
    ReconnectParams, SubscribeParams,
};
use ahp_types::state::{Snapshot, TerminalClaim, TerminalState};
use ahp_types::version::negotiate_protocol_version;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::agent;
use super::core::{ConnId, HostCore, ReplayDecision};
use super::naming;
use super::server::Shared;
use super::state::{ChannelKind, chat_summary, parse_turns_cursor, turns_cursor};
use super::typed::{typed, typed_action};
use crate::rpc::RpcError;

/// Largest `listSessions` page; also the page when `limit` is omitted.
const MAX_PAGE: usize = 1000;
/// Turns loaded by one `fetchTurns`.
const TURNS_PAGE: usize = 20;

/// Methods a connection may call before `initialize`/`reconnect`.
pub fn allowed_before_initialize(method: &str) -> bool {
    matches!(method, "ping" | "initialize" | "reconnect")
}

/// Answers one request. `Ok` holds the serialized result.
pub fn handle_request(
    shared: &Arc<Shared>,
    core: &mut HostCore,
    conn: ConnId,
    method: &str,
    params: &Value,
) -> Result<String, RpcError> {
    if core.client_of(conn).is_none() && !allowed_before_initialize(method) {
        return Err(RpcError::invalid_request(format!(
            "{method} before initialize: send initialize or reconnect first"
        )));
    }
    if let Some(answer) = super::resources::handle(core, conn, method, params) {
        return answer;
    }
    match method {
        "ping" => Ok("null".into()),
        "initialize" => initialize(core, conn, params),
        "reconnect" => reconnect(core, conn, params),
        "subscribe" => subscribe(core, conn, params),
        "createSession" => create_session(core, conn, params),
        "disposeSession" => dispose_session(core, params),
        "createChat" => create_chat(shared, core, params),
        "disposeChat" => dispose_chat(core, params),
        "moveChat" => move_chat(core, params),
        "listSessions" => list_sessions(core, params),
        "fetchTurns" => fetch_turns(core, params),
        "createTerminal" => create_terminal(core, conn, params),
        "disposeTerminal" => dispose_terminal(core, params),
        "completions" => completions(core, params),
        "authenticate" => super::auth::authenticate(shared, core, conn, params),
        other => Err(RpcError::method_not_found(other)),
    }
}

fn parse<T: DeserializeOwned>(params: &Value) -> Result<T, RpcError> {
    T::deserialize(params).map_err(|e| RpcError::invalid_params(format!("invalid params: {e}")))
}

fn to_json<T: Serialize>(v: &T) -> Result<String, RpcError> {
    serde_json::to_string(v).map_err(|e| RpcError {
        code: ahp_types::errors::json_rpc_error_codes::INTERNAL_ERROR,
        message: format!("cannot serialize result: {e}"),
        data: None,
    })
}

fn not_found_for(uri: &str) -> RpcError {
    match ChannelKind::of(uri) {
        ChannelKind::Session => RpcError::session_not_found(uri),
        _ => RpcError::not_found(format!("channel not found: {uri}")),
    }
}

/// `<scheme>:/<id>` with a non-empty id of safe characters.
fn well_formed(uri: &str, scheme: &str) -> bool {
    uri.strip_prefix(scheme).is_some_and(naming::safe_id)
}

/// Gives `client_id` to `conn`; without VS Code mode an older connection of
/// the same client is closed (4009) so one client has one live connection.
fn claim_client_id(core: &mut HostCore, conn: ConnId, client_id: &str) {
    if !core.cfg.vscode_compat {
        for other in core.conns_of(client_id) {
            if other != conn {
                core.close(
                    other,
                    4009,
                    "superseded by a newer connection of this clientId",
                );
                if let Some(e) = core.conn_mut(other) {
                    e.client_id = None;
                    e.subs.clear();
                }
            }
        }
    }
    if let Some(e) = core.conn_mut(conn) {
        e.client_id = Some(client_id.to_string());
    }
    super::client_tools::client_back(core, client_id);
}

fn snapshots_for(core: &mut HostCore, conn: ConnId, channels: &[String]) -> Vec<Snapshot> {
    let mut out = Vec::new();
    for ch in channels {
        if let Some(s) = core.state.snapshot(ch, core.seq, None) {
            core.subscribe(conn, ch);
            out.push(s);
        }
    }
    out
}

/// The highest offered version in the host's line; a malformed entry is
/// -32602 even beside good ones (the SDK's reading of SemVer), an offer with
/// none in the line -32005.
fn negotiate(line: super::HostProtocol, offered: &[String]) -> Result<String, RpcError> {
    negotiate_protocol_version(offered).map_err(RpcError::invalid_params)?;
    let parse = |v: &str| -> Option<(u64, u64, u64)> {
        let mut it = v.split('.').map(|p| p.parse::<u64>().ok());
        Some((it.next()??, it.next()??, it.next()??))
    };
    offered
        .iter()
        .filter_map(|v| Some((parse(v)?, v)))
        .filter(|((major, minor, _), _)| line.speaks(*major, *minor))
        .max_by_key(|(parsed, _)| *parsed)
        .map(|(_, v)| v.clone())
        .ok_or_else(|| RpcError::unsupported_version(&[line.supported()]))
}

fn initialize(core: &mut HostCore, conn: ConnId, params: &Value) -> Result<String, RpcError> {
    let p: InitializeParams = parse(params)?;
    if core.client_of(conn).is_some() {
        return Err(RpcError::invalid_request(
            "connection is already initialized",
        ));
    }
    let version = negotiate(core.cfg.protocol, &p.protocol_versions)?;
    if p.client_id.is_empty() {
        return Err(RpcError::invalid_params("clientId must not be empty"));
    }
    claim_client_id(core, conn, &p.client_id);
    core.clients.insert(p.client_id.clone(), Default::default());
    let snapshots = snapshots_for(core, conn, &p.initial_subscriptions.unwrap_or_default());
    let result = InitializeResult {
        protocol_version: version,
        server_seq: i64::try_from(core.seq).unwrap_or(i64::MAX),
        server_info: typed(
            json!({"name": "ahp-relay-simhost", "version": env!("CARGO_PKG_VERSION"), "title": core.cfg.name}),
        ),
        meta: None,
        snapshots,
        default_directory: None,
        completion_trigger_characters: Some(vec!["@".into()]),
        terminal_command_prefix: Some("!".into()),
        telemetry: None,
        automations: None,
    };
    to_json(&result)
}

fn reconnect(core: &mut HostCore, conn: ConnId, params: &Value) -> Result<String, RpcError> {
    let p: ReconnectParams = parse(params)?;
    if core.client_of(conn).is_some() {
        return Err(RpcError::invalid_request(
            "connection is already initialized",
        ));
    }
    if !core.clients.contains_key(&p.client_id) {
        return Err(RpcError::not_found(format!(
            "unknown clientId: {}",
            p.client_id
        )));
    }
    let decision = core.replay_decision(&p.client_id, p.last_seen_server_seq, &p.subscriptions);
    claim_client_id(core, conn, &p.client_id);
    match decision {
        ReplayDecision::Replay { actions, missing } => {
            let live: Vec<&String> = p
                .subscriptions
                .iter()
                .filter(|c| core.state.has_channel(c))
                .collect();
            for ch in live {
                core.subscribe(conn, ch);
            }
            let missing = serde_json::to_string(&missing).unwrap_or_else(|_| "[]".into());
            Ok(format!(
                r#"{{"type":"replay","actions":[{}],"missing":{missing}}}"#,
                actions.join(",")
            ))
        }
        ReplayDecision::Snapshot => {
            if let Some(record) = core.clients.get_mut(&p.client_id) {
                record.baselined.clear();
            }
            let snapshots = snapshots_for(core, conn, &p.subscriptions);
            to_json(&json!({"type": "snapshot", "snapshots": snapshots}))
        }
    }
}

fn subscribe(core: &mut HostCore, conn: ConnId, params: &Value) -> Result<String, RpcError> {
    let p: SubscribeParams = parse(params)?;
    let turns = p
        .view
        .and_then(|v| v.turns)
        .and_then(|t| usize::try_from(t).ok());
    let snapshot = core
        .state
        .snapshot(&p.channel, core.seq, turns)
        .ok_or_else(|| not_found_for(&p.channel))?;
    core.subscribe(conn, &p.channel);
    to_json(&json!({ "snapshot": snapshot }))
}

fn create_session(core: &mut HostCore, conn: ConnId, params: &Value) -> Result<String, RpcError> {
    let p: CreateSessionParams = parse(params)?;
    if !naming::creatable_session(&core.cfg, &p.channel) {
        return Err(RpcError::invalid_params(
            "channel must be ahp-session:/<id> or <provider>:/<id> with id in [A-Za-z0-9._-]{1,128}",
        ));
    }
    if core.state.sessions.contains_key(&p.channel) {
        return Err(RpcError::session_exists(&p.channel));
    }
    if let Some(provider) = p.provider.as_deref().filter(|pr| *pr != core.cfg.provider) {
        return Err(RpcError::provider_not_found(provider));
    }
    let me = core.client_of(conn).unwrap_or_default();
    if p.active_client.as_ref().is_some_and(|a| a.client_id != me) {
        return Err(RpcError::invalid_params(
            "activeClient.clientId must be the calling client",
        ));
    }
    let cfg = core.cfg.clone();
    let at = super::clock::now_iso();
    let chat = core
        .state
        .insert_session(&cfg, &p.channel, "New session", &at, false);
    if let Some(s) = core.state.sessions.get_mut(&p.channel) {
        s.state.working_directories = p.working_directories.clone();
    }
    let _ = chat;
    if let Some(ready) = typed_action(json!({"type": "session/ready"})) {
        core.emit(&p.channel, ready);
    }
    if let Some(active) = p.active_client
        && let Some(a) =
            typed_action(json!({"type": "session/activeClientSet", "activeClient": active}))
    {
        core.emit(&p.channel, a);
    }
    emit_active_sessions(core);
    if let Some(summary) = core.state.summary(&p.channel) {
        core.notify_root(
            "root/sessionAdded",
            &json!({"channel": ahp_types::ROOT_RESOURCE_URI, "summary": summary}),
        );
    }
    if let Some(token) = p.progress_token {
        core.notify_conn(
            conn,
            "root/progress",
            &json!({"channel": ahp_types::ROOT_RESOURCE_URI, "progressToken": token,
                    "progress": 1, "total": 1, "message": "session ready"}),
        );
    }
    Ok("null".into())
}

fn emit_active_sessions(core: &mut HostCore) {
    let n = core.state.sessions.len();
    if let Some(a) =
        typed_action(json!({"type": "root/activeSessionsChanged", "activeSessions": n}))
    {
        core.emit(ahp_types::ROOT_RESOURCE_URI, a);
    }
}

fn forget_channels(core: &mut HostCore, channels: &[String]) {
    for c in core.conns.values_mut() {
        for ch in channels {
            c.subs.remove(ch);
        }
    }
    for ch in channels {
        core.wakers.remove(ch);
    }
}

fn channel_param(params: &Value) -> Result<String, RpcError> {
    params
        .get("channel")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| RpcError::invalid_params("params.channel is required"))
}

fn dispose_session(core: &mut HostCore, params: &Value) -> Result<String, RpcError> {
    let uri = channel_param(params)?;
    let entry = core
        .state
        .sessions
        .remove(&uri)
        .ok_or_else(|| RpcError::session_not_found(&uri))?;
    let mut gone: Vec<String> = entry
        .state
        .chats
        .iter()
        .map(|c| c.resource.clone())
        .collect();
    for chat in &gone {
        core.state.chats.remove(chat);
    }
    gone.push(uri.clone());
    forget_channels(core, &gone);
    core.notify_root(
        "root/sessionRemoved",
        &json!({"channel": ahp_types::ROOT_RESOURCE_URI, "session": uri}),
    );
    emit_active_sessions(core);
    Ok("null".into())
}

fn create_chat(
    shared: &Arc<Shared>,
    core: &mut HostCore,
    params: &Value,
) -> Result<String, RpcError> {
    let p: CreateChatParams = parse(params)?;
    if !core.state.sessions.contains_key(&p.channel) {
        return Err(RpcError::session_not_found(&p.channel));
    }
    if !naming::creatable_chat(&core.cfg, &p.channel, &p.chat) {
        return Err(RpcError::invalid_params(
            "chat must be ahp-chat:/<id> (or ahp-chat://<chatId>/<b64url(session)> in VS Code mode) with id in [A-Za-z0-9._-]{1,128}",
        ));
    }
    if core.state.chats.contains_key(&p.chat) {
        return Err(RpcError::already_exists(&p.chat));
    }
    if p.source.is_some() {
        return Err(RpcError::invalid_params(
            "this agent supports neither forks nor side chats (capabilities.multipleChats)",
        ));
    }
    if p.working_directories.is_some() {
        return Err(RpcError::invalid_params(
            "this agent does not advertise multipleWorkingDirectories",
        ));
    }
    let chat = typed::<ahp_types::state::ChatState>(json!({
        "resource": p.chat, "title": "Chat", "status": ahp_types::state::SessionStatus::Idle.bits(),
        "modifiedAt": super::clock::now_iso(), "turns": []
    }))
    .ok_or_else(|| RpcError::invalid_params("cannot build chat state"))?;
    let summary = chat_summary(&chat);
    core.state.chats.insert(
        p.chat.clone(),
        super::state::ChatEntry {
            state: chat,
            session: p.channel.clone(),
        },
    );
    if let Some(a) = typed_action(json!({"type": "session/chatAdded", "summary": summary})) {
        core.emit(&p.channel, a);
    }
    core.notify_summary_changed(&p.channel);
    if let Some(message) = p.initial_message {
        let turn_id = core.fresh_id("turn");
        if let Some(a) = typed_action(json!({"type": "chat/turnStarted", "turnId": turn_id,
            "startedAt": super::clock::now_iso(), "message": message}))
        {
            core.emit(&p.chat, a);
            agent::start_turn(shared, core, &p.chat, &turn_id);
        }
    }
    Ok("null".into())
}

fn dispose_chat(core: &mut HostCore, params: &Value) -> Result<String, RpcError> {
    let uri = channel_param(params)?;
    let session = core
        .state
        .chats
        .get(&uri)
        .map(|c| c.session.clone())
        .ok_or_else(|| not_found_for(&uri))?;
    if let Some(a) = typed_action(json!({"type": "session/chatRemoved", "chat": uri})) {
        core.emit(&session, a);
    }
    core.state.chats.remove(&uri);
    forget_channels(core, std::slice::from_ref(&uri));
    core.notify_summary_changed(&session);
    Ok("null".into())
}

/// `moveChat` into an existing session of this host (`destination.kind =
/// "session"`; `after` is not honoured): the chat leaves its session
/// (`session/chatRemoved` there), joins the destination
/// (`session/chatAdded`), and both summaries change. A move into a new
/// session, or in VS Code mode (its chat URIs encode their session), is
/// -32602.
fn move_chat(core: &mut HostCore, params: &Value) -> Result<String, RpcError> {
    let p: MoveChatParams = parse(params)?;
    let from = core
        .state
        .chats
        .get(&p.channel)
        .map(|c| c.session.clone())
        .ok_or_else(|| not_found_for(&p.channel))?;
    let to = match &p.destination {
        ChatMoveDestination::Session(d) if !core.cfg.vscode_compat => d.session.clone(),
        _ => {
            return Err(RpcError::invalid_params(
                "this host moves chats only into an existing session",
            ));
        }
    };
    if !core.state.sessions.contains_key(&to) {
        return Err(RpcError::session_not_found(&to));
    }
    if to != from {
        if let Some(a) = typed_action(json!({"type": "session/chatRemoved", "chat": p.channel})) {
            core.emit(&from, a);
        }
        let summary = core.state.chats.get_mut(&p.channel).map(|c| {
            c.session = to.clone();
            chat_summary(&c.state)
        });
        if let Some(a) = typed_action(json!({"type": "session/chatAdded", "summary": summary})) {
            core.emit(&to, a);
        }
        core.notify_summary_changed(&from);
        core.notify_summary_changed(&to);
    }
    Ok(json!({ "session": to }).to_string())
}

/// Hands terminal `uri` to `claim` as the host itself may (an agent taking
/// a terminal over for a session): `terminal/claimed` on the terminal,
/// then `root/terminalsChanged`. `false` if there is no such terminal or
/// the claim is malformed.
pub fn host_claims_terminal(core: &mut HostCore, uri: &str, claim: &Value) -> bool {
    if !core.state.terminals.contains_key(uri) {
        return false;
    }
    let Some(a) = typed_action(json!({"type": "terminal/claimed", "claim": claim})) else {
        return false;
    };
    core.emit(uri, a);
    emit_terminals(core);
    true
}

/// `listSessions` cursor: the sort key of the last item returned, hex-encoded.
fn encode_cursor(modified_at: &str, resource: &str) -> String {
    let raw = format!("{modified_at}\n{resource}");
    let hex: String = raw.bytes().map(|b| format!("{b:02x}")).collect();
    format!("ls1.{hex}")
}

fn decode_cursor(cursor: &str) -> Option<(String, String)> {
    let hex = cursor.strip_prefix("ls1.")?;
    if hex.len() % 2 != 0 {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| {
            hex.get(i..i + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        })
        .collect();
    let raw = String::from_utf8(bytes?).ok()?;
    let (m, r) = raw.split_once('\n')?;
    Some((m.to_string(), r.to_string()))
}

fn list_sessions(core: &mut HostCore, params: &Value) -> Result<String, RpcError> {
    let p: ListSessionsParams = parse(params)?;
    let limit = match p.limit {
        None => MAX_PAGE,
        Some(l) if l >= 1 => usize::try_from(l).unwrap_or(MAX_PAGE).min(MAX_PAGE),
        Some(_) => return Err(RpcError::invalid_params("limit must be at least 1")),
    };
    let after = match p.cursor.as_deref() {
        None => None,
        Some(c) => {
            Some(decode_cursor(c).ok_or_else(|| RpcError::invalid_params("unknown cursor"))?)
        }
    };
    let all = core.state.summaries_newest_first();
    let start = match &after {
        None => 0,
        Some((m, r)) => all
            .iter()
            .position(|s| {
                s.modified_at.as_str() < m.as_str() || (s.modified_at == *m && s.resource > *r)
            })
            .unwrap_or(all.len()),
    };
    let page: Vec<_> = all.iter().skip(start).take(limit).collect();
    let next = (start + page.len() < all.len())
        .then(|| {
            page.last()
                .map(|s| encode_cursor(&s.modified_at, &s.resource))
        })
        .flatten();
    let mut result = json!({ "items": page });
    if let (Some(next), Some(obj)) = (next, result.as_object_mut()) {
        obj.insert("nextCursor".into(), json!(next));
    }
    to_json(&result)
}

fn fetch_turns(core: &mut HostCore, params: &Value) -> Result<String, RpcError> {
    let p: FetchTurnsParams = parse(params)?;
    let chat = core
        .state
        .chats
        .get(&p.channel)
        .map(|c| c.state.turns.clone())
        .ok_or_else(|| not_found_for(&p.channel))?;
    let Some(cursor) = p.cursor else {
        return Ok("{}".into());
    };
    let hidden = parse_turns_cursor(&cursor)
        .filter(|h| *h <= chat.len())
        .ok_or_else(|| RpcError::invalid_params("unknown turns cursor"))?;
    let from = hidden.saturating_sub(TURNS_PAGE);
    let turns = chat.get(from..hidden).unwrap_or_default();
    let mut loaded = json!({"type": "chat/turnsLoaded", "turns": turns});
    if let (true, Some(obj)) = (from > 0, loaded.as_object_mut()) {
        obj.insert("turnsNextCursor".into(), json!(turns_cursor(from)));
    }
    if let Some(a) = typed_action(loaded) {
        core.emit_unreduced(&p.channel, a);
    }
    Ok("{}".into())
}

fn create_terminal(core: &mut HostCore, conn: ConnId, params: &Value) -> Result<String, RpcError> {
    let p: CreateTerminalParams = parse(params)?;
    let vscode = core.cfg.vscode_compat && well_formed(&p.channel, "agenthost-terminal:/");
    if !well_formed(&p.channel, "ahp-terminal:/") && !vscode {
        return Err(RpcError::invalid_params(
            "channel must be ahp-terminal:/<id> (in VS Code mode also agenthost-terminal:/<id>) \
             with id in [A-Za-z0-9._-]{1,128}",
        ));
    }
    if core.state.terminals.contains_key(&p.channel) {
        return Err(RpcError::already_exists(&p.channel));
    }
    match &p.claim {
        TerminalClaim::Client(c) if Some(&c.client_id) != core.client_of(conn).as_ref() => {
            return Err(RpcError::invalid_params(
                "a client claim must name the calling client",
            ));
        }
        TerminalClaim::Session(s) => {
            if !core.state.sessions.contains_key(&s.session) {
                return Err(RpcError::session_not_found(&s.session));
            }
            if core
                .state
                .chats
                .get(&s.chat)
                .is_none_or(|c| c.session != s.session)
            {
                return Err(RpcError::not_found(format!(
                    "chat not found in session: {}",
                    s.chat
                )));
            }
        }
        TerminalClaim::Client(_) => {}
    }
    let terminal = typed::<TerminalState>(json!({
        "title": p.name.unwrap_or_else(|| "Terminal".into()), "cwd": p.cwd,
        "cols": p.cols, "rows": p.rows, "content": [],
        "lifecycle": {"status": "running"}, "claim": p.claim
    }))
    .ok_or_else(|| RpcError::invalid_params("cannot build terminal state"))?;
    core.state.terminals.insert(p.channel.clone(), terminal);
    emit_terminals(core);
    Ok("null".into())
}

fn emit_terminals(core: &mut HostCore) {
    let list = core.state.terminal_infos();
    if let Some(a) = typed_action(json!({"type": "root/terminalsChanged", "terminals": list})) {
        core.emit(ahp_types::ROOT_RESOURCE_URI, a);
    }
}

fn dispose_terminal(core: &mut HostCore, params: &Value) -> Result<String, RpcError> {
    let uri = channel_param(params)?;
    core.state
        .terminals
        .remove(&uri)
        .ok_or_else(|| not_found_for(&uri))?;
    forget_channels(core, std::slice::from_ref(&uri));
    emit_terminals(core);
    Ok("null".into())
}

/// `completions` on a known chat: one item, a resource attachment naming
/// the host's sandbox folder (`file:` URI), so a client can accept it into
/// a message and the host can recognise its own file.
fn completions(core: &HostCore, params: &Value) -> Result<String, RpcError> {
    if !core.state.chats.contains_key(&channel_param(params)?) {
        return Err(RpcError::not_found("chat not found"));
    }
    let uri = super::files::file_uri(&core.files.root);
    let item = serde_json::json!({"insertText": "#sandbox", "attachment": {
        "type": "resource", "label": "sandbox", "uri": uri, "displayKind": "directory"}});
    Ok(serde_json::json!({"items": [item]}).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_round_trips_and_rejects_garbage() {
        let c = encode_cursor("2026-01-01T00:00:00.000Z", "ahp-session:/a");
        assert_eq!(
            decode_cursor(&c),
            Some(("2026-01-01T00:00:00.000Z".into(), "ahp-session:/a".into()))
        );
        assert_eq!(decode_cursor("ls1.zz"), None);
        assert_eq!(decode_cursor("nope"), None);
    }

    #[test]
    fn well_formed_uris() {
        assert!(well_formed("ahp-session:/abc-1.x_y", "ahp-session:/"));
        assert!(!well_formed("ahp-session:/", "ahp-session:/"));
        assert!(!well_formed("ahp-session:/a/b", "ahp-session:/"));
        assert!(!well_formed("ahp-chat:/a", "ahp-session:/"));
    }
}

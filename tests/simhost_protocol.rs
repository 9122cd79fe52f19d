//! Protocol conformance of the simulated host: version negotiation, the
//! connection lifecycle, bad input, `listSessions` paging, subscribe and
//! create errors, the `dispatchAction` validation table and the frame record.

mod common;

use ahp::ClientError;
use ahp_relay::simhost::{AgentScript, SimHost, SimHostConfig};
use ahp_types::actions::StateAction;
use ahp_types::commands::CreateChatParams;
use common::*;
use serde_json::{Value, json};

const ROOT: &str = "ahp-root://";

// ─── Helpers ────────────────────────────────────────────────────────────────

/// A fast host with one session `ahp-session:/<name>-1` and chat `…-1-main`.
async fn one_session_host(name: &str) -> SimHost {
    start_host(fast_config(name, 1)).await
}

/// A host whose agent parks every turn on a tool call awaiting confirmation
/// (no deltas), so an active turn stays put for as long as a test needs.
async fn parking_host(name: &str) -> SimHost {
    let mut cfg = fast_config(name, 1);
    cfg.script = AgentScript {
        reply_deltas: 0,
        tool_confirmation: true,
        ..cfg.script
    };
    start_host(cfg).await
}

fn session_of(host: &SimHost) -> String {
    format!("ahp-session:/{}-1", host.config().session_prefix)
}

fn chat_of(host: &SimHost) -> String {
    format!("ahp-chat:/{}-1-main", host.config().session_prefix)
}

/// A raw socket initialized as `client_id` and subscribed to `channels`.
async fn raw_init(host: &SimHost, client_id: &str, channels: &[&str]) -> RawWs {
    let mut ws = RawWs::connect(&host.url()).await;
    let resp = ws
        .request(
            0,
            "initialize",
            json!({"channel": ROOT, "protocolVersions": ["1.0.0"], "clientId": client_id,
                   "initialSubscriptions": channels}),
        )
        .await;
    assert_eq!(resp["result"]["protocolVersion"], "1.0.0", "{resp}");
    ws
}

/// The error code of a JSON-RPC response (panics on a success).
fn code(resp: &Value) -> i64 {
    resp["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("expected an error response, got {resp}"))
}

/// The JSON-RPC error of an SDK call that must fail with one.
fn rpc_error<T: std::fmt::Debug>(r: Result<T, ClientError>) -> Value {
    match r {
        Err(ClientError::Rpc(e)) => serde_json::to_value(e).expect("error serializes"),
        other => panic!("expected an rpc error, got {other:?}"),
    }
}

/// `initialize` through the official client offering `versions`.
async fn offer(host: &SimHost, client_id: &str, versions: &[&str]) -> Result<String, Value> {
    let client = connect(&host.url()).await;
    let versions = versions.iter().map(|v| v.to_string()).collect();
    match client.initialize(client_id.into(), versions, vec![]).await {
        Ok(r) => Ok(r.protocol_version),
        r => Err(rpc_error(r)),
    }
}

/// Asserts `ws` still answers `ping` (the socket is open and served).
async fn assert_alive(ws: &mut RawWs, id: u64) {
    let resp = ws.request(id, "ping", json!({"channel": ROOT})).await;
    assert_eq!(resp, json!({"jsonrpc": "2.0", "id": id, "result": null}));
}

/// Reads frames until the response to `id`; returns (frames before, response).
async fn frames_until_response(ws: &mut RawWs, id: &Value) -> (Vec<Value>, Value) {
    let mut before = Vec::new();
    loop {
        let f = ws
            .recv_json()
            .await
            .expect("socket open until the response");
        if f.get("id") == Some(id) {
            return (before, f);
        }
        before.push(f);
    }
}

/// Next `action` envelope (its params) for which `pred` holds.
async fn next_envelope(ws: &mut RawWs, mut pred: impl FnMut(&Value) -> bool) -> Value {
    loop {
        let f = ws.recv_json().await.expect("socket open");
        if f["method"] == "action" && pred(&f["params"]) {
            return f["params"].clone();
        }
    }
}

/// Panics unless `action` parses as a known `StateAction`, so a rejection
/// cannot come from the action being malformed.
fn known(action: Value) -> Value {
    let parsed: StateAction = serde_json::from_value(action.clone())
        .unwrap_or_else(|e| panic!("test action does not parse: {e}: {action}"));
    assert!(
        !matches!(parsed, StateAction::Unknown(_)),
        "test action is of unknown type: {action}"
    );
    action
}

/// Dispatches `action` and returns the envelope echoing it.
async fn dispatch(ws: &mut RawWs, channel: &str, seq: i64, action: &Value) -> Value {
    ws.send_json(&json!({"jsonrpc": "2.0", "method": "dispatchAction",
        "params": {"channel": channel, "clientSeq": seq, "action": action}}))
        .await;
    next_envelope(ws, |e| e["origin"]["clientSeq"] == seq).await
}

/// Dispatches `action` and asserts it is accepted (echo without a reason).
async fn accepted(ws: &mut RawWs, client: &str, channel: &str, seq: i64, action: Value) -> Value {
    let env = dispatch(ws, channel, seq, &known(action)).await;
    assert!(env.get("rejectionReason").is_none(), "rejected: {env}");
    assert_eq!(env["origin"], json!({"clientId": client, "clientSeq": seq}));
    env
}

/// Dispatches `action` and asserts the echo is a rejection for this client's
/// dispatch, numbered next, and that the channel's host state is unchanged.
async fn rejected(
    host: &SimHost,
    ws: &mut RawWs,
    client: &str,
    channel: &str,
    seq: i64,
    action: Value,
) -> Value {
    let action = known(action);
    let before = host.channel_state(channel).expect("channel exists");
    let seq_before = host.server_seq();
    let env = dispatch(ws, channel, seq, &action).await;
    assert!(
        env["rejectionReason"]
            .as_str()
            .is_some_and(|r| !r.is_empty()),
        "expected a rejection: {env}"
    );
    assert_eq!(env["origin"], json!({"clientId": client, "clientSeq": seq}));
    assert_eq!(env["channel"], channel);
    assert_eq!(env["action"], action);
    assert_eq!(env["serverSeq"], seq_before + 1);
    assert_eq!(host.server_seq(), seq_before + 1);
    assert_eq!(host.channel_state(channel), Some(before), "state changed");
    env
}

fn message(text: &str) -> Value {
    json!({"text": text, "origin": {"kind": "user"}})
}

fn turn_started(turn_id: &str) -> Value {
    json!({"type": "chat/turnStarted", "turnId": turn_id,
           "startedAt": "2026-01-01T00:00:00.000Z", "message": message("hello")})
}

/// Starts turn `turn_id` and waits until the agent reports `until` for it.
async fn run_turn_until(
    ws: &mut RawWs,
    client: &str,
    chat: &str,
    seq: i64,
    turn_id: &str,
    until: &str,
) {
    accepted(ws, client, chat, seq, turn_started(turn_id)).await;
    next_envelope(ws, |e| {
        e["action"]["type"] == until && e["action"]["turnId"] == turn_id
    })
    .await;
}

/// URIs of a `listSessions` page.
fn uris(page: &Value) -> Vec<String> {
    page["result"]["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|s| s["resource"].as_str().expect("resource").to_string())
        .collect()
}

// ─── 1. Version negotiation ────────────────────────────────────────────────

/// Offering exactly ["1.0.0"] negotiates "1.0.0".
#[tokio::test]
async fn initialize_accepts_1_0_0() {
    let host = one_session_host("ver").await;
    assert_eq!(offer(&host, "v1", &["1.0.0"]).await, Ok("1.0.0".into()));
}

/// The highest acceptable offer wins, whatever the order of the list.
#[tokio::test]
async fn initialize_picks_highest_offer_regardless_of_order() {
    let host = one_session_host("ver").await;
    for (i, (offered, want)) in [
        (&["0.9.0", "1.0.0"][..], "1.0.0"),
        (&["1.0.0", "0.9.0"][..], "1.0.0"),
        (&["1.0.0", "1.4.2"][..], "1.4.2"),
        (&["1.4.2", "1.0.0"][..], "1.4.2"),
    ]
    .into_iter()
    .enumerate()
    {
        let got = offer(&host, &format!("v{i}"), offered).await;
        assert_eq!(got, Ok(want.to_string()), "offer {offered:?}");
    }
}

/// A newer 1.x minor is compatible and echoed exactly.
#[tokio::test]
async fn initialize_echoes_newer_1x_version() {
    let host = one_session_host("ver").await;
    assert_eq!(offer(&host, "v1", &["1.4.2"]).await, Ok("1.4.2".into()));
}

/// ["2.0.0"] is refused with -32005 + data.supportedVersions, then the host closes.
#[tokio::test]
async fn initialize_rejects_2_0_0_and_closes() {
    let host = one_session_host("ver").await;
    let mut ws = RawWs::connect(&host.url()).await;
    let resp = ws
        .request(
            1,
            "initialize",
            json!({"channel": ROOT, "protocolVersions": ["2.0.0"], "clientId": "v2"}),
        )
        .await;
    assert_eq!(code(&resp), -32005);
    assert_eq!(
        resp["error"]["data"]["supportedVersions"],
        json!(["^1.0.0"])
    );
    let (close, _) = ws.close_code().await.expect("a close frame arrives");
    assert_eq!(close, 1002);
}

/// A 0.9-only client is refused with -32005 (0.9.x is not served).
#[tokio::test]
async fn initialize_rejects_0_9_0_only() {
    let host = one_session_host("ver").await;
    let err = offer(&host, "v09", &["0.9.0"]).await.unwrap_err();
    assert_eq!(err["code"], -32005);
    assert_eq!(err["data"]["supportedVersions"], json!(["^1.0.0"]));
}

/// One malformed entry fails the whole offer with -32602; the socket stays usable.
#[tokio::test]
async fn initialize_rejects_malformed_versions() {
    let host = one_session_host("ver").await;
    let mut ws = RawWs::connect(&host.url()).await;
    let bad: [&[&str]; 4] = [&["01.0.0"], &["1.0.0", "v1"], &["1.0"], &["1.0.0-rc1"]];
    for (i, versions) in bad.into_iter().enumerate() {
        let resp = ws
            .request(
                i as u64 + 1,
                "initialize",
                json!({"channel": ROOT, "protocolVersions": versions, "clientId": "vm"}),
            )
            .await;
        assert_eq!(code(&resp), -32602, "offer {versions:?}: {resp}");
    }
    assert_eq!(
        ws.initialize("vm").await["result"]["protocolVersion"],
        "1.0.0"
    );
}

/// An empty clientId is -32602.
#[tokio::test]
async fn initialize_rejects_empty_client_id() {
    let host = one_session_host("ver").await;
    let err = offer(&host, "", &["1.0.0"]).await.unwrap_err();
    assert_eq!(err["code"], -32602);
}

/// A second `initialize` on an initialized connection is -32600.
#[tokio::test]
async fn second_initialize_is_invalid_request() {
    let host = one_session_host("ver").await;
    let client = connect_init(&host.url(), "twice").await;
    let again = client
        .initialize("twice".into(), vec!["1.0.0".into()], vec![])
        .await;
    assert_eq!(rpc_error(again)["code"], -32600);
    client.ping().await.expect("connection still served");
}

// ─── 2. Before initialize ──────────────────────────────────────────────────

/// `ping` is answered with `result: null` before `initialize`.
#[tokio::test]
async fn ping_is_answered_before_initialize() {
    let host = one_session_host("pre").await;
    let mut ws = RawWs::connect(&host.url()).await;
    assert_alive(&mut ws, 5).await;
}

/// Any other request before `initialize` is -32600.
#[tokio::test]
async fn requests_before_initialize_are_invalid() {
    let host = one_session_host("pre").await;
    let mut ws = RawWs::connect(&host.url()).await;
    let list = ws
        .request(1, "listSessions", json!({"channel": ROOT}))
        .await;
    assert_eq!(code(&list), -32600);
    let sub = ws
        .request(2, "subscribe", json!({"channel": session_of(&host)}))
        .await;
    assert_eq!(code(&sub), -32600);
    assert_alive(&mut ws, 3).await;
}

/// `reconnect` for an unknown clientId is -32008 and the socket stays open.
#[tokio::test]
async fn reconnect_unknown_client_is_not_found_and_keeps_socket() {
    let host = one_session_host("pre").await;
    let mut ws = RawWs::connect(&host.url()).await;
    let resp = ws
        .request(
            1,
            "reconnect",
            json!({"channel": ROOT, "clientId": "ghost", "lastSeenServerSeq": 0, "subscriptions": []}),
        )
        .await;
    assert_eq!(code(&resp), -32008);
    assert_eq!(
        ws.initialize("ghost").await["result"]["protocolVersion"],
        "1.0.0"
    );
}

// ─── 3. Bad input ──────────────────────────────────────────────────────────

/// A host with a bystander client that must stay served throughout.
async fn host_with_bystander(cfg: SimHostConfig) -> (SimHost, RawWs) {
    let host = start_host(cfg).await;
    let bystander = raw_init(&host, "bystander", &[]).await;
    (host, bystander)
}

/// Invalid JSON is -32700 with `id: null`; the socket and others stay served.
#[tokio::test]
async fn invalid_json_is_parse_error_with_null_id() {
    let (host, mut other) = host_with_bystander(fast_config("bad", 1)).await;
    let mut ws = raw_init(&host, "bad", &[]).await;
    ws.send_text(r#"{"jsonrpc":"2.0","id":1,"method":"ping""#)
        .await;
    let resp = ws.recv_json().await.expect("an answer");
    assert_eq!(resp["id"], Value::Null);
    assert!(resp.as_object().is_some_and(|o| o.contains_key("id")));
    assert_eq!(code(&resp), -32700);
    assert_alive(&mut ws, 2).await;
    assert_alive(&mut other, 3).await;
}

/// A JSON array (batch) is -32600.
#[tokio::test]
async fn batch_is_invalid_request() {
    let (host, mut other) = host_with_bystander(fast_config("bad", 1)).await;
    let mut ws = raw_init(&host, "bad", &[]).await;
    ws.send_text(
        r#"[{"jsonrpc":"2.0","id":1,"method":"ping","params":{"channel":"ahp-root://"}}]"#,
    )
    .await;
    let resp = ws.recv_json().await.expect("an answer");
    assert_eq!(code(&resp), -32600);
    assert_eq!(resp["id"], Value::Null);
    assert_alive(&mut ws, 2).await;
    assert_alive(&mut other, 3).await;
}

/// `"jsonrpc":"1.0"` is -32600, answered under the request's id.
#[tokio::test]
async fn wrong_jsonrpc_version_is_invalid_request() {
    let (host, mut other) = host_with_bystander(fast_config("bad", 1)).await;
    let mut ws = raw_init(&host, "bad", &[]).await;
    ws.send_json(
        &json!({"jsonrpc": "1.0", "id": 7, "method": "ping", "params": {"channel": ROOT}}),
    )
    .await;
    let resp = ws.response(&json!(7)).await;
    assert_eq!(code(&resp), -32600);
    assert_alive(&mut ws, 8).await;
    assert_alive(&mut other, 9).await;
}

/// An unknown method is -32601.
#[tokio::test]
async fn unknown_method_is_method_not_found() {
    let (host, mut other) = host_with_bystander(fast_config("bad", 1)).await;
    let mut ws = raw_init(&host, "bad", &[]).await;
    let resp = ws.request(1, "frobnicate", json!({"channel": ROOT})).await;
    assert_eq!(code(&resp), -32601);
    assert_alive(&mut ws, 2).await;
    assert_alive(&mut other, 3).await;
}

/// A request without `params.channel` (or with a non-string one) is -32602.
#[tokio::test]
async fn request_without_channel_is_invalid_params() {
    let (host, mut other) = host_with_bystander(fast_config("bad", 1)).await;
    let mut ws = raw_init(&host, "bad", &[]).await;
    assert_eq!(
        code(&ws.request(1, "listSessions", json!({})).await),
        -32602
    );
    assert_eq!(
        code(&ws.request(2, "listSessions", json!({"channel": 5})).await),
        -32602
    );
    ws.send_json(&json!({"jsonrpc": "2.0", "id": 3, "method": "ping"}))
        .await;
    assert_eq!(code(&ws.response(&json!(3)).await), -32602);
    assert_alive(&mut ws, 4).await;
    assert_alive(&mut other, 5).await;
}

/// Issue 26: in VS Code mode, as VS Code's own host, `initialize`,
/// `reconnect` and `ping` need no `params.channel` (VS Code's client sends
/// `reconnect` without one); a request that routes by its channel still
/// needs one (-32602), and a plain host still requires it everywhere.
#[tokio::test]
async fn vscode_mode_takes_initialize_and_reconnect_without_channel() {
    let cfg = SimHostConfig {
        vscode_compat: true,
        ..fast_config("vnc", 1)
    };
    let host = start_host(cfg).await;
    let mut ws = RawWs::connect(&host.url()).await;
    let init = json!({"protocolVersions": ["1.0.0"], "clientId": "vnc",
        "initialSubscriptions": [ROOT]});
    let r = ws.request(1, "initialize", init.clone()).await;
    assert_eq!(r["result"]["protocolVersion"], "1.0.0", "{r}");
    let seq = r["result"]["serverSeq"].as_u64().expect("serverSeq");
    ws.send_json(&json!({"jsonrpc": "2.0", "id": 2, "method": "ping"}))
        .await;
    assert_eq!(ws.response(&json!(2)).await["result"], Value::Null);
    assert_eq!(
        code(&ws.request(3, "listSessions", json!({})).await),
        -32602
    );
    drop(ws);
    let mut ws = RawWs::connect(&host.url()).await;
    let again = json!({"clientId": "vnc", "lastSeenServerSeq": seq, "subscriptions": [ROOT]});
    let r = ws.request(4, "reconnect", again).await;
    assert_eq!(r["result"]["type"], "replay", "{r}");

    let plain = one_session_host("pnc").await;
    let mut ws = RawWs::connect(&plain.url()).await;
    assert_eq!(code(&ws.request(5, "initialize", init).await), -32602);
}

/// A string request id is answered with the same id, byte for byte.
#[tokio::test]
async fn string_id_is_echoed_verbatim() {
    let host = one_session_host("sid").await;
    let mut ws = raw_init(&host, "sid", &[]).await;
    let id = r#"req-ü-\"7\"-00042"#;
    ws.send_text(&format!(
        r#"{{"jsonrpc":"2.0","id":"{id}","method":"ping","params":{{"channel":"ahp-root://"}}}}"#
    ))
    .await;
    let text = ws.recv_text().await.expect("an answer");
    assert!(text.contains(&format!(r#""id":"{id}""#)), "{text}");
    let resp: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(resp["id"], "req-ü-\"7\"-00042");
    assert_eq!(resp["result"], Value::Null);
    // An error response keeps the string id too.
    ws.send_text(
        r#"{"jsonrpc":"2.0","id":"e-1","method":"nope","params":{"channel":"ahp-root://"}}"#,
    )
    .await;
    let text = ws.recv_text().await.expect("an answer");
    assert!(text.contains(r#""id":"e-1""#), "{text}");
}

/// A request whose id is neither string, number nor null is -32600 with `id: null`.
#[tokio::test]
async fn non_scalar_id_is_invalid_request() {
    let (host, mut other) = host_with_bystander(fast_config("bad", 1)).await;
    let mut ws = raw_init(&host, "bad", &[]).await;
    for bad_id in [json!({"a": 1}), json!([1]), json!(true)] {
        ws.send_json(&json!({"jsonrpc": "2.0", "id": bad_id, "method": "ping",
            "params": {"channel": ROOT}}))
            .await;
        let resp = ws.recv_json().await.expect("an answer");
        assert_eq!(resp["id"], Value::Null, "id {bad_id}: {resp}");
        assert_eq!(code(&resp), -32600, "id {bad_id}: {resp}");
    }
    assert_alive(&mut ws, 2).await;
    assert_alive(&mut other, 3).await;
}

/// A binary frame closes that connection with 1003; other clients are unaffected.
#[tokio::test]
async fn binary_frame_closes_with_1003() {
    let (host, mut other) = host_with_bystander(fast_config("bad", 1)).await;
    let mut ws = raw_init(&host, "bad", &[]).await;
    ws.send_binary(b"{\"jsonrpc\":\"2.0\"}".to_vec()).await;
    let (close, _) = ws.close_code().await.expect("a close frame arrives");
    assert_eq!(close, 1003);
    assert_alive(&mut other, 1).await;
    wait_until("the closed connection is detached", || {
        host.connections() == 1
    })
    .await;
}

/// A frame above `max_frame_bytes` closes with 1009; other clients are unaffected.
#[tokio::test]
async fn oversized_frame_closes_with_1009() {
    let cfg = SimHostConfig {
        max_frame_bytes: 1024,
        ..fast_config("big", 1)
    };
    let (host, mut other) = host_with_bystander(cfg).await;
    let mut ws = raw_init(&host, "big", &[]).await;
    let pad = "x".repeat(8 * 1024);
    ws.send_json(&json!({"jsonrpc": "2.0", "id": 1, "method": "ping",
        "params": {"channel": ROOT, "pad": pad}}))
        .await;
    let (close, _) = ws.close_code().await.expect("a close frame arrives");
    assert_eq!(close, 1009);
    assert_alive(&mut other, 1).await;
    wait_until("the closed connection is detached", || {
        host.connections() == 1
    })
    .await;
}

/// A frame far larger than the host's 8 KiB read size (reads are capped so
/// a read poll does not zero-fill 128 KiB) still arrives whole and is answered.
#[tokio::test]
async fn frame_larger_than_a_read_arrives_whole() {
    let host = start_host(fast_config("wide", 1)).await;
    let mut ws = raw_init(&host, "wide", &[]).await;
    let pad = "x".repeat(1024 * 1024);
    let resp = ws
        .request(1, "ping", json!({"channel": ROOT, "pad": pad}))
        .await;
    assert!(resp.get("result").is_some(), "{resp}");
}

// ─── 4. listSessions paging ────────────────────────────────────────────────

/// `limit: 1` visits all five sessions once, newest first; the last page has no cursor.
#[tokio::test]
async fn list_sessions_limit_1_pages_newest_first() {
    let host = start_host(fast_config("pg", 5)).await;
    let mut ws = raw_init(&host, "pager", &[]).await;
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for i in 1..=5u64 {
        let mut params = json!({"channel": ROOT, "limit": 1});
        if let Some(c) = &cursor {
            params["cursor"] = json!(c);
        }
        let page = ws.request(i, "listSessions", params).await;
        let items = uris(&page);
        assert_eq!(items.len(), 1, "{page}");
        seen.extend(items);
        cursor = page["result"]["nextCursor"].as_str().map(str::to_string);
        assert_eq!(cursor.is_some(), i < 5, "page {i}: {page}");
    }
    let want: Vec<String> = (1..=5)
        .rev()
        .map(|n| format!("ahp-session:/pg-{n}"))
        .collect();
    assert_eq!(seen, want);
}

/// `limit: 2` gives pages of 2, 2 and 1.
#[tokio::test]
async fn list_sessions_limit_2_pages_2_2_1() {
    let host = start_host(fast_config("pg", 5)).await;
    let mut ws = raw_init(&host, "pager", &[]).await;
    let p1 = ws
        .request(1, "listSessions", json!({"channel": ROOT, "limit": 2}))
        .await;
    let c1 = p1["result"]["nextCursor"].as_str().expect("cursor 1");
    let p2 = ws
        .request(
            2,
            "listSessions",
            json!({"channel": ROOT, "limit": 2, "cursor": c1}),
        )
        .await;
    let c2 = p2["result"]["nextCursor"].as_str().expect("cursor 2");
    let p3 = ws
        .request(
            3,
            "listSessions",
            json!({"channel": ROOT, "limit": 2, "cursor": c2}),
        )
        .await;
    assert_eq!(uris(&p1), ["ahp-session:/pg-5", "ahp-session:/pg-4"]);
    assert_eq!(uris(&p2), ["ahp-session:/pg-3", "ahp-session:/pg-2"]);
    assert_eq!(uris(&p3), ["ahp-session:/pg-1"]);
    assert!(p3["result"].get("nextCursor").is_none(), "{p3}");
}

/// An unknown cursor and `limit: 0` are -32602.
#[tokio::test]
async fn list_sessions_rejects_unknown_cursor_and_zero_limit() {
    let host = start_host(fast_config("pg", 5)).await;
    let mut ws = raw_init(&host, "pager", &[]).await;
    for (i, cursor) in ["bogus", "ls1.zz", "ls1.41"].into_iter().enumerate() {
        let resp = ws
            .request(
                i as u64 + 1,
                "listSessions",
                json!({"channel": ROOT, "cursor": cursor}),
            )
            .await;
        assert_eq!(code(&resp), -32602, "cursor {cursor}");
    }
    let zero = ws
        .request(9, "listSessions", json!({"channel": ROOT, "limit": 0}))
        .await;
    assert_eq!(code(&zero), -32602);
}

/// A newly created session is listed first (most recently modified).
#[tokio::test]
async fn created_session_is_listed_first() {
    let host = start_host(fast_config("pg", 5)).await;
    let mut ws = raw_init(&host, "pager", &[]).await;
    let created = ws
        .request(1, "createSession", json!({"channel": "ahp-session:/fresh"}))
        .await;
    assert_eq!(created["result"], Value::Null, "{created}");
    let list = ws
        .request(2, "listSessions", json!({"channel": ROOT}))
        .await;
    let got = uris(&list);
    assert_eq!(got.len(), 6);
    assert_eq!(got[0], "ahp-session:/fresh");
    assert_eq!(got[1], "ahp-session:/pg-5");
}

// ─── 5. Subscribe ──────────────────────────────────────────────────────────

/// Subscribing to an unknown session is -32001.
#[tokio::test]
async fn subscribe_unknown_session_is_session_not_found() {
    let host = one_session_host("sub").await;
    let client = connect_init(&host.url(), "sub").await;
    let r = client.request::<_, Value>("subscribe", json!({"channel": "ahp-session:/x"}));
    assert_eq!(rpc_error(r.await)["code"], -32001);
}

/// Subscribing to an unknown chat is -32008.
#[tokio::test]
async fn subscribe_unknown_chat_is_not_found() {
    let host = one_session_host("sub").await;
    let client = connect_init(&host.url(), "sub").await;
    let r = client.request::<_, Value>("subscribe", json!({"channel": "ahp-chat:/x"}));
    assert_eq!(rpc_error(r.await)["code"], -32008);
}

/// The root snapshot lists the host's one agent with the configured provider.
#[tokio::test]
async fn root_snapshot_lists_configured_agent() {
    let cfg = SimHostConfig {
        provider: "prov-x".into(),
        ..fast_config("sub", 2)
    };
    let host = start_host(cfg).await;
    let client = connect_init(&host.url(), "sub").await;
    let snap = subscribe_raw(&client, ROOT).await;
    assert_eq!(snap["resource"], ROOT);
    let agents = snap["state"]["agents"].as_array().expect("agents");
    assert_eq!(agents.len(), 1, "{snap}");
    assert_eq!(agents[0]["provider"], "prov-x");
    assert_eq!(snap["state"]["activeSessions"], 2);
}

// ─── 6. createSession / createChat ─────────────────────────────────────────

/// A client-chosen session URI is listed, and creating it again is -32003.
#[tokio::test]
async fn create_session_is_listed_and_not_duplicable() {
    let host = one_session_host("cs").await;
    let mut ws = raw_init(&host, "creator", &[]).await;
    let params = json!({"channel": "ahp-session:/mine", "provider": "sim"});
    assert_eq!(
        ws.request(1, "createSession", params.clone()).await["result"],
        Value::Null
    );
    let list = ws
        .request(2, "listSessions", json!({"channel": ROOT}))
        .await;
    assert!(
        uris(&list).contains(&"ahp-session:/mine".to_string()),
        "{list}"
    );
    assert_eq!(code(&ws.request(3, "createSession", params).await), -32003);
    let seeded = json!({"channel": session_of(&host)});
    assert_eq!(code(&ws.request(4, "createSession", seeded).await), -32003);
}

/// Malformed session URIs are -32602 and create nothing.
#[tokio::test]
async fn create_session_rejects_malformed_uris() {
    let host = one_session_host("cs").await;
    let mut ws = raw_init(&host, "creator", &[]).await;
    for (i, uri) in ["ahp-session:/a/b", "ahp-chat:/x", "ahp-session:/"]
        .into_iter()
        .enumerate()
    {
        let resp = ws
            .request(i as u64 + 1, "createSession", json!({"channel": uri}))
            .await;
        assert_eq!(code(&resp), -32602, "uri {uri}");
    }
    assert_eq!(host.session_uris(), [session_of(&host)]);
}

/// An unknown provider is -32002.
#[tokio::test]
async fn create_session_rejects_unknown_provider() {
    let host = one_session_host("cs").await;
    let mut ws = raw_init(&host, "creator", &[]).await;
    let resp = ws
        .request(
            1,
            "createSession",
            json!({"channel": "ahp-session:/p", "provider": "nope"}),
        )
        .await;
    assert_eq!(code(&resp), -32002);
    assert_eq!(host.channel_state("ahp-session:/p"), None);
}

/// `root/progress` with the token reaches the creating connection only.
#[tokio::test]
async fn create_session_progress_reaches_only_the_creator() {
    let host = one_session_host("cs").await;
    let mut creator = raw_init(&host, "creator", &[]).await;
    let mut other = raw_init(&host, "other", &[ROOT]).await;
    creator
        .send_json(
            &json!({"jsonrpc": "2.0", "id": 1, "method": "createSession",
            "params": {"channel": "ahp-session:/prog", "progressToken": "tok-1"}}),
        )
        .await;
    let (before, resp) = frames_until_response(&mut creator, &json!(1)).await;
    assert_eq!(resp["result"], Value::Null, "{resp}");
    let progress: Vec<&Value> = before
        .iter()
        .filter(|f| f["method"] == "root/progress")
        .collect();
    assert_eq!(progress.len(), 1, "{before:?}");
    assert_eq!(progress[0]["params"]["progressToken"], "tok-1");
    assert_eq!(progress[0]["params"]["channel"], ROOT);

    other
        .send_json(
            &json!({"jsonrpc": "2.0", "id": 2, "method": "ping", "params": {"channel": ROOT}}),
        )
        .await;
    let (seen, _) = frames_until_response(&mut other, &json!(2)).await;
    assert!(
        seen.iter().any(|f| f["method"] == "root/sessionAdded"),
        "the other connection receives root notifications: {seen:?}"
    );
    assert!(
        !seen.iter().any(|f| f["method"] == "root/progress"),
        "{seen:?}"
    );
}

/// `createSession` never replaces an existing chat with its default chat.
#[tokio::test]
async fn create_session_does_not_clobber_an_existing_chat() {
    let host = one_session_host("cs").await;
    let mut ws = raw_init(&host, "creator", &[]).await;
    let taken = "ahp-chat:/fresh-main";
    let chat = json!({"channel": session_of(&host), "chat": taken});
    assert_eq!(
        ws.request(1, "createChat", chat).await["result"],
        Value::Null
    );
    let before = host.channel_state(taken).expect("chat created");
    assert_eq!(before["title"], "Chat");
    let created = ws
        .request(2, "createSession", json!({"channel": "ahp-session:/fresh"}))
        .await;
    assert_eq!(
        host.channel_state(taken),
        Some(before),
        "createSession: {created}"
    );
    if let Some(fresh) = host.channel_state("ahp-session:/fresh") {
        assert_ne!(fresh["defaultChat"], taken, "{fresh}");
    }
    let owner = host.channel_state(&session_of(&host)).expect("session");
    let listed = owner["chats"].as_array().expect("chats");
    assert!(listed.iter().any(|c| c["resource"] == taken), "{owner}");
}

/// `createChat` with an existing chat URI is -32010.
#[tokio::test]
async fn create_chat_rejects_existing_chat() {
    let host = one_session_host("cc").await;
    let mut ws = raw_init(&host, "chatter", &[]).await;
    let params = json!({"channel": session_of(&host), "chat": chat_of(&host)});
    assert_eq!(code(&ws.request(1, "createChat", params).await), -32010);
}

/// `createChat` with a `source` (fork) is -32602 and creates nothing.
#[tokio::test]
async fn create_chat_rejects_source() {
    let host = one_session_host("cc").await;
    let mut ws = raw_init(&host, "chatter", &[]).await;
    let params = json!({"channel": session_of(&host), "chat": "ahp-chat:/forked",
        "source": {"kind": "fork", "chat": chat_of(&host), "turnId": "t-1"}});
    serde_json::from_value::<CreateChatParams>(params.clone()).expect("well-typed params");
    assert_eq!(code(&ws.request(1, "createChat", params).await), -32602);
    assert_eq!(host.channel_state("ahp-chat:/forked"), None);
    let plain = json!({"channel": session_of(&host), "chat": "ahp-chat:/plain"});
    assert_eq!(
        ws.request(2, "createChat", plain).await["result"],
        Value::Null
    );
}

// ─── 7. dispatchAction validation ──────────────────────────────────────────

/// `chat/turnCancelled` with no active turn is rejected.
#[tokio::test]
async fn rejects_turn_cancelled_without_active_turn() {
    let host = one_session_host("va").await;
    let chat = chat_of(&host);
    let mut ws = raw_init(&host, "me", &[&chat]).await;
    let cancel = json!({"type": "chat/turnCancelled", "turnId": "t-none", "duration": 0});
    rejected(&host, &mut ws, "me", &chat, 1, cancel).await;
}

/// `chat/toolCallConfirmed` for a tool call not pending confirmation is rejected.
#[tokio::test]
async fn rejects_tool_call_confirmed_not_pending() {
    let host = parking_host("va").await;
    let chat = chat_of(&host);
    let mut ws = raw_init(&host, "me", &[&chat]).await;
    let confirm = |turn: &str, tool: &str| json!({"type": "chat/toolCallConfirmed", "turnId": turn, "toolCallId": tool, "approved": true});
    // Idle chat: there is no tool call at all.
    rejected(&host, &mut ws, "me", &chat, 10, confirm("t-x", "tc-x")).await;
    // Active turn parked on its pending tool call: other ids are not pending.
    run_turn_until(&mut ws, "me", &chat, 11, "t1", "chat/toolCallReady").await;
    let state = host.channel_state(&chat).expect("chat");
    let tool = &state["activeTurn"]["responseParts"][1]["toolCall"];
    assert_eq!(tool["status"], "pending-confirmation", "{state}");
    assert_eq!(tool["toolCallId"], "t1-tool");
    rejected(&host, &mut ws, "me", &chat, 12, confirm("t1", "tc-other")).await;
    rejected(
        &host,
        &mut ws,
        "me",
        &chat,
        13,
        confirm("t-other", "t1-tool"),
    )
    .await;
}

/// `chat/turnResume` with no errored turn is rejected.
#[tokio::test]
async fn rejects_turn_resume_without_errored_turn() {
    let host = one_session_host("va").await;
    let chat = chat_of(&host);
    let mut ws = raw_init(&host, "me", &[&chat]).await;
    let resume = |t: &str| json!({"type": "chat/turnResume", "turnId": t});
    rejected(&host, &mut ws, "me", &chat, 10, resume("t-none")).await;
    run_turn_until(&mut ws, "me", &chat, 11, "t1", "chat/turnComplete").await;
    rejected(&host, &mut ws, "me", &chat, 12, resume("t1")).await;
}

/// `chat/inputAnswerChanged` for an unknown requestId is rejected.
#[tokio::test]
async fn rejects_input_answer_changed_unknown_request() {
    let host = one_session_host("va").await;
    let chat = chat_of(&host);
    let mut ws = raw_init(&host, "me", &[&chat]).await;
    let change = json!({"type": "chat/inputAnswerChanged", "requestId": "r-x", "questionId": "q"});
    rejected(&host, &mut ws, "me", &chat, 1, change).await;
}

/// `chat/inputCompleted` for an unknown requestId is rejected.
#[tokio::test]
async fn rejects_input_completed_unknown_request() {
    let host = one_session_host("va").await;
    let chat = chat_of(&host);
    let mut ws = raw_init(&host, "me", &[&chat]).await;
    let done = json!({"type": "chat/inputCompleted", "requestId": "r-x", "response": "cancel"});
    rejected(&host, &mut ws, "me", &chat, 1, done).await;
}

/// `chat/pendingMessageRemoved` without a matching id and kind is rejected.
#[tokio::test]
async fn rejects_pending_message_removed_unknown_id() {
    let host = one_session_host("va").await;
    let chat = chat_of(&host);
    let mut ws = raw_init(&host, "me", &[&chat]).await;
    let set = json!({"type": "chat/pendingMessageSet", "kind": "steering", "id": "s1",
                     "message": message("steer")});
    accepted(&mut ws, "me", &chat, 1, set).await;
    let remove = |kind: &str, id: &str| json!({"type": "chat/pendingMessageRemoved", "kind": kind, "id": id});
    rejected(
        &host,
        &mut ws,
        "me",
        &chat,
        2,
        remove("steering", "s-other"),
    )
    .await;
    rejected(&host, &mut ws, "me", &chat, 3, remove("queued", "s1")).await;
    let state = host.channel_state(&chat).expect("chat");
    assert_eq!(state["steeringMessage"]["id"], "s1", "{state}");
}

/// A second `chat/turnStarted` while a turn is active is rejected.
#[tokio::test]
async fn rejects_second_turn_started_while_active() {
    let host = parking_host("va").await;
    let chat = chat_of(&host);
    let mut ws = raw_init(&host, "me", &[&chat]).await;
    run_turn_until(&mut ws, "me", &chat, 1, "t1", "chat/toolCallReady").await;
    rejected(&host, &mut ws, "me", &chat, 2, turn_started("t2")).await;
    let state = host.channel_state(&chat).expect("chat");
    assert_eq!(state["activeTurn"]["id"], "t1");
}

/// A `turnId` reused after its turn completed is rejected.
#[tokio::test]
async fn rejects_reused_turn_id() {
    let host = one_session_host("va").await;
    let chat = chat_of(&host);
    let mut ws = raw_init(&host, "me", &[&chat]).await;
    run_turn_until(&mut ws, "me", &chat, 1, "t1", "chat/turnComplete").await;
    rejected(&host, &mut ws, "me", &chat, 2, turn_started("t1")).await;
    let state = host.channel_state(&chat).expect("chat");
    assert_eq!(state["turns"].as_array().map(Vec::len), Some(1));
    assert!(
        state.get("activeTurn").is_none_or(Value::is_null),
        "{state}"
    );
}

/// A server-only action (`chat/delta`) dispatched by a client is rejected.
#[tokio::test]
async fn rejects_server_only_action() {
    let host = one_session_host("va").await;
    let chat = chat_of(&host);
    let mut ws = raw_init(&host, "me", &[&chat]).await;
    let delta = json!({"type": "chat/delta", "turnId": "t", "partId": "p", "content": "x"});
    rejected(&host, &mut ws, "me", &chat, 1, delta).await;
}

/// `session/activeClientSet` naming another clientId is rejected (naming self is not).
#[tokio::test]
async fn rejects_active_client_set_for_another_client() {
    let host = one_session_host("va").await;
    let session = session_of(&host);
    let mut ws = raw_init(&host, "me", &[&session]).await;
    let set = |id: &str| json!({"type": "session/activeClientSet", "activeClient": {"clientId": id, "tools": []}});
    rejected(&host, &mut ws, "me", &session, 1, set("someone-else")).await;
    accepted(&mut ws, "me", &session, 2, set("me")).await;
    let state = host.channel_state(&session).expect("session");
    assert_eq!(
        state["activeClients"],
        json!([{"clientId": "me", "tools": []}])
    );
}

/// An action of the wrong channel kind is rejected.
#[tokio::test]
async fn rejects_action_of_wrong_channel_kind() {
    let host = one_session_host("va").await;
    let (session, chat) = (session_of(&host), chat_of(&host));
    let mut ws = raw_init(&host, "me", &[ROOT, &session, &chat]).await;
    rejected(&host, &mut ws, "me", &session, 1, turn_started("t1")).await;
    let title = json!({"type": "session/titleChanged", "title": "T"});
    rejected(&host, &mut ws, "me", &chat, 2, title.clone()).await;
    rejected(&host, &mut ws, "me", ROOT, 3, title).await;
}

/// A dispatch to an unknown channel gets no echo and consumes no serverSeq.
#[tokio::test]
async fn dispatch_to_unknown_channel_is_not_echoed() {
    let host = one_session_host("va").await;
    let (session, chat) = (session_of(&host), chat_of(&host));
    let mut ws = raw_init(&host, "me", &[ROOT, &session, &chat]).await;
    let seq_before = host.server_seq();
    for (seq, (channel, action)) in [
        ("ahp-chat:/nope", turn_started("t1")),
        (
            "ahp-session:/nope",
            json!({"type": "session/titleChanged", "title": "T"}),
        ),
        (
            "ahp-terminal:/nope",
            json!({"type": "terminal/input", "data": "ls"}),
        ),
        (
            "other:/nope",
            json!({"type": "chat/delta", "turnId": "t", "partId": "p", "content": "x"}),
        ),
    ]
    .into_iter()
    .enumerate()
    {
        ws.send_json(&json!({"jsonrpc": "2.0", "method": "dispatchAction",
            "params": {"channel": channel, "clientSeq": seq, "action": known(action)}}))
            .await;
    }
    ws.send_json(
        &json!({"jsonrpc": "2.0", "id": 99, "method": "ping", "params": {"channel": ROOT}}),
    )
    .await;
    let next = ws.recv_json().await.expect("socket open");
    assert_eq!(next, json!({"jsonrpc": "2.0", "id": 99, "result": null}));
    assert_eq!(host.server_seq(), seq_before);
}

/// Rejected envelopes are numbered: serverSeq advances by one per envelope.
#[tokio::test]
async fn rejected_envelopes_consume_server_seq() {
    let host = one_session_host("va").await;
    let (session, chat) = (session_of(&host), chat_of(&host));
    let mut ws = raw_init(&host, "me", &[&session, &chat]).await;
    let title = |t: &str| json!({"type": "session/titleChanged", "title": t});
    let first = accepted(&mut ws, "me", &session, 1, title("A")).await;
    let other =
        json!({"type": "session/activeClientSet", "activeClient": {"clientId": "x", "tools": []}});
    let r1 = rejected(&host, &mut ws, "me", &session, 2, other).await;
    let delta = json!({"type": "chat/delta", "turnId": "t", "partId": "p", "content": "x"});
    let r2 = rejected(&host, &mut ws, "me", &chat, 3, delta).await;
    let r3 = rejected(&host, &mut ws, "me", &session, 4, turn_started("t1")).await;
    let last = accepted(&mut ws, "me", &session, 5, title("B")).await;
    let seq = |e: &Value| e["serverSeq"].as_u64().expect("serverSeq");
    let seqs = [&first, &r1, &r2, &r3, &last].map(seq);
    assert_eq!(
        seq(&last) - seq(&first),
        4,
        "3 rejected + 1 accepted: {seqs:?}"
    );
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    assert_eq!(host.server_seq(), seq(&last));
    assert_eq!(host.channel_state(&session).expect("session")["title"], "B");
}

// ─── 8. Frame record ───────────────────────────────────────────────────────

/// `received_from` holds the client's frames after `initialize`, in order, verbatim.
#[tokio::test]
async fn frame_record_keeps_client_frames_in_order() {
    let host = one_session_host("rec").await;
    let chat = chat_of(&host);
    let mut ws = RawWs::connect(&host.url()).await;
    let init = format!(
        r#"{{"jsonrpc":"2.0","id":0,"method":"initialize","params":{{"channel":"ahp-root://","protocolVersions":["1.0.0"],"clientId":"rec-1","initialSubscriptions":["{chat}"]}}}}"#
    );
    let sent = [
        r#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"channel":"ahp-root://"}}"#.to_string(),
        r#"{"jsonrpc":"2.0","id":2,"method":"listSessions","params":{"channel":"ahp-root://","limit":1}}"#.to_string(),
        format!(r#"{{"jsonrpc":"2.0","method":"dispatchAction","params":{{"channel":"{chat}","clientSeq":1,"action":{{"type":"chat/isReadChanged","isRead":true}}}}}}"#),
        r#"{"jsonrpc":"2.0","id":3,"method":"subscribe","params":{"channel":"ahp-root://"}}"#.to_string(),
    ];
    ws.send_text(&init).await;
    ws.response(&json!(0)).await;
    for frame in &sent {
        ws.send_text(frame).await;
    }
    ws.response(&json!(3)).await;

    let from = host.received_from("rec-1");
    let methods: Vec<Option<&str>> = from.iter().map(|f| f.method.as_deref()).collect();
    assert_eq!(
        methods,
        [
            Some("ping"),
            Some("listSessions"),
            Some("dispatchAction"),
            Some("subscribe")
        ]
    );
    let texts: Vec<&str> = from.iter().map(|f| &*f.text).collect();
    assert_eq!(texts, sent.iter().map(String::as_str).collect::<Vec<_>>());
    // The initialize frame arrived before the connection had a clientId.
    let all = host.received();
    assert_eq!(all.len(), 5);
    assert_eq!(all[0].method.as_deref(), Some("initialize"));
    assert_eq!(all[0].client_id, None);
    assert_eq!(&*all[0].text, init);
    assert!(all.iter().all(|f| f.conn == all[0].conn));
    assert_eq!(host.record_dropped(), 0);
}

/// A host the client never contacted has an empty record.
#[tokio::test]
async fn uncontacted_host_records_nothing() {
    let contacted = one_session_host("rec-a").await;
    let untouched = one_session_host("rec-b").await;
    let client = connect_init(&contacted.url(), "rec-2").await;
    client.ping().await.expect("ping answered");
    assert_eq!(contacted.received_from("rec-2").len(), 1);
    assert_eq!(contacted.received().len(), 2);
    assert!(untouched.received().is_empty());
    assert!(untouched.received_from("rec-2").is_empty());
}

//! The simulated host in VS Code mode (`vscode_compat`): VS Code's session
//! and chat URI shapes, client-created sessions and chats in those shapes,
//! `root/configChanged`, and seeded ids that collide across hosts on purpose.

mod common;

use ahp_relay::simhost::SimHost;
use ahp_relay::simhost::clock::now_iso;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use common::*;
use serde_json::{Value, json};

const ROOT: &str = "ahp-root://";

async fn vscode_host(name: &str, sessions: usize, id_seed: Option<u64>) -> SimHost {
    let mut cfg = fast_config(name, sessions);
    cfg.vscode_compat = true;
    cfg.id_seed = id_seed;
    start_host(cfg).await
}

/// What a VS Code client computes: `ahp-chat://<chatId>/<b64url-no-pad(session)>`.
fn chat_uri(session: &str, chat_id: &str) -> String {
    format!(
        "ahp-chat://{chat_id}/{}",
        URL_SAFE_NO_PAD.encode(session.as_bytes())
    )
}

fn is_uuid(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.iter().map(|p| p.len()).collect::<Vec<_>>() == [8, 4, 4, 4, 12]
        && s.bytes().all(|b| b == b'-' || b.is_ascii_hexdigit())
}

async fn list(ws: &mut RawWs, id: u64) -> Vec<Value> {
    let resp = ws
        .request(id, "listSessions", json!({"channel": ROOT}))
        .await;
    resp["result"]["items"]
        .as_array()
        .unwrap_or_else(|| panic!("listSessions: {resp}"))
        .clone()
}

fn dispatch(channel: &str, client_seq: i64, action: Value) -> Value {
    json!({"jsonrpc": "2.0", "method": "dispatchAction",
           "params": {"channel": channel, "clientSeq": client_seq, "action": action}})
}

/// The echo (params of the `action` frame) of the action of type `ty` on `channel`.
async fn echo_of(ws: &mut RawWs, channel: &str, ty: &str) -> Value {
    loop {
        let f = ws.recv_json().await.expect("socket open");
        if f["method"] == "action"
            && f["params"]["channel"] == channel
            && f["params"]["action"]["type"] == ty
        {
            return f["params"].clone();
        }
    }
}

/// Sessions are `<provider>:/<uuid>` and each default chat is exactly the
/// URI a VS Code client derives; a turn runs on it.
#[tokio::test]
async fn sessions_and_default_chats_have_vs_code_shapes() {
    let host = vscode_host("vsnames", 2, None).await;
    let mut ws = RawWs::connect(&host.url()).await;
    ws.initialize("vs-client").await;
    let items = list(&mut ws, 1).await;
    assert_eq!(items.len(), 2);
    for s in &items {
        let uri = s["resource"].as_str().expect("resource");
        let id = uri
            .strip_prefix("sim:/")
            .expect("session scheme is the provider");
        assert!(is_uuid(id), "{uri}");
        assert_eq!(s["defaultChat"], chat_uri(uri, "default"), "{s}");
        assert_eq!(s["chats"][0]["resource"], chat_uri(uri, "default"));
    }
    let session = items[0]["resource"].as_str().expect("resource");
    let chat = chat_uri(session, "default");
    let sub = ws.request(2, "subscribe", json!({"channel": chat})).await;
    assert_eq!(sub["result"]["snapshot"]["resource"], chat, "{sub}");
    let turn = json!({"type": "chat/turnStarted", "turnId": "vs-t1", "startedAt": now_iso(),
        "message": {"text": "hello", "origin": {"kind": "user"}}});
    ws.send_json(&dispatch(&chat, 1, turn)).await;
    let done = echo_of(&mut ws, &chat, "chat/turnComplete").await;
    assert_eq!(done["action"]["turnId"], "vs-t1");
    let state = host.channel_state(&chat).expect("chat state");
    assert_eq!(state["turns"][0]["id"], "vs-t1");
}

/// A client creates a `sim:/<uuid>` session (its default chat derived) and
/// a second chat named VS Code's way; a chat URI encoding another session,
/// or a session in another provider's scheme, is refused with -32602.
#[tokio::test]
async fn clients_create_sessions_and_chats_in_vs_code_shapes() {
    let host = vscode_host("vscreate", 1, None).await;
    let mut ws = RawWs::connect(&host.url()).await;
    ws.initialize("vs-creator").await;
    let session = "sim:/0b7c3a52-1111-4a4a-8b8b-123456789abc";
    let made = ws
        .request(1, "createSession", json!({"channel": session}))
        .await;
    assert_eq!(made["result"], Value::Null, "{made}");
    let state = host.channel_state(session).expect("session exists");
    assert_eq!(state["defaultChat"], chat_uri(session, "default"));
    let side = chat_uri(session, "side-1");
    let made = ws
        .request(2, "createChat", json!({"channel": session, "chat": side}))
        .await;
    assert_eq!(made["result"], Value::Null, "{made}");
    assert!(host.channel_state(&side).is_some());
    let foreign = chat_uri("sim:/someone-else", "x");
    let refused = ws
        .request(
            3,
            "createChat",
            json!({"channel": session, "chat": foreign}),
        )
        .await;
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    let refused = ws
        .request(4, "createSession", json!({"channel": "copilot:/abc"}))
        .await;
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
}

/// Plain mode keeps the spec's shapes for the names it assigns, and takes
/// a session URI a client chooses in its provider's scheme (VS Code's
/// client names new sessions `<provider>:/<uuid>`), not another provider's.
#[tokio::test]
async fn plain_mode_keeps_spec_shapes() {
    let host = start_host(fast_config("plainshape", 1)).await;
    let mut ws = RawWs::connect(&host.url()).await;
    ws.initialize("plain").await;
    let items = list(&mut ws, 1).await;
    assert_eq!(items[0]["resource"], "ahp-session:/plainshape-1");
    assert_eq!(items[0]["defaultChat"], "ahp-chat:/plainshape-1-main");
    let refused = ws
        .request(2, "createSession", json!({"channel": "other:/abc"}))
        .await;
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    let created = ws
        .request(3, "createSession", json!({"channel": "sim:/abc"}))
        .await;
    assert!(created.get("error").is_none(), "{created}");
}

/// `root/configChanged` from a client (clientSeq 0) is accepted and shows
/// in the root `config`; an undeclared property is rejected; a plain host
/// has no root config and rejects it.
#[tokio::test]
async fn root_config_changed_by_a_client_is_reflected() {
    let host = vscode_host("vsconfig", 1, None).await;
    let mut ws = RawWs::connect(&host.url()).await;
    ws.initialize("vs-config").await;
    let sub = ws.request(1, "subscribe", json!({"channel": ROOT})).await;
    assert_eq!(
        sub["result"]["snapshot"]["state"]["config"]["values"]["mode"],
        "agent"
    );
    let change = json!({"type": "root/configChanged", "config": {"mode": "ask"}});
    ws.send_json(&dispatch(ROOT, 0, change)).await;
    let echo = echo_of(&mut ws, ROOT, "root/configChanged").await;
    assert_eq!(echo["origin"]["clientSeq"], 0);
    assert!(echo.get("rejectionReason").is_none(), "{echo}");
    let root = host.channel_state(ROOT).expect("root");
    assert_eq!(root["config"]["values"]["mode"], "ask");
    assert_eq!(root["config"]["values"]["autoApprove"], false);
    let bad = json!({"type": "root/configChanged", "config": {"nope": 1}});
    ws.send_json(&dispatch(ROOT, 1, bad)).await;
    let echo = echo_of(&mut ws, ROOT, "root/configChanged").await;
    assert!(echo["rejectionReason"].is_string(), "{echo}");
    assert!(host.channel_state(ROOT).expect("root")["config"]["values"]["nope"].is_null());

    let plain = start_host(fast_config("plainconfig", 1)).await;
    let mut ws = RawWs::connect(&plain.url()).await;
    ws.initialize("plain-config").await;
    ws.request(1, "subscribe", json!({"channel": ROOT})).await;
    let change = json!({"type": "root/configChanged", "config": {"mode": "ask"}});
    ws.send_json(&dispatch(ROOT, 0, change)).await;
    let echo = echo_of(&mut ws, ROOT, "root/configChanged").await;
    assert!(echo["rejectionReason"].is_string(), "{echo}");
}

/// Two hosts given the same id seed mint the same session (and so chat)
/// URIs; a different seed gives different ones.
#[tokio::test]
async fn equal_id_seeds_make_session_ids_collide() {
    let a = vscode_host("vsseed-a", 2, Some(42)).await;
    let b = vscode_host("vsseed-b", 2, Some(42)).await;
    let c = vscode_host("vsseed-c", 2, Some(43)).await;
    assert_eq!(a.session_uris(), b.session_uris());
    assert_eq!(a.session_uris().len(), 2);
    assert!(
        a.session_uris()
            .iter()
            .all(|s| !c.session_uris().contains(s))
    );
    let s = &a.session_uris()[0];
    assert!(b.channel_state(&chat_uri(s, "default")).is_some());
}

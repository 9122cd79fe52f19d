//! Issue 26: a client that sends exactly what VS Code's remote client sends
//! (its parameter names, its channel-less requests, its session URIs derived
//! from the provider id the relay lists, its terminal URIs) works through
//! the relay against hosts that behave like VS Code's agent host, for the
//! host lines `^0.10.0` (VS Code 1.141) and `^1.0.0`, and for the clients of
//! VS Code main (`["1.0.0","0.10.0","0.9.0"]`) and of 1.141
//! (`["0.10.0","0.9.0","0.7.0","0.6.0","0.5.2","0.5.1"]`). Sessions are
//! named as VS Code names them: `AgentSession.uri(provider, uuid)` =
//! `<provider>.<host>:/<uuid>` (1.141, and main for its own hosts), and
//! `ahp-session:/<uuid>` (main, for a host not marked as VS Code's).
//!
//! The frames are raw JSON, as the client's `agentHostProtocolClient.ts`
//! builds them (`/work/notes/vscode-findings.md` §1 table, §4): nothing here
//! goes through a typed client that could add or rename a field.

mod common;

use ahp_relay::simhost::HostProtocol;
use ahp_relay::simhost::clock::now_iso;
use ahp_relay::simhost::config::SimHostConfig;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use common::relay::TestRelay;
use common::*;
use serde_json::{Value, json};

/// VS Code main's offer (`getAgentHostSupportedProtocolVersions()`).
const MAIN_OFFER: &[&str] = &["1.0.0", "0.10.0", "0.9.0"];
/// VS Code 1.141's offer.
const V1141_OFFER: &[&str] = &["0.10.0", "0.9.0", "0.7.0", "0.6.0", "0.5.2", "0.5.1"];

/// The host id: its `-` is spelled `+` in the provider id VS Code sees.
const HOST: &str = "gpu-1";

/// The client id of the window that drops and reconnects.
const WINDOW: &str = "vscode-window-1";

/// A raw socket driven as VS Code's client drives it: request ids count
/// up, and every action envelope that passes is noted, so
/// `lastSeenServerSeq` is what the client really saw.
struct VsCode {
    ws: RawWs,
    next_id: u64,
    last_seen: u64,
}

impl VsCode {
    fn new(ws: RawWs) -> Self {
        Self {
            ws,
            next_id: 1,
            last_seen: 0,
        }
    }

    /// The next frame; an action envelope advances `last_seen`.
    async fn recv(&mut self) -> Value {
        let v = self.ws.recv_json().await.expect("socket open");
        if v["method"] == "action"
            && let Some(seq) = v["params"]["serverSeq"].as_u64()
        {
            self.last_seen = self.last_seen.max(seq);
        }
        v
    }

    /// Sends request `method` with exactly `params` and returns its answer.
    async fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.ws
            .send_json(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        loop {
            let v = self.recv().await;
            if v["id"] == id && v.get("method").is_none() {
                return v;
            }
        }
    }

    /// Frames up to the first action envelope `stop` accepts (included).
    async fn actions_until(&mut self, mut stop: impl FnMut(&Value) -> bool) -> Vec<Value> {
        let mut out = Vec::new();
        loop {
            let v = self.recv().await;
            if v["method"] == "action" {
                let done = stop(&v["params"]);
                out.push(v["params"].clone());
                if done {
                    return out;
                }
            }
        }
    }

    /// Starts turn `turn_id` on `chat` as dispatch `client_seq` and waits
    /// for its `chat/turnComplete`; the turn's own echo must be accepted.
    async fn run_turn(&mut self, chat: &str, client_seq: i64, turn_id: &str) {
        let turn = json!({"type": "chat/turnStarted", "turnId": turn_id, "startedAt": now_iso(),
            "message": {"text": "hello from VS Code", "origin": {"kind": "user"}}});
        self.ws
            .send_json(&json!({"jsonrpc": "2.0", "method": "dispatchAction",
                "params": {"channel": chat, "clientSeq": client_seq, "action": turn}}))
            .await;
        let seen = self
            .actions_until(|e| e["channel"] == chat && e["action"]["type"] == "chat/turnComplete")
            .await;
        let echo = seen
            .iter()
            .find(|e| e["action"]["type"] == "chat/turnStarted" && e["action"]["turnId"] == turn_id)
            .unwrap_or_else(|| panic!("the turn's echo: {seen:?}"));
        assert!(echo.get("rejectionReason").is_none(), "accepted: {echo}");
    }
}

/// VS Code's `initialize`: no `channel`, its offer, the root as initial
/// subscription, its `clientInfo` and `_meta`.
fn initialize_params(client_id: &str, offer: &[&str]) -> Value {
    json!({"protocolVersions": offer, "clientId": client_id,
        "clientInfo": {"name": "Visual Studio Code", "version": "1.141.0"},
        "_meta": {"vscode.clientConnectionKind": "remote"},
        "initialSubscriptions": [ROOT]})
}

/// `buildChatUri(session, 'default')`: base64url of the session string,
/// without padding.
fn default_chat(session: &str) -> String {
    format!(
        "ahp-chat://default/{}",
        URL_SAFE_NO_PAD.encode(session.as_bytes())
    )
}

/// What VS Code's client does in a day, through the relay, against one
/// VS Code-mode host speaking `line`, offering `offer`; `want` is the
/// version the relay must pick.
async fn a_vscode_day(line: HostProtocol, offer: &[&str], want: &str) {
    let cfg = SimHostConfig {
        protocol: line,
        vscode_compat: true,
        ..fast_config(HOST, 1)
    };
    let t = TestRelay::start(vec![cfg], "").await;
    let mut vs = VsCode::new(t.raw("alice").await);
    let provider = connect(&mut vs, WINDOW, offer, want).await;
    let session = create_session(&t, &mut vs, &provider).await;
    if offer == MAIN_OFFER {
        main_names_a_session_ahp_session(&t, &mut vs, &provider).await;
    }
    let chat = default_chat(&session);
    for channel in [session.as_str(), chat.as_str()] {
        let r = vs.request("subscribe", json!({"channel": channel})).await;
        assert!(
            r["result"]["snapshot"]["state"].is_object(),
            "{channel}: {r}"
        );
    }
    vs.run_turn(&chat, 1, "vs-turn-1").await;
    let terminal = create_terminal(&t, &mut vs).await;
    let last_seen = vs.last_seen;
    drop_and_miss_a_turn(&t, vs, &chat, offer, want).await;
    let subscriptions = [ROOT, &session, &chat, terminal];
    reconnect_replays(&t, last_seen, &chat, &subscriptions).await;
}

/// `initialize` without channel offering `offer` (the relay picks `want`),
/// then `listSessions {channel: root}` without limit; the provider id the
/// root lists.
async fn connect(vs: &mut VsCode, client_id: &str, offer: &[&str], want: &str) -> String {
    let r = vs
        .request("initialize", initialize_params(client_id, offer))
        .await;
    assert_eq!(r["result"]["protocolVersion"], want, "{r}");
    let root = &r["result"]["snapshots"][0];
    assert_eq!(root["resource"], ROOT, "{r}");
    let provider = root["state"]["agents"][0]["provider"]
        .as_str()
        .unwrap_or_else(|| panic!("an agent: {r}"))
        .to_string();
    assert_eq!(
        provider, "sim.gpu+1",
        "a provider id a URI scheme can carry"
    );

    // listSessions {channel: root}, no limit: the seeded session is listed
    // under the provider's scheme, as `AgentSession.provider` reads it.
    let r = vs.request("listSessions", json!({"channel": ROOT})).await;
    let listed: Vec<String> = r["result"]["items"]
        .as_array()
        .unwrap_or_else(|| panic!("items: {r}"))
        .iter()
        .filter_map(|s| s["resource"].as_str().map(str::to_string))
        .collect();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert!(
        listed[0].starts_with(&format!("{provider}:/")),
        "{listed:?}"
    );
    provider
}

/// `createSession` as `AgentSession.uri(provider, generateUuid())`, with
/// `provider` and the plural `workingDirectories`; the session URI.
async fn create_session(t: &TestRelay, vs: &mut VsCode, provider: &str) -> String {
    let uuid = "0b6e2a41-7c39-4f1d-9e25-3a8c5d7f1b64";
    let session = format!("{provider}:/{uuid}");
    let params = json!({"channel": session, "provider": provider,
        "workingDirectories": [format!("file://{HOST}/home/dev/project")]});
    let r = vs.request("createSession", params).await;
    assert!(r.get("error").is_none(), "createSession: {r}");
    let host_session = format!("sim:/{uuid}");
    let on_host = t.hosts[0]
        .channel_state(&host_session)
        .unwrap_or_else(|| panic!("the host has {host_session}"));
    assert_eq!(
        on_host["workingDirectories"],
        json!(["file:///home/dev/project"]),
        "the host got its own file: URI"
    );
    session
}

/// The workbench's terminal: `agenthost-terminal:/<uuid>`, claimed by the
/// window itself; subscribed.
async fn create_terminal(t: &TestRelay, vs: &mut VsCode) -> &'static str {
    let terminal = "agenthost-terminal:/5c1d9e7a-2b4f-4a63-8d0e-6f3a1b2c4d5e";
    let params = json!({"channel": terminal,
        "claim": {"kind": "client", "clientId": WINDOW}, "cols": 80, "rows": 24});
    let r = vs.request("createTerminal", params).await;
    assert!(r.get("error").is_none(), "createTerminal: {r}");
    assert!(
        t.hosts[0].channel_state(terminal).is_some(),
        "created on the host as named"
    );
    let r = vs.request("subscribe", json!({"channel": terminal})).await;
    assert!(r["result"]["snapshot"]["state"].is_object(), "{r}");
    terminal
}

/// Everything queued for the window arrives (a ping's answer follows it),
/// the transport drops, and another window of the same user runs a turn
/// on `chat` meanwhile.
async fn drop_and_miss_a_turn(
    t: &TestRelay,
    mut vs: VsCode,
    chat: &str,
    offer: &[&str],
    want: &str,
) {
    let r = vs.request("ping", json!({"channel": ROOT})).await;
    assert_eq!(r["result"], Value::Null, "{r}");
    assert!(vs.last_seen > 0, "envelopes seen");
    vs.ws.close_cleanly().await;

    // Another window of the same user runs a turn meanwhile.
    let mut other = VsCode::new(t.raw("alice").await);
    let r = other
        .request("initialize", initialize_params("vscode-window-2", offer))
        .await;
    assert_eq!(r["result"]["protocolVersion"], want, "{r}");
    let r = other.request("subscribe", json!({"channel": chat})).await;
    assert!(r["result"]["snapshot"].is_object(), "{r}");
    other.run_turn(chat, 1, "vs-turn-2").await;
}

/// `reconnect` without channel from where the window stopped: the missed
/// envelopes (the other window's turn) are replayed, nothing older.
async fn reconnect_replays(t: &TestRelay, last_seen: u64, chat: &str, subscriptions: &[&str]) {
    let mut ws = t.raw("alice").await;
    let params = json!({"clientId": WINDOW, "lastSeenServerSeq": last_seen,
        "subscriptions": subscriptions});
    let r = raw_reconnect(&mut ws, 1, params).await;
    assert_eq!(r["result"]["type"], "replay", "{r}");
    let replayed = r["result"]["actions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        replayed
            .iter()
            .all(|e| e["serverSeq"].as_u64().is_some_and(|s| s > last_seen)),
        "only what the window missed: {r}"
    );
    let turn2: Vec<&str> = replayed
        .iter()
        .filter(|e| e["channel"] == chat && e["action"]["turnId"] == "vs-turn-2")
        .filter_map(|e| e["action"]["type"].as_str())
        .collect();
    assert!(
        turn2.first() == Some(&"chat/turnStarted") && turn2.contains(&"chat/turnComplete"),
        "the other window's turn is replayed: {turn2:?} in {r}"
    );
}

/// VS Code main names a session `ahp-session:/<uuid>` on a host that does
/// not mark itself as VS Code's own (`newAgentHostSessionUri`: the relay's
/// `initialize` answer carries no `vscode.agentHost` and its root no
/// `hostBuild`): created on the provider's host, its derived default chat
/// subscribes.
async fn main_names_a_session_ahp_session(t: &TestRelay, vs: &mut VsCode, provider: &str) {
    let session = "ahp-session:/9d3f1c2b-6e4a-4b8d-a1c7-2e5f8b0d3a96";
    let params = json!({"channel": session, "provider": provider,
        "workingDirectories": [format!("file://{HOST}/home/dev/other")]});
    let r = vs.request("createSession", params).await;
    assert!(r.get("error").is_none(), "createSession {session}: {r}");
    assert!(t.hosts[0].channel_state(session).is_some(), "on the host");
    let chat = default_chat(session);
    let r = vs.request("subscribe", json!({"channel": chat})).await;
    assert!(r["result"]["snapshot"]["state"].is_object(), "{chat}: {r}");
}

/// VS Code main against a VS Code 1.141 host (`^0.10.0`): the relay speaks
/// 1.0.0 to the client and 0.10.0 to the host.
#[tokio::test]
async fn vscode_main_client_through_a_0_10_host() {
    a_vscode_day(HostProtocol::V0_10, MAIN_OFFER, "1.0.0").await;
}

/// VS Code main against a 1.x host.
#[tokio::test]
async fn vscode_main_client_through_a_1_0_host() {
    a_vscode_day(HostProtocol::V1, MAIN_OFFER, "1.0.0").await;
}

/// VS Code 1.141's client (offering nothing above 0.10.0) against a 0.10
/// host.
#[tokio::test]
async fn vscode_1141_client_through_a_0_10_host() {
    a_vscode_day(HostProtocol::V0_10, V1141_OFFER, "0.10.0").await;
}

/// VS Code 1.141's client against a 1.x host: the relay speaks 0.10.0 to the
/// client and 1.0.0 to the host (one wire contract).
#[tokio::test]
async fn vscode_1141_client_through_a_1_0_host() {
    a_vscode_day(HostProtocol::V1, V1141_OFFER, "0.10.0").await;
}

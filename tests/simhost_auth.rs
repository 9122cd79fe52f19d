//! `authenticate` on the simulated host: an agent with protected resources
//! refuses turns on a connection until it authenticated; tokens are per
//! connection (host-wide in VS Code mode), can be revoked, and expire with
//! `auth/required {expired}`.

mod common;

use ahp_relay::simhost::clock::now_iso;
use ahp_relay::simhost::{SimHost, naming};
use common::*;
use serde_json::{Value, json};

const ROOT: &str = "ahp-root://";
const API: &str = "https://api.sim.example";
const CHAT: &str = "ahp-chat:/fauth-1-main";

async fn protected_host() -> SimHost {
    let mut cfg = fast_config("fauth", 1);
    cfg.protected_resources = vec![API.into()];
    start_host(cfg).await
}

async fn client(host: &SimHost, id: &str) -> RawWs {
    let mut ws = RawWs::connect(&host.url()).await;
    ws.initialize(id).await;
    let sub = ws.request(1, "subscribe", json!({"channel": CHAT})).await;
    assert!(sub["result"]["snapshot"].is_object(), "{sub}");
    ws
}

async fn authenticate(
    ws: &mut RawWs,
    id: u64,
    resource: &str,
    token: &str,
    expires: Option<i64>,
) -> Value {
    let mut params = json!({"channel": ROOT, "resource": resource, "token": token});
    if let Some(s) = expires {
        params["expiresIn"] = json!(s);
    }
    ws.request(id, "authenticate", params).await
}

/// Dispatches a turn and returns its echo plus the `auth/required`
/// notifications that came before the echo.
async fn try_turn(ws: &mut RawWs, seq: i64, turn_id: &str) -> (Value, Vec<Value>) {
    try_turn_on(ws, CHAT, seq, turn_id).await
}

/// [`try_turn`] on `chat`.
async fn try_turn_on(ws: &mut RawWs, chat: &str, seq: i64, turn_id: &str) -> (Value, Vec<Value>) {
    let turn = json!({"type": "chat/turnStarted", "turnId": turn_id, "startedAt": now_iso(),
        "message": {"text": "hi", "origin": {"kind": "user"}}});
    ws.send_json(&json!({"jsonrpc": "2.0", "method": "dispatchAction",
        "params": {"channel": chat, "clientSeq": seq, "action": turn}}))
        .await;
    let mut auth = Vec::new();
    loop {
        let f = ws.recv_json().await.expect("socket open");
        if f["method"] == "auth/required" {
            auth.push(f["params"].clone());
        }
        if f["method"] == "action" && f["params"]["action"]["turnId"] == turn_id {
            return (f["params"].clone(), auth);
        }
    }
}

/// The next `auth/required` notification's params.
async fn next_auth_required(ws: &mut RawWs) -> Value {
    loop {
        let f = ws.recv_json().await.expect("socket open");
        if f["method"] == "auth/required" {
            return f["params"].clone();
        }
    }
}

/// The agent advertises its protected resource; a turn before
/// `authenticate` is rejected with `auth/required {required}`; unknown
/// resources and refused tokens get the spec's errors; after a successful
/// `authenticate` the turn runs — on that connection only.
#[tokio::test]
async fn turns_need_authentication_per_connection() {
    let host = protected_host().await;
    let root = host.channel_state(ROOT).expect("root");
    assert_eq!(root["agents"][0]["protectedResources"][0]["resource"], API);
    let mut a = client(&host, "auth-a").await;
    let (echo, auth) = try_turn(&mut a, 1, "t1").await;
    assert!(
        echo["rejectionReason"]
            .as_str()
            .is_some_and(|r| r.contains(API)),
        "{echo}"
    );
    assert_eq!(auth.len(), 1, "{auth:?}");
    assert_eq!(auth[0]["reason"], "required");
    assert_eq!(auth[0]["resource"]["resource"], API);
    let unknown = authenticate(&mut a, 2, "https://other.example", "tok", None).await;
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");
    let refused = authenticate(&mut a, 3, API, "invalid-token", None).await;
    assert_eq!(refused["error"]["code"], -32007, "{refused}");
    assert_eq!(refused["error"]["data"][0]["resource"], API);
    let good = authenticate(&mut a, 4, API, "tok-a", None).await;
    assert_eq!(good["result"], json!({}), "{good}");
    let (echo, auth) = try_turn(&mut a, 2, "t2").await;
    assert!(echo.get("rejectionReason").is_none(), "{echo}");
    assert!(auth.is_empty());
    let mut b = client(&host, "auth-b").await;
    let (echo, _) = try_turn(&mut b, 1, "t3").await;
    assert!(
        echo["rejectionReason"].is_string(),
        "b has not authenticated: {echo}"
    );
}

/// An empty token revokes: the next turn is refused again.
#[tokio::test]
async fn an_empty_token_revokes() {
    let host = protected_host().await;
    let mut a = client(&host, "auth-revoke").await;
    assert_eq!(
        authenticate(&mut a, 2, API, "tok", None).await["result"],
        json!({})
    );
    assert_eq!(
        authenticate(&mut a, 3, API, "", None).await["result"],
        json!({})
    );
    let (echo, auth) = try_turn(&mut a, 1, "t1").await;
    assert!(echo["rejectionReason"].is_string(), "{echo}");
    assert_eq!(auth[0]["reason"], "required");
}

/// A token given with `expiresIn` runs out: the connection gets
/// `auth/required {reason: expired}` and turns are refused until it
/// authenticates again.
#[tokio::test]
async fn expired_tokens_get_auth_required_expired() {
    let host = protected_host().await;
    let mut a = client(&host, "auth-expiry").await;
    assert_eq!(
        authenticate(&mut a, 2, API, "short", Some(1)).await["result"],
        json!({})
    );
    let expired = next_auth_required(&mut a).await;
    assert_eq!(expired["reason"], "expired");
    assert_eq!(expired["resource"]["resource"], API);
    let (echo, _) = try_turn(&mut a, 1, "t1").await;
    assert!(echo["rejectionReason"].is_string(), "{echo}");
    assert_eq!(
        authenticate(&mut a, 3, API, "fresh", None).await["result"],
        json!({})
    );
    let (echo, _) = try_turn(&mut a, 2, "t2").await;
    assert!(echo.get("rejectionReason").is_none(), "{echo}");
    let bad = authenticate(&mut a, 4, API, "x", Some(0)).await;
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
}

/// Issue 26: in VS Code mode tokens are host-wide, as in VS Code's agent
/// host. A token given on connection a serves b's turns, and still after a
/// has closed; b's empty token revokes it for everyone; a refused turn's
/// `auth/required` reaches every connection.
#[tokio::test]
async fn vscode_mode_tokens_are_host_wide() {
    let mut cfg = fast_config("vauth", 1);
    cfg.protected_resources = vec![API.into()];
    cfg.vscode_compat = true;
    let session = format!("sim:/{}", naming::seeded_uuid(&cfg, 1));
    let chat = naming::vscode_chat_uri(&session, naming::DEFAULT_CHAT_ID);
    let host = start_host(cfg).await;
    let connect = |id: &'static str| {
        let (url, chat) = (host.url(), chat.clone());
        async move {
            let mut ws = RawWs::connect(&url).await;
            ws.initialize(id).await;
            let sub = ws.request(1, "subscribe", json!({"channel": chat})).await;
            assert!(sub["result"]["snapshot"].is_object(), "{sub}");
            ws
        }
    };
    let mut a = connect("wide-a").await;
    let mut b = connect("wide-b").await;
    assert_eq!(
        authenticate(&mut a, 2, API, "tok-a", None).await["result"],
        json!({})
    );
    a.close_cleanly().await;
    wait_until("a's connection is gone", || host.connections() == 1).await;
    let (echo, auth) = try_turn_on(&mut b, &chat, 1, "w1").await;
    assert!(
        echo.get("rejectionReason").is_none(),
        "a's token serves b: {echo}"
    );
    assert!(auth.is_empty(), "{auth:?}");
    let mut c = connect("wide-c").await;
    assert_eq!(
        authenticate(&mut b, 3, API, "", None).await["result"],
        json!({})
    );
    let (echo, _) = try_turn_on(&mut b, &chat, 2, "w2").await;
    assert!(
        echo["rejectionReason"].is_string(),
        "revoked for everyone: {echo}"
    );
    assert_eq!(next_auth_required(&mut c).await["reason"], "required");
}

//! The fair session cap (contract §3.6): at `sessions_per_principal` a new
//! session drops the principal's least recently detached one, so closed
//! windows never lock a user out; only attached sessions make a new one
//! fail.

mod common;

use common::relay::{TestRelay, admin_get, metric};
use common::{RawWs, fast_config};
use serde_json::json;

const CAP: usize = 16;

async fn relay() -> TestRelay {
    TestRelay::start(
        vec![fast_config("a", 1)],
        &format!("\n[limits]\nsessions_per_principal = {CAP}\n"),
    )
    .await
}

async fn reconnect(ws: &mut RawWs, client_id: &str) -> serde_json::Value {
    ws.request(
        1,
        "reconnect",
        json!({"channel": "ahp-root://", "clientId": client_id,
               "lastSeenServerSeq": 0, "subscriptions": []}),
    )
    .await
}

/// Twenty windows opened and closed one after another by one principal all
/// initialize; the oldest closed ones are gone (`NotFound`), the newest
/// still reconnect.
#[tokio::test]
async fn open_and_close_cycles_never_hit_the_cap() {
    let t = relay().await;
    for i in 0..20 {
        let mut ws = t.raw("alice").await;
        let r = ws.initialize(&format!("window-{i}")).await;
        assert!(r["result"]["serverSeq"].is_u64(), "cycle {i}: {r}");
        ws.close_cleanly().await;
    }
    let mut ws = t.raw("alice").await;
    let gone = reconnect(&mut ws, "window-0").await;
    assert_eq!(gone["error"]["code"], -32008, "{gone}");
    let kept = reconnect(&mut ws, "window-19").await;
    assert!(kept["result"]["type"].is_string(), "{kept}");
    let (_, page) = admin_get(&t, "/metrics").await;
    assert_eq!(metric(&page, "ahp_relay_sessions_evicted_total"), Some(4.0));
}

/// With sixteen sessions attached the seventeenth fails with
/// `sessionLimit`; once one of them closes, the seventeenth succeeds and
/// the other fifteen stay.
#[tokio::test]
async fn only_attached_sessions_make_a_new_one_fail() {
    let t = relay().await;
    let mut open = Vec::new();
    for i in 0..CAP {
        let mut ws = t.raw("alice").await;
        let r = ws.initialize(&format!("w{i}")).await;
        assert!(r["result"]["serverSeq"].is_u64(), "{i}: {r}");
        open.push(ws);
    }
    let mut extra = t.raw("alice").await;
    let r = extra.initialize("w-extra").await;
    assert_eq!(r["error"]["code"], -32603, "{r}");
    assert_eq!(r["error"]["data"]["reason"], "sessionLimit", "{r}");
    // Another principal is not affected by alice's cap.
    let mut bob = t.raw("bob").await;
    assert!(bob.initialize("w0").await["result"].is_object());

    let first = open.remove(0);
    first.close_cleanly().await;
    let r = extra.initialize("w-extra").await;
    assert!(r["result"]["serverSeq"].is_u64(), "{r}");
    let mut ws = t.raw("alice").await;
    let gone = reconnect(&mut ws, "w0").await;
    assert_eq!(gone["error"]["code"], -32008, "{gone}");
    // The attached ones are untouched: each still answers a ping.
    for (i, ws) in open.iter_mut().enumerate() {
        let r = ws
            .request(9, "ping", json!({"channel": "ahp-root://"}))
            .await;
        assert!(r.get("error").is_none(), "w{}: {r}", i + 1);
    }
}

//! The policy is the single decision point (contract §4.4, §7.3): swapping
//! it changes what routing, listing, root and dispatch allow — here with a
//! test policy that hides one host and denies operating on another.

mod common;

use std::sync::Arc;

use ahp_relay::policy::{Permission, Policy, Subject};
use ahp_relay::route::store::Owner;
use common::relay::TestRelay;
use common::*;
use serde_json::{Value, json};

/// Hides host `b` from everyone; on host `a` only reading is allowed.
#[derive(Debug)]
struct HideBReadOnlyA;

impl Policy for HideBReadOnlyA {
    fn sees_host(&self, _who: Subject<'_>, host: &str) -> bool {
        host != "b"
    }
    fn sees_session(&self, _who: Subject<'_>, host: &str, _s: &str, _o: Option<&Owner>) -> bool {
        host != "b"
    }
    fn permits(&self, _who: Subject<'_>, _host: &str, p: Permission) -> bool {
        p == Permission::SessionsRead
    }
}

#[tokio::test]
async fn policy_decides_listing_root_routing_and_dispatch() {
    let t = TestRelay::start(vec![fast_config("a", 1), fast_config("b", 1)], "").await;
    t.relay.relay.set_policy(Arc::new(HideBReadOnlyA));
    let mut ws = t.raw("alice").await;
    ws.initialize("c").await;
    let list = ws
        .request(1, "listSessions", json!({"channel": "ahp-root://"}))
        .await;
    let uris: Vec<&str> = list["result"]["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|s| s["resource"].as_str())
        .collect();
    assert_eq!(uris, ["ahp-session:/a~a-1"], "b's sessions are invisible");
    let root = ws
        .request(2, "subscribe", json!({"channel": "ahp-root://"}))
        .await;
    let agents: Vec<&str> = root["result"]["snapshot"]["state"]["agents"]
        .as_array()
        .expect("agents")
        .iter()
        .filter_map(|a| a["provider"].as_str())
        .collect();
    assert_eq!(agents, ["sim@a"]);
    assert_eq!(root["result"]["snapshot"]["state"]["activeSessions"], 1);
    let hidden = ws
        .request(3, "subscribe", json!({"channel": "ahp-session:/b~b-1"}))
        .await;
    assert_eq!(
        hidden["error"]["code"], -32001,
        "invisible = nonexistent: {hidden}"
    );
    assert!(hidden["error"].get("data").is_none());
    let read = ws
        .request(4, "subscribe", json!({"channel": "ahp-chat:/a~a-1-main"}))
        .await;
    assert!(read.get("result").is_some(), "reading is permitted: {read}");
    let create = ws
        .request(
            5,
            "createSession",
            json!({"channel": "ahp-root://", "provider": "sim@a"}),
        )
        .await;
    assert_eq!(
        create["error"]["code"], -32602,
        "createSession needs its own channel: {create}"
    );
    let create = ws
        .request(
            6,
            "createSession",
            json!({"channel": "ahp-session:/mine", "provider": "sim@a"}),
        )
        .await;
    assert_eq!(
        create["error"]["code"], -32009,
        "visible but not permitted: {create}"
    );
    ws.send_json(
        &json!({"jsonrpc": "2.0", "method": "dispatchAction", "params": {
        "channel": "ahp-chat:/a~a-1-main", "clientSeq": 1,
        "action": {"type": "chat/draftChanged"}}}),
    )
    .await;
    let echo = ws.recv_json().await.expect("a rejection echo");
    assert_eq!(echo["method"], "action");
    assert_eq!(echo["params"]["rejectionReason"], "permission denied");
    assert_eq!(echo["params"]["origin"]["clientId"], "c");
    ws.send_json(
        &json!({"jsonrpc": "2.0", "method": "dispatchAction", "params": {
        "channel": "ahp-chat:/b~b-1-main", "clientSeq": 2,
        "action": {"type": "chat/draftChanged"}}}),
    )
    .await;
    let pong = ws
        .request(7, "ping", json!({"channel": "ahp-root://"}))
        .await;
    assert_eq!(
        pong["result"],
        Value::Null,
        "no echo for the invisible channel before the ping answer"
    );
    let to_b: Vec<_> = t.hosts[1]
        .received()
        .into_iter()
        .filter(|f| {
            f.method.as_deref() != Some("initialize") && f.method.as_deref() != Some("listSessions")
        })
        .collect();
    assert!(
        to_b.is_empty(),
        "nothing but the watch link reached host b: {to_b:?}"
    );
    let dispatched_to_a = t.hosts[0]
        .received()
        .iter()
        .any(|f| f.method.as_deref() == Some("dispatchAction"));
    assert!(!dispatched_to_a, "a denied dispatch never reaches the host");
}

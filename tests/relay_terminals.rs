//! Client-claimed terminals through the relay (issue "a real client's
//! whole day", contract §6.1): a `createTerminal` that no session claims
//! goes to the host its `cwd` names (`file://<host>/…`); input to it is
//! echoed back by that host only; another principal cannot see it.

mod common;

use common::relay::{TestRelay, rule};
use common::*;
use serde_json::{Value, json};

/// `file://<host>/<path>` for a host-local path.
fn file_uri(host: &str, path: &std::path::Path) -> String {
    format!("file://{host}{}", path.display())
}

async fn terminal_data(ws: &mut RawWs, channel: &str) -> Value {
    loop {
        let f = ws.recv_json().await.expect("frames until terminal data");
        let p = &f["params"];
        if f["method"] == "action"
            && p["channel"] == channel
            && p["action"]["type"] == "terminal/data"
        {
            return p["action"].clone();
        }
    }
}

/// The terminal lands on the host its `cwd` names (b, not a), echoes
/// input, and bob (who sees only his own objects) cannot subscribe to it.
#[tokio::test]
async fn a_client_claimed_terminal_goes_to_the_host_its_cwd_names() {
    let rules = rule("all", &["alice", "bob"], &["*"], "operator", "own", "");
    let t = TestRelay::start(vec![fast_config("a", 1), fast_config("b", 1)], &rules).await;
    let mut ws = t.raw("alice").await;
    ws.initialize("term-1").await;
    let cwd = file_uri("b", &t.hosts[1].sandbox());
    let channel = "ahp-terminal:/alice-term-1";
    let params = json!({"channel": channel,
        "claim": {"kind": "client", "clientId": "term-1"}, "cwd": cwd});
    let r = ws.request(1, "createTerminal", params).await;
    assert!(r.get("result").is_some(), "{r}");
    assert_eq!(
        host_frames(&t.hosts[1], "createTerminal").len(),
        1,
        "created on b"
    );
    assert!(
        host_frames(&t.hosts[0], "createTerminal").is_empty(),
        "not on a"
    );
    let sub = ws
        .request(2, "subscribe", json!({"channel": channel}))
        .await;
    assert!(sub["result"]["snapshot"].is_object(), "{sub}");
    let input = json!({"type": "terminal/input", "data": "echo hi\n"});
    ws.dispatch(channel, 1, input).await;
    let data = terminal_data(&mut ws, channel).await;
    assert_eq!(data["data"], "echo hi\n", "{data}");
    let mut bob = t.raw("bob").await;
    bob.initialize("term-bob").await;
    let r = bob
        .request(1, "subscribe", json!({"channel": channel}))
        .await;
    assert_eq!(r["error"]["code"], -32008, "invisible to bob: {r}");
}

/// A `cwd` naming no host (`file:///…`) with two visible hosts and no
/// default host is refused with a message that says how to name one.
#[tokio::test]
async fn a_terminal_without_a_host_is_refused_with_how_to_name_one() {
    let t = TestRelay::start(vec![fast_config("a", 1), fast_config("b", 1)], "").await;
    let mut ws = t.raw("alice").await;
    ws.initialize("term-2").await;
    let r = ws
        .request(
            1,
            "createTerminal",
            json!({"channel": "ahp-terminal:/alice-term-2",
                   "claim": {"kind": "client", "clientId": "term-2"}, "cwd": "file:///tmp"}),
        )
        .await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    let msg = r["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("file://<host id>/"), "{msg}");
    assert!(host_frames(&t.hosts[0], "createTerminal").is_empty());
    assert!(host_frames(&t.hosts[1], "createTerminal").is_empty());
}

/// A client that names no host (most clients know nothing of hosts) opens a
/// terminal where it may: with two visible hosts of which only `b` lets the
/// principal use terminals (a viewer rule on `a`), the terminal goes to `b`
/// without any configuration; a configured `relay.default_host` among the
/// usable hosts wins over that, and with two usable hosts and no default
/// the refusal says how to name one.
#[tokio::test]
async fn a_terminal_without_a_cwd_goes_where_the_principal_may_use_one() {
    let rules = rule("watch-a", &["alice"], &["a"], "viewer", "all", "")
        + &rule("work-b", &["alice"], &["b"], "operator", "all", "");
    let t = TestRelay::start(vec![fast_config("a", 1), fast_config("b", 1)], &rules).await;
    let mut ws = t.raw("alice").await;
    ws.initialize("term-3").await;
    let params = json!({"channel": "ahp-terminal:/alice-term-3",
        "claim": {"kind": "client", "clientId": "term-3"}});
    let r = ws.request(1, "createTerminal", params).await;
    assert!(r.get("result").is_some(), "{r}");
    assert_eq!(host_frames(&t.hosts[1], "createTerminal").len(), 1, "on b");
    assert!(
        host_frames(&t.hosts[0], "createTerminal").is_empty(),
        "not a"
    );

    let both = rule("both", &["alice"], &["*"], "operator", "all", "");
    let t = TestRelay::start(vec![fast_config("a", 1), fast_config("b", 1)], &both).await;
    let mut ws = t.raw("alice").await;
    ws.initialize("term-4").await;
    let params = json!({"channel": "ahp-terminal:/alice-term-4",
        "claim": {"kind": "client", "clientId": "term-4"}});
    let r = ws.request(1, "createTerminal", params).await;
    assert_eq!(
        r["error"]["code"], -32602,
        "two usable hosts, no default: {r}"
    );
}

/// The demo's configuration names a default host, so its first terminal
/// opens without a `cwd`: a `relay.default_host` among the hosts where the
/// principal may use terminals takes the terminal.
#[tokio::test]
async fn a_configured_default_host_takes_a_terminal_without_a_cwd() {
    let hosts = vec![fast_config("a", 1), fast_config("b", 1)];
    let t = TestRelay::start_tweaked(hosts, "", "", |cfg| {
        cfg.relay.default_host = Some("b".into());
    })
    .await;
    t.wait_hosts_up().await;
    let mut ws = t.raw("alice").await;
    ws.initialize("term-5").await;
    let params = json!({"channel": "ahp-terminal:/alice-term-5",
        "claim": {"kind": "client", "clientId": "term-5"}});
    let r = ws.request(1, "createTerminal", params).await;
    assert!(r.get("result").is_some(), "{r}");
    assert_eq!(host_frames(&t.hosts[1], "createTerminal").len(), 1, "on b");
}

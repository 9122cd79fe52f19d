//! Access decisions made once, by the router, from the method table
//! (contract §4.3, §7.1, issue 18): disposing what another principal
//! created needs `admin` whatever its kind, and requests routed by provider
//! go to the host that owns every name in them, translated and authorized.
//! Real sockets, simulated hosts that record every frame they receive.

mod common;

use ahp_relay::simhost::SimHost;
use common::relay::{TestRelay, rule};
use common::*;
use serde_json::{Value, json};

const ALICE_SESSION: &str = "ahp-session:/alice-s";
const ALICE_CHAT: &str = "ahp-chat:/alice-c";
const ALICE_TERM: &str = "ahp-terminal:/alice-t";

/// Frames `host` received from upstream client `from` with `method`.
fn received(host: &SimHost, from: &str, method: &str) -> Vec<Value> {
    host.received_from(from)
        .iter()
        .filter(|f| f.method.as_deref() == Some(method))
        .map(|f| serde_json::from_str(&f.text).expect("recorded frame is JSON"))
        .collect()
}

/// A raw socket of `sub`, initialized as `client_id`.
async fn peer(t: &TestRelay, sub: &str, client_id: &str) -> RawWs {
    let mut ws = t.raw(sub).await;
    let init = ws.initialize(client_id).await;
    assert!(init.get("result").is_some(), "{sub}: initialize: {init}");
    ws
}

/// Sends a request that must succeed with a `null` result.
async fn ok(ws: &mut RawWs, id: u64, method: &str, params: Value) {
    let r = ws.request(id, method, params).await;
    assert_eq!(r.get("result"), Some(&Value::Null), "{method}: {r}");
}

/// Retries `subscribe` of `channel` until it succeeds: the terminal a
/// create just made is visible to others once the watch link mirrors the
/// host's root (an observable event, not a fixed delay).
async fn subscribed_eventually(ws: &mut RawWs, first_id: u64, channel: &str) {
    let deadline = tokio::time::Instant::now() + WAIT;
    for id in first_id.. {
        let r = ws
            .request(id, "subscribe", json!({"channel": channel}))
            .await;
        if r.get("result").is_some() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{channel} never became visible: {r}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Alice (operator, own) creates a session, a chat in it and a terminal
/// claimed by it on host a; bob is operator with visibility all, ada admin.
async fn dispose_world() -> TestRelay {
    let rules = rule("alice", &["alice"], &["a"], "operator", "own", "")
        + &rule("bob", &["bob"], &["a"], "operator", "all", "")
        + &rule("ada", &["ada"], &["a"], "admin", "all", "");
    let t = TestRelay::start(vec![fast_config("a", 1)], &rules).await;
    let mut alice = peer(&t, "alice", "al").await;
    let session = json!({"channel": ALICE_SESSION, "provider": "sim.a"});
    ok(&mut alice, 1, "createSession", session).await;
    let chat = json!({"channel": ALICE_SESSION, "chat": ALICE_CHAT});
    ok(&mut alice, 2, "createChat", chat).await;
    let claim = json!({"kind": "session", "session": ALICE_SESSION, "chat": ALICE_CHAT});
    let term = json!({"channel": ALICE_TERM, "claim": claim});
    ok(&mut alice, 3, "createTerminal", term).await;
    t
}

/// §7.1 (issue 18, hole 3): bob, operator with visibility all, sees
/// alice's session, chat and terminal but may dispose none of them: each
/// is -32009 and never reaches the host, and all three are still there;
/// ada, admin, disposes the chat and the terminal.
#[tokio::test]
async fn disposing_another_principals_chat_or_terminal_needs_admin() {
    let t = dispose_world().await;
    let host = &t.hosts[0];
    let mut bob = peer(&t, "bob", "b1").await;
    subscribed_eventually(&mut bob, 10, ALICE_CHAT).await;
    subscribed_eventually(&mut bob, 100, ALICE_TERM).await;
    for (id, method, channel) in [
        (200, "disposeChat", ALICE_CHAT),
        (201, "disposeTerminal", ALICE_TERM),
        (202, "disposeSession", ALICE_SESSION),
    ] {
        let r = bob.request(id, method, json!({"channel": channel})).await;
        assert_eq!(r["error"]["code"], -32009, "bob's {method}: {r}");
    }
    let up_bob = t.upstream_id("bob", "b1");
    for method in ["disposeChat", "disposeTerminal", "disposeSession"] {
        let at_host = received(host, &up_bob, method);
        assert!(at_host.is_empty(), "bob's {method} reached the host");
    }
    assert!(host.channel_state(ALICE_CHAT).is_some(), "alice's chat");
    assert!(host.channel_state(ALICE_TERM).is_some(), "alice's terminal");
    assert!(host.session_uris().iter().any(|s| s == ALICE_SESSION));

    let mut ada = peer(&t, "ada", "d1").await;
    subscribed_eventually(&mut ada, 10, ALICE_TERM).await;
    ok(&mut ada, 200, "disposeChat", json!({"channel": ALICE_CHAT})).await;
    ok(
        &mut ada,
        201,
        "disposeTerminal",
        json!({"channel": ALICE_TERM}),
    )
    .await;
    assert!(host.channel_state(ALICE_CHAT).is_none(), "ada disposed it");
    assert!(host.channel_state(ALICE_TERM).is_none(), "ada disposed it");
}

/// §7.1: the creator disposes her own chat and terminal with the operator
/// role (the rule asks for `admin` only for what others created).
#[tokio::test]
async fn the_creator_disposes_her_own_chat_and_terminal() {
    let t = dispose_world().await;
    let host = &t.hosts[0];
    let mut alice = peer(&t, "alice", "al2").await;
    ok(&mut alice, 1, "disposeChat", json!({"channel": ALICE_CHAT})).await;
    ok(
        &mut alice,
        2,
        "disposeTerminal",
        json!({"channel": ALICE_TERM}),
    )
    .await;
    assert!(host.channel_state(ALICE_CHAT).is_none());
    assert!(host.channel_state(ALICE_TERM).is_none());
}

// ─── requests routed by provider ────────────────────────────────────────────

/// Carol operates both hosts; each has one seeded session.
async fn config_world() -> (TestRelay, RawWs, String) {
    let rules = rule("carol", &["carol"], &["h1", "h2"], "operator", "all", "");
    let hosts = vec![fast_config("h1", 1), fast_config("h2", 1)];
    let t = TestRelay::start(hosts, &rules).await;
    let ws = peer(&t, "carol", "c1").await;
    let up = t.upstream_id("carol", "c1");
    (t, ws, up)
}

/// §4.3 (issue 18, hole 4): `resolveSessionConfig` and
/// `sessionConfigCompletions` naming h1's session and an h1 directory
/// reach h1 in host names — the provider bare, the channel and the working
/// directory in h1's own form — and nothing reaches h2.
#[tokio::test]
async fn config_requests_reach_the_owning_host_in_host_names() {
    let (t, mut ws, up) = config_world().await;
    let (h1, h2) = (&t.hosts[0], &t.hosts[1]);
    let common = json!({"channel": "ahp-session:/h1~h1-1", "provider": "sim.h1",
        "workingDirectory": "file://h1/tmp/project"});
    let mut completions = common.clone();
    completions["property"] = json!("model");
    for (id, method, params) in [
        (1, "resolveSessionConfig", common.clone()),
        (2, "sessionConfigCompletions", completions),
    ] {
        // The simhost does not implement these: its answer is an error, but
        // what matters is what it received.
        ws.request(id, method, params).await;
        let got = received(h1, &up, method);
        assert_eq!(got.len(), 1, "{method} at h1: {got:?}");
        let p = &got[0]["params"];
        assert_eq!(p["channel"], "ahp-session:/h1-1", "{method}: {p}");
        assert_eq!(p["provider"], "sim", "{method}: {p}");
        assert_eq!(
            p["workingDirectory"], "file:///tmp/project",
            "{method}: {p}"
        );
        assert!(received(h2, &up, method).is_empty(), "{method} at h2");
    }
}

/// §4.3, §4.4 (issue 18, hole 4): a config request whose names disagree on
/// the host — h2's session with h1's provider, h1's session with an h2
/// directory — is -32602 and reaches no host; one naming a session that
/// does not exist answers as nonexistent (-32001).
#[tokio::test]
async fn config_requests_naming_two_hosts_are_refused() {
    let (t, mut ws, up) = config_world().await;
    for (id, params, code) in [
        (
            1,
            json!({"channel": "ahp-session:/h2~h2-1", "provider": "sim.h1"}),
            -32602,
        ),
        (
            2,
            json!({"channel": "ahp-session:/h2~h2-1", "provider": "sim.h2",
                "workingDirectory": "file://h1/tmp/project"}),
            -32602,
        ),
        (
            3,
            json!({"channel": "ahp-root://", "provider": "sim.h1",
                "workingDirectory": "file://h2/tmp/project"}),
            -32602,
        ),
        (
            4,
            json!({"channel": "ahp-session:/h2~nope", "provider": "sim.h2"}),
            -32001,
        ),
    ] {
        let r = ws.request(id, "resolveSessionConfig", params.clone()).await;
        assert_eq!(r["error"]["code"], code, "{params}: {r}");
    }
    for h in &t.hosts {
        let got = received(h, &up, "resolveSessionConfig");
        assert!(got.is_empty(), "{} received {got:?}", h.config().name);
    }
}

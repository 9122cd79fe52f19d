//! `root/configChanged` through the relay (issue "a real client's whole
//! day", contract §6.1): VS Code's client dispatches it on every connect
//! with clientSeq 0. A host-wide setting affects every user of that host,
//! so it reaches only hosts on which the principal is admin, and the client
//! gets exactly one echo — accepted if a host took it, rejected otherwise.

mod common;

use ahp_relay::simhost::SimHostConfig;
use common::relay::{TestRelay, rule};
use common::*;
use serde_json::{Value, json};

const ROOT: &str = "ahp-root://";

/// A VS Code-mode simhost (its root has a `config` clients may change).
fn vscode(name: &str) -> SimHostConfig {
    let mut cfg = fast_config(name, 1);
    cfg.vscode_compat = true;
    cfg
}

/// The next echo of the client's dispatch `client_seq` on the root channel.
async fn root_echo(ws: &mut RawWs, client_seq: i64) -> Value {
    loop {
        let f = ws
            .recv_json()
            .await
            .expect("an echo before the socket closes");
        let p = &f["params"];
        if f["method"] == "action" && p["channel"] == ROOT && p["origin"]["clientSeq"] == client_seq
        {
            return p.clone();
        }
    }
}

fn mode_on(t: &TestRelay, host: usize) -> Value {
    t.hosts[host].channel_state(ROOT).expect("root state")["config"]["values"]["mode"].clone()
}

/// Alice is admin on a and operator on b: her change reaches a only, and
/// she gets one accepted echo numbered in her own sequence.
#[tokio::test]
async fn a_config_change_reaches_only_hosts_where_the_principal_is_admin() {
    let rules = rule("admin-a", &["alice"], &["a"], "admin", "all", "")
        + &rule("ops-b", &["alice"], &["b"], "operator", "all", "");
    let t = TestRelay::start(vec![vscode("a"), vscode("b")], &rules).await;
    let mut ws = t.raw("alice").await;
    ws.initialize("cfg-1").await;
    let change = json!({"type": "root/configChanged", "config": {"mode": "ask"}});
    ws.dispatch(ROOT, 0, change).await;
    let echo = root_echo(&mut ws, 0).await;
    assert!(echo.get("rejectionReason").is_none(), "{echo}");
    assert_eq!(echo["origin"]["clientId"], "cfg-1");
    assert!(echo["serverSeq"].as_u64().is_some());
    wait_until("host a applied the change", || mode_on(&t, 0) == "ask").await;
    assert_eq!(mode_on(&t, 1), "agent", "b is untouched");
    let up = t.upstream_id("alice", "cfg-1");
    assert!(
        host_frames(&t.hosts[1], "dispatchAction").is_empty()
            && t.hosts[1].received_from(&up).is_empty(),
        "nothing reached b"
    );
}

/// Without the admin role anywhere the change is rejected by the relay and
/// reaches no host.
#[tokio::test]
async fn without_an_admin_role_the_change_is_rejected() {
    let rules = rule("ops", &["bob"], &["*"], "operator", "all", "");
    let t = TestRelay::start(vec![vscode("a")], &rules).await;
    let mut ws = t.raw("bob").await;
    ws.initialize("cfg-2").await;
    let change = json!({"type": "root/configChanged", "config": {"mode": "ask"}});
    ws.dispatch(ROOT, 0, change).await;
    let echo = root_echo(&mut ws, 0).await;
    assert!(echo["rejectionReason"].is_string(), "{echo}");
    assert!(host_frames(&t.hosts[0], "dispatchAction").is_empty());
    assert_eq!(mode_on(&t, 0), "agent");
}

//! Root-scoped resource commands through the relay (issue "a real client's
//! whole day", contract §4.3, §7.1): routed by the URI they name, a file
//! written through the relay lands on the named host only, two hosts with
//! the same path stay distinct, and URIs that name no host (or an unknown
//! one) are refused and never answered with content.

mod common;

use common::relay::{TestRelay, rule};
use common::*;
use serde_json::{Value, json};

fn file_uri(host: &str, path: &std::path::Path) -> String {
    format!("file://{host}{}", path.display())
}

async fn call(ws: &mut RawWs, id: u64, method: &str, mut params: Value) -> Value {
    params["channel"] = json!("ahp-root://");
    ws.request(id, method, params).await
}

/// The same relative path on two hosts: a write through the relay to
/// host b's file lands in b's sandbox only and reads back from b; a's file
/// of the same name is untouched.
#[tokio::test]
async fn a_file_written_through_the_relay_lands_on_the_named_host_only() {
    let t = TestRelay::start(vec![fast_config("a", 1), fast_config("b", 1)], "").await;
    let mut ws = t.raw("alice").await;
    ws.initialize("files-1").await;
    let (a_dir, b_dir) = (t.hosts[0].sandbox(), t.hosts[1].sandbox());
    std::fs::write(a_dir.join("same.txt"), "a's bytes").expect("seed a");
    std::fs::write(b_dir.join("same.txt"), "b's bytes").expect("seed b");
    let b_file = file_uri("b", &b_dir.join("same.txt"));
    let w = json!({"uri": b_file, "data": "written via relay", "encoding": "utf-8"});
    let r = call(&mut ws, 1, "resourceWrite", w).await;
    assert!(r.get("result").is_some(), "{r}");
    let on_b = std::fs::read_to_string(b_dir.join("same.txt")).expect("b's file");
    assert_eq!(on_b, "written via relay");
    let on_a = std::fs::read_to_string(a_dir.join("same.txt")).expect("a's file");
    assert_eq!(on_a, "a's bytes", "a untouched");
    let a_file = file_uri("a", &a_dir.join("same.txt"));
    let r = call(&mut ws, 2, "resourceRead", json!({"uri": a_file})).await;
    assert_eq!(r["result"]["data"], "a's bytes", "{r}");
    let r = call(&mut ws, 3, "resourceRead", json!({"uri": b_file})).await;
    assert_eq!(r["result"]["data"], "written via relay", "{r}");
}

/// `file:///etc/passwd` names no host; `file://nohost/…` names an unknown
/// one: both are refused, no host receives the request, no content comes
/// back.
#[tokio::test]
async fn files_without_a_host_or_on_an_unknown_host_are_refused() {
    let t = TestRelay::start(vec![fast_config("a", 1)], "").await;
    let mut ws = t.raw("alice").await;
    ws.initialize("files-2").await;
    let r = call(
        &mut ws,
        1,
        "resourceRead",
        json!({"uri": "file:///etc/passwd"}),
    )
    .await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    assert!(r.get("result").is_none());
    let r = call(
        &mut ws,
        2,
        "resourceRead",
        json!({"uri": "file://nohost/etc/passwd"}),
    )
    .await;
    assert_eq!(r["error"]["code"], -32008, "{r}");
    assert!(host_frames(&t.hosts[0], "resourceRead").is_empty());
}

/// A viewer (no `files:*`) cannot read a host's files: -32009, nothing
/// forwarded; a copy across hosts is refused with -32602.
#[tokio::test]
async fn files_need_their_permission_and_stay_on_one_host() {
    let rules = rule("view", &["carol"], &["*"], "viewer", "all", "")
        + &rule("admin", &["alice"], &["*"], "admin", "all", "");
    let t = TestRelay::start(vec![fast_config("a", 1), fast_config("b", 1)], &rules).await;
    let mut ws = t.raw("carol").await;
    ws.initialize("files-3").await;
    let a_file = file_uri("a", &t.hosts[0].sandbox().join("x.txt"));
    let r = call(&mut ws, 1, "resourceRead", json!({"uri": a_file})).await;
    assert_eq!(r["error"]["code"], -32009, "{r}");
    assert!(host_frames(&t.hosts[0], "resourceRead").is_empty());
    let mut alice = t.raw("alice").await;
    alice.initialize("files-4").await;
    let b_file = file_uri("b", &t.hosts[1].sandbox().join("y.txt"));
    let copy = json!({"source": a_file, "destination": b_file});
    let r = call(&mut alice, 1, "resourceCopy", copy).await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
}

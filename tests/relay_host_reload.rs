//! Hosts added and removed by a config reload (contract §8.1): an added
//! host's agents and sessions reach connected clients within seconds; a
//! removed host's sessions leave through `root/sessionRemoved`, clients
//! subscribed to its channels are resynchronised (4000) and their
//! `reconnect` gets no snapshot of them; nobody else is disconnected.

mod common;

use std::time::Duration;

use ahp_relay::simhost::SimHost;
use common::relay::TestRelay;
use common::*;
use serde_json::{Value, json};

const ROOT: &str = "ahp-root://";

/// The relay's config file with host `id` at `url` added.
fn add_host(t: &TestRelay, id: &str, url: &str) {
    let path = t.kit.dir.join("relay.toml");
    let text = std::fs::read_to_string(&path).expect("config");
    let host = format!("\n[[hosts]]\nid = \"{id}\"\nurl = \"{url}\"\nallow_plaintext = true\n");
    // Hosts are tables of their own; appending one before the policy rules
    // keeps the file valid TOML (the policy is appended after the hosts).
    let at = text.find("\n[[policy.rules]]").unwrap_or(text.len());
    std::fs::write(&path, format!("{}{host}{}", &text[..at], &text[at..])).expect("write");
}

/// The relay's config file without host `id`.
fn remove_host(t: &TestRelay, id: &str) {
    let path = t.kit.dir.join("relay.toml");
    let text = std::fs::read_to_string(&path).expect("config");
    let start = text
        .find(&format!("[[hosts]]\nid = \"{id}\""))
        .expect("host in config");
    let end = text[start + 1..]
        .find("\n[")
        .map_or(text.len(), |e| start + 2 + e);
    std::fs::write(&path, format!("{}{}", &text[..start], &text[end..])).expect("write");
}

/// Frames until one satisfies `want` within `secs` (panics after that or
/// on close).
async fn frame_where(
    ws: &mut RawWs,
    what: &str,
    secs: u64,
    want: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match ws.next_within(left).await {
            Some(Next::Frame(f)) if want(&f) => return f,
            Some(Next::Frame(_)) => {}
            other => panic!("waiting for {what}: {other:?}"),
        }
    }
}

async fn follower(t: &TestRelay, client_id: &str) -> RawWs {
    let mut ws = t.raw("alice").await;
    ws.initialize(client_id).await;
    let r = ws.request(1, "subscribe", json!({"channel": ROOT})).await;
    assert!(r.get("result").is_some(), "{r}");
    ws
}

/// A host added to the config of a running relay reaches a connected root
/// follower as a root action with its agent within 5 s of the file change
/// (the operational promise), and its sessions are listed.
#[tokio::test]
async fn an_added_host_appears_in_a_connected_clients_root() {
    let t = TestRelay::start(vec![fast_config("a", 1)], "").await;
    let mut ws = follower(&t, "reload-1").await;
    let b = SimHost::start_local(fast_config("b", 2)).await.expect("b");
    add_host(&t, "b", &b.url());
    let added = frame_where(&mut ws, "b's agent", 5, |f| {
        f["params"]["action"]["type"] == "root/agentsChanged"
            && f["params"]["action"]["agents"].as_array().is_some_and(|a| {
                a.iter()
                    .any(|x| x["provider"].as_str().is_some_and(|p| p.ends_with(".b")))
            })
    })
    .await;
    assert!(added["params"]["serverSeq"].as_u64().is_some());
    let uris = listed_uris(&mut ws, 2).await;
    assert!(
        uris.iter().any(|u| u == "ahp-session:/b~b-1")
            && uris.iter().any(|u| u == "ahp-session:/b~b-2"),
        "{uris:?}"
    );
}

/// Removing a host resynchronises exactly the clients that used it: the
/// subscriber of its session is closed with 4000 and its `reconnect`
/// gets no snapshot of the channel; a root follower stays connected and sees
/// the host's session leave.
#[tokio::test]
async fn a_removed_host_resyncs_only_its_subscribers() {
    let t = TestRelay::start(vec![fast_config("a", 1), fast_config("b", 1)], "").await;
    let mut watcher = follower(&t, "reload-watch").await;
    let mut user = t.raw("alice").await;
    user.initialize("reload-user").await;
    let r = user
        .request(1, "subscribe", json!({"channel": "ahp-session:/a~a-1"}))
        .await;
    assert!(r.get("result").is_some(), "{r}");
    remove_host(&t, "a");
    let close = tokio::time::timeout(Duration::from_secs(10), user.close_code())
        .await
        .expect("closed in time");
    assert_eq!(
        close.map(|c| c.0),
        Some(4000),
        "the host's subscriber resyncs"
    );
    let removed = frame_where(&mut watcher, "a's session removed", 10, |f| {
        f["method"] == "root/sessionRemoved"
    })
    .await;
    assert_eq!(removed["params"]["session"], "ahp-session:/a~a-1");
    let pong = watcher.request(9, "ping", json!({"channel": ROOT})).await;
    assert!(
        pong.get("result").is_some(),
        "the root follower is still connected"
    );
    let mut again = t.raw("alice").await;
    let r = raw_reconnect(
        &mut again,
        1,
        json!({"channel": ROOT, "clientId": "reload-user", "lastSeenServerSeq": 0,
               "subscriptions": ["ahp-session:/a~a-1"]}),
    )
    .await;
    assert_eq!(r["result"]["type"], "snapshot", "{r}");
    assert!(
        snapshot_resources(&r["result"]).is_empty(),
        "a's channel is gone: {r}"
    );
    assert_eq!(t.relay.relay.hubs().count(), 1);
}

//! Content references through the relay (contract §4.3, §7.1): a large
//! tool output a host holds as `ahp-content:/<id>` reaches the client
//! qualified with its host, and `resourceRead` of it goes to that host only
//! — two hosts numbering their references alike stay distinct — with no
//! more than `sessions:read` where the reference reached the client inside
//! a channel it can read; anywhere else it is as unknown as a random URI.

mod common;

use std::sync::Arc;

use ahp_relay::policy::{Grant, HostRef, PermSet, Permission, Policy, Subject, Visibility};
use common::relay::{TestRelay, admin_get, metric, rule};
use common::*;
use serde_json::{Value, json};

fn host_with_refs(name: &str) -> ahp_relay::simhost::SimHostConfig {
    let mut cfg = fast_config(name, 1);
    cfg.inline_output_max = 1000;
    cfg
}

/// Runs a turn on `chat` whose tool output is `bytes` long and returns the
/// content reference its `chat/toolCallComplete` carries.
async fn tool_output_ref(ws: &mut RawWs, chat: &str, seq: i64, bytes: usize) -> String {
    let turn = json!({"type": "chat/turnStarted", "turnId": format!("t{seq}"),
        "startedAt": ahp_relay::simhost::clock::now_iso(),
        "message": {"text": format!("build [tool-output:{bytes}]"), "origin": {"kind": "user"}}});
    ws.dispatch(chat, seq, turn).await;
    loop {
        let f = ws
            .recv_json()
            .await
            .expect("frames until the tool completes");
        let action = &f["params"]["action"];
        if f["params"]["channel"] == chat && action["type"] == "chat/toolCallComplete" {
            let content: &Value = &action["result"]["content"][0];
            assert_eq!(content["type"], "resource", "{content}");
            return content["uri"].as_str().expect("uri").to_string();
        }
    }
}

/// Each host's reference is qualified with its host and read from it
/// alone; a viewer (sessions:read only) reads it too.
#[tokio::test]
async fn a_content_reference_is_read_from_its_own_host() {
    let rules = rule("ops", &["alice"], &["*"], "operator", "all", "")
        + &rule("view", &["carol"], &["*"], "viewer", "all", "");
    let t = TestRelay::start(vec![host_with_refs("a"), host_with_refs("b")], &rules).await;
    let mut ws = t.raw("alice").await;
    ws.initialize("refs-1").await;
    let mut refs = Vec::new();
    for (i, h) in ["a", "b"].iter().enumerate() {
        let (chat, _) = seeded_chat(h, 1);
        let r = ws
            .request(10 + i as u64, "subscribe", json!({"channel": chat}))
            .await;
        assert!(r.get("result").is_some(), "{r}");
        refs.push(tool_output_ref(&mut ws, &chat, i as i64 + 1, 5000).await);
    }
    assert!(refs[0].starts_with("ahp-content:/a~"), "{refs:?}");
    assert!(refs[1].starts_with("ahp-content:/b~"), "{refs:?}");
    let read = json!({"channel": "ahp-root://", "uri": refs[1]});
    let r = ws.request(20, "resourceRead", read.clone()).await;
    assert_eq!(
        r["result"]["data"].as_str().map(str::len),
        Some(5000),
        "{r}"
    );
    assert_eq!(
        host_frames(&t.hosts[1], "resourceRead").len(),
        1,
        "read on b"
    );
    assert!(
        host_frames(&t.hosts[0], "resourceRead").is_empty(),
        "not on a"
    );
    let mut carol = t.raw("carol").await;
    carol.initialize("refs-viewer").await;
    let (chat_b, _) = seeded_chat("b", 1);
    let r = carol
        .request(1, "subscribe", json!({"channel": chat_b}))
        .await;
    assert!(
        r.to_string().contains(&refs[1]),
        "the chat's state shows the reference: {r}"
    );
    let r = carol.request(2, "resourceRead", read).await;
    assert_eq!(
        r["result"]["data"].as_str().map(str::len),
        Some(5000),
        "{r}"
    );
}

/// Tenancy of a content reference (§7.1): readable with `sessions:read`
/// only by clients it was shown to inside a channel they can read. Bob
/// (same host, `sessions:read` without `files:read`, cannot see alice's
/// session) sending the URI gets -32008 and no bytes, as for a random URI;
/// carol, who may read alice's session, gets the same -32008 until the
/// reference reaches her in its chat, and then reads it.
#[tokio::test]
async fn a_content_reference_is_readable_only_where_it_was_shown() {
    let rules = rule(
        "alice",
        &["alice"],
        &["*"],
        "viewer",
        "own",
        "permissions = [\"sessions:operate\"]",
    ) + &rule("bob", &["bob"], &["*"], "viewer", "own", "")
        + &rule("carol", &["carol"], &["*"], "viewer", "all", "");
    let t = TestRelay::start(vec![host_with_refs("a")], &rules).await;
    let mut alice = t.raw("alice").await;
    alice.initialize("tenant-alice").await;
    let session = "ahp-session:/alice-refs";
    let r = alice
        .request(
            1,
            "createSession",
            json!({"channel": session, "provider": "sim.a"}),
        )
        .await;
    assert!(r.get("error").is_none(), "{r}");
    let r = alice
        .request(2, "subscribe", json!({"channel": session}))
        .await;
    let chat = r["result"]["snapshot"]["state"]["defaultChat"]
        .as_str()
        .unwrap_or_else(|| panic!("a default chat: {r}"))
        .to_string();
    let r = alice
        .request(3, "subscribe", json!({"channel": chat}))
        .await;
    assert!(r.get("result").is_some(), "{r}");
    let content = tool_output_ref(&mut alice, &chat, 1, 5000).await;
    assert!(content.starts_with("ahp-content:/a~"), "{content}");
    let read = json!({"channel": "ahp-root://", "uri": content});
    let r = alice.request(4, "resourceRead", read.clone()).await;
    assert_eq!(
        r["result"]["data"].as_str().map(str::len),
        Some(5000),
        "{r}"
    );

    let mut bob = t.raw("bob").await;
    bob.initialize("tenant-bob").await;
    let r = bob.request(1, "resourceRead", read.clone()).await;
    assert_eq!(r["error"]["code"], -32008, "{r}");
    assert!(r.get("result").is_none(), "no bytes for bob: {r}");
    let random = json!({"channel": "ahp-root://", "uri": "ahp-content:/a~no-such-ref"});
    let r2 = bob.request(2, "resourceRead", random).await;
    assert_eq!(r["error"], r2["error"], "the same answer as a random URI");
    assert_eq!(
        host_frames(&t.hosts[0], "resourceRead").len(),
        1,
        "only alice's read reached the host"
    );

    let mut carol = t.raw("carol").await;
    carol.initialize("tenant-carol").await;
    let r = carol.request(1, "resourceRead", read.clone()).await;
    assert_eq!(r["error"]["code"], -32008, "not shown to carol yet: {r}");
    let r = carol
        .request(2, "subscribe", json!({"channel": chat}))
        .await;
    assert!(r.to_string().contains(&content), "shown in the chat: {r}");
    let r = carol.request(3, "resourceRead", read).await;
    assert_eq!(
        r["result"]["data"].as_str().map(str::len),
        Some(5000),
        "{r}"
    );
}

/// The note of shown references is bounded (`limits.seen_refs_per_session`):
/// with room for one, a second reference pushes the first out — counted —
/// and the viewer can no longer read the first with `sessions:read` alone.
#[tokio::test]
async fn the_note_of_shown_references_is_bounded_and_counted() {
    let rules = rule(
        "op",
        &["alice"],
        &["*"],
        "viewer",
        "all",
        "permissions = [\"sessions:operate\"]",
    );
    let t = TestRelay::start_tweaked(vec![host_with_refs("a")], "", &rules, |c| {
        c.limits.seen_refs_per_session = 1;
    })
    .await;
    t.wait_hosts_up().await;
    let mut ws = t.raw("alice").await;
    ws.initialize("refs-bounded").await;
    let (chat, _) = seeded_chat("a", 1);
    let r = ws.request(1, "subscribe", json!({"channel": chat})).await;
    assert!(r.get("result").is_some(), "{r}");
    let first = tool_output_ref(&mut ws, &chat, 1, 3000).await;
    let second = tool_output_ref(&mut ws, &chat, 2, 4000).await;
    assert_ne!(first, second);
    let read = |uri: &str| json!({"channel": "ahp-root://", "uri": uri});
    let r = ws.request(2, "resourceRead", read(&second)).await;
    assert_eq!(
        r["result"]["data"].as_str().map(str::len),
        Some(4000),
        "{r}"
    );
    let r = ws.request(3, "resourceRead", read(&first)).await;
    assert_eq!(r["error"]["code"], -32008, "forgotten: {r}");
    let (_, page) = admin_get(&t, "/metrics").await;
    assert!(
        metric(&page, "ahp_relay_limit_hits_total{limit=\"seen_refs\"}") >= Some(1.0),
        "the eviction is counted"
    );
}

/// The policy after the reload below: reading only, on host a only what
/// one created (so not the seeded session), on host b everything.
#[derive(Debug)]
struct SeededHiddenOnA;

impl Policy for SeededHiddenOnA {
    fn grant(&self, _who: Subject<'_>, host: HostRef<'_>) -> Option<Grant> {
        let on_a = host.id == "a";
        Some(Grant {
            permissions: PermSet::of(&[Permission::SessionsRead]),
            visibility: if on_a {
                Visibility::Own
            } else {
                Visibility::All
            },
            external: !on_a,
            dispose_others: false,
            session_files: false,
            rule: "reloaded".into(),
        })
    }
}

/// §7.6 (issue 18): a reference the client was shown is forgotten when it
/// loses sight of the chat that showed it. Alice reads the references of
/// a's and b's seeded chats (shown to her there), stops following both,
/// and a reload hides a's seeded session from her: a's reference is then
/// -32008 like a random URI and reaches no host, b's is still read.
#[tokio::test]
async fn a_reference_is_forgotten_when_its_chat_is_no_longer_visible() {
    let rules = rule("ops", &["alice"], &["*"], "operator", "all", "");
    let t = TestRelay::start(vec![host_with_refs("a"), host_with_refs("b")], &rules).await;
    let mut ws = t.raw("alice").await;
    ws.initialize("refs-reload").await;
    let read = |uri: &str| json!({"channel": "ahp-root://", "uri": uri});
    let mut refs = Vec::new();
    for (i, h) in ["a", "b"].iter().enumerate() {
        let (chat, _) = seeded_chat(h, 1);
        let r = ws
            .request(10 + i as u64, "subscribe", json!({"channel": chat}))
            .await;
        assert!(r.get("result").is_some(), "{r}");
        let content = tool_output_ref(&mut ws, &chat, i as i64 + 1, 3000).await;
        let r = ws
            .request(20 + i as u64, "resourceRead", read(&content))
            .await;
        assert_eq!(
            r["result"]["data"].as_str().map(str::len),
            Some(3000),
            "{r}"
        );
        refs.push(content);
        let unsubscribe = notification_frame("unsubscribe", json!({"channel": chat}));
        ws.send_json(&unsubscribe).await;
    }
    // The socket's frames are handled in order: both unsubscribes are done.
    let r = ws.request(30, "ping", json!({"channel": ROOT})).await;
    assert!(r.get("result").is_some(), "{r}");
    t.relay.relay.set_policy(Arc::new(SeededHiddenOnA));
    let r = ws.request(31, "resourceRead", read(&refs[0])).await;
    assert_eq!(r["error"]["code"], -32008, "forgotten with its chat: {r}");
    assert_eq!(
        host_frames(&t.hosts[0], "resourceRead").len(),
        1,
        "no new read on a"
    );
    let r = ws.request(32, "resourceRead", read(&refs[1])).await;
    assert_eq!(
        r["result"]["data"].as_str().map(str::len),
        Some(3000),
        "{r}"
    );
}

/// §7.6: an `initialize` whose initial subscription is hidden by a reload
/// while its snapshot is awaited leaves the chat out and notes nothing it
/// showed: a content reference inside that chat is as unknown to the new
/// client as a random URI. Before, the snapshot noted its references before
/// the chat was left out, so the client could read them.
#[tokio::test]
async fn an_initial_subscription_hidden_while_awaited_notes_nothing() {
    let rules = rule("ops", &["alice"], &["*"], "operator", "all", "");
    let t = TestRelay::start(vec![host_with_refs("a")], &rules).await;
    let (chat, _) = seeded_chat("a", 1);
    let mut source = t.raw("alice").await;
    source.initialize("refs-source").await;
    let r = source
        .request(1, "subscribe", json!({"channel": chat}))
        .await;
    assert!(r.get("result").is_some(), "{r}");
    let content = tool_output_ref(&mut source, &chat, 1, 3000).await;
    let upstream = t.upstream_id("alice", "refs-late");
    t.hosts[0].stall_client(&upstream, true);
    let mut ws = t.raw("alice").await;
    let params = initialize_subscribing("refs-late", &[&chat]);
    ws.send_json(&request_frame(0, "initialize", params)).await;
    wait_until("the session awaits its snapshots", || {
        t.has_session("alice", "refs-late")
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    t.relay.relay.set_policy(Arc::new(SeededHiddenOnA));
    t.hosts[0].stall_client(&upstream, false);
    let init = ws.response(&json!(0)).await;
    assert!(!init["result"].to_string().contains("a-1-main"), "{init}");
    let read = json!({"channel": "ahp-root://", "uri": content});
    let r = ws.request(1, "resourceRead", read).await;
    assert_eq!(
        r["error"]["code"], -32008,
        "as unknown as a random URI: {r}"
    );
}

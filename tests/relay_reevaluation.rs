//! Decisions follow a channel that changes hands (contract §7.6, issue 18
//! Deliver 3): a live subscription to a terminal whose claim moves to a
//! session the subscriber cannot see, or to a chat moved into such a
//! session, is closed with 4000, and the `reconnect` that follows answers
//! without it — exactly what a new `subscribe` would decide. Subscribers
//! who still see it keep it. Real sockets, one simulated host.

mod common;

use common::relay::{TestRelay, rule};
use common::*;
use serde_json::{Value, json};

const ALICE_SESSION: &str = "ahp-session:/alice-s";
const ALICE_CHAT: &str = "ahp-chat:/alice-c";
const TERMINAL: &str = "ahp-terminal:/a~1";
const SEEDED_CHAT: &str = "ahp-chat:/a~a-1-main";

/// Host a: seeded session a-1 (chat a-1-main) and terminal 1, claimed by
/// a-1's chat. alice (operator, own, external sessions shown) made a
/// session and chat of her own; bob (viewer, own, external sessions shown)
/// sees a-1 but not alice's session; carol (viewer, all) sees both.
async fn world() -> TestRelay {
    let external = "external_sessions = true";
    let rules = rule("alice", &["alice"], &["a"], "operator", "own", external)
        + &rule("bob", &["bob"], &["a"], "viewer", "own", external)
        + &rule("carol", &["carol"], &["a"], "viewer", "all", "");
    let mut host = fast_config("a", 1);
    host.terminals = 1;
    let t = TestRelay::start(vec![host], &rules).await;
    let mut alice = t.raw("alice").await;
    alice.initialize("al").await;
    for (id, method, params) in [
        (
            1,
            "createSession",
            json!({"channel": ALICE_SESSION, "provider": "sim.a"}),
        ),
        (
            2,
            "createChat",
            json!({"channel": ALICE_SESSION, "chat": ALICE_CHAT}),
        ),
    ] {
        let r = alice.request(id, method, params).await;
        assert_eq!(r.get("result"), Some(&Value::Null), "{method}: {r}");
    }
    t
}

/// `sub` initialized as `client_id` and subscribed to `channel`.
async fn subscriber(t: &TestRelay, sub: &str, client_id: &str, channel: &str) -> RawWs {
    let mut ws = t.raw(sub).await;
    ws.initialize(client_id).await;
    let r = ws
        .request(1, "subscribe", json!({"channel": channel}))
        .await;
    assert!(r.get("result").is_some(), "{sub} subscribes {channel}: {r}");
    ws
}

/// The socket closes with 4000; frames before the close are skipped.
async fn closed_4000(ws: &mut RawWs, who: &str) {
    loop {
        match ws.next_or_close().await {
            Next::Frame(_) => {}
            Next::Closed(c) => {
                assert_eq!(c.as_ref().map(|c| c.0), Some(4000), "{who}: closed {c:?}");
                return;
            }
        }
    }
}

/// alice moves a-1's chat into her own session (answered).
async fn alice_moves_the_seeded_chat(t: &TestRelay) {
    let mut alice = t.raw("alice").await;
    alice.initialize("al2").await;
    let to = json!({"kind": "session", "session": ALICE_SESSION});
    let params = json!({"channel": SEEDED_CHAT, "destination": to});
    let moved = alice.request(1, "moveChat", params).await;
    assert_eq!(moved["result"]["session"], ALICE_SESSION, "{moved}");
}

/// `sub`'s `reconnect` of `client_id` asking for `channel`: the answer
/// leaves it out, and subscribing it anew answers as nonexistent.
async fn reconnect_without(t: &TestRelay, sub: &str, client_id: &str, channel: &str) {
    let mut ws = t.raw(sub).await;
    let r = raw_reconnect(&mut ws, 1, reconnect_params(client_id, 0, &[channel])).await;
    assert_eq!(r["result"]["type"], "snapshot", "{r}");
    assert!(snapshot_resources(&r["result"]).is_empty(), "{r}");
    let again = ws
        .request(2, "subscribe", json!({"channel": channel}))
        .await;
    assert!(
        again.get("error").is_some(),
        "{sub} subscribes again: {again}"
    );
}

/// §7.6: the host hands terminal 1 from a-1's chat to alice's session.
/// bob, who saw it only through a-1, is closed with 4000 and reconnects
/// without it; carol, who sees alice's session, keeps her subscription.
#[tokio::test]
async fn a_terminal_claimed_for_an_invisible_session_closes_its_subscription() {
    let t = world().await;
    let mut bob = subscriber(&t, "bob", "b1", TERMINAL).await;
    let mut carol = subscriber(&t, "carol", "c1", TERMINAL).await;
    let claim = json!({"kind": "session", "session": ALICE_SESSION, "chat": ALICE_CHAT});
    assert!(t.hosts[0].claim_terminal("ahp-terminal:/1", &claim));
    closed_4000(&mut bob, "bob").await;
    reconnect_without(&t, "bob", "b1", TERMINAL).await;
    // carol got the claim change, and her socket stays open.
    let claimed = frames_until(&mut carol, |v| {
        v["method"] == "action" && v["params"]["action"]["type"] == "terminal/claimed"
    })
    .await;
    let last = claimed.last().expect("the claim");
    assert_eq!(last["params"]["channel"], TERMINAL, "{last}");
    frames_before_ping(&mut carol, 9).await;
}

/// §7.6: alice moves a-1's chat into her own session. bob, who saw it
/// through a-1, is closed with 4000 and reconnects without it; carol keeps
/// it.
#[tokio::test]
async fn a_chat_moved_to_an_invisible_session_closes_its_subscription() {
    let t = world().await;
    let mut bob = subscriber(&t, "bob", "b1", SEEDED_CHAT).await;
    let mut carol = subscriber(&t, "carol", "c1", SEEDED_CHAT).await;
    alice_moves_the_seeded_chat(&t).await;
    closed_4000(&mut bob, "bob").await;
    reconnect_without(&t, "bob", "b1", SEEDED_CHAT).await;
    let pong = carol
        .request(9, "fetchTurns", json!({"channel": SEEDED_CHAT}))
        .await;
    assert!(pong.get("result").is_some(), "carol keeps the chat: {pong}");
}

/// §7.6 across the change: once alice's `moveChat` is answered, the chat
/// is decided by its new session at once, though the host's summary
/// changes (which list it there) are still on their way to the watch
/// link: bob's live subscription is closed with 4000 and a new `subscribe`
/// of his answers as nonexistent, instead of a snapshot of a chat now in a
/// session he cannot see.
#[tokio::test]
async fn a_moved_chat_is_decided_by_its_new_session_before_the_host_lists_it() {
    let t = world().await;
    let mut bob = subscriber(&t, "bob", "b1", SEEDED_CHAT).await;
    t.hosts[0].hold_catalog_events(true);
    alice_moves_the_seeded_chat(&t).await;
    closed_4000(&mut bob, "bob").await;
    let mut again = t.raw("bob").await;
    again.initialize("b2").await;
    let r = again
        .request(1, "subscribe", json!({"channel": SEEDED_CHAT}))
        .await;
    assert!(
        r.get("error").is_some(),
        "bob subscribes the moved chat: {r}"
    );
    t.hosts[0].hold_catalog_events(false);
    reconnect_without(&t, "bob", "b1", SEEDED_CHAT).await;
}

/// §6.1, §7.6 (found by `tests/relay_model.rs`): a terminal claimed by a
/// session that is then disposed is claimed by nothing anyone can see —
/// it leaves the root of those who saw it and their subscription is
/// closed with 4000, once the dispose's tombstone is written (until then
/// the relay counts the session as created and not listed yet).
#[tokio::test]
async fn a_terminal_whose_claiming_session_is_disposed_leaves_its_followers() {
    let t = world().await;
    let claim = json!({"kind": "session", "session": ALICE_SESSION, "chat": ALICE_CHAT});
    assert!(t.hosts[0].claim_terminal("ahp-terminal:/1", &claim));
    let mut carol = t.raw("carol").await;
    let init = carol
        .request(0, "initialize", initialize_subscribing("c1", &[ROOT]))
        .await;
    let terminals = &snapshot_of(&init["result"], ROOT)["state"]["terminals"];
    assert_eq!(terminals[0]["resource"], TERMINAL, "{init}");
    let r = carol
        .request(1, "subscribe", json!({"channel": TERMINAL}))
        .await;
    assert!(r.get("result").is_some(), "{r}");
    let mut alice = t.raw("alice").await;
    alice.initialize("al2").await;
    let r = alice
        .request(1, "disposeSession", json!({"channel": ALICE_SESSION}))
        .await;
    assert_eq!(r["result"], Value::Null, "{r}");
    let before = frames_until(&mut carol, |v| {
        v["method"] == "action"
            && v["params"]["action"]["type"] == "root/terminalsChanged"
            && v["params"]["action"]["terminals"] == json!([])
    })
    .await;
    assert!(!before.is_empty());
    closed_4000(&mut carol, "carol").await;
    reconnect_without(&t, "carol", "c1", TERMINAL).await;
}

/// alice (client `alice_id`) creates terminal `term` claimed by her chat;
/// carol (client `carol_id`) subscribes to it once the watch link mirrors
/// the host's root. Returns both sockets.
async fn carol_follows_alices_terminal(
    t: &TestRelay,
    term: &str,
    alice_id: &str,
    carol_id: &str,
) -> (RawWs, RawWs) {
    let mut alice = t.raw("alice").await;
    alice.initialize(alice_id).await;
    let claim = json!({"kind": "session", "session": ALICE_SESSION, "chat": ALICE_CHAT});
    let r = alice
        .request(
            1,
            "createTerminal",
            json!({"channel": term, "claim": claim}),
        )
        .await;
    assert_eq!(r["result"], Value::Null, "{r}");
    let mut carol = t.raw("carol").await;
    carol.initialize(carol_id).await;
    let mut id = 1;
    while carol
        .request(id, "subscribe", json!({"channel": term}))
        .await
        .get("result")
        .is_none()
    {
        id += 1;
        assert!(id < 500, "the terminal never became visible to carol");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    (alice, carol)
}

/// alice disposes `term` (request 2) and the relay writes its tombstone.
async fn dispose_and_tombstone(t: &TestRelay, alice: &mut RawWs, term: &str) {
    let r = alice
        .request(2, "disposeTerminal", json!({"channel": term}))
        .await;
    assert_eq!(r["result"], Value::Null, "{r}");
    let store = t.relay.relay.store.clone();
    wait_until("the dispose tombstoned the terminal", || {
        store
            .lookup(term)
            .ok()
            .flatten()
            .is_some_and(|e| matches!(e.state, ahp_relay::names::store::UriState::Tombstone { .. }))
    })
    .await;
}

/// §7.6: only a channel that changed hands closes its subscribers — a
/// terminal that is merely disposed does not: carol, subscribed to
/// alice's terminal, stays connected once the relay has re-evaluated the
/// host's terminal subscribers after the dispose (its tombstone written).
#[tokio::test]
async fn a_disposed_terminal_closes_nobody() {
    let t = world().await;
    let term = "ahp-terminal:/alice-t";
    let (mut alice, mut carol) = carol_follows_alices_terminal(&t, term, "al2", "c1").await;
    dispose_and_tombstone(&t, &mut alice, term).await;
    for n in 0..5 {
        frames_before_ping(&mut carol, 1000 + n).await;
    }
}

/// §7.6, the dispose's two paths interleaved the other way: the host's
/// root action that drops the terminal is held on the watch link while the
/// dispose's answer writes the tombstone, so the relay re-evaluates the
/// terminal's subscribers while its mirror still lists the terminal. Gone
/// is not moved: carol stays connected then, and once the watch link
/// delivers the removal. (Without the distinction the relay closed her
/// with 4000 whenever the answer won the race.)
#[tokio::test]
async fn a_terminal_disposed_before_the_host_root_says_so_closes_nobody() {
    let t = world().await;
    let term = "ahp-terminal:/alice-t2";
    let (mut alice, mut carol) = carol_follows_alices_terminal(&t, term, "al3", "c3").await;
    let watch = ahp_relay::upstream::watch::watch_client_id();
    let hub = t.relay.relay.hub("a").expect("hub");
    t.hosts[0].stall_client(watch, true);
    dispose_and_tombstone(&t, &mut alice, term).await;
    assert!(
        hub.terminal_claim(term).is_some(),
        "the held watch link still lists the terminal"
    );
    for n in 0..3 {
        frames_before_ping(&mut carol, 1000 + n).await;
    }
    t.hosts[0].stall_client(watch, false);
    wait_until("the watch link delivered the removal", || {
        hub.terminal_claim(term).is_none()
    })
    .await;
    for n in 3..6 {
        frames_before_ping(&mut carol, 1000 + n).await;
    }
}

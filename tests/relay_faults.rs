//! Host faults through the relay (contract §5.8, scenario S8): a host that
//! restarts during a turn closes its clients with 4000 (continuity lost);
//! their `reconnect` gets fresh snapshots by re-baselining and converges,
//! while the other host's chat keeps streaming to the same client.

mod common;

use std::time::Duration;

use ahp_types::actions::ActionEnvelope;
use common::relay::TestRelay;
use common::*;
use serde_json::{Value, json};

fn slow(name: &str) -> ahp_relay::simhost::SimHostConfig {
    host(name, 1, script(60, 8, 40))
}

/// The host's chat state with its own name replaced by the client's.
fn host_chat(t: &TestRelay, i: usize, host_uri: &str, client_uri: &str) -> Value {
    let mut s = t.hosts[i].channel_state(host_uri).expect("host chat");
    s["resource"] = json!(client_uri);
    s
}

/// The S8 chats of hosts a and b, in client names.
const S8_CHATS: (&str, &str) = ("ahp-chat:/a~a-1-main", "ahp-chat:/b~b-1-main");

/// What S8's client saw until host a restarted mid-turn.
struct S8Run {
    t: TestRelay,
    /// How the client's socket closed.
    close: Option<(u16, String)>,
    /// Every envelope it got before, in order.
    seen: Vec<ActionEnvelope>,
    /// Both chats' snapshot states reduced by `seen`.
    state_a: Value,
    state_b: Value,
}

/// Runs S8 until the client's socket closes: a client subscribed to both
/// hosts' chats starts a slow turn on each; once a's streams, host a
/// restarts (keeping its state).
async fn s8_run() -> S8Run {
    let t = TestRelay::start(vec![slow("a"), slow("b")], "").await;
    let (chat_a, chat_b) = S8_CHATS;
    let mut ws = t.raw("alice").await;
    ws.initialize("s8").await;
    let sa = ws.request(1, "subscribe", json!({"channel": chat_a})).await;
    let sb = ws.request(2, "subscribe", json!({"channel": chat_b})).await;
    let (state_a, state_b) = (
        sa["result"]["snapshot"]["state"].clone(),
        sb["result"]["snapshot"]["state"].clone(),
    );
    ws.send_json(&start_turn_frame(chat_a, 1, "ta")).await;
    ws.send_json(&start_turn_frame(chat_b, 2, "tb")).await;
    // Let both turns stream a little, then restart host a.
    let before = raw_actions_until(&mut ws, |e| is(e, chat_a, "chat/delta")).await;
    t.hosts[0].restart(true);
    let mut seen = before;
    let close = loop {
        match ws.next_or_close().await {
            Next::Frame(v) if v["method"] == "action" => {
                seen.push(serde_json::from_value(v["params"].clone()).expect("envelope"))
            }
            Next::Frame(_) => {}
            Next::Closed(c) => break c,
        }
    };
    S8Run {
        state_a: reduce_chat(&state_a, chat_a, &seen),
        state_b: reduce_chat(&state_b, chat_b, &seen),
        t,
        close,
        seen,
    }
}

/// S8 (§5.8): a host that restarts during a turn closes its clients with
/// 4000 (continuity lost); until then both hosts' chats streamed in one
/// strictly increasing sequence, both turns running.
#[tokio::test]
async fn s8_a_host_restart_mid_turn_closes_its_clients_with_4000() {
    let run = s8_run().await;
    assert_eq!(
        run.close.map(|c| c.0),
        Some(4000),
        "resync: continuity with host a lost"
    );
    assert_strictly_increasing(&run.seen);
    assert!(
        run.state_a.get("activeTurn").is_some(),
        "a's turn was running when a restarted"
    );
    assert!(
        run.state_b.get("activeTurn").is_some(),
        "b's turn was running too"
    );
}

/// S8 (§5.5, §5.8): the closed client's `reconnect` gets snapshots by
/// re-baselining, continuing its sequence: host a's chat as the restarted
/// host has it (the turn ended), while host b's turn keeps streaming after
/// the snapshot and converges on b's chat.
#[tokio::test]
async fn s8_after_a_host_restart_reconnect_resyncs_and_the_other_host_keeps_streaming() {
    let S8Run { t, seen, .. } = s8_run().await;
    let (chat_a, chat_b) = S8_CHATS;
    let watermark = seen
        .last()
        .map(|e| e.server_seq)
        .expect("envelopes before the restart");
    let mut ws = t.raw("alice").await;
    let r = reconnect(&mut ws, 9, "s8", json!(watermark), &[chat_a, chat_b]).await;
    assert_eq!(
        r["result"]["type"], "snapshot",
        "continuity with a was lost: {r}"
    );
    let snaps = r["result"]["snapshots"].as_array().expect("snapshots");
    let snap = |uri: &str| {
        snaps
            .iter()
            .find(|s| s["resource"] == uri)
            .cloned()
            .unwrap_or_else(|| panic!("snapshot of {uri}: {r}"))
    };
    let from = snap(chat_a)["fromSeq"].as_u64().expect("fromSeq");
    assert!(from >= watermark, "one sequence across the reconnect");
    assert_eq!(
        snap(chat_a)["state"],
        host_chat(&t, 0, "ahp-chat:/a-1-main", chat_a),
        "a's chat as the restarted host has it"
    );
    assert!(
        snap(chat_a)["state"].get("activeTurn").is_none(),
        "the restart ended a's turn"
    );
    // b's turn keeps streaming after the reconnect and converges.
    let mut state_b = snap(chat_b)["state"].clone();
    let after = raw_actions_until(&mut ws, |e| is(e, chat_b, "chat/turnComplete")).await;
    assert!(
        after.iter().all(|e| e.server_seq > from),
        "numbered after the snapshot"
    );
    assert_strictly_increasing(&after);
    state_b = reduce_chat(&state_b, chat_b, &after);
    // The host applies `chat/turnComplete` before it sends it: its chat is
    // final once the client has it.
    assert_eq!(
        state_b,
        host_chat(&t, 1, "ahp-chat:/b-1-main", chat_b),
        "b converges"
    );
}

/// A dropped link resumes by upstream `reconnect` (§5.8): the host replays
/// what the link missed, the client sees one unbroken sequence and no
/// resync, and its state converges with the host's.
#[tokio::test]
async fn dropped_link_resumes_by_upstream_replay_without_resync() {
    let t = TestRelay::start(vec![slow("a")], "").await;
    let chat = "ahp-chat:/a~a-1-main";
    let mut ws = t.raw("alice").await;
    ws.initialize("blip").await;
    let s = ws.request(1, "subscribe", json!({"channel": chat})).await;
    let mut state = s["result"]["snapshot"]["state"].clone();
    ws.send_json(&start_turn_frame(chat, 1, "t1")).await;
    let mut seen = raw_actions_until(&mut ws, |e| action_type(e) == "chat/delta").await;
    let upstream = t.upstream_id("alice", "blip");
    assert_eq!(
        t.hosts[0].drop_client(&upstream),
        1,
        "the link's connection is cut"
    );
    seen.extend(raw_actions_until(&mut ws, |e| action_type(e) == "chat/turnComplete").await);
    assert_strictly_increasing(&seen);
    let numbers: Vec<u64> = seen.iter().map(|e| e.server_seq).collect();
    assert!(
        numbers.windows(2).all(|w| w[1] == w[0] + 1),
        "no gap in the client's sequence across the cut: {numbers:?}"
    );
    let deltas = seen
        .iter()
        .filter(|e| action_type(e) == "chat/delta")
        .count();
    assert_eq!(deltas, 60, "every delta exactly once");
    state = reduce_chat(&state, chat, &seen);
    // Final at the host once the client has `chat/turnComplete`.
    assert_eq!(state, host_chat(&t, 0, "ahp-chat:/a-1-main", chat));
    // A `reconnect` arrives before its connection has a clientId: match the text.
    let reconnects = t.hosts[0]
        .received()
        .iter()
        .filter(|f| f.method.as_deref() == Some("reconnect") && f.text.contains(&upstream))
        .count();
    assert_eq!(
        reconnects, 1,
        "the link resumed with one upstream reconnect"
    );
    let pong = ws
        .request(9, "ping", json!({"channel": "ahp-root://"}))
        .await;
    assert_eq!(pong["result"], Value::Null, "the client socket stayed open");
}

/// §5.7: a detached session whose buffer evicts closes its links at once
/// (the client will need snapshots anyway), without waiting for the grace.
#[tokio::test]
async fn detached_session_closes_links_when_its_buffer_evicts() {
    let t = TestRelay::start(
        vec![slow("a")],
        "\n[limits]\nreplay_buffer_envelopes = 8\ndetach_grace_secs = 60\n",
    )
    .await;
    let chat = "ahp-chat:/a~a-1-main";
    let mut ws = t.raw("alice").await;
    ws.initialize("evict").await;
    ws.request(1, "subscribe", json!({"channel": chat})).await;
    ws.send_json(&start_turn_frame(chat, 1, "t1")).await;
    raw_actions_until(&mut ws, |e| action_type(e) == "chat/delta").await;
    let links_before = t.hosts[0].connections();
    assert_eq!(links_before, 2, "watch link + the session's link");
    drop(ws);
    let host = &t.hosts[0];
    wait_until("the link closes although the grace is 60 s", || {
        host.connections() == 1
    })
    .await;
    let mut ws = t.raw("alice").await;
    let r = reconnect(&mut ws, 2, "evict", json!(0), &[chat]).await;
    assert_eq!(r["result"]["type"], "snapshot", "{r}");
}

/// S16: host a is down while a client reconnects: host b's channel comes
/// back at once (a's is omitted, not waited for), and when a returns the
/// client is resynchronised (4000) so its next `reconnect` recovers a's
/// channel too.
#[tokio::test]
async fn host_down_during_reconnect_then_back_recovers() {
    let mut t = TestRelay::start(vec![fast_config("a", 1), fast_config("b", 1)], "").await;
    let (chat_a, chat_b) = ("ahp-chat:/a~a-1-main", "ahp-chat:/b~b-1-main");
    let mut ws = t.raw("alice").await;
    ws.initialize("s16").await;
    let sa = ws.request(1, "subscribe", json!({"channel": chat_a})).await;
    ws.request(2, "subscribe", json!({"channel": chat_b})).await;
    let watermark = sa["result"]["snapshot"]["fromSeq"]
        .as_u64()
        .expect("fromSeq");
    let a_cfg = t.hosts[0].config().clone();
    let a_addr = t.hosts[0].addr();
    t.hosts.remove(0).shutdown().await;
    // The link to a cannot resume: the client is resynchronised.
    let close = loop {
        match ws.next_or_close().await {
            Next::Frame(_) => {}
            Next::Closed(c) => break c,
        }
    };
    assert_eq!(close.map(|c| c.0), Some(4000));

    let mut ws = t.raw("alice").await;
    let started = std::time::Instant::now();
    let r = reconnect(&mut ws, 3, "s16", json!(watermark), &[chat_a, chat_b]).await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "a down host does not delay the answer"
    );
    assert_eq!(r["result"]["type"], "snapshot", "{r}");
    assert_eq!(
        snapshot_resources(&r["result"]),
        [chat_b],
        "b's channel now, a's omitted while a is down"
    );

    // a comes back on the same address: the client is told to reconnect.
    let back = ahp_relay::simhost::SimHost::start(a_cfg, a_addr)
        .await
        .expect("a restarts");
    let close = loop {
        match ws.next_or_close().await {
            Next::Frame(_) => {}
            Next::Closed(c) => break c,
        }
    };
    assert_eq!(close.map(|c| c.0), Some(4000), "resync when a is back");
    let mut ws = t.raw("alice").await;
    let r = reconnect(&mut ws, 4, "s16", json!(watermark), &[chat_a, chat_b]).await;
    let mut got: Vec<String> = r["result"]["snapshots"]
        .as_array()
        .expect("snapshots")
        .iter()
        .filter_map(|s| s["resource"].as_str().map(str::to_string))
        .collect();
    got.sort();
    assert_eq!(got, [chat_a, chat_b], "both channels recovered: {r}");
    let a_state = r["result"]["snapshots"]
        .as_array()
        .and_then(|v| v.iter().find(|s| s["resource"] == chat_a))
        .map(|s| s["state"].clone())
        .expect("a's snapshot");
    let mut host_state = back.channel_state("ahp-chat:/a-1-main").expect("a's chat");
    host_state["resource"] = json!(chat_a);
    assert_eq!(a_state, host_state);
}

/// Sends `reconnect` for `client_id` with `watermark` and `channels`; returns the answer.
async fn reconnect(
    ws: &mut RawWs,
    id: u64,
    client_id: &str,
    watermark: Value,
    channels: &[&str],
) -> Value {
    ws.request(
        id,
        "reconnect",
        reconnect_params(client_id, watermark, channels),
    )
    .await
}

/// §5.7 `link_idle`: a link with no subscription, request or active-client
/// registration closes after `link_idle_secs`; one that still carries a
/// subscription, or whose client registered in `activeClients`, stays.
#[tokio::test]
async fn idle_links_close_and_busy_links_stay() {
    let t = TestRelay::start(
        vec![fast_config("a", 1), fast_config("b", 1)],
        "[limits]\nlink_idle_secs = 1\n",
    )
    .await;
    let watch_only = |h: &ahp_relay::simhost::SimHost| h.connections();
    let (base_a, base_b) = (watch_only(&t.hosts[0]), watch_only(&t.hosts[1]));
    let mut ws = t.raw("alice").await;
    ws.initialize("idle").await;
    for (id, ch) in [(1, "ahp-session:/a~a-1"), (2, "ahp-session:/b~b-1")] {
        let r = ws.request(id, "subscribe", json!({"channel": ch})).await;
        assert!(r.get("result").is_some(), "{r}");
    }
    assert_eq!(watch_only(&t.hosts[0]), base_a + 1, "a link to a");
    assert_eq!(watch_only(&t.hosts[1]), base_b + 1, "a link to b");
    ws.send_json(&notification_frame(
        "unsubscribe",
        json!({"channel": "ahp-session:/a~a-1"}),
    ))
    .await;
    wait_until("a's unused link closes", || {
        t.hosts[0].connections() == base_a
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        t.hosts[1].connections(),
        base_b + 1,
        "b's link carries a subscription: it stays"
    );
    ws.dispatch(
        "ahp-session:/a~a-1",
        1,
        json!({"type": "session/activeClientSet", "activeClient": {"clientId": "idle", "tools": []}}),
    )
    .await;
    wait_until("a new link to a", || t.hosts[0].connections() == base_a + 1).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        t.hosts[0].connections(),
        base_a + 1,
        "a registered active client keeps its link"
    );
    let metrics = t.relay.relay.metrics.links_idle_closed.get();
    assert_eq!(metrics, 1, "one idle close counted");
}

/// §3.6 `links_per_host`: when a host already carries that many per-client
/// links, another client's first request for it fails fast with -32603
/// `hostLinkLimit` (retryable) and reaches no host; a freed link frees the slot.
#[tokio::test]
async fn links_per_host_are_capped() {
    let t = TestRelay::start(
        vec![fast_config("a", 1)],
        "[limits]\nlinks_per_host = 1\nlink_idle_secs = 1\n",
    )
    .await;
    let mut alice = t.raw("alice").await;
    alice.initialize("one").await;
    let r = alice
        .request(1, "subscribe", json!({"channel": "ahp-session:/a~a-1"}))
        .await;
    assert!(r.get("result").is_some(), "{r}");
    let mut bob = t.raw("bob").await;
    bob.initialize("two").await;
    let r = bob
        .request(1, "subscribe", json!({"channel": "ahp-session:/a~a-1"}))
        .await;
    assert_eq!(r["error"]["code"], -32603, "{r}");
    assert_eq!(r["error"]["data"]["reason"], "hostLinkLimit", "{r}");
    assert_eq!(r["error"]["data"]["retryable"], true, "{r}");
    alice
        .send_json(&notification_frame(
            "unsubscribe",
            json!({"channel": "ahp-session:/a~a-1"}),
        ))
        .await;
    let mut id = 2;
    loop {
        let r = bob
            .request(id, "subscribe", json!({"channel": "ahp-session:/a~a-1"}))
            .await;
        if r.get("result").is_some() {
            break;
        }
        assert_eq!(r["error"]["data"]["reason"], "hostLinkLimit", "{r}");
        assert!(id < 60, "alice's idle link never freed the slot");
        id += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// §5.8: a per-client link whose host stays silent after a ping (here: a
/// stalled host) is declared dead after `link_ping_timeout_secs` and
/// re-dialed, rather than waiting on a half-open connection forever.
#[tokio::test]
async fn a_silent_link_is_declared_dead_and_redialed() {
    let t = TestRelay::start(
        vec![fast_config("a", 1)],
        "[limits]\nlink_ping_secs = 1\nlink_ping_timeout_secs = 1\n",
    )
    .await;
    let mut ws = t.raw("pinger").await;
    ws.initialize("silent").await;
    let r = ws
        .request(1, "subscribe", json!({"channel": "ahp-chat:/a~a-1-main"}))
        .await;
    assert!(r.get("result").is_some(), "{r}");
    let dials = |t: &TestRelay| {
        t.hosts[0]
            .handshakes()
            .iter()
            .filter(|h| h.user_subject.as_deref() == Some("pinger"))
            .count()
    };
    assert_eq!(dials(&t), 1, "one link");
    t.hosts[0].set_stalled(true);
    // A stalled host still completes handshakes (it stops reading and
    // writing only on open connections): the re-dial shows while the old
    // link's host is still silent, so only the ping timeout can cause it.
    wait_until("the silent link is re-dialed", || dials(&t) >= 2).await;
    t.hosts[0].set_stalled(false);
}

/// §5.2, §5.8: a channel subscribed on a link after that link's last
/// envelope has a snapshot numbered above the link's watermark; when the
/// link resumes by upstream `reconnect` from that watermark, the host's
/// replay carries the channel's actions the snapshot already contains.
/// The client must get none of them again: its chat, reduced from the
/// snapshot and everything after it, ends equal to the host's (S13 seed 80
/// failed this way: a delta and a tool call applied twice).
#[tokio::test]
async fn resumed_link_replays_nothing_a_later_snapshot_contains() {
    let t = TestRelay::start(vec![fast_config("a", 2)], "").await;
    let (quiet, busy) = ("ahp-chat:/a~a-1-main", "ahp-chat:/a~a-2-main");
    let mut ws = t.raw("alice").await;
    ws.initialize("floor").await;
    // The link opens on a chat that stays quiet: its watermark stays put.
    ws.request(1, "subscribe", json!({"channel": quiet})).await;
    // Another client's turn on the busy chat, which this link does not
    // follow yet: the host numbers it above the link's watermark.
    let mut other = t.raw("alice").await;
    other.initialize("other").await;
    other
        .request(1, "subscribe", json!({"channel": busy}))
        .await;
    other.send_json(&start_turn_frame(busy, 1, "t-other")).await;
    raw_actions_until(&mut other, |e| action_type(e) == "chat/turnComplete").await;
    let s = ws.request(2, "subscribe", json!({"channel": busy})).await;
    let snapshot = s["result"]["snapshot"].clone();
    assert!(
        snapshot["state"]["turns"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["id"] == "t-other")),
        "the snapshot contains the other client's turn: {s}"
    );
    let upstream = t.upstream_id("alice", "floor");
    assert_eq!(t.hosts[0].drop_client(&upstream), 1, "the link is cut");
    wait_until("the link resumes by upstream reconnect", || {
        t.hosts[0]
            .received()
            .iter()
            .any(|f| f.method.as_deref() == Some("reconnect") && f.text.contains(&upstream))
    })
    .await;
    ws.send_json(&start_turn_frame(busy, 3, "t-after")).await;
    let seen = raw_actions_until(&mut ws, |e| {
        e.channel == busy && action_type(e) == "chat/turnComplete"
    })
    .await;
    let on_busy: Vec<ActionEnvelope> = seen.into_iter().filter(|e| e.channel == busy).collect();
    let from = snapshot["fromSeq"].as_u64().expect("fromSeq");
    assert!(on_busy.iter().all(|e| e.server_seq > from));
    assert_strictly_increasing(&on_busy);
    let state = reduce_chat(&snapshot["state"], busy, &on_busy);
    assert_eq!(
        state,
        host_chat(&t, 0, "ahp-chat:/a-2-main", busy),
        "nothing the snapshot held was applied again: {:?}",
        on_busy.iter().map(action_type).collect::<Vec<_>>()
    );
}

/// §5.8, §5.9: a `subscribe` whose answer is lost with its link (the host
/// took the subscription, then the connection dropped) fails with
/// `upstreamLost` and leaves nothing held: the link resumes by replay
/// without that channel among its subscriptions, and the session's
/// subscription slot is free again (a hold left behind kept the channel's
/// every envelope, unbounded, and counted against the cap).
#[tokio::test]
async fn a_subscribe_lost_with_its_link_leaves_nothing_held() {
    let t = TestRelay::start(
        vec![fast_config("a", 2)],
        "\n[limits]\nsubscriptions_per_session = 2\n",
    )
    .await;
    let (quiet, lost) = ("ahp-chat:/a~a-1-main", "ahp-chat:/a~a-2-main");
    let mut ws = t.raw("alice").await;
    ws.initialize("lost").await;
    ws.request(1, "subscribe", json!({"channel": quiet})).await;
    let upstream = t.upstream_id("alice", "lost");
    t.hosts[0].drop_instead_of_answering(&upstream, "subscribe");
    let r = ws.request(2, "subscribe", json!({"channel": lost})).await;
    assert_eq!(r["error"]["code"], -32603, "{r}");
    assert_eq!(r["error"]["data"]["reason"], "upstreamLost", "{r}");
    let resumes = || -> Vec<String> {
        t.hosts[0]
            .received()
            .iter()
            .filter(|f| f.method.as_deref() == Some("reconnect") && f.text.contains(&upstream))
            .map(|f| f.text.to_string())
            .collect()
    };
    wait_until("the link resumes", || !resumes().is_empty()).await;
    let resume = &resumes()[0];
    assert!(resume.contains("a-1-main"), "{resume}");
    assert!(
        !resume.contains("a-2-main"),
        "the lost subscribe's channel is not resumed: {resume}"
    );
    let again = ws.request(3, "subscribe", json!({"channel": lost})).await;
    assert_eq!(
        again["result"]["snapshot"]["resource"], lost,
        "the slot is free and the channel can be subscribed: {again}"
    );
}

/// Stalls the host's reading of `upstream`'s connections, sends a subscribe
/// of `channel` as each request id of `ids` and waits until the relay has
/// forwarded them all (each began its hold): the host answers none of them
/// before `stall_client(upstream, false)`.
async fn subscribes_waiting_at_host(
    t: &TestRelay,
    ws: &mut RawWs,
    (upstream, channel): (&str, &str),
    ids: &[u64],
) {
    t.hosts[0].stall_client(upstream, true);
    let before = t.requests_handled("subscribe");
    for &id in ids {
        ws.send_json(&request_frame(id, "subscribe", json!({"channel": channel})))
            .await;
    }
    wait_until("the subscribes are forwarded", || {
        t.requests_handled("subscribe") == before + ids.len() as u64
    })
    .await;
}

/// A subscribe that fails ends only its own hold: when a client subscribes
/// a channel twice before the host answers and the host refuses the first
/// and answers the second, the channel is followed after the second's
/// snapshot — its envelopes reach the client. Before, the first's error
/// removed the hold the second had put in its place, the second's snapshot
/// found no hold to release, and the channel's envelopes were dropped
/// while the client believed it subscribed.
#[tokio::test]
async fn a_failed_subscribe_leaves_a_later_subscribe_of_its_channel_followed() {
    let t = TestRelay::start(vec![fast_config("a", 1)], "").await;
    let chat = "ahp-chat:/a~a-1-main";
    let mut ws = t.raw("alice").await;
    ws.initialize("twice").await;
    // Open the link, then hold the host's reading so both subscribes are
    // on their way before it answers either.
    let r = ws.request(1, "subscribe", json!({"channel": ROOT})).await;
    assert!(r.get("result").is_some(), "{r}");
    let upstream = t.upstream_id("alice", "twice");
    ws.request(2, "fetchTurns", json!({"channel": chat})).await;
    subscribes_waiting_at_host(&t, &mut ws, (&upstream, chat), &[3, 4]).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    t.hosts[0].fail_instead_of_answering(&upstream, "subscribe");
    t.hosts[0].stall_client(&upstream, false);
    let answers = ws.responses(&[json!(3), json!(4)]).await;
    assert_eq!(answers[0]["error"]["code"], -32603, "{}", answers[0]);
    assert_eq!(
        answers[1]["result"]["snapshot"]["resource"], chat,
        "{}",
        answers[1]
    );
    ws.dispatch(chat, 1, turn_started("t-twice", "hello")).await;
    let envs = raw_actions_until(&mut ws, |e| e.channel == chat).await;
    let echo = envs.last().expect("an envelope of the chat");
    assert_eq!(
        echo.origin.as_ref().map(|o| o.client_seq),
        Some(1),
        "the client's own dispatch is echoed on the channel: {echo:?}"
    );
}

/// A subscribe whose socket closed before the host answered leaves nothing
/// held while the session waits detached for its client: the snapshot is
/// dropped (counted as a stale answer), the hold ends, and the host is told
/// the session does not follow the channel — before, the hold stayed and
/// kept every envelope of the channel until the client came back or the
/// session expired. The client's `reconnect` still gets the channel.
#[tokio::test]
async fn a_subscribe_answered_after_its_socket_closed_holds_nothing() {
    let t = TestRelay::start(vec![fast_config("a", 1)], "").await;
    let chat = "ahp-chat:/a~a-1-main";
    let mut ws = t.raw("alice").await;
    let init = ws.initialize("left").await;
    let s0 = init["result"]["serverSeq"].clone();
    ws.request(1, "fetchTurns", json!({"channel": chat})).await;
    let upstream = t.upstream_id("alice", "left");
    subscribes_waiting_at_host(&t, &mut ws, (&upstream, chat), &[2]).await;
    ws.close_cleanly().await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    t.hosts[0].stall_client(&upstream, false);
    let unsubscribed = || {
        t.hosts[0]
            .received_from(&upstream)
            .iter()
            .any(|f| f.method.as_deref() == Some("unsubscribe") && f.text.contains("a-1-main"))
    };
    wait_until("the host is told the channel is not followed", unsubscribed).await;
    let (_, page) = common::relay::admin_get(&t, "/metrics").await;
    assert_eq!(
        common::relay::metric(&page, "ahp_relay_stale_answers_total"),
        Some(1.0)
    );
    let mut back = t.raw("alice").await;
    let r = raw_reconnect(
        &mut back,
        1,
        json!({"clientId": "left", "lastSeenServerSeq": s0, "subscriptions": [chat]}),
    )
    .await;
    assert_eq!(r["result"]["type"], "snapshot", "{r}");
    assert_eq!(snapshot_resources(&r["result"]), vec![chat.to_string()]);
}

/// A second subscribe of a channel the client follows that fails gives the
/// channel back as it was: envelopes that arrived while the second
/// subscribe was held are delivered after its error, and the channel goes
/// on live. Before, the error removed the channel's state altogether and
/// its envelopes were dropped while the client, subscribed by the first
/// subscribe, believed it followed the channel.
#[tokio::test]
async fn a_failed_second_subscribe_leaves_the_channel_followed() {
    let t = TestRelay::start(vec![fast_config("a", 1)], "").await;
    let chat = "ahp-chat:/a~a-1-main";
    let mut alice = t.raw("alice").await;
    alice.initialize("resub").await;
    let s = alice
        .request(1, "subscribe", json!({"channel": chat}))
        .await;
    assert_eq!(s["result"]["snapshot"]["resource"], chat, "{s}");
    let mut bob = t.raw("bob").await;
    bob.initialize("turns").await;
    bob.request(1, "subscribe", json!({"channel": chat})).await;
    let upstream = t.upstream_id("alice", "resub");
    t.hosts[0].fail_instead_of_answering(&upstream, "subscribe");
    subscribes_waiting_at_host(&t, &mut alice, (&upstream, chat), &[2]).await;
    // A whole turn runs while alice's second subscribe waits at the host.
    bob.dispatch(chat, 1, turn_started("t-resub", "hello"))
        .await;
    raw_actions_until(&mut bob, |e| is(e, chat, "chat/turnComplete")).await;
    t.hosts[0].stall_client(&upstream, false);
    let mut frames = Vec::new();
    let answer = loop {
        let v = alice.recv_json().await.expect("socket open");
        if v["id"] == 2 {
            break v;
        }
        frames.push(v);
    };
    assert_eq!(answer["error"]["code"], -32603, "{answer}");
    assert!(
        frames.iter().all(|f| f["method"] != "action"),
        "the held envelopes follow the answer: {frames:?}"
    );
    let envs: Vec<ActionEnvelope> =
        raw_actions_until(&mut alice, |e| is(e, chat, "chat/turnComplete")).await;
    assert!(
        envs.iter().any(|e| is(e, chat, "chat/turnStarted")),
        "the whole turn reaches alice after the error: {envs:?} (before it: {frames:?})"
    );
    assert_strictly_increasing(&envs);
}

/// A second subscribe of a followed channel answered after its socket
/// closed gives the channel back as it was: what the host sent meanwhile is
/// numbered for the detached session, and the client's `replay` carries
/// it. Before, the channel stayed held for a snapshot nobody would write
/// while `reconnect` still counted it as continuous: the replay answered
/// without the turn, and the channel delivered nothing after.
#[tokio::test]
async fn a_second_subscribe_answered_after_its_socket_closed_keeps_the_channel_continuous() {
    let t = TestRelay::start(vec![fast_config("a", 1)], "").await;
    let chat = "ahp-chat:/a~a-1-main";
    let mut alice = t.raw("alice").await;
    alice.initialize("gone-resub").await;
    let s = alice
        .request(1, "subscribe", json!({"channel": chat}))
        .await;
    let watermark = s["result"]["snapshot"]["fromSeq"].clone();
    let mut bob = t.raw("bob").await;
    bob.initialize("turns-2").await;
    bob.request(1, "subscribe", json!({"channel": chat})).await;
    let upstream = t.upstream_id("alice", "gone-resub");
    subscribes_waiting_at_host(&t, &mut alice, (&upstream, chat), &[2]).await;
    alice.close_cleanly().await;
    bob.dispatch(chat, 1, turn_started("t-gone", "hello")).await;
    raw_actions_until(&mut bob, |e| is(e, chat, "chat/turnComplete")).await;
    t.hosts[0].stall_client(&upstream, false);
    let answered = || {
        t.hosts[0]
            .received_from(&upstream)
            .iter()
            .filter(|f| f.method.as_deref() == Some("subscribe"))
            .count()
            == 2
    };
    wait_until("the host reads the second subscribe", answered).await;
    let stale = || async {
        let (_, page) = common::relay::admin_get(&t, "/metrics").await;
        common::relay::metric(&page, "ahp_relay_stale_answers_total")
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while stale().await != Some(1.0) {
        assert!(std::time::Instant::now() < deadline, "no stale answer");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut back = t.raw("alice").await;
    let r = raw_reconnect(
        &mut back,
        1,
        json!({"clientId": "gone-resub", "lastSeenServerSeq": watermark,
            "subscriptions": [chat]}),
    )
    .await;
    assert_eq!(r["result"]["type"], "replay", "{r}");
    let envs = envelopes(&r["result"]["actions"]);
    assert!(
        envs.iter().any(|e| is(e, chat, "chat/turnStarted"))
            && envs.iter().any(|e| is(e, chat, "chat/turnComplete")),
        "the replay carries the turn run meanwhile: {envs:?}"
    );
}

/// A subscribe that times out ends only its own hold: a client following a
/// channel subscribes it twice more while the host reads nothing; the first
/// of the two times out while the second still waits, and the second's
/// snapshot then leaves the channel followed — a turn the client starts
/// after it is echoed to her. Before holds had tickets, the timeout removed
/// the hold the second subscribe had put in its place, the second's
/// snapshot found nothing to release, and the channel's envelopes were
/// dropped while the client believed it subscribed.
#[tokio::test]
async fn a_timed_out_subscribe_ends_only_its_own_hold() {
    let t = TestRelay::start_tweaked(vec![fast_config("a", 1)], "", "", |cfg| {
        cfg.limits.upstream_request_secs = 2;
    })
    .await;
    t.wait_hosts_up().await;
    let chat = "ahp-chat:/a~a-1-main";
    let mut alice = t.raw("alice").await;
    alice.initialize("late").await;
    let s = alice
        .request(1, "subscribe", json!({"channel": chat}))
        .await;
    assert_eq!(s["result"]["snapshot"]["resource"], chat, "{s}");
    let mut bob = t.raw("bob").await;
    bob.initialize("runner").await;
    bob.request(1, "subscribe", json!({"channel": chat})).await;
    let upstream = t.upstream_id("alice", "late");
    subscribes_waiting_at_host(&t, &mut alice, (&upstream, chat), &[2]).await;
    // Half the timeout later the third is sent: it still waits, with a
    // second to go, when the second times out.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = t.requests_handled("subscribe");
    alice
        .send_json(&request_frame(3, "subscribe", json!({"channel": chat})))
        .await;
    wait_until("the third subscribe is forwarded", || {
        t.requests_handled("subscribe") == before + 1
    })
    .await;
    let second = alice.response(&json!(2)).await;
    assert_eq!(second["error"]["data"]["reason"], "timeout", "{second}");
    // A turn runs while the third waits; the host reads it afterwards.
    bob.dispatch(chat, 1, turn_started("t-held", "hello")).await;
    raw_actions_until(&mut bob, |e| is(e, chat, "chat/turnComplete")).await;
    t.hosts[0].stall_client(&upstream, false);
    let mut before_answer = Vec::new();
    let third = loop {
        let v = alice.recv_json().await.expect("socket open");
        if v["id"] == 3 {
            break v;
        }
        before_answer.push(v);
    };
    assert_eq!(third["result"]["snapshot"]["resource"], chat, "{third}");
    assert!(
        before_answer.iter().all(|f| f["method"] != "action"),
        "the turn run meanwhile is held for the snapshot, not delivered: {before_answer:?}"
    );
    assert!(
        third.to_string().contains("t-held"),
        "the turn run meanwhile is in the snapshot: {third}"
    );
    alice
        .dispatch(chat, 1, turn_started("t-after", "again"))
        .await;
    let envs = raw_actions_until(&mut alice, |e| is(e, chat, "chat/turnComplete")).await;
    assert!(
        envs.iter()
            .any(|e| e.origin.as_ref().map(|o| o.client_seq) == Some(1)),
        "alice's own dispatch is echoed on the channel: {envs:?}"
    );
    assert!(
        !envs
            .iter()
            .any(|e| serde_json::to_string(e).is_ok_and(|s| s.contains("t-held"))),
        "what the snapshot holds is not delivered again: {envs:?}"
    );
    assert_strictly_increasing(&envs);
}

/// A subscribe answered after the client unsubscribed its channel answers
/// the request but leaves the channel unfollowed and without a baseline: a
/// `reconnect` listing it gets a snapshot with what the host ran on it
/// since. Before, the late answer baselined the channel as if followed and
/// the `reconnect` got a `replay` without that turn.
#[tokio::test]
async fn a_subscribe_answered_after_its_unsubscribe_leaves_no_baseline() {
    let t = TestRelay::start(vec![fast_config("a", 1)], "").await;
    let chat = "ahp-chat:/a~a-1-main";
    let mut alice = t.raw("alice").await;
    let init = alice.initialize("changed-mind").await;
    let s0 = init["result"]["serverSeq"].clone();
    alice
        .request(1, "fetchTurns", json!({"channel": chat}))
        .await;
    let upstream = t.upstream_id("alice", "changed-mind");
    subscribes_waiting_at_host(&t, &mut alice, (&upstream, chat), &[2]).await;
    let unsubscribe =
        json!({"jsonrpc": "2.0", "method": "unsubscribe", "params": {"channel": chat}});
    alice.send_json(&unsubscribe).await;
    // The unsubscribe is handled before the request read after it.
    alice.request(3, "listSessions", json!({})).await;
    t.hosts[0].stall_client(&upstream, false);
    let answer = alice.response(&json!(2)).await;
    assert_eq!(
        answer["result"]["snapshot"]["resource"], chat,
        "the request is answered: {answer}"
    );
    t.run_turn(("bob", "runner-2"), chat, "t-unfollowed").await;
    alice.close_cleanly().await;
    let mut back = t.raw("alice").await;
    let r = raw_reconnect(
        &mut back,
        1,
        json!({"clientId": "changed-mind", "lastSeenServerSeq": s0, "subscriptions": [chat]}),
    )
    .await;
    assert_eq!(r["result"]["type"], "snapshot", "{r}");
    assert!(
        snapshot_of(&r["result"], chat)
            .to_string()
            .contains("t-unfollowed"),
        "{r}"
    );
}

/// A relay whose replay buffers hold 64 KiB, in front of one host whose
/// turns stream 200 deltas of 512 bytes (more than a buffer holds).
async fn small_buffers() -> TestRelay {
    let t = TestRelay::start_tweaked(vec![host("a", 1, script(200, 512, 0))], "", "", |cfg| {
        cfg.limits.replay_buffer_bytes = 64 * 1024;
    })
    .await;
    t.wait_hosts_up().await;
    t
}

/// Alice's frames up to the answer to request `id`, and that answer.
async fn frames_then_answer(ws: &mut RawWs, id: u64) -> (Vec<Value>, Value) {
    let mut frames = Vec::new();
    loop {
        let v = ws.recv_json().await.expect("socket open");
        if v["id"] == id {
            return (frames, v);
        }
        frames.push(v);
    }
}

/// Sends alice's subscribe 2 of `chat`, which the host carries out and never
/// answers, while bob runs turn `turn_id` on the channel; returns alice's
/// frames before the answer to 2, and the answer.
async fn subscribe_while_flooded(
    t: &TestRelay,
    alice: &mut RawWs,
    (upstream, chat): (&str, &str),
    (bob, turn_id): (&str, &str),
) -> (Vec<Value>, Value) {
    t.hosts[0].silent_instead_of_answering(upstream, "subscribe");
    let before = t.requests_handled("subscribe");
    alice
        .send_json(&request_frame(2, "subscribe", json!({"channel": chat})))
        .await;
    wait_until("the subscribe is read", || {
        t.requests_handled("subscribe") == before + 1
    })
    .await;
    t.run_turn(("bob", bob), chat, turn_id).await;
    frames_then_answer(alice, 2).await
}

/// A hold is bounded by the replay buffer: when a host streams a followed
/// channel while it never answers a second subscribe of it, the subscribe
/// fails with -32603 `holdLimit` once the hold passes the bound, and the
/// channel goes on live — the whole turn reaches the client in order, the
/// envelopes held so far first. Before, the hold kept every envelope until
/// the subscribe timed out, without bound.
#[tokio::test]
async fn a_hold_past_the_replay_bound_fails_its_subscribe_and_keeps_the_channel() {
    let t = small_buffers().await;
    let chat = "ahp-chat:/a~a-1-main";
    let mut alice = t.raw("alice").await;
    alice.initialize("flooded").await;
    let s = alice
        .request(1, "subscribe", json!({"channel": chat}))
        .await;
    assert_eq!(s["result"]["snapshot"]["resource"], chat, "{s}");
    let upstream = t.upstream_id("alice", "flooded");
    let (frames, answer) =
        subscribe_while_flooded(&t, &mut alice, (&upstream, chat), ("flooder", "t-flood")).await;
    assert_eq!(answer["error"]["data"]["reason"], "holdLimit", "{answer}");
    assert!(
        frames.iter().all(|f| f["method"] != "action"),
        "the held envelopes follow the answer: {frames:?}"
    );
    whole_turn_after_one_hold_hit(&t, &mut alice, chat).await;
}

/// Reads `ws` up to the end of the 200-delta turn on `chat` and checks the
/// whole turn arrived, every delta once, in order, with one hold limit hit.
async fn whole_turn_after_one_hold_hit(t: &TestRelay, ws: &mut RawWs, chat: &str) {
    let envs = raw_actions_until(ws, |e| is(e, chat, "chat/turnComplete")).await;
    assert!(
        envs.iter().any(|e| is(e, chat, "chat/turnStarted")),
        "the whole turn arrives: {} envelopes",
        envs.len()
    );
    assert_eq!(
        envs.iter().filter(|e| is(e, chat, "chat/delta")).count(),
        200,
        "every delta of the turn, none twice"
    );
    assert_strictly_increasing(&envs);
    let (_, page) = common::relay::admin_get(t, "/metrics").await;
    assert_eq!(
        common::relay::metric(&page, r#"ahp_relay_limit_hits_total{limit="hold"}"#),
        Some(1.0),
        "the hold limit hit counted once"
    );
}

/// A first subscribe whose hold passes the replay bound (the host streams
/// the channel but never answers) fails with `holdLimit`, nothing of the
/// channel reaches the client, and the host is told to unsubscribe it.
#[tokio::test]
async fn a_first_subscribe_whose_hold_passes_the_bound_leaves_nothing_followed() {
    let t = small_buffers().await;
    let chat = "ahp-chat:/a~a-1-main";
    let mut alice = t.raw("alice").await;
    alice.initialize("flooded-first").await;
    alice
        .request(1, "fetchTurns", json!({"channel": chat}))
        .await;
    let upstream = t.upstream_id("alice", "flooded-first");
    let flood = ("flooder-2", "t-flood-2");
    let (frames, answer) = subscribe_while_flooded(&t, &mut alice, (&upstream, chat), flood).await;
    assert_eq!(answer["error"]["data"]["reason"], "holdLimit", "{answer}");
    wait_until("the host is told the channel is not followed", || {
        t.hosts[0]
            .received_from(&upstream)
            .iter()
            .any(|f| f.method.as_deref() == Some("unsubscribe") && f.text.contains("a-1-main"))
    })
    .await;
    let after = frames_before_ping(&mut alice, 9).await;
    assert!(
        frames.iter().chain(&after).all(|f| f["method"] != "action"),
        "nothing of the channel reaches alice: {frames:?} {after:?}"
    );
}

/// A `reconnect`'s cut hold is bounded too: while the cut waits for one
/// host's re-baselining (host b stalled) and the other host streams a
/// followed chat past the replay bound, the session's links stop reading
/// until the answer is written — counted as a hold limit hit — and then go
/// on from where they paused: the whole turn reaches the client after the
/// answer, every delta once, in order. Before, the cut kept everything the
/// host sent until the settle deadline, without bound.
#[tokio::test]
async fn a_reconnect_cut_past_the_replay_bound_pauses_its_links() {
    let flooding = |name| host(name, 1, script(200, 512, 0));
    let t = TestRelay::start_tweaked(vec![flooding("a"), flooding("b")], "", "", |cfg| {
        cfg.limits.replay_buffer_bytes = 64 * 1024;
    })
    .await;
    t.wait_hosts_up().await;
    let (chat_a, chat_b) = S8_CHATS;
    let mut alice = t.raw("alice").await;
    alice.initialize("cut-flooded").await;
    for (id, chat) in [(1, chat_a), (2, chat_b)] {
        let s = alice
            .request(id, "subscribe", json!({"channel": chat}))
            .await;
        assert_eq!(s["result"]["snapshot"]["resource"], chat, "{s}");
    }
    let upstream = t.upstream_id("alice", "cut-flooded");
    alice.close_cleanly().await;
    t.hosts[1].stall_client(&upstream, true);
    // An `initialize` is recorded before it names its client.
    let inits = || {
        let received = t.hosts[0].received();
        let initialize = Some("initialize");
        let of_alice = |f: &&ahp_relay::simhost::FrameRecord| f.text.contains(&upstream);
        let inits = received
            .iter()
            .filter(|f| f.method.as_deref() == initialize);
        inits.filter(of_alice).count()
    };
    let before = inits();
    let mut back = t.raw("alice").await;
    let params = reconnect_params("cut-flooded", 0, &[chat_a, chat_b]);
    back.send_json(&request_frame(1, "reconnect", params)).await;
    wait_until("host a re-baselines alice's link", || inits() > before).await;
    t.run_turn(("bob", "cut-flooder"), chat_a, "t-cut").await;
    let (frames, answer) = frames_then_answer(&mut back, 1).await;
    assert!(frames.is_empty(), "the answer is the cut: {frames:?}");
    assert_eq!(answer["result"]["type"], "snapshot", "{answer}");
    let snapshot = snapshot_of(&answer["result"], chat_a).to_string();
    assert!(
        !snapshot.contains("t-cut"),
        "taken before the turn: {snapshot}"
    );
    whole_turn_after_one_hold_hit(&t, &mut back, chat_a).await;
    t.hosts[1].stall_client(&upstream, false);
}

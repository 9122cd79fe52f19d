//! `reconnect` through the relay (contract §5.1, §5.5–5.7; scenarios S5, S6,
//! S7, S7b): `replay` from the relay's own buffer only when it is provably
//! complete, `snapshot` by re-baselining links otherwise, supersede and
//! identity, the detach lifetime, and a relay restart seen by a client and
//! by the SDK's `MultiHostClient`. Real TLS sockets, simulated hosts; raw
//! sockets where the order of frames on the wire is the point (the
//! `reconnect` answer is the cut: nothing live is written before it).
//!
//! Host states are compared in client names: seeded host URIs qualified
//! `<scheme>:/<host>~<id>`, providers `<p>.<host>` (see `common::names`).

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ahp::hosts::{
    Backoff, HostConfig, HostEvent, HostEventStream, HostId, HostState, HostSubscriptionStream,
    MultiHostClient, ReconnectPolicy,
};
use ahp::{
    BoxedTransport, ClientConfig, HostedResourceKey, MultiHostStateMirror, SubscriptionEvent,
    TransportError,
};
use ahp_relay::simhost::SimHost;
use ahp_relay::upstream::dial::DialOptions;
use ahp_types::actions::ActionEnvelope;
use common::relay::TestRelay;
use common::*;
use serde_json::{Value, json};

// ─── helpers ────────────────────────────────────────────────────────────────

/// The `turnId` of an envelope's action, if it has one.
fn turn_of(e: &ActionEnvelope) -> Option<String> {
    serde_json::to_value(&e.action)
        .ok()?
        .get("turnId")?
        .as_str()
        .map(str::to_string)
}

fn deltas(envs: &[ActionEnvelope], channel: &str) -> usize {
    envs.iter().filter(|e| is(e, channel, "chat/delta")).count()
}

/// Recorded frames (parsed) from index `from` on.
fn frames_since(h: &SimHost, from: usize) -> Vec<(u64, Value)> {
    h.received()
        .iter()
        .skip(from)
        .map(|f| {
            (
                f.conn,
                serde_json::from_str(&f.text).expect("recorded frame is JSON"),
            )
        })
        .collect()
}

/// An error response's code.
fn error_code(r: &Value) -> i64 {
    r["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("expected an error response: {r}"))
}

// ─── S5: replay ─────────────────────────────────────────────────────────────

/// S5: a client dropped abruptly mid-turn `reconnect`s after 1 s with its last serverSeq and gets `replay`, `missing: []`, as its first frame; replayed then live envelopes are numbered watermark+1, +2, … with no gap or repeat, the turn's 150 deltas arrive exactly once, and the reduced chat equals the host's.
#[tokio::test]
async fn s5_drop_mid_turn_then_replay_continues_exactly_after_the_watermark() {
    const DELTAS: u32 = 150;
    let t = TestRelay::start(vec![host("a", 1, script(DELTAS, 16, 50))], "").await;
    let (chat, host_chat) = seeded_chat("a", 1);
    let a = t.client("alice").await;
    let mut events = a.events();
    let init = a
        .initialize("s5".into(), vec!["1.0.0".into()], vec![])
        .await
        .expect("initialize");
    let s0 = u64::try_from(init.server_seq).expect("S0 is non-negative");
    let snap = subscribe_raw(&a, &chat).await;
    assert_eq!(snapshot_from_seq(&snap), s0, "nothing numbered yet");
    a.dispatch(chat.clone(), action(turn_started("s5-turn", "go")))
        .await
        .expect("dispatch");
    let mut seen = 0;
    let before = actions_until(&mut events, |e| {
        seen += usize::from(is(e, &chat, "chat/delta"));
        seen == 10
    })
    .await;
    assert_contiguous(&before, s0);
    let watermark = before.last().expect("envelopes before the drop").server_seq;
    // Abrupt drop: the transport goes away without a close frame. The
    // client comes back once the relay has detached it and buffered more
    // of the turn (~0.2 s of 3 s of streaming), so the replay has content
    // and the turn is still streaming.
    drop(events);
    drop(a);
    let away = t.session("alice", "s5");
    wait_until("the relay buffered the turn while s5 is away", || {
        let s = away.lock();
        s.socket_id().is_none() && s.buffered_since(watermark).0.len() >= 10
    })
    .await;

    let mut b = t.raw("alice").await;
    let r = raw_reconnect(
        &mut b,
        1,
        reconnect_params("s5", json!(watermark), &[chat.as_str()]),
    )
    .await;
    let result = &r["result"];
    assert_eq!(result["type"], "replay", "{r}");
    assert_eq!(result["missing"], json!([]), "{r}");
    let replayed = envelopes(&result["actions"]);
    assert!(
        !replayed.is_empty(),
        "the turn streamed while the client was away"
    );
    assert_contiguous(&replayed, watermark);
    assert!(
        !replayed.iter().any(|e| is(e, &chat, "chat/turnComplete")),
        "the turn was still streaming at the reconnect (machine too slow?)"
    );
    let last_replayed = replayed.last().map_or(watermark, |e| e.server_seq);
    let mut live = raw_actions_until(&mut b, |e| is(e, &chat, "chat/turnComplete")).await;
    live.extend(raw_settle(&mut b, 2, &[&chat]).await);
    assert!(deltas(&live, &chat) > 0, "live deltas after the reconnect");
    assert_contiguous(&live, last_replayed);

    let all: Vec<ActionEnvelope> = [before, replayed, live].concat();
    assert_contiguous(&all, s0);
    assert!(all.iter().all(|e| e.channel == chat), "only the chat");
    assert_eq!(deltas(&all, &chat), DELTAS as usize, "each delta once");
    let reduced = reduce_chat(&snap["state"], &chat, &all);
    assert_eq!(reduced, host_state(&t.hosts[0], &host_chat, &[]));
    assert_eq!(reduced["turns"][0]["id"], "s5-turn", "{reduced}");
}

// ─── S6: snapshot by re-baselining ──────────────────────────────────────────

/// S6's scenario: with `replay_buffer_envelopes = 8`, a client that saw
/// the first 5 deltas of a turn leaves for a second (~50 envelopes are
/// numbered meanwhile) and reconnects on a raw socket for the root and the
/// chat.
struct S6Run {
    t: TestRelay,
    /// The client's socket after the reconnect, and the answer.
    ws: RawWs,
    r: Value,
    watermark: u64,
    /// The host record's length before the reconnect.
    mark: usize,
    /// The connection of the client's first link at the host.
    first_conn: u64,
}

/// `initialize` frames at the host from upstream client `up`, with their connection.
fn inits_of(frames: &[(u64, Value)], up: &str) -> Vec<(u64, Value)> {
    frames
        .iter()
        .filter(|(_, f)| f["method"] == "initialize" && f["params"]["clientId"] == up)
        .cloned()
        .collect()
}

/// Runs S6's scenario.
async fn s6_run() -> S6Run {
    let t = TestRelay::start(
        vec![host("a", 1, script(100, 16, 50))],
        "[limits]\nreplay_buffer_envelopes = 8\n",
    )
    .await;
    let (chat, _) = seeded_chat("a", 1);
    let a = t.client("alice").await;
    let mut events = a.events();
    let init = a
        .initialize("s6".into(), vec!["1.0.0".into()], vec![ROOT.into()])
        .await
        .expect("initialize");
    let s0 = u64::try_from(init.server_seq).expect("S0");
    subscribe_raw(&a, &chat).await;
    a.dispatch(chat.clone(), action(turn_started("s6-turn", "go")))
        .await
        .expect("dispatch");
    let mut seen = 0;
    let before = actions_until(&mut events, |e| {
        seen += usize::from(is(e, &chat, "chat/delta"));
        seen == 5
    })
    .await;
    assert_contiguous(&before, s0);
    let watermark = before.last().expect("envelopes").server_seq;
    let h = &t.hosts[0];
    let first_link = inits_of(&frames_since(h, 0), &t.upstream_id("alice", "s6"));
    assert_eq!(first_link.len(), 1, "one link so far: {first_link:?}");
    drop(events);
    drop(a);
    // More envelopes are numbered while away than the buffer holds: the
    // relay has evicted past the watermark.
    let away = t.session("alice", "s6");
    wait_until("s6's buffer evicted past its watermark", || {
        !away.lock().buffered_since(watermark).1
    })
    .await;
    let mark = h.received().len();
    let mut ws = t.raw("alice").await;
    let r = raw_reconnect(
        &mut ws,
        1,
        reconnect_params("s6", json!(watermark), &[ROOT, chat.as_str()]),
    )
    .await;
    S6Run {
        first_conn: first_link[0].0,
        t,
        ws,
        r,
        watermark,
        mark,
    }
}

/// S6 (§5.5): a client away while more than the buffer's 8 envelopes are
/// numbered gets `snapshot` with exactly one snapshot each for the chat
/// and the root, sharing one `fromSeq` above watermark + 8; live envelopes
/// continue at `fromSeq + 1` and the reduced chat equals the host's.
#[tokio::test]
async fn s6_a_client_past_the_buffer_gets_snapshots_and_converges() {
    let S6Run {
        t,
        ws: mut b,
        r,
        watermark,
        ..
    } = s6_run().await;
    let (chat, host_chat) = seeded_chat("a", 1);
    let h = &t.hosts[0];
    let result = &r["result"];
    assert_eq!(result["type"], "snapshot", "{r}");
    assert_eq!(
        snapshot_resources(result),
        [chat.as_str(), ROOT],
        "one snapshot per requested channel: {r}"
    );
    let from = snapshot_from_seq(snapshot_of(result, &chat));
    assert_eq!(snapshot_from_seq(snapshot_of(result, ROOT)), from, "{r}");
    assert!(
        from > watermark + 8,
        "fromSeq {from} continues the sequence past watermark {watermark} + the 8 buffered"
    );
    let chat_snap = snapshot_of(result, &chat)["state"].clone();
    assert!(
        chat_snap.get("activeTurn").is_some(),
        "snapshot taken mid-turn (machine too slow?): {chat_snap}"
    );
    let mut live = raw_actions_until(&mut b, |e| is(e, &chat, "chat/turnComplete")).await;
    live.extend(raw_settle(&mut b, 2, &[&chat]).await);
    assert_contiguous(&live, from);
    assert!(deltas(&live, &chat) > 0, "live deltas after the snapshot");
    let reduced = reduce_chat(&chat_snap, &chat, &live);
    assert_eq!(
        reduced,
        host_state(h, &host_chat, &[]),
        "converges on the host"
    );
}

/// S6 (§5.7): the snapshots come from re-baselining upstream: a new link
/// (same upstream id, another connection) whose `initialize` carries the
/// chat in `initialSubscriptions`; no `subscribe` or `unsubscribe` of it
/// is sent.
#[tokio::test]
async fn s6_snapshots_come_from_a_new_link_initialized_with_the_channel() {
    let run = s6_run().await;
    assert_eq!(run.r["result"]["type"], "snapshot", "{}", run.r);
    let (_, host_chat) = seeded_chat("a", 1);
    let h = &run.t.hosts[0];
    let (up, mark) = (run.t.upstream_id("alice", "s6"), run.mark);
    let upstream = frames_since(h, mark);
    let relinks = inits_of(&upstream, &up);
    assert_eq!(relinks.len(), 1, "one new link: {relinks:?}");
    let (conn, init) = &relinks[0];
    assert_ne!(*conn, run.first_conn, "a new connection");
    let initial: Vec<&str> = init["params"]["initialSubscriptions"]
        .as_array()
        .expect("initialSubscriptions")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(initial.contains(&host_chat.as_str()), "{init}");
    let resubscribed: Vec<&Value> = upstream
        .iter()
        .map(|(_, f)| f)
        .filter(|f| {
            (f["method"] == "subscribe" || f["method"] == "unsubscribe")
                && f["params"]["channel"] == host_chat
        })
        .collect();
    assert!(
        resubscribed.is_empty(),
        "re-baselining never (un)subscribes: {resubscribed:?}"
    );
}

// ─── baseline, watermark window ─────────────────────────────────────────────

/// §5.5 baseline: with an in-range watermark, `reconnect` for the subscribed chat alone gets `replay` (no action), adding a chat never subscribed in this session gets `snapshot` with exactly both chats' snapshots (host states, fromSeq = the watermark), and afterwards that chat alone gets `replay`.
#[tokio::test]
async fn replay_requires_a_baseline_for_every_requested_channel() {
    let t = TestRelay::start(vec![host("a", 2, script(5, 16, 0))], "").await;
    let ((chat1, host1), (chat2, host2)) = (seeded_chat("a", 1), seeded_chat("a", 2));
    let mut ws = t.raw("alice").await;
    let init = ws.initialize("s-base").await;
    let s0 = init["result"]["serverSeq"].as_u64().expect("serverSeq");
    let sub = ws.request(1, "subscribe", json!({"channel": chat1})).await;
    assert_eq!(snapshot_from_seq(&sub["result"]["snapshot"]), s0, "{sub}");
    drop(ws);

    let mut ws = t.raw("alice").await;
    let r = raw_reconnect(
        &mut ws,
        1,
        reconnect_params("s-base", json!(s0), &[chat1.as_str()]),
    )
    .await;
    assert_eq!(
        r["result"],
        json!({"type": "replay", "actions": [], "missing": []}),
        "control: the watermark is valid"
    );
    drop(ws);

    let mut ws = t.raw("alice").await;
    let r = raw_reconnect(
        &mut ws,
        1,
        reconnect_params("s-base", json!(s0), &[chat1.as_str(), chat2.as_str()]),
    )
    .await;
    let result = &r["result"];
    assert_eq!(result["type"], "snapshot", "{chat2} has no baseline: {r}");
    assert_eq!(snapshot_resources(result), [chat1.clone(), chat2.clone()]);
    for (chat, host_uri) in [(&chat1, &host1), (&chat2, &host2)] {
        let s = snapshot_of(result, chat);
        assert_eq!(snapshot_from_seq(s), s0, "nothing numbered since: {s}");
        assert_eq!(s["state"], host_state(&t.hosts[0], host_uri, &[]));
    }
    drop(ws);

    let mut ws = t.raw("alice").await;
    let r = raw_reconnect(
        &mut ws,
        1,
        reconnect_params("s-base", json!(s0), &[chat2.as_str()]),
    )
    .await;
    assert_eq!(
        r["result"],
        json!({"type": "replay", "actions": [], "missing": []}),
        "{chat2} got its snapshot in this session"
    );
}

/// §5.5 window: after a turn, `reconnect` with the last number seen gets `replay` with no action, while watermarks 0, −1, S0−1, last+1 and 2^53−1 each get `snapshot` with exactly the chat's snapshot at fromSeq = last and the host's state.
#[tokio::test]
async fn watermark_outside_s0_to_last_gets_snapshot() {
    let t = TestRelay::start(vec![host("a", 1, script(5, 16, 0))], "").await;
    let (chat, host_chat) = seeded_chat("a", 1);
    let mut ws = t.raw("alice").await;
    let init = ws.initialize("s-wm").await;
    let s0 = init["result"]["serverSeq"].as_u64().expect("serverSeq");
    ws.request(1, "subscribe", json!({"channel": chat})).await;
    ws.send_json(&start_turn_frame(&chat, 1, "wm-turn")).await;
    let mut envs = raw_actions_until(&mut ws, |e| is(e, &chat, "chat/turnComplete")).await;
    envs.extend(raw_settle(&mut ws, 2, &[&chat]).await);
    assert_contiguous(&envs, s0);
    let last = envs.last().expect("envelopes").server_seq;
    drop(ws);

    let mut ws = t.raw("alice").await;
    let r = raw_reconnect(
        &mut ws,
        1,
        reconnect_params("s-wm", json!(last), &[chat.as_str()]),
    )
    .await;
    assert_eq!(
        r["result"],
        json!({"type": "replay", "actions": [], "missing": []}),
        "control: last is in the window"
    );
    drop(ws);
    for w in [
        json!(0),
        json!(-1),
        json!(s0 - 1),
        json!(last + 1),
        json!(MAX_SAFE),
    ] {
        let mut ws = t.raw("alice").await;
        let r = raw_reconnect(
            &mut ws,
            1,
            reconnect_params("s-wm", w.clone(), &[chat.as_str()]),
        )
        .await;
        let result = &r["result"];
        assert_eq!(result["type"], "snapshot", "watermark {w}: {r}");
        assert_eq!(snapshot_resources(result), [chat.as_str()], "{r}");
        let s = snapshot_of(result, &chat);
        assert_eq!(snapshot_from_seq(s), last, "watermark {w}: {s}");
        assert_eq!(s["state"], host_state(&t.hosts[0], &host_chat, &[]));
    }
}

/// §5.5 buffer edge (`replay_buffer_envelopes = 8`): exactly 8 envelopes numbered while away (another client's rejected dispatches, echoed to every subscriber) replay as exactly w+1…w+8 with the rejection and an opaque `r1.` origin; 9 give `snapshot` at fromSeq = the last number with the host's chat.
#[tokio::test]
async fn replay_buffer_exactly_full_replays_and_one_more_gives_snapshot() {
    let t = TestRelay::start(
        vec![host("a", 1, script(5, 16, 0))],
        "[limits]\nreplay_buffer_envelopes = 8\n",
    )
    .await;
    let (chat, host_chat) = seeded_chat("a", 1);
    let mut a = t.raw("alice").await;
    let s0 = a.initialize("s-edge").await["result"]["serverSeq"]
        .as_u64()
        .expect("serverSeq");
    a.request(1, "subscribe", json!({"channel": chat})).await;
    drop(a);
    let session = t
        .relay
        .relay
        .session_of(&session_key("alice", "s-edge"))
        .expect("the detached session");
    let mut bob = t.raw("bob").await;
    bob.initialize("bob-edge").await;
    bob.request(1, "subscribe", json!({"channel": chat})).await;
    let cancel = |n: i64| {
        dispatch_frame(
            &chat,
            n,
            json!({"type": "chat/turnCancelled", "turnId": "none", "duration": 0}),
        )
    };
    for n in 1..=8 {
        bob.send_json(&cancel(n)).await;
    }
    wait_until("8 envelopes numbered for the detached session", || {
        session.lock().last() == s0 + 8
    })
    .await;

    let mut a = t.raw("alice").await;
    let r = raw_reconnect(
        &mut a,
        1,
        reconnect_params("s-edge", json!(s0), &[chat.as_str()]),
    )
    .await;
    assert_eq!(r["result"]["type"], "replay", "the buffer holds all 8: {r}");
    assert_eq!(r["result"]["missing"], json!([]));
    let replayed = envelopes(&r["result"]["actions"]);
    assert_eq!(replayed.len(), 8, "{r}");
    assert_contiguous(&replayed, s0);
    for e in &replayed {
        assert!(e.rejection_reason.is_some(), "{e:?}");
        let origin = e.origin.as_ref().expect("origin");
        assert!(
            origin.client_id.starts_with("r1.") && origin.client_id != "bob-edge",
            "another client's id stays an opaque pseudonym: {origin:?}"
        );
    }
    drop(a);
    for n in 9..=17 {
        bob.send_json(&cancel(n)).await;
    }
    wait_until("9 more envelopes numbered", || {
        session.lock().last() == s0 + 17
    })
    .await;
    let mut a = t.raw("alice").await;
    let r = raw_reconnect(
        &mut a,
        1,
        reconnect_params("s-edge", json!(s0 + 8), &[chat.as_str()]),
    )
    .await;
    let result = &r["result"];
    assert_eq!(result["type"], "snapshot", "one envelope was evicted: {r}");
    assert_eq!(snapshot_resources(result), [chat.as_str()]);
    let s = snapshot_of(result, &chat);
    assert_eq!(snapshot_from_seq(s), s0 + 17);
    assert_eq!(s["state"], host_state(&t.hosts[0], &host_chat, &[]));
}

/// §5.4: a paced turn's envelopes (one per host read, each spliced after the
/// previous one into the session's shared chunks, across many chunks) replay
/// exactly as they were sent live: every envelope of a `replay` from the
/// subscription's watermark equals the live frame's params, in order.
#[tokio::test]
async fn a_paced_turn_replays_exactly_what_was_sent_live() {
    // 300 deltas at 3,000 a second: the host writes them one at a time.
    let t = TestRelay::start(vec![host("a", 1, script(300, 180, 3000))], "").await;
    let (chat, _) = seeded_chat("a", 1);
    let mut a = t.raw("alice").await;
    a.initialize("s-chunks").await;
    let sub = a.request(1, "subscribe", json!({"channel": chat})).await;
    let from = snapshot_from_seq(&sub["result"]["snapshot"]);
    a.dispatch(&chat, 1, turn_started("t-chunks", "go")).await;
    let mut live = Vec::new();
    loop {
        let frame = a.recv_json().await.expect("the turn's envelopes");
        if frame["method"] != "action" {
            continue;
        }
        let done = frame["params"]["action"]["type"] == "chat/turnComplete";
        live.push(frame["params"].clone());
        if done {
            break;
        }
    }
    let deltas = live
        .iter()
        .filter(|p| p["action"]["type"] == "chat/delta")
        .count();
    assert_eq!(deltas, 300, "the whole turn live");
    drop(a);
    let mut a = t.raw("alice").await;
    let r = raw_reconnect(
        &mut a,
        1,
        reconnect_params("s-chunks", json!(from), &[chat.as_str()]),
    )
    .await;
    assert_eq!(r["result"]["type"], "replay", "{r}");
    let replayed = r["result"]["actions"].as_array().expect("actions");
    assert_eq!(
        replayed.len(),
        live.len(),
        "every envelope since the watermark"
    );
    for (n, (again, sent)) in replayed.iter().zip(&live).enumerate() {
        assert_eq!(again, sent, "envelope {n} replayed as sent");
    }
}

// ─── supersede and identity ─────────────────────────────────────────────────

/// §5.6: socket B's `reconnect` as the same (principal, clientId) while A is attached gets its answer and the live stream, and A's next frame is its 4009 close; the same clientId under another principal names another session (§3.3): bob's `reconnect` adopts one of his own (§12.2, his own upstream id, numbered above the watermark he sent) — or gets -32008 when it names nothing he may see — and B is untouched.
#[tokio::test]
async fn reconnect_supersedes_the_attached_socket_and_is_bound_to_the_principal() {
    let t = TestRelay::start(vec![host("a", 1, script(5, 16, 0))], "").await;
    let (chat, host_chat) = seeded_chat("a", 1);
    let mut a = t.raw("alice").await;
    let init = a.initialize("s-sup").await;
    let s0 = init["result"]["serverSeq"].as_u64().expect("serverSeq");
    let sub = a.request(1, "subscribe", json!({"channel": chat})).await;
    let state = sub["result"]["snapshot"]["state"].clone();

    let mut b = t.raw("alice").await;
    let r = raw_reconnect(
        &mut b,
        1,
        reconnect_params("s-sup", json!(s0), &[chat.as_str()]),
    )
    .await;
    assert_eq!(
        r["result"],
        json!({"type": "replay", "actions": [], "missing": []})
    );
    match a.next_or_close().await {
        Next::Closed(Some((code, _))) => assert_eq!(code, 4009, "superseded"),
        Next::Closed(None) => panic!("A closed without a close frame"),
        Next::Frame(f) => panic!("A got a frame after being superseded: {f}"),
    }
    b.send_json(&start_turn_frame(&chat, 1, "sup-turn")).await;
    let mut live = raw_actions_until(&mut b, |e| is(e, &chat, "chat/turnComplete")).await;
    live.extend(raw_settle(&mut b, 2, &[&chat]).await);
    assert_contiguous(&live, s0);
    let echo = live[0].origin.as_ref().expect("the echo has an origin");
    assert_eq!(
        (echo.client_id.as_str(), echo.client_seq),
        ("s-sup", 1),
        "B is the session's socket"
    );
    assert_eq!(
        reduce_chat(&state, &chat, &live),
        host_state(&t.hosts[0], &host_chat, &[])
    );

    let mut bob = t.raw("bob").await;
    let r = bob
        .request(
            1,
            "reconnect",
            reconnect_params("s-sup", json!(s0), &[chat.as_str()]),
        )
        .await;
    assert_eq!(
        r["result"]["type"], "snapshot",
        "bob's own adopted session: {r}"
    );
    let s = snapshot_of(&r["result"], &chat);
    assert!(
        snapshot_from_seq(s) > s0,
        "numbered above the watermark: {r}"
    );
    assert_ne!(
        t.upstream_id("bob", "s-sup"),
        t.upstream_id("alice", "s-sup"),
        "bob's session is his own"
    );
    assert!(t.has_session("bob", "s-sup") && t.has_session("alice", "s-sup"));
    let mut eve = t.raw("eve").await;
    let r = eve
        .request(1, "reconnect", reconnect_params("s-sup", json!(s0), &[]))
        .await;
    assert_eq!(error_code(&r), -32008, "naming nothing: not adopted: {r}");
    let init = eve.initialize("s-sup").await;
    assert!(
        init["result"]["serverSeq"].as_u64().is_some(),
        "the socket stays open and initializes: {init}"
    );
    let pong = b.request(3, "ping", json!({"channel": ROOT})).await;
    assert_eq!(pong["result"], Value::Null, "B is untouched: {pong}");
}

// ─── lifetime ───────────────────────────────────────────────────────────────

/// §5.7 with detach_grace 1 s, retain 2 s: dropped sessions keep their links 0.3 s in and lose them at the host between 1 and 2.5 s; a `reconnect` then gets `snapshot` (continuity lost) at fromSeq = its watermark with the host's chat, including a turn another client ran meanwhile; a session left alone for 3.5 s is gone from the registry, and its `reconnect` is adopted (§12.2): a `snapshot` of the host's chat numbered above the old watermark.
#[tokio::test]
async fn detach_grace_closes_links_then_retention_ends() {
    let t = TestRelay::start(
        vec![host("a", 1, script(5, 16, 0))],
        "[limits]\ndetach_grace_secs = 1\nretain_secs = 2\n",
    )
    .await;
    let (chat, host_chat) = seeded_chat("a", 1);
    let h = &t.hosts[0];
    assert_eq!(h.connections(), 1, "the watch link only");
    let mut x = t.raw("alice").await;
    let sx = x.initialize("s-x").await["result"]["serverSeq"]
        .as_u64()
        .expect("serverSeq");
    x.request(1, "subscribe", json!({"channel": chat})).await;
    let mut y = t.raw("alice").await;
    let sy = y.initialize("s-y").await["result"]["serverSeq"]
        .as_u64()
        .expect("serverSeq");
    y.request(1, "subscribe", json!({"channel": chat})).await;
    assert_eq!(h.connections(), 3, "watch link + one link per session");

    let dropped = Instant::now();
    drop(x);
    drop(y);
    // The links stay open during the grace: the lower bound on `elapsed`
    // below (no fixed-time probe, which load could push past the grace).
    wait_until("links closed after the grace", || h.connections() == 1).await;
    let elapsed = dropped.elapsed();
    assert!(
        elapsed >= Duration::from_secs(1) && elapsed < Duration::from_millis(2500),
        "links closed after {elapsed:?}"
    );

    // The chat changes while x has no link.
    let mut bob = t.raw("bob").await;
    bob.initialize("bob").await;
    bob.request(1, "subscribe", json!({"channel": chat})).await;
    bob.send_json(&start_turn_frame(&chat, 1, "bob-turn")).await;
    raw_actions_until(&mut bob, |e| is(e, &chat, "chat/turnComplete")).await;

    let mut x = t.raw("alice").await;
    let r = raw_reconnect(
        &mut x,
        1,
        reconnect_params("s-x", json!(sx), &[chat.as_str()]),
    )
    .await;
    let result = &r["result"];
    assert_eq!(result["type"], "snapshot", "continuity lost: {r}");
    assert_eq!(snapshot_resources(result), [chat.as_str()]);
    let s = snapshot_of(result, &chat);
    assert_eq!(snapshot_from_seq(s), sx, "nothing numbered while away");
    let host_now = host_state(h, &host_chat, &[]);
    assert_eq!(host_now["turns"][0]["id"], "bob-turn", "{host_now}");
    assert_eq!(s["state"], host_now);

    // y's record goes after grace + retain (3 s); polled in the registry,
    // since a `reconnect` before that would re-attach it.
    wait_until("y's record dropped", || !t.has_session("alice", "s-y")).await;
    assert!(
        dropped.elapsed() >= Duration::from_secs(3),
        "y's record dropped before grace + retain: {:?}",
        dropped.elapsed()
    );
    let mut y = t.raw("alice").await;
    let r = y
        .request(
            1,
            "reconnect",
            reconnect_params("s-y", json!(sy), &[chat.as_str()]),
        )
        .await;
    assert_eq!(r["result"]["type"], "snapshot", "adopted: {r}");
    let s = snapshot_of(&r["result"], &chat);
    assert!(
        snapshot_from_seq(s) > sy,
        "numbered above the old {sy}: {r}"
    );
    assert_eq!(s["state"], host_state(h, &host_chat, &[]));
}

/// §5.7 for a session the relay closed itself: after its link drops (4000 resync) and detach_grace 1 s + retain 1 s pass, the record is gone; a `reconnect` is then adopted as a new session (§12.2), numbered above its watermark.
#[tokio::test]
async fn session_closed_by_the_relay_is_still_dropped_after_retention() {
    let t = TestRelay::start(
        vec![host("a", 1, script(5, 16, 0))],
        "[limits]\ndetach_grace_secs = 1\nretain_secs = 1\n",
    )
    .await;
    let (chat, _) = seeded_chat("a", 1);
    let mut ws = t.raw("alice").await;
    let s0 = ws.initialize("s-4000").await["result"]["serverSeq"]
        .as_u64()
        .expect("serverSeq");
    ws.request(1, "subscribe", json!({"channel": chat})).await;
    // A host restart forgets the link's client: the link cannot resume and
    // the relay closes the client itself (4000).
    t.hosts[0].restart(true);
    match ws.next_or_close().await {
        Next::Closed(Some((code, _))) => assert_eq!(code, 4000, "resync"),
        Next::Closed(None) => panic!("closed without a close frame"),
        Next::Frame(f) => panic!("unexpected frame {f}"),
    }
    // Gone after grace + retain (2 s); polled in the registry, since a
    // `reconnect` before that would re-attach it.
    wait_until("the record dropped", || !t.has_session("alice", "s-4000")).await;
    let mut ws = t.raw("alice").await;
    let r = ws
        .request(
            1,
            "reconnect",
            reconnect_params("s-4000", json!(s0), &[chat.as_str()]),
        )
        .await;
    assert_eq!(r["result"]["type"], "snapshot", "adopted: {r}");
    let snap = snapshot_of(&r["result"], &chat);
    assert!(snapshot_from_seq(snap) > s0, "numbered above {s0}: {r}");
}

// ─── S7: relay restart ──────────────────────────────────────────────────────

/// S7 with §12.2: after a relay restart on the same directory, the client's `reconnect` is adopted: a `snapshot` of the chat (host's state) numbered above every number seen before the restart, and the next turn streams contiguously after it — no `NotFound`, no re-initialization.
#[tokio::test]
async fn s7_relay_restart_reconnect_is_adopted_with_a_higher_s0() {
    let t = TestRelay::start(vec![host("a", 1, script(5, 16, 0))], "").await;
    let (chat, host_chat) = seeded_chat("a", 1);
    let a = t.client("alice").await;
    let mut events = a.events();
    let init = a
        .initialize("s7".into(), vec!["1.0.0".into()], vec![])
        .await
        .expect("initialize");
    let snap = subscribe_raw(&a, &chat).await;
    a.dispatch(chat.clone(), action(turn_started("s7-turn", "go")))
        .await
        .expect("dispatch");
    let mut envs = actions_until(&mut events, |e| is(e, &chat, "chat/turnComplete")).await;
    envs.extend(drain_actions(&a, &mut events).await);
    let s0 = u64::try_from(init.server_seq).expect("S0");
    assert_contiguous(&envs, s0);
    let max_seen = envs
        .iter()
        .map(|e| e.server_seq)
        .chain([s0, snapshot_from_seq(&snap)])
        .max()
        .expect("numbers");

    let t = t.restart().await;
    drop(events);
    drop(a);
    let b = t.client("alice").await;
    let r: Value = b
        .request(
            "reconnect",
            reconnect_params("s7", json!(max_seen), &[chat.as_str()]),
        )
        .await
        .expect("the restarted relay adopts the session (§12.2)");
    assert_eq!(r["type"], "snapshot", "{r}");
    let snaps = r["snapshots"].as_array().expect("snapshots");
    assert_eq!(snaps.len(), 1, "{r}");
    assert_eq!(snaps[0]["resource"], chat);
    let from = snapshot_from_seq(&snaps[0]);
    assert!(
        from > max_seen,
        "numbered above every number seen before ({max_seen}): {from}"
    );
    assert_eq!(snaps[0]["state"], host_state(&t.hosts[0], &host_chat, &[]));
    // The adopted session streams on, numbered after the snapshot.
    let mut events = b.events();
    b.dispatch(chat.clone(), action(turn_started("s7-after", "go")))
        .await
        .expect("dispatch");
    let envs = actions_until(&mut events, |e| is(e, &chat, "chat/turnComplete")).await;
    assert_contiguous(&envs, from);
}

// ─── S7b: the SDK's MultiHostClient across a relay restart ──────────────────

/// Waits for the host's `Connected` event of `generation`.
async fn connected(events: &mut HostEventStream, generation: u64) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let ev = tokio::time::timeout_at(deadline, events.recv())
            .await
            .unwrap_or_else(|_| panic!("no Connected generation {generation} in time"))
            .expect("host events open");
        if let HostEvent::Connected { generation: g, .. } = ev
            && g == generation
        {
            return;
        }
    }
}

/// Action envelopes delivered by the multi-host client until `stop` holds
/// for one (included).
async fn multi_actions_until(
    events: &mut HostSubscriptionStream,
    mut stop: impl FnMut(&ActionEnvelope) -> bool,
) -> Vec<ActionEnvelope> {
    let mut out = Vec::new();
    loop {
        let ev = tokio::time::timeout(WAIT, events.recv())
            .await
            .expect("event in time")
            .expect("events open");
        if let SubscriptionEvent::Action(e) = ev.event {
            let done = stop(&e);
            out.push(e);
            if done {
                return out;
            }
        }
    }
}

/// Action envelopes delivered within `window`.
async fn multi_actions_within(
    events: &mut HostSubscriptionStream,
    window: Duration,
) -> Vec<ActionEnvelope> {
    let deadline = tokio::time::Instant::now() + window;
    let mut out = Vec::new();
    while let Ok(Some(ev)) = tokio::time::timeout_at(deadline, events.recv()).await {
        if let SubscriptionEvent::Action(e) = ev.event {
            out.push(e);
        }
    }
    out
}

/// A `MultiHostClient` entry `id` for the relay, client id "s7b": each
/// connection dials with the options `dial` holds at that moment (so a
/// test can point it at a restarted relay), retrying every 100 ms.
fn relay_host_config(id: &HostId, dial: Arc<Mutex<DialOptions>>) -> HostConfig {
    let factory = move |_: HostId| {
        let opts = dial.lock().expect("dial options").clone();
        async move {
            ahp_relay::upstream::dial::dial(&opts)
                .await
                .map(BoxedTransport::new)
                .map_err(|e| TransportError::Io(e.to_string()))
        }
    };
    HostConfig::new(id.clone(), "relay", factory)
        .with_client_id("s7b")
        .with_client_config(ClientConfig {
            default_request_timeout: Some(WAIT),
            subscription_buffer: 1 << 16,
        })
        .with_reconnect_policy(ReconnectPolicy {
            backoff: Backoff::Constant {
                delay: Duration::from_millis(100),
            },
            jitter: 0.0,
            max_attempts: None,
            reset_on_success: true,
        })
}

/// Dispatches turn `turn_id` on `chat` through the runtime's entry `id`;
/// the envelopes up to its completion and those still arriving within
/// 200 ms after.
async fn multi_turn(
    multi: &MultiHostClient,
    id: &HostId,
    events: &mut HostSubscriptionStream,
    chat: &str,
    turn_id: &str,
) -> Vec<ActionEnvelope> {
    multi
        .dispatch(id, chat.into(), action(turn_started(turn_id, "go")))
        .await
        .unwrap_or_else(|e| panic!("dispatch {turn_id}: {e:?}"));
    let mut envs = multi_actions_until(events, |e| is(e, chat, "chat/turnComplete")).await;
    envs.extend(multi_actions_within(events, Duration::from_millis(200)).await);
    envs
}

/// S7b: `MultiHostClient` with one entry dialing the relay (TLS + token) subscribes a chat and streams a turn; after a relay restart its runtime's `reconnect` is adopted (§12.2: one `adopted` outcome, no NotFound) with numbers above its never-lowered watermark, and a second turn streams: delivered envelopes are numbered S0+1, … contiguously in each incarnation, each turn's 20 deltas arrive once, and both the reduced chat and the SDK's state mirror equal the host's.
#[tokio::test]
async fn s7b_multi_host_client_survives_a_relay_restart_without_duplicates_or_gaps() {
    const DELTAS: usize = 20;
    let t = TestRelay::start(vec![host("a", 1, script(DELTAS as u32, 16, 0))], "").await;
    let (chat, host_chat) = seeded_chat("a", 1);
    let dial = Arc::new(Mutex::new(t.dial_options(Some(t.token("alice")))));
    let id = HostId::new("relay");
    let config = relay_host_config(&id, dial.clone());
    let multi = MultiHostClient::new();
    let mut events = multi.events();
    let mut host_events = multi.host_events();
    multi.add_host(config).await.expect("add host");
    connected(&mut host_events, 1).await;
    let s0_first = multi.host(&id).await.expect("host").server_seq as u64;

    let initial = host_state(&t.hosts[0], &host_chat, &[]);
    let sub = multi
        .subscribe(&id, chat.clone())
        .await
        .expect("subscribe through the runtime");
    let snapshot = sub.snapshot.expect("chat snapshot");
    assert_eq!(
        serde_json::to_value(&snapshot.state).expect("state"),
        initial,
        "the SDK's typed snapshot is the host's chat"
    );
    let mut mirror = MultiHostStateMirror::new();
    mirror.apply_snapshot(&id, &snapshot);
    let first = multi_turn(&multi, &id, &mut events, &chat, "t1").await;
    let watermark = multi.host(&id).await.expect("host").server_seq as u64;
    assert_eq!(
        Some(watermark),
        first.last().map(|e| e.server_seq),
        "the runtime's watermark is the last envelope"
    );

    let t = t.restart().await;
    dial.lock().expect("dial options").url = t.url();
    connected(&mut host_events, 2).await;
    let handle = multi.host(&id).await.expect("host");
    assert_eq!(handle.state, HostState::Connected);
    let s0_second = handle.server_seq as u64;
    assert!(
        s0_second > watermark,
        "new S0 {s0_second} above the never-lowered watermark {watermark}"
    );
    let outcome = |o: &str| {
        t.relay
            .relay
            .metrics
            .reconnects
            .with_label_values(&[o])
            .get()
    };
    assert_eq!(
        (
            outcome("not_found"),
            outcome("replay"),
            outcome("snapshot"),
            outcome("adopted")
        ),
        (0, 0, 0, 1),
        "the runtime's one reconnect was adopted (§12.2)"
    );
    let second = multi_turn(&multi, &id, &mut events, &chat, "t2").await;

    assert_contiguous(&first, s0_first);
    assert_contiguous(&second, s0_second);
    let all: Vec<ActionEnvelope> = [first, second].concat();
    assert_strictly_increasing(&all);
    for turn in ["t1", "t2"] {
        let n = all
            .iter()
            .filter(|e| is(e, &chat, "chat/delta") && turn_of(e).as_deref() == Some(turn))
            .count();
        assert_eq!(n, DELTAS, "turn {turn}: each delta exactly once");
    }
    let host_final = host_state(&t.hosts[0], &host_chat, &[]);
    assert_eq!(reduce_chat(&initial, &chat, &all), host_final);
    assert_eq!(
        mirrored_chat(&mut mirror, &id, &chat, &all),
        host_final,
        "the SDK's state mirror equals the host's chat"
    );
}

/// The chat state `mirror` holds for `chat` of entry `id` once `envs` are
/// applied to it.
fn mirrored_chat(
    mirror: &mut MultiHostStateMirror,
    id: &HostId,
    chat: &str,
    envs: &[ActionEnvelope],
) -> Value {
    for e in envs {
        mirror.apply_envelope(id, e);
    }
    let mirrored = mirror
        .chats()
        .get(&HostedResourceKey::new(id.clone(), chat.to_string()))
        .expect("the mirror follows the chat");
    serde_json::to_value(mirrored).expect("state")
}

/// §5.5, §5.6: an answer goes to the socket that asked. A `subscribe` still
/// in flight when a `reconnect` on a new socket takes the session over is
/// answered to no one: the new socket never gets a response to an id it did
/// not send (the host answers the stale request first, so it would arrive
/// before the new socket's own answer), and the dropped answer is counted.
#[tokio::test]
async fn an_answer_for_a_replaced_socket_reaches_no_other_socket() {
    let t = TestRelay::start(vec![fast_config("a", 2)], "").await;
    let (kept, asked) = ("ahp-chat:/a~a-1-main", "ahp-chat:/a~a-2-main");
    let mut old = t.raw("alice").await;
    old.initialize("stale").await;
    let s = old.request(1, "subscribe", json!({"channel": kept})).await;
    let watermark = s["result"]["snapshot"]["fromSeq"].clone();
    // The host holds the link's frames: the next subscribe stays unanswered.
    let upstream = t.upstream_id("alice", "stale");
    t.hosts[0].stall_client(&upstream, true);
    old.send_json(&request_frame(7, "subscribe", json!({"channel": asked})))
        .await;
    let mut new = t.raw("alice").await;
    let r = raw_reconnect(
        &mut new,
        1,
        json!({"channel": "ahp-root://", "clientId": "stale",
            "lastSeenServerSeq": watermark, "subscriptions": [kept]}),
    )
    .await;
    assert_eq!(r["result"]["type"], "replay", "{r}");
    t.hosts[0].stall_client(&upstream, false);
    let subscribes_of_asked = || {
        t.hosts[0]
            .received()
            .iter()
            .filter(|f| f.method.as_deref() == Some("subscribe") && f.text.contains("a-2-main"))
            .count()
    };
    wait_until("the host reads the old socket's subscribe", || {
        subscribes_of_asked() == 1
    })
    .await;
    // The new socket's own subscribe goes on the same link, behind the
    // host's answer to the old one.
    new.send_json(&request_frame(9, "subscribe", json!({"channel": asked})))
        .await;
    let mut before = Vec::new();
    let answer = loop {
        let v = new.recv_json().await.expect("socket open");
        if v["id"] == 9 && v.get("method").is_none() {
            break v;
        }
        before.push(v);
    };
    assert_eq!(subscribes_of_asked(), 2, "both subscribes reached the host");
    assert!(
        before.iter().all(|v| v.get("id").is_none()),
        "no answer to a request this socket did not send: {before:?}"
    );
    assert_eq!(
        answer["result"]["snapshot"]["resource"], asked,
        "the new socket's own subscribe is answered: {answer}"
    );
    let (_, page) = common::relay::admin_get(&t, "/metrics").await;
    assert_eq!(
        common::relay::metric(&page, "ahp_relay_stale_answers_total"),
        Some(1.0)
    );
}

/// A policy that grants everyone everything and, once armed, holds the
/// thread of the first grant asked for `bob` on `h2` until released (at
/// most 10 s): it stops the relay in the middle of computing bob's merged
/// root, after `h1`'s part was read.
#[derive(Debug, Default)]
struct PauseGate {
    armed: std::sync::atomic::AtomicBool,
    paused: std::sync::atomic::AtomicBool,
    release: std::sync::atomic::AtomicBool,
}

#[derive(Debug)]
struct PausingPolicy(Arc<PauseGate>);

impl ahp_relay::policy::Policy for PausingPolicy {
    fn grant(
        &self,
        who: ahp_relay::policy::Subject<'_>,
        host: ahp_relay::policy::HostRef<'_>,
    ) -> Option<ahp_relay::policy::Grant> {
        use std::sync::atomic::Ordering::SeqCst;
        let gate = &self.0;
        if who.principal.subject == "bob" && host.id == "h2" && gate.armed.swap(false, SeqCst) {
            gate.paused.store(true, SeqCst);
            let until = Instant::now() + Duration::from_secs(10);
            while !gate.release.load(SeqCst) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        Some(ahp_relay::policy::Grant {
            permissions: ahp_relay::policy::Role::Operator.permissions(),
            visibility: ahp_relay::policy::Visibility::All,
            external: true,
            dispose_others: false,
            session_files: false,
            rule: "pausing".into(),
        })
    }
}

/// Waits (up to 15 s) until the relay's `ahp_relay_host_up` gauge of h1 is
/// `want`: the fan-out task set it just before reading its followers.
async fn h1_up_is(t: &TestRelay, want: f64) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (_, page) = common::relay::admin_get(t, "/metrics").await;
        let up = page
            .lines()
            .find(|l| l.starts_with("ahp_relay_host_up{") && l.contains("host=\"h1\""))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok());
        if up == Some(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "h1's up gauge never became {want}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// §5.5, §6.2: a host whose watch link comes up while a `reconnect`'s
/// snapshot root is being computed — after that host's part was read, so
/// the snapshot lacks its agents — reaches the client as a root action
/// after the answer. The session must already count as a root follower
/// while its root is computed: before, the fan-out of the host's return
/// passed it over (not following yet) and the answer left the host out, so
/// the client kept a root without it for good (S13 seed 208035).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_host_back_while_a_snapshot_root_is_computed_reaches_the_client() {
    use std::sync::atomic::Ordering::SeqCst;
    let mut t = TestRelay::start(vec![fast_config("h1", 1), fast_config("h2", 1)], "").await;
    let gate = Arc::new(PauseGate::default());
    t.relay
        .relay
        .set_policy(Arc::new(PausingPolicy(gate.clone())));
    let has_h1 = |agents: &Value| {
        agents.as_array().is_some_and(|a| {
            a.iter()
                .any(|x| x["provider"].as_str().is_some_and(|p| p.ends_with(".h1")))
        })
    };
    let mut bob = t.raw("bob").await;
    bob.initialize("late").await;
    let s = bob.request(1, "subscribe", json!({"channel": ROOT})).await;
    assert!(has_h1(&s["result"]["snapshot"]["state"]["agents"]), "{s}");
    drop(bob);
    // h1 goes away; the relay's root loses its agent.
    let h1 = t.hosts.remove(0);
    let addr = h1.addr();
    h1.shutdown().await;
    h1_up_is(&t, 0.0).await;
    // Let the fan-out of h1's departure settle before arming the gate.
    tokio::time::sleep(Duration::from_millis(200)).await;
    gate.armed.store(true, SeqCst);
    let mut again = t.raw("bob").await;
    again
        .send_json(&request_frame(
            1,
            "reconnect",
            json!({"clientId": "late", "lastSeenServerSeq": 0, "subscriptions": [ROOT]}),
        ))
        .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !gate.paused.load(SeqCst) {
        assert!(Instant::now() < deadline, "bob's root was never computed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // h1 comes back on its address while bob's root is half computed; its
    // watch link comes up and the fan-out picks its followers.
    let _h1 = SimHost::start(fast_config("h1", 1), addr)
        .await
        .expect("h1 again");
    h1_up_is(&t, 1.0).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    gate.release.store(true, SeqCst);
    let answer = again.recv_json().await.expect("the reconnect answer");
    assert_eq!(answer["result"]["type"], "snapshot", "{answer}");
    let mut root = snapshot_of(&answer["result"], ROOT)["state"].clone();
    // The host's return, if the snapshot missed it, follows as an action.
    let deadline = Instant::now() + Duration::from_secs(3);
    while !has_h1(&root["agents"]) && Instant::now() < deadline {
        let envs = raw_drain_actions(&mut again, 2).await;
        root = reduce_root(&root, &envs);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        has_h1(&root["agents"]),
        "bob's root lacks h1 after it came back: {root}"
    );
}

/// An `unsubscribe` ends the channel's continuity (§5.5): what the host ran
/// on the channel afterwards was never numbered for the client, so a
/// `reconnect` listing the channel again gets a snapshot holding that turn.
/// Before, the channel kept its baseline and the `reconnect` got a `replay`
/// without the turn.
#[tokio::test]
async fn an_unsubscribed_channel_is_not_replayed() {
    let t = TestRelay::start(vec![fast_config("a", 1)], "").await;
    let chat = "ahp-chat:/a~a-1-main";
    let mut alice = t.raw("alice").await;
    let init = alice.initialize("left-chat").await;
    let s0 = init["result"]["serverSeq"].clone();
    let s = alice
        .request(1, "subscribe", json!({"channel": chat}))
        .await;
    assert_eq!(s["result"]["snapshot"]["resource"], chat, "{s}");
    let upstream = t.upstream_id("alice", "left-chat");
    alice
        .send_json(&json!({"jsonrpc": "2.0", "method": "unsubscribe", "params": {"channel": chat}}))
        .await;
    wait_until("the host is told", || {
        t.hosts[0]
            .received_from(&upstream)
            .iter()
            .any(|f| f.method.as_deref() == Some("unsubscribe"))
    })
    .await;
    t.run_turn(("bob", "runner"), chat, "t-missed").await;
    alice.close_cleanly().await;
    let mut back = t.raw("alice").await;
    let r = raw_reconnect(
        &mut back,
        1,
        json!({"clientId": "left-chat", "lastSeenServerSeq": s0, "subscriptions": [chat]}),
    )
    .await;
    assert_eq!(r["result"]["type"], "snapshot", "{r}");
    assert!(
        snapshot_of(&r["result"], chat)
            .to_string()
            .contains("t-missed"),
        "the snapshot holds the turn run meanwhile: {r}"
    );
}

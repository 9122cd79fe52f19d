//! Streaming through the relay (contract §5.1–5.3, §5.9, §6.1–6.4; scenarios
//! S2, S3, S4, S18): one sequence per client over many hosts, the subscribe
//! merge rule, echoes and rejections, the merged root and catalog
//! notifications, and slow-consumer isolation. Real TLS sockets, simulated
//! hosts, the official `ahp` client (raw sockets where the SDK hides frames).
//!
//! States are compared as whole JSON trees: the client's reduced state, a
//! fresh subscriber's snapshot, and the host's own state with its names
//! translated to client names by `common::names` (an independent
//! implementation of §4.2–4.3: host URIs qualified `<host>~<id>` unless
//! client-chosen, providers `<p>.<host>`).

mod common;

use std::time::Duration;

use ahp::{Client, ClientEvent, ClientEventStream, SubscriptionEvent};
use ahp_relay::simhost::naming;
use ahp_types::actions::ActionEnvelope;
use common::relay::TestRelay;
use common::*;
use serde_json::{Value, json};

/// `SessionStatus::Idle` and `SessionStatus::InProgress` bits.
const IDLE: u32 = 1;
const IN_PROGRESS: u32 = 8;
/// Message text that looks like envelope fields and names a host URI: the
/// relay must relay it untouched (§4.3: message text is never rewritten).
const TRICKY_TEXT: &str =
    "see \"serverSeq\":1,\"channel\":\"ahp-chat:/s2-x-main\" \\ {\"origin\":{}} ✓ é";

// ─── helpers ────────────────────────────────────────────────────────────────

fn is_complete_of(e: &ActionEnvelope, channel: &str, turn_id: &str) -> bool {
    is(e, channel, "chat/turnComplete")
        && serde_json::to_value(&e.action).ok().and_then(|v| {
            v.get("turnId")
                .and_then(Value::as_str)
                .map(|t| t == turn_id)
        }) == Some(true)
}

fn on(envs: &[ActionEnvelope], channel: &str) -> Vec<ActionEnvelope> {
    envs.iter()
        .filter(|e| e.channel == channel)
        .cloned()
        .collect()
}

fn now_us() -> u64 {
    jiff::Timestamp::now().as_microsecond() as u64
}

/// Every event (not only actions) until `done` holds for what was collected.
async fn events_until(
    events: &mut ClientEventStream,
    mut done: impl FnMut(&[ClientEvent]) -> bool,
) -> Vec<ClientEvent> {
    let mut out = Vec::new();
    while !done(&out) {
        out.push(next_event(events).await);
    }
    out
}

fn actions_of(evs: &[ClientEvent]) -> Vec<ActionEnvelope> {
    evs.iter()
        .filter_map(|e| match &e.event {
            SubscriptionEvent::Action(a) => Some(a.clone()),
            _ => None,
        })
        .collect()
}

/// Starts turn `turn` on `chat` from `client` and returns once the host has
/// numbered `ahead` more envelopes (or after [`WAIT`]): a point inside the
/// stream that differs with `ahead`.
async fn stream_until(t: &TestRelay, client: &Client, (chat, turn): (&str, &str), ahead: u64) {
    let target = t.hosts[0].server_seq() + ahead;
    client
        .dispatch(
            chat.to_string(),
            action(turn_started(turn, "stream please")),
        )
        .await
        .expect("dispatch");
    let deadline = tokio::time::Instant::now() + WAIT;
    while t.hosts[0].server_seq() < target && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
}

async fn create_session(client: &Client, uri: &str, provider: &str) {
    client
        .request::<_, ()>(
            "createSession",
            json!({"channel": uri, "provider": provider}),
        )
        .await
        .unwrap_or_else(|e| panic!("createSession {uri}: {e:?}"));
}

fn count(frames: &[Value], method: &str, pred: impl Fn(&Value) -> bool) -> usize {
    frames
        .iter()
        .filter(|f| f["method"] == method && pred(&f["params"]))
        .count()
}

// ─── S2 ─────────────────────────────────────────────────────────────────────

/// What S2's client saw: session `ahp-session:/s2-x` created on host b
/// through the relay, its chat subscribed, and one turn run in it.
struct S2Run {
    t: TestRelay,
    /// The client's S0 and the test clock (µs) just before `initialize`.
    s0: u64,
    before_us: u64,
    session_snap: Value,
    chat: String,
    chat_snap: Value,
    /// Envelopes numbered before the chat's subscribe answer.
    before_chat: u64,
    /// Every envelope the client got, in order.
    all: Vec<ActionEnvelope>,
    /// The `clientSeq` of the turn's dispatch.
    client_seq: i64,
    /// The client, still attached.
    _client: Client,
}

const S2_SESSION: &str = "ahp-session:/s2-x";

/// Runs S2's scenario (hosts a, and b with a 300-delta agent).
async fn s2_run() -> S2Run {
    let t = TestRelay::start(
        vec![
            host("a", 1, script(5, 16, 0)),
            host("b", 1, script(300, 12, 0)),
        ],
        "",
    )
    .await;
    let client = t.client("alice").await;
    let mut events = client.events();
    let before_us = now_us();
    let init = client
        .initialize("s2-client".into(), vec!["1.0.0".into()], vec![])
        .await
        .expect("initialize");
    let s0 = u64::try_from(init.server_seq).expect("S0 is non-negative");
    create_session(&client, S2_SESSION, "sim.b").await;
    let session_snap = subscribe_raw(&client, S2_SESSION).await;
    let chat = session_snap["state"]["chats"][0]["resource"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let mut all = drain_actions(&client, &mut events).await;
    let before_chat = all.len() as u64;
    let chat_snap = subscribe_raw(&client, &chat).await;
    let handle = client
        .dispatch(chat.clone(), action(turn_started("s2-turn", TRICKY_TEXT)))
        .await
        .expect("dispatch");
    all.extend(actions_until(&mut events, |e| is(e, &chat, "chat/turnComplete")).await);
    all.extend(settle(&client, &mut events, &[&chat]).await);
    S2Run {
        t,
        s0,
        before_us,
        session_snap,
        chat,
        chat_snap,
        before_chat,
        all,
        client_seq: handle.client_seq,
        _client: client,
    }
}

/// S2 (§5.1, §5.2, §4.2): S0 is microseconds since the epoch (below 2^53);
/// a session created on host b keeps its client-chosen URI, its provider
/// is `sim.b` and its one default chat is qualified; each snapshot's
/// `fromSeq` is the last number issued before its answer; and everything
/// the client gets (over 300 deltas and its own echo, with its origin) is
/// one dense sequence after S0.
#[tokio::test]
async fn s2_a_created_session_streams_one_dense_sequence() {
    let r = s2_run().await;
    assert!(
        r.s0 >= r.before_us && r.s0 <= now_us() + 5_000_000 && r.s0 <= MAX_SAFE,
        "S0 {} is not microseconds since the epoch (test clock {})",
        r.s0,
        r.before_us
    );
    assert_eq!(r.session_snap["resource"], S2_SESSION);
    assert_eq!(
        snapshot_from_seq(&r.session_snap),
        r.s0,
        "nothing numbered yet: the snapshot's fromSeq is S0"
    );
    assert_eq!(r.session_snap["state"]["provider"], "sim.b");
    let chats = r.session_snap["state"]["chats"].as_array().expect("chats");
    assert_eq!(chats.len(), 1, "one default chat: {chats:?}");
    assert_eq!(r.chat, "ahp-chat:/b~s2-x-main", "default chat qualified");
    let chat_from = snapshot_from_seq(&r.chat_snap);
    assert_eq!(
        chat_from,
        r.s0 + r.before_chat,
        "chat fromSeq = last number issued before the response"
    );
    assert_strictly_increasing(&r.all);
    assert_contiguous(&r.all, r.s0);
    let chat_envs = on(&r.all, &r.chat);
    assert!(chat_envs.len() > 300, "every delta relayed");
    assert!(chat_envs.iter().all(|e| e.server_seq > chat_from));
    let echo = &chat_envs[0];
    assert_eq!(action_type(echo), "chat/turnStarted");
    let origin = echo.origin.as_ref().expect("echo has origin");
    assert_eq!(
        (origin.client_id.as_str(), origin.client_seq),
        ("s2-client", r.client_seq)
    );
    assert!(echo.rejection_reason.is_none());
}

/// S2 (§5.2, §4.3): the client's snapshots plus its envelopes reduce to
/// exactly the snapshots a fresh client gets in its `InitializeResult`
/// (both with `fromSeq` = its serverSeq) and to the host's own chat and
/// session in client names; message text that looks like envelope fields
/// is relayed untouched.
#[tokio::test]
async fn s2_the_stream_reduces_to_a_fresh_snapshot_and_the_host_state() {
    let r = s2_run().await;
    let (session, chat) = (S2_SESSION, r.chat.as_str());
    let reduced_chat = reduce_chat(&r.chat_snap["state"], chat, &r.all);
    let reduced_session = reduce_session(&r.session_snap["state"], session, &r.all);
    let fresh = r.t.client("bob").await;
    let init: Value = fresh
        .request(
            "initialize",
            initialize_subscribing("s2-fresh", &[session, chat]),
        )
        .await
        .expect("initialize with initialSubscriptions");
    let fresh_s0 = init["serverSeq"].as_u64().expect("serverSeq");
    let snaps = init["snapshots"].as_array().expect("snapshots");
    assert_eq!(
        snaps.len(),
        2,
        "a snapshot per initial subscription: {init}"
    );
    let fresh_state = |uri: &str| {
        let s = snaps
            .iter()
            .find(|s| s["resource"] == uri)
            .unwrap_or_else(|| panic!("snapshot of {uri} in {init}"));
        assert_eq!(snapshot_from_seq(s), fresh_s0, "fromSeq = serverSeq");
        s["state"].clone()
    };
    assert_eq!(reduced_chat, fresh_state(chat), "reduced = fresh snapshot");
    assert_eq!(reduced_session, fresh_state(session));
    assert_eq!(
        reduced_chat,
        host_state(&r.t.hosts[1], "ahp-chat:/s2-x-main", &[session]),
        "reduced chat = host's chat (names translated)"
    );
    assert_eq!(
        reduced_session,
        host_state(&r.t.hosts[1], session, &[session]),
        "reduced session = host's session (names translated)"
    );
    assert_eq!(reduced_chat["turns"][0]["id"], "s2-turn");
    assert_eq!(reduced_chat["turns"][0]["message"]["text"], TRICKY_TEXT);
}

// ─── S3 ─────────────────────────────────────────────────────────────────────

/// A racer's envelopes until it has seen both `chat/turnStarted` echoes
/// and the winning turn's completion, then whatever is still on its way;
/// their `serverSeq`s strictly increase.
async fn race_envelopes(
    client: &Client,
    events: &mut ClientEventStream,
    chat: &str,
) -> Vec<ActionEnvelope> {
    let mut echoes = 0;
    let mut winner: Option<String> = None;
    let mut envs = actions_until(events, |e| {
        if is(e, chat, "chat/turnStarted") && e.origin.is_some() {
            echoes += 1;
            if e.rejection_reason.is_none() {
                winner = serde_json::to_value(&e.action)
                    .ok()
                    .and_then(|v| v["turnId"].as_str().map(str::to_string));
            }
        }
        echoes == 2
            && winner
                .as_deref()
                .is_some_and(|w| is_complete_of(e, chat, w))
    })
    .await;
    envs.extend(settle(client, events, &[chat]).await);
    assert_strictly_increasing(&envs);
    envs
}

/// Racer `me` (of alice and bob, with `ids` and dispatch `seqs`) saw both
/// echoes, exactly one accepted and one rejected with a reason; its own
/// echo shows its own clientId and clientSeq, the other's an opaque `r1.` id.
fn assert_race_echoes(
    envs: &[ActionEnvelope],
    chat: &str,
    me: usize,
    ids: [&str; 2],
    seqs: [i64; 2],
) {
    let echoes: Vec<&ActionEnvelope> = envs
        .iter()
        .filter(|e| is(e, chat, "chat/turnStarted"))
        .collect();
    assert_eq!(echoes.len(), 2, "client {me} sees both echoes");
    let accepted = echoes
        .iter()
        .filter(|e| e.rejection_reason.is_none())
        .count();
    assert_eq!(accepted, 1, "exactly one turn accepted (client {me})");
    let other = 1 - me;
    for e in &echoes {
        let o = e.origin.as_ref().expect("echo has origin");
        let text = serde_json::to_value(&e.action).expect("action")["message"]["text"].clone();
        if text == json!(format!("from {}", ["alice", "bob"][me])) {
            assert_eq!(o.client_id, ids[me], "own echo shows own clientId");
            assert_eq!(o.client_seq, seqs[me]);
        } else {
            assert!(
                o.client_id.starts_with("r1.") && o.client_id != ids[other],
                "another client's echo carries an opaque r1. id, got {:?}",
                o.client_id
            );
        }
    }
    let rejected = echoes
        .iter()
        .find(|e| e.rejection_reason.is_some())
        .expect("one rejected");
    assert!(
        !rejected
            .rejection_reason
            .as_deref()
            .unwrap_or_default()
            .is_empty()
    );
}

/// S3: two principals race `chat/turnStarted`: one accepted, one rejected, both converge on the host; echo origins are own id / opaque `r1.` id.
#[tokio::test]
async fn s3_turn_race_one_wins_both_converge() {
    let t = TestRelay::start(vec![host("a", 1, script(20, 16, 50))], "").await;
    let (chat, host_chat) = seeded_chat("a", 1);
    let ids = ["race-alice", "race-bob"];
    let alice = t.client_init("alice", ids[0]).await;
    let bob = t.client_init("bob", ids[1]).await;
    let mut ev = [alice.events(), bob.events()];
    let snaps = [
        subscribe_raw(&alice, &chat).await,
        subscribe_raw(&bob, &chat).await,
    ];
    let (ha, hb) = tokio::join!(
        alice.dispatch(
            chat.clone(),
            action(turn_started("turn-alice", "from alice"))
        ),
        bob.dispatch(chat.clone(), action(turn_started("turn-bob", "from bob"))),
    );
    let seqs = [
        ha.expect("alice dispatch").client_seq,
        hb.expect("bob dispatch").client_seq,
    ];

    let mut seen: Vec<Vec<ActionEnvelope>> = Vec::new();
    for (i, client) in [&alice, &bob].into_iter().enumerate() {
        seen.push(race_envelopes(client, &mut ev[i], &chat).await);
    }
    for (i, envs) in seen.iter().enumerate() {
        assert_race_echoes(envs, &chat, i, ids, seqs);
    }

    let expected = host_state(&t.hosts[0], &host_chat, &[]);
    let reduced: Vec<Value> = (0..2)
        .map(|i| reduce_chat(&snaps[i]["state"], &chat, &seen[i]))
        .collect();
    assert_eq!(reduced[0], expected, "alice converges on the host");
    assert_eq!(reduced[1], expected, "bob converges on the host");
    assert_eq!(expected["turns"].as_array().map(Vec::len), Some(1));
}

// ─── S4 ─────────────────────────────────────────────────────────────────────

/// S4: a subscribe that races a fast stream loses and doubles nothing: snapshot + later envelopes reduce to the host's final chat (§5.2).
#[tokio::test]
async fn s4_subscribe_mid_stream_loses_and_doubles_nothing() {
    const DELTAS: u32 = 2000;
    const ROUNDS: usize = 10;
    let t = TestRelay::start(vec![host("a", 1, script(DELTAS, 8, 0))], "").await;
    let (chat, host_chat) = seeded_chat("a", 1);
    let streamer = t.client_init("alice", "s4-streamer").await;
    let mut sev = streamer.events();
    let _ = subscribe_raw(&streamer, &chat).await;
    let mut mid_stream = 0;
    for round in 0..ROUNDS {
        let turn = format!("s4-turn-{round}");
        let late = t.client_init("bob", &format!("s4-late-{round}")).await;
        let mut lev = late.events();
        // Subscribe at a different point of the stream each round.
        stream_until(&t, &streamer, (&chat, &turn), 10 + (round as u64) * 180).await;
        let snap = subscribe_raw(&late, &chat).await;
        let from = snapshot_from_seq(&snap);
        let done_in_snapshot = snap["state"].get("activeTurn").is_none()
            && snap["state"]["turns"]
                .as_array()
                .and_then(|t| t.last())
                .is_some_and(|l| l["id"] == turn.as_str());
        let mut envs = if done_in_snapshot {
            Vec::new()
        } else {
            mid_stream += 1;
            actions_until(&mut lev, |e| is_complete_of(e, &chat, &turn)).await
        };
        let _ = actions_until(&mut sev, |e| is_complete_of(e, &chat, &turn)).await;
        envs.extend(settle(&late, &mut lev, &[&chat]).await);
        assert_contiguous(&envs, from);
        let reduced = reduce_chat(&snap["state"], &chat, &envs);
        let expected = host_state(&t.hosts[0], &host_chat, &[]);
        let text = |c: &Value| {
            c["turns"]
                .as_array()
                .and_then(|t| t.last())
                .expect("last turn")["responseParts"][0]["content"]
                .as_str()
                .map(str::len)
        };
        assert_eq!(
            text(&reduced),
            text(&expected),
            "round {round}: text length (lost or doubled delta)"
        );
        assert_eq!(text(&expected), Some(DELTAS as usize * 8));
        assert_eq!(reduced, expected, "round {round}: late subscriber = host");
        late.shutdown().await;
    }
    assert!(
        mid_stream >= 1,
        "no round subscribed while the turn was streaming"
    );
    eprintln!("s4: {mid_stream}/{ROUNDS} rounds subscribed mid-stream");
}

/// Subscribing again to the channel being streamed (a hold while the host
/// snapshots it, then a new floor), or leaving it and subscribing again,
/// in the middle of a turn: the envelopes numbered after the new snapshot
/// continue it densely, and the snapshot plus them reduce to the host's
/// state (nothing lost or doubled across the change of the channel's state).
#[tokio::test]
async fn a_stream_subscribed_again_mid_stream_loses_and_doubles_nothing() {
    const DELTAS: u32 = 2000;
    const ROUNDS: u64 = 6;
    let t = TestRelay::start(vec![host("a", 1, script(DELTAS, 8, 0))], "").await;
    let (chat, host_chat) = seeded_chat("a", 1);
    let client = t.client_init("alice", "again").await;
    let mut events = client.events();
    let _ = subscribe_raw(&client, &chat).await;
    let mut mid_stream = 0;
    for round in 0..ROUNDS {
        let turn = format!("again-{round}");
        stream_until(&t, &client, (&chat, &turn), 10 + round * 300).await;
        if round % 2 == 1 {
            client
                .notify("unsubscribe", json!({ "channel": chat }))
                .await
                .expect("unsubscribe");
        }
        let snap = subscribe_raw(&client, &chat).await;
        let from = snapshot_from_seq(&snap);
        let streaming = snap["state"].get("activeTurn").is_some();
        let mut envs = if streaming {
            mid_stream += 1;
            actions_until(&mut events, |e| {
                e.server_seq > from && is_complete_of(e, &chat, &turn)
            })
            .await
        } else {
            Vec::new()
        };
        envs.extend(settle(&client, &mut events, &[&chat]).await);
        envs.retain(|e| e.server_seq > from);
        assert_contiguous(&envs, from);
        let reduced = reduce_chat(&snap["state"], &chat, &envs);
        let expected = host_state(&t.hosts[0], &host_chat, &[]);
        assert_eq!(
            reduced, expected,
            "round {round}: snapshot + envelopes = host"
        );
    }
    assert!(mid_stream >= 1, "no round subscribed again while streaming");
    eprintln!("subscribed again mid-stream in {mid_stream}/{ROUNDS} rounds");
}

/// Leaving a channel in the middle of its stream stops its envelopes at
/// once: none reaches the client after the answer to a request sent behind
/// the `unsubscribe`, though the host streams on until it reads the
/// `unsubscribe` (its envelopes in flight are dropped, not delivered by a
/// route found before). Twice per run, the second time on a channel
/// subscribed again since.
#[tokio::test]
async fn a_stream_left_mid_stream_stops_at_the_unsubscribe() {
    const DELTAS: u32 = 20_000;
    let t = TestRelay::start(vec![host("a", 1, script(DELTAS, 8, 0))], "").await;
    let (chat, host_chat) = seeded_chat("a", 1);
    let mut alice = t.raw("alice").await;
    alice.initialize("leaver").await;
    let upstream = t.upstream_id("alice", "leaver");
    for round in 0..2u64 {
        let id = 10 * round;
        let s = alice
            .request(id + 1, "subscribe", json!({"channel": chat}))
            .await;
        assert_eq!(s["result"]["snapshot"]["resource"], chat.as_str(), "{s}");
        let turn = format!("left-{round}");
        alice
            .send_json(&dispatch_frame(
                &chat,
                round as i64 + 1,
                turn_started(&turn, "stream please"),
            ))
            .await;
        let mut seen = 0;
        let streamed = raw_actions_until(&mut alice, |_| {
            seen += 1;
            seen == 200
        })
        .await;
        assert!(streamed.iter().all(|e| e.channel == chat));
        alice
            .send_json(&notification_frame("unsubscribe", json!({"channel": chat})))
            .await;
        let _ = frames_before_ping(&mut alice, id + 2).await;
        let streaming = host_state(&t.hosts[0], &host_chat, &[])
            .get("activeTurn")
            .is_some();
        assert!(streaming, "round {round}: the host still streams the turn");
        wait_until("the host is told", || {
            t.hosts[0]
                .received_from(&upstream)
                .iter()
                .filter(|f| f.method.as_deref() == Some("unsubscribe"))
                .count() as u64
                > round
        })
        .await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let late: Vec<Value> = frames_before_ping(&mut alice, id + 3)
            .await
            .into_iter()
            .filter(|v| v["method"] == "action" && v["params"]["channel"] == chat.as_str())
            .collect();
        assert!(
            late.is_empty(),
            "round {round}: {} envelopes on the left channel after the unsubscribe, first {}",
            late.len(),
            late[0]
        );
    }
}

// ─── two hosts into one connection ──────────────────────────────────────────

/// Two hosts streaming at once into one connection: one dense, strictly increasing sequence; each chat reduces to its host's state.
#[tokio::test]
async fn two_hosts_interleave_into_one_sequence() {
    let t = TestRelay::start(
        vec![
            host("a", 1, script(1500, 10, 0)),
            host("b", 1, script(1500, 10, 0)),
        ],
        "",
    )
    .await;
    let (chat_a, host_a) = seeded_chat("a", 1);
    let (chat_b, host_b) = seeded_chat("b", 1);
    let client = t.client("alice").await;
    let mut events = client.events();
    let init = client
        .initialize("two-hosts".into(), vec!["1.0.0".into()], vec![])
        .await
        .expect("initialize");
    let s0 = init.server_seq as u64;
    let snap_a = subscribe_raw(&client, &chat_a).await;
    let snap_b = subscribe_raw(&client, &chat_b).await;
    assert_eq!(snapshot_from_seq(&snap_a), s0);
    assert_eq!(snapshot_from_seq(&snap_b), s0);
    let (da, db) = tokio::join!(
        client.dispatch(chat_a.clone(), action(turn_started("two-a", "go a"))),
        client.dispatch(chat_b.clone(), action(turn_started("two-b", "go b"))),
    );
    da.expect("dispatch a");
    db.expect("dispatch b");
    let (mut done_a, mut done_b) = (false, false);
    let mut all = actions_until(&mut events, |e| {
        done_a |= is(e, &chat_a, "chat/turnComplete");
        done_b |= is(e, &chat_b, "chat/turnComplete");
        done_a && done_b
    })
    .await;
    all.extend(settle(&client, &mut events, &[&chat_a, &chat_b]).await);
    assert_strictly_increasing(&all);
    assert_contiguous(&all, s0);
    let switches = all
        .windows(2)
        .filter(|w| w[0].channel != w[1].channel)
        .count();
    eprintln!(
        "two hosts: {} envelopes, {switches} channel switches",
        all.len()
    );
    assert_eq!(
        reduce_chat(&snap_a["state"], &chat_a, &all),
        host_state(&t.hosts[0], &host_a, &[]),
        "host a's chat intact"
    );
    assert_eq!(
        reduce_chat(&snap_b["state"], &chat_b, &all),
        host_state(&t.hosts[1], &host_b, &[]),
        "host b's chat intact"
    );
}

// ─── root ───────────────────────────────────────────────────────────────────

/// Hosts a (one session, a paced agent) and b (two sessions) behind a relay.
async fn root_hosts() -> TestRelay {
    TestRelay::start(
        vec![
            host("a", 1, script(10, 8, 100)),
            host("b", 2, script(5, 8, 0)),
        ],
        "",
    )
    .await
}

/// `sessionSummaryChanged` changes of `session` among `evs`.
fn summary_changes(evs: &[ClientEvent], session: &str) -> Vec<Value> {
    evs.iter()
        .filter_map(|e| match &e.event {
            SubscriptionEvent::SessionSummaryChanged(p) if p.session == session => {
                serde_json::to_value(&p.changes).ok()
            }
            _ => None,
        })
        .collect()
}

/// `sessionAdded` summaries of `uri` among `evs`.
fn added(evs: &[ClientEvent], uri: &str) -> Vec<Value> {
    evs.iter()
        .filter_map(|e| match &e.event {
            SubscriptionEvent::SessionAdded(p) if p.summary.resource == uri => {
                serde_json::to_value(&p.summary).ok()
            }
            _ => None,
        })
        .collect()
}

/// Every event queued for `client` before now (a ping answer follows them).
async fn remaining_events(client: &Client, events: &mut ClientEventStream) -> Vec<ClientEvent> {
    client.ping().await.expect("ping");
    let mut out = Vec::new();
    while let Ok(Some(e)) = tokio::time::timeout(Duration::from_millis(30), events.recv()).await {
        out.push(e);
    }
    out
}

/// What a root watcher saw while the catalog changed.
struct RootRun {
    t: TestRelay,
    /// The watcher's S0 and its root snapshot's state.
    s0: u64,
    state: Value,
    /// Every event the watcher got after its root snapshot.
    evs: Vec<ClientEvent>,
    /// Every event a direct client of host a (root subscribed) got.
    spy_evs: Vec<ClientEvent>,
    /// The watcher, the spy, the creator and the direct client, kept
    /// connected as they were while the events were collected.
    _clients: [Client; 4],
}

/// The session created through the relay in [`root_run`], and its chat.
const ROOT_NEW: &str = "ahp-session:/r5-new";
const ROOT_NEW_CHAT: &str = "ahp-chat:/a~r5-new-main";

/// A watcher subscribes the root (and a chat of host a, so it also holds a
/// link to a, which subscribes root upstream); then a client creates
/// [`ROOT_NEW`] on a through the relay and runs a turn in it, and a direct
/// client of host b creates a session there. Collects everything the
/// watcher and a direct root subscriber of host a saw.
async fn root_run() -> RootRun {
    let t = root_hosts().await;
    let watcher = t.client("rita").await;
    let mut wev = watcher.events();
    let init = watcher
        .initialize("root-watch".into(), vec!["1.0.0".into()], vec![])
        .await
        .expect("initialize");
    let root = subscribe_raw(&watcher, ROOT).await;
    let state = root["state"].clone();
    let (idle_chat, _) = seeded_chat("a", 1);
    let _ = subscribe_raw(&watcher, &idle_chat).await;
    let spy = connect(&t.hosts[0].url()).await;
    let mut spy_ev = spy.events();
    spy.initialize("root-spy".into(), vec!["1.0.0".into()], vec![ROOT.into()])
        .await
        .expect("spy initialize");
    let creator = t.client_init("carl", "root-creator").await;
    create_session(&creator, ROOT_NEW, "sim.a").await;
    let direct = connect_init(&t.hosts[1].url(), "direct-user").await;
    create_session(&direct, "ahp-session:/direct-5", "sim").await;
    let mut cev = creator.events();
    let _ = subscribe_raw(&creator, ROOT_NEW_CHAT).await;
    creator
        .dispatch(
            ROOT_NEW_CHAT.into(),
            action(turn_started("r5-turn", "work")),
        )
        .await
        .expect("dispatch");
    let _ = actions_until(&mut cev, |e| is(e, ROOT_NEW_CHAT, "chat/turnComplete")).await;
    let mut evs = events_until(&mut wev, |evs| {
        let changes = summary_changes(evs, ROOT_NEW);
        let active = reduce_root(&state, &actions_of(evs))["activeSessions"].clone();
        !added(evs, ROOT_NEW).is_empty()
            && !added(evs, "ahp-session:/b~direct-5").is_empty()
            && changes.iter().any(|c| c["status"] == IN_PROGRESS)
            && changes.last().is_some_and(|c| c["status"] == IDLE)
            && active == 5
    })
    .await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    evs.extend(remaining_events(&watcher, &mut wev).await);
    let spy_evs = remaining_events(&spy, &mut spy_ev).await;
    RootRun {
        t,
        s0: init.server_seq as u64,
        state,
        evs,
        spy_evs,
        _clients: [watcher, spy, creator, direct],
    }
}

/// §6.1: the relay's root snapshot (from the client's S0) merges both
/// hosts' agents as `<p>.<host>`, counts both hosts' sessions, and carries
/// neither a host's `config` nor its `_meta`.
#[tokio::test]
async fn root_snapshot_merges_agents_and_hides_host_config() {
    let t = root_hosts().await;
    let watcher = t.client("rita").await;
    let init = watcher
        .initialize("root-watch".into(), vec!["1.0.0".into()], vec![])
        .await
        .expect("initialize");
    let root = subscribe_raw(&watcher, ROOT).await;
    assert_eq!(root["resource"], ROOT);
    assert_eq!(snapshot_from_seq(&root), init.server_seq as u64);
    let state = &root["state"];
    assert!(
        state.get("config").is_none(),
        "no config in the relay root: {state}"
    );
    assert!(
        state.get("_meta").is_none(),
        "no host _meta in the relay root"
    );
    assert_eq!(state["activeSessions"], 3);
    let mut providers: Vec<&str> = state["agents"]
        .as_array()
        .expect("agents")
        .iter()
        .map(|a| a["provider"].as_str().expect("provider"))
        .collect();
    providers.sort();
    assert_eq!(providers, ["sim.a", "sim.b"], "agents qualified");
}

/// §6.3: a root watcher that also holds a link to the host gets
/// `sessionAdded` exactly once per new session, with the provider
/// qualified, for a session created through the relay (verbatim URI) and
/// for one created at the host by someone else (qualified URI).
#[tokio::test]
async fn root_session_added_reaches_the_watcher_once_per_session() {
    let run = root_run().await;
    let mine = added(&run.evs, ROOT_NEW);
    assert_eq!(mine.len(), 1, "sessionAdded once for {ROOT_NEW}");
    assert_eq!(mine[0]["provider"], "sim.a");
    let theirs = added(&run.evs, "ahp-session:/b~direct-5");
    assert_eq!(theirs.len(), 1, "host-created session qualified, once");
    assert_eq!(theirs[0]["provider"], "sim.b");
}

/// §6.3, §4.3: every `sessionSummaryChanged` the host sends reaches a root
/// watcher exactly once (though it also holds a link to that host), with
/// the chats in its changes translated to client names.
#[tokio::test]
async fn root_summary_changes_reach_the_watcher_once_each_translated() {
    let run = root_run().await;
    let host_changes = run
        .spy_evs
        .iter()
        .filter(|e| {
            matches!(&e.event, SubscriptionEvent::SessionSummaryChanged(p)
                if p.session == "ahp-session:/r5-new")
        })
        .count();
    assert!(host_changes >= 2);
    let changes = summary_changes(&run.evs, ROOT_NEW);
    assert_eq!(
        changes.len(),
        host_changes,
        "each host sessionSummaryChanged reaches the watcher once"
    );
    let chats: Vec<&Value> = changes
        .iter()
        .filter_map(|c| c.get("chats").and_then(Value::as_array))
        .flatten()
        .collect();
    assert!(
        !chats.is_empty(),
        "a summary change names the chats: {changes:?}"
    );
    for chat in chats {
        assert_eq!(chat["resource"], ROOT_NEW_CHAT, "summary chats translated");
    }
}

/// §5.1, §6.1: the watcher's root envelopes (only root ones, including
/// `root/activeSessionsChanged`) are numbered contiguously after its S0 and
/// reduce its snapshot to exactly a fresh client's root snapshot, still
/// without a host `config`.
#[tokio::test]
async fn root_envelopes_are_numbered_and_reduce_to_a_fresh_snapshot() {
    let run = root_run().await;
    let root_envs = actions_of(&run.evs);
    assert!(
        root_envs.iter().all(|e| e.channel == ROOT),
        "only root envelopes"
    );
    assert!(
        root_envs
            .iter()
            .any(|e| action_type(e) == "root/activeSessionsChanged"),
        "root/activeSessionsChanged relayed"
    );
    assert_contiguous(&root_envs, run.s0);
    let reduced = reduce_root(&run.state, &root_envs);
    assert_eq!(reduced["activeSessions"], 5);
    assert!(reduced.get("config").is_none());
    let fresh = run.t.client_init("rita", "root-fresh").await;
    let fresh_root = subscribe_raw(&fresh, ROOT).await;
    assert_eq!(
        reduced, fresh_root["state"],
        "reduced root = fresh root snapshot"
    );
}

// ─── S18 ────────────────────────────────────────────────────────────────────

/// S18: a VS Code-mode host broadcasts catalog and progress: each client gets only its own `root/progress`, and `root/sessionAdded` exactly once.
#[tokio::test]
async fn s18_broadcasting_host_progress_and_catalog_once() {
    let mut cfg = host("v", 1, script(5, 8, 0));
    cfg.vscode_compat = true;
    // VS Code names: the client derives the default chat from the
    // qualified session `sim.v:/<uuid>`.
    let session = format!("sim.v:/{}", naming::seeded_uuid(&cfg, 1));
    let chat = naming::vscode_chat_uri(&session, naming::DEFAULT_CHAT_ID);
    let t = TestRelay::start(vec![cfg], "").await;
    let mut a = t.raw("alice").await;
    let mut b = t.raw("bob").await;
    for (raw, id) in [(&mut a, "s18-a"), (&mut b, "s18-b")] {
        let init = raw.initialize(id).await;
        assert!(init.get("result").is_some(), "initialize: {init}");
        let sub = raw.request(1, "subscribe", json!({"channel": ROOT})).await;
        assert!(sub.get("result").is_some(), "root subscribe: {sub}");
        // A per-client link to the host, which broadcasts to it too.
        let sub = raw.request(2, "subscribe", json!({"channel": chat})).await;
        assert!(sub.get("result").is_some(), "chat subscribe: {sub}");
    }
    let mut got_a = Vec::new();
    let mut got_b = Vec::new();
    for (who, uri, token) in [
        ("a", "ahp-session:/s18-x", "tok-a"),
        ("b", "ahp-session:/s18-y", "tok-b"),
    ] {
        let creator = if who == "a" { &mut a } else { &mut b };
        let params = json!({"channel": uri, "provider": "sim.v", "progressToken": token});
        creator
            .send_json(&request_frame(10, "createSession", params))
            .await;
        let frames = frames_until(creator, |v| v["id"] == 10 && v.get("method").is_none()).await;
        let answer = frames.last().expect("answer");
        assert_eq!(answer["result"], Value::Null, "createSession: {answer}");
        if who == "a" {
            got_a.extend(frames);
        } else {
            got_b.extend(frames);
        }
        // Both hear of the session through the watch link; then a round
        // trip through the host on each one's own link (where the host
        // broadcasts too) and a ping: every copy has reached the relay and
        // whatever it forwarded is read.
        let added = |v: &Value| {
            v["method"] == "root/sessionAdded" && v["params"]["summary"]["resource"] == uri
        };
        for (raw, got) in [(&mut a, &mut got_a), (&mut b, &mut got_b)] {
            if !got.iter().any(added) {
                got.extend(frames_until(raw, added).await);
            }
            got.extend(raw_host_barrier(raw, 19, &chat).await);
            got.extend(frames_before_ping(raw, 20).await);
        }
    }
    for (name, got, own, other) in [
        ("a", &got_a, "tok-a", "tok-b"),
        ("b", &got_b, "tok-b", "tok-a"),
    ] {
        let progress: Vec<&Value> = got
            .iter()
            .filter(|f| f["method"] == "root/progress")
            .collect();
        assert_eq!(
            progress.len(),
            1,
            "{name}: exactly one root/progress: {progress:?}"
        );
        let p = &progress[0]["params"];
        assert_eq!(p["progressToken"], own, "{name}: its own token, unprefixed");
        assert_eq!(p["channel"], ROOT);
        assert_eq!(
            (p["progress"].clone(), p["total"].clone()),
            (json!(1), json!(1))
        );
        assert_eq!(
            count(got, "root/progress", |p| p["progressToken"] == other),
            0,
            "{name}: never another client's progress"
        );
        for uri in ["ahp-session:/s18-x", "ahp-session:/s18-y"] {
            assert_eq!(
                count(got, "root/sessionAdded", |p| p["summary"]["resource"]
                    == uri),
                1,
                "{name}: sessionAdded for {uri} exactly once"
            );
        }
        assert!(
            got.iter()
                .filter(|f| f["method"] == "root/sessionAdded")
                .all(|f| f["params"]["summary"]["provider"] == "sim.v"),
            "{name}: catalog provider qualified"
        );
    }
}

// ─── rejections ─────────────────────────────────────────────────────────────

/// Dispatches `act` on `channel` as `client_seq` and returns its echo, which
/// must carry a `rejectionReason` and come before any other envelope.
async fn rejection_echo(x: &mut RawWs, channel: &str, client_seq: i64, act: &Value) -> Value {
    x.dispatch(channel, client_seq, act.clone()).await;
    let frames = frames_until(x, |v| {
        v["method"] == "action" && v["params"]["origin"]["clientSeq"] == client_seq
    })
    .await;
    let env = frames.last().expect("echo")["params"].clone();
    assert!(
        frames[..frames.len() - 1]
            .iter()
            .all(|f| f["method"] != "action"),
        "no other envelope before the echo: {frames:?}"
    );
    let reason = env["rejectionReason"].as_str().unwrap_or_default();
    assert!(
        !reason.is_empty(),
        "echo {client_seq} carries a rejectionReason: {env}"
    );
    env
}

/// Dispatches every one of which is rejected, with whether the host (not
/// the relay) rejects it: a cancel of no turn (host), an unknown action
/// type, a malformed `chat/turnStarted` and a server-only root action
/// (relay).
fn refused_dispatches(chat: &str) -> [(&str, Value, bool); 4] {
    [
        (
            chat,
            json!({"type": "chat/turnCancelled", "turnId": "no-such-turn", "duration": 0}),
            true,
        ),
        (
            chat,
            json!({"type": "chat/nonsense", "extra": {"k": [1, "two"]}}),
            false,
        ),
        (
            chat,
            json!({"type": "chat/turnStarted", "turnId": 7}),
            false,
        ),
        (
            ROOT,
            json!({"type": "root/configChanged", "config": {"mode": "x"}}),
            false,
        ),
    ]
}

/// §5.3: host rejections are numbered with the client's own origin; relay-made rejections carry channel, action as dispatched, origin, reason, a number, and reach only the dispatcher.
#[tokio::test]
async fn rejections_are_numbered_and_attributed() {
    let t = TestRelay::start(vec![host("a", 1, script(5, 8, 0))], "").await;
    let (chat, _) = seeded_chat("a", 1);
    let mut x = t.raw("xena").await;
    let init = x.initialize("rej-x").await;
    let s0 = init["result"]["serverSeq"].as_u64().expect("serverSeq");
    let sub = x.request(1, "subscribe", json!({"channel": chat})).await;
    let from = sub["result"]["snapshot"]["fromSeq"]
        .as_u64()
        .expect("fromSeq");
    assert_eq!(from, s0);
    let observer = t.client_init("yuri", "rej-y").await;
    let mut oev = observer.events();
    let _ = subscribe_raw(&observer, &chat).await;

    let dispatches = refused_dispatches(&chat);
    for (i, (channel, act, from_host)) in dispatches.iter().enumerate() {
        let client_seq = 100 + i as i64;
        let env = rejection_echo(&mut x, channel, client_seq, act).await;
        assert_eq!(
            env["serverSeq"],
            from + 1 + i as u64,
            "echo {i} numbered next: {env}"
        );
        assert_eq!(env["channel"], *channel, "echo {i} on the client's channel");
        assert_eq!(
            env["origin"]["clientId"], "rej-x",
            "echo {i} origin is the client's id"
        );
        if !from_host {
            assert_eq!(
                env["action"], *act,
                "relay echo {i} carries the action as dispatched"
            );
        } else {
            assert_eq!(env["action"]["type"], "chat/turnCancelled");
        }
    }

    let mut seen = actions_within(&mut oev, Duration::from_millis(200)).await;
    seen.extend(drain_actions(&observer, &mut oev).await);
    assert_eq!(
        seen.len(),
        1,
        "observer sees only the host's rejection: {seen:?}"
    );
    let o = seen[0].origin.as_ref().expect("origin");
    assert!(seen[0].rejection_reason.is_some());
    assert!(
        o.client_id.starts_with("r1.") && o.client_id != "rej-x",
        "another client's echo has an opaque id: {}",
        o.client_id
    );
    assert_eq!(o.client_seq, 100);
    let forwarded = t.hosts[0]
        .received()
        .iter()
        .filter(|f| f.method.as_deref() == Some("dispatchAction"))
        .count();
    assert_eq!(
        forwarded, 1,
        "relay-refused dispatches never reach the host"
    );
}

// ─── slow consumer ──────────────────────────────────────────────────────────

/// §5.9: a client that stops reading is closed with 4008 once its queue has
/// stayed over the frame bound for `slow_client_secs`, while another client
/// of the same host receives the whole turn in order.
/// A link's batch whose envelopes the replay buffer cannot all hold (4 here)
/// is queued as it comes instead of being kept for the batch's end. The
/// client pauses so its queue fills, its link stops and the host's socket
/// backs up: the batches read when it resumes are far longer than the
/// buffer. The turn still arrives whole, in order, numbered without a gap.
#[tokio::test]
async fn a_batch_longer_than_the_replay_buffer_arrives_whole_and_in_order() {
    let limits = "\n[limits]\nreplay_buffer_envelopes = 4\nclient_queue_frames = 1024\n";
    let t = TestRelay::start(vec![host("a", 1, script(8, 24, 0))], limits).await;
    let (chat, _) = seeded_chat("a", 1);
    let mut pausing = t.raw_small_window("sloth", 64 * 1024).await;
    pausing.initialize("pausing").await;
    let sub = pausing
        .request(1, "subscribe", json!({"channel": chat}))
        .await;
    let from = snapshot_from_seq(&sub["result"]["snapshot"]);
    let driver = t.client("fred").await;
    driver
        .initialize("driver".into(), vec!["1.0.0".into()], vec![])
        .await
        .expect("initialize");
    subscribe_raw(&driver, &chat).await;
    // The streaming load mode: 20,000 pre-rendered ~320-byte deltas written
    // many to a write (~6 MiB: more than the kernel buffers of a client
    // that does not read absorb on loopback, ~4 MiB, so the queue fills).
    driver
        .dispatch(chat.clone(), action(turn_started("t", "[stream:20000]")))
        .await
        .expect("dispatch");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (mut seqs, mut deltas) = (Vec::new(), 0);
    loop {
        let frame = pausing.recv_json().await.expect("the turn's envelopes");
        if frame["method"] != "action" {
            continue;
        }
        seqs.push(frame["params"]["serverSeq"].as_u64().expect("serverSeq"));
        match frame["params"]["action"]["type"].as_str() {
            Some("chat/delta") => deltas += 1,
            Some("chat/turnComplete") => break,
            _ => {}
        }
    }
    assert_eq!(deltas, 20_000, "every delta");
    let want: Vec<u64> = (from + 1..from + 1 + seqs.len() as u64).collect();
    assert_eq!(seqs, want, "numbered in order without a gap");
}

#[tokio::test]
async fn slow_consumer_is_closed_others_unaffected() {
    slow_consumer_case("\n[limits]\nclient_queue_frames = 16\nslow_client_secs = 1\n").await;
}

/// §5.9: the same with the byte bound (256 KiB = 4 frames of 64 KiB) and a
/// frame bound too large to matter.
#[tokio::test]
async fn slow_consumer_is_closed_by_the_byte_bound() {
    slow_consumer_case(
        "\n[limits]\nclient_queue_frames = 100000\nclient_queue_bytes = 262144\nslow_client_secs = 1\n",
    )
    .await;
}

async fn slow_consumer_case(limits: &str) {
    // 160 deltas of 64 KiB (~10 MiB, paced so a reading client never lags
    // 16 frames behind) exceed what the kernel buffers of a peer that does
    // not read absorb on loopback (~4 MiB measured), so the non-reading
    // client's queue must overflow.
    let t = TestRelay::start(vec![host("a", 1, script(160, 64 * 1024, 120))], limits).await;
    let (chat, host_chat) = seeded_chat("a", 1);
    // A fixed 64 KiB receive window: however the relay writes, the kernel
    // absorbs only so much for a client that does not read, so the turn
    // fills the relay's bounds.
    let mut slow = t.raw_small_window("sloth", 64 * 1024).await;
    slow.initialize("slow").await;
    let sub = slow.request(1, "subscribe", json!({"channel": chat})).await;
    assert!(sub.get("result").is_some(), "subscribe: {sub}");
    // From here on `slow` reads nothing until the turn is over.

    let fast = t.client("fred").await;
    let mut events = fast.events();
    let init = fast
        .initialize("fast".into(), vec!["1.0.0".into()], vec![])
        .await
        .expect("initialize");
    let snap = subscribe_raw(&fast, &chat).await;
    assert_eq!(snapshot_from_seq(&snap), init.server_seq as u64);
    fast.dispatch(chat.clone(), action(turn_started("long", "a long one")))
        .await
        .expect("dispatch");
    let mut envs = actions_until(&mut events, |e| is(e, &chat, "chat/turnComplete")).await;
    envs.extend(settle(&fast, &mut events, &[&chat]).await);
    assert_contiguous(&envs, init.server_seq as u64);
    assert_eq!(
        reduce_chat(&snap["state"], &chat, &envs),
        host_state(&t.hosts[0], &host_chat, &[]),
        "the reading client got everything"
    );
    // `slow` is slow only while it reads nothing: the relay closes it once
    // its queue overflows or its link has had no room for slow_client_secs.
    // Only after the relay says so (its counter) does `slow` read; reading
    // earlier would make it a client that caught up, rightly not closed.
    let closes = &t.relay.relay.metrics.slow_consumer_closes;
    wait_until("the relay to find the client slow", || closes.get() >= 1).await;
    let close = slow.close_code().await;
    assert_eq!(
        close.as_ref().map(|c| c.0),
        Some(4008),
        "slow consumer closed with 4008, got {close:?}"
    );
}

/// Host frames far larger than the host read buffer (`upstream_read_buffer_bytes`
/// at its 4 KiB minimum, deltas of 64 KiB) reach the client whole, numbered
/// densely, and reduce to the host's state: a frame is assembled across as
/// many reads as it takes.
#[tokio::test]
async fn frames_larger_than_the_host_read_buffer_arrive_whole() {
    let limits = "\n[limits]\nupstream_read_buffer_bytes = 4096\n";
    let t = TestRelay::start(vec![host("a", 1, script(24, 64 * 1024, 0))], limits).await;
    let (chat, host_chat) = seeded_chat("a", 1);
    let client = t.client("fred").await;
    let mut events = client.events();
    let init = client
        .initialize("fast".into(), vec!["1.0.0".into()], vec![])
        .await
        .expect("initialize");
    let snap = subscribe_raw(&client, &chat).await;
    client
        .dispatch(chat.clone(), action(turn_started("big", "big deltas")))
        .await
        .expect("dispatch");
    let mut envs = actions_until(&mut events, |e| is(e, &chat, "chat/turnComplete")).await;
    envs.extend(settle(&client, &mut events, &[&chat]).await);
    assert_contiguous(&envs, init.server_seq as u64);
    assert!(envs.len() >= 24, "every delta arrived: {}", envs.len());
    assert_eq!(
        reduce_chat(&snap["state"], &chat, &envs),
        host_state(&t.hosts[0], &host_chat, &[]),
        "the client's state is the host's"
    );
}

//! Streaming through the relay (contract §5.1–5.3, §5.9, §6.1–6.4; scenarios
//! S2, S3, S4, S18): one sequence per client over many hosts, the subscribe
//! merge rule, echoes and rejections, the merged root and catalog
//! notifications, and slow-consumer isolation. Real TLS sockets, simulated
//! hosts, the official `ahp` client (raw sockets where the SDK hides frames).
//!
//! States are compared as whole JSON trees: the client's reduced state, a
//! fresh subscriber's snapshot, and the host's own state with its names
//! translated to client names by [`client_names`] (an independent
//! implementation of §4.2–4.3: host URIs qualified `<host>~<id>` unless
//! client-chosen, providers `<p>@<host>`).

mod common;

use std::time::Duration;

use ahp::{Client, ClientEvent, ClientEventStream, SubscriptionEvent};
use ahp_relay::simhost::AgentScript;
use ahp_relay::simhost::clock::now_iso;
use ahp_types::actions::{ActionEnvelope, StateAction};
use common::relay::TestRelay;
use common::*;
use serde_json::{Value, json};

const ROOT: &str = "ahp-root://";
/// 2^53 − 1, the largest number every AHP client represents exactly.
const MAX_SAFE: u64 = (1 << 53) - 1;
/// `SessionStatus::Idle` and `SessionStatus::InProgress` bits.
const IDLE: u32 = 1;
const IN_PROGRESS: u32 = 8;
/// Message text that looks like envelope fields and names a host URI: the
/// relay must relay it untouched (§4.3: message text is never rewritten).
const TRICKY_TEXT: &str =
    "see \"serverSeq\":1,\"channel\":\"ahp-chat:/s2-x-main\" \\ {\"origin\":{}} ✓ é";

// ─── helpers ────────────────────────────────────────────────────────────────

fn script(reply_deltas: u32, delta_bytes: usize, delta_rate: u32) -> AgentScript {
    AgentScript {
        reply_deltas,
        delta_bytes,
        delta_rate,
        tool_confirmation: false,
        seed: None,
    }
}

fn action(v: Value) -> StateAction {
    let a: StateAction = serde_json::from_value(v.clone()).expect("action literal parses");
    assert!(
        !matches!(a, StateAction::Unknown(_)),
        "not a known action: {v}"
    );
    a
}

fn turn_started(turn_id: &str, text: &str) -> StateAction {
    action(
        json!({"type": "chat/turnStarted", "turnId": turn_id, "startedAt": now_iso(),
        "message": {"text": text, "origin": {"kind": "user"}}}),
    )
}

fn is(e: &ActionEnvelope, channel: &str, ty: &str) -> bool {
    e.channel == channel && action_type(e) == ty
}

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

/// A host URI in client names: host-assigned ids are qualified with
/// `<host>~`, client-chosen ones (`verbatim`, by `<scheme>:/<id>`) kept.
fn client_uri(host: &str, s: &str, verbatim: &[&str]) -> String {
    for scheme in ["ahp-session:/", "ahp-chat:/", "ahp-terminal:/"] {
        let Some(rest) = s.strip_prefix(scheme) else {
            continue;
        };
        if rest.is_empty() || rest.starts_with('/') {
            return s.to_string();
        }
        let head = rest.split('/').next().unwrap_or(rest);
        if verbatim.contains(&format!("{scheme}{head}").as_str()) {
            return s.to_string();
        }
        return format!("{scheme}{host}~{rest}");
    }
    s.to_string()
}

/// A host state (JSON) with every name translated to client names.
fn client_names(host: &str, v: &Value, verbatim: &[&str]) -> Value {
    match v {
        Value::String(s) => Value::String(client_uri(host, s, verbatim)),
        Value::Array(a) => {
            Value::Array(a.iter().map(|x| client_names(host, x, verbatim)).collect())
        }
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, x)| match (k.as_str(), x) {
                    ("provider", Value::String(p)) => (k.clone(), json!(format!("{p}@{host}"))),
                    _ => (k.clone(), client_names(host, x, verbatim)),
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The host's state of `host_uri`, in client names.
fn host_state(t: &TestRelay, i: usize, host_uri: &str, verbatim: &[&str]) -> Value {
    let h = &t.hosts[i];
    let state = h
        .channel_state(host_uri)
        .unwrap_or_else(|| panic!("host has {host_uri}"));
    client_names(&h.config().name, &state, verbatim)
}

/// Envelopes still on their way: a ping barrier, then a quiet window (frames
/// a host sends right after the last awaited one may still be on a link).
async fn settle(client: &Client, events: &mut ClientEventStream) -> Vec<ActionEnvelope> {
    tokio::time::sleep(Duration::from_millis(150)).await;
    drain_actions(client, events).await
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

async fn create_session(client: &Client, uri: &str, provider: &str) {
    client
        .request::<_, ()>(
            "createSession",
            json!({"channel": uri, "provider": provider}),
        )
        .await
        .unwrap_or_else(|e| panic!("createSession {uri}: {e:?}"));
}

/// Raw frames received before the answer to a `ping` with `id`.
async fn frames_before_ping(raw: &mut RawWs, id: u64) -> Vec<Value> {
    raw.send_json(
        &json!({"jsonrpc": "2.0", "id": id, "method": "ping", "params": {"channel": ROOT}}),
    )
    .await;
    let mut before = Vec::new();
    loop {
        let v = raw
            .recv_json()
            .await
            .expect("socket open until the ping answer");
        if v.get("id") == Some(&json!(id)) && v.get("method").is_none() {
            return before;
        }
        before.push(v);
    }
}

/// Raw frames up to and including the first one `stop` accepts.
async fn frames_until(raw: &mut RawWs, mut stop: impl FnMut(&Value) -> bool) -> Vec<Value> {
    let mut out = Vec::new();
    loop {
        let v = raw.recv_json().await.expect("socket open");
        let done = stop(&v);
        out.push(v);
        if done {
            return out;
        }
    }
}

fn count(frames: &[Value], method: &str, pred: impl Fn(&Value) -> bool) -> usize {
    frames
        .iter()
        .filter(|f| f["method"] == method && pred(&f["params"]))
        .count()
}

// ─── S2 ─────────────────────────────────────────────────────────────────────

/// S2: a session created on host B streams one sequence (dense from S0, fromSeqs in it) and reduces to a fresh snapshot and to the host's state.
#[tokio::test]
async fn s2_created_session_streams_one_sequence_and_converges() {
    let t = TestRelay::start(
        vec![
            host("a", 1, script(5, 16, 0)),
            host("b", 1, script(300, 12, 0)),
        ],
        "",
    )
    .await;
    let session = "ahp-session:/s2-x";
    let client = t.client("alice").await;
    let mut events = client.events();
    let before = now_us();
    let init = client
        .initialize("s2-client".into(), vec!["1.0.0".into()], vec![])
        .await
        .expect("initialize");
    let s0 = u64::try_from(init.server_seq).expect("S0 is non-negative");
    assert!(
        s0 >= before && s0 <= now_us() + 5_000_000 && s0 <= MAX_SAFE,
        "S0 {s0} is not microseconds since the epoch (test clock {before})"
    );

    create_session(&client, session, "sim@b").await;
    let session_snap = subscribe_raw(&client, session).await;
    assert_eq!(session_snap["resource"], session);
    assert_eq!(
        snapshot_from_seq(&session_snap),
        s0,
        "nothing numbered yet: the snapshot's fromSeq is S0"
    );
    assert_eq!(session_snap["state"]["provider"], "sim@b");
    let chats = session_snap["state"]["chats"].as_array().expect("chats");
    assert_eq!(chats.len(), 1, "one default chat: {chats:?}");
    let chat = chats[0]["resource"].as_str().expect("chat uri").to_string();
    assert_eq!(chat, "ahp-chat:/b~s2-x-main", "default chat qualified");

    let mut all = drain_actions(&client, &mut events).await;
    let chat_snap = subscribe_raw(&client, &chat).await;
    let chat_from = snapshot_from_seq(&chat_snap);
    assert_eq!(
        chat_from,
        s0 + all.len() as u64,
        "chat fromSeq = last number issued before the response"
    );
    let handle = client
        .dispatch(chat.clone(), turn_started("s2-turn", TRICKY_TEXT))
        .await
        .expect("dispatch");
    all.extend(actions_until(&mut events, |e| is(e, &chat, "chat/turnComplete")).await);
    all.extend(settle(&client, &mut events).await);

    assert_strictly_increasing(&all);
    assert_contiguous(&all, s0);
    let chat_envs = on(&all, &chat);
    assert!(chat_envs.len() > 300, "every delta relayed");
    assert!(chat_envs.iter().all(|e| e.server_seq > chat_from));
    let echo = &chat_envs[0];
    assert_eq!(action_type(echo), "chat/turnStarted");
    let origin = echo.origin.as_ref().expect("echo has origin");
    assert_eq!(
        (origin.client_id.as_str(), origin.client_seq),
        ("s2-client", handle.client_seq)
    );
    assert!(echo.rejection_reason.is_none());

    let reduced_chat = reduce_chat(&chat_snap["state"], &chat, &all);
    let reduced_session = reduce_session(&session_snap["state"], session, &all);
    // A fresh client takes both snapshots in its InitializeResult: they
    // share one fromSeq, its serverSeq.
    let fresh = t.client("bob").await;
    let init: Value = fresh
        .request(
            "initialize",
            json!({"channel": ROOT, "protocolVersions": ["1.0.0"], "clientId": "s2-fresh",
                "initialSubscriptions": [session, chat]}),
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
    assert_eq!(reduced_chat, fresh_state(&chat), "reduced = fresh snapshot");
    assert_eq!(reduced_session, fresh_state(session));
    assert_eq!(
        reduced_chat,
        host_state(&t, 1, "ahp-chat:/s2-x-main", &[session]),
        "reduced chat = host's chat (names translated)"
    );
    assert_eq!(
        reduced_session,
        host_state(&t, 1, session, &[session]),
        "reduced session = host's session (names translated)"
    );
    assert_eq!(reduced_chat["turns"][0]["id"], "s2-turn");
    assert_eq!(reduced_chat["turns"][0]["message"]["text"], TRICKY_TEXT);
}

// ─── S3 ─────────────────────────────────────────────────────────────────────

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
        alice.dispatch(chat.clone(), turn_started("turn-alice", "from alice")),
        bob.dispatch(chat.clone(), turn_started("turn-bob", "from bob")),
    );
    let seqs = [
        ha.expect("alice dispatch").client_seq,
        hb.expect("bob dispatch").client_seq,
    ];

    let mut seen: Vec<Vec<ActionEnvelope>> = Vec::new();
    for (i, client) in [&alice, &bob].into_iter().enumerate() {
        let mut echoes = 0;
        let mut winner: Option<String> = None;
        let mut envs = actions_until(&mut ev[i], |e| {
            if is(e, &chat, "chat/turnStarted") && e.origin.is_some() {
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
                    .is_some_and(|w| is_complete_of(e, &chat, w))
        })
        .await;
        envs.extend(settle(client, &mut ev[i]).await);
        assert_strictly_increasing(&envs);
        seen.push(envs);
    }

    for (i, envs) in seen.iter().enumerate() {
        let echoes: Vec<&ActionEnvelope> = envs
            .iter()
            .filter(|e| is(e, &chat, "chat/turnStarted"))
            .collect();
        assert_eq!(echoes.len(), 2, "client {i} sees both echoes");
        let accepted = echoes
            .iter()
            .filter(|e| e.rejection_reason.is_none())
            .count();
        assert_eq!(accepted, 1, "exactly one turn accepted (client {i})");
        let (me, other) = (i, 1 - i);
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

    let expected = host_state(&t, 0, &host_chat, &[]);
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
        let start = t.hosts[0].server_seq();
        streamer
            .dispatch(chat.clone(), turn_started(&turn, "stream please"))
            .await
            .expect("dispatch");
        // Subscribe at a different point of the stream each round.
        let target = start + 10 + (round as u64) * 180;
        let deadline = tokio::time::Instant::now() + WAIT;
        while t.hosts[0].server_seq() < target && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
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
        envs.extend(settle(&late, &mut lev).await);
        assert_contiguous(&envs, from);
        let reduced = reduce_chat(&snap["state"], &chat, &envs);
        let expected = host_state(&t, 0, &host_chat, &[]);
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
        client.dispatch(chat_a.clone(), turn_started("two-a", "go a")),
        client.dispatch(chat_b.clone(), turn_started("two-b", "go b")),
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
    all.extend(settle(&client, &mut events).await);
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
        host_state(&t, 0, &host_a, &[]),
        "host a's chat intact"
    );
    assert_eq!(
        reduce_chat(&snap_b["state"], &chat_b, &all),
        host_state(&t, 1, &host_b, &[]),
        "host b's chat intact"
    );
}

// ─── root ───────────────────────────────────────────────────────────────────

/// Root through the relay: qualified agents, no config, numbered activeSessionsChanged, sessionAdded (verbatim and qualified) and sessionSummaryChanged.
#[tokio::test]
async fn root_follows_catalog_and_activity_across_hosts() {
    let t = TestRelay::start(
        vec![
            host("a", 1, script(10, 8, 100)),
            host("b", 2, script(5, 8, 0)),
        ],
        "",
    )
    .await;
    let watcher = t.client("rita").await;
    let mut wev = watcher.events();
    let init = watcher
        .initialize("root-watch".into(), vec!["1.0.0".into()], vec![])
        .await
        .expect("initialize");
    let s0 = init.server_seq as u64;
    let root = subscribe_raw(&watcher, ROOT).await;
    assert_eq!(root["resource"], ROOT);
    assert_eq!(snapshot_from_seq(&root), s0);
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
    assert_eq!(providers, ["sim@a", "sim@b"], "agents qualified");

    // The watcher also holds a link to host a (which subscribes root
    // upstream): catalog events must still arrive once, from the watch link.
    let (idle_chat, _) = seeded_chat("a", 1);
    let _ = subscribe_raw(&watcher, &idle_chat).await;
    // A client of host a itself counts the catalog events the host sends.
    let spy = connect(&t.hosts[0].url()).await;
    let mut spy_ev = spy.events();
    spy.initialize("root-spy".into(), vec!["1.0.0".into()], vec![ROOT.into()])
        .await
        .expect("spy initialize");

    let creator = t.client_init("carl", "root-creator").await;
    let new = "ahp-session:/r5-new";
    create_session(&creator, new, "sim@a").await;
    let direct = connect_init(&t.hosts[1].url(), "direct-user").await;
    create_session(&direct, "ahp-session:/direct-5", "sim").await;
    let new_chat = "ahp-chat:/a~r5-new-main";
    let mut cev = creator.events();
    let _ = subscribe_raw(&creator, new_chat).await;
    creator
        .dispatch(new_chat.into(), turn_started("r5-turn", "work"))
        .await
        .expect("dispatch");
    let _ = actions_until(&mut cev, |e| is(e, new_chat, "chat/turnComplete")).await;

    let summary_changes = |evs: &[ClientEvent]| -> Vec<Value> {
        evs.iter()
            .filter_map(|e| match &e.event {
                SubscriptionEvent::SessionSummaryChanged(p) if p.session == new => {
                    serde_json::to_value(&p.changes).ok()
                }
                _ => None,
            })
            .collect()
    };
    let added = |evs: &[ClientEvent], uri: &str| -> Vec<Value> {
        evs.iter()
            .filter_map(|e| match &e.event {
                SubscriptionEvent::SessionAdded(p) if p.summary.resource == uri => {
                    serde_json::to_value(&p.summary).ok()
                }
                _ => None,
            })
            .collect()
    };
    let evs = events_until(&mut wev, |evs| {
        let changes = summary_changes(evs);
        let active = reduce_root(state, &actions_of(evs))["activeSessions"].clone();
        !added(evs, new).is_empty()
            && !added(evs, "ahp-session:/b~direct-5").is_empty()
            && changes.iter().any(|c| c["status"] == IN_PROGRESS)
            && changes.last().is_some_and(|c| c["status"] == IDLE)
            && active == 5
    })
    .await;
    let mut evs = evs;
    tokio::time::sleep(Duration::from_millis(150)).await;
    watcher.ping().await.expect("ping");
    while let Ok(Some(e)) = tokio::time::timeout(Duration::from_millis(30), wev.recv()).await {
        evs.push(e);
    }

    let mine = added(&evs, new);
    assert_eq!(mine.len(), 1, "sessionAdded once for {new}");
    assert_eq!(mine[0]["provider"], "sim@a");
    let theirs = added(&evs, "ahp-session:/b~direct-5");
    assert_eq!(theirs.len(), 1, "host-created session qualified, once");
    assert_eq!(theirs[0]["provider"], "sim@b");
    let mut spy_evs = Vec::new();
    spy.ping().await.expect("spy ping");
    while let Ok(Some(e)) = tokio::time::timeout(Duration::from_millis(30), spy_ev.recv()).await {
        spy_evs.push(e);
    }
    let host_changes = spy_evs
        .iter()
        .filter(|e| {
            matches!(&e.event, SubscriptionEvent::SessionSummaryChanged(p)
                if p.session == "ahp-session:/r5-new")
        })
        .count();
    assert!(host_changes >= 2);
    assert_eq!(
        summary_changes(&evs).len(),
        host_changes,
        "each host sessionSummaryChanged reaches the watcher once"
    );
    for c in summary_changes(&evs) {
        if let Some(chats) = c.get("chats").and_then(Value::as_array) {
            for chat in chats {
                assert_eq!(chat["resource"], new_chat, "summary chats translated");
            }
        }
    }
    let root_envs = actions_of(&evs);
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
    assert_contiguous(&root_envs, s0);
    let reduced = reduce_root(state, &root_envs);
    assert_eq!(reduced["activeSessions"], 5);
    assert!(reduced.get("config").is_none());
    let fresh = t.client_init("rita", "root-fresh").await;
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
    let t = TestRelay::start(vec![cfg], "").await;
    let mut a = t.raw("alice").await;
    let mut b = t.raw("bob").await;
    for (raw, id) in [(&mut a, "s18-a"), (&mut b, "s18-b")] {
        let init = raw.initialize(id).await;
        assert!(init.get("result").is_some(), "initialize: {init}");
        let sub = raw.request(1, "subscribe", json!({"channel": ROOT})).await;
        assert!(sub.get("result").is_some(), "root subscribe: {sub}");
        // A per-client link to the host, which broadcasts to it too.
        let (chat, _) = seeded_chat("v", 1);
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
        let params = json!({"channel": uri, "provider": "sim@v", "progressToken": token});
        creator
            .send_json(
                &json!({"jsonrpc": "2.0", "id": 10, "method": "createSession", "params": params}),
            )
            .await;
        let frames = frames_until(creator, |v| v["id"] == 10 && v.get("method").is_none()).await;
        let answer = frames.last().expect("answer");
        assert_eq!(answer["result"], Value::Null, "createSession: {answer}");
        if who == "a" {
            got_a.extend(frames);
        } else {
            got_b.extend(frames);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        got_a.extend(frames_before_ping(&mut a, 20).await);
        got_b.extend(frames_before_ping(&mut b, 20).await);
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
                .all(|f| f["params"]["summary"]["provider"] == "sim@v"),
            "{name}: catalog provider qualified"
        );
    }
}

// ─── rejections ─────────────────────────────────────────────────────────────

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

    let dispatches = [
        (
            chat.as_str(),
            json!({"type": "chat/turnCancelled", "turnId": "no-such-turn", "duration": 0}),
            true,
        ),
        (
            chat.as_str(),
            json!({"type": "chat/nonsense", "extra": {"k": [1, "two"]}}),
            false,
        ),
        (
            chat.as_str(),
            json!({"type": "chat/turnStarted", "turnId": 7}),
            false,
        ),
        (
            ROOT,
            json!({"type": "root/configChanged", "config": {"mode": "x"}}),
            false,
        ),
    ];
    let mut expect_seq = from;
    for (i, (channel, act, from_host)) in dispatches.iter().enumerate() {
        let client_seq = 100 + i as i64;
        x.send_json(&json!({"jsonrpc": "2.0", "method": "dispatchAction",
            "params": {"channel": channel, "clientSeq": client_seq, "action": act}}))
            .await;
        let frames = frames_until(&mut x, |v| {
            v["method"] == "action" && v["params"]["origin"]["clientSeq"] == client_seq
        })
        .await;
        let env = &frames.last().expect("echo")["params"];
        assert!(
            frames[..frames.len() - 1]
                .iter()
                .all(|f| f["method"] != "action"),
            "no other envelope before the echo: {frames:?}"
        );
        expect_seq += 1;
        assert_eq!(
            env["serverSeq"], expect_seq,
            "echo {i} numbered next: {env}"
        );
        assert_eq!(env["channel"], *channel, "echo {i} on the client's channel");
        assert_eq!(
            env["origin"]["clientId"], "rej-x",
            "echo {i} origin is the client's id"
        );
        let reason = env["rejectionReason"].as_str().unwrap_or_default();
        assert!(
            !reason.is_empty(),
            "echo {i} carries a rejectionReason: {env}"
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
    let mut slow = t.raw("sloth").await;
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
    fast.dispatch(chat.clone(), turn_started("long", "a long one"))
        .await
        .expect("dispatch");
    let mut envs = actions_until(&mut events, |e| is(e, &chat, "chat/turnComplete")).await;
    envs.extend(settle(&fast, &mut events).await);
    assert_contiguous(&envs, init.server_seq as u64);
    assert_eq!(
        reduce_chat(&snap["state"], &chat, &envs),
        host_state(&t, 0, &host_chat, &[]),
        "the reading client got everything"
    );
    let close = slow.close_code().await;
    assert_eq!(
        close.as_ref().map(|c| c.0),
        Some(4008),
        "slow consumer closed with 4008, got {close:?}"
    );
}

//! Backpressure instead of disconnects (contract §5.9): a host streaming as
//! fast as it can (the simhost's `[stream:<n>]` load mode) to a client that
//! reads slowly is slowed through TCP, and the client gets every action in
//! order; a client that stops reading is closed with 4008 only after
//! `slow_client_secs`, and resumes by `reconnect` with `replay`; neither
//! slows another client of the same host. Real TLS sockets, simulated hosts.

mod common;

use std::time::Duration;

use ahp_relay::simhost::clock::now_iso;
use common::relay::{TestRelay, admin_get, metric};
use common::*;
use serde_json::{Value, json};

const ROOT: &str = "ahp-root://";

/// Limits that make the client queue small, so a client that lags fills it.
const SMALL_QUEUE: &str = "\n[limits]\nclient_queue_frames = 64\n";

fn stream_turn(chat: &str, turn_id: &str, n: u64) -> Value {
    let turn = json!({"type": "chat/turnStarted", "turnId": turn_id, "startedAt": now_iso(),
        "message": {"text": format!("load [stream:{n}]"), "origin": {"kind": "user"}}});
    json!({"jsonrpc": "2.0", "method": "dispatchAction",
        "params": {"channel": chat, "clientSeq": 1, "action": turn}})
}

/// A raw client initialized as `client_id`, subscribed to `chat`; returns
/// the socket and the snapshot's `fromSeq`.
async fn subscribed(t: &TestRelay, sub: &str, client_id: &str, chat: &str) -> (RawWs, u64) {
    let mut ws = t.raw(sub).await;
    ws.initialize(client_id).await;
    let r = ws.request(1, "subscribe", json!({"channel": chat})).await;
    let from = r["result"]["snapshot"]["fromSeq"]
        .as_u64()
        .unwrap_or_else(|| panic!("subscribe answered: {}", short(&r)));
    (ws, from)
}

/// What a client saw of a streamed turn.
#[derive(Default)]
struct Seen {
    /// `chat/delta` envelopes of the turn.
    deltas: u64,
    /// The client's `serverSeq` of the last envelope seen.
    last: u64,
    /// Whether `chat/turnComplete` arrived.
    complete: bool,
    /// How the socket closed, if it did.
    closed: Option<(u16, String)>,
}

impl Seen {
    /// Takes one frame: envelopes must be numbered next after `last`.
    fn take(&mut self, frame: &Value, turn_id: &str) {
        if frame["method"] != "action" {
            return;
        }
        let p = &frame["params"];
        let seq = p["serverSeq"].as_u64().expect("envelope numbered");
        assert_eq!(seq, self.last + 1, "envelopes arrive numbered in order");
        self.last = seq;
        if p["action"]["turnId"] != turn_id {
            return;
        }
        match p["action"]["type"].as_str() {
            Some("chat/delta") => {
                assert!(!self.complete, "no delta after turnComplete");
                self.deltas += 1;
            }
            Some("chat/turnComplete") => self.complete = true,
            _ => {}
        }
    }

    /// Reads up to `n` frames (or until the turn completes or the socket
    /// closes); `false` once nothing more will come.
    async fn read(&mut self, ws: &mut RawWs, turn_id: &str, n: usize) -> bool {
        for _ in 0..n {
            match ws.next_within(WAIT).await {
                Some(Next::Frame(f)) => self.take(&f, turn_id),
                Some(Next::Closed(c)) => {
                    self.closed = c;
                    return false;
                }
                None => panic!("no frame within {WAIT:?} ({} deltas so far)", self.deltas),
            }
            if self.complete {
                return false;
            }
        }
        true
    }
}

const WAIT: Duration = Duration::from_secs(20);

/// Reads a whole turn as fast as possible.
async fn read_turn(ws: &mut RawWs, turn_id: &str, after: u64) -> Seen {
    let mut seen = Seen {
        last: after,
        ..Seen::default()
    };
    while seen.read(ws, turn_id, usize::MAX).await {}
    seen
}

/// §5.9: a host streams 60,000 deltas flat out to a client that reads
/// slowly for 5 s (100 frames per 25 ms) then fast: every delta arrives,
/// numbered in order, and the socket stays open. Meanwhile a client of
/// another chat on the same host streams a whole turn and its pings are
/// answered while the slow client is still behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_is_slowed_not_closed() {
    let t = TestRelay::start(vec![host_with("a", 2)], SMALL_QUEUE).await;
    let (chat, _) = seeded_chat("a", 1);
    let (other_chat, _) = seeded_chat("a", 2);
    let (mut slow, from) = subscribed(&t, "sloth", "slow", &chat).await;
    let (mut fast, fast_from) = subscribed(&t, "fred", "fast", &other_chat).await;
    slow.send_json(&stream_turn(&chat, "slow-turn", 60_000))
        .await;

    let mut seen = Seen {
        last: from,
        ..Seen::default()
    };
    let slow_until = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut other_done = false;
    while tokio::time::Instant::now() < slow_until {
        assert!(
            seen.read(&mut slow, "slow-turn", 100).await,
            "the slow reader finished or closed within its slow phase: {} deltas, {:?}",
            seen.deltas,
            seen.closed
        );
        if !other_done {
            // The other client streams a whole turn and is answered while
            // the slow one is still behind.
            fast.send_json(&stream_turn(&other_chat, "fast-turn", 20_000))
                .await;
            let other = read_turn(&mut fast, "fast-turn", fast_from).await;
            assert_eq!((other.deltas, other.complete), (20_000, true));
            let pong = fast.request(9, "ping", json!({"channel": ROOT})).await;
            assert_eq!(pong["result"], Value::Null, "ping answered: {pong}");
            other_done = true;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(!seen.complete, "the slow reader was still behind");
    while seen.read(&mut slow, "slow-turn", usize::MAX).await {}
    assert_eq!(seen.closed, None, "no close");
    assert_eq!((seen.deltas, seen.complete), (60_000, true));
    let pong = slow.request(9, "ping", json!({"channel": ROOT})).await;
    assert_eq!(pong["result"], Value::Null, "still open: {pong}");
    let (_, page) = admin_get(&t, "/metrics").await;
    assert_eq!(
        metric(&page, "ahp_relay_slow_consumer_closes_total"),
        Some(0.0)
    );
}

/// §5.9: a client that stops reading is closed with 4008 after
/// `slow_client_secs` (1 s here); its session keeps buffering, and a
/// `reconnect` from the last envelope it read gets a `replay` of the rest
/// of the stream, contiguous (the frame limit is raised so that one answer
/// holds however much of the stream the relay buffered by then). Another client of the same host streams a
/// whole turn while the first one is stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_reader_is_closed_after_slow_client_secs_and_replays() {
    let limits = format!(
        "{SMALL_QUEUE}slow_client_secs = 1\nreplay_buffer_envelopes = 200000\n\
         replay_buffer_bytes = 134217728\nmax_frame_bytes = 67108864\n"
    );
    let t = TestRelay::start(vec![host_with("a", 2)], &limits).await;
    let (chat, _) = seeded_chat("a", 1);
    let (other_chat, _) = seeded_chat("a", 2);
    let (mut stopped, from) = subscribed(&t, "sloth", "stopped", &chat).await;
    let (mut fast, fast_from) = subscribed(&t, "fred", "fast", &other_chat).await;
    stopped
        .send_json(&stream_turn(&chat, "stop-turn", 60_000))
        .await;

    fast.send_json(&stream_turn(&other_chat, "fast-turn", 20_000))
        .await;
    let other = read_turn(&mut fast, "fast-turn", fast_from).await;
    assert_eq!((other.deltas, other.complete), (20_000, true));

    // The relay closes it only after the queue stayed full for 1 s.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (_, page) = admin_get(&t, "/metrics").await;
        if metric(&page, "ahp_relay_slow_consumer_closes_total") == Some(1.0) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never closed as slow"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let seen = read_turn(&mut stopped, "stop-turn", from).await;
    assert_eq!(
        seen.closed.as_ref().map(|c| c.0),
        Some(4008),
        "closed as a slow consumer after {} deltas",
        seen.deltas
    );
    assert!(seen.deltas < 60_000, "closed before the end");

    let mut back = t.raw("sloth").await;
    back.send_json(&json!({"jsonrpc": "2.0", "id": 2, "method": "reconnect",
        "params": {"channel": ROOT, "clientId": "stopped", "lastSeenServerSeq": seen.last,
            "subscriptions": [chat]}}))
        .await;
    let answer = back.response(&json!(2)).await;
    assert_eq!(answer["result"]["type"], "replay", "{}", short(&answer));
    let mut resumed = Seen {
        last: seen.last,
        deltas: seen.deltas,
        ..Seen::default()
    };
    for env in answer["result"]["actions"].as_array().expect("actions") {
        resumed.take(&json!({"method": "action", "params": env}), "stop-turn");
    }
    if !resumed.complete {
        while resumed.read(&mut back, "stop-turn", usize::MAX).await {}
    }
    assert_eq!(
        (resumed.deltas, resumed.complete),
        (60_000, true),
        "after the replay of {} actions; closed {:?}",
        answer["result"]["actions"].as_array().map_or(0, Vec::len),
        resumed.closed
    );
}

/// A host with `sessions` seeded chats streaming flat out.
fn host_with(name: &str, sessions: usize) -> ahp_relay::simhost::SimHostConfig {
    let mut cfg = fast_config(name, sessions);
    cfg.stream_rate = 0;
    cfg
}

fn short(v: &Value) -> String {
    v.to_string().chars().take(400).collect()
}

/// A link streaming flat out still carries its client's requests: while a
/// host streams a turn as fast as it can to a client that reads as fast as
/// it can, the client subscribes to another chat of the same host (a request
/// that link carries) and is answered while the turn still streams — deltas
/// arrive after the answer — and every delta arrives, in order. (That a
/// queued command comes before host frames already read is proved without
/// sockets' timing: `upstream::link::tests`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_carried_while_its_link_streams_flat_out() {
    const N: u64 = 100_000;
    let t = TestRelay::start(vec![host_with("a", 2)], "").await;
    let (chat, _) = seeded_chat("a", 1);
    let (other_chat, _) = seeded_chat("a", 2);
    let (mut ws, from) = subscribed(&t, "fred", "streamer", &chat).await;
    ws.send_json(&stream_turn(&chat, "long-turn", N)).await;
    let mut seen = Seen {
        last: from,
        ..Seen::default()
    };
    while seen.deltas == 0 {
        assert!(seen.read(&mut ws, "long-turn", 1).await, "the turn streams");
    }
    ws.send_json(&json!({"jsonrpc": "2.0", "id": 7, "method": "subscribe",
        "params": {"channel": other_chat}}))
        .await;
    let mut deltas_at_answer = None;
    while !seen.complete {
        match ws.next_within(WAIT).await {
            Some(Next::Frame(f)) if f["id"] == 7 => {
                assert!(
                    f["result"]["snapshot"].is_object(),
                    "subscribed: {}",
                    short(&f)
                );
                deltas_at_answer = Some(seen.deltas);
            }
            Some(Next::Frame(f)) => seen.take(&f, "long-turn"),
            Some(Next::Closed(c)) => panic!("closed {c:?} after {} deltas", seen.deltas),
            None => panic!("no frame within {WAIT:?} ({} deltas so far)", seen.deltas),
        }
    }
    assert_eq!(seen.deltas, N, "every delta arrives");
    let at = deltas_at_answer.expect("the subscribe was answered before the turn completed");
    assert!(
        at < N,
        "deltas arrived after the answer ({at} of {N} before it)"
    );
}

//! The streaming load mode of the simulated host (`[stream:<n>]` in a turn's
//! message): numbered, stamped, pre-rendered `chat/delta` frames; pacing;
//! no replay across the stream. The `#[ignore]`d test is the direct-rate
//! measurement: `cargo test --release --test simhost_load -- --ignored --nocapture`.

mod common;

use std::time::Instant;

use ahp_relay::simhost::clock::now_iso;
use ahp_relay::simhost::stream::{now_micros, stamp_of};
use ahp_relay::simhost::{SimHost, SimHostConfig};
use common::*;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

const CHAT: &str = "ahp-chat:/load-1-main";

fn load_config(rate: u32) -> SimHostConfig {
    let mut cfg = fast_config("load", 1);
    cfg.stream_rate = rate;
    cfg
}

fn stream_turn(turn_id: &str, n: u64) -> Value {
    let turn = json!({"type": "chat/turnStarted", "turnId": turn_id, "startedAt": now_iso(),
        "message": {"text": format!("bench [stream:{n}]"), "origin": {"kind": "user"}}});
    json!({"jsonrpc": "2.0", "method": "dispatchAction",
        "params": {"channel": CHAT, "clientSeq": 1, "action": turn}})
}

/// What a client saw of one streamed turn.
struct Seen {
    /// `serverSeq` of every `chat/delta`, in arrival order.
    seqs: Vec<u64>,
    /// Send stamps (µs since the epoch) of every delta.
    stamps: Vec<u64>,
    /// `serverSeq` of the `chat/turnComplete`.
    complete: u64,
}

async fn read_stream(ws: &mut RawWs, turn_id: &str) -> Seen {
    let mut seen = Seen {
        seqs: Vec::new(),
        stamps: Vec::new(),
        complete: 0,
    };
    loop {
        let f = ws.recv_json().await.expect("socket open");
        let p = &f["params"];
        if f["method"] != "action" || p["action"]["turnId"] != turn_id {
            continue;
        }
        let seq = p["serverSeq"].as_u64().expect("serverSeq");
        match p["action"]["type"].as_str() {
            Some("chat/delta") => {
                seen.seqs.push(seq);
                let text = p["action"]["content"].as_str().expect("content");
                seen.stamps.push(stamp_of(text).expect("stamped delta"));
            }
            Some("chat/turnComplete") => {
                seen.complete = seq;
                return seen;
            }
            _ => {}
        }
    }
}

/// A `[stream:n]` turn delivers exactly n deltas, numbered contiguously in
/// the host sequence and before `chat/turnComplete`, each stamped no
/// earlier than the dispatch; the host's own state does not grow by them,
/// and a `reconnect` from inside the stream gets a snapshot, not a replay
/// with a gap.
#[tokio::test]
async fn stream_marker_streams_numbered_stamped_deltas() {
    let host: SimHost = start_host(load_config(0)).await;
    let mut ws = RawWs::connect(&host.url()).await;
    ws.initialize("load-client").await;
    let sub = ws.request(1, "subscribe", json!({"channel": CHAT})).await;
    assert!(sub["result"]["snapshot"].is_object(), "{sub}");
    let before = now_micros();
    ws.send_json(&stream_turn("s1", 5000)).await;
    let seen = read_stream(&mut ws, "s1").await;
    assert_eq!(seen.seqs.len(), 5000);
    let first = seen.seqs[0];
    assert!(
        seen.seqs
            .iter()
            .enumerate()
            .all(|(i, s)| *s == first + i as u64)
    );
    assert_eq!(seen.complete, first + 5000);
    assert!(
        seen.stamps
            .iter()
            .all(|s| *s >= before && *s <= now_micros())
    );
    assert!(seen.stamps.windows(2).all(|w| w[0] <= w[1]));
    let chat = host.channel_state(CHAT).expect("chat");
    assert_eq!(chat["turns"][0]["id"], "s1");
    assert_eq!(chat["turns"][0]["state"], "complete");
    let mut again = RawWs::connect(&host.url()).await;
    let resp = again
        .request(
            1,
            "reconnect",
            json!({"channel": "ahp-root://", "clientId": "load-client",
                   "lastSeenServerSeq": first + 10, "subscriptions": [CHAT]}),
        )
        .await;
    assert_eq!(resp["result"]["type"], "snapshot", "{resp}");
}

/// With `stream_rate` set the stream is paced: the last delta is not sent
/// before n/rate seconds have passed since the dispatch.
#[tokio::test]
async fn paced_stream_never_runs_ahead_of_its_rate() {
    let host = start_host(load_config(2000)).await;
    let mut ws = RawWs::connect(&host.url()).await;
    ws.initialize("paced-client").await;
    ws.request(1, "subscribe", json!({"channel": CHAT})).await;
    let before = now_micros();
    ws.send_json(&stream_turn("p1", 400)).await;
    let seen = read_stream(&mut ws, "p1").await;
    assert_eq!(seen.seqs.len(), 400);
    let last = *seen.stamps.last().expect("stamps");
    assert!(
        last >= before + 400 * 1_000_000 / 2000,
        "the 400th delta at 2000/s left {} µs after the dispatch",
        last - before
    );
}

/// With `record_write_waits` the host notes, per streamed batch, how long it
/// waited from its stamp to its write: one note per batch (at most one per
/// delta), none longer than the whole turn took, taken once; a host
/// without the switch notes none.
#[tokio::test]
async fn write_waits_are_noted_per_batch_only_when_asked() {
    let mut cfg = load_config(2000);
    cfg.record_write_waits = true;
    let host = start_host(cfg).await;
    let plain = start_host(load_config(2000)).await;
    for (h, id) in [(&host, "waits-client"), (&plain, "plain-client")] {
        let mut ws = RawWs::connect(&h.url()).await;
        ws.initialize(id).await;
        ws.request(1, "subscribe", json!({"channel": CHAT})).await;
        let before = now_micros();
        ws.send_json(&stream_turn("w1", 400)).await;
        let seen = read_stream(&mut ws, "w1").await;
        assert_eq!(seen.seqs.len(), 400);
        let took = now_micros() - before;
        let waits = h.take_write_waits();
        match h.config().record_write_waits {
            true => {
                assert!(
                    !waits.is_empty() && waits.len() <= 400,
                    "{} notes",
                    waits.len()
                );
                assert!(
                    waits.iter().all(|w| u64::from(*w) <= took),
                    "a wait longer than the turn ({took} µs): {waits:?}"
                );
                assert!(h.take_write_waits().is_empty(), "taken twice");
            }
            false => assert!(waits.is_empty(), "noted without the switch"),
        }
    }
}

/// Direct rate of the streaming load mode to one client, counted by a
/// raw tokio-tungstenite reader that parses only the stamp; prints
/// actions/s and the latency percentiles. Run in release mode.
#[test]
#[ignore = "a measurement: cargo test --release --test simhost_load -- --ignored --nocapture"]
fn direct_stream_rate() {
    let n: u64 = std::env::var("AHP_STREAM_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3_000_000);
    let host_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("simhost")
        .enable_all()
        .build()
        .expect("host runtime");
    let client_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("client runtime");
    let host = host_rt.block_on(async { start_host(load_config(0)).await });
    let url = host.url();
    let (count, secs, mut lat) = client_rt.block_on(async move {
        let (mut ws, _) = tokio_tungstenite::connect_async(&url)
            .await
            .expect("connect");
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "channel": "ahp-root://", "protocolVersions": ["1.0.0"], "clientId": "bench",
            "initialSubscriptions": [CHAT]}});
        ws.send(Message::text(init.to_string()))
            .await
            .expect("send");
        ws.next().await.expect("initialize answer").expect("frame");
        ws.send(Message::text(stream_turn("b1", n).to_string()))
            .await
            .expect("send");
        let finder = memchr::memmem::Finder::new(b"\"content\":\"@");
        let (mut count, mut start, mut lat) = (0u64, None, Vec::new());
        while count < n {
            let Some(Ok(Message::Text(t))) = ws.next().await else {
                panic!("stream ended")
            };
            let Some(at) = finder.find(t.as_bytes()) else {
                continue;
            };
            start.get_or_insert_with(Instant::now);
            count += 1;
            if count % 64 == 0 {
                let digits = t.as_str().get(at + 11..at + 28).and_then(stamp_of);
                if let Some(sent) = digits {
                    lat.push(now_micros().saturating_sub(sent));
                }
            }
        }
        let secs = start.map_or(0.0, |s| s.elapsed().as_secs_f64());
        (count, secs, lat)
    });
    lat.sort_unstable();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 - 1.0) * p) as usize)
            .copied()
            .unwrap_or(0)
    };
    println!(
        "direct stream: {count} actions in {secs:.3} s = {:.0} actions/s; latency p50 {} µs, p99 {} µs",
        count as f64 / secs,
        pct(0.5),
        pct(0.99)
    );
    if let Some(cpu) = thread_cpu_secs("simhost") {
        println!(
            "host threads: {cpu:.3} s CPU = {:.0} ns per action (the rate one free core allows: {:.0}/s)",
            cpu * 1e9 / count as f64,
            count as f64 / cpu
        );
    }
    assert_eq!(count, n);
    drop(host);
}

/// CPU seconds (user + system) used so far by this process's threads
/// named `name` (Linux `/proc`; `None` elsewhere).
fn thread_cpu_secs(name: &str) -> Option<f64> {
    let ticks_per_sec = 100.0;
    let mut total = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let dir = task.ok()?.path();
        let comm = std::fs::read_to_string(dir.join("comm")).ok()?;
        if comm.trim() != name {
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
        let after = stat.rsplit_once(')')?.1;
        let fields: Vec<&str> = after.split_whitespace().collect();
        let utime: u64 = fields.get(11)?.parse().ok()?;
        let stime: u64 = fields.get(12)?.parse().ok()?;
        total += utime + stime;
    }
    Some(total as f64 / ticks_per_sec)
}

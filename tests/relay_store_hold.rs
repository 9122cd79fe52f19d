//! A create's store write never stalls an edge thread (§4.2, §4.5): the
//! name is confirmed before the create is answered, while the other
//! connections on the same thread are served as usual.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ahp_relay::names::store::{Owner, Quota, RedbStore, StoreError, UriEntry, UriState, UriStore};
use common::fast_config;
use common::relay::TestRelay;
use serde_json::{Value, json};

type Res<T> = Result<T, StoreError>;

/// How long a confirm takes in [`SlowConfirm`].
const WRITE: Duration = Duration::from_millis(1500);

/// An in-memory store whose `confirm` takes [`WRITE`] (a slow disk or a
/// distant database), telling when it starts and ends.
struct SlowConfirm {
    inner: RedbStore,
    started: AtomicBool,
    ended: AtomicBool,
}

impl UriStore for SlowConfirm {
    fn reserve(&self, u: &str, h: &str, o: &Owner, t: u64) -> Res<()> {
        self.inner.reserve(u, h, o, t)
    }
    fn reserve_within(&self, u: &str, h: &str, o: &Owner, t: u64, q: Quota) -> Res<()> {
        self.inner.reserve_within(u, h, o, t, q)
    }
    fn confirm(&self, uri: &str) -> Res<()> {
        self.started.store(true, Ordering::SeqCst);
        std::thread::sleep(WRITE);
        let done = self.inner.confirm(uri);
        self.ended.store(true, Ordering::SeqCst);
        done
    }
    fn release(&self, uri: &str) -> Res<()> {
        self.inner.release(uri)
    }
    fn tombstone(&self, uri: &str, now: u64, ttl_secs: u64) -> Res<()> {
        self.inner.tombstone(uri, now, ttl_secs)
    }
    fn lookup(&self, uri: &str) -> Res<Option<UriEntry>> {
        self.inner.lookup(uri)
    }
    fn entries_for_host(&self, host: &str) -> Res<Vec<UriEntry>> {
        self.inner.entries_for_host(host)
    }
    fn purge_expired(&self, now: u64) -> Res<usize> {
        self.inner.purge_expired(now)
    }
    fn health(&self) -> Res<()> {
        self.inner.health()
    }
}

/// A relay in front of `host` on a fresh [`SlowConfirm`] store (with
/// `edge_threads` when given), its watch link up.
async fn on_slow_store(
    host: ahp_relay::simhost::SimHostConfig,
    edge_threads: Option<usize>,
) -> (TestRelay, Arc<SlowConfirm>) {
    let store = Arc::new(SlowConfirm {
        inner: RedbStore::open_in_memory().expect("in-memory store"),
        started: AtomicBool::new(false),
        ended: AtomicBool::new(false),
    });
    let shared = store.clone() as Arc<dyn UriStore>;
    let tweak = |cfg: &mut ahp_relay::config::RelayConfig| {
        if edge_threads.is_some() {
            cfg.listen.edge_threads = edge_threads;
        }
    };
    let t = TestRelay::start_on_store(vec![host], "", "", tweak, Some(shared)).await;
    t.wait_hosts_up().await;
    (t, store)
}

/// Alice's `createSession` waits for its slow confirm and is answered
/// once the name is confirmed; meanwhile Bob, on the same (only) edge
/// thread, gets every answer well within the write's time — an edge thread
/// that waited for the write would have held his answer for all of it.
#[tokio::test]
async fn a_slow_create_commit_leaves_the_edge_thread_serving() {
    let (t, store) = on_slow_store(fast_config("a", 2), Some(1)).await;
    let mut alice = t.raw("alice").await;
    alice.initialize("c1").await;
    let mut bob = t.raw("bob").await;
    bob.initialize("c2").await;

    let uri = "ahp-session:/held";
    let written = store.clone();
    let create = tokio::spawn(async move {
        let params = json!({"channel": uri, "provider": "sim.a"});
        let answer = alice.request(1, "createSession", params).await;
        (answer, written.ended.load(Ordering::SeqCst))
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while !store.started.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "the create reached the store");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (mut probes, mut slowest, mut n) = (0, Duration::ZERO, 10);
    while !store.ended.load(Ordering::SeqCst) {
        let at = Instant::now();
        let r = bob.request(n, "noSuchMethod", json!({})).await;
        assert!(r["error"]["code"].is_i64(), "the relay answers it: {r}");
        slowest = slowest.max(at.elapsed());
        probes += 1;
        n += 1;
    }
    assert!(probes >= 2, "Bob was answered during the write ({probes})");
    assert!(
        slowest < WRITE / 2,
        "Bob's slowest answer during the write took {slowest:?}"
    );

    let (answer, written) = create.await.expect("alice's create");
    assert_eq!(answer["result"], Value::Null, "{answer}");
    assert!(written, "answered only after the write ended");
    let state = store.lookup(uri).ok().flatten().map(|e| e.state);
    assert_eq!(
        state,
        Some(UriState::Confirmed),
        "the answered name is confirmed"
    );
}

/// While a create's confirm is slow, the host's stream on the same link
/// goes on: its envelopes read after the create's answer wait behind it,
/// and the client gets every one of them exactly once, numbered in order
/// (§4.5, §5.1), the answer once, after the write.
#[tokio::test]
async fn a_stream_behind_a_slow_create_arrives_whole_and_in_order() {
    let mut host = fast_config("a", 2);
    host.stream_rate = 2_000;
    let (t, store) = on_slow_store(host, None).await;
    let (chat, _) = common::seeded_chat("a", 1);
    let session = "ahp-session:/a~a-1";
    let mut ws = t.raw("alice").await;
    ws.initialize("c1").await;
    let r = ws.request(1, "subscribe", json!({"channel": chat})).await;
    let mut last = r["result"]["snapshot"]["fromSeq"]
        .as_u64()
        .unwrap_or_else(|| panic!("subscribed: {r}"));
    let turn = json!({"type": "chat/turnStarted", "turnId": "t1",
        "startedAt": ahp_relay::simhost::clock::now_iso(),
        "message": {"text": "load [stream:4000]", "origin": {"kind": "user"}}});
    ws.send_json(&json!({"jsonrpc": "2.0", "method": "dispatchAction",
        "params": {"channel": chat, "clientSeq": 1, "action": turn}}))
        .await;
    ws.send_json(&json!({"jsonrpc": "2.0", "id": 2, "method": "createChat",
        "params": {"channel": session, "chat": "ahp-chat:/held"}}))
        .await;

    let (mut deltas, mut complete, mut answers) = (0, false, 0);
    let (mut before, mut after) = (0, 0);
    while !complete {
        let frame = match ws.next_within(Duration::from_secs(20)).await {
            Some(common::Next::Frame(f)) => f,
            other => panic!("the stream stopped after {deltas} deltas: {other:?}"),
        };
        if frame["id"] == 2 {
            assert_eq!(frame["result"], Value::Null, "{frame}");
            assert!(
                store.ended.load(Ordering::SeqCst),
                "answered after the write"
            );
            answers += 1;
            continue;
        }
        if frame["method"] != "action" {
            continue;
        }
        let p = &frame["params"];
        let seq = p["serverSeq"].as_u64().expect("numbered");
        assert_eq!(seq, last + 1, "numbered in order, none lost or repeated");
        last = seq;
        if p["action"]["turnId"] != "t1" {
            continue;
        }
        match p["action"]["type"].as_str() {
            Some("chat/delta") if answers == 0 => (deltas, before) = (deltas + 1, before + 1),
            Some("chat/delta") => (deltas, after) = (deltas + 1, after + 1),
            Some("chat/turnComplete") => complete = true,
            _ => {}
        }
    }
    assert_eq!(answers, 1, "the create answered once");
    // The stream lasts ~2 s and the write 1.5 s: what the link read after
    // the host's answer was held, then came behind the relay's.
    assert!(
        after > 0,
        "deltas held behind the answer ({before} before it)"
    );
    assert_eq!(
        deltas, 4000,
        "every delta arrived ({before} before the answer, {after} after)"
    );
    assert!(
        store.started.load(Ordering::SeqCst),
        "the create went through the store"
    );
}

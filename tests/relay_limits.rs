//! Every §3.6 limit the session enforces, one test each, over real sockets:
//! subscriptions per session (also `initialSubscriptions` and
//! `reconnect.subscriptions`, de-duplicated), requests awaiting a host,
//! requests per second, the client idle timeout, the forwarded-request
//! timeout, the link command queue, the upstream frame size, the store's
//! per-principal quota and tombstone purge — and a `reconnect` frame just
//! under the frame limit, full of distinct channels, that is answered
//! while another client's pings keep being answered.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use ahp_relay::devkit::DEV_ISSUER;
use ahp_relay::identity::PrincipalKey;
use ahp_relay::names::store::{Owner, RedbStore, UriStore};
use common::relay::{TestRelay, admin_get, metric};
use common::*;
use serde_json::{Value, json};

const ROOT: &str = "ahp-root://";

/// One host `a` with three seeded sessions and `[limits]` `limits`.
async fn start(limits: &str) -> TestRelay {
    TestRelay::start(
        vec![fast_config("a", 3)],
        &format!("\n[limits]\n{limits}\n"),
    )
    .await
}

/// The client form of seeded session `n` of host `a`.
fn session(n: u32) -> String {
    format!("ahp-session:/a~a-{n}")
}

/// A raw client of `who`, initialized as `client_id` and subscribed to
/// `session(n)` (so its link to the host is open).
async fn subscribed(t: &TestRelay, who: &str, client_id: &str, n: u32) -> RawWs {
    let mut ws = t.raw(who).await;
    ws.initialize(client_id).await;
    let r = ws
        .request(1, "subscribe", json!({"channel": session(n)}))
        .await;
    assert!(r["result"]["snapshot"].is_object(), "link open: {r}");
    ws
}

async fn hits(t: &TestRelay, limit: &str) -> f64 {
    let (_, page) = admin_get(t, "/metrics").await;
    metric(
        &page,
        &format!("ahp_relay_limit_hits_total{{limit=\"{limit}\"}}"),
    )
    .unwrap_or(0.0)
}

fn upstream(t: &TestRelay, sub: &str, client_id: &str) -> String {
    let p = PrincipalKey {
        issuer: DEV_ISSUER.into(),
        subject: sub.into(),
    };
    t.relay.relay.upstream_id(&p, client_id)
}

fn init_params(client_id: &str, subs: &[&str]) -> Value {
    json!({"channel": ROOT, "protocolVersions": ["1.0.0"], "clientId": client_id,
        "initialSubscriptions": subs})
}

fn reason(answer: &Value) -> &str {
    answer["error"]["data"]["reason"]
        .as_str()
        .unwrap_or_default()
}

/// At most `subscriptions_per_session` distinct channels: duplicates in
/// `initialSubscriptions` are followed (and forwarded) once, a list over
/// the cap is -32602 for `initialize` and `reconnect`, one more
/// `subscribe` is -32603 `subscriptionLimit`, re-subscribing a followed
/// channel is fine.
#[tokio::test]
async fn subscriptions_per_session_are_capped_and_deduplicated() {
    let t = start("subscriptions_per_session = 2").await;
    let (s1, s2) = (session(1), session(2));
    let mut over = t.raw("alice").await;
    let r = over
        .request(0, "initialize", init_params("c", &[ROOT, &s1, &s2]))
        .await;
    assert_eq!(r["error"]["code"], -32602, "{r}");

    let mut ws = t.raw("alice").await;
    let r = ws
        .request(
            0,
            "initialize",
            init_params("c", &[&s1, ROOT, &s1, &s1, ROOT]),
        )
        .await;
    assert_eq!(
        snapshot_resources(&r["result"]).len(),
        2,
        "each channel once: {r}"
    );
    let up = upstream(&t, "alice", "c");
    let forwarded = t.hosts[0]
        .received_from(&up)
        .iter()
        .filter(|f| f.method.as_deref() == Some("subscribe"))
        .count();
    assert_eq!(forwarded, 1, "one upstream subscribe for three duplicates");

    let r = ws.request(1, "subscribe", json!({"channel": s2})).await;
    assert_eq!(r["error"]["code"], -32603, "{r}");
    assert_eq!(reason(&r), "subscriptionLimit", "{r}");
    let r = ws.request(2, "subscribe", json!({"channel": s1})).await;
    assert!(r["result"]["snapshot"].is_object(), "already followed: {r}");

    let mut again = t.raw("alice").await;
    let r = again
        .request(
            0,
            "reconnect",
            json!({"channel": ROOT, "clientId": "c", "lastSeenServerSeq": 0,
                "subscriptions": [ROOT, s1, s2]}),
        )
        .await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    assert!(hits(&t, "subscriptions").await >= 2.0);
}

/// A host that stops answering: requests beyond
/// `pending_requests_per_connection` are refused at once with -32603
/// `pendingLimit`; those forwarded fail after `upstream_request_secs` with
/// -32603 `timeout` and leave no pending entry (the next one is accepted).
#[tokio::test]
async fn pending_requests_are_capped_and_time_out() {
    let t = start("pending_requests_per_connection = 2\nupstream_request_secs = 1").await;
    let mut ws = subscribed(&t, "alice", "c", 1).await;
    t.hosts[0].set_stalled(true);
    for (id, n) in [(2, 2), (3, 3)] {
        ws.send_json(&json!({"jsonrpc": "2.0", "id": id, "method": "subscribe",
            "params": {"channel": session(n)}}))
            .await;
    }
    let r = ws
        .request(4, "subscribe", json!({"channel": session(1)}))
        .await;
    assert_eq!(reason(&r), "pendingLimit", "{r}");
    // Both time out in the same tick of the timer: in either order.
    for r in ws.responses(&[json!(2), json!(3)]).await {
        assert_eq!(r["error"]["code"], -32603, "{r}");
        assert_eq!(reason(&r), "timeout", "{r}");
    }
    t.hosts[0].set_stalled(false);
    let r = ws
        .request(5, "subscribe", json!({"channel": session(2)}))
        .await;
    assert!(
        r["result"]["snapshot"].is_object(),
        "entries were removed: {r}"
    );
    assert!(hits(&t, "pending").await >= 1.0);
    assert!(hits(&t, "request_timeout").await >= 2.0);
}

/// A burst over `request_burst` at `requests_per_second`: the excess gets
/// -32603 `rateLimited`; a request after the refill is answered.
#[tokio::test]
async fn requests_per_second_is_a_token_bucket() {
    let t = start("requests_per_second = 1\nrequest_burst = 3").await;
    let mut ws = t.raw("alice").await;
    let frames: Vec<Value> = (1..=10)
        .map(
            |id| json!({"jsonrpc": "2.0", "id": id, "method": "ping", "params": {"channel": ROOT}}),
        )
        .collect();
    ws.send_at_once(&frames).await;
    let mut limited = 0;
    for id in 1..=10 {
        let r = ws.response(&json!(id)).await;
        if reason(&r) == "rateLimited" {
            assert_eq!(r["error"]["code"], -32603, "{r}");
            limited += 1;
        }
    }
    assert!(
        limited >= 6,
        "at most burst + refill answered: {limited} limited"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let r = ws.request(11, "ping", json!({"channel": ROOT})).await;
    assert_eq!(r["result"], Value::Null, "{r}");
    assert!(hits(&t, "rate").await >= 6.0);
}

/// Responses count against the request rate (§7.6): a client flooding
/// responses to ids the relay never sent spends its own budget — its next
/// request is rate-limited — and each is dropped (counted) without reaching
/// a host.
#[tokio::test]
async fn responses_count_against_the_rate() {
    let t = start("requests_per_second = 1\nrequest_burst = 3").await;
    let mut ws = t.raw("alice").await;
    ws.initialize("answers").await;
    let dropped_before = t.relay.relay.metrics.client_notifications_dropped.get();
    let frames: Vec<Value> = (1..=20)
        .map(|id| json!({"jsonrpc": "2.0", "id": 9000 + id, "result": {"junk": id}}))
        .collect();
    ws.send_at_once(&frames).await;
    let r = ws.request(1, "ping", json!({"channel": ROOT})).await;
    assert_eq!(reason(&r), "rateLimited", "{r}");
    let dropped = t.relay.relay.metrics.client_notifications_dropped.get() - dropped_before;
    assert_eq!(dropped, 20, "each unsolicited response dropped and counted");
}

/// A client that sends nothing for `client_idle_secs` is closed with 1000
/// and a reason; one that pings in time stays open.
#[tokio::test]
async fn idle_clients_are_closed_and_ping_keeps_them() {
    let t = start("client_idle_secs = 1").await;
    let mut quiet = t.raw("alice").await;
    quiet.initialize("quiet").await;
    let mut busy = t.raw("alice").await;
    busy.initialize("busy").await;
    let (code, why) = tokio::join!(quiet.close_code(), async {
        for id in 1..=8 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let r = busy.request(id, "ping", json!({"channel": ROOT})).await;
            assert_eq!(r["result"], Value::Null, "{r}");
        }
        "pinged"
    });
    let (code, reason) = code.expect("close frame");
    assert_eq!(code, 1000);
    assert!(reason.contains("idle"), "{reason}");
    assert_eq!(why, "pinged");
    let r = busy.request(99, "ping", json!({"channel": ROOT})).await;
    assert_eq!(
        r["result"],
        Value::Null,
        "the pinging client is still open: {r}"
    );
    assert!(hits(&t, "idle").await >= 1.0);
}

/// Dispatches written faster than a link can take them (its queue is
/// `link_queue_frames`, and nothing drains it before the link is up) get
/// rejection echoes saying the host is busy, not silence.
#[tokio::test]
async fn the_link_queue_is_bounded() {
    let t = start("link_queue_frames = 1").await;
    let mut ws = t.raw("alice").await;
    ws.initialize("c").await;
    let s1 = session(1);
    let frames: Vec<Value> = (1..=40)
        .map(|seq| {
            json!({"jsonrpc": "2.0", "method": "dispatchAction", "params": {
            "channel": s1, "clientSeq": seq,
            "action": {"type": "session/titleChanged", "title": format!("t{seq}")}}})
        })
        .collect();
    ws.send_at_once(&frames).await;
    let mut busy = 0;
    while busy == 0 {
        let v = ws
            .recv_json()
            .await
            .expect("a rejection echo before the socket ends");
        let rejected = v["params"]["rejectionReason"].as_str().unwrap_or_default();
        if v["method"] == "action" && rejected.contains("busy") {
            busy += 1;
        }
    }
    assert!(busy >= 1, "a full queue answers with a rejection echo");
    assert!(hits(&t, "link_queue").await >= 1.0);
}

/// A host frame over `upstream_max_frame_bytes` is refused by the
/// WebSocket layer of that host connection as its header arrives: that
/// client's link alone drops (counted in `links_failed_total`, the reason
/// logged) and the relay dials it again; the client, another client of
/// the same host and the host's watch link keep working.
#[tokio::test]
async fn oversized_host_frames_cost_only_that_link() {
    let t = start("upstream_max_frame_bytes = 65536").await;
    let mut ws = subscribed(&t, "alice", "c", 1).await;
    let mut other = subscribed(&t, "bob", "o", 2).await;
    let dials = |who: &str| {
        t.hosts[0]
            .handshakes()
            .iter()
            .filter(|h| h.user_subject.as_deref() == Some(who))
            .count()
    };
    let (alice_dials, bob_dials) = (dials("alice"), dials("bob"));
    let before = links_failed(&t).await;
    let big = json!({"jsonrpc": "2.0", "method": "x", "params": {"pad": "x".repeat(70_000)}});
    let up = upstream(&t, "alice", "c");
    assert_eq!(
        t.hosts[0].send_raw(&up, &big.to_string()),
        1,
        "alice's link"
    );
    wait_until("alice's link dialled again", || {
        dials("alice") > alice_dials
    })
    .await;
    assert!(
        links_failed(&t).await > before,
        "the dropped link is counted"
    );
    let r = ws
        .request(2, "subscribe", json!({"channel": session(3)}))
        .await;
    assert!(
        r["result"]["snapshot"].is_object(),
        "alice is served again: {r}"
    );
    let r = other.request(2, "ping", json!({"channel": ROOT})).await;
    assert_eq!(r["result"], Value::Null, "{r}");
    assert_eq!(dials("bob"), bob_dials, "bob's link was not touched");
    let (_, page) = admin_get(&t, "/metrics").await;
    assert_eq!(metric(&page, "ahp_relay_host_up{host=\"a\"}"), Some(1.0));
}

async fn links_failed(t: &TestRelay) -> f64 {
    let (_, page) = admin_get(t, "/metrics").await;
    metric(&page, "ahp_relay_links_failed_total").unwrap_or(0.0)
}

/// A host listing more sessions than `sessions_per_host` costs the relay
/// only that many: the watch link stops there (the rest are not listed to
/// clients), a later `root/sessionAdded` beyond it is dropped too, each
/// counted in `limit_hits_total{limit="host_sessions"}`; the relay keeps
/// serving.
#[tokio::test]
async fn a_host_catalog_is_bounded() {
    let t = TestRelay::start(
        vec![fast_config("a", 30)],
        "\n[limits]\nsessions_per_host = 10\n",
    )
    .await;
    let mut ws = t.raw("alice").await;
    ws.initialize("c").await;
    let listed = listed_uris(&mut ws, 1).await;
    assert_eq!(listed.len(), 10, "{listed:?}");
    assert!(hits(&t, "host_sessions").await >= 1.0);
    let before = hits(&t, "host_sessions").await;
    let r = ws
        .request(
            2,
            "createSession",
            json!({"channel": "ahp-session:/alice-new", "provider": "sim.a"}),
        )
        .await;
    assert_eq!(r["result"], Value::Null, "the host created it: {r}");
    wait_until_hits(&t, "host_sessions", before + 1.0).await;
    assert_eq!(listed_uris(&mut ws, 3).await.len(), 10);
    let r = ws.request(4, "ping", json!({"channel": ROOT})).await;
    assert_eq!(r["result"], Value::Null, "{r}");
}

async fn wait_until_hits(t: &TestRelay, limit: &str, at_least: f64) {
    for _ in 0..200 {
        if hits(t, limit).await >= at_least {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("limit_hits_total{{limit={limit:?}}} never reached {at_least}");
}

/// A `reconnect` just under the frame limit carrying ~200k distinct
/// channels is answered (over the subscription cap: -32602) while another
/// client's pings keep being answered. The time is printed, not asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_reconnect_is_answered_while_others_ping() {
    let t = start("").await;
    let mut first = t.raw("alice").await;
    first.initialize("c").await;
    let max = ahp_relay::config::Limits::default().max_frame_bytes;
    let head = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"reconnect","params":{{"channel":"{ROOT}","clientId":"c","lastSeenServerSeq":0,"subscriptions":["#
    );
    let mut frame = head.clone();
    let mut n = 0u64;
    while frame.len() + 40 < max {
        if n > 0 {
            frame.push(',');
        }
        frame.push_str(&format!("\"ahp-session:/x{n}\""));
        n += 1;
    }
    frame.push_str("]}}");
    assert!(frame.len() <= max);
    let mut big = t.raw("alice").await;
    let mut other = t.raw("bob").await;
    other.initialize("o").await;
    let started = Instant::now();
    big.send_text(&frame).await;
    let pings = async {
        let mut answered = 0;
        for id in 1..=20 {
            let r = other.request(id, "ping", json!({"channel": ROOT})).await;
            assert_eq!(r["result"], Value::Null, "{r}");
            answered += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        answered
    };
    let one = json!(1);
    let (r, answered) = tokio::join!(big.response(&one), pings);
    println!(
        "reconnect of {} bytes with {n} channels answered in {:?}",
        frame.len(),
        started.elapsed()
    );
    assert_eq!(r["error"]["code"], -32602, "{r}");
    assert_eq!(answered, 20);
}

/// The store refuses a principal's reservation beyond its quota (the relay
/// answers -32603 `quota`) and its purge timer removes expired tombstones.
/// On a multi-threaded runtime, as the relay's main runtime is: the creates'
/// confirm writes run on its blocking pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_quota_and_tombstone_purge() {
    let t = start("reservations_per_principal = 1").await;
    let mut ws = t.raw("alice").await;
    ws.initialize("c").await;
    let a = ws
        .request(
            1,
            "createSession",
            json!({"channel": "ahp-session:/q1", "provider": "sim.a"}),
        )
        .await;
    assert_eq!(a["result"], Value::Null, "{a}");
    let b = ws
        .request(
            2,
            "createSession",
            json!({"channel": "ahp-session:/q2", "provider": "sim.a"}),
        )
        .await;
    assert_eq!(b["error"]["code"], -32603, "{b}");
    assert_eq!(reason(&b), "quota", "{b}");
    assert!(hits(&t, "quota").await >= 1.0);

    let store: Arc<dyn UriStore> = Arc::new(RedbStore::open_in_memory().expect("store"));
    let owner = Owner {
        issuer: "i".into(),
        subject: "s".into(),
        groups: Vec::new(),
    };
    store
        .reserve("ahp-chat:/old", "a", &owner, 1)
        .expect("reserve");
    store.tombstone("ahp-chat:/old", 1, 1).expect("tombstone");
    let purge = tokio::spawn(ahp_relay::names::store::purge_expired_every(
        store.clone(),
        Duration::from_millis(20),
    ));
    wait_until("the expired tombstone is purged", || {
        store.lookup("ahp-chat:/old").ok().flatten().is_none()
    })
    .await;
    purge.abort();
}

/// A create the host does not answer in time gets -32603 `timeout`; its
/// name stays reserved for its creator (pending: the host may still make
/// it, §7.6); when the host then makes the object after all, it lists it,
/// and a second create of that URI is refused (-32003) instead of adopting
/// it.
#[tokio::test]
async fn a_timed_out_create_never_leaves_an_adoptable_name() {
    let t = start("upstream_request_secs = 1").await;
    let mut ws = subscribed(&t, "alice", "c", 1).await;
    t.hosts[0].set_stalled(true);
    let uri = "ahp-session:/late";
    let r = ws
        .request(
            2,
            "createSession",
            json!({"channel": uri, "provider": "sim.a"}),
        )
        .await;
    assert_eq!(reason(&r), "timeout", "{r}");
    let relay = t.relay.relay.clone();
    let state = relay.store.lookup(uri).ok().flatten().map(|e| e.state);
    assert_eq!(
        state,
        Some(ahp_relay::names::store::UriState::Pending),
        "the name stays its creator's"
    );
    t.hosts[0].set_stalled(false);
    wait_until("the host lists the late session", || {
        relay.hubs().any(|h| h.has_session(uri))
    })
    .await;
    let r = ws
        .request(
            3,
            "createSession",
            json!({"channel": uri, "provider": "sim.a"}),
        )
        .await;
    assert_eq!(r["error"]["code"], -32003, "{r}");
}

//! Two relay replicas sharing one PostgreSQL URI store in front of the same
//! simulated host (contract §12.1, §7.4), over real sockets: ownership
//! agrees across replicas — a session alice creates through A cannot be
//! taken, disposed or seen by bob through B, its URI is refused on B, and
//! alice (visibility own) sees it as hers through B — and PostgreSQL going
//! away refuses creates with -32603 and turns `/readyz` not ready while
//! everything else keeps working. Skipped with a notice where PostgreSQL
//! is not installed.

mod common;

use common::postgres::Postgres;
use common::relay::{ServedRelay, TestRelay, admin_get, metric, rule};
use common::*;
use serde_json::{Value, json};

const SESSION: &str = "ahp-session:/alice-s";

fn rules() -> String {
    rule("alice", &["alice"], &["*"], "operator", "own", "")
        + &rule("bob", &["bob"], &["*"], "operator", "own", "")
}

/// Relay A (in this process) with host `h` and replica B (a process of its
/// own, as replicas are), both on database `db` of `pg`.
async fn replicas(pg: &Postgres, db: &str) -> (TestRelay, ServedRelay) {
    let url = pg.create_db(db);
    let password_file = pg.password_file();
    let shared = url.clone();
    let a = TestRelay::start_tweaked(vec![fast_config("h", 1)], "", &rules(), |cfg| {
        cfg.relay.store = shared.into();
        cfg.relay.store_password_file = Some(password_file.clone());
        cfg.listen.admin_status_open = true;
    })
    .await;
    a.wait_hosts_up().await;
    let lines = format!(
        "store = \"{url}\"\nstore_password_file = \"{}\"",
        password_file.display()
    );
    let b = a.replica_process(&rules(), &lines);
    (a, b)
}

/// A raw socket through `t` (or the replica at `via`) as `sub`,
/// initialized as `client_id`.
async fn peer_at(t: &TestRelay, via: Option<&str>, sub: &str, client_id: &str) -> RawWs {
    let mut ws = match via {
        Some(url) => t.raw_at(url, sub).await,
        None => t.raw(sub).await,
    };
    let init = ws.initialize(client_id).await;
    assert!(init.get("result").is_some(), "{sub} initializes: {init}");
    ws
}

async fn peer(t: &TestRelay, sub: &str, client_id: &str) -> RawWs {
    peer_at(t, None, sub, client_id).await
}

fn create(uri: &str) -> Value {
    json!({"channel": uri, "provider": "sim.h"})
}

/// Polls `/readyz` (the store probe runs every 2 s) until it answers
/// `status`, for at most 3 × [`WAIT`].
async fn readyz_becomes(t: &TestRelay, status: u16) {
    let until = tokio::time::Instant::now() + 3 * WAIT;
    while admin_get(t, "/readyz").await.0 != status {
        assert!(
            tokio::time::Instant::now() < until,
            "/readyz never answered {status}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// `/status.json`'s store backend and health.
async fn store_status(t: &TestRelay) -> (String, bool) {
    let (code, body) = admin_get(t, "/status.json").await;
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).expect("status JSON");
    let store = &v["store"];
    assert!(store["latency_ms"].as_f64().is_some(), "{store}");
    (
        store["backend"].as_str().unwrap_or_default().to_owned(),
        store["healthy"] == true,
    )
}

fn error_code(v: &Value) -> Option<i64> {
    v["error"]["code"].as_i64()
}

/// Subscribes `uri` through `ws`, again until it succeeds: a replica learns
/// of another's writes (the reserve, then the confirm that makes the session
/// its creator's) from PostgreSQL's notifications, a moment later —
/// milliseconds, more on a loaded machine. Returns the snapshot.
async fn subscribes_eventually(ws: &mut RawWs, uri: &str) -> Value {
    let until = tokio::time::Instant::now() + WAIT;
    for id in 1000.. {
        let r = ws.request(id, "subscribe", json!({"channel": uri})).await;
        if r["result"]["snapshot"].is_object() {
            return r["result"]["snapshot"].clone();
        }
        assert!(
            tokio::time::Instant::now() < until,
            "{uri} never subscribable: {r}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    unreachable!("the loop returns or fails")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ownership_agrees_across_replicas() {
    let Some(pg) = Postgres::start("replicas") else {
        return;
    };
    let (a, b) = replicas(&pg, "own").await;
    let host = &a.hosts[0];

    let mut alice_a = peer(&a, "alice", "a1").await;
    let r = alice_a.request(1, "createSession", create(SESSION)).await;
    assert_eq!(r.get("result"), Some(&Value::Null), "{r}");
    let entry = a.relay.relay.store.lookup(SESSION).unwrap().unwrap();
    assert_eq!(
        entry.state,
        ahp_relay::names::store::UriState::Confirmed,
        "{entry:?}"
    );

    // Alice sees it as hers through B (visibility own: B knows the owner):
    // she subscribes it and lists it.
    let mut alice_b = peer_at(&a, Some(&b.url), "alice", "a2").await;
    subscribes_eventually(&mut alice_b, SESSION).await;
    let listed = listed_uris(&mut alice_b, 1).await;
    assert!(listed.contains(&SESSION.to_string()), "{listed:?}");

    // The URI reserved through A is refused through B, and bob's create
    // never reaches the host.
    let mut bob_b = peer_at(&a, Some(&b.url), "bob", "b1").await;
    let r = bob_b.request(1, "createSession", create(SESSION)).await;
    assert!(error_code(&r).is_some(), "bob's create of alice's URI: {r}");
    let up_bob = a.upstream_id("bob", "b1");
    assert!(
        host.received_from(&up_bob)
            .iter()
            .all(|f| f.method.as_deref() != Some("createSession")),
        "bob's create reached the host"
    );

    // Bob cannot see, take or dispose it through B, which knows it is
    // alice's: it answers as nonexistent.
    assert!(
        !listed_uris(&mut bob_b, 2)
            .await
            .contains(&SESSION.to_string())
    );
    for (id, method) in [(3, "subscribe"), (4, "disposeSession")] {
        let r = bob_b.request(id, method, json!({"channel": SESSION})).await;
        assert!(
            matches!(error_code(&r), Some(-32001) | Some(-32008)),
            "bob's {method} of alice's session through B: {r}"
        );
    }

    // Alice disposes it through B.
    let r = alice_b
        .request(3, "disposeSession", json!({"channel": SESSION}))
        .await;
    assert!(r.get("error").is_none(), "alice disposes through B: {r}");

    // The disposed name stays taken on A too (a tombstone, §4.2).
    let r = alice_a.request(2, "createSession", create(SESSION)).await;
    assert!(
        error_code(&r).is_some(),
        "re-create of a tombstoned URI: {r}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_down_refuses_creates_and_readiness_only() {
    let Some(pg) = Postgres::start("replicas-down") else {
        return;
    };
    let (a, _b) = replicas(&pg, "down").await;
    let (status, _) = admin_get(&a, "/readyz").await;
    assert_eq!(status, 200);
    let page = admin_get(&a, "/metrics").await.1;
    assert_eq!(
        metric(&page, "ahp_relay_store_up{backend=\"postgres\"}"),
        Some(1.0)
    );
    assert_eq!(store_status(&a).await, ("postgres".into(), true));
    let mut alice = peer(&a, "alice", "a1").await;
    let r = alice.request(1, "createSession", create(SESSION)).await;
    assert_eq!(r.get("result"), Some(&Value::Null), "{r}");

    pg.stop_server();
    let r = alice
        .request(2, "createSession", create("ahp-session:/during"))
        .await;
    assert_eq!(error_code(&r), Some(-32603), "{r}");
    assert_eq!(r["error"]["data"]["reason"], "storeUnavailable", "{r}");
    readyz_becomes(&a, 503).await;
    let page = admin_get(&a, "/metrics").await.1;
    assert_eq!(
        metric(&page, "ahp_relay_store_up{backend=\"postgres\"}"),
        Some(0.0)
    );
    assert_eq!(store_status(&a).await, ("postgres".into(), false));
    // Everything else keeps working: the session alice created lists and
    // subscribes from the mirror and the host.
    let listed = listed_uris(&mut alice, 3).await;
    assert!(listed.contains(&SESSION.to_string()), "{listed:?}");
    let r = alice
        .request(4, "subscribe", json!({"channel": SESSION}))
        .await;
    assert!(r["result"]["snapshot"].is_object(), "{r}");
    assert_eq!(admin_get(&a, "/healthz").await.0, 200);

    pg.start_server();
    readyz_becomes(&a, 200).await;
    let r = alice
        .request(5, "createSession", create("ahp-session:/after"))
        .await;
    assert_eq!(r.get("result"), Some(&Value::Null), "{r}");
}

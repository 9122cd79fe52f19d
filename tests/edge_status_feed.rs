//! The status page's side doors (issue 25) over real sockets: the admin
//! listener's status data needs an admin's token (or `admin_status_open`);
//! `Host` and `Origin` are checked on upgrades and status paths of both
//! listeners; a feed closes when its token expires (4001), is revoked (4003)
//! or its admin grant is withdrawn (4000), when its viewer stays silent
//! (1000), counts against the principal's connection cap; feeds are capped
//! in number and share one status computation per interval; a feed sends
//! the charts' history once, then one point per interval.

mod common;

use std::time::Duration;

use common::relay::{
    TestRelay, Upgrade, admin_get, admin_get_as, admin_get_with, metric, rule, scratch_dir,
};
use common::{Next, RawWs, WAIT, fast_config};
use serde_json::Value;
use tokio_tungstenite::tungstenite::http::HeaderName;
use tokio_tungstenite::tungstenite::http::header::{AUTHORIZATION, HOST, ORIGIN};

/// `ops` is admin on every host, `alice` an operator.
fn policy() -> String {
    rule("ops-admin", &["ops"], &["*"], "admin", "all", "")
        + &rule("alice-operator", &["alice"], &["*"], "operator", "all", "")
}

async fn start() -> TestRelay {
    TestRelay::start(vec![fast_config("alpha", 1)], &policy()).await
}

fn bearer(token: &str) -> (HeaderName, String) {
    (AUTHORIZATION, format!("Bearer {token}"))
}

/// The admin listener's feed with `headers`.
async fn admin_feed(t: &TestRelay, headers: &[(HeaderName, String)]) -> Upgrade {
    let h: Vec<(HeaderName, &str)> = headers
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str()))
        .collect();
    t.admin_upgrade("status/feed", &h).await
}

/// The admin listener's feed with `token` as bearer header.
async fn feed_as(t: &TestRelay, token: &str) -> Upgrade {
    admin_feed(t, &[bearer(token)]).await
}

/// The first status pushed on `ws` (parsed).
async fn first_status(ws: &mut RawWs) -> Value {
    match ws.next_or_close().await {
        Next::Frame(v) => v,
        Next::Closed(c) => panic!("the feed closed before its first status: {c:?}"),
    }
}

async fn metrics(t: &TestRelay) -> String {
    admin_get(t, "/metrics").await.1
}

/// The admin listener: probes and metrics open; the page open; the data
/// (`/status.json`, the feed) 401 without a token, 403 for an operator,
/// served to an admin.
#[tokio::test]
async fn admin_listener_status_data_needs_an_admin_token() {
    let t = start().await;
    assert_eq!(admin_get(&t, "/healthz").await.0, 200);
    assert_eq!(admin_get(&t, "/readyz").await.0, 200);
    assert_eq!(admin_get(&t, "/metrics").await.0, 200);
    let (code, page) = admin_get(&t, "/status").await;
    assert_eq!(code, 200);
    assert!(page.contains("id=\"login\""), "the page asks for the token");
    assert_eq!(admin_get(&t, "/status.json").await.0, 401);
    assert_eq!(admin_get_as(&t, "alice", "/status.json").await.0, 403);
    let (code, body) = admin_get_as(&t, "ops", "/status.json").await;
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(v["hosts"][0]["id"], "alpha", "{v}");

    assert_eq!(
        admin_feed(&t, &[]).await.status,
        401,
        "feed without a token"
    );
    let alice = bearer(&t.token("alice"));
    assert_eq!(
        admin_feed(&t, &[alice]).await.status,
        403,
        "operator's feed"
    );
    let ops = bearer(&t.token("ops"));
    let mut ws = admin_feed(&t, &[ops]).await.socket("admin's feed");
    assert_eq!(first_status(&mut ws).await["hosts"][0]["id"], "alpha");
    let page = metrics(&t).await;
    assert!(
        metric(
            &page,
            "ahp_relay_auth_failures_total{reason=\"missing_token\"}"
        )
        .is_some_and(|n| n >= 2.0),
        "admin refusals are counted: {page}"
    );
}

/// A page of another site cannot open the feed (admin or client listener)
/// or an AHP socket, even with a token; a rebound host name (`Host:
/// evil.example`) is refused on the admin listener; the page's own origin
/// and a listed one pass.
#[tokio::test]
async fn cross_origin_and_rebound_hosts_are_refused() {
    let t = TestRelay::start_tweaked(vec![fast_config("alpha", 1)], "", &policy(), |cfg| {
        cfg.listen.allowed_origins = vec!["https://ops.example.com".into()];
    })
    .await;
    t.wait_hosts_up().await;
    let ops = bearer(&t.token("ops"));
    let evil = (ORIGIN, "https://evil.example".to_string());
    let refused = admin_feed(&t, &[ops.clone(), evil.clone()]).await;
    assert_eq!(
        refused.status, 403,
        "cross-origin feed on the admin listener"
    );
    assert_eq!(
        admin_feed(&t, std::slice::from_ref(&evil)).await.status,
        403
    );
    let own = (ORIGIN, format!("http://{}", t.relay.admin_addr()));
    admin_feed(&t, &[ops.clone(), own])
        .await
        .socket("same-origin feed");
    let listed = (ORIGIN, "https://ops.example.com".to_string());
    admin_feed(&t, &[ops.clone(), listed])
        .await
        .socket("listed origin");
    let port = t.relay.admin_addr().port();
    let rebound = (HOST, format!("evil.example:{port}"));
    let rebound_origin = (ORIGIN, format!("http://evil.example:{port}"));
    let u = admin_feed(&t, &[ops.clone(), rebound.clone(), rebound_origin]).await;
    assert_eq!(u.status, 403, "DNS rebinding: same origin, foreign host");
    let host = format!("evil.example:{port}");
    assert_eq!(
        admin_get_with(&t, "/status", &[("Host", &host)]).await.0,
        403
    );
    assert_eq!(
        admin_get_with(&t, "/metrics", &[("Host", &host)]).await.0,
        200
    );

    let on_client = |path: &'static str| {
        let (ops, evil) = (ops.clone(), evil.clone());
        let t = &t;
        async move {
            let h = [(ops.0, ops.1.as_str()), (evil.0, evil.1.as_str())];
            t.upgrade(path, &h).await.status
        }
    };
    assert_eq!(on_client("status/feed").await, 403, "client listener feed");
    assert_eq!(on_client("").await, 403, "cross-origin AHP upgrade");
    let page = metrics(&t).await;
    assert_eq!(
        metric(&page, "ahp_relay_upgrades_refused_total{reason=\"origin\"}"),
        Some(4.0),
        "{page}"
    );
    assert_eq!(
        metric(&page, "ahp_relay_upgrades_refused_total{reason=\"host\"}"),
        Some(2.0),
        "{page}"
    );
}

/// `listen.admin_status_open = true` serves the data without a token (the
/// origin check stays).
#[tokio::test]
async fn admin_status_open_serves_the_data_without_a_token() {
    let t = TestRelay::start_tweaked(vec![fast_config("alpha", 1)], "", &policy(), |cfg| {
        cfg.listen.admin_status_open = true;
    })
    .await;
    t.wait_hosts_up().await;
    assert_eq!(admin_get(&t, "/status.json").await.0, 200);
    let mut ws = admin_feed(&t, &[]).await.socket("open feed");
    assert_eq!(first_status(&mut ws).await["hosts"][0]["id"], "alpha");
    let evil = (ORIGIN, "https://evil.example".to_string());
    assert_eq!(admin_feed(&t, &[evil]).await.status, 403);
}

/// A feed opened with a token whose `jti` is then revoked closes with 4003.
#[tokio::test]
async fn a_feed_closes_4003_when_its_token_is_revoked() {
    let dir = scratch_dir("feed-deny");
    std::fs::create_dir_all(&dir).expect("dir");
    let deny = dir.join("deny.txt");
    std::fs::write(&deny, "# nothing revoked yet\n").expect("deny list");
    let auth = format!("deny_list_file = \"{}\"", deny.display());
    let t = TestRelay::start_with(vec![fast_config("alpha", 1)], &auth, &policy()).await;
    let token = t
        .kit
        .token("ops", &[], Duration::from_secs(3600), Some("feed-1"))
        .expect("token");
    let mut ws = feed_as(&t, &token).await.socket("feed");
    first_status(&mut ws).await;
    std::fs::write(&deny, "feed-1\n").expect("revoke");
    assert_eq!(ws.close_code().await.map(|c| c.0), Some(4003));
}

/// A feed opened with a 2 s token closes with 4001 once `exp` + leeway
/// (5 s in the dev config) has passed.
#[tokio::test]
async fn a_feed_closes_4001_when_its_token_expires() {
    let t = start().await;
    let minted = tokio::time::Instant::now();
    let token = t
        .kit
        .token("ops", &[], Duration::from_secs(2), None)
        .expect("token");
    let mut ws = feed_as(&t, &token).await.socket("feed");
    first_status(&mut ws).await;
    assert_eq!(ws.close_code().await.map(|c| c.0), Some(4001));
    assert!(
        minted.elapsed() >= Duration::from_secs(5),
        "{:?}",
        minted.elapsed()
    );
}

/// A feed whose principal loses the `admin` grant by a policy reload closes
/// with 4000; a new one then gets 403.
#[tokio::test]
async fn a_feed_closes_4000_when_the_admin_grant_is_withdrawn() {
    let t = start().await;
    let token = t.token("ops");
    let mut ws = feed_as(&t, &token).await.socket("feed");
    first_status(&mut ws).await;
    let path = t.kit.dir.join("relay.toml");
    let original = std::fs::read_to_string(&path).expect("config");
    let admin = rule("ops-admin", &["ops"], &["*"], "admin", "all", "");
    let operator = rule("ops-admin", &["ops"], &["*"], "operator", "all", "");
    std::fs::write(&path, original.replace(&admin, &operator)).expect("config rewritten");
    assert_eq!(ws.close_code().await.map(|c| c.0), Some(4000));
    assert_eq!(admin_get_as(&t, "ops", "/status.json").await.0, 403);
}

/// A viewer that never answers the feed's pings is closed with 1000 after
/// `client_idle_secs` (counted); one that reads (and so pongs) stays.
#[tokio::test]
async fn a_silent_viewer_is_closed_idle_and_a_reading_one_stays() {
    let limits = "\n[limits]\nclient_idle_secs = 2\n";
    let t = TestRelay::start(vec![fast_config("alpha", 1)], &(policy() + limits)).await;
    let ops = t.token("ops");
    let mut reading = feed_as(&t, &ops).await.socket("reader");
    let reader = tokio::spawn(async move {
        loop {
            if let Some(Next::Closed(c)) = reading.next_within(Duration::from_secs(60)).await {
                return c;
            }
        }
    });
    let mut silent = feed_as(&t, &ops).await.socket("silent");
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let page = metrics(&t).await;
        if metric(&page, "ahp_relay_limit_hits_total{limit=\"status_idle\"}") == Some(1.0) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "silent feed never closed: {page}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(silent.close_code().await.map(|c| c.0), Some(1000));
    assert!(!reader.is_finished(), "the reading viewer is still served");
    reader.abort();
}

/// Feeds are capped (`limits.status_watchers`): one over gets 503, counted;
/// a closed feed frees its slot. An authenticated feed counts against
/// `connections_per_principal`.
#[tokio::test]
async fn feeds_are_capped_and_count_against_the_connection_cap() {
    let limits = "\n[limits]\nstatus_watchers = 2\nconnections_per_principal = 2\n";
    let policy = rule("admins", &["ops", "root"], &["*"], "admin", "all", "");
    let t = TestRelay::start(vec![fast_config("alpha", 1)], &(policy + limits)).await;
    let (ops, root) = (t.token("ops"), t.token("root"));
    let first = feed_as(&t, &ops).await.socket("1st feed");
    let _second = feed_as(&t, &ops).await.socket("2nd feed");
    let u = t.upgrade_bearer(&t.token("ops")).await;
    assert_eq!(u.status, 429, "two feeds hold ops's two connections");
    let over = feed_as(&t, &root).await;
    assert_eq!(over.status, 503, "a third feed");
    let page = metrics(&t).await;
    assert_eq!(
        metric(
            &page,
            "ahp_relay_upgrades_refused_total{reason=\"status_watchers\"}"
        ),
        Some(1.0),
        "{page}"
    );
    first.close_cleanly().await;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let u = feed_as(&t, &root).await;
        if u.status == 101 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slot was never freed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The status is computed once per 500 ms for all feeds together, not per
/// feed: with six feeds open, four more computations take at least about
/// 1.5 s (per-feed computation would make them within one interval).
#[tokio::test]
async fn six_feeds_share_one_status_computation_per_interval() {
    let t = start().await;
    let ops = t.token("ops");
    let mut feeds = Vec::new();
    for _ in 0..6 {
        let mut ws = feed_as(&t, &ops).await.socket("feed");
        first_status(&mut ws).await;
        feeds.push(ws);
    }
    let builds = |page: &str| metric(page, "ahp_relay_status_builds_total").unwrap_or(0.0);
    let start_count = builds(&metrics(&t).await);
    let started = tokio::time::Instant::now();
    loop {
        if builds(&metrics(&t).await) >= start_count + 4.0 {
            break;
        }
        assert!(
            started.elapsed() < WAIT,
            "the status is recomputed while feeds are open"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1200),
        "four computations in {took:?}: computed per feed, not shared"
    );
}

/// The charts' data: a feed's first status carries the whole history
/// (sampled while nobody watched, in rings of the configured size), later
/// ones only the newest point (`sample`), numbered upwards.
#[tokio::test]
async fn a_feed_sends_the_history_once_then_one_point_per_interval() {
    let limits = "\n[limits]\nstatus_history_secs = 2\n";
    let t = TestRelay::start(vec![fast_config("alpha", 1)], &(policy() + limits)).await;
    let (_, body) = admin_get_as(&t, "ops", "/status.json").await;
    let v: Value = serde_json::from_str(&body).expect("JSON");
    let seq = |v: &Value| v["seq"].as_u64().unwrap_or(0);
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut before = v["history"].clone();
    while seq(&before) <= 4 {
        assert!(tokio::time::Instant::now() < deadline, "{before}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (_, body) = admin_get_as(&t, "ops", "/status.json").await;
        before = serde_json::from_str::<Value>(&body).expect("JSON")["history"].clone();
    }
    assert_eq!(before["capacity"], 4, "2 s of 500 ms points");
    assert_eq!(before["t"].as_array().map(Vec::len), Some(4), "{before}");
    assert_eq!(
        before["hosts"]["alpha"]["links"].as_array().map(Vec::len),
        Some(4)
    );

    let mut ws = feed_as(&t, &t.token("ops")).await.socket("feed");
    let first = first_status(&mut ws).await;
    assert!(first["history"]["seq"].as_u64() >= Some(5), "{first}");
    let mut last = seq(&first["sample"]);
    for _ in 0..2 {
        let next = first_status(&mut ws).await;
        assert!(next.get("history").is_none(), "history only once: {next}");
        assert!(seq(&next["sample"]) > last, "a newer point: {next}");
        assert!(
            next["sample"]["hosts"]["alpha"]["rtt_ms"].is_number(),
            "{next}"
        );
        last = seq(&next["sample"]);
    }
}

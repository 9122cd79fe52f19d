//! The catalog fan-out under one tenant's churn (contract §6.4, §7.6): a
//! burst of `root/sessionSummaryChanged` reaches every root follower that
//! can see the session, ending on the session's last state, and nobody
//! else; summary changes do not recount `activeSessions`. The ignored
//! `churn_figures` prints the cost: followers × catalog events.

mod common;

use std::time::{Duration, Instant};

use common::relay::{TestRelay, rule};
use common::*;
use serde_json::{Value, json};

const ROOT: &str = "ahp-root://";

/// A root follower of `sub`, its root snapshot drained.
async fn follower(t: &TestRelay, sub: &str, n: usize) -> RawWs {
    let mut ws = t.raw(sub).await;
    ws.initialize(&format!("{sub}-follower-{n}")).await;
    let r = ws.request(2, "subscribe", json!({"channel": ROOT})).await;
    assert!(r.get("result").is_some(), "{r}");
    ws
}

/// Reads `ws` until a summary change of `session` titled `title` arrives;
/// returns every frame read.
async fn until_title(ws: &mut RawWs, session: &str, title: &str) -> Vec<Value> {
    let mut frames = Vec::new();
    loop {
        let f = tokio::time::timeout(WAIT, ws.recv_json())
            .await
            .expect("the last title arrives in time")
            .expect("socket open");
        let done = f["method"] == "root/sessionSummaryChanged"
            && f["params"]["session"] == session
            && f["params"]["changes"]["title"] == title;
        frames.push(f);
        if done {
            return frames;
        }
    }
}

async fn churn_world(sessions: usize) -> TestRelay {
    churn_world_with(sessions, "").await
}

async fn churn_world_with(sessions: usize, limits_extra: &str) -> TestRelay {
    let policy = [
        rule("ops", &["alice"], &["*"], "operator", "all", ""),
        rule(
            "eve",
            &["eve"],
            &["*"],
            "viewer",
            "own",
            "external_sessions = false",
        ),
    ]
    .concat();
    let limits = "\n[limits]\nsessions_per_principal = 200\nconnections_per_principal = 200\nrequests_per_second = 100000\nrequest_burst = 100000\n";
    TestRelay::start(
        vec![fast_config("h1", sessions)],
        &format!("{policy}{limits}{limits_extra}"),
    )
    .await
}

/// `count` title changes of seeded session 1 by alice, the last titled
/// `last`.
async fn churn(op: &mut RawWs, count: usize, last: &str) {
    let session = "ahp-session:/h1~h1-1";
    for i in 0..count {
        let title = if i + 1 == count {
            last.to_string()
        } else {
            format!("t{i}")
        };
        op.dispatch(
            session,
            i as i64 + 1,
            json!({"type": "session/titleChanged", "title": title}),
        )
        .await;
    }
}

#[tokio::test]
async fn a_burst_of_summary_changes_ends_on_the_last_state_for_those_who_see_it() {
    let t = churn_world(20).await;
    let mut op = t.raw("alice").await;
    op.initialize("op").await;
    let mut followers = Vec::new();
    for n in 0..5 {
        followers.push(follower(&t, "alice", n).await);
    }
    let mut blind = follower(&t, "eve", 0).await;
    churn(&mut op, 200, "final").await;
    let session = "ahp-session:/h1~h1-1";
    for ws in &mut followers {
        let frames = until_title(ws, session, "final").await;
        let recounts = frames
            .iter()
            .filter(|f| f["params"]["action"]["type"] == "root/activeSessionsChanged")
            .count();
        assert_eq!(recounts, 0, "a summary change recounted activeSessions");
    }
    // Eve cannot see the session: nothing about it reaches her (a ping's
    // answer proves her queue was flushed past the burst).
    let pong = blind.request(9, "ping", json!({})).await;
    assert!(pong.get("result").is_some(), "{pong}");
    let mut leaked = Vec::new();
    while let Ok(Some(f)) = tokio::time::timeout(Duration::from_millis(50), blind.recv_json()).await
    {
        leaked.push(f);
    }
    assert!(
        leaked
            .iter()
            .all(|f| f["method"] != "root/sessionSummaryChanged"),
        "{leaked:?}"
    );
}

/// With a fan-out queue of 2 events (`limits.fanout_queue_events`) the
/// watch link waits on the fan-out instead of queueing without bound:
/// nothing is lost — the first mirror's 60 `root/sessionAdded` all count
/// in `activeSessions`, `listSessions` lists every session, and a burst of
/// 300 summary changes still ends on the last one at every follower.
#[tokio::test]
async fn a_tiny_fanout_queue_slows_the_watch_link_and_loses_nothing() {
    let t = churn_world_with(60, "fanout_queue_events = 2\n").await;
    let mut op = t.raw("alice").await;
    op.initialize("op").await;
    let mut followers = Vec::new();
    for n in 0..3 {
        let mut ws = t.raw("alice").await;
        ws.initialize(&format!("tiny-{n}")).await;
        let r = ws.request(2, "subscribe", json!({"channel": ROOT})).await;
        assert_eq!(
            r["result"]["snapshot"]["state"]["activeSessions"], 60,
            "every mirrored session counted: {r}"
        );
        followers.push(ws);
    }
    let list = op
        .request(3, "listSessions", json!({"channel": ROOT}))
        .await;
    let items = list["result"]["items"].as_array().map_or(0, Vec::len);
    assert_eq!(items, 60, "{list}");
    churn(&mut op, 300, "tiny-final").await;
    for ws in &mut followers {
        until_title(ws, "ahp-session:/h1~h1-1", "tiny-final").await;
    }
}

/// Followers × catalog events: 100 root followers, 200 seeded sessions,
/// 1,000 summary changes by one operator; prints the time until every
/// follower has the last one, and how many frames each received.
/// `cargo test --test fanout_churn churn_figures -- --ignored --nocapture`
#[tokio::test]
#[ignore = "a measurement: prints figures"]
async fn churn_figures() {
    const FOLLOWERS: usize = 100;
    const EVENTS: usize = 1000;
    let t = churn_world(200).await;
    let mut op = t.raw("alice").await;
    op.initialize("op").await;
    let mut followers = Vec::new();
    for n in 0..FOLLOWERS {
        followers.push(follower(&t, "alice", n).await);
    }
    let start = Instant::now();
    churn(&mut op, EVENTS, "final").await;
    let session = "ahp-session:/h1~h1-1";
    let readers: Vec<_> = followers
        .into_iter()
        .map(|mut ws| {
            tokio::spawn(async move { until_title(&mut ws, session, "final").await.len() })
        })
        .collect();
    let mut frames = 0;
    for r in readers {
        frames += r.await.expect("reader");
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "catalog churn: {FOLLOWERS} followers x {EVENTS} summary changes (200 sessions): \
         {secs:.3} s until all have the last, {:.0} events/s, {:.1} frames per follower",
        EVENTS as f64 / secs,
        frames as f64 / FOLLOWERS as f64
    );
}

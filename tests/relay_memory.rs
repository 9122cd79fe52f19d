//! Global replay memory (contract §5.4, §8.2) over real TLS sockets: with a
//! tiny `limits.replay_memory_bytes`, whole buffers of *detached* sessions
//! are dropped least-recently-attached first (their next `reconnect` gets
//! `snapshot`, a more recently detached one that still fits gets `replay`),
//! attached sessions are never touched, and when attached sessions alone
//! exceed the budget new upgrades get 503 with `Retry-After` until memory is
//! back at the low watermark. `/metrics` shows the drops, the refusals, the
//! snapshot-fallback ratio and the replay-size histogram.

mod common;

use ahp_types::actions::ActionEnvelope;
use common::relay::{TestRelay, admin_get, assert_metrics, scratch_dir};
use common::*;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::http::header::RETRY_AFTER;

// ─── helpers ────────────────────────────────────────────────────────────────

/// Bytes in the replay buffer of session (`sub`, `client_id`).
fn buffered(t: &TestRelay, sub: &str, client_id: &str) -> usize {
    t.session(sub, client_id).lock().buffer_usage().1
}

async fn wait_detached(t: &TestRelay, sub: &str, client_id: &str) {
    let s = t.session(sub, client_id);
    wait_until(&format!("{client_id} detached"), || {
        s.lock().socket_id().is_none()
    })
    .await;
}

fn dropped_buffers(t: &TestRelay) -> u64 {
    t.relay.relay.metrics.pressure_dropped_buffers.get()
}

/// Runs one turn on `chat` through raw socket `ws` and returns every
/// envelope it produced, in order, once the relay has written them all (a
/// `ping` answer follows every frame queued before it).
async fn run_turn(ws: &mut RawWs, chat: &str, n: u64) -> Vec<ActionEnvelope> {
    ws.dispatch(chat, n as i64, turn_started(&format!("turn-{n}"), "go"))
        .await;
    let mut out = raw_actions_until(ws, |e| is(e, chat, "chat/turnComplete")).await;
    out.extend(raw_drain_actions(ws, 1_000_000 + n).await);
    out
}

/// A client (`sub`, `client_id`) attached on a raw socket, subscribed to
/// `chat` and following every envelope it was sent.
struct Follower {
    ws: RawWs,
    me: Left,
}

impl Follower {
    async fn start(t: &TestRelay, sub: &str, id: &str, chat: &str) -> Self {
        let mut ws = t.raw(sub).await;
        let init = ws.initialize(id).await;
        let s0 = init["result"]["serverSeq"].as_u64().expect("serverSeq");
        let r = ws.request(1, "subscribe", json!({"channel": chat})).await;
        assert!(r.get("result").is_some(), "subscribe {chat}: {r}");
        let me = Left {
            sub: sub.into(),
            id: id.into(),
            chat: chat.into(),
            s0,
            seen: Vec::new(),
            turns: 0,
        };
        Self { ws, me }
    }

    /// One turn; asserts it stays small next to `budget` (the sizing of
    /// these tests relies on it).
    async fn turn(&mut self, t: &TestRelay, budget: usize) {
        let me = &mut self.me;
        let before = buffered(t, &me.sub, &me.id);
        me.turns += 1;
        let envs = run_turn(&mut self.ws, &me.chat, me.turns).await;
        assert!(!envs.is_empty(), "the turn produced envelopes");
        me.seen.extend(envs);
        let grew = buffered(t, &me.sub, &me.id) - before;
        assert!(
            grew > 0 && grew * 10 < budget,
            "a turn buffers {grew} bytes: too much for a budget of {budget}"
        );
    }

    /// Turns until the session buffers at least `bytes`.
    async fn fill(&mut self, t: &TestRelay, bytes: usize, budget: usize) {
        while buffered(t, &self.me.sub, &self.me.id) < bytes {
            self.turn(t, budget).await;
        }
    }

    fn last(&self) -> u64 {
        self.me.seen.last().map_or(self.me.s0, |e| e.server_seq)
    }

    /// Closes the socket and waits until the relay detached the session.
    async fn leave(self, t: &TestRelay) -> Left {
        drop(self.ws);
        wait_detached(t, &self.me.sub, &self.me.id).await;
        self.me
    }
}

/// What a client saw (while attached, or after it left).
struct Left {
    sub: String,
    id: String,
    chat: String,
    s0: u64,
    seen: Vec<ActionEnvelope>,
    turns: u64,
}

impl Left {
    /// `reconnect` on a fresh socket from `watermark` for its chat; the
    /// answer's `result`.
    async fn reconnect(&self, t: &TestRelay, watermark: u64) -> (RawWs, Value) {
        let mut ws = t.raw(&self.sub).await;
        let params = reconnect_params(&self.id, watermark, &[&self.chat]);
        let first = raw_reconnect(&mut ws, 1, params).await;
        (ws, first["result"].clone())
    }
}

/// Asserts an upgrade is refused with 503 and `Retry-After: <secs>`.
async fn assert_503(t: &TestRelay, sub: &str, secs: u64, what: &str) {
    let u = t.upgrade_bearer(&t.token(sub)).await;
    assert!(u.ws.is_none(), "{what}: the upgrade was accepted");
    let body = String::from_utf8_lossy(&u.body);
    assert_eq!(u.status, 503, "{what}: {body}");
    let retry = u
        .header(&RETRY_AFTER)
        .unwrap_or_else(|| panic!("{what}: no Retry-After"));
    assert_eq!(retry, secs.to_string(), "{what}: Retry-After");
    assert!(body.contains("memory"), "{what}: body {body:?}");
}

// ─── dropping detached buffers ──────────────────────────────────────────────

/// The 80 kB budget of the drop tests.
const DROP_BUDGET: usize = 80_000;

/// The drop scenario: A and B fill ~35% of [`DROP_BUDGET`] each and detach,
/// A first (nothing is dropped while they fit); attached C then runs turns
/// until a buffer is dropped (at most 40).
struct DropRun {
    t: TestRelay,
    a: Left,
    b: Left,
    c: Follower,
    a_bytes: usize,
    b_bytes: usize,
}

/// Runs the drop scenario, checking its preconditions on the way.
async fn drop_run() -> DropRun {
    let t = TestRelay::start(
        vec![host("a", 3, script(10, 16, 0))],
        &format!("[limits]\nreplay_memory_bytes = {DROP_BUDGET}\n"),
    )
    .await;
    let chats: Vec<String> = (1..=3).map(|n| seeded_chat("a", n).0).collect();
    let memory = t.relay.relay.replay_memory();
    let mut a = Follower::start(&t, "alice", "mem-a", &chats[0]).await;
    a.fill(&t, DROP_BUDGET * 35 / 100, DROP_BUDGET).await;
    let a_bytes = buffered(&t, "alice", "mem-a");
    let a = a.leave(&t).await;
    let mut b = Follower::start(&t, "alice", "mem-b", &chats[1]).await;
    b.fill(&t, DROP_BUDGET * 35 / 100, DROP_BUDGET).await;
    let b_bytes = buffered(&t, "alice", "mem-b");
    let b = b.leave(&t).await;
    assert_eq!(memory.used(), a_bytes + b_bytes, "the account is exact");
    assert!(memory.used() <= DROP_BUDGET, "A and B fit together");
    assert_eq!(
        dropped_buffers(&t),
        0,
        "control: nothing dropped under budget"
    );
    assert_eq!(
        buffered(&t, "alice", "mem-a"),
        a_bytes,
        "detached A keeps its buffer"
    );
    let mut c = Follower::start(&t, "alice", "mem-c", &chats[2]).await;
    // Turns until C pushes the account over the budget; the pressure task
    // then drops a buffer, waited for before anything else is numbered.
    for _ in 0..40 {
        c.turn(&t, DROP_BUDGET).await;
        if memory.over_target() || dropped_buffers(&t) > 0 {
            wait_until("the pressure task drops a buffer", || {
                dropped_buffers(&t) > 0
            })
            .await;
            break;
        }
    }
    DropRun {
        t,
        a,
        b,
        c,
        a_bytes,
        b_bytes,
    }
}

/// §5.4: once attached C pushes the total over the budget, exactly A's
/// whole buffer is dropped (detached least recently), B's and C's are
/// untouched, the account is back under the budget without A's bytes, and
/// no upgrade is refused.
#[tokio::test]
async fn pressure_drops_the_least_recently_attached_detached_buffer_first() {
    let DropRun {
        t,
        a_bytes,
        b_bytes,
        ..
    } = drop_run().await;
    let memory = t.relay.relay.replay_memory();
    assert_eq!(dropped_buffers(&t), 1, "exactly one buffer dropped");
    assert_eq!(
        buffered(&t, "alice", "mem-a"),
        0,
        "A, detached first, lost its buffer"
    );
    let spare = |id: &str| t.session("alice", id).lock().spare_chunk_bytes();
    assert_eq!(spare("mem-a"), 0, "and the rest of its splice chunk");
    assert!(spare("mem-b") > 0, "B keeps the rest of its chunk");
    assert_eq!(
        buffered(&t, "alice", "mem-b"),
        b_bytes,
        "B, detached later, kept it"
    );
    let c_bytes = buffered(&t, "alice", "mem-c");
    assert!(c_bytes > 0, "attached C keeps its buffer");
    assert_eq!(
        memory.used(),
        b_bytes + c_bytes,
        "A's bytes left the account"
    );
    assert!(memory.used() <= DROP_BUDGET, "back under the budget");
    assert_eq!(
        t.relay.relay.metrics.pressure_freed_bytes.get(),
        a_bytes as u64,
        "freed exactly A's bytes"
    );
    assert!(
        !t.relay.relay.refuses_upgrades(),
        "dropping sufficed: no 503"
    );
}

/// §5.4, §5.5, §8.2: after the drop, A's `reconnect` gets `snapshot` (its
/// chat's state holds every turn it ran), B's gets `replay` with every
/// envelope after its S0, and C, attached throughout, leaves and gets
/// `replay` too; `/metrics` shows one buffer dropped with A's bytes freed,
/// outcomes 1 snapshot / 2 replay, a fallback ratio of 1/3 and two replay
/// sizes, and no refused upgrade.
#[tokio::test]
async fn after_a_drop_only_the_dropped_session_falls_back_to_a_snapshot() {
    let DropRun {
        t,
        a,
        b,
        c,
        a_bytes,
        ..
    } = drop_run().await;
    assert_eq!(dropped_buffers(&t), 1, "exactly one buffer dropped");
    // A: the buffer lost the gap → snapshot, never a replay with a hole.
    let (_a_ws, r) = a.reconnect(&t, a.s0).await;
    assert_eq!(r["type"], "snapshot", "A's buffer was dropped: {r}");
    assert_eq!(snapshot_resources(&r), [a.chat.as_str()], "{r}");
    let turns = r["snapshots"][0]["state"]["turns"]
        .as_array()
        .unwrap_or_else(|| panic!("chat state with turns: {r}"))
        .len();
    assert_eq!(turns as u64, a.turns, "the snapshot holds every turn A ran");

    // B: detached more recently, still fits → replay of everything after S0.
    let (_b_ws, r) = b.reconnect(&t, b.s0).await;
    assert_eq!(r["type"], "replay", "B's buffer was kept: {r}");
    assert_eq!(r["missing"], json!([]));
    let replayed = envelopes(&r["actions"]);
    assert_contiguous(&replayed, b.s0);
    let seqs = |envs: &[ActionEnvelope]| envs.iter().map(|e| e.server_seq).collect::<Vec<_>>();
    assert_eq!(seqs(&replayed), seqs(&b.seen), "exactly what B was sent");

    // C was attached during the drop: it leaves and replays everything.
    let c = c.leave(&t).await;
    let (_c_ws, r) = c.reconnect(&t, c.s0).await;
    assert_eq!(r["type"], "replay", "attached C was never dropped: {r}");
    assert_eq!(seqs(&envelopes(&r["actions"])), seqs(&c.seen));
    assert_eq!(dropped_buffers(&t), 1, "no further drop");

    let (status, page) = admin_get(&t, "/metrics").await;
    assert_eq!(status, 200);
    let expect = [
        ("ahp_relay_replay_memory_dropped_buffers_total", 1.0),
        ("ahp_relay_replay_memory_freed_bytes_total", a_bytes as f64),
        ("ahp_relay_reconnects_total{outcome=\"snapshot\"}", 1.0),
        ("ahp_relay_reconnects_total{outcome=\"replay\"}", 2.0),
        ("ahp_relay_reconnect_snapshot_fallback_ratio", 1.0 / 3.0),
        ("ahp_relay_replay_envelopes_count", 2.0),
        (
            "ahp_relay_replay_envelopes_sum",
            (b.seen.len() + c.seen.len()) as f64,
        ),
    ];
    assert_metrics(&page, &expect);
    assert!(
        page.contains("ahp_relay_replay_envelopes_bucket{le=\"4096\"} 2"),
        "replay size histogram:\n{page}"
    );
    assert!(
        !page.contains("ahp_relay_upgrades_refused_total{"),
        "no upgrade was refused:\n{page}"
    );
}

// ─── refusing upgrades ──────────────────────────────────────────────────────

/// The budget of the refusal tests, and their `Retry-After`.
const FULL_BUDGET: usize = 60_000;
const RETRY: u64 = 7;

/// Two attached sessions over [`FULL_BUDGET`] (resume at 50%): A fills 60%
/// (upgrades are still accepted then), B runs turns until the total is
/// over the budget; returns once the relay refuses upgrades.
async fn full_world() -> (TestRelay, Follower, Follower) {
    let t = TestRelay::start(
        vec![host("a", 2, script(10, 16, 0))],
        &format!(
            "[limits]\nreplay_memory_bytes = {FULL_BUDGET}\nreplay_memory_resume_percent = 50\n\
             replay_memory_retry_after_secs = {RETRY}\n"
        ),
    )
    .await;
    let memory = t.relay.relay.replay_memory();
    assert_eq!(memory.low_watermark(), FULL_BUDGET / 2);
    let (chat1, chat2) = (seeded_chat("a", 1).0, seeded_chat("a", 2).0);
    let mut a = Follower::start(&t, "alice", "full-a", &chat1).await;
    a.fill(&t, FULL_BUDGET * 60 / 100, FULL_BUDGET).await;
    assert!(memory.used() <= FULL_BUDGET, "A alone fits");
    let ok = t.upgrade_bearer(&t.token("carol")).await;
    assert_eq!(
        ok.status, 101,
        "control: upgrades accepted under the budget"
    );
    drop(ok);
    let mut b = Follower::start(&t, "bob", "full-b", &chat2).await;
    while memory.used() <= FULL_BUDGET {
        b.turn(&t, FULL_BUDGET).await;
    }
    let relay = t.relay.relay.clone();
    wait_until("upgrades refused", || relay.refuses_upgrades()).await;
    (t, a, b)
}

/// §5.4: when attached sessions alone exceed the budget nothing is
/// dropped, a new upgrade with a valid token gets 503 `Retry-After: 7`
/// (naming memory), and the attached clients keep working and buffering;
/// `/healthz` is not an upgrade and still answers.
#[tokio::test]
async fn attached_sessions_over_budget_are_kept_and_new_upgrades_get_503() {
    let (t, mut a, _b) = full_world().await;
    let memory = t.relay.relay.replay_memory();
    assert_503(&t, "carol", RETRY, "attached sessions over budget").await;
    assert_eq!(
        dropped_buffers(&t),
        0,
        "attached sessions are never dropped"
    );
    let (a_bytes, b_bytes) = (
        buffered(&t, "alice", "full-a"),
        buffered(&t, "bob", "full-b"),
    );
    assert_eq!(memory.used(), a_bytes + b_bytes);
    // The attached clients keep working (and keep buffering).
    a.turn(&t, FULL_BUDGET).await;
    assert!(buffered(&t, "alice", "full-a") > a_bytes, "A still buffers");
    let (status, _) = admin_get(&t, "/healthz").await;
    assert_eq!(status, 200, "health is not an upgrade");
}

/// §5.4, §8.2: when B leaves its detached buffer is dropped, but A alone
/// (60%) is above the low watermark, so upgrades stay refused
/// (hysteresis); when A leaves too, memory falls to the low watermark and
/// an upgrade succeeds and initializes; A's `reconnect`, though it had
/// seen everything, gets `snapshot`. `/metrics` counts both refusals by
/// reason and both drops, and no auth failure.
#[tokio::test]
async fn upgrades_resume_only_once_memory_falls_to_the_low_watermark() {
    let (t, a, b) = full_world().await;
    let memory = t.relay.relay.replay_memory();
    let relay = t.relay.relay.clone();
    let chat1 = seeded_chat("a", 1).0;
    assert_503(&t, "carol", RETRY, "attached sessions over budget").await;

    // B leaves: its detached buffer goes, A alone is under the budget but
    // above the low watermark → still refused.
    let _b = b.leave(&t).await;
    wait_until("B's buffer dropped", || dropped_buffers(&t) == 1).await;
    assert_eq!(buffered(&t, "bob", "full-b"), 0);
    let used = memory.used();
    assert!(
        used <= FULL_BUDGET && used > memory.low_watermark(),
        "between the marks: {used}"
    );
    assert_503(&t, "carol", RETRY, "hysteresis: above the low watermark").await;

    // A leaves: memory falls to the low watermark → upgrades resume.
    let a_last = a.last();
    let a = a.leave(&t).await;
    wait_until("A's buffer dropped", || dropped_buffers(&t) == 2).await;
    assert!(memory.used() <= memory.low_watermark());
    assert!(!relay.refuses_upgrades());
    let mut ws = t
        .upgrade_bearer(&t.token("carol"))
        .await
        .socket("upgrade after memory freed");
    let init = ws.initialize("full-c").await;
    assert!(init["result"]["serverSeq"].as_u64().is_some(), "{init}");

    // A had seen everything, yet its buffer was dropped: snapshot.
    let (_a_ws, r) = a.reconnect(&t, a_last).await;
    assert_eq!(
        r["type"], "snapshot",
        "a dropped buffer forces a snapshot: {r}"
    );
    assert_eq!(snapshot_resources(&r), [chat1.as_str()]);

    let (_, page) = admin_get(&t, "/metrics").await;
    assert_metrics(
        &page,
        &[
            (
                "ahp_relay_upgrades_refused_total{reason=\"replay_memory\"}",
                2.0,
            ),
            ("ahp_relay_replay_memory_dropped_buffers_total", 2.0),
            ("ahp_relay_reconnect_snapshot_fallback_ratio", 1.0),
        ],
    );
    assert!(
        !page.contains("ahp_relay_auth_failures_total{"),
        "a 503 is not an auth failure:\n{page}"
    );
}

// ─── configuration ──────────────────────────────────────────────────────────

/// The memory limits have defaults (256 MiB, resume at 75%, Retry-After 10 s) and out-of-range values are configuration errors.
#[test]
fn memory_limits_default_and_validate() {
    let d = ahp_relay::config::Limits::default();
    assert_eq!(d.replay_memory_bytes, 256 * 1024 * 1024);
    assert_eq!(d.replay_memory_low_bytes(), 192 * 1024 * 1024);
    assert_eq!(d.replay_memory_retry_after_secs, 10);
    let kit = ahp_relay::devkit::DevKit::create(&scratch_dir("memory-config")).expect("dev kit");
    let load = |extra: &str| kit.config("127.0.0.1:0", &[], "", extra);
    let ok = load("[limits]\nreplay_memory_bytes = 1000\nreplay_memory_resume_percent = 33\n")
        .expect("valid limits load");
    assert_eq!(ok.limits.replay_memory_low_bytes(), 330);
    for bad in [
        "replay_memory_bytes = 0",
        "replay_memory_resume_percent = 0",
        "replay_memory_resume_percent = 101",
        "replay_memory_retry_after_secs = 0",
    ] {
        let err = load(&format!("[limits]\n{bad}\n"));
        assert!(err.is_err(), "{bad} must be refused");
    }
}

//! S13 — randomized convergence through the relay (contract §5, §9 S13).
//!
//! # Design
//!
//! Every run is fixed by one seed (a SplitMix64 stream). From the seed the
//! run draws its configuration and its whole step plan *before* it starts,
//! so the plan is a pure function of the seed; only the timing of frames
//! (and so the exact ids a step acts on) depends on the machine.
//!
//! * **World.** Two simhosts `a` and `b` (2 seeded sessions each, chats
//!   `ahp-chat:/<h>-<n>-main`; seeded agents with `delta_rate: 0`, 1–6
//!   deltas a turn, a tool call needing confirmation on about half the
//!   turns), one relay in front of them with `[limits]
//!   replay_buffer_envelopes` ∈ {4, 16, 4096} and `detach_grace_secs` ∈
//!   {0, 20} (0: a dropped client loses its links at once, so its next
//!   `reconnect` needs snapshots by re-baselining).
//! * **Clients.** Three clients on raw TLS WebSockets (`RawWs`), so the test
//!   sees every frame and close code: `alice/s13-a0`, `alice/s13-a1`,
//!   `bob/s13-b0`. Each follows one chat on each host (drawn per run, so
//!   clients often share a chat and race) and `ahp-root://` with
//!   probability ½. `clientSeq`s increase across connections and sessions
//!   (the seed study §6.4: persisted with the clientId).
//! * **Client model** (the seed study §4.2 store): per channel the
//!   confirmed state (a snapshot plus the accepted envelopes, applied with
//!   the official reducers; rejected envelopes are skipped) and the number
//!   it was last advanced to; per client the watermark (highest `serverSeq`
//!   seen, *replaced* by a reconnect snapshot's `fromSeq` and by
//!   `InitializeResult.serverSeq`) and every dispatch it sent (clientSeq →
//!   channel, action type, echoes seen). After each (re)connection and its
//!   drain, dispatches without an echo are "taken as unacknowledged"
//!   (`takeUnacknowledged`); an echo that still arrives later is counted as
//!   late, not as an error.
//! * **Steps** (weights in [`draw_step`]): `T` `chat/turnStarted` with a
//!   fresh turnId; `C` `chat/turnCancelled` of the active turn as the
//!   client sees it (or of an old turn: a rejection); `A`
//!   `chat/toolCallConfirmed` of a pending tool call (¼ denials; or of an
//!   old one: a rejection); `Q` `chat/pendingMessageSet` queued; `D` drain
//!   every socket until 3 ms of silence; `X` drop a client's socket
//!   (no close frame); `R` reconnect a dropped client (new socket,
//!   `reconnect` with its watermark and channels; -32008 → `initialize`
//!   with `initialSubscriptions` on the same socket); `S` supersede:
//!   reconnect on a new socket while the old one is attached (the old one
//!   must close with 4009); `I` client restart: `initialize` on a new
//!   socket (a new session: new S0 above the old watermark); `H` host
//!   restart keeping state (`SimHost::restart(true)`: active turns end
//!   without envelopes, links drop → 4000); `F` forced resync (the host
//!   drops that client's link → 4000); `W` stall a host until the next
//!   step that is not a dispatch or drain; `Z` relay restart (stop + start
//!   from the same `DevKit` dir; clients get 1012, and their `reconnect`
//!   is adopted by the new incarnation (§12.2: a `snapshot` numbered above
//!   their watermark), never -32008 — the run asserts `not_found` is 0). Channels left without a snapshot by
//!   an `initialize` (a host still reconnecting its watch link) are
//!   re-subscribed on later steps, as the seed study §6.6 step 7 says.
//! * **Checked on every frame:** `serverSeq`s strictly increase within a
//!   connection and lie above the connection's floor (the watermark sent
//!   in `reconnect`, the snapshots' `fromSeq`, `InitializeResult.serverSeq`)
//!   and below 2^53; no envelope for a channel before its snapshot; every
//!   reducer accepts every accepted envelope; an echo (origin = the
//!   client's own id) names a clientSeq it dispatched, on the same channel
//!   and type, at most once; its own upstream id never leaks and other
//!   clients appear only as `r1.` pseudonyms; the S0 of a new session
//!   lies above the client's old watermark; replay `missing` is empty and a
//!   `snapshot` answer carries every requested channel with one `fromSeq`
//!   ≥ the watermark; sockets close only with 4000, 1012, or 4009 when
//!   the test superseded them (not a reset or an EOF without close frame,
//!   read as 1006); the answer of a `reconnect`/`initialize` is the cut
//!   (§5.5): an envelope before it fails the run. `S13_STRICT_CUT=0`
//!   relaxes this (for bisecting): such an envelope is then kept, counted
//!   (`pre_cut_envelopes`), and must be covered by the answer (numbered at
//!   or below its channel's snapshot), as a client following the seed
//!   study §6.6 drops it by `serverSeq`.
//! * **End of run:** stop dispatching, unstall, reconnect and re-subscribe
//!   everyone, approve every pending tool call and remove leftover queued
//!   messages (through the relay) until every host chat is idle with an
//!   empty queue and the hosts' `serverSeq` stops moving; then reconnect
//!   everyone once more, drain behind a `ping`, and require for every client
//!   and channel: its reduced chat state equals the host's state of that
//!   chat with `resource` replaced by the client's URI
//!   (`ahp-chat:/<h>~<h>-<n>-main`), whole trees; its root state equals a
//!   fresh subscriber's root snapshot; and every dispatch was echoed
//!   exactly once or never (reported unacknowledged). Every wait is
//!   bounded; a timeout fails the run.
//!
//! # Running
//!
//! `cargo test --test relay_convergence` runs [`RUNS`] seeds × [`STEPS`]
//! steps, [`JOBS`] runs at a time. `S13_RUNS`, `S13_STEPS`, `S13_JOBS`,
//! `S13_BASE` (first seed) override; `S13_SEED=<n>` runs that seed alone;
//! `S13_PLAN="T0a D X0 R0"` replaces the seed's step list (its config
//! stays); `S13_SHRINK=1` with `S13_SEED` looks for a shorter plan that
//! fails the same way; `S13_TRACE=1` adds each client's last 200 events
//! (connections, answers, envelopes, dispatches) to a failure report;
//! `S13_STRICT_CUT=0` see above. A failing run prints its seed, plan and
//! the command to reproduce it (the plan replays exactly; frame timing does
//! not, so a race may need a few tries, or `S13_BASE`/`S13_RUNS` around the
//! seed to recreate the load it failed under). At least
//! 100 runs must together show every fault kind (replay, snapshot,
//! not-found, rejection, unacknowledged, 4000, 1012, 4009, host restart,
//! forced resync, stall, client drop). The long run is `#[ignore]`d:
//! `cargo test --release --test relay_convergence s13_long -- --ignored --nocapture`.
//!
//! Each run has its own two hosts and relay (nothing is shared between
//! runs). The deterministic tests at the end of this file each pin one
//! ordering the random runs reach only by chance: the `reconnect` answer
//! as the cut (§5.5), close codes behind frames in flight (§3.7), and
//! overlapping reconnects (§5.6).

mod common;
mod s13;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ahp_relay::simhost::{AgentScript, SimHostConfig};
use ahp_relay::upstream::dial::DialOptions;
use ahp_relay::upstream::hub::HostStatus;
use common::relay::TestRelay;
use common::{
    Next, ROOT, RawWs, dispatch_frame, host, initialize_subscribing, ping_frame, reconnect_params,
    request_frame, script, seeded_chat, turn_started, wait_until,
};
use futures_util::StreamExt;
use s13::{
    Act, Answer, Chan, Client, Fail, How, QUIET, R, REQUEST_WITHIN, Rng, St, Stats, all_in, fail,
    rest_round,
};
use serde_json::{Value, json};

/// Runs in CI.
const RUNS: u64 = 200;
/// Steps per run in CI.
const STEPS: usize = 80;
/// Runs executed at the same time.
const JOBS: usize = 6;
/// First seed of the CI runs.
const BASE: u64 = 1;

const HOSTS: [&str; 2] = ["a", "b"];
const SESSIONS: usize = 2;
const CLIENTS: [(&str, &str); 3] = [("alice", "s13-a0"), ("alice", "s13-a1"), ("bob", "s13-b0")];
const REPLAY_BUFFERS: [usize; 3] = [4, 16, 4096];
const GRACES: [u64; 2] = [0, 20];

/// Bound of a whole run.
const RUN_WITHIN: Duration = Duration::from_secs(120);

// ─── plan ───────────────────────────────────────────────────────────────────

/// One step of a plan. Client and host are indices into [`CLIENTS`] and [`HOSTS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Turn(usize, usize),
    Cancel(usize, usize),
    Confirm(usize, usize),
    Queue(usize, usize),
    Drain,
    Drop(usize),
    Reconnect(usize),
    Supersede(usize),
    Reinit(usize),
    HostRestart(usize),
    Resync(usize, usize),
    Stall(usize),
    RelayRestart,
}

impl Step {
    fn is_dispatch_or_drain(self) -> bool {
        matches!(
            self,
            Step::Turn(..) | Step::Cancel(..) | Step::Confirm(..) | Step::Queue(..) | Step::Drain
        )
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let h = |i: usize| HOSTS[i];
        match *self {
            Step::Turn(c, x) => write!(f, "T{c}{}", h(x)),
            Step::Cancel(c, x) => write!(f, "C{c}{}", h(x)),
            Step::Confirm(c, x) => write!(f, "A{c}{}", h(x)),
            Step::Queue(c, x) => write!(f, "Q{c}{}", h(x)),
            Step::Drain => write!(f, "D"),
            Step::Drop(c) => write!(f, "X{c}"),
            Step::Reconnect(c) => write!(f, "R{c}"),
            Step::Supersede(c) => write!(f, "S{c}"),
            Step::Reinit(c) => write!(f, "I{c}"),
            Step::HostRestart(x) => write!(f, "H{}", h(x)),
            Step::Resync(c, x) => write!(f, "F{c}{}", h(x)),
            Step::Stall(x) => write!(f, "W{}", h(x)),
            Step::RelayRestart => write!(f, "Z"),
        }
    }
}

fn parse_step(s: &str) -> Option<Step> {
    let mut it = s.chars();
    let kind = it.next()?;
    let rest: Vec<char> = it.collect();
    let client = |i: usize| {
        rest.get(i)
            .and_then(|c| c.to_digit(10))
            .map(|d| d as usize)
            .filter(|d| *d < CLIENTS.len())
    };
    let host = |i: usize| {
        rest.get(i)
            .and_then(|c| HOSTS.iter().position(|h| h.starts_with(*c)))
    };
    Some(match kind {
        'T' => Step::Turn(client(0)?, host(1)?),
        'C' => Step::Cancel(client(0)?, host(1)?),
        'A' => Step::Confirm(client(0)?, host(1)?),
        'Q' => Step::Queue(client(0)?, host(1)?),
        'D' => Step::Drain,
        'X' => Step::Drop(client(0)?),
        'R' => Step::Reconnect(client(0)?),
        'S' => Step::Supersede(client(0)?),
        'I' => Step::Reinit(client(0)?),
        'H' => Step::HostRestart(host(0)?),
        'F' => Step::Resync(client(0)?, host(1)?),
        'W' => Step::Stall(host(0)?),
        'Z' => Step::RelayRestart,
        _ => return None,
    })
}

fn plan_text(steps: &[Step]) -> String {
    steps
        .iter()
        .map(Step::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}

/// What a run is made of, fixed by its seed.
#[derive(Clone, Debug)]
struct RunCfg {
    seed: u64,
    buffer: usize,
    grace: u64,
    /// Per client, per host: the session number (1-based) whose chat it follows.
    chats: [[usize; 2]; 3],
    /// Per client: whether it follows `ahp-root://`.
    root: [bool; 3],
    steps: Vec<Step>,
}

impl fmt::Display for RunCfg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let chats: Vec<String> = self
            .chats
            .iter()
            .zip(self.root)
            .map(|(c, r)| format!("a{} b{}{}", c[0], c[1], if r { " root" } else { "" }))
            .collect();
        write!(
            f,
            "seed={} replay_buffer_envelopes={} detach_grace_secs={} chats=[{}] steps={}",
            self.seed,
            self.buffer,
            self.grace,
            chats.join(" | "),
            self.steps.len()
        )
    }
}

fn draw_step(rng: &mut Rng) -> Step {
    let c = rng.below(CLIENTS.len());
    let h = rng.below(HOSTS.len());
    match rng.below(1000) {
        0..=209 => Step::Turn(c, h),
        210..=279 => Step::Cancel(c, h),
        280..=399 => Step::Confirm(c, h),
        400..=469 => Step::Queue(c, h),
        470..=629 => Step::Drain,
        630..=684 => Step::Drop(c),
        685..=844 => Step::Reconnect(c),
        845..=869 => Step::Supersede(c),
        870..=884 => Step::Reinit(c),
        885..=914 => Step::HostRestart(h),
        915..=949 => Step::Resync(c, h),
        950..=989 => Step::Stall(h),
        _ => Step::RelayRestart,
    }
}

fn plan(seed: u64, steps: usize) -> RunCfg {
    let mut rng = Rng::new(seed);
    let buffer = REPLAY_BUFFERS[rng.below(REPLAY_BUFFERS.len())];
    let grace = GRACES[rng.below(GRACES.len())];
    let mut chats = [[1; 2]; 3];
    let mut root = [false; 3];
    for (per_host, follows_root) in chats.iter_mut().zip(root.iter_mut()) {
        for n in per_host.iter_mut() {
            *n = 1 + rng.below(SESSIONS);
        }
        *follows_root = rng.chance(1, 2);
    }
    let steps = (0..steps).map(|_| draw_step(&mut rng)).collect();
    RunCfg {
        seed,
        buffer,
        grace,
        chats,
        root,
        steps,
    }
}

// ─── the world ──────────────────────────────────────────────────────────────

fn dial_options(t: &TestRelay, sub: &str) -> DialOptions {
    let mut opts = t.dial_options(Some(t.token(sub)));
    opts.connect_timeout = Duration::from_secs(5);
    opts
}

async fn dial(t: &TestRelay, sub: &str) -> R<RawWs> {
    s13::dial(&dial_options(t, sub)).await
}

fn host_cfg(name: &str, seed: u64) -> SimHostConfig {
    SimHostConfig {
        sessions: SESSIONS,
        script: AgentScript {
            reply_deltas: 3,
            delta_bytes: 12,
            delta_rate: 0,
            tool_confirmation: true,
            seed: Some(seed),
        },
        record_limit: 16,
        ..SimHostConfig::named(name)
    }
}

fn limits(cfg: &RunCfg) -> String {
    format!(
        "\n[limits]\nreplay_buffer_envelopes = {}\ndetach_grace_secs = {}\n",
        cfg.buffer, cfg.grace
    )
}

async fn bounded_until(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + within;
    while !cond() {
        if Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    true
}

fn hosts_up(t: &TestRelay) -> bool {
    t.relay.relay.hubs().all(|h| h.status() == HostStatus::Up)
}

struct Run {
    cfg: RunCfg,
    t: Option<TestRelay>,
    clients: Vec<Client>,
    stalled: [bool; 2],
    rng: Rng,
    st: Stats,
}

impl Run {
    async fn start(cfg: RunCfg) -> R<Self> {
        let hosts = HOSTS
            .iter()
            .enumerate()
            .map(|(i, h)| host_cfg(h, cfg.seed.wrapping_mul(0x9E37_79B9).wrapping_add(i as u64)))
            .collect();
        let t = TestRelay::start_unchecked(hosts, "", &limits(&cfg)).await;
        if !bounded_until(Duration::from_secs(10), || hosts_up(&t)).await {
            return Err(fail("setup", "watch links did not come up"));
        }
        let mut clients = Vec::new();
        for (idx, (sub, id)) in CLIENTS.iter().enumerate() {
            let mut chans = Vec::new();
            if cfg.root[idx] {
                chans.push(Chan {
                    uri: ROOT.into(),
                    host: None,
                    state: None,
                    applied: 0,
                });
            }
            for (h, host) in HOSTS.iter().enumerate() {
                let n = cfg.chats[idx][h];
                chans.push(Chan {
                    uri: format!("ahp-chat:/{host}~{host}-{n}-main"),
                    host: Some((h, format!("ahp-chat:/{host}-{n}-main"))),
                    state: None,
                    applied: 0,
                });
            }
            clients.push(Client {
                idx,
                sub,
                id: (*id).to_string(),
                upstream: t.upstream_id(sub, id),
                chans,
                ws: None,
                conn: 0,
                conn_last: None,
                watermark: None,
                next_seq: 1,
                next_req: 0,
                sent: BTreeMap::new(),
                fresh: 0,
                strict_cut: strict_cut(),
                pre_cut: Vec::new(),
                trace: std::collections::VecDeque::new(),
                contiguous: false,
                hosts_may_be_down: false,
            });
        }
        let rng = Rng::new(cfg.seed ^ 0xD1CE_D1CE);
        let mut run = Self {
            cfg,
            t: Some(t),
            clients,
            stalled: [false; 2],
            rng,
            st: Stats {
                runs: 1,
                ..Stats::default()
            },
        };
        for c in 0..CLIENTS.len() {
            run.connect(c, How::Fresh).await?;
        }
        Ok(run)
    }

    fn t(&self) -> &TestRelay {
        self.t.as_ref().expect("relay present between steps")
    }

    async fn connect(&mut self, c: usize, how: How) -> R<()> {
        let t = self.t.as_ref().expect("relay present between steps");
        let opts = dial_options(t, self.clients[c].sub);
        self.clients[c].connect(&opts, how, &mut self.st).await?;
        self.clients[c].resubscribe(&mut self.st).await
    }

    async fn drain_all(&mut self) -> R<()> {
        for c in self.clients.iter_mut() {
            c.drain(QUIET, Duration::from_millis(500), &mut self.st)
                .await?;
        }
        Ok(())
    }

    fn unstall(&mut self) {
        for h in 0..HOSTS.len() {
            if self.stalled[h] {
                self.t().hosts[h].set_stalled(false);
                self.stalled[h] = false;
            }
        }
    }

    async fn step(&mut self, step: Step) -> R<()> {
        self.st.steps += 1;
        if !step.is_dispatch_or_drain() {
            self.unstall();
        }
        match step {
            Step::Turn(..) | Step::Cancel(..) | Step::Confirm(..) | Step::Queue(..) => {
                self.dispatch_step(step).await?;
            }
            Step::Drain => self.drain_all().await?,
            Step::Drop(c) => {
                if self.clients[c].ws.take().is_some() {
                    self.clients[c].conn_last = None;
                    self.st.client_drops += 1;
                    let conn = self.clients[c].conn;
                    self.clients[c].note(format!("conn {conn}: dropped by the test"));
                }
            }
            Step::Reconnect(c) => {
                if self.clients[c].ws.is_none() {
                    self.connect(c, How::Resume).await?;
                } else {
                    self.clients[c].resubscribe(&mut self.st).await?;
                }
            }
            Step::Supersede(c) | Step::Reinit(c) => {
                let how = if matches!(step, Step::Reinit(_)) {
                    How::Fresh
                } else {
                    How::Resume
                };
                let old = self.clients[c].ws.take();
                self.connect(c, how).await?;
                if let Some(mut old) = old {
                    self.expect_superseded(c, &mut old).await?;
                }
            }
            Step::HostRestart(h) => {
                self.t().hosts[h].restart(true);
                self.st.host_restarts += 1;
            }
            Step::Resync(c, h) => {
                let n = self.t().hosts[h].drop_client(&self.clients[c].upstream);
                self.st.resync_drops += n as u64;
            }
            Step::Stall(h) => {
                self.t().hosts[h].set_stalled(true);
                self.stalled[h] = true;
                self.st.stalls += 1;
            }
            Step::RelayRestart => self.restart_relay().await?,
        }
        Ok(())
    }

    /// A dispatch step by its client on its host's chat ([`Client::act`]).
    async fn dispatch_step(&mut self, step: Step) -> R<()> {
        let (act, c, h) = match step {
            Step::Turn(c, h) => (Act::Turn, c, h),
            Step::Cancel(c, h) => (Act::Cancel, c, h),
            Step::Confirm(c, h) => (Act::Confirm(!self.rng.chance(1, 4)), c, h),
            Step::Queue(c, h) => (Act::Queue, c, h),
            _ => return Ok(()),
        };
        let cl = &mut self.clients[c];
        let ci = cl.host_chan(h);
        cl.act(act, ci, self.cfg.seed, &mut self.st).await
    }

    /// A socket replaced by the client's new one closes with 4009 (§5.6);
    /// its remaining frames are the old connection's and are not read.
    async fn expect_superseded(&mut self, c: usize, old: &mut RawWs) -> R<()> {
        let end = Instant::now() + Duration::from_secs(5);
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match old.next_within(left).await {
                None => {
                    return Err(fail(
                        "superseded-socket-not-closed",
                        format!("client {c}: the old socket stayed open"),
                    ));
                }
                Some(Next::Frame(_)) => {}
                Some(Next::Closed(Some((4009, _)))) => {
                    self.st.closes_4009 += 1;
                    return Ok(());
                }
                // Closed for another reason before the supersede reached it.
                Some(Next::Closed(Some((4000 | 1012, _)))) => return Ok(()),
                Some(Next::Closed(other)) => {
                    return Err(fail(
                        "superseded-socket-close-code",
                        format!("client {c}: {other:?}"),
                    ));
                }
            }
        }
    }

    async fn restart_relay(&mut self) -> R<()> {
        self.st.relay_restarts += 1;
        let TestRelay { relay, hosts, kit } = self.t.take().expect("relay present");
        let gone = Arc::downgrade(&relay.relay);
        relay.stop();
        // Every attached client is told 1012; read up to the close.
        for c in self.clients.iter_mut() {
            c.drain(Duration::from_secs(5), Duration::from_secs(5), &mut self.st)
                .await?;
            if c.ws.is_some() {
                return Err(fail(
                    "relay-stop-left-socket-open",
                    format!("client {}", c.idx),
                ));
            }
        }
        let dropped = bounded_until(Duration::from_secs(10), || gone.strong_count() == 0).await;
        if !dropped {
            return Err(fail(
                "relay-not-released-after-stop",
                "the stopped relay is still referenced after 10 s",
            ));
        }
        let pairs: Vec<(String, String)> = hosts
            .iter()
            .map(|h| (h.config().name.clone(), h.url()))
            .collect();
        let cfg = kit
            .config("127.0.0.1:0", &pairs, "", &limits(&self.cfg))
            .map_err(|e| fail("relay-restart", e.to_string()))?;
        // The last `Arc<Relay>` may still be dropping its store on another
        // thread when the weak count reads 0: retry while the file is locked.
        let end = Instant::now() + Duration::from_secs(5);
        let relay = loop {
            match ahp_relay::run::start(cfg.clone()).await {
                Ok(r) => break r,
                Err(e @ ahp_relay::run::StartError::Store(_)) if Instant::now() < end => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(e) => return Err(fail("relay-restart", e.to_string())),
            }
        };
        let t = TestRelay { relay, hosts, kit };
        let up = bounded_until(Duration::from_secs(10), || hosts_up(&t)).await;
        self.t = Some(t);
        if !up {
            return Err(fail("relay-restart", "watch links did not come up"));
        }
        Ok(())
    }

    /// Stops dispatching and drives every chat to rest: everyone connected
    /// and baselined, pending tool calls approved, leftover queued messages
    /// removed, the hosts' numbering still.
    async fn quiesce(&mut self) -> R<()> {
        self.unstall();
        let end = Instant::now() + Duration::from_secs(30);
        let mut last_seqs = Vec::new();
        loop {
            if Instant::now() >= end {
                let states: Vec<String> = self
                    .host_chats()
                    .into_iter()
                    .map(|(_, _, s)| s.to_string())
                    .collect();
                return Err(fail(
                    "no-quiescence",
                    format!("the run did not come to rest in 30 s; host chats: {states:?}"),
                ));
            }
            if !hosts_up(self.t()) {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            for c in 0..self.clients.len() {
                if self.clients[c].ws.is_none() {
                    self.connect(c, How::Resume).await?;
                } else {
                    self.clients[c].resubscribe(&mut self.st).await?;
                }
            }
            self.drain_all().await?;
            let chats = self.host_chats();
            let busy = rest_round(&mut self.clients, chats, &mut self.st).await?;
            let seqs: Vec<u64> = self.t().hosts.iter().map(|h| h.server_seq()).collect();
            let all_in = all_in(&self.clients);
            if !busy && all_in && seqs == last_seqs {
                return Ok(());
            }
            last_seqs = seqs;
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
    }

    /// Every seeded chat of every host: (host, host URI, state).
    fn host_chats(&self) -> Vec<(usize, String, Value)> {
        let mut out = Vec::new();
        for (h, host) in HOSTS.iter().enumerate() {
            for n in 1..=SESSIONS {
                let uri = format!("ahp-chat:/{host}-{n}-main");
                let state = self.t().hosts[h].channel_state(&uri).unwrap_or(Value::Null);
                out.push((h, uri, state));
            }
        }
        out
    }

    /// Reads every socket behind a `ping` (the relay answers it after every
    /// frame it queued before).
    async fn barrier(&mut self) -> R<()> {
        for c in self.clients.iter_mut() {
            if c.ws.is_none() {
                continue;
            }
            match c
                .request("ping", json!({"channel": ROOT}), false, &mut self.st)
                .await?
            {
                Answer::Result(_) => {}
                Answer::Error(_, e) => return Err(fail("ping-error", e.to_string())),
                Answer::Closed(code) => {
                    return Err(fail(
                        "closed-at-the-end",
                        format!("client {} closed with {code:?} at rest", c.idx),
                    ));
                }
            }
        }
        Ok(())
    }

    async fn finish(&mut self) -> R<()> {
        self.quiesce().await?;
        // Everyone reconnects once more, at rest.
        for c in 0..self.clients.len() {
            self.clients[c].ws = None;
            self.connect(c, How::Resume).await?;
        }
        self.quiesce().await?;
        // The hosts are still; wait a little more, then read everything.
        let seqs: Vec<u64> = self.t().hosts.iter().map(|h| h.server_seq()).collect();
        tokio::time::sleep(Duration::from_millis(30)).await;
        let now: Vec<u64> = self.t().hosts.iter().map(|h| h.server_seq()).collect();
        if seqs != now {
            return Err(fail("hosts-not-still", format!("{seqs:?} → {now:?}")));
        }
        self.barrier().await?;
        self.verify().await
    }

    async fn verify(&mut self) -> R<()> {
        let root = self.fresh_root().await?;
        for c in &self.clients {
            c.verify_states(&root, |h, uri| self.t().hosts[h].channel_state(uri))?;
            c.tally_echoes(&mut self.st)?;
        }
        Ok(())
    }

    /// The root state a fresh subscriber gets now.
    async fn fresh_root(&mut self) -> R<Value> {
        let mut ws = dial(self.t(), "alice").await?;
        let id = format!("s13-probe-{}", self.cfg.seed);
        let init = request_frame(1, "initialize", initialize_subscribing(&id, &[ROOT]));
        if !ws.try_send_json(&init).await {
            return Err(fail("probe", "cannot send"));
        }
        let end = Instant::now() + REQUEST_WITHIN;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match ws.next_within(left).await {
                Some(Next::Frame(v)) if v["id"] == 1 => {
                    let snap = v["result"]["snapshots"]
                        .as_array()
                        .and_then(|s| s.first())
                        .cloned()
                        .ok_or_else(|| fail("probe", v.to_string()))?;
                    // Through the same types as the clients' state.
                    return Ok(St::parse(ROOT, &snap["state"])?.json());
                }
                Some(Next::Frame(_)) => {}
                other => {
                    return Err(fail(
                        "probe",
                        format!("no initialize answer: {}", other.is_some()),
                    ));
                }
            }
        }
    }

    async fn shutdown(mut self) {
        self.unstall();
        for c in self.clients.iter_mut() {
            c.ws = None;
        }
        if let Some(t) = self.t.take() {
            let TestRelay { relay, hosts, kit } = t;
            relay.stop();
            for h in hosts {
                h.shutdown().await;
            }
            let _ = std::fs::remove_dir_all(&kit.dir);
        }
    }
}

/// The outcome of one run.
struct Outcome {
    cfg: RunCfg,
    /// Index of the step that failed (`steps.len()`: the end of the run).
    at: usize,
    failure: Option<Fail>,
    stats: Stats,
    took: Duration,
    /// The clients' recent histories, when the run failed.
    trace: String,
}

async fn run_once(cfg: RunCfg) -> Outcome {
    let started = Instant::now();
    let steps = cfg.steps.clone();
    let mut at = 0;
    let mut stats = Stats::default();
    let mut trace = String::new();
    let body = async {
        let mut run = Run::start(cfg.clone()).await?;
        let r = async {
            for (i, s) in steps.iter().enumerate() {
                at = i;
                run.step(*s).await?;
            }
            at = steps.len();
            run.finish().await
        }
        .await;
        stats = run.st.clone();
        if r.is_err() {
            for c in &run.clients {
                trace.push_str(&format!("  client {} ({}):{}\n", c.idx, c.id, c.history()));
            }
        }
        run.shutdown().await;
        r
    };
    let failure = match tokio::time::timeout(RUN_WITHIN, body).await {
        Ok(Ok(())) => None,
        Ok(Err(f)) => Some(f),
        Err(_) => Some(fail(
            "run-timeout",
            format!("the run took more than {RUN_WITHIN:?}"),
        )),
    };
    Outcome {
        cfg,
        at,
        failure,
        stats,
        took: started.elapsed(),
        trace,
    }
}

/// Runs one plan in its own task so a panic is reported with its seed.
async fn run_task(cfg: RunCfg) -> Outcome {
    let keep = cfg.clone();
    match tokio::spawn(run_once(cfg)).await {
        Ok(o) => o,
        Err(e) => Outcome {
            cfg: keep,
            at: 0,
            failure: Some(fail("panic", e.to_string())),
            stats: Stats::default(),
            took: Duration::ZERO,
            trace: String::new(),
        },
    }
}

/// An envelope written before a `reconnect`/`initialize` answer fails the
/// run, unless `S13_STRICT_CUT=0`: the client then keeps such an envelope
/// and requires that the answer covers it (numbered at or below its
/// channel's snapshot), as a client following the seed study §6.6 drops it
/// by `serverSeq`; they are counted (`pre_cut_envelopes`).
fn strict_cut() -> bool {
    std::env::var("S13_STRICT_CUT").map_or(true, |v| v != "0")
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

fn env_plan() -> Option<Vec<Step>> {
    let text = std::env::var("S13_PLAN").ok()?;
    Some(
        text.split_whitespace()
            .map(|s| parse_step(s).unwrap_or_else(|| panic!("S13_PLAN: bad step {s:?}")))
            .collect(),
    )
}

fn report(o: &Outcome, steps: usize, test: &str) -> String {
    let f = o.failure.as_ref().expect("a failure");
    let where_ = if o.at >= o.cfg.steps.len() {
        "at the end of the run".to_string()
    } else {
        format!("at step {} ({})", o.at, o.cfg.steps[o.at])
    };
    format!(
        "S13 run failed: seed {seed} {where_}: [{kind}] {detail}\n  config: {cfg}\n  plan: {plan}\n  reproduce: S13_SEED={seed} S13_STEPS={steps} cargo test --test relay_convergence {test} -- --nocapture\n",
        seed = o.cfg.seed,
        kind = f.kind,
        detail = f.detail,
        cfg = o.cfg,
        plan = plan_text(&o.cfg.steps),
    ) + &if std::env::var("S13_TRACE").is_ok_and(|v| v == "1") {
        format!("  recent history (oldest first):\n{}", o.trace)
    } else {
        String::new()
    }
}

/// Greedily removes steps while the run still fails with the same kind
/// (each candidate tried up to 3 times: timing varies between tries).
async fn shrink(cfg: RunCfg, kind: &str) -> RunCfg {
    let mut best = cfg;
    let mut i = 0;
    while i < best.steps.len() {
        let mut cand = best.clone();
        cand.steps.remove(i);
        let mut same = false;
        for _ in 0..3 {
            let o = run_task(cand.clone()).await;
            if o.failure.as_ref().is_some_and(|f| f.kind == kind) {
                same = true;
                break;
            }
        }
        if same {
            best = cand;
            println!(
                "S13 shrink: {} steps: {}",
                best.steps.len(),
                plan_text(&best.steps)
            );
        } else {
            i += 1;
        }
    }
    best
}

/// Runs the configured seeds and fails with every failing seed.
async fn campaign(test: &str, runs: u64, steps: usize, jobs: usize, base: u64) {
    let runs = env_u64("S13_RUNS").unwrap_or(runs);
    let steps = env_u64("S13_STEPS").map_or(steps, |s| s as usize);
    let jobs = env_u64("S13_JOBS").map_or(jobs, |j| j.max(1) as usize);
    let base = env_u64("S13_BASE").unwrap_or(base);
    let seeds: Vec<u64> = match env_u64("S13_SEED") {
        Some(s) => vec![s],
        None => (base..base + runs).collect(),
    };
    let custom = env_plan();
    let single = seeds.len() == 1;
    let started = Instant::now();
    let cfgs: Vec<RunCfg> = seeds
        .iter()
        .map(|s| {
            let mut cfg = plan(*s, steps);
            if let Some(p) = &custom {
                cfg.steps = p.clone();
            }
            cfg
        })
        .collect();
    let outcomes: Vec<Outcome> = futures_util::stream::iter(cfgs)
        .map(run_task)
        .buffer_unordered(jobs)
        .collect()
        .await;
    let mut total = Stats::default();
    let mut failures = Vec::new();
    let mut slowest = Duration::ZERO;
    for o in &outcomes {
        total.add(&o.stats);
        slowest = slowest.max(o.took);
        if o.failure.is_some() {
            failures.push(report(o, steps, test));
        }
    }
    println!(
        "S13 {test}: {} runs × {steps} steps in {:.1?} (slowest run {slowest:.1?}), {} failed\n{total:#?}",
        outcomes.len(),
        started.elapsed(),
        failures.len()
    );
    if single
        && std::env::var("S13_SHRINK").is_ok()
        && let Some(o) = outcomes.first()
        && let Some(f) = &o.failure
    {
        let min = shrink(o.cfg.clone(), &f.kind).await;
        println!(
            "S13 minimal plan for seed {} [{}]: S13_SEED={} S13_PLAN=\"{}\"",
            min.seed,
            f.kind,
            min.seed,
            plan_text(&min.steps)
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    if !single && outcomes.len() >= 100 {
        // Every fault kind of S13 really happened across the runs.
        let covered = [
            ("replay", total.replays),
            ("snapshot reconnect", total.snapshot_reconnects),
            ("rejection echo", total.echoed_rejected),
            ("taken unacknowledged", total.taken_unacknowledged),
            ("resync 4000", total.closes_4000),
            ("relay restart 1012", total.closes_1012),
            ("supersede 4009", total.closes_4009),
            ("host restart", total.host_restarts),
            ("forced resync", total.resync_drops),
            ("stall", total.stalls),
            ("client drop", total.client_drops),
        ];
        for (what, n) in covered {
            assert!(n > 0, "no {what} in {} runs: {total:#?}", outcomes.len());
        }
        // §12.2: every relay restart's `reconnect` was adopted.
        assert_eq!(total.not_found, 0, "NotFound after adoption: {total:#?}");
    }
}

/// S13 in CI: [`RUNS`] seeded runs of [`STEPS`] steps (see the module doc).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s13_randomized_convergence() {
    campaign("s13_randomized_convergence", RUNS, STEPS, JOBS, BASE).await;
}

/// S13, long: 2000 runs × 400 steps from seed 1 000 000.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long run (minutes): cargo test --release --test relay_convergence s13_long -- --ignored --nocapture"]
async fn s13_long() {
    campaign("s13_long", 2000, 400, JOBS, 1_000_000).await;
}

/// The plan is a pure function of the seed, and its text form reads back.
#[test]
fn plans_are_seeded_and_round_trip() {
    let a = plan(42, 300);
    let b = plan(42, 300);
    assert_eq!(a.steps, b.steps);
    assert_eq!(a.chats, b.chats);
    let text = plan_text(&a.steps);
    let back: Vec<Step> = text.split_whitespace().filter_map(parse_step).collect();
    assert_eq!(back, a.steps);
    assert_ne!(plan(43, 300).steps, a.steps);
}

/// Dials as `sub` and sends `initialize` for `client_id` with `chats` as
/// initial subscriptions; the socket and the answer (the first frame).
async fn init_raw(t: &TestRelay, sub: &str, client_id: &str, chats: &[&str]) -> (RawWs, Value) {
    let mut ws = dial(t, sub).await.expect("dial");
    let init = request_frame(1, "initialize", initialize_subscribing(client_id, chats));
    assert!(ws.try_send_json(&init).await);
    match ws.next_within(Duration::from_secs(5)).await {
        Some(Next::Frame(v)) if v["id"] == 1 => (ws, v),
        other => panic!("initialize: {:?}", other.is_some()),
    }
}

/// The `reconnect` request `id` of (`client_id`, `last_seen`) for `chats`.
fn reconnect_frame(id: u64, client_id: &str, last_seen: u64, chats: &[&str]) -> Value {
    request_frame(
        id,
        "reconnect",
        reconnect_params(client_id, last_seen, chats),
    )
}

/// §5.5 "The response is the cut: no live envelope for this client is
/// written before it", for a `reconnect` answered by snapshots while a
/// chat streams: 200 times a new socket supersedes the streaming one with
/// watermark 0 < S0 (so the relay re-baselines), and no envelope may reach
/// the new socket before its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_snapshot_answer_is_the_cut() {
    let t = TestRelay::start(vec![host("a", 1, script(1_000_000, 8, 5000))], "").await;
    let chat = "ahp-chat:/a~a-1-main";
    let (mut ws, _) = init_raw(&t, "alice", "cut", &[chat]).await;
    let turn = dispatch_frame(chat, 1, turn_started("long", "stream"));
    assert!(ws.try_send_json(&turn).await);
    let mut before_answer = Vec::new();
    let mut attempts = 0;
    while attempts < 200 && before_answer.is_empty() {
        attempts += 1;
        // Let a few envelopes flow on the current socket.
        let mut deltas = 0;
        while deltas < 3 {
            match ws.next_within(Duration::from_secs(5)).await {
                Some(Next::Frame(v)) if v["method"] == "action" => deltas += 1,
                Some(Next::Frame(_)) => {}
                other => panic!("the stream stopped: {:?}", other.is_some()),
            }
        }
        // A new socket supersedes this one; watermark 0 < S0 forces snapshots.
        let mut next = dial(&t, "alice").await.expect("dial");
        assert!(
            next.try_send_json(&reconnect_frame(2, "cut", 0, &[chat]))
                .await
        );
        loop {
            match next.next_within(Duration::from_secs(8)).await {
                Some(Next::Frame(v)) if v["id"] == 2 => {
                    assert_eq!(v["result"]["type"], "snapshot", "{v}");
                    break;
                }
                Some(Next::Frame(v)) if v["method"] == "action" => before_answer.push(v),
                Some(Next::Frame(_)) => {}
                other => panic!("no reconnect answer: {:?}", other.is_some()),
            }
        }
        ws = next;
    }
    assert!(
        before_answer.is_empty(),
        "after {attempts} snapshot reconnects, envelopes were written before the answer: {before_answer:?}"
    );
}

/// §3.7 close codes reach the client: a socket superseded (4009) while
/// large frames are still queued for it (the client reads late), and that
/// writes once more meanwhile, reads every queued frame and then the 4009
/// close frame, never a TCP reset or an EOF without close frame.
///
/// Deterministic by construction: each round streams its turn on a chat of
/// its own (a chat that earlier rounds filled would make the next round's
/// `initialize` snapshot depend on how far their turns got), and the
/// reconnect is sent only once the relay has counted the turn's envelopes
/// as pushed to the old socket — the frames in flight are observed, not
/// hoped for after a sleep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_code_survives_frames_in_flight() {
    const ROUNDS: usize = 3;
    let t = TestRelay::start(vec![host("a", ROUNDS, script(1000, 3000, 0))], "").await;
    let mut lost = Vec::new();
    for round in 0..ROUNDS {
        let (chat, _) = seeded_chat("a", round + 1);
        // One principal per round: retained sessions count against a cap.
        let (sub, id) = (format!("busy{round}"), "busy");
        let (mut old, init) = init_raw(&t, &sub, id, &[chat.as_str()]).await;
        assert!(init["result"]["serverSeq"].is_u64(), "initialize: {init}");
        let relayed = &t.relay.relay.metrics.envelopes_relayed;
        let before = relayed.get();
        let turn = dispatch_frame(&chat, 1, turn_started(&format!("big-{round}"), "go"));
        assert!(old.try_send_json(&turn).await);
        // The client does not read: once the relay has pushed the whole
        // turn (~3 MB, within the client queue's bounds) towards this
        // socket, every frame of it is in flight — in the relay's queue or
        // the sockets' buffers — and none was read.
        let pushed = || relayed.get() >= before + 1000;
        wait_until("the turn pushed towards the unread socket", pushed).await;
        let mut next = dial(&t, &sub).await.expect("dial");
        assert!(
            next.try_send_json(&reconnect_frame(2, id, 0, &[chat.as_str()]))
                .await
        );
        // One more frame from the old socket while the relay closes it
        // (it may be read before or after the supersede: either way the
        // close code must survive).
        let _ = old.try_send_json(&ping_frame(3)).await;
        let mut frames = 0;
        let close = loop {
            match old.next_within(Duration::from_secs(5)).await {
                Some(Next::Frame(_)) => frames += 1,
                Some(Next::Closed(c)) => break c,
                None => panic!("round {round}: the superseded socket stayed open"),
            }
        };
        assert!(
            frames >= 1000,
            "round {round}: {frames} queued frames delivered"
        );
        if !matches!(close, Some((4009, _))) {
            lost.push(format!("round {round}: {frames} frames, then {close:?}"));
        }
    }
    assert!(lost.is_empty(), "close codes lost: {lost:?}");
}

/// Two `reconnect`s of one client overlap (§5.5, §5.6): the first, answered
/// by snapshots, waits for a stalled host; the client gives up on that
/// socket and reconnects on a third one. Only the socket that asked may get
/// an answer, and after the last answer every channel must still be live:
/// a turn started on the healthy host's chat is echoed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_reconnects_keep_every_channel() {
    let t = TestRelay::start(vec![host_cfg("a", 1), host_cfg("b", 2)], "").await;
    let (chat_a, chat_b) = ("ahp-chat:/a~a-1-main", "ahp-chat:/b~b-1-main");
    let chats = [chat_a, chat_b];
    let (_s1, init) = init_raw(&t, "alice", "overlap", &chats).await;
    assert_eq!(
        init["result"]["snapshots"].as_array().map(Vec::len),
        Some(2),
        "initialize: {init}"
    );
    // Host b stalls: a reconnect needing snapshots waits for it.
    t.hosts[1].set_stalled(true);
    let before = t.requests_handled("reconnect");
    let mut s2 = dial(&t, "alice").await.expect("dial");
    assert!(
        s2.try_send_json(&reconnect_frame(2, "overlap", 0, &chats))
            .await
    );
    wait_until("the relay handles s2's reconnect", || {
        t.requests_handled("reconnect") > before
    })
    .await;
    // The client gives up on s2 and tries again on s3.
    drop(s2);
    let mut s3 = dial(&t, "alice").await.expect("dial");
    assert!(
        s3.try_send_json(&reconnect_frame(3, "overlap", 0, &chats))
            .await
    );
    wait_until("the relay handles s3's reconnect", || {
        t.requests_handled("reconnect") > before + 1
    })
    .await;
    t.hosts[1].set_stalled(false);
    // s3 gets its own answer and nothing else.
    let mut strays = Vec::new();
    let answer = loop {
        match s3.next_within(Duration::from_secs(8)).await {
            Some(Next::Frame(v)) if v["id"] == 3 => break v,
            Some(Next::Frame(v)) if v.get("id").is_some() => strays.push(v),
            Some(Next::Frame(_)) => {}
            other => panic!("no answer on s3: {:?}", other.is_some()),
        }
    };
    assert_eq!(answer["result"]["type"], "snapshot", "{answer}");
    // A turn on a's chat is echoed to s3.
    let turn = dispatch_frame(chat_a, 1, turn_started("after-overlap", "go"));
    assert!(s3.try_send_json(&turn).await);
    let mut echoed = false;
    while let Some(Next::Frame(v)) = s3.next_within(Duration::from_secs(2)).await {
        if v.get("id").is_some() && v.get("method").is_none() {
            strays.push(v.clone());
        }
        if v["params"]["origin"]["clientSeq"] == 1 && v["params"]["channel"] == chat_a {
            echoed = true;
            break;
        }
    }
    let mut wrong = Vec::new();
    if !strays.is_empty() {
        wrong.push(format!(
            "answers to another socket's request reached s3: {strays:?}"
        ));
    }
    if !echoed {
        wrong.push("a's chat went silent after the overlapping reconnects".to_string());
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// §5.5 the answer is the cut, also for the relay's own rejection echoes
/// (§5.3: they are numbered and buffered like any envelope): a dispatch
/// queued on a link that is resuming after a drop (§5.8) when the client
/// reconnects on a new socket gets its "host unavailable" echo when that
/// old link gives up, and that echo must come after the `reconnect`
/// answer, not while the answer waits for a slow host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_answer_is_the_cut_for_relay_rejections() {
    let t = TestRelay::start(vec![host_cfg("a", 1), host_cfg("b", 2)], "").await;
    let (chat_a, chat_b) = ("ahp-chat:/a~a-1-main", "ahp-chat:/b~b-1-main");
    let chats = [chat_a, chat_b];
    let (mut s1, init) = init_raw(&t, "alice", "cut-reject", &chats).await;
    assert_eq!(
        init["result"]["snapshots"].as_array().map(Vec::len),
        Some(2),
        "initialize: {init}"
    );
    // Host b will be slow to answer the re-baselining; host a drops the
    // client's link, which starts resuming, and a dispatch queues on it.
    t.hosts[1].set_stalled(true);
    let upstream = t.upstream_id("alice", "cut-reject");
    assert_eq!(t.hosts[0].drop_client(&upstream), 1);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let turn = dispatch_frame(chat_a, 1, turn_started("queued-on-a-dropped-link", "go"));
    assert!(s1.try_send_json(&turn).await);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let before = t.requests_handled("reconnect");
    let mut s2 = dial(&t, "alice").await.expect("dial");
    assert!(
        s2.try_send_json(&reconnect_frame(2, "cut-reject", 0, &chats))
            .await
    );
    wait_until("the relay handles s2's reconnect", || {
        t.requests_handled("reconnect") > before
    })
    .await;
    // The answer waits for stalled b while a's link resumes and gives up
    // (the window the cut must hold in; its length bounds what is caught).
    tokio::time::sleep(Duration::from_millis(600)).await;
    t.hosts[1].set_stalled(false);
    let mut before = Vec::new();
    loop {
        match s2.next_within(Duration::from_secs(8)).await {
            Some(Next::Frame(v)) if v["id"] == 2 => break,
            Some(Next::Frame(v)) if v["method"] == "action" => before.push(v),
            Some(Next::Frame(_)) => {}
            other => panic!("no reconnect answer: {:?}", other.is_some()),
        }
    }
    assert!(
        before.is_empty(),
        "envelopes written before the reconnect answer: {before:?}"
    );
}

/// §5.5: a snapshot `reconnect` whose socket the relay closes before the
/// answer (here a resync, 4000) adopts and baselines nothing: the client
/// never received those snapshots, so its next `reconnect` with the same
/// watermark gets snapshots, not a replay on top of state it never had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_closed_before_its_answer_baselines_nothing() {
    let t = TestRelay::start(vec![host_cfg("a", 1), host_cfg("b", 2)], "").await;
    let chats = ["ahp-chat:/a~a-1-main", "ahp-chat:/b~b-1-main"];
    let (mut s1, init) = init_raw(&t, "alice", "closed-early", &chats).await;
    let s0 = init["result"]["serverSeq"].as_u64().expect("S0");
    // A reconnect needing snapshots waits for stalled host b ...
    t.hosts[1].set_stalled(true);
    let mut s2 = dial(&t, "alice").await.expect("dial");
    assert!(
        s2.try_send_json(&reconnect_frame(2, "closed-early", 0, &chats))
            .await
    );
    // s2's reconnect has taken the session over once s1 is superseded
    // (4009): only then may the relay's close hit s2 (counting the request
    // is not enough — it is counted before it is handled).
    let superseded = loop {
        match s1.next_within(common::WAIT).await {
            Some(Next::Frame(_)) => {}
            Some(Next::Closed(c)) => break c,
            None => panic!("s1 was never superseded"),
        }
    };
    assert!(matches!(superseded, Some((4009, _))), "{superseded:?}");
    // ... while the relay closes its socket (a resync).
    t.session("alice", "closed-early")
        .close(ahp_relay::rpc::Close::ResyncHostLost);
    t.hosts[1].set_stalled(false);
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(s2);
    // The client never saw s2's snapshots: its watermark is still S0.
    let mut s3 = dial(&t, "alice").await.expect("dial");
    assert!(
        s3.try_send_json(&reconnect_frame(3, "closed-early", s0, &chats))
            .await
    );
    let answer = loop {
        match s3.next_within(Duration::from_secs(8)).await {
            Some(Next::Frame(v)) if v["id"] == 3 => break v,
            Some(Next::Frame(_)) => {}
            other => panic!("no answer on s3: {:?}", other.is_some()),
        }
    };
    assert_eq!(
        answer["result"]["type"], "snapshot",
        "snapshots the client never received must not count as its baseline: {answer}"
    );
}

/// The relay counts what it relays exactly: once a client has every
/// envelope of a paced turn (each delta its own batch), the relay's
/// `envelopes_relayed_total` equals what the client received — no batch
/// left uncounted, none counted twice — and the host-frame latency
/// histogram has an observation for each of the turn's host frames.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relayed_frame_metrics_are_exact_once_the_relay_is_idle() {
    let t = TestRelay::start(vec![host("a", 1, script(20, 40, 200))], "").await;
    let (chat, _) = seeded_chat("a", 1);
    let (mut ws, init) = init_raw(&t, "metered", "metered", &[chat.as_str()]).await;
    assert!(init["result"]["serverSeq"].is_u64(), "initialize: {init}");
    let turn = dispatch_frame(&chat, 1, turn_started("metered-turn", "go"));
    assert!(ws.try_send_json(&turn).await);
    let mut actions = 0u64;
    let mut deltas = 0u64;
    // Quiet for a second after the turn's deltas: everything has arrived.
    while let Some(next) = ws.next_within(Duration::from_secs(1)).await {
        let Next::Frame(v) = next else {
            panic!("the socket closed");
        };
        if v["method"] == "action" {
            actions += 1;
            let ty = v["params"]["action"]["type"].as_str().unwrap_or("");
            deltas += u64::from(ty.contains("delta"));
        }
    }
    assert!(deltas >= 20, "{deltas} deltas of 20 ({actions} envelopes)");
    let relayed = &t.relay.relay.metrics.envelopes_relayed;
    let exact = || relayed.get() == actions;
    wait_until("envelopes_relayed_total to equal what was received", exact).await;
    let latency = t.relay.relay.metrics.host_latency.with_label_values(&["a"]);
    assert!(
        latency.get_sample_count() >= 20,
        "{}",
        latency.get_sample_count()
    );
}

//! Soak (issue 12 deliverable 10): hundreds of clients over several hosts
//! through one relay process for about ten minutes, with random work, client
//! drops and `reconnect`s, host restarts and bad frames; the relay's memory
//! is sampled throughout and must stay bounded, and the S13 checker
//! (`tests/s13`) must find no divergence at the end.
//!
//! # World
//!
//! * **Relay**: `ahp-relay serve` as a child process (the binary cargo
//!   builds for this test), so its RSS is read from `/proc/<pid>/status`
//!   alone; its `ahp_relay_*` gauges come from `/metrics` on its admin
//!   listener. Dev TLS, the open dev policy, default `[limits]` but
//!   `replay_buffer_envelopes = 512` (`SOAK_REPLAY_BUFFER`): each client
//!   receives ~15 envelopes a second, so its buffer reaches its steady size
//!   within the warm-up; with the default 4096 the 300 buffers would keep
//!   growing for ~4 minutes towards ~360 MB, past the default 256 MiB
//!   `replay_memory_bytes`, and the run would measure that filling, not
//!   leaks.
//! * **Hosts**: `SOAK_HOSTS` simhosts `h0…` in this process, each with
//!   `SOAK_SESSIONS` seeded chats (agents with tool calls needing
//!   confirmation). A host restart stops the host (every connection
//!   closed, listener gone), waits 0.5–3 s and starts a fresh host with the
//!   same config on the same port (seeded state again, `serverSeq` from 0).
//! * **Clients**: `SOAK_CLIENTS` S13 clients (raw TLS WebSockets checking
//!   every frame, `tests/s13`), ten per principal (the per-principal caps
//!   stay out of the way), each following two chats on two hosts and, one
//!   in four, `ahp-root://`. Each runs its own task: a step every 0.3–3 s
//!   (turns, cancels, confirmations, queued messages; drops its socket
//!   without a close frame; re-initializes; subscribes again what it lost)
//!   and reads everything in between. A dropped client comes back after
//!   up to 2 s with `reconnect` (or `initialize` on -32008). They arrive
//!   over the first 15 s.
//! * **Bad frames**: every `SOAK_BAD_MS` a separate principal opens a
//!   socket and sends one of: text that is not JSON (-32700 and the socket
//!   still answers `ping`), a binary frame (close 1003), a frame over
//!   `max_frame_bytes` (close 1009), invalid UTF-8 (close 1007). Any other
//!   answer fails the soak; the clients' own checks show that nobody else
//!   noticed.
//!
//! # Checked
//!
//! * Every client frame, as S13 does (see `tests/s13/mod.rs`), and in
//!   addition `serverSeq` contiguous on each connection (exactly one above
//!   the previous envelope, the reconnect watermark or the snapshot's
//!   `fromSeq`): no action lost or duplicated across reconnects.
//! * Memory: after `SOAK_WARMUP_SECS` (default a tenth of the run, at least
//!   30 s) the relay's RSS is the baseline; the RSS at the end of the load
//!   must be ≤ 1.5 × the baseline and the peak below `SOAK_BUDGET_MIB`
//!   (default 512 MiB).
//! * At the end, the S13 finish: load stops, every client reconnects, every
//!   chat is brought to rest through the relay (pending tool calls
//!   approved, queued messages removed), everyone reconnects once more and
//!   reads behind a `ping`; each client's reduced chat state must equal the
//!   host's (with the client's URI), its root state a fresh subscriber's,
//!   and every dispatch was echoed at most once.
//!
//! # Running
//!
//! `cargo test --release --test soak -- --ignored --nocapture` (about 11
//! minutes). `SOAK_SECS` (600), `SOAK_CLIENTS` (300), `SOAK_HOSTS` (4),
//! `SOAK_SESSIONS` (16), `SOAK_SEED` (1), `SOAK_SAMPLE_SECS` (5),
//! `SOAK_WARMUP_SECS`, `SOAK_BUDGET_MIB` (512), `SOAK_HOST_RESTART_SECS`
//! (30, mean gap between host restarts), `SOAK_BAD_MS` (1000), `SOAK_REPLAY_BUFFER` (512) override.
//! Linux only (`/proc`).

mod common;
mod s13;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ahp_relay::devkit::DevKit;
use ahp_relay::simhost::{AgentScript, SimHost, SimHostConfig};
use ahp_relay::upstream::dial::DialOptions;
use common::relay::scratch_dir;
use common::{Next, ROOT, RawWs, initialize_subscribing, request_frame};
use s13::{
    Act, Answer, Chan, Client, Fail, How, QUIET, R, Rng, St, Stats, all_in, fail, rest_round,
};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Everything a run is made of, from the environment.
#[derive(Clone, Debug)]
struct Settings {
    secs: u64,
    clients: usize,
    hosts: usize,
    sessions: usize,
    seed: u64,
    sample_secs: u64,
    warmup_secs: u64,
    budget_mib: u64,
    restart_secs: u64,
    bad_ms: u64,
    replay_buffer: u64,
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

impl Settings {
    fn from_env() -> Self {
        let secs = env_u64("SOAK_SECS", 600).max(10);
        Self {
            secs,
            clients: env_u64("SOAK_CLIENTS", 300).max(1) as usize,
            hosts: env_u64("SOAK_HOSTS", 4).clamp(2, 26) as usize,
            sessions: env_u64("SOAK_SESSIONS", 16).max(1) as usize,
            seed: env_u64("SOAK_SEED", 1),
            sample_secs: env_u64("SOAK_SAMPLE_SECS", 5).max(1),
            warmup_secs: env_u64("SOAK_WARMUP_SECS", (secs / 10).max(30)).min(secs / 2),
            budget_mib: env_u64("SOAK_BUDGET_MIB", 512),
            restart_secs: env_u64("SOAK_HOST_RESTART_SECS", 30).max(2),
            bad_ms: env_u64("SOAK_BAD_MS", 1000).max(50),
            replay_buffer: env_u64("SOAK_REPLAY_BUFFER", 512).max(1),
        }
    }
}

// ─── the relay as a child process ───────────────────────────────────────────

/// `ahp-relay serve` in a child process with its dev kit in a scratch dir.
struct RelayChild {
    child: Child,
    pid: u32,
    admin_port: u16,
    url: String,
    kit: DevKit,
}

impl RelayChild {
    /// Starts the relay in front of `hosts` (`(id, ws url)`) and waits until
    /// it listens and every watch link is up.
    async fn start(hosts: &[(String, String)], replay_buffer: u64) -> Self {
        let kit = DevKit::create(&scratch_dir("soak")).expect("dev kit");
        let extra = format!("\n[limits]\nreplay_buffer_envelopes = {replay_buffer}\n");
        kit.config("127.0.0.1:0", hosts, "", &extra)
            .expect("config validates");
        let config = kit.dir.join("relay.toml");
        // A known admin port: `serve` does not print the admin address.
        let admin_port = common::reserved_port();
        let text = std::fs::read_to_string(&config).expect("config").replace(
            "admin_addr = \"127.0.0.1:0\"",
            &format!("admin_addr = \"127.0.0.1:{admin_port}\""),
        );
        std::fs::write(&config, text).expect("config written");
        let mut child = Command::new(env!("CARGO_BIN_EXE_ahp-relay"))
            .args(["serve", "--config"])
            .arg(&config)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("relay binary starts");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(u) = line.strip_prefix("ahp-relay listening on ") {
                    let _ = tx.send(u.trim().replace("127.0.0.1", "localhost"));
                } else if line.contains("ERROR") || line.contains("panicked") {
                    eprintln!("relay: {line}");
                }
            }
        });
        let url = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the relay says where it listens");
        let me = Self {
            pid: child.id(),
            child,
            admin_port,
            url,
            kit,
        };
        me.wait_hosts_up(hosts.len()).await;
        me
    }

    async fn metrics(&self) -> String {
        let Ok(mut tcp) = TcpStream::connect(("127.0.0.1", self.admin_port)).await else {
            return String::new();
        };
        let req = "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
        if tcp.write_all(req.as_bytes()).await.is_err() {
            return String::new();
        }
        let mut page = String::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_string(&mut page)).await;
        page
    }

    async fn wait_hosts_up(&self, hosts: usize) {
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            let page = self.metrics().await;
            let up = page
                .lines()
                .filter(|l| l.starts_with("ahp_relay_host_up{") && l.ends_with(" 1"))
                .count();
            if up >= hosts {
                return;
            }
            assert!(Instant::now() < end, "only {up} of {hosts} hosts up");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `VmRSS` in bytes.
    fn rss(&self) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.pid))
            .ok()
            .and_then(|s| {
                let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
                Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
            })
            .unwrap_or(0)
    }

    fn dial_options(&self, sub: &str) -> DialOptions {
        DialOptions {
            url: self.url.clone(),
            token: Some(
                self.kit
                    .token(sub, &[], Duration::from_secs(3600), None)
                    .expect("token"),
            ),
            ca_file: Some(self.kit.cert.clone()),
            insecure: false,
            connect_timeout: Duration::from_secs(10),
            extra_headers: Vec::new(),
        }
    }
}

impl Drop for RelayChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.kit.dir);
    }
}

/// The value of an unlabelled metric line `name value`.
fn metric(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The sum of a metric over its labels (`name{…} value` lines).
fn metric_sum(page: &str, name: &str) -> f64 {
    page.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

// ─── hosts that restart on their port ───────────────────────────────────────

/// One host: its config, its port, and the running instance (none while
/// it is stopped).
struct Slot {
    cfg: SimHostConfig,
    addr: SocketAddr,
    host: Mutex<Option<SimHost>>,
}

fn host_cfg(name: &str, sessions: usize, seed: u64) -> SimHostConfig {
    SimHostConfig {
        sessions,
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

fn host_name(h: usize) -> String {
    format!("h{h}")
}

impl Slot {
    async fn start(cfg: SimHostConfig) -> Self {
        // A reserved port: the host is restarted on it while the relay's
        // own sockets come and go.
        let addr = SocketAddr::from(([127, 0, 0, 1], common::reserved_port()));
        let host = SimHost::start(cfg.clone(), addr).await.expect("simhost");
        Self {
            cfg,
            addr: host.addr(),
            host: Mutex::new(Some(host)),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&SimHost) -> T) -> Option<T> {
        self.host
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(f)
    }

    /// Stops the host, waits `down`, starts a fresh one on the same port.
    async fn restart(&self, down: Duration) {
        let old = self.host.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(old) = old {
            old.shutdown().await;
        }
        tokio::time::sleep(down).await;
        let end = Instant::now() + Duration::from_secs(10);
        let host = loop {
            match SimHost::start(self.cfg.clone(), self.addr).await {
                Ok(h) => break h,
                Err(e) if Instant::now() < end => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!(
                    "host {} cannot bind {} again: {e}",
                    self.cfg.name, self.addr
                ),
            }
        };
        *self.host.lock().unwrap_or_else(|e| e.into_inner()) = Some(host);
    }
}

async fn host_restarts(slots: Arc<Vec<Slot>>, s: Settings, until: Instant) -> u64 {
    let mut rng = Rng::new(s.seed ^ 0x4057);
    let mut n = 0;
    loop {
        let gap = rng.millis(s.restart_secs * 500, s.restart_secs * 1500);
        if Instant::now() + gap + Duration::from_secs(3) >= until {
            return n;
        }
        tokio::time::sleep(gap).await;
        let h = rng.below(slots.len());
        let down = rng.millis(500, 3000);
        slots[h].restart(down).await;
        n += 1;
        println!("soak: host {} restarted (down {down:?})", host_name(h));
    }
}

// ─── bad frames ─────────────────────────────────────────────────────────────

/// Bad frames sent, by kind: not JSON, binary, oversized, invalid UTF-8.
#[derive(Default, Debug, Clone, Copy)]
struct BadFrames {
    not_json: u64,
    binary: u64,
    oversized: u64,
    invalid_utf8: u64,
}

impl BadFrames {
    fn total(&self) -> u64 {
        self.not_json + self.binary + self.oversized + self.invalid_utf8
    }
}

/// The answer after a bad frame: the next frame or close within 10 s.
async fn answer(ws: &mut RawWs) -> Option<Next> {
    ws.next_within(Duration::from_secs(10)).await
}

fn close_code(n: &Option<Next>) -> Option<u16> {
    match n {
        Some(Next::Closed(Some((c, _)))) => Some(*c),
        _ => None,
    }
}

/// One bad frame of kind `k` on its own socket; its defined answer or a failure.
async fn one_bad_frame(relay: &RelayChild, k: usize, bad: &mut BadFrames) -> R<()> {
    let mut ws = s13::dial(&relay.dial_options("soak-mallory")).await?;
    match k % 4 {
        0 => {
            let raw = &mut ws;
            raw.send_text("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":")
                .await;
            let got = answer(raw).await;
            let ok = matches!(&got, Some(Next::Frame(v))
                if v["error"]["code"] == -32700 && v["id"].is_null());
            if !ok {
                return Err(fail("bad-not-json", format!("{got:?}")));
            }
            let ping = request_frame(2, "ping", json!({"channel": ROOT}));
            let alive = raw.try_send_json(&ping).await
                && matches!(answer(raw).await, Some(Next::Frame(v)) if v["id"] == 2);
            if !alive {
                return Err(fail("bad-not-json", "the socket stopped answering"));
            }
            bad.not_json += 1;
        }
        1 => {
            ws.send_binary(vec![0, 1, 2, 3]).await;
            let got = answer(&mut ws).await;
            if close_code(&got) != Some(1003) {
                return Err(fail("bad-binary", format!("{got:?}")));
            }
            bad.binary += 1;
        }
        2 => {
            // One byte over the default `max_frame_bytes` (4 MiB).
            let pad = "x".repeat(4 * 1024 * 1024);
            let frame = request_frame(3, "ping", json!({"channel": ROOT, "pad": pad}));
            let _ = ws.try_send_json(&frame).await;
            let got = answer(&mut ws).await;
            if close_code(&got) != Some(1009) {
                return Err(fail("bad-oversized", format!("{:?}", close_code(&got))));
            }
            bad.oversized += 1;
        }
        _ => {
            ws.send_text_bytes(vec![b'{', 0xff, 0xfe, b'}']).await;
            let got = answer(&mut ws).await;
            if close_code(&got) != Some(1007) {
                return Err(fail("bad-invalid-utf8", format!("{got:?}")));
            }
            bad.invalid_utf8 += 1;
        }
    }
    Ok(())
}

async fn bad_frames(relay: Arc<RelayChild>, s: Settings, until: Instant) -> R<BadFrames> {
    let mut bad = BadFrames::default();
    let mut k = 0;
    while Instant::now() < until {
        one_bad_frame(&relay, k, &mut bad).await?;
        k += 1;
        tokio::time::sleep(Duration::from_millis(s.bad_ms)).await;
    }
    Ok(bad)
}

// ─── memory ─────────────────────────────────────────────────────────────────

#[derive(Clone, Copy, Debug)]
struct Sample {
    at: Duration,
    rss: u64,
    buffer_bytes: f64,
    connections: f64,
}

async fn sample(relay: &RelayChild, start: Instant) -> Sample {
    let page = relay.metrics().await;
    Sample {
        at: start.elapsed(),
        rss: relay.rss(),
        buffer_bytes: metric(&page, "ahp_relay_buffer_bytes").unwrap_or(-1.0),
        connections: metric(&page, "ahp_relay_connections_open").unwrap_or(-1.0),
    }
}

async fn sampler(relay: Arc<RelayChild>, s: Settings, until: Instant) -> Vec<Sample> {
    let start = Instant::now();
    let mut out = Vec::new();
    while Instant::now() < until {
        let x = sample(&relay, start).await;
        println!(
            "soak: t={:>4}s rss={:.1} MiB buffers={:.1} MiB connections={}",
            x.at.as_secs(),
            mib(x.rss as f64),
            mib(x.buffer_bytes),
            x.connections
        );
        out.push(x);
        tokio::time::sleep(Duration::from_secs(s.sample_secs)).await;
    }
    out.push(sample(&relay, start).await);
    out
}

fn mib(b: f64) -> f64 {
    b / (1024.0 * 1024.0)
}

// ─── clients ────────────────────────────────────────────────────────────────

/// Per principal: ten clients.
fn principal(i: usize) -> String {
    format!("soak-u{:03}", i / 10)
}

fn new_client(i: usize, s: &Settings, rng: &mut Rng) -> Client {
    let sub: &'static str = Box::leak(principal(i).into_boxed_str());
    let mut chans = Vec::new();
    if rng.below(4) == 0 {
        chans.push(Chan {
            uri: ROOT.into(),
            host: None,
            state: None,
            applied: 0,
        });
    }
    let first = rng.below(s.hosts);
    let second = (first + 1 + rng.below(s.hosts - 1)) % s.hosts;
    for h in [first, second] {
        let host = host_name(h);
        let n = 1 + rng.below(s.sessions);
        chans.push(Chan {
            uri: format!("ahp-chat:/{host}~{host}-{n}-main"),
            host: Some((h, format!("ahp-chat:/{host}-{n}-main"))),
            state: None,
            applied: 0,
        });
    }
    Client {
        idx: i,
        sub,
        id: format!("soak-{i}"),
        // The relay's keyed upstream ids are not known outside its process.
        upstream: String::new(),
        chans,
        ws: None,
        conn: 0,
        conn_last: None,
        watermark: None,
        next_seq: 1,
        next_req: 0,
        sent: Default::default(),
        fresh: 0,
        strict_cut: true,
        pre_cut: Vec::new(),
        trace: Default::default(),
        contiguous: true,
        hosts_may_be_down: true,
    }
}

/// Counters the client tasks share.
#[derive(Default)]
struct Shared {
    reconnects: AtomicU64,
    reinits: AtomicU64,
}

/// One client's life until `until`: a random step, then reading for a
/// random while; a dropped client comes back after up to 2 s.
async fn client_life(
    c: &mut Client,
    opts: &DialOptions,
    mut rng: Rng,
    seed: u64,
    until: Instant,
    shared: &Shared,
    st: &mut Stats,
) -> R<()> {
    while Instant::now() < until {
        if c.ws.is_none() {
            tokio::time::sleep(rng.millis(0, 2000)).await;
            let how = if c.watermark.is_some() {
                How::Resume
            } else {
                How::Fresh
            };
            c.connect(opts, how, st).await?;
            c.resubscribe(st).await?;
            shared.reconnects.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        // A chat (root, when followed, is first).
        let first_chat = c.chans.len() - 2;
        let ci = first_chat + rng.below(2);
        match rng.below(100) {
            0..=19 => c.act(Act::Turn, ci, seed, st).await?,
            20..=26 => c.act(Act::Cancel, ci, seed, st).await?,
            27..=39 => c.act(Act::Confirm(rng.below(4) != 0), ci, seed, st).await?,
            40..=45 => c.act(Act::Queue, ci, seed, st).await?,
            46..=49 => {
                if c.ws.take().is_some() {
                    c.conn_last = None;
                    st.client_drops += 1;
                }
                continue;
            }
            50 => {
                c.ws = None;
                c.connect(opts, How::Fresh, st).await?;
                c.resubscribe(st).await?;
                shared.reinits.fetch_add(1, Ordering::Relaxed);
            }
            51..=59 => c.resubscribe(st).await?,
            _ => {}
        }
        read_for(c, rng.millis(300, 3000), st).await?;
    }
    Ok(())
}

/// Reads everything that arrives for `d`.
async fn read_for(c: &mut Client, d: Duration, st: &mut Stats) -> R<()> {
    let end = Instant::now() + d;
    while c.ws.is_some() {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        c.drain(left, left, st).await?;
    }
    tokio::time::sleep(end.saturating_duration_since(Instant::now())).await;
    Ok(())
}

// ─── the end: rest, reconnect, compare ──────────────────────────────────────

struct World {
    relay: Arc<RelayChild>,
    slots: Arc<Vec<Slot>>,
    clients: Vec<Client>,
    st: Stats,
    s: Settings,
}

impl World {
    async fn connect(&mut self, c: usize, how: How) -> R<()> {
        let opts = self.relay.dial_options(self.clients[c].sub);
        self.clients[c].connect(&opts, how, &mut self.st).await?;
        self.clients[c].resubscribe(&mut self.st).await
    }

    /// Every host chat as (host, host URI, state).
    fn host_chats(&self) -> Vec<(usize, String, Value)> {
        let mut out = Vec::new();
        for (h, slot) in self.slots.iter().enumerate() {
            for n in 1..=self.s.sessions {
                let uri = format!("ahp-chat:/{}-{n}-main", host_name(h));
                let state = slot
                    .with(|x| x.channel_state(&uri))
                    .flatten()
                    .unwrap_or(Value::Null);
                out.push((h, uri, state));
            }
        }
        out
    }

    fn host_seqs(&self) -> Vec<u64> {
        self.slots
            .iter()
            .map(|s| s.with(SimHost::server_seq).unwrap_or(0))
            .collect()
    }

    /// Everyone connected with every channel's state, every chat at rest,
    /// the hosts' numbering still (as S13's `quiesce`).
    async fn quiesce(&mut self) -> R<()> {
        let end = Instant::now() + Duration::from_secs(120);
        let mut last = Vec::new();
        loop {
            if Instant::now() >= end {
                return Err(fail("no-quiescence", "no rest within 120 s"));
            }
            for c in 0..self.clients.len() {
                if self.clients[c].ws.is_none() {
                    self.connect(c, How::Resume).await?;
                } else {
                    self.clients[c].resubscribe(&mut self.st).await?;
                }
                self.clients[c]
                    .drain(QUIET, Duration::from_millis(500), &mut self.st)
                    .await?;
            }
            let chats = self.host_chats();
            let busy = rest_round(&mut self.clients, chats, &mut self.st).await?;
            let seqs = self.host_seqs();
            let all_in = all_in(&self.clients);
            if !busy && all_in && seqs == last {
                return Ok(());
            }
            last = seqs;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn finish(&mut self) -> R<()> {
        self.quiesce().await?;
        for c in 0..self.clients.len() {
            self.clients[c].ws = None;
            self.connect(c, How::Resume).await?;
        }
        self.quiesce().await?;
        for c in self.clients.iter_mut() {
            match c
                .request("ping", json!({"channel": ROOT}), false, &mut self.st)
                .await?
            {
                Answer::Result(_) => {}
                other => {
                    let what = match other {
                        Answer::Error(code, _) => format!("error {code}"),
                        _ => "closed".into(),
                    };
                    return Err(fail("ping-at-rest", format!("client {}: {what}", c.idx)));
                }
            }
        }
        self.verify().await
    }

    async fn verify(&mut self) -> R<()> {
        let root = self.fresh_root().await?;
        for c in &self.clients {
            c.verify_states(&root, |h, uri| {
                self.slots[h].with(|x| x.channel_state(uri)).flatten()
            })?;
            c.tally_echoes(&mut self.st)?;
        }
        Ok(())
    }

    /// The root state a fresh subscriber gets now.
    async fn fresh_root(&self) -> R<Value> {
        let mut ws = s13::dial(&self.relay.dial_options(&principal(0))).await?;
        let init = request_frame(
            1,
            "initialize",
            initialize_subscribing("soak-probe", &[ROOT]),
        );
        if !ws.try_send_json(&init).await {
            return Err(fail("probe", "cannot send"));
        }
        loop {
            match ws.next_within(s13::REQUEST_WITHIN).await {
                Some(Next::Frame(v)) if v["id"] == 1 => {
                    let snap = v["result"]["snapshots"]
                        .as_array()
                        .and_then(|s| s.first())
                        .cloned()
                        .ok_or_else(|| fail("probe", v.to_string()))?;
                    return Ok(St::parse(ROOT, &snap["state"])?.json());
                }
                Some(Next::Frame(_)) => {}
                other => return Err(fail("probe", format!("no answer: {}", other.is_some()))),
            }
        }
    }
}

// ─── the soak ───────────────────────────────────────────────────────────────

/// What the load phase returned per client.
type Life = (Client, Stats, Option<Fail>);

async fn load(
    relay: &Arc<RelayChild>,
    s: &Settings,
    until: Instant,
    shared: &Arc<Shared>,
) -> Vec<Life> {
    let mut rng = Rng::new(s.seed);
    let mut tasks = Vec::new();
    for i in 0..s.clients {
        let mut c = new_client(i, s, &mut rng);
        let opts = relay.dial_options(c.sub);
        let crng = Rng::new(s.seed.wrapping_mul(0x9E37_79B9).wrapping_add(i as u64));
        let shared = shared.clone();
        let seed = s.seed;
        // Arrivals spread over the first 15 s.
        let start_after = Duration::from_millis((i as u64 * 50) % 15_000);
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(start_after).await;
            let mut st = Stats::default();
            let r = client_life(&mut c, &opts, crng, seed, until, &shared, &mut st).await;
            if let Err(f) = &r {
                println!("soak: client {i} failed: [{}] {}", f.kind, f.detail);
            }
            (c, st, r.err())
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("client task"));
    }
    out
}

fn print_stats(st: &Stats) {
    println!(
        "soak: connections={} replays={} snapshot_reconnects={} not_found={} initializes={} \
         omitted_then_resubscribed={} resubscribes={} closes_4000={} client_drops={} \
         envelopes={} replayed={} dispatched={} echoed_accepted={} echoed_rejected={} \
         never_echoed={} late_echoes={}",
        st.connections,
        st.replays,
        st.snapshot_reconnects,
        st.not_found,
        st.initializes,
        st.init_omitted,
        st.resubscribes,
        st.closes_4000,
        st.client_drops,
        st.envelopes,
        st.replayed_envelopes,
        st.dispatched,
        st.echoed_accepted,
        st.echoed_rejected,
        st.never_echoed,
        st.late_echoes
    );
}

/// Memory verdict: (start, warm-up baseline, peak, end) RSS and the check.
fn judge_memory(samples: &[Sample], s: &Settings) -> Result<String, String> {
    let first = samples.first().map_or(0, |x| x.rss);
    let warm = samples
        .iter()
        .find(|x| x.at >= Duration::from_secs(s.warmup_secs))
        .map_or(first, |x| x.rss);
    let peak = samples.iter().map(|x| x.rss).max().unwrap_or(0);
    let end = samples.last().map_or(0, |x| x.rss);
    let budget = s.budget_mib * 1024 * 1024;
    let step = (samples.len() / 12).max(1);
    let series: Vec<String> = samples
        .iter()
        .step_by(step)
        .map(|x| format!("{}s:{:.0}", x.at.as_secs(), mib(x.rss as f64)))
        .collect();
    let line = format!(
        "relay RSS start {:.1} MiB, after warm-up ({} s) {:.1} MiB, peak {:.1} MiB, end {:.1} MiB \
         (budget {} MiB, end ≤ 1.5 × warm-up); series MiB [{}]",
        mib(first as f64),
        s.warmup_secs,
        mib(warm as f64),
        mib(peak as f64),
        mib(end as f64),
        s.budget_mib,
        series.join(" ")
    );
    if end as f64 > 1.5 * warm as f64 || peak >= budget {
        return Err(line);
    }
    Ok(line)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "about 11 minutes; run with --ignored (README \"Soak\")"]
async fn soak() {
    let s = Settings::from_env();
    println!("soak: {s:?}");
    let mut slots = Vec::new();
    for h in 0..s.hosts {
        let seed = s.seed.wrapping_mul(31).wrapping_add(h as u64);
        slots.push(Slot::start(host_cfg(&host_name(h), s.sessions, seed)).await);
    }
    let slots = Arc::new(slots);
    let pairs: Vec<(String, String)> = slots
        .iter()
        .map(|x| (x.cfg.name.clone(), format!("ws://{}/", x.addr)))
        .collect();
    let relay = Arc::new(RelayChild::start(&pairs, s.replay_buffer).await);
    let started = Instant::now();
    let until = started + Duration::from_secs(s.secs);
    let shared = Arc::new(Shared::default());
    let mem = tokio::spawn(sampler(relay.clone(), s.clone(), until));
    let restarts = tokio::spawn(host_restarts(slots.clone(), s.clone(), until));
    let bad = tokio::spawn(bad_frames(relay.clone(), s.clone(), until));
    let lives = load(&relay, &s, until, &shared).await;
    let samples = mem.await.expect("sampler");
    let restarts = restarts.await.expect("host restarts");
    let bad = bad.await.expect("bad frames");
    let page = relay.metrics().await;

    let mut st = Stats::default();
    let mut clients = Vec::new();
    let mut failures = Vec::new();
    for (c, cst, f) in lives {
        st.add(&cst);
        if let Some(f) = f {
            failures.push(format!(
                "client {} ({}/{}): [{}] {}\n  recent:{}",
                c.idx,
                c.sub,
                c.id,
                f.kind,
                f.detail,
                c.history()
            ));
        }
        clients.push(c);
    }
    println!(
        "soak: {} clients, {} hosts, {} s; reconnects {} (re-initializes {}), client drops {}, \
         host restarts {restarts}, bad frames {:?}",
        s.clients,
        s.hosts,
        s.secs,
        shared.reconnects.load(Ordering::Relaxed),
        shared.reinits.load(Ordering::Relaxed),
        st.client_drops,
        bad
    );
    println!(
        "soak: relay counters: bad_client_frames_total={} limit_hits_total={} links_failed_total={}",
        metric_sum(&page, "ahp_relay_bad_client_frames_total"),
        metric_sum(&page, "ahp_relay_limit_hits_total") + 0.0,
        metric(&page, "ahp_relay_links_failed_total").unwrap_or(0.0)
    );
    let memory = judge_memory(&samples, &s);
    println!("soak: {}", memory.as_ref().unwrap_or_else(|e| e));
    assert!(
        failures.is_empty(),
        "{} client(s) failed during the load:\n{}",
        failures.len(),
        failures.join("\n")
    );
    let bad = bad.unwrap_or_else(|f| panic!("bad frame: [{}] {}", f.kind, f.detail));
    assert!(bad.total() > 0, "bad frames were sent");

    let mut world = World {
        relay,
        slots,
        clients,
        st,
        s: s.clone(),
    };
    let finish = world.finish().await;
    print_stats(&world.st);
    if let Err(f) = &finish {
        let c = f
            .detail
            .split_whitespace()
            .nth(1)
            .and_then(|n| n.parse::<usize>().ok())
            .and_then(|i| world.clients.get(i));
        let recent = c.map(Client::history).unwrap_or_default();
        panic!(
            "S13 check at the end: [{}] {}\n  recent:{recent}",
            f.kind, f.detail
        );
    }
    println!("soak: S13 check at the end: no divergence");
    if let Err(line) = memory {
        panic!("relay memory not bounded: {line}");
    }
}

//! The performance figures of contract §10, side by side in one run: the relay
//! against a direct connection to the same kind of simulated host, on loopback.
//!
//! The relay runs as its own process (`ahp-relay serve --config …`, the binary
//! cargo builds for this bench), so its CPU time and memory are read from
//! `/proc/<pid>` alone. Simulated hosts run in this process on their own
//! runtime (threads named `simhost`), clients on another (`client`), so the
//! load source is not slowed by the clients and each side's CPU is known.
//! Clients are raw WebSockets (tokio-tungstenite) that count frames without
//! decoding them, so the client side stays cheap and equal on both paths.
//! Sections 1–3 load with the simhost's streaming mode (`[stream:<n>]`,
//! pre-rendered deltas; section 3 paced, reading the send stamp in each
//! delta) and compare, when installed, nginx and HAProxy as TLS WebSocket
//! proxies in front of the same kind of host (`apt-get install -y nginx
//! haproxy`; the bench says so when missing). Section 1 also runs the floor:
//! a minimal TLS byte forwarder on the relay's own stack (tokio + rustls),
//! on two threads of this process whose CPU is read per thread — the cost
//! of TLS and the syscalls alone for the same frames.
//! Every figure is a median of several runs; targets are printed next to them
//! and marked met / NOT MET as measured.
//!
//! `cargo bench --bench relay` (about 2 minutes); `AHP_BENCH_QUICK=1` for a
//! ~30 s version with fewer runs and clients; `AHP_BENCH_ONLY=1,4` runs some
//! sections only (1 includes 2; 0, only when named, is the contract's
//! per-frame work alone, in memory: no process, no socket, the figure to
//! run under callgrind; then with cold caches, `AHP_BENCH_COLD_ROUNDS=<n>`
//! rounds of it, fewer under valgrind); `AHP_BENCH_IDLE_CLIENTS=N` overrides the
//! idle-client count (e.g. 10000); `AHP_BENCH_LAT_DUMP=<dir>` writes each
//! paced delta's send stamp and latency to a file per run;
//! `AHP_BENCH_ALT_BIN=<path to another ahp-relay build>` adds it to section 3
//! as "relay (alt)", configured as "relay", run next to it and taking turns
//! going first, and prints alt − relay per round and per order (an A/B of
//! two builds in the same rounds); `AHP_BENCH_RELAY_BIN=<path>` measures
//! that build as "relay" instead of this package's (how
//! `pgo/train.sh` trains the profile-guided build);
//! `AHP_BENCH_PACED_RATE=<n>`
//! paces section 3's streams at n deltas/s instead of 1000 (e.g. for an alt
//! binary that is a wrapper running the relay under callgrind);
//! `AHP_BENCH_PACED_FRAME_BYTES=<n>` makes section 3's host frames n bytes
//! instead of the simhost's 320 (every path's frames change alike);
//! `AHP_BENCH_PACED_FRAME_JITTER=<n>` spreads their sizes over ± n/2 bytes
//! instead of ± 32 (0: one size). Linux only (`/proc`).

use std::collections::VecDeque;
use std::error::Error;
use std::fmt::Display;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ahp_relay::devkit::DevKit;
use ahp_relay::simhost::clock::now_iso;
use ahp_relay::simhost::stream::{now_micros, stamp_of};
use ahp_relay::simhost::{AgentScript, SimHost, SimHostConfig};
use ahp_relay::upstream::dial::{DialOptions, WsStream, dial_stream};
use futures_util::{SinkExt, StreamExt};
use memchr::memmem;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio_tungstenite::MaybeTlsStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::Utf8Bytes;

#[path = "relay/work_floor.rs"]
mod work_floor;

/// The relay's allocator (`src/main.rs`): the floors run in this process, so
/// relay − work floor compares the relay's design, not two allocators (the
/// work floor keeps departed clients' replay memory as the relay does).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

type BoxError = Box<dyn Error + Send + Sync>;
type Result<T> = std::result::Result<T, BoxError>;

fn bad(e: impl Display) -> BoxError {
    e.to_string().into()
}

/// Bound for anything that should happen promptly on loopback.
const WAIT: Duration = Duration::from_secs(20);
/// Bytes of text per `chat/delta`: the relayed frame is then ~320 bytes.
const DELTA_BYTES: usize = 90;
/// The contract's paced load (§10).
const PACED_TARGET: f64 = 50_000.0;
const ROOT: &str = "ahp-root://";

// ─── settings ───────────────────────────────────────────────────────────────

/// Counts and repetitions of a full or quick run.
struct Settings {
    quick: bool,
    /// Rounds of each throughput configuration (median reported).
    rounds: usize,
    /// Deltas of the one-stream turn.
    one_stream_deltas: u64,
    /// Concurrent streams of the many-stream case, and deltas each.
    many_streams: usize,
    many_deltas: u64,
    /// Rounds of the paced-latency runs (each path once per round), and
    /// seconds of paced streaming each.
    latency_runs: usize,
    latency_secs: f64,
    /// Idle TLS clients opened for the memory figure.
    idle_clients: usize,
    /// Hosts × sessions behind the relay for `listSessions`.
    list_hosts: usize,
    list_sessions: usize,
    list_reps: usize,
    /// Timed `reconnect`s of the replay figure.
    replay_reps: usize,
    /// Clients holding the replay chat's large snapshot, for memory.
    snapshot_holders: usize,
    /// Sections to run (`AHP_BENCH_ONLY=1,4`; 1 includes 2); all if empty.
    only: Vec<u32>,
}

impl Settings {
    fn runs(&self, section: u32) -> bool {
        self.only.is_empty() || self.only.contains(&section)
    }

    fn from_env() -> Self {
        let quick = std::env::var("AHP_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
        let mut s = if quick {
            Self {
                quick,
                rounds: 3,
                one_stream_deltas: 300_000,
                many_streams: 50,
                many_deltas: 6_000,
                latency_runs: 3,
                latency_secs: 2.0,
                idle_clients: 200,
                list_hosts: 100,
                list_sessions: 1000,
                list_reps: 11,
                replay_reps: 5,
                snapshot_holders: 50,
                only: Vec::new(),
            }
        } else {
            Self {
                quick,
                rounds: 5,
                one_stream_deltas: 1_000_000,
                many_streams: 50,
                many_deltas: 20_000,
                latency_runs: 5,
                latency_secs: 3.0,
                idle_clients: 1000,
                list_hosts: 100,
                list_sessions: 1000,
                list_reps: 21,
                replay_reps: 9,
                snapshot_holders: 100,
                only: Vec::new(),
            }
        };
        s.only = std::env::var("AHP_BENCH_ONLY")
            .unwrap_or_default()
            .split(',')
            .filter_map(|n| n.trim().parse().ok())
            .collect();
        if let Some(n) = std::env::var("AHP_BENCH_IDLE_CLIENTS")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            s.idle_clients = n;
        }
        s
    }
}

// ─── measuring helpers ──────────────────────────────────────────────────────

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The `p`-th percentile (nearest rank) of sorted values.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "NOT MET" }
}

/// CPU time of a process: the sum over its live threads of
/// `/proc/<pid>/task/<tid>/schedstat` (nanoseconds on CPU), and
/// `utime + stime` of `/proc/<pid>/stat` (clock ticks, all threads ever).
#[derive(Clone, Copy, Debug, Default)]
struct Cpu {
    sched_ns: u64,
    stat_ticks: u64,
    /// `stime` alone: ticks spent in the kernel.
    sys_ticks: u64,
}

/// Nanoseconds on CPU of one thread (`<task dir>/schedstat`, first field).
fn sched_ns(task: &std::path::Path) -> u64 {
    std::fs::read_to_string(task.join("schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(0)
}

/// `utime` and `stime` (clock ticks) of a `/proc/…/stat` file.
fn stat_times(path: &std::path::Path) -> (u64, u64) {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| {
            let rest = &s[s.rfind(')')? + 1..];
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some((
                f.get(11)?.parse::<u64>().ok()?,
                f.get(12)?.parse::<u64>().ok()?,
            ))
        })
        .unwrap_or((0, 0))
}

/// Run time (ns) of each live thread of process `pid`, by thread id.
fn thread_ns_of(pid: &str) -> Vec<(u64, u64)> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| {
            let tid = t.file_name().to_str()?.parse().ok()?;
            Some((tid, sched_ns(&t.path())))
        })
        .collect()
}

impl Cpu {
    fn read(pid: &str) -> Cpu {
        let sched_ns = thread_ns_of(pid).iter().map(|(_, ns)| ns).sum();
        let (utime, stime) = stat_times(std::path::Path::new(&format!("/proc/{pid}/stat")));
        Cpu {
            sched_ns,
            stat_ticks: utime + stime,
            sys_ticks: stime,
        }
    }

    /// CPU of the threads `tids` of this process (schedstat and their own
    /// `stat` ticks; a thread that has exited counts nothing).
    fn tasks(tids: &[u64]) -> Cpu {
        let mut all = Cpu::default();
        for tid in tids {
            let task = PathBuf::from(format!("/proc/self/task/{tid}"));
            let (utime, stime) = stat_times(&task.join("stat"));
            all.sched_ns += sched_ns(&task);
            all.stat_ticks += utime + stime;
            all.sys_ticks += stime;
        }
        all
    }

    /// CPU of this process's threads whose name starts with `prefix`.
    fn threads(prefix: &str) -> Cpu {
        let mut sched_ns = 0;
        if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
            for t in tasks.flatten() {
                let named = std::fs::read_to_string(t.path().join("comm"))
                    .is_ok_and(|c| c.starts_with(prefix));
                if named {
                    sched_ns += self::sched_ns(&t.path());
                }
            }
        }
        Cpu {
            sched_ns,
            ..Cpu::default()
        }
    }

    /// Nanoseconds between two readings (schedstat; threads that exited in
    /// between would be missed, so ticks are kept as a cross-check).
    fn ns_since(&self, before: &Cpu) -> u64 {
        self.sched_ns.saturating_sub(before.sched_ns)
    }

    /// Share of the ticks between two readings spent in the kernel.
    fn kernel_share_since(&self, before: &Cpu) -> f64 {
        let all = self.stat_ticks.saturating_sub(before.stat_ticks);
        self.sys_ticks.saturating_sub(before.sys_ticks) as f64 / all.max(1) as f64
    }

    fn tick_ms_since(&self, before: &Cpu, ticks_per_sec: u64) -> f64 {
        self.stat_ticks.saturating_sub(before.stat_ticks) as f64 * 1000.0 / ticks_per_sec as f64
    }
}

/// `VmRSS` of a process in bytes.
fn rss_bytes(pid: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
            Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
        })
        .unwrap_or(0)
}

fn clock_ticks() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse().ok())
        .unwrap_or(100)
}

// ─── the relay as a child process ───────────────────────────────────────────

/// `ahp-relay serve` in a child process, with its dev kit (certificate,
/// HS256 key, store) in a scratch directory.
struct RelayProc {
    child: Child,
    pid: String,
    admin_port: u16,
    url: String,
    kit: DevKit,
    tls: bool,
    log: Arc<Mutex<VecDeque<String>>>,
}

static SCRATCH: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn scratch_dir(tag: &str) -> PathBuf {
    let n = SCRATCH.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!(
        "ahp-relay-bench-{tag}-{}-{n}-{}",
        std::process::id(),
        ahp_relay::identity::unix_now()
    ))
}

impl RelayProc {
    /// Starts a relay in front of `hosts` (`(id, ws url)`), over TLS or plain
    /// `ws://`, with `extra` TOML appended to the dev config; waits until it
    /// listens and every host's watch link is up.
    async fn start(tag: &str, hosts: &[(String, String)], tls: bool, extra: &str) -> Result<Self> {
        let dir = scratch_dir(tag);
        let kit = DevKit::create(&dir).map_err(bad)?;
        kit.config("127.0.0.1:0", hosts, "", extra).map_err(bad)?;
        let mut config = dir.join("relay.toml");
        // A known admin port: `/metrics` is served on the admin listener,
        // whose address `serve` does not print.
        let admin_port = free_port()?;
        let text = std::fs::read_to_string(&config)?.replace(
            "admin_addr = \"127.0.0.1:0\"",
            &format!("admin_addr = \"127.0.0.1:{admin_port}\""),
        );
        std::fs::write(&config, text)?;
        if tag.ends_with("-shared") {
            let text = std::fs::read_to_string(&config)?.replacen(
                "\naddr = ",
                "\nedge_threads = 0\naddr = ",
                1,
            );
            std::fs::write(&config, text)?;
        }
        if !tls {
            let text = std::fs::read_to_string(&config)?;
            let text = text
                .lines()
                .filter(|l| !l.starts_with("tls_cert") && !l.starts_with("tls_key"))
                .map(|l| {
                    if l.starts_with("addr = ") {
                        format!("{l}\nplaintext = true")
                    } else {
                        l.to_string()
                    }
                })
                .collect::<Vec<_>>()
                .join("\n");
            config = dir.join("relay-plain.toml");
            std::fs::write(&config, text)?;
        }
        // The A/B path (`AHP_BENCH_ALT_BIN`): another build of the relay,
        // configured the same way, measured in the same rounds.
        let bin = match tag.ends_with("-alt") {
            true => std::env::var("AHP_BENCH_ALT_BIN")?,
            false => relay_bin(),
        };
        let mut child = Command::new(bin)
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        let pid = child.id().to_string();
        let stderr = child.stderr.take().ok_or("no stderr")?;
        let log = Arc::new(Mutex::new(VecDeque::new()));
        let (tx, rx) = tokio::sync::oneshot::channel::<String>();
        let keep = log.clone();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
                if let Some(url) = line.strip_prefix("ahp-relay listening on ")
                    && let Some(tx) = tx.take()
                {
                    let _ = tx.send(url.trim().to_string());
                }
                let mut l = keep.lock().unwrap_or_else(|e| e.into_inner());
                if l.len() >= 40 {
                    l.pop_front();
                }
                l.push_back(line);
            }
        });
        let mut me = RelayProc {
            child,
            pid,
            admin_port,
            url: String::new(),
            kit,
            tls,
            log,
        };
        match tokio::time::timeout(WAIT, rx).await {
            Ok(Ok(url)) => me.url = url,
            _ => return Err(format!("relay did not start: {}", me.last_log()).into()),
        }
        me.wait_hosts_up(hosts.len()).await?;
        Ok(me)
    }

    /// The relay's last log lines, without terminal colours.
    fn last_log(&self) -> String {
        let l = self.log.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = String::new();
        for line in l.iter() {
            let mut chars = line.chars();
            while let Some(c) = chars.next() {
                if c == '\u{1b}' {
                    for c in chars.by_ref() {
                        if c.is_ascii_alphabetic() {
                            break;
                        }
                    }
                } else {
                    out.push(c);
                }
            }
            out.push('\n');
        }
        out.trim_end().to_string()
    }

    /// `GET path` on the relay's admin listener: status line and body.
    async fn get(&self, path: &str) -> Result<String> {
        let tcp = TcpStream::connect(("127.0.0.1", self.admin_port)).await?;
        http_get(tcp, path).await
    }

    /// Waits until `/metrics` reports `hosts` watch links up.
    async fn wait_hosts_up(&self, hosts: usize) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let page = self.get("/metrics").await.unwrap_or_default();
            let up = page
                .lines()
                .filter(|l| l.starts_with("ahp_relay_host_up{") && l.ends_with(" 1"))
                .count();
            if up >= hosts {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("only {up} of {hosts} hosts up: {}", self.last_log()).into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn cpu(&self) -> Cpu {
        Cpu::read(&self.pid)
    }

    fn rss(&self) -> u64 {
        rss_bytes(&self.pid)
    }

    /// A client endpoint through this relay.
    fn endpoint(&self, label: &'static str) -> Endpoint {
        Endpoint {
            label,
            url: self.url.clone(),
            ca: self.tls.then(|| self.kit.cert.clone()),
            kit: Some(self.kit.clone()),
            qualify: true,
        }
    }
}

/// The relay build measured as "relay": this package's, or the one
/// `AHP_BENCH_RELAY_BIN` names (e.g. the instrumented build that
/// `pgo/train.sh` trains).
fn relay_bin() -> String {
    std::env::var("AHP_BENCH_RELAY_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_ahp-relay").to_string())
}

impl Drop for RelayProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.kit.dir);
    }
}

async fn http_get<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, path: &str) -> Result<String> {
    let req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await?;
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(WAIT, s.read_to_end(&mut buf)).await;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// A process whose CPU a run measures (the relay, or a peer proxy).
trait Measured: Sync {
    fn cpu(&self) -> Cpu;
    fn last_log(&self) -> String;
    /// Run time (ns) of each of its threads by thread id; empty where the
    /// proxy is several processes (the peers).
    fn thread_ns(&self) -> Vec<(u64, u64)> {
        Vec::new()
    }
}

impl Measured for RelayProc {
    fn cpu(&self) -> Cpu {
        RelayProc::cpu(self)
    }
    fn thread_ns(&self) -> Vec<(u64, u64)> {
        thread_ns_of(&self.pid)
    }
    fn last_log(&self) -> String {
        RelayProc::last_log(self)
    }
}

/// nginx or HAProxy as a TLS WebSocket proxy in front of one simhost, run
/// from a config in a scratch directory with the relay's dev certificate.
struct Peer {
    child: Child,
    pid: String,
    port: u16,
    dir: PathBuf,
}

/// The peers the bench compares with, and how to install them.
const PEERS: [&str; 2] = ["nginx", "haproxy"];
const PEER_INSTALL: &str = "apt-get install -y nginx haproxy";

fn installed(cmd: &str) -> bool {
    Command::new(cmd)
        .arg("-v")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Peer {
    /// Starts `kind` (`nginx` or `haproxy`) proxying `wss://127.0.0.1:<port>/`
    /// to `host` (a `ws://` URL), with `cert`/`key` (PEM).
    async fn start(
        kind: &str,
        host: &str,
        cert: &std::path::Path,
        key: &std::path::Path,
    ) -> Result<Self> {
        let dir = scratch_dir(kind);
        std::fs::create_dir_all(&dir)?;
        let port = free_port()?;
        let upstream = host.trim_start_matches("ws://").trim_end_matches('/');
        let (cert, key) = (cert.display(), key.display());
        let d = dir.display();
        let mut cmd = if kind == "nginx" {
            let conf = format!(
                "worker_processes 2; pid {d}/nginx.pid; error_log {d}/error.log warn;\n\
                 events {{ worker_connections 4096; }}\n\
                 http {{ access_log off; client_body_temp_path {d}; proxy_temp_path {d};\n\
                 server {{ listen 127.0.0.1:{port} ssl; ssl_certificate {cert}; ssl_certificate_key {key};\n\
                 ssl_protocols TLSv1.3;\n\
                 location / {{ proxy_pass http://{upstream}; proxy_http_version 1.1;\n\
                 proxy_set_header Upgrade $http_upgrade; proxy_set_header Connection upgrade;\n\
                 proxy_buffering off; proxy_read_timeout 3600s; proxy_send_timeout 3600s; }} }} }}\n"
            );
            std::fs::write(dir.join("nginx.conf"), conf)?;
            let mut c = Command::new("nginx");
            c.arg("-p").arg(&dir).arg("-c").arg(dir.join("nginx.conf"));
            c.arg("-e")
                .arg(dir.join("error.log"))
                .arg("-g")
                .arg("daemon off;");
            c
        } else {
            let pem = dir.join("both.pem");
            let mut both = std::fs::read(cert.to_string())?;
            both.extend(std::fs::read(key.to_string())?);
            std::fs::write(&pem, both)?;
            let conf = format!(
                "global\n  nbthread 2\n  ssl-default-bind-options ssl-min-ver TLSv1.3\n\
                 defaults\n  mode http\n  timeout connect 5s\n  timeout client 1h\n  timeout server 1h\n  timeout tunnel 1h\n\
                 frontend f\n  bind 127.0.0.1:{port} ssl crt {}\n  default_backend b\n\
                 backend b\n  server s1 {upstream}\n",
                pem.display()
            );
            std::fs::write(dir.join("haproxy.cfg"), conf)?;
            let mut c = Command::new("haproxy");
            c.arg("-db").arg("-f").arg(dir.join("haproxy.cfg"));
            c
        };
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let pid = child.id().to_string();
        let peer = Peer {
            child,
            pid,
            port,
            dir,
        };
        let deadline = Instant::now() + WAIT;
        while TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            if Instant::now() > deadline {
                return Err(format!("{kind} did not listen: {}", peer.last_log()).into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(peer)
    }

    fn endpoint(&self, label: &'static str, ca: &std::path::Path) -> Endpoint {
        Endpoint::proxy(label, self.port, ca)
    }
}

impl Measured for Peer {
    /// The process and its worker processes (nginx forks its workers).
    fn cpu(&self) -> Cpu {
        let mut all = Cpu::read(&self.pid);
        let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", self.pid))
            .unwrap_or_default();
        for child in children.split_whitespace() {
            let c = Cpu::read(child);
            all.sched_ns += c.sched_ns;
            all.stat_ticks += c.stat_ticks;
            all.sys_ticks += c.sys_ticks;
        }
        all
    }
    fn last_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("error.log")).unwrap_or_default()
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        // SIGTERM, not SIGKILL: nginx's master then stops its workers too.
        let _ = Command::new("kill").arg("-TERM").arg(&self.pid).status();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

// ─── the floor: TLS and the syscalls alone ──────────────────────────────────

/// A minimal TLS-terminating byte forwarder on the relay's stack (tokio,
/// tokio-rustls with ring, TLS 1.3 only, the relay's dev certificate): each
/// client's TLS connection is spliced to a plain TCP connection to its
/// simhost, the WebSocket upgrade and frames passing through untouched, one
/// `write_all` + flush per read. It runs on a runtime of its own with two
/// worker threads (like nginx's and HAProxy's two workers), whose thread ids
/// it records as they start, so its CPU is theirs alone: what any design on
/// tokio + rustls pays for these bytes.
struct Floor {
    rt: Option<tokio::runtime::Runtime>,
    /// With [`Floor::start_per_core`]: each thread's stop signal.
    stops: Vec<tokio::sync::oneshot::Sender<()>>,
    /// One listener per upstream, in the order given to [`Floor::start`].
    ports: Vec<u16>,
    tids: Arc<Mutex<Vec<u64>>>,
    label: &'static str,
}

/// This thread's id, from `/proc/thread-self` (`<pid>/task/<tid>`).
fn this_tid() -> Option<u64> {
    let link = std::fs::read_link("/proc/thread-self").ok()?;
    link.file_name()?.to_str()?.parse().ok()
}

/// The floor's TLS: TLS 1.3 only, ring, `cert` / `key` (PEM), HTTP/1.1 ALPN
/// as the relay offers.
fn floor_tls(cert: &std::path::Path, key: &std::path::Path) -> Result<rustls::ServerConfig> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(bad)?
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(bad)?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(bad)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

impl Floor {
    /// Starts the forwarder's runtime and one listener per `hosts` URL.
    fn start(
        hosts: &[String],
        cert: &std::path::Path,
        key: &std::path::Path,
        work: bool,
    ) -> Result<Self> {
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(floor_tls(cert, key)?));
        let tids = Arc::new(Mutex::new(Vec::new()));
        let seen = tids.clone();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(if work { "work-floor" } else { "floor" })
            .on_thread_start(move || {
                if let Some(tid) = this_tid() {
                    seen.lock().unwrap_or_else(|e| e.into_inner()).push(tid);
                }
            })
            .enable_all()
            .build()?;
        let mut ports = Vec::new();
        for host in hosts {
            let (listener, upstream) = floor_listener(host, &mut ports)?;
            rt.spawn(floor_accept(listener, acceptor.clone(), upstream, work));
        }
        Ok(Floor {
            rt: Some(rt),
            stops: Vec::new(),
            ports,
            tids,
            label: if work { "work-floor" } else { "floor" },
        })
    }

    /// As [`Floor::start`], on two single-threaded runtimes (one thread
    /// each, as nginx's two workers each own their connections): the
    /// listener hands clients to them in turn, and a client's tasks stay on
    /// its runtime. Each thread asks for the relay's default time slice, as
    /// the relay's edge threads do (`edge::slice`).
    fn start_per_core(
        hosts: &[String],
        cert: &std::path::Path,
        key: &std::path::Path,
        work: bool,
    ) -> Result<Self> {
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(floor_tls(cert, key)?));
        let tids = Arc::new(Mutex::new(Vec::new()));
        let mut handles = Vec::new();
        let mut stops = Vec::new();
        for i in 0..2 {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            handles.push(rt.handle().clone());
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            stops.push(stop);
            let seen = tids.clone();
            std::thread::Builder::new()
                .name(format!("floor-core-{i}"))
                .spawn(move || {
                    if let Some(tid) = this_tid() {
                        seen.lock().unwrap_or_else(|e| e.into_inner()).push(tid);
                    }
                    let slice = Duration::from_micros(ahp_relay::config::default_edge_slice_us());
                    let _ = ahp_relay::edge::slice::request(slice);
                    let _ = rt.block_on(stopped);
                })?;
        }
        let mut ports = Vec::new();
        for host in hosts {
            let (listener, upstream) = floor_listener(host, &mut ports)?;
            let (acceptor, cores) = (acceptor.clone(), handles.clone());
            handles[0].spawn(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                    return;
                };
                let mut n = 0usize;
                while let Ok((tcp, _)) = listener.accept().await {
                    let std = tcp.into_std();
                    let (a, u) = (acceptor.clone(), upstream.clone());
                    cores[n % cores.len()].spawn(async move {
                        let Ok(tcp) = std.and_then(TcpStream::from_std) else {
                            return;
                        };
                        floor_conn(tcp, a, u, work).await;
                    });
                    n += 1;
                }
            });
        }
        Ok(Floor {
            rt: None,
            stops,
            ports,
            tids,
            label: if work {
                "work-floor-core"
            } else {
                "floor-core"
            },
        })
    }

    fn endpoint(&self, i: usize, ca: &std::path::Path) -> Endpoint {
        Endpoint::proxy(self.label, self.ports.get(i).copied().unwrap_or(0), ca)
    }

    fn tids(&self) -> Vec<u64> {
        self.tids.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The environment variable that makes this binary a floor process
/// ([`floor_child`]): `work` or `plain`, then the certificate, key and host
/// URL, separated by newlines.
const FLOOR_CHILD_ENV: &str = "AHP_BENCH_FLOOR_CHILD";

/// A per-core floor ([`Floor::start_per_core`]) in a process of its own,
/// this binary run again: a proxy process beside the load's host and
/// clients, as the relay, nginx and HAProxy are, so its context switches
/// to and from them cross address spaces as theirs do (the in-process
/// floors share the load's).
struct FloorProc {
    child: Child,
    pid: String,
    port: u16,
    label: &'static str,
}

impl FloorProc {
    fn start(
        host: &str,
        cert: &std::path::Path,
        key: &std::path::Path,
        work: bool,
    ) -> Result<Self> {
        let spec = format!(
            "{}\n{}\n{}\n{host}",
            if work { "work" } else { "plain" },
            cert.display(),
            key.display()
        );
        let mut child = Command::new(std::env::current_exe()?)
            .env(FLOOR_CHILD_ENV, spec)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let pid = child.id().to_string();
        let mut line = String::new();
        BufReader::new(child.stdout.take().ok_or("no stdout")?).read_line(&mut line)?;
        let port = line
            .trim()
            .strip_prefix("port ")
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| format!("floor process: {line:?}"))?;
        let label = if work {
            "work-floor-proc"
        } else {
            "floor-proc"
        };
        Ok(Self {
            child,
            pid,
            port,
            label,
        })
    }

    fn endpoint(&self, ca: &std::path::Path) -> Endpoint {
        Endpoint::proxy(self.label, self.port, ca)
    }
}

impl Measured for FloorProc {
    fn cpu(&self) -> Cpu {
        Cpu::read(&self.pid)
    }
    fn thread_ns(&self) -> Vec<(u64, u64)> {
        thread_ns_of(&self.pid)
    }
    fn last_log(&self) -> String {
        String::new()
    }
}

impl Drop for FloorProc {
    fn drop(&mut self) {
        // Its stdin closing ends it.
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// The floor process's body ([`FLOOR_CHILD_ENV`]): a per-core floor in
/// front of one host, its port printed as `port <n>`, until stdin closes.
fn floor_child(spec: &str) -> Result<()> {
    let mut parts = spec.split('\n');
    let mut next = || parts.next().ok_or("floor spec: too short");
    let work = next()? == "work";
    let (cert, key) = (PathBuf::from(next()?), PathBuf::from(next()?));
    let host = next()?.to_string();
    let floor = Floor::start_per_core(&[host], &cert, &key, work)?;
    println!("port {}", floor.ports.first().copied().unwrap_or(0));
    std::io::Write::flush(&mut std::io::stdout())?;
    let mut sink = String::new();
    while std::io::stdin().read_line(&mut sink)? > 0 {
        sink.clear();
    }
    drop(floor);
    Ok(())
}

/// A listener for the floor in front of `host` (a `ws://` URL), its port
/// added to `ports`; and the upstream's `host:port`.
fn floor_listener(host: &str, ports: &mut Vec<u16>) -> Result<(std::net::TcpListener, String)> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    ports.push(listener.local_addr()?.port());
    let upstream = host.trim_start_matches("ws://").trim_end_matches('/');
    Ok((listener, upstream.to_string()))
}

/// Accepts clients for one upstream until the runtime stops.
async fn floor_accept(
    listener: std::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    upstream: String,
    work: bool,
) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        return;
    };
    while let Ok((tcp, _)) = listener.accept().await {
        tokio::spawn(floor_conn(tcp, acceptor.clone(), upstream.clone(), work));
    }
}

/// One client: TLS handshake, a TCP connection to the upstream, then bytes
/// both ways, each direction its own task (so the runtime may run them on
/// either thread); the connection ends when either direction does. With
/// `work`, host → client runs [`work_floor::pump`] and client → host
/// [`work_floor::up`] (the link's root subscription added) instead of raw bytes.
async fn floor_conn(
    tcp: TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    upstream: String,
    work: bool,
) {
    let _ = tcp.set_nodelay(true);
    let Ok(tls) = acceptor.accept(tcp).await else {
        return;
    };
    let Ok(host) = TcpStream::connect(upstream.as_str()).await else {
        return;
    };
    let _ = host.set_nodelay(true);
    let (client_r, client_w) = tokio::io::split(tls);
    let (host_r, host_w) = host.into_split();
    let mut down = if work {
        tokio::spawn(work_floor::pump(host_r, client_w))
    } else {
        tokio::spawn(work_floor::copy(host_r, client_w))
    };
    let mut up = if work {
        tokio::spawn(work_floor::up(client_r, host_w))
    } else {
        tokio::spawn(work_floor::copy(client_r, host_w))
    };
    tokio::select! {
        _ = &mut down => up.abort(),
        _ = &mut up => down.abort(),
    }
}

impl Measured for Floor {
    fn cpu(&self) -> Cpu {
        Cpu::tasks(&self.tids())
    }
    fn last_log(&self) -> String {
        String::new()
    }
    fn thread_ns(&self) -> Vec<(u64, u64)> {
        self.tids()
            .into_iter()
            .map(|tid| {
                (
                    tid,
                    sched_ns(&PathBuf::from(format!("/proc/self/task/{tid}"))),
                )
            })
            .collect()
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        // Without waiting: this may run on another runtime's thread.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
        for stop in self.stops.drain(..) {
            let _ = stop.send(());
        }
    }
}

// ─── clients ────────────────────────────────────────────────────────────────

/// Where clients connect: a host directly, or a relay.
#[derive(Clone)]
struct Endpoint {
    label: &'static str,
    url: String,
    ca: Option<PathBuf>,
    /// Dev kit minting tokens (relay only).
    kit: Option<DevKit>,
    /// The relay names host chats `<host>~<id>`.
    qualify: bool,
}

impl Endpoint {
    /// A TLS-terminating proxy or floor at `port` on loopback, trusting `ca`.
    fn proxy(label: &'static str, port: u16, ca: &std::path::Path) -> Self {
        Endpoint {
            label,
            url: format!("wss://127.0.0.1:{port}/"),
            ca: Some(ca.to_path_buf()),
            kit: None,
            qualify: false,
        }
    }

    fn direct(label: &'static str, host: &SimHost) -> Self {
        Endpoint {
            label,
            url: host.url(),
            ca: None,
            kit: None,
            qualify: false,
        }
    }

    /// The client-facing URI of seeded chat `n` of `host`.
    fn chat(&self, host: &str, n: usize) -> String {
        if self.qualify {
            format!("ahp-chat:/{host}~{host}-{n}-main")
        } else {
            format!("ahp-chat:/{host}-{n}-main")
        }
    }

    /// Opens a WebSocket as principal `sub` (a 1-hour dev token via the relay).
    async fn connect(&self, sub: &str) -> Result<Conn> {
        let token = match &self.kit {
            Some(kit) => Some(
                kit.token(sub, &[], Duration::from_secs(3600), None)
                    .map_err(bad)?,
            ),
            None => None,
        };
        let ws = dial_stream(&DialOptions {
            url: self.url.clone(),
            token,
            ca_file: self.ca.clone(),
            insecure: false,
            connect_timeout: WAIT,
            extra_headers: Vec::new(),
        })
        .await
        .map_err(bad)?;
        Ok(Conn { ws, next_id: 1 })
    }

    /// Connects as `sub`, initializes with client id `sub` and subscribes `chat`.
    async fn subscriber(&self, sub: &str, chat: &str) -> Result<Conn> {
        let mut c = self.connect(sub).await?;
        c.initialize(sub).await?;
        c.request("subscribe", json!({ "channel": chat })).await?;
        Ok(c)
    }
}

/// A raw JSON-RPC WebSocket.
struct Conn {
    ws: WsStream,
    next_id: u64,
}

impl Conn {
    async fn send(&mut self, v: &Value) -> Result<()> {
        self.ws
            .send(Message::text(v.to_string()))
            .await
            .map_err(bad)
    }

    /// The next text frame.
    async fn recv(&mut self) -> Result<Utf8Bytes> {
        loop {
            match tokio::time::timeout(WAIT, self.ws.next()).await {
                Err(_) => return Err("no frame in time".into()),
                Ok(None) => return Err("socket ended".into()),
                Ok(Some(Err(e))) => return Err(bad(e)),
                Ok(Some(Ok(Message::Text(t)))) => return Ok(t),
                Ok(Some(Ok(Message::Close(f)))) => {
                    return Err(format!("closed by the peer: {f:?}").into());
                }
                Ok(Some(Ok(_))) => {}
            }
        }
    }

    /// Sends a request; returns the time until its response frame arrived
    /// (before parsing) and the response's `result`.
    async fn request_timed(&mut self, method: &str, params: Value) -> Result<(Duration, Value)> {
        let id = self.next_id;
        self.next_id += 1;
        let text = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let text = text.to_string();
        let start = Instant::now();
        self.ws.send(Message::text(text)).await.map_err(bad)?;
        loop {
            let frame = self.recv().await?;
            let took = start.elapsed();
            if memmem::find(frame.as_bytes(), b"\"id\"").is_none() {
                continue;
            }
            let v: Value = serde_json::from_str(frame.as_str())?;
            if v.get("id") != Some(&json!(id)) {
                continue;
            }
            if let Some(e) = v.get("error") {
                return Err(format!("{method}: {e}").into());
            }
            return Ok((took, v.get("result").cloned().unwrap_or(Value::Null)));
        }
    }

    async fn request(&mut self, method: &str, params: Value) -> Result<Value> {
        Ok(self.request_timed(method, params).await?.1)
    }

    async fn initialize(&mut self, client_id: &str) -> Result<Value> {
        self.request(
            "initialize",
            json!({"channel": ROOT, "protocolVersions": ["1.0.0"], "clientId": client_id}),
        )
        .await
    }

    /// Dispatches `chat/turnStarted` on `chat`: the agent then streams its
    /// script, or with `stream` that many pre-rendered deltas (the simhost's
    /// load mode, `[stream:<n>]`).
    async fn start_turn(&mut self, chat: &str, turn_id: &str, stream: Option<u64>) -> Result<()> {
        let text = match stream {
            Some(n) => format!("benchmark [stream:{n}]"),
            None => "benchmark turn".to_string(),
        };
        self.send(
            &json!({"jsonrpc": "2.0", "method": "dispatchAction", "params": {
            "channel": chat, "clientSeq": 1,
            "action": {"type": "chat/turnStarted", "turnId": turn_id, "startedAt": now_iso(),
                "message": {"text": text, "origin": {"kind": "user"}}}}}),
        )
        .await
    }

    /// Reads `action` frames until `chat/turnComplete`; counts deltas (and
    /// with `stamps`, keeps each delta's latency: arrival − the send stamp
    /// the streaming mode puts in its text, same machine and clock).
    async fn read_turn(&mut self, stamps: bool) -> Result<TurnStats> {
        let mut s = TurnStats::default();
        // Built once per turn: `memmem::find` would build a searcher per call.
        let keys: [&[u8]; 5] = [
            b"\"method\":\"action\"",
            b"\"rejectionReason\"",
            b"\"chat/delta\"",
            b"\"chat/turnComplete\"",
            STAMP_KEY,
        ];
        let [action, rejected, delta, complete, content] = keys.map(memmem::Finder::new);
        loop {
            let frame = self.recv().await?;
            let b = frame.as_bytes();
            if action.find(b).is_none() {
                continue;
            }
            let now = Instant::now();
            let arrived = if stamps { now_micros() } else { 0 };
            s.actions += 1;
            if rejected.find(b).is_some() {
                return Err(format!("rejected: {}", frame.as_str()).into());
            }
            if delta.find(b).is_some() {
                s.deltas += 1;
                s.delta_frame_bytes += b.len() as u64;
                s.first.get_or_insert(now);
                s.last = Some(now);
                if stamps {
                    match delta_stamp(&frame, &content) {
                        Some(sent) => {
                            s.lat_us.push(arrived as f64 - sent as f64);
                            s.sent_us.push(sent);
                        }
                        None => s.unstamped += 1,
                    }
                }
            } else if complete.find(b).is_some() {
                return Ok(s);
            }
        }
    }

    /// Name and cipher suite of the TLS session, if any.
    fn tls_info(&self) -> Option<String> {
        match self.ws.get_ref() {
            MaybeTlsStream::Rustls(tls) => {
                let c = tls.get_ref().1;
                Some(format!(
                    "{:?} {:?}",
                    c.protocol_version()?,
                    c.negotiated_cipher_suite()?.suite()
                ))
            }
            _ => None,
        }
    }

    /// Closes with a WebSocket close handshake (bounded).
    async fn close(mut self) {
        let _ = tokio::time::timeout(Duration::from_secs(2), self.ws.close(None)).await;
    }

    /// Drops the socket without a close handshake, as a network drop would
    /// (finished runs end their clients this way; section 4 measures that a
    /// client-initiated close costs the relay no CPU either).
    fn hang_up(self) {
        drop(self);
    }
}

#[derive(Default)]
struct TurnStats {
    actions: u64,
    deltas: u64,
    delta_frame_bytes: u64,
    first: Option<Instant>,
    last: Option<Instant>,
    /// Latency of each delta, µs (with `stamps`).
    lat_us: Vec<f64>,
    /// Send stamp of each delta, µs since the epoch (with `stamps`).
    sent_us: Vec<u64>,
    /// Deltas without a readable send stamp (with `stamps`).
    unstamped: u64,
}

/// What precedes a streamed delta's text, which starts with its send stamp.
const STAMP_KEY: &[u8] = b"\"content\":\"";

/// The send stamp of a streamed delta (`"content":"@<16 digits>;…`);
/// `key` finds [`STAMP_KEY`].
fn delta_stamp(frame: &Utf8Bytes, key: &memmem::Finder) -> Option<u64> {
    let at = key.find(frame.as_bytes())? + STAMP_KEY.len();
    frame.as_str().get(at..).and_then(stamp_of)
}

async fn join_all<T>(tasks: Vec<JoinHandle<Result<T>>>) -> Result<Vec<T>> {
    let mut out = Vec::with_capacity(tasks.len());
    let mut first_err = None;
    for t in tasks {
        match t.await {
            Ok(Ok(v)) => out.push(v),
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(e) => {
                first_err.get_or_insert(bad(e));
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

fn script(reply_deltas: u32, delta_rate: u32) -> AgentScript {
    AgentScript {
        reply_deltas,
        delta_bytes: DELTA_BYTES,
        delta_rate,
        tool_confirmation: false,
        seed: None,
    }
}

/// The runtime the simulated hosts run on: its own two worker threads named
/// `simhost`, so the load source is not slowed by the clients (which run on
/// threads named `client`) and its CPU time can be told apart.
static HOST_RT: std::sync::OnceLock<tokio::runtime::Handle> = std::sync::OnceLock::new();

fn host_rt() -> Result<tokio::runtime::Handle> {
    HOST_RT
        .get()
        .cloned()
        .ok_or_else(|| "no host runtime".into())
}

async fn start_host(name: &str, sessions: usize, script: AgentScript) -> Result<SimHost> {
    start_configured(SimHostConfig {
        sessions,
        script,
        replay_log: 20_000,
        record_limit: 16,
        ..SimHostConfig::named(name)
    })
    .await
}

/// Starts a simhost with `cfg` on the host runtime.
async fn start_configured(cfg: SimHostConfig) -> Result<SimHost> {
    Ok(host_rt()?
        .spawn(SimHost::start_local(cfg))
        .await
        .map_err(bad)??)
}

async fn stop_host(host: SimHost) {
    if let Ok(rt) = host_rt() {
        let _ = rt.spawn(host.shutdown()).await;
    }
}

fn pair(h: &SimHost) -> (String, String) {
    (h.config().name.clone(), h.url())
}

// ─── 1 + 2: throughput and CPU ──────────────────────────────────────────────

/// One streaming run: `streams` clients, each subscribed to its own fresh
/// chat and starting one turn there.
struct StreamRun {
    /// Deltas received per second, all streams together (first to last delta).
    rate: f64,
    /// `action` envelopes received by the clients.
    actions: u64,
    /// `chat/delta` envelopes received by the clients.
    deltas: u64,
    /// Mean size of a delta frame as received.
    frame_bytes: f64,
    /// End-to-end latency of the deltas (runs with `stamps` only).
    latency: Option<Lat>,
    wall: Duration,
    relay_cpu_ns: Option<u64>,
    relay_cpu_tick_ms: Option<f64>,
    relay_kernel_share: Option<f64>,
    /// The proxy's busiest threads over the run, as cores, busiest first
    /// (at most 3; empty for the peers and the direct path).
    relay_busiest: Vec<f64>,
    /// The share of the machine's time stolen by the hypervisor during the run.
    steal: Option<f64>,
    /// CPU of the simhost threads and of the client threads.
    host_cpu_ns: u64,
    client_cpu_ns: u64,
    tls: Option<String>,
    /// Section 3: p50 and p99 of how long the host's batches waited from
    /// their stamp to their write (µs), the part of a path's latency spent
    /// before the path's socket.
    host_wait: Option<(f64, f64)>,
}

/// CPU readings taken at the start and at the end of a run.
struct Readings {
    relay: Option<Cpu>,
    /// The proxy's run time per thread (see [`Measured::thread_ns`]).
    threads: Vec<(u64, u64)>,
    host: Cpu,
    client: Cpu,
    /// The machine's stolen and total clock ticks ([`stolen_ticks`]).
    steal: (u64, u64),
}

impl Readings {
    fn take(relay: Option<&dyn Measured>) -> Self {
        Readings {
            relay: relay.map(|r| r.cpu()),
            threads: relay.map(|r| r.thread_ns()).unwrap_or_default(),
            host: Cpu::threads("simhost"),
            client: Cpu::threads("client"),
            steal: stolen_ticks(),
        }
    }

    /// The share of the machine's clock ticks since `before` that the
    /// hypervisor gave to someone else (`steal`): time when a runnable
    /// thread of any path waited for no reason of its own.
    fn steal_since(&self, before: &Readings) -> Option<f64> {
        let stolen = self.steal.0.checked_sub(before.steal.0)?;
        let total = self.steal.1.checked_sub(before.steal.1)?;
        (total > 0).then(|| stolen as f64 / total as f64)
    }

    /// The proxy's busiest threads between `before` and these readings, as
    /// cores (run time ÷ `wall`), busiest first, at most 3.
    fn busiest_since(&self, before: &Readings, wall: Duration) -> Vec<f64> {
        let mut cores: Vec<f64> = self
            .threads
            .iter()
            .map(|(tid, ns)| {
                let was = before
                    .threads
                    .iter()
                    .find(|(t, _)| t == tid)
                    .map_or(0, |t| t.1);
                ns.saturating_sub(was) as f64 / 1e9 / wall.as_secs_f64()
            })
            .collect();
        cores.sort_by(|a, b| b.total_cmp(a));
        cores.truncate(3);
        cores
    }
}

/// The clients' counts of one run, all streams together.
#[derive(Default)]
struct Totals {
    deltas: u64,
    actions: u64,
    bytes: u64,
    first: Option<Instant>,
    last: Option<Instant>,
    lat: Vec<f64>,
    sent: Vec<u64>,
    /// The stream (in order of [`Totals::add`]) of each of `sent`.
    stream: Vec<u32>,
    streams: u32,
    unstamped: u64,
}

impl Totals {
    fn add(&mut self, mut s: TurnStats) {
        self.lat.append(&mut s.lat_us);
        let stream = self.streams;
        self.streams += 1;
        self.stream.extend(s.sent_us.iter().map(|_| stream));
        self.sent.append(&mut s.sent_us);
        self.unstamped += s.unstamped;
        self.deltas += s.deltas;
        self.actions += s.actions;
        self.bytes += s.delta_frame_bytes;
        self.first = match (self.first, s.first) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.last = match (self.last, s.last) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }

    /// The run's figures, from its totals and the readings around it.
    fn run(
        self,
        stamps: bool,
        wall: Duration,
        (b, a): (Readings, Readings),
        ticks: u64,
    ) -> Result<StreamRun> {
        let span = match (self.first, self.last) {
            (Some(x), Some(y)) if y > x => y - x,
            _ => return Err("no deltas received".into()),
        };
        let relay = b.relay.zip(a.relay);
        Ok(StreamRun {
            rate: self.deltas as f64 / span.as_secs_f64(),
            actions: self.actions,
            deltas: self.deltas,
            frame_bytes: self.bytes as f64 / self.deltas.max(1) as f64,
            latency: stamps.then(|| Lat::of(self.lat, self.unstamped)),
            wall,
            relay_cpu_ns: relay.map(|(b, a)| a.ns_since(&b)),
            relay_kernel_share: relay.map(|(b, a)| a.kernel_share_since(&b)),
            relay_cpu_tick_ms: relay.map(|(b, a)| a.tick_ms_since(&b, ticks)),
            relay_busiest: a.busiest_since(&b, wall),
            steal: a.steal_since(&b),
            host_cpu_ns: a.host.ns_since(&b.host),
            client_cpu_ns: a.client.ns_since(&b.client),
            tls: None,
            host_wait: None,
        })
    }
}

async fn stream_run(
    ep: &Endpoint,
    relay: Option<&dyn Measured>,
    (host, first_chat, streams, deltas): (&str, usize, usize, u64),
    tag: &str,
    ticks: u64,
    stamps: bool,
) -> Result<StreamRun> {
    let mut tasks = Vec::new();
    for i in 0..streams {
        let ep = ep.clone();
        let chat = ep.chat(host, first_chat + i);
        let sub = format!("{tag}-{i}");
        tasks.push(tokio::spawn(async move {
            let c = ep.subscriber(&sub, &chat).await?;
            Ok((c, chat))
        }));
    }
    let conns = join_all(tasks).await?;
    let tls = conns.first().and_then(|(c, _)| c.tls_info());
    let before = Readings::take(relay);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (i, (mut c, chat)) in conns.into_iter().enumerate() {
        let turn = format!("{tag}-turn-{i}");
        tasks.push(tokio::spawn(async move {
            c.start_turn(&chat, &turn, Some(deltas)).await?;
            let s = c.read_turn(stamps).await?;
            Ok((c, s))
        }));
    }
    let done = join_all(tasks).await?;
    let wall = start.elapsed();
    let after = Readings::take(relay);
    let mut totals = Totals::default();
    let mut conns = Vec::new();
    for (c, s) in done {
        totals.add(s);
        conns.push(c);
    }
    for c in conns {
        c.hang_up();
    }
    if stamps {
        dump_latency(tag, &totals);
    }
    let mut run = totals.run(stamps, wall, (before, after), ticks)?;
    run.tls = tls;
    Ok(run)
}

/// With `AHP_BENCH_LAT_DUMP=<dir>`, writes every delta of the run as
/// `<send stamp µs> <latency µs> <stream>` lines to `<dir>/<tag>.txt`, to see when
/// the slow ones happened (best effort: the figures do not depend on it).
fn dump_latency(tag: &str, t: &Totals) {
    let Some(dir) = std::env::var_os("AHP_BENCH_LAT_DUMP") else {
        return;
    };
    let mut out = String::with_capacity(t.sent.len() * 24);
    for ((sent, lat), stream) in t.sent.iter().zip(&t.lat).zip(&t.stream) {
        out.push_str(&format!("{sent} {lat:.0} {stream}\n"));
    }
    let path = std::path::Path::new(&dir).join(format!("{tag}.txt"));
    if let Err(e) = std::fs::write(&path, out) {
        eprintln!("latency dump {}: {e}", path.display());
    }
}

/// Figures of one configuration over all rounds.
#[derive(Default)]
struct Series {
    runs: Vec<StreamRun>,
    /// The round of each run.
    rounds: Vec<usize>,
}

impl Series {
    fn push(&mut self, round: usize, run: StreamRun) {
        self.rounds.push(round);
        self.runs.push(run);
    }
    /// Median over rounds of this path's rate ÷ `base`'s rate in the same
    /// round (paired, so slow drift of the machine cancels out).
    fn ratio_to(&self, base: &Series) -> f64 {
        let mut v = Vec::new();
        for (round, run) in self.rounds.iter().zip(&self.runs) {
            if let Some(i) = base.rounds.iter().position(|r| r == round) {
                v.push(run.rate / base.runs[i].rate);
            }
        }
        median(v)
    }
    fn rate(&self) -> f64 {
        median(self.runs.iter().map(|r| r.rate).collect())
    }
    /// Relay CPU per million relayed actions, ms (median over runs).
    /// The proxy's CPU per 1M actions; NaN (not measured, so no target reads
    /// met) when no run read any: a process that relayed frames with no CPU
    /// is not the one that did the work (a wrapper, such as a profiler's).
    fn relay_ms_per_m(&self) -> f64 {
        median(
            self.runs
                .iter()
                .filter_map(|r| {
                    r.relay_cpu_ns
                        .filter(|&ns| ns > 0)
                        .map(|ns| (ns, r.actions))
                })
                .map(|(ns, actions)| ns as f64 / 1e6 / actions as f64 * 1e6)
                .collect(),
        )
    }
    fn relay_kernel_share(&self) -> f64 {
        median(
            self.runs
                .iter()
                .filter_map(|r| r.relay_kernel_share)
                .collect(),
        )
    }
    fn relay_tick_ms_per_m(&self) -> f64 {
        median(
            self.runs
                .iter()
                .filter_map(|r| Some(r.relay_cpu_tick_ms? / r.actions as f64 * 1e6))
                .collect(),
        )
    }
    /// Simhost and client CPU per million actions, ms.
    fn host_client_ms_per_m(&self) -> (f64, f64) {
        let per = |f: fn(&StreamRun) -> u64| {
            median(
                self.runs
                    .iter()
                    .map(|r| f(r) as f64 / r.actions as f64 * 1e6 / 1e6)
                    .collect(),
            )
        };
        (per(|r| r.host_cpu_ns), per(|r| r.client_cpu_ns))
    }
    /// Cores busy during the run: simhost, clients, relay.
    fn cores(&self) -> (f64, f64, f64) {
        let busy = |f: fn(&StreamRun) -> Option<u64>| {
            median(
                self.runs
                    .iter()
                    .filter_map(|r| Some(f(r)? as f64 / 1e9 / r.wall.as_secs_f64()))
                    .collect(),
            )
        };
        (
            busy(|r| Some(r.host_cpu_ns)),
            busy(|r| Some(r.client_cpu_ns)),
            busy(|r| r.relay_cpu_ns),
        )
    }
    fn frame_bytes(&self) -> f64 {
        median(self.runs.iter().map(|r| r.frame_bytes).collect())
    }
    fn spread(&self) -> String {
        let mut v: Vec<f64> = self.runs.iter().map(|r| r.rate).collect();
        v.sort_by(f64::total_cmp);
        match (v.first(), v.last()) {
            (Some(a), Some(b)) => format!("{:.0}–{:.0}", a / 1e3, b / 1e3),
            _ => "-".into(),
        }
    }
    /// The proxy's busiest threads as cores, busiest first: the median over
    /// runs of each rank.
    fn busiest(&self) -> Vec<f64> {
        let ranks = self
            .runs
            .iter()
            .map(|r| r.relay_busiest.len())
            .max()
            .unwrap_or(0);
        (0..ranks)
            .map(|i| {
                median(
                    self.runs
                        .iter()
                        .filter_map(|r| r.relay_busiest.get(i).copied())
                        .collect(),
                )
            })
            .collect()
    }
}

struct Throughput {
    /// [one stream, many streams] × paths (direct, relay wss://, relay ws://,
    /// the installed peers, floor).
    series: [Vec<Series>; 2],
    /// The labels of the paths measured (see [`PATHS`]).
    paths: Vec<String>,
    errors: Vec<String>,
    /// Runs that ended with the client closed or cut off, per path.
    disconnects: Vec<usize>,
    /// The TLS relay's memory around the runs.
    memory: Option<ReplayRss>,
}

impl Throughput {
    /// The path whose label starts with `name` (e.g. `nginx`).
    fn path(&self, name: &str) -> Option<usize> {
        self.paths.iter().position(|p| p.starts_with(name))
    }
}

/// A relay's resident memory before and after the throughput runs, and what its
/// replay buffers account for at the end (`ahp_relay_buffer_bytes`).
struct ReplayRss {
    rss_before: u64,
    rss_after: u64,
    accounted: u64,
}

impl ReplayRss {
    async fn after(relay: &RelayProc, rss_before: u64) -> Option<Self> {
        // Let detached sessions settle (their links close, queues drain).
        tokio::time::sleep(Duration::from_secs(1)).await;
        let accounted = buffer_bytes(relay).await.ok()?;
        Some(Self {
            rss_before,
            rss_after: relay.rss(),
            accounted,
        })
    }

    /// RSS growth over the runs ÷ replay bytes accounted.
    fn ratio(&self) -> f64 {
        self.rss_after.saturating_sub(self.rss_before) as f64 / self.accounted.max(1) as f64
    }
}

const PATHS: [&str; 7] = [
    "direct ws://",
    "relay wss://",
    "relay ws://",
    "nginx wss://",
    "haproxy wss://",
    "floor wss://",
    "work floor wss://",
];

/// The two simhosts (one stream, many streams) of one path.
async fn host_pair(tag: &str, s: &Settings) -> Result<[SimHost; 2]> {
    Ok([
        start_host(&format!("one-{tag}"), s.rounds, script(1, 0)).await?,
        start_host(
            &format!("many-{tag}"),
            s.rounds * s.many_streams,
            script(1, 0),
        )
        .await?,
    ])
}

/// The proxies of the throughput section, each in front of its own pair of
/// simhosts: `hosts` = direct, relay wss://, relay ws://, each installed
/// peer, floor.
struct Proxies {
    hosts: Vec<[SimHost; 2]>,
    tls: RelayProc,
    plain: RelayProc,
    peers: Vec<(&'static str, [Peer; 2])>,
    floor: Floor,
    work: Floor,
}

/// One path of the throughput section: its label, its endpoints (one
/// stream, many streams) and what is measured on each.
type TPath<'a> = (String, [Endpoint; 2], [Option<&'a dyn Measured>; 2]);

impl Proxies {
    async fn start(s: &Settings) -> Result<Self> {
        // Each path gets its own pair of identical simhosts: a host serves one
        // relay's watch link only (two relays in front of one host would take
        // turns superseding each other's watch link, which uses a fixed clientId).
        let peers: Vec<&'static str> = PEERS.into_iter().filter(|p| installed(p)).collect();
        let mut hosts = Vec::new();
        for tag in ["d", "t", "p"]
            .into_iter()
            .chain(peers.iter().copied())
            .chain(["f", "w"])
        {
            hosts.push(host_pair(tag, s).await?);
        }
        let both = |h: &[SimHost; 2]| [pair(&h[0]), pair(&h[1])];
        let tls = RelayProc::start("tput-tls", &both(&hosts[1]), true, "").await?;
        let plain = RelayProc::start("tput-plain", &both(&hosts[2]), false, "").await?;
        let (cert, key) = (tls.kit.cert.clone(), tls.kit.key.clone());
        let mut proxies = Vec::new();
        for (i, kind) in peers.iter().enumerate() {
            let h = &hosts[3 + i];
            proxies.push((
                *kind,
                [
                    Peer::start(kind, &h[0].url(), &cert, &key).await?,
                    Peer::start(kind, &h[1].url(), &cert, &key).await?,
                ],
            ));
        }
        let f = &hosts[3 + peers.len()];
        let floor = Floor::start(&[f[0].url(), f[1].url()], &cert, &key, false)?;
        let w = &hosts[4 + peers.len()];
        let work = Floor::start(&[w[0].url(), w[1].url()], &cert, &key, true)?;
        Ok(Proxies {
            hosts,
            tls,
            plain,
            peers: proxies,
            floor,
            work,
        })
    }

    /// Every path, in the order of `hosts`.
    fn paths(&self) -> Vec<TPath<'_>> {
        let h = &self.hosts[0];
        let ca = &self.tls.kit.cert;
        let (tls, plain, floor, work): (
            &dyn Measured,
            &dyn Measured,
            &dyn Measured,
            &dyn Measured,
        ) = (&self.tls, &self.plain, &self.floor, &self.work);
        let mut out: Vec<TPath> = vec![
            (
                PATHS[0].into(),
                [
                    Endpoint::direct("direct", &h[0]),
                    Endpoint::direct("direct", &h[1]),
                ],
                [None, None],
            ),
            (
                PATHS[1].into(),
                [
                    self.tls.endpoint("relay-tls"),
                    self.tls.endpoint("relay-tls"),
                ],
                [Some(tls), Some(tls)],
            ),
            (
                PATHS[2].into(),
                [
                    self.plain.endpoint("relay-plain"),
                    self.plain.endpoint("relay-plain"),
                ],
                [Some(plain), Some(plain)],
            ),
        ];
        for (kind, [one, many]) in &self.peers {
            out.push((
                format!("{kind} wss://"),
                [one.endpoint(kind, ca), many.endpoint(kind, ca)],
                [Some(one as &dyn Measured), Some(many as &dyn Measured)],
            ));
        }
        out.push((
            PATHS[5].into(),
            [self.floor.endpoint(0, ca), self.floor.endpoint(1, ca)],
            [Some(floor), Some(floor)],
        ));
        out.push((
            PATHS[6].into(),
            [self.work.endpoint(0, ca), self.work.endpoint(1, ca)],
            [Some(work), Some(work)],
        ));
        out
    }

    async fn stop(self) {
        drop((self.tls, self.plain, self.peers, self.floor, self.work));
        for [a, b] in self.hosts {
            stop_host(a).await;
            stop_host(b).await;
        }
    }
}

async fn throughput(s: &Settings, ticks: u64) -> Result<Throughput> {
    let proxies = Proxies::start(s).await?;
    let tls_rss_before = proxies.tls.rss();
    let paths = proxies.paths();
    let n = paths.len();
    let mut out = Throughput {
        series: [
            (0..n).map(|_| Series::default()).collect(),
            (0..n).map(|_| Series::default()).collect(),
        ],
        paths: paths.iter().map(|p| p.0.clone()).collect(),
        errors: Vec::new(),
        disconnects: vec![0; n],
        memory: None,
    };
    for round in 0..s.rounds {
        for k in 0..n {
            // Rotate the order so no path always runs first.
            let p = (k + round) % n;
            let (_, [ep_one, ep_many], [m_one, m_many]) = &paths[p];
            let name = |i: usize| proxies.hosts[p][i].config().name.clone();
            let runs = [
                (ep_one, *m_one, (name(0), round + 1, 1, s.one_stream_deltas)),
                (
                    ep_many,
                    *m_many,
                    (
                        name(1),
                        round * s.many_streams + 1,
                        s.many_streams,
                        s.many_deltas,
                    ),
                ),
            ];
            for (k, (ep, m, (host, first, streams, deltas))) in runs.into_iter().enumerate() {
                let tag = format!("r{round}-{}-{}", ep.label, ["one", "many"][k]);
                match stream_run(ep, m, (&host, first, streams, deltas), &tag, ticks, false).await {
                    Ok(r) => out.series[k][p].push(round, r),
                    Err(e) => {
                        out.disconnects[p] += 1;
                        out.errors.push(failure(&tag, &e, m));
                    }
                }
            }
        }
    }
    out.memory = ReplayRss::after(&proxies.tls, tls_rss_before).await;
    drop(paths);
    proxies.stop().await;
    Ok(out)
}

/// A failed run, with what the relay logged last.
fn failure(tag: &str, e: &BoxError, relay: Option<&dyn Measured>) -> String {
    let log = relay.map(|r| r.last_log()).unwrap_or_default();
    let log: Vec<&str> = log.lines().rev().take(4).collect();
    if log.is_empty() {
        format!("{tag}: {e}")
    } else {
        format!(
            "{tag}: {e}\n      relay log (last lines, newest first): {}",
            log.join("\n      ")
        )
    }
}

// ─── 3: added latency at a paced load ───────────────────────────────────────

/// Streams of the paced load, and deltas per second each (§10: 50 × 1000/s).
const PACED_STREAMS: usize = 50;
const PACED_PER_STREAM: u32 = 1000;

/// Deltas per second per paced stream: [`PACED_PER_STREAM`], or
/// `AHP_BENCH_PACED_RATE` (a lighter load, e.g. for a path run under
/// `valgrind --tool=callgrind` through `AHP_BENCH_ALT_BIN`, where the
/// figures that count are instructions per action, not time).
fn paced_rate() -> u32 {
    std::env::var("AHP_BENCH_PACED_RATE")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&r| r > 0)
        .unwrap_or(PACED_PER_STREAM)
}

/// One figure of a run's latency (e.g. its p50).
type LatOf = fn(&Lat) -> f64;

/// End-to-end latency of one run's deltas: arrival − send stamp, µs.
#[derive(Clone, Copy, Debug)]
struct Lat {
    p50: f64,
    p99: f64,
    max: f64,
    samples: usize,
    /// Deltas whose send stamp could not be read (an error if not 0).
    unstamped: u64,
}

impl Lat {
    fn of(mut us: Vec<f64>, unstamped: u64) -> Lat {
        us.sort_by(f64::total_cmp);
        Lat {
            p50: percentile(&us, 50.0),
            p99: percentile(&us, 99.0),
            max: us.last().copied().unwrap_or(f64::NAN),
            samples: us.len(),
            unstamped,
        }
    }
}

/// A simhost whose `[stream:<n>]` turns are each paced at
/// [`PACED_PER_STREAM`], with `sessions` fresh chats. Up to 4 s of frames
/// may wait to be written, so a slow path delays frames after their stamp
/// (latency) and never holds the stamp back (which would hide it).
async fn paced_host(name: &str, sessions: usize) -> Result<SimHost> {
    let mut config = SimHostConfig {
        sessions,
        stream_rate: paced_rate(),
        stream_in_flight: 4 * paced_rate() as usize,
        replay_log: 20_000,
        record_limit: 16,
        record_write_waits: true,
        ..SimHostConfig::named(name)
    };
    if let Some(bytes) = paced_frame_bytes() {
        config.stream_frame_bytes = bytes;
    }
    config.stream_frame_jitter = paced_frame_jitter();
    start_configured(config).await
}

/// Section 3's host frames spread over the frame size ± half this many
/// bytes by default, as real deltas vary: at one fixed size a receiver's
/// window rounding decides which path's clients acknowledge segments on
/// arrival and which from their reads (BENCHMARKS.md, twenty-third and
/// twenty-fourth rounds), a lottery six bytes turn around.
const PACED_FRAME_JITTER: usize = 64;

/// `AHP_BENCH_PACED_FRAME_JITTER`: the spread of section 3's host frame
/// sizes in bytes (0: every frame one size); [`PACED_FRAME_JITTER`] if unset.
fn paced_frame_jitter() -> usize {
    std::env::var("AHP_BENCH_PACED_FRAME_JITTER")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(PACED_FRAME_JITTER)
}

/// `AHP_BENCH_PACED_FRAME_BYTES`: the size of section 3's host frames, if
/// set (the simhost's default otherwise).
fn paced_frame_bytes() -> Option<usize> {
    std::env::var("AHP_BENCH_PACED_FRAME_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&b| b > 0)
}

struct Latency {
    /// Per path (`paths`), every round's run.
    series: Vec<Series>,
    paths: Vec<String>,
    /// Deltas each run sent (all streams) and the seconds it was paced over.
    sent: u64,
    secs: f64,
    errors: Vec<String>,
}

impl Latency {
    /// Median over rounds of `f` of `path`'s latency.
    fn med(&self, path: usize, f: LatOf) -> f64 {
        median(self.values(path, f).into_iter().map(|(_, v)| v).collect())
    }

    /// `f` of `path`'s latency in each round it ran.
    fn values(&self, path: usize, f: LatOf) -> Vec<(usize, f64)> {
        let Some(s) = self.series.get(path) else {
            return Vec::new();
        };
        s.rounds
            .iter()
            .zip(&s.runs)
            .filter_map(|(r, run)| Some((*r, f(run.latency.as_ref()?))))
            .collect()
    }

    /// `f` of `path` − `f` of direct in the same round, for every round.
    fn added(&self, path: usize, f: LatOf) -> Vec<f64> {
        self.added_by_round(path, f)
            .into_iter()
            .map(|(_, v)| v)
            .collect()
    }

    /// `added`, each with its round.
    fn added_by_round(&self, path: usize, f: LatOf) -> Vec<(usize, f64)> {
        let direct = self.values(0, f);
        self.values(path, f)
            .into_iter()
            .filter_map(|(r, v)| Some((r, v - direct.iter().find(|(d, _)| *d == r)?.1)))
            .collect()
    }

    /// The path whose label starts with `name` (e.g. `nginx`).
    fn path(&self, name: &str) -> Option<usize> {
        self.paths.iter().position(|p| p.starts_with(name))
    }
}

/// `min–max` of `v`, or `-`.
fn min_max(v: &[f64]) -> String {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if v.is_empty() {
        "-".into()
    } else {
        format!("{lo:.0}–{hi:.0}")
    }
}

/// The paced load's floors (`Floor::start_per_core`) and the relay with its
/// connections on the shared runtime (`[listen] edge_threads = 0`).
const FLOOR_CORE: &str = "floor/core wss://";
const WORK_FLOOR_CORE: &str = "work floor/core wss://";
/// The same floors, each in a process of its own ([`FloorProc`]).
const FLOOR_PROC: &str = "floor/proc wss://";
const WORK_FLOOR_PROC: &str = "work floor/proc wss://";
const RELAY_SHARED: &str = "relay, shared rt wss://";
/// Section 3's A/B path: the binary `AHP_BENCH_ALT_BIN` names, as "relay".
const RELAY_ALT: &str = "relay (alt) wss://";

/// [`PACED_STREAMS`] clients, each subscribed to its own fresh chat, start
/// one `[stream:<n>]` turn each on a host paced at [`PACED_PER_STREAM`] per
/// stream, through each path in turn (the order rotates every round); every
/// delta's latency is its arrival − the send stamp in its text. Each path
/// has its own identical host (see `throughput`).
async fn latency(s: &Settings, ticks: u64) -> Result<Latency> {
    let peers: Vec<&'static str> = PEERS.into_iter().filter(|p| installed(p)).collect();
    let sessions = s.latency_runs * PACED_STREAMS;
    let mut hosts = Vec::new();
    let tags = ["d", "t", "p", "n", "h"].into_iter().take(3 + peers.len());
    for tag in tags.chain(["f", "w", "s", "fp", "wp"]) {
        hosts.push(paced_host(&format!("lat-{tag}"), sessions).await?);
    }
    let tls = RelayProc::start("lat-tls", &[pair(&hosts[1])], true, "").await?;
    let plain = RelayProc::start("lat-plain", &[pair(&hosts[2])], false, "").await?;
    let (cert, key) = (tls.kit.cert.clone(), tls.kit.key.clone());
    let mut proxies = Vec::new();
    for (i, kind) in peers.iter().enumerate() {
        proxies.push(Peer::start(kind, &hosts[3 + i].url(), &cert, &key).await?);
    }
    let n = 3 + peers.len();
    let floor = Floor::start_per_core(&[hosts[n].url()], &cert, &key, false)?;
    let work = Floor::start_per_core(&[hosts[n + 1].url()], &cert, &key, true)?;
    let shared = RelayProc::start("lat-tls-shared", &[pair(&hosts[n + 2])], true, "").await?;
    let floor_proc = FloorProc::start(&hosts[n + 3].url(), &cert, &key, false)?;
    let work_proc = FloorProc::start(&hosts[n + 4].url(), &cert, &key, true)?;
    let alt = match std::env::var_os("AHP_BENCH_ALT_BIN") {
        Some(_) => {
            hosts.push(paced_host("lat-a", sessions).await?);
            let h = pair(&hosts[n + 5]);
            Some(RelayProc::start("lat-tls-alt", &[h], true, "").await?)
        }
        None => None,
    };
    let mut eps: Vec<(Endpoint, Option<&dyn Measured>)> = vec![
        (Endpoint::direct("direct", &hosts[0]), None),
        (tls.endpoint("relay-tls"), Some(&tls)),
        (plain.endpoint("relay-plain"), Some(&plain)),
    ];
    let mut paths: Vec<String> = PATHS[..3].iter().map(|p| p.to_string()).collect();
    for (p, kind) in proxies.iter().zip(&peers) {
        eps.push((p.endpoint(kind, &cert), Some(p as &dyn Measured)));
        paths.push(format!("{kind} wss://"));
    }
    for (f, path) in [(&floor, FLOOR_CORE), (&work, WORK_FLOOR_CORE)] {
        eps.push((f.endpoint(0, &cert), Some(f as &dyn Measured)));
        paths.push(path.into());
    }
    eps.push((shared.endpoint("relay-shared"), Some(&shared)));
    paths.push(RELAY_SHARED.into());
    for (f, path) in [(&floor_proc, FLOOR_PROC), (&work_proc, WORK_FLOOR_PROC)] {
        eps.push((f.endpoint(&cert), Some(f as &dyn Measured)));
        paths.push(path.into());
    }
    if let Some(alt) = &alt {
        eps.push((alt.endpoint("relay-alt"), Some(alt)));
        paths.push(RELAY_ALT.into());
    }
    let per_stream = (f64::from(paced_rate()) * s.latency_secs) as u64;
    let mut out = Latency {
        series: (0..eps.len()).map(|_| Series::default()).collect(),
        paths,
        sent: per_stream * PACED_STREAMS as u64,
        secs: s.latency_secs,
        errors: Vec::new(),
    };
    for round in 0..s.latency_runs {
        for p in round_order(eps.len(), round, alt.is_some()) {
            let (ep, m) = &eps[p];
            let tag = format!("lat{round}-{}", ep.label);
            let host = hosts[p].config().name.clone();
            let load = (&*host, round * PACED_STREAMS + 1, PACED_STREAMS, per_stream);
            hosts[p].take_write_waits();
            match stream_run(ep, *m, load, &tag, ticks, true).await {
                Ok(mut r) => {
                    r.host_wait = wait_quantiles(hosts[p].take_write_waits());
                    out.series[p].push(round, r);
                }
                Err(e) => out.errors.push(failure(&tag, &e, *m)),
            }
        }
    }
    drop((tls, plain, proxies, floor, work, shared, alt));
    drop((floor_proc, work_proc));
    for h in hosts {
        stop_host(h).await;
    }
    Ok(out)
}

/// p50 and p99 of a run's host write waits (µs), if any were noted.
fn wait_quantiles(mut waits: Vec<u32>) -> Option<(f64, f64)> {
    waits.sort_unstable();
    let at = |q: f64| {
        let i = ((waits.len() as f64 * q) as usize).min(waits.len().checked_sub(1)?);
        waits.get(i).map(|w| f64::from(*w))
    };
    Some((at(0.5)?, at(0.99)?))
}

/// The order of section 3's paths in `round`: rotated by the round, so no
/// path always runs right after the same one. The A/B build (last of `len`
/// when `alt`) runs next to the relay (index 1), after it in even rounds and
/// before it in odd ones: the two builds always share a neighbourhood and
/// take turns going first (a fixed slot won most rounds whichever build ran
/// in it).
fn round_order(len: usize, round: usize, alt: bool) -> Vec<usize> {
    let rotated = if alt { len.saturating_sub(1) } else { len };
    let mut order: Vec<usize> = (0..rotated).map(|k| (k + round) % rotated).collect();
    if alt {
        let relay = order.iter().position(|&p| p == 1).unwrap_or(0);
        order.insert(relay + usize::from(round.is_multiple_of(2)), rotated);
    }
    order
}

// ─── 4: memory per idle TLS client ──────────────────────────────────────────

struct Memory {
    clients: usize,
    rss_before: u64,
    rss_after: u64,
    host_conns_before: usize,
    host_conns_after: usize,
    open_secs: f64,
    /// Relay cores busy over 2 s with every client idle, and over the 2 s
    /// after `closed` of them closed their sockets with a close handshake.
    idle_cores: f64,
    closed: usize,
    after_drop_cores: f64,
    after_close_cores: f64,
}

/// Cores the relay process uses over the next `secs` seconds.
async fn relay_cores_over(relay: &RelayProc, secs: f64) -> f64 {
    let before = relay.cpu();
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    relay.cpu().ns_since(&before) as f64 / 1e9 / secs
}

async fn memory(s: &Settings) -> Result<Memory> {
    let host = start_host("idle", 3, AgentScript::default()).await?;
    let relay = RelayProc::start("mem", &[pair(&host)], true, "").await?;
    let ep = relay.endpoint("relay-tls");
    let open = |i: usize| {
        let ep = ep.clone();
        tokio::spawn(async move {
            let sub = format!("idle-{i}");
            let mut c = ep.connect(&sub).await?;
            c.initialize(&sub).await?;
            c.request("subscribe", json!({ "channel": ROOT })).await?;
            Ok(c)
        })
    };
    // Warm-up: one client, so one-time allocations are not counted per client.
    let warm = join_all(vec![open(usize::MAX)]).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let host_conns_before = host.connections();
    let rss_before = relay.rss();
    let started = Instant::now();
    let mut clients = Vec::with_capacity(s.idle_clients);
    let mut i = 0;
    while i < s.idle_clients {
        let batch = (s.idle_clients - i).min(32);
        clients.extend(join_all((i..i + batch).map(open).collect()).await?);
        i += batch;
    }
    let open_secs = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_after = relay.rss();
    let host_conns_after = host.connections();
    let idle_cores = relay_cores_over(&relay, 2.0).await;
    let closed = clients.len().min(50) / 2;
    for c in clients.drain(..closed) {
        c.hang_up();
    }
    let after_drop_cores = relay_cores_over(&relay, 2.0).await;
    let closing: Vec<JoinHandle<Result<()>>> = clients
        .drain(..closed)
        .map(|c| {
            tokio::spawn(async move {
                c.close().await;
                Ok(())
            })
        })
        .collect();
    join_all(closing).await?;
    let after_close_cores = relay_cores_over(&relay, 2.0).await;
    for c in clients.into_iter().chain(warm) {
        drop(c);
    }
    drop(relay);
    stop_host(host).await;
    Ok(Memory {
        clients: s.idle_clients,
        rss_before,
        rss_after,
        host_conns_before,
        host_conns_after,
        open_secs,
        idle_cores,
        closed,
        after_drop_cores,
        after_close_cores,
    })
}

// ─── 5: listSessions over many hosts ────────────────────────────────────────

struct ListSessions {
    hosts: usize,
    sessions: usize,
    host_start_secs: f64,
    relay_ready_secs: f64,
    hosts_on_page: usize,
    relay_rss: u64,
    relay_ms: Vec<f64>,
    second_page_ms: Vec<f64>,
    direct_ms: Vec<f64>,
}

async fn list_sessions(s: &Settings) -> Result<ListSessions> {
    let started = Instant::now();
    let mut hosts = Vec::with_capacity(s.list_hosts);
    for i in 0..s.list_hosts {
        hosts.push(start_host(&format!("h{i:03}"), s.list_sessions, AgentScript::default()).await?);
    }
    let host_start_secs = started.elapsed().as_secs_f64();
    let pairs: Vec<_> = hosts.iter().map(pair).collect();
    let started = Instant::now();
    let relay = RelayProc::start("list", &pairs, true, "").await?;
    let ep = relay.endpoint("relay-tls");
    let mut c = ep.connect("lister").await?;
    c.initialize("lister").await?;
    // Wait until every host's catalog is in: the newest page holds the two
    // newest sessions of every host (seeded a minute apart, hosts started
    // within a few seconds), so all hosts appear on it once all are loaded.
    let want = s.list_hosts.min(100);
    let hosts_on_page = loop {
        let r = c
            .request("listSessions", json!({"channel": ROOT, "limit": 200}))
            .await?;
        let mut seen: Vec<&str> = r["items"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter_map(|i| i["resource"].as_str()?.split('~').next())
                    .collect()
            })
            .unwrap_or_default();
        seen.sort_unstable();
        seen.dedup();
        if seen.len() >= want || started.elapsed() > Duration::from_secs(120) {
            break seen.len();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let relay_ready_secs = started.elapsed().as_secs_f64();
    let mut relay_ms = Vec::new();
    let mut second_page_ms = Vec::new();
    for _ in 0..s.list_reps {
        let (took, r) = c
            .request_timed("listSessions", json!({"channel": ROOT, "limit": 200}))
            .await?;
        if r["items"].as_array().map_or(0, Vec::len) != 200 {
            return Err(format!("page of {} items", r["items"]).into());
        }
        relay_ms.push(took.as_secs_f64() * 1e3);
        if let Some(cur) = r["nextCursor"].as_str() {
            let (took, _) = c
                .request_timed(
                    "listSessions",
                    json!({"channel": ROOT, "limit": 200, "cursor": cur}),
                )
                .await?;
            second_page_ms.push(took.as_secs_f64() * 1e3);
        }
    }
    drop(c);
    let relay_rss = relay.rss();
    // Context: one host answering directly (its own 1000 sessions).
    let direct = Endpoint::direct("direct", &hosts[0]);
    let mut d = direct.connect("lister").await?;
    d.initialize("lister").await?;
    let mut direct_ms = Vec::new();
    for _ in 0..s.list_reps {
        let (took, _) = d
            .request_timed("listSessions", json!({"channel": ROOT, "limit": 200}))
            .await?;
        direct_ms.push(took.as_secs_f64() * 1e3);
    }
    d.close().await;
    drop(relay);
    for h in hosts {
        stop_host(h).await;
    }
    Ok(ListSessions {
        hosts: s.list_hosts,
        sessions: s.list_sessions,
        host_start_secs,
        relay_ready_secs,
        hosts_on_page,
        relay_rss,
        relay_ms,
        second_page_ms,
        direct_ms,
    })
}

// ─── 6: 4096-envelope replay ────────────────────────────────────────────────

struct Replay {
    envelopes: usize,
    relay_ms: Vec<f64>,
    relay_bytes: usize,
    direct_ms: Vec<f64>,
    direct_bytes: usize,
    holders: Holders,
    streamed: Streamed,
}

/// Relay memory kept per client after a large snapshot went through its
/// link: `count` clients (each its own session and link) subscribe to the
/// filled chat and stay connected.
struct Holders {
    count: usize,
    snapshot_bytes: usize,
    rss_before: u64,
    rss_after: u64,
}

/// `count` subscribers of `chat`, held open while the relay's RSS settles.
async fn hold_snapshots(
    relay: &RelayProc,
    ep: &Endpoint,
    chat: &str,
    count: usize,
) -> Result<Holders> {
    let rss_before = relay.rss();
    let mut held = Vec::new();
    let mut snapshot_bytes = 0;
    for i in 0..count {
        let mut c = ep.connect(&format!("holder-{i}")).await?;
        c.initialize(&format!("holder-{i}")).await?;
        let snapshot = c.request("subscribe", json!({ "channel": chat })).await?;
        snapshot_bytes = snapshot.to_string().len();
        held.push(c);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_after = relay.rss();
    drop(held);
    Ok(Holders {
        count,
        snapshot_bytes,
        rss_before,
        rss_after,
    })
}

/// Relay memory kept per client, beyond its replay buffer, after a paced
/// stream of small frames went through its link (a live chat's deltas):
/// `count` clients (each its own session and link) stream
/// [`STREAMED_DELTAS`] deltas each at [`PACED_PER_STREAM`] a second and
/// stay connected, in two halves: the second half's growth alone is what
/// one more client costs, without what the relay allocates once for the
/// first clients (thread heaps, pools).
struct Streamed {
    count: usize,
    /// Clients of the first half.
    half: usize,
    rss_before: u64,
    /// After the first half.
    rss_mid: u64,
    rss_after: u64,
    /// Growth of `ahp_relay_buffer_bytes` over the first half and over all.
    accounted_mid: u64,
    accounted: u64,
}

impl Streamed {
    /// RSS per client beyond the replay buffers: over all clients, and over
    /// the second half alone.
    fn beyond_per_client(&self) -> (f64, f64) {
        let per = |rss: u64, base: u64, accounted: u64, n: usize| {
            (rss as f64 - base as f64 - accounted as f64) / n.max(1) as f64
        };
        let all = per(self.rss_after, self.rss_before, self.accounted, self.count);
        let second = per(
            self.rss_after,
            self.rss_mid,
            self.accounted.saturating_sub(self.accounted_mid),
            self.count - self.half,
        );
        (all, second)
    }
}

/// Deltas each client of [`hold_streamed`] streams: ~160 KiB through its
/// link, more than a 64 KiB read buffer.
const STREAMED_DELTAS: u64 = 500;

/// What the relay's replay buffers account for now (`ahp_relay_buffer_bytes`).
async fn buffer_bytes(relay: &RelayProc) -> Result<u64> {
    let page = relay.get("/metrics").await?;
    let v = page
        .lines()
        .find_map(|l| l.strip_prefix("ahp_relay_buffer_bytes "))
        .ok_or("no ahp_relay_buffer_bytes")?;
    Ok(v.trim().parse()?)
}

/// Clients `clients` each stream [`STREAMED_DELTAS`] deltas on a chat of
/// their own, [`PACED_STREAMS`] at a time; returns them still connected.
async fn stream_clients(ep: &Endpoint, clients: std::ops::Range<usize>) -> Result<Vec<Conn>> {
    let mut held = Vec::new();
    for wave in clients.clone().step_by(PACED_STREAMS) {
        let mut tasks = Vec::new();
        for i in wave..clients.end.min(wave + PACED_STREAMS) {
            let ep = ep.clone();
            tasks.push(tokio::spawn(async move {
                let chat = ep.chat("held", i + 1);
                let mut c = ep.subscriber(&format!("streamed-{i}"), &chat).await?;
                c.start_turn(&chat, &format!("held-turn-{i}"), Some(STREAMED_DELTAS))
                    .await?;
                let s = c.read_turn(false).await?;
                if s.deltas != STREAMED_DELTAS {
                    return Err(format!("{} of {STREAMED_DELTAS} deltas", s.deltas).into());
                }
                Ok(c)
            }));
        }
        held.extend(join_all(tasks).await?);
    }
    Ok(held)
}

async fn hold_streamed(count: usize) -> Result<Streamed> {
    let host = paced_host("held", count).await?;
    let relay = RelayProc::start("held", &[pair(&host)], true, "").await?;
    let ep = relay.endpoint("relay-tls");
    let (rss_before, accounted_before) = (relay.rss(), buffer_bytes(&relay).await?);
    let half = count / 2;
    let mut held = stream_clients(&ep, 0..half).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_mid = relay.rss();
    let accounted_mid = buffer_bytes(&relay).await?.saturating_sub(accounted_before);
    held.extend(stream_clients(&ep, half..count).await?);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_after = relay.rss();
    let accounted = buffer_bytes(&relay).await?.saturating_sub(accounted_before);
    drop(held);
    drop(relay);
    stop_host(host).await;
    Ok(Streamed {
        count,
        half,
        rss_before,
        rss_mid,
        rss_after,
        accounted_mid,
        accounted,
    })
}

/// `sub` subscribes `chat`, streams a turn longer than the buffer, and
/// returns the watermark after which exactly `keep` envelopes follow.
async fn fill(ep: &Endpoint, sub: &str, chat: &str, keep: usize) -> Result<u64> {
    let mut c = ep.subscriber(sub, chat).await?;
    c.start_turn(chat, &format!("{sub}-turn"), None).await?;
    let mut seqs = Vec::new();
    loop {
        let frame = c.recv().await?;
        if memmem::find(frame.as_bytes(), b"\"method\":\"action\"").is_none() {
            continue;
        }
        let v: Value = serde_json::from_str(frame.as_str())?;
        seqs.push(v["params"]["serverSeq"].as_u64().ok_or("no serverSeq")?);
        if v["params"]["action"]["type"] == "chat/turnComplete" {
            break;
        }
    }
    c.hang_up();
    if seqs.len() <= keep {
        return Err(format!("only {} envelopes streamed", seqs.len()).into());
    }
    Ok(seqs[seqs.len() - keep - 1])
}

/// Times `reps` reconnects of `sub` with `watermark`: from sending
/// `reconnect` on a fresh socket to receiving the whole answer.
async fn time_reconnects(
    ep: &Endpoint,
    sub: &str,
    chat: &str,
    watermark: u64,
    want: usize,
    reps: usize,
) -> Result<(Vec<f64>, usize)> {
    let mut times = Vec::new();
    let mut bytes = 0;
    for _ in 0..reps {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut c = ep.connect(sub).await?;
        let params = json!({"channel": ROOT, "clientId": sub,
            "lastSeenServerSeq": watermark, "subscriptions": [chat]});
        let id = c.next_id;
        let text = json!({"jsonrpc": "2.0", "id": id, "method": "reconnect", "params": params});
        let start = Instant::now();
        c.ws.send(Message::text(text.to_string()))
            .await
            .map_err(bad)?;
        let frame = c.recv().await?;
        let took = start.elapsed();
        let v: Value = serde_json::from_str(frame.as_str())?;
        let result = &v["result"];
        let got = result["actions"].as_array().map_or(0, Vec::len);
        if result["type"] != "replay" || got != want {
            return Err(format!(
                "expected a replay of {want}, got type {} with {got} actions (error {})",
                result["type"], v["error"]
            )
            .into());
        }
        bytes = frame.len();
        times.push(took.as_secs_f64() * 1e3);
        drop(c);
    }
    Ok((times, bytes))
}

async fn replay(s: &Settings) -> Result<Replay> {
    const KEEP: usize = 4096;
    let host = start_host("rep", 2, script(5000, 0)).await?;
    let relay = RelayProc::start("replay", &[pair(&host)], true, "").await?;
    let ep = relay.endpoint("relay-tls");
    let chat = ep.chat("rep", 1);
    let watermark = fill(&ep, "replayer", &chat, KEEP).await?;
    let (relay_ms, relay_bytes) =
        time_reconnects(&ep, "replayer", &chat, watermark, KEEP, s.replay_reps).await?;
    let holders = hold_snapshots(&relay, &ep, &chat, s.snapshot_holders).await?;
    let direct = Endpoint::direct("direct", &host);
    let chat = direct.chat("rep", 2);
    let watermark = fill(&direct, "replayer-direct", &chat, KEEP).await?;
    let (direct_ms, direct_bytes) = time_reconnects(
        &direct,
        "replayer-direct",
        &chat,
        watermark,
        KEEP,
        s.replay_reps,
    )
    .await?;
    drop(relay);
    stop_host(host).await;
    let streamed = hold_streamed(s.snapshot_holders).await?;
    Ok(Replay {
        envelopes: KEEP,
        relay_ms,
        relay_bytes,
        direct_ms,
        direct_bytes,
        holders,
        streamed,
    })
}

// ─── report ─────────────────────────────────────────────────────────────────

/// One row of the closing table.
struct Row {
    what: String,
    target: String,
    measured: String,
    ok: Option<bool>,
}

fn row(what: &str, target: &str, measured: String, ok: Option<bool>) -> Row {
    Row {
        what: what.into(),
        target: target.into(),
        measured,
        ok,
    }
}

/// Busy clock ticks of the whole machine (user + nice + system, all CPUs)
/// and of this process with its waited-for children (the relays).
fn busy_ticks() -> (u64, u64) {
    let machine = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| {
            let line = s.lines().next()?;
            let f: Vec<u64> = line
                .split_whitespace()
                .skip(1)
                .filter_map(|v| v.parse().ok())
                .collect();
            Some(f.first()? + f.get(1)? + f.get(2)?)
        })
        .unwrap_or(0);
    let mine = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            let rest = &s[s.rfind(')')? + 1..];
            let f: Vec<u64> = rest
                .split_whitespace()
                .skip(11)
                .take(4)
                .filter_map(|v| v.parse().ok())
                .collect();
            Some(f.iter().sum())
        })
        .unwrap_or(0);
    (machine, mine)
}

/// The machine's `steal` clock ticks (the hypervisor ran someone else while
/// this VM had work) and all its clock ticks, from `/proc/stat`; zeros where
/// unreadable.
fn stolen_ticks() -> (u64, u64) {
    let fields: Vec<u64> = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| {
            let line = s.lines().next()?.to_string();
            Some(
                line.split_whitespace()
                    .skip(1)
                    .take(8)
                    .filter_map(|v| v.parse().ok())
                    .collect(),
            )
        })
        .unwrap_or_default();
    (fields.get(7).copied().unwrap_or(0), fields.iter().sum())
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default();
    format!("{cores} cores ({cpu}), load average {load}")
}

fn report_throughput(t: &Throughput, rows: &mut Vec<Row>) {
    report_throughput_intro(t);
    for k in 0..2 {
        report_throughput_table(t, k);
    }
    report_busiest(t);
    for e in &t.errors {
        println!("   run failed: {e}");
    }
    println!();
    println!(
        "2. CPU per million relayed actions: the relay's (or the proxy's, all its processes; the floor's"
    );
    println!(
        "   two threads) CPU = the sum of /proc/<pid>/task/*/schedstat run time over the run, ÷ actions received."
    );
    for (k, name) in ["1 stream", "50 streams"].iter().enumerate() {
        let s = &t.series[k];
        for (p, path) in t.paths.iter().enumerate().skip(1) {
            println!(
                "   {name:<10} {path:>15} {:>6.0} ms [{:.0} ticks-ms], {:.0}% in the kernel",
                s[p].relay_ms_per_m(),
                s[p].relay_tick_ms_per_m(),
                100.0 * s[p].relay_kernel_share(),
            );
        }
    }
    let mut memory = Vec::new();
    report_replay_rss(t.memory.as_ref(), &mut memory);
    let targets = issue20_rows(t);
    println!("   Issue #20 targets, relay wss:// in this run (also in the closing table):");
    print_rows(&targets, "     ");
    rows.extend(targets);
    rows.extend(memory);
    for (k, (name, min)) in [("1 stream", 0.85), ("50 streams", 0.80)]
        .iter()
        .enumerate()
    {
        let ratio = t.series[k][1].ratio_to(&t.series[k][0]);
        rows.push(row(
            &format!("throughput, {name}, relay wss:// ÷ direct (§10)"),
            &format!("≥ {min:.2}×"),
            format!("{ratio:.2}×"),
            ratio.is_finite().then_some(ratio >= *min),
        ));
    }
    println!();
}

fn report_throughput_intro(t: &Throughput) {
    for line in [
        "1. Throughput of relayed chat/delta envelopes (deltas/s received, all streams, median of runs)",
        "   The load source is the simhost's streaming mode ([stream:<n>]: pre-rendered ~320-byte deltas,",
        "   flat out, paced only by TCP). direct = clients → simhost over plain ws://; relay wss:// =",
        "   clients ─TLS─ relay ─ws─ simhost; relay ws:// = the relay without TLS; nginx / haproxy wss:// =",
        "   the same simhost behind that proxy terminating TLS 1.3 with the relay's certificate. Paths take",
        "   turns within each round; ratio = median over rounds of path ÷ direct in the same round.",
        "   floor wss:// = a minimal TLS 1.3 byte forwarder in this process on the relay's stack (tokio,",
        "   tokio-rustls with ring, the same certificate; 64 KiB reads, each written as ≤ 2 KiB slices + flush, raw",
        "   bytes to its own simhost, no WebSocket parsing) on two threads of its own: what any design on",
        "   tokio + rustls pays for these bytes (TLS + syscalls), the floor under the relay.",
        "   work floor wss:// = the floor plus the per-frame work the contract asks of any relay design",
        "   (benches/relay/work_floor.rs): host frames parsed and UTF-8 checked, each validated by the",
        "   relay's own walk (wire::classify_host), its channel looked up and written back, serverSeq",
        "   renumbered per client, spliced into a batch arena, kept in a 4,096-envelope replay buffer,",
        "   re-framed; a departed client's buffer kept as a detached session's is (§5.7), under the relay's",
        "   default replay_memory_bytes (256 MiB, earliest dropped first); and, as every per-client link",
        "   does (§6.2), ahp-root:// subscribed upstream, the host's root/session* events read and dropped;",
        "   no session, lock, queue or routing: relay − work floor = the relay's design.",
    ] {
        println!("{line}");
    }
    if let Some(d) = t.series[0].first().map(Series::rate) {
        println!(
            "   Load source, direct, one stream: {d:.0} actions/s (§10: ≥ 1M/s so the host is not the limit)."
        );
    }
    print_in_memory(2_000);
    let missing: Vec<&str> = PEERS.into_iter().filter(|p| !installed(p)).collect();
    if !missing.is_empty() {
        println!(
            "   Not installed, so not compared: {} ({PEER_INSTALL}).",
            missing.join(", ")
        );
    }
    if let Some(tls) = t.series[0]
        .get(1)
        .and_then(|s| s.runs.first())
        .and_then(|r| r.tls.clone())
    {
        println!("   Client ↔ relay TLS: {tls}, ECDSA P-256 self-signed certificate.");
    }
}

/// The table of one workload (`k`: 0 = 1 stream, 1 = 50 streams).
fn report_throughput_table(t: &Throughput, k: usize) {
    let name = ["1 stream", "50 streams"][k];
    let s = &t.series[k];
    println!(
        "   {name:<10} {:>15} {:>9} {:>7} {:>12} {:>9} {:>6}   cores: host/clients/proxy",
        "path", "deltas/s", "ratio", "runs, k/s", "CPU/1M", "frame",
    );
    for (p, path) in t.paths.iter().enumerate() {
        let cpu = s[p].relay_ms_per_m();
        let cpu = if cpu.is_finite() {
            format!("{cpu:.0} ms")
        } else {
            "-".into()
        };
        let (h, c, rl) = s[p].cores();
        let (hm, cm) = s[p].host_client_ms_per_m();
        println!(
            "   {:<10} {path:>15} {:>9.0} {:>6.2}x {:>12} {cpu:>9} {:>5.0}B   {h:.2} / {c:.2} / {rl:.2}  (host {hm:.0}, clients {cm:.0} ms/1M)",
            "",
            s[p].rate(),
            s[p].ratio_to(&s[0]),
            s[p].spread(),
            s[p].frame_bytes(),
        );
    }
}

/// One line per single-process proxy: its busiest threads in the 1-stream
/// runs, so one hot stream on one core or on two can be told apart.
fn report_busiest(t: &Throughput) {
    for (p, path) in t.paths.iter().enumerate() {
        let top = t.series[0][p].busiest();
        if top.is_empty() {
            continue;
        }
        let top: Vec<String> = top.iter().map(|c| format!("{c:.2}")).collect();
        println!(
            "   1 stream, {path} busiest threads (cores, median per rank over runs): {}",
            top.join(" / ")
        );
    }
}

/// `f` of each comparison path present (nginx, haproxy, floor, work
/// floor), as `name figure` joined by commas.
fn others(t: &Throughput, k: usize, f: impl Fn(&Series) -> String) -> String {
    ["nginx", "haproxy", "floor", "work floor"]
        .iter()
        .filter_map(|name| Some(format!("{name} {}", f(&t.series[k][t.path(name)?]))))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Issue #20's targets for the relay over TLS, from this run: CPU per 1M ≤
/// nginx's and ≤ 450 ms, throughput ÷ direct ≥ nginx's (1 and 50 streams),
/// no disconnected run. A comparison with nginx is `-` when nginx is absent.
fn issue20_rows(t: &Throughput) -> Vec<Row> {
    let mut rows = Vec::new();
    let names = ["1 stream", "50 streams"];
    let nginx = t.path("nginx");
    for (k, name) in names.iter().enumerate() {
        let ms = t.series[k][1].relay_ms_per_m();
        let theirs = nginx.map_or(f64::NAN, |n| t.series[k][n].relay_ms_per_m());
        let peers = others(t, k, |s| format!("{:.0}", s.relay_ms_per_m()));
        rows.push(row(
            &format!("relay wss:// CPU per 1M actions, {name}"),
            "≤ nginx's",
            format!("{ms:.0} ms ({peers})"),
            (ms.is_finite() && theirs.is_finite()).then_some(ms <= theirs),
        ));
    }
    for (k, name) in names.iter().enumerate() {
        let ms = t.series[k][1].relay_ms_per_m();
        rows.push(row(
            &format!("relay wss:// CPU per 1M actions, {name} (§10)"),
            "≤ 450 ms",
            format!("{ms:.0} ms"),
            ms.is_finite().then_some(ms <= 450.0),
        ));
    }
    for (k, name) in names.iter().enumerate() {
        let s = &t.series[k];
        let ratio = s[1].ratio_to(&s[0]);
        let theirs = nginx.map_or(f64::NAN, |n| s[n].ratio_to(&s[0]));
        let peers = others(t, k, |x| format!("{:.2}×", x.ratio_to(&s[0])));
        rows.push(row(
            &format!("relay wss:// throughput ÷ direct, {name}"),
            "≥ nginx's",
            format!("{ratio:.2}× ({peers})"),
            (ratio.is_finite() && theirs.is_finite()).then_some(ratio >= theirs),
        ));
    }
    let relay_drops = t.disconnects.get(1).copied().unwrap_or(0);
    let others: Vec<String> = t
        .paths
        .iter()
        .zip(&t.disconnects)
        .filter(|(p, _)| !p.starts_with("relay wss"))
        .map(|(p, d)| format!("{} {d}", p.trim_end_matches("://")))
        .collect();
    rows.push(row(
        "disconnected runs at max rate, relay wss://",
        "0",
        format!("{relay_drops} ({})", others.join(", ")),
        Some(relay_drops == 0),
    ));
    rows
}

/// The TLS relay's resident memory after the throughput runs against what its
/// replay buffers account for (issue 11: RSS within ~1.2× of the accounted bytes).
fn report_replay_rss(m: Option<&ReplayRss>, rows: &mut Vec<Row>) {
    let Some(m) = m else {
        println!("   relay wss:// memory: not measured (no /metrics answer)");
        return;
    };
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    println!(
        "   relay wss:// memory: VmRSS {:.1} MiB before the runs → {:.1} MiB after them (1 s settle);",
        mib(m.rss_before),
        mib(m.rss_after)
    );
    println!(
        "   replay buffers of the sessions those runs left account for {:.1} MiB (ahp_relay_buffer_bytes):",
        mib(m.accounted)
    );
    println!(
        "   RSS growth ÷ accounted = {:.2}× (the rest is per-envelope overhead, queues, TLS, allocator)",
        m.ratio()
    );
    rows.push(row(
        "relay RSS growth ÷ accounted replay memory",
        "≤ 1.2×",
        format!(
            "{:.2}× ({:.0} MiB for {:.0} MiB)",
            m.ratio(),
            mib(m.rss_after.saturating_sub(m.rss_before)),
            mib(m.accounted)
        ),
        Some(m.ratio() <= 1.2),
    ));
}

fn report_latency(l: &Latency, rows: &mut Vec<Row>) {
    println!(
        "3. Latency at a paced load: {PACED_STREAMS} streams × {} deltas/s = {}k actions/s, {:.0} s per run",
        paced_rate(),
        f64::from(PACED_STREAMS as u32 * paced_rate()) / 1000.0,
        l.secs
    );
    println!(
        "   The load source is the simhost's streaming mode, each stream paced on its own at stream_rate {}/s;",
        paced_rate()
    );
    println!(
        "   host frames {} bytes ± {} (each frame's size fixed by its serverSeq: the same spread on every path);",
        paced_frame_bytes().unwrap_or(SimHostConfig::default().stream_frame_bytes),
        paced_frame_jitter() / 2
    );
    println!(
        "   each delta's text starts with its send time (µs since the epoch, stamped as the host renders it,"
    );
    println!(
        "   before it is queued to the socket). Latency of a delta = its arrival at the client (SystemTime) − that"
    );
    println!(
        "   stamp: same machine, same clock, every delta of every stream. Paths take turns within each round (each"
    );
    println!(
        "   its own host and fresh chats); added = path − direct in the same round. Medians over rounds, min–max."
    );
    println!(
        "   {FLOOR_CORE} and {WORK_FLOOR_CORE}: the floors of section 1 on one single-threaded runtime per core,"
    );
    println!(
        "   with the edge threads' time slice (the least tokio + rustls, and the contract's per-frame work on it,"
    );
    println!(
        "   cost at this load); {RELAY_SHARED}: the relay with its connections on the shared runtime"
    );
    println!(
        "   (edge_threads = 0, the kernel's default slice) instead of its edge threads. {FLOOR_PROC} and"
    );
    println!(
        "   {WORK_FLOOR_PROC}: the same floors each in a process of its own (this binary run again), as a proxy is."
    );
    println!(
        "   {:>23} {:>7} {:>11} {:>7} {:>13} {:>8} {:>15} {:>17}",
        "path", "p50 µs", "runs", "p99 µs", "runs", "max µs", "added p50 µs", "added p99 µs"
    );
    for (p, path) in l.paths.iter().enumerate() {
        let added = |f: LatOf| {
            let v = l.added(p, f);
            match p {
                0 => "-".to_string(),
                _ => format!("{:+.0} ({})", median(v.clone()), min_max(&v)),
            }
        };
        let vals = |f: LatOf| -> Vec<f64> { l.values(p, f).into_iter().map(|(_, v)| v).collect() };
        println!(
            "   {path:>23} {:>7.0} {:>11} {:>7.0} {:>13} {:>8.0} {:>15} {:>17}",
            l.med(p, |x| x.p50),
            min_max(&vals(|x| x.p50)),
            l.med(p, |x| x.p99),
            min_max(&vals(|x| x.p99)),
            l.med(p, |x| x.max),
            added(|x| x.p50),
            added(|x| x.p99),
        );
    }
    report_paced_load(l);
    report_host_waits(l);
    for e in &l.errors {
        println!("   run failed: {e}");
    }
    p99_against_nginx(l);
    alt_against_relay(l);
    latency_rows(l, rows);
    println!();
}

/// The A/B path against the relay, round by round (paired: the machine's
/// drift between rounds cancels; the order of paths rotates every round):
/// CPU per 1M and added p99, alt − relay.
fn alt_against_relay(l: &Latency) {
    let (Some(alt), Some(relay)) = (l.path(RELAY_ALT), l.path("relay wss://")) else {
        return;
    };
    let cpu = |p: usize| -> Vec<(usize, f64)> {
        let s = &l.series[p];
        s.rounds
            .iter()
            .zip(&s.runs)
            .filter_map(|(r, run)| Some((*r, run.relay_cpu_ns? as f64 / run.actions as f64)))
            .collect()
    };
    let paired = |a: Vec<(usize, f64)>, b: Vec<(usize, f64)>| -> Vec<(usize, f64)> {
        a.iter()
            .filter_map(|(r, v)| Some((*r, v - b.iter().find(|(q, _)| q == r)?.1)))
            .collect()
    };
    let p99 = |p: usize| l.added_by_round(p, |x| x.p99);
    for (what, d, unit) in [
        ("CPU per 1M", paired(cpu(alt), cpu(relay)), "ms"),
        ("added p99", paired(p99(alt), p99(relay)), "µs"),
    ] {
        let mean =
            |d: &[&(usize, f64)]| d.iter().map(|(_, v)| v).sum::<f64>() / d.len().max(1) as f64;
        let all: Vec<_> = d.iter().collect();
        // `round_order`: the alt runs second in even rounds, first in odd ones.
        let (second, first): (Vec<_>, Vec<_>) = d.iter().partition(|(r, _)| r.is_multiple_of(2));
        let each: Vec<String> = d.iter().map(|(_, v)| format!("{v:+.0}")).collect();
        println!(
            "   relay (alt) − relay, {what}, per round: {} {unit} (mean {:+.0}; alt second {:+.0}, alt first {:+.0}, their mean {:+.0}; alt lower in {} of {})",
            each.join(", "),
            mean(&all),
            mean(&second),
            mean(&first),
            (mean(&second) + mean(&first)) / 2.0,
            d.iter().filter(|(_, v)| *v < 0.0).count(),
            d.len()
        );
    }
}

/// Per round, the added p99 of the relay and of the per-core work floor ÷
/// nginx's in the same round: how often the contract's per-frame work on
/// tokio + rustls alone (the work floor) is ahead of nginx, beside the relay.
fn p99_against_nginx(l: &Latency) {
    let Some(nginx) = l.path("nginx") else {
        return;
    };
    let base = l.added_by_round(nginx, |x| x.p99);
    for name in ["relay wss://", WORK_FLOOR_CORE, WORK_FLOOR_PROC] {
        let Some(p) = l.path(name) else { continue };
        let ratios: Vec<String> = l
            .added_by_round(p, |x| x.p99)
            .into_iter()
            .filter_map(|(r, v)| {
                let n = base.iter().find(|(b, _)| *b == r)?.1;
                Some(match n > 0.0 {
                    true => format!("{:.2}", v / n),
                    false => format!("{v:+.0} vs {n:+.0} µs"),
                })
            })
            .collect();
        let ahead = l
            .added_by_round(p, |x| x.p99)
            .iter()
            .filter(|(r, v)| base.iter().any(|(b, n)| b == r && v <= n))
            .count();
        println!(
            "   added p99 ÷ nginx's, per round, {name}: {} (at or ahead in {ahead} of {})",
            ratios.join(", "),
            ratios.len()
        );
    }
    for name in ["nginx", "relay wss://", WORK_FLOOR_CORE, WORK_FLOOR_PROC] {
        let Some(p) = l.path(name) else { continue };
        let s = &l.series[p];
        let each: Vec<String> = s
            .runs
            .iter()
            .map(|r| r.steal.map_or("-".into(), |x| format!("{:.1}", x * 100.0)))
            .collect();
        println!(
            "   machine time stolen by the hypervisor during each round's run, {name}: {} %",
            each.join(", ")
        );
    }
}

/// What each path delivered and what it cost: deltas received ÷ sent (any
/// loss or unstamped delta is an error), the rate reached, CPU per 1M.
fn report_paced_load(l: &Latency) {
    println!(
        "   {:>23} {:>9} {:>18} {:>9}   cores: host/clients/proxy",
        "path", "deltas/s", "received/sent", "CPU/1M"
    );
    for (p, (path, s)) in l.paths.iter().zip(&l.series).enumerate() {
        let received: u64 = s.runs.iter().map(|r| r.deltas).sum();
        let sent = l.sent * s.runs.len() as u64;
        let cpu = s.relay_ms_per_m();
        let cpu = if p == 0 || !cpu.is_finite() {
            "-".to_string()
        } else {
            format!("{cpu:.0} ms")
        };
        let (h, c, rl) = s.cores();
        let (hm, cm) = s.host_client_ms_per_m();
        println!(
            "   {path:>23} {:>9.0} {:>18} {cpu:>9}   {h:.2} / {c:.2} / {rl:.2}  (host {hm:.0}, clients {cm:.0} ms/1M)",
            s.rate(),
            format!("{received}/{sent}"),
        );
        for (round, r) in s.rounds.iter().zip(&s.runs) {
            let unstamped = r.latency.map_or(0, |x| x.unstamped);
            if r.deltas != l.sent || unstamped > 0 {
                println!(
                    "   ERROR: {path} round {round}: received {} of {} deltas, {unstamped} without a readable stamp",
                    r.deltas, l.sent
                );
            }
        }
    }
    let samples: usize = l
        .series
        .iter()
        .flat_map(|s| &s.runs)
        .filter_map(|r| Some(r.latency?.samples))
        .sum();
    println!("   {samples} latency samples in all.");
    report_machine_cpu(l);
}

/// Per proxied path, the CPU the whole machine spends per delivered delta
/// (host + clients + proxy, medians over rounds), against nginx's: the two
/// cores drain each millisecond's burst of frames through all three, so a
/// path's paced tail follows this total as much as the proxy's own share
/// (BENCHMARKS.md, twenty-fourth round).
fn report_machine_cpu(l: &Latency) {
    let total = |s: &Series| {
        let (h, c) = s.host_client_ms_per_m();
        (h + c + s.relay_ms_per_m()) / 1e3
    };
    let Some(nginx) = l.path("nginx").map(|p| total(&l.series[p])) else {
        return;
    };
    let each: Vec<String> = l
        .paths
        .iter()
        .zip(&l.series)
        .skip(1)
        .map(|(path, s)| (path, total(s)))
        .filter(|(_, t)| t.is_finite())
        .map(|(path, t)| format!("{path} {t:.1} ({:.2}x)", t / nginx))
        .collect();
    println!(
        "   host + clients + proxy CPU per delivered delta, µs (÷ nginx's): {}",
        each.join(", ")
    );
}

/// Per path, how long the host's frames waited from their stamp to their
/// write (medians over rounds): what of a path's latency is spent before
/// its socket, where the path acts only through the machine's scheduling.
fn report_host_waits(l: &Latency) {
    let each: Vec<String> = l
        .paths
        .iter()
        .zip(&l.series)
        .filter_map(|(path, s)| {
            let (p50, p99): (Vec<f64>, Vec<f64>) =
                s.runs.iter().filter_map(|r| r.host_wait).unzip();
            (!p50.is_empty()).then(|| format!("{path} {:.0} / {:.0}", median(p50), median(p99)))
        })
        .collect();
    if !each.is_empty() {
        println!(
            "   the host's wait from a frame's stamp to its socket write, p50 / p99 µs: {}",
            each.join(", ")
        );
    }
}

/// The §10 latency rows: added p50 and p99 of relay wss:// with the peers'
/// figures, and relay ÷ nginx.
fn latency_rows(l: &Latency, rows: &mut Vec<Row>) {
    let added = |p: Option<usize>, f: LatOf| p.map(|p| median(l.added(p, f)));
    let relay = l.path("relay wss");
    let (nginx, haproxy) = (l.path("nginx"), l.path("haproxy"));
    let rate = relay.map_or(f64::NAN, |p| l.series[p].rate());
    let at = format!("at {:.0}k/s", rate / 1e3);
    if rate < 0.95 * PACED_TARGET {
        println!(
            "   relay wss:// reached {:.0}k/s, short of {:.0}k/s: the latency targets count as NOT MET.",
            rate / 1e3,
            PACED_TARGET / 1e3
        );
    }
    let peers = |f: LatOf| {
        let v: Vec<String> = [("nginx", nginx), ("haproxy", haproxy)]
            .into_iter()
            .filter_map(|(name, p)| Some(format!("{name} {:+.0}", added(p, f)?)))
            .collect();
        match v.is_empty() {
            true => String::new(),
            false => format!(" ({})", v.join(", ")),
        }
    };
    let targets: [(&str, &str, f64, LatOf); 2] = [
        ("p50", "≤ 150 µs at 50k/s", 150.0, |x| x.p50),
        ("p99", "≤ 0.8 ms at 50k/s", 800.0, |x| x.p99),
    ];
    for (what, target, limit, f) in targets {
        let a = added(relay, f).unwrap_or(f64::NAN);
        rows.push(row(
            &format!("added latency {what}, relay wss:// − direct"),
            target,
            format!("{a:+.0} µs {at}{}", peers(f)),
            a.is_finite()
                .then_some(a <= limit && rate >= 0.95 * PACED_TARGET),
        ));
    }
    let ratio = |f: LatOf| Some((added(relay, f)?, added(nginx, f)?));
    let (Some(p50), Some(p99)) = (ratio(|x| x.p50), ratio(|x| x.p99)) else {
        rows.push(row(
            "added latency, relay wss:// ÷ nginx wss://",
            "≤ 1× (ahead)",
            "nginx not measured".into(),
            None,
        ));
        return;
    };
    let show = |(r, n): (f64, f64)| {
        if n > 0.0 {
            format!("{:.2}×", r / n)
        } else {
            format!("{r:+.0} vs {n:+.0} µs")
        }
    };
    rows.push(row(
        "added latency, relay wss:// ÷ nginx wss://",
        "≤ 1× (ahead)",
        format!("p50 {}, p99 {}", show(p50), show(p99)),
        Some(p50.0 <= p50.1 && p99.0 <= p99.1),
    ));
}

fn report_memory(m: &Memory, rows: &mut Vec<Row>) {
    let per = (m.rss_after as f64 - m.rss_before as f64) / m.clients as f64;
    println!("4. Memory per idle TLS client with ahp-root:// subscribed");
    println!(
        "   {} clients (each its own principal and clientId: TLS + upgrade with a JWT, initialize, subscribe",
        m.clients
    );
    println!(
        "   ahp-root://), opened in {:.1} s. Relay process VmRSS {:.1} MiB before → {:.1} MiB after (1 s settle):",
        m.open_secs,
        m.rss_before as f64 / 1048576.0,
        m.rss_after as f64 / 1048576.0
    );
    println!(
        "   {:.1} KiB per client. Simhost connections before {}, after {} (the relay's watch link).",
        per / 1024.0,
        m.host_conns_before,
        m.host_conns_after
    );
    println!(
        "   Relay CPU over 2 s: all clients idle {:.2} cores; after {} of them dropped their sockets (no close",
        m.idle_cores, m.closed
    );
    println!(
        "   handshake) {:.2} cores; after {} more closed theirs with a close handshake {:.2} cores{}",
        m.after_drop_cores,
        m.closed,
        m.after_close_cores,
        if m.after_close_cores > 0.2 { "," } else { "." }
    );
    if m.after_close_cores > 0.2 {
        println!(
            "   REGRESSION: closed sockets keep the relay busy with no traffic (src/edge/ws.rs write_loop)."
        );
    }
    rows.push(row(
        "relay memory per idle TLS client",
        "≤ 32 KiB",
        format!("{:.1} KiB", per / 1024.0),
        Some(per <= 32.0 * 1024.0),
    ));
    let no_extra = m.host_conns_after == m.host_conns_before;
    rows.push(row(
        "upstream connections per idle client",
        "none",
        format!(
            "{} extra",
            m.host_conns_after as i64 - m.host_conns_before as i64
        ),
        Some(no_extra),
    ));
    println!();
}

fn report_list(l: &ListSessions, rows: &mut Vec<Row>) {
    let sorted = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v
    };
    let r = sorted(&l.relay_ms);
    let p2 = sorted(&l.second_page_ms);
    let d = sorted(&l.direct_ms);
    println!(
        "5. listSessions over {} hosts × {} sessions",
        l.hosts, l.sessions
    );
    println!(
        "   {} in-process simhosts started in {:.1} s; relay up with every host's catalog (all {} hosts on the",
        l.hosts, l.host_start_secs, l.hosts_on_page
    );
    println!(
        "   newest page) in {:.1} s; relay VmRSS then {:.0} MiB. One listSessions, limit 200, over wss://,",
        l.relay_ready_secs,
        l.relay_rss as f64 / 1048576.0
    );
    println!(
        "   timed from sending to receiving the whole answer ({} times):",
        r.len()
    );
    println!(
        "   first page  median {:.2} ms (min {:.2}, max {:.2});  a cursor page median {:.2} ms",
        median(r.clone()),
        r.first().copied().unwrap_or(f64::NAN),
        r.last().copied().unwrap_or(f64::NAN),
        median(p2)
    );
    println!(
        "   context: one simhost answering directly (ws://, its own {} sessions) median {:.2} ms",
        l.sessions,
        median(d)
    );
    let m = median(r);
    rows.push(row(
        &format!("listSessions, {}×{}, limit 200", l.hosts, l.sessions),
        "≤ 10 ms",
        format!("{m:.2} ms"),
        (m.is_finite() && l.hosts_on_page >= l.hosts.min(100)).then_some(m <= 10.0),
    ));
    println!();
}

fn report_replay(r: &Replay, rows: &mut Vec<Row>) {
    println!("6. {}-envelope replay", r.envelopes);
    println!(
        "   A client streams a 5003-envelope turn, so its 4096-envelope replay buffer is full; its socket drops"
    );
    println!(
        "   (no close handshake), it opens a new one (not timed) and sends reconnect with the watermark 4096"
    );
    println!(
        "   envelopes back (the relay's buffer exactly; the simhost's replay log holds 20000);"
    );
    println!(
        "   timed from sending reconnect to receiving the whole replay answer ({} times).",
        r.relay_ms.len()
    );
    let (rm, dm) = (median(r.relay_ms.clone()), median(r.direct_ms.clone()));
    println!(
        "   relay wss:// median {rm:.2} ms ({:.0} KiB answer);  direct ws:// from the simhost's log median {dm:.2} ms ({:.0} KiB)",
        r.relay_bytes as f64 / 1024.0,
        r.direct_bytes as f64 / 1024.0
    );
    let h = &r.holders;
    let per = (h.rss_after as f64 - h.rss_before as f64) / h.count.max(1) as f64;
    println!(
        "   Then {} clients (each its own session and host link) subscribe to that chat ({:.0} KiB snapshot)",
        h.count,
        h.snapshot_bytes as f64 / 1024.0
    );
    println!(
        "   and stay connected: relay VmRSS {:.1} → {:.1} MiB, {:.1} KiB per client (1 s settle).",
        h.rss_before as f64 / 1048576.0,
        h.rss_after as f64 / 1048576.0,
        per / 1024.0
    );
    let st = &r.streamed;
    let (beyond, second) = st.beyond_per_client();
    println!(
        "   {} more clients (each its own session and host link, a relay of their own) each stream {STREAMED_DELTAS}",
        st.count
    );
    println!(
        "   ~330-byte deltas at {}/s and stay connected: relay VmRSS {:.1} → {:.1} MiB, of which",
        paced_rate(),
        st.rss_before as f64 / 1048576.0,
        st.rss_after as f64 / 1048576.0
    );
    println!(
        "   replay buffers {:.1} MiB: {:.1} KiB per client beyond its replay buffer (1 s settle);",
        st.accounted as f64 / 1048576.0,
        beyond / 1024.0
    );
    println!(
        "   the last {} alone (what one more client costs, without what the first ones set up): {:.1} KiB per client.",
        st.count - st.half,
        second / 1024.0
    );
    rows.push(row(
        "4096-envelope replay",
        "≤ 20 ms",
        format!("{rm:.2} ms"),
        rm.is_finite().then_some(rm <= 20.0),
    ));
    println!();
}

/// Prints `rows` as a table: what, target, measured, met / NOT MET.
fn print_rows(rows: &[Row], indent: &str) {
    let width = |f: fn(&Row) -> &str| rows.iter().map(|r| f(r).chars().count()).max();
    let w = width(|r| &r.what).unwrap_or(0);
    let t = width(|r| &r.target).unwrap_or(0);
    // Capped so one long figure (the disconnect counts) does not push the
    // verdicts of every other row to the far right.
    let m = width(|r| &r.measured).unwrap_or(0).min(48);
    for r in rows {
        let v = r.ok.map_or("-", verdict);
        println!(
            "{indent}{:<w$}  {:<t$}  {:<m$}  {v}",
            r.what, r.target, r.measured
        );
    }
}

fn failed(rows: &mut Vec<Row>, what: &str, e: &BoxError) {
    println!("{what}: FAILED: {e}\n");
    rows.push(row(what, "", "not measured".into(), None));
}

async fn run(s: Settings) {
    let ticks = clock_ticks();
    println!(
        "ahp-relay contract §10 benchmarks ({} run) — {}",
        if s.quick { "quick" } else { "full" },
        machine()
    );
    println!(
        "Everything on 127.0.0.1; simhosts and clients in this process, the relay as a child process"
    );
    println!(
        "({} serve). Delta text {} bytes. The machine is shared: figures vary between runs.\n",
        relay_bin(),
        DELTA_BYTES
    );
    let begin = Instant::now();
    let busy_before = busy_ticks();
    let mut rows = Vec::new();
    if s.only.contains(&0) {
        // Asked for by name only: the deterministic figure to profile.
        print_in_memory(if s.quick { 200 } else { 2_000 });
    }
    if s.runs(1) {
        match throughput(&s, ticks).await {
            Ok(t) => report_throughput(&t, &mut rows),
            Err(e) => failed(&mut rows, "1./2. throughput and CPU", &e),
        }
    }
    if s.runs(3) {
        match latency(&s, ticks).await {
            Ok(l) => report_latency(&l, &mut rows),
            Err(e) => failed(&mut rows, "3. added latency", &e),
        }
    }
    if s.runs(4) {
        match memory(&s).await {
            Ok(m) => report_memory(&m, &mut rows),
            Err(e) => failed(&mut rows, "4. memory per idle client", &e),
        }
    }
    if s.runs(5) {
        match list_sessions(&s).await {
            Ok(l) => report_list(&l, &mut rows),
            Err(e) => failed(&mut rows, "5. listSessions", &e),
        }
    }
    if s.runs(6) {
        match replay(&s).await {
            Ok(r) => report_replay(&r, &mut rows),
            Err(e) => failed(&mut rows, "6. replay", &e),
        }
    }
    println!("Contract §10 targets (as measured, not tuned):");
    print_rows(&rows, "  ");
    let busy_after = busy_ticks();
    let secs = begin.elapsed().as_secs_f64();
    let others = (busy_after.0.saturating_sub(busy_before.0) as f64
        - busy_after.1.saturating_sub(busy_before.1) as f64)
        / ticks as f64
        / secs;
    println!(
        "\ntotal {secs:.0} s; other processes on this machine used about {:.2} of its cores meanwhile.",
        others.max(0.0)
    );
}

fn main() -> Result<()> {
    if let Ok(spec) = std::env::var(FLOOR_CHILD_ENV) {
        return floor_child(&spec);
    }
    let settings = Settings::from_env();
    let hosts = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("simhost")
        .enable_all()
        .build()?;
    HOST_RT
        .set(hosts.handle().clone())
        .map_err(|_| "host runtime set twice")?;
    let clients = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("client")
        .enable_all()
        .build()?;
    clients.block_on(run(settings));
    // Drop the runtimes without waiting for tasks still winding down.
    clients.shutdown_timeout(Duration::from_secs(1));
    hosts.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}

/// Prints the work floor's per-frame work measured alone, in memory, on the
/// load source's own frames: added to the floor's CPU it is the least any
/// relay design on this stack can spend per action.
fn print_in_memory(rounds: usize) {
    let tpl = ahp_relay::simhost::stream::Template::new(
        "ahp-chat:/s-1-main",
        "turn-1",
        "turn-1-text",
        320,
    );
    let frames = tpl.render_batch(1, 200, || 1_764_000_000_000_000);
    let texts: Vec<&str> = frames.iter().map(|f| f.as_str()).collect();
    match work_floor::in_memory(&texts, rounds) {
        Ok(m) => println!(
            "   Contract work alone, in memory (the work floor's per-frame work, no I/O): {:.0} ns per action,\n   of which the validating walk {:.0} ns, the UTF-8 check {:.0} ns, the splice {:.0} ns, the rest\n   (replay buffer, channel lookup, framing, buffers) {:.0} ns; floor + this = the least a relay on\n   this stack can spend.",
            m.work_ns,
            m.walk_ns,
            m.utf8_ns,
            m.splice_ns,
            m.work_ns - m.walk_ns - m.utf8_ns - m.splice_ns
        ),
        Err(e) => println!("   Contract work alone, in memory: not measured ({e})."),
    }
    // Fewer rounds for a run under valgrind (`AHP_BENCH_COLD_ROUNDS=2`).
    let cold_rounds = std::env::var("AHP_BENCH_COLD_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(rounds.min(200));
    match work_floor::cold(&texts, 50, cold_rounds) {
        Ok(c) => println!(
            "   The same work with cold caches (4 MiB written before each frame, 50 connections in turn, medians\n   per frame, as at the paced load): {:.0} ns per action; {:.0} ns with another connection's frame\n   worked first (code warm, this connection's data cold); alone, cold: the walk {:.0} ns, the splice\n   {:.0} ns, UTF-8 {:.0} ns.",
            c.work_ns, c.warm_code_ns, c.walk_ns, c.splice_ns, c.utf8_ns
        ),
        Err(e) => println!("   Contract work with cold caches: not measured ({e})."),
    }
}

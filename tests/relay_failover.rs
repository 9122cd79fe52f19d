//! Failover between relay replicas (contract §12): two `ahp-relay serve`
//! processes sharing one PostgreSQL store and relay secret, behind HAProxy
//! (TCP, round robin, health-checked) in front of two simulated hosts.
//! Three clients, each on its own chat, take seeded random steps — turns,
//! drains, dropped sockets — while one replica is killed (`kill -9`) every
//! [`KILL_EVERY`] steps and restarted on its port. A client whose socket
//! ends reconnects through HAProxy with its watermark and lands on
//! whichever replica answers: the answer is `replay` or `snapshot`, never
//! `NotFound` (§12.2 adoption). Checked: numbers strictly increase on each
//! connection and above each connection's floor; no dispatch is echoed
//! twice, and every dispatch sent on a connection that stayed up until the
//! end is echoed; at the end each client's chat, reduced from its last
//! snapshot and the envelopes since, equals the host's. Skipped with a
//! notice where PostgreSQL or HAProxy is not installed.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use ahp_types::actions::ActionEnvelope;
use common::haproxy::HaProxy;
use common::postgres::Postgres;
use common::relay::{ServedRelay, TestRelay};
use common::*;
use serde_json::{Value, json};

const STEPS: usize = 60;
const KILL_EVERY: usize = 12;
const SEEDS: [u64; 2] = [0x5eed_0001, 0x5eed_0002];

/// A tiny deterministic generator (xorshift64*), so a failing seed replays.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// One client: its chat, socket (if connected), reduced view and bookkeeping.
struct Client {
    sub: &'static str,
    chat: String,
    host_chat: String,
    host: usize,
    ws: Option<RawWs>,
    /// The state of the last snapshot and the envelopes since.
    base: Value,
    since: Vec<ActionEnvelope>,
    /// The highest number seen (the watermark a `reconnect` sends).
    watermark: u64,
    /// This connection's floor: every number on it is above.
    floor: u64,
    next_seq: i64,
    /// Echoes per clientSeq, over the whole run.
    echoes: HashMap<i64, u32>,
    /// Dispatches sent on the current connection.
    sent_here: Vec<i64>,
    turns: u32,
}

struct World {
    t: TestRelay,
    _pg: Postgres,
    store_lines: String,
    ports: [u16; 2],
    replicas: [Option<ServedRelay>; 2],
    lb: HaProxy,
    stats: Stats,
}

#[derive(Debug, Default)]
struct Stats {
    kills: u32,
    reconnects: u32,
    replays: u32,
    snapshots: u32,
    not_found: u32,
}

/// Two replicas on one database of `pg` behind HAProxy, or `None` when a
/// part is missing (the harnesses print why).
async fn world(pg: Postgres, db: &str) -> Option<World> {
    let url = pg.create_db(db);
    let pw = pg.password_file();
    let store_lines = format!(
        "store = \"{url}\"\nstore_password_file = \"{}\"",
        pw.display()
    );
    let hosts = vec![fast_config("h1", 2), fast_config("h2", 2)];
    let t = TestRelay::start(hosts, "").await;
    let ports = [reserved_port(), reserved_port()];
    let replicas = ports.map(|p| Some(replica(&t, p, &store_lines)));
    let backends = ports.map(|p| std::net::SocketAddr::from(([127, 0, 0, 1], p)));
    let lb = HaProxy::start(&backends)?;
    Some(World {
        t,
        _pg: pg,
        store_lines,
        ports,
        replicas,
        lb,
        stats: Stats::default(),
    })
}

fn replica(t: &TestRelay, port: u16, store_lines: &str) -> ServedRelay {
    t.replica_process_on(&format!("127.0.0.1:{port}"), "", store_lines)
}

impl World {
    fn lb_url(&self) -> String {
        format!("wss://localhost:{}/", self.lb.addr.port())
    }

    /// Kills replica `i` with SIGKILL and starts it again on its port.
    fn kill_and_restart(&mut self, i: usize) {
        drop(self.replicas[i].take());
        self.stats.kills += 1;
        self.replicas[i] = Some(replica(&self.t, self.ports[i], &self.store_lines));
    }
}

impl Client {
    fn new(sub: &'static str, host: usize, n: usize) -> Self {
        let name = ["h1", "h2"][host];
        let (chat, host_chat) = seeded_chat(name, n);
        Self {
            sub,
            chat,
            host_chat,
            host,
            ws: None,
            base: Value::Null,
            since: Vec::new(),
            watermark: 0,
            floor: 0,
            next_seq: 1,
            echoes: HashMap::new(),
            sent_here: Vec::new(),
            turns: 0,
        }
    }

    /// Takes one frame: an envelope is checked against the floor and the
    /// watermark and noted (echoes counted).
    fn take(&mut self, v: &Value) {
        if v["method"] != "action" {
            return;
        }
        let e: ActionEnvelope =
            serde_json::from_value(v["params"].clone()).expect("an envelope parses");
        assert!(
            e.server_seq > self.floor && e.server_seq > self.watermark,
            "{}: envelope {} not above floor {} / watermark {}",
            self.sub,
            e.server_seq,
            self.floor,
            self.watermark
        );
        self.watermark = e.server_seq;
        if let Some(o) = &e.origin
            && o.client_id == self.sub
        {
            *self.echoes.entry(o.client_seq).or_default() += 1;
        }
        self.since.push(e);
    }

    /// Reads what is there until 20 ms of silence; the socket is gone when
    /// it ended.
    async fn drain(&mut self) {
        while let Some(ws) = self.ws.as_mut() {
            match ws.next_within(Duration::from_millis(20)).await {
                None => return,
                Some(Next::Frame(v)) => self.take(&v),
                Some(Next::Closed(_)) => self.ws = None,
            }
        }
    }

    /// Starts a turn (a dispatch echoed accepted or rejected).
    async fn turn(&mut self) {
        let Some(ws) = self.ws.as_mut() else {
            return;
        };
        let seq = self.next_seq;
        self.next_seq += 1;
        self.turns += 1;
        let frame = dispatch_frame(
            &self.chat,
            seq,
            turn_started(&format!("{}-t{}", self.sub, self.turns), "go"),
        );
        if ws.try_send_json(&frame).await {
            self.sent_here.push(seq);
        } else {
            self.ws = None;
        }
    }
}

/// (Re)connects `c` through HAProxy: `initialize` subscribing its chat the
/// first time, `reconnect` with its watermark afterwards; retried while
/// the replica it reaches is going away.
async fn connect(w: &mut World, c: &mut Client) {
    let deadline = tokio::time::Instant::now() + 3 * WAIT;
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} could not reconnect: {:?}",
            c.sub,
            w.stats
        );
        let url = w.lb_url();
        let Ok(Ok(ws)) = tokio::time::timeout(WAIT, try_raw(&w.t, &url, c.sub)).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let mut ws = ws;
        let first = c.watermark == 0;
        let (method, params) = if first {
            (
                "initialize",
                initialize_params_subscribing(c.sub, &[&c.chat]),
            )
        } else {
            (
                "reconnect",
                reconnect_params(c.sub, json!(c.watermark), &[c.chat.as_str()]),
            )
        };
        if !ws.try_send_json(&request_frame(1, method, params)).await {
            continue;
        }
        let Some(Next::Frame(answer)) = ws.next_within(WAIT).await else {
            continue;
        };
        if answer["error"]["code"] == -32008 {
            w.stats.not_found += 1;
        }
        let result = answer["result"].clone();
        assert!(!result.is_null(), "{}: {method} answered {answer}", c.sub);
        adopt_answer(w, c, &result, first);
        c.ws = Some(ws);
        c.sent_here.clear();
        return;
    }
}

/// Applies an `initialize` / `reconnect` answer to the client's view.
fn adopt_answer(w: &mut World, c: &mut Client, result: &Value, first: bool) {
    if first || result["type"] == "snapshot" {
        let snap = snapshot_of(result, &c.chat);
        c.floor = snapshot_from_seq(snap);
        c.base = snap["state"].clone();
        c.since.clear();
        c.watermark = c.floor;
        if !first {
            w.stats.reconnects += 1;
            w.stats.snapshots += 1;
        }
        return;
    }
    assert_eq!(result["type"], "replay", "{result}");
    w.stats.reconnects += 1;
    w.stats.replays += 1;
    c.floor = c.watermark;
    for a in result["actions"].as_array().expect("actions") {
        c.take(&json!({"method": "action", "params": a}));
    }
}

async fn try_raw(t: &TestRelay, url: &str, sub: &str) -> Result<RawWs, String> {
    let options = ahp_relay::upstream::dial::DialOptions {
        url: url.to_owned(),
        ..t.dial_options(Some(t.token(sub)))
    };
    ahp_relay::upstream::dial::dial_stream(&options)
        .await
        .map(RawWs::from_stream)
        .map_err(|e| e.to_string())
}

fn initialize_params_subscribing(client_id: &str, channels: &[&str]) -> Value {
    json!({"channel": "ahp-root://", "protocolVersions": ["1.0.0"], "clientId": client_id,
        "initialSubscriptions": channels})
}

/// One seeded run; returns its counts.
async fn run(seed: u64) -> Option<Stats> {
    let pg = Postgres::start("failover")?;
    let mut w = world(pg, &format!("failover{seed:x}")).await?;
    let mut rng = Rng(seed);
    let mut clients = vec![
        Client::new("alice", 0, 1),
        Client::new("bob", 1, 1),
        Client::new("carol", 0, 2),
    ];
    for c in &mut clients {
        connect(&mut w, c).await;
    }
    for step in 1..=STEPS {
        if step % KILL_EVERY == 0 {
            w.kill_and_restart(rng.below(2) as usize);
        }
        let i = rng.below(clients.len() as u64) as usize;
        let c = &mut clients[i];
        match rng.below(10) {
            0..=3 => c.turn().await,
            4..=7 => c.drain().await,
            _ => c.ws = None,
        }
        if c.ws.is_none() {
            connect(&mut w, c).await;
        }
    }
    for c in &mut clients {
        settle(&mut w, c).await;
    }
    Some(w.stats)
}

/// Brings `c` to the host's state: reconnects until a host round trip
/// and a ping come back on one connection, then checks its reduced chat,
/// its numbers and its echoes.
async fn settle(w: &mut World, c: &mut Client) {
    loop {
        c.drain().await;
        if c.ws.is_none() {
            connect(w, c).await;
            continue;
        }
        let Some(ws) = c.ws.as_mut() else {
            continue;
        };
        let barrier = request_frame(900, "completions", barrier_params(&c.chat));
        if !ws.try_send_json(&barrier).await || !ws.try_send_json(&ping_frame(901)).await {
            c.ws = None;
            continue;
        }
        let mut answered = false;
        loop {
            let next = match c.ws.as_mut() {
                Some(ws) => ws.next_within(WAIT).await,
                None => None,
            };
            match next {
                Some(Next::Frame(v)) if v.get("id") == Some(&json!(901)) => {
                    answered = true;
                    break;
                }
                Some(Next::Frame(v)) => c.take(&v),
                _ => break,
            }
        }
        if answered {
            break;
        }
        c.ws = None;
    }
    let host = &w.t.hosts[c.host];
    assert_eq!(
        reduce_chat(&c.base, &c.chat, &c.since),
        host_state(host, &c.host_chat, &[]),
        "{}: the reduced chat equals the host's",
        c.sub
    );
    assert!(
        c.echoes.values().all(|n| *n == 1),
        "{}: a dispatch echoed twice: {:?}",
        c.sub,
        c.echoes
    );
    for seq in &c.sent_here {
        assert!(
            c.echoes.contains_key(seq),
            "{}: dispatch {seq} on a connection that stayed up was never echoed",
            c.sub
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_by_adoption_behind_haproxy_converges_without_not_found() {
    for seed in SEEDS {
        let Some(stats) = run(seed).await else {
            return;
        };
        eprintln!("failover seed {seed:#x}: {stats:?}");
        assert_eq!(stats.not_found, 0, "seed {seed:#x}: {stats:?}");
        assert!(stats.kills >= 4, "seed {seed:#x}: {stats:?}");
        assert!(stats.reconnects > 0, "seed {seed:#x}: {stats:?}");
    }
}

/// Reconnect-by-adoption time (§12.2 benchmark line): 400 clients, each
/// following the root and one chat through HAProxy, spread over both
/// replicas; replica 0 is killed (not restarted) and every client whose
/// socket ended reconnects through HAProxy at once. Prints how many moved,
/// the time until the last was answered, and p50 / p99 of one reconnect.
/// `cargo test --test relay_failover adoption_time -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: prints figures"]
async fn adoption_time_for_400_clients() {
    const CLIENTS: usize = 400;
    let Some(pg) = Postgres::start("adoption") else {
        return;
    };
    let Some(mut w) = world(pg, "adoption").await else {
        return;
    };
    let url = w.lb_url();
    let mut socks = Vec::new();
    for n in 0..CLIENTS {
        let sub: &'static str = Box::leak(format!("u{n}").into_boxed_str());
        let mut c = Client::new(sub, n % 2, 1 + (n / 2) % 2);
        connect(&mut w, &mut c).await;
        socks.push(c);
    }
    drop(w.replicas[0].take());
    let started = std::time::Instant::now();
    let t = std::sync::Arc::new(w.t);
    let tasks: Vec<_> = socks
        .into_iter()
        .map(|mut c| {
            let (t, url) = (t.clone(), url.clone());
            tokio::spawn(async move {
                let next = match c.ws.as_mut() {
                    Some(ws) => ws.next_within(Duration::from_secs(5)).await,
                    None => None,
                };
                let ended = matches!(next, Some(Next::Closed(_)));
                if !ended {
                    return None;
                }
                let t0 = std::time::Instant::now();
                loop {
                    let Ok(mut ws) = try_raw(&t, &url, c.sub).await else {
                        continue;
                    };
                    let params = reconnect_params(c.sub, json!(c.watermark), &[c.chat.as_str()]);
                    if !ws
                        .try_send_json(&request_frame(1, "reconnect", params))
                        .await
                    {
                        continue;
                    }
                    if let Some(Next::Frame(a)) = ws.next_within(WAIT).await {
                        assert!(a.get("result").is_some(), "{a}");
                        return Some((t0.elapsed().as_secs_f64() * 1000.0, started.elapsed()));
                    }
                }
            })
        })
        .collect();
    let mut ms = Vec::new();
    let mut total = 0.0f64;
    for task in tasks {
        if let Some((m, at)) = task.await.expect("client task") {
            ms.push(m);
            total = total.max(at.as_secs_f64());
        }
    }
    ms.sort_by(f64::total_cmp);
    let pct = |p: f64| ms[((ms.len() as f64 - 1.0) * p) as usize];
    println!(
        "adoption: {} of {CLIENTS} clients moved to the surviving replica, the last answered \
         {total:.2} s after the kill (one reconnect p50 {:.0} ms, p99 {:.0} ms; debug build)",
        ms.len(),
        pct(0.5),
        pct(0.99)
    );
}

/// Ports a test names ahead of time are never ones the kernel could hand
/// to a `bind(…:0)` or an outgoing connection meanwhile, and never twice.
#[test]
fn reserved_ports_are_distinct_and_outside_the_ephemeral_range() {
    let low_high = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range");
    let ephemeral_low: u32 = low_high
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768);
    let ports: Vec<u16> = (0..50).map(|_| reserved_port()).collect();
    let mut unique = ports.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), ports.len(), "{ports:?}");
    if ephemeral_low > 2048 {
        for p in &ports {
            assert!(
                u32::from(*p) < ephemeral_low,
                "{p} is in the ephemeral range"
            );
        }
    }
}

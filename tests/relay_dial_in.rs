//! Hosts that dial in (contract §13): a simhost whose port is in no relay
//! configuration, reached only through `ahp-relay connect` (the real
//! binary) running next to it. Through it: a turn, a client's reconnect
//! replay (S5), a host restart (S8), a lost link (§5.8), the connector
//! killed and restarted under a streaming turn, a reload adding and
//! removing the host (§8.1), the status page; refused: a wrong token, a
//! token for another host id, a client JWT, a second connector for the same
//! host; and a seeded randomized run through one dialed and one dial-in host.

mod common;

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ahp_relay::config::RelayConfig;
use ahp_relay::devkit::DevKit;
use ahp_relay::simhost::{SimHost, SimHostConfig};
use ahp_relay::upstream::hub::HostStatus;
use ahp_types::actions::ActionEnvelope;
use common::relay::{TestRelay, admin_get_as, metric, scratch_dir};
use common::*;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::http::HeaderName;
use tokio_tungstenite::tungstenite::http::header::AUTHORIZATION;

/// The connector endpoint (as `TestRelay::upgrade` takes a path: without
/// its leading `/`) and its host-id header.
const CONNECTOR_PATH: &str = "ahp-relay/connector";
const HOST_HEADER: &str = "ahp-relay-host";

/// An `ahp-relay connect` process (killed when dropped) and its output.
struct Connector {
    child: Option<Child>,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Connector {
    /// Starts the connector binary for host `id` of `t` with `token`,
    /// passing to `to`, trusting the relay's certificate; `--status` on.
    fn start(t: &TestRelay, id: &str, token: &Path, to: &str) -> Self {
        Self::start_with(t, id, token, to, &[])
    }

    /// [`Connector::start`] with `more` flags.
    fn start_with(t: &TestRelay, id: &str, token: &Path, to: &str, more: &[&str]) -> Self {
        let (url, ca) = (t.url(), t.kit.cert.display().to_string());
        let token = token.display().to_string();
        let mut args = vec!["--relay", &url, "--host-id", id, "--to", to];
        args.extend_from_slice(&["--token-file", &token, "--ca", &ca]);
        args.extend_from_slice(more);
        Self::spawn(&args)
    }

    /// `ahp-relay connect` with `args` and `--status`.
    fn spawn(args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ahp-relay"))
            .arg("connect")
            .args(args)
            .arg("--status")
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the connector binary starts");
        let (tx, lines) = std::sync::mpsc::channel();
        let out = child.stdout.take().expect("stdout");
        let err = child.stderr.take().expect("stderr");
        let tx2 = tx.clone();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx2.send(l);
            }
        });
        Self {
            child: Some(child),
            lines,
        }
    }

    /// Waits for the process to exit on its own; its exit code and every
    /// line it wrote.
    async fn exit(mut self) -> (Option<i32>, Vec<String>) {
        let mut child = self.child.take().expect("running");
        let status = tokio::task::spawn_blocking(move || child.wait())
            .await
            .expect("join")
            .expect("wait");
        let mut lines = Vec::new();
        while let Ok(l) = self.lines.recv_timeout(Duration::from_millis(500)) {
            lines.push(l);
        }
        (status.code(), lines)
    }

    /// Kills the process (as a crash would: no clean close).
    fn kill(mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Every line written so far.
    fn lines_so_far(&self) -> Vec<String> {
        self.lines.try_iter().collect()
    }
}

impl Drop for Connector {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A relay with dialed hosts `t.hosts` and one dial-in host `nat` (its
/// port in no configuration) behind its connector.
struct World {
    t: TestRelay,
    nat: SimHost,
    token: PathBuf,
    connector: Option<Connector>,
}

/// Writes a token file `secret` for host `id` into a fresh directory.
fn token_file(id: &str, secret: &str) -> PathBuf {
    let dir = scratch_dir("dial-in-token");
    std::fs::create_dir_all(&dir).expect("token dir");
    let path = dir.join(format!("{id}.token"));
    std::fs::write(&path, format!("{secret}\n")).expect("token file");
    path
}

/// The `[[hosts]]` table of dial-in host `id` with `token`.
fn dial_in_table(id: &str, token: &Path) -> String {
    format!(
        "\n[[hosts]]\nid = \"{id}\"\nlabel = \"{id} behind NAT\"\ndial_in = {{ token_file = \"{}\" }}\n",
        token.display()
    )
}

impl World {
    /// Starts `dialed` hosts, the dial-in host `nat`, the relay (with
    /// `extra` TOML after the hosts) and `nat`'s connector; waits until
    /// every host is up.
    async fn start(dialed: Vec<SimHostConfig>, nat: SimHostConfig, extra: &str) -> Self {
        Self::start_tweaked(dialed, nat, extra, |_| {}).await
    }

    /// [`World::start`], letting `tweak` adjust the loaded configuration.
    async fn start_tweaked(
        dialed: Vec<SimHostConfig>,
        nat: SimHostConfig,
        extra: &str,
        tweak: impl FnOnce(&mut RelayConfig),
    ) -> Self {
        let id = nat.name.clone();
        let nat = start_host(nat).await;
        let token = token_file(&id, "nat-secret-1");
        let extra = format!("{}{extra}", dial_in_table(&id, &token));
        let t = TestRelay::start_tweaked(dialed, "", &extra, tweak).await;
        let connector = Connector::start(&t, &id, &token, &nat.url());
        // Every dialed host and this one (a test may configure dial-in
        // hosts that never get a connector).
        let relay = t.relay.relay.clone();
        wait_until("hosts up", || {
            relay
                .hubs()
                .filter(|h| h.cfg.dial_in.is_none() || *h.id == *id)
                .all(|h| h.status() == HostStatus::Up)
        })
        .await;
        Self {
            t,
            nat,
            token,
            connector: Some(connector),
        }
    }

    /// Kills the connector, starts a new one, and waits until the relay's
    /// watch link has initialized again through it and the host is up.
    async fn restart_connector(&mut self) {
        let watch_inits = || {
            initialized_ids(&self.nat)
                .iter()
                .filter(|id| id.starts_with("r1.watch."))
                .count()
        };
        let before = watch_inits();
        if let Some(c) = self.connector.take() {
            c.kill();
        }
        let id = self.nat.config().name.clone();
        self.connector = Some(Connector::start(&self.t, &id, &self.token, &self.nat.url()));
        let hub = self.t.relay.relay.hub(&id).expect("hub");
        wait_until("the watch link is back through the new connector", || {
            watch_inits() > before && hub.status() == HostStatus::Up
        })
        .await;
    }

    /// The dial-in host's chat state with its own name replaced by the client's.
    fn nat_chat(&self, host_uri: &str, client_uri: &str) -> Value {
        let mut s = self.nat.channel_state(host_uri).expect("host chat");
        s["resource"] = json!(client_uri);
        s
    }
}

/// A slow streaming agent: `deltas` deltas at `rate` per second.
fn slow(name: &str, deltas: u32, rate: u32) -> SimHostConfig {
    host(name, 1, script(deltas, 8, rate))
}

/// The dial-in host's seeded chat, (client name, host name).
const NAT_CHAT: (&str, &str) = ("ahp-chat:/nat~nat-1-main", "ahp-chat:/nat-1-main");

/// Subscribes `chat` on a fresh raw client `client_id` of alice's and
/// returns the socket and the snapshot state.
async fn follow(t: &TestRelay, client_id: &str, chat: &str) -> (RawWs, Value) {
    let mut ws = t.raw("alice").await;
    ws.initialize(client_id).await;
    let s = ws.request(1, "subscribe", json!({"channel": chat})).await;
    let state = s["result"]["snapshot"]["state"].clone();
    assert!(state.is_object(), "snapshot of {chat}: {s}");
    (ws, state)
}

/// The host of a dial-in entry is reached only through its connector: the
/// relay's configuration holds no URL or port of it; a turn runs and the
/// client's state equals the host's; the host saw the client's link (its
/// upstream id, the end user's identity headers); the status page shows
/// the host as dial-in with the connector's address, and the connector's
/// `--status` line says it is attached.
#[tokio::test]
async fn a_host_reached_only_through_its_connector_runs_a_turn() {
    let w = World::start(vec![], slow("nat", 20, 0), "").await;
    let config = std::fs::read_to_string(w.t.kit.dir.join("relay.toml")).expect("config");
    let port = format!(":{}", w.nat.addr().port());
    assert!(!config.contains(&port), "the host's port is in no config");
    let (chat, host_chat) = NAT_CHAT;
    let (mut ws, state) = follow(&w.t, "turn", chat).await;
    ws.send_json(&start_turn_frame(chat, 1, "t1")).await;
    let seen = raw_actions_until(&mut ws, |e| is(e, chat, "chat/turnComplete")).await;
    assert_strictly_increasing(&seen);
    assert_eq!(
        reduce_chat(&state, chat, &seen),
        w.nat_chat(host_chat, chat)
    );
    let upstream = w.t.upstream_id("alice", "turn");
    assert!(
        initialized_ids(&w.nat).contains(&upstream),
        "the link reached the host"
    );
    assert!(
        w.nat
            .handshakes()
            .iter()
            .any(|h| h.user_subject.as_deref() == Some("alice")),
        "the end user's identity reached the host through the connector"
    );
    let (code, body) = admin_get_as(&w.t, "alice", "/status.json").await;
    assert_eq!(code, 200, "{body}");
    let status: Value = serde_json::from_str(&body).expect("status JSON");
    let row = status["hosts"]
        .as_array()
        .and_then(|hs| hs.iter().find(|h| h["id"] == "nat"))
        .cloned()
        .unwrap_or_else(|| panic!("nat on the status page: {status}"));
    assert_eq!(row["reach"], "dial-in", "{row}");
    assert_eq!(row["state"], "up", "{row}");
    let from = row["connector"].as_str().unwrap_or_default();
    assert!(
        from.starts_with("127.0.0.1:"),
        "the connector's address and port: {row}"
    );
    let (_, page) = common::relay::admin_get(&w.t, "/metrics").await;
    assert_eq!(metric(&page, "ahp_relay_connectors_attached"), Some(1.0));
    let links = metric(&page, "ahp_relay_connector_links_total").unwrap_or(0.0);
    assert!(
        links >= 2.0,
        "the watch link and the client's link: {links}"
    );
    assert_eq!(
        metric(&page, "ahp_relay_connections_total"),
        Some(1.0),
        "only the client's socket counts as a client connection"
    );
    let lines = w.connector.as_ref().expect("connector").lines_so_far();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("status: host nat · attached to")),
        "a readable status line: {lines:#?}"
    );
}

/// S5 through the connector: a client that drops while a turn streams and
/// reconnects gets `replay` with exactly what it missed; its state
/// converges with the host's.
#[tokio::test]
async fn a_client_reconnect_replays_what_it_missed_through_the_connector() {
    let w = World::start(vec![], slow("nat", 60, 40), "").await;
    let (chat, host_chat) = NAT_CHAT;
    let (mut ws, state) = follow(&w.t, "s5", chat).await;
    ws.send_json(&start_turn_frame(chat, 1, "t1")).await;
    let mut seen = raw_actions_until(&mut ws, |e| is(e, chat, "chat/delta")).await;
    drop(ws);
    let last = seen.last().map(|e| e.server_seq).expect("seen");
    let mut ws = w.t.raw("alice").await;
    let r = raw_reconnect(&mut ws, 2, reconnect_params("s5", json!(last), &[chat])).await;
    assert_eq!(r["result"]["type"], "replay", "{r}");
    seen.extend(envelopes(&r["result"]["actions"]));
    if !seen.iter().any(|e| is(e, chat, "chat/turnComplete")) {
        seen.extend(raw_actions_until(&mut ws, |e| is(e, chat, "chat/turnComplete")).await);
    }
    assert_strictly_increasing(&seen);
    let deltas = seen.iter().filter(|e| is(e, chat, "chat/delta")).count();
    assert_eq!(deltas, 60, "every delta exactly once");
    assert_eq!(
        reduce_chat(&state, chat, &seen),
        w.nat_chat(host_chat, chat)
    );
}

/// S8 through the connector: a host restart during a turn closes the
/// client with 4000, exactly as for a dialed host, and its `reconnect`
/// gets the restarted host's chat as a snapshot.
#[tokio::test]
async fn a_host_restart_behind_the_connector_resyncs_its_clients() {
    let w = World::start(
        vec![],
        slow("nat", 200, 100),
        "[limits]\nresync_spread_ms = 10\n",
    )
    .await;
    let (chat, host_chat) = NAT_CHAT;
    let (mut ws, _) = follow(&w.t, "s8", chat).await;
    ws.send_json(&start_turn_frame(chat, 1, "t1")).await;
    let seen = raw_actions_until(&mut ws, |e| is(e, chat, "chat/delta")).await;
    w.nat.restart(true);
    let close = loop {
        match ws.next_or_close().await {
            Next::Frame(_) => {}
            Next::Closed(c) => break c,
        }
    };
    assert_eq!(close.map(|c| c.0), Some(4000), "resync: continuity lost");
    w.t.wait_hosts_up().await;
    let last = seen.last().map(|e| e.server_seq).expect("seen");
    let mut ws = w.t.raw("alice").await;
    let r = raw_reconnect(&mut ws, 2, reconnect_params("s8", json!(last), &[chat])).await;
    assert_eq!(r["result"]["type"], "snapshot", "{r}");
    assert_eq!(
        snapshot_of(&r["result"], chat)["state"],
        w.nat_chat(host_chat, chat),
        "the chat as the restarted host has it"
    );
}

/// §5.8 through the connector: the host drops the link's connection; the
/// relay asks the connector for a new one and resumes by upstream replay —
/// no resync, no gap, every delta once.
#[tokio::test]
async fn a_lost_link_through_the_connector_resumes_by_upstream_replay() {
    let w = World::start(vec![], slow("nat", 60, 40), "").await;
    let (chat, host_chat) = NAT_CHAT;
    let (mut ws, state) = follow(&w.t, "blip", chat).await;
    ws.send_json(&start_turn_frame(chat, 1, "t1")).await;
    let mut seen = raw_actions_until(&mut ws, |e| is(e, chat, "chat/delta")).await;
    let upstream = w.t.upstream_id("alice", "blip");
    assert_eq!(
        w.nat.drop_client(&upstream),
        1,
        "the link's connection is cut"
    );
    seen.extend(raw_actions_until(&mut ws, |e| is(e, chat, "chat/turnComplete")).await);
    let numbers: Vec<u64> = seen.iter().map(|e| e.server_seq).collect();
    assert!(
        numbers.windows(2).all(|w| w[1] == w[0] + 1),
        "no gap across the cut: {numbers:?}"
    );
    let deltas = seen.iter().filter(|e| is(e, chat, "chat/delta")).count();
    assert_eq!(deltas, 60, "every delta exactly once");
    assert_eq!(
        reduce_chat(&state, chat, &seen),
        w.nat_chat(host_chat, chat)
    );
    let reconnects = w
        .nat
        .received()
        .iter()
        .filter(|f| f.method.as_deref() == Some("reconnect") && f.text.contains(&upstream))
        .count();
    assert_eq!(
        reconnects, 1,
        "one upstream reconnect through the connector"
    );
}

/// Reads `ws` until `chat`'s turn completes or the socket closes.
async fn until_complete_or_closed(
    ws: &mut RawWs,
    chat: &str,
    seen: &mut Vec<ActionEnvelope>,
) -> Option<Option<(u16, String)>> {
    loop {
        match ws.next_or_close().await {
            Next::Frame(v) if v["method"] == "action" => {
                let e: ActionEnvelope = serde_json::from_value(v["params"].clone()).expect("env");
                let done = is(&e, chat, "chat/turnComplete");
                seen.push(e);
                if done {
                    return None;
                }
            }
            Next::Frame(_) => {}
            Next::Closed(c) => return Some(c),
        }
    }
}

/// The connector process killed mid-turn and started again: every link
/// through it drops at once, as when a dialed host's connections drop; the
/// relay redials through the new connector and the client ends with the
/// host's state — continuing its sequence by upstream replay, or (if
/// continuity was lost) closed with 4000 and resynchronised by its
/// `reconnect`, as for a dialed host.
#[tokio::test]
async fn the_connector_killed_and_restarted_under_a_streaming_turn() {
    let mut w = World::start(
        vec![],
        slow("nat", 200, 100),
        "[limits]\nresync_spread_ms = 10\n",
    )
    .await;
    let (chat, host_chat) = NAT_CHAT;
    let (mut ws, state) = follow(&w.t, "kill", chat).await;
    ws.send_json(&start_turn_frame(chat, 1, "t1")).await;
    let mut seen = raw_actions_until(&mut ws, |e| is(e, chat, "chat/delta")).await;
    let opened_before = w.nat.handshakes().len();
    w.restart_connector().await;
    let closed = until_complete_or_closed(&mut ws, chat, &mut seen).await;
    assert_strictly_increasing(&seen);
    let final_state = match closed {
        None => reduce_chat(&state, chat, &seen),
        Some(close) => {
            assert_eq!(close.map(|c| c.0), Some(4000), "only a resync may close it");
            w.t.wait_hosts_up().await;
            let last = seen.last().map(|e| e.server_seq).expect("seen");
            let mut ws = w.t.raw("alice").await;
            let p = reconnect_params("kill", json!(last), &[chat]);
            let r = raw_reconnect(&mut ws, 2, p).await;
            let mut s = snapshot_of(&r["result"], chat)["state"].clone();
            let after = if s.get("activeTurn").is_some() {
                raw_actions_until(&mut ws, |e| is(e, chat, "chat/turnComplete")).await
            } else {
                Vec::new()
            };
            s = reduce_chat(&s, chat, &after);
            s
        }
    };
    assert!(
        w.nat.handshakes().len() > opened_before,
        "links were reopened through the new connector"
    );
    assert_eq!(
        final_state,
        w.nat_chat(host_chat, chat),
        "the client converges"
    );
}

/// Refusals (§13.2): a wrong token and another host's token make the
/// connector exit non-zero with a message naming what to check; at the
/// connector path a client JWT is refused like a wrong token, and a host
/// token is no client credential on the client path; each failure counts
/// against the client address like a client's (the fourth gets 429).
#[tokio::test]
async fn wrong_tokens_and_client_jwts_are_refused_and_counted() {
    let other = token_file("nat2", "other-secret");
    let extra = dial_in_table("nat2", &other);
    let limit = |c: &mut RelayConfig| c.listen.auth_failure_limit = 4;
    let w = World::start_tweaked(vec![], slow("nat", 5, 0), &extra, limit).await;
    let wrong = token_file("nat", "not-the-secret");
    let (code, lines) = Connector::start(&w.t, "nat", &wrong, &w.nat.url())
        .exit()
        .await;
    assert_eq!(
        code,
        Some(1),
        "a wrong token ends the connector: {lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("refused host id \"nat\"") && l.contains("--token-file")),
        "says what to check: {lines:#?}"
    );
    let (code, lines) = Connector::start(&w.t, "nat", &other, &w.nat.url())
        .exit()
        .await;
    assert_eq!(
        code,
        Some(1),
        "another host's token does not serve nat: {lines:#?}"
    );
    let host = HeaderName::from_static(HOST_HEADER);
    let jwt = format!("Bearer {}", w.t.token("alice"));
    let u =
        w.t.upgrade(
            CONNECTOR_PATH,
            &[(host.clone(), "nat"), (AUTHORIZATION, &jwt)],
        )
        .await;
    assert_eq!(u.status, 401, "a client JWT is no connector credential");
    let own = "Bearer nat-secret-1";
    let u = w.t.upgrade("", &[(AUTHORIZATION, own)]).await;
    assert_eq!(u.status, 401, "a host token is no client credential");
    let u =
        w.t.upgrade(
            CONNECTOR_PATH,
            &[(host, "nat"), (AUTHORIZATION, "Bearer guess")],
        )
        .await;
    assert_eq!(
        u.status, 429,
        "the fifth failure from one address is rate limited"
    );
    let (_, metrics) = common::relay::admin_get(&w.t, "/metrics").await;
    assert!(
        metric(
            &metrics,
            "ahp_relay_auth_failures_total{reason=\"connector\"}"
        ) >= Some(3.0),
        "connector refusals counted by reason"
    );
}

/// One connector per host id (§13.2): while the first is attached, a
/// second one for the same host is refused (409) and the first keeps
/// serving; once the first is gone the host takes a new one.
#[tokio::test]
async fn a_second_connector_for_the_same_host_is_refused_while_the_first_lives() {
    let mut w = World::start(vec![], slow("nat", 5, 0), "").await;
    let host = HeaderName::from_static(HOST_HEADER);
    let own = "Bearer nat-secret-1";
    let second =
        w.t.upgrade(
            CONNECTOR_PATH,
            &[(host.clone(), "nat"), (AUTHORIZATION, own)],
        )
        .await;
    assert_eq!(
        second.status,
        409,
        "{}",
        String::from_utf8_lossy(&second.body)
    );
    let hub = w.t.relay.relay.hub("nat").expect("hub");
    assert_eq!(
        hub.status(),
        HostStatus::Up,
        "the first connector keeps serving"
    );
    w.restart_connector().await;
    let (chat, _) = NAT_CHAT;
    let (mut ws, _) = follow(&w.t, "after", chat).await;
    ws.send_json(&start_turn_frame(chat, 1, "t1")).await;
    raw_actions_until(&mut ws, |e| is(e, chat, "chat/turnComplete")).await;
}

/// §8.1 for a dial-in host: added by a config reload, it is served once
/// its connector attaches; removed, its connector is sent away and, no
/// longer accepted, exits non-zero.
#[tokio::test]
async fn a_dial_in_host_comes_and_goes_with_the_config() {
    let t = TestRelay::start(vec![fast_config("a", 1)], "").await;
    let nat = start_host(slow("nat", 5, 0)).await;
    let token = token_file("nat", "reload-secret");
    let path = t.kit.dir.join("relay.toml");
    let text = std::fs::read_to_string(&path).expect("config");
    let at = text.find("\n[[policy.rules]]").unwrap_or(text.len());
    let added = format!(
        "{}{}{}",
        &text[..at],
        dial_in_table("nat", &token),
        &text[at..]
    );
    std::fs::write(&path, &added).expect("write");
    let relay = t.relay.relay.clone();
    wait_until("nat added", || relay.hub("nat").is_some()).await;
    let connector = Connector::start(&t, "nat", &token, &nat.url());
    t.wait_hosts_up().await;
    std::fs::write(&path, &text).expect("write");
    wait_until("nat removed", || relay.hub("nat").is_none()).await;
    let (code, lines) = connector.exit().await;
    assert_eq!(
        code,
        Some(1),
        "a removed host's connector stops: {lines:#?}"
    );
}

/// `check-config` explains a host with both `url` and `dial_in`, or
/// neither, and a dialing setting on a dial-in host, at the line of its
/// `[[hosts]]` table.
#[test]
fn check_config_explains_how_a_host_is_reached() {
    let kit = ahp_relay::devkit::DevKit::create(&scratch_dir("dial-in-config")).expect("kit");
    let good = kit.config("127.0.0.1:0", &[], "", "").expect("base config");
    drop(good);
    let path = kit.dir.join("relay.toml");
    let base = std::fs::read_to_string(&path).expect("config");
    let at = base.find("\n[[policy.rules]]").unwrap_or(base.len());
    let line = base[..at].lines().count() + 2;
    let with = |host: &str| format!("{}\n{host}{}", &base[..at], &base[at..]);
    let err = |host: &str| {
        RelayConfig::parse(&with(host), &path)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    let both =
        err("[[hosts]]\nid = \"x\"\nurl = \"wss://x/\"\ndial_in = { token_file = \"/t\" }\n");
    assert!(both.ends_with(&format!(":{line}: host x: give url (the relay dials the host) or dial_in (the host's connector dials the relay), not both")), "{both}");
    let neither = err("[[hosts]]\nid = \"x\"\nlabel = \"X\"\n");
    assert!(
        neither.contains(&format!(":{line}: host x: needs url")),
        "{neither}"
    );
    assert!(neither.contains("dial_in = { token_file"), "{neither}");
    let dialing =
        err("[[hosts]]\nid = \"x\"\ndial_in = { token_file = \"/t\" }\nca_file = \"/ca\"\n");
    assert!(
        dialing.contains("ca_file is for a dialed host"),
        "{dialing}"
    );
    let ok = RelayConfig::parse(
        &with("[[hosts]]\nid = \"x\"\ndial_in = { token_file = \"/t\" }\n"),
        &path,
    );
    assert!(ok.is_ok(), "{:?}", ok.err());
    // The binary says the same, file:line first.
    std::fs::write(&path, with("[[hosts]]\nid = \"x\"\n")).expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_ahp-relay"))
        .args(["check-config", "--document-only"])
        .arg(&path)
        .output()
        .expect("check-config runs");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    let at = format!("{}:{line}: host x: needs url", path.display());
    assert!(said.contains(&at), "{said}");
}

/// A SplitMix64 stream: the randomized run is a function of its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What the randomized run's client holds: per chat its reduced state,
/// and its watermark.
struct Model {
    ws: RawWs,
    states: Vec<(String, Value)>,
    watermark: u64,
    next_id: u64,
}

impl Model {
    fn apply(&mut self, envs: &[ActionEnvelope]) {
        for e in envs {
            assert!(
                e.server_seq > self.watermark,
                "numbers only go up: {} after {}",
                e.server_seq,
                self.watermark
            );
            self.watermark = e.server_seq;
            for (chat, state) in &mut self.states {
                *state = reduce_chat(state, chat, std::slice::from_ref(e));
            }
        }
    }

    /// Reads until `quiet` passes without a frame; a close (4000 after a
    /// lost continuity) reconnects.
    async fn pump(&mut self, t: &TestRelay, quiet: Duration) {
        loop {
            match self.ws.next_within(quiet).await {
                None => return,
                Some(Next::Frame(v)) if v["method"] == "action" => {
                    let e: ActionEnvelope =
                        serde_json::from_value(v["params"].clone()).expect("env");
                    self.apply(&[e]);
                }
                Some(Next::Frame(_)) => {}
                Some(Next::Closed(c)) => {
                    assert_eq!(c.as_ref().map(|c| c.0), Some(4000), "only resyncs close it");
                    self.reconnect(t).await;
                }
            }
        }
    }

    /// A new socket and `reconnect` from the watermark: `replay` continues,
    /// `snapshot` replaces the states. A snapshot without one of the chats
    /// (its host's link was not back within the settle timeout) is asked
    /// again once every host is up.
    async fn reconnect(&mut self, t: &TestRelay) {
        loop {
            t.wait_hosts_up().await;
            self.ws = t.raw("alice").await;
            self.next_id += 1;
            let chats: Vec<&str> = self.states.iter().map(|(c, _)| c.as_str()).collect();
            let p = reconnect_params("chaos", json!(self.watermark), &chats);
            let r = raw_reconnect(&mut self.ws, self.next_id, p).await;
            if r["result"]["type"] == "replay" {
                self.apply(&envelopes(&r["result"]["actions"]));
                return;
            }
            assert_eq!(r["result"]["type"], "snapshot", "{r}");
            let snaps = r["result"]["snapshots"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let of = |chat: &str| snaps.iter().find(|s| s["resource"] == chat).cloned();
            if self.states.iter().any(|(c, _)| of(c).is_none()) {
                continue;
            }
            for (chat, state) in &mut self.states {
                let snap = of(chat).expect("checked above");
                *state = snap["state"].clone();
                let from = snap["fromSeq"].as_u64().expect("fromSeq");
                self.watermark = self.watermark.max(from);
            }
            return;
        }
    }
}

/// One seeded run of `steps` random steps through dialed host `a` and
/// dial-in host `nat`: turns on either, client drops, lost links, host
/// restarts, the connector killed and restarted; in the end the client's
/// chats equal the hosts'.
async fn chaos(seed: u64, steps: usize) {
    let limits = "[limits]\nresync_spread_ms = 10\n";
    let mut w = World::start(vec![slow("a", 12, 200)], slow("nat", 12, 200), limits).await;
    let chats = [("ahp-chat:/a~a-1-main", "ahp-chat:/a-1-main"), NAT_CHAT];
    let mut ws = w.t.raw("alice").await;
    let init = ws
        .request(
            1,
            "initialize",
            initialize_subscribing("chaos", &[chats[0].0, chats[1].0]),
        )
        .await;
    let snaps = &init["result"]["snapshots"];
    let mut m = Model {
        watermark: init["result"]["serverSeq"].as_u64().expect("serverSeq"),
        states: chats
            .iter()
            .map(|(c, _)| {
                (
                    c.to_string(),
                    snapshot_of(&init["result"], c)["state"].clone(),
                )
            })
            .collect(),
        ws,
        next_id: 10,
    };
    assert!(snaps.is_array(), "{init}");
    let mut rng = Rng(seed);
    let mut plan = Vec::new();
    for step in 0..steps {
        let h = rng.below(2) as usize;
        let kind = rng.below(10);
        plan.push(format!("{kind}/{h}"));
        let upstream = w.t.upstream_id("alice", "chaos");
        match kind {
            0..=3 => {
                let frame =
                    start_turn_frame(chats[h].0, step as i64 + 1, &format!("t{seed}-{step}"));
                m.ws.send_json(&frame).await;
            }
            4 => m.reconnect(&w.t).await,
            5 => {
                let host = if h == 0 { &w.t.hosts[0] } else { &w.nat };
                host.drop_client(&upstream);
            }
            6 => {
                let host = if h == 0 { &w.t.hosts[0] } else { &w.nat };
                host.restart(true);
            }
            7 => w.restart_connector().await,
            _ => {}
        }
        m.pump(&w.t, Duration::from_millis(rng.below(40) + 5)).await;
    }
    let (a, nat) = (&w.t.hosts[0], &w.nat);
    wait_until("no turn runs", || {
        [(a, chats[0].1), (nat, chats[1].1)].iter().all(|(h, c)| {
            h.channel_state(c)
                .is_some_and(|s| s.get("activeTurn").is_none())
        })
    })
    .await;
    m.pump(&w.t, Duration::from_millis(100)).await;
    m.next_id += 10;
    let rest = raw_settle(&mut m.ws, m.next_id, &[chats[0].0, chats[1].0]).await;
    m.apply(&rest);
    for (i, (client, host_uri)) in chats.iter().enumerate() {
        let host = if i == 0 { a } else { nat };
        let mut want = host.channel_state(host_uri).expect("host chat");
        want["resource"] = json!(client);
        let got = &m.states[i].1;
        assert_eq!(got, &want, "seed {seed}: {client} converges; plan {plan:?}");
    }
    w.connector.take();
}

/// The randomized run (three seeds; `AHP_RELAY_DIAL_IN_SEED=<n>` runs that
/// one instead) through one dialed and one dial-in host.
#[tokio::test]
async fn randomized_steps_through_a_dialed_and_a_dial_in_host_converge() {
    let seeds = match std::env::var("AHP_RELAY_DIAL_IN_SEED").map(|s| s.parse::<u64>()) {
        Ok(Ok(seed)) => vec![seed],
        _ => vec![21, 2113, 0xD1A1],
    };
    for seed in seeds {
        chaos(seed, 25).await;
    }
}

/// A connector that cannot reach its host (the host stopped) fails each
/// link at once with its reason: the host turns unreachable and the status
/// page's last error says why, in the connector's words, naming the host
/// and not its URL.
#[tokio::test]
async fn a_host_its_connector_cannot_reach_is_unreachable_with_the_reason() {
    let World {
        t, nat, connector, ..
    } = World::start(vec![], slow("nat", 5, 0), "").await;
    let port = nat.addr().port();
    nat.shutdown().await;
    let hub = t.relay.relay.hub("nat").expect("hub");
    wait_until("nat unreachable with the connector's reason", || {
        let row = hub.row();
        row.state == "unreachable"
            && row
                .last_error
                .as_deref()
                .is_some_and(|e| e.contains("the connector could not open the link: host nat:"))
    })
    .await;
    let error = hub.row().last_error.unwrap_or_default();
    assert!(
        !error.contains(&port.to_string()),
        "no URL of the host: {error}"
    );
    assert!(connector.is_some(), "the connector keeps running");
}

/// `ahp-relay demo --dial-in` (the real binary): `laptop` is reached only
/// through the demo's connector — the demo says so and prints the
/// `connect` command — and a client lists laptop's sessions.
#[tokio::test]
async fn the_demo_runs_its_laptop_behind_a_connector() {
    use tokio::io::AsyncBufReadExt;
    let dir = scratch_dir("dial-in-demo");
    std::fs::create_dir_all(&dir).expect("dir");
    let env = dir.join("env");
    let mut demo = tokio::process::Command::new(env!("CARGO_BIN_EXE_ahp-relay"))
        .args(["demo", "--dial-in", "--listen", "127.0.0.1:0", "--env-file"])
        .arg(&env)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("demo starts");
    let mut out = tokio::io::BufReader::new(demo.stdout.take().expect("stdout")).lines();
    let mut printed = Vec::new();
    while !printed
        .iter()
        .any(|l: &String| l.contains("ahp-relay connect --relay"))
    {
        let line = tokio::time::timeout(WAIT, out.next_line()).await;
        let line = line
            .expect("demo output in time")
            .expect("read")
            .expect("a line");
        printed.push(line);
    }
    assert!(
        printed.iter().any(|l| l.starts_with("laptop dials in")),
        "{printed:#?}"
    );
    let vars = std::fs::read_to_string(&env).expect("env file");
    let var = |name: &str| {
        vars.lines()
            .find_map(|l| l.strip_prefix(&format!("export {name}=")))
            .unwrap_or_else(|| panic!("{name} in {vars}"))
            .to_string()
    };
    let opts = ahp_relay::upstream::dial::DialOptions {
        url: var("AHP_RELAY_URL"),
        token: Some(var("AHP_RELAY_TOKEN")),
        ca_file: Some(var("AHP_RELAY_CA").into()),
        insecure: false,
        connect_timeout: WAIT,
        extra_headers: Vec::new(),
    };
    let ws = ahp_relay::upstream::dial::dial_stream(&opts)
        .await
        .expect("dial the demo");
    let mut ws = RawWs::from_stream(ws);
    ws.initialize("demo").await;
    let mut id = 10;
    loop {
        id += 1;
        let uris = listed_uris(&mut ws, id).await;
        if uris.iter().any(|u| u.starts_with("ahp-session:/laptop~")) {
            break;
        }
        assert!(id < 200, "laptop's sessions never listed: {uris:?}");
        let _ = ws.next_within(Duration::from_millis(50)).await;
    }
    common::relay::stop_demo(&mut demo, &env).await;
}

/// CPU seconds process `pid` has used (user + system), from `/proc`.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // Fields 14 and 15 of stat (utime, stime), counted after the `)`.
    (ticks(11) + ticks(12)) / 100.0
}

/// A measurement, not a check (run it on a quiet machine, in release):
/// `AHP_RELAY_DIAL_IN_DELTAS=200000 cargo test --release --test
/// relay_dial_in -- --ignored --nocapture`. One turn of that many ~200-byte
/// deltas streamed through a dialed host and through a dial-in host, each
/// to one client: actions per second of both, their ratio, and the
/// connector's CPU per million actions.
#[tokio::test]
#[ignore = "a measurement: run with --ignored --nocapture in release"]
async fn throughput_through_the_connector_against_a_dialed_host() {
    let deltas: u32 = std::env::var("AHP_RELAY_DIAL_IN_DELTAS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let fast = |name: &str| host(name, 1, script(deltas, 200, 0));
    let w = World::start(vec![fast("a")], fast("nat"), "").await;
    let pid = w
        .connector
        .as_ref()
        .and_then(|c| c.child.as_ref())
        .map(Child::id)
        .expect("connector pid");
    let mut rates = Vec::new();
    for (label, chat) in [("dialed", "ahp-chat:/a~a-1-main"), ("dial-in", NAT_CHAT.0)] {
        let (mut ws, _) = follow(&w.t, &format!("bench-{label}"), chat).await;
        let cpu = cpu_secs(pid);
        let started = std::time::Instant::now();
        ws.send_json(&start_turn_frame(chat, 1, "bench")).await;
        let seen = raw_actions_until(&mut ws, |e| is(e, chat, "chat/turnComplete")).await;
        let secs = started.elapsed().as_secs_f64();
        let rate = seen.len() as f64 / secs;
        let connector_ms = (cpu_secs(pid) - cpu) * 1000.0 * 1e6 / seen.len() as f64;
        println!(
            "{label:8} {} actions in {secs:.2} s: {rate:.0} actions/s; connector CPU {connector_ms:.0} ms per 1M actions",
            seen.len()
        );
        rates.push(rate);
    }
    println!("dial-in / dialed throughput: {:.2}", rates[1] / rates[0]);
}

/// §5.9 through the connector: the dial-in host streams 30,000 deltas flat
/// out (`[stream:n]`, paced only by its sockets) to a client that reads
/// slowly for two seconds (100 frames per 25 ms) with a 64-frame client
/// queue, then fast: every delta arrives once, numbered in order, and the
/// socket stays open — the link stops reading, the connector stops
/// copying, and the host is slowed by TCP, as for a dialed host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_behind_the_connector_is_slowed_not_closed() {
    let mut cfg = fast_config("nat", 1);
    cfg.stream_rate = 0;
    let w = World::start(vec![], cfg, "[limits]\nclient_queue_frames = 64\n").await;
    let (chat, _) = NAT_CHAT;
    let mut ws = w.t.raw("alice").await;
    ws.initialize("sloth").await;
    let r = ws.request(1, "subscribe", json!({"channel": chat})).await;
    let mut last = r["result"]["snapshot"]["fromSeq"]
        .as_u64()
        .expect("fromSeq");
    let n = 30_000;
    let turn = json!({"type": "chat/turnStarted", "turnId": "flood", "startedAt": "2026-01-01T00:00:00Z",
        "message": {"text": format!("load [stream:{n}]"), "origin": {"kind": "user"}}});
    ws.send_json(&dispatch_frame(chat, 1, turn)).await;
    let slow_until = tokio::time::Instant::now() + Duration::from_secs(2);
    let (mut deltas, mut read, mut complete) = (0u64, 0u64, false);
    while !complete {
        let frame = match ws.next_within(WAIT).await {
            Some(Next::Frame(f)) => f,
            other => panic!("socket closed or silent after {deltas} deltas: {other:?}"),
        };
        read += 1;
        if frame["method"] == "action" {
            let p = &frame["params"];
            let seq = p["serverSeq"].as_u64().expect("numbered");
            assert_eq!(seq, last + 1, "numbered in order");
            last = seq;
            match p["action"]["type"].as_str() {
                Some("chat/delta") if p["action"]["turnId"] == "flood" => deltas += 1,
                Some("chat/turnComplete") => complete = true,
                _ => {}
            }
        }
        if read % 100 == 0 && tokio::time::Instant::now() < slow_until {
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
    assert_eq!(deltas, n, "every delta exactly once");
}

/// The connector presents the host's own credential (`--to-token-file`,
/// as the relay's `token_file` would for a dialed host) on every
/// connection to the host, and the dial-in token never reaches the host.
#[tokio::test]
async fn the_connector_presents_the_hosts_own_credential() {
    let nat = start_host(slow("nat", 5, 0)).await;
    let token = token_file("nat", "dial-in-secret");
    let host_token = token_file("nat-host", "host-own-secret");
    let t = TestRelay::start_unchecked(vec![], "", &dial_in_table("nat", &token)).await;
    let flags = ["--to-token-file", host_token.to_str().expect("utf-8 path")];
    let _connector = Connector::start_with(&t, "nat", &token, &nat.url(), &flags);
    t.wait_hosts_up().await;
    let (chat, _) = NAT_CHAT;
    let (mut ws, _) = follow(&t, "creds", chat).await;
    ws.send_json(&start_turn_frame(chat, 1, "t1")).await;
    raw_actions_until(&mut ws, |e| is(e, chat, "chat/turnComplete")).await;
    let shakes = nat.handshakes();
    assert!(
        shakes.len() >= 2,
        "the watch link and the client's link: {}",
        shakes.len()
    );
    for h in &shakes {
        assert_eq!(h.authorization.as_deref(), Some("Bearer host-own-secret"));
    }
}

/// A draining relay refuses new clients (§8.3) but not its own links to a
/// dial-in host: a client still attached whose link drops resumes it
/// through the connector by upstream replay (no resync), as with a dialed
/// host, while a new client upgrade gets 503.
#[tokio::test]
async fn while_draining_links_to_a_dial_in_host_still_resume() {
    let w = World::start(vec![], slow("nat", 60, 40), "").await;
    let (chat, host_chat) = NAT_CHAT;
    let (mut ws, state) = follow(&w.t, "drain", chat).await;
    ws.send_json(&start_turn_frame(chat, 1, "t1")).await;
    let mut seen = raw_actions_until(&mut ws, |e| is(e, chat, "chat/delta")).await;
    w.t.relay
        .edge
        .ready
        .store(false, std::sync::atomic::Ordering::Relaxed);
    let jwt = format!("Bearer {}", w.t.token("alice"));
    assert_eq!(w.t.upgrade("", &[(AUTHORIZATION, &jwt)]).await.status, 503);
    let upstream = w.t.upstream_id("alice", "drain");
    assert_eq!(
        w.nat.drop_client(&upstream),
        1,
        "the link's connection is cut"
    );
    match until_complete_or_closed(&mut ws, chat, &mut seen).await {
        None => {}
        Some(close) => panic!("the client was closed: {close:?}"),
    }
    let deltas = seen.iter().filter(|e| is(e, chat, "chat/delta")).count();
    assert_eq!(deltas, 60, "every delta exactly once");
    assert_eq!(
        reduce_chat(&state, chat, &seen),
        w.nat_chat(host_chat, chat)
    );
}

/// A raw client of alice's on the relay at `url` (trusting `ca`, token
/// from `kit`), once that relay lists `nat`'s sessions.
async fn client_seeing_nat(url: &str, kit: &DevKit) -> RawWs {
    let opts = ahp_relay::upstream::dial::DialOptions {
        url: url.to_string(),
        token: Some(kit.token("alice", &[], WAIT * 60, None).expect("token")),
        ca_file: Some(kit.cert.clone()),
        insecure: false,
        connect_timeout: WAIT,
        extra_headers: Vec::new(),
    };
    let ws = ahp_relay::upstream::dial::dial_stream(&opts)
        .await
        .expect("dial");
    let mut ws = RawWs::from_stream(ws);
    ws.initialize("replica").await;
    for id in 10.. {
        let uris = listed_uris(&mut ws, id).await;
        if uris.iter().any(|u| u.starts_with("ahp-session:/nat~")) {
            return ws;
        }
        assert!(id < 400, "nat's sessions never listed at {url}: {uris:?}");
        let _ = ws.next_within(Duration::from_millis(50)).await;
    }
    unreachable!("the loop returns or fails")
}

/// One connector serves its host through two relays (`--relay` twice, as
/// for two replicas, each at its own address; here an in-process relay
/// and an `ahp-relay serve` process): both reach the host and run a turn
/// on it, and the `--status` line names both.
#[tokio::test]
async fn one_connector_serves_its_host_through_two_relays() {
    let nat = start_host(slow("nat", 5, 0)).await;
    let token = token_file("nat", "replica-secret");
    let table = dial_in_table("nat", &token);
    let one = TestRelay::start_unchecked(vec![], "", &table).await;
    let kit = DevKit::create(&scratch_dir("dial-in-two")).expect("kit");
    kit.config("127.0.0.1:0", &[], "", &table).expect("config");
    let two = common::relay::serve_binary(&kit, "info");
    let ca = kit.dir.join("both.pem");
    let pems = [&one.kit.cert, &kit.cert].map(|c| std::fs::read_to_string(c).expect("pem"));
    std::fs::write(&ca, pems.concat()).expect("ca file");
    let (u1, u2, to) = (one.url(), two.url.clone(), nat.url());
    let (token, ca) = (token.display().to_string(), ca.display().to_string());
    let connector = Connector::spawn(&[
        "--relay",
        &u1,
        "--relay",
        &u2,
        "--host-id",
        "nat",
        "--to",
        &to,
        "--token-file",
        &token,
        "--ca",
        &ca,
    ]);
    let (chat, _) = NAT_CHAT;
    one.wait_hosts_up().await;
    let (mut ws, _) = follow(&one, "replica", chat).await;
    ws.send_json(&start_turn_frame(chat, 1, "t-one")).await;
    raw_actions_until(&mut ws, |e| is(e, chat, "chat/turnComplete")).await;
    let mut ws = client_seeing_nat(&u2, &kit).await;
    ws.request(1, "subscribe", json!({"channel": chat})).await;
    ws.send_json(&start_turn_frame(chat, 2, "t-two")).await;
    raw_actions_until(&mut ws, |e| is(e, chat, "chat/turnComplete")).await;
    let mut seen = Vec::new();
    wait_until("a status line naming both relays", || {
        seen.extend(connector.lines_so_far());
        seen.iter().any(|l| {
            l.split_once("attached to ")
                .is_some_and(|(_, rest)| rest.contains(&u1) && rest.contains(&u2))
        })
    })
    .await;
}

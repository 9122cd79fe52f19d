//! S15 (contract §8.3): SIGTERM to a running `ahp-relay serve` flips
//! readiness, refuses new upgrades with 503, closes every client with 1012
//! spread over `drain_window_secs`, closes its host links, and exits 0.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ahp_relay::devkit::DevKit;
use ahp_relay::upstream::dial::{DialOptions, dial_stream};
use common::relay::{http_at, scratch_dir};
use common::*;
use serde_json::json;

/// Starts `ahp-relay serve` on the config in `kit`, with its stderr read
/// on a thread; returns the child, its URL (as `localhost`) once it says
/// where it listens.
fn spawn_relay(kit: &DevKit) -> (std::process::Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ahp-relay"))
        .args(["serve", "--config"])
        .arg(kit.dir.join("relay.toml"))
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .env("RUST_LOG", "warn")
        .spawn()
        .expect("relay binary starts");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let url = loop {
        let line = rx
            .recv_timeout(WAIT)
            .expect("the relay says where it listens");
        if let Some(u) = line.strip_prefix("ahp-relay listening on ") {
            break u.replace("127.0.0.1", "localhost");
        }
    };
    (child, url)
}

/// `n` raw sockets through the relay, each initialized as `drain-<i>` and
/// subscribed to host a's seeded session.
async fn subscribed_clients(opts: &DialOptions, n: usize) -> Vec<RawWs> {
    let mut clients = Vec::new();
    for i in 0..n {
        let mut ws = RawWs::from_stream(dial_stream(opts).await.expect("dial"));
        ws.initialize(&format!("drain-{i}")).await;
        let r = ws
            .request(1, "subscribe", json!({"channel": "ahp-session:/a~a-1"}))
            .await;
        assert!(r.get("result").is_some(), "{r}");
        clients.push(ws);
    }
    clients
}

/// S15 (§8.3): after SIGTERM, `/readyz` turns 503, a new upgrade gets 503,
/// the three attached clients are closed with 1012 at moments spread over
/// the 2 s `drain_window_secs` (not all at once), the process exits 0
/// within the window and its host connections close.
#[cfg(unix)]
#[tokio::test]
async fn sigterm_drains_with_1012_spread_over_the_window() {
    let host = start_host(fast_config("a", 1)).await;
    let kit = DevKit::create(&scratch_dir("drain")).expect("kit");
    let pairs = vec![("a".to_string(), host.url())];
    kit.config(
        "127.0.0.1:0",
        &pairs,
        "",
        "[limits]\ndrain_window_secs = 2\n",
    )
    .expect("config");
    let admin = pin_admin_port(&kit);
    let (mut child, url) = spawn_relay(&kit);
    let token = kit
        .token("alice", &[], Duration::from_secs(600), None)
        .expect("token");
    let opts = DialOptions {
        url: url.clone(),
        token: Some(token),
        ca_file: Some(kit.cert.clone()),
        insecure: false,
        connect_timeout: WAIT,
        extra_headers: Vec::new(),
    };
    wait_until_async(|| async { admin_status(admin).await == Some(200) }).await;
    let clients = subscribed_clients(&opts, 3).await;
    let links = host.connections();
    assert_eq!(links, 4, "a watch link and three client links");

    let sent = Instant::now();
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    let watchers: Vec<_> = clients
        .into_iter()
        .map(|mut ws| {
            tokio::spawn(async move {
                let code = ws.close_code().await.map(|c| c.0);
                (code, sent.elapsed())
            })
        })
        .collect();
    wait_until_async(|| async { admin_status(admin).await == Some(503) }).await;
    match dial_stream(&opts).await {
        Err(ahp_relay::upstream::dial::DialError::UpgradeRefused { status, .. }) => {
            assert_eq!(status, 503, "a new upgrade while draining");
        }
        Err(e) => panic!("expected 503 while draining, got {e}"),
        Ok(_) => panic!("a new upgrade was accepted while draining"),
    }
    let mut closed_at = Vec::new();
    for w in watchers {
        let (code, at) = w.await.expect("watcher");
        assert_eq!(code, Some(1012), "closed for a restart");
        closed_at.push(at);
    }
    closed_at.sort();
    let spread = closed_at[2] - closed_at[0];
    assert!(
        spread >= Duration::from_millis(800),
        "closes spread over the 2 s window, not all at once: {closed_at:?}"
    );
    let exit = tokio::task::spawn_blocking(move || child.wait())
        .await
        .expect("join")
        .expect("wait");
    assert!(exit.success(), "exit status {exit:?}");
    assert!(
        sent.elapsed() < Duration::from_secs(8),
        "drained within the window"
    );
    wait_until("the relay's host connections closed", || {
        host.connections() == 0
    })
    .await;
}

/// Points the config's admin listener at a free loopback port (found by
/// [`reserved_port`]), so the test can reach `/readyz`.
fn pin_admin_port(kit: &DevKit) -> std::net::SocketAddr {
    let free = std::net::SocketAddr::from(([127, 0, 0, 1], reserved_port()));
    let path = kit.dir.join("relay.toml");
    let text = std::fs::read_to_string(&path).expect("config").replace(
        "admin_addr = \"127.0.0.1:0\"",
        &format!("admin_addr = \"{free}\""),
    );
    std::fs::write(&path, text).expect("config written");
    free
}

/// The status of `/readyz` on the admin listener, or `None` if nothing
/// answered in time.
async fn admin_status(admin: std::net::SocketAddr) -> Option<u16> {
    let answer = tokio::time::timeout(WAIT, http_at(admin, "/readyz")).await;
    answer.ok().flatten().map(|(status, _)| status)
}

/// Polls an async condition every 50 ms, up to [`WAIT`].
async fn wait_until_async<F, Fut>(mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + WAIT;
    while !cond().await {
        assert!(Instant::now() < deadline, "condition not met in time");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

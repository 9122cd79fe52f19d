//! The auth-failure limit behind trusted proxies (contract §3.4, issue
//! 12.1), over real TLS sockets: from a peer in `listen.trusted_proxies`
//! (here 127.0.0.1, where the test connects from) failures count against the
//! rightmost untrusted `X-Forwarded-For` entry, so one forwarded attacker
//! locks out neither another forwarded client nor a valid token; from an
//! untrusted peer the header is ignored and failures count against the peer.

mod common;

use std::sync::Arc;
use std::time::Duration;

use ahp_relay::config::RelayConfig;
use ahp_relay::devkit::DevKit;
use ahp_relay::run::RunningRelay;
use common::WAIT;
use common::relay::{http_at, metric, scratch_dir, trusting};
use rustls_pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A relay without hosts whose `[listen]` gets `listen_extra` (TOML keys),
/// loaded through the config file like any deployment.
async fn relay(listen_extra: &str) -> (RunningRelay, DevKit) {
    let kit = DevKit::create(&scratch_dir("edge-proxies")).expect("dev kit");
    kit.config("127.0.0.1:0", &[], "", "").expect("config");
    let path = kit.dir.join("relay.toml");
    let text = std::fs::read_to_string(&path).expect("config file");
    let text = text.replacen("[listen]\n", &format!("[listen]\n{listen_extra}\n"), 1);
    std::fs::write(&path, text).expect("config written");
    let cfg = RelayConfig::load(&path).expect("config with the listen keys validates");
    let running = ahp_relay::run::start(cfg).await.expect("relay starts");
    (running, kit)
}

/// The status of a WebSocket upgrade over TLS carrying `token` (if any) and
/// `X-Forwarded-For: forwarded` (if any).
async fn upgrade(
    r: &RunningRelay,
    kit: &DevKit,
    token: Option<&str>,
    forwarded: Option<&str>,
) -> u16 {
    let attempt = async {
        let tcp = TcpStream::connect(r.addr).await.expect("tcp");
        let connector = tokio_rustls::TlsConnector::from(Arc::new(trusting(&kit.cert)));
        let name = ServerName::try_from("localhost").expect("name");
        let mut tls = connector.connect(name, tcp).await.expect("TLS");
        let mut req = String::from(
            "GET / HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
             Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n",
        );
        if let Some(t) = token {
            req.push_str(&format!("Authorization: Bearer {t}\r\n"));
        }
        if let Some(f) = forwarded {
            req.push_str(&format!("X-Forwarded-For: {f}\r\n"));
        }
        req.push_str("\r\n");
        tls.write_all(req.as_bytes()).await.expect("request sent");
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            let n = tls.read(&mut byte).await.expect("response head");
            assert_eq!(n, 1, "connection closed before the response head ended");
            head.push(byte[0]);
        }
        let head = String::from_utf8(head).expect("ASCII head");
        head.split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .expect("status")
    };
    tokio::time::timeout(WAIT, attempt)
        .await
        .expect("upgrade answered in time")
}

/// Behind a trusted proxy, 20 bad upgrades forwarded for one address get
/// 401 ten times, then 429; another forwarded address still gets 401 for
/// a bad token, and a valid token forwarded for the locked-out address is
/// switched (101). `/metrics` counts the ten 429s by reason: the same
/// failing token again, refused before it is verified again.
#[tokio::test]
async fn forwarded_attacker_locks_out_only_itself() {
    let (r, kit) = relay("trusted_proxies = [\"127.0.0.1/32\"]\nauth_failure_limit = 10").await;
    let attacker = "198.51.100.66, 203.0.113.7";
    let mut statuses = Vec::new();
    for _ in 0..20 {
        statuses.push(upgrade(&r, &kit, Some("not-a-jwt"), Some(attacker)).await);
    }
    assert_eq!(statuses[..10], [401; 10], "{statuses:?}");
    assert_eq!(statuses[10..], [429; 10], "{statuses:?}");
    let other = upgrade(&r, &kit, Some("not-a-jwt"), Some("192.0.2.44")).await;
    assert_eq!(other, 401, "another forwarded address is not limited");
    let token = kit
        .token("alice", &[], Duration::from_secs(600), None)
        .expect("token");
    let valid = upgrade(&r, &kit, Some(&token), Some("203.0.113.7")).await;
    assert_eq!(
        valid, 101,
        "a valid token is never refused by the failure limit"
    );
    let (_, page) = admin_get_running(&r).await;
    assert_eq!(
        metric(
            &page,
            "ahp_relay_auth_failures_total{reason=\"rate_limited_unverified\"}"
        ),
        Some(10.0),
        "{page}"
    );
    r.stop();
}

/// A peer outside `trusted_proxies` cannot choose its address: with the
/// limit at 3, three failures forwarded "for" three different addresses
/// lock out the peer itself, whatever it forwards next.
#[tokio::test]
async fn untrusted_peer_forwarded_header_is_ignored() {
    let (r, kit) = relay("trusted_proxies = [\"10.0.0.0/8\"]\nauth_failure_limit = 3").await;
    for i in 1..=3 {
        let forwarded = format!("192.0.2.{i}");
        let status = upgrade(&r, &kit, None, Some(&forwarded)).await;
        assert_eq!(status, 401, "failure {i}");
    }
    let status = upgrade(&r, &kit, None, Some("192.0.2.200")).await;
    assert_eq!(status, 429, "counted against the peer, not the header");
    let status = upgrade(&r, &kit, None, None).await;
    assert_eq!(status, 429, "the peer itself is limited");
    r.stop();
}

/// `GET /metrics` on the admin listener of `r`.
async fn admin_get_running(r: &RunningRelay) -> (u16, String) {
    let answer = http_at(r.admin_addr(), "/metrics").await;
    answer.expect("admin answers")
}

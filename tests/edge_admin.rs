//! The admin listener (issue 12.7, contract §8.2) over real sockets:
//! `/healthz`, `/readyz` and `/metrics` answer on `listen.admin_addr` in
//! plain HTTP and nowhere else; the client listener answers only the
//! WebSocket upgrade; readiness turns 503 when draining begins.

mod common;

use std::sync::atomic::Ordering;

use common::relay::{TestRelay, admin_get, http_at, https_get};

/// The admin paths answer on the admin listener; the client listener
/// answers 404 for them and for any other path without an upgrade (426
/// only at `/`); the admin listener answers 404 for anything else,
/// including `/`.
#[tokio::test]
async fn admin_paths_live_only_on_the_admin_listener() {
    let t = TestRelay::start(vec![], "").await;
    assert_ne!(t.relay.admin_addr(), t.relay.addr, "two listeners");
    assert_eq!(admin_get(&t, "/healthz").await, (200, "ok\n".into()));
    assert_eq!(admin_get(&t, "/readyz").await, (200, "ready\n".into()));
    let (status, page) = admin_get(&t, "/metrics").await;
    assert_eq!(status, 200);
    assert!(page.contains("ahp_relay_connections_open 0"), "{page}");
    for path in ["/healthz", "/readyz", "/metrics", "/x?tkn=abc"] {
        assert_eq!(https_get(&t, path).await.0, 404, "client listener {path}");
    }
    assert_eq!(https_get(&t, "/").await.0, 426, "client listener /");
    for path in ["/", "/statusx", "/metricsx"] {
        assert_eq!(admin_get(&t, path).await.0, 404, "admin listener {path}");
    }
}

/// Once draining begins (the readiness switch `RunningRelay::drain`
/// flips), `/readyz` answers 503 while `/healthz` stays 200.
#[tokio::test]
async fn readyz_turns_503_when_draining() {
    let t = TestRelay::start(vec![], "").await;
    t.relay.edge.ready.store(false, Ordering::Relaxed);
    let admin = t.relay.admin_addr();
    let ready = http_at(admin, "/readyz").await.expect("admin answers");
    assert_eq!(ready, (503, "not ready\n".into()));
    let health = http_at(admin, "/healthz").await.expect("admin answers");
    assert_eq!(health.0, 200);
}

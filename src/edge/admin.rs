//! The admin listener (plain HTTP, loopback by default): `/healthz`,
//! `/readyz` and `/metrics` (contract §8.2), open to probes and scrapers,
//! and the status page (`status`: `/status`, `/status.json`,
//! `/status/feed`), whose data needs an admin's token as on the client
//! listener unless `listen.admin_status_open`, and whose paths pass the
//! `Host` and `Origin` checks (`origin`) first. Apart from the client
//! listener so that probes and scraping never share a port, a rate limit or
//! an ingress route with clients.
//!
//! `/readyz` answers from two flags and never touches the store on the
//! request path: the edge's readiness switch (off once draining began) and
//! the store's health, which [`StoreProbe`] refreshes in the background.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::{HeaderValue, Request, StatusCode, header};
use hyper::body::Incoming;

use super::layers::{Resp, text};
use super::origin::{Listener, Origins};
use super::port::RelayPort;
use super::status::StatusFeeds;

/// How often [`StoreProbe`] checks the store.
pub const STORE_PROBE_EVERY: Duration = Duration::from_secs(2);

/// The store's last known health, refreshed off the request path.
#[derive(Debug, Clone)]
pub struct StoreProbe {
    healthy: Arc<AtomicBool>,
}

impl StoreProbe {
    /// Checks the store once now, so a relay that starts with a broken
    /// store is not ready.
    pub fn new(port: &RelayPort) -> Self {
        Self {
            healthy: Arc::new(AtomicBool::new(port.probe_store())),
        }
    }

    /// Re-checks the store every [`STORE_PROBE_EVERY`] on a blocking
    /// thread, forever (runs inside the admin listener's task, so it stops
    /// with it).
    pub async fn watch(&self, port: RelayPort) {
        let mut tick = tokio::time::interval(STORE_PROBE_EVERY);
        loop {
            tick.tick().await;
            let port = port.clone();
            let ok = tokio::task::spawn_blocking(move || port.probe_store())
                .await
                .unwrap_or(false);
            self.healthy.store(ok, Ordering::Relaxed);
        }
    }

    /// The store's health at the last check.
    pub fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }
}

/// Answers the admin paths; 404 for anything else.
#[derive(Debug, Clone)]
pub struct AdminRoutes {
    /// Metrics to render.
    pub port: RelayPort,
    /// False once draining began.
    pub ready: Arc<AtomicBool>,
    /// The store's health.
    pub store: StoreProbe,
    /// The status feeds (shared with the client listener).
    pub feeds: Arc<StatusFeeds>,
    /// The `Host` and `Origin` checks.
    pub origins: Arc<Origins>,
}

impl AdminRoutes {
    /// The answer to `req`.
    pub fn answer(&self, req: Request<Incoming>) -> Resp {
        if super::status::is_status_path(req.uri().path()) {
            if let Some(refusal) = self.origins.refusal(req.headers(), Listener::Admin) {
                return refusal;
            }
            let open = self.port.listen().admin_status_open;
            return super::upgrade::status(&self.port, &self.feeds, open, req);
        }
        match req.uri().path() {
            "/healthz" => text(StatusCode::OK, "ok\n"),
            "/readyz" if self.ready.load(Ordering::Relaxed) && self.store.healthy() => {
                text(StatusCode::OK, "ready\n")
            }
            "/readyz" => text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n"),
            "/metrics" => {
                let mut r = text(StatusCode::OK, &self.port.metrics().render());
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; version=0.0.4"),
                );
                r
            }
            _ => text(StatusCode::NOT_FOUND, "not found\n"),
        }
    }
}

impl tower::Service<Request<Incoming>> for AdminRoutes {
    type Response = Resp;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Resp, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        std::future::ready(Ok(self.answer(req)))
    }
}

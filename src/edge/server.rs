//! The listener: TLS (or explicit plaintext), HTTP/1.1 with upgrades,
//! `/healthz`, `/readyz`, `/metrics`, and the authenticated WebSocket
//! upgrade (contract §3). A token is checked before the upgrade completes,
//! so nothing reaches a host for a refused client.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};

use super::limiter::FailureLimiter;
use crate::auth::{AuthError, TokenSource, extract_token};
use crate::identity::unix_now;
use crate::relay::Relay;

type Body = Full<Bytes>;

/// The edge's shared parts.
pub struct Edge {
    /// The relay behind the edge.
    pub relay: Arc<Relay>,
    /// TLS, unless the listener is explicitly plaintext.
    pub tls: Option<TlsAcceptor>,
    limiter: FailureLimiter,
    /// False once draining began.
    pub ready: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Edge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Edge")
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl Edge {
    /// An edge for `relay`, with TLS when `tls` is given.
    pub fn new(relay: Arc<Relay>, tls: Option<TlsAcceptor>) -> Arc<Self> {
        Arc::new(Self {
            relay,
            tls,
            limiter: FailureLimiter::default(),
            ready: std::sync::atomic::AtomicBool::new(true),
        })
    }

    /// Accepts connections on `listener` until the task is dropped.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let edge = self.clone();
            tokio::spawn(async move {
                let timeout = Duration::from_secs(edge.relay.cfg.limits.handshake_timeout_secs);
                match edge.tls.clone() {
                    Some(acceptor) => match tokio::time::timeout(timeout, acceptor.accept(stream))
                        .await
                    {
                        Ok(Ok(tls)) => edge.http(TokioIo::new(tls), peer).await,
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    },
                    None => edge.http(TokioIo::new(stream), peer).await,
                }
            });
        }
    }

    async fn http<I>(self: Arc<Self>, io: I, peer: SocketAddr)
    where
        I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        let edge = self.clone();
        let service = service_fn(move |req| {
            let edge = edge.clone();
            async move { Ok::<_, Infallible>(edge.route(req, peer)) }
        });
        // The request head must arrive within the handshake timeout (on TLS
        // and plaintext listeners alike), so half-open connections cannot
        // pile up.
        let head_timeout = Duration::from_secs(self.relay.cfg.limits.handshake_timeout_secs);
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(head_timeout)
            .serve_connection(io, service)
            .with_upgrades();
        if let Err(e) = conn.await {
            tracing::debug!(%peer, error = %e, "HTTP connection ended with an error");
        }
    }

    fn route(self: &Arc<Self>, req: Request<Incoming>, peer: SocketAddr) -> Response<Body> {
        match req.uri().path() {
            "/healthz" => text(StatusCode::OK, "ok\n"),
            "/readyz" => {
                let store_ok = self.relay.store.health().is_ok();
                if store_ok && self.ready.load(std::sync::atomic::Ordering::Relaxed) {
                    text(StatusCode::OK, "ready\n")
                } else {
                    text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
                }
            }
            "/metrics" => {
                let mut r = text(StatusCode::OK, &self.relay.metrics.render());
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; version=0.0.4"),
                );
                r
            }
            _ => self.upgrade(req, peer),
        }
    }

    fn refuse(&self, peer: SocketAddr, err: &AuthError) -> Response<Body> {
        self.limiter.record_failure(peer.ip(), Instant::now());
        self.relay
            .metrics
            .auth_failures
            .with_label_values(&[err.reason()])
            .inc();
        let mut r = text(err.status(), &format!("{err}\n"));
        if let Some(challenge) = err.www_authenticate() {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(challenge),
            );
        }
        r
    }

    /// 503 with `Retry-After` while attached sessions alone hold more
    /// replay memory than the budget (contract §5.4). Checked before the
    /// token, so an overloaded relay spends nothing on verification; not
    /// an authentication failure, so the failure limiter does not count it.
    fn refuse_for_memory(&self) -> Response<Body> {
        self.refuse_upgrade(
            "replay_memory",
            StatusCode::SERVICE_UNAVAILABLE,
            "relay under memory pressure: retry later\n",
            self.relay.cfg.limits.replay_memory_retry_after_secs,
        )
    }

    /// Refuses an upgrade for a reason other than authentication: counted by
    /// `reason`, answered with `status`, `body` and `Retry-After: secs`.
    fn refuse_upgrade(
        &self,
        reason: &str,
        status: StatusCode,
        body: &str,
        secs: u64,
    ) -> Response<Body> {
        self.relay
            .metrics
            .upgrades_refused
            .with_label_values(&[reason])
            .inc();
        let mut r = text(status, body);
        if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
            r.headers_mut().insert(header::RETRY_AFTER, v);
        }
        r
    }

    fn upgrade(self: &Arc<Self>, mut req: Request<Incoming>, peer: SocketAddr) -> Response<Body> {
        let headers = req.headers();
        let is_ws = headers
            .get(header::UPGRADE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
        let Some(key) = headers.get(header::SEC_WEBSOCKET_KEY).cloned() else {
            return text(
                StatusCode::UPGRADE_REQUIRED,
                "this endpoint speaks AHP over WebSocket\n",
            );
        };
        if !is_ws
            || headers
                .get(header::SEC_WEBSOCKET_VERSION)
                .and_then(|v| v.to_str().ok())
                != Some("13")
        {
            return text(
                StatusCode::BAD_REQUEST,
                "a WebSocket upgrade (version 13) is required\n",
            );
        }
        if !self.ready.load(std::sync::atomic::Ordering::Relaxed) {
            return self.refuse_upgrade(
                "draining",
                StatusCode::SERVICE_UNAVAILABLE,
                "relay draining: connect again (another replica)\n",
                1,
            );
        }
        if self.relay.refuses_upgrades() {
            return self.refuse_for_memory();
        }
        let now = Instant::now();
        if !self.limiter.check(peer.ip(), now) {
            self.relay
                .metrics
                .auth_failures
                .with_label_values(&["rate_limited"])
                .inc();
            let mut r = text(StatusCode::TOO_MANY_REQUESTS, "too many failed attempts\n");
            let secs = self
                .limiter
                .retry_after(peer.ip(), now)
                .map_or(60, |d| d.as_secs().max(1));
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                r.headers_mut().insert(header::RETRY_AFTER, v);
            }
            return r;
        }
        let allow_query = self.relay.auth.config().allow_query_token;
        let (token, source) = match extract_token(headers, req.uri().query(), allow_query) {
            Ok(Some(t)) => t,
            Ok(None) => return self.refuse(peer, &AuthError::MissingToken),
            Err(e) => return self.refuse(peer, &e),
        };
        let principal = match self.relay.auth.verify(&token, unix_now()) {
            Ok(p) => p,
            Err(e) => return self.refuse(peer, &e),
        };
        let Some(admitted) = self.relay.registry.admit_connection(&principal) else {
            return self.refuse_upgrade(
                "principal_connections",
                StatusCode::TOO_MANY_REQUESTS,
                "too many connections for this principal\n",
                5,
            );
        };
        let mut resp = Response::new(Body::default());
        *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let h = resp.headers_mut();
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        if let Ok(accept) = HeaderValue::from_str(&derive_accept_key(key.as_bytes())) {
            h.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
        }
        if source == TokenSource::Subprotocol {
            h.insert(
                header::SEC_WEBSOCKET_PROTOCOL,
                HeaderValue::from_static("bearer"),
            );
        }
        let relay = self.relay.clone();
        let limits = &relay.cfg.limits;
        let config = WebSocketConfig::default()
            // Clients send small frames; a 4 KiB read chunk (the buffer grows
            // for a big frame) keeps an idle client at ~24 KiB instead of ~36.
            .read_buffer_size(4 * 1024)
            // Every frame is written as it is fed; the writer flushes once
            // per batch (`ws::write_loop`). A 64 KiB write buffer measured no
            // CPU gain in `cargo bench --bench relay`.
            .write_buffer_size(0)
            .max_write_buffer_size(limits.max_frame_bytes.saturating_mul(2).max(1 << 20))
            .max_message_size(Some(limits.max_frame_bytes))
            .max_frame_size(Some(limits.max_frame_bytes));
        let upgrade = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            match upgrade.await {
                Ok(upgraded) => {
                    let ws = WebSocketStream::from_raw_socket(
                        TokioIo::new(upgraded),
                        Role::Server,
                        Some(config),
                    )
                    .await;
                    super::ws::serve_client(relay, principal, ws).await;
                    drop(admitted);
                }
                Err(e) => tracing::debug!(%peer, error = %e, "upgrade failed"),
            }
        });
        resp
    }
}

fn text(status: StatusCode, body: &str) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    r
}

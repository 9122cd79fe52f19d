//! The listeners: the client listener (TLS, or explicit plaintext; HTTP/1.1
//! with upgrades; only the authenticated WebSocket upgrade, contract §3)
//! and the admin listener (plain HTTP: health, readiness, metrics, §8.2).
//!
//! Each accepted connection gets a TLS handshake bounded by the handshake
//! timeout, then hyper serving the listener's tower stack (`layers`), with
//! the request head also bounded by that timeout so half-open connections
//! cannot pile up; and the whole connection, keep-alive requests included,
//! must upgrade within `limits.upgrade_deadline_secs` of its accept or is
//! closed, so a client that keeps asking `GET /` cannot hold TLS and HTTP
//! buffers forever. How many connections may wait for their upgrade at
//! once, in all and per address, is bounded at accept (`pending`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use http::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tower::{Service, ServiceBuilder};
use tracing::Instrument as _;

use super::admin::{AdminRoutes, StoreProbe};
use super::layers::{
    Admission, AroundLayer, CountOutcomes, Deadline, FailureLimit, Peer, ResolveClient, Resp,
    SameOrigin, Trace, WebSocketOnly,
};
use super::limiter::{DEFAULT_MAX_TRACKED, FailureLimiter};
use super::origin::Origins;
use super::pending::{HeldSlot, Pending, Slot};
use super::pool::EdgePool;
use super::port::RelayPort;
use super::proxy::TrustedProxies;
use super::status::StatusFeeds;
use super::upgrade::UpgradeService;
use crate::relay::Relay;

/// The edge's shared parts.
pub struct Edge {
    port: RelayPort,
    tls: Option<TlsAcceptor>,
    limiter: Arc<FailureLimiter>,
    trusted: Arc<TrustedProxies>,
    origins: Arc<Origins>,
    feeds: Arc<StatusFeeds>,
    /// The threads client connections are spread over (`None`: the
    /// caller's runtime, `edge_threads = 0`).
    pool: Option<Arc<EdgePool>>,
    /// False once draining began: `/readyz` answers 503 and upgrades are
    /// refused with 503.
    pub ready: Arc<AtomicBool>,
}

impl std::fmt::Debug for Edge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Edge")
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl Edge {
    /// An edge for `relay`, with TLS on the client listener when `tls` is
    /// given; failure limit, trusted proxies and edge threads from
    /// `[listen]`. Fails only when the edge threads cannot be started.
    pub fn new(relay: Arc<Relay>, tls: Option<TlsAcceptor>) -> std::io::Result<Arc<Self>> {
        let port = RelayPort::new(relay);
        let listen = port.listen();
        let pool = match EdgePool::threads_for(listen.edge_threads) {
            0 => None,
            n => Some(Arc::new(EdgePool::new(
                n,
                EdgePool::LINGER,
                listen.edge_slice(),
            )?)),
        };
        if pool.is_some() && listen.edge_slice().is_some() && !super::slice::kernel_honours_slices()
        {
            tracing::info!(
                "edge_slice_us has no effect on this kernel (custom time slices need Linux 6.12)"
            );
        }
        let limiter = FailureLimiter::new(
            listen.auth_failure_limit,
            Duration::from_secs(listen.auth_failure_window_secs),
            DEFAULT_MAX_TRACKED,
        );
        let trusted = TrustedProxies::new(&listen.trusted_proxies);
        let origins = Arc::new(Origins::new(listen));
        let feeds = StatusFeeds::new(
            port.limits().status_watchers,
            port.limits().status_history_secs,
        );
        Ok(Arc::new(Self {
            port,
            tls,
            limiter: Arc::new(limiter),
            trusted: Arc::new(trusted),
            origins,
            feeds,
            pool,
            ready: Arc::new(AtomicBool::new(true)),
        }))
    }

    fn handshake_timeout(&self) -> Duration {
        Duration::from_secs(self.port.limits().handshake_timeout_secs)
    }

    /// The client listener's stack, outermost first: a span per request,
    /// the client address, metrics of the outcome, the answer deadline,
    /// the `Host` and `Origin` checks, WebSocket-only routing, admission
    /// (drain, memory), the auth-failure limit, and the upgrade itself.
    fn client_stack(&self) -> impl HttpService {
        ServiceBuilder::new()
            .layer(AroundLayer(Trace { listener: "client" }))
            .layer(AroundLayer(ResolveClient {
                trusted: self.trusted.clone(),
            }))
            .layer(AroundLayer(CountOutcomes {
                port: self.port.clone(),
            }))
            .layer(AroundLayer(Deadline {
                after: self.handshake_timeout(),
            }))
            .layer(AroundLayer(SameOrigin {
                origins: self.origins.clone(),
            }))
            .layer(AroundLayer(WebSocketOnly))
            .layer(AroundLayer(Admission {
                port: self.port.clone(),
                ready: self.ready.clone(),
            }))
            .layer(AroundLayer(FailureLimit {
                limiter: self.limiter.clone(),
            }))
            .service(UpgradeService {
                port: self.port.clone(),
                feeds: self.feeds.clone(),
            })
    }

    /// The bounds of a listener's connections before they upgrade: time,
    /// and a fresh count of pending connections (one per listener).
    fn bounds(&self) -> Bounds {
        let limits = self.port.limits();
        Bounds {
            handshake: self.handshake_timeout(),
            upgrade: Duration::from_secs(limits.upgrade_deadline_secs),
            pending: Pending::new(
                limits.pending_connections,
                limits.pending_connections_per_address,
                self.trusted.clone(),
            ),
            port: self.port.clone(),
        }
    }

    /// Accepts client connections on `listener` until the task is dropped.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        let stack = self.client_stack();
        let pool = self.pool.clone();
        accept_loop(listener, self.tls.clone(), self.bounds(), stack, pool).await;
    }

    /// Computes the status shared by every status feed while any is open,
    /// until the task is dropped.
    pub async fn feed_status(self: Arc<Self>) {
        self.feeds.clone().run(self.port.clone()).await;
    }

    /// Accepts admin connections (plain HTTP) on `listener` until the task
    /// is dropped, refreshing the store's health meanwhile. Refusals (auth,
    /// origin, feed slots) are counted as on the client listener.
    pub async fn serve_admin(self: Arc<Self>, listener: TcpListener) {
        let store = StoreProbe::new(&self.port);
        let routes = AdminRoutes {
            port: self.port.clone(),
            ready: self.ready.clone(),
            store: store.clone(),
            feeds: self.feeds.clone(),
            origins: self.origins.clone(),
        };
        let stack = ServiceBuilder::new()
            .layer(AroundLayer(Trace { listener: "admin" }))
            .layer(AroundLayer(CountOutcomes {
                port: self.port.clone(),
            }))
            .service(routes);
        tokio::select! {
            () = store.watch(self.port.clone()) => {}
            () = accept_loop(listener, None, self.bounds(), stack, None) => {}
        }
    }
}

/// A listener's request stack.
pub trait HttpService:
    Service<Request<Incoming>, Response = Resp, Error = Infallible, Future: Send>
    + Clone
    + Send
    + 'static
{
}

impl<S> HttpService for S where
    S: Service<Request<Incoming>, Response = Resp, Error = Infallible, Future: Send>
        + Clone
        + Send
        + 'static
{
}

/// The bounds of one listener's connections before they upgrade.
#[derive(Debug, Clone)]
struct Bounds {
    /// The TLS handshake, and each request head.
    handshake: Duration,
    /// The whole connection until it upgrades.
    upgrade: Duration,
    /// How many may wait for their upgrade at once.
    pending: Arc<Pending>,
    /// Where refused and expired connections are counted.
    port: RelayPort,
}

/// Serves `stack` on every connection `listener` accepts, each on the
/// next of `pool`'s threads (on this runtime without a pool).
async fn accept_loop<S: HttpService>(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    bounds: Bounds,
    stack: S,
    pool: Option<Arc<EdgePool>>,
) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let slot = match bounds.pending.admit(peer.ip()) {
            Ok(slot) => slot,
            Err(reason) => {
                let refused = &bounds.port.metrics().upgrades_refused;
                refused.with_label_values(&[reason]).inc();
                tracing::debug!(%peer, reason, "connection refused at accept");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let span = tracing::debug_span!("edge.conn", %peer);
        let (tls, bounds, stack) = (tls.clone(), bounds.clone(), stack.clone());
        let Some(pool) = &pool else {
            let conn = connection(stream, peer, tls, bounds, stack, slot);
            tokio::spawn(conn.instrument(span));
            continue;
        };
        // The socket moves to the thread that will serve it: registered
        // with that runtime's reactor, its readiness wakes its task there.
        let std = match stream.into_std() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "accepted socket could not move to an edge thread");
                continue;
            }
        };
        pool.spawn(
            async move {
                match TcpStream::from_std(std) {
                    Ok(stream) => connection(stream, peer, tls, bounds, stack, slot).await,
                    Err(e) => {
                        tracing::warn!(error = %e, "socket not registered on its edge thread")
                    }
                }
            }
            .instrument(span),
        );
    }
}

/// One connection: the TLS handshake (within the handshake timeout), then
/// HTTP, all of it until the upgrade within the upgrade deadline (the
/// connection's future ends when it upgrades: the socket then belongs to
/// the WebSocket task). Its pending place is freed when the upgrade is
/// answered, or else when the connection closes.
async fn connection<S: HttpService>(
    stream: TcpStream,
    peer: SocketAddr,
    tls: Option<TlsAcceptor>,
    bounds: Bounds,
    stack: S,
    slot: Slot,
) {
    let handshake = bounds.handshake;
    let slot = HeldSlot::new(slot);
    let served = async move {
        let Some(acceptor) = tls else {
            return http(TokioIo::new(stream), peer, handshake, stack, slot).await;
        };
        match tokio::time::timeout(handshake, acceptor.accept(stream)).await {
            Ok(Ok(tls)) => http(TokioIo::new(tls), peer, handshake, stack, slot).await,
            Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
            Err(_) => tracing::debug!("TLS handshake timed out"),
        }
    };
    if tokio::time::timeout(bounds.upgrade, served).await.is_err() {
        let hits = &bounds.port.metrics().limit_hits;
        hits.with_label_values(&["upgrade_deadline"]).inc();
        tracing::debug!("connection closed: no upgrade within the deadline");
    }
}

/// HTTP/1.1 with upgrades on `io`; each request carries its [`Peer`]. The
/// request head must arrive within `head_timeout` (on TLS and plaintext
/// listeners alike). An answered upgrade (`101`) frees `slot` before the
/// answer is written.
async fn http<I, S>(io: I, peer: SocketAddr, head_timeout: Duration, stack: S, slot: HeldSlot)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: HttpService,
{
    let stack = ServiceBuilder::new()
        .map_request(move |mut req: Request<Incoming>| {
            req.extensions_mut().insert(Peer(peer));
            req
        })
        .map_response(move |resp: Resp| {
            if resp.status() == http::StatusCode::SWITCHING_PROTOCOLS {
                slot.release();
            }
            resp
        })
        .service(stack);
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(head_timeout)
        .serve_connection(io, TowerToHyperService::new(stack))
        .with_upgrades();
    if let Err(e) = conn.await {
        tracing::debug!(error = %e, "HTTP connection ended with an error");
    }
}

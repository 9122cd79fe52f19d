//! The edge's cross-cutting concerns as tower layers (the linkerd2-proxy
//! habit): tracing, the client address, metrics, a request deadline,
//! WebSocket-only routing, admission under load or drain, and the
//! auth-failure limit. Each is one [`Around`] implementation; the core
//! service (`upgrade`) is left with authentication and the upgrade itself.
//!
//! Layers talk to each other through request and response extensions:
//! [`Peer`] (set per connection), [`ClientAddr`] (set by [`ResolveClient`]),
//! [`WsKey`] (set by [`WebSocketOnly`]) and [`Refusal`] (set by whoever
//! refuses, read by [`FailureLimit`] and [`CountOutcomes`]).

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use tower::{Layer, Service};
use tracing::Instrument as _;

use super::limiter::FailureLimiter;
use super::port::RelayPort;
use super::proxy::TrustedProxies;

/// A response body of the edge (always small and complete).
pub type Body = Full<Bytes>;
/// A response of the edge.
pub type Resp = Response<Body>;
type BoxFuture = Pin<Box<dyn Future<Output = Result<Resp, Infallible>> + Send>>;

/// The socket peer of the connection a request came on.
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub SocketAddr);

/// The client address: the peer, or behind a trusted proxy the address it
/// forwarded (contract §3.4).
#[derive(Debug, Clone, Copy)]
pub struct ClientAddr(pub IpAddr);

/// The `Sec-WebSocket-Key` of a well-formed upgrade request.
#[derive(Debug, Clone)]
pub struct WsKey(pub HeaderValue);

/// Why a response refused its request; counted by [`CountOutcomes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Authentication failed (`ahp_relay_auth_failures_total{reason}`);
    /// counted by the failure limiter.
    Auth(&'static str),
    /// Refused for load, drain or a connection cap before or besides
    /// authentication (`ahp_relay_upgrades_refused_total{reason}`).
    Upgrade(&'static str),
}

/// Marks an accepted upgrade that is not a client's (a dial-in host's
/// connector): [`CountOutcomes`] leaves it out of `connections_total`.
#[derive(Debug, Clone, Copy)]
pub struct NotAClient;

/// A plain-text response.
pub fn text(status: StatusCode, body: &str) -> Resp {
    let mut r = Response::new(Full::new(Bytes::from(body.to_owned())));
    *r.status_mut() = status;
    r
}

/// A refusal: `status` and `body`, marked with `why`, with `Retry-After:
/// secs` when given.
pub fn refused(status: StatusCode, body: &str, why: Refusal, retry_after: Option<u64>) -> Resp {
    let mut r = text(status, body);
    if let Some(v) = retry_after.and_then(|s| HeaderValue::from_str(&s.to_string()).ok()) {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r.extensions_mut().insert(why);
    r
}

/// One cross-cutting concern: what happens around the rest of the stack
/// (`next`) for one request. Taken by value: a concern is a few `Arc`s.
pub trait Around: Clone + Send + Sync + 'static {
    /// Answers `req`, calling `next` or not.
    fn around<S>(self, req: Request<Incoming>, next: S) -> impl Future<Output = Resp> + Send
    where
        S: Service<Request<Incoming>, Response = Resp, Error = Infallible> + Send + 'static,
        S::Future: Send;
}

/// Calls `next` (already ready) with `req`.
async fn call<S>(mut next: S, req: Request<Incoming>) -> Resp
where
    S: Service<Request<Incoming>, Response = Resp, Error = Infallible>,
{
    match next.call(req).await {
        Ok(r) => r,
        Err(never) => match never {},
    }
}

/// The tower [`Layer`] of an [`Around`] concern.
#[derive(Debug, Clone)]
pub struct AroundLayer<A>(pub A);

impl<A: Around, S> Layer<S> for AroundLayer<A> {
    type Service = Wrapped<A, S>;

    fn layer(&self, inner: S) -> Self::Service {
        Wrapped {
            concern: self.0.clone(),
            inner,
        }
    }
}

/// An [`Around`] concern wrapped around a service.
#[derive(Debug, Clone)]
pub struct Wrapped<A, S> {
    concern: A,
    inner: S,
}

impl<A, S> Service<Request<Incoming>> for Wrapped<A, S>
where
    A: Around,
    S: Service<Request<Incoming>, Response = Resp, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = Resp;
    type Error = Infallible;
    type Future = BoxFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        // The polled-ready service serves this request; a fresh clone
        // waits for the next `poll_ready` (the usual tower hand-over).
        let fresh = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, fresh);
        let fut = self.concern.clone().around(req, ready);
        Box::pin(async move { Ok(fut.await) })
    }
}

/// A span per request (listener, method, path — never the query string,
/// which may carry a token — client address and status).
#[derive(Debug, Clone)]
pub struct Trace {
    /// `client` or `admin`.
    pub listener: &'static str,
}

impl Around for Trace {
    async fn around<S>(self, req: Request<Incoming>, next: S) -> Resp
    where
        S: Service<Request<Incoming>, Response = Resp, Error = Infallible> + Send + 'static,
        S::Future: Send,
    {
        let span = tracing::debug_span!(
            "edge.request",
            listener = self.listener,
            method = %req.method(),
            path = req.uri().path(),
            client = tracing::field::Empty,
            status = tracing::field::Empty,
        );
        async move {
            let resp = call(next, req).await;
            tracing::Span::current().record("status", resp.status().as_u16());
            tracing::debug!("answered");
            resp
        }
        .instrument(span)
        .await
    }
}

/// Sets [`ClientAddr`] from [`Peer`] and `X-Forwarded-For` (§3.4).
#[derive(Debug, Clone)]
pub struct ResolveClient {
    /// The proxies whose forwarding header is believed.
    pub trusted: Arc<TrustedProxies>,
}

impl Around for ResolveClient {
    async fn around<S>(self, mut req: Request<Incoming>, next: S) -> Resp
    where
        S: Service<Request<Incoming>, Response = Resp, Error = Infallible> + Send + 'static,
        S::Future: Send,
    {
        if let Some(Peer(peer)) = req.extensions().get::<Peer>().copied() {
            let client = self.trusted.client_addr(peer.ip(), req.headers());
            tracing::Span::current().record("client", tracing::field::display(client));
            req.extensions_mut().insert(ClientAddr(client));
        }
        call(next, req).await
    }
}

/// Counts what the layers below decided: refusals by reason and accepted
/// upgrades (`ahp_relay_connections_total`).
#[derive(Debug, Clone)]
pub struct CountOutcomes {
    /// Where the counters live.
    pub port: RelayPort,
}

impl Around for CountOutcomes {
    async fn around<S>(self, req: Request<Incoming>, next: S) -> Resp
    where
        S: Service<Request<Incoming>, Response = Resp, Error = Infallible> + Send + 'static,
        S::Future: Send,
    {
        let client = req.extensions().get::<ClientAddr>().map(|c| c.0);
        let resp = call(next, req).await;
        let m = self.port.metrics();
        match resp.extensions().get::<Refusal>() {
            Some(Refusal::Auth(r)) => {
                m.auth_failures.with_label_values(&[r]).inc();
                log_auth_refusal(r, resp.status(), client);
            }
            Some(Refusal::Upgrade(r)) => m.upgrades_refused.with_label_values(&[r]).inc(),
            None if resp.status() == StatusCode::SWITCHING_PROTOCOLS
                && resp.extensions().get::<NotAClient>().is_none() =>
            {
                m.connections.inc()
            }
            None => {}
        }
        resp
    }
}

/// One log line per refused authentication, with its reason and the client
/// address — never the token or the query string. Refusals of an address
/// already over its failure budget (429) are logged at debug only, so a
/// client in a retry loop cannot flood the log.
fn log_auth_refusal(reason: &str, status: StatusCode, client: Option<std::net::IpAddr>) {
    let client = client.map(|c| c.to_string()).unwrap_or_default();
    if status == StatusCode::TOO_MANY_REQUESTS {
        tracing::debug!(reason, %client, status = status.as_u16(), "upgrade refused");
    } else {
        tracing::info!(reason, %client, status = status.as_u16(), "upgrade refused");
    }
}

/// Answers 503 (`Retry-After: 1`, reason `timeout`) when the layers below
/// take longer than the handshake timeout to answer.
#[derive(Debug, Clone)]
pub struct Deadline {
    /// How long the answer may take.
    pub after: Duration,
}

impl Around for Deadline {
    async fn around<S>(self, req: Request<Incoming>, next: S) -> Resp
    where
        S: Service<Request<Incoming>, Response = Resp, Error = Infallible> + Send + 'static,
        S::Future: Send,
    {
        match tokio::time::timeout(self.after, call(next, req)).await {
            Ok(resp) => resp,
            Err(_) => refused(
                StatusCode::SERVICE_UNAVAILABLE,
                "the relay did not answer in time: retry later\n",
                Refusal::Upgrade("timeout"),
                Some(1),
            ),
        }
    }
}

/// The client listener serves only the WebSocket upgrade: a request
/// without one gets 426 at `/` and 404 elsewhere (counted as
/// `upgrades_refused_total{reason="not_websocket"}`); a malformed one 400.
/// A well-formed one passes on with its [`WsKey`].
#[derive(Debug, Clone)]
pub struct WebSocketOnly;

impl Around for WebSocketOnly {
    async fn around<S>(self, mut req: Request<Incoming>, next: S) -> Resp
    where
        S: Service<Request<Incoming>, Response = Resp, Error = Infallible> + Send + 'static,
        S::Future: Send,
    {
        let headers = req.headers();
        if super::status::is_status_path(req.uri().path()) {
            // The status page (`upgrade::status`), also a plain GET: the
            // token of its data is checked like an upgrade's.
            return call(next, req).await;
        }
        let Some(key) = headers.get(header::SEC_WEBSOCKET_KEY).cloned() else {
            let why = Refusal::Upgrade("not_websocket");
            return if req.uri().path() == "/" {
                let body = "this endpoint speaks AHP over WebSocket\n";
                refused(StatusCode::UPGRADE_REQUIRED, body, why, None)
            } else {
                refused(StatusCode::NOT_FOUND, "not found\n", why, None)
            };
        };
        let header_is = |name, want: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.eq_ignore_ascii_case(want))
        };
        if !header_is(header::UPGRADE, "websocket")
            || !header_is(header::SEC_WEBSOCKET_VERSION, "13")
        {
            return text(
                StatusCode::BAD_REQUEST,
                "a WebSocket upgrade (version 13) is required\n",
            );
        }
        req.extensions_mut().insert(WsKey(key));
        call(next, req).await
    }
}

/// The `Host` and `Origin` checks of the client listener
/// ([`Origins`](super::origin::Origins)): 403 for a page of another origin
/// or, when `listen.allowed_hosts` is given, a `Host` not in it.
#[derive(Debug, Clone)]
pub struct SameOrigin {
    /// The allowed origins and hosts.
    pub origins: Arc<super::origin::Origins>,
}

impl Around for SameOrigin {
    async fn around<S>(self, req: Request<Incoming>, next: S) -> Resp
    where
        S: Service<Request<Incoming>, Response = Resp, Error = Infallible> + Send + 'static,
        S::Future: Send,
    {
        let listener = super::origin::Listener::Client;
        match self.origins.refusal(req.headers(), listener) {
            Some(refusal) => refusal,
            None => call(next, req).await,
        }
    }
}

/// Refuses upgrades with 503 and `Retry-After` while the relay drains
/// (§8.3) or while attached sessions alone hold more replay memory than the
/// budget (§5.4) — client upgrades only: a dial-in host's connector is let
/// through, as the relay's links to a dialed host are not stopped either. Checked before the token, so an overloaded relay spends
/// nothing on verification; not an authentication failure, so the failure
/// limiter does not count it.
#[derive(Debug, Clone)]
pub struct Admission {
    /// The relay's load signal.
    pub port: RelayPort,
    /// False once draining began.
    pub ready: Arc<AtomicBool>,
}

impl Around for Admission {
    async fn around<S>(self, req: Request<Incoming>, next: S) -> Resp
    where
        S: Service<Request<Incoming>, Response = Resp, Error = Infallible> + Send + 'static,
        S::Future: Send,
    {
        // A connector's sockets are the relay's own connections to a
        // dial-in host, opened because the relay asked (§13): shedding
        // clients must not cut the links its attached clients still use,
        // any more than it cuts a dialed host's.
        if req.uri().path() == crate::upstream::dial_in::CONNECTOR_PATH {
            return call(next, req).await;
        }
        if !self.ready.load(Ordering::Relaxed) {
            return refused(
                StatusCode::SERVICE_UNAVAILABLE,
                "relay draining: connect again (another replica)\n",
                Refusal::Upgrade("draining"),
                Some(1),
            );
        }
        if self.port.refuses_upgrades() {
            return refused(
                StatusCode::SERVICE_UNAVAILABLE,
                "relay under memory pressure: retry later\n",
                Refusal::Upgrade("replay_memory"),
                Some(self.port.limits().replay_memory_retry_after_secs),
            );
        }
        call(next, req).await
    }
}

/// Repeated authentication failures from one client address get 429 with
/// `Retry-After` (§3.4). Only a failed authentication is ever turned into a
/// 429, so a valid token is never refused by this limit; each failure that
/// is answered normally is counted against [`ClientAddr`]. An address over
/// its budget that sends a token it already failed with in this window gets
/// the 429 before the token is verified again (no signature check spent on
/// a retry loop); any other token is verified as usual.
#[derive(Debug, Clone)]
pub struct FailureLimit {
    /// The per-address failure counts.
    pub limiter: Arc<FailureLimiter>,
}

impl Around for FailureLimit {
    async fn around<S>(self, req: Request<Incoming>, next: S) -> Resp
    where
        S: Service<Request<Incoming>, Response = Resp, Error = Infallible> + Send + 'static,
        S::Future: Send,
    {
        let client = req.extensions().get::<ClientAddr>().map(|c| c.0);
        // Only a fingerprint key: whichever place the upgrade reads the
        // token from, the same request gives the same string here.
        let token = crate::auth::extract_token(req.headers(), req.uri().query(), true)
            .ok()
            .flatten()
            .map(|(t, _)| t);
        if let (Some(c), Some(t)) = (client, token.as_deref())
            && let Some(wait) = self.limiter.known_failure(c, Instant::now(), t)
        {
            return refused(
                StatusCode::TOO_MANY_REQUESTS,
                "too many failed attempts\n",
                Refusal::Auth("rate_limited_unverified"),
                Some(wait.as_secs().max(1)),
            );
        }
        let resp = call(next, req).await;
        let (Some(client), Some(Refusal::Auth(_))) = (client, resp.extensions().get::<Refusal>())
        else {
            return resp;
        };
        let now = Instant::now();
        if let Some(wait) = self.limiter.retry_after(client, now) {
            return refused(
                StatusCode::TOO_MANY_REQUESTS,
                "too many failed attempts\n",
                Refusal::Auth("rate_limited"),
                Some(wait.as_secs().max(1)),
            );
        }
        self.limiter
            .record_failure_with(client, now, token.as_deref());
        resp
    }
}

//! The core of the client listener: authenticate a well-formed upgrade
//! request and switch it to a WebSocket (contract §3.2–3.4). A token is
//! checked before the upgrade completes, so nothing reaches a host for a
//! refused client. Load, drain, failure limits, metrics and tracing are the
//! layers around it (`layers`).

use std::sync::Arc;

use http::{HeaderValue, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use super::layers::{Body, Refusal, Resp, WsKey, refused, text};
use super::port::{RelayPort, unix_now};
use super::status::{StatusFeeds, Viewer};
use crate::auth::{AuthError, Principal, TokenSource, extract_token};
use crate::config::Limits;

/// Answers one upgrade request that [`WebSocketOnly`](super::layers::WebSocketOnly)
/// found well-formed: 401/403/400 for a refused token, 429 at the
/// principal's connection cap, else 101 with the socket served in its own
/// task.
pub fn handle(port: &RelayPort, feeds: &StatusFeeds, mut req: Request<Incoming>) -> Resp {
    if super::status::is_status_path(req.uri().path()) {
        return status(port, feeds, false, req);
    }
    if req.uri().path() == crate::upstream::dial_in::CONNECTOR_PATH {
        return super::connectors::handle(port, req);
    }
    let Some(WsKey(key)) = req.extensions().get::<WsKey>().cloned() else {
        return text(StatusCode::BAD_REQUEST, "a WebSocket upgrade is required\n");
    };
    let (principal, source) = match authenticate(port, &req) {
        Ok(found) => found,
        Err(e) => return auth_refusal(&e),
    };
    let Some(admitted) = port.admit_connection(&principal) else {
        return refused(
            StatusCode::TOO_MANY_REQUESTS,
            "too many connections for this principal\n",
            Refusal::Upgrade("principal_connections"),
            Some(5),
        );
    };
    let upgrade = hyper::upgrade::on(&mut req);
    let config = socket_config(port.limits());
    let port = port.clone();
    tokio::spawn(async move {
        match upgrade.await {
            Ok(upgraded) => {
                let io = TokioIo::new(upgraded);
                super::ws::serve_client(port, principal, io, config, admitted).await;
            }
            Err(e) => tracing::debug!(error = %e, "upgrade failed"),
        }
    });
    switching(&key, source)
}

/// A status path on either listener: the page to anyone, the data to the
/// principal of the request's token (refused like an upgrade without one),
/// or to anyone when `open`.
pub fn status(port: &RelayPort, feeds: &StatusFeeds, open: bool, req: Request<Incoming>) -> Resp {
    let viewer = if open || req.uri().path() == "/status" {
        Viewer::Open
    } else {
        match authenticate(port, &req) {
            Ok((principal, source)) => Viewer::Principal(principal, source),
            Err(e) => return auth_refusal(&e),
        }
    };
    super::status::answer(port, feeds, viewer, req)
}

/// The principal of the request's token, and where the token was.
fn authenticate(
    port: &RelayPort,
    req: &Request<Incoming>,
) -> Result<(Principal, TokenSource), AuthError> {
    let allow_query = port.auth().config().allow_query_token;
    let (token, source) = extract_token(req.headers(), req.uri().query(), allow_query)?
        .ok_or(AuthError::MissingToken)?;
    let principal = port.auth().verify(&token, unix_now())?;
    Ok((principal, source))
}

/// The answer to a failed authentication, marked for the failure limiter
/// and the metrics by reason (never echoing the token).
fn auth_refusal(err: &AuthError) -> Resp {
    let mut r = refused(
        err.status(),
        &format!("{err}\n"),
        Refusal::Auth(err.reason()),
        None,
    );
    if let Some(challenge) = err.www_authenticate() {
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static(challenge),
        );
    }
    r
}

/// `101 Switching Protocols` for `key`, naming the `bearer` sub-protocol
/// when the token came in it (browsers require the echo).
pub(super) fn switching(key: &HeaderValue, source: TokenSource) -> Resp {
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
    resp
}

/// The WebSocket settings of a client socket.
fn socket_config(limits: &Limits) -> WebSocketConfig {
    WebSocketConfig::default()
        // Clients send small frames; a 2 KiB read chunk (the buffer grows
        // for a big frame) is what an idle client keeps (BENCHMARKS.md
        // "Thirty-eighth round": 2 KiB less per idle client than 4 KiB).
        .read_buffer_size(2 * 1024)
        // Fed frames collect up to one TLS record's worth (16 KiB) before
        // they are written, and the writer flushes once per batch
        // (`ws::write_loop`): a stream goes out in full records and few
        // writes instead of one record and one `writev` per frame. A
        // lone frame is flushed at once, so latency does not grow.
        .write_buffer_size(16 * 1024)
        .max_write_buffer_size(limits.max_frame_bytes.saturating_mul(2).max(1 << 20))
        .max_message_size(Some(limits.max_frame_bytes))
        .max_frame_size(Some(limits.max_frame_bytes))
}

/// The core service of the client listener: [`handle`] as a tower service.
#[derive(Debug, Clone)]
pub struct UpgradeService {
    /// The relay behind the edge.
    pub port: RelayPort,
    /// The status feeds (shared with the admin listener).
    pub feeds: Arc<StatusFeeds>,
}

impl tower::Service<Request<Incoming>> for UpgradeService {
    type Response = Resp;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Resp, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        std::future::ready(Ok(handle(&self.port, &self.feeds, req)))
    }
}

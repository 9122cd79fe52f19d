//! The status page (issue 13): `/status` (plain HTML and a little script),
//! `/status.json` (the same data once) and `/status/feed` (a WebSocket that
//! pushes the data as JSON whenever it changed, checked every
//! [`FEED_EVERY`]). Served on the admin listener, and on the client
//! listener to principals with an `admin` grant on every host
//! ([`for_admins`]: the token as for an upgrade — header, `bearer`
//! sub-protocol, or query where allowed; no cookie). The data comes from
//! [`RelayPort::status`], read-only, and holds no URL, credential, clientId
//! or message text.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use http::{HeaderValue, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;

use super::layers::{Body, Resp, text};
use super::port::RelayPort;
use crate::auth::{Principal, TokenSource};

/// Whether `path` is one of the status page's.
pub fn is_status_path(path: &str) -> bool {
    matches!(path, "/status" | "/status.json" | "/status/feed")
}

/// A status path on the client listener, for an authenticated `principal`:
/// 403 without an `admin` grant on every host.
pub fn for_admins(
    port: &RelayPort,
    principal: &Principal,
    source: TokenSource,
    mut req: Request<Incoming>,
) -> Resp {
    if !port.is_admin(principal) {
        return text(
            StatusCode::FORBIDDEN,
            "the status page needs an admin grant\n",
        );
    }
    match req.uri().path() {
        "/status" => page(),
        "/status.json" => json(port),
        _ => {
            let mut r = feed(port, &mut req);
            if source == TokenSource::Subprotocol && r.status() == StatusCode::SWITCHING_PROTOCOLS {
                r.headers_mut().insert(
                    header::SEC_WEBSOCKET_PROTOCOL,
                    HeaderValue::from_static("bearer"),
                );
            }
            r
        }
    }
}

/// How often the feed checks for changes.
pub const FEED_EVERY: Duration = Duration::from_millis(500);

/// The page itself (no external resources).
const PAGE: &str = include_str!("status.html");

/// `/status`.
pub fn page() -> Resp {
    typed(text(StatusCode::OK, PAGE), "text/html; charset=utf-8")
}

/// `/status.json`.
pub fn json(port: &RelayPort) -> Resp {
    typed(
        text(StatusCode::OK, &port.status().to_string()),
        "application/json",
    )
}

fn typed(mut r: Resp, content_type: &'static str) -> Resp {
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// `/status/feed`: 101 and a socket that pushes the status, or 400 for a
/// request that is not a WebSocket upgrade.
pub fn feed(port: &RelayPort, req: &mut Request<Incoming>) -> Resp {
    let upgrade_asked = req
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let Some(key) = req.headers().get(header::SEC_WEBSOCKET_KEY).cloned() else {
        return text(StatusCode::BAD_REQUEST, "a WebSocket upgrade is required\n");
    };
    if !upgrade_asked {
        return text(StatusCode::BAD_REQUEST, "a WebSocket upgrade is required\n");
    }
    let upgrade = hyper::upgrade::on(req);
    let port = port.clone();
    tokio::spawn(async move {
        match upgrade.await {
            Ok(upgraded) => {
                let ws =
                    WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None)
                        .await;
                push(port, ws).await;
            }
            Err(e) => tracing::debug!(error = %e, "status feed upgrade failed"),
        }
    });
    let mut resp = Response::new(Body::default());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    if let Ok(accept) = HeaderValue::from_str(&derive_accept_key(key.as_bytes())) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
    }
    resp
}

/// Sends the status now and again whenever it changed, until the viewer
/// leaves (anything it sends other than a ping ends the feed).
async fn push<S>(port: RelayPort, ws: WebSocketStream<S>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut sink, mut stream) = ws.split();
    let mut tick = tokio::time::interval(FEED_EVERY);
    let mut last = String::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let now = port.status().to_string();
                if now != last {
                    if sink.send(Message::text(now.clone())).await.is_err() {
                        return;
                    }
                    last = now;
                }
            }
            msg = stream.next() => match msg {
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                _ => return,
            },
        }
    }
}

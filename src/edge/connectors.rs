//! The connector endpoint (contract §13): where `ahp-relay connect`, run
//! next to a host with no inbound port, opens its control connection and
//! its link sockets.
//!
//! **Where it lives.** On the client listener, under the fixed path
//! [`CONNECTOR_PATH`], rather than on a listener of its own: a connector
//! needs exactly what a client needs (the public TLS endpoint an ingress
//! already routes, with WebSocket timeouts), so one Service and one Ingress
//! rule serve both, and the client stack's layers apply to it — the
//! `Host`/`Origin` checks, the deadline, and the auth-failure limit (a
//! wrong token is a failure counted against the client address exactly
//! like a client's bad JWT, `auth_failures_total{reason="connector"}`, and
//! repeated ones get 429) — except admission: a draining or memory-pressed
//! relay refuses new *clients*, but a connector's sockets are the relay's
//! own links to its host, which it does not cut for a dialed host either.
//!
//! **Who gets in.** A request here is authenticated only by a dial-in
//! host's token (`Authorization: Bearer`, compared in constant time with
//! the host's `dial_in.token_file`, read at each attempt) for the host id
//! it names ([`HOST_ID_HEADER`]): a token serves exactly its own host, a
//! client JWT is never accepted here, and a host token is never accepted
//! on any other path. Unknown host, a dialed host and a wrong token get
//! the same 401, so the endpoint does not tell which host ids exist.
//!
//! **What it does.** Without [`LINK_HEADER`] the request is the control
//! connection: the connector attaches to [`Connectors`] (a second one for
//! the same host gets 409 while the first lives), receives an `open` order
//! per link the relay wants, and is pinged after `link_ping_secs` of
//! silence and dropped after `link_ping_timeout_secs` more (so a connector
//! whose network died frees its host for a new one). With [`LINK_HEADER`]
//! it is a link socket: handed to the link that asked for it, or 404 if
//! nobody waits for that number.
//!
//! [`Connectors`]: crate::upstream::dial_in::Connectors

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use http::{Request, StatusCode, header};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::time::Instant;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::{
    CloseFrame, Role, WebSocketConfig, frame::coding::CloseCode,
};

use super::layers::{ClientAddr, NotAClient, Peer, Refusal, Resp, WsKey, refused, text};
use super::port::RelayPort;
use crate::auth::TokenSource;
use crate::upstream::dial_in::{
    Attachment, Control, FrameLimits, HOST_ID_HEADER, HostIo, HostSocket, LINK_HEADER, same_token,
};

pub use crate::upstream::dial_in::CONNECTOR_PATH;

/// Answers an upgrade request on [`CONNECTOR_PATH`].
pub fn handle(port: &RelayPort, mut req: Request<Incoming>) -> Resp {
    let Some(WsKey(key)) = req.extensions().get::<WsKey>().cloned() else {
        return text(StatusCode::BAD_REQUEST, "a WebSocket upgrade is required\n");
    };
    let Some(host) = authenticate(port, &req) else {
        let mut r = refused(
            StatusCode::UNAUTHORIZED,
            "connector refused: unknown host id, or not this host's dial-in token\n",
            Refusal::Auth("connector"),
            None,
        );
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            http::HeaderValue::from_static("Bearer realm=\"ahp-relay connector\""),
        );
        return r;
    };
    let link = req
        .headers()
        .get(LINK_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.parse::<u64>());
    let answer = match link {
        None => control(port, &mut req, host),
        Some(Ok(link)) => link_socket(port, &mut req, &host, link),
        Some(Err(_)) => return text(StatusCode::BAD_REQUEST, "malformed link number\n"),
    };
    match answer {
        Ok(()) => {
            let mut resp = super::upgrade::switching(&key, TokenSource::AuthorizationHeader);
            resp.extensions_mut().insert(NotAClient);
            resp
        }
        Err(refusal) => *refusal,
    }
}

/// The dial-in host the request's token belongs to, if the named host
/// dials in and the `Authorization: Bearer` token is its token. The token
/// is compared (in constant time) whether or not the host exists, so the
/// answer's timing does not tell which host ids dial in; the token file is
/// read at each attempt (a small local file), so a rotated one applies to
/// the next connector.
fn authenticate(port: &RelayPort, req: &Request<Incoming>) -> Option<String> {
    let headers = req.headers();
    let host = headers.get(HOST_ID_HEADER)?.to_str().ok()?;
    let given = headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")?
        .trim();
    let expected = port
        .hub(host)
        .and_then(|hub| hub.cfg.dial_in.clone())
        .and_then(|d| match std::fs::read_to_string(&d.token_file) {
            Ok(t) => Some(t.trim().to_string()),
            Err(e) => {
                tracing::warn!(host, error = %e, "cannot read the host's dial_in token file");
                None
            }
        })
        .filter(|t| !t.is_empty());
    let matches = same_token(given, expected.as_deref().unwrap_or(""));
    (matches && expected.is_some()).then(|| host.to_string())
}

/// Attaches the control connection of `host`'s connector and serves it
/// once upgraded; 409 if the host has a connector already.
fn control(port: &RelayPort, req: &mut Request<Incoming>, host: String) -> Result<(), Box<Resp>> {
    let peer = connector_addr(req);
    let attachment = port.connectors().attach(&host, peer.clone()).map_err(|e| {
        Box::new(refused(
            StatusCode::CONFLICT,
            &format!("{e}: one connector per host at a time\n"),
            Refusal::Upgrade("connector_busy"),
            Some(5),
        ))
    })?;
    let upgrade = hyper::upgrade::on(req);
    let limits = port.limits();
    let (ping, dead) = (limits.link_ping(), limits.link_ping_timeout());
    let port = port.clone();
    tokio::spawn(async move {
        match upgrade.await {
            Ok(upgraded) => {
                let io = TokioIo::new(upgraded);
                let config = WebSocketConfig::default().read_buffer_size(4 * 1024);
                let ws = WebSocketStream::from_raw_socket(io, Role::Server, Some(config)).await;
                tracing::info!(host = %attachment.host(), %peer, "connector attached");
                let attached = &port.metrics().connectors_attached;
                attached.inc();
                serve_control(ws, attachment, ping, dead).await;
                attached.dec();
                tracing::info!(%host, %peer, "connector detached");
            }
            Err(e) => tracing::debug!(error = %e, "connector upgrade failed"),
        }
    });
    Ok(())
}

/// Where a connector connects from, for the status page: its socket
/// address (with the port) when it reached the relay directly, the address
/// a trusted proxy forwarded otherwise.
fn connector_addr(req: &Request<Incoming>) -> String {
    let client = req.extensions().get::<ClientAddr>().map(|c| c.0);
    let peer = req.extensions().get::<Peer>().map(|p| p.0);
    match (client, peer) {
        (Some(c), Some(p)) if c == p.ip() => p.to_string(),
        (Some(c), _) => c.to_string(),
        (None, Some(p)) => p.to_string(),
        (None, None) => String::new(),
    }
}

/// Hands link socket `link` of `host` to the link waiting for it; 404 if
/// none waits (it timed out, or the connector was replaced).
fn link_socket(
    port: &RelayPort,
    req: &mut Request<Incoming>,
    host: &str,
    link: u64,
) -> Result<(), Box<Resp>> {
    let Some(delivery) = port.connectors().claim(host, link) else {
        return Err(Box::new(refused(
            StatusCode::NOT_FOUND,
            "no link request with this number (it timed out, or the connector was replaced)\n",
            Refusal::Upgrade("connector_link"),
            None,
        )));
    };
    let upgrade = hyper::upgrade::on(req);
    let limits = FrameLimits {
        max_message_bytes: port.limits().upstream_max_frame_bytes,
        read_buffer_bytes: port.limits().upstream_read_buffer_bytes,
    };
    let port = port.clone();
    tokio::spawn(async move {
        match upgrade.await {
            Ok(upgraded) => {
                port.metrics().connector_links.inc();
                // Read like a dialed host (same codec, limits and read
                // buffer), in the server role: the connector masks.
                let io: Box<dyn HostIo> = Box::new(TokioIo::new(upgraded));
                let _ = delivery.send(Ok(HostSocket::new(io, Role::Server, limits)));
            }
            Err(e) => tracing::debug!(error = %e, "connector link upgrade failed"),
        }
    });
    Ok(())
}

/// Serves a control connection until it closes, fails, stays silent for
/// `ping` and then `dead` more after a WebSocket ping, or the connector is
/// evicted (its orders end). Dropping `attachment` on return detaches it.
async fn serve_control<S>(
    mut ws: WebSocketStream<S>,
    mut attachment: Attachment,
    ping: Duration,
    dead: Duration,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let welcome = Control::Welcome {
        host: attachment.host().to_string(),
    };
    if send(&mut ws, &welcome).await.is_err() {
        return;
    }
    let mut due = Instant::now() + ping;
    let mut pinged = false;
    loop {
        tokio::select! {
            order = attachment.orders.recv() => {
                let Some(order) = order else {
                    let _ = ws.close(Some(CloseFrame {
                        code: CloseCode::Normal,
                        reason: "host removed or changed: reconnect".into(),
                    })).await;
                    return;
                };
                if send(&mut ws, &order).await.is_err() {
                    return;
                }
            }
            msg = ws.next() => {
                match msg {
                    Some(Ok(Message::Text(t))) => {
                        if let Ok(Control::Failed { link, reason }) = serde_json::from_str(t.as_str()) {
                            attachment.failed(link, &reason);
                        }
                    }
                    Some(Ok(Message::Close(_)) | Err(_)) | None => return,
                    Some(Ok(_)) => {}
                }
                due = Instant::now() + ping;
                pinged = false;
            }
            () = tokio::time::sleep_until(due) => {
                if pinged {
                    tracing::warn!(host = %attachment.host(), "connector silent: dropped");
                    return;
                }
                if ws.send(Message::Ping(Default::default())).await.is_err() {
                    return;
                }
                pinged = true;
                due = Instant::now() + dead;
            }
        }
    }
}

/// Writes one control message as a JSON text frame.
async fn send<S>(ws: &mut WebSocketStream<S>, msg: &Control) -> Result<(), ()>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let text = serde_json::to_string(msg).map_err(|_| ())?;
    ws.send(Message::text(text)).await.map_err(|_| ())
}

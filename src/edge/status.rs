//! The status page (issue 13): `/status` (plain HTML and a little script,
//! no data), `/status.json` (the data once) and `/status/feed` (a WebSocket
//! that pushes the data as JSON whenever it changed, checked every
//! [`FEED_EVERY`]). Served on the admin listener and on the client
//! listener; the data (`/status.json`, the feed) only to principals with an
//! `admin` grant on every host ([`answer`]: the token as for an upgrade —
//! header, `bearer` sub-protocol, or query where allowed; no cookie), or on
//! the admin listener to anyone when `listen.admin_status_open` says its
//! network is trusted. The page asks for the token in a form and keeps it
//! in page memory, so it never travels in a URL. The data comes from
//! [`RelayPort::status`], read-only, and holds no URL, credential,
//! clientId or message text.
//!
//! Feeds are bounded work: one task ([`StatusFeeds::run`]) computes the
//! status once per [`FEED_EVERY`] while anyone watches and shares it through
//! a `watch` channel, so a watcher holds at most the latest copy; at most
//! `limits.status_watchers` feeds are open at once (503, counted as
//! `upgrades_refused_total{reason="status_watchers"}`); each write must
//! finish within [`WRITE_WITHIN`]; a feed whose viewer stays silent (not
//! even a pong to the feed's pings) for `limits.client_idle_secs` closes
//! with 1000; and a feed opened with a token closes when the token expires
//! (4001), is revoked (4003) or loses the `admin` grant (4000), like a
//! client socket ([`Standing`]). An authenticated feed also counts against
//! the principal's `connections_per_principal`.
//!
//! The charts' history ([`History`], issue 22) lives here too, in the task
//! that computes the status: it samples every [`FEED_EVERY`] even with no
//! feed open, into fixed-size rings; each status carries the newest point
//! (`sample`), a feed's first status (and `/status.json`) the whole history.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use http::{HeaderValue, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};
use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};

use super::history::History;
use super::layers::{Body, Refusal, Resp, refused, text};
use super::port::{ConnectionGuard, RelayPort};
use super::standing::{Needs, Standing, lost_or_never};
use crate::auth::{Principal, TokenSource};
use crate::rpc::Close;

/// Whether `path` is one of the status page's.
pub fn is_status_path(path: &str) -> bool {
    matches!(path, "/status" | "/status.json" | "/status/feed")
}

/// How often the shared status is recomputed while anyone watches.
pub const FEED_EVERY: Duration = Duration::from_millis(500);

/// How long one write to a feed (the status, a ping, the close) may take;
/// a viewer that does not read is closed after it.
pub const WRITE_WITHIN: Duration = Duration::from_secs(10);

/// How long the close handshake of a feed may take.
const CLOSE_WITHIN: Duration = Duration::from_secs(3);

/// The page itself (no external resources, no data).
const PAGE: &str = include_str!("status.html");

/// Who asks for the status data.
#[derive(Debug)]
pub enum Viewer {
    /// An authenticated principal, and where its token was.
    Principal(Principal, TokenSource),
    /// Anyone: the admin listener with `listen.admin_status_open`.
    Open,
}

/// The status shared by every feed, and the bound on their number.
#[derive(Debug)]
pub struct StatusFeeds {
    latest: watch::Sender<Option<Utf8Bytes>>,
    slots: Arc<Semaphore>,
    history: Mutex<History>,
}

impl StatusFeeds {
    /// Room for `watchers` feeds at once and `history_secs` of history.
    pub fn new(watchers: usize, history_secs: u64) -> Arc<Self> {
        Arc::new(Self {
            latest: watch::Sender::new(None),
            slots: Arc::new(Semaphore::new(watchers)),
            history: Mutex::new(History::new(Duration::from_secs(history_secs), FEED_EVERY)),
        })
    }

    /// Every [`FEED_EVERY`]: records a sample in the history (always, so a
    /// page opened later draws the recent past), and while a feed is open
    /// recomputes the status with the newest point of every series and
    /// publishes it when it changed; with no feed open it computes no
    /// status and forgets the last value (so a new feed never gets an old
    /// one). Runs until dropped (`run::start` keeps it with the listeners).
    pub async fn run(self: Arc<Self>, port: RelayPort) {
        let mut tick = tokio::time::interval(FEED_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let sample = port.sample();
            let latest = {
                let mut h = self.history();
                h.record(&sample, std::time::Instant::now(), unix_ms());
                h.latest_json()
            };
            if self.latest.receiver_count() == 0 {
                self.latest.send_if_modified(|v| v.take().is_some());
                continue;
            }
            let mut status = port.status();
            status["sample"] = latest;
            let now = status.to_string();
            self.latest.send_if_modified(|cur| {
                if cur.as_ref().is_some_and(|c| c.as_str() == now) {
                    return false;
                }
                *cur = Some(Utf8Bytes::from(now));
                true
            });
        }
    }
}

impl StatusFeeds {
    fn history(&self) -> std::sync::MutexGuard<'_, History> {
        self.history.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every point of the history (sent once to each new feed, and with
    /// `/status.json`).
    fn history_json(&self) -> serde_json::Value {
        self.history().to_json()
    }
}

/// Milliseconds since the Unix epoch (the charts' time axis).
fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A status path for `viewer`: the page to anyone; the data to an admin
/// (403 for a principal without the `admin` grant on every host) or to an
/// open viewer.
pub fn answer(
    port: &RelayPort,
    feeds: &StatusFeeds,
    viewer: Viewer,
    mut req: Request<Incoming>,
) -> Resp {
    if req.uri().path() == "/status" {
        return page();
    }
    if let Viewer::Principal(principal, _) = &viewer
        && !port.is_admin(principal)
    {
        return text(
            StatusCode::FORBIDDEN,
            "the status data needs an admin grant\n",
        );
    }
    if req.uri().path() == "/status.json" {
        return json(port, feeds);
    }
    feed(port, feeds, viewer, &mut req)
}

/// `/status`; never inside another site's frame (no clickjacking of the
/// token form).
pub fn page() -> Resp {
    let mut r = typed(text(StatusCode::OK, PAGE), "text/html; charset=utf-8");
    let h = r.headers_mut();
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("frame-ancestors 'none'"),
    );
    r
}

/// `/status.json`: the status with the whole history.
fn json(port: &RelayPort, feeds: &StatusFeeds) -> Resp {
    let mut status = port.status();
    status["history"] = feeds.history_json();
    typed(
        text(StatusCode::OK, &status.to_string()),
        "application/json",
    )
}

fn typed(mut r: Resp, content_type: &'static str) -> Resp {
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// What an open feed holds until it ends: its watcher slot, its
/// principal's connection slot and its standing (none for an open viewer).
struct Held {
    _slot: OwnedSemaphorePermit,
    _admitted: Option<ConnectionGuard>,
    standing: Option<Standing>,
}

/// `/status/feed`: 101 and a socket that pushes the status; 400 for a
/// request that is not a WebSocket upgrade, 503 with every watcher slot
/// taken, 429 at the principal's connection cap.
fn feed(
    port: &RelayPort,
    feeds: &StatusFeeds,
    viewer: Viewer,
    req: &mut Request<Incoming>,
) -> Resp {
    let upgrade_asked = req
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let key = req.headers().get(header::SEC_WEBSOCKET_KEY).cloned();
    let Some(key) = key.filter(|_| upgrade_asked) else {
        return text(StatusCode::BAD_REQUEST, "a WebSocket upgrade is required\n");
    };
    let Ok(slot) = feeds.slots.clone().try_acquire_owned() else {
        return refused(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many status feeds open: retry later\n",
            Refusal::Upgrade("status_watchers"),
            Some(5),
        );
    };
    let (held, bearer) = match viewer {
        Viewer::Open => (
            Held {
                _slot: slot,
                _admitted: None,
                standing: None,
            },
            false,
        ),
        Viewer::Principal(principal, source) => {
            let Some(admitted) = port.admit_connection(&principal) else {
                return refused(
                    StatusCode::TOO_MANY_REQUESTS,
                    "too many connections for this principal\n",
                    Refusal::Upgrade("principal_connections"),
                    Some(5),
                );
            };
            let standing = Standing::new(port, &principal, Needs::AdminGrant);
            let held = Held {
                _slot: slot,
                _admitted: Some(admitted),
                standing: Some(standing),
            };
            (held, source == TokenSource::Subprotocol)
        }
    };
    let upgrade = hyper::upgrade::on(req);
    let port = port.clone();
    let latest = feeds.latest.subscribe();
    let history = feeds.history_json();
    tokio::spawn(async move {
        match upgrade.await {
            Ok(upgraded) => {
                let ws =
                    WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None)
                        .await;
                push(port, ws, (latest, history), held).await;
            }
            Err(e) => tracing::debug!(error = %e, "status feed upgrade failed"),
        }
    });
    switching(&key, bearer)
}

/// `101 Switching Protocols` for `key`, naming the `bearer` sub-protocol
/// when the token came in it (browsers require the echo).
fn switching(key: &HeaderValue, bearer: bool) -> Resp {
    let mut resp = Response::new(Body::default());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    if let Ok(accept) = HeaderValue::from_str(&derive_accept_key(key.as_bytes())) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
    }
    if bearer {
        h.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static("bearer"),
        );
    }
    resp
}

/// The first status a feed sends: `status` with every point of `history`
/// (later ones carry only the newest point, `sample`).
fn with_history(status: &Utf8Bytes, history: serde_json::Value) -> Utf8Bytes {
    match serde_json::from_str::<serde_json::Value>(status.as_str()) {
        Ok(mut v) => {
            v["history"] = history;
            Utf8Bytes::from(v.to_string())
        }
        Err(_) => status.clone(),
    }
}

/// Sends the shared status whenever it changed (the first time with the
/// history as it was when the feed opened), and a ping every half idle
/// period, until the viewer leaves (anything it sends other than a ping or
/// pong ends the feed), stays silent for the idle period, does not take a
/// write within [`WRITE_WITHIN`], or its standing is lost.
async fn push<S>(
    port: RelayPort,
    ws: WebSocketStream<S>,
    (mut latest, history): (watch::Receiver<Option<Utf8Bytes>>, serde_json::Value),
    mut held: Held,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (mut sink, mut stream) = ws.split();
    let idle_after = Duration::from_secs(port.limits().client_idle_secs);
    let idle_on = !idle_after.is_zero();
    let idle = tokio::time::sleep(idle_after);
    tokio::pin!(idle);
    let mut ping = tokio::time::interval_at(
        tokio::time::Instant::now() + idle_after / 2,
        (idle_after / 2).max(Duration::from_millis(100)),
    );
    latest.mark_changed();
    let mut history = Some(history);
    let close = loop {
        tokio::select! {
            close = lost_or_never(&mut held.standing, &port) => break Some(close),
            changed = latest.changed() => {
                if changed.is_err() {
                    break Some(Close::Restarting);
                }
                let now = latest.borrow_and_update().clone();
                if let Some(now) = now {
                    let now = match history.take() {
                        Some(h) => with_history(&now, h),
                        None => now,
                    };
                    if !write(&port, &mut sink, Message::Text(now)).await {
                        return;
                    }
                }
            }
            _ = ping.tick(), if idle_on => {
                if !write(&port, &mut sink, Message::Ping(Default::default())).await {
                    return;
                }
            }
            () = &mut idle, if idle_on => {
                port.metrics().limit_hits.with_label_values(&["status_idle"]).inc();
                break Some(Close::Idle);
            }
            msg = stream.next() => match msg {
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {
                    idle.as_mut().reset(tokio::time::Instant::now() + idle_after);
                }
                _ => break None,
            },
        }
    };
    if let Some(close) = close {
        close_with(sink, stream, close).await;
    }
}

/// Writes `msg` within [`WRITE_WITHIN`]; `false` (counted as
/// `limit_hits_total{limit="status_write"}` when it timed out) if the feed
/// must end.
async fn write<S>(
    port: &RelayPort,
    sink: &mut SplitSink<WebSocketStream<S>, Message>,
    msg: Message,
) -> bool
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    match tokio::time::timeout(WRITE_WITHIN, sink.send(msg)).await {
        Ok(sent) => sent.is_ok(),
        Err(_) => {
            port.metrics()
                .limit_hits
                .with_label_values(&["status_write"])
                .inc();
            false
        }
    }
}

/// Sends `close` and reads (discarding) until the viewer answers or
/// [`CLOSE_WITHIN`] passes: dropping a socket with unread data would make
/// the kernel reset it and lose the close code.
async fn close_with<S>(
    mut sink: SplitSink<WebSocketStream<S>, Message>,
    mut stream: SplitStream<WebSocketStream<S>>,
    close: Close,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let frame = CloseFrame {
        code: close.code().into(),
        reason: close.reason().into(),
    };
    let handshake = async {
        sink.send(Message::Close(Some(frame))).await.ok()?;
        while let Some(Ok(_)) = stream.next().await {}
        Some(())
    };
    let _ = tokio::time::timeout(CLOSE_WITHIN, handshake).await;
}

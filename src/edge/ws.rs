//! One client WebSocket after the upgrade: a reader that hands each frame to
//! the router, and a writer that drains the session's bounded queue and
//! sends the close frame (with the contract's §3.7 codes) when told to.

use std::time::Duration;

use futures_util::stream::SplitStream;
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::error::ProtocolError;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

use super::port::{ConnectionGuard, RelayPort};
use super::standing::{Needs, Standing};
use crate::auth::Principal;
use crate::rpc::Close;
use crate::session::outbox::{OutboxRx, outbox};
use crate::session::request::{Conn, on_client_frame};

type Kill = Option<Close>;

/// How long the close handshake (with queued frames) may take.
const CLOSE_WITHIN: Duration = Duration::from_secs(3);

/// Serves one authenticated client socket until it closes; `admitted`
/// holds the principal's connection slot until then.
pub async fn serve_client<S>(
    port: RelayPort,
    principal: Principal,
    ws: WebSocketStream<S>,
    admitted: ConnectionGuard,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    port.metrics().connections_open.inc();
    let (sink, stream) = ws.split();
    let limits = port.limits();
    let (out_tx, out_rx) = outbox(limits.client_queue_frames, limits.client_queue_bytes);
    let (kill_tx, kill_rx) = watch::channel::<Kill>(None);
    let mut writer = tokio::spawn(write_loop(sink, out_rx, kill_rx.clone()));
    let standing = Standing::new(&port, &principal, Needs::Token);
    let mut conn = port.open_conn(principal, out_tx, kill_tx);
    read_loop(&port, &mut conn, stream, kill_rx, standing).await;
    if let Some(session) = conn.session.take() {
        port.detach(&session, conn.socket);
    }
    drop(conn);
    if tokio::time::timeout(CLOSE_WITHIN * 2, &mut writer)
        .await
        .is_err()
    {
        writer.abort();
    }
    port.metrics().connections_open.dec();
    drop(admitted);
}

/// Reads client frames into the session until the socket ends, or until
/// the client answers a close this side started (or [`CLOSE_WITHIN`]
/// passes); closes with 4001/4003 when `standing` is lost. Once the
/// socket is told to close, the reader keeps reading (and discarding):
/// dropping a connection with unread data makes the
/// kernel reset it, which would discard the frames still queued and the
/// close code.
async fn read_loop<S>(
    port: &RelayPort,
    conn: &mut Conn,
    mut stream: SplitStream<WebSocketStream<S>>,
    mut killed: watch::Receiver<Kill>,
    mut standing: Standing,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut closing: Option<tokio::time::Instant> = None;
    let far = tokio::time::Instant::now() + Duration::from_secs(365 * 24 * 3600);
    // Client idle timeout (§3.6): any text frame, AHP `ping` included, resets it.
    let idle_after = Duration::from_secs(port.limits().client_idle_secs);
    let idle = tokio::time::sleep(idle_after);
    tokio::pin!(idle);
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(closing.unwrap_or(far)), if closing.is_some() => break,
            close = standing.lost(port), if closing.is_none() => {
                conn.kill.send_replace(Some(close));
            }
            msg = stream.next() => match msg {
                Some(Ok(Message::Text(t))) if closing.is_none() => {
                    idle.as_mut().reset(tokio::time::Instant::now() + idle_after);
                    on_client_frame(conn, t.as_str()).await
                }
                Some(Ok(Message::Close(_))) | None => break,
                Some(Err(_)) if closing.is_some() => break,
                other => if refuse_frame(port, conn, other, closing.is_some()) { break },
            },
            _ = &mut idle, if closing.is_none() && !idle_after.is_zero() => {
                port.metrics().limit_hits.with_label_values(&["idle"]).inc();
                conn.kill.send_replace(Some(Close::Idle));
            }
            changed = killed.changed(), if closing.is_none() => {
                if changed.is_err() || killed.borrow().is_some() {
                    closing = Some(tokio::time::Instant::now() + CLOSE_WITHIN);
                    // The session stops using this socket now, not when the
                    // close handshake ends.
                    if let Some(session) = conn.session.take() {
                        port.detach(&session, conn.socket);
                    }
                }
            }
        }
    }
}

/// Handles a read that is not a text frame for the session: a binary frame
/// closes with 1003, a read error with 1009/1007/1002 (counted by reason),
/// anything else is ignored. `true` when the read loop must end.
fn refuse_frame(
    port: &RelayPort,
    conn: &Conn,
    msg: Option<Result<Message, WsError>>,
    closing: bool,
) -> bool {
    let (close, label, end) = match msg {
        Some(Ok(Message::Binary(_))) if !closing => (Close::BinaryFrame, "binary", false),
        Some(Err(e)) => match e {
            WsError::Capacity(_) => (Close::FrameTooBig, "too_large", true),
            WsError::Utf8(_) => (Close::InvalidUtf8, "invalid_utf8", true),
            // The client went away without a close frame (a dropped network,
            // a killed process): a disconnect, not a bad frame.
            WsError::Io(_)
            | WsError::ConnectionClosed
            | WsError::AlreadyClosed
            | WsError::Protocol(ProtocolError::ResetWithoutClosingHandshake) => return true,
            _ => (Close::WsProtocol, "ws_protocol", true),
        },
        _ => return false,
    };
    port.metrics()
        .bad_client_frames
        .with_label_values(&[label])
        .inc();
    conn.kill.send_replace(Some(close));
    end
}

async fn write_loop<S>(
    mut sink: futures_util::stream::SplitSink<WebSocketStream<S>, Message>,
    mut out: OutboxRx,
    mut kill: watch::Receiver<Kill>,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    loop {
        tokio::select! {
            biased;
            changed = kill.changed() => {
                if changed.is_err() {
                    // The connection is gone (its `Conn` dropped after the
                    // client closed): nothing more will be sent. Returning
                    // here matters — a dropped sender makes `changed()`
                    // ready forever, which would spin this loop.
                    let _ = tokio::time::timeout(CLOSE_WITHIN, sink.close()).await;
                    return;
                }
                let close = *kill.borrow();
                if let Some(close) = close {
                    // Deliver what is queued (not to a slow consumer), then the
                    // close frame — bounded in time: a client that never reads
                    // cannot hold the socket open.
                    let flush = async {
                        while close != Close::SlowConsumer && let Some(f) = out.try_recv() {
                            sink.feed(Message::Text(f)).await?;
                        }
                        let frame = CloseFrame { code: close.code().into(), reason: close.reason().into() };
                        sink.send(Message::Close(Some(frame))).await
                    };
                    let _ = tokio::time::timeout(CLOSE_WITHIN, flush).await;
                    return;
                }
            }
            frame = out.recv() => {
                let Some(f) = frame else {
                    let _ = sink.close().await;
                    return;
                };
                if !coalesce(&mut sink, &mut out, f).await { return; }
                if sink.flush().await.is_err() { return; }
            }
        }
    }
}

/// Most bytes written between two flushes while frames keep coming.
const FLUSH_AFTER_BYTES: usize = 64 * 1024;

/// Feeds `first` and whatever else is queued; while more keeps arriving,
/// gives the producers (links on other worker threads) one scheduler turn
/// to queue more before the flush, so a stream goes out as a few large TLS
/// records and writes instead of one per frame. A lone frame is flushed at
/// once (nothing more was queued), and a busy stream at least every
/// [`FLUSH_AFTER_BYTES`]. `false` if the socket failed.
async fn coalesce<S>(
    sink: &mut futures_util::stream::SplitSink<WebSocketStream<S>, Message>,
    out: &mut OutboxRx,
    first: tokio_tungstenite::tungstenite::Utf8Bytes,
) -> bool
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut fed = first.len();
    if sink.feed(Message::Text(first)).await.is_err() {
        return false;
    }
    loop {
        let mut more = false;
        while let Some(f) = out.try_recv() {
            more = true;
            fed += f.len();
            if sink.feed(Message::Text(f)).await.is_err() {
                return false;
            }
        }
        if !more || fed >= FLUSH_AFTER_BYTES {
            return true;
        }
        tokio::task::yield_now().await;
    }
}

//! One client WebSocket after the upgrade: a reader that hands each frame to
//! the router, and a writer that drains the session's bounded queue a batch
//! at a time and sends the close frame (with the contract's §3.7 codes) when
//! told to. Framing and writing are `socket`'s.

use std::collections::VecDeque;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite, ReadHalf, WriteHalf};
use tokio::sync::watch;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::error::ProtocolError;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

use super::port::{ConnectionGuard, RelayPort};
use super::socket::{ReadSide, SharedWriter};
use super::standing::{Needs, Standing};
use crate::auth::Principal;
use crate::rpc::Close;
use crate::session::outbox::{OutboxRx, outbox};
use crate::session::request::{Conn, on_client_frame};

type Kill = Option<Close>;

/// How long the close handshake (with queued frames) may take.
const CLOSE_WITHIN: Duration = Duration::from_secs(3);

/// Serves one authenticated client socket (`io`, upgraded) until it closes;
/// `admitted` holds the principal's connection slot until then.
pub async fn serve_client<S>(
    port: RelayPort,
    principal: Principal,
    io: S,
    config: WebSocketConfig,
    admitted: ConnectionGuard,
) where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    port.metrics().connections_open.inc();
    let (read, write) = super::socket::split(io);
    let stream = WebSocketStream::from_raw_socket(read, Role::Server, Some(config)).await;
    let limits = port.limits();
    let (out_tx, out_rx) = outbox(limits.client_queue_frames, limits.client_queue_bytes);
    out_rx.attach(std::sync::Arc::new(write.clone()));
    let (kill_tx, kill_rx) = watch::channel::<Kill>(None);
    let mut writer = tokio::spawn(write_loop(write, out_rx, kill_rx.clone()));
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
    mut stream: WebSocketStream<ReadSide<ReadHalf<S>>>,
    mut killed: watch::Receiver<Kill>,
    mut standing: Standing,
) where
    S: AsyncRead + AsyncWrite,
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
                    let kill = conn.kill.clone();
                    let handled = on_client_frame(conn, t.as_str());
                    while_standing(handled, (&mut standing, port), &kill).await
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

/// Runs `handled` — a client frame's handling, which may wait for hosts (a
/// `reconnect`'s settle, paths resolved before a write) — to its end, and
/// meanwhile still closes the socket the moment its standing is lost
/// (4001/4003): the socket stops receiving then, not when the request
/// ends. The handling is never cut short (what it reserved or held is
/// undone by its own end); the read loop then sees the kill.
async fn while_standing(
    handled: impl std::future::Future<Output = ()>,
    (standing, port): (&mut Standing, &RelayPort),
    kill: &watch::Sender<Kill>,
) {
    tokio::pin!(handled);
    tokio::select! {
        biased;
        () = &mut handled => return,
        close = standing.lost(port) => {
            kill.send_replace(Some(close));
        }
    }
    handled.await
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

/// Writes the session's frames a batch at a time until the socket is told
/// to close (queued frames, then the close frame) or the connection is gone.
async fn write_loop<S>(
    writer: SharedWriter<WriteHalf<S>>,
    mut out: OutboxRx,
    mut kill: watch::Receiver<Kill>,
) where
    S: AsyncRead + AsyncWrite,
{
    let control = writer.control();
    let mut batch = VecDeque::new();
    loop {
        tokio::select! {
            biased;
            changed = kill.changed() => {
                if changed.is_err() {
                    // The connection is gone (its `Conn` dropped after the
                    // client closed): nothing more will be sent but the
                    // reader's reply to a close. Returning here matters — a
                    // dropped sender makes `changed()` ready forever.
                    let _ = tokio::time::timeout(CLOSE_WITHIN, writer.finish()).await;
                    return;
                }
                let close = *kill.borrow();
                if let Some(close) = close {
                    // Deliver what is queued (not to a slow consumer), then the
                    // close frame — bounded in time: a client that never reads
                    // cannot hold the socket open.
                    let flush = async {
                        if close != Close::SlowConsumer && out.take_all(&mut batch) {
                            writer.write_frames(&mut batch).await?;
                        }
                        writer.close(close).await
                    };
                    let _ = tokio::time::timeout(CLOSE_WITHIN, flush).await;
                    return;
                }
            }
            () = control.queued() => {
                if writer.write_control().await.is_err() { return; }
            }
            more = out.recv_batch(&mut batch) => {
                if !more {
                    let _ = tokio::time::timeout(CLOSE_WITHIN, writer.finish()).await;
                    return;
                }
                if writer.write_frames(&mut batch).await.is_err() { return; }
            }
        }
    }
}

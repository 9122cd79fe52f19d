//! A client WebSocket's two halves after the upgrade.
//!
//! Reading stays with tungstenite (masking, fragments, control frames, UTF-8
//! and size limits, close codes for bad input). Writing is this module's: the
//! frames a session queued are framed here — a server's frames are unmasked,
//! so a text frame is a 2–10 byte header before the payload — into one buffer
//! per batch and written with one `write_all` and one flush. A frame is thus
//! copied once on its way to TLS (which encrypts the batch into records of at
//! most 16 KiB and writes them with one `writev`), never through a second
//! WebSocket write buffer, and a batch of frames costs one TLS write.
//!
//! Control frames that tungstenite's reader must send (a pong, the reply to a
//! client's close) are written by the reader into [`ReadSide`]'s write side,
//! which hands the bytes to the writer through [`Control`]; the writer puts
//! them between whole frames.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use crate::rpc::Close;
use crate::wire::Text;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf, ReadHalf, WriteHalf};
use tokio::sync::Notify;

/// Bytes of a batch after which the writer writes what it framed so far and
/// frames the rest into the emptied buffer.
const WRITE_CHUNK_BYTES: usize = 256 * 1024;
/// Capacity the writer's buffer keeps between batches; a larger one is
/// freed, so an idle client holds no batch-sized buffer.
const KEEP_BUFFER_BYTES: usize = 4 * 1024;
/// Longest header of an unmasked frame.
const MAX_HEADER: usize = 10;
/// Longest close reason a close frame can carry (RFC 6455 §5.5: a control
/// frame's payload is at most 125 bytes, two of them the code).
const MAX_CLOSE_REASON: usize = 123;

/// Bytes the reader's tungstenite asked to send, waiting for the writer.
#[derive(Debug, Default)]
pub struct Control {
    bytes: Mutex<Vec<u8>>,
    wake: Notify,
}

impl Control {
    fn push(&self, buf: &[u8]) {
        self.bytes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        self.wake.notify_one();
    }

    fn take(&self) -> Vec<u8> {
        std::mem::take(&mut *self.bytes.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Resolves when the reader has queued control bytes.
    pub async fn queued(&self) {
        self.wake.notified().await;
    }
}

/// The read half as tungstenite's stream: reads from the socket, and writes
/// (control frames only: the session's frames never pass here) to [`Control`].
#[derive(Debug)]
pub struct ReadSide<R> {
    read: R,
    control: Arc<Control>,
}

impl<R: AsyncRead + Unpin> AsyncRead for ReadSide<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.read).poll_read(cx, buf)
    }
}

impl<R: Unpin> AsyncWrite for ReadSide<R> {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.control.push(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Splits an upgraded connection into tungstenite's read side and the
/// frame writer.
pub fn split<S>(io: S) -> (ReadSide<ReadHalf<S>>, FrameWriter<WriteHalf<S>>)
where
    S: AsyncRead + AsyncWrite,
{
    let (read, write) = tokio::io::split(io);
    let control = Arc::new(Control::default());
    (
        ReadSide {
            read,
            control: control.clone(),
        },
        FrameWriter {
            io: write,
            buf: Vec::new(),
            control,
        },
    )
}

/// The write half of a client socket: frames, control bytes, the close frame.
#[derive(Debug)]
pub struct FrameWriter<W> {
    io: W,
    buf: Vec<u8>,
    control: Arc<Control>,
}

impl<W: AsyncWrite + Unpin> FrameWriter<W> {
    /// Where the reader's control bytes are announced.
    pub fn control(&self) -> Arc<Control> {
        self.control.clone()
    }

    /// Writes every frame of `frames` (emptying it) as text frames, then
    /// flushes once.
    pub async fn write_frames(&mut self, frames: &mut VecDeque<Text>) -> io::Result<()> {
        self.append_control();
        // One allocation for the batch (or its first chunk), not one per doubling.
        let framed: usize = frames.iter().map(|f| f.len() + MAX_HEADER).sum();
        self.buf.reserve(framed.min(WRITE_CHUNK_BYTES + MAX_HEADER));
        while let Some(frame) = frames.pop_front() {
            text_frame_into(&mut self.buf, frame.as_bytes());
            if self.buf.len() >= WRITE_CHUNK_BYTES {
                self.io.write_all(&self.buf).await?;
                self.buf.clear();
            }
        }
        self.send().await
    }

    /// Writes the control bytes the reader queued.
    pub async fn write_control(&mut self) -> io::Result<()> {
        self.append_control();
        self.send().await
    }

    /// Writes the close frame for `close` (after any queued control bytes).
    pub async fn close(&mut self, close: Close) -> io::Result<()> {
        self.append_control();
        close_frame_into(&mut self.buf, close.code(), close.reason());
        self.send().await
    }

    /// Writes queued control bytes and shuts the write side down (TLS
    /// `close_notify`, then the TCP write side).
    pub async fn finish(&mut self) -> io::Result<()> {
        self.write_control().await?;
        self.io.shutdown().await
    }

    fn append_control(&mut self) {
        let control = self.control.take();
        self.buf.extend_from_slice(&control);
    }

    async fn send(&mut self) -> io::Result<()> {
        if !self.buf.is_empty() {
            self.io.write_all(&self.buf).await?;
            self.buf.clear();
        }
        if self.buf.capacity() > KEEP_BUFFER_BYTES {
            self.buf = Vec::new();
        }
        self.io.flush().await
    }
}

/// Appends a final, unmasked frame header with `opcode` for `len` bytes.
fn header_into(out: &mut Vec<u8>, opcode: u8, len: usize) {
    out.push(0x80 | opcode);
    if len < 126 {
        out.push(len as u8);
    } else if let Ok(short) = u16::try_from(len) {
        out.push(126);
        out.extend_from_slice(&short.to_be_bytes());
    } else {
        out.push(127);
        out.extend_from_slice(&(len as u64).to_be_bytes());
    }
}

/// Appends one text frame carrying `payload` (UTF-8 by the type it came in).
pub fn text_frame_into(out: &mut Vec<u8>, payload: &[u8]) {
    header_into(out, 0x1, payload.len());
    out.extend_from_slice(payload);
}

/// Appends a close frame with `code` and `reason` (cut at a character
/// boundary to fit a control frame).
pub fn close_frame_into(out: &mut Vec<u8>, code: u16, reason: &str) {
    let mut end = reason.len().min(MAX_CLOSE_REASON);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    let reason = &reason.as_bytes()[..end];
    header_into(out, 0x8, 2 + reason.len());
    out.extend_from_slice(&code.to_be_bytes());
    out.extend_from_slice(reason);
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    use tokio_tungstenite::tungstenite::protocol::{Role, WebSocket};
    use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};

    /// Reads `bytes` as a client would (tungstenite, client role).
    fn read_all(bytes: Vec<u8>) -> Vec<Message> {
        let mut ws = WebSocket::from_raw_socket(io::Cursor::new(bytes), Role::Client, None);
        let mut out = Vec::new();
        while let Ok(m) = ws.read() {
            let close = matches!(m, Message::Close(_));
            out.push(m);
            if close {
                break;
            }
        }
        out
    }

    #[test]
    fn frames_of_every_length_class_read_back_as_sent() {
        let mut out = Vec::new();
        let texts: Vec<String> = [0usize, 1, 125, 126, 65_535, 65_536, 200_000]
            .iter()
            .map(|n| "é".repeat(n / 2) + &"x".repeat(n % 2))
            .collect();
        for t in &texts {
            text_frame_into(&mut out, t.as_bytes());
        }
        close_frame_into(&mut out, 4008, "slow consumer");
        let got = read_all(out);
        assert_eq!(got.len(), texts.len() + 1);
        for (m, t) in got.iter().zip(&texts) {
            assert_eq!(m, &Message::Text(Utf8Bytes::from(t.clone())));
        }
        let Message::Close(Some(close)) = &got[texts.len()] else {
            panic!("no close frame: {:?}", got.last());
        };
        assert_eq!(close.code, CloseCode::from(4008));
        assert_eq!(close.reason.as_str(), "slow consumer");
    }

    #[test]
    fn a_long_close_reason_is_cut_at_a_character_boundary() {
        let mut out = Vec::new();
        close_frame_into(&mut out, 1000, &"ü".repeat(100));
        assert_eq!(
            out[1] as usize,
            2 + 122,
            "61 two-byte characters fit in 123 bytes"
        );
        let got = read_all(out);
        assert!(matches!(&got[0], Message::Close(Some(c)) if c.reason.as_str() == "ü".repeat(61)));
    }

    #[tokio::test]
    async fn a_batch_is_written_in_order_with_the_readers_control_bytes_first() {
        let (client, server) = tokio::io::duplex(1 << 20);
        let (mut read_side, mut writer) = split(server);
        // The reader's tungstenite answers a ping: its pong goes out first.
        let mut pong = Vec::new();
        header_into(&mut pong, 0xA, 2);
        pong.extend_from_slice(b"hi");
        read_side.write_all(&pong).await.unwrap();
        let mut batch: VecDeque<Text> = (0..300).map(|i| format!("frame {i}").into()).collect();
        writer.write_frames(&mut batch).await.unwrap();
        assert!(batch.is_empty());
        writer.close(Close::SlowConsumer).await.unwrap();
        drop((read_side, writer));
        let mut bytes = Vec::new();
        let mut client = client;
        tokio::io::AsyncReadExt::read_to_end(&mut client, &mut bytes)
            .await
            .unwrap();
        let got = read_all(bytes);
        assert_eq!(got[0], Message::Pong(b"hi".to_vec().into()));
        for (i, m) in got[1..301].iter().enumerate() {
            assert_eq!(m, &Message::Text(format!("frame {i}").into()));
        }
        assert!(matches!(&got[301], Message::Close(Some(c)) if u16::from(c.code) == 4008));
    }
}

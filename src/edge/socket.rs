//! A client WebSocket's two halves after the upgrade.
//!
//! Reading stays with tungstenite (masking, fragments, control frames, UTF-8
//! and size limits, close codes for bad input). Writing is this module's: the
//! frames a session queued are framed here — a server's frames are unmasked,
//! so a text frame is a 2–10 byte header before the payload, which a spliced
//! envelope already carries in front of its bytes (`Text::framed`, written
//! by the splice with [`put_frame_header`], the one place frames are headed).
//! A batch of more than 4 KiB framed is handed to the stream as slices (each
//! spliced frame as one, header and bytes where they lie; any other frame as
//! its header, then its bytes) in one vectored write and one flush: TLS
//! copies each slice once into its records (of at most 16 KiB, written with
//! one `writev`), so a large batch is never copied through a WebSocket write
//! buffer, and a batch costs one TLS write. A smaller one is framed into a
//! scratch buffer of the thread's (none per connection) and written from it
//! in one piece. Only what the stream does not take at once is kept in the
//! writer's buffer, to be written by the writer task.
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
use crate::session::outbox::{DirectWrite, Frames};
use crate::wire::{MAX_FRAME_HEADER, Text, frame_header_len, put_frame_header};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf, ReadHalf, WriteHalf};
use tokio::sync::Notify;

/// Capacity the writer's buffer keeps between batches; a larger one is
/// freed, so an idle client holds no batch-sized buffer.
const KEEP_BUFFER_BYTES: usize = 4 * 1024;
/// Largest batch (framed) written from the thread's scratch buffer in one
/// piece rather than as slices: a paced batch is one or two ~330-byte
/// frames, for which copying them costs less than a slice list and rustls's
/// own list of the slices (BENCHMARKS.md, fourteenth round).
const SMALL_BATCH_BYTES: usize = 4 * 1024;

thread_local! {
    /// Where a small batch is framed for its one write: one buffer per
    /// thread (at most about [`SMALL_BATCH_BYTES`]), none per connection, so
    /// an idle client keeps no batch buffer.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Most bytes handed to the stream in one slice. rustls copies each slice
/// into its record with one `memcpy`; glibc's switches to `rep movsb` at
/// about 2 KiB, which on AMD EPYC (Zen) ran 7× slower per byte than its
/// vector loop for these copies (15.5 % of the relay's CPU against 1.5 %,
/// BENCHMARKS.md, fifth round). Smaller slices keep every copy on the loop.
const SLICE_BYTES: usize = 2048;
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
pub fn split<S>(io: S) -> (ReadSide<ReadHalf<S>>, SharedWriter<WriteHalf<S>>)
where
    S: AsyncRead + AsyncWrite,
{
    let (read, write) = tokio::io::split(io);
    let control = Arc::new(Control::default());
    let writer = FrameWriter {
        io: write,
        buf: Vec::new(),
        sent: 0,
        heads: Vec::new(),
        control: control.clone(),
        closed: false,
        task: None,
    };
    (
        ReadSide { read, control },
        SharedWriter {
            inner: Arc::new(Mutex::new(writer)),
        },
    )
}

/// The write half of a client socket, shared by its writer task and the
/// session's links (which write a batch directly when the writer task is
/// idle: [`DirectWrite`]). The lock is held for one poll at a time, never
/// across an await, so neither side waits on the other's socket.
#[derive(Debug)]
pub struct SharedWriter<W> {
    inner: Arc<Mutex<FrameWriter<W>>>,
}

impl<W> Clone for SharedWriter<W> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

/// Frames, control bytes and the close frame, encoded into one buffer and
/// written from it.
#[derive(Debug)]
struct FrameWriter<W> {
    io: W,
    /// Encoded bytes; `buf[..sent]` already reached the stream.
    buf: Vec<u8>,
    sent: usize,
    /// The headers of the frames of a vectored write (scratch).
    heads: Vec<u8>,
    control: Arc<Control>,
    /// The close frame is encoded: nothing is written after it.
    closed: bool,
    /// The writer task's waker from its last drain. A direct write that
    /// finds the socket full registered a no-op waker with the socket in its
    /// place; waking the task makes it poll again and register its own.
    task: Option<std::task::Waker>,
}

impl<W: AsyncWrite + Unpin> SharedWriter<W> {
    fn lock(&self) -> std::sync::MutexGuard<'_, FrameWriter<W>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Where the reader's control bytes are announced.
    pub fn control(&self) -> Arc<Control> {
        self.lock().control.clone()
    }

    /// Writes every frame of `frames` (emptying it) as text frames, after
    /// whatever is still pending, then flushes.
    pub async fn write_frames(&self, frames: &mut VecDeque<Text>) -> io::Result<()> {
        let mut frames = Some(frames);
        std::future::poll_fn(|cx| {
            let mut w = self.lock();
            w.note_task(cx);
            match frames.take() {
                Some(queue) => w.send(cx, Frames::Queued(queue)),
                None => w.poll_drain(cx),
            }
        })
        .await
    }

    /// Writes the control bytes the reader queued.
    pub async fn write_control(&self) -> io::Result<()> {
        self.lock().encode(Frames::Queued(&mut VecDeque::new()));
        self.drain().await
    }

    /// Writes the close frame for `close` (after what is pending); nothing
    /// is written after it.
    pub async fn close(&self, close: Close) -> io::Result<()> {
        {
            let mut w = self.lock();
            w.encode(Frames::Queued(&mut VecDeque::new()));
            close_frame_into(&mut w.buf, close.code(), close.reason());
            w.closed = true;
        }
        self.drain().await
    }

    /// Writes what is pending and shuts the write side down (TLS
    /// `close_notify`, then the TCP write side).
    pub async fn finish(&self) -> io::Result<()> {
        self.write_control().await?;
        std::future::poll_fn(|cx| Pin::new(&mut self.lock().io).poll_shutdown(cx)).await
    }

    /// Writes everything encoded so far and flushes.
    async fn drain(&self) -> io::Result<()> {
        std::future::poll_fn(|cx| {
            let mut w = self.lock();
            w.note_task(cx);
            w.poll_drain(cx)
        })
        .await
    }
}

impl<W: AsyncWrite + Unpin + Send> DirectWrite for SharedWriter<W> {
    fn write_now(&self, frames: Frames<'_>) -> Option<bool> {
        let mut w = self.inner.try_lock().ok()?;
        // Bytes still pending mean the socket is not taking them: the frames
        // wait in the bounded queue instead, so a client that does not read
        // fills it and is found slow (§5.9). At most one batch is ever
        // outside the queue's bounds.
        if w.closed || w.sent < w.buf.len() {
            return None;
        }
        let mut cx = Context::from_waker(std::task::Waker::noop());
        // An error is the writer task's to see (its next write fails too)
        // and the reader's (the connection ends): nothing is left to write.
        let pending = w.send(&mut cx, frames).is_pending();
        if pending && let Some(task) = &w.task {
            // The socket now holds the no-op waker: the writer task (which
            // may be waiting on the socket itself) must register its own.
            task.wake_by_ref();
        }
        Some(!pending)
    }
}

impl<W: AsyncWrite + Unpin> FrameWriter<W> {
    /// Remembers the writer task's waker (see `task`).
    fn note_task(&mut self, cx: &Context<'_>) {
        if !self.task.as_ref().is_some_and(|t| t.will_wake(cx.waker())) {
            self.task = Some(cx.waker().clone());
        }
    }

    /// Writes the reader's control bytes, then `frames` (emptying a queue;
    /// none after the close frame), then flushes. With nothing pending and a
    /// stream that takes slices, a batch of more than [`SMALL_BATCH_BYTES`]
    /// goes out from where it lies (one vectored write; the part the stream
    /// does not take now is copied to `buf` for [`FrameWriter::poll_drain`])
    /// and a smaller one in one piece from the thread's scratch buffer
    /// ([`FrameWriter::send_small`]). Otherwise the frames are encoded into
    /// `buf`, behind what is pending.
    fn send(&mut self, cx: &mut Context<'_>, frames: Frames<'_>) -> Poll<io::Result<()>> {
        if self.closed || self.sent < self.buf.len() || !self.io.is_write_vectored() {
            self.encode(frames);
            return self.poll_drain(cx);
        }
        if framed_len(&frames) <= SMALL_BATCH_BYTES {
            return self.send_small(cx, frames);
        }
        let control = self.control.take();
        let sent = match frames {
            Frames::Queued(queue) => {
                let sent = self.send_slices(cx, &control, queue.iter());
                queue.clear();
                sent
            }
            Frames::Kept(kept) => self.send_slices(cx, &control, kept.map(|(_, f)| f)),
        };
        match sent {
            Poll::Ready(Ok(())) => self.poll_drain(cx),
            other => other,
        }
    }

    /// Frames the control bytes and `frames` (emptying a queue) into this
    /// thread's scratch buffer and writes them from it in one piece (the
    /// stream's single-slice path), then flushes; what the stream does not
    /// take now is copied to the empty `buf` for [`FrameWriter::poll_drain`].
    fn send_small(&mut self, cx: &mut Context<'_>, frames: Frames<'_>) -> Poll<io::Result<()>> {
        let control = self.control.take();
        let mut frames = Some(frames);
        let written = SCRATCH.with(|scratch| {
            let mut bytes = scratch.try_borrow_mut().ok()?;
            bytes.clear();
            bytes.extend_from_slice(&control);
            encode_frames(&mut bytes, frames.take()?);
            let mut rest = bytes.as_slice();
            while !rest.is_empty() {
                match Pin::new(&mut self.io).poll_write(cx, rest) {
                    Poll::Ready(Ok(0)) => return Some(Err(io::ErrorKind::WriteZero.into())),
                    Poll::Ready(Ok(n)) => rest = rest.get(n..).unwrap_or_default(),
                    Poll::Ready(Err(e)) => return Some(Err(e)),
                    Poll::Pending => break,
                }
            }
            self.buf.extend_from_slice(rest);
            if bytes.capacity() > 2 * SMALL_BATCH_BYTES {
                // Many control bytes came with this batch: no thread keeps more.
                *bytes = Vec::new();
            }
            Some(Ok(()))
        });
        match written {
            Some(Ok(())) => self.poll_drain(cx),
            Some(Err(e)) => Poll::Ready(Err(e)),
            // The scratch buffer is in use further up this thread's stack
            // (never by this module's own calls): encode into `buf` instead.
            None => {
                self.buf.extend_from_slice(&control);
                if let Some(frames) = frames {
                    encode_frames(&mut self.buf, frames);
                }
                self.poll_drain(cx)
            }
        }
    }

    /// Writes `control` then `frames` as slices, until the stream takes them
    /// all (`Ready(Ok)`, not yet flushed) or is full (`Pending`: the rest is
    /// copied to the empty `buf`).
    fn send_slices<'a>(
        &mut self,
        cx: &mut Context<'_>,
        control: &[u8],
        frames: impl Iterator<Item = &'a Text> + Clone,
    ) -> Poll<io::Result<()>> {
        // Headers for the texts that carry none, made before any slice
        // borrows them (a spliced text carries its header: one slice for both).
        self.heads.clear();
        for frame in frames.clone().filter(|f| f.framed().is_none()) {
            header_into(&mut self.heads, 0x1, frame.len());
        }
        let mut slices = Vec::with_capacity(1 + frames.size_hint().0);
        slices.push(io::IoSlice::new(control));
        let mut heads = self.heads.as_slice();
        // Frames whose bytes continue one another in their batch's buffer
        // go as one slice of up to SLICE_BYTES: `run` is its first and
        // latest frame.
        let mut run: Option<(&Text, &Text)> = None;
        for frame in frames {
            if let Some((first, latest)) = run {
                if frame.follows(latest) && frame.framed_from(first).len() <= SLICE_BYTES {
                    run = Some((first, frame));
                    continue;
                }
                slices.push(io::IoSlice::new(latest.framed_from(first)));
                run = None;
            }
            let bytes = match frame.framed() {
                Some(framed) if framed.len() <= SLICE_BYTES => {
                    run = Some((frame, frame));
                    continue;
                }
                Some(framed) => framed,
                None => {
                    let (head, rest) =
                        heads.split_at(frame_header_len(frame.len()).min(heads.len()));
                    heads = rest;
                    slices.push(io::IoSlice::new(head));
                    frame.as_bytes()
                }
            };
            slices.extend(bytes.chunks(SLICE_BYTES).map(io::IoSlice::new));
        }
        if let Some((first, latest)) = run {
            slices.push(io::IoSlice::new(latest.framed_from(first)));
        }
        let mut rest = slices.as_mut_slice();
        io::IoSlice::advance_slices(&mut rest, 0);
        while !rest.is_empty() {
            match Pin::new(&mut self.io).poll_write_vectored(cx, rest) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => io::IoSlice::advance_slices(&mut rest, n),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {
                    for slice in rest.iter() {
                        self.buf.extend_from_slice(slice);
                    }
                    return Poll::Pending;
                }
            }
        }
        if self.heads.capacity() > KEEP_BUFFER_BYTES {
            self.heads = Vec::new();
        }
        Poll::Ready(Ok(()))
    }

    /// Appends the reader's control bytes, then `frames` (emptying a queue;
    /// none after the close frame).
    fn encode(&mut self, frames: Frames<'_>) {
        let control = self.control.take();
        self.buf.extend_from_slice(&control);
        match frames {
            Frames::Queued(queue) if self.closed => queue.clear(),
            Frames::Kept(_) if self.closed => {}
            frames => encode_frames(&mut self.buf, frames),
        }
    }

    /// Writes `buf[sent..]`, then flushes; a large buffer is freed once
    /// empty, so an idle client holds no batch-sized buffer.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.buf.len() {
            let rest = self.buf.get(self.sent..).unwrap_or_default();
            match Pin::new(&mut self.io).poll_write(cx, rest) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => self.sent += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        self.buf.clear();
        self.sent = 0;
        if self.buf.capacity() > KEEP_BUFFER_BYTES {
            self.buf = Vec::new();
        }
        Pin::new(&mut self.io).poll_flush(cx)
    }
}

/// Appends `frames` to `out` as text frames (emptying a queue).
fn encode_frames(out: &mut Vec<u8>, frames: Frames<'_>) {
    match frames {
        Frames::Queued(queue) => {
            encode_texts(out, queue.iter());
            queue.clear();
        }
        Frames::Kept(kept) => encode_texts(out, kept.map(|(_, f)| f)),
    }
}

/// Appends `frames` to `out` as text frames.
fn encode_texts<'a>(out: &mut Vec<u8>, frames: impl Iterator<Item = &'a Text> + Clone) {
    // One allocation for the batch, not one per doubling.
    let framed: usize = frames.clone().map(|f| f.len() + MAX_FRAME_HEADER).sum();
    out.reserve(framed);
    for frame in frames {
        match frame.framed() {
            Some(framed) => out.extend_from_slice(framed),
            None => text_frame_into(out, frame.as_bytes()),
        }
    }
}

/// The bytes `frames` take framed, the control bytes aside.
fn framed_len(frames: &Frames<'_>) -> usize {
    let framed = |len: usize| frame_header_len(len) + len;
    match frames {
        Frames::Queued(queue) => queue.iter().map(|f| framed(f.len())).sum(),
        Frames::Kept(kept) => kept.clone().map(|(_, f)| framed(f.len())).sum(),
    }
}

/// Appends a final, unmasked frame header with `opcode` for `len` bytes.
fn header_into(out: &mut Vec<u8>, opcode: u8, len: usize) {
    put_frame_header(out, opcode, len);
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
    use tokio::io::AsyncWriteExt;
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

    /// Asserts that the bytes of `writes`, read as a client reads them, are
    /// text frames of `want`, in order.
    fn assert_reads_back<'a>(
        writes: Vec<(bool, Vec<u8>)>,
        want: impl IntoIterator<Item = &'a str>,
    ) {
        let want: Vec<Message> = want.into_iter().map(|t| Message::Text(t.into())).collect();
        assert_eq!(
            read_all(writes.into_iter().flat_map(|(_, b)| b).collect()),
            want
        );
    }

    /// Twenty texts of 302 bytes (frames of 306 with their header), and
    /// what `splice` makes of each with an edit that writes it unchanged.
    fn spliced_unchanged<T>(
        mut splice: impl FnMut(&str, &mut [crate::wire::Edit<'_>]) -> T,
    ) -> (Vec<String>, Vec<T>) {
        use crate::wire::{Edit, EditValue};
        let texts: Vec<String> = (0..20).map(|i| format!("[{i:>300}]")).collect();
        let spliced = texts
            .iter()
            .map(|t| {
                let mut edits = [Edit {
                    range: 1..t.len() - 1,
                    replacement: EditValue::Raw(&t[1..t.len() - 1]),
                }];
                splice(t, &mut edits)
            })
            .collect();
        (texts, spliced)
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

    /// A pipe that takes slices (as TLS does: each vectored write takes what
    /// the pipe takes of the slices' bytes, in order) or does not (a write
    /// of slices takes the first one alone).
    struct Pipe(tokio::io::DuplexStream, bool);

    impl AsyncRead for Pipe {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for Pipe {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            Pin::new(&mut self.0).poll_write(cx, buf)
        }
        fn poll_write_vectored(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            bufs: &[io::IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            let joined: Vec<u8> = match self.1 {
                true => bufs.iter().flat_map(|b| b.iter().copied()).collect(),
                false => bufs
                    .iter()
                    .find(|b| !b.is_empty())
                    .map_or(vec![], |b| b.to_vec()),
            };
            self.poll_write(cx, &joined)
        }
        fn is_write_vectored(&self) -> bool {
            self.1
        }
        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_flush(cx)
        }
        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_shutdown(cx)
        }
    }

    /// A stream that takes everything and records each write: its bytes,
    /// and whether it came as slices; and how many non-empty slices each
    /// vectored write had.
    #[derive(Default)]
    struct Recorder(Vec<(bool, Vec<u8>)>, Vec<usize>);

    impl AsyncWrite for Recorder {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.0.push((false, buf.to_vec()));
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[io::IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            let joined: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
            let n = joined.len();
            self.0.push((true, joined));
            let slices = bufs.iter().filter(|b| !b.is_empty()).count();
            self.1.push(slices);
            Poll::Ready(Ok(n))
        }
        fn is_write_vectored(&self) -> bool {
            true
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// A batch of at most 4 KiB framed goes out as one contiguous write (one
    /// TLS record without a slice list) and leaves the connection no buffer;
    /// a larger one as slices from where its frames lie. Both read back as
    /// the frames sent.
    #[test]
    fn small_batches_are_written_whole_and_large_ones_as_slices() {
        let writer = recording_writer();
        let small: Vec<String> = (0..3).map(|i| format!("{i:>300}")).collect();
        let large: Vec<String> = (0..20).map(|i| format!("{i:>300}")).collect();
        for texts in [&small, &large] {
            let mut queue: VecDeque<Text> = texts.iter().map(|t| Text::from(t.as_str())).collect();
            assert_eq!(writer.write_now(Frames::Queued(&mut queue)), Some(true));
            assert_eq!(
                writer.lock().buf.capacity(),
                0,
                "no buffer kept per connection"
            );
        }
        let writes = std::mem::take(&mut writer.lock().io.0);
        let kinds: Vec<bool> = writes.iter().map(|(vectored, _)| *vectored).collect();
        assert_eq!(
            kinds,
            [false, true],
            "the small batch whole, the large as slices"
        );
        assert_reads_back(writes, small.iter().chain(&large).map(String::as_str));
    }

    /// A spliced text carries its frame header in front (`Text::framed`):
    /// a large batch of them goes to the stream as one slice per frame
    /// (header and payload together), texts without one as two; the bytes
    /// read back as the frames sent either way.
    #[test]
    fn spliced_texts_are_written_as_one_slice_per_frame() {
        let writer = recording_writer();
        let mut arena = bytes::BytesMut::new();
        let (texts, spliced) =
            spliced_unchanged(|t, edits| crate::wire::splice_into(t, edits, &mut arena).unwrap());
        let spliced = VecDeque::from(spliced);
        assert!(spliced.iter().all(|t| t.framed().is_some()));
        let plain: VecDeque<Text> = texts.iter().map(|t| Text::from(t.as_str())).collect();
        for mut queue in [spliced, plain] {
            assert_eq!(writer.write_now(Frames::Queued(&mut queue)), Some(true));
        }
        let (writes, slices) = std::mem::take(&mut writer.lock().io).into_parts();
        assert_eq!(
            slices,
            [20, 40],
            "one slice per spliced frame, two per plain one"
        );
        assert_reads_back(writes, texts.iter().chain(&texts).map(String::as_str));
    }

    /// The texts of one batch (spliced one after another, `Text::in_batch`)
    /// go to the stream as slices of up to SLICE_BYTES holding several
    /// frames each; a text of its own between them starts a new slice; the
    /// bytes read back as the frames sent, in order.
    #[test]
    fn a_batch_s_texts_are_written_as_few_slices() {
        let writer = recording_writer();
        let mut arena = bytes::BytesMut::new();
        let (texts, pieces) =
            spliced_unchanged(|t, edits| crate::wire::splice_at(t, edits, &mut arena).unwrap());
        let whole = arena.freeze();
        let mut queue: VecDeque<Text> = pieces.iter().map(|p| Text::in_batch(&whole, *p)).collect();
        let framed = queue[0].framed().map_or(0, <[u8]>::len);
        queue.insert(10, Text::from("between"));
        assert_eq!(writer.write_now(Frames::Queued(&mut queue)), Some(true));
        let (writes, slices) = std::mem::take(&mut writer.lock().io).into_parts();
        // Ten frames on each side, SLICE_BYTES / framed to a slice; the
        // text between them is a header and a payload.
        let per_slice = SLICE_BYTES / framed;
        assert!(per_slice > 1, "{framed}-byte frames");
        assert_eq!(slices, [2 * 10usize.div_ceil(per_slice) + 2]);
        let want = texts[..10]
            .iter()
            .map(String::as_str)
            .chain(["between"])
            .chain(texts[10..].iter().map(String::as_str));
        assert_reads_back(writes, want);
    }

    impl Recorder {
        fn into_parts(self) -> (Vec<(bool, Vec<u8>)>, Vec<usize>) {
            (self.0, self.1)
        }
    }

    /// A writer with nothing pending over a [`Recorder`].
    fn recording_writer() -> SharedWriter<Recorder> {
        SharedWriter {
            inner: Arc::new(Mutex::new(FrameWriter {
                io: Recorder::default(),
                buf: Vec::new(),
                sent: 0,
                heads: Vec::new(),
                control: Arc::new(Control::default()),
                closed: false,
                task: None,
            })),
        }
    }

    #[tokio::test]
    async fn a_direct_write_goes_out_at_once_or_leaves_the_rest_to_drain() {
        for vectored in [false, true] {
            let (client, server) = tokio::io::duplex(64);
            direct_write_case(client, split(Pipe(server, vectored)).1, vectored).await;
        }
    }

    /// A pipe that holds 64 bytes: the first small batch fits, the second
    /// does not and is left for the writer task.
    async fn direct_write_case<W: AsyncWrite + Unpin + Send + 'static>(
        mut client: tokio::io::DuplexStream,
        writer: SharedWriter<W>,
        vectored: bool,
    ) {
        assert_eq!(writer.lock().io.is_write_vectored(), vectored);
        let mut small: VecDeque<Text> = VecDeque::from([Text::from("a"), Text::from("b")]);
        assert_eq!(writer.write_now(Frames::Queued(&mut small)), Some(true));
        assert!(small.is_empty());
        let mut big: VecDeque<Text> = (0..10).map(|i| Text::from(format!("{i:>20}"))).collect();
        assert_eq!(
            writer.write_now(Frames::Queued(&mut big)),
            Some(false),
            "64 bytes cannot take 10 frames of 22"
        );
        assert!(big.is_empty(), "taken and encoded, not lost");
        let mut more: VecDeque<Text> = VecDeque::from([Text::from("c")]);
        assert_eq!(
            writer.write_now(Frames::Queued(&mut more)),
            None,
            "pending bytes: the queue keeps it"
        );
        assert_eq!(more.len(), 1);
        let drain = {
            let writer = writer.clone();
            tokio::spawn(async move { writer.write_frames(&mut VecDeque::new()).await })
        };
        let mut bytes = vec![0u8; 2 * 3 + 10 * 22];
        tokio::io::AsyncReadExt::read_exact(&mut client, &mut bytes)
            .await
            .unwrap();
        drain.await.unwrap().unwrap();
        let got = read_all(bytes);
        let want: Vec<String> = ["a".to_string(), "b".to_string()]
            .into_iter()
            .chain((0..10).map(|i| format!("{i:>20}")))
            .collect();
        assert_eq!(
            got,
            want.into_iter()
                .map(|t| Message::Text(t.into()))
                .collect::<Vec<_>>()
        );
        let mut close = Vec::new();
        close_frame_into(&mut close, Close::Idle.code(), Close::Idle.reason());
        let closing = {
            let writer = writer.clone();
            tokio::spawn(async move { writer.close(Close::Idle).await })
        };
        let mut got = vec![0u8; close.len()];
        tokio::io::AsyncReadExt::read_exact(&mut client, &mut got)
            .await
            .unwrap();
        assert_eq!(got, close);
        closing.await.unwrap().unwrap();
        let mut after: VecDeque<Text> = VecDeque::from([Text::from("late")]);
        assert_eq!(
            writer.write_now(Frames::Queued(&mut after)),
            None,
            "nothing after the close frame"
        );
        assert_eq!(after.len(), 1);
    }

    #[tokio::test]
    async fn a_batch_is_written_in_order_with_the_readers_control_bytes_first() {
        for (pipe, vectored) in [
            (1 << 20, false),
            (1000, false),
            (1 << 20, true),
            (1000, true),
        ] {
            let (client, server) = tokio::io::duplex(pipe);
            let (read_side, writer) = split(Pipe(server, vectored));
            batch_case(client, read_side, writer).await;
        }
    }

    /// Frames of every length class (empty, longer than a slice, longer
    /// than the pipe) arrive whole and in order after the reader's pong,
    /// whether the pipe takes the batch at once or in parts.
    async fn batch_case<S: AsyncRead + AsyncWrite + Send + 'static>(
        mut client: tokio::io::DuplexStream,
        mut read_side: ReadSide<ReadHalf<S>>,
        writer: SharedWriter<WriteHalf<S>>,
    ) {
        // The reader's tungstenite answers a ping: its pong goes out first.
        let mut pong = Vec::new();
        header_into(&mut pong, 0xA, 2);
        pong.extend_from_slice(b"hi");
        read_side.write_all(&pong).await.unwrap();
        let texts: Vec<String> = (0..300)
            .map(|i| match i {
                7 => String::new(),
                8 => "é".repeat(2 * SLICE_BYTES + 1),
                9 => "x".repeat(70_000),
                _ => format!("frame {i}"),
            })
            .collect();
        let reading = tokio::spawn(async move {
            let mut bytes = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(&mut client, &mut bytes)
                .await
                .unwrap();
            bytes
        });
        let mut batch: VecDeque<Text> = texts.iter().map(|t| Text::from(t.as_str())).collect();
        writer.write_frames(&mut batch).await.unwrap();
        assert!(batch.is_empty());
        writer.close(Close::SlowConsumer).await.unwrap();
        writer.finish().await.unwrap();
        drop((read_side, writer));
        let got = read_all(reading.await.unwrap());
        assert_eq!(got[0], Message::Pong(b"hi".to_vec().into()));
        assert_eq!(got.len(), 302);
        for (m, t) in got[1..301].iter().zip(&texts) {
            assert_eq!(m, &Message::Text(t.as_str().into()));
        }
        assert!(matches!(&got[301], Message::Close(Some(c)) if u16::from(c.code) == 4008));
    }
}

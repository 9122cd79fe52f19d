//! The relay's own RFC 6455 codec for host connections: [`HostSocket`].
//!
//! Every link and the watch link read a host through this type, dialed
//! (client role) or dialed in (server role), over the raw byte stream left
//! after the HTTP upgrade. It exists because the relay's hottest loop is a
//! host streaming small text frames to a client: reading them through
//! tokio-tungstenite cost a wake-up registration of both wakers per poll,
//! a copy from a read buffer into tungstenite's, a second buffer's
//! bookkeeping and a per-message allocation. Here the steady-state read of
//! a batch of frames is a header parse per frame over the socket's one read
//! buffer, and one UTF-8 check per message, in place: no copy, no
//! allocation and no reference count per frame.
//!
//! What it guarantees:
//! - **One read buffer per socket** (`upstream_read_buffer_bytes`). The
//!   socket is read only when no complete frame is buffered, into the
//!   buffer's spare capacity (never zero-filled), at least a quarter of the
//!   buffer at a time. For a frame larger than the buffer it grows with
//!   what arrives (by at most what it already holds), so a host that
//!   announces a large frame costs the bytes it sends, not the bytes it
//!   announces, and the frame is copied a logarithmic number of times.
//!   Once the buffer is empty again it goes back to its size before the
//!   next read (and the write buffer after a large frame is written): an
//!   empty buffer holds at most twice `read_buffer_bytes`. An empty buffer
//!   is read into from its start, so a link whose every read is taken
//!   touches the same few cache lines and pages read after read.
//! - **Text read in place.** [`HostSocket::take_texts`] takes the text
//!   messages already buffered as ranges of the read buffer (no I/O, no
//!   waker registration: a link drains a read's worth of frames into one
//!   batch at the cost of parsing their headers; the frame a host streams,
//!   a whole unmasked text frame with a 2- or 4-byte header, is recognised
//!   in a few comparisons that read it as the general parse does),
//!   [`HostSocket::texts`]
//!   gives them as `str`, each checked to be UTF-8 there, once (`simdutf8`:
//!   ~40 % cheaper than `std` on these frames),
//!   and [`HostSocket::release`] drops their bytes. As a `Stream`, an
//!   unfragmented text frame becomes `Message::Text` over a slice of the
//!   read buffer. Fragments (text or binary, then continuations) are joined
//!   into one message; control frames between them are handled as they come.
//! - **Bounds before buffering.** A frame, or a fragmented message so far,
//!   longer than `max_message_bytes` is refused when its header is read,
//!   before its payload is buffered, and ends the connection with
//!   `Error::Capacity`.
//! - **RFC 6455 as a peer must enforce it.** Non-zero RSV bits, unknown
//!   opcodes, a fragmented or oversized (over 125 bytes) control frame, a
//!   continuation with nothing to continue, a new message inside a
//!   fragmented one, a frame masked the wrong way for the role (a server
//!   reads masked frames only, a client unmasked only), invalid UTF-8 in a
//!   text message or close reason, and a malformed close payload are
//!   errors that end the connection (`Error::Protocol` / `Error::Utf8`).
//!   After any error the stream ends (`None`).
//! - **Control frames need nothing from the caller.** A ping is answered
//!   with a pong carrying its payload (only the latest unanswered ping is
//!   answered, as §5.5.3 allows), written before the socket is next waited
//!   on or with the next flush; pongs are dropped. A close is answered
//!   with a close carrying the same code (once: not if the relay closed
//!   first), yielded as `Message::Close`, and the stream then ends. The end
//!   of the byte stream without a close is
//!   `ProtocolError::ResetWithoutClosingHandshake`, as tungstenite reports it.
//! - **Writes** (`Sink`) are whole frames encoded into a write buffer,
//!   written by `poll_flush`; as a client every frame is masked with a
//!   fresh random key. Nothing is sent after a close.

use std::io;
use std::ops::Range;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures_util::sink::Sink;
use futures_util::stream::Stream;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::tungstenite::error::{CapacityError, ProtocolError};
use tokio_tungstenite::tungstenite::protocol::frame::coding::{CloseCode, Data};
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};
use tokio_tungstenite::tungstenite::{Error as WsError, Message, Utf8Bytes};

/// The byte stream under a host WebSocket: TLS or plain TCP, or whatever
/// the edge upgraded for a connector; boxed so `upstream` does not name it.
pub trait HostIo: AsyncRead + AsyncWrite + Send + Unpin + std::fmt::Debug {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + std::fmt::Debug> HostIo for T {}

/// What a [`HostSocket`] accepts from its peer.
#[derive(Debug, Clone, Copy)]
pub struct FrameLimits {
    /// Largest frame, and largest message once its fragments are joined
    /// (`upstream_max_frame_bytes`).
    pub max_message_bytes: usize,
    /// Initial capacity of the read buffer, and the most one read asks
    /// the socket for while frames are smaller (`upstream_read_buffer_bytes`).
    pub read_buffer_bytes: usize,
}

/// The message cap when none is configured (the most
/// `upstream_max_frame_bytes` may be).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 64 << 20;

/// Most bytes of encoded frames the write buffer holds before
/// `poll_ready` writes them out first.
const WRITE_HIGH: usize = 64 * 1024;

/// The frame opcodes of RFC 6455 §5.2 (any other is a protocol error).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Opcode {
    Continue,
    Text,
    Binary,
    Close,
    Ping,
    Pong,
}

impl Opcode {
    fn parse(bits: u8) -> Result<Self, ProtocolError> {
        Ok(match bits {
            0 => Self::Continue,
            1 => Self::Text,
            2 => Self::Binary,
            8 => Self::Close,
            9 => Self::Ping,
            10 => Self::Pong,
            3..=7 => return Err(ProtocolError::UnknownDataFrameType(bits)),
            _ => return Err(ProtocolError::UnknownControlFrameType(bits)),
        })
    }

    fn bits(self) -> u8 {
        match self {
            Self::Continue => 0,
            Self::Text => 1,
            Self::Binary => 2,
            Self::Close => 8,
            Self::Ping => 9,
            Self::Pong => 10,
        }
    }

    fn is_control(self) -> bool {
        matches!(self, Self::Close | Self::Ping | Self::Pong)
    }
}

/// The first header byte of a final, unfragmented text frame (FIN, no RSV
/// bits, opcode 1).
const TEXT_FIN: u8 = 0x81;

/// A frame header, complete in the read buffer.
#[derive(Debug, PartialEq, Eq)]
struct Header {
    fin: bool,
    opcode: Opcode,
    mask: Option<[u8; 4]>,
    /// Bytes of the header itself (2 to 14).
    len: usize,
    /// Bytes of payload that follow it.
    payload: usize,
}

/// Parses the frame header at the start of `buf`: `None` while it is
/// incomplete. `joined` is the length of the fragmented message a
/// continuation would extend; a frame that would make a message longer
/// than `max` is refused here, before its payload is read.
fn parse_header(
    buf: &[u8],
    role: Role,
    max: usize,
    joined: usize,
) -> Result<Option<Header>, WsError> {
    let [b0, b1, ..] = *buf else {
        return Ok(None);
    };
    if b0 & 0x70 != 0 {
        return Err(ProtocolError::NonZeroReservedBits.into());
    }
    let fin = b0 & 0x80 != 0;
    let opcode = Opcode::parse(b0 & 0x0f)?;
    let masked = b1 & 0x80 != 0;
    match (role, masked) {
        (Role::Server, false) => return Err(ProtocolError::UnmaskedFrameFromClient.into()),
        (Role::Client, true) => return Err(ProtocolError::MaskedFrameFromServer.into()),
        _ => {}
    }
    let short = b1 & 0x7f;
    if opcode.is_control() {
        if !fin {
            return Err(ProtocolError::FragmentedControlFrame.into());
        }
        if short > 125 {
            return Err(ProtocolError::ControlFrameTooBig.into());
        }
    }
    let (payload, mut len) = match short {
        126 => match buf.get(2..4) {
            Some(&[a, b]) => (u64::from(u16::from_be_bytes([a, b])), 4),
            _ => return Ok(None),
        },
        127 => match buf.get(2..10).and_then(|b| <[u8; 8]>::try_from(b).ok()) {
            Some(b) => (u64::from_be_bytes(b), 10),
            None => return Ok(None),
        },
        n => (u64::from(n), 2),
    };
    let payload = usize::try_from(payload).unwrap_or(usize::MAX);
    let joined = if opcode == Opcode::Continue {
        joined
    } else {
        0
    };
    let size = payload.saturating_add(joined);
    if size > max {
        return Err(CapacityError::MessageTooLong {
            size,
            max_size: max,
        }
        .into());
    }
    let mask = if masked {
        let Some(&[a, b, c, d]) = buf.get(len..len + 4) else {
            return Ok(None);
        };
        len += 4;
        Some([a, b, c, d])
    } else {
        None
    };
    Ok(Some(Header {
        fin,
        opcode,
        mask,
        len,
        payload,
    }))
}

/// XORs `buf` with the repeated 4-byte `key` (RFC 6455 §5.3), 8 bytes at
/// a time; `buf` starts at payload offset 0.
fn apply_mask(buf: &mut [u8], key: [u8; 4]) {
    let [a, b, c, d] = key;
    let wide = u64::from_ne_bytes([a, b, c, d, a, b, c, d]);
    let mut words = buf.chunks_exact_mut(8);
    for word in &mut words {
        let mut w = [0u8; 8];
        w.copy_from_slice(word);
        word.copy_from_slice(&(u64::from_ne_bytes(w) ^ wide).to_ne_bytes());
    }
    // The tail starts at a multiple of 8, so at key offset 0.
    for (i, byte) in words.into_remainder().iter_mut().enumerate() {
        *byte ^= key[i & 3];
    }
}

/// A close frame's payload: nothing, or a code the peer may send and a
/// UTF-8 reason (§5.5.1, §7.4).
fn parse_close(payload: &[u8]) -> Result<Option<CloseFrame>, WsError> {
    match payload {
        [] => Ok(None),
        [_] => Err(ProtocolError::InvalidCloseSequence.into()),
        [hi, lo, reason @ ..] => {
            let code = CloseCode::from(u16::from_be_bytes([*hi, *lo]));
            if !code.is_allowed() {
                return Err(ProtocolError::InvalidCloseSequence.into());
            }
            let reason = Utf8Bytes::try_from(Bytes::copy_from_slice(reason))
                .map_err(|e| WsError::Utf8(e.to_string()))?;
            Ok(Some(CloseFrame { code, reason }))
        }
    }
}

/// Text messages taken in place from a [`HostSocket`]'s read buffer by
/// [`HostSocket::take_texts`], read as `str` through
/// [`HostSocket::texts`] and given back with [`HostSocket::release`].
#[derive(Debug, Default)]
pub struct Texts {
    pieces: Vec<Piece>,
    /// Bytes at the start of the read buffer the pieces were taken from.
    scanned: usize,
    /// Payload bytes of the pieces.
    bytes: usize,
}

impl Texts {
    /// Messages taken.
    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    /// Whether none was taken.
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }
}

/// Where a taken text message is.
#[derive(Debug)]
enum Piece {
    /// A range of the read buffer (an unfragmented message).
    Buffered(Range<usize>),
    /// Joined from fragments.
    Joined(BytesMut),
}

/// What one frame means to the reader.
#[derive(Debug)]
enum Step {
    /// A whole unfragmented message: its payload's range in the read buffer.
    Data(Data, Range<usize>),
    /// A fragmented message, now complete.
    Joined(Data, BytesMut),
    /// The peer's close.
    Close(Option<CloseFrame>),
    /// Nothing to yield (a ping, a pong, a fragment).
    Nothing,
}

/// `texts`' messages in `read` as `str` (see [`HostSocket::texts`]).
fn checked<'a>(read: &'a [u8], texts: &'a Texts, out: &mut Vec<&'a str>) -> Result<(), WsError> {
    for piece in &texts.pieces {
        let bytes = match piece {
            Piece::Buffered(range) => read.get(range.clone()).unwrap_or_default(),
            Piece::Joined(joined) => joined,
        };
        let text = simdutf8::compat::from_utf8(bytes).map_err(|e| WsError::Utf8(e.to_string()))?;
        out.push(text);
    }
    Ok(())
}

/// A WebSocket to a host over our own codec (see the module doc): a
/// `Stream` of messages read and a `Sink` of messages to write.
#[derive(Debug)]
pub struct HostSocket {
    io: Box<dyn HostIo>,
    role: Role,
    limits: FrameLimits,
    /// Bytes read and not yet taken as frames.
    read: BytesMut,
    /// Length of the frame at the start of `read` once its header is
    /// complete and its payload is not (0 otherwise).
    want: usize,
    /// A fragmented message being joined: its kind and payload so far.
    partial: Option<(Data, BytesMut)>,
    /// Encoded frames not yet written.
    write: BytesMut,
    /// `read` / `write` hold an allocation over twice `read_buffer_bytes`
    /// (a large frame's), given back once the buffer is empty.
    read_grown: bool,
    write_grown: bool,
    /// Written to `io` since its last completed flush.
    unflushed: bool,
    /// The payload of the latest ping not yet answered.
    pong: Option<Bytes>,
    /// A close frame was queued (by us or in reply): nothing more is sent.
    close_sent: bool,
    /// The stream has ended: a close was yielded, an error returned, or
    /// the byte stream ended.
    ended: bool,
}

impl HostSocket {
    /// A socket over `io` with nothing read yet.
    pub fn new(io: Box<dyn HostIo>, role: Role, limits: FrameLimits) -> Self {
        let read = BytesMut::with_capacity(limits.read_buffer_bytes);
        Self::with_read_ahead(io, role, limits, read)
    }

    /// A socket over `io` whose first bytes were already read into `read`
    /// (what followed the upgrade's answer).
    pub fn with_read_ahead(
        io: Box<dyn HostIo>,
        role: Role,
        limits: FrameLimits,
        read: BytesMut,
    ) -> Self {
        Self {
            io,
            role,
            limits,
            read,
            want: 0,
            partial: None,
            write: BytesMut::new(),
            read_grown: false,
            write_grown: false,
            unflushed: false,
            pong: None,
            close_sent: false,
            ended: false,
        }
    }

    /// Waits until a whole frame is buffered (a message's, a fragment's or
    /// a control frame's) for [`take_texts`](Self::take_texts): `Ok(true)`;
    /// `Ok(false)` once the stream has ended cleanly, `Err` when it failed.
    /// Answers to pings are written meanwhile, as for `poll_next`.
    pub fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Result<bool, WsError>> {
        loop {
            if self.ended {
                let _ = self.write_replies(cx);
                return Poll::Ready(Ok(false));
            }
            if let Err(e) = self.write_replies(cx) {
                return Poll::Ready(Err(self.fail(e)));
            }
            match self.scan_head(0) {
                Ok(Some(_)) => return Poll::Ready(Ok(true)),
                Ok(None) => {}
                Err(e) => return Poll::Ready(Err(self.fail(e))),
            }
            if let Some(end) = ready!(self.poll_fill(cx)) {
                return Poll::Ready(end.map(|()| false));
            }
        }
    }

    /// Takes the text messages already buffered, in place, into `texts`
    /// (after what it holds): up to `max_frames` messages and about
    /// `max_bytes`, with no I/O and no waker registration. Control frames
    /// on the way are handled; binary messages are dropped. The bytes stay
    /// in the read buffer until [`release`](Self::release). Returns
    /// whether the stream goes on (`Ok(false)`: the peer's close was read).
    pub fn take_texts(
        &mut self,
        texts: &mut Texts,
        (max_frames, max_bytes): (usize, usize),
    ) -> Result<bool, WsError> {
        while texts.pieces.len() < max_frames && texts.bytes < max_bytes && !self.ended {
            if let Some(payload) = self.plain_text_at(texts.scanned) {
                if texts.scanned == 0 {
                    self.want = 0;
                }
                texts.scanned = payload.end;
                texts.bytes += payload.len();
                texts.pieces.push(Piece::Buffered(payload));
                continue;
            }
            let step = match self.scan(texts.scanned) {
                Ok(Some((step, end))) => {
                    texts.scanned = end;
                    step
                }
                Ok(None) => break,
                Err(e) => return Err(self.fail(e)),
            };
            match step {
                Step::Data(Data::Text, range) => {
                    texts.bytes += range.len();
                    texts.pieces.push(Piece::Buffered(range));
                }
                Step::Joined(Data::Text, joined) => {
                    texts.bytes += joined.len();
                    texts.pieces.push(Piece::Joined(joined));
                }
                Step::Close(_) => return Ok(false),
                _ => {}
            }
        }
        Ok(true)
    }

    /// The messages of `texts` as `str`, each checked to be UTF-8 here,
    /// once, appended to `out`. At the first that is not, the ones before
    /// it are in `out` and the stream ends with `Error::Utf8`.
    pub fn texts<'a>(
        &'a mut self,
        texts: &'a Texts,
        out: &mut Vec<&'a str>,
    ) -> Result<(), WsError> {
        if let Err(e) = checked(&self.read, texts, out) {
            self.ended = true;
            self.partial = None;
            return Err(e);
        }
        Ok(())
    }

    /// Drops the bytes `texts` was taken from, and empties it.
    pub fn release(&mut self, texts: &mut Texts) {
        self.read.advance(texts.scanned.min(self.read.len()));
        texts.pieces.clear();
        texts.scanned = 0;
        texts.bytes = 0;
    }

    /// Sends a close frame (unless one was sent) and flushes; the stream
    /// still yields what the host sends until its close arrives.
    pub async fn close(&mut self, frame: Option<CloseFrame>) -> Result<(), WsError> {
        if !self.close_sent {
            self.queue_close(frame.as_ref())?;
        }
        std::future::poll_fn(|cx| self.poll_write_out(cx)).await
    }

    /// Ends the stream with `e`.
    fn fail(&mut self, e: WsError) -> WsError {
        self.ended = true;
        self.partial = None;
        e
    }

    /// Takes complete frames from the read buffer until one completes a
    /// message; control frames are handled on the way.
    fn decode(&mut self) -> Result<Option<Message>, WsError> {
        loop {
            let Some((step, end)) = self.scan(0)? else {
                return Ok(None);
            };
            let msg = match step {
                Step::Data(kind, payload) => {
                    let mut frame = self.read.split_to(end);
                    frame.advance(payload.start);
                    message(kind, frame)?
                }
                Step::Joined(kind, joined) => {
                    self.read.advance(end);
                    message(kind, joined)?
                }
                Step::Close(frame) => {
                    self.read.advance(end);
                    Message::Close(frame)
                }
                Step::Nothing => {
                    self.read.advance(end);
                    continue;
                }
            };
            return Ok(Some(msg));
        }
    }

    /// The payload of the frame at `at` of the read buffer when it is what a
    /// host streams, read as [`scan`](Self::scan) would read it in a few
    /// comparisons: a socket in the client role with no fragmented message
    /// open, and there a whole, final, unmasked text frame with a 2- or
    /// 4-byte header, within `max_message_bytes`. `None` for anything else,
    /// a frame not yet all buffered included: `scan` then reads it, with
    /// the same result for these bytes (a `Step::Data` of this range).
    #[inline(always)]
    fn plain_text_at(&self, at: usize) -> Option<Range<usize>> {
        if self.partial.is_some() || self.role != Role::Client {
            return None;
        }
        let buffered = self.read.get(at..)?;
        let (head, payload) = match *buffered {
            [TEXT_FIN, short @ 0..=125, ..] => (2, usize::from(short)),
            [TEXT_FIN, 126, high, low, ..] => (4, usize::from(u16::from_be_bytes([high, low]))),
            _ => return None,
        };
        let whole = payload <= self.limits.max_message_bytes && buffered.len() >= head + payload;
        whole.then_some(at + head..at + head + payload)
    }

    /// The header of the frame at `at` of the read buffer, once the whole
    /// frame is buffered; `None` before (then, for the frame at the start
    /// of the buffer, `want` says how long it is, if its header is in).
    fn scan_head(&mut self, at: usize) -> Result<Option<Header>, WsError> {
        let joined = self.partial.as_ref().map_or(0, |(_, p)| p.len());
        let max = self.limits.max_message_bytes;
        let buffered = self.read.get(at..).unwrap_or_default();
        let Some(header) = parse_header(buffered, self.role, max, joined)? else {
            if at == 0 {
                self.want = 0;
            }
            return Ok(None);
        };
        let total = header.len.saturating_add(header.payload);
        let complete = buffered.len() >= total;
        if at == 0 {
            self.want = if complete { 0 } else { total };
        }
        Ok(complete.then_some(header))
    }

    /// Reads the frame at `at` of the read buffer, if it is all there: what
    /// it means, and where it ends. Its payload is unmasked in place.
    fn scan(&mut self, at: usize) -> Result<Option<(Step, usize)>, WsError> {
        let Some(header) = self.scan_head(at)? else {
            return Ok(None);
        };
        let start = at + header.len;
        let end = start + header.payload;
        if let Some(key) = header.mask
            && let Some(payload) = self.read.get_mut(start..end)
        {
            apply_mask(payload, key);
        }
        let step = self.on_frame(header.fin, header.opcode, start..end)?;
        Ok(Some((step, end)))
    }

    /// One frame, whose payload is `payload` of the read buffer.
    fn on_frame(
        &mut self,
        fin: bool,
        opcode: Opcode,
        payload: Range<usize>,
    ) -> Result<Step, WsError> {
        let bytes = self.read.get(payload.clone()).unwrap_or_default();
        let kind = match opcode {
            Opcode::Text => Data::Text,
            Opcode::Binary => Data::Binary,
            Opcode::Continue => {
                let Some((kind, mut joined)) = self.partial.take() else {
                    return Err(ProtocolError::UnexpectedContinueFrame.into());
                };
                joined.extend_from_slice(bytes);
                if !fin {
                    self.partial = Some((kind, joined));
                    return Ok(Step::Nothing);
                }
                return Ok(Step::Joined(kind, joined));
            }
            Opcode::Ping => {
                self.pong = Some(Bytes::copy_from_slice(bytes));
                return Ok(Step::Nothing);
            }
            Opcode::Pong => return Ok(Step::Nothing),
            Opcode::Close => {
                let frame = parse_close(bytes)?;
                if !self.close_sent {
                    let reply = frame.as_ref().map(|f| CloseFrame {
                        code: f.code,
                        reason: Utf8Bytes::default(),
                    });
                    self.queue_close(reply.as_ref())?;
                }
                self.ended = true;
                return Ok(Step::Close(frame));
            }
        };
        if let Some((kind, _)) = &self.partial {
            return Err(ProtocolError::ExpectedFragment(*kind).into());
        }
        if fin {
            return Ok(Step::Data(kind, payload));
        }
        self.partial = Some((kind, BytesMut::from(bytes)));
        Ok(Step::Nothing)
    }

    /// Reads more of the byte stream into the read buffer: `None` when
    /// bytes arrived; else the stream has ended, `Ok` cleanly (after our
    /// close, with nothing left unread), `Err` otherwise.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<(), WsError>>> {
        self.make_room();
        let read = ready!(tokio_util::io::poll_read_buf(
            Pin::new(&mut self.io),
            cx,
            &mut self.read
        ));
        Poll::Ready(match read {
            Ok(0) => {
                let clean = self.close_sent && self.read.is_empty() && self.partial.is_none();
                self.ended = true;
                if clean {
                    Some(Ok(()))
                } else {
                    Some(Err(
                        self.fail(ProtocolError::ResetWithoutClosingHandshake.into())
                    ))
                }
            }
            Ok(_) => None,
            Err(e) => Some(Err(self.fail(e.into()))),
        })
    }

    /// Makes room in the read buffer for the next read: at least a
    /// quarter of the buffer, and for the rest of a frame whose header is
    /// buffered at most as much again as the buffer holds (geometric growth).
    /// An empty buffer holds at most twice `read_buffer_bytes`: what a large
    /// frame made it take is given back before the next read, so a link
    /// does not keep its largest snapshot's size for its whole life. An
    /// empty buffer is read into from its start again (no allocation, no
    /// copy): a link whose reads are all taken (a paced stream) reuses the
    /// same cache lines and pages for every read instead of walking
    /// through the whole buffer (BENCHMARKS.md, "Ninth round").
    fn make_room(&mut self) {
        let chunk = self.limits.read_buffer_bytes.max(1);
        if self.read_grown && self.read.is_empty() {
            self.read = BytesMut::with_capacity(chunk);
            self.read_grown = false;
        } else if self.read.is_empty() && self.read.capacity() < chunk {
            self.read.reserve(chunk);
        }
        let spare = self.read.capacity() - self.read.len();
        let missing = self.want.saturating_sub(self.read.len());
        let ahead = missing.min(self.read.len().max(chunk));
        if spare < ahead.max(chunk / 4).max(1) {
            self.read.reserve(ahead.max(chunk));
            self.read_grown = self.oversized(&self.read);
        }
    }

    /// Whether `buf` holds more than twice `read_buffer_bytes`: more than a
    /// stream of small frames makes it take (a partial frame at the end of
    /// a full buffer doubles it once).
    fn oversized(&self, buf: &BytesMut) -> bool {
        buf.capacity() > 2 * self.limits.read_buffer_bytes.max(1)
    }

    /// Writes out queued frames (the latest pong first encoded), then
    /// flushes the byte stream.
    fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), WsError>> {
        if let Some(payload) = self.pong.take()
            && !self.close_sent
        {
            self.encode(Opcode::Pong, &payload);
        }
        while !self.write.is_empty() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.write))?;
            if n == 0 {
                return Poll::Ready(Err(io::Error::from(io::ErrorKind::WriteZero).into()));
            }
            self.write.advance(n);
            self.unflushed = true;
        }
        if self.write_grown {
            // A large frame is written: its allocation goes with it.
            self.write = BytesMut::new();
            self.write_grown = false;
        }
        if self.unflushed {
            ready!(Pin::new(&mut self.io).poll_flush(cx))?;
            self.unflushed = false;
        }
        Poll::Ready(Ok(()))
    }

    /// Writes queued replies (a pong, a close) without waiting for the
    /// socket: what does not fit now goes with the next read or flush.
    fn write_replies(&mut self, cx: &mut Context<'_>) -> Result<(), WsError> {
        if self.pong.is_none() && self.write.is_empty() && !self.unflushed {
            return Ok(());
        }
        match self.poll_write_out(cx) {
            Poll::Ready(Err(e)) => Err(e),
            _ => Ok(()),
        }
    }

    /// Encodes one whole frame into the write buffer (masked as a client).
    fn encode(&mut self, opcode: Opcode, payload: &[u8]) {
        let mask_bit = if self.role == Role::Client { 0x80 } else { 0 };
        let len = payload.len();
        self.write.reserve(14 + len);
        self.write_grown |= self.oversized(&self.write);
        self.write.put_u8(0x80 | opcode.bits());
        if len < 126 {
            self.write.put_u8(mask_bit | len as u8);
        } else if let Ok(len) = u16::try_from(len) {
            self.write.put_u8(mask_bit | 126);
            self.write.put_u16(len);
        } else {
            self.write.put_u8(mask_bit | 127);
            self.write.put_u64(len as u64);
        }
        if self.role == Role::Client {
            let key: [u8; 4] = rand::random();
            self.write.put_slice(&key);
            let start = self.write.len();
            self.write.put_slice(payload);
            apply_mask(&mut self.write[start..], key);
        } else {
            self.write.put_slice(payload);
        }
    }

    /// Queues a close frame; nothing is sent after it.
    fn queue_close(&mut self, frame: Option<&CloseFrame>) -> Result<(), WsError> {
        let mut payload = Vec::new();
        if let Some(f) = frame {
            payload.extend_from_slice(&u16::from(f.code).to_be_bytes());
            payload.extend_from_slice(f.reason.as_bytes());
        }
        if payload.len() > 125 {
            return Err(ProtocolError::ControlFrameTooBig.into());
        }
        self.encode(Opcode::Close, &payload);
        self.close_sent = true;
        self.pong = None;
        Ok(())
    }
}

/// A complete message of `kind`; text is checked to be UTF-8 here, once.
fn message(kind: Data, payload: BytesMut) -> Result<Message, WsError> {
    let payload = payload.freeze();
    match kind {
        Data::Text => Utf8Bytes::try_from(payload)
            .map(Message::Text)
            .map_err(|e| WsError::Utf8(e.to_string())),
        _ => Ok(Message::Binary(payload)),
    }
}

impl Stream for HostSocket {
    type Item = Result<Message, WsError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if this.ended {
                // A close reply still queued goes out if the socket takes it.
                let _ = this.write_replies(cx);
                return Poll::Ready(None);
            }
            match this.decode() {
                Ok(Some(msg)) => {
                    if let Err(e) = this.write_replies(cx) {
                        return Poll::Ready(Some(Err(this.fail(e))));
                    }
                    return Poll::Ready(Some(Ok(msg)));
                }
                Ok(None) => {}
                Err(e) => return Poll::Ready(Some(Err(this.fail(e)))),
            }
            if let Err(e) = this.write_replies(cx) {
                return Poll::Ready(Some(Err(this.fail(e))));
            }
            if let Some(end) = ready!(this.poll_fill(cx)) {
                return Poll::Ready(end.err().map(Err));
            }
        }
    }
}

impl Sink<Message> for HostSocket {
    type Error = WsError;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), WsError>> {
        let this = self.get_mut();
        if this.write.len() >= WRITE_HIGH {
            return this.poll_write_out(cx);
        }
        Poll::Ready(Ok(()))
    }

    fn start_send(self: Pin<&mut Self>, item: Message) -> Result<(), WsError> {
        let this = self.get_mut();
        if this.close_sent {
            return Err(ProtocolError::SendAfterClosing.into());
        }
        match item {
            Message::Text(t) => this.encode(Opcode::Text, t.as_bytes()),
            Message::Binary(b) => this.encode(Opcode::Binary, &b),
            Message::Ping(p) | Message::Pong(p) if p.len() > 125 => {
                return Err(ProtocolError::ControlFrameTooBig.into());
            }
            Message::Ping(p) => this.encode(Opcode::Ping, &p),
            Message::Pong(p) => this.encode(Opcode::Pong, &p),
            Message::Close(frame) => this.queue_close(frame.as_ref())?,
            Message::Frame(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "raw frames are not sent on host links",
                )
                .into());
            }
        }
        Ok(())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), WsError>> {
        self.get_mut().poll_write_out(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), WsError>> {
        let this = self.get_mut();
        if !this.close_sent {
            this.queue_close(None)?;
        }
        this.poll_write_out(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    use futures_util::{SinkExt, StreamExt};
    use tokio::io::ReadBuf;
    use tokio_tungstenite::WebSocketStream;

    use super::*;

    /// A byte stream that serves `reads` one chunk per read, then ends
    /// (or stays pending with `hold`); writes are kept in `written`.
    #[derive(Debug, Default)]
    struct Script {
        reads: Arc<Mutex<VecDeque<Vec<u8>>>>,
        written: Arc<Mutex<Vec<u8>>>,
        hold: bool,
    }

    impl AsyncRead for Script {
        fn poll_read(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let mut reads = self.reads.lock().unwrap();
            match reads.pop_front() {
                Some(mut chunk) => {
                    let n = chunk.len().min(buf.remaining());
                    buf.put_slice(&chunk[..n]);
                    if n < chunk.len() {
                        reads.push_front(chunk.split_off(n));
                    }
                    Poll::Ready(Ok(()))
                }
                None if self.hold => Poll::Pending,
                None => Poll::Ready(Ok(())),
            }
        }
    }

    impl AsyncWrite for Script {
        fn poll_write(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.written.lock().unwrap().extend_from_slice(buf);
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    const LIMITS: FrameLimits = FrameLimits {
        max_message_bytes: 1 << 20,
        read_buffer_bytes: 4096,
    };

    /// A socket in `role` reading `chunks`; its writes land in the returned vector.
    fn socket(
        role: Role,
        limits: FrameLimits,
        chunks: Vec<Vec<u8>>,
    ) -> (HostSocket, Arc<Mutex<Vec<u8>>>) {
        let script = Script {
            reads: Arc::new(Mutex::new(
                chunks.into_iter().filter(|c| !c.is_empty()).collect(),
            )),
            ..Script::default()
        };
        let written = script.written.clone();
        (HostSocket::new(Box::new(script), role, limits), written)
    }

    /// One frame as a peer sends it: masked (towards a server) with `key`.
    fn frame(b0: u8, payload: &[u8], key: Option<[u8; 4]>) -> Vec<u8> {
        let mut out = vec![b0];
        let bit = if key.is_some() { 0x80 } else { 0 };
        match payload.len() {
            n if n < 126 => out.push(bit | n as u8),
            n if n <= 0xffff => {
                out.push(bit | 126);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                out.push(bit | 127);
                out.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        let mut body = payload.to_vec();
        if let Some(k) = key {
            out.extend_from_slice(&k);
            for (i, b) in body.iter_mut().enumerate() {
                *b ^= k[i % 4];
            }
        }
        out.extend_from_slice(&body);
        out
    }

    /// The key a peer of `role` masks with (none towards a client).
    fn key_for(role: Role) -> Option<[u8; 4]> {
        (role == Role::Server).then_some([0x37, 0xfa, 0x21, 0x3d])
    }

    const FIN: u8 = 0x80;

    /// Everything the socket yields until it ends, errors as text.
    async fn drain(ws: &mut HostSocket) -> Vec<Result<Message, String>> {
        let mut out = Vec::new();
        while let Some(item) = ws.next().await {
            out.push(item.map_err(|e| e.to_string()));
        }
        out
    }

    /// Frames written by a socket of `role`, unmasked: (first byte, payload).
    fn written_frames(role: Role, bytes: &[u8]) -> Vec<(u8, Vec<u8>)> {
        let peer = if role == Role::Client {
            Role::Server
        } else {
            Role::Client
        };
        let mut buf = bytes.to_vec();
        let mut out = Vec::new();
        while !buf.is_empty() {
            let h = parse_header(&buf, peer, usize::MAX, 0).unwrap().unwrap();
            let mut payload = buf[h.len..h.len + h.payload].to_vec();
            if let Some(k) = h.mask {
                apply_mask(&mut payload, k);
            }
            out.push((buf[0], payload));
            buf.drain(..h.len + h.payload);
        }
        out
    }

    fn text(s: &str) -> Result<Message, String> {
        Ok(Message::text(s.to_string()))
    }

    /// A conversation of small and 16-bit frames: text, a fragmented text
    /// with a ping between its fragments (and a multi-byte character split
    /// across them), a pong, a binary, then a close.
    fn conversation(role: Role) -> (Vec<u8>, Vec<Result<Message, String>>) {
        let k = key_for(role);
        let long = "é".repeat(150);
        let mut bytes = Vec::new();
        bytes.extend(frame(FIN | 1, b"hello", k));
        bytes.extend(frame(1, "ab\u{e9}".as_bytes().split_at(3).0, k));
        bytes.extend(frame(FIN | 9, b"are you there", k));
        bytes.extend(frame(0, &"ab\u{e9}".as_bytes()[3..], k));
        bytes.extend(frame(FIN, b"cd", k));
        bytes.extend(frame(FIN | 10, b"unasked", k));
        bytes.extend(frame(FIN | 1, long.as_bytes(), k));
        bytes.extend(frame(FIN | 2, &[0, 159, 146, 150], k));
        bytes.extend(frame(FIN | 8, &[0x03, 0xe8, b'b', b'y', b'e'], k));
        let expected = vec![
            text("hello"),
            text("ab\u{e9}cd"),
            text(&long),
            Ok(Message::Binary(Bytes::from_static(&[0, 159, 146, 150]))),
            Ok(Message::Close(Some(CloseFrame {
                code: CloseCode::Normal,
                reason: "bye".into(),
            }))),
        ];
        (bytes, expected)
    }

    #[tokio::test]
    async fn frames_split_at_every_byte_boundary_read_the_same() {
        for role in [Role::Client, Role::Server] {
            let (bytes, expected) = conversation(role);
            for at in 0..=bytes.len() {
                let (head, tail) = bytes.split_at(at);
                let (mut ws, written) = socket(role, LIMITS, vec![head.to_vec(), tail.to_vec()]);
                assert_eq!(drain(&mut ws).await, expected, "{role:?} split at {at}");
                let replies = written_frames(role, &written.lock().unwrap());
                assert_eq!(
                    replies,
                    vec![
                        (FIN | 10, b"are you there".to_vec()),
                        (FIN | 8, vec![0x03, 0xe8])
                    ],
                    "{role:?} split at {at}: one pong, one close reply"
                );
            }
            let bytewise = bytes.iter().map(|b| vec![*b]).collect();
            let (mut ws, _) = socket(role, LIMITS, bytewise);
            assert_eq!(drain(&mut ws).await, expected, "{role:?} byte by byte");
        }
    }

    #[tokio::test]
    async fn lengths_of_every_width_and_frames_larger_than_the_buffer_arrive_whole() {
        for role in [Role::Client, Role::Server] {
            let k = key_for(role);
            let sizes = [0, 1, 125, 126, 127, 4095, 65535, 65536, 200_000];
            let mut bytes = Vec::new();
            let mut expected = Vec::new();
            for (i, n) in sizes.iter().enumerate() {
                let s: String = (0..*n)
                    .map(|j| char::from(b'a' + ((i + j) % 26) as u8))
                    .collect();
                bytes.extend(frame(FIN | 1, s.as_bytes(), k));
                expected.push(text(&s));
            }
            expected.push(Err(
                "WebSocket protocol error: Connection reset without closing handshake".into(),
            ));
            let headers: Vec<usize> = {
                let mut at = 0;
                sizes
                    .iter()
                    .map(|n| {
                        let start = at;
                        at += frame(FIN | 1, &vec![0; *n], k).len();
                        start
                    })
                    .collect()
            };
            // Splits inside and right around every header, and in payloads.
            let mut splits: Vec<usize> = headers
                .iter()
                .flat_map(|h| (h.saturating_sub(1)..h + 16).filter(|a| *a <= bytes.len()))
                .collect();
            splits.extend([bytes.len() / 3, bytes.len() - 7, bytes.len()]);
            for at in splits {
                let (head, tail) = bytes.split_at(at);
                let (mut ws, _) = socket(role, LIMITS, vec![head.to_vec(), tail.to_vec()]);
                assert_eq!(drain(&mut ws).await, expected, "{role:?} split at {at}");
            }
            let small: Vec<Vec<u8>> = bytes.chunks(1000).map(<[u8]>::to_vec).collect();
            let (mut ws, _) = socket(role, LIMITS, small);
            assert_eq!(
                drain(&mut ws).await,
                expected,
                "{role:?} in 1000-byte reads"
            );
        }
    }

    #[tokio::test]
    async fn frames_masked_the_wrong_way_for_the_role_are_refused() {
        let (mut ws, _) = socket(
            Role::Client,
            LIMITS,
            vec![frame(FIN | 1, b"x", Some([1, 2, 3, 4]))],
        );
        assert_eq!(
            drain(&mut ws).await,
            vec![Err(
                "WebSocket protocol error: Received a masked frame from server".into()
            )]
        );
        let (mut ws, _) = socket(Role::Server, LIMITS, vec![frame(FIN | 1, b"x", None)]);
        assert_eq!(
            drain(&mut ws).await,
            vec![Err(
                "WebSocket protocol error: Received an unmasked frame from client".into()
            )]
        );
    }

    #[tokio::test]
    async fn an_oversized_frame_or_message_is_refused_at_its_header() {
        let limits = FrameLimits {
            max_message_bytes: 1000,
            read_buffer_bytes: 4096,
        };
        for role in [Role::Client, Role::Server] {
            let k = key_for(role);
            // Only the first bytes of the header arrive, and the stream
            // then stays open: the refusal cannot have waited for the payload.
            let (mut ws, _) = socket(role, limits, Vec::new());
            ws.io = Box::new(Script {
                reads: Arc::new(Mutex::new(VecDeque::from(vec![
                    frame(FIN | 1, &[b'x'; 1001], k)[..4].to_vec(),
                ]))),
                hold: true,
                ..Script::default()
            });
            let got = ws.next().await.map(|r| r.map_err(|e| e.to_string()));
            assert_eq!(
                got,
                Some(Err(
                    "Space limit exceeded: Message too long: 1001 > 1000".into()
                )),
                "{role:?}"
            );
            assert!(ws.next().await.is_none(), "the error ends the stream");
            // A message whose fragments together pass the cap.
            let mut bytes = frame(1, &[b'x'; 600], k);
            bytes.extend(frame(FIN, &[b'x'; 600], k));
            let (mut ws, _) = socket(role, limits, vec![bytes]);
            assert_eq!(
                drain(&mut ws).await,
                vec![Err(
                    "Space limit exceeded: Message too long: 1200 > 1000".into()
                )],
                "{role:?}"
            );
            let mut bytes = frame(1, &[b'x'; 500], k);
            bytes.extend(frame(FIN, &[b'x'; 500], k));
            let (mut ws, _) = socket(role, limits, vec![bytes]);
            assert_eq!(
                drain(&mut ws).await[0],
                text(&"x".repeat(1000)),
                "at the cap"
            );
        }
    }

    /// A host that announces a large frame and sends little of it costs
    /// the relay about what it sent, not what it announced.
    #[tokio::test]
    async fn the_buffer_grows_with_what_arrives_not_with_what_is_announced() {
        let k = key_for(Role::Client);
        let announced = frame(FIN | 1, &vec![b'x'; 1 << 20], k);
        let sent = announced[..20_000].to_vec();
        let (mut ws, _) = socket(Role::Client, LIMITS, Vec::new());
        ws.io = Box::new(Script {
            reads: Arc::new(Mutex::new(sent.chunks(4096).map(<[u8]>::to_vec).collect())),
            hold: true,
            ..Script::default()
        });
        let waited = tokio::time::timeout(std::time::Duration::from_millis(50), ws.next()).await;
        assert!(waited.is_err(), "the frame is incomplete");
        assert_eq!(ws.read.len(), 20_000);
        assert!(ws.read.capacity() <= 64 * 1024, "{}", ws.read.capacity());
    }

    /// A large frame's memory is given back once the frame is gone: the
    /// read buffer after it, and the write buffer after a large frame is
    /// written, are back within twice `read_buffer_bytes`.
    #[tokio::test]
    async fn buffers_give_back_a_large_frame_s_memory() {
        let big = "x".repeat(200_000);
        let bytes = frame(FIN | 1, big.as_bytes(), None);
        let small = frame(FIN | 1, b"after", None);
        let mut chunks: Vec<Vec<u8>> = bytes.chunks(4096).map(<[u8]>::to_vec).collect();
        chunks.push(small);
        let (mut ws, written) = socket(Role::Client, LIMITS, chunks);
        let first = ws.next().await.map(|m| m.map_err(|e| e.to_string()));
        assert_eq!(first.map(|m| m.map(|m| m.len())), Some(Ok(200_000)));
        assert_eq!(
            ws.next().await.map(|m| m.map_err(|e| e.to_string())),
            Some(text("after"))
        );
        let limit = 2 * LIMITS.read_buffer_bytes;
        assert!(ws.read.capacity() <= limit, "read {}", ws.read.capacity());

        ws.send(Message::text(big)).await.unwrap();
        ws.send(Message::text("small")).await.unwrap();
        assert!(
            ws.write.capacity() <= limit,
            "write {}",
            ws.write.capacity()
        );
        let frames = written_frames(Role::Client, &written.lock().unwrap());
        let lens: Vec<usize> = frames.iter().map(|(_, p)| p.len()).collect();
        assert_eq!(lens, [200_000, 5], "both frames written whole");
    }

    #[tokio::test]
    async fn protocol_violations_end_the_stream_with_an_error() {
        let k = key_for(Role::Server);
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (frame(FIN | 0x40 | 1, b"x", k), "Reserved bits are non-zero"),
            (frame(FIN | 0x10 | 1, b"x", k), "Reserved bits are non-zero"),
            (frame(FIN | 3, b"x", k), "Unknown data frame type: 3"),
            (frame(FIN | 11, b"x", k), "Unknown control frame type: 11"),
            (frame(9, b"x", k), "Fragmented control frame"),
            (frame(FIN | 9, &[0; 126], k), "Control frame too big"),
            (
                frame(FIN, b"x", k),
                "Continue frame but nothing to continue",
            ),
            (
                [frame(1, b"x", k), frame(FIN | 1, b"y", k)].concat(),
                "While waiting for more fragments received: TEXT",
            ),
            (frame(FIN | 8, &[3], k), "Invalid close sequence"),
            (frame(FIN | 8, &[0x03, 0xed], k), "Invalid close sequence"),
            (
                frame(FIN | 1, &[b'a', 0xff, b'b'], k),
                "UTF-8 encoding error",
            ),
            (
                [frame(1, &[0xc3], k), frame(FIN, b"(", k)].concat(),
                "UTF-8 encoding error",
            ),
            (
                frame(FIN | 8, &[0x03, 0xe8, 0xff], k),
                "UTF-8 encoding error",
            ),
        ];
        for (bytes, error) in cases {
            let (mut ws, _) = socket(
                Role::Server,
                LIMITS,
                vec![bytes, frame(FIN | 1, b"after", k)],
            );
            let got = drain(&mut ws).await;
            assert_eq!(got.len(), 1, "{error}: {got:?}");
            let Err(e) = &got[0] else {
                panic!("{error}: {got:?}")
            };
            assert!(e.contains(error), "{error}: {e}");
        }
    }

    /// What `take_texts` takes now (after waiting for a frame when `wait`),
    /// read through `texts` and released; `Err` if `texts` refused one.
    async fn take(
        ws: &mut HostSocket,
        wait: bool,
        bounds: (usize, usize),
    ) -> (bool, Vec<String>, Option<String>) {
        if wait {
            assert!(std::future::poll_fn(|cx| ws.poll_frame(cx)).await.unwrap());
        }
        let mut texts = Texts::default();
        let more = ws.take_texts(&mut texts, bounds).unwrap();
        let mut out = Vec::new();
        let refused = ws.texts(&texts, &mut out).err().map(|e| e.to_string());
        let taken = out.iter().map(|t| t.to_string()).collect();
        ws.release(&mut texts);
        (more, taken, refused)
    }

    /// The texts a client socket's `Stream` reads from `chunks` (which
    /// never takes the short cut), then the error that ended it, if any.
    async fn read_texts(limits: FrameLimits, chunks: Vec<Vec<u8>>) -> Vec<Result<String, String>> {
        let (mut ws, _) = socket(Role::Client, limits, chunks);
        drain(&mut ws)
            .await
            .into_iter()
            .filter_map(|m| match m {
                Ok(Message::Text(t)) => Some(Ok(t.to_string())),
                Ok(_) => None,
                Err(e) => Some(Err(e)),
            })
            .collect()
    }

    /// Everything `take_texts` takes from `chunks` until the stream ends:
    /// the texts, then the error that ended it, if any.
    async fn take_all(limits: FrameLimits, chunks: Vec<Vec<u8>>) -> Vec<Result<String, String>> {
        let (mut ws, _) = socket(Role::Client, limits, chunks);
        let mut out = Vec::new();
        loop {
            match std::future::poll_fn(|cx| ws.poll_frame(cx)).await {
                Ok(true) => {}
                Ok(false) => return out,
                Err(e) => {
                    out.push(Err(e.to_string()));
                    return out;
                }
            }
            let mut texts = Texts::default();
            let taken = ws.take_texts(&mut texts, (usize::MAX, usize::MAX));
            let mut strs = Vec::new();
            let refused = ws.texts(&texts, &mut strs).err();
            out.extend(strs.iter().map(|t| Ok(t.to_string())));
            ws.release(&mut texts);
            if let Some(e) = taken.err().or(refused) {
                out.push(Err(e.to_string()));
                return out;
            }
        }
    }

    /// The few comparisons that take a host's plain text frames read them
    /// as the general header parse does: every length form at its
    /// boundaries (a 16-bit length written for a short payload too), frames
    /// split across reads at every seventh byte, fragments, control frames
    /// and binary messages between them, and a frame over the cap, which
    /// still ends the stream with the cap's error. The `Stream` reading of
    /// the same bytes, which never takes the short cut, is the reference.
    #[tokio::test]
    async fn plain_text_frames_are_taken_as_the_general_parse_reads_them() {
        let sixteen_bit_short = [vec![FIN | 1, 126, 0, 5], b"short".to_vec()].concat();
        let mut bytes = Vec::new();
        for len in [0, 1, 125, 126, 127, 300] {
            bytes.extend(frame(FIN | 1, &vec![b'a' + (len % 26) as u8; len], None));
        }
        bytes.extend(sixteen_bit_short);
        bytes.extend(frame(FIN | 9, b"ping", None));
        bytes.extend(frame(1, b"frag", None));
        bytes.extend(frame(FIN, b"ment", None));
        bytes.extend(frame(FIN | 2, b"binary", None));
        bytes.extend(frame(FIN | 1, "é".repeat(40).as_bytes(), None));
        bytes.extend(frame(FIN | 1, &[b'x'; 1000], None));
        bytes.extend(frame(FIN | 1, &[b'y'; 1001], None));
        bytes.extend(frame(FIN | 1, &[b'z'; 65_535], None));
        bytes.extend(frame(FIN | 1, b"last", None));
        for limits in [
            LIMITS,
            FrameLimits {
                max_message_bytes: 1000,
                read_buffer_bytes: 4096,
            },
        ] {
            for chunk in [bytes.len(), 7] {
                let chunks: Vec<Vec<u8>> = bytes.chunks(chunk).map(<[u8]>::to_vec).collect();
                let reference = read_texts(limits, chunks.clone()).await;
                let taken = take_all(limits, chunks).await;
                assert_eq!(
                    taken, reference,
                    "cap {}, chunks of {chunk}",
                    limits.max_message_bytes
                );
                // Under the 1000-byte cap the 1001-byte frame ends the
                // stream after the ten texts before it; otherwise every
                // text is read and the stream ends without a close.
                let texts = if limits.max_message_bytes == 1000 {
                    10
                } else {
                    13
                };
                assert_eq!(taken.iter().filter(|t| t.is_ok()).count(), texts);
                assert!(
                    taken.last().is_some_and(Result::is_err),
                    "ends with an error"
                );
            }
        }
    }

    /// The same agreement over generated streams: frames with first bytes
    /// of every kind the short cut must tell apart (final and unfinished
    /// text, continuations, binary, control frames, reserved bits, unknown
    /// opcodes), every length form, now and then a mask bit, cut into reads
    /// of random sizes, under a cap that some frames exceed.
    #[tokio::test]
    async fn generated_streams_are_taken_as_the_general_parse_reads_them() {
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        const FIRST: [u8; 10] = [0x81, 0x81, 0x81, 0x01, 0x80, 0x00, 0x82, 0x89, 0x8a, 0xc1];
        let limits = FrameLimits {
            max_message_bytes: 3000,
            read_buffer_bytes: 8192,
        };
        for _ in 0..300 {
            let mut bytes = Vec::new();
            for _ in 0..1 + next(12) {
                let b0 = FIRST[next(FIRST.len() as u64) as usize];
                let len = match next(4) {
                    0 => next(126),
                    1 => 126 + next(200),
                    2 => next(3200),
                    _ => next(8),
                } as usize;
                let body: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
                let mut f = frame(b0, &body, None);
                if next(25) == 0 {
                    f[1] |= 0x80;
                }
                bytes.extend(f);
            }
            let mut chunks = Vec::new();
            let mut rest = bytes.as_slice();
            while !rest.is_empty() {
                // A third of the time the rest in one read: frames then lie
                // whole behind others, where the short cut reads them.
                let size = match next(3) {
                    0 => rest.len(),
                    _ => 1 + next(700) as usize,
                };
                let (chunk, tail) = rest.split_at(size.min(rest.len()));
                chunks.push(chunk.to_vec());
                rest = tail;
            }
            let reference = read_texts(limits, chunks.clone()).await;
            assert_eq!(take_all(limits, chunks).await, reference, "{bytes:?}");
        }
    }

    /// A link that takes every frame it reads (a paced stream: one small
    /// frame per read) reads each into the start of its buffer, not into
    /// the next bytes of it: the same few cache lines and pages serve every
    /// read, instead of a walk through the whole buffer.
    #[tokio::test]
    async fn a_link_taking_what_it_reads_reads_into_the_start_of_its_buffer() {
        let payload = [b'x'; 100];
        let chunks = (0..100).map(|_| frame(FIN | 1, &payload, None)).collect();
        let (mut ws, _) = socket(Role::Client, LIMITS, chunks);
        let mut start = None;
        for n in 0..100 {
            assert!(std::future::poll_fn(|cx| ws.poll_frame(cx)).await.unwrap());
            let at = ws.read.as_ptr();
            assert_eq!(
                *start.get_or_insert(at),
                at,
                "read {n} moved into the buffer"
            );
            assert_eq!(ws.read.capacity(), LIMITS.read_buffer_bytes);
            let (_, taken, _) = take(&mut ws, false, (9, 1 << 20)).await;
            assert_eq!(taken.len(), 1);
        }
    }

    #[tokio::test]
    async fn texts_are_taken_in_place_from_what_is_already_read_within_bounds() {
        for role in [Role::Client, Role::Server] {
            let k = key_for(role);
            let first: Vec<u8> = [
                frame(FIN | 1, b"a", k),
                frame(FIN | 9, b"p", k),
                frame(FIN | 1, "bé".as_bytes(), k),
                frame(FIN | 2, b"binary", k),
                frame(FIN | 1, b"c", k),
                frame(1, b"d", k),
            ]
            .concat();
            let chunks = vec![first, frame(FIN, b"e", k), frame(FIN | 8, &[3, 232], k)];
            let (mut ws, written) = socket(role, LIMITS, chunks);
            assert_eq!(
                take(&mut ws, false, (9, 1 << 20)).await.1,
                Vec::<String>::new(),
                "nothing read yet"
            );
            assert_eq!(
                take(&mut ws, true, (1, 1 << 20)).await.1,
                ["a"],
                "{role:?}: one frame allowed"
            );
            assert_eq!(
                take(&mut ws, false, (9, 2)).await.1,
                ["bé"],
                "{role:?}: two bytes allowed"
            );
            let (more, rest, _) = take(&mut ws, false, (9, 1 << 20)).await;
            assert!(more);
            assert_eq!(
                rest,
                ["c"],
                "{role:?}: the binary message is dropped, half a message waits"
            );
            assert_eq!(
                take(&mut ws, true, (9, 1 << 20)).await.1,
                ["de"],
                "{role:?}: joined"
            );
            let (more, rest, _) = take(&mut ws, true, (9, 1 << 20)).await;
            assert!(
                !more && rest.is_empty(),
                "{role:?}: the close ends the stream"
            );
            let end = std::future::poll_fn(|cx| ws.poll_frame(cx)).await;
            assert!(!end.unwrap(), "{role:?}: ended, the close answered");
            let replies = written_frames(role, &written.lock().unwrap());
            assert_eq!(
                replies,
                [(FIN | 10, b"p".to_vec()), (FIN | 8, vec![3, 232])],
                "{role:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_text_that_is_not_utf8_ends_the_stream_after_the_texts_before_it() {
        let chunk = [
            frame(FIN | 1, b"ok", None),
            frame(FIN | 1, &[0xc3, 0x28], None),
        ]
        .concat();
        let (mut ws, _) = socket(
            Role::Client,
            LIMITS,
            vec![chunk, frame(FIN | 1, b"later", None)],
        );
        let (_, taken, refused) = take(&mut ws, true, (9, 1 << 20)).await;
        assert_eq!(taken, ["ok"]);
        assert!(
            refused.is_some_and(|e| e.contains("UTF-8") || e.contains("utf")),
            "refused"
        );
        assert!(
            !std::future::poll_fn(|cx| ws.poll_frame(cx)).await.unwrap(),
            "ended"
        );
    }

    #[tokio::test]
    async fn writes_are_masked_with_a_fresh_key_as_a_client_and_plain_as_a_server() {
        for role in [Role::Client, Role::Server] {
            let (mut ws, written) = socket(role, LIMITS, Vec::new());
            let long = "z".repeat(70_000);
            for m in ["one", "two", "three", long.as_str()] {
                ws.feed(Message::text(m.to_string())).await.unwrap();
            }
            ws.send(Message::Ping(Bytes::from_static(b"p")))
                .await
                .unwrap();
            ws.close(Some(CloseFrame {
                code: CloseCode::Away,
                reason: "done".into(),
            }))
            .await
            .unwrap();
            let err = ws
                .send(Message::text("late"))
                .await
                .err()
                .map(|e| e.to_string());
            assert_eq!(
                err.as_deref(),
                Some("WebSocket protocol error: Sending after closing is not allowed")
            );
            let bytes = written.lock().unwrap().clone();
            let frames = written_frames(role, &bytes);
            let payloads: Vec<&[u8]> = frames.iter().map(|(_, p)| p.as_slice()).collect();
            assert_eq!(
                payloads,
                vec![
                    &b"one"[..],
                    b"two",
                    b"three",
                    long.as_bytes(),
                    b"p",
                    &[0x03, 0xe9, b'd', b'o', b'n', b'e']
                ]
            );
            let kinds: Vec<u8> = frames.iter().map(|(b0, _)| *b0).collect();
            assert_eq!(
                kinds,
                vec![FIN | 1, FIN | 1, FIN | 1, FIN | 1, FIN | 9, FIN | 8]
            );
            if role == Role::Client {
                // Keys sit at the end of each header: not all the same.
                let mut keys = Vec::new();
                let mut buf = bytes.as_slice();
                while !buf.is_empty() {
                    let h = parse_header(buf, Role::Server, usize::MAX, 0)
                        .unwrap()
                        .unwrap();
                    keys.push(h.mask);
                    buf = &buf[h.len + h.payload..];
                }
                assert!(keys.iter().all(Option::is_some));
                assert!(keys.windows(2).any(|w| w[0] != w[1]), "{keys:?}");
            }
        }
    }

    #[tokio::test]
    async fn a_close_after_ours_is_not_answered_and_ends_the_stream() {
        let k = key_for(Role::Server);
        let (mut ws, written) = socket(Role::Server, LIMITS, Vec::new());
        ws.close(None).await.unwrap();
        ws.io = Box::new(Script {
            reads: Arc::new(Mutex::new(VecDeque::from(vec![
                frame(FIN | 1, b"late", k),
                frame(FIN | 8, &[0x03, 0xe8], k),
            ]))),
            written: written.clone(),
            hold: true,
        });
        assert_eq!(drain(&mut ws).await[0], text("late"));
        let frames = written_frames(Role::Server, &written.lock().unwrap());
        assert_eq!(frames, vec![(FIN | 8, Vec::new())], "one close, ours");
        // The end of the byte stream after our close is a clean end.
        let (mut ws, _) = socket(Role::Server, LIMITS, Vec::new());
        ws.close(None).await.unwrap();
        assert!(ws.next().await.is_none());
    }

    #[test]
    fn masking_eight_bytes_at_a_time_matches_the_definition() {
        let key = [0x6d, 0xb6, 0xb2, 0x80];
        for len in 0..40 {
            let data: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            let mut fast = data.clone();
            apply_mask(&mut fast, key);
            let slow: Vec<u8> = data
                .iter()
                .enumerate()
                .map(|(i, b)| b ^ key[i % 4])
                .collect();
            assert_eq!(fast, slow, "{len}");
        }
    }

    /// Our codec against tungstenite's, both roles, over an in-memory pipe:
    /// messages both ways, a ping answered without the reader doing
    /// anything but wait, and the close handshake.
    #[tokio::test]
    async fn interoperates_with_tungstenite_in_both_roles() {
        use tokio_tungstenite::tungstenite::protocol::Role as TRole;
        for role in [Role::Client, Role::Server] {
            let (ours, theirs) = tokio::io::duplex(1 << 20);
            let peer_role = if role == Role::Client {
                TRole::Server
            } else {
                TRole::Client
            };
            let mut peer = WebSocketStream::from_raw_socket(theirs, peer_role, None).await;
            let mut ws = HostSocket::new(Box::new(ours), role, LIMITS);
            let big = "q".repeat(100_000);
            peer.send(Message::text("hi")).await.unwrap();
            peer.send(Message::text(big.clone())).await.unwrap();
            assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("hi"));
            assert_eq!(
                ws.next().await.unwrap().unwrap(),
                Message::text(big.clone())
            );
            ws.send(Message::text("back")).await.unwrap();
            assert_eq!(peer.next().await.unwrap().unwrap(), Message::text("back"));
            // The reader waits; the peer's ping is answered meanwhile.
            let reader = tokio::spawn(async move {
                let got = ws.next().await.map(|r| r.map_err(|e| e.to_string()));
                (ws, got)
            });
            peer.send(Message::Ping(Bytes::from_static(b"rtt")))
                .await
                .unwrap();
            assert_eq!(
                peer.next().await.unwrap().unwrap(),
                Message::Pong(Bytes::from_static(b"rtt"))
            );
            peer.close(None).await.unwrap();
            let (mut ws, got) = reader.await.unwrap();
            assert_eq!(got, Some(Ok(Message::Close(None))));
            assert!(ws.next().await.is_none());
            drop(ws);
            // tungstenite takes our close reply (yielding it or not) and
            // its stream then ends cleanly.
            let mut end = peer.next().await.map(|r| r.map_err(|e| e.to_string()));
            if end == Some(Ok(Message::Close(None))) {
                end = peer.next().await.map(|r| r.map_err(|e| e.to_string()));
            }
            assert!(end.is_none(), "{role:?}: {end:?}");
        }
    }
}

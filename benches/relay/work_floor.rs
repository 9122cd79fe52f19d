//! The work floor: the floor forwarder plus the per-frame work the relay's
//! contract requires of any design, and nothing else.
//!
//! Host → client, after the upgrade response passes through untouched, every
//! host frame is parsed (header, UTF-8) and validated by the relay's own walk
//! (`wire::classify_host`, the guarantee behind every routed value); each
//! action envelope gets the client's channel name looked up (a per-client
//! map, as a session has) and written back, its `serverSeq` replaced by the
//! connection's own number (§5: one sequence per client), the result spliced
//! into a per-batch arena and kept in a bounded replay buffer of the relay's
//! default size (§5.4: 4,096 envelopes) as well as framed for the client;
//! each read's frames go out in one TLS write. When a client leaves, its
//! replay buffer is kept, as a detached session's is (§5.7: kept for
//! `reconnect`), under the relay's default `replay_memory_bytes`, the
//! earliest left dropped first ([`Retained`]). No session, no locks, no
//! queue, no routing table: what remains between this and the relay is the
//! relay's design, not its contract.
//!
//! Client → host, the connection also subscribes `ahp-root://` right after
//! the client's first frame (its `initialize`), as every per-client link
//! does (§6.2: for its own `auth/required` and `root/progress`); the host
//! then sends it every catalog event (`root/session*`), which is read,
//! validated and dropped, with the subscription's answer, as a link drops
//! them ([`up`]). So the floor pays what that subscription costs on each
//! catalog change (one more frame per connection to read), as the relay
//! does and a byte proxy in front of a client that never subscribed root
//! does not.

use std::collections::{HashMap, VecDeque};
use std::hint::black_box;
use std::sync::Mutex;
use std::time::Instant;

use ahp_relay::wire::{self, Frame, FrameKind, Text, WireLimits};
use bytes::{Buf, BytesMut};
use memchr::memmem;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Bytes read at a time, from the host (as the relay's default
/// `upstream_read_buffer_bytes`) and by the plain floor's [`copy`].
const READ: usize = 64 * 1024;
/// Envelopes kept for replay (the relay's default `replay_buffer_envelopes`).
const KEEP: usize = 4096;
/// Arena bytes per frame beyond its own length (as the relay reserves).
const SLACK: usize = 96;
/// Bytes of departed clients' replay buffers kept (the relay's default
/// `replay_memory_bytes`).
const RETAIN_BYTES: usize = 256 << 20;

/// Replay buffers of clients that left, earliest first, with their bytes:
/// the memory a relay keeps for `reconnect` (§5.4, §5.7), so the floor
/// touches fresh memory for every envelope kept, as the relay does, until
/// the budget makes it reuse what it drops. One store for the process's
/// work floors (a relay process has one budget).
struct Retained {
    buffers: VecDeque<(usize, VecDeque<(u64, Text)>)>,
    bytes: usize,
}

static RETAINED: Mutex<Retained> = Mutex::new(Retained {
    buffers: VecDeque::new(),
    bytes: 0,
});

/// Keeps a departed client's replay buffer, dropping the earliest kept
/// until the total is within [`RETAIN_BYTES`]. Buffers count their frames'
/// bytes (the relay also counts a per-envelope overhead, so it drops a
/// little sooner: the floor never keeps less than the relay). Dropped
/// buffers are freed after the lock is released.
fn retain(replay: VecDeque<(u64, Text)>) {
    let bytes: usize = replay.iter().map(|(_, t)| t.len()).sum();
    let mut dropped = Vec::new();
    {
        let mut kept = RETAINED.lock().unwrap_or_else(|e| e.into_inner());
        kept.bytes += bytes;
        kept.buffers.push_back((bytes, replay));
        while kept.bytes > RETAIN_BYTES {
            let Some((b, buffer)) = kept.buffers.pop_front() else {
                break;
            };
            kept.bytes -= b;
            dropped.push(buffer);
        }
    }
    drop(dropped);
}

/// Copies the host's frames to the client doing the contract's per-frame
/// work (module docs); other bytes pass through. Ends like [`copy`].
pub async fn pump<R, W>(mut from: R, mut to: W) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let Some(mut input) = pass_upgrade(&mut from, &mut to).await? else {
        return Ok(());
    };
    let mut client = Client::default();
    client.keep_on_leave = true;
    let mut out: Vec<u8> = Vec::with_capacity(READ + READ / 4);
    loop {
        client.frames(&mut input, &mut out)?;
        if !out.is_empty() {
            write_sliced(&mut to, &out).await?;
            to.flush().await?;
            out.clear();
        }
        input.reserve(READ);
        if from.read_buf(&mut input).await? == 0 {
            return to.shutdown().await;
        }
    }
}

/// The root subscription a per-client link makes (§6.2), as a client
/// frame's payload; its answer is recognised by [`ROOT_ID`].
const ROOT_SUBSCRIBE: &str = r#"{"jsonrpc":"2.0","id":"work-floor-root","method":"subscribe","params":{"channel":"ahp-root://"}}"#;
// One header byte of length: [`masked_text_frame`] writes short frames only.
const _: () = assert!(ROOT_SUBSCRIBE.len() < 126);
/// The id of [`ROOT_SUBSCRIBE`], as its token appears in the answer.
const ROOT_ID: &str = "\"work-floor-root\"";

/// Copies the client's bytes to the host, adding the root subscription a
/// per-client link makes (§6.2) after the client's first frame (the host
/// takes requests only after `initialize`). Ends like [`copy`].
pub async fn up<R, W>(mut from: R, mut to: W) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let Some(mut input) = pass_upgrade(&mut from, &mut to).await? else {
        return Ok(());
    };
    let first = loop {
        if let Some(n) = client_frame_len(&input).filter(|&n| input.len() >= n) {
            break n;
        }
        if from.read_buf(&mut input).await? == 0 {
            return to.shutdown().await;
        }
    };
    let mut out = input.split_to(first).to_vec();
    masked_text_frame(&mut out, ROOT_SUBSCRIBE);
    out.extend_from_slice(&input);
    to.write_all(&out).await?;
    to.flush().await?;
    copy(from, to).await
}

/// Copies `from` to `to` (the floor's forwarding): reads of up to 64 KiB,
/// each written whole and flushed (through TLS: sealed into records and
/// sent) before the next read; shuts `to` down at end of stream.
pub async fn copy<R, W>(mut from: R, mut to: W) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; READ];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return to.shutdown().await;
        }
        write_sliced(&mut to, &buf[..n]).await?;
        to.flush().await?;
    }
}

/// Most bytes per slice handed to TLS, as the relay's client writer hands
/// them (`edge::socket`): rustls copies each slice with one `memcpy`, which
/// stays on glibc's vector loop below ~2 KiB (its `rep movsb` path is far
/// slower per byte on AMD Zen).
const SLICE_BYTES: usize = 2048;

/// Writes all of `bytes` as slices of at most [`SLICE_BYTES`] in vectored
/// writes (one TLS write for the lot, as `write_all` would be).
pub async fn write_sliced<W: AsyncWrite + Unpin>(to: &mut W, bytes: &[u8]) -> std::io::Result<()> {
    let mut slices: Vec<std::io::IoSlice<'_>> = bytes
        .chunks(SLICE_BYTES)
        .map(std::io::IoSlice::new)
        .collect();
    let mut rest = slices.as_mut_slice();
    while !rest.is_empty() {
        let n = to.write_vectored(rest).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        std::io::IoSlice::advance_slices(&mut rest, n);
    }
    Ok(())
}

/// Forwards the HTTP upgrade request or response (through its blank line)
/// and returns what was read after it; `None`, with `to` shut down, if
/// `from` closed first.
async fn pass_upgrade<R, W>(from: &mut R, to: &mut W) -> std::io::Result<Option<BytesMut>>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut input = BytesMut::with_capacity(READ);
    loop {
        if let Some(end) = memmem::find(&input, b"\r\n\r\n") {
            to.write_all(&input.split_to(end + 4)).await?;
            to.flush().await?;
            return Ok(Some(input));
        }
        if from.read_buf(&mut input).await? == 0 {
            to.shutdown().await?;
            return Ok(None);
        }
    }
}

/// A client's sequence origin as the relay makes it (§5.1): microseconds
/// since the epoch, so its numbers have the relay's sixteen digits.
fn s0() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// One client's state: its numbering, its replay buffer and its channels.
struct Client {
    /// The last number issued, from a time-based origin as the contract's
    /// (§5.1: sixteen digits), and its digits.
    seq: u64,
    decimal: wire::Decimal,
    replay: VecDeque<(u64, Text)>,
    channels: HashMap<String, String, foldhash::fast::RandomState>,
    limits: WireLimits,
    /// Whether its replay buffer is kept when it leaves ([`retain`]).
    keep_on_leave: bool,
}

impl Drop for Client {
    fn drop(&mut self) {
        if self.keep_on_leave {
            retain(std::mem::take(&mut self.replay));
        }
    }
}

impl Default for Client {
    fn default() -> Self {
        let s0 = s0();
        Self {
            seq: s0,
            decimal: wire::Decimal::of(s0),
            replay: VecDeque::with_capacity(KEEP),
            channels: HashMap::default(),
            limits: WireLimits {
                max_frame_bytes: 16 << 20,
                max_depth: 256,
            },
            keep_on_leave: false,
        }
    }
}

impl Client {
    /// Every complete frame in `input`, its client form appended to `out`.
    fn frames(&mut self, input: &mut BytesMut, out: &mut Vec<u8>) -> std::io::Result<()> {
        // Sized as the relay sizes a batch's arena: each frame's length plus
        // SLACK (frames here are ~320 bytes).
        let mut arena = BytesMut::with_capacity(input.len() + input.len() / 320 * SLACK + SLACK);
        while let Some((opcode, head, len)) = header(input) {
            if input.len() < head + len {
                break;
            }
            let frame = input.split_to(head + len);
            let payload = &frame[head..];
            let handled = if opcode == 0x81 {
                let text = simdutf8::compat::from_utf8(payload).map_err(std::io::Error::other)?;
                self.host_frame(text, &mut arena)
            } else {
                HostFrame::Pass
            };
            match handled {
                // The splice wrote the frame's header in front (as the
                // relay's writer takes it, in one piece).
                HostFrame::Envelope(t) => match t.framed() {
                    Some(framed) => out.extend_from_slice(framed),
                    None => {
                        frame_header(out, t.len());
                        out.extend_from_slice(t.as_bytes());
                    }
                },
                HostFrame::Drop => {}
                HostFrame::Pass => out.extend_from_slice(&frame),
            }
        }
        Ok(())
    }

    /// What becomes of a host frame: an action envelope renumbered for
    /// this client (kept for replay); the root subscription's answer and
    /// the catalog events it brings dropped (§6.2); anything else passed.
    fn host_frame(&mut self, text: &str, arena: &mut BytesMut) -> HostFrame {
        let Ok(frame) = wire::classify_host(text, &self.limits) else {
            return HostFrame::Pass;
        };
        match &frame.kind {
            FrameKind::Notification { method } if method.starts_with("root/session") => {
                HostFrame::Drop
            }
            FrameKind::Response { id } | FrameKind::ErrorResponse { id, .. }
                if id.raw == ROOT_ID =>
            {
                HostFrame::Drop
            }
            _ => self
                .envelope(text, &frame, arena)
                .map_or(HostFrame::Pass, HostFrame::Envelope),
        }
    }

    /// An action envelope renumbered for this client, kept for replay.
    fn envelope(&mut self, text: &str, frame: &Frame<'_>, arena: &mut BytesMut) -> Option<Text> {
        let (Some(channel), Some(seq)) = (
            frame.params.channel.as_ref(),
            frame.params.server_seq.as_ref(),
        ) else {
            return None;
        };
        if !self.channels.contains_key(&*channel.value) {
            // The client channel's JSON token, made once (as a session's
            // batch route makes it).
            let mut token = String::new();
            wire::json_escape_into(&mut token, &channel.value);
            self.channels.insert(channel.value.to_string(), token);
        }
        let client_channel = wire::EditValue::Raw(self.channels.get(&*channel.value)?);
        self.seq += 1;
        let text = wire::splice_routed_into(
            text,
            (channel.range.clone(), client_channel),
            (seq.range.clone(), self.decimal.set(self.seq)),
            arena,
        )
        .ok()?;
        if self.replay.len() == KEEP {
            self.replay.pop_front();
        }
        self.replay.push_back((self.seq, text.clone()));
        Some(text)
    }
}

/// What [`Client::host_frame`] makes of a host frame.
enum HostFrame {
    /// An action envelope in the client's form.
    Envelope(Text),
    /// Read and dropped (what a link discards).
    Drop,
    /// Forwarded as it came.
    Pass,
}

/// The work floor's per-frame work measured alone, in memory: no socket,
/// no TLS, no other thread.
pub struct InMemory {
    /// Nanoseconds of per-frame work (everything [`pump`] does to a frame
    /// between the read and the write, the copy into the read buffer taken
    /// out).
    pub work_ns: f64,
    /// Of which the validating walk (`wire::classify_notification`) alone.
    pub walk_ns: f64,
    /// Of which the UTF-8 check alone.
    pub utf8_ns: f64,
    /// Of which the splice of the two routed values alone
    /// (`wire::splice_routed_into`, each result dropped as it is made).
    pub splice_ns: f64,
}

/// Runs `frames` (host text frames), as one host read after another, through
/// a client's work `rounds` times (see [`InMemory`]), then the walk, the
/// UTF-8 check and the splice alone over the same frames.
pub fn in_memory(frames: &[&str], rounds: usize) -> std::io::Result<InMemory> {
    let mut stream = Vec::new();
    for f in frames {
        frame_header(&mut stream, f.len());
        stream.extend_from_slice(f.as_bytes());
    }
    let per_round = frames.len().max(1) as f64;
    let copies = Instant::now();
    for _ in 0..rounds {
        black_box(BytesMut::from(&stream[..]));
    }
    let copies = copies.elapsed();
    let mut client = Client::default();
    let mut out = Vec::with_capacity(stream.len() * 2);
    let work = Instant::now();
    for _ in 0..rounds {
        let mut input = BytesMut::from(&stream[..]);
        client.frames(&mut input, &mut out)?;
        black_box(&out);
        out.clear();
    }
    let work = work.elapsed().saturating_sub(copies);
    let limits = client.limits;
    let walk = Instant::now();
    for _ in 0..rounds {
        for f in frames {
            black_box(wire::classify_notification(black_box(f), &limits));
        }
    }
    let walk = walk.elapsed();
    let utf8 = Instant::now();
    for _ in 0..rounds {
        for f in frames {
            black_box(simdutf8::compat::from_utf8(black_box(f.as_bytes())).is_ok());
        }
    }
    let utf8 = utf8.elapsed();
    let splice = time_splices(frames, rounds, &limits);
    let per = |d: std::time::Duration| d.as_nanos() as f64 / (rounds as f64 * per_round);
    Ok(InMemory {
        work_ns: per(work),
        walk_ns: per(walk),
        utf8_ns: per(utf8),
        splice_ns: per(splice),
    })
}

/// The time `rounds` splices of each of `frames` take (channel and
/// `serverSeq` found first, untimed), into one batch arena per round.
fn time_splices(frames: &[&str], rounds: usize, limits: &WireLimits) -> std::time::Duration {
    let routed: Vec<_> = frames
        .iter()
        .filter_map(|f| {
            let frame = wire::classify_notification(f, limits)?;
            let channel = frame.params.channel.as_ref()?;
            let mut token = String::new();
            wire::json_escape_into(&mut token, &channel.value);
            Some((
                *f,
                channel.range.clone(),
                token,
                frame.params.server_seq?.range,
            ))
        })
        .collect();
    let bytes: usize = frames.iter().map(|f| f.len() + SLACK).sum();
    let started = Instant::now();
    let mut n = s0();
    let mut decimal = wire::Decimal::of(n);
    for _ in 0..rounds {
        let mut arena = BytesMut::with_capacity(bytes);
        for (text, channel, token, seq) in &routed {
            n += 1;
            let edit = (channel.clone(), wire::EditValue::Raw(token));
            let n = (seq.clone(), decimal.set(n));
            black_box(wire::splice_routed_into(text, edit, n, &mut arena).ok());
        }
    }
    started.elapsed()
}

/// A server frame's (first byte, header length, payload length), if its
/// header is complete (server frames are unmasked).
fn header(input: &[u8]) -> Option<(u8, usize, usize)> {
    let (&b0, rest) = input.split_first()?;
    let (&b1, rest) = rest.split_first()?;
    match b1 & 0x7f {
        126 => {
            let n = rest.get(..2)?;
            Some((b0, 4, usize::from(u16::from_be_bytes([n[0], n[1]]))))
        }
        127 => {
            let mut n = rest.get(..8)?;
            Some((b0, 10, usize::try_from(n.get_u64()).ok()?))
        }
        n => Some((b0, 2, usize::from(n))),
    }
}

/// A client frame's whole length (header, mask key, payload), if its
/// header is complete.
fn client_frame_len(input: &[u8]) -> Option<usize> {
    let (_, head, len) = header(input)?;
    let mask = if input.get(1)? & 0x80 != 0 { 4 } else { 0 };
    Some(head + mask + len)
}

/// Appends a final text frame of `text` (under 126 bytes) masked with a
/// zero key, as a client sends it.
fn masked_text_frame(out: &mut Vec<u8>, text: &str) {
    out.push(0x81);
    out.push(0x80 | text.len() as u8);
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(text.as_bytes());
}

/// Appends an unmasked final text frame's header for `len` payload bytes.
fn frame_header(out: &mut Vec<u8>, len: usize) {
    out.push(0x81);
    if len < 126 {
        out.push(len as u8);
    } else if len <= usize::from(u16::MAX) {
        out.push(126);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(127);
        out.extend_from_slice(&(len as u64).to_be_bytes());
    }
}

/// The work floor's per-frame work with the caches cold, as at the paced
/// load, where a frame's work runs after other processes (host, clients,
/// the kernel) have had the core: nanoseconds per frame, medians over the
/// frames, each figure timed on its own.
pub struct Cold {
    /// Everything [`pump`] does to one frame (`Client::frames`), code and
    /// data cold.
    pub work_ns: f64,
    /// The same with another connection's frame worked just before: the
    /// code, the stack and the allocator's state warm, this connection's
    /// own data (numbering, channel map, replay buffer, output) still cold.
    pub warm_code_ns: f64,
    /// The validating walk (`wire::classify_host`) alone.
    pub walk_ns: f64,
    /// The splice of the two routed values alone.
    pub splice_ns: f64,
    /// The UTF-8 check alone.
    pub utf8_ns: f64,
}

/// Bytes written between two frames to push the relay's code and data out
/// of the core's caches (Zen 3's L2 is 512 KiB and holds L1's lines). With
/// 1 MiB the excess over the warm figure was about half as large, with a
/// buffer on 2 MiB pages (so the TLB stays warm) the same: it is cache
/// misses, not TLB misses (BENCHMARKS.md, thirty-first round).
const EVICT: usize = 4 << 20;

/// Runs each of `frames` once per round through one of `clients`
/// connections' work (round-robin, as the paced load's streams take turns),
/// with [`EVICT`] bytes written before each frame and the frame's own bytes
/// read back (they have just been copied from the socket when a relay
/// walks them); then again with another connection's frame worked first;
/// then the walk, the splice and the UTF-8 check alone the same way. See
/// [`Cold`].
pub fn cold(frames: &[&str], clients: usize, rounds: usize) -> std::io::Result<Cold> {
    let mut evict = vec![0u8; EVICT];
    let mut stream: Vec<Vec<u8>> = Vec::new();
    for f in frames {
        let mut s = Vec::new();
        frame_header(&mut s, f.len());
        s.extend_from_slice(f.as_bytes());
        stream.push(s);
    }
    let mut conns: Vec<Client> = (0..clients.max(1)).map(|_| Client::default()).collect();
    let mut outs: Vec<Vec<u8>> = (0..conns.len()).map(|_| Vec::with_capacity(4096)).collect();
    let mut times = [
        Vec::with_capacity(rounds * frames.len()),
        Vec::with_capacity(rounds * frames.len()),
    ];
    let mut k = 0;
    for warm_first in [false, true] {
        for _ in 0..rounds {
            for s in &stream {
                let c = k % conns.len();
                evict_caches(&mut evict, s, k);
                if warm_first {
                    let o = (c + 1) % conns.len();
                    conns[o].frames(&mut BytesMut::from(&s[..]), &mut outs[o])?;
                    outs[o].clear();
                }
                let mut input = BytesMut::from(&s[..]);
                let t = Instant::now();
                conns[c].frames(&mut input, &mut outs[c])?;
                times[usize::from(warm_first)].push(t.elapsed().as_nanos() as f64);
                black_box(&outs[c]);
                outs[c].clear();
                k += 1;
            }
        }
    }
    let [mut cold, mut warm_code] = times;
    let limits = conns[0].limits;
    let mut part = |f: &dyn Fn(&str) -> bool| {
        let mut times = Vec::with_capacity(rounds * frames.len());
        for _ in 0..rounds {
            for (i, t) in frames.iter().enumerate() {
                evict_caches(&mut evict, t.as_bytes(), i);
                let s = Instant::now();
                black_box(f(black_box(t)));
                times.push(s.elapsed().as_nanos() as f64);
            }
        }
        median(&mut times)
    };
    let walk_ns = part(&|t| wire::classify_host(t, &limits).is_ok());
    let utf8_ns = part(&|t| simdutf8::compat::from_utf8(t.as_bytes()).is_ok());
    let routed = std::cell::RefCell::new((s0(), wire::Decimal::of(s0())));
    let walk_and_splice_ns = part(&|t| {
        let Ok(frame) = wire::classify_host(t, &limits) else {
            return false;
        };
        let (Some(ch), Some(seq)) = (frame.params.channel, frame.params.server_seq) else {
            return false;
        };
        let mut arena = BytesMut::with_capacity(t.len() + SLACK);
        let (n, decimal) = &mut *routed.borrow_mut();
        *n += 1;
        let edit = (ch.range.clone(), wire::EditValue::Raw("\"x\""));
        wire::splice_routed_into(t, edit, (seq.range.clone(), decimal.set(*n)), &mut arena).is_ok()
    });
    Ok(Cold {
        work_ns: median(&mut cold),
        warm_code_ns: median(&mut warm_code),
        walk_ns,
        // Timed with a walk in front (it finds what it splices).
        splice_ns: (walk_and_splice_ns - walk_ns).max(0.0),
        utf8_ns,
    })
}

/// Writes a byte of every line of `evict` (each pass a new value, so no
/// line stays clean), then reads `frame` back into the cache.
fn evict_caches(evict: &mut [u8], frame: &[u8], pass: usize) {
    for line in evict.chunks_mut(64) {
        line[0] = line[0].wrapping_add(pass as u8);
    }
    black_box(frame.iter().fold(0u8, |a, b| a ^ b));
}

/// The middle value of `v` (sorted in place); 0 when empty.
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

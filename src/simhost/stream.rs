//! The streaming load mode: a turn whose message holds `[stream:<n>]`
//! streams `n` `chat/delta` actions as fast as the subscribed sockets take
//! them (or `SimHostConfig::stream_rate` per second), for benchmarks.
//!
//! What it guarantees:
//! - every frame is a real `action` envelope of the chat, numbered in the
//!   host-wide `serverSeq` under the host lock, so it is ordered with every
//!   other envelope on every connection;
//! - frames are rendered from a template (no serde per frame) in batches of
//!   `stream_batch`, one lock and one queue push per batch per subscriber;
//!   a connection writes a batch back to back and flushes once;
//! - at most `stream_in_flight` batches are queued but not yet written by
//!   every subscriber: the stream is paced by its slowest subscriber's
//!   socket, and host memory stays bounded;
//! - each delta's text starts with `@<send time, µs since the UNIX epoch,
//!   16 digits>;` so a client measures per-action latency end to end.
//!
//! What it gives up, on purpose: the deltas are neither applied to the
//! host's chat state (a million appends would be the benchmark) nor kept in
//! the replay log; the log's window is moved past them instead, so a
//! `reconnect` whose watermark lies before the stream's end gets a snapshot,
//! never a replay with a silent gap.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::Semaphore;
use tokio_tungstenite::tungstenite::Utf8Bytes;

use super::core::HostCore;

/// What a message writes to start the streaming load mode: `[stream:<n>]`.
pub const MARKER: &str = "[stream:";

/// The number of deltas a message text asks to stream, if it carries [`MARKER`].
pub fn requested(text: &str) -> Option<u64> {
    let start = text.find(MARKER)? + MARKER.len();
    let rest = text.get(start..)?;
    rest.get(..rest.find(']')?)?.parse().ok()
}

/// A pre-rendered `chat/delta` envelope with two holes: the send stamp and
/// the `serverSeq`.
#[derive(Debug, Clone)]
pub struct Template {
    head: String,
    /// Filler the content ends with: its first `pad_for(seq)` bytes (ASCII).
    pad: String,
    /// Filler bytes of a frame without jitter.
    base_pad: usize,
    /// Frames' filler lengths spread over `base_pad ± jitter / 2`.
    jitter: usize,
}

/// What follows the filler and precedes the `serverSeq` digits.
const TAIL: &str = r#""},"serverSeq":"#;

const STAMP_DIGITS: usize = 16;
const FILLER: &str = "streamed-load-";

impl Template {
    /// The template of deltas on `part_id` of turn `turn_id` in `chat`,
    /// padded so a frame is about `frame_bytes` long.
    pub fn new(chat: &str, turn_id: &str, part_id: &str, frame_bytes: usize) -> Self {
        let q = |s: &str| serde_json::Value::from(s).to_string();
        let head = format!(
            r#"{{"jsonrpc":"2.0","method":"action","params":{{"channel":{},"action":{{"type":"chat/delta","turnId":{},"partId":{},"content":"@"#,
            q(chat),
            q(turn_id),
            q(part_id)
        );
        let fixed = head.len() + STAMP_DIGITS + 1 + TAIL.len() + 8 + 2;
        let base_pad = frame_bytes.saturating_sub(fixed);
        Self {
            head,
            pad: FILLER.chars().cycle().take(base_pad).collect(),
            base_pad,
            jitter: 0,
        }
    }

    /// The same template with frame lengths spread evenly over `jitter + 1`
    /// values around the asked size (`frame_bytes ± jitter / 2`), chosen per
    /// `serverSeq` by a fixed hash: every path of a benchmark gets the same
    /// lengths, and no single length's arithmetic (a receiver's window
    /// rounding) decides a comparison.
    pub fn with_jitter(mut self, jitter: usize) -> Self {
        self.jitter = jitter.min(self.base_pad * 2);
        self.pad = FILLER
            .chars()
            .cycle()
            .take(self.base_pad + self.jitter / 2)
            .collect();
        self
    }

    /// The filler length of frame `seq`.
    fn pad_for(&self, seq: u64) -> usize {
        if self.jitter == 0 {
            return self.base_pad;
        }
        let spread = (seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) % (self.jitter as u64 + 1);
        self.base_pad - self.jitter / 2 + spread as usize
    }

    /// The frame numbered `seq`, stamped `micros` (µs since the UNIX epoch).
    pub fn render(&self, seq: u64, micros: u64) -> Utf8Bytes {
        self.render_batch(seq, 1, || micros)
            .pop()
            .unwrap_or_else(|| Utf8Bytes::from_static(""))
    }

    /// Frames `first_seq .. first_seq + n`, each stamped by `stamp()` as it
    /// is rendered. All of them share one buffer (one allocation per batch,
    /// digits written without `fmt`): the host's cost per action is what the
    /// streaming mode exists to keep small.
    pub fn render_batch(
        &self,
        first_seq: u64,
        n: u64,
        mut stamp: impl FnMut() -> u64,
    ) -> Vec<Utf8Bytes> {
        let per = self.head.len() + 1 + self.pad.len() + TAIL.len() + STAMP_DIGITS + 22;
        let count = usize::try_from(n).unwrap_or(0);
        let mut buf = Vec::with_capacity(per * count);
        let mut ends = Vec::with_capacity(count);
        for seq in (0..n).map(|i| first_seq + i) {
            buf.extend_from_slice(self.head.as_bytes());
            push_padded(&mut buf, stamp(), STAMP_DIGITS);
            buf.push(b';');
            let pad = self.pad.as_bytes();
            buf.extend_from_slice(&pad[..self.pad_for(seq).min(pad.len())]);
            buf.extend_from_slice(TAIL.as_bytes());
            push_u64(&mut buf, seq);
            buf.extend_from_slice(b"}}");
            ends.push(buf.len());
        }
        let all = bytes::Bytes::from(buf);
        let mut start = 0;
        ends.into_iter()
            .filter_map(|end| {
                let frame = Utf8Bytes::try_from(all.slice(start..end)).ok();
                start = end;
                frame
            })
            .collect()
    }
}

/// The decimal digits of `v`, right-aligned in a buffer, and where they start.
fn digits(v: u64) -> ([u8; 20], usize) {
    let mut out = [b'0'; 20];
    let mut i = out.len();
    let mut v = v;
    loop {
        i -= 1;
        out[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            return (out, i);
        }
    }
}

/// Appends `v` in decimal.
fn push_u64(buf: &mut Vec<u8>, v: u64) {
    let (d, start) = digits(v);
    buf.extend_from_slice(&d[start..]);
}

/// Appends `v` in decimal, zero-padded to `width` digits (at most 20).
fn push_padded(buf: &mut Vec<u8>, v: u64, width: usize) {
    let (d, start) = digits(v);
    let from = start.min(d.len().saturating_sub(width));
    buf.extend_from_slice(&d[from..]);
}

/// Microseconds since the UNIX epoch (0 if the clock is before it).
pub fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Reads the send stamp back out of a streamed delta's text.
pub fn stamp_of(content: &str) -> Option<u64> {
    content.strip_prefix('@')?.get(..STAMP_DIGITS)?.parse().ok()
}

/// How a stream is run: its size, pace and bounds.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// Deltas to stream.
    pub total: u64,
    /// Deltas per second; 0 = as fast as the sockets take them.
    pub rate: u32,
    /// Frames per batch.
    pub batch: usize,
    /// Batches in flight.
    pub in_flight: usize,
}

/// Streams `pace.total` deltas rendered by `tpl` on `chat`. `live` runs
/// under the host lock before each batch; when it says the turn is over
/// (cancelled, host restarted) the stream stops and `false` is returned.
pub async fn run(
    shared: &Arc<super::server::Shared>,
    chat: &str,
    tpl: &Template,
    pace: Pace,
    live: impl Fn(&HostCore) -> bool,
) -> bool {
    let permits = Arc::new(Semaphore::new(pace.in_flight.max(1)));
    let batch = pace.batch.max(1) as u64;
    let start = Instant::now();
    let mut sent = 0u64;
    while sent < pace.total {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return false;
        };
        let mut n = batch.min(pace.total - sent);
        if pace.rate > 0 {
            let rate = f64::from(pace.rate);
            let due = (start.elapsed().as_secs_f64() * rate) as u64;
            if due <= sent {
                let next = start + Duration::from_secs_f64((sent + 1) as f64 / rate);
                tokio::time::sleep_until(next.into()).await;
                continue;
            }
            n = n.min(due - sent);
        }
        let mut core = shared.lock();
        if !live(&core) {
            return false;
        }
        core.emit_prerendered(
            chat,
            |first| tpl.render_batch(first, n, now_micros),
            n,
            permit,
        );
        sent += n;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendered_frames_parse_as_envelopes_of_the_asked_size() {
        let tpl = Template::new("ahp-chat:/s-1-main", "turn-1", "turn-1-text", 320);
        let frame = tpl.render(1_234_567, 1_733_000_000_000_000);
        assert!((300..=340).contains(&frame.len()), "{}", frame.len());
        let v: serde_json::Value = serde_json::from_str(frame.as_str()).expect("json");
        assert_eq!(v["params"]["serverSeq"], 1_234_567);
        let env: ahp_types::actions::ActionEnvelope =
            serde_json::from_value(v["params"].clone()).expect("envelope");
        let ahp_types::actions::StateAction::ChatDelta(d) = env.action else {
            panic!("not a delta");
        };
        assert_eq!(stamp_of(&d.content), Some(1_733_000_000_000_000));
        assert_eq!(d.part_id, "turn-1-text");
    }

    #[test]
    fn batches_render_like_single_frames() {
        let tpl = Template::new("ahp-chat:/c", "t", "p", 200);
        let batch = tpl.render_batch(7, 3, || 42);
        assert_eq!(batch.len(), 3);
        for (i, f) in batch.iter().enumerate() {
            assert_eq!(f, &tpl.render(7 + i as u64, 42));
        }
        let mut b = Vec::new();
        push_u64(&mut b, 0);
        push_padded(&mut b, 123, 5);
        assert_eq!(b, b"000123");
    }

    #[test]
    fn jittered_frames_spread_evenly_around_the_asked_size_and_stay_envelopes() {
        let plain = Template::new("ahp-chat:/s-1-main", "turn-1", "turn-1-text", 320);
        let tpl = plain.clone().with_jitter(64);
        // Same digits in every frame, so lengths differ by filler alone.
        let seqs = 1_000_000..1_004_000u64;
        let base = plain.render(seqs.start, 1).len() as i64;
        let lens: Vec<i64> = seqs
            .clone()
            .map(|q| tpl.render(q, 1).len() as i64 - base)
            .collect();
        let (lo, hi) = (
            *lens.iter().min().expect("some"),
            *lens.iter().max().expect("some"),
        );
        assert_eq!((lo, hi), (-32, 32), "the spread is the asked size ± 32");
        let distinct: std::collections::HashSet<_> = lens.iter().collect();
        assert_eq!(distinct.len(), 65, "every length in the spread occurs");
        let mean = lens.iter().sum::<i64>() as f64 / lens.len() as f64;
        assert!(mean.abs() < 2.0, "centred on the asked size: {mean}");
        assert_eq!(
            tpl.render(seqs.start + 7, 5),
            tpl.render(seqs.start + 7, 5),
            "a frame's length follows from its serverSeq alone"
        );
        for (i, f) in tpl
            .render_batch(seqs.start, 50, || 1_733_000_000_000_000)
            .iter()
            .enumerate()
        {
            let v: serde_json::Value = serde_json::from_str(f.as_str()).expect("json");
            assert_eq!(v["params"]["serverSeq"], seqs.start + i as u64);
            let env: ahp_types::actions::ActionEnvelope =
                serde_json::from_value(v["params"].clone()).expect("envelope");
            let ahp_types::actions::StateAction::ChatDelta(d) = env.action else {
                panic!("not a delta");
            };
            assert_eq!(stamp_of(&d.content), Some(1_733_000_000_000_000));
        }
        assert_eq!(
            plain.with_jitter(0).render(seqs.start + 9, 1).len() as i64,
            base,
            "no jitter, one size"
        );
    }

    #[test]
    fn marker_parses() {
        assert_eq!(requested("go [stream:1000] now"), Some(1000));
        assert_eq!(requested("go [stream:x]"), None);
        assert_eq!(requested("go"), None);
    }
}

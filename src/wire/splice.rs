//! Splicing: replace a few byte ranges of a frame in one pass, without re-serializing.

use std::ops::Range;

use bytes::BytesMut;

use super::decimal::Decimal;
use super::text::{TEXT_OPCODE, Text, frame_header_len, put_frame_header};

/// Where spliced text is written: a `String`, or the shared buffer a batch of
/// frames is spliced into ([`splice_into`]). Only `str`s are ever appended, so
/// what is written is UTF-8.
pub trait Out {
    /// Appends `s`.
    fn push_str(&mut self, s: &str);
    /// Makes room for `n` more bytes.
    fn reserve(&mut self, n: usize);
}

impl Out for String {
    fn push_str(&mut self, s: &str) {
        String::push_str(self, s);
    }
    fn reserve(&mut self, n: usize) {
        String::reserve(self, n);
    }
}

impl Out for BytesMut {
    fn push_str(&mut self, s: &str) {
        self.extend_from_slice(s.as_bytes());
    }
    fn reserve(&mut self, n: usize) {
        BytesMut::reserve(self, n);
    }
}

/// A replacement value, written in JSON form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EditValue<'e> {
    /// A JSON integer.
    U64(u64),
    /// A JSON string: quotes added, `"`, `\` and control characters escaped.
    JsonString(&'e str),
    /// Text inserted as is; the caller guarantees it is one valid JSON value
    /// (for example a [`RawId`](super::RawId)'s `raw` being echoed).
    Raw(&'e str),
}

impl EditValue<'_> {
    /// Bytes this value takes (exact except for strings that need escapes),
    /// so the spliced frame is allocated at its exact size: a buffer without
    /// spare capacity becomes a `Bytes` without a second allocation.
    fn len_hint(&self) -> usize {
        match self {
            Self::U64(n) => n.checked_ilog10().map_or(1, |d| d as usize + 1),
            Self::JsonString(s) => s.len() + 2,
            Self::Raw(s) => s.len(),
        }
    }

    /// Appends the JSON form of this value to `out`.
    fn write_into(&self, out: &mut impl Out) {
        match self {
            Self::U64(n) => out.push_str(itoa::Buffer::new().format(*n)),
            Self::JsonString(s) => json_escape_into(out, s),
            Self::Raw(s) => out.push_str(s),
        }
    }
}

/// Replace the bytes `range` of the frame with `replacement`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edit<'e> {
    /// Byte range of the frame to replace; empty means insert at `range.start`.
    pub range: Range<usize>,
    /// What to write there.
    pub replacement: EditValue<'e>,
}

/// Edits that [`splice`] refuses; always a bug in the caller, never in the frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpliceError {
    /// A range is reversed, ends past the text, or splits a UTF-8 character.
    #[error("edit range {start}..{end} is not a valid range of a {len}-byte frame")]
    OutOfBounds {
        /// Range start.
        start: usize,
        /// Range end.
        end: usize,
        /// Length of the frame.
        len: usize,
    },
    /// Two ranges overlap or start at the same offset.
    #[error("edit ranges {first:?} and {second:?} overlap")]
    Overlap {
        /// The earlier range.
        first: Range<usize>,
        /// The range that overlaps it.
        second: Range<usize>,
    },
}

/// Returns `text` with every edit applied; sorts `edits` by position first.
///
/// Guarantees: the output is built in one pass into one allocation sized for the result
/// (escaped strings may grow it), bytes outside the edited ranges are copied unchanged,
/// and nothing is written unless every edit is valid: ranges within `text` on character
/// boundaries, pairwise disjoint, no two starting at the same offset.
pub fn splice(text: &str, edits: &mut [Edit<'_>]) -> Result<String, SpliceError> {
    let capacity = checked_capacity(text, edits)?;
    let mut out = String::with_capacity(capacity);
    write_spliced(text, edits, &mut out);
    Ok(out)
}

/// [`splice`] into `arena`, a buffer shared by the frames of one batch: the
/// result is split off it, so a batch of frames costs one allocation (or a
/// few, if `arena` was sized short) instead of one or two per frame. Same
/// guarantees as [`splice`]; nothing is written to `arena` on an error.
pub fn splice_into(
    text: &str,
    edits: &mut [Edit<'_>],
    arena: &mut BytesMut,
) -> Result<Text, SpliceError> {
    // The text starts the arena: every splice takes what it wrote, so
    // nothing is left in it, and clearing it makes that a guarantee.
    arena.clear();
    let piece = splice_at(text, edits, arena)?;
    Ok(take_piece(arena, piece))
}

/// [`splice_into`] without taking the result: it is appended to `arena`
/// after what the batch's frames before it left there, and its place is
/// returned, to become a [`Text`] with [`Text::in_batch`] once the batch's
/// buffer is frozen. Same guarantees; nothing is written on an error.
pub fn splice_at(
    text: &str,
    edits: &mut [Edit<'_>],
    arena: &mut BytesMut,
) -> Result<Piece, SpliceError> {
    let capacity = checked_capacity(text, edits)?;
    let framing = begin_framed(arena, capacity);
    write_spliced(text, edits, arena);
    Ok(end_framed(arena, framing))
}

/// [`splice_into`] with the two edits of nearly every envelope: the string
/// token at `channel` replaced by `client_channel` (an
/// [`EditValue::JsonString`], or the same name already in JSON form as an
/// [`EditValue::Raw`]) and the number at `seq` by `n` (its digits as
/// [`EditValue::U64`] writes them, kept by the [`Decimal`] instead of
/// formatted per frame). The same result and guarantees, without building,
/// sorting and walking a list of edits.
pub fn splice_routed_into(
    text: &str,
    channel: (Range<usize>, EditValue<'_>),
    seq: (Range<usize>, &Decimal),
    arena: &mut BytesMut,
) -> Result<Text, SpliceError> {
    arena.clear();
    let piece = splice_routed_at(text, channel, seq, arena)?;
    Ok(take_piece(arena, piece))
}

/// [`splice_routed_into`] appended to `arena` without taking the result,
/// as [`splice_at`] is.
pub fn splice_routed_at(
    text: &str,
    (channel, client_channel): (Range<usize>, EditValue<'_>),
    (seq, n): (Range<usize>, &Decimal),
    arena: &mut BytesMut,
) -> Result<Piece, SpliceError> {
    // Every cut is checked to be a character boundary within `text` here, so
    // the pieces between them are copied as bytes and what is written is
    // still UTF-8 (as `Out` promises): no `str` range check per piece.
    let in_text = |r: &Range<usize>| {
        r.start <= r.end && text.is_char_boundary(r.start) && text.is_char_boundary(r.end)
    };
    for range in [&channel, &seq] {
        if !in_text(range) {
            return Err(SpliceError::OutOfBounds {
                start: range.start,
                end: range.end,
                len: text.len(),
            });
        }
    }
    let (first, second) = if channel.start < seq.start {
        (&channel, &seq)
    } else {
        (&seq, &channel)
    };
    if second.start < first.end || second.start == first.start {
        return Err(SpliceError::Overlap {
            first: first.clone(),
            second: second.clone(),
        });
    }
    // ASCII digits: what is written stays UTF-8.
    let digits = n.as_bytes();
    let capacity =
        text.len() - channel.len() - seq.len() + client_channel.len_hint() + digits.len();
    let framing = begin_framed(arena, capacity);
    let bytes = text.as_bytes();
    let mut copied = 0;
    for range in [first, second] {
        arena.extend_from_slice(bytes.get(copied..range.start).unwrap_or_default());
        if range.start == channel.start {
            client_channel.write_into(arena);
        } else {
            arena.extend_from_slice(digits);
        }
        copied = range.end;
    }
    arena.extend_from_slice(bytes.get(copied..).unwrap_or_default());
    Ok(end_framed(arena, framing))
}

/// Where a spliced text lies in its batch's buffer: from `start` (its
/// header's first byte) to `end`, the first `head` bytes its WebSocket
/// text-frame header (0: none). Made by [`splice_at`] and
/// [`splice_routed_at`]; becomes a [`Text`] with [`Text::in_batch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub(super) start: usize,
    pub(super) end: usize,
    pub(super) head: u8,
}

impl Piece {
    /// Where the text ends in its batch's buffer.
    pub fn end(&self) -> usize {
        self.end
    }
}

/// A framed text begun in an arena: where it starts, its header's length
/// and the payload length the header says.
struct Framing {
    start: usize,
    head: usize,
    capacity: usize,
}

/// Begins a text at the end of `arena` with its frame header in front:
/// room reserved for the header and `capacity` payload bytes, and the
/// header written for `capacity` (the payload's exact length unless a
/// string needs escapes).
#[inline(always)]
fn begin_framed(arena: &mut BytesMut, capacity: usize) -> Framing {
    let start = arena.len();
    Out::reserve(arena, frame_header_len(capacity) + capacity);
    let head = put_frame_header(arena, TEXT_OPCODE, capacity);
    Framing {
        start,
        head,
        capacity,
    }
}

/// Ends the text [`begin_framed`] began: a payload longer than foreseen
/// (escapes) gets its header rewritten when the new length's header is as
/// long, and goes without one otherwise, so a header is always
/// [`put_frame_header`]'s for the payload's length.
#[inline(always)]
fn end_framed(arena: &mut BytesMut, framing: Framing) -> Piece {
    let Framing {
        start,
        head,
        capacity,
    } = framing;
    let end = arena.len();
    let len = end - start - head;
    if len != capacity {
        if frame_header_len(len) != head {
            return Piece {
                start: start + head,
                end,
                head: 0,
            };
        }
        if let Some(mut slot) = arena.get_mut(start..start + head) {
            // As long as the header written: rewritten in place.
            put_frame_header(&mut slot, TEXT_OPCODE, len);
        }
    }
    Piece {
        start,
        end,
        head: head as u8,
    }
}

/// The text `piece`, the only one in `arena`, as bytes of its own. An arena
/// holding exactly this frame (a lone frame spliced into an empty arena,
/// sized exactly by the splice) is taken whole: one allocation of the
/// frame's size and no shared header, which is what a replay buffer then
/// holds per envelope. Otherwise the frame is split off the arena.
fn take_piece(arena: &mut BytesMut, piece: Piece) -> Text {
    let whole = if arena.len() == arena.capacity() {
        std::mem::take(arena).freeze()
    } else {
        arena.split().freeze()
    };
    Text::of_prefix(whole, piece)
}

/// Sorts `edits`, checks them against `text` and returns the spliced length
/// (exact unless a string needs escapes).
fn checked_capacity(text: &str, edits: &mut [Edit<'_>]) -> Result<usize, SpliceError> {
    edits.sort_unstable_by_key(|edit| (edit.range.start, edit.range.end));
    let mut capacity = text.len();
    let mut previous: Option<&Range<usize>> = None;
    for edit in edits.iter() {
        let range = &edit.range;
        if text.get(range.clone()).is_none() {
            return Err(SpliceError::OutOfBounds {
                start: range.start,
                end: range.end,
                len: text.len(),
            });
        }
        if let Some(first) = previous
            && (range.start < first.end || range.start == first.start)
        {
            return Err(SpliceError::Overlap {
                first: first.clone(),
                second: range.clone(),
            });
        }
        capacity = capacity.saturating_sub(range.len()) + edit.replacement.len_hint();
        previous = Some(range);
    }
    Ok(capacity)
}

/// Writes `text` with `edits` (sorted and checked) applied.
fn write_spliced(text: &str, edits: &[Edit<'_>], out: &mut impl Out) {
    let mut copied = 0;
    for edit in edits {
        out.push_str(text.get(copied..edit.range.start).unwrap_or_default());
        edit.replacement.write_into(out);
        copied = edit.range.end;
    }
    out.push_str(text.get(copied..).unwrap_or_default());
}

/// Appends `s` to `out` as a JSON string token: quoted, with `"`, `\` and U+0000–U+001F
/// escaped (short forms where JSON has them, `\u00XX` otherwise); everything else,
/// including non-ASCII, is copied unchanged. The result parses back to exactly `s`.
pub fn json_escape_into(out: &mut impl Out, s: &str) {
    out.reserve(s.len() + 2);
    out.push_str("\"");
    // Most strings (URIs) need no escape: one branch-free pass finds out.
    let plain = s.bytes().fold(true, |plain, b| {
        plain & (b >= 0x20 && b != b'"' && b != b'\\')
    });
    if plain {
        out.push_str(s);
        out.push_str("\"");
        return;
    }
    let mut copied = 0;
    for (at, byte) in s.bytes().enumerate() {
        let short = match byte {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0x00..=0x1f => "",
            _ => continue,
        };
        // `at` is an ASCII byte, hence a character boundary.
        out.push_str(s.get(copied..at).unwrap_or_default());
        if short.is_empty() {
            out.push_str("\\u00");
            out.push_str(hex_digit(byte >> 4));
            out.push_str(hex_digit(byte & 0x0f));
        } else {
            out.push_str(short);
        }
        copied = at + 1;
    }
    out.push_str(s.get(copied..).unwrap_or_default());
    out.push_str("\"");
}

/// Lower-case hex digit of a nibble (`0..=15`).
fn hex_digit(nibble: u8) -> &'static str {
    let at = usize::from(nibble & 0x0f);
    "0123456789abcdef".get(at..=at).unwrap_or("0")
}

//! Splicing: replace a few byte ranges of a frame in one pass, without re-serializing.

use std::ops::Range;

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
    fn write_into(&self, out: &mut String) {
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
    let mut out = String::with_capacity(capacity);
    let mut copied = 0;
    for edit in edits.iter() {
        out.push_str(text.get(copied..edit.range.start).unwrap_or_default());
        edit.replacement.write_into(&mut out);
        copied = edit.range.end;
    }
    out.push_str(text.get(copied..).unwrap_or_default());
    Ok(out)
}

/// Appends `s` to `out` as a JSON string token: quoted, with `"`, `\` and U+0000–U+001F
/// escaped (short forms where JSON has them, `\u00XX` otherwise); everything else,
/// including non-ASCII, is copied unchanged. The result parses back to exactly `s`.
pub fn json_escape_into(out: &mut String, s: &str) {
    out.reserve(s.len() + 2);
    out.push('"');
    // Most strings (URIs) need no escape: one branch-free pass finds out.
    let plain = s.bytes().fold(true, |plain, b| {
        plain & (b >= 0x20 && b != b'"' && b != b'\\')
    });
    if plain {
        out.push_str(s);
        out.push('"');
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
            out.push(hex_digit(byte >> 4));
            out.push(hex_digit(byte & 0x0f));
        } else {
            out.push_str(short);
        }
        copied = at + 1;
    }
    out.push_str(s.get(copied..).unwrap_or_default());
    out.push('"');
}

/// Lower-case hex digit of a nibble (`0..=15`).
fn hex_digit(nibble: u8) -> char {
    char::from_digit(u32::from(nibble), 16).unwrap_or('0')
}

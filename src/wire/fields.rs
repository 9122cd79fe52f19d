//! Typed views of single values read from a frame, each with its byte range.
//!
//! Every range covers the whole JSON token (a string's range includes its quotes), so
//! replacing it with any JSON value keeps the frame valid.

use std::borrow::Cow;
use std::ops::Range;

use super::WireError;

/// Byte range of `part` inside `text`, by pointer difference (both are borrowed from the
/// same frame). [`WireError::Internal`] if `part` is not a sub-slice of `text`.
pub(super) fn span(text: &str, part: &str) -> Result<Range<usize>, WireError> {
    let start = (part.as_ptr() as usize)
        .checked_sub(text.as_ptr() as usize)
        .ok_or(WireError::Internal)?;
    let end = start.checked_add(part.len()).ok_or(WireError::Internal)?;
    match text.get(start..end) {
        Some(found) if std::ptr::eq(found.as_ptr(), part.as_ptr()) => Ok(start..end),
        _ => Err(WireError::Internal),
    }
}

/// The content of a JSON string token: borrowed when it has no escapes, decoded
/// (`Cow::Owned`) otherwise. `None` if `token` is not a string or does not decode
/// (for example a lone surrogate escape).
pub(super) fn decode_string(token: &str) -> Option<Cow<'_, str>> {
    let inner = token.strip_prefix('"')?.strip_suffix('"')?;
    if inner.contains('\\') {
        serde_json::from_str::<String>(token).ok().map(Cow::Owned)
    } else {
        Some(Cow::Borrowed(inner))
    }
}

/// The value of a JSON token made only of ASCII digits, if it fits in a `u64`.
pub(super) fn parse_u64(token: &str) -> Option<u64> {
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    token.parse().ok()
}

/// What a JSON-RPC `id` token is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdKind {
    /// A JSON string (escapes kept as written).
    String,
    /// A JSON number, possibly negative or fractional.
    Number,
    /// `null`; only ever produced for error responses.
    Null,
}

/// A JSON-RPC `id` exactly as written in the frame, so the relay can echo it
/// byte-for-byte (contract §4.5). Invariant: `raw == &frame[range]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawId<'a> {
    /// The token's exact bytes (strings include their quotes).
    pub raw: &'a str,
    /// Where the token lies in the frame.
    pub range: Range<usize>,
    /// Whether it is a string, a number or `null`.
    pub kind: IdKind,
}

impl<'a> RawId<'a> {
    /// Reads an id token; [`WireError::BadId`] unless it is a string, a number or `null`.
    pub(super) fn new(text: &'a str, token: &'a str) -> Result<Self, WireError> {
        let kind = match token.as_bytes().first() {
            Some(b'"') => IdKind::String,
            Some(b'-' | b'0'..=b'9') => IdKind::Number,
            Some(b'n') => IdKind::Null,
            _ => return Err(WireError::BadId),
        };
        Ok(Self {
            raw: token,
            range: span(text, token)?,
            kind,
        })
    }

    /// The id as a non-negative integer (the form of every id the relay originates),
    /// or `None` for strings, `null`, negative, fractional or exponent numbers.
    pub fn as_u64(&self) -> Option<u64> {
        parse_u64(self.raw)
    }
}

/// A string value read from the frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StrField<'a> {
    /// The decoded string (borrowed from the frame unless it contained escapes).
    pub value: Cow<'a, str>,
    /// Range of the whole string token, quotes included.
    pub range: Range<usize>,
}

impl<'a> StrField<'a> {
    /// Reads a string token; [`WireError::BadField`] naming `field` if it is not one.
    pub(super) fn new(
        text: &'a str,
        token: &'a str,
        field: &'static str,
    ) -> Result<Self, WireError> {
        let value = decode_string(token).ok_or(WireError::BadField {
            field,
            expected: "a string",
        })?;
        Ok(Self {
            value,
            range: span(text, token)?,
        })
    }
}

/// A sequence number (`serverSeq`, `fromSeq`) read from the frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeqField {
    /// Its value; the token was a plain integer in `0..=u64::MAX`.
    pub value: u64,
    /// Range of the number token.
    pub range: Range<usize>,
}

impl SeqField {
    /// Reads a sequence number; [`WireError::BadField`] naming `field` unless the token
    /// is an integer in `0..=u64::MAX` without fraction or exponent.
    pub(super) fn new(text: &str, token: &str, field: &'static str) -> Result<Self, WireError> {
        let value = parse_u64(token).ok_or(WireError::BadField {
            field,
            expected: "an integer in 0..=2^64-1",
        })?;
        Ok(Self {
            value,
            range: span(text, token)?,
        })
    }
}

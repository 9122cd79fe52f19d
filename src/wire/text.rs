//! [`Text`]: a frame's text as shared bytes, on its way to a client socket and
//! in a replay buffer, and the WebSocket header a server writes before it
//! ([`frame_header`]), built here for the socket writer and the splice alike.

use bytes::{BufMut, Bytes};
use tokio_tungstenite::tungstenite::Utf8Bytes;

/// Longest header of an unmasked WebSocket frame (RFC 6455 §5.2).
pub const MAX_FRAME_HEADER: usize = 10;

/// Writes the header of a final, unmasked WebSocket frame with `opcode` for
/// `len` payload bytes to `out`, length in its shortest form (RFC 6455 §5.2):
/// the one place the relay frames what it sends. Returns the header's length
/// ([`frame_header_len`]). Each form is one fixed-size write (no copy call),
/// inlined where the splice writes it.
#[inline(always)]
pub fn put_frame_header(out: &mut impl BufMut, opcode: u8, len: usize) -> usize {
    let first = 0x80 | opcode;
    match u16::try_from(len) {
        Ok(short) if short < 126 => {
            out.put_slice(&[first, short as u8]);
            2
        }
        Ok(short) => {
            let [high, low] = short.to_be_bytes();
            out.put_slice(&[first, 126, high, low]);
            4
        }
        Err(_) => {
            out.put_slice(&[first, 127]);
            out.put_u64(len as u64);
            10
        }
    }
}

/// The header [`put_frame_header`] writes, as bytes and how many are used.
pub fn frame_header(opcode: u8, len: usize) -> ([u8; MAX_FRAME_HEADER], usize) {
    let mut head = [0u8; MAX_FRAME_HEADER];
    let used = put_frame_header(&mut &mut head[..], opcode, len);
    (head, used)
}

/// The length of [`frame_header`] for `len` payload bytes.
pub fn frame_header_len(len: usize) -> usize {
    match len {
        0..126 => 2,
        126..=0xffff => 4,
        _ => 10,
    }
}

/// The opcode of a text frame.
pub(super) const TEXT_OPCODE: u8 = 0x1;

/// The text of one frame, shared (cloning is a reference count); a text the
/// splice wrote carries its WebSocket text-frame header in front, in the same
/// bytes ([`Text::framed`]), so the socket writer hands header and payload
/// to TLS as one slice.
///
/// Guarantee: the payload bytes are UTF-8. Every constructor takes text that
/// is already `str` (a `String`, a `&str`, tungstenite's checked `Utf8Bytes`),
/// or bytes that [`splice_into`](super::splice_into) wrote from `str`s alone,
/// so nothing is validated again on the way to the socket. A header, when
/// there is one, is exactly [`frame_header`] of a text frame for the payload's
/// length. Equality and hashing are the payload's.
#[derive(Debug, Clone)]
pub struct Text {
    bytes: Bytes,
    /// Header bytes before the payload (0: none).
    head: u8,
}

impl Text {
    /// Wraps bytes [`splice_into`](super::splice_into) wrote (from `str`s
    /// only), the first `head` of them the text frame's header for the rest.
    pub(super) fn from_spliced(bytes: Bytes, head: usize) -> Self {
        Self {
            bytes,
            head: head as u8,
        }
    }

    /// The payload bytes (UTF-8).
    pub fn as_bytes(&self) -> &[u8] {
        self.bytes.get(usize::from(self.head)..).unwrap_or_default()
    }

    /// The header and the payload, when the text carries its header.
    pub fn framed(&self) -> Option<&[u8]> {
        (self.head > 0).then_some(&self.bytes[..])
    }

    /// Length of the payload in bytes.
    pub fn len(&self) -> usize {
        self.bytes.len() - usize::from(self.head)
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether no other handle shares this text's allocation (tests: what
    /// a replay buffer holding it keeps alive).
    #[cfg(test)]
    pub(crate) fn owns_its_buffer(&self) -> bool {
        self.bytes.is_unique()
    }

    /// The text as `str`, checked (for the few readers off the hot path:
    /// replays, tests); empty if the guarantee were ever broken.
    pub fn to_str(&self) -> &str {
        std::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }
}

impl PartialEq for Text {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Text {}

impl std::hash::Hash for Text {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl Text {
    fn unframed(bytes: Bytes) -> Self {
        Self { bytes, head: 0 }
    }
}

impl From<String> for Text {
    fn from(s: String) -> Self {
        Self::unframed(Bytes::from(s.into_bytes()))
    }
}

impl From<&str> for Text {
    fn from(s: &str) -> Self {
        Self::unframed(Bytes::copy_from_slice(s.as_bytes()))
    }
}

impl From<Utf8Bytes> for Text {
    fn from(s: Utf8Bytes) -> Self {
        Self::unframed(Bytes::from(s))
    }
}

impl std::fmt::Display for Text {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.to_str())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Edit, EditValue, splice_into};
    use bytes::BytesMut;

    #[test]
    fn frames_spliced_into_one_arena_stay_whole_and_independent() {
        let mut arena = BytesMut::with_capacity(16);
        let text = r#"{"channel":"h","serverSeq":1,"x":"é"}"#;
        let mut out = Vec::new();
        for n in [7u64, 12345678901] {
            let mut edits = [
                Edit {
                    range: 11..14,
                    replacement: EditValue::JsonString("client/\"chan\""),
                },
                Edit {
                    range: 27..28,
                    replacement: EditValue::U64(n),
                },
            ];
            out.push(splice_into(text, &mut edits, &mut arena).unwrap());
        }
        drop(arena);
        assert_eq!(
            out[0].to_str(),
            r#"{"channel":"client/\"chan\"","serverSeq":7,"x":"é"}"#
        );
        assert_eq!(
            out[1].to_str(),
            r#"{"channel":"client/\"chan\"","serverSeq":12345678901,"x":"é"}"#
        );
    }

    #[test]
    fn a_refused_edit_writes_nothing_into_the_arena() {
        let mut arena = BytesMut::new();
        let mut edits = [Edit {
            range: 3..99,
            replacement: EditValue::U64(1),
        }];
        assert!(splice_into("abc", &mut edits, &mut arena).is_err());
        assert!(arena.is_empty());
    }
}

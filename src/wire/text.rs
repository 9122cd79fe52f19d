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
///
/// A text spliced with others of its batch ([`Text::in_batch`]) keeps the
/// batch's buffer from its start through its own end, and where in it its
/// header starts: the texts of one batch share one allocation, as their
/// bytes lie one after another, and [`Text::follows`] tells the socket
/// writer when a text's bytes continue the previous one's, so it can hand
/// several frames to TLS as one slice ([`Text::framed_from`]).
#[derive(Debug, Clone)]
pub struct Text {
    /// The text's bytes are `bytes[start..]`; what is before them is the
    /// rest of its batch (nothing, for a text of its own).
    bytes: Bytes,
    start: u32,
    /// Header bytes before the payload (0: none).
    head: u8,
}

impl Text {
    /// The text `piece` of a batch's frozen buffer `whole`, which
    /// [`splice_at`](super::splice_at) or
    /// [`splice_routed_at`](super::splice_routed_at) wrote there (from
    /// `str`s only): it shares `whole`'s allocation.
    pub fn in_batch(whole: &Bytes, piece: super::Piece) -> Self {
        Self::of_prefix(whole.slice(..piece.end.min(whole.len())), piece)
    }

    /// The text `piece` of a batch's frozen buffer `whole`, the batch's last
    /// (`whole` ends where it does): `whole` itself becomes the text's.
    pub fn last_in_batch(whole: Bytes, piece: super::Piece) -> Self {
        Self::of_prefix(whole, piece)
    }

    /// The text `piece` of `prefix`, which ends where `piece` does.
    pub(super) fn of_prefix(prefix: Bytes, piece: super::Piece) -> Self {
        match u32::try_from(piece.start) {
            Ok(start) => Self {
                bytes: prefix,
                start,
                head: piece.head,
            },
            // A batch over 4 GiB (never, with the relay's frame bounds):
            // the text keeps only its own bytes.
            Err(_) => Self {
                bytes: prefix.slice(piece.start.min(prefix.len())..),
                start: 0,
                head: piece.head,
            },
        }
    }

    /// The header and payload bytes.
    fn own(&self) -> &[u8] {
        self.bytes.get(self.start as usize..).unwrap_or_default()
    }

    /// The payload bytes (UTF-8).
    pub fn as_bytes(&self) -> &[u8] {
        self.own().get(usize::from(self.head)..).unwrap_or_default()
    }

    /// The header and the payload, when the text carries its header.
    pub fn framed(&self) -> Option<&[u8]> {
        (self.head > 0).then(|| self.own())
    }

    /// Whether this text carries its header and its bytes start where those
    /// of `previous`, which carries its header too, end, in the same
    /// batch's buffer: then [`framed_from`](Self::framed_from) gives both
    /// frames, and any between them, as one slice.
    pub fn follows(&self, previous: &Text) -> bool {
        self.head > 0
            && previous.head > 0
            && self.start as usize == previous.bytes.len()
            && self.bytes.as_ptr() == previous.bytes.as_ptr()
    }

    /// The bytes from `first`'s header through this text's end, when this
    /// text follows `first` through a chain of [`follows`](Self::follows)
    /// (the caller's to check): the frames from `first` to this one, whole.
    pub fn framed_from(&self, first: &Text) -> &[u8] {
        self.bytes.get(first.start as usize..).unwrap_or_default()
    }

    /// Length of the payload in bytes.
    pub fn len(&self) -> usize {
        self.as_bytes().len()
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether no other handle shares this text's allocation (tests: what
    /// a replay buffer holding it keeps alive).
    #[cfg(test)]
    pub(crate) fn owns_its_buffer(&self) -> bool {
        self.start == 0 && self.bytes.is_unique()
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
        Self {
            bytes,
            start: 0,
            head: 0,
        }
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

    /// Texts spliced one after another into a batch's buffer read as their
    /// own frames, share its allocation, and follow one another exactly
    /// where their bytes continue: not across a text that lost its header
    /// to escapes, not across batches, not out of order; `framed_from`
    /// spans the frames of a chain, headers included.
    #[test]
    fn a_batch_s_texts_follow_one_another_where_their_bytes_do() {
        use super::super::{Decimal, Piece, splice_at, splice_routed_at};
        use super::Text;
        let mut arena = BytesMut::new();
        let text = r#"{"channel":"h","serverSeq":1,"x":"é"}"#;
        let routed = |arena: &mut BytesMut, channel: &str| -> Piece {
            let edit = (11..14, EditValue::JsonString(channel));
            splice_routed_at(text, edit, (27..28, &Decimal::of(7)), arena).unwrap()
        };
        let a = routed(&mut arena, "a");
        let b = routed(&mut arena, "b");
        // 74 bytes foreseen, 144 written (quotes escaped): the length's
        // header grows from two bytes to four, so this text has none.
        let quoted = "\"".repeat(70);
        let long = format!(r#"[{}]"#, "x".repeat(98));
        let mut edits = [Edit {
            range: 1..99,
            replacement: EditValue::JsonString(&quoted),
        }];
        let grown = splice_at(&long, &mut edits, &mut arena).unwrap();
        let c = routed(&mut arena, "c");
        let whole = arena.freeze();
        let [a, b, grown, c] = [a, b, grown, c].map(|p| Text::in_batch(&whole, p));
        let want = |channel: &str| format!(r#"{{"channel":"{channel}","serverSeq":7,"x":"é"}}"#);
        assert_eq!(a.to_str(), want("a"));
        assert_eq!(b.to_str(), want("b"));
        assert_eq!(c.to_str(), want("c"));
        assert!(
            grown.framed().is_none(),
            "escapes took it out of its header's class"
        );
        assert_eq!(grown.len(), 144);
        let escaped = serde_json::to_string(&quoted).unwrap();
        assert_eq!(grown.to_str(), format!("[{escaped}]"));
        assert!(b.follows(&a));
        assert!(!a.follows(&b), "not out of order");
        assert!(
            !grown.follows(&b) && !c.follows(&grown),
            "not across a text without header"
        );
        assert!(!c.follows(&b), "not across a text between them");
        let framed = |t: &Text| t.framed().unwrap().to_vec();
        assert_eq!(b.framed_from(&a), [framed(&a), framed(&b)].concat());
        assert_eq!(a.framed_from(&a), framed(&a));
        let mut other = BytesMut::new();
        let d = routed(&mut other, "a");
        let other = other.freeze();
        let d = Text::in_batch(&other, d);
        assert!(!d.follows(&c) && !d.follows(&a), "not across batches");
        assert_eq!(d, a, "equal payloads are equal texts");
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

//! [`Text`]: a frame's text as shared bytes, on its way to a client socket and
//! in a replay buffer.

use bytes::Bytes;
use tokio_tungstenite::tungstenite::Utf8Bytes;

/// The text of one frame, shared (cloning is a reference count).
///
/// Guarantee: the bytes are UTF-8. Every constructor takes text that is
/// already `str` (a `String`, a `&str`, tungstenite's checked `Utf8Bytes`), or
/// bytes that [`splice_into`](super::splice_into) wrote from `str`s alone, so
/// nothing is validated again on the way to the socket.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Text(Bytes);

impl Text {
    /// Wraps bytes [`splice_into`](super::splice_into) wrote (from `str`s only).
    pub(super) fn from_spliced(bytes: Bytes) -> Self {
        Self(bytes)
    }

    /// The bytes (UTF-8).
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the text is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether no other handle shares this text's allocation (tests: what
    /// a replay buffer holding it keeps alive).
    #[cfg(test)]
    pub(crate) fn owns_its_buffer(&self) -> bool {
        self.0.is_unique()
    }

    /// The text as `str`, checked (for the few readers off the hot path:
    /// replays, tests); empty if the guarantee were ever broken.
    pub fn to_str(&self) -> &str {
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl From<String> for Text {
    fn from(s: String) -> Self {
        Self(Bytes::from(s.into_bytes()))
    }
}

impl From<&str> for Text {
    fn from(s: &str) -> Self {
        Self(Bytes::copy_from_slice(s.as_bytes()))
    }
}

impl From<Utf8Bytes> for Text {
    fn from(s: Utf8Bytes) -> Self {
        Self(Bytes::from(s))
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

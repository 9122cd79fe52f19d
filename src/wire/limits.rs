//! Size and nesting limits, checked by a byte scan before serde_json sees the frame.

use super::WireError;
use super::scan::after_string;

/// Limits [`classify`](super::classify) enforces before parsing a frame.
///
/// The relay builds this from its configuration (contract §3.6); `Default` gives
/// 16 MiB and depth 64.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireLimits {
    /// Largest accepted frame, in bytes of UTF-8 text.
    pub max_frame_bytes: usize,
    /// Deepest accepted nesting of objects and arrays; the top-level object is depth 1,
    /// so `{"a":[1]}` has depth 2. Keep it below 128 if any later stage builds a
    /// `serde_json::Value` from a whole frame (serde_json's own recursion limit).
    pub max_depth: usize,
}

impl Default for WireLimits {
    fn default() -> Self {
        Self {
            max_frame_bytes: 16 * 1024 * 1024,
            max_depth: 64,
        }
    }
}

impl WireLimits {
    /// Refuses `text` if it is larger than `max_frame_bytes` or nests deeper than
    /// `max_depth`. Brackets inside strings (escaped quotes included) are not counted.
    /// Does not validate JSON: unbalanced brackets are left for the parser to reject.
    pub(super) fn check(&self, text: &str) -> Result<(), WireError> {
        if text.len() > self.max_frame_bytes {
            return Err(WireError::TooLarge {
                len: text.len(),
                max: self.max_frame_bytes,
            });
        }
        if nesting_exceeds(text.as_bytes(), self.max_depth) {
            return Err(WireError::TooDeep {
                max: self.max_depth,
            });
        }
        Ok(())
    }
}

/// True if some object or array in `bytes` opens at a depth greater than `max`.
fn nesting_exceeds(bytes: &[u8], max: usize) -> bool {
    // Depth never exceeds the number of opening brackets (strings included), which
    // memchr counts quickly (vectorised search); most frames stop here.
    if memchr::memchr2_iter(b'{', b'[', bytes).count() <= max {
        return false;
    }
    let mut depth = 0usize;
    let mut rest = bytes;
    while let Some(pos) = rest
        .iter()
        .position(|b| matches!(b, b'"' | b'{' | b'[' | b'}' | b']'))
    {
        let (Some(&byte), Some(after)) = (rest.get(pos), rest.get(pos + 1..)) else {
            return false;
        };
        rest = match byte {
            b'"' => after_string(after),
            b'{' | b'[' => {
                depth += 1;
                if depth > max {
                    return true;
                }
                after
            }
            _ => {
                depth = depth.saturating_sub(1);
                after
            }
        };
    }
    false
}

#[cfg(test)]
mod tests {
    use super::nesting_exceeds;

    #[test]
    fn counts_only_structural_brackets() {
        assert!(!nesting_exceeds(br#"{"a":"[[[{{{"}"#, 1));
        assert!(!nesting_exceeds(br#"{"a":"\"[[["}"#, 1));
        assert!(!nesting_exceeds(br#"{"a\\":"x"}"#, 1));
        assert!(nesting_exceeds(br#"{"a\\":[1]}"#, 1));
        assert!(!nesting_exceeds(br#"{"a":[1],"b":{"c":2}}"#, 2));
        assert!(nesting_exceeds(br#"{"a":[{"c":2}]}"#, 2));
        assert!(!nesting_exceeds(br#"{"a":"unterminated [[["#, 1));
        assert!(!nesting_exceeds(b"", 0));
        assert!(nesting_exceeds(b"[", 0));
    }
}

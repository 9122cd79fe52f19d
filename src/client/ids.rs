//! Identifier and timestamp generation for the client (no extra crates).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// 16 lowercase hex digits, different on every call: a randomly keyed
/// SipHash (std `RandomState`) over wall-clock nanoseconds, the process id
/// and a per-process counter.
pub(super) fn random_hex() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u128(nanos);
    hasher.write_u32(std::process::id());
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    format!("{:016x}", hasher.finish())
}

/// A fresh client id of the form `cli-<16 hex>`.
pub(super) fn client_id() -> String {
    format!("cli-{}", random_hex())
}

/// A fresh turn id of the form `turn-<16 hex>`.
pub(super) fn turn_id() -> String {
    format!("turn-{}", random_hex())
}

/// A fresh pending-message id of the form `msg-<16 hex>`.
pub(super) fn message_id() -> String {
    format!("msg-{}", random_hex())
}

/// The current time as ISO 8601 UTC with milliseconds, e.g. `2025-03-10T18:42:03.123Z`.
pub(super) fn now_iso8601() -> String {
    iso8601_millis(jiff::Timestamp::now())
}

/// `ts` as ISO 8601 UTC with exactly three fractional digits.
fn iso8601_millis(ts: jiff::Timestamp) -> String {
    format!("{ts:.3}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_hex16(s: &str) -> bool {
        s.len() == 16
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    }

    #[test]
    fn ids_have_the_documented_shape_and_differ() {
        let a = client_id();
        let b = client_id();
        assert!(a.strip_prefix("cli-").is_some_and(is_hex16), "{a}");
        assert_ne!(a, b);
        let t = turn_id();
        assert!(t.strip_prefix("turn-").is_some_and(is_hex16), "{t}");
        let m = message_id();
        assert!(m.strip_prefix("msg-").is_some_and(is_hex16), "{m}");
    }

    #[test]
    fn timestamp_is_utc_with_milliseconds() {
        let ts = now_iso8601();
        // 2025-03-10T18:42:03.123Z
        assert_eq!(ts.len(), 24, "{ts}");
        assert!(ts.ends_with('Z') && ts.as_bytes()[19] == b'.', "{ts}");
        assert!(ts.parse::<jiff::Timestamp>().is_ok(), "{ts}");
        let epoch = iso8601_millis(jiff::Timestamp::UNIX_EPOCH);
        assert_eq!(epoch, "1970-01-01T00:00:00.000Z");
    }
}

//! Timestamps and the deterministic generator of the seeded random mode.

/// Now as an ISO 8601 UTC timestamp with milliseconds (`2026-11-30T08:00:00.123Z`).
pub fn now_iso() -> String {
    iso(jiff::Timestamp::now())
}

/// `t` as an ISO 8601 UTC timestamp with milliseconds.
pub fn iso(t: jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

/// Milliseconds elapsed since the ISO timestamp `since` (0 if it cannot be read).
pub fn millis_since(since: &str) -> i64 {
    since
        .parse::<jiff::Timestamp>()
        .map(|start| (jiff::Timestamp::now().as_millisecond() - start.as_millisecond()).max(0))
        .unwrap_or(0)
}

/// SplitMix64: a tiny, fast, fully deterministic generator. Not for secrets.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator whose whole output is fixed by `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value in `lo..=hi` (returns `lo` when `hi <= lo`).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next_u64() % (hi - lo + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso_has_millis_and_z() {
        let t: jiff::Timestamp = "2026-01-02T03:04:05.678Z".parse().unwrap();
        assert_eq!(iso(t), "2026-01-02T03:04:05.678Z");
    }

    #[test]
    fn splitmix_is_deterministic_and_bounded() {
        let a: Vec<u64> = (0..5)
            .map({
                let mut g = SplitMix64::new(7);
                move |_| g.range(3, 9)
            })
            .collect();
        let b: Vec<u64> = (0..5)
            .map({
                let mut g = SplitMix64::new(7);
                move |_| g.range(3, 9)
            })
            .collect();
        assert_eq!(a, b);
        assert!(a.iter().all(|v| (3..=9).contains(v)));
    }
}

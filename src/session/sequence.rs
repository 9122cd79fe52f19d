//! The per-client sequence origin S0 (contract §5.1).
//!
//! Each client session numbers its envelopes from S0 = max(now in
//! microseconds since the epoch, last S0 issued + 1). Because S0 grows with
//! the clock, a watermark a client kept from an earlier incarnation (relay
//! restart, expired record, another replica) is always below the new S0 —
//! the official SDK runtimes never lower their watermark.

use std::sync::atomic::{AtomicU64, Ordering};

/// Largest number AHP clients written in JavaScript represent exactly.
pub const MAX_SAFE: u64 = (1 << 53) - 1;

/// Hands out S0 values: strictly increasing, at least the current time in µs.
#[derive(Debug, Default)]
pub struct SequenceOrigins {
    last: AtomicU64,
}

impl SequenceOrigins {
    /// A fresh allocator.
    pub fn new() -> Self {
        Self::default()
    }

    /// The next S0: > every S0 issued before, ≥ now in µs, ≤ 2^53−1.
    pub fn next(&self) -> u64 {
        self.next_above(0)
    }

    /// [`Self::next`], and also > `floor`: an adopted session (§12.2)
    /// numbers above the watermark its client brings, whatever the clock of
    /// the replica that numbered it before.
    pub fn next_above(&self, floor: u64) -> u64 {
        let now = jiff::Timestamp::now().as_microsecond().max(0) as u64;
        let floor = floor.saturating_add(1);
        let mut prev = self.last.load(Ordering::Relaxed);
        loop {
            let s0 = now.max(prev + 1).max(floor).min(MAX_SAFE);
            match self
                .last
                .compare_exchange_weak(prev, s0, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return s0,
                Err(seen) => prev = seen,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strictly_increasing_and_clock_based() {
        let o = SequenceOrigins::new();
        let a = o.next();
        let b = o.next();
        assert!(b > a);
        assert!(a > 1_700_000_000_000_000, "µs since the epoch");
        assert!(b <= MAX_SAFE);
    }

    #[test]
    fn above_a_watermark_from_a_faster_clock() {
        let o = SequenceOrigins::new();
        let ahead = o.next() + 10_000_000_000;
        let s0 = o.next_above(ahead);
        assert!(s0 > ahead);
        assert!(o.next() > s0, "still strictly increasing after");
    }
}

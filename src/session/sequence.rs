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
        let now = jiff::Timestamp::now().as_microsecond().max(0) as u64;
        let mut prev = self.last.load(Ordering::Relaxed);
        loop {
            let s0 = now.max(prev + 1).min(MAX_SAFE);
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
}

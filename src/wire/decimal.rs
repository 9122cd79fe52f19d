//! [`Decimal`]: a client's sequence number with its decimal digits, for the
//! splice to write.
//!
//! A session numbers its envelopes one after another from a time-based origin
//! (contract §5.1), so its numbers have sixteen digits and each is the last
//! plus one. Formatting each anew costs ~90 instructions per envelope; the
//! next number's digits are the last's with the final digit raised (and a
//! carry now and then): a few. The value and its digits are kept together, so
//! they cannot disagree: any other step is formatted in full.

/// Most decimal digits of a `u64`.
const MAX_DIGITS: usize = 20;

/// A `u64` and its decimal digits (ASCII, no leading zeros), kept together.
#[derive(Debug, Clone)]
pub struct Decimal {
    value: u64,
    /// The digits, right-aligned: `digits[start..]`.
    digits: [u8; MAX_DIGITS],
    start: u8,
}

impl Default for Decimal {
    fn default() -> Self {
        Self::of(0)
    }
}

impl Decimal {
    /// `n` in decimal.
    pub fn of(n: u64) -> Self {
        let mut decimal = Self {
            value: n,
            digits: [b'0'; MAX_DIGITS],
            start: (MAX_DIGITS - 1) as u8,
        };
        decimal.format(n);
        decimal
    }

    /// Becomes `n`: the digits raised by one in place when `n` follows the
    /// value, else formatted in full.
    #[inline]
    pub fn set(&mut self, n: u64) -> &Self {
        if self.value.checked_add(1) != Some(n) || !self.increment() {
            self.format(n);
        }
        self.value = n;
        self
    }

    /// The value.
    pub fn value(&self) -> u64 {
        self.value
    }

    /// The digits (ASCII), for the splice to write.
    pub(super) fn as_bytes(&self) -> &[u8] {
        self.digits
            .get(usize::from(self.start)..)
            .unwrap_or_default()
    }

    /// Number of digits.
    pub fn len(&self) -> usize {
        MAX_DIGITS - usize::from(self.start)
    }

    /// Always false: a number has at least one digit.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Raises the digits by one: the last digit that is not a 9 goes up and
    /// the 9s after it become 0s; all 9s grow a leading 1. False (nothing
    /// changed) only past `u64::MAX`'s twenty digits, which no sequence
    /// reaches.
    #[inline]
    fn increment(&mut self) -> bool {
        let start = usize::from(self.start);
        let Some(digits) = self.digits.get_mut(start..) else {
            return false;
        };
        for digit in digits.iter_mut().rev() {
            if *digit != b'9' {
                *digit += 1;
                return true;
            }
            *digit = b'0';
        }
        let Some((lead, digit)) = start
            .checked_sub(1)
            .and_then(|lead| Some((lead, self.digits.get_mut(lead)?)))
        else {
            return false;
        };
        *digit = b'1';
        self.start = lead as u8;
        true
    }

    /// Writes `n`'s digits in full.
    #[inline(never)]
    fn format(&mut self, n: u64) {
        let mut buffer = itoa::Buffer::new();
        let text = buffer.format(n).as_bytes();
        let start = MAX_DIGITS - text.len();
        if let Some(slot) = self.digits.get_mut(start..) {
            slot.copy_from_slice(text);
            self.start = start as u8;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(d: &Decimal) -> &str {
        std::str::from_utf8(d.as_bytes()).unwrap()
    }

    /// Runs of consecutive numbers across every carry (9 → 10, 99 → 100, up
    /// to 19 nines and `u64::MAX`), jumps forward and back, and a repeated
    /// number: the digits are always `n`'s as `itoa` writes them.
    #[test]
    fn digits_are_always_those_of_the_value() {
        let mut d = Decimal::default();
        assert_eq!(text(&d), "0");
        let mut starts: Vec<u64> = (1..=19).map(|k| 10u64.pow(k) - 3).collect();
        starts.extend([0, 1_733_300_000_000_000, u64::MAX - 5, 41]);
        for start in starts {
            for n in start..=start.saturating_add(6) {
                assert_eq!(text(d.set(n)), n.to_string());
                assert_eq!(d.value(), n);
                assert_eq!(d.len(), n.to_string().len());
            }
        }
        for n in [5u64, 5, 4, 1_000, 999, 1_000, 1_001, u64::MAX, 0, 1] {
            assert_eq!(text(d.set(n)), n.to_string());
        }
        assert_eq!(text(&Decimal::of(12_345)), "12345");
    }
}

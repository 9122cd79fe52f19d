//! The per-client replay buffer (contract §5.4): numbered envelopes, bounded
//! by count and bytes, oldest evicted first.

use std::collections::VecDeque;

use tokio_tungstenite::tungstenite::Utf8Bytes;

/// Numbered client frames kept for `reconnect` replay.
#[derive(Debug)]
pub struct ReplayBuffer {
    frames: VecDeque<(u64, Utf8Bytes)>,
    bytes: usize,
    max_frames: usize,
    max_bytes: usize,
    evicted_through: u64,
}

impl ReplayBuffer {
    /// An empty buffer with the given bounds.
    pub fn new(max_frames: usize, max_bytes: usize) -> Self {
        Self {
            frames: VecDeque::new(),
            bytes: 0,
            max_frames,
            max_bytes,
            evicted_through: 0,
        }
    }

    /// Appends the frame numbered `seq` (numbers must increase), evicting
    /// the oldest frames beyond the bounds. The frame is shared, not copied.
    /// Returns how many frames and bytes were evicted.
    pub fn push(&mut self, seq: u64, frame: Utf8Bytes) -> (usize, usize) {
        self.bytes += frame.len();
        self.frames.push_back((seq, frame));
        let (mut frames, mut bytes) = (0, 0);
        while self.frames.len() > self.max_frames || self.bytes > self.max_bytes {
            match self.frames.pop_front() {
                Some((s, f)) => {
                    self.bytes -= f.len();
                    self.evicted_through = s;
                    frames += 1;
                    bytes += f.len();
                }
                None => break,
            }
        }
        (frames, bytes)
    }

    /// Highest number evicted so far (0 if none).
    pub fn evicted_through(&self) -> u64 {
        self.evicted_through
    }

    /// Frames held and their total size in bytes.
    pub fn usage(&self) -> (usize, usize) {
        (self.frames.len(), self.bytes)
    }

    /// Frames numbered above `after`, oldest first.
    pub fn since(&self, after: u64) -> impl Iterator<Item = &(u64, Utf8Bytes)> {
        self.frames.iter().filter(move |(s, _)| *s > after)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_by_count_and_bytes() {
        let mut b = ReplayBuffer::new(3, 1000);
        for i in 1..=5 {
            b.push(i, Utf8Bytes::from(format!("f{i}")));
        }
        assert_eq!(b.usage().0, 3);
        assert_eq!(b.evicted_through(), 2);
        assert_eq!(b.since(3).map(|(s, _)| *s).collect::<Vec<_>>(), [4, 5]);
        let mut b = ReplayBuffer::new(100, 10);
        b.push(1, Utf8Bytes::from("123456".to_string()));
        b.push(2, Utf8Bytes::from("123456".to_string()));
        assert_eq!(b.usage(), (1, 6));
    }
}

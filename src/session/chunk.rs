//! The buffer a session's envelopes are spliced into: runs of envelopes
//! take their bytes one after another from a shared chunk, so a streamed
//! envelope costs no allocation of its own (contract §5.4's buffer holds
//! slices of a few chunks, not one allocation per envelope).
//!
//! Guarantees: a chunk is freed when the last envelope spliced into it is
//! dropped (the replay buffer evicts oldest first, so chunks go in order);
//! what a session pins beyond its envelopes' bytes is the unused rest of
//! its current chunk and the evicted part of its oldest one, each at most
//! [`Chunk::limit`] bytes. Chunks start small and double up to that limit,
//! so a session that receives a few envelopes keeps a small chunk and an
//! idle one (no envelope yet) keeps none.

use bytes::BytesMut;

/// The first chunk's size.
const FIRST: usize = 1024;

/// The largest chunk: 16 KiB, about forty 400-byte deltas per allocation.
/// A run expecting more than half of it gets an allocation of its own
/// ([`Chunk::suits`]), so a long batch never strands a chunk's rest.
pub(super) const LARGEST: usize = 16 * 1024;

/// A session's current chunk: its unused capacity, and the size of the
/// next one.
#[derive(Debug)]
pub(super) struct Chunk {
    spare: BytesMut,
    next: usize,
}

impl Chunk {
    /// No chunk yet; the first one is [`FIRST`] bytes.
    pub(super) fn new() -> Self {
        Self {
            spare: BytesMut::new(),
            next: FIRST,
        }
    }

    /// The largest chunk a session whose replay buffer holds at most
    /// `replay_bytes` uses: [`LARGEST`], or an eighth of a smaller buffer's
    /// bound (never below [`FIRST`]), so what a chunk pins stays small
    /// against what the buffer may hold.
    pub(super) fn limit(replay_bytes: usize) -> usize {
        LARGEST.min(replay_bytes / 8).max(FIRST)
    }

    /// Whether a run expecting `bytes` is spliced into the session's chunk
    /// (at most half the largest chunk), not into an allocation of its own.
    pub(super) fn suits(bytes: usize, limit: usize) -> bool {
        bytes <= limit / 2
    }

    /// The chunk's unused capacity, with room for at least `bytes`: a new
    /// chunk when the current one has less left (the old one lives on in
    /// the envelopes that hold slices of it). The caller splits what it
    /// writes off the front and gives the rest back ([`Chunk::give_back`]).
    pub(super) fn take(&mut self, bytes: usize, limit: usize) -> BytesMut {
        if self.spare.capacity() - self.spare.len() < bytes {
            let size = self.next.min(limit).max(bytes);
            self.next = self.next.saturating_mul(2).min(limit);
            self.spare = BytesMut::with_capacity(size);
        }
        std::mem::take(&mut self.spare)
    }

    /// Returns what is left of the chunk [`Chunk::take`] gave, once the
    /// run's bytes were split off it.
    pub(super) fn give_back(&mut self, rest: BytesMut) {
        self.spare = rest;
    }

    /// Unused bytes of the current chunk.
    pub(super) fn spare(&self) -> usize {
        self.spare.capacity() - self.spare.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_double_up_to_the_limit_and_serve_runs_from_their_rest() {
        let limit = Chunk::limit(4 * 1024 * 1024);
        assert_eq!(limit, LARGEST);
        let mut chunk = Chunk::new();
        assert_eq!(chunk.spare(), 0, "no chunk before the first envelope");
        let mut sizes = Vec::new();
        let mut kept: Vec<bytes::Bytes> = Vec::new();
        for i in 0..200u8 {
            let fresh = chunk.spare() < 400;
            let mut arena = chunk.take(400, limit);
            if fresh {
                sizes.push(arena.capacity());
            }
            arena.extend_from_slice(&[i; 400]);
            kept.push(arena.split().freeze());
            chunk.give_back(arena);
        }
        // 2 + 5 + 10 + 20 envelopes fill the growing chunks, 40 each after.
        assert_eq!(
            sizes,
            [1024, 2048, 4096, 8192, 16384, 16384, 16384, 16384, 16384]
        );
        // Within a chunk, each envelope's bytes follow the previous one's:
        // the only breaks are the eight moves to a new chunk.
        let breaks = kept
            .windows(2)
            .filter(|w| w[0].as_ptr() as usize + w[0].len() != w[1].as_ptr() as usize)
            .count();
        assert_eq!(breaks, sizes.len() - 1);
        assert!(
            kept.iter()
                .enumerate()
                .all(|(i, k)| k.len() == 400 && k.iter().all(|&c| c == i as u8))
        );
    }

    #[test]
    fn a_small_replay_bound_keeps_chunks_small_and_long_runs_apart() {
        assert_eq!(Chunk::limit(32 * 1024), 4 * 1024);
        assert_eq!(Chunk::limit(1024), FIRST);
        assert!(Chunk::suits(2048, 4096));
        assert!(!Chunk::suits(2049, 4096));
        let mut chunk = Chunk::new();
        // A run larger than a chunk still gets the room it needs.
        let arena = chunk.take(10_000, 4096);
        assert!(arena.capacity() >= 10_000);
    }
}

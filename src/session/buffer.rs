//! The per-client replay buffer (contract §5.4): numbered envelopes, bounded
//! by count and bytes, oldest evicted first — and the relay-wide account of
//! the bytes all buffers hold ([`ReplayMemory`]), which drives the global
//! memory-pressure policy of §5.4 (see `Relay::relieve_memory_pressure`).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::wire::{MAX_FRAME_HEADER, Text};
use tokio::sync::mpsc;

/// The bytes held by every replay buffer of a relay, against the budget
/// `limits.replay_memory_bytes` (contract §5.4).
///
/// The hot path is one atomic add per buffered envelope (net of the
/// envelopes it evicts); only a push that takes the total *across* the
/// budget wakes the relay's pressure task, which then scans the detached
/// sessions. While upgrades are refused (every detached buffer already
/// dropped and still over budget), they stay refused until the total falls
/// to the low watermark (hysteresis).
#[derive(Debug)]
pub struct ReplayMemory {
    used: AtomicUsize,
    budget: usize,
    low: usize,
    refusing: AtomicBool,
    wake: mpsc::Sender<()>,
}

impl ReplayMemory {
    /// An empty account with `budget` bytes and a low watermark of `low`
    /// bytes (clamped to the budget), and the receiver woken when the budget
    /// is crossed (wake-ups coalesce: at most one is pending).
    pub fn new(budget: usize, low: usize) -> (Arc<Self>, mpsc::Receiver<()>) {
        let (wake, rx) = mpsc::channel(1);
        let memory = Self {
            used: AtomicUsize::new(0),
            budget,
            low: low.min(budget),
            refusing: AtomicBool::new(false),
            wake,
        };
        (Arc::new(memory), rx)
    }

    /// Bytes held by all replay buffers now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// The budget in bytes.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// The low watermark: once upgrades are refused, they are accepted again
    /// only when the total is at or below it.
    pub fn low_watermark(&self) -> usize {
        self.low
    }

    /// What a pressure scan must bring the total down to: the budget, or
    /// the low watermark while upgrades are refused.
    pub fn target(&self) -> usize {
        if self.refusing() {
            self.low
        } else {
            self.budget
        }
    }

    /// Whether the total is above [`ReplayMemory::target`].
    pub fn over_target(&self) -> bool {
        self.used() > self.target()
    }

    /// Whether new WebSocket upgrades must be refused now. A refusal ends
    /// once the total is at or below the low watermark.
    pub fn refusing(&self) -> bool {
        if !self.refusing.load(Ordering::Relaxed) {
            return false;
        }
        if self.used() <= self.low {
            self.refusing.store(false, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Starts or ends refusing upgrades (decided by the pressure scan).
    pub fn set_refusing(&self, on: bool) {
        self.refusing.store(on, Ordering::Relaxed);
    }

    /// Asks the pressure task for a scan (a no-op if one is already pending).
    pub fn wake(&self) {
        let _ = self.wake.try_send(());
    }

    fn add(&self, n: usize) {
        if n == 0 {
            return;
        }
        let before = self.used.fetch_add(n, Ordering::Relaxed);
        if before <= self.budget && before.saturating_add(n) > self.budget {
            self.wake();
        }
    }

    fn sub(&self, n: usize) {
        if n == 0 {
            return;
        }
        let before = self.used.fetch_sub(n, Ordering::Relaxed);
        if before.saturating_sub(n) <= self.low && self.refusing.load(Ordering::Relaxed) {
            self.refusing.store(false, Ordering::Relaxed);
        }
    }
}

/// What one buffered envelope costs in memory, as the buffer's byte bound
/// and the relay-wide account count it: its bytes, the allocator's rounding
/// up to a size class (mimalloc's small classes are 1/8 apart on average),
/// the WebSocket frame header a spliced envelope carries in front of its
/// bytes (`Text::framed`, at most `MAX_FRAME_HEADER`), the reference-counted
/// header its body gets once the buffer and the writer share it, and its slot
/// in the buffer. An envelope spliced into its session's chunk
/// (`session::chunk`) has no rounding or header of its own; the same
/// allowance then covers its share of the chunk's unused rest. Counting only the bytes let the process hold ~1.3× what
/// the budget said (issue 11, BENCHMARKS.md).
pub fn envelope_cost(len: usize) -> usize {
    const SHARED_HEADER: usize = 32;
    len + len / 8 + MAX_FRAME_HEADER + SHARED_HEADER + std::mem::size_of::<(u64, Text)>()
}

/// Numbered client frames kept for `reconnect` replay.
#[derive(Debug)]
pub struct ReplayBuffer {
    frames: VecDeque<(u64, Text)>,
    bytes: usize,
    max_frames: usize,
    max_bytes: usize,
    evicted_through: u64,
    memory: Option<Arc<ReplayMemory>>,
    /// Bytes pushed (net of evictions) not yet added to `memory`.
    unsettled: isize,
}

impl ReplayBuffer {
    /// The bound on the bytes held ([`envelope_cost`] summed).
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// An empty buffer with the given bounds.
    pub fn new(max_frames: usize, max_bytes: usize) -> Self {
        Self {
            frames: VecDeque::new(),
            bytes: 0,
            max_frames,
            max_bytes,
            evicted_through: 0,
            memory: None,
            unsettled: 0,
        }
    }

    /// Accounts this buffer's bytes (now and from now on) in `memory`.
    pub fn set_memory(&mut self, memory: Arc<ReplayMemory>) {
        self.settle();
        if let Some(old) = self.memory.take() {
            old.sub(self.bytes);
        }
        memory.add(self.bytes);
        self.memory = Some(memory);
    }

    /// Appends the frame numbered `seq` (numbers must increase), evicting
    /// the oldest frames beyond the bounds. The frame is shared, not copied.
    /// Returns how many frames were evicted and their cost
    /// ([`envelope_cost`]).
    pub fn push(&mut self, seq: u64, frame: Text) -> (usize, usize) {
        let evicted = self.push_unsettled(seq, frame);
        self.settle();
        evicted
    }

    /// [`ReplayBuffer::push`] whose bytes reach the relay-wide account only
    /// at the next [`ReplayBuffer::settle`]: a batch of envelopes costs one
    /// atomic operation on the account, not one each.
    pub fn push_unsettled(&mut self, seq: u64, frame: Text) -> (usize, usize) {
        let added = envelope_cost(frame.len());
        let (mut frames, mut bytes) = (0, 0);
        // A full buffer makes room before the push, not after: it never
        // holds more than `max_frames`, so its slots stay at what that many
        // need (one push past a full ring doubled them, half never counted).
        while self.frames.len() >= self.max_frames.max(1) {
            let Some(cost) = self.evict_oldest() else {
                break;
            };
            frames += 1;
            bytes += cost;
        }
        self.bytes += added;
        self.frames.push_back((seq, frame));
        while self.frames.len() > self.max_frames || self.bytes > self.max_bytes {
            let Some(cost) = self.evict_oldest() else {
                break;
            };
            frames += 1;
            bytes += cost;
        }
        self.unsettled += added as isize - bytes as isize;
        (frames, bytes)
    }

    /// Evicts the oldest frame; its cost, or `None` if there is none.
    fn evict_oldest(&mut self) -> Option<usize> {
        let (seq, frame) = self.frames.pop_front()?;
        let cost = envelope_cost(frame.len());
        self.bytes -= cost;
        self.evicted_through = seq;
        Some(cost)
    }

    /// Adds what was pushed since the last settlement to the relay-wide
    /// account (one atomic operation).
    pub fn settle(&mut self) {
        let delta = std::mem::take(&mut self.unsettled);
        if let Some(m) = &self.memory {
            if delta >= 0 {
                m.add(delta.unsigned_abs());
            } else {
                m.sub(delta.unsigned_abs());
            }
        }
    }

    /// Drops every frame under memory pressure (contract §5.4) and records
    /// that everything numbered up to `through` (the last number issued) is
    /// lost, so no `replay` can be built across the gap. Returns how many
    /// frames and bytes were dropped.
    pub fn drop_all(&mut self, through: u64) -> (usize, usize) {
        self.settle();
        let dropped = (self.frames.len(), self.bytes);
        if let Some((last, _)) = self.frames.back() {
            self.evicted_through = self.evicted_through.max(*last);
        }
        self.evicted_through = self.evicted_through.max(through);
        self.frames = VecDeque::new();
        if let Some(m) = &self.memory {
            m.sub(self.bytes);
        }
        self.bytes = 0;
        dropped
    }

    /// Highest number evicted so far (0 if none).
    pub fn evicted_through(&self) -> u64 {
        self.evicted_through
    }

    /// Frames held and their total cost in bytes ([`envelope_cost`]).
    pub fn usage(&self) -> (usize, usize) {
        (self.frames.len(), self.bytes)
    }

    /// The newest `n` frames (fewer if it holds fewer), oldest first.
    pub fn newest(&self, n: usize) -> std::collections::vec_deque::Iter<'_, (u64, Text)> {
        self.frames.range(self.frames.len().saturating_sub(n)..)
    }

    /// Whether `frames` frames costing `bytes` in all fit the bounds: pushed
    /// last, none of them is evicted.
    pub fn holds(&self, frames: usize, bytes: usize) -> bool {
        frames <= self.max_frames && bytes <= self.max_bytes
    }

    /// Frames numbered above `after`, oldest first.
    pub fn since(&self, after: u64) -> impl Iterator<Item = &(u64, Text)> {
        self.frames.iter().filter(move |(s, _)| *s > after)
    }
}

impl Drop for ReplayBuffer {
    fn drop(&mut self) {
        self.settle();
        if let Some(m) = &self.memory {
            m.sub(self.bytes);
        }
    }
}

// What the relay's memory-pressure policy does to a session; it lives here
// because it is about the buffer, and `session/` children see the session's
// private state.
impl super::SessionCore {
    /// Accounts this session's replay buffer in the relay-wide `memory`.
    pub(crate) fn account_replay_memory(&mut self, memory: Arc<ReplayMemory>) {
        self.seq.buffer.set_memory(memory);
    }

    /// Drops the whole replay buffer of a detached session under global
    /// memory pressure (contract §5.4). The session records that everything
    /// numbered so far is lost, and every channel loses its baseline, so its
    /// next `reconnect` gets `snapshot` — never a `replay` with a hole. Its
    /// links close now, as when a detached session's buffer evicts (§5.7):
    /// the client needs snapshots anyway, and open links would refill the
    /// buffer. Returns how many frames and bytes were freed.
    pub(crate) fn drop_replay_buffer(&mut self) -> (usize, usize) {
        let freed = self.seq.buffer.drop_all(self.seq.last);
        // The rest of the session's splice chunk goes too: envelopes come
        // again only after a new attach, into a new chunk.
        if let Some(issuing) = self.seq.issuing.as_mut() {
            issuing.chunk = super::chunk::Chunk::new();
        }
        self.lose_links();
        self.channels.baselined.clear();
        freed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_by_count_and_bytes() {
        let mut b = ReplayBuffer::new(3, 1000);
        for i in 1..=5 {
            b.push(i, Text::from(format!("f{i}")));
        }
        assert_eq!(b.usage().0, 3);
        assert_eq!(b.evicted_through(), 2);
        assert_eq!(b.since(3).map(|(s, _)| *s).collect::<Vec<_>>(), [4, 5]);
        let six = envelope_cost(6);
        let mut b = ReplayBuffer::new(100, six + 10);
        b.push(1, Text::from("123456".to_string()));
        b.push(2, Text::from("123456".to_string()));
        assert_eq!(b.usage(), (1, six), "two frames cost more than the bound");
    }

    #[test]
    fn a_full_buffer_keeps_the_slots_its_bound_needs() {
        // The cost model counts one slot per frame held: a ring that grew
        // past its bound would hold memory nothing accounts for.
        let mut b = ReplayBuffer::new(4096, usize::MAX);
        for i in 1..=10_000 {
            b.push(i, Text::from("f".to_string()));
        }
        assert_eq!(b.usage().0, 4096);
        assert_eq!(b.evicted_through(), 10_000 - 4096);
        assert!(
            b.frames.capacity() <= 4096,
            "slots {} for a bound of 4096",
            b.frames.capacity()
        );
        let mut one = ReplayBuffer::new(0, usize::MAX);
        assert_eq!(
            one.push(1, Text::from("f".to_string())).0,
            1,
            "a zero bound keeps nothing"
        );
        assert_eq!(one.usage(), (0, 0));
    }

    #[test]
    fn memory_follows_pushes_evictions_drops_and_drop() {
        let c = envelope_cost;
        let (m, _rx) = ReplayMemory::new(1000, 500);
        let mut a = ReplayBuffer::new(2, 1000);
        a.push(1, Text::from("x".repeat(10)));
        a.set_memory(m.clone());
        assert_eq!(m.used(), c(10), "bytes held before joining are counted");
        a.push(2, Text::from("x".repeat(20)));
        a.push(3, Text::from("x".repeat(30)));
        assert_eq!(
            m.used(),
            c(20) + c(30),
            "the evicted frame left the account"
        );
        let mut b = ReplayBuffer::new(10, 1000);
        b.set_memory(m.clone());
        b.push(1, Text::from("y".repeat(7)));
        assert_eq!(m.used(), c(20) + c(30) + c(7));
        assert_eq!(a.drop_all(9), (2, c(20) + c(30)));
        assert_eq!(m.used(), c(7));
        assert_eq!(a.usage(), (0, 0));
        drop(b);
        assert_eq!(m.used(), 0, "a dropped buffer gives its bytes back");
    }

    #[test]
    fn a_batch_reaches_the_account_when_settled_and_never_leaks_it() {
        let c = envelope_cost;
        let (m, _rx) = ReplayMemory::new(1000, 500);
        let mut a = ReplayBuffer::new(2, 1000);
        a.set_memory(m.clone());
        a.push_unsettled(1, Text::from("x".repeat(10)));
        a.push_unsettled(2, Text::from("x".repeat(20)));
        a.push_unsettled(3, Text::from("x".repeat(30)));
        assert_eq!(
            m.used(),
            0,
            "nothing reaches the account before the settlement"
        );
        a.settle();
        assert_eq!(
            m.used(),
            c(20) + c(30),
            "pushes net of the eviction, at once"
        );
        a.push_unsettled(4, Text::from("x".repeat(40)));
        drop(a);
        assert_eq!(m.used(), 0, "a dropped buffer settles what it had not");
        let mut b = ReplayBuffer::new(10, 1000);
        b.set_memory(m.clone());
        b.push_unsettled(1, Text::from("y".repeat(7)));
        assert_eq!(b.drop_all(1), (1, c(7)));
        assert_eq!(m.used(), 0, "dropping everything settles first");
    }

    #[test]
    fn drop_all_records_the_gap_so_replay_is_impossible() {
        let mut b = ReplayBuffer::new(10, 1000);
        for i in 101..=103 {
            b.push(i, Text::from(format!("f{i}")));
        }
        assert_eq!(b.evicted_through(), 0, "nothing lost yet");
        b.drop_all(105);
        assert_eq!(b.evicted_through(), 105, "everything issued is lost");
        assert_eq!(b.since(100).count(), 0);
        b.push(106, Text::from("f106".to_string()));
        assert_eq!(b.evicted_through(), 105);
        assert_eq!(b.since(105).map(|(s, _)| *s).collect::<Vec<_>>(), [106]);
    }

    #[test]
    fn only_crossing_the_budget_wakes_the_pressure_task() {
        let (m, mut rx) = ReplayMemory::new(envelope_cost(60) * 3 / 2, 50);
        let mut b = ReplayBuffer::new(1000, 10_000);
        b.set_memory(m.clone());
        b.push(1, Text::from("x".repeat(60)));
        assert!(rx.try_recv().is_err(), "under budget: no wake-up");
        b.push(2, Text::from("x".repeat(60)));
        assert!(rx.try_recv().is_ok(), "crossing the budget wakes");
        b.push(3, Text::from("x".repeat(60)));
        assert!(rx.try_recv().is_err(), "already above: no scan per frame");
        b.drop_all(3);
        b.push(4, Text::from("x".repeat(200)));
        assert!(rx.try_recv().is_ok(), "crossing again wakes again");
    }

    #[test]
    fn refusal_has_hysteresis() {
        let c = envelope_cost;
        let (m, _rx) = ReplayMemory::new(c(45) + c(70) - 1, c(45) - 1);
        let mut a = ReplayBuffer::new(1000, 10_000);
        let mut b = ReplayBuffer::new(1000, 10_000);
        a.set_memory(m.clone());
        b.set_memory(m.clone());
        a.push(1, Text::from("x".repeat(45)));
        b.push(1, Text::from("x".repeat(70)));
        assert!(!m.refusing(), "refusing is decided by the scan");
        assert_eq!(m.target(), c(45) + c(70) - 1);
        m.set_refusing(true);
        assert_eq!(
            m.target(),
            c(45) - 1,
            "while refusing, scans aim at the low mark"
        );
        b.drop_all(1);
        assert_eq!(m.used(), c(45));
        assert!(m.refusing(), "under budget but above the low watermark");
        a.push(2, Text::from("x".repeat(10)));
        assert!(m.refusing());
        drop(a);
        assert!(!m.refusing(), "at the low watermark upgrades resume");
        assert_eq!(m.target(), c(45) + c(70) - 1);
        m.set_refusing(true);
        assert!(!m.refusing(), "a stale refusal below the low mark ends");
    }
}

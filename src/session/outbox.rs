//! The bounded queue of frames from the relay to one client socket, bounded
//! by frame count and by bytes (contract §5.9).
//!
//! The bounds are where the client's own links stop reading from their
//! hosts: a link asks [`Outbox::allowance`] before it takes the next frames
//! from its host and otherwise waits on [`Outbox::room`], so a client that
//! reads slowly slows its hosts through TCP, as a direct connection would.
//! Frames that cannot wait (watch-link fan-out, answers to the client's own
//! requests) are queued up to twice the bounds; beyond that
//! [`Outbox::try_send`] refuses and the session closes the client with 4008.
//!
//! The queue is a `VecDeque` under a mutex that is never held across an
//! await: senders push under it, the socket's writer takes everything queued
//! in one swap ([`OutboxRx::recv_batch`]). The writer is woken only when it
//! is parked waiting for frames, so a batch of frames queued while it writes
//! costs no wake-up at all. A link's batch of envelopes
//! ([`Outbox::begin_batch`] … [`Outbox::end_batch`]) wakes nobody while it
//! is queued; at its end, if the writer is parked, the link writes the batch
//! to the socket itself ([`DirectWrite`]) — no task hop, no wake-up — and
//! wakes the writer only if the socket did not take it all.

use std::collections::{VecDeque, vec_deque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::wire::Text;
use futures_util::future::BoxFuture;
use tokio::sync::Notify;

/// Bytes the writer takes from the queue at a time (one write, then the
/// next): what it holds outside the queue's bounds.
const WRITER_TAKES_BYTES: usize = 64 * 1024;

/// Why a frame was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Over twice the frame or byte bound: the client is too slow.
    Full,
    /// The socket's writer is gone.
    Closed,
}

/// Frames handed to [`DirectWrite::write_now`].
#[derive(Debug)]
pub enum Frames<'a> {
    /// Frames taken from the queue (emptied when written).
    Queued(&'a mut VecDeque<Text>),
    /// A batch's envelopes, still held only by the replay buffer: read in
    /// place, shared with nobody, so writing them costs no reference count.
    Kept(vec_deque::Iter<'a, (u64, Text)>),
}

/// The socket's writer as a link may use it directly (implemented by the
/// edge's writer).
pub trait DirectWrite: Send + Sync {
    /// Frames and writes `frames` (emptying a queue) without waiting, if the
    /// writer is free and has nothing pending: `None` when it is busy, has
    /// bytes the socket did not take yet, or is closed (`frames` untouched);
    /// `Some(true)` when everything reached the socket; `Some(false)` when
    /// the rest is encoded and waits for the writer task to drain it.
    fn write_now(&self, frames: Frames<'_>) -> Option<bool>;
}

/// The queue itself, under [`Shared::state`].
#[derive(Default)]
struct State {
    frames: VecDeque<Text>,
    bytes: usize,
    /// The writer found the queue empty and waits on [`Shared::wake`].
    writer_parked: bool,
    /// Every [`Outbox`] is gone: the writer ends once the queue is empty.
    senders_gone: bool,
    /// Live [`Outbox`] handles.
    senders: usize,
    /// A batch is being queued: no wake-up until it ends.
    batching: bool,
    /// A direct write left encoded bytes: the writer must drain them.
    drain_needed: bool,
    /// The socket's writer, for direct writes (dropped with the receiver).
    direct: Option<Arc<dyn DirectWrite>>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("frames", &self.frames.len())
            .field("bytes", &self.bytes)
            .field("writer_parked", &self.writer_parked)
            .field("batching", &self.batching)
            .finish_non_exhaustive()
    }
}

/// What the sending and receiving sides share: the queue, the wake-up of the
/// writer, and the wake-up for links waiting for room.
#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    max_frames: usize,
    max_bytes: usize,
    /// Set by a waiter before it checks for room; the writer wakes waiters
    /// only when it is set, so a queue nobody waits on costs no wake-ups.
    waiting: AtomicBool,
    /// Set when the writer is gone: waiting for room is then pointless.
    closed: AtomicBool,
    room: Notify,
    wake: Notify,
}

impl Shared {
    /// The queue. A panic while it was held (none is possible: every
    /// critical section is a few field updates) leaves it usable.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What a frame of `len` bytes counts against the byte bound: its
    /// length, at most the bound itself. A single frame larger than the
    /// bound (a large `reconnect` answer) then counts as a full queue, not
    /// as several: the links behind it pause as at any full queue, but
    /// frames that cannot wait still pass up to twice the bound instead of
    /// being refused before the client could read a byte of it.
    fn cost(&self, len: usize) -> usize {
        len.min(self.max_bytes)
    }

    /// Counts a frame of `len` bytes into `s` unless the queue already
    /// holds twice its frame bound, or the frame would take it over twice
    /// its byte bound (each frame counted as at most the bound: [`cost`];
    /// a frame still passes into an empty queue).
    ///
    /// [`cost`]: Self::cost
    fn admit(&self, s: &mut State, len: usize) -> Result<(), Refused> {
        let cost = self.cost(len);
        let over_bytes = s.bytes > 0 && s.bytes + cost > self.max_bytes.saturating_mul(2);
        if over_bytes || s.frames.len() >= self.max_frames.saturating_mul(2) {
            return Err(Refused::Full);
        }
        s.bytes += cost;
        Ok(())
    }

    fn has_room(&self) -> bool {
        if self.closed.load(Ordering::SeqCst) {
            return true;
        }
        let s = self.lock();
        s.frames.len() < self.max_frames && s.bytes < self.max_bytes
    }
}

/// The sending side (sessions and the router).
#[derive(Debug)]
pub struct Outbox {
    shared: Arc<Shared>,
}

/// The receiving side (the socket's writer).
#[derive(Debug)]
pub struct OutboxRx {
    shared: Arc<Shared>,
}

/// A queue whose links pause at `max_frames` frames or `max_bytes` bytes
/// and which refuses frames beyond twice those.
pub fn outbox(max_frames: usize, max_bytes: usize) -> (Outbox, OutboxRx) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            senders: 1,
            ..State::default()
        }),
        max_frames: max_frames.max(1),
        max_bytes: max_bytes.max(1),
        waiting: AtomicBool::new(false),
        closed: AtomicBool::new(false),
        room: Notify::new(),
        wake: Notify::new(),
    });
    (
        Outbox {
            shared: shared.clone(),
        },
        OutboxRx { shared },
    )
}

impl Clone for Outbox {
    fn clone(&self) -> Self {
        self.shared.lock().senders += 1;
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl Drop for Outbox {
    fn drop(&mut self) {
        let mut s = self.shared.lock();
        s.senders -= 1;
        if s.senders == 0 {
            s.senders_gone = true;
            s.writer_parked = false;
            drop(s);
            self.shared.wake.notify_one();
        }
    }
}

impl Outbox {
    /// Queues `frame` unless the queue already holds twice its frame bound,
    /// or the frame would take it over twice its byte bound (each frame
    /// counted as at most the bound: [`Shared::cost`]; a frame still passes
    /// into an empty queue).
    pub fn try_send(&self, frame: Text) -> Result<(), Refused> {
        let shared = &self.shared;
        if shared.closed.load(Ordering::SeqCst) {
            return Err(Refused::Closed);
        }
        let mut s = shared.lock();
        shared.admit(&mut s, frame.len())?;
        s.frames.push_back(frame);
        if s.batching {
            return Ok(());
        }
        let wake = std::mem::take(&mut s.writer_parked);
        drop(s);
        if wake {
            shared.wake.notify_one();
        }
        Ok(())
    }

    /// Whether the queue is below both bounds (or its writer is gone): a
    /// link may take another frame from its host.
    pub fn has_room(&self) -> bool {
        self.shared.has_room()
    }

    /// How many frames and bytes may be queued before the bounds are
    /// reached (unbounded once the writer is gone); `None` when the queue
    /// is at a bound already.
    pub fn allowance(&self) -> Option<(usize, usize)> {
        let shared = &self.shared;
        if shared.closed.load(Ordering::SeqCst) {
            return Some((usize::MAX, usize::MAX));
        }
        let s = shared.lock();
        let frames = shared.max_frames.saturating_sub(s.frames.len());
        let bytes = shared.max_bytes.saturating_sub(s.bytes);
        (frames > 0 && bytes > 0).then_some((frames, bytes))
    }

    /// Resolves once [`Outbox::has_room`] holds.
    pub fn room(&self) -> BoxFuture<'static, ()> {
        let shared = self.shared.clone();
        Box::pin(async move {
            loop {
                let notified = shared.room.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                shared.waiting.store(true, Ordering::SeqCst);
                if shared.has_room() {
                    return;
                }
                notified.await;
            }
        })
    }

    /// Bytes queued and not yet taken by the writer (each frame counted as
    /// at most the byte bound).
    pub fn queued_bytes(&self) -> usize {
        self.shared.lock().bytes
    }

    /// Starts a batch: frames queued until [`Outbox::end_batch`] wake nobody.
    pub fn begin_batch(&self) {
        self.shared.lock().batching = true;
    }

    /// Ends a batch: `kept` are its envelopes not queued (still held only by
    /// the replay buffer), which follow what the batch queued. When the
    /// writer is parked, the batch is written here, directly (`kept` read in
    /// place when nothing is queued); the writer is woken only if that is
    /// not possible or the socket did not take everything. Frames that are
    /// not written are queued under the bounds of [`Outbox::try_send`], and
    /// refused as it refuses them (then none of the rest is queued). The
    /// queue's lock is held until the writer's is, so no frame queued later
    /// can overtake the batch.
    pub fn end_batch(&self, kept: vec_deque::Iter<'_, (u64, Text)>) -> Result<(), Refused> {
        let shared = &self.shared;
        if shared.closed.load(Ordering::SeqCst) {
            return Err(Refused::Closed);
        }
        let mut s = shared.lock();
        s.batching = false;
        if kept.len() > 0 && s.frames.is_empty() && s.writer_parked {
            let direct = s.direct.clone();
            if let Some(done) = direct.and_then(|d| d.write_now(Frames::Kept(kept.clone()))) {
                self.written(s, done);
                return Ok(());
            }
        }
        for (_, frame) in kept {
            shared.admit(&mut s, frame.len())?;
            s.frames.push_back(frame.clone());
        }
        if s.frames.is_empty() || !s.writer_parked {
            return Ok(());
        }
        let direct = s.direct.clone();
        match direct.and_then(|d| d.write_now(Frames::Queued(&mut s.frames))) {
            Some(done) => {
                s.bytes = 0;
                self.written(s, done);
            }
            None => {
                s.writer_parked = false;
                drop(s);
                shared.wake.notify_one();
            }
        }
        Ok(())
    }

    /// After a direct write: the writer drains what the socket did not take
    /// (`done` false); links waiting for room are told there is some.
    fn written(&self, mut s: MutexGuard<'_, State>, done: bool) {
        if !done {
            s.drain_needed = true;
            s.writer_parked = false;
        }
        drop(s);
        if !done {
            self.shared.wake.notify_one();
        }
        self.shared.rooms();
    }
}

impl Shared {
    /// Wakes links waiting for room, if any wait.
    fn rooms(&self) {
        if self.waiting.swap(false, Ordering::SeqCst) {
            self.room.notify_waiters();
        }
    }
}

impl OutboxRx {
    /// Moves every queued frame to the back of `into` (which the writer
    /// keeps, so no allocation follows once it has grown); wakes links
    /// waiting for room. `false` when nothing was queued.
    pub fn take_all(&mut self, into: &mut VecDeque<Text>) -> bool {
        self.take_up_to(into, usize::MAX)
    }

    /// Moves the oldest queued frames, about `max_bytes` of them (at least
    /// one), to the back of `into`; the rest stay queued and count against
    /// the bounds, so what the writer holds outside the queue is bounded
    /// too and a client that does not read still fills it (§5.9).
    fn take_up_to(&mut self, into: &mut VecDeque<Text>, max_bytes: usize) -> bool {
        let shared = &self.shared;
        let mut s = shared.lock();
        if s.frames.is_empty() {
            return false;
        }
        if s.bytes <= max_bytes && into.is_empty() {
            std::mem::swap(&mut s.frames, into);
            s.bytes = 0;
        } else {
            let (mut taken, mut counted) = (0, 0);
            while taken < max_bytes
                && let Some(f) = s.frames.pop_front()
            {
                taken += f.len();
                counted += shared.cost(f.len());
                into.push_back(f);
            }
            s.bytes = s.bytes.saturating_sub(counted);
        }
        s.drain_needed = false;
        drop(s);
        shared.rooms();
        true
    }

    /// Lets links write batches directly through `direct` while the writer
    /// is parked.
    pub fn attach(&self, direct: Arc<dyn DirectWrite>) {
        self.shared.lock().direct = Some(direct);
    }

    /// Waits for frames and moves all of them to `into`; `true` also (with
    /// no frames) when a direct write left bytes to drain; `false` when every
    /// sender is gone and nothing is left.
    pub async fn recv_batch(&mut self, into: &mut VecDeque<Text>) -> bool {
        loop {
            if self.take_up_to(into, WRITER_TAKES_BYTES) {
                return true;
            }
            {
                let mut s = self.shared.lock();
                if std::mem::take(&mut s.drain_needed) {
                    return true;
                }
                if !s.frames.is_empty() {
                    continue;
                }
                if s.senders_gone {
                    return false;
                }
                s.writer_parked = true;
            }
            self.shared.wake.notified().await;
        }
    }
}

impl Drop for OutboxRx {
    fn drop(&mut self) {
        self.shared.lock().direct = None;
        self.shared.closed.store(true, Ordering::SeqCst);
        self.shared.room.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Text {
        Text::from(s.to_string())
    }

    fn taken(rx: &mut OutboxRx) -> Vec<String> {
        let mut into = VecDeque::new();
        rx.take_all(&mut into);
        into.iter().map(|f| f.to_string()).collect()
    }

    #[tokio::test]
    async fn links_pause_at_the_bounds_and_others_refuse_at_twice() {
        let (tx, mut rx) = outbox(2, 10);
        assert_eq!(tx.try_send(text("123456")), Ok(()));
        assert!(tx.has_room());
        assert_eq!(tx.allowance(), Some((1, 4)));
        assert_eq!(tx.try_send(text("123456")), Ok(()));
        assert!(!tx.has_room(), "12 bytes is over the 10-byte bound");
        assert_eq!(tx.allowance(), None);
        assert_eq!(tx.try_send(text("12345678")), Ok(()));
        assert_eq!(tx.try_send(text("1")), Err(Refused::Full));
        assert_eq!(tx.queued_bytes(), 20);
        let room = tokio::spawn(tx.room());
        tokio::task::yield_now().await;
        assert!(!room.is_finished(), "no room while the queue is full");
        assert_eq!(taken(&mut rx), ["123456", "123456", "12345678"]);
        assert!(tx.has_room());
        assert!(room.await.is_ok(), "the waiting link is woken");
        // One frame larger than twice the byte bound still passes into an empty queue.
        assert_eq!(tx.try_send(text(&"x".repeat(30))), Ok(()));
    }

    #[tokio::test]
    async fn a_parked_writer_is_woken_and_sees_every_frame_in_order() {
        let (tx, mut rx) = outbox(1000, 1 << 20);
        let writer = tokio::spawn(async move {
            let mut got = Vec::new();
            let mut batch = VecDeque::new();
            while rx.recv_batch(&mut batch).await {
                got.extend(batch.drain(..).map(|f| f.to_string()));
            }
            got
        });
        let sender = tx.clone();
        let producer = tokio::spawn(async move {
            for i in 0..500 {
                assert_eq!(sender.try_send(text(&i.to_string())), Ok(()));
                if i % 7 == 0 {
                    tokio::task::yield_now().await;
                }
            }
        });
        producer.await.unwrap();
        drop(tx);
        let got = writer.await.unwrap();
        let want: Vec<String> = (0..500).map(|i| i.to_string()).collect();
        assert_eq!(
            got, want,
            "every frame once, in order; the writer ends when senders are gone"
        );
    }

    /// A writer that takes `take` batches whole, then leaves bytes to drain.
    struct Direct {
        written: std::sync::Mutex<Vec<String>>,
        busy: AtomicBool,
        whole: AtomicBool,
    }

    impl DirectWrite for Direct {
        fn write_now(&self, frames: Frames<'_>) -> Option<bool> {
            if self.busy.load(Ordering::SeqCst) {
                return None;
            }
            let mut w = self.written.lock().unwrap();
            match frames {
                Frames::Queued(queue) => w.extend(queue.drain(..).map(|f| f.to_string())),
                Frames::Kept(kept) => w.extend(kept.map(|(_, f)| f.to_string())),
            }
            Some(self.whole.load(Ordering::SeqCst))
        }
    }

    /// A batch with no kept envelopes.
    const NONE_KEPT: VecDeque<(u64, Text)> = VecDeque::new();

    fn kept(texts: &[&str]) -> VecDeque<(u64, Text)> {
        texts.iter().zip(1..).map(|(t, n)| (n, text(t))).collect()
    }

    #[tokio::test]
    async fn kept_envelopes_follow_what_the_batch_queued_written_in_place_or_queued() {
        let (tx, mut rx) = outbox(2, 1 << 20);
        let direct = Direct::attached(&rx);
        parked(&mut rx).await;
        tx.begin_batch();
        tx.end_batch(kept(&["k0", "k1"]).iter()).unwrap();
        assert_eq!(*direct.written.lock().unwrap(), ["k0", "k1"], "in place");
        assert_eq!(tx.queued_bytes(), 0, "never counted in the queue");
        parked(&mut rx).await;
        tx.begin_batch();
        tx.try_send(text("q")).unwrap();
        tx.end_batch(kept(&["k2"]).iter()).unwrap();
        assert_eq!(
            *direct.written.lock().unwrap(),
            ["k0", "k1", "q", "k2"],
            "behind q"
        );
        // A busy writer: they are queued, in order, under the queue's bounds.
        direct.busy.store(true, Ordering::SeqCst);
        parked(&mut rx).await;
        tx.begin_batch();
        tx.end_batch(kept(&["k3", "k4"]).iter()).unwrap();
        let mut batch = VecDeque::new();
        assert!(rx.recv_batch(&mut batch).await);
        assert_eq!(
            batch.iter().map(|f| f.to_string()).collect::<Vec<_>>(),
            ["k3", "k4"]
        );
        tx.begin_batch();
        let refused = tx.end_batch(kept(&["a", "b", "c", "d", "e"]).iter());
        assert_eq!(
            refused,
            Err(Refused::Full),
            "over twice the frame bound of 2"
        );
    }

    impl Direct {
        /// A free writer that takes whole batches, attached to `rx`.
        fn attached(rx: &OutboxRx) -> Arc<Self> {
            let direct = Arc::new(Self {
                written: Default::default(),
                busy: AtomicBool::new(false),
                whole: AtomicBool::new(true),
            });
            rx.attach(direct.clone());
            direct
        }
    }

    async fn parked(rx: &mut OutboxRx) {
        let mut batch = VecDeque::new();
        let waited = tokio::time::timeout(
            std::time::Duration::from_millis(20),
            rx.recv_batch(&mut batch),
        );
        assert!(waited.await.is_err(), "the writer parks on an empty queue");
    }

    #[tokio::test]
    async fn a_batch_is_written_directly_while_the_writer_is_parked() {
        let (tx, mut rx) = outbox(100, 1 << 20);
        let direct = Direct::attached(&rx);
        parked(&mut rx).await;
        tx.begin_batch();
        for i in 0..3 {
            tx.try_send(text(&i.to_string())).unwrap();
        }
        tx.end_batch(NONE_KEPT.iter()).unwrap();
        assert_eq!(*direct.written.lock().unwrap(), ["0", "1", "2"]);
        assert_eq!(tx.queued_bytes(), 0);
        parked(&mut rx).await;
        // The socket takes part: the writer is woken to drain, with no frames.
        direct.whole.store(false, Ordering::SeqCst);
        tx.begin_batch();
        tx.try_send(text("3")).unwrap();
        tx.end_batch(NONE_KEPT.iter()).unwrap();
        let mut batch = VecDeque::new();
        assert!(rx.recv_batch(&mut batch).await, "woken to drain");
        assert!(batch.is_empty());
        // A busy writer: the batch stays queued, in order, for the writer task.
        direct.busy.store(true, Ordering::SeqCst);
        parked(&mut rx).await;
        tx.begin_batch();
        tx.try_send(text("4")).unwrap();
        tx.try_send(text("5")).unwrap();
        tx.end_batch(NONE_KEPT.iter()).unwrap();
        assert!(rx.recv_batch(&mut batch).await);
        assert_eq!(
            batch.iter().map(|f| f.to_string()).collect::<Vec<_>>(),
            ["4", "5"]
        );
    }

    #[tokio::test]
    async fn a_batch_wakes_no_writer_until_it_ends() {
        let (tx, mut rx) = outbox(100, 1 << 20);
        let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
        let writer = tokio::spawn(async move {
            let mut batch = VecDeque::new();
            while rx.recv_batch(&mut batch).await {
                let _ = seen_tx.send(batch.drain(..).count());
            }
        });
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        tx.begin_batch();
        tx.try_send(text("a")).unwrap();
        tx.try_send(text("b")).unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        assert!(
            seen.try_recv().is_err(),
            "the parked writer was not woken mid-batch"
        );
        tx.end_batch(NONE_KEPT.iter()).unwrap();
        assert_eq!(
            seen.recv().await,
            Some(2),
            "no direct writer: woken once, at the end"
        );
        drop(tx);
        writer.await.unwrap();
    }

    #[tokio::test]
    async fn the_writer_takes_a_bounded_chunk_and_the_rest_still_counts() {
        let (tx, mut rx) = outbox(1000, 10 << 20);
        let frame = "x".repeat(20 * 1024);
        for _ in 0..10 {
            tx.try_send(text(&frame)).unwrap();
        }
        let mut batch = VecDeque::new();
        assert!(rx.recv_batch(&mut batch).await);
        assert_eq!(
            batch.len(),
            4,
            "64 KiB taken: 20 KiB frames until it is crossed"
        );
        assert_eq!(
            tx.queued_bytes(),
            6 * 20 * 1024,
            "the rest still counts against the bounds"
        );
        batch.clear();
        assert!(rx.take_all(&mut batch));
        assert_eq!(batch.len(), 6);
        assert_eq!(tx.queued_bytes(), 0);
    }

    #[test]
    fn a_frame_over_the_byte_bound_counts_as_the_bound() {
        let (tx, mut rx) = outbox(100, 1000);
        let small = "y".repeat(300);
        assert_eq!(tx.try_send(text(&small)), Ok(()));
        let big = "x".repeat(5000);
        assert_eq!(
            tx.try_send(text(&big)),
            Ok(()),
            "behind a small frame, a frame over twice the bound counts as the bound"
        );
        assert!(!tx.has_room(), "links pause behind it");
        assert_eq!(tx.queued_bytes(), 1300);
        assert_eq!(tx.try_send(text(&small)), Ok(()), "up to twice the bound");
        assert_eq!(tx.try_send(text(&small)), Ok(()));
        assert_eq!(
            tx.try_send(text(&small)),
            Err(Refused::Full),
            "twice the bound still holds"
        );
        let mut taken = VecDeque::new();
        assert!(rx.take_all(&mut taken));
        assert_eq!(taken.len(), 4);
        assert_eq!(tx.queued_bytes(), 0, "taken as counted");
    }

    #[tokio::test]
    async fn a_gone_writer_ends_the_wait() {
        let (tx, rx) = outbox(1, 100);
        assert_eq!(tx.try_send(text("a")), Ok(()));
        assert!(!tx.has_room());
        let room = tokio::spawn(tx.room());
        drop(rx);
        assert!(room.await.is_ok());
        assert_eq!(tx.try_send(text("b")), Err(Refused::Closed));
    }
}

//! The bounded queue of frames from the relay to one client socket, bounded
//! by frame count and by bytes (contract §5.9).
//!
//! The bounds are where the client's own links stop reading from their
//! hosts: a link asks [`Outbox::has_room`] before it takes the next frame
//! from its host and otherwise waits on [`Outbox::room`], so a client that
//! reads slowly slows its hosts through TCP, as a direct connection would.
//! Frames that cannot wait (watch-link fan-out, answers to the client's own
//! requests) are queued up to twice the bounds; beyond that
//! [`Outbox::try_send`] refuses and the session closes the client with 4008.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use futures_util::future::BoxFuture;
use tokio::sync::{Notify, mpsc};
use tokio_tungstenite::tungstenite::Utf8Bytes;

/// Why a frame was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Over twice the frame or byte bound: the client is too slow.
    Full,
    /// The socket's writer is gone.
    Closed,
}

/// What the sending and receiving sides share: the counts, and the wake-up
/// for links waiting for room.
#[derive(Debug)]
struct Shared {
    frames: AtomicUsize,
    bytes: AtomicUsize,
    max_frames: usize,
    max_bytes: usize,
    /// Set by a waiter before it checks for room; the writer wakes waiters
    /// only when it is set, so a queue nobody waits on costs no wake-ups.
    waiting: AtomicBool,
    /// Set when the writer is gone: waiting for room is then pointless.
    closed: AtomicBool,
    room: Notify,
}

impl Shared {
    fn has_room(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
            || (self.frames.load(Ordering::SeqCst) < self.max_frames
                && self.bytes.load(Ordering::SeqCst) < self.max_bytes)
    }
}

/// The sending side (sessions and the router).
#[derive(Debug, Clone)]
pub struct Outbox {
    tx: mpsc::UnboundedSender<Utf8Bytes>,
    shared: Arc<Shared>,
}

/// The receiving side (the socket's writer).
#[derive(Debug)]
pub struct OutboxRx {
    rx: mpsc::UnboundedReceiver<Utf8Bytes>,
    shared: Arc<Shared>,
}

/// A queue whose links pause at `max_frames` frames or `max_bytes` bytes
/// and which refuses frames beyond twice those.
pub fn outbox(max_frames: usize, max_bytes: usize) -> (Outbox, OutboxRx) {
    let (tx, rx) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared {
        frames: AtomicUsize::new(0),
        bytes: AtomicUsize::new(0),
        max_frames: max_frames.max(1),
        max_bytes: max_bytes.max(1),
        waiting: AtomicBool::new(false),
        closed: AtomicBool::new(false),
        room: Notify::new(),
    });
    (
        Outbox {
            tx,
            shared: shared.clone(),
        },
        OutboxRx { rx, shared },
    )
}

impl Outbox {
    /// Queues `frame` unless the queue already holds twice its frame bound,
    /// or the frame would take it over twice its byte bound (a single frame
    /// larger than that still passes into an empty queue).
    pub fn try_send(&self, frame: Utf8Bytes) -> Result<(), Refused> {
        let s = &self.shared;
        let len = frame.len();
        let before = s.bytes.fetch_add(len, Ordering::SeqCst);
        let frames = s.frames.fetch_add(1, Ordering::SeqCst);
        let over_bytes = before > 0 && before + len > s.max_bytes.saturating_mul(2);
        if over_bytes || frames >= s.max_frames.saturating_mul(2) {
            self.undo(len);
            return Err(Refused::Full);
        }
        self.tx.send(frame).map_err(|_| {
            self.undo(len);
            Refused::Closed
        })
    }

    fn undo(&self, len: usize) {
        self.shared.bytes.fetch_sub(len, Ordering::SeqCst);
        self.shared.frames.fetch_sub(1, Ordering::SeqCst);
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
        let s = &self.shared;
        if s.closed.load(Ordering::SeqCst) {
            return Some((usize::MAX, usize::MAX));
        }
        let frames = s.max_frames.saturating_sub(s.frames.load(Ordering::SeqCst));
        let bytes = s.max_bytes.saturating_sub(s.bytes.load(Ordering::SeqCst));
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

    /// Bytes queued and not yet taken by the writer.
    pub fn queued_bytes(&self) -> usize {
        self.shared.bytes.load(Ordering::SeqCst)
    }
}

impl OutboxRx {
    fn taken(&self, f: Utf8Bytes) -> Utf8Bytes {
        let s = &self.shared;
        s.bytes.fetch_sub(f.len(), Ordering::SeqCst);
        s.frames.fetch_sub(1, Ordering::SeqCst);
        if s.waiting.load(Ordering::SeqCst) && s.has_room() {
            s.waiting.store(false, Ordering::SeqCst);
            s.room.notify_waiters();
        }
        f
    }

    /// The next frame; `None` when every sender is gone.
    pub async fn recv(&mut self) -> Option<Utf8Bytes> {
        let f = self.rx.recv().await?;
        Some(self.taken(f))
    }

    /// The next frame if one is queued now.
    pub fn try_recv(&mut self) -> Option<Utf8Bytes> {
        let f = self.rx.try_recv().ok()?;
        Some(self.taken(f))
    }
}

impl Drop for OutboxRx {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        self.shared.room.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Utf8Bytes {
        Utf8Bytes::from(s.to_string())
    }

    #[tokio::test]
    async fn links_pause_at_the_bounds_and_others_refuse_at_twice() {
        let (tx, mut rx) = outbox(2, 10);
        assert_eq!(tx.try_send(text("123456")), Ok(()));
        assert!(tx.has_room());
        assert_eq!(tx.try_send(text("123456")), Ok(()));
        assert!(!tx.has_room(), "12 bytes is over the 10-byte bound");
        assert_eq!(tx.try_send(text("12345678")), Ok(()));
        assert_eq!(tx.try_send(text("1")), Err(Refused::Full));
        assert_eq!(tx.queued_bytes(), 20);
        let room = tokio::spawn(tx.room());
        assert_eq!(rx.recv().await.as_deref(), Some("123456"));
        assert!(!room.is_finished() || tx.has_room());
        assert_eq!(rx.recv().await.as_deref(), Some("123456"));
        assert!(tx.has_room());
        assert!(room.await.is_ok(), "the waiting link is woken");
        assert_eq!(rx.recv().await.as_deref(), Some("12345678"));
        // One frame larger than twice the byte bound still passes into an empty queue.
        assert_eq!(tx.try_send(text(&"x".repeat(30))), Ok(()));
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

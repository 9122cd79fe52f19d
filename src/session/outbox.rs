//! The bounded queue of frames from the relay to one client socket, bounded
//! by frame count and by bytes (contract §5.9): a client that does not read
//! fills it and is closed with 4008 instead of growing the relay's memory or
//! stalling a link.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Utf8Bytes;

/// Why a frame was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Over the frame or byte bound: the client is too slow.
    Full,
    /// The socket's writer is gone.
    Closed,
}

/// The sending side (sessions and the router).
#[derive(Debug, Clone)]
pub struct Outbox {
    tx: mpsc::Sender<Utf8Bytes>,
    bytes: Arc<AtomicUsize>,
    max_bytes: usize,
}

/// The receiving side (the socket's writer).
#[derive(Debug)]
pub struct OutboxRx {
    rx: mpsc::Receiver<Utf8Bytes>,
    bytes: Arc<AtomicUsize>,
}

/// A queue holding at most `max_frames` frames and `max_bytes` bytes.
pub fn outbox(max_frames: usize, max_bytes: usize) -> (Outbox, OutboxRx) {
    let (tx, rx) = mpsc::channel(max_frames.max(1));
    let bytes = Arc::new(AtomicUsize::new(0));
    (
        Outbox {
            tx,
            bytes: bytes.clone(),
            max_bytes,
        },
        OutboxRx { rx, bytes },
    )
}

impl Outbox {
    /// Queues `frame` unless a bound would be exceeded.
    pub fn try_send(&self, frame: Utf8Bytes) -> Result<(), Refused> {
        let len = frame.len();
        let before = self.bytes.fetch_add(len, Ordering::Relaxed);
        if before + len > self.max_bytes && before > 0 {
            self.bytes.fetch_sub(len, Ordering::Relaxed);
            return Err(Refused::Full);
        }
        self.tx.try_send(frame).map_err(|e| {
            self.bytes.fetch_sub(len, Ordering::Relaxed);
            match e {
                mpsc::error::TrySendError::Full(_) => Refused::Full,
                mpsc::error::TrySendError::Closed(_) => Refused::Closed,
            }
        })
    }

    /// Bytes queued and not yet taken by the writer.
    pub fn queued_bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }
}

impl OutboxRx {
    fn taken(&self, f: Utf8Bytes) -> Utf8Bytes {
        self.bytes.fetch_sub(f.len(), Ordering::Relaxed);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bounded_by_frames_and_bytes() {
        let (tx, mut rx) = outbox(3, 10);
        assert_eq!(tx.try_send(Utf8Bytes::from("123456".to_string())), Ok(()));
        assert_eq!(
            tx.try_send(Utf8Bytes::from("123456".to_string())),
            Err(Refused::Full)
        );
        assert_eq!(tx.queued_bytes(), 6);
        assert_eq!(rx.recv().await.as_deref(), Some("123456"));
        assert_eq!(tx.queued_bytes(), 0);
        // One frame larger than the byte bound still passes into an empty queue.
        assert_eq!(tx.try_send(Utf8Bytes::from("x".repeat(20))), Ok(()));
        let (tx, _rx) = outbox(1, 100);
        assert_eq!(tx.try_send(Utf8Bytes::from("a".to_string())), Ok(()));
        assert_eq!(
            tx.try_send(Utf8Bytes::from("b".to_string())),
            Err(Refused::Full)
        );
    }
}

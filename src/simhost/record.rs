//! The record of every frame the host received, for tests that need to
//! prove what did — or did not — reach a host.

use std::collections::VecDeque;
use std::sync::Arc;

use super::core::ConnId;

/// One inbound frame as the host received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameRecord {
    /// The connection it arrived on.
    pub conn: ConnId,
    /// The connection's `clientId` at that moment (`None` before
    /// `initialize`/`reconnect`).
    pub client_id: Option<String>,
    /// The JSON-RPC method, when the frame had one.
    pub method: Option<String>,
    /// The exact text received.
    pub text: Arc<str>,
}

/// A bounded log of inbound frames (oldest dropped first).
#[derive(Debug)]
pub struct Recorder {
    frames: VecDeque<FrameRecord>,
    limit: usize,
    dropped: u64,
}

impl Recorder {
    /// An empty record keeping at most `limit` frames.
    pub fn new(limit: usize) -> Self {
        Self {
            frames: VecDeque::new(),
            limit,
            dropped: 0,
        }
    }

    /// Appends a frame, evicting the oldest beyond the limit.
    pub fn push(&mut self, record: FrameRecord) {
        self.frames.push_back(record);
        while self.frames.len() > self.limit {
            self.frames.pop_front();
            self.dropped += 1;
        }
    }

    /// All kept frames, oldest first.
    pub fn all(&self) -> Vec<FrameRecord> {
        self.frames.iter().cloned().collect()
    }

    /// Frames evicted so far (a test reading the record should see 0).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Forgets everything recorded.
    pub fn clear(&mut self) {
        self.frames.clear();
    }
}

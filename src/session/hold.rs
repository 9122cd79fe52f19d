//! A create's store write, off the edge thread (§4.2, §4.5).
//!
//! A client-chosen name is confirmed in the store (or released on a host
//! error) before the create is answered, and frames a link delivers after
//! the host's answer must not reach the client before that answer (§4.5).
//! The write (an fsync, or a PostgreSQL round trip) runs on the blocking
//! pool, never on the edge thread that serves the session and many other
//! connections. Meanwhile the session *holds*: its links pause (their room is
//! [`Hold::room`]), frames they had already read are kept in order, and once
//! the write has ended the answer is sent and the kept frames are handled as
//! if they had just arrived — a create answer among them starting the next
//! hold.
//!
//! Guarantees: the answer follows the write; nothing the session's links
//! read after the answer reaches the client before it; no frame is lost or
//! handled twice; a write that cannot finish (store down) still ends the
//! hold with the store's error logged, as the write did in place.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::watch;

use super::{ClientSession, ReplyTo};
use crate::rpc::RpcError;
use crate::upstream::hub::HostHub;
use crate::upstream::link::{LinkCmd, Room};

/// Frames kept while the session holds, with the link that read them.
type Kept = Vec<(Arc<HostHub>, u64, String)>;

/// One reason for a session's links to stop reading (§5.9): while it is
/// set, a link asking for room gets one that resolves once it is cleared,
/// and reads nothing meanwhile (its host feels TCP backpressure).
#[derive(Debug)]
pub(super) struct Pause(watch::Sender<bool>);

impl Default for Pause {
    fn default() -> Self {
        Self(watch::Sender::new(false))
    }
}

impl Pause {
    /// Sets or clears the pause; `true` when that changed it.
    pub(super) fn set(&self, on: bool) -> bool {
        self.0.send_replace(on) != on
    }

    /// While set: a room that resolves when it is cleared.
    pub(super) fn room(&self) -> Option<Room> {
        if !*self.0.borrow() {
            return None;
        }
        let mut paused = self.0.subscribe();
        Some(Room::Wait(Box::pin(async move {
            let _ = paused.wait_for(|p| !*p).await;
        })))
    }
}

/// The session's hold, under its lock ([`super::core::Links::hold`]).
#[derive(Debug, Default)]
pub(super) struct Hold {
    /// Set from the hold's start until its kept frames have been handled.
    paused: Pause,
    /// Frames read while holding, in the order read.
    kept: Kept,
}

impl Hold {
    /// While the links must wait: a room that resolves when they may read
    /// again.
    pub(super) fn room(&self) -> Option<Room> {
        self.paused.room()
    }
}

/// What a create's answer will be once its store write has ended.
pub(super) struct CreateAnswer {
    pub(super) host: Arc<HostHub>,
    /// Where the answer goes.
    pub(super) to: ReplyTo,
    pub(super) failure: Option<RpcError>,
    /// A session create is answered once the catalog lists it (§6.3).
    pub(super) await_catalog: Option<String>,
}

impl ClientSession {
    /// Writes a create's outcome to the store on the blocking pool — its
    /// name confirmed, or released when `answer` carries the host's error —
    /// and answers it once the write has ended, the session holding until
    /// then (module docs). The write runs even if the session is gone.
    pub(super) fn commit_create(
        &self,
        core: &mut super::SessionCore,
        store_key: &str,
        answer: CreateAnswer,
    ) {
        let (store, key) = (self.env.store.clone(), store_key.to_string());
        let confirm = answer.failure.is_none();
        let write = tokio::task::spawn_blocking(move || {
            let written = match confirm {
                true => store.confirm(&key),
                false => store.release(&key),
            };
            if let (Err(e), true) = (written, confirm) {
                tracing::error!(error = %e, uri = %key, "cannot confirm a created URI");
            }
        });
        let Some(me) = self.registry().and_then(|r| r.session_of(&self.key)) else {
            return;
        };
        core.links.hold.paused.set(true);
        self.holding.store(true, Ordering::Release);
        tokio::spawn(async move {
            let _ = write.await;
            me.end_hold(answer);
        });
    }

    /// Keeps `frames` (the rest of a batch from `host`'s link `link`) if the
    /// session holds; `false` when the hold ended meanwhile (the caller
    /// handles them).
    pub(super) fn keep_if_holding(&self, host: &Arc<HostHub>, link: u64, frames: &[&str]) -> bool {
        let mut core = self.lock();
        if !self.holding.load(Ordering::Acquire) {
            return false;
        }
        let kept = frames.iter().map(|f| (host.clone(), link, f.to_string()));
        core.links.hold.kept.extend(kept);
        true
    }

    /// The write has ended: answers the create, then handles the kept
    /// frames in order with the links still paused; lets them read again
    /// unless one of those frames started another hold.
    fn end_hold(self: &Arc<Self>, answer: CreateAnswer) {
        // A hold started while an earlier one's frames are handled (on
        // another thread) ends after that handling: its kept frames include
        // what the earlier one kept for it.
        let _one_at_a_time = self.draining.lock().unwrap_or_else(|e| e.into_inner());
        let kept = {
            let mut core = self.lock();
            match (&answer.failure, &answer.await_catalog) {
                (Some(err), _) => self.respond_error_to(&mut core, &answer.to, err),
                (None, None) => self.respond_to(&mut core, &answer.to, "null"),
                (None, Some(_)) => {}
            }
            self.holding.store(false, Ordering::Release);
            std::mem::take(&mut core.links.hold.kept)
        };
        if let (None, Some(uri)) = (answer.failure, answer.await_catalog) {
            self.respond_after_catalog(answer.host, uri, answer.to);
        }
        self.handle_kept(kept);
        let core = self.lock();
        if !self.holding.load(Ordering::Acquire) {
            core.links.hold.paused.set(false);
        }
    }

    /// Handles kept frames, a run per link at a time, as that link would
    /// have; once one of them starts another hold, the rest are kept for it
    /// (behind what that run's own rest was kept as).
    fn handle_kept(&self, kept: Kept) {
        let mut rest = kept.as_slice();
        while let Some((host, link, _)) = rest.first() {
            let run = rest
                .iter()
                .take_while(|(h, l, _)| Arc::ptr_eq(h, host) && l == link)
                .count();
            let frames: Vec<&str> = rest[..run].iter().map(|(_, _, f)| f.as_str()).collect();
            let mut replies = Vec::new();
            let _ = self.host_frames(
                (host, *link, std::time::Instant::now()),
                &frames,
                &mut replies,
            );
            self.reply_on(host, *link, replies);
            rest = &rest[run..];
            if self.holding.load(Ordering::Acquire) {
                let mut core = self.lock();
                core.links.hold.kept.extend(rest.iter().cloned());
                return;
            }
        }
    }

    /// Writes answers to a host's requests on `link`, if it is still the
    /// session's link to `host`.
    fn reply_on(&self, host: &Arc<HostHub>, link: u64, replies: Vec<String>) {
        if replies.is_empty() {
            return;
        }
        let open = self.lock().links.open.get(&host.id).cloned();
        if let Some(l) = open.filter(|l| l.id == link) {
            for reply in replies {
                l.send(LinkCmd::Frame(reply));
            }
        }
    }
}

//! The session's side of its links (contract §5.8): what a link reports
//! through [`LinkOwner`] — frames, watermarks, drops, what to resume — is
//! applied here to the session's state, so the upstream layer never
//! reaches into a session.

use std::sync::{Arc, Weak};

use super::ClientSession;
use crate::rpc::{Close, RpcError};
use crate::upstream::hub::HostHub;
use crate::upstream::link::{Baseline, Link, LinkCmd, LinkOwner, LinkSpec, Room};

impl ClientSession {
    /// Opens a new link to `hub` for this session (counted in metrics).
    pub fn open_link_to(self: &Arc<Self>, hub: &Arc<HostHub>, baseline: Baseline) -> Arc<Link> {
        let limits = &self.env.cfg.limits;
        let spec = LinkSpec {
            upstream_id: self.upstream_id.clone(),
            version: self.version.clone(),
            user: (
                self.key.principal.issuer.clone(),
                self.key.principal.subject.clone(),
            ),
            ping_after: limits.link_ping(),
            ping_timeout: limits.link_ping_timeout(),
            queue_frames: limits.link_queue_frames,
            stall_after: std::time::Duration::from_secs(limits.slow_client_secs),
        };
        self.env.metrics.links_opened.inc();
        let owner: Weak<dyn LinkOwner> = Arc::downgrade(self) as Weak<dyn LinkOwner>;
        Link::open(owner, spec, hub.clone(), baseline)
    }

    /// [`Self::open_link_to`] under the session lock, with the session's
    /// tokens for the host's protected resources queued first (§4.6).
    pub(super) fn open_link_locked(
        self: &Arc<Self>,
        core: &mut super::SessionCore,
        hub: &Arc<HostHub>,
        baseline: Baseline,
    ) -> Arc<Link> {
        let link = self.open_link_to(hub, baseline);
        self.replay_tokens(core, hub, &link);
        link
    }
    /// How much a link may read now (§5.9), under the session lock.
    pub(super) fn room_locked(&self, core: &super::SessionCore) -> Room {
        if let Some(wait) = core.links.hold.room() {
            return wait;
        }
        // Only a cut pauses for its holds (`cut_pending` is a field read).
        if core.seq.cut_pending
            && let Some(wait) = core.links.cut_full.room()
        {
            return wait;
        }
        let Some(socket) = &core.attachment.socket else {
            // Detached: frames go to the replay buffer, bounded on its own.
            // A batch is still no larger than an empty client queue takes:
            // a `reconnect` may attach a socket while the batch is read, and
            // its frames then go to that socket's queue, behind the answer
            // (a larger batch overflowed a small queue at once: 4008).
            let limits = &self.env.cfg.limits;
            return Room::Take {
                frames: limits.client_queue_frames,
                bytes: limits.client_queue_bytes,
            };
        };
        match socket.out.allowance() {
            Some((frames, bytes)) => Room::Take { frames, bytes },
            None => Room::Wait(socket.out.room()),
        }
    }
}

impl LinkOwner for ClientSession {
    fn on_link_up(&self, _host: &Arc<HostHub>, link: u64, server_seq: u64) {
        self.lock().links.watermarks.insert(link, server_seq);
    }

    fn on_host_frames(
        &self,
        host: &Arc<HostHub>,
        link: u64,
        read_at: std::time::Instant,
        frames: &[&str],
        replies: &mut Vec<String>,
    ) -> Room {
        self.host_frames((host, link, read_at), frames, replies)
    }

    fn on_connection_lost(&self, host: &Arc<HostHub>, link: u64) {
        self.env.metrics.links_failed.inc();
        self.fail_link_requests(link, &RpcError::upstream_lost(&host.id));
        // The link resumes on a new connection, and hosts keep tokens per
        // connection (§4.6): queue the session's tokens for it again, ahead
        // of anything the session sends from now on (decided anew there).
        let mut core = self.lock();
        // The host's requests went with the connection: an answer sent on
        // the new one could meet another request under the same id.
        core.links.host_requests.retain(|_, r| r.link != link);
        let open = core
            .links
            .open
            .get(&host.id)
            .filter(|l| l.id == link)
            .cloned();
        if let Some(l) = open {
            core.links.tokens.forget_held(&host.id);
            self.replay_tokens(&mut core, host, &l);
        }
    }

    fn resume_plan(&self, host: &Arc<HostHub>, link: u64) -> Option<(u64, Vec<String>)> {
        self.link_resume_plan(host, link)
    }

    fn on_link_down(&self, host: &Arc<HostHub>, link: u64, was_up: bool, unsent: Vec<LinkCmd>) {
        self.env.metrics.links_failed.inc();
        self.link_down(host, link, was_up);
        let mut core = self.lock();
        let reason = format!("host {} unavailable", host.id);
        for cmd in unsent {
            if let LinkCmd::Dispatch {
                client_channel,
                action,
                client_seq,
                ..
            } = cmd
            {
                self.reject_dispatch(&mut core, &client_channel, &action, client_seq, &reason);
            }
        }
    }

    fn room(&self) -> Room {
        self.room_locked(&self.lock())
    }

    fn on_stalled(&self, host: &Arc<HostHub>) {
        let mut core = self.lock();
        let full = core
            .attachment
            .socket
            .as_ref()
            .is_some_and(|s| !s.out.has_room());
        if full {
            tracing::info!(host = %host.id, "client queue full for slow_client_secs: closed 4008");
            self.env.metrics.slow_consumer_closes.inc();
            self.close_locked(&mut core, Close::SlowConsumer);
        }
    }
}

impl ClientSession {
    /// Host `host` left the configuration: its link closes (requests in
    /// flight on it fail with `upstreamLost`), its channels are no longer
    /// followed or baselined. Returns whether the client followed any of
    /// them while attached (then it must be resynchronised).
    pub fn forget_host(&self, host: &str) -> bool {
        let mut core = self.lock();
        if let Some(link) = core.links.open.remove(host) {
            let err = RpcError::upstream_lost(host);
            self.fail_link_requests_locked(&mut core, link.id, &err);
        }
        let lost = core.lose_host_channels(host);
        for c in &lost {
            core.channels.subs.remove(c);
        }
        core.links.registered.retain(|(h, _)| &**h != host);
        !lost.is_empty() && core.socket_id().is_some()
    }
}

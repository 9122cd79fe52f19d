//! Host → client: what a session does with each frame a link delivers.
//!
//! The hot path is an `action` envelope on a live channel: the frame is
//! classified without building a JSON tree, and the client frame is made by
//! splicing the client channel name, the session's next number and (for the
//! session's own echoes) the client's id into the host's bytes. Only action
//! types that carry names (per the rewrite table) have their action object
//! parsed and rewritten.

use std::sync::{Arc, MutexGuard};

use serde_json::Value;
use tokio::sync::oneshot;

use super::chunk::Chunk;
use super::hold::CreateAnswer;
use super::{Chan, ClientSession, PendingKind, ReplyTo, SessionCore, tool_calls};
use crate::names::namer::{Noting, ToClient};
use crate::names::qualify::{ChannelKind, channel_kind};
use crate::names::seen::ShownIn;
use crate::names::translate::{self, state_shape};
use crate::route::router;
use crate::rpc::{Close, RpcError};
use crate::upstream::hub::HostHub;
use crate::upstream::link::Room;
use crate::upstream::watch::RootField;
use crate::wire::{self, Edit, EditValue, Frame, FrameKind, Text};
use bytes::BytesMut;

/// Requests a host may send to its client (AHP `ServerCommandMap`).
pub const HOST_REQUESTS: &[&str] = &[
    "resourceRead",
    "resourceWrite",
    "resourceList",
    "resourceCopy",
    "resourceDelete",
    "resourceMove",
    "resourceResolve",
    "resourceMkdir",
    "resourceRequest",
    "createResourceWatch",
];

/// How long a client may take to answer a host's request (contract §4.5).
const CLIENT_REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

impl ClientSession {
    /// Handles frames read together from `host`'s link, in order. Runs of
    /// action envelopes (nearly all the traffic) are handled under one
    /// session lock; other frames take it themselves. Answers to write back
    /// to the host are pushed to `replies`. The batch's time from `read_at`
    /// to its last frame queued goes to the host-latency histogram; returns
    /// the room left after it (§5.9).
    pub(super) fn host_frames(
        &self,
        (host, link, read_at): (&Arc<HostHub>, u64, std::time::Instant),
        frames: &[&str],
        replies: &mut Vec<String>,
    ) -> Room {
        let mut core: Option<MutexGuard<'_, SessionCore>> = None;
        let mut route = None;
        // The batch's client frames are spliced one after another into the
        // session's chunk, or a long batch into one allocation of its own
        // (`Run`); a rewritten channel name or number may be longer than
        // the host's.
        let bytes: usize = frames.iter().map(|f| f.len() + ARENA_SLACK).sum();
        let mut run = Run::new(frames.len(), bytes);
        let limits = &self.env.upstream_limits;
        for (at, &text) in frames.iter().enumerate() {
            // While a create's store write is in flight, the rest of the
            // batch waits for its answer (`hold`), behind what was handled.
            if self.holding.load(std::sync::atomic::Ordering::Acquire) {
                route = None;
                if let Some(mut guard) = core.take() {
                    run.commit(self, &mut guard);
                    self.end_batch(&mut guard);
                }
                if self.keep_if_holding(host, link, &frames[at..]) {
                    break;
                }
            }
            // Catalog notifications come from the watch link alone (§6.2): this
            // link's copy is discarded unread, without ending a run of envelopes.
            if wire::is_catalog_notification(text) {
                continue;
            }
            // `classify_host` in two steps, so the fast path's frame is used
            // where it was built (no move of the ~400-byte `Frame` per frame).
            let fast = wire::classify_notification(text, limits);
            let slow;
            let frame = match &fast {
                Some(frame) => frame,
                None => match wire::classify(text, limits) {
                    Ok(frame) => {
                        slow = frame;
                        &slow
                    }
                    Err(e) => {
                        self.env.metrics.upstream_bad_frames.inc();
                        tracing::warn!(host = %host.id, link, error = %e, "host sent an unreadable frame");
                        continue;
                    }
                },
            };
            if let FrameKind::Notification { method } = &frame.kind
                && method == "action"
            {
                let core = core.get_or_insert_with(|| {
                    let mut core = self.lock();
                    self.begin_batch(&mut core);
                    core
                });
                self.on_envelope(core, (host, link), (text, frame), &mut run, &mut route);
                continue;
            }
            route = None;
            if let Some(mut guard) = core.take() {
                run.commit(self, &mut guard);
                self.end_batch(&mut guard);
            }
            if let Some(reply) = self.host_frame(host, link, text, frame) {
                replies.push(reply);
            }
        }
        let mut core = match core {
            Some(mut guard) => {
                run.commit(self, &mut guard);
                self.end_batch(&mut guard);
                guard
            }
            None => self.lock(),
        };
        let latency = core
            .links
            .latency_of(&host.id, &self.env.metrics.host_latency);
        latency.observe(read_at.elapsed().as_secs_f64());
        self.room_locked(&core)
    }

    /// Handles one frame from `host`'s link other than an action envelope;
    /// returns a frame to write back to the host.
    fn host_frame(
        &self,
        host: &Arc<HostHub>,
        link: u64,
        text: &str,
        frame: &Frame<'_>,
    ) -> Option<String> {
        match &frame.kind {
            FrameKind::Notification { method } => {
                match method.as_ref() {
                    "root/progress" => self.on_progress(host, text),
                    "auth/required" => self.on_auth_required(host, text),
                    _ => {} // root/session* come from the watch link alone
                }
                None
            }
            FrameKind::Response { id } | FrameKind::ErrorResponse { id, .. } => {
                if let Some(n) = id.as_u64() {
                    self.on_response(host, link, n, text);
                }
                None
            }
            FrameKind::Request { id, method } => {
                if HOST_REQUESTS.contains(&method.as_ref()) {
                    self.forward_host_request((host, link), id.raw, text);
                    None
                } else {
                    Some(RpcError::method_not_found(method).frame(id.raw))
                }
            }
        }
    }

    /// Sends a host's request to this link's client under a relay-assigned
    /// id (§4.5); a client that does not answer in time leaves the host
    /// with -32603. Client-published URIs in it are never rewritten.
    fn forward_host_request(&self, (host, link): (&Arc<HostHub>, u64), host_id: &str, text: &str) {
        let Ok(mut v) = serde_json::from_str::<Value>(text) else {
            return;
        };
        let mut core = self.lock();
        let n = core.register_host_request((host.id.clone(), link), host_id.to_string());
        if let Some(o) = v.as_object_mut() {
            o.insert("id".into(), serde_json::json!(n));
        }
        self.push(&mut core, v.to_string());
        drop(core);
        let Some(me) = self.registry().and_then(|r| r.session_of(&self.key)) else {
            return;
        };
        let me = Arc::downgrade(&me);
        tokio::spawn(async move {
            tokio::time::sleep(CLIENT_REQUEST_TIMEOUT).await;
            if let Some(me) = me.upgrade() {
                me.answer_host_request(n, None);
            }
        });
    }

    /// Whether the relay awaits the client's answer to its request `n`.
    pub fn awaits_client_answer(&self, n: u64) -> bool {
        self.lock().links.host_requests.contains_key(&n)
    }

    /// Relays the client's answer (`None`: timeout) to request `n` back to
    /// the host that asked, under the host's own id, on the link that
    /// carried the request — open still, or retiring after re-baselining.
    /// A link gone since took the request with it: the answer is dropped
    /// (on a new link the same id may be another request of the host's).
    pub fn answer_host_request(&self, n: u64, answer: Option<&Value>) {
        let (request, link) = {
            let mut core = self.lock();
            let Some(request) = core.links.host_requests.remove(&n) else {
                // A response to an id the relay never sent (or already
                // answered): dropped, counted.
                self.env.metrics.client_notifications_dropped.inc();
                return;
            };
            let open = core.links.open.get(&request.host).into_iter();
            let link = open
                .chain(core.links.retiring.iter())
                .find(|l| l.id == request.link)
                .cloned();
            (request, link)
        };
        let host_id = &request.host_id;
        let frame = match answer {
            Some(v) if v.get("error").is_some() => {
                let error = v.get("error").cloned().unwrap_or(Value::Null);
                format!(r#"{{"jsonrpc":"2.0","id":{host_id},"error":{error}}}"#)
            }
            Some(v) => {
                let result = v.get("result").cloned().unwrap_or(Value::Null);
                format!(r#"{{"jsonrpc":"2.0","id":{host_id},"result":{result}}}"#)
            }
            None => RpcError::internal("the client did not answer in time", None).frame(host_id),
        };
        match link {
            Some(link) => {
                link.send(crate::upstream::link::LinkCmd::Frame(frame));
            }
            None => {
                tracing::debug!(host = %request.host, "answer to a host request after its link closed")
            }
        }
    }

    /// Numbers and delivers one action envelope from `host`'s link `link`,
    /// if that link speaks for its channel and the channel is live (else
    /// holds or drops it). `route` is the previous envelope's route in this
    /// batch: see [`Route`].
    fn on_envelope<'f>(
        &self,
        core: &mut SessionCore,
        (host, link): (&Arc<HostHub>, u64),
        (text, frame): (&'f str, &Frame<'f>),
        run: &mut Run,
        route: &mut Option<Route<'f>>,
    ) {
        let (Some(channel), Some(seq)) = (frame.channel(), frame.params.server_seq.as_ref()) else {
            return;
        };
        if core.attachment.socket.is_none() {
            *route = None;
        }
        // The channel's token as the host wrote it: the same token is the
        // same channel (a differently escaped one is looked up again).
        let token = frame
            .params
            .channel
            .as_ref()
            .and_then(|c| text.get(c.range.clone()));
        let known = route
            .as_ref()
            .is_some_and(|r| Some(r.host_channel) == token);
        // Only the host's current link speaks for its channels: a link being
        // replaced by re-baselining may still deliver a few frames.
        if !known && core.links.open.get(&host.id).map(|l| l.id) != Some(link) {
            return;
        }
        // Host numbers only grow on one connection: an envelope at or below
        // the link's watermark repeats one already accepted (after an
        // upstream replay) and is dropped.
        let watermark = core.links.watermarks.entry(link).or_insert(0);
        if seq.value <= *watermark {
            return;
        }
        *watermark = seq.value;
        if !known {
            *route = None;
            let chans = core.channels.chans.get_mut(&host.id);
            match chans.and_then(|m| m.get_mut(channel)) {
                None => return,
                Some(Chan::Holding { held, ticket, .. }) => {
                    let ticket = *ticket;
                    if held.push(seq.value, text) > self.env.cfg.limits.replay_buffer_bytes {
                        // What was numbered before goes first.
                        run.commit(self, core);
                        self.end_batch(core);
                        self.hold_overflowed(core, host, channel, ticket);
                        self.begin_batch(core);
                    }
                    return;
                }
                Some(Chan::Live {
                    client,
                    token: json,
                    floor,
                }) => {
                    *route = token.map(|host_channel| Route {
                        host_channel,
                        client: client.clone(),
                        client_token: json.clone(),
                        floor: *floor,
                    });
                }
            }
        }
        if let Some(r) = route {
            // Already in the client's snapshot of this channel (`Chan::Live`).
            if seq.value <= r.floor {
                return;
            }
            let client = (&*r.client, Some(&*r.client_token));
            self.deliver(core, host, (text, frame), client, run);
        }
    }

    /// Numbers one host envelope on `client_channel` (whose JSON string
    /// token is `client_token`, when already made) and splices it into
    /// `run`, which delivers it when the run is committed.
    fn deliver(
        &self,
        core: &mut SessionCore,
        host: &Arc<HostHub>,
        (text, frame): (&str, &Frame<'_>),
        (client_channel, client_token): (&str, Option<&str>),
        run: &mut Run,
    ) {
        let relay = &self.env;
        let arena = run.arena(core);
        let rewritten = Self::number_envelope(core, |n| {
            rewrite_envelope(
                (text, frame),
                (client_channel, client_token, n),
                host,
                relay.store.as_ref(),
                (self.identity(), &self.seen),
                arena,
            )
        });
        if let Some(spliced) = rewritten {
            run.push(spliced);
        } else {
            relay.metrics.untranslatable_envelopes.inc();
            tracing::warn!(host = %host.id, "dropped a host envelope that could not be translated");
        }
        if let (Some(ty), Some(channel)) = (&frame.params.action_type, frame.channel())
            && tool_calls::concerns(&ty.value)
        {
            self.note_tool_call(core, host, channel, &ty.value, text);
        }
    }

    /// Keeps the session's owned client tool calls up to date with a
    /// tool-call or turn-ending envelope (§5.7). A call that starts while the
    /// client is away closes the links at once, as detaching would have.
    fn note_tool_call(
        &self,
        core: &mut SessionCore,
        host: &Arc<HostHub>,
        channel: &str,
        action_type: &str,
        text: &str,
    ) {
        let started =
            self.tool_calls
                .on_envelope(&host.id, channel, action_type, text, &self.upstream_id);
        if started && core.attachment.socket.is_none() && core.attachment.detached_at.is_some() {
            tracing::debug!(host = %host.id, "client tool call started while detached: links close");
            self.close_links(core);
        }
    }

    /// Ends hold `ticket` of `host_channel` without a snapshot (its subscribe
    /// failed, timed out, was lost with its link, or answered a socket that
    /// is gone). A hold that replaced a live channel — a second subscribe of
    /// a followed channel — gives it back live from its old floor, the
    /// envelopes held meanwhile delivered now: the client still follows the
    /// channel, and a later `replay` of it misses nothing. Any other hold
    /// is forgotten. A hold another request began since is left alone.
    pub(super) fn end_channel_hold(
        &self,
        core: &mut SessionCore,
        host: &Arc<HostHub>,
        host_channel: &str,
        ticket: u64,
    ) -> HoldEnd {
        match core.channels.hold_of(&host.id, host_channel, ticket) {
            None => HoldEnd::NotMine,
            Some(Some(floor)) => {
                set_held_from(core, &host.id, host_channel, Some(floor));
                self.release(core, host, host_channel);
                HoldEnd::Restored
            }
            Some(None) => {
                if let Some(m) = core.channels.chans.get_mut(&host.id) {
                    m.remove(host_channel);
                }
                HoldEnd::Forgotten
            }
        }
    }

    /// Hold `ticket` of `host_channel` grew past the replay buffer's bound
    /// before its snapshot came (a host streaming the channel while it does
    /// not answer): the request that began it fails now — a `subscribe` with
    /// -32603 `holdLimit` (retryable), an initial subscription is left out of
    /// `initialize` — and the hold ends as a failed subscribe's does: a
    /// channel the client followed goes on live with what was held, any other
    /// is dropped and the host told to unsubscribe. A `reconnect`'s cut hold
    /// has no request of its own to fail: the session's links stop reading
    /// until the cut's answer is written (at most `upstream_settle_secs`
    /// later), then go on from where they paused — nothing is lost, and the
    /// hold keeps at most the bound and one batch.
    fn hold_overflowed(
        &self,
        core: &mut SessionCore,
        host: &Arc<HostHub>,
        host_channel: &str,
        ticket: u64,
    ) {
        let owner = core
            .links
            .pending
            .iter()
            .find_map(|(key, p)| match &p.kind {
                PendingKind::Subscribe { ticket: t, .. }
                | PendingKind::Initial { ticket: t, .. }
                    if *t == ticket =>
                {
                    Some(*key)
                }
                _ => None,
            });
        let Some(p) = owner.and_then(|key| core.links.pending.remove(&key)) else {
            if core.seq.cut_pending && core.links.cut_full.set(true) {
                self.limit_hit("hold");
            }
            return;
        };
        self.limit_hit("hold");
        p.end("hold", None);
        let limit = self.env.cfg.limits.replay_buffer_bytes;
        match p.kind {
            PendingKind::Subscribe { .. } => {
                let err = RpcError::limited(
                    "holdLimit",
                    format!(
                        "host {} sent more than {limit} bytes on the channel before its snapshot",
                        host.id
                    ),
                    true,
                );
                self.respond_error_to(core, &p.reply, &err);
            }
            PendingKind::Initial { reply, .. } => {
                let _ = reply.send(None);
            }
            _ => {}
        }
        if self.end_channel_hold(core, host, host_channel, ticket) == HoldEnd::Forgotten
            && let Some(link) = core.links.open.get(&host.id)
        {
            let params = serde_json::json!({ "channel": host_channel });
            let frame = crate::rpc::notification_frame("unsubscribe", &params);
            link.send(crate::upstream::link::LinkCmd::Frame(frame));
        }
    }

    /// Ends the holding of `host_channel`: envelopes the snapshot already
    /// contains (host seq ≤ its `fromSeq`) are dropped, later ones numbered
    /// after the response just written (contract §5.2).
    pub fn release(&self, core: &mut SessionCore, host: &Arc<HostHub>, host_channel: &str) {
        let Some(chans) = core.channels.chans.get_mut(&host.id) else {
            return;
        };
        let Some(Chan::Holding {
            client, held, from, ..
        }) = chans.remove(host_channel)
        else {
            return;
        };
        let from = from.unwrap_or(0);
        chans.insert(host_channel.to_string(), Chan::live(client.clone(), from));
        for (_, text) in held.into_frames().into_iter().filter(|(s, _)| *s > from) {
            if let Ok(frame) = wire::classify_host(&text, &self.env.upstream_limits) {
                let mut run = Run::new(1, text.len() + ARENA_SLACK);
                self.deliver(core, host, (&text, &frame), (&client, None), &mut run);
                run.commit(self, core);
            }
        }
    }

    fn on_response(&self, host: &Arc<HostHub>, link: u64, n: u64, text: &str) {
        let mut core = self.lock();
        let Some(pending) = core.links.pending.remove(&(link, n)) else {
            return;
        };
        let Ok(v) = serde_json::from_str::<Value>(text) else {
            return;
        };
        let failure = v.get("error").map(host_error);
        match &failure {
            Some(e) => pending.end("error", Some(e.code)),
            None => pending.end("ok", None),
        }
        let answer = Answer {
            host,
            to: pending.reply,
            method: &pending.method,
            failure,
            body: &v,
        };
        match pending.kind {
            PendingKind::Plain => self.answer_plain(&mut core, answer),
            PendingKind::Subscribe {
                host_channel,
                ticket,
                ..
            } if !answer.to.is_attached(&core) => {
                self.drop_stale_subscribe(&mut core, host, &host_channel, ticket);
            }
            PendingKind::Subscribe {
                client_channel,
                host_channel,
                ticket,
            } => {
                let channel = (client_channel, host_channel.as_str(), ticket);
                self.answer_subscribe(&mut core, answer, channel)
            }
            PendingKind::Initial {
                host_channel,
                ticket,
                reply,
            } => self.answer_initial(&mut core, answer, (&host_channel, ticket), reply),
            PendingKind::Create {
                store_key,
                await_catalog,
            } => self.answer_create(core, answer, &store_key, await_catalog),
            PendingKind::Dispose {
                store_key,
                host_uri,
            } => self.answer_dispose(&mut core, answer, store_key.as_deref(), &host_uri),
            PendingKind::Move { host_chat } => self.answer_move(&mut core, answer, &host_chat),
            PendingKind::Authenticate { group } => {
                self.answer_authenticate(&mut core, group, answer.failure)
            }
            PendingKind::Internal { reply } => {
                let result = match answer.failure {
                    Some(err) => Err(err),
                    None => Ok(v.get("result").cloned().unwrap_or(Value::Null)),
                };
                let _ = reply.send(result);
            }
        }
    }

    fn answer_plain(&self, core: &mut SessionCore, a: Answer<'_>) {
        match a.failure {
            Some(err) => self.respond_error_to(core, &a.to, &err),
            None => {
                let result = self.client_result(a.host, a.method, a.body.get("result"));
                self.respond_to(core, &a.to, &result);
            }
        }
    }

    /// A subscribe answered after the socket that asked was replaced or
    /// closed: its snapshot reaches no one and is not adopted (nothing is
    /// baselined). Its own hold ends ([`Self::end_channel_hold`]) — its envelopes
    /// would pile up for a snapshot never written — and if that leaves the
    /// channel unfollowed, the host is told so. A hold another request
    /// began since (a later subscribe, a `reconnect`'s re-baselining)
    /// stays, with the host's subscription it needs.
    fn drop_stale_subscribe(
        &self,
        core: &mut SessionCore,
        host: &Arc<HostHub>,
        host_channel: &str,
        ticket: u64,
    ) {
        self.env.metrics.stale_answers.inc();
        let ended = self.end_channel_hold(core, host, host_channel, ticket);
        if ended == HoldEnd::Forgotten
            && let Some(link) = core.links.open.get(&host.id)
        {
            let params = serde_json::json!({ "channel": host_channel });
            let frame = crate::rpc::notification_frame("unsubscribe", &params);
            link.send(crate::upstream::link::LinkCmd::Frame(frame));
        }
    }

    /// A subscribe's snapshot is written, then the envelopes held since it
    /// was forwarded are released after it (§5.2).
    fn answer_subscribe(
        &self,
        core: &mut SessionCore,
        a: Answer<'_>,
        (client_channel, host_channel, ticket): (String, &str, u64),
    ) {
        if let Some(err) = a.failure {
            // The answer first, then what the hold gives back (§5.2's
            // order). A later subscribe of the channel may hold it for its
            // own snapshot: only this subscribe's hold ends.
            self.respond_error_to(core, &a.to, &err);
            self.end_channel_hold(core, a.host, host_channel, ticket);
            return;
        }
        // Decided again as the answer arrives (§7.6): a policy reloaded, a
        // token renewed or a chat moved while the host answered may have
        // hidden the channel, and nothing of it may reach the client then —
        // the same error as a subscribe of a channel it never saw.
        if let Err(err) = router::host_for(&self.env, self.who().caller(), &client_channel) {
            self.respond_error_to(core, &a.to, &err);
            self.unfollow(core, &a.host.id, host_channel);
            core.channels.subs.remove(&client_channel);
            core.channels.baselined.remove(&client_channel);
            return;
        }
        // An `unsubscribe` sent while the host answered removed the hold:
        // the request still gets its snapshot, but the session neither
        // follows nor baselines the channel — a later `reconnect` listing
        // it gets a snapshot, not a replay without what it missed.
        let followed = core
            .channels
            .chans
            .get(&a.host.id)
            .is_some_and(|m| m.contains_key(host_channel));
        let snapshot = a.body.pointer("/result/snapshot");
        let (snapshot, from) = self.client_snapshot(a.host, snapshot, &client_channel, core.last());
        set_held_from(core, &a.host.id, host_channel, from);
        let result = match snapshot {
            Some(s) => serde_json::json!({ "snapshot": s }).to_string(),
            None => "{}".to_string(),
        };
        self.respond_to(core, &a.to, &result);
        if followed {
            core.channels.baselined.insert(client_channel.clone());
            core.channels.subs.insert(client_channel);
            self.release(core, a.host, host_channel);
        }
    }

    /// Stops following `host_channel` whatever holds it (a channel the
    /// principal can no longer see): its state is removed and the host told.
    pub(super) fn unfollow(&self, core: &mut SessionCore, host: &str, host_channel: &str) {
        if let Some(m) = core.channels.chans.get_mut(host) {
            m.remove(host_channel);
        }
        if let Some(link) = core.links.open.get(host) {
            let params = serde_json::json!({ "channel": host_channel });
            let frame = crate::rpc::notification_frame("unsubscribe", &params);
            link.send(crate::upstream::link::LinkCmd::Frame(frame));
        }
    }

    /// An `initialSubscriptions` snapshot goes to the waiting `initialize`,
    /// which releases the held envelopes after its answer.
    fn answer_initial(
        &self,
        core: &mut SessionCore,
        a: Answer<'_>,
        (host_channel, ticket): (&str, u64),
        reply: oneshot::Sender<Option<Value>>,
    ) {
        let client = core
            .channels
            .chans
            .get(&a.host.id)
            .and_then(|m| m.get(host_channel))
            .map(|c| c.client().to_string())
            .unwrap_or_default();
        // Decided again now (§7.6), before its snapshot notes anything it
        // shows: a channel hidden while awaited is left out, as never seen.
        let hidden = || router::host_for(&self.env, self.who().caller(), &client).is_err();
        let snap = if a.failure.is_some() {
            self.end_channel_hold(core, a.host, host_channel, ticket);
            None
        } else if hidden() {
            self.unfollow(core, &a.host.id, host_channel);
            None
        } else {
            let snapshot = a.body.pointer("/result/snapshot");
            let (snapshot, from) = self.client_snapshot(a.host, snapshot, &client, 0);
            set_held_from(core, &a.host.id, host_channel, from);
            snapshot
        };
        let _ = reply.send(snap);
    }

    /// A create confirms its store entry (or releases it on failure) before
    /// it is answered, off the edge thread, the session holding its links'
    /// later frames until then (§4.5 order, `hold`); a session create is
    /// answered once the catalog lists it (§6.3).
    fn answer_create(
        &self,
        mut core: MutexGuard<'_, SessionCore>,
        a: Answer<'_>,
        store_key: &str,
        await_catalog: Option<String>,
    ) {
        let answer = CreateAnswer {
            host: a.host.clone(),
            to: a.to,
            failure: a.failure,
            await_catalog,
        };
        self.commit_create(&mut core, store_key, answer);
    }

    /// A dispose of a client-chosen URI leaves a tombstone (§4.2); a
    /// disposed session or chat is no longer listed (§6.3).
    fn answer_dispose(
        &self,
        core: &mut SessionCore,
        a: Answer<'_>,
        store_key: Option<&str>,
        host_uri: &str,
    ) {
        if a.failure.is_none() {
            self.unlist_disposed(a.host, host_uri);
        }
        if a.failure.is_none()
            && let Some(key) = store_key
        {
            let ttl = self.env.cfg.relay.tombstone_ttl_secs;
            let now = crate::identity::unix_now();
            // Off the runtime (an fsync): the name is taken before and after,
            // so nothing waits for this write.
            let (store, key) = (self.env.store.clone(), key.to_string());
            let (registry, host) = (self.registry(), a.host.id.clone());
            tokio::spawn(async move {
                let _ = tokio::task::spawn_blocking(move || store.tombstone(&key, now, ttl)).await;
                // Once tombstoned, what the disposed object showed is gone
                // for everyone (§7.6): a terminal it claimed among them.
                if let Some(r) = registry {
                    r.after_dispose(&host);
                }
            });
        }
        self.answer_plain(core, a);
    }

    /// The host disposed `host_uri`: a session leaves `listSessions` and
    /// root's count, a chat its session's summaries, before the answer
    /// reaches the client (§6.3), though the host's removal or summary
    /// change may still be on its way to the watch link.
    fn unlist_disposed(&self, host: &HostHub, host_uri: &str) {
        match channel_kind(host_uri) {
            ChannelKind::Session => {
                host.update(|v| v.mark_disposed(host_uri));
                // Off this session's lock, which a root follower's recount
                // (this client's own among them) takes.
                if let Some(r) = self.registry() {
                    tokio::spawn(async move { r.fan_root(&[RootField::ActiveSessions]) });
                }
            }
            ChannelKind::Chat => host.update(|v| v.mark_chat_disposed(host_uri)),
            ChannelKind::Terminal | ChannelKind::Other => {}
        }
    }

    /// A chat moved (§7.6): the host's answer names its session. The
    /// relay's index puts the chat there before the answer reaches the
    /// client, so every later decision (a `subscribe`, a `reconnect`) is the
    /// new session's; its live subscribers are re-evaluated right after, on
    /// another task. Neither waits for the host's summary changes, which
    /// may still be on their way to the watch link.
    fn answer_move(&self, core: &mut SessionCore, a: Answer<'_>, host_chat: &str) {
        let session = a.body.pointer("/result/session").and_then(Value::as_str);
        if a.failure.is_none()
            && let Some(session) = session
            && a.host.update(|v| v.move_chat(host_chat, session))
            && let Some(r) = self.registry()
        {
            // Off this session's lock, which the re-evaluation takes.
            let (host, chat) = (a.host.id.clone(), host_chat.to_string());
            tokio::spawn(async move { r.chat_moved(&host, &chat) });
        }
        self.answer_plain(core, a);
    }

    /// Answers a `createSession` once the watch catalog lists the session,
    /// so a `listSessions` right after includes it (contract §6.3); gives up
    /// waiting after a bound and answers anyway.
    pub(super) fn respond_after_catalog(&self, host: Arc<HostHub>, host_uri: String, to: ReplyTo) {
        let Some(me) = self.registry().and_then(|r| r.session_of(&self.key)) else {
            return;
        };
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(3);
            loop {
                let changed = host.catalog_changed.notified();
                if host.has_session(&host_uri) || tokio::time::Instant::now() >= deadline {
                    break;
                }
                let _ = tokio::time::timeout_at(deadline, changed).await;
            }
            let mut core = me.lock();
            me.respond_to(&mut core, &to, "null");
        });
    }

    /// Host → client names for a frame to this session from `host`, noting
    /// the host objects it shows the client `at` (§7.1).
    fn noting<'a>(&'a self, host: &'a HostHub, at: ShownIn<'a>) -> Noting<'a> {
        Noting {
            to_client: ToClient {
                host: &host.id,
                store: self.env.store.as_ref(),
                identity: Some(self.identity()),
            },
            seen: &self.seen,
            at,
        }
    }

    /// The client form of a host result.
    fn client_result(&self, host: &Arc<HostHub>, method: &str, result: Option<&Value>) -> String {
        let mut result = result.cloned().unwrap_or(Value::Null);
        let namer = self.noting(host, ShownIn::Answer(&host.id));
        if translate::translate(&mut result, &format!("result:{method}"), &namer).is_err() {
            return "null".into();
        }
        result.to_string()
    }

    /// The client form of a host snapshot, numbered `from` (the session's
    /// last number), and the host `fromSeq` it was taken at.
    pub(super) fn client_snapshot(
        &self,
        host: &Arc<HostHub>,
        snap: Option<&Value>,
        client_channel: &str,
        from: u64,
    ) -> (Option<Value>, Option<u64>) {
        let Some(snap) = snap else {
            return (None, None);
        };
        let host_from = snap.get("fromSeq").and_then(Value::as_u64);
        let mut state = snap.get("state").cloned().unwrap_or(Value::Null);
        if let Some(host_channel) = snap.get("resource").and_then(Value::as_str) {
            self.tool_calls
                .on_snapshot(&host.id, host_channel, &state, &self.upstream_id);
        }
        let namer = self.noting(host, ShownIn::Channel(client_channel));
        if let Some(shape) = state_shape(client_channel)
            && translate::translate(&mut state, shape, &namer).is_err()
        {
            return (None, host_from);
        }
        let snapshot =
            serde_json::json!({"resource": client_channel, "state": state, "fromSeq": from});
        (Some(snapshot), host_from)
    }

    fn on_progress(&self, host: &Arc<HostHub>, text: &str) {
        let Ok(mut v) = serde_json::from_str::<Value>(text) else {
            return;
        };
        let prefix = format!("{}:", self.upstream_id);
        let Some(token) = v.pointer_mut("/params/progressToken") else {
            return;
        };
        let Some(own) = token
            .as_str()
            .and_then(|t| t.strip_prefix(&prefix))
            .map(str::to_string)
        else {
            return; // another connection's progress (hosts that broadcast it)
        };
        *token = Value::String(own);
        if !self.channel_to_client(host, &mut v) {
            return;
        }
        let mut core = self.lock();
        self.push(&mut core, v.to_string());
    }

    /// A host's `auth/required` on this session's link: delivered only if
    /// it concerns this session (`auth_required_concerns`, which also
    /// forgets an expired token) and names the root or a channel this
    /// client can see, with its channel translated.
    fn on_auth_required(&self, host: &Arc<HostHub>, text: &str) {
        let Ok(mut v) = serde_json::from_str::<Value>(text) else {
            return;
        };
        let resource = v
            .pointer("/params/resource/resource")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let reason = v.pointer("/params/reason").and_then(Value::as_str);
        let mut core = self.lock();
        if !self.auth_required_concerns(&mut core, host, resource, reason) {
            return; // another session's (hosts that broadcast it)
        }
        drop(core);
        if !self.channel_to_client(host, &mut v) {
            return;
        }
        let mut core = self.lock();
        self.push(&mut core, v.to_string());
    }

    /// Translates a host notification's `params.channel` to the client's
    /// name; `false` when it names a channel this client cannot see, which
    /// is not its business (§6.4): the notification is dropped.
    fn channel_to_client(&self, host: &Arc<HostHub>, v: &mut Value) -> bool {
        let namer = ToClient {
            host: &host.id,
            store: self.env.store.as_ref(),
            identity: Some(self.identity()),
        };
        let Some(ch) = v.pointer_mut("/params/channel") else {
            return true;
        };
        let Some(s) = ch.as_str() else {
            return true;
        };
        let q =
            translate::Namer::translate(&namer, translate::FieldKind::Uri, s).unwrap_or_default();
        let root = q == ahp_types::ROOT_RESOURCE_URI;
        if !root && crate::route::router::host_for(&self.env, self.who().caller(), &q).is_err() {
            return false;
        }
        *ch = Value::String(q);
        true
    }

    /// Fails the requests in flight on link `link` with `err` (its
    /// connection dropped or never opened: their answers will never come).
    pub fn fail_link_requests(&self, link: u64, err: &RpcError) {
        let mut core = self.lock();
        self.fail_link_requests_locked(&mut core, link, err);
    }

    /// [`ClientSession::fail_link_requests`] under a lock already held.
    pub fn fail_link_requests_locked(&self, core: &mut SessionCore, link: u64, err: &RpcError) {
        let ids: Vec<(u64, u64)> = core
            .links
            .pending
            .keys()
            .filter(|(l, _)| *l == link)
            .cloned()
            .collect();
        for key in ids {
            let Some(p) = core.links.pending.remove(&key) else {
                continue;
            };
            p.end("lost", Some(err.code));
            match p.kind {
                PendingKind::Initial { reply, .. } => {
                    let _ = reply.send(None);
                }
                PendingKind::Create { .. } => {
                    // Lost with its link, not refused: the entry stays
                    // pending until `settle.rs` reads the host's lists.
                    self.respond_error_to(core, &p.reply, err);
                }
                PendingKind::Authenticate { group } => {
                    self.answer_authenticate(core, group, Some(err.clone()));
                }
                PendingKind::Internal { reply } => {
                    let _ = reply.send(Err(err.clone()));
                }
                PendingKind::Subscribe {
                    host_channel,
                    ticket,
                    ..
                } => {
                    unhold_lost(self, core, link, (&host_channel, ticket));
                    self.respond_error_to(core, &p.reply, err);
                }
                _ => self.respond_error_to(core, &p.reply, err),
            }
        }
    }

    /// What an upstream `reconnect` of link `link` needs: its watermark and
    /// the host channels it follows (root included); `None` when the link
    /// should not be resumed (replaced, or the client is detached — a link
    /// that drops while its client is away stays closed, §5.8).
    pub(super) fn link_resume_plan(
        &self,
        host: &Arc<HostHub>,
        link: u64,
    ) -> Option<(u64, Vec<String>)> {
        let core = self.lock();
        if core.links.open.get(&host.id).map(|l| l.id) != Some(link) || core.socket_id().is_none() {
            return None;
        }
        let mut channels = vec![ahp_types::ROOT_RESOURCE_URI.to_string()];
        channels.extend(
            core.channels
                .chans
                .get(&host.id)
                .into_iter()
                .flat_map(|m| m.keys().cloned()),
        );
        Some((
            core.links.watermarks.get(&link).copied().unwrap_or(0),
            channels,
        ))
    }

    /// A link to `host` failed to open (`was_up` false) or dropped: requests
    /// in flight fail, and a client that followed channels there is told to
    /// resynchronise (4000) because continuity is lost (contract §5.8).
    pub(super) fn link_down(&self, host: &Arc<HostHub>, link: u64, was_up: bool) {
        let err = if was_up {
            RpcError::upstream_lost(&host.id)
        } else {
            RpcError::host_unavailable(&host.id)
        };
        self.fail_link_requests(link, &err);
        let mut core = self.lock();
        if core.links.open.get(&host.id).map(|l| l.id) != Some(link) {
            return; // an older link, already replaced
        }
        core.links.open.remove(&host.id);
        let lost = core.lose_host_channels(&host.id);
        let attached = core.socket_id();
        drop(core);
        if let (true, false, Some(socket)) = (was_up, lost.is_empty(), attached) {
            self.env
                .metrics
                .resyncs
                .with_label_values(&["host_link_lost"])
                .inc();
            let Some(registry) = self.registry() else {
                return;
            };
            let delay = registry.resync_delay(&self.upstream_id);
            let Some(me) = self.registry().and_then(|r| r.session_of(&self.key)) else {
                return;
            };
            let me = Arc::downgrade(&me);
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                if let Some(me) = me.upgrade() {
                    me.close_socket(socket, Close::ResyncHostLost);
                }
            });
        }
    }
}

/// The client frame for a host envelope numbered `n` on `client_channel`
/// (whose JSON string token is `client_token`, when already made),
/// spliced at the end of `arena` (where it lies is returned), or `None`
/// if a name in it cannot be translated (then nothing is written).
pub fn rewrite_envelope(
    (text, frame): (&str, &Frame<'_>),
    (client_channel, client_token, n): (&str, Option<&str>, &wire::Decimal),
    host: &HostHub,
    store: &dyn crate::names::store::UriStore,
    (identity, seen): ((&str, &str), &crate::names::seen::Seen),
    arena: &mut BytesMut,
) -> Option<wire::Piece> {
    let p = &frame.params;
    let own = p
        .origin_client_id
        .as_ref()
        .filter(|o| o.value == identity.0);
    let translated = p
        .action_type
        .as_ref()
        .filter(|ty| translate::rows(&ty.value).is_some());
    if own.is_none() && translated.is_none() {
        // Nearly every envelope: its two routed values, spliced without a
        // list of edits (the channel's token made once per batch: `Route`).
        let token = client_token.map_or(EditValue::JsonString(client_channel), EditValue::Raw);
        let channel = (p.channel.as_ref()?.range.clone(), token);
        let seq = (p.server_seq.as_ref()?.range.clone(), n);
        return wire::splice_routed_at(text, channel, seq, arena).ok();
    }
    let mut edits = Edits::default();
    edits.push(Edit {
        range: p.channel.as_ref()?.range.clone(),
        replacement: EditValue::JsonString(client_channel),
    })?;
    edits.push(Edit {
        range: p.server_seq.as_ref()?.range.clone(),
        replacement: EditValue::U64(n.value()),
    })?;
    if let Some(origin) = own {
        edits.push(Edit {
            range: origin.range.clone(),
            replacement: EditValue::JsonString(identity.1),
        })?;
    }
    let rewritten_action;
    if let (Some(ty), Some(range)) = (translated, &p.action) {
        let namer = Noting {
            to_client: ToClient {
                host: &host.id,
                store,
                identity: Some(identity),
            },
            seen,
            at: ShownIn::Channel(client_channel),
        };
        rewritten_action = translated_action(text.get(range.clone())?, &ty.value, &namer)?;
        edits.retain_outside(range);
        edits.push(Edit {
            range: range.clone(),
            replacement: EditValue::Raw(&rewritten_action),
        })?;
    }
    wire::splice_at(text, edits.as_mut(), arena).ok()
}

/// A run of envelopes spliced one after another into one buffer: each is
/// numbered as it is spliced, and all are committed (buffered, queued)
/// together when the run ends, before anything else is numbered or written
/// for the session (the session lock is held from the first splice to the
/// commit). Their texts then share the buffer, in order, so the socket
/// writer hands neighbours to TLS as one slice, and each costs a reference
/// count instead of an allocation.
///
/// The buffer is the session's chunk (`session::chunk`): runs follow one
/// another in it, so a paced stream's envelopes (a run of one each) take
/// their bytes from a few shared allocations, not one each. A run expecting
/// more than half a chunk is spliced into an allocation of its own, sized
/// for it (exactly, for a lone envelope), as nothing follows it there.
pub(super) struct Run {
    arena: BytesMut,
    /// Bytes the run's envelopes are expected to take.
    expected: usize,
    envelopes: usize,
    source: Source,
    /// The latest envelope spliced, and those before it in order: a run of
    /// one (every paced envelope) allocates nothing.
    latest: Option<(u64, wire::Piece)>,
    earlier: Vec<(u64, wire::Piece)>,
}

/// Where a run's buffer comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// Not taken yet: taken at the first splice, under the session lock.
    None,
    /// The session's chunk, given back at each commit.
    Chunk,
    /// An allocation of the run's own.
    Own,
}

impl Run {
    /// A run of up to `envelopes` (more only grow it) expected to take
    /// `bytes` once spliced.
    pub(super) fn new(envelopes: usize, bytes: usize) -> Self {
        Self {
            arena: BytesMut::new(),
            expected: bytes,
            envelopes,
            source: Source::None,
            latest: None,
            earlier: Vec::with_capacity(envelopes.saturating_sub(1)),
        }
    }

    /// The buffer to splice into: the session's chunk, or the run's own.
    fn arena(&mut self, core: &mut SessionCore) -> &mut BytesMut {
        if self.source == Source::None {
            let limit = Chunk::limit(core.seq.buffer.max_bytes());
            if Chunk::suits(self.expected, limit) {
                self.arena = core.seq.issuing().chunk.take(self.expected, limit);
                self.source = Source::Chunk;
            } else {
                // A lone envelope's splice sizes an empty buffer exactly:
                // no slack kept in its replay buffer.
                let room = if self.envelopes > 1 { self.expected } else { 0 };
                self.arena = BytesMut::with_capacity(room);
                self.source = Source::Own;
            }
        }
        &mut self.arena
    }

    /// Adds the envelope numbered `n`, spliced into the arena at `piece`.
    fn push(&mut self, (n, piece): (u64, wire::Piece)) {
        if let Some(before) = self.latest.replace((n, piece)) {
            self.earlier.push(before);
        }
    }

    /// Buffers and delivers the run's envelopes, in the order they were
    /// numbered, and empties the run (the session's chunk given back).
    pub(super) fn commit(&mut self, session: &ClientSession, core: &mut SessionCore) {
        let latest = self.latest.take();
        // An own buffer holding exactly what was spliced is taken whole:
        // one allocation of that size, not shared until a second text
        // needs it.
        let mut whole = if self.source == Source::Own && self.arena.len() == self.arena.capacity() {
            std::mem::take(&mut self.arena).freeze()
        } else {
            self.arena.split().freeze()
        };
        if self.source == Source::Chunk {
            let rest = std::mem::take(&mut self.arena);
            core.seq.issuing().chunk.give_back(rest);
            self.source = Source::None;
        }
        let Some((last_n, last)) = latest else {
            return;
        };
        for (n, piece) in self.earlier.drain(..) {
            session.commit_envelope(core, n, Text::in_batch(&whole, piece));
        }
        // The last text takes the buffer itself: no reference count.
        whole.truncate(last.end());
        session.commit_envelope(core, last_n, Text::last_in_batch(whole, last));
    }
}

/// The action object `action` (JSON text) of type `ty` with its names in
/// client form (`None` if one cannot be translated).
fn translated_action(action: &str, ty: &str, namer: &Noting<'_>) -> Option<String> {
    let mut action: Value = serde_json::from_str(action).ok()?;
    if crate::names::namer::REMOVALS.contains(&ty) {
        let to_client = &namer.to_client;
        let removal = crate::names::namer::Removal::new(namer, to_client.store, to_client.host);
        translate::translate(&mut action, ty, &removal).ok()?;
    } else {
        translate::translate(&mut action, ty, namer).ok()?;
    }
    Some(action.to_string())
}

/// Where the envelopes of a batch on one host channel go: the channel's
/// client form, once its host form was found live on the link that speaks
/// for it. The next envelope on the same channel skips the lookups (about a
/// tenth of a streamed envelope's cost).
///
/// Valid while the session lock taken for the batch is held and a client is
/// attached: the lock keeps subscribes, unsubscribes and link changes out,
/// and what an envelope may change under it (a detached session losing or
/// closing its links) happens only without a client, when the route is
/// dropped and every envelope is looked up again.
struct Route<'f> {
    /// The host channel's token (quotes included) in the host's frame.
    host_channel: &'f str,
    client: Arc<str>,
    /// `client` as a JSON string token (quoted, escaped), made when the
    /// channel went live ([`Chan::live`]).
    client_token: Arc<str>,
    /// The channel's snapshot floor ([`Chan::Live`]).
    floor: u64,
}

/// Bytes a client frame may grow by over its host frame without the batch's
/// arena growing (a longer channel name, number or client id). The unused
/// rest stays allocated as long as the batch's last envelope is buffered;
/// a batch that needs more gets a second allocation, no error.
const ARENA_SLACK: usize = 32;

/// The (at most four) edits of one envelope, on the stack.
struct Edits<'e> {
    slots: [Edit<'e>; 4],
    used: usize,
}

impl Default for Edits<'_> {
    fn default() -> Self {
        Self {
            slots: std::array::from_fn(|_| Edit {
                range: 0..0,
                replacement: EditValue::U64(0),
            }),
            used: 0,
        }
    }
}

impl<'e> Edits<'e> {
    /// Adds `edit`; `None` if four are there already.
    fn push(&mut self, edit: Edit<'e>) -> Option<()> {
        *self.slots.get_mut(self.used)? = edit;
        self.used += 1;
        Some(())
    }

    /// Drops the edits that fall inside `range` (it is replaced whole).
    fn retain_outside(&mut self, range: &std::ops::Range<usize>) {
        let mut kept = 0;
        for i in 0..self.used {
            let e = &self.slots[i].range;
            if !(e.start >= range.start && e.end <= range.end) {
                self.slots.swap(kept, i);
                kept += 1;
            }
        }
        self.used = kept;
    }

    fn as_mut(&mut self) -> &mut [Edit<'e>] {
        &mut self.slots[..self.used]
    }
}

/// The client-facing form of a host's error object: code kept, `data` only
/// for auth-required (its entries are https resource ids), and a message
/// naming host URIs replaced by a generic text (contract §4.4).
fn host_error(e: &Value) -> RpcError {
    let code = e
        .get("code")
        .and_then(Value::as_i64)
        .and_then(|c| i32::try_from(c).ok())
        .unwrap_or(-32603);
    let message = e
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("host error");
    let message = if message.contains(":/") {
        "the host refused the request".to_string()
    } else {
        message.to_string()
    };
    let data = (code == ahp_types::errors::ahp_error_codes::AUTH_REQUIRED)
        .then(|| e.get("data").cloned())
        .flatten();
    RpcError::with_code(code, message, data)
}

/// A host's answer to a forwarded request, as the session handles it.
struct Answer<'a> {
    host: &'a Arc<HostHub>,
    /// Where the answer goes.
    to: ReplyTo,
    method: &'a str,
    /// The translated error, if the host failed the request.
    failure: Option<RpcError>,
    /// The whole answer frame.
    body: &'a Value,
}

/// How [`ClientSession::end_channel_hold`] ended a hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HoldEnd {
    /// Another request holds the channel since, or it is live: untouched.
    NotMine,
    /// The channel is no longer followed.
    Forgotten,
    /// The channel is live again from the snapshot the client had.
    Restored,
}

/// Stops holding `host_channel` for a subscribe lost with link `link`, if
/// that link is still its host's current one (it resumes, §5.8): the snapshot
/// will never come, and a hold left behind would keep the channel in the
/// resumed link's subscriptions and every envelope of it held, unbounded.
/// On a replaced link the hold is the re-baselining's, and stays (as does
/// one a later subscribe began).
fn unhold_lost(
    session: &ClientSession,
    core: &mut SessionCore,
    link: u64,
    (host_channel, ticket): (&str, u64),
) {
    let Some(host) = core
        .links
        .open
        .values()
        .find(|l| l.id == link)
        .map(|l| l.host.clone())
    else {
        return;
    };
    session.end_channel_hold(core, &host, host_channel, ticket);
}

/// Records the snapshot's host `fromSeq` on a held channel (§5.2).
fn set_held_from(core: &mut SessionCore, host: &str, host_channel: &str, from: Option<u64>) {
    if let Some(Chan::Holding { from: f, .. }) = core
        .channels
        .chans
        .get_mut(host)
        .and_then(|m| m.get_mut(host_channel))
    {
        *f = from;
    }
}

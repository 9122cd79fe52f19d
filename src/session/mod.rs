//! Client sessions (contract §2, §5): one per `(principal, clientId)`.
//!
//! A session owns the client's single sequence (from S0), its replay buffer,
//! its subscriptions, the map of its requests in flight on links, the state
//! of each host channel it follows (held while a subscribe is in flight, then
//! live), and its lazily opened links. Everything that reaches the client
//! goes through [`ClientSession::push`] under the session lock, so numbering
//! and delivery order are one and the same.

mod authenticate;
pub mod buffer;
mod chunk;
mod core;
pub mod envelope;
mod fanout;
mod hold;
mod limits;
mod links;
pub mod outbox;
pub mod reconnect;
pub mod registry;
pub mod request;
pub mod sequence;
mod settle;
pub mod status;
pub mod tool_calls;
mod visibility;

use std::sync::{Arc, Mutex, MutexGuard, Weak};

use crate::wire::{self, Text};
use serde_json::{Value, json};
use tokio::sync::{oneshot, watch};

pub use self::core::SessionCore;
pub use crate::identity::PrincipalKey;
use crate::route::{Caller, Env};
use crate::rpc::{Close, RpcError};
pub use chunk::{on_tidy, prefault};
pub use registry::Registry;

/// A session's identity: principal plus the client's own `clientId`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionKey {
    /// The principal.
    pub principal: PrincipalKey,
    /// The `clientId` the client chose.
    pub client_id: String,
}

/// Where the answer to a client's request goes: its id on the socket that
/// sent it. An answer is written only while that socket is attached: a
/// socket attached since never sent the request (its ids are its own, and a
/// `reconnect`'s answer is the first frame it gets, §5.5). The relay's own
/// requests are answered to no one ([`ReplyTo::nobody`]).
#[derive(Debug, Clone)]
pub struct ReplyTo {
    /// The request id, exact JSON text (echoed byte for byte).
    pub id: String,
    /// The socket that sent the request.
    pub socket: Option<u64>,
}

impl ReplyTo {
    /// Request `id` from socket `socket`.
    pub fn new(id: &str, socket: u64) -> Self {
        Self {
            id: id.to_string(),
            socket: Some(socket),
        }
    }

    /// A request of the relay's own: its answer goes to no client.
    pub fn nobody() -> Self {
        Self {
            id: "null".to_string(),
            socket: None,
        }
    }

    /// Whether the asking socket is the one attached now (and not told to
    /// close).
    pub fn is_attached(&self, core: &SessionCore) -> bool {
        self.socket.is_some() && core.answering_socket() == self.socket
    }
}

/// A request forwarded on a link, waiting for the host's answer.
#[derive(Debug)]
pub struct Pending {
    /// Where the answer goes.
    pub reply: ReplyTo,
    /// The method, for result translation and errors.
    pub method: String,
    /// What to do with the answer.
    pub kind: PendingKind,
    /// The client request's span ([`crate::otel::current_request`]), kept
    /// open until the answer: disabled unless traces are exported.
    pub span: tracing::Span,
}

impl Pending {
    /// Records on the request's span how the host's side ended: `ok`,
    /// `error` (with the code), `timeout` or `lost` (the link went). The
    /// span ends when the pending entry is dropped.
    pub fn end(&self, answer: &'static str, code: Option<i32>) {
        if self.span.is_disabled() {
            return;
        }
        self.span.record("ahp.answer", answer);
        if let Some(code) = code {
            self.span.record("rpc.jsonrpc.error_code", code);
            self.span.record("otel.status_code", "ERROR");
        }
    }
}

/// What a forwarded request needs when its answer arrives.
#[derive(Debug)]
pub enum PendingKind {
    /// Relay the (translated) answer.
    Plain,
    /// A subscribe: answer with the snapshot, then release held envelopes.
    Subscribe {
        /// Client form of the channel.
        client_channel: String,
        /// Host form of the channel.
        host_channel: String,
        /// The hold this subscribe began.
        ticket: u64,
    },
    /// A subscribe issued for `initialize`'s `initialSubscriptions`: the
    /// translated snapshot goes to the initializer, which releases later.
    Initial {
        /// Host form of the channel.
        host_channel: String,
        /// The hold this subscribe began.
        ticket: u64,
        /// Receives the snapshot (client form) or nothing on failure.
        reply: oneshot::Sender<Option<Value>>,
    },
    /// A create of a client-chosen URI: confirm or release the store entry.
    Create {
        /// The store key.
        store_key: String,
        /// For sessions: wait until the watch catalog lists this host URI.
        await_catalog: Option<String>,
    },
    /// One leg of an `authenticate` (§4.6): `group` names the client request
    /// waiting for every leg; `None` for a token replayed on a new link.
    Authenticate {
        /// The waiting client request, if any.
        group: Option<u64>,
    },
    /// A dispose: tombstone the store entry if the URI was client-chosen,
    /// and stop listing a disposed session (§6.3).
    Dispose {
        /// The store key, if the URI is a store entry.
        store_key: Option<String>,
        /// The disposed object's host URI.
        host_uri: String,
    },
    /// A chat move (§7.6): on success the chat is decided by the session
    /// the answer names.
    Move {
        /// The chat's host URI.
        host_chat: String,
    },
    /// The relay's own request on the client's link (a `resourceResolve`
    /// confirming a scoped path, `route::files`): the host's raw result, or
    /// its error, goes to the waiting request; nothing reaches the client.
    Internal {
        /// Receives the host's result (host names, untranslated) or error.
        reply: oneshot::Sender<Result<Value, RpcError>>,
    },
}

/// The host frames a hold keeps until its snapshot (with their host
/// `serverSeq`), and their bytes: a hold is bounded by the session's replay
/// buffer (`ClientSession::hold_overflowed`).
#[derive(Debug, Default)]
pub struct Held {
    frames: Vec<(u64, String)>,
    bytes: usize,
}

impl Held {
    /// Keeps `text`, numbered `seq` by its host; returns the bytes now held.
    pub fn push(&mut self, seq: u64, text: &str) -> usize {
        self.bytes += text.len();
        self.frames.push((seq, text.to_string()));
        self.bytes
    }

    /// The held frames, in the order they arrived.
    pub fn into_frames(self) -> Vec<(u64, String)> {
        self.frames
    }
}

/// The state of one host channel the session follows.
#[derive(Debug)]
pub enum Chan {
    /// Subscribe in flight: envelopes are held with their host `serverSeq`
    /// (contract §5.2) until the snapshot is written.
    Holding {
        /// Client form of the channel.
        client: Arc<str>,
        /// Held host frames.
        held: Held,
        /// The snapshot's host `fromSeq`, once the answer arrived.
        from: Option<u64>,
        /// Which hold this is (`core::Channels::hold`): a request that began a
        /// hold may end it only while it is still its own — a later
        /// subscribe of the channel, or a `reconnect`'s re-baselining, may
        /// have replaced it with a hold of its own.
        ticket: u64,
        /// The floor of the live channel this hold replaced (a second
        /// subscribe of a followed channel): a hold that ends without a
        /// snapshot gives the channel back live from there, its held
        /// envelopes delivered (`ClientSession::end_channel_hold`).
        prior: Option<u64>,
    },
    /// Envelopes are numbered and delivered as they arrive.
    Live {
        /// Client form of the channel (shared: every envelope's delivery
        /// takes it without copying).
        client: Arc<str>,
        /// `client` as a JSON string token (quoted, escaped), made once
        /// when the channel went live rather than per delivered batch.
        token: Arc<str>,
        /// The host `fromSeq` of the snapshot the client has of this
        /// channel: an envelope numbered at or below it is already in that
        /// snapshot and is dropped. The link's watermark does not cover
        /// this — a channel subscribed after the link's last envelope has a
        /// snapshot above it, and an upstream replay from the watermark
        /// repeats the channel's actions up to the snapshot (§5.2, §5.8).
        floor: u64,
    },
}

impl Chan {
    /// A live channel whose client form is `client`, whose snapshot was
    /// taken at host `fromSeq` `floor`.
    pub fn live(client: Arc<str>, floor: u64) -> Self {
        let mut token = String::with_capacity(client.len() + 2);
        crate::wire::json_escape_into(&mut token, &client);
        Chan::Live {
            client,
            token: token.into(),
            floor,
        }
    }

    /// The channel's client form.
    pub fn client(&self) -> &str {
        match self {
            Chan::Holding { client, .. } | Chan::Live { client, .. } => client,
        }
    }
}

/// The client socket a session writes to.
#[derive(Debug)]
pub struct Socket {
    /// The socket's id (cursors are bound to it).
    pub id: u64,
    /// Frames to the client (bounded by frames and bytes).
    pub out: outbox::Outbox,
    /// Closes the client socket with a code and reason.
    pub kill: watch::Sender<Option<Close>>,
}

impl Drop for ClientSession {
    fn drop(&mut self) {
        let bytes = self.lock().buffer_usage().1;
        self.env.metrics.buffer_bytes.sub(bytes as i64);
    }
}

/// A session's identity for one decision (see [`ClientSession::who`]).
pub struct Who<'s> {
    session: &'s ClientSession,
    groups: Arc<[String]>,
}

impl Who<'_> {
    /// The principal and its groups, for policy decisions.
    pub fn subject(&self) -> crate::policy::Subject<'_> {
        crate::policy::Subject {
            principal: &self.session.key.principal,
            groups: &self.groups,
        }
    }

    /// Who routing decisions are for.
    pub fn caller(&self) -> Caller<'_> {
        Caller {
            who: self.subject(),
            upstream_id: &self.session.upstream_id,
            client_id: &self.session.key.client_id,
            seen: &self.session.seen,
        }
    }
}

/// The rights one decision was made under (see [`ClientSession::rights`]).
pub struct Rights {
    policy: Arc<dyn crate::policy::Policy>,
    groups: Arc<[String]>,
}

impl Rights {
    /// Whether `session` still acts under these rights: the same policy
    /// and the same groups (a reload, or a `reconnect` with another token's
    /// groups, makes an earlier decision stale). Refused with -32603
    /// `rightsChanged` (retryable: sent again, the request is decided
    /// under the new rights).
    pub fn hold(&self, session: &ClientSession) -> Result<(), RpcError> {
        let now = session.rights();
        let same = Arc::ptr_eq(&self.policy, &now.policy) && Arc::ptr_eq(&self.groups, &now.groups);
        if same {
            return Ok(());
        }
        Err(RpcError::limited(
            "rightsChanged",
            "the principal's rights changed while the request was prepared: send it again",
            true,
        ))
    }
}

/// One client session.
#[derive(Debug)]
pub struct ClientSession {
    /// What routing reads.
    pub env: Arc<Env>,
    /// The registry holding it (weak: a registry's sessions hold it back).
    registry: Weak<Registry>,
    /// Principal and clientId.
    pub key: SessionKey,
    /// The derived upstream client id (contract §2, B2).
    pub upstream_id: String,
    /// The protocol version negotiated with the client.
    pub version: String,
    /// The groups of the token that last attached this session (`who`).
    groups: std::sync::RwLock<Arc<[String]>>,
    /// The client tool calls this session owns on its hosts (§5.7).
    pub tool_calls: tool_calls::OwnedToolCalls,
    /// Host objects shown to this client, so it may name them (§7.1).
    pub seen: crate::names::seen::Seen,
    core: Mutex<SessionCore>,
    /// Whether a create's store write is in flight, so frames read now are
    /// kept for later (`hold`); read per frame without the lock, changed
    /// under it.
    holding: std::sync::atomic::AtomicBool,
    /// Taken while a hold's kept frames are handled, so holds end one after
    /// another (`hold`).
    draining: Mutex<()>,
    /// The root flag of `core.channels.subs` (`Subs::root_flag`, `core.rs`).
    root_follower: Arc<std::sync::atomic::AtomicBool>,
}

impl ClientSession {
    /// A new session numbering from a fresh S0 above `floor` (0 for a new
    /// client; an adopted one's watermark, §12.2), attached to `socket`.
    pub fn new(
        registry: &Arc<Registry>,
        key: SessionKey,
        (version, floor): (String, u64),
        groups: Vec<String>,
        socket: Socket,
    ) -> Self {
        let env = registry.env.clone();
        let upstream_id = env.keys.upstream_id(&key.principal, &key.client_id);
        let limits = &env.cfg.limits;
        let s0 = registry.origins.next_above(floor);
        let core = SessionCore::new(s0, socket, limits);
        let root_follower = core.channels.subs.root_flag();
        let seen = crate::names::seen::Seen::new(
            limits.seen_refs_per_session,
            env.metrics.limit_hits.with_label_values(&["seen_refs"]),
        );
        Self {
            env,
            registry: Arc::downgrade(registry),
            key,
            upstream_id,
            version,
            groups: std::sync::RwLock::new(groups.into()),
            tool_calls: tool_calls::OwnedToolCalls::default(),
            seen,
            core: Mutex::new(core),
            holding: std::sync::atomic::AtomicBool::new(false),
            draining: Mutex::new(()),
            root_follower,
        }
    }

    /// Locks the session state. Never held across an `.await`.
    pub fn lock(&self) -> MutexGuard<'_, SessionCore> {
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Who this session acts for now (§3.3): its principal and the groups of
    /// the token that last attached it. A decision takes one `Who` and reads
    /// its groups once, so a `reconnect` under a new token changes what the
    /// next decision sees, never half of one in flight.
    pub fn who(&self) -> Who<'_> {
        let groups = self.groups.read().unwrap_or_else(|e| e.into_inner());
        Who {
            session: self,
            groups: groups.clone(),
        }
    }

    /// The rights a decision is made under now: the policy in force and
    /// the session's groups. A request that awaits something between its
    /// decision and its forwarding (a store write, the host's resolving of
    /// paths) is forwarded only if they still hold ([`Rights::hold`]).
    pub fn rights(&self) -> Rights {
        let groups = self.groups.read().unwrap_or_else(|e| e.into_inner());
        Rights {
            policy: self.env.access.policy(),
            groups: groups.clone(),
        }
    }

    /// Takes the groups of the token that now attaches this session (§3.3:
    /// a socket's identity is its own token's). Returns whether they
    /// changed, so the caller re-evaluates what the session may keep.
    pub(crate) fn set_groups(&self, groups: &[String]) -> bool {
        let mut now = self.groups.write().unwrap_or_else(|e| e.into_inner());
        if **now == *groups {
            return false;
        }
        *now = groups.into();
        true
    }

    /// (upstream id, client id), for name translation.
    pub fn identity(&self) -> (&str, &str) {
        (&self.upstream_id, &self.key.client_id)
    }

    /// The registry holding this session, while the relay runs.
    pub fn registry(&self) -> Option<Arc<Registry>> {
        self.registry.upgrade()
    }

    /// Makes the client a root follower and returns the merged root it gets
    /// as its snapshot, remembered as what it has seen (root actions then
    /// carry only fields that changed).
    ///
    /// The session follows root *before* the value is computed: the
    /// fan-out picks root followers by a flag read without this lock, after
    /// the hub changed, and then waits for the lock. A host change that
    /// lands while the value is computed is therefore either in the value or
    /// fanned out to this session afterwards. Computed before the flag was
    /// set, a change in between reached neither, and the client kept a
    /// root without that host's agents for good (S13, seed 208035).
    pub fn follow_root(&self, core: &mut SessionCore) -> Value {
        let root_uri = ahp_types::ROOT_RESOURCE_URI;
        core.channels.subs.insert(root_uri.to_string());
        core.channels.baselined.insert(root_uri.to_string());
        let root = crate::route::root::merged_root(&self.env, self.who().caller());
        if let Value::Object(fields) = &root {
            core.channels.root_seen = fields.clone();
        }
        root
    }

    /// Queues a frame for the client. Links pause at the queue's bounds
    /// (§5.9, [`outbox`]); a frame that would take the queue past twice its
    /// bounds closes the client with 4008 (slow consumer) rather than
    /// stalling the watch link, a host or the relay. A frame over
    /// `limits.max_frame_bytes` (the limit holds both ways, §3.6) is never
    /// sent: the client is closed with 1009 and the frame counted in
    /// `limit_hits_total{limit="client_frame"}`.
    pub fn push(&self, core: &mut SessionCore, frame: impl Into<Text>) {
        let Some(socket) = &core.attachment.socket else {
            return;
        };
        let frame = frame.into();
        if frame.len() > self.env.cfg.limits.max_frame_bytes {
            self.limit_hit("client_frame");
            self.close_locked(core, Close::FrameTooBig);
            return;
        }
        match socket.out.try_send(frame) {
            Ok(()) => {}
            Err(outbox::Refused::Full) => {
                self.env.metrics.slow_consumer_closes.inc();
                self.close_locked(core, Close::SlowConsumer);
            }
            Err(outbox::Refused::Closed) => core.attachment.socket = None,
        }
    }

    /// Numbers, buffers and delivers one envelope built by `build(n)` (`n`
    /// also given as its digits, for a splice).
    /// Returns the number used, or `None` if `build` refused.
    pub fn push_envelope(
        &self,
        core: &mut SessionCore,
        build: impl FnOnce(&wire::Decimal) -> Option<Text>,
    ) -> Option<u64> {
        let (n, frame) = Self::number_envelope(core, build)?;
        self.commit_envelope(core, n, frame);
        Some(n)
    }

    /// Gives the next number to the envelope `build(n)` makes (`n` also as
    /// its digits, for a splice): the number is used only if `build` makes
    /// one. The envelope is the caller's to commit, with this number, before
    /// anything else is numbered or written for this session (under the
    /// same lock): [`commit_envelope`](Self::commit_envelope).
    pub(crate) fn number_envelope<T>(
        core: &mut SessionCore,
        build: impl FnOnce(&wire::Decimal) -> Option<T>,
    ) -> Option<(u64, T)> {
        let n = core.seq.last + 1;
        let made = build(core.seq.issuing().decimal.set(n))?;
        core.seq.last = n;
        Some((n, made))
    }

    /// Buffers and delivers the envelope numbered `n` by
    /// [`number_envelope`](Self::number_envelope).
    pub(crate) fn commit_envelope(&self, core: &mut SessionCore, n: u64, frame: Text) {
        let len = frame.len();
        let keep = self.may_keep(core, len);
        let queued = if keep {
            None
        } else {
            // Kept envelopes go first: nothing may overtake them.
            self.spill(core);
            Some(frame.clone())
        };
        let (evicted, evicted_bytes) = match core.seq.batch {
            Some(_) => core.seq.buffer.push_unsettled(n, frame),
            None => core.seq.buffer.push(n, frame),
        };
        let gap_lost = core
            .attachment
            .detached_at
            .is_some_and(|d| core.seq.buffer.evicted_through() > d);
        if evicted > 0 && gap_lost && !core.links.open.is_empty() {
            // Detached, and the buffer no longer holds everything numbered
            // since: the client will need snapshots anyway, so the links
            // close now (§5.7).
            core.lose_links();
        }
        let added = buffer::envelope_cost(len);
        let cost = added as i64 - evicted_bytes as i64;
        match &mut core.seq.batch {
            Some(tally) => {
                tally.relayed += 1;
                tally.evicted += evicted as u64;
                tally.cost += cost;
                if keep {
                    tally.kept += 1;
                    tally.kept_cost += added;
                }
            }
            None => self.report(&core::Tally {
                relayed: 1,
                evicted: evicted as u64,
                cost,
                ..core::Tally::default()
            }),
        }
        if let Some(frame) = queued {
            self.push(core, frame);
        }
    }

    /// Whether an envelope of `len` bytes numbered in the current batch may
    /// stay held by the replay buffer alone until the batch ends (no queue
    /// entry, no second reference): a client is attached to receive it, it
    /// is within the client frame limit, and the buffer holds it and the
    /// batch's other kept envelopes whatever else it evicts.
    fn may_keep(&self, core: &SessionCore, len: usize) -> bool {
        let Some(tally) = &core.seq.batch else {
            return false;
        };
        let cost = tally.kept_cost + buffer::envelope_cost(len);
        core.attachment.socket.is_some()
            && len <= self.env.cfg.limits.max_frame_bytes
            && core.seq.buffer.holds(tally.kept + 1, cost)
    }

    /// Queues the batch's kept envelopes now (an envelope that cannot be
    /// kept follows them).
    fn spill(&self, core: &mut SessionCore) {
        let Some(tally) = &mut core.seq.batch else {
            return;
        };
        let kept = std::mem::take(&mut tally.kept);
        tally.kept_cost = 0;
        if kept == 0 {
            return;
        }
        let frames: Vec<Text> = core
            .seq
            .buffer
            .newest(kept)
            .map(|(_, f)| f.clone())
            .collect();
        for frame in frames {
            self.push(core, frame);
        }
    }

    /// Starts a batch: envelopes numbered until [`ClientSession::end_batch`]
    /// reach the relay-wide metrics and memory account once, at its end
    /// (shared counters updated once per batch, not once per envelope).
    /// The socket's queue wakes its writer once, at the batch's end — or the
    /// link writes the batch itself then ([`outbox::Outbox::end_batch`]).
    pub(crate) fn begin_batch(&self, core: &mut SessionCore) {
        core.seq.batch.get_or_insert_with(core::Tally::default);
        if let Some(socket) = &core.attachment.socket {
            socket.out.begin_batch();
        }
    }

    /// Ends a batch begun by [`ClientSession::begin_batch`].
    /// The batch's kept envelopes go to the socket now, read in place.
    pub(crate) fn end_batch(&self, core: &mut SessionCore) {
        let Some(tally) = core.seq.batch.take() else {
            return;
        };
        core.seq.buffer.settle();
        self.report(&tally);
        let Some(socket) = &core.attachment.socket else {
            return;
        };
        match socket.out.end_batch(core.seq.buffer.newest(tally.kept)) {
            Ok(()) => {}
            Err(outbox::Refused::Full) => {
                self.env.metrics.slow_consumer_closes.inc();
                self.close_locked(core, Close::SlowConsumer);
            }
            Err(outbox::Refused::Closed) => core.attachment.socket = None,
        }
    }

    fn report(&self, tally: &core::Tally) {
        let metrics = &self.env.metrics;
        if tally.evicted > 0 {
            metrics.buffer_evictions.inc_by(tally.evicted);
        }
        metrics.buffer_bytes.add(tally.cost);
        metrics.envelopes_relayed.inc_by(tally.relayed);
    }

    /// Delivers a relay-made rejection echo of a client dispatch (§5.3).
    pub fn reject_dispatch(
        &self,
        core: &mut SessionCore,
        channel: &str,
        action: &Value,
        client_seq: i64,
        reason: &str,
    ) {
        self.env.metrics.relay_rejections.inc();
        self.echo(core, channel, action, client_seq, Some(reason));
    }

    /// Delivers a relay-made accepted echo of a client dispatch the relay
    /// answers itself (`root/configChanged`).
    pub fn accept_dispatch(
        &self,
        core: &mut SessionCore,
        channel: &str,
        action: &Value,
        client_seq: i64,
    ) {
        self.echo(core, channel, action, client_seq, None);
    }

    /// Numbers and delivers the echo of the client's dispatch `client_seq`
    /// (deferred while a snapshot `reconnect` prepares its cut).
    fn echo(
        &self,
        core: &mut SessionCore,
        channel: &str,
        action: &Value,
        client_seq: i64,
        reason: Option<&str>,
    ) {
        if core.seq.cut_pending {
            let reason = reason.map(str::to_string);
            let deferred = (channel.to_string(), action.clone(), client_seq, reason);
            core.seq.deferred.push(deferred);
            return;
        }
        let client = self.key.client_id.clone();
        self.push_envelope(core, |n| {
            let n = n.value();
            let mut params = json!({"channel": channel, "action": action, "serverSeq": n,
                "origin": {"clientId": client, "clientSeq": client_seq}});
            if let (Some(r), Some(o)) = (reason, params.as_object_mut()) {
                o.insert("rejectionReason".into(), json!(r));
            }
            Some(crate::rpc::action_frame(&params).into())
        });
    }

    /// The reconnect answer is written: deferred rejection echoes are
    /// numbered and sent now, after it, and links paused by a full cut
    /// hold read again.
    pub fn end_cut(&self, core: &mut SessionCore) {
        core.seq.cut_pending = false;
        core.links.cut_full.set(false);
        for (channel, action, client_seq, reason) in std::mem::take(&mut core.seq.deferred) {
            self.echo(core, &channel, &action, client_seq, reason.as_deref());
        }
    }

    /// Answers a client request with `result` (serialized JSON); a result
    /// over `limits.max_frame_bytes` becomes -32603 `reason = "tooLarge"`.
    pub fn respond(&self, core: &mut SessionCore, id: &str, result: &str) {
        let frame = format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#);
        if frame.len() > self.env.cfg.limits.max_frame_bytes {
            self.limit_hit("client_frame");
            let err = crate::rpc::RpcError::limited(
                "tooLarge",
                "the answer exceeds the frame limit: ask for less",
                false,
            );
            return self.respond_error(core, id, &err);
        }
        self.push(core, frame);
    }

    /// Answers a client request with an error.
    pub fn respond_error(&self, core: &mut SessionCore, id: &str, err: &crate::rpc::RpcError) {
        self.push(core, err.frame(id));
    }

    /// Answers a request that waited for a host with `result`, if the
    /// socket that asked is still the attached one ([`ReplyTo`]).
    pub fn respond_to(&self, core: &mut SessionCore, to: &ReplyTo, result: &str) {
        if self.answerable(core, to) {
            self.respond(core, &to.id, result);
        }
    }

    /// [`Self::respond_to`] with an error.
    pub fn respond_error_to(
        &self,
        core: &mut SessionCore,
        to: &ReplyTo,
        err: &crate::rpc::RpcError,
    ) {
        if self.answerable(core, to) {
            self.respond_error(core, &to.id, err);
        }
    }

    /// Whether `to` may be answered now; an answer for a socket that is
    /// gone is counted and dropped.
    fn answerable(&self, core: &SessionCore, to: &ReplyTo) -> bool {
        if to.is_attached(core) {
            return true;
        }
        if to.socket.is_some() {
            self.env.metrics.stale_answers.inc();
            tracing::debug!(id = %to.id, "answer for a socket no longer attached: dropped");
        }
        false
    }

    /// Closes the client socket with `close`.
    pub fn close(&self, close: Close) {
        let mut core = self.lock();
        self.close_locked(&mut core, close);
    }

    /// Closes socket `id` with `code` only if it is still the attached one
    /// (a resync decided for one socket must not hit a newer socket whose
    /// own `reconnect` already resynchronises).
    pub fn close_socket(&self, id: u64, close: Close) {
        let mut core = self.lock();
        if core.answers_on(id) {
            self.close_locked(&mut core, close);
        }
    }

    fn close_locked(&self, core: &mut SessionCore, close: Close) {
        if let Some(socket) = core.attachment.socket.take() {
            socket.kill.send_replace(Some(close));
        }
    }

    /// Attaches `socket` (a `reconnect` on a new socket); a socket still
    /// attached is closed first with 4009 (contract §5.6). Returns the
    /// attach generation lifetime timers compare against.
    pub fn attach_socket(&self, core: &mut SessionCore, socket: Socket) -> u64 {
        self.close_locked(core, Close::Superseded);
        core.attachment.detached_at = None;
        core.attachment.last_socket = socket.id;
        core.attachment.socket = Some(socket);
        core.attachment.attach_gen += 1;
        core.attachment.attach_gen
    }

    /// Detaches socket `id` if it is the attached one: the session keeps its
    /// links and keeps buffering (contract §5.7) — unless it owns in-flight
    /// client tool calls, then its links close at once so hosts fail them
    /// promptly ([`tool_calls`]). Returns the generation to hand to lifetime
    /// timers, or `None` if another socket is attached.
    pub fn detach_socket(&self, id: u64) -> Option<u64> {
        let mut core = self.lock();
        // The relay may have closed this socket itself (4000, 4008): the
        // session is then already without a socket, and still detaches.
        let ours = core.socket_id() == Some(id)
            || (core.attachment.socket.is_none() && core.attachment.last_socket == id);
        if !ours {
            return None;
        }
        core.attachment.detached_at = Some(core.seq.last);
        core.attachment.socket = None;
        core.attachment.attach_gen += 1;
        if self.owns_client_tool_calls(&core) {
            tracing::debug!(
                calls = self.tool_calls.len(),
                "detached with in-flight client tool calls: links close at once"
            );
            self.close_links(&mut core);
        }
        Some(core.attachment.attach_gen)
    }

    /// Whether the session owns a client tool call on a channel it still
    /// follows on a current link (§5.7).
    pub fn owns_client_tool_calls(&self, core: &SessionCore) -> bool {
        self.tool_calls.any_followed(|host, channel| {
            core.links.open.contains_key(host)
                && core
                    .channels
                    .chans
                    .get(host)
                    .is_some_and(|m| m.contains_key(channel))
        })
    }

    /// Closes every link under the session lock (see [`Self::drop_links`]).
    pub fn close_links(&self, core: &mut SessionCore) {
        core.lose_links();
        self.tool_calls.clear();
    }

    /// Whether the session is still detached since generation `gen`.
    pub fn detached_since(&self, generation: u64) -> bool {
        let core = self.lock();
        core.attachment.socket.is_none() && core.attachment.attach_gen == generation
    }

    /// Closes every link: hosts see the client leave, requests in flight are
    /// dropped, and every host channel loses continuity (a later `reconnect`
    /// gets snapshots for them).
    pub fn drop_links(&self) {
        let mut core = self.lock();
        self.close_links(&mut core);
    }

    /// Ends the session for good (superseded by a new `initialize`).
    pub fn shut(&self) {
        self.drop_links();
        let mut core = self.lock();
        core.attachment.socket = None;
        core.attachment.attach_gen += 1;
    }

    /// Closes links idle for `idle` (no subscribed channel, no request in
    /// flight either way, no active-client registration) as seen at `now`;
    /// returns how many closed. Nothing is lost: no channel of the client
    /// lives on such a link.
    pub fn close_idle_links(&self, idle: std::time::Duration, now: std::time::Instant) -> usize {
        let mut core = self.lock();
        let core = &mut *core;
        let mut closed = 0;
        let hosts: Vec<(Arc<str>, u64)> = core
            .links
            .open
            .iter()
            .map(|(h, l)| (h.clone(), l.id))
            .collect();
        for (host, link) in hosts {
            let busy = core
                .channels
                .chans
                .get(&host)
                .is_some_and(|m| !m.is_empty())
                || core.links.pending.keys().any(|(l, _)| *l == link)
                || core.links.host_requests.values().any(|r| r.host == host)
                || core.links.registered.iter().any(|(h, _)| *h == host);
            if busy {
                core.links.idle_since.remove(&host);
                continue;
            }
            let since = *core.links.idle_since.entry(host.clone()).or_insert(now);
            if now.duration_since(since) >= idle {
                core.links.idle_since.remove(&host);
                core.links.open.remove(&host);
                closed += 1;
            }
        }
        closed
    }

    /// Whether the client follows the relay root channel, read without the
    /// session's lock (a hint: check `subs` under the lock before acting).
    pub fn follows_root(&self) -> bool {
        self.root_follower
            .load(std::sync::atomic::Ordering::Acquire)
    }
}

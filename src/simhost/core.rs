//! The host's single point of order: one lock around the state, the
//! host-wide `serverSeq`, the replay log, the known clients and the open
//! connections.
//!
//! Every state change happens under the lock and is numbered, logged and
//! fanned out before the lock is released, so each connection receives
//! envelopes in `serverSeq` order and a response written under the lock is
//! ordered after every envelope it caused.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use ahp_types::actions::{ActionEnvelope, ActionOrigin, StateAction};
use ahp_types::state::ChatSummary;
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc};
use tokio_tungstenite::tungstenite::Utf8Bytes;

use super::clock::SplitMix64;
use super::config::SimHostConfig;
use super::state::{ChannelKind, HostState, chat_summary};
use crate::rpc;

/// Identifies one WebSocket connection for the life of the host process.
pub type ConnId = u64;

/// What a connection task writes to its socket.
#[derive(Debug, Clone)]
pub enum Outbound {
    /// A text frame (shared, cheap to clone across connections).
    Frame(Utf8Bytes),
    /// Close the socket with this code and reason.
    Close(u16, String),
    /// Drop the TCP connection without a close frame (fault injection).
    Drop,
    /// Pre-rendered frames of the streaming load mode, written back to back
    /// (see [`super::stream`]).
    Batch(Arc<FrameBatch>),
}

/// Frames queued to one or more connections as one unit. Whatever it holds
/// (the stream's in-flight permit) is released when the last connection has
/// written it, which is how a stream is paced by its slowest subscriber.
#[derive(Debug)]
pub struct FrameBatch {
    /// The frames, in `serverSeq` order.
    pub frames: Vec<Utf8Bytes>,
    /// µs since the UNIX epoch just before the frames were stamped.
    pub stamped: u64,
    /// Released when every connection has written the batch.
    pub permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// A connection as the host sees it.
#[derive(Debug)]
pub struct ConnEntry {
    /// The `clientId` given by `initialize` or `reconnect`.
    pub client_id: Option<String>,
    /// Channels this connection receives envelopes for.
    pub subs: HashSet<String>,
    /// Live `authenticate` tokens: protected resource → token generation
    /// (the token itself is not kept; see `auth`).
    pub tokens: HashMap<String, String>,
    tx: mpsc::UnboundedSender<Outbound>,
}

/// What the host remembers about a `clientId` across its connections.
#[derive(Debug, Default)]
pub struct ClientRecord {
    /// Channels for which this process gave the client a snapshot: a replay
    /// is only meaningful on top of a baseline this process produced.
    pub baselined: HashSet<String>,
}

/// One numbered envelope kept for replay.
#[derive(Debug)]
struct Logged {
    seq: u64,
    channel: String,
    envelope: Arc<str>,
}

/// The outcome of deciding how to answer a `reconnect`.
#[derive(Debug)]
pub enum ReplayDecision {
    /// Envelopes after the watermark on the requested channels, plus the
    /// requested channels that no longer exist.
    Replay {
        /// Serialized envelopes, oldest first.
        actions: Vec<Arc<str>>,
        /// Requested channels this host no longer has.
        missing: Vec<String>,
    },
    /// The gap cannot be replayed: fresh snapshots are needed.
    Snapshot,
}

/// The lock-protected heart of a simulated host.
#[derive(Debug)]
pub struct HostCore {
    /// Configuration the host was started with.
    pub cfg: Arc<SimHostConfig>,
    /// Authoritative state.
    pub state: HostState,
    /// Last `serverSeq` issued (0 = none yet in this process).
    pub seq: u64,
    log: VecDeque<Logged>,
    evicted_up_to: u64,
    /// Known clients by `clientId` (forgotten on restart).
    pub clients: HashMap<String, ClientRecord>,
    /// Open connections.
    pub conns: HashMap<ConnId, ConnEntry>,
    /// Incremented by every restart; agent tasks of an older epoch stop.
    pub epoch: u64,
    /// Generator of the seeded random mode.
    pub rng: SplitMix64,
    /// Wakes the agent task of a chat when a client acts on its turn.
    pub wakers: HashMap<String, Arc<Notify>>,
    /// Host → client requests waiting for their answer, by id.
    pub asks: HashMap<u64, tokio::sync::oneshot::Sender<Value>>,
    /// Id of the next host → client request.
    pub next_ask: u64,
    /// Clients whose last connection closed, each with the token of its
    /// pending grace timer (see `client_tools`).
    pub gone: HashMap<String, u64>,
    /// (session, client) pairs that left the session's `activeClients`,
    /// each with the token of its pending grace timer.
    pub left: HashMap<(String, String), u64>,
    /// Token of the next grace timer.
    pub next_grace: u64,
    /// The sandbox folder, content references and resource watches.
    pub files: super::files::Files,
    /// Live `authenticate` tokens of the whole host (resource → token
    /// generation), used instead of each connection's when
    /// [`Self::host_wide_tokens`] holds.
    pub host_tokens: HashMap<String, String>,
    /// Fault: `root/session*` notifications held back while `Some` (in
    /// order), sent when released (`SimHost::hold_catalog_events`).
    pub held_root: Option<Vec<(String, Value)>>,
    /// Fault: the next request of this (`clientId`, method) is carried out
    /// but its connection drops instead of answering
    /// (`SimHost::drop_instead_of_answering`).
    pub drop_before_answer: Option<(String, String)>,
    /// Fault: the next request of this (`clientId`, method) is carried out
    /// but answered with an error (`SimHost::fail_instead_of_answering`).
    pub fail_before_answer: Option<(String, String)>,
    /// Fault: the next request of this (`clientId`, method) is carried out
    /// and never answered (`SimHost::silent_instead_of_answering`).
    pub silent_before_answer: Option<(String, String)>,
    next_id: u64,
}

impl HostCore {
    /// A core with the seeded initial state, its files in `files`.
    pub fn new(cfg: Arc<SimHostConfig>, files: super::files::Files) -> Self {
        let mut state = HostState::seeded(&cfg);
        files.seed_working_dirs(&mut state);
        let rng = SplitMix64::new(cfg.script.seed.unwrap_or(0));
        Self {
            cfg,
            state,
            seq: 0,
            log: VecDeque::new(),
            evicted_up_to: 0,
            clients: HashMap::new(),
            conns: HashMap::new(),
            epoch: 0,
            rng,
            wakers: HashMap::new(),
            asks: HashMap::new(),
            next_ask: 1,
            gone: HashMap::new(),
            left: HashMap::new(),
            next_grace: 1,
            files,
            host_tokens: HashMap::new(),
            held_root: None,
            drop_before_answer: None,
            fail_before_answer: None,
            silent_before_answer: None,
            next_id: 0,
        }
    }

    /// Whether one token store serves the whole host (VS Code mode, unless
    /// `per_connection_tokens`).
    pub fn host_wide_tokens(&self) -> bool {
        self.cfg.vscode_compat && !self.cfg.per_connection_tokens
    }

    /// The token store `conn`'s `authenticate` writes to and its turns are
    /// judged by: the host's when tokens are host-wide, else the
    /// connection's own (`None` once the connection is gone).
    pub fn tokens_mut(&mut self, conn: ConnId) -> Option<&mut HashMap<String, String>> {
        if self.host_wide_tokens() {
            return Some(&mut self.host_tokens);
        }
        self.conns.get_mut(&conn).map(|c| &mut c.tokens)
    }

    /// Read-only [`Self::tokens_mut`].
    pub fn tokens(&self, conn: ConnId) -> Option<&HashMap<String, String>> {
        if self.host_wide_tokens() {
            return Some(&self.host_tokens);
        }
        self.conns.get(&conn).map(|c| &c.tokens)
    }

    /// A host-unique id with `prefix` (turn ids, part ids, tool call ids).
    pub fn fresh_id(&mut self, prefix: &str) -> String {
        self.next_id += 1;
        format!("{prefix}-{}-{}", self.epoch, self.next_id)
    }

    /// Registers a connection's outbound queue.
    pub fn attach(&mut self, id: ConnId, tx: mpsc::UnboundedSender<Outbound>) {
        self.conns.insert(
            id,
            ConnEntry {
                client_id: None,
                subs: HashSet::new(),
                tokens: HashMap::new(),
                tx,
            },
        );
    }

    /// Forgets a closed connection. Returns its `clientId` when no other
    /// connection holds it any more (the client has gone away).
    pub fn detach(&mut self, id: ConnId) -> Option<String> {
        let entry = self.conns.remove(&id)?;
        super::files::release_unwatched(self);
        let client = entry.client_id?;
        self.conns_of(&client).is_empty().then_some(client)
    }

    /// Queues a frame for one connection (dropped if it has closed).
    pub fn send(&self, conn: ConnId, frame: impl Into<Utf8Bytes>) {
        if let Some(c) = self.conns.get(&conn) {
            let _ = c.tx.send(Outbound::Frame(frame.into()));
        }
    }

    /// Asks one connection to close.
    pub fn close(&self, conn: ConnId, code: u16, reason: &str) {
        if let Some(c) = self.conns.get(&conn) {
            let _ = c.tx.send(Outbound::Close(code, reason.to_string()));
        }
    }

    /// Drops every connection abruptly (no close frame), as a crash would.
    pub fn drop_all(&self) {
        for c in self.conns.values() {
            let _ = c.tx.send(Outbound::Drop);
        }
    }

    /// Whether `conn`'s `method` request is the one armed by
    /// [`HostCore::drop_before_answer`]: then the fault is used up and the
    /// connection is dropped (the caller sends no answer).
    pub fn take_drop_before_answer(&mut self, conn: ConnId, method: &str) -> bool {
        if !self.armed_for(&self.drop_before_answer, conn, method) {
            return false;
        }
        self.drop_before_answer = None;
        if let Some(c) = self.conns.get(&conn) {
            let _ = c.tx.send(Outbound::Drop);
        }
        true
    }

    /// Whether `conn`'s `method` request is the one armed by
    /// [`HostCore::fail_before_answer`]: then the fault is used up (the
    /// caller answers with an error).
    pub fn take_fail_before_answer(&mut self, conn: ConnId, method: &str) -> bool {
        let armed = self.armed_for(&self.fail_before_answer, conn, method);
        if armed {
            self.fail_before_answer = None;
        }
        armed
    }

    /// Whether `conn`'s `method` request is the one armed by
    /// [`HostCore::silent_before_answer`]: then the fault is used up (the
    /// caller sends no answer; the connection stays).
    pub fn take_silent_before_answer(&mut self, conn: ConnId, method: &str) -> bool {
        let armed = self.armed_for(&self.silent_before_answer, conn, method);
        if armed {
            self.silent_before_answer = None;
        }
        armed
    }

    /// Whether `fault` names `conn`'s client and `method`.
    fn armed_for(&self, fault: &Option<(String, String)>, conn: ConnId, method: &str) -> bool {
        fault.as_ref().is_some_and(|(client, m)| {
            m == method && self.client_of(conn).as_deref() == Some(client.as_str())
        })
    }

    /// Drops the connections of `client_id` abruptly; returns how many.
    pub fn drop_client(&self, client_id: &str) -> usize {
        let ids = self.conns_of(client_id);
        for id in &ids {
            if let Some(c) = self.conns.get(id) {
                let _ = c.tx.send(Outbound::Drop);
            }
        }
        ids.len()
    }

    /// Asks every connection to close.
    pub fn close_all(&self, code: u16, reason: &str) {
        for c in self.conns.values() {
            let _ = c.tx.send(Outbound::Close(code, reason.to_string()));
        }
    }

    /// The connections currently holding `client_id`.
    pub fn conns_of(&self, client_id: &str) -> Vec<ConnId> {
        self.conns
            .iter()
            .filter(|(_, c)| c.client_id.as_deref() == Some(client_id))
            .map(|(id, _)| *id)
            .collect()
    }

    /// The `clientId` of a connection, if it has one.
    pub fn client_of(&self, conn: ConnId) -> Option<String> {
        self.conns.get(&conn).and_then(|c| c.client_id.clone())
    }

    /// Mutable access to a connection's entry.
    pub fn conn_mut(&mut self, conn: ConnId) -> Option<&mut ConnEntry> {
        self.conns.get_mut(&conn)
    }

    /// Subscribes `conn` to `channel` and records the client's baseline.
    pub fn subscribe(&mut self, conn: ConnId, channel: &str) {
        let Some(entry) = self.conns.get_mut(&conn) else {
            return;
        };
        entry.subs.insert(channel.to_string());
        if let Some(w) = self.files.watches.get_mut(channel) {
            w.subscribed = true;
        }
        if let Some(client) = entry.client_id.clone() {
            self.clients
                .entry(client)
                .or_default()
                .baselined
                .insert(channel.to_string());
        }
    }

    /// A server-originated action: reduced, numbered, logged, fanned out.
    pub fn emit(&mut self, channel: &str, action: StateAction) -> u64 {
        self.publish(channel, action, None, None, true)
    }

    /// A view-only action (e.g. `chat/turnsLoaded`): numbered and delivered
    /// but not applied to the host's full state.
    pub fn emit_unreduced(&mut self, channel: &str, action: StateAction) -> u64 {
        self.publish(channel, action, None, None, false)
    }

    /// The echo of a client's dispatch: applied unless `rejection` is given.
    pub fn echo(
        &mut self,
        channel: &str,
        action: StateAction,
        origin: ActionOrigin,
        rejection: Option<String>,
    ) -> u64 {
        let apply = rejection.is_none();
        self.publish(channel, action, Some(origin), rejection, apply)
    }

    fn publish(
        &mut self,
        channel: &str,
        action: StateAction,
        origin: Option<ActionOrigin>,
        rejection: Option<String>,
        apply: bool,
    ) -> u64 {
        let before = self.chat_summary_of(channel);
        if apply {
            self.state.apply(channel, &action);
        }
        self.seq += 1;
        let env = ActionEnvelope {
            channel: channel.to_string(),
            action,
            server_seq: self.seq,
            origin,
            rejection_reason: rejection,
        };
        let envelope: Arc<str> = match serde_json::to_string(&env) {
            Ok(s) => s.into(),
            Err(e) => {
                tracing::error!(error = %e, "cannot serialize envelope");
                return self.seq;
            }
        };
        let frame: Utf8Bytes =
            format!(r#"{{"jsonrpc":"2.0","method":"action","params":{envelope}}}"#).into();
        self.log.push_back(Logged {
            seq: self.seq,
            channel: channel.to_string(),
            envelope,
        });
        while self.log.len() > self.cfg.replay_log {
            if let Some(old) = self.log.pop_front() {
                self.evicted_up_to = self.evicted_up_to.max(old.seq);
            }
        }
        for c in self.conns.values() {
            if c.subs.contains(channel) {
                let _ = c.tx.send(Outbound::Frame(frame.clone()));
            }
        }
        let seq = self.seq;
        if apply {
            self.propagate_chat_change(channel, before);
        }
        seq
    }

    /// Numbers `n` pre-rendered envelopes of `channel` (the streaming load
    /// mode, [`super::stream`]) — `render(first)` renders those numbered
    /// `first ..= first + n - 1` — and queues them as one batch to every
    /// subscriber. They are neither applied nor logged; the replay window
    /// is moved past them so no replay can silently skip them.
    pub fn emit_prerendered(
        &mut self,
        channel: &str,
        render: impl FnOnce(u64) -> Vec<Utf8Bytes>,
        n: u64,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) {
        let stamped = super::stream::now_micros();
        let frames = render(self.seq + 1);
        self.seq += n;
        self.evicted_up_to = self.seq;
        let batch = Arc::new(FrameBatch {
            frames,
            stamped,
            permit: Some(permit),
        });
        for c in self.conns.values() {
            if c.subs.contains(channel) {
                let _ = c.tx.send(Outbound::Batch(batch.clone()));
            }
        }
    }

    fn chat_summary_of(&self, channel: &str) -> Option<ChatSummary> {
        (ChannelKind::of(channel) == ChannelKind::Chat)
            .then(|| {
                self.state
                    .chats
                    .get(channel)
                    .map(|c| chat_summary(&c.state))
            })
            .flatten()
    }

    /// Keeps the session catalog and the root catalog in step with a chat:
    /// `session/chatUpdated` on the session, then `root/sessionSummaryChanged`.
    fn propagate_chat_change(&mut self, channel: &str, before: Option<ChatSummary>) {
        let (Some(before), Some(after)) = (before, self.chat_summary_of(channel)) else {
            return;
        };
        if before == after {
            return;
        }
        let Some(session) = self.state.chats.get(channel).map(|c| c.session.clone()) else {
            return;
        };
        let mut changes = serde_json::Map::new();
        if before.status != after.status {
            changes.insert("status".into(), json!(after.status));
        }
        if before.modified_at != after.modified_at {
            changes.insert("modifiedAt".into(), json!(after.modified_at));
        }
        if before.title != after.title {
            changes.insert("title".into(), json!(after.title));
        }
        if !changes.is_empty()
            && let Some(action) = super::typed::typed_action(json!({
                "type": "session/chatUpdated", "chat": channel, "changes": changes
            }))
        {
            self.publish(&session, action, None, None, true);
        }
        self.notify_summary_changed(&session);
    }

    /// Sends `root/sessionSummaryChanged` with the session's aggregated
    /// status, `modifiedAt` and compact chat catalog.
    pub fn notify_summary_changed(&mut self, session: &str) {
        if let Some(summary) = self.state.summary(session) {
            self.notify_root(
                "root/sessionSummaryChanged",
                &json!({
                    "channel": ahp_types::ROOT_RESOURCE_URI,
                    "session": session,
                    "changes": {
                        "status": summary.status,
                        "modifiedAt": summary.modified_at,
                        "title": summary.title,
                        "chats": summary.chats,
                    }
                }),
            );
        }
    }

    /// A root-scoped protocol notification (`root/session*`): to root
    /// subscribers, or to every initialized connection in VS Code mode.
    pub fn notify_root(&mut self, method: &str, params: &Value) {
        if let Some(held) = &mut self.held_root {
            held.push((method.to_string(), params.clone()));
            return;
        }
        let frame: Utf8Bytes = rpc::notification_frame(method, params).into();
        for c in self.conns.values() {
            let wanted = if self.cfg.vscode_compat {
                c.client_id.is_some()
            } else {
                c.subs.contains(ahp_types::ROOT_RESOURCE_URI)
            };
            if wanted {
                let _ = c.tx.send(Outbound::Frame(frame.clone()));
            }
        }
    }

    /// A notification meant for one connection (`root/progress`,
    /// `auth/required`); in VS Code mode every initialized connection gets it.
    pub fn notify_conn(&self, conn: ConnId, method: &str, params: &Value) {
        let frame: Utf8Bytes = rpc::notification_frame(method, params).into();
        for (id, c) in &self.conns {
            let wanted = if self.cfg.vscode_compat {
                c.client_id.is_some()
            } else {
                *id == conn
            };
            if wanted {
                let _ = c.tx.send(Outbound::Frame(frame.clone()));
            }
        }
    }

    /// Decides between replay and snapshot for a `reconnect` (the seed
    /// study's §5.5 rules): replay only if the watermark lies within the log
    /// and this process baselined every requested channel for this client.
    pub fn replay_decision(
        &self,
        client_id: &str,
        last_seen: i64,
        channels: &[String],
    ) -> ReplayDecision {
        let Some(record) = self.clients.get(client_id) else {
            return ReplayDecision::Snapshot;
        };
        let Ok(last_seen) = u64::try_from(last_seen) else {
            return ReplayDecision::Snapshot;
        };
        let existing: Vec<&String> = channels
            .iter()
            .filter(|c| self.state.has_channel(c))
            .collect();
        let in_window = last_seen >= self.evicted_up_to && last_seen <= self.seq;
        let baselined = existing.iter().all(|c| record.baselined.contains(*c));
        if !in_window || !baselined {
            return ReplayDecision::Snapshot;
        }
        let wanted: HashSet<&str> = existing.iter().map(|c| c.as_str()).collect();
        let actions = self
            .log
            .iter()
            .filter(|l| l.seq > last_seen && wanted.contains(l.channel.as_str()))
            .map(|l| l.envelope.clone())
            .collect();
        let missing = channels
            .iter()
            .filter(|c| !self.state.has_channel(c))
            .cloned()
            .collect();
        ReplayDecision::Replay { actions, missing }
    }

    /// Models a host process restart: connections closed, clients, log and
    /// numbering forgotten; state kept (active turns cancelled) or re-seeded.
    pub fn restart(&mut self, keep_state: bool) {
        self.close_all(1012, "host restarting");
        self.conns.clear();
        self.clients.clear();
        self.log.clear();
        self.seq = 0;
        self.evicted_up_to = 0;
        self.epoch += 1;
        self.wakers.clear();
        self.gone.clear();
        self.left.clear();
        self.host_tokens.clear();
        if keep_state {
            self.state.cancel_active_turns();
        } else {
            self.state = HostState::seeded(&self.cfg);
            self.files.seed_working_dirs(&mut self.state);
        }
        self.files.watches.clear();
        self.state.watches.clear();
    }
}

//! Client → relay: the life of every client frame (contract §4.1).
//!
//! A frame is classified by the wire layer, then answered by the relay
//! (`initialize`, `reconnect`, `ping`, root subscriptions), aggregated
//! (`listSessions`), routed to the one host that owns its channel (with every
//! name translated client → host, fail-closed), or refused. Methods the relay
//! does not know are refused with -32601; nothing is forwarded verbatim.

use std::sync::Arc;

use ahp_types::commands::{
    CreateChatParams, CreateSessionParams, CreateTerminalParams, InitializeParams, SubscribeParams,
};
use ahp_types::errors::ahp_error_codes;
use serde_json::{Value, json};
use tokio::sync::{oneshot, watch};

use super::limits::{self, RateBucket, dedup_capped};
use super::{Chan, ClientSession, Pending, PendingKind, PrincipalKey, SessionKey};
use crate::auth::Principal;
use crate::names::qualify as names;
use crate::names::store::{Owner, StoreError};
use crate::policy::Grant;
use crate::route::methods::{self, Created, Handling, typed};
use crate::route::{catalog, router};
use crate::rpc::{Close, RpcError};
use crate::upstream::hub::{HostHub, HostStatus};
use crate::upstream::link::{Link, LinkCmd};
use crate::wire::{self, FrameKind};

/// Protocol versions the relay speaks with clients (§4.1): exactly those
/// whose fields its rewrite table covers — `1.0.x` and `0.9.x` with the
/// specification's caret rules, and `0.10.0`, the version VS Code 1.141's
/// host and client speak, which VS Code declares to share the wire contract
/// of `0.9` and `1.0` (`agentHostProtocolCompatibility.ts`). `supportedVersions`
/// of a -32005 lists these ranges.
pub const SUPPORTED_VERSIONS: &[&str] = &["^1.0.0 <1.1.0", "^0.9.0", "0.10.0"];

/// One client socket's state as seen by the router.
pub struct Conn {
    /// The registry of sessions.
    pub registry: Arc<super::Registry>,
    /// Who authenticated at the upgrade.
    pub principal: Principal,
    /// This socket's id.
    pub socket: u64,
    /// Frames to the client.
    pub out: super::outbox::Outbox,
    /// Closes the client socket.
    pub kill: watch::Sender<Option<Close>>,
    /// The session, once `initialize` succeeded on this socket.
    pub session: Option<Arc<ClientSession>>,
    /// This socket's frame rate (§3.6 requests per second).
    bucket: RateBucket,
}

impl Conn {
    /// A connection of `principal` before `initialize`, writing to `out`.
    pub fn new(
        registry: Arc<super::Registry>,
        principal: Principal,
        out: super::outbox::Outbox,
        kill: watch::Sender<Option<Close>>,
    ) -> Self {
        let limits = &registry.env.cfg.limits;
        let bucket = RateBucket::new(limits.requests_per_second, limits.request_burst);
        Self {
            socket: registry.next_socket(),
            registry,
            principal,
            out,
            kill,
            session: None,
            bucket,
        }
    }

    /// The session key of `client_id` for this socket's principal.
    pub fn session_key(&self, client_id: &str) -> SessionKey {
        SessionKey {
            principal: PrincipalKey {
                issuer: self.principal.issuer.clone(),
                subject: self.principal.subject.clone(),
            },
            client_id: client_id.to_string(),
        }
    }

    /// This socket, for a session to write to.
    pub fn socket(&self) -> super::Socket {
        super::Socket {
            id: self.socket,
            out: self.out.clone(),
            kill: self.kill.clone(),
        }
    }

    fn send(&self, frame: String) {
        if self.out.try_send(frame.into()).is_err() {
            self.kill.send_replace(Some(Close::SlowConsumer));
        }
    }

    fn reply(&self, id: &str, result: Result<String, RpcError>) {
        match result {
            Ok(r) => self.send(format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{r}}}"#)),
            Err(e) => self.send(e.frame(id)),
        }
    }
}

/// Handles one text frame from the client.
pub async fn on_client_frame(conn: &mut Conn, text: &str) {
    let env = conn.registry.env.clone();
    let frame = match wire::classify(text, &env.client_limits) {
        Ok(f) => f,
        Err(e) => {
            env.metrics
                .bad_client_frames
                .with_label_values(&[e.label()])
                .inc();
            if let wire::Refusal::Answer { id } = wire::refusal(text, &e) {
                let err = RpcError::with_code(e.json_rpc_code(), e.to_string(), None);
                conn.send(err.frame(id.as_ref().map_or("null", |i| i.raw)));
            }
            return;
        }
    };
    // Every frame counts against the rate (§7.6), responses too: a flood
    // of them slows only their sender's own requests. A response is still
    // never dropped for the rate when it answers a host's request (that
    // would fail the host's request); one that answers nothing is dropped
    // below before it is parsed.
    let answer = matches!(
        frame.kind,
        FrameKind::Response { .. } | FrameKind::ErrorResponse { .. }
    );
    if !conn.bucket.take() && !answer {
        return over_rate(conn, text, &frame.kind);
    }
    match &frame.kind {
        FrameKind::Request { id, method } => {
            env.metrics
                .client_requests
                .with_label_values(&[methods::label(method)])
                .inc();
            let id = id.raw.to_string();
            let params = match params_with_channel(method, frame.channel().is_some(), text) {
                Ok(p) => p,
                Err(err) => {
                    env.metrics
                        .bad_client_frames
                        .with_label_values(&["no_channel"])
                        .inc();
                    return conn.reply(&id, Err(err));
                }
            };
            let result = request(conn, &id, method, params).await;
            if let Some(result) = result {
                let close = matches!(&result, Err(e) if e.code == ahp_error_codes::UNSUPPORTED_PROTOCOL_VERSION);
                conn.reply(&id, result);
                if close {
                    conn.kill.send_replace(Some(Close::UnsupportedVersion));
                }
            }
        }
        FrameKind::Notification { method } => {
            let Some(session) = conn.session.clone() else {
                return;
            };
            match method.as_ref() {
                "dispatchAction" => dispatch(&session, params_of(text)),
                "unsubscribe" => unsubscribe(&session, params_of(text)),
                _ => env.metrics.client_notifications_dropped.inc(),
            }
        }
        FrameKind::Response { id } | FrameKind::ErrorResponse { id, .. } => {
            match (conn.session.clone(), id.as_u64()) {
                // Looked up by id first: only an answer the relay awaits
                // is parsed.
                (Some(session), Some(n)) if session.awaits_client_answer(n) => {
                    let answer = serde_json::from_str::<Value>(text).ok();
                    session.answer_host_request(n, answer.as_ref());
                }
                _ => env.metrics.client_notifications_dropped.inc(),
            }
        }
    }
}

/// A request's params, naming the root when a root-scoped method left out
/// `params.channel` (§4.1: VS Code sends `reconnect` so); any other method
/// without a channel is -32602.
fn params_with_channel(method: &str, has_channel: bool, text: &str) -> Result<Value, RpcError> {
    let mut params = params_of(text);
    if has_channel {
        return Ok(params);
    }
    if !methods::method(method).is_some_and(|m| m.handling.root_scoped()) {
        return Err(RpcError::invalid_params(
            "params.channel (a string) is required",
        ));
    }
    if params.is_null() {
        params = json!({});
    }
    if let Some(o) = params.as_object_mut() {
        o.insert("channel".into(), json!(ahp_types::ROOT_RESOURCE_URI));
    }
    Ok(params)
}

/// A frame over the connection's rate (§3.6): a request gets -32603
/// `reason = "rateLimited"`, a `dispatchAction` a rejection echo, another
/// notification is dropped; each is counted.
fn over_rate(conn: &Conn, text: &str, kind: &FrameKind<'_>) {
    let env = &conn.registry.env;
    env.metrics.limit_hits.with_label_values(&["rate"]).inc();
    match kind {
        FrameKind::Request { id, .. } => {
            let err = RpcError::limited(
                "rateLimited",
                "too many requests on this connection: retry after backoff",
                true,
            );
            conn.send(err.frame(id.raw));
        }
        FrameKind::Notification { method } if method.as_ref() == "dispatchAction" => {
            let params = params_of(text);
            let (Some(session), Some(channel), Some(seq)) = (
                conn.session.as_ref(),
                params.get("channel").and_then(Value::as_str),
                params.get("clientSeq").and_then(Value::as_i64),
            ) else {
                return;
            };
            let action = params.get("action").cloned().unwrap_or(Value::Null);
            let mut core = session.lock();
            session.reject_dispatch(&mut core, channel, &action, seq, "rate limited");
        }
        _ => {}
    }
}

fn params_of(text: &str) -> Value {
    serde_json::from_str::<Value>(text)
        .ok()
        .and_then(|mut v| v.get_mut("params").map(Value::take))
        .unwrap_or(Value::Null)
}

/// Answers or forwards one request; `None` when the answer comes later.
/// The method table decides how: nothing here lists methods.
async fn request(
    conn: &mut Conn,
    id: &str,
    method: &str,
    params: Value,
) -> Option<Result<String, RpcError>> {
    let Some(row) = methods::method(method) else {
        return Some(Err(RpcError::method_not_found(method)));
    };
    let params = match (row.params)(params) {
        Ok(p) => p,
        Err(e) => return Some(Err(e)),
    };
    match row.handling {
        Handling::Ping => return Some(Ok("null".into())),
        Handling::Initialize => return initialize(conn, id, params).await.err().map(Err),
        Handling::Reconnect => {
            let answer = super::reconnect::reconnect(conn, id, params).await;
            return answer.err().map(Err);
        }
        _ => {}
    }
    let Some(session) = conn.session.clone() else {
        return Some(Err(RpcError::invalid_request(format!(
            "{method} before initialize: send initialize first"
        ))));
    };
    let outcome = match row.handling {
        Handling::ListSessions => {
            let now = session.who();
            let caller = now.caller();
            let list = catalog::list_sessions(&session.env, caller, conn.socket, params);
            return Some(list);
        }
        Handling::Subscribe => subscribe(&session, id, params),
        Handling::Create(Created::Session) => create_session(&session, id, params).await,
        Handling::Create(Created::Chat) => create_chat(&session, id, params).await,
        Handling::Create(Created::Terminal) => create_terminal(&session, id, params).await,
        Handling::Routed { .. } => routed(&session, id, row, params),
        Handling::ByProvider => by_provider(&session, id, row, params),
        Handling::ByUri => by_uri(&session, id, method, params),
        Handling::Authenticate => session.authenticate(id, &params),
        _ => Err(RpcError::method_not_found(method)),
    };
    outcome.err().map(Err)
}

/// The highest offered version the relay speaks ([`SUPPORTED_VERSIONS`]),
/// whatever the order of the offer; a malformed entry is -32602 even beside
/// good ones (the SDK's reading of SemVer), and an offer with none the
/// relay speaks is -32005.
fn negotiate(offered: &[String]) -> Result<String, RpcError> {
    ahp_types::version::negotiate_protocol_version(offered).map_err(RpcError::invalid_params)?;
    offered
        .iter()
        .filter_map(|v| Some((crate::upstream::version::speaks(v)?, v)))
        .max_by_key(|(parsed, _)| *parsed)
        .map(|(_, v)| v.clone())
        .ok_or_else(|| RpcError::unsupported_version(SUPPORTED_VERSIONS))
}

async fn initialize(conn: &mut Conn, id: &str, params: Value) -> Result<(), RpcError> {
    if conn.session.is_some() {
        return Err(RpcError::invalid_request(
            "connection is already initialized",
        ));
    }
    let (p, _) = typed::<InitializeParams>(params)?;
    let version = negotiate(&p.protocol_versions)?;
    if p.client_id.is_empty() || p.client_id.len() > 256 {
        return Err(RpcError::invalid_params(
            "clientId must be 1 to 256 characters",
        ));
    }
    let cap = conn.registry.env.cfg.limits.subscriptions_per_session;
    let wanted = dedup_capped(p.initial_subscriptions.unwrap_or_default(), cap)?;
    let registry = conn.registry.clone();
    let key = conn.session_key(&p.client_id);
    let session = Arc::new(ClientSession::new(
        &registry,
        key,
        version.clone(),
        conn.principal.groups.clone(),
        conn.socket(),
    ));
    registry.attach(session.clone())?;
    conn.session = Some(session.clone());
    let mut taken = initial_snapshots(&session, &wanted).await;
    let mut core = session.lock();
    if !core.answers_on(conn.socket) {
        // A `reconnect` on another socket took the session over while the
        // snapshots were awaited: that socket gets its own answer, and
        // nothing is baselined on state this one never received.
        return Ok(());
    }
    let from = core.last();
    let mut snapshots = Vec::new();
    if wanted.iter().any(|c| c == ahp_types::ROOT_RESOURCE_URI) {
        core.subs.insert(ahp_types::ROOT_RESOURCE_URI.to_string());
        core.baselined
            .insert(ahp_types::ROOT_RESOURCE_URI.to_string());
        snapshots.push(json!({"resource": ahp_types::ROOT_RESOURCE_URI,
            "state": session.root_snapshot(&mut core), "fromSeq": from}));
    }
    for t in &mut taken {
        if let Some(o) = t.snapshot.as_object_mut() {
            o.insert("fromSeq".into(), json!(from));
        }
    }
    let mut result = initialize_result(&session, &version, from, snapshots);
    let dropped = fit_initial(&session, &mut core, &mut result, &mut taken);
    session.respond(&mut core, id, &result.to_string());
    drop(core);
    for (hub, host_uri) in dropped {
        unsubscribe_upstream(&session, &hub, &host_uri);
    }
    let mut core = session.lock();
    for InitialSnapshot {
        hub,
        host_uri,
        client_uri,
        ..
    } in taken
    {
        core.baselined.insert(client_uri.clone());
        core.subs.insert(client_uri);
        session.release(&mut core, &hub, &host_uri);
    }
    Ok(())
}

/// Subscribes `initialSubscriptions` (root aside) and waits for their
/// snapshots under one deadline; channels without a snapshot are not held
/// any longer (a late answer finds no entry and is dropped).
async fn initial_snapshots(
    session: &Arc<ClientSession>,
    wanted: &[String],
) -> Vec<InitialSnapshot> {
    let mut waits = Vec::new();
    for channel in wanted.iter().filter(|c| *c != ahp_types::ROOT_RESOURCE_URI) {
        if let Ok(wait) = subscribe_initial(session, channel) {
            waits.push(wait);
        }
    }
    let deadline = tokio::time::Instant::now() + session.env.cfg.limits.upstream_request();
    let mut taken = Vec::new();
    for (hub, host_uri, client_uri, rx) in waits {
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(Some(snapshot))) => taken.push(InitialSnapshot {
                hub,
                host_uri,
                client_uri,
                snapshot,
            }),
            _ => unhold(session, &hub.id, &host_uri),
        }
    }
    taken
}

/// A channel of `initialSubscriptions` whose host answered with a snapshot.
struct InitialSnapshot {
    hub: Arc<HostHub>,
    host_uri: String,
    client_uri: String,
    snapshot: Value,
}

/// Makes the `InitializeResult` fit the client frame limit: it keeps the
/// most host snapshots it can (smallest first) such that the frame, with the
/// note of what was left out, stays within `limits.max_frame_bytes`. A
/// channel left out is not subscribed (held envelopes dropped, the host told
/// to unsubscribe) and is named in `_meta["ahp-relay/notSubscribed"]` with
/// reason `tooLarge`. So `initialize` itself succeeds, as it does when a
/// channel's host does not answer, and a later `subscribe` of that channel
/// gets -32603 `tooLarge`. Returns the channels left out.
fn fit_initial(
    session: &ClientSession,
    core: &mut super::SessionCore,
    result: &mut Value,
    taken: &mut Vec<InitialSnapshot>,
) -> Vec<(Arc<HostHub>, String)> {
    // `{"jsonrpc":"2.0","id":…,"result":…}` around the result, id included,
    // and `,"_meta":{"ahp-relay/notSubscribed":[]}` when something is left out.
    const FRAME: usize = 64;
    const META: usize = 48;
    let limit = session.env.cfg.limits.max_frame_bytes;
    let base = result.to_string().len() + FRAME;
    let mut sized: Vec<(usize, usize, InitialSnapshot)> = taken
        .drain(..)
        .map(|t| {
            let note = json!({"resource": &t.client_uri, "reason": "tooLarge"});
            (
                t.snapshot.to_string().len() + 1,
                note.to_string().len() + 1,
                t,
            )
        })
        .collect();
    sized.sort_by_key(|(len, _, _)| *len);
    let fits = |keep: usize| {
        let kept: usize = sized[..keep].iter().map(|(l, _, _)| l).sum();
        let notes: usize = sized[keep..].iter().map(|(_, n, _)| n).sum();
        let meta = if keep < sized.len() { META + notes } else { 0 };
        base + kept + meta <= limit
    };
    let keep = (0..=sized.len()).rev().find(|&k| fits(k)).unwrap_or(0);
    let mut left_out = Vec::new();
    let mut dropped = Vec::new();
    for (i, (_, _, entry)) in sized.into_iter().enumerate() {
        if i < keep {
            if let Some(list) = result["snapshots"].as_array_mut() {
                list.push(entry.snapshot.clone());
            }
            taken.push(entry);
            continue;
        }
        if let Some(m) = core.chans.get_mut(&entry.hub.id) {
            m.remove(&entry.host_uri);
        }
        session.limit_hit("client_frame");
        left_out.push(json!({"resource": entry.client_uri, "reason": "tooLarge"}));
        dropped.push((entry.hub, entry.host_uri));
    }
    if let (false, Some(o)) = (left_out.is_empty(), result.as_object_mut()) {
        o.insert("_meta".into(), json!({"ahp-relay/notSubscribed": left_out}));
    }
    dropped
}

/// Tells `hub` this session no longer follows `host_uri` (over its link, if
/// one is open).
fn unsubscribe_upstream(session: &ClientSession, hub: &HostHub, host_uri: &str) {
    let link = session.lock().links.get(&hub.id).cloned();
    if let Some(link) = link {
        let frame =
            json!({"jsonrpc": "2.0", "method": "unsubscribe", "params": {"channel": host_uri}})
                .to_string();
        link.send(LinkCmd::Frame(frame));
    }
}

/// The relay's own `InitializeResult` (§6.6).
fn initialize_result(
    session: &ClientSession,
    version: &str,
    from: u64,
    snapshots: Vec<Value>,
) -> Value {
    let env = &session.env;
    let now = session.who();
    let who = now.subject();
    let mut result = json!({
        "protocolVersion": version,
        "serverSeq": from,
        "serverInfo": {"name": "ahp-relay", "version": env!("CARGO_PKG_VERSION")},
        "snapshots": snapshots,
        "completionTriggerCharacters": router::trigger_characters(env, who),
    });
    if let (Some(prefix), Some(o)) = (
        router::terminal_command_prefix(env, who),
        result.as_object_mut(),
    ) {
        o.insert("terminalCommandPrefix".into(), json!(prefix));
    }
    result
}

/// The session's link to `hub`, opened on first use — after the policy
/// allowed `method` on `channel` there; an invisible host gets `missing`
/// (the answer for something that does not exist), so no host is contacted
/// for it. Returns the link and the grant that allowed it.
fn link_for(
    session: &Arc<ClientSession>,
    hub: &Arc<crate::upstream::hub::HostHub>,
    method: &str,
    channel: &str,
    missing: impl FnOnce() -> RpcError,
) -> Result<(Arc<Link>, Grant), RpcError> {
    let need = router::method_permission(method)?;
    let grant = match router::gate(
        &session.env,
        session.who().caller(),
        hub,
        method,
        channel,
        need,
    ) {
        Ok(g) => g,
        Err(router::Denied::Invisible) => return Err(missing()),
        Err(router::Denied::NotPermitted | router::Denied::NotCreator) => {
            return Err(RpcError::permission_denied(method));
        }
    };
    Ok((open_link(session, hub)?, grant))
}

/// The session's link to `hub` (opened on first use), if the host is up and
/// the per-session link cap allows.
fn open_link(
    session: &Arc<ClientSession>,
    hub: &Arc<crate::upstream::hub::HostHub>,
) -> Result<Arc<Link>, RpcError> {
    if hub.status() == HostStatus::Down {
        return Err(RpcError::host_unavailable(&hub.id));
    }
    let mut core = session.lock();
    if let Some(l) = core.links.get(&hub.id) {
        return Ok(l.clone());
    }
    if core.links.len() >= session.env.cfg.limits.links_per_session {
        return Err(RpcError::internal(
            "too many hosts in use by this client session",
            Some(json!({"reason": "linkLimit", "retryable": false})),
        ));
    }
    let per_host = session.env.cfg.limits.links_per_host;
    if hub.links.load(std::sync::atomic::Ordering::Relaxed) >= per_host {
        return Err(RpcError::internal(
            "too many clients on this host right now",
            Some(json!({"reason": "hostLinkLimit", "host": &*hub.id, "retryable": true})),
        ));
    }
    let link = session.open_link_locked(&mut core, hub, Default::default());
    core.links.insert(hub.id.clone(), link.clone());
    Ok(link)
}

impl ClientSession {
    /// After a policy change: forgets subscribed channels the principal can
    /// no longer see (they lose their baseline, so `reconnect` cannot replay
    /// them), closes links to hosts it can no longer see, forgets the host
    /// objects it was shown only where it can no longer read
    /// ([`Self::forget_unreadable_refs`]) and revokes `authenticate` tokens
    /// on links to hosts it no longer operates
    /// ([`Self::revoke_tokens_gone`]). Returns whether any subscribed
    /// channel was lost.
    pub(crate) fn forget_invisible(&self) -> bool {
        self.forget_unreadable_refs();
        let subs: Vec<String> = self
            .lock()
            .subs
            .iter()
            .filter(|c| *c != ahp_types::ROOT_RESOURCE_URI)
            .cloned()
            .collect();
        let lost: Vec<String> = subs
            .into_iter()
            .filter(|c| router::host_for(&self.env, self.who().caller(), c).is_err())
            .collect();
        let now = self.who();
        let who = now.subject();
        let gone: Vec<Arc<str>> = self
            .env
            .hosts
            .all()
            .into_iter()
            .filter(|h| self.env.access.grant_on(who, h).is_none())
            .map(|h| h.id.clone())
            .collect();
        let mut core = self.lock();
        for c in &lost {
            core.baselined.remove(c);
            core.subs.remove(c);
        }
        for chans in core.chans.values_mut() {
            chans.retain(|_, chan| !lost.iter().any(|c| c == chan.client()));
        }
        for host in gone {
            core.links.remove(&host);
            core.chans.remove(&host);
        }
        drop(core);
        // After the links to invisible hosts are gone: they take their
        // tokens with them, nothing to send there.
        self.revoke_tokens_gone();
        !lost.is_empty()
    }
}

impl ClientSession {
    /// Forgets the content references (and other host objects) this client
    /// was shown only in channels it can no longer see or in answers from
    /// hosts it can no longer see (contract §7.6), so naming one is again
    /// as unknown as a random URI. Returns how many were forgotten.
    pub(crate) fn forget_unreadable_refs(&self) -> usize {
        use crate::names::seen::ShownIn;
        let now = self.who();
        let (who, caller) = (now.subject(), now.caller());
        self.seen.retain_shown(|at| match at {
            ShownIn::Channel(c) if c == ahp_types::ROOT_RESOURCE_URI => true,
            ShownIn::Channel(c) => router::host_for(&self.env, caller, c).is_ok(),
            ShownIn::Answer(host) => self
                .env
                .hosts
                .get(host)
                .is_some_and(|h| self.env.access.grant_on(who, &h).is_some()),
        })
    }
}

/// Sends a request on `link` and records what its answer needs; the answer
/// must come within `limits.upstream_request_secs` (else -32603 `timeout`).
/// Refused with -32603 when the session already awaits
/// `limits.pending_requests_per_connection` answers (`initialSubscriptions`
/// aside: they are capped by the subscription limit) or the link's queue
/// is full (`hostBusy`).
fn forward(
    session: &Arc<ClientSession>,
    link: &Link,
    id: &str,
    method: &str,
    params: Value,
    kind: PendingKind,
) -> Result<(), RpcError> {
    let n = link.next_id();
    let frame = crate::rpc::request_frame(n, method, &params);
    {
        let mut core = session.lock();
        if !matches!(kind, PendingKind::Initial { .. }) {
            session.check_pending(&core)?;
        }
        core.pending.insert(
            (link.id, n),
            Pending {
                client_id: id.to_string(),
                method: method.to_string(),
                kind,
            },
        );
    }
    if !link.send(LinkCmd::Frame(frame)) {
        session.lock().pending.remove(&(link.id, n));
        if link.is_busy() {
            session.limit_hit("link_queue");
            return Err(RpcError::limited(
                "hostBusy",
                format!("host {} is not reading fast enough: retry", link.host.id),
                true,
            ));
        }
        return Err(RpcError::host_unavailable(&link.host.id));
    }
    limits::expire_after(session, link.id, n, link.host.id.clone());
    Ok(())
}

fn subscribe(session: &Arc<ClientSession>, id: &str, params: Value) -> Result<(), RpcError> {
    let (p, v) = typed::<SubscribeParams>(params)?;
    if p.channel == ahp_types::ROOT_RESOURCE_URI {
        let mut core = session.lock();
        core.subs.insert(p.channel.clone());
        core.baselined.insert(p.channel.clone());
        let state = session.root_snapshot(&mut core);
        let snap =
            json!({"snapshot": {"resource": p.channel, "state": state, "fromSeq": core.last()}});
        session.respond(&mut core, id, &snap.to_string());
        return Ok(());
    }
    let (hub, host_uri) = router::host_for(&session.env, session.who().caller(), &p.channel)?;
    session.check_subscription(&p.channel)?;
    let (link, grant) = link_for(session, &hub, "subscribe", &p.channel, || {
        router::not_found(&p.channel)
    })?;
    let params = router::to_host(
        &session.env,
        session.who().caller(),
        &hub,
        &grant,
        v,
        "params:subscribe",
        &host_uri,
    )?;
    hold(session, &hub.id, &host_uri, &p.channel);
    let kind = PendingKind::Subscribe {
        client_channel: p.channel,
        host_channel: host_uri.clone(),
    };
    forward(session, &link, id, "subscribe", params, kind)
        .inspect_err(|_| unhold(session, &hub.id, &host_uri))
}

/// Stops holding a host channel whose subscribe never reached the host.
fn unhold(session: &ClientSession, host: &Arc<str>, host_uri: &str) {
    if let Some(m) = session.lock().chans.get_mut(host) {
        m.remove(host_uri);
    }
}

/// Starts holding a host channel's envelopes until its snapshot is written.
fn hold(session: &ClientSession, host: &Arc<str>, host_uri: &str, client_uri: &str) {
    let mut core = session.lock();
    core.chans.entry(host.clone()).or_default().insert(
        host_uri.to_string(),
        Chan::Holding {
            client: client_uri.into(),
            held: Vec::new(),
            from: None,
        },
    );
}

type InitialWait = (
    Arc<crate::upstream::hub::HostHub>,
    String,
    String,
    oneshot::Receiver<Option<Value>>,
);

fn subscribe_initial(session: &Arc<ClientSession>, channel: &str) -> Result<InitialWait, RpcError> {
    let (hub, host_uri) = router::host_for(&session.env, session.who().caller(), channel)?;
    let (link, _) = link_for(session, &hub, "subscribe", channel, || {
        router::not_found(channel)
    })?;
    hold(session, &hub.id, &host_uri, channel);
    let (tx, rx) = oneshot::channel();
    forward(
        session,
        &link,
        "null",
        "subscribe",
        json!({"channel": host_uri}),
        PendingKind::Initial {
            host_channel: host_uri.clone(),
            reply: tx,
        },
    )
    .inspect_err(|_| unhold(session, &hub.id, &host_uri))?;
    Ok((hub, host_uri, channel.to_string(), rx))
}

/// A create never adopts an object the host already has (§4.2): a URI the
/// host lists — a catalog session, a chat of a listed session, a root
/// terminal — is refused with the code the host itself would give (-32003
/// for sessions, -32010 otherwise) before anything is reserved, so no
/// store entry ever names a host object its creator did not make.
fn refuse_host_object(session: &ClientSession, hub: &HostHub, uri: &str) -> Result<(), RpcError> {
    use crate::names::qualify::{ChannelKind, channel_kind};
    let kind = channel_kind(uri);
    let exists = match kind {
        ChannelKind::Session => hub.has_session(uri),
        ChannelKind::Chat => hub.session_of_chat(uri).is_some(),
        ChannelKind::Terminal => hub.terminal_claim(uri).is_some(),
        ChannelKind::Other => false,
    };
    if !exists {
        return Ok(());
    }
    session.limit_hit("host_object");
    Err(if kind == ChannelKind::Session {
        RpcError::session_exists(uri)
    } else {
        RpcError::already_exists(uri)
    })
}

/// Reserves a client-chosen URI (checked by [`check_client_uri`]) in the
/// store for `host`, after [`refuse_host_object`]. The write (an fsync) runs
/// on a blocking thread, never on a runtime worker; it is durable before
/// the create is forwarded. At `limits.reservations_per_principal` live
/// entries the create gets -32603 `reason = "quota"`.
async fn reserve(
    session: &ClientSession,
    hub: &HostHub,
    uri: &str,
    scheme: &str,
) -> Result<(), RpcError> {
    refuse_host_object(session, hub, uri)?;
    let owner = Owner {
        issuer: session.key.principal.issuer.clone(),
        subject: session.key.principal.subject.clone(),
        groups: session.who().subject().groups.to_vec(),
    };
    let store = session.env.store.clone();
    let limits = &session.env.cfg.limits;
    let quota = crate::names::store::Quota {
        live: limits.reservations_per_principal,
        tombstones: limits.tombstones_per_principal,
    };
    let (u, host) = (uri.to_string(), hub.id.to_string());
    let now = crate::identity::unix_now();
    let written =
        tokio::task::spawn_blocking(move || store.reserve_within(&u, &host, &owner, now, quota))
            .await
            .unwrap_or_else(|e| Err(StoreError::Unavailable(e.to_string())));
    match written {
        Ok(()) => Ok(()),
        Err(StoreError::Taken { .. }) if scheme == "ahp-session" => {
            Err(RpcError::session_exists(uri))
        }
        Err(StoreError::Taken { .. }) => Err(RpcError::already_exists(uri)),
        Err(StoreError::Quota { max }) => {
            session.limit_hit("quota");
            Err(RpcError::limited(
                "quota",
                format!("at most {max} live created URIs per principal: dispose some first"),
                false,
            ))
        }
        Err(StoreError::TombstoneQuota { max }) => {
            session.limit_hit("quota");
            Err(RpcError::limited(
                "quota",
                format!(
                    "at most {max} recently disposed URIs per principal: their names are kept \
                     for tombstone_ttl_secs, create again once they expire"
                ),
                false,
            ))
        }
        Err(e) => Err(RpcError::internal(
            format!("URI store unavailable: {e}"),
            Some(json!({"reason": "storeUnavailable", "retryable": true})),
        )),
    }
}

/// Frees a reservation whose create never reached the host, on a blocking
/// thread.
fn release_later(session: &ClientSession, uri: &str) {
    let store = session.env.store.clone();
    let uri = uri.to_string();
    tokio::task::spawn_blocking(move || {
        let _ = store.release(&uri);
    });
}

async fn create_session(
    session: &Arc<ClientSession>,
    id: &str,
    params: Value,
) -> Result<(), RpcError> {
    let (p, v) = typed::<CreateSessionParams>(params)?;
    let name = router::check_client_session_uri(&p.channel)?;
    let env = &session.env;
    let hub = match p.provider.as_deref() {
        Some(provider) => names::read_provider(provider)
            .and_then(|(_, h)| env.hosts.get(&h))
            .ok_or_else(|| RpcError::provider_not_found(provider))?,
        None => router::only_agent_host(env, session.who().subject()).ok_or_else(|| {
            RpcError::invalid_params(
                "several agents are available: give provider (<provider>.<host>)",
            )
        })?,
    };
    if name.host.as_deref().is_some_and(|h| h != &*hub.id) {
        return Err(RpcError::invalid_params(
            "the session URI's scheme names another host than the provider",
        ));
    }
    let (link, grant) = link_for(session, &hub, "createSession", &p.channel, || {
        RpcError::provider_not_found(p.provider.as_deref().unwrap_or_default())
    })?;
    let mut params = router::to_host(
        &session.env,
        session.who().caller(),
        &hub,
        &grant,
        v,
        "params:createSession",
        &name.key,
    )?;
    if let (Some(token), Some(o)) = (p.progress_token.as_deref(), params.as_object_mut()) {
        o.insert(
            "progressToken".into(),
            json!(format!("{}:{token}", session.upstream_id)),
        );
    }
    reserve(session, &hub, &name.key, "ahp-session").await?;
    let kind = PendingKind::Create {
        store_key: name.key.clone(),
        await_catalog: Some(name.key.clone()),
    };
    forward(session, &link, id, "createSession", params, kind)
        .inspect_err(|_| release_later(session, &name.key))
}

async fn create_chat(
    session: &Arc<ClientSession>,
    id: &str,
    params: Value,
) -> Result<(), RpcError> {
    let (p, v) = typed::<CreateChatParams>(params)?;
    let derived = router::is_derived_chat(&p.chat, &p.channel);
    if !derived {
        router::check_client_uri(&p.chat, &["ahp-chat"])?;
    }
    let (hub, host_session) = router::target_of(
        &session.env,
        session.who().caller(),
        &p.channel,
        "createChat",
    )?;
    let (link, grant) = link_for(session, &hub, "createChat", &p.channel, || {
        router::not_found(&p.channel)
    })?;
    let mut params = router::to_host(
        &session.env,
        session.who().caller(),
        &hub,
        &grant,
        v,
        "params:createChat",
        &host_session,
    )?;
    // A derived chat (`ahp-chat://<id>/<b64(session)>`) is named by its
    // session: no store entry, its host form is computed.
    if derived {
        let host_chat = router::derived_chat_host_form(&p.chat, &host_session);
        if let Some(o) = params.as_object_mut() {
            o.insert("chat".into(), json!(host_chat));
        }
        return forward(session, &link, id, "createChat", params, PendingKind::Plain);
    }
    reserve(session, &hub, &p.chat, "ahp-chat").await?;
    let kind = PendingKind::Create {
        store_key: p.chat.clone(),
        await_catalog: None,
    };
    forward(session, &link, id, "createChat", params, kind)
        .inspect_err(|_| release_later(session, &p.chat))
}

async fn create_terminal(
    session: &Arc<ClientSession>,
    id: &str,
    params: Value,
) -> Result<(), RpcError> {
    let (p, v) = typed::<CreateTerminalParams>(params)?;
    // VS Code's workbench names its terminals `agenthost-terminal:/<uuid>`.
    router::check_client_uri(&p.channel, &["ahp-terminal", "agenthost-terminal"])?;
    let env = &session.env;
    let hub = match &p.claim {
        ahp_types::state::TerminalClaim::Session(c) => {
            router::target_of(
                &session.env,
                session.who().caller(),
                &c.session,
                "createTerminal",
            )?
            .0
        }
        ahp_types::state::TerminalClaim::Client(_) => {
            router::client_terminal_host(env, session.who().caller(), p.cwd.as_deref())?
        }
    };
    let (link, grant) = link_for(session, &hub, "createTerminal", &p.channel, || {
        router::not_found(&p.channel)
    })?;
    let params = router::to_host(
        &session.env,
        session.who().caller(),
        &hub,
        &grant,
        v,
        "params:createTerminal",
        &p.channel,
    )?;
    reserve(session, &hub, &p.channel, "ahp-terminal").await?;
    let kind = PendingKind::Create {
        store_key: p.channel.clone(),
        await_catalog: None,
    };
    forward(session, &link, id, "createTerminal", params, kind)
        .inspect_err(|_| release_later(session, &p.channel))
}

/// A request routed by its channel: the router decides everything
/// (`router::plan_routed`, from the method's row); the session opens the
/// link, forwards, and tombstones a client-chosen URI a dispose removes.
fn routed(
    session: &Arc<ClientSession>,
    id: &str,
    row: &methods::Method,
    params: Value,
) -> Result<(), RpcError> {
    let channel = params
        .get("channel")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let plan = router::plan_routed(&session.env, session.who().caller(), row, params)?;
    let link = open_link(session, &plan.hub)?;
    let kind = if row.disposes() {
        let verbatim = matches!(
            names::read_client_uri(&channel),
            Ok(names::ClientName::Verbatim { .. })
        );
        PendingKind::Dispose {
            store_key: verbatim.then_some(channel),
        }
    } else {
        PendingKind::Plain
    };
    forward(session, &link, id, row.name, plan.params, kind)
}

/// A request routed by its provider or the session it names: the router
/// decides the host and translates every name (`router::plan_by_provider`).
fn by_provider(
    session: &Arc<ClientSession>,
    id: &str,
    row: &methods::Method,
    params: Value,
) -> Result<(), RpcError> {
    let plan = router::plan_by_provider(&session.env, session.who().caller(), row, params)?;
    let link = open_link(session, &plan.hub)?;
    forward(
        session,
        &link,
        id,
        row.name,
        plan.params,
        PendingKind::Plain,
    )
}

/// `dispatchAction`: routed by channel with the action translated; refused
/// ones get a relay rejection echo (§5.3); invisible channels get no echo.
fn dispatch(session: &Arc<ClientSession>, params: Value) {
    let channel = params
        .get("channel")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let Some(client_seq) = params.get("clientSeq").and_then(Value::as_i64) else {
        session.env.metrics.client_notifications_dropped.inc();
        return;
    };
    let action = params.get("action").cloned().unwrap_or(Value::Null);
    let reject = |reason: &str| {
        let mut core = session.lock();
        session.reject_dispatch(&mut core, &channel, &action, client_seq, reason);
    };
    if channel == ahp_types::ROOT_RESOURCE_URI
        && action.get("type").and_then(Value::as_str) == Some("root/configChanged")
    {
        return root_config(session, client_seq, &action);
    }
    let target =
        match router::authorize_dispatch(&session.env, session.who().caller(), &channel, &action) {
            Ok(t) => t,
            Err(router::DispatchRefusal::Silent) => return,
            Err(router::DispatchRefusal::Reject(reason)) => return reject(&reason),
        };
    let Ok(link) = open_link(session, &target.hub) else {
        return reject(&format!("host {} unavailable", target.hub.id));
    };
    let frame = json!({"jsonrpc": "2.0", "method": "dispatchAction", "params": {
        "channel": target.host_channel, "clientSeq": client_seq, "action": target.action}});
    if !link.send(LinkCmd::Dispatch {
        frame: frame.to_string(),
        client_channel: channel.clone(),
        action: action.clone(),
        client_seq,
    }) {
        if link.is_busy() {
            session.limit_hit("link_queue");
            return reject(&format!("host {} busy: retry", target.hub.id));
        }
        return reject(&format!("host {} unavailable", target.hub.id));
    }
    let registration = (target.hub.id.clone(), target.host_channel);
    match target.action_type.as_str() {
        "session/activeClientSet" => {
            session.lock().registered.insert(registration);
        }
        "session/activeClientRemoved" => {
            session.lock().registered.remove(&registration);
        }
        _ => {}
    }
}

/// `unsubscribe`: the relay stops delivering at once and tells the host.
fn unsubscribe(session: &Arc<ClientSession>, params: Value) {
    let Some(channel) = params
        .get("channel")
        .and_then(Value::as_str)
        .map(str::to_string)
    else {
        return;
    };
    session.lock().subs.remove(&channel);
    if channel == ahp_types::ROOT_RESOURCE_URI {
        return;
    }
    let Ok((hub, host_uri)) = router::host_for(&session.env, session.who().caller(), &channel)
    else {
        return;
    };
    if let Some(m) = session.lock().chans.get_mut(&hub.id) {
        m.remove(&host_uri);
    }
    unsubscribe_upstream(session, &hub, &host_uri);
}

/// A client `root/configChanged`: forwarded to every host on which the
/// principal is admin (their echoes on the client's links are discarded,
/// as all root actions there are, §6.2) and answered with one relay echo —
/// accepted when at least one host took it, else a rejection echo. The
/// merged root has no `config`, so the accepted echo changes nothing in the
/// client's root state.
fn root_config(session: &Arc<ClientSession>, client_seq: i64, action: &Value) {
    let root = ahp_types::ROOT_RESOURCE_URI;
    let hosts = match router::root_config_hosts(&session.env, session.who().caller()) {
        Ok(h) => h,
        Err(reason) => {
            let mut core = session.lock();
            return session.reject_dispatch(&mut core, root, action, client_seq, &reason);
        }
    };
    let frame = json!({"jsonrpc": "2.0", "method": "dispatchAction",
        "params": {"channel": root, "clientSeq": client_seq, "action": action}})
    .to_string();
    let sent = hosts
        .iter()
        .filter_map(|hub| open_link(session, hub).ok())
        .filter(|link| link.send(LinkCmd::Frame(frame.clone())))
        .count();
    let mut core = session.lock();
    if sent == 0 {
        let reason = "no host took root/configChanged";
        return session.reject_dispatch(&mut core, root, action, client_seq, reason);
    }
    session.accept_dispatch(&mut core, root, action, client_seq);
}

/// A root-scoped resource command (`resource*`, `createResourceWatch`),
/// routed by the URI it names; a copy or move must stay on one host
/// (another host's destination → -32602). Every name in it is translated
/// and authorized on that host; decisions are audited like writes.
fn by_uri(
    session: &Arc<ClientSession>,
    id: &str,
    method: &str,
    params: Value,
) -> Result<(), RpcError> {
    let env = &session.env;
    let now = session.who();
    let caller = now.caller();
    let uri = params
        .get("uri")
        .or_else(|| params.get("source"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let uri = uri.as_str();
    let hub = router::resource_host(env, caller, uri)?;
    if let Some(dest) = params.get("destination").and_then(Value::as_str)
        && !Arc::ptr_eq(&router::resource_host(env, caller, dest)?, &hub)
    {
        return Err(RpcError::invalid_params(
            "source and destination are on different hosts",
        ));
    }
    let params = router::resource_to_host(env, caller, &hub, method, uri, params)?;
    let link = open_link(session, &hub)?;
    forward(session, &link, id, method, params, PendingKind::Plain)
}

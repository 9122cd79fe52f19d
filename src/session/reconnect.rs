//! `reconnect` through the relay (contract §5.5): the relay answers from its
//! own buffer when it can prove nothing is missing, and otherwise gives fresh
//! snapshots obtained by *re-baselining* links — a new link initialized with
//! the same upstream id and the client's channels as `initialSubscriptions`,
//! adopted before the old link closes. It never `unsubscribe`s/`subscribe`s
//! upstream for this, which would make hosts drop the client from
//! `activeClients` and fail its tool calls.
//!
//! The response is the cut: it is written under the session lock, and held
//! envelopes are numbered after it.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use ahp_types::commands::ReconnectParams;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use super::request::Conn;
use super::{Chan, ClientSession, SessionCore};
use crate::policy::Permission;
use crate::route::methods::typed;
use crate::route::router::{gate, host_for};
use crate::rpc::RpcError;
use crate::upstream::hub::HostHub;
use crate::upstream::link::{Baseline, LinkCmd};

/// Handles `reconnect` on a socket without a session; writes the answer
/// itself. A session this relay does not know is adopted (§12.2) when the
/// request names a channel the principal may see.
pub async fn reconnect(conn: &mut Conn, id: &str, params: Value) -> Result<(), RpcError> {
    if conn.session.is_some() {
        return Err(RpcError::invalid_request(
            "connection is already initialized",
        ));
    }
    let (p, _) = typed::<ReconnectParams>(params)?;
    let registry = conn.registry.clone();
    let started = std::time::Instant::now();
    // The duration covers the whole answer, the snapshot settle included.
    let done = |label: &str| {
        let m = &registry.env.metrics;
        m.reconnects.with_label_values(&[label]).inc();
        m.reconnect_seconds.observe(started.elapsed().as_secs_f64());
    };
    let cap = registry.env.cfg.limits.subscriptions_per_session;
    let requested = super::limits::dedup_capped(p.subscriptions, cap).inspect_err(|_| {
        let m = &registry.env.metrics;
        m.limit_hits.with_label_values(&["subscriptions"]).inc();
    })?;
    let key = conn.session_key(&p.client_id);
    let watermark = p.last_seen_server_seq;
    let (session, generation, label) = match registry.session_of(&key) {
        Some(session) => {
            conn.session = Some(session.clone());
            adopt_identity(&session, &conn.principal.groups);
            let Some(generation) =
                replay_or_cut(&session, conn.socket(), id, watermark, &requested)
            else {
                done("replay");
                return Ok(());
            };
            (session, generation, "snapshot")
        }
        None => match adopt_session(conn, &key, watermark, &requested)? {
            Some((session, generation)) => (session, generation, "adopted"),
            None => {
                done("not_found");
                return Err(RpcError::not_found(
                    "no session for this clientId: initialize again",
                ));
            }
        },
    };
    let waits = rebaseline(&session, &requested);
    let settle = std::time::Duration::from_secs(registry.env.cfg.limits.upstream_settle_secs);
    let adopted = settle_all(waits, settle).await;
    let mut core = session.lock();
    if core.attach_gen() != generation || !core.answers_on(conn.socket) {
        // Another socket took the session over meanwhile (this one was
        // closed with 4009), or this socket was closed before its answer
        // (4000, 4008): the client never sees these snapshots, so nothing
        // is adopted or baselined — its next `reconnect` must get snapshots
        // again, never a replay built on state it did not receive.
        return Ok(());
    }
    answer_snapshots(&session, &mut core, id, &requested, adopted);
    drop(core);
    done(label);
    Ok(())
}

/// §12.2: a `reconnect` for a (principal, clientId) this relay does not
/// know — its replica died, restarted or was drained — gets a new session
/// under the same upstream id (links re-baselined, so hosts see the same
/// client come back), numbering above both its S0 and the client's
/// watermark, attached to this socket and cut for a `snapshot` answer.
/// `None` when the request names nothing the principal may see: that stays
/// `NotFound`, so a stranger's guess at a clientId learns nothing.
fn adopt_session(
    conn: &mut Conn,
    key: &super::SessionKey,
    watermark: i64,
    requested: &[String],
) -> Result<Option<(Arc<ClientSession>, u64)>, RpcError> {
    let registry = conn.registry.clone();
    let env = &registry.env;
    let groups = &conn.principal.groups;
    let who = crate::policy::Subject {
        principal: &key.principal,
        groups,
    };
    let caller_sees = |c: &String| {
        c == ahp_types::ROOT_RESOURCE_URI
            || crate::names::namer::route(env.store.as_ref(), c)
                .and_then(|(h, hu)| env.hosts.get(&h).map(|hub| (hub, hu)))
                .is_some_and(|(hub, hu)| {
                    env.access
                        .grant_on(who, &hub)
                        .is_some_and(|g| env.access.sees_channel(who, &g, &hub, &hu))
                })
    };
    if !requested.iter().any(caller_sees) {
        return Ok(None);
    }
    let floor = u64::try_from(watermark).unwrap_or(0);
    let session = Arc::new(ClientSession::new(
        &registry,
        key.clone(),
        (ADOPTED_VERSION.to_string(), floor),
        groups.clone(),
        conn.socket(),
    ));
    registry.attach(session.clone())?;
    conn.session = Some(session.clone());
    let mut core = session.lock();
    hold_for_cut(&mut core);
    let generation = core.attach_gen();
    drop(core);
    Ok(Some((session, generation)))
}

/// The protocol version an adopted session speaks with its client: the
/// `reconnect` carries none, and the relay's wire contract is the same for
/// every version it speaks (§4.1); links still offer every version hosts
/// may speak.
const ADOPTED_VERSION: &str = "1.0.0";

/// §3.3: from this `reconnect` on, the session acts with the groups of the
/// token on the new socket (expiry and revocation are the socket's own,
/// checked by the edge). When the groups changed, everything the session
/// kept under the old ones is re-evaluated before the answer is written:
/// channels and links it may no longer see are forgotten (so they are absent
/// from the answer), and no baseline survives, so the answer is a `snapshot`
/// built entirely under the new identity — never a `replay` of root state or
/// envelopes that were filtered for the old one.
fn adopt_identity(session: &Arc<ClientSession>, groups: &[String]) {
    if !session.set_groups(groups) {
        return;
    }
    session.forget_invisible();
    session.lock().channels.baselined.clear();
}

/// Attaches `socket` and answers with `replay` when the buffer proves
/// nothing is missing (`None`); otherwise begins the snapshot cut and
/// returns the attach generation the answer must still hold.
fn replay_or_cut(
    session: &Arc<ClientSession>,
    socket: super::Socket,
    id: &str,
    last_seen: i64,
    requested: &[String],
) -> Option<u64> {
    let mut core = session.lock();
    let generation = session.attach_socket(&mut core, socket);
    forget_unrequested(&mut core, requested);
    if let Some(result) = replay(session, &core, last_seen, requested) {
        session.respond(&mut core, id, &result);
        session.end_cut(&mut core);
        return None;
    }
    hold_for_cut(&mut core);
    Some(generation)
}

/// Begins a snapshot cut: nothing live may reach the new socket before the
/// answer — root actions are held back (root left out of `subs`) and every
/// host channel is held until its fresh snapshot.
fn hold_for_cut(core: &mut SessionCore) {
    core.begin_cut();
    core.channels.subs.remove(ahp_types::ROOT_RESOURCE_URI);
    core.channels.baselined.clear();
    core.channels.hold_live();
}

/// What one host's re-baselining link answered: the hub, its channels
/// (client, host form) and the `InitializeResult` (`None` if it did not
/// answer in time).
type Adopted = (Arc<HostHub>, Vec<(String, String)>, Option<Value>);

/// Waits for every host's re-baselining answer under one deadline: hosts
/// that do not answer delay the answer by the settle timeout once, not
/// once each (§5.8).
async fn settle_all(waits: Vec<Wait>, settle: std::time::Duration) -> Vec<Adopted> {
    let deadline = tokio::time::Instant::now() + settle;
    let mut adopted = Vec::new();
    for (hub, channels, rx) in waits {
        let init = tokio::time::timeout_at(deadline, rx)
            .await
            .ok()
            .and_then(Result::ok)
            .flatten();
        adopted.push((hub, channels, init));
    }
    adopted
}

/// Writes the `snapshot` answer (the cut) under the session lock: root from
/// the relay, host channels from the adopted links; channels the cut held
/// that were not re-baselined are released, held envelopes are numbered
/// after the answer, and the replaced links retire.
fn answer_snapshots(
    session: &ClientSession,
    core: &mut SessionCore,
    id: &str,
    requested: &[String],
    adopted: Vec<Adopted>,
) {
    let rebased: HashSet<(&str, &str)> = adopted
        .iter()
        .flat_map(|(hub, channels, _)| channels.iter().map(|(_, h)| (&*hub.id, h.as_str())))
        .collect();
    for (host, chans) in core.channels.chans.iter_mut() {
        chans.retain(|host_uri, _| rebased.contains(&(&**host, host_uri.as_str())));
    }
    let from = core.last();
    let mut snapshots = Vec::new();
    core.channels.orphaned.clear();
    if requested.iter().any(|c| c == ahp_types::ROOT_RESOURCE_URI) {
        let root = session.follow_root(core);
        snapshots.push(
            json!({"resource": ahp_types::ROOT_RESOURCE_URI, "state": root, "fromSeq": from}),
        );
    }
    let release = adopt(session, core, adopted, from, &mut snapshots);
    let result = json!({"type": "snapshot", "snapshots": snapshots});
    session.respond(core, id, &result.to_string());
    for (hub, host_uri) in release {
        session.release(core, &hub, &host_uri);
    }
    session.end_cut(core);
    // The new links' snapshots are adopted: the old links may close now.
    for old in std::mem::take(&mut core.links.retiring) {
        // Requests in flight on a replaced link will never be answered.
        session.fail_link_requests_locked(core, old.id, &RpcError::upstream_lost(&old.host.id));
    }
}

/// Adopts each re-baselined channel's snapshot (client form, `fromSeq` =
/// `from`) into `snapshots`; returns the host channels to release after
/// the answer. A channel without a snapshot (gone, or its host silent) is
/// omitted; if its host was unreachable the client is resynchronised when
/// the host returns (S16).
fn adopt(
    session: &ClientSession,
    core: &mut SessionCore,
    adopted: Vec<Adopted>,
    from: u64,
    snapshots: &mut Vec<Value>,
) -> Vec<(Arc<HostHub>, String)> {
    let mut release = Vec::new();
    for (hub, channels, init) in adopted {
        for (client, host_uri) in channels {
            // Decided again now (§7.6): a channel hidden while the links
            // re-baselined is left out, as one never seen.
            if host_for(&session.env, session.who().caller(), &client).is_err() {
                session.unfollow(core, &hub.id, &host_uri);
                continue;
            }
            let snap = init.as_ref().and_then(|r| snapshot_of(r, &host_uri));
            let (client_snap, host_from) = session.client_snapshot(&hub, snap, &client, from);
            let Some(s) = client_snap else {
                if let Some(m) = core.channels.chans.get_mut(&hub.id) {
                    m.remove(&host_uri);
                }
                if init.is_none() {
                    core.channels.orphaned.insert(hub.id.to_string());
                }
                continue;
            };
            if let Some(Chan::Holding { from: f, .. }) = core
                .channels
                .chans
                .get_mut(&hub.id)
                .and_then(|m| m.get_mut(&host_uri))
            {
                *f = host_from;
            }
            snapshots.push(s);
            core.channels.subs.insert(client.clone());
            core.channels.baselined.insert(client);
            release.push((hub.clone(), host_uri));
        }
    }
    release
}

/// channel got a snapshot in this session and kept continuity since.
fn replay(
    session: &ClientSession,
    core: &SessionCore,
    watermark: i64,
    requested: &[String],
) -> Option<String> {
    let w = u64::try_from(watermark).ok()?;
    if w < core.s0() || w > core.last() {
        return None;
    }
    let (frames, complete) = core.buffered_since(w);
    if !complete {
        return None;
    }
    let mut missing = Vec::new();
    for c in requested {
        // A channel without a baseline in this session (never snapshotted,
        // or hidden by a policy change) forces snapshots; one that had a
        // baseline but no longer routes (disposed) is reported `missing`.
        if !core.channels.baselined.contains(c) {
            return None;
        }
        let routable = c == ahp_types::ROOT_RESOURCE_URI
            || host_for(&session.env, session.who().caller(), c).is_ok();
        if !routable {
            missing.push(c.clone());
        }
    }
    // Filtered when the reply is built (§3.5): channels that no longer
    // route, or that the policy in force hides, contribute nothing.
    let wanted: HashSet<&str> = requested
        .iter()
        .filter(|c| !missing.contains(*c))
        .map(String::as_str)
        .collect();
    let mut actions = Vec::new();
    for f in &frames {
        #[derive(serde::Deserialize)]
        struct Env<'a> {
            #[serde(borrow)]
            params: &'a RawValue,
        }
        #[derive(serde::Deserialize)]
        struct Chan<'a> {
            channel: std::borrow::Cow<'a, str>,
        }
        let Ok(env) = serde_json::from_str::<Env<'_>>(f.to_str()) else {
            continue;
        };
        let Ok(ch) = serde_json::from_str::<Chan<'_>>(env.params.get()) else {
            continue;
        };
        if wanted.contains(ch.channel.as_ref()) {
            actions.push(env.params.get());
        }
    }
    let metrics = &session.env.metrics;
    metrics.replayed_envelopes.inc_by(actions.len() as u64);
    metrics.replay_sizes.observe(actions.len() as f64);
    let missing = serde_json::to_string(&missing).unwrap_or_else(|_| "[]".into());
    Some(format!(
        r#"{{"type":"replay","actions":[{}],"missing":{missing}}}"#,
        actions.join(",")
    ))
}

/// Stops following channels the client did not ask to keep.
fn forget_unrequested(core: &mut SessionCore, requested: &[String]) {
    let keep: HashSet<&str> = requested.iter().map(String::as_str).collect();
    core.channels.subs.retain(|c| keep.contains(c.as_str()));
    core.channels
        .baselined
        .retain(|c| keep.contains(c.as_str()));
    let mut unsubscribe = Vec::new();
    for (host, chans) in core.channels.chans.iter_mut() {
        chans.retain(|host_uri, chan| {
            let kept = keep.contains(chan.client());
            if !kept {
                unsubscribe.push((host.clone(), host_uri.clone()));
            }
            kept
        });
    }
    for (host, host_uri) in unsubscribe {
        if let Some(link) = core.links.open.get(&host) {
            let frame =
                json!({"jsonrpc": "2.0", "method": "unsubscribe", "params": {"channel": host_uri}});
            link.send(LinkCmd::Frame(frame.to_string()));
        }
    }
}

/// (client URI, host URI) pairs of one host.
type Channels = Vec<(String, String)>;
type Wait = (Arc<HostHub>, Channels, oneshot::Receiver<Option<Value>>);

/// Opens a fresh link per host with the requested channels as
/// `initialSubscriptions`; their envelopes are held from now on. The old
/// link is replaced (it closes when dropped) and its requests in flight fail.
fn rebaseline(session: &Arc<ClientSession>, requested: &[String]) -> Vec<Wait> {
    let mut by_host: BTreeMap<String, (Arc<HostHub>, Channels)> = BTreeMap::new();
    for c in requested
        .iter()
        .filter(|c| *c != ahp_types::ROOT_RESOURCE_URI)
    {
        let Ok((hub, host_uri)) = host_for(&session.env, session.who().caller(), c) else {
            continue;
        };
        if gate(
            &session.env,
            session.who().caller(),
            &hub,
            "subscribe",
            c,
            Permission::SessionsRead,
        )
        .is_err()
        {
            continue;
        }
        by_host
            .entry(hub.id.to_string())
            .or_insert_with(|| (hub.clone(), Vec::new()))
            .1
            .push((c.clone(), host_uri));
    }
    let mut waits = Vec::new();
    for (_, (hub, channels)) in by_host {
        let (tx, rx) = oneshot::channel();
        let baseline = Baseline {
            channels: channels.iter().map(|(_, h)| h.clone()).collect(),
            reply: Some(tx),
        };
        let mut core = session.lock();
        for (client, host_uri) in &channels {
            core.channels
                .hold(&hub.id, host_uri, client.as_str().into());
        }
        let link = session.open_link_locked(&mut core, &hub, baseline);
        if let Some(old) = core.links.open.insert(hub.id.clone(), link) {
            core.links.retiring.push(old);
        }
        waits.push((hub, channels, rx));
    }
    waits
}

/// The snapshot of `host_uri` in a host's `InitializeResult`.
fn snapshot_of<'a>(init: &'a Value, host_uri: &str) -> Option<&'a Value> {
    init.get("snapshots")?
        .as_array()?
        .iter()
        .find(|s| s.get("resource").and_then(Value::as_str) == Some(host_uri))
}

//! `initialize` (contract §4.1, §6.6): version negotiation, the session,
//! `initialSubscriptions` under one deadline, and a result that fits the
//! client frame limit.

use std::sync::Arc;

use ahp_types::commands::InitializeParams;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use super::Conn;
use super::execute::{forward, hold, open_link, unhold, unsubscribe_upstream};
use crate::route::methods::typed;
use crate::route::{plan, router};
use crate::rpc::RpcError;
use crate::session::limits::dedup_capped;
use crate::session::{ClientSession, PendingKind, ReplyTo};
use crate::upstream::hub::HostHub;

/// Protocol versions the relay speaks with clients (§4.1): exactly those
/// whose fields its rewrite table covers — `1.0.x` and `0.9.x` with the
/// specification's caret rules, and `0.10.0`, the version VS Code 1.141's
/// host and client speak, which VS Code declares to share the wire contract
/// of `0.9` and `1.0` (`agentHostProtocolCompatibility.ts`). `supportedVersions`
/// of a -32005 lists these ranges.
pub const SUPPORTED_VERSIONS: &[&str] = &["^1.0.0 <1.1.0", "^0.9.0", "0.10.0"];

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

pub(super) async fn initialize(conn: &mut Conn, id: &str, params: Value) -> Result<(), RpcError> {
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
        (version.clone(), 0),
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
    let hidden = drop_hidden(&session, &mut core, &mut taken);
    let from = core.last();
    let mut snapshots = Vec::new();
    if wanted.iter().any(|c| c == ahp_types::ROOT_RESOURCE_URI) {
        snapshots.push(json!({"resource": ahp_types::ROOT_RESOURCE_URI,
            "state": session.follow_root(&mut core), "fromSeq": from}));
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
    if !hidden.is_empty() {
        // Hidden after their snapshots noted what they show.
        session.forget_unreadable_refs();
    }
    for (hub, host_uri) in dropped.into_iter().chain(hidden) {
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
        core.channels.baselined.insert(client_uri.clone());
        core.channels.subs.insert(client_uri);
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
    for (hub, host_uri, client_uri, ticket, rx) in waits {
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(Some(snapshot))) => taken.push(InitialSnapshot {
                hub,
                host_uri,
                client_uri,
                snapshot,
            }),
            _ => unhold(session, &hub, &host_uri, ticket),
        }
    }
    taken
}

/// Leaves out of `taken` the channels the principal can no longer see (a
/// policy reloaded or a chat moved while their snapshots were awaited,
/// §7.6): like a channel it never saw, each is skipped without a note, its
/// hold removed. Returns them, for the hosts to be told to unsubscribe.
fn drop_hidden(
    session: &ClientSession,
    core: &mut crate::session::SessionCore,
    taken: &mut Vec<InitialSnapshot>,
) -> Vec<(Arc<HostHub>, String)> {
    let mut hidden = Vec::new();
    taken.retain(|t| {
        let seen = router::host_for(&session.env, session.who().caller(), &t.client_uri).is_ok();
        if !seen {
            if let Some(m) = core.channels.chans.get_mut(&t.hub.id) {
                m.remove(&t.host_uri);
            }
            hidden.push((t.hub.clone(), t.host_uri.clone()));
        }
        seen
    });
    hidden
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
    core: &mut crate::session::SessionCore,
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
        if let Some(m) = core.channels.chans.get_mut(&entry.hub.id) {
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

type InitialWait = (
    Arc<crate::upstream::hub::HostHub>,
    String,
    String,
    u64,
    oneshot::Receiver<Option<Value>>,
);

fn subscribe_initial(session: &Arc<ClientSession>, channel: &str) -> Result<InitialWait, RpcError> {
    let params = json!({ "channel": channel });
    let planned = plan::subscribe(&session.env, session.who().caller(), params)?;
    let link = open_link(session, &planned.hub)?;
    let (hub, host_uri) = (planned.hub, planned.host_channel);
    let ticket = hold(session, &hub.id, &host_uri, channel);
    let (tx, rx) = oneshot::channel();
    let kind = PendingKind::Initial {
        host_channel: host_uri.clone(),
        ticket,
        reply: tx,
    };
    forward(
        session,
        &link,
        &ReplyTo::nobody(),
        "subscribe",
        planned.params,
        kind,
    )
    .inspect_err(|_| unhold(session, &hub, &host_uri, ticket))?;
    Ok((hub, host_uri, channel.to_string(), ticket, rx))
}

//! Executing a plan (contract §4.2, §5.2, §5.8): the session's link to the
//! target host, holding a subscribed channel until its snapshot, reserving
//! a client-chosen URI, forwarding with what the answer needs recorded.
//! Nothing here decides access: [`crate::route::plan`] did.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::names::store::{Owner, StoreError};
use crate::route::files::{self, Inside};
use crate::route::plan::{Effect, Plan};
use crate::rpc::RpcError;
use crate::session::limits;
use crate::session::{ClientSession, Pending, PendingKind, ReplyTo, Rights};
use crate::upstream::hub::{HostHub, HostStatus};
use crate::upstream::link::{Link, LinkCmd};

/// Tells `hub` this session no longer follows `host_uri` (over its link, if
/// one is open).
pub(crate) fn unsubscribe_upstream(session: &ClientSession, hub: &HostHub, host_uri: &str) {
    let link = session.lock().links.open.get(&hub.id).cloned();
    if let Some(link) = link {
        let frame =
            json!({"jsonrpc": "2.0", "method": "unsubscribe", "params": {"channel": host_uri}})
                .to_string();
        link.send(LinkCmd::Frame(frame));
    }
}

/// The session's link to `hub` (opened on first use), if the host is up and
/// the per-session link cap allows.
pub(crate) fn open_link(
    session: &Arc<ClientSession>,
    hub: &Arc<crate::upstream::hub::HostHub>,
) -> Result<Arc<Link>, RpcError> {
    if hub.status() == HostStatus::Down {
        return Err(RpcError::host_unavailable(&hub.id));
    }
    let mut core = session.lock();
    if let Some(l) = core.links.open.get(&hub.id) {
        return Ok(l.clone());
    }
    if core.links.open.len() >= session.env.cfg.limits.links_per_session {
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
    core.links.open.insert(hub.id.clone(), link.clone());
    Ok(link)
}

/// Sends a request on `link` and records what its answer needs; the answer
/// must come within `limits.upstream_request_secs` (else -32603 `timeout`).
/// Refused with -32603 when the session already awaits
/// `limits.pending_requests_per_connection` answers (`initialSubscriptions`
/// aside: they are capped by the subscription limit) or the link's queue
/// is full (`hostBusy`).
pub(super) fn forward(
    session: &Arc<ClientSession>,
    link: &Link,
    reply: &ReplyTo,
    method: &str,
    mut params: Value,
    kind: PendingKind,
) -> Result<(), RpcError> {
    let span = crate::otel::current_request();
    if let Some(parent) = crate::otel::traceparent(&span) {
        with_traceparent(&mut params, parent);
    }
    let n = link.next_id();
    let frame = crate::rpc::request_frame(n, method, &params);
    {
        let mut core = session.lock();
        // A link the session no longer has (its host hidden by a change of
        // rights, or replaced by re-baselining) never carries a request.
        if core.links.open.get(&link.host.id).map(|l| l.id) != Some(link.id) {
            return Err(RpcError::upstream_lost(&link.host.id));
        }
        if !matches!(kind, PendingKind::Initial { .. }) {
            session.check_pending(&core)?;
        }
        core.links.pending.insert(
            (link.id, n),
            Pending {
                reply: reply.clone(),
                method: method.to_string(),
                kind,
                span,
            },
        );
    }
    if !link.send(LinkCmd::Frame(frame)) {
        session.lock().links.pending.remove(&(link.id, n));
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

/// Names the relay's request span as the parent of the host's side: the
/// W3C `traceparent` in `params._meta` (kept or added; a client's own
/// `traceparent` is replaced, as an intermediary does). Only while traces
/// are exported; otherwise `_meta` passes through untouched.
fn with_traceparent(params: &mut Value, parent: String) {
    let Some(params) = params.as_object_mut() else {
        return;
    };
    let meta = params.entry("_meta").or_insert_with(|| json!({}));
    if let Some(meta) = meta.as_object_mut() {
        meta.insert(crate::otel::TRACEPARENT.into(), Value::String(parent));
    }
}

/// Ends hold `ticket` of a host channel whose subscribe never reached the
/// host (or got no snapshot), unless another request holds it since
/// (`ClientSession::end_channel_hold`).
pub(super) fn unhold(session: &ClientSession, hub: &Arc<HostHub>, host_uri: &str, ticket: u64) {
    session.end_channel_hold(&mut session.lock(), hub, host_uri, ticket);
}

/// Starts holding a host channel's envelopes until its snapshot is written;
/// returns the hold's ticket.
pub(super) fn hold(
    session: &ClientSession,
    host: &Arc<str>,
    host_uri: &str,
    client_uri: &str,
) -> u64 {
    session
        .lock()
        .channels
        .hold(host, host_uri, client_uri.into())
}

/// Reserves a client-chosen URI (its form and the host's catalog were
/// checked by the plan) in the store for `hub`. The write (an fsync) runs
/// on a blocking thread, never on a runtime worker; it is durable before
/// the create is forwarded. At `limits.reservations_per_principal` live
/// entries the create gets -32603 `reason = "quota"`.
pub(super) async fn reserve(
    session: &ClientSession,
    hub: &HostHub,
    uri: &str,
    is_session: bool,
) -> Result<(), RpcError> {
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
    let written = tokio::task::spawn_blocking(move || {
        let started = std::time::Instant::now();
        let written = store.reserve_within(&u, &host, &owner, now, quota);
        (written, started.elapsed())
    })
    .await;
    let written = match written {
        Ok((written, took)) => {
            let m = &session.env.metrics;
            m.store_write_seconds.observe(took.as_secs_f64());
            m.store_last_write_seconds.set(took.as_secs_f64());
            written
        }
        Err(e) => Err(StoreError::Unavailable(e.to_string())),
    };
    match written {
        Ok(()) => Ok(()),
        Err(StoreError::Taken { .. }) if is_session => Err(RpcError::session_exists(uri)),
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
pub(super) fn release_later(session: &ClientSession, uri: &str) {
    let store = session.env.store.clone();
    let uri = uri.to_string();
    tokio::task::spawn_blocking(move || {
        let _ = store.release(&uri);
    });
}

/// Executes `plan` for request `id` of `method`, decided under `rights`:
/// opens the link, then per [`Effect`] holds the subscribed channel, or
/// scopes the progress token and reserves the created URI, and forwards;
/// whatever was held or reserved is undone when the request never reaches
/// the host. A request that awaited something since its decision (paths
/// resolved, a store write) is forwarded only under the same rights, and
/// any request only on the link the session still has to its host.
pub(super) async fn execute(
    session: &Arc<ClientSession>,
    reply: &ReplyTo,
    (method, rights): (&str, Rights),
    plan: Plan,
) -> Result<(), RpcError> {
    let Plan {
        hub,
        host_channel,
        mut params,
        effect,
    } = plan;
    let link = open_link(session, &hub)?;
    match effect {
        Effect::Plain => forward(session, &link, reply, method, params, PendingKind::Plain),
        Effect::ConfirmInside { paths } => {
            for path in &paths {
                confirm_inside(session, &link, method, path).await?;
            }
            rights.hold(session)?;
            forward(session, &link, reply, method, params, PendingKind::Plain)
        }
        Effect::Move => {
            let kind = PendingKind::Move {
                host_chat: host_channel,
            };
            forward(session, &link, reply, method, params, kind)
        }
        Effect::Dispose { store_key } => {
            let kind = PendingKind::Dispose {
                store_key,
                host_uri: host_channel,
            };
            forward(session, &link, reply, method, params, kind)
        }
        Effect::Subscribe { client_channel } => {
            session.check_subscription(&client_channel)?;
            let ticket = hold(session, &hub.id, &host_channel, &client_channel);
            let kind = PendingKind::Subscribe {
                client_channel,
                host_channel: host_channel.clone(),
                ticket,
            };
            forward(session, &link, reply, method, params, kind)
                .inspect_err(|_| unhold(session, &hub, &host_channel, ticket))
        }
        Effect::Create {
            store_key,
            session: is_session,
            progress_token,
        } => {
            if let (Some(token), Some(o)) = (progress_token, params.as_object_mut()) {
                let scoped = format!("{}:{token}", session.upstream_id);
                o.insert("progressToken".into(), json!(scoped));
            }
            reserve(session, &hub, &store_key, is_session).await?;
            if let Err(e) = rights.hold(session) {
                release_later(session, &store_key);
                return Err(e);
            }
            let kind = PendingKind::Create {
                store_key: store_key.clone(),
                await_catalog: is_session.then(|| store_key.clone()),
            };
            forward(session, &link, reply, method, params, kind)
                .inspect_err(|_| release_later(session, &store_key))
        }
    }
}

/// The most ancestors of a path that does not exist yet that are resolved
/// looking for one that does; a deeper new path is refused.
const MAX_MISSING_DEPTH: usize = 32;

/// Confirms on the host that `path`, allowed by a session-directory scope,
/// lies inside one of its granting directories once `..` and symlinks are
/// resolved (contract §7.1, `route::files`): the host's canonical form of
/// the path (or of its nearest existing ancestor) against the directories
/// whose canonical form is the one the host lists (a directory that is, or
/// lies under, a symlink grants nothing). The decision is audited; a path
/// outside, or one the host will not resolve, is -32009.
async fn confirm_inside(
    session: &Arc<ClientSession>,
    link: &Link,
    method: &str,
    path: &Inside,
) -> Result<(), RpcError> {
    let canonical = match canonical_existing(session, link, &path.host_uri).await {
        Ok(c) => Some(c),
        Err(e) if e.code == ahp_types::errors::ahp_error_codes::PERMISSION_DENIED => None,
        Err(e) => return Err(e),
    };
    let mut dirs = Vec::new();
    for dir in &path.dirs {
        if let Ok(c) = resolve(session, link, dir, true).await
            && files::is_canonical(dir, &c)
        {
            dirs.push(c);
        }
    }
    let inside = canonical.is_some_and(|c| files::confirmed(&c, &dirs));
    let who = session.who();
    let on = (method, path.client_uri.as_str());
    files::decided(&session.env, who.caller(), &link.host, on, inside);
    if inside {
        Ok(())
    } else {
        Err(RpcError::permission_denied(method))
    }
}

/// The host's canonical URI of `uri`, or of its nearest existing ancestor
/// when it does not exist yet; a dangling symlink in its place (or an
/// ancestor's) is refused, since writing through it would create its
/// target wherever it points.
async fn canonical_existing(
    session: &Arc<ClientSession>,
    link: &Link,
    uri: &str,
) -> Result<String, RpcError> {
    let refused = || RpcError::permission_denied("cannot confirm the path on the host");
    let mut at = uri.to_string();
    for _ in 0..MAX_MISSING_DEPTH {
        match resolve(session, link, &at, true).await {
            Ok(c) => return Ok(c),
            Err(e) if e.code != ahp_types::errors::ahp_error_codes::NOT_FOUND => return Err(e),
            Err(_) => {}
        }
        if resolve(session, link, &at, false).await.is_ok() {
            return Err(refused());
        }
        at = files::parent(&at).ok_or_else(refused)?;
    }
    Err(refused())
}

/// The host's `resourceResolve` of `uri` (host form): its `uri` answer.
async fn resolve(
    session: &Arc<ClientSession>,
    link: &Link,
    uri: &str,
    follow: bool,
) -> Result<String, RpcError> {
    let params =
        json!({"channel": ahp_types::ROOT_RESOURCE_URI, "uri": uri, "followSymlinks": follow});
    let result = ask(session, link, "resourceResolve", params).await?;
    result
        .get("uri")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| RpcError::internal("the host's resourceResolve gave no uri", None))
}

/// Sends the relay's own request on `link` and waits for the host's raw
/// result (within `limits.upstream_request_secs`, like any request).
async fn ask(
    session: &Arc<ClientSession>,
    link: &Link,
    method: &str,
    params: Value,
) -> Result<Value, RpcError> {
    let (reply, answer) = tokio::sync::oneshot::channel();
    forward(
        session,
        link,
        &ReplyTo::nobody(),
        method,
        params,
        PendingKind::Internal { reply },
    )?;
    answer
        .await
        .unwrap_or_else(|_| Err(RpcError::host_unavailable(&link.host.id)))
}

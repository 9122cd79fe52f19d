//! Executing a plan (contract §4.2, §5.2, §5.8): the session's link to the
//! target host, holding a subscribed channel until its snapshot, reserving
//! a client-chosen URI, forwarding with what the answer needs recorded.
//! Nothing here decides access: [`crate::route::plan`] did.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::names::store::{Owner, StoreError};
use crate::route::plan::{Effect, Plan};
use crate::rpc::RpcError;
use crate::session::limits;
use crate::session::{Chan, ClientSession, Pending, PendingKind};
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
        core.links.pending.insert(
            (link.id, n),
            Pending {
                client_id: id.to_string(),
                method: method.to_string(),
                kind,
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

/// Stops holding a host channel whose subscribe never reached the host.
pub(super) fn unhold(session: &ClientSession, host: &Arc<str>, host_uri: &str) {
    if let Some(m) = session.lock().channels.chans.get_mut(host) {
        m.remove(host_uri);
    }
}

/// Starts holding a host channel's envelopes until its snapshot is written.
pub(super) fn hold(session: &ClientSession, host: &Arc<str>, host_uri: &str, client_uri: &str) {
    let mut core = session.lock();
    core.channels.chans.entry(host.clone()).or_default().insert(
        host_uri.to_string(),
        Chan::Holding {
            client: client_uri.into(),
            held: Vec::new(),
            from: None,
        },
    );
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
    let written =
        tokio::task::spawn_blocking(move || store.reserve_within(&u, &host, &owner, now, quota))
            .await
            .unwrap_or_else(|e| Err(StoreError::Unavailable(e.to_string())));
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

/// Executes `plan` for request `id` of `method`: opens the link, then per
/// [`Effect`] holds the subscribed channel, or scopes the progress token
/// and reserves the created URI, and forwards; whatever was held or
/// reserved is undone when the request never reaches the host.
pub(super) async fn execute(
    session: &Arc<ClientSession>,
    id: &str,
    method: &str,
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
        Effect::Plain => forward(session, &link, id, method, params, PendingKind::Plain),
        Effect::Dispose { store_key } => {
            let kind = PendingKind::Dispose { store_key };
            forward(session, &link, id, method, params, kind)
        }
        Effect::Subscribe { client_channel } => {
            session.check_subscription(&client_channel)?;
            hold(session, &hub.id, &host_channel, &client_channel);
            let kind = PendingKind::Subscribe {
                client_channel,
                host_channel: host_channel.clone(),
            };
            forward(session, &link, id, method, params, kind)
                .inspect_err(|_| unhold(session, &hub.id, &host_channel))
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
            let kind = PendingKind::Create {
                store_key: store_key.clone(),
                await_catalog: is_session.then(|| store_key.clone()),
            };
            forward(session, &link, id, method, params, kind)
                .inspect_err(|_| release_later(session, &store_key))
        }
    }
}

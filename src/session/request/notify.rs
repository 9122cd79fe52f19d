//! Client notifications (contract §5.3, §6.2): `dispatchAction` routed by
//! channel with its action translated and authorized, `unsubscribe`, and a
//! client `root/configChanged` sent to the hosts where the principal is
//! admin.

use std::sync::Arc;

use serde_json::{Value, json};

use super::execute::{open_link, unsubscribe_upstream};
use crate::route::router;
use crate::session::ClientSession;
use crate::upstream::link::LinkCmd;

/// `dispatchAction`: routed by channel with the action translated; refused
/// ones get a relay rejection echo (§5.3); invisible channels get no echo.
pub(super) fn dispatch(session: &Arc<ClientSession>, params: Value) {
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
            session.lock().links.registered.insert(registration);
        }
        "session/activeClientRemoved" => {
            session.lock().links.registered.remove(&registration);
        }
        _ => {}
    }
}

/// `unsubscribe`: the relay stops delivering at once and tells the host.
pub(super) fn unsubscribe(session: &Arc<ClientSession>, params: Value) {
    let Some(channel) = params
        .get("channel")
        .and_then(Value::as_str)
        .map(str::to_string)
    else {
        return;
    };
    {
        // Not followed from here on, so not continuous either: a later
        // `reconnect` listing the channel gets a snapshot (§5.5).
        let mut core = session.lock();
        core.channels.subs.remove(&channel);
        core.channels.baselined.remove(&channel);
    }
    if channel == ahp_types::ROOT_RESOURCE_URI {
        return;
    }
    let Ok((hub, host_uri)) = router::host_for(&session.env, session.who().caller(), &channel)
    else {
        return;
    };
    if let Some(m) = session.lock().channels.chans.get_mut(&hub.id) {
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

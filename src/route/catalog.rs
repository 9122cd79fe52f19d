//! `listSessions` across hosts (contract §6.3) from the watch links'
//! catalogs, with an opaque cursor MAC-protected and bound to the socket.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use serde_json::{Value, json};

use std::sync::Arc;

use super::{Caller, Env};

use crate::names::namer::{ToClient, is_store_entry};
use crate::names::qualify as names;
use crate::names::translate;
use crate::policy::Grant;
use crate::rpc::RpcError;
use crate::upstream::hub::{HostHub, HostStatus, IndexEntry};

/// `listSessions` across hosts (contract §6.3): newest first by parsed
/// `modifiedAt`, ties by client URI; sessions of unreachable hosts kept
/// and marked; an opaque cursor MAC-protected and bound to the socket.
pub fn list_sessions(
    env: &Env,
    caller: Caller<'_>,
    socket: u64,
    params: Value,
) -> Result<String, RpcError> {
    let limit_cap = env.cfg.limits.list_sessions_limit;
    let limit = match params.get("limit") {
        None | Some(Value::Null) => env.cfg.limits.list_sessions_unpaged_limit,
        Some(v) => match v.as_u64() {
            Some(l) if l >= 1 => (l as usize).min(limit_cap),
            _ => return Err(RpcError::invalid_params("limit must be a positive integer")),
        },
    };
    let after = match params.get("cursor") {
        None | Some(Value::Null) => None,
        Some(c) => Some(
            c.as_str()
                .and_then(|c| open_cursor(env, c, caller, socket))
                .ok_or_else(|| RpcError::invalid_params("unknown cursor"))?,
        ),
    };
    let mut lists = host_lists(env, caller, after.as_ref());
    let (page, more) = merge_page(env, caller, &mut lists, limit);
    let items: Vec<Value> = page
        .iter()
        .filter_map(|(hub, entry)| client_summary(env, hub, entry))
        .collect();
    let mut result = json!({"items": items});
    if more && let (Some((_, last)), Some(o)) = (page.last(), result.as_object_mut()) {
        o.insert(
            "nextCursor".into(),
            json!(seal_cursor(env, last.at, &last.client, caller, socket)),
        );
    }
    Ok(result.to_string())
}

/// One visible host's sorted catalog and where the page starts in it.
type HostList = (Arc<HostHub>, Grant, Arc<Vec<IndexEntry>>, usize);

/// The sorted catalog of every host the caller can see, each positioned
/// strictly after the cursor.
fn host_lists(env: &Env, caller: Caller<'_>, after: Option<&(i64, String)>) -> Vec<HostList> {
    let mut lists = Vec::new();
    for hub in env.hosts.all() {
        let Some(grant) = env.access.grant_on(caller.who, &hub) else {
            continue;
        };
        let index = hub.sorted_catalog(|uri| {
            // An unqualifiable URI sorts under an empty key; its summary
            // fails translation and is not listed.
            names::qualify(&hub.id, uri, |base| {
                is_store_entry(env.store.as_ref(), &hub.id, base)
            })
            .unwrap_or_default()
        });
        let start = match after {
            None => 0,
            Some((at, uri)) => index.partition_point(|e| {
                e.at > *at || (e.at == *at && e.client.as_ref() <= uri.as_str())
            }),
        };
        lists.push((hub, grant, index, start));
    }
    lists
}

/// Merges the per-host lists (k-way, newest first), keeping visible
/// entries, until the page is full and one more visible entry proves a
/// next page (`true`).
fn merge_page(
    env: &Env,
    caller: Caller<'_>,
    lists: &mut [HostList],
    limit: usize,
) -> (Vec<(Arc<HostHub>, IndexEntry)>, bool) {
    let mut page = Vec::new();
    loop {
        let next = lists
            .iter()
            .enumerate()
            .filter_map(|(i, (_, _, index, start))| index.get(*start).map(|e| (i, e)))
            .min_by(|(_, a), (_, b)| b.at.cmp(&a.at).then_with(|| a.client.cmp(&b.client)));
        let Some((i, entry)) = next else {
            return (page, false);
        };
        let entry = entry.clone();
        let (hub, grant, _, start) = &mut lists[i];
        *start += 1;
        if !env.access.sees_session(caller.who, grant, hub, &entry.host) {
            continue;
        }
        if page.len() == limit {
            return (page, true);
        }
        page.push((hub.clone(), entry));
    }
}

/// The client form of a listed session, marked when its host is not up
/// (§6.5); `None` if it was removed since the index was built or cannot be
/// translated.
fn client_summary(env: &Env, hub: &HostHub, entry: &IndexEntry) -> Option<Value> {
    let namer = ToClient {
        host: &hub.id,
        store: env.store.as_ref(),
        identity: None,
    };
    let (mut s, status) = hub.read(|v| {
        let mut s = v.catalog.get(entry.host.as_ref())?.clone();
        v.drop_disposed_chats(&mut s);
        Some((s, v.status))
    })?;
    translate::translate(&mut s, "@SessionSummary", &namer).ok()?;
    if status != HostStatus::Up
        && let Some(o) = s.as_object_mut()
    {
        let meta = o.entry("_meta").or_insert_with(|| json!({}));
        if let Some(m) = meta.as_object_mut() {
            m.insert("ahp-relay/hostState".into(), json!(status.label()));
        }
    }
    Some(s)
}

fn cursor_mac(env: &Env, body: &str, caller: Caller<'_>, socket: u64) -> String {
    let tag = env.keys.mac(&[
        b"listSessions\0",
        caller.upstream_id.as_bytes(),
        &socket.to_be_bytes(),
        body.as_bytes(),
    ]);
    tag.get(..22).unwrap_or(&tag).to_string()
}

fn seal_cursor(env: &Env, at: i64, uri: &str, caller: Caller<'_>, socket: u64) -> String {
    let body = B64.encode(json!([at, uri]).to_string());
    format!("{body}.{}", cursor_mac(env, &body, caller, socket))
}

fn open_cursor(env: &Env, cursor: &str, caller: Caller<'_>, socket: u64) -> Option<(i64, String)> {
    let (body, tag) = cursor.split_once('.')?;
    if cursor_mac(env, body, caller, socket) != tag {
        return None;
    }
    let v: Value = serde_json::from_slice(&B64.decode(body).ok()?).ok()?;
    Some((v.get(0)?.as_i64()?, v.get(1)?.as_str()?.to_string()))
}

//! The relay's `ahp-root://` (contract §6.1): the merge of the visible, up
//! hosts' root states with names qualified, computed per caller.

use serde_json::{Value, json};

use super::{Caller, Env};
use crate::names::namer::ToClient;
use crate::names::translate;
use crate::upstream::hub::HostStatus;
use crate::upstream::watch::RootField;

/// One field of the merged root as `caller` sees it.
pub fn root_field(env: &Env, field: RootField, caller: Caller<'_>) -> Value {
    let identity = caller.identity();
    let mut items = Vec::new();
    let mut active = 0i64;
    let who = caller.who;
    for hub in &env.hosts.all() {
        let Some(grant) = env.access.grant_on(who, hub) else {
            continue;
        };
        if field == RootField::ActiveSessions {
            let visible = hub.read(|v| {
                v.listed_sessions()
                    .filter(|uri| env.access.sees_session(who, &grant, hub, uri))
                    .count()
            });
            active += visible as i64;
            continue;
        }
        let Some(root) = hub.read(|v| {
            (v.status == HostStatus::Up)
                .then(|| v.root.clone())
                .flatten()
        }) else {
            continue;
        };
        let namer = ToClient {
            host: &hub.id,
            store: env.store.as_ref(),
            identity: Some(identity),
        };
        let (list, shape) = match field {
            RootField::Agents => (serde_json::to_value(&root.agents), "@Agent"),
            _ => (
                serde_json::to_value(root.terminals.unwrap_or_default()),
                "@TerminalInfo",
            ),
        };
        for mut item in list
            .ok()
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default()
        {
            if field == RootField::Terminals
                && !env.access.sees_terminal_info(who, &grant, hub, &item)
            {
                continue;
            }
            if translate::translate(&mut item, shape, &namer).is_err() {
                continue;
            }
            if field == RootField::Agents
                && let Some(name) = item.get_mut("displayName")
            {
                *name = json!(labelled(name.as_str().unwrap_or_default(), hub.label()));
            }
            items.push(item);
        }
    }
    match field {
        RootField::ActiveSessions => json!(active),
        _ => Value::Array(items),
    }
}

/// The relay's root state for one session: agents of up hosts with
/// qualified providers and labelled names, their terminals, and the
/// count of listed sessions; never `config` or host `_meta` (§6.1).
pub fn merged_root(env: &Env, caller: Caller<'_>) -> Value {
    json!({
        "agents": root_field(env, RootField::Agents, caller),
        "terminals": root_field(env, RootField::Terminals, caller),
        "activeSessions": root_field(env, RootField::ActiveSessions, caller),
    })
}

/// An agent's display name with its host's label, as clients tell agents
/// of several hosts apart (§6.1) — unless the host already ends it with
/// that label in parentheses, which would only repeat it.
fn labelled(name: &str, label: &str) -> String {
    let suffix = format!(" ({label})");
    if name.ends_with(&suffix) {
        name.to_string()
    } else {
        format!("{name}{suffix}")
    }
}

#[cfg(test)]
mod label_tests {
    use super::labelled;

    #[test]
    fn the_host_label_is_added_once() {
        assert_eq!(labelled("Copilot", "gpu-1"), "Copilot (gpu-1)");
        assert_eq!(labelled("Sim agent (gpu-1)", "gpu-1"), "Sim agent (gpu-1)");
        assert_eq!(labelled("Sim agent (b)", "Box B"), "Sim agent (b) (Box B)");
    }
}

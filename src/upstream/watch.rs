//! The watch link: the relay's own connection to a host (contract §2).
//!
//! One per host, whatever the number of clients. It subscribes `ahp-root://`,
//! mirrors the host's root state with the official reducer (never applying
//! rejected envelopes) and its session catalog (`listSessions` at connect,
//! then `root/session*` notifications), and reports every change to the
//! relay as a [`WatchEvent`]. It reconnects with capped exponential backoff
//! and pings after silence; a host that stops answering is marked down.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ahp_types::state::RootState;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

use super::hub::{HostHub, HostStatus};
use crate::upstream::dial_in::HostSocket;

/// The upstream client id of this process's watch links: `r1.watch.` and
/// 8 random hex digits, so two relays (replicas, or an old and a new one
/// during a rolling restart) in front of one host are two clients there
/// rather than superseding each other's watch link.
pub fn watch_client_id() -> &'static str {
    static ID: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        let mut raw = [0u8; 4];
        if crate::identity::random_fill(&mut raw).is_err() {
            // No random source: the process id still tells instances apart.
            raw = std::process::id().to_be_bytes();
        }
        let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        format!("r1.watch.{hex}")
    });
    &ID
}

/// Time a ping (or any request) may take before the link is declared dead.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// Which part of a host's root changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootField {
    /// `agents`
    Agents,
    /// `terminals`
    Terminals,
    /// `activeSessions`
    ActiveSessions,
}

/// What a watch link reports to the relay.
#[derive(Debug, Clone)]
pub enum WatchEvent {
    /// A root field of `host` changed (or all of them, after a reconnect).
    Root {
        /// The host.
        host: Arc<str>,
        /// Fields that changed.
        fields: Vec<RootField>,
    },
    /// A catalog notification (`root/session*`), host-form params.
    Catalog {
        /// The host.
        host: Arc<str>,
        /// `root/sessionAdded`, `root/sessionRemoved` or `root/sessionSummaryChanged`.
        method: &'static str,
        /// The notification's params, host names.
        params: Value,
        /// The chats (host form) it lists that may have changed hands
        /// (§7.6): listed under another session than the mirror had them
        /// under, or under none. After a reconnect, every chat it lists.
        moved: Vec<String>,
    },
    /// The host went up or down.
    Status {
        /// The host.
        host: Arc<str>,
        /// New status.
        status: HostStatus,
    },
    /// The host sent more than a [`crate::upstream::hub::HubLimits`]
    /// bound allows; the excess was dropped (counted in
    /// `limit_hits_total{limit}`).
    LimitHit {
        /// The host.
        host: Arc<str>,
        /// The `limit` label (`host_sessions`).
        limit: &'static str,
    },
}

/// Runs the watch link of `hub` forever, reporting to `events`.
pub async fn run(hub: Arc<HostHub>, events: mpsc::Sender<WatchEvent>, ping_after: Duration) {
    let mut backoff = Duration::from_millis(250);
    loop {
        let status = match session(&hub, &events, ping_after).await {
            Ok(()) => {
                backoff = Duration::from_millis(250);
                HostStatus::Down
            }
            Err(Failure::Incompatible(why)) => {
                tracing::warn!(host = %hub.id, %why, "host refused the relay's protocol version; hiding it");
                backoff = Duration::from_secs(60);
                HostStatus::Incompatible
            }
            Err(Failure::Other(why)) => {
                tracing::warn!(host = %hub.id, %why, "watch link failed");
                hub.note_error(Some(why));
                if hub.status() == HostStatus::Up {
                    // A link that was up dropped: redial soon, whatever
                    // earlier failures grew the backoff to.
                    backoff = Duration::from_millis(250);
                }
                HostStatus::Down
            }
        };
        if hub.status() != status {
            hub.update(|v| {
                v.status = status;
                if status == HostStatus::Incompatible {
                    v.replace_catalog(BTreeMap::new());
                    v.root = None;
                }
            });
            let _ = events
                .send(WatchEvent::Status {
                    host: hub.id.clone(),
                    status,
                })
                .await;
        }
        if events.is_closed() {
            return;
        }
        hub.pause_before_redial(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(10));
    }
}

/// Why a watch-link period ended.
#[derive(Debug)]
enum Failure {
    /// `initialize` was refused with -32005.
    Incompatible(String),
    /// Anything else (connection, timeout, protocol).
    Other(String),
}

impl From<String> for Failure {
    fn from(s: String) -> Self {
        Self::Other(s)
    }
}

impl From<&str> for Failure {
    fn from(s: &str) -> Self {
        Self::Other(s.to_string())
    }
}

/// A JSON-RPC connection with request/response matching for the watch link.
struct Rpc {
    ws: HostSocket,
    next_id: u64,
}

impl Rpc {
    async fn request(
        &mut self,
        method: &str,
        params: Value,
        held: &mut Vec<Value>,
    ) -> Result<Value, String> {
        self.next_id += 1;
        let id = self.next_id;
        let frame = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.ws
            .send(Message::text(frame.to_string()))
            .await
            .map_err(|e| e.to_string())?;
        loop {
            let v = tokio::time::timeout(ANSWER_WITHIN, self.recv())
                .await
                .map_err(|_| format!("{method}: no answer within {ANSWER_WITHIN:?}"))??;
            if v.get("id").and_then(Value::as_u64) == Some(id) && v.get("method").is_none() {
                if let Some(err) = v.get("error") {
                    return Err(format!("{method} refused: {err}"));
                }
                return Ok(v.get("result").cloned().unwrap_or(Value::Null));
            }
            held.push(v);
        }
    }

    async fn recv(&mut self) -> Result<Value, String> {
        loop {
            match self.ws.next().await {
                Some(Ok(Message::Text(t))) => {
                    return serde_json::from_str(t.as_str())
                        .map_err(|e| format!("host sent invalid JSON: {e}"));
                }
                Some(Ok(Message::Close(_))) | None => {
                    return Err("host closed the watch link".into());
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.to_string()),
            }
        }
    }
}

/// One connected period of the watch link; returns when it drops.
async fn session(
    hub: &Arc<HostHub>,
    events: &mpsc::Sender<WatchEvent>,
    ping_after: Duration,
) -> Result<(), Failure> {
    let ws = hub.dial(None).await.map_err(|e| e.to_string())?;
    let mut rpc = Rpc { ws, next_id: 0 };
    let mut held = Vec::new();
    let asked = std::time::Instant::now();
    let init = initialize(&mut rpc, &mut held).await?;
    hub.note_rtt(asked.elapsed());
    if let Some(version) = init.get("protocolVersion").and_then(Value::as_str) {
        hub.note_protocol(version);
    }
    let max = hub.limits().max_sessions;
    let (catalog, truncated) = fetch_catalog(&mut rpc, &mut held, max).await?;
    if truncated {
        tracing::warn!(host = %hub.id, max, "host lists more sessions than sessions_per_host: the rest are not mirrored");
        let _ = events.send(catalog_full(hub)).await;
    }
    mirror(hub, events, &init, catalog).await?;
    for v in held {
        on_frame(hub, events, &mut rpc, v).await?;
    }
    loop {
        let v = match tokio::time::timeout(ping_after, rpc.recv()).await {
            Ok(v) => v?,
            Err(_) => {
                let mut later = Vec::new();
                let ping = json!({"channel": ahp_types::ROOT_RESOURCE_URI});
                let asked = std::time::Instant::now();
                rpc.request("ping", ping, &mut later).await?;
                hub.note_rtt(asked.elapsed());
                for v in later {
                    on_frame(hub, events, &mut rpc, v).await?;
                }
                continue;
            }
        };
        on_frame(hub, events, &mut rpc, v).await?;
    }
}

/// The watch link's `initialize` (root subscribed); a version refusal makes
/// the host incompatible rather than down.
async fn initialize(rpc: &mut Rpc, held: &mut Vec<Value>) -> Result<Value, Failure> {
    let params = json!({"channel": ahp_types::ROOT_RESOURCE_URI,
        "protocolVersions": super::version::FAMILY,
        "clientId": watch_client_id(), "initialSubscriptions": [ahp_types::ROOT_RESOURCE_URI]});
    rpc.request("initialize", params, held).await.map_err(|e| {
        let refused = format!(
            "\"code\":{}",
            ahp_types::errors::ahp_error_codes::UNSUPPORTED_PROTOCOL_VERSION
        );
        if e.contains(&refused) {
            Failure::Incompatible(e)
        } else {
            Failure::Other(e)
        }
    })
}

/// Replaces the hub's mirror with the host's root and catalog, marks it up,
/// and sends the differences as events (§6.2: after a watch link
/// reconnects, clients get what changed meanwhile).
async fn mirror(
    hub: &HostHub,
    events: &mpsc::Sender<WatchEvent>,
    init: &Value,
    catalog: BTreeMap<String, Value>,
) -> Result<(), Failure> {
    let root: RootState = init
        .pointer("/snapshots/0/state")
        .cloned()
        .and_then(|s| serde_json::from_value(s).ok())
        .ok_or("initialize returned no root snapshot")?;
    let triggers: Vec<String> = init
        .get("completionTriggerCharacters")
        .and_then(|t| serde_json::from_value(t.clone()).ok())
        .unwrap_or_default();
    let prefix = init
        .get("terminalCommandPrefix")
        .and_then(Value::as_str)
        .map(str::to_string);
    let diff = hub.update(|v| {
        let diff = catalog_diff(&v.catalog, &catalog);
        v.trigger_characters = triggers;
        v.terminal_command_prefix = prefix;
        v.root = Some(root);
        v.replace_catalog(catalog);
        v.status = HostStatus::Up;
        diff
    });
    tracing::info!(host = %hub.id, "watch link up");
    let host = hub.id.clone();
    let _ = events
        .send(WatchEvent::Status {
            host: host.clone(),
            status: HostStatus::Up,
        })
        .await;
    let fields = vec![
        RootField::Agents,
        RootField::Terminals,
        RootField::ActiveSessions,
    ];
    let _ = events
        .send(WatchEvent::Root {
            host: host.clone(),
            fields,
        })
        .await;
    for (method, params) in diff {
        // The mirror was replaced: what moved while the link was down is not
        // known, so every chat a change or an added session lists is treated
        // as moved.
        let moved = params
            .get("changes")
            .or_else(|| params.get("summary"))
            .map(super::hub::chat_uris)
            .unwrap_or_default();
        let event = WatchEvent::Catalog {
            host: host.clone(),
            method,
            params,
            moved,
        };
        let _ = events.send(event).await;
    }
    Ok(())
}

/// Reads the catalog with `listSessions` paging, at most `max` sessions:
/// paging stops there, so a host listing millions costs the relay at most
/// one page beyond the bound; `true` when sessions were left out.
async fn fetch_catalog(
    rpc: &mut Rpc,
    held: &mut Vec<Value>,
    max: usize,
) -> Result<(BTreeMap<String, Value>, bool), String> {
    let mut catalog = BTreeMap::new();
    let mut cursor: Option<String> = None;
    for _ in 0..10_000 {
        let mut params = json!({"channel": ahp_types::ROOT_RESOURCE_URI, "limit": 1000});
        if let (Some(c), Some(o)) = (&cursor, params.as_object_mut()) {
            o.insert("cursor".into(), json!(c));
        }
        let page = rpc.request("listSessions", params, held).await?;
        let items = page.get("items").and_then(Value::as_array);
        for item in items.into_iter().flatten() {
            if let Some(uri) = item.get("resource").and_then(Value::as_str) {
                if catalog.len() >= max && !catalog.contains_key(uri) {
                    return Ok((catalog, true));
                }
                catalog.insert(uri.to_string(), item.clone());
            }
        }
        cursor = page
            .get("nextCursor")
            .and_then(Value::as_str)
            .map(str::to_string);
        match cursor {
            None => return Ok((catalog, false)),
            Some(_) if catalog.len() >= max => return Ok((catalog, true)),
            Some(_) => {}
        }
    }
    Err("listSessions did not end".into())
}

/// The event counting a session the catalog mirror left out.
fn catalog_full(hub: &HostHub) -> WatchEvent {
    WatchEvent::LimitHit {
        host: hub.id.clone(),
        limit: "host_sessions",
    }
}

/// The notifications that turn catalog `old` into `new`.
fn catalog_diff(
    old: &BTreeMap<String, Value>,
    new: &BTreeMap<String, Value>,
) -> Vec<(&'static str, Value)> {
    let root = ahp_types::ROOT_RESOURCE_URI;
    let mut out = Vec::new();
    for (uri, summary) in new {
        match old.get(uri) {
            None => out.push((
                "root/sessionAdded",
                json!({"channel": root, "summary": summary}),
            )),
            Some(prev) if prev != summary => {
                let mut changes = summary.clone();
                if let Some(o) = changes.as_object_mut() {
                    for identity in ["resource", "provider", "createdAt"] {
                        o.remove(identity);
                    }
                }
                out.push((
                    "root/sessionSummaryChanged",
                    json!({"channel": root, "session": uri, "changes": changes}),
                ));
            }
            Some(_) => {}
        }
    }
    for uri in old.keys().filter(|u| !new.contains_key(*u)) {
        out.push((
            "root/sessionRemoved",
            json!({"channel": root, "session": uri}),
        ));
    }
    out
}

async fn on_frame(
    hub: &Arc<HostHub>,
    events: &mpsc::Sender<WatchEvent>,
    rpc: &mut Rpc,
    v: Value,
) -> Result<(), String> {
    let method = v.get("method").and_then(Value::as_str).unwrap_or_default();
    if let Some(id) = v.get("id").filter(|_| !method.is_empty()) {
        let refuse = crate::rpc::error_frame(
            id,
            &crate::rpc::RpcError::with_code(
                -32601,
                "the relay's watch link serves no requests",
                None,
            ),
        );
        return rpc
            .ws
            .send(Message::text(refuse))
            .await
            .map_err(|e| e.to_string());
    }
    let params = v.get("params").cloned().unwrap_or(Value::Null);
    let event = match method {
        "action" => on_root_action(hub, &params),
        "root/sessionAdded" | "root/sessionRemoved" | "root/sessionSummaryChanged" => {
            on_catalog_event(hub, method, params)
        }
        _ => None,
    };
    if let Some(event) = event {
        // Waits while the fan-out's queue is full: the host is then read no
        // faster than the relay fans its events out (TCP backpressure).
        let _ = events.send(event).await;
    }
    Ok(())
}

/// A host root action (never one carrying `rejectionReason`) applied to the
/// mirror with the `ahp` reducer; the event names the field that changed.
fn on_root_action(hub: &HostHub, params: &Value) -> Option<WatchEvent> {
    if params.get("channel").and_then(Value::as_str) != Some(ahp_types::ROOT_RESOURCE_URI)
        || params.get("rejectionReason").is_some()
    {
        return None;
    }
    let action: ahp_types::actions::StateAction =
        serde_json::from_value(params.get("action")?.clone()).ok()?;
    let field = match &action {
        ahp_types::actions::StateAction::RootAgentsChanged(_) => RootField::Agents,
        ahp_types::actions::StateAction::RootTerminalsChanged(_) => RootField::Terminals,
        ahp_types::actions::StateAction::RootActiveSessionsChanged(_) => RootField::ActiveSessions,
        _ => return None,
    };
    hub.update(|view| {
        if let Some(root) = view.root.as_mut() {
            ahp::apply_action_to_root(root, &action);
        }
    });
    Some(WatchEvent::Root {
        host: hub.id.clone(),
        fields: vec![field],
    })
}

/// A `root/session*` notification applied to the catalog mirror; the event
/// carries it on to the fan-out.
fn on_catalog_event(hub: &HostHub, method: &str, params: Value) -> Option<WatchEvent> {
    let mut moved = Vec::new();
    let method = match method {
        "root/sessionAdded" => {
            let summary = params.get("summary").cloned().unwrap_or(Value::Null);
            let uri = summary.get("resource").and_then(Value::as_str)?.to_string();
            let inserted = hub.update(|view| {
                moved = view.chats_changing_hands(&uri, &summary);
                view.insert_session(uri, summary)
            });
            if !inserted {
                let max = hub.limits().max_sessions;
                tracing::warn!(host = %hub.id, max, "session beyond sessions_per_host not mirrored");
                return Some(catalog_full(hub));
            }
            "root/sessionAdded"
        }
        "root/sessionRemoved" => {
            let uri = params.get("session").and_then(Value::as_str)?.to_string();
            hub.update(|view| view.remove_session(&uri));
            "root/sessionRemoved"
        }
        _ => {
            let uri = params.get("session").and_then(Value::as_str)?.to_string();
            let listed = params.get("changes").filter(|c| c.is_object())?;
            let changes = listed.as_object()?.clone();
            moved = hub.update(|view| {
                let moved = view.chats_changing_hands(&uri, listed);
                view.patch_session(&uri, changes);
                moved
            });
            "root/sessionSummaryChanged"
        }
    };
    Some(WatchEvent::Catalog {
        host: hub.id.clone(),
        method,
        params,
        moved,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chats an event reports as moved (`None`: no catalog event).
    fn moved(hub: &HostHub, method: &str, params: Value) -> Option<Vec<String>> {
        match on_catalog_event(hub, method, params)? {
            WatchEvent::Catalog { moved, .. } => Some(moved),
            _ => None,
        }
    }

    /// §7.6: a chat changes hands when a catalog event lists it under another
    /// session than the mirror has it under (or under none), whether in a
    /// summary change or in a session added; listed again under its own
    /// session it moves nothing, so no subscriber is re-evaluated for it.
    #[test]
    fn catalog_events_report_the_chats_that_change_hands() {
        let Ok(hub) = HostHub::new(super::super::hub::plain_host("h")) else {
            panic!("hub");
        };
        let chats =
            |c: &[&str]| -> Vec<Value> { c.iter().map(|c| json!({"resource": c})).collect() };
        let added = |uri: &str, c: &[&str]| json!({"channel": "ahp-root://", "summary": {"resource": uri, "chats": chats(c)}});
        let changed = |uri: &str, c: &[&str]| json!({"channel": "ahp-root://", "session": uri, "changes": {"status": 1, "chats": chats(c)}});
        let add = "root/sessionAdded";
        let change = "root/sessionSummaryChanged";
        assert_eq!(
            moved(&hub, add, added("s:/a", &["c:/1"])),
            Some(vec!["c:/1".into()])
        );
        assert_eq!(
            moved(&hub, change, changed("s:/a", &["c:/1"])),
            Some(vec![])
        );
        assert_eq!(
            moved(&hub, change, changed("s:/a", &["c:/1"])),
            Some(vec![])
        );
        // Into a session added with it: moved.
        assert_eq!(
            moved(&hub, add, added("s:/b", &["c:/1"])),
            Some(vec!["c:/1".into()])
        );
        assert_eq!(hub.session_of_chat("c:/1").as_deref(), Some("s:/b"));
        // Back into `a` by a summary change: moved; then a's turns move nothing.
        assert_eq!(
            moved(&hub, change, changed("s:/a", &["c:/1", "c:/2"])),
            Some(vec!["c:/1".into(), "c:/2".into()])
        );
        assert_eq!(
            moved(&hub, change, changed("s:/a", &["c:/2", "c:/1"])),
            Some(vec![])
        );
        let removed = json!({"channel": "ahp-root://", "session": "s:/b"});
        assert_eq!(moved(&hub, "root/sessionRemoved", removed), Some(vec![]));
    }

    #[test]
    fn diff_reports_added_changed_removed() {
        let old: BTreeMap<String, Value> = [
            ("a".to_string(), json!({"resource": "a", "title": "x"})),
            ("b".to_string(), json!({"resource": "b"})),
        ]
        .into();
        let new: BTreeMap<String, Value> = [
            ("a".to_string(), json!({"resource": "a", "title": "y"})),
            ("c".to_string(), json!({"resource": "c"})),
        ]
        .into();
        let methods: Vec<&str> = catalog_diff(&old, &new).iter().map(|(m, _)| *m).collect();
        assert_eq!(
            methods,
            [
                "root/sessionSummaryChanged",
                "root/sessionAdded",
                "root/sessionRemoved"
            ]
        );
    }
}

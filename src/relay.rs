//! The relay as a whole: configuration, secret, URI store, hosts, client
//! sessions, and what is computed across hosts — the merged root, the
//! merged session list, and the fan-out of watch-link events (contract §6).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use dashmap::DashMap;
use hmac::{Hmac, KeyInit, Mac};
use serde_json::{Value, json};
use sha2::Sha256;
use tokio::sync::mpsc;

use crate::config::RelayConfig;
use crate::edge::auth::Authenticator;
use crate::metrics::Metrics;
use crate::route::namer::ToClient;
use crate::route::store::UriStore;
use crate::route::translate;
use crate::rpc::RpcError;
use crate::session::sequence::SequenceOrigins;
use crate::session::{ClientSession, PrincipalKey, SessionKey};
use crate::upstream::hub::{HostHub, HostStatus};
use crate::upstream::watch::{RootField, WatchEvent};
use crate::wire::WireLimits;

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    jiff::Timestamp::now().as_second().max(0) as u64
}

/// The relay's shared state.
pub struct Relay {
    /// Validated configuration.
    pub cfg: Arc<RelayConfig>,
    mac_key: HmacSha256,
    /// The durable URI store.
    pub store: Arc<dyn UriStore>,
    hubs: BTreeMap<String, Arc<HostHub>>,
    sessions: DashMap<SessionKey, Arc<ClientSession>>,
    /// S0 allocator.
    pub origins: SequenceOrigins,
    /// Limits for client frames.
    pub client_limits: WireLimits,
    /// Limits for host frames.
    pub upstream_limits: WireLimits,
    /// Metrics.
    pub metrics: Metrics,
    /// Token verification.
    pub auth: Authenticator,
    next_socket: AtomicU64,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("hosts", &self.hubs.keys().collect::<Vec<_>>())
            .field("sessions", &self.sessions.len())
            .finish_non_exhaustive()
    }
}

type HmacSha256 = Hmac<Sha256>;

/// Methods counted by name in metrics; anything else is `other`.
const METHOD_LABELS: &[&str] = &[
    "initialize",
    "reconnect",
    "ping",
    "subscribe",
    "listSessions",
    "createSession",
    "disposeSession",
    "createChat",
    "disposeChat",
    "createTerminal",
    "disposeTerminal",
    "fetchTurns",
    "completions",
    "moveChat",
    "resolveSessionConfig",
    "sessionConfigCompletions",
    "authenticate",
];

impl Relay {
    /// Builds the relay from a validated configuration and starts one watch
    /// link per host, whose events `run_fanout` must consume.
    pub fn new(
        cfg: RelayConfig,
        secret: Vec<u8>,
        store: Arc<dyn UriStore>,
        auth: Authenticator,
    ) -> Result<(Arc<Self>, mpsc::UnboundedReceiver<WatchEvent>), String> {
        let metrics = Metrics::new().map_err(|e| e.to_string())?;
        let mac_key = <HmacSha256 as KeyInit>::new_from_slice(&secret)
            .map_err(|e| format!("relay secret unusable as HMAC key: {e}"))?;
        let mut hubs = BTreeMap::new();
        for h in &cfg.hosts {
            let hub = HostHub::new(h.clone()).map_err(|e| format!("host {}: {e}", h.id))?;
            hubs.insert(h.id.clone(), Arc::new(hub));
        }
        let limits = &cfg.limits;
        let client_limits = WireLimits {
            max_frame_bytes: limits.max_frame_bytes,
            max_depth: limits.max_json_depth,
        };
        let upstream_limits = WireLimits {
            max_frame_bytes: 64 * 1024 * 1024,
            max_depth: 256,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let relay = Arc::new(Self {
            cfg: Arc::new(cfg),
            mac_key,
            store,
            hubs,
            sessions: DashMap::new(),
            origins: SequenceOrigins::new(),
            client_limits,
            upstream_limits,
            metrics,
            auth,
            next_socket: AtomicU64::new(1),
        });
        for hub in relay.hubs.values() {
            tokio::spawn(crate::upstream::watch::run(hub.clone(), tx.clone()));
        }
        Ok((relay, rx))
    }

    /// A new socket id.
    pub fn next_socket(&self) -> u64 {
        self.next_socket.fetch_add(1, Ordering::Relaxed)
    }

    /// The hub of host `id`.
    pub fn hub(&self, id: &str) -> Option<&Arc<HostHub>> {
        self.hubs.get(id)
    }

    /// Every hub, by id.
    pub fn hubs(&self) -> impl Iterator<Item = &Arc<HostHub>> {
        self.hubs.values()
    }

    /// The metric label of a method.
    pub fn method_label(&self, method: &str) -> &'static str {
        METHOD_LABELS
            .iter()
            .find(|m| **m == method)
            .copied()
            .unwrap_or("other")
    }

    /// The upstream client id of session (P, c) (contract §2, B2):
    /// `r1.` + b64url(HMAC(k, P))[..11] + `.` + b64url(HMAC(k, P‖0x00‖c))[..16],
    /// where P is the issuer's length (4 bytes, big endian), the issuer and the subject.
    pub fn upstream_id(&self, p: &PrincipalKey, client_id: &str) -> String {
        let mut principal = (p.issuer.len() as u32).to_be_bytes().to_vec();
        principal.extend_from_slice(p.issuer.as_bytes());
        principal.extend_from_slice(p.subject.as_bytes());
        let mac = |parts: &[&[u8]]| -> String {
            let mut m = self.mac_key.clone();
            for part in parts {
                m.update(part);
            }
            B64.encode(m.finalize().into_bytes())
        };
        let who = mac(&[&principal]);
        let client = mac(&[&principal, &[0], client_id.as_bytes()]);
        format!(
            "r1.{}.{}",
            who.get(..11).unwrap_or(&who),
            client.get(..16).unwrap_or(&client)
        )
    }

    /// Registers a session, superseding (4009) one with the same key.
    pub fn attach(&self, session: Arc<ClientSession>) -> Result<(), RpcError> {
        let same_principal = self
            .sessions
            .iter()
            .filter(|s| s.key().principal == session.key.principal)
            .count();
        if same_principal >= self.cfg.limits.sessions_per_principal
            && !self.sessions.contains_key(&session.key)
        {
            return Err(RpcError::internal(
                "too many client sessions for this principal",
                Some(json!({"reason": "sessionLimit", "retryable": true})),
            ));
        }
        if let Some(old) = self.sessions.insert(session.key.clone(), session) {
            old.close(4009, "superseded by another socket of the same client");
            old.shut();
        }
        Ok(())
    }

    /// Removes a session when its socket closes (only if it is still the
    /// registered one) and closes its links.
    pub fn detach(&self, session: &Arc<ClientSession>) {
        self.sessions
            .remove_if(&session.key, |_, s| Arc::ptr_eq(s, session));
        session.shut();
    }

    /// The registered session for `key`.
    pub fn session_of(&self, key: &SessionKey) -> Option<Arc<ClientSession>> {
        self.sessions.get(key).map(|s| s.clone())
    }

    /// The host whose agent is the only one visible, if exactly one is.
    pub fn only_agent_host(&self) -> Option<Arc<HostHub>> {
        let mut with_agents = self
            .hubs
            .values()
            .filter(|h| h.view().root.is_some_and(|r| !r.agents.is_empty()));
        let first = with_agents.next()?;
        with_agents.next().is_none().then(|| first.clone())
    }

    /// `relay.default_host`, or the only host.
    pub fn default_host(&self) -> Option<Arc<HostHub>> {
        match &self.cfg.relay.default_host {
            Some(id) => self.hubs.get(id).cloned(),
            None if self.hubs.len() == 1 => self.hubs.values().next().cloned(),
            None => None,
        }
    }

    /// Union of the up hosts' completion trigger characters (§6.6).
    pub fn trigger_characters(&self) -> Vec<String> {
        let mut all: Vec<String> = self
            .hubs
            .values()
            .map(|h| h.view())
            .filter(|v| v.status == HostStatus::Up)
            .flat_map(|v| v.trigger_characters)
            .collect();
        all.sort();
        all.dedup();
        all
    }

    /// The hosts' terminal command prefix, only if every up host agrees (§6.6).
    pub fn terminal_command_prefix(&self) -> Option<String> {
        let mut prefixes = self
            .hubs
            .values()
            .map(|h| h.view())
            .filter(|v| v.status == HostStatus::Up)
            .map(|v| v.terminal_command_prefix);
        let first = prefixes.next()??;
        prefixes
            .all(|p| p.as_deref() == Some(first.as_str()))
            .then_some(first)
    }

    fn root_field(&self, field: RootField, identity: (&str, &str)) -> Value {
        let mut items = Vec::new();
        let mut active = 0i64;
        for hub in self.hubs.values() {
            let view = hub.view();
            if field == RootField::ActiveSessions {
                active += view.catalog.len() as i64;
                continue;
            }
            let Some(root) = view.root else { continue };
            if view.status != HostStatus::Up {
                continue;
            }
            let namer = ToClient {
                host: &hub.id,
                store: self.store.as_ref(),
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
                if translate::translate(&mut item, shape, &namer).is_err() {
                    continue;
                }
                if field == RootField::Agents
                    && let Some(name) = item.get_mut("displayName")
                {
                    *name = json!(format!(
                        "{} ({})",
                        name.as_str().unwrap_or_default(),
                        hub.label()
                    ));
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
    pub fn merged_root(&self, identity: (&str, &str)) -> Value {
        json!({
            "agents": self.root_field(RootField::Agents, identity),
            "terminals": self.root_field(RootField::Terminals, identity),
            "activeSessions": self.root_field(RootField::ActiveSessions, identity),
        })
    }

    /// Consumes watch-link events forever, turning them into numbered root
    /// actions and catalog notifications for every session that follows root.
    pub async fn run_fanout(self: Arc<Self>, mut events: mpsc::UnboundedReceiver<WatchEvent>) {
        while let Some(ev) = events.recv().await {
            match ev {
                WatchEvent::Status { host, status } => {
                    self.metrics
                        .host_up
                        .with_label_values(&[&host])
                        .set(i64::from(status == HostStatus::Up));
                    let all = [
                        RootField::Agents,
                        RootField::Terminals,
                        RootField::ActiveSessions,
                    ];
                    self.fan_root(&all);
                }
                WatchEvent::Root { fields, .. } => self.fan_root(&fields),
                WatchEvent::Catalog {
                    host,
                    method,
                    params,
                } => {
                    self.fan_catalog(&host, method, params);
                    self.fan_root(&[RootField::ActiveSessions]);
                }
            }
        }
    }

    fn followers(&self) -> Vec<Arc<ClientSession>> {
        self.sessions
            .iter()
            .filter(|s| s.follows_root())
            .map(|s| s.clone())
            .collect()
    }

    fn fan_root(&self, fields: &[RootField]) {
        for s in self.followers() {
            for field in fields {
                let value = self.root_field(*field, s.identity());
                let action = match field {
                    RootField::Agents => json!({"type": "root/agentsChanged", "agents": value}),
                    RootField::Terminals => {
                        json!({"type": "root/terminalsChanged", "terminals": value})
                    }
                    RootField::ActiveSessions => {
                        json!({"type": "root/activeSessionsChanged", "activeSessions": value})
                    }
                };
                let mut core = s.lock();
                s.push_envelope(&mut core, |n| {
                    Some(
                        json!({"jsonrpc": "2.0", "method": "action", "params": {
                        "channel": ahp_types::ROOT_RESOURCE_URI, "action": action, "serverSeq": n}})
                        .to_string(),
                    )
                });
            }
        }
    }

    fn fan_catalog(&self, host: &str, method: &str, mut params: Value) {
        let namer = ToClient {
            host,
            store: self.store.as_ref(),
            identity: None,
        };
        if translate::translate(&mut params, method, &namer).is_err() {
            return;
        }
        let frame = json!({"jsonrpc": "2.0", "method": method, "params": params}).to_string();
        for s in self.followers() {
            let mut core = s.lock();
            s.push(&mut core, frame.clone());
        }
    }

    /// `listSessions` across hosts (contract §6.3): newest first by parsed
    /// `modifiedAt`, ties by client URI; sessions of unreachable hosts kept
    /// and marked; an opaque cursor MAC-protected and bound to the socket.
    pub fn list_sessions(
        &self,
        session: &ClientSession,
        params: Value,
    ) -> Result<String, RpcError> {
        let limit_cap = self.cfg.limits.list_sessions_limit;
        let limit = match params.get("limit") {
            None | Some(Value::Null) => limit_cap,
            Some(v) => match v.as_u64() {
                Some(l) if l >= 1 => (l as usize).min(limit_cap),
                _ => return Err(RpcError::invalid_params("limit must be a positive integer")),
            },
        };
        let after = match params.get("cursor").and_then(Value::as_str) {
            None => None,
            Some(c) => Some(
                self.open_cursor(c, session)
                    .ok_or_else(|| RpcError::invalid_params("unknown cursor"))?,
            ),
        };
        let mut all: Vec<(i64, String, Value)> = Vec::new();
        for hub in self.hubs.values() {
            let view = hub.view();
            let namer = ToClient {
                host: &hub.id,
                store: self.store.as_ref(),
                identity: None,
            };
            for summary in view.catalog.values() {
                let mut s = summary.clone();
                if translate::translate(&mut s, "@SessionSummary", &namer).is_err() {
                    continue;
                }
                if view.status != HostStatus::Up
                    && let Some(o) = s.as_object_mut()
                {
                    let meta = o.entry("_meta").or_insert_with(|| json!({}));
                    if let Some(m) = meta.as_object_mut() {
                        m.insert("ahp-relay/hostState".into(), json!(view.status.label()));
                    }
                }
                let at = s
                    .get("modifiedAt")
                    .and_then(Value::as_str)
                    .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                    .map_or(i64::MIN, |t| t.as_microsecond());
                let uri = s
                    .get("resource")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                all.push((at, uri, s));
            }
        }
        all.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        let start = match &after {
            None => 0,
            Some((at, uri)) => all
                .iter()
                .position(|(a, u, _)| a < at || (a == at && u > uri))
                .unwrap_or(all.len()),
        };
        let page: Vec<&(i64, String, Value)> = all.iter().skip(start).take(limit).collect();
        let mut result = json!({"items": page.iter().map(|(_, _, s)| s).collect::<Vec<_>>()});
        if start + page.len() < all.len()
            && let (Some((at, uri, _)), Some(o)) = (page.last(), result.as_object_mut())
        {
            o.insert(
                "nextCursor".into(),
                json!(self.seal_cursor(*at, uri, session)),
            );
        }
        Ok(result.to_string())
    }

    fn cursor_mac(&self, body: &str, session: &ClientSession) -> String {
        let mut m = self.mac_key.clone();
        m.update(b"listSessions\0");
        m.update(session.upstream_id.as_bytes());
        m.update(&session.socket.to_be_bytes());
        m.update(body.as_bytes());
        let tag = B64.encode(m.finalize().into_bytes());
        tag.get(..22).unwrap_or(&tag).to_string()
    }

    fn seal_cursor(&self, at: i64, uri: &str, session: &ClientSession) -> String {
        let body = B64.encode(json!([at, uri]).to_string());
        format!("{body}.{}", self.cursor_mac(&body, session))
    }

    fn open_cursor(&self, cursor: &str, session: &ClientSession) -> Option<(i64, String)> {
        let (body, tag) = cursor.split_once('.')?;
        if self.cursor_mac(body, session) != tag {
            return None;
        }
        let v: Value = serde_json::from_slice(&B64.decode(body).ok()?).ok()?;
        Some((v.get(0)?.as_i64()?, v.get(1)?.as_str()?.to_string()))
    }
}

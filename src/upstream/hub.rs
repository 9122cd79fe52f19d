//! One configured host as the relay sees it: how to dial it, and what its
//! watch link currently knows (health, root state, session catalog).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use ahp_types::state::RootState;
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::Notify;

use crate::upstream::dial::{Credentials, DialError, DialOptions, dial_host};
use crate::upstream::dial_in::{Connectors, HostSocket};
use crate::upstream::frames::{DEFAULT_MAX_MESSAGE_BYTES, FrameLimits};

/// One upstream host.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostConfig {
    /// Stable id, `[a-z0-9-]{1,32}`, never `localhost`; appears in URIs.
    pub id: String,
    /// Human label, suffixed to agent display names.
    #[serde(default)]
    pub label: Option<String>,
    /// `wss://…` or (with `allow_plaintext`) `ws://…`; empty for a host
    /// that dials in (`dial_in`): exactly one of the two is given.
    #[serde(default)]
    pub url: String,
    /// The host dials in through its connector (`ahp-relay connect`,
    /// contract §13) instead of being dialed at `url`.
    #[serde(default)]
    pub dial_in: Option<DialInConfig>,
    /// Allow a `ws://` URL.
    #[serde(default)]
    pub allow_plaintext: bool,
    /// Bearer token file sent to the host as `Authorization: Bearer`
    /// (read again at every dial).
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// Token file sent as the `tkn` query parameter (VS Code's agent host
    /// connection token; read again at every dial).
    #[serde(default)]
    pub query_token_file: Option<PathBuf>,
    /// PEM client certificate chain for mutual TLS (with `client_key_file`;
    /// read again at every dial).
    #[serde(default)]
    pub client_cert_file: Option<PathBuf>,
    /// PEM private key of `client_cert_file`.
    #[serde(default)]
    pub client_key_file: Option<PathBuf>,
    /// PEM CA to verify the host's certificate (default: webpki roots).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Whose credentials an `authenticate` sets on the host: one
    /// connection's (the AHP default) or the whole host's (VS Code's agent
    /// host), which decides who may supply them (`session/authenticate.rs`).
    #[serde(default)]
    pub authenticate: AuthenticateScope,
}

/// How a host that dials in proves itself (contract §13.2).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DialInConfig {
    /// File holding the token its connector presents (`--token-file` of
    /// `ahp-relay connect`); read again at every connector authentication,
    /// so a rotated file takes effect for the next one.
    pub token_file: PathBuf,
}

/// How far a token given to a host with `authenticate` reaches there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AuthenticateScope {
    /// The host keeps tokens per connection, as AHP says: each user's token
    /// serves only that user's own link (`"per-connection"`, the default).
    #[default]
    PerConnection,
    /// The host keeps one token store for the whole process and broadcasts
    /// `auth/required` to every connection (VS Code's agent host): a token
    /// serves every user of the host, so only the host's admins may supply
    /// one (`"host-wide"`).
    HostWide,
}

/// Health of a host, as its watch link sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostStatus {
    /// Not connected yet, or reconnecting after a drop.
    Connecting,
    /// Watch link initialized; root and catalog are current.
    Up,
    /// Last attempt failed; retrying with backoff.
    Down,
    /// The host refused the protocol version the relay speaks (-32005): its
    /// agents, sessions and terminals are hidden as if it did not exist.
    Incompatible,
}

impl HostStatus {
    /// A short label for metrics and `_meta`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Connecting => "connecting",
            Self::Up => "up",
            Self::Down => "unreachable",
            Self::Incompatible => "incompatible",
        }
    }
}

/// What the watch link mirrors of a host (host-form names).
#[derive(Debug, Clone)]
pub struct WatchView {
    /// Current health.
    pub status: HostStatus,
    /// The host's root state (rejected envelopes never applied).
    pub root: Option<RootState>,
    /// Session summaries by host URI, as JSON objects. Change it only
    /// through the `WatchView` methods, which keep [`WatchView::chats`] in step.
    pub catalog: BTreeMap<String, Value>,
    /// Chat host URI → the host URI of the session listing it in the
    /// catalog (`SessionSummary.chats[]`): how a chat's visibility is decided.
    pub chats: HashMap<String, String>,
    /// Incremented by every catalog change (sort indexes compare it).
    pub catalog_version: u64,
    /// `InitializeResult.completionTriggerCharacters` of the host.
    pub trigger_characters: Vec<String>,
    /// `InitializeResult.terminalCommandPrefix` of the host.
    pub terminal_command_prefix: Option<String>,
    /// Sessions the catalog keeps ([`HubLimits::max_sessions`]); a session
    /// beyond it is dropped by [`WatchView::insert_session`].
    pub max_sessions: usize,
    /// Listed sessions whose dispose the host answered through the relay,
    /// awaiting the host's `root/sessionRemoved` (§6.3): `listSessions`
    /// leaves them out. Always a subset of the catalog's keys.
    disposed: std::collections::HashSet<String>,
    /// The same for chats, awaiting the summary change that unlists them:
    /// left out of listed summaries and catalog notifications. Always a
    /// subset of [`WatchView::chats`]' keys.
    disposed_chats: std::collections::HashSet<String>,
}

/// A configured host plus its mirrors. Shared by the watch link (writer)
/// and every client session (readers).
#[derive(Debug)]
pub struct HostHub {
    /// Stable host id (appears in qualified URIs and provider ids).
    pub id: Arc<str>,
    /// The host's configuration.
    pub cfg: HostConfig,
    view: RwLock<WatchView>,
    /// Signalled whenever the catalog changes (creates wait on it).
    pub catalog_changed: Notify,
    /// Per-client links to this host alive now (`links_per_host`).
    pub links: std::sync::atomic::AtomicUsize,
    /// The catalog sorted for `listSessions`, with the catalog version it
    /// was built from (rebuilt on first use after a change).
    index: std::sync::Mutex<Option<(u64, Arc<Vec<IndexEntry>>)>>,
    /// What the status page shows besides the view: RTT, protocol, last error.
    ops: std::sync::Mutex<HostOps>,
    /// Bounds on what the host may send (set by [`Hosts`] from `[limits]`).
    limits: HubLimits,
    /// Where a dial-in host's connector is found (shared by [`Hosts`]).
    connectors: Arc<Connectors>,
    /// The connector attached when the last dial-in dial started.
    dialed_via: std::sync::Mutex<Option<u64>>,
}

/// Bounds a hub applies to what its host sends (`[limits]`), so that no
/// host can exhaust the relay.
#[derive(Debug, Clone, Copy)]
pub struct HubLimits {
    /// Largest WebSocket message or frame read from the host
    /// (`upstream_max_frame_bytes`): a bigger one ends that connection
    /// before its payload is buffered. `None`: 64 MiB.
    pub max_message_bytes: Option<usize>,
    /// Bytes one read from the host may take (`upstream_read_buffer_bytes`).
    pub read_buffer_bytes: usize,
    /// Sessions kept in the host's catalog mirror (`sessions_per_host`):
    /// the watch link stops paging `listSessions` there and further
    /// `root/sessionAdded` are dropped, each counted as a limit hit.
    pub max_sessions: usize,
}

impl Default for HubLimits {
    fn default() -> Self {
        Self {
            max_message_bytes: None,
            read_buffer_bytes: crate::upstream::dial::SOCKET_READ_BYTES,
            max_sessions: 100_000,
        }
    }
}

/// Operational facts about a host, noted by its links for the status page.
#[derive(Debug, Clone, Default)]
struct HostOps {
    rtt: Option<Duration>,
    protocol: Option<String>,
    last_error: Option<String>,
}

/// One host as the status page shows it (no URL, no credential).
#[derive(Debug, Clone, serde::Serialize)]
pub struct HostRow {
    /// The host id.
    pub id: String,
    /// The label (the id when none is configured).
    pub label: String,
    /// `connecting`, `up`, `unreachable` or `incompatible`.
    pub state: &'static str,
    /// The last measured round trip of the watch link, in milliseconds.
    pub rtt_ms: Option<f64>,
    /// The protocol version the host negotiated with the watch link.
    pub protocol: Option<String>,
    /// Sessions in the host's catalog.
    pub sessions: usize,
    /// Per-client links open to it.
    pub links: usize,
    /// The last dial or link failure (names the host id, never its URL).
    pub last_error: Option<String>,
    /// `dialed` (the relay dials the host) or `dial-in` (its connector
    /// dials the relay, contract §13).
    pub reach: &'static str,
    /// A dial-in host's attached connector: the address it connected from.
    pub connector: Option<String>,
}

/// One session of a host's catalog in `listSessions` order.
#[derive(Debug, Clone)]
pub struct IndexEntry {
    /// `modifiedAt` in µs since the epoch (`i64::MIN` if unreadable).
    pub at: i64,
    /// The client-facing URI (ties are ordered by it).
    pub client: Arc<str>,
    /// The host-form URI (catalog key).
    pub host: Arc<str>,
}

/// Header carrying the end user's issuer on links (hosts may audit it).
pub const USER_ISSUER_HEADER: &str = "ahp-relay-user-issuer";
/// Header carrying the end user's subject on links.
pub const USER_SUBJECT_HEADER: &str = "ahp-relay-user-subject";

impl HostHub {
    /// A hub for `cfg`; checks that its credential files can be read now
    /// (they are read again at every dial, so a rotated file is used by
    /// the next connection) and that a client certificate has its key.
    pub fn new(cfg: HostConfig) -> std::io::Result<Self> {
        if cfg.client_cert_file.is_some() != cfg.client_key_file.is_some() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "client_cert_file and client_key_file go together",
            ));
        }
        if let Some(dial_in) = &cfg.dial_in {
            let token = std::fs::read_to_string(&dial_in.token_file)?;
            if token.trim().is_empty() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!(
                        "dial_in token file {} is empty",
                        dial_in.token_file.display()
                    ),
                ));
            }
        }
        for file in [
            &cfg.token_file,
            &cfg.query_token_file,
            &cfg.client_cert_file,
            &cfg.client_key_file,
        ]
        .into_iter()
        .flatten()
        {
            std::fs::metadata(file).and_then(|_| std::fs::File::open(file))?;
        }
        Ok(Self {
            id: cfg.id.as_str().into(),
            cfg,
            view: RwLock::new(WatchView::empty(
                HostStatus::Connecting,
                HubLimits::default().max_sessions,
            )),
            catalog_changed: Notify::new(),
            links: std::sync::atomic::AtomicUsize::new(0),
            index: std::sync::Mutex::new(None),
            ops: std::sync::Mutex::new(HostOps::default()),
            limits: HubLimits::default(),
            connectors: Arc::default(),
            dialed_via: std::sync::Mutex::new(None),
        })
    }

    /// Opens a WebSocket to the host with its credentials, read from their
    /// files now; `user` as in [`HostHub::dial_options`]. The outcome is
    /// noted for the status page; an error names the host id, never its
    /// URL or a credential.
    pub async fn dial(&self, user: Option<(&str, &str)>) -> Result<HostSocket, DialError> {
        if self.cfg.dial_in.is_some() {
            return self.dial_in(user).await;
        }
        let result = async {
            let mut opts = self.dial_options(user);
            opts.token = read_secret("token", self.cfg.token_file.as_deref()).await?;
            let creds = Credentials {
                query_token: read_secret("query token", self.cfg.query_token_file.as_deref())
                    .await?,
                client_cert: self
                    .cfg
                    .client_cert_file
                    .clone()
                    .zip(self.cfg.client_key_file.clone()),
            };
            dial_host(&opts, &creds, self.frame_limits()).await
        }
        .await
        .map_err(|e| e.for_host(&self.id));
        self.note_error(result.as_ref().err().map(ToString::to_string));
        result
    }

    /// What the host's sockets accept ([`HubLimits`]).
    fn frame_limits(&self) -> FrameLimits {
        FrameLimits {
            max_message_bytes: self
                .limits
                .max_message_bytes
                .unwrap_or(DEFAULT_MAX_MESSAGE_BYTES),
            read_buffer_bytes: self.limits.read_buffer_bytes,
        }
    }

    /// [`HostHub::dial`] of a dial-in host: its connector is asked for the
    /// link (waiting [`DialOptions::connect_timeout`] for a connector to
    /// attach, then as long again for the socket), with the same end-user
    /// headers a dialed link sends, which the connector puts on its
    /// upgrade request to the host.
    async fn dial_in(&self, user: Option<(&str, &str)>) -> Result<HostSocket, DialError> {
        let opts = self.dial_options(user);
        *self.dialed_via.lock().unwrap_or_else(|e| e.into_inner()) =
            self.connectors.generation(&self.id);
        let result = self
            .connectors
            .request(&self.id, opts.extra_headers, opts.connect_timeout)
            .await
            .map_err(|e| DialError::Host {
                host: self.id.to_string(),
                reason: e.to_string(),
            });
        self.note_error(result.as_ref().err().map(ToString::to_string));
        result
    }

    /// Waits `pause` before a watch link redials, or less: a dial-in host's
    /// wait ends as soon as a connector other than the one its last dial
    /// found is attached (a connector that cannot reach its host does not
    /// make the watch link redial faster than its backoff).
    pub async fn pause_before_redial(&self, pause: Duration) {
        if self.cfg.dial_in.is_none() {
            return tokio::time::sleep(pause).await;
        }
        let deadline = tokio::time::Instant::now() + pause;
        loop {
            let arrived = self.connectors.arrival();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            let last = *self.dialed_via.lock().unwrap_or_else(|e| e.into_inner());
            let now = self.connectors.generation(&self.id);
            if now.is_some() && now != last {
                return;
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                return;
            }
        }
    }

    /// Dial options for a link, without credentials (see [`HostHub::dial`]);
    /// `user` adds the end user's (issuer, subject) as percent-encoded
    /// handshake headers. The user's JWT is never sent.
    pub fn dial_options(&self, user: Option<(&str, &str)>) -> DialOptions {
        let mut extra_headers = Vec::new();
        if let Some((iss, sub)) = user {
            extra_headers.push((USER_ISSUER_HEADER.to_string(), header_safe(iss)));
            extra_headers.push((USER_SUBJECT_HEADER.to_string(), header_safe(sub)));
        }
        DialOptions {
            url: self.cfg.url.clone(),
            token: None,
            ca_file: self.cfg.ca_file.clone(),
            insecure: false,
            connect_timeout: Duration::from_secs(10),
            extra_headers,
        }
    }

    /// Notes a round trip of the watch link (a request and its answer).
    pub fn note_rtt(&self, rtt: Duration) {
        self.ops.lock().unwrap_or_else(|e| e.into_inner()).rtt = Some(rtt);
    }

    /// Notes the protocol version the host negotiated.
    pub fn note_protocol(&self, version: &str) {
        self.ops.lock().unwrap_or_else(|e| e.into_inner()).protocol = Some(version.to_string());
    }

    /// Notes the last failure reaching the host (`None` once reached again).
    pub fn note_error(&self, error: Option<String>) {
        self.ops
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .last_error = error;
    }

    /// The host as the status page shows it.
    pub fn row(&self) -> HostRow {
        let ops = self.ops.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let (status, sessions) = self.read(|v| (v.status, v.catalog.len()));
        HostRow {
            id: self.id.to_string(),
            label: self.label().to_string(),
            state: status.label(),
            rtt_ms: ops.rtt.map(|d| d.as_secs_f64() * 1000.0),
            protocol: ops.protocol,
            sessions,
            links: self.links.load(std::sync::atomic::Ordering::Relaxed),
            last_error: ops.last_error,
            reach: if self.cfg.dial_in.is_some() {
                "dial-in"
            } else {
                "dialed"
            },
            connector: self
                .cfg
                .dial_in
                .as_ref()
                .and_then(|_| self.connectors.peer(&self.id)),
        }
    }

    /// The agent label: the configured label, else the id.
    pub fn label(&self) -> &str {
        self.cfg.label.as_deref().unwrap_or(&self.id)
    }

    /// Reads the watch view in place (no copy of the catalog).
    pub fn read<R>(&self, f: impl FnOnce(&WatchView) -> R) -> R {
        f(&self.view.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Current health.
    pub fn status(&self) -> HostStatus {
        self.view.read().unwrap_or_else(|e| e.into_inner()).status
    }

    /// Whether the catalog holds `host_uri`.
    pub fn has_session(&self, host_uri: &str) -> bool {
        self.view
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .catalog
            .contains_key(host_uri)
    }

    /// The host URI of the session that lists chat `host_uri`.
    pub fn session_of_chat(&self, host_uri: &str) -> Option<String> {
        self.view
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .chats
            .get(host_uri)
            .cloned()
    }

    /// The claim of terminal `host_uri` in the host's root state (host
    /// form): `None` if the host lists no such terminal, `Some(None)` if it
    /// is unclaimed.
    pub fn terminal_claim(&self, host_uri: &str) -> Option<Option<Value>> {
        let view = self.view.read().unwrap_or_else(|e| e.into_inner());
        let info = view
            .root
            .as_ref()?
            .terminals
            .as_ref()?
            .iter()
            .find(|t| t.resource == host_uri)?;
        Some(
            serde_json::to_value(&info.claim)
                .ok()
                .filter(|c| !c.is_null()),
        )
    }

    /// The catalog in `listSessions` order (newest `modifiedAt` first, ties
    /// by client URI), built with `client_uri` on first use after a change
    /// and shared until the next one.
    pub fn sorted_catalog(&self, client_uri: impl Fn(&str) -> String) -> Arc<Vec<IndexEntry>> {
        let mut slot = self.index.lock().unwrap_or_else(|e| e.into_inner());
        let version = self.read(|v| v.catalog_version);
        if let Some((built, index)) = slot.as_ref()
            && *built == version
        {
            return index.clone();
        }
        let (version, mut entries) = self.read(|v| {
            let entries: Vec<IndexEntry> = v
                .catalog
                .iter()
                .filter(|(uri, _)| !v.disposed.contains(*uri))
                .map(|(uri, summary)| IndexEntry {
                    at: summary
                        .get("modifiedAt")
                        .and_then(Value::as_str)
                        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                        .map_or(i64::MIN, |t| t.as_microsecond()),
                    client: client_uri(uri).into(),
                    host: uri.as_str().into(),
                })
                .collect();
            (v.catalog_version, entries)
        });
        entries.sort_by(|a, b| b.at.cmp(&a.at).then_with(|| a.client.cmp(&b.client)));
        let index = Arc::new(entries);
        *slot = Some((version, index.clone()));
        index
    }

    /// Mutates the view: the watch link, and a dispose's answer marking its
    /// session ([`WatchView::mark_disposed`]).
    pub fn update<R>(&self, f: impl FnOnce(&mut WatchView) -> R) -> R {
        let r = f(&mut self.view.write().unwrap_or_else(|e| e.into_inner()));
        self.catalog_changed.notify_waiters();
        r
    }
}

impl WatchView {
    /// A mirror with nothing in it yet, keeping at most `max_sessions`.
    fn empty(status: HostStatus, max_sessions: usize) -> Self {
        Self {
            status,
            root: None,
            catalog: BTreeMap::new(),
            chats: HashMap::new(),
            catalog_version: 0,
            trigger_characters: Vec::new(),
            terminal_command_prefix: None,
            max_sessions,
            disposed: std::collections::HashSet::new(),
            disposed_chats: std::collections::HashSet::new(),
        }
    }

    /// Adds or replaces a session's summary, as the host announces it; `false`
    /// (nothing changed) for a new session when the catalog already holds
    /// `max_sessions`. A session the host announces is listed, even under
    /// a name disposed before.
    pub fn insert_session(&mut self, uri: String, summary: Value) -> bool {
        self.disposed.remove(&uri);
        self.put_session(uri, summary)
    }

    fn put_session(&mut self, uri: String, summary: Value) -> bool {
        if self.catalog.len() >= self.max_sessions && !self.catalog.contains_key(&uri) {
            return false;
        }
        self.catalog_version += 1;
        self.unlist(&uri);
        for chat in chat_uris(&summary) {
            self.chats.insert(chat, uri.clone());
        }
        self.catalog.insert(uri, summary);
        self.forget_unlisted_chats();
        true
    }

    /// Drops the dispose marks of chats no summary lists any more: the host
    /// has unlisted them, so a later listing of one is the host's own.
    fn forget_unlisted_chats(&mut self) {
        if !self.disposed_chats.is_empty() {
            let chats = &self.chats;
            self.disposed_chats.retain(|c| chats.contains_key(c));
        }
    }

    /// Removes a session's summary and its chats (the host removed it).
    pub fn remove_session(&mut self, uri: &str) {
        self.disposed.remove(uri);
        self.unlist(uri);
        self.forget_unlisted_chats();
    }

    /// Takes `uri` out of the catalog and its chats out of the index (a
    /// chat another session lists now stays); the marks of chats no summary
    /// lists any more are dropped by the caller ([`Self::forget_unlisted_chats`]).
    fn unlist(&mut self, uri: &str) {
        self.catalog_version += 1;
        if let Some(old) = self.catalog.remove(uri) {
            for chat in chat_uris(&old) {
                if self.chats.get(&chat).is_some_and(|s| s == uri) {
                    self.chats.remove(&chat);
                }
            }
        }
    }

    /// The host answered a dispose of listed session `uri`: it stays in the
    /// mirror (a watch link that reconnects before the removal arrives
    /// still finds it gone and tells the followers) but is no longer
    /// listed, until the host's removal, a new announcement of it or a
    /// fresh catalog.
    pub fn mark_disposed(&mut self, uri: &str) {
        if self.catalog.contains_key(uri) && self.disposed.insert(uri.to_string()) {
            self.catalog_version += 1;
        }
    }

    /// The sessions `listSessions` shows: the catalog without those whose
    /// dispose was answered.
    pub fn listed_sessions(&self) -> impl Iterator<Item = &String> {
        self.catalog.keys().filter(|u| !self.disposed.contains(*u))
    }

    /// The host answered a move of listed chat `chat` into listed session
    /// `session`: the index puts it there now (visibility follows it, §7.6);
    /// `true` if it was under another session. The summaries follow when
    /// the host's changes arrive (one of the source sent before the move
    /// puts it back until the destination's arrives).
    pub fn move_chat(&mut self, chat: &str, session: &str) -> bool {
        let listed = self.catalog.contains_key(session);
        match self.chats.get_mut(chat) {
            Some(owner) if listed && owner != session => {
                *owner = session.to_string();
                self.catalog_version += 1;
                true
            }
            _ => false,
        }
    }

    /// The host answered a dispose of listed chat `uri`: its session's
    /// summaries leave it out until the host's summary change no longer
    /// lists it (or a fresh catalog).
    pub fn mark_chat_disposed(&mut self, uri: &str) {
        if self.chats.contains_key(uri) {
            self.disposed_chats.insert(uri.to_string());
        }
    }

    /// Removes the chats whose dispose was answered from the `chats` of a
    /// summary or a summary change (`container`).
    pub fn drop_disposed_chats(&self, container: &mut Value) {
        if self.disposed_chats.is_empty() {
            return;
        }
        if let Some(chats) = container.get_mut("chats").and_then(Value::as_array_mut) {
            chats.retain(|c| {
                c.get("resource")
                    .and_then(Value::as_str)
                    .is_none_or(|u| !self.disposed_chats.contains(u))
            });
        }
    }

    /// The chats a `root/sessionSummaryChanged` of `uri` lists (`changes`)
    /// that the mirror has under another session or under none: the ones
    /// that may change hands when it is applied (§7.6). A chat listed again
    /// under the session that already lists it changes nobody's view.
    pub fn chats_changing_hands(&self, uri: &str, changes: &Value) -> Vec<String> {
        chat_uris(changes)
            .into_iter()
            .filter(|chat| self.chats.get(chat).is_none_or(|owner| owner != uri))
            .collect()
    }

    /// Applies `root/sessionSummaryChanged` changes (identity fields kept).
    pub fn patch_session(&mut self, uri: &str, changes: serde_json::Map<String, Value>) {
        let Some(Value::Object(mut summary)) = self.catalog.get(uri).cloned() else {
            return;
        };
        for (k, v) in changes {
            if !matches!(k.as_str(), "resource" | "provider" | "createdAt") {
                summary.insert(k, v);
            }
        }
        self.put_session(uri.to_string(), Value::Object(summary));
    }

    /// Replaces the whole catalog (after a watch link (re)connects); keeps
    /// at most `max_sessions` and returns how many it dropped.
    pub fn replace_catalog(&mut self, catalog: BTreeMap<String, Value>) -> usize {
        self.catalog_version += 1;
        self.catalog.clear();
        self.chats.clear();
        self.disposed.clear();
        self.disposed_chats.clear();
        let mut dropped = 0;
        for (uri, summary) in catalog {
            if !self.put_session(uri, summary) {
                dropped += 1;
            }
        }
        dropped
    }
}

/// The chat URIs a session summary (or a summary change) lists.
pub fn chat_uris(summary: &Value) -> Vec<String> {
    summary
        .get("chats")
        .and_then(Value::as_array)
        .map(|chats| {
            chats
                .iter()
                .filter_map(|c| c.get("resource").and_then(Value::as_str))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// The trimmed content of credential file `path`, if one is configured.
async fn read_secret(
    what: &'static str,
    path: Option<&std::path::Path>,
) -> Result<Option<String>, DialError> {
    let Some(path) = path else { return Ok(None) };
    match tokio::fs::read_to_string(path).await {
        Ok(s) => Ok(Some(s.trim().to_string())),
        Err(source) => Err(DialError::CredentialUnreadable {
            what,
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Percent-encodes bytes outside visible ASCII so any issuer or subject is a
/// valid header value.
fn header_safe(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if (0x21..=0x7e).contains(&b) && b != b'%' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Every configured host's hub, by id, and its watch link task. The set
/// changes only on a config reload ([`Hosts::apply`]); readers take a
/// snapshot, so no lock is held while a hub is used.
#[derive(Debug, Default)]
pub struct Hosts {
    hubs: RwLock<Arc<BTreeMap<String, Arc<HostHub>>>>,
    watches: std::sync::Mutex<HashMap<String, tokio::task::JoinHandle<()>>>,
    /// The bounds every hub made by [`Hosts::apply`] gets.
    limits: HubLimits,
    /// The connectors of dial-in hosts, shared by every hub.
    connectors: Arc<Connectors>,
}

/// What a reload changed.
#[derive(Debug, Default)]
pub struct HostChanges {
    /// Hubs that joined (their watch links are starting).
    pub added: Vec<Arc<HostHub>>,
    /// Hubs that left (their watch links are stopped).
    pub removed: Vec<Arc<HostHub>>,
}

/// Starts the watch link of a hub (given by the relay, which owns the
/// event channel).
pub type StartWatch<'a> = &'a dyn Fn(Arc<HostHub>) -> tokio::task::JoinHandle<()>;

impl Hosts {
    /// Hubs for `configs` (watch links not started yet: see [`Hosts::apply`]).
    pub fn new(configs: &[HostConfig]) -> Result<Self, String> {
        let mut hubs = BTreeMap::new();
        for h in configs {
            hubs.insert(h.id.clone(), Arc::new(new_hub(h)?));
        }
        Ok(Self {
            hubs: RwLock::new(Arc::new(hubs)),
            watches: Default::default(),
            limits: HubLimits::default(),
            connectors: Arc::default(),
        })
    }

    /// No hosts yet; every hub [`Hosts::apply`] makes gets `limits`.
    pub fn with_limits(limits: HubLimits) -> Self {
        Self {
            limits,
            ..Self::default()
        }
    }

    /// The connectors of dial-in hosts (the edge attaches them).
    pub fn connectors(&self) -> &Arc<Connectors> {
        &self.connectors
    }

    fn snapshot(&self) -> Arc<BTreeMap<String, Arc<HostHub>>> {
        self.hubs
            .read()
            .map(|h| h.clone())
            .unwrap_or_else(|e| e.into_inner().clone())
    }

    /// The hub of host `id`.
    pub fn get(&self, id: &str) -> Option<Arc<HostHub>> {
        self.snapshot().get(id).cloned()
    }

    /// Every hub now, by id.
    pub fn all(&self) -> Vec<Arc<HostHub>> {
        self.snapshot().values().cloned().collect()
    }

    /// How many hosts are configured.
    pub fn len(&self) -> usize {
        self.snapshot().len()
    }

    /// Whether no host is configured.
    pub fn is_empty(&self) -> bool {
        self.snapshot().is_empty()
    }

    /// Host `configured` (`relay.default_host`), or the only host.
    pub fn default_host(&self, configured: Option<&str>) -> Option<Arc<HostHub>> {
        let hubs = self.snapshot();
        match configured {
            Some(id) => hubs.get(id).cloned(),
            None if hubs.len() == 1 => hubs.values().next().cloned(),
            None => None,
        }
    }

    /// Makes the host set equal `configs` (contract §8.1: hosts added and
    /// removed by reload). Unchanged hosts keep their hub and watch link;
    /// a host whose configuration changed (URL, credential, label) is
    /// replaced — removed and added under the same id — so only it is
    /// re-dialled. Watch links of hubs not yet watched start now.
    pub fn apply(&self, configs: &[HostConfig], start: StartWatch<'_>) -> HostChanges {
        let old = self.snapshot();
        let mut next = BTreeMap::new();
        let mut changes = HostChanges::default();
        for cfg in configs {
            match old.get(&cfg.id) {
                Some(hub) if hub.cfg == *cfg => {
                    next.insert(cfg.id.clone(), hub.clone());
                }
                _ => match new_hub(cfg) {
                    Ok(hub) => {
                        let mut hub = hub.limited(self.limits);
                        hub.connectors = self.connectors.clone();
                        let hub = Arc::new(hub);
                        next.insert(cfg.id.clone(), hub.clone());
                        changes.added.push(hub);
                    }
                    Err(e) => tracing::warn!(host = %cfg.id, error = %e, "host not added"),
                },
            }
        }
        let mut evicted = Vec::new();
        for (id, hub) in old.iter() {
            if next.get(id).is_none_or(|h| !Arc::ptr_eq(h, hub)) {
                changes.removed.push(hub.clone());
                // A connector authenticated for a host that is gone or no
                // longer dials in the same way must authenticate again.
                if next
                    .get(id)
                    .is_none_or(|h| h.cfg.dial_in != hub.cfg.dial_in)
                {
                    evicted.push(id.clone());
                }
            }
        }
        match self.hubs.write() {
            Ok(mut h) => *h = Arc::new(next),
            Err(e) => *e.into_inner() = Arc::new(next),
        }
        // After the swap: a connector that comes straight back meets the
        // new host set.
        for id in evicted {
            self.connectors.evict(&id);
        }
        self.restart_watches(&changes, start);
        changes
    }

    /// Stops the watch links of removed hubs and starts those of added ones
    /// (and of any hub not watched yet).
    fn restart_watches(&self, changes: &HostChanges, start: StartWatch<'_>) {
        let Ok(mut watches) = self.watches.lock() else {
            return;
        };
        for hub in &changes.removed {
            if let Some(task) = watches.remove(&*hub.id) {
                task.abort();
            }
        }
        for hub in self.all() {
            watches
                .entry(hub.id.to_string())
                .or_insert_with(|| start(hub.clone()));
        }
    }

    /// Stops every watch link (their host connections close).
    pub fn stop_watches(&self) {
        if let Ok(mut watches) = self.watches.lock() {
            for (_, task) in watches.drain() {
                task.abort();
            }
        }
    }
}

impl HostHub {
    /// This hub with `limits` (the catalog mirror keeps at most
    /// `limits.max_sessions`).
    pub fn limited(mut self, limits: HubLimits) -> Self {
        self.limits = limits;
        self.view
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .max_sessions = limits.max_sessions;
        self
    }

    /// The bounds this hub applies.
    pub fn limits(&self) -> HubLimits {
        self.limits
    }
}

fn new_hub(cfg: &HostConfig) -> Result<HostHub, String> {
    HostHub::new(cfg.clone()).map_err(|e| format!("host {}: {e}", cfg.id))
}

/// A host at a plaintext address nobody listens on, with no credentials.
#[cfg(test)]
pub(crate) fn plain_host(id: &str) -> HostConfig {
    HostConfig {
        id: id.into(),
        label: None,
        url: "ws://127.0.0.1:1/".into(),
        dial_in: None,
        allow_plaintext: true,
        token_file: None,
        query_token_file: None,
        client_cert_file: None,
        client_key_file: None,
        ca_file: None,
        authenticate: AuthenticateScope::PerConnection,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A mirror of an empty host holding at most 10 sessions.
    fn empty_view() -> WatchView {
        WatchView::empty(HostStatus::Up, 10)
    }

    #[test]
    fn the_catalog_keeps_at_most_max_sessions() {
        let hub = HostHub::new(plain_host("h")).map(|h| {
            h.limited(HubLimits {
                max_sessions: 2,
                ..HubLimits::default()
            })
        });
        let Ok(hub) = hub else {
            panic!("hub");
        };
        let summary = |uri: &str| serde_json::json!({"resource": uri});
        let all: BTreeMap<String, Value> = ["a", "b", "c"]
            .iter()
            .map(|u| (u.to_string(), summary(u)))
            .collect();
        assert_eq!(hub.update(|v| v.replace_catalog(all)), 1);
        assert!(!hub.update(|v| v.insert_session("d".into(), summary("d"))));
        assert!(hub.update(|v| v.insert_session("a".into(), summary("a"))));
        hub.update(|v| v.remove_session("a"));
        assert!(hub.update(|v| v.insert_session("d".into(), summary("d"))));
        assert_eq!(hub.update(|v| v.catalog.len()), 2);
    }

    /// A session whose dispose was answered leaves `listSessions` at once
    /// and stays in the mirror until the host removes it; a summary change
    /// still in flight does not list it again, the host announcing it anew
    /// or a fresh catalog does; only a listed session is marked.
    #[test]
    fn a_disposed_session_is_unlisted_until_the_host_speaks() {
        let Ok(hub) = HostHub::new(plain_host("h")) else {
            panic!("hub");
        };
        let summary = |uri: &str| serde_json::json!({"resource": uri});
        let listed = |hub: &HostHub| -> Vec<String> {
            let index = hub.sorted_catalog(str::to_string);
            index.iter().map(|e| e.host.to_string()).collect()
        };
        let both: BTreeMap<String, Value> = ["s:/a", "s:/b"]
            .iter()
            .map(|u| (u.to_string(), summary(u)))
            .collect();
        hub.update(|v| v.replace_catalog(both.clone()));
        hub.update(|v| v.mark_disposed("s:/a"));
        hub.update(|v| v.mark_disposed("s:/never-listed"));
        assert!(!hub.read(|v| v.disposed.contains("s:/never-listed")));
        assert_eq!(listed(&hub), vec!["s:/b"]);
        assert!(hub.has_session("s:/a"), "kept for the watch link's diff");
        let mut changes = serde_json::Map::new();
        changes.insert("title".into(), Value::from("late"));
        hub.update(|v| v.patch_session("s:/a", changes));
        assert_eq!(listed(&hub), vec!["s:/b"]);
        hub.update(|v| v.insert_session("s:/a".into(), summary("s:/a")));
        assert_eq!(listed(&hub).len(), 2, "announced anew: listed");
        hub.update(|v| v.mark_disposed("s:/a"));
        hub.update(|v| v.remove_session("s:/a"));
        hub.update(|v| v.insert_session("s:/a".into(), summary("s:/a")));
        assert_eq!(listed(&hub).len(), 2, "removed, then created again");
        hub.update(|v| v.mark_disposed("s:/b"));
        hub.update(|v| v.replace_catalog(both));
        assert_eq!(listed(&hub).len(), 2, "a fresh catalog is the host's word");
        assert!(hub.read(|v| v.disposed.is_empty()));
    }

    /// A chat whose dispose was answered leaves its session's summaries
    /// (listings and catalog notifications) while a change still in flight
    /// lists it; the host's change unlisting it, the session's removal or a
    /// fresh catalog forget the mark; only a listed chat is marked.
    #[test]
    fn a_disposed_chat_is_left_out_until_the_host_unlists_it() {
        let mut v = empty_view();
        let s = |chats: &[&str]| {
            serde_json::json!({"resource": "s:/s",
                "chats": chats.iter().map(|c| serde_json::json!({"resource": c})).collect::<Vec<_>>()})
        };
        let shown = |v: &WatchView, chats: &[&str]| -> usize {
            let mut summary = s(chats);
            v.drop_disposed_chats(&mut summary);
            summary["chats"].as_array().map_or(0, Vec::len)
        };
        v.insert_session("s:/s".into(), s(&["c:/a", "c:/b"]));
        v.mark_chat_disposed("c:/a");
        v.mark_chat_disposed("c:/never-listed");
        assert_eq!(v.disposed_chats.len(), 1);
        assert_eq!(shown(&v, &["c:/a", "c:/b"]), 1);
        let mut changes = serde_json::Map::new();
        changes.insert("chats".into(), s(&["c:/a", "c:/b"])["chats"].clone());
        v.patch_session("s:/s", changes.clone());
        assert_eq!(
            shown(&v, &["c:/a", "c:/b"]),
            1,
            "a late change keeps the mark"
        );
        changes.insert("chats".into(), s(&["c:/b"])["chats"].clone());
        v.patch_session("s:/s", changes);
        assert!(v.disposed_chats.is_empty(), "unlisted by the host");
        v.insert_session("s:/s".into(), s(&["c:/a", "c:/b"]));
        assert_eq!(shown(&v, &["c:/a", "c:/b"]), 2, "listed anew: the host's");
        v.mark_chat_disposed("c:/b");
        v.remove_session("s:/s");
        assert!(v.disposed_chats.is_empty(), "its session removed");
        v.insert_session("s:/s".into(), s(&["c:/a"]));
        v.mark_chat_disposed("c:/a");
        v.replace_catalog(BTreeMap::from([("s:/s".to_string(), s(&["c:/a"]))]));
        assert!(v.disposed_chats.is_empty(), "a fresh catalog");
    }

    /// A move answered through the relay puts the chat under its new
    /// session at once; the host's later summaries (the source without it,
    /// the destination with it) keep it there and report no second move.
    #[test]
    fn a_move_answered_puts_the_chat_under_its_new_session() {
        let mut v = empty_view();
        let s = |uri: &str, chats: &[&str]| {
            serde_json::json!({"resource": uri,
                "chats": chats.iter().map(|c| serde_json::json!({"resource": c})).collect::<Vec<_>>()})
        };
        v.insert_session("s:/a".into(), s("s:/a", &["c:/x"]));
        v.insert_session("s:/b".into(), s("s:/b", &[]));
        assert!(!v.move_chat("c:/x", "s:/none"), "an unlisted destination");
        assert!(!v.move_chat("c:/none", "s:/b"), "an unlisted chat");
        assert!(v.move_chat("c:/x", "s:/b"));
        assert!(!v.move_chat("c:/x", "s:/b"), "already there");
        assert_eq!(v.chats.get("c:/x").map(String::as_str), Some("s:/b"));
        let chats = |uri, list: &[&str]| {
            let mut m = serde_json::Map::new();
            m.insert("chats".into(), s(uri, list)["chats"].clone());
            m
        };
        v.patch_session("s:/a", chats("s:/a", &[]));
        assert_eq!(v.chats.get("c:/x").map(String::as_str), Some("s:/b"));
        let to_b = Value::Object(chats("s:/b", &["c:/x"]));
        assert!(v.chats_changing_hands("s:/b", &to_b).is_empty());
        v.patch_session("s:/b", chats("s:/b", &["c:/x"]));
        assert_eq!(v.chats.get("c:/x").map(String::as_str), Some("s:/b"));
    }

    #[test]
    fn chat_index_follows_the_catalog() {
        let mut v = empty_view();
        let s = |chats: &[&str]| {
            serde_json::json!({"resource": "ahp-session:/s",
                "chats": chats.iter().map(|c| serde_json::json!({"resource": c})).collect::<Vec<_>>()})
        };
        v.insert_session("ahp-session:/s".into(), s(&["ahp-chat:/a", "ahp-chat:/b"]));
        assert_eq!(
            v.chats.get("ahp-chat:/b").map(String::as_str),
            Some("ahp-session:/s")
        );
        let mut changes = serde_json::Map::new();
        changes.insert("chats".into(), s(&["ahp-chat:/c"])["chats"].clone());
        v.patch_session("ahp-session:/s", changes);
        assert!(!v.chats.contains_key("ahp-chat:/a"));
        assert!(v.chats.contains_key("ahp-chat:/c"));
        v.remove_session("ahp-session:/s");
        assert!(v.chats.is_empty() && v.catalog.is_empty());
    }

    #[test]
    fn chats_change_hands_only_when_listed_under_another_session_or_none() {
        let mut v = empty_view();
        let listing = |chats: &[&str]| serde_json::json!({"chats": chats.iter().map(|c| serde_json::json!({"resource": c})).collect::<Vec<_>>()});
        let summary = |uri: &str, chats: &[&str]| {
            let mut s = listing(chats);
            s["resource"] = uri.into();
            s
        };
        v.insert_session(
            "ahp-session:/a".into(),
            summary("ahp-session:/a", &["ahp-chat:/1"]),
        );
        v.insert_session(
            "ahp-session:/b".into(),
            summary("ahp-session:/b", &["ahp-chat:/2"]),
        );
        // Listed again under its own session (a turn's start or end): nothing moves.
        let again = listing(&["ahp-chat:/1"]);
        assert!(v.chats_changing_hands("ahp-session:/a", &again).is_empty());
        // Under another session, or new to the mirror: it may have changed hands.
        let both = listing(&["ahp-chat:/1", "ahp-chat:/2", "ahp-chat:/3"]);
        assert_eq!(
            v.chats_changing_hands("ahp-session:/a", &both),
            ["ahp-chat:/2", "ahp-chat:/3"]
        );
        // Once applied, the mirror has them under `a`: listing them there again moves nothing.
        let changes = both.as_object().cloned().unwrap_or_default();
        v.patch_session("ahp-session:/a", changes);
        assert!(v.chats_changing_hands("ahp-session:/a", &both).is_empty());
        assert_eq!(
            v.chats_changing_hands("ahp-session:/b", &listing(&["ahp-chat:/2"])),
            ["ahp-chat:/2"]
        );
    }

    #[test]
    fn credential_files_are_checked_at_start() {
        let cfg = |cert: Option<&str>, key: Option<&str>| HostConfig {
            id: "h".into(),
            label: None,
            url: "wss://h/".into(),
            dial_in: None,
            allow_plaintext: false,
            token_file: None,
            query_token_file: None,
            client_cert_file: cert.map(PathBuf::from),
            client_key_file: key.map(PathBuf::from),
            ca_file: None,
            authenticate: AuthenticateScope::PerConnection,
        };
        let half = HostHub::new(cfg(Some("/etc/hostname"), None)).err();
        assert!(half.is_some_and(|e| e.to_string().contains("go together")));
        let missing = HostHub::new(cfg(Some("/nonexistent/c"), Some("/nonexistent/k")));
        assert!(missing.is_err());
        assert!(HostHub::new(cfg(None, None)).is_ok());
    }

    #[test]
    fn header_values_are_visible_ascii() {
        assert_eq!(header_safe("https://idp/x"), "https://idp/x");
        assert_eq!(header_safe("a b%é"), "a%20b%25%C3%A9");
    }
}

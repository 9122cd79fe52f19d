//! The relay's configuration: one TOML file parsed into validated types.
//!
//! Everything else in the relay sees only [`RelayConfig`] after
//! [`RelayConfig::validate`] has passed. Unknown keys are errors
//! (`deny_unknown_fields`), so a typo never silently falls back to a default.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::auth::AuthConfig;
use crate::names::qualify::valid_host_id;

/// Errors reading or validating the configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The config file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The TOML is malformed or has unknown or ill-typed keys.
    #[error("{path}: {message}")]
    Parse {
        /// The config file.
        path: PathBuf,
        /// The parser's message, with line and column.
        message: String,
    },
    /// A value is out of range or inconsistent with another.
    #[error("invalid configuration: {0}")]
    Invalid(String),
    /// A value at a known place in the file is invalid.
    #[error("{path}:{line}: {message}")]
    InvalidAt {
        /// The config file.
        path: PathBuf,
        /// 1-based line of the offending value.
        line: usize,
        /// What is wrong.
        message: String,
    },
}

/// The whole relay configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelayConfig {
    /// Where clients connect.
    pub listen: ListenConfig,
    /// Client authentication.
    pub auth: AuthConfig,
    /// The relay's own state: secret and URI store.
    pub relay: RelayState,
    /// The upstream hosts.
    #[serde(default)]
    pub hosts: Vec<HostConfig>,
    /// Bounds.
    #[serde(default)]
    pub limits: Limits,
    /// Access control (contract §7); no rules means nobody sees anything.
    #[serde(default)]
    pub policy: crate::policy::PolicyConfig,
    /// The file this configuration was loaded from (watched for policy reloads).
    #[serde(skip)]
    pub source: Option<PathBuf>,
}

/// Listener and TLS settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenConfig {
    /// Socket address, e.g. `0.0.0.0:8443`.
    pub addr: SocketAddr,
    /// PEM certificate chain (reloaded when the file changes).
    pub tls_cert: Option<PathBuf>,
    /// PEM private key.
    pub tls_key: Option<PathBuf>,
    /// Serve plain `ws://` (only behind a TLS-terminating ingress). Must be
    /// set explicitly; a listener with neither TLS files nor this flag is an
    /// error.
    #[serde(default)]
    pub plaintext: bool,
    /// Plain-HTTP admin listener for `/healthz`, `/readyz` and `/metrics`
    /// (open to probes and scrapers) and the status page (its data for an
    /// admin's token; default `127.0.0.1:9090`); the client listener
    /// answers only the WebSocket upgrade (and the status page).
    #[serde(default = "default_admin_addr")]
    pub admin_addr: SocketAddr,
    /// Serve the admin listener's status data (`/status.json`,
    /// `/status/feed`) without a token. Trusted network only: anything that
    /// reaches the port then reads every principal, host and denial
    /// (the `Host` and `Origin` checks still apply). Default false: the
    /// data needs a token with an `admin` grant on every host, as on the
    /// client listener.
    #[serde(default)]
    pub admin_status_open: bool,
    /// Origins (`scheme://host[:port]`) besides the request's own whose
    /// pages may open WebSocket upgrades and status paths on either
    /// listener (`edge::origin`); default none: same origin only.
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    /// Host names (or `name:port`) accepted in `Host` on the admin
    /// listener's status paths besides IP literals and `localhost`, and,
    /// when given, the only ones accepted on the client listener's upgrades
    /// and status paths (`edge::origin`); default none.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// Peers (CIDRs or addresses) whose `X-Forwarded-For` names the client
    /// address (contract §3.4); default none.
    #[serde(default)]
    pub trusted_proxies: Vec<crate::net::Cidr>,
    /// Failed authentications from one client address within
    /// `auth_failure_window_secs` after which further failures get 429
    /// (default 10; 0 counts as 1).
    #[serde(default = "default_auth_failure_limit")]
    pub auth_failure_limit: u32,
    /// Length of the auth-failure window in seconds (default 60).
    #[serde(default = "default_auth_failure_window_secs")]
    pub auth_failure_window_secs: u64,
    /// Threads serving client connections (`edge::pool`), each owning the
    /// connections handed to it at accept with their sessions and links;
    /// default one per core. 0 serves them on the main runtime's shared
    /// threads instead.
    #[serde(default)]
    pub edge_threads: Option<usize>,
    /// Time slice, in microseconds, each edge thread asks the kernel for
    /// (`edge::slice`, Linux 6.12 and later; the kernel clamps it to
    /// 100–100,000): a short slice lets a woken edge thread run at once
    /// instead of after the process that woke it. Default 100; 0 keeps the
    /// kernel's default, as do the main runtime's threads (`edge_threads =
    /// 0`). A kernel before 6.12 ignores it (logged at start).
    #[serde(default = "default_edge_slice_us")]
    pub edge_slice_us: u64,
}

impl ListenConfig {
    /// The slice edge threads ask for, if any (`edge_slice_us`).
    pub fn edge_slice(&self) -> Option<std::time::Duration> {
        (self.edge_slice_us > 0).then(|| std::time::Duration::from_micros(self.edge_slice_us))
    }
}

/// Relay-owned state.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelayState {
    /// File holding the relay secret (HMAC key for upstream client ids and
    /// cursors); generated with 32 random bytes on first start if absent.
    pub secret_file: PathBuf,
    /// The durable URI store: a redb file (one replica, the default), or a
    /// `postgres://USER@HOST:PORT/DB` URL shared by several replicas
    /// (§12.1; `?sslmode=require` for TLS).
    pub store: PathBuf,
    /// File holding the PostgreSQL password (first line), for a
    /// `postgres://` store.
    #[serde(default)]
    pub store_password_file: Option<PathBuf>,
    /// PEM CA certificates that a `postgres://…?sslmode=require` store's
    /// certificate must chain to (default: the public web roots).
    #[serde(default)]
    pub store_ca_file: Option<PathBuf>,
    /// Host that receives terminals created with a client claim and no
    /// other host hint; optional.
    pub default_host: Option<String>,
    /// How long a disposed client-chosen URI stays reserved (default 30 days).
    #[serde(default = "default_tombstone_ttl")]
    pub tombstone_ttl_secs: u64,
    /// This replica's name in `/status`, `/metrics` (`ahp_relay_info`) and
    /// exported traces (`service.instance.id`); default [`default_replica`].
    /// Read once at start.
    pub replica: Option<String>,
}

impl RelayState {
    /// This replica's name: `replica` if set, else [`default_replica`].
    pub fn replica(&self) -> String {
        match self.replica.as_deref().map(str::trim) {
            Some(name) if !name.is_empty() => name.to_string(),
            _ => default_replica(),
        }
    }
}

/// A replica's default name: `HOSTNAME` (the pod's name in Kubernetes),
/// else the kernel's host name, else `ahp-relay`.
pub fn default_replica() -> String {
    let from_env = std::env::var("HOSTNAME").ok();
    let from_kernel = || std::fs::read_to_string("/proc/sys/kernel/hostname").ok();
    from_env
        .or_else(from_kernel)
        .map(|name| name.trim().to_string())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "ahp-relay".to_string())
}

/// The replica name a configuration file gives (`[relay] replica`, else
/// [`default_replica`]), read before the file is loaded whole: logging and
/// trace export start before `serve` loads its configuration, and a file
/// that does not parse is reported by that load.
pub fn peek_replica(path: &Path) -> String {
    let named = std::fs::read_to_string(path)
        .ok()
        .and_then(|text| text.parse::<toml::Table>().ok())
        .and_then(|doc| {
            let relay = doc.get("relay")?.as_table()?;
            Some(relay.get("replica")?.as_str()?.trim().to_string())
        })
        .filter(|name| !name.is_empty());
    named.unwrap_or_else(default_replica)
}

impl RelayState {
    /// Where the URI store is, as `names::open` takes it.
    pub fn store_location(&self) -> crate::names::open::StoreLocation<'_> {
        crate::names::open::StoreLocation {
            store: &self.store,
            password_file: self.store_password_file.as_deref(),
            ca_file: self.store_ca_file.as_deref(),
        }
    }
}

fn default_tombstone_ttl() -> u64 {
    30 * 24 * 3600
}

pub use crate::upstream::hub::{AuthenticateScope, HostConfig};

/// The admin listener's default address: loopback, port 9090.
pub fn default_admin_addr() -> SocketAddr {
    SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, 9090))
}

/// Failed upgrades per client address per window before 429 (§3.4).
pub fn default_auth_failure_limit() -> u32 {
    10
}

/// The auth-failure window, in seconds.
pub fn default_auth_failure_window_secs() -> u64 {
    60
}

/// The edge threads' time slice, in microseconds: the kernel's least.
pub fn default_edge_slice_us() -> u64 {
    100
}

/// Bounds; every field has a default.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Largest client frame in bytes (both directions).
    pub max_frame_bytes: usize,
    /// Deepest JSON nesting accepted from a client.
    pub max_json_depth: usize,
    /// Seconds to complete TLS + HTTP upgrade.
    pub handshake_timeout_secs: u64,
    /// Seconds a connection may stay open without upgrading to a WebSocket
    /// (keep-alive requests included), counted from its accept; then it is
    /// closed (`limit_hits_total{limit="upgrade_deadline"}`). Both listeners.
    pub upgrade_deadline_secs: u64,
    /// Connections one listener holds before they upgrade (TLS handshake and
    /// HTTP included); one more is closed at accept
    /// (`upgrades_refused_total{reason="pending_connections"}`).
    pub pending_connections: usize,
    /// Of those, from one address (an IPv6 /64 is one; peers in
    /// `listen.trusted_proxies` are not capped); one more is closed at
    /// accept (`upgrades_refused_total{reason="address_connections"}`).
    pub pending_connections_per_address: usize,
    /// Frames queued towards one client at which its links stop reading
    /// from their hosts (§5.9); frames that cannot wait (fan-out, answers)
    /// may take the queue to twice this, beyond which the client gets 4008.
    pub client_queue_frames: usize,
    /// Bytes queued towards one client at which its links stop reading
    /// (same rule as `client_queue_frames`).
    pub client_queue_bytes: usize,
    /// Seconds a client's queue may stay full (its links paused) before the
    /// client is closed with 4008 (§5.9).
    pub slow_client_secs: u64,
    /// Envelopes kept per client session for replay.
    pub replay_buffer_envelopes: usize,
    /// Bytes kept per client session for replay, counted as what each
    /// envelope costs in memory (its bytes + 1/8 + 72, `envelope_cost`).
    /// Also the most a channel's hold keeps while its snapshot is awaited
    /// (host frame bytes); past it the subscribe fails with `holdLimit`,
    /// and a `reconnect`'s cut pauses the session's links until its answer.
    pub replay_buffer_bytes: usize,
    /// Seconds to wait for a host's answer to a forwarded request.
    pub upstream_request_secs: u64,
    /// Largest `listSessions` page a client asks for with `limit`.
    pub list_sessions_limit: usize,
    /// The `listSessions` page without `limit`: VS Code's client neither
    /// sends `limit` nor follows `nextCursor`, so a smaller default would
    /// hide sessions from it silently.
    pub list_sessions_unpaged_limit: usize,
    /// Client sessions (attached or retained) per principal; at the cap a
    /// new one drops the least recently detached (§3.6).
    pub sessions_per_principal: usize,
    /// Open client connections per principal; more get 429 at the upgrade.
    pub connections_per_principal: usize,
    /// Links (hosts in use) per client session.
    pub links_per_session: usize,
    /// Per-client links to one host, all principals together.
    pub links_per_host: usize,
    /// Seconds of silence after which links and watch links ping their host.
    pub link_ping_secs: u64,
    /// Seconds a link may stay silent after its ping before it is declared
    /// dead (resumed, or its client resynchronised).
    pub link_ping_timeout_secs: u64,
    /// A per-client link with no subscription, pending request, host request
    /// or active-client registration closes after this long (§5.7).
    pub link_idle_secs: u64,
    /// Seconds a detached session keeps its links (and keeps buffering).
    pub detach_grace_secs: u64,
    /// Seconds a detached session's record is kept after its links closed.
    pub retain_secs: u64,
    /// Seconds a `reconnect` waits for a host it needs fresh state from.
    pub upstream_settle_secs: u64,
    /// Milliseconds over which resyncs beyond a burst are spread.
    pub resync_spread_ms: u64,
    /// Seconds over which SIGTERM closes clients with 1012 (§8.3).
    pub drain_window_secs: u64,
    /// Bytes all replay buffers together may hold (contract §5.4), counted
    /// as `replay_buffer_bytes` is (what each envelope costs). Above
    /// it, whole buffers of detached sessions are dropped, least recently
    /// attached first; if attached sessions alone hold more, upgrades are
    /// refused with 503.
    pub replay_memory_bytes: usize,
    /// Once upgrades are refused, they are accepted again only when replay
    /// memory is at or below this percentage of `replay_memory_bytes`
    /// (1–100; hysteresis).
    pub replay_memory_resume_percent: u8,
    /// `Retry-After` seconds of a 503 refused for replay memory.
    pub replay_memory_retry_after_secs: u64,
    /// Replay-buffer chunks (16 KiB each) a background thread of idle
    /// priority keeps allocated and touched, so sessions growing their
    /// buffers take no page fault on an edge thread; 0 = none (one process
    /// setting, read at start).
    pub prefault_chunks: usize,
    /// Channels one client session may follow (`subscribe`,
    /// `initialSubscriptions`, `reconnect.subscriptions`, de-duplicated);
    /// beyond it a `subscribe` gets -32603 `reason = "subscriptionLimit"`
    /// and an `initialize`/`reconnect` listing more gets -32602.
    pub subscriptions_per_session: usize,
    /// Forwarded requests of one connection awaiting a host's answer;
    /// beyond it -32603 `reason = "pendingLimit"`.
    pub pending_requests_per_connection: usize,
    /// Sustained client frames per second on one connection (token bucket;
    /// 0 disables; responses to host requests are not counted). A request
    /// over it gets -32603 `reason = "rateLimited"`, a `dispatchAction` a
    /// rejection echo, another notification is dropped.
    pub requests_per_second: u32,
    /// Burst the token bucket allows above `requests_per_second`.
    pub request_burst: u32,
    /// Seconds without any client frame (AHP `ping` included) after which
    /// the socket is closed with 1000 and an idle reason; 0 disables.
    pub client_idle_secs: u64,
    /// Largest frame accepted from a host, at most 64 MiB; the WebSocket
    /// layer of every host connection refuses a bigger message or frame
    /// when its header arrives, so that connection ends (a per-client link
    /// resumes, requests in flight on it get -32603 `upstreamLost`; a watch
    /// link redials) and the relay never buffers it.
    pub upstream_max_frame_bytes: usize,
    /// Bytes one read from a host connection may take (each dialed or
    /// dialed-in host connection holds a buffer this size): large enough
    /// that a streaming host is read many frames per `recv`. A larger frame
    /// grows the buffer while it arrives; once it is taken, an empty buffer
    /// goes back to at most twice this size. 4 KiB to 16 MiB.
    pub upstream_read_buffer_bytes: usize,
    /// Frames queued for one link (client → host) before further requests
    /// get -32603 `reason = "hostBusy"` and dispatches a rejection echo.
    pub link_queue_frames: usize,
    /// Live (pending or confirmed) client-chosen URIs one principal may
    /// hold in the store; beyond it a create gets -32603 `reason = "quota"`.
    pub reservations_per_principal: usize,
    /// Tombstones (names it disposed, kept for `relay.tombstone_ttl_secs`)
    /// one principal may hold; beyond it a create gets -32603
    /// `reason = "quota"` until they expire.
    pub tombstones_per_principal: usize,
    /// Seconds between purges of expired tombstones from the store.
    pub store_purge_secs: u64,
    /// Seconds between checks of creates whose answer was lost (still
    /// pending after `upstream_request_secs`): each is confirmed as soon as
    /// its host lists it.
    pub pending_create_check_secs: u64,
    /// Seconds after which a lost create its host does not list is released
    /// (its name freed): a slow host may still make it until then.
    pub pending_create_release_secs: u64,
    /// Host object references (content references, changesets, canvases,
    /// resource watches) one client session remembers having received
    /// inside a channel it can read (§7.1); the oldest is forgotten first,
    /// counted in `limit_hits_total{limit="seen_refs"}`.
    pub seen_refs_per_session: usize,
    /// Sessions the relay mirrors from one host's catalog; the watch link
    /// stops paging `listSessions` there and drops further
    /// `root/sessionAdded`, with a warning and a count in
    /// `limit_hits_total{limit="host_sessions"}`.
    pub sessions_per_host: usize,
    /// Watch-link events (catalog and root changes of every host) queued for
    /// the fan-out; a full queue makes the watch links wait, so hosts are
    /// read no faster than their events reach root followers.
    pub fanout_queue_events: usize,
    /// Status feeds (`/status/feed`, both listeners together) open at once;
    /// more get 503 (`upgrades_refused_total{reason="status_watchers"}`).
    pub status_watchers: usize,
    /// Seconds of history the status page's charts show: the relay keeps
    /// one point per 500 ms for this long in fixed rings (1 to 3600).
    pub status_history_secs: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_frame_bytes: 4 * 1024 * 1024,
            max_json_depth: 64,
            handshake_timeout_secs: 10,
            upgrade_deadline_secs: 30,
            pending_connections: 4096,
            pending_connections_per_address: 512,
            client_queue_frames: 8192,
            client_queue_bytes: 8 * 1024 * 1024,
            slow_client_secs: 30,
            replay_buffer_envelopes: 4096,
            replay_buffer_bytes: 4 * 1024 * 1024,
            upstream_request_secs: 30,
            list_sessions_limit: 200,
            list_sessions_unpaged_limit: 5000,
            sessions_per_principal: 16,
            connections_per_principal: 32,
            links_per_session: 8,
            links_per_host: 2000,
            link_ping_secs: 20,
            link_ping_timeout_secs: 10,
            link_idle_secs: 300,
            detach_grace_secs: 20,
            retain_secs: 600,
            upstream_settle_secs: 3,
            resync_spread_ms: 5000,
            drain_window_secs: 30,
            replay_memory_bytes: 256 * 1024 * 1024,
            replay_memory_resume_percent: 75,
            replay_memory_retry_after_secs: 10,
            prefault_chunks: 32,
            subscriptions_per_session: 512,
            pending_requests_per_connection: 256,
            requests_per_second: 100,
            request_burst: 200,
            client_idle_secs: 300,
            upstream_max_frame_bytes: 64 * 1024 * 1024,
            upstream_read_buffer_bytes: 64 * 1024,
            link_queue_frames: 1024,
            reservations_per_principal: 1000,
            tombstones_per_principal: 10_000,
            store_purge_secs: 3600,
            pending_create_check_secs: 5,
            pending_create_release_secs: 600,
            seen_refs_per_session: 4096,
            sessions_per_host: 100_000,
            fanout_queue_events: 65_536,
            status_watchers: 16,
            status_history_secs: 900,
        }
    }
}

impl Limits {
    /// [`Limits::link_ping_secs`] as a duration (at least one second).
    pub fn link_ping(&self) -> Duration {
        Duration::from_secs(self.link_ping_secs.max(1))
    }

    /// [`Limits::link_ping_timeout_secs`] as a duration (at least one second).
    pub fn link_ping_timeout(&self) -> Duration {
        Duration::from_secs(self.link_ping_timeout_secs.max(1))
    }

    /// [`Limits::upstream_request_secs`] as a duration.
    pub fn upstream_request(&self) -> Duration {
        Duration::from_secs(self.upstream_request_secs)
    }

    /// The low watermark of replay memory in bytes: refused upgrades resume
    /// at or below it.
    pub fn replay_memory_low_bytes(&self) -> usize {
        let percent = usize::from(self.replay_memory_resume_percent.clamp(1, 100));
        (self.replay_memory_bytes / 100)
            .saturating_mul(percent)
            .saturating_add(self.replay_memory_bytes % 100 * percent / 100)
    }

    /// Checks the bounds serde cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: &str| Err(ConfigError::Invalid(format!("limits: {m}")));
        if self.replay_memory_bytes == 0 {
            return bad("replay_memory_bytes must be at least 1");
        }
        if !(1..=100).contains(&self.replay_memory_resume_percent) {
            return bad("replay_memory_resume_percent must be 1 to 100");
        }
        if self.replay_memory_retry_after_secs == 0 {
            return bad("replay_memory_retry_after_secs must be at least 1");
        }
        let at_least_one = [
            ("subscriptions_per_session", self.subscriptions_per_session),
            (
                "pending_requests_per_connection",
                self.pending_requests_per_connection,
            ),
            ("upstream_max_frame_bytes", self.upstream_max_frame_bytes),
            ("link_queue_frames", self.link_queue_frames),
            (
                "reservations_per_principal",
                self.reservations_per_principal,
            ),
            ("tombstones_per_principal", self.tombstones_per_principal),
            ("seen_refs_per_session", self.seen_refs_per_session),
            ("sessions_per_host", self.sessions_per_host),
            ("fanout_queue_events", self.fanout_queue_events),
            ("status_watchers", self.status_watchers),
            ("pending_connections", self.pending_connections),
            (
                "pending_connections_per_address",
                self.pending_connections_per_address,
            ),
        ];
        if let Some((name, _)) = at_least_one.iter().find(|(_, v)| *v == 0) {
            return bad(&format!("{name} must be at least 1"));
        }
        if self.upstream_max_frame_bytes > 64 << 20 {
            return bad(
                "upstream_max_frame_bytes must be at most 67108864 (64 MiB, the WebSocket layer's message cap)",
            );
        }
        if !(4096..=16 << 20).contains(&self.upstream_read_buffer_bytes) {
            return bad("upstream_read_buffer_bytes must be 4096 to 16777216 (4 KiB to 16 MiB)");
        }
        if !(1..=3600).contains(&self.status_history_secs) {
            return bad("status_history_secs must be 1 to 3600");
        }
        if self.store_purge_secs == 0 {
            return bad("store_purge_secs must be at least 1");
        }
        if self.upgrade_deadline_secs == 0 {
            return bad("upgrade_deadline_secs must be at least 1");
        }
        Ok(())
    }
}

/// What is wrong with how host `h` is reached (contract §13.1): it is
/// dialed at `url` or dials in with `dial_in`, exactly one of them; a
/// dial-in host's credentials towards the host belong to its connector, so
/// the relay-side dialing settings are refused rather than ignored.
fn reach_problem(h: &HostConfig) -> Option<String> {
    let id = &h.id;
    match (&h.dial_in, h.url.is_empty()) {
        (Some(_), false) => Some(format!(
            "host {id}: give url (the relay dials the host) or dial_in (the host's connector dials the relay), not both"
        )),
        (None, true) => Some(format!(
            "host {id}: needs url = \"wss://…\" (the relay dials the host) or dial_in = {{ token_file = \"…\" }} (the host's connector, `ahp-relay connect`, dials the relay)"
        )),
        (Some(_), true) => {
            let dialing = [
                ("allow_plaintext", h.allow_plaintext),
                ("token_file", h.token_file.is_some()),
                ("query_token_file", h.query_token_file.is_some()),
                ("client_cert_file", h.client_cert_file.is_some()),
                ("client_key_file", h.client_key_file.is_some()),
                ("ca_file", h.ca_file.is_some()),
            ];
            dialing.iter().find(|(_, set)| *set).map(|(key, _)| {
                format!(
                    "host {id}: {key} is for a dialed host; a dial-in host's connector holds the host's credentials (ahp-relay connect --to …)"
                )
            })
        }
        (None, false) => None,
    }
}

/// The 1-based line of the `index`-th `[[name]]` table header in `text`.
fn nth_table_line(text: &str, name: &str, index: usize) -> Option<usize> {
    let header = format!("[[{name}]]");
    text.lines()
        .enumerate()
        .filter(|(_, l)| l.trim() == header)
        .nth(index)
        .map(|(n, _)| n + 1)
}

impl RelayConfig {
    /// Reads and validates a TOML file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parses and validates the TOML `text` of the file at `path` (named in errors and
    /// kept as the config's source; nothing is read from it). What [`RelayConfig::load`]
    /// does after reading the file, exposed for the fuzz targets.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let mut cfg: Self = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        cfg.source = Some(path.to_path_buf());
        // A `[[hosts]]` entry's error names the line of its table header.
        if let Some((index, message)) = cfg.host_problem()
            && let Some(line) = nth_table_line(text, "hosts", index)
        {
            return Err(ConfigError::InvalidAt {
                path: path.to_path_buf(),
                line,
                message,
            });
        }
        cfg.validate()?;
        cfg.validate_policy().map_err(|e| ConfigError::InvalidAt {
            path: path.to_path_buf(),
            line: text
                .get(..e.span.start)
                .map_or(1, |head| head.matches('\n').count() + 1),
            message: e.message,
        })?;
        Ok(cfg)
    }

    /// Checks the policy rules against the configured hosts and issuers.
    pub fn validate_policy(&self) -> Result<(), crate::policy::rules::RuleError> {
        let hosts: Vec<(&str, Option<&str>)> = self
            .hosts
            .iter()
            .map(|h| (h.id.as_str(), h.label.as_deref()))
            .collect();
        self.policy.validate(&hosts)?;
        let issuers: Vec<&str> = self
            .auth
            .issuers
            .iter()
            .map(|i| i.issuer.as_str())
            .collect();
        self.policy.validate_issuers(&issuers)
    }

    /// Checks what serde cannot: host ids, URL schemes, TLS presence.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        match (
            &self.listen.tls_cert,
            &self.listen.tls_key,
            self.listen.plaintext,
        ) {
            (Some(_), Some(_), false) | (None, None, true) => {}
            (Some(_), Some(_), true) => {
                return bad("listen: tls files and plaintext = true are exclusive".into());
            }
            _ => {
                return bad(
                    "listen: give tls_cert and tls_key, or set plaintext = true explicitly".into(),
                );
            }
        }
        if let Some((_, problem)) = self.host_problem() {
            return bad(problem);
        }
        if let Some(d) = &self.relay.default_host
            && !self.hosts.iter().any(|h| &h.id == d)
        {
            return bad(format!("relay.default_host {d:?} is not a configured host"));
        }
        if self.auth.issuers.is_empty() {
            return bad("auth: at least one issuer is required".into());
        }
        if let Some(problem) = crate::names::open::location_problem(self.relay.store_location()) {
            return bad(problem);
        }
        self.limits.validate()?;
        Ok(())
    }

    /// The first `[[hosts]]` entry that is wrong, by index, and what is wrong.
    fn host_problem(&self) -> Option<(usize, String)> {
        let mut seen = std::collections::HashSet::new();
        for (i, h) in self.hosts.iter().enumerate() {
            let plain = h.url.starts_with("ws://");
            let problem = if !valid_host_id(&h.id) {
                format!(
                    "host id {:?} must match [a-z0-9-]{{1,32}} and not be localhost",
                    h.id
                )
            } else if !seen.insert(h.id.as_str()) {
                format!("host id {:?} appears twice", h.id)
            } else if let Some(problem) = reach_problem(h) {
                problem
            } else if h.dial_in.is_some() {
                continue;
            } else if !(plain || h.url.starts_with("wss://")) {
                format!(
                    "host {}: url must be wss:// (or ws:// with allow_plaintext)",
                    h.id
                )
            } else if plain && !h.allow_plaintext {
                format!("host {}: ws:// needs allow_plaintext = true", h.id)
            } else if h.client_cert_file.is_some() != h.client_key_file.is_some() {
                format!(
                    "host {}: client_cert_file and client_key_file go together",
                    h.id
                )
            } else {
                continue;
            };
            return Some((i, problem));
        }
        None
    }

    /// The host with this id.
    pub fn host(&self, id: &str) -> Option<&HostConfig> {
        self.hosts.iter().find(|h| h.id == id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_read_buffer_is_bounded() {
        let with = |n: usize| {
            Limits {
                upstream_read_buffer_bytes: n,
                ..Limits::default()
            }
            .validate()
        };
        assert!(with(64 * 1024).is_ok(), "the default");
        assert!(with(4096).is_ok() && with(16 << 20).is_ok(), "the ends");
        for bad in [0, 4095, (16 << 20) + 1] {
            let err = with(bad).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains("upstream_read_buffer_bytes"), "{bad}: {err}");
        }
    }

    /// The replica name traces are exported under is the one the loaded
    /// configuration gives: `[relay] replica`, else the default; a file
    /// that cannot be read or parsed falls back to the default (its load
    /// reports the error).
    #[test]
    fn the_peeked_replica_is_the_configured_one() {
        let dir = std::env::temp_dir().join(format!("ahp-relay-replica-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("relay.toml");
        std::fs::write(
            &file,
            "[relay]\nsecret_file = \"s\"\nreplica = \" relay-b \"\n",
        )
        .unwrap();
        assert_eq!(peek_replica(&file), "relay-b");
        std::fs::write(&file, "[relay]\nsecret_file = \"s\"\n").unwrap();
        assert_eq!(peek_replica(&file), default_replica());
        std::fs::write(&file, "[relay\n").unwrap();
        assert_eq!(peek_replica(&file), default_replica());
        assert_eq!(peek_replica(&dir.join("missing.toml")), default_replica());
        assert!(!default_replica().is_empty());
        let state = |replica: &str| {
            let text = format!("secret_file = \"s\"\nstore = \"u\"\n{replica}");
            toml::from_str::<RelayState>(&text).unwrap()
        };
        assert_eq!(state("replica = \"relay-c\"").replica(), "relay-c");
        assert_eq!(state("replica = \"  \"").replica(), default_replica());
        assert_eq!(state("").replica(), default_replica());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! Configuration of a simulated host: its identity, the sessions it starts
//! with, the scripted agent, and the bounds it keeps.

use std::time::Duration;

/// How the scripted agent answers an accepted turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentScript {
    /// Number of `chat/delta` actions streamed per turn.
    pub reply_deltas: u32,
    /// Bytes of text in each delta.
    pub delta_bytes: usize,
    /// Deltas per second; 0 streams as fast as the host can.
    pub delta_rate: u32,
    /// When true, every turn makes one tool call that waits for the user's
    /// `chat/toolCallConfirmed` (pending-confirmation → running → completed).
    pub tool_confirmation: bool,
    /// Seeded random mode: with a seed, each turn draws its delta count
    /// (1..=2×`reply_deltas`), its delta sizes and whether it calls a tool
    /// from a deterministic generator, so a run can be replayed exactly.
    pub seed: Option<u64>,
}

impl Default for AgentScript {
    fn default() -> Self {
        Self {
            reply_deltas: 8,
            delta_bytes: 24,
            delta_rate: 50,
            tool_confirmation: false,
            seed: None,
        }
    }
}

impl AgentScript {
    /// Pause between two deltas, or `None` when streaming flat out.
    pub fn delta_interval(&self) -> Option<Duration> {
        (self.delta_rate > 0).then(|| Duration::from_secs_f64(1.0 / f64::from(self.delta_rate)))
    }
}

/// Most write waits a host keeps until they are taken
/// ([`SimHostConfig::record_write_waits`]).
pub const MAX_WRITE_WAITS: usize = 1 << 20;

/// Everything a simulated host is started with.
#[derive(Debug, Clone)]
pub struct SimHostConfig {
    /// Host name: shown in agent descriptions, session titles and logs.
    pub name: String,
    /// Agent provider id the host advertises (one agent per host).
    pub provider: String,
    /// Number of sessions (each with one idle chat) present at start.
    pub sessions: usize,
    /// Id prefix of the seeded sessions: `ahp-session:/<prefix>-<n>` with chat
    /// `ahp-chat:/<prefix>-<n>-main`. Two hosts given the same prefix announce
    /// colliding URIs, as cloned hosts do.
    pub session_prefix: String,
    /// Terminals present at start: `ahp-terminal:/<n>` (in VS Code mode
    /// `agenthost-terminal://shell/<n>`, as its shell tools name them), claimed by the first
    /// session's chat (needs `sessions ≥ 1`). Host-assigned ids like these
    /// collide across hosts, as real terminal ids do.
    pub terminals: usize,
    /// The agent's script.
    pub script: AgentScript,
    /// Envelopes kept for `reconnect` replay (rejected ones included).
    pub replay_log: usize,
    /// Behave like VS Code's host where hosts differ: sessions are named
    /// `<provider>:/<uuid>` and chats `ahp-chat://<chatId>/<b64url(session)>`
    /// (see [`super::naming`]); the root carries a `config` that clients change
    /// with `root/configChanged`; `root/session*`, `root/progress` and
    /// `auth/required` go to every connection; `authenticate` tokens are
    /// host-wide (see `per_connection_tokens`); and several connections may
    /// share one `clientId` at the same time.
    pub vscode_compat: bool,
    /// In VS Code mode, keep `authenticate` tokens per connection after all
    /// (AHP's scope) while still broadcasting `auth/required`. Without it a
    /// VS Code-mode host keeps one token store for the whole process, as
    /// VS Code's agent host does (`node/agentHostAuthenticationService.ts`):
    /// a token given on any connection serves every connection, survives
    /// the connection that gave it, and the latest one replaces the others.
    pub per_connection_tokens: bool,
    /// Seed of the VS Code-mode session uuids. `None` derives it from
    /// `session_prefix`; two hosts with the same seed mint colliding ids.
    pub id_seed: Option<u64>,
    /// The folder the host's `file:` resources live in (working directories,
    /// `resource*` commands). `None`: a fresh temporary folder per host,
    /// removed when the host is dropped. Paths outside it are refused.
    pub sandbox: Option<std::path::PathBuf>,
    /// Keep a temporary sandbox when the host is dropped (debugging).
    pub keep_sandbox: bool,
    /// Largest file `resourceRead` returns and `resourceWrite` produces, in bytes.
    pub max_resource_bytes: u64,
    /// Resource watches open at once (`createResourceWatch` beyond → -32603).
    pub max_watches: usize,
    /// Tool output longer than this many bytes is returned as a content
    /// reference (`ahp-content:/…`, read with `resourceRead`) instead of inline.
    pub inline_output_max: usize,
    /// Content references kept readable (oldest forgotten first).
    pub content_refs_kept: usize,
    /// Protected resources (RFC 9728 `resource` ids, e.g.
    /// `https://api.example.com`) the agent declares: a turn is refused on a
    /// connection that has not `authenticate`d for every one of them.
    pub protected_resources: Vec<String>,
    /// Streaming load mode (a turn whose message holds `[stream:<n>]`): actions
    /// per second of each stream, 0 = as fast as the sockets take them. Every
    /// streamed turn is paced on its own clock, so k concurrent streams send
    /// k × `stream_rate` actions per second in all.
    pub stream_rate: u32,
    /// Streaming load mode: frames rendered per batch (one lock, one queue push).
    pub stream_batch: usize,
    /// Streaming load mode: batches queued but not yet written by every
    /// subscriber; the stream waits when this many are in flight.
    pub stream_in_flight: usize,
    /// Streaming load mode: approximate size of each `chat/delta` frame in bytes.
    pub stream_frame_bytes: usize,
    /// Streaming load mode: frame lengths spread evenly over
    /// `stream_frame_bytes ± stream_frame_jitter / 2`, by a fixed hash of each
    /// frame's `serverSeq` (0: every frame the same length).
    pub stream_frame_jitter: usize,
    /// Streaming load mode: note, for each batch written, how long it waited
    /// between being stamped and its write to the socket completing
    /// ([`crate::simhost::SimHost::take_write_waits`]; the bench's split of a
    /// path's latency at the host's socket). At most [`MAX_WRITE_WAITS`] are
    /// kept until taken.
    pub record_write_waits: bool,
    /// Inbound frames kept in the record that tests query (oldest dropped).
    pub record_limit: usize,
    /// Largest WebSocket message accepted, in bytes.
    pub max_frame_bytes: usize,
    /// The protocol versions this host speaks (caret range of one line).
    pub protocol: HostProtocol,
    /// How long the host keeps a client-contributed tool call running after
    /// its contributor went away — its last connection closed, or it left
    /// the session's `activeClients` (`session/activeClientRemoved`, or an
    /// `unsubscribe` of the session) — before failing it with
    /// `chat/toolCallComplete` `{success: false}`. A client that comes back
    /// within it (`reconnect`, or `initialize` with the same `clientId`; or
    /// `session/activeClientSet` again after leaving) keeps its tool calls.
    pub client_tool_grace_ms: u64,
}

impl Default for SimHostConfig {
    fn default() -> Self {
        Self {
            name: "simhost".into(),
            provider: "sim".into(),
            sessions: 3,
            session_prefix: "simhost".into(),
            terminals: 0,
            script: AgentScript::default(),
            replay_log: 1000,
            vscode_compat: false,
            per_connection_tokens: false,
            id_seed: None,
            sandbox: None,
            max_resource_bytes: 16 * 1024 * 1024,
            max_watches: 64,
            inline_output_max: 4096,
            content_refs_kept: 256,
            protected_resources: Vec::new(),
            stream_rate: 0,
            stream_batch: 256,
            stream_in_flight: 8,
            stream_frame_bytes: 320,
            stream_frame_jitter: 0,
            record_write_waits: false,
            record_limit: 100_000,
            max_frame_bytes: 4 * 1024 * 1024,
            protocol: HostProtocol::V1,
            keep_sandbox: false,
            client_tool_grace_ms: 3000,
        }
    }
}

impl SimHostConfig {
    /// [`SimHostConfig::client_tool_grace_ms`] as a duration.
    pub fn client_tool_grace(&self) -> Duration {
        Duration::from_millis(self.client_tool_grace_ms)
    }

    /// A configuration named `name` whose seeded URIs use `name` as prefix.
    pub fn named(name: &str) -> Self {
        Self {
            name: name.into(),
            session_prefix: name.into(),
            ..Self::default()
        }
    }
}

/// The one line of protocol versions a simulated host speaks, each a caret
/// range as real hosts negotiate it (same major; for `0.x` the same minor):
/// from the highest version offered in that range, whatever the order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HostProtocol {
    /// `^1.0.0`: the AHP 1.x line.
    #[default]
    V1,
    /// `^0.9.0`: hosts of VS Code's 0.9 era and pi-ahp's 0.9 mode.
    V0_9,
    /// `^0.10.0`: VS Code 1.141's host, which accepts only this line.
    V0_10,
    /// `^2.0.0`: a host no client or relay of today can speak to.
    V2,
}

impl HostProtocol {
    /// The `supportedVersions` of a -32005.
    pub fn supported(self) -> &'static str {
        match self {
            Self::V1 => "^1.0.0",
            Self::V0_9 => "^0.9.0",
            Self::V0_10 => "^0.10.0",
            Self::V2 => "^2.0.0",
        }
    }

    /// Whether (major, minor) is in this line.
    pub fn speaks(self, major: u64, minor: u64) -> bool {
        match self {
            Self::V1 => major == 1,
            Self::V0_9 => (major, minor) == (0, 9),
            Self::V0_10 => (major, minor) == (0, 10),
            Self::V2 => major == 2,
        }
    }
}

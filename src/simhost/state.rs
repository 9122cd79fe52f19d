//! The host's authoritative state trees (root, sessions, chats, terminals)
//! and how actions change them — always through the official `ahp` reducers.

use std::collections::BTreeMap;

use ahp::reducers::{
    apply_action_to_chat, apply_action_to_resource_watch, apply_action_to_root,
    apply_action_to_session,
};
use ahp::{ReduceOutcome, apply_action_to_terminal};
use ahp_types::actions::StateAction;
use ahp_types::state::{
    ChatState, ChatSummary, ResourceWatchState, RootState, SessionChatSummary, SessionState,
    SessionStatus, SessionSummary, Snapshot, SnapshotState, TerminalInfo, TerminalState,
};
use serde_json::json;

use super::clock;
use super::config::SimHostConfig;
use super::naming;
use super::typed::{typed, typed_action};

/// What kind of channel a URI names, decided by its scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChannelKind {
    /// `ahp-root://`
    Root,
    /// `ahp-session:/…`
    Session,
    /// `ahp-chat:/…`
    Chat,
    /// `ahp-terminal:/…`
    Terminal,
    /// `ahp-resource-watch:/…`
    ResourceWatch,
    /// Any other scheme: this host has no such channel.
    Other,
}

/// Schemes that never name a session, even in VS Code mode (where a
/// session's scheme is its provider id).
const NOT_SESSION_SCHEMES: &[&str] = &["file", "http", "https", "data", "virtual"];

impl ChannelKind {
    /// Classifies `uri` by its scheme. `ahp-chat:` covers both the spec's
    /// `ahp-chat:/<id>` and VS Code's `ahp-chat://<chatId>/<b64>`; any
    /// `<scheme>:/…` that is neither an `ahp-` scheme nor a content scheme
    /// is a VS Code-style `<provider>:/<id>` session.
    pub fn of(uri: &str) -> Self {
        if uri == ahp_types::ROOT_RESOURCE_URI {
            return Self::Root;
        }
        let Some((scheme, rest)) = uri.split_once(':') else {
            return Self::Other;
        };
        match scheme {
            "ahp-session" if rest.starts_with('/') => Self::Session,
            "ahp-chat" if rest.starts_with('/') => Self::Chat,
            // VS Code's workbench terminals `agenthost-terminal:/<uuid>`, its
            // shell tools' `agenthost-terminal://shell/<id>`.
            "ahp-terminal" | "agenthost-terminal" if rest.starts_with('/') => Self::Terminal,
            "ahp-resource-watch" if rest.starts_with('/') => Self::ResourceWatch,
            s if !s.starts_with("ahp-")
                && !NOT_SESSION_SCHEMES.contains(&s)
                && !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"+.-".contains(&b))
                && rest.starts_with('/') =>
            {
                Self::Session
            }
            _ => Self::Other,
        }
    }
}

/// One session: its state plus the summary fields the state does not carry.
#[derive(Debug, Clone)]
pub struct SessionEntry {
    /// The session channel's state.
    pub state: SessionState,
    /// ISO 8601 creation time.
    pub created_at: String,
}

/// One chat and the session it belongs to.
#[derive(Debug, Clone)]
pub struct ChatEntry {
    /// The chat channel's state.
    pub state: ChatState,
    /// URI of the owning session.
    pub session: String,
}

/// All state of one host. Invariant: every chat's `session` exists and lists
/// the chat in its catalog.
#[derive(Debug, Clone)]
pub struct HostState {
    /// `ahp-root://`
    pub root: RootState,
    /// Sessions by URI.
    pub sessions: BTreeMap<String, SessionEntry>,
    /// Chats by URI.
    pub chats: BTreeMap<String, ChatEntry>,
    /// Terminals by URI.
    pub terminals: BTreeMap<String, TerminalState>,
    /// Resource watches by channel URI (see `files`).
    pub watches: BTreeMap<String, ResourceWatchState>,
}

impl HostState {
    /// The state a freshly started host has: one agent and `cfg.sessions`
    /// seeded sessions with one idle chat each, oldest first.
    pub fn seeded(cfg: &SimHostConfig) -> Self {
        let mut agent = json!({
            "provider": cfg.provider,
            "displayName": format!("Sim agent ({})", cfg.name),
            "description": format!("Scripted agent of simulated host {}", cfg.name),
            "models": [{"id": "sim-1", "provider": cfg.provider, "name": "Sim 1"}],
            "capabilities": {"multipleChats": {}}
        });
        if !cfg.protected_resources.is_empty() {
            agent["protectedResources"] = cfg
                .protected_resources
                .iter()
                .map(|r| protected_resource(r))
                .collect();
        }
        let root = RootState {
            agents: typed(agent).into_iter().collect(),
            active_sessions: Some(0),
            terminals: Some(Vec::new()),
            config: if cfg.vscode_compat {
                typed(root_config())
            } else {
                None
            },
            meta: None,
        };
        let mut state = Self {
            root,
            sessions: BTreeMap::new(),
            chats: BTreeMap::new(),
            terminals: BTreeMap::new(),
            watches: BTreeMap::new(),
        };
        let now = jiff::Timestamp::now();
        for n in 1..=cfg.sessions {
            let age = jiff::SignedDuration::from_secs(60 * (cfg.sessions - n + 1) as i64);
            let at = clock::iso(now.checked_sub(age).unwrap_or(now));
            state.insert_session(
                cfg,
                &naming::seeded_session_uri(cfg, n),
                &format!("Session {n} on {}", cfg.name),
                &at,
                true,
            );
        }
        state.root.active_sessions = Some(state.sessions.len() as i64);
        state.seed_terminals(cfg);
        state
    }

    fn seed_terminals(&mut self, cfg: &SimHostConfig) {
        let Some((session, entry)) = self.sessions.iter().next() else {
            return;
        };
        let chat = entry.state.default_chat.clone().unwrap_or_default();
        for n in 1..=cfg.terminals {
            let terminal = json!({
                "title": format!("Terminal {n} on {}", cfg.name), "content": [],
                "lifecycle": {"status": "running"},
                "claim": {"kind": "session", "session": session, "chat": chat}
            });
            let uri = match cfg.vscode_compat {
                true => format!("agenthost-terminal://shell/{n}"),
                false => format!("ahp-terminal:/{n}"),
            };
            if let Some(t) = typed::<TerminalState>(terminal) {
                self.terminals.insert(uri, t);
            }
        }
        self.root.terminals = Some(self.terminal_infos());
    }

    /// Inserts a session with its default chat `<session id>-main`. `ready`
    /// chooses its lifecycle (a created session becomes ready by `session/ready`).
    pub fn insert_session(
        &mut self,
        cfg: &SimHostConfig,
        uri: &str,
        title: &str,
        at: &str,
        ready: bool,
    ) -> String {
        let chat_uri = self.free_default_chat_uri(cfg, uri);
        let chat = json!({
            "resource": chat_uri, "title": "Main", "status": SessionStatus::Idle.bits(),
            "modifiedAt": at, "turns": []
        });
        let session = json!({
            "provider": cfg.provider, "title": title, "status": SessionStatus::Idle.bits(),
            "lifecycle": if ready { "ready" } else { "creating" },
            "activeClients": [], "chats": [], "defaultChat": chat_uri
        });
        if let (Some(chat), Some(mut session)) =
            (typed::<ChatState>(chat), typed::<SessionState>(session))
        {
            session.chats.push(chat_summary(&chat));
            self.chats.insert(
                chat_uri.clone(),
                ChatEntry {
                    state: chat,
                    session: uri.to_string(),
                },
            );
            self.sessions.insert(
                uri.to_string(),
                SessionEntry {
                    state: session,
                    created_at: at.to_string(),
                },
            );
        }
        chat_uri
    }

    /// The session's default chat URI ([`naming::default_chat_uri`]), or
    /// with `-2`, `-3`… appended when a client already took that chat URI.
    fn free_default_chat_uri(&self, cfg: &SimHostConfig, session_uri: &str) -> String {
        let base = naming::default_chat_uri(cfg, session_uri);
        std::iter::once(base.clone())
            .chain((2..).map(|n| format!("{base}-{n}")))
            .find(|c| !self.chats.contains_key(c))
            .unwrap_or(base)
    }

    /// Whether `uri` names a channel this host has.
    pub fn has_channel(&self, uri: &str) -> bool {
        match ChannelKind::of(uri) {
            ChannelKind::Root => true,
            ChannelKind::Session => self.sessions.contains_key(uri),
            ChannelKind::Chat => self.chats.contains_key(uri),
            ChannelKind::Terminal => self.terminals.contains_key(uri),
            ChannelKind::ResourceWatch => self.watches.contains_key(uri),
            ChannelKind::Other => false,
        }
    }

    /// Applies an accepted action to the channel it targets with the official
    /// reducer for that channel.
    pub fn apply(&mut self, channel: &str, action: &StateAction) -> ReduceOutcome {
        match ChannelKind::of(channel) {
            ChannelKind::Root => apply_action_to_root(&mut self.root, action),
            ChannelKind::Session => match self.sessions.get_mut(channel) {
                Some(s) => apply_action_to_session(&mut s.state, action),
                None => ReduceOutcome::OutOfScope,
            },
            ChannelKind::Chat => match self.chats.get_mut(channel) {
                Some(c) => apply_action_to_chat(&mut c.state, action),
                None => ReduceOutcome::OutOfScope,
            },
            ChannelKind::Terminal => match self.terminals.get_mut(channel) {
                Some(t) => apply_action_to_terminal(t, action),
                None => ReduceOutcome::OutOfScope,
            },
            ChannelKind::ResourceWatch => match self.watches.get_mut(channel) {
                Some(w) => apply_action_to_resource_watch(w, action),
                None => ReduceOutcome::OutOfScope,
            },
            ChannelKind::Other => ReduceOutcome::OutOfScope,
        }
    }

    /// A snapshot of `uri` taken at `from_seq`; `turns` windows a chat's
    /// completed turns to the most recent ones (advisory `view.turns`).
    pub fn snapshot(&self, uri: &str, from_seq: u64, turns: Option<usize>) -> Option<Snapshot> {
        let state = match ChannelKind::of(uri) {
            ChannelKind::Root => SnapshotState::Root(Box::new(self.root.clone())),
            ChannelKind::Session => {
                SnapshotState::Session(Box::new(self.sessions.get(uri)?.state.clone()))
            }
            ChannelKind::Chat => {
                let mut chat = self.chats.get(uri)?.state.clone();
                if let Some(keep) = turns {
                    let cut = chat.turns.len().saturating_sub(keep);
                    if cut > 0 {
                        chat.turns.drain(..cut);
                        chat.turns_next_cursor = Some(turns_cursor(cut));
                    }
                }
                SnapshotState::Chat(Box::new(chat))
            }
            ChannelKind::Terminal => {
                SnapshotState::Terminal(Box::new(self.terminals.get(uri)?.clone()))
            }
            ChannelKind::ResourceWatch => {
                SnapshotState::ResourceWatch(Box::new(self.watches.get(uri)?.clone()))
            }
            ChannelKind::Other => return None,
        };
        Some(Snapshot {
            resource: uri.to_string(),
            state,
            from_seq: i64::try_from(from_seq).unwrap_or(i64::MAX),
        })
    }

    /// The catalog entry of a session, with status and `modifiedAt`
    /// aggregated from its chats.
    pub fn summary(&self, uri: &str) -> Option<SessionSummary> {
        let entry = self.sessions.get(uri)?;
        let s = &entry.state;
        let chats: Vec<&ChatState> = s
            .chats
            .iter()
            .filter_map(|c| self.chats.get(&c.resource).map(|e| &e.state))
            .collect();
        let modified_at = chats
            .iter()
            .map(|c| c.modified_at.as_str())
            .chain(std::iter::once(entry.created_at.as_str()))
            .max()
            .unwrap_or_default()
            .to_string();
        let status = aggregate_status(s.status, chats.iter().map(|c| c.status));
        let compact: Vec<SessionChatSummary> = chats
            .iter()
            .map(|c| SessionChatSummary {
                resource: c.resource.clone(),
                title: c.title.clone(),
                origin: c.origin.clone(),
                interactivity: c.interactivity,
                status: Some(c.status),
                changes: c.changes.clone(),
            })
            .collect();
        typed(json!({
            "provider": s.provider, "title": s.title, "status": status,
            "resource": uri, "createdAt": entry.created_at, "modifiedAt": modified_at,
            "chats": compact, "defaultChat": s.default_chat,
            "workingDirectories": s.working_directories,
        }))
    }

    /// Session summaries, most recently modified first (ties by URI).
    pub fn summaries_newest_first(&self) -> Vec<SessionSummary> {
        let mut all: Vec<SessionSummary> = self
            .sessions
            .keys()
            .filter_map(|uri| self.summary(uri))
            .collect();
        all.sort_by(|a, b| {
            b.modified_at
                .cmp(&a.modified_at)
                .then_with(|| a.resource.cmp(&b.resource))
        });
        all
    }

    /// The `root/terminalsChanged` list: every terminal, by URI.
    pub fn terminal_infos(&self) -> Vec<TerminalInfo> {
        self.terminals
            .iter()
            .map(|(uri, t)| TerminalInfo {
                resource: uri.clone(),
                title: t.title.clone(),
                claim: t.claim.clone(),
                lifecycle: t.lifecycle.clone(),
            })
            .collect()
    }

    /// Ends every active turn (used when a host restarts and its agent
    /// processes are gone): the turn is recorded as cancelled.
    /// The session catalog entry of each such chat is updated to match, so
    /// no subscriber sees a turn that runs forever.
    pub fn cancel_active_turns(&mut self) {
        for (uri, entry) in self.chats.iter_mut() {
            let Some(turn) = entry.state.active_turn.clone() else {
                continue;
            };
            let duration = clock::millis_since(&turn.started_at);
            if let Some(action) = typed_action(json!({
                "type": "chat/turnCancelled", "turnId": turn.id, "duration": duration
            })) {
                apply_action_to_chat(&mut entry.state, &action);
            }
            let changes =
                json!({"status": entry.state.status, "modifiedAt": entry.state.modified_at});
            if let (Some(session), Some(update)) = (
                self.sessions.get_mut(&entry.session),
                typed_action(
                    json!({"type": "session/chatUpdated", "chat": uri, "changes": changes}),
                ),
            ) {
                apply_action_to_session(&mut session.state, &update);
            }
        }
    }
}

/// RFC 9728 metadata of a protected resource the agent declares.
fn protected_resource(resource: &str) -> serde_json::Value {
    json!({
        "resource": resource, "resource_name": format!("Sim resource {resource}"),
        "authorization_servers": ["https://login.simhost.invalid"],
        "scopes_supported": ["sim"], "required": true
    })
}

/// The root `config` of a VS Code-mode host: what `root/configChanged` edits.
fn root_config() -> serde_json::Value {
    json!({
        "schema": {"type": "object", "properties": {
            "autoApprove": {"type": "boolean", "title": "Auto-approve tool calls", "default": false},
            "mode": {"type": "string", "title": "Agent mode", "default": "agent"}
        }},
        "values": {"autoApprove": false, "mode": "agent"}
    })
}

/// The opaque `turnsNextCursor` meaning "the `hidden` oldest turns are not loaded".
pub fn turns_cursor(hidden: usize) -> String {
    format!("turns-before-{hidden}")
}

/// Reads a cursor made by [`turns_cursor`].
pub fn parse_turns_cursor(cursor: &str) -> Option<usize> {
    cursor.strip_prefix("turns-before-")?.parse().ok()
}

/// The catalog entry of a chat, as the session lists it.
pub fn chat_summary(chat: &ChatState) -> ChatSummary {
    ChatSummary {
        resource: chat.resource.clone(),
        title: chat.title.clone(),
        status: chat.status,
        activity: chat.activity.clone(),
        modified_at: chat.modified_at.clone(),
        changes: chat.changes.clone(),
        origin: chat.origin.clone(),
        movable: chat.movable,
        interactivity: chat.interactivity,
        working_directories: chat.working_directories.clone(),
    }
}

/// Session activity aggregated from its chats: input-needed beats
/// in-progress beats error beats idle; the session's own read/archived
/// flags are kept.
pub fn aggregate_status(session_status: u32, chats: impl Iterator<Item = u32>) -> u32 {
    let activity_mask = SessionStatus::Idle.bits()
        | SessionStatus::Error.bits()
        | SessionStatus::InProgress.bits()
        | SessionStatus::InputNeeded.bits();
    let mut any = 0u32;
    for c in chats {
        any |= c;
    }
    let activity = [
        SessionStatus::InputNeeded,
        SessionStatus::InProgress,
        SessionStatus::Error,
    ]
    .into_iter()
    .find(|flag| any & flag.bits() == flag.bits())
    .unwrap_or(SessionStatus::Idle)
    .bits();
    (session_status & !activity_mask) | activity
}

//! The scripted agent: what the host does after it accepts a turn.
//!
//! A turn streams `chat/responsePart` (an empty markdown part), then
//! `chat/delta`s, optionally a tool call that waits for the user's
//! confirmation, then — when the message asks for one with
//! `[client-tool:<name>]` — a call of a client-contributed tool that waits
//! for its contributor ([`super::client_tools`]), then `chat/turnComplete`;
//! a queued message then starts the
//! next turn. Each step re-checks, under the host lock, that the turn is
//! still the chat's active turn and that the host has not restarted, so a
//! cancelled turn or a restart stops the stream at once.

use std::sync::Arc;

use ahp_types::state::{ChatState, ResponsePart};
use serde_json::json;
use tokio::sync::Notify;

use super::client_tools;
use super::clock::{self, SplitMix64};
use super::config::AgentScript;
use super::core::HostCore;
use super::server::Shared;
use super::stream;
use super::typed::typed_action;

const FILLER: &str = "The simulated agent streams this text in small pieces so that clients, relays and benchmarks see a realistic chat/delta load. ";

/// The shape of one turn, drawn from the script (and the seed, if any).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnPlan {
    /// Sizes in bytes of the deltas, in order.
    pub deltas: Vec<usize>,
    /// Whether the turn makes a tool call that needs confirmation.
    pub tool: bool,
}

impl TurnPlan {
    /// The plan for the next turn: fixed by the script, or drawn from `rng`
    /// in seeded mode.
    pub fn draw(script: &AgentScript, rng: &mut SplitMix64) -> Self {
        if script.seed.is_none() {
            return Self {
                deltas: vec![script.delta_bytes; script.reply_deltas as usize],
                tool: script.tool_confirmation,
            };
        }
        let count = rng.range(1, u64::from(script.reply_deltas.max(1)) * 2) as usize;
        let max = script.delta_bytes.max(1) as u64;
        let deltas = (0..count).map(|_| rng.range(1, max * 2) as usize).collect();
        let tool = script.tool_confirmation && rng.range(0, 1) == 1;
        Self { deltas, tool }
    }
}

/// The text of delta `index` of a turn: `len` ASCII bytes of filler.
pub fn delta_text(index: usize, len: usize) -> String {
    FILLER
        .chars()
        .cycle()
        .skip(index * len % FILLER.len())
        .take(len)
        .collect()
}

/// The waker of a chat's agent task.
pub fn waker(core: &mut HostCore, chat: &str) -> Arc<Notify> {
    core.wakers
        .entry(chat.to_string())
        .or_insert_with(|| Arc::new(Notify::new()))
        .clone()
}

/// Wakes a chat's agent task (after a confirmation or cancellation).
pub fn wake(core: &mut HostCore, chat: &str) {
    waker(core, chat).notify_one();
}

/// Starts the agent on the chat's newly accepted turn `turn_id`.
pub fn start_turn(shared: &Arc<Shared>, core: &mut HostCore, chat: &str, turn_id: &str) {
    let plan = TurnPlan::draw(&core.cfg.script.clone(), &mut core.rng);
    let interval = core.cfg.script.delta_interval();
    let turn = TurnCtx {
        shared: shared.clone(),
        chat: chat.to_string(),
        turn_id: turn_id.to_string(),
        epoch: core.epoch,
        notify: waker(core, chat),
    };
    tokio::spawn(async move { turn.run(plan, interval).await });
}

/// Starts the chat's first queued message as a turn if the chat is idle
/// (the spec's two-step consumption: `chat/pendingMessageRemoved` with kind
/// `queued`, then `chat/turnStarted` carrying `queuedMessageId`).
pub fn consume_queue(shared: &Arc<Shared>, core: &mut HostCore, chat: &str) {
    let Some(state) = core.state.chats.get(chat).map(|c| &c.state) else {
        return;
    };
    if state.active_turn.is_some() {
        return;
    }
    let Some(next) = state
        .queued_messages
        .as_ref()
        .and_then(|q| q.first())
        .cloned()
    else {
        return;
    };
    if let Some(removed) = typed_action(json!({
        "type": "chat/pendingMessageRemoved", "kind": "queued", "id": next.id
    })) {
        core.emit(chat, removed);
    }
    let turn_id = core.fresh_id("turn");
    if let Some(started) = typed_action(json!({
        "type": "chat/turnStarted", "turnId": turn_id, "startedAt": clock::now_iso(),
        "message": next.message, "queuedMessageId": next.id
    })) {
        core.emit(chat, started);
        start_turn(shared, core, chat, &turn_id);
    }
}

/// Where a turn's agent task is working.
struct TurnCtx {
    shared: Arc<Shared>,
    chat: String,
    turn_id: String,
    epoch: u64,
    notify: Arc<Notify>,
}

/// What the tool call of a turn is doing, as the task sees it.
enum ToolPhase {
    Pending,
    Running,
    Done,
}

impl TurnCtx {
    async fn run(self, plan: TurnPlan, interval: Option<std::time::Duration>) {
        let part_id = format!("{}-text", self.turn_id);
        let part = json!({"type": "chat/responsePart", "turnId": self.turn_id,
            "part": {"kind": "markdown", "id": part_id, "content": ""}});
        if !self.step(|core, chat| emit_json(core, chat, part)) {
            return;
        }
        let text = self.message_text().unwrap_or_default();
        let streamed = match stream::requested(&text) {
            Some(total) => self.load_stream(&part_id, total).await,
            None => self.deltas(&plan, interval, &part_id).await,
        };
        if !streamed || (plan.tool && !self.tool_call().await) {
            return;
        }
        if let Some(bytes) = super::files::requested_output(&text)
            && !self.output_tool_call(bytes).await
        {
            return;
        }
        if let Some(tool) = client_tools::requested_tool(&text)
            && !self.client_tool_call(tool).await
        {
            return;
        }
        self.step(|core, chat| {
            let started = active_started_at(core, chat);
            emit_json(
                core,
                chat,
                json!({"type": "chat/turnComplete",
                "turnId": active_id(core, chat), "duration": clock::millis_since(&started)}),
            );
        });
        let mut core = self.shared.lock();
        if core.epoch == self.epoch {
            consume_queue(&self.shared, &mut core, &self.chat);
        }
    }

    /// Runs one tool call through confirmation; false if the turn ended.
    async fn tool_call(&self) -> bool {
        let id = format!("{}-tool", self.turn_id);
        let started = self.step(|core, chat| {
            let turn = active_id(core, chat);
            emit_json(
                core,
                chat,
                json!({"type": "chat/toolCallStart", "turnId": turn,
                "toolCallId": id, "toolName": "sim_shell", "displayName": "Run command"}),
            );
            emit_json(
                core,
                chat,
                json!({"type": "chat/toolCallReady", "turnId": turn,
                "toolCallId": id, "invocationMessage": "Run `make test` in the workspace",
                "confirmationTitle": "Run in terminal"}),
            );
        });
        if !started {
            return false;
        }
        loop {
            let woken = self.notify.notified();
            match self.tool_phase(&id) {
                None => return false,
                Some(ToolPhase::Done) => return true,
                Some(ToolPhase::Running) => {
                    return self.step(|core, chat| {
                        emit_json(
                            core,
                            chat,
                            json!({"type": "chat/toolCallComplete",
                            "turnId": active_id(core, chat), "toolCallId": id,
                            "result": {"success": true, "pastTenseMessage": "Ran `make test`"}}),
                        );
                    });
                }
                Some(ToolPhase::Pending) => woken.await,
            }
        }
    }

    /// Runs tool `sim_shell` without confirmation and completes it with
    /// `bytes` of output: inline text up to `inline_output_max`, else a
    /// content reference (`ahp-content:/…`) readable with `resourceRead`.
    /// False if the turn ended.
    async fn output_tool_call(&self, bytes: usize) -> bool {
        let id = format!("{}-output", self.turn_id);
        let output = delta_text(0, bytes);
        let inline_max = self.shared.cfg.inline_output_max;
        let keep = self.shared.cfg.content_refs_kept;
        self.step(|core, chat| {
            let turn = active_id(core, chat);
            let content = if bytes > inline_max {
                let uri = core.files.put_content(keep, output);
                json!({"type": "resource", "uri": uri, "sizeHint": bytes, "contentType": "text/plain"})
            } else {
                json!({"type": "text", "text": output})
            };
            for action in [
                json!({"type": "chat/toolCallStart", "turnId": turn, "toolCallId": id,
                    "toolName": "sim_shell", "displayName": "Run command"}),
                json!({"type": "chat/toolCallReady", "turnId": turn, "toolCallId": id,
                    "invocationMessage": "Print the build log", "confirmed": "not-needed"}),
                json!({"type": "chat/toolCallComplete", "turnId": turn, "toolCallId": id,
                    "result": {"success": true, "pastTenseMessage": "Printed the build log",
                               "content": [content]}}),
            ] {
                emit_json(core, chat, action);
            }
        })
    }

    /// The text of the turn's message (markers such as `[client-tool:<name>]`
    /// and `[stream:<n>]` are read from it).
    fn message_text(&self) -> Option<String> {
        let core = self.shared.lock();
        let turn = self.live_chat(&core)?.active_turn.as_ref()?;
        Some(turn.message.text.clone())
    }

    /// Streams the plan's deltas at the script's pace; false if the turn ended.
    async fn deltas(
        &self,
        plan: &TurnPlan,
        interval: Option<std::time::Duration>,
        part_id: &str,
    ) -> bool {
        for (i, len) in plan.deltas.iter().enumerate() {
            match interval {
                Some(d) => tokio::time::sleep(d).await,
                None => tokio::task::yield_now().await,
            }
            let delta = json!({"type": "chat/delta", "turnId": self.turn_id,
                "partId": part_id, "content": delta_text(i, *len)});
            if !self.step(|core, chat| emit_json(core, chat, delta)) {
                return false;
            }
        }
        true
    }

    /// The streaming load mode ([`stream`]); false if the turn ended.
    async fn load_stream(&self, part_id: &str, total: u64) -> bool {
        let cfg = &self.shared.cfg;
        let tpl = stream::Template::new(&self.chat, &self.turn_id, part_id, cfg.stream_frame_bytes)
            .with_jitter(cfg.stream_frame_jitter);
        let pace = stream::Pace {
            total,
            rate: cfg.stream_rate,
            batch: cfg.stream_batch,
            in_flight: cfg.stream_in_flight,
        };
        stream::run(&self.shared, &self.chat, &tpl, pace, |core| {
            self.live_chat(core).is_some()
        })
        .await
    }

    /// Calls client tool `tool`: `chat/toolCallStart` with the offering
    /// active client as contributor, `chat/toolCallReady` auto-confirmed
    /// (`running`), then waits until the call is completed (by its
    /// contributor, or failed by the host when the contributor went away).
    /// No active client offers `tool`: no call, the turn goes on. False if
    /// the turn ended meanwhile.
    async fn client_tool_call(&self, tool: &str) -> bool {
        let id = format!("{}-client-tool", self.turn_id);
        let mut called = false;
        let started = self.step(|core, chat| {
            let Some((client, display)) = client_tools::contributor_for(core, chat, tool) else {
                return;
            };
            let turn = active_id(core, chat);
            emit_json(
                core,
                chat,
                json!({"type": "chat/toolCallStart", "turnId": turn, "toolCallId": id,
                "toolName": tool, "displayName": display,
                "contributor": {"kind": "client", "clientId": client}}),
            );
            emit_json(
                core,
                chat,
                json!({"type": "chat/toolCallReady", "turnId": turn, "toolCallId": id,
                "invocationMessage": format!("Run `{tool}` on the client"),
                "confirmed": "not-needed"}),
            );
            client_tools::watch_contributor(&self.shared, core, &client);
            called = true;
        });
        if !started {
            return false;
        }
        if !called {
            return true;
        }
        loop {
            let woken = self.notify.notified();
            match self.tool_status(&id).as_deref() {
                None => return false,
                Some("completed" | "cancelled") => return true,
                Some(_) => woken.await,
            }
        }
    }

    /// The `status` of tool call `tool_call_id` in the live active turn.
    fn tool_status(&self, tool_call_id: &str) -> Option<String> {
        let core = self.shared.lock();
        let chat = self.live_chat(&core)?;
        let turn = chat.active_turn.as_ref()?;
        turn.response_parts.iter().find_map(|p| match p {
            ResponsePart::ToolCall(tc) => serde_json::to_value(&tc.tool_call)
                .ok()
                .filter(|v| v.get("toolCallId").and_then(|x| x.as_str()) == Some(tool_call_id))
                .and_then(|v| v.get("status").and_then(|s| s.as_str()).map(str::to_string)),
            _ => None,
        })
    }

    fn tool_phase(&self, tool_call_id: &str) -> Option<ToolPhase> {
        let status = self.tool_status(tool_call_id)?;
        Some(match status.as_str() {
            "pending-confirmation" | "streaming" => ToolPhase::Pending,
            "running" => ToolPhase::Running,
            _ => ToolPhase::Done,
        })
    }

    /// The chat, if the host has not restarted and the turn is still active.
    fn live_chat<'a>(&self, core: &'a HostCore) -> Option<&'a ChatState> {
        if core.epoch != self.epoch {
            return None;
        }
        let chat = &core.state.chats.get(&self.chat)?.state;
        (chat.active_turn.as_ref()?.id == self.turn_id).then_some(chat)
    }

    /// Runs `f` under the lock if the turn is still live; false otherwise.
    fn step(&self, f: impl FnOnce(&mut HostCore, &str)) -> bool {
        let mut core = self.shared.lock();
        if self.live_chat(&core).is_none() {
            return false;
        }
        f(&mut core, &self.chat);
        true
    }
}

fn emit_json(core: &mut HostCore, chat: &str, action: serde_json::Value) {
    if let Some(a) = typed_action(action) {
        core.emit(chat, a);
    }
}

fn active_id(core: &HostCore, chat: &str) -> String {
    core.state
        .chats
        .get(chat)
        .and_then(|c| c.state.active_turn.as_ref())
        .map(|t| t.id.clone())
        .unwrap_or_default()
}

fn active_started_at(core: &HostCore, chat: &str) -> String {
    core.state
        .chats
        .get(chat)
        .and_then(|c| c.state.active_turn.as_ref())
        .map(|t| t.started_at.clone())
        .unwrap_or_default()
}

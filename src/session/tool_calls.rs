//! Client tool calls a session owns (contract §5.7).
//!
//! A host gives a client-contributed tool call to the client named in its
//! `contributor.clientId` and, when that client goes away, fails it after a
//! grace of its own. Through the relay the contributor is the session's
//! upstream id, so the session notes the tool calls it owns from the host →
//! client envelopes of its links (host form, before translation):
//!
//! - **starts**: `chat/toolCallStart` or `chat/toolCallReady` whose
//!   `contributor` is `{kind: "client", clientId: <own upstream id>}`;
//! - **ends**: `chat/toolCallComplete` of that call, `chat/toolCallConfirmed`
//!   with `approved: false`, the end of its turn (`chat/turnComplete`,
//!   `chat/turnCancelled`, `chat/error`) or `chat/truncated` on its chat;
//!   envelopes carrying `rejectionReason` change nothing;
//! - **snapshots** of a chat (subscribe, `initialSubscriptions`,
//!   re-baselining) replace what is known of that chat by the tool calls its
//!   active turn shows owned and not yet completed or cancelled (statuses
//!   `streaming`, `pending-confirmation`, `running`, `auth-required`).
//!
//! Calls on chats the client does not follow are not seen (the host sends
//! nothing about them on the link), so they do not shorten the grace.
//!
//! Only envelopes whose action type is one of those are looked at
//! ([`concerns`]), and the end types only while the session owns a call on
//! that channel, so the classify+splice hot path stays as it is. A call
//! counts while its channel is still followed on a current link; anything
//! else is pruned when asked ([`OwnedToolCalls::any_followed`]).
//!
//! When the client's socket goes away while the session owns such a call,
//! its links close at once instead of after `detach_grace_secs`, so hosts
//! fail the calls promptly (after their own grace) rather than waiting for a
//! client that cannot answer; a call that starts while the session is
//! detached closes them the same way. A client that returns within the
//! host's grace keeps its calls: its `reconnect` re-baselines with the same
//! upstream id.

use std::sync::{Arc, Mutex, MutexGuard};

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::Value;

/// Action types whose envelopes can start or end an owned client tool call.
pub fn concerns(action_type: &str) -> bool {
    matches!(
        action_type,
        "chat/toolCallStart"
            | "chat/toolCallReady"
            | "chat/toolCallComplete"
            | "chat/toolCallConfirmed"
            | "chat/turnComplete"
            | "chat/turnCancelled"
            | "chat/error"
            | "chat/truncated"
    )
}

/// One owned tool call, in host form.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Owned {
    host: Arc<str>,
    channel: String,
    turn_id: String,
    tool_call_id: String,
}

/// The client tool calls a session owns. Its lock is a leaf: taken under
/// the session lock, never the other way round.
#[derive(Debug, Default)]
pub struct OwnedToolCalls {
    calls: Mutex<Vec<Owned>>,
}

/// The fields of an envelope the bookkeeping reads.
#[derive(Deserialize)]
struct Envelope {
    params: EnvelopeParams,
}

#[derive(Deserialize)]
struct EnvelopeParams {
    action: ActionFields,
    #[serde(rename = "rejectionReason")]
    rejection: Option<IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ActionFields {
    turn_id: Option<String>,
    tool_call_id: Option<String>,
    approved: Option<bool>,
    contributor: Option<Contributor>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Contributor {
    kind: Option<String>,
    client_id: Option<String>,
}

impl Contributor {
    fn is_client(&self, upstream_id: &str) -> bool {
        self.kind.as_deref() == Some("client") && self.client_id.as_deref() == Some(upstream_id)
    }
}

impl OwnedToolCalls {
    fn lock(&self) -> MutexGuard<'_, Vec<Owned>> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes what host envelope `text` (on host channel `channel` of `host`,
    /// action type `action_type`, for which [`concerns`] holds) does to the
    /// session's calls. Returns true when it starts a call.
    pub fn on_envelope(
        &self,
        host: &Arc<str>,
        channel: &str,
        action_type: &str,
        text: &str,
        upstream_id: &str,
    ) -> bool {
        let starts = matches!(action_type, "chat/toolCallStart" | "chat/toolCallReady");
        let mut calls = self.lock();
        let relevant = if starts {
            // Cheap pre-filter: a call of ours names our upstream id.
            text.contains(upstream_id)
        } else {
            calls
                .iter()
                .any(|c| c.host == *host && c.channel == channel)
        };
        if !relevant {
            return false;
        }
        let Ok(env) = serde_json::from_str::<Envelope>(text) else {
            return false;
        };
        if env.params.rejection.is_some() {
            return false;
        }
        let a = env.params.action;
        let here = |c: &Owned| c.host == *host && c.channel == channel;
        let this_turn = |c: &Owned| a.turn_id.as_deref() == Some(c.turn_id.as_str());
        let this_call =
            |c: &Owned| this_turn(c) && a.tool_call_id.as_deref() == Some(c.tool_call_id.as_str());
        match action_type {
            "chat/toolCallStart" | "chat/toolCallReady" => {
                let ours = a
                    .contributor
                    .as_ref()
                    .is_some_and(|c| c.is_client(upstream_id));
                let (Some(turn_id), Some(tool_call_id), true) =
                    (a.turn_id.clone(), a.tool_call_id.clone(), ours)
                else {
                    return false;
                };
                let call = Owned {
                    host: host.clone(),
                    channel: channel.to_string(),
                    turn_id,
                    tool_call_id,
                };
                if calls.contains(&call) {
                    return false;
                }
                calls.push(call);
                true
            }
            "chat/toolCallComplete" => {
                calls.retain(|c| !(here(c) && this_call(c)));
                false
            }
            "chat/toolCallConfirmed" => {
                if a.approved == Some(false) {
                    calls.retain(|c| !(here(c) && this_call(c)));
                }
                false
            }
            "chat/truncated" => {
                calls.retain(|c| !here(c));
                false
            }
            _ => {
                // chat/turnComplete, chat/turnCancelled, chat/error
                calls.retain(|c| !(here(c) && this_turn(c)));
                false
            }
        }
    }

    /// A snapshot of host channel `channel` (its `state`, host form) was
    /// adopted: what is known of that channel becomes the calls owned by
    /// `upstream_id` that its active turn shows in flight.
    pub fn on_snapshot(&self, host: &Arc<str>, channel: &str, state: &Value, upstream_id: &str) {
        if !channel.starts_with("ahp-chat:") {
            return;
        }
        let mut calls = self.lock();
        calls.retain(|c| !(c.host == *host && c.channel == channel));
        let Some(turn) = state.get("activeTurn") else {
            return;
        };
        let Some(turn_id) = turn.get("id").and_then(Value::as_str) else {
            return;
        };
        let parts = turn.get("responseParts").and_then(Value::as_array);
        for tc in parts
            .into_iter()
            .flatten()
            .filter(|p| p.get("kind").and_then(Value::as_str) == Some("toolCall"))
            .filter_map(|p| p.get("toolCall"))
        {
            let field = |path: &str| tc.pointer(path).and_then(Value::as_str);
            let ours = field("/contributor/kind") == Some("client")
                && field("/contributor/clientId") == Some(upstream_id);
            let in_flight = matches!(
                field("/status"),
                Some("streaming" | "pending-confirmation" | "running" | "auth-required")
            );
            if let (true, true, Some(id)) = (ours, in_flight, field("/toolCallId")) {
                calls.push(Owned {
                    host: host.clone(),
                    channel: channel.to_string(),
                    turn_id: turn_id.to_string(),
                    tool_call_id: id.to_string(),
                });
            }
        }
    }

    /// Whether a call is owned on a channel that `followed(host, channel)`
    /// still says the session follows; calls on other channels are
    /// forgotten (their link closed, or the client left the channel).
    pub fn any_followed(&self, followed: impl Fn(&str, &str) -> bool) -> bool {
        let mut calls = self.lock();
        calls.retain(|c| followed(&c.host, &c.channel));
        !calls.is_empty()
    }

    /// Forgets every call (the session's links closed).
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// Number of calls currently noted (for tests and logs).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no call is noted.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const ME: &str = "r1.aaaaaaaaaaa.bbbbbbbbbbbbbbbb";
    const CHAT: &str = "ahp-chat:/s-1-main";

    fn env(action: Value, rejected: bool) -> String {
        let mut params = json!({"channel": CHAT, "serverSeq": 7, "action": action});
        if rejected {
            params["rejectionReason"] = json!("no");
        }
        json!({"jsonrpc": "2.0", "method": "action", "params": params}).to_string()
    }

    fn feed(calls: &OwnedToolCalls, host: &Arc<str>, action: Value, rejected: bool) -> bool {
        let ty = action["type"].as_str().unwrap_or_default().to_string();
        assert!(concerns(&ty), "{ty}");
        calls.on_envelope(host, CHAT, &ty, &env(action, rejected), ME)
    }

    fn start(client: &str, call: &str) -> Value {
        json!({"type": "chat/toolCallStart", "turnId": "t1", "toolCallId": call,
            "toolName": "x", "displayName": "X",
            "contributor": {"kind": "client", "clientId": client}})
    }

    #[test]
    fn own_start_is_noted_and_its_completion_ends_it() {
        let calls = OwnedToolCalls::default();
        let host: Arc<str> = "a".into();
        assert!(!feed(&calls, &host, start("r1.other.client", "c0"), false));
        assert!(calls.is_empty(), "another client's call is not ours");
        assert!(!feed(&calls, &host, start(ME, "c1"), true));
        assert!(calls.is_empty(), "a rejected echo changes nothing");
        assert!(feed(&calls, &host, start(ME, "c1"), false));
        assert!(!feed(&calls, &host, start(ME, "c1"), false), "noted once");
        assert_eq!(calls.len(), 1);
        let complete = json!({"type": "chat/toolCallComplete", "turnId": "t1",
            "toolCallId": "c1", "result": {"success": true, "pastTenseMessage": "ok"}});
        feed(&calls, &host, complete.clone(), true);
        assert_eq!(calls.len(), 1, "a rejected completion ends nothing");
        feed(&calls, &host, complete, false);
        assert!(calls.is_empty());
    }

    #[test]
    fn turn_end_denial_and_truncation_end_calls() {
        let calls = OwnedToolCalls::default();
        let host: Arc<str> = "a".into();
        feed(&calls, &host, start(ME, "c1"), false);
        feed(&calls, &host, start(ME, "c2"), false);
        feed(
            &calls,
            &host,
            json!({"type": "chat/toolCallConfirmed", "turnId": "t1", "toolCallId": "c1",
                "approved": false}),
            false,
        );
        assert_eq!(calls.len(), 1);
        feed(
            &calls,
            &host,
            json!({"type": "chat/turnComplete", "turnId": "other", "duration": 1}),
            false,
        );
        assert_eq!(calls.len(), 1, "another turn's end");
        feed(
            &calls,
            &host,
            json!({"type": "chat/turnCancelled", "turnId": "t1", "duration": 1}),
            false,
        );
        assert!(calls.is_empty());
        feed(&calls, &host, start(ME, "c3"), false);
        feed(&calls, &host, json!({"type": "chat/truncated"}), false);
        assert!(calls.is_empty());
    }

    #[test]
    fn snapshot_replaces_what_is_known_of_its_chat() {
        let calls = OwnedToolCalls::default();
        let host: Arc<str> = "a".into();
        feed(&calls, &host, start(ME, "gone"), false);
        let tc = |id: &str, client: &str, status: &str| {
            json!({"kind": "toolCall", "toolCall": {"toolCallId": id, "status": status,
                "contributor": {"kind": "client", "clientId": client}}})
        };
        let state = json!({"activeTurn": {"id": "t9", "responseParts": [
            tc("run", ME, "running"), tc("done", ME, "completed"),
            tc("theirs", "r1.x.y", "running"), {"kind": "markdown", "id": "p", "content": ""}
        ]}});
        calls.on_snapshot(&host, CHAT, &state, ME);
        assert_eq!(calls.len(), 1);
        assert!(calls.any_followed(|h, c| h == "a" && c == CHAT));
        assert!(!calls.any_followed(|_, _| false), "not followed: pruned");
        assert!(calls.is_empty());
        calls.on_snapshot(&host, CHAT, &state, ME);
        calls.on_snapshot(&host, CHAT, &json!({"turns": []}), ME);
        assert!(calls.is_empty(), "an idle chat owns nothing");
    }
}

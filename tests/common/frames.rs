//! JSON-RPC frames and AHP actions written by hand: raw sockets send these
//! as they are, and SDK calls take the typed form of the same actions.

use ahp_relay::simhost::AgentScript;
use ahp_relay::simhost::clock::now_iso;
use ahp_types::actions::StateAction;
use serde_json::{Value, json};

/// The root channel, the `channel` of session-independent requests.
pub const ROOT: &str = "ahp-root://";

/// 2^53 − 1, the largest number every AHP client represents exactly.
pub const MAX_SAFE: u64 = (1 << 53) - 1;

/// A JSON-RPC request frame with id `id`.
pub fn request_frame(id: impl Into<Value>, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id.into(), "method": method, "params": params})
}

/// A JSON-RPC success response to request `id`.
pub fn response_frame(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// A JSON-RPC notification frame (no id, no answer).
pub fn notification_frame(method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "method": method, "params": params})
}

/// A `dispatchAction` notification carrying `action` on `channel` as the
/// client's `client_seq`.
pub fn dispatch_frame(channel: &str, client_seq: i64, action: Value) -> Value {
    notification_frame(
        "dispatchAction",
        json!({"channel": channel, "clientSeq": client_seq, "action": action}),
    )
}

/// A `ping` request on the root channel with id `id`.
pub fn ping_frame(id: u64) -> Value {
    request_frame(id, "ping", json!({"channel": ROOT}))
}

/// `initialize` params for `client_id`, offering protocol 1.0.0.
pub fn initialize_params(client_id: &str) -> Value {
    json!({"channel": ROOT, "protocolVersions": ["1.0.0"], "clientId": client_id})
}

/// `initialize` params for `client_id`, offering protocol 1.0.0, with
/// `initialSubscriptions`.
pub fn initialize_subscribing(client_id: &str, subscriptions: &[&str]) -> Value {
    let mut params = initialize_params(client_id);
    params["initialSubscriptions"] = json!(subscriptions);
    params
}

/// `reconnect` params for `client_id` from `last_seen` (a number, or any
/// value a test wants the relay to judge) with `subscriptions`.
pub fn reconnect_params(
    client_id: &str,
    last_seen: impl Into<Value>,
    subscriptions: &[&str],
) -> Value {
    json!({"channel": ROOT, "clientId": client_id, "lastSeenServerSeq": last_seen.into(),
        "subscriptions": subscriptions})
}

/// A `chat/turnStarted` action for turn `turn_id` with the user's `text`.
pub fn turn_started(turn_id: &str, text: &str) -> Value {
    json!({"type": "chat/turnStarted", "turnId": turn_id, "startedAt": now_iso(),
        "message": {"text": text, "origin": {"kind": "user"}}})
}

/// A `dispatchAction` frame starting turn `turn_id` (user text "go") on
/// `chat` as the client's `client_seq`.
pub fn start_turn_frame(chat: &str, client_seq: i64, turn_id: &str) -> Value {
    dispatch_frame(chat, client_seq, turn_started(turn_id, "go"))
}

/// The typed form of an action literal; panics unless it is a known action
/// (so a typo in a test's literal cannot pass as an `Unknown` action).
pub fn action(v: Value) -> StateAction {
    let a: StateAction = serde_json::from_value(v.clone()).expect("action literal parses");
    assert!(
        !matches!(a, StateAction::Unknown(_)),
        "not a known action: {v}"
    );
    a
}

/// An agent streaming `reply_deltas` deltas of `delta_bytes` bytes at
/// `delta_rate` per second (0: no pacing), without tool confirmation.
pub fn script(reply_deltas: u32, delta_bytes: usize, delta_rate: u32) -> AgentScript {
    AgentScript {
        reply_deltas,
        delta_bytes,
        delta_rate,
        tool_confirmation: false,
        seed: None,
    }
}

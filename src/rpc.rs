//! JSON-RPC error objects and frames shared by the relay and the simulated
//! host: responses, errors and notifications.

use ahp_types::errors::{ahp_error_codes as ahp, json_rpc_error_codes as rpc};
use serde_json::{Value, json};

/// An error answer to a request.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    /// JSON-RPC / AHP error code.
    pub code: i32,
    /// Human-readable message.
    pub message: String,
    /// Optional structured detail.
    pub data: Option<Value>,
}

impl RpcError {
    fn new(code: i32, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            data: None,
        }
    }
    /// -32700: the frame is not JSON.
    pub fn parse(detail: impl std::fmt::Display) -> Self {
        Self::new(rpc::PARSE_ERROR, format!("parse error: {detail}"))
    }
    /// -32600: not a valid request (or not valid in this connection state).
    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(rpc::INVALID_REQUEST, message)
    }
    /// -32601: the method does not exist.
    pub fn method_not_found(method: &str) -> Self {
        Self::new(rpc::METHOD_NOT_FOUND, format!("method not found: {method}"))
    }
    /// -32602: the params are wrong.
    pub fn invalid_params(message: impl Into<String>) -> Self {
        Self::new(rpc::INVALID_PARAMS, message)
    }
    /// -32001: no such session.
    pub fn session_not_found(uri: &str) -> Self {
        Self::new(ahp::SESSION_NOT_FOUND, format!("session not found: {uri}"))
    }
    /// -32002: no such agent provider.
    pub fn provider_not_found(provider: &str) -> Self {
        Self::new(
            ahp::PROVIDER_NOT_FOUND,
            format!("provider not found: {provider}"),
        )
    }
    /// -32003: the session URI is taken.
    pub fn session_exists(uri: &str) -> Self {
        Self::new(
            ahp::SESSION_ALREADY_EXISTS,
            format!("session already exists: {uri}"),
        )
    }
    /// -32005 with the versions this host speaks.
    pub fn unsupported_version(supported: &[&str]) -> Self {
        Self {
            data: Some(json!({ "supportedVersions": supported })),
            ..Self::new(
                ahp::UNSUPPORTED_PROTOCOL_VERSION,
                "no offered protocol version is supported",
            )
        }
    }
    /// -32008: no such channel, resource or client.
    pub fn not_found(what: impl Into<String>) -> Self {
        Self::new(ahp::NOT_FOUND, what)
    }
    /// The relay's answer for a channel that does not exist *or* that the
    /// principal cannot see (contract §4.4): -32001 for `ahp-session:` URIs,
    /// -32008 otherwise, with a message that does not repeat the URI and no
    /// `data`, so the two cases are byte-identical.
    pub fn nonexistent(uri: &str) -> Self {
        if uri.starts_with("ahp-session:") {
            Self::new(ahp::SESSION_NOT_FOUND, "session not found")
        } else {
            Self::new(ahp::NOT_FOUND, "not found")
        }
    }
    /// -32603: the relay or host failed; `data` says why and whether to retry.
    pub fn internal(message: impl Into<String>, data: Option<Value>) -> Self {
        Self {
            data,
            ..Self::new(rpc::INTERNAL_ERROR, message)
        }
    }
    /// -32603 for a host that cannot be reached (contract §4.4).
    pub fn host_unavailable(host: &str) -> Self {
        Self::internal(
            format!("host {host} is unavailable"),
            Some(json!({"reason": "hostUnavailable", "host": host, "retryable": true})),
        )
    }
    /// -32603 for a request whose link dropped before the answer (§5.8).
    pub fn upstream_lost(host: &str) -> Self {
        Self::internal(
            format!("connection to host {host} was lost"),
            Some(json!({"reason": "upstreamLost", "host": host, "retryable": true})),
        )
    }
    /// -32603 for a request stopped by a relay limit (§3.6); `data.reason`
    /// names the limit (`rateLimited`, `pendingLimit`, `subscriptionLimit`,
    /// `timeout`, `quota`, `hostBusy`).
    pub fn limited(reason: &str, message: impl Into<String>, retryable: bool) -> Self {
        Self::internal(
            message,
            Some(json!({"reason": reason, "retryable": retryable})),
        )
    }
    /// Any code and message (e.g. relaying a host's error).
    pub fn with_code(code: i32, message: impl Into<String>, data: Option<Value>) -> Self {
        Self {
            data,
            ..Self::new(code, message)
        }
    }
    /// The full error response frame for the request whose id is the exact
    /// JSON text `id` (echoed byte for byte).
    pub fn frame(&self, id: &str) -> String {
        let mut error = json!({ "code": self.code, "message": self.message });
        if let (Some(data), Some(obj)) = (&self.data, error.as_object_mut()) {
            obj.insert("data".into(), data.clone());
        }
        format!(r#"{{"jsonrpc":"2.0","id":{id},"error":{error}}}"#)
    }
    /// -32009: visible but not permitted.
    pub fn permission_denied(what: &str) -> Self {
        Self::new(ahp::PERMISSION_DENIED, format!("permission denied: {what}"))
    }
    /// -32010: the target already exists.
    pub fn already_exists(uri: &str) -> Self {
        Self::new(ahp::ALREADY_EXISTS, format!("already exists: {uri}"))
    }
}

/// A success response carrying `result` (already serialized JSON).
pub fn result_frame(id: &Value, result: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#)
}

/// An error response; `id` is `null` when the request's id could not be read.
pub fn error_frame(id: &Value, err: &RpcError) -> String {
    let mut error = json!({ "code": err.code, "message": err.message });
    if let (Some(data), Some(obj)) = (&err.data, error.as_object_mut()) {
        obj.insert("data".into(), data.clone());
    }
    json!({ "jsonrpc": "2.0", "id": id, "error": error }).to_string()
}

/// A notification frame.
pub fn notification_frame(method: &str, params: &Value) -> String {
    json!({ "jsonrpc": "2.0", "method": method, "params": params }).to_string()
}

/// A success response for the request whose id is the exact JSON text `id`
/// (echoed byte for byte), carrying `result` (already serialized JSON).
pub fn result_frame_raw(id: &str, result: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#)
}

/// A request frame with a relay-originated (non-negative integer) id.
pub fn request_frame(id: u64, method: &str, params: &Value) -> String {
    json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }).to_string()
}

/// An `action` envelope carrying `params` (channel, action, serverSeq, …).
pub fn action_frame(params: &Value) -> String {
    notification_frame("action", params)
}

/// Every close code the relay sends (contract §3.7), each with its one
/// reason text, so a code never travels with a drifting explanation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Close {
    /// 1000: no client frame (not even `ping`) for `limits.client_idle_secs`.
    Idle,
    /// 1002: the client offered no protocol version the relay speaks.
    UnsupportedVersion,
    /// 1002: a WebSocket protocol violation.
    WsProtocol,
    /// 1003: binary frames are not part of AHP.
    BinaryFrame,
    /// 1007: a text frame that is not UTF-8.
    InvalidUtf8,
    /// 1009: a frame over `limits.max_frame_bytes`.
    FrameTooBig,
    /// 1012: the relay is shutting down or restarting.
    Restarting,
    /// 4000: continuity with a host was lost.
    ResyncHostLost,
    /// 4000: a host whose channels a `reconnect` omitted is back.
    ResyncHostBack,
    /// 4000: the access policy changed what the client may see.
    ResyncPolicy,
    /// 4000: a host the client used left the configuration.
    ResyncHostRemoved,
    /// 4000: a subscribed channel changed hands (a terminal claim, a chat
    /// moved to another session) and the client may no longer see it.
    ResyncAccess,
    /// 4001: the token expired.
    TokenExpired,
    /// 4003: the token was revoked.
    TokenRevoked,
    /// 4008: the client reads too slowly.
    SlowConsumer,
    /// 4009: another socket of the same client took over.
    Superseded,
    /// 4029: the relay is overloaded.
    Overloaded,
}

impl Close {
    /// The WebSocket close code.
    pub fn code(self) -> u16 {
        match self {
            Close::Idle => 1000,
            Close::UnsupportedVersion | Close::WsProtocol => 1002,
            Close::BinaryFrame => 1003,
            Close::InvalidUtf8 => 1007,
            Close::FrameTooBig => 1009,
            Close::Restarting => 1012,
            Close::ResyncHostLost
            | Close::ResyncHostBack
            | Close::ResyncPolicy
            | Close::ResyncHostRemoved
            | Close::ResyncAccess => 4000,
            Close::TokenExpired => 4001,
            Close::TokenRevoked => 4003,
            Close::SlowConsumer => 4008,
            Close::Superseded => 4009,
            Close::Overloaded => 4029,
        }
    }

    /// The close reason: what happened and what the client should do.
    pub fn reason(self) -> &'static str {
        match self {
            Close::Idle => "idle: no frame within the idle timeout; ping to stay connected",
            Close::UnsupportedVersion => "unsupported protocol version",
            Close::WsProtocol => "protocol error",
            Close::BinaryFrame => "binary frames are not supported",
            Close::InvalidUtf8 => "invalid UTF-8",
            Close::FrameTooBig => "frame too big",
            Close::Restarting => "relay restarting: reconnect after backoff",
            Close::ResyncHostLost => "resync: lost continuity with a host; reconnect now",
            Close::ResyncHostBack => "resync: a host is back; reconnect now",
            Close::ResyncPolicy => "resync: access policy changed; reconnect now",
            Close::ResyncHostRemoved => "resync: a host was removed; reconnect now",
            Close::ResyncAccess => "resync: a subscribed channel changed hands; reconnect now",
            Close::TokenExpired => "token expired: reconnect with a new token",
            Close::TokenRevoked => "token revoked: do not retry with it",
            Close::SlowConsumer => "slow consumer: reconnect after backoff",
            Close::Superseded => "superseded by another socket of the same client",
            Close::Overloaded => "relay overloaded: retry after backoff",
        }
    }
}

#[cfg(test)]
mod close_tests {
    use super::Close;

    #[test]
    fn every_reason_fits_a_close_frame_and_codes_are_in_range() {
        for c in [
            Close::Idle,
            Close::UnsupportedVersion,
            Close::WsProtocol,
            Close::BinaryFrame,
            Close::InvalidUtf8,
            Close::FrameTooBig,
            Close::Restarting,
            Close::ResyncHostLost,
            Close::ResyncHostBack,
            Close::ResyncPolicy,
            Close::ResyncHostRemoved,
            Close::ResyncAccess,
            Close::TokenExpired,
            Close::TokenRevoked,
            Close::SlowConsumer,
            Close::Superseded,
            Close::Overloaded,
        ] {
            // RFC 6455: a close reason is at most 123 bytes.
            assert!(c.reason().len() <= 123, "{c:?}");
            assert!((1000..5000).contains(&c.code()), "{c:?}");
        }
    }
}

//! Client → relay: the life of every client frame (contract §4.1), one
//! pipeline for every method. A frame is classified by the wire layer and
//! its params read once through the method's row of the table; then the
//! relay answers it (`initialize`, `reconnect`, `ping`, the root),
//! aggregates it (`listSessions`, `authenticate`), or asks the router for
//! its [`Plan`](crate::route::plan::Plan) — the one access decision: target
//! host, every name translated and authorized, the permission and the
//! dispose rule — and executes it ([`execute`]: hold, reserve, forward,
//! answer). Methods the relay does not know are refused with -32601;
//! nothing is forwarded verbatim, and no handler here decides access.

mod conn;
mod execute;
mod initialize;
mod notify;

use std::sync::Arc;

use ahp_types::errors::ahp_error_codes;
use serde_json::{Value, json};
use tracing::Instrument as _;

use crate::route::methods::{self, Handling};
use crate::route::{catalog, plan};
use crate::rpc::{Close, RpcError};
use crate::session::{ClientSession, ReplyTo};
use crate::wire::{self, FrameKind};
pub use conn::Conn;
pub use initialize::SUPPORTED_VERSIONS;
use notify::{dispatch, unsubscribe};

/// Handles one text frame from the client.
pub async fn on_client_frame(conn: &mut Conn, text: &str) {
    let env = conn.registry.env.clone();
    let frame = match wire::classify(text, &env.client_limits) {
        Ok(f) => f,
        Err(e) => {
            env.metrics
                .bad_client_frames
                .with_label_values(&[e.label()])
                .inc();
            if let wire::Refusal::Answer { id } = wire::refusal(text, &e) {
                let err = RpcError::with_code(e.json_rpc_code(), e.to_string(), None);
                conn.send(err.frame(id.as_ref().map_or("null", |i| i.raw)));
            }
            return;
        }
    };
    // Every frame counts against the rate (§7.6), responses too: a flood
    // of them slows only their sender's own requests. A response is still
    // never dropped for the rate when it answers a host's request (that
    // would fail the host's request); one that answers nothing is dropped
    // below before it is parsed.
    let answer = matches!(
        frame.kind,
        FrameKind::Response { .. } | FrameKind::ErrorResponse { .. }
    );
    if !conn.bucket.take() && !answer {
        return over_rate(conn, text, &frame.kind);
    }
    match &frame.kind {
        FrameKind::Request { id, method } => {
            env.metrics
                .client_requests
                .with_label_values(&[methods::label(method)])
                .inc();
            let id = id.raw.to_string();
            let params = match params_with_channel(method, frame.channel().is_some(), text) {
                Ok(p) => p,
                Err(err) => {
                    env.metrics
                        .bad_client_frames
                        .with_label_values(&["no_channel"])
                        .inc();
                    return conn.reply(&id, Err(err));
                }
            };
            // Boxed: a request's handling, which may wait for hosts, is the
            // largest state of a connection's task, and the task keeps its
            // largest state's size while the client idles (~3.5 KiB of the
            // ~6 KiB per idle client, BENCHMARKS.md "Thirty-eighth round").
            // Notifications, the frequent frames, allocate nothing here.
            Box::pin(answer_request(conn, &id, method, params)).await;
        }
        FrameKind::Notification { method } => {
            let Some(session) = conn.session.clone() else {
                return;
            };
            match method.as_ref() {
                "dispatchAction" => dispatch(&session, params_of(text)),
                "unsubscribe" => unsubscribe(&session, params_of(text)),
                _ => env.metrics.client_notifications_dropped.inc(),
            }
        }
        FrameKind::Response { id } | FrameKind::ErrorResponse { id, .. } => {
            match (conn.session.clone(), id.as_u64()) {
                // Looked up by id first: only an answer the relay awaits
                // is parsed.
                (Some(session), Some(n)) if session.awaits_client_answer(n) => {
                    let answer = serde_json::from_str::<Value>(text).ok();
                    session.answer_host_request(n, answer.as_ref());
                }
                _ => env.metrics.client_notifications_dropped.inc(),
            }
        }
    }
}

/// Handles one request in its span and answers it now, unless its answer
/// comes later (forwarded).
async fn answer_request(conn: &mut Conn, id: &str, method: &str, params: Value) {
    let span = request_span(conn, method, id);
    if !span.is_disabled() {
        let meta = params
            .get("_meta")
            .and_then(|m| m.get(crate::otel::TRACEPARENT));
        if let Some(parent) = meta.and_then(Value::as_str) {
            crate::otel::continue_trace(&span, parent);
        }
    }
    let result = request(conn, id, method, params, &span)
        .instrument(span.clone())
        .await;
    record_outcome(&span, result.as_ref());
    if let Some(result) = result {
        let close =
            matches!(&result, Err(e) if e.code == ahp_error_codes::UNSUPPORTED_PROTOCOL_VERSION);
        conn.reply(id, result);
        if close {
            conn.kill.send_replace(Some(Close::UnsupportedVersion));
        }
    }
}

/// The span of one client request (exported over OTLP, never logged; see
/// [`crate::otel`]): a trace of its own, named by the method, with the
/// request id, the session's upstream id (the pseudonym every replica
/// derives alike, so a client is followed across replicas), the host the
/// plan chose and the outcome. Disabled — a branch, no allocation — when
/// no exporter is installed.
fn request_span(conn: &Conn, method: &str, id: &str) -> tracing::Span {
    let label = methods::label(method);
    let upstream = conn.session.as_ref().map(|s| s.upstream_id.as_str());
    tracing::info_span!(target: crate::otel::TARGET, parent: None, "request",
        otel.name = label, otel.kind = "server", rpc.system = "jsonrpc",
        rpc.method = label, rpc.jsonrpc.request_id = id, ahp.upstream = upstream,
        ahp.host = tracing::field::Empty, ahp.outcome = tracing::field::Empty,
        ahp.answer = tracing::field::Empty,
        rpc.jsonrpc.error_code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty)
}

/// Records how the relay answered a request it answers here (`ok` or an
/// error code); one answered elsewhere recorded its outcome (`ok`, or
/// `forwarded`, whose span then ends with the host's answer,
/// [`crate::session::Pending::span`]) in [`answered`].
fn record_outcome(span: &tracing::Span, result: Option<&Result<String, RpcError>>) {
    if span.is_disabled() {
        return;
    }
    match result {
        None => return,
        Some(Ok(_)) => span.record("ahp.outcome", "ok"),
        Some(Err(e)) => {
            span.record("rpc.jsonrpc.error_code", e.code);
            span.record("otel.status_code", "ERROR");
            span.record("ahp.outcome", "error")
        }
    };
}

/// A request's params, naming the root when a root-scoped method left out
/// `params.channel` (§4.1: VS Code sends `reconnect` so); any other method
/// without a channel is -32602.
fn params_with_channel(method: &str, has_channel: bool, text: &str) -> Result<Value, RpcError> {
    let mut params = params_of(text);
    if has_channel {
        return Ok(params);
    }
    if !methods::method(method).is_some_and(|m| m.handling.root_scoped()) {
        return Err(RpcError::invalid_params(
            "params.channel (a string) is required",
        ));
    }
    if params.is_null() {
        params = json!({});
    }
    if let Some(o) = params.as_object_mut() {
        o.insert("channel".into(), json!(ahp_types::ROOT_RESOURCE_URI));
    }
    Ok(params)
}

/// A frame over the connection's rate (§3.6): a request gets -32603
/// `reason = "rateLimited"`, a `dispatchAction` a rejection echo, another
/// notification is dropped; each is counted.
fn over_rate(conn: &Conn, text: &str, kind: &FrameKind<'_>) {
    let env = &conn.registry.env;
    env.metrics.limit_hits.with_label_values(&["rate"]).inc();
    match kind {
        FrameKind::Request { id, .. } => {
            let err = RpcError::limited(
                "rateLimited",
                "too many requests on this connection: retry after backoff",
                true,
            );
            conn.send(err.frame(id.raw));
        }
        FrameKind::Notification { method } if method.as_ref() == "dispatchAction" => {
            let params = params_of(text);
            let (Some(session), Some(channel), Some(seq)) = (
                conn.session.as_ref(),
                params.get("channel").and_then(Value::as_str),
                params.get("clientSeq").and_then(Value::as_i64),
            ) else {
                return;
            };
            let action = params.get("action").cloned().unwrap_or(Value::Null);
            let mut core = session.lock();
            session.reject_dispatch(&mut core, channel, &action, seq, "rate limited");
        }
        _ => {}
    }
}

fn params_of(text: &str) -> Value {
    serde_json::from_str::<Value>(text)
        .ok()
        .and_then(|mut v| v.get_mut("params").map(Value::take))
        .unwrap_or(Value::Null)
}

/// Answers or forwards one request; `None` when the answer comes later.
/// The method table decides how: nothing here lists methods, and every
/// forwarded request goes through one plan.
async fn request(
    conn: &mut Conn,
    id: &str,
    method: &str,
    params: Value,
    span: &tracing::Span,
) -> Option<Result<String, RpcError>> {
    let Some(row) = methods::method(method) else {
        return Some(Err(RpcError::method_not_found(method)));
    };
    let params = match (row.params)(params) {
        Ok(p) => p,
        Err(e) => return Some(Err(e)),
    };
    match row.handling {
        Handling::Ping => return Some(Ok("null".into())),
        Handling::Initialize => {
            let answer = initialize::initialize(conn, id, params).await;
            return answered(span, answer, "ok");
        }
        Handling::Reconnect => {
            let answer = super::reconnect::reconnect(conn, id, params).await;
            return answered(span, answer, "ok");
        }
        _ => {}
    }
    let Some(session) = conn.session.clone() else {
        return Some(Err(RpcError::invalid_request(format!(
            "{method} before initialize: send initialize first"
        ))));
    };
    let (outcome, sent) = match row.handling {
        Handling::ListSessions => {
            let now = session.who();
            let list = catalog::list_sessions(&session.env, now.caller(), conn.socket, params);
            return Some(list);
        }
        Handling::Subscribe if names_root(&params) => {
            subscribe_root(&session, id);
            (Ok(()), "ok")
        }
        // Pushed to the hosts in use; answered when they have answered.
        Handling::Authenticate => (
            session.authenticate(&ReplyTo::new(id, conn.socket), &params),
            "forwarded",
        ),
        _ => {
            let rights = session.rights();
            let planned = plan::plan(&session.env, session.who().caller(), row, params);
            let outcome = match planned {
                Ok(plan) => {
                    span.record("ahp.host", &*plan.hub.id);
                    let to = ReplyTo::new(id, conn.socket);
                    execute::execute(&session, &to, (row.name, rights), plan).await
                }
                Err(e) => Err(e),
            };
            (outcome, "forwarded")
        }
    };
    answered(span, outcome, sent)
}

/// A request answered elsewhere (the relay's own handler wrote the answer,
/// or a host will): `sent` is recorded as the span's outcome when it
/// succeeded; an error is returned for the caller to answer and record.
fn answered(
    span: &tracing::Span,
    outcome: Result<(), RpcError>,
    sent: &'static str,
) -> Option<Result<String, RpcError>> {
    match outcome {
        Ok(()) => {
            span.record("ahp.outcome", sent);
            None
        }
        Err(e) => Some(Err(e)),
    }
}

/// Whether a request's `params.channel` is the root.
fn names_root(params: &Value) -> bool {
    params.get("channel").and_then(Value::as_str) == Some(ahp_types::ROOT_RESOURCE_URI)
}

/// `subscribe` of the root: answered by the relay with the merged root.
fn subscribe_root(session: &Arc<ClientSession>, id: &str) {
    let root = ahp_types::ROOT_RESOURCE_URI;
    let mut core = session.lock();
    let state = session.follow_root(&mut core);
    let snap = json!({"snapshot": {"resource": root, "state": state, "fromSeq": core.last()}});
    session.respond(&mut core, id, &snap.to_string());
}

//! One WebSocket connection to the simulated host: reads frames, answers
//! them under the host lock, and writes what the host queued for it.

use std::borrow::Cow;
use std::sync::Arc;

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};

use super::commands;
use super::core::{ConnId, Outbound};
use super::dispatch;
use super::record::FrameRecord;
use super::server::Shared;
use crate::rpc::{self, RpcError};

type Ws = tokio_tungstenite::WebSocketStream<TcpStream>;
type Sink = futures_util::stream::SplitSink<Ws, Message>;

/// Serves one accepted TCP connection until either side closes it.
pub async fn serve(shared: Arc<Shared>, stream: TcpStream, id: ConnId) {
    let Some(ws) = handshake(&shared, stream, id).await else {
        return;
    };
    let (mut sink, mut source) = ws.split();
    let (tx, mut rx) = mpsc::unbounded_channel();
    shared.lock().attach(id, tx);
    let mut stalled = shared.stalled.subscribe();
    let mut held = shared.held.subscribe();
    loop {
        if *stalled.borrow_and_update() || is_held(&shared, &mut held, id) {
            let woken = tokio::select! {
                r = stalled.changed() => r.is_ok(),
                r = held.changed() => r.is_ok(),
            };
            if !woken {
                break;
            }
            continue;
        }
        tokio::select! {
            inbound = source.next() => {
                if !on_inbound(&shared, id, &mut sink, inbound).await {
                    break;
                }
            }
            outbound = rx.recv() => {
                if !write_outbound(&shared, &mut sink, &mut rx, outbound).await {
                    break;
                }
            },
            _ = stalled.changed() => {}
            _ = held.changed() => {}
        }
    }
    let mut core = shared.lock();
    if let Some(client) = core.detach(id) {
        super::client_tools::client_gone(&shared, &mut core, &client);
    }
}

/// Whether connection `id` belongs to a client a test stalled
/// (`SimHost::stall_client`); costs no lock while nobody is.
fn is_held(
    shared: &Shared,
    held: &mut tokio::sync::watch::Receiver<std::collections::HashSet<String>>,
    id: ConnId,
) -> bool {
    let clients = {
        let now = held.borrow_and_update();
        if now.is_empty() {
            return false;
        }
        now.clone()
    };
    shared
        .lock()
        .client_of(id)
        .is_some_and(|c| clients.contains(&c))
}

/// Bytes a connection reads at most per read call. tungstenite 0.29
/// zero-fills this many bytes before every read poll, however little
/// arrives (tungstenite-rs#547): with its 128 KiB default that memset was a
/// quarter of the host's CPU on a paced stream, whose connections are woken
/// once per frame. A host reads little (requests), and larger frames are
/// still read whole, in several calls.
const READ_BUFFER_BYTES: usize = 8 * 1024;

/// Completes the WebSocket handshake with the host's frame limits and
/// records the handshake headers tests audit; `None` if it failed.
async fn handshake(shared: &Arc<Shared>, stream: TcpStream, id: ConnId) -> Option<Ws> {
    let mut config = WebSocketConfig::default();
    config.max_message_size = Some(shared.cfg.max_frame_bytes);
    config.max_frame_size = Some(shared.cfg.max_frame_bytes);
    config.read_buffer_size = READ_BUFFER_BYTES;
    // The handshake callback's error type is tungstenite's, not ours.
    #[allow(clippy::result_large_err)]
    let record =
        |req: &tokio_tungstenite::tungstenite::handshake::server::Request,
         resp: tokio_tungstenite::tungstenite::handshake::server::Response| {
            let header = |name: &str| {
                req.headers()
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string)
            };
            shared.record_handshake(super::server::Handshake {
                conn: id,
                user_issuer: header("ahp-relay-user-issuer"),
                user_subject: header("ahp-relay-user-subject"),
                authorization: header("authorization"),
            });
            Ok(resp)
        };
    match tokio_tungstenite::accept_hdr_async_with_config(stream, record, Some(config)).await {
        Ok(ws) => Some(ws),
        Err(e) => {
            tracing::debug!(error = %e, "simhost handshake failed");
            None
        }
    }
}

/// Handles one read from the socket; false when the connection is over.
async fn on_inbound(
    shared: &Arc<Shared>,
    id: ConnId,
    sink: &mut Sink,
    inbound: Option<Result<Message, tokio_tungstenite::tungstenite::Error>>,
) -> bool {
    match inbound {
        Some(Ok(Message::Text(text))) => on_text(shared, id, text.as_str()),
        Some(Ok(Message::Binary(_))) => {
            shared
                .lock()
                .close(id, 1003, "binary frames are not supported");
        }
        Some(Ok(Message::Close(_))) | None => return false,
        Some(Ok(_)) => {}
        Some(Err(e)) => {
            let code = match e {
                tokio_tungstenite::tungstenite::Error::Capacity(_) => 1009,
                _ => 1002,
            };
            let _ = sink.send(close_msg(code, &e.to_string())).await;
            return false;
        }
    }
    true
}

/// Writes `first` and everything else already queued, then flushes once:
/// a burst of envelopes leaves in as few socket writes as the write buffer
/// allows; with `record_write_waits`, each streamed batch's wait from its
/// stamp to the flush is noted. False when the connection is over.
async fn write_outbound(
    shared: &Shared,
    sink: &mut Sink,
    rx: &mut mpsc::UnboundedReceiver<Outbound>,
    first: Option<Outbound>,
) -> bool {
    let mut next = first;
    if next.is_none() {
        return false;
    }
    let mut stamps = Vec::new();
    while let Some(out) = next.take() {
        match out {
            Outbound::Frame(f) => {
                if sink.feed(Message::Text(f)).await.is_err() {
                    return false;
                }
            }
            Outbound::Batch(batch) => {
                if shared.cfg.record_write_waits {
                    stamps.push(batch.stamped);
                }
                for f in batch.frames.iter() {
                    if sink.feed(Message::Text(f.clone())).await.is_err() {
                        return false;
                    }
                }
            }
            Outbound::Close(code, reason) => {
                let _ = sink.send(close_msg(code, &reason)).await;
                return false;
            }
            Outbound::Drop => return false,
        }
        next = rx.try_recv().ok();
    }
    let flushed = sink.flush().await.is_ok();
    if !stamps.is_empty() {
        shared.note_write_waits(super::stream::now_micros(), &stamps);
    }
    flushed
}

fn close_msg(code: u16, reason: &str) -> Message {
    let reason: String = reason.chars().take(100).collect();
    Message::Close(Some(CloseFrame {
        code: code.into(),
        reason: reason.into(),
    }))
}

/// Handles one inbound text frame: record, parse, route, answer.
fn on_text(shared: &Arc<Shared>, conn: ConnId, text: &str) {
    let parsed: Result<Value, _> = serde_json::from_str(text);
    let method = parsed
        .as_ref()
        .ok()
        .and_then(|v| v.get("method"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let client_id = shared.lock().client_of(conn);
    shared.record(FrameRecord {
        conn,
        client_id,
        method: method.clone(),
        text: text.into(),
    });
    let msg = match parsed {
        Ok(v) => v,
        Err(e) => return reply_err(shared, conn, &Value::Null, &RpcError::parse(e)),
    };
    let Some(obj) = msg.as_object() else {
        let err = RpcError::invalid_request(
            "a frame must be one JSON-RPC object (batches are not supported)",
        );
        return reply_err(shared, conn, &Value::Null, &err);
    };
    let id = obj.get("id").cloned();
    if id
        .as_ref()
        .is_some_and(|v| !(v.is_string() || v.is_number() || v.is_null()))
    {
        let err = RpcError::invalid_request("id must be a string, a number or null");
        return reply_err(shared, conn, &Value::Null, &err);
    }
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        let err = RpcError::invalid_request("jsonrpc must be \"2.0\"");
        return reply_err(shared, conn, id.as_ref().unwrap_or(&Value::Null), &err);
    }
    let params = obj.get("params").cloned().unwrap_or(Value::Null);
    match (id, method) {
        (Some(id), Some(method)) => on_request(shared, conn, &id, &method, &params),
        (None, Some(method)) => on_notification(shared, conn, &method, &params),
        (Some(id), None) if obj.contains_key("result") || obj.contains_key("error") => {
            // The answer to a request the host sent (`SimHost::ask_client`).
            if let Some(waiter) = id.as_u64().and_then(|n| shared.lock().asks.remove(&n)) {
                let _ = waiter.send(msg.clone());
            }
        }
        (id, None) => {
            let err = RpcError::invalid_request("missing method");
            reply_err(shared, conn, id.as_ref().unwrap_or(&Value::Null), &err);
        }
    }
}

fn reply_err(shared: &Arc<Shared>, conn: ConnId, id: &Value, err: &RpcError) {
    shared.lock().send(conn, rpc::error_frame(id, err));
}

/// Requests VS Code's host answers without `params.channel`: its server
/// never checks `channel` generically, its client sends `reconnect` without
/// one and its own server tests send `initialize` without one. In VS Code
/// mode these are taken as addressed to the root.
const ROOT_WITHOUT_CHANNEL: [&str; 3] = ["initialize", "reconnect", "ping"];

/// `params` with the root as its channel when VS Code mode takes `method`
/// without one ([`ROOT_WITHOUT_CHANNEL`]); otherwise `params` as sent.
fn addressed<'a>(shared: &Shared, method: &str, params: &'a Value) -> Cow<'a, Value> {
    let implied = shared.cfg.vscode_compat
        && params.get("channel").is_none()
        && ROOT_WITHOUT_CHANNEL.contains(&method);
    if !implied {
        return Cow::Borrowed(params);
    }
    let mut owned = if params.is_object() {
        params.clone()
    } else {
        Value::Object(serde_json::Map::new())
    };
    if let Some(o) = owned.as_object_mut() {
        o.insert("channel".into(), ahp_types::ROOT_RESOURCE_URI.into());
    }
    Cow::Owned(owned)
}

fn on_request(shared: &Arc<Shared>, conn: ConnId, id: &Value, method: &str, params: &Value) {
    let params = addressed(shared, method, params);
    let params = params.as_ref();
    if !params.get("channel").is_some_and(Value::is_string) {
        let err = RpcError::invalid_params("params.channel (a string) is required");
        return reply_err(shared, conn, id, &err);
    }
    let mut core = shared.lock();
    let outcome = commands::handle_request(shared, &mut core, conn, method, params);
    if core.take_drop_before_answer(conn, method) || core.take_silent_before_answer(conn, method) {
        return;
    }
    let outcome = if core.take_fail_before_answer(conn, method) {
        Err(RpcError::internal("simulated failure", None))
    } else {
        outcome
    };
    match outcome {
        Ok(result) => core.send(conn, rpc::result_frame(id, &result)),
        Err(err) => {
            core.send(conn, rpc::error_frame(id, &err));
            if err.code == ahp_types::errors::ahp_error_codes::UNSUPPORTED_PROTOCOL_VERSION {
                core.close(conn, 1002, "unsupported protocol version");
            }
        }
    }
}

fn on_notification(shared: &Arc<Shared>, conn: ConnId, method: &str, params: &Value) {
    let mut core = shared.lock();
    let outcome = match method {
        "dispatchAction" => dispatch::dispatch_action(shared, &mut core, conn, params),
        "unsubscribe" => dispatch::unsubscribe(shared, &mut core, conn, params),
        _ => Err("unknown notification"),
    };
    if let Err(why) = outcome {
        tracing::debug!(method, why, "simhost dropped a notification");
    }
}

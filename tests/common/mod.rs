//! Helpers shared by the integration tests: start simulated hosts, connect
//! the official `ahp` client or a raw WebSocket, and wait with timeouts.
//! `frames` builds the JSON-RPC frames and actions tests write by hand,
//! `names` the principals and client names, `relay` a relay over TLS in
//! front of simulated hosts, `postgres` a throwaway PostgreSQL cluster,
//! `haproxy` a load balancer in front of relays. Every test file uses these
//! rather than its own copies.
#![allow(dead_code)]

use std::time::Duration;

use ahp::{Client, ClientConfig, ClientEvent, ClientEventStream, SubscriptionEvent};
use ahp_relay::simhost::{AgentScript, SimHost, SimHostConfig};
use ahp_types::actions::ActionEnvelope;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

pub mod frames;
pub mod haproxy;
pub mod names;
pub mod ports;
pub mod postgres;
pub mod relay;

pub use frames::*;
pub use names::*;
pub use ports::reserved_port;

/// Generous bound for anything a test waits for on loopback.
pub const WAIT: Duration = Duration::from_secs(10);

/// A host config for tests: fast agent (no pacing), `sessions` seeded.
pub fn fast_config(name: &str, sessions: usize) -> SimHostConfig {
    SimHostConfig {
        sessions,
        script: AgentScript {
            reply_deltas: 5,
            delta_bytes: 16,
            delta_rate: 0,
            tool_confirmation: false,
            seed: None,
        },
        ..SimHostConfig::named(name)
    }
}

/// Starts a simulated host on a free loopback port.
pub async fn start_host(cfg: SimHostConfig) -> SimHost {
    SimHost::start_local(cfg).await.expect("simhost starts")
}

/// The official client over a plain WebSocket, with a subscription buffer
/// large enough that the broadcast fan-out never skips an event.
pub async fn connect(url: &str) -> Client {
    let transport = ahp_ws::WebSocketTransport::connect(url)
        .await
        .expect("websocket connects");
    Client::connect(
        transport,
        ClientConfig {
            default_request_timeout: Some(WAIT),
            subscription_buffer: 1 << 16,
        },
    )
    .await
    .expect("client starts")
}

/// Connects and initializes with `client_id`, offering protocol 1.0.0.
pub async fn connect_init(url: &str, client_id: &str) -> Client {
    let client = connect(url).await;
    client
        .initialize(client_id.into(), vec!["1.0.0".into()], vec![])
        .await
        .expect("initialize succeeds");
    client
}

/// Next event of `events` within [`WAIT`], or panic.
pub async fn next_event(events: &mut ClientEventStream) -> ClientEvent {
    tokio::time::timeout(WAIT, events.recv())
        .await
        .expect("event arrives in time")
        .expect("event stream open")
}

/// Reads action envelopes from `events` until `stop` returns true for one
/// (that one included); other events are skipped.
pub async fn actions_until(
    events: &mut ClientEventStream,
    mut stop: impl FnMut(&ActionEnvelope) -> bool,
) -> Vec<ActionEnvelope> {
    let mut out = Vec::new();
    loop {
        if let SubscriptionEvent::Action(env) = next_event(events).await.event {
            let done = stop(&env);
            out.push(env);
            if done {
                return out;
            }
        }
    }
}

/// Polls `cond` every 10 ms until it holds, or panics after [`WAIT`].
pub async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether `e` carries an action of wire type `ty` on `channel`.
pub fn is(e: &ActionEnvelope, channel: &str, ty: &str) -> bool {
    e.channel == channel && action_type(e) == ty
}

/// The wire `type` of an envelope's action.
pub fn action_type(env: &ActionEnvelope) -> String {
    serde_json::to_value(&env.action)
        .ok()
        .and_then(|v| v.get("type").and_then(Value::as_str).map(str::to_string))
        .unwrap_or_default()
}

/// Parsed frames `host` received with `method`, in order.
pub fn host_frames(host: &SimHost, method: &str) -> Vec<Value> {
    host.received()
        .iter()
        .filter(|f| f.method.as_deref() == Some(method))
        .map(|f| serde_json::from_str(&f.text).expect("recorded frame is JSON"))
        .collect()
}

/// The `clientId` of every `initialize` `host` received, in order (an
/// `initialize` is recorded before its connection has a clientId, so it is
/// read from the params).
pub fn initialized_ids(host: &SimHost) -> Vec<String> {
    host_frames(host, "initialize")
        .iter()
        .filter_map(|f| f["params"]["clientId"].as_str().map(str::to_string))
        .collect()
}

/// A raw WebSocket for frames the SDK cannot send or would not parse.
pub struct RawWs {
    ws: ahp_relay::upstream::dial::WsStream,
}

impl RawWs {
    /// Wraps an already-open WebSocket.
    pub fn from_stream(ws: ahp_relay::upstream::dial::WsStream) -> Self {
        Self { ws }
    }

    /// Opens a raw WebSocket to `url` (any certificate accepted).
    pub async fn connect(url: &str) -> Self {
        let options = ahp_relay::upstream::dial::DialOptions {
            url: url.to_owned(),
            token: None,
            ca_file: None,
            insecure: true,
            connect_timeout: WAIT,
            extra_headers: Vec::new(),
        };
        let ws = ahp_relay::upstream::dial::dial_stream(&options)
            .await
            .expect("raw websocket connects");
        Self { ws }
    }

    /// Starts a close handshake from the client side and waits (bounded)
    /// for the server's answer.
    pub async fn close_cleanly(mut self) {
        self.ws.close(None).await.expect("close frame sent");
        let _ = tokio::time::timeout(WAIT, async {
            while let Some(Ok(_)) = self.ws.next().await {}
        })
        .await;
    }

    /// Sends one text frame.
    pub async fn send_text(&mut self, text: &str) {
        self.ws.send(Message::text(text)).await.expect("send text");
    }

    /// Sends one JSON value as a text frame.
    pub async fn send_json(&mut self, v: &Value) {
        self.send_text(&v.to_string()).await;
    }

    /// Sends one binary frame.
    pub async fn send_binary(&mut self, bytes: Vec<u8>) {
        self.ws
            .send(Message::binary(bytes))
            .await
            .expect("send binary");
    }

    /// Next text frame as JSON, or `None` if the socket closed first.
    pub async fn recv_json(&mut self) -> Option<Value> {
        loop {
            let msg = tokio::time::timeout(WAIT, self.ws.next())
                .await
                .expect("frame in time")?;
            match msg.ok()? {
                Message::Text(t) => {
                    return Some(serde_json::from_str(t.as_str()).expect("host sends JSON"));
                }
                Message::Close(_) => return None,
                _ => continue,
            }
        }
    }

    /// The response to request `id` (skipping notifications before it).
    pub async fn response(&mut self, id: &Value) -> Value {
        loop {
            let v = self
                .recv_json()
                .await
                .expect("socket open until the response");
            if v.get("id") == Some(id) {
                return v;
            }
        }
    }

    /// The responses to `ids`, in the order of `ids` whatever order they
    /// arrive in (other frames are skipped): answers that nothing orders,
    /// such as two requests' timeouts, may come either way round.
    pub async fn responses(&mut self, ids: &[Value]) -> Vec<Value> {
        let mut got: Vec<Option<Value>> = vec![None; ids.len()];
        while got.iter().any(Option::is_none) {
            let v = self
                .recv_json()
                .await
                .expect("socket open until the responses");
            if let Some(i) = ids.iter().position(|id| v.get("id") == Some(id)) {
                got[i] = Some(v);
            }
        }
        got.into_iter().flatten().collect()
    }

    /// Sends a request and returns its response.
    pub async fn request(&mut self, id: u64, method: &str, params: Value) -> Value {
        self.send_json(&request_frame(id, method, params)).await;
        self.response(&json!(id)).await
    }

    /// Sends `action` on `channel` as the client's dispatch `client_seq`
    /// (a notification: nothing answers it but the echo).
    pub async fn dispatch(&mut self, channel: &str, client_seq: i64, action: Value) {
        self.send_json(&dispatch_frame(channel, client_seq, action))
            .await;
    }

    /// Initializes this connection as `client_id` with protocol 1.0.0.
    pub async fn initialize(&mut self, client_id: &str) -> Value {
        self.request(0, "initialize", initialize_params(client_id))
            .await
    }

    /// Waits for the close frame and returns its code and reason.
    pub async fn close_code(&mut self) -> Option<(u16, String)> {
        // What arrived before a missing close says whether the relay gave up
        // on the socket or never found the client slow.
        let (mut frames, mut bytes) = (0usize, 0usize);
        loop {
            let msg = tokio::time::timeout(WAIT, self.ws.next())
                .await
                .unwrap_or_else(|_| {
                    panic!("no close in time after {frames} frames, {bytes} bytes")
                })?;
            frames += 1;
            if let Ok(Message::Text(t)) = &msg {
                bytes += t.len();
            }
            if let Ok(Message::Close(frame)) = msg {
                return frame.map(|f| (u16::from(f.code), f.reason.to_string()));
            }
            if msg.is_err() {
                return None;
            }
        }
    }
}

// ─── Subscriptions, envelopes and reducers ──────────────────────────────────

/// Subscribes through the generic `request`, so the snapshot's `state` stays
/// raw JSON (the SDK's typed `SubscribeResult` goes through the untagged
/// `SnapshotState`). Returns the snapshot object `{resource, state, fromSeq}`.
/// Take `client.events()` before calling this to see every later envelope.
pub async fn subscribe_raw(client: &Client, channel: &str) -> Value {
    let result: Value = client
        .request("subscribe", json!({ "channel": channel }))
        .await
        .unwrap_or_else(|e| panic!("subscribe {channel}: {e:?}"));
    result
        .get("snapshot")
        .cloned()
        .unwrap_or_else(|| panic!("subscribe {channel} returned no snapshot: {result}"))
}

/// The `fromSeq` of a raw snapshot object.
pub fn snapshot_from_seq(snapshot: &Value) -> u64 {
    snapshot
        .get("fromSeq")
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("snapshot without fromSeq: {snapshot}"))
}

/// Action envelopes that arrive on `events` within `window` (other events
/// are skipped). Returns early if the stream ends.
pub async fn actions_within(
    events: &mut ClientEventStream,
    window: Duration,
) -> Vec<ActionEnvelope> {
    let deadline = tokio::time::Instant::now() + window;
    let mut out = Vec::new();
    while let Ok(Some(ev)) = tokio::time::timeout_at(deadline, events.recv()).await {
        if let SubscriptionEvent::Action(env) = ev.event {
            out.push(env);
        }
    }
    out
}

/// Every envelope the host queued for `client` before now: pings (the answer
/// follows every frame queued before it) and then drains `events`.
pub async fn drain_actions(client: &Client, events: &mut ClientEventStream) -> Vec<ActionEnvelope> {
    client.ping().await.expect("ping answered");
    actions_within(events, Duration::from_millis(30)).await
}

/// The `completions` request for chat `chat`: routed to the chat's host,
/// which answers it without changing any state.
pub fn barrier_params(chat: &str) -> Value {
    json!({"channel": chat, "kind": "userMessage", "text": "", "offset": 0})
}

/// A round trip through the host of each of `chats` on `client`'s link:
/// the host answers `completions` after every frame it queued before it,
/// and the relay writes that answer after every envelope it read from the
/// link before it, so once it returns every envelope those hosts sent
/// before the barrier is on its way to `events` (no quiet window needed).
pub async fn host_barrier(client: &Client, chats: &[&str]) {
    for chat in chats {
        let r: Value = client
            .request("completions", barrier_params(chat))
            .await
            .unwrap_or_else(|e| panic!("completions on {chat} (host barrier): {e:?}"));
        assert!(r["items"].is_array(), "the host answered the barrier: {r}");
    }
}

/// Every envelope the hosts of `chats` sent `client` before now (frames a
/// host queued right after the last awaited one included): a
/// [`host_barrier`] for each, then [`drain_actions`].
pub async fn settle(
    client: &Client,
    events: &mut ClientEventStream,
    chats: &[&str],
) -> Vec<ActionEnvelope> {
    host_barrier(client, chats).await;
    drain_actions(client, events).await
}

fn reduce_json<S>(
    state: &Value,
    channel: &str,
    envelopes: &[ActionEnvelope],
    apply: impl Fn(&mut S, &ahp_types::actions::StateAction) -> ahp::ReduceOutcome,
) -> Value
where
    S: serde::de::DeserializeOwned + serde::Serialize,
{
    let mut s: S = serde_json::from_value(state.clone())
        .unwrap_or_else(|e| panic!("state of {channel} does not parse: {e}: {state}"));
    for env in envelopes
        .iter()
        .filter(|e| e.channel == channel && e.rejection_reason.is_none())
    {
        let outcome = apply(&mut s, &env.action);
        assert!(
            !matches!(outcome, ahp::ReduceOutcome::Invalid(_)),
            "envelope {} on {channel} is invalid for the reducer: {outcome:?}",
            env.server_seq
        );
    }
    serde_json::to_value(&s).expect("state serializes")
}

/// Applies the accepted envelopes of `channel` (those without
/// `rejectionReason`, in the given order) to a chat state given as JSON.
pub fn reduce_chat(state: &Value, channel: &str, envelopes: &[ActionEnvelope]) -> Value {
    reduce_json::<ahp_types::state::ChatState>(state, channel, envelopes, |s, a| {
        ahp::reducers::apply_action_to_chat(s, a)
    })
}

/// Like [`reduce_chat`] for a session channel.
pub fn reduce_session(state: &Value, channel: &str, envelopes: &[ActionEnvelope]) -> Value {
    reduce_json::<ahp_types::state::SessionState>(state, channel, envelopes, |s, a| {
        ahp::reducers::apply_action_to_session(s, a)
    })
}

/// Like [`reduce_chat`] for a terminal channel.
pub fn reduce_terminal(state: &Value, channel: &str, envelopes: &[ActionEnvelope]) -> Value {
    reduce_json::<ahp_types::state::TerminalState>(state, channel, envelopes, |s, a| {
        ahp::reducers::apply_action_to_terminal(s, a)
    })
}

/// Like [`reduce_chat`] for the root channel.
pub fn reduce_root(state: &Value, envelopes: &[ActionEnvelope]) -> Value {
    reduce_json::<ahp_types::state::RootState>(state, "ahp-root://", envelopes, |s, a| {
        ahp::reducers::apply_action_to_root(s, a)
    })
}

/// Panics unless the `serverSeq`s of `envelopes` strictly increase.
pub fn assert_strictly_increasing(envelopes: &[ActionEnvelope]) {
    for w in envelopes.windows(2) {
        assert!(
            w[0].server_seq < w[1].server_seq,
            "serverSeq not strictly increasing: {} then {}",
            w[0].server_seq,
            w[1].server_seq
        );
    }
}

impl RawWs {
    /// Next text frame exactly as received (no re-serialization), or `None`
    /// if the socket closed first.
    pub async fn recv_text(&mut self) -> Option<String> {
        loop {
            let msg = tokio::time::timeout(WAIT, self.ws.next())
                .await
                .expect("frame in time")?;
            match msg.ok()? {
                Message::Text(t) => return Some(t.as_str().to_string()),
                Message::Close(_) => return None,
                _ => continue,
            }
        }
    }
}

/// A frame or the end of a socket.
#[derive(Debug)]
pub enum Next {
    /// A text frame, parsed.
    Frame(Value),
    /// The socket closed with this close frame (code, reason), if it had one.
    Closed(Option<(u16, String)>),
}

impl RawWs {
    /// The next text frame, or how the socket closed.
    pub async fn next_or_close(&mut self) -> Next {
        loop {
            let msg = tokio::time::timeout(WAIT, self.ws.next())
                .await
                .expect("frame or close in time");
            match msg {
                Some(Ok(Message::Text(t))) => {
                    return Next::Frame(serde_json::from_str(t.as_str()).expect("JSON frame"));
                }
                Some(Ok(Message::Close(frame))) => {
                    return Next::Closed(frame.map(|f| (u16::from(f.code), f.reason.to_string())));
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return Next::Closed(None),
            }
        }
    }
}

// ─── Non-panicking socket helpers (randomized runs count a timeout as a
// failure of the run and report its seed instead of panicking) ──────────────

impl RawWs {
    /// The next text frame (parsed; a frame that is not JSON comes back as
    /// `{"unparsed": <text>}`) or how the socket closed, or `None` if
    /// nothing arrived within `within`. `Duration::ZERO` only takes what
    /// is already there. A close frame without a status reads as code 1005
    /// and a socket that ended without a close frame as 1006 with the
    /// error as reason (RFC 6455 §7.4.1: codes never sent on the wire).
    pub async fn next_within(&mut self, within: Duration) -> Option<Next> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let msg = tokio::time::timeout_at(deadline, self.ws.next())
                .await
                .ok()?;
            match msg {
                Some(Ok(Message::Text(t))) => {
                    let v = serde_json::from_str(t.as_str())
                        .unwrap_or_else(|_| json!({ "unparsed": t.as_str() }));
                    return Some(Next::Frame(v));
                }
                Some(Ok(Message::Close(frame))) => {
                    let code = frame.map_or((1005, String::new()), |f| {
                        (u16::from(f.code), f.reason.to_string())
                    });
                    return Some(Next::Closed(Some(code)));
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Some(Next::Closed(Some((1006, e.to_string())))),
                None => return Some(Next::Closed(Some((1006, "end of stream".into())))),
            }
        }
    }

    /// Sends one JSON value as a text frame; `false` if the socket can no
    /// longer be written.
    pub async fn try_send_json(&mut self, v: &Value) -> bool {
        self.ws.send(Message::text(v.to_string())).await.is_ok()
    }
}

/// A host named `name` with `sessions` seeded sessions and `script`.
pub fn host(name: &str, sessions: usize, script: AgentScript) -> SimHostConfig {
    SimHostConfig {
        sessions,
        script,
        ..SimHostConfig::named(name)
    }
}

/// The client name of seeded chat `<host>-<n>-main` on `host`.
pub fn seeded_chat(host: &str, n: usize) -> (String, String) {
    (
        format!("ahp-chat:/{host}~{host}-{n}-main"),
        format!("ahp-chat:/{host}-{n}-main"),
    )
}

/// Panics unless the envelopes carry exactly `after+1, after+2, …` (the
/// client's sequence numbers every envelope with the next number, §5.1),
/// all at most 2^53 − 1.
pub fn assert_contiguous(envs: &[ActionEnvelope], after: u64) {
    for (i, e) in envs.iter().enumerate() {
        assert_eq!(
            e.server_seq,
            after + 1 + i as u64,
            "envelope #{i} ({} on {}) is not numbered next after {after}",
            action_type(e),
            e.channel
        );
        assert!(e.server_seq < 1 << 53, "serverSeq above 2^53-1");
    }
}

// ─── Raw-socket envelopes (reconnect, replay and tool-call tests) ───────────

/// The action envelopes of a JSON array (a `replay` result's `actions`).
pub fn envelopes(actions: &Value) -> Vec<ActionEnvelope> {
    actions
        .as_array()
        .unwrap_or_else(|| panic!("not an array of envelopes: {actions}"))
        .iter()
        .map(|a| serde_json::from_value(a.clone()).expect("envelope parses"))
        .collect()
}

/// The resources of a `snapshot` result, sorted.
pub fn snapshot_resources(result: &Value) -> Vec<String> {
    let mut r: Vec<String> = result["snapshots"]
        .as_array()
        .unwrap_or_else(|| panic!("no snapshots: {result}"))
        .iter()
        .map(|s| s["resource"].as_str().expect("resource").to_string())
        .collect();
    r.sort();
    r
}

/// The one snapshot of `uri` in a `snapshot` result.
pub fn snapshot_of<'a>(result: &'a Value, uri: &str) -> &'a Value {
    let all: Vec<&Value> = result["snapshots"]
        .as_array()
        .unwrap_or_else(|| panic!("no snapshots: {result}"))
        .iter()
        .filter(|s| s["resource"] == uri)
        .collect();
    assert_eq!(all.len(), 1, "exactly one snapshot of {uri}: {result}");
    all[0]
}

/// Sends `reconnect` as request `id` on a fresh socket and returns the
/// response, which must be the very first frame the socket receives (the
/// answer is the cut, §5.5).
pub async fn raw_reconnect(ws: &mut RawWs, id: u64, params: Value) -> Value {
    ws.send_json(&request_frame(id, "reconnect", params)).await;
    let first = ws.recv_json().await.expect("socket open until the answer");
    assert_eq!(
        first.get("id"),
        Some(&json!(id)),
        "the reconnect answer is the first frame: {first}"
    );
    first
}

/// Action envelopes from a raw socket until `stop` holds for one (included).
pub async fn raw_actions_until(
    ws: &mut RawWs,
    mut stop: impl FnMut(&ActionEnvelope) -> bool,
) -> Vec<ActionEnvelope> {
    let mut out = Vec::new();
    loop {
        let v = ws.recv_json().await.expect("socket open");
        if v["method"] == "action" {
            let e: ActionEnvelope =
                serde_json::from_value(v["params"].clone()).expect("envelope parses");
            let done = stop(&e);
            out.push(e);
            if done {
                return out;
            }
        }
    }
}

/// Every envelope queued for a raw socket before now: sends `ping` as
/// request `id` (its answer follows every frame queued before it) and
/// returns the action envelopes that arrive before that answer.
pub async fn raw_drain_actions(ws: &mut RawWs, id: u64) -> Vec<ActionEnvelope> {
    frames_before_ping(ws, id)
        .await
        .into_iter()
        .filter(|v| v["method"] == "action")
        .map(|v| serde_json::from_value(v["params"].clone()).expect("envelope parses"))
        .collect()
}

/// Every frame that reaches the socket before the answer to a `ping` with
/// request id `id` (the answer follows every frame queued before it);
/// asserts the ping's answer is `null`.
pub async fn frames_before_ping(ws: &mut RawWs, id: u64) -> Vec<Value> {
    ws.send_json(&ping_frame(id)).await;
    let mut out = Vec::new();
    loop {
        let v = ws.recv_json().await.expect("socket open");
        if v.get("id") == Some(&json!(id)) && v.get("method").is_none() {
            assert_eq!(v["result"], Value::Null, "ping answer: {v}");
            return out;
        }
        out.push(v);
    }
}

/// Every frame that reaches a raw socket before the answer to a round trip
/// through `chat`'s host as request `id` (see [`host_barrier`]).
pub async fn raw_host_barrier(ws: &mut RawWs, id: u64, chat: &str) -> Vec<Value> {
    ws.send_json(&request_frame(id, "completions", barrier_params(chat)))
        .await;
    let mut out = Vec::new();
    loop {
        let v = ws.recv_json().await.expect("socket open until the barrier");
        if v.get("id") == Some(&json!(id)) && v.get("method").is_none() {
            assert!(
                v["result"]["items"].is_array(),
                "the host answered the barrier: {v}"
            );
            return out;
        }
        out.push(v);
    }
}

/// Every envelope the hosts of `chats` sent a raw socket before now: a
/// [`raw_host_barrier`] per chat (request ids `id`, `id + 1`, …), then a
/// `ping` (see [`raw_drain_actions`]).
pub async fn raw_settle(ws: &mut RawWs, id: u64, chats: &[&str]) -> Vec<ActionEnvelope> {
    let mut frames = Vec::new();
    let mut next = id;
    for chat in chats {
        frames.extend(raw_host_barrier(ws, next, chat).await);
        next += 1;
    }
    frames.extend(frames_before_ping(ws, next).await);
    frames
        .into_iter()
        .filter(|v| v["method"] == "action")
        .map(|v| serde_json::from_value(v["params"].clone()).expect("envelope parses"))
        .collect()
}

impl RawWs {
    /// Sends `frames` as text frames with one flush: on loopback they leave
    /// in one TCP write, so the relay reads them back to back.
    pub async fn send_at_once(&mut self, frames: &[Value]) {
        for f in frames {
            self.ws
                .feed(Message::text(f.to_string()))
                .await
                .expect("feed text");
        }
        self.ws.flush().await.expect("flush");
    }
}

impl RawWs {
    /// Sends a text frame whose payload is `bytes` as they are (e.g. not
    /// UTF-8), bypassing the library's own checks.
    pub async fn send_text_bytes(&mut self, bytes: Vec<u8>) {
        use tokio_tungstenite::tungstenite::protocol::frame::Frame;
        use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
        let frame = Frame::message(bytes, OpCode::Data(Data::Text), true);
        self.ws
            .send(Message::Frame(frame))
            .await
            .expect("send raw text frame");
    }
}

/// Raw frames up to and including the first one `stop` accepts.
pub async fn frames_until(raw: &mut RawWs, mut stop: impl FnMut(&Value) -> bool) -> Vec<Value> {
    let mut out = Vec::new();
    loop {
        let v = raw.recv_json().await.expect("socket open");
        let done = stop(&v);
        out.push(v);
        if done {
            return out;
        }
    }
}

/// The session URIs a `listSessions` (request `id`) on the raw socket
/// returns, in list order.
pub async fn listed_uris(ws: &mut RawWs, id: u64) -> Vec<String> {
    let list = ws
        .request(id, "listSessions", json!({"channel": "ahp-root://"}))
        .await;
    list["result"]["items"]
        .as_array()
        .unwrap_or_else(|| panic!("listSessions answered no items: {list}"))
        .iter()
        .filter_map(|s| s["resource"].as_str().map(str::to_string))
        .collect()
}

/// Waits until `listSessions` on `ws` lists `uri` (a relay dials its hosts
/// on its own schedule: an observable event, not a sleep), asking with ids
/// from `first_id` on; panics after [`WAIT`].
pub async fn wait_until_listed(ws: &mut RawWs, uri: &str, first_id: u64) {
    let deadline = std::time::Instant::now() + WAIT;
    let mut id = first_id;
    while !listed_uris(ws, id).await.iter().any(|u| u == uri) {
        assert!(std::time::Instant::now() < deadline, "{uri} never listed");
        id += 1;
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Whether `program` — a part outside the Rust toolchain (chromium,
/// PostgreSQL, HAProxy, nginx) — can be run. Without it a test skips with a
/// printed notice, so the README's `cargo test` passes on a machine with only
/// Rust; with `AHP_RELAY_REQUIRE_EXTERNAL=1` (set by `.ci/run`, which
/// installs them) its absence fails the test instead.
pub fn external(program: &str) -> bool {
    // `--version`, or `-v` for programs that exit non-zero on the long
    // form (HAProxy).
    let runs = ["--version", "-v"].iter().any(|flag| {
        std::process::Command::new(program)
            .arg(flag)
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if runs {
        return true;
    }
    assert!(
        std::env::var("AHP_RELAY_REQUIRE_EXTERNAL").as_deref() != Ok("1"),
        "{program} cannot be run and AHP_RELAY_REQUIRE_EXTERNAL=1: install it (.ci/run does)"
    );
    eprintln!("SKIPPED: {program} is not installed; this test needs it (.ci/run installs it)");
    false
}

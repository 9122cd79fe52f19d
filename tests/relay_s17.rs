//! Client-contributed tool calls through the relay (contract §5.5, §5.7;
//! scenario S17), over real TLS sockets with a simulated host.
//!
//! A client publishes tool `read_tab` with `session/activeClientSet` and
//! starts a turn whose message asks for it (`[client-tool:read_tab]`, see
//! `src/simhost/README.md`); the host's call names the session's upstream id
//! as contributor. S17: a `reconnect` that needs snapshots while that call
//! runs re-baselines the link (same upstream id, `initialSubscriptions`) —
//! the host never sees the client leave, never gets `unsubscribe`, and the
//! call survives. §5.7: a client that drops while it owns such a call loses
//! its links at once, so the host fails the call after its own grace rather
//! than after the relay's 20 s `detach_grace`; a session without one keeps
//! its links through that grace.

mod common;

use std::time::{Duration, Instant};

use ahp_relay::simhost::{SimHost, SimHostConfig};
use ahp_types::actions::ActionEnvelope;
use common::relay::TestRelay;
use common::*;
use serde_json::{Value, json};

const TOOL: &str = "read_tab";
/// A replay buffer this small is evicted by one turn: a `reconnect` from
/// an early watermark needs snapshots.
const TINY_BUFFER: &str = "[limits]\nreplay_buffer_envelopes = 4\n";

// ─── helpers ────────────────────────────────────────────────────────────────

/// Host `a` with one seeded session, a fast agent and `grace_ms` of client
/// tool grace.
fn host_a(grace_ms: u64) -> SimHostConfig {
    SimHostConfig {
        client_tool_grace_ms: grace_ms,
        ..host("a", 1, script(6, 16, 0))
    }
}

/// (client name, host name) of host `a`'s seeded session.
fn seeded_session() -> (String, String) {
    ("ahp-session:/a~a-1".into(), "ahp-session:/a-1".into())
}

fn active_client_set(client_id: &str) -> Value {
    json!({"type": "session/activeClientSet", "activeClient": {"clientId": client_id,
        "tools": [{"name": TOOL, "title": "Read the open tab"}]}})
}

fn tool_complete(turn_id: &str, tool_call_id: &str) -> Value {
    json!({"type": "chat/toolCallComplete", "turnId": turn_id, "toolCallId": tool_call_id,
        "result": {"success": true, "pastTenseMessage": "Read the open tab"}})
}

/// A host state of host `a` in client names (see `common::names`), with
/// the session's upstream id shown as the client's own id.
fn client_view(v: &Value, upstream: &str, client_id: &str) -> Value {
    let text = v
        .to_string()
        .replace(&json!(upstream).to_string(), &json!(client_id).to_string());
    let renamed: Value = serde_json::from_str(&text).expect("a renamed state is JSON");
    client_names("a", &renamed, &[])
}

/// The one tool call of a chat state's active turn (host or client form).
fn active_tool_call(chat: &Value) -> Option<Value> {
    let parts = chat.get("activeTurn")?.get("responseParts")?.as_array()?;
    let calls: Vec<&Value> = parts.iter().filter(|p| p["kind"] == "toolCall").collect();
    assert!(calls.len() <= 1, "one tool call at most: {chat}");
    calls.first().map(|p| p["toolCall"].clone())
}

/// The `status` of the host's running client tool call, `None` once the
/// turn has ended.
fn host_tool_status(h: &SimHost, host_chat: &str) -> Option<String> {
    active_tool_call(&h.channel_state(host_chat)?)
        .and_then(|tc| tc["status"].as_str().map(str::to_string))
}

fn host_active_clients(h: &SimHost, host_session: &str) -> Vec<String> {
    h.channel_state(host_session).expect("session")["activeClients"]
        .as_array()
        .expect("activeClients")
        .iter()
        .filter_map(|c| c["clientId"].as_str().map(str::to_string))
        .collect()
}

/// Methods the host received from `upstream` (on any connection).
fn methods_from(h: &SimHost, upstream: &str) -> Vec<String> {
    h.received_from(upstream)
        .into_iter()
        .filter_map(|f| f.method)
        .collect()
}

/// `initialize` frames the host received for `upstream`.
fn initializes_of(h: &SimHost, upstream: &str) -> usize {
    initialized_ids(h).iter().filter(|c| *c == upstream).count()
}

/// A client socket through the relay whose turn runs client tool `read_tab`.
struct ToolRun {
    ws: RawWs,
    /// S0 of the client's session: a watermark the tiny buffer has evicted.
    s0: u64,
    /// Envelopes received since the subscriptions.
    envs: Vec<ActionEnvelope>,
    turn_id: String,
    tool_call_id: String,
}

/// Initializes `client_id` as alice, subscribes the seeded session and chat,
/// publishes `read_tab` and starts a turn calling it; returns once the call
/// runs (checked on the client's view, the host's state and the relay's
/// bookkeeping).
async fn start_tool_run(t: &TestRelay, client_id: &str) -> ToolRun {
    let (session, _) = seeded_session();
    let (chat, host_chat) = seeded_chat("a", 1);
    let up = t.upstream_id("alice", client_id);
    let mut ws = t.raw("alice").await;
    let init = ws.initialize(client_id).await;
    let s0 = init["result"]["serverSeq"].as_u64().expect("serverSeq");
    let sub = ws
        .request(1, "subscribe", json!({"channel": session}))
        .await;
    assert!(sub["result"]["snapshot"].is_object(), "{sub}");
    let sub = ws.request(2, "subscribe", json!({"channel": chat})).await;
    assert!(sub["result"]["snapshot"].is_object(), "{sub}");
    ws.send_json(&dispatch_frame(&session, 1, active_client_set(client_id)))
        .await;
    let turn_id = format!("{client_id}-turn");
    ws.send_json(&dispatch_frame(
        &chat,
        2,
        turn_started(&turn_id, &format!("look [client-tool:{TOOL}]")),
    ))
    .await;
    let envs = raw_actions_until(&mut ws, |e| is(e, &chat, "chat/toolCallReady")).await;
    let set = envs
        .iter()
        .find(|e| is(e, &session, "session/activeClientSet"))
        .expect("activeClientSet echo");
    assert_eq!(set.rejection_reason, None);
    let start = envs
        .iter()
        .find(|e| is(e, &chat, "chat/toolCallStart"))
        .expect("toolCallStart");
    let start = serde_json::to_value(&start.action).expect("action");
    assert_eq!(
        start["contributor"],
        json!({"kind": "client", "clientId": client_id}),
        "the client sees itself as the contributor"
    );
    let tool_call_id = start["toolCallId"]
        .as_str()
        .expect("toolCallId")
        .to_string();
    let host_call = active_tool_call(&t.hosts[0].channel_state(&host_chat).expect("chat"))
        .expect("the host's call");
    assert_eq!(host_call["status"], "running");
    assert_eq!(
        host_call["contributor"]["clientId"], up,
        "the host sees the upstream id"
    );
    assert_eq!(
        t.session("alice", client_id).tool_calls.len(),
        1,
        "the relay notes the call its session owns"
    );
    ToolRun {
        ws,
        s0,
        envs,
        turn_id,
        tool_call_id,
    }
}

/// Sends `reconnect` on a fresh socket; its answer must be the first frame.
async fn reconnect_raw(t: &TestRelay, client_id: &str, watermark: u64) -> (RawWs, Value) {
    let (session, _) = seeded_session();
    let (chat, _) = seeded_chat("a", 1);
    let mut ws = t.raw("alice").await;
    let first = raw_reconnect(
        &mut ws,
        1,
        reconnect_params(client_id, watermark, &[&session, &chat]),
    )
    .await;
    (ws, first["result"].clone())
}

/// After a snapshot `reconnect` on `ws`: the host's call is still running,
/// the client completes it, the turn completes, and the client's reduced
/// chat equals the host's.
async fn complete_after_snapshot(
    t: &TestRelay,
    mut ws: RawWs,
    result: &Value,
    (turn_id, tool_call_id): (&str, &str),
    client_id: &str,
) {
    let (chat, host_chat) = seeded_chat("a", 1);
    let up = t.upstream_id("alice", client_id);
    let snap = snapshot_of(result, &chat).clone();
    let from = snapshot_from_seq(&snap);
    let call = active_tool_call(&snap["state"]).expect("the snapshot shows the call");
    assert_eq!(call["status"], "running", "{call}");
    assert_eq!(call["contributor"]["clientId"], client_id, "{call}");
    assert_eq!(
        t.session("alice", client_id).tool_calls.len(),
        1,
        "the re-baselined snapshot keeps the call noted"
    );
    ws.send_json(&dispatch_frame(
        &chat,
        10,
        tool_complete(turn_id, tool_call_id),
    ))
    .await;
    let mut live = raw_actions_until(&mut ws, |e| is(e, &chat, "chat/turnComplete")).await;
    live.extend(raw_settle(&mut ws, 2, &[&chat]).await);
    assert_contiguous(&live, from);
    let echo = live
        .iter()
        .find(|e| is(e, &chat, "chat/toolCallComplete"))
        .expect("the completion's echo");
    assert_eq!(
        echo.rejection_reason, None,
        "the contributor may complete it"
    );
    let reduced = reduce_chat(&snap["state"], &chat, &live);
    let host = t.hosts[0].channel_state(&host_chat).expect("chat");
    assert_eq!(reduced, client_view(&host, &up, client_id));
    let done = reduced["turns"]
        .as_array()
        .and_then(|t| t.last())
        .expect("a completed turn");
    assert_eq!(done["state"], "complete");
    assert!(
        t.session("alice", client_id).tool_calls.is_empty(),
        "the completion ends the relay's note"
    );
}

// ─── S17 ────────────────────────────────────────────────────────────────────

/// S17: with `replay_buffer_envelopes = 4` and a host grace of only 300 ms, a `reconnect` from S0 on a new socket (superseding the attached one) while the client's tool call runs gets `snapshot` (the buffer evicted); upstream the link is re-baselined (a second `initialize` with the same upstream id) and the host receives no `unsubscribe` from that client; well past the host's grace the call still runs and the client is still active; the client then completes the call, the turn completes, and its reduced chat equals the host's.
#[tokio::test]
async fn s17_snapshot_reconnect_keeps_the_running_client_tool_call() {
    let t = TestRelay::start(vec![host_a(300)], TINY_BUFFER).await;
    let (_, host_session) = seeded_session();
    let (_, host_chat) = seeded_chat("a", 1);
    let up = t.upstream_id("alice", "s17");
    let run = start_tool_run(&t, "s17").await;
    assert!(run.envs.len() > 4, "the turn overflowed the tiny buffer");
    let h = &t.hosts[0];
    let inits_before = initializes_of(h, &up);
    assert_eq!(inits_before, 1, "one link so far");

    let (ws, result) = reconnect_raw(&t, "s17", run.s0).await;
    assert_eq!(result["type"], "snapshot", "{result}");
    let ToolRun {
        ws: mut old,
        turn_id,
        tool_call_id,
        ..
    } = run;
    let closed = old.close_code().await.map(|c| c.0);
    assert_eq!(closed, Some(4009), "the older socket was superseded");
    let superseded = Instant::now();
    wait_until("re-baselined by a new link's initialize", || {
        initializes_of(h, &up) == 2
    })
    .await;
    // Well past the host's 300 ms grace (waiting out a duration is the point).
    tokio::time::sleep_until((superseded + Duration::from_millis(900)).into()).await;

    let methods = methods_from(h, &up);
    assert_eq!(
        initializes_of(h, &up),
        2,
        "re-baselined by a new link's initialize, once"
    );
    assert!(
        !methods.iter().any(|m| m == "unsubscribe"),
        "no unsubscribe from the client: {methods:?}"
    );
    assert_eq!(
        host_tool_status(h, &host_chat).as_deref(),
        Some("running"),
        "the call outlived the host's 300 ms grace"
    );
    assert_eq!(
        host_active_clients(h, &host_session),
        std::slice::from_ref(&up)
    );
    let call = (turn_id.as_str(), tool_call_id.as_str());
    complete_after_snapshot(&t, ws, &result, call, "s17").await;
    assert!(
        !methods_from(h, &up).iter().any(|m| m == "unsubscribe"),
        "still no unsubscribe"
    );
}

/// S17 after a drop (§5.7): the client's socket drops while its call runs, so the relay closes its link at once (the host sees the connection go); the client `reconnect`s 300 ms later, within the host's 1.5 s grace: `snapshot` (re-baselined, no `unsubscribe`), and past the end of that grace the call still runs; the client completes it and converges on the host.
#[tokio::test]
async fn s17_reconnect_within_the_host_grace_after_a_drop_keeps_the_call() {
    const GRACE_MS: u64 = 1500;
    let t = TestRelay::start(vec![host_a(GRACE_MS)], TINY_BUFFER).await;
    let (_, host_session) = seeded_session();
    let (_, host_chat) = seeded_chat("a", 1);
    let up = t.upstream_id("alice", "s17d");
    let run = start_tool_run(&t, "s17d").await;
    let h = &t.hosts[0];
    assert_eq!(h.connections(), 2, "the watch link and the client's link");
    let watermark = run.envs.last().expect("envelopes").server_seq;
    let dropped_at = Instant::now();
    let ToolRun {
        ws,
        turn_id,
        tool_call_id,
        ..
    } = run;
    drop(ws);
    wait_until("the relay closes the client's link", || {
        h.connections() == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let (ws, result) = reconnect_raw(&t, "s17d", watermark).await;
    assert_eq!(
        result["type"], "snapshot",
        "the links closed, so the relay re-baselines: {result}"
    );
    let wait = Duration::from_millis(GRACE_MS + 500).saturating_sub(dropped_at.elapsed());
    tokio::time::sleep(wait).await;
    assert_eq!(
        host_tool_status(h, &host_chat).as_deref(),
        Some("running"),
        "back within the host's grace: the call is kept"
    );
    assert_eq!(
        host_active_clients(h, &host_session),
        std::slice::from_ref(&up)
    );
    assert!(
        !methods_from(h, &up).iter().any(|m| m == "unsubscribe"),
        "no unsubscribe from the client"
    );
    let call = (turn_id.as_str(), tool_call_id.as_str());
    complete_after_snapshot(&t, ws, &result, call, "s17d").await;
}

// ─── §5.7: detach with and without client tool calls ────────────────────────

/// §5.7: a client that drops while it owns a running client tool call loses its links at once: the host sees the link close within 2 s, removes the client and fails the call after its 500 ms grace — within 5.5 s of the drop, far inside the relay's 20 s `detach_grace` — and the turn completes with the failed call.
#[tokio::test]
async fn dropped_owner_of_a_client_tool_call_has_it_failed_promptly() {
    const GRACE_MS: u64 = 500;
    let t = TestRelay::start(vec![host_a(GRACE_MS)], "").await;
    assert_eq!(t.relay.relay.cfg.limits.detach_grace_secs, 20);
    let (_, host_session) = seeded_session();
    let (_, host_chat) = seeded_chat("a", 1);
    let up = t.upstream_id("alice", "owner");
    let run = start_tool_run(&t, "owner").await;
    let h = &t.hosts[0];
    assert_eq!(h.connections(), 2);
    let dropped_at = Instant::now();
    drop(run.ws);
    wait_until("the relay closes the owner's link", || h.connections() == 1).await;
    assert!(
        dropped_at.elapsed() < Duration::from_secs(2),
        "closed {:?} after the drop",
        dropped_at.elapsed()
    );
    wait_until("the host ends the turn", || {
        host_tool_status(h, &host_chat).is_none()
    })
    .await;
    let failed_after = dropped_at.elapsed();
    assert!(
        failed_after < Duration::from_millis(5000 + GRACE_MS),
        "failed {failed_after:?} after the drop"
    );
    let chat = h.channel_state(&host_chat).expect("chat");
    let turn = chat["turns"]
        .as_array()
        .and_then(|t| t.last())
        .cloned()
        .expect("a finished turn");
    assert_eq!(turn["state"], "complete", "{turn}");
    let call = turn["responseParts"]
        .as_array()
        .expect("parts")
        .iter()
        .find(|p| p["kind"] == "toolCall")
        .map(|p| p["toolCall"].clone())
        .expect("the tool call");
    assert_eq!(call["status"], "completed", "{call}");
    assert_eq!(call["success"], false, "failed by the host: {call}");
    assert_eq!(call["contributor"]["clientId"], up);
    assert!(host_active_clients(h, &host_session).is_empty());
    assert!(t.session("alice", "owner").tool_calls.is_empty());
}

/// §5.7 control: a dropped client active in a session but owning no tool call keeps its link through `detach_grace`: 2 s after the drop (four times the host's 500 ms grace) the host still has the link and still lists the client in `activeClients`.
#[tokio::test]
async fn dropped_client_without_tool_calls_keeps_its_links_through_the_grace() {
    const GRACE_MS: u64 = 500;
    let t = TestRelay::start(vec![host_a(GRACE_MS)], "").await;
    let (session, host_session) = seeded_session();
    let up = t.upstream_id("alice", "idle");
    let mut ws = t.raw("alice").await;
    ws.initialize("idle").await;
    let sub = ws
        .request(1, "subscribe", json!({"channel": session}))
        .await;
    assert!(sub["result"]["snapshot"].is_object(), "{sub}");
    ws.send_json(&dispatch_frame(&session, 1, active_client_set("idle")))
        .await;
    raw_actions_until(&mut ws, |e| is(e, &session, "session/activeClientSet")).await;
    let h = &t.hosts[0];
    assert_eq!(
        host_active_clients(h, &host_session),
        std::slice::from_ref(&up)
    );
    assert_eq!(h.connections(), 2);
    assert!(t.session("alice", "idle").tool_calls.is_empty());
    let dropped = Instant::now();
    drop(ws);
    let s = t.session("alice", "idle");
    wait_until("the session is detached", || s.lock().socket_id().is_none()).await;
    // Four times the host's grace (waiting out a duration is the point).
    tokio::time::sleep_until((dropped + Duration::from_secs(2)).into()).await;
    assert_eq!(h.connections(), 2, "the link stays open");
    assert_eq!(
        host_active_clients(h, &host_session),
        [up],
        "the host never saw the client leave"
    );
}

/// §12.2 with S17: the relay restarts (same directory, so the same secret
/// and upstream ids) while the client's tool call runs on a host whose
/// client grace is 20 s; the client's `reconnect` on the new incarnation is
/// adopted — `snapshot`, the host sees the same upstream id initialize
/// again — so the call is still running, the client completes it and the
/// turn completes with its reduced chat equal to the host's.
#[tokio::test]
async fn an_adopted_session_keeps_its_running_client_tool_call_across_a_relay_restart() {
    let t = TestRelay::start(vec![host_a(20_000)], "").await;
    let (_, host_chat) = seeded_chat("a", 1);
    let up = t.upstream_id("alice", "s17-adopt");
    let run = start_tool_run(&t, "s17-adopt").await;
    let watermark = run
        .envs
        .iter()
        .map(|e| e.server_seq)
        .max()
        .unwrap_or(run.s0);
    let ToolRun {
        ws: old,
        turn_id,
        tool_call_id,
        ..
    } = run;
    let t = t.restart().await;
    drop(old);
    assert!(
        !t.has_session("alice", "s17-adopt"),
        "the new incarnation does not know the session"
    );
    let (ws, result) = reconnect_raw(&t, "s17-adopt", watermark).await;
    assert_eq!(result["type"], "snapshot", "adopted: {result}");
    let (chat, _) = seeded_chat("a", 1);
    assert!(snapshot_from_seq(snapshot_of(&result, &chat)) > watermark);
    assert_eq!(
        t.upstream_id("alice", "s17-adopt"),
        up,
        "the same upstream id"
    );
    assert_eq!(
        host_tool_status(&t.hosts[0], &host_chat).as_deref(),
        Some("running"),
        "the host kept the call for the returning client"
    );
    assert!(
        initializes_of(&t.hosts[0], &up) >= 2,
        "the host saw the same client initialize again"
    );
    let call = (turn_id.as_str(), tool_call_id.as_str());
    complete_after_snapshot(&t, ws, &result, call, "s17-adopt").await;
}

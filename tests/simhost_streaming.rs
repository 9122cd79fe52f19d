//! Streaming, concurrency, reconnect and fault scenarios of the simulated
//! host, driven through the official `ahp` client (and raw sockets where the
//! SDK cannot observe something). States are compared as JSON against the
//! host's own view (`SimHost::channel_state`).

mod common;

use std::time::Duration;

use ahp::{Client, ClientError};
use ahp_relay::simhost::clock::now_iso;
use ahp_relay::simhost::{AgentScript, SimHostConfig};
use ahp_types::actions::{ActionEnvelope, StateAction};
use common::*;
use serde_json::{Value, json};

const ROOT: &str = "ahp-root://";

fn script(reply_deltas: u32, delta_bytes: usize, delta_rate: u32) -> AgentScript {
    AgentScript {
        reply_deltas,
        delta_bytes,
        delta_rate,
        tool_confirmation: false,
        seed: None,
    }
}

/// One seeded session (`ahp-session:/<name>-1`, chat `ahp-chat:/<name>-1-main`).
fn config(name: &str, script: AgentScript) -> SimHostConfig {
    SimHostConfig {
        sessions: 1,
        script,
        ..SimHostConfig::named(name)
    }
}

fn main_session(name: &str) -> String {
    format!("ahp-session:/{name}-1")
}

fn main_chat(name: &str) -> String {
    format!("ahp-chat:/{name}-1-main")
}

fn action(v: Value) -> StateAction {
    let a: StateAction = serde_json::from_value(v.clone()).expect("action literal parses");
    assert!(
        !matches!(a, StateAction::Unknown(_)),
        "action literal is not a known action: {v}"
    );
    a
}

fn user_message(text: &str) -> Value {
    json!({"text": text, "origin": {"kind": "user"}})
}

fn turn_started(turn_id: &str, text: &str) -> StateAction {
    action(
        json!({"type": "chat/turnStarted", "turnId": turn_id, "startedAt": now_iso(),
        "message": user_message(text)}),
    )
}

/// The action of an envelope as JSON.
fn payload(e: &ActionEnvelope) -> Value {
    serde_json::to_value(&e.action).expect("action serializes")
}

fn to_json(envs: &[ActionEnvelope]) -> Value {
    serde_json::to_value(envs).expect("envelopes serialize")
}

fn on(envs: &[ActionEnvelope], channel: &str) -> Vec<ActionEnvelope> {
    envs.iter()
        .filter(|e| e.channel == channel)
        .cloned()
        .collect()
}

fn types(envs: &[ActionEnvelope]) -> Vec<String> {
    envs.iter().map(action_type).collect()
}

fn is(e: &ActionEnvelope, channel: &str, ty: &str) -> bool {
    e.channel == channel && action_type(e) == ty
}

fn is_echo(e: &ActionEnvelope, client_id: &str, client_seq: i64) -> bool {
    e.origin
        .as_ref()
        .is_some_and(|o| o.client_id == client_id && o.client_seq == client_seq)
}

fn rpc_code(err: ClientError) -> i32 {
    match err {
        ClientError::Rpc(e) => e.code,
        other => panic!("expected a JSON-RPC error, got {other:?}"),
    }
}

/// The one tool call of a chat's active turn, or else of its last turn.
fn tool_call(chat: &Value) -> Value {
    let parts = match chat.get("activeTurn") {
        Some(t) => &t["responseParts"],
        None => {
            &chat["turns"][chat["turns"].as_array().map_or(0, |t| t.len()) - 1]["responseParts"]
        }
    };
    let calls: Vec<&Value> = parts
        .as_array()
        .expect("responseParts")
        .iter()
        .filter(|p| p["kind"] == "toolCall")
        .collect();
    assert_eq!(calls.len(), 1, "one tool call expected in {chat}");
    calls[0]["toolCall"].clone()
}

fn last_turn(chat: &Value) -> Value {
    chat["turns"]
        .as_array()
        .and_then(|t| t.last())
        .cloned()
        .expect("chat has a completed turn")
}

/// Waits until `client`'s connection is gone (its event stream ends).
async fn wait_closed(events: &mut ahp::ClientEventStream) {
    tokio::time::timeout(WAIT, async { while events.recv().await.is_some() {} })
        .await
        .expect("connection drops in time");
}

async fn reconnect_raw(client: &Client, client_id: &str, last_seen: u64, subs: &[&str]) -> Value {
    client
        .request(
            "reconnect",
            json!({"channel": ROOT, "clientId": client_id, "lastSeenServerSeq": last_seen,
                "subscriptions": subs}),
        )
        .await
        .expect("reconnect answered")
}

/// Sends `ping` with `id` on a raw socket; returns the frames that preceded its answer.
async fn frames_before_ping(raw: &mut RawWs, id: u64) -> Vec<Value> {
    raw.send_json(
        &json!({"jsonrpc": "2.0", "id": id, "method": "ping", "params": {"channel": ROOT}}),
    )
    .await;
    let mut before = Vec::new();
    loop {
        let v = raw
            .recv_json()
            .await
            .expect("socket open until the ping answer");
        if v.get("id") == Some(&json!(id)) {
            assert_eq!(v["result"], Value::Null, "ping answered: {v}");
            return before;
        }
        before.push(v);
    }
}

fn has_session_added(frames: &[Value], session: &str) -> bool {
    frames.iter().any(|f| {
        f["method"] == "root/sessionAdded" && f["params"]["summary"]["resource"] == session
    })
}

/// Scenario 1: a turn's envelopes arrive in strictly increasing `serverSeq`, reduce to the host's chat, and update the session catalog.
#[tokio::test]
async fn turn_stream_reduces_to_host_chat_state() {
    let host = start_host(config("stream", script(6, 10, 0))).await;
    let client = connect_init(&host.url(), "streamer").await;
    let mut events = client.events();
    let session = "ahp-session:/stream-new";
    let chat = "ahp-chat:/stream-new-c1";
    client
        .request::<_, ()>("createSession", json!({"channel": session}))
        .await
        .expect("createSession");
    let session_snap = subscribe_raw(&client, session).await;
    client
        .request::<_, ()>("createChat", json!({"channel": session, "chat": chat}))
        .await
        .expect("createChat");
    let chat_snap = subscribe_raw(&client, chat).await;
    let handle = client
        .dispatch(chat.into(), turn_started("turn-a", "hello"))
        .await
        .expect("dispatch");
    let mut envs = actions_until(&mut events, |e| is(e, chat, "chat/turnComplete")).await;
    envs.extend(drain_actions(&client, &mut events).await);

    assert_strictly_increasing(&envs);
    let chat_envs = on(&envs, chat);
    let mut expected = vec!["chat/turnStarted", "chat/responsePart"];
    expected.extend(["chat/delta"; 6]);
    expected.push("chat/turnComplete");
    assert_eq!(types(&chat_envs), expected);
    assert!(chat_envs[0].server_seq > snapshot_from_seq(&chat_snap));
    let origin = chat_envs[0].origin.as_ref().expect("echo carries origin");
    assert_eq!(origin.client_id, "streamer");
    assert_eq!(origin.client_seq, handle.client_seq);
    assert_eq!(chat_envs[0].rejection_reason, None);
    assert!(chat_envs[1..].iter().all(|e| e.origin.is_none()));

    let deltas: String = chat_envs
        .iter()
        .filter(|e| action_type(e) == "chat/delta")
        .map(|e| {
            payload(e)["content"]
                .as_str()
                .expect("delta content")
                .to_string()
        })
        .collect();
    assert_eq!(deltas.len(), 60);
    let reduced = reduce_chat(&chat_snap["state"], chat, &envs);
    assert_eq!(
        reduced["turns"][0]["responseParts"][0]["content"],
        json!(deltas)
    );
    assert_eq!(host.channel_state(chat), Some(reduced));

    let statuses: Vec<Value> = on(&envs, session)
        .iter()
        .filter(|e| action_type(e) == "session/chatUpdated")
        .map(payload)
        .filter(|p| p["chat"] == chat)
        .filter_map(|p| p["changes"].get("status").cloned())
        .collect();
    assert_eq!(statuses, [json!(8), json!(1)], "in-progress then idle");
    let session_state = reduce_session(&session_snap["state"], session, &envs);
    assert_eq!(host.channel_state(session), Some(session_state));
}

/// Scenario 2: of two racing `chat/turnStarted`, exactly one is accepted and both clients converge on the host's state.
#[tokio::test]
async fn racing_turn_starts_accept_exactly_one() {
    let host = start_host(config("race", script(10, 8, 40))).await;
    let chat = main_chat("race");
    let a = connect_init(&host.url(), "racer-a").await;
    let b = connect_init(&host.url(), "racer-b").await;
    let (mut ea, mut eb) = (a.events(), b.events());
    let snap_a = subscribe_raw(&a, &chat).await;
    let snap_b = subscribe_raw(&b, &chat).await;
    let (ha, hb) = tokio::join!(
        a.dispatch(chat.clone(), turn_started("race-a", "from a")),
        b.dispatch(chat.clone(), turn_started("race-b", "from b")),
    );
    let (ha, hb) = (ha.expect("dispatch a"), hb.expect("dispatch b"));
    let mut envs_a = actions_until(&mut ea, |e| is(e, &chat, "chat/turnComplete")).await;
    envs_a.extend(drain_actions(&a, &mut ea).await);
    let mut envs_b = actions_until(&mut eb, |e| is(e, &chat, "chat/turnComplete")).await;
    envs_b.extend(drain_actions(&b, &mut eb).await);

    let echoes: Vec<&ActionEnvelope> = envs_a.iter().filter(|e| e.origin.is_some()).collect();
    assert_eq!(echoes.len(), 2, "both dispatches echoed");
    assert!(echoes.iter().any(|e| is_echo(e, "racer-a", ha.client_seq)));
    assert!(echoes.iter().any(|e| is_echo(e, "racer-b", hb.client_seq)));
    let accepted: Vec<_> = echoes
        .iter()
        .filter(|e| e.rejection_reason.is_none())
        .collect();
    let rejected: Vec<_> = echoes
        .iter()
        .filter(|e| e.rejection_reason.is_some())
        .collect();
    assert_eq!((accepted.len(), rejected.len()), (1, 1));
    let reason = rejected[0].rejection_reason.as_deref().unwrap_or_default();
    assert!(reason.contains("active turn"), "reason: {reason}");
    assert_eq!(to_json(&on(&envs_a, &chat)), to_json(&on(&envs_b, &chat)));

    let ra = reduce_chat(&snap_a["state"], &chat, &envs_a);
    let rb = reduce_chat(&snap_b["state"], &chat, &envs_b);
    assert_eq!(ra, rb);
    assert_eq!(ra["turns"].as_array().map(Vec::len), Some(1));
    assert_eq!(ra["turns"][0]["id"], payload(accepted[0])["turnId"]);
    assert_eq!(host.channel_state(&chat), Some(ra));
}

/// Runs a tool-confirmation turn up to the paused tool call; returns (envelopes, snapshot, tool call id).
async fn paused_tool_turn(
    host: &ahp_relay::simhost::SimHost,
    client: &Client,
    events: &mut ahp::ClientEventStream,
    chat: &str,
) -> (Vec<ActionEnvelope>, Value, String) {
    let snap = subscribe_raw(client, chat).await;
    client
        .dispatch(chat.into(), turn_started("tool-turn", "run the tests"))
        .await
        .expect("dispatch");
    let envs = actions_until(events, |e| is(e, chat, "chat/toolCallReady")).await;
    let pending = reduce_chat(&snap["state"], chat, &envs);
    let tc = tool_call(&pending);
    assert_eq!(tc["status"], "pending-confirmation");
    assert_eq!(
        pending["status"], 24,
        "chat needs input while confirmation is pending"
    );
    assert_eq!(host.channel_state(chat), Some(pending));
    let idle = actions_within(events, Duration::from_millis(300)).await;
    assert!(
        idle.is_empty(),
        "turn kept streaming while paused: {:?}",
        types(&idle)
    );
    let id = tc["toolCallId"].as_str().expect("toolCallId").to_string();
    (envs, snap, id)
}

/// Scenario 3a: a pending tool call pauses the turn; approving it runs, completes, then ends the turn.
#[tokio::test]
async fn approved_tool_call_runs_then_turn_completes() {
    let mut s = script(2, 8, 0);
    s.tool_confirmation = true;
    let host = start_host(config("toolok", s)).await;
    let chat = main_chat("toolok");
    let client = connect_init(&host.url(), "approver").await;
    let mut events = client.events();
    let (mut envs, snap, id) = paused_tool_turn(&host, &client, &mut events, &chat).await;
    let paused_len = envs.len();
    let h = client
        .dispatch(
            chat.clone(),
            action(
                json!({"type": "chat/toolCallConfirmed", "turnId": "tool-turn",
                "toolCallId": id, "approved": true}),
            ),
        )
        .await
        .expect("dispatch");
    envs.extend(actions_until(&mut events, |e| is(e, &chat, "chat/turnComplete")).await);
    let after = on(&envs[paused_len..], &chat);
    assert_eq!(
        types(&after),
        [
            "chat/toolCallConfirmed",
            "chat/toolCallComplete",
            "chat/turnComplete"
        ]
    );
    assert!(is_echo(&after[0], "approver", h.client_seq));
    assert_eq!(after[0].rejection_reason, None);
    let running = reduce_chat(&snap["state"], &chat, &envs[..paused_len + 1]);
    assert_eq!(tool_call(&running)["status"], "running");
    let completed = reduce_chat(&snap["state"], &chat, &envs[..paused_len + 2]);
    assert_eq!(tool_call(&completed)["status"], "completed");
    let done = reduce_chat(&snap["state"], &chat, &envs);
    assert!(done.get("activeTurn").is_none());
    assert_eq!(last_turn(&done)["state"], "complete");
    assert_eq!(tool_call(&done)["status"], "completed");
    assert_eq!(host.channel_state(&chat), Some(done));
}

/// Scenario 3b: denying a pending tool call cancels it and the turn still completes.
#[tokio::test]
async fn denied_tool_call_is_cancelled_and_turn_completes() {
    let mut s = script(2, 8, 0);
    s.tool_confirmation = true;
    let host = start_host(config("tooldeny", s)).await;
    let chat = main_chat("tooldeny");
    let client = connect_init(&host.url(), "denier").await;
    let mut events = client.events();
    let (mut envs, snap, id) = paused_tool_turn(&host, &client, &mut events, &chat).await;
    let paused_len = envs.len();
    let h = client
        .dispatch(
            chat.clone(),
            action(
                json!({"type": "chat/toolCallConfirmed", "turnId": "tool-turn",
                "toolCallId": id, "approved": false}),
            ),
        )
        .await
        .expect("dispatch");
    envs.extend(actions_until(&mut events, |e| is(e, &chat, "chat/turnComplete")).await);
    let after = on(&envs[paused_len..], &chat);
    assert_eq!(
        types(&after),
        ["chat/toolCallConfirmed", "chat/turnComplete"]
    );
    assert!(is_echo(&after[0], "denier", h.client_seq));
    assert_eq!(after[0].rejection_reason, None);
    let done = reduce_chat(&snap["state"], &chat, &envs);
    let tc = tool_call(&done);
    assert_eq!(tc["status"], "cancelled");
    assert_eq!(tc["reason"], "denied");
    assert_eq!(last_turn(&done)["state"], "complete");
    assert_eq!(host.channel_state(&chat), Some(done));
}

/// Scenario 4: an accepted `chat/turnCancelled` stops the stream and leaves the turn cancelled.
#[tokio::test]
async fn cancelled_turn_stops_streaming() {
    let host = start_host(config("cancel", script(40, 8, 50))).await;
    let chat = main_chat("cancel");
    let client = connect_init(&host.url(), "canceller").await;
    let mut events = client.events();
    let snap = subscribe_raw(&client, &chat).await;
    client
        .dispatch(chat.clone(), turn_started("cancel-me", "long answer"))
        .await
        .expect("dispatch");
    let mut envs = actions_until(&mut events, |e| is(e, &chat, "chat/delta")).await;
    let h = client
        .dispatch(
            chat.clone(),
            action(json!({"type": "chat/turnCancelled", "turnId": "cancel-me", "duration": 50})),
        )
        .await
        .expect("dispatch");
    envs.extend(actions_until(&mut events, |e| is_echo(e, "canceller", h.client_seq)).await);
    let echo = envs.last().expect("echo");
    assert_eq!(action_type(echo), "chat/turnCancelled");
    assert_eq!(echo.rejection_reason, None);
    let later = actions_within(&mut events, Duration::from_millis(300)).await;
    assert!(
        on(&later, &chat).is_empty(),
        "chat envelopes after the cancel: {:?}",
        types(&later)
    );
    let deltas = envs.iter().filter(|e| is(e, &chat, "chat/delta")).count();
    assert!(deltas < 40, "the stream was cut short ({deltas} deltas)");
    let state = host.channel_state(&chat).expect("chat exists");
    assert!(state.get("activeTurn").is_none());
    assert_eq!(last_turn(&state)["id"], "cancel-me");
    assert_eq!(last_turn(&state)["state"], "cancelled");
    assert_eq!(reduce_chat(&snap["state"], &chat, &envs), state);
}

/// Scenario 5a: a message queued during a turn is consumed when it ends (removed, then started with `queuedMessageId`).
#[tokio::test]
async fn queued_message_starts_next_turn_after_active_one() {
    let host = start_host(config("queue", script(10, 8, 50))).await;
    let chat = main_chat("queue");
    let client = connect_init(&host.url(), "queuer").await;
    let mut events = client.events();
    let snap = subscribe_raw(&client, &chat).await;
    client
        .dispatch(chat.clone(), turn_started("first", "one"))
        .await
        .expect("dispatch");
    let mut envs = actions_until(&mut events, |e| is(e, &chat, "chat/delta")).await;
    let h = client
        .dispatch(
            chat.clone(),
            action(
                json!({"type": "chat/pendingMessageSet", "kind": "queued", "id": "q-1",
                "message": user_message("next please")}),
            ),
        )
        .await
        .expect("dispatch");
    envs.extend(
        actions_until(&mut events, |e| {
            is(e, &chat, "chat/turnComplete") && payload(e)["turnId"] != "first"
        })
        .await,
    );
    envs.extend(drain_actions(&client, &mut events).await);
    let chat_envs = on(&envs, &chat);
    let set = chat_envs
        .iter()
        .position(|e| is_echo(e, "queuer", h.client_seq))
        .expect("pendingMessageSet echoed");
    assert_eq!(chat_envs[set].rejection_reason, None);
    let first_done = chat_envs
        .iter()
        .position(|e| action_type(e) == "chat/turnComplete" && payload(e)["turnId"] == "first")
        .expect("first turn completes");
    assert!(set < first_done);
    let removed = &chat_envs[first_done + 1];
    assert_eq!(
        payload(removed),
        json!({"type": "chat/pendingMessageRemoved", "kind": "queued", "id": "q-1"})
    );
    assert!(removed.origin.is_none());
    let started = &chat_envs[first_done + 2];
    let p = payload(started);
    assert_eq!(p["type"], "chat/turnStarted");
    assert_eq!(p["queuedMessageId"], "q-1");
    assert_eq!(p["message"]["text"], "next please");
    assert!(started.origin.is_none());
    let mut rest = vec!["chat/responsePart".to_string()];
    rest.extend(std::iter::repeat_n("chat/delta".to_string(), 10));
    rest.push("chat/turnComplete".into());
    assert_eq!(types(&chat_envs[first_done + 3..]), rest);
    assert!(
        chat_envs[first_done + 3..]
            .iter()
            .all(|e| payload(e)["turnId"] == p["turnId"])
    );
    let reduced = reduce_chat(&snap["state"], &chat, &envs);
    assert_eq!(reduced["turns"].as_array().map(Vec::len), Some(2));
    assert_eq!(reduced["turns"][1]["message"]["text"], "next please");
    assert!(reduced.get("queuedMessages").is_none());
    assert_eq!(host.channel_state(&chat), Some(reduced));
}

/// Scenario 5b: a message queued on an idle chat starts a turn at once.
#[tokio::test]
async fn queued_message_on_idle_chat_starts_turn_immediately() {
    let host = start_host(config("idleq", script(3, 8, 0))).await;
    let chat = main_chat("idleq");
    let client = connect_init(&host.url(), "idler").await;
    let mut events = client.events();
    let snap = subscribe_raw(&client, &chat).await;
    let h = client
        .dispatch(
            chat.clone(),
            action(
                json!({"type": "chat/pendingMessageSet", "kind": "queued", "id": "q-idle",
                "message": user_message("go")}),
            ),
        )
        .await
        .expect("dispatch");
    let envs = actions_until(&mut events, |e| is(e, &chat, "chat/turnComplete")).await;
    let chat_envs = on(&envs, &chat);
    let mut expected = vec![
        "chat/pendingMessageSet",
        "chat/pendingMessageRemoved",
        "chat/turnStarted",
        "chat/responsePart",
    ];
    expected.extend(["chat/delta"; 3]);
    expected.push("chat/turnComplete");
    assert_eq!(types(&chat_envs), expected);
    assert!(is_echo(&chat_envs[0], "idler", h.client_seq));
    assert_eq!(chat_envs[0].rejection_reason, None);
    assert_eq!(payload(&chat_envs[1])["id"], "q-idle");
    assert_eq!(payload(&chat_envs[2])["queuedMessageId"], "q-idle");
    let reduced = reduce_chat(&snap["state"], &chat, &envs);
    assert_eq!(last_turn(&reduced)["message"]["text"], "go");
    assert_eq!(host.channel_state(&chat), Some(reduced));
}

/// Scenario 6: reconnecting within the log replays exactly the missed chat envelopes, rejected echoes included.
#[tokio::test]
async fn reconnect_within_log_replays_missed_envelopes() {
    let host = start_host(config("replay", script(6, 8, 50))).await;
    let chat = main_chat("replay");
    let a = connect_init(&host.url(), "phone").await;
    let mut ea = a.events();
    let snap = subscribe_raw(&a, &chat).await;
    a.dispatch(chat.clone(), turn_started("before-drop", "first"))
        .await
        .expect("dispatch");
    let mut a_envs = actions_until(&mut ea, |e| is(e, &chat, "chat/turnComplete")).await;
    a_envs.extend(drain_actions(&a, &mut ea).await);
    let watermark = a_envs
        .iter()
        .map(|e| e.server_seq)
        .max()
        .expect("A saw envelopes");
    let a_state = reduce_chat(&snap["state"], &chat, &a_envs);
    assert_eq!(host.drop_client("phone"), 1);
    wait_closed(&mut ea).await;
    wait_until("host detaches A", || host.connections() == 0).await;

    let b = connect_init(&host.url(), "desktop").await;
    let mut eb = b.events();
    subscribe_raw(&b, &chat).await;
    let h1 = b
        .dispatch(chat.clone(), turn_started("while-away", "second"))
        .await
        .expect("dispatch");
    let mut b_envs = actions_until(&mut eb, |e| is_echo(e, "desktop", h1.client_seq)).await;
    let h2 = b
        .dispatch(chat.clone(), turn_started("too-early", "third"))
        .await
        .expect("dispatch");
    b_envs.extend(actions_until(&mut eb, |e| is_echo(e, "desktop", h2.client_seq)).await);
    assert!(b_envs.last().is_some_and(|e| e.rejection_reason.is_some()));
    b_envs.extend(actions_until(&mut eb, |e| is(e, &chat, "chat/turnComplete")).await);
    b_envs.extend(drain_actions(&b, &mut eb).await);

    let a2 = connect(&host.url()).await;
    let result = reconnect_raw(&a2, "phone", watermark, &[&chat]).await;
    assert_eq!(result["type"], "replay", "{result}");
    assert_eq!(result["missing"], json!([]));
    let replayed: Vec<ActionEnvelope> =
        serde_json::from_value(result["actions"].clone()).expect("actions are envelopes");
    assert!(replayed.first().is_some_and(|e| e.server_seq > watermark));
    assert_strictly_increasing(&replayed);
    assert_eq!(to_json(&replayed), to_json(&on(&b_envs, &chat)));
    let rejected: Vec<_> = replayed
        .iter()
        .filter(|e| e.rejection_reason.is_some())
        .collect();
    assert_eq!(rejected.len(), 1);
    assert!(is_echo(rejected[0], "desktop", h2.client_seq));
    assert_eq!(
        host.channel_state(&chat),
        Some(reduce_chat(&a_state, &chat, &replayed))
    );
}

/// Scenario 7: a gap older than the replay log is answered with a fresh snapshot.
#[tokio::test]
async fn reconnect_past_log_gets_snapshot() {
    let mut cfg = config("shortlog", script(6, 8, 0));
    cfg.replay_log = 4;
    let host = start_host(cfg).await;
    let chat = main_chat("shortlog");
    let a = connect_init(&host.url(), "phone").await;
    let mut ea = a.events();
    let watermark = snapshot_from_seq(&subscribe_raw(&a, &chat).await);
    host.drop_client("phone");
    wait_closed(&mut ea).await;
    // Control: with no gap the same client resumes by replay.
    let a2 = connect(&host.url()).await;
    let mut ea2 = a2.events();
    let control = reconnect_raw(&a2, "phone", watermark, &[&chat]).await;
    assert_eq!(
        control,
        json!({"type": "replay", "actions": [], "missing": []})
    );
    assert_eq!(host.drop_client("phone"), 1);
    wait_closed(&mut ea2).await;

    let b = connect_init(&host.url(), "desktop").await;
    let mut eb = b.events();
    subscribe_raw(&b, &chat).await;
    b.dispatch(chat.clone(), turn_started("gap", "long gap"))
        .await
        .expect("dispatch");
    actions_until(&mut eb, |e| is(e, &chat, "chat/turnComplete")).await;
    drain_actions(&b, &mut eb).await;
    assert!(
        host.server_seq() > watermark + 4,
        "more than the log was emitted"
    );

    let a3 = connect(&host.url()).await;
    let result = reconnect_raw(&a3, "phone", watermark, &[&chat]).await;
    assert_eq!(result["type"], "snapshot", "{result}");
    let snaps = result["snapshots"].as_array().expect("snapshots");
    assert_eq!(snaps.len(), 1);
    assert_eq!(snaps[0]["resource"], json!(chat));
    assert_eq!(snapshot_from_seq(&snaps[0]), host.server_seq());
    assert_eq!(host.channel_state(&chat), Some(snaps[0]["state"].clone()));
}

/// Scenario 8: a channel this process never baselined for the client forces a snapshot.
#[tokio::test]
async fn reconnect_with_unbaselined_channel_gets_snapshot() {
    let host = start_host(config("baseline", script(2, 8, 0))).await;
    let (session, chat) = (main_session("baseline"), main_chat("baseline"));
    let a = connect_init(&host.url(), "phone").await;
    let mut ea = a.events();
    let watermark = snapshot_from_seq(&subscribe_raw(&a, &session).await);
    host.drop_client("phone");
    wait_closed(&mut ea).await;
    // Control: the baselined session alone resumes by replay.
    let a2 = connect(&host.url()).await;
    let mut ea2 = a2.events();
    let control = reconnect_raw(&a2, "phone", watermark, &[&session]).await;
    assert_eq!(
        control,
        json!({"type": "replay", "actions": [], "missing": []})
    );
    assert_eq!(host.drop_client("phone"), 1);
    wait_closed(&mut ea2).await;

    let a3 = connect(&host.url()).await;
    let result = reconnect_raw(&a3, "phone", watermark, &[&session, &chat]).await;
    assert_eq!(result["type"], "snapshot", "{result}");
    let snaps = result["snapshots"].as_array().expect("snapshots");
    let resources: Vec<&Value> = snaps.iter().map(|s| &s["resource"]).collect();
    assert_eq!(resources, [&json!(session), &json!(chat)]);
    assert_eq!(
        host.channel_state(&session),
        Some(snaps[0]["state"].clone())
    );
    assert_eq!(host.channel_state(&chat), Some(snaps[1]["state"].clone()));
}

/// Scenario 9a: `restart(true)` closes sockets (1012), forgets clients (-32008), restarts numbering at 0 and keeps sessions.
#[tokio::test]
async fn restart_keeping_state_forgets_clients_and_numbering() {
    let host = start_host(config("restart", script(2, 8, 0))).await;
    let mut a = RawWs::connect(&host.url()).await;
    assert!(a.initialize("phone").await.get("result").is_some());
    let created = a
        .request(1, "createSession", json!({"channel": "ahp-session:/kept"}))
        .await;
    assert_eq!(created["result"], Value::Null, "{created}");
    let sub = a
        .request(2, "subscribe", json!({"channel": "ahp-session:/kept"}))
        .await;
    let watermark = sub["result"]["snapshot"]["fromSeq"]
        .as_u64()
        .expect("fromSeq");
    assert!(watermark > 0);
    host.restart(true);
    assert_eq!(a.close_code().await.map(|c| c.0), Some(1012));
    assert_eq!(host.server_seq(), 0);

    let mut b = RawWs::connect(&host.url()).await;
    let rejected = b
        .request(
            1,
            "reconnect",
            json!({"channel": ROOT, "clientId": "phone", "lastSeenServerSeq": watermark,
                "subscriptions": ["ahp-session:/kept"]}),
        )
        .await;
    assert_eq!(rejected["error"]["code"], -32008, "{rejected}");
    let init = b.initialize("phone").await;
    assert_eq!(init["result"]["serverSeq"], 0, "{init}");
    let list = b.request(2, "listSessions", json!({"channel": ROOT})).await;
    let mut uris: Vec<&str> = list["result"]["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|s| s["resource"].as_str())
        .collect();
    uris.sort_unstable();
    assert_eq!(uris, ["ahp-session:/kept", "ahp-session:/restart-1"]);
}

/// Scenario 9b: `restart(false)` comes back with only the seeded state.
#[tokio::test]
async fn restart_without_state_reseeds() {
    let host = start_host(config("reseed", script(2, 8, 0))).await;
    let client = connect_init(&host.url(), "phone").await;
    client
        .request::<_, ()>("createSession", json!({"channel": "ahp-session:/gone"}))
        .await
        .expect("createSession");
    assert!(host.channel_state("ahp-session:/gone").is_some());
    host.restart(false);
    assert!(host.channel_state("ahp-session:/gone").is_none());
    let again = connect_init(&host.url(), "phone").await;
    let list: Value = again
        .request("listSessions", json!({"channel": ROOT}))
        .await
        .expect("listSessions");
    let uris: Vec<&Value> = list["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|s| &s["resource"])
        .collect();
    assert_eq!(uris, [&json!("ahp-session:/reseed-1")]);
}

/// Starts a slow turn on `<name>`'s chat and restarts the host (keeping state) mid-stream.
async fn restart_mid_turn(name: &str) -> ahp_relay::simhost::SimHost {
    let host = start_host(config(name, script(40, 8, 50))).await;
    let chat = main_chat(name);
    let client = connect_init(&host.url(), "phone").await;
    let mut events = client.events();
    subscribe_raw(&client, &chat).await;
    client
        .dispatch(chat.clone(), turn_started("interrupted", "long"))
        .await
        .expect("dispatch");
    actions_until(&mut events, |e| is(e, &chat, "chat/delta")).await;
    assert!(
        host.channel_state(&chat)
            .is_some_and(|c| c.get("activeTurn").is_some())
    );
    host.restart(true);
    host
}

/// Scenario 9c: a turn active at `restart(true)` ends cancelled and its agent stops.
#[tokio::test]
async fn restart_cancels_active_turn() {
    let host = restart_mid_turn("midturn").await;
    let state = host
        .channel_state(&main_chat("midturn"))
        .expect("chat kept");
    assert!(state.get("activeTurn").is_none());
    assert_eq!(last_turn(&state)["id"], "interrupted");
    assert_eq!(last_turn(&state)["state"], "cancelled");
    assert_eq!(state["status"], 1, "chat idle");
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(host.server_seq(), 0, "the agent stopped emitting");
}

/// Scenario 9c': after a restart cancels a turn, the session's chat catalog agrees with the chat (not stuck in progress).
#[tokio::test]
async fn restart_keeps_session_catalog_in_step_with_cancelled_turn() {
    let host = restart_mid_turn("catalog").await;
    let chat = host
        .channel_state(&main_chat("catalog"))
        .expect("chat kept");
    let session = host
        .channel_state(&main_session("catalog"))
        .expect("session kept");
    let entry = session["chats"]
        .as_array()
        .and_then(|c| {
            c.iter()
                .find(|c| c["resource"] == json!(main_chat("catalog")))
        })
        .cloned()
        .expect("chat listed in session");
    assert_eq!(entry["status"], chat["status"], "session catalog: {entry}");
}

/// Scenario 10a: a client-claimed terminal is announced on root, echoes input and streams data matching the host.
#[tokio::test]
async fn terminal_input_is_echoed_and_answered_with_data() {
    let host = start_host(config("term", script(2, 8, 0))).await;
    let t1 = "ahp-terminal:/t1";
    let client = connect_init(&host.url(), "term-owner").await;
    let mut events = client.events();
    let root_snap = subscribe_raw(&client, ROOT).await;
    let claim = json!({"kind": "client", "clientId": "term-owner"});
    client
        .request::<_, ()>("createTerminal", json!({"channel": t1, "claim": claim}))
        .await
        .expect("createTerminal");
    let root_envs = actions_until(&mut events, |e| is(e, ROOT, "root/terminalsChanged")).await;
    let listed = payload(root_envs.last().expect("terminalsChanged"))["terminals"].clone();
    let listed = listed.as_array().expect("terminals");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["resource"], t1);
    assert_eq!(listed[0]["claim"], claim);
    assert_eq!(
        host.channel_state(ROOT),
        Some(reduce_root(&root_snap["state"], &root_envs))
    );

    let t_snap = subscribe_raw(&client, t1).await;
    let h = client
        .dispatch(
            t1.into(),
            action(json!({"type": "terminal/input", "data": "ls\n"})),
        )
        .await
        .expect("dispatch");
    let envs = actions_until(&mut events, |e| is(e, t1, "terminal/data")).await;
    let t_envs = on(&envs, t1);
    assert_eq!(types(&t_envs), ["terminal/input", "terminal/data"]);
    assert!(is_echo(&t_envs[0], "term-owner", h.client_seq));
    assert_eq!(t_envs[0].rejection_reason, None);
    assert_eq!(
        payload(&t_envs[1]),
        json!({"type": "terminal/data", "data": "ls\n"})
    );
    assert!(t_envs[1].origin.is_none());
    let reduced = reduce_terminal(&t_snap["state"], t1, &envs);
    assert_eq!(
        reduced["content"],
        json!([{"type": "unclassified", "value": "ls\n"}])
    );
    assert_eq!(host.channel_state(t1), Some(reduced));
}

/// Scenario 10b: `createTerminal` with a claim naming another client is refused with -32602.
#[tokio::test]
async fn terminal_claim_for_another_client_is_invalid_params() {
    let host = start_host(config("termclaim", script(2, 8, 0))).await;
    let client = connect_init(&host.url(), "me").await;
    let err = client
        .request::<_, ()>(
            "createTerminal",
            json!({"channel": "ahp-terminal:/t2", "claim": {"kind": "client", "clientId": "someone-else"}}),
        )
        .await
        .expect_err("claim for another client refused");
    assert_eq!(rpc_code(err), -32602);
    assert!(host.channel_state("ahp-terminal:/t2").is_none());
}

async fn session_added_seen(vscode_compat: bool, name: &str) -> (bool, bool) {
    let mut cfg = config(name, script(2, 8, 0));
    cfg.vscode_compat = vscode_compat;
    let host = start_host(cfg).await;
    let mut plain = RawWs::connect(&host.url()).await;
    plain.initialize("plain").await;
    let mut rooted = RawWs::connect(&host.url()).await;
    rooted.initialize("rooted").await;
    let sub = rooted
        .request(1, "subscribe", json!({"channel": ROOT}))
        .await;
    assert!(sub["result"]["snapshot"].is_object(), "{sub}");
    let creator = connect_init(&host.url(), "creator").await;
    let session = format!("ahp-session:/{name}-new");
    creator
        .request::<_, ()>("createSession", json!({"channel": session}))
        .await
        .expect("createSession");
    let plain_frames = frames_before_ping(&mut plain, 7).await;
    let rooted_frames = frames_before_ping(&mut rooted, 7).await;
    (
        has_session_added(&plain_frames, &session),
        has_session_added(&rooted_frames, &session),
    )
}

/// Scenario 11a: in VS Code mode an initialized connection gets `root/sessionAdded` without subscribing to root.
#[tokio::test]
async fn vscode_mode_sends_session_added_to_every_connection() {
    assert_eq!(session_added_seen(true, "vscadd").await, (true, true));
}

/// Scenario 11b: by default only root subscribers get `root/sessionAdded` (absence proven by ping ordering).
#[tokio::test]
async fn default_mode_sends_session_added_only_to_root_subscribers() {
    assert_eq!(session_added_seen(false, "defadd").await, (false, true));
}

/// Scenario 11c: in VS Code mode two live sockets may share one clientId.
#[tokio::test]
async fn vscode_mode_allows_shared_client_id() {
    let mut cfg = config("vscdup", script(2, 8, 0));
    cfg.vscode_compat = true;
    let host = start_host(cfg).await;
    let mut first = RawWs::connect(&host.url()).await;
    assert!(first.initialize("dup").await.get("result").is_some());
    let mut second = RawWs::connect(&host.url()).await;
    assert!(second.initialize("dup").await.get("result").is_some());
    assert!(frames_before_ping(&mut first, 5).await.is_empty());
    assert!(frames_before_ping(&mut second, 5).await.is_empty());
    assert_eq!(host.connections(), 2);
}

/// Scenario 11d: by default a second socket with the same clientId closes the older one with 4009.
#[tokio::test]
async fn default_mode_supersedes_older_socket_of_client_id() {
    let host = start_host(config("defdup", script(2, 8, 0))).await;
    let mut first = RawWs::connect(&host.url()).await;
    assert!(first.initialize("dup").await.get("result").is_some());
    let mut second = RawWs::connect(&host.url()).await;
    assert!(second.initialize("dup").await.get("result").is_some());
    assert_eq!(first.close_code().await.map(|c| c.0), Some(4009));
    assert!(frames_before_ping(&mut second, 5).await.is_empty());
}

/// Scenario 12: frames queued while the host is stalled are delivered in order, without gaps, once it resumes.
#[tokio::test]
async fn stalled_frames_are_delivered_in_order_after_resume() {
    let host = start_host(config("stall", script(12, 8, 40))).await;
    let (session, chat) = (main_session("stall"), main_chat("stall"));
    let a = connect_init(&host.url(), "watcher").await;
    let mut ea = a.events();
    let chat_snap = subscribe_raw(&a, &chat).await;
    let session_snap = subscribe_raw(&a, &session).await;
    let baseline = snapshot_from_seq(&session_snap);
    assert_eq!(snapshot_from_seq(&chat_snap), baseline);
    let b = connect_init(&host.url(), "driver").await;
    b.dispatch(chat.clone(), turn_started("stalled-turn", "go"))
        .await
        .expect("dispatch");
    let active = || {
        host.channel_state(&chat)
            .is_some_and(|c| c.get("activeTurn").is_some())
    };
    wait_until("the host accepts the turn", active).await;
    host.set_stalled(true);
    assert!(
        active(),
        "the turn is still streaming when the stall begins"
    );
    wait_until("the turn completes on the host", || !active()).await;
    let during = actions_within(&mut ea, Duration::from_millis(200)).await;
    assert!(
        !during.iter().any(|e| is(e, &chat, "chat/turnComplete")),
        "delivered while stalled: {:?}",
        types(&during)
    );
    host.set_stalled(false);
    let mut envs = during;
    envs.extend(actions_until(&mut ea, |e| is(e, &chat, "chat/turnComplete")).await);
    envs.extend(drain_actions(&a, &mut ea).await);
    let seqs: Vec<u64> = envs.iter().map(|e| e.server_seq).collect();
    let expected: Vec<u64> = (baseline + 1..=host.server_seq()).collect();
    assert_eq!(seqs, expected, "every envelope, in order, no gap");
    assert_eq!(
        host.channel_state(&chat),
        Some(reduce_chat(&chat_snap["state"], &chat, &envs))
    );
    assert_eq!(
        host.channel_state(&session),
        Some(reduce_session(&session_snap["state"], &session, &envs))
    );
}

/// The delta sizes of three consecutive turns on a fresh seeded host.
async fn seeded_turn_shapes(name: &str, seed: u64) -> Vec<Vec<usize>> {
    let s = AgentScript {
        seed: Some(seed),
        ..script(4, 8, 0)
    };
    let host = start_host(config(name, s)).await;
    let chat = main_chat(name);
    let client = connect_init(&host.url(), "seeder").await;
    let mut events = client.events();
    subscribe_raw(&client, &chat).await;
    let mut shapes = Vec::new();
    for i in 0..3 {
        client
            .dispatch(chat.clone(), turn_started(&format!("seeded-{i}"), "again"))
            .await
            .expect("dispatch");
        let envs = actions_until(&mut events, |e| is(e, &chat, "chat/turnComplete")).await;
        shapes.push(
            envs.iter()
                .filter(|e| is(e, &chat, "chat/delta"))
                .map(|e| payload(e)["content"].as_str().map_or(0, str::len))
                .collect(),
        );
    }
    host.shutdown().await;
    shapes
}

/// Scenario 13: the same seed reproduces the same turn shapes; another seed gives different ones.
#[tokio::test]
async fn seeded_agent_is_deterministic_per_seed() {
    let a = seeded_turn_shapes("seeda", 7).await;
    let b = seeded_turn_shapes("seedb", 7).await;
    let c = seeded_turn_shapes("seedc", 8).await;
    assert_eq!(a, b);
    assert_ne!(a, c);
    for turn in a.iter().chain(&c) {
        assert!((1..=8).contains(&turn.len()), "delta count {}", turn.len());
        assert!(turn.iter().all(|n| (1..=16).contains(n)), "sizes {turn:?}");
    }
    assert_ne!(
        a,
        vec![vec![8; 4]; 3],
        "seeded shapes differ from the fixed script"
    );
}

// ─── Client-contributed tools (src/simhost/README.md "Client tools") ────────

const CLIENT_TOOL: &str = "read_tab";

fn active_client_set(client_id: &str) -> StateAction {
    action(json!({"type": "session/activeClientSet", "activeClient": {
        "clientId": client_id, "displayName": "Test client",
        "tools": [{"name": CLIENT_TOOL, "title": "Read the open tab"}]}}))
}

fn tool_complete(turn_id: &str, tool_call_id: &str, success: bool) -> StateAction {
    action(json!({"type": "chat/toolCallComplete", "turnId": turn_id,
        "toolCallId": tool_call_id,
        "result": {"success": success, "pastTenseMessage": "Read the open tab"}}))
}

fn active_client_ids(session: &Value) -> Vec<String> {
    session["activeClients"]
        .as_array()
        .expect("activeClients")
        .iter()
        .filter_map(|c| c["clientId"].as_str().map(str::to_string))
        .collect()
}

/// A host whose one chat runs a turn that calls client tool `read_tab` of
/// the `runner` client, up to the call running.
struct ClientToolRun {
    host: ahp_relay::simhost::SimHost,
    runner: Client,
    events: ahp::ClientEventStream,
    session: String,
    chat: String,
    chat_snap: Value,
    envs: Vec<ActionEnvelope>,
    turn_id: String,
    tool_call_id: String,
}

async fn running_client_tool(name: &str, grace_ms: u64) -> ClientToolRun {
    let mut cfg = config(name, script(2, 8, 0));
    cfg.client_tool_grace_ms = grace_ms;
    let host = start_host(cfg).await;
    let (session, chat) = (main_session(name), main_chat(name));
    let runner = connect_init(&host.url(), "runner").await;
    let mut events = runner.events();
    subscribe_raw(&runner, &session).await;
    let chat_snap = subscribe_raw(&runner, &chat).await;
    let set = runner
        .dispatch(session.clone(), active_client_set("runner"))
        .await
        .expect("dispatch");
    let echo = actions_until(&mut events, |e| is_echo(e, "runner", set.client_seq)).await;
    assert_eq!(echo.last().and_then(|e| e.rejection_reason.clone()), None);
    let turn_id = format!("{name}-turn");
    runner
        .dispatch(
            chat.clone(),
            turn_started(&turn_id, &format!("check [client-tool:{CLIENT_TOOL}]")),
        )
        .await
        .expect("dispatch");
    let envs = actions_until(&mut events, |e| is(e, &chat, "chat/toolCallReady")).await;
    let start = envs
        .iter()
        .find(|e| is(e, &chat, "chat/toolCallStart"))
        .map(payload)
        .expect("toolCallStart");
    assert_eq!(start["toolName"], CLIENT_TOOL);
    assert_eq!(start["displayName"], "Read the open tab");
    assert_eq!(
        start["contributor"],
        json!({"kind": "client", "clientId": "runner"})
    );
    let running = reduce_chat(&chat_snap["state"], &chat, &envs);
    let tc = tool_call(&running);
    assert_eq!(
        tc["status"], "running",
        "auto-confirmed for its client: {tc}"
    );
    assert_eq!(host.channel_state(&chat), Some(running));
    let tool_call_id = tc["toolCallId"].as_str().expect("toolCallId").to_string();
    ClientToolRun {
        host,
        runner,
        events,
        session,
        chat,
        chat_snap,
        envs,
        turn_id,
        tool_call_id,
    }
}

impl ClientToolRun {
    /// Dispatches a successful `chat/toolCallComplete` of the run's call
    /// from `client`.
    async fn complete_from(&self, client: &Client) -> ahp::DispatchHandle {
        client
            .dispatch(
                self.chat.clone(),
                tool_complete(&self.turn_id, &self.tool_call_id, true),
            )
            .await
            .expect("dispatch")
    }
}

/// The running client tool call on the host, if the turn still has one.
fn host_tool_status(host: &ahp_relay::simhost::SimHost, chat: &str) -> Option<String> {
    let state = host.channel_state(chat)?;
    state.get("activeTurn")?;
    tool_call(&state)["status"].as_str().map(str::to_string)
}

/// Client tools 1: a message with `[client-tool:read_tab]` makes the agent call the tool of the active client offering it (contributor = that client, running at once); the turn waits for it, and the contributor's `chat/toolCallComplete` is accepted and ends the turn.
#[tokio::test]
async fn client_tool_call_waits_for_and_is_completed_by_its_contributor() {
    let mut run = running_client_tool("ctool", 3000).await;
    let chat = run.chat.clone();
    let idle = actions_within(&mut run.events, Duration::from_millis(300)).await;
    assert!(
        idle.is_empty(),
        "the turn waits for the client: {:?}",
        types(&idle)
    );
    let h = run.complete_from(&run.runner).await;
    let paused_len = run.envs.len();
    let mut envs = run.envs;
    envs.extend(actions_until(&mut run.events, |e| is(e, &chat, "chat/turnComplete")).await);
    let after = on(&envs[paused_len..], &chat);
    assert_eq!(
        types(&after),
        ["chat/toolCallComplete", "chat/turnComplete"]
    );
    assert!(is_echo(&after[0], "runner", h.client_seq));
    assert_eq!(after[0].rejection_reason, None);
    let done = reduce_chat(&run.chat_snap["state"], &chat, &envs);
    let tc = tool_call(&done);
    assert_eq!(tc["status"], "completed");
    assert_eq!(tc["success"], true, "{tc}");
    assert_eq!(last_turn(&done)["state"], "complete");
    assert_eq!(run.host.channel_state(&chat), Some(done));
}

/// Client tools 2: another client's `chat/toolCallComplete` is echoed with a `rejectionReason` and leaves the call running; the contributor's own completion then succeeds.
#[tokio::test]
async fn client_tool_completion_by_another_client_is_rejected() {
    let mut run = running_client_tool("cthief", 3000).await;
    let chat = run.chat.clone();
    let thief = connect_init(&run.host.url(), "thief").await;
    let mut thief_events = thief.events();
    subscribe_raw(&thief, &chat).await;
    let h = run.complete_from(&thief).await;
    let echo = actions_until(&mut thief_events, |e| is_echo(e, "thief", h.client_seq)).await;
    let echo = echo.last().expect("echo");
    assert_eq!(action_type(echo), "chat/toolCallComplete");
    assert_eq!(
        echo.rejection_reason.as_deref(),
        Some("tool call is not contributed by the dispatching client")
    );
    assert_eq!(
        host_tool_status(&run.host, &chat).as_deref(),
        Some("running")
    );
    let mine = run.complete_from(&run.runner).await;
    let tail = actions_until(&mut run.events, |e| is(e, &chat, "chat/turnComplete")).await;
    let completes: Vec<&ActionEnvelope> = tail
        .iter()
        .filter(|e| is(e, &chat, "chat/toolCallComplete"))
        .collect();
    assert_eq!(
        completes.len(),
        2,
        "the rejected echo, then the accepted one"
    );
    assert!(completes[0].rejection_reason.is_some());
    assert!(is_echo(completes[1], "runner", mine.client_seq));
    assert_eq!(completes[1].rejection_reason, None);
    let mut envs = run.envs;
    envs.extend(tail);
    let done = reduce_chat(&run.chat_snap["state"], &chat, &envs);
    assert_eq!(tool_call(&done)["status"], "completed");
    assert_eq!(run.host.channel_state(&chat), Some(done));
}

/// Client tools 3: when the contributor's connection drops, nothing happens during `client_tool_grace_ms`; then the host removes it from `activeClients`, fails the call (`chat/toolCallComplete` with `success: false`, no origin) and the turn completes.
#[tokio::test]
async fn contributor_disconnect_fails_the_tool_call_after_the_grace() {
    const GRACE_MS: u64 = 600;
    let run = running_client_tool("cdrop", GRACE_MS).await;
    let (session, chat) = (run.session.clone(), run.chat.clone());
    let watcher = connect_init(&run.host.url(), "watcher").await;
    let mut events = watcher.events();
    let session_snap = subscribe_raw(&watcher, &session).await;
    assert_eq!(active_client_ids(&session_snap["state"]), ["runner"]);
    let chat_snap = subscribe_raw(&watcher, &chat).await;
    let dropped_at = std::time::Instant::now();
    assert_eq!(run.host.drop_client("runner"), 1);
    let quiet = actions_within(&mut events, Duration::from_millis(GRACE_MS / 2)).await;
    assert!(
        quiet.is_empty(),
        "nothing before the grace ends: {:?}",
        types(&quiet)
    );
    let mut envs = quiet;
    envs.extend(actions_until(&mut events, |e| is(e, &chat, "chat/turnComplete")).await);
    envs.extend(drain_actions(&watcher, &mut events).await);
    let failed_after = dropped_at.elapsed();
    assert!(
        failed_after >= Duration::from_millis(GRACE_MS),
        "failed after {failed_after:?}, before the {GRACE_MS} ms grace"
    );
    let order: Vec<String> = envs
        .iter()
        .filter(|e| {
            is(e, &session, "session/activeClientRemoved")
                || is(e, &chat, "chat/toolCallComplete")
                || is(e, &chat, "chat/turnComplete")
        })
        .map(action_type)
        .collect();
    assert_eq!(
        order,
        [
            "session/activeClientRemoved",
            "chat/toolCallComplete",
            "chat/turnComplete"
        ]
    );
    let fail = envs
        .iter()
        .find(|e| is(e, &chat, "chat/toolCallComplete"))
        .expect("failure");
    assert!(fail.origin.is_none(), "the host's own completion");
    assert_eq!(payload(fail)["result"]["success"], false);
    let done = reduce_chat(&chat_snap["state"], &chat, &envs);
    let tc = tool_call(&done);
    assert_eq!(tc["status"], "completed");
    assert_eq!(tc["success"], false, "{tc}");
    assert_eq!(last_turn(&done)["state"], "complete");
    assert_eq!(run.host.channel_state(&chat), Some(done));
    let session_now = reduce_session(&session_snap["state"], &session, &envs);
    assert!(active_client_ids(&session_now).is_empty());
    assert_eq!(run.host.channel_state(&session), Some(session_now));
}

/// Client tools 4: a contributor that drops and re-`initialize`s with the same clientId and `initialSubscriptions` within the grace keeps its running call (still running well after the grace, still active in the session) and completes it from the new connection.
#[tokio::test]
async fn contributor_reinitializing_within_the_grace_keeps_its_tool_call() {
    const GRACE_MS: u64 = 800;
    let mut run = running_client_tool("cback", GRACE_MS).await;
    let (session, chat) = (run.session.clone(), run.chat.clone());
    assert_eq!(run.host.drop_client("runner"), 1);
    wait_closed(&mut run.events).await;
    tokio::time::sleep(Duration::from_millis(GRACE_MS / 4)).await;
    let again = connect(&run.host.url()).await;
    let mut events = again.events();
    let init = again
        .initialize(
            "runner".into(),
            vec!["1.0.0".into()],
            vec![session.clone(), chat.clone()],
        )
        .await
        .expect("initialize again");
    assert_eq!(init.snapshots.len(), 2);
    let chat_snap = serde_json::to_value(
        init.snapshots
            .iter()
            .find(|s| s.resource == chat)
            .expect("chat snapshot"),
    )
    .expect("snapshot serializes");
    tokio::time::sleep(Duration::from_millis(GRACE_MS * 2)).await;
    assert_eq!(
        host_tool_status(&run.host, &chat).as_deref(),
        Some("running"),
        "kept past the grace"
    );
    let session_state = run.host.channel_state(&session).expect("session");
    assert_eq!(active_client_ids(&session_state), ["runner"]);
    let quiet = actions_within(&mut events, Duration::from_millis(50)).await;
    assert!(quiet.is_empty(), "nothing failed: {:?}", types(&quiet));
    let h = run.complete_from(&again).await;
    let envs = actions_until(&mut events, |e| is(e, &chat, "chat/turnComplete")).await;
    let complete = envs
        .iter()
        .find(|e| is(e, &chat, "chat/toolCallComplete"))
        .expect("completion echo");
    assert!(is_echo(complete, "runner", h.client_seq));
    assert_eq!(complete.rejection_reason, None);
    let done = reduce_chat(&chat_snap["state"], &chat, &envs);
    assert_eq!(tool_call(&done)["success"], true);
    assert_eq!(run.host.channel_state(&chat), Some(done));
}

/// Client tools 5: `unsubscribe` of the session removes the contributor from `activeClients` at once; its running call fails once the grace has passed.
#[tokio::test]
async fn contributor_unsubscribing_the_session_fails_the_tool_call_after_the_grace() {
    const GRACE_MS: u64 = 500;
    let mut run = running_client_tool("cleave", GRACE_MS).await;
    let (session, chat) = (run.session.clone(), run.chat.clone());
    let left_at = std::time::Instant::now();
    run.runner
        .notify("unsubscribe", json!({"channel": session}))
        .await
        .expect("unsubscribe");
    let envs = actions_until(&mut run.events, |e| is(e, &chat, "chat/turnComplete")).await;
    assert!(left_at.elapsed() >= Duration::from_millis(GRACE_MS));
    let fail = envs
        .iter()
        .find(|e| is(e, &chat, "chat/toolCallComplete"))
        .expect("failure");
    assert_eq!(payload(fail)["result"]["success"], false);
    assert!(active_client_ids(&run.host.channel_state(&session).expect("session")).is_empty());
    let mut all = run.envs;
    all.extend(envs);
    assert_eq!(
        run.host.channel_state(&chat),
        Some(reduce_chat(&run.chat_snap["state"], &chat, &all))
    );
}

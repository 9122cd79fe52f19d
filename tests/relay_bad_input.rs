//! The README's "Bad input" table, row by row over real sockets: each bad
//! input gets its defined answer (a close code or a JSON-RPC error), is
//! counted, and touches nobody else — another client on the same relay
//! keeps being answered. Rows already covered elsewhere are cited in the
//! table, not repeated here.

mod common;

use ahp_relay::devkit::DEV_ISSUER;
use ahp_relay::identity::PrincipalKey;
use common::relay::{TestRelay, admin_get, metric};
use common::*;
use serde_json::{Value, json};

const ROOT: &str = "ahp-root://";

async fn start() -> TestRelay {
    TestRelay::start(vec![fast_config("a", 2)], "").await
}

async fn metric_of(t: &TestRelay, name: &str) -> f64 {
    let (_, page) = admin_get(t, "/metrics").await;
    metric(&page, name).unwrap_or(0.0)
}

/// Another client, initialized before the bad input, still answers `ping`.
async fn bystander_answers(other: &mut RawWs, id: u64) {
    let r = other.request(id, "ping", json!({"channel": ROOT})).await;
    assert_eq!(r["result"], Value::Null, "the bystander is unaffected: {r}");
}

/// A text frame that is not UTF-8 closes that socket with 1007.
#[tokio::test]
async fn invalid_utf8_closes_1007() {
    let t = start().await;
    let mut other = t.raw("bob").await;
    other.initialize("o").await;
    let mut ws = t.raw("alice").await;
    ws.send_text_bytes(vec![b'{', 0xff, 0xfe, b'}']).await;
    assert_eq!(ws.close_code().await.map(|c| c.0), Some(1007));
    bystander_answers(&mut other, 1).await;
    let m = "ahp_relay_bad_client_frames_total{reason=\"invalid_utf8\"}";
    assert!(metric_of(&t, m).await >= 1.0);
}

/// `jsonrpc` other than "2.0" is -32600 with the request's id; the socket
/// stays open.
#[tokio::test]
async fn wrong_jsonrpc_version_is_32600() {
    let t = start().await;
    let mut ws = t.raw("alice").await;
    ws.send_text(r#"{"jsonrpc":"1.0","id":7,"method":"ping","params":{"channel":"ahp-root://"}}"#)
        .await;
    let r = ws.recv_json().await.expect("an answer");
    assert_eq!(r["error"]["code"], -32600, "{r}");
    assert_eq!(r["id"], 7, "{r}");
    let r = ws.request(8, "ping", json!({"channel": ROOT})).await;
    assert_eq!(r["result"], Value::Null, "{r}");
    let m = "ahp_relay_bad_client_frames_total{reason=\"bad_version\"}";
    assert!(metric_of(&t, m).await >= 1.0);
}

/// A response to an id the relay never sent is dropped and counted; the
/// socket stays usable.
#[tokio::test]
async fn responses_to_unknown_ids_are_dropped() {
    let t = start().await;
    let mut ws = t.raw("alice").await;
    ws.initialize("c").await;
    let before = metric_of(&t, "ahp_relay_client_notifications_dropped_total").await;
    for frame in [
        json!({"jsonrpc": "2.0", "id": 424242, "result": {}}),
        json!({"jsonrpc": "2.0", "id": "nope", "error": {"code": 1, "message": "x"}}),
    ] {
        ws.send_json(&frame).await;
    }
    let r = ws.request(1, "ping", json!({"channel": ROOT})).await;
    assert_eq!(r["result"], Value::Null, "{r}");
    let after = metric_of(&t, "ahp_relay_client_notifications_dropped_total").await;
    assert!(after >= before + 2.0, "{before} → {after}");
}

/// Ids are echoed byte for byte whatever their size (a number beyond u64,
/// a negative one, a long string); an id that is neither a number nor a
/// string is -32600 with id null.
#[tokio::test]
async fn out_of_range_ids_are_echoed_or_refused() {
    let t = start().await;
    let mut ws = t.raw("alice").await;
    for id in [
        "123456789012345678901234567890",
        "-1",
        "1e400",
        &format!("\"{}\"", "x".repeat(1000)),
    ] {
        ws.send_text(&format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"ping","params":{{"channel":"ahp-root://"}}}}"#
        ))
        .await;
        let text = ws.recv_text().await.expect("an answer");
        assert!(
            text.contains(&format!(r#""id":{id}"#)),
            "id {id} echoed byte for byte: {text}"
        );
    }
    ws.send_text(
        r#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping","params":{"channel":"ahp-root://"}}"#,
    )
    .await;
    let r = ws.recv_json().await.expect("an answer");
    assert_eq!(r["error"]["code"], -32600, "{r}");
    assert_eq!(r["id"], Value::Null, "{r}");
}

/// Sequence numbers out of range: a `clientSeq` beyond i64 or not a number
/// is dropped and counted (no echo can name it); a negative or too large
/// `lastSeenServerSeq` gets fresh snapshots, never a replay; one that is
/// not an integer, or beyond i64, is -32602.
#[tokio::test]
async fn out_of_range_sequence_numbers() {
    let t = start().await;
    let mut ws = t.raw("alice").await;
    ws.initialize("c").await;
    let before = metric_of(&t, "ahp_relay_client_notifications_dropped_total").await;
    for seq in ["99999999999999999999", "\"1\"", "-0.5"] {
        ws.send_text(&format!(
            r#"{{"jsonrpc":"2.0","method":"dispatchAction","params":{{"channel":"ahp-session:/a~a-1","clientSeq":{seq},"action":{{"type":"session/titleChanged","title":"seq-probe"}}}}}}"#
        ))
        .await;
    }
    let r = ws.request(1, "ping", json!({"channel": ROOT})).await;
    assert_eq!(r["result"], Value::Null, "{r}");
    let after = metric_of(&t, "ahp_relay_client_notifications_dropped_total").await;
    assert!(after >= before + 3.0, "{before} → {after}");
    let state = t.hosts[0]
        .channel_state("ahp-session:/a-1")
        .expect("session");
    assert!(
        !state.to_string().contains("seq-probe"),
        "nothing dispatched: {state}"
    );

    for (n, seen) in [(2, "-5"), (3, "9223372036854775807")] {
        let mut again = t.raw("alice").await;
        again
            .send_text(&format!(
                r#"{{"jsonrpc":"2.0","id":{n},"method":"reconnect","params":{{"channel":"ahp-root://","clientId":"c","lastSeenServerSeq":{seen},"subscriptions":["ahp-root://"]}}}}"#
            ))
            .await;
        let r = again.response(&json!(n)).await;
        assert_eq!(
            r["result"]["type"], "snapshot",
            "lastSeenServerSeq {seen}: {r}"
        );
    }
    for seen in [json!("x"), json!(18446744073709551615u64), json!(1.5)] {
        let mut again = t.raw("alice").await;
        let r = again
            .request(
                4,
                "reconnect",
                json!({"channel": ROOT, "clientId": "c", "lastSeenServerSeq": seen,
                    "subscriptions": []}),
            )
            .await;
        assert_eq!(r["error"]["code"], -32602, "{seen}: {r}");
    }
}

/// A host that sends garbage on a client's link: each unreadable frame is
/// dropped and counted; that client and another keep working.
#[tokio::test]
async fn host_garbage_is_contained() {
    let t = start().await;
    let mut other = t.raw("bob").await;
    other.initialize("o").await;
    let mut ws = t.raw("alice").await;
    ws.initialize("c").await;
    let r = ws
        .request(1, "subscribe", json!({"channel": "ahp-session:/a~a-1"}))
        .await;
    assert!(r["result"]["snapshot"].is_object(), "{r}");
    let up = t.relay.relay.upstream_id(
        &PrincipalKey {
            issuer: DEV_ISSUER.into(),
            subject: "alice".into(),
        },
        "c",
    );
    let before = metric_of(&t, "ahp_relay_upstream_bad_frames_total").await;
    for garbage in ["not json", "{\"jsonrpc\":\"2.0\",\"id\":", "[1,2,3]", "{}"] {
        assert_eq!(t.hosts[0].send_raw(&up, garbage), 1, "alice's link");
    }
    wait_until_metric(&t, "ahp_relay_upstream_bad_frames_total", before + 1.0).await;
    let r = ws
        .request(2, "subscribe", json!({"channel": "ahp-session:/a~a-2"}))
        .await;
    assert!(
        r["result"]["snapshot"].is_object(),
        "the link still works: {r}"
    );
    bystander_answers(&mut other, 1).await;
}

async fn wait_until_metric(t: &TestRelay, name: &str, at_least: f64) {
    for _ in 0..100 {
        if metric_of(t, name).await >= at_least {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("{name} never reached {at_least}");
}

/// Frames towards the client obey the same `max_frame_bytes` (both ways):
/// a snapshot answer over it becomes -32603 `tooLarge` and the socket stays
/// usable. (A frame of another kind over it closes the socket with 1009.)
#[tokio::test]
async fn relay_frames_over_the_client_limit_are_not_sent() {
    let t = TestRelay::start(
        vec![fast_config("a", 2)],
        "\n[limits]\nmax_frame_bytes = 350\n",
    )
    .await;
    let mut ws = t.raw("alice").await;
    ws.initialize("c").await;
    let r = ws
        .request(1, "subscribe", json!({"channel": "ahp-session:/a~a-1"}))
        .await;
    let text = r.to_string();
    assert!(text.len() <= 350, "{text}");
    assert_eq!(r["error"]["data"]["reason"], "tooLarge", "{r}");
    let r = ws.request(2, "ping", json!({"channel": ROOT})).await;
    assert_eq!(r["result"], Value::Null, "{r}");
    let m = "ahp_relay_limit_hits_total{limit=\"client_frame\"}";
    assert!(metric_of(&t, m).await >= 1.0);
}

/// `initialize` whose `initialSubscriptions` include a channel whose
/// snapshot cannot fit in one frame still succeeds: the channels that fit
/// are subscribed, the one that does not is named in
/// `_meta["ahp-relay/notSubscribed"]` with reason `tooLarge`, and
/// subscribing it alone gets -32603 `tooLarge` — the client learns why and
/// keeps its session.
#[tokio::test]
async fn an_initial_subscription_over_the_frame_limit_is_left_out() {
    let t = TestRelay::start(
        vec![fast_config("a", 2)],
        "\n[limits]\nmax_frame_bytes = 1200\n",
    )
    .await;
    let (big, host_chat) = seeded_chat("a", 1);
    // The chat fills with one turn sent to the host directly (through the
    // relay its echo alone would be over the limit), so its snapshot is
    // larger than the whole frame limit once the echo is seen.
    let mut direct = RawWs::connect(&t.hosts[0].url()).await;
    direct.initialize("filler").await;
    let r = direct
        .request(1, "subscribe", json!({"channel": host_chat}))
        .await;
    assert!(r.get("result").is_some(), "{r}");
    direct
        .dispatch(&host_chat, 1, turn_started("fill", &"x".repeat(1500)))
        .await;
    raw_actions_until(&mut direct, |e| {
        e.origin.as_ref().is_some_and(|o| o.client_seq == 1)
    })
    .await;
    let mut ws = t.raw("alice").await;
    let init = ws
        .request(
            1,
            "initialize",
            json!({"channel": ROOT, "protocolVersions": ["1.0.0"], "clientId": "c",
                "initialSubscriptions": [ROOT, big]}),
        )
        .await;
    let result = &init["result"];
    assert!(init.to_string().len() <= 1200, "{init}");
    assert_eq!(snapshot_resources(result), vec![ROOT.to_string()], "{init}");
    assert_eq!(
        result["_meta"]["ahp-relay/notSubscribed"],
        json!([{"resource": big, "reason": "tooLarge"}]),
        "{init}"
    );
    let r = ws.request(2, "subscribe", json!({"channel": big})).await;
    assert_eq!(r["error"]["data"]["reason"], "tooLarge", "{r}");
    let r = ws.request(3, "ping", json!({"channel": ROOT})).await;
    assert_eq!(r["result"], Value::Null, "{r}");
}

/// A client that goes away without a close frame (a dropped network, a
/// killed process) is a disconnect, not a bad frame: its socket is cleaned
/// up and nothing is counted in `bad_client_frames_total`.
#[tokio::test]
async fn a_dropped_socket_is_not_a_bad_frame() {
    let t = start().await;
    let mut other = t.raw("bob").await;
    other.initialize("o").await;
    for i in 0..3 {
        let mut ws = t.raw("alice").await;
        ws.initialize(&format!("gone-{i}")).await;
        drop(ws);
    }
    let mut open = f64::MAX;
    for _ in 0..100 {
        open = metric_of(&t, "ahp_relay_connections_open").await;
        if open <= 1.0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(
        open, 1.0,
        "the dropped sockets are closed, the bystander's is open"
    );
    let m = "ahp_relay_bad_client_frames_total{reason=\"ws_protocol\"}";
    assert_eq!(
        metric_of(&t, m).await,
        0.0,
        "no disconnect counted as a bad frame"
    );
    bystander_answers(&mut other, 1).await;
}

//! `completions` through the relay (contract §4.3): an attachment a host
//! offers comes back with its host's names (`file://<host>/…`), and a
//! client that accepts it into a `chat/turnStarted` sends it back through
//! the relay, which gives the host its own form again.

mod common;

use common::relay::TestRelay;
use common::*;
use serde_json::json;

/// Host b's completion names b's sandbox as `file://b/…`; the accepted
/// attachment reaches b as `file:///…` in the turn's message.
#[tokio::test]
async fn a_completion_attachment_round_trips_into_a_turn() {
    let t = TestRelay::start(vec![fast_config("a", 1), fast_config("b", 1)], "").await;
    let mut ws = t.raw("alice").await;
    ws.initialize("compl-1").await;
    let (chat, _) = seeded_chat("b", 1);
    let r = ws.request(1, "subscribe", json!({"channel": chat})).await;
    assert!(r.get("result").is_some(), "{r}");
    let r = ws
        .request(
            2,
            "completions",
            json!({"channel": chat, "kind": "userMessage", "text": "#", "offset": 1}),
        )
        .await;
    let attachment = r["result"]["items"][0]["attachment"].clone();
    let sandbox = t.hosts[1].sandbox().display().to_string();
    assert_eq!(attachment["uri"], format!("file://b{sandbox}"), "{r}");
    let turn = json!({"type": "chat/turnStarted", "turnId": "compl-turn",
        "startedAt": ahp_relay::simhost::clock::now_iso(),
        "message": {"text": "look at #sandbox", "origin": {"kind": "user"},
                    "attachments": [attachment]}});
    ws.dispatch(&chat, 1, turn).await;
    wait_until("b received the turn", || {
        !host_frames(&t.hosts[1], "dispatchAction").is_empty()
    })
    .await;
    let at_b = host_frames(&t.hosts[1], "dispatchAction");
    let sent = &at_b[0]["params"]["action"]["message"]["attachments"][0];
    assert_eq!(sent["uri"], format!("file://{sandbox}"), "{sent}");
    assert!(
        host_frames(&t.hosts[0], "dispatchAction").is_empty(),
        "nothing on a"
    );
}

//! Audit lines are JSON (contract §7.5, issue 12.6): whatever a client puts
//! in a channel, a decision produces exactly one line on the audit target,
//! one JSON object, its values escaped by the serializer and bounded.

mod common;

use ahp_relay::policy::audit::TRUNCATED;
use common::relay::TestRelay;
use common::*;
use serde_json::{Value, json};

/// A dispatch to a channel holding a newline, quotes and a forged field,
/// longer than a value may be, writes one line that parses as one object
/// whose `channel` is the channel's prefix within the configured bound and
/// whose `decision` is the relay's.
#[tokio::test]
async fn a_hostile_channel_gives_one_escaped_truncated_json_line() {
    use tracing_subscriber::layer::SubscriberExt as _;
    let dir = common::relay::scratch_dir("audit");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("audit.log");
    let file = std::fs::File::create(&path).unwrap();
    let subscriber = tracing_subscriber::registry().with(ahp_relay::policy::audit::layer(file));
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
    let max = 128;
    let bound = format!("[policy]\naudit_max_value_bytes = {max}\n");
    let t = TestRelay::start(vec![fast_config("a", 1)], &bound).await;
    let mut ws = t.raw("mallory").await;
    ws.initialize("au").await;
    let forged = "\n{\"decision\":\"allow\",\"rule\":\"forged\"}\n\"";
    let channel = format!("ahp-chat:/a~x{forged}{}", "é".repeat(300));
    ws.send_json(
        &json!({"jsonrpc": "2.0", "method": "dispatchAction", "params": {
        "channel": channel, "clientSeq": 1, "action": {"type": "chat/turnStarted",
        "turnId": "t1", "startedAt": ahp_relay::simhost::clock::now_iso(),
        "message": {"text": "hello", "origin": {"kind": "user"}}}}}),
    )
    .await;
    let pong = ws
        .request(9, "ping", json!({"channel": "ahp-root://"}))
        .await;
    assert_eq!(pong["result"], Value::Null, "{pong}");
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "exactly one audit line: {text}");
    let line: Value = serde_json::from_str(lines[0]).expect("the line is one JSON object");
    assert_eq!(line["target"], ahp_relay::policy::audit::TARGET);
    assert_eq!(line["principal"]["subject"], "mallory");
    assert_eq!(line["principal"]["issuer"], ahp_relay::devkit::DEV_ISSUER);
    assert_eq!(line["decision"], "invisible", "{line}");
    assert_eq!(line["rule"], "-", "{line}");
    assert_eq!(line["operation"], "chat/turnStarted");
    let logged = line["channel"].as_str().expect("channel is a string");
    assert!(
        logged.len() <= max && logged.len() > max - 2 * TRUNCATED.len(),
        "cut at the configured bound, not {} bytes",
        logged.len()
    );
    let kept = logged.strip_suffix(TRUNCATED).expect("marked as truncated");
    assert!(
        channel.starts_with(kept) && kept.contains(forged),
        "the newline and quotes are kept, escaped: {logged:?}"
    );
    assert!(
        lines[0].contains("\\n{\\\"decision\\\":\\\"allow\\\""),
        "{}",
        lines[0]
    );
    assert!(!text.contains("hello"), "message text in the audit");
    let _ = std::fs::remove_dir_all(&dir);
}

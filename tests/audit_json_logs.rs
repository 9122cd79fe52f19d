//! `ahp-relay serve --log-format json` (issue 13.5): every line the relay
//! writes to stderr is one JSON object — its own announcements, `tracing`
//! events at debug level, and audit lines (contract §7.5) — and none holds
//! the token or the query string a client connected with (§3.2).

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

use ahp_relay::devkit::DevKit;
use ahp_relay::upstream::dial::{DialOptions, dial_stream};
use common::relay::scratch_dir;
use common::*;
use serde_json::{Value, json};

/// A relay process, killed and reaped when dropped (also when a test fails).
struct Relay(Child);

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `ahp-relay serve --log-format json` on `kit`'s config at debug level:
/// the process, its stderr lines, those read so far, and its URL (from the
/// announcement, which must itself be a JSON event).
fn serve_json(kit: &DevKit) -> (Relay, Receiver<String>, Vec<String>, String) {
    let mut relay = Relay(
        Command::new(env!("CARGO_BIN_EXE_ahp-relay"))
            .args(["serve", "--log-format", "json", "--config"])
            .arg(kit.dir.join("relay.toml"))
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .env("RUST_LOG", "debug")
            .spawn()
            .expect("relay binary starts"),
    );
    let stderr = relay.0.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut lines = Vec::new();
    loop {
        let line = rx
            .recv_timeout(WAIT)
            .unwrap_or_else(|_| panic!("the relay did not say where it listens: {lines:#?}"));
        let announced = serde_json::from_str::<Value>(&line).ok().and_then(|v| {
            v["fields"]["message"]
                .as_str()?
                .strip_prefix("ahp-relay listening on ")
                .map(|u| u.replace("127.0.0.1", "localhost"))
        });
        lines.push(line);
        if let Some(url) = announced {
            return (relay, rx, lines, url);
        }
    }
}

#[tokio::test]
async fn json_logs_are_one_object_per_line_without_tokens() {
    let host = start_host(fast_config("a", 1)).await;
    let kit = DevKit::create(&scratch_dir("json-logs")).expect("kit");
    kit.config("127.0.0.1:0", &[("a".to_string(), host.url())], "", "")
        .expect("config");
    let (relay, rx, mut lines, url) = serve_json(&kit);
    let token = kit
        .token("alice", &[], Duration::from_secs(600), None)
        .expect("token");
    let opts = DialOptions {
        url: format!("{url}?tkn={token}"),
        token: None,
        ca_file: Some(kit.cert.clone()),
        insecure: false,
        connect_timeout: WAIT,
        extra_headers: Vec::new(),
    };
    let mut ws = RawWs::from_stream(dial_stream(&opts).await.expect("query token accepted"));
    ws.initialize("json-logs").await;
    ws.send_json(
        &json!({"jsonrpc": "2.0", "method": "dispatchAction", "params": {
        "channel": "ahp-chat:/a~none\n\"x", "clientSeq": 1, "action": {"type": "chat/turnStarted",
        "turnId": "t1", "startedAt": ahp_relay::simhost::clock::now_iso(),
        "message": {"text": "hello", "origin": {"kind": "user"}}}}}),
    )
    .await;
    let pong = ws
        .request(2, "ping", json!({"channel": "ahp-root://"}))
        .await;
    assert_eq!(pong["result"], Value::Null, "{pong}");
    drop(relay);
    lines.extend(rx.iter());
    let objects: Vec<Value> = lines
        .iter()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            assert!(v.is_object(), "{l}");
            assert!(
                !l.contains(&token) && !l.contains("tkn="),
                "secret logged: {l}"
            );
            v
        })
        .collect();
    let audit = ahp_relay::policy::audit::TARGET;
    assert!(
        objects.iter().any(|v| v["target"] == audit
            && v["channel"] == "ahp-chat:/a~none\n\"x"
            && v["decision"] == "invisible"),
        "the refused dispatch is audited: {lines:#?}"
    );
    assert!(
        objects
            .iter()
            .any(|v| v["target"] != audit && v["level"] == "DEBUG" && v["fields"].is_object()),
        "debug events are JSON too: {lines:#?}"
    );
}

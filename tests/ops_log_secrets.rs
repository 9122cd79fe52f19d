//! No credential reaches a log line at any level (issue 25): a relay
//! binary run with `RUST_LOG=trace` dials a host with a bearer token file
//! and a `tkn` query token file, serves a client whose token comes in the
//! `Authorization` header and another's in `?tkn=`, and forwards an
//! `authenticate` token to the host; none of these strings appears anywhere
//! in its whole output, while its trace output is really on.

mod common;

use std::time::Duration;

use ahp_relay::devkit::DevKit;
use ahp_relay::upstream::dial::{DialOptions, dial_stream};
use common::relay::{scratch_dir, serve_binary};
use common::{RawWs, WAIT, fast_config, start_host};
use serde_json::json;

const API: &str = "https://api.relay-test.example";

/// Dial options for `url` (query included) with `token` as bearer header.
fn options(kit: &DevKit, url: String, token: Option<String>) -> DialOptions {
    DialOptions {
        url,
        token,
        ca_file: Some(kit.cert.clone()),
        insecure: false,
        connect_timeout: WAIT,
        extra_headers: Vec::new(),
    }
}

#[tokio::test]
async fn trace_logs_hold_no_credential() {
    let mut cfg = fast_config("a", 1);
    cfg.protected_resources = vec![API.into()];
    let host = start_host(cfg).await;
    let kit = DevKit::create(&scratch_dir("log-secrets")).expect("kit");
    let host_bearer = "host-bearer-4e1f9c2a7d";
    let host_tkn = "host-tkn-93b0d6e15c";
    let pushed = "pushed-token-5a8c3e7f21";
    let (bearer_file, tkn_file) = (kit.dir.join("a.token"), kit.dir.join("a.tkn"));
    std::fs::write(&bearer_file, format!("{host_bearer}\n")).expect("token file");
    std::fs::write(&tkn_file, format!("{host_tkn}\n")).expect("tkn file");
    let hosts = format!(
        "\n[[hosts]]\nid = \"a\"\nurl = \"{}\"\nallow_plaintext = true\n\
         token_file = \"{}\"\nquery_token_file = \"{}\"\n",
        host.url(),
        bearer_file.display(),
        tkn_file.display()
    );
    kit.config("127.0.0.1:0", &[], "", &hosts).expect("config");
    let relay = serve_binary(&kit, "trace");

    let header_token = kit
        .token("alice", &[], Duration::from_secs(600), Some("log-jti-1"))
        .expect("token");
    let opts = options(&kit, relay.url.clone(), Some(header_token.clone()));
    let mut ws = RawWs::from_stream(dial_stream(&opts).await.expect("header token"));
    ws.initialize("logs-1").await;
    // The relay process dials its host on its own schedule: wait until the
    // host's catalog is in (an observable event, not a sleep).
    let deadline = std::time::Instant::now() + common::WAIT;
    let mut id = 100;
    while !common::listed_uris(&mut ws, id)
        .await
        .iter()
        .any(|u| u == "ahp-session:/a~a-1")
    {
        assert!(std::time::Instant::now() < deadline, "host a never listed");
        id += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = ws
        .request(1, "subscribe", json!({"channel": "ahp-session:/a~a-1"}))
        .await;
    assert!(r.get("result").is_some(), "{r}");
    let r = ws
        .request(
            2,
            "authenticate",
            json!({"channel": "ahp-root://", "resource": API, "token": pushed}),
        )
        .await;
    assert!(r.get("result").is_some(), "{r}");

    let query_token = kit
        .token("bob", &[], Duration::from_secs(600), Some("log-jti-2"))
        .expect("token");
    let url = format!("{}?tkn={query_token}", relay.url);
    let mut ws2 = RawWs::from_stream(dial_stream(&options(&kit, url, None)).await.expect("tkn"));
    ws2.initialize("logs-2").await;
    let pong = ws2
        .request(1, "ping", json!({"channel": "ahp-root://"}))
        .await;
    assert!(pong.get("result").is_some(), "{pong}");

    let lines = relay.output();
    assert!(
        lines.iter().any(|l| l.contains("TRACE")),
        "trace output is on: {lines:#?}"
    );
    let signature = |jwt: &str| jwt.rsplit('.').next().unwrap_or_default().to_string();
    let secrets = [
        host_bearer.to_string(),
        host_tkn.to_string(),
        pushed.to_string(),
        signature(&header_token),
        signature(&query_token),
    ];
    for line in &lines {
        for secret in &secrets {
            assert!(
                !line.contains(secret.as_str()),
                "a credential is logged: {line}"
            );
        }
    }
}

/// At the default log level a refused upgrade is one line with its reason
/// and the client address, so an operator sees why a user cannot connect —
/// and the refused token is not in it.
#[tokio::test]
async fn refused_upgrades_are_logged_with_their_reason_not_their_token() {
    let host = start_host(fast_config("a", 1)).await;
    let kit = DevKit::create(&scratch_dir("log-refusals")).expect("kit");
    kit.config("127.0.0.1:0", &[("a".to_string(), host.url())], "", "")
        .expect("config");
    let relay = serve_binary(&kit, "info");
    let valid = kit
        .token("alice", &[], Duration::from_secs(600), Some("log-jti-3"))
        .expect("token");
    // The same token with a signature that does not verify.
    let (head, sig) = valid.rsplit_once('.').expect("a JWT");
    let flipped = if sig.starts_with('A') { "B" } else { "A" };
    let forged = format!("{head}.{flipped}{}", &sig[1..]);
    let refused = dial_stream(&options(&kit, relay.url.clone(), Some(forged.clone()))).await;
    assert!(refused.is_err(), "a forged token is refused");
    // The line is written before the 401 is sent; `output` stops the relay
    // and reads everything it wrote.
    let lines = relay.output();
    let line = lines
        .iter()
        .find(|l| l.contains("upgrade refused"))
        .unwrap_or_else(|| panic!("no refusal line: {lines:#?}"));
    assert!(line.contains("bad_signature"), "{line}");
    assert!(line.contains("127.0.0.1"), "{line}");
    let signature = forged.rsplit('.').next().unwrap_or_default();
    assert!(lines.iter().all(|l| !l.contains(signature)), "{lines:#?}");
}

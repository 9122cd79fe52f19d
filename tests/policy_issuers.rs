//! Rules bind issuers (contract §7.2, issue 12.4): a principal is (issuer,
//! subject) and a group is (issuer, group), so a group claim of one
//! identity provider never matches a rule written for another; with more
//! than one issuer configured, `check-config` refuses a rule that does not
//! name its issuer, with file and line.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use ahp_relay::auth::token::{MintRequest, mint_hs256};
use ahp_relay::devkit::{DEV_AUDIENCE, DEV_ISSUER};
use ahp_relay::upstream::dial::dial_stream;
use common::relay::{TestRelay, scratch_dir};
use common::*;
use serde_json::json;

const OTHER_ISSUER: &str = "https://idp-b.example/";

/// A second HS256 issuer with `key_file`, `platform` admins of the dev
/// issuer and the second issuer's principals viewing their groups' sessions.
fn two_issuers(key_file: &Path) -> String {
    format!(
        r#"
[[auth.issuers]]
issuer = "{OTHER_ISSUER}"
audience = ["{DEV_AUDIENCE}"]
keys = {{ type = "hs256", secret_file = "{}" }}

[[policy.rules]]
name = "platform-admins"
issuer = "{DEV_ISSUER}"
groups = ["platform"]
hosts = ["*"]
role = "admin"
visibility = "all"

[[policy.rules]]
name = "b-viewers"
issuer = "{OTHER_ISSUER}"
subjects = ["*"]
hosts = ["*"]
role = "viewer"
visibility = "group"
external_sessions = true
"#,
        key_file.display()
    )
}

/// A raw socket through the relay with `token`, initialized as `client_id`.
async fn connect(t: &TestRelay, token: String, client_id: &str) -> RawWs {
    let stream = dial_stream(&t.dial_options(Some(token))).await.unwrap();
    let mut ws = RawWs::from_stream(stream);
    ws.initialize(client_id).await;
    ws
}

/// Issuer A (the dev issuer) makes `platform` admins; issuer B's principals
/// are viewers of their groups' sessions. A token of issuer B carrying the
/// group `platform` may read but not dispose someone else's session, and
/// does not see a session created by A's `platform` member; the same group
/// from issuer A disposes.
#[tokio::test]
async fn a_group_claim_of_another_issuer_is_not_that_group() {
    let dir = scratch_dir("issuer-b");
    std::fs::create_dir_all(&dir).unwrap();
    let secret = [7u8; 32];
    let key_file = dir.join("b-hs256.key");
    std::fs::write(&key_file, secret).unwrap();
    let t = TestRelay::start(vec![fast_config("a", 2)], &two_issuers(&key_file)).await;
    let a_token = t
        .kit
        .token("ann", &["platform"], Duration::from_secs(3600), None)
        .unwrap();
    let mut a = connect(&t, a_token, "ann-1").await;
    let made = "ahp-session:/made-by-ann";
    let r = a
        .request(
            1,
            "createSession",
            json!({"channel": made, "provider": "sim.a"}),
        )
        .await;
    assert!(r.get("result").is_some(), "{r}");
    let r = a.request(2, "subscribe", json!({"channel": made})).await;
    assert!(r.get("result").is_some(), "{r}");
    let b_token = mint_hs256(
        &secret,
        &MintRequest {
            issuer: OTHER_ISSUER.into(),
            audience: DEV_AUDIENCE.into(),
            subject: "ben".into(),
            groups: vec!["platform".into()],
            ttl: Duration::from_secs(3600),
            jti: None,
        },
        ahp_relay::identity::unix_now(),
    )
    .unwrap();
    let mut b = connect(&t, b_token, "ben-1").await;
    let read = b
        .request(1, "subscribe", json!({"channel": "ahp-session:/a~a-1"}))
        .await;
    assert!(
        read.get("result").is_some(),
        "B's viewer rule holds: {read}"
    );
    let dispose = b
        .request(
            2,
            "disposeSession",
            json!({"channel": "ahp-session:/a~a-1"}),
        )
        .await;
    assert_eq!(
        dispose["error"]["code"], -32009,
        "B's `platform` is not A's platform group: {dispose}"
    );
    let hidden = b.request(3, "subscribe", json!({"channel": made})).await;
    assert_eq!(
        hidden["error"]["code"], -32001,
        "group visibility compares (issuer, group): {hidden}"
    );
    let dispose = a
        .request(
            3,
            "disposeSession",
            json!({"channel": "ahp-session:/a~a-2"}),
        )
        .await;
    assert!(
        dispose.get("result").is_some(),
        "A's platform group is admin: {dispose}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `ahp-relay check-config --document-only` (the example names deployment
/// files this machine does not have) on a config with two issuers and a rule without
/// `issuer` fails and names the file and the rule's line; naming the issuer
/// makes the same rule valid.
#[test]
fn check_config_refuses_a_rule_without_issuer_when_two_are_configured() {
    let base = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("config/relay.example.toml"),
    )
    .unwrap();
    let rule = "\n[[policy.rules]]\nname = \"unbound\"\ngroups = [\"platform\"]\nhosts = [\"*\"]\nrole = \"admin\"\n";
    let text = format!("{base}{rule}");
    let header = base.lines().count() + 2;
    let dir = scratch_dir("check-issuer");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("relay.toml");
    std::fs::write(&path, &text).unwrap();
    let check = |path: &Path| {
        Command::new(env!("CARGO_BIN_EXE_ahp-relay"))
            .arg("check-config")
            .arg("--document-only")
            .arg(path)
            .output()
            .expect("check-config runs")
    };
    let out = check(&path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let at = format!("{}:{header}:", path.display());
    assert!(stderr.contains(&at), "expected {at} in: {stderr}");
    assert!(
        stderr.contains("unbound") && stderr.contains("issuer"),
        "{stderr}"
    );
    let fixed = text.replace(
        "name = \"unbound\"\n",
        "name = \"unbound\"\nissuer = \"https://ci.example.com/\"\n",
    );
    std::fs::write(&path, fixed).unwrap();
    let out = check(&path);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

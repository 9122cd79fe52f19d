//! `ahp-relay check-config` runs the one gate `serve` runs before it binds
//! (`run::preflight`): the relay secret, every `[auth]` issuer's keys, the
//! TLS certificate and every host's credentials — so a file a deployment
//! forgot fails the check, not the first start. `--document-only` checks
//! the document alone.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::relay::scratch_dir;

fn check(args: &[&str], config: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ahp-relay"))
        .arg("check-config")
        .args(args)
        .arg(config)
        .output()
        .expect("check-config runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A config naming an HS256 issuer secret, a host token and a relay secret
/// under `dir`.
fn config(dir: &Path) -> String {
    format!(
        r#"[listen]
addr = "127.0.0.1:0"
admin_addr = "127.0.0.1:0"
plaintext = true

[[auth.issuers]]
issuer = "https://dev.example/"
audience = ["ahp-relay"]
keys = {{ type = "hs256", secret_file = "{d}/hs256.key" }}

[relay]
secret_file = "{d}/relay.secret"
store = "{d}/uris.redb"

[[hosts]]
id = "h1"
url = "ws://127.0.0.1:1/"
allow_plaintext = true
token_file = "{d}/h1.token"

[[policy.rules]]
name = "everyone"
groups = ["*"]
hosts = ["*"]
role = "viewer"
"#,
        d = dir.display()
    )
}

#[test]
fn check_config_fails_on_each_missing_file_serve_needs_and_passes_once_present() {
    let dir = scratch_dir("check-config-gate");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("relay.toml");
    std::fs::write(&path, config(&dir)).unwrap();

    // The document is fine on its own.
    let out = check(&["--document-only"], &path);
    assert!(out.status.success(), "{}", stderr(&out));

    // The [auth] issuer's key file is missing: named.
    let out = check(&[], &path);
    assert!(!out.status.success(), "missing issuer key passed");
    assert!(stderr(&out).contains("hs256.key"), "{}", stderr(&out));

    // With the key, the host's token file is what is missing.
    let key: Vec<u8> = (0u8..48)
        .map(|i| i.wrapping_mul(37).wrapping_add(11))
        .collect();
    std::fs::write(dir.join("hs256.key"), &key).unwrap();
    let out = check(&[], &path);
    assert!(!out.status.success(), "missing host token passed");
    assert!(stderr(&out).contains("h1"), "{}", stderr(&out));

    // A weak relay secret is refused as serve refuses it.
    std::fs::write(dir.join("h1.token"), "host-token\n").unwrap();
    std::fs::write(
        dir.join("relay.secret"),
        "changeme-changeme-changeme-changeme",
    )
    .unwrap();
    let out = check(&[], &path);
    assert!(!out.status.success(), "weak relay secret passed");
    assert!(stderr(&out).contains("relay.secret"), "{}", stderr(&out));

    // Everything present (no relay secret yet: serve creates one).
    std::fs::remove_file(dir.join("relay.secret")).unwrap();
    let out = check(&[], &path);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        !dir.join("relay.secret").exists(),
        "check-config must not create the relay secret"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

//! The README's newcomer path cannot drift (issue 23): every shell block
//! the README marks as the newcomer path is run, as written, with `sh -eu`
//! against a relay in front of the demo's own hosts under the demo's
//! policy, with `ahp-relay` on `PATH` and the variables the demo's env file
//! exports. Only the `source …env` line is left out: the test sets those
//! variables itself.

mod common;

use std::process::Stdio;

use ahp_relay::cli::demo::host_configs;
use ahp_relay::devkit::DEMO_POLICY;
use common::relay::{TestRelay, scratch_dir};
use common::{WAIT, frames::script};

/// The marker line before each block the test runs.
const MARKER: &str = "<!-- newcomer path: tests/cli_readme.rs runs this block";

/// The marked ```sh blocks of the README, without their `source` lines.
fn marked_blocks(readme: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut lines = readme.lines();
    while let Some(line) = lines.next() {
        if !line.starts_with(MARKER) {
            continue;
        }
        assert_eq!(lines.next(), Some("```sh"), "a sh block follows the marker");
        let body: Vec<&str> = lines
            .by_ref()
            .take_while(|l| *l != "```")
            .filter(|l| !l.trim_start().starts_with("source "))
            .collect();
        blocks.push(body.join("\n"));
    }
    blocks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_newcomer_path_runs_as_written() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let blocks = marked_blocks(&readme);
    assert!(blocks.len() >= 2, "the top block and the client section's");
    let t = TestRelay::start(host_configs(3, 3, &script(4, 8, 0), false), DEMO_POLICY).await;
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_ahp-relay"));
    let bin_dir = bin.parent().expect("the binary's folder");
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for block in &blocks {
        assert!(block.contains("ahp-relay client "), "{block}");
        let run = tokio::process::Command::new("sh")
            .args(["-eu", "-c", block])
            .env("PATH", &path)
            .env("AHP_RELAY_URL", t.url())
            .env("AHP_RELAY_TOKEN", t.token("alice"))
            .env("AHP_RELAY_CA", &t.kit.cert)
            .env("AHP_RELAY_DEV_KEY", &t.kit.dev_key)
            .env("XDG_CONFIG_HOME", scratch_dir("readme-config"))
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(WAIT * 3, run)
            .await
            .expect("the block ends")
            .expect("sh runs");
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(
            out.status.success(),
            "README block failed:\n{block}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
        );
        assert!(!stdout.trim().is_empty(), "{block}\n{stderr}");
    }
}

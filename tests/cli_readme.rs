//! The README's newcomer path cannot drift (issue 23): its first command —
//! `demo`, with the flags the README gives — is run as the real binary, and
//! every shell block the README marks as the newcomer path is then run as
//! written with `bash -eu`, `source` line included (a block without one
//! runs after it, as in the same terminal), with `ahp-relay` on
//! `PATH`. Two changes only, so parallel runs do not collide: the demo
//! listens on a free port, and its env file lives in a scratch folder.

mod common;

use std::process::Stdio;

use common::WAIT;
use common::relay::scratch_dir;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

/// The marker line before each block the test runs.
const MARKER: &str = "<!-- newcomer path: tests/cli_readme.rs runs this block";
/// The env file path the README uses.
const README_ENV: &str = "/tmp/ahp-relay.env";

/// The marked ```sh blocks of the README.
fn marked_blocks(readme: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut lines = readme.lines();
    while let Some(line) = lines.next() {
        if !line.starts_with(MARKER) {
            continue;
        }
        assert_eq!(lines.next(), Some("```sh"), "a sh block follows the marker");
        let body: Vec<&str> = lines.by_ref().take_while(|l| *l != "```").collect();
        blocks.push(body.join("\n"));
    }
    blocks
}

/// The arguments of the README's first command, `cargo run --release -- <args>`.
fn demo_args(readme: &str) -> Vec<String> {
    let line = readme
        .lines()
        .find(|l| l.starts_with("cargo run --release -- demo"))
        .expect("the README's first command runs the demo");
    line.trim_start_matches("cargo run --release -- ")
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// Runs the demo as the README says; returns it once it printed that it runs.
async fn start_demo(args: &[String], env_file: &str) -> tokio::process::Child {
    let args: Vec<String> = args
        .iter()
        .map(|a| a.replace(README_ENV, env_file))
        .chain(["--listen".into(), "127.0.0.1:0".into()])
        .collect();
    assert!(
        args.iter().any(|a| a == env_file),
        "the README passes --env-file {README_ENV}: {args:?}"
    );
    let mut demo = Command::new(env!("CARGO_BIN_EXE_ahp-relay"))
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the demo runs");
    let mut out = BufReader::new(demo.stdout.take().expect("stdout")).lines();
    let ready = async {
        while let Some(line) = out.next_line().await.expect("demo stdout") {
            if line.starts_with("Press Ctrl-C") {
                return;
            }
        }
        panic!("the demo ended before it was ready");
    };
    tokio::time::timeout(WAIT * 3, ready)
        .await
        .expect("the demo is ready");
    demo
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_newcomer_path_runs_as_written() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let blocks = marked_blocks(&readme);
    assert!(
        blocks.len() >= 3,
        "the top block, the tenancy block and the client section's"
    );
    let scratch = scratch_dir("readme");
    std::fs::create_dir_all(&scratch).expect("scratch");
    let env_file = scratch.join("ahp-relay.env").display().to_string();
    let mut demo = start_demo(&demo_args(&readme), &env_file).await;
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_ahp-relay"));
    let bin_dir = bin.parent().expect("the binary's folder");
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for block in &blocks {
        assert!(block.contains("ahp-relay client "), "{block}");
        let mut script = block.replace(README_ENV, &env_file);
        if !script.contains("source ") {
            // A later block assumes the env file was sourced, as in one terminal.
            script = format!("source {env_file}\n{script}");
        }
        let mut sh = Command::new("bash");
        sh.args(["-eu", "-c", &script])
            .env("PATH", &path)
            .env("XDG_CONFIG_HOME", scratch.join("config"))
            .stdin(Stdio::null())
            .kill_on_drop(true);
        for var in [
            "URL",
            "TOKEN",
            "CA",
            "DEV_KEY",
            "HOSTS",
            "ADMIN_URL",
            "ADMIN_TOKEN",
        ] {
            sh.env_remove(format!("AHP_RELAY_{var}"));
        }
        let out = tokio::time::timeout(WAIT * 3, sh.output())
            .await
            .expect("the block ends")
            .expect("sh runs");
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(
            out.status.success(),
            "README block failed:\n{script}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
        );
        assert!(!stdout.trim().is_empty(), "{script}\n{stderr}");
    }
    let _ = demo.start_kill();
}

//! The README's newcomer path cannot drift (issues 22, 23): its first
//! command — `demo`, with the flags the README gives — is run as the real
//! binary, and every shell block the README marks as the newcomer path is
//! then run as written with `bash -eu`, `source` line included (a block
//! without one runs after it, as in the same terminal), with `ahp-relay` on
//! `PATH`. Where the README shows what a block prints (a `text` block
//! marked as its output), the block's output (stdout and stderr, as a
//! terminal shows them) must hold those lines in that order, `…` standing
//! for any text and runs of spaces for any whitespace; a printed status
//! page URL must serve the page. Two changes only, so parallel runs do not
//! collide: the demo listens on a free port, and its env file lives in a
//! scratch folder. The walk covers sessions, a turn, a terminal, a file
//! read and the status page.

mod common;

use std::process::Stdio;

use common::WAIT;
use common::relay::scratch_dir;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

/// The marker line before each block the test runs.
const MARKER: &str = "<!-- newcomer path: tests/cli_readme.rs runs this block";
/// The marker line before a block's shown output.
const OUTPUT_MARKER: &str = "<!-- newcomer output: tests/cli_readme.rs checks the block above";
/// The env file path the README uses.
const README_ENV: &str = "/tmp/ahp-relay.env";

/// A marked ```sh block of the README and the lines it is shown to print.
struct Block {
    script: String,
    shown: Vec<String>,
}

/// The body of the fenced block `fence` that follows (blank lines skipped).
fn fenced<'a>(lines: &mut std::iter::Peekable<std::str::Lines<'a>>, fence: &str) -> Vec<&'a str> {
    assert_eq!(
        lines.next(),
        Some(fence),
        "a {fence} block follows the marker"
    );
    lines.by_ref().take_while(|l| *l != "```").collect()
}

/// The marked ```sh blocks of the README, each with its shown output.
fn marked_blocks(readme: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut lines = readme.lines().peekable();
    while let Some(line) = lines.next() {
        if !line.starts_with(MARKER) {
            continue;
        }
        let script = fenced(&mut lines, "```sh").join("\n");
        while lines.peek().is_some_and(|l| l.trim().is_empty()) {
            lines.next();
        }
        let mut shown = Vec::new();
        if lines.peek().is_some_and(|l| l.starts_with(OUTPUT_MARKER)) {
            lines.next();
            shown = fenced(&mut lines, "```text")
                .into_iter()
                .map(str::to_owned)
                .collect();
        }
        blocks.push(Block { script, shown });
    }
    blocks
}

/// `text` with every run of whitespace made one space, trimmed.
fn squeezed(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Whether `line` matches the shown `pattern` (`…` is any text).
fn matches(pattern: &str, line: &str) -> bool {
    let (pattern, line) = (squeezed(pattern), squeezed(line));
    let mut parts = pattern.split('…');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = line.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    for (i, part) in parts.iter().enumerate() {
        if i + 1 == parts.len() {
            return rest.ends_with(part);
        }
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.is_empty()
}

/// Panics unless `output` holds the `shown` lines in order (a line that is
/// only `…` stands for any lines).
fn assert_shown(shown: &[String], output: &str, script: &str) {
    let mut out = output.lines();
    for want in shown.iter().filter(|l| l.trim() != "…") {
        assert!(
            out.any(|l| matches(want, l)),
            "the README shows `{want}` for\n{script}\nbut it printed:\n{output}"
        );
    }
}

/// The status code of `GET url` (a plain `http://host:port/path`).
async fn http_status(url: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").expect("an http URL");
    let (authority, path) = rest.split_once('/').expect("a path");
    let mut tcp = tokio::net::TcpStream::connect(authority)
        .await
        .expect("the status page's listener");
    let req = format!("GET /{path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
    tcp.write_all(req.as_bytes()).await.expect("request");
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(WAIT, tcp.read_to_end(&mut buf)).await;
    let head = String::from_utf8_lossy(&buf);
    head.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
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
        blocks.len() >= 7,
        "the first hour's five steps, the tenancy block and the client section's"
    );
    let walk: String = blocks.iter().map(|b| b.script.as_str()).collect();
    for step in [
        "client sessions",
        "client send",
        "client terminal",
        "client cat",
        "AHP_RELAY_ADMIN_URL}status",
    ] {
        assert!(walk.contains(step), "the walk runs `{step}`");
    }
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
        let mut script = block.script.replace(README_ENV, &env_file);
        if !script.contains("source ") {
            // A later block assumes the env file was sourced, as in one terminal.
            script = format!("source {env_file}\n{script}");
        }
        // Both streams in one, in the order a terminal shows them.
        script = format!("exec 2>&1\n{script}");
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
        assert_shown(&block.shown, &stdout, &script);
        for url in stdout.lines().filter(|l| l.starts_with("http://")) {
            assert_eq!(http_status(url.trim()).await, 200, "{url} serves the page");
        }
    }
    common::relay::stop_demo(&mut demo, std::path::Path::new(&env_file)).await;
}

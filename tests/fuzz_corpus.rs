//! Replays the committed fuzz corpus (`fixtures/fuzz/<target>/`) through the fuzz target
//! bodies (`fuzz/targets.rs`, shared with the libFuzzer entry points), on the stable
//! toolchain: every input libFuzzer kept as new coverage, and every input that once found
//! a bug, is checked again by each `cargo test`, in seconds, without nightly.
//! Fuzzing itself: `README.md`, section "Fuzzing".

#[path = "../fuzz/targets.rs"]
mod targets;

use std::path::PathBuf;

/// Runs every file of `fixtures/fuzz/<target>/` through `body`; the corpus must exist
/// (an empty or missing directory would make this test prove nothing).
fn replay(target: &str, body: fn(&[u8])) {
    let dir: PathBuf = [env!("CARGO_MANIFEST_DIR"), "fixtures", "fuzz", target]
        .iter()
        .collect();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("corpus entry").path())
        .collect();
    files.sort();
    assert!(
        files.len() >= 10,
        "{target}: only {} corpus files",
        files.len()
    );
    for file in &files {
        let data = std::fs::read(file).expect("corpus file");
        let run = std::panic::catch_unwind(|| body(&data));
        assert!(run.is_ok(), "{target}: {} fails", file.display());
    }
}

#[test]
fn wire_client_corpus() {
    replay("wire_client", targets::wire_client);
}

#[test]
fn wire_host_corpus() {
    replay("wire_host", targets::wire_host);
}

#[test]
fn names_corpus() {
    replay("names", targets::names);
}

#[test]
fn auth_corpus() {
    replay("auth", targets::auth);
}

#[test]
fn config_corpus() {
    replay("config", targets::config);
}

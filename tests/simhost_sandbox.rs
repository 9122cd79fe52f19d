//! `ahp-relay simhost` leaves nothing behind (issue 22): its temporary
//! sandbox folder is removed when the process is stopped with SIGTERM (and
//! Ctrl-C, the same path), and kept with `--keep-sandbox`.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Starts the binary's simhost on a free port; returns it and its sandbox.
fn start(extra: &[&str]) -> (Child, PathBuf) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ahp-relay"))
        .args(["simhost", "--listen", "127.0.0.1:0", "--sessions", "2"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("simhost starts");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let dir = loop {
        let line = lines.next().expect("a sandbox line").expect("utf-8");
        if let Some(d) = line.strip_prefix("file: resources live in ") {
            break PathBuf::from(d);
        }
    };
    // Keep reading: a closed pipe would make the host's next line to
    // stderr fail, and so its exit.
    std::thread::spawn(move || lines.for_each(drop));
    (child, dir)
}

/// Sends SIGTERM and waits (bounded) for the process to exit; its status.
fn terminate(mut child: Child) -> std::process::ExitStatus {
    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(term.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        assert!(Instant::now() < deadline, "simhost ignored SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sigterm_removes_the_sandbox() {
    let (child, dir) = start(&[]);
    assert!(dir.is_dir(), "{} exists while serving", dir.display());
    let status = terminate(child);
    assert!(status.success(), "exits cleanly on SIGTERM: {status}");
    assert!(!dir.exists(), "{} left behind", dir.display());
}

#[test]
fn keep_sandbox_keeps_it() {
    let (child, dir) = start(&["--keep-sandbox"]);
    let status = terminate(child);
    assert!(status.success(), "{status}");
    assert!(dir.is_dir(), "{} kept", dir.display());
    std::fs::remove_dir_all(&dir).expect("clean up the kept sandbox");
}

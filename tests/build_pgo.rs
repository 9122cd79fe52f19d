//! The profile-guided build (`pgo/`): the rustc wrapper that `.cargo/config.toml`
//! installs adds the recorded profile to optimised compilations for x86-64
//! Linux and to nothing else, and falls back to a plain compilation when the
//! compiler's LLVM is older than the profile's. Each case runs the real
//! wrapper with a stand-in `rustc` that prints the arguments it was given.

#![cfg(target_os = "linux")]

use std::path::{Path, PathBuf};
use std::process::Command;

/// A folder of its own for one test, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("ahp-build-pgo-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch folder");
        Scratch(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A stand-in compiler: answers `-vV` with the given LLVM version and
/// otherwise prints its arguments, one per line.
fn fake_rustc(dir: &Path, llvm: &str) -> PathBuf {
    let path = dir.join(format!("rustc-llvm{llvm}"));
    let script = format!(
        "#!/bin/sh\nif [ \"$1\" = -vV ]; then echo 'rustc 9.9.9'; echo 'LLVM version: {llvm}.1.0'; exit 0; fi\nfor a in \"$@\"; do echo \"$a\"; done\n"
    );
    std::fs::write(&path, script).expect("write the stand-in rustc");
    let status = Command::new("chmod")
        .arg("+x")
        .arg(&path)
        .status()
        .expect("chmod");
    assert!(status.success());
    path
}

/// The arguments the stand-in compiler received through the wrapper.
fn through_wrapper(rustc: &Path, args: &[&str]) -> Vec<String> {
    let out = Command::new(repo().join("pgo/rustc-wrapper"))
        .arg(rustc)
        .args(args)
        .env("CARGO_BIN_EXE_ahp-relay", "/kept")
        .output()
        .expect("run pgo/rustc-wrapper");
    assert!(out.status.success(), "wrapper failed: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

fn profile_flag() -> String {
    format!(
        "-Cprofile-use={}",
        repo().join("pgo/relay.profdata").display()
    )
}

fn recorded_llvm() -> u32 {
    let text = std::fs::read_to_string(repo().join("pgo/llvm-major")).expect("pgo/llvm-major");
    text.trim().parse().expect("pgo/llvm-major holds a number")
}

#[test]
fn cargo_builds_through_the_wrapper_and_the_profile_is_committed() {
    let config = std::fs::read_to_string(repo().join(".cargo/config.toml")).expect("config");
    assert!(
        config.contains("rustc-wrapper = \"pgo/rustc-wrapper\""),
        "{config}"
    );
    let profile = std::fs::metadata(repo().join("pgo/relay.profdata")).expect("profile");
    assert!(
        profile.len() > 100_000,
        "a real profile, not a placeholder: {} bytes",
        profile.len()
    );
    let head = std::fs::read(repo().join("pgo/relay.profdata")).expect("profile");
    // LLVM's indexed profile magic, \xfflprofi\x81.
    assert_eq!(
        &head[..8],
        &[0xff, b'l', b'p', b'r', b'o', b'f', b'i', 0x81]
    );
    assert!(recorded_llvm() >= 15);
}

#[test]
fn optimised_compilations_get_the_profile_and_others_do_not() {
    if !cfg!(target_arch = "x86_64") {
        eprintln!("skipped: the profile is recorded for x86-64 Linux only");
        return;
    }
    let dir = Scratch::new("cases");
    let rustc = fake_rustc(dir.path(), &recorded_llvm().to_string());
    let flag = profile_flag();

    let release = through_wrapper(&rustc, &["--crate-name", "x", "-C", "opt-level=3"]);
    assert!(
        release.contains(&flag),
        "release build without the profile: {release:?}"
    );
    assert!(release.contains(&"-Cllvm-args=-no-pgo-warn-mismatch".to_string()));
    assert!(
        release.contains(&"-Cllvm-args=-enable-split-machine-functions".to_string()),
        "release build without the function splitter: {release:?}"
    );
    assert_eq!(
        &release[..4],
        &["--crate-name", "x", "-C", "opt-level=3"],
        "arguments kept"
    );

    let cases: [&[&str]; 7] = [
        &["--crate-name", "x"],
        &["--crate-name", "x", "-C", "opt-level=0"],
        &[
            "--crate-name",
            "x",
            "-C",
            "opt-level=3",
            "-Cprofile-generate=/tmp/p",
        ],
        &[
            "--crate-name",
            "x",
            "-C",
            "opt-level=3",
            "--target=aarch64-unknown-linux-gnu",
        ],
        &[
            "--crate-name",
            "x",
            "-C",
            "opt-level=3",
            "--target",
            "aarch64-unknown-linux-gnu",
        ],
        &[
            "--crate-name",
            "x",
            "-C",
            "opt-level=3",
            "-Zsanitizer=address",
        ],
        &["-", "--crate-name", "___", "--print=cfg"],
    ];
    for args in cases {
        let got = through_wrapper(&rustc, args);
        assert_eq!(got, args, "passed through unchanged");
    }
    let native = [
        "--crate-name",
        "x",
        "-C",
        "opt-level=3",
        "--target=x86_64-unknown-linux-gnu",
    ];
    assert!(through_wrapper(&rustc, &native).contains(&flag));
}

#[test]
fn an_older_llvm_compiles_without_the_profile() {
    let dir = Scratch::new("older");
    let older = fake_rustc(dir.path(), &(recorded_llvm() - 1).to_string());
    let args = ["--crate-name", "x", "-C", "opt-level=3"];
    assert_eq!(through_wrapper(&older, &args), args);
}

#[test]
fn the_wrapper_keeps_environment_names_rustc_needs() {
    // Cargo hands a bench `CARGO_BIN_EXE_ahp-relay`; a POSIX sh (dash) would
    // drop a name with '-' before rustc's `env!` reads it.
    let dir = Scratch::new("env");
    let printer = dir.path().join("printenv-rustc");
    std::fs::write(&printer, "#!/usr/bin/env bash\nexec env\n").expect("write");
    assert!(
        Command::new("chmod")
            .arg("+x")
            .arg(&printer)
            .status()
            .expect("chmod")
            .success()
    );
    let env = through_wrapper(&printer, &["--crate-name", "x"]);
    assert!(
        env.contains(&"CARGO_BIN_EXE_ahp-relay=/kept".to_string()),
        "{env:?}"
    );
}

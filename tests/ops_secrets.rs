//! Secrets at rest (issue 25): a relay refuses an example or low-entropy
//! relay secret, warns about secret files its group or others can read,
//! and the demo writes its env file (tokens) 0600 in a new private
//! directory (0700).

mod common;

use std::io::BufRead;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use ahp_relay::devkit::DevKit;
use common::WAIT;
use common::relay::{scratch_dir, serve_binary};

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path)
        .expect("metadata")
        .permissions()
        .mode()
        & 0o777
}

fn random_secret() -> Vec<u8> {
    let mut b = vec![0u8; 32];
    ahp_relay::identity::random_fill(&mut b).expect("random");
    b
}

/// The deploy manifests' placeholder, a repeated character and a short
/// alphabet are refused at start with a reason; 32 random bytes start.
#[tokio::test]
async fn an_example_or_weak_relay_secret_is_refused() {
    let kit = DevKit::create(&scratch_dir("weak-secret")).expect("kit");
    let cfg = kit.config("127.0.0.1:0", &[], "", "").expect("config");
    let secret = kit.dir.join("relay.secret");
    let weak: [(&[u8], &str); 3] = [
        (b"replace-me-with-32-random-bytes-000000", "example"),
        (&[b'x'; 48], "entropy"),
        (b"abcdabcdabcdabcdabcdabcdabcdabcdabcdabcd\n", "entropy"),
    ];
    for (value, why) in weak {
        std::fs::write(&secret, value).expect("secret");
        let err = ahp_relay::run::start(cfg.clone())
            .await
            .expect_err("a weak secret is refused")
            .to_string();
        assert!(err.contains(why) && err.contains("relay.secret"), "{err}");
    }
    std::fs::write(&secret, random_secret()).expect("secret");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let relay = ahp_relay::run::start(cfg)
        .await
        .expect("a random secret starts");
    relay.stop();
}

/// Secret files that the group or others can read are named in a warning
/// at start (the relay secret and the HS256 issuer secret here).
#[test]
fn shared_secret_files_are_warned_about() {
    let kit = DevKit::create(&scratch_dir("shared-secret")).expect("kit");
    kit.config("127.0.0.1:0", &[], "", "").expect("config");
    let secret = kit.dir.join("relay.secret");
    std::fs::write(&secret, random_secret()).expect("secret");
    for file in [&secret, &kit.dev_key] {
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    }
    let relay = serve_binary(&kit, "warn");
    for file in [&secret, &kit.dev_key] {
        let name = file.display().to_string();
        assert!(
            relay.head.iter().any(|l| l.contains("WARN")
                && l.contains("readable by group or others")
                && l.contains(&name)),
            "{name} is warned about: {:#?}",
            relay.head
        );
    }
}

/// A demo process, killed when dropped.
struct Demo(Child);

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `ahp-relay demo` writes the env file it tells the user to `source` (the
/// admin token among its lines) with mode 0600, in a directory of mode 0700.
#[test]
fn the_demo_env_file_is_private() {
    let mut demo = Demo(
        Command::new(env!("CARGO_BIN_EXE_ahp-relay"))
            .args(["demo", "--listen", "127.0.0.1:0", "--hosts", "1"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .env("RUST_LOG", "warn")
            .spawn()
            .expect("demo starts"),
    );
    let stdout = demo.0.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let env_file = loop {
        let line = rx.recv_timeout(WAIT).expect("the demo names its env file");
        if let Some(rest) = line.strip_prefix("In another terminal: source ") {
            break PathBuf::from(rest.split(" — ").next().expect("path"));
        }
    };
    let dir = env_file.parent().expect("dir").to_path_buf();
    assert_eq!(mode(&env_file), 0o600, "{}", env_file.display());
    assert_eq!(mode(&dir), 0o700, "{}", dir.display());
    let text = std::fs::read_to_string(&env_file).expect("env file");
    assert!(text.contains("export AHP_RELAY_ADMIN_TOKEN="), "{text}");
    drop(demo);
    let _ = std::fs::remove_dir_all(&dir);
}

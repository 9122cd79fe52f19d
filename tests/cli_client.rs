//! `ahp-relay client` as a user meets it (issue 23): the real binary, run
//! against a real relay over TLS in front of simulated hosts, with the
//! demo's policy. A day's work (providers, create, chats, send, dispose,
//! files), a turn waiting on a tool approval that `send --wait` reports with
//! the exact command that approves it, one retained session per user and
//! relay however many runs, hints where an answer is empty or "not found"
//! by design, and the `token` and `cert` commands.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use ahp_relay::devkit::DEMO_POLICY;
use ahp_relay::simhost::SimHostConfig;
use common::relay::{TestRelay, scratch_dir};
use common::{WAIT, fast_config};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

/// `buildbox` (provider `copilot`) and `gpu1` (provider `claude`).
fn hosts(tool_confirmation: bool) -> Vec<SimHostConfig> {
    let mut buildbox = fast_config("buildbox", 1);
    buildbox.provider = "copilot".into();
    buildbox.script.tool_confirmation = tool_confirmation;
    let mut gpu1 = fast_config("gpu1", 1);
    gpu1.provider = "claude".into();
    vec![buildbox, gpu1]
}

/// The binary as `sub`, with its own config directory (so its stored
/// client ids are this test's).
struct User {
    url: String,
    ca: PathBuf,
    token: String,
    config: PathBuf,
}

impl User {
    fn new(t: &TestRelay, sub: &str) -> Self {
        Self {
            url: t.url(),
            ca: t.kit.cert.clone(),
            token: t.token(sub),
            config: scratch_dir("cli-config"),
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ahp-relay"));
        cmd.arg("client")
            .args(args)
            .env_remove("AHP_RELAY_DEV_KEY")
            .env("AHP_RELAY_URL", &self.url)
            .env("AHP_RELAY_TOKEN", &self.token)
            .env("AHP_RELAY_CA", &self.ca)
            .env("XDG_CONFIG_HOME", &self.config)
            .kill_on_drop(true);
        cmd
    }

    /// Runs `client <args>` to the end (bounded by [`WAIT`] × 3).
    async fn run(&self, args: &[&str]) -> Ran {
        let out = self.command(args).output();
        let out = tokio::time::timeout(WAIT * 3, out)
            .await
            .expect("the client ends")
            .expect("the client runs");
        Ran::from(out)
    }

    /// Runs `client <args>` with `input` on stdin.
    async fn run_with_stdin(&self, args: &[&str], input: &[u8]) -> Ran {
        let mut child = self
            .command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the client runs");
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(input).await.expect("stdin written");
        drop(stdin);
        let out = tokio::time::timeout(WAIT * 3, child.wait_with_output())
            .await
            .expect("the client ends")
            .expect("output");
        Ran::from(out)
    }

    /// The client ids stored for this user.
    fn stored_ids(&self) -> Vec<String> {
        let dir = self.config.join("ahp-relay").join("clients");
        let mut ids: Vec<String> = std::fs::read_dir(&dir)
            .map(|rd| {
                rd.filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
                    .map(|s| s.trim().to_owned())
                    .collect()
            })
            .unwrap_or_default();
        ids.sort();
        ids
    }
}

/// What a finished run printed.
#[derive(Debug)]
struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl From<Output> for Ran {
    fn from(out: Output) -> Self {
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        Ran {
            code: out.status.code(),
            stdout: text(&out.stdout),
            stderr: text(&out.stderr),
        }
    }
}

impl Ran {
    #[track_caller]
    fn ok(self) -> Self {
        assert_eq!(self.code, Some(0), "{self:#?}");
        self
    }

    /// The rows of a table (the header checked and left out).
    #[track_caller]
    fn rows(&self, header: &str) -> Vec<Vec<String>> {
        let mut lines = self.stdout.lines();
        assert_eq!(lines.next(), Some(header), "{self:#?}");
        lines
            .map(|l| l.split('\t').map(str::to_owned).collect())
            .collect()
    }
}

/// A day's work as alice through the relay: the providers are named
/// `<provider>.<host>`; a session created on one shows with its default
/// chat in `sessions --chats` (table and JSON); a turn on that chat
/// replies; another chat is created, listed and disposed; the session is
/// disposed and gone from the listing. Every run reuses one client
/// session: the relay sees one `initialize` and a `reconnect` per later run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_days_work_with_sessions_chats_and_turns() {
    let t = TestRelay::start(hosts(false), DEMO_POLICY).await;
    let alice = User::new(&t, "alice");
    let providers = alice.run(&["providers"]).await.ok();
    let mut names: Vec<String> = providers
        .rows("PROVIDER\tNAME")
        .into_iter()
        .map(|r| r[0].clone())
        .collect();
    names.sort();
    assert_eq!(names, ["claude.gpu1", "copilot.buildbox"]);

    let created = alice
        .run(&["create-session", "--provider", "copilot.buildbox"])
        .await
        .ok();
    let fields: Vec<&str> = created.stdout.trim_end().split('\t').collect();
    let [session, chat] = fields[..] else {
        panic!("session and chat: {created:#?}")
    };
    assert!(session.starts_with("ahp-session:/cli-"), "{session}");
    assert!(chat.starts_with("ahp-chat:/"), "{chat}");

    let listed = alice.run(&["sessions", "--chats"]).await.ok();
    let rows = listed.rows("SESSION\tCHAT\tDEFAULT\tSTATUS\tTITLE");
    assert!(
        rows.iter()
            .any(|r| r[0] == session && r[1] == chat && r[2] == "*"),
        "{listed:#?}"
    );
    let json = alice.run(&["sessions", "--chats", "--json"]).await.ok();
    let doc: serde_json::Value = serde_json::from_str(&json.stdout).expect("JSON");
    let mine = doc
        .as_array()
        .and_then(|a| a.iter().find(|s| s["resource"] == session))
        .expect("the new session in JSON");
    assert_eq!(mine["defaultChat"], chat);
    assert_eq!(mine["provider"], "copilot.buildbox");

    let sent = alice.run(&["send", chat, "hello", "--wait"]).await.ok();
    assert!(!sent.stdout.trim().is_empty(), "a reply: {sent:#?}");
    assert!(sent.stderr.contains("accepted turn-"), "{sent:#?}");

    let second = alice.run(&["create-chat", session]).await.ok();
    let second = second.stdout.trim().to_owned();
    let listed = alice.run(&["sessions", "--chats"]).await.ok();
    let rows = listed.rows("SESSION\tCHAT\tDEFAULT\tSTATUS\tTITLE");
    assert!(
        rows.iter().any(|r| r[1] == second && r[2] == "-"),
        "{listed:#?}"
    );
    alice.run(&["dispose-chat", &second]).await.ok();
    alice.run(&["dispose-session", session]).await.ok();
    let after = alice.run(&["sessions"]).await.ok();
    let rows = after.rows("SESSION\tSTATUS\tMODIFIED\tPROVIDER\tTITLE");
    assert!(rows.iter().all(|r| r[0] != session), "{after:#?}");
    assert_eq!(rows.len(), 2, "the two seeded sessions remain: {after:#?}");

    let ids = alice.stored_ids();
    assert_eq!(ids.len(), 1, "one stored id for sequential runs: {ids:?}");
    assert!(t.has_session("alice", &ids[0]));
    assert_eq!(t.requests_handled("initialize"), 1);
    assert!(t.requests_handled("reconnect") >= 9);
}

/// Files of a host: `put` from stdin lands in the host's sandbox, `cat`
/// prints it back, `ls` lists it (table and JSON). Writing outside every
/// session's working directory needs `files:write` on the host (the
/// demo's `ops`); alice, an operator whose files are scoped to sessions'
/// working directories, is refused there with a hint naming her in the
/// `policy explain` command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_are_listed_read_and_written_on_the_named_host() {
    let t = TestRelay::start(hosts(false), DEMO_POLICY).await;
    let ops = User::new(&t, "ops");
    let sandbox = t.hosts[0].sandbox();
    let dir = format!("file://buildbox{}", sandbox.display());
    let file = format!("{dir}/notes.txt");
    ops.run_with_stdin(&["put", &file], b"remember the milk\n")
        .await
        .ok();
    let on_disk = std::fs::read_to_string(sandbox.join("notes.txt")).expect("written");
    assert_eq!(on_disk, "remember the milk\n");
    let cat = ops.run(&["cat", &file]).await.ok();
    assert_eq!(cat.stdout, "remember the milk\n");
    let ls = ops.run(&["ls", &dir]).await.ok();
    let rows = ls.rows("NAME\tTYPE");
    assert!(rows.iter().any(|r| r[0] == "notes.txt"), "{ls:#?}");
    let json = ops.run(&["ls", &dir, "--json"]).await.ok();
    assert!(json.stdout.contains("\"notes.txt\""), "{json:#?}");
    let operator = User::new(&t, "alice");
    let denied = operator.run_with_stdin(&["put", &file], b"x").await;
    assert_eq!(denied.code, Some(1));
    assert!(
        denied
            .stderr
            .contains("hint: `ahp-relay policy explain --sub alice --config <relay.toml>`"),
        "{denied:#?}"
    );
}

/// Reads `child`'s stderr until a line starting with `prefix`.
async fn stderr_line(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStderr>>,
    prefix: &str,
) -> String {
    let find = async {
        while let Some(line) = lines.next_line().await.expect("stderr") {
            if line.starts_with(prefix) {
                return line;
            }
        }
        panic!("stderr ended before a line starting with {prefix:?}")
    };
    tokio::time::timeout(WAIT, find)
        .await
        .expect("the line in time")
}

/// `send --wait` on a turn that waits for a tool approval does not hang
/// silently: it prints which tool waits and the exact command that
/// approves it. Running that command (a second client run, beside the
/// first: it takes a second stored id) lets the turn finish, and `send`
/// exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_wait_names_the_tool_and_the_command_that_approves_it() {
    let t = TestRelay::start(hosts(true), DEMO_POLICY).await;
    let alice = User::new(&t, "alice");
    let chat = "ahp-chat:/buildbox~buildbox-1-main";
    let mut send = alice
        .command(&["send", chat, "run the tests", "--wait"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("send runs");
    let mut lines = BufReader::new(send.stderr.take().expect("stderr")).lines();
    let waiting = stderr_line(&mut lines, "waiting: ").await;
    assert!(
        waiting.starts_with("waiting: tool `sim_shell` needs approval: "),
        "{waiting}"
    );
    let command = waiting
        .split_once("needs approval: ")
        .and_then(|(_, rest)| rest.split("  (or:").next())
        .expect("the approve command");
    let words: Vec<&str> = command.split_whitespace().collect();
    assert_eq!(words[0], env!("CARGO_BIN_EXE_ahp-relay"), "{command}");
    assert_eq!(&words[1..4], ["client", "approve", chat], "{command}");
    alice.run(&words[2..]).await.ok();
    let out = tokio::time::timeout(WAIT, send.wait_with_output())
        .await
        .expect("send ends once approved")
        .expect("output");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        alice.stored_ids().len(),
        2,
        "a concurrent run took a second id"
    );
}

/// `--timeout` bounds the whole wait: unapproved, `send --wait` ends with
/// exit code 3 and names what the turn waits for; `cancel` clears the turn
/// so the next send is accepted; `deny` refuses a tool call and the turn
/// goes on without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_turn_times_out_and_is_cancelled_or_denied() {
    let t = TestRelay::start(hosts(true), DEMO_POLICY).await;
    let alice = User::new(&t, "alice");
    let chat = "ahp-chat:/buildbox~buildbox-1-main";
    let stuck = alice
        .run(&["send", chat, "run", "--wait", "--timeout", "2"])
        .await;
    assert_eq!(stuck.code, Some(3), "{stuck:#?}");
    assert!(
        stuck.stderr.contains(
            "the turn did not finish within 2s; it waits for approval of tool `sim_shell`"
        ),
        "{stuck:#?}"
    );
    let busy = alice.run(&["send", chat, "again"]).await;
    assert_eq!(busy.code, Some(2), "still busy: {busy:#?}");
    let cancelled = alice.run(&["cancel", chat]).await.ok();
    assert!(
        cancelled.stderr.contains("cancelled turn-"),
        "{cancelled:#?}"
    );
    let idle = alice.run(&["cancel", chat]).await;
    assert_eq!(idle.code, Some(1));
    assert!(idle.stderr.contains("has no active turn"), "{idle:#?}");

    // A new turn stops at its tool call again; deny it.
    let mut send = alice
        .command(&["send", chat, "once more", "--wait"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("send runs");
    let mut lines = BufReader::new(send.stderr.take().expect("stderr")).lines();
    stderr_line(&mut lines, "waiting: ").await;
    // `tail` reports the wait too, from the snapshot, with the same command.
    let mut tail = alice
        .command(&["tail", chat, "--turns", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tail runs");
    let mut tail_err = BufReader::new(tail.stderr.take().expect("stderr")).lines();
    let told = stderr_line(&mut tail_err, "waiting: ").await;
    assert!(told.contains(" client approve "), "{told}");
    let denied = alice.run(&["deny", chat]).await.ok();
    assert!(
        denied.stderr.contains("denied tool `sim_shell`"),
        "{denied:#?}"
    );
    let out = tokio::time::timeout(WAIT, send.wait_with_output())
        .await
        .expect("send ends once denied")
        .expect("output");
    assert!(out.status.code().is_some(), "{out:?}");
    let tailed = tokio::time::timeout(WAIT, tail.wait())
        .await
        .expect("tail ends with the turn")
        .expect("status");
    assert!(tailed.success());
}

/// Where the answer is empty or "not found" by design, a hint says why and
/// what to run: dave, whom no rule names, sees no host and is pointed at
/// `policy explain` with his subject; a chat that does not exist (or is
/// not visible) points at `sessions --chats`; without the CA the TLS error
/// names `--ca` and `AHP_RELAY_CA`; a refused token is named as such.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_and_not_found_answers_come_with_a_hint() {
    let t = TestRelay::start(hosts(false), DEMO_POLICY).await;
    let dave = User::new(&t, "dave");
    let none = dave.run(&["sessions"]).await.ok();
    assert!(
        none.rows("SESSION\tSTATUS\tMODIFIED\tPROVIDER\tTITLE")
            .is_empty()
    );
    assert!(none.stderr.contains("0 sessions"), "{none:#?}");
    assert!(
        none.stderr
            .contains("hint: no host is visible to this principal"),
        "{none:#?}"
    );
    assert!(
        none.stderr.contains("ahp-relay policy explain --sub dave"),
        "{none:#?}"
    );

    let alice = User::new(&t, "alice");
    let missing = alice
        .run(&["send", "ahp-chat:/buildbox~no-such-chat", "hi"])
        .await;
    assert_eq!(missing.code, Some(1), "{missing:#?}");
    assert!(
        missing
            .stderr
            .contains("hint: `ahp-relay client sessions --chats` lists"),
        "{missing:#?}"
    );

    let mut untrusting = User::new(&t, "alice");
    untrusting.ca = PathBuf::new();
    let tls = untrusting
        .command(&["sessions"])
        .env_remove("AHP_RELAY_CA")
        .output()
        .await
        .expect("runs");
    let tls = Ran::from(tls);
    assert_eq!(tls.code, Some(1));
    assert!(tls.stderr.contains("UnknownIssuer"), "{tls:#?}");
    assert!(
        tls.stderr.contains("--ca FILE or set AHP_RELAY_CA"),
        "{tls:#?}"
    );

    let mut forged = User::new(&t, "alice");
    forged.token = "not.a.token".into();
    let refused = forged.run(&["sessions"]).await;
    assert_eq!(refused.code, Some(1));
    assert!(
        refused.stderr.contains("upgrade refused: HTTP 401"),
        "{refused:#?}"
    );
    assert!(
        refused.stderr.contains("hint: the relay refused the token"),
        "{refused:#?}"
    );
}

/// Runs `ahp-relay <args>` (not `client`) to the end.
async fn ahp_relay(args: &[&str]) -> Ran {
    let out = Command::new(env!("CARGO_BIN_EXE_ahp-relay"))
        .args(args)
        .env_remove("AHP_RELAY_DEV_KEY")
        .output()
        .await
        .expect("runs");
    Ran::from(out)
}

/// `token` refuses a token the relay would refuse — over the unrevocable
/// lifetime without `jti` — and says how to fix it; with `--jti` it mints;
/// `--force` mints it with a warning, and the relay indeed refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_refuses_what_the_relay_would_refuse() {
    let t = TestRelay::start(hosts(false), DEMO_POLICY).await;
    let key = t.kit.dev_key.display().to_string();
    let base = ["token", "--key", &key, "--sub", "alice", "--ttl", "7d"];
    let refused = ahp_relay(&base).await;
    assert_eq!(refused.code, Some(1));
    assert!(refused.stdout.is_empty(), "no token printed");
    assert!(
        refused
            .stderr
            .contains("max_unrevocable_lifetime_secs = 3600): pass --jti ID"),
        "{refused:#?}"
    );
    let with_jti = [&base[..], &["--jti", "week-1"]].concat();
    ahp_relay(&with_jti).await.ok();
    let config = t.kit.dir.join("relay.toml").display().to_string();
    let checked = [&base[..], &["--config", &config]].concat();
    assert_eq!(
        ahp_relay(&checked).await.code,
        Some(1),
        "the config's limit"
    );
    let forced = [&base[..], &["--force"]].concat();
    let forced = ahp_relay(&forced).await.ok();
    assert!(forced.stderr.starts_with("warning: "), "{forced:#?}");
    let mut user = User::new(&t, "alice");
    user.token = forced.stdout.trim().to_owned();
    let at_relay = user.run(&["sessions"]).await;
    assert_eq!(at_relay.code, Some(1));
    assert!(
        at_relay.stderr.contains("upgrade refused: HTTP 401"),
        "{at_relay:#?}"
    );
}

/// `cert` writes a CA and a server certificate that a relay serves and a
/// client trusting only that CA accepts; it never overwrites them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cert_makes_a_ca_and_server_certificate_a_relay_serves() {
    let out = scratch_dir("cert");
    let dir = out.display().to_string();
    let args = [
        "cert",
        "--host",
        "localhost",
        "--host",
        "127.0.0.1",
        "--out",
        &dir,
    ];
    let made = ahp_relay(&args).await.ok();
    assert!(made.stdout.contains("tls_cert = "), "{made:#?}");
    let again = ahp_relay(&args).await;
    assert_eq!(again.code, Some(1), "existing files are kept: {again:#?}");

    let t = TestRelay::start_tweaked(hosts(false), "", DEMO_POLICY, |cfg| {
        cfg.listen.tls_cert = Some(out.join("server.pem"));
        cfg.listen.tls_key = Some(out.join("server-key.pem"));
    })
    .await;
    t.wait_hosts_up().await;
    let mut alice = User::new(&t, "alice");
    alice.ca = out.join("ca.pem");
    let listed = alice.run(&["sessions"]).await.ok();
    assert_eq!(
        listed
            .rows("SESSION\tSTATUS\tMODIFIED\tPROVIDER\tTITLE")
            .len(),
        2
    );
    assert!(Path::new(&out.join("ca-key.pem")).exists());
}

/// The demo's tenancy, tried from the command line: bob creates a session
/// and then sees exactly it (visibility `own`), alice sees it among all;
/// carol, a viewer, cannot create one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bob_sees_only_the_session_he_created() {
    let t = TestRelay::start(hosts(false), DEMO_POLICY).await;
    let bob = User::new(&t, "bob");
    let before = bob.run(&["sessions"]).await.ok();
    assert!(
        before
            .rows("SESSION\tSTATUS\tMODIFIED\tPROVIDER\tTITLE")
            .is_empty()
    );
    assert!(
        before.stderr.contains("no session yet"),
        "bob sees hosts, not sessions: {before:#?}"
    );
    let unnamed = bob.run(&["create-session"]).await;
    assert_eq!(unnamed.code, Some(1), "two providers: {unnamed:#?}");
    assert!(
        unnamed
            .stderr
            .contains("hint: `ahp-relay client providers` lists"),
        "{unnamed:#?}"
    );
    let created = bob
        .run(&["create-session", "--provider", "claude.gpu1"])
        .await
        .ok();
    let session = created
        .stdout
        .split('\t')
        .next()
        .unwrap_or_default()
        .to_owned();
    let mine = bob.run(&["sessions"]).await.ok();
    let rows = mine.rows("SESSION\tSTATUS\tMODIFIED\tPROVIDER\tTITLE");
    assert_eq!(rows.len(), 1, "{mine:#?}");
    assert_eq!(rows[0][0], session);
    assert_eq!(rows[0][3], "claude.gpu1");
    let alice = User::new(&t, "alice");
    let all = alice.run(&["sessions"]).await.ok();
    let rows = all.rows("SESSION\tSTATUS\tMODIFIED\tPROVIDER\tTITLE");
    assert_eq!(rows.len(), 3, "{all:#?}");
    let carol = User::new(&t, "carol");
    let refused = carol
        .run(&["create-session", "--provider", "copilot.buildbox"])
        .await;
    assert_eq!(refused.code, Some(1), "{refused:#?}");
}

/// VS Code mode: sessions are `<provider>.<host>:/<id>` and `sessions
/// --chats` shows each one's default chat `ahp-chat://default/<b64url(session)>`
/// — the URI the user would otherwise encode by hand — and a turn on it replies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vscode_mode_default_chats_are_shown_ready_to_use() {
    use base64::Engine as _;
    let mut hosts = hosts(false);
    for h in &mut hosts {
        h.vscode_compat = true;
    }
    let t = TestRelay::start(hosts, DEMO_POLICY).await;
    let alice = User::new(&t, "alice");
    let listed = alice.run(&["sessions", "--chats"]).await.ok();
    let rows = listed.rows("SESSION\tCHAT\tDEFAULT\tSTATUS\tTITLE");
    let row = rows
        .iter()
        .find(|r| r[0].starts_with("copilot.buildbox:/"))
        .unwrap_or_else(|| panic!("a buildbox session: {listed:#?}"));
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&row[0]);
    assert_eq!(row[1], format!("ahp-chat://default/{b64}"));
    assert_eq!(row[2], "*");
    let sent = alice.run(&["send", &row[1], "hello", "--wait"]).await.ok();
    assert!(!sent.stdout.trim().is_empty(), "{sent:#?}");

    let created = alice
        .run(&["create-session", "--provider", "copilot.buildbox"])
        .await
        .ok();
    let fields: Vec<&str> = created.stdout.trim_end().split('\t').collect();
    let [_, chat] = fields[..] else {
        panic!("session and chat: {created:#?}")
    };
    let sent = alice.run(&["send", chat, "hello", "--wait"]).await.ok();
    assert!(!sent.stdout.trim().is_empty(), "{sent:#?}");
}

/// The stored id outlives the relay's memory of it: once the relay has
/// dropped the retained session (`retain_secs`), the next run's `reconnect`
/// gets `NotFound`, the run `initialize`s the same id instead, and works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forgotten_session_is_initialized_again_under_the_same_id() {
    let limits = "[limits]\ndetach_grace_secs = 1\nretain_secs = 1\n";
    let t = TestRelay::start(hosts(false), &format!("{limits}{DEMO_POLICY}")).await;
    let alice = User::new(&t, "alice");
    alice.run(&["sessions"]).await.ok();
    let ids = alice.stored_ids();
    assert_eq!(ids.len(), 1);
    common::wait_until("the relay drops the retained session", || {
        !t.has_session("alice", &ids[0])
    })
    .await;
    let again = alice.run(&["sessions"]).await.ok();
    assert_eq!(
        again
            .rows("SESSION\tSTATUS\tMODIFIED\tPROVIDER\tTITLE")
            .len(),
        2
    );
    assert_eq!(alice.stored_ids(), ids, "the same id");
    assert_eq!(t.requests_handled("reconnect"), 1, "tried first");
    assert_eq!(t.requests_handled("initialize"), 2, "then initialized");
    assert!(t.has_session("alice", &ids[0]));
}

/// `terminal --cwd file://<host>/<path>` creates a terminal on that host
/// and attaches to it: what is typed on stdin reaches the terminal (the
/// simulated host echoes it as output, which is printed); when stdin ends
/// the command detaches once its input was accepted. Attaching again by
/// URI prints the terminal's content so far.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminal_attaches_stdin_and_stdout() {
    let t = TestRelay::start(hosts(false), DEMO_POLICY).await;
    let alice = User::new(&t, "alice");
    let cwd = format!("file://buildbox{}", t.hosts[0].sandbox().display());
    let mut term = alice
        .command(&["terminal", "--cwd", &cwd])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("terminal runs");
    let mut lines = BufReader::new(term.stderr.take().expect("stderr")).lines();
    let created = stderr_line(&mut lines, "created ").await;
    let uri = created.trim_start_matches("created ").to_owned();
    assert!(uri.starts_with("ahp-terminal:/"), "{uri}");
    let mut stdin = term.stdin.take().expect("stdin");
    stdin.write_all(b"echo hi\n").await.expect("typed");
    let mut out = BufReader::new(term.stdout.take().expect("stdout")).lines();
    let echoed = tokio::time::timeout(WAIT, out.next_line())
        .await
        .expect("output in time")
        .expect("stdout");
    assert_eq!(echoed.as_deref(), Some("echo hi"));
    drop(stdin);
    let status = tokio::time::timeout(WAIT, term.wait())
        .await
        .expect("detaches at the end of stdin")
        .expect("status");
    assert!(status.success());

    let again = alice.run_with_stdin(&["terminal", &uri], b"").await.ok();
    assert!(again.stdout.contains("echo hi"), "{again:#?}");
}

//! Files scoped by working directory (issue 18 item 8, contract §7.1): a
//! rule with `files = "session-dirs"` lets a principal read files inside
//! the working directories of the sessions it sees and write inside those
//! of the sessions it operates — checked lexically (percent-decoding,
//! `..`, whole segments) and then on the host-canonical path
//! (`resourceResolve`, so a symlink cannot lead out) before anything is
//! forwarded; outside, -32009 and the host receives no command. Real relay,
//! real simhost, files on disk in the simhost's sandbox.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ahp_relay::policy::{PolicyConfig, RulePolicy};
use common::relay::{TestRelay, rule};
use common::*;
use serde_json::{Value, json};

const ALICE_SESSION: &str = "ahp-session:/alice-files-1";

/// alice and bob operate their own sessions, vera views every session,
/// all three with files scoped to sessions' working directories; root is
/// admin. `alice_scope` is alice's rule's extra line.
fn rules(alice_scope: &str) -> String {
    let scoped = "files = \"session-dirs\"";
    rule("alice", &["alice"], &["*"], "operator", "own", alice_scope)
        + &rule("bob", &["bob"], &["*"], "operator", "own", scoped)
        + &rule("vera", &["vera"], &["*"], "viewer", "all", scoped)
        + &rule("root", &["root"], &["*"], "admin", "all", "")
}

/// A relay in front of host `a` (no seeded sessions) whose sandbox holds
/// alice's project `proj` (with links out of it), a sibling `project2`
/// sharing its prefix and `outside`; alice's session works in `proj`.
struct Setup {
    t: TestRelay,
    alice: RawWs,
    sandbox: PathBuf,
}

impl Setup {
    async fn start() -> Self {
        let t = TestRelay::start(
            vec![fast_config("a", 0)],
            &rules("files = \"session-dirs\""),
        )
        .await;
        let sandbox = t.hosts[0].sandbox();
        for d in ["proj", "project2", "outside"] {
            std::fs::create_dir_all(sandbox.join(d)).expect("dir");
        }
        std::fs::write(sandbox.join("outside/target.txt"), "not alice's").expect("target");
        link(&sandbox.join("outside"), &sandbox.join("proj/escape"));
        link(
            &sandbox.join("outside/target.txt"),
            &sandbox.join("proj/link.txt"),
        );
        link(
            &sandbox.join("outside/made.txt"),
            &sandbox.join("proj/dangling"),
        );
        let mut alice = t.raw("alice").await;
        alice.initialize("alice-files").await;
        let create = json!({"channel": ALICE_SESSION, "provider": "sim.a",
            "workingDirectories": [uri(&sandbox, "proj")]});
        let r = alice.request(1, "createSession", create).await;
        assert_eq!(r.get("result"), Some(&Value::Null), "{r}");
        Self { t, alice, sandbox }
    }

    fn uri(&self, rel: &str) -> String {
        uri(&self.sandbox, rel)
    }

    /// The `resourceWrite` commands host `a` received.
    fn writes_on_host(&self) -> usize {
        host_frames(&self.t.hosts[0], "resourceWrite").len()
    }

    async fn user(&self, sub: &str) -> RawWs {
        let mut ws = self.t.raw(sub).await;
        ws.initialize(&format!("{sub}-files")).await;
        ws
    }
}

fn uri(sandbox: &Path, rel: &str) -> String {
    format!("file://a{}/{rel}", sandbox.display())
}

fn link(target: &Path, at: &Path) {
    std::os::unix::fs::symlink(target, at).expect("symlink");
}

async fn write(ws: &mut RawWs, id: u64, uri: &str) -> Value {
    let p = json!({"channel": "ahp-root://", "uri": uri, "data": "saved", "encoding": "utf-8"});
    ws.request(id, "resourceWrite", p).await
}

async fn read(ws: &mut RawWs, id: u64, uri: &str) -> Value {
    let p = json!({"channel": "ahp-root://", "uri": uri});
    ws.request(id, "resourceRead", p).await
}

fn denied(r: &Value, what: &str) {
    assert_eq!(r["error"]["code"], -32009, "{what}: {r}");
}

/// alice saves and reads a file in her session's working directory (the
/// editor's `resourceWrite`), lists it and watches it; every way out of it
/// — a sibling sharing the prefix, `..` (also percent-encoded), a symlinked
/// directory, a symlinked file, a dangling link, a plain read outside — is
/// -32009, reaches the host as no write, creates nothing, and is audited.
#[tokio::test]
async fn alice_saves_in_her_working_directory_and_nowhere_else() {
    let mut s = Setup::start().await;
    let notes = s.uri("proj/notes.txt");
    let r = write(&mut s.alice, 2, &notes).await;
    assert!(r.get("result").is_some(), "{r}");
    let on_disk = std::fs::read_to_string(s.sandbox.join("proj/notes.txt")).expect("saved");
    assert_eq!(on_disk, "saved");
    let r = read(&mut s.alice, 3, &notes).await;
    assert_eq!(r["result"]["data"], "saved", "{r}");
    let list = json!({"channel": "ahp-root://", "uri": s.uri("proj")});
    let r = s.alice.request(4, "resourceList", list).await;
    assert!(r.to_string().contains("notes.txt"), "{r}");
    let watch = json!({"channel": "ahp-root://", "uri": s.uri("proj"), "recursive": true});
    let r = s.alice.request(5, "createResourceWatch", watch).await;
    let channel = r["result"]["channel"]
        .as_str()
        .unwrap_or_else(|| panic!("{r}"));
    let r = s
        .alice
        .request(6, "subscribe", json!({"channel": channel}))
        .await;
    assert!(r.get("result").is_some(), "alice follows her watch: {r}");
    assert_eq!(s.writes_on_host(), 1);
    let (copy, moved) = (s.uri("proj/copy.txt"), s.uri("proj/sub/moved.txt"));
    let r = s
        .alice
        .request(
            7,
            "resourceMkdir",
            json!({"channel": "ahp-root://", "uri": s.uri("proj/sub")}),
        )
        .await;
    assert!(r.get("result").is_some(), "mkdir inside: {r}");
    let cp = |source: &str, destination: &str| json!({"channel": "ahp-root://", "source": source, "destination": destination});
    let r = s.alice.request(8, "resourceCopy", cp(&notes, &copy)).await;
    assert!(r.get("result").is_some(), "copy inside: {r}");
    let r = s.alice.request(9, "resourceMove", cp(&copy, &moved)).await;
    assert!(r.get("result").is_some(), "move inside: {r}");
    assert!(s.sandbox.join("proj/sub/moved.txt").exists());
    let out_of = [
        (cp(&notes, &s.uri("outside/copied.txt")), "copy out"),
        (
            cp(&s.uri("outside/target.txt"), &copy),
            "copy in from outside",
        ),
    ];
    for (n, (params, what)) in out_of.into_iter().enumerate() {
        let r = s.alice.request(30 + n as u64, "resourceCopy", params).await;
        denied(&r, what);
    }
    let r = s
        .alice
        .request(32, "resourceMove", cp(&moved, &s.uri("outside/moved.txt")))
        .await;
    denied(&r, "move out");
    assert!(!s.sandbox.join("outside/copied.txt").exists());
    assert!(!s.sandbox.join("proj/copy.txt").exists());

    let escapes = [
        ("project2/x.txt", "a sibling sharing the prefix"),
        ("proj/../outside/x.txt", "a .. escape"),
        ("proj/%2E%2E/outside/x.txt", "an encoded .. escape"),
        ("proj/escape/x.txt", "a symlinked directory pointing out"),
        ("proj/link.txt", "a symlinked file pointing out"),
        ("proj/dangling", "a dangling link pointing out"),
    ];
    for (n, (rel, what)) in escapes.iter().enumerate() {
        let target = s.uri(rel);
        let r = write(&mut s.alice, 10 + n as u64, &target).await;
        denied(&r, what);
    }
    let (outside, linked) = (s.uri("outside/target.txt"), s.uri("proj/link.txt"));
    let r = read(&mut s.alice, 20, &outside).await;
    denied(&r, "a read outside");
    let r = read(&mut s.alice, 21, &linked).await;
    denied(&r, "a read through a link out");
    assert_eq!(s.writes_on_host(), 1, "no refused write reached the host");
    assert!(!s.sandbox.join("project2/x.txt").exists());
    assert!(!s.sandbox.join("outside/x.txt").exists());
    assert!(!s.sandbox.join("outside/made.txt").exists());
    let target = std::fs::read_to_string(s.sandbox.join("outside/target.txt")).expect("target");
    assert_eq!(target, "not alice's");
    let escape = s.uri("proj/escape/x.txt");
    let audited = ahp_relay::policy::recent::denials()
        .into_iter()
        .any(|d| d.subject == "alice" && d.channel == escape && d.operation == "resourceWrite");
    assert!(audited, "the canonical refusal is audited");
}

/// bob (operator, visibility own) neither reads nor writes in alice's
/// working directory; vera (viewer, visibility all) reads there but does
/// not write; root (admin) writes anywhere in the host's sandbox.
#[tokio::test]
async fn others_get_what_their_sessions_and_roles_give() {
    let mut s = Setup::start().await;
    let notes = s.uri("proj/notes.txt");
    assert!(write(&mut s.alice, 2, &notes).await.get("result").is_some());
    let mut bob = s.user("bob").await;
    denied(&read(&mut bob, 1, &notes).await, "bob reads alice's file");
    denied(&write(&mut bob, 2, &notes).await, "bob writes alice's file");
    let mut vera = s.user("vera").await;
    let r = read(&mut vera, 1, &notes).await;
    assert_eq!(r["result"]["data"], "saved", "vera reads: {r}");
    denied(&write(&mut vera, 2, &notes).await, "vera writes");
    let mut root = s.user("root").await;
    let r = write(&mut root, 1, &s.uri("outside/by-root.txt")).await;
    assert!(r.get("result").is_some(), "the admin writes anywhere: {r}");
    assert_eq!(s.writes_on_host(), 2, "alice's and root's writes only");
}

/// bob cannot make alice's directory one of his sessions' (§7.1): a
/// session of his working in it, or in a directory containing it, is
/// -32009; one working in a symlink to it is created but grants nothing
/// there (the directory is not canonical); one in a directory of his own
/// lets him save there.
#[tokio::test]
async fn bob_cannot_claim_alices_directory() {
    let s = Setup::start().await;
    link(&s.sandbox.join("proj"), &s.sandbox.join("bob-link"));
    std::fs::create_dir_all(s.sandbox.join("bob-proj")).expect("bob's dir");
    let mut bob = s.user("bob").await;
    let create = |n: u32, dir: String| {
        json!({"channel": format!("ahp-session:/bob-files-{n}"), "provider": "sim.a",
            "workingDirectories": [dir]})
    };
    for (n, rel) in [(1, "proj"), (2, "proj/sub"), (3, "")] {
        let r = bob
            .request(u64::from(n), "createSession", create(n, s.uri(rel)))
            .await;
        denied(&r, &format!("bob claims {rel:?}"));
    }
    for (n, rel) in [(4, "bob-link"), (5, "bob-proj")] {
        let r = bob
            .request(u64::from(n), "createSession", create(n, s.uri(rel)))
            .await;
        assert_eq!(r.get("result"), Some(&Value::Null), "{rel}: {r}");
    }
    denied(
        &write(&mut bob, 6, &s.uri("bob-link/x.txt")).await,
        "through his link",
    );
    assert!(!s.sandbox.join("proj/x.txt").exists());
    let r = write(&mut bob, 7, &s.uri("bob-proj/x.txt")).await;
    assert!(r.get("result").is_some(), "bob saves in his own: {r}");
    assert_eq!(s.writes_on_host(), 1, "bob's own save only");
}

/// The scope follows the policy and the catalog (§7.6): after a reload
/// that drops alice's option her save is refused; with the option back,
/// it works again until she disposes her session — then its directory
/// grants nothing.
#[tokio::test]
async fn the_scope_follows_reloads_and_disposed_sessions() {
    let mut s = Setup::start().await;
    let notes = s.uri("proj/notes.txt");
    assert!(write(&mut s.alice, 2, &notes).await.get("result").is_some());
    s.t.relay.relay.set_policy(policy(&rules("")));
    denied(&write(&mut s.alice, 3, &notes).await, "after the reload");
    s.t.relay
        .relay
        .set_policy(policy(&rules("files = \"session-dirs\"")));
    assert!(write(&mut s.alice, 4, &notes).await.get("result").is_some());
    let dispose = json!({"channel": ALICE_SESSION});
    let r = s.alice.request(5, "disposeSession", dispose).await;
    assert!(r.get("result").is_some(), "{r}");
    let hub = s.t.relay.relay.hubs().next().expect("host a");
    wait_until("the catalog drops alice's session", || {
        !hub.has_session(ALICE_SESSION)
    })
    .await;
    denied(&write(&mut s.alice, 6, &notes).await, "after the dispose");
    assert_eq!(s.writes_on_host(), 2);
}

fn policy(rules: &str) -> Arc<RulePolicy> {
    #[derive(serde::Deserialize)]
    struct Doc {
        policy: PolicyConfig,
    }
    let doc: Doc = toml::from_str(rules).expect("rules parse");
    Arc::new(RulePolicy::new(&doc.policy))
}

/// §7.6: a write allowed by alice's session-directory scope waits for the
/// host to resolve its path; a reload takes the scope away meanwhile: the
/// write is decided again and refused (-32603 `rightsChanged`, retryable:
/// sent again it is -32009), and the host never receives it. Before, the
/// write decided under the old rule was forwarded once the paths resolved.
#[tokio::test]
async fn a_write_whose_scope_is_reloaded_away_while_its_path_resolves_is_not_forwarded() {
    let mut s = Setup::start().await;
    let notes = s.uri("proj/late.txt");
    let upstream = s.t.upstream_id("alice", "alice-files");
    s.t.hosts[0].stall_client(&upstream, true);
    let before = s.t.requests_handled("resourceWrite");
    let p = json!({"channel": "ahp-root://", "uri": notes, "data": "saved", "encoding": "utf-8"});
    s.alice
        .send_json(&request_frame(2, "resourceWrite", p))
        .await;
    wait_until("the write is read", || {
        s.t.requests_handled("resourceWrite") == before + 1
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    s.t.relay.relay.set_policy(policy(&rules("")));
    s.t.hosts[0].stall_client(&upstream, false);
    let r = s.alice.response(&json!(2)).await;
    assert_eq!(r["error"]["data"]["reason"], "rightsChanged", "{r}");
    assert_eq!(r["error"]["data"]["retryable"], true, "{r}");
    denied(&write(&mut s.alice, 3, &notes).await, "sent again");
    assert_eq!(s.writes_on_host(), 0, "the host received no write");
    assert!(!s.sandbox.join("proj/late.txt").exists());
}

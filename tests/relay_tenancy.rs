//! Multi-tenancy through the relay over real TLS sockets, with several
//! principals on two shared simhosts `a` and `b` (contract §1, §3.5, §4.3,
//! §4.4, §6.1, §6.4, §7; scenarios S10, S10b, S10c, S19):
//!
//! - a matrix of role × visibility × object × operation, each cell's
//!   decision (invisible / denied / allowed) computed by a small pure
//!   function from the rules and compared with what the relay does;
//! - S10: an invisible session answers byte for byte like a random URI and
//!   no frame of it reaches a host; a viewer's turn is rejected;
//! - S10b: URI fields (attachments, fork sources, move destinations,
//!   terminal claims) naming invisible, bare host-form or foreign objects;
//! - S10c: another principal with the same `clientId` is another upstream
//!   client: it cannot touch the first one's tool calls or terminals;
//! - root, catalog notifications, replay and policy reloads follow
//!   visibility; S19: per-principal caps.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use ahp_relay::policy::{PolicyConfig, RulePolicy};
use ahp_relay::simhost::{SimHost, SimHostConfig};
use ahp_relay::upstream::dial::dial_stream;
use common::relay::{TestRelay, rule};
use common::*;
use serde_json::{Value, json};

/// The `clientId` of the relay's own watch links at the hosts.
fn watch() -> String {
    ahp_relay::upstream::watch::watch_client_id().to_string()
}
/// The client tool the simhost agent calls on `[client-tool:read_tab]`.
const TOOL: &str = "read_tab";

// ─── relays, policies, principals ───────────────────────────────────────────

/// Two fast hosts `a` and `b`, one seeded session each.
fn two_hosts() -> Vec<SimHostConfig> {
    vec![fast_config("a", 1), fast_config("b", 1)]
}

/// A rule policy from `[[policy.rules]]` TOML, validated against hosts a, b.
fn policy(text: &str) -> Arc<RulePolicy> {
    #[derive(serde::Deserialize)]
    struct Doc {
        policy: PolicyConfig,
    }
    let doc: Doc = toml::from_str(text).unwrap_or_else(|e| panic!("policy parses: {e}\n{text}"));
    doc.policy
        .validate(&[("a", None), ("b", None)])
        .unwrap_or_else(|e| panic!("policy validates: {e:?}\n{text}"));
    Arc::new(RulePolicy::new(&doc.policy))
}

/// Parsed frames `host` received from upstream client `client`.
fn frames_from(host: &SimHost, client: &str) -> Vec<Value> {
    host.received_from(client)
        .iter()
        .map(|f| serde_json::from_str(&f.text).expect("recorded frame is JSON"))
        .collect()
}

/// Frames `host` received from anyone but the watch link and `allowed`.
fn foreign_frames(host: &SimHost, allowed: &[&str]) -> Vec<String> {
    host.received()
        .into_iter()
        .filter(|f| {
            let c = f.client_id.as_deref().unwrap_or("");
            c != watch() && !allowed.contains(&c)
        })
        .map(|f| format!("{:?}: {}", f.client_id, f.text))
        .collect()
}

/// `text` with its `"id":<id>` token replaced, to compare two answers
/// modulo their request ids.
fn without_id(text: &str, id: u64) -> String {
    let needle = format!("\"id\":{id}");
    assert!(text.contains(&needle), "no {needle} in {text}");
    text.replacen(&needle, "\"id\":_", 1)
}

fn chat_attachment(resource: &str) -> Value {
    json!({"type": "chat", "label": "see there", "resource": resource})
}

fn session_claim(session: &str, chat: &str) -> Value {
    json!({"kind": "session", "session": session, "chat": chat})
}

/// `ahp-chat:/<host>~<id>-main`: the client name of a session's first chat.
fn main_chat_of(host: &str, session_id: &str) -> String {
    format!("ahp-chat:/{host}~{session_id}-main")
}

// ─── a raw client that keeps every frame ────────────────────────────────────

/// A raw JSON-RPC client through the relay that logs every frame that is
/// not the answer it waits for.
struct Peer {
    ws: RawWs,
    who: String,
    client_id: String,
    log: Vec<Value>,
    next_id: u64,
    next_seq: i64,
    /// The highest client sequence number seen (for `reconnect`).
    seen: u64,
}

impl Peer {
    /// A socket as `sub` with `groups` in its token (not initialized).
    async fn open(t: &TestRelay, sub: &str, groups: &[&str]) -> Peer {
        let token = t
            .kit
            .token(sub, groups, Duration::from_secs(3600), None)
            .expect("token");
        let ws = dial_stream(&t.dial_options(Some(token)))
            .await
            .expect("raw websocket through the relay");
        Peer {
            ws: RawWs::from_stream(ws),
            who: sub.into(),
            client_id: String::new(),
            log: Vec::new(),
            next_id: 1,
            next_seq: 1,
            seen: 0,
        }
    }

    /// A socket as `sub` initialized as `client_id`.
    async fn connect(t: &TestRelay, sub: &str, groups: &[&str], client_id: &str) -> Peer {
        let mut p = Self::open(t, sub, groups).await;
        let init = p.initialize(client_id).await;
        assert!(
            init["result"]["serverSeq"].is_u64(),
            "{sub}/{client_id}: initialize: {init}"
        );
        p
    }

    async fn initialize(&mut self, client_id: &str) -> Value {
        self.client_id = client_id.into();
        self.call("initialize", initialize_params(client_id)).await
    }

    fn note(&mut self, v: &Value) {
        for n in [
            v.pointer("/result/serverSeq"),
            v.pointer("/result/snapshot/fromSeq"),
            v.pointer("/params/serverSeq"),
        ]
        .into_iter()
        .flatten()
        {
            self.seen = self.seen.max(n.as_u64().unwrap_or(0));
        }
    }

    /// Sends a request; returns its id, the answer's exact text, and the answer.
    async fn request_raw(&mut self, method: &str, params: Value) -> (u64, String, Value) {
        let id = self.next_id;
        self.next_id += 1;
        self.ws.send_json(&request_frame(id, method, params)).await;
        loop {
            let text = self.ws.recv_text().await.unwrap_or_else(|| {
                panic!("{}: socket closed before the answer to {method}", self.who)
            });
            let v: Value = serde_json::from_str(&text).expect("the relay sends JSON");
            self.note(&v);
            if v.get("method").is_none() && v.get("id") == Some(&json!(id)) {
                return (id, text, v);
            }
            self.log.push(v);
        }
    }

    async fn call(&mut self, method: &str, params: Value) -> Value {
        self.request_raw(method, params).await.2
    }

    /// Dispatches `action` on `channel`; returns its `clientSeq`.
    async fn dispatch(&mut self, channel: &str, action: Value) -> i64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.ws.dispatch(channel, seq, action).await;
        seq
    }

    /// A `ping` round trip: every frame the relay queued before its answer
    /// is in the log afterwards.
    async fn settle(&mut self) {
        let pong = self.call("ping", json!({"channel": ROOT})).await;
        assert_eq!(pong["result"], Value::Null, "{}: ping: {pong}", self.who);
    }

    /// The echo of this client's dispatch `seq`, if logged.
    fn echo(&self, seq: i64) -> Option<Value> {
        self.log
            .iter()
            .find(|v| {
                v["method"] == "action"
                    && v["params"]["origin"]["clientSeq"] == seq
                    && v["params"]["origin"]["clientId"] == self.client_id.as_str()
            })
            .cloned()
    }

    /// Reads one frame into the log within `within`; `Err` with the close
    /// code if the socket closed, `Ok(false)` if nothing came.
    async fn read_one(&mut self, within: Duration) -> Result<bool, Option<(u16, String)>> {
        match self.ws.next_within(within).await {
            Some(Next::Frame(v)) => {
                self.note(&v);
                self.log.push(v);
                Ok(true)
            }
            Some(Next::Closed(c)) => Err(c),
            None => Ok(false),
        }
    }

    /// Waits up to `within` for the echo of dispatch `seq`.
    async fn wait_echo(&mut self, seq: i64, within: Duration) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(e) = self.echo(seq) {
                return Some(e);
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return None;
            }
            match self.read_one(left).await {
                Ok(_) => {}
                Err(c) => panic!("{}: closed {c:?} while waiting for echo {seq}", self.who),
            }
        }
    }

    /// Waits until a logged frame satisfies `pred` (reading more as needed).
    async fn wait_for(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Some(v) = self.log.iter().find(|v| pred(v)) {
                return v.clone();
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            assert!(
                !left.is_zero(),
                "{}: timed out waiting for {what}",
                self.who
            );
            if let Err(c) = self.read_one(left).await {
                panic!("{}: closed {c:?} while waiting for {what}", self.who);
            }
        }
    }

    /// Waits until the whole log satisfies `pred` (reading more as needed).
    async fn wait_log(&mut self, what: &str, pred: impl Fn(&[Value]) -> bool) {
        let deadline = tokio::time::Instant::now() + WAIT;
        while !pred(&self.log) {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            assert!(
                !left.is_zero(),
                "{}: timed out waiting for {what}",
                self.who
            );
            if let Err(c) = self.read_one(left).await {
                panic!("{}: closed {c:?} while waiting for {what}", self.who);
            }
        }
    }

    /// Reads whatever arrives within `window` into the log.
    async fn drain(&mut self, window: Duration) {
        let deadline = tokio::time::Instant::now() + window;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() || self.read_one(left).await != Ok(true) {
                return;
            }
        }
    }

    /// Reads until the socket closes; returns the close code and reason.
    async fn closed(&mut self) -> Option<(u16, String)> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            assert!(!left.is_zero(), "{}: not closed in time", self.who);
            if let Err(c) = self.read_one(left).await {
                return c;
            }
        }
    }

    /// Logged frames (text) that mention `s` anywhere.
    fn mentioning(&self, s: &str) -> Vec<String> {
        self.log
            .iter()
            .map(Value::to_string)
            .filter(|t| t.contains(s))
            .collect()
    }

    /// Logged notifications `method` about session `session`.
    fn catalog(&self, method: &str, session: &str) -> usize {
        self.log
            .iter()
            .filter(|v| {
                v["method"] == method
                    && (v["params"]["session"] == session
                        || v["params"]["summary"]["resource"] == session)
            })
            .count()
    }

    /// Resources of `listSessions`, sorted.
    async fn listed(&mut self) -> Vec<String> {
        let list = self.call("listSessions", json!({"channel": ROOT})).await;
        let mut out: Vec<String> = list["result"]["items"]
            .as_array()
            .unwrap_or_else(|| panic!("{}: listSessions: {list}", self.who))
            .iter()
            .map(|s| s["resource"].as_str().expect("resource").to_string())
            .collect();
        out.sort();
        out
    }

    /// A fresh root snapshot's state.
    async fn root(&mut self) -> Value {
        let r = self.call("subscribe", json!({"channel": ROOT})).await;
        r["result"]["snapshot"]["state"].clone()
    }
}

async fn create_session(p: &mut Peer, uri: &str, host: &str) {
    let r = p
        .call(
            "createSession",
            json!({"channel": uri, "provider": format!("sim.{host}")}),
        )
        .await;
    assert_eq!(
        r.get("result"),
        Some(&Value::Null),
        "{}: createSession {uri} on {host}: {r}",
        p.who
    );
}

/// Subscribes `session` and checks its first chat is `chat`.
async fn subscribe_session(p: &mut Peer, session: &str, chat: &str) -> Value {
    let r = p.call("subscribe", json!({"channel": session})).await;
    let state = r["result"]["snapshot"]["state"].clone();
    assert_eq!(
        state["chats"][0]["resource"], chat,
        "{}: subscribe {session}: {r}",
        p.who
    );
    state
}

async fn subscribe_ok(p: &mut Peer, channel: &str) -> Value {
    let r = p.call("subscribe", json!({"channel": channel})).await;
    assert!(
        r["result"]["snapshot"].is_object(),
        "{}: subscribe {channel}: {r}",
        p.who
    );
    r["result"]["snapshot"].clone()
}

fn sorted_strings(v: &Value, key: &str) -> Vec<String> {
    let mut out: Vec<String> = v
        .as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .filter_map(|x| x[key].as_str().map(str::to_string))
        .collect();
    out.sort();
    out
}

// ─── 1. the matrix ──────────────────────────────────────────────────────────

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Viewer,
    Operator,
    Admin,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Vis {
    Own,
    Group,
    All,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Obj {
    /// Created through the relay by the principal under test (alice, g1).
    Own,
    /// Created through the relay by bob, who shares group g1.
    Groupmate,
    /// Created through the relay by carol, group g2.
    Stranger,
    /// Seeded on the host: created outside the relay.
    External,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// `listSessions` and root `activeSessions`.
    List,
    /// `subscribe` of the session and of its chat.
    Subscribe,
    /// `dispatchAction` `chat/turnStarted` on the session's chat.
    TurnStarted,
    /// `dispatchAction` `session/titleChanged` on the session.
    TitleChanged,
    /// `createChat` in the session.
    CreateChat,
    /// `createTerminal` claimed by the session (and its chat).
    CreateTerminal,
    /// `disposeSession`.
    DisposeSession,
}

const ROLES: [Role; 3] = [Role::Viewer, Role::Operator, Role::Admin];
const VISES: [Vis; 3] = [Vis::Own, Vis::Group, Vis::All];
const OBJS: [Obj; 4] = [Obj::Own, Obj::Groupmate, Obj::Stranger, Obj::External];
/// In the order they run on each object (disposing last).
const OPS: [Op; 7] = [
    Op::List,
    Op::Subscribe,
    Op::TurnStarted,
    Op::TitleChanged,
    Op::CreateChat,
    Op::CreateTerminal,
    Op::DisposeSession,
];

#[derive(Debug, Clone, PartialEq, Eq)]
enum Decision {
    /// Answered exactly like a nonexistent object; nothing reaches a host.
    Invisible,
    /// -32009 or a rejection echo; nothing reaches a host.
    Denied,
    /// Done by the host.
    Allowed,
    /// Anything else (observed only).
    Other(String),
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

impl Vis {
    fn name(self) -> &'static str {
        match self {
            Vis::Own => "own",
            Vis::Group => "group",
            Vis::All => "all",
        }
    }
}

/// Whether the principal under test sees `obj` with `vis` (and the default
/// `external_sessions`, which is true only for `all`).
fn visible(vis: Vis, obj: Obj) -> bool {
    match obj {
        Obj::Own => true,
        Obj::Groupmate => vis != Vis::Own,
        Obj::Stranger => vis == Vis::All,
        Obj::External => vis == Vis::All,
    }
}

/// The decision the rules give (visibility before permission, §4.4).
fn expected(role: Role, vis: Vis, obj: Obj, op: Op) -> Decision {
    if !visible(vis, obj) {
        return Decision::Invisible;
    }
    let operates = role != Role::Viewer;
    let allowed = match op {
        Op::List | Op::Subscribe => true,
        Op::TurnStarted | Op::TitleChanged | Op::CreateChat => operates,
        Op::CreateTerminal => operates, // terminals:use, and operate for the claim
        Op::DisposeSession => role == Role::Admin || (operates && obj == Obj::Own),
    };
    if allowed {
        Decision::Allowed
    } else {
        Decision::Denied
    }
}

/// One object of the matrix, in client and host form.
struct Target {
    obj: Obj,
    host: usize,
    session: String,
    chat: String,
    host_session: String,
    host_chat: String,
    random_session: String,
    random_chat: String,
}

impl Target {
    /// A session created through the relay as `ahp-session:/<id>`.
    fn verbatim(obj: Obj, host: usize, id: &str) -> Self {
        Self::named(obj, host, id, "")
    }

    /// A session seeded on host `host` as `ahp-session:/<id>`.
    fn seeded(obj: Obj, host: usize, id: &str) -> Self {
        let h = ["a", "b"][host];
        Self::named(obj, host, id, &format!("{h}~"))
    }

    /// Session `ahp-session:/<id>` on host `host`, named
    /// `ahp-session:/<prefix><id>` by clients (a random one:
    /// `ahp-session:/<prefix>zz-<id>`).
    fn named(obj: Obj, host: usize, id: &str, prefix: &str) -> Self {
        let h = ["a", "b"][host];
        Target {
            obj,
            host,
            session: format!("ahp-session:/{prefix}{id}"),
            chat: main_chat_of(h, id),
            host_session: format!("ahp-session:/{id}"),
            host_chat: format!("ahp-chat:/{id}-main"),
            random_session: format!("ahp-session:/{prefix}zz-{id}"),
            random_chat: main_chat_of(h, &format!("zz-{id}")),
        }
    }
}

/// What must not have reached a host for a refused cell: frames of
/// `method` whose field at `pointer` is one of `values`.
struct Marker {
    method: &'static str,
    pointer: &'static str,
    values: Vec<Value>,
}

struct Cell {
    role: Role,
    vis: Vis,
    obj: Obj,
    op: Op,
    expected: Decision,
    observed: Decision,
    marker: Option<Marker>,
    seq: Option<i64>,
}

/// The §4.4 class of an answer: a result, the nonexistent answer (-32001
/// "session not found" for sessions, -32008 "not found" otherwise, no
/// `data`), -32009, or anything else.
fn classify(v: &Value, session_uri: bool) -> Decision {
    if v.get("result").is_some() {
        return Decision::Allowed;
    }
    let e = &v["error"];
    let nonexistent = if session_uri {
        e["code"] == -32001 && e["message"] == "session not found"
    } else {
        e["code"] == -32008 && e["message"] == "not found"
    };
    if nonexistent && e.get("data").is_none() {
        Decision::Invisible
    } else if e["code"] == -32009 {
        Decision::Denied
    } else {
        Decision::Other(v.to_string())
    }
}

/// Sends `method` with `random` params and checks its answer equals
/// `(id, text)` modulo the id.
async fn like_random(me: &mut Peer, method: &str, random: Value, id: u64, text: &str) -> Decision {
    let (rid, rtext, _) = me.request_raw(method, random).await;
    if without_id(text, id) == without_id(&rtext, rid) {
        Decision::Invisible
    } else {
        Decision::Other(format!(
            "{method}: differs from a random URI's answer: {text} vs {rtext}"
        ))
    }
}

/// A request cell: classify the answer; an invisible one must equal the
/// random URI's answer modulo id.
async fn request_cell(
    me: &mut Peer,
    method: &str,
    params: Value,
    random: Value,
    session_uri: bool,
) -> Decision {
    let (id, text, v) = me.request_raw(method, params).await;
    let d = classify(&v, session_uri);
    if d == Decision::Invisible {
        return like_random(me, method, random, id, &text).await;
    }
    d
}

/// A dispatch cell: a relay rejection echo is there by the ping answer; an
/// accepted echo from the host is waited for only when expected.
async fn dispatch_cell(me: &mut Peer, channel: &str, action: Value, wait: bool) -> (i64, Decision) {
    let seq = me.dispatch(channel, action.clone()).await;
    me.settle().await;
    let echo = if wait {
        me.wait_echo(seq, WAIT).await
    } else {
        me.echo(seq)
    };
    let d = match echo {
        None => Decision::Invisible,
        Some(e) => match e["params"]["rejectionReason"].as_str() {
            None => Decision::Allowed,
            Some("permission denied")
                if e["params"]["channel"] == channel && e["params"]["action"] == action =>
            {
                Decision::Denied
            }
            Some(_) => Decision::Other(format!("unexpected echo {e}")),
        },
    };
    (seq, d)
}

/// One observed cell: the decision, the frames that must not reach a host
/// unless allowed, and the dispatch's `clientSeq`.
type Observed = (Decision, Option<Marker>, Option<i64>);

/// A relay in front of hosts a and b where alice (g1), bob (g1) and carol
/// (g2) each created one session, then alice's rule became (`role`, `vis`).
async fn matrix_world(role: Role, vis: Vis) -> TestRelay {
    let setup = rule(
        "setup",
        &["alice", "bob", "carol"],
        &["*"],
        "operator",
        "own",
        "",
    );
    let t = TestRelay::start(two_hosts(), &setup).await;
    {
        // The creators' sockets close before the policy changes.
        let mut alice = Peer::connect(&t, "alice", &["g1"], "creator").await;
        let mut bob = Peer::connect(&t, "bob", &["g1"], "creator").await;
        let mut carol = Peer::connect(&t, "carol", &["g2"], "creator").await;
        create_session(&mut alice, "ahp-session:/own-s", "a").await;
        create_session(&mut bob, "ahp-session:/mate-s", "b").await;
        create_session(&mut carol, "ahp-session:/stranger-s", "a").await;
        subscribe_session(
            &mut alice,
            "ahp-session:/own-s",
            &main_chat_of("a", "own-s"),
        )
        .await;
    }
    let rules = rule("creators", &["bob", "carol"], &["*"], "operator", "own", "")
        + &rule("subject", &["alice"], &["*"], role.name(), vis.name(), "");
    t.relay.relay.set_policy(policy(&rules));
    t
}

/// Root and list show exactly the visible sessions of both hosts; returns
/// what `listSessions` listed and every difference found.
async fn matrix_listing(
    me: &mut Peer,
    vis: Vis,
    targets: &[Target],
    tag: &str,
) -> (Vec<String>, Vec<String>) {
    let mut problems = Vec::new();
    let root = me.root().await;
    let ext = usize::from(visible(vis, Obj::External));
    let want_active = [Obj::Own, Obj::Groupmate, Obj::Stranger]
        .iter()
        .filter(|o| visible(vis, **o))
        .count()
        + 2 * ext;
    if root["activeSessions"] != want_active {
        problems.push(format!(
            "{tag}: root activeSessions {} != {want_active}",
            root["activeSessions"]
        ));
    }
    if sorted_strings(&root["agents"], "provider") != ["sim.a", "sim.b"] {
        problems.push(format!("{tag}: root agents {}", root["agents"]));
    }
    let listed = me.listed().await;
    let mut want_listed: Vec<String> = targets
        .iter()
        .filter(|tg| visible(vis, tg.obj))
        .map(|tg| tg.session.clone())
        .collect();
    if ext == 1 {
        want_listed.push("ahp-session:/a~a-1".into());
    }
    want_listed.sort();
    if listed != want_listed {
        problems.push(format!("{tag}: listSessions {listed:?} != {want_listed:?}"));
    }
    (listed, problems)
}

/// `subscribe` of the session and of its chat: both get the same decision.
async fn subscribe_op(me: &mut Peer, tg: &Target) -> Observed {
    let s = request_cell(
        me,
        "subscribe",
        json!({"channel": tg.session}),
        json!({"channel": tg.random_session}),
        true,
    )
    .await;
    let c = request_cell(
        me,
        "subscribe",
        json!({"channel": tg.chat}),
        json!({"channel": tg.random_chat}),
        false,
    )
    .await;
    let d = if s == c {
        s
    } else {
        Decision::Other(format!("session {s:?} but its chat {c:?}"))
    };
    let m = Marker {
        method: "subscribe",
        pointer: "/params/channel",
        values: vec![json!(tg.host_session), json!(tg.host_chat)],
    };
    (d, Some(m), None)
}

/// A request on the session (`params`, or `random` for a random URI) whose
/// success must show at the host (`done`); `marker` names its frames.
async fn request_op(
    me: &mut Peer,
    (params, random): (Value, Value),
    done: impl FnOnce() -> bool,
    marker: Marker,
) -> Observed {
    let mut d = request_cell(me, marker.method, params, random, true).await;
    if d == Decision::Allowed && !done() {
        d = Decision::Other(format!(
            "{} answered but not done on the host",
            marker.method
        ));
    }
    (d, Some(marker), None)
}

/// Runs operation `op` (the `n`th cell) on target `tg`, expecting `exp`.
async fn matrix_op(
    me: &mut Peer,
    host: &SimHost,
    tg: &Target,
    op: Op,
    n: usize,
    listed: &[String],
    exp: &Decision,
) -> Observed {
    let wait = *exp == Decision::Allowed;
    match op {
        Op::List => {
            let d = if listed.contains(&tg.session) {
                Decision::Allowed
            } else {
                Decision::Invisible
            };
            (d, None, None)
        }
        Op::Subscribe => subscribe_op(me, tg).await,
        Op::TurnStarted => {
            let action = turn_started(&format!("turn-{n}"), "hello");
            let (seq, d) = dispatch_cell(me, &tg.chat, action, wait).await;
            (d, None, Some(seq))
        }
        Op::TitleChanged => {
            let action = json!({"type": "session/titleChanged", "title": format!("t{n}")});
            let (seq, d) = dispatch_cell(me, &tg.session, action, wait).await;
            (d, None, Some(seq))
        }
        Op::CreateChat => {
            let chat = format!("ahp-chat:/cc-{n}");
            let params = json!({"channel": tg.session, "chat": chat});
            let random = json!({"channel": tg.random_session, "chat": chat});
            let marker = Marker {
                method: "createChat",
                pointer: "/params/chat",
                values: vec![json!(chat)],
            };
            request_op(
                me,
                (params, random),
                || host.channel_state(&chat).is_some(),
                marker,
            )
            .await
        }
        Op::CreateTerminal => {
            let term = format!("ahp-terminal:/tt-{n}");
            let params = json!({"channel": term, "claim": session_claim(&tg.session, &tg.chat)});
            let random = json!({"channel": term,
                "claim": session_claim(&tg.random_session, &tg.random_chat)});
            let marker = Marker {
                method: "createTerminal",
                pointer: "/params/channel",
                values: vec![json!(term)],
            };
            request_op(
                me,
                (params, random),
                || host.channel_state(&term).is_some(),
                marker,
            )
            .await
        }
        Op::DisposeSession => {
            let params = json!({"channel": tg.session});
            let random = json!({"channel": tg.random_session});
            let marker = Marker {
                method: "disposeSession",
                pointer: "/params/channel",
                values: vec![json!(tg.host_session)],
            };
            let gone = || !host.session_uris().contains(&tg.host_session);
            request_op(me, (params, random), gone, marker).await
        }
    }
}

/// Late evidence against every refused cell: an echo that came after all
/// for an invisible dispatch, or any of its frames at a host.
async fn matrix_late_evidence(t: &TestRelay, me: &mut Peer, cells: &mut [Cell]) {
    tokio::time::sleep(Duration::from_millis(150)).await;
    me.settle().await;
    me.drain(Duration::from_millis(50)).await;
    let up_me = t.upstream_id("alice", "tester");
    let at_hosts: Vec<Value> = t
        .hosts
        .iter()
        .flat_map(|h| frames_from(h, &up_me))
        .collect();
    for c in cells.iter_mut() {
        if c.observed == Decision::Allowed {
            continue;
        }
        if let Some(seq) = c.seq {
            if c.observed == Decision::Invisible && me.echo(seq).is_some() {
                c.observed = Decision::Other(format!("late echo {:?}", me.echo(seq)));
            }
            let forwarded = at_hosts
                .iter()
                .any(|f| f["method"] == "dispatchAction" && f["params"]["clientSeq"] == seq);
            if forwarded {
                c.observed = Decision::Other(format!("dispatch {seq} reached a host"));
            }
        }
        if let Some(m) = &c.marker {
            let forwarded = at_hosts.iter().any(|f| {
                f["method"] == m.method
                    && f.pointer(m.pointer).is_some_and(|v| m.values.contains(v))
            });
            if forwarded {
                c.observed = Decision::Other(format!("{} reached a host", m.method));
            }
        }
    }
}

/// Runs every cell of (`role`, `vis`) on a fresh relay.
async fn matrix_relay(role: Role, vis: Vis) -> (Vec<Cell>, Vec<String>) {
    let t = matrix_world(role, vis).await;
    let targets = [
        Target::verbatim(Obj::Own, 0, "own-s"),
        Target::verbatim(Obj::Groupmate, 1, "mate-s"),
        Target::verbatim(Obj::Stranger, 0, "stranger-s"),
        Target::seeded(Obj::External, 1, "b-1"),
    ];
    let mut me = Peer::connect(&t, "alice", &["g1"], "tester").await;
    let tag = format!("{}/{}", role.name(), vis.name());
    let (listed, problems) = matrix_listing(&mut me, vis, &targets, &tag).await;
    let mut cells = Vec::new();
    let mut n = 0;
    for tg in &targets {
        for op in OPS {
            n += 1;
            let exp = expected(role, vis, tg.obj, op);
            let host = &t.hosts[tg.host];
            let (observed, marker, seq) = matrix_op(&mut me, host, tg, op, n, &listed, &exp).await;
            cells.push(Cell {
                role,
                vis,
                obj: tg.obj,
                op,
                expected: exp,
                observed,
                marker,
                seq,
            });
        }
    }
    matrix_late_evidence(&t, &mut me, &mut cells).await;
    (cells, problems)
}

/// 1. Role × visibility × object × operation: every cell's decision is the
/// one the rules give (invisible answers like nonexistent and reaches no
/// host; denied is -32009 or a rejection echo and reaches no host; allowed
/// is done by the host).
#[tokio::test]
async fn tenancy_matrix_role_visibility_object_operation() {
    let mut cells = Vec::new();
    let mut problems = Vec::new();
    for role in ROLES {
        for vis in VISES {
            let (c, p) = matrix_relay(role, vis).await;
            cells.extend(c);
            problems.extend(p);
        }
    }
    let product = ROLES.len() * VISES.len() * OBJS.len() * OPS.len();
    eprintln!(
        "tenancy matrix: {} cells tested ({} roles × {} visibilities × {} objects × {} operations)",
        cells.len(),
        ROLES.len(),
        VISES.len(),
        OBJS.len(),
        OPS.len()
    );
    assert_eq!(cells.len(), product);
    let mut distinct = BTreeSet::new();
    for c in &cells {
        distinct.insert(format!("{:?}", c.expected));
    }
    assert_eq!(
        distinct.len(),
        3,
        "the matrix exercises all three decisions: {distinct:?}"
    );
    let mismatches: Vec<String> = cells
        .iter()
        .filter(|c| c.expected != c.observed)
        .map(|c| {
            format!(
                "{}/{} {:?} {:?}: expected {:?}, got {:?}",
                c.role.name(),
                c.vis.name(),
                c.obj,
                c.op,
                c.expected,
                c.observed
            )
        })
        .collect();
    assert!(
        mismatches.is_empty() && problems.is_empty(),
        "{} of {} cells differ from the rules:\n{}\nother problems:\n{}",
        mismatches.len(),
        cells.len(),
        mismatches.join("\n"),
        problems.join("\n")
    );
}

// ─── 2. S10 ─────────────────────────────────────────────────────────────────

/// S10's session: alice's, created through the relay on host a.
const S10_SESSION: &str = "ahp-session:/alice-s";

/// S10's world: alice (visibility own) created [`S10_SESSION`] on host a
/// and ran a turn in it, bob sees only his own sessions and viewer vic sees
/// all; the hosts' records are cleared after alice's turn. Returns the
/// relay, alice (still attached) and her upstream id.
async fn s10_world() -> (TestRelay, Peer, String) {
    let rules = rule("alice", &["alice"], &["*"], "operator", "own", "")
        + &rule("bob", &["bob"], &["*"], "operator", "own", "")
        + &rule("vic", &["vic"], &["*"], "viewer", "all", "");
    let t = TestRelay::start(two_hosts(), &rules).await;
    let chat = main_chat_of("a", "alice-s");
    let mut alice = Peer::connect(&t, "alice", &[], "a1").await;
    create_session(&mut alice, S10_SESSION, "a").await;
    subscribe_session(&mut alice, S10_SESSION, &chat).await;
    subscribe_ok(&mut alice, &chat).await;
    let seq = alice
        .dispatch(&chat, turn_started("alice-turn", "private words"))
        .await;
    let echo = alice.wait_echo(seq, WAIT).await.expect("alice's turn echo");
    assert!(echo["params"].get("rejectionReason").is_none(), "{echo}");
    alice
        .wait_for("alice's turn to complete", |v| {
            v["params"]["channel"] == chat.as_str()
                && v["params"]["action"]["type"] == "chat/turnComplete"
        })
        .await;
    let up_alice = t.upstream_id("alice", "a1");
    for h in &t.hosts {
        h.clear_record();
    }
    (t, alice, up_alice)
}

/// Bob heard nothing of alice's session, and no host got a frame from him
/// or from anyone but alice and the watch link.
fn assert_bob_left_no_trace(t: &TestRelay, bob: &Peer, up_alice: &str) {
    assert!(
        bob.mentioning("alice-s").is_empty(),
        "bob heard of alice's session: {:?}",
        bob.mentioning("alice-s")
    );
    let up_bob = t.upstream_id("bob", "b1");
    for h in &t.hosts {
        assert!(
            h.received_from(&up_bob).is_empty(),
            "bob reached host {}",
            h.config().name
        );
        let foreign = foreign_frames(h, &[up_alice]);
        assert!(
            foreign.is_empty(),
            "host {} got frames: {foreign:?}",
            h.config().name
        );
    }
}

/// S10 (§4.4 "invisible = nonexistent", §7): bob (visibility own) cannot
/// list alice's session, see it in the root, or subscribe, fetch turns of,
/// complete in, create a chat or terminal in, move, or dispose it or its
/// chat: every answer is byte-identical (modulo id) to the one for a random
/// URI of either form, and nothing of his reaches a host.
#[tokio::test]
async fn s10_an_invisible_session_answers_every_request_like_a_random_uri() {
    let (t, _alice, up_alice) = s10_world().await;
    let (session, chat) = (S10_SESSION, main_chat_of("a", "alice-s"));
    let mut bob = Peer::connect(&t, "bob", &[], "b1").await;
    assert_eq!(
        bob.listed().await,
        Vec::<String>::new(),
        "bob lists nothing"
    );
    let root = bob.root().await;
    assert_eq!(root["activeSessions"], 0, "{root}");
    assert!(!root.to_string().contains("alice-s"), "{root}");

    // Every request about the session or its chat, with the real URIs and
    // with random ones of both forms (verbatim and qualified).
    let randoms = [
        ("ahp-session:/zz-none", main_chat_of("a", "zz-none")),
        ("ahp-session:/a~zz-none", main_chat_of("a", "zz-none2")),
    ];
    type Params = Box<dyn Fn(&str, &str) -> Value>;
    let requests: Vec<(&str, Params)> = vec![
        ("subscribe", Box::new(|s, _| json!({"channel": s}))),
        ("subscribe", Box::new(|_, c| json!({"channel": c}))),
        ("fetchTurns", Box::new(|_, c| json!({"channel": c}))),
        (
            "completions",
            Box::new(|_, c| json!({"channel": c, "kind": "userMessage", "text": "@", "offset": 1})),
        ),
        (
            "createChat",
            Box::new(|s, _| json!({"channel": s, "chat": "ahp-chat:/bob-side"})),
        ),
        (
            "createTerminal",
            Box::new(
                |s, c| json!({"channel": "ahp-terminal:/bob-t", "claim": session_claim(s, c)}),
            ),
        ),
        (
            "moveChat",
            Box::new(|_, c| json!({"channel": c, "destination": {"kind": "newSession"}})),
        ),
        ("disposeChat", Box::new(|_, c| json!({"channel": c}))),
        ("disposeSession", Box::new(|s, _| json!({"channel": s}))),
    ];
    for (method, params) in &requests {
        let (id, text, v) = bob.request_raw(method, params(session, &chat)).await;
        let code = v["error"]["code"].as_i64();
        assert!(
            matches!(code, Some(-32001) | Some(-32008)),
            "{method} on alice's session must answer as nonexistent: {text}"
        );
        assert!(v["error"].get("data").is_none(), "{text}");
        for (rs, rc) in &randoms {
            let (rid, rtext, _) = bob.request_raw(method, params(rs, rc)).await;
            assert_eq!(
                without_id(&text, id),
                without_id(&rtext, rid),
                "{method}: alice's session and {rs} answer differently"
            );
        }
    }
    bob.settle().await;
    assert_bob_left_no_trace(&t, &bob, &up_alice);
}

/// S10 (§4.4, §5.3): bob's dispatches to alice's invisible session or chat
/// get no echo at all, exactly like dispatches to random URIs, and none
/// reaches a host.
#[tokio::test]
async fn s10_dispatches_to_an_invisible_session_get_no_echo() {
    let (t, _alice, up_alice) = s10_world().await;
    let (session, chat) = (S10_SESSION, main_chat_of("a", "alice-s"));
    let mut bob = Peer::connect(&t, "bob", &[], "b1").await;
    let random_chat = main_chat_of("a", "zz-none2");
    let mut seqs = Vec::new();
    for (channel, action) in [
        (chat.as_str(), turn_started("bob-turn", "hi")),
        (chat.as_str(), json!({"type": "chat/draftChanged"})),
        (
            session,
            json!({"type": "session/titleChanged", "title": "mine now"}),
        ),
        (
            "ahp-session:/zz-none",
            json!({"type": "session/titleChanged", "title": "x"}),
        ),
        (random_chat.as_str(), turn_started("bob-turn-2", "hi")),
    ] {
        seqs.push(bob.dispatch(channel, action).await);
    }
    bob.settle().await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    bob.settle().await;
    for seq in seqs {
        assert_eq!(bob.echo(seq), None, "an echo for dispatch {seq}");
    }
    assert_bob_left_no_trace(&t, &bob, &up_alice);
}

/// S10 (§4.4 "visibility before permission"): viewer vic sees and reads
/// alice's session but gets a "permission denied" rejection echo (numbered,
/// the action as dispatched) for `chat/turnStarted` and -32009 for
/// `createChat`, and the host never hears of either.
#[tokio::test]
async fn s10_a_viewer_sees_the_session_but_cannot_operate_it() {
    let (t, _alice, _) = s10_world().await;
    let (session, chat) = (S10_SESSION, main_chat_of("a", "alice-s"));
    let host_chat = "ahp-chat:/alice-s-main";
    let mut vic = Peer::connect(&t, "vic", &[], "v1").await;
    let up_vic = t.upstream_id("vic", "v1");
    assert!(vic.listed().await.contains(&session.to_string()));
    subscribe_session(&mut vic, session, &chat).await;
    let snap = subscribe_ok(&mut vic, &chat).await;
    let turns_before = snap["state"]["turns"].as_array().map_or(0, Vec::len);
    let fetched = vic.call("fetchTurns", json!({"channel": chat})).await;
    assert!(fetched.get("result").is_some(), "viewers read: {fetched}");
    let action = turn_started("vic-turn", "let me in");
    let seq = vic.dispatch(&chat, action.clone()).await;
    vic.settle().await;
    let echo = vic
        .echo(seq)
        .expect("a rejection echo before the ping answer");
    assert_eq!(echo["method"], "action");
    assert_eq!(echo["params"]["channel"], chat.as_str());
    assert_eq!(echo["params"]["action"], action, "the action as dispatched");
    assert_eq!(
        echo["params"]["origin"],
        json!({"clientId": "v1", "clientSeq": seq})
    );
    assert_eq!(echo["params"]["rejectionReason"], "permission denied");
    assert!(echo["params"]["serverSeq"].is_u64(), "numbered: {echo}");
    let denied = vic
        .call(
            "createChat",
            json!({"channel": session, "chat": "ahp-chat:/vic-side"}),
        )
        .await;
    assert_eq!(denied["error"]["code"], -32009, "{denied}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let host = &t.hosts[0];
    let vic_methods: Vec<Value> = frames_from(host, &up_vic)
        .iter()
        .map(|f| f["method"].clone())
        .collect();
    assert!(
        !vic_methods.contains(&json!("dispatchAction"))
            && !vic_methods.contains(&json!("createChat")),
        "a refused operation reached the host: {vic_methods:?}"
    );
    let state = host.channel_state(host_chat).expect("alice's chat");
    assert_eq!(
        state["turns"].as_array().map_or(0, Vec::len),
        turns_before,
        "no turn from the viewer: {state}"
    );
    assert!(host.channel_state("ahp-chat:/vic-side").is_none());
}

// ─── 3. S10b ────────────────────────────────────────────────────────────────

/// The `rejectionReason` of the echo of dispatch `seq`, which must be there
/// by the ping answer (relay-made).
async fn rejection(p: &mut Peer, seq: i64) -> String {
    p.settle().await;
    let echo = p
        .echo(seq)
        .unwrap_or_else(|| panic!("{}: no rejection echo for dispatch {seq}", p.who));
    echo["params"]["rejectionReason"]
        .as_str()
        .unwrap_or_else(|| panic!("{}: dispatch {seq} was accepted: {echo}", p.who))
        .to_string()
}

/// Sends `method` with `params(r)` for every `r` of `names`; each answer
/// must be an error with one of `codes`. The answers' texts modulo their
/// ids, in order.
async fn refusals(
    p: &mut Peer,
    method: &str,
    names: &[&str],
    codes: &[i64],
    params: impl Fn(&str) -> Value,
) -> Vec<String> {
    let mut answers = Vec::new();
    for r in names {
        let (id, text, v) = p.request_raw(method, params(r)).await;
        let code = v["error"]["code"].as_i64();
        assert!(
            code.is_some_and(|c| codes.contains(&c)),
            "{method} {r}: {text}"
        );
        answers.push(without_id(&text, id));
    }
    answers
}

/// Chats S10b's bob may not name: alice's (qualified and client-chosen),
/// random ones of both forms, bare host forms of qualified names, and chats
/// of host b (his own, a seeded one, alice's).
const S10B_BAD_CHATS: [&str; 9] = [
    "ahp-chat:/a~alice-a-main",
    "ahp-chat:/alice-side",
    "ahp-chat:/a~zz-none-main",
    "ahp-chat:/zz-none",
    "ahp-chat:/a-1-main",
    "ahp-chat:/bob-a-main",
    "ahp-chat:/b~bob-b-main",
    "ahp-chat:/b~b-1-main",
    "ahp-chat:/b~alice-b-main",
];

/// Sessions S10b's bob may not name in a field of a request to host a:
/// alice's, a random one, a bare host form, and sessions of host b.
const S10B_BAD_SESSIONS: [&str; 6] = [
    "ahp-session:/alice-a",
    "ahp-session:/zz-none",
    "ahp-session:/a-1",
    "ahp-session:/bob-b",
    "ahp-session:/b~b-1",
    "ahp-session:/alice-b",
];

/// Bob's chat on host a, which his requests and dispatches target.
const S10B_BOB_CHAT: &str = "ahp-chat:/a~bob-a-main";

/// S10b's world: alice (own) has sessions on a and b and a side chat; bob
/// (own, with external sessions) has sessions `bob-a` (chat subscribed,
/// terminal `bob-t` claimed by it) and `bob-b`; vic is a viewer of host a
/// with `terminals:use`. The hosts' records are cleared afterwards.
/// Returns the relay, alice and bob.
async fn s10b_world() -> (TestRelay, Peer, Peer) {
    let rules = rule("alice", &["alice"], &["*"], "operator", "own", "")
        + &rule(
            "bob",
            &["bob"],
            &["*"],
            "operator",
            "own",
            "external_sessions = true",
        )
        + &rule(
            "vic",
            &["vic"],
            &["a"],
            "viewer",
            "all",
            "permissions = [\"terminals:use\"]",
        );
    let t = TestRelay::start(two_hosts(), &rules).await;
    let mut alice = Peer::connect(&t, "alice", &[], "a1").await;
    create_session(&mut alice, "ahp-session:/alice-a", "a").await;
    create_session(&mut alice, "ahp-session:/alice-b", "b").await;
    let side = alice
        .call(
            "createChat",
            json!({"channel": "ahp-session:/alice-a", "chat": "ahp-chat:/alice-side"}),
        )
        .await;
    assert_eq!(side["result"], Value::Null, "{side}");
    let mut bob = Peer::connect(&t, "bob", &[], "b1").await;
    create_session(&mut bob, "ahp-session:/bob-a", "a").await;
    create_session(&mut bob, "ahp-session:/bob-b", "b").await;
    subscribe_session(&mut bob, "ahp-session:/bob-a", S10B_BOB_CHAT).await;
    subscribe_ok(&mut bob, S10B_BOB_CHAT).await;
    let term = bob
        .call(
            "createTerminal",
            json!({"channel": "ahp-terminal:/bob-t",
                "claim": session_claim("ahp-session:/bob-a", S10B_BOB_CHAT)}),
        )
        .await;
    assert_eq!(term["result"], Value::Null, "{term}");
    // Bob sees the seeded sessions (external_sessions), not alice's.
    assert_eq!(
        bob.listed().await,
        [
            "ahp-session:/a~a-1",
            "ahp-session:/bob-a",
            "ahp-session:/bob-b",
            "ahp-session:/b~b-1"
        ]
    );
    for h in &t.hosts {
        h.clear_record();
    }
    (t, alice, bob)
}

/// Bob's frames at the hosts once everything queued has arrived: none
/// names a refused object, a dispatch only if it is one of `positives`, a
/// fork source, move destination or `createTerminal` only in its visible
/// control form. Returns host a's frames from bob.
async fn s10b_bob_at_hosts(t: &TestRelay, bob: &mut Peer, positives: &[i64]) -> Vec<Value> {
    tokio::time::sleep(Duration::from_millis(150)).await;
    bob.settle().await;
    let up_bob = t.upstream_id("bob", "b1");
    let bob_at_hosts: Vec<Value> = t
        .hosts
        .iter()
        .flat_map(|h| frames_from(h, &up_bob))
        .collect();
    for f in &bob_at_hosts {
        let text = f.to_string();
        for s in ["alice", "zz-none", "bob-t2", "b-1", "bob-b"] {
            assert!(!text.contains(s), "a refused name reached a host: {text}");
        }
        match f["method"].as_str() {
            Some("dispatchAction") => assert!(
                positives.contains(&f["params"]["clientSeq"].as_i64().unwrap_or(-1)),
                "a refused dispatch reached a host: {text}"
            ),
            Some("createChat") => {
                assert_eq!(
                    f["params"]["source"]["chat"], "ahp-chat:/bob-a-main",
                    "{text}"
                )
            }
            Some("moveChat") => assert_eq!(
                f["params"]["destination"]["session"], "ahp-session:/a-1",
                "{text}"
            ),
            Some("createTerminal") => panic!("a refused createTerminal reached a host: {text}"),
            _ => {}
        }
    }
    frames_from(&t.hosts[0], &up_bob)
}

/// How many of `frames` are `method` requests.
fn count_method(frames: &[Value], method: &str) -> usize {
    frames.iter().filter(|f| f["method"] == method).count()
}

/// S10b (§4.3 "URI fields", §7): a turn whose attachment names an
/// invisible, bare host-form or other host's chat gets a "cannot
/// translate" rejection echo (an invisible name exactly like a random one)
/// and reaches no host; a visible attachment is forwarded in host form.
#[tokio::test]
async fn s10b_attachments_must_name_visible_chats_of_the_target_host() {
    let (t, _alice, mut bob) = s10b_world().await;
    let mut reasons = Vec::new();
    for r in S10B_BAD_CHATS {
        let mut action = turn_started(&format!("t-{}", reasons.len()), "look");
        action["message"]["attachments"] = json!([chat_attachment(r)]);
        let seq = bob.dispatch(S10B_BOB_CHAT, action).await;
        let reason = rejection(&mut bob, seq).await;
        assert!(
            reason.starts_with("cannot translate"),
            "attachment {r}: {reason}"
        );
        reasons.push(reason);
    }
    assert_eq!(reasons[0], reasons[2], "invisible vs random attachment");
    assert_eq!(
        reasons[1], reasons[3],
        "invisible vs random verbatim attachment"
    );
    assert!(reasons[0].contains("unknown URI"), "{}", reasons[0]);
    let mut ok_turn = turn_started("t-ok", "look");
    ok_turn["message"]["attachments"] = json!([chat_attachment("ahp-chat:/a~a-1-main")]);
    let seq = bob.dispatch(S10B_BOB_CHAT, ok_turn).await;
    let echo = bob
        .wait_echo(seq, WAIT)
        .await
        .expect("the visible attachment's echo");
    assert!(echo["params"].get("rejectionReason").is_none(), "{echo}");
    let host_a = s10b_bob_at_hosts(&t, &mut bob, &[seq]).await;
    assert_eq!(
        count_method(&host_a, "dispatchAction"),
        1,
        "the visible attachment was forwarded"
    );
    let attached = host_a
        .iter()
        .find(|f| f["method"] == "dispatchAction")
        .expect("dispatch");
    assert_eq!(
        attached["params"]["action"]["message"]["attachments"][0]["resource"],
        "ahp-chat:/a-1-main"
    );
}

/// S10b (§4.3, §7): `createChat` forking from an invisible, bare host-form
/// or other host's chat is -32602 (an invisible name exactly like a random
/// one) and reaches no host; bob's own chat as the source is forwarded.
#[tokio::test]
async fn s10b_fork_sources_must_name_visible_chats_of_the_target_host() {
    let (t, _alice, mut bob) = s10b_world().await;
    let answers = refusals(&mut bob, "createChat", &S10B_BAD_CHATS, &[-32602], |r| {
        json!({"channel": "ahp-session:/bob-a", "chat": "ahp-chat:/bob-fork",
            "source": {"kind": "fork", "chat": r, "turnId": "t-1"}})
    })
    .await;
    assert_eq!(answers[0], answers[2], "invisible vs random fork source");
    assert_eq!(
        answers[1], answers[3],
        "invisible vs random verbatim fork source"
    );
    // Control: bob's own chat as the source is forwarded (the simhost
    // itself refuses forks; counted at the host below).
    let _ = bob
        .call(
            "createChat",
            json!({"channel": "ahp-session:/bob-a", "chat": "ahp-chat:/bob-fork",
                "source": {"kind": "fork", "chat": S10B_BOB_CHAT, "turnId": "t-1"}}),
        )
        .await;
    let host_a = s10b_bob_at_hosts(&t, &mut bob, &[]).await;
    assert_eq!(
        count_method(&host_a, "createChat"),
        1,
        "the visible fork source was forwarded"
    );
}

/// S10b (§4.3, §7): `moveChat` to an invisible, bare host-form or other
/// host's session is -32602 (an invisible name exactly like a random one)
/// and reaches no host; a visible destination is forwarded in host form.
#[tokio::test]
async fn s10b_move_destinations_must_name_visible_sessions_of_the_target_host() {
    let (t, _alice, mut bob) = s10b_world().await;
    let answers = refusals(&mut bob, "moveChat", &S10B_BAD_SESSIONS, &[-32602], |r| {
        json!({"channel": S10B_BOB_CHAT,
            "destination": {"kind": "session", "session": r}})
    })
    .await;
    assert_eq!(
        answers[0], answers[1],
        "invisible vs random move destination"
    );
    let _ = bob
        .call(
            "moveChat",
            json!({"channel": S10B_BOB_CHAT,
                "destination": {"kind": "session", "session": "ahp-session:/a~a-1"}}),
        )
        .await;
    let host_a = s10b_bob_at_hosts(&t, &mut bob, &[]).await;
    assert_eq!(
        count_method(&host_a, "moveChat"),
        1,
        "the visible move destination was forwarded"
    );
}

/// S10b (§4.3, §7): terminal claims naming a bad chat are -32602, naming a
/// bad session -32001 (the claim routes the request: nothing visible) or
/// -32602 (its chat on another host), `terminal/claimed` with a bad claim
/// gets a "cannot translate" rejection echo; an invisible name answers
/// exactly like a random one, and none reaches a host.
#[tokio::test]
async fn s10b_terminal_claims_must_name_visible_objects_of_the_target_host() {
    let (t, _alice, mut bob) = s10b_world().await;
    // A bad chat in a claim of bob's session …
    let answers = refusals(
        &mut bob,
        "createTerminal",
        &S10B_BAD_CHATS,
        &[-32602],
        |r| {
            json!({"channel": "ahp-terminal:/bob-t2",
            "claim": session_claim("ahp-session:/bob-a", r)})
        },
    )
    .await;
    assert_eq!(answers[0], answers[2], "invisible vs random claimed chat");
    // … and a bad session.
    let codes = [-32001, -32602];
    let answers = refusals(
        &mut bob,
        "createTerminal",
        &S10B_BAD_SESSIONS,
        &codes,
        |r| {
            json!({"channel": "ahp-terminal:/bob-t2",
            "claim": session_claim(r, S10B_BOB_CHAT)})
        },
    )
    .await;
    assert_eq!(
        answers[0], answers[1],
        "invisible vs random claimed session"
    );
    assert_eq!(
        answers[0], answers[2],
        "bare host form vs random claimed session"
    );
    assert_eq!(
        answers[0], answers[5],
        "invisible on b vs random claimed session"
    );
    // `terminal/claimed` on bob's own terminal.
    let (invisible_chat, random_chat) = (S10B_BAD_CHATS[0], S10B_BAD_CHATS[2]);
    let mut reasons = Vec::new();
    for (s, c) in [
        ("ahp-session:/alice-a", invisible_chat),
        ("ahp-session:/zz-none", random_chat),
        ("ahp-session:/a-1", "ahp-chat:/a-1-main"),
        ("ahp-session:/bob-b", "ahp-chat:/b~bob-b-main"),
        ("ahp-session:/a~a-1", invisible_chat),
    ] {
        let seq = bob
            .dispatch(
                "ahp-terminal:/bob-t",
                json!({"type": "terminal/claimed", "claim": session_claim(s, c)}),
            )
            .await;
        let reason = rejection(&mut bob, seq).await;
        assert!(
            reason.starts_with("cannot translate"),
            "claim {s} {c}: {reason}"
        );
        reasons.push(reason);
    }
    assert_eq!(reasons[0], reasons[1], "invisible vs random claim");
    s10b_bob_at_hosts(&t, &mut bob, &[]).await;
}

/// S10b (§4.4 "visibility before permission"): viewer vic sees host a and
/// may use terminals, but claiming a session needs `sessions:operate`: a
/// `createTerminal` claiming alice's session is -32009 without `data`, a
/// `terminal/claimed` naming it a "permission denied" rejection echo; a
/// claim on host b, invisible to vic, answers like a random one; neither
/// reaches a host.
#[tokio::test]
async fn s10b_a_visible_claim_the_principal_may_not_operate_is_denied() {
    let (t, _alice, mut bob) = s10b_world().await;
    let (invisible_chat, random_chat) = (S10B_BAD_CHATS[0], S10B_BAD_CHATS[2]);
    let mut vic = Peer::connect(&t, "vic", &[], "v1").await;
    let up_vic = t.upstream_id("vic", "v1");
    let denied = vic
        .call(
            "createTerminal",
            json!({"channel": "ahp-terminal:/vic-t",
                "claim": session_claim("ahp-session:/alice-a", invisible_chat)}),
        )
        .await;
    assert_eq!(denied["error"]["code"], -32009, "{denied}");
    assert!(denied["error"].get("data").is_none(), "{denied}");
    let seq = vic
        .dispatch(
            "ahp-terminal:/bob-t",
            json!({"type": "terminal/claimed",
                "claim": session_claim("ahp-session:/alice-a", invisible_chat)}),
        )
        .await;
    let reason = rejection(&mut vic, seq).await;
    assert!(reason.starts_with("permission denied"), "{reason}");
    // Host b is invisible to vic: a claim there is a claim of nothing.
    let (id, text, _) = vic
        .request_raw(
            "createTerminal",
            json!({"channel": "ahp-terminal:/vic-t",
                "claim": session_claim("ahp-session:/bob-b", &main_chat_of("b", "bob-b"))}),
        )
        .await;
    let (rid, rtext, _) = vic
        .request_raw(
            "createTerminal",
            json!({"channel": "ahp-terminal:/vic-t",
                "claim": session_claim("ahp-session:/zz-none", random_chat)}),
        )
        .await;
    assert_eq!(without_id(&text, id), without_id(&rtext, rid));
    s10b_bob_at_hosts(&t, &mut bob, &[]).await;
    for h in &t.hosts {
        for f in frames_from(h, &up_vic) {
            assert!(
                !matches!(
                    f["method"].as_str(),
                    Some("createTerminal" | "dispatchAction")
                ),
                "vic's refused operation reached {}: {f}",
                h.config().name
            );
        }
    }
}

// ─── 4. S10c ────────────────────────────────────────────────────────────────

/// The first object anywhere in `v` whose `toolCallId` is `id`.
fn find_tool_call(v: &Value, id: &str) -> Option<Value> {
    match v {
        Value::Object(o) => {
            if o.get("toolCallId").and_then(Value::as_str) == Some(id) && o.contains_key("status") {
                return Some(v.clone());
            }
            o.values().find_map(|x| find_tool_call(x, id))
        }
        Value::Array(a) => a.iter().find_map(|x| find_tool_call(x, id)),
        _ => None,
    }
}

/// Every `contributor.clientId` anywhere in `v`.
fn contributors(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(o) => {
            if let Some(c) = o.get("contributor").and_then(|c| c["clientId"].as_str()) {
                out.push(c.to_string());
            }
            o.values().for_each(|x| contributors(x, out));
        }
        Value::Array(a) => a.iter().for_each(|x| contributors(x, out)),
        _ => {}
    }
}

/// The action of the first logged envelope on `channel` of type `ty`.
async fn logged_action(p: &mut Peer, channel: &str, ty: &str) -> Value {
    let env = p
        .wait_for(&format!("{ty} on {channel}"), |v| {
            v["method"] == "action"
                && v["params"]["channel"] == channel
                && v["params"]["action"]["type"] == ty
        })
        .await;
    env["params"]["action"].clone()
}

/// S10c's session of alice on host a, with her client tool call.
const S10C_SESSION: &str = "ahp-session:/alice-s";
/// S10c's session of alice on host b, with a host tool call awaiting
/// confirmation.
const S10C_CONF_SESSION: &str = "ahp-session:/alice-conf";
/// S10c's terminal of alice on host a, claimed by her client.
const S10C_TERM: &str = "ahp-terminal:/alice-term";

/// S10c's world: alice (own), bob (own) and mallory (all) may all use the
/// `clientId` "same". Alice, connected as "same", has a client tool call
/// running in [`S10C_SESSION`], a host tool call awaiting confirmation in
/// [`S10C_CONF_SESSION`] and the client-claimed terminal [`S10C_TERM`].
struct S10c {
    t: TestRelay,
    alice: Peer,
    /// The `toolCallId` of alice's client tool call.
    call_id: String,
    /// The `toolCallId` of the host tool call awaiting confirmation.
    conf_id: String,
}

/// The `status` of tool call `id` in `host`'s chat `host_chat`.
fn tool_status(host: &SimHost, host_chat: &str, id: &str) -> Option<Value> {
    find_tool_call(&host.channel_state(host_chat).expect("chat"), id).map(|c| c["status"].clone())
}

/// A successful `chat/toolCallComplete` of S10c's client tool call.
fn s10c_complete(call_id: &str) -> Value {
    json!({"type": "chat/toolCallComplete", "turnId": "tool-turn",
        "toolCallId": call_id, "result": {"success": true, "pastTenseMessage": "Read it"}})
}

/// The confirmation of S10c's host tool call.
fn s10c_confirm(conf_id: &str) -> Value {
    json!({"type": "chat/toolCallConfirmed", "turnId": "conf-turn",
        "toolCallId": conf_id, "approved": true})
}

/// Alice creates [`S10C_CONF_SESSION`] on host b and starts a turn whose
/// host tool call waits for confirmation; returns its `toolCallId`.
async fn s10c_confirmation_call(alice: &mut Peer) -> String {
    let conf_chat = main_chat_of("b", "alice-conf");
    create_session(alice, S10C_CONF_SESSION, "b").await;
    subscribe_ok(alice, &conf_chat).await;
    alice
        .dispatch(&conf_chat, turn_started("conf-turn", "run it"))
        .await;
    let conf_start = logged_action(alice, &conf_chat, "chat/toolCallStart").await;
    let conf_id = conf_start["toolCallId"]
        .as_str()
        .expect("toolCallId")
        .to_string();
    logged_action(alice, &conf_chat, "chat/toolCallReady").await;
    conf_id
}

/// Builds [`S10c`] and checks the hosts hold alice's calls, activeClient
/// and terminal claim under her upstream id.
async fn s10c_world() -> S10c {
    let rules = rule("alice", &["alice"], &["*"], "operator", "own", "")
        + &rule("bob", &["bob"], &["*"], "operator", "own", "")
        + &rule("mallory", &["mallory"], &["*"], "operator", "all", "");
    let mut b = fast_config("b", 1);
    b.script.tool_confirmation = true;
    let t = TestRelay::start_tweaked(vec![fast_config("a", 1), b], "", &rules, |cfg| {
        cfg.relay.default_host = Some("a".into());
    })
    .await;
    t.wait_hosts_up().await;
    let chat = main_chat_of("a", "alice-s");
    let mut alice = Peer::connect(&t, "alice", &[], "same").await;
    create_session(&mut alice, S10C_SESSION, "a").await;
    subscribe_session(&mut alice, S10C_SESSION, &chat).await;
    subscribe_ok(&mut alice, &chat).await;
    let created = alice
        .call(
            "createTerminal",
            json!({"channel": S10C_TERM, "claim": {"kind": "client", "clientId": "same"}}),
        )
        .await;
    assert_eq!(created["result"], Value::Null, "{created}");
    subscribe_ok(&mut alice, S10C_TERM).await;
    let set = alice
        .dispatch(
            S10C_SESSION,
            json!({"type": "session/activeClientSet", "activeClient": {"clientId": "same",
                "tools": [{"name": TOOL, "title": "Read the open tab"}]}}),
        )
        .await;
    let echo = alice
        .wait_echo(set, WAIT)
        .await
        .expect("activeClientSet echo");
    assert!(echo["params"].get("rejectionReason").is_none(), "{echo}");
    let seq = alice
        .dispatch(
            &chat,
            turn_started("tool-turn", &format!("look [client-tool:{TOOL}]")),
        )
        .await;
    alice.wait_echo(seq, WAIT).await.expect("turn echo");
    let start = logged_action(&mut alice, &chat, "chat/toolCallStart").await;
    assert_eq!(
        start["contributor"],
        json!({"kind": "client", "clientId": "same"}),
        "alice sees herself as the contributor"
    );
    let call_id = start["toolCallId"]
        .as_str()
        .expect("toolCallId")
        .to_string();
    logged_action(&mut alice, &chat, "chat/toolCallReady").await;
    let conf_id = s10c_confirmation_call(&mut alice).await;
    let root = alice.root().await;
    assert!(
        sorted_strings(&root["terminals"], "resource").contains(&S10C_TERM.to_string()),
        "alice sees her terminal: {root}"
    );
    let w = S10c {
        t,
        alice,
        call_id,
        conf_id,
    };
    s10c_assert_alice_held(&w, "running").await;
    w
}

/// The hosts hold alice's client tool call with `status`, the host tool
/// call awaiting confirmation, and her activeClient and terminal claim
/// under her upstream id; her root shows her terminal.
async fn s10c_assert_alice_held(w: &S10c, status: &str) {
    let (host_a, host_b) = (&w.t.hosts[0], &w.t.hosts[1]);
    let up_alice = w.t.upstream_id("alice", "same");
    assert_eq!(
        tool_status(host_a, "ahp-chat:/alice-s-main", &w.call_id),
        Some(json!(status)),
        "alice's client tool call"
    );
    assert_eq!(
        tool_status(host_b, "ahp-chat:/alice-conf-main", &w.conf_id),
        Some(json!("pending-confirmation"))
    );
    let host_session = host_a.channel_state(S10C_SESSION).expect("alice's session");
    assert_eq!(
        sorted_strings(&host_session["activeClients"], "clientId"),
        std::slice::from_ref(&up_alice)
    );
    assert!(
        host_a
            .channel_state(S10C_TERM)
            .is_some_and(|s| s["claim"]["clientId"] == up_alice.as_str()),
        "alice's terminal keeps its claim"
    );
}

/// Alice's client-claimed terminal answers `p` like a random one and is
/// absent from `p`'s root.
async fn s10c_assert_terminal_invisible(p: &mut Peer) {
    let (id, text, _) = p
        .request_raw("subscribe", json!({"channel": S10C_TERM}))
        .await;
    let random = json!({"channel": "ahp-terminal:/zz-term"});
    assert_eq!(
        like_random(p, "subscribe", random, id, &text).await,
        Decision::Invisible,
        "alice's client-claimed terminal is invisible to {}",
        p.who
    );
    let root = p.root().await;
    assert!(
        !root["terminals"].to_string().contains("alice-term"),
        "{root}"
    );
}

/// S10c (§2 B2, §4.4, §7): bob (visibility own) connected with alice's
/// `clientId` sees nothing of hers: her session, chats and client-claimed
/// terminal answer like random URIs, his completion, confirmation,
/// terminal input and claim get no echo, his root shows none of it, and
/// nothing of his reaches a host.
#[tokio::test]
async fn s10c_another_principal_with_the_same_client_id_sees_nothing() {
    let mut w = s10c_world().await;
    let (chat, conf_chat) = (
        main_chat_of("a", "alice-s"),
        main_chat_of("b", "alice-conf"),
    );
    let up_bob = w.t.upstream_id("bob", "same");
    let mut bob = Peer::connect(&w.t, "bob", &[], "same").await;
    for (method, real, random) in [
        (
            "subscribe",
            json!({"channel": S10C_SESSION}),
            json!({"channel": "ahp-session:/zz"}),
        ),
        (
            "subscribe",
            json!({"channel": chat}),
            json!({"channel": main_chat_of("a", "zz")}),
        ),
        (
            "subscribe",
            json!({"channel": S10C_TERM}),
            json!({"channel": "ahp-terminal:/zz-term"}),
        ),
        (
            "disposeTerminal",
            json!({"channel": S10C_TERM}),
            json!({"channel": "ahp-terminal:/zz-term"}),
        ),
        (
            "subscribe",
            json!({"channel": conf_chat}),
            json!({"channel": main_chat_of("b", "zz")}),
        ),
    ] {
        let (id, text, v) = bob.request_raw(method, real).await;
        assert!(v.get("error").is_some(), "{method}: {text}");
        assert_eq!(
            like_random(&mut bob, method, random, id, &text).await,
            Decision::Invisible
        );
    }
    let mut silent = Vec::new();
    silent.push(bob.dispatch(&chat, s10c_complete(&w.call_id)).await);
    silent.push(bob.dispatch(&conf_chat, s10c_confirm(&w.conf_id)).await);
    silent.push(
        bob.dispatch(S10C_TERM, json!({"type": "terminal/input", "data": "ls\n"}))
            .await,
    );
    silent.push(
        bob.dispatch(
            S10C_TERM,
            json!({"type": "terminal/claimed", "claim": {"kind": "client", "clientId": "same"}}),
        )
        .await,
    );
    let root = bob.root().await;
    assert_eq!(root["terminals"], json!([]), "{root}");
    assert_eq!(root["activeSessions"], 0, "{root}");
    tokio::time::sleep(Duration::from_millis(150)).await;
    bob.settle().await;
    for seq in &silent {
        assert_eq!(bob.echo(*seq), None, "bob got an echo for {seq}");
    }
    for h in &w.t.hosts {
        assert!(
            h.received_from(&up_bob).is_empty(),
            "bob reached host {}",
            h.config().name
        );
    }
    s10c_assert_alice_held(&w, "running").await;
    s10c_alice_completes_her_calls(&mut w).await;
}

/// S10c (§2 B2): three principals using one `clientId` are three upstream
/// clients: the hosts never see "same", and mallory (visibility all) sees
/// alice's activeClient and tool call contributor only as her opaque
/// upstream id.
#[tokio::test]
async fn s10c_one_client_id_of_three_principals_is_three_upstream_clients() {
    let w = s10c_world().await;
    let host_a = &w.t.hosts[0];
    let chat = main_chat_of("a", "alice-s");
    let up_alice = w.t.upstream_id("alice", "same");
    let up_bob = w.t.upstream_id("bob", "same");
    let up_mallory = w.t.upstream_id("mallory", "same");
    let ids = BTreeSet::from([up_alice.clone(), up_bob.clone(), up_mallory.clone()]);
    assert_eq!(ids.len(), 3, "three principals, three upstream ids");
    let mut mallory = Peer::connect(&w.t, "mallory", &[], "same").await;
    let session_state = subscribe_session(&mut mallory, S10C_SESSION, &chat).await;
    assert_eq!(
        session_state["activeClients"][0]["clientId"],
        up_alice.as_str(),
        "alice's client is an opaque id to mallory"
    );
    let chat_snap = subscribe_ok(&mut mallory, &chat).await;
    let mut seen = Vec::new();
    contributors(&chat_snap, &mut seen);
    assert_eq!(
        seen,
        std::slice::from_ref(&up_alice),
        "contributors as mallory sees them"
    );
    let inits: BTreeSet<String> = initialized_ids(host_a).into_iter().collect();
    assert_eq!(
        inits,
        BTreeSet::from([watch(), up_alice.clone(), up_mallory.clone()]),
        "host a saw alice and mallory as two upstream clients, never \"same\""
    );
    assert!(host_a.received_from("same").is_empty());
}

/// S10c (§4.3, §5.7, §7): mallory (visibility all) with alice's `clientId`
/// cannot see alice's client-claimed terminal (it answers like a random
/// one, is absent from his root, and his input to it gets no echo); his
/// completion of her tool call reaches the host, which rejects it (another
/// upstream client); `session/activeClient*` naming her upstream id is
/// refused by the relay. Her calls, activeClient and claim stay hers, and
/// she then completes and confirms them herself.
#[tokio::test]
async fn s10c_another_principal_cannot_act_on_the_client_s_calls_or_terminal() {
    let mut w = s10c_world().await;
    let chat = main_chat_of("a", "alice-s");
    let host_a = &w.t.hosts[0];
    let up_alice = w.t.upstream_id("alice", "same");
    let up_mallory = w.t.upstream_id("mallory", "same");
    let mut mallory = Peer::connect(&w.t, "mallory", &[], "same").await;
    subscribe_session(&mut mallory, S10C_SESSION, &chat).await;
    subscribe_ok(&mut mallory, &chat).await;
    s10c_assert_terminal_invisible(&mut mallory).await;
    let steal = mallory.dispatch(&chat, s10c_complete(&w.call_id)).await;
    let echo = mallory
        .wait_echo(steal, WAIT)
        .await
        .expect("the host's answer");
    let reason = echo["params"]["rejectionReason"]
        .as_str()
        .unwrap_or_default();
    assert!(
        reason.contains("not contributed by the dispatching client"),
        "the host rejects another client's completion: {echo}"
    );
    for action in [
        json!({"type": "session/activeClientSet", "activeClient": {"clientId": up_alice,
            "tools": [{"name": TOOL}]}}),
        json!({"type": "session/activeClientRemoved", "clientId": up_alice}),
    ] {
        let seq = mallory.dispatch(S10C_SESSION, action).await;
        let reason = rejection(&mut mallory, seq).await;
        assert!(reason.starts_with("cannot translate"), "{reason}");
    }
    let typed_seq = mallory
        .dispatch(
            S10C_TERM,
            json!({"type": "terminal/input", "data": "rm -rf /\n"}),
        )
        .await;
    mallory.settle().await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    mallory.settle().await;
    assert_eq!(
        mallory.echo(typed_seq),
        None,
        "no echo from an invisible terminal"
    );
    let dispatched: Vec<Value> = frames_from(host_a, &up_mallory)
        .into_iter()
        .filter(|f| f["method"] == "dispatchAction")
        .collect();
    assert_eq!(
        dispatched.len(),
        1,
        "only the completion reached the host: {dispatched:?}"
    );
    assert_eq!(dispatched[0]["params"]["clientSeq"], steal);
    s10c_assert_alice_held(&w, "running").await;
    s10c_alice_completes_her_calls(&mut w).await;
}

/// Alice's own completion and confirmation go through, and the host
/// completes her client tool call.
async fn s10c_alice_completes_her_calls(w: &mut S10c) {
    let (chat, conf_chat) = (
        main_chat_of("a", "alice-s"),
        main_chat_of("b", "alice-conf"),
    );
    let done = w.alice.dispatch(&chat, s10c_complete(&w.call_id)).await;
    let echo = w
        .alice
        .wait_echo(done, WAIT)
        .await
        .expect("completion echo");
    assert!(echo["params"].get("rejectionReason").is_none(), "{echo}");
    logged_action(&mut w.alice, &chat, "chat/turnComplete").await;
    let ok = w.alice.dispatch(&conf_chat, s10c_confirm(&w.conf_id)).await;
    let echo = w
        .alice
        .wait_echo(ok, WAIT)
        .await
        .expect("confirmation echo");
    assert!(echo["params"].get("rejectionReason").is_none(), "{echo}");
    logged_action(&mut w.alice, &conf_chat, "chat/turnComplete").await;
    assert_eq!(
        tool_status(&w.t.hosts[0], "ahp-chat:/alice-s-main", &w.call_id),
        Some(json!("completed"))
    );
}

// ─── 5. visibility everywhere ───────────────────────────────────────────────

/// The seeded terminal of host a, claimed by its seeded (external) session.
const SEEDED_TERM: &str = "ahp-terminal:/a~1";
/// Alice's session, chat and terminal in the visibility tests.
const VIS_MINE: &str = "ahp-session:/alice-1";
const VIS_MY_TERM: &str = "ahp-terminal:/alice-t";
/// Bob's session in the visibility tests.
const VIS_BOBS: &str = "ahp-session:/bob-1";

/// The visibility world: host a (one terminal) and b; alice (own, g1), bob
/// (own, host a only, g2), carol (viewer, group, g1) and dave (admin, all)
/// connected and subscribed to the root, in that order.
async fn visibility_world() -> (TestRelay, [Peer; 4]) {
    let rules = rule("alice", &["alice"], &["*"], "operator", "own", "")
        + &rule("bob", &["bob"], &["a"], "operator", "own", "")
        + &rule("carol", &["carol"], &["*"], "viewer", "group", "")
        + &rule("dave", &["dave"], &["*"], "admin", "all", "");
    let mut a = fast_config("a", 1);
    a.terminals = 1;
    let t = TestRelay::start(vec![a, fast_config("b", 1)], &rules).await;
    let mut peers = [
        Peer::connect(&t, "alice", &["g1"], "c").await,
        Peer::connect(&t, "bob", &["g2"], "c").await,
        Peer::connect(&t, "carol", &["g1"], "c").await,
        Peer::connect(&t, "dave", &[], "c").await,
    ];
    for p in peers.iter_mut() {
        p.root().await;
    }
    (t, peers)
}

/// In the visibility world, alice creates [`VIS_MINE`] with a terminal
/// claimed by it and runs a turn, bob creates [`VIS_BOBS`]; returns once
/// dave (who sees everything) heard of all of it and every peer settled.
async fn visibility_changes(peers: &mut [Peer; 4]) {
    let [alice, bob, _, dave] = peers;
    let my_chat = main_chat_of("a", "alice-1");
    create_session(alice, VIS_MINE, "a").await;
    subscribe_session(alice, VIS_MINE, &my_chat).await;
    subscribe_ok(alice, &my_chat).await;
    let r = alice
        .call(
            "createTerminal",
            json!({"channel": VIS_MY_TERM, "claim": session_claim(VIS_MINE, &my_chat)}),
        )
        .await;
    assert_eq!(r["result"], Value::Null, "{r}");
    let seq = alice.dispatch(&my_chat, turn_started("t1", "hello")).await;
    alice.wait_echo(seq, WAIT).await.expect("turn echo");
    logged_action(alice, &my_chat, "chat/turnComplete").await;
    create_session(bob, VIS_BOBS, "a").await;
    // Dave sees all of it; once he has, everyone else's fan-out is done.
    dave.wait_for("bob's session added", |v| {
        v["method"] == "root/sessionAdded" && v["params"]["summary"]["resource"] == VIS_BOBS
    })
    .await;
    dave.wait_for("alice's summary changed", |v| {
        v["method"] == "root/sessionSummaryChanged" && v["params"]["session"] == VIS_MINE
    })
    .await;
    dave.wait_for("alice's terminal", |v| {
        v["params"]["action"]["type"] == "root/terminalsChanged"
            && v.to_string().contains(VIS_MY_TERM)
    })
    .await;
    // The last root news each peer gets: its final `activeSessions` (the
    // count only grows here) and, for who sees alice's session, the summary
    // change of her finished turn. The fan-out writes each watch event to
    // every follower in one pass, so once these are in, so is everything
    // before them; the ping then reads what was queued.
    for (p, want) in peers.iter_mut().zip([1, 1, 1, 4]) {
        p.wait_log("its final activeSessions", |log| {
            last_active_sessions(log) == Some(json!(want))
        })
        .await;
        if p.who != "bob" {
            p.wait_log("alice's turn ended in her summary", |log| {
                turn_ended_in_summary(log, VIS_MINE)
            })
            .await;
        }
        p.settle().await;
    }
}

/// The `activeSessions` of the last `root/activeSessionsChanged` in `log`.
fn last_active_sessions(log: &[Value]) -> Option<Value> {
    log.iter()
        .rev()
        .find(|v| v["params"]["action"]["type"] == "root/activeSessionsChanged")
        .map(|v| v["params"]["action"]["activeSessions"].clone())
}

/// Whether `log` has a `root/sessionSummaryChanged` of `session` in progress
/// (8) and, after it, one idle (1).
fn turn_ended_in_summary(log: &[Value], session: &str) -> bool {
    let statuses: Vec<&Value> = log
        .iter()
        .filter(|v| {
            v["method"] == "root/sessionSummaryChanged" && v["params"]["session"] == session
        })
        .map(|v| &v["params"]["changes"]["status"])
        .collect();
    statuses
        .iter()
        .position(|s| **s == 8)
        .is_some_and(|i| statuses[i..].iter().any(|s| **s == 1))
}

/// Each peer's fresh root: its agents' providers, its terminals and its
/// `activeSessions`.
async fn roots_of(peers: &mut [Peer; 4]) -> (Vec<Vec<String>>, Vec<Vec<String>>, Vec<Value>) {
    let mut roots = Vec::new();
    for p in peers.iter_mut() {
        roots.push(p.root().await);
    }
    let agents = roots
        .iter()
        .map(|r| sorted_strings(&r["agents"], "provider"))
        .collect();
    let terminals = roots
        .iter()
        .map(|r| sorted_strings(&r["terminals"], "resource"))
        .collect();
    let active = roots.iter().map(|r| r["activeSessions"].clone()).collect();
    (agents, terminals, active)
}

/// §6.1 (root state follows visibility): the agents of a host bob may not
/// use are absent from his root, the seeded terminal (claimed by an
/// external session) shows only to dave, and `activeSessions` counts only
/// visible sessions.
#[tokio::test]
async fn root_state_shows_only_what_the_principal_sees() {
    let (_t, mut peers) = visibility_world().await;
    let (agents, terminals, active) = roots_of(&mut peers).await;
    assert_eq!(agents[1], ["sim.a"], "host b is invisible to bob");
    for i in [0, 2, 3] {
        assert_eq!(agents[i], ["sim.a", "sim.b"]);
    }
    assert_eq!(
        terminals,
        [vec![], vec![], vec![], vec![SEEDED_TERM.to_string()]],
        "the seeded terminal is claimed by an external session"
    );
    assert_eq!(active, [json!(0), json!(0), json!(0), json!(2)]);
}

/// §6.3, §6.4: the `root/session*` notifications reach only who sees the
/// session, each once: bob (own, host a only) hears nothing of alice's
/// session or terminal, carol (viewer, group g1 like alice) hears of
/// alice's but not of bob's, dave (admin, all) hears of everything.
#[tokio::test]
async fn catalog_notifications_reach_only_who_sees_the_session() {
    let (_t, mut peers) = visibility_world().await;
    visibility_changes(&mut peers).await;
    let [alice, bob, carol, dave] = &mut peers;
    for p in [&mut *carol, &mut *dave] {
        p.drain(Duration::from_millis(100)).await;
    }
    assert_eq!(alice.catalog("root/sessionAdded", VIS_MINE), 1);
    assert!(alice.catalog("root/sessionSummaryChanged", VIS_MINE) >= 1);
    assert!(
        alice.mentioning("bob-1").is_empty(),
        "{:?}",
        alice.mentioning("bob-1")
    );
    assert!(
        bob.mentioning("alice").is_empty(),
        "bob heard of alice's objects: {:?}",
        bob.mentioning("alice")
    );
    assert_eq!(bob.catalog("root/sessionAdded", VIS_BOBS), 1);
    assert_eq!(carol.catalog("root/sessionAdded", VIS_MINE), 1);
    assert!(carol.catalog("root/sessionSummaryChanged", VIS_MINE) >= 1);
    assert!(
        carol.mentioning("bob-1").is_empty(),
        "{:?}",
        carol.mentioning("bob-1")
    );
    assert_eq!(dave.catalog("root/sessionAdded", VIS_MINE), 1);
    assert_eq!(dave.catalog("root/sessionAdded", VIS_BOBS), 1);
    assert_eq!(
        carol.catalog("root/sessionSummaryChanged", VIS_MINE),
        dave.catalog("root/sessionSummaryChanged", VIS_MINE),
        "each summary change once"
    );
}

/// §6.1, §6.4: after the catalog changed, fresh `listSessions` and root
/// snapshots show each principal exactly its visible sessions and the
/// terminals claimed for them, and each one's live root actions ended at
/// the same `activeSessions`.
#[tokio::test]
async fn fresh_views_after_catalog_changes_agree_with_the_live_ones() {
    let (_t, mut peers) = visibility_world().await;
    visibility_changes(&mut peers).await;
    let mut lists = Vec::new();
    for p in peers.iter_mut() {
        lists.push(p.listed().await);
    }
    assert_eq!(lists[0], [VIS_MINE]);
    assert_eq!(lists[1], [VIS_BOBS]);
    assert_eq!(lists[2], [VIS_MINE]);
    let mut all = vec![
        "ahp-session:/a~a-1",
        VIS_MINE,
        "ahp-session:/b~b-1",
        VIS_BOBS,
    ];
    all.sort();
    assert_eq!(lists[3], all);
    let (_, terminals, active) = roots_of(&mut peers).await;
    assert_eq!(active, [json!(1), json!(1), json!(1), json!(4)]);
    assert_eq!(
        terminals,
        [
            vec![VIS_MY_TERM.to_string()],
            vec![],
            vec![VIS_MY_TERM.to_string()],
            vec![VIS_MY_TERM.to_string(), SEEDED_TERM.to_string()]
        ],
        "terminals: claimed for a session one sees"
    );
    for (p, want) in peers.iter().zip([1, 1, 1, 4]) {
        let last = last_active_sessions(&p.log);
        assert_eq!(last, Some(json!(want)), "{}'s live activeSessions", p.who);
    }
}

/// `reconnect` as (`sub`, `client_id`) on a fresh socket.
async fn reconnect(
    t: &TestRelay,
    sub: &str,
    client_id: &str,
    last_seen: u64,
    subscriptions: &[&str],
) -> (Peer, Value) {
    let mut p = Peer::open(t, sub, &[]).await;
    p.client_id = client_id.into();
    let r = p
        .call(
            "reconnect",
            reconnect_params(client_id, last_seen, subscriptions),
        )
        .await;
    (p, r)
}

/// Bob (visibility all) follows alice's session and chat and his own chat
/// as client "same", then drops; while he is detached alice runs a turn
/// and his second client "other" runs one in his chat, and both land in
/// his detached buffer. Returns alice, his second client and his watermark.
async fn bob_detached_with_alice_buffered(t: &TestRelay) -> (Peer, Peer, u64) {
    let (hers, her_chat) = ("ahp-session:/alice-1", main_chat_of("a", "alice-1"));
    let (his, his_chat) = ("ahp-session:/bob-1", main_chat_of("a", "bob-1"));
    let mut alice = Peer::connect(t, "alice", &[], "a").await;
    create_session(&mut alice, hers, "a").await;
    subscribe_ok(&mut alice, &her_chat).await;
    let mut bob = Peer::connect(t, "bob", &[], "same").await;
    create_session(&mut bob, his, "a").await;
    for c in [hers, her_chat.as_str(), his_chat.as_str()] {
        subscribe_ok(&mut bob, c).await;
    }
    bob.settle().await;
    let watermark = bob.seen;
    drop(bob);
    let away = t.session("bob", "same");
    wait_until("bob is detached", || away.lock().socket_id().is_none()).await;

    let seq = alice
        .dispatch(&her_chat, turn_started("secret", "alice's secret"))
        .await;
    alice.wait_echo(seq, WAIT).await.expect("alice's echo");
    logged_action(&mut alice, &her_chat, "chat/turnComplete").await;
    let mut bob2 = Peer::connect(t, "bob", &[], "other").await;
    subscribe_ok(&mut bob2, &his_chat).await;
    let seq = bob2
        .dispatch(&his_chat, turn_started("his-turn", "bob's words"))
        .await;
    bob2.wait_echo(seq, WAIT).await.expect("bob's echo");
    logged_action(&mut bob2, &his_chat, "chat/turnComplete").await;
    // Precondition: the detached session buffered alice's envelopes (so
    // only a filter at reply time can keep them out).
    let detached = t.session("bob", "same");
    wait_until("alice's turn is in bob's buffer", || {
        let (frames, _) = detached.lock().buffered_since(watermark);
        let texts: Vec<&str> = frames.iter().map(|f| f.to_str()).collect();
        texts.iter().any(|f| f.contains("alice's secret"))
            && texts.iter().any(|f| f.contains("bob's words"))
    })
    .await;
    (alice, bob2, watermark)
}

/// §3.5, §5.5, §7.6: bob sees alice's session (visibility all) and follows
/// it; he drops; while he is detached alice runs a turn (his buffer fills
/// with her envelopes) and the policy narrows him to his own sessions. His
/// `reconnect` must carry nothing of alice's — no envelope, no snapshot —
/// and report her channels as gone, while his own channel's news (a turn
/// from his second client) does arrive.
#[tokio::test]
async fn reconnect_never_replays_what_the_policy_now_hides() {
    let alice_rule = rule("alice", &["alice"], &["*"], "operator", "own", "");
    let t = TestRelay::start(
        two_hosts(),
        &(alice_rule.clone() + &rule("bob", &["bob"], &["*"], "operator", "all", "")),
    )
    .await;
    let (hers, her_chat) = ("ahp-session:/alice-1", main_chat_of("a", "alice-1"));
    let his_chat = main_chat_of("a", "bob-1");
    let (_alice, _bob2, watermark) = bob_detached_with_alice_buffered(&t).await;
    t.relay.relay.set_policy(policy(
        &(alice_rule + &rule("bob", &["bob"], &["*"], "operator", "own", "")),
    ));
    let (mut bob, r) = reconnect(
        &t,
        "bob",
        "same",
        watermark,
        &[hers, her_chat.as_str(), his_chat.as_str()],
    )
    .await;
    let result = &r["result"];
    let mut body = result.clone();
    if let Some(o) = body.as_object_mut() {
        o.remove("missing");
    }
    assert!(
        !body.to_string().contains("alice-1") && !body.to_string().contains("secret"),
        "the reconnect answer carries alice's data: {r}"
    );
    match result["type"].as_str() {
        Some("snapshot") => {
            let resources = sorted_strings(&result["snapshots"], "resource");
            assert_eq!(resources, std::slice::from_ref(&his_chat), "{r}");
            assert!(
                result.to_string().contains("his-turn"),
                "bob's own news is in his snapshot: {r}"
            );
        }
        Some("replay") => {
            let missing: BTreeSet<&str> = result["missing"]
                .as_array()
                .expect("missing")
                .iter()
                .filter_map(Value::as_str)
                .collect();
            assert_eq!(
                missing,
                BTreeSet::from([hers, her_chat.as_str()]),
                "alice's channels are reported gone: {r}"
            );
            assert!(
                result.to_string().contains("his-turn"),
                "bob's own news is replayed: {r}"
            );
        }
        _ => panic!("reconnect failed: {r}"),
    }
    let hidden = bob.call("subscribe", json!({"channel": hers})).await;
    assert_eq!(hidden["error"]["code"], -32001, "{hidden}");
    bob.settle().await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    bob.settle().await;
    assert!(
        bob.mentioning("alice-1").is_empty(),
        "alice's envelopes after the reconnect: {:?}",
        bob.mentioning("alice-1")
    );
}

/// §7.6: a policy reload that hides a subscribed session closes its
/// follower with 4000 at once; its `reconnect` gets a `snapshot` without the
/// hidden channels (root recomputed), and the session now answers as
/// nonexistent. A client that lost nothing stays connected.
#[tokio::test]
async fn policy_reload_hiding_a_subscribed_session_resyncs_the_client() {
    let base = rule("alice", &["alice"], &["*"], "operator", "own", "")
        + &rule("dave", &["dave"], &["*"], "viewer", "all", "");
    let t = TestRelay::start(
        two_hosts(),
        &(base.clone() + &rule("bob", &["bob"], &["*"], "operator", "all", "")),
    )
    .await;
    let hers = "ahp-session:/alice-1";
    let her_chat = main_chat_of("a", "alice-1");
    let his = "ahp-session:/bob-1";
    let mut alice = Peer::connect(&t, "alice", &[], "a").await;
    create_session(&mut alice, hers, "a").await;
    subscribe_ok(&mut alice, &her_chat).await;
    let mut dave = Peer::connect(&t, "dave", &[], "d").await;
    subscribe_ok(&mut dave, &her_chat).await;
    let mut bob = Peer::connect(&t, "bob", &[], "same").await;
    create_session(&mut bob, his, "b").await;
    assert_eq!(bob.root().await["activeSessions"], 4);
    for c in [hers, her_chat.as_str(), his] {
        subscribe_ok(&mut bob, c).await;
    }
    bob.settle().await;

    t.relay.relay.set_policy(policy(
        &(base + &rule("bob", &["bob"], &["*"], "operator", "own", "")),
    ));
    let closed = bob.closed().await;
    assert_eq!(closed.map(|c| c.0), Some(4000), "closed for resync");
    alice.settle().await;
    dave.settle().await;
    let seq = alice
        .dispatch(&her_chat, turn_started("after", "still here"))
        .await;
    alice
        .wait_echo(seq, WAIT)
        .await
        .expect("alice keeps working");
    dave.wait_for("dave still follows alice's chat", |v| {
        v["params"]["channel"] == her_chat.as_str()
            && v["params"]["action"]["type"] == "chat/turnStarted"
    })
    .await;

    let (mut bob, r) = reconnect(
        &t,
        "bob",
        "same",
        bob.seen,
        &[ROOT, hers, her_chat.as_str(), his],
    )
    .await;
    assert_eq!(
        r["result"]["type"], "snapshot",
        "a channel hidden by the reload lost its baseline, so the reconnect \
         must be a snapshot without it (§7.6, Relay::set_policy): {r}"
    );
    let snaps = &r["result"]["snapshots"];
    assert_eq!(
        sorted_strings(snaps, "resource"),
        [ROOT.to_string(), his.to_string()],
        "{r}"
    );
    let root = snaps
        .as_array()
        .and_then(|a| a.iter().find(|s| s["resource"] == ROOT))
        .expect("root snapshot");
    assert_eq!(root["state"]["activeSessions"], 1, "{root}");
    assert!(!r.to_string().contains("alice-1"), "{r}");
    let hidden = bob.call("subscribe", json!({"channel": hers})).await;
    assert_eq!(hidden["error"]["code"], -32001, "{hidden}");
    assert!(hidden["error"].get("data").is_none());
    bob.drain(Duration::from_millis(200)).await;
    assert!(
        bob.mentioning("alice-1").is_empty(),
        "{:?}",
        bob.mentioning("alice-1")
    );
}

// ─── 6. S19 ─────────────────────────────────────────────────────────────────

/// S19, §3.6: a principal opening more clientIds than
/// `sessions_per_principal` gets -32603 `sessionLimit` (re-initializing an
/// existing clientId is not a new session), and more hosts than
/// `links_per_session` in one session gets -32603 `linkLimit`, reaching no
/// host; another principal, at the same time, has its own full quota.
#[tokio::test]
async fn s19_per_principal_caps_leave_other_principals_alone() {
    let t = TestRelay::start(
        two_hosts(),
        "\n[limits]\nsessions_per_principal = 3\nlinks_per_session = 1\n",
    )
    .await;
    let mut alices = Vec::new();
    let mut bobs = Vec::new();
    for i in 0..3 {
        alices.push(Peer::connect(&t, "alice", &[], &format!("c{i}")).await);
        bobs.push(Peer::connect(&t, "bob", &[], &format!("c{i}")).await);
    }
    let mut extra_alice = Peer::open(&t, "alice", &[]).await;
    let mut extra_bob = Peer::open(&t, "bob", &[]).await;
    let (over, bob_over) = tokio::join!(extra_alice.initialize("c3"), extra_bob.initialize("c3"));
    for (who, r) in [("alice", &over), ("bob", &bob_over)] {
        assert_eq!(r["error"]["code"], -32603, "{who}: {r}");
        assert_eq!(r["error"]["data"]["reason"], "sessionLimit", "{who}: {r}");
    }
    // At the cap, alice cannot open a fourth, but carol opens hers at the
    // same moment, and alice re-initializing c0 is no new session.
    let mut late_alice = Peer::open(&t, "alice", &[]).await;
    let (again, carol) = tokio::join!(
        late_alice.initialize("c4"),
        Peer::connect(&t, "carol", &[], "c4")
    );
    assert_eq!(again["error"]["data"]["reason"], "sessionLimit", "{again}");
    let mut carol = carol;
    subscribe_ok(&mut carol, "ahp-session:/a~a-1").await;
    let mut re = Peer::open(&t, "alice", &[]).await;
    let r = re.initialize("c0").await;
    assert!(r["result"]["serverSeq"].is_u64(), "{r}");
    assert_eq!(
        alices[0].closed().await.map(|c| c.0),
        Some(4009),
        "superseded"
    );

    // Links: one host per client session.
    let mut alice = alices.pop().expect("c2");
    subscribe_ok(&mut alice, "ahp-session:/a~a-1").await;
    let r = alice
        .call("subscribe", json!({"channel": "ahp-session:/b~b-1"}))
        .await;
    assert_eq!(r["error"]["code"], -32603, "{r}");
    assert_eq!(r["error"]["data"]["reason"], "linkLimit", "{r}");
    let up = t.upstream_id("alice", "c2");
    assert!(
        t.hosts[1].received_from(&up).is_empty(),
        "no link to b was opened"
    );
    let mut bob = bobs.pop().expect("c2");
    subscribe_ok(&mut bob, "ahp-session:/b~b-1").await;
    let r = bob
        .call("subscribe", json!({"channel": "ahp-session:/a~a-1"}))
        .await;
    assert_eq!(r["error"]["data"]["reason"], "linkLimit", "{r}");
    subscribe_ok(&mut alices[1], "ahp-session:/b~b-1").await;
}

/// §3.3, §7.6 (issue 18, hole 1): a socket's rights are its own token's.
/// Mallory initializes as "w1" with a token carrying group `platform`
/// (admin on `a`, every session, external ones too) and follows the seeded
/// session; she then reconnects "w1" with a token *without* the group. The
/// answer is a `snapshot` built under her new rights (the seeded session
/// absent), and from then on she is what the group-less token makes her —
/// a viewer of her own sessions: nothing external listed, `createSession`
/// -32009, `disposeSession` of the seeded session answered as nonexistent,
/// `resourceWrite` -32009, and host `a` receives none of it. Before the
/// fix she stayed admin through the `replay`.
#[tokio::test]
async fn a_reconnect_takes_the_groups_of_its_own_token() {
    let platform = "groups = [\"platform\"]\nexternal_sessions = true";
    let rules = rule("platform", &[], &["a"], "admin", "all", platform)
        + &rule("mallory", &["mallory"], &["a"], "viewer", "own", "");
    let t = TestRelay::start(two_hosts(), &rules).await;
    let seeded = "ahp-session:/a~a-1";
    let mut mal = Peer::open(&t, "mallory", &["platform"]).await;
    let init = mal.initialize("w1").await;
    assert!(init["result"]["serverSeq"].is_u64(), "{init}");
    let listed = mal.call("listSessions", json!({"channel": ROOT})).await;
    assert!(listed.to_string().contains(seeded), "as admin: {listed}");
    let r = mal.call("subscribe", json!({"channel": seeded})).await;
    assert!(r["result"]["snapshot"].is_object(), "as admin: {r}");
    mal.settle().await;
    let watermark = mal.seen;
    drop(mal);

    let mut mal = Peer::open(&t, "mallory", &[]).await;
    mal.client_id = "w1".into();
    let r = mal
        .call(
            "reconnect",
            reconnect_params("w1", watermark, &[ROOT, seeded]),
        )
        .await;
    assert_eq!(r["result"]["type"], "snapshot", "{r}");
    let resources = sorted_strings(&r["result"]["snapshots"], "resource");
    assert_eq!(resources, vec![ROOT.to_string()], "{r}");
    let upstream = t.upstream_id("mallory", "w1");
    let before = frames_from(&t.hosts[0], &upstream).len();

    let listed = mal.call("listSessions", json!({"channel": ROOT})).await;
    assert!(!listed.to_string().contains(seeded), "as viewer: {listed}");
    let created = mal
        .call(
            "createSession",
            json!({"channel": "ahp-session:/mal-1", "provider": "sim.a"}),
        )
        .await;
    assert_eq!(created["error"]["code"], -32009, "{created}");
    let disposed = mal.call("disposeSession", json!({"channel": seeded})).await;
    assert_eq!(disposed["error"]["code"], -32001, "{disposed}");
    let file = format!("file://a{}", t.hosts[0].sandbox().join("mal.txt").display());
    let write = json!({"channel": ROOT, "uri": file, "data": "x", "encoding": "utf-8"});
    let written = mal.call("resourceWrite", write).await;
    assert_eq!(written["error"]["code"], -32009, "{written}");
    assert!(!t.hosts[0].sandbox().join("mal.txt").exists());
    let after: Vec<String> = frames_from(&t.hosts[0], &upstream)[before..]
        .iter()
        .filter_map(|f| f["method"].as_str().map(str::to_string))
        .collect();
    assert!(
        after.iter().all(|m| m == "ping" || m == "unsubscribe"),
        "host a received {after:?} after the reconnect"
    );
}

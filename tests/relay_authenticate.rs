//! `authenticate` through the relay (contract §4.6): a token reaches exactly
//! the hosts that advertise its protected resource and on which the
//! principal may operate, over the client's own links; the answer reflects
//! the hosts' answers; the token is replayed first on a link opened later.

mod common;

use std::sync::Arc;

use ahp_relay::config::AuthenticateScope;
use ahp_relay::policy::{Grant, HostRef, Policy, Role, Subject, Visibility};
use ahp_relay::simhost::{SimHost, SimHostConfig, naming};
use common::relay::{TestRelay, rule};
use common::*;
use serde_json::{Value, json};

const API: &str = "https://api.relay-test.example";

/// A simhost whose agent declares [`API`] as a protected resource.
fn protected(name: &str) -> SimHostConfig {
    let mut cfg = fast_config(name, 1);
    cfg.protected_resources = vec![API.into()];
    cfg
}

fn host<'a>(t: &'a TestRelay, name: &str) -> &'a SimHost {
    t.hosts
        .iter()
        .find(|h| h.config().name == name)
        .expect("host")
}

/// Subscribes the seeded session of each host in `hosts` (opening a link).
async fn open_links(ws: &mut RawWs, hosts: &[&str]) {
    for (i, h) in hosts.iter().enumerate() {
        let channel = format!("ahp-session:/{h}~{h}-1");
        let r = ws
            .request(100 + i as u64, "subscribe", json!({"channel": channel}))
            .await;
        assert!(r.get("result").is_some(), "subscribe {channel}: {r}");
    }
}

async fn authenticate(ws: &mut RawWs, id: u64, token: &str) -> Value {
    let params = json!({"channel": "ahp-root://", "resource": API, "token": token,
        "expiresIn": 3600});
    ws.request(id, "authenticate", params).await
}

/// The `authenticate` frames `h` received from upstream client `from`.
fn tokens_at(t: &TestRelay, h: &str, from: &str) -> Vec<Value> {
    host(t, h)
        .received_from(from)
        .iter()
        .filter(|f| f.method.as_deref() == Some("authenticate"))
        .map(|f| serde_json::from_str::<Value>(&f.text).expect("json")["params"].clone())
        .collect()
}

/// Alice operates a and c and only views b; a and b declare the resource,
/// c does not. With links open to all three, her token reaches a alone,
/// with its remaining lifetime, and the request succeeds.
#[tokio::test]
async fn a_token_reaches_exactly_the_permitted_hosts_that_declared_the_resource() {
    let rules = rule("ops", &["alice"], &["a", "c"], "operator", "all", "")
        + &rule("view", &["alice"], &["b"], "viewer", "all", "");
    let hosts = vec![protected("a"), protected("b"), fast_config("c", 1)];
    let t = TestRelay::start(hosts, &rules).await;
    let mut ws = t.raw("alice").await;
    ws.initialize("auth-1").await;
    open_links(&mut ws, &["a", "b", "c"]).await;
    let r = authenticate(&mut ws, 1, "tok-1").await;
    assert_eq!(r["result"], json!({}), "{r}");
    let up = t.upstream_id("alice", "auth-1");
    let at_a = tokens_at(&t, "a", &up);
    assert_eq!(at_a.len(), 1, "{at_a:?}");
    assert_eq!(at_a[0]["token"], "tok-1");
    assert_eq!(at_a[0]["resource"], API);
    let left = at_a[0]["expiresIn"].as_u64().expect("expiresIn");
    assert!((3598..=3600).contains(&left), "remaining lifetime {left}");
    assert!(tokens_at(&t, "b", &up).is_empty(), "a viewer's token");
    assert!(tokens_at(&t, "c", &up).is_empty(), "c never declared it");
}

/// A resource no visible host declares is refused with -32602 and reaches
/// no host.
#[tokio::test]
async fn an_undeclared_resource_is_refused() {
    let t = TestRelay::start(vec![fast_config("a", 1)], "").await;
    let mut ws = t.raw("alice").await;
    ws.initialize("auth-2").await;
    open_links(&mut ws, &["a"]).await;
    let r = authenticate(&mut ws, 1, "tok").await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    let up = t.upstream_id("alice", "auth-2");
    assert!(tokens_at(&t, "a", &up).is_empty());
}

/// A token the only receiving host refuses fails the request with the
/// host's error (-32007 from the simhost for `invalid…` tokens).
#[tokio::test]
async fn a_token_every_host_refuses_fails_with_the_hosts_error() {
    let t = TestRelay::start(vec![protected("a")], "").await;
    let mut ws = t.raw("alice").await;
    ws.initialize("auth-3").await;
    open_links(&mut ws, &["a"]).await;
    let r = authenticate(&mut ws, 1, "invalid-token").await;
    assert_eq!(r["error"]["code"], -32007, "{r}");
}

/// A token pushed before the session uses host d reaches d first thing on
/// the link opened later, before the request that opened it.
#[tokio::test]
async fn a_link_opened_later_receives_the_token_first() {
    let t = TestRelay::start(vec![protected("a"), protected("d")], "").await;
    let mut ws = t.raw("alice").await;
    ws.initialize("auth-4").await;
    open_links(&mut ws, &["a"]).await;
    let r = authenticate(&mut ws, 1, "tok-4").await;
    assert_eq!(r["result"], json!({}), "{r}");
    let up = t.upstream_id("alice", "auth-4");
    assert!(tokens_at(&t, "d", &up).is_empty(), "no link to d yet");
    open_links(&mut ws, &["d"]).await;
    let methods: Vec<String> = host(&t, "d")
        .received_from(&up)
        .iter()
        .filter_map(|f| f.method.clone())
        .filter(|m| m != "ping")
        .collect();
    assert_eq!(methods, ["authenticate", "subscribe"], "{methods:?}");
    assert_eq!(tokens_at(&t, "d", &up)[0]["token"], "tok-4");
}

/// §4.6 (issue 18, hole 2): dave operates h1 and only views h2, both
/// declaring the resource. His token reaches h1; when a later `subscribe`
/// opens his first link to h2, that link starts with `initialize` and
/// the `subscribe` — never his token, at any send.
#[tokio::test]
async fn a_link_opened_later_to_a_viewed_host_never_receives_the_token() {
    let rules = rule("ops", &["dave"], &["h1"], "operator", "all", "")
        + &rule("view", &["dave"], &["h2"], "viewer", "all", "");
    let t = TestRelay::start(vec![protected("h1"), protected("h2")], &rules).await;
    let mut ws = t.raw("dave").await;
    ws.initialize("auth-5").await;
    open_links(&mut ws, &["h1"]).await;
    let r = authenticate(&mut ws, 1, "tok-5").await;
    assert_eq!(r["result"], json!({}), "{r}");
    let up = t.upstream_id("dave", "auth-5");
    assert_eq!(tokens_at(&t, "h1", &up).len(), 1, "the operated host");
    open_links(&mut ws, &["h2"]).await;
    let methods: Vec<String> = host(&t, "h2")
        .received_from(&up)
        .iter()
        .filter_map(|f| f.method.clone())
        .filter(|m| m != "ping")
        .collect();
    assert_eq!(methods, ["subscribe"], "h2 saw: {methods:?}");
    assert!(tokens_at(&t, "h2", &up).is_empty(), "a viewer's token");
}

/// A raw socket of `sub` initialized as `client_id` that follows `channel`.
async fn following(t: &TestRelay, sub: &str, client_id: &str, channel: &str) -> RawWs {
    let mut ws = t.raw(sub).await;
    ws.initialize(client_id).await;
    let r = ws
        .request(1, "subscribe", json!({"channel": channel}))
        .await;
    assert!(r.get("result").is_some(), "{sub}: subscribe {channel}: {r}");
    ws
}

/// The frames up to the answer of a request routed to the host of
/// `channel`: the host wrote everything it sent this client before it
/// answered, and the relay keeps a link's order (§4.5).
async fn frames_through_host(ws: &mut RawWs, id: u64, channel: &str) -> Vec<Value> {
    ws.send_json(&request_frame(
        id,
        "fetchTurns",
        json!({"channel": channel}),
    ))
    .await;
    frames_until(ws, |f| f["id"] == id).await
}

/// §4.6, §6.4, §7.6 (S18, issue 18): host v broadcasts `auth/required`
/// to every connection, as VS Code's does. When alice's short-lived token
/// runs out there, only alice hears of it: bob (operator, whose token is
/// good for an hour) and vic (viewer) get nothing, and bob's kept token is
/// still replayed first on the link he opens later to h2.
#[tokio::test]
async fn a_broadcast_expiry_reaches_only_the_session_whose_token_ran_out() {
    let mut v = protected("v");
    v.vscode_compat = true;
    // Tokens per connection, so each session's expiry is its own: this
    // test is about broadcasts reaching a relay that treats the host as
    // per-connection (the host-wide setting is tested below).
    v.per_connection_tokens = true;
    let session = format!("sim.v:/{}", naming::seeded_uuid(&v, 1));
    let chat = naming::vscode_chat_uri(&session, naming::DEFAULT_CHAT_ID);
    let rules = rule(
        "ops",
        &["alice", "bob"],
        &["v", "h2"],
        "operator",
        "all",
        "",
    ) + &rule("view", &["vic"], &["v"], "viewer", "all", "");
    let t = TestRelay::start(vec![v, protected("h2")], &rules).await;
    let mut alice = following(&t, "alice", "al", &chat).await;
    let mut bob = following(&t, "bob", "bo", &chat).await;
    let mut vic = following(&t, "vic", "vi", &chat).await;
    let short = json!({"channel": ROOT, "resource": API, "token": "tok-a", "expiresIn": 1});
    let r = alice.request(2, "authenticate", short).await;
    assert_eq!(r["result"], json!({}), "{r}");
    assert_eq!(
        authenticate(&mut bob, 2, "tok-b").await["result"],
        json!({})
    );
    let got = frames_until(&mut alice, |f| f["method"] == "auth/required").await;
    let p = &got.last().expect("alice's auth/required")["params"];
    assert_eq!(
        (p["reason"].as_str(), p["channel"].as_str()),
        (Some("expired"), Some(ROOT))
    );
    for (who, ws) in [("bob", &mut bob), ("vic", &mut vic)] {
        let frames = frames_through_host(ws, 3, &chat).await;
        let auth: Vec<&Value> = frames
            .iter()
            .filter(|f| f["method"] == "auth/required")
            .collect();
        assert!(
            auth.is_empty(),
            "{who} got another session's event: {auth:?}"
        );
    }
    open_links(&mut bob, &["h2"]).await;
    let at_h2 = tokens_at(&t, "h2", &t.upstream_id("bob", "bo"));
    assert_eq!(at_h2.len(), 1, "bob's token is still kept: {at_h2:?}");
    assert_eq!(at_h2[0]["token"], "tok-b");
}

/// A reloaded policy: everyone views host `.0` and operates the others.
#[derive(Debug)]
struct ViewerOn(&'static str);

impl Policy for ViewerOn {
    fn grant(&self, _who: Subject<'_>, host: HostRef<'_>) -> Option<Grant> {
        let role = if host.id == self.0 {
            Role::Viewer
        } else {
            Role::Operator
        };
        Some(Grant {
            permissions: role.permissions(),
            visibility: Visibility::All,
            external: true,
            dispose_others: false,
            session_files: false,
            rule: "reloaded".into(),
        })
    }
}

/// §4.6, §7.6: dave's token went to h1 and h2, which he operates. A reload
/// makes him a viewer of h1: h1 gets the token revoked (an empty token) on
/// his open link, h2, which he still operates, keeps it.
#[tokio::test]
async fn a_reload_that_ends_operating_revokes_the_token_there() {
    let rules = rule("ops", &["dave"], &["h1", "h2"], "operator", "all", "");
    let t = TestRelay::start(vec![protected("h1"), protected("h2")], &rules).await;
    let mut ws = t.raw("dave").await;
    ws.initialize("auth-7").await;
    open_links(&mut ws, &["h1", "h2"]).await;
    assert_eq!(authenticate(&mut ws, 1, "tok-7").await["result"], json!({}));
    let up = t.upstream_id("dave", "auth-7");
    t.relay.relay.set_policy(Arc::new(ViewerOn("h1")));
    wait_until("h1 receives the revocation", || {
        tokens_at(&t, "h1", &up).iter().any(|p| p["token"] == "")
    })
    .await;
    let at_h1 = tokens_at(&t, "h1", &up);
    assert_eq!(at_h1.len(), 2, "the token, then its revocation: {at_h1:?}");
    assert_eq!(at_h1[1]["resource"], API);
    // A request answered by h2 after the reload: everything the relay sent
    // h2 on this link before it has arrived.
    let chat = json!({"channel": "ahp-chat:/h2~h2-1-main"});
    let r = ws.request(2, "fetchTurns", chat).await;
    assert!(r.get("result").is_some(), "{r}");
    let at_h2 = tokens_at(&t, "h2", &up);
    assert_eq!(at_h2.len(), 1, "h2 keeps the token: {at_h2:?}");
    assert_eq!(at_h2[0]["token"], "tok-7");
}

/// §4.6, §5.8: hosts keep tokens per connection, so when a link's
/// connection drops and the link resumes on a new one, the session's token
/// is sent again there.
#[tokio::test]
async fn a_resumed_link_gets_the_token_again_on_its_new_connection() {
    let t = TestRelay::start(vec![protected("a")], "").await;
    let mut ws = t.raw("alice").await;
    ws.initialize("auth-8").await;
    open_links(&mut ws, &["a"]).await;
    assert_eq!(authenticate(&mut ws, 1, "tok-8").await["result"], json!({}));
    let up = t.upstream_id("alice", "auth-8");
    assert_eq!(
        host(&t, "a").drop_client(&up),
        1,
        "the link's connection is cut"
    );
    wait_until("the token on the resumed connection", || {
        tokens_at(&t, "a", &up).len() == 2
    })
    .await;
    let conns: Vec<_> = host(&t, "a")
        .received_from(&up)
        .iter()
        .filter(|f| f.method.as_deref() == Some("authenticate"))
        .map(|f| f.conn)
        .collect();
    assert_ne!(conns[0], conns[1], "sent again on the new connection");
    assert_eq!(tokens_at(&t, "a", &up)[1]["token"], "tok-8");
}

/// A VS Code-mode host `name` (one token store for the whole host) whose
/// agent declares [`API`], and its seeded session's default chat.
fn vscode_protected(name: &str) -> (SimHostConfig, String) {
    let mut cfg = protected(name);
    cfg.vscode_compat = true;
    let session = format!("sim.{name}:/{}", naming::seeded_uuid(&cfg, 1));
    let chat = naming::vscode_chat_uri(&session, naming::DEFAULT_CHAT_ID);
    (cfg, chat)
}

/// A relay in front of `hosts` under `rules`, the hosts named in
/// `host_wide` configured `authenticate = "host-wide"`.
async fn start_host_wide(hosts: Vec<SimHostConfig>, rules: &str, host_wide: &[&str]) -> TestRelay {
    let t = TestRelay::start_tweaked(hosts, "", rules, |cfg| {
        for h in cfg.hosts.iter_mut() {
            if host_wide.contains(&h.id.as_str()) {
                h.authenticate = AuthenticateScope::HostWide;
            }
        }
    })
    .await;
    t.wait_hosts_up().await;
    t
}

/// Every `authenticate` host `h` received, from any upstream client.
fn all_tokens_at(t: &TestRelay, h: &str) -> usize {
    host(t, h)
        .received()
        .iter()
        .filter(|f| f.method.as_deref() == Some("authenticate"))
        .count()
}

/// Issue 26 (deliver 6): host v keeps one token for every user, as VS
/// Code's does, and is configured `host-wide`. Olga operates v: her
/// `authenticate` is refused with -32009 saying the credentials are shared
/// and reaches no host; her turn is then refused by the host, whose
/// broadcast `auth/required` reaches v's admin Ada and not Olga. Ada's
/// token goes, and serves Olga's next turn too (the consequence the
/// setting documents).
#[tokio::test]
async fn a_host_wide_host_takes_a_token_only_from_its_admin() {
    let (v, chat) = vscode_protected("v");
    let rules = rule("ops", &["olga"], &["v"], "operator", "all", "")
        + &rule("boss", &["ada"], &["v"], "admin", "all", "");
    let t = start_host_wide(vec![v], &rules, &["v"]).await;
    let mut olga = following(&t, "olga", "ol", &chat).await;
    let mut ada = following(&t, "ada", "ad", &chat).await;
    let r = authenticate(&mut olga, 2, "tok-olga").await;
    assert_eq!(r["error"]["code"], -32009, "{r}");
    let message = r["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("shared by every user"), "{message}");
    assert_eq!(all_tokens_at(&t, "v"), 0, "the host received a token");

    olga.send_json(&start_turn_frame(&chat, 1, "t-olga-1"))
        .await;
    let echo = frames_until(&mut olga, |f| f["method"] == "action").await;
    let echo = echo.last().expect("the echo");
    assert!(echo["params"]["rejectionReason"].is_string(), "{echo}");
    let got = frames_until(&mut ada, |f| f["method"] == "auth/required").await;
    assert_eq!(got.last().expect("ada's")["params"]["reason"], "required");
    let frames = frames_through_host(&mut olga, 3, &chat).await;
    assert!(
        frames.iter().all(|f| f["method"] != "auth/required"),
        "olga may not authenticate v, so she is not asked to: {frames:?}"
    );

    let r = authenticate(&mut ada, 2, "tok-ada").await;
    assert_eq!(r["result"], json!({}), "{r}");
    let at_v = tokens_at(&t, "v", &t.upstream_id("ada", "ad"));
    assert_eq!(at_v.len(), 1, "{at_v:?}");
    assert_eq!(at_v[0]["token"], "tok-ada");
    assert_eq!(all_tokens_at(&t, "v"), 1, "only ada's token");
    olga.send_json(&start_turn_frame(&chat, 2, "t-olga-2"))
        .await;
    let echo = frames_until(&mut olga, |f| {
        f["method"] == "action" && f["params"]["origin"]["clientSeq"] == 2
    })
    .await;
    let echo = echo.last().expect("the echo");
    assert!(
        echo["params"].get("rejectionReason").is_none(),
        "ada's token serves olga's turn on the host-wide host: {echo}"
    );
}

/// Per-connection hosts are unchanged beside a host-wide one: Olga
/// operates both; her token reaches a (per-connection) and never v
/// (host-wide), and the request succeeds.
#[tokio::test]
async fn beside_a_host_wide_host_a_per_connection_host_still_gets_an_operators_token() {
    let (v, chat) = vscode_protected("v");
    let rules = rule("ops", &["olga"], &["v", "a"], "operator", "all", "");
    let t = start_host_wide(vec![v, protected("a")], &rules, &["v"]).await;
    let mut olga = following(&t, "olga", "ol", &chat).await;
    open_links(&mut olga, &["a"]).await;
    let r = authenticate(&mut olga, 2, "tok-olga").await;
    assert_eq!(r["result"], json!({}), "{r}");
    let at_a = tokens_at(&t, "a", &t.upstream_id("olga", "ol"));
    assert_eq!(at_a.len(), 1, "{at_a:?}");
    assert_eq!(at_a[0]["token"], "tok-olga");
    assert_eq!(all_tokens_at(&t, "v"), 0, "the host-wide host got a token");
}

/// Issue 26: on a host-wide host the one token is everyone's, so when it
/// runs out every admin there hears of it — Abe too, who never
/// authenticated, so that one of them can supply a new token — and an
/// operator does not (she may not supply one).
#[tokio::test]
async fn a_host_wide_expiry_reaches_every_admin_and_no_operator() {
    let (v, chat) = vscode_protected("v");
    let rules = rule("ops", &["olga"], &["v"], "operator", "all", "")
        + &rule("boss", &["ada", "abe"], &["v"], "admin", "all", "");
    let t = start_host_wide(vec![v], &rules, &["v"]).await;
    let mut ada = following(&t, "ada", "ad", &chat).await;
    let mut abe = following(&t, "abe", "ab", &chat).await;
    let mut olga = following(&t, "olga", "ol", &chat).await;
    let short = json!({"channel": ROOT, "resource": API, "token": "tok-a", "expiresIn": 1});
    assert_eq!(
        ada.request(2, "authenticate", short).await["result"],
        json!({})
    );
    for ws in [&mut ada, &mut abe] {
        let got = frames_until(ws, |f| f["method"] == "auth/required").await;
        assert_eq!(
            got.last().expect("auth/required")["params"]["reason"],
            "expired"
        );
    }
    let frames = frames_through_host(&mut olga, 3, &chat).await;
    assert!(
        frames.iter().all(|f| f["method"] != "auth/required"),
        "{frames:?}"
    );
}

/// A reloaded policy: no rule for host `.0`, operator elsewhere.
#[derive(Debug)]
struct NothingOn(&'static str);

impl Policy for NothingOn {
    fn grant(&self, who: Subject<'_>, host: HostRef<'_>) -> Option<Grant> {
        (host.id != self.0)
            .then(|| ViewerOn("-").grant(who, host))
            .flatten()
    }
}

/// §4.6, §7.6: dave's token went to h1 and h2; a reload takes h1 from him
/// altogether (no rule left there — a stronger change than being made a
/// viewer): h1 gets the token revoked on his link before the relay closes
/// that link, and h2 keeps it. Before, the link was closed first and the
/// revocation had nowhere to go, so a host that keeps tokens beyond the
/// connection (VS Code's host-wide store) kept acting with his credential.
#[tokio::test]
async fn a_reload_that_takes_the_host_away_revokes_the_token_there_first() {
    let rules = rule("ops", &["dave"], &["h1", "h2"], "operator", "all", "");
    let t = TestRelay::start(vec![protected("h1"), protected("h2")], &rules).await;
    let mut ws = t.raw("dave").await;
    ws.initialize("auth-gone").await;
    open_links(&mut ws, &["h1", "h2"]).await;
    assert_eq!(authenticate(&mut ws, 1, "tok-g").await["result"], json!({}));
    let up = t.upstream_id("dave", "auth-gone");
    t.relay.relay.set_policy(Arc::new(NothingOn("h1")));
    wait_until("h1 receives the revocation", || {
        tokens_at(&t, "h1", &up).iter().any(|p| p["token"] == "")
    })
    .await;
    let at_h1 = tokens_at(&t, "h1", &up);
    assert_eq!(at_h1.len(), 2, "the token, then its revocation: {at_h1:?}");
    // He lost h1's session he followed: resynchronised (4000) after it.
    assert_eq!(ws.close_code().await.map(|c| c.0), Some(4000));
    let at_h2 = tokens_at(&t, "h2", &up);
    assert_eq!(at_h2.len(), 1, "h2 keeps the token: {at_h2:?}");
}

/// §4.6, §7.6: a `host-wide` host keeps the one token it was given after the
/// connection that carried it closed. Ada, v's admin, authenticated there;
/// her link to v closed idle; a reload then takes v from her: the relay
/// opens a link to v to revoke her token (an empty one). Before, only an
/// open link carried a revocation, and v went on serving every user's
/// turns with the credential of someone who has no rule on it any more.
#[tokio::test]
async fn a_host_wide_token_is_revoked_after_its_link_closed() {
    let (v, chat) = vscode_protected("v");
    let rules =
        rule("boss", &["ada"], &["v"], "admin", "all", "") + "\n[limits]\nlink_idle_secs = 1\n";
    let t = start_host_wide(vec![v], &rules, &["v"]).await;
    let mut ada = following(&t, "ada", "ad", &chat).await;
    let r = authenticate(&mut ada, 2, "tok-ada").await;
    assert_eq!(r["result"], json!({}), "{r}");
    let unsubscribe = notification_frame("unsubscribe", json!({"channel": chat}));
    ada.send_json(&unsubscribe).await;
    let idle = || t.relay.relay.metrics.links_idle_closed.get();
    wait_until("ada's link to v closes idle", || idle() >= 1).await;
    let up = t.upstream_id("ada", "ad");
    assert_eq!(tokens_at(&t, "v", &up).len(), 1, "the token alone so far");
    t.relay.relay.set_policy(Arc::new(NothingOn("v")));
    wait_until("v receives the revocation", || {
        tokens_at(&t, "v", &up).iter().any(|p| p["token"] == "")
    })
    .await;
}

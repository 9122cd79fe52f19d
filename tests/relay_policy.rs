//! The policy is the single decision point (contract §4.4, §7.3): swapping
//! it changes what routing, listing, root and dispatch allow — here with a
//! test policy that hides one host and denies operating on another.

mod common;

use std::sync::Arc;

use ahp_relay::policy::{Grant, HostRef, PermSet, Permission, Policy, Subject, Visibility};
use common::relay::{TestRelay, rule};
use common::*;
use serde_json::{Value, json};

/// Hides host `b` from everyone; on host `a` only reading is allowed.
#[derive(Debug)]
struct HideBReadOnlyA;

impl Policy for HideBReadOnlyA {
    fn grant(&self, _who: Subject<'_>, host: HostRef<'_>) -> Option<Grant> {
        (host.id != "b").then(|| Grant {
            permissions: PermSet::of(&[Permission::SessionsRead]),
            visibility: Visibility::All,
            external: true,
            dispose_others: false,
            session_files: false,
            rule: "test".into(),
        })
    }
}

/// Hosts a and b behind a relay whose policy is swapped for
/// [`HideBReadOnlyA`], and alice's raw socket initialized as "c".
async fn policy_world() -> (TestRelay, RawWs) {
    let t = TestRelay::start(vec![fast_config("a", 1), fast_config("b", 1)], "").await;
    t.relay.relay.set_policy(Arc::new(HideBReadOnlyA));
    let mut ws = t.raw("alice").await;
    ws.initialize("c").await;
    (t, ws)
}

/// Nothing but the watch link's own frames reached hidden host b, and no
/// per-client link to it was opened.
fn assert_hidden_host_untouched(t: &TestRelay) {
    let to_b: Vec<_> = t.hosts[1]
        .received()
        .into_iter()
        .filter(|f| {
            f.method.as_deref() != Some("initialize") && f.method.as_deref() != Some("listSessions")
        })
        .collect();
    assert!(
        to_b.is_empty(),
        "nothing but the watch link reached host b: {to_b:?}"
    );
    assert_eq!(
        t.hosts[1].connections(),
        1,
        "no per-client link was opened to the hidden host"
    );
}

/// §4.4, §7.3: after a policy swap, `listSessions` and the root snapshot
/// show only the sessions and agents of the hosts the policy leaves
/// visible.
#[tokio::test]
async fn a_swapped_policy_decides_listing_and_root() {
    let (t, mut ws) = policy_world().await;
    let uris = listed_uris(&mut ws, 1).await;
    assert_eq!(uris, ["ahp-session:/a~a-1"], "b's sessions are invisible");
    let root = ws
        .request(2, "subscribe", json!({"channel": "ahp-root://"}))
        .await;
    let agents: Vec<&str> = root["result"]["snapshot"]["state"]["agents"]
        .as_array()
        .expect("agents")
        .iter()
        .filter_map(|a| a["provider"].as_str())
        .collect();
    assert_eq!(agents, ["sim.a"]);
    assert_eq!(root["result"]["snapshot"]["state"]["activeSessions"], 1);
    assert_hidden_host_untouched(&t);
}

/// §4.4, §7.3: after a policy swap, a session of the hidden host answers
/// like a nonexistent one (-32001 without `data`), reading a visible chat
/// is allowed, and creating a session where only reading is granted is
/// -32009 (after the -32602 of a malformed create).
#[tokio::test]
async fn a_swapped_policy_decides_routing() {
    let (t, mut ws) = policy_world().await;
    let hidden = ws
        .request(3, "subscribe", json!({"channel": "ahp-session:/b~b-1"}))
        .await;
    assert_eq!(
        hidden["error"]["code"], -32001,
        "invisible = nonexistent: {hidden}"
    );
    assert!(hidden["error"].get("data").is_none());
    let read = ws
        .request(4, "subscribe", json!({"channel": "ahp-chat:/a~a-1-main"}))
        .await;
    assert!(read.get("result").is_some(), "reading is permitted: {read}");
    for (id, channel, code, what) in [
        (
            5,
            "ahp-root://",
            -32602,
            "createSession needs its own channel",
        ),
        (6, "ahp-session:/mine", -32009, "visible but not permitted"),
    ] {
        let create = ws
            .request(
                id,
                "createSession",
                json!({"channel": channel, "provider": "sim.a"}),
            )
            .await;
        assert_eq!(create["error"]["code"], code, "{what}: {create}");
    }
    assert_hidden_host_untouched(&t);
}

/// §4.4, §5.3, §7.3: after a policy swap, a dispatch where only reading is
/// granted gets a "permission denied" rejection echo with the client's
/// origin, one to the hidden host gets no echo at all, and neither reaches
/// a host.
#[tokio::test]
async fn a_swapped_policy_decides_dispatch() {
    let (t, mut ws) = policy_world().await;
    ws.dispatch(
        "ahp-chat:/a~a-1-main",
        1,
        json!({"type": "chat/draftChanged"}),
    )
    .await;
    let echo = ws.recv_json().await.expect("a rejection echo");
    assert_eq!(echo["method"], "action");
    assert_eq!(echo["params"]["rejectionReason"], "permission denied");
    assert_eq!(echo["params"]["origin"]["clientId"], "c");
    ws.dispatch(
        "ahp-chat:/b~b-1-main",
        2,
        json!({"type": "chat/draftChanged"}),
    )
    .await;
    let before = frames_before_ping(&mut ws, 7).await;
    assert!(
        before.is_empty(),
        "no echo for the invisible channel: {before:?}"
    );
    assert_hidden_host_untouched(&t);
    let dispatched_to_a = t.hosts[0]
        .received()
        .iter()
        .any(|f| f.method.as_deref() == Some("dispatchAction"));
    assert!(!dispatched_to_a, "a denied dispatch never reaches the host");
}

/// §7.6 / §8.1: the relay re-reads its config file when it changes; the new
/// policy applies to the next request, a client that lost sight of a
/// subscribed channel is closed with 4000, and its `reconnect` gets a
/// snapshot without that channel. An invalid file keeps the old policy.
#[tokio::test]
async fn policy_reload_from_the_config_file_resyncs_clients_that_lost_sight() {
    let both = rule("everyone-sees-all", &["*"], &["*"], "operator", "all", "");
    let only_a = rule("everyone-sees-a", &["*"], &["a"], "operator", "all", "");
    let t = TestRelay::start(vec![fast_config("a", 1), fast_config("b", 1)], &both).await;
    let mut ws = t.raw("bob").await;
    ws.initialize("c").await;
    for (id, ch) in [(1, "ahp-session:/a~a-1"), (2, "ahp-session:/b~b-1")] {
        let r = ws.request(id, "subscribe", json!({"channel": ch})).await;
        assert!(r.get("result").is_some(), "{r}");
    }
    let path = t.kit.dir.join("relay.toml");
    let original = std::fs::read_to_string(&path).expect("config");
    // A broken file is ignored (the old policy stays in force).
    std::fs::write(
        &path,
        format!("{original}\n[[policy.rules]]\nrole = \"root\"\n"),
    )
    .unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    let still = ws
        .request(3, "subscribe", json!({"channel": "ahp-chat:/b~b-1-main"}))
        .await;
    assert!(still.get("result").is_some(), "old policy kept: {still}");
    // Hosts are generated before the policy in the dev config: replace it.
    let changed = original.replace(&both, &only_a);
    assert_ne!(changed, original);
    std::fs::write(&path, changed).unwrap();
    let closed = tokio::time::timeout(std::time::Duration::from_secs(15), ws.close_code())
        .await
        .expect("closed within the reload period");
    assert_eq!(
        closed.map(|c| c.0),
        Some(4000),
        "lost sight of b's channels"
    );
    let mut again = t.raw("bob").await;
    let r = again
        .request(
            1,
            "reconnect",
            json!({"channel": "ahp-root://", "clientId": "c", "lastSeenServerSeq": 0,
                "subscriptions": ["ahp-session:/a~a-1", "ahp-session:/b~b-1", "ahp-chat:/b~b-1-main"]}),
        )
        .await;
    assert_eq!(r["result"]["type"], "snapshot", "{r}");
    assert_eq!(
        snapshot_resources(&r["result"]),
        ["ahp-session:/a~a-1"],
        "b's channels are gone"
    );
    let hidden = again
        .request(2, "subscribe", json!({"channel": "ahp-session:/b~b-1"}))
        .await;
    assert_eq!(hidden["error"]["code"], -32001, "{hidden}");
}

/// §2 / #5: links tell the host who the end user is in the documented
/// handshake headers (issuer and subject), never the user's JWT; the watch
/// link carries no user.
#[tokio::test]
async fn links_name_the_end_user_to_the_host_and_never_carry_the_jwt() {
    let t = TestRelay::start(vec![fast_config("a", 1)], "").await;
    let token = t.token("bob");
    let mut ws = t.raw("bob").await;
    ws.initialize("audit-me").await;
    let r = ws
        .request(1, "subscribe", json!({"channel": "ahp-session:/a~a-1"}))
        .await;
    assert!(r.get("result").is_some(), "{r}");
    let hs = t.hosts[0].handshakes();
    let users: Vec<(Option<&str>, Option<&str>)> = hs
        .iter()
        .map(|h| (h.user_issuer.as_deref(), h.user_subject.as_deref()))
        .collect();
    assert!(
        users.contains(&(None, None)),
        "the watch link names no user: {users:?}"
    );
    assert!(
        users.contains(&(Some(ahp_relay::devkit::DEV_ISSUER), Some("bob"))),
        "bob's link names bob: {users:?}"
    );
    for h in &hs {
        assert!(
            h.authorization
                .as_deref()
                .is_none_or(|a| !a.contains(&token)),
            "the user's JWT reached the host: {h:?}"
        );
    }
    for f in t.hosts[0].received() {
        assert!(!f.text.contains(&token), "JWT in a host frame");
    }
}

/// A sink for the audit lines of this test binary.
#[derive(Clone, Default)]
struct AuditSink(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for AuditSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// §7.5: writes are audited with their decision — allowed, denied (a
/// viewer's dispatch) and invisible (a dispatch to another tenant's or a
/// nonexistent chat) — on the `ahp_relay::audit` target, and no line carries
/// message text or the token.
#[tokio::test]
async fn writes_are_audited_with_their_decision_and_no_content() {
    use tracing_subscriber::layer::SubscriberExt;
    let sink = AuditSink::default();
    let writer = sink.clone();
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_filter(
            tracing_subscriber::filter::Targets::new()
                .with_target(ahp_relay::policy::audit::TARGET, tracing::Level::INFO),
        );
    use tracing_subscriber::Layer as _;
    let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer));
    let rules = rule(
        "auditee-operates-a",
        &["auditee"],
        &["a"],
        "operator",
        "all",
        "",
    ) + &rule("auditee-views-b", &["auditee"], &["b"], "viewer", "all", "");
    let t = TestRelay::start(vec![fast_config("a", 1), fast_config("b", 1)], &rules).await;
    let token = t.token("auditee");
    let mut ws = t.raw("auditee").await;
    ws.initialize("au").await;
    let secret = "top secret prompt text";
    let turn =
        |chat: &str, seq: i64| dispatch_frame(chat, seq, turn_started(&format!("t{seq}"), secret));
    ws.send_json(&turn("ahp-chat:/a~a-1-main", 1)).await;
    ws.send_json(&turn("ahp-chat:/b~b-1-main", 2)).await;
    ws.send_json(&turn("ahp-chat:/a~nothing-here", 3)).await;
    let pong = ws
        .request(9, "ping", json!({"channel": "ahp-root://"}))
        .await;
    assert_eq!(pong["result"], Value::Null);
    let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
    let mine: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("\"subject\":\"auditee\""))
        .collect();
    let has = |channel: &str, decision: &str| {
        mine.iter().any(|l| {
            l.contains(&format!("\"channel\":\"{channel}\""))
                && l.contains("\"operation\":\"chat/turnStarted\"")
                && l.contains(&format!("\"decision\":\"{decision}\""))
        })
    };
    assert!(has("ahp-chat:/a~a-1-main", "allow"), "{mine:#?}");
    assert!(has("ahp-chat:/b~b-1-main", "deny"), "{mine:#?}");
    assert!(has("ahp-chat:/a~nothing-here", "invisible"), "{mine:#?}");
    assert!(
        mine.iter()
            .any(|l| l.contains("\"rule\":\"auditee-operates-a\"")),
        "the granting rule is named: {mine:#?}"
    );
    assert!(!text.contains(secret), "message text in the audit");
    assert!(!text.contains(&token), "token in the audit");
}

/// Every permission on every host; sessions created outside the relay (all
/// the seeded ones) hidden.
#[derive(Debug)]
struct HideExternal;

impl Policy for HideExternal {
    fn grant(&self, _who: Subject<'_>, _host: HostRef<'_>) -> Option<Grant> {
        Some(Grant {
            permissions: PermSet::of(&Permission::ALL),
            visibility: Visibility::All,
            external: false,
            dispose_others: false,
            session_files: false,
            rule: "test".into(),
        })
    }
}

/// Whether the host was told by `upstream` to stop sending `host_channel`.
fn unsubscribed(t: &TestRelay, upstream: &str, host_channel: &str) -> bool {
    t.hosts[0]
        .received_from(upstream)
        .iter()
        .any(|f| f.method.as_deref() == Some("unsubscribe") && f.text.contains(host_channel))
}

/// §7.6: a subscribe the host answers after a policy swap hid its channel
/// gets the error a subscribe of a channel never seen gets, not the
/// snapshot, and the host is told the session does not follow the channel.
/// Before, the late answer delivered the snapshot and made the channel live:
/// its envelopes went on reaching a client that could no longer see it.
#[tokio::test]
async fn a_subscribe_answered_after_a_policy_swap_hid_its_channel_is_refused() {
    let t = TestRelay::start(vec![fast_config("a", 1)], "").await;
    let chat = "ahp-chat:/a~a-1-main";
    let mut ws = t.raw("alice").await;
    ws.initialize("late").await;
    ws.request(1, "fetchTurns", json!({"channel": chat})).await;
    let upstream = t.upstream_id("alice", "late");
    t.hosts[0].stall_client(&upstream, true);
    let before = t.requests_handled("subscribe");
    ws.send_json(&request_frame(2, "subscribe", json!({"channel": chat})))
        .await;
    wait_until("the subscribe is read", || {
        t.requests_handled("subscribe") == before + 1
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    t.relay.relay.set_policy(Arc::new(HideExternal));
    t.hosts[0].stall_client(&upstream, false);
    let late = ws.response(&json!(2)).await;
    let fresh = ws.request(3, "subscribe", json!({"channel": chat})).await;
    assert!(
        late.get("result").is_none(),
        "no snapshot of a hidden channel: {late}"
    );
    assert_eq!(
        late["error"], fresh["error"],
        "the error of a channel never seen: {late} / {fresh}"
    );
    wait_until("the host is told the channel is not followed", || {
        unsubscribed(&t, &upstream, "a-1-main")
    })
    .await;
}

/// §7.6: an `initialize` whose initial subscription the host answers after
/// a policy swap hid the channel leaves the channel out, as one never
/// visible (no snapshot, no note), and the host is told to unsubscribe it.
/// Before, the answer carried the hidden channel's snapshot and followed it.
#[tokio::test]
async fn an_initial_subscription_hidden_while_awaited_is_left_out() {
    let t = TestRelay::start(vec![fast_config("a", 1)], "").await;
    let chat = "ahp-chat:/a~a-1-main";
    let upstream = t.upstream_id("alice", "init-late");
    t.hosts[0].stall_client(&upstream, true);
    let mut ws = t.raw("alice").await;
    let params = initialize_subscribing("init-late", &[chat]);
    ws.send_json(&request_frame(0, "initialize", params)).await;
    wait_until("the session awaits its snapshots", || {
        t.has_session("alice", "init-late")
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    t.relay.relay.set_policy(Arc::new(HideExternal));
    t.hosts[0].stall_client(&upstream, false);
    let init = ws.response(&json!(0)).await;
    let shown = init["result"].to_string();
    assert!(init.get("error").is_none(), "{init}");
    assert!(
        !shown.contains("a-1-main"),
        "nothing of the hidden channel: {init}"
    );
    wait_until("the host is told the channel is not followed", || {
        unsubscribed(&t, &upstream, "a-1-main")
    })
    .await;
}

/// §7.6: a `reconnect` answered with snapshots leaves out a channel that a
/// policy swap hid while the hosts re-baselined: the answer carries nothing
/// of it. Before, the snapshot taken for the old policy was written.
#[tokio::test]
async fn a_channel_hidden_while_a_reconnect_rebaselines_is_left_out() {
    let t = TestRelay::start(vec![fast_config("a", 1)], "").await;
    let chat = "ahp-chat:/a~a-1-main";
    let mut ws = t.raw("alice").await;
    ws.initialize("rebased").await;
    ws.request(1, "fetchTurns", json!({"channel": chat})).await;
    ws.close_cleanly().await;
    let upstream = t.upstream_id("alice", "rebased");
    t.hosts[0].stall_client(&upstream, true);
    let mut back = t.raw("alice").await;
    let before = t.requests_handled("reconnect");
    let params = json!({"clientId": "rebased", "lastSeenServerSeq": 0, "subscriptions": [chat]});
    back.send_json(&request_frame(1, "reconnect", params)).await;
    wait_until("the reconnect is read", || {
        t.requests_handled("reconnect") == before + 1
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    t.relay.relay.set_policy(Arc::new(HideExternal));
    t.hosts[0].stall_client(&upstream, false);
    let r = back.response(&json!(1)).await;
    assert_eq!(r["result"]["type"], "snapshot", "{r}");
    assert!(
        !r["result"].to_string().contains("a-1-main"),
        "nothing of the hidden channel: {r}"
    );
    wait_until("the host is told the channel is not followed", || {
        unsubscribed(&t, &upstream, "a-1-main")
    })
    .await;
}

/// Whether host a lists `upstream` among `host_session`'s active clients.
fn active_at_host(t: &TestRelay, host_session: &str, upstream: &str) -> bool {
    let state = t.hosts[0].channel_state(host_session).expect("the session");
    let clients = state["activeClients"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    clients.iter().any(|c| c["clientId"] == upstream)
}

/// §7.6 (active clients): alice registered her client in a session's
/// `activeClients` (its tools offered to the session's agent, her client
/// answering the host's file requests) without subscribing to it; a policy
/// swap hides the session: the host is told she no longer follows it, so it
/// removes her client, and the agent of a session she can no longer see
/// cannot call her tools or read her files. Before, the registration
/// outlived her view of the session (her link stayed open for it).
#[tokio::test]
async fn a_policy_swap_that_hides_a_session_ends_the_clients_registration_there() {
    let t = TestRelay::start(vec![fast_config("a", 1)], "").await;
    let (session, host_session) = ("ahp-session:/a~a-1", "ahp-session:/a-1");
    let mut ws = t.raw("alice").await;
    ws.initialize("registered").await;
    let set = json!({"type": "session/activeClientSet",
        "activeClient": {"clientId": "registered", "tools": [{"name": "read_tab"}]}});
    ws.dispatch(session, 1, set).await;
    let upstream = t.upstream_id("alice", "registered");
    wait_until("the host lists alice's client", || {
        active_at_host(&t, host_session, &upstream)
    })
    .await;
    t.relay.relay.set_policy(Arc::new(HideExternal));
    wait_until("the host no longer lists alice's client", || {
        !active_at_host(&t, host_session, &upstream)
    })
    .await;
    assert!(
        unsubscribed(&t, &upstream, host_session),
        "ended by unsubscribing the session channel"
    );
}

/// Every permission, every session; no rule at all on host `.0`.
#[derive(Debug)]
struct NoRuleOn(&'static str);

impl Policy for NoRuleOn {
    fn grant(&self, _who: Subject<'_>, host: HostRef<'_>) -> Option<Grant> {
        (host.id != self.0).then(|| Grant {
            permissions: PermSet::of(&Permission::ALL),
            visibility: Visibility::All,
            external: true,
            dispose_others: false,
            session_files: false,
            rule: "reloaded".into(),
        })
    }
}

/// §3.5, §7.6: root actions buffered for a detached client under the old
/// rights — host b's agents leaving and coming back as b restarts — are not
/// replayed after a reload takes host b from the principal: its `reconnect`
/// gets a root snapshot built under the new rights, with nothing of b.
/// Before, root kept its baseline and the replay carried b's agents.
#[tokio::test]
async fn root_actions_buffered_before_a_reload_are_not_replayed_after_it() {
    let t = TestRelay::start(vec![fast_config("a", 1), fast_config("b", 1)], "").await;
    t.wait_hosts_up().await;
    let mut ws = t.raw("alice").await;
    let params = initialize_subscribing("root-late", &[ROOT]);
    let init = ws.request(0, "initialize", params).await;
    assert!(init["result"].to_string().contains("sim.b"), "{init}");
    let from = init["result"]["serverSeq"].clone();
    ws.close_cleanly().await;
    let buffered = || t.relay.relay.metrics.buffer_bytes.get();
    let before = buffered();
    t.hosts[1].restart(true);
    wait_until("root actions about b are buffered", || buffered() > before).await;
    t.wait_hosts_up().await;
    t.relay.relay.set_policy(Arc::new(NoRuleOn("b")));
    let mut back = t.raw("alice").await;
    let params = json!({"channel": ROOT, "clientId": "root-late",
        "lastSeenServerSeq": from, "subscriptions": [ROOT]});
    let r = back.request(1, "reconnect", params).await;
    assert_eq!(r["result"]["type"], "snapshot", "{r}");
    assert!(
        !r["result"].to_string().contains("sim.b"),
        "nothing of b: {r}"
    );
}

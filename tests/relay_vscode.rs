//! VS Code's URI shapes through the relay (contract §4.2, §4.3): two hosts
//! whose session ids collide stay distinct; the official client derives a
//! session's default chat `ahp-chat://default/<b64(session)>` from the
//! qualified session URI the relay lists, subscribes, runs a turn and
//! converges with the host — in VS Code mode and in plain mode; host-local
//! `file:` URIs carry the host in the authority, and a `file:` URI naming no
//! host or an unknown one never reaches a host.

mod common;

use std::collections::BTreeSet;

use ahp_relay::simhost::clock::now_iso;
use ahp_relay::simhost::config::SimHostConfig;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use common::relay::TestRelay;
use common::*;
use serde_json::{Value, json};

const ROOT: &str = "ahp-root://";

/// Two hosts `a` and `b` whose session (and so chat) URIs collide: the same
/// `id_seed` in VS Code mode, the same session prefix in plain mode.
fn twin_hosts(vscode: bool) -> Vec<SimHostConfig> {
    ["a", "b"]
        .into_iter()
        .map(|name| {
            let mut cfg = fast_config(name, 2);
            cfg.vscode_compat = vscode;
            cfg.id_seed = Some(42);
            cfg.session_prefix = "twin".into();
            cfg
        })
        .collect()
}

/// What a VS Code client computes: `ahp-chat://<chatId>/<b64url-no-pad(session)>`.
fn derived_chat(session: &str) -> String {
    format!(
        "ahp-chat://default/{}",
        URL_SAFE_NO_PAD.encode(session.as_bytes())
    )
}

async fn list(client: &ahp::Client) -> Vec<Value> {
    let r: Value = client
        .request("listSessions", json!({"channel": ROOT}))
        .await
        .expect("listSessions");
    r["items"].as_array().expect("items").clone()
}

/// Splits a qualified URI into (host, host form): a provider-scheme session
/// `<provider>.<host>:/<id>` or a path-form `<scheme>:/<host>~<id>`.
fn unqualify(uri: &str) -> (String, String) {
    let (scheme, rest) = uri.split_once(":/").expect("path form");
    if let Some((provider, host)) = ahp_relay::names::qualify::read_provider(scheme) {
        return (host, format!("{provider}:/{rest}"));
    }
    let (host, id) = rest.split_once('~').expect("qualified");
    (host.to_string(), format!("{scheme}:/{id}"))
}

/// Lists through the relay, checks the URIs are distinct and qualified
/// while the hosts' own URIs collide, and returns host `b`'s first session
/// (client form, host form).
async fn distinct_sessions(t: &TestRelay, client: &ahp::Client, vscode: bool) -> (String, String) {
    let items = list(client).await;
    assert_eq!(items.len(), 4, "{items:?}");
    let uris: BTreeSet<&str> = items
        .iter()
        .filter_map(|s| s["resource"].as_str())
        .collect();
    assert_eq!(uris.len(), 4, "listed URIs are distinct: {uris:?}");
    let a: BTreeSet<String> = t.hosts[0].session_uris().into_iter().collect();
    let b: BTreeSet<String> = t.hosts[1].session_uris().into_iter().collect();
    assert_eq!(a, b, "the hosts' own session URIs collide");
    for s in &items {
        let uri = s["resource"].as_str().expect("resource");
        let (host, host_uri) = unqualify(uri);
        assert!(a.contains(&host_uri), "{uri} names a host session");
        assert!(host == "a" || host == "b", "{uri}");
        if vscode {
            let scheme = format!("sim.{host}:/");
            assert!(uri.starts_with(&scheme), "provider-scheme session: {uri}");
            assert_eq!(s["defaultChat"], derived_chat(uri), "{s}");
        }
    }
    let session = items
        .iter()
        .filter_map(|s| s["resource"].as_str())
        .find(|u| unqualify(u).0 == "b")
        .expect("a session of host b")
        .to_string();
    let host_session = unqualify(&session).1;
    (session, host_session)
}

/// The chat the client uses for `session`: derived (VS Code) or listed.
async fn chat_of(client: &ahp::Client, session: &str, vscode: bool) -> String {
    if vscode {
        return derived_chat(session);
    }
    list(client)
        .await
        .into_iter()
        .find(|s| s["resource"] == session)
        .and_then(|s| s["defaultChat"].as_str().map(str::to_string))
        .expect("listed default chat")
}

/// Runs one turn on `chat` through the official client and returns the
/// envelopes of that chat up to its `chat/turnComplete`, after checking the
/// turn's own echo was accepted.
async fn run_turn(
    client: &ahp::Client,
    events: &mut ahp::ClientEventStream,
    chat: &str,
    turn_id: &str,
) -> Vec<ahp_types::actions::ActionEnvelope> {
    let turn = json!({"type": "chat/turnStarted", "turnId": turn_id, "startedAt": now_iso(),
        "message": {"text": "hello", "origin": {"kind": "user"}}});
    let action = serde_json::from_value(turn).expect("a StateAction");
    client
        .dispatch(chat.to_string(), action)
        .await
        .expect("dispatch");
    let live = actions_until(events, |e| {
        e.channel == chat && action_type(e) == "chat/turnComplete"
    })
    .await;
    let started = live
        .iter()
        .find(|e| action_type(e) == "chat/turnStarted")
        .expect("the turn's echo");
    assert_eq!(started.rejection_reason, None, "the turn was accepted");
    live
}

async fn converge_through_relay(vscode: bool) {
    let t = TestRelay::start(twin_hosts(vscode), "").await;
    let client = t.client_init("alice", "vs-client").await;
    let (session, host_session) = distinct_sessions(&t, &client, vscode).await;
    let chat = chat_of(&client, &session, vscode).await;

    let mut events = client.events();
    let session_snap = subscribe_raw(&client, &session).await;
    assert_eq!(session_snap["resource"], session);
    assert_eq!(
        session_snap["state"]["defaultChat"], chat,
        "the session's state names its chat in client form"
    );
    let snap = subscribe_raw(&client, &chat).await;
    assert_eq!(snap["resource"], chat, "{snap}");
    assert_eq!(snap["state"]["resource"], chat, "{snap}");

    let live = run_turn(&client, &mut events, &chat, "vs-t1").await;
    assert_strictly_increasing(&live);

    let mut reduced = reduce_chat(&snap["state"], &chat, &live);
    let host_chat = if vscode {
        derived_chat(&host_session)
    } else {
        unqualify(&chat).1
    };
    let host_state = t.hosts[1].channel_state(&host_chat).expect("host b's chat");
    assert_eq!(reduced["resource"], chat);
    reduced["resource"] = json!(host_chat);
    assert_eq!(
        reduced, host_state,
        "the client's chat converges with host b's"
    );
    let twin = t.hosts[0]
        .channel_state(&host_chat)
        .expect("host a's twin chat");
    assert!(
        !twin.to_string().contains("vs-t1"),
        "the turn ran on host b only"
    );
}

/// VS Code-mode twins: distinct listed URIs, a derived default chat runs a
/// turn through the relay and converges.
#[tokio::test]
async fn vscode_hosts_with_colliding_ids_stay_distinct_and_converge() {
    converge_through_relay(true).await;
}

/// The same flow with plain-mode (spec-shaped) twins.
#[tokio::test]
async fn plain_hosts_with_colliding_ids_stay_distinct_and_converge() {
    converge_through_relay(false).await;
}

/// `file:` URIs carry the host in the authority both ways; a bare
/// `file:///p` in a request routed to host H is H's; another host's or an
/// unknown authority, and a bare `file:` URI in a request that names no
/// host, are refused and never reach a host.
#[tokio::test]
async fn file_uris_name_their_host() {
    let t = TestRelay::start(twin_hosts(true), "").await;
    let mut ws = t.raw("alice").await;
    ws.initialize("files").await;
    let create = |channel: &str, dirs: Value| json!({"channel": channel, "provider": "sim.a", "workingDirectories": dirs});
    let params = create(
        "ahp-session:/mine-1",
        json!(["file://a/work/one", "file:///work/two"]),
    );
    let r = ws.request(1, "createSession", params).await;
    assert!(r.get("error").is_none(), "{r}");
    let host_state = t.hosts[0]
        .channel_state("ahp-session:/mine-1")
        .expect("created on host a");
    assert_eq!(
        host_state["workingDirectories"],
        json!(["file:///work/one", "file:///work/two"]),
        "host a got its own file: URIs"
    );
    let items = ws
        .request(2, "listSessions", json!({"channel": ROOT}))
        .await;
    let mine = items["result"]["items"]
        .as_array()
        .and_then(|i| i.iter().find(|s| s["resource"] == "ahp-session:/mine-1"))
        .cloned()
        .unwrap_or_else(|| panic!("listed: {items}"));
    assert_eq!(
        mine["workingDirectories"],
        json!(["file://a/work/one", "file://a/work/two"]),
        "clients see host a's files qualified"
    );
    let seeded = items["result"]["items"]
        .as_array()
        .and_then(|i| {
            i.iter().find(|s| {
                s["resource"]
                    .as_str()
                    .is_some_and(|u| u.starts_with("sim.b:/"))
            })
        })
        .cloned()
        .expect("a seeded session of host b");
    let dirs = seeded["workingDirectories"]
        .as_array()
        .expect("seeded working directories");
    assert!(
        dirs.iter()
            .all(|d| d.as_str().is_some_and(|d| d.starts_with("file://b/"))),
        "{seeded}"
    );

    t.hosts[0].clear_record();
    t.hosts[1].clear_record();
    for (id, dirs) in [
        (3, json!(["file://b/etc/passwd"])),
        (4, json!(["file://nohost/etc/passwd"])),
        (5, json!(["file://Bad_Host/etc/passwd"])),
    ] {
        let p = create(&format!("ahp-session:/mine-{id}"), dirs);
        let r = ws.request(id, "createSession", p).await;
        assert_eq!(r["error"]["code"], -32602, "{r}");
    }
    let on_b = seeded["resource"].as_str().expect("uri");
    let r = ws
        .request(
            6,
            "createChat",
            json!({"channel": on_b, "chat": "ahp-chat:/side-6",
                   "workingDirectories": ["file://a/etc/passwd"]}),
        )
        .await;
    assert_eq!(r["error"]["code"], -32602, "another host's file: {r}");
    // Requests that name no host: the file is nobody's.
    for (id, uri) in [(7, "file:///etc/passwd"), (8, "file://nohost/etc/passwd")] {
        let r = ws
            .request(id, "resourceRead", json!({"channel": ROOT, "uri": uri}))
            .await;
        assert!(r["error"]["code"].is_i64(), "{uri} refused: {r}");
        assert!(r.get("result").is_none(), "{uri}: no content: {r}");
    }
    for h in &t.hosts {
        let leaked: Vec<_> = h
            .received()
            .into_iter()
            .filter(|f| f.text.contains("passwd"))
            .map(|f| f.text.to_string())
            .collect();
        assert!(leaked.is_empty(), "reached a host: {leaked:?}");
    }
}

/// A chat a VS Code client names itself, `ahp-chat://<id>/<b64(session)>`
/// of a listed (qualified) session, is created on that session's host in
/// the host's form and subscribed through the relay; one naming another
/// session than the request's is refused.
#[tokio::test]
async fn vscode_client_creates_a_derived_chat() {
    let t = TestRelay::start(twin_hosts(true), "").await;
    let client = t.client_init("alice", "vs-chats").await;
    let (session, host_session) = distinct_sessions(&t, &client, true).await;
    let b64 = |s: &str| URL_SAFE_NO_PAD.encode(s.as_bytes());
    let chat = format!("ahp-chat://side-1/{}", b64(&session));
    let r: Result<Value, _> = client
        .request("createChat", json!({"channel": session, "chat": chat}))
        .await;
    assert!(r.is_ok(), "createChat: {r:?}");
    let host_chat = format!("ahp-chat://side-1/{}", b64(&host_session));
    assert!(
        t.hosts[1].channel_state(&host_chat).is_some(),
        "created on host b in its own form"
    );
    assert!(t.hosts[0].channel_state(&host_chat).is_none(), "not on a");
    let snap = subscribe_raw(&client, &chat).await;
    assert_eq!(snap["state"]["resource"], chat, "{snap}");

    // An unknown provider-scheme session answers like any unknown session.
    let r: Result<Value, _> = client
        .request("subscribe", json!({"channel": "sim:/a~no-such-session"}))
        .await;
    match r {
        Err(ahp::ClientError::Rpc(e)) => assert_eq!(e.code, -32001, "{e:?}"),
        other => panic!("subscribed to nothing: {other:?}"),
    }

    let other = list(&client)
        .await
        .into_iter()
        .filter_map(|s| s["resource"].as_str().map(str::to_string))
        .find(|u| *u != session)
        .expect("another session");
    let wrong = format!("ahp-chat://side-2/{}", b64(&other));
    let r: Result<Value, _> = client
        .request("createChat", json!({"channel": session, "chat": wrong}))
        .await;
    match r {
        Err(ahp::ClientError::Rpc(e)) => assert_eq!(e.code, -32602, "{e:?}"),
        other => panic!("a chat of another session was accepted: {other:?}"),
    }
}

/// VS Code's client names a new session itself from the provider it was
/// shown, `AgentSession.uri("sim.b", uuid)` = `sim.b:/<uuid>`, and computes
/// its default chat: through the relay the URI is reserved for its creator,
/// created on the provider's host as `sim:/<uuid>` — the shape VS Code's own
/// host gives it — (not on the twin), listed exactly as the client named it,
/// taken by no one else (not even spelled for the twin host), and its
/// default chat subscribes and runs a turn — against two hosts whose own ids
/// collide, in VS Code mode and in plain mode.
async fn client_named_provider_session(vscode: bool) {
    let t = TestRelay::start(twin_hosts(vscode), "").await;
    let client = t.client_init("alice", "vs-create").await;
    let uuid = "3f2a9c4e-0d1b-4c6e-9a7f-5b8d2e1c0a93";
    let (session, host_session) = (format!("sim.b:/{uuid}"), format!("sim:/{uuid}"));
    let session = session.as_str();
    let created: Result<Value, _> = client
        .request(
            "createSession",
            json!({"channel": session, "provider": "sim.b"}),
        )
        .await;
    assert!(created.is_ok(), "createSession: {created:?}");
    assert!(
        t.hosts[1].channel_state(&host_session).is_some(),
        "host b has the session in its provider-scheme form"
    );
    assert!(
        t.hosts[0].channel_state(&host_session).is_none(),
        "not host a"
    );
    let r: Result<Value, _> = client
        .request(
            "createSession",
            json!({"channel": format!("sim.a:/{uuid}x"), "provider": "sim.b"}),
        )
        .await;
    match r {
        Err(ahp::ClientError::Rpc(e)) => assert_eq!(e.code, -32602, "{e:?}"),
        other => panic!("a session named for host a was made on b: {other:?}"),
    }
    let listed: Vec<String> = list(&client)
        .await
        .iter()
        .filter_map(|s| s["resource"].as_str().map(str::to_string))
        .collect();
    assert!(
        listed.iter().any(|u| u == session),
        "listed verbatim: {listed:?}"
    );

    let session_snap = subscribe_raw(&client, session).await;
    let chat = session_snap["state"]["defaultChat"]
        .as_str()
        .expect("a default chat")
        .to_string();
    if vscode {
        assert_eq!(chat, derived_chat(session), "what the client computes");
    }
    let mut events = client.events();
    let snap = subscribe_raw(&client, &chat).await;
    assert_eq!(snap["state"]["resource"], chat, "{snap}");
    run_turn(&client, &mut events, &chat, "own-t1").await;

    let bob = t.client_init("bob", "vs-create-bob").await;
    let r: Result<Value, _> = bob
        .request(
            "createSession",
            json!({"channel": format!("sim.a:/{uuid}"), "provider": "sim.a"}),
        )
        .await;
    match r {
        Err(ahp::ClientError::Rpc(e)) => assert_eq!(e.code, -32003, "{e:?}"),
        other => panic!("the name was taken twice: {other:?}"),
    }
    assert!(
        t.hosts[0].channel_state(&host_session).is_none(),
        "never on a"
    );
}

#[tokio::test]
async fn vscode_client_names_its_own_session() {
    client_named_provider_session(true).await;
}

#[tokio::test]
async fn plain_host_takes_a_client_named_provider_session() {
    client_named_provider_session(false).await;
}

// ─── protocol versions and requests without `channel` (issue 26) ───────────

/// `initialize` over a raw socket as `sub` offering `versions`, without
/// `channel` (as VS Code's own host tests send it); the answer.
async fn offer(t: &TestRelay, versions: &[&str], client_id: &str) -> (RawWs, Value) {
    let mut ws = t.raw("alice").await;
    let r = ws
        .request(
            1,
            "initialize",
            json!({"protocolVersions": versions, "clientId": client_id}),
        )
        .await;
    (ws, r)
}

/// §4.1: the relay negotiates like a host over exactly the versions its
/// rewrite table covers, from the highest offer whatever the order: VS
/// Code's offers of three generations get 1.0.0 (main), 0.10.0 (1.141, the
/// alias VS Code gives the 0.9/1.0 wire contract) and 0.9.0 (the 0.9 era);
/// an offer of 0.8.0 or 1.1.0 alone gets -32005 naming the supported ranges.
#[tokio::test]
async fn vscode_version_offers_negotiate() {
    let t = TestRelay::start(vec![fast_config("a", 1)], "").await;
    let offers: [(&[&str], &str); 4] = [
        (&["1.0.0", "0.10.0", "0.9.0"], "1.0.0"),
        (
            &["0.10.0", "0.9.0", "0.7.0", "0.6.0", "0.5.2", "0.5.1"],
            "0.10.0",
        ),
        (&["0.9.0", "0.7.0", "0.6.0", "0.5.2", "0.5.1"], "0.9.0"),
        (&["0.9.0", "1.0.2", "0.10.0"], "1.0.2"),
    ];
    for (i, (versions, want)) in offers.into_iter().enumerate() {
        let (_ws, r) = offer(&t, versions, &format!("v{i}")).await;
        assert_eq!(r["result"]["protocolVersion"], want, "{versions:?}: {r}");
    }
    for versions in [&["0.8.0"][..], &["1.1.0"], &["0.10.1"]] {
        let (_ws, r) = offer(&t, versions, "refused").await;
        assert_eq!(r["error"]["code"], -32005, "{versions:?}: {r}");
        let supported = r["error"]["data"]["supportedVersions"].to_string();
        assert!(
            supported.contains("0.10.0") && supported.contains("^0.9.0"),
            "{r}"
        );
    }
}

/// A host of each VS Code generation behind one relay: one speaks only
/// `^0.9.0`, one only `^0.10.0` (VS Code 1.141's host), one `^1.0.0`. The
/// relay offers each link the client's version first and then the rest of
/// the family, so a 1.0 client and a 0.9 client both see all three hosts'
/// agents and run a turn on each host's default chat.
#[tokio::test]
async fn hosts_of_every_vscode_generation_serve_every_client() {
    use ahp_relay::simhost::HostProtocol;
    let hosts: Vec<SimHostConfig> = [
        ("old", HostProtocol::V0_9),
        ("mid", HostProtocol::V0_10),
        ("new", HostProtocol::V1),
    ]
    .into_iter()
    .map(|(name, protocol)| SimHostConfig {
        protocol,
        vscode_compat: true,
        ..fast_config(name, 1)
    })
    .collect();
    let t = TestRelay::start(hosts, "").await;
    for (client_id, version) in [("gen-1.0", "1.0.0"), ("gen-0.9", "0.9.0")] {
        let client = t.client("alice").await;
        let init = client
            .initialize(client_id.into(), vec![version.into()], vec![])
            .await
            .expect("initialize");
        assert_eq!(init.protocol_version, version);
        let items = list(&client).await;
        let sessions: Vec<String> = items
            .iter()
            .filter_map(|s| s["resource"].as_str().map(str::to_string))
            .collect();
        assert_eq!(sessions.len(), 3, "{client_id}: {sessions:?}");
        let mut events = client.events();
        for (i, session) in sessions.iter().enumerate() {
            let chat = derived_chat(session);
            subscribe_raw(&client, &chat).await;
            run_turn(&client, &mut events, &chat, &format!("{client_id}-{i}")).await;
        }
    }
}

/// VS Code's client sends `reconnect` without `channel` (it is root-scoped,
/// §4.1): the relay answers it like any `reconnect` — here a `replay` — and a
/// request that routes by its channel still must name one (-32602).
#[tokio::test]
async fn reconnect_without_channel_is_answered() {
    let t = TestRelay::start(vec![fast_config("a", 1)], "").await;
    let (ws, r) = offer(&t, &["1.0.0"], "no-channel").await;
    let seq = r["result"]["serverSeq"].as_u64().expect("serverSeq");
    drop(ws);
    let mut ws = t.raw("alice").await;
    let r = ws
        .request(
            2,
            "reconnect",
            json!({"clientId": "no-channel", "lastSeenServerSeq": seq, "subscriptions": []}),
        )
        .await;
    assert_eq!(r["result"]["type"], "replay", "{r}");
    let r = ws.request(3, "subscribe", json!({})).await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
}

/// VS Code's terminal shapes through the relay: a terminal its shell tool
/// minted on the host, `agenthost-terminal://shell/1`, is listed in the root
/// as `agenthost-terminal://shell/a~1` (authority kept, host in the first
/// segment) and subscribes; a terminal the workbench creates itself,
/// `agenthost-terminal:/<uuid>` claimed by its own client, is reserved for
/// it, created on the host exactly as named and subscribes too.
#[tokio::test]
async fn vscode_terminals_keep_their_shapes() {
    let cfg = SimHostConfig {
        vscode_compat: true,
        terminals: 1,
        ..fast_config("a", 1)
    };
    let t = TestRelay::start(vec![cfg], "").await;
    let mut ws = t.raw("alice").await;
    ws.initialize("term").await;
    let r = ws.request(1, "subscribe", json!({"channel": ROOT})).await;
    let listed: Vec<&str> = r["result"]["snapshot"]["state"]["terminals"]
        .as_array()
        .map(|a| a.iter().filter_map(|t| t["resource"].as_str()).collect())
        .unwrap_or_default();
    let shell = "agenthost-terminal://shell/a~1";
    assert_eq!(listed, [shell], "{r}");
    let r = ws.request(2, "subscribe", json!({"channel": shell})).await;
    assert!(r["result"]["snapshot"]["state"].is_object(), "{r}");

    let own = "agenthost-terminal:/7d5e6f10-0000-4000-8000-00000000c0de";
    let claim = json!({"kind": "client", "clientId": "term"});
    let r = ws
        .request(3, "createTerminal", json!({"channel": own, "claim": claim}))
        .await;
    assert!(r.get("result").is_some(), "createTerminal: {r}");
    assert!(t.hosts[0].channel_state(own).is_some(), "created as named");
    let r = ws.request(4, "subscribe", json!({"channel": own})).await;
    assert!(r["result"]["snapshot"]["state"].is_object(), "{r}");
}

/// §4.3: a VS Code chat has one name. Its host percent-decodes the chat id
/// before looking the chat up, so another spelling of it (`%64efault` for
/// `default`) would reach the chat under a name the relay's catalog does
/// not know — decided by the session the URI embeds, not the one the chat
/// lives in (a moved chat). Such spellings are refused like any URI that
/// names nothing, and never reach a host; the chat's own name works.
#[tokio::test]
async fn a_vscode_chat_is_reached_under_its_own_spelling_only() {
    let t = TestRelay::start(twin_hosts(true), "").await;
    let client = t.client_init("alice", "vs-spelling").await;
    let (session, _) = distinct_sessions(&t, &client, true).await;
    let chat = derived_chat(&session);
    let b64 = URL_SAFE_NO_PAD.encode(session.as_bytes());
    for spelled in [
        format!("ahp-chat://%64efault/{b64}"),
        format!("ahp-chat://DEFAULT%2e/{b64}"),
        format!("ahp-chat://de%2Ffault/{b64}"),
    ] {
        let r: Result<Value, _> = client
            .request("subscribe", json!({"channel": spelled}))
            .await;
        assert!(r.is_err(), "{spelled} subscribed: {r:?}");
    }
    for host in &t.hosts {
        let reached = host.received().iter().any(|f| f.text.contains("%"));
        assert!(
            !reached,
            "another spelling reached host {}",
            host.config().name
        );
    }
    let snap = subscribe_raw(&client, &chat).await;
    assert_eq!(snap["state"]["resource"], chat, "{snap}");
}

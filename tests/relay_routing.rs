//! Routing through the relay over real TLS sockets: the merged root and
//! session list (S1), colliding host URIs (S11), client-chosen URIs (§4.2),
//! the error table (§4.4), request ids (§4.5), upstream identity (§2 B2),
//! session lifecycle (§5.6), bad input (§4.1, §3.7), and the round trip of
//! the rewrite table (§4.3).

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use ahp::{Client, ClientError};
use ahp_relay::devkit::DEV_ISSUER;
use ahp_relay::names::namer::{ToClient, ToHost};
use ahp_relay::names::store::{Owner, RedbStore, UriStore};
use ahp_relay::names::translate::{self, FieldKind, Row, TABLE};
use ahp_relay::simhost::SimHostConfig;
use ahp_types::actions::{ActionEnvelope, ActionOrigin};
use common::relay::TestRelay;
use common::*;
use serde_json::value::RawValue;
use serde_json::{Value, json};

// ─── helpers ────────────────────────────────────────────────────────────────

/// A JSON-RPC error as the client received it.
#[derive(Debug)]
struct RpcErr {
    code: i32,
    message: String,
    data: Option<Value>,
}

/// A request through the official client; a JSON-RPC error comes back as `Err`.
async fn call(c: &Client, method: &str, params: Value) -> Result<Value, RpcErr> {
    match c.request::<_, Value>(method, params).await {
        Ok(v) => Ok(v),
        Err(ClientError::Rpc(e)) => Err(RpcErr {
            code: e.code,
            message: e.message,
            data: e.data,
        }),
        Err(other) => panic!("{method}: transport trouble: {other:?}"),
    }
}

/// The error of a request that must fail.
async fn fails(c: &Client, method: &str, params: Value) -> RpcErr {
    match call(c, method, params.clone()).await {
        Ok(v) => panic!("{method} {params} succeeded with {v}, expected an error"),
        Err(e) => e,
    }
}

/// Dispatches a turn on `chat` and returns the envelopes up to its `chat/turnComplete`.
async fn run_turn(
    c: &Client,
    events: &mut ahp::ClientEventStream,
    chat: &str,
    turn_id: &str,
) -> Vec<ActionEnvelope> {
    c.dispatch(chat.into(), action(turn_started(turn_id, "hello")))
        .await
        .expect("dispatch");
    actions_until(events, |e| {
        e.channel == chat && action_type(e) == "chat/turnComplete"
    })
    .await
}

/// The resources of a `listSessions` result, in order.
fn item_uris(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .unwrap_or_else(|| panic!("no items: {list}"))
        .iter()
        .map(|s| s["resource"].as_str().expect("resource").to_string())
        .collect()
}

fn item<'a>(list: &'a Value, uri: &str) -> &'a Value {
    list["items"]
        .as_array()
        .and_then(|items| items.iter().find(|s| s["resource"] == uri))
        .unwrap_or_else(|| panic!("{uri} not listed: {list}"))
}

/// Whether any string (value or key) anywhere in `v` equals `s`.
fn mentions(v: &Value, s: &str) -> bool {
    match v {
        Value::String(x) => x == s,
        Value::Array(a) => a.iter().any(|x| mentions(x, s)),
        Value::Object(o) => o.iter().any(|(k, x)| k == s || mentions(x, s)),
        _ => false,
    }
}

/// The exact text of the `id` token of a frame.
fn raw_id(text: &str) -> String {
    #[derive(serde::Deserialize)]
    struct Id<'a> {
        #[serde(borrow)]
        id: &'a RawValue,
    }
    serde_json::from_str::<Id<'_>>(text)
        .unwrap_or_else(|e| panic!("frame without a readable id ({e}): {text}"))
        .id
        .get()
        .to_string()
}

/// Frames up to and including the first response (a frame without `method`).
async fn frames_until_response(ws: &mut RawWs) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    loop {
        let text = ws
            .recv_text()
            .await
            .expect("socket open until the response");
        let v: Value = serde_json::from_str(&text).expect("relay sends JSON");
        let done = v.get("method").is_none();
        out.push((text, v));
        if done {
            return out;
        }
    }
}

/// Sends a request whose id is the exact JSON text `raw_id`; returns the
/// response's exact text and its parsed form.
async fn raw_call(ws: &mut RawWs, raw_id: &str, method: &str, params: Value) -> (String, Value) {
    ws.send_text(&format!(
        r#"{{"jsonrpc":"2.0","id":{raw_id},"method":"{method}","params":{params}}}"#
    ))
    .await;
    frames_until_response(ws)
        .await
        .pop()
        .expect("a response frame")
}

/// (provider, displayName, first model's provider) of every agent, sorted.
fn agents(root_state: &Value) -> Vec<(String, String, String)> {
    let mut out: Vec<(String, String, String)> = root_state["agents"]
        .as_array()
        .unwrap_or_else(|| panic!("no agents: {root_state}"))
        .iter()
        .map(|a| {
            (
                a["provider"].as_str().unwrap_or_default().to_string(),
                a["displayName"].as_str().unwrap_or_default().to_string(),
                a["models"][0]["provider"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect();
    out.sort();
    out
}

fn owned(v: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
    v.iter()
        .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
        .collect()
}

// ─── S1 ─────────────────────────────────────────────────────────────────────

/// S1's relay: hosts a (provider `alpha`, two sessions) and b (provider
/// `beta`, three sessions, labelled "Box B").
async fn s1_relay() -> TestRelay {
    let a = SimHostConfig {
        provider: "alpha".into(),
        ..fast_config("a", 2)
    };
    let b = SimHostConfig {
        provider: "beta".into(),
        ..fast_config("b", 3)
    };
    // Appended after the generated `[[hosts]]` tables, so it labels host b.
    TestRelay::start(vec![a, b], "label = \"Box B\"\n").await
}

/// The five seeded sessions of S1's hosts, sorted.
const S1_SESSIONS: [&str; 5] = [
    "ahp-session:/a~a-1",
    "ahp-session:/a~a-2",
    "ahp-session:/b~b-1",
    "ahp-session:/b~b-2",
    "ahp-session:/b~b-3",
];

/// S1 (§6.1): the root snapshot, in an `InitializeResult` or from
/// `subscribe`, lists both hosts' agents as `<p>.<host>` with their names
/// suffixed by the host's label (or name).
#[tokio::test]
async fn s1_root_lists_both_hosts_agents_qualified_and_labelled() {
    let t = s1_relay().await;
    let expected_agents = owned(&[
        ("alpha.a", "Sim agent (a)", "alpha.a"),
        ("beta.b", "Sim agent (b) (Box B)", "beta.b"),
    ]);
    let c1 = t.client("alice").await;
    let init = call(&c1, "initialize", initialize_subscribing("s1-one", &[ROOT]))
        .await
        .expect("initialize with the root");
    assert_eq!(init["snapshots"][0]["resource"], ROOT, "{init}");
    assert_eq!(agents(&init["snapshots"][0]["state"]), expected_agents);
    let c2 = t.client_init("alice", "s1-two").await;
    let snap = subscribe_raw(&c2, ROOT).await;
    assert_eq!(agents(&snap["state"]), expected_agents);
}

/// S1 (§6.2): `listSessions` merges both hosts' sessions newest first (ties
/// by URI), interleaving rather than concatenating, in one page without a
/// cursor, each with its host's qualified provider.
#[tokio::test]
async fn s1_list_sessions_merges_both_hosts_newest_first() {
    let t = s1_relay().await;
    let c1 = t.client_init("alice", "s1-one").await;
    let all = call(&c1, "listSessions", json!({"channel": ROOT}))
        .await
        .expect("listSessions");
    let uris = item_uris(&all);
    let mut sorted = uris.clone();
    sorted.sort();
    assert_eq!(sorted, S1_SESSIONS);
    assert!(all.get("nextCursor").is_none(), "{all}");
    let keys: Vec<(i64, String)> = all["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|s| {
            let at: jiff::Timestamp = s["modifiedAt"]
                .as_str()
                .and_then(|t| t.parse().ok())
                .unwrap_or_else(|| panic!("modifiedAt unreadable: {s}"));
            (at.as_microsecond(), s["resource"].as_str().unwrap().into())
        })
        .collect();
    for w in keys.windows(2) {
        assert!(
            w[0].0 > w[1].0 || (w[0].0 == w[1].0 && w[0].1 < w[1].1),
            "not newest first: {keys:?}"
        );
    }
    // Seeded sessions are 60 s apart per host, so the newest two come from
    // different hosts: the merge interleaves rather than concatenating.
    assert_ne!(uris[0][..15], uris[1][..15], "{uris:?}");
    for s in all["items"].as_array().expect("items") {
        let host = if s["resource"].as_str().unwrap().contains("/a~") {
            "alpha.a"
        } else {
            "beta.b"
        };
        assert_eq!(s["provider"], host, "{s}");
    }
}

/// Walks `listSessions` with `limit: 1` on `c` (at most 10 pages): every
/// page has one item; returns the URIs in order and the first cursor.
async fn walk_pages(c: &Client) -> (Vec<String>, Option<String>) {
    let mut walked = Vec::new();
    let mut cursor: Option<String> = None;
    let mut first_cursor = None;
    for _ in 0..10 {
        let mut p = json!({"channel": ROOT, "limit": 1});
        if let Some(c) = &cursor {
            p["cursor"] = json!(c);
        }
        let page = call(c, "listSessions", p).await.expect("page");
        assert_eq!(item_uris(&page).len(), 1, "{page}");
        walked.extend(item_uris(&page));
        cursor = page
            .get("nextCursor")
            .and_then(Value::as_str)
            .map(str::to_string);
        if first_cursor.is_none() {
            first_cursor.clone_from(&cursor);
        }
        if cursor.is_none() {
            break;
        }
    }
    (walked, first_cursor)
}

/// S1 (§6.2): paging with `limit: 1` walks the merged order over every
/// session exactly once.
#[tokio::test]
async fn s1_list_sessions_pages_over_every_session_once() {
    let t = s1_relay().await;
    let c1 = t.client_init("alice", "s1-one").await;
    let all = call(&c1, "listSessions", json!({"channel": ROOT}))
        .await
        .expect("listSessions");
    let (walked, _) = walk_pages(&c1).await;
    assert_eq!(
        walked,
        item_uris(&all),
        "paging with limit 1 walks the merged order"
    );
}

/// S1 (§6.2): a `listSessions` cursor works again on its own socket, and is
/// -32602 on another socket of the same or another principal; garbage and
/// forged cursors are -32602 too.
#[tokio::test]
async fn s1_a_list_cursor_works_only_on_its_own_socket() {
    let t = s1_relay().await;
    let c1 = t.client_init("alice", "s1-one").await;
    let (walked, first_cursor) = walk_pages(&c1).await;
    let valid = first_cursor.expect("a first page has a cursor");
    let again = call(
        &c1,
        "listSessions",
        json!({"channel": ROOT, "limit": 1, "cursor": valid}),
    )
    .await
    .expect("the cursor works on its own socket");
    assert_eq!(item_uris(&again), [walked[1].clone()]);
    let c2 = t.client_init("alice", "s1-two").await;
    let bob = t.client_init("bob", "s1-one").await;
    for other in [&c2, &bob] {
        let e = fails(
            other,
            "listSessions",
            json!({"channel": ROOT, "limit": 1, "cursor": valid}),
        )
        .await;
        assert_eq!(e.code, -32602, "a cursor on another socket: {e:?}");
    }
    let (body, _) = valid.split_once('.').expect("cursor is body.tag");
    let forged = format!("{body}.{}", "A".repeat(22));
    for garbage in ["garbage", "", "x.y", forged.as_str()] {
        let e = fails(
            &c1,
            "listSessions",
            json!({"channel": ROOT, "cursor": garbage}),
        )
        .await;
        assert_eq!(e.code, -32602, "cursor {garbage:?}: {e:?}");
    }
}

// ─── S11 ────────────────────────────────────────────────────────────────────

/// A host announcing `ahp-session:/shared-1`, `ahp-chat:/shared-1-main`, `ahp-terminal:/1`.
fn shared_host(name: &str) -> SimHostConfig {
    SimHostConfig {
        session_prefix: "shared".into(),
        terminals: 1,
        ..fast_config(name, 1)
    }
}

/// S11's relay: hosts a and b both announcing the colliding URIs.
async fn s11_relay() -> TestRelay {
    let t = TestRelay::start(vec![shared_host("a"), shared_host("b")], "").await;
    for h in &t.hosts {
        assert_eq!(h.session_uris(), ["ahp-session:/shared-1"]);
    }
    t
}

/// (resource, claimed session, claimed chat) of every terminal in a root state.
fn root_terminals(root: &Value) -> Vec<(String, String, String)> {
    let mut terminals: Vec<(String, String, String)> = root["terminals"]
        .as_array()
        .unwrap_or_else(|| panic!("no terminals: {root}"))
        .iter()
        .map(|t| {
            (
                t["resource"].as_str().unwrap_or_default().into(),
                t["claim"]["session"].as_str().unwrap_or_default().into(),
                t["claim"]["chat"].as_str().unwrap_or_default().into(),
            )
        })
        .collect();
    terminals.sort();
    terminals
}

/// S11 (§4.2): two hosts announcing the same session, chat and terminal
/// URIs appear in the root, the session list and snapshots as distinct
/// qualified URIs, with every reference between them qualified alike.
#[tokio::test]
async fn s11_colliding_host_uris_appear_as_distinct_qualified_uris() {
    let t = s11_relay().await;
    let c = t.client("alice").await;
    let init = call(&c, "initialize", initialize_subscribing("s11", &[ROOT]))
        .await
        .expect("initialize");
    assert_eq!(
        root_terminals(&init["snapshots"][0]["state"]),
        owned(&[
            (
                "ahp-terminal:/a~1",
                "ahp-session:/a~shared-1",
                "ahp-chat:/a~shared-1-main"
            ),
            (
                "ahp-terminal:/b~1",
                "ahp-session:/b~shared-1",
                "ahp-chat:/b~shared-1-main"
            ),
        ])
    );
    let list = call(&c, "listSessions", json!({"channel": ROOT}))
        .await
        .expect("listSessions");
    let mut uris = item_uris(&list);
    uris.sort();
    assert_eq!(uris, ["ahp-session:/a~shared-1", "ahp-session:/b~shared-1"]);
    for h in ["a", "b"] {
        let s = item(&list, &format!("ahp-session:/{h}~shared-1"));
        let chat = format!("ahp-chat:/{h}~shared-1-main");
        assert_eq!(s["defaultChat"], chat, "{s}");
        assert_eq!(s["chats"][0]["resource"], chat, "{s}");
        let snap = subscribe_raw(&c, &format!("ahp-session:/{h}~shared-1")).await;
        assert_eq!(snap["resource"], format!("ahp-session:/{h}~shared-1"));
        assert_eq!(snap["state"]["defaultChat"], chat, "{snap}");
    }
    let term = subscribe_raw(&c, "ahp-terminal:/b~1").await;
    assert_eq!(term["state"]["claim"]["session"], "ahp-session:/b~shared-1");
}

/// S11 (§4.2, §4.3): a turn on host a's colliding chat yields envelopes of
/// that chat, its session and the root only, reaches host a in its own
/// name, and host b neither hears of it nor changes its chat.
#[tokio::test]
async fn s11_a_turn_on_one_colliding_chat_reaches_only_its_host() {
    let t = s11_relay().await;
    let c = t.client_init("alice", "s11").await;
    let chat_a = "ahp-chat:/a~shared-1-main";
    let host_chat = "ahp-chat:/shared-1-main";
    let b_before = t.hosts[1].channel_state(host_chat).expect("b has the chat");
    t.hosts[1].clear_record();
    let mut events = c.events();
    subscribe_raw(&c, chat_a).await;
    let envs = run_turn(&c, &mut events, chat_a, "s11-turn").await;
    for e in &envs {
        assert!(
            [chat_a, "ahp-session:/a~shared-1", ROOT].contains(&e.channel.as_str()),
            "envelope from elsewhere: {e:?}"
        );
    }
    let leaked: Vec<String> = t.hosts[1]
        .received()
        .iter()
        .filter(|f| f.method.as_deref() == Some("dispatchAction") || f.text.contains(host_chat))
        .map(|f| f.text.to_string())
        .collect();
    assert!(leaked.is_empty(), "host b received: {leaked:?}");
    assert!(
        host_frames(&t.hosts[0], "dispatchAction")
            .iter()
            .any(|f| f["params"]["channel"] == host_chat),
        "host a received the turn in its own name"
    );
    assert_eq!(t.hosts[1].channel_state(host_chat), Some(b_before));
    let a_chat = t.hosts[0].channel_state(host_chat).expect("a's chat");
    assert_eq!(
        a_chat["turns"].as_array().map(Vec::len),
        Some(1),
        "{a_chat}"
    );
}

/// S11 (§4.2, §8.1): after a relay restart on the same store, upstream ids
/// are the same, every qualified name still resolves, and a relay-created
/// verbatim session URI still routes to its host only, is listed with its
/// provider, and stays taken (-32003).
#[tokio::test]
async fn s11_names_survive_a_relay_restart() {
    let t = s11_relay().await;
    let c = t.client_init("alice", "s11").await;
    let mine = "ahp-session:/s11-mine";
    call(
        &c,
        "createSession",
        json!({"channel": mine, "provider": "sim.b"}),
    )
    .await
    .expect("createSession on b");
    // Restart: close the client, stop the relay, wait until it is gone
    // (it holds the store file), start a new one from the same directory.
    c.shutdown().await;
    drop(c);
    let up_before = t.upstream_id("alice", "s11");
    let t = t.restart().await;
    assert_eq!(
        t.upstream_id("alice", "s11"),
        up_before,
        "the relay secret persists, so upstream ids survive a restart"
    );
    let c = t.client_init("alice", "s11-after").await;
    for uri in [
        "ahp-session:/a~shared-1",
        "ahp-session:/b~shared-1",
        "ahp-chat:/a~shared-1-main",
        "ahp-chat:/b~shared-1-main",
        "ahp-terminal:/a~1",
        "ahp-terminal:/b~1",
    ] {
        let snap = subscribe_raw(&c, uri).await;
        assert_eq!(snap["resource"], uri);
    }
    t.hosts[0].clear_record();
    t.hosts[1].clear_record();
    let snap = subscribe_raw(&c, mine).await;
    assert_eq!(snap["resource"], mine);
    assert!(
        host_frames(&t.hosts[1], "subscribe")
            .iter()
            .any(|f| f["params"]["channel"] == mine),
        "the verbatim URI is routed to b"
    );
    assert!(
        !t.hosts[0].received().iter().any(|f| f.text.contains(mine)),
        "host a never hears of it"
    );
    let list = call(&c, "listSessions", json!({"channel": ROOT}))
        .await
        .expect("listSessions");
    assert_eq!(item(&list, mine)["provider"], "sim.b");
    let e = fails(
        &c,
        "createSession",
        json!({"channel": mine, "provider": "sim.a"}),
    )
    .await;
    assert_eq!(
        e.code, -32003,
        "the name stays taken after a restart: {e:?}"
    );
}

// ─── client-chosen URIs ─────────────────────────────────────────────────────

/// Hosts a and b, and alice's client initialized as "c3".
async fn chosen_world() -> (TestRelay, Client) {
    let t = TestRelay::start(vec![fast_config("a", 1), fast_config("b", 1)], "").await;
    let c = t.client_init("alice", "c3").await;
    (t, c)
}

/// Creates `ahp-session:/mine-1` on host b through `c`.
async fn create_mine(c: &Client) -> &'static str {
    let mine = "ahp-session:/mine-1";
    let r = call(
        c,
        "createSession",
        json!({"channel": mine, "provider": "sim.b"}),
    )
    .await
    .expect("createSession");
    assert_eq!(r, Value::Null);
    mine
}

/// §4.2: a client-chosen session URI lands on its provider's host only, is
/// listed verbatim with its qualified provider as soon as the create
/// returns, and stays unique across hosts (-32003).
#[tokio::test]
async fn a_client_chosen_session_uri_is_routed_by_provider_and_unique() {
    let (t, c) = chosen_world().await;
    let mine = create_mine(&c).await;
    let list = call(&c, "listSessions", json!({"channel": ROOT}))
        .await
        .expect("listSessions");
    assert_eq!(item(&list, mine)["provider"], "sim.b");
    assert!(t.hosts[1].session_uris().iter().any(|u| u == mine));
    assert!(!t.hosts[0].session_uris().iter().any(|u| u == mine));
    let e = fails(
        &c,
        "createSession",
        json!({"channel": mine, "provider": "sim.a"}),
    )
    .await;
    assert_eq!(e.code, -32003, "{e:?}");
    assert_eq!(host_frames(&t.hosts[1], "createSession").len(), 1);
    assert!(host_frames(&t.hosts[0], "createSession").is_empty());
}

/// §4.2: a client-chosen session URI must be `ahp-session:/<id>` without
/// `~` or `/`, and a create may not register another clientId as active:
/// -32602, and nothing reaches a host.
#[tokio::test]
async fn client_chosen_session_uris_must_be_a_plain_id() {
    let (t, c) = chosen_world().await;
    for bad in [
        "ahp-session:/x~y",
        "ahp-session:/a~a-1",
        "ahp-session:/x/y",
        "ahp-chat:/x",
    ] {
        let e = fails(
            &c,
            "createSession",
            json!({"channel": bad, "provider": "sim.a"}),
        )
        .await;
        assert_eq!(e.code, -32602, "{bad}: {e:?}");
    }
    let e = fails(
        &c,
        "createSession",
        json!({"channel": "ahp-session:/mine-9", "provider": "sim.a",
            "activeClient": {"clientId": "someone-else", "tools": []}}),
    )
    .await;
    assert_eq!(e.code, -32602, "a foreign activeClient: {e:?}");
    assert!(
        host_frames(&t.hosts[0], "createSession").is_empty(),
        "no refused create reached host a"
    );
    assert!(
        host_frames(&t.hosts[1], "createSession").is_empty(),
        "no refused create reached host b"
    );
}

/// §4.2: a client-chosen chat URI in a client-chosen session is created
/// on the session's host, subscribable under its own name and listed in
/// the session next to the qualified default chat; a qualified one is
/// -32602.
#[tokio::test]
async fn a_client_chosen_chat_uri_is_created_and_subscribable() {
    let (t, c) = chosen_world().await;
    let mine = create_mine(&c).await;
    let side = "ahp-chat:/mine-1-side";
    let r = call(&c, "createChat", json!({"channel": mine, "chat": side}))
        .await
        .expect("createChat");
    assert_eq!(r, Value::Null);
    assert!(t.hosts[1].channel_state(side).is_some());
    let snap = subscribe_raw(&c, side).await;
    assert_eq!(snap["resource"], side);
    assert_eq!(snap["state"]["resource"], side, "{snap}");
    let session = subscribe_raw(&c, mine).await;
    let mut chats: Vec<&str> = session["state"]["chats"]
        .as_array()
        .expect("chats")
        .iter()
        .filter_map(|c| c["resource"].as_str())
        .collect();
    chats.sort();
    assert_eq!(chats, ["ahp-chat:/b~mine-1-main", side], "{session}");
    let e = fails(
        &c,
        "createChat",
        json!({"channel": mine, "chat": "ahp-chat:/b~x"}),
    )
    .await;
    assert_eq!(e.code, -32602, "{e:?}");
}

/// §4.2, §4.4: a create with an unknown provider (unknown agent, host, or
/// unqualified) is -32002 and leaves the name free for the next create.
#[tokio::test]
async fn an_unknown_provider_is_refused_and_frees_the_name() {
    let (t, c) = chosen_world().await;
    let two = "ahp-session:/mine-2";
    for provider in ["nope.b", "sim.zzz", "sim"] {
        let e = fails(
            &c,
            "createSession",
            json!({"channel": two, "provider": provider}),
        )
        .await;
        assert_eq!(e.code, -32002, "{provider}: {e:?}");
    }
    call(
        &c,
        "createSession",
        json!({"channel": two, "provider": "sim.a"}),
    )
    .await
    .expect("the name is free again after the refusal");
    assert!(t.hosts[0].session_uris().iter().any(|u| u == two));
}

// ─── error table ────────────────────────────────────────────────────────────

/// §4.4: subscribing an unknown session is -32001, any other unknown
/// channel (also of an unknown host) -32008, never with `data`, and a
/// host's own error does not leak the host form of the name.
#[tokio::test]
async fn unknown_channels_answer_their_code_without_data() {
    let t = TestRelay::start(vec![fast_config("a", 1), fast_config("b", 1)], "").await;
    let c = t.client_init("alice", "c4").await;
    for (uri, code) in [
        ("ahp-session:/a~nope", -32001),
        ("ahp-session:/nope", -32001),
        ("ahp-session:/zzz~a-1", -32001),
        ("ahp-chat:/zzz", -32008),
        ("ahp-chat:/a~nope", -32008),
        ("ahp-chat:/zzz~a-1-main", -32008),
        ("ahp-terminal:/zzz~1", -32008),
    ] {
        let e = fails(&c, "subscribe", json!({"channel": uri})).await;
        assert_eq!(e.code, code, "{uri}: {e:?}");
        assert!(e.data.is_none(), "{uri}: {e:?}");
        // A host's own error must not leak the host form of the name.
        if let Some(id) = uri.split_once("/a~").map(|(_, id)| id) {
            assert!(!e.message.contains(&format!(":/{id}")), "{uri}: {e:?}");
        }
    }
}

/// §4.4, §5.3: a dispatch to an unknown channel (of a known or unknown
/// host, verbatim or qualified) gets no echo at all and reaches no host.
#[tokio::test]
async fn dispatches_to_unknown_channels_get_no_echo() {
    let t = TestRelay::start(vec![fast_config("a", 1), fast_config("b", 1)], "").await;
    let mut ws = t.raw("alice").await;
    ws.initialize("c4-raw").await;
    for (n, channel) in [
        "ahp-chat:/zzz",
        "ahp-chat:/zzz~a-1-main",
        "ahp-session:/nope",
        "ahp-chat:/a~nope",
    ]
    .into_iter()
    .enumerate()
    {
        ws.dispatch(
            channel,
            n as i64 + 1,
            json!({"type": "session/titleChanged", "title": "x"}),
        )
        .await;
    }
    // A request routed through host a's link after the dispatches, then a
    // ping: anything echoed would be written before their responses.
    ws.send_json(&request_frame(
        5,
        "subscribe",
        json!({"channel": "ahp-session:/a~a-1"}),
    ))
    .await;
    let mut frames = frames_until_response(&mut ws).await;
    ws.send_json(&ping_frame(6)).await;
    frames.extend(frames_until_response(&mut ws).await);
    let echoes: Vec<&String> = frames
        .iter()
        .filter(|(_, v)| v["method"] == "action")
        .map(|(t, _)| t)
        .collect();
    assert!(echoes.is_empty(), "echoes for unknown channels: {echoes:?}");
    assert_eq!(frames.last().map(|(_, v)| v["id"].clone()), Some(json!(6)));
    assert!(
        !t.hosts[1]
            .received()
            .iter()
            .any(|f| f.method.as_deref() == Some("dispatchAction")),
        "nothing reached host b"
    );
}

/// Lists sessions on `c` until `uri` is marked `unreachable` (bounded);
/// returns the last list.
async fn list_until_unreachable(c: &Client, uri: &str) -> Value {
    let mut listed = Value::Null;
    for _ in 0..500 {
        listed = call(c, "listSessions", json!({"channel": ROOT}))
            .await
            .expect("listSessions");
        if item(&listed, uri)["_meta"]["ahp-relay/hostState"] == "unreachable" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    listed
}

/// §4.4, §5.8: once host b stops, its sessions stay listed marked
/// `unreachable` (a's are not marked); requests for b, from a client
/// attached before or after, are -32603 `hostUnavailable` naming b
/// (retryable); a dispatch to b gets a rejection echo with the client's
/// origin; and host a keeps working.
#[tokio::test]
async fn a_stopped_host_is_unavailable_while_the_other_keeps_working() {
    let mut t = TestRelay::start(vec![fast_config("a", 1), fast_config("b", 1)], "").await;
    let c = t.client_init("alice", "c4").await;
    let b = t.hosts.remove(1);
    b.shutdown().await;
    let listed = list_until_unreachable(&c, "ahp-session:/b~b-1").await;
    assert_eq!(
        item(&listed, "ahp-session:/b~b-1")["_meta"]["ahp-relay/hostState"],
        "unreachable",
        "{listed}"
    );
    assert!(
        item(&listed, "ahp-session:/a~a-1")
            .pointer("/_meta/ahp-relay~1hostState")
            .is_none(),
        "{listed}"
    );

    let late = t.client_init("alice", "c4-late").await;
    let down = json!({"reason": "hostUnavailable", "host": "b", "retryable": true});
    for (who, method, params) in [
        (&late, "subscribe", json!({"channel": "ahp-session:/b~b-1"})),
        (&c, "subscribe", json!({"channel": "ahp-chat:/b~b-1-main"})),
        (
            &late,
            "createSession",
            json!({"channel": "ahp-session:/c4-new", "provider": "sim.b"}),
        ),
    ] {
        let e = fails(who, method, params.clone()).await;
        assert_eq!(e.code, -32603, "{method} {params}: {e:?}");
        assert_eq!(e.data.as_ref(), Some(&down), "{method} {params}: {e:?}");
    }
    let mut events = late.events();
    let h = late
        .dispatch(
            "ahp-chat:/b~b-1-main".into(),
            action(json!({"type": "chat/isReadChanged", "isRead": true})),
        )
        .await
        .expect("dispatch");
    let echo = actions_until(&mut events, |e| e.channel == "ahp-chat:/b~b-1-main")
        .await
        .pop()
        .expect("an echo");
    assert!(echo.rejection_reason.is_some(), "{echo:?}");
    assert_eq!(
        echo.origin,
        Some(ActionOrigin {
            client_id: "c4-late".into(),
            client_seq: h.client_seq
        })
    );

    subscribe_raw(&late, "ahp-session:/a~a-1").await;
    subscribe_raw(&late, "ahp-chat:/a~a-1-main").await;
    let envs = run_turn(&late, &mut events, "ahp-chat:/a~a-1-main", "c4-turn").await;
    assert!(
        envs.iter().all(|e| e.rejection_reason.is_none()),
        "{envs:?}"
    );
}

// ─── ids ────────────────────────────────────────────────────────────────────

/// The requests of the request-id test for the `n`th id: (what answers,
/// method, params, a pointer into the answer, the value there).
fn id_calls(n: usize) -> [(&'static str, &'static str, Value, &'static str, Value); 6] {
    let fresh = format!("ahp-session:/ids-{n}");
    [
        (
            "ping",
            "ping",
            json!({"channel": ROOT}),
            "/result",
            Value::Null,
        ),
        (
            "routed result",
            "subscribe",
            json!({"channel": "ahp-session:/a~a-1"}),
            "/result/snapshot/resource",
            json!("ahp-session:/a~a-1"),
        ),
        (
            "relay's not-found",
            "subscribe",
            json!({"channel": "ahp-session:/a~nope"}),
            "/error/code",
            json!(-32001),
        ),
        (
            "host error",
            "createSession",
            json!({"channel": fresh, "provider": "nope.a"}),
            "/error/code",
            json!(-32002),
        ),
        (
            "relay error",
            "subscribe",
            json!({"channel": "ahp-chat:/zzz"}),
            "/error/code",
            json!(-32008),
        ),
        (
            "method not found",
            "frobnicate",
            json!({"channel": ROOT}),
            "/error/code",
            json!(-32601),
        ),
    ]
}

/// Host `h` got `n` subscribes and `n` creates (only visible, existing
/// channels reach it), each with its own integer id, and no client's id.
fn assert_host_saw_only_relay_ids(h: &ahp_relay::simhost::SimHost, n: usize) {
    let subs = host_frames(h, "subscribe");
    assert_eq!(
        subs.len(),
        n,
        "only visible, existing channels reach the host: {subs:?}"
    );
    let creates = host_frames(h, "createSession");
    assert_eq!(creates.len(), n, "{creates:?}");
    let mut seen = BTreeSet::new();
    for s in subs.iter().chain(&creates) {
        let id = s["id"]
            .as_u64()
            .unwrap_or_else(|| panic!("host saw a non-integer id: {s}"));
        assert!(seen.insert(id), "id {id} reused on one link");
    }
    for f in h.received() {
        assert!(
            !f.text.contains("abc") && !f.text.contains(r#"a\"b"#),
            "a client id reached the host: {}",
            f.text
        );
    }
}

/// §4.5: string, zero, large, negative and fractional request ids are echoed byte for byte on relay answers, relay errors, routed results and relayed host errors, while the host only ever sees the relay's own integer ids.
#[tokio::test]
async fn request_ids_are_echoed_byte_for_byte_and_never_forwarded() {
    let t = TestRelay::start(vec![fast_config("a", 1)], "").await;
    let mut ws = t.raw("alice").await;
    let init = ws.initialize("c5").await;
    assert!(init.get("result").is_some(), "{init}");
    let ids = [
        r#""abc""#,
        r#""a\"b""#,
        r#""""#,
        "0",
        "7",
        "9007199254740992",
        "-1",
        "1.5",
    ];
    for (n, raw) in ids.into_iter().enumerate() {
        for (what, method, params, ptr, want) in id_calls(n) {
            let (text, v) = raw_call(&mut ws, raw, method, params).await;
            assert_eq!(raw_id(&text), raw, "{what}: {text}");
            assert_eq!(v.pointer(ptr), Some(&want), "{what}: {text}");
        }
    }
    assert_host_saw_only_relay_ids(&t.hosts[0], ids.len());
}

// ─── identity ───────────────────────────────────────────────────────────────

/// The identity world: host a, and alice and bob both initialized as
/// "same", both subscribed to host a's seeded session (their event streams
/// taken first).
async fn identity_world() -> (TestRelay, [Client; 2], [ahp::ClientEventStream; 2]) {
    let t = TestRelay::start(vec![fast_config("a", 1)], "").await;
    let alice = t.client_init("alice", "same").await;
    let bob = t.client_init("bob", "same").await;
    let events = [alice.events(), bob.events()];
    subscribe_raw(&alice, "ahp-session:/a~a-1").await;
    subscribe_raw(&bob, "ahp-session:/a~a-1").await;
    (t, [alice, bob], events)
}

/// §2 B2: the relay's links initialize at the host with `r1.` ids derived
/// per (principal, clientId), never the client's own id: alice's and bob's
/// "same" are two upstream clients.
#[tokio::test]
async fn upstream_ids_are_derived_per_principal_and_client_id() {
    let (t, _clients, _events) = identity_world().await;
    let host = &t.hosts[0];
    let up_alice = t.upstream_id("alice", "same");
    let up_bob = t.upstream_id("bob", "same");
    assert_ne!(up_alice, up_bob);
    let inits: BTreeSet<String> = initialized_ids(host).into_iter().collect();
    assert_eq!(
        inits,
        BTreeSet::from([
            ahp_relay::upstream::watch::watch_client_id().to_string(),
            up_alice.clone(),
            up_bob.clone()
        ])
    );
    for id in [&up_alice, &up_bob] {
        assert!(id.starts_with("r1.") && id.len() == 3 + 11 + 1 + 16, "{id}");
    }
    assert!(host.received_from("same").is_empty());
}

/// §2 B2, §5.3: alice's own echo carries her own clientId and clientSeq;
/// bob, with the same clientId, sees her change with her opaque upstream id.
#[tokio::test]
async fn echo_origins_show_the_own_client_id_and_others_an_opaque_id() {
    let (t, [alice, _bob], [mut alice_ev, mut bob_ev]) = identity_world().await;
    let session = "ahp-session:/a~a-1";
    let up_alice = t.upstream_id("alice", "same");
    let h = alice
        .dispatch(
            session.into(),
            action(json!({"type": "session/titleChanged", "title": "Renamed"})),
        )
        .await
        .expect("dispatch");
    let own = actions_until(&mut alice_ev, |e| action_type(e) == "session/titleChanged")
        .await
        .pop()
        .expect("echo");
    assert_eq!(own.rejection_reason, None);
    assert_eq!(
        own.origin,
        Some(ActionOrigin {
            client_id: "same".into(),
            client_seq: h.client_seq
        })
    );
    let seen_by_bob = actions_until(&mut bob_ev, |e| action_type(e) == "session/titleChanged")
        .await
        .pop()
        .expect("bob sees the change");
    assert_eq!(
        seen_by_bob.origin.map(|o| o.client_id),
        Some(up_alice.clone()),
        "bob must not see alice's echo as his own"
    );
}

/// Dispatches `session/activeClientSet` naming `client_id` (no tools) on
/// host a's seeded session; its `clientSeq` and its echo.
async fn set_active_client(
    c: &Client,
    events: &mut ahp::ClientEventStream,
    client_id: &str,
) -> (i64, ActionEnvelope) {
    let h = c
        .dispatch(
            "ahp-session:/a~a-1".into(),
            action(json!({"type": "session/activeClientSet",
                "activeClient": {"clientId": client_id, "tools": []}})),
        )
        .await
        .expect("dispatch");
    let echo = actions_until(events, |e| action_type(e) == "session/activeClientSet")
        .await
        .pop()
        .expect("echo");
    (h.client_seq, echo)
}

/// §2 B2, §5.3: `session/activeClientSet` naming another clientId gets a
/// relay rejection echo (with the client's origin) that reaches neither bob
/// nor the host; naming the client itself is forwarded with its upstream
/// id, echoed with its own id, shown to bob with the opaque id, and lands
/// at the host under the upstream id. The client's own id never reaches
/// the host.
#[tokio::test]
async fn active_client_set_names_only_the_dispatching_client() {
    let (t, [alice, _bob], [mut alice_ev, mut bob_ev]) = identity_world().await;
    let host = &t.hosts[0];
    let session = "ahp-session:/a~a-1";
    let up_alice = t.upstream_id("alice", "same");
    let (foreign, rejected) = set_active_client(&alice, &mut alice_ev, "someone-else").await;
    assert_eq!(rejected.channel, session);
    assert!(rejected.rejection_reason.is_some(), "{rejected:?}");
    assert_eq!(
        rejected.origin,
        Some(ActionOrigin {
            client_id: "same".into(),
            client_seq: foreign
        })
    );

    let (mine, accepted) = set_active_client(&alice, &mut alice_ev, "same").await;
    assert_eq!(accepted.rejection_reason, None, "{accepted:?}");
    assert_eq!(accepted.origin.as_ref().map(|o| o.client_seq), Some(mine));
    let payload = serde_json::to_value(&accepted.action).expect("action");
    assert_eq!(payload["activeClient"]["clientId"], "same");
    let bobs = actions_until(&mut bob_ev, |e| action_type(e) == "session/activeClientSet").await;
    assert!(
        bobs.iter().all(|e| e.rejection_reason.is_none()),
        "alice's rejection went to bob: {bobs:?}"
    );
    let payload = serde_json::to_value(&bobs.last().expect("bob's copy").action).expect("action");
    assert_eq!(payload["activeClient"]["clientId"], up_alice.as_str());

    let dispatched = host_frames(host, "dispatchAction");
    assert!(
        !dispatched.iter().any(|f| mentions(f, "someone-else")),
        "a refused identity reached the host: {dispatched:?}"
    );
    assert!(
        dispatched
            .iter()
            .any(|f| f["params"]["action"]["activeClient"]["clientId"] == up_alice.as_str()),
        "{dispatched:?}"
    );
    let state = host.channel_state("ahp-session:/a-1").expect("session");
    assert_eq!(state["activeClients"][0]["clientId"], up_alice.as_str());
    assert!(host.received_from("same").is_empty());
    for f in host.received() {
        let v: Value = serde_json::from_str(&f.text).expect("JSON");
        assert!(
            !mentions(&v, "same"),
            "the client's own id reached the host: {}",
            f.text
        );
    }
}

// ─── session lifecycle ──────────────────────────────────────────────────────

/// §5.6: `reconnect` for an unknown clientId is -32008 and the socket stays usable for `initialize`; a second `initialize` on a socket is -32600; a second socket of the same (principal, clientId) closes the first with 4009, the same clientId of another principal does not.
#[tokio::test]
async fn session_lifecycle_not_found_reinit_and_supersede() {
    let t = TestRelay::start(vec![fast_config("a", 1)], "").await;
    let mut first = t.raw("alice").await;
    let r = first
        .request(1, "reconnect", reconnect_params("ghost", 0, &[]))
        .await;
    assert_eq!(r["error"]["code"], -32008, "{r}");
    let init = first.initialize("c7").await;
    assert!(init["result"]["serverSeq"].is_u64(), "{init}");
    for (id, cid) in [(2, "c7"), (3, "c7-other")] {
        let r = first
            .request(id, "initialize", initialize_params(cid))
            .await;
        assert_eq!(r["error"]["code"], -32600, "{r}");
    }

    let mut bob = t.raw("bob").await;
    assert!(bob.initialize("c7").await.get("result").is_some());
    let r = first.request(4, "ping", json!({"channel": ROOT})).await;
    assert_eq!(
        r["result"],
        Value::Null,
        "another principal's c7 left it open: {r}"
    );
    let r = first
        .request(40, "subscribe", json!({"channel": "ahp-session:/a~a-1"}))
        .await;
    assert!(r["result"]["snapshot"].is_object(), "{r}");

    let mut second = t.raw("alice").await;
    assert!(second.initialize("c7").await.get("result").is_some());
    let closed = first.close_code().await;
    assert_eq!(closed.map(|(code, _)| code), Some(4009));
    for ws in [&mut second, &mut bob] {
        let r = ws.request(5, "ping", json!({"channel": ROOT})).await;
        assert_eq!(r["result"], Value::Null, "{r}");
    }
    let r = second
        .request(6, "subscribe", json!({"channel": "ahp-session:/a~a-1"}))
        .await;
    assert_eq!(
        r["result"]["snapshot"]["resource"], "ahp-session:/a~a-1",
        "{r}"
    );
}

// ─── bad input ──────────────────────────────────────────────────────────────

/// A raw socket through the relay as alice, initialized as "c8".
async fn c8(t: &TestRelay) -> RawWs {
    let mut ws = t.raw("alice").await;
    let init = ws.initialize("c8").await;
    assert!(init["result"]["serverSeq"].is_u64(), "{init}");
    ws
}

/// §3.7, §4.1: before `initialize` a ping is answered, any other request
/// is -32600, and an unparsable frame is -32700 with a null id.
#[tokio::test]
async fn requests_before_initialize_and_unparsable_frames_get_their_codes() {
    let t = TestRelay::start(vec![fast_config("a", 1)], "").await;
    let mut ws = t.raw("alice").await;
    let r = ws.request(1, "ping", json!({"channel": ROOT})).await;
    assert_eq!(r["result"], Value::Null, "{r}");
    for (id, method, params) in [
        (2, "subscribe", json!({"channel": "ahp-session:/a~a-1"})),
        (3, "listSessions", json!({"channel": ROOT})),
    ] {
        let r = ws.request(id, method, params).await;
        assert_eq!(
            r["error"]["code"], -32600,
            "{method} before initialize: {r}"
        );
    }
    ws.send_text(r#"{"jsonrpc":"2.0","id":4,"method":"#).await;
    let r = ws.recv_json().await.expect("an answer");
    assert_eq!(r["error"]["code"], -32700, "{r}");
    assert_eq!(r.get("id"), Some(&Value::Null), "{r}");
}

/// §3.7, §4.1: `initialize` picks the highest offered 1.x version; an
/// unknown method is -32601, missing or absent params -32602, and the
/// socket keeps working after each.
#[tokio::test]
async fn bad_requests_get_their_codes_and_the_socket_keeps_working() {
    let t = TestRelay::start(vec![fast_config("a", 1)], "").await;
    let mut ws = t.raw("alice").await;
    let r = ws
        .request(
            5,
            "initialize",
            json!({"channel": ROOT, "protocolVersions": ["1.0.0", "1.0.3"], "clientId": "c8"}),
        )
        .await;
    assert_eq!(r["result"]["protocolVersion"], "1.0.3", "{r}");
    let r = ws.request(6, "frobnicate", json!({"channel": ROOT})).await;
    assert_eq!(r["error"]["code"], -32601, "{r}");
    // A method that routes by its channel must name it (§4.1)…
    let r = ws.request(7, "fetchTurns", json!({})).await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    // …a root-scoped one may leave it out, as VS Code's client does.
    let r = ws.request(70, "listSessions", json!({})).await;
    assert!(r["result"]["items"].is_array(), "{r}");
    ws.send_text(r#"{"jsonrpc":"2.0","id":8,"method":"subscribe"}"#)
        .await;
    let r = ws.response(&json!(8)).await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    let r = ws.request(9, "ping", json!({"channel": ROOT})).await;
    assert_eq!(r["result"], Value::Null, "{r}");
}

/// §4.1, §5.3: an action type the relay does not know gets a relay
/// rejection echo (numbered, with a reason and the client's origin)
/// carrying the action exactly as dispatched, and never reaches the host.
#[tokio::test]
async fn an_unknown_action_gets_a_rejection_echo_as_dispatched() {
    let t = TestRelay::start(vec![fast_config("a", 1)], "").await;
    let mut ws = c8(&t).await;
    let odd = json!({"type": "chat/frobnicated", "extra": {"k": [1, 2]}});
    ws.dispatch("ahp-chat:/a~a-1-main", 41, odd.clone()).await;
    let echo = ws.recv_json().await.expect("a rejection echo");
    assert_eq!(echo["method"], "action", "{echo}");
    assert_eq!(echo["params"]["channel"], "ahp-chat:/a~a-1-main", "{echo}");
    assert_eq!(echo["params"]["action"], odd, "{echo}");
    assert_eq!(
        echo["params"]["origin"],
        json!({"clientId": "c8", "clientSeq": 41}),
        "{echo}"
    );
    assert!(echo["params"]["rejectionReason"].is_string(), "{echo}");
    assert!(echo["params"]["serverSeq"].is_u64(), "{echo}");
    assert!(
        !t.hosts[0]
            .received()
            .iter()
            .any(|f| f.text.contains("frobnicated")),
        "an unknown action reached the host"
    );
}

/// §3.7: a binary frame closes its socket with 1003 and an `initialize`
/// offering no supported version is -32005 listing the supported versions,
/// then closed with 1002; another client of the relay is not affected.
#[tokio::test]
async fn bad_frames_close_only_their_own_socket() {
    let t = TestRelay::start(vec![fast_config("a", 1)], "").await;
    let bystander = t.client_init("bob", "bystander").await;
    let mut ws = c8(&t).await;
    ws.send_binary(b"\x00\x01".to_vec()).await;
    assert_eq!(ws.close_code().await.map(|(c, _)| c), Some(1003));

    let mut v = t.raw("alice").await;
    let r = v
        .request(
            1,
            "initialize",
            json!({"channel": ROOT, "protocolVersions": ["2.0.0"], "clientId": "c8-v"}),
        )
        .await;
    assert_eq!(r["error"]["code"], -32005, "{r}");
    let supported = r["error"]["data"]["supportedVersions"]
        .as_array()
        .unwrap_or_else(|| panic!("no supportedVersions: {r}"));
    assert!(
        !supported.is_empty() && supported.iter().all(Value::is_string),
        "{r}"
    );
    // The close code is the relay's choice (src/session/README.md: 1002).
    assert_eq!(
        v.close_code().await.map(|(c, _)| c),
        Some(1002),
        "closed after -32005"
    );

    bystander.ping().await.expect("the bystander still works");
    let list = call(&bystander, "listSessions", json!({"channel": ROOT}))
        .await
        .expect("listSessions");
    assert_eq!(item_uris(&list), ["ahp-session:/a~a-1"]);
}

// ─── rewrite table ──────────────────────────────────────────────────────────

const UP: &str = "r1.AAAAAAAAAAA.BBBBBBBBBBBBBBBB";
const OWN: &str = "my-client";

enum Seg {
    Key(&'static str),
    Index,
}

fn segments(path: &'static str) -> Vec<Seg> {
    let mut out = Vec::new();
    for step in path.split('.') {
        match step.strip_suffix("[]") {
            Some(k) => {
                out.push(Seg::Key(k));
                out.push(Seg::Index);
            }
            None => out.push(Seg::Key(step)),
        }
    }
    out
}

fn pointer(segs: &[Seg]) -> String {
    segs.iter()
        .map(|s| match s {
            Seg::Key(k) => format!("/{k}"),
            Seg::Index => "/0".to_string(),
        })
        .collect()
}

/// The value at `segs` below `at`, creating objects and one-element arrays.
fn slot<'a>(at: &'a mut Value, segs: &[Seg]) -> &'a mut Value {
    let mut cur = at;
    for seg in segs {
        cur = match seg {
            Seg::Key(k) => {
                if !cur.is_object() {
                    *cur = json!({});
                }
                cur.as_object_mut()
                    .expect("object")
                    .entry(k.to_string())
                    .or_insert(Value::Null)
            }
            Seg::Index => {
                if !cur.is_array() {
                    *cur = json!([]);
                }
                let items = cur.as_array_mut().expect("array");
                if items.is_empty() {
                    items.push(Value::Null);
                }
                &mut items[0]
            }
        };
    }
    cur
}

/// The URI scheme a field of this path plausibly holds.
fn scheme_for(path: &str) -> &'static str {
    let last = path.rsplit('.').next().unwrap_or(path).to_lowercase();
    if last.contains("chat") || path == "destination.after" {
        "ahp-chat"
    } else if last.contains("terminal") {
        "ahp-terminal"
    } else {
        "ahp-session"
    }
}

/// One leaf of a built shape: its JSON pointer, kind and URI scheme.
struct Leaf {
    ptr: String,
    kind: FieldKind,
    scheme: &'static str,
}

/// Builds `shape` into `at` with a host-form value at every field.
fn build(shape: &str, at: &mut Value, base: &str, leaves: &mut Vec<Leaf>, depth: usize) {
    assert!(depth < 16, "shape nesting too deep at {shape}");
    let rows = translate::rows(shape).unwrap_or_else(|| panic!("unknown shape {shape}"));
    for row in rows {
        match *row {
            Row::Field(path, kind) => {
                let segs = segments(path);
                let scheme = scheme_for(path);
                *slot(at, &segs) = json!(match kind {
                    FieldKind::Uri | FieldKind::Ref => format!("{scheme}:/x1"),
                    FieldKind::UriTemplate => format!("{scheme}:/x1/{{turnId}}"),
                    FieldKind::Published => "virtual://client/x1".to_string(),
                    FieldKind::Provider => "p".to_string(),
                    FieldKind::ClientId => UP.to_string(),
                });
                leaves.push(Leaf {
                    ptr: format!("{base}{}", pointer(&segs)),
                    kind,
                    scheme,
                });
            }
            Row::Nested(path, inner) => {
                let segs = segments(path);
                let s = slot(at, &segs);
                if !s.is_object() {
                    *s = json!({});
                }
                build(
                    inner,
                    s,
                    &format!("{base}{}", pointer(&segs)),
                    leaves,
                    depth + 1,
                );
            }
        }
    }
}

fn set(v: &mut Value, ptr: &str, to: &str) {
    *v.pointer_mut(ptr)
        .unwrap_or_else(|| panic!("no {ptr} in the built value")) = json!(to);
}

/// A store holding alice's verbatim `<scheme>:/mine` on host a for every
/// scheme.
fn rewrite_store() -> RedbStore {
    let store = RedbStore::open_in_memory().expect("in-memory store");
    let owner = Owner {
        issuer: DEV_ISSUER.into(),
        subject: "alice".into(),
        groups: Vec::new(),
    };
    for scheme in ["ahp-session", "ahp-chat", "ahp-terminal"] {
        let uri = format!("{scheme}:/mine");
        store.reserve(&uri, "a", &owner, 1).expect("reserve");
        store.confirm(&uri).expect("confirm");
    }
    store
}

/// The host → client rewrite of host a with the client's identity.
fn to_client(store: &RedbStore) -> ToClient<'_> {
    ToClient {
        host: "a",
        store,
        identity: Some((UP, OWN)),
    }
}

/// The client → host rewrite for `host` with the client's identity.
fn to_host<'a>(store: &'a RedbStore, host: &'a str) -> ToHost<'a> {
    ToHost {
        host,
        store: store as &dyn UriStore,
        identity: (UP, OWN),
    }
}

/// `shape` built with a host-form value at every field, the same value
/// rewritten to the client, and its fields.
fn rewrite_forms(shape: &str, store: &RedbStore) -> (Value, Value, Vec<Leaf>) {
    let mut host_form = json!({});
    let mut leaves = Vec::new();
    build(shape, &mut host_form, "", &mut leaves, 0);
    assert!(!leaves.is_empty(), "{shape} has no fields");
    let mut client_form = host_form.clone();
    translate::translate(&mut client_form, shape, &to_client(store))
        .unwrap_or_else(|e| panic!("{shape}: to client: {e}"));
    (host_form, client_form, leaves)
}

/// §4.3: every shape of the rewrite table (over 100 fields) round-trips
/// host → client → host: URIs qualified `<host>~`, providers `p.host`, the
/// upstream id as the client's own id; a's names sent to host b fail.
#[test]
fn rewrite_table_round_trips_every_shape() {
    let store = rewrite_store();
    let mut leaf_count = 0;
    for (shape, _) in TABLE {
        let (host_form, client_form, leaves) = rewrite_forms(shape, &store);
        leaf_count += leaves.len();
        for l in &leaves {
            let want = match l.kind {
                FieldKind::Uri | FieldKind::Ref => format!("{}:/a~x1", l.scheme),
                FieldKind::UriTemplate => format!("{}:/a~x1/{{turnId}}", l.scheme),
                FieldKind::Published => "virtual://client/x1".into(),
                FieldKind::Provider => "p.a".into(),
                FieldKind::ClientId => OWN.into(),
            };
            assert_eq!(
                client_form.pointer(&l.ptr),
                Some(&json!(want)),
                "{shape} {}: {client_form}",
                l.ptr
            );
        }
        let mut back = client_form.clone();
        translate::translate(&mut back, shape, &to_host(&store, "a"))
            .unwrap_or_else(|e| panic!("{shape}: to host: {e}"));
        assert_eq!(back, host_form, "{shape} does not round-trip");
        let names_host = leaves
            .iter()
            .any(|l| !matches!(l.kind, FieldKind::ClientId | FieldKind::Published));
        let mut elsewhere = client_form.clone();
        assert_eq!(
            translate::translate(&mut elsewhere, shape, &to_host(&store, "b")).is_err(),
            names_host,
            "{shape}: a's names sent to host b"
        );
    }
    assert!(leaf_count > 100, "only {leaf_count} fields built");
}

/// §4.3 "fail closed": in every field of every shape, a client value naming
/// another host, an unqualified unknown URI, an unqualified or foreign
/// provider, another clientId or the raw upstream id fails client → host.
#[test]
fn rewrite_table_fails_closed_on_foreign_names() {
    let store = rewrite_store();
    for (shape, _) in TABLE {
        let (_, client_form, leaves) = rewrite_forms(shape, &store);
        for l in &leaves {
            let refused: Vec<String> = match l.kind {
                FieldKind::Uri | FieldKind::Ref | FieldKind::UriTemplate => vec![
                    format!("{}:/other~x1", l.scheme),
                    format!("{}:/x1", l.scheme),
                ],
                FieldKind::Published => Vec::new(),
                FieldKind::Provider => vec!["p.other".into(), "p".into()],
                FieldKind::ClientId => vec!["someone-else".into(), UP.into()],
            };
            for bad in refused {
                let mut v = client_form.clone();
                set(&mut v, &l.ptr, &bad);
                assert!(
                    translate::translate(&mut v, shape, &to_host(&store, "a")).is_err(),
                    "{shape} {} = {bad:?} was accepted",
                    l.ptr
                );
            }
        }
    }
}

/// §4.2, §4.3: in every URI field of every shape, a store entry (a
/// client-chosen URI of host a) stays verbatim both ways, and is refused
/// for host b.
#[test]
fn rewrite_table_keeps_store_entries_verbatim() {
    let store = rewrite_store();
    let mut uri_fields = 0;
    for (shape, _) in TABLE {
        let (host_form, _, leaves) = rewrite_forms(shape, &store);
        for l in leaves.iter().filter(|l| l.kind == FieldKind::Uri) {
            uri_fields += 1;
            let entry = format!("{}:/mine", l.scheme);
            let mut v = host_form.clone();
            set(&mut v, &l.ptr, &entry);
            translate::translate(&mut v, shape, &to_client(&store)).expect("to client");
            assert_eq!(v.pointer(&l.ptr), Some(&json!(entry)), "{shape} {}", l.ptr);
            let mut h = v.clone();
            translate::translate(&mut h, shape, &to_host(&store, "a")).expect("store entry to a");
            assert_eq!(h.pointer(&l.ptr), Some(&json!(entry)), "{shape} {}", l.ptr);
            assert!(
                translate::translate(&mut v, shape, &to_host(&store, "b")).is_err(),
                "{shape} {}: a's store entry accepted for b",
                l.ptr
            );
        }
    }
    assert!(uri_fields > 0, "no URI field in the table");
}

// ─── aliases, cursors and link ids ──────────────────────────────────────────

/// §4.2: a client-chosen URI has exactly one client name — the qualified form of its host name (`ahp-session:/b~mine-1`) is unknown (-32001) and cannot take over the verbatim subscription's envelopes.
#[tokio::test]
async fn a_client_chosen_uri_has_no_qualified_alias() {
    let t = TestRelay::start(vec![fast_config("a", 1), fast_config("b", 1)], "").await;
    let c = t.client_init("alice", "alias").await;
    let mine = "ahp-session:/mine-1";
    call(
        &c,
        "createSession",
        json!({"channel": mine, "provider": "sim.b"}),
    )
    .await
    .expect("createSession");
    let mut events = c.events();
    subscribe_raw(&c, mine).await;
    let alias = call(&c, "subscribe", json!({"channel": "ahp-session:/b~mine-1"})).await;
    c.dispatch(
        mine.into(),
        action(json!({"type": "session/titleChanged", "title": "T"})),
    )
    .await
    .expect("dispatch");
    let echo = actions_until(&mut events, |e| action_type(e) == "session/titleChanged")
        .await
        .pop()
        .expect("echo");
    assert_eq!(
        echo.channel, mine,
        "the echo of a dispatch on {mine} arrived under another name"
    );
    let e = alias.expect_err("the qualified alias of a client-chosen URI must be unknown");
    assert_eq!(e.code, -32001, "{e:?}");
}

/// §6.3: a cursor that is not a string is an unknown cursor (-32602), not "no cursor".
#[tokio::test]
async fn list_sessions_refuses_a_non_string_cursor() {
    let t = TestRelay::start(vec![fast_config("a", 2)], "").await;
    let c = t.client_init("alice", "cursor").await;
    for cursor in [json!(5), json!({"at": 1}), json!(["x"])] {
        let r = call(
            &c,
            "listSessions",
            json!({"channel": ROOT, "limit": 1, "cursor": cursor}),
        )
        .await;
        let e = r.expect_err("a non-string cursor must be refused");
        assert_eq!(e.code, -32602, "cursor {cursor}: {e:?}");
    }
}

/// §4.5: ids the relay originates are non-negative integers — also the link's keep-alive `ping` after `link_ping_secs` (here 1 s) of silence.
#[tokio::test]
async fn links_originate_only_integer_ids() {
    let t = TestRelay::start(
        vec![fast_config("a", 1)],
        "\n[limits]\nlink_ping_secs = 1\n",
    )
    .await;
    let c = t.client_init("alice", "quiet").await;
    subscribe_raw(&c, "ahp-session:/a~a-1").await;
    let up = t.upstream_id("alice", "quiet");
    let frames = || -> Vec<Value> {
        t.hosts[0]
            .received_from(&up)
            .iter()
            .map(|f| serde_json::from_str(&f.text).expect("JSON"))
            .collect()
    };
    wait_until("the link pings after 1 s of silence", || {
        frames().iter().any(|f| f["method"] == "ping")
    })
    .await;
    let frames = frames();
    for f in frames.iter().filter(|f| f.get("id").is_some()) {
        assert!(
            f["id"].is_u64(),
            "relay-originated id is not an integer: {f}"
        );
    }
}

/// `RunningRelay::stop` ("stops accepting and stops the watch links") leaves no connection to any host once its clients are gone.
#[tokio::test]
async fn relay_stop_closes_its_host_connections() {
    let t = TestRelay::start(vec![fast_config("a", 1), fast_config("b", 1)], "").await;
    let TestRelay {
        relay,
        hosts,
        kit: _kit,
    } = t;
    let gone = Arc::downgrade(&relay.relay);
    relay.stop();
    wait_until("the relay is dropped", || gone.strong_count() == 0).await;
    wait_until("hosts see no relay connection", || {
        hosts.iter().all(|h| h.connections() == 0)
    })
    .await;
}

/// A host that refuses every version the relay speaks (here a 2.x host) is
/// hidden: no agent, no session, and its URIs answer like nonexistent ones
/// (contract §4.1).
#[tokio::test]
async fn incompatible_host_is_hidden() {
    let old = SimHostConfig {
        protocol: ahp_relay::simhost::HostProtocol::V2,
        ..fast_config("old", 2)
    };
    let t = TestRelay::start_unchecked(vec![fast_config("a", 1), old], "", "").await;
    let relay = t.relay.relay.clone();
    use ahp_relay::upstream::hub::HostStatus;
    wait_until("old marked incompatible and a up", || {
        relay
            .hub("old")
            .is_some_and(|h| h.status() == HostStatus::Incompatible)
            && relay.hub("a").is_some_and(|h| h.status() == HostStatus::Up)
    })
    .await;
    let c = t.client_init("alice", "c").await;
    let list: ahp_types::commands::ListSessionsResult = c
        .request("listSessions", json!({"channel": "ahp-root://"}))
        .await
        .expect("list");
    let uris: Vec<&str> = list.items.iter().map(|s| s.resource.as_str()).collect();
    assert_eq!(uris, ["ahp-session:/a~a-1"]);
    let err = c
        .request::<_, Value>("subscribe", json!({"channel": "ahp-session:/old~old-1"}))
        .await
        .expect_err("hidden host");
    match err {
        ahp::ClientError::Rpc(e) => assert_eq!(e.code, -32001),
        other => panic!("unexpected {other:?}"),
    }
    let (snap, _) = c.subscribe("ahp-root://".into()).await.expect("root");
    let root = serde_json::to_value(snap.snapshot.expect("root snapshot").state).expect("json");
    let providers: Vec<&str> = root["agents"]
        .as_array()
        .expect("agents")
        .iter()
        .filter_map(|a| a["provider"].as_str())
        .collect();
    assert_eq!(providers, ["sim.a"]);
}

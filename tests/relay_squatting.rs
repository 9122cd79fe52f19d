//! Creates never adopt a host object (contract §4.2): a create naming a URI
//! the host already lists is refused with the host's own code before
//! anything is reserved, and a pending store entry grants no visibility, so
//! a create + subscribe + input sent in one TCP write cannot reach an
//! object the sender cannot see.

mod common;

use ahp_relay::devkit::{DEV_ISSUER, DevKit};
use ahp_relay::identity::PrincipalKey;
use common::relay::{TestRelay, admin_get, metric, rule, scratch_dir};
use common::*;
use serde_json::{Value, json};

/// alice and bob: operators who see only what they created (`own`).
fn rules() -> String {
    rule("alice", &["alice"], &["*"], "operator", "own", "")
        + &rule("bob", &["bob"], &["*"], "operator", "own", "")
}

/// Host `a` with one seeded session (`ahp-session:/a-1`, not created
/// through the relay) and two terminals claimed by it; the relay's
/// default host is `a`.
async fn start() -> TestRelay {
    let mut cfg = fast_config("a", 1);
    cfg.terminals = 2;
    let host = start_host(cfg).await;
    let kit = DevKit::create(&scratch_dir("squat")).expect("dev kit");
    let pairs = vec![(host.config().name.clone(), host.url())];
    let mut cfg = kit
        .config("127.0.0.1:0", &pairs, "", &rules())
        .expect("config validates");
    cfg.relay.default_host = Some("a".into());
    let relay = ahp_relay::run::start(cfg).await.expect("relay starts");
    let t = TestRelay {
        relay,
        hosts: vec![host],
        kit,
    };
    t.wait_hosts_up().await;
    t
}

fn request(id: u64, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

fn dispatch(channel: &str, seq: i64, action: Value) -> Value {
    json!({"jsonrpc": "2.0", "method": "dispatchAction",
        "params": {"channel": channel, "clientSeq": seq, "action": action}})
}

/// Frames until the answer to request `last`; everything before it.
async fn until_response(ws: &mut RawWs, last: u64) -> Vec<Value> {
    let mut seen = Vec::new();
    loop {
        let v = ws.recv_json().await.expect("socket open");
        let done = v.get("id") == Some(&json!(last));
        seen.push(v);
        if done {
            return seen;
        }
    }
}

fn answer(frames: &[Value], id: u64) -> Value {
    frames
        .iter()
        .find(|f| f.get("id") == Some(&json!(id)))
        .cloned()
        .unwrap_or_else(|| panic!("no answer to {id} in {frames:?}"))
}

fn upstream(t: &TestRelay, sub: &str, client_id: &str) -> String {
    let p = PrincipalKey {
        issuer: DEV_ISSUER.into(),
        subject: sub.into(),
    };
    t.relay.relay.upstream_id(&p, client_id)
}

/// Frames the host received from `client` that mention `needle`.
fn host_saw(t: &TestRelay, client: &str, needle: &str) -> Vec<String> {
    t.hosts[0]
        .received_from(client)
        .into_iter()
        .map(|f| f.text.to_string())
        .filter(|text| text.contains(needle))
        .collect()
}

/// Bob names the host's terminal 1 (claimed by a session he cannot see) as
/// the URI of a new client-claimed terminal, subscribes to it and types
/// into it, all in one write. The create gets the host's -32010 without
/// reaching the host, the subscribe answers like a terminal that does not
/// exist, the input is dropped without an echo, and the host's terminal
/// never sees bob's bytes. The same three frames on a fresh URI work (the
/// control: the test can tell the difference).
#[tokio::test]
async fn a_terminal_create_cannot_adopt_the_hosts_terminal() {
    let t = start().await;
    let mut bob = t.raw("bob").await;
    bob.initialize("bob-c").await;
    let claim = json!({"kind": "client", "clientId": "bob-c"});
    let squat = "ahp-terminal:/1";
    bob.send_at_once(&[
        request(
            1,
            "createTerminal",
            json!({"channel": squat, "claim": claim}),
        ),
        request(2, "subscribe", json!({"channel": squat})),
        dispatch(
            squat,
            1,
            json!({"type": "terminal/input", "data": "echo pwned\n"}),
        ),
        request(3, "ping", json!({"channel": "ahp-root://"})),
    ])
    .await;
    let frames = until_response(&mut bob, 3).await;
    assert_eq!(answer(&frames, 1)["error"]["code"], -32010, "{frames:?}");
    assert_eq!(answer(&frames, 2)["error"]["code"], -32008, "{frames:?}");
    assert!(
        answer(&frames, 2)["error"].get("data").is_none(),
        "answers like nothing: {frames:?}"
    );

    // The control: a free URI. A pending entry grants nothing, so the
    // creator too subscribes only once the host accepted the create.
    let mine = "ahp-terminal:/bob-t";
    let created = bob
        .request(
            4,
            "createTerminal",
            json!({"channel": mine, "claim": claim}),
        )
        .await;
    assert_eq!(created["result"], Value::Null, "{created}");
    bob.send_at_once(&[
        request(5, "subscribe", json!({"channel": mine})),
        dispatch(
            mine,
            2,
            json!({"type": "terminal/input", "data": "echo mine\n"}),
        ),
    ])
    .await;
    let mut frames = frames;
    frames.extend(until_response(&mut bob, 5).await);
    assert!(
        answer(&frames, 5)["result"]["snapshot"].is_object(),
        "{frames:?}"
    );
    // Frames to one host are forwarded in order: once bob's own input is
    // applied, an input forwarded before it would have been too.
    let bob_up = upstream(&t, "bob", "bob-c");
    wait_until("bob's own input reaches the host", || {
        !host_saw(&t, &bob_up, "echo mine").is_empty()
    })
    .await;
    assert_eq!(host_saw(&t, &bob_up, "pwned"), Vec::<String>::new());
    let host_term = t.hosts[0].channel_state(squat).expect("terminal 1");
    assert!(!host_term.to_string().contains("pwned"), "{host_term}");
    assert!(
        !frames.iter().any(|f| f.to_string().contains("pwned")),
        "no echo, no data from the host's terminal: {frames:?}"
    );
    let (_, page) = admin_get(&t, "/metrics").await;
    assert!(
        metric(&page, "ahp_relay_limit_hits_total{limit=\"host_object\"}") >= Some(1.0),
        "counted"
    );
}

/// Bob names the host's seeded session (an external session he cannot
/// see) in `createSession`, subscribes to it and renames it, in one write:
/// -32003 from the relay, the subscribe answers -32001 like nothing, the
/// rename never reaches the host. Alice, who sees nothing of it either,
/// meanwhile creates her own session normally.
#[tokio::test]
async fn a_session_create_cannot_adopt_an_external_session() {
    let t = start().await;
    let external = "ahp-session:/a-1";
    assert!(t.hosts[0].channel_state(external).is_some(), "seeded");
    let mut bob = t.raw("bob").await;
    bob.initialize("bob-c").await;
    bob.send_at_once(&[
        request(
            1,
            "createSession",
            json!({"channel": external, "provider": "sim.a"}),
        ),
        request(2, "subscribe", json!({"channel": external})),
        dispatch(
            external,
            1,
            json!({"type": "session/titleChanged", "title": "pwned"}),
        ),
        request(3, "ping", json!({"channel": "ahp-root://"})),
    ])
    .await;
    let frames = until_response(&mut bob, 3).await;
    assert_eq!(answer(&frames, 1)["error"]["code"], -32003, "{frames:?}");
    assert_eq!(answer(&frames, 2)["error"]["code"], -32001, "{frames:?}");

    let mut alice = t.raw("alice").await;
    alice.initialize("alice-c").await;
    let mine = "ahp-session:/alice-s";
    let created = alice
        .request(
            1,
            "createSession",
            json!({"channel": mine, "provider": "sim.a"}),
        )
        .await;
    assert_eq!(created["result"], Value::Null, "{created}");
    let sub = alice
        .request(2, "subscribe", json!({"channel": mine}))
        .await;
    assert!(sub["result"]["snapshot"].is_object(), "{sub}");

    // Bob's own session works the same way, and after it the host has
    // seen nothing of the rename.
    let own = "ahp-session:/bob-s";
    let created = bob
        .request(
            4,
            "createSession",
            json!({"channel": own, "provider": "sim.a"}),
        )
        .await;
    assert_eq!(created["result"], Value::Null, "{created}");
    let bob_up = upstream(&t, "bob", "bob-c");
    assert_eq!(host_saw(&t, &bob_up, "pwned"), Vec::<String>::new());
    assert_eq!(host_saw(&t, &bob_up, external), Vec::<String>::new());
    let state = t.hosts[0].channel_state(external).expect("session");
    assert!(!state.to_string().contains("pwned"), "{state}");
}

//! Every URI a client names is authorized against the object it belongs
//! to, whatever its scheme (contract §4.3, §4.4): a resource watch is its
//! creator's, a changeset derived from a session is that session's. Used by
//! the principal it belongs to, each works; used by another principal on
//! the same host — with the same permissions — each is refused as an
//! object that does not exist, and nothing reaches a host.

mod common;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use common::relay::{TestRelay, rule};
use common::*;
use serde_json::{Value, json};

const ROOT: &str = "ahp-root://";

/// Alice and bob: the same role (operator, `files:write` too) on the same
/// host, each seeing only what they created.
fn rules() -> String {
    let more = "permissions = [\"files:write\"]";
    rule("alice", &["alice"], &["*"], "operator", "own", more)
        + &rule("bob", &["bob"], &["*"], "operator", "own", more)
}

/// A watch on host `a`'s sandbox, made by alice's `createResourceWatch`, is
/// alice's: she subscribes and sees a write reported on it; bob, who may
/// watch files on `a` himself, subscribing to her watch URI gets -32008
/// (exactly the answer for a random watch URI) and no host sees his
/// subscribe.
#[tokio::test]
async fn a_resource_watch_is_its_creators() {
    let t = TestRelay::start(vec![fast_config("a", 1)], &rules()).await;
    let dir = format!("file://a{}", t.hosts[0].sandbox().display());
    let mut alice = t.raw("alice").await;
    alice.initialize("watch-alice").await;
    let r = alice
        .request(
            1,
            "createResourceWatch",
            json!({"channel": ROOT, "uri": dir, "recursive": true}),
        )
        .await;
    let watch = r["result"]["channel"]
        .as_str()
        .unwrap_or_else(|| panic!("a watch channel: {r}"))
        .to_string();
    assert!(watch.starts_with("ahp-resource-watch:/a~"), "{watch}");
    let r = alice
        .request(2, "subscribe", json!({"channel": watch}))
        .await;
    assert!(r.get("result").is_some(), "alice subscribes: {r}");
    let file = format!("{dir}/seen.txt");
    let w = json!({"channel": ROOT, "uri": file, "data": "x", "encoding": "utf-8"});
    // The change may be reported before the write's answer: read both.
    alice.send_json(&request_frame(3, "resourceWrite", w)).await;
    let (mut answered, mut reported) = (false, false);
    while !(answered && reported) {
        let f = alice.recv_json().await.expect("frames until both");
        if f["id"] == 3 {
            assert!(f.get("result").is_some(), "{f}");
            answered = true;
        } else if f["params"]["channel"] == watch.as_str()
            && f["params"]["action"]["type"] == "resourceWatch/changed"
        {
            assert_eq!(
                f["params"]["action"]["changes"]["items"][0]["uri"], file,
                "the write, in client form, on alice's watch: {f}"
            );
            reported = true;
        }
    }

    let mut bob = t.raw("bob").await;
    bob.initialize("watch-bob").await;
    let subscribes_before = host_frames(&t.hosts[0], "subscribe").len();
    let r = bob.request(1, "subscribe", json!({"channel": watch})).await;
    assert_eq!(r["error"]["code"], -32008, "{r}");
    let random = "ahp-resource-watch:/a~no-such-watch";
    let r2 = bob
        .request(2, "subscribe", json!({"channel": random}))
        .await;
    assert_eq!(r["error"], r2["error"], "as for a random watch URI");
    assert_eq!(
        host_frames(&t.hosts[0], "subscribe").len(),
        subscribes_before,
        "bob's subscribes reached no host"
    );
    // Bob's own watch works: the refusal is about whose watch it is.
    let r = bob
        .request(
            3,
            "createResourceWatch",
            json!({"channel": ROOT, "uri": dir}),
        )
        .await;
    let own = r["result"]["channel"].as_str().expect("bob's watch");
    let r = bob.request(4, "subscribe", json!({"channel": own})).await;
    assert!(r.get("result").is_some(), "{r}");
}

/// A turn whose attachment names a changeset of one's own session (VS
/// Code's `<session>/changeset/session`) or a canvas of one's own chat (VS
/// Code's `ahp-canvas:/<b64url(chat)>/<id>`) is forwarded; the same
/// attachments in bob's turn — objects of a session he cannot see — get a
/// rejection echo like a random URI's, and so does a spec-shaped
/// `ahp-changeset:` URI no channel ever showed him; nothing reaches a host.
#[tokio::test]
async fn a_changeset_uri_belongs_to_its_session() {
    let mut host = fast_config("a", 1);
    host.vscode_compat = true;
    let t = TestRelay::start(vec![host], &rules()).await;
    let mut alice = t.raw("alice").await;
    alice.initialize("cs-alice").await;
    let a_chat = own_session(&mut alice, "sim.a:/0a11ce00-0000-4000-8000-000000000001").await;
    let changeset = "sim.a:/0a11ce00-0000-4000-8000-000000000001/changeset/session";
    let echo = turn_with(&mut alice, &a_chat, 1, changeset).await;
    assert!(
        echo["params"].get("rejectionReason").is_none(),
        "alice's attachment of her own changeset: {echo}"
    );
    let host_turn = t.hosts[0]
        .received()
        .into_iter()
        .any(|f| f.text.contains(&changeset.replacen("sim.a:", "sim:", 1)));
    assert!(
        host_turn,
        "the host received alice's attachment in its form"
    );
    raw_actions_until(&mut alice, |e| {
        e.channel == a_chat && action_type(e) == "chat/turnComplete"
    })
    .await;
    // VS Code's canvas of her chat, `ahp-canvas:/<b64url(chat)>/<id>` as
    // the host names it (the chat inside in the host's form, qualified by
    // its host in front), is hers too.
    let host_chat = format!(
        "ahp-chat://default/{}",
        URL_SAFE_NO_PAD.encode("sim:/0a11ce00-0000-4000-8000-000000000001")
    );
    let canvas = format!(
        "ahp-canvas:/a~{}/1",
        URL_SAFE_NO_PAD.encode(host_chat.as_bytes())
    );
    let echo = turn_with(&mut alice, &a_chat, 2, &canvas).await;
    assert!(
        echo["params"].get("rejectionReason").is_none(),
        "alice's attachment of her chat's canvas: {echo}"
    );

    let mut bob = t.raw("bob").await;
    bob.initialize("cs-bob").await;
    let b_chat = own_session(&mut bob, "sim.a:/0b0b0000-0000-4000-8000-000000000002").await;
    t.hosts[0].clear_record();
    let mut reasons = Vec::new();
    for (seq, uri) in [
        (1, changeset),
        (
            2,
            "sim.a:/0a11ce00-0000-4000-8000-000000000009/changeset/session",
        ),
        (3, "ahp-changeset:/a~alice-turn-1"),
        (4, canvas.as_str()),
    ] {
        let echo = turn_with(&mut bob, &b_chat, seq, uri).await;
        let reason = echo["params"]["rejectionReason"]
            .as_str()
            .unwrap_or_else(|| panic!("bob's attachment of {uri} was accepted: {echo}"))
            .to_string();
        reasons.push(reason);
    }
    assert_eq!(reasons[0], reasons[1], "alice's changeset vs a random one");
    assert!(reasons[2].contains("unknown URI"), "{}", reasons[2]);
    assert_eq!(reasons[0], reasons[3], "alice's canvas as her changeset");
    let leaked = t.hosts[0]
        .received()
        .into_iter()
        .any(|f| f.text.contains("changeset") || f.text.contains("ahp-canvas"));
    assert!(!leaked, "no refused attachment reached the host");
}

/// Creates session `uri` on host `a` and subscribes to its derived
/// default chat; returns the chat.
async fn own_session(ws: &mut RawWs, uri: &str) -> String {
    let r = ws
        .request(
            90,
            "createSession",
            json!({"channel": uri, "provider": "sim.a"}),
        )
        .await;
    assert!(r.get("error").is_none(), "{r}");
    let chat = format!(
        "ahp-chat://default/{}",
        URL_SAFE_NO_PAD.encode(uri.as_bytes())
    );
    let r = ws.request(91, "subscribe", json!({"channel": chat})).await;
    assert!(r.get("result").is_some(), "{r}");
    chat
}

/// Dispatches a turn on `chat` attaching `uri` as a resource and returns
/// its echo.
async fn turn_with(ws: &mut RawWs, chat: &str, seq: i64, uri: &str) -> Value {
    let mut turn = turn_started(&format!("cs-{seq}"), "what changed?");
    turn["message"]["attachments"] = json!([{"type": "resource", "label": "changes", "uri": uri}]);
    ws.dispatch(chat, seq, turn).await;
    loop {
        let f = ws.recv_json().await.expect("frames until the echo");
        let p = &f["params"];
        if f["method"] == "action"
            && p["channel"] == chat
            && p["origin"]["clientSeq"] == seq
            && p["action"]["type"] == "chat/turnStarted"
        {
            return f;
        }
    }
}

//! Host → client requests through the relay (contract §4.5): a host's
//! `resourceRead` on a per-client link reaches only that link's client under
//! a relay-assigned integer id, and the client's answer goes back to the
//! host under the host's own id.

mod common;

use std::time::Duration;

use ahp_relay::devkit::DEV_ISSUER;
use ahp_relay::identity::PrincipalKey;
use common::relay::TestRelay;
use common::*;
use serde_json::json;

#[tokio::test]
async fn host_request_reaches_only_its_client_and_the_answer_returns() {
    let t = TestRelay::start(vec![fast_config("alpha", 1)], "").await;
    let mut a = t.raw("alice").await;
    a.initialize("ca").await;
    let mut b = t.raw("bob").await;
    b.initialize("cb").await;
    for ws in [&mut a, &mut b] {
        let r = ws
            .request(
                1,
                "subscribe",
                json!({"channel": "ahp-session:/alpha~alpha-1"}),
            )
            .await;
        assert!(r.get("result").is_some(), "subscribe answered: {r}");
    }
    let alice = PrincipalKey {
        issuer: DEV_ISSUER.into(),
        subject: "alice".into(),
    };
    let upstream_a = t.relay.relay.upstream_id(&alice, "ca");
    assert!(upstream_a.starts_with("r1."));
    let host = &t.hosts[0];
    let ask = host.ask_client(
        &upstream_a,
        "resourceRead",
        json!({"channel": "ahp-root://", "uri": "virtual://client/x.txt"}),
        Duration::from_secs(5),
    );
    let serve = async {
        let req = a
            .recv_json()
            .await
            .expect("alice receives the host's request");
        assert_eq!(req["method"], "resourceRead");
        assert!(req["id"].is_u64(), "relay-assigned integer id: {req}");
        assert_eq!(
            req["params"]["uri"], "virtual://client/x.txt",
            "client-published URIs are not rewritten"
        );
        let reply = response_frame(&req["id"], json!({"data": "aGk=", "encoding": "base64"}));
        a.send_json(&reply).await;
    };
    let (answer, ()) = tokio::join!(ask, serve);
    let answer = answer.expect("the host gets the client's answer");
    assert_eq!(answer["result"]["data"], "aGk=");
    assert!(answer["id"].is_u64(), "answered under the host's own id");
    // Bob received nothing: no frame reaches him before his ping's answer.
    let before = frames_before_ping(&mut b, 9).await;
    assert!(
        before.is_empty(),
        "bob got another client's request: {before:?}"
    );
}

/// §4.5, §5.8: a host's request belongs to the connection that carried it.
/// When the link's connection drops and the link resumes on a new one, the
/// client's late answer is dropped rather than written on the new
/// connection, where the host's ids start again (it would answer another
/// request of the host's under the same id). Before, it went to whichever
/// connection the link had when the answer came.
#[tokio::test]
async fn a_host_request_is_answered_only_on_the_connection_that_asked() {
    let t = TestRelay::start(vec![fast_config("alpha", 1)], "").await;
    let mut a = t.raw("alice").await;
    a.initialize("ca").await;
    let session = json!({"channel": "ahp-session:/alpha~alpha-1"});
    let r = a.request(1, "subscribe", session).await;
    assert!(r.get("result").is_some(), "subscribe answered: {r}");
    let up = t.upstream_id("alice", "ca");
    let host = &t.hosts[0];
    // A connection's first frame is recorded before it names its client.
    let resumes = || {
        let frames = host.received();
        let resumed = |f: &&ahp_relay::simhost::FrameRecord| {
            matches!(f.method.as_deref(), Some("reconnect" | "initialize")) && f.text.contains(&up)
        };
        frames.iter().filter(resumed).count()
    };
    let ask = host.ask_client(
        &up,
        "resourceRead",
        json!({"channel": "ahp-root://", "uri": "virtual://client/x.txt"}),
        Duration::from_secs(3),
    );
    let serve = async {
        let req = a.recv_json().await.expect("the host's request");
        assert_eq!(req["method"], "resourceRead", "{req}");
        let before = resumes();
        assert_eq!(host.drop_client(&up), 1, "the link's connection is cut");
        wait_until("the link resumes on a new connection", || {
            resumes() > before
        })
        .await;
        let reply = response_frame(&req["id"], json!({"data": "aGk=", "encoding": "base64"}));
        a.send_json(&reply).await;
        a.request(2, "ping", json!({"channel": "ahp-root://"}))
            .await;
    };
    let (answer, ()) = tokio::join!(ask, serve);
    assert!(
        answer.is_none(),
        "answered on another connection: {answer:?}"
    );
}

//! A create whose answer is lost keeps its owner (contract §4.2, §7.6,
//! issue 18): the host answers after the relay gave up (a timeout), the
//! store entry stays pending, and once the host lists the session the entry
//! is confirmed from that list — the creator sees it, and a user who sees
//! only sessions created outside the relay does not.

mod common;

use ahp_relay::names::store::{Owner, Quota, UriEntry};
use common::relay::{TestRelay, rule};
use common::*;
use serde_json::{Value, json};

async fn listed(ws: &mut RawWs, id: u64) -> Vec<String> {
    listed_uris(ws, id).await
}

/// Alice operates and sees her own sessions; eve views her own and those
/// made outside the relay.
fn alice_and_eve() -> String {
    rule("alice", &["alice"], &["*"], "operator", "own", "")
        + &rule(
            "eve",
            &["eve"],
            &["*"],
            "viewer",
            "own",
            "external_sessions = true",
        )
}

#[tokio::test]
async fn a_create_answered_late_stays_its_creators() {
    let rules = alice_and_eve();
    let limits = "\n[limits]\nupstream_request_secs = 1\npending_create_check_secs = 1\n";
    let t = TestRelay::start(vec![fast_config("a", 1)], &(rules + limits)).await;
    let mut alice = t.raw("alice").await;
    alice.initialize("late").await;
    t.hosts[0].set_stalled(true);
    let uri = "ahp-session:/late-1";
    let r = alice
        .request(
            1,
            "createSession",
            json!({"channel": uri, "provider": "sim.a"}),
        )
        .await;
    assert_eq!(r["error"]["data"]["reason"], "timeout", "{r}");
    // Past the timeout and two settle rounds: the entry stays pending (the
    // relay used to release it at the timeout) while the host may still
    // read the create.
    let store = t.relay.relay.store.clone();
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    let pending = store.lookup(uri).ok().flatten().map(|e| e.state);
    assert_eq!(pending, Some(ahp_relay::names::store::UriState::Pending));
    // The host makes it after all.
    t.hosts[0].set_stalled(false);
    wait_until("the late create is confirmed from the host's list", || {
        store.lookup(uri).ok().flatten().is_some_and(|e| {
            e.state == ahp_relay::names::store::UriState::Confirmed && e.owner.subject == "alice"
        })
    })
    .await;
    assert!(listed(&mut alice, 2).await.iter().any(|u| u == uri));
    let mut eve = t.raw("eve").await;
    eve.initialize("eve").await;
    let seen = listed(&mut eve, 1).await;
    assert!(
        !seen.iter().any(|u| u == uri),
        "alice's late session shown as external to eve: {seen:?}"
    );
    assert!(seen.iter().any(|u| u == "ahp-session:/a~a-1"), "{seen:?}");
}

/// A create lost while the host never makes the object: the pending entry
/// is released once `pending_create_release_secs` passed without the host
/// listing it, so the name is free.
#[tokio::test]
async fn a_create_the_host_never_made_frees_its_name() {
    let limits = "\n[limits]\nupstream_request_secs = 1\npending_create_check_secs = 1\n\
                  pending_create_release_secs = 3\n";
    let t = TestRelay::start(vec![fast_config("a", 1)], limits).await;
    let store = t.relay.relay.store.clone();
    let uri = "ahp-session:/never-1";
    let owner = ahp_relay::names::store::Owner {
        issuer: ahp_relay::devkit::DEV_ISSUER.into(),
        subject: "alice".into(),
        groups: vec![],
    };
    // A reservation whose create never reached the host (a relay that
    // stopped right after reserving).
    store
        .reserve(uri, "a", &owner, ahp_relay::identity::unix_now() - 5)
        .expect("reserve");
    wait_until("the lost reservation is released", || {
        store.lookup(uri).ok().flatten().is_none()
    })
    .await;
}

/// §4.2, §7.6: while a create is unanswered its store entry is pending, and
/// the session the host already lists is either the creator's new one or
/// one the host had before: it is shown only to whom it would be shown as
/// either. Eve, who sees sessions made outside the relay but only her own
/// of the relay's, cannot subscribe to alice's session while alice's create
/// waits for its answer. Before, the pending entry counted as no owner at
/// all, and eve got the session's snapshot as an external one's.
#[tokio::test]
async fn a_session_whose_create_is_unanswered_is_not_shown_as_external() {
    let rules = alice_and_eve();
    let t = TestRelay::start(vec![fast_config("a", 1)], &rules).await;
    let mut alice = t.raw("alice").await;
    alice.initialize("unanswered").await;
    let upstream = t.upstream_id("alice", "unanswered");
    t.hosts[0].silent_instead_of_answering(&upstream, "createSession");
    let uri = "ahp-session:/unanswered-1";
    let create = json!({"channel": uri, "provider": "sim.a"});
    alice
        .send_json(&request_frame(1, "createSession", create))
        .await;
    let mut n = 10;
    loop {
        n += 1;
        if listed(&mut alice, n).await.iter().any(|u| u == uri) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let store = t.relay.relay.store.clone();
    let state = store.lookup(uri).ok().flatten().map(|e| e.state);
    assert_eq!(state, Some(ahp_relay::names::store::UriState::Pending));
    let mut eve = t.raw("eve").await;
    eve.initialize("eve").await;
    let r = eve.request(1, "subscribe", json!({"channel": uri})).await;
    assert!(
        r.get("result").is_none(),
        "alice's session shown to eve: {r}"
    );
    let external = json!({"channel": "ahp-session:/a~a-1"});
    let r = eve.request(2, "subscribe", external).await;
    assert!(
        r.get("result").is_some(),
        "external sessions still shown: {r}"
    );
}

/// A store whose reads can be made to fail (a disk error, a database that
/// cannot be reached), writes going through.
struct Unreadable {
    inner: ahp_relay::names::store::RedbStore,
    failing: std::sync::atomic::AtomicBool,
}

type Res<T> = Result<T, ahp_relay::names::store::StoreError>;

impl ahp_relay::names::store::UriStore for Unreadable {
    fn reserve(&self, u: &str, h: &str, o: &Owner, t: u64) -> Res<()> {
        self.inner.reserve(u, h, o, t)
    }
    fn reserve_within(&self, u: &str, h: &str, o: &Owner, t: u64, q: Quota) -> Res<()> {
        self.inner.reserve_within(u, h, o, t, q)
    }
    fn confirm(&self, uri: &str) -> Res<()> {
        self.inner.confirm(uri)
    }
    fn release(&self, uri: &str) -> Res<()> {
        self.inner.release(uri)
    }
    fn tombstone(&self, uri: &str, now: u64, ttl_secs: u64) -> Res<()> {
        self.inner.tombstone(uri, now, ttl_secs)
    }
    fn lookup(&self, uri: &str) -> Res<Option<UriEntry>> {
        if self.failing.load(std::sync::atomic::Ordering::SeqCst) {
            let down = "the test made reads fail".to_string();
            return Err(ahp_relay::names::store::StoreError::Unavailable(down));
        }
        self.inner.lookup(uri)
    }
    fn entries_for_host(&self, host: &str) -> Res<Vec<UriEntry>> {
        self.inner.entries_for_host(host)
    }
    fn purge_expired(&self, now: u64) -> Res<usize> {
        self.inner.purge_expired(now)
    }
    fn health(&self) -> Res<()> {
        self.inner.health()
    }
}

/// §7.6: who may see a listed session the relay created rests on its store
/// entry; while the store cannot be read, that decision fails closed.
/// Alice's session named by her client (`sim.a:/…`, routed by its shape
/// alone) stays hidden from eve, who sees sessions made outside the relay
/// but only her own of the relay's, when the store's reads fail. Before,
/// an unreadable entry counted as none, and eve got alice's session as an
/// external one.
#[tokio::test]
async fn a_session_is_not_shown_as_external_while_the_store_is_unreadable() {
    let rules = alice_and_eve();
    let store = std::sync::Arc::new(Unreadable {
        inner: ahp_relay::names::store::RedbStore::open_in_memory().expect("store"),
        failing: std::sync::atomic::AtomicBool::new(false),
    });
    let shared = store.clone() as std::sync::Arc<dyn ahp_relay::names::store::UriStore>;
    let hosts = vec![fast_config("a", 1)];
    let t = TestRelay::start_on_store(hosts, "", &rules, |_| {}, Some(shared)).await;
    t.wait_hosts_up().await;
    let mut alice = t.raw("alice").await;
    alice.initialize("named").await;
    let uri = "sim.a:/alices-own-1";
    let create = json!({"channel": uri, "provider": "sim.a"});
    let r = alice.request(1, "createSession", create).await;
    assert_eq!(r["result"], Value::Null, "{r}");
    let mut eve = t.raw("eve").await;
    eve.initialize("eve").await;
    let r = eve.request(1, "subscribe", json!({"channel": uri})).await;
    assert!(
        r.get("result").is_none(),
        "alice's session shown to eve: {r}"
    );
    store
        .failing
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let r = eve.request(2, "subscribe", json!({"channel": uri})).await;
    assert!(r.get("result").is_none(), "shown while unreadable: {r}");
    let seen = listed(&mut eve, 3).await;
    assert!(!seen.iter().any(|u| u == uri), "listed to eve: {seen:?}");
    // Readable again: the sessions made outside the relay are hers to see.
    store
        .failing
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let seen = listed(&mut eve, 4).await;
    assert!(!seen.iter().any(|u| u == uri), "listed to eve: {seen:?}");
    assert!(seen.iter().any(|u| u == "ahp-session:/a~a-1"), "{seen:?}");
}

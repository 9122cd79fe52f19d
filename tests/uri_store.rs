//! The URI store's contract (contract §4.2, §7.4, §12.1), run against both
//! backends: redb (a file) and PostgreSQL (a throwaway cluster; skipped with
//! a notice where PostgreSQL is not installed). Every case of [`CASES`] runs
//! on each; [`SHARED_CASES`] need two store instances on one database — two
//! replicas — and run on PostgreSQL only. Also: redb's file lock and open
//! errors, PostgreSQL going away and coming back, and a small benchmark
//! (`cargo test --release --test uri_store -- --ignored --nocapture`).

mod common;

use std::path::{Path, PathBuf};
use std::sync::Barrier;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ahp_relay::names::pg::{PgOptions, PgStore};
use ahp_relay::names::store::{Owner, Quota, RedbStore, StoreError, UriEntry, UriState, UriStore};
use common::postgres::Postgres;
use common::reserved_port;

const DAY: u64 = 24 * 60 * 60;
const TTL: u64 = 30 * DAY;

/// Opens another instance of the store under test on the same storage.
type Open<'a> = dyn Fn() -> Box<dyn UriStore> + 'a;

/// A contract case and its name.
type Case = (&'static str, fn(&Open));

/// Cases every backend passes, each on fresh storage.
const CASES: &[Case] = &[
    ("lifecycle", lifecycle_reserve_confirm_tombstone),
    ("release", release_frees_a_pending_name),
    (
        "lost response",
        pending_entry_can_be_tombstoned_after_a_lost_response,
    ),
    (
        "tombstone expiry",
        tombstone_blocks_reuse_until_it_expires_then_purge_removes_it,
    ),
    (
        "entries for host",
        entries_for_host_lists_every_state_sorted,
    ),
    ("reopen", entries_survive_reopen_and_mirror_agrees),
    ("race", concurrent_reserves_have_exactly_one_winner),
    ("quota", quota_counts_live_entries_of_one_principal),
    ("refusals", refused_operations_change_nothing),
    ("ttl saturates", ttl_saturates),
    ("health", health_is_ok_and_errors_classify),
];

/// Cases with two instances open at once on one database (two replicas).
const SHARED_CASES: &[Case] = &[
    (
        "race across replicas",
        reserves_on_two_replicas_have_one_winner,
    ),
    ("quota across replicas", quota_holds_across_replicas),
    (
        "purge by two replicas",
        two_replicas_purge_each_tombstone_once,
    ),
    (
        "lookup on another replica",
        a_replica_sees_what_another_wrote,
    ),
];

#[test]
fn contract_on_redb() {
    for (name, case) in CASES {
        let dir = TempDir::new("contract");
        let path = dir.file();
        eprintln!("redb: {name}");
        case(&|| Box::new(RedbStore::open(&path).unwrap()) as Box<dyn UriStore>);
    }
}

#[test]
fn contract_on_postgres() {
    let Some(pg) = Postgres::start("contract") else {
        return;
    };
    for (i, (name, case)) in CASES.iter().chain(SHARED_CASES).enumerate() {
        let options = pg_options(&pg, &format!("case{i}"));
        eprintln!("postgres: {name}");
        case(&|| Box::new(PgStore::open(&options).unwrap()) as Box<dyn UriStore>);
    }
}

/// Options for a fresh database `db` of `pg`, with the password from a file
/// as a relay reads it.
fn pg_options(pg: &Postgres, db: &str) -> PgOptions {
    let url = pg.create_db(db);
    let password = std::fs::read_to_string(pg.password_file()).unwrap();
    PgOptions {
        url,
        password: Some(password.trim_end().to_owned()),
        ca_file: None,
    }
}

/// Waits (polling, at most 10 s) until `cond` holds: a replica's mirror
/// follows another's writes after a notification, not at once.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < until, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn quota(live: usize, tombstones: usize) -> Quota {
    Quota { live, tombstones }
}

fn alice() -> Owner {
    Owner {
        issuer: "https://idp.example".into(),
        subject: "alice".into(),
        groups: vec!["team-a".into()],
    }
}

fn bob() -> Owner {
    Owner {
        issuer: "https://idp.example".into(),
        subject: "bob".into(),
        groups: Vec::new(),
    }
}

fn state(store: &dyn UriStore, uri: &str) -> Option<UriState> {
    store.lookup(uri).unwrap().map(|entry| entry.state)
}

/// A directory under the system temp dir, unique to this test run, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let path = std::env::temp_dir().join(format!(
            "ahp-relay-{name}-{}-{nanos}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&path).unwrap();
        TempDir(path)
    }

    fn file(&self) -> PathBuf {
        self.0.join("uris.redb")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn lifecycle_reserve_confirm_tombstone(open: &Open) {
    let store = open();
    let store = store.as_ref();
    let uri = "ahp-session:/s1";

    store.reserve(uri, "host-a", &alice(), 100).unwrap();
    let entry = store.lookup(uri).unwrap().unwrap();
    assert_eq!(
        entry,
        UriEntry {
            uri: uri.into(),
            host: "host-a".into(),
            state: UriState::Pending,
            owner: alice(),
            created_at: 100,
        }
    );

    // Pending blocks everyone, on every host.
    let taken = Err(StoreError::Taken {
        host: "host-a".into(),
    });
    assert_eq!(store.reserve(uri, "host-b", &bob(), 101), taken);
    assert_eq!(store.reserve(uri, "host-a", &alice(), 101), taken);

    store.confirm(uri).unwrap();
    assert_eq!(state(store, uri), Some(UriState::Confirmed));
    assert_eq!(store.reserve(uri, "host-b", &bob(), 102), taken);

    store.tombstone(uri, 200, TTL).unwrap();
    assert_eq!(
        state(store, uri),
        Some(UriState::Tombstone { until: 200 + TTL })
    );
    assert_eq!(store.reserve(uri, "host-b", &bob(), 200 + TTL - 1), taken);
}

fn release_frees_a_pending_name(open: &Open) {
    let store = open();
    let store = store.as_ref();
    let uri = "ahp-chat:/c1";
    store.reserve(uri, "host-a", &alice(), 1).unwrap();
    store.release(uri).unwrap();
    assert_eq!(store.lookup(uri).unwrap(), None);
    assert_eq!(store.release(uri), Err(StoreError::NotFound));

    store.reserve(uri, "host-b", &bob(), 2).unwrap();
    let entry = store.lookup(uri).unwrap().unwrap();
    assert_eq!((entry.host.as_str(), entry.owner), ("host-b", bob()));
}

fn pending_entry_can_be_tombstoned_after_a_lost_response(open: &Open) {
    let store = open();
    let store = store.as_ref();
    let uri = "ahp-terminal:/t1";
    store.reserve(uri, "host-a", &alice(), 1).unwrap();
    store.tombstone(uri, 10, TTL).unwrap();
    assert_eq!(
        state(store, uri),
        Some(UriState::Tombstone { until: 10 + TTL })
    );
}

fn tombstone_blocks_reuse_until_it_expires_then_purge_removes_it(open: &Open) {
    let store = open();
    let store = store.as_ref();
    let (old, young, live) = (
        "ahp-session:/old",
        "ahp-session:/young",
        "ahp-session:/live",
    );
    for uri in [old, young, live] {
        store.reserve(uri, "host-a", &alice(), 0).unwrap();
        store.confirm(uri).unwrap();
    }
    store.tombstone(old, 10, 100).unwrap(); // until 110
    store.tombstone(young, 50, 100).unwrap(); // until 150

    let taken = Err(StoreError::Taken {
        host: "host-a".into(),
    });
    assert_eq!(store.reserve(old, "host-b", &bob(), 109), taken);
    assert_eq!(store.purge_expired(109), Ok(0));
    assert_eq!(state(store, old), Some(UriState::Tombstone { until: 110 }));

    assert_eq!(store.purge_expired(110), Ok(1));
    assert_eq!(store.lookup(old).unwrap(), None);
    assert_eq!(
        state(store, young),
        Some(UriState::Tombstone { until: 150 })
    );
    assert_eq!(state(store, live), Some(UriState::Confirmed));
    assert_eq!(store.purge_expired(110), Ok(0));

    // An expired tombstone does not block a reserve even before it is purged.
    assert_eq!(store.reserve(young, "host-a", &alice(), 149), taken);
    store.reserve(young, "host-b", &bob(), 150).unwrap();
    let entry = store.lookup(young).unwrap().unwrap();
    assert_eq!(entry.state, UriState::Pending);
    assert_eq!((entry.host.as_str(), entry.owner), ("host-b", bob()));
    assert_eq!(entry.created_at, 150);
    assert_eq!(store.purge_expired(u64::MAX), Ok(0));
}

fn entries_for_host_lists_every_state_sorted(open: &Open) {
    let store = open();
    let store = store.as_ref();
    store
        .reserve("ahp-session:/b", "host-a", &alice(), 1)
        .unwrap();
    store
        .reserve("ahp-session:/a", "host-a", &alice(), 1)
        .unwrap();
    store.reserve("ahp-chat:/x", "host-b", &bob(), 1).unwrap();
    store.confirm("ahp-session:/a").unwrap();
    store
        .reserve("ahp-terminal:/t", "host-a", &bob(), 1)
        .unwrap();
    store.tombstone("ahp-terminal:/t", 2, TTL).unwrap();

    let uris = |host: &str| -> Vec<(String, UriState)> {
        store
            .entries_for_host(host)
            .unwrap()
            .into_iter()
            .map(|entry| (entry.uri, entry.state))
            .collect()
    };
    assert_eq!(
        uris("host-a"),
        vec![
            ("ahp-session:/a".into(), UriState::Confirmed),
            ("ahp-session:/b".into(), UriState::Pending),
            (
                "ahp-terminal:/t".into(),
                UriState::Tombstone { until: 2 + TTL }
            ),
        ]
    );
    assert_eq!(
        uris("host-b"),
        vec![("ahp-chat:/x".into(), UriState::Pending)]
    );
    assert_eq!(uris("host-c"), vec![]);
}

fn all_entries(store: &dyn UriStore) -> Vec<UriEntry> {
    let mut all = store.entries_for_host("host-a").unwrap();
    all.extend(store.entries_for_host("host-b").unwrap());
    all
}

fn entries_survive_reopen_and_mirror_agrees(open: &Open) {
    let before = {
        let store = open();
        let store = store.as_ref();
        store
            .reserve("ahp-session:/p", "host-a", &alice(), 1)
            .unwrap();
        store
            .reserve("ahp-session:/c", "host-a", &alice(), 2)
            .unwrap();
        store.confirm("ahp-session:/c").unwrap();
        store.reserve("ahp-chat:/t", "host-b", &bob(), 3).unwrap();
        store.tombstone("ahp-chat:/t", 4, 10).unwrap();
        store.reserve("ahp-chat:/r", "host-b", &bob(), 5).unwrap();
        store.release("ahp-chat:/r").unwrap();
        // A refused reserve leaves no trace either.
        assert!(
            store
                .reserve("ahp-session:/p", "host-b", &bob(), 6)
                .is_err()
        );
        all_entries(store)
    };
    assert_eq!(before.len(), 3);

    let store = open();
    assert_eq!(all_entries(store.as_ref()), before);
    for entry in &before {
        assert_eq!(store.lookup(&entry.uri).unwrap().as_ref(), Some(entry));
    }
    assert_eq!(store.lookup("ahp-chat:/r").unwrap(), None);
    assert_eq!(store.health(), Ok(()));

    // Writes after a reopen are durable too.
    assert_eq!(store.purge_expired(14), Ok(1));
    store.confirm("ahp-session:/p").unwrap();
    drop(store);
    let store = open();
    assert_eq!(store.lookup("ahp-chat:/t").unwrap(), None);
    assert_eq!(
        state(store.as_ref(), "ahp-session:/p"),
        Some(UriState::Confirmed)
    );
    assert_eq!(all_entries(store.as_ref()).len(), 2);
}

/// Reserves `uri` from 8 threads at once, thread `i` on `stores[i % n]`
/// for host `host-i`; asserts exactly one winner and that every loser was
/// told the winner's host; returns the winner.
fn race(stores: &[&dyn UriStore], uri: &str) -> String {
    const THREADS: usize = 8;
    let barrier = Barrier::new(THREADS);
    let results: Vec<(String, Result<(), StoreError>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|i| {
                let barrier = &barrier;
                let store = stores[i % stores.len()];
                scope.spawn(move || {
                    let host = format!("host-{i}");
                    barrier.wait();
                    let result = store.reserve(uri, &host, &alice(), 1);
                    (host, result)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let winners: Vec<&String> = results
        .iter()
        .filter(|(_, result)| result.is_ok())
        .map(|(host, _)| host)
        .collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    let winner = winners[0].clone();
    for (_, result) in &results {
        if let Err(error) = result {
            assert_eq!(
                error,
                &StoreError::Taken {
                    host: winner.clone()
                }
            );
        }
    }
    winner
}

fn concurrent_reserves_have_exactly_one_winner(open: &Open) {
    {
        let store = open();
        for i in 0..20 {
            let uri = format!("ahp-session:/race-{i}");
            let winner = race(&[store.as_ref()], &uri);
            assert_eq!(store.lookup(&uri).unwrap().unwrap().host, winner);
        }
    }
    // The winners are what was committed.
    let store = open();
    let total: usize = (0..8)
        .map(|i| store.entries_for_host(&format!("host-{i}")).unwrap().len())
        .sum();
    assert_eq!(total, 20);
}

fn quota_counts_live_entries_of_one_principal(open: &Open) {
    let store = open();
    let alice = alice();
    store
        .reserve_within("ahp-chat:/1", "a", &alice, 1, quota(2, 2))
        .unwrap();
    store
        .reserve_within("ahp-chat:/2", "a", &alice, 1, quota(2, 2))
        .unwrap();
    assert_eq!(
        store.reserve_within("ahp-chat:/3", "a", &alice, 1, quota(2, 2)),
        Err(StoreError::Quota { max: 2 })
    );
    store
        .reserve_within("ahp-chat:/3", "a", &bob(), 1, quota(2, 2))
        .unwrap();
    // A tombstone frees a place in the live quota (the name stays taken)…
    store.tombstone("ahp-chat:/1", 2, 100).unwrap();
    store
        .reserve_within("ahp-chat:/4", "a", &alice, 3, quota(2, 2))
        .unwrap();
    assert_eq!(store.lookup("ahp-chat:/3").unwrap().unwrap().owner, bob());
    // …and counts in its own bound: a create/dispose loop stops there.
    store.tombstone("ahp-chat:/2", 3, 100).unwrap();
    assert_eq!(
        store.reserve_within("ahp-chat:/5", "a", &alice, 4, quota(2, 2)),
        Err(StoreError::TombstoneQuota { max: 2 })
    );
    // Purged tombstones free it again.
    assert_eq!(store.purge_expired(200).unwrap(), 2);
    store
        .reserve_within("ahp-chat:/5", "a", &alice, 201, quota(2, 2))
        .unwrap();
}

fn refused_operations_change_nothing(open: &Open) {
    let store = open();
    let uri = "ahp-session:/s";
    assert_eq!(store.confirm(uri), Err(StoreError::NotFound));
    assert_eq!(store.release(uri), Err(StoreError::NotFound));
    assert_eq!(store.tombstone(uri, 0, 10), Err(StoreError::NotFound));
    assert_eq!(store.lookup(uri), Ok(None));

    store.reserve(uri, "a", &alice(), 1).unwrap();
    store.confirm(uri).unwrap();
    store.confirm(uri).unwrap();
    assert_eq!(store.release(uri), Err(StoreError::NotFound));
    store.tombstone(uri, 5, 10).unwrap();
    store.tombstone(uri, 9, 100).unwrap();
    assert_eq!(store.confirm(uri), Err(StoreError::NotFound));
    assert_eq!(store.release(uri), Err(StoreError::NotFound));
    let entry = store.lookup(uri).unwrap().unwrap();
    assert_eq!(entry.state, UriState::Tombstone { until: 15 });
    assert_eq!(entry.created_at, 1);
    assert_eq!(entry.owner, alice());
}

fn ttl_saturates(open: &Open) {
    let store = open();
    store.reserve("ahp-chat:/c", "a", &alice(), 1).unwrap();
    store.tombstone("ahp-chat:/c", u64::MAX - 1, 10).unwrap();
    let entry = store.lookup("ahp-chat:/c").unwrap().unwrap();
    assert_eq!(entry.state, UriState::Tombstone { until: u64::MAX });
    // It never expires: no purge removes it.
    assert_eq!(store.purge_expired(u64::MAX - 1), Ok(0));
    drop(store);
    let entry = open().lookup("ahp-chat:/c").unwrap().unwrap();
    assert_eq!(entry.state, UriState::Tombstone { until: u64::MAX });
}

fn health_is_ok_and_errors_classify(open: &Open) {
    let store = open();
    assert_eq!(store.health(), Ok(()));
    assert!(StoreError::Unavailable("x".into()).is_unavailable());
    assert!(!StoreError::NotFound.is_unavailable());
    assert!(!StoreError::Taken { host: "a".into() }.is_unavailable());
}

fn reserves_on_two_replicas_have_one_winner(open: &Open) {
    let (a, b) = (open(), open());
    for i in 0..20 {
        let uri = format!("ahp-session:/pair-{i}");
        let winner = race(&[a.as_ref(), b.as_ref()], &uri);
        for replica in [&a, &b] {
            eventually("both replicas name the winner", || {
                replica.lookup(&uri).unwrap().map(|e| e.host) == Some(winner.clone())
            });
        }
    }
}

/// Ten reserves of one principal at once, alternating between `stores`,
/// with room for three: returns which of `ahp-chat:/<tag>-<i>` won.
fn quota_race(stores: [&dyn UriStore; 2], owner: &Owner, tag: &str) -> Vec<usize> {
    const THREADS: usize = 10;
    let barrier = Barrier::new(THREADS);
    let results: Vec<Result<(), StoreError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|i| {
                let (barrier, store) = (&barrier, stores[i % 2]);
                scope.spawn(move || {
                    barrier.wait();
                    let uri = format!("ahp-chat:/{tag}-{i}");
                    store.reserve_within(&uri, "a", owner, 1, quota(3, 2))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let won: Vec<_> = (0..THREADS).filter(|&i| results[i].is_ok()).collect();
    assert_eq!(won.len(), 3, "{results:?}");
    for r in results.iter().filter(|r| r.is_err()) {
        assert_eq!(r, &Err(StoreError::Quota { max: 3 }));
    }
    won
}

fn quota_holds_across_replicas(open: &Open) {
    let (a, b) = (open(), open());
    // A race is not decided the same way twice: several principals.
    for n in 0..5 {
        let owner = Owner {
            subject: format!("racer-{n}"),
            ..bob()
        };
        quota_race([a.as_ref(), b.as_ref()], &owner, &format!("r{n}"));
    }
    let won = quota_race([a.as_ref(), b.as_ref()], &alice(), "q");
    // Tombstones, written on either replica, count on the other.
    a.tombstone(&format!("ahp-chat:/q-{}", won[0]), 2, 100)
        .unwrap();
    b.tombstone(&format!("ahp-chat:/q-{}", won[1]), 2, 100)
        .unwrap();
    assert_eq!(
        a.reserve_within("ahp-chat:/more", "a", &alice(), 3, quota(3, 2)),
        Err(StoreError::TombstoneQuota { max: 2 })
    );
    assert_eq!(
        b.reserve_within("ahp-chat:/more", "a", &alice(), 3, quota(3, 3)),
        Ok(())
    );
}

fn two_replicas_purge_each_tombstone_once(open: &Open) {
    let (a, b) = (open(), open());
    const N: usize = 1200;
    // Tombstones of many principals, interleaved: each deleted row updates
    // its principal's counts, in whatever order a purge meets them.
    for i in 0..N {
        let uri = format!("ahp-session:/purge-{i:04}");
        let owner = Owner {
            subject: format!("owner-{}", (i * 7) % 13),
            ..bob()
        };
        a.reserve(&uri, "host-a", &owner, 1).unwrap();
        a.tombstone(&uri, 1, i as u64 % 50).unwrap();
    }
    a.reserve("ahp-session:/young", "host-a", &bob(), 1)
        .unwrap();
    a.tombstone("ahp-session:/young", 1, 1000).unwrap();
    eventually("b's mirror has every tombstone", || {
        b.entries_for_host("host-a").unwrap().len() == N + 1
    });
    let barrier = Barrier::new(2);
    let purged: Vec<usize> = std::thread::scope(|scope| {
        let handles: Vec<_> = [a.as_ref(), b.as_ref()]
            .into_iter()
            .map(|store| {
                let barrier = &barrier;
                scope.spawn(move || {
                    barrier.wait();
                    store.purge_expired(100).unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(purged.iter().sum::<usize>(), N, "{purged:?}");
    for replica in [&a, &b] {
        eventually("only the young tombstone is left", || {
            let left = replica.entries_for_host("host-a").unwrap();
            left.len() == 1 && left[0].uri == "ahp-session:/young"
        });
    }
    assert_eq!(a.purge_expired(100), Ok(0));
}

fn a_replica_sees_what_another_wrote(open: &Open) {
    let (a, b) = (open(), open());
    let uri = "ahp-session:/seen";
    let taken = Err(StoreError::Taken {
        host: "host-a".into(),
    });
    a.reserve(uri, "host-a", &alice(), 1).unwrap();
    // Refused on B at once: the reserve is decided by the database.
    assert_eq!(b.reserve(uri, "host-b", &bob(), 2), taken);
    eventually("b looks up the pending entry", || {
        b.lookup(uri).unwrap().map(|e| (e.state, e.owner)) == Some((UriState::Pending, alice()))
    });
    a.confirm(uri).unwrap();
    eventually("b sees it confirmed", || {
        state(b.as_ref(), uri) == Some(UriState::Confirmed)
    });
    // B's writes reach A the same way.
    b.tombstone(uri, 5, 10).unwrap();
    eventually("a sees the tombstone", || {
        state(a.as_ref(), uri) == Some(UriState::Tombstone { until: 15 })
    });
    b.reserve("ahp-chat:/gone", "host-b", &bob(), 1).unwrap();
    eventually("a sees b's reserve", || {
        a.entries_for_host("host-b").unwrap().len() == 1
    });
    b.release("ahp-chat:/gone").unwrap();
    eventually("a sees the release", || {
        a.lookup("ahp-chat:/gone").unwrap().is_none()
    });
    assert_eq!(
        a.entries_for_host("host-a").unwrap(),
        b.entries_for_host("host-a").unwrap()
    );
}

/// PostgreSQL going away: the mirror still answers lookups, writes and the
/// health check fail as unavailable (creates are refused, `/readyz` is not
/// ready), and both come back when it does — on a replica that wrote
/// nothing meanwhile too, whose mirror catches up.
#[test]
fn postgres_down_then_back() {
    let Some(pg) = Postgres::start("down") else {
        return;
    };
    let options = pg_options(&pg, "down");
    let a = PgStore::open(&options).unwrap();
    let b = PgStore::open(&options).unwrap();
    a.reserve("ahp-session:/before", "host-a", &alice(), 1)
        .unwrap();
    pg.stop_server();
    let error = a.health().unwrap_err();
    assert!(error.is_unavailable(), "{error}");
    let started = Instant::now();
    let error = a
        .reserve("ahp-session:/during", "host-a", &alice(), 2)
        .unwrap_err();
    assert!(error.is_unavailable(), "{error}");
    assert!(started.elapsed() <= ahp_relay::names::pg::OP_TIMEOUT + Duration::from_secs(1));
    assert!(
        a.lookup("ahp-session:/before").unwrap().is_some(),
        "lookups keep working from the mirror"
    );
    eventually("b notices the lost connection", || b.health().is_err());

    pg.start_server();
    eventually("a is healthy again", || a.health().is_ok());
    a.reserve("ahp-session:/after", "host-a", &alice(), 3)
        .unwrap();
    eventually("b follows again and sees the write", || {
        b.health().is_ok() && b.lookup("ahp-session:/after").unwrap().is_some()
    });
    assert_eq!(
        b.reserve("ahp-session:/before", "host-b", &bob(), 4),
        Err(StoreError::Taken {
            host: "host-a".into()
        })
    );
}

/// `sslmode=require`: the store connects over TLS to a server whose
/// certificate chains to `store_ca_file`, and refuses one it cannot verify
/// (the public web roots do not know the test CA).
#[test]
fn postgres_over_tls_verifies_the_server() {
    let Some(pg) = Postgres::start("tls") else {
        return;
    };
    let kit = ahp_relay::devkit::DevKit::create(&common::relay::scratch_dir("pg-tls")).unwrap();
    pg.enable_tls(&kit.cert, &kit.key);
    let plain = pg_options(&pg, "tls");
    let tls = PgOptions {
        url: format!("{}?sslmode=require", plain.url),
        ca_file: Some(kit.cert.clone()),
        ..plain.clone()
    };
    let store = PgStore::open(&tls).unwrap();
    store
        .reserve("ahp-session:/tls", "host-a", &alice(), 1)
        .unwrap();
    assert_eq!(store.health(), Ok(()));
    let untrusted = PgOptions {
        ca_file: None,
        ..tls.clone()
    };
    let error = PgStore::open(&untrusted).err().unwrap();
    assert!(error.is_unavailable(), "{error}");
}

/// A PostgreSQL that stops answering without closing anything: writes on
/// several threads each fail as unavailable within the operation timeout
/// (they do not queue behind each other), lookups keep answering from the
/// mirror, and writes work again once it answers.
#[test]
fn postgres_that_stops_answering_fails_writes_in_bounded_time() {
    let Some(pg) = Postgres::start("frozen") else {
        return;
    };
    let store = PgStore::open(&pg_options(&pg, "frozen")).unwrap();
    store
        .reserve("ahp-session:/before", "host-a", &alice(), 1)
        .unwrap();
    pg.freeze(true);
    let started = Instant::now();
    let results: Vec<Result<(), StoreError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|i| {
                let store = &store;
                scope.spawn(move || {
                    store.reserve(&format!("ahp-session:/frozen-{i}"), "host-a", &alice(), 2)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let took = started.elapsed();
    pg.freeze(false);
    for r in &results {
        assert!(r.as_ref().is_err_and(StoreError::is_unavailable), "{r:?}");
    }
    let bound = ahp_relay::names::pg::OP_TIMEOUT + Duration::from_secs(2);
    assert!(took < bound, "4 writes took {took:?}, more than {bound:?}");
    assert!(store.lookup("ahp-session:/before").unwrap().is_some());
    eventually("writes work again", || {
        store
            .reserve("ahp-session:/after", "host-a", &alice(), 3)
            .is_ok()
    });
}

/// Nothing listening at the URL: opening fails at once as unavailable (a
/// relay then refuses to start and says why), also when called on a
/// runtime thread — the store's own runtime is shut down without blocking.
/// Needs no PostgreSQL.
#[tokio::test]
async fn postgres_unreachable_at_open_fails_cleanly() {
    let port = reserved_port();
    let options = PgOptions {
        url: format!("postgres://relay:url-password@127.0.0.1:{port}/ahp"),
        password: None,
        ca_file: None,
    };
    let started = Instant::now();
    let error = PgStore::open(&options).err().unwrap();
    assert!(error.is_unavailable(), "{error}");
    assert!(
        started.elapsed() < ahp_relay::names::pg::OP_TIMEOUT,
        "{:?}",
        started.elapsed()
    );
    assert!(!error.to_string().contains("url-password"), "{error}");
}

/// Migrations are versioned: the first open records version 1 in
/// `schema_migrations`, later opens (and concurrent ones) apply nothing
/// again, and a relay refuses a database migrated past what it knows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_migrations_are_versioned() {
    let Some(pg) = Postgres::start("migrations") else {
        return;
    };
    let options = pg_options(&pg, "migrations");
    // Three replicas starting at once migrate once.
    let opened: Vec<_> = (0..3)
        .map(|_| {
            let options = options.clone();
            tokio::task::spawn_blocking(move || PgStore::open(&options).map(drop))
        })
        .collect();
    for o in opened {
        o.await.unwrap().unwrap();
    }
    let mut config: tokio_postgres::Config = options.url.parse().unwrap();
    config.password(options.password.clone().unwrap_or_default());
    let (client, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let versions: Vec<i32> = client
        .query(
            "SELECT version FROM schema_migrations ORDER BY version",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(versions, [1]);
    client
        .execute("INSERT INTO schema_migrations (version) VALUES (999)", &[])
        .await
        .unwrap();
    let error = tokio::task::spawn_blocking(move || PgStore::open(&options).err())
        .await
        .unwrap()
        .unwrap();
    assert!(error.to_string().contains("newer"), "{error}");
}

/// A URL with a password and a wrong password file: the error names neither.
#[test]
fn postgres_errors_hold_no_secret() {
    let Some(pg) = Postgres::start("secret") else {
        return;
    };
    let url = pg.create_db("nopw");
    let options = PgOptions {
        url: url.replace("postgres@", "postgres:url-secret@"),
        password: Some("file-secret".into()),
        ca_file: None,
    };
    let error = PgStore::open(&options).err().unwrap();
    assert!(error.is_unavailable());
    let text = format!("{error} {error:?} {options:?}");
    assert!(!text.contains("secret"), "{text}");
}

#[test]
fn store_is_usable_as_a_trait_object() {
    let store: std::sync::Arc<dyn UriStore> =
        std::sync::Arc::new(RedbStore::open_in_memory().unwrap());
    store
        .reserve("ahp-session:/x", "host-a", &alice(), 1)
        .unwrap();
    assert_eq!(
        state(store.as_ref(), "ahp-session:/x"),
        Some(UriState::Pending)
    );
}

#[test]
fn open_fails_clearly() {
    let dir = TempDir::new("open");
    let missing = dir.0.join("no-such-dir").join("uris.redb");
    let error = RedbStore::open(&missing).err().unwrap();
    assert!(error.is_unavailable());
    assert!(error.to_string().contains("does not exist"), "{error}");
    assert!(!missing.parent().unwrap().exists());

    // A second store on the same file (another relay process) is refused by the file lock.
    let path = dir.file();
    let _first = RedbStore::open(&path).unwrap();
    let error = RedbStore::open(&path).err().unwrap();
    assert!(error.is_unavailable(), "{error}");

    // A file that is not a store is refused, not overwritten.
    let junk = dir.0.join("junk.redb");
    std::fs::write(&junk, vec![0x5a; 8192]).unwrap();
    let error = RedbStore::open(&junk).err().unwrap();
    assert!(error.is_unavailable(), "{error}");
    assert_eq!(std::fs::read(&junk).unwrap(), vec![0x5a; 8192]);
}

fn fill(store: &RedbStore, count: usize) -> Vec<String> {
    let uris: Vec<String> = (0..count)
        .map(|i| format!("ahp-session:/bench-{i:08}"))
        .collect();
    for uri in &uris {
        store.reserve(uri, "host-a", &alice(), 1).unwrap();
        store.confirm(uri).unwrap();
    }
    uris
}

fn reserve_confirm_per_sec(store: &RedbStore, count: usize) -> f64 {
    let start = Instant::now();
    fill(store, count);
    count as f64 / start.elapsed().as_secs_f64()
}

fn bench_file(path: &Path, count: usize) -> f64 {
    let store = RedbStore::open(path).unwrap();
    reserve_confirm_per_sec(&store, count)
}

/// Average ns per `lookup` of `uri(i)` for `i` in `0..count`; every lookup must hit.
fn lookup_ns<'a>(store: &RedbStore, count: usize, uri: impl Fn(usize) -> &'a String) -> f64 {
    let start = Instant::now();
    for i in 0..count {
        let entry = std::hint::black_box(store.lookup(uri(i)).unwrap());
        assert!(entry.is_some());
    }
    start.elapsed().as_nanos() as f64 / count as f64
}

/// Prints `lookup` ns/op over 100,000 entries and `reserve+confirm` pairs per second.
#[test]
#[ignore = "benchmark: run with --release -- --ignored --nocapture"]
fn bench_uri_store() {
    const ENTRIES: usize = 100_000;
    const LOOKUPS: usize = 1_000_000;

    let store = RedbStore::open_in_memory().unwrap();
    let start = Instant::now();
    let uris = fill(&store, ENTRIES);
    let fill_rate = ENTRIES as f64 / start.elapsed().as_secs_f64();

    // Cold: stride through all entries, so nearly every lookup misses the CPU cache.
    let cold_ns = lookup_ns(&store, LOOKUPS, |i| &uris[(i * 7919) % ENTRIES]);
    // Hot: 64 entries in use, as when a few chats stream at once.
    let hot_ns = lookup_ns(&store, LOOKUPS, |i| &uris[(i * 7919) % 64]);

    let start = Instant::now();
    for i in 0..LOOKUPS {
        let miss = format!("ahp-session:/miss-{}", i % 1000);
        std::hint::black_box(store.lookup(&miss).unwrap());
    }
    let miss_ns = start.elapsed().as_nanos() as f64 / LOOKUPS as f64;

    let dir = TempDir::new("bench");
    let file_rate = bench_file(&dir.file(), 1_000);
    let quota_rate = reserve_within_per_sec(&store, 2_000);
    // The same with a store of 1,000 entries: a create's cost must not grow
    // with the store (contract §7.6), so the two rates should match.
    let small = RedbStore::open_in_memory().unwrap();
    fill(&small, 1_000);
    let small_rate = reserve_within_per_sec(&small, 2_000);

    println!("uri_store bench ({ENTRIES} entries):");
    println!("  lookup hit, cold cache {cold_ns:8.0} ns/op");
    println!("  lookup hit, 64 hot     {hot_ns:8.0} ns/op");
    println!("  lookup miss (+format)  {miss_ns:8.0} ns/op");
    println!("  reserve+confirm, in-memory backend  {fill_rate:8.0} pairs/s");
    println!("  reserve+confirm, file (fsync)       {file_rate:8.0} pairs/s");
    println!("  create with quota check, {ENTRIES} entries  {quota_rate:8.0} reserves/s");
    println!("  create with quota check, 1000 entries    {small_rate:8.0} reserves/s");
}

/// Reserves `count` more URIs for bob through the quota check, with the
/// store already holding `fill`'s entries: what each create pays.
fn reserve_within_per_sec(store: &RedbStore, count: usize) -> f64 {
    let quota = ahp_relay::names::store::Quota {
        live: usize::MAX,
        tombstones: usize::MAX,
    };
    let start = Instant::now();
    for i in 0..count {
        let uri = format!("ahp-session:/quota-{i:08}");
        store
            .reserve_within(&uri, "host-a", &bob(), 1, quota)
            .unwrap();
    }
    count as f64 / start.elapsed().as_secs_f64()
}

/// The `p`-th percentile (0–100) of `samples`, sorted in place.
fn percentile(samples: &mut [Duration], p: usize) -> Duration {
    samples.sort();
    samples[(samples.len() - 1) * p / 100]
}

/// Prints, on PostgreSQL: create latency (quota-checked reserve + confirm)
/// p50/p99 and creates per second from one thread, the same on redb (a file,
/// fsync) for comparison, and how long another replica takes to see a
/// reserve (p50/p99).
#[test]
#[ignore = "benchmark: run with --release -- --ignored --nocapture"]
fn bench_uri_store_postgres() {
    const CREATES: usize = 500;
    let Some(pg) = Postgres::start("bench") else {
        return;
    };
    let options = pg_options(&pg, "bench");
    let (a, b) = (
        PgStore::open(&options).unwrap(),
        PgStore::open(&options).unwrap(),
    );
    let dir = TempDir::new("bench-pg");
    let redb = RedbStore::open(&dir.file()).unwrap();
    let unlimited = quota(usize::MAX, usize::MAX);
    let creates = |store: &dyn UriStore, tag: &str| -> (Vec<Duration>, f64) {
        let started = Instant::now();
        let samples = (0..CREATES)
            .map(|i| {
                let uri = format!("ahp-session:/{tag}-{i}");
                let t = Instant::now();
                store
                    .reserve_within(&uri, "host-a", &bob(), 1, unlimited)
                    .unwrap();
                store.confirm(&uri).unwrap();
                t.elapsed()
            })
            .collect();
        (samples, CREATES as f64 / started.elapsed().as_secs_f64())
    };
    let (mut on_pg, pg_rate) = creates(&a, "pg");
    let (mut on_redb, redb_rate) = creates(&redb, "redb");
    let mut lag: Vec<Duration> = (0..200)
        .map(|i| {
            let uri = format!("ahp-session:/lag-{i}");
            a.reserve(&uri, "host-a", &bob(), 1).unwrap();
            let t = Instant::now();
            while b.lookup(&uri).unwrap().is_none() {
                assert!(t.elapsed() < Duration::from_secs(10), "b never saw {uri}");
                std::thread::sleep(Duration::from_micros(100));
            }
            t.elapsed()
        })
        .collect();
    println!("uri_store on PostgreSQL (loopback, fsync off) vs redb (file, fsync):");
    for (name, samples, rate) in [
        ("postgres", &mut on_pg, pg_rate),
        ("redb", &mut on_redb, redb_rate),
    ] {
        println!(
            "  create (reserve+confirm) {name:8}  p50 {:7.2} ms  p99 {:7.2} ms  {rate:7.0}/s",
            percentile(samples, 50).as_secs_f64() * 1e3,
            percentile(samples, 99).as_secs_f64() * 1e3,
        );
    }
    println!(
        "  another replica sees a reserve after  p50 {:7.2} ms  p99 {:7.2} ms",
        percentile(&mut lag, 50).as_secs_f64() * 1e3,
        percentile(&mut lag, 99).as_secs_f64() * 1e3,
    );
}

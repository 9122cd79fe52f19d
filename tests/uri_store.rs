//! The URI store (contract §4.2, §7.4): lifecycle, tombstones, durability across reopen,
//! concurrent reserves, and a small benchmark (`cargo test --release --test uri_store --
//! --ignored --nocapture`).

use std::path::{Path, PathBuf};
use std::sync::Barrier;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use ahp_relay::names::store::{Owner, RedbStore, StoreError, UriEntry, UriState, UriStore};

const DAY: u64 = 24 * 60 * 60;
const TTL: u64 = 30 * DAY;

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

#[test]
fn lifecycle_reserve_confirm_tombstone() {
    let store = RedbStore::open_in_memory().unwrap();
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
    assert_eq!(state(&store, uri), Some(UriState::Confirmed));
    assert_eq!(store.reserve(uri, "host-b", &bob(), 102), taken);

    store.tombstone(uri, 200, TTL).unwrap();
    assert_eq!(
        state(&store, uri),
        Some(UriState::Tombstone { until: 200 + TTL })
    );
    assert_eq!(store.reserve(uri, "host-b", &bob(), 200 + TTL - 1), taken);
}

#[test]
fn release_frees_a_pending_name() {
    let store = RedbStore::open_in_memory().unwrap();
    let uri = "ahp-chat:/c1";
    store.reserve(uri, "host-a", &alice(), 1).unwrap();
    store.release(uri).unwrap();
    assert_eq!(store.lookup(uri).unwrap(), None);
    assert_eq!(store.release(uri), Err(StoreError::NotFound));

    store.reserve(uri, "host-b", &bob(), 2).unwrap();
    let entry = store.lookup(uri).unwrap().unwrap();
    assert_eq!((entry.host.as_str(), entry.owner), ("host-b", bob()));
}

#[test]
fn pending_entry_can_be_tombstoned_after_a_lost_response() {
    let store = RedbStore::open_in_memory().unwrap();
    let uri = "ahp-terminal:/t1";
    store.reserve(uri, "host-a", &alice(), 1).unwrap();
    store.tombstone(uri, 10, TTL).unwrap();
    assert_eq!(
        state(&store, uri),
        Some(UriState::Tombstone { until: 10 + TTL })
    );
}

#[test]
fn tombstone_blocks_reuse_until_it_expires_then_purge_removes_it() {
    let store = RedbStore::open_in_memory().unwrap();
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
    assert_eq!(state(&store, old), Some(UriState::Tombstone { until: 110 }));

    assert_eq!(store.purge_expired(110), Ok(1));
    assert_eq!(store.lookup(old).unwrap(), None);
    assert_eq!(
        state(&store, young),
        Some(UriState::Tombstone { until: 150 })
    );
    assert_eq!(state(&store, live), Some(UriState::Confirmed));
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

#[test]
fn entries_for_host_lists_every_state_sorted() {
    let store = RedbStore::open_in_memory().unwrap();
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

#[test]
fn entries_survive_reopen_and_mirror_agrees() {
    let dir = TempDir::new("reopen");
    let path = dir.file();
    let before = {
        let store = RedbStore::open(&path).unwrap();
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
        all_entries(&store)
    };
    assert_eq!(before.len(), 3);

    let store = RedbStore::open(&path).unwrap();
    assert_eq!(all_entries(&store), before);
    for entry in &before {
        assert_eq!(store.lookup(&entry.uri).unwrap().as_ref(), Some(entry));
    }
    assert_eq!(store.lookup("ahp-chat:/r").unwrap(), None);
    assert_eq!(store.health(), Ok(()));

    // Writes after a reopen are durable too.
    assert_eq!(store.purge_expired(14), Ok(1));
    store.confirm("ahp-session:/p").unwrap();
    drop(store);
    let store = RedbStore::open(&path).unwrap();
    assert_eq!(store.lookup("ahp-chat:/t").unwrap(), None);
    assert_eq!(state(&store, "ahp-session:/p"), Some(UriState::Confirmed));
    assert_eq!(all_entries(&store).len(), 2);
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

fn race(store: &RedbStore, uri: &str) {
    const THREADS: usize = 8;
    let barrier = Barrier::new(THREADS);
    let results: Vec<(String, Result<(), StoreError>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|i| {
                let barrier = &barrier;
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
    assert_eq!(store.lookup(uri).unwrap().unwrap().host, winner);
}

#[test]
fn concurrent_reserves_have_exactly_one_winner() {
    let dir = TempDir::new("race");
    let path = dir.file();
    {
        let store = RedbStore::open(&path).unwrap();
        for i in 0..20 {
            race(&store, &format!("ahp-session:/race-{i}"));
        }
    }
    let memory = RedbStore::open_in_memory().unwrap();
    for i in 0..20 {
        race(&memory, &format!("ahp-chat:/race-{i}"));
    }
    // The winners are what was committed.
    let store = RedbStore::open(&path).unwrap();
    let total: usize = (0..8)
        .map(|i| store.entries_for_host(&format!("host-{i}")).unwrap().len())
        .sum();
    assert_eq!(total, 20);
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

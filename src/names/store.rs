//! The durable store of client-chosen URIs (contract §4.2, §7.4).
//!
//! A URI a client chooses (`createSession.channel`, `createChat.chat`, `createTerminal.channel`)
//! keeps its exact form through the relay, so the relay must remember which host owns it and keep
//! it unique across all hosts and across relay restarts. Its lifecycle:
//!
//! ```text
//! reserve ──► Pending ──confirm──► Confirmed ──tombstone──► Tombstone{until} ──purge_expired──► gone
//!                │ └──────────────tombstone───────────────────────┘
//!                └──release (host error)──► gone
//! ```
//!
//! A name is taken while any entry for it exists, except a tombstone whose `until` has passed.
//! Every entry records its owner (issuer + subject) for the tenancy rules.
//!
//! The relay talks to the store only through [`UriStore`], so a store shared by several replicas
//! can replace [`RedbStore`] later (§11). An error from any write means the store is unavailable:
//! the relay must then refuse the create (-32603) rather than forward it unrecorded (§7.4).
//!
//! # Why redb
//! [`RedbStore`] keeps the table in one file with the `redb` crate rather than SQLite:
//! - pure Rust: no C toolchain or bundled C library in the build or the container image;
//! - one file, which is what a StatefulSet volume backs up and restores, locked against a second
//!   relay process opening it;
//! - ACID, copy-on-write commits that are durable (fsync) when `commit` returns, so a crash leaves
//!   either the old or the new state, never a torn one;
//! - a small dependency with no transitive crates, and a key-value API that is all a table of
//!   `uri → entry` needs (no SQL, no schema text).
//!
//! The row layout is versioned by the table name (`uris_v2`, which added the owner's groups to
//! `uris_v1`); a new layout gets a new table and a migration at open ([`RedbStore::open`] moves
//! `uris_v1` rows into `uris_v2` with no groups, in one transaction).

use super::index::{Held, Index};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError, RwLock};

use redb::backends::InMemoryBackend;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use thiserror::Error;

/// `uri → (host, state, tombstone until, owner issuer, owner subject, created_at, owner groups)`.
const URIS: TableDefinition<&str, Row<'_>> = TableDefinition::new("uris_v2");

/// The layout before owner groups; migrated at open.
const URIS_V1: TableDefinition<&str, RowV1<'_>> = TableDefinition::new("uris_v1");

/// One stored row; the state is one of [`PENDING`], [`CONFIRMED`], [`TOMBSTONE`]; groups are a
/// JSON array of strings (any group name round-trips; an empty text means none, as migrated
/// `uris_v1` rows have).
type Row<'a> = (&'a str, u8, u64, &'a str, &'a str, u64, &'a str);

/// A `uris_v1` row: [`Row`] without the groups.
type RowV1<'a> = (&'a str, u8, u64, &'a str, &'a str, u64);

const PENDING: u8 = 0;
const CONFIRMED: u8 = 1;
const TOMBSTONE: u8 = 2;

/// redb's page cache; every entry is mirrored in memory anyway, so a small cache suffices.
const CACHE_BYTES: usize = 16 << 20;

/// The principal that created an entry through the relay (contract §3.3: issuer + subject),
/// with the groups its token carried then (for `group` visibility, §7.2).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Owner {
    /// The token's `iss`.
    pub issuer: String,
    /// The token's `sub`.
    pub subject: String,
    /// The token's groups at creation time.
    pub groups: Vec<String>,
}

/// Where an entry is in its lifecycle (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UriState {
    /// Reserved; the create has been (or is about to be) forwarded and its outcome is unknown.
    Pending,
    /// The host reported the create as successful, or listed the URI in its catalog.
    Confirmed,
    /// The object was disposed; the name stays taken until `until` (seconds since the epoch).
    Tombstone {
        /// The first second at which the name may be reserved again.
        until: u64,
    },
}

/// One stored URI: which host owns it, who created it, and in which state it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UriEntry {
    /// The client-facing URI, exactly as the client chose it.
    pub uri: String,
    /// The configured id of the host that owns it.
    pub host: String,
    /// Its lifecycle state.
    pub state: UriState,
    /// The principal that reserved it.
    pub owner: Owner,
    /// When it was reserved, in seconds since the epoch.
    pub created_at: u64,
}

/// How many entries one principal may hold (contract §3.6, §7.6): live ones, and tombstones
/// of names it disposed — kept for `tombstone_ttl`, so without their own bound a create/dispose
/// loop would grow the store for a month.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// Pending and confirmed entries.
    pub live: usize,
    /// Tombstones not yet expired and purged.
    pub tombstones: usize,
}

/// Why a store operation did not happen. Nothing was changed when an error is returned.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum StoreError {
    /// The URI already has an entry (pending, confirmed, or an unexpired tombstone) owned by
    /// `host`. The host id is for routing and logs, not for a client that cannot see that host.
    #[error("URI is already taken on host {host}")]
    Taken {
        /// The host that owns the existing entry.
        host: String,
    },
    /// The URI has no entry in a state that allows the operation.
    #[error("URI has no entry in a state that allows this operation")]
    NotFound,
    /// The owner already holds `max` live (pending or confirmed) entries.
    #[error("the owner already holds {max} live URIs")]
    Quota {
        /// The quota in force.
        max: usize,
    },
    /// The owner already holds `max` tombstones of names it disposed.
    #[error("the owner already holds {max} tombstones of disposed URIs")]
    TombstoneQuota {
        /// The bound in force.
        max: usize,
    },
    /// The store could not be read or written (I/O, lock, corruption); creates must be refused.
    #[error("URI store unavailable: {0}")]
    Unavailable(String),
}

impl StoreError {
    /// True for [`StoreError::Unavailable`]: the store itself failed, not the request.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }
}

/// The URI table behind the router. Each method is atomic: it either fully applies or returns an
/// error and changes nothing; a successful write is durable when the method returns. Write
/// methods may block on disk I/O, so async callers run them on a blocking thread.
pub trait UriStore: Send + Sync {
    /// Inserts `uri` as [`UriState::Pending`] for `host` and `owner`, created at `now`.
    /// Fails with [`StoreError::Taken`] if any entry exists other than a tombstone with
    /// `until <= now` (which it replaces). Of concurrent reserves of one URI exactly one succeeds.
    fn reserve(&self, uri: &str, host: &str, owner: &Owner, now: u64) -> Result<(), StoreError>;

    /// [`UriStore::reserve`], refused with [`StoreError::Quota`] when `owner` (issuer and
    /// subject) already holds `quota.live` pending or confirmed entries, and with
    /// [`StoreError::TombstoneQuota`] when it holds `quota.tombstones` tombstones; the count
    /// and the insert are one atomic step, and the count never walks the store.
    fn reserve_within(
        &self,
        uri: &str,
        host: &str,
        owner: &Owner,
        now: u64,
        quota: Quota,
    ) -> Result<(), StoreError>;

    /// Marks a pending entry [`UriState::Confirmed`]; confirming a confirmed entry is a no-op.
    /// [`StoreError::NotFound`] if there is no entry or it is a tombstone.
    fn confirm(&self, uri: &str) -> Result<(), StoreError>;

    /// Removes a pending entry (the host refused the create), freeing the name at once.
    /// [`StoreError::NotFound`] if there is no pending entry: a confirmed name is only ever
    /// freed through a tombstone.
    fn release(&self, uri: &str) -> Result<(), StoreError>;

    /// Turns a pending or confirmed entry into a tombstone that keeps the name taken until
    /// `now + ttl_secs`; an existing tombstone is left as it is.
    /// [`StoreError::NotFound`] if there is no entry.
    fn tombstone(&self, uri: &str, now: u64, ttl_secs: u64) -> Result<(), StoreError>;

    /// The committed entry for `uri` in any state (tombstones included), or `None`.
    fn lookup(&self, uri: &str) -> Result<Option<UriEntry>, StoreError>;

    /// Every committed entry owned by `host`, in any state, sorted by URI.
    fn entries_for_host(&self, host: &str) -> Result<Vec<UriEntry>, StoreError>;

    /// Removes every tombstone with `until <= now`; returns how many were removed.
    fn purge_expired(&self, now: u64) -> Result<usize, StoreError>;

    /// Ok if the store can accept writes now (for `/readyz`).
    fn health(&self) -> Result<(), StoreError>;

    /// The backend's name in `/status` and the metrics
    /// (`ahp_relay_store_up{backend}`, `ahp_relay_info{store}`): a short
    /// constant, never a path or a connection string.
    fn backend(&self) -> &'static str {
        "redb"
    }
}

/// A [`UriStore`] in one redb file, with every entry mirrored in memory so that `lookup` and
/// `entries_for_host` never touch the disk. The mirror is loaded at open and updated only after
/// a successful commit, so it never shows an uncommitted entry; writes are serialized.
pub struct RedbStore {
    db: Database,
    /// Committed entries, indexed by URI, owner, host and expiry.
    mirror: RwLock<Index>,
    /// Held from the start of a write transaction until the mirror reflects its commit, so the
    /// mirror receives commits in commit order.
    writer: Mutex<()>,
    /// Set when a commit failed and cleared by the next one that succeeds: what `health`
    /// reports without opening a write transaction.
    write_failed: AtomicBool,
}

impl RedbStore {
    /// Opens the store file at `path`, creating the file (not its directory) if it does not
    /// exist, and loads every entry into the mirror. Fails with [`StoreError::Unavailable`] if
    /// the directory is missing, the file is not a store, or another process has it open.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        if let Some(dir) = path.parent()
            && !dir.as_os_str().is_empty()
            && !dir.is_dir()
        {
            return Err(StoreError::Unavailable(format!(
                "URI store directory {} does not exist",
                dir.display()
            )));
        }
        let db = Database::builder()
            .set_cache_size(CACHE_BYTES)
            .create(path)
            .map_err(|e| {
                StoreError::Unavailable(format!("cannot open URI store {}: {e}", path.display()))
            })?;
        Self::load(db)
    }

    /// An empty store held in memory only (for tests and the demo); it behaves like a file
    /// store except that nothing survives dropping it.
    pub fn open_in_memory() -> Result<Self, StoreError> {
        let db = Database::builder()
            .set_cache_size(CACHE_BYTES)
            .create_with_backend(InMemoryBackend::new())
            .map_err(unavailable)?;
        Self::load(db)
    }

    /// Creates the table if needed, migrates `uris_v1` rows, and reads every row into the mirror.
    fn load(db: Database) -> Result<Self, StoreError> {
        let txn = db.begin_write().map_err(unavailable)?;
        let has_v1 = txn
            .list_tables()
            .map_err(unavailable)?
            .any(|t| redb::TableHandle::name(&t) == "uris_v1");
        {
            let mut table = txn.open_table(URIS).map_err(unavailable)?;
            if has_v1 {
                let old = txn.open_table(URIS_V1).map_err(unavailable)?;
                for row in old.iter().map_err(unavailable)? {
                    let (uri, row) = row.map_err(unavailable)?;
                    let (h, st, until, iss, sub, at) = row.value();
                    table
                        .insert(uri.value(), (h, st, until, iss, sub, at, ""))
                        .map_err(unavailable)?;
                }
            }
        }
        if has_v1 {
            txn.delete_table(URIS_V1).map_err(unavailable)?;
        }
        txn.commit().map_err(unavailable)?;

        let txn = db.begin_read().map_err(unavailable)?;
        let table = txn.open_table(URIS).map_err(unavailable)?;
        let mut mirror = Index::default();
        for row in table.iter().map_err(unavailable)? {
            let (uri, row) = row.map_err(unavailable)?;
            mirror.insert(decode(uri.value(), row.value())?);
        }
        Ok(Self {
            db,
            mirror: RwLock::new(mirror),
            writer: Mutex::new(()),
            write_failed: AtomicBool::new(false),
        })
    }

    /// In one write transaction, passes the committed entry of `uri` to `change` and stores what
    /// it returns (`None` deletes); commits only if that differs, then updates the mirror.
    /// Every early return drops `txn`, which aborts it.
    fn update(
        &self,
        uri: &str,
        change: impl FnOnce(Option<UriEntry>) -> Result<Option<UriEntry>, StoreError>,
    ) -> Result<(), StoreError> {
        let _writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let txn = self.db.begin_write().map_err(unavailable)?;
        let next = {
            let mut table = txn.open_table(URIS).map_err(unavailable)?;
            let current = match table.get(uri).map_err(unavailable)? {
                Some(row) => Some(decode(uri, row.value())?),
                None => None,
            };
            let next = change(current.clone())?;
            if next == current {
                return Ok(());
            }
            match &next {
                Some(entry) => {
                    let groups = encode_groups(&entry.owner.groups);
                    table
                        .insert(uri, encode(entry, &groups))
                        .map_err(unavailable)?
                }
                None => table.remove(uri).map_err(unavailable)?,
            };
            next
        };
        self.committed(txn.commit())?;
        let mut mirror = self.mirror.write().unwrap_or_else(PoisonError::into_inner);
        match next {
            Some(entry) => mirror.insert(entry),
            None => {
                mirror.remove(uri);
            }
        };
        Ok(())
    }
}

impl RedbStore {
    /// Records whether a commit succeeded (for `health`).
    fn committed(&self, result: Result<(), redb::CommitError>) -> Result<(), StoreError> {
        self.write_failed.store(result.is_err(), Ordering::Relaxed);
        result.map_err(unavailable)
    }

    /// What `owner`'s issuer and subject hold (an index read, no scan).
    fn held_by(&self, owner: &Owner) -> Held {
        let mirror = self.mirror.read().unwrap_or_else(PoisonError::into_inner);
        mirror.held(&owner.issuer, &owner.subject)
    }
}

impl UriStore for RedbStore {
    fn reserve(&self, uri: &str, host: &str, owner: &Owner, now: u64) -> Result<(), StoreError> {
        self.update(uri, |current| match current {
            Some(entry) if !is_expired(&entry, now) => Err(StoreError::Taken { host: entry.host }),
            _ => Ok(Some(UriEntry {
                uri: uri.to_owned(),
                host: host.to_owned(),
                state: UriState::Pending,
                owner: owner.clone(),
                created_at: now,
            })),
        })
    }

    fn reserve_within(
        &self,
        uri: &str,
        host: &str,
        owner: &Owner,
        now: u64,
        quota: Quota,
    ) -> Result<(), StoreError> {
        self.update(uri, |current| match current {
            Some(entry) if !is_expired(&entry, now) => Err(StoreError::Taken { host: entry.host }),
            // `update` holds the writer lock, so the mirror cannot change between this count and
            // the commit.
            _ => {
                let held = self.held_by(owner);
                if held.live >= quota.live {
                    return Err(StoreError::Quota { max: quota.live });
                }
                if held.tombstones >= quota.tombstones {
                    return Err(StoreError::TombstoneQuota {
                        max: quota.tombstones,
                    });
                }
                Ok(Some(UriEntry {
                    uri: uri.to_owned(),
                    host: host.to_owned(),
                    state: UriState::Pending,
                    owner: owner.clone(),
                    created_at: now,
                }))
            }
        })
    }

    fn confirm(&self, uri: &str) -> Result<(), StoreError> {
        self.update(uri, |current| match current {
            Some(entry) if matches!(entry.state, UriState::Pending | UriState::Confirmed) => {
                Ok(Some(UriEntry {
                    state: UriState::Confirmed,
                    ..entry
                }))
            }
            _ => Err(StoreError::NotFound),
        })
    }

    fn release(&self, uri: &str) -> Result<(), StoreError> {
        self.update(uri, |current| match current {
            Some(entry) if entry.state == UriState::Pending => Ok(None),
            _ => Err(StoreError::NotFound),
        })
    }

    fn tombstone(&self, uri: &str, now: u64, ttl_secs: u64) -> Result<(), StoreError> {
        self.update(uri, |current| match current {
            Some(entry) if matches!(entry.state, UriState::Tombstone { .. }) => Ok(Some(entry)),
            Some(entry) => Ok(Some(UriEntry {
                state: UriState::Tombstone {
                    until: now.saturating_add(ttl_secs),
                },
                ..entry
            })),
            None => Err(StoreError::NotFound),
        })
    }

    fn lookup(&self, uri: &str) -> Result<Option<UriEntry>, StoreError> {
        let mirror = self.mirror.read().unwrap_or_else(PoisonError::into_inner);
        Ok(mirror.get(uri).cloned())
    }

    fn entries_for_host(&self, host: &str) -> Result<Vec<UriEntry>, StoreError> {
        let mirror = self.mirror.read().unwrap_or_else(PoisonError::into_inner);
        Ok(mirror.of_host(host))
    }

    fn purge_expired(&self, now: u64) -> Result<usize, StoreError> {
        let _writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        // The index lists the expired tombstones: no walk over the table.
        let expired = self
            .mirror
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .expired(now);
        if expired.is_empty() {
            return Ok(0);
        }
        let txn = self.db.begin_write().map_err(unavailable)?;
        {
            let mut table = txn.open_table(URIS).map_err(unavailable)?;
            for uri in &expired {
                table.remove(uri.as_str()).map_err(unavailable)?;
            }
        }
        self.committed(txn.commit())?;
        let mut mirror = self.mirror.write().unwrap_or_else(PoisonError::into_inner);
        for uri in &expired {
            mirror.remove(uri);
        }
        Ok(expired.len())
    }

    fn health(&self) -> Result<(), StoreError> {
        // A read transaction: it never waits for a writer (redb readers run beside the one
        // writer) and takes no lock a create could be queued behind; a failed commit is
        // remembered by `committed` until one succeeds.
        if self.write_failed.load(Ordering::Relaxed) {
            return Err(StoreError::Unavailable("the last write failed".into()));
        }
        let txn = self.db.begin_read().map_err(unavailable)?;
        txn.open_table(URIS).map_err(unavailable)?;
        Ok(())
    }
}

/// Purges expired tombstones every `every` (contract §7.4: a disposed name is free again after
/// `tombstone_ttl`), each purge on a blocking thread; runs until its task is dropped.
pub async fn purge_expired_every(store: std::sync::Arc<dyn UriStore>, every: std::time::Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let s = store.clone();
        match tokio::task::spawn_blocking(move || s.purge_expired(now)).await {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => tracing::info!(purged = n, "expired tombstones purged"),
            Ok(Err(e)) => tracing::warn!(error = %e, "tombstone purge failed"),
            Err(e) => tracing::warn!(error = %e, "tombstone purge did not run"),
        }
    }
}

/// True for a tombstone whose time has come: the name is free again.
fn is_expired(entry: &UriEntry, now: u64) -> bool {
    matches!(entry.state, UriState::Tombstone { until } if until <= now)
}

fn encode<'a>(entry: &'a UriEntry, groups: &'a str) -> Row<'a> {
    let (state, until) = match entry.state {
        UriState::Pending => (PENDING, 0),
        UriState::Confirmed => (CONFIRMED, 0),
        UriState::Tombstone { until } => (TOMBSTONE, until),
    };
    (
        &entry.host,
        state,
        until,
        &entry.owner.issuer,
        &entry.owner.subject,
        entry.created_at,
        groups,
    )
}

fn decode(uri: &str, row: Row<'_>) -> Result<UriEntry, StoreError> {
    let (host, state, until, issuer, subject, created_at, groups) = row;
    let state = match state {
        PENDING => UriState::Pending,
        CONFIRMED => UriState::Confirmed,
        TOMBSTONE => UriState::Tombstone { until },
        other => {
            return Err(StoreError::Unavailable(format!(
                "URI store holds an entry in unknown state {other}"
            )));
        }
    };
    Ok(UriEntry {
        uri: uri.to_owned(),
        host: host.to_owned(),
        state,
        owner: Owner {
            issuer: issuer.to_owned(),
            subject: subject.to_owned(),
            groups: decode_groups(groups)?,
        },
        created_at,
    })
}

fn encode_groups(groups: &[String]) -> String {
    serde_json::to_string(groups).unwrap_or_else(|_| "[]".into())
}

fn decode_groups(text: &str) -> Result<Vec<String>, StoreError> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    serde_json::from_str(text).map_err(|e| {
        StoreError::Unavailable(format!("URI store holds unreadable owner groups: {e}"))
    })
}

fn unavailable(error: impl Into<redb::Error>) -> StoreError {
    StoreError::Unavailable(error.into().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner() -> Owner {
        Owner {
            issuer: "https://idp".into(),
            subject: "alice".into(),
            groups: vec!["team-a".into(), "x\nops".into()],
        }
    }

    #[test]
    fn encode_decode_round_trip() {
        for state in [
            UriState::Pending,
            UriState::Confirmed,
            UriState::Tombstone { until: u64::MAX },
        ] {
            let entry = UriEntry {
                uri: "ahp-chat:/c".into(),
                host: "gpu1".into(),
                state,
                owner: owner(),
                created_at: 7,
            };
            let groups = encode_groups(&entry.owner.groups);
            assert_eq!(
                decode(&entry.uri, encode(&entry, &groups)),
                Ok(entry.clone())
            );
        }
    }

    #[test]
    fn v1_rows_migrate_to_v2_with_no_groups() {
        let dir = std::env::temp_dir().join(format!("ahp-relay-store-mig-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("uris.redb");
        {
            let db = Database::create(&path).unwrap();
            let txn = db.begin_write().unwrap();
            {
                let mut t = txn.open_table(URIS_V1).unwrap();
                t.insert(
                    "ahp-session:/old",
                    ("gpu1", CONFIRMED, 0, "idp", "alice", 42),
                )
                .unwrap();
            }
            txn.commit().unwrap();
        }
        let store = RedbStore::open(&path).unwrap();
        let e = store.lookup("ahp-session:/old").unwrap().unwrap();
        assert_eq!(
            (e.host.as_str(), e.state, e.created_at),
            ("gpu1", UriState::Confirmed, 42)
        );
        assert_eq!(e.owner.subject, "alice");
        assert!(e.owner.groups.is_empty());
        drop(store);
        let db = Database::create(&path).unwrap();
        let txn = db.begin_read().unwrap();
        let names: Vec<String> = txn
            .list_tables()
            .unwrap()
            .map(|t| redb::TableHandle::name(&t).to_string())
            .collect();
        assert_eq!(names, ["uris_v2"]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn unknown_state_byte_is_unavailable() {
        let error = decode("ahp-chat:/c", ("h", 9, 0, "i", "s", 0, "")).unwrap_err();
        assert!(error.is_unavailable());
    }
}

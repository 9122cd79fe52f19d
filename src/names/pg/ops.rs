//! The [`UriStore`] operations of [`PgStore`] as SQL, each in one statement
//! or one transaction (see the parent module for why each is safe with
//! several writers).

use std::sync::{Arc, PoisonError};

use deadpool_postgres::{GenericClient, Object};

use super::{
    COLUMNS, Failure, PURGE_BATCH, PURGE_LOCK, PgStore, decode, from_db, now_to_db, pg_error,
    pool_error, to_db,
};
use crate::names::index::Index;
use crate::names::store::{Owner, Quota, StoreError, UriEntry, UriState, UriStore};

/// What a committed write did to the table, for the mirror.
enum Change {
    /// The URI's row is now this.
    Put(UriEntry),
    /// These URIs' rows are gone.
    Gone(Vec<String>),
}

fn apply(mirror: &mut Index, change: &Change) {
    match change {
        Change::Put(entry) => mirror.insert(entry.clone()),
        Change::Gone(uris) => {
            for uri in uris {
                mirror.remove(uri);
            }
        }
    }
}

/// A reserve's inputs, shared by its attempts.
struct Reserve {
    entry: UriEntry,
    groups: String,
    now: u64,
    quota: Option<Quota>,
}

/// Locks the URI's row, refuses a live one, checks the quota with the
/// principal's `holders` row locked, then inserts or replaces (an expired
/// tombstone): one transaction.
async fn reserve(mut client: Object, r: Arc<Reserve>) -> Result<Change, Failure> {
    let e = &r.entry;
    let txn = client.transaction().await?;
    let lock = txn
        .prepare_cached("SELECT host, state, until FROM uris WHERE uri = $1 FOR UPDATE")
        .await?;
    let existing = txn.query_opt(&lock, &[&e.uri]).await?;
    if let Some(row) = &existing {
        let (state, until): (i16, i64) = (row.try_get(1)?, row.try_get(2)?);
        if !(state == 2 && from_db(until) <= r.now) {
            return Err(StoreError::Taken {
                host: row.try_get(0)?,
            }
            .into());
        }
    }
    if let Some(quota) = r.quota {
        check_quota(&txn, &e.owner, quota).await?;
    }
    let sql = if existing.is_some() {
        "UPDATE uris SET host = $2, state = 0, until = 0, issuer = $3, subject = $4, \
         created_at = $5, groups = $6 WHERE uri = $1"
    } else {
        "INSERT INTO uris (uri, host, state, until, issuer, subject, created_at, groups) \
         VALUES ($1, $2, 0, 0, $3, $4, $5, $6) ON CONFLICT (uri) DO NOTHING"
    };
    let write = txn.prepare_cached(sql).await?;
    let created = to_db(e.created_at);
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] = [
        &e.uri,
        &e.host,
        &e.owner.issuer,
        &e.owner.subject,
        &created,
        &r.groups,
    ];
    if txn.execute(&write, &params).await? == 0 {
        // A concurrent reserve inserted the URI and committed first.
        let row = txn
            .query_opt("SELECT host FROM uris WHERE uri = $1", &[&e.uri])
            .await?;
        let host = match row {
            Some(row) => row.try_get(0)?,
            None => String::new(),
        };
        return Err(StoreError::Taken { host }.into());
    }
    txn.commit().await?;
    Ok(Change::Put(e.clone()))
}

/// Refuses the reserve when `owner` is at a bound. The principal's
/// `holders` row stays locked until the transaction ends, so a reserve of
/// the same principal on any replica counts after this one committed.
async fn check_quota(
    txn: &deadpool_postgres::Transaction<'_>,
    owner: &Owner,
    quota: Quota,
) -> Result<(), Failure> {
    txn.execute(
        "INSERT INTO holders (issuer, subject) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        &[&owner.issuer, &owner.subject],
    )
    .await?;
    let row = txn
        .query_opt(
            "SELECT live, tombstones FROM holders WHERE issuer = $1 AND subject = $2 FOR UPDATE",
            &[&owner.issuer, &owner.subject],
        )
        .await?;
    let (live, tombstones): (i64, i64) = match row {
        Some(row) => (row.try_get(0)?, row.try_get(1)?),
        None => (0, 0),
    };
    let count = |n: i64| usize::try_from(n).unwrap_or(0);
    if count(live) >= quota.live {
        return Err(StoreError::Quota { max: quota.live }.into());
    }
    if count(tombstones) >= quota.tombstones {
        return Err(StoreError::TombstoneQuota {
            max: quota.tombstones,
        }
        .into());
    }
    Ok(())
}

/// Runs `change` (one statement returning the changed row); when it changed
/// nothing, reads the row and lets `unchanged` decide (the row's current
/// form for the mirror, or the error).
async fn update_or(
    client: &Object,
    change: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    uri: &str,
    unchanged: fn(&UriEntry) -> bool,
) -> Result<Change, Failure> {
    let stmt = client.prepare_cached(change).await?;
    if let Some(row) = client.query_opt(&stmt, params).await? {
        return Ok(Change::Put(decode(&row)?));
    }
    let read = client
        .prepare_cached(&format!("SELECT {COLUMNS} FROM uris WHERE uri = $1"))
        .await?;
    match client.query_opt(&read, &[&uri]).await? {
        Some(row) => {
            let entry = decode(&row)?;
            if unchanged(&entry) {
                Ok(Change::Put(entry))
            } else {
                Err(StoreError::NotFound.into())
            }
        }
        None => Err(StoreError::NotFound.into()),
    }
}

async fn confirm(client: Object, uri: Arc<str>) -> Result<Change, Failure> {
    let sql = format!("UPDATE uris SET state = 1 WHERE uri = $1 AND state = 0 RETURNING {COLUMNS}");
    update_or(&client, &sql, &[&&*uri], &uri, |e| {
        e.state == UriState::Confirmed
    })
    .await
}

async fn release(client: Object, uri: Arc<str>) -> Result<Change, Failure> {
    let stmt = client
        .prepare_cached("DELETE FROM uris WHERE uri = $1 AND state = 0")
        .await?;
    match client.execute(&stmt, &[&&*uri]).await? {
        0 => Err(StoreError::NotFound.into()),
        _ => Ok(Change::Gone(vec![uri.to_string()])),
    }
}

async fn tombstone(client: Object, uri: Arc<str>, until: u64) -> Result<Change, Failure> {
    let sql = format!(
        "UPDATE uris SET state = 2, until = $2 WHERE uri = $1 AND state IN (0, 1) \
         RETURNING {COLUMNS}"
    );
    let until = to_db(until);
    update_or(&client, &sql, &[&&*uri, &until], &uri, |e| {
        matches!(e.state, UriState::Tombstone { .. })
    })
    .await
}

/// Deletes expired tombstones in batches, each in a transaction holding the
/// purge advisory lock: one replica purges at a time — another that finds
/// the lock taken skips its turn rather than waiting — so two purges never
/// update principals' counts in opposite orders (a deadlock). Rows are
/// still chosen with `SKIP LOCKED`, so a purge never waits on a row another
/// write holds.
async fn purge(mut client: Object, now: u64) -> Result<Change, Failure> {
    let now = now_to_db(now);
    let mut gone = Vec::new();
    loop {
        let txn = client.transaction().await?;
        let locked: bool = txn
            .query_one("SELECT pg_try_advisory_xact_lock($1)", &[&PURGE_LOCK])
            .await?
            .try_get(0)?;
        if !locked {
            return Ok(Change::Gone(gone));
        }
        let stmt = txn
            .prepare_cached(
                "DELETE FROM uris WHERE uri IN (\
                     SELECT uri FROM uris WHERE state = 2 AND until <= $1 \
                     ORDER BY until LIMIT $2 FOR UPDATE SKIP LOCKED) \
                 RETURNING uri",
            )
            .await?;
        let rows = txn.query(&stmt, &[&now, &PURGE_BATCH]).await?;
        txn.commit().await?;
        let n = rows.len();
        for row in rows {
            gone.push(row.try_get(0)?);
        }
        if i64::try_from(n).unwrap_or(i64::MAX) < PURGE_BATCH {
            return Ok(Change::Gone(gone));
        }
    }
}

impl PgStore {
    fn reserve_with(
        &self,
        uri: &str,
        host: &str,
        owner: &Owner,
        now: u64,
        quota: Option<Quota>,
    ) -> Result<(), StoreError> {
        let r = Arc::new(Reserve {
            entry: UriEntry {
                uri: uri.to_owned(),
                host: host.to_owned(),
                state: UriState::Pending,
                owner: owner.clone(),
                created_at: now,
            },
            groups: serde_json::to_string(&owner.groups).unwrap_or_else(|_| "[]".into()),
            now,
            quota,
        });
        self.write(move |c| reserve(c, r.clone()), apply).map(drop)
    }
}

impl UriStore for PgStore {
    fn reserve(&self, uri: &str, host: &str, owner: &Owner, now: u64) -> Result<(), StoreError> {
        self.reserve_with(uri, host, owner, now, None)
    }

    fn reserve_within(
        &self,
        uri: &str,
        host: &str,
        owner: &Owner,
        now: u64,
        quota: Quota,
    ) -> Result<(), StoreError> {
        self.reserve_with(uri, host, owner, now, Some(quota))
    }

    fn confirm(&self, uri: &str) -> Result<(), StoreError> {
        let uri: Arc<str> = uri.into();
        self.write(move |c| confirm(c, uri.clone()), apply)
            .map(drop)
    }

    fn release(&self, uri: &str) -> Result<(), StoreError> {
        let uri: Arc<str> = uri.into();
        self.write(move |c| release(c, uri.clone()), apply)
            .map(drop)
    }

    fn tombstone(&self, uri: &str, now: u64, ttl_secs: u64) -> Result<(), StoreError> {
        let uri: Arc<str> = uri.into();
        let until = now.saturating_add(ttl_secs);
        self.write(move |c| tombstone(c, uri.clone(), until), apply)
            .map(drop)
    }

    fn lookup(&self, uri: &str) -> Result<Option<UriEntry>, StoreError> {
        let mirror = self
            .inner
            .mirror
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        Ok(mirror.get(uri).cloned())
    }

    fn entries_for_host(&self, host: &str) -> Result<Vec<UriEntry>, StoreError> {
        let mirror = self
            .inner
            .mirror
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        Ok(mirror.of_host(host))
    }

    fn purge_expired(&self, now: u64) -> Result<usize, StoreError> {
        let change = self.write(move |c| purge(c, now), apply)?;
        Ok(match change {
            Change::Gone(uris) => uris.len(),
            Change::Put(_) => 0,
        })
    }

    fn health(&self) -> Result<(), StoreError> {
        self.run(|pool| async move {
            let client = pool.get().await.map_err(pool_error)?;
            client.simple_query("SELECT 1").await.map_err(pg_error)?;
            Ok(())
        })?;
        if !self.following() {
            return Err(StoreError::Unavailable(
                "not following the store's changes (listening connection down)".into(),
            ));
        }
        Ok(())
    }

    fn backend(&self) -> &'static str {
        "postgres"
    }
}

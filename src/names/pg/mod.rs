//! [`PgStore`]: the URI store in PostgreSQL, shared by several relay replicas
//! (contract §12.1). Same semantics as [`super::store::RedbStore`]; what must
//! agree across replicas is decided inside PostgreSQL:
//!
//! - **One winner per URI.** `uri` is the primary key; a reserve locks the
//!   URI's row (`SELECT … FOR UPDATE`) or inserts with `ON CONFLICT DO
//!   NOTHING`, so of concurrent reserves on any replicas exactly one commits
//!   and the others read the winner's host (`Taken`).
//! - **Quota count and insert in one step.** A trigger keeps what each
//!   principal holds in `holders`; a quota-checked reserve locks that one row
//!   (`FOR UPDATE`) before it counts and holds it until it commits, so two
//!   replicas cannot both take a principal's last place, and the count reads
//!   one row whatever the store's size (§7.6).
//! - **Purge with no leader.** Each replica purges on its own schedule; a
//!   batch runs under a try-advisory lock, so one replica purges at a time
//!   and another skips its turn instead of waiting, and picks its rows with
//!   `FOR UPDATE SKIP LOCKED`, so it never waits on a row a write holds.
//!   Each tombstone is deleted once.
//! - A transaction that loses a deadlock or serialization check is retried
//!   (at most [`ATTEMPTS`] times) before the write is reported unavailable.
//!
//! **Reads** (`lookup`, `entries_for_host`) come from an in-memory mirror, as
//! with redb: `lookup` is called synchronously on the runtime for every
//! name a host sends, and most such names are *not* store entries, so a miss
//! must not cost a round trip. The mirror follows the table by LISTEN/NOTIFY
//! (`follow`): a trigger announces every changed URI, and this replica reads
//! that row again. After the listening connection (re)connects the whole
//! table is read again, so a missed announcement is never lost for long; a
//! replica's own writes reach its mirror when they commit. What another
//! replica wrote is seen after one notification and one row read
//! (milliseconds); until then this replica answers as it did before that
//! write — e.g. a session another replica just confirmed is not yet its
//! creator's here. Decisions that must agree (reserve, quota) never read
//! the mirror.
//!
//! **Sync trait, async client.** [`super::store::UriStore`] is synchronous
//! and its writes run on blocking threads; the store owns a small runtime
//! that drives the connection pool, and each method hands its query there
//! and waits (at most [`OP_TIMEOUT`]) on a channel — never a runtime
//! `block_on`, so it is safe from any thread that may block.

mod follow;
pub mod schema;

use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use tokio_postgres::config::SslMode;
use tokio_postgres::error::SqlState;
use tokio_postgres::{NoTls, Row};

use super::index::Index;
use super::store::{Owner, StoreError, UriEntry, UriState};

/// The longest a store operation waits for PostgreSQL before it fails as
/// unavailable (a create is then refused, §7.4).
pub const OP_TIMEOUT: Duration = Duration::from_secs(5);

/// How often a transaction that lost a deadlock or serialization check runs.
pub const ATTEMPTS: usize = 3;

/// Connections in the pool (writes are serialized per replica; reads of
/// the health check and the follower's row reads use the rest).
const POOL_SIZE: usize = 4;

/// The columns of a `uris` row, in [`decode`]'s order.
const COLUMNS: &str = "uri, host, state, until, issuer, subject, created_at, groups";

/// Tombstones deleted per purge statement.
const PURGE_BATCH: i64 = 500;

/// The advisory lock key a purge batch holds ("ahppurge" in ASCII).
const PURGE_LOCK: i64 = 0x6168_7070_7572_6765;

/// Where the store is and how to reach it, from `[relay]` (§12.1).
#[derive(Clone)]
pub struct PgOptions {
    /// `postgres://USER@HOST:PORT/DB[?sslmode=require]`.
    pub url: String,
    /// The password, read from `store_password_file` (never logged).
    pub password: Option<String>,
    /// PEM CA certificates to trust for `sslmode=require` instead of the
    /// public web roots.
    pub ca_file: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for PgOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgOptions")
            .field("url", &redact_url(&self.url))
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

/// `url` with any password between `//user:` and `@` replaced, for logs and
/// errors.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((user, host)) if user.contains(':') => {
            let name = user.split(':').next().unwrap_or_default();
            format!("{scheme}://{name}:<redacted>@{host}{tail}")
        }
        _ => url.to_owned(),
    }
}

/// Whether a `[relay] store` value names PostgreSQL rather than a redb file.
pub fn is_postgres_url(store: &Path) -> bool {
    store
        .to_str()
        .is_some_and(|s| s.starts_with("postgres://") || s.starts_with("postgresql://"))
}

/// Shared by the store's methods, its follower thread and its runtime tasks.
struct Inner {
    pool: Pool,
    config: tokio_postgres::Config,
    tls: Tls,
    handle: tokio::runtime::Handle,
    /// Committed rows as last read; see the module doc.
    mirror: Arc<RwLock<Index>>,
    /// Held by a write from its first statement until the mirror shows its
    /// result, and by the follower from reading a row until it applied it:
    /// so the mirror receives each URI's rows in the order they were read.
    /// Taken on the store's runtime inside the operation, so waiting for it
    /// counts against [`OP_TIMEOUT`]: writes to a PostgreSQL that stopped
    /// answering fail within it instead of queueing behind each other.
    writer: Arc<tokio::sync::Mutex<()>>,
    /// True while the listening connection is up and the mirror was
    /// reloaded after it connected.
    following: AtomicBool,
    /// Set when the store is dropped: the follower stops.
    stopped: AtomicBool,
}

/// How connections are secured: TLS (rustls) exactly when the URL asks for
/// it with `sslmode=require`.
#[derive(Clone)]
enum Tls {
    Off,
    Rustls(tokio_postgres_rustls::MakeRustlsConnect),
}

/// The URI store in PostgreSQL; see the module doc.
pub struct PgStore {
    inner: Arc<Inner>,
    /// Declared last: dropped after `inner`'s last use here.
    _runtime: StoreRuntime,
}

/// The store's runtime, shut down without blocking when dropped, so a
/// store (or one that failed to open) may be dropped on any thread.
struct StoreRuntime(Option<tokio::runtime::Runtime>);

impl Drop for StoreRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        // The follower stops; `_runtime` then ends every task.
        self.inner.stopped.store(true, Ordering::Relaxed);
    }
}

/// Why an operation's statements failed: an answer for the caller, or a
/// database error (retried when transient).
enum Failure {
    Store(StoreError),
    Pg(tokio_postgres::Error),
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Self {
        Failure::Pg(e)
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Failure::Store(e)
    }
}

impl PgStore {
    /// Connects, applies pending migrations and loads the mirror. Fails with
    /// [`StoreError::Unavailable`] if PostgreSQL cannot be reached within
    /// [`OP_TIMEOUT`], refuses the credentials, or holds a newer schema.
    /// Call it from a thread that may block (not a runtime worker).
    pub fn open(options: &PgOptions) -> Result<Self, StoreError> {
        let mut config: tokio_postgres::Config = options.url.parse().map_err(|e| {
            StoreError::Unavailable(format!(
                "store URL {} is not a PostgreSQL URL: {e}",
                redact_url(&options.url)
            ))
        })?;
        if let Some(password) = &options.password {
            config.password(password.as_bytes());
        }
        config
            .connect_timeout(OP_TIMEOUT)
            .keepalives_idle(Duration::from_secs(30))
            .application_name("ahp-relay");
        let tls = match config.get_ssl_mode() {
            SslMode::Require => Tls::Rustls(rustls_connector(options.ca_file.as_deref())?),
            _ => Tls::Off,
        };
        let runtime = StoreRuntime(Some(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("ahp-store")
                .enable_all()
                .build()
                .map_err(|e| StoreError::Unavailable(format!("store runtime: {e}")))?,
        ));
        let Some(rt) = runtime.0.as_ref() else {
            return Err(StoreError::Unavailable("store runtime".into()));
        };
        let handle = rt.handle().clone();
        let pool = {
            let _entered = rt.enter();
            build_pool(&config, &tls)?
        };
        let inner = Arc::new(Inner {
            pool,
            config,
            tls,
            handle,
            mirror: Arc::new(RwLock::new(Index::default())),
            writer: Arc::new(tokio::sync::Mutex::new(())),
            following: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
        });
        let store = Self {
            inner: inner.clone(),
            _runtime: runtime,
        };
        let version = store.run(|pool| async move {
            let mut client = pool.get().await.map_err(pool_error)?;
            let version = schema::migrate(&mut client).await.map_err(pg_error)?;
            drop(client);
            // Every pooled connection made now, so no write or follower read
            // pays a connection's authentication round trips later.
            let warm = futures_util::future::join_all((0..POOL_SIZE).map(|_| pool.get())).await;
            for connection in warm {
                drop(connection.map_err(pool_error)?);
            }
            Ok(version)
        })?;
        let known = schema::MIGRATIONS.last().map_or(0, |(v, _)| *v);
        if version > known {
            return Err(StoreError::Unavailable(format!(
                "the store's schema is at version {version}, newer than this relay's {known}"
            )));
        }
        follow::start(inner.clone())?;
        // Ready once the mirror holds the table and follows it.
        let until = Instant::now() + OP_TIMEOUT;
        while !inner.following.load(Ordering::Relaxed) {
            if Instant::now() >= until {
                return Err(StoreError::Unavailable(format!(
                    "cannot listen for the store's changes within {OP_TIMEOUT:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(store)
    }

    /// Whether the mirror is following the table (the listening connection
    /// is up); for tests and status.
    pub fn following(&self) -> bool {
        self.inner.following.load(Ordering::Relaxed)
    }

    /// Runs `op` with the pool on the store's runtime and waits for it.
    fn run<T, F, Fut>(&self, op: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(Pool) -> Fut,
        Fut: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        self.inner.run(op)
    }

    /// Runs the statements `op` makes on a pooled connection, retrying a
    /// transaction that lost a deadlock or serialization check, then gives
    /// what it returned to `apply`, all under the writer lock.
    fn write<T, F, Fut>(&self, op: F, apply: fn(&mut Index, &T)) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: Fn(Object) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, Failure>> + Send + 'static,
    {
        let (writer, mirror) = (self.inner.writer.clone(), self.inner.mirror.clone());
        self.run(|pool| async move {
            let _writer = writer.lock().await;
            let mut attempt = 0;
            let done = loop {
                attempt += 1;
                let client = pool.get().await.map_err(pool_error)?;
                match op(client).await {
                    Ok(v) => break v,
                    Err(Failure::Store(e)) => return Err(e),
                    Err(Failure::Pg(e)) if attempt < ATTEMPTS && is_transient(&e) => {}
                    Err(Failure::Pg(e)) => return Err(pg_error(e)),
                }
            };
            apply(
                &mut mirror.write().unwrap_or_else(PoisonError::into_inner),
                &done,
            );
            Ok(done)
        })
    }
}

impl Inner {
    /// See [`PgStore::run`].
    fn run<T, F, Fut>(&self, op: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(Pool) -> Fut,
        Fut: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let fut = op(self.pool.clone());
        self.handle.spawn(async move {
            let result = tokio::time::timeout(OP_TIMEOUT, fut)
                .await
                .unwrap_or_else(|_| {
                    Err(StoreError::Unavailable(format!(
                        "no answer from PostgreSQL within {OP_TIMEOUT:?}"
                    )))
                });
            let _ = tx.send(result);
        });
        rx.recv()
            .unwrap_or_else(|_| Err(StoreError::Unavailable("the store was closed".into())))
    }

    /// How many entries the mirror holds.
    fn entries(&self) -> usize {
        self.mirror
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Reads the whole table into a new mirror and swaps it in, under the
    /// writer lock (after the follower (re)connected: nothing missed stays).
    fn reload(&self) -> Result<(), StoreError> {
        let (writer, mirror) = (self.writer.clone(), self.mirror.clone());
        self.run(|pool| async move {
            let _writer = writer.lock().await;
            let client = pool.get().await.map_err(pool_error)?;
            let rows = client
                .query(&format!("SELECT {COLUMNS} FROM uris"), &[])
                .await
                .map_err(pg_error)?;
            let mut fresh = Index::default();
            for row in &rows {
                fresh.insert(decode(row)?);
            }
            *mirror.write().unwrap_or_else(PoisonError::into_inner) = fresh;
            Ok(())
        })
    }

    /// Reads the rows of `uris` again and puts what it finds in the mirror
    /// (absent rows removed), under the writer lock.
    fn refresh(&self, uris: Vec<String>) -> Result<(), StoreError> {
        let (writer, mirror) = (self.writer.clone(), self.mirror.clone());
        self.run(|pool| async move {
            let _writer = writer.lock().await;
            let client = pool.get().await.map_err(pool_error)?;
            let sql = format!("SELECT {COLUMNS} FROM uris WHERE uri = ANY($1)");
            let rows = client.query(&sql, &[&uris]).await.map_err(pg_error)?;
            let entries = rows.iter().map(decode).collect::<Result<Vec<_>, _>>()?;
            let mut mirror = mirror.write().unwrap_or_else(PoisonError::into_inner);
            for uri in &uris {
                mirror.remove(uri);
            }
            for entry in entries {
                mirror.insert(entry);
            }
            Ok(())
        })
    }
}

/// The pool of connections, with every wait bounded by [`OP_TIMEOUT`].
/// Called inside the store's runtime (the pool's timers live there).
fn build_pool(config: &tokio_postgres::Config, tls: &Tls) -> Result<Pool, StoreError> {
    let manager_config = ManagerConfig {
        recycling_method: RecyclingMethod::Fast,
    };
    let manager = match tls {
        Tls::Off => Manager::from_config(config.clone(), NoTls, manager_config),
        Tls::Rustls(connector) => {
            Manager::from_config(config.clone(), connector.clone(), manager_config)
        }
    };
    Pool::builder(manager)
        .max_size(POOL_SIZE)
        .wait_timeout(Some(OP_TIMEOUT))
        .create_timeout(Some(OP_TIMEOUT))
        .recycle_timeout(Some(OP_TIMEOUT))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()
        .map_err(|e| StoreError::Unavailable(format!("store connection pool: {e}")))
}

/// rustls (ring) trusting `ca_file`'s certificates, or the public web roots.
fn rustls_connector(
    ca_file: Option<&Path>,
) -> Result<tokio_postgres_rustls::MakeRustlsConnect, StoreError> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let certs = CertificateDer::pem_file_iter(path).map_err(|e| {
                StoreError::Unavailable(format!("store CA file {}: {e}", path.display()))
            })?;
            for cert in certs {
                let cert = cert.map_err(|e| {
                    StoreError::Unavailable(format!("store CA file {}: {e}", path.display()))
                })?;
                roots.add(cert).map_err(|e| {
                    StoreError::Unavailable(format!("store CA file {}: {e}", path.display()))
                })?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::Unavailable(format!("store TLS: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

/// Deadlocks and serialization failures: the transaction may succeed if run
/// again.
fn is_transient(e: &tokio_postgres::Error) -> bool {
    matches!(
        e.code(),
        Some(c) if *c == SqlState::T_R_DEADLOCK_DETECTED || *c == SqlState::T_R_SERIALIZATION_FAILURE
    )
}

fn pg_error(e: tokio_postgres::Error) -> StoreError {
    StoreError::Unavailable(format!("PostgreSQL: {}", describe(&e)))
}

fn pool_error(e: deadpool_postgres::PoolError) -> StoreError {
    let reason = match &e {
        deadpool_postgres::PoolError::Backend(e) => describe(e),
        other => other.to_string(),
    };
    StoreError::Unavailable(format!("PostgreSQL connection: {reason}"))
}

/// The server's own message for an error it reported (tokio-postgres shows
/// only "db error"), else the client's. Neither holds the password.
fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => e.to_string(),
    }
}

/// `now` for comparing with stored expiries: a saturated expiry (stored as
/// `i64::MAX`) is reached only at `u64::MAX`, as in redb.
fn now_to_db(now: u64) -> i64 {
    match now {
        u64::MAX => i64::MAX,
        n => i64::try_from(n).unwrap_or(i64::MAX).min(i64::MAX - 1),
    }
}

/// Seconds as stored: `bigint`, so values past `i64::MAX` (a saturated
/// expiry) are stored as `i64::MAX` and read back as `u64::MAX`.
fn to_db(secs: u64) -> i64 {
    i64::try_from(secs).unwrap_or(i64::MAX)
}

fn from_db(secs: i64) -> u64 {
    match secs {
        i64::MAX => u64::MAX,
        s => u64::try_from(s).unwrap_or(0),
    }
}

/// A `uris` row (columns in [`COLUMNS`] order) as an entry.
fn decode(row: &Row) -> Result<UriEntry, StoreError> {
    let bad = |e: tokio_postgres::Error| StoreError::Unavailable(format!("URI store row: {e}"));
    let state: i16 = row.try_get(2).map_err(bad)?;
    let until: i64 = row.try_get(3).map_err(bad)?;
    let state = match state {
        0 => UriState::Pending,
        1 => UriState::Confirmed,
        2 => UriState::Tombstone {
            until: from_db(until),
        },
        other => {
            return Err(StoreError::Unavailable(format!(
                "URI store holds an entry in unknown state {other}"
            )));
        }
    };
    let groups: String = row.try_get(7).map_err(bad)?;
    Ok(UriEntry {
        uri: row.try_get(0).map_err(bad)?,
        host: row.try_get(1).map_err(bad)?,
        state,
        owner: Owner {
            issuer: row.try_get(4).map_err(bad)?,
            subject: row.try_get(5).map_err(bad)?,
            groups: serde_json::from_str(&groups).map_err(|e| {
                StoreError::Unavailable(format!("URI store holds unreadable owner groups: {e}"))
            })?,
        },
        created_at: from_db(row.try_get(6).map_err(bad)?),
    })
}

mod ops;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_password_in_logs() {
        assert_eq!(
            redact_url("postgres://relay:s3cret@db:5432/ahp?sslmode=require"),
            "postgres://relay:<redacted>@db:5432/ahp?sslmode=require"
        );
        assert_eq!(
            redact_url("postgres://relay:p@ss@db/ahp"),
            "postgres://relay:<redacted>@db/ahp"
        );
        let plain = "postgres://relay@db:5432/ahp";
        assert_eq!(redact_url(plain), plain);
        let options = PgOptions {
            url: "postgres://relay:s3cret@db/ahp".into(),
            password: Some("other-s3cret".into()),
            ca_file: None,
        };
        assert!(!format!("{options:?}").contains("s3cret"));
    }

    #[test]
    fn only_postgres_urls_select_postgres() {
        assert!(is_postgres_url(Path::new("postgres://u@h/db")));
        assert!(is_postgres_url(Path::new("postgresql://u@h/db")));
        assert!(!is_postgres_url(Path::new("/var/lib/ahp-relay/uris.redb")));
        assert!(!is_postgres_url(Path::new("postgres.redb")));
    }

    #[test]
    fn saturated_expiries_round_trip_and_are_reached_only_at_the_end() {
        assert_eq!(from_db(to_db(u64::MAX)), u64::MAX);
        assert_eq!(from_db(to_db(42)), 42);
        assert!(now_to_db(u64::MAX - 1) < to_db(u64::MAX));
        assert_eq!(now_to_db(u64::MAX), to_db(u64::MAX));
    }
}

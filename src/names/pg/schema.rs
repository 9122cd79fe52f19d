//! The PostgreSQL schema of the URI store and its versioned migrations.
//!
//! Migrations run at open, in one transaction under an advisory lock, so
//! replicas starting together apply each version exactly once; the applied
//! versions are rows of `schema_migrations`. A migration is never edited once
//! released: a change of layout is a new version appended to [`MIGRATIONS`].

use deadpool_postgres::Object;

/// The advisory lock key held while migrating (any constant unique to this
/// program; "ahprelay" in ASCII).
const MIGRATION_LOCK: i64 = 0x6168_7072_656c_6179;

/// The channel every change of `uris` is announced on, payload = the URI.
pub const CHANNEL: &str = "ahp_relay_uris";

/// `(version, SQL)`, applied in order.
///
/// Version 1: `uris` (one row per client-chosen URI; `state` 0 pending,
/// 1 confirmed, 2 tombstone; `until` the tombstone's expiry, seconds, clamped
/// to `i64::MAX`; `groups` a JSON array of strings), `holders` (what each
/// principal holds, kept by a trigger so a quota check reads one row and
/// locks it), an index of tombstones by expiry for the purge, and a trigger
/// that announces each changed URI on [`CHANNEL`] so every replica's mirror
/// follows.
pub const MIGRATIONS: &[(i32, &str)] = &[(
    1,
    r#"
CREATE TABLE uris (
    uri        text     PRIMARY KEY,
    host       text     NOT NULL,
    state      smallint NOT NULL CHECK (state IN (0, 1, 2)),
    until      bigint   NOT NULL DEFAULT 0,
    issuer     text     NOT NULL,
    subject    text     NOT NULL,
    created_at bigint   NOT NULL,
    groups     text     NOT NULL DEFAULT '[]'
);
CREATE INDEX uris_by_host ON uris (host);
CREATE INDEX uris_expiring ON uris (until) WHERE state = 2;
CREATE TABLE holders (
    issuer     text   NOT NULL,
    subject    text   NOT NULL,
    live       bigint NOT NULL DEFAULT 0,
    tombstones bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (issuer, subject)
);
CREATE FUNCTION uris_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        UPDATE holders
           SET live = live - (OLD.state <> 2)::int,
               tombstones = tombstones - (OLD.state = 2)::int
         WHERE issuer = OLD.issuer AND subject = OLD.subject;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        INSERT INTO holders AS h (issuer, subject, live, tombstones)
        VALUES (NEW.issuer, NEW.subject, (NEW.state <> 2)::int, (NEW.state = 2)::int)
        ON CONFLICT (issuer, subject) DO UPDATE
           SET live = h.live + EXCLUDED.live, tombstones = h.tombstones + EXCLUDED.tombstones;
        PERFORM pg_notify('ahp_relay_uris', NEW.uri);
    ELSE
        PERFORM pg_notify('ahp_relay_uris', OLD.uri);
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER uris_changed AFTER INSERT OR UPDATE OR DELETE ON uris
    FOR EACH ROW EXECUTE FUNCTION uris_changed();
"#,
)];

/// Applies every migration newer than the database's; returns the version
/// the database is at afterwards.
pub async fn migrate(client: &mut Object) -> Result<i32, tokio_postgres::Error> {
    let txn = client.transaction().await?;
    txn.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    txn.batch_execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
             version    integer     PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now()
         )",
    )
    .await?;
    let row = txn
        .query_one(
            "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
            &[],
        )
        .await?;
    let mut at: i32 = row.try_get(0)?;
    for (version, sql) in MIGRATIONS {
        if *version <= at {
            continue;
        }
        txn.batch_execute(sql).await?;
        txn.execute(
            "INSERT INTO schema_migrations (version) VALUES ($1)",
            &[version],
        )
        .await?;
        at = *version;
    }
    txn.commit().await?;
    Ok(at)
}

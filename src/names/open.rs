//! Opens the URI store `[relay] store` names (contract §12.1): a
//! `postgres://` URL selects [`PgStore`] (several replicas), any other value
//! is the path of a [`RedbStore`] file (one replica, the default).

use std::path::Path;
use std::sync::Arc;

use super::pg::{PgOptions, PgStore, is_postgres_url};
use super::store::{RedbStore, StoreError, UriStore};

/// Where the store is: `[relay] store`, `store_password_file` and
/// `store_ca_file`.
#[derive(Debug, Clone, Copy)]
pub struct StoreLocation<'a> {
    /// A redb file path or a `postgres://USER@HOST:PORT/DB` URL.
    pub store: &'a Path,
    /// The PostgreSQL password (its first line is used).
    pub password_file: Option<&'a Path>,
    /// PEM CA certificates trusted for `sslmode=require`.
    pub ca_file: Option<&'a Path>,
}

/// Opens the store. May block for up to [`super::pg::OP_TIMEOUT`] on the
/// network: call it where blocking is allowed.
pub fn open(at: StoreLocation<'_>) -> Result<Arc<dyn UriStore>, StoreError> {
    if !is_postgres_url(at.store) {
        return Ok(Arc::new(RedbStore::open(at.store)?));
    }
    let url = at.store.to_string_lossy().into_owned();
    let password = match at.password_file {
        Some(path) => Some(read_password(path)?),
        None => None,
    };
    let options = PgOptions {
        url,
        password,
        ca_file: at.ca_file.map(Path::to_path_buf),
    };
    Ok(Arc::new(PgStore::open(&options)?))
}

/// What is wrong with `[relay]`'s store keys, if anything: the PostgreSQL
/// keys are meaningless next to a redb path, and the URL must parse.
pub fn location_problem(at: StoreLocation<'_>) -> Option<String> {
    if !is_postgres_url(at.store) {
        return (at.password_file.is_some() || at.ca_file.is_some()).then(|| {
            "relay: store_password_file and store_ca_file need a postgres:// store".into()
        });
    }
    let url = at.store.to_string_lossy();
    url.parse::<tokio_postgres::Config>().err().map(|e| {
        format!(
            "relay: store {} is not a PostgreSQL URL: {e}",
            super::pg::redact_url(&url)
        )
    })
}

/// The first line of `path`, without its line end; the error names the file,
/// never its content.
fn read_password(path: &Path) -> Result<String, StoreError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        StoreError::Unavailable(format!("store password file {}: {e}", path.display()))
    })?;
    let line = text.lines().next().unwrap_or_default();
    if line.is_empty() {
        return Err(StoreError::Unavailable(format!(
            "store password file {} is empty",
            path.display()
        )));
    }
    Ok(line.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str, text: &str) -> std::path::PathBuf {
        let path = std::env::temp_dir().join(format!("ahp-relay-{name}-{}", std::process::id()));
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn the_password_is_the_first_line_and_never_in_errors() {
        let file = temp("pw", "s3cret\nignored\n");
        assert_eq!(read_password(&file).unwrap(), "s3cret");
        let empty = temp("pw-empty", "\n");
        let error = read_password(&empty).unwrap_err().to_string();
        assert!(error.contains("empty") && error.contains(&empty.display().to_string()));
        let missing = std::env::temp_dir().join("ahp-relay-no-such-password-file");
        assert!(read_password(&missing).unwrap_err().is_unavailable());
        let _ = std::fs::remove_file(file);
        let _ = std::fs::remove_file(empty);
    }

    #[test]
    fn store_keys_are_checked_against_the_backend() {
        let problem = |store: &str, pw: bool| {
            location_problem(StoreLocation {
                store: Path::new(store),
                password_file: pw.then(|| Path::new("/pw")),
                ca_file: None,
            })
        };
        assert_eq!(problem("/var/lib/uris.redb", false), None);
        assert!(problem("/var/lib/uris.redb", true).is_some());
        assert_eq!(problem("postgres://u@h:5432/db", true), None);
        let bad = problem("postgres://u:s3cret@h:notaport/db", true);
        assert!(
            bad.as_deref().is_some_and(|b| !b.contains("s3cret")),
            "{bad:?}"
        );
    }
}

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

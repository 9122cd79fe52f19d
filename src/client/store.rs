//! The client's stable `clientId`: one per user and relay, kept in the
//! user's config directory, so repeated runs `reconnect` to one relay
//! session instead of leaving a retained session behind each.
//!
//! Where: `$XDG_CONFIG_HOME/ahp-relay/clients/` (else `~/.config/…`). Each
//! file is a *slot* named `<key>-<n>`, `key` a digest of the relay URL and the
//! token's issuer and subject (read, not verified: the relay verifies), so
//! another user or relay never reuses the id. A running command holds its
//! slot's file lock for its whole life; a second command running at the same
//! time (a `tail` beside a `send`) takes the next slot, because two sockets
//! on one `clientId` would take the session over from each other. At most
//! [`SLOTS`] ids per user and relay exist, however many runs there are.
//! Without a usable config directory the id is random for this run.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use sha2::{Digest, Sha256};

use super::ids;

/// Concurrent commands per user and relay that each get a stable id.
const SLOTS: usize = 8;

/// A client id and, when it is a stored one, the lock that keeps it ours.
#[derive(Debug)]
pub(super) struct StableId {
    /// The `clientId` to send.
    pub(super) id: String,
    /// Held until the process ends; `None` for a one-run random id.
    _lock: Option<File>,
    /// Whether the id was stored before this run (so `reconnect` may find a session).
    pub(super) reused: bool,
}

impl StableId {
    /// A random id for this run only (`--client-id` absent and no slot usable).
    fn random() -> Self {
        Self {
            id: ids::client_id(),
            _lock: None,
            reused: false,
        }
    }
}

/// The token's `iss` and `sub`, read from its payload without verifying it.
pub(super) fn token_principal(token: &str) -> Option<(String, String)> {
    let payload = token.split('.').nth(1)?;
    let claims: serde_json::Value = serde_json::from_slice(&B64.decode(payload).ok()?).ok()?;
    let field = |name: &str| claims.get(name)?.as_str().map(str::to_owned);
    Some((field("iss").unwrap_or_default(), field("sub")?))
}

/// The directory of the stored ids, if the environment names a home.
fn clients_dir() -> Option<PathBuf> {
    let base = match std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").filter(|v| !v.is_empty())?).join(".config"),
    };
    Some(base.join("ahp-relay").join("clients"))
}

/// 16 hex digits naming (relay URL, issuer, subject).
fn slot_key(url: &str, token: Option<&str>) -> String {
    let (iss, sub) = token.and_then(token_principal).unwrap_or_default();
    let digest = Sha256::digest(format!("{url}\n{iss}\n{sub}").as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// The stable id of this user at `url`: the first free slot's, created if
/// new; a random one when no slot can be used.
pub(super) fn stable_client_id(url: &str, token: Option<&str>) -> StableId {
    let Some(dir) = clients_dir() else {
        return StableId::random();
    };
    if std::fs::create_dir_all(&dir).is_err() {
        return StableId::random();
    }
    let key = slot_key(url, token);
    (0..SLOTS)
        .find_map(|n| claim_slot(dir.join(format!("{key}-{n}"))))
        .unwrap_or_else(StableId::random)
}

/// Locks the slot file at `path` and reads (or writes) its id; `None` when
/// another process holds it or the file cannot be used.
fn claim_slot(path: PathBuf) -> Option<StableId> {
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .ok()?;
    file.try_lock().ok()?;
    let mut stored = String::new();
    file.read_to_string(&mut stored).ok()?;
    let stored = stored.trim();
    if is_client_id(stored) {
        return Some(StableId {
            id: stored.to_owned(),
            _lock: Some(file),
            reused: true,
        });
    }
    let id = ids::client_id();
    file.set_len(0).ok()?;
    file.seek(SeekFrom::Start(0)).ok()?;
    file.write_all(format!("{id}\n").as_bytes()).ok()?;
    Some(StableId {
        id,
        _lock: Some(file),
        reused: false,
    })
}

/// Whether `s` has the shape of [`ids::client_id`].
fn is_client_id(s: &str) -> bool {
    s.strip_prefix("cli-")
        .is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_principal_is_read_from_the_payload() {
        let payload = B64.encode(br#"{"iss":"ahp-relay-dev","sub":"alice","exp":1}"#);
        let token = format!("e30.{payload}.sig");
        assert_eq!(
            token_principal(&token),
            Some(("ahp-relay-dev".into(), "alice".into()))
        );
        assert_eq!(token_principal("not-a-jwt"), None);
    }

    #[test]
    fn keys_differ_by_relay_and_user() {
        let alice = format!("e30.{}.s", B64.encode(br#"{"iss":"i","sub":"alice"}"#));
        let bob = format!("e30.{}.s", B64.encode(br#"{"iss":"i","sub":"bob"}"#));
        let a = slot_key("wss://r/", Some(&alice));
        assert_eq!(a, slot_key("wss://r/", Some(&alice)));
        assert_ne!(a, slot_key("wss://r/", Some(&bob)));
        assert_ne!(a, slot_key("wss://other/", Some(&alice)));
        assert_eq!(a.len(), 16);
    }

    #[test]
    fn a_held_slot_is_skipped_and_a_freed_one_reused() {
        let dir = std::env::temp_dir().join(format!("ahp-relay-store-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let first = claim_slot(dir.join("k-0")).unwrap();
        assert!(!first.reused && is_client_id(&first.id));
        assert!(claim_slot(dir.join("k-0")).is_none(), "held by `first`");
        let id = first.id.clone();
        drop(first);
        let again = claim_slot(dir.join("k-0")).unwrap();
        assert!(again.reused);
        assert_eq!(again.id, id);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

//! The two directions of name translation for one host and one client
//! session: [`ToClient`] (host → client, never fails) and [`ToHost`]
//! (client → host, fail-closed), used with the rewrite table in
//! [`super::translate`].

use super::qualify::{self as names, ClientName, Unqualifiable, UriParts};
use super::seen::{Seen, ShownIn};
use super::store::{UriState, UriStore};
use super::translate::{FieldKind, NameError, Namer};

/// Whether `base` is a live client-chosen URI the store records for `host`.
pub fn is_store_entry(store: &dyn UriStore, host: &str, base: &str) -> bool {
    matches!(store.lookup(base), Ok(Some(e)) if e.host == host && !matches!(e.state, UriState::Tombstone { .. }))
}

/// Host → client: qualify host URIs, suffix providers with `.host`, show the
/// session's own upstream id as the client's id (other ids stay opaque).
pub struct ToClient<'a> {
    /// The host the value came from.
    pub host: &'a str,
    /// The URI store (verbatim entries).
    pub store: &'a dyn UriStore,
    /// The receiving session's identities: (upstream id, client id).
    pub identity: Option<(&'a str, &'a str)>,
}

impl Namer for ToClient<'_> {
    fn translate(&self, kind: FieldKind, value: &str) -> Result<String, NameError> {
        let entry = |base: &str| is_store_entry(self.store, self.host, base);
        let refused = NameError::from;
        Ok(match kind {
            FieldKind::Uri | FieldKind::Ref => {
                names::qualify(self.host, value, entry).map_err(refused)?
            }
            FieldKind::UriTemplate => names::map_template(
                value,
                |marked| names::qualify(self.host, marked, entry),
                Unqualifiable,
            )
            .map_err(refused)?,
            FieldKind::Published => value.to_string(),
            FieldKind::Provider => names::qualify_provider(self.host, value),
            FieldKind::ClientId => match self.identity {
                Some((up, own)) if value == up => own.to_string(),
                _ => value.to_string(),
            },
        })
    }
}

/// [`ToClient`] for a frame bound for one client session that notes in
/// `seen` every host object it refers the client to (fields of kind
/// [`FieldKind::Ref`] and URI templates): what that client may use later
/// (contract §7.1). Other fields cost nothing more.
pub struct Noting<'a> {
    /// The translation.
    pub to_client: ToClient<'a>,
    /// The receiving session's notes.
    pub seen: &'a Seen,
    /// Where the frame shows them (its channel, or an answer).
    pub at: ShownIn<'a>,
}

impl Namer for Noting<'_> {
    fn translate(&self, kind: FieldKind, value: &str) -> Result<String, NameError> {
        let client = self.to_client.translate(kind, value)?;
        if matches!(kind, FieldKind::Ref | FieldKind::UriTemplate) {
            self.seen.note(&client, self.at);
        }
        Ok(client)
    }
}

/// The shapes (rewrite-table keys) that remove the object they name.
pub const REMOVALS: [&str; 2] = ["root/sessionRemoved", "session/chatRemoved"];

/// Host → client names for a removal ([`REMOVALS`]). It may reach the relay
/// after the relay answered the dispose and tombstoned the object's store
/// entry (the answer comes on the disposer's own link; the removal on the
/// watch link or on other clients' links): a client-chosen session or chat
/// then keeps the name its followers know it by, not the host-assigned
/// form [`ToClient`] gives a URI without a live entry (found by
/// `tests/relay_model.rs`).
///
/// Each name is decided on **one** read of the store: an entry of this
/// host in any state, live or tombstoned, keeps the client's name. The
/// dispose's tombstone is written concurrently with the removal's
/// fan-out, so two reads ("tombstoned?", then "live?") could see the
/// entry live and then tombstoned and name it as neither (found by the
/// model run, seed 173). Only a removal: a host announcing an object
/// under a tombstoned name made it itself, and is named as host-assigned.
/// Every other kind of value is `inner`'s.
pub struct Removal<'a> {
    inner: &'a dyn Namer,
    store: &'a dyn UriStore,
    host: &'a str,
}

impl<'a> Removal<'a> {
    /// Removal names from `host` on `store`; values that are not URIs go to
    /// `inner`.
    pub fn new(inner: &'a dyn Namer, store: &'a dyn UriStore, host: &'a str) -> Self {
        Removal { inner, store, host }
    }
}

impl Namer for Removal<'_> {
    fn translate(&self, kind: FieldKind, value: &str) -> Result<String, NameError> {
        if kind != FieldKind::Uri {
            return self.inner.translate(kind, value);
        }
        let held =
            |base: &str| matches!(self.store.lookup(base), Ok(Some(e)) if e.host == self.host);
        names::qualify(self.host, value, held).map_err(NameError::from)
    }
}

/// Client → host: every value must name the target host (qualified URI of
/// this host, store entry of this host, `….host` provider, the sender's own
/// client id); anything else fails the frame.
pub struct ToHost<'a> {
    /// The host the frame goes to.
    pub host: &'a str,
    /// The URI store.
    pub store: &'a dyn UriStore,
    /// The sending session's identities: (upstream id, client id).
    pub identity: (&'a str, &'a str),
}

impl Namer for ToHost<'_> {
    fn translate(&self, kind: FieldKind, value: &str) -> Result<String, NameError> {
        match kind {
            FieldKind::Uri | FieldKind::Ref => to_host_uri(self.store, self.host, value),
            FieldKind::UriTemplate => names::map_template(
                value,
                |marked| to_host_uri(self.store, self.host, marked),
                NameError::MalformedTemplate,
            ),
            FieldKind::Published => Ok(value.to_string()),
            FieldKind::Provider => match names::read_provider(value) {
                Some((p, h)) if h == self.host => Ok(p.to_string()),
                Some(_) => Err(NameError::OtherHostsProvider),
                None => Err(NameError::MalformedProvider),
            },
            FieldKind::ClientId => {
                let (up, own) = self.identity;
                if value == own {
                    Ok(up.to_string())
                } else {
                    Err(NameError::NotOwnClientId)
                }
            }
        }
    }
}

/// The host form of a client URI bound for `host`, or why it has none.
/// URIs that are not host names pass unchanged; a bare `file:///p` means
/// `host`'s file (the request is routed there).
pub fn to_host_uri(store: &dyn UriStore, host: &str, uri: &str) -> Result<String, NameError> {
    if !names::is_host_name(uri) {
        return Ok(uri.to_string());
    }
    match names::read_client_uri(uri) {
        Ok(ClientName::Qualified { host: h, host_uri }) if h == host => {
            if aliases_store_entry(store, &h, &host_uri) {
                return Err(NameError::Unknown);
            }
            Ok(host_uri)
        }
        Ok(ClientName::Qualified { .. }) => Err(NameError::OtherHost),
        Ok(ClientName::Verbatim { key }) if is_store_entry(store, host, &key) => {
            Ok(uri.to_string())
        }
        Ok(ClientName::LocalFile { host_uri }) => Ok(host_uri),
        Ok(ClientName::Verbatim { .. }) | Err(_) => Err(NameError::Unknown),
    }
}

/// The store key a host URI would have if a client had chosen it: its own
/// base, or that of the session an authority-form chat embeds. A
/// provider-scheme session has none in this sense: its one client name is
/// the scheme-qualified one, store entry or not.
fn store_base(host_uri: &str) -> Option<String> {
    let session = names::session_of_chat_uri(host_uri);
    let parts = UriParts::parse(session.as_deref().unwrap_or(host_uri))?;
    (!names::is_provider_scheme(parts.scheme)).then(|| parts.base())
}

/// Whether a qualified URI's host form is a client-chosen store entry of
/// that host: such a URI has exactly one name, the verbatim one, so the
/// qualified spelling is not an alias for it (contract §4.2).
fn aliases_store_entry(store: &dyn UriStore, host: &str, host_uri: &str) -> bool {
    store_base(host_uri).is_some_and(|base| is_store_entry(store, host, &base))
}

/// The host a client channel URI belongs to and its host form; `None` when
/// the URI is not a host channel the relay knows (a bare `file:///p` names
/// no host by itself).
pub fn route(store: &dyn UriStore, uri: &str) -> Option<(String, String)> {
    match names::read_client_uri(uri).ok()? {
        ClientName::Qualified { host, host_uri } => {
            (!aliases_store_entry(store, &host, &host_uri)).then_some((host, host_uri))
        }
        ClientName::Verbatim { key } => match store.lookup(&key) {
            Ok(Some(e)) if !matches!(e.state, UriState::Tombstone { .. }) => {
                Some((e.host, uri.to_string()))
            }
            _ => None,
        },
        ClientName::LocalFile { .. } => None,
    }
}

/// Whether the store says a client channel URI is gone: a name the relay
/// issued whose entry is tombstoned (disposed) or purged. Only the store's
/// answer counts: a name it cannot read now (store unavailable) is not
/// gone, and a host-named channel is never gone by the store's word.
pub fn is_gone(store: &dyn UriStore, uri: &str) -> bool {
    match names::read_client_uri(uri) {
        Ok(ClientName::Verbatim { key }) => match store.lookup(&key) {
            Ok(Some(e)) => matches!(e.state, UriState::Tombstone { .. }),
            Ok(None) => true,
            Err(_) => false,
        },
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::store::{Owner, Quota, RedbStore, StoreError, UriEntry};

    type Res<T> = Result<T, StoreError>;

    /// An in-memory store whose `lookup` is scripted: see [`tombstoned_after_read`]
    /// and [`unreadable`].
    struct Scripted {
        inner: RedbStore,
        lookup: fn(&RedbStore, &str) -> Res<Option<UriEntry>>,
    }

    /// A store whose dispose lands right after every read: each `lookup`
    /// answers what the store held, then tombstones that entry — the
    /// interleaving of a removal's fan-out with the dispose answer's
    /// tombstone write.
    fn tombstoned_after_read() -> Scripted {
        Scripted {
            inner: in_memory(),
            lookup: |inner, uri| {
                let seen = inner.lookup(uri);
                let _ = inner.tombstone(uri, 2, 60);
                seen
            },
        }
    }

    /// A store that cannot answer a lookup (unavailable).
    fn unreadable() -> Scripted {
        Scripted {
            inner: in_memory(),
            lookup: |_, _| Err(StoreError::Unavailable("down".into())),
        }
    }

    fn in_memory() -> RedbStore {
        let Ok(inner) = RedbStore::open_in_memory() else {
            panic!("in-memory store");
        };
        inner
    }

    impl UriStore for Scripted {
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
            (self.lookup)(&self.inner, uri)
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

    fn owner() -> Owner {
        Owner {
            issuer: "i".into(),
            subject: "alice".into(),
            groups: Vec::new(),
        }
    }

    /// A live, client-chosen session and chat whose tombstone is written
    /// between any two reads keep their client names in a removal; a name
    /// the store holds for another host, or not at all, is host-assigned.
    #[test]
    fn a_removal_keeps_the_client_name_while_the_dispose_lands() {
        let store = tombstoned_after_read();
        for uri in ["ahp-session:/s1", "ahp-chat:/c1"] {
            assert!(store.reserve(uri, "h1", &owner(), 1).is_ok());
            assert!(store.confirm(uri).is_ok());
        }
        assert!(store.reserve("ahp-session:/s2", "h2", &owner(), 1).is_ok());
        let to_client = ToClient {
            host: "h1",
            store: &store,
            identity: None,
        };
        let removal = Removal::new(&to_client, &store, "h1");
        let name = |v: &str| removal.translate(FieldKind::Uri, v).ok();
        assert_eq!(name("ahp-session:/s1").as_deref(), Some("ahp-session:/s1"));
        assert_eq!(name("ahp-chat:/c1").as_deref(), Some("ahp-chat:/c1"));
        // Tombstoned before the removal was read: still the client's name.
        assert_eq!(name("ahp-session:/s1").as_deref(), Some("ahp-session:/s1"));
        assert_eq!(
            name("ahp-session:/s2").as_deref(),
            Some("ahp-session:/h1~s2")
        );
        assert_eq!(
            name("ahp-session:/s3").as_deref(),
            Some("ahp-session:/h1~s3")
        );
        // Values that are not URIs are the inner namer's.
        assert_eq!(
            removal
                .translate(FieldKind::Provider, "sim")
                .ok()
                .as_deref(),
            Some("sim.h1")
        );
    }

    /// Only the store's word makes a name gone: a tombstoned or purged
    /// relay-issued name is; a live one, a host-named channel and a name
    /// the store cannot read now are not (a re-evaluation then closes).
    #[test]
    fn a_name_is_gone_only_when_the_store_says_so() {
        let store = Scripted {
            inner: in_memory(),
            lookup: |inner, uri| inner.lookup(uri),
        };
        for uri in ["ahp-terminal:/t1", "ahp-terminal:/t2"] {
            assert!(store.reserve(uri, "h1", &owner(), 1).is_ok());
            assert!(store.confirm(uri).is_ok());
        }
        assert!(store.tombstone("ahp-terminal:/t2", 2, 60).is_ok());
        assert!(!is_gone(&store, "ahp-terminal:/t1"));
        assert!(is_gone(&store, "ahp-terminal:/t2"));
        assert!(is_gone(&store, "ahp-terminal:/never-issued"));
        assert!(!is_gone(&store, "ahp-terminal:/h1~1"));
        let down = unreadable();
        assert!(!is_gone(&down, "ahp-terminal:/t1"));
    }
}

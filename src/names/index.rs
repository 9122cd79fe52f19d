//! The URI store's committed entries in memory, indexed so that no store
//! operation walks every entry (contract §7.6: one principal's creates and
//! disposes must not make everyone's creates slower as the store grows):
//! by URI (lookups), by owner (the quota counts), by host (a host's
//! entries), and tombstones by expiry (purge). Every change goes through
//! [`Index::insert`] and [`Index::remove`], which keep the four in step.

use std::collections::{BTreeSet, HashMap};

use super::store::{UriEntry, UriState};

/// What one principal holds in the store.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    /// Pending and confirmed entries.
    pub live: usize,
    /// Tombstones not yet purged.
    pub tombstones: usize,
}

/// The committed entries, indexed.
#[derive(Debug, Default)]
pub struct Index {
    by_uri: HashMap<String, UriEntry>,
    by_owner: HashMap<(String, String), Held>,
    by_host: HashMap<String, BTreeSet<String>>,
    expiring: BTreeSet<(u64, String)>,
}

impl Index {
    /// The entry of `uri`.
    pub fn get(&self, uri: &str) -> Option<&UriEntry> {
        self.by_uri.get(uri)
    }

    /// Stores `entry`, replacing the entry of its URI.
    pub fn insert(&mut self, entry: UriEntry) {
        self.remove(&entry.uri);
        let held = self.held_mut(&entry);
        match entry.state {
            UriState::Tombstone { until } => {
                held.tombstones += 1;
                self.expiring.insert((until, entry.uri.clone()));
            }
            _ => held.live += 1,
        }
        self.by_host
            .entry(entry.host.clone())
            .or_default()
            .insert(entry.uri.clone());
        self.by_uri.insert(entry.uri.clone(), entry);
    }

    /// Removes the entry of `uri`; returns it.
    pub fn remove(&mut self, uri: &str) -> Option<UriEntry> {
        let entry = self.by_uri.remove(uri)?;
        let key = (entry.owner.issuer.clone(), entry.owner.subject.clone());
        if let Some(held) = self.by_owner.get_mut(&key) {
            match entry.state {
                UriState::Tombstone { until } => {
                    held.tombstones = held.tombstones.saturating_sub(1);
                    self.expiring.remove(&(until, entry.uri.clone()));
                }
                _ => held.live = held.live.saturating_sub(1),
            }
            if *held == Held::default() {
                self.by_owner.remove(&key);
            }
        }
        if let Some(uris) = self.by_host.get_mut(&entry.host) {
            uris.remove(uri);
            if uris.is_empty() {
                self.by_host.remove(&entry.host);
            }
        }
        Some(entry)
    }

    /// What the principal (`issuer`, `subject`) holds.
    pub fn held(&self, issuer: &str, subject: &str) -> Held {
        self.by_owner
            .get(&(issuer.to_owned(), subject.to_owned()))
            .copied()
            .unwrap_or_default()
    }

    /// The entries of `host`, sorted by URI.
    pub fn of_host(&self, host: &str) -> Vec<UriEntry> {
        self.by_host
            .get(host)
            .into_iter()
            .flatten()
            .filter_map(|uri| self.by_uri.get(uri).cloned())
            .collect()
    }

    /// The URIs of tombstones with `until <= now`.
    pub fn expired(&self, now: u64) -> Vec<String> {
        self.expiring
            .iter()
            .take_while(|(until, _)| *until <= now)
            .map(|(_, uri)| uri.clone())
            .collect()
    }

    /// How many entries there are.
    pub fn len(&self) -> usize {
        self.by_uri.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_uri.is_empty()
    }

    fn held_mut(&mut self, entry: &UriEntry) -> &mut Held {
        let key = (entry.owner.issuer.clone(), entry.owner.subject.clone());
        self.by_owner.entry(key).or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::store::Owner;

    fn entry(uri: &str, host: &str, sub: &str, state: UriState) -> UriEntry {
        UriEntry {
            uri: uri.into(),
            host: host.into(),
            state,
            owner: Owner {
                issuer: "i".into(),
                subject: sub.into(),
                groups: vec![],
            },
            created_at: 1,
        }
    }

    #[test]
    fn every_index_follows_every_change() {
        let mut ix = Index::default();
        ix.insert(entry("s:/1", "a", "alice", UriState::Pending));
        ix.insert(entry("s:/2", "b", "alice", UriState::Confirmed));
        ix.insert(entry("s:/3", "a", "bob", UriState::Tombstone { until: 10 }));
        assert_eq!(
            ix.held("i", "alice"),
            Held {
                live: 2,
                tombstones: 0
            }
        );
        assert_eq!(
            ix.held("i", "bob"),
            Held {
                live: 0,
                tombstones: 1
            }
        );
        let on_a: Vec<String> = ix.of_host("a").into_iter().map(|e| e.uri).collect();
        assert_eq!(on_a, ["s:/1", "s:/3"]);
        // A dispose: live → tombstone, counted as such.
        ix.insert(entry(
            "s:/2",
            "b",
            "alice",
            UriState::Tombstone { until: 5 },
        ));
        assert_eq!(
            ix.held("i", "alice"),
            Held {
                live: 1,
                tombstones: 1
            }
        );
        assert_eq!(ix.expired(4), Vec::<String>::new());
        assert_eq!(ix.expired(10), ["s:/2", "s:/3"]);
        ix.remove("s:/2");
        ix.remove("s:/3");
        assert_eq!(ix.held("i", "bob"), Held::default());
        assert!(ix.of_host("b").is_empty());
        assert_eq!(ix.len(), 1);
    }
}

//! A read-only view of the client sessions for the status page: per
//! principal, how many sessions are attached, detached (links still open)
//! or retained (links closed), the hosts they use and the bytes waiting in
//! their sockets' queues. Counts and host ids only: no clientId, no
//! channel, no message.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::Registry;

/// The sessions of one principal.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PrincipalRow {
    /// The token issuer.
    pub issuer: String,
    /// The token subject.
    pub subject: String,
    /// Sessions with a socket.
    pub attached: usize,
    /// Sessions without a socket whose links are still open (detach grace).
    pub detached: usize,
    /// Sessions without a socket or links, kept for `reconnect`.
    pub retained: usize,
    /// Host ids its sessions have links to.
    pub hosts: BTreeSet<String>,
    /// Bytes queued for its sockets and not yet written.
    pub queued_bytes: usize,
}

/// How many client sessions are attached, detached and retained.
#[derive(Debug, Clone, Copy, Default)]
pub struct Attachment {
    /// Sessions with a socket.
    pub attached: usize,
    /// Sessions without a socket whose links are still open.
    pub detached: usize,
    /// Sessions without a socket or links.
    pub retained: usize,
}

impl Registry {
    /// The sessions counted by attachment (the status page's history
    /// samples this once per interval; no per-principal rows).
    pub fn attachment(&self) -> Attachment {
        let mut n = Attachment::default();
        for entry in self.sessions.iter() {
            let core = entry.value().lock();
            match (&core.attachment.socket, core.links.open.is_empty()) {
                (Some(_), _) => n.attached += 1,
                (None, false) => n.detached += 1,
                (None, true) => n.retained += 1,
            }
        }
        n
    }

    /// Every principal with a session, ordered by issuer and subject.
    pub fn status_rows(&self) -> Vec<PrincipalRow> {
        let mut rows: BTreeMap<(String, String), PrincipalRow> = BTreeMap::new();
        for entry in self.sessions.iter() {
            let p = &entry.key().principal;
            let row = rows
                .entry((p.issuer.clone(), p.subject.clone()))
                .or_insert_with(|| PrincipalRow {
                    issuer: p.issuer.clone(),
                    subject: p.subject.clone(),
                    ..PrincipalRow::default()
                });
            let core = entry.value().lock();
            match (&core.attachment.socket, core.links.open.is_empty()) {
                (Some(socket), _) => {
                    row.attached += 1;
                    row.queued_bytes += socket.out.queued_bytes();
                }
                (None, false) => row.detached += 1,
                (None, true) => row.retained += 1,
            }
            row.hosts
                .extend(core.links.open.keys().map(|h| h.to_string()));
        }
        rows.into_values().collect()
    }
}

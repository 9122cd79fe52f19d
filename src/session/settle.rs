//! Creates whose answer was lost (contract §4.2, §7.6). A create that timed
//! out, whose link dropped or whose relay restarted before the host answered
//! keeps its store entry *pending*: the host may well have made the object,
//! or still make it — a host that was slow may read the create minutes
//! later. Pending entries are settled from the host's own lists while its
//! watch link is up: confirmed as soon as the host lists the object (its
//! creator keeps it, nobody sees it as external); released only once
//! `limits.pending_create_release_secs` have passed without the host listing
//! it (the name is free again). Until then the entry still names its
//! creator, so the object is never shown as created outside the relay.

use std::sync::Arc;
use std::time::Duration;

use super::Registry;
use crate::names::qualify::{ChannelKind, channel_kind};
use crate::names::store::{UriState, UriStore};
use crate::upstream::hub::{HostHub, HostStatus};

impl Registry {
    /// Settles lost creates every `limits.pending_create_check_secs`, for as
    /// long as the relay runs. Store writes run on a blocking thread.
    pub async fn settle_lost_creates(self: Arc<Self>) {
        let limits = &self.env.cfg.limits;
        let every = Duration::from_secs(limits.pending_create_check_secs.max(1));
        let ages = Ages {
            confirm: limits.upstream_request_secs,
            release: limits.pending_create_release_secs,
        };
        loop {
            tokio::time::sleep(every).await;
            let hubs: Vec<Arc<HostHub>> = self
                .env
                .hosts
                .all()
                .into_iter()
                .filter(|h| h.status() == HostStatus::Up)
                .collect();
            let store = self.env.store.clone();
            let now = crate::identity::unix_now();
            let settled = tokio::task::spawn_blocking(move || {
                hubs.iter()
                    .map(|h| settle_host(store.as_ref(), h, now, ages))
                    .sum::<usize>()
            })
            .await
            .unwrap_or(0);
            if settled > 0 {
                tracing::info!(settled, "pending creates settled from the hosts' lists");
            }
        }
    }
}

/// How old a pending entry must be before it is settled: confirmed when
/// listed (a create still in flight is confirmed by its own answer first),
/// released when not listed.
#[derive(Debug, Clone, Copy)]
struct Ages {
    confirm: u64,
    release: u64,
}

/// Settles `hub`'s pending entries by their age at `now`; returns how many.
fn settle_host(store: &dyn UriStore, hub: &HostHub, now: u64, ages: Ages) -> usize {
    let Ok(entries) = store.entries_for_host(&hub.id) else {
        return 0;
    };
    let mut settled = 0;
    for entry in entries.into_iter().filter(|e| e.state == UriState::Pending) {
        let age = now.saturating_sub(entry.created_at);
        let written = match lists(hub, &entry.uri) {
            true if age >= ages.confirm => store.confirm(&entry.uri),
            false if age >= ages.release => store.release(&entry.uri),
            _ => continue,
        };
        settled += usize::from(written.is_ok());
    }
    settled
}

/// Whether `hub`'s mirrors list the object named by host URI `uri`.
fn lists(hub: &HostHub, uri: &str) -> bool {
    match channel_kind(uri) {
        ChannelKind::Session => hub.has_session(uri),
        ChannelKind::Chat => hub.session_of_chat(uri).is_some(),
        ChannelKind::Terminal => hub.terminal_claim(uri).is_some(),
        ChannelKind::Other => false,
    }
}

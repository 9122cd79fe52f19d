//! Re-evaluation after a change of rights (contract §7.6): what a session
//! keeps — subscriptions, links, shown host objects, kept tokens — is
//! pruned to what the principal may still see, under the policy and groups
//! in force.

use std::sync::Arc;

use crate::policy::Permission;
use crate::route::router;
use crate::session::{ClientSession, SessionCore};

impl ClientSession {
    /// After a change of rights: drops root's baseline (what was buffered
    /// for root was filtered under the old rights), forgets subscribed
    /// channels the principal can no longer see (they lose their baseline,
    /// so `reconnect` cannot replay them) and tells their hosts it no
    /// longer follows them, ends
    /// its `session/activeClientSet` registrations in sessions it may no
    /// longer see or operate, revokes `authenticate` tokens where it no
    /// longer operates ([`Self::revoke_tokens_gone`]), closes links to hosts
    /// it can no longer see (failing what is in flight on them), and then
    /// forgets the host objects it was shown only where it can no longer
    /// read ([`Self::forget_unreadable_refs`]). Returns whether any
    /// subscribed channel was lost.
    ///
    /// A host drops a client from a session's `activeClients` when the
    /// client unsubscribes from the session channel (AHP
    /// `SessionActiveClientRemovedAction`): that `unsubscribe` is how the
    /// registration ends, so the session's agent no longer calls the
    /// client's tools or asks its client for files. Everything is sent to a
    /// host before its link closes (a link writes its queue first).
    pub(crate) fn forget_invisible(self: &Arc<Self>) -> bool {
        let lost = self.lost_subscriptions();
        let gone = self.hosts_gone();
        let mut core = self.lock();
        let mut leave = Vec::new();
        // Root actions buffered so far were filtered under the old rights
        // (§3.5): a `reconnect` gets root afresh, never replayed.
        core.channels.baselined.remove(ahp_types::ROOT_RESOURCE_URI);
        for c in &lost {
            core.channels.baselined.remove(c);
            core.channels.subs.remove(c);
        }
        for (host, chans) in core.channels.chans.iter() {
            let hidden = chans
                .iter()
                .filter(|(_, chan)| lost.contains(&chan.client().to_string()));
            leave.extend(hidden.map(|(host_uri, _)| (host.clone(), host_uri.clone())));
        }
        leave.extend(self.registrations_lost(&mut core));
        for (host, host_uri) in &leave {
            self.unfollow(&mut core, host, host_uri);
        }
        drop(core);
        self.revoke_tokens_gone();
        let mut core = self.lock();
        for host in gone {
            if let Some(link) = core.links.open.remove(&host) {
                let err = crate::rpc::RpcError::upstream_lost(&host);
                self.fail_link_requests_locked(&mut core, link.id, &err);
            }
            core.channels.chans.remove(&host);
        }
        drop(core);
        // Last: a channel still followed above could note objects.
        self.forget_unreadable_refs();
        !lost.is_empty()
    }

    /// Subscribed channels (client form, root aside) the principal can no
    /// longer reach.
    fn lost_subscriptions(&self) -> Vec<String> {
        let subs: Vec<String> = self
            .lock()
            .channels
            .subs
            .iter()
            .filter(|c| *c != ahp_types::ROOT_RESOURCE_URI)
            .cloned()
            .collect();
        subs.into_iter()
            .filter(|c| router::host_for(&self.env, self.who().caller(), c).is_err())
            .collect()
    }

    /// Hosts the principal no longer has any grant on.
    fn hosts_gone(&self) -> Vec<Arc<str>> {
        let now = self.who();
        let who = now.subject();
        let hosts = self.env.hosts.all().into_iter();
        hosts
            .filter(|h| self.env.access.grant_on(who, h).is_none())
            .map(|h| h.id.clone())
            .collect()
    }

    /// Removes and returns the (host, host session) registrations the
    /// principal may no longer hold: the session hidden from it, or no
    /// longer operated (`session/activeClientSet` needs `sessions:operate`).
    fn registrations_lost(&self, core: &mut SessionCore) -> Vec<(Arc<str>, String)> {
        let now = self.who();
        let who = now.subject();
        let access = &self.env.access;
        let keeps = |(host, session): &(Arc<str>, String)| {
            let hub = self.env.hosts.get(host);
            let grant = hub.as_ref().and_then(|hub| access.grant_on(who, hub));
            hub.zip(grant).is_some_and(|(hub, g)| {
                g.permits(Permission::SessionsOperate)
                    && access.sees_channel(who, &g, &hub, session)
            })
        };
        let (kept, lost) = std::mem::take(&mut core.links.registered)
            .into_iter()
            .partition(keeps);
        core.links.registered = kept;
        lost.into_iter().collect()
    }
}

impl ClientSession {
    /// Forgets the content references (and other host objects) this client
    /// was shown only in channels it can no longer see or in answers from
    /// hosts it can no longer see (contract §7.6), so naming one is again
    /// as unknown as a random URI. Returns how many were forgotten.
    pub(crate) fn forget_unreadable_refs(&self) -> usize {
        use crate::names::seen::ShownIn;
        let now = self.who();
        let (who, caller) = (now.subject(), now.caller());
        self.seen.retain_shown(|at| match at {
            ShownIn::Channel(c) if c == ahp_types::ROOT_RESOURCE_URI => true,
            ShownIn::Channel(c) => router::host_for(&self.env, caller, c).is_ok(),
            ShownIn::Answer(host) => self
                .env
                .hosts
                .get(host)
                .is_some_and(|h| self.env.access.grant_on(who, &h).is_some()),
        })
    }
}

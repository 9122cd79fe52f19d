//! Re-evaluation after a change of rights (contract §7.6): what a session
//! keeps — subscriptions, links, shown host objects, kept tokens — is
//! pruned to what the principal may still see, under the policy and groups
//! in force.

use std::sync::Arc;

use crate::route::router;
use crate::session::ClientSession;

impl ClientSession {
    /// After a policy change: forgets subscribed channels the principal can
    /// no longer see (they lose their baseline, so `reconnect` cannot replay
    /// them), closes links to hosts it can no longer see, forgets the host
    /// objects it was shown only where it can no longer read
    /// ([`Self::forget_unreadable_refs`]) and revokes `authenticate` tokens
    /// on links to hosts it no longer operates
    /// ([`Self::revoke_tokens_gone`]). Returns whether any subscribed
    /// channel was lost.
    pub(crate) fn forget_invisible(&self) -> bool {
        self.forget_unreadable_refs();
        let subs: Vec<String> = self
            .lock()
            .channels
            .subs
            .iter()
            .filter(|c| *c != ahp_types::ROOT_RESOURCE_URI)
            .cloned()
            .collect();
        let lost: Vec<String> = subs
            .into_iter()
            .filter(|c| router::host_for(&self.env, self.who().caller(), c).is_err())
            .collect();
        let now = self.who();
        let who = now.subject();
        let gone: Vec<Arc<str>> = self
            .env
            .hosts
            .all()
            .into_iter()
            .filter(|h| self.env.access.grant_on(who, h).is_none())
            .map(|h| h.id.clone())
            .collect();
        let mut core = self.lock();
        for c in &lost {
            core.channels.baselined.remove(c);
            core.channels.subs.remove(c);
        }
        for chans in core.channels.chans.values_mut() {
            chans.retain(|_, chan| !lost.iter().any(|c| c == chan.client()));
        }
        for host in gone {
            core.links.open.remove(&host);
            core.channels.chans.remove(&host);
        }
        drop(core);
        // After the links to invisible hosts are gone: they take their
        // tokens with them, nothing to send there.
        self.revoke_tokens_gone();
        !lost.is_empty()
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

//! What a principal can see (contract §4.4, §6.1, §7.2): hosts through
//! their grant; sessions through their creator (the URI store) or the
//! external-sessions rule; chats through the session that lists them;
//! terminals through their claim or their creator; every other URI a
//! client names through what it belongs to (`sees_named`, `OWNERS`: a
//! session it derives from, a canvas's chat, or having been shown to the
//! client). An object that does not exist is invisible too, so
//! "invisible" and "nonexistent" are one answer, decided without
//! contacting any host.

use serde_json::Value;

use std::sync::{Arc, RwLock};

use super::{Grant, HostRef, Policy, Subject};
use crate::identity::Keys;
use crate::names::qualify::{ChannelKind, channel_kind, session_of_chat_uri};
use crate::names::store::{Owner, UriEntry, UriState, UriStore};
use crate::upstream::hub::{HostHub, HostStatus};

/// The visibility decision point: the policy in force, the ownership store
/// and the keys that recognise a principal's own upstream ids.
pub struct Access {
    policy: RwLock<Arc<dyn Policy>>,
    store: Arc<dyn UriStore>,
    keys: Keys,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access").finish_non_exhaustive()
    }
}

impl Access {
    /// Access decided by `policy` over the creators recorded in `store`.
    pub fn new(policy: Arc<dyn Policy>, store: Arc<dyn UriStore>, keys: Keys) -> Self {
        Self {
            policy: RwLock::new(policy),
            store,
            keys,
        }
    }

    /// The policy in force.
    pub fn policy(&self) -> Arc<dyn Policy> {
        self.policy
            .read()
            .map(|p| p.clone())
            .unwrap_or_else(|e| e.into_inner().clone())
    }

    /// Replaces the policy; the next decision uses the new one (§7.6).
    pub fn set_policy(&self, policy: Arc<dyn Policy>) {
        match self.policy.write() {
            Ok(mut p) => *p = policy,
            Err(e) => *e.into_inner() = policy,
        }
    }

    /// What `who` holds on `hub`; `None` if the host is invisible to it (no
    /// rule, or the host refused the relay's protocol version).
    pub fn grant_on(&self, who: Subject<'_>, hub: &HostHub) -> Option<Grant> {
        if hub.status() == HostStatus::Incompatible {
            return None;
        }
        self.policy().grant(
            who,
            HostRef {
                id: &hub.id,
                label: hub.cfg.label.as_deref(),
            },
        )
    }

    /// The creator of a client-chosen URI that `host` owns (store entry,
    /// tombstones included so removals reach the same principals).
    pub fn owner_of(&self, host: &str, uri: &str) -> Option<Owner> {
        self.entry_on(host, uri).map(|e| e.owner)
    }

    /// Who created the session, chat or terminal `host_uri` on `hub`, as far
    /// as the relay knows: the creator its store entry records (a
    /// client-chosen URI); for a chat without one (a session's default chat,
    /// VS Code's derived chat URIs) the creator of its session; `None` for
    /// anything made outside the relay.
    pub fn creator_of(&self, hub: &HostHub, host_uri: &str) -> Option<Owner> {
        if let Some(owner) = self.owner_of(&hub.id, host_uri) {
            return Some(owner);
        }
        match channel_kind(host_uri) {
            ChannelKind::Chat => hub
                .session_of_chat(host_uri)
                .or_else(|| session_of_chat_uri(host_uri))
                .and_then(|session| self.owner_of(&hub.id, &session)),
            _ => None,
        }
    }

    /// The one dispose rule (contract §7.1), whatever the kind: `who` may
    /// dispose the session, chat or terminal `host_uri` it created; one
    /// another principal created, or one made outside the relay, needs
    /// the admin role on its host (`grant.dispose_others`).
    pub fn may_dispose(
        &self,
        who: Subject<'_>,
        grant: &Grant,
        hub: &HostHub,
        host_uri: &str,
    ) -> bool {
        grant.dispose_others
            || self
                .creator_of(hub, host_uri)
                .is_some_and(|owner| who.is(&owner))
    }

    /// The creator of a confirmed store entry for `uri` on `host` (the host
    /// accepted the create; not yet in the catalog perhaps). A pending entry
    /// grants nothing (§4.2): until the host answers, the name may still be
    /// an object the host already had, which a create must never adopt.
    fn live_entry(&self, host: &str, uri: &str) -> Option<Owner> {
        self.entry_on(host, uri)
            .filter(|e| e.state == UriState::Confirmed)
            .map(|e| e.owner)
    }

    fn entry_on(&self, host: &str, uri: &str) -> Option<UriEntry> {
        self.read_entry(host, uri).ok().flatten()
    }

    /// The store's entry for `uri` on `host`; `Err` while the store cannot
    /// be read. A decision that rests on who created a listed session then
    /// fails closed: an unreadable entry is not "made outside the relay".
    fn read_entry(&self, host: &str, uri: &str) -> Result<Option<UriEntry>, ()> {
        match self.store.lookup(uri) {
            Ok(entry) => Ok(entry.filter(|e| e.host == host)),
            Err(e) => {
                tracing::debug!(error = %e, "URI store unreadable: an owner-dependent decision refuses");
                Err(())
            }
        }
    }

    /// Whether `who` (holding `grant` on `hub`) sees session `host_uri` as
    /// listed or announced (existence not required: used for catalog
    /// events, removals included).
    pub fn sees_session(
        &self,
        who: Subject<'_>,
        grant: &Grant,
        hub: &HostHub,
        host_uri: &str,
    ) -> bool {
        // Without the lookup when the grant shows every session: catalog
        // fan-out and `listSessions` ask this once per session.
        grant.sees_everything()
            || self
                .read_entry(&hub.id, host_uri)
                .is_ok_and(|e| grant.sees(who, e.map(|e| e.owner).as_ref()))
    }

    /// Whether `who` sees the host channel `host_uri` on `hub`, which must
    /// exist: a session in the catalog (or created through the relay), a
    /// chat listed by a visible session (or created through the relay), a
    /// terminal claimed by one of `who`'s clients, attached to a visible
    /// session, or created by `who`. Any other channel is invisible.
    pub fn sees_channel(
        &self,
        who: Subject<'_>,
        grant: &Grant,
        hub: &HostHub,
        host_uri: &str,
    ) -> bool {
        // Kinds by shape (provider-scheme sessions, authority-form chats
        // naming their session), schemes case-insensitive: `names::qualify`.
        match channel_kind(host_uri) {
            ChannelKind::Session => self.sees_existing_session(who, grant, hub, host_uri),
            ChannelKind::Chat => match hub
                .session_of_chat(host_uri)
                .or_else(|| session_of_chat_uri(host_uri))
            {
                Some(session) => self.sees_existing_session(who, grant, hub, &session),
                None => self
                    .live_entry(&hub.id, host_uri)
                    .is_some_and(|o| grant.sees(who, Some(&o))),
            },
            ChannelKind::Terminal => {
                if self
                    .live_entry(&hub.id, host_uri)
                    .is_some_and(|o| who.is(&o))
                {
                    return true;
                }
                match hub.terminal_claim(host_uri) {
                    Some(Some(claim)) => self.sees_claim(who, grant, hub, &claim),
                    _ => false,
                }
            }
            // A resource watch is a receiver-assigned channel with an
            // unguessable id, made by `createResourceWatch` (files:read on
            // the host, or inside a session's working directory, which the
            // create checked).
            ChannelKind::Other => {
                host_uri
                    .get(..19)
                    .is_some_and(|s| s.eq_ignore_ascii_case("ahp-resource-watch:"))
                    && grant.touches_files(super::Permission::FilesRead)
            }
        }
    }

    /// Whether `who` may name `host_uri` inside a request or action
    /// (contract §4.3: every URI a client sends is authorized against the
    /// object it belongs to, whatever its scheme) — one decision for every
    /// shape ([`OWNERS`]): sessions, chats and terminals as
    /// [`Access::sees_channel`]; a URI derived from a session by path (VS
    /// Code's `<session>/changeset/…`, `…/annotations`) as its session; a
    /// canvas `ahp-canvas:/<b64url(chat)>/<id>` (VS Code's `buildCanvasUri`)
    /// as its chat, or where shown; every other host object (content
    /// references, changesets, resource watches) only where `shown` — the
    /// client received it inside a channel it can read or in its own
    /// answer (`names::seen`). Files are a host's, not an object's: `true`
    /// (their `files:*` permission decides). `host_uri` is a host name.
    pub fn sees_named(
        &self,
        who: Subject<'_>,
        grant: &Grant,
        hub: &HostHub,
        host_uri: &str,
        shown: bool,
    ) -> bool {
        match owner_of_uri(host_uri) {
            UriOwner::Host => true,
            UriOwner::Itself => self.sees_channel(who, grant, hub, host_uri),
            UriOwner::Session(session) => self.sees_existing_session(who, grant, hub, &session),
            UriOwner::ChatInPath(chat) => shown || self.sees_channel(who, grant, hub, &chat),
            UriOwner::Shown => shown,
        }
    }

    fn sees_existing_session(
        &self,
        who: Subject<'_>,
        grant: &Grant,
        hub: &HostHub,
        host_uri: &str,
    ) -> bool {
        if hub.has_session(host_uri) {
            if grant.sees_everything() {
                return true;
            }
            return match self.read_entry(&hub.id, host_uri) {
                // Until the host answers the create, the listed session is
                // either the creator's new one or one the host already had:
                // shown only to whom it would be shown as either.
                Ok(Some(e)) if e.state == UriState::Pending => {
                    grant.sees(who, None) && grant.sees(who, Some(&e.owner))
                }
                Ok(Some(e)) => grant.sees(who, Some(&e.owner)),
                Ok(None) => grant.sees(who, None),
                Err(()) => false,
            };
        }
        self.live_entry(&hub.id, host_uri)
            .is_some_and(|o| grant.sees(who, Some(&o)))
    }

    /// Whether a terminal claim (host form) shows the terminal to `who`:
    /// claimed by one of its own clients, or attached to a session it sees.
    pub fn sees_claim(
        &self,
        who: Subject<'_>,
        grant: &Grant,
        hub: &HostHub,
        claim: &Value,
    ) -> bool {
        if let Some(client) = claim.get("clientId").and_then(Value::as_str) {
            return client.starts_with(&self.keys.upstream_prefix(who.principal));
        }
        claim
            .get("session")
            .and_then(Value::as_str)
            .is_some_and(|s| self.sees_existing_session(who, grant, hub, s))
    }

    /// Whether `who` sees a terminal of the host's root list (host form
    /// `TerminalInfo`).
    pub fn sees_terminal_info(
        &self,
        who: Subject<'_>,
        grant: &Grant,
        hub: &HostHub,
        info: &Value,
    ) -> bool {
        let Some(uri) = info.get("resource").and_then(Value::as_str) else {
            return false;
        };
        if self.live_entry(&hub.id, uri).is_some_and(|o| who.is(&o)) {
            return true;
        }
        info.get("claim")
            .is_some_and(|c| self.sees_claim(who, grant, hub, c))
    }
}

/// What a URI a client names belongs to, so what decides whether it may
/// name it ([`Access::sees_named`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UriOwner {
    /// A file of the host: its `files:*` permission decides.
    Host,
    /// A session, chat or terminal: its own visibility.
    Itself,
    /// Derived from this session (host form) by path.
    Session(String),
    /// A canvas naming its chat (host form) in its path.
    ChatInPath(String),
    /// An object only the client it was shown to may name.
    Shown,
}

/// How a host object URI that is not a channel of its own is owned, by
/// scheme (compared case-insensitively); any scheme not listed is
/// [`ObjectOwner::Shown`]. The one table for contract §4.3's "whatever its scheme".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectOwner {
    /// `<scheme>:/<b64url(chat)>/<id>` (VS Code's `buildCanvasUri`), else shown.
    ChatInPath,
    /// Only where shown (`names::seen`).
    Shown,
}

/// Host object schemes and their owners.
pub const OWNERS: &[(&str, ObjectOwner)] = &[
    ("ahp-canvas", ObjectOwner::ChatInPath),
    ("ahp-changeset", ObjectOwner::Shown),
    ("ahp-content", ObjectOwner::Shown),
    ("ahp-resource-watch", ObjectOwner::Shown),
];

/// What `host_uri` (a host name, host form) belongs to.
pub fn owner_of_uri(host_uri: &str) -> UriOwner {
    use crate::names::qualify::UriParts;
    let parts = UriParts::parse(host_uri);
    match channel_kind(host_uri) {
        ChannelKind::Session => match parts {
            Some(p) if !p.tail.is_empty() => UriOwner::Session(p.base()),
            _ => UriOwner::Itself,
        },
        ChannelKind::Chat | ChannelKind::Terminal => UriOwner::Itself,
        ChannelKind::Other if !crate::names::seen::is_object(host_uri) => UriOwner::Host,
        ChannelKind::Other => {
            let owner = parts.and_then(|p| {
                OWNERS
                    .iter()
                    .find(|(s, _)| s.eq_ignore_ascii_case(p.scheme))
                    .map(|(_, o)| (*o, p))
            });
            match owner {
                Some((ObjectOwner::ChatInPath, p)) => {
                    canvas_chat(p.head, p.tail).map_or(UriOwner::Shown, UriOwner::ChatInPath)
                }
                _ => UriOwner::Shown,
            }
        }
    }
}

/// The chat a canvas path `/<b64url(chat)>/<id>` names, if it decodes to a
/// chat URI.
fn canvas_chat(head: &str, tail: &str) -> Option<String> {
    use base64::Engine as _;
    let id = tail.strip_prefix('/')?;
    if id.is_empty() || id.contains('/') {
        return None;
    }
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(head)
        .ok()?;
    let chat = String::from_utf8(bytes).ok()?;
    (channel_kind(&chat) == ChannelKind::Chat).then_some(chat)
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;

    #[test]
    fn every_shape_has_one_owner() {
        assert_eq!(owner_of_uri("file:///etc/passwd"), UriOwner::Host);
        assert_eq!(owner_of_uri("copilot:/s1"), UriOwner::Itself);
        assert_eq!(owner_of_uri("ahp-chat:/c1"), UriOwner::Itself);
        assert_eq!(owner_of_uri("ahp-terminal:/t1"), UriOwner::Itself);
        assert_eq!(
            owner_of_uri("copilot:/s1/changeset/session"),
            UriOwner::Session("copilot:/s1".into())
        );
        assert_eq!(
            owner_of_uri("ahp-session:/s1/annotations"),
            UriOwner::Session("ahp-session:/s1".into())
        );
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("ahp-chat:/c1");
        assert_eq!(
            owner_of_uri(&format!("ahp-canvas:/{b64}/7")),
            UriOwner::ChatInPath("ahp-chat:/c1".into())
        );
        for shown in [
            "ahp-canvas:/opaque",
            "ahp-changeset:/s1/t1",
            "AHP-Content:/c1",
            "ahp-resource-watch:/w1",
            "ahp-other:/x",
        ] {
            assert_eq!(owner_of_uri(shown), UriOwner::Shown, "{shown}");
        }
    }
}

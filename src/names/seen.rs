//! The host objects one client session has been shown (contract §4.3, §7.1).
//!
//! Content references, changesets, canvases and resource watches have no
//! owner the relay can look up: a host names them inside a session's or
//! chat's state, or in the answer to the client that made them. The relay
//! notes each one (client form) as it translates it into a frame for this
//! client — which only happens for channels the client can read and for
//! its own requests — and a later client use of such a URI is authorized by
//! that note. Another tenant who guesses or learns the URI has no note, so
//! the URI is as unknown to it as a random one.
//!
//! Each note keeps where the URI was shown — a channel, or an answer from a
//! host to the client's own request — so that when the client loses sight
//! of all of them (a policy change, §7.6) the note is forgotten with them
//! ([`Seen::retain_shown`]): a reference stays usable exactly as long as
//! something that showed it is still readable.
//!
//! Bounded: the last `limits.seen_refs_per_session` URIs (changeset
//! templates included), oldest forgotten first; each eviction is counted;
//! at most [`MAX_SOURCES`] places per URI (the oldest dropped first, which
//! can only forget a note early). Only frames that carry such a reference
//! pay for a note (a lock and a hash lookup), never the others.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;

use super::qualify::{ChannelKind, channel_kind, is_host_name};

/// Places one URI is remembered to have been shown in, at most.
pub const MAX_SOURCES: usize = 8;

/// Where a host object was shown to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShownIn<'a> {
    /// In a frame of this channel (client form).
    Channel(&'a str),
    /// In an answer from this host (id) to the client's own request.
    Answer(&'a str),
}

/// [`ShownIn`], kept.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Source {
    Channel(String),
    Answer(String),
}

impl Source {
    fn of(at: ShownIn<'_>) -> Self {
        match at {
            ShownIn::Channel(c) => Self::Channel(c.to_string()),
            ShownIn::Answer(h) => Self::Answer(h.to_string()),
        }
    }

    fn shown_in(&self) -> ShownIn<'_> {
        match self {
            Self::Channel(c) => ShownIn::Channel(c),
            Self::Answer(h) => ShownIn::Answer(h),
        }
    }

    fn is(&self, at: ShownIn<'_>) -> bool {
        self.shown_in() == at
    }
}

/// The references a session was shown; cheap to query, bounded.
pub struct Seen {
    max: usize,
    inner: Mutex<Inner>,
    on_evict: prometheus::IntCounter,
}

#[derive(Default)]
struct Inner {
    order: VecDeque<String>,
    /// Each noted URI and where it was shown.
    uris: HashMap<String, Vec<Source>>,
    /// Noted URI templates (`Changeset.uriTemplate`), matched by expansion.
    templates: Vec<String>,
}

impl std::fmt::Debug for Seen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Seen").field("max", &self.max).finish()
    }
}

/// Whether `uri` (client or host form) names a host object that is not a
/// channel with an owner of its own (session, chat, terminal) nor a file:
/// content references, changesets, canvases, resource watches.
pub fn is_object(uri: &str) -> bool {
    is_host_name(uri)
        && channel_kind(uri) == ChannelKind::Other
        && !uri
            .get(..5)
            .is_some_and(|s| s.eq_ignore_ascii_case("file:"))
}

impl Seen {
    /// At most `max` (≥ 1) notes; `on_evict` counts the forgotten ones.
    pub fn new(max: usize, on_evict: prometheus::IntCounter) -> Self {
        Self {
            max: max.max(1),
            inner: Mutex::new(Inner::default()),
            on_evict,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes that the client was shown `uri` (client form) `at` a place;
    /// URIs that are not host objects ([`is_object`]) are not noted. A URI
    /// template is noted as a template when it has an expression.
    pub fn note(&self, uri: &str, at: ShownIn<'_>) {
        if !is_object(uri) {
            return;
        }
        let mut inner = self.lock();
        if let Some(sources) = inner.uris.get_mut(uri) {
            if !sources.iter().any(|s| s.is(at)) {
                if sources.len() >= MAX_SOURCES {
                    sources.remove(0);
                }
                sources.push(Source::of(at));
            }
            return;
        }
        inner.uris.insert(uri.to_string(), vec![Source::of(at)]);
        inner.order.push_back(uri.to_string());
        if uri.contains('{') {
            inner.templates.push(uri.to_string());
        }
        while inner.order.len() > self.max {
            let Some(old) = inner.order.pop_front() else {
                break;
            };
            inner.uris.remove(&old);
            if old.contains('{') {
                inner.templates.retain(|t| *t != old);
            }
            self.on_evict.inc();
        }
    }

    /// Whether the client was shown `uri` (client form): noted itself, or an
    /// expansion of a noted template.
    pub fn contains(&self, uri: &str) -> bool {
        let inner = self.lock();
        inner.uris.contains_key(uri) || inner.templates.iter().any(|t| expands_to(t, uri))
    }

    /// Forgets every place for which `readable` is false, and every note
    /// left with no place (contract §7.6: references shown only in what the
    /// client can no longer read). `readable` runs without the notes locked
    /// (it may ask [`Seen::contains`]), once per distinct place. Returns how
    /// many notes were forgotten.
    pub fn retain_shown(&self, readable: impl Fn(ShownIn<'_>) -> bool) -> usize {
        let places: HashSet<Source> = self.lock().uris.values().flatten().cloned().collect();
        let gone: HashSet<Source> = places
            .into_iter()
            .filter(|p| !readable(p.shown_in()))
            .collect();
        if gone.is_empty() {
            return 0;
        }
        let mut inner = self.lock();
        let before = inner.uris.len();
        inner.uris.retain(|_, sources| {
            sources.retain(|s| !gone.contains(s));
            !sources.is_empty()
        });
        let Inner {
            order,
            uris,
            templates,
        } = &mut *inner;
        order.retain(|u| uris.contains_key(u));
        templates.retain(|t| uris.contains_key(t));
        before - uris.len()
    }

    /// How many URIs are noted.
    pub fn len(&self) -> usize {
        self.lock().order.len()
    }

    /// Whether nothing is noted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Whether `uri` is an expansion of RFC 6570 `template` whose expressions
/// each expand to one path-segment-safe value (no `/`, `?`, `#`): the
/// literal parts in order, something without those bytes between them.
fn expands_to(template: &str, uri: &str) -> bool {
    let mut literals = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let Some(len) = rest[open..].find('}') else {
            return false;
        };
        literals.push(&rest[..open]);
        rest = &rest[open + len + 1..];
    }
    literals.push(rest);
    let Some((first, others)) = literals.split_first() else {
        return false;
    };
    let Some(mut left) = uri.strip_prefix(first) else {
        return false;
    };
    if others.is_empty() {
        return left.is_empty();
    }
    for (i, lit) in others.iter().enumerate() {
        let last = i + 1 == others.len();
        let at = if last {
            left.ends_with(*lit).then(|| left.len() - lit.len())
        } else if lit.is_empty() {
            None
        } else {
            left.find(lit)
        };
        let Some(at) = at else {
            return false;
        };
        let value = &left[..at];
        if value.is_empty() || value.contains(['/', '?', '#']) {
            return false;
        }
        left = &left[at + lit.len()..];
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    const AT: ShownIn<'static> = ShownIn::Channel("ahp-chat:/a~c1");

    fn seen(max: usize) -> Seen {
        let c = prometheus::IntCounter::new("evicted", "test").expect("counter");
        Seen::new(max, c)
    }

    #[test]
    fn notes_host_objects_only() {
        let s = seen(8);
        for uri in [
            "ahp-content:/a~1",
            "ahp-resource-watch:/a~w",
            "ahp-canvas:/a~c/1",
        ] {
            s.note(uri, AT);
            assert!(s.contains(uri), "{uri}");
        }
        for uri in [
            "file://a/etc/passwd",
            "https://x/y",
            "ahp-session:/a~s",
            "ahp-chat:/a~c",
        ] {
            s.note(uri, AT);
            assert!(!s.contains(uri), "{uri}");
        }
        assert!(!s.contains("ahp-content:/a~2"));
    }

    #[test]
    fn forgets_the_oldest_and_counts_it() {
        let s = seen(2);
        s.note("ahp-content:/a~1", AT);
        s.note("ahp-content:/a~2", AT);
        s.note("ahp-content:/a~1", AT);
        s.note("ahp-content:/a~3", AT);
        assert!(!s.contains("ahp-content:/a~1"));
        assert!(s.contains("ahp-content:/a~2") && s.contains("ahp-content:/a~3"));
        assert_eq!(s.len(), 2);
        assert_eq!(s.on_evict.get(), 1);
    }

    #[test]
    fn a_note_is_forgotten_with_the_last_place_it_was_shown_in() {
        let s = seen(8);
        let other = ShownIn::Channel("ahp-chat:/a~c2");
        let answer = ShownIn::Answer("a");
        s.note("ahp-content:/a~1", AT);
        s.note("ahp-content:/a~1", other);
        s.note("ahp-content:/a~2", AT);
        s.note("ahp-changeset:/a~s1/{turnId}", AT);
        s.note("ahp-resource-watch:/a~w", answer);
        assert_eq!(s.retain_shown(|p| p != AT), 2);
        assert!(s.contains("ahp-content:/a~1"), "still shown in c2");
        assert!(!s.contains("ahp-content:/a~2"));
        assert!(!s.contains("ahp-changeset:/a~s1/t7"), "template forgotten");
        assert!(s.contains("ahp-resource-watch:/a~w"));
        assert_eq!(s.retain_shown(|p| p != other && p != answer), 2);
        assert!(s.is_empty());
        assert_eq!(s.retain_shown(|_| false), 0);
    }

    #[test]
    fn templates_match_their_expansions() {
        let s = seen(4);
        s.note("ahp-changeset:/a~s1/{turnId}", AT);
        s.note("ahp-changeset:/a~s2/{originalTurnId}..{modifiedTurnId}", AT);
        assert!(s.contains("ahp-changeset:/a~s1/t7"));
        assert!(s.contains("ahp-changeset:/a~s2/t1..t2"));
        assert!(!s.contains("ahp-changeset:/a~s1/"));
        assert!(!s.contains("ahp-changeset:/a~s1/t7/x"));
        assert!(!s.contains("ahp-changeset:/a~s3/t7"));
        assert!(!s.contains("ahp-changeset:/a~s2/t1"));
    }
}

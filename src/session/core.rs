//! A session's lock-protected state, in named parts: the sequence and
//! replay buffer ([`Numbering`]), the channels the client follows
//! ([`Channels`]), the links to hosts and what is in flight on them
//! ([`Links`]), and the attached socket ([`Attachment`]). One lock guards
//! all four, so a transition that spans them (a link lost takes its
//! channels' baselines) is atomic; none is held across an `.await`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::wire::{self, Text};
use serde_json::Value;

use super::authenticate;
use super::buffer::ReplayBuffer;
use super::chunk::Chunk;
use super::{Chan, Held, Pending, Socket};
use crate::config::Limits;
use crate::upstream::link::Link;

/// The maps read for every relayed envelope (links, watermarks, channels).
/// foldhash is several times cheaper than SipHash on their short keys and,
/// seeded per process, still keyed against crafted collisions; the maps are
/// bounded by the session's limits.
pub(super) type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// Lock-protected state of a session.
#[derive(Debug)]
pub struct SessionCore {
    /// The sequence and the replay buffer.
    pub(super) seq: Numbering,
    /// The channels the client follows.
    pub(super) channels: Channels,
    /// The links to hosts and what is in flight on them.
    pub(super) links: Links,
    /// The attached socket and the attach generation.
    pub(super) attachment: Attachment,
}

/// The session's numbers (contract §5.1) and its replay buffer (§5.4).
#[derive(Debug)]
pub(super) struct Numbering {
    /// The session's S0.
    pub(super) s0: u64,
    /// The last number issued.
    pub(super) last: u64,
    /// What issuing envelopes needs ([`Issuing`]). Made at the first
    /// envelope and boxed: an idle session keeps 8 bytes for it (a few
    /// bytes more moved a session across an allocator size class: +0.3 KiB
    /// per idle client).
    pub(super) issuing: Option<Box<Issuing>>,
    /// Numbered frames kept for `reconnect`.
    pub(super) buffer: ReplayBuffer,
    /// A snapshot `reconnect` is preparing its answer: relay-made envelopes
    /// wait (unnumbered) so nothing reaches the socket before the cut.
    pub(super) cut_pending: bool,
    /// Relay echoes deferred while `cut_pending`: (channel, action,
    /// clientSeq, rejection reason if rejected).
    pub(super) deferred: Vec<(String, Value, i64, Option<String>)>,
    /// Counts of envelopes numbered in the batch of host frames being
    /// handled (`Some` only then), reported once at its end.
    pub(super) batch: Option<Tally>,
}

/// What a session needs once it issues envelopes.
#[derive(Debug)]
pub(super) struct Issuing {
    /// The number being issued, with its digits for the splice (the last
    /// one's raised in place: `wire::Decimal`).
    pub(super) decimal: wire::Decimal,
    /// The chunk host envelopes are spliced into.
    pub(super) chunk: Chunk,
}

impl Numbering {
    /// What issuing needs, made at the first envelope.
    pub(super) fn issuing(&mut self) -> &mut Issuing {
        let last = self.last;
        self.issuing.get_or_insert_with(|| {
            Box::new(Issuing {
                decimal: wire::Decimal::of(last),
                chunk: Chunk::new(),
            })
        })
    }
}

/// What a batch of numbered envelopes adds to the relay-wide metrics.
#[derive(Debug, Default)]
pub(super) struct Tally {
    /// Envelopes numbered.
    pub(super) relayed: u64,
    /// Envelopes evicted from the replay buffer.
    pub(super) evicted: u64,
    /// Net change of the replay buffer's cost in bytes.
    pub(super) cost: i64,
    /// The batch's newest envelopes held only by the replay buffer, not
    /// queued: the socket gets them at the batch's end, read in place.
    pub(super) kept: usize,
    /// Their cost in the replay buffer ([`super::buffer::envelope_cost`]).
    pub(super) kept_cost: usize,
}

/// The channels (client form) a client is subscribed to. Whether the relay
/// root is among them is mirrored in a flag readable without the session's
/// lock ([`Subs::root_flag`]): the catalog fan-out picks its followers by it
/// instead of locking every session, then checks the set under the lock
/// before it pushes anything (a flag read just before a change is the same
/// race as a change just after the read, provided the flag is set before
/// the root value the change would alter is computed:
/// `ClientSession::follow_root`).
#[derive(Debug, Default)]
pub(super) struct Subs {
    set: HashSet<String>,
    root: Arc<AtomicBool>,
}

impl Subs {
    /// The flag that is true while the set holds the relay root.
    pub(super) fn root_flag(&self) -> Arc<AtomicBool> {
        self.root.clone()
    }

    pub(super) fn contains(&self, channel: &str) -> bool {
        self.set.contains(channel)
    }

    pub(super) fn len(&self) -> usize {
        self.set.len()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &String> {
        self.set.iter()
    }

    pub(super) fn insert(&mut self, channel: String) -> bool {
        let root = channel == ahp_types::ROOT_RESOURCE_URI;
        let added = self.set.insert(channel);
        if root {
            self.root.store(true, Ordering::Release);
        }
        added
    }

    pub(super) fn remove(&mut self, channel: &str) -> bool {
        if channel == ahp_types::ROOT_RESOURCE_URI {
            self.root.store(false, Ordering::Release);
        }
        self.set.remove(channel)
    }

    pub(super) fn retain(&mut self, keep: impl FnMut(&String) -> bool) {
        self.set.retain(keep);
        let root = self.set.contains(ahp_types::ROOT_RESOURCE_URI);
        self.root.store(root, Ordering::Release);
    }
}

/// The channels the client follows and their state per host.
#[derive(Debug, Default)]
pub(super) struct Channels {
    /// Channels (client form) the client is subscribed to.
    pub(super) subs: Subs,
    /// Per host: host channel → state.
    pub(super) chans: FastMap<Arc<str>, FastMap<String, Chan>>,
    /// Channels (client form) that received a snapshot in this session and
    /// kept upstream continuity since: the channels `reconnect` may replay.
    pub(super) baselined: HashSet<String>,
    /// The root state (client form) the client was last given, so root
    /// actions are sent only when a field really changed.
    pub(super) root_seen: serde_json::Map<String, Value>,
    /// Hosts whose channels a `reconnect` had to omit because the host was
    /// unreachable: when such a host is back, the client is resynchronised.
    pub(super) orphaned: HashSet<String>,
    /// The ticket of the newest hold ([`Channels::hold`]).
    last_ticket: u64,
}

impl Channels {
    /// Holds `host_uri` of `host` (client form `client`) until its snapshot
    /// is written, replacing whatever state it had; returns the hold's
    /// ticket, which [`Channels::unhold`] needs.
    /// A hold that replaces a live channel remembers its floor; one that
    /// replaces another hold keeps what that one held and remembered (a
    /// snapshot filters them all; without one they are the channel's
    /// continuation past that floor).
    pub(super) fn hold(&mut self, host: &Arc<str>, host_uri: &str, client: Arc<str>) -> u64 {
        let ticket = self.next_ticket();
        let m = self.chans.entry(host.clone()).or_default();
        let (held, prior) = match m.remove(host_uri) {
            Some(Chan::Live { floor, .. }) => (Held::default(), Some(floor)),
            Some(Chan::Holding { held, prior, .. }) => (held, prior),
            None => (Held::default(), None),
        };
        let hold = Chan::Holding {
            client,
            held,
            from: None,
            ticket,
            prior,
        };
        m.insert(host_uri.to_string(), hold);
        ticket
    }

    /// Holds every live channel until its fresh snapshot (a `reconnect`'s
    /// cut), each under a new ticket.
    pub(super) fn hold_live(&mut self) {
        let mut last = self.last_ticket;
        for chan in self.chans.values_mut().flat_map(|m| m.values_mut()) {
            if let Chan::Live { client, floor, .. } = chan {
                last += 1;
                *chan = Chan::Holding {
                    client: client.clone(),
                    held: Held::default(),
                    from: None,
                    ticket: last,
                    prior: Some(*floor),
                };
            }
        }
        self.last_ticket = last;
    }

    /// A fresh hold ticket.
    fn next_ticket(&mut self) -> u64 {
        self.last_ticket += 1;
        self.last_ticket
    }

    /// How hold `ticket` of `host_uri` may end without a snapshot: `None`
    /// when the channel is live or held by another request since (it is
    /// left as it is); else the floor of the live channel it replaced, if
    /// any (`ClientSession::end_channel_hold`).
    pub(super) fn hold_of(&self, host: &str, host_uri: &str, ticket: u64) -> Option<Option<u64>> {
        match self.chans.get(host)?.get(host_uri)? {
            Chan::Holding {
                ticket: t, prior, ..
            } if *t == ticket => Some(*prior),
            _ => None,
        }
    }
}

/// The session's links and everything that lives on them.
#[derive(Debug)]
pub(super) struct Links {
    /// Open links by host.
    pub(super) open: FastMap<Arc<str>, Arc<Link>>,
    /// Links replaced by re-baselining, kept until the new links' snapshots
    /// are adopted (§5.5), then dropped.
    pub(super) retiring: Vec<Arc<Link>>,
    /// Requests in flight: (link id, link request id) → pending.
    pub(super) pending: HashMap<(u64, u64), Pending>,
    /// Host → client requests waiting for the client's answer, by the id the
    /// relay gave them: (host, the host's id as exact JSON text).
    pub(super) host_requests: HashMap<u64, HostRequest>,
    pub(super) next_host_request: u64,
    /// Per link id: the host `serverSeq` of the last envelope accepted on
    /// it, replaced by the host's numbers at every baseline (§5.8).
    pub(super) watermarks: FastMap<u64, u64>,
    /// (host, host session) pairs where the client registered itself in
    /// `activeClients` (`session/activeClientSet` dispatched, not removed):
    /// links to those hosts are never idle.
    pub(super) registered: HashSet<(Arc<str>, String)>,
    /// Tokens the client pushed with `authenticate` (§4.6), memory only.
    pub(super) tokens: authenticate::Tokens,
    /// Since when each link has been idle (§5.7 `link_idle`).
    pub(super) idle_since: HashMap<Arc<str>, std::time::Instant>,
    /// The host-latency histogram's series of each host this session has
    /// read from, found by label once per host rather than once per batch.
    latency: Vec<(Arc<str>, prometheus::Histogram)>,
    /// A create's store write in flight and the frames read meanwhile
    /// (`session::hold`).
    pub(super) hold: super::hold::Hold,
    /// A `reconnect`'s cut held more than `replay_buffer_bytes` of one
    /// channel: the links read nothing more until its answer is written
    /// (`ClientSession::end_cut`), so a cut's holds stay bounded.
    pub(super) cut_full: super::hold::Pause,
}

/// A host's request to the client, waiting for the client's answer: it
/// goes back on the link that carried the request, under the host's id.
#[derive(Debug)]
pub(super) struct HostRequest {
    pub(super) host: Arc<str>,
    /// The link it arrived on: the host's ids are its connection's.
    pub(super) link: u64,
    /// The host's id, as exact JSON text.
    pub(super) host_id: String,
}

impl Links {
    /// `host`'s series of `histogram` (by its one `host` label), looked up
    /// by label the first time only. Bounded by the configured hosts.
    pub(super) fn latency_of(
        &mut self,
        host: &Arc<str>,
        histogram: &prometheus::HistogramVec,
    ) -> &prometheus::Histogram {
        match self.latency.iter().position(|(h, _)| h == host) {
            Some(at) => &self.latency[at].1,
            None => self.add_latency(host, histogram),
        }
    }

    /// [`Self::latency_of`] for a host read from the first time.
    #[cold]
    fn add_latency(
        &mut self,
        host: &Arc<str>,
        histogram: &prometheus::HistogramVec,
    ) -> &prometheus::Histogram {
        let series = histogram.with_label_values(&[&**host]);
        &self.latency.push_mut((host.clone(), series)).1
    }
}

/// The socket the session writes to, if any.
#[derive(Debug)]
pub(super) struct Attachment {
    /// The attached socket; `None` while detached.
    pub(super) socket: Option<Socket>,
    /// Incremented by every attach and detach; lifetime timers check it.
    pub(super) attach_gen: u64,
    /// The id of the socket attached last (also after the relay closed it).
    pub(super) last_socket: u64,
    /// While detached: the last number issued when the socket went away.
    pub(super) detached_at: Option<u64>,
}

impl SessionCore {
    /// A session numbering from `s0`, attached to `socket`.
    pub(super) fn new(s0: u64, socket: Socket, limits: &Limits) -> Self {
        Self {
            seq: Numbering {
                s0,
                last: s0,
                issuing: None,
                buffer: ReplayBuffer::new(
                    limits.replay_buffer_envelopes,
                    limits.replay_buffer_bytes,
                ),
                cut_pending: false,
                deferred: Vec::new(),
                batch: None,
            },
            channels: Channels::default(),
            links: Links {
                open: FastMap::default(),
                retiring: Vec::new(),
                pending: HashMap::new(),
                host_requests: HashMap::new(),
                next_host_request: 1,
                watermarks: FastMap::default(),
                registered: HashSet::new(),
                tokens: authenticate::Tokens::default(),
                idle_since: HashMap::new(),
                latency: Vec::new(),
                hold: super::hold::Hold::default(),
                cut_full: super::hold::Pause::default(),
            },
            attachment: Attachment {
                last_socket: socket.id,
                socket: Some(socket),
                attach_gen: 0,
                detached_at: None,
            },
        }
    }
}

impl SessionCore {
    /// The current attach generation (changes with every attach and detach).
    pub fn attach_gen(&self) -> u64 {
        self.attachment.attach_gen
    }

    /// Starts holding relay-made envelopes until [`ClientSession::end_cut`].
    pub fn begin_cut(&mut self) {
        self.seq.cut_pending = true;
    }

    /// Closes every link (current and retiring) and forgets what lived on
    /// them: requests in flight and every host channel, whose baselines are
    /// lost (a later `reconnect` gets snapshots; the root keeps its own).
    pub(super) fn lose_links(&mut self) {
        self.links.open.clear();
        self.links.retiring.clear();
        self.links.pending.clear();
        self.channels.chans.clear();
        self.channels
            .baselined
            .retain(|c| c == ahp_types::ROOT_RESOURCE_URI);
    }

    /// Whether socket `id` is the attached one and not told to close (its
    /// token expired or was revoked while a request waited): an answer
    /// prepared across an `.await` is written (and its snapshots
    /// baselined) only then.
    pub fn answers_on(&self, id: u64) -> bool {
        self.answering_socket() == Some(id)
    }

    /// The id of the attached socket unless it was told to close.
    pub fn answering_socket(&self) -> Option<u64> {
        let socket = self.attachment.socket.as_ref()?;
        socket.kill.borrow().is_none().then_some(socket.id)
    }

    /// The id of the attached socket, if any.
    pub fn socket_id(&self) -> Option<u64> {
        self.attachment.socket.as_ref().map(|s| s.id)
    }

    /// Stops following every channel of `host` (its link is gone): they
    /// lose their baseline, so a `reconnect` gets snapshots for them.
    /// Returns their client forms.
    pub(super) fn lose_host_channels(&mut self, host: &str) -> Vec<String> {
        let lost: Vec<String> = self
            .channels
            .chans
            .remove(host)
            .into_iter()
            .flat_map(|m| m.into_values())
            .map(|c| c.client().to_string())
            .collect();
        for c in &lost {
            self.channels.baselined.remove(c);
        }
        lost
    }

    /// The session's S0.
    pub fn s0(&self) -> u64 {
        self.seq.s0
    }

    /// Buffered frames numbered above `after`, oldest first, and whether
    /// every frame after `after` is still buffered.
    pub fn buffered_since(&self, after: u64) -> (Vec<Text>, bool) {
        let complete = after >= self.seq.buffer.evicted_through();
        (
            self.seq
                .buffer
                .since(after)
                .map(|(_, f)| f.clone())
                .collect(),
            complete,
        )
    }

    /// Registers a host → client request that arrived on `link` and returns
    /// the id the client sees.
    pub fn register_host_request(&mut self, (host, link): (Arc<str>, u64), host_id: String) -> u64 {
        let n = self.links.next_host_request;
        self.links.next_host_request += 1;
        let request = HostRequest {
            host,
            link,
            host_id,
        };
        self.links.host_requests.insert(n, request);
        n
    }

    /// The last number issued (S0 before any envelope).
    pub fn last(&self) -> u64 {
        self.seq.last
    }

    /// Frames and bytes in the replay buffer.
    pub fn buffer_usage(&self) -> (usize, usize) {
        self.seq.buffer.usage()
    }

    /// Bytes of the session's splice chunk not yet used (0: no chunk).
    pub fn spare_chunk_bytes(&self) -> usize {
        self.seq.issuing.as_ref().map_or(0, |i| i.chunk.spare())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hold ends without a snapshot only by its own ticket: one that a
    /// later hold replaced, a live channel, or a cut's fresh hold is not
    /// its to end; a hold that replaced a live channel remembers its floor.
    #[test]
    fn a_hold_ends_only_by_its_own_ticket() {
        let mut ch = Channels::default();
        let host: Arc<str> = "h".into();
        let client = || -> Arc<str> { "ahp-chat:/h~c".into() };
        let first = ch.hold(&host, "c", client());
        let second = ch.hold(&host, "c", client());
        assert_ne!(first, second);
        assert_eq!(ch.hold_of(&host, "c", first), None, "replaced");
        assert_eq!(ch.hold_of(&host, "c", second), Some(None), "its own, new");
        let m = ch.chans.entry(host.clone()).or_default();
        m.insert("c".into(), Chan::live(client(), 7));
        assert_eq!(ch.hold_of(&host, "c", second), None, "a live channel");
        let again = ch.hold(&host, "c", client());
        assert_eq!(ch.hold_of(&host, "c", again), Some(Some(7)), "floor kept");
        let later = ch.hold(&host, "c", client());
        assert_eq!(
            ch.hold_of(&host, "c", later),
            Some(Some(7)),
            "a hold replacing a hold keeps the live floor"
        );
        let m = ch.chans.entry(host.clone()).or_default();
        m.insert("c".into(), Chan::live(client(), 9));
        ch.hold_live();
        assert_eq!(ch.hold_of(&host, "c", later), None, "the cut's hold is new");
        let next = ch.hold(&host, "c", client());
        assert!(next > later + 1, "the cut took a ticket: {next}");
        assert_eq!(ch.hold_of(&host, "c", next), Some(Some(9)));
    }

    /// The lock-free root flag the catalog fan-out reads follows every change
    /// of the set: insert, remove, retain.
    #[test]
    fn the_root_flag_follows_the_subscriptions() {
        let root = ahp_types::ROOT_RESOURCE_URI;
        let mut subs = Subs::default();
        let flag = subs.root_flag();
        let on = || flag.load(Ordering::Acquire);
        assert!(subs.insert("ahp-chat:/c".into()) && !on());
        assert!(subs.insert(root.into()) && on());
        assert!(
            !subs.insert(root.into()) && on(),
            "a second insert adds nothing"
        );
        subs.retain(|c| c != "ahp-chat:/c");
        assert!(on() && subs.len() == 1);
        subs.retain(|c| c != root);
        assert!(!on() && subs.len() == 0);
        subs.insert(root.into());
        assert!(subs.remove(root) && !on());
        assert!(!subs.remove(root) && !on());
    }
}

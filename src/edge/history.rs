//! The status page's recent past (issue 22): one fixed-size [`Ring`] per
//! series, sampled once per status interval by the task that computes the
//! status ([`super::status::StatusFeeds::run`]), whether or not anyone
//! watches, so a page opened now draws the last `limits.status_history_secs`
//! (15 minutes by default). Memory is fixed: every ring holds at most
//! `capacity` points, and a host's rings are dropped as soon as the host is
//! no longer configured.
//!
//! Series: relayed actions per second (the `envelopes_relayed` counter's
//! rate), client sessions attached / detached / retained, reconnects by
//! outcome in each interval, and per host the watch link's RTT (none while
//! the host is not up, so its line ends when it stops) and its link count.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};

/// At most `capacity` values, the oldest dropped first.
#[derive(Debug, Clone)]
pub struct Ring<T> {
    items: VecDeque<T>,
    capacity: usize,
}

impl<T> Ring<T> {
    /// An empty ring holding at most `capacity` values (at least one).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            items: VecDeque::with_capacity(capacity),
            capacity,
        }
    }

    /// Appends `v`, dropping the oldest value when full.
    pub fn push(&mut self, v: T) {
        if self.items.len() == self.capacity {
            self.items.pop_front();
        }
        self.items.push_back(v);
    }

    /// Values held, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.items.iter()
    }

    /// Values held.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The most values it holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

impl<T: Serialize> Serialize for Ring<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.items.iter())
    }
}

/// One host's state at a sampling instant.
#[derive(Debug, Clone)]
pub struct HostSample {
    /// The host id.
    pub id: String,
    /// The watch link's last round trip in ms, `None` unless the host is up.
    pub rtt_ms: Option<f64>,
    /// Per-client links open to it.
    pub links: usize,
}

/// The relay's counters and gauges at a sampling instant
/// (`RelayPort::sample`): totals since start for counters.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// `envelopes_relayed` so far.
    pub envelopes_relayed: u64,
    /// Client sessions with a socket.
    pub attached: usize,
    /// Client sessions without a socket whose links are open.
    pub detached: usize,
    /// Client sessions without a socket or links.
    pub retained: usize,
    /// `reconnects` so far: replay, snapshot, adopted (§12.2), not found.
    pub reconnects: [u64; 4],
    /// Every configured host.
    pub hosts: Vec<HostSample>,
}

/// One host's series.
#[derive(Debug, Clone, Serialize)]
struct HostRings {
    rtt_ms: Ring<Option<f64>>,
    links: Ring<u32>,
}

/// Every series of the status page, one point per sampling instant.
#[derive(Debug)]
pub struct History {
    every: Duration,
    seq: u64,
    last: Option<(Instant, u64, [u64; 4])>,
    t: Ring<u64>,
    actions_per_sec: Ring<f64>,
    attached: Ring<u32>,
    detached: Ring<u32>,
    retained: Ring<u32>,
    reconnects: [Ring<u32>; 4],
    hosts: BTreeMap<String, HostRings>,
}

/// The names of the reconnect outcomes, in [`Sample::reconnects`] order.
const OUTCOMES: [&str; 4] = ["replay", "snapshot", "adopted", "not_found"];

fn small(n: impl TryInto<u32>) -> u32 {
    n.try_into().unwrap_or(u32::MAX)
}

/// `x` to two decimals (what a chart shows; keeps the JSON short).
fn cents(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

impl History {
    /// Room for `span` of samples taken every `every` (at least one).
    pub fn new(span: Duration, every: Duration) -> Self {
        let n = (span.as_millis() / every.as_millis().max(1)).max(1);
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        Self {
            every,
            seq: 0,
            last: None,
            t: Ring::new(n),
            actions_per_sec: Ring::new(n),
            attached: Ring::new(n),
            detached: Ring::new(n),
            retained: Ring::new(n),
            reconnects: [Ring::new(n), Ring::new(n), Ring::new(n), Ring::new(n)],
            hosts: BTreeMap::new(),
        }
    }

    /// Points each series holds at most.
    pub fn capacity(&self) -> usize {
        self.t.capacity()
    }

    /// Records `s`, taken at `at` (unix ms `unix_ms`): rates and per-interval
    /// counts against the previous sample (zero for the first); hosts no
    /// longer in `s` lose their series.
    pub fn record(&mut self, s: &Sample, at: Instant, unix_ms: u64) {
        let (rate, delta) = match self.last {
            Some((then, relayed, rec)) => {
                let secs = at.saturating_duration_since(then).as_secs_f64();
                let d = s.envelopes_relayed.saturating_sub(relayed) as f64;
                let rate = if secs > 0.0 { d / secs } else { 0.0 };
                let delta = [0, 1, 2, 3].map(|i| small(s.reconnects[i].saturating_sub(rec[i])));
                (cents(rate), delta)
            }
            None => (0.0, [0; 4]),
        };
        self.last = Some((at, s.envelopes_relayed, s.reconnects));
        self.seq += 1;
        self.t.push(unix_ms);
        self.actions_per_sec.push(rate);
        self.attached.push(small(s.attached));
        self.detached.push(small(s.detached));
        self.retained.push(small(s.retained));
        for (ring, d) in self.reconnects.iter_mut().zip(delta) {
            ring.push(d);
        }
        let n = self.capacity();
        self.hosts
            .retain(|id, _| s.hosts.iter().any(|h| h.id == *id));
        for h in &s.hosts {
            let rings = self.hosts.entry(h.id.clone()).or_insert_with(|| HostRings {
                rtt_ms: Ring::new(n),
                links: Ring::new(n),
            });
            rings.rtt_ms.push(h.rtt_ms.map(cents));
            rings.links.push(small(h.links));
        }
    }

    /// Every point held, oldest first; series of a host added later are
    /// shorter and end at the same instant as the others.
    pub fn to_json(&self) -> Value {
        json!({
            "every_ms": self.every.as_millis() as u64,
            "capacity": self.capacity(),
            "seq": self.seq,
            "t": self.t,
            "actions_per_sec": self.actions_per_sec,
            "attached": self.attached,
            "detached": self.detached,
            "retained": self.retained,
            "reconnects": self.outcomes(|r| json!(r)),
            "hosts": self.hosts,
        })
    }

    /// The newest point of every series (`null` before the first sample).
    pub fn latest_json(&self) -> Value {
        let last = |r: &Ring<u32>| r.iter().last().copied();
        let Some(t) = self.t.iter().last() else {
            return Value::Null;
        };
        let hosts: BTreeMap<&str, Value> = self
            .hosts
            .iter()
            .map(|(id, h)| {
                let rtt = h.rtt_ms.iter().last().copied().flatten();
                let links = h.links.iter().last().copied();
                (id.as_str(), json!({"rtt_ms": rtt, "links": links}))
            })
            .collect();
        json!({
            "seq": self.seq,
            "t": t,
            "actions_per_sec": self.actions_per_sec.iter().last(),
            "attached": last(&self.attached),
            "detached": last(&self.detached),
            "retained": last(&self.retained),
            "reconnects": self.outcomes(|r| json!(r.iter().last())),
            "hosts": hosts,
        })
    }

    fn outcomes(&self, f: impl Fn(&Ring<u32>) -> Value) -> Value {
        let mut m = serde_json::Map::new();
        for (name, ring) in OUTCOMES.iter().zip(&self.reconnects) {
            m.insert((*name).to_string(), f(ring));
        }
        Value::Object(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(relayed: u64, hosts: &[&str]) -> Sample {
        Sample {
            envelopes_relayed: relayed,
            attached: 1,
            reconnects: [relayed, 0, 0, 0],
            hosts: hosts
                .iter()
                .map(|id| HostSample {
                    id: (*id).into(),
                    rtt_ms: Some(1.5),
                    links: 2,
                })
                .collect(),
            ..Sample::default()
        }
    }

    #[test]
    fn a_ring_keeps_only_its_newest_values() {
        let mut r = Ring::new(3);
        for i in 0..10 {
            r.push(i);
            assert!(r.len() <= 3);
        }
        assert_eq!(r.iter().copied().collect::<Vec<_>>(), [7, 8, 9]);
        assert_eq!(r.capacity(), 3);
    }

    /// However long the relay runs, every series holds at most the
    /// configured span's points, and a removed host's series go.
    #[test]
    fn the_history_stays_bounded() {
        let every = Duration::from_millis(500);
        let span = crate::config::Limits::default().status_history_secs;
        let mut h = History::new(Duration::from_secs(span), every);
        assert_eq!(h.capacity(), 1800, "15 minutes by default");
        let start = Instant::now();
        for i in 0..5000u64 {
            let hosts: &[&str] = if i < 4000 { &["a", "b"] } else { &["a"] };
            h.record(&sample(i * 10, hosts), start + every * i as u32, i);
        }
        let v = h.to_json();
        for series in ["t", "actions_per_sec", "attached", "detached", "retained"] {
            assert_eq!(v[series].as_array().map(Vec::len), Some(1800), "{series}");
        }
        assert_eq!(
            v["reconnects"]["replay"].as_array().map(Vec::len),
            Some(1800)
        );
        assert_eq!(
            v["hosts"]["a"]["rtt_ms"].as_array().map(Vec::len),
            Some(1800)
        );
        assert!(v["hosts"].get("b").is_none(), "a removed host's series go");
        assert_eq!(v["t"][0], 3200, "the oldest points went first");
        assert_eq!(v["seq"], 5000);
        let latest = h.latest_json();
        assert_eq!(latest["actions_per_sec"], 20.0, "10 per 500 ms");
        assert_eq!(latest["reconnects"]["replay"], 10);
        assert_eq!(latest["hosts"]["a"]["links"], 2);
    }
}

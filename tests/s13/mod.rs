//! The S13 client model (contract §5, §9 S13): one client on a raw
//! WebSocket that checks every frame it reads against what it knows —
//! `serverSeq`s strictly increasing above the connection's floor, no
//! envelope before its channel's snapshot, every accepted envelope valid
//! for the official reducers, echoes of its own dispatches exactly once and
//! other clients only as `r1.` pseudonyms, a `reconnect`/`initialize`
//! answer as the cut (§5.5) — and keeps the reduced state of each channel
//! for the end-of-run comparison with the host. `relay_convergence.rs`
//! (S13) and `soak.rs` drive it; each file owns its world (hosts, relay,
//! plan).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ahp::ReduceOutcome;
use ahp_relay::simhost::clock::SplitMix64;
use ahp_relay::upstream::dial::{DialOptions, dial_stream};
use ahp_types::actions::ActionEnvelope;
use ahp_types::state::{ChatState, RootState};
use serde_json::{Value, json};

use crate::common::{
    MAX_SAFE, Next, ROOT, RawWs, dispatch_frame, initialize_subscribing, reconnect_params,
    request_frame, turn_started,
};

/// Silence that ends a drain.
pub const QUIET: Duration = Duration::from_millis(3);
/// Bound of one request through the relay (above `upstream_settle_secs`).
pub const REQUEST_WITHIN: Duration = Duration::from_secs(8);

/// A raw TLS WebSocket to the relay with `opts` (token and CA included).
pub async fn dial(opts: &DialOptions) -> R<RawWs> {
    dial_stream(opts)
        .await
        .map(RawWs::from_stream)
        .map_err(|e| fail("dial", e.to_string()))
}

// ─── failures and counters ──────────────────────────────────────────────────

/// A seeded generator with the draws the S13 plan and the soak need: the
/// same seed gives the same run.
pub struct Rng(SplitMix64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(SplitMix64::new(seed))
    }
    /// A value in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        self.0.range(0, n.saturating_sub(1) as u64) as usize
    }
    /// True with probability `num / den`.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.0.range(1, den) <= num
    }
    /// A duration of `lo..=hi` milliseconds.
    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(self.0.range(lo, hi))
    }
}

/// Why a run failed: a short kind (used to recognise the same failure when
/// shrinking) and the details.
#[derive(Debug, Clone)]
pub struct Fail {
    pub kind: String,
    pub detail: String,
}

pub fn fail(kind: &str, detail: impl Into<String>) -> Fail {
    Fail {
        kind: kind.to_string(),
        detail: detail.into(),
    }
}

pub type R<T> = Result<T, Fail>;

/// What the runs did, summed over runs.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub runs: u64,
    pub steps: u64,
    pub dispatched: u64,
    pub echoed_accepted: u64,
    pub echoed_rejected: u64,
    pub never_echoed: u64,
    pub taken_unacknowledged: u64,
    pub late_echoes: u64,
    pub envelopes: u64,
    pub connections: u64,
    pub replays: u64,
    pub replayed_envelopes: u64,
    pub snapshot_reconnects: u64,
    pub not_found: u64,
    pub initializes: u64,
    pub init_omitted: u64,
    pub resubscribes: u64,
    pub closes_4000: u64,
    pub closes_1012: u64,
    pub closes_4009: u64,
    pub host_restarts: u64,
    pub resync_drops: u64,
    pub stalls: u64,
    pub relay_restarts: u64,
    pub client_drops: u64,
    pub offline_skips: u64,
    pub pre_cut_envelopes: u64,
}

impl Stats {
    pub fn add(&mut self, o: &Stats) {
        macro_rules! sum {
            ($($f:ident),*) => { $( self.$f += o.$f; )* };
        }
        sum!(
            runs,
            steps,
            dispatched,
            echoed_accepted,
            echoed_rejected,
            never_echoed,
            taken_unacknowledged,
            late_echoes,
            envelopes,
            connections,
            replays,
            replayed_envelopes,
            snapshot_reconnects,
            not_found,
            initializes,
            init_omitted,
            resubscribes,
            closes_4000,
            closes_1012,
            closes_4009,
            host_restarts,
            resync_drops,
            stalls,
            relay_restarts,
            client_drops,
            offline_skips,
            pre_cut_envelopes
        );
    }
}

// ─── client model ───────────────────────────────────────────────────────────

/// The confirmed state of one channel.
pub enum St {
    Chat(Box<ChatState>),
    Root(Box<RootState>),
}

impl St {
    pub fn parse(uri: &str, v: &Value) -> R<Self> {
        let bad = |e: serde_json::Error| fail("snapshot-unparsable", format!("{uri}: {e}: {v}"));
        Ok(if uri == ROOT {
            St::Root(Box::new(serde_json::from_value(v.clone()).map_err(bad)?))
        } else {
            St::Chat(Box::new(serde_json::from_value(v.clone()).map_err(bad)?))
        })
    }

    pub fn json(&self) -> Value {
        match self {
            St::Chat(s) => serde_json::to_value(s).unwrap_or(Value::Null),
            St::Root(s) => serde_json::to_value(s).unwrap_or(Value::Null),
        }
    }
}

pub struct Chan {
    /// Client form.
    pub uri: String,
    /// Host index and host form (`None` for root).
    pub host: Option<(usize, String)>,
    /// `None` until a snapshot arrives (or after one was missing).
    pub state: Option<St>,
    /// Number of the last envelope applied (or the snapshot's `fromSeq`).
    pub applied: u64,
}

pub struct Sent {
    pub channel: String,
    pub ty: String,
    pub conn: u64,
    pub echoes: u32,
    pub rejected: bool,
    pub taken_unacked: bool,
}

/// How a client (re)connects.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum How {
    /// `reconnect` if it has a watermark, `initialize` on -32008.
    Resume,
    /// `initialize` (a client that lost its state, or a new session).
    Fresh,
}

/// The answer to a request, or how the socket ended first.
pub enum Answer {
    Result(Value),
    Error(i64, Value),
    Closed(Option<u16>),
}

pub struct Client {
    pub idx: usize,
    pub sub: &'static str,
    pub id: String,
    pub upstream: String,
    pub chans: Vec<Chan>,
    pub ws: Option<RawWs>,
    /// Connections opened so far (the current one's number).
    pub conn: u64,
    /// Last `serverSeq` (or floor) on the current connection.
    pub conn_last: Option<u64>,
    pub watermark: Option<u64>,
    pub next_seq: i64,
    pub next_req: u64,
    pub sent: BTreeMap<i64, Sent>,
    pub fresh: u64,
    /// Fail on an envelope written before a `reconnect`/`initialize`
    /// answer (contract §5.5) instead of keeping it for after the answer.
    pub strict_cut: bool,
    /// Envelopes that arrived before the answer being waited for.
    pub pre_cut: Vec<Value>,
    /// The client's recent history, printed when a run fails.
    pub trace: std::collections::VecDeque<String>,
    /// Require every envelope on a connection to be numbered exactly one
    /// above the previous one or the floor (no action lost in between).
    pub contiguous: bool,
    /// Hosts may be down (stopped, not restarted in place): a `snapshot`
    /// answer may omit their channels (§5.8 `upstream_settle_timeout`);
    /// such a channel is left without state and subscribed again later.
    pub hosts_may_be_down: bool,
}

impl Client {
    /// Checks at rest that every channel this client follows holds exactly
    /// what a fresh subscriber would get: `root` for the root channel, and
    /// `host_state(host, host_uri)` (the host's own state, named as the
    /// client names it) for the others.
    pub fn verify_states(
        &self,
        root: &Value,
        host_state: impl Fn(usize, &str) -> Option<Value>,
    ) -> R<()> {
        for ch in &self.chans {
            let Some(state) = ch.state.as_ref() else {
                return Err(fail(
                    "channel-without-state-at-end",
                    format!("client {} {}", self.idx, ch.uri),
                ));
            };
            let expected = match &ch.host {
                None => root.clone(),
                Some((h, host_uri)) => {
                    let mut s = host_state(*h, host_uri)
                        .ok_or_else(|| fail("host-chat-gone", host_uri.clone()))?;
                    s["resource"] = json!(ch.uri);
                    s
                }
            };
            let mine = state.json();
            if mine != expected {
                return Err(fail(
                    "state-diverged",
                    format!(
                        "client {} {}:\n  client: {mine}\n  expected: {expected}",
                        self.idx, ch.uri
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Counts how each of this client's dispatches was answered: at most
    /// one echo each (accepted or rejected); a second echo is a failure.
    pub fn tally_echoes(&self, st: &mut Stats) -> R<()> {
        for s in self.sent.values() {
            match (s.echoes, s.rejected) {
                (0, _) => st.never_echoed += 1,
                (1, false) => st.echoed_accepted += 1,
                (1, true) => st.echoed_rejected += 1,
                (n, _) => {
                    return Err(fail(
                        "duplicate-echo",
                        format!("client {}: {} echoed {n} times", self.idx, s.ty),
                    ));
                }
            }
        }
        Ok(())
    }

    pub fn note(&mut self, what: String) {
        if self.trace.len() == 200 {
            self.trace.pop_front();
        }
        self.trace.push_back(what);
    }

    /// The recent history, one event a line.
    pub fn history(&self) -> String {
        self.trace
            .iter()
            .map(|e| format!("\n    {e}"))
            .collect::<String>()
    }

    pub fn chan(&self, uri: &str) -> Option<usize> {
        self.chans.iter().position(|c| c.uri == uri)
    }

    pub fn host_chan(&self, host: usize) -> usize {
        self.chans
            .iter()
            .position(|c| c.host.as_ref().map(|h| h.0) == Some(host))
            .unwrap_or(0)
    }

    pub fn uris(&self) -> Vec<&str> {
        self.chans.iter().map(|c| c.uri.as_str()).collect()
    }

    /// Handles one frame outside a request.
    pub fn on_frame(&mut self, v: &Value, st: &mut Stats) -> R<()> {
        if v.get("method").and_then(Value::as_str) == Some("action") {
            return self.on_envelope(&v["params"], st);
        }
        if v.get("id").is_some() && v.get("method").is_none() {
            return Err(fail("unexpected-response", v.to_string()));
        }
        if v.get("unparsed").is_some() {
            return Err(fail("not-json", v.to_string()));
        }
        Ok(())
    }

    /// Checks one envelope against everything the client knows (contract
    /// §5.1 numbering, §5.2 snapshots first, §2 B2 origins, one echo per
    /// dispatch) and applies it to its channel's state.
    pub fn on_envelope(&mut self, params: &Value, st: &mut Stats) -> R<()> {
        let env: ActionEnvelope = serde_json::from_value(params.clone())
            .map_err(|e| fail("envelope-unparsable", format!("{e}: {params}")))?;
        let seq = env.server_seq;
        if let Some(last) = self.conn_last
            && seq <= last
        {
            return Err(fail(
                "seq-not-increasing",
                format!(
                    "client {} conn {}: serverSeq {seq} after {last}: {params}",
                    self.idx, self.conn
                ),
            ));
        }
        if seq > MAX_SAFE {
            return Err(fail(
                "seq-above-2^53",
                format!("client {}: {params}", self.idx),
            ));
        }
        if self.contiguous
            && let Some(last) = self.conn_last
            && seq != last + 1
        {
            return Err(fail(
                "seq-gap",
                format!(
                    "client {} conn {}: serverSeq {seq} after {last}: {params}",
                    self.idx, self.conn
                ),
            ));
        }
        self.conn_last = Some(seq);
        self.watermark = Some(seq);
        st.envelopes += 1;
        self.note(format!(
            "env {seq} {} {}{}{}",
            env.channel,
            params["action"]["type"].as_str().unwrap_or_default(),
            env.origin
                .as_ref()
                .filter(|o| o.client_id == self.id)
                .map(|o| format!(" echo#{}", o.client_seq))
                .unwrap_or_default(),
            if env.rejection_reason.is_some() {
                " rejected"
            } else {
                ""
            }
        ));
        self.apply_envelope(&env, params)?;
        self.check_origin(&env, params, st)
    }

    /// Applies `env` to its channel's state: the channel must be subscribed
    /// and have its snapshot, the envelope must be new to it, and an
    /// accepted action must be valid for the reducer.
    pub fn apply_envelope(&mut self, env: &ActionEnvelope, params: &Value) -> R<()> {
        let seq = env.server_seq;
        let who = self.idx;
        let Some(ci) = self.chan(&env.channel) else {
            return Err(fail(
                "envelope-unsubscribed-channel",
                format!("client {who}: {params}"),
            ));
        };
        let chan = &mut self.chans[ci];
        let Some(state) = chan.state.as_mut() else {
            return Err(fail(
                "envelope-before-snapshot",
                format!("client {who}: {params}"),
            ));
        };
        if seq <= chan.applied {
            return Err(fail(
                "duplicate-envelope",
                format!("client {who}: {seq} ≤ applied {}: {params}", chan.applied),
            ));
        }
        chan.applied = seq;
        if env.rejection_reason.is_none() {
            let outcome = match state {
                St::Chat(s) => ahp::reducers::apply_action_to_chat(s, &env.action),
                St::Root(s) => ahp::reducers::apply_action_to_root(s, &env.action),
            };
            if let ReduceOutcome::Invalid(e) = outcome {
                return Err(fail(
                    "reducer-invalid",
                    format!("client {who}: {e:?}: {params}"),
                ));
            }
        }
        Ok(())
    }

    /// Another client's origin is an opaque `r1.` pseudonym (never this
    /// client's upstream id); this client's own echo matches exactly one
    /// dispatch it sent, on the same channel with the same type.
    pub fn check_origin(&mut self, env: &ActionEnvelope, params: &Value, st: &mut Stats) -> R<()> {
        let who = self.idx;
        let Some(origin) = &env.origin else {
            return Ok(());
        };
        if origin.client_id == self.upstream {
            return Err(fail(
                "own-upstream-id-leaked",
                format!("client {who}: {params}"),
            ));
        }
        if origin.client_id != self.id {
            // Another client: only ever an opaque upstream pseudonym (§2, B2).
            if !origin.client_id.starts_with("r1.") {
                return Err(fail(
                    "origin-not-pseudonymous",
                    format!("client {who}: {params}"),
                ));
            }
            return Ok(());
        }
        let ty = params["action"]["type"].as_str().unwrap_or_default();
        let Some(sent) = self.sent.get_mut(&origin.client_seq) else {
            return Err(fail(
                "echo-of-unknown-clientSeq",
                format!("client {who}: {params}"),
            ));
        };
        sent.echoes += 1;
        if sent.echoes > 1 {
            return Err(fail(
                "duplicate-echo",
                format!(
                    "client {who}: clientSeq {} ({} sent on connection {}) echoed twice; second: {params}",
                    origin.client_seq, sent.ty, sent.conn
                ),
            ));
        }
        if sent.channel != env.channel || sent.ty != ty {
            return Err(fail(
                "echo-mismatch",
                format!(
                    "client {who}: sent {} on {}, echo {params}",
                    sent.ty, sent.channel
                ),
            ));
        }
        if env.rejection_reason.is_some() {
            sent.rejected = true;
        }
        if sent.taken_unacked {
            st.late_echoes += 1;
        }
        Ok(())
    }

    /// The socket ended (not on the test's request): only 4000 (resync)
    /// and 1012 (relay restart) are expected (contract §3.7).
    pub fn on_closed(&mut self, close: Option<(u16, String)>, st: &mut Stats) -> R<()> {
        self.note(format!("conn {} closed {close:?}", self.conn));
        self.ws = None;
        self.conn_last = None;
        match close.as_ref().map(|c| c.0) {
            Some(4000) => st.closes_4000 += 1,
            Some(1012) => st.closes_1012 += 1,
            _ => {
                return Err(fail(
                    "unexpected-close",
                    format!(
                        "client {} (connection {}) closed with {close:?}",
                        self.idx, self.conn
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Reads frames until `quiet` passes without one (at most `max`).
    pub async fn drain(&mut self, quiet: Duration, max: Duration, st: &mut Stats) -> R<()> {
        let end = Instant::now() + max;
        while Instant::now() < end {
            let Some(ws) = self.ws.as_mut() else {
                return Ok(());
            };
            match ws.next_within(quiet).await {
                None => return Ok(()),
                Some(Next::Frame(v)) => self.on_frame(&v, st)?,
                Some(Next::Closed(c)) => return self.on_closed(c, st),
            }
        }
        Ok(())
    }

    /// Sends a request and reads until its answer. With `cut`, an envelope
    /// before the answer is an error (the answer of `reconnect` and
    /// `initialize` is the cut, contract §5.5); otherwise frames before the
    /// answer are handled as usual.
    pub async fn request(
        &mut self,
        method: &str,
        params: Value,
        cut: bool,
        st: &mut Stats,
    ) -> R<Answer> {
        self.next_req += 1;
        let id = self.next_req;
        let frame = request_frame(id, method, params);
        let Some(ws) = self.ws.as_mut() else {
            return Ok(Answer::Closed(None));
        };
        if !ws.try_send_json(&frame).await {
            self.ws = None;
            return Ok(Answer::Closed(None));
        }
        let end = Instant::now() + REQUEST_WITHIN;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let Some(ws) = self.ws.as_mut() else {
                return Ok(Answer::Closed(None));
            };
            let Some(next) = ws.next_within(left).await else {
                return Err(fail(
                    &format!("timeout-{method}"),
                    format!("client {}: no answer to {frame}", self.idx),
                ));
            };
            match next {
                Next::Closed(c) => {
                    let code = c.as_ref().map(|c| c.0);
                    self.on_closed(c, st)?;
                    return Ok(Answer::Closed(code));
                }
                Next::Frame(v) if v.get("id") == Some(&json!(id)) && v.get("method").is_none() => {
                    if let Some(e) = v.get("error") {
                        let code = e["code"].as_i64().unwrap_or(0);
                        return Ok(Answer::Error(code, e.clone()));
                    }
                    return Ok(Answer::Result(v["result"].clone()));
                }
                Next::Frame(v) => {
                    if cut && v.get("method").and_then(Value::as_str) == Some("action") {
                        if self.strict_cut {
                            return Err(fail(
                                &format!("envelope-before-{method}-answer"),
                                format!("client {}: {v}", self.idx),
                            ));
                        }
                        // A client following the seed study §6.6 keeps it
                        // until the answer is applied.
                        st.pre_cut_envelopes += 1;
                        self.pre_cut.push(v["params"].clone());
                        continue;
                    }
                    self.on_frame(&v, st)?;
                }
            }
        }
    }

    /// Opens a new socket and resumes (or starts) the session on it.
    pub async fn connect(&mut self, opts: &DialOptions, how: How, st: &mut Stats) -> R<()> {
        let ws = dial(opts).await?;
        self.ws = Some(ws);
        self.conn += 1;
        self.conn_last = None;
        self.pre_cut.clear();
        st.connections += 1;
        if how == How::Resume
            && let Some(w) = self.watermark
        {
            let params = reconnect_params(&self.id, w, &self.uris());
            match self.request("reconnect", params, true, st).await? {
                Answer::Closed(_) => return Ok(()),
                Answer::Error(-32008, _) if self.pre_cut.is_empty() => st.not_found += 1,
                Answer::Error(_, e) => {
                    return Err(fail("reconnect-error", format!("client {}: {e}", self.idx)));
                }
                Answer::Result(r) => {
                    match r["type"].as_str() {
                        Some("replay") => self.adopt_replay(&r, w, st)?,
                        Some("snapshot") => self.adopt_snapshots(&r, w, st)?,
                        _ => return Err(fail("reconnect-result", r.to_string())),
                    }
                    self.after_cut()?;
                    return self.settle(st).await;
                }
            }
        }
        let old = self.watermark;
        let params = initialize_subscribing(&self.id, &self.uris());
        match self.request("initialize", params, true, st).await? {
            Answer::Closed(_) => Ok(()),
            Answer::Error(_, e) => Err(fail(
                "initialize-error",
                format!("client {}: {e}", self.idx),
            )),
            Answer::Result(r) => {
                self.adopt_initialize(&r, old, st)?;
                self.after_cut()?;
                self.settle(st).await
            }
        }
    }

    /// Envelopes written before the answer must be ones the answer already
    /// covers (numbered at or below the snapshot it gave the channel), so a
    /// client dropping them by `serverSeq` loses nothing.
    pub fn after_cut(&mut self) -> R<()> {
        for p in std::mem::take(&mut self.pre_cut) {
            let seq = p["serverSeq"].as_u64().unwrap_or(u64::MAX);
            let uri = p["channel"].as_str().unwrap_or_default();
            let covered = self
                .chan(uri)
                .map(|ci| &self.chans[ci])
                .is_some_and(|c| c.state.is_some() && seq <= c.applied);
            if !covered {
                return Err(fail(
                    "pre-cut-envelope-not-covered",
                    format!("client {}: {p} came before the answer", self.idx),
                ));
            }
        }
        Ok(())
    }

    pub fn adopt_replay(&mut self, r: &Value, w: u64, st: &mut Stats) -> R<()> {
        st.replays += 1;
        self.note(format!(
            "conn {}: reconnect from {w} → replay of {}",
            self.conn,
            r["actions"].as_array().map_or(0, Vec::len)
        ));
        self.conn_last = Some(w);
        let missing = r["missing"].as_array().cloned().unwrap_or_default();
        if !missing.is_empty() {
            return Err(fail("replay-missing", format!("client {}: {r}", self.idx)));
        }
        let Some(actions) = r["actions"].as_array() else {
            return Err(fail("replay-without-actions", r.to_string()));
        };
        for a in actions {
            st.replayed_envelopes += 1;
            self.on_envelope(a, st)?;
        }
        Ok(())
    }

    pub fn adopt_snapshots(&mut self, r: &Value, w: u64, st: &mut Stats) -> R<()> {
        st.snapshot_reconnects += 1;
        self.note(format!(
            "conn {}: reconnect from {w} → snapshots {}",
            self.conn,
            brief_snapshots(r)
        ));
        let snaps = r["snapshots"].as_array().cloned().unwrap_or_default();
        let mut from = None;
        for s in &snaps {
            let f = s["fromSeq"].as_u64();
            if from.is_some() && f != from {
                return Err(fail("snapshots-differ-in-fromSeq", r.to_string()));
            }
            from = f;
        }
        let from = from.unwrap_or(w);
        if from < w {
            return Err(fail(
                "fromSeq-below-watermark",
                format!("client {}: watermark {w}: {r}", self.idx),
            ));
        }
        for c in self.chans.iter_mut() {
            if !snaps.iter().any(|s| s["resource"] == c.uri.as_str()) && self.hosts_may_be_down {
                c.state = None;
                c.applied = from;
                st.init_omitted += 1;
            }
        }
        for s in &snaps {
            let uri = s["resource"].as_str().unwrap_or_default();
            let Some(ci) = self.chan(uri) else {
                return Err(fail("snapshot-of-unrequested-channel", r.to_string()));
            };
            self.chans[ci].state = Some(St::parse(uri, &s["state"])?);
            self.chans[ci].applied = from;
        }
        for c in &self.chans {
            if !snaps.iter().any(|s| s["resource"] == c.uri.as_str()) && !self.hosts_may_be_down {
                return Err(fail(
                    "snapshot-reconnect-omits-channel",
                    format!("client {}: {} missing from {r}", self.idx, c.uri),
                ));
            }
        }
        self.watermark = Some(from);
        self.conn_last = Some(from);
        Ok(())
    }

    pub fn adopt_initialize(&mut self, r: &Value, old: Option<u64>, st: &mut Stats) -> R<()> {
        st.initializes += 1;
        self.note(format!(
            "conn {}: initialize → S0 {} snapshots {}",
            self.conn,
            r["serverSeq"],
            brief_snapshots(r)
        ));
        let Some(s0) = r["serverSeq"].as_u64() else {
            return Err(fail("initialize-without-serverSeq", r.to_string()));
        };
        if let Some(w) = old
            && s0 <= w
        {
            return Err(fail(
                "s0-not-above-old-watermark",
                format!("client {}: S0 {s0} ≤ old watermark {w}", self.idx),
            ));
        }
        let snaps = r["snapshots"].as_array().cloned().unwrap_or_default();
        for c in self.chans.iter_mut() {
            c.state = None;
            c.applied = s0;
        }
        for s in &snaps {
            let uri = s["resource"].as_str().unwrap_or_default();
            if s["fromSeq"].as_u64() != Some(s0) {
                return Err(fail("initialize-snapshot-fromSeq", r.to_string()));
            }
            let Some(ci) = self.chan(uri) else {
                return Err(fail("snapshot-of-unrequested-channel", r.to_string()));
            };
            self.chans[ci].state = Some(St::parse(uri, &s["state"])?);
        }
        st.init_omitted += self.chans.iter().filter(|c| c.state.is_none()).count() as u64;
        self.watermark = Some(s0);
        self.conn_last = Some(s0);
        Ok(())
    }

    /// After a (re)connection: drain what followed the answer, then take
    /// the dispatches still without an echo as unacknowledged (§6.6 step 6).
    pub async fn settle(&mut self, st: &mut Stats) -> R<()> {
        self.drain(QUIET, Duration::from_millis(200), st).await?;
        for s in self.sent.values_mut() {
            if s.echoes == 0 && !s.taken_unacked {
                s.taken_unacked = true;
                st.taken_unacknowledged += 1;
            }
        }
        Ok(())
    }

    /// Subscribes again the channels left without a snapshot.
    pub async fn resubscribe(&mut self, st: &mut Stats) -> R<()> {
        for ci in 0..self.chans.len() {
            if self.chans[ci].state.is_some() || self.ws.is_none() {
                continue;
            }
            let uri = self.chans[ci].uri.clone();
            match self
                .request("subscribe", json!({"channel": uri}), false, st)
                .await?
            {
                Answer::Closed(_) | Answer::Error(..) => continue,
                Answer::Result(r) => {
                    let snap = &r["snapshot"];
                    let from = snap["fromSeq"].as_u64().unwrap_or(0);
                    if let Some(last) = self.conn_last
                        && from < last
                    {
                        return Err(fail(
                            "subscribe-fromSeq-below-connection",
                            format!("client {}: {from} < {last}: {r}", self.idx),
                        ));
                    }
                    if snap["resource"] != uri.as_str() {
                        return Err(fail("subscribe-snapshot-resource", r.to_string()));
                    }
                    self.chans[ci].state = Some(St::parse(&uri, &snap["state"])?);
                    self.chans[ci].applied = from;
                    self.conn_last = Some(from);
                    self.note(format!(
                        "conn {}: subscribe {uri} → fromSeq {from}",
                        self.conn
                    ));
                    self.watermark = Some(self.watermark.map_or(from, |w| w.max(from)));
                    st.resubscribes += 1;
                }
            }
        }
        Ok(())
    }

    /// Sends one `dispatchAction` on channel `ci` (skipped while offline).
    pub async fn dispatch(&mut self, ci: usize, action: Value, st: &mut Stats) -> R<()> {
        // Notice a close that is already there before writing.
        if let Some(ws) = self.ws.as_mut() {
            match ws.next_within(Duration::ZERO).await {
                Some(Next::Frame(v)) => self.on_frame(&v, st)?,
                Some(Next::Closed(c)) => self.on_closed(c, st)?,
                None => {}
            }
        }
        let Some(ws) = self.ws.as_mut() else {
            st.offline_skips += 1;
            return Ok(());
        };
        let seq = self.next_seq;
        let channel = self.chans[ci].uri.clone();
        let ty = action["type"].as_str().unwrap_or_default().to_string();
        let frame = dispatch_frame(&channel, seq, action);
        if ws.try_send_json(&frame).await {
            self.next_seq += 1;
            st.dispatched += 1;
            self.note(format!(
                "conn {}: dispatch #{seq} {ty} on {channel}",
                self.conn
            ));
            self.sent.insert(
                seq,
                Sent {
                    channel,
                    ty,
                    conn: self.conn,
                    echoes: 0,
                    rejected: false,
                    taken_unacked: false,
                },
            );
        } else {
            self.ws = None;
            self.conn_last = None;
        }
        Ok(())
    }

    /// The client's confirmed chat state of channel `ci` as JSON.
    pub fn view(&self, ci: usize) -> Option<Value> {
        self.chans[ci].state.as_ref().map(St::json)
    }

    pub fn fresh_id(&mut self, prefix: &str, seed: u64) -> String {
        self.fresh += 1;
        format!("{prefix}-{seed}-{}-{}", self.idx, self.fresh)
    }
}

/// A dispatch a client can make on one of its chats.
#[derive(Clone, Copy, Debug)]
pub enum Act {
    /// `chat/turnStarted` with a fresh turnId.
    Turn,
    /// `chat/turnCancelled` of the active turn (or of the last one: a rejection).
    Cancel,
    /// `chat/toolCallConfirmed` (approved or denied) of a pending tool call
    /// (or of an old one: a rejection).
    Confirm(bool),
    /// `chat/pendingMessageSet` queued.
    Queue,
}

impl Client {
    /// Dispatches `act` on chat `ci` as the client sees it; nothing when
    /// the client has no state of that chat or nothing to act on. `seed`
    /// makes the fresh turn and message ids unique across runs.
    pub async fn act(&mut self, act: Act, ci: usize, seed: u64, st: &mut Stats) -> R<()> {
        let Some(view) = self.view(ci) else {
            return Ok(());
        };
        let action = match act {
            Act::Turn => {
                let turn = self.fresh_id("t", seed);
                turn_started(&turn, &format!("do {turn}"))
            }
            Act::Cancel => {
                let turn = view["activeTurn"]["id"]
                    .as_str()
                    .or_else(|| view["turns"].as_array()?.last()?["id"].as_str());
                let Some(turn) = turn else { return Ok(()) };
                json!({"type": "chat/turnCancelled", "turnId": turn, "duration": 0})
            }
            Act::Confirm(approve) => {
                let Some((turn, tool)) = pending_tool(&view).or_else(|| old_tool(&view)) else {
                    return Ok(());
                };
                confirm_action(&turn, &tool, approve)
            }
            Act::Queue => {
                let id = self.fresh_id("q", seed);
                json!({"type": "chat/pendingMessageSet", "kind": "queued",
                    "id": id, "message": message(&format!("later {id}"))})
            }
        };
        self.dispatch(ci, action, st).await
    }
}

/// What bringing a host chat to rest needs next.
pub enum Rest {
    /// No active turn, nothing queued.
    Idle,
    /// A turn is running without a pending confirmation: wait.
    Busy,
    /// Dispatch this: approve the pending tool call, or remove the first
    /// queued message.
    Act(Value),
}

/// One round of bringing the host chats to rest: for each `(host, host
/// URI, state)` not at rest, a client that follows the chat (connected,
/// with a snapshot) dispatches the step. Whether any chat was not at rest.
pub async fn rest_round(
    clients: &mut [Client],
    chats: Vec<(usize, String, Value)>,
    st: &mut Stats,
) -> R<bool> {
    let mut busy = false;
    for (h, uri, state) in chats {
        let action = match rest_step(&state) {
            Rest::Idle => continue,
            Rest::Busy => {
                busy = true;
                continue;
            }
            Rest::Act(a) => a,
        };
        busy = true;
        let key = Some((h, uri));
        let who = clients.iter().enumerate().find_map(|(i, c)| {
            let ci = c.chans.iter().position(|ch| ch.host == key)?;
            (c.ws.is_some() && c.chans[ci].state.is_some()).then_some((i, ci))
        });
        if let Some((c, ci)) = who {
            clients[c].dispatch(ci, action, st).await?;
        }
    }
    Ok(busy)
}

/// Whether every client is connected with a snapshot of every channel.
pub fn all_in(clients: &[Client]) -> bool {
    clients
        .iter()
        .all(|c| c.ws.is_some() && c.chans.iter().all(|ch| ch.state.is_some()))
}

/// The next step to bring the host chat `state` to rest.
pub fn rest_step(state: &Value) -> Rest {
    if let Some((turn, tool)) = pending_tool(state) {
        return Rest::Act(confirm_action(&turn, &tool, true));
    }
    if state.get("activeTurn").is_some() {
        return Rest::Busy;
    }
    let queued = state["queuedMessages"]
        .as_array()
        .and_then(|q| q.first())
        .and_then(|m| m["id"].as_str());
    match queued {
        Some(id) => {
            Rest::Act(json!({"type": "chat/pendingMessageRemoved", "kind": "queued", "id": id}))
        }
        None => Rest::Idle,
    }
}

/// `[uri@fromSeq turns=n active=id …]` of an answer's snapshots.
pub fn brief_snapshots(r: &Value) -> String {
    let items: Vec<String> = r["snapshots"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            format!(
                "{}@{} turns={} active={}",
                s["resource"].as_str().unwrap_or_default(),
                s["fromSeq"],
                s["state"]["turns"].as_array().map_or(0, Vec::len),
                s["state"]["activeTurn"]["id"]
            )
        })
        .collect();
    format!("[{}]", items.join(", "))
}

pub fn message(text: &str) -> Value {
    json!({"text": text, "origin": {"kind": "user"}})
}

/// The pending-confirmation tool call of a chat state, as (turnId, toolCallId).
pub fn pending_tool(state: &Value) -> Option<(String, String)> {
    let turn = state.get("activeTurn")?;
    let turn_id = turn["id"].as_str()?.to_string();
    turn["responseParts"].as_array()?.iter().find_map(|p| {
        let tc = &p["toolCall"];
        (p["kind"] == "toolCall" && tc["status"] == "pending-confirmation").then(|| {
            (
                turn_id.clone(),
                tc["toolCallId"].as_str().unwrap_or_default().to_string(),
            )
        })
    })
}

/// Some tool call of a finished turn, as (turnId, toolCallId): confirming it is rejected.
pub fn old_tool(state: &Value) -> Option<(String, String)> {
    state["turns"].as_array()?.iter().rev().find_map(|t| {
        let turn_id = t["id"].as_str()?.to_string();
        t["responseParts"].as_array()?.iter().find_map(|p| {
            (p["kind"] == "toolCall").then(|| {
                (
                    turn_id.clone(),
                    p["toolCall"]["toolCallId"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                )
            })
        })
    })
}

pub fn confirm_action(turn: &str, tool: &str, approve: bool) -> Value {
    if approve {
        json!({"type": "chat/toolCallConfirmed", "turnId": turn, "toolCallId": tool,
            "approved": true, "confirmed": "user-action"})
    } else {
        json!({"type": "chat/toolCallConfirmed", "turnId": turn, "toolCallId": tool,
            "approved": false, "reason": "denied"})
    }
}

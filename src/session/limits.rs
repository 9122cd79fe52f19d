//! Per-connection and per-session bounds of contract §3.6 that the session
//! enforces: the request rate (a token bucket), subscriptions per session,
//! requests awaiting a host, and the forwarded-request timeout. Each hit is
//! counted in `ahp_relay_limit_hits_total{limit}`; the answers are in the
//! README's "Bad input" table.

use std::collections::HashSet;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::{Chan, ClientSession, PendingKind, SessionCore};
use crate::rpc::RpcError;

/// A token bucket over one connection's frames: `rate` tokens a second, at
/// most `burst` saved up. A rate of 0 never refuses.
#[derive(Debug)]
pub struct RateBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl RateBucket {
    /// A full bucket.
    pub fn new(rate: u32, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            rate: f64::from(rate),
            burst,
            tokens: burst,
            at: Instant::now(),
        }
    }

    /// Takes one token; `false` when the connection is over its rate.
    pub fn take(&mut self) -> bool {
        if self.rate <= 0.0 {
            return true;
        }
        let now = Instant::now();
        let earned = now.duration_since(self.at).as_secs_f64() * self.rate;
        self.tokens = (self.tokens + earned).min(self.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// `channels` in order, each once (a set: a frame full of channels costs
/// linear time), or -32602 if more than `cap` distinct channels remain.
pub fn dedup_capped(channels: Vec<String>, cap: usize) -> Result<Vec<String>, RpcError> {
    let mut seen = HashSet::with_capacity(channels.len().min(cap.saturating_add(1)));
    let mut out = Vec::new();
    for c in channels {
        if seen.contains(&c) {
            continue;
        }
        if out.len() >= cap {
            return Err(RpcError::invalid_params(format!(
                "more than {cap} distinct subscriptions (limits.subscriptions_per_session)"
            )));
        }
        seen.insert(c.clone());
        out.push(c);
    }
    Ok(out)
}

impl ClientSession {
    /// Counts a limit hit in `ahp_relay_limit_hits_total{limit}`.
    pub(crate) fn limit_hit(&self, limit: &str) {
        self.env
            .metrics
            .limit_hits
            .with_label_values(&[limit])
            .inc();
    }

    /// -32603 `subscriptionLimit` if following `channel` would take the
    /// session over `limits.subscriptions_per_session` (channels already
    /// followed, or awaiting their snapshot, are counted once).
    pub(super) fn check_subscription(&self, channel: &str) -> Result<(), RpcError> {
        let cap = self.env.cfg.limits.subscriptions_per_session;
        let core = self.lock();
        if core.channels.subs.contains(channel) || followed(&core) < cap {
            return Ok(());
        }
        drop(core);
        self.limit_hit("subscriptions");
        Err(RpcError::limited(
            "subscriptionLimit",
            format!("at most {cap} subscriptions per session: unsubscribe first"),
            false,
        ))
    }

    /// -32603 `pendingLimit` if this session already awaits
    /// `limits.pending_requests_per_connection` host answers.
    pub(super) fn check_pending(&self, core: &SessionCore) -> Result<(), RpcError> {
        let cap = self.env.cfg.limits.pending_requests_per_connection;
        if core.links.pending.len() < cap {
            return Ok(());
        }
        self.limit_hit("pending");
        Err(RpcError::limited(
            "pendingLimit",
            format!("at most {cap} requests may await a host: wait for answers"),
            true,
        ))
    }

    /// Fails forwarded request `n` of link `link` with -32603
    /// `reason = "timeout"` if it is still unanswered, removing its pending
    /// entry (a late answer then finds none and is dropped). A subscribe
    /// stops holding its channel; a create releases its store entry (on a
    /// blocking thread).
    fn expire_request(&self, link: u64, n: u64, host: &str) {
        let mut core = self.lock();
        let Some(p) = core.links.pending.remove(&(link, n)) else {
            return;
        };
        self.limit_hit("request_timeout");
        p.end("timeout", None);
        let secs = self.env.cfg.limits.upstream_request_secs;
        let err = RpcError::limited(
            "timeout",
            format!("host {host} did not answer {} within {secs} s", p.method),
            true,
        );
        match p.kind {
            PendingKind::Initial { reply, .. } => {
                let _ = reply.send(None);
            }
            PendingKind::Internal { reply } => {
                let _ = reply.send(Err(err));
            }
            // Only this subscribe's own hold ends: a later subscribe of the
            // channel, or a socket that replaced the asking one, may hold it
            // for its own snapshot.
            PendingKind::Subscribe {
                host_channel,
                ticket,
                ..
            } => {
                self.respond_error_to(&mut core, &p.reply, &err);
                if let Some(hub) = self.env.hosts.get(host) {
                    self.end_channel_hold(&mut core, &hub, &host_channel, ticket);
                }
            }
            PendingKind::Create { .. } => {
                // The host may still make it: the entry stays pending (and
                // names its creator) until `settle.rs` reads the host's lists.
                self.respond_error_to(&mut core, &p.reply, &err);
            }
            _ => self.respond_error_to(&mut core, &p.reply, &err),
        }
    }
}

/// Channels the session follows or awaits a snapshot of.
fn followed(core: &SessionCore) -> usize {
    let holding: usize = core
        .channels
        .chans
        .values()
        .map(|m| {
            m.values()
                .filter(|c| matches!(c, Chan::Holding { .. }))
                .count()
        })
        .sum();
    core.channels.subs.len() + holding
}

/// Fails request `n` on link `link` to `host` after
/// `limits.upstream_request_secs` unless its answer came first.
pub(super) fn expire_after(session: &Arc<ClientSession>, link: u64, n: u64, host: Arc<str>) {
    let after = Duration::from_secs(session.env.cfg.limits.upstream_request_secs.max(1));
    let weak: Weak<ClientSession> = Arc::downgrade(session);
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        if let Some(session) = weak.upgrade() {
            session.expire_request(link, n, &host);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::{RateBucket, dedup_capped};

    #[test]
    fn bucket_allows_its_burst_then_refuses() {
        let mut b = RateBucket::new(1, 3);
        assert!((0..3).all(|_| b.take()));
        assert!(!b.take());
        let mut off = RateBucket::new(0, 1);
        assert!((0..1000).all(|_| off.take()));
    }

    #[test]
    fn dedup_keeps_order_and_counts_distinct_channels() {
        let list = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            dedup_capped(list(&["a", "b", "a", "c", "b"]), 3),
            Ok(list(&["a", "b", "c"]))
        );
        assert!(dedup_capped(list(&["a", "b", "c"]), 2).is_err());
        assert!(dedup_capped(list(&["a", "a", "a"]), 1).is_ok());
    }
}

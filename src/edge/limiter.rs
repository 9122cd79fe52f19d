//! Auth-failure rate limit per client address (contract §3.4: repeated failures → 429).
//!
//! A fixed window per address: the first failure opens a window of `window`; once
//! `max_failures` failures fall in it, [`FailureLimiter::check`] answers `false` until the
//! window ends, and [`FailureLimiter::retry_after`] says how long that is. Successful
//! authentications do not reset the count. The edge asks only after a failure, so a valid
//! token is never refused by this limiter.
//!
//! Addresses are grouped the way one client holds them: an IPv4-mapped IPv6 address counts
//! as its IPv4 address, and an IPv6 address counts as its /64 (one host usually owns a
//! whole /64, so per-address counting would be trivial to evade).
//!
//! An address over its budget does not cost a signature check for a token it already failed
//! with: each window remembers keyed fingerprints of the last [`REMEMBERED_TOKENS`] tokens
//! that failed in it, and [`FailureLimiter::known_failure`] lets the edge answer 429 for such a
//! token before verifying it. Any other token is still verified, so a valid token — another
//! user's behind the same address, or the same user's renewed one — is never refused.
//!
//! Memory is bounded: at most `max_tracked` groups are kept. Each window start is also
//! appended to a FIFO; expired windows are dropped from its front on every recorded
//! failure, and when a new group would exceed the cap, the group whose window started
//! longest ago is forgotten. Both are O(1) amortised, so an address spray cannot make a
//! failure expensive to record.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Default number of failures allowed per window (`listen.auth_failure_limit`).
pub const DEFAULT_MAX_FAILURES: u32 = 10;
/// Default window length (`listen.auth_failure_window_secs`).
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(60);
/// Default cap on tracked address groups.
pub const DEFAULT_MAX_TRACKED: usize = 100_000;

/// Tokens remembered per address window as having failed.
pub const REMEMBERED_TOKENS: usize = 16;

#[derive(Debug, Clone)]
struct Window {
    start: Instant,
    failures: u32,
    /// Keyed fingerprints of tokens that failed in this window, newest last.
    tokens: VecDeque<u64>,
}

#[derive(Debug, Default)]
struct Inner {
    windows: HashMap<IpAddr, Window>,
    /// Window starts in recording order; an element is stale once its group has been
    /// removed or has opened a newer window.
    order: VecDeque<(IpAddr, Instant)>,
}

/// Counts authentication failures per client address group; thread-safe, bounded memory
/// (see the module doc for the grouping and eviction rules).
#[derive(Debug)]
pub struct FailureLimiter {
    max_failures: u32,
    window: Duration,
    max_tracked: usize,
    inner: Mutex<Inner>,
    /// Keys the token fingerprints (per process, so they mean nothing outside).
    keys: std::collections::hash_map::RandomState,
}

impl Default for FailureLimiter {
    /// [`DEFAULT_MAX_FAILURES`] per [`DEFAULT_WINDOW`], at most [`DEFAULT_MAX_TRACKED`] groups.
    fn default() -> Self {
        Self::new(DEFAULT_MAX_FAILURES, DEFAULT_WINDOW, DEFAULT_MAX_TRACKED)
    }
}

impl FailureLimiter {
    /// A limiter refusing an address group after `max_failures` failures within `window`,
    /// tracking at most `max_tracked` groups. Zero values are raised to 1 (one failure, one
    /// tracked group, one nanosecond) so the limiter always has a meaning.
    pub fn new(max_failures: u32, window: Duration, max_tracked: usize) -> Self {
        Self {
            max_failures: max_failures.max(1),
            window: window.max(Duration::from_nanos(1)),
            max_tracked: max_tracked.max(1),
            inner: Mutex::new(Inner::default()),
            keys: std::collections::hash_map::RandomState::new(),
        }
    }

    /// `true` if `ip` may attempt authentication at `now`; `false` means answer 429 with
    /// `Retry-After` from [`retry_after`](Self::retry_after).
    pub fn check(&self, ip: IpAddr, now: Instant) -> bool {
        self.retry_after(ip, now).is_none()
    }

    /// Records one failed authentication from `ip` at `now`, with the token
    /// it failed with, if any.
    pub fn record_failure(&self, ip: IpAddr, now: Instant) {
        self.record_failure_with(ip, now, None);
    }

    /// [`FailureLimiter::record_failure`], remembering `token`'s fingerprint.
    pub fn record_failure_with(&self, ip: IpAddr, now: Instant, token: Option<&str>) {
        let key = group(ip);
        let print = token.map(|t| std::hash::BuildHasher::hash_one(&self.keys, t));
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        self.prune_expired(&mut inner, now);
        if let Some(window) = inner.windows.get_mut(&key)
            && self.is_open(window, now)
        {
            window.failures = window.failures.saturating_add(1);
            remember(&mut window.tokens, print);
            return;
        }
        let mut tokens = VecDeque::new();
        remember(&mut tokens, print);
        inner.windows.insert(
            key,
            Window {
                start: now,
                failures: 1,
                tokens,
            },
        );
        inner.order.push_back((key, now));
        while inner.windows.len() > self.max_tracked {
            let Some((old, start)) = inner.order.pop_front() else {
                break;
            };
            if inner.windows.get(&old).is_some_and(|w| w.start == start) {
                inner.windows.remove(&old);
            }
        }
    }

    /// How long `ip` must wait before it may try again, or `None` if it may try now. For
    /// the `Retry-After` header, round up to whole seconds.
    pub fn retry_after(&self, ip: IpAddr, now: Instant) -> Option<Duration> {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let window = inner.windows.get(&group(ip))?;
        if !self.is_open(window, now) || window.failures < self.max_failures {
            return None;
        }
        Some(
            self.window
                .saturating_sub(now.saturating_duration_since(window.start)),
        )
    }

    /// How long `ip` must wait, if it is over its budget at `now` *and*
    /// `token` is one it already failed with in this window: then the edge
    /// answers 429 without verifying the token again.
    pub fn known_failure(&self, ip: IpAddr, now: Instant, token: &str) -> Option<Duration> {
        let wait = self.retry_after(ip, now)?;
        let print = std::hash::BuildHasher::hash_one(&self.keys, token);
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let window = inner.windows.get(&group(ip))?;
        window.tokens.contains(&print).then_some(wait)
    }

    /// Number of address groups currently tracked (for a gauge; at most `max_tracked`).
    pub fn tracked(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .windows
            .len()
    }

    fn is_open(&self, window: &Window, now: Instant) -> bool {
        now.saturating_duration_since(window.start) < self.window
    }

    fn prune_expired(&self, inner: &mut Inner, now: Instant) {
        while let Some(&(key, start)) = inner.order.front() {
            if now.saturating_duration_since(start) < self.window {
                break;
            }
            inner.order.pop_front();
            if inner.windows.get(&key).is_some_and(|w| w.start == start) {
                inner.windows.remove(&key);
            }
        }
    }
}

/// Adds `print` to a window's remembered tokens, forgetting the oldest
/// beyond [`REMEMBERED_TOKENS`].
fn remember(tokens: &mut VecDeque<u64>, print: Option<u64>) {
    let Some(print) = print else {
        return;
    };
    if !tokens.contains(&print) {
        tokens.push_back(print);
    }
    while tokens.len() > REMEMBERED_TOKENS {
        tokens.pop_front();
    }
}

/// The address group a failure (or a pending connection, `pending`) is
/// counted against (see the module doc).
pub fn group(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !u128::from(u64::MAX))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn v4(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(192, 0, 2, last))
    }

    #[test]
    fn blocks_after_max_failures_until_window_ends() {
        let limiter = FailureLimiter::new(3, Duration::from_secs(60), 10);
        let t0 = Instant::now();
        for i in 0..3 {
            assert!(limiter.check(v4(1), t0 + Duration::from_secs(i)));
            limiter.record_failure(v4(1), t0 + Duration::from_secs(i));
        }
        let t = t0 + Duration::from_secs(10);
        assert!(!limiter.check(v4(1), t));
        assert_eq!(limiter.retry_after(v4(1), t), Some(Duration::from_secs(50)));
        assert!(limiter.check(v4(2), t), "other addresses are unaffected");
        let end = t0 + Duration::from_secs(60);
        assert!(limiter.check(v4(1), end));
        assert_eq!(limiter.retry_after(v4(1), end), None);
        limiter.record_failure(v4(1), end);
        assert!(
            limiter.check(v4(1), end),
            "a new window starts with one failure"
        );
    }

    #[test]
    fn a_known_failing_token_is_refused_without_a_new_check() {
        let limiter = FailureLimiter::new(2, Duration::from_secs(60), 10);
        let t0 = Instant::now();
        limiter.record_failure_with(v4(1), t0, Some("stale"));
        assert_eq!(
            limiter.known_failure(v4(1), t0, "stale"),
            None,
            "within budget"
        );
        limiter.record_failure_with(v4(1), t0, Some("stale"));
        assert!(limiter.known_failure(v4(1), t0, "stale").is_some());
        assert_eq!(limiter.known_failure(v4(1), t0, "renewed"), None);
        assert_eq!(limiter.known_failure(v4(2), t0, "stale"), None);
        for i in 0..REMEMBERED_TOKENS {
            limiter.record_failure_with(v4(1), t0, Some(&format!("other-{i}")));
        }
        assert_eq!(limiter.known_failure(v4(1), t0, "stale"), None, "bounded");
    }

    #[test]
    fn default_is_ten_per_minute() {
        let limiter = FailureLimiter::default();
        let t0 = Instant::now();
        for _ in 0..9 {
            limiter.record_failure(v4(1), t0);
        }
        assert!(limiter.check(v4(1), t0));
        limiter.record_failure(v4(1), t0);
        assert!(!limiter.check(v4(1), t0));
        assert_eq!(
            limiter.retry_after(v4(1), t0),
            Some(Duration::from_secs(60))
        );
    }

    #[test]
    fn ipv6_counts_per_64_and_mapped_v4_as_v4() {
        let limiter = FailureLimiter::new(2, Duration::from_secs(60), 10);
        let t0 = Instant::now();
        limiter.record_failure("2001:db8:1:2::1".parse().unwrap(), t0);
        limiter.record_failure("2001:db8:1:2:ffff::9".parse().unwrap(), t0);
        assert!(!limiter.check("2001:db8:1:2::abcd".parse().unwrap(), t0));
        assert!(limiter.check("2001:db8:1:3::1".parse().unwrap(), t0));
        limiter.record_failure("::ffff:192.0.2.7".parse().unwrap(), t0);
        limiter.record_failure(v4(7), t0);
        assert!(!limiter.check(v4(7), t0));
    }

    #[test]
    fn memory_is_capped_evicting_oldest_window() {
        let limiter = FailureLimiter::new(1, Duration::from_secs(60), 3);
        let t0 = Instant::now();
        for i in 0..3u8 {
            limiter.record_failure(v4(i), t0 + Duration::from_secs(u64::from(i)));
        }
        assert_eq!(limiter.tracked(), 3);
        limiter.record_failure(v4(9), t0 + Duration::from_secs(5));
        assert_eq!(limiter.tracked(), 3);
        let t = t0 + Duration::from_secs(6);
        assert!(limiter.check(v4(0), t), "oldest forgotten");
        assert!(!limiter.check(v4(1), t));
        assert!(!limiter.check(v4(9), t));
        for i in 0..=255u8 {
            limiter.record_failure(v4(i), t);
        }
        assert_eq!(limiter.tracked(), 3);
    }

    #[test]
    fn expired_windows_are_pruned() {
        let limiter = FailureLimiter::new(5, Duration::from_secs(10), 100);
        let t0 = Instant::now();
        for i in 0..50u8 {
            limiter.record_failure(v4(i), t0);
        }
        assert_eq!(limiter.tracked(), 50);
        limiter.record_failure(v4(200), t0 + Duration::from_secs(10));
        assert_eq!(limiter.tracked(), 1);
        let inner = limiter.inner.lock().unwrap();
        assert_eq!(inner.order.len(), 1);
    }

    #[test]
    fn thread_safe() {
        let limiter = std::sync::Arc::new(FailureLimiter::new(1000, Duration::from_secs(60), 10));
        let t0 = Instant::now();
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let limiter = limiter.clone();
                std::thread::spawn(move || {
                    for _ in 0..100 {
                        limiter.record_failure(v4(1), t0);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let inner = limiter.inner.lock().unwrap();
        assert_eq!(inner.windows[&v4(1)].failures, 400);
    }
}

//! Connections before they upgrade: a bound on how many a listener holds.
//!
//! From its accept until it upgrades (or closes), a connection costs TLS and
//! HTTP buffers and a task while nobody is authenticated yet. Each listener
//! holds at most `limits.pending_connections` such connections, and at most
//! `limits.pending_connections_per_address` from one address group (an
//! IPv6 /64 counts as one address, as in the failure limiter). A peer in
//! `listen.trusted_proxies` is not capped per address: behind an ingress
//! every connection comes from it, and the client's own address is known
//! only from the request head. A connection over a cap is closed at once,
//! before any TLS work, and counted as
//! `upgrades_refused_total{reason="pending_connections"}` or
//! `{reason="address_connections"}`. Together with the handshake timeout
//! and `limits.upgrade_deadline_secs`, this bounds what unauthenticated
//! peers can hold.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::limiter::group;
use super::proxy::TrustedProxies;

/// The pending connections of one listener.
#[derive(Debug)]
pub struct Pending {
    slots: Arc<Semaphore>,
    per_address: Mutex<HashMap<IpAddr, usize>>,
    max_per_address: usize,
    trusted: Arc<TrustedProxies>,
}

/// A pending connection's place; dropping it (when the connection upgrades
/// or closes) frees it.
#[derive(Debug)]
pub struct Slot {
    _total: OwnedSemaphorePermit,
    address: Option<(Arc<Pending>, IpAddr)>,
}

impl Pending {
    /// Room for `total` pending connections, `per_address` from one address
    /// group, peers in `trusted` uncapped per address.
    pub fn new(total: usize, per_address: usize, trusted: Arc<TrustedProxies>) -> Arc<Self> {
        Arc::new(Self {
            slots: Arc::new(Semaphore::new(total)),
            per_address: Mutex::new(HashMap::new()),
            max_per_address: per_address,
            trusted,
        })
    }

    /// A place for a connection from `peer`, or the refusal reason.
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Result<Slot, &'static str> {
        let total = self
            .slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| "pending_connections")?;
        let peer = peer.to_canonical();
        if self.trusted.trusts(peer) {
            return Ok(Slot {
                _total: total,
                address: None,
            });
        }
        let key = group(peer);
        let mut counts = self
            .per_address
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let count = counts.entry(key).or_insert(0);
        if *count >= self.max_per_address {
            return Err("address_connections");
        }
        *count += 1;
        Ok(Slot {
            _total: total,
            address: Some((Arc::clone(self), key)),
        })
    }
}

/// A connection's [`Slot`], shared by the connection (which frees it when it
/// closes) and its request stack (which frees it when it answers an
/// upgrade). The answer is built before it is written, so a client that has
/// read its `101` is no longer counted as pending.
#[derive(Debug, Clone)]
pub struct HeldSlot(Arc<Mutex<Option<Slot>>>);

impl HeldSlot {
    /// Holds `slot` until [`release`](Self::release) or the last clone drops.
    pub fn new(slot: Slot) -> Self {
        Self(Arc::new(Mutex::new(Some(slot))))
    }

    /// Frees the place now (idempotent).
    pub fn release(&self) {
        let slot = self.0.lock().unwrap_or_else(PoisonError::into_inner).take();
        drop(slot);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let Some((pending, key)) = self.address.take() else {
            return;
        };
        let mut counts = pending
            .per_address
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = counts.get_mut(&key) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                counts.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn caps_per_address_and_in_total_and_frees_on_drop() {
        let trusted = Arc::new(TrustedProxies::new(&["10.0.0.1/32".parse().unwrap()]));
        let p = Pending::new(5, 2, trusted);
        let a1 = p.admit(ip("192.0.2.1")).unwrap();
        let _a2 = p.admit(ip("192.0.2.1")).unwrap();
        assert_eq!(p.admit(ip("192.0.2.1")).unwrap_err(), "address_connections");
        let _b1 = p.admit(ip("2001:db8::1")).unwrap();
        let _b2 = p.admit(ip("2001:db8::2")).unwrap();
        let one_64 = p.admit(ip("2001:db8::3")).unwrap_err();
        assert_eq!(one_64, "address_connections", "one /64 is one address");
        drop(a1);
        let _a3 = p.admit(ip("192.0.2.1")).unwrap();
        let _c = p.admit(ip("198.51.100.7")).unwrap();
        assert_eq!(p.admit(ip("10.0.0.1")).unwrap_err(), "pending_connections");
        assert_eq!(p.per_address.lock().unwrap().len(), 3);
    }

    #[test]
    fn a_held_slot_is_freed_by_release_or_by_its_last_clone() {
        let trusted = Arc::new(TrustedProxies::new(&[]));
        let p = Pending::new(5, 1, trusted);
        let held = HeldSlot::new(p.admit(ip("192.0.2.1")).unwrap());
        let stack = held.clone();
        assert!(p.admit(ip("192.0.2.1")).is_err(), "held while pending");
        stack.release();
        let again = HeldSlot::new(p.admit(ip("192.0.2.1")).unwrap());
        held.release();
        assert!(
            p.admit(ip("192.0.2.1")).is_err(),
            "a second release frees nothing else"
        );
        drop(again);
        drop((held, stack));
        assert!(p.admit(ip("192.0.2.1")).is_ok(), "the last clone frees it");
    }

    #[test]
    fn trusted_proxies_are_not_capped_per_address() {
        let trusted = Arc::new(TrustedProxies::new(&["10.0.0.1/32".parse().unwrap()]));
        let p = Pending::new(10, 1, trusted);
        let held: Vec<_> = (0..5).map(|_| p.admit(ip("10.0.0.1")).unwrap()).collect();
        assert_eq!(held.len(), 5);
        assert!(p.per_address.lock().unwrap().is_empty());
    }
}

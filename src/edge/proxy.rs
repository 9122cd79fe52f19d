//! The client address behind trusted proxies (contract §3.4).
//!
//! Behind an ingress every socket comes from the ingress, so counting
//! authentication failures by socket peer would let one attacker lock out
//! everyone. For a peer inside `listen.trusted_proxies`, the client address
//! is the rightmost `X-Forwarded-For` entry that is not itself a trusted
//! proxy: each trusted hop appends the address it saw, so entries to the
//! right of the first untrusted one were written by proxies we trust, and
//! entries to its left were written by the client (and are ignored). A peer
//! outside the list is the client, whatever headers it sends.

use std::net::IpAddr;

use http::HeaderMap;

pub use crate::net::{Cidr, CidrError};

/// The proxies whose `X-Forwarded-For` the edge believes.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies(Vec<Cidr>);

impl TrustedProxies {
    /// Trusts exactly the peers inside `nets` (none when empty).
    pub fn new(nets: &[Cidr]) -> Self {
        Self(nets.to_vec())
    }

    /// Whether `ip` is one of the trusted proxies.
    pub fn trusts(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|n| n.contains(ip))
    }

    /// The client address of a request from socket peer `peer` (see the
    /// module doc). When every forwarded entry is trusted, the leftmost is
    /// the client; an entry that does not parse ends the walk at the last
    /// trusted hop, so a malformed header can never name an arbitrary
    /// address.
    pub fn client_addr(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let peer = peer.to_canonical();
        if !self.trusts(peer) {
            return peer;
        }
        let mut client = peer;
        let values: Vec<&str> = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        for entry in values.iter().rev().flat_map(|v| v.rsplit(',')) {
            let Some(ip) = parse_entry(entry) else {
                return client;
            };
            client = ip;
            if !self.trusts(ip) {
                return ip;
            }
        }
        client
    }
}

/// One `X-Forwarded-For` entry: an address, optionally bracketed or with a
/// port (`[2001:db8::1]:443`, `192.0.2.1:443`).
fn parse_entry(entry: &str) -> Option<IpAddr> {
    let entry = entry.trim();
    if let Ok(ip) = entry.parse::<IpAddr>() {
        return Some(ip.to_canonical());
    }
    if let Ok(sock) = entry.parse::<std::net::SocketAddr>() {
        return Some(sock.ip().to_canonical());
    }
    entry
        .strip_prefix('[')
        .and_then(|e| e.strip_suffix(']'))
        .and_then(|e| e.parse::<IpAddr>().ok())
        .map(|ip| ip.to_canonical())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn xff(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append("x-forwarded-for", v.parse().unwrap());
        }
        h
    }

    #[test]
    fn cidrs_parse_and_contain() {
        let net: Cidr = "10.1.0.0/16".parse().unwrap();
        assert!(net.contains(ip("10.1.200.3")));
        assert!(!net.contains(ip("10.2.0.1")));
        assert!(net.contains(ip("::ffff:10.1.0.9")), "mapped v4");
        let one: Cidr = "192.0.2.7".parse().unwrap();
        assert!(one.contains(ip("192.0.2.7")) && !one.contains(ip("192.0.2.8")));
        let v6: Cidr = "fd00::/8".parse().unwrap();
        assert!(v6.contains(ip("fd12::1")) && !v6.contains(ip("fe80::1")));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("203.0.113.9")) && !all.contains(ip("::1")));
        assert_eq!(
            "10.0.0.0/33".parse::<Cidr>(),
            Err(CidrError::Prefix("10.0.0.0/33".into()))
        );
        assert!(matches!(
            "ten/8".parse::<Cidr>(),
            Err(CidrError::Address(_))
        ));
    }

    #[test]
    fn rightmost_untrusted_entry_behind_a_trusted_peer() {
        let t = TrustedProxies::new(&["10.0.0.0/8".parse().unwrap()]);
        let peer = ip("10.0.0.2");
        let h = xff(&["6.6.6.6, 198.51.100.4", "10.0.0.9"]);
        assert_eq!(t.client_addr(peer, &h), ip("198.51.100.4"));
        assert_eq!(t.client_addr(peer, &HeaderMap::new()), peer, "no header");
        let h = xff(&["10.0.0.5, 10.0.0.9"]);
        assert_eq!(t.client_addr(peer, &h), ip("10.0.0.5"), "all trusted");
        let h = xff(&["203.0.113.1, garbage, 10.0.0.9"]);
        assert_eq!(t.client_addr(peer, &h), ip("10.0.0.9"), "stops at garbage");
        let h = xff(&["[2001:db8::1]:443"]);
        assert_eq!(t.client_addr(peer, &h), ip("2001:db8::1"));
    }

    #[test]
    fn untrusted_peer_is_the_client() {
        let t = TrustedProxies::new(&["10.0.0.0/8".parse().unwrap()]);
        let h = xff(&["198.51.100.4"]);
        assert_eq!(t.client_addr(ip("192.0.2.1"), &h), ip("192.0.2.1"));
        let none = TrustedProxies::default();
        assert_eq!(none.client_addr(ip("10.0.0.2"), &h), ip("10.0.0.2"));
    }
}

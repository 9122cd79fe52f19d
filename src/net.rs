//! Network value types the configuration reads and the edge uses: IP
//! networks in CIDR notation (`listen.trusted_proxies`). A leaf.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::Deserialize;

/// An IP network in CIDR notation (`10.0.0.0/8`, `fd00::/8`); a bare
/// address is a network of one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    prefix: u8,
}

/// Why a `trusted_proxies` entry is not a CIDR.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CidrError {
    /// The address part does not parse.
    #[error("{0:?} is not an IP address or CIDR")]
    Address(String),
    /// The prefix is not a number up to 32 (IPv4) or 128 (IPv6).
    #[error("{0:?}: the prefix length must be 0-32 for IPv4, 0-128 for IPv6")]
    Prefix(String),
}

impl Cidr {
    /// Whether `ip` lies in this network (an IPv4-mapped IPv6 address
    /// counts as its IPv4 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.net, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => prefix_eq(
                u128::from(net.to_bits()),
                u128::from(ip.to_bits()),
                32,
                self.prefix,
            ),
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                prefix_eq(net.to_bits(), ip.to_bits(), 128, self.prefix)
            }
            _ => false,
        }
    }
}

/// Whether the top `prefix` bits of the `width`-bit values `a` and `b` agree.
fn prefix_eq(a: u128, b: u128, width: u8, prefix: u8) -> bool {
    let shift = u32::from(width.saturating_sub(prefix));
    a.checked_shr(shift).unwrap_or(0) == b.checked_shr(shift).unwrap_or(0)
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let net = addr
            .trim()
            .parse::<IpAddr>()
            .map_err(|_| CidrError::Address(s.into()))?
            .to_canonical();
        let width = if net.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => width,
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= width)
                .ok_or_else(|| CidrError::Prefix(s.into()))?,
        };
        Ok(Self { net, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.net, self.prefix)
    }
}

impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

//! Who is who (contract §2 "Upstream client identity", §3.3): the principal
//! a token names, and the relay's keyed derivations over it — the upstream
//! client ids its links use, and MACs that bind opaque values (cursors,
//! jitter) to the relay's secret. A leaf: it knows no other module.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// Who a session belongs to: the token's issuer and subject. Two issuers'
/// equal `sub` values are different principals (review M13).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PrincipalKey {
    /// `iss`
    pub issuer: String,
    /// `sub`
    pub subject: String,
}

type HmacSha256 = Hmac<Sha256>;

/// The relay secret as an HMAC key, and everything derived from it.
#[derive(Clone)]
pub struct Keys {
    mac: HmacSha256,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keys(..)")
    }
}

impl Keys {
    /// Keys from the relay secret.
    pub fn new(secret: &[u8]) -> Result<Self, String> {
        let mac = <HmacSha256 as KeyInit>::new_from_slice(secret)
            .map_err(|e| format!("relay secret unusable as HMAC key: {e}"))?;
        Ok(Self { mac })
    }

    /// HMAC of the concatenation of `parts`, base64url without padding.
    pub fn mac(&self, parts: &[&[u8]]) -> String {
        B64.encode(self.mac_bytes(parts))
    }

    /// HMAC of the concatenation of `parts`, raw.
    pub fn mac_bytes(&self, parts: &[&[u8]]) -> [u8; 32] {
        let mut m = self.mac.clone();
        for p in parts {
            m.update(p);
        }
        m.finalize().into_bytes().into()
    }

    fn principal_mac(&self, p: &PrincipalKey, client_id: Option<&str>) -> String {
        let len = (p.issuer.len() as u32).to_be_bytes();
        let mut parts: Vec<&[u8]> = vec![&len, p.issuer.as_bytes(), p.subject.as_bytes()];
        if let Some(c) = client_id {
            parts.push(&[0]);
            parts.push(c.as_bytes());
        }
        self.mac(&parts)
    }

    /// The part of every upstream id of principal `p`: `r1.` +
    /// b64url(HMAC(k, P))[..11] + `.` (a terminal claimed by a client id
    /// with this prefix belongs to one of `p`'s clients).
    pub fn upstream_prefix(&self, p: &PrincipalKey) -> String {
        let who = self.principal_mac(p, None);
        format!("r1.{}.", who.get(..11).unwrap_or(&who))
    }

    /// The upstream client id of session (P, c) (contract §2, B2):
    /// `r1.` + b64url(HMAC(k, P))[..11] + `.` + b64url(HMAC(k, P‖0x00‖c))[..16],
    /// where P is the issuer's length (4 bytes, big endian), the issuer and the subject.
    pub fn upstream_id(&self, p: &PrincipalKey, client_id: &str) -> String {
        let client = self.principal_mac(p, Some(client_id));
        format!(
            "{}{}",
            self.upstream_prefix(p),
            client.get(..16).unwrap_or(&client)
        )
    }
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    jiff::Timestamp::now().as_second().max(0) as u64
}

/// Fills `buf` from the operating system's secure random source.
pub fn random_fill(buf: &mut [u8]) -> Result<(), rustls::Error> {
    rustls::crypto::ring::default_provider()
        .secure_random
        .fill(buf)
        .map_err(|_| rustls::Error::General("no secure random source".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(issuer: &str, subject: &str) -> PrincipalKey {
        PrincipalKey {
            issuer: issuer.into(),
            subject: subject.into(),
        }
    }

    #[test]
    fn upstream_ids_separate_principals_and_share_their_prefix() {
        let k = Keys::new(&[7; 32]).unwrap();
        let a = k.upstream_id(&p("i", "alice"), "c1");
        assert!(a.starts_with(&k.upstream_prefix(&p("i", "alice"))));
        assert_eq!(a.len(), "r1.".len() + 11 + 1 + 16);
        assert_ne!(a, k.upstream_id(&p("i", "bob"), "c1"));
        // The issuer's length is part of P: ("ab","c") and ("a","bc") differ.
        assert_ne!(
            k.upstream_prefix(&p("ab", "c")),
            k.upstream_prefix(&p("a", "bc"))
        );
        assert_eq!(a, k.upstream_id(&p("i", "alice"), "c1"));
    }
}

//! The AHP protocol versions the relay speaks, on both sides (contract
//! §4.1): `1.0.x` and `0.9.x` by the specification's caret rules (same
//! major; for `0.x` the same minor), and exactly `0.10.0` — VS Code 1.141's
//! version, which VS Code declares to share the wire contract of `0.9` and
//! `1.0` (its host answers `['1.0.0', '0.10.0', '0.9.0']` from one code
//! path). The rewrite table covers the fields of all three, so a client of
//! any of them is relayed to a host of any of them.

/// What the relay offers a host: the version its client negotiated first,
/// then the rest of the family, so a host that speaks only one of them
/// (a VS Code 1.141 host accepts only `^0.10.0`, a 0.9-era host `^0.9.0`)
/// can still serve that client.
pub const FAMILY: [&str; 3] = ["1.0.0", "0.10.0", "0.9.0"];

/// `version` as (major, minor, patch) if the relay speaks it.
pub fn speaks(version: &str) -> Option<(u64, u64, u64)> {
    let mut parts = version.split('.');
    let mut next = || -> Option<u64> {
        let p = parts.next()?;
        let canonical = !p.is_empty() && (p == "0" || !p.starts_with('0'));
        (canonical && p.bytes().all(|b| b.is_ascii_digit()))
            .then(|| p.parse().ok())
            .flatten()
    };
    let v = (next()?, next()?, next()?);
    if parts.next().is_some() {
        return None;
    }
    matches!(v, (1, 0, _) | (0, 9, _) | (0, 10, 0)).then_some(v)
}

/// The `protocolVersions` a link offers its host for a client that
/// negotiated `client`: that version first, then the rest of [`FAMILY`].
pub fn offer(client: &str) -> Vec<&str> {
    let mut offer = vec![client];
    offer.extend(FAMILY.iter().copied().filter(|v| *v != client));
    offer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn speaks_exactly_the_family() {
        for v in ["1.0.0", "1.0.7", "0.9.0", "0.9.3", "0.10.0"] {
            assert!(speaks(v).is_some(), "{v}");
        }
        for v in [
            "1.1.0",
            "2.0.0",
            "0.8.0",
            "0.10.1",
            "0.11.0",
            "01.0.0",
            "1.0",
            "1.0.0.0",
            "1.0.0-beta",
        ] {
            assert!(speaks(v).is_none(), "{v}");
        }
        assert!(speaks("1.0.0") > speaks("0.10.0") && speaks("0.10.0") > speaks("0.9.9"));
    }

    #[test]
    fn a_link_offers_its_client_version_first() {
        assert_eq!(offer("0.9.2"), ["0.9.2", "1.0.0", "0.10.0", "0.9.0"]);
        assert_eq!(offer("1.0.0"), ["1.0.0", "0.10.0", "0.9.0"]);
    }
}

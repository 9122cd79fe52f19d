//! One client-facing namespace over many hosts (contract §4.2).
//!
//! A host's channel URI reaches clients either *verbatim* — when a client
//! chose it through the relay and the URI store records it for that host —
//! or *qualified by computation*: the host id is put in front of the first
//! path segment, `ahp-terminal:/7` from `gpu1` becoming `ahp-terminal:/gpu1~7`
//! (scheme kept, so reducers chosen by scheme still work; derived URIs such as
//! `ahp-session:/x/annotations` still derive). Client-chosen ids may not
//! contain `~`, so the two forms never overlap and no table is needed for
//! qualified names: they survive relay restarts by construction.

use std::fmt;

/// Schemes whose URIs name host channels and are qualified per host.
pub const HOST_SCHEMES: &[&str] = &[
    "ahp-session",
    "ahp-chat",
    "ahp-terminal",
    "ahp-changeset",
    "ahp-canvas",
    "ahp-resource-watch",
    "ahp-automation",
    "ahp-automation-run",
];

/// The separator between host id and host-local id in a qualified URI.
pub const QUALIFIER: char = '~';

/// A host URI split into its parts: `<scheme>:/<head><tail>`, where `head`
/// is the first path segment and `tail` the rest (empty or starting with `/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UriParts<'a> {
    /// Scheme without the colon, e.g. `ahp-chat`.
    pub scheme: &'a str,
    /// First path segment (the id).
    pub head: &'a str,
    /// Everything after the first segment.
    pub tail: &'a str,
}

impl<'a> UriParts<'a> {
    /// Splits `uri` if it is `<host scheme>:/<segment>[/...]`.
    pub fn parse(uri: &'a str) -> Option<Self> {
        let (scheme, rest) = uri.split_once(":/")?;
        if !HOST_SCHEMES.contains(&scheme) || rest.starts_with('/') {
            return None;
        }
        let (head, tail) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        (!head.is_empty()).then_some(Self { scheme, head, tail })
    }

    /// The URI naming only the first segment (`<scheme>:/<head>`): the key
    /// under which the URI store records client-chosen URIs.
    pub fn base(&self) -> String {
        format!("{}:/{}", self.scheme, self.head)
    }
}

/// Where a client-facing host URI points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientName<'a> {
    /// `<scheme>:/<host>~<id>…`: host-assigned name, host given inline.
    Qualified {
        /// Host id.
        host: &'a str,
        /// The URI as that host knows it.
        host_uri: String,
    },
    /// `<scheme>:/<id>…` without qualifier: must be a URI-store entry.
    Verbatim {
        /// The store key (`<scheme>:/<id>`).
        key: String,
    },
}

/// Errors reading a client-facing URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotAHostUri;

impl fmt::Display for NotAHostUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not a host channel URI")
    }
}

/// Reads a client-facing URI: qualified (host inline) or verbatim (store).
pub fn read_client_uri(uri: &str) -> Result<ClientName<'_>, NotAHostUri> {
    let parts = UriParts::parse(uri).ok_or(NotAHostUri)?;
    match parts.head.split_once(QUALIFIER) {
        Some((host, id)) if !host.is_empty() && !id.is_empty() => Ok(ClientName::Qualified {
            host,
            host_uri: format!("{}:/{id}{}", parts.scheme, parts.tail),
        }),
        Some(_) => Err(NotAHostUri),
        None => Ok(ClientName::Verbatim { key: parts.base() }),
    }
}

/// The client-facing form of host `host`'s URI. `is_store_entry(base)` tells
/// whether the URI's base is a client-chosen URI the store records for this
/// host (then the URI is kept verbatim). Non-host URIs pass unchanged.
pub fn qualify(host: &str, uri: &str, is_store_entry: impl Fn(&str) -> bool) -> String {
    let Some(parts) = UriParts::parse(uri) else {
        return uri.to_string();
    };
    if is_store_entry(&parts.base()) {
        return uri.to_string();
    }
    format!(
        "{}:/{host}{QUALIFIER}{}{}",
        parts.scheme, parts.head, parts.tail
    )
}

/// Whether `id` is a valid host id: `[a-z0-9-]{1,32}` and not `localhost`.
pub fn valid_host_id(id: &str) -> bool {
    (1..=32).contains(&id.len())
        && id != "localhost"
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// A provider id as clients see it: `<provider>@<host>`.
pub fn qualify_provider(host: &str, provider: &str) -> String {
    format!("{provider}@{host}")
}

/// Splits a client provider id at its last `@` into (provider, host).
pub fn read_provider(client: &str) -> Option<(&str, &str)> {
    let (p, h) = client.rsplit_once('@')?;
    (!p.is_empty() && valid_host_id(h)).then_some((p, h))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none(_: &str) -> bool {
        false
    }

    #[test]
    fn qualifies_host_assigned_uris_and_keeps_derivation() {
        assert_eq!(
            qualify("gpu1", "ahp-terminal:/7", none),
            "ahp-terminal:/gpu1~7"
        );
        assert_eq!(
            qualify("a", "ahp-session:/s1/annotations", none),
            "ahp-session:/a~s1/annotations"
        );
        assert_eq!(qualify("a", "ahp-root://", none), "ahp-root://");
        assert_eq!(qualify("a", "file:///x", none), "file:///x");
        assert_eq!(qualify("a", "https://x/y", none), "https://x/y");
    }

    #[test]
    fn store_entries_stay_verbatim() {
        let store = |base: &str| base == "ahp-session:/mine";
        assert_eq!(
            qualify("a", "ahp-session:/mine", store),
            "ahp-session:/mine"
        );
        assert_eq!(
            qualify("a", "ahp-session:/mine/annotations", store),
            "ahp-session:/mine/annotations"
        );
        assert_eq!(qualify("a", "ahp-chat:/mine", store), "ahp-chat:/a~mine");
    }

    #[test]
    fn reads_back_what_it_wrote() {
        for (host, uri) in [
            ("gpu1", "ahp-terminal:/7"),
            ("b", "ahp-session:/s/annotations"),
        ] {
            let q = qualify(host, uri, none);
            assert_eq!(
                read_client_uri(&q),
                Ok(ClientName::Qualified {
                    host,
                    host_uri: uri.to_string()
                })
            );
        }
        assert_eq!(
            read_client_uri("ahp-chat:/mine"),
            Ok(ClientName::Verbatim {
                key: "ahp-chat:/mine".into()
            })
        );
        assert_eq!(read_client_uri("ahp-chat:/~x"), Err(NotAHostUri));
        assert_eq!(read_client_uri("ahp-chat:/h~"), Err(NotAHostUri));
        assert_eq!(read_client_uri("ahp-root://"), Err(NotAHostUri));
        assert_eq!(read_client_uri("ahp-chat://x"), Err(NotAHostUri));
    }

    #[test]
    fn host_ids_and_providers() {
        assert!(valid_host_id("gpu-1"));
        assert!(!valid_host_id("localhost"));
        assert!(!valid_host_id("GPU"));
        assert!(!valid_host_id(""));
        assert_eq!(qualify_provider("b", "copilot"), "copilot@b");
        assert_eq!(read_provider("co@pilot@b"), Some(("co@pilot", "b")));
        assert_eq!(read_provider("copilot"), None);
    }
}

//! Which web pages may use the listeners: the `Host` and `Origin` checks
//! on WebSocket upgrades and the status page of both listeners.
//!
//! - **Origin.** A request without `Origin` is not from a browser's script
//!   (browsers always send it on a WebSocket upgrade and on a cross-origin
//!   fetch) and passes. With one, its `scheme://host[:port]` must name the
//!   request's own `Host` (same origin) or be listed in
//!   `listen.allowed_origins`; anything else (another site, `null`) gets
//!   403, so a page on another site cannot open the status feed or an AHP
//!   socket in an operator's browser.
//! - **Host.** On the admin listener the `Host` must be an IP literal,
//!   `localhost`, or a name in `listen.allowed_hosts`: DNS rebinding always
//!   comes with a host name of the attacker's, so a page that rebinds its
//!   name to `127.0.0.1` is refused even though it is then "same origin".
//!   Probes and scrapers (`/healthz`, `/readyz`, `/metrics`) are not
//!   checked. On the client listener the `Host` is checked only when
//!   `listen.allowed_hosts` is given (its public name is otherwise unknown,
//!   and every path there needs a token; a rebound name fails TLS anyway).
//!
//! Refusals are 403 counted as `upgrades_refused_total{reason="origin"}` or
//! `{reason="host"}`.

use std::net::IpAddr;

use http::{HeaderMap, StatusCode, header};

use super::layers::{Refusal, Resp, refused};
use crate::config::ListenConfig;

/// The allowed origins and host names of one relay.
#[derive(Debug, Clone, Default)]
pub struct Origins {
    origins: Vec<String>,
    hosts: Vec<String>,
}

/// Which listener a request came on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// The client listener (TLS, every path authenticated).
    Client,
    /// The admin listener (plain HTTP).
    Admin,
}

impl Origins {
    /// The lists of `[listen]`, compared without case.
    pub fn new(listen: &ListenConfig) -> Self {
        let lower = |v: &[String]| {
            v.iter()
                .map(|s| s.trim_end_matches('/').to_ascii_lowercase())
                .collect()
        };
        Self {
            origins: lower(&listen.allowed_origins),
            hosts: lower(&listen.allowed_hosts),
        }
    }

    /// `None` if `headers` pass on `listener`, else the 403 to answer.
    pub fn refusal(&self, headers: &HeaderMap, listener: Listener) -> Option<Resp> {
        let host = headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .map(str::to_ascii_lowercase);
        if !self.host_allowed(host.as_deref(), listener) {
            return Some(refused(
                StatusCode::FORBIDDEN,
                "this Host is not served here (listen.allowed_hosts)\n",
                Refusal::Upgrade("host"),
                None,
            ));
        }
        // No `Origin`: not a browser's script, nothing to check.
        let origin = headers.get(header::ORIGIN)?;
        let origin = origin.to_str().unwrap_or("null").to_ascii_lowercase();
        let origin = origin.trim_end_matches('/');
        if self.origins.iter().any(|o| o == origin) || same_origin(origin, host.as_deref()) {
            return None;
        }
        Some(refused(
            StatusCode::FORBIDDEN,
            "cross-origin requests are refused (listen.allowed_origins)\n",
            Refusal::Upgrade("origin"),
            None,
        ))
    }

    fn host_allowed(&self, host: Option<&str>, listener: Listener) -> bool {
        if listener == Listener::Client && self.hosts.is_empty() {
            return true;
        }
        let Some(host) = host else {
            return false;
        };
        let name = host_name(host);
        if self.hosts.iter().any(|h| h == host || h == name) {
            return true;
        }
        listener == Listener::Admin
            && (name == "localhost"
                || name
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .parse::<IpAddr>()
                    .is_ok())
    }
}

/// The name part of a `Host` value (`[::1]:9090` → `[::1]`).
fn host_name(host: &str) -> &str {
    if host.starts_with('[') {
        return host
            .split_once(']')
            .map_or(host, |(n, _)| &host[..=n.len()]);
    }
    host.rsplit_once(':').map_or(host, |(n, _)| n)
}

/// Whether `origin` (`scheme://authority`) names the same authority as the
/// request's `host`, default ports aside.
fn same_origin(origin: &str, host: Option<&str>) -> bool {
    let Some(host) = host else {
        return false;
    };
    let Some((scheme, authority)) = origin.split_once("://") else {
        return false;
    };
    let default = match scheme {
        "http" | "ws" => ":80",
        "https" | "wss" => ":443",
        _ => return false,
    };
    let strip = |a: &'_ str| {
        a.strip_suffix(default)
            .map(str::to_owned)
            .unwrap_or_else(|| a.to_owned())
    };
    strip(authority) == strip(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    fn origins(allowed_origins: &[&str], allowed_hosts: &[&str]) -> Origins {
        Origins {
            origins: allowed_origins.iter().map(|s| s.to_string()).collect(),
            hosts: allowed_hosts.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn admin_host_must_be_an_address_localhost_or_listed() {
        let o = origins(&[], &["ops.internal"]);
        for host in [
            "127.0.0.1:9090",
            "localhost:19090",
            "[::1]:9090",
            "10.1.2.3",
            "ops.internal:9090",
        ] {
            assert!(
                o.refusal(&headers(&[("host", host)]), Listener::Admin)
                    .is_none(),
                "{host}"
            );
        }
        for host in [
            "evil.example:9090",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
        ] {
            assert!(
                o.refusal(&headers(&[("host", host)]), Listener::Admin)
                    .is_some(),
                "{host}"
            );
        }
        assert!(
            o.refusal(&HeaderMap::new(), Listener::Admin).is_some(),
            "no Host"
        );
    }

    #[test]
    fn client_host_is_checked_only_against_a_list() {
        let any = origins(&[], &[]);
        assert!(
            any.refusal(&headers(&[("host", "relay.example.com")]), Listener::Client)
                .is_none()
        );
        let listed = origins(&[], &["relay.example.com"]);
        assert!(
            listed
                .refusal(&headers(&[("host", "relay.example.com")]), Listener::Client)
                .is_none()
        );
        assert!(
            listed
                .refusal(&headers(&[("host", "other.example.com")]), Listener::Client)
                .is_some()
        );
    }

    #[test]
    fn origin_is_same_origin_or_listed() {
        let o = origins(&["https://ops.example.com"], &[]);
        let pass = |host: &str, origin: &str| {
            o.refusal(
                &headers(&[("host", host), ("origin", origin)]),
                Listener::Admin,
            )
            .is_none()
        };
        assert!(pass("127.0.0.1:9090", "http://127.0.0.1:9090"));
        assert!(pass("localhost", "http://localhost:80"));
        assert!(pass("127.0.0.1:9090", "https://ops.example.com/"));
        assert!(!pass("127.0.0.1:9090", "https://evil.example"));
        assert!(!pass("127.0.0.1:9090", "http://127.0.0.1:9091"));
        assert!(!pass("127.0.0.1:9090", "null"));
        assert!(!pass("127.0.0.1:9090", "file://127.0.0.1:9090"));
    }
}

//! Principals, session keys and the client names of host states: an
//! implementation of contract §4.2–4.3 independent of the relay's (host
//! URIs qualified `<host>~<id>` unless client-chosen, providers
//! `<p>.<host>`), so comparing a client's state with a host's proves the
//! relay's rewrite.

use ahp_relay::devkit::DEV_ISSUER;
use ahp_relay::session::{PrincipalKey, SessionKey};
use ahp_relay::simhost::SimHost;
use serde_json::{Value, json};

/// The principal of dev-token subject `sub`.
pub fn principal(sub: &str) -> PrincipalKey {
    PrincipalKey {
        issuer: DEV_ISSUER.into(),
        subject: sub.into(),
    }
}

/// The relay's key of the session of (`sub`, `client_id`).
pub fn session_key(sub: &str, client_id: &str) -> SessionKey {
    SessionKey {
        principal: principal(sub),
        client_id: client_id.into(),
    }
}

/// A host URI in client names: host-assigned ids are qualified with
/// `<host>~`, client-chosen ones (`verbatim`, by `<scheme>:/<id>`) kept.
pub fn client_uri(host: &str, s: &str, verbatim: &[&str]) -> String {
    for scheme in ["ahp-session:/", "ahp-chat:/", "ahp-terminal:/"] {
        let Some(rest) = s.strip_prefix(scheme) else {
            continue;
        };
        if rest.is_empty() || rest.starts_with('/') {
            return s.to_string();
        }
        let head = rest.split('/').next().unwrap_or(rest);
        if verbatim.contains(&format!("{scheme}{head}").as_str()) {
            return s.to_string();
        }
        return format!("{scheme}{host}~{rest}");
    }
    s.to_string()
}

/// A host state (JSON) with every name translated to client names.
pub fn client_names(host: &str, v: &Value, verbatim: &[&str]) -> Value {
    match v {
        Value::String(s) => Value::String(client_uri(host, s, verbatim)),
        Value::Array(a) => {
            Value::Array(a.iter().map(|x| client_names(host, x, verbatim)).collect())
        }
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, x)| match (k.as_str(), x) {
                    ("provider", Value::String(p)) => (
                        k.clone(),
                        json!(ahp_relay::names::qualify::qualify_provider(host, p)),
                    ),
                    _ => (k.clone(), client_names(host, x, verbatim)),
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The host's current state of `host_uri`, in client names.
pub fn host_state(h: &SimHost, host_uri: &str, verbatim: &[&str]) -> Value {
    let state = h
        .channel_state(host_uri)
        .unwrap_or_else(|| panic!("host has {host_uri}"));
    client_names(&h.config().name, &state, verbatim)
}

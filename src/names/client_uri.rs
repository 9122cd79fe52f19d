//! The grammar of channel URIs that a client chooses itself (contract §4.2).
//!
//! `createSession.channel`, `createChat.chat` and `createTerminal.channel` name the new channel.
//! Through the relay such a URI keeps its exact form, so it must never look like a qualified URI
//! (`<scheme>:/<host>~<id>`), never contain a path separator, an escape or anything a URI library
//! could normalise into another string. The only accepted form is `<scheme>:/<id>` with `<scheme>`
//! one of `ahp-session`, `ahp-chat`, `ahp-terminal`, `agenthost-terminal` (VS Code's workbench
//! terminals) and `<id>` matching `[A-Za-z0-9._-]{1,128}`,
//! compared byte for byte (no case folding, no percent-decoding). A session may also be named in
//! VS Code's shape (its client computes `AgentSession.uri(provider, uuid)` from the provider id it
//! was shown): the client writes `<provider>.<host>:/<id>`, and the host form checked here is
//! `<provider>:/<id>`, with `<provider>` a lowercase scheme `[a-z][a-z0-9.+-]{0,31}` that names no
//! other kind of object: not `ahp-*`, `file`, a terminal or a scheme that is never a host name
//! (`http`, …) — [`validate_client_session_uri`], after `route::router::check_client_session_uri`
//! has read the host out of the scheme.

use thiserror::Error;

/// The schemes a client may use for a URI it chooses.
const SCHEMES: [&str; 4] = [
    "ahp-session",
    "ahp-chat",
    "ahp-terminal",
    "agenthost-terminal",
];

/// The longest accepted id, in bytes (all accepted bytes are ASCII, so also in characters).
pub const MAX_ID_LEN: usize = 128;

/// A client-chosen URI that passed [`validate_client_uri`]: both parts borrow from the input,
/// and `format!("{scheme}:/{id}")` reproduces it exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientUri<'a> {
    /// One of `ahp-session`, `ahp-chat`, `ahp-terminal`, `agenthost-terminal`.
    pub scheme: &'a str,
    /// 1 to 128 bytes, each in `[A-Za-z0-9._-]`.
    pub id: &'a str,
}

/// Why a client-chosen URI was refused. Messages never repeat the input, so they are safe to
/// send back to the client and to log.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ClientUriError {
    /// The text before the first `:` is not an accepted scheme (or there is no `:`).
    #[error("URI scheme must be ahp-session, ahp-chat, ahp-terminal or agenthost-terminal")]
    UnknownScheme,
    /// The scheme is not followed by `:/`.
    #[error("URI must have the form <scheme>:/<id>")]
    MissingSlash,
    /// Nothing follows `<scheme>:/`.
    #[error("URI id is empty")]
    EmptyId,
    /// The id is longer than [`MAX_ID_LEN`] bytes.
    #[error("URI id is {len} bytes long, at most {MAX_ID_LEN} are allowed")]
    IdTooLong {
        /// The id's length in bytes.
        len: usize,
    },
    /// The id contains a byte outside `[A-Za-z0-9._-]`.
    #[error("URI id byte {offset} is not one of A-Z a-z 0-9 . _ -")]
    InvalidIdByte {
        /// Offset of the first refused byte within the id.
        offset: usize,
    },
}

/// Accepts exactly `<scheme>:/<id>` as described in the module doc and returns its two parts;
/// anything else is refused with the first problem found (scheme, then `:/`, then the id).
pub fn validate_client_uri(uri: &str) -> Result<ClientUri<'_>, ClientUriError> {
    let (scheme, rest) = uri.split_once(':').ok_or(ClientUriError::UnknownScheme)?;
    if !SCHEMES.contains(&scheme) {
        return Err(ClientUriError::UnknownScheme);
    }
    let id = rest.strip_prefix('/').ok_or(ClientUriError::MissingSlash)?;
    if id.is_empty() {
        return Err(ClientUriError::EmptyId);
    }
    if id.len() > MAX_ID_LEN {
        return Err(ClientUriError::IdTooLong { len: id.len() });
    }
    let allowed = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-');
    if let Some(offset) = id.bytes().position(|b| !allowed(&b)) {
        return Err(ClientUriError::InvalidIdByte { offset });
    }
    Ok(ClientUri { scheme, id })
}

/// The longest accepted provider scheme of a client-chosen session URI.
pub const MAX_PROVIDER_SCHEME_LEN: usize = 32;

/// Accepts a client-chosen session URI: `ahp-session:/<id>` as [`validate_client_uri`] does, or
/// the host form `<provider>:/<id>` of VS Code's `<provider>.<host>:/<id>` (see the module doc)
/// with the same id grammar: the shape VS Code's own host gives its sessions.
pub fn validate_client_session_uri(uri: &str) -> Result<ClientUri<'_>, ClientUriError> {
    let (scheme, rest) = uri.split_once(':').ok_or(ClientUriError::UnknownScheme)?;
    if scheme == "ahp-session" || !provider_scheme(scheme) {
        return validate_client_uri(uri).and_then(|u| {
            (u.scheme == "ahp-session")
                .then_some(u)
                .ok_or(ClientUriError::UnknownScheme)
        });
    }
    let id = validate_client_uri(&format!("ahp-session:{rest}"))?
        .id
        .len();
    Ok(ClientUri {
        scheme,
        id: &rest[rest.len() - id..],
    })
}

/// Whether `scheme` can name a provider's sessions: lowercase, at most
/// [`MAX_PROVIDER_SCHEME_LEN`] bytes, and no scheme that names something else.
fn provider_scheme(scheme: &str) -> bool {
    let mut bytes = scheme.bytes();
    let first = bytes.next().is_some_and(|b| b.is_ascii_lowercase());
    first
        && scheme.len() <= MAX_PROVIDER_SCHEME_LEN
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+.-".contains(&b))
        && !scheme.starts_with("ahp-")
        && scheme != "file"
        && !super::qualify::PASS_SCHEMES.contains(&scheme)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(uri: &str) -> (&str, &str) {
        let parsed = validate_client_uri(uri).expect("should be accepted");
        assert_eq!(format!("{}:/{}", parsed.scheme, parsed.id), uri);
        (parsed.scheme, parsed.id)
    }

    fn err(uri: &str) -> ClientUriError {
        validate_client_uri(uri).expect_err("should be refused")
    }

    #[test]
    fn accepts_each_scheme() {
        assert_eq!(ok("ahp-session:/abc"), ("ahp-session", "abc"));
        assert_eq!(ok("ahp-chat:/abc"), ("ahp-chat", "abc"));
        assert_eq!(ok("ahp-terminal:/abc"), ("ahp-terminal", "abc"));
    }

    #[test]
    fn accepts_every_allowed_byte() {
        ok("ahp-session:/ABCXYZabcxyz0189._-");
        ok("ahp-session:/0b5e3c1a-4f2d-4e8b-9c7a-1d2e3f4a5b6c");
        ok("ahp-chat:/x");
        ok("ahp-chat:/.");
        ok("ahp-chat:/-");
        ok("ahp-chat:/_");
    }

    #[test]
    fn length_limits() {
        let max = format!("ahp-session:/{}", "a".repeat(MAX_ID_LEN));
        ok(&max);
        let over = format!("ahp-session:/{}", "a".repeat(MAX_ID_LEN + 1));
        assert_eq!(err(&over), ClientUriError::IdTooLong { len: 129 });
        assert_eq!(err("ahp-session:/"), ClientUriError::EmptyId);
    }

    #[test]
    fn refuses_unknown_or_malformed_schemes() {
        for uri in [
            "",
            "ahp-session",
            "abc",
            ":/abc",
            "ahp-root:/abc",
            "ahp-root://",
            "AHP-SESSION:/abc",
            "Ahp-Chat:/abc",
            " ahp-session:/abc",
            "ahp-sessions:/abc",
            "file:/abc",
            "/abc",
        ] {
            assert_eq!(err(uri), ClientUriError::UnknownScheme, "{uri:?}");
        }
    }

    #[test]
    fn refuses_missing_slash() {
        assert_eq!(err("ahp-session:"), ClientUriError::MissingSlash);
        assert_eq!(err("ahp-session:abc"), ClientUriError::MissingSlash);
        assert_eq!(err("ahp-chat:\\abc"), ClientUriError::MissingSlash);
    }

    #[test]
    fn refuses_bad_id_bytes() {
        for (uri, offset) in [
            ("ahp-session:/gpu1~7", 4),
            ("ahp-session://host/abc", 0),
            ("ahp-session:/a/b", 1),
            ("ahp-session:/a%7Eb", 1),
            ("ahp-session:/a b", 1),
            ("ahp-session:/abc ", 3),
            ("ahp-session:/a:b", 1),
            ("ahp-session:/a?b", 1),
            ("ahp-session:/a#b", 1),
            ("ahp-session:/a@b", 1),
            ("ahp-session:/a+b", 1),
            ("ahp-session:/a\nb", 1),
            ("ahp-session:/a\0b", 1),
            ("ahp-session:/é", 0),
            ("ahp-chat:/xé", 1),
            ("ahp-terminal:/\u{ff0e}", 0),
        ] {
            assert_eq!(
                err(uri),
                ClientUriError::InvalidIdByte { offset },
                "{uri:?}"
            );
        }
    }

    #[test]
    fn length_is_checked_before_bytes_and_counts_bytes() {
        // 65 two-byte characters: 130 bytes.
        let long = format!("ahp-session:/{}", "é".repeat(65));
        assert_eq!(err(&long), ClientUriError::IdTooLong { len: 130 });
        // 64 two-byte characters fit the length and fail on the first byte.
        let short = format!("ahp-session:/{}", "é".repeat(64));
        assert_eq!(err(&short), ClientUriError::InvalidIdByte { offset: 0 });
    }

    #[test]
    fn messages_do_not_echo_input() {
        let message = err("ahp-session:/secret~token").to_string();
        assert!(!message.contains("secret"), "{message}");
        assert_eq!(
            err("evil-scheme:/x").to_string(),
            "URI scheme must be ahp-session, ahp-chat or ahp-terminal"
        );
    }

    #[test]
    fn sessions_may_use_a_provider_scheme() {
        let uuid = "0b5e3c1a-4f2d-4e8b-9c7a-1d2e3f4a5b6c";
        for uri in [
            format!("copilot:/{uuid}"),
            format!("sim:/{uuid}"),
            format!("ahp-session:/{uuid}"),
        ] {
            let u = validate_client_session_uri(&uri).expect("accepted");
            assert_eq!(format!("{}:/{}", u.scheme, u.id), uri);
        }
        for uri in [
            "ahp-chat:/x",
            "ahp-terminal:/x",
            "ahp-content:/x",
            "file:/x",
            "http:/x",
            "vscode-agent-client:/x",
            "Copilot:/x",
            "co@host:/x",
            "9p:/x",
        ] {
            assert_eq!(
                validate_client_session_uri(uri),
                Err(ClientUriError::UnknownScheme),
                "{uri}"
            );
        }
        assert_eq!(
            validate_client_session_uri("copilot:/a~b"),
            Err(ClientUriError::InvalidIdByte { offset: 1 })
        );
        assert_eq!(
            validate_client_session_uri("copilot://h/x"),
            Err(ClientUriError::InvalidIdByte { offset: 0 })
        );
        assert_eq!(
            validate_client_session_uri("copilot:x"),
            Err(ClientUriError::MissingSlash)
        );
    }
}

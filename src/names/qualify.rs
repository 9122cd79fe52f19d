//! One client-facing namespace over many hosts (contract §4.2).
//!
//! A host's URI reaches clients either *verbatim* — when a client chose it
//! through the relay and the URI store records it for that host — or
//! *qualified by computation*, in one of three shapes:
//!
//! - **path form** `<scheme>:/<id><rest>` (`ahp-*` channels, content
//!   references `ahp-content:/<id>`, VS Code's `agenthost-terminal:/<id>`):
//!   the host id goes in front of the first path segment, `ahp-terminal:/7`
//!   from `gpu1` becoming `ahp-terminal:/gpu1~7` (scheme kept, so reducers
//!   chosen by scheme still work; derived URIs such as
//!   `ahp-session:/x/annotations` still derive);
//! - **provider-scheme sessions** `<provider>:/<id><rest>` (VS Code's
//!   `copilot:/<id>`): the host goes into the scheme, `copilot.gpu1:/<id>`,
//!   which is the provider id clients are shown — VS Code mints and parses
//!   session URIs from it ([`is_provider_scheme`]);
//! - **authority-form chats** `ahp-chat://<chat id>/<base64url(session)><rest>`
//!   (VS Code's `buildChatUri`): the embedded session is qualified inside the
//!   base64url, so qualification commutes with the derivation a client makes
//!   from a qualified session URI;
//! - **host-local files** `file:///p` (or `file://localhost/p`): the host id
//!   becomes the authority, `file://gpu1/p`;
//! - **authority-form terminals** `agenthost-terminal://<authority>/<id><rest>`
//!   (VS Code's shell tools): the first path segment is qualified,
//!   `agenthost-terminal://shell/gpu1~<id>`.
//!
//! External and self-contained URIs (`http`, `https`, `data`, any other URI
//! with an authority, opaque URIs such as `urn:`) and client-published URIs
//! (`vscode-agent-client:`) are not host names and pass unchanged. A host URI
//! of a host-name scheme in none of these shapes (`file://server/share`,
//! `ahp-chat://x/<not base64url of a session>`, `ahp-foo:opaque`) cannot be
//! qualified reversibly: [`qualify`] refuses it, and the frame carrying it is
//! dropped rather than passed bare. Schemes compare case-insensitively and
//! keep their spelling. Client-chosen ids may not contain `~`, so the
//! qualified and verbatim forms never overlap and no table is needed for
//! qualified names: they survive relay restarts by construction.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;

/// Schemes whose URIs are never host names, whatever their shape: external
/// and self-contained (`http`, `https`, `data`) and client-published
/// (`vscode-agent-client`, VS Code's wrapper of a client's own files).
pub const PASS_SCHEMES: &[&str] = &["http", "https", "data", "vscode-agent-client"];

/// Authority-form `ahp-*` URIs that name one object per connection (no
/// host-assigned part), passed unchanged.
const SINGLETONS: &[&str] = &["ahp-root", "ahp-automations"];

/// The separator between host id and host-local id in a qualified URI.
pub const QUALIFIER: char = '~';

/// Schemes of terminals besides `ahp-terminal`: VS Code's workbench names
/// the terminals it creates `agenthost-terminal:/<uuid>`.
const TERMINAL_SCHEMES: &[&str] = &["ahp-terminal", "agenthost-terminal"];

/// Path-form schemes that are neither `ahp-*` nor provider-scheme sessions:
/// terminals, and MCP side channels (refused, §11, but still named
/// reversibly if a host mentions one).
const NOT_PROVIDERS: &[&str] = &["ahp-terminal", "agenthost-terminal", "mcp"];

/// Whether a path-form URI of `scheme` is a *provider-scheme session* (VS
/// Code's `AgentSession.uri(provider, id)` = `<provider>:/<id>`): any scheme
/// that is not an `ahp-*` channel, a file, one of [`NOT_PROVIDERS`] or a
/// pass-through scheme. Such a session is qualified in its scheme, not its path:
/// `copilot:/abc` from `gpu1` is `copilot.gpu1:/abc` — the client-facing
/// provider id ([`qualify_provider`]) — so the session a client mints from a
/// provider, the one it lists and the provider it reads back from the scheme
/// agree (contract §4.3).
pub fn is_provider_scheme(scheme: &str) -> bool {
    let ahp = scheme.len() >= 4 && scheme[..4].eq_ignore_ascii_case("ahp-");
    !ahp && !scheme.eq_ignore_ascii_case("file")
        && !NOT_PROVIDERS.iter().any(|s| s.eq_ignore_ascii_case(scheme))
        && !PASS_SCHEMES.iter().any(|s| s.eq_ignore_ascii_case(scheme))
}

/// A path-form URI split into its parts: `<scheme>:/<head><tail>`, where
/// `head` is the first path segment and `tail` the rest (empty or starting
/// with `/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UriParts<'a> {
    /// Scheme without the colon, as spelled, e.g. `ahp-chat`.
    pub scheme: &'a str,
    /// First path segment (the id).
    pub head: &'a str,
    /// Everything after the first segment.
    pub tail: &'a str,
}

impl<'a> UriParts<'a> {
    /// Splits `uri` if it is `<scheme>:/<segment>[/...]` with a scheme that
    /// names host objects (not `file` nor one of [`PASS_SCHEMES`]).
    pub fn parse(uri: &'a str) -> Option<Self> {
        match Shape::of(uri) {
            Shape::Path(p) => Some(p),
            _ => None,
        }
    }

    /// The URI naming only the first segment (`<scheme>:/<head>`): the key
    /// under which the URI store records client-chosen URIs.
    pub fn base(&self) -> String {
        format!("{}:/{}", self.scheme, self.head)
    }
}

/// The syntactic shape of a URI, before deciding which host it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape<'a> {
    /// `<scheme>:/<head><tail>`.
    Path(UriParts<'a>),
    /// `<scheme>://<chat id>/<b64><tail>` with scheme `ahp-chat`.
    Chat {
        scheme: &'a str,
        chat_id: &'a str,
        b64: &'a str,
        tail: &'a str,
    },
    /// `<scheme>://<authority><path>` or `<scheme>:/<path>` with scheme
    /// `file`; `authority` is empty for the single-slash form.
    File {
        scheme: &'a str,
        authority: &'a str,
        path: &'a str,
    },
    /// `agenthost-terminal://<authority>/<head><tail>`: the terminals VS
    /// Code's shell tools mint on the host (`agenthost-terminal://shell/<id>`).
    /// Qualified in the first path segment, authority kept.
    Terminal {
        scheme: &'a str,
        authority: &'a str,
        head: &'a str,
        tail: &'a str,
    },
    /// Not a host name: passes unchanged.
    External,
    /// A host-name scheme in a shape the relay cannot qualify reversibly.
    Unknown,
}

impl<'a> Shape<'a> {
    fn of(uri: &'a str) -> Self {
        let Some((scheme, rest)) = uri.split_once(':') else {
            return Shape::External;
        };
        let valid = scheme
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic())
            && scheme
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'));
        if !valid || PASS_SCHEMES.iter().any(|s| s.eq_ignore_ascii_case(scheme)) {
            return Shape::External;
        }
        let ahp = scheme.len() >= 4 && scheme[..4].eq_ignore_ascii_case("ahp-");
        if scheme.eq_ignore_ascii_case("file") {
            return file_shape(scheme, rest);
        }
        if let Some(after) = rest.strip_prefix("//") {
            if scheme.eq_ignore_ascii_case("ahp-chat") {
                return chat_shape(scheme, after);
            }
            if scheme.eq_ignore_ascii_case("agenthost-terminal") {
                return terminal_shape(scheme, after);
            }
            if !ahp || SINGLETONS.iter().any(|s| s.eq_ignore_ascii_case(scheme)) {
                return Shape::External;
            }
            return Shape::Unknown;
        }
        let Some(path) = rest.strip_prefix('/') else {
            return if ahp { Shape::Unknown } else { Shape::External };
        };
        let (head, tail) = path.split_at(path.find('/').unwrap_or(path.len()));
        if head.is_empty() {
            return Shape::Unknown;
        }
        Shape::Path(UriParts { scheme, head, tail })
    }
}

fn file_shape<'a>(scheme: &'a str, rest: &'a str) -> Shape<'a> {
    if let Some(after) = rest.strip_prefix("//") {
        let (authority, path) = after.split_at(after.find('/').unwrap_or(after.len()));
        return Shape::File {
            scheme,
            authority,
            path,
        };
    }
    if rest.starts_with('/') {
        return Shape::File {
            scheme,
            authority: "",
            path: rest,
        };
    }
    Shape::Unknown
}

fn terminal_shape<'a>(scheme: &'a str, after: &'a str) -> Shape<'a> {
    let Some((authority, path)) = after.split_once('/') else {
        return Shape::Unknown;
    };
    let (head, tail) = path.split_at(path.find('/').unwrap_or(path.len()));
    if head.is_empty() {
        return Shape::Unknown;
    }
    Shape::Terminal {
        scheme,
        authority,
        head,
        tail,
    }
}

fn chat_shape<'a>(scheme: &'a str, after: &'a str) -> Shape<'a> {
    let Some((chat_id, path)) = after.split_once('/') else {
        return Shape::Unknown;
    };
    let (b64, tail) = path.split_at(path.find('/').unwrap_or(path.len()));
    if chat_id.is_empty() || b64.is_empty() {
        return Shape::Unknown;
    }
    Shape::Chat {
        scheme,
        chat_id,
        b64,
        tail,
    }
}

/// Whether `chat_id` is a chat id as VS Code's hosts write one:
/// `[A-Za-z0-9._-]{1,128}` (`default`, `subagent`, a generated id). VS Code
/// percent-decodes the authority before it looks a chat up, so `%63%31`
/// would name chat `c1` under a spelling the relay's catalog does not know,
/// and the chat would be decided by the session its URI embeds rather than
/// the one it lives in now (a moved chat): one name per chat, any other
/// spelling refused. (What follows the session segment is not a chat's
/// name there: only a subagent chat has one, its tool call's id.)
fn is_chat_id(chat_id: &str) -> bool {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-');
    chat_id.len() <= 128 && chat_id.bytes().all(allowed)
}

/// The session URI embedded in an authority-form chat URI's segment, if it
/// is base64url (no padding) of a UTF-8 path-form URI.
fn embedded_session(b64: &str) -> Option<String> {
    let bytes = B64.decode(b64).ok()?;
    let session = String::from_utf8(bytes).ok()?;
    UriParts::parse(&session).is_some().then_some(session)
}

fn chat_uri(scheme: &str, chat_id: &str, session: &str, tail: &str) -> String {
    format!("{scheme}://{chat_id}/{}{tail}", B64.encode(session))
}

/// The session a chat URI names by construction (authority form only:
/// `ahp-chat://<chat id>/<b64(session)>`), in the same namespace as the chat
/// URI (host form in, host form out).
pub fn session_of_chat_uri(uri: &str) -> Option<String> {
    match Shape::of(uri) {
        Shape::Chat { b64, .. } => embedded_session(b64),
        _ => None,
    }
}

/// For an authority-form chat URI `ahp-chat://<chat id>/<b64(s)><rest>`,
/// the same chat of session `session` instead of `s` (another namespace's
/// spelling of the same chat); `None` for other URIs.
pub fn chat_for_session(chat: &str, session: &str) -> Option<String> {
    match Shape::of(chat) {
        Shape::Chat {
            scheme,
            chat_id,
            tail,
            ..
        } => Some(chat_uri(scheme, chat_id, session, tail)),
        _ => None,
    }
}

/// What kind of channel a URI (host or client form) names, for visibility
/// and the state shape of its snapshots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChannelKind {
    /// `ahp-session:/…`, or a provider-scheme session (VS Code's
    /// `copilot:/<id>`, see [`is_provider_scheme`]).
    Session,
    /// `ahp-chat:/…` or `ahp-chat://<chat id>/<b64(session)>`.
    Chat,
    /// `ahp-terminal:/…` or VS Code's `agenthost-terminal:/…`.
    Terminal,
    /// Any other `ahp-*` channel or URI (changesets, canvases, watches,
    /// content references, the root, …), files and external URIs.
    Other,
}

/// The kind of channel `uri` names (schemes compared case-insensitively).
pub fn channel_kind(uri: &str) -> ChannelKind {
    match Shape::of(uri) {
        Shape::Chat { .. } => ChannelKind::Chat,
        Shape::Terminal { .. } => ChannelKind::Terminal,
        Shape::Path(p) => {
            let is = |s: &str| p.scheme.eq_ignore_ascii_case(s);
            if is("ahp-session") || is_provider_scheme(p.scheme) {
                ChannelKind::Session
            } else if is("ahp-chat") {
                ChannelKind::Chat
            } else if TERMINAL_SCHEMES.iter().any(|t| is(t)) {
                ChannelKind::Terminal
            } else {
                ChannelKind::Other
            }
        }
        _ => ChannelKind::Other,
    }
}

/// Where a client-facing host URI points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientName {
    /// Qualified: host-assigned name, host given inline (`<scheme>:/<host>~<id>…`,
    /// a chat embedding such a session, or `file://<host>/p`).
    Qualified {
        /// Host id.
        host: String,
        /// The URI as that host knows it.
        host_uri: String,
    },
    /// `<scheme>:/<id>…` without qualifier (or a chat embedding one): must
    /// be a URI-store entry.
    Verbatim {
        /// The store key (`<scheme>:/<id>` of the URI, or of the session an
        /// authority-form chat embeds).
        key: String,
    },
    /// `file:///p` (or `file://localhost/p`): a file of whichever host the
    /// request it appears in is routed to; never a routing key by itself.
    LocalFile {
        /// The URI as a host knows it (`file:///p`).
        host_uri: String,
    },
}

/// Errors reading a client-facing URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotAHostUri;

impl fmt::Display for NotAHostUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not a host URI")
    }
}

/// A host URI that cannot be qualified reversibly (contract §4.2): the
/// frame carrying it is refused, never passed through bare.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a host URI of a shape the relay cannot qualify")]
pub struct Unqualifiable;

/// Whether `uri` names anything on a host at all (else it passes unchanged
/// both ways: external, self-contained and client-published URIs).
pub fn is_host_name(uri: &str) -> bool {
    !matches!(Shape::of(uri), Shape::External)
}

/// Reads a client-facing URI: qualified (host inline), verbatim (store) or
/// a bare local file; `Err` for URIs that are not host names, and for
/// host-name shapes that are malformed (`ahp-chat:/~x`, `file://a~b/…`).
pub fn read_client_uri(uri: &str) -> Result<ClientName, NotAHostUri> {
    match Shape::of(uri) {
        Shape::Path(p) => read_path(p),
        Shape::Chat {
            scheme,
            chat_id,
            b64,
            tail,
        } => {
            if !is_chat_id(chat_id) {
                return Err(NotAHostUri);
            }
            let session = embedded_session(b64).ok_or(NotAHostUri)?;
            match read_client_uri(&session)? {
                ClientName::Qualified { host, host_uri } => Ok(ClientName::Qualified {
                    host,
                    host_uri: chat_uri(scheme, chat_id, &host_uri, tail),
                }),
                verbatim @ ClientName::Verbatim { .. } => Ok(verbatim),
                ClientName::LocalFile { .. } => Err(NotAHostUri),
            }
        }
        Shape::File {
            scheme,
            authority,
            path,
        } => {
            let host_uri = format!("{scheme}://{path}");
            if authority.is_empty() || authority.eq_ignore_ascii_case("localhost") {
                Ok(ClientName::LocalFile { host_uri })
            } else if valid_host_id(authority) {
                Ok(ClientName::Qualified {
                    host: authority.to_string(),
                    host_uri,
                })
            } else {
                Err(NotAHostUri)
            }
        }
        Shape::Terminal {
            scheme,
            authority,
            head,
            tail,
        } => match head.split_once(QUALIFIER) {
            Some((host, id)) if !host.is_empty() && !id.is_empty() => Ok(ClientName::Qualified {
                host: host.to_string(),
                host_uri: format!("{scheme}://{authority}/{id}{tail}"),
            }),
            _ => Err(NotAHostUri),
        },
        Shape::External | Shape::Unknown => Err(NotAHostUri),
    }
}

fn read_path(p: UriParts<'_>) -> Result<ClientName, NotAHostUri> {
    if is_provider_scheme(p.scheme) {
        // Only the scheme-qualified spelling names a provider-scheme
        // session: one name per object.
        let (provider, host) = read_provider(p.scheme).ok_or(NotAHostUri)?;
        return Ok(ClientName::Qualified {
            host,
            host_uri: format!("{provider}:/{}{}", p.head, p.tail),
        });
    }
    match p.head.split_once(QUALIFIER) {
        Some((host, id)) if !host.is_empty() && !id.is_empty() => Ok(ClientName::Qualified {
            host: host.to_string(),
            host_uri: format!("{}:/{id}{}", p.scheme, p.tail),
        }),
        Some(_) => Err(NotAHostUri),
        None => Ok(ClientName::Verbatim { key: p.base() }),
    }
}

/// The client-facing form of host `host`'s URI. `is_store_entry(base)` tells
/// whether a path-form URI's base is a client-chosen URI the store records
/// for this host (then it is kept verbatim). URIs that are not host names
/// pass unchanged; a host-name URI of a shape that cannot be qualified
/// reversibly is refused.
pub fn qualify(
    host: &str,
    uri: &str,
    is_store_entry: impl Fn(&str) -> bool,
) -> Result<String, Unqualifiable> {
    match Shape::of(uri) {
        Shape::External => Ok(uri.to_string()),
        Shape::Unknown => Err(Unqualifiable),
        Shape::Path(p) => Ok(qualify_path(host, p, &is_store_entry)),
        Shape::Terminal {
            scheme,
            authority,
            head,
            tail,
        } => Ok(format!(
            "{scheme}://{authority}/{host}{QUALIFIER}{head}{tail}"
        )),
        Shape::Chat {
            scheme,
            chat_id,
            b64,
            tail,
        } => {
            let session = embedded_session(b64).ok_or(Unqualifiable)?;
            let p = UriParts::parse(&session).ok_or(Unqualifiable)?;
            let client_session = qualify_path(host, p, &is_store_entry);
            Ok(chat_uri(scheme, chat_id, &client_session, tail))
        }
        Shape::File {
            scheme,
            authority,
            path,
        } => {
            let local = authority.is_empty() || authority.eq_ignore_ascii_case("localhost");
            local
                .then(|| format!("{scheme}://{host}{path}"))
                .ok_or(Unqualifiable)
        }
    }
}

fn qualify_path(host: &str, p: UriParts<'_>, is_store_entry: &impl Fn(&str) -> bool) -> String {
    if is_provider_scheme(p.scheme) {
        let scheme = qualify_provider(host, p.scheme);
        return format!("{scheme}:/{}{}", p.head, p.tail);
    }
    if is_store_entry(&p.base()) {
        return format!("{}:/{}{}", p.scheme, p.head, p.tail);
    }
    format!("{}:/{host}{QUALIFIER}{}{}", p.scheme, p.head, p.tail)
}

/// Stands for one RFC 6570 expression while a template is qualified: no
/// `/`, `~`, `{` or `}`, and not something a host writes in a URI.
const EXPR_MARK: char = '\u{1}';

/// Runs `f` on a URI template with each `{…}` expression replaced by a
/// marker, then puts the expressions back: qualifying the literal parts
/// this way commutes with expansion for path-form and `file:` templates
/// (`ahp-changeset:/s/{turnId}` → `ahp-changeset:/gpu1~s/{turnId}`).
pub fn map_template<E>(
    template: &str,
    f: impl FnOnce(&str) -> Result<String, E>,
    malformed: E,
) -> Result<String, E> {
    if template.contains(EXPR_MARK) {
        return Err(malformed);
    }
    let mut exprs = Vec::new();
    let mut marked = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let Some(len) = rest[open..].find('}') else {
            return Err(malformed);
        };
        marked.push_str(&rest[..open]);
        marked.push(EXPR_MARK);
        exprs.push(&rest[open..open + len + 1]);
        rest = &rest[open + len + 1..];
    }
    marked.push_str(rest);
    let mapped = f(&marked)?;
    let mut out = String::with_capacity(mapped.len() + template.len());
    let mut exprs = exprs.into_iter();
    for part in mapped.split(EXPR_MARK).enumerate() {
        if part.0 > 0 {
            let Some(e) = exprs.next() else {
                return Err(malformed);
            };
            out.push_str(e);
        }
        out.push_str(part.1);
    }
    match exprs.next() {
        None => Ok(out),
        Some(_) => Err(malformed),
    }
}

/// Whether `id` is a valid host id: `[a-z0-9-]{1,32}` and not `localhost`.
pub fn valid_host_id(id: &str) -> bool {
    (1..=32).contains(&id.len())
        && id != "localhost"
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// A provider id as clients see it: `<provider>.<host>`, with the host id's
/// `-` spelled `+` (contract §4.3). It must be a legal URI scheme (RFC 3986
/// `ALPHA *( ALPHA / DIGIT / "+" / "-" / "." )`, and VS Code's
/// `^\w[\w\d+.-]*$`): VS Code's client mints session URIs as
/// `<provider>:/<uuid>`, and its workbench registers the scheme
/// `remote-<authority>-<provider>` and reads the provider back after the last
/// `-`, so the client form holds neither `@` nor `-`. Host ids never contain
/// `+` or `.`, so the last `.` splits it back exactly ([`read_provider`]).
pub fn qualify_provider(host: &str, provider: &str) -> String {
    format!("{provider}.{}", host.replace('-', "+"))
}

/// Splits a client provider id at its last `.` into (provider, host id).
pub fn read_provider(client: &str) -> Option<(&str, String)> {
    let (p, h) = client.rsplit_once('.')?;
    let host = h.replace('+', "-");
    (!p.is_empty() && !h.contains('-') && valid_host_id(&host)).then_some((p, host))
}

#[cfg(test)]
mod tests;

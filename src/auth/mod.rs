//! Who may open a socket: JWT extraction and verification at the upgrade (contract §3.2–§3.4).
//!
//! The edge calls [`extract_token`] on the upgrade request, then [`Authenticator::verify`],
//! and answers a refusal with [`AuthError::status`], [`AuthError::www_authenticate`] and a
//! metric labelled [`AuthError::reason`]. Nothing here logs, displays or debugs a token.
//!
//! Decisions where the contract is silent (each is proved by a test in this file or in
//! `tests/auth_cases.rs`):
//! - **Issuer selection.** The unverified `iss` only picks the issuer configuration; the
//!   unverified header only gives `alg` and `kid`. Everything is then re-checked on the
//!   verified token (`iss` is also set in the library's `Validation`).
//! - **Algorithms.** A `pem` issuer accepts exactly its configured algorithm; an `hs256`
//!   issuer exactly HS256; a JWKS key accepts its own `alg` if the JWK names one, else every
//!   algorithm of its key type (RSA: RS*/PS*, EC: the curve's ES*, OKP Ed25519: EdDSA). A
//!   JWKS may hold keys of several asymmetric families: the key picked by `kid` fixes the
//!   family, so key confusion stays impossible. `alg: none` and unknown names are
//!   [`AuthError::AlgorithmNotAllowed`], never "malformed".
//! - **Key choice.** A token with `kid` against a JWKS issuer is tried only on the keys with
//!   that `kid` (none → [`AuthError::UnknownKey`]); a token without `kid`, and every token of
//!   a `pem` issuer (PEM files carry no `kid`), is tried on each key of the issuer in turn
//!   (rotation with several files).
//! - **JWKS entries.** `kty: oct` fails the load (HMAC only from `hs256`); an `HS*` `alg` on
//!   any entry fails the load; entries with `use` other than `sig`, `key_ops` without
//!   `verify`, non-JWS algorithms (`RSA-OAEP`…), unknown key types and curves other than
//!   P-256, P-384 and Ed25519 are skipped with a warning. A JWKS with no usable key fails.
//! - **PEM files.** One `PUBLIC KEY` or `RSA PUBLIC KEY` block per file; a private key,
//!   a certificate or several PEM blocks fail the load. Each key is probed against its
//!   algorithm at load (an ES384 issuer given a P-256 key fails then, not at the first
//!   token).
//! - **HS256 secret file.** Trailing `\r`/`\n` are stripped (files written by `echo`); the
//!   rest must be at least [`MIN_HS256_SECRET_BYTES`] bytes (RFC 7518 §3.2).
//! - **Times.** `exp` is required and numeric; `nbf` and `iat` are optional and numeric;
//!   `null` counts as absent; fractional values round towards refusal. A token is expired
//!   when `now > exp + leeway` and not yet valid when `nbf > now + leeway`.
//! - **Lifetime.** `exp - min(iat, now)` (so `exp - now` without `iat`, and a future `iat`
//!   cannot shorten it). Above `max_unrevocable_lifetime_secs` the token needs a `jti`.
//! - **Claims.** `sub` must be a non-empty string; `jti`, when present, too. Groups come
//!   from the top-level claim named by `groups_claim`: an array of strings, a single string
//!   (one group; the empty string means none), or absent/`null` (none). More than
//!   `max_groups` groups, or more than `max_groups_bytes` bytes of group names together, is
//!   [`AuthError::TooManyGroups`] (401): every session and stored URI carries the groups,
//!   and every visibility check walks them.
//! - **Size.** A token longer than [`MAX_TOKEN_BYTES`] is malformed without being parsed.
//! - **Deny list file.** One `jti` per line, surrounding whitespace trimmed, blank lines
//!   and lines starting with `#` ignored.
//! - **Status codes (§3.4).** 400 for [`AuthError::ConflictingTokens`] (a malformed
//!   request); 403 for [`AuthError::Revoked`] (the token is genuine but its holder may not
//!   connect with it; matches close code 4003 "do not retry with it"); 401 with
//!   `WWW-Authenticate` for everything else, i.e. a token that is missing or not acceptable
//!   as a credential — including a long-lived token without `jti`, which a new token fixes.
//! - **Token places (§3.2).** When several places carry the same token the reported
//!   [`TokenSource`] is the first of: sub-protocol (so the caller knows to answer
//!   `Sec-WebSocket-Protocol: bearer`), `Authorization`, `tkn`, `access_token`. An
//!   `Authorization` header with another scheme (e.g. `Basic`) is ignored. Query strings
//!   are decoded as `application/x-www-form-urlencoded` (`+` is a space).

pub mod token;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, PoisonError, RwLock};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::{HeaderMap, StatusCode};
use jsonwebtoken::crypto::CryptoProvider;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk};
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey, Validation};
use serde::Deserialize;
use serde_json::{Map, Value};

/// Default clock-skew allowance, in seconds, for `exp` and `nbf` (contract §3.3: ≤ 25 s).
pub const DEFAULT_LEEWAY_SECS: u64 = 25;
/// Largest `leeway_secs` that [`AuthConfig::validate`] accepts.
pub const MAX_LEEWAY_SECS: u64 = 300;
/// Default lifetime, in seconds, above which a token must carry `jti` (contract §3.3: 1 h).
pub const DEFAULT_MAX_UNREVOCABLE_LIFETIME_SECS: u64 = 3600;
/// Smallest HS256 secret accepted for verification and for minting (RFC 7518 §3.2).
pub const MIN_HS256_SECRET_BYTES: usize = 32;
/// Longest token, in bytes, that [`Authenticator::verify`] will parse.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;
/// Default most groups a token may carry (`auth.max_groups`).
pub const DEFAULT_MAX_GROUPS: usize = 256;
/// Default most bytes of group names a token may carry, all together
/// (`auth.max_groups_bytes`).
pub const DEFAULT_MAX_GROUPS_BYTES: usize = 16 * 1024;

const REALM_ONLY: &str = "Bearer realm=\"ahp-relay\"";
const INVALID_REQUEST: &str = "Bearer realm=\"ahp-relay\", error=\"invalid_request\"";
const INVALID_TOKEN: &str = "Bearer realm=\"ahp-relay\", error=\"invalid_token\"";
const EXPIRED_TOKEN: &str =
    "Bearer realm=\"ahp-relay\", error=\"invalid_token\", error_description=\"token expired\"";

// ---------------------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------------------

/// The `[auth]` section of the relay's TOML config. Parsing rejects unknown fields;
/// [`AuthConfig::validate`] (also run by [`Authenticator::load`]) rejects the rest.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// The trusted issuers; at least one, each `issuer` string at most once.
    pub issuers: Vec<IssuerConfig>,
    /// Clock-skew allowance for `exp` and `nbf`, in seconds; at most [`MAX_LEEWAY_SECS`].
    #[serde(default = "default_leeway_secs")]
    pub leeway_secs: u64,
    /// Name of the top-level claim that lists the principal's groups.
    #[serde(default = "default_groups_claim")]
    pub groups_claim: String,
    /// Whether the `tkn` and `access_token` query parameters are read (§3.2).
    #[serde(default = "default_true")]
    pub allow_query_token: bool,
    /// Tokens living longer than this many seconds must carry `jti` (so they can be revoked).
    #[serde(default = "default_max_unrevocable_lifetime_secs")]
    pub max_unrevocable_lifetime_secs: u64,
    /// File of revoked `jti` values, one per line; reloaded by [`Authenticator::reload`].
    #[serde(default)]
    pub deny_list_file: Option<PathBuf>,
    /// Most groups a token's groups claim may list; more is refused with 401.
    #[serde(default = "default_max_groups")]
    pub max_groups: usize,
    /// Most bytes all group names of a token may take together; more is refused with 401.
    #[serde(default = "default_max_groups_bytes")]
    pub max_groups_bytes: usize,
}

fn default_max_groups() -> usize {
    DEFAULT_MAX_GROUPS
}

fn default_max_groups_bytes() -> usize {
    DEFAULT_MAX_GROUPS_BYTES
}

fn default_leeway_secs() -> u64 {
    DEFAULT_LEEWAY_SECS
}

fn default_groups_claim() -> String {
    "groups".to_owned()
}

fn default_true() -> bool {
    true
}

fn default_max_unrevocable_lifetime_secs() -> u64 {
    DEFAULT_MAX_UNREVOCABLE_LIFETIME_SECS
}

/// One trusted token issuer: its `iss` value, accepted audiences and verification keys.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IssuerConfig {
    /// The exact `iss` claim value of this issuer's tokens.
    pub issuer: String,
    /// Accepted `aud` values; a token must name at least one. Required and non-empty.
    pub audience: Vec<String>,
    /// Where this issuer's keys come from; it also fixes the accepted algorithms.
    pub keys: KeySource,
}

/// Where an issuer's verification keys come from (TOML: `keys = { type = "pem", … }`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum KeySource {
    /// A shared HMAC secret (HS256 only). The only way an HMAC key is ever accepted; meant
    /// for the dev demo.
    Hs256 {
        /// File holding the raw secret (trailing newlines are stripped).
        secret_file: PathBuf,
    },
    /// Public keys in PEM files, all for one algorithm; every file is tried (rotation).
    Pem {
        /// The one algorithm accepted for this issuer.
        algorithm: PemAlgorithm,
        /// One public key per file (SPKI `PUBLIC KEY`, or PKCS#1 `RSA PUBLIC KEY`); at
        /// least one file.
        files: Vec<PathBuf>,
    },
    /// A JWKS JSON file (`{"keys": [...]}`); keys are chosen by `kid`; `oct` keys are refused.
    Jwks {
        /// Path of the JWKS file.
        file: PathBuf,
    },
}

/// The asymmetric algorithms a `pem` key source can be configured with (JOSE names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum PemAlgorithm {
    /// RSASSA-PKCS1-v1_5 with SHA-256.
    #[serde(rename = "RS256")]
    Rs256,
    /// RSASSA-PKCS1-v1_5 with SHA-384.
    #[serde(rename = "RS384")]
    Rs384,
    /// RSASSA-PKCS1-v1_5 with SHA-512.
    #[serde(rename = "RS512")]
    Rs512,
    /// RSASSA-PSS with SHA-256.
    #[serde(rename = "PS256")]
    Ps256,
    /// ECDSA P-256 with SHA-256.
    #[serde(rename = "ES256")]
    Es256,
    /// ECDSA P-384 with SHA-384.
    #[serde(rename = "ES384")]
    Es384,
    /// Ed25519.
    #[serde(rename = "EdDSA")]
    EdDsa,
}

impl PemAlgorithm {
    fn algorithm(self) -> Algorithm {
        match self {
            Self::Rs256 => Algorithm::RS256,
            Self::Rs384 => Algorithm::RS384,
            Self::Rs512 => Algorithm::RS512,
            Self::Ps256 => Algorithm::PS256,
            Self::Es256 => Algorithm::ES256,
            Self::Es384 => Algorithm::ES384,
            Self::EdDsa => Algorithm::EdDSA,
        }
    }
}

impl AuthConfig {
    /// Checks what serde cannot: at least one issuer, no duplicate or empty `issuer`, a
    /// non-empty audience list without empty entries, at least one PEM file per `pem`
    /// source, a non-empty `groups_claim`, and `leeway_secs` ≤ [`MAX_LEEWAY_SECS`].
    pub fn validate(&self) -> Result<(), AuthConfigError> {
        let invalid = |msg: String| Err(AuthConfigError::Invalid(msg));
        if self.issuers.is_empty() {
            return invalid("auth.issuers: at least one issuer is required".to_owned());
        }
        if self.leeway_secs > MAX_LEEWAY_SECS {
            return invalid(format!(
                "auth.leeway_secs = {} exceeds the maximum of {MAX_LEEWAY_SECS}",
                self.leeway_secs
            ));
        }
        if self.groups_claim.is_empty() {
            return invalid("auth.groups_claim must not be empty".to_owned());
        }
        let mut seen = HashSet::new();
        for issuer in &self.issuers {
            if issuer.issuer.is_empty() {
                return invalid("auth.issuers: `issuer` must not be empty".to_owned());
            }
            if !seen.insert(issuer.issuer.as_str()) {
                return invalid(format!(
                    "auth.issuers: issuer {:?} is configured twice",
                    issuer.issuer
                ));
            }
            if issuer.audience.is_empty() || issuer.audience.iter().any(String::is_empty) {
                return invalid(format!(
                    "auth.issuers: issuer {:?} needs a non-empty `audience` list without empty entries",
                    issuer.issuer
                ));
            }
            if let KeySource::Pem { files, .. } = &issuer.keys
                && files.is_empty()
            {
                return invalid(format!(
                    "auth.issuers: issuer {:?} has a `pem` key source without files",
                    issuer.issuer
                ));
            }
        }
        Ok(())
    }
}

/// Why the auth configuration or one of its files could not be (re)loaded. Messages name
/// the setting or file and the problem; they never contain key material.
#[derive(Debug, thiserror::Error)]
pub enum AuthConfigError {
    /// A setting is invalid (see [`AuthConfig::validate`]).
    #[error("invalid auth config: {0}")]
    Invalid(String),
    /// A key or deny-list file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A key file was read but its content is unusable.
    #[error("{}: {problem}", path.display())]
    Key {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// Several files failed one reload (each kept its previous version).
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Several(Vec<AuthConfigError>),
    /// The binary was built without a `jsonwebtoken` crypto backend feature.
    #[error("jsonwebtoken has no crypto backend (enable its `rust_crypto` feature)")]
    NoCryptoBackend,
}

// ---------------------------------------------------------------------------------------
// Principal and errors
// ---------------------------------------------------------------------------------------

/// The verified identity behind a socket. Only [`Authenticator::verify`] makes one, so
/// every field comes from a token whose signature, issuer, audience and times were checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The token's `iss` (one of the configured issuers).
    pub issuer: String,
    /// The token's `sub` (non-empty).
    pub subject: String,
    /// Groups from the configured groups claim (possibly empty), sorted and
    /// without repeats.
    pub groups: Vec<String>,
    /// The token's `exp`, unix seconds. The edge closes the socket with 4001 once
    /// `expires_at + leeway_secs` has passed.
    pub expires_at: u64,
    /// The token's `jti`, if any; revoking it closes the socket with 4003.
    pub jti: Option<String>,
}

impl Principal {
    /// The principal's identity: the pair (`iss`, `sub`). Two issuers' equal `sub` values
    /// are different principals (contract §3.3, review M13).
    pub fn key(&self) -> (String, String) {
        (self.issuer.clone(), self.subject.clone())
    }
}

/// Why an upgrade request was refused. `Display` names the problem, never the token;
/// see the module doc for the status-code rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No token in any accepted place.
    #[error("no bearer token in the upgrade request")]
    MissingToken,
    /// Several places carry different tokens.
    #[error("different bearer tokens in several places of the upgrade request")]
    ConflictingTokens,
    /// The token (or the header/parameter carrying it) is not a well-formed JWT.
    #[error("malformed token: {0}")]
    Malformed(&'static str),
    /// The token's `iss` is not a configured issuer.
    #[error("token issuer is not configured")]
    UnknownIssuer,
    /// The token's `alg` is not accepted for its issuer or key (includes `none`).
    #[error("token algorithm is not allowed for its issuer")]
    AlgorithmNotAllowed,
    /// The token's `kid` names no key of its issuer.
    #[error("token key id matches no key of its issuer")]
    UnknownKey,
    /// No key of the issuer verifies the signature.
    #[error("token signature does not verify")]
    BadSignature,
    /// `exp + leeway` has passed.
    #[error("token has expired")]
    Expired,
    /// `nbf - leeway` has not been reached yet.
    #[error("token is not valid yet")]
    NotYetValid,
    /// The token's `aud` names none of the issuer's audiences.
    #[error("token audience is not accepted")]
    WrongAudience,
    /// A required claim is absent; carries the claim name.
    #[error("token lacks the required claim `{0}`")]
    MissingClaim(String),
    /// A claim has the wrong type or an invalid value; carries the claim name.
    #[error("token claim `{0}` has an invalid value")]
    InvalidClaim(String),
    /// The token lives longer than `max_unrevocable_lifetime_secs` and has no `jti`.
    #[error("token lifetime exceeds the limit for tokens without `jti`")]
    LifetimeNeedsJti,
    /// The token's `jti` is on the deny list.
    #[error("token has been revoked")]
    Revoked,
    /// The groups claim lists more groups, or more bytes of group names, than
    /// `auth.max_groups` / `auth.max_groups_bytes` allow.
    #[error(
        "token groups claim is over the relay's bound (auth.max_groups, auth.max_groups_bytes)"
    )]
    TooManyGroups,
}

impl AuthError {
    /// The HTTP status for the refused upgrade: 400 for conflicting tokens, 403 for a
    /// revoked token, 401 for every other missing or invalid token.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::ConflictingTokens => StatusCode::BAD_REQUEST,
            Self::Revoked => StatusCode::FORBIDDEN,
            _ => StatusCode::UNAUTHORIZED,
        }
    }

    /// A short snake_case label for metrics, from a fixed set (one per variant; claim
    /// names are not part of it).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::MissingToken => "missing_token",
            Self::ConflictingTokens => "conflicting_tokens",
            Self::Malformed(_) => "malformed",
            Self::UnknownIssuer => "unknown_issuer",
            Self::AlgorithmNotAllowed => "algorithm_not_allowed",
            Self::UnknownKey => "unknown_key",
            Self::BadSignature => "bad_signature",
            Self::Expired => "expired",
            Self::NotYetValid => "not_yet_valid",
            Self::WrongAudience => "wrong_audience",
            Self::MissingClaim(_) => "missing_claim",
            Self::InvalidClaim(_) => "invalid_claim",
            Self::LifetimeNeedsJti => "lifetime_needs_jti",
            Self::Revoked => "revoked",
            Self::TooManyGroups => "too_many_groups",
        }
    }

    /// The `WWW-Authenticate` value (RFC 6750 §3) to send with the refusal: present for
    /// 400 and 401, absent for 403. It never contains the token or any claim value.
    pub fn www_authenticate(&self) -> Option<&'static str> {
        match self {
            Self::MissingToken => Some(REALM_ONLY),
            Self::ConflictingTokens => Some(INVALID_REQUEST),
            Self::Expired => Some(EXPIRED_TOKEN),
            Self::Revoked => None,
            _ => Some(INVALID_TOKEN),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Token extraction
// ---------------------------------------------------------------------------------------

/// Where in the upgrade request a token was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenSource {
    /// `Authorization: Bearer <t>`.
    AuthorizationHeader,
    /// `Sec-WebSocket-Protocol: bearer, <t>`; the caller must answer with
    /// `Sec-WebSocket-Protocol: bearer`.
    Subprotocol,
    /// The `tkn` query parameter (VS Code's remote agent host client).
    QueryTkn,
    /// The `access_token` query parameter.
    QueryAccessToken,
}

/// Finds the bearer token of an upgrade request (contract §3.2).
///
/// Reads `Authorization: Bearer <t>` (scheme case-insensitive; other schemes ignored),
/// `Sec-WebSocket-Protocol` whose first list item is `bearer` and second the token, and —
/// only if `allow_query` — the percent-decoded `tkn` and `access_token` query parameters.
/// Returns `Ok(None)` when no place carries a token, [`AuthError::ConflictingTokens`] when
/// two places (or two repetitions of a parameter) differ, and [`AuthError::Malformed`] for
/// an empty token, a `bearer` sub-protocol without a token, undecodable percent-encoding
/// or non-ASCII header values. The reported source follows the priority in the module doc.
pub fn extract_token(
    headers: &HeaderMap,
    query: Option<&str>,
    allow_query: bool,
) -> Result<Option<(String, TokenSource)>, AuthError> {
    let mut found: Vec<(String, TokenSource)> = Vec::new();

    let mut protocols = Vec::new();
    for value in headers.get_all(http::header::SEC_WEBSOCKET_PROTOCOL) {
        let value = value
            .to_str()
            .map_err(|_| AuthError::Malformed("Sec-WebSocket-Protocol is not visible ASCII"))?;
        protocols.extend(value.split(',').map(str::trim));
    }
    if protocols.first() == Some(&"bearer") {
        match protocols.get(1) {
            Some(token) if !token.is_empty() => {
                found.push(((*token).to_owned(), TokenSource::Subprotocol));
            }
            _ => return Err(AuthError::Malformed("bearer sub-protocol without a token")),
        }
    }

    for value in headers.get_all(http::header::AUTHORIZATION) {
        let value = value
            .to_str()
            .map_err(|_| AuthError::Malformed("Authorization is not visible ASCII"))?
            .trim();
        let (scheme, rest) = value.split_once(' ').unwrap_or((value, ""));
        if !scheme.eq_ignore_ascii_case("bearer") {
            continue;
        }
        let token = rest.trim();
        if token.is_empty() || token.contains(char::is_whitespace) {
            return Err(AuthError::Malformed(
                "Authorization: Bearer without a single token",
            ));
        }
        found.push((token.to_owned(), TokenSource::AuthorizationHeader));
    }

    if allow_query && let Some(query) = query {
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (raw_name, raw_value) = pair.split_once('=').unwrap_or((pair, ""));
            let source = match form_decode(raw_name).as_deref() {
                Ok("tkn") => TokenSource::QueryTkn,
                Ok("access_token") => TokenSource::QueryAccessToken,
                _ => continue,
            };
            let token = form_decode(raw_value)
                .map_err(|_| AuthError::Malformed("query token is not valid percent-encoding"))?;
            if token.is_empty() {
                return Err(AuthError::Malformed("empty query token"));
            }
            found.push((token, source));
        }
    }

    let mut found = found.into_iter();
    let Some(first) = found.next() else {
        return Ok(None);
    };
    if found.any(|(token, _)| token != first.0) {
        return Err(AuthError::ConflictingTokens);
    }
    Ok(Some(first))
}

/// Returns `query` with the value of every parameter named `tkn` or whose name contains
/// `token` (case-insensitive, raw or percent-decoded) replaced by `REDACTED`; every other
/// parameter is kept byte for byte. For log lines only.
pub fn redact_query(query: &str) -> String {
    let redacted: Vec<String> = query
        .split('&')
        .map(|pair| {
            let raw_name = pair.split_once('=').map_or(pair, |(name, _)| name);
            let sensitive = |name: &str| {
                let name = name.to_ascii_lowercase();
                name == "tkn" || name.contains("token")
            };
            let decoded = form_decode(raw_name).unwrap_or_default();
            if sensitive(raw_name) || sensitive(&decoded) {
                format!("{raw_name}=REDACTED")
            } else {
                pair.to_owned()
            }
        })
        .collect();
    redacted.join("&")
}

/// Decodes one `application/x-www-form-urlencoded` component (`+` → space, `%XX` → byte)
/// into UTF-8.
fn form_decode(input: &str) -> Result<String, ()> {
    let bytes = input.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&byte) = bytes.get(i) {
        match byte {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes.get(i + 1..i + 3).ok_or(())?;
                let hex = std::str::from_utf8(hex).map_err(|_| ())?;
                out.push(u8::from_str_radix(hex, 16).map_err(|_| ())?);
                i += 2;
            }
            other => out.push(other),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| ())
}

// ---------------------------------------------------------------------------------------
// Keys
// ---------------------------------------------------------------------------------------

/// One verification key with the algorithms it accepts and its library `Validation`.
struct VerifyKey {
    kid: Option<String>,
    key: DecodingKey,
    algorithms: Vec<Algorithm>,
    validation: Validation,
}

/// The keys of one issuer.
struct IssuerKeys {
    /// JWKS issuers select keys by `kid`; PEM and HS256 issuers try every key.
    select_by_kid: bool,
    keys: Vec<VerifyKey>,
}

/// What verification reads: each issuer's keys and the deny list, each replaced on its own
/// by [`Authenticator::reload`].
struct KeyState {
    issuers: HashMap<String, Arc<IssuerKeys>>,
    deny_list: Arc<HashSet<String>>,
}

/// Verifies upgrade tokens against the configured issuers. Shareable across threads; a
/// [`reload`](Self::reload) swaps in every issuer's keys and the deny list that loaded, and
/// verifications running meanwhile finish on the state they started with.
pub struct Authenticator {
    config: AuthConfig,
    state: RwLock<Arc<KeyState>>,
}

impl fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.snapshot();
        f.debug_struct("Authenticator")
            .field("issuers", &state.issuers.keys().collect::<Vec<_>>())
            .field(
                "keys",
                &state.issuers.values().map(|i| i.keys.len()).sum::<usize>(),
            )
            .field("deny_list_entries", &state.deny_list.len())
            .finish_non_exhaustive()
    }
}

impl Authenticator {
    /// Validates `config` and reads every key file and the deny list. Fails with an error
    /// naming the setting or file if anything is unusable.
    pub fn load(config: &AuthConfig) -> Result<Self, AuthConfigError> {
        config.validate()?;
        if CryptoProvider::try_get_default().is_none() {
            return Err(AuthConfigError::NoCryptoBackend);
        }
        let mut issuers = HashMap::new();
        for issuer in &config.issuers {
            issuers.insert(issuer.issuer.clone(), Arc::new(load_issuer(issuer)?));
        }
        let deny_list = Arc::new(load_deny(config)?);
        log_loaded(&issuers, &deny_list);
        Ok(Self {
            config: config.clone(),
            state: RwLock::new(Arc::new(KeyState { issuers, deny_list })),
        })
    }

    /// Re-reads every issuer's key files and the deny list of the configuration given to
    /// [`load`](Self::load), each on its own: what loads is swapped in, what fails keeps its
    /// previous version (an issuer its previous keys, the deny list its previous entries),
    /// so one broken key file neither drops an issuer's keys nor stops a newly revoked
    /// `jti` from being enforced. The error names every file that failed.
    pub fn reload(&self) -> Result<(), AuthConfigError> {
        let old = self.snapshot();
        let mut failed = Vec::new();
        let mut issuers = HashMap::new();
        for issuer in &self.config.issuers {
            match load_issuer(issuer) {
                Ok(keys) => {
                    issuers.insert(issuer.issuer.clone(), Arc::new(keys));
                }
                Err(e) => {
                    failed.push(e);
                    if let Some(keys) = old.issuers.get(&issuer.issuer) {
                        issuers.insert(issuer.issuer.clone(), Arc::clone(keys));
                    }
                }
            }
        }
        let deny_list = load_deny(&self.config).map(Arc::new).unwrap_or_else(|e| {
            failed.push(e);
            Arc::clone(&old.deny_list)
        });
        log_loaded(&issuers, &deny_list);
        let state = Arc::new(KeyState { issuers, deny_list });
        *self.state.write().unwrap_or_else(PoisonError::into_inner) = state;
        match failed.len() {
            0 => Ok(()),
            1 => Err(failed.remove(0)),
            _ => Err(AuthConfigError::Several(failed)),
        }
    }

    /// The configuration this authenticator was loaded from.
    pub fn config(&self) -> &AuthConfig {
        &self.config
    }

    /// Whether `jti` is on the current deny list.
    pub fn is_revoked(&self, jti: &str) -> bool {
        self.snapshot().deny_list.contains(jti)
    }

    /// Verifies `token` at time `now_unix` (seconds) and returns its principal.
    ///
    /// Guarantees, in this order: the token is a three-part JWS of at most
    /// [`MAX_TOKEN_BYTES`]; its `iss` is a configured issuer; its `alg` is accepted for
    /// that issuer's key (never `none`, never HMAC unless the issuer is `hs256`); the
    /// signature verifies with one of the issuer's keys; `aud` is present and names one of
    /// the issuer's audiences; `exp` is present and `now ≤ exp + leeway`; `nbf`, if present,
    /// is `≤ now + leeway`; `sub` is a non-empty string; `jti`, if present, is a non-empty
    /// string; the groups claim is well-formed;
    /// a token living longer than `max_unrevocable_lifetime_secs` has a `jti`; and the
    /// `jti` is not on the deny list.
    pub fn verify(&self, token: &str, now_unix: u64) -> Result<Principal, AuthError> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(AuthError::Malformed("token too long"));
        }
        let mut parts = token.split('.');
        let (Some(header), Some(payload), Some(_signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(AuthError::Malformed("not three dot-separated parts"));
        };
        let header = decode_json_part(header)?;
        let payload = decode_json_part(payload)?;

        let iss = match payload.get("iss") {
            Some(Value::String(iss)) => iss,
            None | Some(Value::Null) => return Err(AuthError::MissingClaim("iss".to_owned())),
            Some(_) => return Err(AuthError::InvalidClaim("iss".to_owned())),
        };
        let state = self.snapshot();
        let issuer = state.issuers.get(iss).ok_or(AuthError::UnknownIssuer)?;

        let alg = match header.get("alg") {
            Some(Value::String(alg)) => {
                Algorithm::from_str(alg).map_err(|_| AuthError::AlgorithmNotAllowed)?
            }
            _ => return Err(AuthError::Malformed("header has no string `alg`")),
        };
        if !issuer.keys.iter().any(|k| k.algorithms.contains(&alg)) {
            return Err(AuthError::AlgorithmNotAllowed);
        }
        let kid = match header.get("kid") {
            None | Some(Value::Null) => None,
            Some(Value::String(kid)) => Some(kid.as_str()),
            Some(_) => return Err(AuthError::Malformed("header `kid` is not a string")),
        };

        let mut named: Vec<&VerifyKey> = issuer.keys.iter().collect();
        if issuer.select_by_kid
            && let Some(kid) = kid
        {
            named.retain(|k| k.kid.as_deref() == Some(kid));
            if named.is_empty() {
                return Err(AuthError::UnknownKey);
            }
        }
        let mut candidates = named
            .into_iter()
            .filter(|k| k.algorithms.contains(&alg))
            .peekable();
        if candidates.peek().is_none() {
            return Err(AuthError::AlgorithmNotAllowed);
        }
        for key in candidates {
            match jsonwebtoken::decode::<Map<String, Value>>(token, &key.key, &key.validation) {
                Ok(data) => return self.check_claims(&data.claims, iss, &state, now_unix),
                Err(err) if matches!(err.kind(), ErrorKind::InvalidSignature) => {}
                Err(err) => return Err(map_library_error(err.kind())),
            }
        }
        Err(AuthError::BadSignature)
    }

    fn snapshot(&self) -> Arc<KeyState> {
        Arc::clone(&self.state.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// The checks on a signature-verified claim set that the library does not make with
    /// our clock (times, `sub`, `jti`, groups, lifetime, deny list).
    fn check_claims(
        &self,
        claims: &Map<String, Value>,
        issuer: &str,
        state: &KeyState,
        now: u64,
    ) -> Result<Principal, AuthError> {
        let leeway = self.config.leeway_secs;
        let exp = numeric_claim(claims, "exp", Round::Down)?
            .ok_or_else(|| AuthError::MissingClaim("exp".to_owned()))?;
        let nbf = numeric_claim(claims, "nbf", Round::Up)?;
        let iat = numeric_claim(claims, "iat", Round::Down)?;
        if now > exp.saturating_add(leeway) {
            return Err(AuthError::Expired);
        }
        if let Some(nbf) = nbf
            && nbf > now.saturating_add(leeway)
        {
            return Err(AuthError::NotYetValid);
        }
        let subject = match claims.get("sub") {
            Some(Value::String(sub)) if !sub.is_empty() => sub.clone(),
            None | Some(Value::Null) => return Err(AuthError::MissingClaim("sub".to_owned())),
            Some(_) => return Err(AuthError::InvalidClaim("sub".to_owned())),
        };
        let jti = match claims.get("jti") {
            None | Some(Value::Null) => None,
            Some(Value::String(jti)) if !jti.is_empty() => Some(jti.clone()),
            Some(_) => return Err(AuthError::InvalidClaim("jti".to_owned())),
        };
        let mut groups = parse_groups(claims.get(&self.config.groups_claim))
            .ok_or_else(|| AuthError::InvalidClaim(self.config.groups_claim.clone()))?;
        let group_bytes: usize = groups.iter().map(String::len).sum();
        if groups.len() > self.config.max_groups || group_bytes > self.config.max_groups_bytes {
            return Err(AuthError::TooManyGroups);
        }
        // Sorted and without repeats: group checks merge sorted lists
        // (`policy::shares_group`).
        groups.sort();
        groups.dedup();
        let lifetime = exp.saturating_sub(iat.map_or(now, |iat| iat.min(now)));
        if lifetime > self.config.max_unrevocable_lifetime_secs && jti.is_none() {
            return Err(AuthError::LifetimeNeedsJti);
        }
        if let Some(jti) = &jti
            && state.deny_list.contains(jti)
        {
            return Err(AuthError::Revoked);
        }
        Ok(Principal {
            issuer: issuer.to_owned(),
            subject,
            groups,
            expires_at: exp,
            jti,
        })
    }
}

/// Base64url-decodes one JWS part and parses it as a JSON object.
fn decode_json_part(part: &str) -> Result<Map<String, Value>, AuthError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(part)
        .map_err(|_| AuthError::Malformed("a part is not base64url"))?;
    match serde_json::from_slice(&bytes) {
        Ok(Value::Object(map)) => Ok(map),
        _ => Err(AuthError::Malformed("a part is not a JSON object")),
    }
}

/// Maps a `jsonwebtoken` error (other than a bad signature) to our refusal.
fn map_library_error(kind: &ErrorKind) -> AuthError {
    match kind {
        ErrorKind::InvalidSignature => AuthError::BadSignature,
        ErrorKind::InvalidAudience => AuthError::WrongAudience,
        ErrorKind::InvalidIssuer => AuthError::UnknownIssuer,
        ErrorKind::ExpiredSignature => AuthError::Expired,
        ErrorKind::ImmatureSignature => AuthError::NotYetValid,
        ErrorKind::MissingRequiredClaim(claim) => AuthError::MissingClaim(claim.clone()),
        ErrorKind::InvalidClaimFormat(claim) => AuthError::InvalidClaim(claim.clone()),
        ErrorKind::InvalidAlgorithm
        | ErrorKind::MissingAlgorithm
        | ErrorKind::UnsupportedAlgorithm => AuthError::AlgorithmNotAllowed,
        _ => AuthError::Malformed("token rejected by the JWT library"),
    }
}

#[derive(Clone, Copy)]
enum Round {
    Down,
    Up,
}

/// Reads a NumericDate claim: absent or `null` → `None`; a non-negative number → seconds
/// (fractions rounded as asked); anything else → [`AuthError::InvalidClaim`].
fn numeric_claim(
    claims: &Map<String, Value>,
    name: &str,
    round: Round,
) -> Result<Option<u64>, AuthError> {
    let invalid = || AuthError::InvalidClaim(name.to_owned());
    match claims.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => {
            if let Some(secs) = n.as_u64() {
                return Ok(Some(secs));
            }
            let f = n.as_f64().ok_or_else(invalid)?;
            let f = match round {
                Round::Down => f.floor(),
                Round::Up => f.ceil(),
            };
            if f.is_finite() && (0.0..18_446_744_073_709_549_568.0).contains(&f) {
                // In range and integral, so the cast is exact.
                Ok(Some(f as u64))
            } else {
                Err(invalid())
            }
        }
        Some(_) => Err(invalid()),
    }
}

/// Parses the groups claim: absent/`null` → none; a string → that one group (none if
/// empty); an array of strings → those groups; anything else → `None` (invalid).
fn parse_groups(value: Option<&Value>) -> Option<Vec<String>> {
    match value {
        None | Some(Value::Null) => Some(Vec::new()),
        Some(Value::String(group)) if group.is_empty() => Some(Vec::new()),
        Some(Value::String(group)) => Some(vec![group.clone()]),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| item.as_str().map(str::to_owned))
            .collect(),
        Some(_) => None,
    }
}

/// The keys of one issuer, from its key source.
fn load_issuer(issuer: &IssuerConfig) -> Result<IssuerKeys, AuthConfigError> {
    let (select_by_kid, keys) = match &issuer.keys {
        KeySource::Hs256 { secret_file } => (false, vec![load_hs256(secret_file)?]),
        KeySource::Pem { algorithm, files } => (
            false,
            files
                .iter()
                .map(|file| load_pem(file, algorithm.algorithm()))
                .collect::<Result<_, _>>()?,
        ),
        KeySource::Jwks { file } => (true, load_jwks(file)?),
    };
    let keys = keys
        .into_iter()
        .map(|(kid, key, algorithms)| {
            let validation = validation_for(&algorithms, issuer);
            VerifyKey {
                kid,
                key,
                algorithms,
                validation,
            }
        })
        .collect();
    Ok(IssuerKeys {
        select_by_kid,
        keys,
    })
}

/// The configured deny list (empty without a file).
fn load_deny(config: &AuthConfig) -> Result<HashSet<String>, AuthConfigError> {
    match &config.deny_list_file {
        Some(path) => load_deny_list(path),
        None => Ok(HashSet::new()),
    }
}

fn log_loaded(issuers: &HashMap<String, Arc<IssuerKeys>>, deny_list: &HashSet<String>) {
    tracing::debug!(
        issuers = issuers.len(),
        keys = issuers.values().map(|i| i.keys.len()).sum::<usize>(),
        revoked_jtis = deny_list.len(),
        "auth keys and deny list loaded"
    );
}

/// The library-side checks for one key: its algorithms, `iss`, and a required `aud` that
/// must intersect the issuer's audiences. Times are checked by us with the caller's clock.
fn validation_for(algorithms: &[Algorithm], issuer: &IssuerConfig) -> Validation {
    let mut validation = Validation::new(Algorithm::RS256);
    validation.algorithms = algorithms.to_vec();
    validation.set_required_spec_claims(&["iss", "aud"]);
    validation.set_issuer(&[issuer.issuer.as_str()]);
    validation.set_audience(&issuer.audience);
    validation.validate_aud = true;
    validation.validate_exp = false;
    validation.validate_nbf = false;
    validation.leeway = 0;
    validation
}

type LoadedKey = (Option<String>, DecodingKey, Vec<Algorithm>);

fn read_file(path: &Path) -> Result<Vec<u8>, AuthConfigError> {
    std::fs::read(path).map_err(|source| AuthConfigError::Read {
        path: path.to_owned(),
        source,
    })
}

fn key_error(path: &Path, problem: impl Into<String>) -> AuthConfigError {
    AuthConfigError::Key {
        path: path.to_owned(),
        problem: problem.into(),
    }
}

fn load_hs256(path: &Path) -> Result<LoadedKey, AuthConfigError> {
    let secret = token::trim_newlines(read_file(path)?);
    if secret.len() < MIN_HS256_SECRET_BYTES {
        return Err(key_error(
            path,
            format!(
                "HS256 secret has {} bytes; at least {MIN_HS256_SECRET_BYTES} are required",
                secret.len()
            ),
        ));
    }
    let key = DecodingKey::from_secret(&secret).map_err(|e| key_error(path, e.to_string()))?;
    Ok((None, key, vec![Algorithm::HS256]))
}

fn load_pem(path: &Path, alg: Algorithm) -> Result<LoadedKey, AuthConfigError> {
    let bytes = read_file(path)?;
    let text = String::from_utf8_lossy(&bytes);
    let labels: Vec<&str> = text
        .lines()
        .filter_map(|line| line.trim().strip_prefix("-----BEGIN "))
        .collect();
    match labels.as_slice() {
        [] => return Err(key_error(path, "no PEM block found")),
        [label] if label.contains("PRIVATE") => {
            return Err(key_error(
                path,
                "holds a private key; give the relay the public key only",
            ));
        }
        [label] if !matches!(label.trim_end_matches('-'), "PUBLIC KEY" | "RSA PUBLIC KEY") => {
            return Err(key_error(
                path,
                "expected a `PUBLIC KEY` or `RSA PUBLIC KEY` PEM block",
            ));
        }
        [_] => {}
        more => {
            return Err(key_error(
                path,
                format!(
                    "holds {} PEM blocks; put one public key per file",
                    more.len()
                ),
            ));
        }
    }
    let (key, kind) = match alg.family() {
        AlgorithmFamily::Rsa => (DecodingKey::from_rsa_pem(&bytes), "RSA"),
        AlgorithmFamily::Ec => (DecodingKey::from_ec_pem(&bytes), "EC"),
        AlgorithmFamily::Ed => (DecodingKey::from_ed_pem(&bytes), "Ed25519"),
        AlgorithmFamily::Hmac => {
            return Err(key_error(path, "HMAC keys cannot come from PEM files"));
        }
    };
    let key = key.map_err(|e| {
        key_error(
            path,
            format!("not a {kind} public key usable for {alg:?} ({e})"),
        )
    })?;
    probe_key(&key, alg).map_err(|problem| key_error(path, problem))?;
    Ok((None, key, vec![alg]))
}

/// Checks at load time that `key` can verify `alg` signatures (right curve, parsable DER).
fn probe_key(key: &DecodingKey, alg: Algorithm) -> Result<(), String> {
    let provider = CryptoProvider::try_get_default().ok_or("no crypto backend")?;
    (provider.verifier_factory)(&alg, key)
        .map_err(|e| format!("key cannot verify {alg:?} signatures ({e})"))?;
    if alg.family() == AlgorithmFamily::Rsa
        && let Ok(der) = key.try_get_as_bytes()
    {
        (provider.key_utils.rsa_pub_components_from_public_key)(der)
            .map_err(|e| format!("not a valid RSA public key ({e})"))?;
    }
    Ok(())
}

fn load_jwks(path: &Path) -> Result<Vec<LoadedKey>, AuthConfigError> {
    let bytes = read_file(path)?;
    let doc: Value = serde_json::from_slice(&bytes)
        .map_err(|e| key_error(path, format!("not valid JSON ({e})")))?;
    let entries = doc
        .get("keys")
        .and_then(Value::as_array)
        .ok_or_else(|| key_error(path, "no `keys` array (expected a JWKS document)"))?;
    let mut keys = Vec::new();
    for (index, entry) in entries.iter().enumerate() {
        let kid = entry.get("kid").and_then(Value::as_str).map(str::to_owned);
        let name = match &kid {
            Some(kid) => format!("key #{index} (kid {kid:?})"),
            None => format!("key #{index}"),
        };
        if let Some(key) = load_jwk(entry, &name).map_err(|problem| key_error(path, problem))? {
            keys.push((kid, key.0, key.1));
        }
    }
    if keys.is_empty() {
        return Err(key_error(path, "no usable signature verification key"));
    }
    Ok(keys)
}

/// Turns one JWKS entry into a key and its algorithms; `Ok(None)` for an entry that is
/// skipped (not a signature key we support), `Err` for one that must fail the load.
fn load_jwk(entry: &Value, name: &str) -> Result<Option<(DecodingKey, Vec<Algorithm>)>, String> {
    let skip = |why: &str| {
        tracing::warn!(key = name, reason = why, "JWKS entry skipped");
        Ok(None)
    };
    if entry.get("kty").and_then(Value::as_str) == Some("oct") {
        return Err(format!(
            "{name} is an `oct` (shared-secret) key; HMAC keys are accepted only from an explicit `hs256` key source"
        ));
    }
    if let Some(key_use) = entry.get("use")
        && key_use.as_str() != Some("sig")
    {
        return skip("`use` is not `sig`");
    }
    if let Some(ops) = entry.get("key_ops")
        && !ops
            .as_array()
            .is_some_and(|ops| ops.iter().any(|op| op.as_str() == Some("verify")))
    {
        return skip("`key_ops` lacks `verify`");
    }
    let alg = match entry.get("alg") {
        None | Some(Value::Null) => None,
        Some(Value::String(alg)) if alg.starts_with("HS") => {
            return Err(format!(
                "{name} names the HMAC algorithm {alg}; HMAC is not accepted from a JWKS"
            ));
        }
        Some(Value::String(alg)) => match Algorithm::from_str(alg) {
            Ok(alg) => Some(alg),
            Err(_) => return skip("`alg` is not a supported JWS algorithm"),
        },
        Some(_) => return Err(format!("{name} has a non-string `alg`")),
    };
    let jwk: Jwk = serde_json::from_value(entry.clone())
        .map_err(|e| format!("{name} is not a valid JWK ({e})"))?;
    let family_algs: Vec<Algorithm> = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => AlgorithmFamily::Rsa.algorithms().to_vec(),
        AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
            EllipticCurve::P256 => vec![Algorithm::ES256],
            EllipticCurve::P384 => vec![Algorithm::ES384],
            _ => return skip("unsupported elliptic curve"),
        },
        AlgorithmParameters::OctetKeyPair(okp) => match okp.curve {
            EllipticCurve::Ed25519 => vec![Algorithm::EdDSA],
            _ => return skip("unsupported OKP curve"),
        },
        AlgorithmParameters::OctetKey(_) => {
            return Err(format!("{name} is a shared-secret key; refused"));
        }
        _ => return skip("unsupported key type"),
    };
    let algorithms = match alg {
        Some(alg) if family_algs.contains(&alg) => vec![alg],
        Some(alg) => return Err(format!("{name}: `alg` {alg:?} does not match its key type")),
        None => family_algs,
    };
    let key = DecodingKey::from_jwk(&jwk).map_err(|e| format!("{name} is not usable ({e})"))?;
    for alg in &algorithms {
        probe_key(&key, *alg).map_err(|problem| format!("{name}: {problem}"))?;
    }
    Ok(Some((key, algorithms)))
}

fn load_deny_list(path: &Path) -> Result<HashSet<String>, AuthConfigError> {
    let bytes = read_file(path)?;
    let text = String::from_utf8(bytes).map_err(|_| key_error(path, "deny list is not UTF-8"))?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(str::to_owned)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use serde_json::json;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            let name = http::HeaderName::from_bytes(name.as_bytes()).unwrap();
            map.append(name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    fn issuer_json() -> Value {
        json!({
            "issuer": "https://idp.example",
            "audience": ["ahp-relay"],
            "keys": {"type": "jwks", "file": "/etc/ahp/jwks.json"}
        })
    }

    #[test]
    fn config_defaults_and_key_source_forms() {
        let cfg: AuthConfig = serde_json::from_value(json!({
            "issuers": [
                issuer_json(),
                {"issuer": "dev", "audience": ["a"], "keys": {"type": "hs256", "secret_file": "/s"}},
                {"issuer": "pem", "audience": ["a"],
                 "keys": {"type": "pem", "algorithm": "ES256", "files": ["/k.pem"]}}
            ]
        }))
        .unwrap();
        assert_eq!(cfg.leeway_secs, 25);
        assert_eq!(cfg.groups_claim, "groups");
        assert!(cfg.allow_query_token);
        assert_eq!(cfg.max_unrevocable_lifetime_secs, 3600);
        assert_eq!(cfg.deny_list_file, None);
        assert_eq!(
            cfg.issuers[2].keys,
            KeySource::Pem {
                algorithm: PemAlgorithm::Es256,
                files: vec![PathBuf::from("/k.pem")]
            }
        );
        cfg.validate().unwrap();
    }

    #[test]
    fn config_rejects_unknown_fields_and_algorithms() {
        let unknown_top = json!({"issuers": [issuer_json()], "leeway": 3});
        assert!(serde_json::from_value::<AuthConfig>(unknown_top).is_err());
        let mut unknown_in_keys = issuer_json();
        unknown_in_keys["keys"]["url"] = json!("https://idp/jwks");
        assert!(serde_json::from_value::<IssuerConfig>(unknown_in_keys).is_err());
        let hs_via_pem = json!({"type": "pem", "algorithm": "HS256", "files": ["/k"]});
        assert!(serde_json::from_value::<KeySource>(hs_via_pem).is_err());
        let no_audience = json!({"issuer": "x", "keys": {"type": "jwks", "file": "/j"}});
        assert!(serde_json::from_value::<IssuerConfig>(no_audience).is_err());
    }

    #[test]
    fn config_validation_rules() {
        let base: AuthConfig = serde_json::from_value(json!({"issuers": [issuer_json()]})).unwrap();
        let check = |f: &dyn Fn(&mut AuthConfig)| {
            let mut cfg = base.clone();
            f(&mut cfg);
            cfg.validate()
        };
        assert!(check(&|c| c.leeway_secs = 300).is_ok());
        assert!(check(&|c| c.leeway_secs = 301).is_err());
        assert!(check(&|c| c.issuers.clear()).is_err());
        assert!(check(&|c| c.issuers[0].audience.clear()).is_err());
        assert!(check(&|c| c.issuers[0].audience.push(String::new())).is_err());
        assert!(check(&|c| c.issuers.push(c.issuers[0].clone())).is_err());
        assert!(check(&|c| c.groups_claim.clear()).is_err());
        assert!(
            check(&|c| c.issuers[0].keys = KeySource::Pem {
                algorithm: PemAlgorithm::Rs256,
                files: vec![]
            })
            .is_err()
        );
        let err = check(&|c| c.leeway_secs = 400).unwrap_err().to_string();
        assert!(err.contains("leeway_secs = 400"), "{err}");
    }

    #[test]
    fn error_status_reason_and_challenge() {
        use AuthError::*;
        let all = [
            MissingToken,
            ConflictingTokens,
            Malformed("x"),
            UnknownIssuer,
            AlgorithmNotAllowed,
            UnknownKey,
            BadSignature,
            Expired,
            NotYetValid,
            WrongAudience,
            MissingClaim("sub".into()),
            InvalidClaim("groups".into()),
            LifetimeNeedsJti,
            Revoked,
        ];
        let mut reasons = HashSet::new();
        for err in &all {
            let status = err.status();
            match err {
                ConflictingTokens => assert_eq!(status, StatusCode::BAD_REQUEST),
                Revoked => assert_eq!(status, StatusCode::FORBIDDEN),
                _ => assert_eq!(status, StatusCode::UNAUTHORIZED),
            }
            assert_eq!(
                err.www_authenticate().is_some(),
                status != StatusCode::FORBIDDEN
            );
            let reason = err.reason();
            assert!(
                reason.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{reason}"
            );
            assert!(reasons.insert(reason), "duplicate reason {reason}");
        }
        assert_eq!(
            MissingToken.www_authenticate(),
            Some("Bearer realm=\"ahp-relay\"")
        );
        assert!(
            Expired
                .www_authenticate()
                .unwrap()
                .contains("invalid_token")
        );
    }

    #[test]
    fn extract_from_each_place() {
        let h = headers(&[("authorization", "bEaReR abc.def.ghi")]);
        assert_eq!(
            extract_token(&h, None, true).unwrap(),
            Some(("abc.def.ghi".into(), TokenSource::AuthorizationHeader))
        );
        let h = headers(&[("sec-websocket-protocol", "bearer, abc.def.ghi")]);
        assert_eq!(
            extract_token(&h, None, true).unwrap(),
            Some(("abc.def.ghi".into(), TokenSource::Subprotocol))
        );
        let h = HeaderMap::new();
        assert_eq!(
            extract_token(&h, Some("a=1&tkn=abc%2Edef.ghi"), true).unwrap(),
            Some(("abc.def.ghi".into(), TokenSource::QueryTkn))
        );
        assert_eq!(
            extract_token(&h, Some("access_token=abc.def.ghi"), true).unwrap(),
            Some(("abc.def.ghi".into(), TokenSource::QueryAccessToken))
        );
        assert_eq!(
            extract_token(&h, Some("tkn=abc.def.ghi"), false).unwrap(),
            None
        );
        assert_eq!(extract_token(&h, None, true).unwrap(), None);
        let basic = headers(&[("authorization", "Basic dXNlcjpwdw==")]);
        assert_eq!(extract_token(&basic, None, true).unwrap(), None);
        let other_proto = headers(&[("sec-websocket-protocol", "ahp.v1, bearer")]);
        assert_eq!(extract_token(&other_proto, None, true).unwrap(), None);
    }

    #[test]
    fn extract_same_token_twice_is_fine_and_subprotocol_wins() {
        let h = headers(&[
            ("authorization", "Bearer t.o.k"),
            ("sec-websocket-protocol", "bearer"),
            ("sec-websocket-protocol", "t.o.k"),
        ]);
        assert_eq!(
            extract_token(&h, Some("tkn=t.o.k&access_token=t.o.k"), true).unwrap(),
            Some(("t.o.k".into(), TokenSource::Subprotocol))
        );
    }

    #[test]
    fn extract_conflicts_and_malformed() {
        let h = headers(&[("authorization", "Bearer a.b.c")]);
        assert_eq!(
            extract_token(&h, Some("tkn=x.y.z"), true),
            Err(AuthError::ConflictingTokens)
        );
        // A differing query token is not looked at when query tokens are off.
        assert!(
            extract_token(&h, Some("tkn=x.y.z"), false)
                .unwrap()
                .is_some()
        );
        let none = HeaderMap::new();
        assert_eq!(
            extract_token(&none, Some("tkn=a&tkn=b"), true),
            Err(AuthError::ConflictingTokens)
        );
        let bad = [
            (headers(&[("authorization", "Bearer ")]), None),
            (headers(&[("authorization", "Bearer a b")]), None),
            (headers(&[("sec-websocket-protocol", "bearer")]), None),
            (HeaderMap::new(), Some("tkn=")),
            (HeaderMap::new(), Some("tkn=%zz")),
            (HeaderMap::new(), Some("access_token=%ff")),
        ];
        for (h, q) in bad {
            assert!(
                matches!(extract_token(&h, q, true), Err(AuthError::Malformed(_))),
                "{q:?}"
            );
        }
    }

    #[test]
    fn redact_query_hides_token_values_only() {
        assert_eq!(
            redact_query("a=1&tkn=secret&b=x%20y&access_token=s2&id_token=s3&TOKEN=s4&t%6Bn=s5"),
            "a=1&tkn=REDACTED&b=x%20y&access_token=REDACTED&id_token=REDACTED&TOKEN=REDACTED&t%6Bn=REDACTED"
        );
        assert_eq!(redact_query(""), "");
        assert_eq!(redact_query("tkn"), "tkn=REDACTED");
    }

    #[test]
    fn form_decoding() {
        assert_eq!(form_decode("a%2Bb+c").unwrap(), "a+b c");
        assert!(form_decode("%2").is_err());
        assert!(form_decode("%c3%28").is_err());
        assert_eq!(form_decode("%C3%A9").unwrap(), "é");
    }

    #[test]
    fn groups_claim_forms() {
        assert_eq!(parse_groups(None), Some(vec![]));
        assert_eq!(parse_groups(Some(&Value::Null)), Some(vec![]));
        assert_eq!(
            parse_groups(Some(&json!("ops"))),
            Some(vec!["ops".to_owned()])
        );
        assert_eq!(parse_groups(Some(&json!(""))), Some(vec![]));
        assert_eq!(
            parse_groups(Some(&json!(["a", "b"]))),
            Some(vec!["a".to_owned(), "b".to_owned()])
        );
        assert_eq!(parse_groups(Some(&json!(["a", 1]))), None);
        assert_eq!(parse_groups(Some(&json!({"a": 1}))), None);
    }

    #[test]
    fn numeric_dates() {
        let claims = json!({"a": 10, "b": 10.5, "c": -1, "d": "10", "e": null, "f": 1e300});
        let claims = claims.as_object().unwrap();
        assert_eq!(numeric_claim(claims, "a", Round::Down).unwrap(), Some(10));
        assert_eq!(numeric_claim(claims, "b", Round::Down).unwrap(), Some(10));
        assert_eq!(numeric_claim(claims, "b", Round::Up).unwrap(), Some(11));
        assert_eq!(numeric_claim(claims, "e", Round::Up).unwrap(), None);
        assert_eq!(numeric_claim(claims, "missing", Round::Up).unwrap(), None);
        for bad in ["c", "d", "f"] {
            assert_eq!(
                numeric_claim(claims, bad, Round::Down),
                Err(AuthError::InvalidClaim(bad.to_owned()))
            );
        }
    }

    #[test]
    fn jwk_entries_oct_refused_enc_skipped() {
        let oct =
            json!({"kty": "oct", "kid": "k", "k": "c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0"});
        let err = load_jwk(&oct, "key #0").unwrap_err();
        assert!(err.contains("oct"), "{err}");
        let hs_on_rsa = json!({"kty": "RSA", "alg": "HS256", "n": "AQAB", "e": "AQAB"});
        assert!(load_jwk(&hs_on_rsa, "key #1").is_err());
        let enc = json!({"kty": "RSA", "use": "enc", "n": "AQAB", "e": "AQAB"});
        assert!(load_jwk(&enc, "key #2").unwrap().is_none());
        let oaep = json!({"kty": "RSA", "alg": "RSA-OAEP", "n": "AQAB", "e": "AQAB"});
        assert!(load_jwk(&oaep, "key #3").unwrap().is_none());
        let x25519 = json!({"kty": "OKP", "crv": "X25519", "x": "AAAA"});
        assert!(load_jwk(&x25519, "key #4").unwrap().is_none());
    }

    #[test]
    fn library_errors_map_to_refusals() {
        assert_eq!(
            map_library_error(&ErrorKind::InvalidAudience),
            AuthError::WrongAudience
        );
        assert_eq!(
            map_library_error(&ErrorKind::MissingRequiredClaim("aud".into())),
            AuthError::MissingClaim("aud".into())
        );
        assert_eq!(
            map_library_error(&ErrorKind::InvalidAlgorithm),
            AuthError::AlgorithmNotAllowed
        );
        assert!(matches!(
            map_library_error(&ErrorKind::InvalidToken),
            AuthError::Malformed(_)
        ));
    }

    #[test]
    fn principal_key_is_issuer_and_subject() {
        let p = Principal {
            issuer: "i".into(),
            subject: "s".into(),
            groups: vec![],
            expires_at: 0,
            jti: None,
        };
        assert_eq!(p.key(), ("i".to_owned(), "s".to_owned()));
    }
}

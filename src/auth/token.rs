//! Minting HS256 tokens for the dev demo and the `ahp-relay token` subcommand.
//!
//! Tokens minted here verify against an issuer configured with an `hs256` key source of
//! the same secret (see [`super`]). A TTL above the issuer's
//! `max_unrevocable_lifetime_secs` needs a `jti`, or the relay refuses the token.

use std::time::Duration;

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::Serialize;

use super::MIN_HS256_SECRET_BYTES;

/// What to put in a minted token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MintRequest {
    /// The `iss` claim; must equal a configured issuer.
    pub issuer: String,
    /// The `aud` claim (a single string).
    pub audience: String,
    /// The `sub` claim.
    pub subject: String,
    /// The `groups` claim (always written, possibly as an empty array).
    pub groups: Vec<String>,
    /// Lifetime: `exp = now + ttl` (whole seconds, at least one).
    pub ttl: Duration,
    /// The `jti` claim, written only when given.
    pub jti: Option<String>,
}

/// Why a token could not be minted or a TTL parsed. Never contains the secret.
#[derive(Debug, thiserror::Error)]
pub enum MintError {
    /// The TTL text is not `<digits><s|m|h|d>` with a positive, representable value.
    #[error("invalid TTL {input:?}: {problem}")]
    InvalidTtl {
        /// The text given.
        input: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// The TTL is under one second, or `now + ttl` does not fit a unix time.
    #[error("the TTL must be at least 1 s and end before the year 292277026596")]
    TtlOutOfRange,
    /// The secret is shorter than [`MIN_HS256_SECRET_BYTES`].
    #[error("the HS256 secret has {0} bytes; at least {MIN_HS256_SECRET_BYTES} are required")]
    SecretTooShort(usize),
    /// A required text field is empty.
    #[error("`{0}` must not be empty")]
    EmptyField(&'static str),
    /// The JWT library failed to sign.
    #[error("signing failed: {0}")]
    Sign(#[from] jsonwebtoken::errors::Error),
}

#[derive(Serialize)]
struct Claims<'a> {
    iss: &'a str,
    sub: &'a str,
    aud: &'a str,
    iat: u64,
    nbf: u64,
    exp: u64,
    groups: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    jti: Option<&'a str>,
}

/// Signs an HS256 JWT with claims `iss`, `sub`, `aud`, `iat = nbf = now_unix`,
/// `exp = now_unix + ttl`, `groups`, and `jti` when given. Refuses a secret shorter than
/// [`MIN_HS256_SECRET_BYTES`], empty `issuer`/`audience`/`subject`/`jti`, and a TTL under
/// one second.
pub fn mint_hs256(secret: &[u8], req: &MintRequest, now_unix: u64) -> Result<String, MintError> {
    if secret.len() < MIN_HS256_SECRET_BYTES {
        return Err(MintError::SecretTooShort(secret.len()));
    }
    for (name, value) in [
        ("issuer", req.issuer.as_str()),
        ("audience", req.audience.as_str()),
        ("subject", req.subject.as_str()),
        ("jti", req.jti.as_deref().unwrap_or("-")),
    ] {
        if value.is_empty() {
            return Err(MintError::EmptyField(name));
        }
    }
    let ttl = req.ttl.as_secs();
    if ttl == 0 {
        return Err(MintError::TtlOutOfRange);
    }
    let exp = now_unix.checked_add(ttl).ok_or(MintError::TtlOutOfRange)?;
    let claims = Claims {
        iss: &req.issuer,
        sub: &req.subject,
        aud: &req.audience,
        iat: now_unix,
        nbf: now_unix,
        exp,
        groups: &req.groups,
        jti: req.jti.as_deref(),
    };
    let key = EncodingKey::from_secret(secret)?;
    Ok(jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &key,
    )?)
}

/// Parses a TTL such as `90s`, `15m`, `1h` or `7d`: decimal digits then one unit letter.
/// Zero, a missing unit, other units and values that overflow are refused.
pub fn parse_ttl(s: &str) -> Result<Duration, MintError> {
    let invalid = |problem| MintError::InvalidTtl {
        input: s.to_owned(),
        problem,
    };
    let unit_at = s.len().checked_sub(1).ok_or_else(|| invalid("empty"))?;
    let (digits, unit) = s
        .split_at_checked(unit_at)
        .ok_or_else(|| invalid("not ASCII"))?;
    let multiplier: u64 = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(invalid("expected a unit s, m, h or d at the end")),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid("expected decimal digits before the unit"));
    }
    let value: u64 = digits.parse().map_err(|_| invalid("number too large"))?;
    if value == 0 {
        return Err(invalid("must be positive"));
    }
    let secs = value
        .checked_mul(multiplier)
        .ok_or_else(|| invalid("number too large"))?;
    Ok(Duration::from_secs(secs))
}

/// The key bytes as the relay reads them: trailing newlines removed.
pub fn trim_newlines(mut s: Vec<u8>) -> Vec<u8> {
    while matches!(s.last(), Some(b'\n' | b'\r')) {
        s.pop();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use serde_json::{Value, json};

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn request() -> MintRequest {
        MintRequest {
            issuer: "ahp-relay-dev".into(),
            audience: "ahp-relay".into(),
            subject: "alice".into(),
            groups: vec!["dev".into()],
            ttl: Duration::from_secs(900),
            jti: None,
        }
    }

    fn payload(token: &str) -> Value {
        let part = token.split('.').nth(1).unwrap();
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(part).unwrap()).unwrap()
    }

    #[test]
    fn ttl_forms() {
        assert_eq!(parse_ttl("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_ttl("15m").unwrap(), Duration::from_secs(900));
        assert_eq!(parse_ttl("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_ttl("7d").unwrap(), Duration::from_secs(604_800));
        for bad in [
            "",
            "s",
            "10",
            "0s",
            "1w",
            "-1s",
            "+1s",
            "1.5h",
            "1 h",
            "99999999999999999999d",
            "é",
        ] {
            assert!(parse_ttl(bad).is_err(), "{bad:?}");
        }
        assert!(parse_ttl("1m").unwrap() < parse_ttl("61s").unwrap());
    }

    #[test]
    fn minted_claims() {
        let mut req = request();
        let token = mint_hs256(SECRET, &req, 1_000).unwrap();
        assert_eq!(
            payload(&token),
            json!({"iss": "ahp-relay-dev", "sub": "alice", "aud": "ahp-relay", "iat": 1000,
                   "nbf": 1000, "exp": 1900, "groups": ["dev"]})
        );
        req.jti = Some("j-1".into());
        let token = mint_hs256(SECRET, &req, 1_000).unwrap();
        assert_eq!(payload(&token)["jti"], "j-1");
        let header = token.split('.').next().unwrap();
        let header: Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(header).unwrap()).unwrap();
        assert_eq!(header["alg"], "HS256");
    }

    #[test]
    fn mint_refusals() {
        assert!(matches!(
            mint_hs256(b"short", &request(), 0),
            Err(MintError::SecretTooShort(5))
        ));
        let mut req = request();
        req.subject.clear();
        assert!(matches!(
            mint_hs256(SECRET, &req, 0),
            Err(MintError::EmptyField("subject"))
        ));
        let mut req = request();
        req.jti = Some(String::new());
        assert!(matches!(
            mint_hs256(SECRET, &req, 0),
            Err(MintError::EmptyField("jti"))
        ));
        let mut req = request();
        req.ttl = Duration::from_millis(999);
        assert!(matches!(
            mint_hs256(SECRET, &req, 0),
            Err(MintError::TtlOutOfRange)
        ));
        assert!(matches!(
            mint_hs256(SECRET, &request(), u64::MAX),
            Err(MintError::TtlOutOfRange)
        ));
    }

    #[test]
    fn errors_never_show_the_secret() {
        let err = mint_hs256(b"short-secret", &request(), 0).unwrap_err();
        assert!(!err.to_string().contains("short-secret"));
        assert!(!format!("{err:?}").contains("short-secret"));
    }
}

//! Edge authentication cases (contract §3.2–§3.4, acceptance scenario S9 at the verifier
//! level): every refusal of S9 with its status, acceptance from the four token places,
//! key families, JWKS, reload and the deny list. Keys are the test-only pairs in
//! `fixtures/keys/`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ahp_relay::auth::token::{MintRequest, mint_hs256};
use ahp_relay::auth::{
    AuthConfig, AuthError, Authenticator, IssuerConfig, KeySource, PemAlgorithm, TokenSource,
    extract_token, redact_query,
};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::{HeaderMap, HeaderValue, StatusCode};
use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{Algorithm, AlgorithmFamily, EncodingKey, Header};
use serde_json::{Value, json};

const NOW: u64 = 1_800_000_000;
const AUD: &str = "ahp-relay";
const RSA_ISS: &str = "https://rsa.example";
const EC_ISS: &str = "https://ec.example";
const ED_ISS: &str = "https://ed.example";
const JWKS_ISS: &str = "https://jwks.example";
const DEV_ISS: &str = "ahp-relay-dev";
const HS_SECRET: &str = "dev-secret-dev-secret-dev-secret-0123";

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/keys")
        .join(name)
}

fn read_fixture(name: &str) -> String {
    std::fs::read_to_string(fixture(name)).unwrap()
}

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ahp-auth-cases-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn write(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, contents).unwrap();
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn encoding_key(alg: Algorithm, key: &str) -> EncodingKey {
    match alg.family() {
        AlgorithmFamily::Rsa => EncodingKey::from_rsa_pem(key.as_bytes()),
        AlgorithmFamily::Ec => EncodingKey::from_ec_pem(key.as_bytes()),
        AlgorithmFamily::Ed => EncodingKey::from_ed_pem(key.as_bytes()),
        AlgorithmFamily::Hmac => EncodingKey::from_secret(key.as_bytes()),
    }
    .unwrap()
}

fn sign(alg: Algorithm, key: &str, kid: Option<&str>, claims: &Value) -> String {
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(&header, claims, &encoding_key(alg, key)).unwrap()
}

/// Signs an arbitrary header and payload with the RSA fixture key (RS256).
fn sign_raw(header: &Value, claims: &Value) -> String {
    let message = format!("{}.{}", b64(header), b64(claims));
    let key = encoding_key(Algorithm::RS256, &read_fixture("rsa_private.pem"));
    let signature = jsonwebtoken::crypto::sign(message.as_bytes(), &key, Algorithm::RS256).unwrap();
    format!("{message}.{signature}")
}

fn rsa(claims: &Value) -> String {
    sign(
        Algorithm::RS256,
        &read_fixture("rsa_private.pem"),
        None,
        claims,
    )
}

fn claims(iss: &str) -> Value {
    json!({"iss": iss, "sub": "alice", "aud": AUD, "iat": NOW, "exp": NOW + 600, "groups": ["dev"]})
}

fn with(mut claims: Value, key: &str, value: Value) -> Value {
    claims[key] = value;
    claims
}

fn without(mut claims: Value, key: &str) -> Value {
    claims.as_object_mut().unwrap().remove(key);
    claims
}

fn b64(value: &Value) -> String {
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(value).unwrap())
}

fn jwk(alg: Algorithm, private_pem: &str, kid: &str) -> Value {
    let mut jwk = Jwk::from_encoding_key(&encoding_key(alg, private_pem), alg).unwrap();
    jwk.common.key_id = Some(kid.to_owned());
    serde_json::to_value(jwk).unwrap()
}

fn jwks(keys: Vec<Value>) -> String {
    json!({ "keys": keys }).to_string()
}

/// `r1`: RSA with `alg: RS256` (only RS256); `r2`: RSA without `alg` (any RS*/PS*);
/// `e1`: P-256 without `alg` (ES256 by its curve).
fn standard_jwks() -> String {
    let no_alg = |mut jwk: Value| {
        jwk.as_object_mut().unwrap().remove("alg");
        jwk
    };
    jwks(vec![
        jwk(Algorithm::RS256, &read_fixture("rsa_private.pem"), "r1"),
        no_alg(jwk(
            Algorithm::RS256,
            &read_fixture("rsa2_private.pem"),
            "r2",
        )),
        no_alg(jwk(
            Algorithm::ES256,
            &read_fixture("ec_p256_private.pem"),
            "e1",
        )),
    ])
}

fn pem_issuer(issuer: &str, algorithm: PemAlgorithm, files: Vec<PathBuf>) -> IssuerConfig {
    IssuerConfig {
        issuer: issuer.to_owned(),
        audience: vec![AUD.to_owned(), "other-aud".to_owned()],
        keys: KeySource::Pem { algorithm, files },
    }
}

fn config(dir: &TempDir) -> AuthConfig {
    AuthConfig {
        issuers: vec![
            pem_issuer(
                RSA_ISS,
                PemAlgorithm::Rs256,
                vec![fixture("rsa_public.pem")],
            ),
            pem_issuer(
                EC_ISS,
                PemAlgorithm::Es256,
                vec![fixture("ec_p256_public.pem")],
            ),
            pem_issuer(
                ED_ISS,
                PemAlgorithm::EdDsa,
                vec![fixture("ed25519_public.pem")],
            ),
            IssuerConfig {
                issuer: JWKS_ISS.to_owned(),
                audience: vec![AUD.to_owned()],
                keys: KeySource::Jwks {
                    file: dir.write("jwks.json", &standard_jwks()),
                },
            },
            IssuerConfig {
                issuer: DEV_ISS.to_owned(),
                audience: vec![AUD.to_owned()],
                keys: KeySource::Hs256 {
                    secret_file: dir.write("hs.secret", &format!("{HS_SECRET}\n")),
                },
            },
        ],
        leeway_secs: 25,
        groups_claim: "groups".to_owned(),
        allow_query_token: true,
        max_unrevocable_lifetime_secs: 3600,
        deny_list_file: Some(dir.write("deny.txt", "# revoked tokens\n\n  revoked-1  \n")),
        max_groups: ahp_relay::auth::DEFAULT_MAX_GROUPS,
        max_groups_bytes: ahp_relay::auth::DEFAULT_MAX_GROUPS_BYTES,
    }
}

fn setup() -> (TempDir, Authenticator) {
    let dir = TempDir::new();
    let auth = Authenticator::load(&config(&dir)).unwrap();
    (dir, auth)
}

fn refused(auth: &Authenticator, token: &str) -> AuthError {
    auth.verify(token, NOW).expect_err("token must be refused")
}

// ----- acceptance -----------------------------------------------------------------------

#[test]
fn accepts_every_key_family() {
    let (_dir, auth) = setup();
    let cases = [
        rsa(&claims(RSA_ISS)),
        sign(
            Algorithm::ES256,
            &read_fixture("ec_p256_private.pem"),
            None,
            &claims(EC_ISS),
        ),
        sign(
            Algorithm::EdDSA,
            &read_fixture("ed25519_private.pem"),
            None,
            &claims(ED_ISS),
        ),
        sign(
            Algorithm::RS256,
            &read_fixture("rsa_private.pem"),
            Some("r1"),
            &claims(JWKS_ISS),
        ),
        sign(
            Algorithm::PS256,
            &read_fixture("rsa2_private.pem"),
            Some("r2"),
            &claims(JWKS_ISS),
        ),
        sign(
            Algorithm::ES256,
            &read_fixture("ec_p256_private.pem"),
            Some("e1"),
            &claims(JWKS_ISS),
        ),
        sign(Algorithm::HS256, HS_SECRET, None, &claims(DEV_ISS)),
    ];
    for (i, token) in cases.iter().enumerate() {
        let principal = auth
            .verify(token, NOW)
            .unwrap_or_else(|e| panic!("case {i}: {e:?}"));
        assert_eq!(principal.subject, "alice");
        assert_eq!(principal.groups, vec!["dev".to_owned()]);
        assert_eq!(principal.expires_at, NOW + 600);
        assert_eq!(principal.jti, None);
    }
}

#[test]
fn principal_is_issuer_and_subject() {
    let (_dir, auth) = setup();
    let a = auth.verify(&rsa(&claims(RSA_ISS)), NOW).unwrap();
    let ec_token = sign(
        Algorithm::ES256,
        &read_fixture("ec_p256_private.pem"),
        None,
        &claims(EC_ISS),
    );
    let b = auth.verify(&ec_token, NOW).unwrap();
    assert_eq!(a.subject, b.subject);
    assert_ne!(
        a.key(),
        b.key(),
        "same sub from two issuers are two principals"
    );
    assert_eq!(a.key(), (RSA_ISS.to_owned(), "alice".to_owned()));
}

#[test]
fn accepts_token_from_each_place() {
    let (_dir, auth) = setup();
    let token = rsa(&claims(RSA_ISS));
    let mut auth_header = HeaderMap::new();
    auth_header.insert(
        "authorization",
        HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
    );
    let mut proto = HeaderMap::new();
    proto.insert(
        "sec-websocket-protocol",
        HeaderValue::from_str(&format!("bearer, {token}")).unwrap(),
    );
    let empty = HeaderMap::new();
    let cases = [
        (&auth_header, None, TokenSource::AuthorizationHeader),
        (&proto, None, TokenSource::Subprotocol),
        (
            &empty,
            Some(format!("x=1&tkn={token}")),
            TokenSource::QueryTkn,
        ),
        (
            &empty,
            Some(format!("access_token={token}")),
            TokenSource::QueryAccessToken,
        ),
    ];
    for (headers, query, expected) in cases {
        let (found, source) = extract_token(headers, query.as_deref(), true)
            .unwrap()
            .unwrap();
        assert_eq!(source, expected);
        assert_eq!(auth.verify(&found, NOW).unwrap().subject, "alice");
    }
    // Query tokens are ignored when disabled: the request then has no token (401).
    let query = format!("tkn={token}");
    assert_eq!(extract_token(&empty, Some(&query), false).unwrap(), None);
}

#[test]
fn minted_dev_token_round_trips() {
    let (_dir, auth) = setup();
    let req = MintRequest {
        issuer: DEV_ISS.into(),
        audience: AUD.into(),
        subject: "bob".into(),
        groups: vec!["a".into(), "b".into()],
        ttl: Duration::from_secs(900),
        jti: None,
    };
    let principal = auth
        .verify(&mint_hs256(HS_SECRET.as_bytes(), &req, NOW).unwrap(), NOW)
        .unwrap();
    assert_eq!(principal.key(), (DEV_ISS.to_owned(), "bob".to_owned()));
    assert_eq!(principal.groups, vec!["a".to_owned(), "b".to_owned()]);
    // A week-long dev token needs a jti.
    let week = MintRequest {
        ttl: Duration::from_secs(7 * 86_400),
        ..req.clone()
    };
    let token = mint_hs256(HS_SECRET.as_bytes(), &week, NOW).unwrap();
    assert_eq!(refused(&auth, &token), AuthError::LifetimeNeedsJti);
    let week = MintRequest {
        jti: Some("w-1".into()),
        ..week
    };
    let token = mint_hs256(HS_SECRET.as_bytes(), &week, NOW).unwrap();
    assert_eq!(
        auth.verify(&token, NOW).unwrap().jti.as_deref(),
        Some("w-1")
    );
}

#[test]
fn groups_claim_forms() {
    let (_dir, auth) = setup();
    let groups = |value: Option<Value>| {
        let c = match value {
            Some(v) => with(claims(RSA_ISS), "groups", v),
            None => without(claims(RSA_ISS), "groups"),
        };
        auth.verify(&rsa(&c), NOW).map(|p| p.groups)
    };
    assert_eq!(
        groups(Some(json!(["a", "b"]))),
        Ok(vec!["a".to_owned(), "b".to_owned()])
    );
    assert_eq!(groups(Some(json!("ops"))), Ok(vec!["ops".to_owned()]));
    assert_eq!(groups(None), Ok(vec![]));
    assert_eq!(groups(Some(json!(null))), Ok(vec![]));
    assert_eq!(
        groups(Some(json!(7))),
        Err(AuthError::InvalidClaim("groups".into()))
    );
    assert_eq!(
        groups(Some(json!(["a", 1]))),
        Err(AuthError::InvalidClaim("groups".into()))
    );

    let dir = TempDir::new();
    let mut cfg = config(&dir);
    cfg.groups_claim = "roles".into();
    let auth = Authenticator::load(&cfg).unwrap();
    let token = rsa(&with(claims(RSA_ISS), "roles", json!(["admin"])));
    assert_eq!(
        auth.verify(&token, NOW).unwrap().groups,
        vec!["admin".to_owned()]
    );
}

#[test]
fn audience_may_be_a_list_intersecting_the_configured_one() {
    let (_dir, auth) = setup();
    let token = rsa(&with(
        claims(RSA_ISS),
        "aud",
        json!(["someone-else", "other-aud"]),
    ));
    assert!(auth.verify(&token, NOW).is_ok());
}

// ----- S9 refusals ----------------------------------------------------------------------

#[test]
fn expired_and_leeway_edge() {
    let (_dir, auth) = setup();
    let at = |exp: u64| rsa(&with(claims(RSA_ISS), "exp", json!(exp)));
    assert!(auth.verify(&at(NOW), NOW).is_ok());
    assert!(
        auth.verify(&at(NOW - 25), NOW).is_ok(),
        "just past, within leeway"
    );
    let err = refused(&auth, &at(NOW - 26));
    assert_eq!(err, AuthError::Expired);
    assert_eq!(err.status(), StatusCode::UNAUTHORIZED);
    assert!(err.www_authenticate().unwrap().contains("invalid_token"));

    let dir = TempDir::new();
    let mut cfg = config(&dir);
    cfg.leeway_secs = 0;
    let strict = Authenticator::load(&cfg).unwrap();
    assert!(strict.verify(&at(NOW), NOW).is_ok());
    assert_eq!(strict.verify(&at(NOW - 1), NOW), Err(AuthError::Expired));
}

#[test]
fn not_yet_valid_and_leeway_edge() {
    let (_dir, auth) = setup();
    let at = |nbf: u64| rsa(&with(claims(RSA_ISS), "nbf", json!(nbf)));
    assert!(auth.verify(&at(NOW + 25), NOW).is_ok());
    assert_eq!(refused(&auth, &at(NOW + 26)), AuthError::NotYetValid);
    let err = refused(&auth, &at(NOW + 3600));
    assert_eq!(err, AuthError::NotYetValid);
    assert_eq!(err.status(), StatusCode::UNAUTHORIZED);
}

#[test]
fn time_claims_of_the_wrong_type_are_refused() {
    let (_dir, auth) = setup();
    // CVE-2026-25537 shape: a string `nbf`/`exp` must not count as absent.
    let cases = [
        (
            with(claims(RSA_ISS), "nbf", json!("99999999999")),
            AuthError::InvalidClaim("nbf".into()),
        ),
        (
            with(claims(RSA_ISS), "exp", json!("99999999999")),
            AuthError::InvalidClaim("exp".into()),
        ),
        (
            with(claims(RSA_ISS), "iat", json!(true)),
            AuthError::InvalidClaim("iat".into()),
        ),
        (
            without(claims(RSA_ISS), "exp"),
            AuthError::MissingClaim("exp".into()),
        ),
    ];
    for (c, expected) in cases {
        assert_eq!(refused(&auth, &rsa(&c)), expected);
    }
}

#[test]
fn wrong_or_missing_audience() {
    let (_dir, auth) = setup();
    let err = refused(&auth, &rsa(&with(claims(RSA_ISS), "aud", json!("not-us"))));
    assert_eq!(err, AuthError::WrongAudience);
    assert_eq!(err.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        refused(&auth, &rsa(&with(claims(RSA_ISS), "aud", json!([])))),
        AuthError::WrongAudience
    );
    assert_eq!(
        refused(&auth, &rsa(&without(claims(RSA_ISS), "aud"))),
        AuthError::MissingClaim("aud".into())
    );
}

#[test]
fn wrong_or_unknown_issuer() {
    let (_dir, auth) = setup();
    let err = refused(&auth, &rsa(&claims("https://evil.example")));
    assert_eq!(err, AuthError::UnknownIssuer);
    assert_eq!(err.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        refused(&auth, &rsa(&without(claims(RSA_ISS), "iss"))),
        AuthError::MissingClaim("iss".into())
    );
    assert_eq!(
        refused(&auth, &rsa(&with(claims(RSA_ISS), "iss", json!([RSA_ISS])))),
        AuthError::InvalidClaim("iss".into())
    );
    // Signed by the RSA issuer's key but claiming the EC issuer: RS256 is not its algorithm.
    assert_eq!(
        refused(&auth, &rsa(&claims(EC_ISS))),
        AuthError::AlgorithmNotAllowed
    );
    // Same family, other key: the signature does not verify.
    let other = sign(
        Algorithm::RS256,
        &read_fixture("rsa2_private.pem"),
        None,
        &claims(RSA_ISS),
    );
    assert_eq!(refused(&auth, &other), AuthError::BadSignature);
}

#[test]
fn alg_none_is_refused() {
    let (_dir, auth) = setup();
    for alg in ["none", "None", "NONE", "nOnE"] {
        for iss in [RSA_ISS, JWKS_ISS, DEV_ISS] {
            let header = b64(&json!({"alg": alg, "typ": "JWT"}));
            let token = format!("{header}.{}.", b64(&claims(iss)));
            let err = refused(&auth, &token);
            assert_eq!(err, AuthError::AlgorithmNotAllowed, "{alg} {iss}");
            assert_eq!(err.status(), StatusCode::UNAUTHORIZED);
        }
    }
}

#[test]
fn hs256_signed_with_the_rsa_public_key_is_refused() {
    let (_dir, auth) = setup();
    let public_pem = read_fixture("rsa_public.pem");
    let forged = sign(Algorithm::HS256, &public_pem, None, &claims(RSA_ISS));
    let err = refused(&auth, &forged);
    assert_eq!(err, AuthError::AlgorithmNotAllowed);
    assert_eq!(err.status(), StatusCode::UNAUTHORIZED);
    let forged = sign(Algorithm::HS256, &public_pem, Some("r1"), &claims(JWKS_ISS));
    assert_eq!(refused(&auth, &forged), AuthError::AlgorithmNotAllowed);
    // Nor any other algorithm outside the configured one.
    let rs384 = sign(
        Algorithm::RS384,
        &read_fixture("rsa_private.pem"),
        None,
        &claims(RSA_ISS),
    );
    assert_eq!(refused(&auth, &rs384), AuthError::AlgorithmNotAllowed);
    // A JWK naming `alg: RS256` takes only RS256, not the rest of its family.
    let ps_on_r1 = sign(
        Algorithm::PS256,
        &read_fixture("rsa_private.pem"),
        Some("r1"),
        &claims(JWKS_ISS),
    );
    assert_eq!(refused(&auth, &ps_on_r1), AuthError::AlgorithmNotAllowed);
    // An EC key picked by kid does not take RSA signatures.
    let rs_on_ec = sign(
        Algorithm::RS256,
        &read_fixture("rsa_private.pem"),
        Some("e1"),
        &claims(JWKS_ISS),
    );
    assert_eq!(refused(&auth, &rs_on_ec), AuthError::AlgorithmNotAllowed);
}

#[test]
fn malformed_tokens() {
    let (_dir, auth) = setup();
    let good = rsa(&claims(RSA_ISS));
    let parts: Vec<&str> = good.split('.').collect();
    let not_json = URL_SAFE_NO_PAD.encode("not json");
    let cases = [
        String::new(),
        "abc".to_owned(),
        "a.b".to_owned(),
        format!("{good}.extra"),
        format!("!!!.{}.{}", parts[1], parts[2]),
        format!("{}.{}.{}", parts[0], not_json, parts[2]),
        format!("{}.{}.{}", not_json, parts[1], parts[2]),
        format!("{}.{}.{}", parts[0], b64(&json!(["array"])), parts[2]),
        format!("{}.{}.{}", b64(&json!({"typ": "JWT"})), parts[1], parts[2]),
        format!("{}.{}.***", parts[0], parts[1]),
        // Unknown critical header extension, correctly signed.
        sign_raw(
            &json!({"alg": "RS256", "crit": ["exp-ext"], "exp-ext": 1}),
            &claims(RSA_ISS),
        ),
        "a".repeat(20_000),
    ];
    for token in cases {
        let err = refused(&auth, &token);
        assert!(
            matches!(err, AuthError::Malformed(_)),
            "{err:?} for {token:.40}"
        );
        assert_eq!(err.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(err.reason(), "malformed");
    }
}

#[test]
fn hand_signed_plain_token_is_accepted() {
    let (_dir, auth) = setup();
    let token = sign_raw(&json!({"alg": "RS256", "typ": "JWT"}), &claims(RSA_ISS));
    assert!(auth.verify(&token, NOW).is_ok());
}

#[test]
fn tampered_payload_fails_signature() {
    let (_dir, auth) = setup();
    let good = rsa(&claims(RSA_ISS));
    let parts: Vec<&str> = good.split('.').collect();
    let forged = b64(&with(claims(RSA_ISS), "sub", json!("root")));
    let token = format!("{}.{forged}.{}", parts[0], parts[2]);
    assert_eq!(refused(&auth, &token), AuthError::BadSignature);
}

#[test]
fn missing_token() {
    let found = extract_token(&HeaderMap::new(), Some("a=1"), true).unwrap();
    assert_eq!(found, None);
    let err = AuthError::MissingToken;
    assert_eq!(err.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(err.www_authenticate(), Some("Bearer realm=\"ahp-relay\""));
}

#[test]
fn conflicting_tokens_are_400() {
    let (_dir, auth) = setup();
    let a = rsa(&claims(RSA_ISS));
    let b = rsa(&with(claims(RSA_ISS), "sub", json!("bob")));
    let mut headers = HeaderMap::new();
    headers.insert(
        "authorization",
        HeaderValue::from_str(&format!("Bearer {a}")).unwrap(),
    );
    let query = format!("tkn={b}");
    let err = extract_token(&headers, Some(&query), true).unwrap_err();
    assert_eq!(err, AuthError::ConflictingTokens);
    assert_eq!(err.status(), StatusCode::BAD_REQUEST);
    assert!(err.www_authenticate().unwrap().contains("invalid_request"));
    // The same token twice is fine.
    let query = format!("tkn={a}");
    let (token, _) = extract_token(&headers, Some(&query), true)
        .unwrap()
        .unwrap();
    assert!(auth.verify(&token, NOW).is_ok());
}

#[test]
fn revoked_jti_is_403() {
    let (_dir, auth) = setup();
    let token = rsa(&with(claims(RSA_ISS), "jti", json!("revoked-1")));
    let err = refused(&auth, &token);
    assert_eq!(err, AuthError::Revoked);
    assert_eq!(err.status(), StatusCode::FORBIDDEN);
    assert_eq!(err.www_authenticate(), None);
    assert!(auth.is_revoked("revoked-1"));
    assert!(!auth.is_revoked("# revoked tokens"));
    let fine = rsa(&with(claims(RSA_ISS), "jti", json!("still-good")));
    assert_eq!(
        auth.verify(&fine, NOW).unwrap().jti.as_deref(),
        Some("still-good")
    );
}

#[test]
fn long_lifetime_needs_jti() {
    let (_dir, auth) = setup();
    let long = with(claims(RSA_ISS), "exp", json!(NOW + 7200));
    let err = refused(&auth, &rsa(&long));
    assert_eq!(err, AuthError::LifetimeNeedsJti);
    assert_eq!(err.status(), StatusCode::UNAUTHORIZED);
    assert!(
        auth.verify(&rsa(&with(long.clone(), "jti", json!("j-1"))), NOW)
            .is_ok()
    );
    // Exactly the limit is fine; iat absent → exp - now; a future iat cannot shorten it.
    assert!(
        auth.verify(&rsa(&with(claims(RSA_ISS), "exp", json!(NOW + 3600))), NOW)
            .is_ok()
    );
    assert_eq!(
        refused(&auth, &rsa(&without(long.clone(), "iat"))),
        AuthError::LifetimeNeedsJti
    );
    let sneaky = with(long.clone(), "iat", json!(NOW + 7000));
    assert_eq!(refused(&auth, &rsa(&sneaky)), AuthError::LifetimeNeedsJti);
    // An old token near its end: its lifetime counts from iat.
    let old = with(
        with(claims(RSA_ISS), "iat", json!(NOW - 7200)),
        "exp",
        json!(NOW + 60),
    );
    assert_eq!(refused(&auth, &rsa(&old)), AuthError::LifetimeNeedsJti);
    assert_eq!(
        refused(&auth, &rsa(&with(long, "jti", json!("")))),
        AuthError::InvalidClaim("jti".into())
    );
}

#[test]
fn subject_is_required() {
    let (_dir, auth) = setup();
    assert_eq!(
        refused(&auth, &rsa(&without(claims(RSA_ISS), "sub"))),
        AuthError::MissingClaim("sub".into())
    );
    assert_eq!(
        refused(&auth, &rsa(&with(claims(RSA_ISS), "sub", json!("")))),
        AuthError::InvalidClaim("sub".into())
    );
    assert_eq!(
        refused(&auth, &rsa(&with(claims(RSA_ISS), "sub", json!(42)))),
        AuthError::InvalidClaim("sub".into())
    );
}

// ----- JWKS and loading -----------------------------------------------------------------

#[test]
fn jwks_selects_by_kid() {
    let (_dir, auth) = setup();
    let rsa_pem = read_fixture("rsa_private.pem");
    let unknown = sign(Algorithm::RS256, &rsa_pem, Some("nope"), &claims(JWKS_ISS));
    let err = refused(&auth, &unknown);
    assert_eq!(err, AuthError::UnknownKey);
    assert_eq!(err.status(), StatusCode::UNAUTHORIZED);
    // No kid: every key of the set is tried.
    assert!(
        auth.verify(
            &sign(Algorithm::RS256, &rsa_pem, None, &claims(JWKS_ISS)),
            NOW
        )
        .is_ok()
    );
    // Right kid, wrong key material.
    let rsa2 = sign(
        Algorithm::RS256,
        &read_fixture("rsa2_private.pem"),
        Some("r1"),
        &claims(JWKS_ISS),
    );
    assert_eq!(refused(&auth, &rsa2), AuthError::BadSignature);
}

#[test]
fn jwks_with_oct_key_is_refused_at_load() {
    let dir = TempDir::new();
    let mut cfg = config(&dir);
    let oct = json!({"kty": "oct", "kid": "h1", "k": URL_SAFE_NO_PAD.encode(HS_SECRET)});
    let mut keys: Value = serde_json::from_str(&standard_jwks()).unwrap();
    keys["keys"].as_array_mut().unwrap().push(oct);
    let file = dir.write("jwks-oct.json", &keys.to_string());
    cfg.issuers[3].keys = KeySource::Jwks { file: file.clone() };
    let err = Authenticator::load(&cfg).unwrap_err().to_string();
    assert!(err.contains(&file.display().to_string()), "{err}");
    assert!(err.contains("oct") && err.contains("h1"), "{err}");
    assert!(!err.contains(HS_SECRET) && !err.contains(&URL_SAFE_NO_PAD.encode(HS_SECRET)));
}

#[test]
fn jwks_skips_encryption_keys_and_needs_one_signing_key() {
    let dir = TempDir::new();
    let mut cfg = config(&dir);
    let mut enc = jwk(Algorithm::RS256, &read_fixture("rsa2_private.pem"), "enc1");
    enc["use"] = json!("enc");
    enc["alg"] = json!("RSA-OAEP");
    let mut sig = jwk(Algorithm::RS256, &read_fixture("rsa_private.pem"), "r1");
    sig["use"] = json!("sig");
    cfg.issuers[3].keys = KeySource::Jwks {
        file: dir.write("mixed.json", &jwks(vec![enc.clone(), sig])),
    };
    let auth = Authenticator::load(&cfg).unwrap();
    let token = sign(
        Algorithm::RS256,
        &read_fixture("rsa_private.pem"),
        Some("r1"),
        &claims(JWKS_ISS),
    );
    assert!(auth.verify(&token, NOW).is_ok());
    let enc_signed = sign(
        Algorithm::RS256,
        &read_fixture("rsa2_private.pem"),
        Some("enc1"),
        &claims(JWKS_ISS),
    );
    assert_eq!(refused(&auth, &enc_signed), AuthError::UnknownKey);

    cfg.issuers[3].keys = KeySource::Jwks {
        file: dir.write("only-enc.json", &jwks(vec![enc])),
    };
    let err = Authenticator::load(&cfg).unwrap_err().to_string();
    assert!(
        err.contains("only-enc.json") && err.contains("no usable"),
        "{err}"
    );
}

/// §3.2: a PEM key file that cannot be loaded fails the whole load with an
/// error naming the file and what is wrong with it: missing, a private
/// key, more than one key, a certificate, or a key of another algorithm.
#[test]
fn pem_load_errors_name_the_file_and_problem() {
    let dir = TempDir::new();
    let load_err = |f: &dyn Fn(&mut AuthConfig)| {
        let mut cfg = config(&dir);
        f(&mut cfg);
        Authenticator::load(&cfg).unwrap_err().to_string()
    };
    let missing = dir.0.join("missing.pem");
    let err = load_err(&|c| {
        c.issuers[0] = pem_issuer(RSA_ISS, PemAlgorithm::Rs256, vec![missing.clone()])
    });
    assert!(
        err.contains("missing.pem") && err.contains("cannot read"),
        "{err}"
    );

    let private = fixture("rsa_private.pem");
    let err = load_err(&|c| {
        c.issuers[0] = pem_issuer(RSA_ISS, PemAlgorithm::Rs256, vec![private.clone()])
    });
    assert!(
        err.contains("rsa_private.pem") && err.contains("private key"),
        "{err}"
    );

    let two = dir.write(
        "two.pem",
        &(read_fixture("rsa_public.pem") + &read_fixture("rsa2_public.pem")),
    );
    let err =
        load_err(&|c| c.issuers[0] = pem_issuer(RSA_ISS, PemAlgorithm::Rs256, vec![two.clone()]));
    assert!(
        err.contains("two.pem") && err.contains("2 PEM blocks"),
        "{err}"
    );

    let cert = dir.write(
        "cert.pem",
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    );
    let err =
        load_err(&|c| c.issuers[0] = pem_issuer(RSA_ISS, PemAlgorithm::Rs256, vec![cert.clone()]));
    assert!(
        err.contains("cert.pem") && err.contains("PUBLIC KEY"),
        "{err}"
    );

    let ec = fixture("ec_p256_public.pem");
    let err =
        load_err(&|c| c.issuers[0] = pem_issuer(RSA_ISS, PemAlgorithm::Rs256, vec![ec.clone()]));
    assert!(
        err.contains("ec_p256_public.pem") && err.contains("RSA"),
        "{err}"
    );
    let err =
        load_err(&|c| c.issuers[1] = pem_issuer(EC_ISS, PemAlgorithm::Es384, vec![ec.clone()]));
    assert!(
        err.contains("ec_p256_public.pem") && err.contains("ES384"),
        "{err}"
    );
}

/// §3.2: an HS256 secret shorter than 32 bytes (without showing it), a
/// JWKS file that is not JSON, a missing deny list and an out-of-range
/// leeway each fail the load with an error naming the file or setting.
#[test]
fn secret_jwks_and_setting_load_errors_name_the_file_and_problem() {
    let dir = TempDir::new();
    let load_err = |f: &dyn Fn(&mut AuthConfig)| {
        let mut cfg = config(&dir);
        f(&mut cfg);
        Authenticator::load(&cfg).unwrap_err().to_string()
    };
    let short = dir.write("short.secret", "too-short\n");
    let err = load_err(&|c| {
        c.issuers[4].keys = KeySource::Hs256 {
            secret_file: short.clone(),
        }
    });
    assert!(
        err.contains("short.secret") && err.contains("at least 32"),
        "{err}"
    );
    assert!(!err.contains("too-short"));

    let garbage = dir.write("garbage.json", "{not json");
    let err = load_err(&|c| {
        c.issuers[3].keys = KeySource::Jwks {
            file: garbage.clone(),
        }
    });
    assert!(
        err.contains("garbage.json") && err.contains("JSON"),
        "{err}"
    );

    let err = load_err(&|c| c.deny_list_file = Some(dir.0.join("no-deny.txt")));
    assert!(err.contains("no-deny.txt"), "{err}");

    let err = load_err(&|c| c.leeway_secs = 301);
    assert!(err.contains("leeway_secs"), "{err}");
}

// ----- reload -----------------------------------------------------------------------------

#[test]
fn reload_swaps_keys_and_keeps_old_ones_on_error() {
    let dir = TempDir::new();
    let mut cfg = config(&dir);
    let key_file = dir.write("rotating.pem", &read_fixture("rsa_public.pem"));
    cfg.issuers[0] = pem_issuer(RSA_ISS, PemAlgorithm::Rs256, vec![key_file.clone()]);
    let auth = Authenticator::load(&cfg).unwrap();
    let old = rsa(&claims(RSA_ISS));
    let new = sign(
        Algorithm::RS256,
        &read_fixture("rsa2_private.pem"),
        None,
        &claims(RSA_ISS),
    );
    assert!(auth.verify(&old, NOW).is_ok());
    assert_eq!(refused(&auth, &new), AuthError::BadSignature);

    std::fs::write(&key_file, read_fixture("rsa2_public.pem")).unwrap();
    auth.reload().unwrap();
    assert!(auth.verify(&new, NOW).is_ok());
    assert_eq!(refused(&auth, &old), AuthError::BadSignature);

    std::fs::write(
        &key_file,
        "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
    )
    .unwrap();
    let err = auth.reload().unwrap_err().to_string();
    assert!(err.contains("rotating.pem"), "{err}");
    assert!(
        auth.verify(&new, NOW).is_ok(),
        "a failed reload keeps the old keys"
    );

    // A broken JWKS (here: an oct key) fails the reload too, and the JWKS keys stay.
    let jwks_file = match &cfg.issuers[3].keys {
        KeySource::Jwks { file } => file.clone(),
        other => panic!("unexpected {other:?}"),
    };
    std::fs::write(&jwks_file, jwks(vec![json!({"kty": "oct", "k": "AAAA"})])).unwrap();
    assert!(auth.reload().is_err());
    let jwks_token = sign(
        Algorithm::RS256,
        &read_fixture("rsa_private.pem"),
        Some("r1"),
        &claims(JWKS_ISS),
    );
    assert!(auth.verify(&jwks_token, NOW).is_ok());
}

/// Keys and the deny list reload independently: a broken key file keeps its
/// issuer's previous keys without holding back the new deny list, and an
/// unreadable deny list keeps the previous entries without holding back new
/// keys.
#[test]
fn reload_applies_the_deny_list_and_each_issuer_independently() {
    let dir = TempDir::new();
    let mut cfg = config(&dir);
    let key_file = dir.write("rotating.pem", &read_fixture("rsa_public.pem"));
    cfg.issuers[0] = pem_issuer(RSA_ISS, PemAlgorithm::Rs256, vec![key_file.clone()]);
    let auth = Authenticator::load(&cfg).unwrap();
    let token = rsa(&with(claims(RSA_ISS), "jti", json!("j-7")));
    assert!(auth.verify(&token, NOW).is_ok());
    let deny = cfg.deny_list_file.clone().unwrap();
    std::fs::write(&deny, "revoked-1\nj-7\n").unwrap();
    auth.reload().unwrap();
    assert!(auth.is_revoked("j-7"));
    assert_eq!(refused(&auth, &token), AuthError::Revoked);

    // A broken key file (the HS256 secret gone) fails the reload, names the
    // file, keeps that issuer's keys — and the new deny list applies.
    let hs_file = match &cfg.issuers[4].keys {
        KeySource::Hs256 { secret_file } => secret_file.clone(),
        other => panic!("unexpected {other:?}"),
    };
    std::fs::remove_file(&hs_file).unwrap();
    std::fs::write(&deny, "revoked-1\n").unwrap();
    let err = auth.reload().unwrap_err().to_string();
    assert!(err.contains("hs.secret"), "{err}");
    assert!(!auth.is_revoked("j-7"), "the new deny list applies");
    assert!(auth.verify(&token, NOW).is_ok());
    let hs_token = sign(Algorithm::HS256, HS_SECRET, None, &claims(DEV_ISS));
    assert!(
        auth.verify(&hs_token, NOW).is_ok(),
        "the issuer keeps its keys"
    );

    // A rotated key of another issuer still loads meanwhile; an unreadable
    // deny list keeps its previous entries; the error names both files.
    std::fs::write(&key_file, read_fixture("rsa2_public.pem")).unwrap();
    std::fs::remove_file(&deny).unwrap();
    let err = auth.reload().unwrap_err().to_string();
    assert!(
        err.contains("hs.secret") && err.contains("deny.txt"),
        "{err}"
    );
    assert_eq!(
        refused(&auth, &token),
        AuthError::BadSignature,
        "new RSA key"
    );
    assert!(auth.is_revoked("revoked-1"), "previous deny list kept");
}

// ----- hygiene ----------------------------------------------------------------------------

#[test]
fn nothing_shows_a_token_or_secret() {
    let (_dir, auth) = setup();
    let debug = format!("{auth:?}");
    assert!(!debug.contains(HS_SECRET), "{debug}");
    assert!(!debug.contains(&read_fixture("rsa_public.pem")[30..60]));
    let token = rsa(&with(claims("https://evil.example"), "sub", json!("x")));
    let err = refused(&auth, &token);
    for text in [
        err.to_string(),
        format!("{err:?}"),
        err.www_authenticate().unwrap().to_owned(),
    ] {
        assert!(!text.contains(&token) && !text.contains("evil"), "{text}");
    }
    let query = format!("tkn={token}&access_token={token}&b=2");
    let redacted = redact_query(&query);
    assert_eq!(redacted, "tkn=REDACTED&access_token=REDACTED&b=2");
}

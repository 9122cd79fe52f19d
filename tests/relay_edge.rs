//! The relay's edge over real TLS sockets (contract §3, scenarios S9, S12 close codes, S14):
//! refusals at the upgrade with their statuses and no host traffic, every accepted token
//! place, the 429 failure limit, token expiry (4001), health and metrics endpoints, TLS
//! trust, socket-level close codes, and token redaction.

mod common;

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ahp_relay::devkit::{DEV_AUDIENCE, DEV_ISSUER};
use ahp_relay::edge::slice::{kernel_honours_slices, reported_slice};
use ahp_relay::identity::unix_now;
use ahp_relay::upstream::dial::{DialError, DialOptions, dial_stream};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use common::relay::{TestRelay, Upgrade, admin_get, https_get, metric, scratch_dir, trusting};
use common::{RawWs, fast_config, request_frame};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use rustls_pki_types::ServerName;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::http::header::{
    AUTHORIZATION, RETRY_AFTER, SEC_WEBSOCKET_PROTOCOL, WWW_AUTHENTICATE,
};

/// `iss` of the RS256 issuer configured from `fixtures/keys/rsa_public.pem`.
const RSA_ISSUER: &str = "https://rsa.example/";

// ─── Harness ────────────────────────────────────────────────────────────────

/// A relay in front of one simhost, with the dev HS256 issuer and an RS256 `pem` issuer,
/// remembering the host connections that were open once the watch link was up.
struct Edge {
    t: TestRelay,
    watch_conns: HashSet<u64>,
}

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/keys")
        .join(name)
}

/// The `[[auth.issuers]]` entry of the RS256 issuer (appended through `extra`).
fn rsa_issuer_toml() -> String {
    format!(
        "\n[[auth.issuers]]\nissuer = \"{RSA_ISSUER}\"\naudience = [\"{DEV_AUDIENCE}\"]\n\
         keys = {{ type = \"pem\", algorithm = \"RS256\", files = [\"{}\"] }}\n",
        fixture("rsa_public.pem").display()
    )
}

impl Edge {
    async fn start() -> Self {
        Self::start_with("", "").await
    }

    async fn start_with(auth_extra: &str, extra: &str) -> Self {
        let extra = format!("{}{extra}", rsa_issuer_toml());
        let t = TestRelay::start_with(vec![fast_config("alpha", 1)], auth_extra, &extra).await;
        let host = &t.hosts[0];
        assert_eq!(host.connections(), 1, "only the watch link is connected");
        let watch_conns = host.received().iter().map(|f| f.conn).collect();
        host.clear_record();
        Self { t, watch_conns }
    }

    /// Nothing but the relay's own watch link ever reached the host.
    fn assert_no_host_traffic(&self, what: &str) {
        for host in &self.t.hosts {
            assert_eq!(
                host.connections(),
                1,
                "{what}: the host sees only the watch link"
            );
            let stray: Vec<_> = host
                .received()
                .into_iter()
                .filter(|f| !self.watch_conns.contains(&f.conn))
                .collect();
            assert!(
                stray.is_empty(),
                "{what}: frames reached the host: {stray:?}"
            );
        }
    }

    fn secret(&self) -> Vec<u8> {
        ahp_relay::auth::token::trim_newlines(std::fs::read(&self.t.kit.dev_key).expect("dev key"))
    }

    /// An HS256 token signed with the dev secret over `claims`.
    fn hs256(&self, claims: &Value) -> String {
        sign(
            Algorithm::HS256,
            &EncodingKey::from_secret(&self.secret()).unwrap(),
            claims,
        )
    }

    /// A valid 10-minute dev token.
    fn valid(&self) -> String {
        self.hs256(&dev_claims(json!({})))
    }
}

/// Dev-issuer claims valid for 10 minutes, with `overrides` merged in (`null` removes).
fn dev_claims(overrides: Value) -> Value {
    let now = unix_now();
    let mut claims = json!({
        "iss": DEV_ISSUER, "sub": "mallory", "aud": DEV_AUDIENCE,
        "iat": now, "exp": now + 600, "groups": [],
    });
    let map = claims.as_object_mut().unwrap();
    for (k, v) in overrides.as_object().unwrap() {
        if v.is_null() {
            map.remove(k);
        } else {
            map.insert(k.clone(), v.clone());
        }
    }
    claims
}

fn sign(alg: Algorithm, key: &EncodingKey, claims: &Value) -> String {
    jsonwebtoken::encode(&Header::new(alg), claims, key).expect("token signs")
}

fn b64(v: &Value) -> String {
    URL_SAFE_NO_PAD.encode(v.to_string())
}

/// Asserts a refusal with `status` (401 also carries a `WWW-Authenticate: Bearer …`
/// challenge) that echoes nothing of `token`, and that no host saw anything.
fn assert_refused(e: &Edge, u: &Upgrade, status: u16, token: &str, what: &str) {
    assert_eq!(u.status, status, "{what}: status");
    assert!(u.ws.is_none(), "{what}: no socket");
    if status == 401 {
        let challenge = u.header(&WWW_AUTHENTICATE);
        assert!(
            challenge.is_some_and(|c| c.starts_with("Bearer ")),
            "{what}: WWW-Authenticate: {challenge:?}"
        );
    }
    if token.len() >= 8 {
        let body = String::from_utf8_lossy(&u.body);
        assert!(!body.contains(token), "{what}: body echoes the token");
        for v in u.headers.values() {
            assert!(
                !v.to_str().unwrap_or_default().contains(token),
                "{what}: a header echoes the token"
            );
        }
    }
    e.assert_no_host_traffic(what);
}

/// `initialize` then `ping` on `ws` both succeed.
async fn assert_works(ws: &mut RawWs, client_id: &str) {
    let init = ws.initialize(client_id).await;
    assert_eq!(
        init.pointer("/result/protocolVersion"),
        Some(&json!("1.0.0")),
        "{init}"
    );
    let pong = ws
        .request(1, "ping", json!({"channel": "ahp-root://"}))
        .await;
    assert_eq!(pong.get("result"), Some(&Value::Null), "{pong}");
}

/// `/metrics` counts exactly `n` refusals labelled `reason` (the refusal was for that reason).
async fn assert_reason(e: &Edge, reason: &str, n: u64) {
    let (status, page) = admin_get(&e.t, "/metrics").await;
    assert_eq!(status, 200);
    let name = format!("ahp_relay_auth_failures_total{{reason=\"{reason}\"}}");
    assert_eq!(metric(&page, &name), Some(n as f64), "{name} in:\n{page}");
}

// ─── 1. Refusals at the upgrade (S9) ────────────────────────────────────────

/// An expired token (beyond the 5 s leeway) gets 401 and reaches no host.
#[tokio::test]
async fn expired_token_is_refused_401() {
    let e = Edge::start().await;
    let now = unix_now();
    let token = e.hs256(&dev_claims(json!({"iat": now - 1200, "exp": now - 600})));
    let u = e.t.upgrade_bearer(&token).await;
    assert_refused(&e, &u, 401, &token, "expired");
    assert_reason(&e, "expired", 1).await;
}

/// A token whose `nbf` is 60 s ahead gets 401; one 2 s ahead (inside the leeway) is accepted.
#[tokio::test]
async fn nbf_in_the_future_is_refused_401() {
    let e = Edge::start().await;
    let now = unix_now();
    let token = e.hs256(&dev_claims(json!({"nbf": now + 60})));
    let u = e.t.upgrade_bearer(&token).await;
    assert_refused(&e, &u, 401, &token, "nbf ahead");
    assert_reason(&e, "not_yet_valid", 1).await;
    let within = e.hs256(&dev_claims(json!({"nbf": now + 2})));
    let u = e.t.upgrade_bearer(&within).await;
    assert_eq!(u.status, 101, "nbf within the leeway is accepted");
}

/// A token for another audience gets 401.
#[tokio::test]
async fn wrong_audience_is_refused_401() {
    let e = Edge::start().await;
    let token = e.hs256(&dev_claims(json!({"aud": "some-other-service"})));
    let u = e.t.upgrade_bearer(&token).await;
    assert_refused(&e, &u, 401, &token, "wrong aud");
    assert_reason(&e, "wrong_audience", 1).await;
}

/// A token from an issuer that is not configured gets 401.
#[tokio::test]
async fn unknown_issuer_is_refused_401() {
    let e = Edge::start().await;
    let token = e.hs256(&dev_claims(json!({"iss": "https://evil.example/"})));
    let u = e.t.upgrade_bearer(&token).await;
    assert_refused(&e, &u, 401, &token, "unknown iss");
    assert_reason(&e, "unknown_issuer", 1).await;
}

/// An unsigned `alg: none` token with otherwise valid claims gets 401.
#[tokio::test]
async fn alg_none_is_refused_401() {
    let e = Edge::start().await;
    let token = format!(
        "{}.{}.",
        b64(&json!({"alg": "none", "typ": "JWT"})),
        b64(&dev_claims(json!({})))
    );
    let u = e.t.upgrade_bearer(&token).await;
    assert_refused(&e, &u, 401, &token, "alg none");
    assert_reason(&e, "algorithm_not_allowed", 1).await;
}

/// HS256 signed with the RSA public key PEM as HMAC secret, for the RS256 issuer, gets 401.
#[tokio::test]
async fn hs256_signed_with_rsa_public_key_is_refused_401() {
    let e = Edge::start().await;
    let public_pem = std::fs::read(fixture("rsa_public.pem")).expect("public key");
    let claims = dev_claims(json!({"iss": RSA_ISSUER}));
    let token = sign(
        Algorithm::HS256,
        &EncodingKey::from_secret(&public_pem).unwrap(),
        &claims,
    );
    let u = e.t.upgrade_bearer(&token).await;
    assert_refused(&e, &u, 401, &token, "HS256 with RSA public key");
    assert_reason(&e, "algorithm_not_allowed", 1).await;
}

/// Malformed tokens (`abc.def`, garbage, a non-JSON part) get 401.
#[tokio::test]
async fn malformed_tokens_are_refused_401() {
    let e = Edge::start().await;
    for token in ["abc.def", "garbage", "not.a.jwt", "%%%%.&&&&.$$$$"] {
        let u = e.t.upgrade_bearer(token).await;
        assert_refused(&e, &u, 401, token, token);
    }
    assert_reason(&e, "malformed", 4).await;
}

/// An upgrade without any token gets 401 with a `WWW-Authenticate: Bearer` challenge.
#[tokio::test]
async fn missing_token_is_refused_401() {
    let e = Edge::start().await;
    let u = e.t.upgrade("", &[]).await;
    assert_refused(&e, &u, 401, "", "missing");
    assert_reason(&e, "missing_token", 1).await;
}

/// A token whose `jti` is on the deny list gets 403; another `jti` is accepted.
#[tokio::test]
async fn revoked_jti_is_refused_403() {
    let dir = scratch_dir("deny");
    std::fs::create_dir_all(&dir).unwrap();
    let deny = dir.join("deny.txt");
    std::fs::write(&deny, "# revoked\nrevoked-1\n").unwrap();
    let e = Edge::start_with(&format!("deny_list_file = \"{}\"", deny.display()), "").await;
    let token = e.hs256(&dev_claims(json!({"jti": "revoked-1"})));
    let u = e.t.upgrade_bearer(&token).await;
    assert_refused(&e, &u, 403, &token, "revoked jti");
    assert_reason(&e, "revoked", 1).await;
    let other = e.hs256(&dev_claims(json!({"jti": "still-good"})));
    assert_eq!(e.t.upgrade_bearer(&other).await.status, 101, "other jti");
}

/// A token living 2 h without `jti` gets 401; the same lifetime with a `jti` is accepted.
#[tokio::test]
async fn long_lived_token_without_jti_is_refused_401() {
    let e = Edge::start().await;
    let long = Duration::from_secs(2 * 3600);
    let token = e.t.kit.token("mallory", &[], long, None).unwrap();
    let u = e.t.upgrade_bearer(&token).await;
    assert_refused(&e, &u, 401, &token, "long-lived without jti");
    assert_reason(&e, "lifetime_needs_jti", 1).await;
    let with_jti = e.t.kit.token("mallory", &[], long, Some("j-1")).unwrap();
    let u = e.t.upgrade_bearer(&with_jti).await;
    assert_eq!(u.status, 101, "long-lived with jti");
}

/// A groups claim over `auth.max_groups` (default 256) gets 401 with a
/// reason naming the bound, counted as `too_many_groups`; 256 groups pass;
/// `auth.max_groups_bytes` bounds the names' total size.
#[tokio::test]
async fn a_groups_claim_over_the_bound_is_refused_401() {
    let e = Edge::start().await;
    let many: Vec<String> = (0..257).map(|i| format!("g{i}")).collect();
    let token = e.hs256(&dev_claims(json!({"groups": many})));
    let u = e.t.upgrade_bearer(&token).await;
    assert_refused(&e, &u, 401, &token, "257 groups");
    let body = String::from_utf8_lossy(&u.body).to_string();
    assert!(body.contains("max_groups"), "{body}");
    assert_reason(&e, "too_many_groups", 1).await;
    let fits = e.hs256(&dev_claims(json!({"groups": many[..256]})));
    assert_eq!(e.t.upgrade_bearer(&fits).await.status, 101, "256 groups");

    let e = Edge::start_with("max_groups_bytes = 64", "").await;
    let long = vec!["x".repeat(40), "y".repeat(40)];
    let token = e.hs256(&dev_claims(json!({"groups": long})));
    let u = e.t.upgrade_bearer(&token).await;
    assert_refused(&e, &u, 401, &token, "80 bytes of group names");
    assert_reason(&e, "too_many_groups", 1).await;
    let short = e.hs256(&dev_claims(json!({"groups": ["x".repeat(40)]})));
    assert_eq!(e.t.upgrade_bearer(&short).await.status, 101, "40 bytes");
}

/// Two different (valid) tokens in the header and the query get 400.
#[tokio::test]
async fn conflicting_tokens_are_refused_400() {
    let e = Edge::start().await;
    let a = e.valid();
    let b = e.hs256(&dev_claims(json!({"sub": "other"})));
    assert_ne!(a, b);
    let u =
        e.t.upgrade(
            &format!("?tkn={b}"),
            &[(AUTHORIZATION, &format!("Bearer {a}"))],
        )
        .await;
    assert_refused(&e, &u, 400, &a, "conflicting header/query");
    assert_refused(&e, &u, 400, &b, "conflicting header/query");
    assert_reason(&e, "conflicting_tokens", 1).await;
    let proto = format!("bearer, {b}");
    let u =
        e.t.upgrade(
            &format!("?access_token={a}"),
            &[(SEC_WEBSOCKET_PROTOCOL, &proto)],
        )
        .await;
    assert_refused(&e, &u, 400, &a, "conflicting sub-protocol/query");
    let u =
        e.t.upgrade(
            &format!("?tkn={a}"),
            &[(AUTHORIZATION, &format!("Bearer {a}"))],
        )
        .await;
    assert_eq!(u.status, 101, "the same token in two places is no conflict");
}

// ─── 2. Accepted token places (§3.2) ────────────────────────────────────────

/// `Authorization: Bearer <jwt>` is accepted; initialize and ping work.
#[tokio::test]
async fn authorization_bearer_is_accepted() {
    let e = Edge::start().await;
    let u = e.t.upgrade_bearer(&e.valid()).await;
    assert_works(&mut u.socket("Authorization"), "c-auth").await;
}

/// `Sec-WebSocket-Protocol: bearer, <jwt>` is accepted and answered with `bearer`.
#[tokio::test]
async fn subprotocol_bearer_is_accepted_and_answered() {
    let e = Edge::start().await;
    let proto = format!("bearer, {}", e.valid());
    let u = e.t.upgrade("", &[(SEC_WEBSOCKET_PROTOCOL, &proto)]).await;
    assert_eq!(u.header(&SEC_WEBSOCKET_PROTOCOL), Some("bearer"));
    assert_works(&mut u.socket("sub-protocol"), "c-proto").await;
}

/// The query parameter `tkn` is accepted.
#[tokio::test]
async fn query_tkn_is_accepted() {
    let e = Edge::start().await;
    let u = e.t.upgrade(&format!("?tkn={}", e.valid()), &[]).await;
    assert_works(&mut u.socket("tkn"), "c-tkn").await;
}

/// The query parameter `access_token` is accepted.
#[tokio::test]
async fn query_access_token_is_accepted() {
    let e = Edge::start().await;
    let u =
        e.t.upgrade(&format!("?x=1&access_token={}", e.valid()), &[])
            .await;
    assert_works(&mut u.socket("access_token"), "c-access").await;
}

/// An RS256 token signed with the fixture private key is accepted by the `pem` issuer.
#[tokio::test]
async fn rs256_token_from_pem_issuer_is_accepted() {
    let e = Edge::start().await;
    let private = std::fs::read(fixture("rsa_private.pem")).expect("private key");
    let key = EncodingKey::from_rsa_pem(&private).expect("RSA key");
    let token = sign(
        Algorithm::RS256,
        &key,
        &dev_claims(json!({"iss": RSA_ISSUER})),
    );
    let u = e.t.upgrade_bearer(&token).await;
    assert_works(&mut u.socket("RS256"), "c-rsa").await;
}

/// With `allow_query_token = false` a query token is ignored: 401 as if missing.
#[tokio::test]
async fn query_token_ignored_when_disallowed() {
    let e = Edge::start_with("allow_query_token = false", "").await;
    let token = e.valid();
    let u = e.t.upgrade(&format!("?tkn={token}"), &[]).await;
    assert_refused(&e, &u, 401, &token, "tkn disallowed");
    let u = e.t.upgrade(&format!("?access_token={token}"), &[]).await;
    assert_refused(&e, &u, 401, &token, "access_token disallowed");
    assert_reason(&e, "missing_token", 2).await;
    assert_works(
        &mut e.t.upgrade_bearer(&token).await.socket("header"),
        "c-h",
    )
    .await;
}

// ─── 3. Failure rate limit (§3.4) ───────────────────────────────────────────

/// After 10 failed upgrades, the next failure gets 429 with `Retry-After`;
/// a valid token from the same address is never refused (§3.4).
#[tokio::test]
async fn ten_failures_then_429_with_retry_after() {
    let e = Edge::start().await;
    for i in 0..10 {
        let u = e.t.upgrade("", &[]).await;
        assert_eq!(u.status, 401, "failure {i} is still a 401");
    }
    let valid = e.t.upgrade_bearer(&e.valid()).await;
    assert_works(
        &mut valid.socket("a valid token after 10 failures"),
        "c-429",
    )
    .await;
    let u = e.t.upgrade("", &[]).await;
    assert_eq!(u.status, 429, "11th failed attempt");
    let retry: u64 = u
        .header(&RETRY_AFTER)
        .expect("Retry-After header")
        .parse()
        .expect("Retry-After in seconds");
    assert!((1..=60).contains(&retry), "Retry-After {retry}");
    let (status, _) = admin_get(&e.t, "/healthz").await;
    assert_eq!(status, 200, "health endpoints are not rate limited");
}

/// An address over its failure budget that retries a token it already
/// failed with gets 429 before the token is verified again (counted as
/// `rate_limited_unverified`: no signature check is spent on a retry loop);
/// a different failing token from it is still verified and answered 429
/// (`rate_limited`); a valid token from it is never refused.
#[tokio::test]
async fn a_known_failing_token_is_refused_before_it_is_verified() {
    let e = Edge::start().await;
    let now = unix_now();
    let stale = e.hs256(&dev_claims(json!({"iat": now - 1200, "exp": now - 600})));
    for i in 0..10 {
        let u = e.t.upgrade_bearer(&stale).await;
        assert_eq!(u.status, 401, "failure {i} is still a 401");
    }
    assert_reason(&e, "expired", 10).await;
    for _ in 0..5 {
        let u = e.t.upgrade_bearer(&stale).await;
        assert_eq!(u.status, 429, "the same stale token again");
    }
    assert_reason(&e, "rate_limited_unverified", 5).await;
    let other = e.hs256(&dev_claims(json!({"iat": now - 1300, "exp": now - 700})));
    let u = e.t.upgrade_bearer(&other).await;
    assert_eq!(u.status, 429, "another failing token");
    assert_reason(&e, "rate_limited", 1).await;
    assert_reason(&e, "rate_limited_unverified", 5).await;
    let valid = e.t.upgrade_bearer(&e.valid()).await;
    assert_works(
        &mut valid.socket("a valid token over the budget"),
        "c-known",
    )
    .await;
}

// ─── 4. Token expiry (S14) ──────────────────────────────────────────────────

/// A 2 s token's socket closes with 4001 after exp + leeway; a new token resumes by `replay` (S14).
#[tokio::test]
async fn token_expiry_closes_4001_and_new_token_reinitializes() {
    let e = Edge::start().await;
    let minted = Instant::now();
    let short =
        e.t.kit
            .token("alice", &[], Duration::from_secs(2), None)
            .unwrap();
    let mut ws = e.t.upgrade_bearer(&short).await.socket("2 s token");
    let init = ws.initialize("c1").await;
    let seq = init
        .pointer("/result/serverSeq")
        .and_then(Value::as_i64)
        .expect("serverSeq");
    let close = ws.close_code().await;
    let elapsed = minted.elapsed();
    assert_eq!(close.map(|c| c.0), Some(4001), "close code");
    assert!(
        elapsed >= Duration::from_secs(5) && elapsed <= Duration::from_secs(9),
        "closed after {elapsed:?}, expected exp (2 s) + leeway (5 s)"
    );

    let mut ws = e.t.raw("alice").await;
    let reconnect = ws
        .request(
            1,
            "reconnect",
            json!({"channel": "ahp-root://", "clientId": "c1",
                   "lastSeenServerSeq": seq, "subscriptions": []}),
        )
        .await;
    assert_eq!(
        reconnect.pointer("/result/type"),
        Some(&json!("replay")),
        "{reconnect}"
    );
    assert_eq!(reconnect.pointer("/result/actions"), Some(&json!([])));
    assert_eq!(reconnect.pointer("/result/missing"), Some(&json!([])));
    let pong = ws
        .request(2, "ping", json!({"channel": "ahp-root://"}))
        .await;
    assert_eq!(pong.get("result"), Some(&Value::Null), "{pong}");
}

/// A socket's token expires while one of its requests waits (a `reconnect`
/// whose host does not answer its re-baselining, the settle deadline 30 s
/// away): the socket closes with 4001 at expiry + leeway, not when the
/// request ends. Before, the read loop awaited the request and looked at
/// the token's standing only afterwards, so the socket went on receiving
/// for as long as the request took.
#[tokio::test]
async fn a_token_expiring_while_a_request_waits_closes_at_once() {
    let t = TestRelay::start_tweaked(vec![fast_config("a", 1)], "", "", |cfg| {
        cfg.limits.upstream_settle_secs = 30;
    })
    .await;
    t.wait_hosts_up().await;
    let chat = "ahp-chat:/a~a-1-main";
    let mut first = t.raw("alice").await;
    first.initialize("waits").await;
    let s = first
        .request(1, "subscribe", json!({"channel": chat}))
        .await;
    assert_eq!(s["result"]["snapshot"]["resource"], chat, "{s}");
    first.close_cleanly().await;
    let upstream = t.upstream_id("alice", "waits");
    t.hosts[0].stall_client(&upstream, true);
    let minted = Instant::now();
    let short = t
        .kit
        .token("alice", &[], Duration::from_secs(2), None)
        .unwrap();
    let mut ws = t.upgrade_bearer(&short).await.socket("2 s token");
    let params = json!({"channel": "ahp-root://", "clientId": "waits",
        "lastSeenServerSeq": 0, "subscriptions": [chat]});
    ws.send_json(&request_frame(1, "reconnect", params)).await;
    let close = ws.close_code().await;
    let elapsed = minted.elapsed();
    assert_eq!(close.map(|c| c.0), Some(4001), "close code");
    assert!(
        elapsed <= Duration::from_secs(12),
        "closed after {elapsed:?}: expected exp (2 s) + leeway (5 s), not the settle (30 s)"
    );
    // The host answers the re-baselining now: the answer is for a socket
    // told to close, so nothing it carried counts as received — the next
    // `reconnect` from the client's last position gets snapshots, never a
    // replay built on snapshots the client did not get.
    t.hosts[0].stall_client(&upstream, false);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let from = s["result"]["snapshot"]["fromSeq"].clone();
    let mut back = t.raw("alice").await;
    let params = json!({"channel": "ahp-root://", "clientId": "waits",
        "lastSeenServerSeq": from, "subscriptions": [chat]});
    let r = back.request(1, "reconnect", params).await;
    assert_eq!(r["result"]["type"], "snapshot", "{r}");
}

/// Putting a connected token's `jti` on the deny list closes its socket with 4003 (§3.3).
#[tokio::test]
async fn revoking_a_connected_token_closes_4003() {
    let dir = scratch_dir("deny-live");
    std::fs::create_dir_all(&dir).unwrap();
    let deny = dir.join("deny.txt");
    std::fs::write(&deny, "# nothing revoked yet\n").unwrap();
    let e = Edge::start_with(&format!("deny_list_file = \"{}\"", deny.display()), "").await;
    let token = e.hs256(&dev_claims(json!({"jti": "live-1"})));
    let mut ws = e.t.upgrade_bearer(&token).await.socket("before revocation");
    assert_works(&mut ws, "c-live").await;
    std::fs::write(&deny, "live-1\n").unwrap();
    assert_eq!(ws.close_code().await.map(|c| c.0), Some(4003));
    let u = e.t.upgrade_bearer(&token).await;
    assert_refused(&e, &u, 403, &token, "revoked after reload");
}

/// A broken key file does not hold back revocation: with the dev issuer's
/// secret file broken, a newly revoked `jti` still closes its socket with
/// 4003, and the issuer keeps its previous key (a token signed with it
/// still connects).
#[tokio::test]
async fn a_broken_key_file_does_not_hold_back_revocation() {
    let dir = scratch_dir("deny-broken-key");
    std::fs::create_dir_all(&dir).unwrap();
    let deny = dir.join("deny.txt");
    std::fs::write(&deny, "# nothing revoked yet\n").unwrap();
    let e = Edge::start_with(&format!("deny_list_file = \"{}\"", deny.display()), "").await;
    let token = e.hs256(&dev_claims(json!({"jti": "live-2"})));
    let other = e.valid();
    let mut ws = e.t.upgrade_bearer(&token).await.socket("before revocation");
    assert_works(&mut ws, "c-broken").await;
    std::fs::write(&e.t.kit.dev_key, "too short\n").unwrap();
    std::fs::write(&deny, "live-2\n").unwrap();
    assert_eq!(ws.close_code().await.map(|c| c.0), Some(4003));
    let u = e.t.upgrade_bearer(&token).await;
    assert_refused(&e, &u, 403, &token, "revoked while a key file is broken");
    let mut ws =
        e.t.upgrade_bearer(&other)
            .await
            .socket("the previous key still verifies");
    assert_works(&mut ws, "c-other").await;
}

// ─── 5. Health and metrics (§8.2) ───────────────────────────────────────────

/// `/healthz` and `/readyz` answer 200 on the admin listener and 404 on the
/// client listener; a non-upgrade GET to `/` gets 426.
#[tokio::test]
async fn health_endpoints_and_426_over_tls() {
    let e = Edge::start().await;
    assert_eq!(admin_get(&e.t, "/healthz").await.0, 200);
    assert_eq!(admin_get(&e.t, "/readyz").await.0, 200);
    assert_eq!(https_get(&e.t, "/healthz").await.0, 404);
    assert_eq!(https_get(&e.t, "/").await.0, 426);
    e.assert_no_host_traffic("health");
}

/// `/metrics` counts accepted connections and an expired-token refusal by reason.
#[tokio::test]
async fn metrics_count_connections_and_expired_refusals() {
    let e = Edge::start().await;
    let now = unix_now();
    let expired = e.hs256(&dev_claims(json!({"iat": now - 1200, "exp": now - 600})));
    assert_eq!(e.t.upgrade_bearer(&expired).await.status, 401);
    let mut ws = e.t.raw("alice").await;
    assert_works(&mut ws, "c-metrics").await;
    let (status, page) = admin_get(&e.t, "/metrics").await;
    assert_eq!(status, 200);
    assert_eq!(
        metric(&page, "ahp_relay_connections_total"),
        Some(1.0),
        "{page}"
    );
    assert_eq!(
        metric(&page, "ahp_relay_auth_failures_total{reason=\"expired\"}"),
        Some(1.0),
        "{page}"
    );
    assert!(!page.contains(&expired), "metrics never show a token");
}

// ─── 6. TLS trust (§3.1) ────────────────────────────────────────────────────

/// An untrusting client fails the TLS handshake; `insecure` connects; others still served.
#[tokio::test]
async fn untrusted_certificate_fails_insecure_connects() {
    let e = Edge::start().await;
    let token = e.t.token("alice");
    let mut webpki = e.t.dial_options(Some(token.clone()));
    webpki.ca_file = None;
    let err = dial_stream(&webpki).await.err();
    assert!(matches!(err, Some(DialError::Tls { .. })), "{err:?}");

    let dir = scratch_dir("other-ca");
    std::fs::create_dir_all(&dir).unwrap();
    let other = dir.join("other.pem");
    let (cert, _) = ahp_relay::edge::tls::self_signed(&["localhost"]).unwrap();
    std::fs::write(&other, cert).unwrap();
    let mut foreign = e.t.dial_options(Some(token.clone()));
    foreign.ca_file = Some(other);
    let err = dial_stream(&foreign).await.err();
    assert!(matches!(err, Some(DialError::Tls { .. })), "{err:?}");

    let mut insecure = e.t.dial_options(Some(token));
    insecure.ca_file = None;
    insecure.insecure = true;
    let ws = dial_stream(&insecure)
        .await
        .expect("insecure dial connects");
    assert_works(&mut RawWs::from_stream(ws), "c-insecure").await;

    assert_works(&mut e.t.raw("bob").await, "c-bob").await;
}

// ─── 7. Close codes and frame limits (§3.6, §3.7, S12) ──────────────────────

const SMALL_LIMITS: &str = "\n[limits]\nmax_frame_bytes = 4096\nmax_json_depth = 16\n";

/// A binary frame closes the socket with 1003; another client is unaffected.
#[tokio::test]
async fn binary_frame_closes_1003() {
    let e = Edge::start_with("", SMALL_LIMITS).await;
    let mut other = e.t.raw("bob").await;
    let mut ws = e.t.raw("alice").await;
    ws.send_binary(vec![1, 2, 3]).await;
    assert_eq!(ws.close_code().await.map(|c| c.0), Some(1003));
    assert_works(&mut other, "c-other").await;
}

/// A text frame larger than `max_frame_bytes` (4096) closes the socket with 1009.
#[tokio::test]
async fn oversized_frame_closes_1009() {
    let e = Edge::start_with("", SMALL_LIMITS).await;
    let mut other = e.t.raw("bob").await;
    let mut ws = e.t.raw("alice").await;
    let pad = "x".repeat(5000);
    ws.send_json(&request_frame(
        1,
        "ping",
        json!({"channel": "ahp-root://", "pad": pad}),
    ))
    .await;
    assert_eq!(ws.close_code().await.map(|c| c.0), Some(1009));
    assert_works(&mut other, "c-other").await;
}

/// JSON deeper than `max_json_depth` (16) gets -32600 and the socket stays open.
#[tokio::test]
async fn too_deep_json_gets_32600_and_socket_stays_open() {
    let e = Edge::start_with("", SMALL_LIMITS).await;
    let mut ws = e.t.raw("alice").await;
    // Top object = 1, params = 2, then `n` nested arrays: depth 2 + n.
    let ping = |id: u64, n: usize| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"ping","params":{{"channel":"ahp-root://","x":{}{}}}}}"#,
            "[".repeat(n),
            "]".repeat(n)
        )
    };
    ws.send_text(&ping(5, 15)).await;
    let answer = ws.recv_json().await.expect("an answer, not a close");
    assert_eq!(
        answer.pointer("/error/code"),
        Some(&json!(-32600)),
        "{answer}"
    );
    ws.send_text(&ping(6, 14)).await;
    let answer = ws.response(&json!(6)).await;
    assert_eq!(
        answer.get("result"),
        Some(&Value::Null),
        "depth 16 is fine: {answer}"
    );
    assert_works(&mut ws, "c-deep").await;
}

/// A TCP connection that never starts TLS is closed after `handshake_timeout_secs`.
#[tokio::test]
async fn silent_tcp_connection_is_closed_after_handshake_timeout() {
    let e = Edge::start_with("", "\n[limits]\nhandshake_timeout_secs = 1\n").await;
    let mut tcp = TcpStream::connect(e.t.relay.addr).await.expect("tcp");
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(4), tcp.read(&mut byte)).await;
    assert!(
        matches!(read, Ok(Ok(0) | Err(_))),
        "still open 4 s after a 1 s handshake timeout: {read:?}"
    );
}

/// An upgrade request left unfinished is closed after `handshake_timeout_secs` (TLS + HTTP).
#[tokio::test]
async fn stalled_upgrade_request_is_closed_after_handshake_timeout() {
    let e = Edge::start_with("", "\n[limits]\nhandshake_timeout_secs = 1\n").await;
    let tcp = TcpStream::connect(e.t.relay.addr).await.expect("tcp");
    let connector = tokio_rustls::TlsConnector::from(Arc::new(trusting(&e.t.kit.cert)));
    let name = ServerName::try_from("localhost").expect("name");
    let mut tls = connector.connect(name, tcp).await.expect("TLS handshake");
    tls.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n")
        .await
        .expect("partial request");
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(4), tls.read(&mut byte)).await;
    assert!(
        matches!(read, Ok(Ok(0) | Err(_))),
        "still open 4 s after a 1 s handshake timeout: {read:?}"
    );
}

/// A connection that keeps sending keep-alive requests without ever
/// upgrading is closed `upgrade_deadline_secs` after its accept (counted),
/// and its 426 answers are counted as refusals; a socket that did upgrade
/// is not bound by the deadline.
#[tokio::test]
async fn keep_alive_without_upgrade_is_closed_at_the_upgrade_deadline() {
    let e = Edge::start_with("", "\n[limits]\nupgrade_deadline_secs = 2\n").await;
    let mut upgraded = e.t.raw("alice").await;
    let tcp = TcpStream::connect(e.t.relay.addr).await.expect("tcp");
    let started = tokio::time::Instant::now();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(trusting(&e.t.kit.cert)));
    let name = ServerName::try_from("localhost").expect("name");
    let mut tls = connector.connect(name, tcp).await.expect("TLS handshake");
    let mut answers = 0;
    loop {
        assert!(
            started.elapsed() < common::WAIT,
            "still open after {answers} answers"
        );
        let asked = tls
            .write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .await;
        let mut buf = [0u8; 4096];
        let read = tokio::time::timeout(common::WAIT, tls.read(&mut buf)).await;
        match (asked, read) {
            (Ok(()), Ok(Ok(n))) if n > 0 => {
                assert!(buf.starts_with(b"HTTP/1.1 426"), "{:?}", &buf[..n]);
                answers += 1;
            }
            _ => break,
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let lived = started.elapsed();
    assert!(
        lived >= Duration::from_millis(1500),
        "closed after {lived:?}"
    );
    assert!(answers >= 2, "keep-alive answered meanwhile: {answers}");
    let (_, page) = admin_get(&e.t, "/metrics").await;
    assert_eq!(
        metric(
            &page,
            "ahp_relay_limit_hits_total{limit=\"upgrade_deadline\"}"
        ),
        Some(1.0),
        "{page}"
    );
    let refused = metric(
        &page,
        "ahp_relay_upgrades_refused_total{reason=\"not_websocket\"}",
    );
    assert_eq!(refused, Some(f64::from(answers)), "{page}");
    assert_works(&mut upgraded, "c-upgraded").await;
}

/// At `pending_connections_per_address` connections from one address that
/// have not upgraded, the next one is closed at accept, before any TLS
/// (counted once: the three upgraded sockets opened before do not count,
/// their places freed before their `101` was written, whichever edge thread
/// serves them); a closed pending connection frees its place.
#[tokio::test]
async fn pending_connections_are_capped_per_address() {
    let e = Edge::start_with("", "\n[limits]\npending_connections_per_address = 2\n").await;
    let mut upgraded = Vec::new();
    for _ in 0..3 {
        upgraded.push(e.t.raw("alice").await);
    }
    let first = TcpStream::connect(e.t.relay.addr).await.expect("tcp");
    let _second = TcpStream::connect(e.t.relay.addr).await.expect("tcp");
    let mut third = TcpStream::connect(e.t.relay.addr).await.expect("tcp");
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(common::WAIT, third.read(&mut byte)).await;
    assert!(
        matches!(read, Ok(Ok(0) | Err(_))),
        "the third pending connection is closed at once: {read:?}"
    );
    let (_, page) = admin_get(&e.t, "/metrics").await;
    assert_eq!(
        metric(
            &page,
            "ahp_relay_upgrades_refused_total{reason=\"address_connections\"}"
        ),
        Some(1.0),
        "{page}"
    );
    drop(first);
    let started = tokio::time::Instant::now();
    let port = e.t.relay.addr.port();
    while common::relay::https_status(port, &e.t.kit.cert, "/").await != Some(426) {
        assert!(
            started.elapsed() < common::WAIT,
            "the closed connection's place is never freed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (i, ws) in upgraded.iter_mut().enumerate() {
        assert_works(ws, &format!("c-held-{i}")).await;
    }
}

// ─── 8. Tokens never shown (§3.2, §7.5) ─────────────────────────────────────

/// `redact_query` hides `tkn` and `access_token` values and keeps other parameters.
#[test]
fn redact_query_hides_token_values() {
    use ahp_relay::auth::redact_query;
    let shown = redact_query("tkn=abc&x=1");
    assert!(!shown.contains("abc"), "{shown}");
    assert!(shown.contains("x=1"), "{shown}");
    let shown = redact_query("access_token=eyJsecret.part.sig&y=2");
    assert!(!shown.contains("eyJsecret"), "{shown}");
    assert!(shown.contains("y=2"), "{shown}");
}

/// `DialOptions`' `Debug` output never contains the token.
#[test]
fn dial_options_debug_hides_token() {
    let opts = DialOptions {
        url: "wss://relay.example/".into(),
        token: Some("eyJhbGciOi.super-secret-token.sig".into()),
        ca_file: None,
        insecure: false,
        connect_timeout: Duration::from_secs(1),
        extra_headers: Vec::new(),
    };
    let shown = format!("{opts:?}");
    assert!(!shown.contains("super-secret-token"), "{shown}");
    assert!(shown.contains("relay.example"), "{shown}");
}

// ─── per-principal connection cap (§3.6, S19) ───────────────────────────────

/// A principal with `connections_per_principal` sockets open gets 429 with
/// `Retry-After` for the next one, counted by reason; another principal is
/// unaffected; closing a socket frees the slot.
#[tokio::test]
async fn connections_per_principal_are_capped() {
    let e = Edge::start_with("", "[limits]\nconnections_per_principal = 2\n").await;
    let alice = e.t.token("alice");
    let mut open = Vec::new();
    for i in 0..2 {
        let u = e.t.upgrade_bearer(&alice).await;
        assert_eq!(u.status, 101, "connection {i} admitted");
        open.push(u.socket("alice"));
    }
    let u = e.t.upgrade_bearer(&alice).await;
    assert_eq!(u.status, 429, "third connection of alice");
    assert!(u.header(&RETRY_AFTER).is_some(), "Retry-After");
    let bob = e.t.upgrade_bearer(&e.t.token("bob")).await;
    assert_eq!(bob.status, 101, "bob is unaffected");
    assert_works(&mut bob.socket("bob"), "c-bob").await;
    let (_, metrics) = admin_get(&e.t, "/metrics").await;
    assert!(
        metrics.contains(r#"ahp_relay_upgrades_refused_total{reason="principal_connections"} 1"#),
        "{metrics}"
    );
    drop(open.pop());
    let mut admitted = false;
    for _ in 0..50 {
        let u = e.t.upgrade_bearer(&alice).await;
        if u.status == 101 {
            admitted = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(admitted, "a closed socket frees alice's slot");
}

/// A client that closes its socket with a close handshake releases the
/// connection at once (its writer task ends, not after a timeout): the
/// open-connections gauge is back to zero well within the 6 s the relay
/// would otherwise wait before aborting a stuck writer.
#[tokio::test]
async fn a_client_close_releases_the_connection_promptly() {
    let e = Edge::start().await;
    let mut ws = e.t.raw("closer").await;
    ws.initialize("bye").await;
    let open = |page: &str| metric(page, "ahp_relay_connections_open");
    let (_, page) = admin_get(&e.t, "/metrics").await;
    assert_eq!(open(&page), Some(1.0), "one socket open");
    let closed = std::time::Instant::now();
    ws.close_cleanly().await;
    loop {
        let (_, page) = admin_get(&e.t, "/metrics").await;
        assert!(
            closed.elapsed() < std::time::Duration::from_secs(2),
            "connection still counted open 2 s after a clean close"
        );
        if open(&page) == Some(0.0) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

// ─── The edge threads' time slice ───────────────────────────────────────────

/// The time slice (ns) of each of this process's `ahp-edge-*` threads, from `/proc`.
fn edge_thread_slices() -> Vec<u64> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    let mut slices = Vec::new();
    for task in tasks.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !comm.starts_with("ahp-edge-") || comm.starts_with("ahp-edge-stop") {
            continue;
        }
        let slice = reported_slice(&task.path().join("sched"))
            .and_then(|d| u64::try_from(d.as_nanos()).ok());
        slices.extend(slice);
    }
    slices
}

/// A relay configured with `edge_slice_us` serves clients from edge threads
/// running with that slice; every other relay's edge threads in this test
/// process run with the default (100 µs), none with the kernel's.
#[tokio::test]
async fn edge_threads_run_with_the_configured_time_slice() {
    if !kernel_honours_slices() {
        eprintln!("skipped: this kernel predates custom time slices (Linux 6.12)");
        return;
    }
    let t = TestRelay::start_tweaked(vec![fast_config("sliced", 1)], "", "", |c| {
        c.listen.edge_slice_us = 400;
    })
    .await;
    t.wait_hosts_up().await;
    assert_works(&mut t.raw("alice").await, "c-sliced").await;
    let slices = edge_thread_slices();
    assert!(
        slices.contains(&400_000),
        "the configured relay's edge threads run with 400 µs: {slices:?}"
    );
    assert!(
        slices.iter().all(|s| *s == 400_000 || *s == 100_000),
        "every edge thread runs with the configured or the default slice: {slices:?}"
    );
}

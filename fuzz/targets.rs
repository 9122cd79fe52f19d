//! The fuzz target bodies, one `pub fn(&[u8])` per target. Included by each libFuzzer
//! entry point (`fuzz/fuzz_targets/*.rs`, nightly) and by `tests/fuzz_corpus.rs` (stable),
//! which replays every committed corpus file through the same functions.
//!
//! Each body drives one of the relay's real entry points with arbitrary input and asserts
//! what that entry point promises, not only that it returns: a classified frame agrees
//! with serde_json's reading of it, a spliced frame is valid JSON equal to the parsed
//! frame with the same values replaced, a host URI the relay qualifies comes back to the
//! same host URI (or is refused), a token found in a query string is never in the
//! redacted query, a config that loads is valid and its rules bind issuers.
#![allow(dead_code)]

use std::path::Path;
use std::sync::OnceLock;

use ahp_relay::auth::{TokenSource, extract_token, redact_query};
use ahp_relay::config::{ConfigError, RelayConfig};
use ahp_relay::identity::PrincipalKey;
use ahp_relay::names::client_uri::validate_client_uri;
use ahp_relay::names::namer::{ToClient, ToHost, route};
use ahp_relay::names::qualify::{self, ClientName};
use ahp_relay::names::store::{Owner, RedbStore, UriStore};
use ahp_relay::names::translate::{self, FieldKind, Namer};
use ahp_relay::policy::rules::{PolicyConfig, RulePolicy};
use ahp_relay::policy::{HostRef, Policy, Subject};
use ahp_relay::rpc::RpcError;
use ahp_relay::session::envelope::rewrite_envelope;
use ahp_relay::upstream::hub::{HostConfig, HostHub};
use ahp_relay::wire::{self, Edit, EditValue, Frame, FrameKind, Refusal, WireLimits};
use serde_json::Value;

/// The host every host-side input comes from.
pub const HOST: &str = "gpu1";
/// Another configured host (owns a store entry too).
pub const OTHER_HOST: &str = "cpu2";
/// The receiving session's identities: (upstream id, client id).
pub const IDENTITY: (&str, &str) = ("up-7f3a", "client-1");
/// Client-chosen URIs the store records: (URI, host).
pub const STORE_ENTRIES: &[(&str, &str)] = &[
    ("ahp-session:/mine", HOST),
    ("ahp-terminal:/t1", HOST),
    ("ahp-session:/theirs", OTHER_HOST),
];

/// Limits small enough that libFuzzer reaches them (the relay's defaults are larger).
const LIMITS: WireLimits = WireLimits {
    max_frame_bytes: 64 * 1024,
    max_depth: 32,
};

/// The shared in-memory URI store holding [`STORE_ENTRIES`] (lookups are served from
/// memory, so one store serves every run).
pub fn store() -> &'static RedbStore {
    static STORE: OnceLock<RedbStore> = OnceLock::new();
    STORE.get_or_init(|| {
        let store = RedbStore::open_in_memory().expect("in-memory store");
        let owner = Owner {
            issuer: "https://idp".into(),
            subject: "alice".into(),
            groups: vec![],
        };
        for (uri, host) in STORE_ENTRIES {
            store.reserve(uri, host, &owner, 1).expect("reserve");
            store.confirm(uri).expect("confirm");
        }
        store
    })
}

/// A session's record of shown host objects, as `rewrite_envelope` fills it.
fn seen() -> &'static ahp_relay::names::seen::Seen {
    static SEEN: OnceLock<ahp_relay::names::seen::Seen> = OnceLock::new();
    SEEN.get_or_init(|| {
        let evicted = prometheus::IntCounter::new("fuzz_seen_evicted", "evicted").expect("counter");
        ahp_relay::names::seen::Seen::new(64, evicted)
    })
}

fn hub() -> &'static HostHub {
    static HUB: OnceLock<HostHub> = OnceLock::new();
    HUB.get_or_init(|| {
        let cfg: HostConfig = toml_host(&format!(
            "id = \"{HOST}\"\nurl = \"wss://{HOST}.example:8443\""
        ));
        HostHub::new(cfg).expect("hub")
    })
}

fn toml_host(text: &str) -> HostConfig {
    toml::from_str(text).expect("host config")
}

// ---------------------------------------------------------------------------------------
// (a) frames
// ---------------------------------------------------------------------------------------

/// A client frame: classified as `request::on_client_frame` does; a refusal answers with
/// a valid JSON-RPC error frame; an accepted frame agrees with serde_json, and splicing a
/// host channel and a relay id into it yields that value with those members replaced.
pub fn wire_client(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return; // the WebSocket layer refuses non-UTF-8 text frames
    };
    let frame = match wire::classify(text, &LIMITS) {
        Ok(frame) => frame,
        Err(e) => return check_refusal(text, &e),
    };
    let Some(value) = parsed(text) else {
        return;
    };
    check_frame(text, &frame, &value);
    check_client_splice(text, &frame, &value);
}

/// The answer to a refused frame is valid JSON and echoes the id it names.
fn check_refusal(text: &str, e: &wire::WireError) {
    if let Refusal::Answer { id } = wire::refusal(text, e) {
        let raw = id.as_ref().map_or("null", |i| i.raw);
        let err = RpcError::with_code(e.json_rpc_code(), e.to_string(), None);
        let frame = err.frame(raw);
        let answer: Value = match serde_json::from_str(&frame) {
            Ok(answer) => answer,
            Err(parse) if lenient(&parse, raw) => return,
            Err(parse) => panic!("refusal {frame:?} is not JSON: {parse}"),
        };
        let id_value: Value = serde_json::from_str(raw).expect("echoed id is JSON");
        assert_eq!(answer["id"], id_value, "refusal echoes the id");
        assert_eq!(answer["error"]["code"], e.json_rpc_code());
    }
}

/// serde_json's reading of an accepted frame; `None` only where `classify` documents that
/// it accepts more (lone surrogate escapes in skipped strings).
fn parsed(text: &str) -> Option<Value> {
    match serde_json::from_str(text) {
        Ok(v) => Some(v),
        Err(e) => {
            assert!(
                lenient(&e, text),
                "classify accepted what serde_json refuses ({e}): {text:?}"
            );
            None
        }
    }
}

/// Where `classify` (which validates with serde_json's skipping visitor) and a
/// `serde_json::Value` parse legitimately differ: lone surrogate escapes, and numbers
/// outside f64's range, which JSON's grammar allows and a skipped value never converts.
fn lenient(e: &serde_json::Error, text: &str) -> bool {
    text.contains("\\u") || e.to_string().contains("number out of range")
}

/// Every value `classify` read equals serde_json's, and every range holds that token.
fn check_frame(text: &str, frame: &Frame<'_>, v: &Value) {
    assert_eq!(v["jsonrpc"], "2.0");
    match &frame.kind {
        FrameKind::Request { id, method } => {
            assert_eq!(v["method"], method.as_ref());
            assert_eq!(token(text, &id.range), v["id"]);
        }
        FrameKind::Notification { method } => {
            assert_eq!(v["method"], method.as_ref());
            assert!(v.get("id").is_none());
        }
        FrameKind::Response { id } => assert_eq!(token(text, &id.range), v["id"]),
        FrameKind::ErrorResponse { id, error } => {
            assert_eq!(token(text, &id.range), v["id"]);
            assert_eq!(token(text, error), v["error"]);
        }
    }
    if let Some(id) = frame.id() {
        assert_eq!(text.get(id.range.clone()), Some(id.raw));
    }
    // `classify` reads `params` only on requests and notifications, `result` only on
    // responses: a response's `params` routes nothing.
    if frame.method().is_some() {
        check_params(text, frame, v.get("params"));
    } else {
        check_result(text, frame, v.get("result"));
    }
}

fn check_params(text: &str, frame: &Frame<'_>, params: Option<&Value>) {
    let p = &frame.params;
    let get = |key: &str| params.and_then(|p| p.get(key));
    if let Some(channel) = &p.channel {
        assert_eq!(get("channel"), Some(&Value::from(channel.value.as_ref())));
        assert_eq!(token(text, &channel.range), *channel.value);
    }
    if let Some(seq) = &p.server_seq {
        assert_eq!(get("serverSeq").and_then(Value::as_u64), Some(seq.value));
        assert_eq!(token(text, &seq.range), seq.value);
    }
    match &p.action {
        Some(range) => assert_eq!(Some(&token(text, range)), get("action")),
        None => assert!(get("action").is_none()),
    }
    let action_type = get("action").and_then(|a| a.get("type"));
    assert_eq!(
        p.action_type
            .as_ref()
            .map(|t| Value::from(t.value.as_ref())),
        action_type.cloned()
    );
    match &p.origin {
        Some(range) => assert_eq!(Some(&token(text, range)), get("origin")),
        None => assert!(get("origin").is_none()),
    }
    let client_id = get("origin").and_then(|a| a.get("clientId"));
    assert_eq!(
        p.origin_client_id
            .as_ref()
            .map(|t| Value::from(t.value.as_ref())),
        client_id.cloned()
    );
}

fn check_result(text: &str, frame: &Frame<'_>, result: Option<&Value>) {
    let r = &frame.result;
    if let Some(seq) = &r.server_seq {
        let found = result.and_then(|r| r.get("serverSeq"));
        assert_eq!(found.and_then(Value::as_u64), Some(seq.value));
        assert_eq!(token(text, &seq.range), seq.value);
    }
    let snapshot = result.and_then(|r| r.get("snapshot"));
    if let Some(s) = &r.snapshot {
        check_snapshot(text, s, snapshot.expect("snapshot read from nothing"));
    }
    let array = result
        .and_then(|r| r.get("snapshots"))
        .and_then(Value::as_array);
    assert_eq!(r.snapshots.len(), array.map_or(0, Vec::len));
    for (s, v) in r.snapshots.iter().zip(array.into_iter().flatten()) {
        check_snapshot(text, s, v);
    }
}

fn check_snapshot(text: &str, s: &wire::SnapshotFields<'_>, v: &Value) {
    if let Some(seq) = &s.from_seq {
        assert_eq!(v.get("fromSeq").and_then(Value::as_u64), Some(seq.value));
        assert_eq!(token(text, &seq.range), seq.value);
    }
    if let Some(resource) = &s.resource {
        assert_eq!(
            v.get("resource"),
            Some(&Value::from(resource.value.as_ref()))
        );
        assert_eq!(token(text, &resource.range), *resource.value);
    }
}

/// The JSON value of `text[range]`; panics unless the range is one whole JSON value.
fn token(text: &str, range: &std::ops::Range<usize>) -> Value {
    let slice = text.get(range.clone()).expect("range on char boundaries");
    serde_json::from_str(slice).expect("range covers one JSON value")
}

/// Splices a host channel (with characters that need escaping) over `params.channel` and
/// a relay-assigned id over the request id, as forwarding does; the result must be the
/// same JSON value with exactly those members replaced.
fn check_client_splice(text: &str, frame: &Frame<'_>, v: &Value) {
    const CHANNEL: &str = "ahp-session:/x\"\\\n\u{1}é";
    let mut expected = v.clone();
    let mut edits = Vec::new();
    if let Some(channel) = &frame.params.channel {
        edits.push(Edit {
            range: channel.range.clone(),
            replacement: EditValue::JsonString(CHANNEL),
        });
        expected["params"]["channel"] = CHANNEL.into();
    }
    if let FrameKind::Request { id, .. } = &frame.kind {
        edits.push(Edit {
            range: id.range.clone(),
            replacement: EditValue::U64(u64::MAX),
        });
        expected["id"] = u64::MAX.into();
    }
    let out = wire::splice(text, &mut edits).expect("ranges from classify splice");
    let got: Value = serde_json::from_str(&out).expect("spliced frame is JSON");
    assert_eq!(got, expected);
    let again = wire::classify(&out, &WireLimits::default()).expect("spliced frame classifies");
    if frame.params.channel.is_some() {
        assert_eq!(again.channel(), Some(CHANNEL));
    }
}

/// A host frame: classified as a link's `host_frame` does; an `action` envelope is
/// rewritten by the session's `rewrite_envelope` into a client frame that is the host's
/// value with the client channel, the session's number, the client's own id and the
/// translated action spliced in, which the client can classify, and whose action
/// translates back to the host's (or is refused).
pub fn wire_host(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let classified = wire::classify(text, &LIMITS);
    // The fast path for notifications agrees with the general one or declines.
    if let Some(fast) = wire::classify_notification(text, &LIMITS) {
        assert_eq!(
            Ok(fast),
            classified,
            "classify_notification disagrees with classify"
        );
    }
    // A frame a per-client link discards unread is never one the general path acts on.
    if wire::is_catalog_notification(text)
        && let Ok(frame) = &classified
    {
        assert!(
            matches!(&frame.kind, FrameKind::Notification { method } if method.starts_with("root/session")),
            "is_catalog_notification took {:?}",
            frame.kind
        );
    }
    let Ok(frame) = classified else {
        return;
    };
    let Some(value) = parsed(text) else {
        return;
    };
    check_frame(text, &frame, &value);
    if let FrameKind::Response { .. } = frame.kind {
        return check_snapshots_back(&value);
    }
    if frame.method() != Some("action") {
        return;
    }
    let (Some(_), Some(_)) = (frame.channel(), &frame.params.server_seq) else {
        return;
    };
    const CLIENT_CHANNEL: &str = "ahp-session:/gpu1~s\"1";
    const N: u64 = 9_007_199_254_740_991;
    // A small arena shared by two envelopes: the second is spliced after the
    // first, so a frame that wrote past its own bytes would show in either.
    // The second passes the channel's JSON token made beforehand (as a
    // batch's route does): the same bytes either way.
    let mut arena = bytes::BytesMut::with_capacity(16);
    let mut token = String::new();
    wire::json_escape_into(&mut token, CLIENT_CHANNEL);
    let n = wire::Decimal::of(N);
    let mut rewrite = |token| {
        rewrite_envelope(
            (text, &frame),
            (CLIENT_CHANNEL, token, &n),
            hub(),
            store(),
            (IDENTITY, seen()),
            &mut arena,
        )
    };
    let (first, second) = (rewrite(None), rewrite(Some(token.as_str())));
    // Both lie in the batch's one buffer, the second right after the first.
    let whole = arena.split().freeze();
    let [first, out] = [first, second].map(|p| p.map(|p| wire::Text::in_batch(&whole, p)));
    assert_eq!(first, out, "the same envelope spliced twice into one arena");
    if let (Some(a), Some(b)) = (&first, &out)
        && a.framed().is_some()
        && b.framed().is_some()
    {
        assert!(b.follows(a), "the second envelope continues the first");
        let both = [a.framed(), b.framed()]
            .map(Option::unwrap_or_default)
            .concat();
        assert_eq!(b.framed_from(a), both);
    }
    if let Some(framed) = out.as_ref().and_then(wire::Text::framed) {
        // A header carried in front is the text frame's for the payload.
        let len = out.as_ref().map_or(0, wire::Text::len);
        let (header, used) = wire::frame_header(0x1, len);
        assert_eq!(framed.get(..used), header.get(..used), "frame header");
        assert_eq!(framed.len(), used + len);
    }
    let out = out.map(|t| t.to_str().to_string());
    let expected = expected_envelope(&value, CLIENT_CHANNEL, N);
    match (out, expected) {
        (Some(out), Some(expected)) => {
            let got: Value = serde_json::from_str(&out).expect("client envelope is JSON");
            assert_eq!(got, expected);
            let again = wire::classify(&out, &LIMITS).expect("client can classify it");
            assert_eq!(again.channel(), Some(CLIENT_CHANNEL));
            assert_eq!(again.params.server_seq.as_ref().map(|s| s.value), Some(N));
            check_action_back(&value, &got);
        }
        (None, None) => {}
        (out, expected) => panic!("rewrite gave {out:?}, expected {expected:?}"),
    }
}

/// What the client envelope must be, computed on the parsed value: `None` when the action
/// names something that cannot be translated.
fn expected_envelope(v: &Value, client_channel: &str, n: u64) -> Option<Value> {
    let mut expected = v.clone();
    let params = &mut expected["params"];
    params["channel"] = client_channel.into();
    params["serverSeq"] = n.into();
    if params.pointer("/origin/clientId") == Some(&Value::from(IDENTITY.0)) {
        params["origin"]["clientId"] = IDENTITY.1.into();
    }
    let ty = params.pointer("/action/type").and_then(Value::as_str);
    if let Some(ty) = ty.filter(|ty| translate::rows(ty).is_some()) {
        let ty = ty.to_string();
        let namer = to_client();
        translate::translate(&mut params["action"], &ty, &namer).ok()?;
    }
    Some(expected)
}

fn to_client() -> ToClient<'static> {
    ToClient {
        host: HOST,
        store: store(),
        identity: Some(IDENTITY),
    }
}

fn to_host() -> ToHost<'static> {
    ToHost {
        host: HOST,
        store: store(),
        identity: IDENTITY,
    }
}

/// The client form of a host action translates back (client → host, as a dispatch of it
/// would) to the host's action, or is refused.
fn check_action_back(host: &Value, client: &Value) {
    let Some(ty) = host.pointer("/params/action/type").and_then(Value::as_str) else {
        return;
    };
    if translate::rows(ty).is_none() || host.to_string().contains(IDENTITY.1) {
        return; // the client's own id only ever names the sender on the way back
    }
    let mut back = client["params"]["action"].clone();
    if translate::translate(&mut back, ty, &to_host()).is_ok() {
        assert_eq!(canonical(back), canonical(host["params"]["action"].clone()));
    }
}

/// Each snapshot's state in a host's response, translated to the client's names along the
/// shape its channel gives (as `client_snapshot` does), translates back to the host's
/// state or is refused.
fn check_snapshots_back(v: &Value) {
    let result = &v["result"];
    let listed = result["snapshots"].as_array().into_iter().flatten();
    for snap in std::iter::once(&result["snapshot"]).chain(listed) {
        let Some(resource) = snap.get("resource").and_then(Value::as_str) else {
            continue;
        };
        let Some(shape) = translate::state_shape(resource) else {
            continue;
        };
        let host_state = snap.get("state").cloned().unwrap_or(Value::Null);
        let mut state = host_state.clone();
        if translate::translate(&mut state, shape, &to_client()).is_err()
            || host_state.to_string().contains(IDENTITY.1)
        {
            continue;
        }
        if translate::translate(&mut state, shape, &to_host()).is_ok() {
            assert_eq!(canonical(state), canonical(host_state), "{shape}");
        }
    }
}

/// `value` with every string that is a host-local file URI in its canonical spelling.
fn canonical(mut value: Value) -> Value {
    fn walk(v: &mut Value) {
        match v {
            Value::String(s) => *s = canonical_uri(s),
            Value::Array(a) => a.iter_mut().for_each(walk),
            Value::Object(o) => o.values_mut().for_each(walk),
            _ => {}
        }
    }
    walk(&mut value);
    value
}

// ---------------------------------------------------------------------------------------
// (b) names
// ---------------------------------------------------------------------------------------

/// A host's local file URI in the one spelling hosts receive back from the relay
/// (`file:/p` and `file://localhost/p` name the same file as `file:///p`, RFC 8089);
/// any other string unchanged.
pub fn canonical_uri(uri: &str) -> String {
    let Some((scheme, rest)) = uri.split_once(':') else {
        return uri.to_string();
    };
    if !scheme.eq_ignore_ascii_case("file") {
        return uri.to_string();
    }
    let path = match rest.strip_prefix("//") {
        Some(after) => {
            let (authority, path) = after.split_at(after.find('/').unwrap_or(after.len()));
            if !(authority.is_empty() || authority.eq_ignore_ascii_case("localhost")) {
                return uri.to_string();
            }
            path
        }
        None if rest.starts_with('/') => rest,
        None => return uri.to_string(),
    };
    format!("{scheme}://{path}")
}

/// The first byte picks the field kind, the rest is the value. Host → client → host must
/// give back the host's value (up to [`canonical_uri`]) or be refused; client → host →
/// client must give back the client's value; a client-chosen URI the grammar accepts is
/// never a qualified name.
pub fn names(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let Ok(value) = std::str::from_utf8(rest) else {
        return;
    };
    let kind = match selector % 3 {
        0 => FieldKind::Uri,
        1 => FieldKind::UriTemplate,
        _ => FieldKind::Provider,
    };
    host_round_trip(kind, value);
    client_round_trip(kind, value);
    if let Ok(uri) = validate_client_uri(value) {
        assert_eq!(format!("{}:/{}", uri.scheme, uri.id), value);
        assert!(matches!(
            qualify::read_client_uri(value),
            Ok(ClientName::Verbatim { .. })
        ));
    }
    let _ = (qualify::channel_kind(value), translate::state_shape(value));
}

fn host_round_trip(kind: FieldKind, host_value: &str) {
    let Ok(client) = to_client().translate(kind, host_value) else {
        return;
    };
    if matches!(kind, FieldKind::Uri) && !qualify::is_host_name(host_value) {
        assert_eq!(client, host_value, "a non-host URI passes unchanged");
    }
    if let Ok(back) = to_host().translate(kind, &client) {
        assert_eq!(
            canonical_uri(&back),
            canonical_uri(host_value),
            "via {client:?}"
        );
    }
    if matches!(kind, FieldKind::Uri)
        && let Some((host, host_uri)) = route(store(), &client)
    {
        assert_eq!(host, HOST, "{client:?} routes to the host it came from");
        assert_eq!(canonical_uri(&host_uri), canonical_uri(host_value));
    }
}

fn client_round_trip(kind: FieldKind, client: &str) {
    let Ok(host_value) = to_host().translate(kind, client) else {
        return;
    };
    if matches!(kind, FieldKind::Uri)
        && matches!(
            qualify::read_client_uri(client),
            Ok(ClientName::LocalFile { .. }) | Err(_)
        )
    {
        return; // a bare local file names whichever host it is sent to
    }
    let again = to_client().translate(kind, &host_value);
    if let FieldKind::UriTemplate = kind {
        return; // templates hold local files too; their parts are checked as URIs
    }
    assert_eq!(again.as_deref(), Ok(client), "via {host_value:?}");
}

// ---------------------------------------------------------------------------------------
// (c) token extraction
// ---------------------------------------------------------------------------------------

/// Lines of `<h>value`, `h` picking `Authorization`, `Sec-WebSocket-Protocol` or another
/// header; a line starting with `?` is the query. `extract_token` never panics, a token it
/// returns is non-empty and from a place it may read, and the redacted query a log line
/// shows never holds a query token's value.
pub fn auth(data: &[u8]) {
    let mut headers = http::HeaderMap::new();
    let mut query = None;
    for line in data.split(|b| *b == b'\n') {
        let Some((&h, value)) = line.split_first() else {
            continue;
        };
        if h == b'?' {
            query = std::str::from_utf8(value).ok();
            continue;
        }
        let name = match h % 3 {
            0 => http::header::AUTHORIZATION,
            1 => http::header::SEC_WEBSOCKET_PROTOCOL,
            _ => http::header::USER_AGENT,
        };
        if let Ok(value) = http::HeaderValue::from_bytes(value) {
            headers.append(name, value);
        }
    }
    let allow_query = data.first().is_some_and(|b| b % 2 == 0);
    let found = extract_token(&headers, query, allow_query);
    assert_eq!(found, extract_token(&headers, query, allow_query));
    if let Ok(Some((token, source))) = &found {
        assert!(!token.is_empty());
        match source {
            TokenSource::QueryTkn | TokenSource::QueryAccessToken => {
                assert!(allow_query && query.is_some());
            }
            TokenSource::AuthorizationHeader => {
                assert!(!token.contains(char::is_whitespace));
            }
            TokenSource::Subprotocol => {}
        }
    }
    if let Some(query) = query {
        check_redaction(query);
    }
}

/// Every parameter `extract_token` would read a token from is redacted.
fn check_redaction(query: &str) {
    let redacted = redact_query(query);
    assert_eq!(redacted.split('&').count(), query.split('&').count());
    for (pair, shown) in query.split('&').zip(redacted.split('&')) {
        let mut single = http::HeaderMap::new();
        single.insert(
            http::header::USER_AGENT,
            http::HeaderValue::from_static("x"),
        );
        let reads = matches!(
            extract_token(&single, Some(pair), true),
            Ok(Some(_)) | Err(_)
        );
        if reads && pair.contains('=') && !pair.ends_with('=') {
            assert!(
                shown.ends_with("=REDACTED"),
                "{pair:?} shown as {shown:?} in a log line"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// (d) configuration
// ---------------------------------------------------------------------------------------

/// TOML text as a whole config file and as a `[policy]` section alone. A config that
/// loads is valid; an error at a place names a line of the file; with two issuers every
/// rule names its issuer, so a token of an unconfigured issuer is granted nothing.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match RelayConfig::parse(text, Path::new("fuzz.toml")) {
        Ok(cfg) => {
            assert!(cfg.validate().is_ok());
            assert!(cfg.validate_policy().is_ok());
            let issuers: Vec<&str> = cfg.auth.issuers.iter().map(|i| i.issuer.as_str()).collect();
            check_policy(&cfg.policy, &cfg.hosts, &issuers);
        }
        Err(ConfigError::InvalidAt { line, .. }) => {
            assert!((1..=text.matches('\n').count() + 1).contains(&line));
        }
        Err(_) => {}
    }
    if let Ok(policy) = toml::from_str::<PolicyConfig>(text) {
        let hosts = [(HOST, Some("gpu")), (OTHER_HOST, None)];
        if policy.validate(&hosts).is_ok() && policy.validate_issuers(&["a", "b"]).is_ok() {
            let host_cfgs = vec![toml_host(&format!(
                "id = \"{HOST}\"\nlabel = \"gpu\"\nurl = \"wss://h\""
            ))];
            check_policy(&policy, &host_cfgs, &["a", "b"]);
        }
    }
}

/// Compiles `policy` and asks it for grants; a principal of an issuer that is not
/// configured gets none when more than one issuer is.
fn check_policy(policy: &PolicyConfig, hosts: &[HostConfig], issuers: &[&str]) {
    let compiled = RulePolicy::new(policy);
    let groups = ["platform".to_string(), "dev".to_string()];
    for issuer in issuers.iter().copied().chain(["https://elsewhere"]) {
        let principal = PrincipalKey {
            issuer: issuer.to_string(),
            subject: "alice".into(),
        };
        let who = Subject {
            principal: &principal,
            groups: &groups,
        };
        for h in hosts {
            let host = HostRef {
                id: &h.id,
                label: h.label.as_deref(),
            };
            let grant = compiled.grant(who, host);
            if issuers.len() > 1 && !issuers.contains(&issuer) {
                assert!(grant.is_none(), "a rule matched an unconfigured issuer");
            }
        }
    }
}

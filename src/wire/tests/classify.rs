//! Every classification case: kinds, ids, refusals, escapes, duplicates, limits.

use std::borrow::Cow;

use super::{at, err, ok};
use crate::wire::fields::span;
use crate::wire::{FrameKind, IdKind, WireError, WireLimits, classify};

const ACTION: &str = r#"{"jsonrpc":"2.0","method":"action","params":{"channel":"ahp-chat:/c-1","action":{"type":"chat/delta","turnId":"t1","content":"hi"},"serverSeq":12345,"origin":{"clientId":"x","clientSeq":3}}}"#;

#[test]
fn action_envelope_reads_every_routed_value() {
    let frame = ok(ACTION);
    assert_eq!(frame.method(), Some("action"));
    assert!(frame.id().is_none());
    assert!(matches!(frame.kind, FrameKind::Notification { .. }));
    let p = &frame.params;
    let channel = p.channel.as_ref().expect("channel");
    assert_eq!(channel.value, "ahp-chat:/c-1");
    assert!(matches!(channel.value, Cow::Borrowed(_)));
    assert_eq!(at(ACTION, channel.range.clone()), r#""ahp-chat:/c-1""#);
    let seq = p.server_seq.as_ref().expect("serverSeq");
    assert_eq!((seq.value, at(ACTION, seq.range.clone())), (12345, "12345"));
    let action = p.action.clone().expect("action");
    assert_eq!(
        at(ACTION, action),
        r#"{"type":"chat/delta","turnId":"t1","content":"hi"}"#
    );
    let action_type = p.action_type.as_ref().expect("type");
    assert_eq!(action_type.value, "chat/delta");
    assert_eq!(at(ACTION, action_type.range.clone()), r#""chat/delta""#);
    assert_eq!(
        at(ACTION, p.origin.clone().expect("origin")),
        r#"{"clientId":"x","clientSeq":3}"#
    );
    let client = p.origin_client_id.as_ref().expect("clientId");
    assert_eq!(
        (&*client.value, at(ACTION, client.range.clone())),
        ("x", r#""x""#)
    );
    assert_eq!(frame.channel(), Some("ahp-chat:/c-1"));
}

#[test]
fn request_ids_are_kept_exactly() {
    for (id, kind, as_u64) in [
        ("7", IdKind::Number, Some(7)),
        ("0", IdKind::Number, Some(0)),
        ("18446744073709551615", IdKind::Number, Some(u64::MAX)),
        ("18446744073709551616", IdKind::Number, None),
        ("-5", IdKind::Number, None),
        ("1.5", IdKind::Number, None),
        ("1e3", IdKind::Number, None),
        (r#""abc""#, IdKind::String, None),
        (r#""12""#, IdKind::String, None),
        (r#""a\"b\u00e9""#, IdKind::String, None),
        (r#""""#, IdKind::String, None),
    ] {
        let text = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"ping","params":{{"channel":"ahp-root://"}}}}"#
        );
        let frame = ok(&text);
        let Some(raw) = frame.id() else {
            panic!("{text}: no id")
        };
        assert_eq!(
            (raw.raw, raw.kind, raw.as_u64()),
            (id, kind, as_u64),
            "{text}"
        );
        assert_eq!(at(&text, raw.range.clone()), id);
        assert!(matches!(frame.kind, FrameKind::Request { .. }), "{text}");
        assert_eq!(frame.method(), Some("ping"));
    }
}

#[test]
fn string_id_request_is_a_request_not_a_notification() {
    let frame = ok(r#"{"id":"abc","method":"ping","jsonrpc":"2.0"}"#);
    let FrameKind::Request { id, method } = frame.kind else {
        panic!("not a request")
    };
    assert_eq!((id.raw, &*method), (r#""abc""#, "ping"));
}

#[test]
fn bad_ids_are_refused() {
    for id in ["null", "true", "false", "{}", "[1]", r#"{"a":1}"#] {
        let text = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#);
        assert_eq!(err(&text), WireError::BadId, "{text}");
    }
    assert_eq!(
        err(r#"{"jsonrpc":"2.0","id":null,"result":{}}"#),
        WireError::BadId
    );
    assert_eq!(
        err(r#"{"jsonrpc":"2.0","id":[],"result":{}}"#),
        WireError::BadId
    );
}

#[test]
fn notification_has_no_id() {
    let frame =
        ok(r#"{"jsonrpc":"2.0","method":"unsubscribe","params":{"channel":"ahp-chat:/c"}}"#);
    assert!(
        matches!(frame.kind, FrameKind::Notification { ref method } if method == "unsubscribe")
    );
    assert_eq!(frame.channel(), Some("ahp-chat:/c"));
}

#[test]
fn responses_and_error_responses() {
    for result in ["null", "{}", "[]", "5", r#""s""#, r#"{"snapshot":null}"#] {
        let text = format!(r#"{{"jsonrpc":"2.0","id":3,"result":{result}}}"#);
        let frame = ok(&text);
        assert!(
            matches!(frame.kind, FrameKind::Response { ref id } if id.raw == "3"),
            "{text}"
        );
        assert_eq!(frame.result, Default::default(), "{text}");
    }
    let text = r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}"#;
    let FrameKind::ErrorResponse { id, error } = ok(text).kind else {
        panic!("not an error")
    };
    assert_eq!((id.kind, id.raw), (IdKind::Null, "null"));
    assert_eq!(
        at(text, error),
        r#"{"code":-32700,"message":"Parse error"}"#
    );
    let text = r#"{"jsonrpc":"2.0","error":{"code":1,"message":"m"},"id":"q"}"#;
    assert!(matches!(ok(text).kind, FrameKind::ErrorResponse { ref id, .. } if id.raw == r#""q""#));
}

#[test]
fn shapes_that_are_no_message_kind() {
    for text in [
        r#"{"jsonrpc":"2.0","id":1}"#,
        r#"{"jsonrpc":"2.0","id":1,"params":{"channel":"c"}}"#,
        r#"{"jsonrpc":"2.0"}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m","result":{}}"#,
        r#"{"jsonrpc":"2.0","method":"m","error":{"code":1}}"#,
        r#"{"jsonrpc":"2.0","id":1,"result":{},"error":{"code":1}}"#,
        r#"{"jsonrpc":"2.0","result":{}}"#,
        r#"{"jsonrpc":"2.0","error":{"code":1,"message":"m"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"error":"boom"}"#,
    ] {
        let error = err(text);
        assert!(
            matches!(error, WireError::BadShape { .. }),
            "{text}: {error:?}"
        );
        assert_eq!(error.json_rpc_code(), -32600);
    }
}

#[test]
fn method_must_be_a_string() {
    for method in ["5", "null", "{}", "[]", "true"] {
        let text = format!(r#"{{"jsonrpc":"2.0","id":1,"method":{method}}}"#);
        assert_eq!(err(&text), WireError::MethodNotString, "{text}");
    }
}

#[test]
fn batches_non_objects_and_invalid_json() {
    assert_eq!(
        err(r#"[{"jsonrpc":"2.0","method":"ping"}]"#),
        WireError::Batch
    );
    assert_eq!(err(" [] "), WireError::Batch);
    for text in [r#""hello""#, "42", "-1.5e3", "null", "true", r#""a\nb""#] {
        assert_eq!(err(text), WireError::NotObject, "{text}");
    }
    for text in [
        "",
        "   ",
        "{",
        "[1,",
        r#"{"jsonrpc":"2.0","#,
        r#"{"jsonrpc":"2.0","method":"ping"} x"#,
        r#"{"jsonrpc":"2.0","method":"ping"}{}"#,
        r#"{"jsonrpc":"2.0","method":"ping",}"#,
        r#"{'jsonrpc':'2.0'}"#,
        r#"{"jsonrpc":"2.0","method":"x","params":{"other":"\q"}}"#,
        "{\"jsonrpc\":\"2.0\",\"method\":\"x\",\"params\":{\"other\":\"a\u{1}b\"}}",
        r#"{"jsonrpc":"2.0","method":"x","params":{"other":[01]}}"#,
        r#"{"jsonrpc":"2.0","method":"x","params":{"other":NaN}}"#,
        r#"{"jsonrpc":"2.0","method":"x","params":{"other":tru}}"#,
        r#"{"jsonrpc":"2.0","method":"x","params":{"other":{"a":1]}}"#,
        r#"{"jsonrpc":"2.0","method":"x","params":{"ch\u00"}}"#,
    ] {
        let error = err(text);
        assert!(
            matches!(error, WireError::NotJson { .. }),
            "{text}: {error:?}"
        );
        assert_eq!(error.json_rpc_code(), -32700);
    }
}

#[test]
fn jsonrpc_version_must_be_2_0() {
    for text in [
        r#"{"method":"ping"}"#,
        r#"{"jsonrpc":"1.0","method":"ping"}"#,
        r#"{"jsonrpc":2.0,"method":"ping"}"#,
        r#"{"jsonrpc":null,"method":"ping"}"#,
        r#"{"jsonrpc":"2.0 ","method":"ping"}"#,
    ] {
        assert_eq!(err(text), WireError::BadVersion, "{text}");
    }
    ok(r#"{"jsonrpc":"2\u002e0","method":"ping"}"#);
}

#[test]
fn params_must_be_an_object_on_requests_only() {
    for params in ["[]", "[1]", r#""x""#, "null", "3"] {
        let text = format!(r#"{{"jsonrpc":"2.0","id":1,"method":"m","params":{params}}}"#);
        let error = err(&text);
        assert_eq!(error, WireError::ParamsNotObject, "{text}");
        assert_eq!(error.json_rpc_code(), -32602);
    }
    ok(r#"{"jsonrpc":"2.0","id":1,"result":null,"params":7}"#);
    assert_eq!(
        ok(r#"{"jsonrpc":"2.0","method":"m"}"#).params,
        Default::default()
    );
}

#[test]
fn routed_values_must_have_their_type() {
    for (params, field) in [
        (r#"{"channel":5}"#, "params.channel"),
        (r#"{"channel":null}"#, "params.channel"),
        (r#"{"channel":{"uri":"x"}}"#, "params.channel"),
        (r#"{"channel":"\ud800"}"#, "params.channel"),
        (r#"{"serverSeq":-1}"#, "params.serverSeq"),
        (r#"{"serverSeq":1.0}"#, "params.serverSeq"),
        (r#"{"serverSeq":1e2}"#, "params.serverSeq"),
        (r#"{"serverSeq":"5"}"#, "params.serverSeq"),
        (r#"{"serverSeq":18446744073709551616}"#, "params.serverSeq"),
        (r#"{"action":{"type":3}}"#, "params.action.type"),
        (r#"{"origin":{"clientId":[]}}"#, "params.origin.clientId"),
    ] {
        let text = format!(r#"{{"jsonrpc":"2.0","method":"action","params":{params}}}"#);
        let error = err(&text);
        assert!(
            matches!(error, WireError::BadField { field: f, .. } if f == field),
            "{text}: {error:?}"
        );
        assert_eq!(error.json_rpc_code(), -32602);
    }
    let text = r#"{"jsonrpc":"2.0","method":"action","params":{"serverSeq":18446744073709551615,"action":"odd","origin":null}}"#;
    let frame = ok(text);
    assert_eq!(frame.params.server_seq.map(|s| s.value), Some(u64::MAX));
    assert_eq!(frame.params.action.map(|r| at(text, r)), Some(r#""odd""#));
    assert_eq!(frame.params.origin.map(|r| at(text, r)), Some("null"));
    assert_eq!(
        (frame.params.action_type, frame.params.origin_client_id),
        (None, None)
    );
}

#[test]
fn escaped_keys_and_values_are_decoded() {
    let text = r#"{"\u006aso\u006erpc":"2.0","m\u0065thod":"act\u0069on","params":{"ch\u0061nnel":"ahp-chat:\/c\u00e9 \"q\" \ud83d\ude00","ser\u0076erSeq":42}}"#;
    let frame = ok(text);
    assert_eq!(frame.method(), Some("action"));
    let channel = frame.params.channel.expect("channel");
    assert_eq!(channel.value, "ahp-chat:/cé \"q\" 😀");
    assert!(matches!(channel.value, Cow::Owned(_)));
    assert_eq!(
        at(text, channel.range),
        r#""ahp-chat:\/c\u00e9 \"q\" \ud83d\ude00""#
    );
    assert_eq!(frame.params.server_seq.map(|s| s.value), Some(42));
}

#[test]
fn unicode_values_are_borrowed_and_ranged_by_bytes() {
    let text = r#"{"jsonrpc":"2.0","method":"subscribe","params":{"channel":"ahp-chat:/é€😀"}}"#;
    let channel = ok(text).params.channel.expect("channel");
    assert!(matches!(channel.value, Cow::Borrowed("ahp-chat:/é€😀")));
    assert_eq!(at(text, channel.range), r#""ahp-chat:/é€😀""#);
}

#[test]
fn whitespace_anywhere_is_accepted() {
    let text = " \r\n{ \"jsonrpc\" :\t\"2.0\" , \"id\" : 9 ,\n\"method\" : \"x\" , \"params\" : { \"channel\" : \"c\" } } \n";
    let frame = ok(text);
    assert_eq!(frame.id().map(|id| at(text, id.range.clone())), Some("9"));
    assert_eq!(
        frame.params.channel.map(|c| at(text, c.range)),
        Some(r#""c""#)
    );
}

#[test]
fn duplicate_keys_are_refused() {
    for (text, key) in [
        (r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"m"}"#, "id"),
        (r#"{"jsonrpc":"2.0","method":"m","method":"n"}"#, "method"),
        (
            r#"{"jsonrpc":"2.0","jsonrpc":"2.0","method":"m"}"#,
            "jsonrpc",
        ),
        (
            r#"{"jsonrpc":"2.0","method":"m","params":{},"params":{}}"#,
            "params",
        ),
        (
            r#"{"jsonrpc":"2.0","method":"m","params":{"channel":"a","channel":"b"}}"#,
            "channel",
        ),
        (
            r#"{"jsonrpc":"2.0","method":"m","params":{"channel":"a","ch\u0061nnel":"b"}}"#,
            "channel",
        ),
        (
            r#"{"jsonrpc":"2.0","method":"m","params":{"serverSeq":1,"serverSeq":2}}"#,
            "serverSeq",
        ),
        (
            r#"{"jsonrpc":"2.0","method":"m","params":{"action":{"type":"a","type":"b"}}}"#,
            "type",
        ),
        (
            r#"{"jsonrpc":"2.0","method":"m","params":{"origin":{"clientId":"a","clientId":"b"}}}"#,
            "clientId",
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"result":{"serverSeq":1,"serverSeq":1}}"#,
            "serverSeq",
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"result":{"snapshot":{"fromSeq":1,"fromSeq":2}}}"#,
            "fromSeq",
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"result":{"snapshots":[{"resource":"a","resource":"b"}]}}"#,
            "resource",
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"result":{"snapshots":[],"snapshots":[]}}"#,
            "snapshots",
        ),
    ] {
        let error = err(text);
        assert_eq!(error, WireError::DuplicateKey { key }, "{text}");
        assert_eq!(error.json_rpc_code(), -32600);
    }
    // Keys the relay does not read may repeat; they reach the host as sent.
    ok(r#"{"jsonrpc":"2.0","method":"m","x":1,"x":2,"params":{"_meta":{},"_meta":{}}}"#);
}

/// `{"jsonrpc":"2.0","method":"m","params":{"d":[[…]]}}` with `depth` levels in all.
fn nested(depth: usize) -> String {
    let arrays = depth.saturating_sub(2);
    format!(
        r#"{{"jsonrpc":"2.0","method":"m","params":{{"s":"[[[{{{{","d":{}0{}}}}}"#,
        "[".repeat(arrays),
        "]".repeat(arrays)
    )
}

#[test]
fn nesting_is_limited_before_parsing() {
    let limits = WireLimits {
        max_depth: 5,
        ..WireLimits::default()
    };
    assert!(classify(&nested(5), &limits).is_ok());
    assert_eq!(
        classify(&nested(6), &limits),
        Err(WireError::TooDeep { max: 5 })
    );
    let defaults = WireLimits::default();
    assert!(classify(&nested(defaults.max_depth), &defaults).is_ok());
    assert_eq!(
        classify(&nested(defaults.max_depth + 1), &defaults),
        Err(WireError::TooDeep { max: 64 })
    );
    // Far deeper than serde_json's own limit, and not valid JSON: refused by the scan first.
    assert_eq!(
        classify(&"[".repeat(100_000), &defaults),
        Err(WireError::TooDeep { max: 64 })
    );
    assert_eq!(WireError::TooDeep { max: 5 }.json_rpc_code(), -32600);
}

#[test]
fn size_is_limited_first() {
    let text = r#"{"jsonrpc":"2.0","method":"ping"}"#;
    let exact = WireLimits {
        max_frame_bytes: text.len(),
        ..WireLimits::default()
    };
    assert!(classify(text, &exact).is_ok());
    let short = WireLimits {
        max_frame_bytes: text.len() - 1,
        ..WireLimits::default()
    };
    let error = WireError::TooLarge {
        len: text.len(),
        max: text.len() - 1,
    };
    assert_eq!(classify(text, &short), Err(error.clone()));
    assert_eq!(
        classify(
            "not even json, but too long",
            &WireLimits {
                max_frame_bytes: 3,
                max_depth: 0
            }
        )
        .map(|_| ()),
        Err(WireError::TooLarge { len: 27, max: 3 })
    );
    assert_eq!(error.json_rpc_code(), -32600);
}

#[test]
fn subscribe_result_snapshot() {
    let text = r#"{"jsonrpc":"2.0","id":4,"result":{"snapshot":{"resource":"ahp-chat:/c-1","state":{"fromSeq":"not me","turns":[]},"fromSeq":77}}}"#;
    let snapshot = ok(text).result.snapshot.expect("snapshot");
    let from = snapshot.from_seq.expect("fromSeq");
    assert_eq!((from.value, at(text, from.range)), (77, "77"));
    assert_eq!(
        snapshot.resource.map(|r| r.value),
        Some(Cow::Borrowed("ahp-chat:/c-1"))
    );
}

#[test]
fn initialize_result_snapshots_keep_their_indices() {
    let text = r#"{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"1.0.0","serverSeq":10,"snapshots":[{"resource":"ahp-root://","fromSeq":10,"state":{}},5,{"fromSeq":9}]}}"#;
    let result = ok(text).result;
    assert_eq!(result.server_seq.map(|s| s.value), Some(10));
    assert_eq!(result.snapshots.len(), 3);
    let first = &result.snapshots[0];
    assert_eq!(
        first.resource.as_ref().map(|r| at(text, r.range.clone())),
        Some(r#""ahp-root://""#)
    );
    assert_eq!(result.snapshots[1], Default::default());
    assert_eq!(
        result.snapshots[2].from_seq.as_ref().map(|s| s.value),
        Some(9)
    );
    assert!(result.snapshots[2].resource.is_none());
    for bad in [
        r#"{"snapshot":{"fromSeq":-3}}"#,
        r#"{"snapshots":[{"resource":1}]}"#,
    ] {
        let text = format!(r#"{{"jsonrpc":"2.0","id":1,"result":{bad}}}"#);
        assert!(matches!(err(&text), WireError::BadField { .. }), "{text}");
    }
    let text = r#"{"jsonrpc":"2.0","id":1,"result":{"snapshots":{"a":[1]},"snapshot":[2]}}"#;
    assert_eq!(ok(text).result, Default::default());
}

#[test]
fn error_codes() {
    assert_eq!(
        WireError::NotJson { line: 1, column: 1 }.json_rpc_code(),
        -32700
    );
    for error in [
        WireError::Batch,
        WireError::NotObject,
        WireError::BadVersion,
        WireError::MethodNotString,
        WireError::BadId,
        WireError::DuplicateKey { key: "id" },
    ] {
        assert_eq!(error.json_rpc_code(), -32600, "{error}");
    }
    assert_eq!(WireError::Internal.json_rpc_code(), -32603);
}

#[test]
fn spans_outside_the_frame_are_reported_not_panicked() {
    let frame = "abcdef";
    assert_eq!(span(frame, frame.get(2..4).expect("slice")), Ok(2..4));
    assert_eq!(span(frame, &String::from("cd")), Err(WireError::Internal));
    assert_eq!(
        span(frame.get(1..).expect("slice"), frame),
        Err(WireError::Internal)
    );
}

#[test]
fn lone_surrogates_in_skipped_payload_pass_through() {
    // JSON.parse-based hosts emit these (e.g. terminal output split inside a pair).
    let text = r#"{"jsonrpc":"2.0","method":"action","params":{"channel":"ahp-terminal:/7","action":{"type":"terminal/data","data":"\ud83d"},"serverSeq":1}}"#;
    let frame = ok(text);
    assert_eq!(
        frame.params.action_type.map(|t| t.value),
        Some(Cow::Borrowed("terminal/data"))
    );
}

#[test]
fn lone_surrogates_in_walked_keys_are_refused() {
    let text = r#"{"jsonrpc":"2.0","method":"m","\ud800":1}"#;
    assert!(matches!(err(text), WireError::NotJson { .. }));
    // In `action` the relay only looks for `type`; such a key matches nothing.
    let text = r#"{"jsonrpc":"2.0","method":"m","params":{"action":{"\ud800":1,"type":"t"}}}"#;
    assert_eq!(
        ok(text).params.action_type.map(|t| t.value),
        Some(Cow::Borrowed("t"))
    );
}

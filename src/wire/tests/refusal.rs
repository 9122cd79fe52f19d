//! How refused frames are answered: echoing the id, with a null id, or not at all.

use super::err;
use crate::wire::{Refusal, WireLimits, classify, refusal};

/// The id `refusal` answers `text` with (`Some(None)` is a null id), `None` if silent.
fn answer(text: &str) -> Option<Option<String>> {
    match refusal(text, &err(text)) {
        Refusal::Answer { id } => Some(id.map(|id| id.raw.to_string())),
        Refusal::Silent => None,
    }
}

#[test]
fn requests_are_answered_with_their_id() {
    let some = |id: &str| Some(Some(id.to_string()));
    assert_eq!(
        answer(r#"{"jsonrpc":"2.0","id":5,"method":"subscribe","params":{"channel":5}}"#),
        some("5")
    );
    assert_eq!(
        answer(r#"{"jsonrpc":"2.0","id":"a\"b","method":"m","params":[]}"#),
        some(r#""a\"b""#)
    );
    assert_eq!(
        answer(r#"{"jsonrpc":"1.0","id":-2,"method":"m"}"#),
        some("-2")
    );
    assert_eq!(answer(r#"{"jsonrpc":"2.0","id":7,"method":3}"#), some("7"));
    assert_eq!(answer(r#"{"jsonrpc":"2.0","id":8}"#), some("8"));
    assert_eq!(
        answer(r#"{"jsonrpc":"2.0","id":9,"method":"m","params":{"channel":"a","channel":"b"}}"#),
        some("9")
    );
}

#[test]
fn unreadable_ids_are_answered_with_null() {
    for text in [
        "{",
        "[]",
        "42",
        r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"m"}"#,
        r#"{"jsonrpc":"2.0","id":null,"method":"m"}"#,
        r#"{"jsonrpc":"2.0","id":{},"method":"m"}"#,
        r#"{"jsonrpc":"2.0"}"#,
    ] {
        assert_eq!(answer(text), Some(None), "{text}");
    }
    let limits = WireLimits {
        max_depth: 1,
        ..WireLimits::default()
    };
    let deep = r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{}}"#;
    let error = classify(deep, &limits).expect_err("too deep");
    assert_eq!(refusal(deep, &error), Refusal::Answer { id: None });
}

#[test]
fn notifications_and_responses_are_never_answered() {
    for text in [
        r#"{"jsonrpc":"2.0","method":"dispatchAction","params":{"channel":5}}"#,
        r#"{"jsonrpc":"2.0","method":"dispatchAction","params":"x"}"#,
        r#"{"jsonrpc":"1.0","method":"unsubscribe"}"#,
        r#"{"jsonrpc":"2.0","id":1,"result":{},"error":{"code":1}}"#,
        r#"{"jsonrpc":"2.0","result":{}}"#,
        r#"{"jsonrpc":"2.0","id":1,"error":"boom"}"#,
        r#"{"jsonrpc":"2.0","id":1,"result":{"serverSeq":-1}}"#,
    ] {
        assert_eq!(answer(text), None, "{text}");
    }
}

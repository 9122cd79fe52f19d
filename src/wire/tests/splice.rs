//! Splicing: round trips compared as `Value`s, escaping, and refused edits.

use serde_json::{Value, json};

use super::{ok, value};
use crate::wire::{
    Decimal, Edit, EditValue, SpliceError, json_escape_into, splice, splice_routed_into,
};

/// `s` as a JSON string token written by [`json_escape_into`].
fn escaped(s: &str) -> String {
    let mut out = String::new();
    json_escape_into(&mut out, s);
    out
}

#[test]
fn escaping_matches_serde_json_and_round_trips() {
    let mut samples: Vec<String> = (0u8..0x80).map(|b| char::from(b).to_string()).collect();
    samples.extend(
        [
            "",
            "plain",
            "ahp-chat:/c-1",
            "a\"b\\c",
            "é€😀",
            "\u{2028}\u{7f}",
            "x\u{0}y\u{1f}z",
            "\\u0041",
        ]
        .map(String::from),
    );
    for s in &samples {
        let token = escaped(s);
        assert_eq!(token, serde_json::to_string(s).expect("to_string"), "{s:?}");
        assert_eq!(&serde_json::from_str::<String>(&token).expect("parses"), s);
    }
    let mut out = String::from("prefix:");
    json_escape_into(&mut out, "\n");
    assert_eq!(out, r#"prefix:"\n""#);
}

#[test]
fn splice_serverseq_and_channel_changes_only_those_values() {
    let text = r#"{"jsonrpc":"2.0","method":"action","params":{"channel":"ahp-chat:/c\u00e9","action":{"type":"chat/delta","content":"x\"y","_meta":{"k":[1,2]}},"serverSeq":12345,"origin":{"clientId":"r1.abc","clientSeq":3}}}"#;
    let frame = ok(text);
    let p = &frame.params;
    let new_channel = "ahp-chat:/gpu1~c\"é\n😀";
    let mut edits = [
        Edit {
            range: p.server_seq.clone().expect("seq").range,
            replacement: EditValue::U64(9_007_199_254_740_991),
        },
        Edit {
            range: p.channel.clone().expect("channel").range,
            replacement: EditValue::JsonString(new_channel),
        },
        Edit {
            range: p.origin_client_id.clone().expect("client").range,
            replacement: EditValue::JsonString("me"),
        },
    ];
    let spliced = splice(text, &mut edits).expect("splice");
    let mut expected = value(text);
    expected["params"]["serverSeq"] = json!(9_007_199_254_740_991u64);
    expected["params"]["channel"] = json!(new_channel);
    expected["params"]["origin"]["clientId"] = json!("me");
    assert_eq!(value(&spliced), expected);
    assert!(
        spliced.contains(r#""content":"x\"y","_meta":{"k":[1,2]}"#),
        "payload copied verbatim"
    );
    let again = ok(&spliced);
    assert_eq!(again.channel(), Some(new_channel));
}

#[test]
fn echoing_an_id_with_raw() {
    let request =
        r#"{"jsonrpc":"2.0","id":"a\u00e9","method":"subscribe","params":{"channel":"c"}}"#;
    let client_id = ok(request).id().cloned().expect("id");
    let upstream =
        r#"{"jsonrpc":"2.0","id":17,"result":{"snapshot":{"resource":"c","fromSeq":5}}}"#;
    let frame = ok(upstream);
    let host_id = frame.id().cloned().expect("id");
    assert_eq!(host_id.as_u64(), Some(17));
    let snapshot = frame.result.snapshot.expect("snapshot");
    let mut edits = [
        Edit {
            range: snapshot.from_seq.expect("fromSeq").range,
            replacement: EditValue::U64(0),
        },
        Edit {
            range: host_id.range,
            replacement: EditValue::Raw(client_id.raw),
        },
    ];
    let spliced = splice(upstream, &mut edits).expect("splice");
    assert_eq!(
        spliced,
        r#"{"jsonrpc":"2.0","id":"a\u00e9","result":{"snapshot":{"resource":"c","fromSeq":0}}}"#
    );
    assert_eq!(
        value(&spliced),
        json!({"jsonrpc":"2.0","id":"aé","result":{"snapshot":{"resource":"c","fromSeq":0}}})
    );
}

#[test]
fn edits_are_applied_in_position_order() {
    let text = "[1,2,3]";
    let mut edits = [
        Edit {
            range: 5..6,
            replacement: EditValue::Raw("c"),
        },
        Edit {
            range: 1..2,
            replacement: EditValue::Raw("a"),
        },
        Edit {
            range: 3..3,
            replacement: EditValue::Raw("ins,"),
        },
        Edit {
            range: 3..4,
            replacement: EditValue::U64(u64::MAX),
        },
    ];
    assert!(matches!(
        splice(text, &mut edits),
        Err(SpliceError::Overlap { .. })
    ));
    let mut edits = [
        Edit {
            range: 5..6,
            replacement: EditValue::Raw("\"c\""),
        },
        Edit {
            range: 1..2,
            replacement: EditValue::JsonString("a"),
        },
        Edit {
            range: 3..4,
            replacement: EditValue::U64(u64::MAX),
        },
        Edit {
            range: 7..7,
            replacement: EditValue::Raw(" "),
        },
    ];
    assert_eq!(
        splice(text, &mut edits).as_deref(),
        Ok(r#"["a",18446744073709551615,"c"] "#)
    );
    assert_eq!(splice(text, &mut []).as_deref(), Ok(text));
}

#[test]
fn overlapping_or_invalid_edits_are_refused() {
    let text = r#"{"a":"é","b":12}"#;
    let cases: [(&[(usize, usize)], SpliceError); 6] = [
        (
            &[(1, 5), (4, 6)],
            SpliceError::Overlap {
                first: 1..5,
                second: 4..6,
            },
        ),
        (
            &[(4, 6), (1, 5)],
            SpliceError::Overlap {
                first: 1..5,
                second: 4..6,
            },
        ),
        (
            &[(2, 2), (2, 2)],
            SpliceError::Overlap {
                first: 2..2,
                second: 2..2,
            },
        ),
        (
            &[(2, 4), (2, 2)],
            SpliceError::Overlap {
                first: 2..2,
                second: 2..4,
            },
        ),
        (
            &[(16, 19)],
            SpliceError::OutOfBounds {
                start: 16,
                end: 19,
                len: 17,
            },
        ),
        (
            &[(6, 7)],
            SpliceError::OutOfBounds {
                start: 6,
                end: 7,
                len: 17,
            },
        ),
    ];
    for (ranges, expected) in cases {
        let mut edits: Vec<Edit> = ranges
            .iter()
            .map(|&(start, end)| Edit {
                range: start..end,
                replacement: EditValue::U64(1),
            })
            .collect();
        assert_eq!(splice(text, &mut edits), Err(expected), "{ranges:?}");
    }
    #[allow(clippy::reversed_empty_ranges)]
    let mut reversed = [Edit {
        range: 5..3,
        replacement: EditValue::U64(1),
    }];
    assert_eq!(
        splice(text, &mut reversed),
        Err(SpliceError::OutOfBounds {
            start: 5,
            end: 3,
            len: 17
        })
    );
    // Adjacent ranges are fine.
    let mut adjacent = [
        Edit {
            range: 14..16,
            replacement: EditValue::U64(7),
        },
        Edit {
            range: 16..17,
            replacement: EditValue::Raw("}"),
        },
    ];
    assert_eq!(
        value(&splice(text, &mut adjacent).expect("splice")),
        json!({"a":"é","b":7})
    );
}

#[test]
fn splicing_a_value_keeps_every_other_value() {
    let text = r#"{"jsonrpc":"2.0","id":2,"result":{"serverSeq":1,"snapshots":[{"resource":"ahp-root://","fromSeq":1,"state":{"agents":[{"provider":"copilot"}]}},{"resource":"ahp-session:/s","fromSeq":1}]}}"#;
    let result = ok(text).result;
    let mut edits: Vec<Edit> = result
        .snapshots
        .iter()
        .filter_map(|s| s.from_seq.as_ref())
        .map(|seq| Edit {
            range: seq.range.clone(),
            replacement: EditValue::U64(1_700_000_000_000_000),
        })
        .collect();
    edits.push(Edit {
        range: result.server_seq.expect("seq").range,
        replacement: EditValue::U64(1_700_000_000_000_000),
    });
    let spliced = splice(text, &mut edits).expect("splice");
    let mut expected: Value = value(text);
    expected["result"]["serverSeq"] = json!(1_700_000_000_000_000u64);
    for i in 0..2 {
        expected["result"]["snapshots"][i]["fromSeq"] = json!(1_700_000_000_000_000u64);
    }
    assert_eq!(value(&spliced), expected);
}

#[test]
fn spliced_frames_are_allocated_at_their_exact_size() {
    let text = r#"{"channel":"c","serverSeq":7,"x":1}"#;
    for n in [0, 9, 10, 12_345, u64::MAX] {
        let mut edits = [
            Edit {
                range: 11..14,
                replacement: EditValue::JsonString("ahp-chat:/c-1"),
            },
            Edit {
                range: 27..28,
                replacement: EditValue::U64(n),
            },
        ];
        let out = splice(text, &mut edits).expect("valid edits");
        assert_eq!(out.capacity(), out.len(), "{out}");
    }
}

#[test]
fn the_routed_splice_refuses_what_splice_refuses_and_writes_nothing() {
    let text = r#"{"channel":"é","serverSeq":7}"#;
    let mut arena = bytes::BytesMut::new();
    let (channel, seq) = (11..15, 28..29);
    let ok = splice_routed_into(
        text,
        (channel.clone(), EditValue::JsonString("c\"1")),
        (seq.clone(), &Decimal::of(42)),
        &mut arena,
    );
    assert_eq!(ok.unwrap().to_str(), r#"{"channel":"c\"1","serverSeq":42}"#);
    let splits_a_character = splice_routed_into(
        text,
        (13..15, EditValue::JsonString("x")),
        (seq.clone(), &Decimal::of(1)),
        &mut arena,
    );
    assert!(matches!(
        splits_a_character,
        Err(SpliceError::OutOfBounds { .. })
    ));
    let past_the_end = splice_routed_into(
        text,
        (channel.clone(), EditValue::JsonString("x")),
        (28..99, &Decimal::of(1)),
        &mut arena,
    );
    assert!(matches!(past_the_end, Err(SpliceError::OutOfBounds { .. })));
    let overlapping = splice_routed_into(
        text,
        (channel.clone(), EditValue::JsonString("x")),
        (14..20, &Decimal::of(1)),
        &mut arena,
    );
    assert!(matches!(overlapping, Err(SpliceError::Overlap { .. })));
    let same_start = splice_routed_into(
        text,
        (channel.clone(), EditValue::JsonString("x")),
        (11..11, &Decimal::of(1)),
        &mut arena,
    );
    assert!(matches!(same_start, Err(SpliceError::Overlap { .. })));
    assert!(arena.is_empty(), "nothing written on a refusal");
}

/// A lone frame spliced into an empty arena takes the arena's one exact
/// allocation whole (nothing left behind for a replay buffer to hold on
/// to); frames spliced into a batch arena sized with room share it,
/// back to back, and leave the room after them.
#[test]
fn a_lone_frame_takes_an_exact_arena_and_a_batch_shares_one() {
    let text = r#"{"channel":"c","serverSeq":7,"x":1}"#;
    let routed = |arena: &mut bytes::BytesMut, n| {
        splice_routed_into(
            text,
            (11..14, EditValue::JsonString("ahp-chat:/c-1")),
            (27..28, &Decimal::of(n)),
            arena,
        )
        .expect("valid edits")
    };
    let mut lone = bytes::BytesMut::new();
    let out = routed(&mut lone, 123);
    assert_eq!(
        out.to_str(),
        r#"{"channel":"ahp-chat:/c-1","serverSeq":123,"x":1}"#
    );
    assert_eq!(lone.capacity(), 0, "the lone frame took the arena whole");
    assert!(out.owns_its_buffer(), "no header shared with the arena");
    let mut batch = bytes::BytesMut::with_capacity(4 * text.len());
    let first = routed(&mut batch, 1);
    let second = routed(&mut batch, 2);
    let framed =
        |t: &crate::wire::Text| t.framed().expect("spliced with its header").as_ptr_range();
    assert_eq!(framed(&second).start, framed(&first).end, "back to back");
    assert!(
        batch.capacity() > 0,
        "the batch's room stays for the next frame"
    );
    assert!(!first.owns_its_buffer(), "batch frames share one buffer");
    assert!(second.to_str().contains(r#""serverSeq":2,"#));
}

/// Every spliced text carries the text-frame header of its payload's exact
/// length in front (one slice for the socket writer), across the length
/// classes of RFC 6455 §5.2: a payload that escapes lengthen is given the
/// header of its real length when that header is as long, and none when
/// the escapes move it into the next class.
#[test]
fn spliced_texts_carry_the_frame_header_of_their_length() {
    use crate::wire::{frame_header, splice_into};
    let check = |out: &crate::wire::Text, want: &str| {
        assert_eq!(out.to_str(), want);
        let framed = out.framed().expect("spliced with its header");
        let (header, used) = frame_header(0x1, want.len());
        assert_eq!(&framed[..used], &header[..used], "len {}", want.len());
        assert_eq!(&framed[used..], want.as_bytes());
    };
    for len in [0usize, 1, 100, 125, 126, 127, 65_535, 65_536, 70_000] {
        let filler = "x".repeat(len.saturating_sub(13));
        let text = format!(r#"{{"s":1,"f":"{filler}"}}"#);
        for n in [7u64, 12_345_678_901] {
            let mut arena = bytes::BytesMut::new();
            let mut edits = [Edit {
                range: 5..6,
                replacement: EditValue::U64(n),
            }];
            let out = splice_into(&text, &mut edits, &mut arena).expect("valid");
            check(&out, &text.replacen("1", &n.to_string(), 1));
            let routed = splice_routed_into(
                &text,
                (12..12 + filler.len(), EditValue::Raw(&filler)),
                (5..6, &Decimal::of(n)),
                &mut arena,
            )
            .expect("valid");
            check(&routed, &text.replacen("1", &n.to_string(), 1));
        }
    }
    // Escapes the capacity did not foresee: `"h"` becomes a 10-byte token
    // where 6 were counted. A 118-byte text grows to 125 (the two-byte header
    // still fits: rewritten), a 119-byte one to 126 (it does not: none).
    for (base, framed) in [(119usize, true), (120, false)] {
        let text = format!(r#"{{"c":"h","p":"{}"}}"#, "y".repeat(base - 17));
        let mut arena = bytes::BytesMut::new();
        let mut edits = [Edit {
            range: 5..8,
            replacement: EditValue::JsonString("\"\"\"\""),
        }];
        let out = splice_into(&text, &mut edits, &mut arena).expect("valid");
        let want = text.replacen(r#""h""#, r#""\"\"\"\"""#, 1);
        assert_eq!(out.to_str(), want);
        assert_eq!(
            out.framed().is_some(),
            framed,
            "payload {} bytes",
            want.len()
        );
        if framed {
            check(&out, &want);
        }
    }
}

//! Property-style tests over generated frames: random member order, whitespace, escaped
//! keys and values, unknown members with nested junk. A tiny deterministic PRNG, and
//! `serde_json::Value` as the oracle.

use std::ops::Range;

use serde::de::IgnoredAny;
use serde_json::{Value, json};

use super::{at, value};
use crate::wire::{
    Decimal, Edit, EditValue, Frame, FrameKind, WireError, WireLimits, classify,
    classify_notification, is_catalog_notification, json_escape_into, splice, splice_routed_into,
};

/// xorshift64*: deterministic, good enough to shuffle test inputs. The flag, when set,
/// makes strings escape only what JSON requires (the plain form hosts write).
struct Rng(u64, bool);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }
    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
}

const CHARS: &[char] = &[
    'a', 'Z', '0', '-', '/', ':', '~', '.', ' ', '"', '\\', '\n', '\t', '\u{1}', '\u{1f}', 'é',
    '€', '😀', '\u{2028}',
];

fn random_text(rng: &mut Rng) -> String {
    (0..rng.below(12)).map(|_| rng.pick(CHARS)).collect()
}

fn ws(rng: &mut Rng) -> &'static str {
    rng.pick(&["", "", "", " ", "\n", "\t ", "\r\n  "])
}

/// A JSON string token for `s`, escaped where JSON requires and at random elsewhere.
fn string_token(rng: &mut Rng, s: &str) -> String {
    let mut out = String::from('"');
    for c in s.chars() {
        let must = c == '"' || c == '\\' || u32::from(c) < 0x20;
        if !must && (rng.1 || !rng.one_in(4)) {
            out.push(c);
            continue;
        }
        match (c, rng.below(2)) {
            ('"', 0) => out.push_str("\\\""),
            ('\\', 0) => out.push_str("\\\\"),
            ('\n', 0) => out.push_str("\\n"),
            ('/', 0) => out.push_str("\\/"),
            (_, upper) => {
                for unit in c.encode_utf16(&mut [0; 2]) {
                    out.push_str(&if upper == 1 {
                        format!("\\u{unit:04X}")
                    } else {
                        format!("\\u{unit:04x}")
                    });
                }
            }
        }
    }
    out.push('"');
    out
}

fn number_token(rng: &mut Rng) -> String {
    match rng.below(3) {
        0 => rng
            .pick(&["0", "-0", "-7", "3.25", "1e10", "-2.5E-3"])
            .to_string(),
        _ => rng.next().to_string(),
    }
}

/// Any JSON value, nested up to a few levels.
fn junk(rng: &mut Rng, depth: usize) -> String {
    match rng.below(if depth > 2 { 4 } else { 6 }) {
        0 => rng.pick(&["null", "true", "false"]).to_string(),
        1 => number_token(rng),
        2 | 3 => {
            let s = random_text(rng);
            string_token(rng, &s)
        }
        4 => {
            let items: Vec<String> = (0..rng.below(4)).map(|_| junk(rng, depth + 1)).collect();
            format!("[{}{}]", items.join(","), ws(rng))
        }
        _ => object(rng, Vec::new(), depth + 1),
    }
}

/// An object with `members` (decoded key, value token) plus unknown members, shuffled,
/// with random whitespace and randomly escaped keys.
fn object(rng: &mut Rng, mut members: Vec<(String, String)>, depth: usize) -> String {
    for _ in 0..rng.below(3) {
        let key = match rng.1 {
            true => format!("x-{}", rng.below(1000)),
            false => format!("x-{}", random_text(rng)),
        };
        let value = junk(rng, depth);
        members.push((key, value));
    }
    for i in (1..members.len()).rev() {
        members.swap(i, rng.below(i + 1));
    }
    let parts: Vec<String> = members
        .into_iter()
        .map(|(key, value)| {
            let key = string_token(rng, &key);
            format!("{}{key}{}:{}{value}{}", ws(rng), ws(rng), ws(rng), ws(rng))
        })
        .collect();
    format!("{{{}{}}}", parts.join(","), ws(rng))
}

/// Keeps each member with probability 3/4.
fn some_of(rng: &mut Rng, members: Vec<(&str, String)>) -> Vec<(String, String)> {
    members
        .into_iter()
        .filter(|_| !rng.one_in(4))
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}

fn snapshot(rng: &mut Rng) -> String {
    let resource = random_text(rng);
    let members = vec![
        ("resource", string_token(rng, &resource)),
        ("fromSeq", rng.next().to_string()),
        ("state", junk(rng, 1)),
    ];
    let members = some_of(rng, members);
    object(rng, members, 1)
}

fn frame(rng: &mut Rng) -> String {
    let (channel, kind) = (random_text(rng), rng.below(3));
    let mut top = vec![("jsonrpc", string_token(rng, "2.0"))];
    match kind {
        0 => {
            let (action_type, client) = (random_text(rng), random_text(rng));
            let action = vec![("type".to_string(), string_token(rng, &action_type))];
            let origin = vec![
                ("clientId".to_string(), string_token(rng, &client)),
                ("clientSeq".to_string(), number_token(rng)),
            ];
            let params = vec![
                ("channel", string_token(rng, &channel)),
                ("serverSeq", rng.next().to_string()),
                ("action", object(rng, action, 2)),
                ("origin", object(rng, origin, 2)),
            ];
            let params = some_of(rng, params);
            // Mostly `action`; also the root-scoped notifications links discard, and
            // any text (escaped or not), which the fast path takes only unescaped.
            let method = match rng.below(4) {
                0 => "root/sessionSummaryChanged".to_string(),
                1 => random_text(rng),
                _ => "action".to_string(),
            };
            top.push(("method", string_token(rng, &method)));
            top.push(("params", object(rng, params, 1)));
        }
        1 => {
            let id = if rng.one_in(2) {
                number_token(rng)
            } else {
                string_token(rng, &channel)
            };
            top.push(("id", id));
            top.push(("method", string_token(rng, "subscribe")));
            let params = vec![("channel".to_string(), string_token(rng, &channel))];
            top.push(("params", object(rng, params, 1)));
        }
        _ => {
            let list: Vec<String> = (0..rng.below(4))
                .map(|_| {
                    if rng.one_in(5) {
                        junk(rng, 2)
                    } else {
                        snapshot(rng)
                    }
                })
                .collect();
            let result = vec![
                ("serverSeq", rng.next().to_string()),
                ("snapshot", snapshot(rng)),
                ("snapshots", format!("[{}]", list.join(","))),
            ];
            let result = some_of(rng, result);
            top.push(("id", rng.below(1000).to_string()));
            top.push(("result", object(rng, result, 1)));
        }
    }
    let top = top.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    format!("{}{}{}", ws(rng), object(rng, top, 0), ws(rng))
}

/// The text of `range` parses to `expected`.
fn same(text: &str, range: &Range<usize>, expected: &Value) {
    assert_eq!(&value(at(text, range.clone())), expected, "{text}");
}

/// Everything `frame` reports agrees with serde_json's reading of `text`, both ways.
fn agrees(text: &str, frame: &Frame) {
    let v = value(text);
    assert_eq!(v["jsonrpc"], "2.0");
    if let Some(id) = frame.id() {
        same(text, &id.range, &v["id"]);
    }
    assert_eq!(frame.method(), v["method"].as_str());
    match frame.kind {
        FrameKind::Request { .. } | FrameKind::Notification { .. } => {
            assert_eq!(frame.result, Default::default())
        }
        FrameKind::Response { .. } | FrameKind::ErrorResponse { .. } => {
            assert_eq!(frame.params, Default::default())
        }
    }
    let (p, params) = (
        &frame.params,
        if frame.method().is_some() {
            &v["params"]
        } else {
            &Value::Null
        },
    );
    assert_eq!(frame.channel(), params["channel"].as_str());
    assert_eq!(
        p.server_seq.as_ref().map(|s| s.value),
        params["serverSeq"].as_u64()
    );
    assert_eq!(
        p.action.clone().map(|r| value(at(text, r))).as_ref(),
        params.get("action")
    );
    assert_eq!(
        p.action_type.as_ref().map(|t| &*t.value),
        params["action"]["type"].as_str()
    );
    assert_eq!(
        p.origin.clone().map(|r| value(at(text, r))).as_ref(),
        params.get("origin")
    );
    assert_eq!(
        p.origin_client_id.as_ref().map(|t| &*t.value),
        params["origin"]["clientId"].as_str()
    );
    for field in [&p.channel, &p.action_type, &p.origin_client_id]
        .into_iter()
        .flatten()
    {
        same(text, &field.range, &json!(field.value));
    }
    let (r, result) = (&frame.result, &v["result"]);
    assert_eq!(
        r.server_seq.as_ref().map(|s| s.value),
        result["serverSeq"].as_u64()
    );
    let expected: Vec<&Value> = result["snapshots"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    assert_eq!(r.snapshots.len(), expected.len());
    let single = result["snapshot"]
        .is_object()
        .then_some(&result["snapshot"]);
    assert_eq!(r.snapshot.is_some(), single.is_some());
    for (snap, v) in r
        .snapshot
        .iter()
        .zip(single)
        .chain(r.snapshots.iter().zip(expected))
    {
        assert_eq!(
            snap.from_seq.as_ref().map(|s| s.value),
            v["fromSeq"].as_u64()
        );
        assert_eq!(
            snap.resource.as_ref().map(|s| &*s.value),
            v["resource"].as_str()
        );
        if let Some(seq) = &snap.from_seq {
            same(text, &seq.range, &v["fromSeq"]);
        }
    }
}

/// [`splice_routed_into`] writes exactly what [`splice`] writes for the same
/// two edits (the channel and the number), whichever comes first.
fn routed_splice_agrees(text: &str, frame: &Frame, channel: &str, n: u64) {
    let (Some(c), Some(s)) = (&frame.params.channel, &frame.params.server_seq) else {
        return;
    };
    let mut edits = [
        Edit {
            range: c.range.clone(),
            replacement: EditValue::JsonString(channel),
        },
        Edit {
            range: s.range.clone(),
            replacement: EditValue::U64(n),
        },
    ];
    let general = splice(text, &mut edits).unwrap();
    let mut arena = bytes::BytesMut::with_capacity(7);
    let named = (c.range.clone(), EditValue::JsonString(channel));
    let routed = splice_routed_into(text, named, (s.range.clone(), &Decimal::of(n)), &mut arena);
    assert_eq!(routed.unwrap().to_str(), general, "{text}");
    let mut token = String::new();
    json_escape_into(&mut token, channel);
    let made = (c.range.clone(), EditValue::Raw(&token));
    let routed = splice_routed_into(text, made, (s.range.clone(), &Decimal::of(n)), &mut arena);
    assert_eq!(
        routed.unwrap().to_str(),
        general,
        "a token made before: {text}"
    );
}

/// Replaces every value the frame located, in the text and in a `Value`; both must agree.
fn splice_everything(rng: &mut Rng, text: &str, frame: &Frame) {
    let mut expected = value(text);
    let strings: Vec<String> = (0..5).map(|_| random_text(rng)).collect();
    let seq = rng.next();
    let mut edits = Vec::new();
    let p = &frame.params;
    routed_splice_agrees(text, frame, &strings[0], seq);
    if let Some(c) = &p.channel {
        string_edit(
            &mut edits,
            &c.range,
            &mut expected["params"]["channel"],
            &strings[0],
        );
    }
    if let Some(t) = &p.action_type {
        string_edit(
            &mut edits,
            &t.range,
            &mut expected["params"]["action"]["type"],
            &strings[1],
        );
    }
    if let Some(c) = &p.origin_client_id {
        string_edit(
            &mut edits,
            &c.range,
            &mut expected["params"]["origin"]["clientId"],
            &strings[2],
        );
    }
    if let Some(snap) = &frame.result.snapshot
        && let Some(res) = &snap.resource
    {
        string_edit(
            &mut edits,
            &res.range,
            &mut expected["result"]["snapshot"]["resource"],
            &strings[3],
        );
    }
    if let Some(s) = &p.server_seq {
        seq_edit(
            &mut edits,
            &s.range,
            &mut expected["params"]["serverSeq"],
            seq,
        );
    }
    if let Some(s) = &frame.result.server_seq {
        seq_edit(
            &mut edits,
            &s.range,
            &mut expected["result"]["serverSeq"],
            seq,
        );
    }
    if let Some(s) = frame
        .result
        .snapshot
        .as_ref()
        .and_then(|s| s.from_seq.as_ref())
    {
        seq_edit(
            &mut edits,
            &s.range,
            &mut expected["result"]["snapshot"]["fromSeq"],
            seq,
        );
    }
    for (i, snap) in frame.result.snapshots.iter().enumerate() {
        if let Some(s) = &snap.from_seq {
            seq_edit(
                &mut edits,
                &s.range,
                &mut expected["result"]["snapshots"][i]["fromSeq"],
                seq,
            );
        }
        if let Some(res) = &snap.resource {
            string_edit(
                &mut edits,
                &res.range,
                &mut expected["result"]["snapshots"][i]["resource"],
                &strings[4],
            );
        }
    }
    if let Some(id) = frame.id() {
        edits.push(Edit {
            range: id.range.clone(),
            replacement: EditValue::Raw("\"relay-7\""),
        });
        expected["id"] = json!("relay-7");
    }
    let spliced = splice(text, &mut edits).expect("edits from one frame never overlap");
    assert_eq!(value(&spliced), expected, "{text}\n{spliced}");
    let again = classify(&spliced, &WireLimits::default()).expect("spliced frame classifies");
    agrees(&spliced, &again);
}

/// Plans replacing the string at `range` with `s`, and applies it to the oracle `slot`.
fn string_edit<'s>(edits: &mut Vec<Edit<'s>>, range: &Range<usize>, slot: &mut Value, s: &'s str) {
    edits.push(Edit {
        range: range.clone(),
        replacement: EditValue::JsonString(s),
    });
    *slot = json!(s);
}

/// Plans replacing the number at `range` with `seq`, and applies it to the oracle `slot`.
fn seq_edit(edits: &mut Vec<Edit<'_>>, range: &Range<usize>, slot: &mut Value, seq: u64) {
    edits.push(Edit {
        range: range.clone(),
        replacement: EditValue::U64(seq),
    });
    *slot = json!(seq);
}

#[test]
fn generated_frames_are_read_like_serde_json_reads_them() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15, false);
    let mut fast = 0;
    for i in 0..3000 {
        rng.1 = i % 2 == 1;
        let text = frame(&mut rng);
        let frame = match classify(&text, &WireLimits::default()) {
            Ok(frame) => frame,
            Err(err) => panic!("{text}: {err:?}"),
        };
        agrees(&text, &frame);
        fast += usize::from(fast_path_agrees(&text));
        catalog_check_holds(&text);
        splice_everything(&mut rng, &text, &frame);
    }
    assert!(fast > 300, "only {fast} frames took the action fast path");
}

#[test]
fn catalog_notifications_discarded_unread_are_never_anything_a_link_acts_on() {
    // Catalog frames in the form hosts write, then mutated: noise, an `id` or a second
    // `method` spliced in at random places.
    const SPLICES: &[&str] = &[
        "{",
        "}",
        "\"",
        "\\",
        ",",
        ":",
        "0",
        r#","id":1"#,
        r#""id":"#,
        r#","method":"action""#,
        r#","method":"auth/required""#,
        r#","result":{}"#,
        r#"\u0069d"#,
    ];
    let mut rng = Rng(0x5851_f42d_4c95_7f2d, false);
    let (mut taken, mut taken_valid, mut declined) = (0, 0, 0);
    for i in 0..20_000 {
        rng.1 = i % 2 == 1;
        let suffix = ["Added", "Removed", "SummaryChanged"][rng.below(3)];
        let changes = vec![("status".to_string(), junk(&mut rng, 2))];
        let params = vec![
            ("channel".to_string(), string_token(&mut rng, "ahp-root://")),
            ("changes".to_string(), object(&mut rng, changes, 2)),
        ];
        let params = object(&mut rng, params, 1);
        let mut text =
            format!(r#"{{"jsonrpc":"2.0","method":"root/session{suffix}","params":{params}}}"#);
        for _ in 0..rng.below(3) {
            let at = rng.below(text.len() + 1);
            if text.is_char_boundary(at) {
                text.insert_str(at, SPLICES[rng.below(SPLICES.len())]);
            }
        }
        if catalog_check_holds(&text) {
            taken += 1;
            taken_valid += usize::from(classify(&text, &WireLimits::default()).is_ok());
        } else {
            declined += 1;
        }
    }
    assert!(
        taken_valid > 1000 && taken > taken_valid && declined > 1000,
        "taken {taken} ({taken_valid} valid), declined {declined}"
    );
}

/// Whether `is_catalog_notification` took `text`; when it does, `classify` must refuse it
/// or read a notification whose method starts with `root/session`.
fn catalog_check_holds(text: &str) -> bool {
    if !is_catalog_notification(text) {
        return false;
    }
    if let Ok(frame) = classify(text, &WireLimits::default()) {
        let FrameKind::Notification { method } = &frame.kind else {
            panic!("taken as a catalog notification: {:?} {text}", frame.kind);
        };
        assert!(method.starts_with("root/session"), "{text}");
    }
    true
}

/// Whether `classify_notification` took `text`; when it does, it must read it exactly as
/// `classify` does.
fn fast_path_agrees(text: &str) -> bool {
    let limits = WireLimits::default();
    let Some(fast) = classify_notification(text, &limits) else {
        return false;
    };
    assert_eq!(Ok(fast), classify(text, &limits), "{text}");
    true
}

/// serde_json's verdict on a `\uD800`–`\uDFFF` escape not forming a pair.
fn is_surrogate_error(err: &serde_json::Error) -> bool {
    let message = err.to_string();
    [
        "lone leading surrogate",
        "invalid unicode code point",
        "unexpected end of hex escape",
    ]
    .iter()
    .any(|known| message.starts_with(known))
}

#[test]
fn mutated_frames_never_panic_and_are_accepted_only_if_valid() {
    const NOISE: &[char] = &[
        '{', '}', '[', ']', '"', '\\', ',', ':', '0', '-', 'a', ' ', 'é',
    ];
    let mut rng = Rng(0x0123_4567_89ab_cdef, false);
    let (mut accepted, mut refused) = (0, 0);
    for i in 0..20_000 {
        rng.1 = i % 2 == 1;
        let mut chars: Vec<char> = frame(&mut rng).chars().collect();
        for _ in 0..=rng.below(3) {
            let at = rng.below(chars.len().max(1));
            match rng.below(3) {
                0 if at < chars.len() => chars[at] = rng.pick(NOISE),
                1 if at < chars.len() => drop(chars.remove(at)),
                _ => chars.insert(at, rng.pick(NOISE)),
            }
        }
        let text: String = chars.into_iter().collect();
        fast_path_agrees(&text);
        catalog_check_holds(&text);
        match classify(&text, &WireLimits::default()) {
            Ok(frame) => {
                accepted += 1;
                // Grammar: what serde_json accepts when skipping values.
                assert!(
                    serde_json::from_str::<IgnoredAny>(&text).is_ok(),
                    "accepted invalid JSON: {text}"
                );
                match serde_json::from_str::<Value>(&text) {
                    Ok(_) => agrees(&text, &frame),
                    // Lone surrogate escapes in skipped strings pass through verbatim.
                    Err(err) => assert!(is_surrogate_error(&err), "{err}: {text}"),
                }
            }
            Err(err) => {
                assert_ne!(err, WireError::Internal, "{text}");
                refused += 1;
            }
        }
    }
    assert!(
        accepted > 100 && refused > 100,
        "accepted {accepted}, refused {refused}"
    );
}

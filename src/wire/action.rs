//! [`classify_action`]: the fast path for the frame that is nearly all of a host's
//! traffic, an `action` notification, read in one pass that checks the JSON grammar and
//! finds the routed values together.
//!
//! [`classify`](super::classify) lets serde_json walk the frame through visitors, then
//! scans `params.action` and `params.origin` again for their `type` and `clientId`:
//! about 10,000 instructions for a ~320-byte `chat/delta` (`valgrind --tool=callgrind`
//! on `benches/wire.rs`), a third of the relay's CPU per relayed action. serde_json's
//! bare validation alone is half of that, so validating with it and then walking would
//! gain nothing; this walk does both in one pass.
//!
//! This is a second reading of JSON beside serde_json's, which the module documentation
//! of [`wire`](super) warns against: a disagreement is a place to smuggle a meaning past
//! routing. It is kept safe by what it may return. Guarantee: when [`classify_action`]
//! returns `Some(frame)`, [`classify`](super::classify) returns `Ok(frame)` for the same
//! text and limits — so the fast path never accepts a frame the general path refuses,
//! and never reads a value differently. Anything outside the plain form hosts write gives
//! `None` and the caller classifies the frame the general way, which also produces the
//! error: a key with an escape at a level it reads, a key it reads given twice, an `id`,
//! `result` or `error`, a routed value of the wrong type or with an undecodable escape,
//! a method other than a plain `"action"`, and anything that is not JSON. The guarantee
//! is checked by the generated and mutated frames of `wire::tests::generated`, by the
//! fuzz target `wire_host` and by the replay of its corpus in CI.

use std::borrow::Cow;
use std::ops::Range;

use super::fields::{SeqField, StrField};
use super::frame::{Frame, FrameKind};
use super::params::ParamsFields;
use super::result::ResultFields;
use super::{WireError, WireLimits};

/// Classifies a frame from a host: through [`classify_action`] when it takes the frame,
/// else through [`classify`](super::classify). Same result as `classify` alone.
pub fn classify_host<'a>(text: &'a str, limits: &WireLimits) -> Result<Frame<'a>, WireError> {
    classify_action(text, limits).map_or_else(|| super::classify(text, limits), Ok)
}

/// Classifies `text` when it is an `action` notification in the plain form; `None`
/// otherwise (then use [`classify`](super::classify)). See the module documentation.
pub fn classify_action<'a>(text: &'a str, limits: &WireLimits) -> Option<Frame<'a>> {
    limits.check(text).ok()?;
    let mut walk = Walk {
        text,
        at: 0,
        depth: 0,
    };
    let mut top = Top::default();
    walk.object(true, |w, key| top.member(w, key))?;
    walk.at_end().then_some(())?;
    if top.jsonrpc? != r#""2.0""# || top.method? != r#""action""# {
        return None;
    }
    let params = top.params?;
    let string = |token: Option<&'a str>, field| {
        token
            .map(|t| StrField::new(text, t, field))
            .transpose()
            .ok()
    };
    let (action, action_type) = params.action.unzip();
    let (origin, origin_client_id) = params.origin.unzip();
    let fields = ParamsFields {
        channel: string(params.channel, "params.channel")?,
        server_seq: params
            .server_seq
            .map(|t| SeqField::new(text, t, "params.serverSeq"))
            .transpose()
            .ok()?,
        action,
        action_type: string(action_type.flatten(), "params.action.type")?,
        origin,
        origin_client_id: string(origin_client_id.flatten(), "params.origin.clientId")?,
    };
    Some(Frame {
        kind: FrameKind::Notification {
            method: Cow::Borrowed("action"),
        },
        params: fields,
        result: ResultFields::default(),
    })
}

/// The top-level members read: the tokens of `jsonrpc` and `method`, and `params`.
#[derive(Default)]
struct Top<'a> {
    jsonrpc: Option<&'a str>,
    method: Option<&'a str>,
    params: Option<Params<'a>>,
}

impl<'a> Top<'a> {
    /// Reads one top-level member whose value `w` is at.
    fn member(&mut self, w: &mut Walk<'a>, key: &str) -> Option<()> {
        match key {
            "jsonrpc" => once(&mut self.jsonrpc, w.token()?),
            "method" => once(&mut self.method, w.token()?),
            "params" if self.params.is_none() && w.peek() == Some(b'{') => {
                let mut params = Params::default();
                w.object(true, |w, key| params.member(w, key))?;
                self.params = Some(params);
                Some(())
            }
            "params" | "id" | "result" | "error" => None,
            _ => w.skip(),
        }
    }
}

/// Members of `params` read: tokens of `channel` and `serverSeq`; `action` and
/// `origin` as their range and the token of their `type` / `clientId`.
#[derive(Default)]
struct Params<'a> {
    channel: Option<&'a str>,
    server_seq: Option<&'a str>,
    action: Option<(Range<usize>, Option<&'a str>)>,
    origin: Option<(Range<usize>, Option<&'a str>)>,
}

impl<'a> Params<'a> {
    /// Reads one member of `params` whose value `w` is at.
    fn member(&mut self, w: &mut Walk<'a>, key: &str) -> Option<()> {
        match key {
            "channel" => once(&mut self.channel, w.token()?),
            "serverSeq" => once(&mut self.server_seq, w.token()?),
            "action" => once(&mut self.action, w.with_member("type")?),
            "origin" => once(&mut self.origin, w.with_member("clientId")?),
            _ => w.skip(),
        }
    }
}

/// Stores `value` in an empty `slot`; `None` for a second occurrence.
fn once<T>(slot: &mut Option<T>, value: T) -> Option<()> {
    slot.replace(value).is_none().then_some(())
}

/// Bytes before the first `"`, `\\` or control character of `run` (`None` if there is
/// none), eight bytes at a time: strings of a frame are mostly short (keys, URIs), where
/// setting up a vectorised search costs more than it saves, and a word-at-a-time test
/// is as fast on the long ones.
fn string_run(run: &[u8]) -> Option<usize> {
    let mut words = run.chunks_exact(8);
    let mut at = 0;
    for word in words.by_ref() {
        let mask = stops(u64::from_le_bytes(word.try_into().ok()?));
        if mask != 0 {
            return Some(at + mask.trailing_zeros() as usize / 8);
        }
        at += 8;
    }
    let tail = words.remainder();
    let len = tail
        .iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)?;
    Some(at + len)
}

/// The high bit of each byte of `word` that may be `"`, `\\` or below 0x20. The lowest
/// set bit is always exact (a borrow only reaches bytes above a true match), which is
/// all [`string_run`] reads.
fn stops(word: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let below = |w: u64, n: u8| w.wrapping_sub(ONES * u64::from(n)) & !w & HIGH;
    let quote = word ^ (ONES * u64::from(b'"'));
    let backslash = word ^ (ONES * u64::from(b'\\'));
    below(quote, 1) | below(backslash, 1) | below(word, 0x20)
}

/// A position in a frame, walked as JSON: every step checks the grammar (serde_json's:
/// RFC 8259 with lone surrogate escapes allowed in strings) and fails on anything else.
struct Walk<'a> {
    text: &'a str,
    at: usize,
    /// Containers open around the position (the walk recurses into them).
    depth: usize,
}

/// Deepest nesting the walk follows; a deeper frame is left to the general path, whose
/// skipping does not recurse. `limits.max_json_depth` is the operator's to raise, so the
/// walk's stack needs a bound of its own.
const MAX_WALK_DEPTH: usize = 128;

impl<'a> Walk<'a> {
    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes().get(self.at) {
            self.at += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.bytes().get(self.at).copied()
    }

    /// Consumes `byte` (after whitespace) if it is next.
    fn eat(&mut self, byte: u8) -> bool {
        let next = self.peek() == Some(byte);
        if next {
            self.at += 1;
        }
        next
    }

    /// Consumes the digits here; whether there was at least one.
    fn digits(&mut self) -> bool {
        let start = self.at;
        while let Some(b'0'..=b'9') = self.bytes().get(self.at) {
            self.at += 1;
        }
        self.at > start
    }

    /// Consumes the value here (after whitespace) and returns its range.
    fn value(&mut self) -> Option<Range<usize>> {
        self.skip_ws();
        let start = self.at;
        match self.bytes().get(start)? {
            b'"' => self.string()?,
            b'{' | b'[' => self.container()?,
            b't' => self.literal("true")?,
            b'f' => self.literal("false")?,
            b'n' => self.literal("null")?,
            _ => self.number()?,
        }
        Some(start..self.at)
    }

    /// Consumes the string whose opening quote is here: no control characters, and
    /// only JSON's escapes (`\uXXXX` with any four hex digits, as serde_json skips).
    fn string(&mut self) -> Option<()> {
        let bytes = self.bytes();
        let mut at = self.at + 1;
        loop {
            let run = bytes.get(at..)?;
            at += string_run(run)?;
            match bytes.get(at)? {
                b'"' => {
                    self.at = at + 1;
                    return Some(());
                }
                b'\\' => {
                    at += match bytes.get(at + 1)? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => 2,
                        b'u' => {
                            let hex = bytes.get(at + 2..at + 6)?;
                            hex.iter().all(u8::is_ascii_hexdigit).then_some(6)?
                        }
                        _ => return None,
                    }
                }
                _ => return None,
            }
        }
    }

    /// Consumes `word` (`true`, `false` or `null`).
    fn literal(&mut self, word: &str) -> Option<()> {
        let end = self.at + word.len();
        (self.text.get(self.at..end)? == word).then(|| self.at = end)
    }

    /// Consumes a number: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
    fn number(&mut self) -> Option<()> {
        if self.bytes().get(self.at) == Some(&b'-') {
            self.at += 1;
        }
        match self.bytes().get(self.at)? {
            b'0' => self.at += 1,
            b'1'..=b'9' => {
                self.digits();
            }
            _ => return None,
        }
        if self.bytes().get(self.at) == Some(&b'.') {
            self.at += 1;
            self.digits().then_some(())?;
        }
        if let Some(b'e' | b'E') = self.bytes().get(self.at) {
            self.at += 1;
            if let Some(b'+' | b'-') = self.bytes().get(self.at) {
                self.at += 1;
            }
            self.digits().then_some(())?;
        }
        Some(())
    }

    /// Consumes the array whose opening bracket is here.
    /// Consumes the object or array here, one level deeper.
    fn container(&mut self) -> Option<()> {
        self.depth += 1;
        if self.depth > MAX_WALK_DEPTH {
            return None;
        }
        let done = match self.bytes().get(self.at)? {
            b'{' => self.object(false, |w, _| w.skip()),
            _ => self.array(),
        };
        self.depth -= 1;
        done
    }

    fn array(&mut self) -> Option<()> {
        self.at += 1;
        if self.eat(b']') {
            return Some(());
        }
        loop {
            self.value()?;
            if self.eat(b']') {
                return Some(());
            }
            self.eat(b',').then_some(())?;
        }
    }

    /// Consumes the value here and returns its token.
    fn token(&mut self) -> Option<&'a str> {
        let range = self.value()?;
        self.text.get(range)
    }

    /// Consumes the value here and skips it.
    fn skip(&mut self) -> Option<()> {
        self.value().map(drop)
    }

    /// Consumes the value here: its range and, if it is an object, the token of its
    /// member `key` (`None` if absent; the walk fails if it occurs twice).
    fn with_member(&mut self, key: &str) -> Option<(Range<usize>, Option<&'a str>)> {
        if self.peek() != Some(b'{') {
            return Some((self.value()?, None));
        }
        let start = self.at;
        let mut found = None;
        self.object(true, |w, name| match name == key {
            true => once(&mut found, w.token()?),
            false => w.skip(),
        })?;
        Some((start..self.at, found))
    }

    /// Consumes the object here, calling `member(walk, key)` with the walk at each
    /// value, which `member` must consume. `key` is the key's text between its quotes;
    /// with `plain_keys`, a key with an escape fails the walk (its decoded form is left
    /// to the general path).
    fn object(
        &mut self,
        plain_keys: bool,
        mut member: impl FnMut(&mut Self, &str) -> Option<()>,
    ) -> Option<()> {
        if !self.eat(b'{') {
            return None;
        }
        if self.eat(b'}') {
            return Some(());
        }
        loop {
            if self.peek() != Some(b'"') {
                return None;
            }
            let start = self.at;
            self.string()?;
            let key = self.text.get(start + 1..self.at - 1)?;
            if (plain_keys && key.contains('\\')) || !self.eat(b':') {
                return None;
            }
            member(self, key)?;
            if self.eat(b'}') {
                return Some(());
            }
            self.eat(b',').then_some(())?;
        }
    }

    /// Whether only whitespace is left.
    fn at_end(&mut self) -> bool {
        self.peek().is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::super::classify;
    use super::*;

    /// `classify_action` either agrees with `classify` or declines.
    fn agrees(text: &str) -> bool {
        let limits = WireLimits::default();
        match classify_action(text, &limits) {
            Some(fast) => {
                assert_eq!(classify(text, &limits), Ok(fast), "{text}");
                true
            }
            None => false,
        }
    }

    #[test]
    fn reads_plain_envelopes_as_classify_does() {
        let plain = [
            r#"{"jsonrpc":"2.0","method":"action","params":{"channel":"ahp-chat:/c","serverSeq":7,"action":{"type":"chat/delta","content":"a \"}\" b"},"origin":{"clientId":"r1.x","clientSeq":3}}}"#,
            r#" { "params" : { "action" : { "x" : [ 1 , { "type" : 2 } ] , "type" : "t" } , "serverSeq" : 0 , "channel" : "c" } , "method" : "action" , "jsonrpc" : "2.0" , "extra" : null } "#,
            r#"{"jsonrpc":"2.0","method":"action","params":{"channel":"c\u00e9","serverSeq":1,"action":[1,2],"origin":null}}"#,
            r#"{"jsonrpc":"2.0","method":"action","params":{}}"#,
            r#"{"jsonrpc":"2.0","method":"action","params":{"action":{}}}"#,
        ];
        for text in plain {
            assert!(agrees(text), "the fast path declined {text}");
        }
    }

    #[test]
    fn declines_what_only_the_general_path_answers() {
        let other = [
            r#"{"jsonrpc":"2.0","method":"action","params":{"channel":"c","serverSeq":1,"serverSeq":2}}"#,
            r#"{"jsonrpc":"2.0","method":"action","params":{"action":{"type":"a","t\u0079pe":"b"}}}"#,
            r#"{"jsonrpc":"2.0","method":"action","params":{"ser\u0076erSeq":1}}"#,
            r#"{"jsonrpc":"2.0","method":"act\u0069on","params":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"action","params":{}}"#,
            r#"{"jsonrpc":"2.0","method":"action","params":{"serverSeq":-1}}"#,
            r#"{"jsonrpc":"2.0","method":"action","params":{"serverSeq":1.0}}"#,
            r#"{"jsonrpc":"2.0","method":"action","params":{"channel":7}}"#,
            r#"{"jsonrpc":"2.0","method":"action","params":[]}"#,
            r#"{"jsonrpc":"2.0","method":"action"}"#,
            r#"{"jsonrpc":"2.0","method":"ping","params":{}}"#,
            r#"{"jsonrpc":"1.0","method":"action","params":{}}"#,
            r#"{"jsonrpc":"2.0","method":"action","params":{"channel":"c"}"#,
            r#"{"jsonrpc":"2.0","method":"action","params":{"channel":"\ud800"}}"#,
            r#"[{"jsonrpc":"2.0","method":"action","params":{}}]"#,
        ];
        for text in other {
            assert!(!agrees(text), "the fast path took {text}");
        }
    }

    #[test]
    fn declines_every_grammar_error_in_skipped_values() {
        let frame = |junk: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","method":"action","params":{{"channel":"c","action":{{"type":"t","v":{junk}}}}}}}"#
            )
        };
        for junk in [
            "01",
            "1.",
            "-",
            "+1",
            ".5",
            "1e",
            "1e+",
            "tru",
            "nul",
            "True",
            "[1,]",
            "[,1]",
            "{\"a\":1,}",
            "{\"a\" 1}",
            "{1:2}",
            "\"\\x\"",
            "\"\\u12G4\"",
            "\"a\u{1}b\"",
            "\"open",
            "[1 2]",
            "{\"a\":1 \"b\":2}",
            "",
        ] {
            assert!(!agrees(&frame(junk)), "the fast path took {junk}");
        }
        for fine in [
            "-0",
            "0.5e-3",
            "1E+2",
            "[]",
            "{}",
            "[true,false,null]",
            "\"\\ud800\"",
            "\"\\u00e9\\n\\/\"",
            "{\"t\\u0079pe\":1}",
            " [ 1 , { } ] ",
        ] {
            assert!(agrees(&frame(fine)), "the fast path declined {fine}");
        }
        let trailing = format!("{} x", frame("1"));
        assert!(!agrees(&trailing), "trailing bytes");
    }

    #[test]
    fn string_runs_stop_at_the_first_quote_backslash_or_control() {
        for len in 0..40 {
            for stop in [b'"', b'\\', 0x00, 0x1f, b'\n'] {
                let mut run = vec![b'a'; len];
                run.extend([stop, b'"', b'b']);
                assert_eq!(string_run(&run), Some(len), "{len} {stop}");
                let mut high: Vec<u8> = "é€😀~\x7f".bytes().cycle().take(len).collect();
                high.extend([stop, b'x']);
                assert_eq!(string_run(&high), Some(len), "{len} {stop} after non-ASCII");
            }
            assert_eq!(string_run(&vec![b' '; len]), None, "{len}: no stop");
        }
    }

    #[test]
    fn deep_frames_are_left_to_the_general_path() {
        let limits = WireLimits {
            max_depth: 1_000_000,
            ..WireLimits::default()
        };
        for depth in [MAX_WALK_DEPTH - 8, 100_000] {
            let junk = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
            let text = format!(
                r#"{{"jsonrpc":"2.0","method":"action","params":{{"channel":"c","action":{{"type":"t","v":{junk}}}}}}}"#
            );
            let fast = classify_action(&text, &limits);
            assert_eq!(fast.is_some(), depth < MAX_WALK_DEPTH, "depth {depth}");
            if let Some(fast) = fast {
                assert_eq!(classify(&text, &limits), Ok(fast));
            }
        }
    }

    #[test]
    fn declines_keys_given_twice() {
        let other = [
            r#"{"jsonrpc":"2.0","method":"action","params":{},"params":{}}"#,
            r#"{"jsonrpc":"2.0","jsonrpc":"2.0","method":"action","params":{}}"#,
            r#"{"jsonrpc":"2.0","method":"action","params":{"origin":{"clientId":"a","clientId":"b"}}}"#,
        ];
        for text in other {
            assert!(!agrees(text), "the fast path took {text}");
        }
    }
}

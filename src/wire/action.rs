//! [`classify_notification`]: the fast path for a host's notifications — the `action`
//! notification that is nearly all of a host's traffic, and other root-scoped ones —
//! read in one pass that checks the JSON grammar and finds the routed values together.
//! Beside it, [`is_catalog_notification`]: the `root/session*` every per-client link
//! receives and discards (contract §6.2: one per link for each catalog change),
//! recognised without reading them.
//!
//! [`classify`](super::classify) lets serde_json walk the frame through visitors, then
//! scans `params.action` and `params.origin` again for their `type` and `clientId`:
//! about 10,000 instructions for a ~320-byte `chat/delta` (`valgrind --tool=callgrind`
//! on `benches/wire.rs`). serde_json's bare validation alone is half of that, so
//! validating with it and then walking would gain nothing; this walk does both in one
//! pass, in about 1,150 instructions on the ~320-byte streamed `chat/delta` of
//! `benches/relay.rs` (callgrind on its section 0, `AHP_BENCH_ONLY=0`). What
//! keeps it there:
//! - The levels it reads (top, `params`, `params.action`, `params.origin`) are one loop
//!   each, inlined into one function that keeps the position in a register; only
//!   objects, arrays and literals it skips go through a (recursive) call.
//! - A string's first eight bytes are tested inline as one `u64` word ([`stops`]): keys
//!   and most values end there. A longer string is scanned sixteen bytes at a time in
//!   SSE2 ([`stops16`]; a long `content` costs half the words' time), escapes out of
//!   line; a key it reads is recognised with its closing quote and colon in one
//!   comparison (`channel":`), and the head hosts write, `{"jsonrpc":"2.0",
//!   "method":"action","params":`, in one.
//! - The depth limit is counted by the walk instead of a scan of its own: for a frame the
//!   walk accepts (valid JSON) its depth is the nesting `WireLimits` measures. Nothing is
//!   allocated unless a routed string has an escape.
//!
//! This is a second reading of JSON beside serde_json's, which the module documentation
//! of [`wire`](super) warns against: a disagreement is a place to smuggle a meaning past
//! routing. It is kept safe by what it may return. Guarantee: when [`classify_notification`]
//! returns `Some(frame)`, [`classify`](super::classify) returns `Ok(frame)` for the same
//! text and limits — so the fast path never accepts a frame the general path refuses,
//! and never reads a value differently. Anything outside the plain form hosts write gives
//! `None` and the caller classifies the frame the general way, which also produces the
//! error: a key with an escape at a level it reads, a key it reads given twice, an `id`,
//! `result` or `error`, a routed value of the wrong type or with an undecodable escape,
//! a method that is not a string or has an escape, a frame longer or deeper than the limits
//! allow, and anything that is not JSON. The guarantee is checked by the generated and
//! mutated frames of `wire::tests::generated`, by the tests below (every scanner at every
//! alignment), by the fuzz target `wire_host` and by the replay of its corpus in CI.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::LazyLock;

use memchr::memmem;

use super::fields::{SeqField, StrField};
use super::frame::{Frame, FrameKind};
use super::params::ParamsFields;
use super::result::ResultFields;
use super::{WireError, WireLimits};

/// Classifies a frame from a host: through [`classify_notification`] when it takes the frame,
/// else through [`classify`](super::classify). Same result as `classify` alone.
pub fn classify_host<'a>(text: &'a str, limits: &WireLimits) -> Result<Frame<'a>, WireError> {
    classify_notification(text, limits).map_or_else(|| super::classify(text, limits), Ok)
}

/// Classifies `text` when it is a notification in the plain form (`action` or any other
/// method without escapes); `None` otherwise (then use [`classify`](super::classify)).
/// See the module documentation.
pub fn classify_notification<'a>(text: &'a str, limits: &WireLimits) -> Option<Frame<'a>> {
    if text.len() > limits.max_frame_bytes {
        return None;
    }
    let mut walk = Walk {
        bytes: text.as_bytes(),
        at: 0,
        depth: 0,
        max_depth: limits.max_depth.min(MAX_WALK_DEPTH),
    };
    let (method, params) = top(&mut walk)?;
    walk.at_end().then_some(())?;
    let method = match method {
        Method::Action => "action",
        // Without escapes the method is its bytes between the quotes, as `classify`
        // decodes it.
        Method::Plain(range) => text.get(range.start + 1..range.end - 1)?,
    };
    let (action, action_type) = match params.action {
        Some((range, Some(token))) => (Some(range), Some(token.field(text, "params.action.type")?)),
        Some((range, None)) => (Some(range), None),
        None => (None, None),
    };
    let (origin, origin_client_id) = match params.origin {
        Some((range, Some(token))) => (
            Some(range),
            Some(token.field(text, "params.origin.clientId")?),
        ),
        Some((range, None)) => (Some(range), None),
        None => (None, None),
    };
    let channel = match params.channel {
        Some(token) => Some(token.field(text, "params.channel")?),
        None => None,
    };
    let fields = ParamsFields {
        channel,
        server_seq: params.server_seq,
        action,
        action_type,
        origin,
        origin_client_id,
    };
    Some(Frame {
        kind: FrameKind::Notification {
            method: Cow::Borrowed(method),
        },
        params: fields,
        result: ResultFields::default(),
    })
}

/// How hosts begin a catalog notification (`root/sessionAdded`, `root/sessionRemoved`,
/// `root/sessionSummaryChanged`).
const CATALOG_HEAD: &[u8] = br#"{"jsonrpc":"2.0","method":"root/session"#;
/// Where the method's first letter is in [`CATALOG_HEAD`].
const CATALOG_METHOD_AT: usize = CATALOG_HEAD.len() - b"root/session".len();

/// Whether a per-client link may discard `text` unread as a catalog notification
/// (contract §6.2: those come from the watch link alone; a per-client link receives one
/// for every catalog change and acts on none). True only for the form hosts write: the
/// head above, no backslash anywhere and no `"id"` anywhere, in two `memchr` scans instead
/// of the ~1,800-instruction walk. Guarantee: when it returns true, [`classify`](super::classify)
/// either refuses `text` or reads a notification whose method starts with `root/session`
/// — never an `action`, a request, a response, `auth/required` or `root/progress` (the
/// head puts the top-level `method` there, a second `method` is refused, and without
/// escapes every `id` key is spelled `"id"`). So a link that discards these loses nothing
/// the general path acts on; the one difference is that a malformed frame with this head
/// is not counted as a bad frame on each per-client link (the watch link reads and counts
/// the same event). Checked with the fast path's generated, mutated and fuzzed frames.
pub fn is_catalog_notification(text: &str) -> bool {
    // Built once: building a searcher costs about as much as searching a catalog frame.
    static ID_KEY: LazyLock<memmem::Finder<'static>> =
        LazyLock::new(|| memmem::Finder::new(br#""id""#));
    let bytes = text.as_bytes();
    // The method's first letter first: one byte where an `action` frame
    // differs, before the head's comparison.
    bytes.get(CATALOG_METHOD_AT) == Some(&b'r')
        && bytes.starts_with(CATALOG_HEAD)
        && memchr::memchr(b'\\', bytes).is_none()
        && ID_KEY.find(bytes).is_none()
}

/// A string token of the frame: its range, quotes included, and whether it has an escape.
struct Str {
    range: Range<usize>,
    escaped: bool,
}

impl Str {
    /// The token as a routed string `field` of `text`: borrowed without escapes, decoded
    /// by serde_json with them; `None` if it does not decode (a lone surrogate escape),
    /// where [`classify`](super::classify) refuses the frame.
    #[inline(always)]
    fn field<'a>(self, text: &'a str, field: &'static str) -> Option<StrField<'a>> {
        let Self { range, escaped } = self;
        if escaped {
            return StrField::new(text, text.get(range)?, field).ok();
        }
        let value = text.get(range.start + 1..range.end - 1)?;
        Some(StrField {
            value: Cow::Borrowed(value),
            range,
        })
    }
}

/// How hosts begin an `action` notification. A frame that starts so is read from
/// `params` on, with `jsonrpc` and `method` seen: exactly what the member-by-member
/// walk reads from these bytes, in one comparison instead of three members' steps.
const PLAIN_HEAD: &[u8] = br#"{"jsonrpc":"2.0","method":"action","params":"#;

/// The `method` of a notification the walk takes.
enum Method {
    /// `"action"`, read with the head hosts write ([`PLAIN_HEAD`]).
    Action,
    /// Any other string without an escape: its range, quotes included.
    Plain(Range<usize>),
}

/// Reads the top-level object: `jsonrpc` must be `"2.0"`, written exactly so (another
/// spelling fails the walk), `method` a string without escapes, and `params` an
/// object, whose members it returns with the method; `id`, `result`, `error` and a
/// second `jsonrpc`, `method` or `params` fail the walk.
#[inline(always)]
fn top(w: &mut Walk<'_>) -> Option<(Method, Params)> {
    let (mut jsonrpc, mut method, mut params) = (false, None, None);
    let mut more = if w.bytes.starts_with(PLAIN_HEAD) {
        w.enter()?;
        w.at = PLAIN_HEAD.len();
        (jsonrpc, method) = (true, Some(Method::Action));
        params = Some(Params::read(w)?);
        w.next_member()?
    } else {
        w.open_object()?
    };
    while more {
        match w.member_of(&[
            br#"jsonrpc":"#,
            br#"method":"#,
            br#"params":"#,
            br#"id":"#,
            br#"result":"#,
            br#"error":"#,
        ])? {
            0 => {
                first(&mut jsonrpc)?;
                w.exactly(br#""2.0""#)?;
            }
            1 => {
                let token = w.string()?;
                (!token.escaped).then_some(())?;
                once(&mut method, Method::Plain(token.range))?;
            }
            2 => once(&mut params, Params::read(w)?)?,
            3..=5 => return None,
            _ => w.value()?,
        }
        more = w.next_member()?;
    }
    jsonrpc.then_some(())?;
    Some((method?, params?))
}

/// Members of `params` read: `channel` (a string), `serverSeq` (an integer in
/// `0..=u64::MAX`); `action` and `origin` as their range and their `type` / `clientId`
/// (a string, when the value is an object that has it).
#[derive(Default)]
struct Params {
    channel: Option<Str>,
    server_seq: Option<SeqField>,
    action: Option<(Range<usize>, Option<Str>)>,
    origin: Option<(Range<usize>, Option<Str>)>,
}

impl Params {
    /// Reads the object `w` is at (anything else fails the walk).
    #[inline(always)]
    fn read(w: &mut Walk<'_>) -> Option<Self> {
        let mut params = Self::default();
        let mut more = w.open_object()?;
        while more {
            match w.member_of(&[
                br#"channel":"#,
                br#"serverSeq":"#,
                br#"action":"#,
                br#"origin":"#,
            ])? {
                0 => once(&mut params.channel, w.string()?)?,
                1 => once(&mut params.server_seq, w.seq()?)?,
                2 => once(&mut params.action, w.with_member(br#"type":"#)?)?,
                3 => once(&mut params.origin, w.with_member(br#"clientId":"#)?)?,
                _ => w.value()?,
            }
            more = w.next_member()?;
        }
        Some(params)
    }
}

/// Stores `value` in an empty `slot`; `None` for a second occurrence.
fn once<T>(slot: &mut Option<T>, value: T) -> Option<()> {
    slot.replace(value).is_none().then_some(())
}

/// Sets `seen`; `None` if it was set (a second occurrence).
fn first(seen: &mut bool) -> Option<()> {
    (!std::mem::replace(seen, true)).then_some(())
}

/// Deepest nesting the walk follows (the top-level object is depth 1); a deeper frame is
/// left to the general path, whose skipping does not recurse. `limits.max_depth` is the
/// operator's to raise, so the walk's stack needs a bound of its own.
const MAX_WALK_DEPTH: usize = 128;

/// A position in a frame, walked as JSON: every step checks the grammar (serde_json's:
/// RFC 8259 with lone surrogate escapes allowed in strings) and fails on anything else.
struct Walk<'a> {
    bytes: &'a [u8],
    at: usize,
    /// Objects and arrays open around the position (the walk recurses into them).
    depth: usize,
    /// Deepest nesting allowed: `limits.max_depth`, at most [`MAX_WALK_DEPTH`]. For a
    /// frame the walk accepts (valid JSON) this is the nesting `WireLimits` measures.
    max_depth: usize,
}

impl<'a> Walk<'a> {
    /// The next byte that is not JSON whitespace, which the position moves to.
    #[inline(always)]
    fn peek(&mut self) -> Option<u8> {
        let byte = *self.bytes.get(self.at)?;
        if byte > b' ' {
            return Some(byte);
        }
        self.at = after_ws(self.bytes, self.at);
        self.bytes.get(self.at).copied()
    }

    /// Whether only whitespace is left.
    #[inline(always)]
    fn at_end(&mut self) -> bool {
        self.peek().is_none()
    }

    /// Consumes the value here (after whitespace), which must be the bytes `token`.
    #[inline(always)]
    fn exactly(&mut self, token: &[u8]) -> Option<()> {
        self.peek()?;
        let found = self.bytes.get(self.at..)?.starts_with(token);
        found.then(|| self.at += token.len())
    }

    /// Consumes the value here (after whitespace). Strings and numbers, most of the
    /// values skipped, are read in place; the rest by [`after_other`].
    #[inline(always)]
    fn value(&mut self) -> Option<()> {
        self.at = match self.peek()? {
            b'"' => string_end(self.bytes, self.at + 1)?.0,
            b'-' | b'0'..=b'9' => number_end(self.bytes, self.at)?,
            _ => after_other(self.bytes, self.at, self.depth, self.max_depth)?,
        };
        Some(())
    }

    /// Consumes the object, array or literal here.
    fn other_value(&mut self) -> Option<()> {
        match self.bytes.get(self.at)? {
            b'{' => {
                let mut more = self.open_object()?;
                while more {
                    self.skip_key()?;
                    self.value()?;
                    more = self.next_member()?;
                }
                Some(())
            }
            b'[' => self.array(),
            b't' => self.exactly(b"true"),
            b'f' => self.exactly(b"false"),
            b'n' => self.exactly(b"null"),
            _ => None,
        }
    }

    /// Consumes the value here, which must be a string.
    #[inline(always)]
    fn string(&mut self) -> Option<Str> {
        if self.peek()? != b'"' {
            return None;
        }
        let start = self.at;
        let (end, escaped) = string_end(self.bytes, start + 1)?;
        self.at = end;
        Some(Str {
            range: start..end,
            escaped,
        })
    }

    /// Consumes the value here, which must be an integer in `0..=u64::MAX` written
    /// without fraction or exponent (what [`SeqField`] accepts).
    #[inline(always)]
    fn seq(&mut self) -> Option<SeqField> {
        self.peek()?;
        let bytes = self.bytes;
        let start = self.at;
        let mut at = start;
        let mut value = 0u64;
        while let Some(&digit @ b'0'..=b'9') = bytes.get(at) {
            value = value.wrapping_mul(10).wrapping_add(u64::from(digit - b'0'));
            at += 1;
        }
        let leading_zero = bytes.get(start) == Some(&b'0') && at > start + 1;
        if at == start || leading_zero || matches!(bytes.get(at), Some(b'.' | b'e' | b'E')) {
            return None;
        }
        // Nineteen digits always fit; a longer token is read again, exactly.
        if at - start > 19 {
            value = std::str::from_utf8(bytes.get(start..at)?)
                .ok()?
                .parse()
                .ok()?;
        }
        self.at = at;
        Some(SeqField {
            value,
            range: start..at,
        })
    }

    /// Enters an object or array: one level deeper, within `max_depth`.
    #[inline(always)]
    fn enter(&mut self) -> Option<()> {
        self.depth += 1;
        self.at += 1;
        (self.depth <= self.max_depth).then_some(())
    }

    /// Consumes the array whose opening bracket is here.
    #[inline(always)]
    fn array(&mut self) -> Option<()> {
        self.enter()?;
        if self.peek()? != b']' {
            loop {
                self.value()?;
                match self.peek()? {
                    b',' => self.at += 1,
                    b']' => break,
                    _ => return None,
                }
            }
        }
        self.leave();
        Some(())
    }

    /// Leaves an object or array whose closing bracket is here.
    #[inline(always)]
    fn leave(&mut self) {
        self.at += 1;
        self.depth -= 1;
    }

    /// Consumes the value here: its range and, if it is an object, its member `key`
    /// (written as [`named`](Self::named) takes it), which must be a string (`None` if
    /// absent; the walk fails if it occurs twice).
    #[inline(always)]
    fn with_member(&mut self, key: &[u8]) -> Option<(Range<usize>, Option<Str>)> {
        let object = self.peek()? == b'{';
        let start = self.at;
        if !object {
            self.value()?;
            return Some((start..self.at, None));
        }
        let mut found = None;
        let mut more = self.open_object()?;
        while more {
            match self.member_of(&[key])? {
                0 => once(&mut found, self.string()?)?,
                _ => self.value()?,
            }
            more = self.next_member()?;
        }
        Some((start..self.at, found))
    }

    /// Opens the object here (after whitespace; anything else fails the walk): whether
    /// it has a member, whose key's opening quote the walk is then at (else the walk is
    /// after the object).
    #[inline(always)]
    fn open_object(&mut self) -> Option<bool> {
        if self.bytes.get(self.at..)?.starts_with(b"{\"") {
            self.enter()?;
            return Some(true);
        }
        if self.peek()? != b'{' {
            return None;
        }
        self.enter()?;
        match self.peek()? {
            b'"' => Some(true),
            b'}' => {
                self.leave();
                Some(false)
            }
            _ => None,
        }
    }

    /// After a member's value: whether another member follows, as
    /// [`open_object`](Self::open_object) says it.
    #[inline(always)]
    fn next_member(&mut self) -> Option<bool> {
        if self.bytes.get(self.at..)?.starts_with(b",\"") {
            self.at += 1;
            return Some(true);
        }
        match self.peek()? {
            b',' => {
                self.at += 1;
                (self.peek()? == b'"').then_some(true)
            }
            b'}' => {
                self.leave();
                Some(false)
            }
            _ => None,
        }
    }

    /// Consumes the key whose opening quote is here, and its colon: the index in `names`
    /// of its name, or `names.len()` for another name. `names` are written as
    /// [`named`](Self::named) takes them, which reads the plain form (no whitespace
    /// before the colon) in one comparison each; [`key`](Self::key) reads the rest, and
    /// fails the walk on a key with an escape.
    #[inline(always)]
    fn member_of(&mut self, names: &[&[u8]]) -> Option<usize> {
        if let Some(index) = names.iter().position(|name| self.named(name)) {
            return Some(index);
        }
        let key = self.key()?;
        let index = names
            .iter()
            .position(|name| name.strip_suffix(b"\":") == Some(key));
        Some(index.unwrap_or(names.len()))
    }

    /// Whether the key here is `name` followed directly by the colon: `name` is the
    /// key's text, its closing quote and the colon (`channel":`), which are then
    /// consumed. Exact: such bytes after an opening quote are that key and no other.
    #[inline(always)]
    fn named(&mut self, name: &[u8]) -> bool {
        let start = self.at + 1;
        let found = self
            .bytes
            .get(start..)
            .is_some_and(|rest| rest.starts_with(name));
        if found {
            self.at = start + name.len();
        }
        found
    }

    /// Consumes the key whose opening quote is here, and its colon, whatever the key.
    #[inline(always)]
    fn skip_key(&mut self) -> Option<()> {
        self.at = string_end(self.bytes, self.at + 1)?.0;
        (self.peek()? == b':').then(|| self.at += 1)
    }

    /// Consumes the key whose opening quote is here, and its colon: the key's bytes
    /// between its quotes. A key with an escape fails the walk: this is only for levels
    /// the walk reads, whose keys' decoded form is left to the general path.
    #[inline(always)]
    fn key(&mut self) -> Option<&'a [u8]> {
        let start = self.at + 1;
        let (end, escaped) = string_end(self.bytes, start)?;
        if escaped {
            return None;
        }
        let key = self.bytes.get(start..end - 1)?;
        self.at = end;
        if self.peek()? != b':' {
            return None;
        }
        self.at += 1;
        Some(key)
    }
}

/// The position after the whitespace from `at` on.
#[inline(never)]
fn after_ws(bytes: &[u8], mut at: usize) -> usize {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = bytes.get(at) {
        at += 1;
    }
    at
}

/// The position after the object, array or literal at `at`, walked at `depth` (see
/// [`Walk`]). Not inlined: the walk recurses through it into nested containers, and the
/// values of a frame's routed levels are mostly strings and numbers.
#[inline(never)]
fn after_other(bytes: &[u8], at: usize, depth: usize, max_depth: usize) -> Option<usize> {
    let mut walk = Walk {
        bytes,
        at,
        depth,
        max_depth,
    };
    walk.other_value()?;
    Some(walk.at)
}

/// The position after the number at `at`:
/// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
#[inline(always)]
fn number_end(bytes: &[u8], mut at: usize) -> Option<usize> {
    if bytes.get(at) == Some(&b'-') {
        at += 1;
    }
    at = match bytes.get(at)? {
        b'0' => at + 1,
        b'1'..=b'9' => digits(bytes, at + 1),
        _ => return None,
    };
    if bytes.get(at) == Some(&b'.') {
        at = some_digits(bytes, at + 1)?;
    }
    if let Some(b'e' | b'E') = bytes.get(at) {
        at += 1;
        if let Some(b'+' | b'-') = bytes.get(at) {
            at += 1;
        }
        at = some_digits(bytes, at)?;
    }
    Some(at)
}

/// The position after the digits from `at` on.
fn digits(bytes: &[u8], mut at: usize) -> usize {
    while let Some(b'0'..=b'9') = bytes.get(at) {
        at += 1;
    }
    at
}

/// [`digits`], which must be at least one.
fn some_digits(bytes: &[u8], at: usize) -> Option<usize> {
    let end = digits(bytes, at);
    (end > at).then_some(end)
}

/// The position after the escape whose backslash is at `at`: one of JSON's, with any
/// four hex digits after `\u`.
fn escape_end(bytes: &[u8], at: usize) -> Option<usize> {
    match bytes.get(at + 1)? {
        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Some(at + 2),
        b'u' => {
            let hex = bytes.get(at + 2..)?.first_chunk::<4>()?;
            hex.iter().all(u8::is_ascii_hexdigit).then_some(at + 6)
        }
        _ => None,
    }
}

/// The position after the closing quote of the string whose content starts at `at`, and
/// whether the string has an escape; `None` if it is not a JSON string (a control
/// character, an escape other than JSON's, no closing quote). Inlined at each of its
/// uses: most strings of a frame are keys and short values that end in the first word
/// [`string_stop`] tests, where a call would cost as much as the test.
#[inline(always)]
fn string_end(bytes: &[u8], at: usize) -> Option<(usize, bool)> {
    let stop = string_stop(bytes, at)?;
    match bytes.get(stop)? {
        b'"' => Some((stop + 1, false)),
        _ => escaped_string_end(bytes, stop),
    }
}

/// [`string_end`] from `at`, the first `\\` or control character of the string.
#[inline(never)]
fn escaped_string_end(bytes: &[u8], mut at: usize) -> Option<(usize, bool)> {
    loop {
        match bytes.get(at)? {
            b'\\' => at = string_stop(bytes, escape_end(bytes, at)?)?,
            b'"' => return Some((at + 1, true)),
            _ => return None,
        }
    }
}

/// The position of the first `"`, `\\` or control character from `at` on (`None` if
/// there is none). The first eight bytes are one word ([`stops`]), tested inline: keys
/// and most values end in it. A longer string goes on sixteen bytes at a time
/// ([`long_string_stop`]), out of line, so each use of the walk's strings inlines one
/// word's test and not a loop.
#[inline(always)]
fn string_stop(bytes: &[u8], at: usize) -> Option<usize> {
    let Some(word) = bytes.get(at..)?.first_chunk::<8>() else {
        return byte_stop(bytes, at);
    };
    let mask = stops(u64::from_le_bytes(*word));
    if mask != 0 {
        return Some(at + mask.trailing_zeros() as usize / 8);
    }
    long_string_stop(bytes, at + 8)
}

/// [`string_stop`] from `at` on, sixteen bytes at a time ([`stops16`]), then a word and
/// bytes for the frame's last fifteen.
#[inline(never)]
fn long_string_stop(bytes: &[u8], mut at: usize) -> Option<usize> {
    while let Some(chunk) = bytes.get(at..)?.first_chunk::<16>() {
        if let Some(first) = stops16(chunk) {
            return Some(at + first);
        }
        at += 16;
    }
    if let Some(word) = bytes.get(at..)?.first_chunk::<8>() {
        let mask = stops(u64::from_le_bytes(*word));
        if mask != 0 {
            return Some(at + mask.trailing_zeros() as usize / 8);
        }
        at += 8;
    }
    byte_stop(bytes, at)
}

/// [`string_stop`] a byte at a time (fewer than eight bytes left).
fn byte_stop(bytes: &[u8], at: usize) -> Option<usize> {
    let len = bytes
        .get(at..)?
        .iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)?;
    Some(at + len)
}

/// The index of the first `"`, `\\` or control character of `chunk`, in SSE2 (part of
/// every x86-64 CPU; safe wrappers from `safe_arch`): `byte ^ 0x02`, compared unsigned,
/// is at most 0x20 exactly for the control characters and `"` (as in [`stops`]), and a
/// second compare finds `\\`. Exact for every byte, so the lowest set bit is the stop.
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
#[inline(always)]
fn stops16(chunk: &[u8; 16]) -> Option<usize> {
    use safe_arch::{
        bitor_m128i, bitxor_m128i, cmp_eq_mask_i8_m128i, load_unaligned_m128i, min_u8_m128i,
        move_mask_i8_m128i, set_splat_i8_m128i,
    };
    let v = load_unaligned_m128i(chunk);
    let flipped = bitxor_m128i(v, set_splat_i8_m128i(0x02));
    let quote_or_control =
        cmp_eq_mask_i8_m128i(min_u8_m128i(flipped, set_splat_i8_m128i(0x20)), flipped);
    let backslash = cmp_eq_mask_i8_m128i(v, set_splat_i8_m128i(b'\\' as i8));
    let mask = move_mask_i8_m128i(bitor_m128i(quote_or_control, backslash));
    (mask != 0).then(|| mask.trailing_zeros() as usize)
}

/// [`stops16`] elsewhere: two words of [`stops`] (also checked against it in tests).
#[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
#[inline(always)]
fn stops16(chunk: &[u8; 16]) -> Option<usize> {
    stops16_words(chunk)
}

/// [`stops16`] as two words of [`stops`].
#[cfg_attr(
    all(target_arch = "x86_64", target_feature = "sse2", not(test)),
    allow(dead_code)
)]
#[inline(always)]
fn stops16_words(chunk: &[u8; 16]) -> Option<usize> {
    let (low, high) = chunk.split_first_chunk::<8>()?;
    let low = stops(u64::from_le_bytes(*low));
    if low != 0 {
        return Some(low.trailing_zeros() as usize / 8);
    }
    let high = stops(u64::from_le_bytes(*high.first_chunk::<8>()?));
    (high != 0).then(|| 8 + high.trailing_zeros() as usize / 8)
}

/// The high bit of each byte of `word` (little-endian) that may be `"`, `\\` or below
/// 0x20. The lowest set bit is always exact (a borrow only reaches bytes above a true
/// match), which is all [`string_stop`] reads.
///
/// `byte ^ 0x02` is below 0x21 exactly for the control characters and `"` (0x22 becomes
/// 0x20), and `byte ^ 0x5c` is zero exactly for `\\`; both keep the high bit, so one
/// `!word` clears the bytes from 0x80 up for both tests.
fn stops(word: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let quote_or_control = (word ^ (ONES * 0x02)).wrapping_sub(ONES * 0x21);
    let backslash = (word ^ (ONES * u64::from(b'\\'))).wrapping_sub(ONES);
    (quote_or_control | backslash) & !word & HIGH
}

#[cfg(test)]
mod tests {
    use super::super::classify;
    use super::*;

    /// `classify_notification` either agrees with `classify` or declines.
    fn agrees(text: &str) -> bool {
        let limits = WireLimits::default();
        match classify_notification(text, &limits) {
            Some(fast) => {
                assert_eq!(classify(text, &limits), Ok(fast), "{text}");
                true
            }
            None => false,
        }
    }

    #[test]
    fn catalog_notifications_are_recognised_only_in_the_form_hosts_write() {
        let summary = r#"{"jsonrpc":"2.0","method":"root/sessionSummaryChanged","params":{"channel":"ahp-root://","session":"s:/1","changes":{"status":1}}}"#;
        assert!(is_catalog_notification(summary));
        assert!(is_catalog_notification(
            r#"{"jsonrpc":"2.0","method":"root/sessionAdded","params":{"summary":{"resource":"s:/2","title":"t"}}}"#
        ));
        // Malformed with the head: discarded all the same (classify refuses it).
        let broken = r#"{"jsonrpc":"2.0","method":"root/sessionRemoved","params":{"#;
        assert!(is_catalog_notification(broken));
        assert!(classify(broken, &WireLimits::default()).is_err());
        for declined in [
            // Could be a request: an `id` anywhere, spelled plainly or escaped.
            r#"{"jsonrpc":"2.0","method":"root/sessionAdded","params":{},"id":1}"#,
            r#"{"jsonrpc":"2.0","method":"root/sessionAdded","params":{},"\u0069d":1}"#,
            // A title with an escape: read the general way.
            r#"{"jsonrpc":"2.0","method":"root/sessionAdded","params":{"summary":{"title":"a\"b"}}}"#,
            // Other notifications and other spellings of the head.
            r#"{"jsonrpc":"2.0","method":"root/progress","params":{}}"#,
            r#"{"jsonrpc":"2.0","method":"action","params":{"channel":"ahp-root://"}}"#,
            r#"{"method":"root/sessionAdded","jsonrpc":"2.0","params":{}}"#,
            r#" {"jsonrpc":"2.0","method":"root/sessionAdded","params":{}}"#,
        ] {
            assert!(!is_catalog_notification(declined), "{declined}");
        }
        // A second `method` after the head is refused by classify, never read as `action`.
        let twice = r#"{"jsonrpc":"2.0","method":"root/sessionAdded","method":"action","params":{"channel":"c","serverSeq":1}}"#;
        assert!(is_catalog_notification(twice));
        assert!(classify(twice, &WireLimits::default()).is_err());
    }

    #[test]
    fn reads_plain_notifications_as_classify_does() {
        let plain = [
            r#"{"jsonrpc":"2.0","method":"action","params":{"channel":"ahp-chat:/c","serverSeq":7,"action":{"type":"chat/delta","content":"a \"}\" b"},"origin":{"clientId":"r1.x","clientSeq":3}}}"#,
            r#" { "params" : { "action" : { "x" : [ 1 , { "type" : 2 } ] , "type" : "t" } , "serverSeq" : 0 , "channel" : "c" } , "method" : "action" , "jsonrpc" : "2.0" , "extra" : null } "#,
            r#"{"jsonrpc":"2.0","method":"action","params":{"channel":"c\u00e9","serverSeq":1,"action":[1,2],"origin":null}}"#,
            r#"{"jsonrpc":"2.0","method":"action","params":{}}"#,
            r#"{"jsonrpc":"2.0","method":"action","params":{"action":{}}}"#,
            r#"{"jsonrpc":"2.0","method":"ping","params":{}}"#,
            r#"{"jsonrpc":"2.0","method":"root/sessionSummaryChanged","params":{"channel":"ahp-root://","session":"s:/1","changes":{"status":1,"chats":[{"resource":"ahp-chat:/c","title":"t"}]}}}"#,
            r#"{"params":{"channel":"ahp-root://"},"method":"root/progress","jsonrpc":"2.0"}"#,
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
            r#"{"jsonrpc":"2.0","method":7,"params":{}}"#,
            r#"{"jsonrpc":"2.0","method":"root\/sessionAdded","params":{}}"#,
            r#"{"jsonrpc":"2.0","method":"a","method":"b","params":{}}"#,
            r#"{"jsonrpc":"2.0","params":{}}"#,
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
            let fast = classify_notification(&text, &limits);
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

    /// Whether `byte` ends a run of plain string content.
    fn is_stop(byte: u8) -> bool {
        byte == b'"' || byte == b'\\' || byte < 0x20
    }

    #[test]
    fn stops_finds_the_first_stop_byte_at_each_position_of_a_word() {
        for fill in [b'a', b' ', b'~', 0x7f, 0x80, 0xa1, 0xdc, 0xff] {
            for position in 0..8 {
                for byte in 0..=255u8 {
                    let mut word = [fill; 8];
                    word[position] = byte;
                    let mask = stops(u64::from_le_bytes(word));
                    let first = (mask != 0).then(|| mask.trailing_zeros() as usize / 8);
                    let expected = word.iter().position(|&b| is_stop(b));
                    assert_eq!(first, expected, "fill {fill:#x}, {byte:#x} at {position}");
                }
            }
        }
        // A stop below another: the borrow of the lower one must not hide it.
        for (low, high) in [(0usize, 1usize), (2, 7), (6, 7)] {
            for (a, b) in [(b'"', b'\\'), (0x00, b'"'), (b'\\', 0x1f), (0x1f, 0x00)] {
                let mut word = [b'x'; 8];
                word[low] = a;
                word[high] = b;
                let mask = stops(u64::from_le_bytes(word));
                assert_eq!(mask.trailing_zeros() as usize / 8, low, "{a:#x} {b:#x}");
            }
        }
    }

    #[test]
    fn stops16_finds_the_first_stop_byte_at_each_position_of_a_chunk() {
        for fill in [b'a', b' ', b'!', b'#', b'~', 0x7f, 0x80, 0xa2, 0xdc, 0xff] {
            for position in 0..16 {
                for byte in 0..=255u8 {
                    let mut chunk = [fill; 16];
                    chunk[position] = byte;
                    let expected = chunk.iter().position(|&b| is_stop(b));
                    assert_eq!(
                        stops16(&chunk),
                        expected,
                        "fill {fill:#x}, {byte:#x} at {position}"
                    );
                    assert_eq!(
                        stops16_words(&chunk),
                        expected,
                        "{fill:#x}, {byte:#x} at {position}"
                    );
                }
            }
        }
        // Two stops: the lower one is the answer, whichever bytes they are.
        for (low, high) in [(0usize, 1usize), (7, 8), (8, 15), (3, 12)] {
            for (a, b) in [(b'"', b'\\'), (0x00, b'"'), (b'\\', 0x1f), (0x1f, 0x00)] {
                let mut chunk = [b'x'; 16];
                chunk[low] = a;
                chunk[high] = b;
                assert_eq!(stops16(&chunk), Some(low), "{a:#x} {b:#x}");
                assert_eq!(stops16_words(&chunk), Some(low), "{a:#x} {b:#x}");
            }
        }
    }

    #[test]
    fn string_ends_are_found_at_every_alignment() {
        let fills: [&[u8]; 3] = [b"abcdefgh", "é€😀~\x7f".as_bytes(), b" /:-.~09"];
        for offset in 0..9 {
            for len in 0..72 {
                for fill in fills {
                    // `offset` bytes before the opening quote shift the string against
                    // the eight- and sixteen-byte steps; the closing quote is the last byte or not.
                    let mut text = vec![b'['; offset];
                    text.push(b'"');
                    let content: Vec<u8> = fill.iter().copied().cycle().take(len).collect();
                    text.extend(&content);
                    text.push(b'"');
                    let end = text.len();
                    assert_eq!(string_end(&text, offset + 1), Some((end, false)));
                    text.extend(b"]\"x");
                    assert_eq!(string_end(&text, offset + 1), Some((end, false)));
                    text.truncate(end - 1);
                    assert_eq!(string_end(&text, offset + 1), None, "unterminated");
                }
            }
        }
    }

    #[test]
    fn string_ends_stop_at_a_quote_backslash_or_control_at_each_position() {
        for offset in 0..9 {
            for len in 0..26 {
                for at in 0..len {
                    let string = |stop: &[u8]| {
                        let mut text = vec![b' '; offset];
                        text.push(b'"');
                        text.extend(std::iter::repeat_n(b'a', len));
                        text.splice(offset + 1 + at..offset + 2 + at, stop.iter().copied());
                        text.extend(b"\"tail\"");
                        text
                    };
                    let from = offset + 1;
                    let quote = string(b"\"");
                    assert_eq!(string_end(&quote, from), Some((from + at + 1, false)));
                    for control in [0x00, 0x01, b'\t', b'\n', 0x1f] {
                        assert_eq!(string_end(&string(&[control]), from), None, "{control}");
                    }
                    for (escape, width) in [(&b"\\n"[..], 2), (b"\\\"", 2), (b"\\u00e9", 6)] {
                        let text = string(escape);
                        let end = offset + 1 + len + width;
                        assert_eq!(string_end(&text, from), Some((end, true)), "{at} {len}");
                    }
                    for bad in [&b"\\x"[..], b"\\u12G4", b"\\u12x", b"\\\x01"] {
                        assert_eq!(string_end(&string(bad), from), None, "{bad:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn strings_near_the_end_of_the_frame_are_read_a_byte_at_a_time() {
        for len in 0..9 {
            let mut text: Vec<u8> = std::iter::repeat_n(b'z', len).collect();
            text.push(b'"');
            assert_eq!(string_end(&text, 0), Some((len + 1, false)));
            assert_eq!(string_end(&text, len + 1), None, "nothing left");
            text.insert(0, b'\\');
            text.insert(1, b'/');
            assert_eq!(string_end(&text, 0), Some((len + 3, true)));
            text.pop();
            text.push(b'\\');
            assert_eq!(string_end(&text, 0), None, "escape cut off");
        }
    }

    #[test]
    fn numbers_end_where_json_says() {
        for (text, end) in [
            ("0", Some(1)),
            ("-0", Some(2)),
            ("12345,", Some(5)),
            ("0.5e-3}", Some(6)),
            ("1E+2]", Some(4)),
            ("01", Some(1)),
            ("-", None),
            ("1.", None),
            ("1.e5", None),
            ("1e", None),
            ("1e+", None),
            (".5", None),
            ("+1", None),
            ("-a", None),
        ] {
            assert_eq!(number_end(text.as_bytes(), 0), end, "{text}");
        }
    }

    #[test]
    fn depth_limits_are_those_of_classify() {
        let text =
            r#"{"jsonrpc":"2.0","method":"action","params":{"action":{"type":"t","v":[[{}]]}}}"#;
        for max_depth in 0..8 {
            let limits = WireLimits {
                max_depth,
                ..WireLimits::default()
            };
            let fast = classify_notification(text, &limits);
            assert_eq!(fast.is_some(), max_depth >= 6, "max_depth {max_depth}");
            if let Some(fast) = fast {
                assert_eq!(classify(text, &limits), Ok(fast));
            } else {
                assert!(classify(text, &limits).is_err() || max_depth >= 6);
            }
        }
        let limits = WireLimits {
            max_frame_bytes: text.len() - 1,
            ..WireLimits::default()
        };
        assert!(classify_notification(text, &limits).is_none());
    }

    #[test]
    fn the_plain_head_reads_as_the_member_walk_does() {
        let head = r#"{"jsonrpc":"2.0","method":"action","params":"#;
        let params =
            r#"{"channel":"c","serverSeq":7,"action":{"type":"t"},"origin":{"clientId":"x"}}"#;
        let plain = format!("{head}{params}}}");
        let reordered = format!(r#"{{"params":{params},"method":"action","jsonrpc":"2.0"}}"#);
        let spaced = plain.replacen("params\":", "params\" :", 1);
        for text in [&plain, &reordered, &spaced] {
            assert!(agrees(text), "the fast path declined {text}");
        }
        for tail in [
            r#","jsonrpc":"2.0"}"#,
            r#","method":"action"}"#,
            r#","params":{}}"#,
            r#","id":1}"#,
            r#","result":{}}"#,
            r#","error":{}}"#,
            r#"}}"#,
            r#"} x"#,
            r#""#,
            r#",}"#,
        ] {
            let text = format!("{head}{params}{tail}");
            assert!(!agrees(&text), "the fast path took {text}");
        }
        assert!(agrees(&format!(
            r#"{head}{params},"extra":[1,"2",{{"3":null}}]}}"#
        )));
        assert!(agrees(&format!("{head}{params}}} \n")));
        assert!(!agrees(&format!("{head}[]}}")), "params must be an object");
    }

    #[test]
    fn routed_values_read_as_classify_reads_them() {
        let frame = |params: &str| {
            format!(r#"{{"jsonrpc":"2.0","method":"action","params":{{{params}}}}}"#)
        };
        for fine in [
            r#""serverSeq":18446744073709551615"#,
            r#""serverSeq":9999999999999999999"#,
            r#""serverSeq":0"#,
            r#""channel":"a\"b\u00e9""#,
            r#""action":{"type":"a\/b","k":1},"origin":{"clientId":"\u0041"}"#,
            r#""action":"not an object","origin":[{"clientId":1}]"#,
            r#""channel" : "c" , "serverSeq" : 1 , "action" : { "type" : "t" } "#,
        ] {
            assert!(agrees(&frame(fine)), "the fast path declined {fine}");
        }
        for other in [
            r#""serverSeq":18446744073709551616"#,
            r#""serverSeq":99999999999999999999"#,
            r#""serverSeq":00"#,
            r#""serverSeq":1e3"#,
            r#""serverSeq":"1""#,
            r#""channel":"\udc00""#,
            r#""action":{"type":1}"#,
            r#""action":{"type":"a","type":"b"}"#,
            r#""origin":{"clientId":null}"#,
            r#""origin":{"client\u0049d":"x"}"#,
            r#""chan\u006eel":"c""#,
        ] {
            assert!(!agrees(&frame(other)), "the fast path took {other}");
        }
    }

    #[test]
    fn corrupted_plain_frames_agree_under_every_depth_limit() {
        const SEED: &str = r#"{"jsonrpc":"2.0","method":"action","params":{"channel":"ahp-chat:/c-1","action":{"type":"chat/delta","v":[1,{"k":null}],"content":"a \"b\" — c\n"},"serverSeq":12345,"origin":{"clientId":"r1.Qm9i","clientSeq":3}}}"#;
        const PIECES: &[&str] = &[
            "\"",
            "\\",
            "\\u",
            "\\ud800",
            "{",
            "}",
            "[",
            "]",
            ",",
            ":",
            " ",
            "\u{1}",
            "0",
            "-",
            "e",
            "true",
            "é",
            "\"type\":",
            "\"id\":1,",
            "\"serverSeq\":",
            "99999999999999999999",
        ];
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut below = |n: usize| {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            (state.wrapping_mul(0x2545_f491_4f6c_dd1d) % n as u64) as usize
        };
        let mut taken = 0;
        for _ in 0..20_000 {
            let mut text = SEED.to_string();
            for _ in 0..=below(2) {
                let at = below(text.len());
                let end = (at + 1 + below(3)).min(text.len());
                if !(text.is_char_boundary(at) && text.is_char_boundary(end)) {
                    continue;
                }
                let piece = PIECES[below(PIECES.len())];
                match below(3) {
                    0 => text.insert_str(at, piece),
                    1 => text.replace_range(at..end, ""),
                    _ => text.replace_range(at..end, piece),
                }
            }
            for max_depth in [2, 3, 4, 5, 64] {
                let limits = WireLimits {
                    max_depth,
                    ..WireLimits::default()
                };
                if let Some(fast) = classify_notification(&text, &limits) {
                    taken += 1;
                    assert_eq!(classify(&text, &limits), Ok(fast), "{max_depth}: {text}");
                }
            }
        }
        assert!(taken > 5_000, "only {taken} corrupted frames were taken");
    }
}

//! JSON-RPC framing on the hot path (contract §2 "wire", §4.1, §4.5, §5.1–5.3).
//!
//! Every frame from a client or a host goes through [`classify`], which reads only what
//! routing needs — `jsonrpc`, `id`, `method`, `params.channel`, `params.serverSeq`,
//! `params.action` (and its `type`), `params.origin` (and its `clientId`),
//! `result.serverSeq`, `result.snapshot` and `result.snapshots[i]` (`fromSeq`,
//! `resource`) — and returns a [`Frame`] that borrows from the text: decoded values plus
//! the byte range of each ([`refusal()`] says how to answer a refused frame). The relay
//! then rewrites sequence numbers, channel URIs, ids
//! and origins with [`splice()`], which copies the untouched bytes and writes the
//! replacements in one pass. No `serde_json::Value` tree is built and nothing is
//! re-serialized, so action payloads and snapshot state (most of the bytes, and
//! `_meta`, which must round-trip verbatim) pass through byte-for-byte.
//!
//! # How a frame is read
//! 1. **Limits, before any parsing** ([`WireLimits`]): the length, then the nesting
//!    depth. The number of `{`/`[` bytes bounds the depth and `memchr` counts them fast;
//!    only if that count exceeds the limit does an exact scan run, skipping strings
//!    (escaped quotes included). serde_json skips ignored subtrees iteratively without a
//!    depth limit, so this scan is also what bounds later stages that parse subtrees.
//! 2. **One serde_json pass** with hand-written visitors (`raw.rs`): at each object level
//!    the relay reads (top, `params`, `result`, `result.snapshot`, `result.snapshots[i]`),
//!    keys are matched against a fixed list inside the key visitor (serde_json decodes
//!    escapes, so `"ser\u0076erSeq"` is `serverSeq`, without allocating); wanted values are
//!    taken as borrowed `&RawValue`, the exact slice of the frame, whose offset is a
//!    pointer difference (`fields.rs`, no `unsafe`); every other value is skipped with
//!    `IgnoredAny`, which validates it without building anything.
//! 3. **`params.action` and `params.origin`** are taken raw (the relay needs their whole
//!    range, to copy or replace them) and the one member wanted from each (`type`,
//!    `clientId`) is found by a byte scan of that already-validated slice (`scan.rs`),
//!    which also refuses a second occurrence of it. This scan only finds boundaries in
//!    text serde_json has accepted; it never decides validity.
//!
//! Strings without escapes are borrowed (`Cow::Borrowed`); with escapes they are decoded
//! (`Cow::Owned`). Ranges cover whole JSON tokens, a string's quotes included, so
//! [`EditValue::JsonString`] replaces a string value and keeps the frame valid.
//! Classifying allocates nothing for frames without escaped routed strings and without
//! `snapshots` arrays (serde_json may keep a small bracket stack for deep skipped
//! subtrees); splicing allocates the output once.
//!
//! # Why serde_json and not a hand-written scanner
//! Whether a frame is JSON is decided by the same parser the SDK and the simulated host
//! use. A hand-written validating scanner would be a second grammar (escapes, number
//! syntax, control characters, trailing bytes), and any disagreement between the relay's
//! reading of a frame and the host's is a place to smuggle a second meaning past routing
//! and policy. The price is measured by `benches/wire.rs`: on a 321-byte `chat/delta`
//! envelope classify+splice takes about 0.6–1 µs against 1.6–3 µs for a `Value` round
//! trip (1 allocation against 38), on a 1.9 KB snapshot response about 1.4 µs against
//! 6.8 µs (2 allocations against 162).
//!
//! One exception, for the frame that is nearly all of the traffic: a host's `action`
//! notification (and any other notification of a host, e.g. the `root/session*` every
//! link discards) goes first through [`classify_notification`] (`action.rs`), one walk that
//! checks the grammar, the limits and finds the routed values together, in about a sixth
//! of `classify`'s instructions (1.7k against ~10k on a `chat/delta`, `callgrind`). It is
//! bound by a strict rule: it returns a frame only when `classify` returns the same frame
//! for that text and limits, and declines everything else (then `classify` reads the
//! frame, and refuses it if it must). Client frames never take it. The rule is checked
//! over generated and mutated frames, by the `wire_host` fuzz target and by the replay of
//! its corpus in CI.
//!
//! A per-client link does not read the `root/session*` it discards at all (contract §6.2:
//! the watch link reads the same event): [`is_catalog_notification`] recognises them by
//! their head, with no backslash and no `"id"` anywhere, and promises that `classify`
//! would refuse such a text or read a notification whose method starts with
//! `root/session` — never anything a link acts on. Checked the same ways.
//!
//! # What is accepted and refused ([`WireError`], [`WireError::json_rpc_code`])
//! Refused: oversize and too-deep frames, invalid JSON (-32700), arrays (batches),
//! non-objects, `jsonrpc` other than `"2.0"`, non-string `method`, ids that are not a
//! string or a number (`null` only on error responses), member sets that are no JSON-RPC
//! message kind (all -32600), non-object `params` on requests and notifications, and
//! wrongly typed values the relay reads (-32602). A key the relay reads that occurs twice
//! at one level refuses the frame (-32600): the relay does not guess which one the host
//! would take. Duplicates of keys it does not read, and anything inside subtrees it skips,
//! are not checked for duplicates; no routing decision depends on them.
//! Accepted as is: ids of any JSON number form (echoed verbatim; only non-negative
//! integers have [`RawId::as_u64`]), and lone surrogate escapes (`"\ud83d"`) inside
//! skipped strings — serde_json's skipping accepts them, as `JSON.parse`-based hosts and
//! clients do. A routed string that contains one is refused (-32602), and so is a key
//! that contains one at a level `raw.rs` walks (-32700, serde_json's verdict).
//!
//! serde_json's `arbitrary_precision` feature must stay off: it would turn numbers into
//! maps under `deserialize_any`, which the shape visitors rely on. Its `float_roundtrip`
//! feature is on: an action whose names are translated is parsed into a `Value` and
//! written back, and a number beyond the integers (`418446744073079551616`) must come back
//! as the same number; without it serde_json's faster, inexact float parsing let two
//! readings of one number differ (found by the `wire_host` fuzz target, kept in its corpus
//! as `regression-float-roundtrip`).

mod action;
mod decimal;
mod error;
mod fields;
mod frame;
mod limits;
mod params;
mod raw;
mod refusal;
mod result;
mod scan;
mod splice;
mod text;

pub use action::{classify_host, classify_notification, is_catalog_notification};
pub use decimal::Decimal;
pub use error::{INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, PARSE_ERROR, WireError};
pub use fields::{IdKind, RawId, SeqField, StrField};
pub use frame::{Frame, FrameKind, classify};
pub use limits::WireLimits;
pub use params::ParamsFields;
pub use refusal::{Refusal, refusal};
pub use result::{ResultFields, SnapshotFields};
pub use splice::{
    Edit, EditValue, Out, Piece, SpliceError, json_escape_into, splice, splice_at, splice_into,
    splice_routed_at, splice_routed_into,
};
pub use text::{MAX_FRAME_HEADER, Text, frame_header, frame_header_len, put_frame_header};

#[cfg(test)]
mod tests;

//! Tests of the wire layer: classification cases, splicing, and generated frames.

mod classify;
mod generated;
mod refusal;
mod splice;

use std::ops::Range;

use serde_json::Value;

use super::{Frame, WireError, WireLimits, classify};

/// Classifies with default limits, failing the test on error.
fn ok(text: &str) -> Frame<'_> {
    match classify(text, &WireLimits::default()) {
        Ok(frame) => frame,
        Err(err) => panic!("{text}: unexpected {err:?}"),
    }
}

/// Classifies with default limits, failing the test on success.
fn err(text: &str) -> WireError {
    match classify(text, &WireLimits::default()) {
        Ok(frame) => panic!("{text}: unexpectedly accepted as {frame:?}"),
        Err(err) => err,
    }
}

/// The text of `range` in `text`.
fn at(text: &str, range: Range<usize>) -> &str {
    text.get(range).expect("range inside the frame")
}

/// Parses JSON text into a `Value` (test oracle only).
fn value(text: &str) -> Value {
    serde_json::from_str(text).expect("valid JSON")
}

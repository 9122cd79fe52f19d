//! How to answer a frame [`classify`](super::classify) refused (JSON-RPC 2.0 §5): with
//! which id, or not at all.

use super::WireError;
use super::fields::{IdKind, RawId};
use super::raw::{Shaped, TopRaw, parse, unique};

/// What the relay sends back for a refused frame; the code is
/// [`WireError::json_rpc_code`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal<'a> {
    /// Send an error response with this id (`None`: `"id": null`, used when the frame is
    /// not JSON, not an object, or its id cannot be read unambiguously).
    Answer {
        /// The request's id, exactly as sent.
        id: Option<RawId<'a>>,
    },
    /// Send nothing: the frame has a `method` and no `id` (a notification, e.g. a
    /// `dispatchAction`), or no `method` but a `result` or `error` (a response).
    Silent,
}

/// Decides how to answer `text`, which `classify` refused with `error`. Parses the frame
/// again (a refusal is the cold path), but never when `error` already shows it is not a
/// JSON object or is over a limit.
pub fn refusal<'a>(text: &'a str, error: &WireError) -> Refusal<'a> {
    let null = Refusal::Answer { id: None };
    if matches!(
        error,
        WireError::TooLarge { .. }
            | WireError::TooDeep { .. }
            | WireError::NotJson { .. }
            | WireError::Batch
            | WireError::NotObject
            | WireError::Internal
    ) {
        return null;
    }
    let Ok(Shaped::Object(top)) = parse::<TopRaw>(text) else {
        return null;
    };
    let is_request = top.method.is_some();
    if (is_request && top.id.is_none())
        || (!is_request && (top.result.is_some() || top.error.is_some()))
    {
        return Refusal::Silent;
    }
    let id = unique(top)
        .ok()
        .and_then(|top| top.id)
        .and_then(|raw| RawId::new(text, raw.get()).ok())
        .filter(|id| id.kind != IdKind::Null);
    Refusal::Answer { id }
}

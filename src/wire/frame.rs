//! [`classify`]: what kind of JSON-RPC message a frame is, and where the values the relay
//! routes on and rewrites lie.

use std::borrow::Cow;
use std::ops::Range;

use serde_json::value::RawValue;

use super::fields::{IdKind, RawId, decode_string, span};
use super::params::ParamsFields;
use super::raw::{Shaped, TopRaw, parse, unique};
use super::result::ResultFields;
use super::{WireError, WireLimits};

/// The JSON-RPC message kind, decided by which members are present (not by the id's
/// type: a request with a string id is a request, unlike the SDK's `JsonRpcMessage`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameKind<'a> {
    /// `method` and a non-null `id`; must be answered, echoing `id`.
    Request {
        /// The id, exactly as sent.
        id: RawId<'a>,
        /// The method name.
        method: Cow<'a, str>,
    },
    /// `method` and no `id`; never answered.
    Notification {
        /// The method name.
        method: Cow<'a, str>,
    },
    /// `result` and a non-null `id`.
    Response {
        /// The id of the request answered.
        id: RawId<'a>,
    },
    /// `error` (an object) and an `id`, which may be `null`.
    ErrorResponse {
        /// The id of the request answered, or `null`.
        id: RawId<'a>,
        /// Range of the whole `error` object.
        error: Range<usize>,
    },
}

/// A classified frame, borrowing from its text. Ranges are byte offsets into that text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame<'a> {
    /// Request, notification, response or error response.
    pub kind: FrameKind<'a>,
    /// Members of `params` (requests and notifications only).
    pub params: ParamsFields<'a>,
    /// Members of `result` (responses only).
    pub result: ResultFields<'a>,
}

impl<'a> Frame<'a> {
    /// The id of a request or response; `None` for notifications.
    pub fn id(&self) -> Option<&RawId<'a>> {
        match &self.kind {
            FrameKind::Request { id, .. }
            | FrameKind::Response { id }
            | FrameKind::ErrorResponse { id, .. } => Some(id),
            FrameKind::Notification { .. } => None,
        }
    }

    /// The method of a request or notification; `None` for responses.
    pub fn method(&self) -> Option<&str> {
        match &self.kind {
            FrameKind::Request { method, .. } | FrameKind::Notification { method } => Some(method),
            FrameKind::Response { .. } | FrameKind::ErrorResponse { .. } => None,
        }
    }

    /// The decoded `params.channel`, if present.
    pub fn channel(&self) -> Option<&str> {
        self.params.channel.as_ref().map(|channel| &*channel.value)
    }
}

/// Classifies one text frame without building a JSON tree.
///
/// Guarantees, when it returns `Ok`: the frame is at most `limits.max_frame_bytes` long,
/// nests at most `limits.max_depth` deep, is valid JSON (serde_json's grammar), is an
/// object with `"jsonrpc": "2.0"`, is exactly one of the [`FrameKind`]s, and no key the
/// relay reads occurs twice at a level it reads (keys are compared after unescaping).
/// Keys in subtrees it skips are not checked for duplicates. Every returned range lies
/// on character boundaries of `text` and covers one whole JSON value.
pub fn classify<'a>(text: &'a str, limits: &WireLimits) -> Result<Frame<'a>, WireError> {
    limits.check(text)?;
    let top = match parse::<TopRaw>(text).map_err(|err| WireError::not_json(&err))? {
        Shaped::Object(top) => unique(top)?,
        Shaped::Array => return Err(WireError::Batch),
        Shaped::Scalar => return Err(WireError::NotObject),
    };
    if top
        .jsonrpc
        .and_then(|raw| decode_string(raw.get()))
        .as_deref()
        != Some("2.0")
    {
        return Err(WireError::BadVersion);
    }
    let id = top.id.map(|raw| RawId::new(text, raw.get())).transpose()?;
    let kind = match (top.method, top.result.is_some(), top.error) {
        (Some(method), false, None) => {
            let method = decode_string(method.get()).ok_or(WireError::MethodNotString)?;
            match id {
                None => FrameKind::Notification { method },
                Some(id) if id.kind == IdKind::Null => return Err(WireError::BadId),
                Some(id) => FrameKind::Request { id, method },
            }
        }
        (Some(_), _, _) => return Err(shape("a request cannot carry `result` or `error`")),
        (None, true, Some(_)) => {
            return Err(shape("a response cannot carry both `result` and `error`"));
        }
        (None, true, None) => match id {
            Some(id) if id.kind != IdKind::Null => FrameKind::Response { id },
            Some(_) => return Err(WireError::BadId),
            None => return Err(shape("a response needs an `id`")),
        },
        (None, false, Some(error)) => FrameKind::ErrorResponse {
            id: id.ok_or(shape("an error response needs an `id`"))?,
            error: error_object(text, error)?,
        },
        (None, false, None) => return Err(shape("no `method`, `result` or `error`")),
    };
    let (params, result) = match kind {
        FrameKind::Request { .. } | FrameKind::Notification { .. } => (
            ParamsFields::read(text, top.params)?,
            ResultFields::default(),
        ),
        FrameKind::Response { .. } => (
            ParamsFields::default(),
            ResultFields::read(text, top.result)?,
        ),
        FrameKind::ErrorResponse { .. } => (ParamsFields::default(), ResultFields::default()),
    };
    Ok(Frame {
        kind,
        params,
        result,
    })
}

/// A [`WireError::BadShape`] with `reason`.
fn shape(reason: &'static str) -> WireError {
    WireError::BadShape { reason }
}

/// Range of the `error` member, which must be an object.
fn error_object(text: &str, error: &RawValue) -> Result<Range<usize>, WireError> {
    if error.get().starts_with('{') {
        span(text, error.get())
    } else {
        Err(shape("`error` must be an object"))
    }
}

//! The members of `params` the relay reads on requests and notifications.

use std::ops::Range;

use super::WireError;
use super::fields::{SeqField, StrField, span};
use super::raw::{ParamsRaw, Shaped, unique};
use super::scan::member;

/// What [`classify`](super::classify) read from `params`. Empty when the frame has no
/// `params`, or is a response. Every range is a byte range of the frame.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParamsFields<'a> {
    /// `params.channel`; a present non-string channel refuses the frame.
    pub channel: Option<StrField<'a>>,
    /// `params.serverSeq` (on `action` envelopes).
    pub server_seq: Option<SeqField>,
    /// Range of the whole `params.action` value, whatever its type.
    pub action: Option<Range<usize>>,
    /// `params.action.type`, when `action` is an object that has one.
    pub action_type: Option<StrField<'a>>,
    /// Range of the whole `params.origin` value, whatever its type.
    pub origin: Option<Range<usize>>,
    /// `params.origin.clientId`, when `origin` has one.
    pub origin_client_id: Option<StrField<'a>>,
}

impl<'a> ParamsFields<'a> {
    /// Interprets the raw `params` of a request or notification; `None` means absent.
    pub(super) fn read(
        text: &'a str,
        raw: Option<Shaped<ParamsRaw<'a>>>,
    ) -> Result<Self, WireError> {
        let params = match raw {
            None => return Ok(Self::default()),
            Some(Shaped::Object(params)) => unique(params)?,
            Some(Shaped::Array | Shaped::Scalar) => return Err(WireError::ParamsNotObject),
        };
        let mut fields = Self {
            channel: params
                .channel
                .map(|raw| StrField::new(text, raw.get(), "params.channel"))
                .transpose()?,
            server_seq: params
                .server_seq
                .map(|raw| SeqField::new(text, raw.get(), "params.serverSeq"))
                .transpose()?,
            ..Self::default()
        };
        if let Some(raw) = params.action {
            fields.action = Some(span(text, raw.get())?);
            fields.action_type = member(raw.get(), "type")?
                .map(|token| StrField::new(text, token, "params.action.type"))
                .transpose()?;
        }
        if let Some(raw) = params.origin {
            fields.origin = Some(span(text, raw.get())?);
            fields.origin_client_id = member(raw.get(), "clientId")?
                .map(|token| StrField::new(text, token, "params.origin.clientId"))
                .transpose()?;
        }
        Ok(fields)
    }
}

//! Why a frame was refused, and the JSON-RPC code the relay answers with.

/// JSON-RPC 2.0 "Parse error".
pub const PARSE_ERROR: i32 = -32700;
/// JSON-RPC 2.0 "Invalid Request".
pub const INVALID_REQUEST: i32 = -32600;
/// JSON-RPC 2.0 "Invalid params".
pub const INVALID_PARAMS: i32 = -32602;
/// JSON-RPC 2.0 "Internal error".
pub const INTERNAL_ERROR: i32 = -32603;

/// A frame that [`classify`](super::classify) refuses.
///
/// The message never contains frame content (only key names, limits and
/// positions), so it is safe to log (contract §7.5).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The frame is longer than `WireLimits::max_frame_bytes`; checked before anything else.
    /// The edge normally closes the socket with 1009 before the wire layer sees such a frame.
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// Length of the frame in bytes.
        len: usize,
        /// The configured limit.
        max: usize,
    },
    /// Objects and arrays nest deeper than `WireLimits::max_depth`; checked before parsing.
    #[error("JSON nesting deeper than {max}")]
    TooDeep {
        /// The configured limit.
        max: usize,
    },
    /// The frame is not valid JSON (serde_json's verdict); position only, no content.
    #[error("not valid JSON (line {line}, column {column})")]
    NotJson {
        /// 1-based line of the first error.
        line: usize,
        /// 1-based column of the first error.
        column: usize,
    },
    /// The frame is a JSON array: JSON-RPC batches are not supported by AHP or the relay.
    #[error("batch requests are not supported")]
    Batch,
    /// The frame is valid JSON but not an object.
    #[error("a frame must be a JSON object")]
    NotObject,
    /// `jsonrpc` is missing or is not the string `"2.0"`.
    #[error("`jsonrpc` must be \"2.0\"")]
    BadVersion,
    /// A key the relay reads occurs twice in the same object; the frame is refused rather
    /// than guessing which occurrence the host would use.
    #[error("duplicate key `{key}`")]
    DuplicateKey {
        /// The duplicated key (decoded).
        key: &'static str,
    },
    /// `method` is present but is not a string.
    #[error("`method` must be a string")]
    MethodNotString,
    /// `id` is not a string or a number (or is `null` outside an error response).
    #[error("`id` must be a string or a number")]
    BadId,
    /// The members do not make a request, notification, response or error response.
    #[error("not a JSON-RPC message: {reason}")]
    BadShape {
        /// What is wrong, in a few words.
        reason: &'static str,
    },
    /// `params` is present on a request or notification but is not an object.
    #[error("`params` must be an object")]
    ParamsNotObject,
    /// A value the relay reads has the wrong type (for example `params.channel` is not a
    /// string, or `serverSeq` is not a non-negative integer).
    #[error("`{field}` must be {expected}")]
    BadField {
        /// Path of the field, for example `params.serverSeq`.
        field: &'static str,
        /// What it must be.
        expected: &'static str,
    },
    /// The wire layer could not locate a value it had parsed (outside the frame, or a
    /// validated object it could not walk). Cannot happen; reported instead of panicking.
    #[error("internal error locating a value in the frame")]
    Internal,
}

impl WireError {
    /// The JSON-RPC error code the relay answers a request refused with this error:
    /// -32700 for [`NotJson`](Self::NotJson), -32602 for [`ParamsNotObject`](Self::ParamsNotObject)
    /// and [`BadField`](Self::BadField), -32603 for [`Internal`](Self::Internal),
    /// and -32600 for everything else.
    pub fn json_rpc_code(&self) -> i32 {
        match self {
            Self::NotJson { .. } => PARSE_ERROR,
            Self::ParamsNotObject | Self::BadField { .. } => INVALID_PARAMS,
            Self::Internal => INTERNAL_ERROR,
            Self::TooLarge { .. }
            | Self::TooDeep { .. }
            | Self::Batch
            | Self::NotObject
            | Self::BadVersion
            | Self::DuplicateKey { .. }
            | Self::MethodNotString
            | Self::BadId
            | Self::BadShape { .. } => INVALID_REQUEST,
        }
    }

    /// A short, bounded label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Self::TooLarge { .. } => "too_large",
            Self::TooDeep { .. } => "too_deep",
            Self::NotJson { .. } => "not_json",
            Self::Batch => "batch",
            Self::NotObject => "not_object",
            Self::BadVersion => "bad_version",
            Self::DuplicateKey { .. } => "duplicate_key",
            Self::MethodNotString => "method_not_string",
            Self::BadId => "bad_id",
            Self::BadShape { .. } => "bad_shape",
            Self::ParamsNotObject => "params_not_object",
            Self::BadField { .. } => "bad_field",
            Self::Internal => "internal",
        }
    }

    /// Maps a serde_json failure to [`NotJson`](Self::NotJson), keeping only its position.
    pub(super) fn not_json(err: &serde_json::Error) -> Self {
        Self::NotJson {
            line: err.line(),
            column: err.column(),
        }
    }
}

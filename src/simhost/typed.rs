//! Building wire types from compact `json!` literals, checked against the
//! official `ahp-types` definitions.
//!
//! The host writes actions and states as JSON literals (short and close to
//! the spec's examples) and converts them here. A literal that does not match
//! the type — or an action that would only parse as `StateAction::Unknown` —
//! is a bug in the host; it is logged and dropped rather than sent, and the
//! unit tests build every literal the host uses.

use ahp_types::actions::StateAction;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// `value` as a `T`, or `None` (logged) when it does not match the type.
pub fn typed<T: DeserializeOwned>(value: Value) -> Option<T> {
    match serde_json::from_value(value) {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::error!(error = %e, ty = std::any::type_name::<T>(), "simhost built an ill-typed value");
            None
        }
    }
}

/// `value` as a known `StateAction`; unknown action types are refused.
pub fn typed_action(value: Value) -> Option<StateAction> {
    match typed::<StateAction>(value)? {
        StateAction::Unknown(v) => {
            tracing::error!(action = %v, "simhost built an action of unknown type");
            None
        }
        known => Some(known),
    }
}

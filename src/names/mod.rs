//! The client-facing namespace (contract §4.2–4.3): how host URIs are
//! qualified, which client-chosen URIs the durable store holds, and the one
//! rewrite table of every name-bearing field, and the bounded note of host
//! objects a client was shown (`seen`). Pure functions, the store and that
//! note: nothing here routes a request or knows a session.

pub mod client_uri;
pub mod index;
pub mod namer;
pub mod open;
pub mod pg;
pub mod qualify;
pub mod seen;
pub mod store;
pub mod translate;

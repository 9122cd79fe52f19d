//! Names and routing: the client-facing namespace over many hosts, the URI
//! store, and the rewrite table that translates every name-bearing field.

pub mod catalog;
pub mod client_uri;
pub mod namer;
pub mod names;
pub mod root;
pub mod store;
pub mod translate;

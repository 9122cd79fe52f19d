//! `ahp-relay client`: a small command-line AHP client built on the official
//! `ahp` SDK (`ahp::Client` over an `ahp_ws::WebSocketTransport`).
//!
//! - [`crate::upstream::dial`] opens `ws://` / `wss://` connections with an optional bearer
//!   token and a configurable TLS trust policy; project tests use it too.
//! - [`cli`] holds the clap arguments and the `sessions`, `tail` and `send`
//!   commands.

pub mod cli;

mod chat;
mod format;
mod ids;

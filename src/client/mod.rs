//! `ahp-relay client`: a command-line AHP client built on the official
//! `ahp` SDK (`ahp::Client` over an `ahp_ws::WebSocketTransport`), enough
//! for a day's work through the relay.
//!
//! - [`cli`]: the clap arguments, the errors and the dispatch to commands;
//! - `conn`: one connection — dial ([`crate::upstream::dial`]), then
//!   `reconnect` to this user's retained session or `initialize` — and the
//!   output helpers;
//! - `store`: the stable `clientId` per user and relay in the config directory;
//! - `objects`: sessions (`--chats`), providers, create and dispose;
//! - `turns`: `tail`, `send`, `cancel`, `approve`, `deny`;
//! - `files`: `ls`, `cat`, `put` through `resource*`;
//! - `terminal`: attach stdin/stdout to a host's terminal, or create one;
//! - `hints`: the `hint:` line under an error;
//! - `chat`, `format`, `ids`: chat-channel logic, tables, ids.

pub mod cli;

mod chat;
mod conn;
mod files;
mod format;
mod hints;
mod ids;
mod objects;
mod store;
mod terminal;
mod turns;

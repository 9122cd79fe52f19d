//! A simulated AHP v1.0.0 host that follows the specification.
//!
//! It is the peer of every integration test, the embedded default of
//! `ahp-relay demo` and the load source of the benchmarks — a real host in
//! our code, not a mock returning canned bytes:
//!
//! - channels `ahp-root://`, `ahp-session:/…`, `ahp-chat:/…`, `ahp-terminal:/…`,
//!   `ahp-resource-watch:/…`
//!   with state kept by the official `ahp` reducers ([`state`]);
//! - one host-wide, strictly increasing `serverSeq`, a replay log of the last
//!   N envelopes (rejected ones included) and the replay-or-snapshot rules of
//!   the seed study §5.5–5.6 ([`core`]);
//! - validation of dispatched actions per the spec's table ([`validate`]);
//! - a scripted streaming agent with optional tool confirmation and queued
//!   messages ([`agent`]);
//! - client-contributed tools: calls owned by an active client, failed when
//!   the contributor goes away for longer than a grace ([`client_tools`]);
//! - VS Code's naming and root config under `vscode_compat` ([`naming`]);
//! - `file:` resources in a sandbox folder, resource watches and content
//!   references ([`files`], [`resources`]);
//! - protected resources and `authenticate` ([`auth`]);
//! - a streaming load mode for benchmarks ([`stream`]);
//! - fault switches, restart and a record of every received frame for tests
//!   ([`server::SimHost`]).
//!
//! Decisions where the spec is silent are documented in `src/simhost/README.md`.

pub mod agent;
pub mod auth;
pub mod client_tools;
pub mod clock;
pub mod commands;
pub mod config;
pub mod conn;
pub mod core;
pub mod dispatch;
pub mod files;
pub mod naming;
pub mod record;
pub mod resources;
pub mod server;
pub mod state;
pub mod stream;
pub mod typed;
pub mod validate;

pub use config::{AgentScript, HostProtocol, SimHostConfig};
pub use record::FrameRecord;
pub use server::SimHost;

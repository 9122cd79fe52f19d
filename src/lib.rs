//! ahp-relay: one wss endpoint for many Agent Host Protocol hosts.
//!
//! See `README.md` for what the relay promises and how to run it.

#![deny(missing_docs)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod auth;
pub mod cli;
pub mod client;
pub mod config;
pub mod devkit;
pub mod edge;
pub mod identity;
pub mod metrics;
pub mod names;
pub mod net;
pub mod otel;
pub mod policy;
pub mod relay;
pub mod route;
pub mod rpc;
pub mod run;
pub mod session;
pub mod simhost;
pub mod upstream;
pub mod wire;

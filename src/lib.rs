//! ahp-relay: one wss endpoint for many Agent Host Protocol hosts.
//!
//! See `README.md` for what the relay promises and how to run it.

pub mod cli;
pub mod client;
pub mod route;
pub mod simhost;

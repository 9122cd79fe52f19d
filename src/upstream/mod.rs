//! Upstream: per host, a watch link (root mirror, session catalog, health)
//! and, per client session, lazily opened links.

pub mod dial;
pub mod dial_in;
pub mod frames;
pub mod hub;
pub mod link;
pub mod version;
pub mod watch;

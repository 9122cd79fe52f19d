//! The edge: TLS, HTTP/1.1, the WebSocket upgrade with authentication
//! before any byte reaches a host, health and metrics endpoints, and the
//! client socket loop.

pub mod limiter;
pub mod server;
pub mod tls;
pub mod ws;

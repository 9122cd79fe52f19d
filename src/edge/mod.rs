//! The edge: TLS, HTTP/1.1, the WebSocket upgrade with authentication
//! before any byte reaches a host, the admin listener (health, readiness,
//! metrics, the status page), and the client socket loop. Cross-cutting concerns are tower
//! layers (`layers`); everything the edge uses of the relay goes through
//! `port`.

pub mod admin;
pub mod connectors;
pub mod history;
pub mod layers;
pub mod limiter;
pub mod origin;
pub mod pending;
pub mod pool;
pub mod port;
pub mod proxy;
pub mod server;
pub mod slice;
pub mod socket;
pub mod standing;
pub mod status;
pub mod tls;
pub mod upgrade;
pub mod ws;

//! The `ahp-relay` command line: one binary, one subcommand per job.

pub mod demo;
pub mod serve;
pub mod simhost;
pub mod token;

use clap::{Parser, Subcommand};

/// One wss endpoint for many Agent Host Protocol hosts.
#[derive(Parser)]
#[command(name = "ahp-relay", version, about)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand)]
pub enum Command {
    /// The relay in front of simulated hosts on loopback, with a dev token.
    Demo(demo::DemoArgs),
    /// Run the relay from a configuration file.
    Serve(serve::ServeArgs),
    /// Validate a configuration file.
    CheckConfig(serve::CheckArgs),
    /// Mint an HS256 token with a key file.
    Token(token::TokenArgs),
    /// Run a simulated AHP host (for demos, tests and benchmarks).
    Simhost(simhost::SimHostArgs),
    /// A small AHP client: list sessions, tail a chat, send a message.
    Client(crate::client::cli::ClientArgs),
}

/// Sets up logging to stderr; `RUST_LOG` overrides the default level.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour only on a terminal: container and file logs stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

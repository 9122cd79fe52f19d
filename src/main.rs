//! The `ahp-relay` binary: parses the command line and runs a subcommand.

use std::process::ExitCode;

use ahp_relay::cli::{self, Cli, Command};
use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    cli::init_tracing();
    match cli.command {
        Command::Simhost(args) => cli::simhost::run(args).await,
        Command::Client(args) => ahp_relay::client::cli::run(args).await,
    }
}

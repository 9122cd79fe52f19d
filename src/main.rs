//! The `ahp-relay` binary: parses the command line and runs a subcommand.

use std::process::ExitCode;

use ahp_relay::cli::{self, Cli, Command};
use clap::Parser;

/// mimalloc instead of the system allocator: per-frame buffers on the relay
/// path come and go at a high rate, and glibc's per-thread arenas grow and
/// shrink with `mprotect` under that churn (BENCHMARKS.md: 16 % less CPU per
/// relayed action in the same run).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    cli::init_tracing(cli.log_format());
    match cli.command {
        Command::Demo(args) => cli::demo::run(args).await,
        Command::Serve(args) => cli::serve::run(args).await,
        Command::CheckConfig(args) => cli::serve::check(args),
        Command::Token(args) => cli::token::run(args),
        Command::Simhost(args) => cli::simhost::run(args).await,
        Command::Client(args) => ahp_relay::client::cli::run(args).await,
    }
}

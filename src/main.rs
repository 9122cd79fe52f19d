//! The `ahp-relay` binary: parses the command line and runs a subcommand.

use std::process::ExitCode;

use ahp_relay::cli::{self, Cli, Command};
use clap::Parser;

/// mimalloc instead of the system allocator: per-frame buffers on the relay
/// path come and go at a high rate, and glibc's per-thread arenas grow and
/// shrink with `mprotect` under that churn (BENCHMARKS.md: 16 % less CPU per
/// relayed action in the same run). Built without transparent huge pages
/// (`no_thp`), see [`no_huge_pages`].
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Collects the calling thread's pending frees in mimalloc (blocks it
/// allocated that other threads freed), so pages freed entirely return to
/// the OS after mimalloc's purge delay.
fn collect_frees() {
    // SAFETY: `mi_collect` takes no pointer and may be called from any
    // thread at any time; it only affects the calling thread's heap.
    unsafe { libmimalloc_sys::mi_collect(false) }
}

#[tokio::main]
async fn main() -> ExitCode {
    no_huge_pages();
    ahp_relay::session::on_tidy(collect_frees);
    let cli = Cli::parse();
    cli::init_tracing(cli.log_format(), cli.replica().as_deref());
    match cli.command {
        Command::Demo(args) => cli::demo::run(args).await,
        Command::Serve(args) => cli::serve::run(args).await,
        Command::CheckConfig(args) => cli::serve::check(args),
        Command::Policy(args) => cli::policy::run(args),
        Command::Token(args) => cli::token::run(args),
        Command::Cert(args) => cli::cert::run(args),
        Command::Simhost(args) => cli::simhost::run(args).await,
        Command::Client(args) => ahp_relay::client::cli::run(args).await,
        Command::Connect(args) => cli::connect::run(args).await,
    }
}

/// Turns transparent huge pages off for this process. The relay's memory
/// churns (replay buffers and frame bodies come and go with sessions), and
/// with THP every region the allocator returns and takes again is faulted
/// back as a 2 MiB page the kernel zeroes whole: that was 16 % of the
/// relay's CPU at max rate (BENCHMARKS.md). A kernel without the setting
/// leaves things as they were.
fn no_huge_pages() {
    #[cfg(target_os = "linux")]
    if let Err(e) = nix::sys::prctl::set_thp_disable(true) {
        eprintln!("ahp-relay: could not turn transparent huge pages off: {e}");
    }
}

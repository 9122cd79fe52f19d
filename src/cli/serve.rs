//! `ahp-relay serve --config FILE` and `ahp-relay check-config FILE`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::{LogFormat, announce, fail};
use crate::config::RelayConfig;

/// Flags of `serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// The TOML configuration (see config/relay.example.toml).
    #[arg(long)]
    pub config: PathBuf,
    /// Log lines as human-readable `text` or one JSON object per line.
    #[arg(long, value_enum, default_value_t)]
    pub log_format: LogFormat,
}

/// Flags of `check-config`.
#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    /// The TOML configuration to validate.
    pub config: PathBuf,
    /// Check the document only (syntax, types, policy, hosts), not the
    /// files it names — for a configuration repository without the
    /// deployment's keys and secrets.
    #[arg(long)]
    pub document_only: bool,
}

/// Validates a configuration file and says what is wrong, with line and
/// column for syntax and type errors; then, unless `--document-only`, runs
/// the one gate `serve` runs before it binds (`run::preflight`: relay
/// secret, `[auth]` keys and deny list, TLS certificate, host credentials).
pub fn check(args: CheckArgs) -> ExitCode {
    let checked = RelayConfig::load(&args.config).map_err(|e| e.to_string());
    let checked = checked.and_then(|cfg| {
        if !args.document_only {
            crate::run::preflight(&cfg).map_err(|e| e.to_string())?;
        }
        Ok(cfg)
    });
    match checked {
        Ok(cfg) => {
            println!(
                "{}: ok ({} hosts, {} issuers, {} policy rules)",
                args.config.display(),
                cfg.hosts.len(),
                cfg.auth.issuers.len(),
                cfg.policy.rules.len()
            );
            if cfg.policy.rules.is_empty() {
                eprintln!(
                    "warning: [policy] has no rules: every principal is denied every host (default deny)"
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the relay until Ctrl-C or SIGTERM.
pub async fn run(args: ServeArgs) -> ExitCode {
    // Installed before the relay announces itself (see `shutdown_signal`).
    let shutdown = shutdown_signal();
    let format = args.log_format;
    let cfg = match RelayConfig::load(&args.config) {
        Ok(c) => c,
        Err(e) => {
            fail(format, &e.to_string());
            return ExitCode::FAILURE;
        }
    };
    let running = match crate::run::start(cfg).await {
        Ok(r) => r,
        Err(e) => {
            fail(format, &e.to_string());
            return ExitCode::FAILURE;
        }
    };
    announce(format, &format!("ahp-relay listening on {}", running.url()));
    shutdown.await;
    announce(format, "ahp-relay draining");
    running.drain().await;
    // Spans batched but not yet exported go out before the process ends.
    let _ = tokio::task::spawn_blocking(crate::otel::flush).await;
    ExitCode::SUCCESS
}

/// A future resolving on Ctrl-C or (on Unix) SIGTERM, with both handlers
/// installed before it returns: a signal that arrives before the future is
/// first awaited is not lost (nor does it kill the process with its default
/// action).
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let term = signal(SignalKind::terminate());
        let int = signal(SignalKind::interrupt());
        async move {
            match (term, int) {
                (Ok(mut term), Ok(mut int)) => {
                    tokio::select! {
                        _ = int.recv() => {}
                        _ = term.recv() => {}
                    }
                }
                _ => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

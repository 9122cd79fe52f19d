//! `ahp-relay token`: mints an HS256 token with a key file (the dev demo's,
//! or any `hs256` issuer's).
//!
//! It refuses to mint a token the relay would refuse for its lifetime: one
//! living longer than `auth.max_unrevocable_lifetime_secs` (read from
//! `--config`, else the default) without a `jti`; `--force` mints it anyway,
//! with a warning.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::auth::DEFAULT_MAX_UNREVOCABLE_LIFETIME_SECS;
use crate::auth::token::{MintRequest, mint_hs256, parse_ttl};

/// Flags of `token`.
#[derive(Debug, Clone, Args)]
pub struct TokenArgs {
    /// HS256 secret file (default: the demo's `AHP_RELAY_DEV_KEY`).
    #[arg(long, env = "AHP_RELAY_DEV_KEY")]
    pub key: PathBuf,
    /// Subject (`sub`).
    #[arg(long)]
    pub sub: String,
    /// Comma-separated groups.
    #[arg(long, value_delimiter = ',')]
    pub groups: Vec<String>,
    /// Lifetime, e.g. `90s`, `15m`, `1h`, `7d`.
    #[arg(long, default_value = "1h")]
    pub ttl: String,
    /// Token id (`jti`), required for lifetimes over the unrevocable limit.
    #[arg(long)]
    pub jti: Option<String>,
    /// Issuer (`iss`).
    #[arg(long, default_value = crate::devkit::DEV_ISSUER)]
    pub iss: String,
    /// Audience (`aud`).
    #[arg(long, default_value = crate::devkit::DEV_AUDIENCE)]
    pub aud: String,
    /// The relay's configuration, to check the token against its
    /// `auth.max_unrevocable_lifetime_secs` (default: the built-in limit).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Mint a token the relay would refuse (a warning is printed).
    #[arg(long)]
    pub force: bool,
}

/// Prints a token on stdout.
pub fn run(args: TokenArgs) -> ExitCode {
    let ttl = match parse_ttl(&args.ttl) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let limit = match unrevocable_limit(args.config.as_deref()) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.jti.is_none() && ttl.as_secs() > limit {
        let why = format!(
            "a token living {} without --jti is refused by the relay \
             (auth.max_unrevocable_lifetime_secs = {limit}): pass --jti ID to make it \
             revocable, or a --ttl of at most {limit}s",
            args.ttl
        );
        if !args.force {
            eprintln!("error: {why}; --force mints it anyway");
            return ExitCode::FAILURE;
        }
        eprintln!("warning: {why}");
    }
    let secret = match std::fs::read(&args.key) {
        Ok(s) => crate::auth::token::trim_newlines(s),
        Err(e) => {
            eprintln!("error: cannot read {}: {e}", args.key.display());
            return ExitCode::FAILURE;
        }
    };
    let req = MintRequest {
        issuer: args.iss,
        audience: args.aud,
        subject: args.sub,
        groups: args.groups,
        ttl,
        jti: args.jti,
    };
    match mint_hs256(&secret, &req, crate::identity::unix_now()) {
        Ok(t) => {
            println!("{t}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The relay's unrevocable-lifetime limit in seconds: `config`'s, else the default.
fn unrevocable_limit(config: Option<&std::path::Path>) -> Result<u64, String> {
    match config {
        None => Ok(DEFAULT_MAX_UNREVOCABLE_LIFETIME_SECS),
        Some(path) => crate::config::RelayConfig::load(path)
            .map(|cfg| cfg.auth.max_unrevocable_lifetime_secs)
            .map_err(|e| e.to_string()),
    }
}

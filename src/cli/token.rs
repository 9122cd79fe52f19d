//! `ahp-relay token`: mints an HS256 token with a key file (the dev demo's,
//! or any `hs256` issuer's).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

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

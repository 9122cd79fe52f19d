//! `ahp-relay policy explain`: what a principal holds on each configured
//! host and which rules grant it — the operator's `kubectl auth can-i`.
//! It reads the same validated configuration `serve` would run with, and
//! asks the same [`RulePolicy`] the relay asks, so its answer is the
//! relay's decision, not a second reading of the rules.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};

use crate::config::RelayConfig;
use crate::identity::PrincipalKey;
use crate::policy::rules::RuleMatch;
use crate::policy::{
    Grant, HostRef, PermSet, Permission, Policy, Role, RulePolicy, Subject, Visibility,
};

/// `ahp-relay policy …`.
#[derive(Debug, Clone, Args)]
pub struct PolicyArgs {
    #[command(subcommand)]
    command: PolicyCommand,
}

#[derive(Debug, Clone, Subcommand)]
enum PolicyCommand {
    /// The effective role, permissions, visibility and file scope of a
    /// principal on every configured host, and the rules that grant them
    /// (rules add up).
    Explain(ExplainArgs),
}

/// Flags of `policy explain`.
#[derive(Debug, Clone, Args)]
pub struct ExplainArgs {
    /// The token subject (`sub`).
    #[arg(long)]
    sub: String,
    /// The token issuer (`iss`); may be left out when one issuer is configured.
    #[arg(long)]
    iss: Option<String>,
    /// The token's groups, comma-separated.
    #[arg(long, value_delimiter = ',')]
    groups: Vec<String>,
    /// The relay configuration (default: `$AHP_RELAY_CONFIG`).
    #[arg(long, env = "AHP_RELAY_CONFIG")]
    config: PathBuf,
}

/// Runs `policy …`.
pub fn run(args: PolicyArgs) -> ExitCode {
    let PolicyCommand::Explain(args) = args.command;
    match explain(&args) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The explanation `policy explain` prints for `args`.
pub fn explain(args: &ExplainArgs) -> Result<String, String> {
    let cfg = RelayConfig::load(&args.config).map_err(|e| e.to_string())?;
    let issuers: Vec<&str> = cfg.auth.issuers.iter().map(|i| i.issuer.as_str()).collect();
    let issuer = match (&args.iss, issuers.as_slice()) {
        (Some(i), _) if issuers.contains(&i.as_str()) => i.clone(),
        (Some(i), _) => return Err(format!("{i:?} is not a configured issuer: {issuers:?}")),
        (None, [one]) => one.to_string(),
        (None, _) => return Err(format!("give --iss, one of {issuers:?}")),
    };
    let principal = PrincipalKey {
        issuer,
        subject: args.sub.clone(),
    };
    let who = Subject {
        principal: &principal,
        groups: &args.groups,
    };
    let policy = RulePolicy::new(&cfg.policy);
    let mut out = format!(
        "principal: iss={} sub={} groups=[{}]\n",
        principal.issuer,
        principal.subject,
        args.groups.join(",")
    );
    let mut any = false;
    for host in &cfg.hosts {
        let host = HostRef {
            id: &host.id,
            label: host.label.as_deref(),
        };
        any |= describe_host(&mut out, &policy, who, host);
    }
    if !any {
        out.push_str(
            "no rule matches this principal on any host: it sees nothing (default deny)\n",
        );
    }
    Ok(out)
}

/// Appends one host's lines; returns whether the principal sees it.
fn describe_host(
    out: &mut String,
    policy: &RulePolicy,
    who: Subject<'_>,
    host: HostRef<'_>,
) -> bool {
    let label = host
        .label
        .map(|l| format!(" (label {l})"))
        .unwrap_or_default();
    let Some(grant) = policy.grant(who, host) else {
        let _ = writeln!(out, "host {}{label}: invisible (no rule matches)", host.id);
        return false;
    };
    let _ = writeln!(out, "host {}{label}: {}", host.id, summary(&grant));
    for m in policy.explain(who, host) {
        let _ = writeln!(out, "  + {}", contribution(&m));
    }
    true
}

/// What a grant allows, in one line.
fn summary(g: &Grant) -> String {
    format!(
        "{}; visibility {}; external sessions {}; dispose others' objects {}; files {}",
        perms(g.permissions),
        visibility(g.visibility),
        yes_no(g.external),
        yes_no(g.dispose_others),
        file_scope(g)
    )
}

/// Where the grant reaches files (contract §7.1): reads and writes on the
/// whole host, and what a `files = "session-dirs"` rule adds where the
/// host-wide permission is missing — reads in the working directories of
/// the sessions it sees, writes in those of the sessions it may operate.
fn file_scope(g: &Grant) -> String {
    let scoped = |p: Permission, via: Permission| {
        !g.permits(p) && g.session_files && g.permits(via) && g.permits(Permission::SessionsRead)
    };
    let mut parts = Vec::new();
    let host: Vec<&str> = [
        (Permission::FilesRead, "read"),
        (Permission::FilesWrite, "write"),
    ]
    .into_iter()
    .filter(|(p, _)| g.permits(*p))
    .map(|(_, n)| n)
    .collect();
    if !host.is_empty() {
        parts.push(format!("{} on the whole host", host.join("+")));
    }
    if scoped(Permission::FilesRead, Permission::SessionsRead) {
        parts.push("read in the working directories of sessions it sees".to_string());
    }
    if scoped(Permission::FilesWrite, Permission::SessionsOperate) {
        parts.push("write in the working directories of sessions it operates".to_string());
    }
    if parts.is_empty() {
        return "none".to_string();
    }
    parts.join(", ")
}

/// One rule's share of a grant, in one line.
fn contribution(m: &RuleMatch) -> String {
    let role = match m.role {
        Role::Viewer => "viewer",
        Role::Operator => "operator",
        Role::Admin => "admin",
    };
    let files = if m.session_files {
        "; files session-dirs"
    } else {
        ""
    };
    format!(
        "rule {} (matches {}, host {}): role {role}, {}; visibility {}; external sessions {}{files}",
        m.rule,
        m.by,
        m.on,
        perms(m.permissions),
        visibility(m.visibility),
        yes_no(m.external)
    )
}

fn perms(set: PermSet) -> String {
    let names: Vec<&str> = Permission::ALL
        .iter()
        .filter(|p| set.has(**p))
        .map(|p| p.name())
        .collect();
    names.join(" ")
}

fn visibility(v: Visibility) -> &'static str {
    match v {
        Visibility::Own => "own",
        Visibility::Group => "group",
        Visibility::All => "all",
    }
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

//! `ahp-relay simhost`: a simulated host, runnable alone.

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Args;

use crate::simhost::{AgentScript, SimHost, SimHostConfig};

/// Flags of `ahp-relay simhost`.
#[derive(Debug, Clone, Args)]
pub struct SimHostArgs {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:9001")]
    pub listen: SocketAddr,
    /// Host name (shown in agent and session titles).
    #[arg(long, default_value = "simhost")]
    pub name: String,
    /// Sessions present at start.
    #[arg(long, default_value_t = 3)]
    pub sessions: usize,
    /// Id prefix of the seeded session URIs (default: the name). Give two
    /// hosts the same prefix to make their URIs collide.
    #[arg(long)]
    pub session_prefix: Option<String>,
    /// Terminals present at start (`ahp-terminal:/1`…).
    #[arg(long, default_value_t = 0)]
    pub terminals: usize,
    /// Agent provider id.
    #[arg(long, default_value = "sim")]
    pub provider: String,
    /// Agent script flags.
    #[command(flatten)]
    pub script: ScriptArgs,
    /// Envelopes kept for reconnect replay.
    #[arg(long, default_value_t = 1000)]
    pub replay_log: usize,
    /// Behave like VS Code's host where hosts differ: sessions
    /// `<provider>:/<uuid>`, chats `ahp-chat://<chatId>/<b64url(session)>`, a
    /// root config clients change with root/configChanged; broadcast
    /// root/session*, root/progress and auth/required; overlapping
    /// connections per clientId.
    #[arg(long)]
    pub vscode_compat: bool,
    /// Seed of the VS Code-mode session uuids (default: derived from the
    /// session prefix). Two hosts with the same seed mint the same ids.
    #[arg(long)]
    pub id_seed: Option<u64>,
    /// Folder the host's file: resources live in (default: a fresh temporary
    /// folder, removed when the host exits — on SIGTERM and Ctrl-C too).
    /// Paths outside it are refused.
    #[arg(long)]
    pub sandbox: Option<std::path::PathBuf>,
    /// Keep the temporary sandbox folder after exit (for debugging).
    #[arg(long)]
    pub keep_sandbox: bool,
    /// A protected resource the agent declares (repeatable): turns need an
    /// `authenticate` for it on the connection first.
    #[arg(long = "protected-resource")]
    pub protected_resources: Vec<String>,
    /// Streaming load mode (a turn whose message holds `[stream:<n>]`):
    /// actions per second, 0 = as fast as the sockets take them.
    #[arg(long, default_value_t = 0)]
    pub stream_rate: u32,
}

/// The scripted agent's flags, shared with `ahp-relay demo`.
#[derive(Debug, Clone, Args)]
pub struct ScriptArgs {
    /// `chat/delta` actions per reply.
    #[arg(long, default_value_t = 8)]
    pub reply_deltas: u32,
    /// Bytes per delta.
    #[arg(long, default_value_t = 24)]
    pub delta_bytes: usize,
    /// Deltas per second (0 = as fast as possible).
    #[arg(long, default_value_t = 50)]
    pub delta_rate: u32,
    /// Each turn makes one tool call that waits for confirmation.
    #[arg(long, default_value = "false", action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub tool_confirmation: bool,
    /// Seeded random mode: turn shapes drawn from this seed.
    #[arg(long)]
    pub seed: Option<u64>,
}

impl From<&ScriptArgs> for AgentScript {
    fn from(a: &ScriptArgs) -> Self {
        Self {
            reply_deltas: a.reply_deltas,
            delta_bytes: a.delta_bytes,
            delta_rate: a.delta_rate,
            tool_confirmation: a.tool_confirmation,
            seed: a.seed,
        }
    }
}

impl SimHostArgs {
    /// The host configuration these flags describe.
    pub fn config(&self) -> SimHostConfig {
        SimHostConfig {
            name: self.name.clone(),
            provider: self.provider.clone(),
            sessions: self.sessions,
            terminals: self.terminals,
            session_prefix: self
                .session_prefix
                .clone()
                .unwrap_or_else(|| self.name.clone()),
            script: AgentScript::from(&self.script),
            replay_log: self.replay_log,
            vscode_compat: self.vscode_compat,
            id_seed: self.id_seed,
            sandbox: self.sandbox.clone(),
            keep_sandbox: self.keep_sandbox,
            protected_resources: self.protected_resources.clone(),
            stream_rate: self.stream_rate,
            ..SimHostConfig::default()
        }
    }
}

/// Runs a simulated host until Ctrl-C or SIGTERM; its temporary sandbox
/// goes with it unless `--keep-sandbox`.
pub async fn run(args: SimHostArgs) -> ExitCode {
    // Before anything is announced: a SIGTERM right after the announcement
    // must take the clean path, not the signal's default action.
    let shutdown = super::serve::shutdown_signal();
    let host = match SimHost::start(args.config(), args.listen).await {
        Ok(h) => h,
        Err(e) => {
            eprintln!("error: cannot listen on {}: {e}", args.listen);
            return ExitCode::FAILURE;
        }
    };
    println!("AHP_SIMHOST_URL={}", host.url());
    eprintln!(
        "simhost '{}' serving {} sessions at {} — try: ahp-relay client --url {} sessions",
        args.name,
        args.sessions,
        host.url(),
        host.url()
    );
    let sandbox = host.sandbox();
    eprintln!("file: resources live in {}", sandbox.display());
    shutdown.await;
    host.shutdown().await;
    // The folder is removed here, not left to a destructor: tasks still
    // winding down may hold the host's state past the end of `main`.
    if args.sandbox.is_none()
        && !args.keep_sandbox
        && let Err(e) = std::fs::remove_dir_all(&sandbox)
    {
        eprintln!(
            "warning: cannot remove the sandbox {}: {e}",
            sandbox.display()
        );
    }
    ExitCode::SUCCESS
}

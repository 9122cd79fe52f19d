//! `ahp-relay demo`: the relay in front of simulated hosts on loopback, with
//! a self-signed certificate and a printed dev token.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use super::simhost::ScriptArgs;
use crate::devkit::DevKit;
use crate::simhost::{AgentScript, SimHost, SimHostConfig};

/// Flags of `demo`.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Where the relay listens.
    #[arg(long, default_value = "127.0.0.1:8443")]
    pub listen: SocketAddr,
    /// Number of simulated hosts (1 to 26).
    #[arg(long, default_value_t = 3)]
    pub hosts: usize,
    /// Sessions per host.
    #[arg(long, default_value_t = 3)]
    pub sessions: usize,
    /// Agent script flags, passed to every host.
    #[command(flatten)]
    pub script: ScriptArgs,
    /// Every host names and behaves like VS Code's agent host
    /// (`ahp-relay simhost --vscode-compat`).
    #[arg(long)]
    pub vscode_compat: bool,
    /// Log lines as human-readable `text` or one JSON object per line.
    #[arg(long, value_enum, default_value_t)]
    pub log_format: super::LogFormat,
    /// Run the last host (`laptop`) as a host behind NAT: the relay has no
    /// URL for it, and a connector (`ahp-relay connect`, in-process) dials
    /// the relay for it (contract §13).
    #[arg(long)]
    pub dial_in: bool,
    /// Where to write the `export` lines of the variables (default: `env`
    /// in the demo's fresh temporary folder); the path is printed. Removed
    /// when the demo stops.
    #[arg(long, value_name = "FILE")]
    pub env_file: Option<std::path::PathBuf>,
}

/// The simulated hosts of the demo: names, providers and session prefixes.
/// `gpu1` and `laptop` share a prefix, so their session, chat and terminal
/// URIs collide as cloned hosts' do; the relay keeps them apart.
fn host_configs(
    n: usize,
    sessions: usize,
    script: &AgentScript,
    vscode_compat: bool,
) -> Vec<SimHostConfig> {
    let names = ["buildbox", "gpu1", "laptop"];
    let providers = ["copilot", "claude", "copilot"];
    (0..n.clamp(1, 26))
        .map(|i| {
            let name = names
                .get(i)
                .map_or_else(|| format!("host{i}"), |s| s.to_string());
            SimHostConfig {
                provider: providers.get(i).unwrap_or(&"sim").to_string(),
                session_prefix: if i == 1 || i == 2 {
                    "shared".into()
                } else {
                    name.clone()
                },
                sessions,
                terminals: 1,
                script: script.clone(),
                vscode_compat,
                ..SimHostConfig::named(&name)
            }
        })
        .collect()
}

/// Runs the demo until Ctrl-C.
pub async fn run(args: DemoArgs) -> ExitCode {
    let format = args.log_format;
    let ran = demo(args).await;
    // Spans batched but not yet exported go out before the process ends.
    let _ = tokio::task::spawn_blocking(crate::otel::flush).await;
    match ran {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            super::fail(format, &e);
            ExitCode::FAILURE
        }
    }
}

/// A 12-hour dev token for `sub` (group `dev`).
fn demo_token(kit: &DevKit, sub: &str, jti: &str) -> Result<String, String> {
    kit.token(sub, &["dev"], Duration::from_secs(12 * 3600), Some(jti))
        .map_err(|e| e.to_string())
}

/// Prints `vars` as `NAME=value` lines and writes them as `export` lines to
/// `env_file` — created anew, 0600 (it holds tokens): a file already
/// there (a demo that did not stop cleanly) is replaced, never written
/// through, so a symlink planted at the path cannot redirect it.
fn export(env_file: &std::path::Path, vars: &[(&str, String)]) -> Result<(), String> {
    let mut exports = String::new();
    for (name, value) in vars {
        println!("{name}={value}");
        exports.push_str(&format!("export {name}={value}\n"));
    }
    let _ = std::fs::remove_file(env_file);
    crate::run::write_private(env_file, exports.as_bytes())
        .map_err(|e| format!("cannot write {}: {e}", env_file.display()))
}

/// What to try next, printed after the variables.
fn print_usage(
    url: &str,
    host_count: usize,
    env_file: &std::path::Path,
    admin_url: &str,
    vscode_compat: bool,
) {
    println!();
    println!("ahp-relay demo: the relay at {url} in front of {host_count} simulated hosts.");
    print_hints(env_file, vscode_compat);
    println!(
        "Status page: {admin_url}status (log in with AHP_RELAY_ADMIN_TOKEN, an admin's token)."
    );
}

async fn demo(args: DemoArgs) -> Result<(), String> {
    // Installed before anything is announced (see `shutdown_signal`).
    let shutdown = super::serve::shutdown_signal();
    let script = AgentScript::from(&args.script);
    let mut hosts = Vec::new();
    for cfg in host_configs(args.hosts, args.sessions, &script, args.vscode_compat) {
        hosts.push(
            SimHost::start_local(cfg)
                .await
                .map_err(|e| format!("simhost: {e}"))?,
        );
    }
    let mut tag = [0u8; 6];
    crate::identity::random_fill(&mut tag).map_err(|e| e.to_string())?;
    let tag: String = tag.iter().map(|b| format!("{b:02x}")).collect();
    let dir = std::env::temp_dir().join(format!("ahp-relay-demo-{}-{tag}", std::process::id()));
    let kit = DevKit::create(&dir).map_err(|e| e.to_string())?;
    let mut pairs: Vec<(String, String)> = hosts
        .iter()
        .map(|h| (h.config().name.clone(), h.url()))
        .collect();
    let host_list: Vec<String> = pairs.iter().map(|(id, u)| format!("{id}={u}")).collect();
    let dial_in = if args.dial_in {
        pairs
            .pop()
            .map(|(id, to)| DialIn::new(&kit, id, to))
            .transpose()?
    } else {
        None
    };
    let extra = match &dial_in {
        Some(d) => format!("{}{}", d.table(), crate::devkit::DEMO_POLICY),
        None => crate::devkit::DEMO_POLICY.to_string(),
    };
    // A terminal a client opens without naming a host (most clients know
    // nothing of hosts) goes to the first host.
    let default_host = pairs
        .first()
        .map(|(id, _)| format!("default_host = \"{id}\""))
        .unwrap_or_default();
    let cfg = kit
        .config_with_relay(&args.listen.to_string(), &pairs, "", &default_host, &extra)
        .map_err(|e| e.to_string())?;
    let running = crate::run::start(cfg).await.map_err(|e| e.to_string())?;
    let url = format!("wss://localhost:{}/", running.addr.port());
    let connector = dial_in.as_ref().map(|d| d.start(&url, &kit.cert));
    let vars = [
        ("AHP_RELAY_URL", url.clone()),
        ("AHP_RELAY_TOKEN", demo_token(&kit, "alice", "demo-token")?),
        ("AHP_RELAY_CA", kit.cert.display().to_string()),
        ("AHP_RELAY_DEV_KEY", kit.dev_key.display().to_string()),
        ("AHP_RELAY_HOSTS", host_list.join(",")),
        (
            "AHP_RELAY_ADMIN_URL",
            format!("http://{}/", running.admin_addr()),
        ),
        (
            "AHP_RELAY_ADMIN_TOKEN",
            demo_token(&kit, "ops", "demo-admin-token")?,
        ),
    ];
    let env_file = args.env_file.clone().unwrap_or_else(|| kit.dir.join("env"));
    export(&env_file, &vars)?;
    print_usage(&url, hosts.len(), &env_file, &vars[5].1, args.vscode_compat);
    if let Some(d) = &dial_in {
        d.print(&url, &kit.cert);
    }
    println!("Press Ctrl-C to stop.");
    shutdown.await;
    if let Some(c) = connector {
        c.abort();
    }
    running.stop();
    for h in hosts {
        h.shutdown().await;
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&env_file);
    Ok(())
}

/// `--dial-in`: a demo host the relay does not dial; a connector in this
/// process dials the relay for it, as `ahp-relay connect` would next to a
/// laptop behind NAT.
struct DialIn {
    id: String,
    token: std::path::PathBuf,
    to: String,
}

impl DialIn {
    /// Host `id` at `to`, with a fresh random token in the demo's folder.
    fn new(kit: &DevKit, id: String, to: String) -> Result<Self, String> {
        let mut raw = [0u8; 24];
        crate::identity::random_fill(&mut raw).map_err(|e| e.to_string())?;
        let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        let token = kit.dir.join(format!("{id}.token"));
        crate::run::write_private(&token, format!("{hex}\n").as_bytes())
            .map_err(|e| format!("cannot write {}: {e}", token.display()))?;
        Ok(Self { id, token, to })
    }

    /// Its `[[hosts]]` table: no URL, the token file.
    fn table(&self) -> String {
        format!(
            "\n[[hosts]]\nid = \"{}\"\ndial_in = {{ token_file = \"{}\" }}\n",
            self.id,
            self.token.display()
        )
    }

    /// Runs its connector in this process against the relay at `url`.
    fn start(&self, url: &str, ca: &std::path::Path) -> tokio::task::JoinHandle<()> {
        let args = self.args(url, ca);
        tokio::spawn(async move {
            if let Err(e) = super::connect::connect(args).await {
                tracing::error!(error = %e, "the demo's connector stopped");
            }
        })
    }

    fn args(&self, url: &str, ca: &std::path::Path) -> super::connect::ConnectArgs {
        super::connect::ConnectArgs {
            relay: vec![url.to_string()],
            host_id: self.id.clone(),
            token_file: self.token.clone(),
            to: self.to.clone(),
            ca: Some(ca.to_path_buf()),
            to_token_file: None,
            to_query_token_file: None,
            to_cert: None,
            to_key: None,
            to_ca: None,
            status: false,
        }
    }

    /// Says which host dials in and the command that does it.
    fn print(&self, url: &str, ca: &std::path::Path) {
        println!(
            "{} dials in (the relay has no URL for it); its connector runs in this process, as would:",
            self.id
        );
        println!(
            "  ahp-relay connect --relay {url} --host-id {} --token-file {} --to {} --ca {}",
            self.id,
            self.token.display(),
            self.to,
            ca.display()
        );
    }
}

/// The commands to try next, printed once the demo runs. A VS Code-mode
/// host's chat URIs are long and derived, so no `client send` line then.
fn print_hints(env_file: &std::path::Path, vscode_compat: bool) {
    // The path of this binary: after `cargo run` it is not on PATH.
    let bin = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "ahp-relay".into());
    println!("In another terminal: source {} — then:", env_file.display());
    println!("  {bin} client sessions --chats");
    if !vscode_compat {
        println!("  {bin} client send ahp-chat:/buildbox~buildbox-1-main \"hello\" --wait");
    }
    println!(
        "Tenancy (README \"Multi-tenant setup\"): the token above is alice's (operator, sees all, \
         saves files in sessions' working directories)."
    );
    println!(
        "  AHP_RELAY_TOKEN=$({bin} token --sub bob) {bin} client sessions    # bob: only his own"
    );
    println!(
        "  AHP_RELAY_TOKEN=$({bin} token --sub carol) {bin} client sessions  # carol: buildbox, read-only"
    );
}

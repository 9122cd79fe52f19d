//! Starting a relay from a validated configuration: secret, URI store,
//! authenticator, watch links, fan-out and the listener.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::auth::Authenticator;
use crate::config::RelayConfig;
use crate::edge::server::Edge;
use crate::edge::tls::ReloadingCert;
use crate::relay::Relay;

/// Why a relay could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The relay secret could not be read or created.
    #[error("relay secret {path}: {reason}")]
    Secret {
        /// The secret file.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// The URI store could not be opened.
    #[error("URI store: {0}")]
    Store(String),
    /// Keys, certificates or hosts could not be loaded.
    #[error("{0}")]
    Load(String),
    /// The listener could not bind.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The error.
        source: std::io::Error,
    },
}

/// A running relay.
#[derive(Debug)]
pub struct RunningRelay {
    /// The address it listens on.
    pub addr: SocketAddr,
    /// Its shared state.
    pub relay: Arc<Relay>,
    /// Its edge (readiness switch).
    pub edge: Arc<Edge>,
    admin_addr: SocketAddr,
    tasks: Vec<JoinHandle<()>>,
}

impl RunningRelay {
    /// `wss://` (or `ws://` when plaintext) URL of the listener.
    pub fn url(&self) -> String {
        let scheme = if self.relay.cfg.listen.plaintext {
            "ws"
        } else {
            "wss"
        };
        format!("{scheme}://{}/", self.addr)
    }

    /// The address the admin listener (`/healthz`, `/readyz`, `/metrics`)
    /// is bound to.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// Drains the relay (contract §8.3): `/readyz` (admin listener) turns 503 and new
    /// upgrades get 503 at once; attached clients are closed with 1012,
    /// spread evenly over `drain_window_secs` so they do not all reconnect
    /// at the same moment; then every link and watch link closes.
    pub async fn drain(self) {
        self.edge
            .ready
            .store(false, std::sync::atomic::Ordering::Relaxed);
        let window = Duration::from_secs(self.relay.cfg.limits.drain_window_secs);
        let attached = self.relay.registry.attached_sessions();
        tracing::info!(clients = attached.len(), ?window, "draining");
        let step = window / u32::try_from(attached.len().max(1)).unwrap_or(u32::MAX);
        for s in attached {
            s.close(crate::rpc::Close::Restarting);
            self.relay.metrics.drain_closes.inc();
            tokio::time::sleep(step).await;
        }
        self.stop();
        // Let link tasks send their close frames before the process exits.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    /// Stops accepting and stops the watch links.
    pub fn stop(self) {
        for t in self.tasks {
            t.abort();
        }
        self.relay.stop_watch_links();
        self.relay.registry.stop_sessions();
    }
}

/// Known example relay secrets (the deploy manifests' placeholder): anyone
/// can read them, so a relay keyed with one has forgeable cursors.
const EXAMPLE_SECRETS: &[&[u8]] = &[b"replace-me-with-32-random-bytes-000000"];

/// Least estimated entropy, in bits, of an existing relay secret.
pub const MIN_SECRET_BITS: f64 = 128.0;

/// Reads the relay secret, or creates it (32 random bytes, mode 0600). An
/// existing secret is refused when shorter than 32 bytes, a known example
/// or placeholder value, or of less than [`MIN_SECRET_BITS`] estimated
/// entropy (e.g. one repeated character); a secret file readable by group
/// or others is warned about.
pub fn load_or_create_secret(path: &Path) -> Result<Vec<u8>, StartError> {
    match check_secret(path)? {
        Some(bytes) => Ok(bytes),
        None => create_secret(path),
    }
}

/// Creates a relay secret at `path`: 32 random bytes, mode 0600.
fn create_secret(path: &Path) -> Result<Vec<u8>, StartError> {
    let err = |reason: String| StartError::Secret {
        path: path.display().to_string(),
        reason,
    };
    let mut secret = vec![0u8; 32];
    crate::identity::random_fill(&mut secret).map_err(|e| err(e.to_string()))?;
    write_private(path, &secret).map_err(|e| err(e.to_string()))?;
    tracing::info!(path = %path.display(), "created a new relay secret");
    Ok(secret)
}

/// The relay secret at `path` if one is there and strong enough to key a
/// relay; `None` when there is none and its directory exists to create one
/// in; else why not.
fn check_secret(path: &Path) -> Result<Option<Vec<u8>>, StartError> {
    let err = |reason: String| StartError::Secret {
        path: path.display().to_string(),
        reason,
    };
    match std::fs::read(path) {
        Ok(bytes) => {
            weak_secret(&bytes).map_or(Ok(()), |why| Err(err(why)))?;
            warn_if_shared(path, "relay secret");
            return Ok(Some(bytes));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e.to_string())),
    }
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
        && !dir.is_dir()
    {
        return Err(err(format!(
            "no secret there, and its directory {} does not exist to create one in",
            dir.display()
        )));
    }
    Ok(None)
}

/// Why `secret` must not key a relay, if it must not.
fn weak_secret(secret: &[u8]) -> Option<String> {
    let trimmed = crate::auth::token::trim_newlines(secret.to_vec());
    if secret.len() < 32 {
        return Some("shorter than 32 bytes".into());
    }
    let lower = trimmed.to_ascii_lowercase();
    let placeholder = [&b"replace-me"[..], b"change-me", b"changeme"]
        .iter()
        .any(|p| lower.windows(p.len()).any(|w| w == *p));
    if placeholder || EXAMPLE_SECRETS.contains(&trimmed.as_slice()) {
        return Some(
            "is an example or placeholder value; write 32 random bytes \
             (head -c 32 /dev/urandom)"
                .into(),
        );
    }
    let bits = entropy_bits(&trimmed);
    if bits < MIN_SECRET_BITS {
        return Some(format!(
            "has about {bits:.0} bits of entropy, at least {MIN_SECRET_BITS:.0} are required; \
             write 32 random bytes (head -c 32 /dev/urandom)"
        ));
    }
    None
}

/// The Shannon entropy of `bytes` (by byte frequency) times their number:
/// an estimate of the secret's strength that a repeated pattern, a word or
/// a short alphabet cannot pass.
fn entropy_bits(bytes: &[u8]) -> f64 {
    let mut counts = [0u32; 256];
    for b in bytes {
        counts[usize::from(*b)] += 1;
    }
    let n = bytes.len() as f64;
    let per_byte: f64 = counts
        .iter()
        .filter(|c| **c > 0)
        .map(|c| {
            let p = f64::from(*c) / n;
            -p * p.log2()
        })
        .sum();
    per_byte * n
}

/// Warns when the secret file at `path` can be read by its group or by
/// others (what a leaked backup or another account on the machine reads).
pub fn warn_if_shared(path: &Path, what: &str) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        if let Ok(meta) = std::fs::metadata(path)
            && meta.permissions().mode() & 0o077 != 0
        {
            tracing::warn!(
                path = %path.display(),
                mode = format!("{:o}", meta.permissions().mode() & 0o777),
                "{what} file is readable by group or others; make it 0600 (or 0400)"
            );
        }
    }
    #[cfg(not(unix))]
    let _ = (path, what);
}

/// Warns about every secret file of `cfg` readable by group or others: the
/// issuers' HS256 secrets, the TLS key and the hosts' credential files (the
/// relay secret is checked as it is read).
fn warn_about_shared_secrets(cfg: &RelayConfig) {
    for issuer in &cfg.auth.issuers {
        if let crate::auth::KeySource::Hs256 { secret_file } = &issuer.keys {
            warn_if_shared(secret_file, "HS256 issuer secret");
        }
    }
    if let Some(key) = &cfg.listen.tls_key {
        warn_if_shared(key, "TLS private key");
    }
    for host in &cfg.hosts {
        let files = [
            (&host.token_file, "host token"),
            (&host.query_token_file, "host query token"),
            (&host.client_key_file, "host client key"),
        ];
        for (file, what) in files {
            if let Some(file) = file {
                warn_if_shared(file, what);
            }
        }
    }
}

/// Writes `bytes` to a new file readable only by its owner.
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    opts.open(path)?.write_all(bytes)
}

/// Re-reads issuer keys (PEM/JWKS files) and the `jti` deny list every few
/// seconds or on SIGHUP; a broken file keeps the previous keys of its
/// issuer (contract §3.3) and does not hold back the others or the deny
/// list (`Authenticator::reload`). The config file's `[policy]` is reloaded when the file changes
/// (or on SIGHUP): a valid new policy applies to the next request at once,
/// and clients that lost sight of a subscribed channel are closed with 4000
/// (§7.6); its `[[hosts]]` too: added hosts are dialled, removed or changed
/// ones leave (`Relay::reload_hosts`, §8.1). An invalid file keeps the
/// previous policy and hosts.
async fn reload_files(relay: Arc<Relay>) {
    // The config file is checked every second (one `stat`), so a host added
    // to it is dialled within seconds; key files are re-read every fifth tick.
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    let mut ticks = 0u64;
    let stamp = |p: &Option<std::path::PathBuf>| {
        p.as_ref()
            .and_then(|p| std::fs::metadata(p).ok())
            .map(|m| (m.modified().ok(), m.len()))
    };
    let mut seen = stamp(&relay.cfg.source);
    #[cfg(unix)]
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    loop {
        #[cfg(unix)]
        let forced = match hangup.as_mut() {
            Some(h) => tokio::select! {
                _ = tick.tick() => false,
                _ = h.recv() => true,
            },
            None => {
                tick.tick().await;
                false
            }
        };
        #[cfg(not(unix))]
        let forced = {
            tick.tick().await;
            false
        };
        ticks += 1;
        if (forced || ticks.is_multiple_of(5))
            && let Err(e) = relay.auth.reload()
        {
            tracing::warn!(
                error = %e,
                "auth reload failed for these files; each keeps its previous keys or deny list"
            );
        }
        let now = stamp(&relay.cfg.source);
        if now == seen && !forced {
            continue;
        }
        seen = now;
        let Some(path) = relay.cfg.source.clone() else {
            continue;
        };
        match RelayConfig::load(&path) {
            Ok(cfg) => {
                relay.set_policy(Arc::new(crate::policy::RulePolicy::new(&cfg.policy)));
                relay.reload_hosts(&cfg.hosts);
                tracing::info!(
                    rules = cfg.policy.rules.len(),
                    hosts = cfg.hosts.len(),
                    "policy and hosts reloaded"
                );
            }
            Err(e) => {
                tracing::warn!(error = %e, "config reload failed; keeping the previous policy")
            }
        }
    }
}

/// What [`preflight`] loaded, for [`start`] to use.
pub struct Preflight {
    secret: Option<Vec<u8>>,
    auth: Authenticator,
    tls: Option<Arc<ReloadingCert>>,
}

/// The one gate every configuration goes through before a relay starts —
/// `serve` runs it, and `check-config` runs exactly it: the relay secret
/// (an existing one must be strong; a missing one needs a directory to be
/// created in), every `[auth]` issuer's keys and the deny list, the TLS
/// certificate and key, and every host's credentials. Files readable by
/// group or others are warned about. Nothing is created or bound.
pub fn preflight(cfg: &RelayConfig) -> Result<Preflight, StartError> {
    let secret = check_secret(&cfg.relay.secret_file)?;
    warn_about_shared_secrets(cfg);
    let auth = Authenticator::load(&cfg.auth).map_err(|e| StartError::Load(e.to_string()))?;
    let tls = match (&cfg.listen.tls_cert, &cfg.listen.tls_key) {
        (Some(cert), Some(key)) => {
            let reloading =
                ReloadingCert::load(cert, key).map_err(|e| StartError::Load(e.to_string()))?;
            reloading
                .server_config()
                .map_err(|e| StartError::Load(e.to_string()))?;
            Some(reloading)
        }
        _ => None,
    };
    crate::upstream::hub::Hosts::new(&cfg.hosts).map_err(StartError::Load)?;
    Ok(Preflight { secret, auth, tls })
}

/// Starts a relay: everything is loaded and the listener bound before this
/// returns, so a returned relay accepts connections.
pub async fn start(cfg: RelayConfig) -> Result<RunningRelay, StartError> {
    let checked = preflight(&cfg)?;
    let store = open_store(&cfg).await?;
    launch(cfg, checked, store).await
}

/// [`start`] with a URI store opened by the caller instead of the one
/// `[relay] store` names (an embedding's own backend, a test's store).
pub async fn start_with_store(
    cfg: RelayConfig,
    store: Arc<dyn crate::names::store::UriStore>,
) -> Result<RunningRelay, StartError> {
    let checked = preflight(&cfg)?;
    launch(cfg, checked, store).await
}

/// Binds the listeners and starts everything on a checked configuration.
async fn launch(
    cfg: RelayConfig,
    Preflight { secret, auth, tls }: Preflight,
    store: Arc<dyn crate::names::store::UriStore>,
) -> Result<RunningRelay, StartError> {
    let secret = match secret {
        Some(s) => s,
        None => create_secret(&cfg.relay.secret_file)?,
    };
    tracing::info!(issuers = cfg.auth.issuers.len(), "auth keys loaded");
    let tls = match tls {
        Some(reloading) => {
            reloading.watch(Duration::from_secs(5));
            let server = reloading
                .server_config()
                .map_err(|e| StartError::Load(e.to_string()))?;
            Some(tokio_rustls::TlsAcceptor::from(Arc::new(server)))
        }
        None => None,
    };
    let (listener, addr) = bind(cfg.listen.addr).await?;
    let (admin, admin_addr) = bind(cfg.listen.admin_addr).await?;
    let purge_every = Duration::from_secs(cfg.limits.store_purge_secs.max(1));
    crate::session::prefault(cfg.limits.prefault_chunks)
        .map_err(|e| StartError::Load(format!("cannot start the prefault thread: {e}")))?;
    let (relay, events) = Relay::new(cfg, secret, store.clone(), auth).map_err(StartError::Load)?;
    let edge = Edge::new(relay.clone(), tls)
        .map_err(|e| StartError::Load(format!("cannot start the edge threads: {e}")))?;
    let tasks = vec![
        tokio::spawn(relay.registry.clone().run_fanout(events)),
        tokio::spawn(edge.clone().serve(listener)),
        tokio::spawn(edge.clone().serve_admin(admin)),
        tokio::spawn(edge.clone().feed_status()),
        tokio::spawn(reload_files(relay.clone())),
        tokio::spawn(relay.registry.clone().sweep_idle_links()),
        tokio::spawn(relay.registry.clone().settle_lost_creates()),
        tokio::spawn(crate::names::store::purge_expired_every(store, purge_every)),
    ];
    tracing::info!(%addr, hosts = relay.hubs().count(), "relay listening");
    Ok(RunningRelay {
        addr,
        relay,
        edge,
        admin_addr,
        tasks,
    })
}

/// The URI store `[relay]` names, opened on a blocking thread (PostgreSQL
/// may take up to its timeout to answer).
async fn open_store(
    cfg: &RelayConfig,
) -> Result<Arc<dyn crate::names::store::UriStore>, StartError> {
    let relay = cfg.relay.clone();
    let opened =
        tokio::task::spawn_blocking(move || crate::names::open::open(relay.store_location()))
            .await
            .map_err(|e| StartError::Store(e.to_string()))?;
    let store = opened.map_err(|e| StartError::Store(e.to_string()))?;
    tracing::info!(backend = store.backend(), "URI store open");
    Ok(store)
}

/// A listener on `addr`, and the address it is bound to.
async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), StartError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| StartError::Bind { addr, source })?;
    Ok((listener, bound))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random(n: usize) -> Vec<u8> {
        let mut b = vec![0u8; n];
        crate::identity::random_fill(&mut b).unwrap();
        b
    }

    #[test]
    fn a_secret_in_a_missing_directory_names_the_directory() {
        let dir =
            std::env::temp_dir().join(format!("ahp-relay-no-such-dir-{}", std::process::id()));
        let err = load_or_create_secret(&dir.join("relay.secret"))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("directory") && err.contains(&dir.display().to_string()),
            "{err}"
        );
    }

    #[test]
    fn random_secrets_pass_and_weak_ones_do_not() {
        for _ in 0..1000 {
            let raw = random(32);
            assert_eq!(weak_secret(&raw), None, "{raw:?}");
            let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(weak_secret(format!("{hex}\n").as_bytes()), None, "{hex}");
        }
        let example = b"replace-me-with-32-random-bytes-000000\n";
        assert!(weak_secret(example).unwrap().contains("example"));
        assert!(weak_secret(&[b'a'; 64]).unwrap().contains("entropy"));
        assert!(weak_secret(b"0123456701234567012345670123456701234567").is_some());
        assert!(weak_secret(&random(31)).unwrap().contains("shorter"));
    }
}

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
use crate::names::store::RedbStore;
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

/// Reads the relay secret, or creates it (32 random bytes, mode 0600).
pub fn load_or_create_secret(path: &Path) -> Result<Vec<u8>, StartError> {
    let err = |reason: String| StartError::Secret {
        path: path.display().to_string(),
        reason,
    };
    match std::fs::read(path) {
        Ok(bytes) if bytes.len() >= 32 => return Ok(bytes),
        Ok(_) => return Err(err("shorter than 32 bytes".into())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e.to_string())),
    }
    let mut secret = vec![0u8; 32];
    crate::identity::random_fill(&mut secret).map_err(|e| err(e.to_string()))?;
    write_private(path, &secret).map_err(|e| err(e.to_string()))?;
    tracing::info!(path = %path.display(), "created a new relay secret");
    Ok(secret)
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
/// seconds or on SIGHUP; a broken file keeps the previous keys (contract
/// §3.3). The config file's `[policy]` is reloaded when the file changes
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
            tracing::warn!(error = %e, "auth reload failed; keeping the previous keys");
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

/// Starts a relay: everything is loaded and the listener bound before this
/// returns, so a returned relay accepts connections.
pub async fn start(cfg: RelayConfig) -> Result<RunningRelay, StartError> {
    let secret = load_or_create_secret(&cfg.relay.secret_file)?;
    let store = RedbStore::open(&cfg.relay.store).map_err(|e| StartError::Store(e.to_string()))?;
    let auth = Authenticator::load(&cfg.auth).map_err(|e| StartError::Load(e.to_string()))?;
    tracing::info!(issuers = cfg.auth.issuers.len(), "auth keys loaded");
    let tls = match (&cfg.listen.tls_cert, &cfg.listen.tls_key) {
        (Some(cert), Some(key)) => {
            let reloading =
                ReloadingCert::load(cert, key).map_err(|e| StartError::Load(e.to_string()))?;
            reloading.watch(Duration::from_secs(5));
            let server = reloading
                .server_config()
                .map_err(|e| StartError::Load(e.to_string()))?;
            Some(tokio_rustls::TlsAcceptor::from(Arc::new(server)))
        }
        _ => None,
    };
    let (listener, addr) = bind(cfg.listen.addr).await?;
    let (admin, admin_addr) = bind(cfg.listen.admin_addr).await?;
    let store: Arc<dyn crate::names::store::UriStore> = Arc::new(store);
    let purge_every = Duration::from_secs(cfg.limits.store_purge_secs.max(1));
    let (relay, events) = Relay::new(cfg, secret, store.clone(), auth).map_err(StartError::Load)?;
    let edge = Edge::new(relay.clone(), tls);
    let tasks = vec![
        tokio::spawn(relay.registry.clone().run_fanout(events)),
        tokio::spawn(edge.clone().serve(listener)),
        tokio::spawn(edge.clone().serve_admin(admin)),
        tokio::spawn(edge.clone().feed_status()),
        tokio::spawn(reload_files(relay.clone())),
        tokio::spawn(relay.registry.clone().sweep_idle_links()),
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

//! Starting a relay from a validated configuration: secret, URI store,
//! authenticator, watch links, fan-out and the listener.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::config::RelayConfig;
use crate::edge::auth::Authenticator;
use crate::edge::server::Edge;
use crate::edge::tls::ReloadingCert;
use crate::relay::Relay;
use crate::route::store::RedbStore;

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

    /// Stops accepting and stops the watch links.
    pub fn stop(self) {
        for t in self.tasks {
            t.abort();
        }
        self.relay.stop_watch_links();
        self.relay.stop_sessions();
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
    random_fill(&mut secret).map_err(|e| err(e.to_string()))?;
    write_private(path, &secret).map_err(|e| err(e.to_string()))?;
    tracing::info!(path = %path.display(), "created a new relay secret");
    Ok(secret)
}

/// Fills `buf` from the operating system's secure random source.
pub fn random_fill(buf: &mut [u8]) -> Result<(), rustls::Error> {
    rustls::crypto::ring::default_provider()
        .secure_random
        .fill(buf)
        .map_err(|_| rustls::Error::General("no secure random source".into()))
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
/// seconds; a broken file keeps the previous keys (contract §3.3).
async fn reload_auth(relay: Arc<Relay>) {
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    tick.tick().await;
    loop {
        tick.tick().await;
        if let Err(e) = relay.auth.reload() {
            tracing::warn!(error = %e, "auth reload failed; keeping the previous keys");
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
    let addr = cfg.listen.addr;
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { addr, source })?;
    let addr = listener
        .local_addr()
        .map_err(|source| StartError::Bind { addr, source })?;
    let (relay, events) =
        Relay::new(cfg, secret, Arc::new(store), auth).map_err(StartError::Load)?;
    let edge = Edge::new(relay.clone(), tls);
    let tasks = vec![
        tokio::spawn(relay.clone().run_fanout(events)),
        tokio::spawn(edge.clone().serve(listener)),
        tokio::spawn(reload_auth(relay.clone())),
    ];
    tracing::info!(%addr, hosts = relay.hubs().count(), "relay listening");
    Ok(RunningRelay {
        addr,
        relay,
        edge,
        tasks,
    })
}

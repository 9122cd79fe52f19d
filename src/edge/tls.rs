//! Server TLS with rustls: certificate and key from PEM files, reloaded
//! without a restart when the files change (contract §3.1).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Errors loading the certificate or key.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or parsed.
    #[error("{path}: {reason}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The key does not fit rustls (unsupported type or mismatch).
    #[error("key {path}: {reason}")]
    Key {
        /// The key file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
}

/// Loads a certificate chain and its private key, and checks that the key is
/// the one the first certificate names: a certificate replaced before its key
/// (or the other way round) is refused here rather than served, where every
/// handshake would fail.
pub fn load_certified_key(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let pem_err = |path: &Path, e: &dyn std::fmt::Display| TlsError::Pem {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| pem_err(cert, &e))?
        .collect::<Result<_, _>>()
        .map_err(|e| pem_err(cert, &e))?;
    if chain.is_empty() {
        return Err(pem_err(cert, &"no certificate in file"));
    }
    let der = PrivateKeyDer::from_pem_file(key).map_err(|e| pem_err(key, &e))?;
    let signer =
        rustls::crypto::ring::sign::any_supported_type(&der).map_err(|e| TlsError::Key {
            path: key.to_path_buf(),
            reason: e.to_string(),
        })?;
    let certified = CertifiedKey::new(chain, signer);
    match certified.keys_match() {
        // A key type whose public half rustls cannot derive is not a mismatch.
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {
            Ok(certified)
        }
        Err(e) => Err(TlsError::Key {
            path: key.to_path_buf(),
            reason: format!("does not match the certificate in {} ({e})", cert.display()),
        }),
    }
}

/// Serves the current certificate and swaps in a new one when the files
/// change; a broken new pair is logged and the old one kept.
#[derive(Debug)]
pub struct ReloadingCert {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<(Arc<CertifiedKey>, Option<SystemTime>)>,
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

impl ReloadingCert {
    /// Loads the pair now (errors are fatal at start).
    pub fn load(cert: &Path, key: &Path) -> Result<Arc<Self>, TlsError> {
        let ck = load_certified_key(cert, key)?;
        let stamp = mtime(cert).max(mtime(key));
        Ok(Arc::new(Self {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            current: RwLock::new((Arc::new(ck), stamp)),
        }))
    }

    /// Reloads if either file changed since the last load. A pair that does
    /// not load (or whose key does not match) is not recorded as seen, so it
    /// is tried again at the next poll: a certificate written before its key
    /// is served once the key arrives.
    pub fn reload_if_changed(&self) {
        let stamp = mtime(&self.cert).max(mtime(&self.key));
        let seen = self.current.read().map(|c| c.1).unwrap_or(None);
        if stamp == seen {
            return;
        }
        match load_certified_key(&self.cert, &self.key) {
            Ok(ck) => {
                if let Ok(mut c) = self.current.write() {
                    *c = (Arc::new(ck), stamp);
                }
                tracing::info!(cert = %self.cert.display(), "TLS certificate reloaded");
            }
            Err(e) => {
                tracing::warn!(error = %e, "TLS certificate changed but cannot be loaded; keeping the old one")
            }
        }
    }

    /// Polls the files every `every` and reloads on change.
    pub fn watch(self: &Arc<Self>, every: Duration) {
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                me.reload_if_changed();
            }
        });
    }

    /// A rustls server config (TLS 1.2/1.3, ring, HTTP/1.1 ALPN) using this
    /// certificate.
    pub fn server_config(self: &Arc<Self>) -> Result<rustls::ServerConfig, rustls::Error> {
        let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(self.clone());
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(cfg)
    }
}

impl ReloadingCert {
    /// The certificate served now.
    pub fn current(&self) -> Option<Arc<CertifiedKey>> {
        self.current.read().ok().map(|c| c.0.clone())
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current()
    }
}

/// A self-signed certificate for `names` (the dev demo and tests), as PEM
/// (certificate, private key).
pub fn self_signed(names: &[&str]) -> Result<(String, String), rcgen::Error> {
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let ck = rcgen::generate_simple_self_signed(names)?;
    Ok((ck.cert.pem(), ck.signing_key.serialize_pem()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn first_cert(ck: &CertifiedKey) -> Vec<u8> {
        ck.cert.first().map(|c| c.to_vec()).unwrap_or_default()
    }

    #[test]
    fn a_changed_pair_is_served_and_a_broken_one_is_not() {
        let dir = std::env::temp_dir().join(format!("ahp-relay-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (cert, key) = (dir.join("c.pem"), dir.join("k.pem"));
        let (c1, k1) = self_signed(&["localhost"]).unwrap();
        std::fs::write(&cert, &c1).unwrap();
        std::fs::write(&key, &k1).unwrap();
        let r = ReloadingCert::load(&cert, &key).unwrap();
        let before = first_cert(&r.current().unwrap());
        std::thread::sleep(std::time::Duration::from_millis(1100));
        let (c2, k2) = self_signed(&["localhost"]).unwrap();
        std::fs::write(&cert, &c2).unwrap();
        std::fs::write(&key, &k2).unwrap();
        r.reload_if_changed();
        let after = first_cert(&r.current().unwrap());
        assert_ne!(
            before, after,
            "the new certificate is served without a restart"
        );
        std::thread::sleep(std::time::Duration::from_millis(1100));
        std::fs::write(&cert, "not a certificate").unwrap();
        r.reload_if_changed();
        assert_eq!(
            first_cert(&r.current().unwrap()),
            after,
            "a broken file keeps the old pair"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_certificate_is_served_only_with_its_own_key() {
        let dir = std::env::temp_dir().join(format!("ahp-relay-tls-pair-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (cert, key) = (dir.join("c.pem"), dir.join("k.pem"));
        let (c1, k1) = self_signed(&["localhost"]).unwrap();
        let (c2, k2) = self_signed(&["localhost"]).unwrap();
        std::fs::write(&cert, &c2).unwrap();
        std::fs::write(&key, &k1).unwrap();
        let err = load_certified_key(&cert, &key).unwrap_err().to_string();
        assert!(err.contains("does not match"), "{err}");

        std::fs::write(&cert, &c1).unwrap();
        let r = ReloadingCert::load(&cert, &key).unwrap();
        let first = first_cert(&r.current().unwrap());
        std::thread::sleep(std::time::Duration::from_millis(1100));
        std::fs::write(&cert, &c2).unwrap();
        r.reload_if_changed();
        assert_eq!(
            first_cert(&r.current().unwrap()),
            first,
            "a new certificate without its key is not served"
        );
        std::fs::write(&key, &k2).unwrap();
        r.reload_if_changed();
        let served = r.current().unwrap();
        assert_ne!(first_cert(&served), first, "served once its key arrives");
        assert!(served.keys_match().is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }
}

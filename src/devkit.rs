//! A development setup: a directory with a self-signed certificate, an HS256
//! dev key and a relay secret, and a relay configuration in front of given
//! hosts. Used by `ahp-relay demo` and by the integration tests, so both
//! exercise the same path as a production config file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::auth::token::{MintError, MintRequest, mint_hs256};
use crate::config::RelayConfig;

/// Issuer of dev tokens.
pub const DEV_ISSUER: &str = "ahp-relay-dev";
/// Audience of dev tokens.
pub const DEV_AUDIENCE: &str = "ahp-relay";

/// The policy of a dev setup when the caller gives none: every principal of
/// the dev issuer is `admin` on every host and sees every session. Tests
/// that are not about tenancy run under it.
pub const OPEN_POLICY: &str = r#"
[[policy.rules]]
name = "dev-everyone"
issuer = "ahp-relay-dev"
subjects = ["*"]
hosts = ["*"]
role = "admin"
visibility = "all"
"#;

/// The demo's policy (README "Multi-tenant setup"): `alice` operates every
/// host and sees every session; `bob` operates every host but sees only the
/// sessions he created; both read and write files only inside the working
/// directories of the sessions they operate (`files = "session-dirs"`);
/// `ops` administers everything; `carol` may only watch `buildbox`.
pub const DEMO_POLICY: &str = r#"
[[policy.rules]]
name = "alice-operates-everything"
subjects = ["alice"]
hosts = ["*"]
role = "operator"
visibility = "all"
files = "session-dirs"

[[policy.rules]]
name = "bob-own-sessions"
subjects = ["bob"]
hosts = ["*"]
role = "operator"
visibility = "own"
files = "session-dirs"

[[policy.rules]]
name = "ops-administers-everything"
subjects = ["ops"]
hosts = ["*"]
role = "admin"
visibility = "all"

[[policy.rules]]
name = "carol-watches-buildbox"
subjects = ["carol"]
hosts = ["buildbox"]
role = "viewer"
visibility = "all"
"#;

/// A certificate authority and a server certificate it signed, as PEM: the
/// pair `ahp-relay cert` writes for testing a relay with a certificate of
/// its own (the server certificate is an end entity, so rustls accepts it,
/// unlike a self-signed CA certificate serving as its own leaf).
#[derive(Debug, Clone)]
pub struct TestPki {
    /// The CA certificate: what clients trust (`--ca`, `AHP_RELAY_CA`).
    pub ca_cert: String,
    /// The CA's private key (to sign more certificates).
    pub ca_key: String,
    /// The server certificate for `names` (DNS names or IP addresses).
    pub server_cert: String,
    /// Its private key (`[listen] tls_key`).
    pub server_key: String,
}

/// A fresh CA (`CN=ahp-relay test CA`) and a server certificate for `names`
/// signed by it; an IP address in `names` becomes an IP subject alternative name.
pub fn test_pki(names: &[String]) -> Result<TestPki, rcgen::Error> {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "ahp-relay test CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;
    let server_key = KeyPair::generate()?;
    let mut params = CertificateParams::new(names.to_vec())?;
    if let Some(first) = names.first() {
        params
            .distinguished_name
            .push(DnType::CommonName, first.as_str());
    }
    let server = params.signed_by(&server_key, &ca)?;
    Ok(TestPki {
        ca_cert: ca.pem(),
        ca_key: ca.key().serialize_pem(),
        server_cert: server.pem(),
        server_key: server_key.serialize_pem(),
    })
}

/// Files of a dev setup.
#[derive(Debug, Clone)]
pub struct DevKit {
    /// The directory holding everything.
    pub dir: PathBuf,
    /// Self-signed certificate for `localhost` and `127.0.0.1` (the CA to trust).
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// The HS256 dev key file.
    pub dev_key: PathBuf,
}

/// Errors creating a dev setup.
#[derive(Debug, thiserror::Error)]
pub enum DevKitError {
    /// File system trouble.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// Certificate generation failed.
    #[error("certificate: {0}")]
    Cert(#[from] rcgen::Error),
    /// No random bytes.
    #[error("random: {0}")]
    Random(#[from] rustls::Error),
    /// The generated configuration did not validate.
    #[error("config: {0}")]
    Config(#[from] crate::config::ConfigError),
    /// Minting failed.
    #[error("token: {0}")]
    Mint(#[from] MintError),
}

impl DevKit {
    /// Creates `dir` with a certificate, key and dev key. `dir` must not
    /// exist yet (its parent must): it is made private to its owner (0700)
    /// and fails if anyone created it first, so nobody else can read or
    /// plant the keys and tokens written into it.
    pub fn create(dir: &Path) -> Result<Self, DevKitError> {
        let mut builder = std::fs::DirBuilder::new();
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder.create(dir)?;
        let (cert_pem, key_pem) = crate::edge::tls::self_signed(&["localhost", "127.0.0.1"])?;
        let cert = dir.join("relay-cert.pem");
        let key = dir.join("relay-key.pem");
        std::fs::write(&cert, cert_pem)?;
        crate::run::write_private(&key, key_pem.as_bytes())?;
        let mut raw = [0u8; 32];
        crate::identity::random_fill(&mut raw)?;
        let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        let dev_key = dir.join("dev-hs256.key");
        crate::run::write_private(&dev_key, format!("{hex}\n").as_bytes())?;
        Ok(Self {
            dir: dir.to_path_buf(),
            cert,
            key,
            dev_key,
        })
    }

    /// A relay configuration listening on `listen` with TLS, the dev issuer,
    /// and `hosts` as `(id, ws url)` pairs; `auth_extra` is TOML placed in the
    /// `[auth]` table (e.g. `deny_list_file = "…"`), `extra` is appended at
    /// the end (e.g. a `[limits]` table or more `[[auth.issuers]]`). Unless
    /// `extra` has `[[policy.rules]]`, [`OPEN_POLICY`] is appended.
    pub fn config(
        &self,
        listen: &str,
        hosts: &[(String, String)],
        auth_extra: &str,
        extra: &str,
    ) -> Result<RelayConfig, DevKitError> {
        self.config_with_relay(listen, hosts, auth_extra, "", extra)
    }

    /// [`DevKit::config`] with `relay_extra` placed in the `[relay]` table
    /// (e.g. `default_host = "…"`).
    pub fn config_with_relay(
        &self,
        listen: &str,
        hosts: &[(String, String)],
        auth_extra: &str,
        relay_extra: &str,
        extra: &str,
    ) -> Result<RelayConfig, DevKitError> {
        let mut toml = format!(
            r#"[listen]
addr = "{listen}"
admin_addr = "127.0.0.1:0"
tls_cert = "{cert}"
tls_key = "{key}"

[auth]
leeway_secs = 5
{auth_extra}

[[auth.issuers]]
issuer = "{DEV_ISSUER}"
audience = ["{DEV_AUDIENCE}"]
keys = {{ type = "hs256", secret_file = "{dev_key}" }}

[relay]
secret_file = "{secret}"
store = "{store}"
{relay_extra}
"#,
            cert = self.cert.display(),
            key = self.key.display(),
            dev_key = self.dev_key.display(),
            secret = self.dir.join("relay.secret").display(),
            store = self.dir.join("uris.redb").display(),
        );
        for (id, url) in hosts {
            toml.push_str(&format!(
                "\n[[hosts]]\nid = \"{id}\"\nurl = \"{url}\"\nallow_plaintext = true\n"
            ));
        }
        toml.push_str(extra);
        if !extra.contains("[[policy.rules]]") {
            toml.push_str(OPEN_POLICY);
        }
        let path = self.dir.join("relay.toml");
        std::fs::write(&path, toml)?;
        Ok(RelayConfig::load(&path)?)
    }

    /// A dev token for `sub`.
    pub fn token(
        &self,
        sub: &str,
        groups: &[&str],
        ttl: Duration,
        jti: Option<&str>,
    ) -> Result<String, DevKitError> {
        let secret = crate::auth::token::trim_newlines(std::fs::read(&self.dev_key)?);
        let req = MintRequest {
            issuer: DEV_ISSUER.into(),
            audience: DEV_AUDIENCE.into(),
            subject: sub.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            ttl,
            jti: jti.map(str::to_string),
        };
        Ok(mint_hs256(&secret, &req, crate::identity::unix_now())?)
    }
}

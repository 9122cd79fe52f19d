//! Upstream credentials per host (contract §8.1): a host that wants its
//! connection token as `?tkn=` (VS Code's agent host) and a host behind
//! mutual TLS are both reached through the relay; a wrong credential makes
//! the host unreachable with an error naming the host id only; credential
//! files are read again at every dial.

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ahp_relay::devkit::DevKit;
use ahp_relay::run::RunningRelay;
use ahp_relay::simhost::SimHost;
use ahp_relay::upstream::hub::HostStatus;
use common::relay::{metric, scratch_dir};
use common::{WAIT, fast_config, start_host, wait_until};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A relay started from `hosts_toml` (its own `[[hosts]]` entries).
async fn relay(dir: &Path, hosts_toml: &str) -> (RunningRelay, DevKit) {
    let kit = DevKit::create(&dir.join("kit")).expect("dev kit");
    let cfg = kit
        .config("127.0.0.1:0", &[], "", hosts_toml)
        .expect("config validates");
    (ahp_relay::run::start(cfg).await.expect("relay starts"), kit)
}

async fn wait_status(relay: &RunningRelay, id: &str, want: HostStatus) {
    let r = relay.relay.clone();
    let id = id.to_string();
    wait_until(&format!("host {id} {want:?}"), move || {
        r.hub(&id).is_some_and(|h| h.status() == want)
    })
    .await;
}

/// The host row of `id` on the relay's status page (read as `ops`, an
/// admin under the dev kit's open policy).
async fn status_row(relay: &RunningRelay, kit: &DevKit, id: &str) -> Value {
    let token = kit
        .token("ops", &[], std::time::Duration::from_secs(600), None)
        .expect("token");
    let bearer = format!("Bearer {token}");
    let headers = [("Authorization", bearer.as_str())];
    let (code, body) = common::relay::http_at_with(relay.admin_addr(), "/status.json", &headers)
        .await
        .expect("status answers");
    assert_eq!(code, 200);
    let v: Value = serde_json::from_str(&body).expect("status JSON");
    v["hosts"]
        .as_array()
        .and_then(|hs| hs.iter().find(|h| h["id"] == id).cloned())
        .expect("host row")
}

/// Session URIs a client of `relay` lists.
async fn listed(relay: &RunningRelay, kit: &DevKit) -> Vec<String> {
    let token = kit
        .token("alice", &[], std::time::Duration::from_secs(600), None)
        .expect("token");
    let opts = ahp_relay::upstream::dial::DialOptions {
        url: relay.url(),
        token: Some(token),
        ca_file: Some(kit.cert.clone()),
        insecure: false,
        connect_timeout: WAIT,
        extra_headers: Vec::new(),
    };
    let ws = ahp_relay::upstream::dial::dial_stream(&opts)
        .await
        .expect("client connects");
    let mut ws = common::RawWs::from_stream(ws);
    ws.initialize("c1").await;
    let r = ws
        .request(1, "listSessions", json!({"channel": "ahp-root://"}))
        .await;
    r["result"]["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|s| s["resource"].as_str().map(str::to_string))
        .collect()
}

/// A TCP gate in front of `host` that passes only upgrade requests whose
/// request line carries `tkn=<token>` (else 401), recording request lines.
async fn tkn_gate(host: &SimHost, token: &str) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("ws://{}/", listener.local_addr().expect("addr"));
    let target = host.addr();
    let want = format!("tkn={token}");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let want = want.clone();
            let log = log.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if client.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let text = String::from_utf8_lossy(&head).to_string();
                let line = text.lines().next().unwrap_or_default().to_string();
                log.lock().unwrap().push(line.clone());
                let ok = line.split(['?', '&', ' ']).any(|p| p == want);
                if !ok {
                    let _ = client
                        .write_all(b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\n\r\n")
                        .await;
                    return;
                }
                let mut upstream = TcpStream::connect(target).await.expect("simhost");
                upstream.write_all(&head).await.expect("forward head");
                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
            });
        }
    });
    (url, seen)
}

#[tokio::test]
async fn a_host_reached_with_a_tkn_query_token() {
    let dir = scratch_dir("tkn");
    std::fs::create_dir_all(&dir).expect("dir");
    let host = start_host(fast_config("vsc", 2)).await;
    let (gate, seen) = tkn_gate(&host, "s3cret-tkn").await;
    let good = dir.join("good.tkn");
    let bad = dir.join("bad.tkn");
    std::fs::write(&good, "s3cret-tkn\n").expect("token file");
    std::fs::write(&bad, "wrong-tkn\n").expect("token file");
    let hosts = format!(
        "\n[[hosts]]\nid = \"vsc\"\nurl = \"{gate}\"\nallow_plaintext = true\nquery_token_file = \"{}\"\n\
         \n[[hosts]]\nid = \"other\"\nurl = \"{gate}?x=1\"\nallow_plaintext = true\nquery_token_file = \"{}\"\n",
        good.display(),
        bad.display()
    );
    let (relay, kit) = relay(&dir, &hosts).await;
    wait_status(&relay, "vsc", HostStatus::Up).await;
    wait_status(&relay, "other", HostStatus::Down).await;
    let sessions = listed(&relay, &kit).await;
    assert_eq!(
        sessions.iter().filter(|s| s.contains("vsc~")).count(),
        2,
        "{sessions:?}"
    );
    assert!(
        seen.lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("tkn=s3cret-tkn")),
        "the token went as the tkn query parameter"
    );

    // The wrong one is unreachable, named by its id alone.
    let row = status_row(&relay, &kit, "other").await;
    assert_eq!(row["state"], "unreachable", "{row}");
    let error = row["last_error"].as_str().expect("last error").to_string();
    assert!(error.starts_with("host other: "), "{error}");
    assert!(error.contains("401"), "{error}");
    for secret in ["wrong-tkn", "s3cret-tkn", "x=1", "127.0.0.1"] {
        assert!(!error.contains(secret), "{secret} in {error}");
    }
    let (_, page) = common::relay::http_at(relay.admin_addr(), "/metrics")
        .await
        .expect("metrics");
    assert_eq!(
        metric(&page, "ahp_relay_host_up{host=\"other\"}"),
        Some(0.0)
    );

    // Rotating the file fixes it at the next dial, without a reload.
    std::fs::write(&bad, "s3cret-tkn\n").expect("token file");
    wait_status(&relay, "other", HostStatus::Up).await;
    assert_eq!(
        status_row(&relay, &kit, "other").await["last_error"],
        Value::Null
    );
}

/// A CA and a certificate it signs for `name` (client or server).
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn ca(&self, name: &str) -> CertifiedIssuer<'static, KeyPair> {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca =
            CertifiedIssuer::self_signed(params, KeyPair::generate().expect("key")).expect("CA");
        std::fs::write(self.dir.join(format!("{name}.pem")), ca.pem()).expect("CA file");
        ca
    }

    /// Writes `<name>.crt` and `<name>.key` signed by `ca`.
    fn leaf(&self, ca: &CertifiedIssuer<'static, KeyPair>, name: &str) -> (PathBuf, PathBuf) {
        let key = KeyPair::generate().expect("key");
        let params = CertificateParams::new(vec!["localhost".to_string()]).expect("params");
        let cert = params.signed_by(&key, ca).expect("leaf");
        let (c, k) = (
            self.dir.join(format!("{name}.crt")),
            self.dir.join(format!("{name}.key")),
        );
        std::fs::write(&c, cert.pem()).expect("cert file");
        std::fs::write(&k, key.serialize_pem()).expect("key file");
        (c, k)
    }
}

/// A TLS front for `host` that requires a client certificate from
/// `client_ca`, presenting `cert`/`key`; returns its `wss://` URL.
async fn mtls_front(host: &SimHost, cert: &Path, key: &Path, client_ca: &Path) -> String {
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(client_ca).expect("ca") {
        roots.add(c.expect("ca cert")).expect("root");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .expect("client verifier");
    let chain: Vec<_> = CertificateDer::pem_file_iter(cert)
        .expect("cert")
        .map(|c| c.expect("cert"))
        .collect();
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, PrivateKeyDer::from_pem_file(key).expect("key"))
        .expect("server config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!(
        "wss://localhost:{}/",
        listener.local_addr().expect("addr").port()
    );
    let target = host.addr();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return; // no or an untrusted client certificate
                };
                let mut upstream = TcpStream::connect(target).await.expect("simhost");
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut upstream).await;
            });
        }
    });
    url
}

#[tokio::test]
async fn a_host_behind_mutual_tls() {
    let dir = scratch_dir("mtls");
    std::fs::create_dir_all(&dir).expect("dir");
    let pki = Pki { dir: dir.clone() };
    let server_ca = pki.ca("server-ca");
    let client_ca = pki.ca("client-ca");
    let stranger_ca = pki.ca("stranger-ca");
    let (server_crt, server_key) = pki.leaf(&server_ca, "server");
    let (client_crt, client_key) = pki.leaf(&client_ca, "client");
    let (stranger_crt, stranger_key) = pki.leaf(&stranger_ca, "stranger");
    let host = start_host(fast_config("gpu", 1)).await;
    let front = mtls_front(&host, &server_crt, &server_key, &dir.join("client-ca.pem")).await;
    let entry = |id: &str, crt: &Path, key: &Path| {
        format!(
            "\n[[hosts]]\nid = \"{id}\"\nurl = \"{front}\"\nca_file = \"{}\"\n\
             client_cert_file = \"{}\"\nclient_key_file = \"{}\"\n",
            dir.join("server-ca.pem").display(),
            crt.display(),
            key.display()
        )
    };
    let hosts =
        entry("gpu", &client_crt, &client_key) + &entry("nocert", &stranger_crt, &stranger_key);
    let (relay, kit) = relay(&dir, &hosts).await;
    wait_status(&relay, "gpu", HostStatus::Up).await;
    wait_status(&relay, "nocert", HostStatus::Down).await;
    let sessions = listed(&relay, &kit).await;
    assert!(sessions.iter().any(|s| s.contains("gpu~")), "{sessions:?}");
    assert!(
        !sessions.iter().any(|s| s.contains("nocert~")),
        "{sessions:?}"
    );
    let row = status_row(&relay, &kit, "nocert").await;
    let error = row["last_error"].as_str().expect("last error").to_string();
    assert!(error.starts_with("host nocert: "), "{error}");
    assert!(!error.contains("localhost:"), "no URL in {error}");
}

//! Helpers for relay tests: simulated hosts behind a real relay over TLS,
//! dev tokens, the official client dialed through the TLS endpoint, raw
//! upgrades, plain HTTPS requests to that endpoint and its metrics, and
//! policy rules.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ahp::{Client, ClientConfig};
use ahp_relay::config::RelayConfig;
use ahp_relay::devkit::DevKit;
use ahp_relay::run::RunningRelay;
use ahp_relay::session::ClientSession;
use ahp_relay::simhost::{SimHost, SimHostConfig};
use ahp_relay::upstream::dial::{DialOptions, connect_client, dial_stream};
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::Connector;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::header::AUTHORIZATION;
use tokio_tungstenite::tungstenite::http::{HeaderMap, HeaderName, HeaderValue};

use super::{RawWs, WAIT};

/// A relay with its simulated hosts and dev credentials.
pub struct TestRelay {
    /// The running relay.
    pub relay: RunningRelay,
    /// The simulated hosts, in the order given.
    pub hosts: Vec<SimHost>,
    /// Certificate, keys, config directory.
    pub kit: DevKit,
}

static NEXT: AtomicU64 = AtomicU64::new(0);

/// A fresh scratch directory (not created) under this test process's
/// scratch root, `<temp>/ahp-relay-tests/<pid>` (created).
pub fn scratch_dir(tag: &str) -> PathBuf {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    scratch_root().join(format!("{tag}-{n}"))
}

/// This process's scratch root. Test processes end without dropping what
/// their tests built, so on first use the roots of test processes that are
/// gone (no `/proc/<pid>`) are removed: repeated `cargo test` runs leave at
/// most the last run's scratch behind, not one folder per test per run.
fn scratch_root() -> &'static Path {
    static ROOT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ROOT.get_or_init(|| {
        let base = std::env::temp_dir().join("ahp-relay-tests");
        // Without /proc no process can be told gone: nothing is swept.
        if Path::new("/proc/self").exists() {
            for entry in std::fs::read_dir(&base).into_iter().flatten().flatten() {
                let name = entry.file_name();
                let gone = name
                    .to_str()
                    .and_then(|n| n.parse::<u32>().ok())
                    .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists());
                if gone {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        let root = base.join(std::process::id().to_string());
        let _ = std::fs::create_dir_all(&root);
        root
    })
}

/// Starts a simulated host on a reserved loopback port. A port can still be
/// taken between its probe and this bind: a child process that a parallel
/// test spawns at that moment holds a copy of the probe's socket until its
/// `exec` closes it. Such a port is passed over for the next one.
async fn start_on_reserved_port(cfg: SimHostConfig) -> SimHost {
    for _ in 0..8 {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], super::reserved_port()));
        match SimHost::start(cfg.clone(), addr).await {
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
            started => return started.expect("simhost starts"),
        }
    }
    panic!("eight reserved ports in a row were taken when bound")
}

impl TestRelay {
    /// Starts `hosts` and a relay in front of them; `extra` is appended to
    /// the generated TOML config. Waits until every watch link is up.
    pub async fn start(hosts: Vec<SimHostConfig>, extra: &str) -> Self {
        Self::start_with(hosts, "", extra).await
    }

    /// Like [`TestRelay::start`], with `auth_extra` TOML inside `[auth]`.
    pub async fn start_with(hosts: Vec<SimHostConfig>, auth_extra: &str, extra: &str) -> Self {
        let me = Self::start_unchecked(hosts, auth_extra, extra).await;
        me.wait_hosts_up().await;
        me
    }

    /// Starts hosts and relay without waiting for the watch links (for
    /// hosts that are expected never to come up).
    pub async fn start_unchecked(hosts: Vec<SimHostConfig>, auth_extra: &str, extra: &str) -> Self {
        Self::start_tweaked(hosts, auth_extra, extra, |_| {}).await
    }

    /// Like [`TestRelay::start_unchecked`], letting `tweak` adjust the
    /// loaded configuration first (for settings of the generated `[relay]`
    /// table, which `extra` cannot reopen).
    pub async fn start_tweaked(
        hosts: Vec<SimHostConfig>,
        auth_extra: &str,
        extra: &str,
        tweak: impl FnOnce(&mut RelayConfig),
    ) -> Self {
        Self::start_on_store(hosts, auth_extra, extra, tweak, None).await
    }

    /// Like [`TestRelay::start_tweaked`], on `store` (when given) instead
    /// of the dev kit's store file.
    pub async fn start_on_store(
        hosts: Vec<SimHostConfig>,
        auth_extra: &str,
        extra: &str,
        tweak: impl FnOnce(&mut RelayConfig),
        store: Option<Arc<dyn ahp_relay::names::store::UriStore>>,
    ) -> Self {
        // On reserved ports: a test may stop a host and start it again on
        // its address, which no `bind(…:0)` of a parallel test may take.
        let mut started = Vec::new();
        for cfg in hosts {
            started.push(start_on_reserved_port(cfg).await);
        }
        let kit = DevKit::create(&scratch_dir("relay")).expect("dev kit");
        let pairs: Vec<(String, String)> = started
            .iter()
            .map(|h| (h.config().name.clone(), h.url()))
            .collect();
        let mut cfg = kit
            .config("127.0.0.1:0", &pairs, auth_extra, extra)
            .expect("config validates");
        tweak(&mut cfg);
        let relay = match store {
            Some(store) => ahp_relay::run::start_with_store(cfg, store).await,
            None => ahp_relay::run::start(cfg).await,
        };
        Self {
            relay: relay.expect("relay starts"),
            hosts: started,
            kit,
        }
    }

    /// Stops the relay, waits until it is gone (it holds the store file),
    /// and starts a new one from the same directory and hosts.
    pub async fn restart(self) -> Self {
        let TestRelay { relay, hosts, kit } = self;
        let first = std::sync::Arc::downgrade(&relay.relay);
        relay.stop();
        super::wait_until("the first relay is dropped", || first.strong_count() == 0).await;
        let pairs: Vec<(String, String)> = hosts
            .iter()
            .map(|h| (h.config().name.clone(), h.url()))
            .collect();
        let cfg = kit
            .config("127.0.0.1:0", &pairs, "", "")
            .expect("same config");
        // The last `Arc<Relay>` may still be dropping its store on another
        // thread (an edge thread) when the weak count reads 0: retry while
        // the file is locked.
        let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let relay = loop {
            match ahp_relay::run::start(cfg.clone()).await {
                Ok(r) => break r,
                Err(ahp_relay::run::StartError::Store(_)) if std::time::Instant::now() < end => {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
                Err(e) => panic!("relay restarts on the same directory: {e}"),
            }
        };
        let t = TestRelay { relay, hosts, kit };
        t.wait_hosts_up().await;
        t
    }

    /// A replica of this relay in a process of its own (§12.1; one process
    /// per relay, as the watch link's client id is per process): the same
    /// relay secret, token keys, certificate and hosts, `extra` appended to
    /// its config as for [`TestRelay::start`], and `store_lines` in place of
    /// its `[relay] store` line (e.g. a shared PostgreSQL store).
    pub fn replica_process(&self, extra: &str, store_lines: &str) -> ServedRelay {
        self.replica_process_on("127.0.0.1:0", extra, store_lines)
    }

    /// [`TestRelay::replica_process`] listening on `listen` (a fixed port
    /// lets a load balancer's server line survive the replica's restart).
    pub fn replica_process_on(&self, listen: &str, extra: &str, store_lines: &str) -> ServedRelay {
        let dir = scratch_dir("replica");
        std::fs::create_dir_all(&dir).expect("replica directory");
        std::fs::copy(self.kit.dir.join("relay.secret"), dir.join("relay.secret"))
            .expect("the relay secret is shared");
        let kit = DevKit {
            dir: dir.clone(),
            ..self.kit.clone()
        };
        let pairs: Vec<(String, String)> = self
            .hosts
            .iter()
            .map(|h| (h.config().name.clone(), h.url()))
            .collect();
        kit.config(listen, &pairs, "", extra)
            .expect("config validates");
        let path = dir.join("relay.toml");
        let own_store = format!("store = \"{}\"", dir.join("uris.redb").display());
        let text = std::fs::read_to_string(&path).expect("replica config");
        assert!(text.contains(&own_store), "{text}");
        std::fs::write(&path, text.replace(&own_store, store_lines)).expect("replica config");
        serve_binary(&kit, "info")
    }

    /// A raw TLS WebSocket as `sub` through the relay at `url` (a replica
    /// of this one: same certificate and token keys).
    pub async fn raw_at(&self, url: &str, sub: &str) -> super::RawWs {
        let options = DialOptions {
            url: url.to_owned(),
            ..self.dial_options(Some(self.token(sub)))
        };
        let ws = dial_stream(&options)
            .await
            .expect("raw websocket through the replica");
        super::RawWs::from_stream(ws)
    }

    /// Waits until every host's watch link is up.
    pub async fn wait_hosts_up(&self) {
        let relay = self.relay.relay.clone();
        super::wait_until("watch links up", || {
            relay
                .hubs()
                .all(|h| h.status() == ahp_relay::upstream::hub::HostStatus::Up)
        })
        .await;
    }

    /// The relay's session of (`sub`, `client_id`); panics if it has none.
    pub fn session(&self, sub: &str, client_id: &str) -> Arc<ClientSession> {
        self.relay
            .relay
            .session_of(&super::session_key(sub, client_id))
            .unwrap_or_else(|| panic!("the relay has the session of {sub}/{client_id}"))
    }

    /// Whether the relay still holds a session record for (`sub`, `client_id`).
    pub fn has_session(&self, sub: &str, client_id: &str) -> bool {
        self.relay
            .relay
            .session_of(&super::session_key(sub, client_id))
            .is_some()
    }

    /// Client requests of `method` the relay has started to handle (its
    /// `client_requests_total` counter): a request counted here has been
    /// read, whether or not it is answered yet.
    pub fn requests_handled(&self, method: &str) -> u64 {
        self.relay
            .relay
            .metrics
            .client_requests
            .with_label_values(&[method])
            .get()
    }

    /// The upstream client id of (`sub`, `client_id`) at the hosts.
    pub fn upstream_id(&self, sub: &str, client_id: &str) -> String {
        self.relay
            .relay
            .upstream_id(&super::principal(sub), client_id)
    }

    /// `wss://localhost:<port>/`.
    pub fn url(&self) -> String {
        format!("wss://localhost:{}/", self.relay.addr.port())
    }

    /// A 1-hour dev token for `sub`.
    pub fn token(&self, sub: &str) -> String {
        self.kit
            .token(sub, &[], Duration::from_secs(3600), None)
            .expect("token")
    }

    /// Dial options with `token` as bearer header, trusting the relay's certificate.
    pub fn dial_options(&self, token: Option<String>) -> DialOptions {
        DialOptions {
            url: self.url(),
            token,
            ca_file: Some(self.kit.cert.clone()),
            insecure: false,
            connect_timeout: WAIT,
            extra_headers: Vec::new(),
        }
    }

    /// The official client connected through TLS as `sub` (not initialized).
    pub async fn client(&self, sub: &str) -> Client {
        let config = ClientConfig {
            default_request_timeout: Some(WAIT),
            subscription_buffer: 1 << 16,
        };
        connect_client(&self.dial_options(Some(self.token(sub))), config)
            .await
            .expect("client connects through the relay")
    }

    /// The official client connected and initialized as (`sub`, `client_id`).
    pub async fn client_init(&self, sub: &str, client_id: &str) -> Client {
        let c = self.client(sub).await;
        c.initialize(client_id.into(), vec!["1.0.0".into()], vec![])
            .await
            .expect("initialize through the relay");
        c
    }

    /// An upgrade to `/<path_and_query>` with `headers`, over TLS trusting the relay's cert.
    pub async fn upgrade(&self, path_and_query: &str, headers: &[(HeaderName, &str)]) -> Upgrade {
        let url = format!(
            "wss://localhost:{}/{path_and_query}",
            self.relay.addr.port()
        );
        let connector = Connector::Rustls(Arc::new(trusting(&self.kit.cert)));
        upgrade_at(&url, headers, Some(connector)).await
    }

    /// A plain-HTTP upgrade to `/<path_and_query>` on the admin listener with `headers`.
    pub async fn admin_upgrade(
        &self,
        path_and_query: &str,
        headers: &[(HeaderName, &str)],
    ) -> Upgrade {
        let url = format!("ws://{}/{path_and_query}", self.relay.admin_addr());
        upgrade_at(&url, headers, None).await
    }

    /// An upgrade carrying `token` as `Authorization: Bearer`.
    pub async fn upgrade_bearer(&self, token: &str) -> Upgrade {
        self.upgrade("", &[(AUTHORIZATION, &format!("Bearer {token}"))])
            .await
    }

    /// A raw TLS WebSocket through the relay as `sub` whose socket receive
    /// buffer is fixed at `rcvbuf` bytes before it connects, which turns the
    /// kernel's autotuning off: once it stops reading, its kernel takes at
    /// most about that much more (plus the relay's send buffer), whatever
    /// sizes the relay writes in.
    pub async fn raw_small_window(&self, sub: &str, rcvbuf: u32) -> super::RawWs {
        let url = format!("wss://localhost:{}/", self.relay.addr.port());
        let mut req = url.into_client_request().expect("request");
        let bearer = format!("Bearer {}", self.token(sub));
        let bearer = HeaderValue::from_str(&bearer).expect("token");
        req.headers_mut().insert(AUTHORIZATION, bearer);
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.set_recv_buffer_size(rcvbuf).expect("SO_RCVBUF");
        let tcp = socket.connect(self.relay.addr).await.expect("connect");
        tcp.set_nodelay(true).expect("nodelay");
        let connector = Connector::Rustls(Arc::new(trusting(&self.kit.cert)));
        let tcp = tokio::io::BufReader::new(tcp);
        let upgrade =
            tokio_tungstenite::client_async_tls_with_config(req, tcp, None, Some(connector));
        let (ws, _) = upgrade.await.expect("raw websocket through the relay");
        super::RawWs::from_stream(ws)
    }

    /// A raw TLS WebSocket through the relay as `sub`.
    pub async fn raw(&self, sub: &str) -> super::RawWs {
        let ws = dial_stream(&self.dial_options(Some(self.token(sub))))
            .await
            .expect("raw websocket through the relay");
        super::RawWs::from_stream(ws)
    }

    /// `sub`, as client `client_id`, subscribes `chat` and runs a whole turn
    /// `turn_id` on it (until its `chat/turnComplete` echo); returns the
    /// socket, still open.
    pub async fn run_turn(
        &self,
        (sub, client_id): (&str, &str),
        chat: &str,
        turn_id: &str,
    ) -> super::RawWs {
        let mut ws = self.raw(sub).await;
        ws.initialize(client_id).await;
        ws.request(1, "subscribe", serde_json::json!({"channel": chat}))
            .await;
        ws.dispatch(chat, 1, super::turn_started(turn_id, "hello"))
            .await;
        super::raw_actions_until(&mut ws, |e| super::is(e, chat, "chat/turnComplete")).await;
        ws
    }
}

/// An upgrade to `url` with `headers` added, through `connector` (TLS) when given.
pub async fn upgrade_at(
    url: &str,
    headers: &[(HeaderName, &str)],
    connector: Option<Connector>,
) -> Upgrade {
    let mut req = url.into_client_request().expect("request");
    for (name, value) in headers {
        let value = HeaderValue::from_str(value).expect("header value");
        // `Host` replaces the URL's; other headers add to what is there.
        if name == tokio_tungstenite::tungstenite::http::header::HOST {
            req.headers_mut().insert(name.clone(), value);
        } else {
            req.headers_mut().append(name.clone(), value);
        }
    }
    let attempt = async {
        let uri = req.uri();
        let addr = format!(
            "{}:{}",
            uri.host().expect("host"),
            uri.port_u16().expect("port")
        );
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let tcp = tokio::io::BufReader::new(tcp);
        tokio_tungstenite::client_async_tls_with_config(req, tcp, None, connector).await
    };
    match tokio::time::timeout(WAIT, attempt)
        .await
        .expect("upgrade answered in time")
    {
        Ok((ws, resp)) => Upgrade {
            status: resp.status().as_u16(),
            headers: resp.headers().clone(),
            body: Vec::new(),
            ws: Some(RawWs::from_stream(ws)),
        },
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => Upgrade {
            status: resp.status().as_u16(),
            headers: resp.headers().clone(),
            body: resp.body().clone().unwrap_or_default(),
            ws: None,
        },
        Err(e) => panic!("upgrade failed below HTTP: {e}"),
    }
}

/// What one upgrade attempt got: the status and headers, the body of a refusal, and the
/// socket when it was switched.
pub struct Upgrade {
    /// The HTTP status (101 when switched).
    pub status: u16,
    /// The response headers.
    pub headers: HeaderMap,
    /// The body of a refusal (empty when switched).
    pub body: Vec<u8>,
    /// The socket, when switched.
    pub ws: Option<RawWs>,
}

impl Upgrade {
    /// The value of header `name`, if present.
    pub fn header(&self, name: &HeaderName) -> Option<&str> {
        self.headers
            .get(name)
            .map(|v| v.to_str().expect("ASCII header"))
    }

    /// The socket; panics unless the upgrade was accepted.
    pub fn socket(self, what: &str) -> RawWs {
        assert_eq!(self.status, 101, "{what}: upgrade accepted");
        self.ws.expect("socket")
    }
}

/// A rustls client configuration trusting exactly the certificates of `pem`.
pub fn trusting(pem: &Path) -> rustls::ClientConfig {
    let bytes = std::fs::read(pem).expect("cert file");
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&bytes) {
        roots.add(cert.expect("PEM cert")).expect("root added");
    }
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth()
}

/// `GET path` over TLS (trusting the relay's cert); the status and body.
pub async fn https_get(t: &TestRelay, path: &str) -> (u16, String) {
    tokio::time::timeout(WAIT, https_at(t.relay.addr.port(), &t.kit.cert, path))
        .await
        .expect("HTTP answer in time")
        .expect("HTTP answer")
}

/// The status of `GET path` on `https://localhost:<port>` trusting `ca`, or
/// `None` if nothing answered (e.g. the relay has exited).
pub async fn https_status(port: u16, ca: &std::path::Path, path: &str) -> Option<u16> {
    tokio::time::timeout(WAIT, https_at(port, ca, path))
        .await
        .ok()
        .flatten()
        .map(|(status, _)| status)
}

/// `GET path` over TLS on loopback `port`: status and body, or `None` if
/// the connection, handshake or answer failed.
async fn https_at(port: u16, ca: &std::path::Path, path: &str) -> Option<(u16, String)> {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(trusting(ca)));
    let name = ServerName::try_from("localhost").ok()?;
    let tls = connector.connect(name, tcp).await.ok()?;
    get_on(tls, path).await
}

/// `GET path` on the relay's admin listener (plain HTTP); the status and body.
pub async fn admin_get(t: &TestRelay, path: &str) -> (u16, String) {
    admin_get_with(t, path, &[]).await
}

/// `GET path` on the relay's admin listener with `headers` (a `Host` among
/// them replaces `localhost`); the status and body.
pub async fn admin_get_with(t: &TestRelay, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    tokio::time::timeout(WAIT, http_at_with(t.relay.admin_addr(), path, headers))
        .await
        .expect("admin answer in time")
        .expect("admin answer")
}

/// `GET path` on the relay's admin listener as `sub` (a bearer token of
/// theirs); the status and body.
pub async fn admin_get_as(t: &TestRelay, sub: &str, path: &str) -> (u16, String) {
    let bearer = format!("Bearer {}", t.token(sub));
    admin_get_with(t, path, &[("Authorization", &bearer)]).await
}

/// `GET path` over plain HTTP at `addr`: status and body, or `None` if the
/// connection or answer failed.
pub async fn http_at(addr: std::net::SocketAddr, path: &str) -> Option<(u16, String)> {
    get_on(TcpStream::connect(addr).await.ok()?, path).await
}

/// `GET path` with `headers` over plain HTTP at `addr`: status and body, or
/// `None` if the connection or answer failed.
pub async fn http_at_with(
    addr: std::net::SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> Option<(u16, String)> {
    get_with(TcpStream::connect(addr).await.ok()?, path, headers).await
}

/// Sends `GET path` on `io` and reads the answer until the server closes.
async fn get_on<S>(io: S, path: &str) -> Option<(u16, String)>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    get_with(io, path, &[]).await
}

/// Sends `GET path` with `headers` on `io` and reads the answer until the
/// server closes.
async fn get_with<S>(mut io: S, path: &str, headers: &[(&str, &str)]) -> Option<(u16, String)>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut head = String::new();
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        head.push_str("Host: localhost\r\n");
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    let req = format!("GET {path} HTTP/1.1\r\n{head}Connection: close\r\n\r\n");
    io.write_all(req.as_bytes()).await.ok()?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        match io.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let text = String::from_utf8(buf).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

/// The value of the sample line `name` (metric name and labels exactly) in
/// a Prometheus text page such as `/metrics`.
pub fn metric(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Panics unless every `(series, value)` of `expect` is a sample line of
/// the Prometheus text `page` with that value (within 1e-9).
pub fn assert_metrics(page: &str, expect: &[(&str, f64)]) {
    for (series, value) in expect {
        let got = metric(page, series).unwrap_or_else(|| panic!("{series} missing:\n{page}"));
        assert!(
            (got - value).abs() < 1e-9,
            "{series} = {got}, expected {value}"
        );
    }
}

/// One `[[policy.rules]]` entry; `more` is extra TOML lines for the rule.
pub fn rule(
    name: &str,
    subjects: &[&str],
    hosts: &[&str],
    role: &str,
    visibility: &str,
    more: &str,
) -> String {
    format!(
        "\n[[policy.rules]]\nname = \"{name}\"\nsubjects = {subjects:?}\nhosts = {hosts:?}\n\
         role = \"{role}\"\nvisibility = \"{visibility}\"\n{more}\n"
    )
}

/// An `ahp-relay serve` process (killed when dropped) and its stderr.
pub struct ServedRelay {
    /// The process.
    pub child: std::process::Child,
    /// Its stderr lines not read yet (read on a thread; ends when it exits).
    pub lines: std::sync::mpsc::Receiver<String>,
    /// The lines up to its announcement.
    pub head: Vec<String>,
    /// Its client URL, as `wss://localhost:<port>/`.
    pub url: String,
}

impl ServedRelay {
    /// Sends SIGTERM (drain, §8.3) and waits, bounded by [`WAIT`] plus the
    /// drain window, for the process to exit; its status.
    pub fn terminate(&mut self, drain_window: std::time::Duration) -> std::process::ExitStatus {
        let term = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(term.success(), "SIGTERM sent");
        let deadline = std::time::Instant::now() + WAIT + drain_window;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the relay ignored SIGTERM"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Stops the process and returns every line it wrote.
    pub fn output(mut self) -> Vec<String> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut all = std::mem::take(&mut self.head);
        all.extend(self.lines.iter());
        all
    }
}

impl Drop for ServedRelay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the `ahp-relay` binary (`serve`, text logs) on the config in
/// `kit` with `RUST_LOG=rust_log`, and waits until it says where it listens.
pub fn serve_binary(kit: &DevKit, rust_log: &str) -> ServedRelay {
    serve_binary_with_env(kit, rust_log, &[])
}

/// [`serve_binary`] with `env` set in its environment. The `OTEL_*`
/// variables of the test's own environment are not passed on: a relay
/// exports traces only when its test asks.
pub fn serve_binary_with_env(kit: &DevKit, rust_log: &str, env: &[(&str, &str)]) -> ServedRelay {
    use std::io::BufRead;
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_ahp-relay"));
    command
        .args(["serve", "--config"])
        .arg(kit.dir.join("relay.toml"))
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .env("RUST_LOG", rust_log);
    for (name, _) in std::env::vars().filter(|(name, _)| name.starts_with("OTEL_")) {
        command.env_remove(name);
    }
    let mut child = command
        .envs(env.iter().copied())
        .spawn()
        .expect("relay binary starts");
    let stderr = child.stderr.take();
    let (tx, lines) = std::sync::mpsc::channel();
    // Killed and waited for when dropped, also if it never announces.
    let mut served = ServedRelay {
        child,
        lines,
        head: Vec::new(),
        url: String::new(),
    };
    let stderr = stderr.expect("stderr");
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    loop {
        let Ok(line) = served.lines.recv_timeout(WAIT) else {
            panic!("the relay did not say where it listens: {:#?}", served.head);
        };
        let url = line
            .strip_prefix("ahp-relay listening on ")
            .map(|u| u.replace("127.0.0.1", "localhost"));
        served.head.push(line);
        if let Some(url) = url {
            served.url = url;
            return served;
        }
    }
}

/// Stops a running `ahp-relay demo` as Ctrl-C does and checks that it
/// leaves nothing behind: it exits with success and removes its key folder
/// (the folder of `AHP_RELAY_CA` in `env_file`) and `env_file`.
pub async fn stop_demo(demo: &mut tokio::process::Child, env_file: &Path) {
    let vars = std::fs::read_to_string(env_file).expect("the demo's env file");
    let ca = vars
        .lines()
        .find_map(|l| l.strip_prefix("export AHP_RELAY_CA="))
        .expect("AHP_RELAY_CA in the env file");
    let dir = Path::new(ca.trim_matches(['\'', '"']))
        .parent()
        .expect("the demo's key folder")
        .to_path_buf();
    assert!(dir.is_dir(), "{} exists while the demo runs", dir.display());
    let pid = demo.id().expect("the demo still runs");
    let sent = std::process::Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(sent.success(), "SIGINT sent to the demo");
    let status = tokio::time::timeout(WAIT, demo.wait())
        .await
        .expect("the demo stops on Ctrl-C")
        .expect("the demo's exit status");
    assert!(
        status.success(),
        "the demo exits cleanly on Ctrl-C: {status}"
    );
    assert!(!dir.exists(), "the demo removed {}", dir.display());
    assert!(
        !env_file.exists(),
        "the demo removed {}",
        env_file.display()
    );
}

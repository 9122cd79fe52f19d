//! Opening an AHP WebSocket connection with bearer auth and custom TLS trust.
//!
//! [`dial`] performs the whole upgrade (TCP, optional TLS, HTTP upgrade) with
//! `tokio-tungstenite` and hands back an [`ahp_ws::WebSocketTransport`];
//! [`connect_client`] additionally starts an [`ahp::Client`] on it. Neither
//! function sends any AHP message: `initialize` is the caller's business.
//!
//! [`dial_host`] is the relay's dial of a host link: the same TCP, TLS,
//! request and error classification, but the upgrade is written and its
//! answer read here, so that what the host sends right behind its `101`
//! stays in the read buffer of the [`HostSocket`] it returns (tungstenite
//! keeps such bytes in a buffer of its own that its stream cannot give up).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Error as WsError;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::error::{CapacityError, ProtocolError, SubProtocolError};
use tokio_tungstenite::tungstenite::handshake::client::{Request, Response, generate_request};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::handshake::machine::TryParse;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::http::header::AUTHORIZATION;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::{
    Connector, MaybeTlsStream, client_async_tls_with_config, connect_async_tls_with_config,
};

use super::frames::{FrameLimits, HostIo, HostSocket};

/// Where and how to connect.
///
/// The token is never part of any error message, log line or `Debug` output.
#[derive(Clone)]
pub struct DialOptions {
    /// `ws://` or `wss://` URL of the AHP endpoint.
    pub url: String,
    /// Bearer token sent as `Authorization: Bearer <token>` on the upgrade request.
    pub token: Option<String>,
    /// PEM file whose certificates are the only trust anchors for `wss://`
    /// (ignored for `ws://` and when `insecure` is set).
    pub ca_file: Option<PathBuf>,
    /// Accept any server certificate for `wss://` (handshake signatures are still checked).
    pub insecure: bool,
    /// Upper bound for TCP connect + TLS handshake + HTTP upgrade together.
    pub connect_timeout: Duration,
    /// Extra headers on the upgrade request (e.g. the relay's end-user
    /// identity headers towards a host). Never secrets: they may be logged.
    pub extra_headers: Vec<(String, String)>,
}

impl fmt::Debug for DialOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DialOptions")
            .field("url", &self.url)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("ca_file", &self.ca_file)
            .field("insecure", &self.insecure)
            .field("connect_timeout", &self.connect_timeout)
            .field("extra_headers", &self.extra_headers)
            .finish()
    }
}

/// Credentials a relay presents to a host besides the bearer token of
/// [`DialOptions`]; the caller reads them from their files at dial time.
/// Never logged: `Debug` shows only whether each is set.
#[derive(Clone, Default)]
pub struct Credentials {
    /// Sent as the `tkn` query parameter of the upgrade request (VS Code's
    /// agent host connection token). Errors never show the URL with it.
    pub query_token: Option<String>,
    /// PEM client certificate chain and private key files for mutual TLS.
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field(
                "query_token",
                &self.query_token.as_ref().map(|_| "<redacted>"),
            )
            .field("client_cert", &self.client_cert.is_some())
            .finish()
    }
}

/// Why a connection could not be opened. Messages never contain the token.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// The URL does not parse or is not `ws://` / `wss://` with a host.
    #[error("invalid URL {url:?}: {reason}")]
    BadUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The `--ca` file could not be read.
    #[error("cannot read CA file {}: {source}", path.display())]
    CaUnreadable {
        /// The CA file path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The `--ca` file is not valid PEM or holds an unusable certificate.
    #[error("invalid CA file {}: {reason}", path.display())]
    CaInvalid {
        /// The CA file path.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The `--ca` file holds no `CERTIFICATE` PEM block.
    #[error("CA file {} contains no certificates", path.display())]
    CaEmpty {
        /// The CA file path.
        path: PathBuf,
    },
    /// The rustls client configuration could not be built.
    #[error("cannot build TLS configuration: {0}")]
    TlsConfig(#[source] rustls::Error),
    /// The token contains characters not allowed in an HTTP header.
    #[error("the bearer token is not a valid HTTP header value")]
    InvalidToken,
    /// TCP connect (or another I/O step) failed.
    #[error("cannot connect to {url}: {source}")]
    Connect {
        /// The URL being dialled.
        url: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The TLS handshake failed (e.g. untrusted certificate, name mismatch).
    #[error("TLS handshake with {url} failed: {reason}")]
    Tls {
        /// The URL being dialled.
        url: String,
        /// The TLS failure.
        reason: String,
    },
    /// The server answered the upgrade request with a non-101 HTTP status.
    /// Its reason (the response body, one line) and `retry-after` are
    /// shown when the server sent them.
    #[error("upgrade refused: HTTP {status}{}{}", reason_suffix(.reason), retry_suffix(.retry_after))]
    UpgradeRefused {
        /// The HTTP status code (e.g. 401).
        status: u16,
        /// The response body as one line of text, if the server sent one.
        reason: Option<String>,
        /// The `retry-after` header, if the server sent one.
        retry_after: Option<String>,
    },
    /// The WebSocket handshake failed for another reason.
    #[error("WebSocket handshake with {url} failed: {reason}")]
    Handshake {
        /// The URL being dialled.
        url: String,
        /// The failure.
        reason: String,
    },
    /// The whole dial did not finish within [`DialOptions::connect_timeout`].
    #[error("connecting to {url} timed out after {timeout:?}")]
    Timeout {
        /// The URL being dialled.
        url: String,
        /// The limit that was exceeded.
        timeout: Duration,
    },
    /// The mTLS client certificate or key could not be loaded.
    #[error("invalid client certificate or key {}: {reason}", path.display())]
    ClientCert {
        /// The certificate or key file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A credential file could not be read.
    #[error("cannot read the {what} file {}: {source}", path.display())]
    CredentialUnreadable {
        /// Which credential (`token`, `query token`).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A configured host could not be reached: names the host id only,
    /// never its URL (which may carry a query) or a credential.
    #[error("host {host}: {reason}")]
    Host {
        /// The host id.
        host: String,
        /// What failed, without the URL.
        reason: String,
    },
    /// The `ahp::Client` could not be started on the new transport.
    #[error("cannot start the AHP client: {0}")]
    Client(#[source] ahp::ClientError),
}

impl DialError {
    /// This error for host `host`: [`DialError::Host`] with a reason that
    /// leaves out the URL (a host's URL may carry a query token).
    pub fn for_host(self, host: &str) -> DialError {
        let reason = match self {
            DialError::BadUrl { reason, .. } => format!("invalid URL: {reason}"),
            DialError::Connect { source, .. } => format!("cannot connect: {source}"),
            DialError::Tls { reason, .. } => format!("TLS handshake failed: {reason}"),
            DialError::Handshake { reason, .. } => format!("WebSocket handshake failed: {reason}"),
            DialError::Timeout { timeout, .. } => format!("connecting timed out after {timeout:?}"),
            DialError::Host { reason, .. } => reason,
            other => other.to_string(),
        };
        DialError::Host {
            host: host.to_string(),
            reason,
        }
    }
}

/// Open a WebSocket to `opts.url` and wrap it as an AHP transport.
///
/// Guarantees: the URL is validated and the TLS trust (CA file or
/// webpki roots) is loaded before any network I/O; the bearer token (if any)
/// is sent only as the `Authorization` header of the upgrade request; a
/// refused upgrade yields [`DialError::UpgradeRefused`] with its status code;
/// the whole dial is bounded by `opts.connect_timeout`.
pub async fn dial(opts: &DialOptions) -> Result<ahp_ws::WebSocketTransport, DialError> {
    let (request, config, connector) = prepare(opts, &Credentials::default(), None)?;
    let handshake = connect_async_tls_with_config(request, Some(config), true, Some(connector));
    bounded(opts, handshake)
        .await
        .map(|(ws, _)| ahp_ws::WebSocketTransport::from_stream(ws))
}

/// A WebSocket opened by [`dial_stream`] (tungstenite): TLS (for `wss`)
/// over a TCP stream read through a [`SOCKET_READ_BYTES`] buffer.
pub type WsStream = tokio_tungstenite::WebSocketStream<MaybeTlsStream<BufReader<TcpStream>>>;

/// Like [`dial`] but returns the raw tungstenite WebSocket, for callers
/// that frame JSON-RPC themselves (the connector, tests). Same guarantees.
/// The relay's own host links use [`dial_host`].
pub async fn dial_stream(opts: &DialOptions) -> Result<WsStream, DialError> {
    dial_stream_with(opts, &Credentials::default()).await
}

/// [`dial_stream`] presenting `creds` too: the `tkn` query parameter is
/// added to the request (not to `opts.url`, which errors show) and the
/// client certificate to the TLS handshake.
pub async fn dial_stream_with(
    opts: &DialOptions,
    creds: &Credentials,
) -> Result<WsStream, DialError> {
    dial_stream_capped(opts, creds, (None, SOCKET_READ_BYTES)).await
}

/// Bytes a WebSocket read asks the socket for at most (see [`dial_stream_capped`]).
const READ_BUFFER_BYTES: usize = 16 * 1024;

/// Bytes one `recv` from a host may take by default
/// (`upstream_read_buffer_bytes`): the read buffer of a host link's
/// [`HostSocket`], and the buffer a [`WsStream`] reads the socket through
/// (tungstenite reads into what is left of its current chunk, often 2–4
/// KiB; through a buffer this size one `recv` takes everything the socket
/// holds, and tungstenite's small reads become copies from memory).
pub const SOCKET_READ_BYTES: usize = 64 * 1024;

/// The request's host name, an IPv6 literal without the brackets a URI
/// puts around it (neither a socket address nor a TLS name has them).
fn request_host(request: &Request) -> Result<&str, WsError> {
    use tokio_tungstenite::tungstenite::error::UrlError;
    let host = request
        .uri()
        .host()
        .ok_or(WsError::Url(UrlError::NoHostName))?;
    Ok(host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host))
}

/// Connects TCP to the request's host (Nagle off).
async fn tcp_connect(request: &Request) -> Result<TcpStream, WsError> {
    let uri = request.uri();
    let host = request_host(request)?;
    let port = uri
        .port_u16()
        .unwrap_or(if uri.scheme_str() == Some("wss") {
            443
        } else {
            80
        });
    let tcp = TcpStream::connect((host, port)).await?;
    tcp.set_nodelay(true)?;
    Ok(tcp)
}

/// [`dial_stream_with`] whose WebSocket refuses any message or frame over
/// `max_message_bytes` (`None`: tungstenite's defaults, 64 MiB messages and
/// 16 MiB frames). The refusal happens when the frame header is read,
/// before its payload is buffered, and ends the connection with an error:
/// a host that sends more than the relay accepts loses that connection,
/// not the relay's memory.
pub async fn dial_stream_capped(
    opts: &DialOptions,
    creds: &Credentials,
    (max_message_bytes, read_buffer_bytes): (Option<usize>, usize),
) -> Result<WsStream, DialError> {
    let (request, config, connector) = prepare(opts, creds, max_message_bytes)?;
    let handshake = async {
        let tcp = BufReader::with_capacity(read_buffer_bytes, tcp_connect(&request).await?);
        client_async_tls_with_config(request, tcp, Some(config), Some(connector)).await
    };
    bounded(opts, handshake).await.map(|(ws, _)| ws)
}

/// Opens a host link's WebSocket: [`dial_stream_with`]'s TCP, TLS, upgrade
/// request, timeout and errors, read and written by our own codec
/// ([`HostSocket`], client role) with `limits`. The upgrade is written and
/// its answer parsed here, so frames the host sends right behind its `101`
/// are already in the socket's read buffer, not lost.
pub async fn dial_host(
    opts: &DialOptions,
    creds: &Credentials,
    limits: FrameLimits,
) -> Result<HostSocket, DialError> {
    let (request, tls) = prepare_request(opts, creds)?;
    let handshake = async {
        let tcp = tcp_connect(&request).await?;
        let io: Box<dyn HostIo> = match tls {
            Some(config) => Box::new(tls_connect(config, &request, tcp).await?),
            None => Box::new(tcp),
        };
        upgrade(io, request, limits).await
    };
    bounded(opts, handshake).await
}

/// The TLS handshake to the request's host, as tokio-tungstenite does it
/// (so its failures classify the same way).
async fn tls_connect(
    config: Arc<rustls::ClientConfig>,
    request: &Request,
    tcp: TcpStream,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, WsError> {
    use tokio_tungstenite::tungstenite::error::TlsError;
    let name = ServerName::try_from(request_host(request)?.to_string())
        .map_err(|_| WsError::Tls(TlsError::InvalidDnsName))?;
    tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(WsError::Io)
}

/// Largest upgrade answer head accepted from a host.
const MAX_RESPONSE_HEAD: usize = 64 * 1024;

/// Writes the upgrade `request` on `io` and reads the answer's head into
/// the read buffer of the returned socket: whatever follows the head stays
/// there. A refusal carries the bytes read past its head as its body, as
/// tungstenite's does.
async fn upgrade(
    mut io: Box<dyn HostIo>,
    request: Request,
    limits: FrameLimits,
) -> Result<HostSocket, WsError> {
    let (head, key) = generate_request(request)?;
    io.write_all(&head).await?;
    io.flush().await?;
    let accept = derive_accept_key(key.as_bytes());
    let mut read = bytes::BytesMut::with_capacity(limits.read_buffer_bytes);
    loop {
        if let Some((n, response)) = Response::try_parse(&read)? {
            let _ = read.split_to(n);
            accepted(response, &accept, &read)?;
            return Ok(HostSocket::with_read_ahead(io, Role::Client, limits, read));
        }
        if read.len() >= MAX_RESPONSE_HEAD {
            return Err(CapacityError::TooManyHeaders.into());
        }
        if io.read_buf(&mut read).await? == 0 {
            return Err(ProtocolError::HandshakeIncomplete.into());
        }
    }
}

/// Checks an upgrade answer as RFC 6455 §4.1 asks of a client (what
/// tungstenite checks, and that no extension was imposed): anything but
/// `101` is [`WsError::Http`] with `tail` as its body.
fn accepted(mut response: Response, accept: &str, tail: &[u8]) -> Result<(), WsError> {
    if response.status() != http::StatusCode::SWITCHING_PROTOCOLS {
        *response.body_mut() = Some(tail.to_vec());
        return Err(WsError::Http(Box::new(response)));
    }
    let headers = response.headers();
    let is = |name: &str, want: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case(want))
    };
    if !is("upgrade", "websocket") {
        return Err(ProtocolError::MissingUpgradeWebSocketHeader.into());
    }
    if !is("connection", "upgrade") {
        return Err(ProtocolError::MissingConnectionUpgradeHeader.into());
    }
    if headers
        .get("sec-websocket-accept")
        .is_none_or(|v| v.as_bytes() != accept.as_bytes())
    {
        return Err(ProtocolError::SecWebSocketAcceptKeyMismatch.into());
    }
    if headers.contains_key("sec-websocket-protocol") {
        return Err(ProtocolError::SecWebSocketSubProtocolError(
            SubProtocolError::ServerSentSubProtocolNoneRequested,
        )
        .into());
    }
    if headers.contains_key("sec-websocket-extensions") {
        let name = http::HeaderName::from_static("sec-websocket-extensions");
        return Err(ProtocolError::InvalidHeader(Box::new(name)).into());
    }
    Ok(())
}

/// The upgrade request, WebSocket limits and TLS connector of a dial, all
/// checked before any network I/O.
fn prepare(
    opts: &DialOptions,
    creds: &Credentials,
    max_message_bytes: Option<usize>,
) -> Result<(Request, WebSocketConfig, Connector), DialError> {
    let (request, tls) = prepare_request(opts, creds)?;
    let connector = tls.map_or(Connector::Plain, Connector::Rustls);
    // tungstenite zero-fills its whole free read buffer before every read
    // (128 KiB by default): with a 16 KiB chunk a link that reads one small
    // frame at a time pays 16 KiB of `memset`, not 128, and an idle link
    // holds 16 KiB; the buffer still grows for a larger frame.
    let mut config = WebSocketConfig::default().read_buffer_size(READ_BUFFER_BYTES);
    if let Some(n) = max_message_bytes {
        config = config.max_message_size(Some(n)).max_frame_size(Some(n));
    }
    Ok((request, config, connector))
}

/// The upgrade request (bearer header, query token) and, for `wss`, the
/// TLS configuration of a dial, both checked before any network I/O.
fn prepare_request(
    opts: &DialOptions,
    creds: &Credentials,
) -> Result<(Request, Option<Arc<rustls::ClientConfig>>), DialError> {
    let mut request = upgrade_request(opts)?;
    if let Some(token) = &creds.query_token {
        add_query_token(&mut request, token)?;
    }
    let tls = if request.uri().scheme_str() == Some("wss") {
        Some(Arc::new(tls_config(opts, creds)?))
    } else {
        None
    };
    Ok((request, tls))
}

/// Runs `handshake` within `opts.connect_timeout`, its failure classified.
async fn bounded<T>(
    opts: &DialOptions,
    handshake: impl Future<Output = Result<T, WsError>>,
) -> Result<T, DialError> {
    match tokio::time::timeout(opts.connect_timeout, handshake).await {
        Err(_) => Err(DialError::Timeout {
            url: opts.url.clone(),
            timeout: opts.connect_timeout,
        }),
        Ok(Err(err)) => Err(classify_ws_error(&opts.url, err)),
        Ok(Ok(done)) => Ok(done),
    }
}

/// [`dial`], then start an [`ahp::Client`] on the transport with `config`.
///
/// No AHP request is sent; call `initialize` on the returned client.
pub async fn connect_client(
    opts: &DialOptions,
    config: ahp::ClientConfig,
) -> Result<ahp::Client, DialError> {
    let transport = dial(opts).await?;
    ahp::Client::connect(transport, config)
        .await
        .map_err(DialError::Client)
}

/// Parse and check the URL and build the upgrade request with the bearer header.
fn upgrade_request(opts: &DialOptions) -> Result<Request, DialError> {
    let bad_url = |reason: String| DialError::BadUrl {
        url: opts.url.clone(),
        reason,
    };
    let mut request = opts
        .url
        .as_str()
        .into_client_request()
        .map_err(|e| bad_url(e.to_string()))?;
    match request.uri().scheme_str() {
        Some("ws" | "wss") => {}
        _ => return Err(bad_url("scheme must be ws or wss".into())),
    }
    if request.uri().host().is_none_or(str::is_empty) {
        return Err(bad_url("missing host".into()));
    }
    if let Some(token) = &opts.token {
        let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| DialError::InvalidToken)?;
        value.set_sensitive(true);
        request.headers_mut().insert(AUTHORIZATION, value);
    }
    for (name, value) in &opts.extra_headers {
        let name = http::HeaderName::from_bytes(name.as_bytes())
            .map_err(|e| bad_url(format!("bad header name {name:?}: {e}")))?;
        let value = HeaderValue::from_str(value)
            .map_err(|e| bad_url(format!("bad value for header {name}: {e}")))?;
        request.headers_mut().insert(name, value);
    }
    Ok(request)
}

/// Appends `tkn=<token>` (percent-encoded) to the request's query.
fn add_query_token(request: &mut Request, token: &str) -> Result<(), DialError> {
    let encoded: String = token
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    let uri = request.uri();
    let path = uri.path();
    let query = match uri.query() {
        Some(q) if !q.is_empty() => format!("{q}&tkn={encoded}"),
        _ => format!("tkn={encoded}"),
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(
        format!("{path}?{query}")
            .parse()
            .map_err(|_| DialError::InvalidToken)?,
    );
    *request.uri_mut() = http::Uri::from_parts(parts).map_err(|_| DialError::InvalidToken)?;
    Ok(())
}

/// rustls client config (ring provider) with the trust policy from `opts`
/// and the client certificate of `creds`, if any.
fn tls_config(opts: &DialOptions, creds: &Credentials) -> Result<rustls::ClientConfig, DialError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(DialError::TlsConfig)?;
    let builder = if opts.insecure {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyServerCert { provider }))
    } else {
        let roots = match &opts.ca_file {
            Some(path) => roots_from_pem_file(path)?,
            None => webpki_root_store(),
        };
        builder.with_root_certificates(roots)
    };
    match &creds.client_cert {
        None => Ok(builder.with_no_client_auth()),
        Some((cert, key)) => {
            let (chain, key) = client_identity(cert, key)?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| DialError::ClientCert {
                    path: cert.clone(),
                    reason: e.to_string(),
                })
        }
    }
}

/// The certificate chain of `cert` and the private key of `key` (PEM).
fn client_identity(
    cert: &Path,
    key: &Path,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), DialError> {
    let bad = |path: &Path, reason: String| DialError::ClientCert {
        path: path.to_path_buf(),
        reason,
    };
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| bad(cert, e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(cert, e.to_string()))?;
    if chain.is_empty() {
        return Err(bad(cert, "no certificate".into()));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| bad(key, e.to_string()))?;
    Ok((chain, key))
}

/// The Mozilla root set shipped by `webpki-roots`.
fn webpki_root_store() -> RootCertStore {
    RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    }
}

/// A root store holding exactly the certificates of a PEM file (at least one).
fn roots_from_pem_file(path: &Path) -> Result<RootCertStore, DialError> {
    let pem = std::fs::read(path).map_err(|source| DialError::CaUnreadable {
        path: path.to_path_buf(),
        source,
    })?;
    let invalid = |reason: String| DialError::CaInvalid {
        path: path.to_path_buf(),
        reason,
    };
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| invalid(e.to_string()))?;
        roots.add(cert).map_err(|e| invalid(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(DialError::CaEmpty {
            path: path.to_path_buf(),
        });
    }
    Ok(roots)
}

/// Map a tungstenite failure to the most specific [`DialError`].
fn classify_ws_error(url: &str, err: WsError) -> DialError {
    match err {
        WsError::Http(response) => refused(&response),
        WsError::Io(source) => match tls_failure(&source) {
            Some(reason) => DialError::Tls {
                url: url.to_owned(),
                reason,
            },
            None => DialError::Connect {
                url: url.to_owned(),
                source,
            },
        },
        WsError::Tls(e) => DialError::Tls {
            url: url.to_owned(),
            reason: e.to_string(),
        },
        WsError::Url(e) => DialError::BadUrl {
            url: url.to_owned(),
            reason: e.to_string(),
        },
        other => DialError::Handshake {
            url: url.to_owned(),
            reason: other.to_string(),
        },
    }
}

/// Longest refusal reason kept from a response body, in characters.
const MAX_REASON_CHARS: usize = 300;

/// [`DialError::UpgradeRefused`] for a non-101 answer: its status, its body
/// (lossy UTF-8, whitespace runs folded to one space, at most
/// [`MAX_REASON_CHARS`]) and its `retry-after` header.
fn refused(
    response: &tokio_tungstenite::tungstenite::http::Response<Option<Vec<u8>>>,
) -> DialError {
    let reason = response.body().as_deref().and_then(|body| {
        let text = String::from_utf8_lossy(body);
        let line: String = text
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .chars()
            .take(MAX_REASON_CHARS)
            .collect();
        (!line.is_empty()).then_some(line)
    });
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    DialError::UpgradeRefused {
        status: response.status().as_u16(),
        reason,
        retry_after,
    }
}

/// `: <reason>` or nothing.
fn reason_suffix(reason: &Option<String>) -> String {
    reason
        .as_ref()
        .map_or_else(String::new, |r| format!(": {r}"))
}

/// ` (retry after <value>s)` or nothing.
fn retry_suffix(retry_after: &Option<String>) -> String {
    retry_after
        .as_ref()
        .map_or_else(String::new, |r| format!(" (retry after {r}s)"))
}

/// The rustls error inside an I/O error, as tokio-rustls reports handshake failures.
fn tls_failure(err: &std::io::Error) -> Option<String> {
    err.get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .map(rustls::Error::to_string)
}

/// `--insecure` verifier: any certificate chain and name is accepted, but the
/// handshake signatures are still verified with the ring provider's algorithms
/// (so the peer must at least hold the key of the certificate it presents).
#[derive(Debug)]
struct AcceptAnyServerCert {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for AcceptAnyServerCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_tungstenite::tungstenite::Message;

    const LIMITS: FrameLimits = FrameLimits {
        max_message_bytes: 1 << 20,
        read_buffer_bytes: 4096,
    };

    /// Dials `o` as the CLI does ([`dial`], tungstenite) or as a host link
    /// does ([`dial_host`], our codec): the errors must be the same.
    async fn dial_err(o: &DialOptions, host_link: bool) -> Option<DialError> {
        if host_link {
            dial_host(o, &Credentials::default(), LIMITS).await.err()
        } else {
            dial(o).await.err()
        }
    }

    /// Reads one HTTP request head from `sock`.
    async fn read_head(sock: &mut TcpStream) -> String {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 1024];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = sock.read(&mut chunk).await.unwrap();
            assert!(n > 0, "client closed before sending headers");
            buf.extend_from_slice(&chunk[..n]);
        }
        String::from_utf8(buf).unwrap()
    }

    /// A server that answers one upgrade with `answer(accept key)`, in one
    /// write, then holds the connection until the client closes it.
    async fn answering(answer: fn(&str) -> Vec<u8>) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let head = read_head(&mut sock).await;
            let key = head
                .lines()
                .find_map(|l| l.strip_prefix("Sec-WebSocket-Key: "))
                .unwrap()
                .trim()
                .to_string();
            sock.write_all(&answer(&derive_accept_key(key.as_bytes())))
                .await
                .unwrap();
            let mut rest = Vec::new();
            let _ = sock.read_to_end(&mut rest).await;
        });
        format!("ws://127.0.0.1:{port}/")
    }

    fn switching(accept: &str) -> String {
        format!(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
             Connection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n"
        )
    }

    /// A frame the host sends in the same segment as its `101` is read:
    /// the upgrade's read-ahead is the socket's read buffer.
    #[tokio::test]
    async fn a_host_link_keeps_the_frame_sent_with_the_101() {
        let url = answering(|accept| {
            let mut out = switching(accept).into_bytes();
            out.extend_from_slice(&[0x81, 5]);
            out.extend_from_slice(b"early");
            out
        })
        .await;
        let mut ws = dial_host(&opts(&url), &Credentials::default(), LIMITS)
            .await
            .unwrap();
        use futures_util::StreamExt;
        assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("early"));
    }

    /// A `101` that does not prove the server read our key, or imposes an
    /// extension we did not offer, fails the dial as a handshake error.
    #[tokio::test]
    async fn a_host_link_checks_the_101() {
        let wrong = answering(|_| switching("bm90IHRoZSBrZXk=").into_bytes()).await;
        let err = dial_err(&opts(&wrong), true).await;
        let msg = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains("Key mismatch"), "{msg}");
        let deflate = answering(|accept| {
            let ok = switching(accept);
            let head = ok.trim_end_matches("\r\n");
            format!("{head}\r\nSec-WebSocket-Extensions: permessage-deflate\r\n\r\n").into_bytes()
        })
        .await;
        let err = dial_err(&opts(&deflate), true).await;
        let msg = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains("sec-websocket-extensions"), "{msg}");
    }

    #[tokio::test]
    async fn a_silent_host_times_out() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut o = opts(&format!("ws://127.0.0.1:{port}/"));
        o.connect_timeout = Duration::from_millis(200);
        for host_link in [false, true] {
            let err = dial_err(&o, host_link).await;
            assert!(
                matches!(err, Some(DialError::Timeout { .. })),
                "{host_link}: {err:?}"
            );
        }
        drop(listener);
    }

    fn opts(url: &str) -> DialOptions {
        DialOptions {
            url: url.into(),
            token: None,
            ca_file: None,
            insecure: false,
            connect_timeout: Duration::from_secs(5),
            extra_headers: Vec::new(),
        }
    }

    #[tokio::test]
    async fn malformed_urls_are_rejected_before_io() {
        for url in [
            "not a url",
            "http://example.com/",
            "localhost:80",
            "ws:///path",
        ] {
            for host_link in [false, true] {
                let err = dial_err(&opts(url), host_link).await;
                assert!(
                    matches!(err, Some(DialError::BadUrl { .. })),
                    "{url}: {err:?}"
                );
            }
        }
    }

    #[tokio::test]
    async fn unreadable_ca_file_is_reported() {
        let mut o = opts("wss://127.0.0.1:9/");
        o.ca_file = Some(PathBuf::from("/nonexistent/ahp-relay-test-ca.pem"));
        let err = dial(&o).await.err();
        assert!(
            matches!(err, Some(DialError::CaUnreadable { .. })),
            "{err:?}"
        );
        let msg = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains("/nonexistent/ahp-relay-test-ca.pem"), "{msg}");
    }

    #[tokio::test]
    async fn ca_file_without_certificates_is_reported() {
        let path =
            std::env::temp_dir().join(format!("ahp-relay-empty-ca-{}.pem", std::process::id()));
        std::fs::write(&path, "no pem blocks here\n").unwrap();
        let mut o = opts("wss://127.0.0.1:9/");
        o.ca_file = Some(path.clone());
        let err = dial(&o).await.err();
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(err, Some(DialError::CaEmpty { .. })), "{err:?}");
    }

    #[tokio::test]
    async fn refused_tcp_connection_is_a_connect_error() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        for host_link in [false, true] {
            let err = dial_err(&opts(&format!("ws://127.0.0.1:{port}/")), host_link).await;
            assert!(matches!(err, Some(DialError::Connect { .. })), "{err:?}");
        }
    }

    #[tokio::test]
    async fn refused_upgrade_reports_status_and_sends_bearer_token() {
        for host_link in [false, true] {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            let server = tokio::spawn(async move {
                let (mut sock, _) = listener.accept().await.unwrap();
                let head = read_head(&mut sock).await;
                sock.write_all(b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\n\r\n")
                    .await
                    .unwrap();
                head
            });
            let mut o = opts(&format!("ws://127.0.0.1:{port}/ahp"));
            o.token = Some("s3cret-token".into());
            let err = dial_err(&o, host_link).await;
            let request = server.await.unwrap().to_ascii_lowercase();
            assert!(
                request.contains("authorization: bearer s3cret-token"),
                "{request}"
            );
            assert!(
                matches!(err, Some(DialError::UpgradeRefused { status: 401, .. })),
                "{err:?}"
            );
            let msg = err.map(|e| e.to_string()).unwrap_or_default();
            assert_eq!(msg, "upgrade refused: HTTP 401");
        }
    }

    /// A refusal's body and `retry-after` reach the error text, so the
    /// user reads why (e.g. "too many failed attempts") and when to retry.
    #[tokio::test]
    async fn refused_upgrade_carries_the_body_and_retry_after() {
        for host_link in [false, true] {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            tokio::spawn(async move {
                let (mut sock, _) = listener.accept().await.unwrap();
                read_head(&mut sock).await;
                let body = "too many failed attempts\n  from this address\n";
                let answer = format!(
                    "HTTP/1.1 429 Too Many Requests\r\nretry-after: 30\r\n\
                     content-length: {}\r\n\r\n{body}",
                    body.len()
                );
                sock.write_all(answer.as_bytes()).await.unwrap();
                sock.flush().await.unwrap();
            });
            let err = dial_err(&opts(&format!("ws://127.0.0.1:{port}/")), host_link).await;
            let msg = err.map(|e| e.to_string()).unwrap_or_default();
            assert_eq!(
                msg,
                "upgrade refused: HTTP 429: too many failed attempts from this address (retry after 30s)"
            );
        }
    }

    #[test]
    fn debug_output_redacts_the_token() {
        let mut o = opts("ws://h/");
        o.token = Some("s3cret-token".into());
        let shown = format!("{o:?}");
        assert!(!shown.contains("s3cret-token"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
    }

    #[test]
    fn the_query_token_is_added_encoded_and_kept_out_of_errors() {
        let o = opts("ws://h:1/ahp?x=1");
        let mut request = upgrade_request(&o).unwrap();
        add_query_token(&mut request, "a b&c=d").unwrap();
        assert_eq!(
            request.uri().path_and_query().unwrap().as_str(),
            "/ahp?x=1&tkn=a%20b%26c%3Dd"
        );
        let mut bare = upgrade_request(&opts("ws://h:1")).unwrap();
        add_query_token(&mut bare, "t").unwrap();
        assert_eq!(bare.uri().path_and_query().unwrap().as_str(), "/?tkn=t");
        let err = DialError::Timeout {
            url: "ws://h:1/?tkn=secret".into(),
            timeout: Duration::from_secs(1),
        }
        .for_host("gpu1")
        .to_string();
        assert_eq!(err, "host gpu1: connecting timed out after 1s");
        let shown = format!(
            "{:?}",
            Credentials {
                query_token: Some("secret".into()),
                client_cert: None
            }
        );
        assert!(!shown.contains("secret"), "{shown}");
    }

    #[test]
    fn insecure_and_default_tls_configs_build() {
        let mut o = opts("wss://h/");
        let none = Credentials::default();
        assert!(tls_config(&o, &none).is_ok());
        o.insecure = true;
        o.ca_file = Some(PathBuf::from("/nonexistent"));
        assert!(tls_config(&o, &none).is_ok(), "insecure ignores --ca");
    }
}

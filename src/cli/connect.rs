//! `ahp-relay connect`: the connector of a host that dials in (contract
//! §13). It runs next to the host, which needs no inbound port: it keeps
//! one control connection to the connector endpoint of each relay given
//! (`--relay`, once per replica), and for each
//! `open` order (one per link the relay wants: the watch link, each
//! per-client link) it dials the host (`--to`, with the host's own
//! credentials, as the relay would) and then the relay once more for that
//! link, and passes WebSocket messages both ways unchanged. Each direction
//! reads the next message only after the previous one was written, so a
//! slow reader on either side slows the writer on the other through TCP,
//! end to end (§5.9); there is no multiplexing of our own.
//!
//! It reconnects with capped exponential backoff and jitter; a refusal of
//! its credential (401/403) or a relay without the endpoint (404) is not
//! retried: the process exits non-zero saying what to check.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use clap::Args;
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{FutureExt as _, SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

use crate::upstream::dial::{
    Credentials, DialError, DialOptions, SOCKET_READ_BYTES, WsStream, dial_stream_capped,
    dial_stream_with,
};
use crate::upstream::dial_in::{CONNECTOR_PATH, Control, HOST_ID_HEADER, LINK_HEADER};
use crate::upstream::hub::{USER_ISSUER_HEADER, USER_SUBJECT_HEADER};

/// Flags of `connect`.
#[derive(Debug, Clone, Args)]
pub struct ConnectArgs {
    /// The relay's client URL (`wss://relay.example/`); the connector
    /// endpoint is its path `/ahp-relay/connector`. Give it once per relay
    /// replica (each at an address of its own) to serve the host through
    /// every replica: the connector attaches to each.
    #[arg(long, required = true)]
    pub relay: Vec<String>,
    /// The id of this host in the relay's `[[hosts]]` (with `dial_in`).
    #[arg(long)]
    pub host_id: String,
    /// File holding the host's dial-in token (the relay's `dial_in.token_file`).
    #[arg(long)]
    pub token_file: PathBuf,
    /// The host's AHP endpoint as seen from here (`ws://127.0.0.1:PORT/`).
    #[arg(long)]
    pub to: String,
    /// PEM CA the relay's certificate must chain to (default: webpki roots).
    #[arg(long)]
    pub ca: Option<PathBuf>,
    /// Bearer token file sent to the host (`Authorization: Bearer`).
    #[arg(long)]
    pub to_token_file: Option<PathBuf>,
    /// Token file sent to the host as the `tkn` query parameter (VS Code's
    /// agent host connection token).
    #[arg(long)]
    pub to_query_token_file: Option<PathBuf>,
    /// PEM client certificate for mutual TLS with the host (with `--to-key`).
    #[arg(long, requires = "to_key")]
    pub to_cert: Option<PathBuf>,
    /// PEM private key of `--to-cert`.
    #[arg(long, requires = "to_cert")]
    pub to_key: Option<PathBuf>,
    /// PEM CA for a `wss://` host (default: webpki roots).
    #[arg(long)]
    pub to_ca: Option<PathBuf>,
    /// Print a one-line status to stdout whenever it changes (attached or
    /// not, links open, the last error).
    #[arg(long)]
    pub status: bool,
}

/// Why the connector stopped for good.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The relay refused the credential or does not know the host id.
    #[error(
        "the relay refused host id {host:?} with the token in {token_file} (HTTP {status}): check --host-id and --token-file against the relay's [[hosts]] entry (dial_in.token_file)"
    )]
    Refused {
        /// The host id given.
        host: String,
        /// The token file given.
        token_file: String,
        /// The HTTP status.
        status: u16,
    },
    /// The relay has no connector endpoint.
    #[error(
        "{url} has no connector endpoint (HTTP 404): is --relay the client URL of an ahp-relay that supports dial-in hosts?"
    )]
    NoEndpoint {
        /// The endpoint dialed.
        url: String,
    },
    /// A flag is unusable.
    #[error("{0}")]
    Usage(String),
}

/// Runs the connector until it is refused for good (exit 1) or killed.
pub async fn run(args: ConnectArgs) -> ExitCode {
    match connect(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What the connector reports in its status line.
#[derive(Debug, Default, Clone)]
struct Status {
    /// The relays (`--relay` URLs) attached now.
    attached: std::collections::BTreeSet<String>,
    open: usize,
    opened: u64,
    last_error: Option<String>,
}

/// The status, shared by the control loop and the link tasks; printed on
/// every change when `--status` is given.
#[derive(Debug)]
struct Shown {
    status: Mutex<Status>,
    print: bool,
    host: String,
}

impl Shown {
    fn change(&self, f: impl FnOnce(&mut Status)) {
        let mut s = self.status.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut s);
        if self.print {
            let state = if s.attached.is_empty() {
                "not attached".to_string()
            } else {
                let relays: Vec<&str> = s.attached.iter().map(String::as_str).collect();
                format!("attached to {}", relays.join(", "))
            };
            println!(
                "status: host {} · {state} · {} links open ({} opened) · last error: {}",
                self.host,
                s.open,
                s.opened,
                s.last_error.as_deref().unwrap_or("none")
            );
        }
    }
}

/// The connector's settings, checked once.
#[derive(Debug)]
struct Connector {
    args: ConnectArgs,
    shown: Shown,
}

/// One relay the connector attaches to: its `--relay` URL and its
/// connector endpoint.
#[derive(Debug)]
struct Target {
    url: String,
    endpoint: String,
}

/// Runs the connector for `args`: returns only with an error that a retry
/// cannot fix.
pub async fn connect(args: ConnectArgs) -> Result<(), ConnectError> {
    let targets = args
        .relay
        .iter()
        .map(|url| {
            endpoint(url).map(|endpoint| Target {
                url: url.clone(),
                endpoint,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if !(args.to.starts_with("ws://") || args.to.starts_with("wss://")) {
        return Err(ConnectError::Usage(
            "--to must be the host's ws:// or wss:// URL".into(),
        ));
    }
    if !crate::names::qualify::valid_host_id(&args.host_id) {
        return Err(ConnectError::Usage(format!(
            "--host-id {:?} is not a host id ([a-z0-9-]{{1,32}})",
            args.host_id
        )));
    }
    let shown = Shown {
        status: Mutex::default(),
        print: args.status,
        host: args.host_id.clone(),
    };
    let me = Arc::new(Connector { args, shown });
    let loops = targets
        .into_iter()
        .map(|t| Box::pin(keep_attached(me.clone(), Arc::new(t))));
    let (fatal, _, _) = futures_util::future::select_all(loops).await;
    Err(fatal)
}

/// Keeps a control connection to `target` open, reconnecting with backoff
/// and jitter; returns only an error a retry cannot fix.
async fn keep_attached(me: Arc<Connector>, target: Arc<Target>) -> ConnectError {
    let mut backoff = Duration::from_millis(250);
    loop {
        let (attached, ended) = control(&me, &target).await;
        if attached {
            // It was attached: whatever ended it, retry soon.
            backoff = Duration::from_millis(250);
        }
        match ended {
            Ok(()) => {}
            Err(Stop::Fatal(e)) => return e,
            Err(Stop::Retry(why)) => {
                tracing::warn!(relay = %target.url, error = %why, "cannot attach to the relay");
                me.shown.change(|s| s.last_error = Some(why));
            }
        }
        me.shown.change(|s| {
            s.attached.remove(&target.url);
        });
        let pause = jittered(backoff);
        tracing::info!(relay = %target.url, "reconnecting in {:.1}s", pause.as_secs_f64());
        tokio::time::sleep(pause).await;
        backoff = (backoff * 2).min(Duration::from_secs(30));
    }
}

/// The connector endpoint of relay URL `relay`.
fn endpoint(relay: &str) -> Result<String, ConnectError> {
    if !(relay.starts_with("wss://") || relay.starts_with("ws://")) {
        return Err(ConnectError::Usage(format!(
            "--relay {relay:?} must be a wss:// (or ws://) URL"
        )));
    }
    if relay.trim_end_matches('/').ends_with(CONNECTOR_PATH) {
        return Ok(relay.to_string());
    }
    Ok(format!("{}{CONNECTOR_PATH}", relay.trim_end_matches('/')))
}

/// `pause` ± 20 %, so connectors of many hosts do not retry in step.
fn jittered(pause: Duration) -> Duration {
    let mut b = [0u8; 1];
    let _ = crate::identity::random_fill(&mut b);
    let factor = 0.8 + 0.4 * f64::from(b[0]) / 255.0;
    pause.mul_f64(factor)
}

/// Why one control connection ended badly.
enum Stop {
    /// Retrying cannot help.
    Fatal(ConnectError),
    /// Retry after backoff.
    Retry(String),
}

/// Silence on the control connection after which the connector pings, and
/// after which (twice it) it gives the connection up.
const CONTROL_PING: Duration = Duration::from_secs(15);

/// One control connection to `target`: whether it attached, and how it
/// ended — `Ok` when the relay closed it (it may be replaced or its host
/// removed: the next attempt says which), `Err` otherwise. Links already
/// open are separate connections and outlive it.
async fn control(me: &Arc<Connector>, target: &Arc<Target>) -> (bool, Result<(), Stop>) {
    match dial_relay(me, target, None).await {
        Ok(ws) => (true, attached(me, target, ws).await),
        Err(stop) => (false, Err(stop)),
    }
}

/// Serves an attached control connection until it ends.
async fn attached(me: &Arc<Connector>, target: &Arc<Target>, ws: WsStream) -> Result<(), Stop> {
    let (mut tx, mut rx) = ws.split();
    let (out, mut outbox) = mpsc::channel::<Control>(64);
    me.shown.change(|s| {
        s.attached.insert(target.url.clone());
    });
    let mut heard = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(CONTROL_PING);
    loop {
        tokio::select! {
            msg = rx.next() => {
                heard = tokio::time::Instant::now();
                match msg {
                    Some(Ok(Message::Text(t))) => match serde_json::from_str::<Control>(t.as_str()) {
                        Ok(Control::Welcome { host }) => {
                            tracing::info!(%host, relay = %target.url, "attached: serving host");
                        }
                        Ok(Control::Open { link, headers }) => {
                            let target = target.clone();
                            tokio::spawn(serve_link(me.clone(), target, link, headers, out.clone()));
                        }
                        _ => {}
                    },
                    Some(Ok(Message::Close(frame))) => {
                        let why = frame.map(|f| f.reason.to_string()).unwrap_or_default();
                        tracing::info!(reason = %why, "the relay closed the control connection");
                        return Ok(());
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(Stop::Retry(format!("control connection failed: {e}"))),
                    None => return Err(Stop::Retry("control connection ended".into())),
                }
            }
            Some(msg) = outbox.recv() => {
                let text = serde_json::to_string(&msg).unwrap_or_default();
                if tx.send(Message::text(text)).await.is_err() {
                    return Err(Stop::Retry("control connection failed".into()));
                }
            }
            _ = tick.tick() => {
                if heard.elapsed() > CONTROL_PING * 2 {
                    return Err(Stop::Retry("the relay stopped answering".into()));
                }
                if tx.send(Message::Ping(Default::default())).await.is_err() {
                    return Err(Stop::Retry("control connection failed".into()));
                }
            }
        }
    }
}

/// Dials the relay's connector endpoint: the control connection, or with
/// `link` that link's socket. The token is read from its file each time.
async fn dial_relay(me: &Connector, target: &Target, link: Option<u64>) -> Result<WsStream, Stop> {
    let token = std::fs::read_to_string(&me.args.token_file).map_err(|e| {
        Stop::Fatal(ConnectError::Usage(format!(
            "cannot read --token-file {}: {e}",
            me.args.token_file.display()
        )))
    })?;
    let mut extra_headers = vec![(HOST_ID_HEADER.to_string(), me.args.host_id.clone())];
    if let Some(link) = link {
        extra_headers.push((LINK_HEADER.to_string(), link.to_string()));
    }
    let opts = DialOptions {
        url: target.endpoint.clone(),
        token: Some(token.trim().to_string()),
        ca_file: me.args.ca.clone(),
        insecure: false,
        connect_timeout: Duration::from_secs(10),
        extra_headers,
    };
    dial_stream_with(&opts, &Credentials::default())
        .await
        .map_err(|e| match e {
            DialError::UpgradeRefused {
                status: status @ (401 | 403),
                ..
            } => Stop::Fatal(ConnectError::Refused {
                host: me.args.host_id.clone(),
                token_file: me.args.token_file.display().to_string(),
                status,
            }),
            DialError::UpgradeRefused { status: 404, .. } if link.is_none() => {
                Stop::Fatal(ConnectError::NoEndpoint {
                    url: target.endpoint.clone(),
                })
            }
            DialError::CaUnreadable { .. }
            | DialError::CaInvalid { .. }
            | DialError::CaEmpty { .. }
            | DialError::BadUrl { .. } => Stop::Fatal(ConnectError::Usage(e.to_string())),
            other => Stop::Retry(other.to_string()),
        })
}

/// Largest WebSocket message passed through: the relay's own cap on what a
/// host may send (`upstream_max_frame_bytes` is at most 64 MiB).
const MAX_MESSAGE: usize = 64 << 20;

/// Dials the host with its credentials and `headers` (the end user's
/// identity on per-client links), as the relay dials a host. Only the
/// relay's end-user headers are taken from the order, so the relay cannot
/// replace the host's own credentials. Errors never show the URL (which
/// may carry `?tkn=`).
async fn dial_host(me: &Connector, headers: Vec<(String, String)>) -> Result<WsStream, DialError> {
    let headers = headers
        .into_iter()
        .filter(|(name, _)| {
            name.eq_ignore_ascii_case(USER_ISSUER_HEADER)
                || name.eq_ignore_ascii_case(USER_SUBJECT_HEADER)
        })
        .collect();
    let a = &me.args;
    let read = |what: &'static str, path: &Option<PathBuf>| -> Result<Option<String>, DialError> {
        path.as_ref()
            .map(|p| {
                std::fs::read_to_string(p)
                    .map(|s| s.trim().to_string())
                    .map_err(|source| DialError::CredentialUnreadable {
                        what,
                        path: p.clone(),
                        source,
                    })
            })
            .transpose()
    };
    let opts = DialOptions {
        url: a.to.clone(),
        token: read("token", &a.to_token_file)?,
        ca_file: a.to_ca.clone(),
        insecure: false,
        connect_timeout: Duration::from_secs(10),
        extra_headers: headers,
    };
    let creds = Credentials {
        query_token: read("query token", &a.to_query_token_file)?,
        client_cert: a.to_cert.clone().zip(a.to_key.clone()),
    };
    dial_stream_capped(&opts, &creds, (Some(MAX_MESSAGE), SOCKET_READ_BYTES)).await
}

/// Opens link `link`: the host first (a failure is reported to the relay
/// on the control connection, so the link fails at once with the reason),
/// then the relay's link socket; then pipes until either side closes.
async fn serve_link(
    me: Arc<Connector>,
    target: Arc<Target>,
    link: u64,
    headers: Vec<(String, String)>,
    control: mpsc::Sender<Control>,
) {
    let fail = |reason: String| {
        let control = control.clone();
        async move {
            let _ = control.send(Control::Failed { link, reason }).await;
        }
    };
    let host = match dial_host(&me, headers).await {
        Ok(ws) => ws,
        Err(e) => {
            let reason = e.for_host(&me.args.host_id).to_string();
            tracing::warn!(link, error = %reason, "cannot reach the host");
            me.shown.change(|s| s.last_error = Some(reason.clone()));
            return fail(reason).await;
        }
    };
    let relay = match dial_relay(&me, &target, Some(link)).await {
        Ok(ws) => ws,
        Err(Stop::Fatal(e)) => return fail(e.to_string()).await,
        Err(Stop::Retry(e)) => return fail(format!("connector cannot reach the relay: {e}")).await,
    };
    tracing::info!(link, "link open");
    me.shown.change(|s| {
        s.open += 1;
        s.opened += 1;
    });
    pipe(relay, host).await;
    tracing::info!(link, "link closed");
    me.shown.change(|s| s.open = s.open.saturating_sub(1));
}

/// Passes messages both ways until either side closes or fails, then
/// closes both.
async fn pipe(relay: WsStream, host: WsStream) {
    let (mut relay_tx, mut relay_rx) = relay.split();
    let (mut host_tx, mut host_rx) = host.split();
    tokio::select! {
        () = forward(&mut relay_rx, &mut host_tx) => {}
        () = forward(&mut host_rx, &mut relay_tx) => {}
    }
    let _ = relay_tx.close().await;
    let _ = host_tx.close().await;
}

/// Messages read in a row before one flush.
const BATCH: usize = 64;

/// Forwards `from` to `to`: text and binary messages unchanged, a close
/// (then stops); pings are answered by each side's WebSocket layer. What
/// is already read is written in one flush; the next read waits for it.
async fn forward(from: &mut SplitStream<WsStream>, to: &mut SplitSink<WsStream, Message>) {
    loop {
        let Some(Ok(first)) = from.next().await else {
            return;
        };
        if !pass(to, first).await {
            return;
        }
        for _ in 0..BATCH {
            match from.next().now_or_never() {
                None => break,
                Some(Some(Ok(msg))) => {
                    if !pass(to, msg).await {
                        return;
                    }
                }
                Some(_) => {
                    let _ = to.flush().await;
                    return;
                }
            }
        }
        if to.flush().await.is_err() {
            return;
        }
    }
}

/// Queues one message on `to`; `false` once the stream should end.
async fn pass(to: &mut SplitSink<WsStream, Message>, msg: Message) -> bool {
    match msg {
        Message::Text(_) | Message::Binary(_) => to.feed(msg).await.is_ok(),
        Message::Close(frame) => {
            let _ = to.send(Message::Close(frame)).await;
            false
        }
        Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_is_the_relay_url_plus_the_fixed_path() {
        let e = |u: &str| endpoint(u).ok();
        assert_eq!(
            e("wss://r.example/").as_deref(),
            Some("wss://r.example/ahp-relay/connector")
        );
        assert_eq!(
            e("wss://r.example").as_deref(),
            Some("wss://r.example/ahp-relay/connector")
        );
        assert_eq!(
            e("wss://r.example/ahp-relay/connector").as_deref(),
            Some("wss://r.example/ahp-relay/connector")
        );
        assert!(e("https://r.example/").is_none());
    }

    #[test]
    fn jitter_stays_within_a_fifth() {
        for _ in 0..50 {
            let j = jittered(Duration::from_secs(10));
            assert!(
                j >= Duration::from_secs(8) && j <= Duration::from_secs(12),
                "{j:?}"
            );
        }
    }
}

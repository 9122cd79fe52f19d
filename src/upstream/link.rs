//! A per-client link: the connection one client session holds to one host
//! (contract §2 "Why per-client links").
//!
//! Opened lazily when the session first needs the host, it initializes with
//! the session's derived upstream client id (never the client's own id, never
//! the user's token) and the client's negotiated protocol version, then pumps
//! frames: client → host in the order the session queued them, host → client
//! through [`ClientSession::on_host_frame`]. When it cannot open or drops,
//! the session is told ([`ClientSession::on_link_down`]) and dispatches still
//! queued for it get rejection echoes ("host unavailable").

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::Message;

use super::hub::HostHub;
use crate::session::ClientSession;
use crate::session::envelope::LinkReply;
use crate::upstream::dial::{WsStream, dial_stream};

/// What a session asks its link to write.
#[derive(Debug)]
pub enum LinkCmd {
    /// A request or notification frame, already in host names.
    Frame(String),
    /// A `dispatchAction` frame, with what a rejection echo would need if it
    /// cannot be written.
    Dispatch {
        /// The frame in host names.
        frame: String,
        /// The channel as the client named it.
        client_channel: String,
        /// The action exactly as the client dispatched it.
        action: Value,
        /// The client's `clientSeq`.
        client_seq: i64,
    },
}

/// A session's handle on its link to one host.
#[derive(Debug)]
pub struct Link {
    /// Unique among all links of this process (pending requests and
    /// envelopes are matched to the link they came from).
    pub id: u64,
    /// The host.
    pub host: Arc<HostHub>,
    tx: mpsc::UnboundedSender<LinkCmd>,
    next_id: Arc<AtomicU64>,
}

impl Drop for Link {
    fn drop(&mut self) {
        self.host.links.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How long the host may take to answer `initialize`.
const INIT_WITHIN: Duration = Duration::from_secs(10);

static NEXT_LINK: AtomicU64 = AtomicU64::new(1);

/// What a link's `initialize` asks for beyond the root channel.
#[derive(Debug, Default)]
pub struct Baseline {
    /// Host channels to receive snapshots of (`initialSubscriptions`).
    pub channels: Vec<String>,
    /// Receives the host's `InitializeResult` (or `None` if it failed).
    pub reply: Option<oneshot::Sender<Option<Value>>>,
}

impl Link {
    /// Starts a link from `session` to `host`; frames sent before it is up
    /// are queued in order. With a [`Baseline`], `initialize` subscribes
    /// those channels and hands the snapshots back (re-baselining, §5.5).
    pub fn open(session: &Arc<ClientSession>, host: Arc<HostHub>, baseline: Baseline) -> Arc<Self> {
        let (tx, rx) = mpsc::unbounded_channel();
        let next_id = Arc::new(AtomicU64::new(1));
        let link = Arc::new(Self {
            id: NEXT_LINK.fetch_add(1, Ordering::Relaxed),
            host: host.clone(),
            tx,
            next_id: next_id.clone(),
        });
        session.relay.metrics.links_opened.inc();
        host.links.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(run(
            Arc::downgrade(session),
            host,
            link.id,
            rx,
            next_id,
            baseline,
        ));
        link
    }

    /// A fresh id for a request the relay sends on this link (ids the
    /// relay originates are non-negative integers).
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Queues a frame; `false` if the link task has ended.
    pub fn send(&self, cmd: LinkCmd) -> bool {
        self.tx.send(cmd).is_ok()
    }
}

async fn run(
    session: Weak<ClientSession>,
    host: Arc<HostHub>,
    link_id: u64,
    mut rx: mpsc::UnboundedReceiver<LinkCmd>,
    ids: Arc<AtomicU64>,
    baseline: Baseline,
) {
    let Some((mut ws, early, server_seq)) = open(&session, &host, baseline).await else {
        fail(&session, &host, link_id, &mut rx, false);
        return;
    };
    let (ping_after, ping_timeout) = match session.upgrade() {
        Some(s) => {
            s.lock().watermarks.insert(link_id, server_seq);
            for text in early {
                let _ = s.on_host_frame(&host, link_id, &text);
            }
            (
                s.relay.cfg.limits.link_ping(),
                s.relay.cfg.limits.link_ping_timeout(),
            )
        }
        None => return,
    };
    loop {
        let timing = (ping_after, ping_timeout);
        if !pump(&session, &host, link_id, &mut rx, &ids, &mut ws, timing).await {
            return; // the session closed the link
        }
        // The connection dropped: try to continue it (§5.8).
        if let Some(s) = session.upgrade() {
            s.fail_link_requests(link_id, &crate::rpc::RpcError::upstream_lost(&host.id));
        }
        match resume(&session, &host, link_id).await {
            Some(resumed) => ws = resumed,
            None => {
                fail(&session, &host, link_id, &mut rx, true);
                return;
            }
        }
    }
}

/// Pumps frames both ways until the connection drops (`true`) or the
/// session closes the link (`false`). After `ping_after` without a frame
/// from the host it sends an AHP `ping`; a host that then stays silent for
/// `ping_timeout` is declared dead (`true`), so the link is resumed or its
/// client resynchronised (§5.8) instead of waiting on a half-open socket.
async fn pump(
    session: &Weak<ClientSession>,
    host: &Arc<HostHub>,
    link_id: u64,
    rx: &mut mpsc::UnboundedReceiver<LinkCmd>,
    ids: &AtomicU64,
    ws: &mut WsStream,
    (ping_after, ping_timeout): (Duration, Duration),
) -> bool {
    let mut heard = tokio::time::Instant::now();
    let mut pinged = false;
    loop {
        let deadline = heard + ping_after + if pinged { ping_timeout } else { Duration::ZERO };
        tokio::select! {
            cmd = rx.recv() => {
                let Some(cmd) = cmd else {
                    let _ = ws.close(None).await;
                    return false;
                };
                let frame = match cmd {
                    LinkCmd::Frame(f) | LinkCmd::Dispatch { frame: f, .. } => f,
                };
                if ws.feed(Message::text(frame)).await.is_err() { return true; }
                while let Ok(cmd) = rx.try_recv() {
                    let (LinkCmd::Frame(f) | LinkCmd::Dispatch { frame: f, .. }) = cmd;
                    if ws.feed(Message::text(f)).await.is_err() { break; }
                }
                if ws.flush().await.is_err() { return true; }
            }
            _ = tokio::time::sleep_until(deadline) => {
                if pinged {
                    tracing::info!(host = %host.id, "link silent after a ping: declared dead");
                    return true;
                }
                // An id from the link's own counter: no pending request has it,
                // so the answer is ignored.
                let ping_id = ids.fetch_add(1, Ordering::Relaxed);
                let ping = json!({"jsonrpc": "2.0", "id": ping_id, "method": "ping",
                    "params": {"channel": ahp_types::ROOT_RESOURCE_URI}});
                if ws.send(Message::text(ping.to_string())).await.is_err() { return true; }
                pinged = true;
            }
            msg = ws.next() => {
                heard = tokio::time::Instant::now();
                pinged = false;
                match msg {
                    Some(Ok(Message::Text(t))) => {
                        let Some(s) = session.upgrade() else { return false };
                        if let LinkReply::ToHost(reply) = s.on_host_frame(host, link_id, t.as_str())
                            && ws.send(Message::text(reply)).await.is_err()
                        {
                            return true;
                        }
                    }
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return true,
                    Some(Ok(_)) => {}
                }
            }
        }
    }
}

/// Re-dials a dropped link and asks the host to `reconnect` it from the
/// link's watermark. A `replay` continues seamlessly (its envelopes are
/// numbered as usual; repeats are dropped by the watermark); a `snapshot`,
/// an error or no host within the attempts is a loss of continuity (`None`).
async fn resume(
    session: &Weak<ClientSession>,
    host: &Arc<HostHub>,
    link_id: u64,
) -> Option<WsStream> {
    for delay in [100u64, 400, 1600] {
        tokio::time::sleep(Duration::from_millis(delay)).await;
        let (opts, request) = {
            let s = session.upgrade()?;
            let (watermark, channels) = s.resume_plan(host, link_id)?;
            let user = (
                s.key.principal.issuer.as_str(),
                s.key.principal.subject.as_str(),
            );
            let request = json!({"jsonrpc": "2.0", "id": 0, "method": "reconnect", "params": {
                "channel": ahp_types::ROOT_RESOURCE_URI, "clientId": s.upstream_id,
                "lastSeenServerSeq": watermark, "subscriptions": channels}});
            (host.dial_options(Some(user)), request)
        };
        let Ok(mut ws) = dial_stream(&opts).await else {
            continue;
        };
        let (answer, early) = ask(&mut ws, &request).await?;
        let replay = answer.pointer("/result/type").and_then(Value::as_str) == Some("replay");
        let actions = answer
            .pointer("/result/actions")
            .and_then(Value::as_array)
            .cloned();
        let (true, Some(actions)) = (replay, actions) else {
            tracing::info!(host = %host.id, "upstream reconnect lost continuity");
            return None;
        };
        let s = session.upgrade()?;
        for env in actions {
            let frame = json!({"jsonrpc": "2.0", "method": "action", "params": env}).to_string();
            let _ = s.on_host_frame(host, link_id, &frame);
        }
        for text in early {
            let _ = s.on_host_frame(host, link_id, &text);
        }
        tracing::info!(host = %host.id, "link resumed by upstream replay");
        return Some(ws);
    }
    None
}

/// Sends `request` (id 0) and waits for its answer; frames before it are returned.
async fn ask(ws: &mut WsStream, request: &Value) -> Option<(Value, Vec<String>)> {
    ws.send(Message::text(request.to_string())).await.ok()?;
    let mut early = Vec::new();
    let answer = tokio::time::timeout(INIT_WITHIN, async {
        while let Some(Ok(msg)) = ws.next().await {
            if let Message::Text(t) = msg {
                let v: Value = serde_json::from_str(t.as_str()).ok()?;
                if v.get("id") == Some(&json!(0)) && v.get("method").is_none() {
                    return Some(v);
                }
                early.push(t.to_string());
            }
        }
        None
    })
    .await
    .ok()
    .flatten()?;
    Some((answer, early))
}

/// Dials and initializes; `None` if the host cannot be used. Frames that
/// arrive before the `initialize` answer are returned to be handled after it.
async fn open(
    session: &Weak<ClientSession>,
    host: &Arc<HostHub>,
    mut baseline: Baseline,
) -> Option<(WsStream, Vec<String>, u64)> {
    let answer = opened(session, host, &baseline.channels).await;
    let result = answer
        .as_ref()
        .and_then(|(_, _, v)| v.get("result").cloned());
    if let Some(reply) = baseline.reply.take() {
        let _ = reply.send(result.clone());
    }
    let (ws, early, _) = answer?;
    let server_seq = result
        .as_ref()?
        .get("serverSeq")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    Some((ws, early, server_seq))
}

async fn opened(
    session: &Weak<ClientSession>,
    host: &Arc<HostHub>,
    channels: &[String],
) -> Option<(WsStream, Vec<String>, Value)> {
    let (opts, init) = {
        let s = session.upgrade()?;
        let user = (
            s.key.principal.issuer.as_str(),
            s.key.principal.subject.as_str(),
        );
        let mut subs = vec![ahp_types::ROOT_RESOURCE_URI.to_string()];
        subs.extend(channels.iter().cloned());
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "channel": ahp_types::ROOT_RESOURCE_URI, "protocolVersions": [s.version],
            "clientId": s.upstream_id, "initialSubscriptions": subs}});
        (host.dial_options(Some(user)), init)
    };
    let mut ws = match dial_stream(&opts).await {
        Ok(ws) => ws,
        Err(e) => {
            tracing::warn!(host = %host.id, error = %e, "link cannot reach host");
            return None;
        }
    };
    let (answer, early) = ask(&mut ws, &init).await?;
    if let Some(err) = answer.get("error") {
        tracing::warn!(host = %host.id, error = %err, "host refused the link's initialize");
        return None;
    }
    Some((ws, early, answer))
}

/// Reports the link down and answers what is still queued on it.
fn fail(
    session: &Weak<ClientSession>,
    host: &Arc<HostHub>,
    link_id: u64,
    rx: &mut mpsc::UnboundedReceiver<LinkCmd>,
    was_up: bool,
) {
    let Some(s) = session.upgrade() else {
        return;
    };
    s.relay.metrics.links_failed.inc();
    s.on_link_down(host, link_id, was_up);
    rx.close();
    let mut core = s.lock();
    while let Ok(cmd) = rx.try_recv() {
        if let LinkCmd::Dispatch {
            client_channel,
            action,
            client_seq,
            ..
        } = cmd
        {
            s.reject_dispatch(
                &mut core,
                &client_channel,
                &action,
                client_seq,
                &format!("host {} unavailable", host.id),
            );
        }
    }
}

//! The simulated host as a running server, and the handle tests and the
//! CLI hold: address, restart, fault switches, the frame record, and the
//! host's own view of its state.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::config::{MAX_WRITE_WAITS, SimHostConfig};
use super::conn;
use super::core::HostCore;
use super::record::{FrameRecord, Recorder};

/// State shared by the accept loop, connections and agent tasks.
#[derive(Debug)]
pub struct Shared {
    /// The configuration the host was started with.
    pub cfg: Arc<SimHostConfig>,
    core: Mutex<HostCore>,
    recorder: Mutex<Recorder>,
    /// While true, connections neither read nor write (fault injection).
    pub stalled: watch::Sender<bool>,
    /// Connections of these `clientId`s neither read nor write (fault
    /// injection, [`SimHost::stall_client`]).
    pub held: watch::Sender<std::collections::HashSet<String>>,
    next_conn: AtomicU64,
    handshakes: Mutex<Vec<Handshake>>,
    /// µs each streamed batch waited from its stamp to its write
    /// (`record_write_waits`), until taken.
    write_waits: Mutex<Vec<u32>>,
}

/// What a connection's WebSocket handshake carried that a host may audit:
/// the relay's end-user headers, and whether any `Authorization` came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handshake {
    /// The connection.
    pub conn: u64,
    /// `ahp-relay-user-issuer`, if sent.
    pub user_issuer: Option<String>,
    /// `ahp-relay-user-subject`, if sent.
    pub user_subject: Option<String>,
    /// The `Authorization` header, if sent.
    pub authorization: Option<String>,
}

impl Shared {
    /// Locks the host core. A poisoned lock is recovered: the core's
    /// invariants hold between statements, and a test host must not cascade
    /// one panic into every connection.
    pub fn lock(&self) -> MutexGuard<'_, HostCore> {
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends to the frame record.
    pub fn record(&self, frame: FrameRecord) {
        self.recorder
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(frame);
    }

    /// Records a connection's handshake headers (the newest
    /// `record_limit`, like the frame record).
    pub fn record_handshake(&self, h: Handshake) {
        let mut all = self.handshakes.lock().unwrap_or_else(|e| e.into_inner());
        if all.len() >= self.cfg.record_limit.max(1) {
            all.remove(0);
        }
        all.push(h);
    }

    /// Notes the batches stamped `stamps` as written at `now` (µs since the
    /// epoch), keeping at most [`MAX_WRITE_WAITS`] until taken.
    pub fn note_write_waits(&self, now: u64, stamps: &[u64]) {
        let mut waits = self.write_waits.lock().unwrap_or_else(|e| e.into_inner());
        let room = MAX_WRITE_WAITS.saturating_sub(waits.len());
        waits.extend(
            stamps
                .iter()
                .take(room)
                .map(|s| u32::try_from(now.saturating_sub(*s)).unwrap_or(u32::MAX)),
        );
    }

    fn recorder(&self) -> MutexGuard<'_, Recorder> {
        self.recorder.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A running simulated host. Dropping the handle stops accepting new
/// connections; [`SimHost::shutdown`] also closes the open ones.
#[derive(Debug)]
pub struct SimHost {
    shared: Arc<Shared>,
    addr: SocketAddr,
    accept: JoinHandle<()>,
}

impl SimHost {
    /// Binds `listen` (port 0 picks a free port) and starts serving.
    pub async fn start(cfg: SimHostConfig, listen: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let cfg = Arc::new(cfg);
        let files = super::files::Files::open(&cfg)?;
        let shared = Arc::new(Shared {
            core: Mutex::new(HostCore::new(cfg.clone(), files)),
            recorder: Mutex::new(Recorder::new(cfg.record_limit)),
            stalled: watch::channel(false).0,
            held: watch::channel(std::collections::HashSet::new()).0,
            next_conn: AtomicU64::new(1),
            handshakes: Mutex::new(Vec::new()),
            write_waits: Mutex::new(Vec::new()),
            cfg,
        });
        let accept_shared = shared.clone();
        let accept = tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((stream, _peer)) => {
                        let _ = stream.set_nodelay(true);
                        let id = accept_shared.next_conn.fetch_add(1, Ordering::Relaxed);
                        tokio::spawn(conn::serve(accept_shared.clone(), stream, id));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "simhost accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    }
                }
            }
        });
        tracing::info!(name = %shared.cfg.name, %addr, "simhost listening");
        Ok(Self {
            shared,
            addr,
            accept,
        })
    }

    /// Starts a host on a free loopback port.
    pub async fn start_local(cfg: SimHostConfig) -> std::io::Result<Self> {
        Self::start(cfg, SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    /// The address the host listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `ws://<addr>/`.
    pub fn url(&self) -> String {
        format!("ws://{}/", self.addr)
    }

    /// The configuration the host runs with.
    pub fn config(&self) -> &SimHostConfig {
        &self.shared.cfg
    }

    /// The write waits noted since the last call, µs each, in the order
    /// written (empty unless `record_write_waits`).
    pub fn take_write_waits(&self) -> Vec<u32> {
        std::mem::take(
            &mut *self
                .shared
                .write_waits
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        )
    }

    /// Simulates a process restart on the same address: every connection is
    /// closed (1012), in-memory clients and the replay log are forgotten and
    /// `serverSeq` starts again at 0. With `keep_state` the sessions, chats
    /// and terminals survive (active turns end as cancelled); without it the
    /// host comes back with its seeded initial state.
    pub fn restart(&self, keep_state: bool) {
        self.shared.lock().restart(keep_state);
    }

    /// Fault: drops every connection without a close frame.
    pub fn drop_connections(&self) {
        self.shared.lock().drop_all();
    }

    /// Fault: drops the connections of one `clientId`; returns how many.
    pub fn drop_client(&self, client_id: &str) -> usize {
        self.shared.lock().drop_client(client_id)
    }

    /// Fault: the next `method` request of `client_id` is carried out (a
    /// `subscribe` subscribes), then its connection drops instead of
    /// answering: the answer is lost with the connection.
    pub fn drop_instead_of_answering(&self, client_id: &str, method: &str) {
        self.shared.lock().drop_before_answer = Some((client_id.to_string(), method.to_string()));
    }

    /// Fault: the next `method` request of `client_id` is carried out (a
    /// `subscribe` subscribes), then answered with an internal error
    /// (-32603) instead of its result.
    pub fn fail_instead_of_answering(&self, client_id: &str, method: &str) {
        self.shared.lock().fail_before_answer = Some((client_id.to_string(), method.to_string()));
    }

    /// Fault: the next `method` request of `client_id` is carried out (a
    /// `subscribe` subscribes) and never answered; the connection goes on
    /// (a host that streams a channel but does not answer its subscribe).
    pub fn silent_instead_of_answering(&self, client_id: &str, method: &str) {
        self.shared.lock().silent_before_answer = Some((client_id.to_string(), method.to_string()));
    }

    /// Fault: while stalled, connections neither read nor write (outbound
    /// frames queue up); un-stalling delivers them in order.
    pub fn set_stalled(&self, stalled: bool) {
        self.shared.stalled.send_replace(stalled);
    }

    /// Fault: while `stalled`, the connections of `client_id` neither read
    /// nor write (their outbound frames queue up, in order); the host's
    /// other connections go on. Lets a test deliver a host's frames to one
    /// client after its answer to another.
    pub fn stall_client(&self, client_id: &str, stalled: bool) {
        self.shared.held.send_modify(|held| {
            if stalled {
                held.insert(client_id.to_string());
            } else {
                held.remove(client_id);
            }
        });
    }

    /// Fault: sends `text` as it is (garbage, a frame of any size) to every
    /// connection of `client_id`; returns how many got it.
    pub fn send_raw(&self, client_id: &str, text: &str) -> usize {
        let core = self.shared.lock();
        let conns = core.conns_of(client_id);
        for conn in &conns {
            core.send(*conn, text.to_string());
        }
        conns.len()
    }

    /// Sends a host → client request (e.g. `resourceRead` of a
    /// client-published URI) to the first connection of `client_id` and
    /// waits up to `within` for its answer (the whole response object).
    pub async fn ask_client(
        &self,
        client_id: &str,
        method: &str,
        params: Value,
        within: std::time::Duration,
    ) -> Option<Value> {
        let rx = {
            let mut core = self.shared.lock();
            let conn = *core.conns_of(client_id).first()?;
            let id = core.next_ask;
            core.next_ask += 1;
            let (tx, rx) = tokio::sync::oneshot::channel();
            core.asks.insert(id, tx);
            let frame =
                serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
            core.send(conn, frame.to_string());
            rx
        };
        tokio::time::timeout(within, rx).await.ok()?.ok()
    }

    /// Every frame received since start (or [`SimHost::clear_record`]).
    pub fn received(&self) -> Vec<FrameRecord> {
        self.shared.recorder().all()
    }

    /// Frames received from connections holding `client_id`.
    pub fn received_from(&self, client_id: &str) -> Vec<FrameRecord> {
        self.received()
            .into_iter()
            .filter(|f| f.client_id.as_deref() == Some(client_id))
            .collect()
    }

    /// Frames evicted from the record by its bound.
    pub fn record_dropped(&self) -> u64 {
        self.shared.recorder().dropped()
    }

    /// Empties the frame record.
    pub fn clear_record(&self) {
        self.shared.recorder().clear();
    }

    /// The last `serverSeq` the host issued.
    pub fn server_seq(&self) -> u64 {
        self.shared.lock().seq
    }

    /// The handshake headers of every connection since start.
    pub fn handshakes(&self) -> Vec<Handshake> {
        self.shared
            .handshakes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The protected resources a live `authenticate` token is held for on
    /// the open connections of `client_id` (the host's one store in
    /// host-wide mode), sorted: what a test compares with who may operate.
    pub fn tokens_of(&self, client_id: &str) -> Vec<String> {
        let core = self.shared.lock();
        let mut out: Vec<String> = core
            .conns_of(client_id)
            .into_iter()
            .filter_map(|c| core.tokens(c))
            .flat_map(|t| t.keys().cloned())
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// Fault: while `hold` is true, the host's `root/session*`
    /// notifications wait (answers and actions do not); `false` sends the
    /// held ones in order. Lets a test deliver a catalog event after the
    /// answer that caused it, as a slow watch connection would.
    pub fn hold_catalog_events(&self, hold: bool) {
        let mut core = self.shared.lock();
        if hold {
            core.held_root.get_or_insert_with(Vec::new);
            return;
        }
        for (method, params) in core.held_root.take().unwrap_or_default() {
            core.notify_root(&method, &params);
        }
    }

    /// Hands terminal `uri` to `claim` (`{kind: "session", session, chat}`
    /// or `{kind: "client", clientId}`, host names) as the host itself
    /// may: `terminal/claimed` on the terminal, then
    /// `root/terminalsChanged`. `false` if there is no such terminal.
    pub fn claim_terminal(&self, uri: &str, claim: &Value) -> bool {
        super::commands::host_claims_terminal(&mut self.shared.lock(), uri, claim)
    }

    /// Number of open connections.
    pub fn connections(&self) -> usize {
        self.shared.lock().conns.len()
    }

    /// The host's current state of a channel as JSON (the `state` of a
    /// snapshot taken now), or `None` if it does not exist.
    pub fn channel_state(&self, uri: &str) -> Option<Value> {
        let core = self.shared.lock();
        let snap = core.state.snapshot(uri, core.seq, None)?;
        serde_json::to_value(&snap.state).ok()
    }

    /// The canonical path of the host's sandbox folder.
    pub fn sandbox(&self) -> std::path::PathBuf {
        self.shared.lock().files.root.clone()
    }

    /// URIs of the host's sessions.
    pub fn session_uris(&self) -> Vec<String> {
        self.shared.lock().state.sessions.keys().cloned().collect()
    }

    /// Stops accepting and closes every connection (1001).
    pub async fn shutdown(self) {
        self.accept.abort();
        self.shared.lock().close_all(1001, "host shutting down");
        // Let connection tasks flush their close frames.
        tokio::task::yield_now().await;
    }
}

impl Drop for SimHost {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

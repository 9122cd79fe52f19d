//! A per-client link: the connection one client session holds to one host
//! (contract §2 "Why per-client links").
//!
//! Opened lazily when the session first needs the host, it initializes with
//! the session's derived upstream client id (never the client's own id, never
//! the user's token) and the client's negotiated protocol version, then pumps
//! frames: client → host in the order the session queued them, host → client
//! through its [`LinkOwner`] (the client session, which this module does not
//! know). When it cannot open or drops, the owner is told
//! ([`LinkOwner::on_link_down`]) with the dispatches still queued, so they
//! get rejection echoes ("host unavailable").

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::Message;
use tracing::Instrument as _;

use super::dial_in::HostSocket;
use super::frames::Texts;
use super::hub::HostHub;

/// Whether a link may read from its host now (§5.9).
pub enum Room {
    /// Up to `frames` frames and about `bytes` bytes (the frame that crosses
    /// the byte allowance is still taken).
    Take {
        /// Frames the owner can take now.
        frames: usize,
        /// Bytes the owner can take now.
        bytes: usize,
    },
    /// None now: the future resolves when there is room. The link reads
    /// nothing from the host meanwhile, so the host feels TCP backpressure.
    Wait(BoxFuture<'static, ()>),
}

/// Most frames a link hands its owner at once. Frames already read from
/// the host's socket are taken together (one owner call, one session lock,
/// one wake-up of the client's writer, one TLS write) instead of one by one.
/// 256 lets one batch take everything a 64 KiB read brought (~200 frames of
/// ~320 bytes): one stream, 633 → 565–575 ms per 1M against 64.
const BATCH_FRAMES: usize = 256;
/// Most bytes of one batch (the frame that crosses it is still taken).
const BATCH_BYTES: usize = 256 * 1024;

/// Who a link speaks for, fixed when it opens.
#[derive(Debug, Clone)]
pub struct LinkSpec {
    /// The upstream client id (contract §2, B2).
    pub upstream_id: String,
    /// The protocol version negotiated with the client.
    pub version: String,
    /// The end user's (issuer, subject), for the handshake headers.
    pub user: (String, String),
    /// Silence after which the link pings the host.
    pub ping_after: Duration,
    /// Silence after a ping after which the host is declared dead.
    pub ping_timeout: Duration,
    /// Commands queued towards the host before [`Link::send`] refuses more.
    pub queue_frames: usize,
    /// How long the owner may have no room before it is told it stalled
    /// ([`LinkOwner::on_stalled`], §5.9 `slow_client_secs`).
    pub stall_after: Duration,
}

/// The narrow interface through which a link reports to its owner (the
/// client session, which this module does not know). No call is made while
/// the link holds a lock.
pub trait LinkOwner: Send + Sync + 'static {
    /// Link `link` to `host` initialized; `server_seq` is the host's
    /// `InitializeResult.serverSeq` (the link's first watermark, §5.8).
    fn on_link_up(&self, host: &Arc<HostHub>, link: u64, server_seq: u64);
    /// Text frames from the host, in the order read (`read_at`: when the
    /// link was woken to read them); frames to write back to the host
    /// (answers to its requests) are pushed to `replies`. Returns the room
    /// left after them, as [`Self::room`] would (the link's next read is
    /// sized by it without asking again).
    fn on_host_frames(
        &self,
        host: &Arc<HostHub>,
        link: u64,
        read_at: std::time::Instant,
        frames: &[&str],
        replies: &mut Vec<String>,
    ) -> Room;
    /// The connection dropped; a resume will be tried. Requests in flight on
    /// it can no longer be answered.
    fn on_connection_lost(&self, host: &Arc<HostHub>, link: u64);
    /// What an upstream `reconnect` needs: the watermark and the host
    /// channels to resume; `None` when the link should not be resumed.
    fn resume_plan(&self, host: &Arc<HostHub>, link: u64) -> Option<(u64, Vec<String>)>;
    /// The link failed to open (`was_up` false) or is gone for good;
    /// `unsent` holds what was queued and never written.
    fn on_link_down(&self, host: &Arc<HostHub>, link: u64, was_up: bool, unsent: Vec<LinkCmd>);
    /// How much the link may read from its host now (§5.9).
    fn room(&self) -> Room;
    /// The owner has had no room for [`LinkSpec::stall_after`]: it closes its
    /// client (4008), after which it has room again (it buffers for replay).
    fn on_stalled(&self, host: &Arc<HostHub>);
}

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
    tx: mpsc::Sender<LinkCmd>,
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
    /// Starts a link for `owner` to `host`; frames sent before it is up
    /// are queued in order. With a [`Baseline`], `initialize` subscribes
    /// those channels and hands the snapshots back (re-baselining, §5.5).
    pub fn open(
        owner: Weak<dyn LinkOwner>,
        spec: LinkSpec,
        host: Arc<HostHub>,
        baseline: Baseline,
    ) -> Arc<Self> {
        let (tx, rx) = mpsc::channel(spec.queue_frames.max(1));
        let next_id = Arc::new(AtomicU64::new(1));
        let link = Arc::new(Self {
            id: NEXT_LINK.fetch_add(1, Ordering::Relaxed),
            host: host.clone(),
            tx,
            next_id: next_id.clone(),
        });
        host.links.fetch_add(1, Ordering::Relaxed);
        // The link's lifecycle (dial, initialize, resume, ping, failure,
        // close) runs in this span, so its log lines name the host, link and
        // upstream id (a pseudonym: never the client's own id or the user's
        // token). A root span: it outlives the client request that opened
        // the link, whose exported span (`crate::otel`) must end with its
        // answer. The frame path runs outside it (see [`Ends::span`]).
        let span = tracing::info_span!(parent: None, "link", host = %host.id, link = link.id,
            upstream = %spec.upstream_id);
        let ends = Ends {
            owner,
            spec,
            host,
            link_id: link.id,
            span,
        };
        tokio::spawn(run(ends, rx, next_id, baseline));
        link
    }

    /// A fresh id for a request the relay sends on this link (ids the
    /// relay originates are non-negative integers).
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Queues a frame; `false` if the link task has ended or its queue
    /// (`LinkSpec::queue_frames`) is full ([`Link::is_busy`]).
    pub fn send(&self, cmd: LinkCmd) -> bool {
        self.tx.try_send(cmd).is_ok()
    }

    /// Whether the link is alive but its queue is full (the host reads
    /// slower than this client writes).
    pub fn is_busy(&self) -> bool {
        !self.tx.is_closed() && self.tx.capacity() == 0
    }
}

/// The two ends of a link task: its owner and its host.
struct Ends {
    owner: Weak<dyn LinkOwner>,
    spec: LinkSpec,
    host: Arc<HostHub>,
    link_id: u64,
    /// The link's span, entered around its lifecycle work and its rare
    /// events, not around the frame path: a span entered on every wake-up
    /// of the task costs the subscriber's bookkeeping per relayed frame
    /// (~0.4–0.7 µs per paced delta on cold caches, BENCHMARKS.md
    /// thirty-first round). Events on the frame path name their host (and
    /// link, where the code has it) themselves.
    span: tracing::Span,
}

impl Ends {
    fn owner(&self) -> Option<Arc<dyn LinkOwner>> {
        self.owner.upgrade()
    }

    async fn dial(&self) -> Result<HostSocket, super::dial::DialError> {
        let (issuer, subject) = &self.spec.user;
        self.host.dial(Some((issuer, subject))).await
    }
}

async fn run(ends: Ends, mut rx: mpsc::Receiver<LinkCmd>, ids: Arc<AtomicU64>, baseline: Baseline) {
    let span = ends.span.clone();
    let Some((mut ws, early, server_seq)) = open(&ends, baseline).instrument(span.clone()).await
    else {
        span.in_scope(|| fail(&ends, &mut rx, false));
        return;
    };
    let Some(owner) = ends.owner() else { return };
    span.in_scope(|| {
        owner.on_link_up(&ends.host, ends.link_id, server_seq);
        hand_over(&*owner, &ends, early);
    });
    drop(owner);
    loop {
        if !pump(&ends, &mut rx, &ids, &mut ws).await {
            return; // the owner closed the link
        }
        // The connection dropped: try to continue it (§5.8).
        if let Some(owner) = ends.owner() {
            span.in_scope(|| owner.on_connection_lost(&ends.host, ends.link_id));
        }
        match resume(&ends).instrument(span.clone()).await {
            Some(resumed) => ws = resumed,
            None => {
                span.in_scope(|| fail(&ends, &mut rx, true));
                return;
            }
        }
    }
}

/// Pumps frames both ways until the connection drops (`true`) or the
/// owner closes the link (`false`). After `ping_after` without a frame
/// from the host it sends an AHP `ping`; a host that then stays silent for
/// `ping_timeout` is declared dead (`true`), so the link is resumed or its
/// client resynchronised (§5.8) instead of waiting on a half-open socket.
/// While the owner has no room the link reads nothing from the host (and
/// does not ping: the silence is its own); after `stall_after` without room
/// the owner is told it stalled (§5.9).
async fn pump(
    ends: &Ends,
    rx: &mut mpsc::Receiver<LinkCmd>,
    ids: &AtomicU64,
    ws: &mut HostSocket,
) -> bool {
    let mut heard = Heard::new(ends.spec.ping_after, ends.spec.ping_timeout);
    let mut paused: Option<Paused> = None;
    let mut allowance = (1, 1);
    let mut batch = Batch::default();
    // One ping timer for the link, moved only when it fires: frames just
    // note when they were heard, so reading costs no timer per frame.
    let ping = tokio::time::sleep(ends.spec.ping_after);
    tokio::pin!(ping);
    let mut armed = Armed::default();
    loop {
        if paused.is_none() {
            let Some(room) = batch.next_room(ends) else {
                return false;
            };
            match room {
                Room::Take { frames, bytes } => {
                    allowance = (frames.clamp(1, BATCH_FRAMES), bytes.clamp(1, BATCH_BYTES));
                }
                Room::Wait(wait) => paused = Some(Paused::new(wait, ends.spec.stall_after)),
            }
        }
        let waits = |cx: &mut Context<'_>| {
            let timer = (ping.as_mut(), &mut armed);
            poll_wake(cx, rx, &mut paused, timer, ws)
        };
        let wake = std::future::poll_fn(waits);
        match wake.await {
            Wake::Command(None) => {
                let _ = ws.close(None).await;
                return false;
            }
            Wake::Command(Some(cmd)) => {
                if !write_queued(ws, cmd, rx).await {
                    return true;
                }
            }
            Wake::Resumed(resumed) => {
                paused = None;
                heard.now();
                if let Resumed::Stalled = resumed {
                    let Some(owner) = ends.owner() else {
                        return false;
                    };
                    ends.span.in_scope(|| owner.on_stalled(&ends.host));
                }
            }
            Wake::Ping => {
                armed.ping = false;
                let timer = on_ping_timer(ends, ids, ws, &mut heard, ping.as_mut());
                if !timer.instrument(ends.span.clone()).await {
                    return true;
                }
            }
            Wake::Frames(ready) => {
                heard.now();
                let end = match ready {
                    Ok(true) => {
                        let read = (heard.at(), allowance);
                        host_messages(ends, ws, read, &mut batch).await
                    }
                    Ok(false) => Some(true),
                    Err(e) => Some(link_failed(ends, &e)),
                };
                if let Some(end) = end {
                    return end;
                }
            }
        }
    }
}

/// The ping timer fired: moves it to when the host is next due, or pings
/// the host; `false` when the link is dead (silent after a ping, or the
/// ping could not be written).
async fn on_ping_timer(
    ends: &Ends,
    ids: &AtomicU64,
    ws: &mut HostSocket,
    heard: &mut Heard,
    mut ping: Pin<&mut tokio::time::Sleep>,
) -> bool {
    match heard.due() {
        Due::Later(at) => ping.as_mut().reset(at),
        Due::Dead => {
            tracing::info!(host = %ends.host.id, "link silent after a ping: declared dead");
            return false;
        }
        Due::Ping => {
            // An id from the link's own counter: no pending request has it,
            // so the answer is ignored.
            let ping_id = ids.fetch_add(1, Ordering::Relaxed);
            let frame = crate::rpc::request_frame(
                ping_id,
                "ping",
                &json!({"channel": ahp_types::ROOT_RESOURCE_URI}),
            );
            if ws.send(Message::text(frame)).await.is_err() {
                return false;
            }
            ping.as_mut().reset(heard.pinged());
        }
    }
    true
}

/// What woke [`pump`].
enum Wake {
    /// A command from the owner (`None`: the owner closed the link).
    Command(Option<LinkCmd>),
    /// A pause ended.
    Resumed(Resumed),
    /// The ping timer fired.
    Ping,
    /// The host's socket has a frame (`Ok(true)`), ended (`Ok(false)`) or
    /// failed.
    Frames(Result<bool, tokio_tungstenite::tungstenite::Error>),
}

/// Polls what [`pump`] waits for in a fixed order. Queued commands (or a
/// closed command channel) come first, found by a look at the channel that
/// registers nothing, so a host that always has data cannot delay the
/// client's requests; then, unless paused, the host's frames; the command
/// channel and the timer are polled only when no frame is ready, and only
/// if the task's waker is not already registered with them ([`Armed`]). A
/// wake-up for host frames — one per streamed frame at a paced load — so
/// polls neither the channel nor the timer, and the wait after it polls
/// only the socket.
fn poll_wake(
    cx: &mut Context<'_>,
    rx: &mut mpsc::Receiver<LinkCmd>,
    paused: &mut Option<Paused>,
    (ping, armed): (Pin<&mut tokio::time::Sleep>, &mut Armed),
    ws: &mut HostSocket,
) -> Poll<Wake> {
    if (!rx.is_empty() || rx.is_closed() || paused.is_some())
        && let Poll::Ready(cmd) = rx.poll_recv(cx)
    {
        armed.rx = false;
        return Poll::Ready(Wake::Command(cmd));
    }
    if paused.is_some() {
        return Paused::poll(paused, cx).map(Wake::Resumed);
    }
    if let Poll::Ready(ready) = ws.poll_frame(cx) {
        return Poll::Ready(Wake::Frames(ready));
    }
    armed.check(cx);
    if !armed.rx {
        let registers = tokio::task::coop::has_budget_remaining();
        if let Poll::Ready(cmd) = rx.poll_recv(cx) {
            return Poll::Ready(Wake::Command(cmd));
        }
        armed.rx = registers;
    }
    if armed.ping && !ping.is_elapsed() {
        return Poll::Pending;
    }
    let registers = tokio::task::coop::has_budget_remaining();
    let fired = ping.poll(cx).map(|()| Wake::Ping);
    armed.ping = fired.is_pending() && registers;
    fired
}

/// Which of the link's waits already hold its task's waker, so a wait
/// after a frame need not poll them again (each poll costs a budget check
/// and a waker registration). A registration is known to hold when a poll
/// returned `Pending` with the task's budget left (with none left, tokio
/// returns `Pending` without registering). It ends when the wait is woken:
/// the channel's with a command (seen by the look in [`poll_wake`], which
/// then receives it), the timer's when it fires ([`Sleep::is_elapsed`]) or
/// is reset ([`Armed::ping`] cleared by [`pump`]).
///
/// [`Sleep::is_elapsed`]: tokio::time::Sleep::is_elapsed
#[derive(Default)]
struct Armed {
    /// The waker registered (a different one re-arms everything).
    waker: Option<std::task::Waker>,
    /// The command channel holds `waker` and nothing was sent since.
    rx: bool,
    /// The ping timer holds `waker` and was not reset since.
    ping: bool,
}

impl Armed {
    /// Forgets every registration if the task's waker changed.
    fn check(&mut self, cx: &Context<'_>) {
        if !self.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            *self = Self {
                waker: Some(cx.waker().clone()),
                rx: false,
                ping: false,
            };
        }
    }
}

/// When the host was last heard from, and whether it was pinged since.
struct Heard {
    at: tokio::time::Instant,
    pinged: bool,
    ping_after: Duration,
    ping_timeout: Duration,
}

/// What the ping timer finds when it fires.
enum Due {
    /// The host was heard from since: fire again at this instant.
    Later(tokio::time::Instant),
    /// Silent for `ping_after`: ping it.
    Ping,
    /// Silent for `ping_timeout` after a ping: the connection is dead.
    Dead,
}

impl Heard {
    fn new(ping_after: Duration, ping_timeout: Duration) -> Self {
        Self {
            at: tokio::time::Instant::now(),
            pinged: false,
            ping_after,
            ping_timeout,
        }
    }

    /// The host was heard from (or the silence was the link's own).
    fn now(&mut self) {
        self.at = tokio::time::Instant::now();
        self.pinged = false;
    }

    /// When the host was last heard from: for frames just read, when the
    /// link woke to read them (one clock read per wake-up serves both the
    /// ping timer and the owner's latency figure).
    fn at(&self) -> std::time::Instant {
        self.at.into_std()
    }

    fn due(&self) -> Due {
        let wait = self.ping_after
            + if self.pinged {
                self.ping_timeout
            } else {
                Duration::ZERO
            };
        let at = self.at + wait;
        if at > tokio::time::Instant::now() {
            Due::Later(at)
        } else if self.pinged {
            Due::Dead
        } else {
            Due::Ping
        }
    }

    /// A ping was sent; returns when the host must have answered.
    fn pinged(&mut self) -> tokio::time::Instant {
        self.pinged = true;
        self.at + self.ping_after + self.ping_timeout
    }
}

/// Host frames read together, the answers the owner wants written back,
/// and the room the owner reported after them (taken by the next wait).
#[derive(Default)]
struct Batch {
    texts: Texts,
    replies: Vec<String>,
    room: Option<Room>,
    /// An empty frame list whose allocation the next batch reuses.
    frames: Vec<&'static str>,
}

/// `frames` emptied, its allocation kept for the next batch: collecting an
/// empty vector's iterator into elements of the same layout reuses its
/// buffer (std's in-place collection), so no frame outlives its batch and
/// a batch allocates no list once one was as long.
fn spare(mut frames: Vec<&str>) -> Vec<&'static str> {
    frames.clear();
    frames.into_iter().map(|_| "").collect()
}

impl Batch {
    /// The room for the next read: what the owner reported after the last
    /// batch, else its answer now; `None` when the owner is gone.
    fn next_room(&mut self, ends: &Ends) -> Option<Room> {
        match self.room.take() {
            Some(room) => Some(room),
            None => Some(ends.owner()?.room()),
        }
    }
}

/// Hands every text frame already in the socket's read buffer (up to
/// `allowance` frames and bytes; no further read, no waker registered) to
/// the owner in one call, read in place, then writes its replies; `Some`
/// when [`pump`] must end with that value.
async fn host_messages(
    ends: &Ends,
    ws: &mut HostSocket,
    (read_at, allowance): (std::time::Instant, (usize, usize)),
    batch: &mut Batch,
) -> Option<bool> {
    let mut end = match ws.take_texts(&mut batch.texts, allowance) {
        Ok(true) => None,
        Ok(false) => {
            // The host closed: our answering close goes out as it would
            // have with a read (best effort, the connection is ending).
            let _ = ws.flush().await;
            Some(true)
        }
        Err(e) => Some(link_failed(ends, &e)),
    };
    if !batch.texts.is_empty() {
        let Some(owner) = ends.owner() else {
            return Some(false);
        };
        // The batch's frame list reuses the last batch's allocation.
        let mut frames: Vec<&str> = std::mem::take(&mut batch.frames);
        if let Err(e) = ws.texts(&batch.texts, &mut frames) {
            end = Some(link_failed(ends, &e));
        }
        let replies = &mut batch.replies;
        let room = owner.on_host_frames(&ends.host, ends.link_id, read_at, &frames, replies);
        batch.room = Some(room);
        batch.frames = spare(frames);
    }
    ws.release(&mut batch.texts);
    if !batch.replies.is_empty() {
        for reply in batch.replies.drain(..) {
            if ws.feed(Message::text(reply)).await.is_err() {
                return Some(true);
            }
        }
        if ws.flush().await.is_err() {
            return Some(true);
        }
    }
    end
}

/// Logs why the host connection failed (e.g. a frame over
/// `upstream_max_frame_bytes`): it is unusable and the link resumes on a
/// new one. Always `true` (the pump ends with a dropped connection).
fn link_failed(ends: &Ends, e: &tokio_tungstenite::tungstenite::Error) -> bool {
    ends.span.in_scope(|| {
        tracing::warn!(host = %ends.host.id, error = %e, "link connection failed");
    });
    true
}

/// Hands frames read outside the pump (before `initialize` was answered,
/// or replayed by an upstream `reconnect`) to `owner`; their replies are
/// dropped (the host asked before the link was up).
fn hand_over(owner: &dyn LinkOwner, ends: &Ends, frames: Vec<String>) {
    if frames.is_empty() {
        return;
    }
    let frames: Vec<&str> = frames.iter().map(String::as_str).collect();
    let read_at = std::time::Instant::now();
    let _room = owner.on_host_frames(&ends.host, ends.link_id, read_at, &frames, &mut Vec::new());
}

/// A link without room: the owner's room future, and the stall timer
/// started when the room ran out. Both live only while paused, so a wake-up
/// with room builds no timer (no clock read, no runtime handle) and the
/// select's state stays a few words.
struct Paused {
    wait: BoxFuture<'static, ()>,
    stall: Pin<Box<tokio::time::Sleep>>,
}

/// How a pause ended.
enum Resumed {
    /// The owner has room again.
    Room,
    /// `stall_after` passed first (§5.9).
    Stalled,
}

impl Paused {
    fn new(wait: BoxFuture<'static, ()>, stall_after: Duration) -> Self {
        Self {
            wait,
            stall: Box::pin(tokio::time::sleep(stall_after)),
        }
    }

    /// Ready when the room future or the stall timer is (room first);
    /// pending forever when not paused (the select only polls it when
    /// paused, and `paused` changes only between selects).
    fn poll(paused: &mut Option<Self>, cx: &mut Context<'_>) -> Poll<Resumed> {
        let Some(p) = paused.as_mut() else {
            return Poll::Pending;
        };
        if p.wait.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Resumed::Room);
        }
        p.stall.as_mut().poll(cx).map(|()| Resumed::Stalled)
    }
}

/// Writes `first` and everything else already queued, then flushes once;
/// `false` if the connection failed.
async fn write_queued(
    ws: &mut HostSocket,
    first: LinkCmd,
    rx: &mut mpsc::Receiver<LinkCmd>,
) -> bool {
    let (LinkCmd::Frame(f) | LinkCmd::Dispatch { frame: f, .. }) = first;
    if ws.feed(Message::text(f)).await.is_err() {
        return false;
    }
    while let Ok(cmd) = rx.try_recv() {
        let (LinkCmd::Frame(f) | LinkCmd::Dispatch { frame: f, .. }) = cmd;
        if ws.feed(Message::text(f)).await.is_err() {
            break;
        }
    }
    ws.flush().await.is_ok()
}

/// Re-dials a dropped link and asks the host to `reconnect` it from the
/// link's watermark. A `replay` continues seamlessly (its envelopes are
/// numbered as usual; repeats are dropped by the watermark); a `snapshot`,
/// an error or no host within the attempts is a loss of continuity (`None`).
async fn resume(ends: &Ends) -> Option<HostSocket> {
    let host = &ends.host;
    for delay in [100u64, 400, 1600] {
        tokio::time::sleep(Duration::from_millis(delay)).await;
        let (watermark, channels) = ends.owner()?.resume_plan(host, ends.link_id)?;
        let request = crate::rpc::request_frame(
            0,
            "reconnect",
            &json!({
            "channel": ahp_types::ROOT_RESOURCE_URI, "clientId": ends.spec.upstream_id,
            "lastSeenServerSeq": watermark, "subscriptions": channels}),
        );
        let Ok(mut ws) = ends.dial().await else {
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
        let owner = ends.owner()?;
        let replayed = actions.iter().map(crate::rpc::action_frame).collect();
        hand_over(&*owner, ends, replayed);
        hand_over(&*owner, ends, early);
        tracing::info!(host = %host.id, "link resumed by upstream replay");
        return Some(ws);
    }
    None
}

/// Sends `request` (id 0) and waits for its answer; frames before it are returned.
async fn ask(ws: &mut HostSocket, request: &str) -> Option<(Value, Vec<String>)> {
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
async fn open(ends: &Ends, mut baseline: Baseline) -> Option<(HostSocket, Vec<String>, u64)> {
    let answer = opened(ends, &baseline.channels).await;
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

async fn opened(ends: &Ends, channels: &[String]) -> Option<(HostSocket, Vec<String>, Value)> {
    let host = &ends.host;
    let mut subs = vec![ahp_types::ROOT_RESOURCE_URI.to_string()];
    subs.extend(channels.iter().cloned());
    let init = crate::rpc::request_frame(
        0,
        "initialize",
        &json!({
        "channel": ahp_types::ROOT_RESOURCE_URI,
        "protocolVersions": super::version::offer(&ends.spec.version),
        "clientId": ends.spec.upstream_id, "initialSubscriptions": subs}),
    );
    let mut ws = match ends.dial().await {
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

/// Reports the link down with what is still queued on it.
fn fail(ends: &Ends, rx: &mut mpsc::Receiver<LinkCmd>, was_up: bool) {
    rx.close();
    let mut unsent = Vec::new();
    while let Ok(cmd) = rx.try_recv() {
        unsent.push(cmd);
    }
    if let Some(owner) = ends.owner() {
        owner.on_link_down(&ends.host, ends.link_id, was_up, unsent);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_tungstenite::WebSocketStream;
    use tokio_tungstenite::tungstenite::protocol::Role;

    /// What one poll of [`poll_wake`] gives, with the host's frames ready.
    async fn wake_once(
        rx: &mut mpsc::Receiver<LinkCmd>,
        ws: &mut HostSocket,
        ping: Pin<&mut tokio::time::Sleep>,
    ) -> &'static str {
        let mut ping = ping;
        let mut paused = None;
        let mut armed = Armed::default();
        let waits = |cx: &mut Context<'_>| {
            let timer = (ping.as_mut(), &mut armed);
            poll_wake(cx, rx, &mut paused, timer, ws)
        };
        let wake = std::future::poll_fn(waits);
        match wake.await {
            Wake::Command(Some(_)) => "command",
            Wake::Command(None) => "closed",
            Wake::Frames(Ok(true)) => "frames",
            Wake::Frames(_) => "host ended",
            Wake::Resumed(_) => "resumed",
            Wake::Ping => "ping",
        }
    }

    /// A host's end of an in-memory connection, and the link's socket on
    /// the other end.
    async fn host_and_link_socket() -> (WebSocketStream<tokio::io::DuplexStream>, HostSocket) {
        let (ours, theirs) = tokio::io::duplex(1 << 20);
        let host = WebSocketStream::from_raw_socket(theirs, Role::Server, None).await;
        let limits = crate::upstream::frames::FrameLimits {
            max_message_bytes: 1 << 20,
            read_buffer_bytes: 4096,
        };
        (host, HostSocket::new(Box::new(ours), Role::Client, limits))
    }

    /// A host that always has data does not hold back the owner's commands:
    /// with host frames ready, a queued command wakes the link first, then
    /// the frames do, and a closed command channel is seen before them too
    /// (a link whose owner is gone stops reading its host).
    #[tokio::test]
    async fn a_queued_command_comes_before_ready_host_frames() {
        let (mut host, mut ws) = host_and_link_socket().await;
        for n in 0..3 {
            host.send(Message::text(format!("frame {n}")))
                .await
                .unwrap();
        }
        let (tx, mut rx) = mpsc::channel(4);
        let ping = tokio::time::sleep(Duration::from_secs(3600));
        tokio::pin!(ping);
        // The frames are read and waiting before the command is queued.
        assert_eq!(wake_once(&mut rx, &mut ws, ping.as_mut()).await, "frames");
        tx.send(LinkCmd::Frame("request".into())).await.unwrap();
        assert_eq!(wake_once(&mut rx, &mut ws, ping.as_mut()).await, "command");
        assert_eq!(wake_once(&mut rx, &mut ws, ping.as_mut()).await, "frames");
        drop(tx);
        assert_eq!(wake_once(&mut rx, &mut ws, ping.as_mut()).await, "closed");
    }

    /// What one wait of [`pump`] gives, its registrations kept in `armed`
    /// from one wait to the next as the pump keeps them.
    async fn wait(
        rx: &mut mpsc::Receiver<LinkCmd>,
        ws: &mut HostSocket,
        mut ping: Pin<&mut tokio::time::Sleep>,
        armed: &mut Armed,
    ) -> &'static str {
        let mut paused = None;
        let waits =
            |cx: &mut Context<'_>| poll_wake(cx, rx, &mut paused, (ping.as_mut(), armed), ws);
        let wake = tokio::time::timeout(Duration::from_secs(10), std::future::poll_fn(waits));
        match wake.await {
            Err(_) => "nothing for 10 s",
            Ok(Wake::Command(_)) => "command",
            Ok(Wake::Frames(Ok(true))) => "frames",
            Ok(Wake::Frames(_)) => "host ended",
            Ok(Wake::Resumed(_)) => "resumed",
            Ok(Wake::Ping) => "ping",
        }
    }

    /// The waits after a frame skip polling the command channel and the
    /// ping timer, whose wakers a wait before it registered; neither wake-up
    /// is lost for it: a command queued after a frame was read still wakes
    /// the link, and so does the ping timer when it fires.
    #[tokio::test]
    async fn waits_registered_once_still_wake_the_link() {
        let (mut host, mut ws) = host_and_link_socket().await;
        let (tx, mut rx) = mpsc::channel(4);
        let ping = tokio::time::sleep(Duration::from_millis(600));
        tokio::pin!(ping);
        let mut armed = Armed::default();
        // Nothing is ready: the first wait registers the channel and the
        // timer, then a frame from the host ends it.
        let frame = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            host.send(Message::text("frame")).await.unwrap();
            host
        });
        assert_eq!(
            wait(&mut rx, &mut ws, ping.as_mut(), &mut armed).await,
            "frames"
        );
        assert!(armed.rx && armed.ping, "the first wait registered both");
        let _host = frame.await.unwrap();
        let mut texts = Texts::default();
        assert!(ws.take_texts(&mut texts, (16, 1 << 16)).unwrap());
        ws.release(&mut texts);
        // A command sent while the next wait skips the channel wakes it.
        let sender = tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            sender.send(LinkCmd::Frame("request".into())).await.unwrap();
        });
        assert_eq!(
            wait(&mut rx, &mut ws, ping.as_mut(), &mut armed).await,
            "command"
        );
        assert!(
            !armed.rx,
            "a received command ends the channel's registration"
        );
        // The timer, registered by the first wait only, fires into a wait
        // that skipped it.
        assert!(armed.ping && !ping.is_elapsed());
        assert_eq!(
            wait(&mut rx, &mut ws, ping.as_mut(), &mut armed).await,
            "ping"
        );
        // And the channel, registered again by that wait, still wakes one.
        armed.ping = false;
        ping.as_mut()
            .reset(tokio::time::Instant::now() + Duration::from_secs(3600));
        tx.send(LinkCmd::Frame("another".into())).await.unwrap();
        assert_eq!(
            wait(&mut rx, &mut ws, ping.as_mut(), &mut armed).await,
            "command"
        );
    }

    /// A batch's frame list is handed to the next batch empty and with its
    /// allocation (no list allocated per batch on a stream).
    #[test]
    fn a_spare_frame_list_keeps_its_allocation() {
        let text = String::from("frame");
        let mut frames: Vec<&str> = Vec::with_capacity(8);
        frames.extend([text.as_str(), text.as_str()]);
        let at = frames.as_ptr() as usize;
        let spare = spare(frames);
        assert!(spare.is_empty());
        assert!(spare.capacity() >= 8, "{}", spare.capacity());
        assert_eq!(spare.as_ptr() as usize, at);
    }
}

//! `ahp-relay client`: command-line arguments and the `sessions`, `tail` and
//! `send` commands.
//!
//! Output contract: data goes to stdout (session lines, reply text), status
//! lines and errors go to stderr, one line each. Exit codes: 0 success,
//! 1 any failure, 2 the server rejected the dispatched action, 3 no echo of
//! the dispatched action arrived within `--timeout`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use ahp::{Client, ClientConfig, ClientError, SessionSubscription, SubscriptionEvent};
use ahp_types::ROOT_RESOURCE_URI;
use ahp_types::actions::ActionEnvelope;
use ahp_types::commands::{ListSessionsParams, ListSessionsResult};
use ahp_types::state::SessionSummary;

use super::chat::{
    ChatEvent, ChatStart, Step, Target, TurnEnd, TurnFollower, approve_tool_call, chat_event,
    is_echo_of, queue_message, start_turn,
};
use super::{format, ids};
use crate::upstream::dial::{DialError, DialOptions, connect_client};

/// Protocol versions offered in `initialize`.
const PROTOCOL_VERSIONS: [&str; 1] = ["1.0.0"];
/// Per-subscription broadcast buffer: large enough that no event is skipped.
const SUBSCRIPTION_BUFFER: usize = 65_536;
/// `sessions` stops paging after this many items.
const MAX_SESSIONS: usize = 10_000;

/// Options of `ahp-relay client`, accepted before or after the subcommand.
#[derive(clap::Args)]
pub struct ClientArgs {
    /// AHP endpoint (`ws://` or `wss://`).
    #[arg(long, env = "AHP_RELAY_URL", global = true, value_name = "URL")]
    pub url: Option<String>,
    /// Bearer token sent on the WebSocket upgrade request.
    #[arg(
        long,
        env = "AHP_RELAY_TOKEN",
        hide_env_values = true,
        global = true,
        value_name = "TOKEN"
    )]
    pub token: Option<String>,
    /// PEM file of the CA certificates to trust for `wss://` (default: webpki roots).
    #[arg(long = "ca", env = "AHP_RELAY_CA", global = true, value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// Do not verify the server certificate for `wss://` (overrides --ca).
    #[arg(long, global = true)]
    pub insecure: bool,
    /// Client id sent in `initialize` [default: cli-<random hex>].
    #[arg(long, global = true, value_name = "ID")]
    pub client_id: Option<String>,
    /// Timeout in seconds for connecting, for each request and for the echo of a dispatch.
    #[arg(
        long,
        global = true,
        value_name = "SECS",
        default_value_t = 30,
        value_parser = clap::value_parser!(u64).range(1..=86_400)
    )]
    pub timeout: u64,
    /// What to do.
    #[command(subcommand)]
    pub command: ClientCommand,
}

/// The client subcommands.
#[derive(clap::Subcommand)]
pub enum ClientCommand {
    /// Print every session, one tab-separated line each:
    /// resource, status, modifiedAt, provider, title.
    Sessions {
        /// Page size for `listSessions`.
        #[arg(
            long,
            default_value_t = 50,
            value_parser = clap::value_parser!(u32).range(1..=10_000)
        )]
        limit: u32,
    },
    /// Print the reply text streamed on a chat as it arrives.
    Tail {
        /// Chat URI (`ahp-chat:/...`).
        chat: String,
        /// Exit 0 after this many turns have finished (default: until closed or Ctrl-C).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        turns: Option<u64>,
    },
    /// Start a turn on a chat (or queue a message) and wait for the server to accept it.
    Send {
        /// Chat URI (`ahp-chat:/...`).
        chat: String,
        /// Message text.
        text: String,
        /// After acceptance, print the reply of the turn until it finishes.
        #[arg(long)]
        wait: bool,
        /// Approve every tool call of the turn that asks for confirmation.
        #[arg(long, requires = "wait")]
        approve_tools: bool,
        /// Queue the message (`chat/pendingMessageSet`) instead of starting a turn.
        #[arg(long)]
        queue: bool,
    },
}

/// Why a client command failed; `Display` is the one line printed to stderr.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Neither `--url` nor `AHP_RELAY_URL` was given.
    #[error("no server URL: pass --url or set AHP_RELAY_URL")]
    MissingUrl,
    /// The connection could not be opened.
    #[error(transparent)]
    Dial(#[from] DialError),
    /// The server answered a request with a JSON-RPC error.
    #[error("error {code}: {message}")]
    Rpc {
        /// JSON-RPC error code.
        code: i32,
        /// JSON-RPC error message.
        message: String,
    },
    /// A request got no response within `--timeout`.
    #[error("{method} timed out after {}s", timeout.as_secs())]
    RequestTimeout {
        /// The JSON-RPC method.
        method: &'static str,
        /// The limit that was exceeded.
        timeout: Duration,
    },
    /// A request or notification failed locally (connection gone, bad response).
    #[error("{method} failed: {source}")]
    Request {
        /// The JSON-RPC method.
        method: &'static str,
        /// The SDK error.
        source: ClientError,
    },
    /// The subscribed URI is not a chat channel.
    #[error("{uri} is not a chat channel (the server sent a {kind} snapshot)")]
    NotAChat {
        /// The URI given.
        uri: String,
        /// The kind of snapshot received.
        kind: &'static str,
    },
    /// The server echoed our action with a `rejectionReason` (exit code 2).
    #[error("rejected: {0}")]
    Rejected(String),
    /// No echo of our action arrived in time (exit code 3).
    #[error("timed out after {}s waiting for the server to accept the dispatched action", .0.as_secs())]
    EchoTimeout(Duration),
    /// The server closed the connection.
    #[error("connection closed by the server")]
    ConnectionClosed,
    /// The followed turn was cancelled.
    #[error("turn cancelled")]
    TurnCancelled,
    /// The followed turn ended with `chat/error`.
    #[error("turn failed: {0}")]
    TurnFailed(String),
    /// Writing to stdout failed (e.g. closed pipe).
    #[error("cannot write to stdout: {0}")]
    Stdout(#[source] std::io::Error),
}

impl CliError {
    /// The process exit code for this error: 2 rejected, 3 echo timeout, else 1.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Rejected(_) => 2,
            CliError::EchoTimeout(_) => 3,
            _ => 1,
        }
    }
}

/// Run one client command to completion.
///
/// Never panics; on failure prints exactly one line to stderr and returns the
/// exit code of [`CliError::exit_code`].
pub async fn run(args: ClientArgs) -> ExitCode {
    match execute(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            note(&err.to_string().replace(['\r', '\n'], " "));
            ExitCode::from(err.exit_code())
        }
    }
}

/// Connect, initialize, run the subcommand, shut the client down.
async fn execute(args: ClientArgs) -> Result<(), CliError> {
    let conn = Connection::open(&args).await?;
    let outcome = match args.command {
        ClientCommand::Sessions { limit } => sessions(&conn, limit).await,
        ClientCommand::Tail { chat, turns } => tail(&conn, chat, turns).await,
        ClientCommand::Send {
            chat,
            text,
            wait,
            approve_tools,
            queue,
        } => {
            let request = SendRequest {
                chat,
                text,
                wait,
                approve_tools,
                queue,
            };
            send(&conn, request).await
        }
    };
    conn.client.shutdown().await;
    outcome
}

/// An initialized client plus what the commands need to know about it.
struct Connection {
    client: Client,
    client_id: String,
    timeout: Duration,
}

impl Connection {
    /// Dial, start the SDK client and send `initialize` (no initial subscriptions).
    async fn open(args: &ClientArgs) -> Result<Self, CliError> {
        let url = args.url.clone().ok_or(CliError::MissingUrl)?;
        let timeout = Duration::from_secs(args.timeout);
        let opts = DialOptions {
            url,
            token: args.token.clone(),
            ca_file: args.ca.clone(),
            insecure: args.insecure,
            connect_timeout: timeout,
            extra_headers: Vec::new(),
        };
        let config = ClientConfig {
            default_request_timeout: Some(timeout),
            subscription_buffer: SUBSCRIPTION_BUFFER,
        };
        let client = connect_client(&opts, config).await?;
        let client_id = args.client_id.clone().unwrap_or_else(ids::client_id);
        let versions = PROTOCOL_VERSIONS.map(String::from).to_vec();
        client
            .initialize(client_id.clone(), versions, Vec::new())
            .await
            .map_err(request_failed("initialize", timeout))?;
        Ok(Self {
            client,
            client_id,
            timeout,
        })
    }

    /// Error mapper for a failed call of `method` on this connection.
    fn failed(&self, method: &'static str) -> impl FnOnce(ClientError) -> CliError + use<> {
        request_failed(method, self.timeout)
    }
}

/// Map an SDK error: JSON-RPC errors keep code and message, the SDK's request
/// timeout (`Cancelled`) becomes [`CliError::RequestTimeout`].
fn request_failed(method: &'static str, timeout: Duration) -> impl FnOnce(ClientError) -> CliError {
    move |err| match err {
        ClientError::Rpc(e) => CliError::Rpc {
            code: e.code,
            message: e.message,
        },
        ClientError::Cancelled => CliError::RequestTimeout { method, timeout },
        source => CliError::Request { method, source },
    }
}

// ─── sessions ───────────────────────────────────────────────────────────────

/// `sessions`: print every session line, then `N sessions` on stderr.
async fn sessions(conn: &Connection, limit: u32) -> Result<(), CliError> {
    let all = list_sessions(conn, limit).await?;
    print_lines(all.iter().map(format::session_line))?;
    note(&format!("{} sessions", all.len()));
    Ok(())
}

/// Page through `listSessions` until no `nextCursor` (or an empty page), at
/// most [`MAX_SESSIONS`] items.
async fn list_sessions(conn: &Connection, limit: u32) -> Result<Vec<SessionSummary>, CliError> {
    let mut all = Vec::new();
    let mut cursor = None;
    loop {
        let params = ListSessionsParams {
            channel: ROOT_RESOURCE_URI.to_owned(),
            meta: None,
            limit: Some(i64::from(limit)),
            cursor: cursor.take(),
        };
        let page: ListSessionsResult = conn
            .client
            .request("listSessions", params)
            .await
            .map_err(conn.failed("listSessions"))?;
        let empty = page.items.is_empty();
        all.extend(page.items);
        if all.len() >= MAX_SESSIONS {
            all.truncate(MAX_SESSIONS);
            return Ok(all);
        }
        match page.next_cursor {
            Some(next) if !empty => cursor = Some(next),
            _ => return Ok(all),
        }
    }
}

// ─── tail ───────────────────────────────────────────────────────────────────

/// `tail`: print the active turn's text so far, then follow the chat.
async fn tail(conn: &Connection, chat: String, turns: Option<u64>) -> Result<(), CliError> {
    let (start, mut sub) = subscribe_chat(conn, chat).await?;
    if let Some(text) = &start.active_text {
        emit(text)?;
    }
    tokio::select! {
        outcome = follow_chat(&mut sub, &start, turns) => outcome,
        () = interrupted() => Ok(()),
    }
}

/// Print deltas and a newline per finished turn; return after `turns` turns.
async fn follow_chat(
    sub: &mut SessionSubscription,
    start: &ChatStart,
    turns: Option<u64>,
) -> Result<(), CliError> {
    let mut finished = 0u64;
    loop {
        let env = next_live_action(sub, start).await?;
        match chat_event(&env) {
            ChatEvent::Delta { text, .. } => emit(text)?,
            ChatEvent::TurnEnded { .. } => {
                emit("\n")?;
                finished += 1;
                if turns.is_some_and(|n| finished >= n) {
                    return Ok(());
                }
            }
            _ => {}
        }
    }
}

/// Resolves on Ctrl-C; never resolves if the signal cannot be watched.
async fn interrupted() {
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}

// ─── send ───────────────────────────────────────────────────────────────────

/// The arguments of `send`.
struct SendRequest {
    chat: String,
    text: String,
    wait: bool,
    approve_tools: bool,
    queue: bool,
}

/// `send`: dispatch, await the echo, optionally follow the reply.
async fn send(conn: &Connection, req: SendRequest) -> Result<(), CliError> {
    let (start, mut sub) = subscribe_chat(conn, req.chat.clone()).await?;
    let (id, action, target) = if req.queue {
        let id = ids::message_id();
        let action = queue_message(id.clone(), req.text);
        let target = Target::Queued {
            message_id: id.clone(),
        };
        (id, action, target)
    } else {
        let id = ids::turn_id();
        let action = start_turn(id.clone(), ids::now_iso8601(), req.text);
        (id.clone(), action, Target::Turn(id))
    };
    let handle = conn
        .client
        .dispatch(req.chat.clone(), action)
        .await
        .map_err(conn.failed("dispatchAction"))?;
    let echo = await_echo(conn, &mut sub, &start, handle.client_seq).await?;
    if let Some(reason) = echo.rejection_reason {
        return Err(CliError::Rejected(reason));
    }
    note(&format!("accepted {id} serverSeq={}", echo.server_seq));
    if !req.wait {
        return Ok(());
    }
    let follower = TurnFollower::new(target, req.approve_tools);
    follow_turn(conn, &mut sub, &start, &req.chat, follower).await
}

/// Wait up to `--timeout` for the envelope echoing our dispatch `client_seq`.
async fn await_echo(
    conn: &Connection,
    sub: &mut SessionSubscription,
    start: &ChatStart,
    client_seq: i64,
) -> Result<ActionEnvelope, CliError> {
    let wait = async {
        loop {
            let env = next_live_action(sub, start).await?;
            if is_echo_of(&env, &conn.client_id, client_seq) {
                return Ok(env);
            }
        }
    };
    tokio::time::timeout(conn.timeout, wait)
        .await
        .map_err(|_| CliError::EchoTimeout(conn.timeout))?
}

/// Print the followed turn's reply, approve its tools if asked, until it ends.
async fn follow_turn(
    conn: &Connection,
    sub: &mut SessionSubscription,
    start: &ChatStart,
    chat: &str,
    mut follower: TurnFollower,
) -> Result<(), CliError> {
    loop {
        let env = next_live_action(sub, start).await?;
        match follower.on_action(&env) {
            Step::Ignore => {}
            Step::Print(text) => emit(text)?,
            Step::Approve {
                turn_id,
                tool_call_id,
            } => {
                let action = approve_tool_call(turn_id, tool_call_id);
                conn.client
                    .dispatch(chat.to_owned(), action)
                    .await
                    .map_err(conn.failed("dispatchAction"))?;
            }
            Step::Finished(end) => {
                emit("\n")?;
                return turn_outcome(end);
            }
        }
    }
}

/// Success only for a completed turn.
fn turn_outcome(end: TurnEnd) -> Result<(), CliError> {
    match end {
        TurnEnd::Complete => Ok(()),
        TurnEnd::Cancelled => Err(CliError::TurnCancelled),
        TurnEnd::Error(message) => Err(CliError::TurnFailed(message)),
    }
}

// ─── shared ─────────────────────────────────────────────────────────────────

/// Subscribe to `chat` (the handle is attached before the request is sent)
/// and read its snapshot.
async fn subscribe_chat(
    conn: &Connection,
    chat: String,
) -> Result<(ChatStart, SessionSubscription), CliError> {
    let (result, sub) = conn
        .client
        .subscribe(chat.clone())
        .await
        .map_err(conn.failed("subscribe"))?;
    let start =
        ChatStart::from_subscribe(result).map_err(|kind| CliError::NotAChat { uri: chat, kind })?;
    Ok((start, sub))
}

/// The next action envelope newer than the snapshot; `ConnectionClosed` when
/// the subscription ends.
async fn next_live_action(
    sub: &mut SessionSubscription,
    start: &ChatStart,
) -> Result<ActionEnvelope, CliError> {
    loop {
        match sub.recv().await {
            None => return Err(CliError::ConnectionClosed),
            Some(SubscriptionEvent::Action(env)) if start.is_live(&env) => return Ok(env),
            Some(_) => {}
        }
    }
}

/// Write `text` to stdout and flush.
fn emit(text: &str) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(CliError::Stdout)
}

/// Write each line plus a newline to stdout, then flush.
fn print_lines(lines: impl Iterator<Item = String>) -> Result<(), CliError> {
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for line in lines {
        writeln!(out, "{line}").map_err(CliError::Stdout)?;
    }
    out.flush().map_err(CliError::Stdout)
}

/// Write one status line to stderr (best effort: stderr failures are ignored).
fn note(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use ahp_types::messages::JsonRpcError;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        client: ClientArgs,
    }

    fn parse(argv: &[&str]) -> Result<ClientArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("client").chain(argv.iter().copied()))
            .map(|cli| cli.client)
    }

    #[test]
    fn sessions_defaults() {
        let args = parse(&["--url", "ws://h/", "sessions"]).unwrap();
        assert_eq!(args.url.as_deref(), Some("ws://h/"));
        assert_eq!(args.timeout, 30);
        assert!(!args.insecure);
        assert!(matches!(
            args.command,
            ClientCommand::Sessions { limit: 50 }
        ));
    }

    #[test]
    fn global_options_may_follow_the_subcommand() {
        let args = parse(&[
            "tail",
            "ahp-chat:/c",
            "--turns",
            "2",
            "--url",
            "wss://h/",
            "--ca",
            "/tmp/ca.pem",
            "--insecure",
            "--client-id",
            "me",
            "--timeout",
            "5",
            "--token",
            "t0k",
        ])
        .unwrap();
        assert_eq!(args.url.as_deref(), Some("wss://h/"));
        assert_eq!(args.ca, Some(PathBuf::from("/tmp/ca.pem")));
        assert!(args.insecure);
        assert_eq!(args.client_id.as_deref(), Some("me"));
        assert_eq!(args.timeout, 5);
        assert_eq!(args.token.as_deref(), Some("t0k"));
        match args.command {
            ClientCommand::Tail { chat, turns } => {
                assert_eq!(chat, "ahp-chat:/c");
                assert_eq!(turns, Some(2));
            }
            _ => panic!("expected tail"),
        }
    }

    #[test]
    fn send_flags() {
        let args = parse(&[
            "send",
            "ahp-chat:/c",
            "hello there",
            "--wait",
            "--approve-tools",
        ])
        .unwrap();
        match args.command {
            ClientCommand::Send {
                chat,
                text,
                wait,
                approve_tools,
                queue,
            } => {
                assert_eq!(
                    (chat.as_str(), text.as_str()),
                    ("ahp-chat:/c", "hello there")
                );
                assert!(wait && approve_tools && !queue);
            }
            _ => panic!("expected send"),
        }
        assert!(parse(&["send", "ahp-chat:/c", "hi", "--queue"]).is_ok());
    }

    #[test]
    fn invalid_arguments_are_refused() {
        for argv in [
            &["send", "ahp-chat:/c", "hi", "--approve-tools"][..],
            &["send", "ahp-chat:/c"],
            &["tail", "ahp-chat:/c", "--turns", "0"],
            &["sessions", "--limit", "0"],
            &["sessions", "--timeout", "0"],
            &["sessions", "--timeout", "soon"],
            &["frobnicate"],
        ] {
            assert!(parse(argv).is_err(), "{argv:?} should fail");
        }
    }

    #[test]
    fn errors_render_as_one_line_with_exit_codes() {
        let rpc = request_failed("listSessions", Duration::from_secs(3))(ClientError::Rpc(
            JsonRpcError {
                code: -32602,
                message: "bad cursor".into(),
                data: None,
            },
        ));
        assert_eq!(rpc.to_string(), "error -32602: bad cursor");
        assert_eq!(rpc.exit_code(), 1);
        let timeout = request_failed("subscribe", Duration::from_secs(3))(ClientError::Cancelled);
        assert_eq!(timeout.to_string(), "subscribe timed out after 3s");
        let rejected = CliError::Rejected("turn already active".into());
        assert_eq!(rejected.to_string(), "rejected: turn already active");
        assert_eq!(rejected.exit_code(), 2);
        let echo = CliError::EchoTimeout(Duration::from_secs(30));
        assert_eq!(echo.exit_code(), 3);
        assert!(echo.to_string().contains("timed out after 30s"));
        assert_eq!(turn_outcome(TurnEnd::Complete).ok(), Some(()));
        assert!(matches!(
            turn_outcome(TurnEnd::Error("boom".into())),
            Err(CliError::TurnFailed(m)) if m == "boom"
        ));
    }

    #[tokio::test]
    async fn missing_url_fails_before_connecting() {
        let mut args = parse(&["sessions"]).unwrap();
        args.url = None;
        assert!(matches!(
            Connection::open(&args).await.err(),
            Some(CliError::MissingUrl)
        ));
    }
}

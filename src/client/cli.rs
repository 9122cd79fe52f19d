//! `ahp-relay client`: command-line arguments, errors with their hints, and
//! the dispatch to each command.
//!
//! Output contract: data goes to stdout (tables with a header line, `--json`
//! documents, reply text, file content), status lines and errors go to
//! stderr: an error is one line, followed by at most one `hint:` line saying
//! what to try. Exit codes: 0 success, 1 any failure, 2 the server rejected
//! the dispatched action, 3 `--timeout` passed before the echo of a dispatch
//! (or, with `send --wait`, before the turn ended).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use ahp::ClientError;

use super::conn::{Connection, note};
use super::{files, hints, objects, terminal, turns};
use crate::upstream::dial::DialError;

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
    /// Client id sent in `initialize` [default: this user's stable id for
    /// this relay, kept in `$XDG_CONFIG_HOME/ahp-relay/clients/`].
    #[arg(long, global = true, value_name = "ID")]
    pub client_id: Option<String>,
    /// Print listings as JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    /// Timeout in seconds for connecting, for each request, for the echo of a
    /// dispatch, and for the whole wait of `send --wait`.
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
    /// List the sessions this principal sees (a table: SESSION, STATUS,
    /// MODIFIED, PROVIDER, TITLE), or with --chats their chats.
    Sessions {
        /// Page size for `listSessions`.
        #[arg(
            long,
            default_value_t = 50,
            value_parser = clap::value_parser!(u32).range(1..=10_000)
        )]
        limit: u32,
        /// One line per chat: SESSION, CHAT, DEFAULT (`*` for the session's
        /// default chat), STATUS, TITLE.
        #[arg(long)]
        chats: bool,
    },
    /// List the agent providers this principal may create sessions with
    /// (PROVIDER is `<provider>.<host>`).
    Providers,
    /// Create a session; prints its URI and its default chat's.
    CreateSession {
        /// Provider as listed by `providers` (`<provider>.<host>`); may be
        /// left out when only one is visible.
        #[arg(long)]
        provider: Option<String>,
        /// Session URI to create [default: `ahp-session:/cli-<random>`].
        #[arg(long)]
        uri: Option<String>,
    },
    /// Dispose a session.
    DisposeSession {
        /// Session URI.
        session: String,
    },
    /// Create another chat in a session; prints its URI.
    CreateChat {
        /// Session URI.
        session: String,
        /// Chat URI to create [default: derived from a random id].
        #[arg(long)]
        uri: Option<String>,
    },
    /// Dispose a chat.
    DisposeChat {
        /// Chat URI.
        chat: String,
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
        /// After acceptance, print the reply of the turn until it finishes
        /// (at most --timeout); a tool call waiting for approval is reported
        /// with the command that approves it.
        #[arg(long)]
        wait: bool,
        /// Approve every tool call of the turn that asks for confirmation.
        #[arg(long, requires = "wait")]
        approve_tools: bool,
        /// Queue the message (`chat/pendingMessageSet`) instead of starting a turn.
        #[arg(long)]
        queue: bool,
    },
    /// Cancel the active turn of a chat.
    Cancel {
        /// Chat URI.
        chat: String,
    },
    /// Approve a tool call waiting for confirmation.
    Approve {
        /// Chat URI.
        chat: String,
        /// The tool call (default: the only one waiting).
        tool_call: Option<String>,
    },
    /// Deny a tool call waiting for confirmation.
    Deny {
        /// Chat URI.
        chat: String,
        /// The tool call (default: the only one waiting).
        tool_call: Option<String>,
    },
    /// Attach stdin/stdout to a terminal (like `kubectl exec -it`), or
    /// create one (on the host `--cwd` names, else where the relay picks:
    /// its default host); Ctrl-] detaches.
    Terminal {
        /// Terminal URI (`ahp-terminal:/...`) to attach to.
        #[arg(conflicts_with = "cwd")]
        terminal: Option<String>,
        /// Create a terminal in this folder (`file://<host>/<path>`).
        #[arg(long)]
        cwd: Option<String>,
    },
    /// List a directory of a host (`file://<host>/<path>`): NAME, TYPE.
    Ls {
        /// Directory URI.
        uri: String,
    },
    /// Print a file of a host to stdout.
    Cat {
        /// File URI (`file://<host>/<path>`).
        uri: String,
    },
    /// Write a file on a host from a local file or stdin.
    Put {
        /// File URI (`file://<host>/<path>`).
        uri: String,
        /// Local file to send (default: stdin).
        file: Option<PathBuf>,
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
        /// The JSON-RPC method.
        method: &'static str,
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
    /// The subscribed URI is not a session.
    #[error("{uri} is not a session (the server sent a {kind} snapshot)")]
    NotASession {
        /// The URI given.
        uri: String,
        /// The kind of snapshot received.
        kind: &'static str,
    },
    /// The subscribed URI is not a terminal.
    #[error("{uri} is not a terminal (the server sent a {kind} snapshot)")]
    NotATerminal {
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
    /// `send --wait`: the turn did not end within `--timeout` (exit code 3).
    #[error("the turn did not finish within {}s{}", .timeout.as_secs(), waiting_suffix(.waiting))]
    TurnTimeout {
        /// The limit that was exceeded.
        timeout: Duration,
        /// Tool calls the turn still waits on.
        waiting: Vec<String>,
    },
    /// The server closed the connection.
    #[error("connection closed by the server")]
    ConnectionClosed,
    /// The followed turn was cancelled.
    #[error("turn cancelled")]
    TurnCancelled,
    /// The followed turn ended with `chat/error`.
    #[error("turn failed: {0}")]
    TurnFailed(String),
    /// `cancel` on a chat without an active turn.
    #[error("{0} has no active turn")]
    NoActiveTurn(String),
    /// `approve`/`deny` without a waiting tool call (or not the one named).
    #[error("no tool call waits for confirmation on {chat}{}", named_suffix(.named))]
    NoPendingTool {
        /// The chat.
        chat: String,
        /// The tool call named, if any.
        named: Option<String>,
    },
    /// `approve`/`deny` without a tool call id while several wait.
    #[error("several tool calls wait on {chat}: name one of {}", .ids.join(", "))]
    SeveralPendingTools {
        /// The chat.
        chat: String,
        /// Their ids.
        ids: Vec<String>,
    },
    /// The server sent file content that does not decode.
    #[error("the server sent content that is not valid {0}")]
    BadContent(&'static str),
    /// Reading the local input of `put` failed.
    #[error("cannot read {what}: {source}")]
    Input {
        /// The file or `stdin`.
        what: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Writing to stdout failed (e.g. closed pipe).
    #[error("cannot write to stdout: {0}")]
    Stdout(#[source] std::io::Error),
}

/// `; waiting for approval of …` or nothing.
fn waiting_suffix(waiting: &[String]) -> String {
    if waiting.is_empty() {
        String::new()
    } else {
        format!("; it waits for approval of {}", waiting.join(", "))
    }
}

/// ` named <id>` or nothing.
fn named_suffix(named: &Option<String>) -> String {
    named
        .as_ref()
        .map_or_else(String::new, |id| format!(" named {id}"))
}

impl CliError {
    /// The process exit code for this error: 2 rejected, 3 timeouts of a
    /// dispatch's echo or of a followed turn, else 1.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Rejected(_) => 2,
            CliError::EchoTimeout(_) | CliError::TurnTimeout { .. } => 3,
            _ => 1,
        }
    }
}

/// Run one client command to completion.
///
/// Never panics; on failure prints one error line (and at most one `hint:`
/// line) to stderr and returns the exit code of [`CliError::exit_code`].
pub async fn run(args: ClientArgs) -> ExitCode {
    let subject = args
        .token
        .as_deref()
        .and_then(super::store::token_principal)
        .map(|(_, sub)| sub);
    match execute(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            note(&err.to_string().replace(['\r', '\n'], " "));
            if let Some(hint) = hints::for_error(&err, subject.as_deref()) {
                note(&format!("hint: {hint}"));
            }
            ExitCode::from(err.exit_code())
        }
    }
}

/// Connect, (re)attach the session, run the subcommand, shut the client down.
async fn execute(args: ClientArgs) -> Result<(), CliError> {
    let conn = Connection::open(&args).await?;
    let json = args.json;
    let outcome = dispatch(&conn, args.command, json).await;
    conn.client.shutdown().await;
    outcome
}

/// Run `command` on `conn`.
async fn dispatch(conn: &Connection, command: ClientCommand, json: bool) -> Result<(), CliError> {
    use ClientCommand as C;
    match command {
        C::Sessions { limit, chats } => objects::sessions(conn, limit, chats, json).await,
        C::Providers => objects::providers(conn, json).await,
        C::CreateSession { provider, uri } => {
            objects::create_session(conn, provider, uri, json).await
        }
        C::DisposeSession { session } => objects::dispose_session(conn, &session).await,
        C::CreateChat { session, uri } => objects::create_chat(conn, &session, uri).await,
        C::DisposeChat { chat } => objects::dispose_chat(conn, &chat).await,
        C::Tail { chat, turns } => turns::tail(conn, &chat, turns).await,
        C::Send {
            chat,
            text,
            wait,
            approve_tools,
            queue,
        } => {
            let request = turns::SendRequest {
                chat,
                text,
                wait,
                approve_tools,
                queue,
            };
            turns::send(conn, request).await
        }
        C::Cancel { chat } => turns::cancel(conn, &chat).await,
        C::Approve { chat, tool_call } => turns::confirm(conn, &chat, tool_call, true).await,
        C::Deny { chat, tool_call } => turns::confirm(conn, &chat, tool_call, false).await,
        C::Terminal { terminal: uri, cwd } => terminal::terminal(conn, uri, cwd).await,
        C::Ls { uri } => files::ls(conn, &uri, json).await,
        C::Cat { uri } => files::cat(conn, &uri).await,
        C::Put { uri, file } => files::put(conn, &uri, file).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::chat::TurnEnd;
    use crate::client::conn::request_failed;
    use crate::client::turns::turn_outcome;
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
            ClientCommand::Sessions {
                limit: 50,
                chats: false
            }
        ));
        assert!(!args.json);
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
            &["approve"],
            &["create-chat"],
            &["put"],
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

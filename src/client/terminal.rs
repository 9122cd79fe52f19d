//! `client terminal`: attach stdin and stdout to a host's terminal, like
//! `kubectl exec -it` — or create one first (`--cwd file://<host>/<path>`
//! names the host it runs on; without a URI or `--cwd` the relay picks it).
//!
//! What it guarantees: the terminal's content so far is printed first, then
//! every `terminal/data` as it arrives; each chunk read from stdin is sent
//! as one `terminal/input`. On a terminal, stdin is put in raw mode (keys,
//! Ctrl-C included, go to the remote side) and restored on every way out;
//! Ctrl-] detaches. When stdin ends (a pipe), the command waits for the
//! relay's echo of every input it sent, prints the terminal's output until
//! none came for [`LINGER`], then detaches. When the terminal
//! exits, the command ends with its exit code noted on stderr.

use std::io::{IsTerminal, Read};

use ahp::{SessionSubscription, SubscriptionEvent};
use ahp_types::actions::{StateAction, TerminalInputAction};
use ahp_types::commands::CreateTerminalParams;
use ahp_types::state::{SnapshotState, TerminalClaim, TerminalClientClaim, TerminalContentPart};
use serde_json::Value;
use tokio::sync::mpsc;

use super::chat::snapshot_kind;
use super::cli::CliError;
use super::conn::{Connection, emit, emit_bytes, note};
use super::ids;

/// Ctrl-]: detach, as telnet and `docker attach` do.
const DETACH: u8 = 0x1d;

/// After stdin ended and every input was echoed, how long the terminal's
/// output is still printed after its last chunk (the answer to the last
/// input arrives after that input's echo).
const LINGER: std::time::Duration = std::time::Duration::from_millis(500);

/// `terminal [URI] [--cwd CWD]`.
pub(super) async fn terminal(
    conn: &Connection,
    uri: Option<String>,
    cwd: Option<String>,
) -> Result<(), CliError> {
    let uri = match uri {
        Some(uri) => uri,
        None => create(conn, cwd).await?,
    };
    let (result, mut sub) = conn.subscribe(&uri).await?;
    let from_seq = match result.snapshot {
        Some(snap) => match snap.state {
            SnapshotState::Terminal(state) => {
                emit(&content_text(&state.content))?;
                Some(snap.from_seq)
            }
            other => {
                return Err(CliError::NotATerminal {
                    uri,
                    kind: snapshot_kind(&other),
                });
            }
        },
        None => None,
    };
    let raw = RawMode::enter();
    let input = stdin_chunks(raw.is_some());
    let outcome = attach(conn, &uri, &mut sub, from_seq, input).await;
    drop(raw);
    outcome
}

/// `createTerminal` claimed by this client, at `cwd` (without one, the
/// relay picks the host: `relay.default_host`, or the one host where the
/// principal may use terminals, else it says how to name one); returns its
/// URI.
async fn create(conn: &Connection, cwd: Option<String>) -> Result<String, CliError> {
    let uri = format!(
        "ahp-terminal:/{}",
        ids::client_id().replacen("cli-", "term-", 1)
    );
    let params = CreateTerminalParams {
        channel: uri.clone(),
        meta: None,
        claim: TerminalClaim::Client(TerminalClientClaim {
            client_id: conn.client_id.clone(),
        }),
        name: None,
        cwd,
        cols: None,
        rows: None,
    };
    let _: Value = conn.call("createTerminal", params).await?;
    note(&format!("created {uri}"));
    Ok(uri)
}

/// The text of a terminal's content parts, in order.
fn content_text(parts: &[TerminalContentPart]) -> String {
    parts
        .iter()
        .map(|p| match p {
            TerminalContentPart::Unclassified(u) => u.value.clone(),
            TerminalContentPart::Command(c) => format!("{}{}", c.command_line, c.output),
            TerminalContentPart::Unknown(_) => String::new(),
        })
        .collect()
}

/// What stdin gave: bytes, the detach key, or its end.
enum Input {
    Bytes(Vec<u8>),
    Detach,
    End,
}

/// Reads stdin on its own thread (a blocked read can not be cancelled, and
/// a runtime's blocking pool would wait for it at exit; a plain thread does
/// not hold the process), forwarding chunks; in raw mode Ctrl-] detaches.
fn stdin_chunks(raw: bool) -> mpsc::Receiver<Input> {
    let (tx, rx) = mpsc::channel(16);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin();
        let mut buf = [0u8; 4096];
        loop {
            let input = match stdin.read(&mut buf) {
                Ok(0) | Err(_) => Input::End,
                Ok(n) if raw && buf[..n].contains(&DETACH) => Input::Detach,
                Ok(n) => Input::Bytes(buf[..n].to_vec()),
            };
            let last = !matches!(input, Input::Bytes(_));
            if tx.blocking_send(input).is_err() || last {
                return;
            }
        }
    });
    rx
}

/// Pump stdin to `terminal/input` and `terminal/data` to stdout until the
/// terminal exits, the user detaches, or stdin ended and every input sent
/// was echoed.
async fn attach(
    conn: &Connection,
    uri: &str,
    sub: &mut SessionSubscription,
    from_seq: Option<i64>,
    mut input: mpsc::Receiver<Input>,
) -> Result<(), CliError> {
    let mut unechoed: Vec<i64> = Vec::new();
    let mut stdin_open = true;
    let mut quiet_until: Option<tokio::time::Instant> = None;
    loop {
        if !stdin_open && unechoed.is_empty() && quiet_until.is_none() {
            quiet_until = Some(tokio::time::Instant::now() + LINGER);
        }
        let quiet = quiet_until.unwrap_or_else(tokio::time::Instant::now);
        tokio::select! {
            () = tokio::time::sleep_until(quiet), if quiet_until.is_some() => return Ok(()),
            chunk = input.recv(), if stdin_open => match chunk {
                Some(Input::Bytes(bytes)) => {
                    let data = String::from_utf8_lossy(&bytes).into_owned();
                    let action = StateAction::TerminalInput(TerminalInputAction { data });
                    unechoed.push(conn.dispatch(uri, action).await?);
                }
                Some(Input::Detach) => return Ok(()),
                Some(Input::End) | None => stdin_open = false,
            },
            event = sub.recv() => {
                let Some(SubscriptionEvent::Action(env)) = event else {
                    if event.is_none() {
                        return Err(CliError::ConnectionClosed);
                    }
                    continue;
                };
                if from_seq.is_some_and(|f| i64::try_from(env.server_seq).is_ok_and(|s| s <= f)) {
                    continue;
                }
                if let Some(o) = env.origin.as_ref().filter(|o| o.client_id == conn.client_id) {
                    unechoed.retain(|seq| *seq != o.client_seq);
                    if let Some(reason) = env.rejection_reason.clone() {
                        return Err(CliError::Rejected(reason));
                    }
                }
                match &env.action {
                    StateAction::TerminalData(d) => {
                        emit_bytes(d.data.as_bytes())?;
                        if quiet_until.is_some() {
                            quiet_until = Some(tokio::time::Instant::now() + LINGER);
                        }
                    }
                    StateAction::TerminalExited(e) => {
                        let code = e.exit_code.map_or_else(|| "unknown".into(), |c| c.to_string());
                        note(&format!("terminal exited (code {code})"));
                        return Ok(());
                    }
                    _ => {}
                }
            }
        }
    }
}

/// Raw mode on stdin while attached, restored when dropped.
struct RawMode {
    saved: nix::sys::termios::Termios,
}

impl RawMode {
    /// Raw mode if stdin is a terminal whose mode can be set.
    fn enter() -> Option<Self> {
        use nix::sys::termios::{SetArg, cfmakeraw, tcgetattr, tcsetattr};
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return None;
        }
        let saved = tcgetattr(&stdin).ok()?;
        let mut raw = saved.clone();
        cfmakeraw(&mut raw);
        tcsetattr(&stdin, SetArg::TCSANOW, &raw).ok()?;
        Some(Self { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        use nix::sys::termios::{SetArg, tcsetattr};
        let _ = tcsetattr(std::io::stdin(), SetArg::TCSANOW, &self.saved);
    }
}

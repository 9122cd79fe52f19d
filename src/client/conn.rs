//! One client connection and the I/O helpers every command shares:
//! open (dial, then `reconnect` to this user's retained session or
//! `initialize` a new one), subscribe, read live envelopes, write output.

use std::io::Write;
use std::time::Duration;

use ahp::{Client, ClientConfig, ClientError, SessionSubscription, SubscriptionEvent};
use ahp_types::actions::{ActionEnvelope, StateAction};
use ahp_types::commands::SubscribeResult;

use super::chat::ChatStart;
use super::cli::{CliError, ClientArgs};
use super::store::{StableId, stable_client_id};
use crate::upstream::dial::{DialOptions, connect_client};

/// Protocol versions offered in `initialize`.
const PROTOCOL_VERSIONS: [&str; 1] = ["1.0.0"];
/// Per-subscription broadcast buffer: large enough that no event is skipped.
const SUBSCRIPTION_BUFFER: usize = 65_536;

/// An initialized client plus what the commands need to know about it.
pub(super) struct Connection {
    /// The SDK client.
    pub(super) client: Client,
    /// The `clientId` this connection's session has.
    pub(super) client_id: String,
    /// `--timeout`.
    pub(super) timeout: Duration,
    /// The token's subject, for hints (`None` without a readable token).
    pub(super) subject: Option<String>,
    /// Keeps the stored id's slot ours until the command ends.
    _slot: Option<StableId>,
}

impl Connection {
    /// Dial and start the SDK client; then, with a stored id, `reconnect`
    /// (no subscriptions) and on `NotFound` — the relay no longer holds that
    /// session — `initialize`; with `--client-id`, `initialize`.
    pub(super) async fn open(args: &ClientArgs) -> Result<Self, CliError> {
        let url = args.url.clone().ok_or(CliError::MissingUrl)?;
        let timeout = Duration::from_secs(args.timeout);
        let opts = DialOptions {
            url: url.clone(),
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
        let (client_id, slot) = match &args.client_id {
            Some(id) => (id.clone(), None),
            None => {
                let slot = stable_client_id(&url, args.token.as_deref());
                (slot.id.clone(), Some(slot))
            }
        };
        let reconnect = slot.as_ref().is_some_and(|s| s.reused);
        start_session(&client, &client_id, reconnect, timeout).await?;
        let subject = args
            .token
            .as_deref()
            .and_then(super::store::token_principal)
            .map(|(_, sub)| sub);
        Ok(Self {
            client,
            client_id,
            timeout,
            subject,
            _slot: slot,
        })
    }

    /// Error mapper for a failed call of `method` on this connection.
    pub(super) fn failed(
        &self,
        method: &'static str,
    ) -> impl FnOnce(ClientError) -> CliError + use<> {
        request_failed(method, self.timeout)
    }

    /// `request(method, params)` with this connection's error mapping.
    pub(super) async fn call<P, R>(&self, method: &'static str, params: P) -> Result<R, CliError>
    where
        P: serde::Serialize,
        R: serde::de::DeserializeOwned,
    {
        self.client
            .request(method, params)
            .await
            .map_err(self.failed(method))
    }

    /// Subscribe to `uri` (the handle is attached before the request is
    /// sent) and return its result and subscription.
    pub(super) async fn subscribe(
        &self,
        uri: &str,
    ) -> Result<(SubscribeResult, SessionSubscription), CliError> {
        self.client
            .subscribe(uri.to_owned())
            .await
            .map_err(self.failed("subscribe"))
    }

    /// Subscribe to `chat` and read its snapshot.
    pub(super) async fn subscribe_chat(
        &self,
        chat: &str,
    ) -> Result<(ChatStart, SessionSubscription), CliError> {
        let (result, sub) = self.subscribe(chat).await?;
        let start = ChatStart::from_subscribe(result).map_err(|kind| CliError::NotAChat {
            uri: chat.to_owned(),
            kind,
        })?;
        Ok((start, sub))
    }

    /// Dispatch `action` on `channel`; returns its `clientSeq`.
    pub(super) async fn dispatch(
        &self,
        channel: &str,
        action: StateAction,
    ) -> Result<i64, CliError> {
        self.client
            .dispatch(channel.to_owned(), action)
            .await
            .map(|h| h.client_seq)
            .map_err(self.failed("dispatchAction"))
    }

    /// Drop the subscription of `uri` (best effort: the command is ending
    /// or moving on, and the relay forgets it with the session anyway).
    pub(super) async fn unsubscribe(&self, uri: &str) {
        let _ = self.client.unsubscribe(uri.to_owned()).await;
    }
}

/// `reconnect` to the retained session of `client_id` when `reconnect`,
/// falling back to `initialize` when the relay answers `NotFound`.
async fn start_session(
    client: &Client,
    client_id: &str,
    reconnect: bool,
    timeout: Duration,
) -> Result<(), CliError> {
    if reconnect {
        match client.reconnect(client_id.to_owned(), 0, Vec::new()).await {
            Ok(_) => return Ok(()),
            Err(ClientError::Rpc(e)) if e.code == ahp_types::errors::ahp_error_codes::NOT_FOUND => {
            }
            Err(e) => return Err(request_failed("reconnect", timeout)(e)),
        }
    }
    let versions = PROTOCOL_VERSIONS.map(String::from).to_vec();
    client
        .initialize(client_id.to_owned(), versions, Vec::new())
        .await
        .map(|_| ())
        .map_err(request_failed("initialize", timeout))
}

/// Map an SDK error: JSON-RPC errors keep code and message, the SDK's request
/// timeout (`Cancelled`) becomes [`CliError::RequestTimeout`].
pub(super) fn request_failed(
    method: &'static str,
    timeout: Duration,
) -> impl FnOnce(ClientError) -> CliError {
    move |err| match err {
        ClientError::Rpc(e) => CliError::Rpc {
            method,
            code: e.code,
            message: e.message,
        },
        ClientError::Cancelled => CliError::RequestTimeout { method, timeout },
        source => CliError::Request { method, source },
    }
}

/// The next action envelope newer than the snapshot; `ConnectionClosed` when
/// the subscription ends.
pub(super) async fn next_live_action(
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
pub(super) fn emit(text: &str) -> Result<(), CliError> {
    emit_bytes(text.as_bytes())
}

/// Write `bytes` to stdout and flush.
pub(super) fn emit_bytes(bytes: &[u8]) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    out.write_all(bytes)
        .and_then(|()| out.flush())
        .map_err(CliError::Stdout)
}

/// Write each line plus a newline to stdout, then flush.
pub(super) fn print_lines(lines: impl Iterator<Item = String>) -> Result<(), CliError> {
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for line in lines {
        writeln!(out, "{line}").map_err(CliError::Stdout)?;
    }
    out.flush().map_err(CliError::Stdout)
}

/// Write `value` as pretty JSON plus a newline to stdout.
pub(super) fn print_json(value: &serde_json::Value) -> Result<(), CliError> {
    let text = serde_json::to_string_pretty(value).unwrap_or_default();
    print_lines(std::iter::once(text))
}

/// Write one status line to stderr (best effort: stderr failures are ignored).
pub(super) fn note(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

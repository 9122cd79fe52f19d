//! The `ahp-relay` command line: one binary, one subcommand per job.

pub mod cert;
pub mod connect;
pub mod demo;
pub mod policy;
pub mod serve;
pub mod simhost;
pub mod token;

use clap::{Parser, Subcommand};

/// One wss endpoint for many Agent Host Protocol hosts.
#[derive(Parser)]
#[command(name = "ahp-relay", version, about)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand)]
pub enum Command {
    /// The relay in front of simulated hosts on loopback, with a dev token.
    Demo(demo::DemoArgs),
    /// Run the relay from a configuration file.
    Serve(serve::ServeArgs),
    /// Validate a configuration file.
    CheckConfig(serve::CheckArgs),
    /// Ask the policy: `policy explain --sub S` shows what a principal holds
    /// on every host and which rules grant it.
    Policy(policy::PolicyArgs),
    /// Mint an HS256 token with a key file.
    Token(token::TokenArgs),
    /// Make a CA and a server certificate for testing `serve`.
    Cert(cert::CertArgs),
    /// Run a simulated AHP host (for demos, tests and benchmarks).
    Simhost(simhost::SimHostArgs),
    /// An AHP client: sessions, chats, turns, tool approvals and files.
    Client(crate::client::cli::ClientArgs),
    /// Put a host with no inbound port behind a relay: run next to the
    /// host, it dials the relay (`[[hosts]]` with `dial_in`).
    Connect(connect::ConnectArgs),
}

/// How `serve` and `demo` write log lines (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines, coloured only on a terminal.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `fields`
    /// (the event's `tracing` fields, `message` among them).
    Json,
}

impl Cli {
    /// The log format the subcommand asks for; text for subcommands
    /// without `--log-format`.
    pub fn log_format(&self) -> LogFormat {
        match &self.command {
            Command::Serve(a) => a.log_format,
            Command::Demo(a) => a.log_format,
            _ => LogFormat::Text,
        }
    }

    /// The replica name traces are exported under, for the subcommands
    /// that run a relay (`serve`: its configuration's `[relay] replica`);
    /// `None` for the others, which never export traces.
    pub fn replica(&self) -> Option<String> {
        match &self.command {
            Command::Serve(a) => Some(crate::config::peek_replica(&a.config)),
            Command::Demo(_) => Some(crate::config::default_replica()),
            _ => None,
        }
    }
}

/// Sets up logging to stderr in `format`; `RUST_LOG` overrides the default
/// level of everything but audit lines. Audit lines (`ahp_relay::audit`)
/// bypass `RUST_LOG` and are written by [`crate::policy::audit::layer`] as
/// bare JSON objects, one per line, in either format. No credential
/// reaches a log line at any level: the `log` bridge drops the records that
/// carry them ([`NoCredentials`]). With a `replica`, spans are also
/// exported over OTLP when the `OTEL_*` variables ask for it
/// ([`crate::otel`]); request spans ([`crate::otel::TARGET`]) never reach
/// the log, whatever `RUST_LOG` says, so without an exporter they cost
/// nothing. Call inside the Tokio runtime.
pub fn init_tracing(format: LogFormat, replica: Option<&str>) {
    let (otel, otel_error) = match replica.map(crate::otel::layer) {
        Some(Ok(layer)) => (layer, None),
        Some(Err(e)) => (None, Some(e)),
        None => (None, None),
    };
    let subscriber = subscriber(format, otel);
    if tracing::subscriber::set_global_default(subscriber).is_err() {
        return;
    }
    if let Some(e) = otel_error {
        tracing::warn!("{e}");
    }
    let bridge: &'static NoCredentials =
        Box::leak(Box::new(NoCredentials(tracing_log::LogTracer::new())));
    if log::set_logger(bridge).is_ok() {
        cap_log_records();
    }
}

/// A layer of the `tracing` registry, boxed.
type BoxedLayer = Box<dyn tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync>;

/// The subscriber [`init_tracing`] installs: `otel` (if any), the log
/// lines in `format` and the audit lines. Without `otel` the exporter's
/// layer is absent, not an empty one: an absent layer leaves request spans'
/// callsites disabled (an empty `Option` layer would enable every callsite).
fn subscriber(
    format: LogFormat,
    otel: Option<BoxedLayer>,
) -> Box<dyn tracing::Subscriber + Send + Sync> {
    use crate::policy::audit;
    use tracing_subscriber::layer::SubscriberExt as _;
    match otel {
        Some(otel) => Box::new(
            tracing_subscriber::registry()
                .with(otel)
                .with(log_layer(format))
                .with(audit::layer(std::io::stderr)),
        ),
        None => Box::new(
            tracing_subscriber::registry()
                .with(log_layer(format))
                .with(audit::layer(std::io::stderr)),
        ),
    }
}

/// The log lines in `format`, filtered by `RUST_LOG` (default `info`),
/// without audit lines and request spans.
fn log_layer<S>(format: LogFormat) -> Box<dyn tracing_subscriber::Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a> + Send + Sync,
{
    use tracing_subscriber::Layer as _;
    let mut filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Audit lines only through their own layer, request spans only to the
    // exporter. A directive (not a filter function) keeps the filter's
    // level hint, which caps `log` records.
    for target in [crate::policy::audit::TARGET, crate::otel::TARGET] {
        if let Ok(directive) = format!("{target}=off").parse() {
            filter = filter.add_directive(directive);
        }
    }
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    match format {
        // Colour only on a terminal: container and file logs stay plain text.
        LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_filter(filter)
            .boxed(),
        LogFormat::Json => logs.json().with_filter(filter).boxed(),
    }
}

/// The `log` → `tracing` bridge without the records that carry credentials:
/// below INFO, the WebSocket library logs every handshake request whole (an
/// upstream dial's `Authorization: Bearer <host token>` and `?tkn=`) and
/// every frame (`authenticate` carries tokens), so its DEBUG and TRACE
/// records (`tungstenite`, `tokio_tungstenite`) are dropped before they
/// become events, whatever `RUST_LOG` asks. Its INFO and above (none of
/// which print a request or a frame) pass.
struct NoCredentials(tracing_log::LogTracer);

/// Whether a `log` record of `target` at `level` may carry a credential.
fn carries_credentials(target: &str, level: log::Level) -> bool {
    let crate_name = target.split("::").next().unwrap_or(target);
    level > log::Level::Info && matches!(crate_name, "tungstenite" | "tokio_tungstenite")
}

impl log::Log for NoCredentials {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        !carries_credentials(metadata.target(), metadata.level()) && self.0.enabled(metadata)
    }

    fn log(&self, record: &log::Record<'_>) {
        if !carries_credentials(record.target(), record.level()) {
            self.0.log(record);
        }
    }

    fn flush(&self) {
        self.0.flush();
    }
}

/// Caps the `log` crate's maximum level at the most verbose level any
/// `tracing` filter lets through, so every `log::trace!` of the WebSocket
/// library (several per frame) costs one comparison instead of building a
/// record that the bridge and then the filter drop.
fn cap_log_records() {
    use tracing::level_filters::LevelFilter;
    let level = match LevelFilter::current() {
        LevelFilter::OFF => log::LevelFilter::Off,
        LevelFilter::ERROR => log::LevelFilter::Error,
        LevelFilter::WARN => log::LevelFilter::Warn,
        LevelFilter::INFO => log::LevelFilter::Info,
        LevelFilter::DEBUG => log::LevelFilter::Debug,
        _ => log::LevelFilter::Trace,
    };
    log::set_max_level(level);
}

/// Tells the operator something outside of `tracing` events (the listening
/// address, draining): a plain line in text format — scripts read it — and
/// an event in JSON format, so every line stays one JSON object.
pub fn announce(format: LogFormat, message: &str) {
    match format {
        LogFormat::Text => eprintln!("{message}"),
        LogFormat::Json => tracing::info!("{message}"),
    }
}

/// Reports a fatal error like [`announce`]: `error: …` in text format, an
/// ERROR event in JSON format.
pub fn fail(format: LogFormat, message: &str) {
    match format {
        LogFormat::Text => eprintln!("error: {message}"),
        LogFormat::Json => tracing::error!("{message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without an exporter a request span is disabled — its fields are
    /// never evaluated and nothing is allocated — at any log level, while
    /// the link spans the log shows stay enabled.
    #[test]
    fn request_spans_cost_nothing_without_an_exporter() {
        for format in [LogFormat::Text, LogFormat::Json] {
            tracing::subscriber::with_default(subscriber(format, None), || {
                let request = tracing::info_span!(target: crate::otel::TARGET, "request");
                assert!(request.is_disabled());
                let error = tracing::error_span!(target: crate::otel::TARGET, "request");
                assert!(error.is_disabled());
                assert!(!tracing::info_span!("link").is_disabled());
            });
        }
    }
}

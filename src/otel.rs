//! OpenTelemetry traces over OTLP (contract §8.2): the relay's `tracing`
//! spans — one per client request ([`TARGET`]), one per per-client link and
//! per watch link — exported to a collector when the standard variables ask
//! for it, with the replica's name as `service.instance.id`, so a request
//! can be found by replica and a client followed across replicas by its
//! upstream id (a pseudonym the replicas share, §12.1).
//!
//! **Off unless asked.** Nothing is built, no thread started and no span
//! recorded unless `OTEL_EXPORTER_OTLP_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set (and neither
//! `OTEL_SDK_DISABLED=true` nor `OTEL_TRACES_EXPORTER=none`). Request spans
//! have their own target, which the log filter turns off, so with no
//! exporter their callsites are disabled: creating one is a branch, with
//! no allocation and no field formatted.
//!
//! **The exporter.** HTTP/protobuf (`OTEL_EXPORTER_OTLP_PROTOCOL` unset or
//! `http/protobuf`; `grpc` and `http/json` are refused with a warning and
//! traces stay off), over a plain-HTTP hyper client (HTTP/1 only: no h2, no
//! second TLS stack): point the relay at a collector on the pod's network
//! (a sidecar or a node-local agent), which forwards over TLS.
//! `OTEL_EXPORTER_OTLP_HEADERS`, `…_TIMEOUT`, `OTEL_SERVICE_NAME` (default
//! `ahp-relay`) and `OTEL_RESOURCE_ATTRIBUTES` are read as the
//! specification says. Spans are batched on the SDK's own thread; each
//! export's HTTP request runs on the relay's runtime, so the batch thread
//! only waits. An unreachable collector costs dropped spans (the batch
//! queue is bounded), never a stalled request.

use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{HttpClient, HttpError};
use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use thiserror::Error;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{LevelFilter, Targets};

/// The target of the per-request spans: exported, never logged.
pub const TARGET: &str = "ahp_relay::trace";

/// The `service.name` unless `OTEL_SERVICE_NAME` says otherwise.
pub const SERVICE_NAME: &str = "ahp-relay";

/// Largest collector answer read (OTLP answers are a few bytes).
const MAX_ANSWER_BYTES: usize = 64 << 10;

/// Why traces are not exported although asked for.
#[derive(Debug, Error)]
pub enum OtelError {
    /// A protocol other than HTTP/protobuf.
    #[error("OTLP protocol {0:?} is not supported (only http/protobuf): traces are off")]
    Protocol(String),
    /// An `https` endpoint: the exporter speaks plain HTTP only.
    #[error(
        "OTLP endpoint {0:?} is https: the relay exports over plain HTTP only (send to a collector on the pod's network): traces are off"
    )]
    Tls(String),
    /// Not inside a Tokio runtime (the export client needs one).
    #[error("no Tokio runtime to run the OTLP exporter on: traces are off")]
    NoRuntime,
    /// The exporter refused its settings (endpoint, headers, timeout).
    #[error("OTLP exporter: {0}: traces are off")]
    Exporter(String),
}

/// What the standard `OTEL_*` variables (read through `var`) ask for:
/// `Ok(false)` for no exporter, `Ok(true)` for HTTP/protobuf export.
pub fn wanted(var: impl Fn(&str) -> Option<String>) -> Result<bool, OtelError> {
    let set = |name: &str| var(name).is_some_and(|v| !v.trim().is_empty());
    let disabled = var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    let none = var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.trim().eq_ignore_ascii_case("none"));
    let endpoint = set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    if disabled || none || !endpoint {
        return Ok(false);
    }
    let url = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .filter(|v| !v.trim().is_empty())
        .or_else(|| var("OTEL_EXPORTER_OTLP_ENDPOINT"))
        .unwrap_or_default();
    if url.trim().to_ascii_lowercase().starts_with("https:") {
        return Err(OtelError::Tls(url));
    }
    let protocol = var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .or_else(|| var("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .unwrap_or_default();
    match protocol.trim() {
        "" | "http/protobuf" => Ok(true),
        other => Err(OtelError::Protocol(other.to_string())),
    }
}

/// The running exporter, kept for [`flush`] at shutdown.
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// The `tracing` layer that exports spans, if the environment asks for
/// export; `replica` becomes `service.instance.id`. Call once, inside the
/// runtime; a second call returns `Ok(None)`.
pub fn layer<S>(replica: &str) -> Result<Option<Box<dyn Layer<S> + Send + Sync>>, OtelError>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a> + Send + Sync,
{
    if !wanted(|name| std::env::var(name).ok())? || PROVIDER.get().is_some() {
        return Ok(None);
    }
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| OtelError::NoRuntime)?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_http_client(RuntimeClient::new(runtime))
        .build()
        .map_err(|e| OtelError::Exporter(e.to_string()))?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource(replica))
        .build();
    let tracer = provider.tracer(SERVICE_NAME);
    let _ = PROVIDER.set(provider);
    // Request spans, link and watch spans and the relay's own events inside
    // them; never audit lines (they have their own sink) nor other crates.
    let filter = Targets::new()
        .with_target("ahp_relay", LevelFilter::INFO)
        .with_target(crate::policy::audit::TARGET, LevelFilter::OFF);
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(filter);
    Ok(Some(Box::new(layer)))
}

/// The resource every span carries: `service.name` (from
/// `OTEL_SERVICE_NAME`, default [`SERVICE_NAME`]), `service.version`, and
/// `service.instance.id` = the replica; `OTEL_RESOURCE_ATTRIBUTES` adds to it.
fn resource(replica: &str) -> Resource {
    let mut builder = Resource::builder().with_attributes([
        KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
        KeyValue::new("service.instance.id", replica.to_string()),
    ]);
    if std::env::var("OTEL_SERVICE_NAME").is_err() {
        builder = builder.with_service_name(SERVICE_NAME);
    }
    builder.build()
}

/// Exports what is batched and stops the exporter (waits at most for one
/// export's timeout); nothing when traces are off. Call off the runtime's
/// workers (`spawn_blocking`): the export runs on the runtime.
pub fn flush() {
    if let Some(provider) = PROVIDER.get()
        && let Err(e) = provider.shutdown()
    {
        tracing::warn!("OTLP exporter shutdown: {e}");
    }
}

/// The span of the client request being handled, if it is recorded: the
/// current span when it is a request span ([`TARGET`]), else a disabled
/// one — so a forwarded request's span stays open until its answer without
/// holding a connection's or link's span.
pub fn current_request() -> tracing::Span {
    let span = tracing::Span::current();
    match span.metadata() {
        Some(m) if m.target() == TARGET => span,
        _ => tracing::Span::none(),
    }
}

/// The key of a W3C trace context in a request's `params._meta` (the AHP
/// spec gives every command's params an optional `_meta` object whose
/// unknown keys receivers must ignore; MCP carries trace context under
/// the same key).
pub const TRACEPARENT: &str = "traceparent";

/// Makes a recorded request span the child of the client's W3C
/// `traceparent` (`00-<trace id>-<span id>-<flags>`), so the relay's span
/// joins the client's trace; an invalid value is ignored. Call before the
/// span is first entered.
pub fn continue_trace(span: &tracing::Span, traceparent: &str) {
    use opentelemetry::trace::TraceContextExt as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    if span.is_disabled() {
        return;
    }
    if let Some(remote) = parse_traceparent(traceparent) {
        let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(remote));
    }
}

/// The W3C `traceparent` naming a recorded span as the parent, for the
/// host's side of a forwarded request; `None` when traces are off.
pub fn traceparent(span: &tracing::Span) -> Option<String> {
    use opentelemetry::trace::TraceContextExt as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    if span.is_disabled() {
        return None;
    }
    let cx = span.context();
    let own = cx.span().span_context().clone();
    own.is_valid().then(|| {
        let flags = own.trace_flags().to_u8();
        format!("00-{}-{}-{flags:02x}", own.trace_id(), own.span_id())
    })
}

/// A version-00 `traceparent`, or `None` if it is not one (lower-case hex,
/// neither id all zeros).
fn parse_traceparent(text: &str) -> Option<opentelemetry::trace::SpanContext> {
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
    let mut parts = text.trim().split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    if version != "00"
        || parts.next().is_some()
        || !hex(trace, 32)
        || !hex(span, 16)
        || !hex(flags, 2)
    {
        return None;
    }
    let context = SpanContext::new(
        TraceId::from_hex(trace).ok()?,
        SpanId::from_hex(span).ok()?,
        TraceFlags::new(u8::from_str_radix(flags, 16).ok()?),
        true,
        TraceState::default(),
    );
    context.is_valid().then_some(context)
}

/// The OTLP exporter's HTTP client: hyper over plain HTTP/1, each request
/// spawned on the relay's runtime and awaited from the SDK's batch thread.
/// A collector that stops answering is logged once (a warning), and once
/// more when it answers again, never per export.
#[derive(Debug, Clone)]
struct RuntimeClient {
    runtime: tokio::runtime::Handle,
    client: Client<HttpConnector, Full<Bytes>>,
    failing: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl RuntimeClient {
    fn new(runtime: tokio::runtime::Handle) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_secs(5)));
        let client = Client::builder(hyper_util::rt::TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Self {
            runtime,
            client,
            failing: Default::default(),
        }
    }

    async fn send(
        client: Client<HttpConnector, Full<Bytes>>,
        request: Request<Bytes>,
    ) -> Result<Response<Bytes>, HttpError> {
        let answer = client.request(request.map(Full::new)).await?;
        let (parts, body) = answer.into_parts();
        let body = Limited::new(body, MAX_ANSWER_BYTES).collect().await?;
        Ok(Response::from_parts(parts, body.to_bytes()))
    }

    /// Logs a change between a working and a failing collector.
    fn note(&self, sent: &Result<Response<Bytes>, HttpError>) {
        use std::sync::atomic::Ordering;
        let failure = match sent {
            Ok(answer) if answer.status().is_success() => None,
            Ok(answer) => Some(format!("HTTP {}", answer.status())),
            Err(e) => Some(e.to_string()),
        };
        match failure {
            Some(why) if !self.failing.swap(true, Ordering::Relaxed) => {
                tracing::warn!(
                    "OTLP export failed ({why}): spans are dropped until the collector answers"
                );
            }
            None if self.failing.swap(false, Ordering::Relaxed) => {
                tracing::info!("OTLP export works again");
            }
            _ => {}
        }
    }
}

/// The export's future, as `opentelemetry_http::HttpClient` (an
/// `async_trait`) declares it.
type Sending<'a> = Pin<Box<dyn Future<Output = Result<Response<Bytes>, HttpError>> + Send + 'a>>;

impl HttpClient for RuntimeClient {
    fn send_bytes<'life0, 'async_trait>(
        &'life0 self,
        request: Request<Bytes>,
    ) -> Sending<'async_trait>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        let task = self.runtime.spawn(Self::send(self.client.clone(), request));
        Box::pin(async move {
            let sent = task.await.map_err(HttpError::from).and_then(|sent| sent);
            self.note(&sent);
            sent
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn traceparents_are_parsed_as_w3c_version_00() {
        let ok = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let parsed = parse_traceparent(ok).expect("valid");
        assert_eq!(
            parsed.trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert_eq!(parsed.span_id().to_string(), "b7ad6b7169203331");
        assert!(parsed.is_sampled() && parsed.is_remote());
        for bad in [
            "",
            "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x",
            "00-0af7651916cd43dd8448eb211c8031-b7ad6b7169203331-01",
        ] {
            assert!(parse_traceparent(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn export_only_when_an_endpoint_is_set_and_not_disabled() {
        let ep = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318");
        assert!(!wanted(env(&[])).unwrap());
        assert!(wanted(env(&[ep])).unwrap());
        let traces_ep = (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://c:4318/v1/traces",
        );
        assert!(wanted(env(&[traces_ep])).unwrap());
        assert!(!wanted(env(&[ep, ("OTEL_SDK_DISABLED", "true")])).unwrap());
        assert!(!wanted(env(&[ep, ("OTEL_TRACES_EXPORTER", "none")])).unwrap());
        assert!(wanted(env(&[ep, ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")])).unwrap());
        assert!(matches!(
            wanted(env(&[ep, ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")])),
            Err(OtelError::Protocol(_))
        ));
        let tls = ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318");
        assert!(matches!(wanted(env(&[tls])), Err(OtelError::Tls(_))));
    }
}

//! OpenTelemetry traces (contract §8.2, issue 19): a relay binary started
//! with `OTEL_EXPORTER_OTLP_ENDPOINT` pointing at an in-process OTLP/HTTP
//! receiver exports a span per client request — named by the method, with
//! the host the relay chose, its outcome and the host's answer — under a
//! resource naming the replica (`service.instance.id`, from
//! `[relay] replica`), in the client's trace when its request carries a
//! W3C `traceparent` in `params._meta`, and hands the host a `traceparent`
//! naming the relay's span, with `OTEL_EXPORTER_OTLP_HEADERS` on every
//! export; a relay whose `OTEL_SDK_DISABLED=true` sends nothing, not even
//! at shutdown, when batched spans are flushed, and forwards `_meta`
//! untouched; a collector that does not answer gets a warning in the log.

mod common;

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use ahp_relay::devkit::DevKit;
use ahp_relay::simhost::SimHost;
use ahp_relay::upstream::dial::{DialOptions, dial_stream};
use bytes::Bytes;
use common::relay::{ServedRelay, scratch_dir, serve_binary_with_env};
use common::{RawWs, WAIT, fast_config, reserved_port, start_host};
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use prost::Message;
use serde_json::json;
use tokio::sync::mpsc;

/// The replica name the relay under test is configured with.
const REPLICA: &str = "replica-otel-test";

/// How long the relay drains on SIGTERM (§8.3).
const DRAIN: Duration = Duration::from_secs(1);

/// One exported span, flattened: its resource's and its own attributes.
#[derive(Debug)]
struct Span {
    name: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    resource: HashMap<String, String>,
    attributes: HashMap<String, String>,
}

/// Attribute values as text (strings and integers are all the relay sends).
fn flatten(attributes: &[KeyValue]) -> HashMap<String, String> {
    let text = |v: &any_value::Value| match v {
        any_value::Value::StringValue(s) => s.clone(),
        any_value::Value::IntValue(i) => i.to_string(),
        any_value::Value::BoolValue(b) => b.to_string(),
        other => format!("{other:?}"),
    };
    attributes
        .iter()
        .filter_map(|kv| {
            let value = kv.value.as_ref()?.value.as_ref()?;
            Some((kv.key.clone(), text(value)))
        })
        .collect()
}

/// Every span of one OTLP export request.
fn spans_of(request: &ExportTraceServiceRequest) -> Vec<Span> {
    let mut out = Vec::new();
    for rs in &request.resource_spans {
        let resource = rs
            .resource
            .as_ref()
            .map(|r| flatten(&r.attributes))
            .unwrap_or_default();
        for ss in &rs.scope_spans {
            for span in &ss.spans {
                let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
                out.push(Span {
                    name: span.name.clone(),
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    resource: resource.clone(),
                    attributes: flatten(&span.attributes),
                });
            }
        }
    }
    out
}

/// One export as received: its path, its `x-otlp-key` header, its spans.
type Export = (String, Option<String>, Vec<Span>);

/// An OTLP/HTTP receiver on 127.0.0.1: every `POST /v1/traces` body,
/// decoded, goes to the returned channel; its endpoint URL (without the
/// signal path, as `OTEL_EXPORTER_OTLP_ENDPOINT` takes it).
async fn otlp_receiver() -> (String, mpsc::UnboundedReceiver<Export>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let tx = tx.clone();
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let tx = tx.clone();
                async move {
                    let path = req.uri().path().to_string();
                    let key = req.headers().get("x-otlp-key");
                    let key = key.and_then(|k| k.to_str().ok()).map(str::to_string);
                    let body = req.into_body().collect().await.map(|b| b.to_bytes());
                    let decoded = body
                        .ok()
                        .and_then(|b| ExportTraceServiceRequest::decode(b).ok());
                    let spans = decoded.as_ref().map(spans_of).unwrap_or_default();
                    let _ = tx.send((path, key, spans));
                    let answer = Response::builder()
                        .header("content-type", "application/x-protobuf")
                        .body(Full::new(Bytes::new()))
                        .expect("response");
                    Ok::<_, Infallible>(answer)
                }
            });
            tokio::spawn(async move {
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .await;
            });
        }
    });
    (format!("http://{addr}"), rx)
}

/// A relay binary in front of simulated host `a`, named [`REPLICA`], with
/// `env`; a client initialized on it, after host `a`'s session is listed.
async fn relay_with_client(
    name: &str,
    env: &[(&str, &str)],
) -> (ServedRelay, RawWs, DevKit, SimHost) {
    let host = start_host(fast_config("a", 1)).await;
    let kit = DevKit::create(&scratch_dir(name)).expect("kit");
    let extra = format!(
        "\n[[hosts]]\nid = \"a\"\nurl = \"{}\"\nallow_plaintext = true\n\n[limits]\ndrain_window_secs = {}\n",
        host.url(),
        DRAIN.as_secs()
    );
    let replica = format!("replica = \"{REPLICA}\"");
    kit.config_with_relay("127.0.0.1:0", &[], "", &replica, &extra)
        .expect("config");
    let relay = serve_binary_with_env(&kit, "info", env);
    let token = kit
        .token("alice", &[], Duration::from_secs(600), None)
        .expect("token");
    let opts = DialOptions {
        url: relay.url.clone(),
        token: Some(token),
        ca_file: Some(kit.cert.clone()),
        insecure: false,
        connect_timeout: WAIT,
        extra_headers: Vec::new(),
    };
    let mut ws = RawWs::from_stream(dial_stream(&opts).await.expect("dial"));
    ws.initialize("otel-1").await;
    // The relay dials its host on its own schedule.
    common::wait_until_listed(&mut ws, "ahp-session:/a~a-1", 100).await;
    (relay, ws, kit, host)
}

/// The client's trace: its W3C `traceparent`, trace id and span id.
const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

/// A subscribe the relay forwards to host `a`, in the client's trace.
async fn subscribe(ws: &mut RawWs) {
    let traceparent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let params = json!({"channel": "ahp-session:/a~a-1",
        "_meta": {"traceparent": traceparent, "note": "kept"}});
    let r = ws.request(1, "subscribe", params).await;
    assert!(r.get("result").is_some(), "{r}");
}

/// The `_meta` of the subscribe host `a` received.
fn host_meta(host: &SimHost) -> serde_json::Value {
    let frames = common::host_frames(host, "subscribe");
    let frame = frames
        .iter()
        .find(|f| f["params"]["channel"] == "ahp-session:/a-1")
        .unwrap_or_else(|| panic!("the host got the subscribe: {frames:?}"));
    frame["params"]["_meta"].clone()
}

#[tokio::test]
async fn a_request_is_exported_with_its_replica_host_and_outcome() {
    let (endpoint, mut received) = otlp_receiver().await;
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_EXPORTER_OTLP_HEADERS", "x-otlp-key=k1"),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ];
    let (relay, mut ws, _kit, host) = relay_with_client("otel-on", &env).await;
    subscribe(&mut ws).await;

    let deadline = tokio::time::Instant::now() + WAIT;
    let mut seen: Vec<Span> = Vec::new();
    let named = |seen: &[Span], name: &str| seen.iter().position(|s| s.name == name);
    while named(&seen, "subscribe").is_none() || named(&seen, "initialize").is_none() {
        let next = tokio::time::timeout_at(deadline, received.recv()).await;
        let Ok(Some((path, key, spans))) = next else {
            let names: Vec<_> = seen.iter().map(|s| &s.name).collect();
            panic!(
                "no spans for initialize and subscribe (only {names:?}): {:#?}",
                relay.output()
            );
        };
        assert_eq!(path, "/v1/traces");
        assert_eq!(
            key.as_deref(),
            Some("k1"),
            "OTEL_EXPORTER_OTLP_HEADERS are sent"
        );
        seen.extend(spans);
    }
    let init = &seen[named(&seen, "initialize").unwrap_or_default()];
    let init_attr = |k: &str| init.attributes.get(k).map(String::as_str);
    assert_eq!(
        init_attr("ahp.outcome"),
        Some("ok"),
        "answered by the relay: {init:?}"
    );
    assert_eq!(init_attr("ahp.host"), None, "{init:?}");
    let span = seen.swap_remove(named(&seen, "subscribe").unwrap_or_default());
    assert_eq!(span.resource["service.instance.id"], REPLICA, "{span:?}");
    assert_eq!(span.resource["service.name"], "ahp-relay", "{span:?}");
    let attr = |k: &str| span.attributes.get(k).map(String::as_str);
    assert_eq!(attr("rpc.method"), Some("subscribe"), "{span:?}");
    assert_eq!(attr("rpc.jsonrpc.request_id"), Some("1"), "{span:?}");
    assert_eq!(attr("ahp.host"), Some("a"), "{span:?}");
    assert_eq!(attr("ahp.outcome"), Some("forwarded"), "{span:?}");
    assert_eq!(attr("ahp.answer"), Some("ok"), "{span:?}");
    assert!(
        attr("ahp.upstream").is_some_and(|u| !u.is_empty() && u != "otel-1"),
        "the upstream id is a pseudonym, never the client's id: {span:?}"
    );
    assert_eq!(
        span.trace_id, CLIENT_TRACE,
        "in the client's trace: {span:?}"
    );
    assert_eq!(span.parent_span_id, CLIENT_SPAN, "{span:?}");
    let meta = host_meta(&host);
    let expected = format!("00-{CLIENT_TRACE}-{}-01", span.span_id);
    assert_eq!(
        meta["traceparent"],
        expected.as_str(),
        "the host's parent is the relay's span"
    );
    assert_eq!(
        meta["note"], "kept",
        "other _meta keys pass through: {meta}"
    );
}

#[tokio::test]
async fn a_disabled_sdk_sends_nothing_even_at_shutdown() {
    let (endpoint, mut received) = otlp_receiver().await;
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ("OTEL_SDK_DISABLED", "true"),
    ];
    let (mut relay, mut ws, _kit, host) = relay_with_client("otel-off", &env).await;
    subscribe(&mut ws).await;
    let meta = host_meta(&host);
    let client = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    assert_eq!(
        meta["traceparent"],
        client.as_str(),
        "_meta untouched: {meta}"
    );
    // A relay that exports flushes its batch before it exits: once the
    // process is gone, everything it would have sent has been sent (and
    // received: the receiver keeps running on this runtime meanwhile).
    let status = tokio::task::spawn_blocking(move || relay.terminate(DRAIN))
        .await
        .expect("terminate");
    assert!(status.success(), "drains and exits cleanly: {status}");
    assert!(
        received.try_recv().is_err(),
        "a relay with OTEL_SDK_DISABLED=true sent an export"
    );
}

#[tokio::test]
async fn a_collector_that_does_not_answer_is_logged() {
    // A port nothing listens on, and none of the relay's own sockets can take.
    let endpoint = format!("http://127.0.0.1:{}", reserved_port());
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ];
    let (relay, mut ws, _kit, _host) = relay_with_client("otel-down", &env).await;
    subscribe(&mut ws).await;
    // The relay's stderr is read off the runtime (its receiver blocks).
    let warned = tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + WAIT;
        let mut seen = Vec::new();
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            match relay.lines.recv_timeout(left) {
                Ok(line) if line.contains("OTLP export failed") => return Ok(line),
                Ok(line) => seen.push(line),
                Err(_) => break,
            }
        }
        Err(seen)
    })
    .await
    .expect("reader");
    let line = warned.unwrap_or_else(|seen| panic!("no warning: {seen:#?}"));
    assert!(line.contains("WARN"), "{line}");
}

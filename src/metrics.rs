//! Prometheus metrics (`ahp_relay_…`), with bounded label sets: method
//! names from the relay's own table plus `other`, reasons from closed lists
//! — never a principal, clientId or URI.

use prometheus::{
    Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};

/// Every metric the relay exports.
#[derive(Debug, Clone)]
pub struct Metrics {
    /// The registry `/metrics` renders.
    pub registry: Registry,
    /// Client WebSocket connections accepted.
    pub connections: IntCounter,
    /// Client WebSocket connections open now.
    pub connections_open: IntGauge,
    /// Connectors of dial-in hosts attached now (contract §13).
    pub connectors_attached: IntGauge,
    /// Link sockets connectors opened to the relay (one per link to a
    /// dial-in host; not counted in `connections`).
    pub connector_links: IntCounter,
    /// Upgrades refused, by reason.
    pub auth_failures: IntCounterVec,
    /// Client requests, by method.
    pub client_requests: IntCounterVec,
    /// Client frames refused by the wire layer, by reason.
    pub bad_client_frames: IntCounterVec,
    /// Access-control decisions (allow / deny / invisible).
    pub acl_decisions: IntCounterVec,
    /// Client notifications or responses dropped (unknown, malformed, early).
    pub client_notifications_dropped: IntCounter,
    /// Envelopes numbered and delivered to clients.
    pub envelopes_relayed: IntCounter,
    /// Rejection echoes the relay made itself.
    pub relay_rejections: IntCounter,
    /// Host envelopes dropped because a name could not be translated.
    pub untranslatable_envelopes: IntCounter,
    /// Unreadable frames from hosts.
    pub upstream_bad_frames: IntCounter,
    /// Per-client links opened / failed.
    pub links_opened: IntCounter,
    /// Per-client links that failed to open or dropped.
    pub links_failed: IntCounter,
    /// Per-client links closed after `link_idle_secs` unused.
    pub links_idle_closed: IntCounter,
    /// Clients closed with 1012 while draining (§8.3).
    pub drain_closes: IntCounter,
    /// Host health: 1 up, 0 otherwise.
    pub host_up: IntGaugeVec,
    /// Clients closed with 4000 to resynchronise, by cause.
    pub resyncs: IntCounterVec,
    /// Bytes held in all replay buffers.
    pub buffer_bytes: IntGauge,
    /// Envelopes evicted from replay buffers.
    pub buffer_evictions: IntCounter,
    /// Envelopes sent inside `replay` answers.
    pub replayed_envelopes: IntCounter,
    /// Clients closed with 4008 as slow consumers.
    pub slow_consumer_closes: IntCounter,
    /// Host answers dropped because the socket that asked was replaced or
    /// closed before they came (`session::ReplyTo`).
    pub stale_answers: IntCounter,
    /// `reconnect` outcomes (replay / snapshot / not_found).
    pub reconnects: IntCounterVec,
    /// snapshot / (replay + snapshot) over the relay's lifetime, computed
    /// from [`Metrics::reconnects`] when `/metrics` is rendered (0 before
    /// the first answer).
    pub snapshot_fallback_ratio: Gauge,
    /// Envelopes per `replay` answer.
    pub replay_sizes: Histogram,
    /// Whole replay buffers of detached sessions dropped under global
    /// memory pressure (contract §5.4).
    pub pressure_dropped_buffers: IntCounter,
    /// Bytes those drops freed.
    pub pressure_freed_bytes: IntCounter,
    /// WebSocket upgrades refused before authentication, by reason
    /// (`replay_memory`: 503 under global memory pressure).
    pub upgrades_refused: IntCounterVec,
    /// Detached sessions dropped to make room for a new session of the same
    /// principal at `sessions_per_principal` (contract §3.6).
    pub sessions_evicted: IntCounter,
    /// Status page data computed (`RelayPort::status`): once per 500 ms
    /// while any status feed is open, whatever their number, plus one per
    /// `/status.json`.
    pub status_builds: IntCounter,
    /// Relay-added latency per host, in seconds: from a batch of host frames
    /// read together on a per-client link until the last of them is queued
    /// for the client's socket writer (rewritten, numbered, buffered); one
    /// sample per batch. Labels are configured host ids only.
    pub host_latency: HistogramVec,
    /// Time to answer a client `reconnect`, in seconds.
    pub reconnect_seconds: Histogram,
    /// Requests, frames and connections stopped by a §3.6 limit or a §4.2
    /// create check, by limit (`subscriptions`, `pending`, `rate`, `idle`,
    /// `request_timeout`, `quota`, `host_object`, `link_queue`,
    /// `client_frame`, `hold`).
    pub limit_hits: IntCounterVec,
    /// 1, labelled with this replica's name and the store backend
    /// (`ahp_relay_info{replica, store}`; set once by the relay).
    pub info: IntGaugeVec,
    /// Reservations of client-chosen URIs (the store write before a
    /// create is forwarded), in seconds on the blocking thread.
    pub store_write_seconds: Histogram,
    /// How long the last of those writes took, in seconds.
    pub store_last_write_seconds: Gauge,
    /// 1 while the URI store passes its health check (every 2 s, off the
    /// request path), 0 otherwise; one series, labelled with the backend
    /// (`redb` or `postgres`, §12.1).
    pub store_up: IntGaugeVec,
    /// Seconds the store's last health check took (a round trip to
    /// PostgreSQL; 0 for the embedded file).
    pub store_health_seconds: Gauge,
}

/// Registers metrics named `ahp_relay_<name>` in one registry.
struct Registrar {
    registry: Registry,
}

impl Registrar {
    fn register<M>(&self, metric: M) -> Result<M, prometheus::Error>
    where
        M: prometheus::core::Collector + Clone + 'static,
    {
        self.registry.register(Box::new(metric.clone()))?;
        Ok(metric)
    }

    fn counter(&self, name: &str, help: &str) -> Result<IntCounter, prometheus::Error> {
        self.register(IntCounter::new(format!("ahp_relay_{name}"), help)?)
    }

    fn counter_vec(
        &self,
        name: &str,
        help: &str,
        label: &str,
    ) -> Result<IntCounterVec, prometheus::Error> {
        let opts = Opts::new(format!("ahp_relay_{name}"), help);
        self.register(IntCounterVec::new(opts, &[label])?)
    }

    fn gauge(&self, name: &str, help: &str) -> Result<IntGauge, prometheus::Error> {
        self.register(IntGauge::new(format!("ahp_relay_{name}"), help)?)
    }
}

/// The edge's metrics: connections and refusals.
struct EdgeMetrics {
    connections: IntCounter,
    connections_open: IntGauge,
    connectors_attached: IntGauge,
    connector_links: IntCounter,
    auth_failures: IntCounterVec,
    upgrades_refused: IntCounterVec,
    bad_client_frames: IntCounterVec,
}

impl EdgeMetrics {
    fn new(r: &Registrar) -> Result<Self, prometheus::Error> {
        Ok(Self {
            connections: r.counter("connections_total", "client connections accepted")?,
            connections_open: r.gauge("connections_open", "client connections open")?,
            connectors_attached: r.gauge(
                "connectors_attached",
                "connectors of dial-in hosts attached now",
            )?,
            connector_links: r.counter(
                "connector_links_total",
                "link sockets opened by connectors of dial-in hosts",
            )?,
            auth_failures: r.counter_vec("auth_failures_total", "upgrades refused", "reason")?,
            upgrades_refused: r.counter_vec(
                "upgrades_refused_total",
                "upgrades refused for load",
                "reason",
            )?,
            bad_client_frames: r.counter_vec(
                "bad_client_frames_total",
                "client frames refused",
                "reason",
            )?,
        })
    }
}

/// Replay buffers, reconnect outcomes and memory pressure.
struct ReplayMetrics {
    buffer_bytes: IntGauge,
    buffer_evictions: IntCounter,
    replayed_envelopes: IntCounter,
    reconnects: IntCounterVec,
    snapshot_fallback_ratio: Gauge,
    replay_sizes: Histogram,
    pressure_dropped_buffers: IntCounter,
    pressure_freed_bytes: IntCounter,
}

impl ReplayMetrics {
    fn new(r: &Registrar) -> Result<Self, prometheus::Error> {
        Ok(Self {
            buffer_bytes: r.gauge("buffer_bytes", "bytes held in replay buffers")?,
            buffer_evictions: r.counter(
                "buffer_evictions_total",
                "envelopes evicted from replay buffers",
            )?,
            replayed_envelopes: r.counter(
                "replayed_envelopes_total",
                "envelopes sent in replay answers",
            )?,
            reconnects: r.counter_vec("reconnects_total", "reconnect outcomes", "outcome")?,
            snapshot_fallback_ratio: r.register(Gauge::new(
                "ahp_relay_reconnect_snapshot_fallback_ratio",
                "reconnect answers that were snapshot rather than replay, since start",
            )?)?,
            replay_sizes: r.register(Histogram::with_opts(
                HistogramOpts::new("ahp_relay_replay_envelopes", "envelopes per replay answer")
                    .buckets(vec![0.0, 1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0]),
            )?)?,
            pressure_dropped_buffers: r.counter(
                "replay_memory_dropped_buffers_total",
                "replay buffers of detached sessions dropped under memory pressure",
            )?,
            pressure_freed_bytes: r.counter(
                "replay_memory_freed_bytes_total",
                "bytes freed by dropping replay buffers under memory pressure",
            )?,
        })
    }
}

/// Hosts and the per-client links to them.
struct LinkMetrics {
    host_up: IntGaugeVec,
    links_opened: IntCounter,
    links_failed: IntCounter,
    links_idle_closed: IntCounter,
    upstream_bad_frames: IntCounter,
    untranslatable_envelopes: IntCounter,
}

impl LinkMetrics {
    fn new(r: &Registrar) -> Result<Self, prometheus::Error> {
        Ok(Self {
            host_up: r.register(IntGaugeVec::new(
                Opts::new("ahp_relay_host_up", "1 when the host's watch link is up"),
                &["host"],
            )?)?,
            links_opened: r.counter("links_opened_total", "per-client links opened")?,
            links_failed: r.counter("links_failed_total", "per-client links failed or dropped")?,
            links_idle_closed: r.counter(
                "links_idle_closed_total",
                "Per-client links closed after link_idle_secs unused",
            )?,
            upstream_bad_frames: r
                .counter("upstream_bad_frames_total", "unreadable host frames")?,
            untranslatable_envelopes: r
                .counter("untranslatable_envelopes_total", "host envelopes dropped")?,
        })
    }
}

/// Operations: the replica, the store, the fair session cap and latency
/// histograms.
struct OpsMetrics {
    info: IntGaugeVec,
    store_write_seconds: Histogram,
    store_last_write_seconds: Gauge,
    sessions_evicted: IntCounter,
    status_builds: IntCounter,
    host_latency: HistogramVec,
    reconnect_seconds: Histogram,
}

/// Buckets for latencies the relay adds (seconds): 50 µs to 2.5 s.
const LATENCY_BUCKETS: [f64; 12] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 2.5,
];

impl OpsMetrics {
    fn new(r: &Registrar) -> Result<Self, prometheus::Error> {
        Ok(Self {
            info: r.register(IntGaugeVec::new(
                Opts::new(
                    "ahp_relay_info",
                    "1, labelled with this replica's name and its URI store backend",
                ),
                &["replica", "store"],
            )?)?,
            store_write_seconds: r.register(Histogram::with_opts(
                HistogramOpts::new(
                    "ahp_relay_store_write_seconds",
                    "URI store reservations (the write before a create is forwarded)",
                )
                .buckets(LATENCY_BUCKETS.to_vec()),
            )?)?,
            store_last_write_seconds: r.register(Gauge::new(
                "ahp_relay_store_last_write_seconds",
                "duration of the last URI store reservation",
            )?)?,
            sessions_evicted: r.counter(
                "sessions_evicted_total",
                "detached sessions dropped for a new session of the same principal at its cap",
            )?,
            status_builds: r.counter("status_builds_total", "status page data computed")?,
            host_latency: r.register(HistogramVec::new(
                HistogramOpts::new(
                    "ahp_relay_host_frame_latency_seconds",
                    "relay-added latency from a host frame read to its client write queue",
                )
                .buckets(LATENCY_BUCKETS.to_vec()),
                &["host"],
            )?)?,
            reconnect_seconds: r.register(Histogram::with_opts(
                HistogramOpts::new(
                    "ahp_relay_reconnect_duration_seconds",
                    "time to answer a client reconnect",
                )
                .buckets(vec![
                    0.001, 0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                ]),
            )?)?,
        })
    }
}

/// Client requests, delivery and closes decided by the session.
struct SessionMetrics {
    client_requests: IntCounterVec,
    acl_decisions: IntCounterVec,
    client_notifications_dropped: IntCounter,
    envelopes_relayed: IntCounter,
    relay_rejections: IntCounter,
    drain_closes: IntCounter,
    resyncs: IntCounterVec,
    slow_consumer_closes: IntCounter,
    stale_answers: IntCounter,
}

impl SessionMetrics {
    fn new(r: &Registrar) -> Result<Self, prometheus::Error> {
        Ok(Self {
            client_requests: r.counter_vec("client_requests_total", "client requests", "method")?,
            acl_decisions: r.counter_vec(
                "acl_decisions_total",
                "Access-control decisions by outcome (allow, deny, invisible)",
                "decision",
            )?,
            client_notifications_dropped: r.counter(
                "client_notifications_dropped_total",
                "client notifications dropped",
            )?,
            envelopes_relayed: r
                .counter("envelopes_relayed_total", "envelopes delivered to clients")?,
            relay_rejections: r.counter(
                "relay_rejections_total",
                "rejection echoes made by the relay",
            )?,
            drain_closes: r.counter(
                "drain_closes_total",
                "Clients closed with 1012 while the relay drained",
            )?,
            resyncs: r.counter_vec("resyncs_total", "clients closed with 4000", "cause")?,
            slow_consumer_closes: r
                .counter("slow_consumer_closes_total", "clients closed with 4008")?,
            stale_answers: r.counter(
                "stale_answers_total",
                "host answers dropped: the client socket that asked was replaced or closed",
            )?,
        })
    }
}

impl Metrics {
    /// Registers every metric in a fresh registry.
    pub fn new() -> Result<Self, prometheus::Error> {
        let r = Registrar {
            registry: Registry::new(),
        };
        let edge = EdgeMetrics::new(&r)?;
        let session = SessionMetrics::new(&r)?;
        let links = LinkMetrics::new(&r)?;
        let replay = ReplayMetrics::new(&r)?;
        let ops = OpsMetrics::new(&r)?;
        Ok(Self {
            connections: edge.connections,
            connections_open: edge.connections_open,
            connectors_attached: edge.connectors_attached,
            connector_links: edge.connector_links,
            auth_failures: edge.auth_failures,
            upgrades_refused: edge.upgrades_refused,
            bad_client_frames: edge.bad_client_frames,
            client_requests: session.client_requests,
            acl_decisions: session.acl_decisions,
            client_notifications_dropped: session.client_notifications_dropped,
            envelopes_relayed: session.envelopes_relayed,
            relay_rejections: session.relay_rejections,
            drain_closes: session.drain_closes,
            resyncs: session.resyncs,
            slow_consumer_closes: session.slow_consumer_closes,
            stale_answers: session.stale_answers,
            host_up: links.host_up,
            links_opened: links.links_opened,
            links_failed: links.links_failed,
            links_idle_closed: links.links_idle_closed,
            upstream_bad_frames: links.upstream_bad_frames,
            untranslatable_envelopes: links.untranslatable_envelopes,
            buffer_bytes: replay.buffer_bytes,
            buffer_evictions: replay.buffer_evictions,
            replayed_envelopes: replay.replayed_envelopes,
            reconnects: replay.reconnects,
            snapshot_fallback_ratio: replay.snapshot_fallback_ratio,
            replay_sizes: replay.replay_sizes,
            pressure_dropped_buffers: replay.pressure_dropped_buffers,
            pressure_freed_bytes: replay.pressure_freed_bytes,
            info: ops.info,
            store_write_seconds: ops.store_write_seconds,
            store_last_write_seconds: ops.store_last_write_seconds,
            sessions_evicted: ops.sessions_evicted,
            status_builds: ops.status_builds,
            host_latency: ops.host_latency,
            reconnect_seconds: ops.reconnect_seconds,
            limit_hits: r.counter_vec(
                "limit_hits_total",
                "requests, frames or connections stopped by a limit",
                "limit",
            )?,
            store_up: r.register(IntGaugeVec::new(
                Opts::new(
                    "ahp_relay_store_up",
                    "1 while the URI store passes its health check",
                ),
                &["backend"],
            )?)?,
            store_health_seconds: r.register(Gauge::new(
                "ahp_relay_store_health_seconds",
                "duration of the URI store's last health check",
            )?)?,
            registry: r.registry,
        })
    }

    /// The text exposition format of every metric.
    pub fn render(&self) -> String {
        let outcome = |o: &str| {
            self.reconnects
                .get_metric_with_label_values(&[o])
                .map_or(0, |c| c.get())
        };
        let (snapshot, replay) = (outcome("snapshot"), outcome("replay"));
        let answered = snapshot + replay;
        self.snapshot_fallback_ratio.set(if answered == 0 {
            0.0
        } else {
            snapshot as f64 / answered as f64
        });
        let mut out = String::new();
        let encoder = prometheus::TextEncoder::new();
        if let Err(e) = encoder.encode_utf8(&self.registry.gather(), &mut out) {
            tracing::error!(error = %e, "cannot render metrics");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_fallback_ratio_is_computed_at_render() {
        let m = Metrics::new().unwrap();
        assert!(
            m.render()
                .contains("ahp_relay_reconnect_snapshot_fallback_ratio 0\n"),
            "0 before any reconnect"
        );
        m.reconnects.with_label_values(&["replay"]).inc_by(3);
        m.reconnects.with_label_values(&["snapshot"]).inc();
        m.reconnects.with_label_values(&["not_found"]).inc_by(7);
        let page = m.render();
        assert!(
            page.contains("ahp_relay_reconnect_snapshot_fallback_ratio 0.25\n"),
            "{page}"
        );
        m.replay_sizes.observe(5.0);
        let page = m.render();
        assert!(page.contains("ahp_relay_replay_envelopes_bucket{le=\"4\"} 0\n"));
        assert!(page.contains("ahp_relay_replay_envelopes_bucket{le=\"16\"} 1\n"));
    }
}

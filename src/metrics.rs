//! Prometheus metrics (`ahp_relay_…`), with bounded label sets: method
//! names from the relay's own table plus `other`, reasons from closed lists
//! — never a principal, clientId or URI.

use prometheus::{
    Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
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
}

impl Metrics {
    /// Registers every metric in a fresh registry.
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let counter = |name: &str, help: &str| -> Result<IntCounter, prometheus::Error> {
            let c = IntCounter::new(format!("ahp_relay_{name}"), help)?;
            registry.register(Box::new(c.clone()))?;
            Ok(c)
        };
        let counter_vec =
            |name: &str, help: &str, label: &str| -> Result<IntCounterVec, prometheus::Error> {
                let c = IntCounterVec::new(Opts::new(format!("ahp_relay_{name}"), help), &[label])?;
                registry.register(Box::new(c.clone()))?;
                Ok(c)
            };
        let connections_open =
            IntGauge::new("ahp_relay_connections_open", "client connections open")?;
        registry.register(Box::new(connections_open.clone()))?;
        let buffer_bytes = IntGauge::new("ahp_relay_buffer_bytes", "bytes held in replay buffers")?;
        registry.register(Box::new(buffer_bytes.clone()))?;
        let host_up = IntGaugeVec::new(
            Opts::new("ahp_relay_host_up", "1 when the host's watch link is up"),
            &["host"],
        )?;
        registry.register(Box::new(host_up.clone()))?;
        let snapshot_fallback_ratio = Gauge::new(
            "ahp_relay_reconnect_snapshot_fallback_ratio",
            "reconnect answers that were snapshot rather than replay, since start",
        )?;
        registry.register(Box::new(snapshot_fallback_ratio.clone()))?;
        let replay_sizes = Histogram::with_opts(
            HistogramOpts::new("ahp_relay_replay_envelopes", "envelopes per replay answer")
                .buckets(vec![0.0, 1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0]),
        )?;
        registry.register(Box::new(replay_sizes.clone()))?;
        Ok(Self {
            connections: counter("connections_total", "client connections accepted")?,
            connections_open,
            auth_failures: counter_vec("auth_failures_total", "upgrades refused", "reason")?,
            client_requests: counter_vec("client_requests_total", "client requests", "method")?,
            acl_decisions: counter_vec(
                "acl_decisions_total",
                "Access-control decisions by outcome (allow, deny, invisible)",
                "decision",
            )?,
            bad_client_frames: counter_vec(
                "bad_client_frames_total",
                "client frames refused",
                "reason",
            )?,
            client_notifications_dropped: counter(
                "client_notifications_dropped_total",
                "client notifications dropped",
            )?,
            envelopes_relayed: counter(
                "envelopes_relayed_total",
                "envelopes delivered to clients",
            )?,
            relay_rejections: counter(
                "relay_rejections_total",
                "rejection echoes made by the relay",
            )?,
            untranslatable_envelopes: counter(
                "untranslatable_envelopes_total",
                "host envelopes dropped",
            )?,
            upstream_bad_frames: counter("upstream_bad_frames_total", "unreadable host frames")?,
            links_opened: counter("links_opened_total", "per-client links opened")?,
            links_failed: counter("links_failed_total", "per-client links failed or dropped")?,
            drain_closes: counter(
                "drain_closes_total",
                "Clients closed with 1012 while the relay drained",
            )?,
            links_idle_closed: counter(
                "links_idle_closed_total",
                "Per-client links closed after link_idle_secs unused",
            )?,
            host_up,
            resyncs: counter_vec("resyncs_total", "clients closed with 4000", "cause")?,
            buffer_bytes,
            buffer_evictions: counter(
                "buffer_evictions_total",
                "envelopes evicted from replay buffers",
            )?,
            replayed_envelopes: counter(
                "replayed_envelopes_total",
                "envelopes sent in replay answers",
            )?,
            slow_consumer_closes: counter(
                "slow_consumer_closes_total",
                "clients closed with 4008",
            )?,
            reconnects: counter_vec("reconnects_total", "reconnect outcomes", "outcome")?,
            snapshot_fallback_ratio,
            replay_sizes,
            pressure_dropped_buffers: counter(
                "replay_memory_dropped_buffers_total",
                "replay buffers of detached sessions dropped under memory pressure",
            )?,
            pressure_freed_bytes: counter(
                "replay_memory_freed_bytes_total",
                "bytes freed by dropping replay buffers under memory pressure",
            )?,
            upgrades_refused: counter_vec(
                "upgrades_refused_total",
                "upgrades refused for load",
                "reason",
            )?,
            registry,
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

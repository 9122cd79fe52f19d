//! `deploy/grafana/ahp-relay.json` charts only metrics the relay exports
//! (contract §8.2, issue 13.5): every `ahp_relay_…` name in a panel query or
//! a template variable must be registered by `Metrics::new()`, so renaming a
//! metric without the dashboard fails here.

use std::collections::BTreeSet;
use std::path::Path;

use ahp_relay::metrics::Metrics;
use serde_json::Value;

fn dashboard() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/grafana/ahp-relay.json");
    let text = std::fs::read_to_string(&path).expect("dashboard file");
    serde_json::from_str(&text).expect("dashboard is JSON")
}

/// Every PromQL text of the dashboard: panel target `expr`s and template
/// variable queries.
fn queries(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr" | "definition", Value::String(q)) => out.push(q.clone()),
                    ("query", Value::String(q)) if q.contains('(') => out.push(q.clone()),
                    _ => queries(v, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|v| queries(v, out)),
        _ => {}
    }
}

/// The identifiers of `q` that start with `ahp_relay_`, and the identifier
/// in front of each `{` selector.
fn metric_names(q: &str) -> (Vec<String>, Vec<String>) {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut names = Vec::new();
    let mut selected = Vec::new();
    let mut ident = String::new();
    for c in q.chars() {
        if is_ident(c) {
            ident.push(c);
            continue;
        }
        if c == '{' {
            selected.push(ident.clone());
        }
        if ident.starts_with("ahp_relay_") {
            names.push(ident.clone());
        }
        ident.clear();
    }
    if ident.starts_with("ahp_relay_") {
        names.push(ident);
    }
    (names, selected)
}

/// Whether `name` is registered in `metrics`: a second collector of the same
/// name is refused by the registry, also for label vectors that have no
/// series yet (which `/metrics` does not show).
fn registered(metrics: &Metrics, name: &str) -> bool {
    prometheus::IntGauge::new(name, "probe")
        .is_ok_and(|probe| metrics.registry.register(Box::new(probe)).is_err())
}

#[test]
fn every_metric_the_dashboard_queries_exists_in_the_relay() {
    let dash = dashboard();
    let mut qs = Vec::new();
    queries(&dash, &mut qs);
    assert!(qs.len() >= 20, "the dashboard has its queries: {qs:?}");
    let mut used = BTreeSet::new();
    for q in &qs {
        let (names, selected) = metric_names(q);
        assert!(!names.is_empty(), "a query without a relay metric: {q}");
        for s in selected {
            assert!(
                s.starts_with("ahp_relay_"),
                "only the relay's own metrics: {s:?} in {q}"
            );
        }
        used.extend(names);
    }
    let metrics = Metrics::new().expect("metrics register");
    let missing: Vec<&String> = used
        .iter()
        .filter(|name| {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s));
            !registered(&metrics, name) && !base.is_some_and(|b| registered(&metrics, b))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries metrics the relay does not export: {missing:?}"
    );
    for needed in [
        "ahp_relay_connections_open",
        "ahp_relay_connections_total",
        "ahp_relay_auth_failures_total",
        "ahp_relay_client_requests_total",
        "ahp_relay_host_up",
        "ahp_relay_reconnects_total",
        "ahp_relay_reconnect_snapshot_fallback_ratio",
        "ahp_relay_buffer_bytes",
        "ahp_relay_acl_decisions_total",
        "ahp_relay_slow_consumer_closes_total",
    ] {
        assert!(used.contains(needed), "no panel charts {needed}");
    }
}

/// The probe of [`registered`] can fail: a name the relay does not export
/// is not found.
#[test]
fn an_unknown_metric_name_is_not_registered() {
    let metrics = Metrics::new().expect("metrics register");
    assert!(registered(&metrics, "ahp_relay_connections_open"));
    assert!(!registered(&metrics, "ahp_relay_no_such_metric_total"));
}

#[test]
fn panels_have_unique_ids_and_a_datasource_variable() {
    let dash = dashboard();
    let panels = dash["panels"].as_array().expect("panels");
    let ids: BTreeSet<i64> = panels.iter().filter_map(|p| p["id"].as_i64()).collect();
    assert_eq!(ids.len(), panels.len(), "every panel has its own id");
    for p in panels.iter().filter(|p| p["type"] != "row") {
        let targets = p["targets"].as_array().map_or(0, Vec::len);
        assert!(targets > 0, "panel {} has no query", p["title"]);
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
    }
    let vars = dash["templating"]["list"].as_array().expect("variables");
    assert!(vars.iter().any(|v| v["type"] == "datasource"));
}

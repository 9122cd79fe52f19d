//! The audit trail (contract §7.5): one JSON object per line for each
//! decision on a write, each terminal subscription and each refused access,
//! on its own `tracing` target (`ahp_relay::audit`) so operators can route
//! it to its own sink. A line carries the principal (issuer, subject),
//! host, channel, method or action type, decision and rule — never message
//! text, tool inputs or outputs, `authenticate` params, tokens or query
//! strings: [`Record`] has no field that could hold them.
//!
//! Every value is bounded ([`max_value_bytes`], `[policy]
//! audit_max_value_bytes`, default [`DEFAULT_MAX_VALUE_BYTES`]; cut on a char
//! boundary and marked with [`TRUNCATED`]) and escaped by `serde_json`, never by string
//! formatting, so a channel or action type holding a newline or quotes
//! cannot start a second line or forge a field. [`layer`] writes the lines
//! bare (one object per line, nothing around it); any other subscriber sees
//! the object as the event's message.

use std::borrow::Cow;
use std::io::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::Serialize;
use tracing::field::{Field, Visit};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{Filtered, Targets};
use tracing_subscriber::fmt::MakeWriter;

use super::Subject;

/// The `tracing` target of audit lines.
pub const TARGET: &str = "ahp_relay::audit";

/// The default of the most bytes of one value in an audit line, marker
/// included. Values come from clients (channels, action types), so an
/// unbounded one would let a client grow the audit log at will.
pub const DEFAULT_MAX_VALUE_BYTES: usize = 256;

/// The range `[policy] audit_max_value_bytes` may take: room for the marker
/// and a useful prefix, and no more than a frame-sized line.
pub const VALUE_BYTES_RANGE: std::ops::RangeInclusive<usize> = 32..=65536;

/// Appended to a value cut at [`max_value_bytes`].
pub const TRUNCATED: &str = "…[truncated]";

/// The bound in force. Process-wide like the audit target itself; the
/// policy loaded last sets it.
static MAX_VALUE_BYTES: AtomicUsize = AtomicUsize::new(DEFAULT_MAX_VALUE_BYTES);

/// The most bytes of one value in the audit lines written from now on.
pub fn max_value_bytes() -> usize {
    MAX_VALUE_BYTES.load(Ordering::Relaxed)
}

/// Sets [`max_value_bytes`], clamped to [`VALUE_BYTES_RANGE`].
pub fn set_max_value_bytes(max: usize) {
    let max = max.clamp(*VALUE_BYTES_RANGE.start(), *VALUE_BYTES_RANGE.end());
    MAX_VALUE_BYTES.store(max, Ordering::Relaxed);
}

/// How a decision went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Allowed and forwarded.
    Allow,
    /// Refused: visible but not permitted (-32009 or a rejection echo).
    Deny,
    /// Refused as nonexistent: the principal cannot see the object.
    Invisible,
}

impl Decision {
    /// The label in audit lines and metrics.
    pub fn label(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Deny => "deny",
            Self::Invisible => "invisible",
        }
    }
}

/// One audited decision.
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    /// Who asked.
    pub who: Subject<'a>,
    /// The host concerned (empty if none was resolved).
    pub host: &'a str,
    /// The channel, client form.
    pub channel: &'a str,
    /// The method, or the action type of a `dispatchAction`.
    pub operation: &'a str,
    /// The outcome.
    pub decision: Decision,
    /// The rule that granted (or `-`).
    pub rule: &'a str,
}

/// `value` cut to at most `max` bytes: unchanged if it fits, otherwise the
/// longest prefix ending on a char boundary that leaves room for
/// [`TRUNCATED`], followed by it (just the marker's prefix if `max` is
/// smaller than the marker).
pub fn clip(value: &str, max: usize) -> Cow<'_, str> {
    if value.len() <= max {
        return Cow::Borrowed(value);
    }
    let keep = value.floor_char_boundary(max.saturating_sub(TRUNCATED.len()));
    let marker = TRUNCATED.get(..TRUNCATED.floor_char_boundary(max - keep));
    Cow::Owned(format!(
        "{}{}",
        value.get(..keep).unwrap_or_default(),
        marker.unwrap_or_default()
    ))
}

/// A value of an audit line; only [`Value::new`] makes one, so every value
/// written is bounded.
#[derive(Debug, Serialize)]
#[serde(transparent)]
struct Value<'a>(Cow<'a, str>);

impl<'a> Value<'a> {
    fn new(value: &'a str, max: usize) -> Self {
        Self(clip(value, max))
    }
}

#[derive(Debug, Serialize)]
struct Principal<'a> {
    issuer: Value<'a>,
    subject: Value<'a>,
}

/// The JSON object of one line. `timestamp`, `level` and `target` are named
/// as in `--log-format json` lines, so one pipeline can route both.
#[derive(Debug, Serialize)]
struct Line<'a> {
    timestamp: String,
    level: &'static str,
    target: &'static str,
    principal: Principal<'a>,
    host: Value<'a>,
    channel: Value<'a>,
    operation: Value<'a>,
    decision: &'static str,
    rule: Value<'a>,
}

/// The audit line of `r` with values of at most `max` bytes: one JSON
/// object, no newline in it.
pub fn line(r: &Record<'_>, max: usize) -> String {
    let value = |v| Value::new(v, max);
    let line = Line {
        timestamp: jiff::Timestamp::now()
            .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
            .to_string(),
        level: "INFO",
        target: TARGET,
        principal: Principal {
            issuer: value(&r.who.principal.issuer),
            subject: value(&r.who.principal.subject),
        },
        host: value(r.host),
        channel: value(r.channel),
        operation: value(r.operation),
        decision: r.decision.label(),
        rule: value(r.rule),
    };
    // Serializing string fields into a String cannot fail; should it ever,
    // the line still says that a decision happened, without its values.
    serde_json::to_string(&line).unwrap_or_else(|_| {
        serde_json::json!({
            "target": TARGET,
            "decision": r.decision.label(),
            "error": "unserializable",
        })
        .to_string()
    })
}

/// Writes one audit line.
pub fn record(r: Record<'_>) {
    // A refusal is also kept for the status page's recent denials.
    super::recent::note(&r);
    // Nothing is serialized when no subscriber takes audit lines.
    if !tracing::enabled!(target: TARGET, tracing::Level::INFO) {
        return;
    }
    let line = line(&r, max_value_bytes());
    tracing::info!(target: TARGET, "{line}");
}

/// A layer writing each audit line, and nothing else, to `make_writer`: one
/// JSON object and a newline per event. Enabled for [`TARGET`] at INFO
/// whatever `RUST_LOG` says, so the trail cannot be switched off by a log
/// level.
pub fn layer<S, W>(make_writer: W) -> Filtered<AuditLayer<W>, Targets, S>
where
    S: tracing::Subscriber,
    W: for<'w> MakeWriter<'w> + 'static,
{
    AuditLayer { make_writer }.with_filter(Targets::new().with_target(TARGET, tracing::Level::INFO))
}

/// See [`layer`].
#[derive(Debug)]
pub struct AuditLayer<W> {
    make_writer: W,
}

/// Takes the formatted message of an event.
#[derive(Default)]
struct Message(Option<String>);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = Some(format!("{value:?}"));
        }
    }
}

impl<S, W> Layer<S> for AuditLayer<W>
where
    S: tracing::Subscriber,
    W: for<'w> MakeWriter<'w> + 'static,
{
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if event.metadata().target() != TARGET {
            return;
        }
        let mut message = Message::default();
        event.record(&mut message);
        if let Some(mut line) = message.0 {
            line.push('\n');
            // One write per line, so lines of concurrent events never interleave
            // on a writer that does not split writes.
            let _ = self.make_writer.make_writer().write_all(line.as_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::layer::SubscriberExt as _;

    use super::*;
    use crate::identity::PrincipalKey;

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn clip_keeps_short_values_and_cuts_long_ones_on_a_char_boundary() {
        assert_eq!(clip("short", 256), "short");
        let exact = "a".repeat(256);
        assert!(
            matches!(clip(&exact, 256), Cow::Borrowed(_)),
            "fits exactly"
        );
        // 'é' is two bytes: an odd cut point falls inside one.
        let long = "é".repeat(200);
        let cut = clip(&long, 256);
        assert!(cut.len() <= 256, "{} bytes", cut.len());
        assert!(cut.ends_with(TRUNCATED), "{cut}");
        let kept = cut.strip_suffix(TRUNCATED).unwrap();
        assert!(kept.chars().all(|c| c == 'é') && !kept.is_empty());
        assert_eq!(kept.len(), (256 - TRUNCATED.len()) / 2 * 2);
        let tiny = clip("abcdefghijklmnopqrstuvwxyz", 4);
        assert!(tiny.len() <= 4 && TRUNCATED.starts_with(&*tiny), "{tiny}");
    }

    #[test]
    fn one_json_line_on_the_audit_target_with_every_field() {
        let sink = Sink::default();
        let writer = sink.clone();
        let subscriber = tracing_subscriber::registry().with(layer(move || writer.clone()));
        let key = PrincipalKey {
            issuer: "idp".into(),
            subject: "bob\n{\"decision\":\"allow\"}".into(),
        };
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!("not an audit line");
            record(Record {
                who: Subject {
                    principal: &key,
                    groups: &[],
                },
                host: "gpu1",
                channel: "ahp-chat:/gpu1~c",
                operation: "chat/turnStarted",
                decision: Decision::Deny,
                rule: "-",
            })
        });
        let out = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        assert_eq!(out.lines().count(), 1, "{out}");
        let v: serde_json::Value = serde_json::from_str(out.trim_end()).unwrap();
        assert_eq!(v["target"], TARGET);
        assert_eq!(v["principal"]["issuer"], "idp");
        assert_eq!(v["principal"]["subject"], key.subject.as_str());
        assert_eq!(v["host"], "gpu1");
        assert_eq!(v["channel"], "ahp-chat:/gpu1~c");
        assert_eq!(v["operation"], "chat/turnStarted");
        assert_eq!(
            v["decision"], "deny",
            "the forged field stays inside a value"
        );
        assert_eq!(v["rule"], "-");
    }

    #[test]
    fn line_bounds_every_value() {
        let key = PrincipalKey {
            issuer: "i".repeat(100),
            subject: "s".into(),
        };
        let long = "x".repeat(100);
        let r = Record {
            who: Subject {
                principal: &key,
                groups: &[],
            },
            host: &long,
            channel: &long,
            operation: &long,
            decision: Decision::Allow,
            rule: &long,
        };
        let v: serde_json::Value = serde_json::from_str(&line(&r, 40)).unwrap();
        for value in [
            &v["principal"]["issuer"],
            &v["host"],
            &v["channel"],
            &v["operation"],
            &v["rule"],
        ] {
            let value = value.as_str().unwrap();
            assert!(value.len() <= 40 && value.ends_with(TRUNCATED), "{value}");
        }
        assert_eq!(v["principal"]["subject"], "s");
    }
}

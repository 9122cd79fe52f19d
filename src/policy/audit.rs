//! The audit trail (contract §7.5): one structured line per decision on a
//! write, per terminal subscription and per refused access, on its own
//! `tracing` target (`ahp_relay::audit`) so operators can route it to its
//! own sink. Lines carry principal, host, channel, method or action type,
//! decision and rule — never message text, tool inputs or outputs,
//! `authenticate` params, tokens or query strings.

use super::Subject;

/// The `tracing` target of audit lines.
pub const TARGET: &str = "ahp_relay::audit";

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

/// Writes one audit line (a refusal is also kept for the status page).
pub fn record(r: Record<'_>) {
    super::recent::note(&r);
    tracing::info!(
        target: TARGET,
        issuer = %r.who.principal.issuer,
        subject = %r.who.principal.subject,
        host = %r.host,
        channel = %r.channel,
        operation = %r.operation,
        decision = r.decision.label(),
        rule = %r.rule,
        "audit"
    );
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

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
    fn one_line_on_the_audit_target_with_every_field() {
        let sink = Sink::default();
        let writer = sink.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let key = PrincipalKey {
            issuer: "idp".into(),
            subject: "bob".into(),
        };
        tracing::subscriber::with_default(subscriber, || {
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
        for part in [
            TARGET,
            "subject=bob",
            "host=gpu1",
            "channel=ahp-chat:/gpu1~c",
            "operation=chat/turnStarted",
            "decision=\"deny\"",
        ] {
            assert!(out.contains(part), "{part} missing in {out}");
        }
    }
}

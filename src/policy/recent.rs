//! The most recent refusals of the audit trail, in memory, for the status
//! page: a bounded ring (the oldest falls out), fed by `audit::record`.
//! Entries carry what an audit line carries — principal, host, channel,
//! operation, decision, rule — never message text.

use std::collections::VecDeque;
use std::sync::Mutex;

use serde::Serialize;

use super::audit::{Decision, Record};

/// How many refusals are kept.
pub const KEPT: usize = 50;

/// One refused access.
#[derive(Debug, Clone, Serialize)]
pub struct Denial {
    /// Seconds since the Unix epoch.
    pub at: u64,
    /// The principal's subject.
    pub subject: String,
    /// The host concerned (empty if none was resolved).
    pub host: String,
    /// The channel, client form.
    pub channel: String,
    /// The method or action type.
    pub operation: String,
    /// `deny` or `invisible`.
    pub decision: &'static str,
}

static RECENT: Mutex<VecDeque<Denial>> = Mutex::new(VecDeque::new());

/// Keeps `r` if it is a refusal.
pub fn note(r: &Record<'_>) {
    if r.decision == Decision::Allow {
        return;
    }
    let denial = Denial {
        at: crate::identity::unix_now(),
        subject: r.who.principal.subject.clone(),
        host: r.host.to_string(),
        // Bounded like audit values: a client-chosen channel may be long.
        channel: super::audit::clip(r.channel, 256).into_owned(),
        operation: super::audit::clip(r.operation, 256).into_owned(),
        decision: r.decision.label(),
    };
    let mut ring = RECENT.lock().unwrap_or_else(|e| e.into_inner());
    if ring.len() >= KEPT {
        ring.pop_front();
    }
    ring.push_back(denial);
}

/// The kept refusals, newest first.
pub fn denials() -> Vec<Denial> {
    let ring = RECENT.lock().unwrap_or_else(|e| e.into_inner());
    ring.iter().rev().cloned().collect()
}

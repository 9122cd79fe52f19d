//! Access control: the single decision point every routed request, every
//! dispatched action and every list or root entry goes through (contract §7).
//!
//! This version ships one policy, [`AllowAll`]: every authenticated principal
//! may see and operate everything. The multi-tenant policy replaces it behind
//! the same trait, so no call site changes and no path can bypass it: the
//! router asks [`Policy::permits`] before forwarding, and the catalog and the
//! root ask [`Policy::sees_host`] / [`Policy::sees_session`] when they build a
//! reply (so a filter never guards only the live path).

use crate::route::store::Owner;
use crate::session::PrincipalKey;

/// What an operation needs, per host (contract §7.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permission {
    /// Read sessions, chats and their catalog entries.
    SessionsRead,
    /// Create, dispose, dispatch to sessions and chats.
    SessionsOperate,
    /// Create, claim, use terminals.
    TerminalsUse,
}

/// Who is asking.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    /// Issuer and subject of the token.
    pub principal: &'a PrincipalKey,
    /// Groups from the token.
    pub groups: &'a [String],
}

/// The decisions the relay asks for.
pub trait Policy: Send + Sync + std::fmt::Debug {
    /// Whether `who` may see host `host` at all (its agents and catalog).
    fn sees_host(&self, who: Subject<'_>, host: &str) -> bool;
    /// Whether `who` may see session `session` (host form) on `host`, created
    /// through the relay by `owner` if known.
    fn sees_session(
        &self,
        who: Subject<'_>,
        host: &str,
        session: &str,
        owner: Option<&Owner>,
    ) -> bool;
    /// Whether `who` holds `permission` on `host`.
    fn permits(&self, who: Subject<'_>, host: &str, permission: Permission) -> bool;
}

/// Everyone authenticated sees and operates everything (single-tenant relays).
#[derive(Debug, Clone, Copy, Default)]
pub struct AllowAll;

impl Policy for AllowAll {
    fn sees_host(&self, _who: Subject<'_>, _host: &str) -> bool {
        true
    }
    fn sees_session(
        &self,
        _who: Subject<'_>,
        _host: &str,
        _session: &str,
        _owner: Option<&Owner>,
    ) -> bool {
        true
    }
    fn permits(&self, _who: Subject<'_>, _host: &str, _permission: Permission) -> bool {
        true
    }
}

/// The permission a routed client method needs; `None` for methods the
/// relay answers itself.
pub fn permission_for_method(method: &str) -> Option<Permission> {
    match method {
        "subscribe" | "fetchTurns" | "completions" | "listSessions" => {
            Some(Permission::SessionsRead)
        }
        "createSession"
        | "disposeSession"
        | "createChat"
        | "disposeChat"
        | "moveChat"
        | "resolveSessionConfig"
        | "sessionConfigCompletions"
        | "dispatchAction" => Some(Permission::SessionsOperate),
        "createTerminal" | "disposeTerminal" => Some(Permission::TerminalsUse),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_routed_method_needs_a_permission() {
        for m in [
            "subscribe",
            "createSession",
            "createTerminal",
            "dispatchAction",
            "moveChat",
        ] {
            assert!(permission_for_method(m).is_some(), "{m}");
        }
        assert_eq!(permission_for_method("ping"), None);
        assert_eq!(
            permission_for_method("createTerminal"),
            Some(Permission::TerminalsUse)
        );
    }
}

//! Access control: the single decision point every routed request, every
//! dispatched action, every translated URI field and every list, root or
//! catalog entry goes through (contract §7).
//!
//! - [`table`] maps every method and every client-dispatchable action type to
//!   exactly one [`Permission`]; anything not in it is refused.
//! - [`rules`] is the configured policy: rules binding principals to hosts
//!   with a role and a session visibility; default deny.
//! - [`objects`] decides whether a principal can *see* a channel (a session,
//!   a chat through its session, a terminal through its claim or creator),
//!   which is always asked before whether it may *do* something (§4.4).
//! - [`audit`] writes one structured line per decision on a write, per
//!   terminal subscription, per denied read (§7.5).
//!
//! The policy in force is swappable at run time ([`Access::set_policy`]), so a
//! reload applies to the next request at once (§7.6).

pub mod audit;
pub mod objects;
pub mod recent;
pub mod rules;
pub mod table;

use std::sync::Arc;

use crate::identity::PrincipalKey;
use crate::names::store::Owner;

pub use objects::Access;
pub use rules::{PolicyConfig, RulePolicy};

/// What an operation needs, per host (contract §7.1): the closed list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Permission {
    /// `sessions:read`: see sessions and chats, subscribe, fetch turns.
    SessionsRead,
    /// `sessions:operate`: create, dispose, dispatch to sessions and chats.
    SessionsOperate,
    /// `terminals:use`: create, claim, type into terminals.
    TerminalsUse,
    /// `files:read`: `resource*` reads on the host's file system (the
    /// whole host; a rule may scope it to sessions' working directories,
    /// [`Grant::session_files`]).
    FilesRead,
    /// `files:write`: `resource*` writes on the host's file system (the
    /// same).
    FilesWrite,
}

impl Permission {
    /// Every permission, in the order of the closed list.
    pub const ALL: [Permission; 5] = [
        Permission::SessionsRead,
        Permission::SessionsOperate,
        Permission::TerminalsUse,
        Permission::FilesRead,
        Permission::FilesWrite,
    ];

    /// The permission's name in configs, audit lines and errors.
    pub fn name(self) -> &'static str {
        match self {
            Self::SessionsRead => "sessions:read",
            Self::SessionsOperate => "sessions:operate",
            Self::TerminalsUse => "terminals:use",
            Self::FilesRead => "files:read",
            Self::FilesWrite => "files:write",
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// A set of permissions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PermSet(u8);

impl PermSet {
    /// The set holding `perms`.
    pub fn of(perms: &[Permission]) -> Self {
        Self(perms.iter().fold(0, |acc, p| acc | p.bit()))
    }

    /// Whether the set holds `p`.
    pub fn has(self, p: Permission) -> bool {
        self.0 & p.bit() != 0
    }

    /// The union of two sets.
    pub fn union(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    /// The set without `perms`.
    pub fn without(self, perms: &[Permission]) -> Self {
        Self(self.0 & !Self::of(perms).0)
    }
}

/// Roles bundle permissions (contract §7.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// `sessions:read`.
    Viewer,
    /// Viewer + `sessions:operate`, `terminals:use`, `files:read`.
    Operator,
    /// Operator + `files:write` and disposing others' sessions.
    Admin,
}

impl Role {
    /// The permissions the role grants.
    pub fn permissions(self) -> PermSet {
        use Permission::*;
        match self {
            Self::Viewer => PermSet::of(&[SessionsRead]),
            Self::Operator => {
                PermSet::of(&[SessionsRead, SessionsOperate, TerminalsUse, FilesRead])
            }
            Self::Admin => PermSet::of(&Permission::ALL),
        }
    }
}

/// Which sessions created through the relay a rule shows (contract §7.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Visibility {
    /// Only sessions the principal created.
    Own,
    /// Sessions created by the principal or by anyone sharing one of its groups.
    Group,
    /// Every session created through the relay.
    All,
}

/// Whether two group lists share a group, in time linear in their lengths:
/// a merge when both are sorted (the edge sorts a token's groups, and owners
/// are recorded from them), else a set of the shorter one. Groups are bounded
/// per token (`auth.max_groups`), but a check runs once per listed session, so
/// a pairwise comparison would cost every list the product of two bounds.
pub fn shares_group(a: &[String], b: &[String]) -> bool {
    if a.is_empty() || b.is_empty() {
        return false;
    }
    if a.is_sorted() && b.is_sorted() {
        let (mut i, mut j) = (0, 0);
        while let (Some(x), Some(y)) = (a.get(i), b.get(j)) {
            match x.cmp(y) {
                std::cmp::Ordering::Less => i += 1,
                std::cmp::Ordering::Greater => j += 1,
                std::cmp::Ordering::Equal => return true,
            }
        }
        return false;
    }
    let (small, large) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    let set: std::collections::HashSet<&str> = small.iter().map(String::as_str).collect();
    large.iter().any(|g| set.contains(g.as_str()))
}

/// Who is asking.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    /// Issuer and subject of the token.
    pub principal: &'a PrincipalKey,
    /// Groups from the token.
    pub groups: &'a [String],
}

impl Subject<'_> {
    /// Whether `owner` is this principal.
    pub fn is(&self, owner: &Owner) -> bool {
        owner.issuer == self.principal.issuer && owner.subject == self.principal.subject
    }
}

/// A host as rules select it: by id or by label.
#[derive(Debug, Clone, Copy)]
pub struct HostRef<'a> {
    /// The configured host id.
    pub id: &'a str,
    /// The configured label, if any.
    pub label: Option<&'a str>,
}

/// What a principal holds on one host: the union of every matching rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// Permissions granted.
    pub permissions: PermSet,
    /// The widest visibility of the matching rules.
    pub visibility: Visibility,
    /// Whether sessions created outside the relay are visible.
    pub external: bool,
    /// Whether the principal holds the admin role here: it may dispose
    /// sessions it does not own and change host-wide settings
    /// (`root/configChanged`).
    pub dispose_others: bool,
    /// Whether a rule scopes files to sessions' working directories
    /// (`files = "session-dirs"`, contract §7.1): besides the host-wide
    /// `files:*` in [`Grant::permissions`], `files:read` inside the working
    /// directories of the sessions the principal can see here and
    /// `files:write` inside those of the sessions it may operate
    /// (`route::files` decides, on the host-canonical path).
    pub session_files: bool,
    /// The name of the first matching rule (for audit lines).
    pub rule: Arc<str>,
}

impl Grant {
    /// Whether the grant holds `p`.
    pub fn permits(&self, p: Permission) -> bool {
        self.permissions.has(p)
    }

    /// Whether the principal holds the admin role here, the only role that
    /// may change what the host holds for every user (host-wide settings,
    /// a host-wide `authenticate`).
    pub fn is_admin(&self) -> bool {
        self.dispose_others
    }

    /// Whether the grant holds `files` host-wide or, short of that, inside
    /// sessions' working directories (the request then needs the scope's
    /// path check).
    pub fn touches_files(&self, files: Permission) -> bool {
        self.permits(files) || self.session_files
    }

    /// Whether the grant shows every session, whoever created it (then no
    /// ownership lookup is needed).
    pub fn sees_everything(&self) -> bool {
        self.visibility == Visibility::All && self.external
    }

    /// Whether `who` sees a session created by `owner` (`None`: created
    /// outside the relay). A principal always sees what it created.
    pub fn sees(&self, who: Subject<'_>, owner: Option<&Owner>) -> bool {
        match owner {
            None => self.external,
            Some(o) if who.is(o) => true,
            Some(o) => match self.visibility {
                Visibility::All => true,
                // Groups are (issuer, group) pairs: another issuer's `platform` is another group.
                Visibility::Group => {
                    o.issuer == who.principal.issuer && shares_group(&o.groups, who.groups)
                }
                Visibility::Own => false,
            },
        }
    }
}

/// The decisions the relay asks for.
pub trait Policy: Send + Sync + std::fmt::Debug {
    /// What `who` holds on `host`; `None` means the host is invisible to it
    /// (its agents, sessions and terminals do not exist for it).
    fn grant(&self, who: Subject<'_>, host: HostRef<'_>) -> Option<Grant>;
}

#[cfg(test)]
mod tests {
    use super::shares_group;

    fn v(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn shares_group_by_merge_or_set() {
        assert!(shares_group(&v(&["a", "m", "z"]), &v(&["b", "m"])));
        assert!(!shares_group(&v(&["a", "c"]), &v(&["b", "d"])));
        // Unsorted lists (owners stored before groups were sorted) still match.
        assert!(shares_group(&v(&["z", "m", "a"]), &v(&["m"])));
        assert!(!shares_group(&v(&["z", "a"]), &v(&["m", "b"])));
        assert!(!shares_group(&[], &v(&["a"])));
        // Thousands against thousands stays linear: this finishes at once.
        let a: Vec<String> = (0..5000).map(|i| format!("g{i:05}")).collect();
        let b: Vec<String> = (5000..10000).map(|i| format!("g{i:05}")).collect();
        assert!(!shares_group(&a, &b));
    }
}

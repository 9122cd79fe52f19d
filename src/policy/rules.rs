//! The configured policy (contract §7.1–7.2): `[[policy.rules]]` binding
//! principals to hosts with a role, a session visibility and a rule for
//! sessions created outside the relay. Default deny: a principal no rule
//! matches sees no host at all.
//!
//! On each host, a principal holds the union of every rule that matches it
//! there: all their permissions, the widest visibility, external sessions if
//! any rule shows them, disposing others' sessions if any rule is `admin`,
//! files in sessions' working directories if any rule is `files =
//! "session-dirs"` (a rule granting `files:*` on the whole host wins).
//! Worked examples: `config/policy.example.toml`.

use std::ops::Range;
use std::sync::Arc;

use serde::Deserialize;
use toml::Spanned;

use super::{Grant, HostRef, PermSet, Permission, Policy, Role, Subject, Visibility, audit};

/// `[policy]`: the rules, in order (the first matching rule names audit lines).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// The rules; none means nobody sees anything.
    #[serde(default)]
    pub rules: Vec<Spanned<RuleConfig>>,
    /// The most bytes of one value in an audit line (default
    /// [`audit::DEFAULT_MAX_VALUE_BYTES`], within [`audit::VALUE_BYTES_RANGE`]).
    pub audit_max_value_bytes: Option<Spanned<usize>>,
}

/// One `[[policy.rules]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    /// Name for audit lines and errors; default `rule-<n>` (1-based).
    pub name: Option<String>,
    /// Only tokens of this issuer match, and the rule's `groups` are this
    /// issuer's groups. Required when more than one issuer is configured;
    /// with a single issuer, absent means that issuer.
    pub issuer: Option<Spanned<String>>,
    /// Subjects (`sub`) that match; `"*"` matches every subject.
    #[serde(default)]
    pub subjects: Vec<String>,
    /// Groups that match (any one of them in the token's groups claim).
    #[serde(default)]
    pub groups: Vec<String>,
    /// Host ids or labels the rule applies to; `"*"` is every host.
    pub hosts: Spanned<Vec<String>>,
    /// `viewer`, `operator` or `admin`.
    pub role: RoleName,
    /// Extra permissions on top of the role (e.g. `files:write` for an operator).
    #[serde(default)]
    pub permissions: Vec<PermissionName>,
    /// Which relay-created sessions are visible: `own` (default), `group`, `all`.
    #[serde(default = "default_visibility")]
    pub visibility: VisibilityName,
    /// Whether sessions created outside the relay (seeded on the host,
    /// automation runs, `moveChat` into a new session) are visible.
    /// Default: true for `visibility = "all"`, false otherwise.
    pub external_sessions: Option<bool>,
    /// Where the rule's file permissions apply: `host` (default: its
    /// `files:*` on the whole host) or `session-dirs` (no `files:*` on the
    /// host; `files:read` inside the working directories of the sessions
    /// the principal can see there, `files:write` inside those of the
    /// sessions it may operate). Only `viewer` and `operator` rules without
    /// extra `files:*` permissions may be scoped.
    pub files: Option<Spanned<FilesName>>,
}

/// A file scope as spelled in the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FilesName {
    /// `host`: the rule's `files:*` on the whole host.
    Host,
    /// `session-dirs`: files inside sessions' working directories only.
    SessionDirs,
}

/// A role as spelled in the config.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RoleName {
    /// `viewer`
    Viewer,
    /// `operator`
    Operator,
    /// `admin`
    Admin,
}

/// A permission as spelled in the config.
#[derive(Debug, Clone, Copy, Deserialize)]
pub enum PermissionName {
    /// `sessions:read`
    #[serde(rename = "sessions:read")]
    SessionsRead,
    /// `sessions:operate`
    #[serde(rename = "sessions:operate")]
    SessionsOperate,
    /// `terminals:use`
    #[serde(rename = "terminals:use")]
    TerminalsUse,
    /// `files:read`
    #[serde(rename = "files:read")]
    FilesRead,
    /// `files:write`
    #[serde(rename = "files:write")]
    FilesWrite,
}

/// A visibility as spelled in the config.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VisibilityName {
    /// `own`
    Own,
    /// `group`
    Group,
    /// `all`
    All,
}

fn default_visibility() -> VisibilityName {
    VisibilityName::Own
}

/// A rule error with the byte range of the offending value in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleError {
    /// Where in the config text.
    pub span: Range<usize>,
    /// What is wrong.
    pub message: String,
}

impl PolicyConfig {
    /// Checks every rule against the configured hosts (`(id, label)`
    /// pairs): hosts must exist, a rule must match someone.
    pub fn validate(&self, hosts: &[(&str, Option<&str>)]) -> Result<(), RuleError> {
        if let Some(max) = &self.audit_max_value_bytes
            && !audit::VALUE_BYTES_RANGE.contains(max.get_ref())
        {
            return Err(RuleError {
                span: max.span(),
                message: format!(
                    "policy.audit_max_value_bytes must be {} to {}",
                    audit::VALUE_BYTES_RANGE.start(),
                    audit::VALUE_BYTES_RANGE.end()
                ),
            });
        }
        for (i, rule) in self.rules.iter().enumerate() {
            let span = rule.span();
            let r = rule.get_ref();
            let name = rule_name(i, r);
            if r.subjects.is_empty() && r.groups.is_empty() {
                return Err(RuleError {
                    span,
                    message: format!(
                        "policy rule {name}: give subjects or groups (or subjects = [\"*\"])"
                    ),
                });
            }
            if r.hosts.get_ref().is_empty() {
                return Err(RuleError {
                    span: r.hosts.span(),
                    message: format!("policy rule {name}: hosts is empty"),
                });
            }
            check_files_scope(&name, r)?;
            for h in r.hosts.get_ref() {
                let known = h == "*"
                    || hosts
                        .iter()
                        .any(|(id, label)| id == h || *label == Some(h.as_str()));
                if !known {
                    return Err(RuleError {
                        span: r.hosts.span(),
                        message: format!(
                            "policy rule {name}: {h:?} is neither a host id nor a host label"
                        ),
                    });
                }
            }
        }
        Ok(())
    }
}

impl PolicyConfig {
    /// The configured bound of audit values, or its default.
    pub fn audit_max_value_bytes(&self) -> usize {
        self.audit_max_value_bytes
            .as_ref()
            .map_or(audit::DEFAULT_MAX_VALUE_BYTES, |m| *m.get_ref())
    }

    /// Checks every rule against the configured issuers (their `iss`
    /// values): a named issuer must be one of them, and with more than one
    /// a rule must name its issuer — a group or subject claim means nothing
    /// without the issuer that asserted it, and two identity providers may
    /// both call a group `platform`.
    pub fn validate_issuers(&self, issuers: &[&str]) -> Result<(), RuleError> {
        for (i, rule) in self.rules.iter().enumerate() {
            let r = rule.get_ref();
            match &r.issuer {
                Some(iss) if !issuers.contains(&iss.get_ref().as_str()) => {
                    return Err(RuleError {
                        span: iss.span(),
                        message: format!(
                            "policy rule {}: issuer {:?} is not a configured [[auth.issuers]] issuer",
                            rule_name(i, r),
                            iss.get_ref()
                        ),
                    });
                }
                None if issuers.len() > 1 => {
                    return Err(RuleError {
                        span: rule.span(),
                        message: format!(
                            "policy rule {}: more than one issuer is configured, so the rule \
                             must name one with `issuer = …` (one of {issuers:?})",
                            rule_name(i, r)
                        ),
                    });
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// A `session-dirs` rule must not also grant files on the whole host: an
/// `admin` role or an extra `files:*` permission would contradict it.
fn check_files_scope(name: &str, r: &RuleConfig) -> Result<(), RuleError> {
    let Some(files) = &r.files else {
        return Ok(());
    };
    if *files.get_ref() != FilesName::SessionDirs {
        return Ok(());
    }
    let host_files = matches!(r.role, RoleName::Admin)
        || r.permissions
            .iter()
            .any(|p| matches!(p, PermissionName::FilesRead | PermissionName::FilesWrite));
    if !host_files {
        return Ok(());
    }
    Err(RuleError {
        span: files.span(),
        message: format!(
            "policy rule {name}: files = \"session-dirs\" limits files to sessions' working \
             directories, but the rule's admin role or files:* permission grants them on the \
             whole host: drop one"
        ),
    })
}

fn rule_name(i: usize, r: &RuleConfig) -> String {
    r.name.clone().unwrap_or_else(|| format!("rule-{}", i + 1))
}

/// One compiled rule.
#[derive(Debug, Clone)]
struct Rule {
    name: Arc<str>,
    issuer: Option<String>,
    subjects: Vec<String>,
    groups: Vec<String>,
    hosts: Vec<String>,
    permissions: PermSet,
    visibility: Visibility,
    external: bool,
    role: Role,
    session_files: bool,
}

impl Rule {
    /// A rule without an issuer passed [`PolicyConfig::validate_issuers`]
    /// only with a single issuer configured, whose tokens are the only ones
    /// the edge accepts: it matches that issuer's principals.
    fn matches(&self, who: Subject<'_>, host: HostRef<'_>) -> bool {
        let issuer = self
            .issuer
            .as_deref()
            .is_none_or(|i| i == who.principal.issuer);
        let subject = self
            .subjects
            .iter()
            .any(|s| s == "*" || *s == who.principal.subject);
        let group = super::shares_group(&self.groups, who.groups);
        let on_host = self
            .hosts
            .iter()
            .any(|h| h == "*" || h == host.id || Some(h.as_str()) == host.label);
        issuer && (subject || group) && on_host
    }
}

/// The policy of `[[policy.rules]]`.
#[derive(Debug, Clone)]
pub struct RulePolicy {
    rules: Vec<Rule>,
}

impl RulePolicy {
    /// Compiles a validated `[policy]` section, and applies its audit value
    /// bound to the (process-wide) audit trail — at start and on every
    /// reload, since both build the policy here.
    pub fn new(cfg: &PolicyConfig) -> Self {
        audit::set_max_value_bytes(cfg.audit_max_value_bytes());
        let rules = cfg
            .rules
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let r = r.get_ref();
                let role = match r.role {
                    RoleName::Viewer => Role::Viewer,
                    RoleName::Operator => Role::Operator,
                    RoleName::Admin => Role::Admin,
                };
                let extra: Vec<Permission> = r.permissions.iter().map(|p| p.permission()).collect();
                let visibility = match r.visibility {
                    VisibilityName::Own => Visibility::Own,
                    VisibilityName::Group => Visibility::Group,
                    VisibilityName::All => Visibility::All,
                };
                let session_files = r
                    .files
                    .as_ref()
                    .is_some_and(|f| *f.get_ref() == FilesName::SessionDirs);
                let mut permissions = role.permissions().union(PermSet::of(&extra));
                if session_files {
                    permissions =
                        permissions.without(&[Permission::FilesRead, Permission::FilesWrite]);
                }
                Rule {
                    name: rule_name(i, r).into(),
                    issuer: r.issuer.as_ref().map(|i| i.get_ref().clone()),
                    subjects: r.subjects.clone(),
                    groups: sorted(&r.groups),
                    hosts: r.hosts.get_ref().clone(),
                    permissions,
                    visibility,
                    external: r.external_sessions.unwrap_or(visibility == Visibility::All),
                    role,
                    session_files,
                }
            })
            .collect();
        Self { rules }
    }
}

/// One rule that matches a principal on a host: why it matches and what it
/// adds to the grant (rules add up, see [`Policy::grant`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleMatch {
    /// The rule's name.
    pub rule: Arc<str>,
    /// What in the token matched: `subject alice`, `subject *` or `group g`.
    pub by: String,
    /// What of the host matched: `id h`, `label l` or `*`.
    pub on: String,
    /// The rule's role.
    pub role: Role,
    /// The permissions it grants (its role's and its extra ones).
    pub permissions: PermSet,
    /// The visibility it grants.
    pub visibility: Visibility,
    /// Whether it shows sessions created outside the relay.
    pub external: bool,
    /// Whether it scopes files to sessions' working directories.
    pub session_files: bool,
}

impl Rule {
    /// Why this rule matches `who` on `host`, if it does.
    fn explain(&self, who: Subject<'_>, host: HostRef<'_>) -> Option<RuleMatch> {
        if !self.matches(who, host) {
            return None;
        }
        let subject = self
            .subjects
            .iter()
            .find(|s| *s == "*" || **s == who.principal.subject)
            .map(|s| format!("subject {s}"));
        let group = || {
            let g = self.groups.iter().find(|g| who.groups.contains(g))?;
            Some(format!("group {g}"))
        };
        let on = self.hosts.iter().find_map(|h| match h.as_str() {
            "*" => Some("*".to_string()),
            h if h == host.id => Some(format!("id {h}")),
            h if Some(h) == host.label => Some(format!("label {h}")),
            _ => None,
        })?;
        Some(RuleMatch {
            rule: self.name.clone(),
            by: subject.or_else(group)?,
            on,
            role: self.role,
            permissions: self.permissions,
            visibility: self.visibility,
            external: self.external,
            session_files: self.session_files,
        })
    }
}

impl RulePolicy {
    /// Every rule that matches `who` on `host`, in configuration order: the
    /// grant on that host is their union ([`Policy::grant`]).
    pub fn explain(&self, who: Subject<'_>, host: HostRef<'_>) -> Vec<RuleMatch> {
        self.rules
            .iter()
            .filter_map(|r| r.explain(who, host))
            .collect()
    }
}

/// `groups` sorted and without repeats (what [`super::shares_group`] merges).
fn sorted(groups: &[String]) -> Vec<String> {
    let mut g = groups.to_vec();
    g.sort();
    g.dedup();
    g
}

impl PermissionName {
    fn permission(self) -> Permission {
        match self {
            Self::SessionsRead => Permission::SessionsRead,
            Self::SessionsOperate => Permission::SessionsOperate,
            Self::TerminalsUse => Permission::TerminalsUse,
            Self::FilesRead => Permission::FilesRead,
            Self::FilesWrite => Permission::FilesWrite,
        }
    }
}

impl Policy for RulePolicy {
    fn grant(&self, who: Subject<'_>, host: HostRef<'_>) -> Option<Grant> {
        let mut matching = self.rules.iter().filter(|r| r.matches(who, host));
        let first = matching.next()?;
        let mut g = Grant {
            permissions: first.permissions,
            visibility: first.visibility,
            external: first.external,
            dispose_others: first.role == Role::Admin,
            session_files: first.session_files,
            rule: first.name.clone(),
        };
        for r in matching {
            g.permissions = g.permissions.union(r.permissions);
            g.visibility = g.visibility.max(r.visibility);
            g.external |= r.external;
            g.dispose_others |= r.role == Role::Admin;
            g.session_files |= r.session_files;
        }
        Some(g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::PrincipalKey;
    use crate::names::store::Owner;

    fn policy(toml_text: &str) -> RulePolicy {
        #[derive(Deserialize)]
        struct Doc {
            policy: PolicyConfig,
        }
        let doc: Doc = toml::from_str(toml_text).unwrap();
        doc.policy
            .validate(&[("gpu1", Some("gpu")), ("laptop", None)])
            .unwrap();
        RulePolicy::new(&doc.policy)
    }

    fn key(sub: &str) -> PrincipalKey {
        PrincipalKey {
            issuer: "idp".into(),
            subject: sub.into(),
        }
    }

    const HOST: HostRef<'static> = HostRef {
        id: "gpu1",
        label: Some("gpu"),
    };
    const LAPTOP: HostRef<'static> = HostRef {
        id: "laptop",
        label: None,
    };

    #[test]
    fn default_deny_and_union_of_rules() {
        let p = policy(
            r#"
[[policy.rules]]
subjects = ["alice"]
hosts = ["gpu"]
role = "viewer"
[[policy.rules]]
name = "team"
groups = ["team-a"]
hosts = ["*"]
role = "operator"
visibility = "group"
"#,
        );
        let (alice, bob) = (key("alice"), key("bob"));
        let none: Vec<String> = vec![];
        let team = vec!["team-a".to_string()];
        let a = Subject {
            principal: &alice,
            groups: &none,
        };
        assert!(p.grant(a, LAPTOP).is_none(), "no rule for alice on laptop");
        let g = p.grant(a, HOST).unwrap();
        assert!(g.permits(Permission::SessionsRead) && !g.permits(Permission::SessionsOperate));
        assert_eq!(&*g.rule, "rule-1");
        let a_team = Subject {
            principal: &alice,
            groups: &team,
        };
        let g = p.grant(a_team, HOST).unwrap();
        assert!(g.permits(Permission::SessionsOperate));
        assert_eq!(g.visibility, Visibility::Group);
        assert!(!g.external);
        assert!(
            p.grant(
                Subject {
                    principal: &bob,
                    groups: &none
                },
                HOST
            )
            .is_none()
        );
    }

    #[test]
    fn visibility_own_group_all_and_external() {
        let p = policy(
            r#"
[[policy.rules]]
subjects = ["*"]
hosts = ["*"]
role = "operator"
visibility = "group"
external_sessions = true
"#,
        );
        let (alice, bob) = (key("alice"), key("bob"));
        let g1 = vec!["g1".to_string()];
        let b = Subject {
            principal: &bob,
            groups: &g1,
        };
        let g = p.grant(b, HOST).unwrap();
        let owner = |sub: &str, groups: &[&str]| Owner {
            issuer: "idp".into(),
            subject: sub.into(),
            groups: groups.iter().map(|s| s.to_string()).collect(),
        };
        assert!(g.sees(b, Some(&owner("bob", &[]))), "own");
        assert!(g.sees(b, Some(&owner("alice", &["g1"]))), "shared group");
        assert!(!g.sees(b, Some(&owner("alice", &["g2"]))), "other group");
        assert!(g.sees(b, None), "external shown by the rule");
        assert!(!g.sees_everything(), "group visibility needs the owner");
        let _ = alice;
    }

    #[test]
    fn the_open_dev_policy_sees_everything_of_the_dev_issuer_only() {
        let p = policy(crate::devkit::OPEN_POLICY);
        let dev = PrincipalKey {
            issuer: crate::devkit::DEV_ISSUER.into(),
            subject: "anyone".into(),
        };
        let who = |principal| Subject {
            principal,
            groups: &[],
        };
        let g = p.grant(who(&dev), LAPTOP).unwrap();
        assert!(g.sees_everything() && g.dispose_others);
        assert!(p.grant(who(&key("anyone")), LAPTOP).is_none());
    }

    #[test]
    fn rules_name_their_issuer_when_several_are_configured() {
        #[derive(Debug, Deserialize)]
        struct Doc {
            policy: PolicyConfig,
        }
        let text = "[[policy.rules]]\nissuer = \"a\"\ngroups = [\"platform\"]\nhosts = [\"*\"]\n\
                    role = \"admin\"\n\n[[policy.rules]]\ngroups = [\"platform\"]\nhosts = [\"*\"]\n\
                    role = \"viewer\"\n";
        let doc: Doc = toml::from_str(text).unwrap();
        assert_eq!(doc.policy.validate_issuers(&["a"]), Ok(()), "one issuer");
        let e = doc.policy.validate_issuers(&["a", "b"]).unwrap_err();
        assert!(
            e.message.contains("rule-2") && e.message.contains("issuer"),
            "{e:?}"
        );
        let line = text[..e.span.start].matches('\n').count() + 1;
        assert!((7..=10).contains(&line), "the second rule, not line {line}");
        let e = doc.policy.validate_issuers(&["b"]).unwrap_err();
        assert_eq!(&text[e.span.clone()], "\"a\"", "{e:?}");
    }

    #[test]
    fn a_group_of_one_issuer_is_not_the_same_group_of_another() {
        let p = policy(
            r#"
[[policy.rules]]
issuer = "idp"
groups = ["platform"]
hosts = ["*"]
role = "admin"
visibility = "group"
external_sessions = false
[[policy.rules]]
issuer = "other"
subjects = ["*"]
hosts = ["*"]
role = "viewer"
visibility = "group"
"#,
        );
        let platform = vec!["platform".to_string()];
        let (a, b) = (
            key("ann"),
            PrincipalKey {
                issuer: "other".into(),
                subject: "ben".into(),
            },
        );
        let ann = Subject {
            principal: &a,
            groups: &platform,
        };
        let ben = Subject {
            principal: &b,
            groups: &platform,
        };
        let g = p.grant(ben, HOST).unwrap();
        assert!(!g.dispose_others && !g.permits(Permission::SessionsOperate));
        assert!(p.grant(ann, HOST).unwrap().dispose_others);
        let anns = Owner {
            issuer: "idp".into(),
            subject: "ann".into(),
            groups: platform.clone(),
        };
        assert!(!g.sees(ben, Some(&anns)), "another issuer's platform group");
    }

    #[test]
    fn session_dirs_scope_files_and_a_host_wide_rule_wins() {
        let p = policy(
            r#"
[[policy.rules]]
subjects = ["ann"]
hosts = ["*"]
role = "operator"
files = "session-dirs"
[[policy.rules]]
name = "ci-files"
subjects = ["ann"]
hosts = ["laptop"]
role = "viewer"
permissions = ["files:read"]
"#,
        );
        let a = key("ann");
        let ann = Subject {
            principal: &a,
            groups: &[],
        };
        let g = p.grant(ann, HOST).unwrap();
        assert!(g.session_files && g.permits(Permission::SessionsOperate));
        assert!(!g.permits(Permission::FilesRead) && !g.permits(Permission::FilesWrite));
        assert!(g.touches_files(Permission::FilesWrite));
        let g = p.grant(ann, LAPTOP).unwrap();
        assert!(
            g.session_files && g.permits(Permission::FilesRead),
            "rules add up"
        );
        assert!(!g.permits(Permission::FilesWrite));
        assert!(p.explain(ann, HOST)[0].session_files);
    }

    #[test]
    fn session_dirs_contradicting_host_files_is_an_error_with_its_span() {
        #[derive(Debug, Deserialize)]
        struct Doc {
            policy: PolicyConfig,
        }
        for extra in [
            "role = \"admin\"",
            "role = \"operator\"\npermissions = [\"files:write\"]",
        ] {
            let text = format!(
                "[[policy.rules]]\nsubjects = [\"a\"]\nhosts = [\"*\"]\n{extra}\nfiles = \"session-dirs\"\n"
            );
            let doc: Doc = toml::from_str(&text).unwrap();
            let e = doc.policy.validate(&[]).unwrap_err();
            assert_eq!(&text[e.span.clone()], "\"session-dirs\"", "{e:?}");
        }
        let text = "[[policy.rules]]\nsubjects = [\"a\"]\nhosts = [\"*\"]\nrole = \"admin\"\nfiles = \"host\"\n";
        let doc: Doc = toml::from_str(text).unwrap();
        assert_eq!(doc.policy.validate(&[]), Ok(()));
        let bad: Result<Doc, _> = toml::from_str(
            "[[policy.rules]]\nsubjects = [\"a\"]\nhosts = [\"*\"]\nrole = \"viewer\"\nfiles = \"home\"\n",
        );
        assert!(bad.is_err());
    }

    #[test]
    fn unknown_hosts_empty_principals_and_bad_bounds_are_errors_with_spans() {
        #[derive(Debug, Deserialize)]
        struct Doc {
            policy: PolicyConfig,
        }
        let text = "[[policy.rules]]\nsubjects = [\"a\"]\nhosts = [\"nope\"]\nrole = \"viewer\"\n";
        let doc: Doc = toml::from_str(text).unwrap();
        let e = doc.policy.validate(&[("gpu1", None)]).unwrap_err();
        assert!(e.message.contains("nope"));
        assert_eq!(&text[e.span.clone()], "[\"nope\"]");
        let text = "[[policy.rules]]\nhosts = [\"*\"]\nrole = \"viewer\"\n";
        let doc: Doc = toml::from_str(text).unwrap();
        assert!(doc.policy.validate(&[]).is_err());
        let text = "[policy]\naudit_max_value_bytes = 8\n";
        let doc: Doc = toml::from_str(text).unwrap();
        let e = doc.policy.validate(&[]).unwrap_err();
        assert_eq!(&text[e.span.clone()], "8", "{e:?}");
        let doc: Doc = toml::from_str("[policy]\naudit_max_value_bytes = 64\n").unwrap();
        assert_eq!(doc.policy.audit_max_value_bytes(), 64);
        let bad: Result<Doc, _> =
            toml::from_str("[[policy.rules]]\nhosts = [\"*\"]\nrole = \"root\"\n");
        assert!(bad.unwrap_err().to_string().contains("line 3"));
    }
}

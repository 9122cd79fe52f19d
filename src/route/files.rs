//! Files scoped by working directory (contract §7.1): a rule with
//! `files = "session-dirs"` grants `files:read` inside the working
//! directories of the sessions the principal can see on a host and
//! `files:write` inside those of the sessions it may operate — and nothing
//! outside them. The decision has two halves, both here:
//!
//! 1. **Lexical, in the plan** ([`scope`]): every path the command names
//!    (a copy's source is read, its destination written; a move writes
//!    both) is percent-decoded, its `.` and `..` segments applied, and
//!    must lie inside — by whole segments, so `/tmp/proj` does not cover
//!    `/tmp/project2` — a working directory that grants what it needs.
//!    Sessions are those of the host's catalog mirror (host-form
//!    `SessionSummary.workingDirectories`), visibility decided by
//!    `policy::Access::sees_channel`, the same decision as a `subscribe`.
//!    A refusal is -32009 (the caller sees the host), audited.
//! 2. **Canonical, on the host, before forwarding** ([`Inside`], executed
//!    by the session): the path is resolved on the host with
//!    `resourceResolve {followSymlinks: true}` (a path that does not exist
//!    yet: its nearest existing ancestor, after checking with
//!    `followSymlinks: false` that no dangling link stands in its place),
//!    each granting directory too, and the canonical path must lie inside
//!    one of them ([`confirmed`]). So `..` after a symlink or a link inside
//!    the directory pointing out of it are judged on what the host will
//!    really touch. A working directory grants only where the host's
//!    canonical form of it is the form it lists ([`is_canonical`]): a
//!    directory that is, or lies under, a symlink grants nothing, so a
//!    session pointed at a link into another tenant's directory gains no
//!    access there (a workspace under a symlinked path, such as macOS's
//!    `/tmp`, must be listed by its real path). The directories compared
//!    are those that contain the path lexically: a link from one working
//!    directory into another is refused even when both are in scope (fail
//!    closed). The final decision is audited ([`decided`]).
//! 3. **Claiming a directory** ([`may_claim`]): a principal whose files
//!    come from the scope alone may not name, as a working directory of a
//!    session it creates or changes, a directory that contains or lies
//!    inside a working directory of a session it cannot operate on that
//!    host (-32009): the scope follows the principal's sessions, and a new
//!    session must not make another tenant's directory one of them.
//!
//! What remains is the host's own race: a link made or swapped between
//! the resolve and the command (by the host's user, or an agent someone
//! drives there). The host acts with its OS privileges anyway (README
//! "Isolation boundary"); the scope keeps the relay's users from naming
//! paths outside their sessions, not the agents they drive.

use serde_json::Value;

use super::{Caller, Env};
use crate::names::namer;
use crate::policy::audit::{self, Decision};
use crate::policy::{Grant, Permission};
use crate::rpc::RpcError;
use crate::upstream::hub::HostHub;

/// The audit rule of a decision by the session-directory scope.
pub const SCOPE_RULE: &str = "files-in-session-dirs";

/// A path that only the session-directory scope allows: before the
/// request is forwarded, its canonical form on the host must lie inside
/// the canonical form of one of `dirs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inside {
    /// The path as the client named it (audit lines).
    pub client_uri: String,
    /// The path, host form (`file:///…`), as the host will read it.
    pub host_uri: String,
    /// Working directories (host form) that contain the path lexically
    /// and grant what it needs.
    pub dirs: Vec<String>,
    /// What the path needs.
    pub need: Permission,
}

/// Decides a file command of `method` that the grant allows only through
/// its session-directory scope (`grant.session_files`): each path it names
/// needs its permission on the whole host or a granting working directory
/// that contains it lexically. The paths left to confirm on the host, or
/// -32009 (audited) when one lies outside every granting directory.
pub fn scope(
    env: &Env,
    caller: Caller<'_>,
    (hub, grant): (&HostHub, &Grant),
    method: &str,
    params: &Value,
    row_need: Permission,
) -> Result<Vec<Inside>, RpcError> {
    let mut inside = Vec::new();
    for (client_uri, need) in paths(method, params, row_need) {
        if grant.permits(need) {
            continue;
        }
        let refuse = || {
            decided(env, caller, hub, (method, &client_uri), false);
            RpcError::permission_denied(method)
        };
        let host_uri = namer::to_host_uri(env.store.as_ref(), &hub.id, &client_uri)
            .map_err(|e| RpcError::invalid_params(e.to_string()))?;
        let path = normalized(&host_uri).ok_or_else(refuse)?;
        let dirs = granting_dirs(env, caller, (hub, grant), &path, need);
        if dirs.is_empty() {
            return Err(refuse());
        }
        inside.push(Inside {
            client_uri,
            host_uri,
            dirs,
            need,
        });
    }
    Ok(inside)
}

/// The paths a resource command names, client form, with what each needs:
/// a copy reads its source and writes its destination, a move writes both,
/// any other command needs its row's permission on `uri`.
fn paths(method: &str, params: &Value, row_need: Permission) -> Vec<(String, Permission)> {
    let get = |k: &str| params.get(k).and_then(Value::as_str).map(str::to_string);
    let source_need = match method {
        "resourceCopy" => Some(Permission::FilesRead),
        "resourceMove" => Some(Permission::FilesWrite),
        _ => None,
    };
    match source_need {
        Some(s) => [
            (get("source"), s),
            (get("destination"), Permission::FilesWrite),
        ]
        .into_iter()
        .filter_map(|(u, n)| Some((u?, n)))
        .collect(),
        None => get("uri").map(|u| vec![(u, row_need)]).unwrap_or_default(),
    }
}

/// The working directories (host form) of `hub`'s catalog that contain
/// `path` lexically and in which the grant's scope gives `need`: those of
/// sessions the caller sees (`files:read`) or may operate (`files:write`).
/// Only sessions with a containing directory are asked about.
fn granting_dirs(
    env: &Env,
    caller: Caller<'_>,
    (hub, grant): (&HostHub, &Grant),
    path: &[Vec<u8>],
    need: Permission,
) -> Vec<String> {
    let via = match need {
        Permission::FilesWrite => Permission::SessionsOperate,
        _ => Permission::SessionsRead,
    };
    if !grant.session_files || !grant.permits(via) {
        return Vec::new();
    }
    let candidates: Vec<(String, Vec<String>)> = hub.read(|v| {
        v.catalog
            .iter()
            .filter_map(|(session, summary)| {
                let dirs: Vec<String> = working_dirs(summary)
                    .filter(|d| normalized(d).is_some_and(|d| path.starts_with(&d)))
                    .map(str::to_string)
                    .collect();
                (!dirs.is_empty()).then(|| (session.clone(), dirs))
            })
            .collect()
    });
    let mut dirs: Vec<String> = candidates
        .into_iter()
        .filter(|(session, _)| env.access.sees_channel(caller.who, grant, hub, session))
        .flat_map(|(_, dirs)| dirs)
        .collect();
    dirs.sort();
    dirs.dedup();
    dirs
}

/// The working-directory fields a request claims for a session: those of
/// a new session, and those a session is set to (`(shape, field)` of the
/// rewrite table). A chat's directories must be its session's (the host
/// checks), and removing a directory claims nothing.
const CLAIMS: &[(&str, &str)] = &[
    ("params:createSession", "workingDirectories[]"),
    ("session/workingDirectorySet", "directory"),
    ("session/workingDirectoryReplaced", "replacement"),
];

/// Whether field `path` of rewrite-table row `shape` claims a working
/// directory ([`CLAIMS`]).
pub fn claims_directory(shape: &str, path: &str) -> bool {
    CLAIMS.iter().any(|(s, p)| *s == shape && *p == path)
}

/// Whether the caller may claim `dir` (host form) as a working directory
/// on `hub`: always with `files:write` on the whole host or without a
/// session-directory scope (a claim then grants no files); with the scope
/// alone, only a directory that neither contains nor lies inside a working
/// directory of a session the caller cannot operate there, compared
/// lexically by whole segments.
pub fn may_claim(
    env: &Env,
    caller: Caller<'_>,
    (hub, grant): (&HostHub, &Grant),
    dir: &str,
) -> bool {
    if !grant.session_files || grant.permits(Permission::FilesWrite) {
        return true;
    }
    let Some(dir) = normalized(dir) else {
        return false;
    };
    let overlapping: Vec<String> = hub.read(|v| {
        v.catalog
            .iter()
            .filter(|(_, summary)| {
                working_dirs(summary)
                    .filter_map(normalized)
                    .any(|w| w.starts_with(&dir) || dir.starts_with(&w))
            })
            .map(|(session, _)| session.clone())
            .collect()
    });
    let operates = grant.permits(Permission::SessionsOperate);
    overlapping
        .iter()
        .all(|s| operates && env.access.sees_channel(caller.who, grant, hub, s))
}

/// A session summary's working directories.
fn working_dirs(summary: &Value) -> impl Iterator<Item = &str> {
    summary
        .get("workingDirectories")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

/// The decoded path segments of a host-form `file:` URI (`file:///p` or
/// `file://localhost/p`), empty segments dropped, `.` and `..` kept as
/// they are; `None` for anything else: another scheme or authority, a
/// query or fragment, malformed percent-encoding, a NUL byte.
pub fn raw_segments(uri: &str) -> Option<Vec<Vec<u8>>> {
    let scheme = uri.get(..7)?;
    if !scheme.eq_ignore_ascii_case("file://") {
        return None;
    }
    let rest = uri.get(7..)?;
    let slash = rest.find('/')?;
    let (authority, path) = rest.split_at(slash);
    if !(authority.is_empty() || authority.eq_ignore_ascii_case("localhost")) {
        return None;
    }
    if path.contains(['?', '#']) {
        return None;
    }
    let decoded = percent_decode(path)?;
    if decoded.contains(&0) {
        return None;
    }
    Some(
        decoded
            .split(|b| *b == b'/')
            .filter(|s| !s.is_empty())
            .map(<[u8]>::to_vec)
            .collect(),
    )
}

/// [`raw_segments`] with `.` dropped and `..` applied lexically; `None`
/// also for a `..` above the root.
pub fn normalized(uri: &str) -> Option<Vec<Vec<u8>>> {
    let mut out: Vec<Vec<u8>> = Vec::new();
    for seg in raw_segments(uri)? {
        match seg.as_slice() {
            b"." => {}
            b".." => {
                out.pop()?;
            }
            _ => out.push(seg),
        }
    }
    Some(out)
}

/// The host-form URI of `uri`'s parent directory (decoded segments,
/// re-encoded; not normalized, so the host reads `..` as it would in the
/// command); `None` at the root or when the last segment is `.` or `..`
/// (its parent is not a prefix of it).
pub fn parent(uri: &str) -> Option<String> {
    let mut segs = raw_segments(uri)?;
    let last = segs.pop()?;
    if last == b"." || last == b".." {
        return None;
    }
    Some(file_uri(&segs))
}

/// `file://` + the percent-encoded absolute path of `segments`.
fn file_uri(segments: &[Vec<u8>]) -> String {
    let mut out = String::from("file://");
    if segments.is_empty() {
        out.push('/');
    }
    for seg in segments {
        out.push('/');
        for &b in seg {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                out.push(char::from(b));
            } else {
                out.push_str(&format!("%{b:02X}"));
            }
        }
    }
    out
}

fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b);
            i += 1;
        }
    }
    Some(out)
}

/// Whether `canonical`, the host's canonical form of the working directory
/// `listed`, names the same path: a working directory grants files only
/// where it is itself canonical, so a directory that is (or lies under) a
/// symlink grants nothing — else a session pointed at a link into another
/// tenant's directory would reach that directory.
pub fn is_canonical(listed: &str, canonical: &str) -> bool {
    normalized(listed).is_some_and(|l| normalized(canonical).is_some_and(|c| c == l))
}

/// Whether the host's canonical form of a path (`resourceResolve` with
/// `followSymlinks: true`) lies inside one of the canonical forms of its
/// granting working directories, by whole segments.
pub fn confirmed(canonical: &str, canonical_dirs: &[String]) -> bool {
    let Some(path) = normalized(canonical) else {
        return false;
    };
    canonical_dirs
        .iter()
        .filter_map(|d| normalized(d))
        .any(|d| path.starts_with(&d))
}

/// Records the decision on `uri` (client form) of `method` by the
/// session-directory scope: the ACL metric and an audit line (§7.5).
pub fn decided(
    env: &Env,
    caller: Caller<'_>,
    hub: &HostHub,
    (method, uri): (&str, &str),
    allowed: bool,
) {
    let decision = if allowed {
        Decision::Allow
    } else {
        Decision::Deny
    };
    env.metrics
        .acl_decisions
        .with_label_values(&[decision.label()])
        .inc();
    audit::record(audit::Record {
        who: caller.who,
        host: &hub.id,
        channel: uri,
        operation: method,
        decision,
        rule: SCOPE_RULE,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segs(uri: &str) -> Option<Vec<String>> {
        normalized(uri).map(|v| {
            v.into_iter()
                .map(|s| String::from_utf8(s).unwrap())
                .collect()
        })
    }

    #[test]
    fn paths_are_decoded_and_normalized_lexically() {
        assert_eq!(
            segs("file:///tmp/proj/a.txt").unwrap(),
            ["tmp", "proj", "a.txt"]
        );
        assert_eq!(
            segs("file:///tmp/proj/./x/../a").unwrap(),
            ["tmp", "proj", "a"]
        );
        assert_eq!(segs("file://localhost/tmp//p%20q").unwrap(), ["tmp", "p q"]);
        // An encoded slash or dot segment is decoded before it is read.
        assert_eq!(segs("file:///tmp/proj/%2E%2E/x").unwrap(), ["tmp", "x"]);
        assert_eq!(segs("file:///tmp/a%2Fb").unwrap(), ["tmp", "a", "b"]);
        for bad in [
            "file:///..",
            "file://gpu1/tmp",
            "file:///tmp/a?x",
            "file:///tmp/a#x",
            "file:///tmp/%zz",
            "file:///tmp/%00",
            "http:///tmp",
        ] {
            assert_eq!(segs(bad), None, "{bad}");
        }
    }

    #[test]
    fn inside_means_by_whole_segments() {
        let dirs = vec!["file:///tmp/proj".to_string()];
        assert!(confirmed("file:///tmp/proj", &dirs));
        assert!(confirmed("file:///tmp/proj/a/b", &dirs));
        assert!(!confirmed("file:///tmp/project2/a", &dirs));
        assert!(!confirmed("file:///tmp/proj/../other", &dirs));
        assert!(!confirmed("file:///tmp", &dirs));
    }

    #[test]
    fn parents_keep_dot_segments_for_the_host_to_read() {
        assert_eq!(parent("file:///w/d/new.txt").unwrap(), "file:///w/d");
        assert_eq!(
            parent("file:///w/link/../new").unwrap(),
            "file:///w/link/.."
        );
        assert_eq!(parent("file:///w/a%2Fb").unwrap(), "file:///w/a");
        assert_eq!(parent("file:///w/p%20q/x").unwrap(), "file:///w/p%20q");
        assert_eq!(parent("file:///x").unwrap(), "file:///");
        assert_eq!(parent("file:///"), None);
        assert_eq!(parent("file:///w/.."), None);
    }

    #[test]
    fn a_copy_reads_its_source_and_a_move_writes_both() {
        let p = serde_json::json!({"source": "file://h/a", "destination": "file://h/b"});
        let need = |m| paths(m, &p, Permission::FilesWrite);
        assert_eq!(
            need("resourceCopy"),
            [
                ("file://h/a".to_string(), Permission::FilesRead),
                ("file://h/b".to_string(), Permission::FilesWrite)
            ]
        );
        assert!(
            need("resourceMove")
                .iter()
                .all(|(_, n)| *n == Permission::FilesWrite)
        );
        let w = serde_json::json!({"uri": "file://h/c"});
        assert_eq!(
            paths("resourceWrite", &w, Permission::FilesWrite),
            [("file://h/c".to_string(), Permission::FilesWrite)]
        );
    }
}

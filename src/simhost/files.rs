//! The host's files: a sandbox folder its `file:` URIs live in, the content
//! references of large tool output, and resource watches.
//!
//! Guarantees:
//! - a `file:` URI is mapped to a path by decoding it, normalizing `.` and
//!   `..` lexically, and requiring the result — and the canonical form of
//!   its longest existing ancestor, so a symlink cannot lead out — to lie
//!   inside the sandbox; anything else is refused with `PermissionDenied`
//!   (-32009), which the spec reserves for access the receiver will not
//!   grant (no `resourceRequest` can unlock it, so `data` carries none);
//! - content references (`ahp-content:/<id>`) are kept in memory, at most
//!   `content_refs_kept`, oldest forgotten first;
//! - a change made through `resourceWrite`/`Copy`/`Move`/`Delete`/`Mkdir`
//!   is reported as one `resourceWatch/changed` on every watch covering it;
//!   a watch is released when its last subscriber leaves (or, never
//!   subscribed, when its creator's connection closes).

use std::collections::{HashMap, VecDeque};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::json;

use super::config::SimHostConfig;
use super::core::{ConnId, HostCore};
use super::state::HostState;
use super::typed::typed_action;
use crate::rpc::RpcError;

/// Scheme of the host's content references.
pub const CONTENT_SCHEME: &str = "ahp-content:/";

/// What a message writes to make the agent run a tool whose output is
/// `<n>` bytes long: `[tool-output:<n>]`.
pub const OUTPUT_MARKER: &str = "[tool-output:";

/// The output size a message text asks for, if it carries [`OUTPUT_MARKER`].
pub fn requested_output(text: &str) -> Option<usize> {
    let start = text.find(OUTPUT_MARKER)? + OUTPUT_MARKER.len();
    let rest = text.get(start..)?;
    rest.get(..rest.find(']')?)?.parse().ok()
}

static NEXT_SANDBOX: AtomicU64 = AtomicU64::new(1);

/// A watch the host keeps besides its channel state.
#[derive(Debug, Clone)]
pub struct WatchMeta {
    /// The watched path.
    pub path: PathBuf,
    /// Whether descendants (not only direct children) are reported.
    pub recursive: bool,
    /// The connection that created it.
    pub creator: ConnId,
    /// Whether anyone subscribed to it yet.
    pub subscribed: bool,
}

/// The host's files.
#[derive(Debug)]
pub struct Files {
    /// Canonical path of the sandbox folder.
    pub root: PathBuf,
    /// Whether the host created the folder (and removes it when dropped).
    owned: bool,
    contents: VecDeque<(String, String)>,
    /// Open watches by channel URI.
    pub watches: HashMap<String, WatchMeta>,
    next_id: u64,
}

impl Files {
    /// Opens (or, without `cfg.sandbox`, creates a fresh temporary) sandbox.
    pub fn open(cfg: &SimHostConfig) -> std::io::Result<Self> {
        let (dir, owned) = match &cfg.sandbox {
            Some(dir) => (dir.clone(), false),
            None => {
                let n = NEXT_SANDBOX.fetch_add(1, Ordering::Relaxed);
                let name = format!("ahp-simhost-{}-{n}", std::process::id());
                (std::env::temp_dir().join(name), !cfg.keep_sandbox)
            }
        };
        std::fs::create_dir_all(&dir)?;
        Ok(Self {
            root: dir.canonicalize()?,
            owned,
            contents: VecDeque::new(),
            watches: HashMap::new(),
            next_id: 0,
        })
    }

    /// A host-unique id for content references and watches.
    pub fn fresh_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Gives every session without working directories its own folder
    /// `<sandbox>/<n>` (created), as a `file:` URI.
    pub fn seed_working_dirs(&self, state: &mut HostState) {
        for (n, entry) in state.sessions.values_mut().enumerate() {
            if entry.state.working_directories.is_some() {
                continue;
            }
            let dir = self.root.join(format!("workspace-{}", n + 1));
            if std::fs::create_dir_all(&dir).is_ok() {
                entry.state.working_directories = Some(vec![file_uri(&dir)]);
            }
        }
    }

    /// The sandbox path a `file:` URI names, or the error to answer with.
    pub fn path_of(&self, uri: &str) -> Result<PathBuf, RpcError> {
        let rest = uri
            .strip_prefix("file://")
            .ok_or_else(|| RpcError::invalid_params(format!("not a file: URI: {uri}")))?;
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        if !(authority.is_empty() || authority == "localhost") {
            return Err(RpcError::invalid_params(
                "file: URIs of this host have no authority",
            ));
        }
        let decoded = percent_decode(path)
            .ok_or_else(|| RpcError::invalid_params("malformed percent-encoding"))?;
        let mut out = PathBuf::from("/");
        for comp in Path::new(&decoded).components() {
            match comp {
                Component::Normal(c) => out.push(c),
                Component::ParentDir => {
                    out.pop();
                }
                _ => {}
            }
        }
        let mut probe = out.clone();
        while !probe.exists() && probe.pop() {}
        let canon = probe.canonicalize().unwrap_or(probe);
        if !out.starts_with(&self.root) || !canon.starts_with(&self.root) {
            return Err(outside(uri));
        }
        Ok(out)
    }

    /// Stores tool output as a content reference; returns its URI.
    pub fn put_content(&mut self, keep: usize, data: String) -> String {
        let uri = format!("{CONTENT_SCHEME}{}", self.fresh_id());
        self.contents.push_back((uri.clone(), data));
        while self.contents.len() > keep.max(1) {
            self.contents.pop_front();
        }
        uri
    }

    /// The data of a content reference, if still kept.
    pub fn content(&self, uri: &str) -> Option<&str> {
        self.contents
            .iter()
            .find(|(u, _)| u == uri)
            .map(|(_, d)| d.as_str())
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        if self.owned {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

/// The error for a path outside the sandbox.
pub fn outside(uri: &str) -> RpcError {
    RpcError::with_code(
        ahp_types::errors::ahp_error_codes::PERMISSION_DENIED,
        format!("outside this host's sandbox: {uri}"),
        None,
    )
}

/// `file://` + the percent-encoded absolute path.
pub fn file_uri(path: &Path) -> String {
    let mut out = String::from("file://");
    for b in path.to_string_lossy().bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn percent_decode(s: &str) -> Option<String> {
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
    String::from_utf8(out).ok()
}

/// Whether a change of `changed` is reported by a watch of `watched`.
fn covers(watched: &Path, recursive: bool, changed: &Path) -> bool {
    changed == watched
        || changed.parent() == Some(watched)
        || (recursive && changed.starts_with(watched))
}

/// Reports a change of `path` (`added`, `updated` or `deleted`) on every
/// watch covering it.
pub fn notify_change(core: &mut HostCore, path: &Path, kind: &str) {
    let mut hits: Vec<String> = core
        .files
        .watches
        .iter()
        .filter(|(_, w)| covers(&w.path, w.recursive, path))
        .map(|(ch, _)| ch.clone())
        .collect();
    hits.sort();
    let change = json!({"items": [{"uri": file_uri(path), "type": kind}]});
    for channel in hits {
        if let Some(a) = typed_action(json!({"type": "resourceWatch/changed", "changes": change})) {
            core.emit(&channel, a);
        }
    }
}

/// Releases watches nobody subscribes to any more (see the module docs).
pub fn release_unwatched(core: &mut HostCore) {
    let idle: Vec<String> = core
        .files
        .watches
        .iter()
        .filter(|(ch, w)| {
            let subscribed = core.conns.values().any(|c| c.subs.contains(*ch));
            !subscribed && (w.subscribed || !core.conns.contains_key(&w.creator))
        })
        .map(|(ch, _)| ch.clone())
        .collect();
    for ch in idle {
        core.files.watches.remove(&ch);
        core.state.watches.remove(&ch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files() -> Files {
        Files::open(&SimHostConfig::named("files-unit")).expect("sandbox")
    }

    #[test]
    fn paths_stay_inside_the_sandbox() {
        let f = files();
        let inside = file_uri(&f.root.join("a b/c.txt"));
        assert_eq!(
            f.path_of(&inside).expect("inside"),
            f.root.join("a b/c.txt")
        );
        let escape = format!("{}/../../etc/passwd", file_uri(&f.root));
        assert_eq!(f.path_of(&escape).map_err(|e| e.code), Err(-32009));
        assert_eq!(
            f.path_of("file:///etc/passwd").map_err(|e| e.code),
            Err(-32009)
        );
        assert_eq!(f.path_of("http://x/y").map_err(|e| e.code), Err(-32602));
    }

    #[test]
    fn coverage_of_watches() {
        let w = Path::new("/s/w");
        assert!(covers(w, false, Path::new("/s/w/a")));
        assert!(!covers(w, false, Path::new("/s/w/a/b")));
        assert!(covers(w, true, Path::new("/s/w/a/b")));
        assert!(!covers(w, true, Path::new("/s/x")));
    }

    #[test]
    fn output_marker_parses() {
        assert_eq!(requested_output("x [tool-output:9000] y"), Some(9000));
        assert_eq!(requested_output("x"), None);
    }
}

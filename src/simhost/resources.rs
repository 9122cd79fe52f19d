//! The `resource*` commands and `createResourceWatch` over the host's
//! sandbox ([`super::files`]), and `resourceRead` of content references.
//!
//! Error codes follow the spec: a missing resource -32008 (`NotFound`), an
//! existing one where the command may not overwrite -32010
//! (`AlreadyExists`), a stale `ifMatch` -32011 (`Conflict`), a path outside
//! the sandbox -32009 (`PermissionDenied`), anything else malformed -32602.

use std::path::Path;

use ahp_types::commands::{
    ContentEncoding, CreateResourceWatchParams, ResourceCopyParams, ResourceDeleteParams,
    ResourceListParams, ResourceMkdirParams, ResourceMoveParams, ResourceReadParams,
    ResourceRequestParams, ResourceResolveParams, ResourceWriteMode, ResourceWriteParams,
};
use ahp_types::errors::ahp_error_codes;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::core::{ConnId, HostCore};
use super::files::{self, CONTENT_SCHEME, WatchMeta, file_uri, notify_change};
use super::typed::typed;
use crate::rpc::RpcError;

/// Answers a `resource*` command or `createResourceWatch`; `None` if
/// `method` is not one of them.
pub fn handle(
    core: &mut HostCore,
    conn: ConnId,
    method: &str,
    params: &Value,
) -> Option<Result<String, RpcError>> {
    Some(match method {
        "resourceRead" => read(core, params),
        "resourceWrite" => write(core, params),
        "resourceList" => list(core, params),
        "resourceResolve" => resolve(core, params),
        "resourceRequest" => request(core, params),
        "resourceCopy" => copy_or_move(core, params, false),
        "resourceMove" => copy_or_move(core, params, true),
        "resourceDelete" => delete(core, params),
        "resourceMkdir" => mkdir(core, params),
        "createResourceWatch" => create_watch(core, conn, params),
        _ => return None,
    })
}

fn parse<T: DeserializeOwned>(params: &Value) -> Result<T, RpcError> {
    T::deserialize(params).map_err(|e| RpcError::invalid_params(format!("invalid params: {e}")))
}

fn io_err(uri: &str, e: &std::io::Error) -> RpcError {
    match e.kind() {
        std::io::ErrorKind::NotFound => RpcError::not_found(format!("not found: {uri}")),
        std::io::ErrorKind::AlreadyExists => RpcError::already_exists(uri),
        _ => RpcError::invalid_params(format!("{uri}: {e}")),
    }
}

fn code_err(code: i32, message: String) -> RpcError {
    RpcError::with_code(code, message, None)
}

fn read(core: &mut HostCore, params: &Value) -> Result<String, RpcError> {
    let p: ResourceReadParams = parse(params)?;
    let (bytes, content_type) = if p.uri.starts_with(CONTENT_SCHEME) {
        let data = core
            .files
            .content(&p.uri)
            .ok_or_else(|| RpcError::not_found(format!("no such content: {}", p.uri)))?;
        (data.as_bytes().to_vec(), "text/plain")
    } else {
        let path = core.files.path_of(&p.uri)?;
        let meta = std::fs::metadata(&path).map_err(|e| io_err(&p.uri, &e))?;
        if meta.is_dir() {
            return Err(RpcError::invalid_params(format!("a directory: {}", p.uri)));
        }
        if meta.len() > core.cfg.max_resource_bytes {
            return Err(RpcError::invalid_params("file exceeds max_resource_bytes"));
        }
        let bytes = std::fs::read(&path).map_err(|e| io_err(&p.uri, &e))?;
        (bytes, content_type_of(&path))
    };
    let (data, encoding) = match (p.encoding, String::from_utf8(bytes)) {
        (Some(ContentEncoding::Base64), Ok(s)) => (B64.encode(s), "base64"),
        (_, Ok(s)) => (s, "utf-8"),
        (_, Err(e)) => (B64.encode(e.into_bytes()), "base64"),
    };
    Ok(json!({"data": data, "encoding": encoding, "contentType": content_type}).to_string())
}

fn content_type_of(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()) {
        Some("json") => "application/json",
        Some("png") => "image/png",
        Some("md") => "text/markdown",
        _ => "text/plain",
    }
}

/// An opaque version token: modification time and size.
fn etag(meta: &std::fs::Metadata) -> String {
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    format!("{mtime:x}-{:x}", meta.len())
}

fn write(core: &mut HostCore, params: &Value) -> Result<String, RpcError> {
    let p: ResourceWriteParams = parse(params)?;
    let path = core.files.path_of(&p.uri)?;
    let data = match p.encoding {
        ContentEncoding::Utf8 => p.data.into_bytes(),
        ContentEncoding::Base64 => B64
            .decode(p.data)
            .map_err(|e| RpcError::invalid_params(format!("data is not base64: {e}")))?,
    };
    let existing = std::fs::metadata(&path).ok();
    if existing.as_ref().is_some_and(|m| m.is_dir()) {
        return Err(RpcError::invalid_params(format!("a directory: {}", p.uri)));
    }
    if p.create_only == Some(true) && existing.is_some() {
        return Err(RpcError::already_exists(&p.uri));
    }
    if let Some(want) = &p.if_match
        && existing.as_ref().map(etag).as_ref() != Some(want)
    {
        return Err(code_err(ahp_error_codes::CONFLICT, "etag mismatch".into()));
    }
    let old = match &existing {
        Some(_) => std::fs::read(&path).map_err(|e| io_err(&p.uri, &e))?,
        None => Vec::new(),
    };
    let new = splice(old, &data, p.mode.as_ref(), p.position.unwrap_or(0))?;
    if new.len() as u64 > core.cfg.max_resource_bytes {
        return Err(RpcError::invalid_params(
            "file would exceed max_resource_bytes",
        ));
    }
    std::fs::write(&path, new).map_err(|e| io_err(&p.uri, &e))?;
    let kind = if existing.is_some() {
        "updated"
    } else {
        "added"
    };
    notify_change(core, &path, kind);
    Ok("{}".into())
}

/// The file after writing `data` per `mode` at `position` (spec semantics).
fn splice(
    mut old: Vec<u8>,
    data: &[u8],
    mode: Option<&ResourceWriteMode>,
    position: i64,
) -> Result<Vec<u8>, RpcError> {
    let pos = usize::try_from(position)
        .ok()
        .filter(|p| *p <= old.len())
        .ok_or_else(|| RpcError::invalid_params("position out of range"))?;
    let at = match mode {
        None | Some(ResourceWriteMode::Truncate) => {
            old.truncate(pos);
            pos
        }
        Some(ResourceWriteMode::Append) => old.len() - pos,
        Some(ResourceWriteMode::Insert) => pos,
    };
    old.splice(at..at, data.iter().copied());
    Ok(old)
}

fn list(core: &mut HostCore, params: &Value) -> Result<String, RpcError> {
    let p: ResourceListParams = parse(params)?;
    let path = core.files.path_of(&p.uri)?;
    let meta = std::fs::metadata(&path).map_err(|e| io_err(&p.uri, &e))?;
    if !meta.is_dir() {
        return Err(RpcError::invalid_params(format!(
            "not a directory: {}",
            p.uri
        )));
    }
    let mut entries = Vec::new();
    for entry in std::fs::read_dir(&path).map_err(|e| io_err(&p.uri, &e))? {
        let entry = entry.map_err(|e| io_err(&p.uri, &e))?;
        let ty = entry.file_type().map_err(|e| io_err(&p.uri, &e))?;
        let kind = if ty.is_symlink() {
            "symlink"
        } else if ty.is_dir() {
            "directory"
        } else {
            "file"
        };
        entries.push(json!({"name": entry.file_name().to_string_lossy(), "type": kind}));
    }
    entries.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    Ok(json!({ "entries": entries }).to_string())
}

fn resolve(core: &mut HostCore, params: &Value) -> Result<String, RpcError> {
    let p: ResourceResolveParams = parse(params)?;
    let path = core.files.path_of(&p.uri)?;
    let follow = p.follow_symlinks != Some(false);
    let meta = if follow {
        std::fs::metadata(&path)
    } else {
        std::fs::symlink_metadata(&path)
    }
    .map_err(|e| io_err(&p.uri, &e))?;
    let canonical = if follow {
        let c = path.canonicalize().map_err(|e| io_err(&p.uri, &e))?;
        if !c.starts_with(&core.files.root) {
            return Err(files::outside(&p.uri));
        }
        file_uri(&c)
    } else {
        p.uri.clone()
    };
    let kind = if meta.is_symlink() {
        "symlink"
    } else if meta.is_dir() {
        "directory"
    } else {
        "file"
    };
    let mtime = meta
        .modified()
        .ok()
        .map(|t| super::clock::iso(jiff::Timestamp::try_from(t).unwrap_or_default()));
    let mut out = json!({"uri": canonical, "type": kind, "size": meta.len(), "etag": etag(&meta)});
    if let Some(m) = mtime {
        out["mtime"] = json!(m);
    }
    if kind == "file" {
        out["contentType"] = json!(content_type_of(&path));
    }
    Ok(out.to_string())
}

fn request(core: &mut HostCore, params: &Value) -> Result<String, RpcError> {
    let p: ResourceRequestParams = parse(params)?;
    if p.uri.starts_with(CONTENT_SCHEME) {
        return Ok("{}".into());
    }
    core.files.path_of(&p.uri)?;
    Ok("{}".into())
}

fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    if std::fs::metadata(from)?.is_dir() {
        std::fs::create_dir_all(to)?;
        for entry in std::fs::read_dir(from)? {
            let entry = entry?;
            copy_tree(&entry.path(), &to.join(entry.file_name()))?;
        }
        Ok(())
    } else {
        std::fs::copy(from, to).map(|_| ())
    }
}

fn remove_any(path: &Path) -> std::io::Result<()> {
    if std::fs::symlink_metadata(path)?.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    }
}

fn copy_or_move(core: &mut HostCore, params: &Value, is_move: bool) -> Result<String, RpcError> {
    let p: ResourceCopyParams = if is_move {
        let m: ResourceMoveParams = parse(params)?;
        ResourceCopyParams {
            channel: m.channel,
            meta: m.meta,
            source: m.source,
            destination: m.destination,
            fail_if_exists: m.fail_if_exists,
        }
    } else {
        parse(params)?
    };
    let from = core.files.path_of(&p.source)?;
    let to = core.files.path_of(&p.destination)?;
    std::fs::symlink_metadata(&from).map_err(|e| io_err(&p.source, &e))?;
    if to.starts_with(&from) && to != from {
        return Err(RpcError::invalid_params(
            "destination lies inside the source",
        ));
    }
    let existed = std::fs::symlink_metadata(&to).is_ok();
    if existed && p.fail_if_exists == Some(true) {
        return Err(RpcError::already_exists(&p.destination));
    }
    if existed && to != from {
        remove_any(&to).map_err(|e| io_err(&p.destination, &e))?;
    }
    let done = if is_move {
        std::fs::rename(&from, &to)
    } else {
        copy_tree(&from, &to)
    };
    done.map_err(|e| io_err(&p.destination, &e))?;
    if is_move {
        notify_change(core, &from, "deleted");
    }
    notify_change(core, &to, if existed { "updated" } else { "added" });
    Ok("{}".into())
}

fn delete(core: &mut HostCore, params: &Value) -> Result<String, RpcError> {
    let p: ResourceDeleteParams = parse(params)?;
    let path = core.files.path_of(&p.uri)?;
    if path == core.files.root {
        return Err(files::outside(&p.uri));
    }
    let meta = std::fs::symlink_metadata(&path).map_err(|e| io_err(&p.uri, &e))?;
    let done = if meta.is_dir() && p.recursive == Some(true) {
        std::fs::remove_dir_all(&path)
    } else if meta.is_dir() {
        std::fs::remove_dir(&path)
    } else {
        std::fs::remove_file(&path)
    };
    done.map_err(|e| match e.kind() {
        std::io::ErrorKind::DirectoryNotEmpty => {
            RpcError::invalid_params("directory not empty (recursive not set)")
        }
        _ => io_err(&p.uri, &e),
    })?;
    notify_change(core, &path, "deleted");
    Ok("{}".into())
}

fn mkdir(core: &mut HostCore, params: &Value) -> Result<String, RpcError> {
    let p: ResourceMkdirParams = parse(params)?;
    let path = core.files.path_of(&p.uri)?;
    match std::fs::metadata(&path) {
        Ok(m) if m.is_dir() => return Ok("{}".into()),
        Ok(_) => return Err(RpcError::already_exists(&p.uri)),
        Err(_) => {}
    }
    std::fs::create_dir_all(&path).map_err(|e| io_err(&p.uri, &e))?;
    notify_change(core, &path, "added");
    Ok("{}".into())
}

fn create_watch(core: &mut HostCore, conn: ConnId, params: &Value) -> Result<String, RpcError> {
    let p: CreateResourceWatchParams = parse(params)?;
    let path = core.files.path_of(&p.uri)?;
    std::fs::metadata(&path).map_err(|e| io_err(&p.uri, &e))?;
    if core.files.watches.len() >= core.cfg.max_watches {
        return Err(RpcError::internal(
            "too many resource watches (max_watches)",
            None,
        ));
    }
    let channel = format!("ahp-resource-watch:/{}", core.files.fresh_id());
    let recursive = p.recursive.unwrap_or(false);
    let mut state = json!({"root": p.uri, "recursive": recursive});
    if let Some(x) = p.excludes {
        state["excludes"] = x;
    }
    if let Some(i) = p.includes {
        state["includes"] = i;
    }
    let state = typed(state).ok_or_else(|| RpcError::invalid_params("bad watch"))?;
    core.state.watches.insert(channel.clone(), state);
    core.files.watches.insert(
        channel.clone(),
        WatchMeta {
            path,
            recursive,
            creator: conn,
            subscribed: false,
        },
    );
    Ok(json!({ "channel": channel }).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_modes_splice_like_the_spec() {
        let t = |old: &str, data: &str, mode, pos| {
            String::from_utf8(splice(old.into(), data.as_bytes(), mode, pos).expect("ok"))
                .expect("utf8")
        };
        assert_eq!(t("hello", "J", None, 0), "J");
        assert_eq!(
            t("hello", "p!", Some(&ResourceWriteMode::Truncate), 3),
            "help!"
        );
        assert_eq!(
            t("hello", "!", Some(&ResourceWriteMode::Append), 0),
            "hello!"
        );
        assert_eq!(
            t("hello", "-", Some(&ResourceWriteMode::Append), 2),
            "hel-lo"
        );
        assert_eq!(
            t("hello", "-", Some(&ResourceWriteMode::Insert), 1),
            "h-ello"
        );
        assert!(splice(b"ab".to_vec(), b"x", Some(&ResourceWriteMode::Insert), 5).is_err());
    }
}

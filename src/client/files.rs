//! Files of a host through the relay (`resourceList`, `resourceRead`,
//! `resourceWrite`): `ls`, `cat`, `put`. URIs name the host in their
//! authority, `file://<host>/<path>`, as the relay shows them.

use std::io::Read;
use std::path::PathBuf;

use ahp_types::commands::{
    ContentEncoding, ResourceListParams, ResourceReadParams, ResourceWriteParams,
};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};

use super::cli::CliError;
use super::conn::{Connection, emit_bytes, note, print_json, print_lines};
use super::format;

/// `ls`: NAME and TYPE of each entry (or JSON).
pub(super) async fn ls(conn: &Connection, uri: &str, json: bool) -> Result<(), CliError> {
    let params = ResourceListParams {
        channel: String::new(),
        meta: None,
        uri: uri.to_owned(),
    };
    let listed = conn
        .client
        .resource_list(params)
        .await
        .map_err(conn.failed("resourceList"))?;
    if json {
        let entries = listed
            .entries
            .iter()
            .map(|e| json!({"name": e.name, "type": e.r#type}))
            .collect();
        return print_json(&Value::Array(entries));
    }
    let lines = listed
        .entries
        .iter()
        .map(|e| format::row(&[&e.name, &e.r#type]));
    print_lines(std::iter::once("NAME\tTYPE".to_owned()).chain(lines))
}

/// `cat`: the file's bytes to stdout, decoded from base64 if sent so.
pub(super) async fn cat(conn: &Connection, uri: &str) -> Result<(), CliError> {
    let params = ResourceReadParams {
        channel: String::new(),
        meta: None,
        uri: uri.to_owned(),
        encoding: None,
    };
    let read = conn
        .client
        .resource_read(params)
        .await
        .map_err(conn.failed("resourceRead"))?;
    let bytes = match read.encoding {
        ContentEncoding::Utf8 => read.data.into_bytes(),
        ContentEncoding::Base64 => B64
            .decode(read.data.as_bytes())
            .map_err(|_| CliError::BadContent("base64"))?,
    };
    emit_bytes(&bytes)
}

/// `put`: write `file` (or stdin) to `uri`, as UTF-8 text when it is, else base64.
pub(super) async fn put(
    conn: &Connection,
    uri: &str,
    file: Option<PathBuf>,
) -> Result<(), CliError> {
    let bytes = read_input(file)?;
    let size = bytes.len();
    let (data, encoding) = match String::from_utf8(bytes) {
        Ok(text) => (text, ContentEncoding::Utf8),
        Err(e) => (B64.encode(e.into_bytes()), ContentEncoding::Base64),
    };
    let params = ResourceWriteParams {
        channel: String::new(),
        meta: None,
        uri: uri.to_owned(),
        data,
        encoding,
        content_type: None,
        create_only: None,
        mode: None,
        if_match: None,
        position: None,
    };
    conn.client
        .resource_write(params)
        .await
        .map_err(conn.failed("resourceWrite"))?;
    note(&format!("wrote {size} bytes to {uri}"));
    Ok(())
}

/// The bytes of `file`, or of stdin without one.
fn read_input(file: Option<PathBuf>) -> Result<Vec<u8>, CliError> {
    match file {
        Some(path) => std::fs::read(&path).map_err(|source| CliError::Input {
            what: path.display().to_string(),
            source,
        }),
        None => {
            let mut bytes = Vec::new();
            std::io::stdin()
                .read_to_end(&mut bytes)
                .map_err(|source| CliError::Input {
                    what: "stdin".into(),
                    source,
                })?;
            Ok(bytes)
        }
    }
}

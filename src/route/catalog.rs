//! `listSessions` across hosts (contract §6.3) from the watch links'
//! catalogs, with an opaque cursor MAC-protected and bound to the socket.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use hmac::Mac;
use serde_json::{Value, json};

use crate::relay::Relay;
use crate::route::namer::ToClient;
use crate::route::translate;
use crate::rpc::RpcError;
use crate::session::ClientSession;
use crate::upstream::hub::HostStatus;

impl Relay {
    /// `listSessions` across hosts (contract §6.3): newest first by parsed
    /// `modifiedAt`, ties by client URI; sessions of unreachable hosts kept
    /// and marked; an opaque cursor MAC-protected and bound to the socket.
    pub fn list_sessions(
        &self,
        session: &ClientSession,
        params: Value,
    ) -> Result<String, RpcError> {
        let limit_cap = self.cfg.limits.list_sessions_limit;
        let limit = match params.get("limit") {
            None | Some(Value::Null) => limit_cap,
            Some(v) => match v.as_u64() {
                Some(l) if l >= 1 => (l as usize).min(limit_cap),
                _ => return Err(RpcError::invalid_params("limit must be a positive integer")),
            },
        };
        let after = match params.get("cursor") {
            None | Some(Value::Null) => None,
            Some(c) => Some(
                c.as_str()
                    .and_then(|c| self.open_cursor(c, session))
                    .ok_or_else(|| RpcError::invalid_params("unknown cursor"))?,
            ),
        };
        let mut all: Vec<(i64, String, Value)> = Vec::new();
        let who = session.subject();
        for hub in self.hubs.values() {
            let Some(grant) = self.grant_on(who, hub) else {
                continue;
            };
            let namer = ToClient {
                host: &hub.id,
                store: self.store.as_ref(),
                identity: None,
            };
            hub.read(|view| {
                for (uri, summary) in &view.catalog {
                    if !self.sees_session(who, &grant, hub, uri) {
                        continue;
                    }
                    let mut s = summary.clone();
                    if translate::translate(&mut s, "@SessionSummary", &namer).is_err() {
                        continue;
                    }
                    if view.status != HostStatus::Up
                        && let Some(o) = s.as_object_mut()
                    {
                        let meta = o.entry("_meta").or_insert_with(|| json!({}));
                        if let Some(m) = meta.as_object_mut() {
                            m.insert("ahp-relay/hostState".into(), json!(view.status.label()));
                        }
                    }
                    let at = s
                        .get("modifiedAt")
                        .and_then(Value::as_str)
                        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                        .map_or(i64::MIN, |t| t.as_microsecond());
                    let uri = s
                        .get("resource")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string();
                    all.push((at, uri, s));
                }
            });
        }
        all.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        let start = match &after {
            None => 0,
            Some((at, uri)) => all
                .iter()
                .position(|(a, u, _)| a < at || (a == at && u > uri))
                .unwrap_or(all.len()),
        };
        let page: Vec<&(i64, String, Value)> = all.iter().skip(start).take(limit).collect();
        let mut result = json!({"items": page.iter().map(|(_, _, s)| s).collect::<Vec<_>>()});
        if start + page.len() < all.len()
            && let (Some((at, uri, _)), Some(o)) = (page.last(), result.as_object_mut())
        {
            o.insert(
                "nextCursor".into(),
                json!(self.seal_cursor(*at, uri, session)),
            );
        }
        Ok(result.to_string())
    }

    fn cursor_mac(&self, body: &str, session: &ClientSession) -> String {
        let mut m = self.mac_key.clone();
        m.update(b"listSessions\0");
        m.update(session.upstream_id.as_bytes());
        let socket = session.lock().socket_id().unwrap_or(0);
        m.update(&socket.to_be_bytes());
        m.update(body.as_bytes());
        let tag = B64.encode(m.finalize().into_bytes());
        tag.get(..22).unwrap_or(&tag).to_string()
    }

    fn seal_cursor(&self, at: i64, uri: &str, session: &ClientSession) -> String {
        let body = B64.encode(json!([at, uri]).to_string());
        format!("{body}.{}", self.cursor_mac(&body, session))
    }

    fn open_cursor(&self, cursor: &str, session: &ClientSession) -> Option<(i64, String)> {
        let (body, tag) = cursor.split_once('.')?;
        if self.cursor_mac(body, session) != tag {
            return None;
        }
        let v: Value = serde_json::from_slice(&B64.decode(body).ok()?).ok()?;
        Some((v.get(0)?.as_i64()?, v.get(1)?.as_str()?.to_string()))
    }
}

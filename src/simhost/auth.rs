//! `authenticate` and the protected resources of the agent
//! (`SimHostConfig::protected_resources`, advertised as
//! `AgentInfo.protectedResources`).
//!
//! Guarantees:
//! - tokens are per connection (the spec: "authentication status is
//!   per-connection") and kept only in memory; the host never logs them;
//! - in VS Code mode (unless `per_connection_tokens`) they are host-wide, as
//!   in VS Code's agent host: one store for the process, written by any
//!   connection, judging every connection's turns, outliving the
//!   connection that gave it; a later token for a resource replaces the
//!   earlier one, and an empty token revokes it for everyone;
//! - a `chat/turnStarted` dispatched on a connection that lacks a live token
//!   for any protected resource is echoed with a `rejectionReason` and that
//!   connection gets `auth/required {reason: "required"}`;
//! - a token given with `expiresIn` is forgotten when it runs out, and the
//!   connection gets `auth/required {reason: "expired"}` (unless the client
//!   replaced or revoked it meanwhile);
//! - an empty token revokes; a token starting with `invalid` is refused with
//!   `AuthRequired` (-32007) so clients can test their error path; a
//!   resource the agent does not declare gets -32602.

use std::sync::Arc;
use std::time::Duration;

use ahp_types::commands::AuthenticateParams;
use serde_json::{Value, json};

use super::core::{ConnId, HostCore};
use super::server::Shared;
use crate::rpc::RpcError;

/// The agent's metadata of `resource`, as advertised in the root state.
fn metadata(core: &HostCore, resource: &str) -> Value {
    core.state
        .root
        .agents
        .iter()
        .flat_map(|a| a.protected_resources.iter().flatten())
        .find(|m| m.resource == resource)
        .and_then(|m| serde_json::to_value(m).ok())
        .unwrap_or_else(|| json!({ "resource": resource }))
}

/// Handles `authenticate` on `conn`.
pub fn authenticate(
    shared: &Arc<Shared>,
    core: &mut HostCore,
    conn: ConnId,
    params: &Value,
) -> Result<String, RpcError> {
    let p: AuthenticateParams = serde::Deserialize::deserialize(params)
        .map_err(|e| RpcError::invalid_params(format!("invalid params: {e}")))?;
    if !core.cfg.protected_resources.contains(&p.resource) {
        return Err(RpcError::invalid_params(
            "not a protected resource this host advertises",
        ));
    }
    if p.expires_in.is_some_and(|s| s <= 0) {
        return Err(RpcError::invalid_params(
            "expiresIn must be a positive integer",
        ));
    }
    if p.token.starts_with("invalid") {
        let data = json!([metadata(core, &p.resource)]);
        return Err(RpcError::with_code(
            ahp_types::errors::ahp_error_codes::AUTH_REQUIRED,
            "token refused",
            Some(data),
        ));
    }
    let generation = core.fresh_id("token");
    let Some(tokens) = core.tokens_mut(conn) else {
        return Ok("{}".into());
    };
    if p.token.is_empty() {
        tokens.remove(&p.resource);
        return Ok("{}".into());
    }
    tokens.insert(p.resource.clone(), generation.clone());
    if let Some(secs) = p.expires_in.and_then(|s| u64::try_from(s).ok()) {
        let shared = shared.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(secs)).await;
            expire(&shared, conn, &p.resource, generation);
        });
    }
    Ok("{}".into())
}

/// Forgets token `generation` of `resource` on `conn` if it is still the
/// live one, and tells the connection with `auth/required {reason: expired}`.
fn expire(shared: &Arc<Shared>, conn: ConnId, resource: &str, generation: String) {
    let mut core = shared.lock();
    let Some(tokens) = core.tokens_mut(conn) else {
        return;
    };
    if tokens.get(resource) != Some(&generation) {
        return;
    }
    tokens.remove(resource);
    let params = json!({"channel": ahp_types::ROOT_RESOURCE_URI,
        "resource": metadata(&core, resource), "reason": "expired"});
    core.notify_conn(conn, "auth/required", &params);
}

/// The first protected resource `conn` holds no live token for, if any;
/// in that case the connection is told with `auth/required {reason: required}`.
pub fn missing_token(core: &HostCore, conn: ConnId) -> Option<String> {
    let tokens = core.tokens(conn)?;
    let missing = core
        .cfg
        .protected_resources
        .iter()
        .find(|r| !tokens.contains_key(*r))?
        .clone();
    let params = json!({"channel": ahp_types::ROOT_RESOURCE_URI,
        "resource": metadata(core, &missing), "reason": "required"});
    core.notify_conn(conn, "auth/required", &params);
    Some(missing)
}

//! What to try next, printed as one `hint:` line under an error: the cause
//! the error text cannot name by itself (an untrusted CA, a "not found" that
//! may mean "not visible to you") and the command that tells more.

use ahp_types::errors::ahp_error_codes as codes;
use ahp_types::errors::json_rpc_error_codes::INVALID_PARAMS;

use super::cli::CliError;
use crate::upstream::dial::DialError;

/// The command that shows what a principal holds on each host.
pub(super) const POLICY_EXPLAIN: &str =
    "ahp-relay policy explain --sub <subject> --config <relay.toml>";

/// [`POLICY_EXPLAIN`] with the subject filled in when it is known.
pub(super) fn policy_explain(subject: Option<&str>) -> String {
    match subject {
        Some(sub) => POLICY_EXPLAIN.replace("<subject>", sub),
        None => POLICY_EXPLAIN.to_owned(),
    }
}

/// The hint for `err`, if there is one; `subject` is the token's, for the
/// `policy explain` command.
pub(super) fn for_error(err: &CliError, subject: Option<&str>) -> Option<String> {
    match err {
        CliError::MissingUrl => Some(
            "`ahp-relay demo` prints AHP_RELAY_URL, AHP_RELAY_TOKEN and AHP_RELAY_CA \
             and writes them to an env file: `source` it"
                .into(),
        ),
        CliError::Dial(d) => for_dial(d),
        CliError::Rpc { method, code, .. } => for_rpc(method, *code, subject),
        CliError::Rejected(reason) if reason.contains("permission") => Some(format!(
            "this principal may see but not do this; `{}` shows what it holds",
            policy_explain(subject)
        )),
        CliError::NoPendingTool { .. } | CliError::NoActiveTurn(_) => {
            Some("`ahp-relay client tail <chat>` shows what the chat is doing".into())
        }
        _ => None,
    }
}

/// Hints for a failed dial: trust, token, rate limit.
fn for_dial(err: &DialError) -> Option<String> {
    match err {
        DialError::Tls { reason, .. } if reason.contains("CaUsedAsEndEntity") => Some(
            "the relay serves a CA certificate as its own (what `openssl req -x509` makes by \
             default), which TLS refuses for a server: make a CA and a server certificate \
             signed by it with `ahp-relay cert --host NAME`, serve the server pair and trust \
             the CA (--ca / AHP_RELAY_CA)"
                .into(),
        ),
        DialError::Tls { reason, .. }
            if reason.contains("UnknownIssuer") || reason.contains("invalid peer certificate") =>
        {
            Some(
                "the relay's certificate is not signed by a CA this client trusts: pass \
                 --ca FILE or set AHP_RELAY_CA (the demo prints it; `ahp-relay cert` makes \
                 a CA for testing); --insecure skips the check, for local tests only"
                    .into(),
            )
        }
        DialError::Connect { .. } => Some(
            "nothing answers there: is the relay (or `ahp-relay demo`) running, and is \
             AHP_RELAY_URL / --url its address?"
                .into(),
        ),
        DialError::UpgradeRefused { status: 401, .. } => Some(
            "the relay refused the token (AHP_RELAY_TOKEN / --token): mint a fresh one \
             with `ahp-relay token --sub <name>` (key: AHP_RELAY_DEV_KEY)"
                .into(),
        ),
        DialError::UpgradeRefused { status: 429, .. } => Some(
            "too many refused attempts from this address: wait, then retry with a valid token"
                .into(),
        ),
        _ => None,
    }
}

/// Hints for JSON-RPC errors by code.
fn for_rpc(method: &str, code: i32, subject: Option<&str>) -> Option<String> {
    match code {
        codes::NOT_FOUND | codes::SESSION_NOT_FOUND => Some(
            "`ahp-relay client sessions --chats` lists the sessions and chats this principal \
             can see (what it may not see is \"not found\" too)"
                .into(),
        ),
        codes::PROVIDER_NOT_FOUND => {
            Some("`ahp-relay client providers` lists the providers this principal can use".into())
        }
        codes::PERMISSION_DENIED => Some(format!(
            "`{}` shows what this principal holds on each host",
            policy_explain(subject)
        )),
        INVALID_PARAMS if method == "createSession" => Some(
            "`ahp-relay client providers` lists the providers; pass one with --provider".into(),
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_issuer_points_at_the_ca_options() {
        let err = CliError::Dial(DialError::Tls {
            url: "wss://localhost:8443/".into(),
            reason: "invalid peer certificate: UnknownIssuer".into(),
        });
        let hint = for_error(&err, None).unwrap_or_default();
        assert!(
            hint.contains("--ca") && hint.contains("AHP_RELAY_CA"),
            "{hint}"
        );
    }

    #[test]
    fn a_ca_served_as_the_server_certificate_is_explained() {
        let err = CliError::Dial(DialError::Tls {
            url: "wss://localhost:8443/".into(),
            reason: "invalid peer certificate: CaUsedAsEndEntity".into(),
        });
        let hint = for_error(&err, None).unwrap_or_default();
        assert!(hint.contains("ahp-relay cert"), "{hint}");
    }

    #[test]
    fn a_refused_connection_asks_whether_the_relay_runs() {
        let err = CliError::Dial(DialError::Connect {
            url: "wss://localhost:8443/".into(),
            source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        });
        let hint = for_error(&err, None).unwrap_or_default();
        assert!(hint.contains("AHP_RELAY_URL"), "{hint}");
    }

    #[test]
    fn not_found_points_at_the_listing() {
        for code in [codes::NOT_FOUND, codes::SESSION_NOT_FOUND] {
            let err = CliError::Rpc {
                method: "subscribe",
                code,
                message: "not found".into(),
            };
            let hint = for_error(&err, None).unwrap_or_default();
            assert!(hint.contains("client sessions"), "{hint}");
        }
    }
}

//! The shapes of the session and chat URIs a host mints and accepts.
//!
//! Plain mode uses the spec's shapes: `ahp-session:/<id>` with chats
//! `ahp-chat:/<id>`. VS Code mode (`SimHostConfig::vscode_compat`) names
//! things as VS Code's agent host does (`buildChatUri` /
//! `buildDefaultChatUri` in `src/vs/platform/agentHost/`): sessions
//! `<provider>:/<uuid>` and chats `ahp-chat://<chatId>/<base64url-no-pad(UTF-8
//! session URI)>`, the default chat having chat id `default`, so a client can
//! compute a session's default chat without asking.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;

use super::clock::SplitMix64;
use super::config::SimHostConfig;

/// Chat id of the default chat in VS Code's chat URIs.
pub const DEFAULT_CHAT_ID: &str = "default";

/// The URI of the seeded session number `n` (1-based).
pub fn seeded_session_uri(cfg: &SimHostConfig, n: usize) -> String {
    if cfg.vscode_compat {
        format!("{}:/{}", cfg.provider, seeded_uuid(cfg, n))
    } else {
        format!("ahp-session:/{}-{n}", cfg.session_prefix)
    }
}

/// The seed of the VS Code-mode session ids: `id_seed`, else a hash of the
/// session prefix — so two hosts given the same prefix (or seed) mint the
/// same ids, as cloned hosts do.
fn id_seed(cfg: &SimHostConfig) -> u64 {
    cfg.id_seed
        .unwrap_or_else(|| fnv1a(cfg.session_prefix.as_bytes()))
}

/// A version-4-shaped UUID drawn deterministically for seeded session `n`.
pub fn seeded_uuid(cfg: &SimHostConfig, n: usize) -> String {
    let mut rng = SplitMix64::new(id_seed(cfg) ^ (n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    uuid_from(rng.next_u64(), rng.next_u64())
}

/// Formats 128 random bits as a version-4, RFC 4122-variant UUID.
pub fn uuid_from(hi: u64, lo: u64) -> String {
    let hi = (hi & !0xF000) | 0x4000;
    let lo = (lo & !(0xC000 << 48)) | (0x8000 << 48);
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xFFFF,
        hi & 0xFFFF,
        lo >> 48,
        lo & 0xFFFF_FFFF_FFFF
    )
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// The URI of the chat a session is created with: `ahp-chat:/<id>-main`
/// (plain) or `ahp-chat://default/<b64(session)>` (VS Code mode).
pub fn default_chat_uri(cfg: &SimHostConfig, session_uri: &str) -> String {
    if cfg.vscode_compat {
        vscode_chat_uri(session_uri, DEFAULT_CHAT_ID)
    } else {
        // `ahp-session:/<id>` and a client-chosen `<provider>:/<id>` alike.
        let id = session_uri
            .split_once(":/")
            .map_or(session_uri, |(_, id)| id);
        format!("ahp-chat:/{id}-main")
    }
}

/// VS Code's `buildChatUri`: `ahp-chat://<chatId>/<base64url-no-pad(session)>`.
pub fn vscode_chat_uri(session_uri: &str, chat_id: &str) -> String {
    format!(
        "ahp-chat://{chat_id}/{}",
        B64.encode(session_uri.as_bytes())
    )
}

/// VS Code's `parseChatUri`: the chat id and the owning session URI of an
/// `ahp-chat://<chatId>/<b64>` URI.
pub fn parse_vscode_chat_uri(uri: &str) -> Option<(String, String)> {
    let rest = uri.strip_prefix("ahp-chat://")?;
    let (chat_id, encoded) = rest.split_once('/')?;
    let session = String::from_utf8(B64.decode(encoded).ok()?).ok()?;
    (!chat_id.is_empty()).then(|| (chat_id.to_string(), session))
}

/// Whether `id` is a client-chosen id the host accepts: `[A-Za-z0-9._-]{1,128}`.
pub fn safe_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// Whether `uri` is a session URI a client may create on this host:
/// `ahp-session:/<id>` or `<provider>:/<id>` (this host's provider), in
/// both modes — a client names a new session itself, VS Code's client as
/// `<provider>:/<uuid>`; the mode decides only the names the host assigns.
pub fn creatable_session(cfg: &SimHostConfig, uri: &str) -> bool {
    let plain = uri.strip_prefix("ahp-session:/").is_some_and(safe_id);
    let vscode = uri
        .strip_prefix(cfg.provider.as_str())
        .and_then(|r| r.strip_prefix(":/"))
        .is_some_and(safe_id);
    plain || vscode
}

/// Whether `chat` is a chat URI a client may create in `session`:
/// `ahp-chat:/<id>`, or in VS Code mode also VS Code's
/// `ahp-chat://<chatId>/<b64(session)>` naming this very session.
pub fn creatable_chat(cfg: &SimHostConfig, session: &str, chat: &str) -> bool {
    let plain = chat.strip_prefix("ahp-chat:/").is_some_and(safe_id);
    let vscode = cfg.vscode_compat
        && parse_vscode_chat_uri(chat).is_some_and(|(id, s)| safe_id(&id) && s == session);
    plain || vscode
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vscode_chat_uris_round_trip_like_build_chat_uri() {
        let uri = vscode_chat_uri("copilot:/abc", DEFAULT_CHAT_ID);
        // base64url("copilot:/abc") without padding.
        assert_eq!(uri, "ahp-chat://default/Y29waWxvdDovYWJj");
        assert_eq!(
            parse_vscode_chat_uri(&uri),
            Some(("default".into(), "copilot:/abc".into()))
        );
        assert_eq!(parse_vscode_chat_uri("ahp-chat:/x"), None);
    }

    #[test]
    fn seeded_uuids_are_v4_shaped_and_follow_the_seed() {
        let mut cfg = SimHostConfig::named("a");
        cfg.vscode_compat = true;
        let u = seeded_uuid(&cfg, 1);
        assert_eq!(u.len(), 36);
        assert_eq!(u.as_bytes()[14], b'4');
        assert!(matches!(u.as_bytes()[19], b'8' | b'9' | b'a' | b'b'));
        assert_ne!(u, seeded_uuid(&cfg, 2));
        let mut other = SimHostConfig::named("b");
        other.vscode_compat = true;
        assert_ne!(u, seeded_uuid(&other, 1));
        other.id_seed = Some(7);
        cfg.id_seed = Some(7);
        assert_eq!(seeded_uuid(&cfg, 1), seeded_uuid(&other, 1));
    }

    #[test]
    fn creatable_shapes() {
        let mut cfg = SimHostConfig::named("a");
        assert!(creatable_session(&cfg, "ahp-session:/x"));
        assert!(creatable_session(&cfg, "sim:/x"));
        assert!(!creatable_session(&cfg, "other:/x"));
        cfg.vscode_compat = true;
        assert!(creatable_session(&cfg, "sim:/x"));
        assert!(!creatable_session(&cfg, "other:/x"));
        let chat = vscode_chat_uri("sim:/x", "c2");
        assert!(creatable_chat(&cfg, "sim:/x", &chat));
        assert!(!creatable_chat(&cfg, "sim:/y", &chat));
    }
}

//! Plain-text tables of the client: one header line, then one
//! tab-separated row per item; tabs and line breaks inside fields become
//! spaces, so every row is one line with a fixed number of columns.

use ahp_types::state::{SessionState, SessionStatus, SessionSummary};

/// Header of `sessions`.
pub(super) const SESSION_HEADER: &str = "SESSION\tSTATUS\tMODIFIED\tPROVIDER\tTITLE";
/// Header of `sessions --chats`.
pub(super) const CHAT_HEADER: &str = "SESSION\tCHAT\tDEFAULT\tSTATUS\tTITLE";

/// One chat of a session, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ChatRow {
    /// Chat URI.
    pub(super) uri: String,
    /// Title (`-` when the catalog does not list the chat).
    pub(super) title: String,
    /// Status bits (0 when unknown).
    pub(super) status: u32,
    /// Whether it is the session's default chat.
    pub(super) default: bool,
}

/// The chats of `state`: its catalog in order, the default chat marked;
/// the default chat first when the catalog does not list it.
pub(super) fn chats_of(state: &SessionState, default: Option<&str>) -> Vec<ChatRow> {
    let mut rows: Vec<ChatRow> = state
        .chats
        .iter()
        .map(|c| ChatRow {
            uri: c.resource.clone(),
            title: c.title.clone(),
            status: c.status,
            default: default == Some(c.resource.as_str()),
        })
        .collect();
    if let Some(d) = default.filter(|d| !rows.iter().any(|r| r.uri == *d)) {
        rows.insert(
            0,
            ChatRow {
                uri: d.to_owned(),
                title: "-".into(),
                status: 0,
                default: true,
            },
        );
    }
    rows
}

/// The `sessions --chats` rows of one session (one `-` row without chats).
pub(super) fn chat_lines(s: &SessionSummary, state: Option<&SessionState>) -> Vec<String> {
    let default = state.and_then(|st| super::objects::default_chat(&s.resource, st));
    let chats = state.map_or_else(Vec::new, |st| chats_of(st, default.as_deref()));
    if chats.is_empty() {
        return vec![row(&[&s.resource, "-", "-", "-", "-"])];
    }
    chats
        .iter()
        .map(|c| {
            let status = if c.status == 0 {
                "-".to_owned()
            } else {
                status_word(SessionStatus::from_bits(c.status))
            };
            let mark = if c.default { "*" } else { "-" };
            row(&[&s.resource, &c.uri, mark, &status, &c.title])
        })
        .collect()
}

/// `fields` as one tab-separated row.
pub(super) fn row(fields: &[&str]) -> String {
    fields
        .iter()
        .map(|f| one_line_field(f))
        .collect::<Vec<_>>()
        .join("\t")
}

/// The status word of a `SessionStatus` bitset: the activity
/// (`input-needed`, `in-progress`, `error`, `idle`, or `unknown` when no
/// activity bit is set) followed by `,archived` and `,read` when those flags
/// are set. `input-needed` wins over `in-progress` since its bits include it.
pub(super) fn status_word(status: SessionStatus) -> String {
    let activity = if status.contains(SessionStatus::InputNeeded) {
        "input-needed"
    } else if status.contains(SessionStatus::InProgress) {
        "in-progress"
    } else if status.contains(SessionStatus::Error) {
        "error"
    } else if status.contains(SessionStatus::Idle) {
        "idle"
    } else {
        "unknown"
    };
    let mut word = activity.to_owned();
    if status.contains(SessionStatus::IsArchived) {
        word.push_str(",archived");
    }
    if status.contains(SessionStatus::IsRead) {
        word.push_str(",read");
    }
    word
}

/// One tab-separated line `<resource>\t<status>\t<modifiedAt>\t<provider>\t<title>`
/// (no trailing newline); tabs and line breaks inside fields become spaces.
pub(super) fn session_line(s: &SessionSummary) -> String {
    [
        s.resource.as_str(),
        &status_word(SessionStatus::from_bits(s.status)),
        &s.modified_at,
        &s.provider,
        &s.title,
    ]
    .map(one_line_field)
    .join("\t")
}

/// `field` with every tab, CR and LF replaced by a space.
fn one_line_field(field: &str) -> String {
    field.replace(['\t', '\r', '\n'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_words() {
        let s = SessionStatus::from_bits;
        assert_eq!(status_word(s(1)), "idle");
        assert_eq!(status_word(s(2)), "error");
        assert_eq!(status_word(s(8)), "in-progress");
        assert_eq!(status_word(s(24)), "input-needed");
        assert_eq!(status_word(s(1 | 32)), "idle,read");
        assert_eq!(status_word(s(8 | 64)), "in-progress,archived");
        assert_eq!(status_word(s(2 | 32 | 64)), "error,archived,read");
        assert_eq!(status_word(s(0)), "unknown");
        assert_eq!(status_word(s(64)), "unknown,archived");
    }

    #[test]
    fn session_line_is_tab_separated_and_single_line() {
        let summary: SessionSummary = serde_json::from_value(serde_json::json!({
            "resource": "ahp-session:/a",
            "provider": "copilot",
            "title": "fix\tthe\nbug",
            "status": 9,
            "createdAt": "2025-03-10T18:00:00.000Z",
            "modifiedAt": "2025-03-10T18:42:03.123Z"
        }))
        .unwrap();
        assert_eq!(
            session_line(&summary),
            "ahp-session:/a\tin-progress\t2025-03-10T18:42:03.123Z\tcopilot\tfix the bug"
        );
    }
}

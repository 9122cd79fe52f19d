//! Plain-text rendering of session summaries for `client sessions`.

use ahp_types::state::{SessionStatus, SessionSummary};

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

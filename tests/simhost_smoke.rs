//! A first end-to-end check of the simulated host through the official client.

mod common;

use ahp_types::commands::ListSessionsResult;
use common::*;
use serde_json::json;

#[tokio::test]
async fn lists_seeded_sessions_and_answers_ping() {
    let host = start_host(fast_config("alpha", 3)).await;
    let client = connect_init(&host.url(), "smoke-1").await;
    client.ping().await.expect("ping answered");
    let list: ListSessionsResult = client
        .request("listSessions", json!({"channel": "ahp-root://"}))
        .await
        .expect("listSessions answered");
    let uris: Vec<&str> = list.items.iter().map(|s| s.resource.as_str()).collect();
    assert_eq!(
        uris,
        [
            "ahp-session:/alpha-3",
            "ahp-session:/alpha-2",
            "ahp-session:/alpha-1"
        ]
    );
    assert!(list.next_cursor.is_none());
}

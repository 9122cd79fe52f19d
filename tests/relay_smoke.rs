//! First end-to-end checks of the relay over TLS with the official client.

mod common;

use ahp_types::commands::ListSessionsResult;
use common::relay::TestRelay;
use common::*;
use serde_json::json;

#[tokio::test]
async fn lists_sessions_of_every_host_with_distinct_uris() {
    let t = TestRelay::start(vec![fast_config("alpha", 2), fast_config("beta", 2)], "").await;
    let client = t.client_init("alice", "c1").await;
    let list: ListSessionsResult = client
        .request("listSessions", json!({"channel": "ahp-root://"}))
        .await
        .expect("listSessions through the relay");
    let mut uris: Vec<String> = list.items.iter().map(|s| s.resource.clone()).collect();
    uris.sort();
    assert_eq!(
        uris,
        [
            "ahp-session:/alpha~alpha-1",
            "ahp-session:/alpha~alpha-2",
            "ahp-session:/beta~beta-1",
            "ahp-session:/beta~beta-2"
        ]
    );
    let providers: std::collections::BTreeSet<&str> =
        list.items.iter().map(|s| s.provider.as_str()).collect();
    assert_eq!(
        providers.into_iter().collect::<Vec<_>>(),
        ["sim.alpha", "sim.beta"]
    );
}

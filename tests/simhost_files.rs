//! The simulated host's files: the sandbox folder behind its `file:` URIs,
//! the `resource*` commands over it, refusal of paths outside it, resource
//! watches, and content references for large tool output.

mod common;

use ahp_relay::simhost::SimHost;
use ahp_relay::simhost::clock::now_iso;
use ahp_relay::simhost::files::file_uri;
use common::*;
use serde_json::{Value, json};

const ROOT: &str = "ahp-root://";

async fn files_host(name: &str) -> (SimHost, RawWs) {
    let host = start_host(fast_config(name, 1)).await;
    let mut ws = RawWs::connect(&host.url()).await;
    ws.initialize(&format!("{name}-client")).await;
    (host, ws)
}

/// Sends `method` with `params` (plus the root channel) and returns the response.
async fn call(ws: &mut RawWs, id: u64, method: &str, mut params: Value) -> Value {
    params["channel"] = json!(ROOT);
    ws.request(id, method, params).await
}

fn code(resp: &Value) -> i64 {
    resp["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("expected an error, got {resp}"))
}

fn ok(resp: &Value) -> &Value {
    assert!(resp.get("error").is_none(), "expected a result, got {resp}");
    &resp["result"]
}

/// Seeded sessions work in folders of the sandbox, which `resourceList` shows.
#[tokio::test]
async fn sessions_have_working_directories_in_the_sandbox() {
    let (host, mut ws) = files_host("fwd").await;
    let sandbox = host.sandbox();
    let session = host.channel_state("ahp-session:/fwd-1").expect("session");
    let dir = session["workingDirectories"][0]
        .as_str()
        .expect("a working dir");
    assert_eq!(dir, file_uri(&sandbox.join("workspace-1")));
    let listed = call(
        &mut ws,
        1,
        "resourceList",
        json!({"uri": file_uri(&sandbox)}),
    )
    .await;
    assert_eq!(
        ok(&listed)["entries"],
        json!([{"name": "workspace-1", "type": "directory"}])
    );
}

/// Write, read and resolve behave as the spec says: `createOnly`,
/// `append`, `ifMatch` with its error codes.
#[tokio::test]
async fn write_read_resolve_round_trip_with_spec_errors() {
    let (host, mut ws) = files_host("frt").await;
    let base = host.sandbox().join("workspace-1");
    let a = file_uri(&base.join("a.txt"));
    let w = call(
        &mut ws,
        1,
        "resourceWrite",
        json!({"uri": a, "data": "hello", "encoding": "utf-8"}),
    )
    .await;
    ok(&w);
    let r = call(&mut ws, 2, "resourceRead", json!({"uri": a})).await;
    assert_eq!(ok(&r)["data"], "hello");
    assert_eq!(ok(&r)["encoding"], "utf-8");
    let again = json!({"uri": a, "data": "x", "encoding": "utf-8", "createOnly": true});
    assert_eq!(
        code(&call(&mut ws, 3, "resourceWrite", again).await),
        -32010
    );
    let res = call(&mut ws, 4, "resourceResolve", json!({"uri": a})).await;
    assert_eq!(ok(&res)["type"], "file");
    assert_eq!(ok(&res)["size"], 5);
    let etag = ok(&res)["etag"].clone();
    let append =
        json!({"uri": a, "data": "!", "encoding": "utf-8", "mode": "append", "ifMatch": etag});
    ok(&call(&mut ws, 5, "resourceWrite", append).await);
    let stale = json!({"uri": a, "data": "?", "encoding": "utf-8", "ifMatch": etag});
    assert_eq!(
        code(&call(&mut ws, 6, "resourceWrite", stale).await),
        -32011
    );
    assert_eq!(
        std::fs::read_to_string(base.join("a.txt")).expect("file"),
        "hello!"
    );
}

/// `resourceMkdir` is `mkdir -p`; copy, move and delete honour
/// `failIfExists` and `recursive`; a deleted path reads as NotFound.
#[tokio::test]
async fn mkdir_copy_move_delete_follow_the_spec() {
    let (host, mut ws) = files_host("fcmd").await;
    let base = host.sandbox().join("workspace-1");
    std::fs::write(base.join("a.txt"), "hello!").expect("seed file");
    let a = file_uri(&base.join("a.txt"));
    let deep = file_uri(&base.join("d/e/f"));
    ok(&call(&mut ws, 7, "resourceMkdir", json!({"uri": deep})).await);
    assert!(base.join("d/e/f").is_dir());
    assert_eq!(
        code(&call(&mut ws, 8, "resourceMkdir", json!({"uri": a})).await),
        -32010
    );
    let b = file_uri(&base.join("d/b.txt"));
    ok(&call(
        &mut ws,
        9,
        "resourceCopy",
        json!({"source": a, "destination": b}),
    )
    .await);
    let exists = json!({"source": a, "destination": b, "failIfExists": true});
    assert_eq!(
        code(&call(&mut ws, 10, "resourceCopy", exists).await),
        -32010
    );
    let c = file_uri(&base.join("c.txt"));
    ok(&call(
        &mut ws,
        11,
        "resourceMove",
        json!({"source": b, "destination": c}),
    )
    .await);
    assert!(!base.join("d/b.txt").exists());
    assert_eq!(
        std::fs::read_to_string(base.join("c.txt")).expect("moved"),
        "hello!"
    );
    let d = file_uri(&base.join("d"));
    assert_eq!(
        code(&call(&mut ws, 12, "resourceDelete", json!({"uri": d})).await),
        -32602
    );
    ok(&call(
        &mut ws,
        13,
        "resourceDelete",
        json!({"uri": d, "recursive": true}),
    )
    .await);
    assert!(!base.join("d").exists());
    assert_eq!(
        code(&call(&mut ws, 14, "resourceRead", json!({"uri": d})).await),
        -32008
    );
    let listed = call(&mut ws, 15, "resourceList", json!({"uri": file_uri(&base)})).await;
    let names: Vec<&str> = ok(&listed)["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert_eq!(names, ["a.txt", "c.txt"]);
}

/// Paths outside the sandbox — absolute, by `..`, or through a symlink —
/// are refused with PermissionDenied (-32009), `resourceRequest` included;
/// inside, `resourceRequest` is granted.
#[tokio::test]
async fn paths_outside_the_sandbox_are_refused() {
    let (host, mut ws) = files_host("fout").await;
    let sandbox = host.sandbox();
    let outside = tempdir_outside("fout");
    std::fs::write(outside.join("secret.txt"), "s").expect("outside file");
    let link = sandbox.join("workspace-1/escape");
    std::os::unix::fs::symlink(&outside, &link).expect("symlink");
    let tries = [
        file_uri(&outside.join("secret.txt")),
        format!("{}/../../../etc/hostname", file_uri(&sandbox)),
        file_uri(&link.join("secret.txt")),
    ];
    for (i, uri) in tries.iter().enumerate() {
        let id = 10 * i as u64;
        assert_eq!(
            code(&call(&mut ws, id + 1, "resourceRead", json!({"uri": uri})).await),
            -32009,
            "{uri}"
        );
        let w = json!({"uri": uri, "data": "x", "encoding": "utf-8"});
        assert_eq!(
            code(&call(&mut ws, id + 2, "resourceWrite", w).await),
            -32009,
            "{uri}"
        );
        let req = json!({"uri": uri, "read": true});
        assert_eq!(
            code(&call(&mut ws, id + 3, "resourceRequest", req).await),
            -32009,
            "{uri}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(outside.join("secret.txt")).expect("kept"),
        "s"
    );
    let inside =
        json!({"uri": file_uri(&sandbox.join("workspace-1")), "read": true, "write": true});
    assert_eq!(
        ok(&call(&mut ws, 99, "resourceRequest", inside).await),
        &json!({})
    );
    let _ = std::fs::remove_dir_all(outside);
}

fn tempdir_outside(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("simhost-outside-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("outside dir");
    dir
}

/// Sends `method` and returns the change items of every
/// `resourceWatch/changed` on `channel` that came before its response (a
/// host queues the envelopes a command causes before the command's answer).
async fn changes_of(
    ws: &mut RawWs,
    id: u64,
    method: &str,
    mut params: Value,
    channel: &str,
) -> Vec<Value> {
    params["channel"] = json!(ROOT);
    ws.send_json(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
        .await;
    let mut items = Vec::new();
    loop {
        let f = ws.recv_json().await.expect("socket open");
        if f["id"] == id {
            ok(&f);
            return items;
        }
        if f["method"] == "action" && f["params"]["channel"] == channel {
            assert_eq!(f["params"]["action"]["type"], "resourceWatch/changed");
            items.extend(
                f["params"]["action"]["changes"]["items"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default(),
            );
        }
    }
}

/// A watch reports files added, updated and deleted through `resourceWrite`
/// and `resourceDelete` — direct children only unless recursive — and is
/// released when its subscriber leaves.
#[tokio::test]
async fn watches_report_changes_made_through_resource_commands() {
    let (host, mut ws) = files_host("fwatch").await;
    let base = host.sandbox().join("workspace-1");
    std::fs::create_dir_all(base.join("sub")).expect("sub");
    let made = call(
        &mut ws,
        1,
        "createResourceWatch",
        json!({"uri": file_uri(&base)}),
    )
    .await;
    let channel = ok(&made)["channel"].as_str().expect("channel").to_string();
    assert!(channel.starts_with("ahp-resource-watch:/"), "{channel}");
    let sub = ws
        .request(2, "subscribe", json!({"channel": channel}))
        .await;
    assert_eq!(ok(&sub)["snapshot"]["state"]["root"], file_uri(&base));
    assert_eq!(ok(&sub)["snapshot"]["state"]["recursive"], false);
    let f = file_uri(&base.join("new.txt"));
    let deep = file_uri(&base.join("sub/deep.txt"));
    let write = |uri: &str| json!({"uri": uri, "data": "1", "encoding": "utf-8"});
    let seen = changes_of(&mut ws, 3, "resourceWrite", write(&f), &channel).await;
    assert_eq!(seen, [json!({"uri": f, "type": "added"})]);
    let seen = changes_of(&mut ws, 4, "resourceWrite", write(&deep), &channel).await;
    assert_eq!(
        seen,
        Vec::<Value>::new(),
        "not a direct child of a non-recursive watch"
    );
    let seen = changes_of(&mut ws, 5, "resourceWrite", write(&f), &channel).await;
    assert_eq!(seen, [json!({"uri": f, "type": "updated"})]);
    let seen = changes_of(&mut ws, 6, "resourceDelete", json!({"uri": f}), &channel).await;
    assert_eq!(seen, [json!({"uri": f, "type": "deleted"})]);
    ws.send_json(
        &json!({"jsonrpc": "2.0", "method": "unsubscribe", "params": {"channel": channel}}),
    )
    .await;
    let again = ws
        .request(7, "subscribe", json!({"channel": channel}))
        .await;
    assert_eq!(code(&again), -32008, "released watch: {again}");
}

/// A tool output above `inline_output_max` comes as a content reference
/// that `resourceRead` returns in full; a small one comes inline.
#[tokio::test]
async fn large_tool_output_is_a_readable_content_reference() {
    let mut cfg = fast_config("fref", 1);
    cfg.inline_output_max = 1000;
    let host = start_host(cfg).await;
    let mut ws = RawWs::connect(&host.url()).await;
    ws.initialize("fref-client").await;
    let chat = "ahp-chat:/fref-1-main";
    ws.request(1, "subscribe", json!({"channel": chat})).await;
    let mut results = Vec::new();
    for (i, bytes) in [(1, 5000), (2, 200)] {
        let turn = json!({"type": "chat/turnStarted", "turnId": format!("t{i}"), "startedAt": now_iso(),
            "message": {"text": format!("build [tool-output:{bytes}]"), "origin": {"kind": "user"}}});
        ws.send_json(&json!({"jsonrpc": "2.0", "method": "dispatchAction",
            "params": {"channel": chat, "clientSeq": i, "action": turn}}))
            .await;
        loop {
            let f = ws.recv_json().await.expect("open");
            if f["params"]["action"]["type"] == "chat/toolCallComplete" {
                results.push(f["params"]["action"]["result"]["content"][0].clone());
            }
            if f["params"]["action"]["type"] == "chat/turnComplete" {
                break;
            }
        }
    }
    let big = &results[0];
    assert_eq!(big["type"], "resource", "{big}");
    assert_eq!(big["sizeHint"], 5000);
    let uri = big["uri"].as_str().expect("uri");
    assert!(uri.starts_with("ahp-content:/"), "{uri}");
    let read = call(&mut ws, 9, "resourceRead", json!({"uri": uri})).await;
    assert_eq!(ok(&read)["data"].as_str().map(str::len), Some(5000));
    assert_eq!(results[1]["type"], "text");
    assert_eq!(results[1]["text"].as_str().map(str::len), Some(200));
    let missing = call(
        &mut ws,
        10,
        "resourceRead",
        json!({"uri": "ahp-content:/999"}),
    )
    .await;
    assert_eq!(code(&missing), -32008);
}

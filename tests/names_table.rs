//! Every row of the rewrite table round-trips with the URI a real host puts
//! in that field (contract §4.3): `file:` working directories and edits,
//! VS Code's provider-scheme sessions and authority-form chats, content
//! references, terminals, templates — and the rows the table gained for
//! `ahp-types` 1.0.0 are checked one by one with realistic payloads.

use ahp_relay::names::namer::{ToClient, ToHost};
use ahp_relay::names::qualify;
use ahp_relay::names::store::{RedbStore, UriStore};
use ahp_relay::names::translate::{self, FieldKind, Row, TABLE};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};

const UP: &str = "r1.AAAAAAAAAAA.BBBBBBBBBBBBBBBB";
const OWN: &str = "my-client";

fn chat(session: &str) -> String {
    format!(
        "ahp-chat://default/{}",
        URL_SAFE_NO_PAD.encode(session.as_bytes())
    )
}

/// The host-form value a real host puts in a URI field at `path`.
fn sample(path: &str) -> String {
    let last = path
        .rsplit('.')
        .next()
        .unwrap_or(path)
        .trim_end_matches("[]");
    let file = [
        "workingDirector",
        "directory",
        "replacement",
        "cwd",
        "root",
        "uri",
    ];
    if path.ends_with("content.uri") || path.starts_with("toolInput") {
        "ahp-content:/c1".into()
    } else if last.to_lowercase().contains("chat") || last == "after" {
        chat("copilot:/s1")
    } else if last.to_lowercase().contains("session") || last == "run" {
        "copilot:/s1".into()
    } else if last == "terminal" {
        "ahp-terminal:/t1".into()
    } else if last == "channel" {
        "ahp-resource-watch:/w1".into()
    } else if file.iter().any(|f| last.starts_with(f)) {
        "file:///work/x1".into()
    } else {
        "ahp-session:/x1".into()
    }
}

fn host_value(path: &str, kind: FieldKind) -> String {
    match kind {
        FieldKind::Uri | FieldKind::Ref => sample(path),
        FieldKind::UriTemplate => "ahp-changeset:/s1/{turnId}".into(),
        FieldKind::Published => "file:///Users/me/plugin".into(),
        FieldKind::Provider => "copilot".into(),
        FieldKind::ClientId => UP.into(),
    }
}

fn client_value(path: &str, kind: FieldKind) -> String {
    match kind {
        FieldKind::Uri | FieldKind::Ref => {
            qualify::qualify("a", &sample(path), |_| false).expect("qualifiable")
        }
        FieldKind::UriTemplate => "ahp-changeset:/a~s1/{turnId}".into(),
        FieldKind::Published => "file:///Users/me/plugin".into(),
        FieldKind::Provider => "copilot.a".into(),
        FieldKind::ClientId => OWN.into(),
    }
}

/// The value at `path` (`a.b[].c`) below `at`, creating objects and
/// one-element arrays; returns its JSON pointer too.
fn slot<'a>(at: &'a mut Value, path: &str, ptr: &mut String) -> &'a mut Value {
    let mut cur = at;
    for step in path.split('.') {
        let (key, each) = match step.strip_suffix("[]") {
            Some(k) => (k, true),
            None => (step, false),
        };
        if !cur.is_object() {
            *cur = json!({});
        }
        ptr.push('/');
        ptr.push_str(key);
        cur = cur
            .as_object_mut()
            .map(|o| o.entry(key.to_string()).or_insert(Value::Null))
            .expect("object");
        if each {
            if !cur.is_array() {
                *cur = json!([Value::Null]);
            }
            ptr.push_str("/0");
            cur = cur.get_mut(0).expect("one element");
        }
    }
    cur
}

/// Builds `shape` into `at`, returning (pointer, client value) per leaf.
fn build(shape: &str, at: &mut Value, base: &str, depth: usize) -> Vec<(String, String)> {
    assert!(depth < 16, "{shape} nests too deep");
    let mut leaves = Vec::new();
    for row in translate::rows(shape).unwrap_or_else(|| panic!("unknown {shape}")) {
        let mut ptr = base.to_string();
        match *row {
            Row::Field(path, kind) => {
                *slot(at, path, &mut ptr) = json!(host_value(path, kind));
                leaves.push((ptr, client_value(path, kind)));
            }
            Row::Nested(path, inner) => {
                let s = slot(at, path, &mut ptr);
                if !s.is_object() {
                    *s = json!({});
                }
                let inner_base = ptr.clone();
                leaves.extend(build(inner, s, &inner_base, depth + 1));
            }
        }
    }
    leaves
}

fn namers(store: &RedbStore) -> (ToClient<'_>, ToHost<'_>, ToHost<'_>) {
    let c = ToClient {
        host: "a",
        store: store as &dyn UriStore,
        identity: Some((UP, OWN)),
    };
    let h = |host| ToHost {
        host,
        store: store as &dyn UriStore,
        identity: (UP, OWN),
    };
    (c, h("a"), h("b"))
}

/// Every row, with realistic values: host → client gives exactly the
/// qualified form, client → host gives the host form back, and the same
/// client form sent to another host fails.
#[test]
fn every_row_round_trips_with_real_uri_shapes() {
    let store = RedbStore::open_in_memory().expect("store");
    let (to_client, to_a, to_b) = namers(&store);
    let mut leaves_total = 0;
    for (shape, _) in TABLE {
        let mut host_form = json!({});
        let leaves = build(shape, &mut host_form, "", 0);
        leaves_total += leaves.len();
        let mut client_form = host_form.clone();
        translate::translate(&mut client_form, shape, &to_client)
            .unwrap_or_else(|e| panic!("{shape}: {e}"));
        for (ptr, want) in &leaves {
            assert_eq!(
                client_form.pointer(ptr),
                Some(&json!(want)),
                "{shape} {ptr}"
            );
        }
        let mut back = client_form.clone();
        translate::translate(&mut back, shape, &to_a).unwrap_or_else(|e| panic!("{shape}: {e}"));
        assert_eq!(back, host_form, "{shape} round trip");
        let names_a = leaves.iter().any(|(_, v)| {
            v.contains("a~")
                || v.contains(".a:/")
                || v.ends_with(".a")
                || v.starts_with("file://a/")
        });
        let names_a = names_a || leaves.iter().any(|(_, v)| v.starts_with("ahp-chat://"));
        let mut other = client_form.clone();
        assert_eq!(
            translate::translate(&mut other, shape, &to_b).is_err(),
            names_a,
            "{shape}: host a's names sent to host b"
        );
    }
    assert!(leaves_total > 150, "only {leaves_total} leaves");
}

fn round_trip(shape: &str, host: Value, client: Value) {
    let store = RedbStore::open_in_memory().expect("store");
    let (to_client, to_a, to_b) = namers(&store);
    let mut c = host.clone();
    translate::translate(&mut c, shape, &to_client).expect("to client");
    assert_eq!(c, client, "{shape} to client");
    let mut h = c.clone();
    translate::translate(&mut h, shape, &to_a).expect("to host");
    assert_eq!(h, host, "{shape} back to host");
    assert!(
        translate::translate(&mut c, shape, &to_b).is_err(),
        "{shape} to another host"
    );
}

#[test]
fn completions_attachments_round_trip() {
    round_trip(
        "result:completions",
        json!({"items": [{"insertText": "x", "attachment": {"type": "resource",
            "uri": "file:///w/a.rs", "_meta": {"k": "file:///w/a.rs"}}}]}),
        json!({"items": [{"insertText": "x", "attachment": {"type": "resource",
            "uri": "file://a/w/a.rs", "_meta": {"k": "file:///w/a.rs"}}}]}),
    );
}

#[test]
fn tool_call_ready_input_and_edits() {
    round_trip(
        "chat/toolCallReady",
        json!({"toolInput": {"uri": "ahp-content:/9"}, "edits": {"items": [
            {"before": {"uri": "file:///w/f", "content": {"uri": "ahp-content:/1"}},
             "after": {"uri": "file:///w/f", "content": {"uri": "ahp-content:/2"}}}]}}),
        json!({"toolInput": {"uri": "ahp-content:/a~9"}, "edits": {"items": [
            {"before": {"uri": "file://a/w/f", "content": {"uri": "ahp-content:/a~1"}},
             "after": {"uri": "file://a/w/f", "content": {"uri": "ahp-content:/a~2"}}}]}}),
    );
    // An inline tool input is a string and is left alone.
    let store = RedbStore::open_in_memory().expect("store");
    let (to_client, _, _) = namers(&store);
    let mut v = json!({"toolInput": "{\"cmd\":\"ls\"}"});
    translate::translate(&mut v, "chat/toolCallReady", &to_client).expect("inline");
    assert_eq!(v["toolInput"], "{\"cmd\":\"ls\"}");
}

#[test]
fn changesets_templates_and_mcp_channels() {
    round_trip(
        "chat/changesetsChanged",
        json!({"changesets": [{"uriTemplate": "ahp-changeset:/s/{turnId}"}]}),
        json!({"changesets": [{"uriTemplate": "ahp-changeset:/a~s/{turnId}"}]}),
    );
    round_trip(
        "session/mcpServerStateChanged",
        json!({"channel": "mcp:/m1"}),
        json!({"channel": "mcp:/a~m1"}),
    );
}

#[test]
fn working_directories_terminals_and_customizations() {
    round_trip(
        "session/workingDirectoryReplaced",
        json!({"directory": "file:///w/1", "replacement": "file:///w/2"}),
        json!({"directory": "file://a/w/1", "replacement": "file://a/w/2"}),
    );
    round_trip(
        "terminal/cwdChanged",
        json!({"cwd": "file:///home/u"}),
        json!({"cwd": "file://a/home/u"}),
    );
    round_trip(
        "@Agent",
        json!({"provider": "copilot", "customizations": [{"type": "plugin",
            "uri": "file:///p", "clientId": UP,
            "enablement": [{"kind": "workspace", "uri": "file:///w", "enabled": true}]}]}),
        json!({"provider": "copilot.a", "customizations": [{"type": "plugin",
            "uri": "file://a/p", "clientId": OWN,
            "enablement": [{"kind": "workspace", "uri": "file://a/w", "enabled": true}]}]}),
    );
}

/// Client-published URIs (a client's own plugin folder) and external URIs
/// pass unchanged both ways.
#[test]
fn client_published_and_external_uris_pass_unchanged() {
    let store = RedbStore::open_in_memory().expect("store");
    let (to_client, to_a, _) = namers(&store);
    let client = json!({"activeClient": {"clientId": OWN, "customizations": [
        {"type": "plugin", "uri": "file:///Users/me/plugin"}]}});
    let mut host = client.clone();
    translate::translate(&mut host, "params:createSession", &to_a).expect("to host");
    assert_eq!(
        host["activeClient"]["customizations"][0]["uri"],
        "file:///Users/me/plugin"
    );
    assert_eq!(host["activeClient"]["clientId"], UP);
    let mut v = json!({"message": {"attachments": [
        {"type": "resource", "uri": "https://example.com/x"},
        {"type": "resource", "uri": "vscode-agent-client://c1/file/-/Users/me/a.txt"}]}});
    let want = v.clone();
    translate::translate(&mut v, "chat/turnStarted", &to_client).expect("to client");
    assert_eq!(v, want);
    translate::translate(&mut v, "chat/turnStarted", &to_a).expect("to host");
    assert_eq!(v, want);
}

/// A host URI that cannot be qualified reversibly fails the frame instead
/// of reaching the client bare.
#[test]
fn unqualifiable_host_uris_fail_the_frame() {
    let store = RedbStore::open_in_memory().expect("store");
    let (to_client, _, _) = namers(&store);
    for bad in [
        "file://fileserver/share/x",
        "ahp-chat://default/not-base64!",
        "ahp-widget://x/y",
    ] {
        let mut v = json!({"cwd": bad});
        assert!(
            translate::translate(&mut v, "terminal/cwdChanged", &to_client).is_err(),
            "{bad}"
        );
    }
}

/// Snapshots of provider-scheme sessions and authority-form chats get the
/// session and chat state shapes.
#[test]
fn state_shapes_follow_uri_shapes() {
    assert_eq!(translate::state_shape("copilot:/a~x"), Some("@Session"));
    assert_eq!(translate::state_shape(&chat("copilot:/a~x")), Some("@Chat"));
    assert_eq!(
        translate::state_shape("AHP-Terminal:/a~1"),
        Some("@Terminal")
    );
    assert_eq!(
        translate::state_shape("ahp-session:/a~x/annotations"),
        Some("@Annotations")
    );
    assert_eq!(
        translate::state_shape("ahp-changeset:/a~c"),
        Some("@ChangesetState")
    );
    assert_eq!(translate::state_shape("file://a/x"), None);
}

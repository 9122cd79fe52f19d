//! The method-table walk (contract §4.3, §4.4, §7.1; issue 18, Deliver 1):
//! every method of `route::methods::METHODS` and every URI-, provider- and
//! identity-bearing field of its params is translated and authorized, or
//! the request refused — checked over real sockets against two simulated
//! hosts that record every frame they receive.
//!
//! The fields are not listed here. They come from two sources, and each
//! checks the other:
//! - the rewrite table (`names::translate::TABLE`): every `params:<method>`
//!   row, expanded through its nested shapes to leaf paths, is walked —
//!   a row whose method the relay does not know must be refused (-32601);
//! - `tests/data/ahp-surface.md` (a copy of `../shared/ahp/surface.md`, the
//!   wire surface of `ahp-types` 1.0.0): every `XxxParams.field` its §3a
//!   names for a method of the table must have a rewrite-table row, be the
//!   routing `channel`, or be one of the few fields the relay answers
//!   itself ([`RELAY_FIELDS`], each with its own check below).
//!
//! For each (method, field) the request is sent from mallory — operator on
//! h1 (visibility own, plus `files:write`), viewer on h2 — once with a
//! benign value (her own object on h1: the field must reach h1 in h1's
//! names, or be dropped by the method's typed params; never refused), and
//! once with each hostile value: another tenant's object, another host's
//! object, a bare host form, a content reference never shown, a foreign
//! provider, another client's identity. A hostile request must be refused
//! with a JSON-RPC error, or reach only the host that owns the value, in
//! that host's names, where mallory holds the method's permission (h2 for
//! reading). Every method of the table needs a base request here (or is
//! answered by the relay and checked on its own): a new method without one
//! fails [`the_walk_covers_every_method_and_every_surface_field`].

mod common;

use std::collections::BTreeSet;

use ahp_relay::names::translate::{FieldKind, Row, TABLE, rows};
use ahp_relay::policy::Permission;
use ahp_relay::route::methods::{self, Handling, METHODS, Need};
use ahp_relay::simhost::SimHost;
use common::relay::{TestRelay, rule};
use common::*;
use serde_json::{Value, json};

const ALICE_SESSION: &str = "ahp-session:/alice-s";
const ALICE_CHAT: &str = "ahp-chat:/alice-c";
const ALICE_TERM: &str = "ahp-terminal:/alice-t";
const M_SESSION: &str = "ahp-session:/m-s";
const M_CHAT: &str = "ahp-chat:/m-c";
const M_TERM: &str = "ahp-terminal:/m-t";
const M_CLIENT: &str = "m1";
const RESOURCE: &str = "https://api.example.com";

// ─── the fields, from the rewrite table and the surface ─────────────────────

/// One step of a field path: a key, and whether it steps into every
/// element of an array (`a[]`).
#[derive(Debug, Clone)]
struct Seg {
    key: String,
    each: bool,
}

/// A leaf field of a `params:<method>` row, expanded through nested shapes.
#[derive(Debug, Clone)]
struct Leaf {
    path: Vec<Seg>,
    kind: FieldKind,
}

impl Leaf {
    fn dotted(&self) -> String {
        self.path
            .iter()
            .map(|s| format!("{}{}", s.key, if s.each { "[]" } else { "" }))
            .collect::<Vec<_>>()
            .join(".")
    }
}

fn segs(path: &str) -> Vec<Seg> {
    path.split('.')
        .map(|s| match s.strip_suffix("[]") {
            Some(k) => Seg {
                key: k.into(),
                each: true,
            },
            None => Seg {
                key: s.into(),
                each: false,
            },
        })
        .collect()
}

/// Every leaf of `shape` below `prefix` (the table has no cycles; the depth
/// bound would catch one).
fn leaves(shape: &str, prefix: &[Seg], depth: usize) -> Vec<Leaf> {
    assert!(depth < 12, "the rewrite table nests {shape} too deep");
    let mut out = Vec::new();
    for row in rows(shape).unwrap_or_else(|| panic!("no rows for {shape}")) {
        match row {
            Row::Field(path, kind) => {
                let mut p = prefix.to_vec();
                p.extend(segs(path));
                out.push(Leaf {
                    path: p,
                    kind: *kind,
                });
            }
            Row::Nested(path, inner) => {
                let mut p = prefix.to_vec();
                p.extend(segs(path));
                out.extend(leaves(inner, &p, depth + 1));
            }
        }
    }
    out
}

/// The methods the rewrite table has a `params:` row for.
fn table_methods() -> Vec<&'static str> {
    TABLE
        .iter()
        .filter_map(|(shape, _)| shape.strip_prefix("params:"))
        .collect()
}

/// `Resource{Read,Write}Params` → both; `ResourceCopy/MoveParams` →
/// `ResourceCopyParams`, `ResourceMoveParams`.
fn expand_type(t: &str) -> Vec<String> {
    if let (Some(open), Some(close)) = (t.find('{'), t.find('}')) {
        let (head, tail) = (&t[..open], &t[close + 1..]);
        return t[open + 1..close]
            .split(',')
            .map(|m| format!("{head}{m}{tail}"))
            .collect();
    }
    let alts: Vec<&str> = t.split('/').collect();
    let Some(first) = alts.first() else {
        return vec![];
    };
    let base = first.trim_end_matches("Params");
    // The stem before the last camel-case word: `ResourceCopy` → `Resource`.
    let cut = base.rfind(|c: char| c.is_ascii_uppercase()).unwrap_or(0);
    let stem = &base[..cut];
    alts.iter()
        .enumerate()
        .map(|(i, a)| {
            let a = a.trim_end_matches("Params");
            if i == 0 {
                format!("{a}Params")
            } else {
                format!("{stem}{a}Params")
            }
        })
        .collect()
}

/// The (method, field) pairs §3a of the surface names: every
/// `` `XxxParams.field` `` token of its table, with `{a,b}` and `a/b`
/// alternatives expanded and `` `.after` `` continuing the previous path.
fn surface_fields() -> BTreeSet<(String, String)> {
    let text = include_str!("data/ahp-surface.md");
    let start = text.find("### 3a.").expect("surface §3a");
    let end = text[start..].find("### 3b.").expect("surface §3b") + start;
    let mut out = BTreeSet::new();
    for line in text[start..end].lines().filter(|l| l.starts_with("| `")) {
        let first_cell = line.split('|').nth(1).unwrap_or_default();
        let mut last: Vec<(String, String)> = Vec::new();
        for tok in first_cell.split('`').skip(1).step_by(2) {
            if let Some(cont) = tok.strip_prefix('.') {
                let more: Vec<(String, String)> = last
                    .iter()
                    .map(|(m, f)| {
                        let parent = f.rsplit_once('.').map_or("", |(p, _)| p);
                        (m.clone(), format!("{parent}.{cont}"))
                    })
                    .collect();
                out.extend(more);
                continue;
            }
            let Some((ty, field)) = tok
                .split_once("Params.")
                .map(|(t, f)| (format!("{t}Params"), f))
            else {
                continue;
            };
            if ty.starts_with('*') || ty.contains(' ') {
                continue;
            }
            last.clear();
            for t in expand_type(&ty) {
                let name = t.trim_end_matches("Params");
                let mut chars = name.chars();
                let method = match chars.next() {
                    Some(c) => c.to_ascii_lowercase().to_string() + chars.as_str(),
                    None => continue,
                };
                for f in field.split('/') {
                    last.push((method.clone(), f.to_string()));
                }
            }
            out.extend(last.iter().cloned());
        }
    }
    out
}

/// Fields §3a names that carry no host name to translate: the relay
/// answers or routes by them itself, each checked by its own test here.
const RELAY_FIELDS: &[(&str, &str, &str)] = &[
    (
        "initialize",
        "initialSubscriptions[]",
        "split per host, each authorized: initial_subscriptions_are_authorized",
    ),
    (
        "reconnect",
        "subscriptions[]",
        "answered by the relay: a_reconnect_names_only_what_it_may_see",
    ),
    (
        "createChat",
        "chat",
        "a client-chosen URI, reserved: client_chosen_uris_are_checked_free",
    ),
    (
        "createSession",
        "progressToken",
        "a correlation token, kept (root/progress goes to its client)",
    ),
    (
        "authenticate",
        "resource",
        "an RFC 9728 id, routes the token: authenticate_reaches_only_operated_hosts",
    ),
];

/// Whether the rewrite table has a row for `field` of `method` (the field
/// itself, a nested shape holding it, or a row inside it).
fn table_covers(method: &str, field: &str) -> bool {
    let Some(rows) = rows(&format!("params:{method}")) else {
        return false;
    };
    rows.iter().any(|r| {
        let p = match r {
            Row::Field(p, _) | Row::Nested(p, _) => *p,
        };
        p == field || field.starts_with(&format!("{p}.")) || p.starts_with(&format!("{field}."))
    })
}

// ─── the world ──────────────────────────────────────────────────────────────

struct World {
    t: TestRelay,
    mallory: RawWs,
    up: String,
    next_id: u64,
    n: u64,
    /// `file://h1/<sandbox>/walk.txt` and its host form.
    file: (String, String),
    /// A file of h2's sandbox, client form.
    h2_file: String,
}

/// Hosts h1 and h2 (one seeded session each, both declaring [`RESOURCE`]);
/// alice (operator, own, on both) made a session, chat and terminal on h1;
/// mallory (operator with `files:write` and visibility own on h1, viewer
/// with visibility all on h2) made her own on h1 and reads h2's session.
async fn world() -> World {
    let rules = rule("alice", &["alice"], &["h1", "h2"], "operator", "own", "")
        + &rule(
            "mallory-h1",
            &["mallory"],
            &["h1"],
            "operator",
            "own",
            "permissions = [\"files:write\"]",
        )
        + &rule("mallory-h2", &["mallory"], &["h2"], "viewer", "all", "");
    let host = |name: &str| {
        let mut c = fast_config(name, 1);
        c.protected_resources = vec![RESOURCE.into()];
        c
    };
    // The walk sends a few hundred requests on one socket at once: above
    // the default rate limit, which is not what it tests.
    let limits = "\n[limits]\nrequests_per_second = 100000\nrequest_burst = 100000\n";
    let t = TestRelay::start(vec![host("h1"), host("h2")], &(rules + limits)).await;
    let mut alice = t.raw("alice").await;
    alice.initialize("al").await;
    make_objects(&mut alice, ALICE_SESSION, ALICE_CHAT, ALICE_TERM).await;
    let mut mallory = t.raw("mallory").await;
    mallory.initialize(M_CLIENT).await;
    make_objects(&mut mallory, M_SESSION, M_CHAT, M_TERM).await;
    let up = t.upstream_id("mallory", M_CLIENT);
    let sandbox = |h: &SimHost| h.sandbox().to_string_lossy().to_string();
    let (s1, s2) = (sandbox(&t.hosts[0]), sandbox(&t.hosts[1]));
    World {
        file: (
            format!("file://h1{s1}/walk.txt"),
            format!("file://{s1}/walk.txt"),
        ),
        h2_file: format!("file://h2{s2}/walk.txt"),
        t,
        mallory,
        up,
        next_id: 100,
        n: 0,
    }
}

async fn make_objects(ws: &mut RawWs, session: &str, chat: &str, term: &str) {
    for (id, method, params) in [
        (
            1,
            "createSession",
            json!({"channel": session, "provider": "sim.h1"}),
        ),
        (2, "createChat", json!({"channel": session, "chat": chat})),
        (
            3,
            "createTerminal",
            json!({"channel": term, "claim": {"kind": "session", "session": session, "chat": chat}}),
        ),
    ] {
        let r = ws.request(id, method, params).await;
        assert_eq!(r.get("result"), Some(&Value::Null), "{method}: {r}");
    }
}

impl World {
    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn fresh(&mut self, scheme: &str) -> String {
        self.n += 1;
        format!("{scheme}:/walk-{}", self.n)
    }

    /// Mallory's request of `method` that names only her own objects on h1
    /// (`None`: answered by the relay, checked on its own).
    fn base(&mut self, method: &str) -> Option<Value> {
        let file = self.file.0.clone();
        let root = ROOT;
        Some(match method {
            "subscribe" | "disposeSession" => json!({"channel": M_SESSION}),
            "fetchTurns" | "disposeChat" => json!({"channel": M_CHAT}),
            "completions" => {
                json!({"channel": M_CHAT, "kind": "userMessage", "text": "", "offset": 0})
            }
            "disposeTerminal" => json!({"channel": M_TERM}),
            "createSession" => json!({"channel": self.fresh("ahp-session"), "provider": "sim.h1"}),
            "createChat" => json!({"channel": M_SESSION, "chat": self.fresh("ahp-chat")}),
            "createTerminal" => json!({"channel": self.fresh("ahp-terminal"),
                "claim": {"kind": "session", "session": M_SESSION, "chat": M_CHAT}}),
            "moveChat" => json!({"channel": M_CHAT,
                "destination": {"kind": "session", "session": M_SESSION}}),
            "resolveSessionConfig" => json!({"channel": root, "provider": "sim.h1"}),
            "sessionConfigCompletions" => {
                json!({"channel": root, "provider": "sim.h1", "property": "model"})
            }
            "resourceRead"
            | "resourceList"
            | "resourceResolve"
            | "resourceRequest"
            | "resourceDelete"
            | "resourceMkdir"
            | "createResourceWatch" => {
                json!({"channel": root, "uri": file})
            }
            "resourceWrite" => {
                json!({"channel": root, "uri": file, "data": "x", "encoding": "utf-8"})
            }
            "resourceCopy" | "resourceMove" => {
                json!({"channel": root, "source": file, "destination": file})
            }
            _ => return None,
        })
    }

    /// The benign value of a field: mallory's own object of the kind the
    /// field names, on h1; and what h1 must receive.
    fn benign(&self, leaf: &Leaf) -> (String, String) {
        let last = leaf.path.last().map_or("", |s| s.key.as_str());
        match leaf.kind {
            FieldKind::Provider => ("sim.h1".into(), "sim".into()),
            FieldKind::ClientId => (M_CLIENT.into(), self.up.clone()),
            FieldKind::Published => ("virtual://m1/p".into(), "virtual://m1/p".into()),
            _ => {
                let v = match last {
                    "session" => M_SESSION.to_string(),
                    "chat" | "after" | "resource" => M_CHAT.to_string(),
                    _ => return self.file.clone(),
                };
                (v.clone(), v)
            }
        }
    }

    /// Hostile values of a field of `kind`, each with the host that owns it
    /// (if any) and its form there.
    fn hostile(&self, kind: FieldKind) -> Vec<Hostile> {
        let h = |value: &str, owner: Option<(&str, &str)>| Hostile {
            value: value.into(),
            owner: owner.map(|(h, f)| (h.to_string(), f.to_string())),
        };
        let h2_file_host = self.h2_file.replacen("file://h2/", "file:///", 1);
        match kind {
            FieldKind::Provider => vec![h("sim.h2", Some(("h2", "sim"))), h("sim.h3", None)],
            FieldKind::ClientId => {
                let alice_up = self.t.upstream_id("alice", "al");
                vec![h("al", None), h(&alice_up, None), h("r1.x.y", None)]
            }
            FieldKind::Published => vec![],
            FieldKind::Uri | FieldKind::Ref | FieldKind::UriTemplate => vec![
                h(ALICE_SESSION, None),
                h(ALICE_CHAT, None),
                h(ALICE_TERM, None),
                h("ahp-session:/h2~h2-1", Some(("h2", "ahp-session:/h2-1"))),
                h(
                    "ahp-chat:/h2~h2-1-main",
                    Some(("h2", "ahp-chat:/h2-1-main")),
                ),
                h(&self.h2_file, Some(("h2", &h2_file_host))),
                h("ahp-chat:/h1-1-main", None),
                h("ahp-content:/h1~c1", Some(("h1", "ahp-content:/c1"))),
            ],
        }
    }

    /// Frames of `method` from mallory's links, per host.
    fn at_hosts(&self, method: &str) -> Vec<Vec<Value>> {
        self.t
            .hosts
            .iter()
            .map(|h| {
                h.received_from(&self.up)
                    .iter()
                    .filter(|f| f.method.as_deref() == Some(method))
                    .map(|f| serde_json::from_str(&f.text).expect("recorded frame is JSON"))
                    .collect()
            })
            .collect()
    }

    /// Sends `params`; the answer and, per host, the frames of `method` it
    /// caused (a host answers after every frame before it, so the frames
    /// are recorded once the answer is here).
    async fn send(&mut self, method: &str, params: Value) -> (Value, Vec<Vec<Value>>) {
        let before: Vec<usize> = self.at_hosts(method).iter().map(Vec::len).collect();
        let id = self.id();
        let r = self.mallory.request(id, method, params).await;
        let after = self.at_hosts(method);
        let new = after
            .into_iter()
            .zip(before)
            .map(|(v, b)| v.into_iter().skip(b).collect())
            .collect();
        (r, new)
    }
}

/// A hostile value and, when a host owns it, that host and the value's form there.
struct Hostile {
    value: String,
    owner: Option<(String, String)>,
}

const HOSTS: [&str; 2] = ["h1", "h2"];

/// What mallory may do on `host` with `method` naming `value`: everything
/// on h1, reading on h2 — a method that reads a host object she can see
/// (`resourceRead` of a session or chat, `ON_SHOWN_OBJECT`) included. A
/// content reference never shown to her is usable only by a `resource*`
/// command with `files:*` (she acts with the host user's rights there,
/// contract §1; `policy/README.md`), never inside another request.
fn permitted(host: &str, method: &str, value: &str) -> bool {
    let reads = |need: Option<Permission>| need == Some(Permission::SessionsRead);
    let object = !value.starts_with("file:");
    if value.starts_with("ahp-content:") {
        let by_uri = methods::method(method).is_some_and(|m| m.handling == Handling::ByUri);
        return host == "h1" && by_uri;
    }
    host == "h1"
        || matches!(methods::need(method), Some(Need::Permission(p)) if reads(Some(p)))
        || (object && reads(methods::need_on_shown(method)))
}

/// Skeleton objects for the tagged unions and required fields on a path
/// (`prefix`: the path up to the object), so a benign value reaches the
/// host through the method's typed params; `leaf` is the whole path.
fn skeleton(prefix: &str, leaf: &str) -> Option<Value> {
    Some(match prefix {
        "claim" if leaf.ends_with("clientId") => json!({"kind": "client"}),
        "claim" => json!({"kind": "session", "session": M_SESSION, "chat": M_CHAT}),
        "initialMessage" => json!({"text": "walk", "origin": {"kind": "user"}}),
        "initialMessage.attachments[]" if leaf.ends_with(".uri") => {
            json!({"type": "resource", "label": "walk"})
        }
        "initialMessage.attachments[]" => json!({"type": "chat", "label": "walk"}),
        "activeClient" => json!({"clientId": M_CLIENT, "tools": []}),
        "activeClient.customizations[]" => {
            json!({"type": "plugin", "id": "p", "name": "p", "uri": "virtual://m1/p"})
        }
        "source" => json!({"kind": "fork", "turnId": "t"}),
        "destination" => json!({"kind": "session", "session": M_SESSION}),
        _ => return None,
    })
}

/// `params` with `value` at `leaf` (arrays of one element), objects on the
/// way from [`skeleton`] where the base has none.
fn inject(mut params: Value, leaf: &Leaf, value: &str) -> Value {
    let dotted = leaf.dotted();
    let mut at = &mut params;
    let mut prefix = String::new();
    for (i, seg) in leaf.path.iter().enumerate() {
        if !prefix.is_empty() {
            prefix.push('.');
        }
        prefix.push_str(&seg.key);
        let last = i + 1 == leaf.path.len();
        let obj = at.as_object_mut().expect("an object on the path");
        if last && !seg.each {
            obj.insert(seg.key.clone(), json!(value));
            return params;
        }
        if last {
            obj.insert(seg.key.clone(), json!([value]));
            return params;
        }
        if seg.each {
            prefix.push_str("[]");
        }
        let fresh = skeleton(&prefix, &dotted).unwrap_or_else(|| json!({}));
        let keep = matches!(obj.get(&seg.key), Some(Value::Object(_)))
            && !seg.each
            && skeleton(&prefix, &dotted).is_none();
        if !keep {
            let v = if seg.each { json!([fresh]) } else { fresh };
            obj.insert(seg.key.clone(), v);
        }
        let child = obj.get_mut(&seg.key).expect("just inserted");
        at = if seg.each {
            child.get_mut(0).expect("one element")
        } else {
            child
        };
    }
    params
}

/// The value at `leaf` in a host frame's params (first element of arrays).
fn value_at<'a>(frame: &'a Value, leaf: &Leaf) -> Option<&'a Value> {
    let mut at = frame.get("params")?;
    for seg in &leaf.path {
        at = at.get(&seg.key)?;
        if seg.each {
            at = at.get(0)?;
        }
    }
    Some(at)
}

/// What one request did.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// Answered with an error; no host received it.
    Refused,
    /// Reached `host` with the field as given.
    Reached { host: String, got: Option<Value> },
}

/// Panics unless exactly one host got the request (or none and it was
/// refused); the outcome.
fn outcome(what: &str, r: &Value, new: &[Vec<Value>], leaf: &Leaf) -> Outcome {
    let reached: Vec<(usize, &Value)> = new
        .iter()
        .enumerate()
        .flat_map(|(i, fs)| fs.iter().map(move |f| (i, f)))
        .collect();
    match reached.as_slice() {
        [] => {
            assert!(r.get("error").is_some(), "{what}: no host got it, yet: {r}");
            Outcome::Refused
        }
        [(i, f)] => Outcome::Reached {
            host: HOSTS[*i].into(),
            got: value_at(f, leaf).cloned(),
        },
        many => panic!("{what}: reached several hosts: {many:?}"),
    }
}

/// The leaf of `path` (for fields that are not in a `params:` row).
fn leaf_of(path: &str, kind: FieldKind) -> Leaf {
    Leaf {
        path: segs(path),
        kind,
    }
}

/// The walk of one field of `method`: the benign value reaches h1 in h1's
/// names (or the typed params drop it), every hostile one is refused or
/// reaches only the host that owns it, in its names, where permitted.
async fn walk_field(w: &mut World, method: &str, leaf: &Leaf, report: &mut Vec<String>) {
    let field = leaf.dotted();
    let Some(base) = w.base(method) else {
        panic!("{method}: no base request to walk {field}");
    };
    let (value, host_form) = match base.get("channel").and_then(Value::as_str) {
        // A method's own channel: the base names mallory's object already.
        Some(c) if field == "channel" => (c.to_string(), c.to_string()),
        _ => w.benign(leaf),
    };
    let (r, new) = w.send(method, inject(base, leaf, &value)).await;
    let what = format!("{method}.{field} = {value} (benign)");
    let root_scoped = methods::method(method).is_some_and(|m| m.handling.root_scoped());
    match outcome(&what, &r, &new, leaf) {
        Outcome::Refused => panic!("{what}: refused: {r}"),
        Outcome::Reached { host, got } => {
            assert_eq!(host, "h1", "{what}");
            match got {
                Some(g) if field == "channel" && root_scoped => {
                    assert_eq!(g, json!(ROOT), "{what}")
                }
                Some(g) => assert_eq!(g, json!(host_form), "{what}: h1 got it in h1's names"),
                None => report.push(format!("{method}.{field}: dropped by the typed params")),
            }
        }
    }
    for bad in w.hostile(leaf.kind) {
        let Some(base) = w.base(method) else {
            return;
        };
        let (r, new) = w.send(method, inject(base, leaf, &bad.value)).await;
        let what = format!("{method}.{field} = {} (hostile)", bad.value);
        if let Outcome::Reached { host, got } = outcome(&what, &r, &new, leaf) {
            let carried = got.filter(|g| !(field == "channel" && root_scoped && g == ROOT));
            if let Some(g) = carried {
                let owned = bad
                    .owner
                    .as_ref()
                    .is_some_and(|(h, form)| *h == host && g == json!(form));
                assert!(
                    owned && permitted(&host, method, &bad.value),
                    "{what}: reached {host} as {g}: {r}"
                );
                report.push(format!("{what}: allowed at its owner {host}"));
            }
        }
    }
}

/// The `channel` of every routed method: as a benign field (mallory's own
/// object on h1), and as each hostile URI.
fn channel_leaf() -> Leaf {
    leaf_of("channel", FieldKind::Uri)
}

// ─── the tests ──────────────────────────────────────────────────────────────

/// The walk covers the table: every method has a base request or is
/// answered by the relay (checked on its own below), every field §3a of the
/// surface names for a method the relay routes has a rewrite-table row or
/// a check of its own, every `params:` row's method is in the method
/// table or refused. A new method or field without one fails here.
#[tokio::test]
async fn the_walk_covers_every_method_and_every_surface_field() {
    let mut w = world().await;
    let relay_answered = [
        "initialize",
        "reconnect",
        "ping",
        "listSessions",
        "authenticate",
    ];
    for m in METHODS {
        let walked = w.base(m.name).is_some();
        let own = relay_answered.contains(&m.name) || m.handling == Handling::NotRouted;
        assert!(walked || own, "{}: the walk has no base request", m.name);
    }
    let surface = surface_fields();
    assert!(surface.len() > 30, "surface §3a parsed: {surface:?}");
    let mut unknown = Vec::new();
    for (method, field) in &surface {
        if methods::method(method).is_none() {
            unknown.push(method.clone());
            continue;
        }
        let own = RELAY_FIELDS
            .iter()
            .any(|(m, f, _)| m == method && f == field);
        assert!(
            field == "channel" || table_covers(method, field) || own,
            "surface field {method}.{field} has no rewrite-table row and no check"
        );
    }
    for (m, f, _) in RELAY_FIELDS {
        assert!(surface.contains(&(m.to_string(), f.to_string())), "{m}.{f}");
    }
    // Methods the surface or the rewrite table knows and the relay does
    // not: refused before anything (-32601), nothing reaches a host.
    unknown.extend(table_methods().into_iter().map(str::to_string));
    unknown.retain(|m| methods::method(m).is_none());
    assert!(!unknown.is_empty());
    for m in unknown {
        let (r, new) = w.send(&m, json!({"channel": ROOT, "uri": w.file.0})).await;
        assert_eq!(r["error"]["code"], -32601, "{m}: {r}");
        assert!(new.iter().all(Vec::is_empty), "{m} reached a host");
    }
    // Known but not routed through the relay: -32601 as requests.
    for m in METHODS.iter().filter(|m| m.handling == Handling::NotRouted) {
        let (r, new) = w.send(m.name, json!({"channel": M_CHAT})).await;
        assert_eq!(r["error"]["code"], -32601, "{}: {r}", m.name);
        assert!(new.iter().all(Vec::is_empty), "{} reached a host", m.name);
    }
}

/// Every leaf of every `params:<method>` row of the rewrite table, for
/// every method of the method table that has one.
#[tokio::test]
async fn every_name_bearing_param_is_translated_and_authorized_or_refused() {
    let mut w = world().await;
    let mut report = Vec::new();
    let mut walked = 0;
    for method in table_methods() {
        if methods::method(method).is_none() {
            continue;
        }
        for leaf in leaves(&format!("params:{method}"), &[], 0) {
            walk_field(&mut w, method, &leaf, &mut report).await;
            walked += 1;
        }
    }
    eprintln!("walked {walked} fields:\n{}", report.join("\n"));
    assert!(walked >= 25, "the table has fields to walk: {walked}");
}

/// The `channel` of every method the relay routes to a host, as a benign
/// and as each hostile URI (methods without a `params:` row — subscribe,
/// fetchTurns, completions, dispose* — are decided by it alone).
#[tokio::test]
async fn every_routed_channel_is_authorized_or_refused() {
    let mut w = world().await;
    let mut report = Vec::new();
    for m in METHODS {
        if w.base(m.name).is_none() {
            continue;
        }
        // A create's channel is a new client-chosen URI: checked below.
        if matches!(m.handling, Handling::Create(_)) || m.disposes() {
            continue;
        }
        walk_field(&mut w, m.name, &channel_leaf(), &mut report).await;
    }
    eprintln!("{}", report.join("\n"));
    // Disposing is destructive: the hostile channels only (the benign
    // dispose is tested in relay_access.rs).
    for m in METHODS.iter().filter(|m| m.disposes()) {
        for bad in w.hostile(FieldKind::Uri) {
            let (r, new) = w.send(m.name, json!({"channel": bad.value})).await;
            let what = format!("{} of {}", m.name, bad.value);
            assert_eq!(
                outcome(&what, &r, &new, &channel_leaf()),
                Outcome::Refused,
                "{what}: {r}"
            );
        }
    }
}

/// Client-chosen URIs (`createSession.channel`, `createChat.chat`,
/// `createTerminal.channel`) naming an existing object — another tenant's,
/// a host's in bare or qualified form, another host's — are refused and
/// reach no host.
#[tokio::test]
async fn client_chosen_uris_are_checked_free() {
    let mut w = world().await;
    let cases = [
        ("createSession", "channel", ALICE_SESSION),
        ("createSession", "channel", "ahp-session:/h1-1"),
        ("createSession", "channel", "ahp-session:/h1~h1-1"),
        ("createSession", "channel", "ahp-session:/h2~h2-1"),
        ("createChat", "chat", ALICE_CHAT),
        ("createChat", "chat", "ahp-chat:/h1-1-main"),
        ("createChat", "chat", "ahp-chat:/h2~h2-1-main"),
        ("createTerminal", "channel", ALICE_TERM),
        ("createTerminal", "channel", M_TERM),
    ];
    for (method, field, value) in cases {
        let base = w.base(method).expect("a create has a base");
        let leaf = leaf_of(field, FieldKind::Uri);
        let (r, new) = w.send(method, inject(base, &leaf, value)).await;
        let what = format!("{method}.{field} = {value}");
        assert_eq!(outcome(&what, &r, &new, &leaf), Outcome::Refused, "{what}");
    }
}

/// `initialize.initialSubscriptions[]`: only what the principal may see is
/// subscribed (and sent on to its host); the rest is absent.
#[tokio::test]
async fn initial_subscriptions_are_authorized() {
    let w = world().await;
    let mut ws = w.t.raw("mallory").await;
    let subs = [
        M_SESSION,
        ALICE_SESSION,
        ALICE_CHAT,
        ALICE_TERM,
        "ahp-session:/h2~h2-1",
        "ahp-chat:/h1-1-main",
    ];
    let r = ws
        .request(1, "initialize", initialize_subscribing("m2", &subs))
        .await;
    let mut got = snapshot_resources(&r["result"]);
    got.sort();
    assert_eq!(got, ["ahp-session:/h2~h2-1", M_SESSION], "{r}");
    let up = w.t.upstream_id("mallory", "m2");
    for h in &w.t.hosts {
        for f in h.received_from(&up) {
            for bad in ["alice-", "h1-1-main"] {
                assert!(!f.text.contains(bad), "{bad} reached a host: {}", f.text);
            }
        }
    }
}

/// `reconnect.subscriptions[]`: the answer carries only what the
/// principal may see.
#[tokio::test]
async fn a_reconnect_names_only_what_it_may_see() {
    let w = world().await;
    w.mallory.close_cleanly().await;
    let mut ws = w.t.raw("mallory").await;
    let subs = [M_SESSION, ALICE_SESSION, ALICE_CHAT, ALICE_TERM];
    let r = raw_reconnect(&mut ws, 1, reconnect_params(M_CLIENT, 0, &subs)).await;
    let text = r.to_string();
    match r["result"]["type"].as_str() {
        Some("snapshot") => {
            assert_eq!(snapshot_resources(&r["result"]), [M_SESSION], "{r}")
        }
        Some("replay") => {
            for a in r["result"]["actions"].as_array().into_iter().flatten() {
                assert!(!a.to_string().contains("alice-"), "{a}");
            }
        }
        _ => panic!("reconnect: {text}"),
    }
    let listed = listed_uris(&mut ws, 2).await;
    assert!(!listed.iter().any(|u| u.contains("alice-")), "{listed:?}");
}

/// `authenticate.resource`: the token goes only to hosts where mallory
/// operates (h1), not to h2 where she only reads, though both declare it
/// and she has a link to both.
#[tokio::test]
async fn authenticate_reaches_only_operated_hosts() {
    let mut w = world().await;
    let (r, _) = w
        .send("subscribe", json!({"channel": "ahp-session:/h2~h2-1"}))
        .await;
    assert!(r.get("result").is_some(), "{r}");
    let (r, new) = w
        .send(
            "authenticate",
            json!({"channel": ROOT, "resource": RESOURCE, "token": "tok"}),
        )
        .await;
    assert!(r.get("result").is_some(), "{r}");
    assert_eq!(new[0].len(), 1, "h1 got the token");
    assert!(new[1].is_empty(), "h2 got the token: {:?}", new[1]);
}

/// Results carry names too (`result:<method>` rows): the answer of a
/// routed `completions` names the host's folder in client names
/// (`file://h1/…`), never the host's bare `file:///…`.
#[tokio::test]
async fn results_come_back_in_client_names() {
    let mut w = world().await;
    let params = w.base("completions").expect("completions has a base");
    let (r, new) = w.send("completions", params).await;
    assert_eq!(new[0].len(), 1, "h1 answered it");
    let uri = r["result"]["items"][0]["attachment"]["uri"]
        .as_str()
        .unwrap_or_else(|| panic!("an attachment: {r}"));
    assert!(uri.starts_with("file://h1/"), "{uri}");
}

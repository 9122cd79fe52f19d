//! Model-based randomized test of the access rules (contract §3.3, §4.6,
//! §6.1, §6.3, §6.4, §7.1, §7.2, §7.6; issue 18, Deliver 11).
//!
//! A small reference model of the policy — principals with groups, rules
//! (subjects or groups, hosts, role, visibility, external sessions),
//! sessions with their creators and the creators' groups at creation, the
//! session that lists each seeded chat and the one that claims each seeded
//! terminal — written here independently of `policy::rules`, is driven by
//! random events drawn from a seed, against one relay in front of two
//! simhosts (h1, h2; one seeded session, chat and terminal each, both
//! declaring a protected resource):
//!
//! - **reload**: a new random rule set (`Relay::set_policy`, the path a
//!   config reload takes);
//! - **reconnect** with a new token carrying other groups (§3.3);
//! - **initialize** afresh (new socket, new token);
//! - **create** a session on a random host, a third of them answered late
//!   (the host is stalled while the create is in flight and the lists are
//!   checked meanwhile: a pending entry grants nothing);
//! - **dispose** a random created session (§7.1: the creator, or admin);
//! - **subscribe** a seeded session, chat or terminal;
//! - **claim**: the host hands its terminal to another of its sessions;
//! - **move** a seeded chat into another session of its host (`moveChat`);
//! - **authenticate** (§4.6).
//!
//! After every step, for each client: a client that lost sight of a
//! subscribed channel (policy, groups, claim, move, dispose of a claiming
//! session) is closed with 4000, and only such a client — its `reconnect`
//! then answers exactly the channels it may still see; every catalog
//! notification it got names a session it may see; its `listSessions`
//! equals the sessions the model shows it; its root state (the snapshot
//! plus root actions, reduced) lists exactly the agents of the hosts and
//! the terminals it may see and counts exactly the sessions it may see;
//! and every host holds an `authenticate` token of a client only where the
//! model lets its principal operate.
//!
//! One relay serves every run (fresh principals per seed; a `janitor`,
//! admin everywhere and following the root, is the fan-out barrier — once
//! it has a catalog notification or root action, the relay's fan-out pass
//! for it has queued it for every client — and puts back what a run
//! moved, claimed and created). `cargo test --test relay_model` runs
//! [`SEEDS`] seeds of [`STEPS`] steps (about 30 s in a debug build on the
//! 2-core dev machine); `AHP_RELAY_MODEL_SEEDS=N` runs N seeds,
//! `AHP_RELAY_MODEL_BASE` moves the first seed, `AHP_RELAY_MODEL_STEPS`
//! the steps per seed, and `AHP_RELAY_MODEL_SEED=S` runs seed S alone. A
//! failure prints its seed, the steps so far and the command to replay it
//! (timing is not replayed: a race may need its neighbours,
//! `AHP_RELAY_MODEL_BASE` a few seeds before). The long run:
//! `AHP_RELAY_MODEL_SEEDS=1000 AHP_RELAY_MODEL_BASE=1000 cargo test --test relay_model -- --nocapture`
//! (measured in `docs/guarantees.md`, §7.6).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ahp_relay::policy::{PolicyConfig, RulePolicy};
use ahp_relay::simhost::clock::SplitMix64;
use ahp_relay::upstream::dial::dial_stream;
use common::relay::TestRelay;
use common::*;
use serde_json::{Value, json};

/// What the runs did, by kind (each kind must happen, see the campaign).
static SEEN: std::sync::Mutex<BTreeMap<&'static str, u64>> = std::sync::Mutex::new(BTreeMap::new());

fn count(what: &'static str) {
    *SEEN
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(what)
        .or_default() += 1;
}
const HOSTS: [&str; 2] = ["h1", "h2"];
const GROUPS: [&str; 3] = ["g1", "g2", "g3"];
const RESOURCE: &str = "https://api.example.com";
const CLIENTS: usize = 3;
/// Seeds, steps per seed and relays side by side of the CI run.
const SEEDS: u64 = 200;
const STEPS: usize = 20;
const LANES: usize = 1;
const ROLES: [&str; 3] = ["viewer", "operator", "admin"];
const VIS: [&str; 3] = ["own", "group", "all"];

// ─── the reference model ────────────────────────────────────────────────────

/// One rule: whom (subjects or groups), where, what.
#[derive(Debug, Clone)]
struct RuleM {
    subjects: Vec<String>,
    groups: Vec<String>,
    hosts: Vec<String>,
    /// Index in [`ROLES`].
    role: usize,
    /// Index in [`VIS`].
    vis: usize,
    external: Option<bool>,
}

/// What a principal holds on a host: the union of the matching rules.
#[derive(Debug, Clone, Copy)]
struct GrantM {
    role: usize,
    vis: usize,
    external: bool,
}

impl GrantM {
    fn operates(self) -> bool {
        self.role >= 1
    }
}

/// A session: its host, and its creator with the creator's groups then
/// (`None`: made outside the relay).
#[derive(Debug, Clone)]
struct SessM {
    host: usize,
    owner: Option<(String, Vec<String>)>,
}

#[derive(Debug, Default)]
struct Model {
    rules: Vec<RuleM>,
    sessions: BTreeMap<String, SessM>,
    /// The seeded chats (client names) and the session listing each.
    chats: BTreeMap<String, String>,
    /// The seeded terminals (client names) and the session claiming each.
    terminals: BTreeMap<String, String>,
}

impl Model {
    fn grant(&self, sub: &str, groups: &[String], host: usize) -> Option<GrantM> {
        let mut g: Option<GrantM> = None;
        for r in &self.rules {
            let who = r.subjects.iter().any(|s| s == sub || s == "*")
                || r.groups.iter().any(|x| groups.contains(x));
            let at = r.hosts.iter().any(|h| h == HOSTS[host] || h == "*");
            if !(who && at) {
                continue;
            }
            let ext = r.external.unwrap_or(r.vis == 2);
            g = Some(match g {
                None => GrantM {
                    role: r.role,
                    vis: r.vis,
                    external: ext,
                },
                Some(o) => GrantM {
                    role: o.role.max(r.role),
                    vis: o.vis.max(r.vis),
                    external: o.external || ext,
                },
            });
        }
        g
    }

    fn sees(&self, sub: &str, groups: &[String], uri: &str) -> bool {
        let Some(s) = self.sessions.get(uri) else {
            return false;
        };
        let Some(g) = self.grant(sub, groups, s.host) else {
            return false;
        };
        match &s.owner {
            None => g.external,
            Some((o, _)) if o == sub => true,
            Some((_, og)) => match g.vis {
                2 => true,
                1 => og.iter().any(|x| groups.contains(x)),
                _ => false,
            },
        }
    }

    /// Whether a subscription to `uri` (a session, a seeded chat through
    /// the session listing it, a seeded terminal through the session
    /// claiming it) is allowed.
    fn sees_channel(&self, sub: &str, groups: &[String], uri: &str) -> bool {
        match (self.chats.get(uri), self.terminals.get(uri)) {
            (Some(session), _) | (_, Some(session)) => self.sees(sub, groups, session),
            _ => self.sees(sub, groups, uri),
        }
    }

    fn visible_terminals(&self, sub: &str, groups: &[String]) -> BTreeSet<String> {
        self.terminals
            .keys()
            .filter(|t| self.sees_channel(sub, groups, t))
            .cloned()
            .collect()
    }

    fn visible(&self, sub: &str, groups: &[String]) -> BTreeSet<String> {
        self.sessions
            .keys()
            .filter(|u| self.sees(sub, groups, u))
            .cloned()
            .collect()
    }

    fn agents(&self, sub: &str, groups: &[String]) -> BTreeSet<String> {
        (0..HOSTS.len())
            .filter(|h| self.grant(sub, groups, *h).is_some())
            .map(|h| format!("sim.{}", HOSTS[h]))
            .collect()
    }

    /// The `[policy]` TOML of the rules, with the janitor's rule last.
    fn toml(&self) -> String {
        let mut out = String::new();
        for (i, r) in self.rules.iter().enumerate() {
            out.push_str(&format!(
                "[[policy.rules]]\nname = \"r{i}\"\nsubjects = {:?}\ngroups = {:?}\n\
                 hosts = {:?}\nrole = \"{}\"\nvisibility = \"{}\"\n",
                r.subjects, r.groups, r.hosts, ROLES[r.role], VIS[r.vis]
            ));
            if let Some(e) = r.external {
                out.push_str(&format!("external_sessions = {e}\n"));
            }
        }
        out + JANITOR_RULE
    }
}

const JANITOR_RULE: &str = "[[policy.rules]]\nname = \"janitor\"\nsubjects = [\"janitor\"]\n\
    hosts = [\"*\"]\nrole = \"admin\"\nvisibility = \"all\"\n";

fn policy_of(text: &str) -> Arc<RulePolicy> {
    #[derive(serde::Deserialize)]
    struct Doc {
        policy: PolicyConfig,
    }
    let doc: Doc = toml::from_str(text).unwrap_or_else(|e| panic!("policy parses: {e}\n{text}"));
    doc.policy
        .validate(&[("h1", None), ("h2", None)])
        .unwrap_or_else(|e| panic!("policy validates: {e:?}\n{text}"));
    Arc::new(RulePolicy::new(&doc.policy))
}

// ─── random draws ───────────────────────────────────────────────────────────

struct Rng(SplitMix64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0.range(0, n as u64 - 1) as usize
    }
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
    fn groups(&mut self) -> Vec<String> {
        let mut g: Vec<String> = GROUPS
            .iter()
            .filter(|_| self.chance(40))
            .map(|s| s.to_string())
            .collect();
        g.sort();
        g
    }
    fn rules(&mut self, subs: &[String]) -> Vec<RuleM> {
        (0..1 + self.below(4))
            .map(|_| {
                let by_group = self.chance(40);
                let subjects = match (by_group, self.chance(15)) {
                    (true, _) => vec![],
                    (false, true) => vec!["*".to_string()],
                    (false, false) => vec![subs[self.below(subs.len())].clone()],
                };
                let groups = if by_group {
                    vec![GROUPS[self.below(GROUPS.len())].to_string()]
                } else {
                    vec![]
                };
                let hosts = match self.below(3) {
                    0 => vec!["*".to_string()],
                    h => vec![HOSTS[h - 1].to_string()],
                };
                let external = match self.below(3) {
                    0 => None,
                    1 => Some(true),
                    _ => Some(false),
                };
                RuleM {
                    subjects,
                    groups,
                    hosts,
                    role: self.below(3),
                    vis: self.below(3),
                    external,
                }
            })
            .collect()
    }
}

// ─── clients ────────────────────────────────────────────────────────────────

/// A raw client that keeps every frame that is not an answer it waits for.
struct Cl {
    sub: String,
    cid: String,
    groups: Vec<String>,
    ws: RawWs,
    log: Vec<Value>,
    next_id: u64,
    closed: Option<u16>,
    /// The root state as this client has it (snapshot plus root actions).
    root: Value,
    /// The `fromSeq` of the root snapshot `root` started from: every root
    /// action after it must be numbered above it.
    root_from: u64,
    /// Seeded sessions subscribed (client names).
    subs: BTreeSet<String>,
}

async fn socket(t: &TestRelay, sub: &str, groups: &[String]) -> RawWs {
    let g: Vec<&str> = groups.iter().map(String::as_str).collect();
    let token = t
        .kit
        .token(sub, &g, Duration::from_secs(3600), None)
        .expect("token");
    let ws = dial_stream(&t.dial_options(Some(token)))
        .await
        .expect("socket through the relay");
    RawWs::from_stream(ws)
}

impl Cl {
    async fn open(t: &TestRelay, sub: &str, cid: &str, groups: Vec<String>) -> Result<Cl, String> {
        let ws = socket(t, sub, &groups).await;
        let mut c = Cl {
            sub: sub.into(),
            cid: cid.into(),
            groups,
            ws,
            log: Vec::new(),
            next_id: 1,
            closed: None,
            root: Value::Null,
            root_from: 0,
            subs: BTreeSet::new(),
        };
        let r = c
            .call("initialize", initialize_subscribing(cid, &[ROOT]))
            .await?;
        c.root = snapshot_of(&r["result"], ROOT)["state"].clone();
        c.root_from = snapshot_of(&r["result"], ROOT)["fromSeq"]
            .as_u64()
            .unwrap_or(0);
        Ok(c)
    }

    /// Sends a request without waiting; its id.
    async fn send(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.ws.send_json(&request_frame(id, method, params)).await;
        id
    }

    /// The answer to `id` (from the log, or read now); `Err` if the socket
    /// closed first or nothing came within [`WAIT`].
    async fn answer(&mut self, id: u64) -> Result<Value, String> {
        let is = |v: &Value| v.get("method").is_none() && v.get("id") == Some(&json!(id));
        if let Some(i) = self.log.iter().position(is) {
            return Ok(self.log.remove(i));
        }
        loop {
            match self.ws.next_within(WAIT).await {
                Some(Next::Frame(v)) if is(&v) => return Ok(v),
                Some(Next::Frame(v)) => self.log.push(v),
                Some(Next::Closed(c)) => {
                    let code = c.map_or(1006, |c| c.0);
                    self.closed = Some(code);
                    return Err(format!("{}: closed {code} before answer {id}", self.sub));
                }
                None => return Err(format!("{}: no answer to {id} in time", self.sub)),
            }
        }
    }

    async fn call(&mut self, method: &str, params: Value) -> Result<Value, String> {
        let id = self.send(method, params).await;
        self.answer(id).await
    }

    /// Waits until a logged frame satisfies `pred`, and takes it from the
    /// log (a barrier is passed by a frame once: an older frame of the same
    /// shape does not stand in for the one the step causes).
    async fn wait_for(
        &mut self,
        what: &str,
        pred: impl Fn(&Value) -> bool,
    ) -> Result<Value, String> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Some(i) = self.log.iter().position(&pred) {
                return Ok(self.log.remove(i));
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.ws.next_within(left).await {
                Some(Next::Frame(v)) => self.log.push(v),
                Some(Next::Closed(c)) => {
                    return Err(format!("{}: closed {c:?} waiting for {what}", self.sub));
                }
                None => return Err(format!("{}: timed out waiting for {what}", self.sub)),
            }
        }
    }
}

fn notification_of(v: &Value, method: &str, uri: &str) -> bool {
    v["method"] == method
        && (v["params"]["session"] == uri || v["params"]["summary"]["resource"] == uri)
}

// ─── one run ────────────────────────────────────────────────────────────────

struct Run<'a> {
    t: &'a TestRelay,
    seed: u64,
    rng: Rng,
    model: Model,
    clients: Vec<Cl>,
    janitor: &'a mut Cl,
    trace: Vec<String>,
    created: u64,
}

/// The seeded sessions, in client names.
fn seeded() -> Vec<(String, usize)> {
    HOSTS
        .iter()
        .enumerate()
        .map(|(i, h)| (format!("ahp-session:/{h}~{h}-1"), i))
        .collect()
}

/// Host `h`'s seeded chat, terminal and session (client names).
fn seeded_objects(h: usize) -> (String, String, String) {
    let n = HOSTS[h];
    (
        format!("ahp-chat:/{n}~{n}-1-main"),
        format!("ahp-terminal:/{n}~1"),
        format!("ahp-session:/{n}~{n}-1"),
    )
}

/// The host form of a session's client name, and of its first chat.
fn host_forms(session: &str) -> (String, String) {
    let id = session.trim_start_matches("ahp-session:/");
    let id = id.split_once('~').map_or(id, |(_, rest)| rest);
    (format!("ahp-session:/{id}"), format!("ahp-chat:/{id}-main"))
}

impl Run<'_> {
    fn subjects(&self) -> Vec<String> {
        (0..CLIENTS)
            .map(|i| format!("m{}u{i}", self.seed))
            .collect()
    }

    async fn start(&mut self) -> Result<(), String> {
        self.model.sessions.clear();
        for (uri, host) in seeded() {
            self.model.sessions.insert(uri, SessM { host, owner: None });
        }
        for h in 0..HOSTS.len() {
            let (chat, term, session) = seeded_objects(h);
            self.model.chats.insert(chat, session.clone());
            self.model.terminals.insert(term, session);
        }
        let subs = self.subjects();
        self.model.rules = self.rng.rules(&subs);
        self.t.relay.relay.set_policy(policy_of(&self.model.toml()));
        self.trace.push(format!("policy:\n{}", self.model.toml()));
        for (i, sub) in subs.iter().enumerate() {
            let groups = self.rng.groups();
            let c = Cl::open(self.t, sub, &format!("c{i}"), groups).await?;
            self.clients.push(c);
        }
        self.check().await
    }

    async fn step(&mut self) -> Result<(), String> {
        let who = self.rng.below(CLIENTS);
        match self.rng.below(100) {
            0..12 => self.reload().await?,
            12..25 => self.reconnect(who, true).await?,
            25..29 => self.reinitialize(who).await?,
            29..50 => self.create(who).await?,
            50..60 => self.dispose(who).await?,
            60..76 => self.subscribe(who).await?,
            76..84 => self.claim().await?,
            84..92 => self.move_chat(who).await?,
            _ => self.authenticate(who).await?,
        }
        self.expect_closes().await?;
        self.check().await
    }

    async fn reload(&mut self) -> Result<(), String> {
        let subs = self.subjects();
        self.model.rules = self.rng.rules(&subs);
        self.trace.push(format!("reload:\n{}", self.model.toml()));
        count("reload");
        self.t.relay.relay.set_policy(policy_of(&self.model.toml()));
        Ok(())
    }

    /// §7.6: a client that lost sight of a subscribed channel — the policy
    /// changed, a terminal was claimed for a session it cannot see, a chat
    /// moved into one — is closed with 4000; its `reconnect` then answers
    /// exactly what it may still see. Nobody else is closed (a close where
    /// none is due fails the next request).
    async fn expect_closes(&mut self) -> Result<(), String> {
        for i in 0..CLIENTS {
            let c = &self.clients[i];
            let lost: Vec<String> = c
                .subs
                .iter()
                .filter(|s| !self.model.sees_channel(&c.sub, &c.groups, s))
                .cloned()
                .collect();
            if lost.is_empty() {
                continue;
            }
            let c = &mut self.clients[i];
            let code = loop {
                match c.ws.next_within(WAIT).await {
                    Some(Next::Frame(v)) => c.log.push(v),
                    Some(Next::Closed(code)) => break code.map_or(1006, |c| c.0),
                    None => return Err(format!("{}: not closed after losing {lost:?}", c.sub)),
                }
            };
            if code != 4000 {
                return Err(format!("{}: closed {code}, expected 4000", c.sub));
            }
            c.closed = Some(code);
            count("closed 4000");
            self.trace
                .push(format!("{} closed 4000 (lost {lost:?})", c.sub));
            self.check_frames(i)?;
            self.reconnect(i, false).await?;
        }
        Ok(())
    }

    /// A new socket (with new groups when `regroup`) and `reconnect`: the
    /// answer carries exactly the subscribed channels the principal may
    /// still see under its new token (§3.3, §5.5).
    async fn reconnect(&mut self, i: usize, regroup: bool) -> Result<(), String> {
        let groups = if regroup {
            self.rng.groups()
        } else {
            self.clients[i].groups.clone()
        };
        self.drain(i).await?;
        // What the old socket delivered is checked under the old groups and
        // applied to the old root now: the snapshot below replaces that root,
        // and an action the relay wrote before the cut must not be applied
        // on top of it (its number is at most the snapshot's `fromSeq`).
        self.check_frames(i)?;
        let c = &mut self.clients[i];
        self.trace
            .push(format!("{} reconnects with groups {groups:?}", c.sub));
        let ws = socket(self.t, &c.sub, &groups).await;
        let old = std::mem::replace(&mut c.ws, ws);
        if c.closed.is_none() {
            old.close_cleanly().await;
        }
        c.closed = None;
        if c.groups != groups {
            count("regrouped");
        }
        c.groups = groups;
        let mut asked: Vec<&str> = c.subs.iter().map(String::as_str).collect();
        asked.push(ROOT);
        let params = reconnect_params(&c.cid, 0, &asked);
        let r = c.call("reconnect", params).await?;
        let allowed: BTreeSet<String> = c
            .subs
            .iter()
            .filter(|s| self.model.sees_channel(&c.sub, &c.groups, s))
            .cloned()
            .collect();
        match r["result"]["type"].as_str() {
            Some("snapshot") => {
                count("reconnect snapshot");
                let mut want: Vec<String> = allowed.iter().cloned().collect();
                want.push(ROOT.into());
                want.sort();
                let got = snapshot_resources(&r["result"]);
                if got != want {
                    return Err(format!(
                        "{}: reconnect answered {got:?}, model {want:?}",
                        c.sub
                    ));
                }
                c.root = snapshot_of(&r["result"], ROOT)["state"].clone();
                c.root_from = snapshot_of(&r["result"], ROOT)["fromSeq"]
                    .as_u64()
                    .unwrap_or(0);
            }
            Some("replay") => {
                for a in r["result"]["actions"].as_array().into_iter().flatten() {
                    c.log.push(json!({"method": "action", "params": a}));
                }
            }
            _ => return Err(format!("{}: reconnect: {r}", c.sub)),
        }
        c.subs = allowed;
        Ok(())
    }

    async fn reinitialize(&mut self, i: usize) -> Result<(), String> {
        let groups = self.rng.groups();
        // The old socket's frames are checked before its client is replaced.
        self.check_frames(i)?;
        let (sub, cid) = (self.clients[i].sub.clone(), self.clients[i].cid.clone());
        self.trace
            .push(format!("{sub} initializes afresh with groups {groups:?}"));
        let old = std::mem::replace(
            &mut self.clients[i],
            Cl::open(self.t, &sub, &cid, groups).await?,
        );
        if old.closed.is_none() {
            old.ws.close_cleanly().await;
        }
        Ok(())
    }

    async fn create(&mut self, i: usize) -> Result<(), String> {
        let host = self.rng.below(HOSTS.len());
        let late = self.rng.chance(33);
        self.created += 1;
        let uri = format!("ahp-session:/m{}-{}", self.seed, self.created);
        let c = &self.clients[i];
        let allowed = self
            .model
            .grant(&c.sub, &c.groups, host)
            .is_some_and(GrantM::operates);
        self.trace.push(format!(
            "{} creates {uri} on {} (late: {late}, allowed: {allowed})",
            c.sub, HOSTS[host]
        ));
        let params = json!({"channel": uri, "provider": format!("sim.{}", HOSTS[host])});
        if late && allowed {
            count("late create");
            self.t.hosts[host].set_stalled(true);
            let id = self.clients[i].send("createSession", params).await;
            // The entry is pending: nobody sees it yet, its creator neither.
            let lists = self.check_lists().await;
            self.t.hosts[host].set_stalled(false);
            lists?;
            let r = self.clients[i].answer(id).await?;
            return self.created_as(i, host, &uri, &r, allowed).await;
        }
        let r = self.clients[i].call("createSession", params).await?;
        self.created_as(i, host, &uri, &r, allowed).await
    }

    async fn created_as(
        &mut self,
        i: usize,
        host: usize,
        uri: &str,
        r: &Value,
        allowed: bool,
    ) -> Result<(), String> {
        let ok = r.get("result").is_some();
        count(if allowed {
            "create allowed"
        } else {
            "create refused"
        });
        if ok != allowed {
            return Err(format!("create {uri}: model allowed={allowed}, relay: {r}"));
        }
        if !ok {
            return Ok(());
        }
        let c = &self.clients[i];
        let owner = Some((c.sub.clone(), c.groups.clone()));
        self.model
            .sessions
            .insert(uri.to_string(), SessM { host, owner });
        let added = |v: &Value| notification_of(v, "root/sessionAdded", uri);
        let what = format!("sessionAdded {uri}");
        self.janitor.wait_for(&what, added).await?;
        // Every client that may see it has its notification before the
        // next step (one fan-out pass queued them all; a client's own wait
        // keeps a slow pass from reaching it after the policy changed).
        for i in 0..CLIENTS {
            let c = &self.clients[i];
            if self.model.sees(&c.sub, &c.groups, uri) {
                self.clients[i].wait_for(&what, added).await?;
            }
        }
        Ok(())
    }

    async fn dispose(&mut self, i: usize) -> Result<(), String> {
        // A session listing a seeded chat stays (disposing it would dispose
        // the chat, which later runs need).
        let created: Vec<String> = self
            .model
            .sessions
            .iter()
            .filter(|(u, s)| s.owner.is_some() && !self.model.chats.values().any(|c| c == *u))
            .map(|(u, _)| u.clone())
            .collect();
        if created.is_empty() {
            return Ok(());
        }
        let uri = created[self.rng.below(created.len())].clone();
        let c = &self.clients[i];
        let s = &self.model.sessions[&uri];
        let g = self.model.grant(&c.sub, &c.groups, s.host);
        let mine = s.owner.as_ref().is_some_and(|(o, _)| *o == c.sub);
        let allowed = self.model.sees(&c.sub, &c.groups, &uri)
            && g.is_some_and(|g| g.operates() && (mine || g.role == 2));
        self.trace
            .push(format!("{} disposes {uri} (allowed: {allowed})", c.sub));
        let r = self.clients[i]
            .call("disposeSession", json!({"channel": uri}))
            .await?;
        count(if allowed {
            "dispose allowed"
        } else {
            "dispose refused"
        });
        if r.get("result").is_some() != allowed {
            return Err(format!(
                "dispose {uri}: model allowed={allowed}, relay: {r}"
            ));
        }
        if allowed {
            self.model.sessions.remove(&uri);
            // Listings right after the answer, the host's removal perhaps
            // still on its way, no longer hold it (§6.3) — once the clients
            // the dispose closes (a terminal it claimed, §7.6) are back.
            self.expect_closes().await?;
            self.check_lists().await?;
            self.removed(&uri).await?;
        }
        Ok(())
    }

    /// Waits until the janitor (who sees everything) has the removal of
    /// `uri`; what the relay and the hosts hold of it if it never comes.
    async fn removed(&mut self, uri: &str) -> Result<(), String> {
        let what = format!("sessionRemoved {uri}");
        let Err(e) = self
            .janitor
            .wait_for(&what, |v| notification_of(v, "root/sessionRemoved", uri))
            .await
        else {
            return Ok(());
        };
        let hubs: Vec<String> = self
            .t
            .relay
            .relay
            .hubs()
            .map(|h| {
                format!(
                    "{}: {:?} lists it: {}",
                    h.id,
                    h.status(),
                    h.has_session(uri)
                )
            })
            .collect();
        let hosts: Vec<bool> = self
            .t
            .hosts
            .iter()
            .map(|h| h.session_uris().iter().any(|u| u == uri))
            .collect();
        let removals: Vec<&Value> = self
            .janitor
            .log
            .iter()
            .filter(|v| v["method"] == "root/sessionRemoved")
            .map(|v| &v["params"]["session"])
            .collect();
        let entry = self.t.relay.relay.store.lookup(uri);
        Err(format!(
            "{e}; hubs {hubs:?}; hosts have it {hosts:?}; janitor removals {removals:?}; store {entry:?}"
        ))
    }

    async fn subscribe(&mut self, i: usize) -> Result<(), String> {
        let mut all: Vec<String> = seeded().into_iter().map(|(u, _)| u).collect();
        all.extend(self.model.chats.keys().cloned());
        all.extend(self.model.terminals.keys().cloned());
        let uri = &all[self.rng.below(all.len())];
        let c = &mut self.clients[i];
        if c.subs.contains(uri) {
            return Ok(());
        }
        let allowed = self.model.sees_channel(&c.sub, &c.groups, uri);
        self.trace
            .push(format!("{} subscribes {uri} (allowed: {allowed})", c.sub));
        let r = c.call("subscribe", json!({"channel": uri})).await?;
        count(if allowed {
            "subscribe allowed"
        } else {
            "subscribe refused"
        });
        if r.get("result").is_some() != allowed {
            return Err(format!(
                "subscribe {uri}: model allowed={allowed}, relay: {r}"
            ));
        }
        if allowed {
            c.subs.insert(uri.clone());
        }
        Ok(())
    }

    /// The host hands its seeded terminal to another of its sessions (§7.6).
    async fn claim(&mut self) -> Result<(), String> {
        let h = self.rng.below(HOSTS.len());
        let (_, term, _) = seeded_objects(h);
        let on_host: Vec<String> = self
            .model
            .sessions
            .iter()
            .filter(|(u, s)| s.host == h && self.model.terminals.get(&term) != Some(*u))
            .map(|(u, _)| u.clone())
            .collect();
        if on_host.is_empty() {
            return Ok(());
        }
        let to = on_host[self.rng.below(on_host.len())].clone();
        self.trace
            .push(format!("{} claims {term} for {to}", HOSTS[h]));
        count("claim");
        self.hand_terminal(h, &term, &to).await
    }

    async fn hand_terminal(&mut self, h: usize, term: &str, to: &str) -> Result<(), String> {
        let (session, chat) = host_forms(to);
        let claim = json!({"kind": "session", "session": session, "chat": chat});
        if !self.t.hosts[h].claim_terminal("ahp-terminal:/1", &claim) {
            return Err(format!("{} has no terminal 1", HOSTS[h]));
        }
        self.model
            .terminals
            .insert(term.to_string(), to.to_string());
        self.janitor
            .wait_for(&format!("{term} claimed for {to}"), |v| {
                v["params"]["channel"] == ROOT
                    && v["params"]["action"]["terminals"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|t| t["resource"] == term && t["claim"]["session"] == to)
            })
            .await
            .map(|_| ())
    }

    /// Client `i` moves a seeded chat to another session of its host (§7.6).
    async fn move_chat(&mut self, i: usize) -> Result<(), String> {
        let h = self.rng.below(HOSTS.len());
        let (chat, _, _) = seeded_objects(h);
        let from = self.model.chats[&chat].clone();
        let on_host: Vec<String> = self
            .model
            .sessions
            .iter()
            .filter(|(u, s)| s.host == h && **u != from)
            .map(|(u, _)| u.clone())
            .collect();
        if on_host.is_empty() {
            return Ok(());
        }
        let to = on_host[self.rng.below(on_host.len())].clone();
        let c = &self.clients[i];
        let allowed = self.model.sees_channel(&c.sub, &c.groups, &chat)
            && self.model.sees(&c.sub, &c.groups, &to)
            && self
                .model
                .grant(&c.sub, &c.groups, h)
                .is_some_and(GrantM::operates);
        self.trace.push(format!(
            "{} moves {chat} to {to} (allowed: {allowed})",
            c.sub
        ));
        count(if allowed {
            "move allowed"
        } else {
            "move refused"
        });
        let params = json!({"channel": chat, "destination": {"kind": "session", "session": to}});
        let r = self.clients[i].call("moveChat", params).await?;
        if r.get("result").is_some() != allowed {
            return Err(format!("move {chat}: model allowed={allowed}, relay: {r}"));
        }
        if allowed {
            self.moved(&chat, &to).await?;
        }
        Ok(())
    }

    /// Records a move and waits until the relay's catalog lists it.
    async fn moved(&mut self, chat: &str, to: &str) -> Result<(), String> {
        self.model.chats.insert(chat.to_string(), to.to_string());
        self.janitor
            .wait_for(&format!("{chat} listed in {to}"), |v| {
                v["method"] == "root/sessionSummaryChanged"
                    && v["params"]["session"] == to
                    && v["params"]["changes"]["chats"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|c| c["resource"] == chat)
            })
            .await
            .map(|_| ())
    }

    /// Puts the seeded chats and terminals back where the next run expects
    /// them (the janitor moves, the host claims).
    async fn restore(&mut self) -> Result<(), String> {
        for h in 0..HOSTS.len() {
            let (chat, term, seeded) = seeded_objects(h);
            if self.model.terminals.get(&term) != Some(&seeded) {
                self.hand_terminal(h, &term, &seeded).await?;
            }
            if self.model.chats.get(&chat) != Some(&seeded) {
                let params =
                    json!({"channel": chat, "destination": {"kind": "session", "session": seeded}});
                let r = self.janitor.call("moveChat", params).await?;
                if r.get("result").is_none() {
                    return Err(format!("janitor: move {chat} back: {r}"));
                }
                self.moved(&chat, &seeded).await?;
            }
        }
        Ok(())
    }

    async fn authenticate(&mut self, i: usize) -> Result<(), String> {
        let c = &mut self.clients[i];
        self.trace.push(format!("{} authenticates", c.sub));
        count("authenticate");
        let params = json!({"channel": ROOT, "resource": RESOURCE, "token": "tok"});
        c.call("authenticate", params).await?;
        Ok(())
    }

    /// Reads what client `i` was sent before now (a `ping` round trip).
    async fn drain(&mut self, i: usize) -> Result<(), String> {
        let c = &mut self.clients[i];
        if c.closed.is_some() {
            return Ok(());
        }
        let r = c.call("ping", json!({"channel": ROOT})).await?;
        if r["result"] != Value::Null {
            return Err(format!("{}: ping answered {r}", c.sub));
        }
        Ok(())
    }
}

// ─── the checks after every step ────────────────────────────────────────────

impl Run<'_> {
    async fn check(&mut self) -> Result<(), String> {
        self.check_lists().await?;
        for i in 0..CLIENTS {
            self.check_root(i).await?;
        }
        self.check_tokens().await
    }

    /// Every frame client `i` received since the last check is allowed:
    /// catalog notifications only for sessions it may see; root actions
    /// are applied to its root state.
    fn check_frames(&mut self, i: usize) -> Result<(), String> {
        let c = &mut self.clients[i];
        for v in std::mem::take(&mut c.log) {
            let method = v["method"].as_str().unwrap_or_default();
            match method {
                "action" if v["params"]["channel"] == ROOT => {
                    let seq = v["params"]["serverSeq"].as_u64().unwrap_or(0);
                    if seq <= c.root_from {
                        return Err(format!(
                            "{}: root action #{seq} at or below its snapshot's fromSeq {}",
                            c.sub, c.root_from
                        ));
                    }
                    let env = envelopes(&json!([v["params"]]));
                    c.root = reduce_root(&c.root, &env);
                    self.trace.push(format!(
                        "{} root action {} #{}",
                        c.sub, v["params"]["action"], v["params"]["serverSeq"]
                    ));
                }
                "root/sessionAdded" | "root/sessionSummaryChanged" => {
                    let uri = v["params"]["summary"]["resource"]
                        .as_str()
                        .or(v["params"]["session"].as_str())
                        .unwrap_or_default();
                    if !self.model.sees(&c.sub, &c.groups, uri) {
                        return Err(format!("{}: {method} of {uri}, invisible to it", c.sub));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Each client's `listSessions` is exactly what the model shows it.
    /// Its answer follows every frame queued for the client before it, so
    /// those are checked first ([`Self::check_frames`]).
    async fn check_lists(&mut self) -> Result<(), String> {
        for i in 0..CLIENTS {
            let c = &mut self.clients[i];
            let r = c.call("listSessions", json!({"channel": ROOT})).await?;
            self.check_frames(i)?;
            let c = &self.clients[i];
            let got: BTreeSet<String> = r["result"]["items"]
                .as_array()
                .ok_or_else(|| format!("{}: listSessions: {r}", c.sub))?
                .iter()
                .filter_map(|s| s["resource"].as_str().map(str::to_string))
                .collect();
            let want = self.model.visible(&c.sub, &c.groups);
            if got != want {
                return Err(format!(
                    "{} (groups {:?}) lists {got:?}, model {want:?}",
                    c.sub, c.groups
                ));
            }
        }
        Ok(())
    }

    /// Client `i`'s root lists the agents of exactly the hosts it may see
    /// and counts exactly the sessions it may see. Root actions of a
    /// catalog change are fanned out after its notification, to every
    /// follower in turn: the root is read until it agrees (bounded).
    async fn check_root(&mut self, i: usize) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            self.check_frames(i)?;
            let Err(e) = self.root_agrees(i) else {
                return Ok(());
            };
            let c = &mut self.clients[i];
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match c.ws.next_within(left).await {
                Some(Next::Frame(v)) => c.log.push(v),
                Some(Next::Closed(code)) => return Err(format!("{}: closed {code:?}: {e}", c.sub)),
                None => return Err(e),
            }
        }
    }

    fn root_agrees(&self, i: usize) -> Result<(), String> {
        let c = &self.clients[i];
        let agents: BTreeSet<String> = c.root["agents"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a["provider"].as_str().map(str::to_string))
            .collect();
        let want = self.model.agents(&c.sub, &c.groups);
        if agents != want {
            return Err(format!("{}: root agents {agents:?}, model {want:?}", c.sub));
        }
        let terminals: BTreeSet<String> = c.root["terminals"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["resource"].as_str().map(str::to_string))
            .collect();
        let want = self.model.visible_terminals(&c.sub, &c.groups);
        if terminals != want {
            return Err(format!(
                "{}: root terminals {terminals:?}, model {want:?}",
                c.sub
            ));
        }
        let count = c.root["activeSessions"].as_u64().unwrap_or(0) as usize;
        let visible = self.model.visible(&c.sub, &c.groups).len();
        if count != visible {
            return Err(format!(
                "{}: root activeSessions {count}, model {visible}",
                c.sub
            ));
        }
        Ok(())
    }

    /// A host holds a client's `authenticate` token only where the model
    /// lets its principal operate (§4.6, §7.6). A revocation is a frame
    /// on the link: waited for, bounded.
    async fn check_tokens(&self) -> Result<(), String> {
        let deadline = Instant::now() + WAIT;
        loop {
            let wrong = self.tokens_out_of_place();
            if wrong.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "tokens where the principal may not operate: {wrong:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn tokens_out_of_place(&self) -> Vec<String> {
        let mut wrong = Vec::new();
        for c in &self.clients {
            let up = self.t.upstream_id(&c.sub, &c.cid);
            for (h, host) in self.t.hosts.iter().enumerate() {
                let operates = self
                    .model
                    .grant(&c.sub, &c.groups, h)
                    .is_some_and(GrantM::operates);
                let held = !host.tokens_of(&up).is_empty();
                if held {
                    count("token held");
                }
                if !operates && held {
                    wrong.push(format!("{} at {}", c.sub, HOSTS[h]));
                }
            }
        }
        wrong
    }

    /// After a run: the janitor disposes what the run created, everyone
    /// leaves.
    async fn finish(mut self) -> Result<(), String> {
        self.restore().await?;
        let created: Vec<String> = self
            .model
            .sessions
            .iter()
            .filter(|(_, s)| s.owner.is_some())
            .map(|(u, _)| u.clone())
            .collect();
        for uri in created {
            let r = self
                .janitor
                .call("disposeSession", json!({"channel": uri}))
                .await?;
            if r.get("result").is_none() {
                return Err(format!("janitor: dispose {uri}: {r}"));
            }
            self.removed(&uri).await?;
        }
        for c in self.clients.drain(..) {
            if c.closed.is_none() {
                c.ws.close_cleanly().await;
            }
        }
        self.janitor.log.clear();
        Ok(())
    }
}

// ─── the campaign ───────────────────────────────────────────────────────────

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

async fn run_seed(t: &TestRelay, janitor: &mut Cl, seed: u64, steps: usize) {
    let mut run = Run {
        t,
        seed,
        rng: Rng(SplitMix64::new(seed)),
        model: Model::default(),
        clients: Vec::new(),
        janitor,
        trace: Vec::new(),
        created: 0,
    };
    let mut outcome = run.start().await;
    for _ in 0..steps {
        if outcome.is_err() {
            break;
        }
        outcome = run.step().await;
    }
    let trace = run.trace.clone();
    if outcome.is_ok() {
        outcome = run.finish().await.map_err(|e| format!("cleanup: {e}"));
    }
    if let Err(e) = outcome {
        let tail: Vec<&str> = trace
            .iter()
            .rev()
            .take(40)
            .rev()
            .map(String::as_str)
            .collect();
        panic!(
            "model run seed {seed} failed: {e}\nsteps:\n{}\nreplay: \
             AHP_RELAY_MODEL_SEED={seed} cargo test --test relay_model -- --nocapture",
            tail.join("\n")
        );
    }
}

/// A relay in front of two fresh simhosts, and its janitor.
async fn lane() -> (TestRelay, Cl) {
    let hosts: Vec<_> = HOSTS
        .iter()
        .map(|h| {
            let mut c = fast_config(h, 1);
            c.protected_resources = vec![RESOURCE.into()];
            c.terminals = 1;
            c
        })
        .collect();
    let extra = format!("\n{JANITOR_RULE}\n[limits]\ndetach_grace_secs = 0\nretain_secs = 1\n");
    let t = TestRelay::start(hosts, &extra).await;
    let janitor = Cl::open(&t, "janitor", "j", vec![])
        .await
        .expect("janitor initializes");
    (t, janitor)
}

/// ≥ 200 seeded runs, [`LANES`] relays side by side, each running its
/// share of the seeds one after the other (see the module doc).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_allows_exactly_what_the_model_allows() {
    let steps = env_u64("AHP_RELAY_MODEL_STEPS").map_or(STEPS, |s| s as usize);
    let seeds: Vec<u64> = match env_u64("AHP_RELAY_MODEL_SEED") {
        Some(s) => vec![s],
        None => {
            let base = env_u64("AHP_RELAY_MODEL_BASE").unwrap_or(1);
            let n = env_u64("AHP_RELAY_MODEL_SEEDS").unwrap_or(SEEDS);
            (base..base + n).collect()
        }
    };
    let started = Instant::now();
    let lanes = (0..LANES).map(|l| {
        let mine: Vec<u64> = seeds.iter().copied().skip(l).step_by(LANES).collect();
        async move {
            if mine.is_empty() {
                return;
            }
            let (t, mut janitor) = lane().await;
            for seed in mine {
                run_seed(&t, &mut janitor, seed, steps).await;
            }
        }
    });
    futures_util::future::join_all(lanes).await;
    let seen = SEEN.lock().unwrap_or_else(|e| e.into_inner()).clone();
    println!("{seen:?}");
    if seeds.len() >= 100 {
        // Every kind of event and outcome happened across the runs.
        for kind in [
            "create allowed",
            "create refused",
            "late create",
            "dispose allowed",
            "dispose refused",
            "subscribe allowed",
            "subscribe refused",
            "reload",
            "closed 4000",
            "reconnect snapshot",
            "claim",
            "move allowed",
            "move refused",
            "regrouped",
            "authenticate",
            "token held",
        ] {
            assert!(
                seen.get(kind).is_some_and(|n| *n > 0),
                "no {kind} in {seen:?}"
            );
        }
    }
    println!(
        "relay_model: {} seeds × {steps} steps in {:.1?}",
        seeds.len(),
        started.elapsed()
    );
}

/// A relay in front of simhost h1 where everyone operates, and alice,
/// who created session `uri` through it.
async fn relay_with_session(uri: &str) -> (TestRelay, Cl) {
    let rules = common::relay::rule("all", &["*"], &["*"], "operator", "all", "");
    let t = TestRelay::start(vec![fast_config("h1", 0)], &rules).await;
    let mut alice = Cl::open(&t, "alice", "a", vec![]).await.expect("alice");
    let params = json!({"channel": uri, "provider": "sim.h1"});
    let r = alice.call("createSession", params).await.expect("answered");
    assert_eq!(r["result"], Value::Null, "{r}");
    (t, alice)
}

/// `c` disposes session `uri` (answered) while h1 holds its catalog
/// events: the host's `root/sessionRemoved` waits until released.
async fn dispose_held(t: &TestRelay, c: &mut Cl, uri: &str) {
    t.hosts[0].hold_catalog_events(true);
    let params = json!({"channel": uri});
    let r = c.call("disposeSession", params).await.expect("answered");
    assert_eq!(r["result"], Value::Null, "{r}");
}

/// The sessions and chats `c`'s `listSessions` names that `keep` keeps.
async fn listed(c: &mut Cl, keep: impl Fn(&str) -> bool) -> Vec<String> {
    let r = c
        .call("listSessions", json!({"channel": ROOT}))
        .await
        .expect("list");
    let items = r["result"]["items"].as_array().cloned().unwrap_or_default();
    let chats = items
        .iter()
        .flat_map(|i| i["chats"].as_array().cloned().unwrap_or_default());
    items
        .iter()
        .cloned()
        .chain(chats)
        .filter_map(|v| v["resource"].as_str().map(str::to_string))
        .filter(|u| keep(u))
        .collect()
}

/// Waits until the relay's dispose of `uri` has tombstoned its entry.
async fn tombstoned(t: &TestRelay, uri: &str) {
    let store = t.relay.relay.store.clone();
    wait_until("the dispose tombstoned the entry", || {
        store
            .lookup(uri)
            .ok()
            .flatten()
            .is_some_and(|e| matches!(e.state, ahp_relay::names::store::UriState::Tombstone { .. }))
    })
    .await;
}

/// Found by the model run (§4.2, §6.4): the host's `root/sessionRemoved`
/// for a client-chosen session can reach the relay after the dispose's
/// answer tombstoned its store entry; it still names the session as its
/// followers know it (`ahp-session:/gone-1`), not as a host-assigned
/// `ahp-session:/h1~gone-1` they never saw.
#[tokio::test]
async fn a_removal_after_the_dispose_answer_keeps_the_client_name() {
    let uri = "ahp-session:/gone-1";
    let (t, mut alice) = relay_with_session(uri).await;
    // Bob follows the root from the start: he has the session in his list.
    let mut bob = Cl::open(&t, "bob", "b", vec![]).await.expect("bob");
    dispose_held(&t, &mut alice, uri).await;
    tombstoned(&t, uri).await;
    t.hosts[0].hold_catalog_events(false);
    let removed = |v: &Value| v["method"] == "root/sessionRemoved";
    let got = bob
        .wait_for("sessionRemoved", removed)
        .await
        .expect("removed");
    assert_eq!(got["params"]["session"], uri, "{got}");
}

/// A `listSessions` right after a dispose was answered (§6.3), while the
/// host's `root/sessionRemoved` has not reached the relay yet, does not
/// list the disposed session — neither by its name nor as a host-assigned
/// `ahp-session:/h1~gone-l` nobody ever saw — before or after the
/// tombstone is written, nor once the removal arrived.
#[tokio::test]
async fn a_listing_after_the_dispose_answer_omits_the_session() {
    let uri = "ahp-session:/gone-l";
    let (t, mut alice) = relay_with_session(uri).await;
    // The session under any name, not its default chat (`ahp-chat:/h1~gone-l-main`).
    let part = |u: &str| u.starts_with("ahp-session:") && u.contains("gone-l");
    assert_eq!(listed(&mut alice, part).await, [uri]);
    dispose_held(&t, &mut alice, uri).await;
    // Root's count follows the listing, the removal still held.
    let zero = |v: &Value| v["params"]["action"]["activeSessions"] == 0;
    alice
        .wait_for("activeSessions 0", zero)
        .await
        .expect("recounted");
    let mut bob = Cl::open(&t, "bob", "b", vec![]).await.expect("bob");
    let none = Vec::<String>::new();
    for c in [&mut alice, &mut bob] {
        assert_eq!(listed(c, part).await, none, "{}", c.sub);
    }
    tombstoned(&t, uri).await;
    assert_eq!(listed(&mut bob, part).await, none, "after the tombstone");
    t.hosts[0].hold_catalog_events(false);
    let removed = |v: &Value| notification_of(v, "root/sessionRemoved", uri);
    bob.wait_for("sessionRemoved", removed)
        .await
        .expect("removed");
    assert_eq!(listed(&mut bob, part).await, none, "after the removal");
}

/// The same for a chat (§6.3): after a `disposeChat` was answered, while
/// the host's summary change has not reached the relay yet, the listing
/// of its session names neither the chat nor a host-assigned
/// `ahp-chat:/h1~gone-lc` nobody ever saw.
#[tokio::test]
async fn a_listing_after_a_chat_dispose_answer_omits_the_chat() {
    let session = "ahp-session:/gone-ls";
    let chat = "ahp-chat:/gone-lc";
    let (t, mut alice) = relay_with_session(session).await;
    let lc = |u: &str| u.contains("gone-lc");
    let params = json!({"channel": session, "chat": chat});
    let r = alice.call("createChat", params).await.expect("answered");
    assert_eq!(r["result"], Value::Null, "{r}");
    // The chats named `*gone-lc*` in a summary change.
    let changed = |v: &Value| -> Vec<String> {
        let chats = v["params"]["changes"]["chats"].as_array();
        chats
            .into_iter()
            .flatten()
            .filter_map(|c| c["resource"].as_str().map(str::to_string))
            .filter(|u| u.contains("gone-lc"))
            .collect()
    };
    let is_change = |v: &Value| v["method"] == "root/sessionSummaryChanged";
    let added = |v: &Value| is_change(v) && changed(v) == [chat];
    alice.wait_for("chat listed", added).await.expect("listed");
    assert_eq!(listed(&mut alice, lc).await, [chat]);
    t.hosts[0].hold_catalog_events(true);
    let r = alice
        .call("disposeChat", json!({"channel": chat}))
        .await
        .expect("answered");
    assert_eq!(r["result"], Value::Null, "{r}");
    let none = Vec::<String>::new();
    assert_eq!(listed(&mut alice, lc).await, none, "before the tombstone");
    tombstoned(&t, chat).await;
    assert_eq!(listed(&mut alice, lc).await, none, "after the tombstone");
    t.hosts[0].hold_catalog_events(false);
    // The host's change unlisting it comes through, and the listing stays so.
    let unlisted = |v: &Value| is_change(v) && v["params"]["changes"]["chats"].is_array();
    let got = alice
        .wait_for("chat unlisted", unlisted)
        .await
        .expect("unlisted");
    assert_eq!(changed(&got), none, "{got}");
    assert_eq!(
        listed(&mut alice, lc).await,
        none,
        "after the host's change"
    );
}

/// The same for an envelope (§4.2): a subscriber of alice's session whose
/// link delivers `session/chatRemoved` after the relay answered alice's
/// `disposeChat` (and tombstoned the chat) gets the chat by the name it
/// knows, `ahp-chat:/gone-c`, so its reducer removes it.
#[tokio::test]
async fn a_chat_removal_after_the_dispose_answer_keeps_the_client_name() {
    let rules = common::relay::rule("all", &["*"], &["*"], "operator", "all", "");
    let t = TestRelay::start(vec![fast_config("h1", 0)], &rules).await;
    let (session, chat) = ("ahp-session:/gone-s", "ahp-chat:/gone-c");
    let mut alice = Cl::open(&t, "alice", "a", vec![]).await.expect("alice");
    for (method, params) in [
        (
            "createSession",
            json!({"channel": session, "provider": "sim.h1"}),
        ),
        ("createChat", json!({"channel": session, "chat": chat})),
    ] {
        let r = alice.call(method, params).await.expect("answered");
        assert_eq!(r["result"], Value::Null, "{method}: {r}");
    }
    let mut bob = Cl::open(&t, "bob", "b", vec![]).await.expect("bob");
    let r = bob
        .call("subscribe", json!({"channel": session}))
        .await
        .expect("subscribed");
    assert!(r.get("result").is_some(), "{r}");
    t.hosts[0].stall_client(&t.upstream_id("bob", "b"), true);
    let r = alice
        .call("disposeChat", json!({"channel": chat}))
        .await
        .expect("dispose answered");
    assert_eq!(r["result"], Value::Null, "{r}");
    tombstoned(&t, chat).await;
    t.hosts[0].stall_client(&t.upstream_id("bob", "b"), false);
    let removed = |v: &Value| v["params"]["action"]["type"] == "session/chatRemoved";
    let got = bob.wait_for("chatRemoved", removed).await.expect("removed");
    assert_eq!(got["params"]["action"]["chat"], chat, "{got}");
}

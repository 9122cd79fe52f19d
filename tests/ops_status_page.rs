//! The status page in a real headless browser (Debian `chromium`, driven
//! over the DevTools protocol): it loads from the admin listener, asks for
//! the admin token in its form (never in a URL), shows the simhosts, and
//! marks one down within 5 s of stopping it, live. A
//! screenshot of that state goes to `target/ops-status-page.png`; the page
//! text as the browser saw it is printed. Its charts (inline SVG drawn by
//! the page from the feed's history) show a streamed turn's throughput and
//! end a stopped host's RTT line; that screenshot goes to the test's
//! scratch dir.

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use base64::Engine as _;
use common::fast_config;
use common::relay::{TestRelay, admin_get, admin_get_as, rule};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio_tungstenite::tungstenite::Message;

/// The browser binary: `$AHP_RELAY_CHROMIUM`, else `chromium` on the PATH
/// (`.ci/run` installs it).
fn chromium() -> String {
    std::env::var("AHP_RELAY_CHROMIUM").unwrap_or_else(|_| "chromium".into())
}

/// A headless browser and a DevTools session attached to one page.
struct Browser {
    child: Child,
    ws: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
    session: String,
    next_id: u64,
    _profile: PathBuf,
}

impl Browser {
    /// Starts chromium and opens `url` in a new page.
    async fn open(url: &str) -> Self {
        let profile = common::relay::scratch_dir("chromium");
        let mut child = Command::new(chromium())
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--window-size=1200,900",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("chromium starts (install the `chromium` package; .ci/run does)");
        let stderr = child.stderr.take().expect("stderr piped");
        let mut lines = BufReader::new(stderr).lines();
        let endpoint = tokio::time::timeout(Duration::from_secs(30), async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(at) = line.find("ws://") {
                    return line[at..].trim().to_string();
                }
            }
            panic!("chromium exited without a DevTools endpoint");
        })
        .await
        .expect("DevTools endpoint in time");
        // Keep draining stderr so the browser never blocks on it.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let (ws, _) = tokio_tungstenite::connect_async(endpoint.as_str())
            .await
            .expect("DevTools socket");
        let mut b = Browser {
            child,
            ws,
            session: String::new(),
            next_id: 0,
            _profile: profile,
        };
        let target = b.call("Target.createTarget", json!({"url": url})).await;
        let target = target["targetId"].as_str().expect("targetId").to_string();
        let attached = b
            .call(
                "Target.attachToTarget",
                json!({"targetId": target, "flatten": true}),
            )
            .await;
        b.session = attached["sessionId"].as_str().expect("sessionId").into();
        b
    }

    /// One DevTools command (on the page once attached); its result.
    async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if !self.session.is_empty() {
            msg["sessionId"] = json!(self.session);
        }
        self.ws
            .send(Message::text(msg.to_string()))
            .await
            .expect("DevTools send");
        loop {
            let frame = tokio::time::timeout(Duration::from_secs(20), self.ws.next())
                .await
                .expect("DevTools answer in time")
                .expect("DevTools socket open")
                .expect("DevTools frame");
            let Message::Text(t) = frame else { continue };
            let v: Value = serde_json::from_str(t.as_str()).expect("DevTools JSON");
            if v["id"] == json!(id) {
                assert!(v.get("error").is_none(), "{method}: {v}");
                return v["result"].clone();
            }
        }
    }

    /// The page's visible text.
    async fn text(&mut self) -> String {
        let r = self
            .call(
                "Runtime.evaluate",
                json!({"expression": "document.body ? document.body.innerText : ''",
                       "returnByValue": true}),
            )
            .await;
        r["result"]["value"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// Polls the page text until `cond` holds, at most `within`.
    async fn text_until(&mut self, within: Duration, cond: impl Fn(&str) -> bool) -> String {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let text = self.text().await;
            if cond(&text) {
                return text;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "page never showed the expected state; it shows:\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The value of `expression` evaluated in the page.
    async fn eval(&mut self, expression: &str) -> Value {
        let r = self
            .call(
                "Runtime.evaluate",
                json!({"expression": expression, "returnByValue": true}),
            )
            .await;
        r["result"]["value"].clone()
    }

    /// Polls `expression` until it is `true`, at most `within`; `what`
    /// names the awaited state (with the page text) if it never comes.
    async fn until(&mut self, within: Duration, what: &str, expression: &str) {
        let deadline = tokio::time::Instant::now() + within;
        while self.eval(expression).await != json!(true) {
            if tokio::time::Instant::now() >= deadline {
                let text = self.text().await;
                panic!("{what} never came; the page shows:\n{text}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Types the admin token of `t` into the page's form and submits it.
    async fn log_in(&mut self, t: &TestRelay) {
        self.text_until(common::WAIT, |text| text.contains("needs an admin token"))
            .await;
        let fill = format!(
            "document.getElementById('token').value = {:?}; \
             document.getElementById('login').requestSubmit(); true",
            t.token("ops")
        );
        self.eval(&fill).await;
    }

    /// Writes a PNG screenshot of the page to `path`.
    async fn screenshot(&mut self, path: &std::path::Path) {
        let shot = self
            .call("Page.captureScreenshot", json!({"format": "png"}))
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().expect("screenshot data"))
            .expect("base64 PNG");
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        std::fs::write(path, png).expect("screenshot written");
    }

    async fn close(mut self) {
        let _ = self.call("Browser.close", json!({})).await;
        let _ = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
    }
}

/// The row of host `id` in the page text (tab-separated table cells).
fn host_row<'a>(text: &'a str, id: &str) -> Option<&'a str> {
    text.lines()
        .find(|l| l.split('\t').next().map(str::trim) == Some(id))
}

#[tokio::test]
async fn status_page_marks_a_stopped_host_down_live() {
    let mut t = TestRelay::start(vec![fast_config("alpha", 2), fast_config("beta", 1)], "").await;
    let _client = t.client_init("alice", "window-1").await;
    let (code, body) = admin_get(&t, "/status").await;
    assert_eq!(code, 200);
    assert!(
        body.contains("/status/feed"),
        "the page opens the live feed"
    );

    if !common::external(&chromium()) {
        return;
    }
    let url = format!("http://{}/status", t.relay.admin_addr());
    let mut browser = Browser::open(&url).await;
    browser.log_in(&t).await;
    let token = t.token("ops");
    let up = browser
        .text_until(common::WAIT, |text| {
            ["alpha", "beta"]
                .iter()
                .all(|id| host_row(text, id).is_some_and(|r| r.contains("\tup\t")))
                && text.contains("alice")
        })
        .await;
    assert!(up.contains("live"), "{up}");
    let replica = format!("replica {}", ahp_relay::config::default_replica());
    assert!(up.contains(&replica), "the page names the replica: {up}");
    assert!(up.contains("redb · healthy"), "and the store: {up}");
    let href = browser
        .call(
            "Runtime.evaluate",
            json!({"expression": "location.href", "returnByValue": true}),
        )
        .await;
    let href = href["result"]["value"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(href, url, "the token never enters the page's URL");
    assert!(!href.contains(&token));

    let beta = t.hosts.pop().expect("beta");
    let beta_addr = beta.addr().to_string();
    beta.drop_connections();
    drop(beta);
    let down = browser
        .text_until(Duration::from_secs(5), |text| {
            host_row(text, "beta").is_some_and(|r| r.contains("unreachable"))
        })
        .await;
    let alpha = host_row(&down, "alpha").expect("alpha row");
    assert!(alpha.contains("\tup\t"), "{alpha}");
    assert!(
        !down.contains(&beta_addr),
        "the page never shows a host URL: {down}"
    );
    let shot = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .map(|p| p.join("ops-status-page.png"))
        .expect("target dir");
    browser.screenshot(&shot).await;
    println!("status page as the browser saw it:\n{down}");
    browser.close().await;
}

/// A chart series' path attribute: `document.querySelector` of the path
/// named `series` in chart `chart`, then `.dataset.<attr>`.
fn series_attr(chart: &str, series: &str, attr: &str) -> String {
    format!(
        "(document.querySelector('#chart-{chart} path[data-series=\"{series}\"]') || \
         {{dataset: {{}}}}).dataset.{attr}"
    )
}

/// The charts in a browser: after a short streamed turn the actions-per-
/// second chart has a point above zero; after a host stops, its RTT line
/// ends (its newest point is a gap after earlier points) while the other
/// host's goes on. The screenshot is a non-empty PNG in the scratch dir.
/// (A 20 s history, so the screenshot shows the lines at a readable scale.)
#[tokio::test]
async fn status_page_charts_a_turn_and_end_a_stopped_hosts_rtt_line() {
    let limits = "\n[limits]\nstatus_history_secs = 20\n";
    let hosts = vec![fast_config("alpha", 1), fast_config("beta", 1)];
    let mut t = TestRelay::start(hosts, limits).await;
    let mut ws = t.raw("alice").await;
    ws.initialize("charts").await;
    let (chat, _) = common::seeded_chat("alpha", 1);
    let sub = ws.request(1, "subscribe", json!({"channel": chat})).await;
    assert!(sub.get("result").is_some(), "{sub}");
    let (code, body) = admin_get_as(&t, "ops", "/status.json").await;
    assert_eq!(code, 200);
    let v: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(v["history"]["capacity"], 40, "20 s of 500 ms points: {v}");

    if !common::external(&chromium()) {
        return;
    }
    let url = format!("http://{}/status", t.relay.admin_addr());
    let mut browser = Browser::open(&url).await;
    browser.log_in(&t).await;
    let rtt_last = |id: &str| series_attr("rtt", id, "last");
    let both_up = format!("{} > 0 && {} > 0", rtt_last("alpha"), rtt_last("beta"));
    browser
        .until(common::WAIT, "both hosts' RTT", &both_up)
        .await;

    ws.dispatch(&chat, 1, common::turn_started("turn-1", "go"))
        .await;
    let turn =
        common::raw_actions_until(&mut ws, |e| common::is(e, &chat, "chat/turnComplete")).await;
    assert!(turn.len() >= 5, "a streamed turn: {} envelopes", turn.len());
    let busy = format!("{} > 0", series_attr("actions", "actions/s", "max"));
    browser
        .until(common::WAIT, "a non-zero actions/s point", &busy)
        .await;

    let beta = t.hosts.pop().expect("beta");
    beta.drop_connections();
    drop(beta);
    let ended = format!(
        "{} === '' && {} > 1 && {} > 0",
        rtt_last("beta"),
        series_attr("rtt", "beta", "points"),
        rtt_last("alpha")
    );
    browser
        .until(common::WAIT, "the end of beta's RTT line", &ended)
        .await;

    let dir = common::relay::scratch_dir("status-charts");
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let shot = dir.join("status-charts.png");
    browser.screenshot(&shot).await;
    let png = std::fs::read(&shot).expect("screenshot kept");
    assert!(png.len() > 1000 && png.starts_with(b"\x89PNG"), "a PNG");
    println!("screenshot: {}", shot.display());
    browser.close().await;
}

/// `GET path` on the client listener with `token` as bearer header: the
/// status and body.
async fn client_get(t: &TestRelay, path: &str, token: Option<&str>) -> (u16, String) {
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", t.relay.addr.port()))
        .await
        .expect("connect");
    let connector =
        tokio_rustls::TlsConnector::from(Arc::new(common::relay::trusting(&t.kit.cert)));
    let name = rustls_pki_types::ServerName::try_from("localhost").expect("name");
    let mut tls = connector.connect(name, tcp).await.expect("TLS");
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n");
    tls.write_all(req.as_bytes()).await.expect("request");
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(common::WAIT, tls.read_to_end(&mut buf)).await;
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status");
    (code, body.to_string())
}

/// On the client listener the status page answers only principals with an
/// `admin` grant: 401 without a token, 403 for an operator, the data for
/// the admin.
#[tokio::test]
async fn client_listener_status_needs_an_admin_grant() {
    let policy = rule("ops-admin", &["ops"], &["*"], "admin", "all", "")
        + &rule("alice-operator", &["alice"], &["*"], "operator", "all", "")
        + &rule("carol-viewer", &["carol"], &["*"], "viewer", "all", "");
    let t = TestRelay::start(vec![fast_config("alpha", 1)], &policy).await;
    assert_eq!(client_get(&t, "/status.json", None).await.0, 401);
    let alice = t.token("alice");
    assert_eq!(client_get(&t, "/status.json", Some(&alice)).await.0, 403);
    let ops = t.token("ops");
    let (code, body) = client_get(&t, "/status.json", Some(&ops)).await;
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(v["hosts"][0]["id"], "alpha", "{v}");
    assert_eq!(v["hosts"][0]["state"], "up", "{v}");
    let (code, page) = client_get(&t, "/status", Some(&ops)).await;
    assert_eq!(code, 200);
    assert!(page.contains("<title>ahp-relay status</title>"));
    let (_, metrics) = admin_get(&t, "/metrics").await;
    assert!(
        metrics.contains("ahp_relay_auth_failures_total{reason=\"missing_token\"} 1"),
        "the refused request is counted: {metrics}"
    );
}

/// A refusal shows among the recent denials (no message text); host frames
/// and a `reconnect` land in the latency histograms.
#[tokio::test]
async fn denials_and_latency_histograms() {
    let policy = rule("carol-viewer", &["carol"], &["*"], "viewer", "all", "")
        + &rule("ops-admin", &["ops"], &["*"], "admin", "all", "");
    let t = TestRelay::start(vec![fast_config("alpha", 1)], &policy).await;
    let mut ws = t.raw("carol").await;
    ws.initialize("c").await;
    let read = ws
        .request(
            1,
            "subscribe",
            json!({"channel": "ahp-chat:/alpha~alpha-1-main"}),
        )
        .await;
    assert!(read.get("result").is_some(), "{read}");
    let create = ws
        .request(
            2,
            "createSession",
            json!({"channel": "ahp-session:/mine", "provider": "sim.alpha"}),
        )
        .await;
    assert_eq!(create["error"]["code"], -32009, "{create}");
    let mut other = t.raw("carol").await;
    let gone = other
        .request(
            3,
            "reconnect",
            json!({"channel": "ahp-root://", "clientId": "never", "lastSeenServerSeq": 0,
                   "subscriptions": []}),
        )
        .await;
    assert_eq!(gone["error"]["code"], -32008, "{gone}");

    let (_, body) = admin_get_as(&t, "ops", "/status.json").await;
    let v: Value = serde_json::from_str(&body).expect("JSON");
    let denial = v["denials"]
        .as_array()
        .and_then(|d| d.iter().find(|d| d["subject"] == "carol").cloned())
        .expect("carol's refusal is listed");
    assert_eq!(denial["operation"], "createSession", "{denial}");
    assert_eq!(denial["decision"], "deny", "{denial}");
    assert_eq!(v["reconnects"]["not_found"], 1, "{v}");
    let (_, metrics) = admin_get(&t, "/metrics").await;
    let frames = common::relay::metric(
        &metrics,
        "ahp_relay_host_frame_latency_seconds_count{host=\"alpha\"}",
    );
    assert!(frames.is_some_and(|n| n >= 1.0), "{metrics}");
    assert_eq!(
        common::relay::metric(&metrics, "ahp_relay_reconnect_duration_seconds_count"),
        Some(1.0)
    );
}

/// `/metrics` and `/status.json` name this replica (`[relay] replica`) and
/// its URI store: `ahp_relay_info{replica, store}` = 1,
/// `ahp_relay_store_up{backend}` = 1, the last check's latency and, after
/// a create of a client-chosen URI, its store write's; the same in the
/// status data the page shows (issue 19).
#[tokio::test]
async fn metrics_and_status_name_the_replica_and_the_store() {
    let policy = rule("ops-admin", &["ops"], &["*"], "admin", "all", "");
    let t = TestRelay::start_tweaked(vec![fast_config("alpha", 1)], "", &policy, |cfg| {
        cfg.relay.replica = Some("relay-b".into());
    })
    .await;
    t.wait_hosts_up().await;
    let mut ws = t.raw("ops").await;
    ws.initialize("ops-1").await;
    let create = ws
        .request(
            1,
            "createSession",
            json!({"channel": "ahp-session:/ops-own", "provider": "sim.alpha"}),
        )
        .await;
    assert!(create.get("result").is_some(), "{create}");
    let (_, metrics) = admin_get(&t, "/metrics").await;
    common::relay::assert_metrics(
        &metrics,
        &[
            ("ahp_relay_info{replica=\"relay-b\",store=\"redb\"}", 1.0),
            ("ahp_relay_store_up{backend=\"redb\"}", 1.0),
            ("ahp_relay_store_write_seconds_count", 1.0),
        ],
    );
    let probe = common::relay::metric(&metrics, "ahp_relay_store_health_seconds");
    assert!(probe.is_some_and(|s| s >= 0.0), "{metrics}");

    let (_, body) = admin_get_as(&t, "ops", "/status.json").await;
    let v: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(v["relay"]["replica"], "relay-b", "{v}");
    assert_eq!(v["relay"]["version"], env!("CARGO_PKG_VERSION"), "{v}");
    assert_eq!(v["store"]["backend"], "redb", "{v}");
    assert_eq!(v["store"]["healthy"], true, "{v}");
    assert!(
        v["store"]["latency_ms"]
            .as_f64()
            .is_some_and(|ms| ms >= 0.0),
        "{v}"
    );
    assert_eq!(v["store"]["writes"], 1, "{v}");
    let last = v["store"]["last_write_ms"].as_f64();
    assert!(last.is_some_and(|ms| ms > 0.0), "{v}");
}

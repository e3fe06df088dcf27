//! The dashboard in a real browser: Debian's headless Chromium driven over
//! WebDriver by Debian's chromedriver (`apt-get install chromium
//! chromium-driver`; `scripts/test` installs them). The page loads with
//! nothing from elsewhere, its charts draw, it shows the pipeline, alerts,
//! annotations, named checks and incidents, and, without a reload, a late event makes a
//! revised row appear. It runs under its Content-Security-Policy, and a new
//! token in the address's fragment counts only after a reload. A screenshot is kept in `target/artifacts/`.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::{authed, make_token, repo_root, start, tokens_of, Scratch};
use serde_json::{json, Value};

const CONTRACT: &str = r#"
[pipeline]
name = "paid"
version = 3
owner = "billing-ops"
steward = "data-platform"
decision = "Unlock paid features"

[source]
topic = "payments"
event_time = "t"
key = ["acct"]
event_id = "id"
max_delay = "0s"

[window]
type = "tumbling"
size = "1m"
allowed_lateness = "10m"
late = "revise"

[[aggregate]]
name = "total"
fn = "sum"
field = "amount"

[alerts]
max_watermark_age = "10m"

[[check]]
name = "fresh"
severity = "warn"
question = "Has the payments producer stopped sending?"
freshness = "10m"

[[check]]
name = "total_positive"
severity = "warn"
question = "Can a minute's payments add up to nothing?"
row = "values.total > 0"

[[destination]]
name = "accounts"
kind = "http"
connection = "accounts"
"#;

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).build().into()
}

fn post(url: &str, body: &str) -> (u16, String) {
    let mut r = authed(agent().post(url), "POST", url).header("content-type", "application/json").send(body).unwrap();
    (r.status().as_u16(), r.body_mut().read_to_string().unwrap())
}

/// Event times in November 2025: a year behind the clock, so the watermark
/// age alert fires.
fn event(id: u32, acct: u32, t_s: i64, amount: &str) -> String {
    let t = weir_engine::time::format_rfc3339_ms(1_764_374_400_000 + t_s * 1_000);
    format!(r#"{{"id":"p{id}","acct":"a{acct}","t":"{t}","amount":{amount}}}"#)
}

/// A chromedriver process and one session of headless Chromium.
struct Browser {
    driver: Child,
    url: String,
    session: String,
    _profile: Scratch,
}

impl Browser {
    fn start() -> Browser {
        let driver_path = std::env::var("WEIR_CHROMEDRIVER").unwrap_or_else(|_| "/usr/bin/chromedriver".into());
        let chromium = std::env::var("WEIR_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
        for p in [&driver_path, &chromium] {
            assert!(
                std::path::Path::new(p).exists(),
                "{p} is missing: the dashboard test needs Debian's chromium and chromium-driver \
                 (apt-get install chromium chromium-driver; scripts/test installs them)"
            );
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let driver = Command::new(&driver_path)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {driver_path}: {e}"));
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while agent().get(&format!("{url}/status")).call().is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not answer on {url}");
            std::thread::sleep(Duration::from_millis(100));
        }
        let profile = Scratch::new("chromium-profile");
        let mut b = Browser { driver, url, session: String::new(), _profile: profile };
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-quic",
            "--no-first-run",
            "--window-size=1400,1800",
            &format!("--user-data-dir={}", b._profile.0.display()),
        ];
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium, "args": args},
        }}});
        let answer = b.call("POST", "/session", Some(caps));
        b.session = answer["sessionId"].as_str().unwrap_or_else(|| panic!("no session: {answer}")).to_owned();
        b
    }

    /// One WebDriver command; the answer's `value`.
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}{path}", self.url);
        let mut r = match (method, body) {
            ("POST", Some(b)) => agent().post(&url).header("content-type", "application/json").send(b.to_string()),
            ("DELETE", _) => agent().delete(&url).call(),
            _ => agent().get(&url).call(),
        }
        .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
        let text = r.body_mut().with_config().limit(64 << 20).read_to_string().unwrap();
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{method} {path}: {e}: {text}"));
        v["value"].clone()
    }

    fn go(&self, url: &str) {
        self.call("POST", &format!("/session/{}/url", self.session), Some(json!({ "url": url })));
    }

    /// Runs `script` (a function body) in the page; its return value.
    fn eval(&self, script: &str) -> Value {
        self.call(
            "POST",
            &format!("/session/{}/execute/sync", self.session),
            Some(json!({"script": script, "args": []})),
        )
    }

    /// Polls `script` until it returns true.
    fn wait_for(&self, what: &str, script: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.eval(script) != Value::Bool(true) {
            let page = self.eval("return document.body.innerText.slice(0, 2000);");
            assert!(Instant::now() < deadline, "the dashboard never showed {what}; the page says:\n{page}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn screenshot(&self) -> Vec<u8> {
        let b64 = self.call("GET", &format!("/session/{}/screenshot", self.session), None);
        base64::engine::general_purpose::STANDARD.decode(b64.as_str().unwrap()).unwrap()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = agent().delete(&format!("{}/session/{}", self.url, self.session)).call();
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

#[test]
fn the_dashboard_draws_live_and_marks_a_revised_row() {
    let s = Scratch::new("dashboard");
    std::fs::create_dir_all(s.path("contracts")).unwrap();
    s.write("contracts/paid.toml", CONTRACT);
    // The account service the destination delivers to: it takes every batch.
    let (accounts, _batches) = common::listener();
    s.write(
        "weir.toml",
        &format!("idle_timeout = \"1h\"\n[connections.accounts]\nurl = \"{accounts}/unlocks\"\nallow_private = true\n"),
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let base = format!("http://127.0.0.1:{port}");
    let _server = start(&s.0, port);
    let events = format!("{base}/v1/topics/payments/events");

    // Three accounts over 90 s, then an event at 5 min: the first windows end, provisional.
    let mut lines: Vec<String> = (0..90).map(|i| event(i, i % 3, i64::from(i), "2.00")).collect();
    lines.extend((0..3).map(|a| event(100 + a, a, 300, "0")));
    assert_eq!(post(&events, &(lines.join("\n") + "\n")).0, 200);
    assert_eq!(post(&events, "{\"acct\":\"a1\",\"t\":\"not a time\"}\n").0, 200);
    let note = json!({"who": "alice", "from": "2025-11-29T00:00:00Z", "to": "2025-11-29T00:01:00Z", "note": "gateway retries"});
    assert_eq!(post(&format!("{base}/v1/pipelines/paid/annotations"), &note.to_string()).0, 200);
    let opened = json!({"title": "refunds double-counted", "why": "the finance team saw it"});
    assert_eq!(post(&format!("{base}/v1/pipelines/paid/incidents"), &opened.to_string()).0, 201);

    let browser = Browser::start();
    // An admin token sees everything, the audit log too.
    browser.go(&format!("{base}/#token={}", tokens_of(&s.path("data")).admin));
    let card = r#"document.querySelector('[data-pipeline="paid"]')"#;
    browser.wait_for(
        "the pipeline's first provisional rows",
        &format!("const c = {card}; return !!c && c.querySelectorAll('tr[data-status=\"provisional\"]').length >= 3;"),
    );
    // The pipeline's stored versions, with their states.
    let versions = browser.eval(&format!("return {card}.querySelector('[data-versions]').innerText;"));
    assert!(versions.as_str().is_some_and(|v| v.contains("v3 live")), "the versions shown: {versions}");
    // Nothing on the page came from elsewhere.
    assert_eq!(browser.eval("return document.querySelectorAll('script[src], link[href], img[src]').length;"), 0);
    let text = browser.eval(&format!("return {card}.innerText;"));
    let text = text.as_str().unwrap();
    for shown in ["paid", "v3", "billing-ops", "data-platform", "Unlock paid features", "bad_type", "gateway retries"] {
        assert!(text.contains(shown), "the card does not show {shown:?}:\n{text}");
    }
    // The charts draw a line from the samples taken every second.
    for chart in ["throughput", "lag", "watermark_age"] {
        browser.wait_for(
            &format!("a {chart} chart"),
            &format!(
                "const l = document.querySelector('svg[data-chart=\"{chart}\"] polyline');
                 return !!l && l.getAttribute('points').trim().split(' ').length >= 2;"
            ),
        );
    }
    browser.wait_for("the firing watermark age alert", &format!("return {card}.querySelector('.alert') !== null;"));
    browser.wait_for(
        "the alert and the annotation among incidents",
        "return document.getElementById('incident-alerts').innerText.includes('max_watermark_age')
             && document.querySelector('#incident-actions [data-action=\"annotate\"]') !== null;",
    );
    browser.wait_for(
        "the incidents: the alert's and the operator's, open",
        "const t = document.getElementById('incident-cases').innerText;
         return t.includes('open paid: max_watermark_age firing') && t.includes('open paid: refunds double-counted')
             && document.querySelectorAll('#incident-cases [data-incident]').length === 2;",
    );
    // The named checks: the watermark a year old fails freshness; the rows are judged.
    browser.wait_for(
        "the checks, judged",
        &format!(
            "const c = {card};
             const fresh = c.querySelector('[data-checks] tr[data-check=\"fresh\"]');
             const rows = c.querySelector('[data-checks] tr[data-check=\"total_positive\"]');
             return !!fresh && fresh.dataset.state === 'failing' && fresh.innerText.includes('watermark')
                 && !!rows && rows.dataset.state !== 'not judged';"
        ),
    );
    // Where the decision acts: the destination, caught up with the rows.
    browser.wait_for(
        "the destination, caught up",
        &format!(
            "const d = {card}.querySelector('[data-destinations] tr[data-destination=\"accounts\"]');
             return !!d && d.dataset.state === 'caught up' && d.innerText.includes('http');"
        ),
    );
    let marked = browser.eval(&format!("return {card}.querySelectorAll('.mark.note').length;"));
    assert!(marked.as_u64() >= Some(3), "rows of the annotated window carry the note: {marked}");
    assert_eq!(browser.eval("return document.querySelectorAll('tr.revised').length;"), 0);

    // A late event revises a1's first window: the open page shows it, revised, at revision 2.
    assert_eq!(post(&events, &(event(500, 1, 30, "5.00") + "\n")).0, 200);
    browser.wait_for(
        "a revised row",
        "const r = document.querySelector('tr.revised');
         return !!r && r.dataset.revision === '2' && r.dataset.status === 'provisional'
             && r.querySelector('.mark.revised').textContent === 'revised' && r.innerText.includes('acct=a1');",
    );
    // The watermark passes the lateness: settled rows, the revised one still marked.
    let later: Vec<String> = (0..3).map(|a| event(600 + a, a, 1_200, "0")).collect();
    assert_eq!(post(&events, &(later.join("\n") + "\n")).0, 200);
    browser.wait_for(
        "a settled revised row",
        "return !!document.querySelector('tr.revised[data-status=\"settled\"][data-revision=\"3\"] .mark.settled');",
    );

    // A payment too late for a settled window, then a backfill: the window's
    // corrected row, and the run; a reconciliation with a planted difference: its verdict.
    assert_eq!(post(&events, &(event(700, 2, 10, "7.00") + "\n")).0, 200);
    let t = |s: i64| weir_engine::time::format_rfc3339_ms(1_764_374_400_000 + s * 1_000);
    let asked = json!({"from": t(0), "to": t(120), "why": "a late payment"}).to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, body) = post(&format!("{base}/v1/pipelines/paid/backfill"), &asked);
        if code == 202 {
            break;
        }
        assert!(code == 409 && Instant::now() < deadline, "{code} {body}");
        std::thread::sleep(Duration::from_millis(200));
    }
    browser.wait_for(
        "the corrected row and the backfill",
        &format!(
            "const c = {card}; const r = c.querySelector('tr[data-status=\"corrected\"]');
             return !!r && r.innerText.includes('acct=a2') && r.querySelector('.mark.corrected') !== null
                 && c.querySelector('[data-backfills] tr[data-state=\"done\"]').innerText.includes('1 of');"
        ),
    );
    let export = format!("acct,minute,total\na0,{},999\n", t(0));
    let url = format!(
        "{base}/v1/pipelines/paid/reconcile?why=close&source=ledger.csv&map=key.acct=acct,window_start=minute,total=total"
    );
    let mut r = authed(agent().post(&url), "POST", &url).header("content-type", "text/csv").send(&export).unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.body_mut().read_to_string().unwrap());
    browser.wait_for(
        "the failed reconciliation",
        &format!(
            "const r = {card}.querySelector('[data-reconciliations] tr[data-verdict=\"fail\"]');
             return !!r && r.innerText.includes('ledger.csv') && r.innerText.includes('3 unexplained');"
        ),
    );

    // A reader of this pipeline sees its card but not the audit log; a reader
    // of another pipeline sees nothing but why.
    let reader = make_token(&s.path("data"), &["--role", "reader", "--pipeline", "paid"]);
    browser.go(&format!("{base}/#token={reader}"));
    // A new fragment alone does not swap the token (a page that opened this
    // one could set it): after two refreshes, still the admin's view.
    std::thread::sleep(Duration::from_millis(2_500));
    let actions = browser.eval("return document.getElementById('incident-actions').innerText;");
    assert!(!actions.as_str().unwrap_or("").contains("admin tokens only"), "a fragment changed the token: {actions}");
    browser.eval("location.reload(); return true;");
    browser.wait_for(
        "the reader's view",
        &format!(
            "const c = {card}; return !!c && c.querySelectorAll('tr[data-status]').length > 0
                 && document.getElementById('incident-actions').innerText.includes('admin tokens only');"
        ),
    );
    let other = make_token(&s.path("data"), &["--role", "reader", "--pipeline", "other"]);
    browser.go(&format!("{base}/#token={other}"));
    browser.eval("location.reload(); return true;");
    browser.wait_for(
        "the refusal",
        "return document.getElementById('error').innerText.includes('may not read the dashboard');",
    );
    browser.go(&format!("{base}/#token={}", tokens_of(&s.path("data")).admin));
    browser.eval("location.reload(); return true;");
    browser.wait_for("the admin's view again", &format!("return !!{card};"));

    let png = browser.screenshot();
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "screenshot of {} bytes", png.len());
    let dir = std::env::var_os("WEIR_ARTIFACTS").map_or_else(|| repo_root().join("target/artifacts"), Into::into);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(std::path::Path::new(&dir).join("dashboard.png"), png).unwrap();
}

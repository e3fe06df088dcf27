//! The HTTP surface against a server in this process (a real listener, a
//! real log and SQLite in a temporary folder): refusals, failed writes,
//! reading back, and results that equal the batch.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use weir_contract::{Contract, ServerConfig};
use weir_engine::{Engine, EventIn, Mode, Output};
use weir_log::LogOptions;

const CONTRACT: &str = r#"
[pipeline]
name = "paid"
version = 1
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

[dedup]
horizon = "20m"

[[aggregate]]
name = "total"
fn = "sum"
field = "amount"
"#;

struct Server {
    url: String,
    dir: PathBuf,
    fail: std::sync::Arc<std::sync::atomic::AtomicBool>,
    hold: std::sync::Arc<std::sync::atomic::AtomicBool>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The log's segment size, when not the default (kept across a restart).
    segment_bytes: Option<u64>,
}

impl Server {
    fn start(name: &str, config: &str) -> Server {
        Server::start_with(name, CONTRACT, config)
    }

    fn start_with(name: &str, contract: &str, config: &str) -> Server {
        let dir = std::env::temp_dir().join(format!("weir-server-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Server::start_in(dir, contract, config)
    }

    /// Stops the server and starts another on the same data folder.
    fn restart(mut self, contract: &str, config: &str) -> Server {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let dir = std::mem::take(&mut self.dir);
        Server::start_in_with(dir, contract, config, self.segment_bytes)
    }

    fn start_in(dir: PathBuf, contract: &str, config: &str) -> Server {
        Server::start_in_with(dir, contract, config, None)
    }

    fn start_in_with(dir: PathBuf, contract: &str, config: &str, segment_bytes: Option<u64>) -> Server {
        let tokens = make_tokens(&dir);
        let contract = Contract::parse("paid.toml", contract).unwrap();
        let config = ServerConfig::parse("weir.toml", config).unwrap();
        let defaults = LogOptions::default();
        let log_options = LogOptions { segment_bytes: segment_bytes.unwrap_or(defaults.segment_bytes), ..defaults };
        let (fail, hold) = (log_options.fail_writes.clone(), log_options.hold_writes.clone());
        let opts = weir_server::ServeOptions {
            data: dir.clone(),
            contracts: vec![contract],
            config,
            listen: "127.0.0.1:0".into(),
            log_options,
            tls: None,
        };
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
            rt.block_on(weir_server::serve(opts, move |addr| addr_tx.send(addr).unwrap(), async move {
                let _ = stop_rx.await;
            }))
            .unwrap();
        });
        let addr = addr_rx.recv_timeout(Duration::from_secs(20)).unwrap();
        TOKENS.lock().unwrap_or_else(|e| e.into_inner()).push((addr.to_string(), tokens));
        Server {
            url: format!("http://{addr}"),
            dir,
            fail,
            hold,
            stop: Some(stop_tx),
            thread: Some(thread),
            segment_bytes,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if !self.dir.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).build().into()
}

/// One token of each role over everything, made on the data folder before the server starts.
#[derive(Clone)]
struct Tokens {
    producer: String,
    reader: String,
    raw_reader: String,
    operator: String,
    admin: String,
}

fn make_tokens(dir: &std::path::Path) -> Tokens {
    use weir_store::tokens::{create, NewToken, Role};
    std::fs::create_dir_all(dir).unwrap();
    let conn = weir_store::sqlite::open(&dir.join("weir.db")).unwrap();
    weir_store::sqlite::migrate(&conn).unwrap();
    let all = vec!["*".to_owned()];
    let make = |role: Role, topics: &[String], pipelines: &[String]| {
        let new = NewToken {
            role,
            name: "test".into(),
            topics: topics.to_vec(),
            pipelines: pipelines.to_vec(),
            expires_in_ms: None,
        };
        create(&conn, &new).unwrap().0
    };
    Tokens {
        producer: make(Role::Producer, &all, &[]),
        reader: make(Role::Reader, &[], &all),
        raw_reader: make(Role::RawReader, &all, &[]),
        operator: make(Role::Operator, &[], &all),
        admin: make(Role::Admin, &[], &[]),
    }
}

/// The servers' tokens by `host:port`.
static TOKENS: std::sync::Mutex<Vec<(String, Tokens)>> = std::sync::Mutex::new(Vec::new());

/// A request with the token of the role its path needs.
fn authed<B>(r: ureq::RequestBuilder<B>, method: &str, url: &str) -> ureq::RequestBuilder<B> {
    let rest = url.trim_start_matches("http://");
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let path = format!("/{}", path.split('?').next().unwrap_or(""));
    let found =
        TOKENS.lock().unwrap_or_else(|e| e.into_inner()).iter().rev().find(|(h, _)| h == host).map(|(_, t)| t.clone());
    let Some(t) = found else { return r };
    let operator_action =
        ["/pause", "/resume", "/annotations", "/replay", "/backfill"].iter().any(|a| path.ends_with(a));
    let token = match (method, path.as_str()) {
        ("POST", p) if p.starts_with("/v1/topics/") => t.producer,
        (_, p) if p.starts_with("/v1/topics/") => t.raw_reader,
        ("POST", _) if operator_action => t.operator,
        (_, p) if p.starts_with("/v1/audit") || p.starts_with("/v1/tokens") || p == "/v1/dashboard" => t.admin,
        _ => t.reader,
    };
    r.header("authorization", format!("Bearer {token}"))
}

fn post(url: &str, body: &str) -> (u16, String) {
    let mut r = authed(agent().post(url), "POST", url).send(body).unwrap();
    (r.status().as_u16(), r.body_mut().read_to_string().unwrap())
}

fn get(url: &str) -> (u16, String) {
    let mut r = authed(agent().get(url), "GET", url).call().unwrap();
    let status = r.status().as_u16();
    (status, r.body_mut().with_config().limit(1 << 30).read_to_string().unwrap())
}

fn event(id: u32, acct: u32, t_ms: i64, amount: &str) -> String {
    let t = weir_engine::time::format_rfc3339_ms(1_764_374_400_000 + t_ms);
    format!(r#"{{"id":"p{id}","acct":"a{acct}","t":"{t}","amount":{amount}}}"#)
}

#[test]
fn refusals_name_the_line_and_append_nothing() {
    let s = Server::start("refusals", "[topics.payments]\npartitions = 2\nkey = \"acct\"\nmax_event_bytes = 200\n");
    let events = format!("{}\n{}\n", event(1, 1, 0, "1.00"), event(2, 2, 0, "2.00"));
    let url = format!("{}/v1/topics/payments/events", s.url);
    let (code, body) = post(&url, &format!("{events}{{\"id\": oops}}\n"));
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("line 3 is not JSON") && body.contains("nothing was appended"), "{body}");
    let big = format!("{{\"id\":\"x\",\"pad\":\"{}\"}}", "x".repeat(300));
    let (code, body) = post(&url, &format!("{events}\n{big}\n"));
    assert_eq!(code, 413, "{body}");
    assert!(body.contains("line 4 is") && body.contains("max_event_bytes = 200"), "{body}");
    let (code, body) = post(&url, "\n\n");
    assert_eq!(code, 400, "{body}");
    let mut r = authed(agent().post(&url), "POST", &url).send(&b"{\"id\":\"\xff\xfe\"}\n"[..]).unwrap();
    let (code, body) = (r.status().as_u16(), r.body_mut().read_to_string().unwrap());
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("line 1 is not UTF-8"), "{body}");
    let (code, body) = post(&format!("{}/v1/topics/nope/events", s.url), &events);
    assert_eq!(code, 404, "{body}");
    for p in 0..2 {
        let (code, body) = get(&format!("{url}?partition={p}"));
        assert_eq!((code, body.as_str()), (200, ""), "nothing may have been appended");
    }
    let (code, body) = post(&url, &events);
    assert_eq!(code, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["accepted"], 2);
    let (code, body) = get(&format!("{}/v1/pipelines/paid/ledger?reason=nope", s.url));
    assert_eq!(code, 400, "{body}");
    let (code, body) = get(&format!("{}/v1/pipelines/nope/results", s.url));
    assert_eq!(code, 404, "{body}");
}

#[test]
fn a_failing_log_answers_503_appends_nothing_and_recovers() {
    let s = Server::start("fail", "");
    let url = format!("{}/v1/topics/payments/events", s.url);
    assert_eq!(post(&url, &event(1, 1, 0, "1")).0, 200);
    s.fail.store(true, Ordering::SeqCst);
    let (code, body) = post(&url, &event(2, 1, 0, "1"));
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("nothing was acknowledged"), "{body}");
    assert_eq!(post(&url, &event(3, 1, 0, "1")).0, 503, "refused while unhealthy");
    s.fail.store(false, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (code, _) = post(&url, &event(4, 1, 0, "1"));
        if code == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the log did not recover");
        std::thread::sleep(Duration::from_millis(200));
    }
    let (_, body) = get(&format!("{url}?limit=100"));
    let ids: Vec<String> = body
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["event"]["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, vec!["p1", "p4"], "only acknowledged events are in the log, with no gap");
}

#[test]
fn a_full_log_queue_answers_503_with_retry_after_and_too_many_events_413() {
    let s = Server::start("busy", "log_queue_bytes = 1048576\nmax_events_per_request = 1000\n");
    let url = format!("{}/v1/topics/payments/events", s.url);
    // Past max_events_per_request: 413, nothing appended.
    let many: Vec<String> = (0..1_001).map(|i| event(i, 1, 0, "1")).collect();
    let (code, body) = post(&url, &many.join("\n"));
    assert_eq!(code, 413, "{body}");
    assert!(body.contains("max_events_per_request = 1000") && body.contains("nothing was appended"), "{body}");
    assert_eq!(post(&url, &many[..1_000].join("\n")).0, 200, "at the limit is fine");

    // The writer stalls: posts of about 100 KB wait in its queue until 1 MiB is
    // waiting; the next ones are answered 503 with Retry-After at once.
    s.hold.store(true, Ordering::SeqCst);
    let posts: Vec<_> = (0..16u32)
        .map(|n| {
            let url = url.clone();
            let body: Vec<String> = (0..700).map(|i| event(10_000 + n * 1_000 + i, n, 0, "1")).collect();
            let body = body.join("\n");
            std::thread::spawn(move || {
                let mut r = authed(agent().post(&url), "POST", &url).send(&body).unwrap();
                let retry = r.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned());
                (n, r.status().as_u16(), retry, r.body_mut().read_to_string().unwrap())
            })
        })
        .collect();
    // Refusals come back at once, while the writer is still stalled.
    std::thread::sleep(Duration::from_secs(2));
    let mut refused = Vec::new();
    let mut waiting = Vec::new();
    for p in posts {
        if p.is_finished() {
            let (n, code, retry, body) = p.join().unwrap();
            assert_eq!(code, 503, "{body}");
            assert_eq!(retry.as_deref(), Some("1"));
            assert!(body.contains("log_queue_bytes"), "{body}");
            refused.push(n);
        } else {
            waiting.push(p);
        }
    }
    assert!(!refused.is_empty() && !waiting.is_empty(), "some wait, some are refused: {refused:?}");
    s.hold.store(false, Ordering::SeqCst);
    let mut accepted = Vec::new();
    for p in waiting {
        let (n, code, _, body) = p.join().unwrap();
        if code == 200 {
            accepted.push(n);
        } else {
            assert_eq!(code, 503, "{body}");
            refused.push(n);
        }
    }
    assert_eq!(accepted.len() + refused.len(), 16);
    // Exactly the accepted posts are in the log.
    let (_, body) = get(&format!("{url}?limit=100000"));
    let mut senders: Vec<u32> = body
        .lines()
        .filter_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let id = v["event"]["id"].as_str().unwrap()[1..].parse::<u32>().unwrap();
            (id >= 10_000).then(|| (id - 10_000) / 1_000)
        })
        .collect();
    senders.dedup();
    senders.sort_unstable();
    senders.dedup();
    accepted.sort_unstable();
    assert_eq!(senders, accepted, "only acknowledged posts were appended");
    let (_, metrics) = get(&format!("{}/metrics", s.url));
    assert!(metrics.contains(&format!("weir_log_appends_busy_total {}", refused.len())), "{metrics}");
}

/// Final rows of a batch over `lines`, by (key, window start): values as JSON.
fn batch_values(lines: &[String]) -> Vec<(String, String, String)> {
    let c = Contract::parse("paid.toml", CONTRACT).unwrap();
    let mut engine = Engine::new(&c, Mode::Batch, 1).unwrap();
    let mut out = Output::default();
    for (i, l) in lines.iter().enumerate() {
        engine.process(EventIn { partition: 0, offset: i as u64, bytes: l.as_bytes() }, &mut out);
    }
    engine.finish(&mut out);
    let mut text = String::new();
    let mut rows = Vec::new();
    for row in &out.rows {
        text.clear();
        engine.format().write_row(row, &mut text);
        rows.push(identity(&serde_json::from_str(&text).unwrap()));
    }
    rows.sort();
    rows
}

fn identity(v: &serde_json::Value) -> (String, String, String) {
    (v["key"].to_string(), v["window_start"].to_string(), v["values"].to_string())
}

#[test]
fn results_changes_and_status_follow_the_log() {
    let s = Server::start("results", "idle_timeout = \"1h\"\n[topics.payments]\npartitions = 3\nkey = \"acct\"\n");
    let url = format!("{}/v1/topics/payments/events", s.url);
    let mut lines = Vec::new();
    for i in 0..600u32 {
        // Ten accounts over ten minutes, a few duplicates, some out of order.
        let t = i64::from(i) * 1_000 - if i % 7 == 0 { 30_000 } else { 0 };
        lines.push(event(i, i % 10, t.max(0), &format!("{}.{:02}", i % 50, i % 100)));
        if i % 50 == 0 {
            lines.push(event(i, i % 10, t.max(0), &format!("{}.{:02}", i % 50, i % 100)));
        }
    }
    // A last event an hour later moves every partition's watermark past the windows above.
    for acct in 0..10 {
        lines.push(event(10_000 + acct, acct, 3_600_000 + 600_000, "0"));
    }
    for chunk in lines.chunks(100) {
        assert_eq!(post(&url, &(chunk.join("\n") + "\n")).0, 200);
    }
    let status_url = format!("{}/v1/pipelines/paid/status", s.url);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let status: serde_json::Value = serde_json::from_str(&get(&status_url).1).unwrap();
        if status["lag_records"] == 0 && status["events"]["read"] == lines.len() as u64 {
            assert_eq!(status["ledger"]["duplicate"], 12);
            break;
        }
        assert!(Instant::now() < deadline, "the pipeline did not catch up: {status}");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(300));
    let (_, body) = get(&format!("{}/v1/pipelines/paid/results", s.url));
    let mut current: Vec<_> =
        body.lines().map(|l| identity(&serde_json::from_str(l).unwrap())).filter(|r| !r.1.contains("T01:")).collect();
    current.sort();
    let mut expected = batch_values(&lines);
    expected.retain(|r| !r.1.contains("T01:"));
    assert_eq!(current, expected);
    // Every row in /changes has the next seq, and revisions of a window only go up.
    let (_, body) = get(&format!("{}/v1/pipelines/paid/changes", s.url));
    let mut last = std::collections::BTreeMap::new();
    for (i, l) in body.lines().enumerate() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        assert_eq!(v["seq"], i as u64 + 1);
        let key = (v["key"].to_string(), v["window_start"].to_string());
        let rev = v["revision"].as_u64().unwrap();
        assert_eq!(last.insert(key, rev).map_or(0, |r| r) + 1, rev, "{l}");
    }
    let (_, body) = get(&format!("{}/v1/pipelines/paid/ledger?reason=duplicate", s.url));
    assert_eq!(body.lines().count(), 12);
    let (code, metrics) = get(&format!("{}/metrics", s.url));
    assert_eq!(code, 200);
    let read =
        format!("weir_events_read_total{{pipeline=\"paid\",messaging_destination_name=\"payments\"}} {}", lines.len());
    assert!(metrics.contains(&read), "{metrics}");
    assert!(metrics.contains("reason=\"duplicate\"} 12"), "{metrics}");
    assert!(metrics.contains("weir_partition_lag_records{pipeline=\"paid\",messaging_destination_name=\"payments\",messaging_destination_partition_id=\"2\"} 0"), "{metrics}");
    let (_, body) = get(&format!("{}/v1/pipelines/paid/results?key.acct=a3&status=settled", s.url));
    assert!(body.lines().count() >= 10 && body.lines().all(|l| l.contains("\"a3\"")), "{body}");
}

fn settled_rows(s: &Server) -> usize {
    get(&format!("{}/v1/pipelines/paid/results?status=settled", s.url)).1.lines().count()
}

#[test]
fn a_silent_partition_stops_holding_the_watermark_after_idle_timeout() {
    // One account: every event goes to one of the two partitions; the other stays silent.
    let events: Vec<String> = (0..30).map(|i| event(i, 7, i64::from(i) * 10_000, "1.00")).collect();
    let flush = event(99, 7, 3_600_000, "0");
    let body = events.join("\n") + "\n" + &flush + "\n";
    let held = Server::start("idle-held", "idle_timeout = \"1h\"\n[topics.payments]\npartitions = 2\nkey = \"acct\"\n");
    assert_eq!(post(&format!("{}/v1/topics/payments/events", held.url), &body).0, 200);
    let idle =
        Server::start("idle-let-go", "idle_timeout = \"300ms\"\n[topics.payments]\npartitions = 2\nkey = \"acct\"\n");
    assert_eq!(post(&format!("{}/v1/topics/payments/events", idle.url), &body).0, 200);
    let deadline = Instant::now() + Duration::from_secs(10);
    while settled_rows(&idle) < 5 {
        assert!(
            Instant::now() < deadline,
            "the silent partition still holds the watermark back: {}",
            get(&format!("{}/v1/pipelines/paid/status", idle.url)).1
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(settled_rows(&held), 0, "without idleness the silent partition holds the watermark back");
    let status: serde_json::Value =
        serde_json::from_str(&get(&format!("{}/v1/pipelines/paid/status", idle.url)).1).unwrap();
    assert!(status["partitions"].as_array().unwrap().iter().any(|p| p["idle"] == true), "{status}");
}

/// A webhook receiver: every POST body, in order.
fn receiver() -> (String, std::sync::mpsc::Receiver<serde_json::Value>) {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut length = 0;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0; length];
            if reader.read_exact(&mut body).is_ok() {
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
                if let Ok(v) = serde_json::from_slice(&body) {
                    let _ = tx.send(v);
                }
            }
        }
    });
    (url, rx)
}

#[test]
fn an_alert_fires_with_its_fields_reaches_the_webhook_and_resolves() {
    let (url, notes) = receiver();
    let contract = format!("{CONTRACT}\n[alerts]\nmax_watermark_age = \"10m\"\nwebhook = \"{url}\"\n");
    let s = Server::start_with("alerts", &contract, "allow_private_webhooks = true\n");
    let events = format!("{}/v1/topics/payments/events", s.url);
    // Event times a year old: the watermark is far behind the clock.
    assert_eq!(post(&events, &event(1, 1, 0, "1.00")).0, 200);
    let fired = notes.recv_timeout(Duration::from_secs(15)).expect("no alert reached the webhook");
    assert_eq!(fired["status"], "firing", "{fired}");
    assert_eq!(fired["alert"], "max_watermark_age");
    assert_eq!(
        (fired["pipeline"].as_str(), fired["owner"].as_str(), fired["steward"].as_str()),
        (Some("paid"), Some("billing-ops"), Some("data-platform"))
    );
    assert_eq!(fired["decision"], "Unlock paid features");
    assert_eq!(fired["threshold"], "10m");
    // A year behind: days, then whatever hours, minutes and seconds are not zero.
    assert!(fired["observed"].as_str().is_some_and(|o| o.contains('d')), "{fired}");
    assert!(fired["question"].as_str().is_some_and(|q| q.ends_with('?')), "{fired}");
    let status: serde_json::Value =
        serde_json::from_str(&get(&format!("{}/v1/pipelines/paid/status", s.url)).1).unwrap();
    assert_eq!(status["alerts"][0]["alert"], "max_watermark_age", "{status}");
    // An event of now brings the watermark to the clock: the alert resolves.
    let now = weir_log::now_ms() - 1_764_374_400_000;
    assert_eq!(post(&events, &event(2, 1, now, "1.00")).0, 200);
    let resolved = notes.recv_timeout(Duration::from_secs(15)).expect("no resolution reached the webhook");
    assert_eq!(
        (resolved["status"].as_str(), resolved["alert"].as_str()),
        (Some("resolved"), Some("max_watermark_age")),
        "{resolved}"
    );
    let status: serde_json::Value =
        serde_json::from_str(&get(&format!("{}/v1/pipelines/paid/status", s.url)).1).unwrap();
    assert_eq!(status["alerts"], serde_json::json!([]), "{status}");
    // The incident is kept in the store: after a restart the dashboard still lists both notifications.
    let s = s.restart(&contract, "allow_private_webhooks = true\n");
    let dashboard: serde_json::Value = serde_json::from_str(&get(&format!("{}/v1/dashboard", s.url)).1).unwrap();
    let kept: Vec<(&str, &str)> = dashboard["incidents"]["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["status"].as_str().unwrap_or(""), n["alert"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(kept, vec![("resolved", "max_watermark_age"), ("firing", "max_watermark_age")], "{dashboard}");
}

fn post_json(url: &str, body: &str) -> (u16, String) {
    let mut r = authed(agent().post(url), "POST", url).header("content-type", "application/json").send(body).unwrap();
    (r.status().as_u16(), r.body_mut().read_to_string().unwrap())
}

fn wait_read(s: &Server, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let status: serde_json::Value =
            serde_json::from_str(&get(&format!("{}/v1/pipelines/paid/status", s.url)).1).unwrap();
        if status["events"]["read"] == n as u64 && status["lag_records"] == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "not caught up: {status}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // One more checkpoint interval, so what was read is checkpointed.
    std::thread::sleep(Duration::from_millis(300));
}

#[test]
fn pause_publishes_nothing_loses_nothing_and_resume_publishes_it_all() {
    let s = Server::start("pause", "idle_timeout = \"1h\"\n");
    let events = format!("{}/v1/topics/payments/events", s.url);
    let first: Vec<String> = (0..200u32).map(|i| event(i, i % 5, i64::from(i) * 1_000, "1.00")).collect();
    assert_eq!(post(&events, &(first.join("\n") + "\n")).0, 200);
    wait_read(&s, first.len());
    let changes_url = format!("{}/v1/pipelines/paid/changes", s.url);
    let results_url = format!("{}/v1/pipelines/paid/results", s.url);
    let (before_changes, before_results) = (get(&changes_url).1, get(&results_url).1);
    assert!(!before_changes.is_empty());
    let pause = format!("{}/v1/pipelines/paid/pause", s.url);
    assert_eq!(post_json(&pause, r#"{"who":"alice"}"#).0, 400, "why is required");
    let (code, body) = post_json(&pause, r#"{"who":"alice","why":"bad amounts from the EU gateway"}"#);
    assert_eq!(code, 200, "{body}");
    let second: Vec<String> = (200..600u32)
        .map(|i| event(i, i % 5, i64::from(i) * 1_000, "2.00"))
        .chain([event(999, 0, 7_200_000, "0")])
        .collect();
    assert_eq!(post(&events, &(second.join("\n") + "\n")).0, 200);
    wait_read(&s, first.len() + second.len());
    assert_eq!(get(&changes_url).1, before_changes, "nothing is published while paused");
    assert_eq!(get(&results_url).1, before_results, "results stay as they were");
    let status: serde_json::Value =
        serde_json::from_str(&get(&format!("{}/v1/pipelines/paid/status", s.url)).1).unwrap();
    assert_eq!(status["paused"], true);
    let (code, body) =
        post_json(&format!("{}/v1/pipelines/paid/resume", s.url), r#"{"who":"bob","why":"gateway fixed"}"#);
    assert_eq!(code, 200, "{body}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while get(&changes_url).1 == before_changes {
        assert!(Instant::now() < deadline, "resume published nothing");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Everything is there: the rows equal the batch over all the events, and the change stream is whole.
    let all: Vec<String> = first.iter().chain(&second).cloned().collect();
    let mut published: Vec<_> = get(&results_url)
        .1
        .lines()
        .map(|l| identity(&serde_json::from_str(l).unwrap()))
        .filter(|r| !r.1.contains("T02:"))
        .collect();
    published.sort();
    let mut expected = batch_values(&all);
    expected.retain(|r| !r.1.contains("T02:"));
    assert_eq!(published, expected);
    for (i, l) in get(&changes_url).1.lines().enumerate() {
        assert_eq!(serde_json::from_str::<serde_json::Value>(l).unwrap()["seq"], i as u64 + 1);
    }
    let audit: Vec<serde_json::Value> =
        get(&format!("{}/v1/audit", s.url)).1.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    // The contract's first run, then the two actions: by the operator's token, for whom the body says, from where.
    assert_eq!(audit.len(), 3, "{audit:?}");
    assert_eq!((audit[0]["action"].as_str(), audit[0]["pipeline"].as_str()), (Some("contract-add"), Some("paid")));
    let (pause, resume) = (&audit[1], &audit[2]);
    assert_eq!((pause["action"].as_str(), pause["pipeline"].as_str()), (Some("pause"), Some("paid")));
    assert!(pause["who"].as_str().is_some_and(|w| w.starts_with("test (token ")), "{pause}");
    assert_eq!(pause["detail"]["for"], "alice");
    assert!(pause["from"].as_str().is_some_and(|f| f.starts_with("127.0.0.1:")), "{pause}");
    assert_eq!(pause["why"], "bad amounts from the EU gateway");
    assert_eq!((resume["action"].as_str(), resume["detail"]["for"].as_str()), (Some("resume"), Some("bob")));
    assert!(pause["at"].as_str().is_some_and(|t| t.ends_with('Z')));
    let db = rusqlite::Connection::open(s.dir.join("weir.db")).unwrap();
    let refused = db.execute("UPDATE audit SET who = 'mallory'", []).unwrap_err().to_string();
    assert!(refused.contains("append-only"), "{refused}");
    assert!(db.execute("DELETE FROM audit", []).is_err());
}

/// The value of the first sample of `name` with all of `labels`.
fn sample(metrics: &str, name: &str, labels: &[&str]) -> f64 {
    metrics
        .lines()
        .find(|l| {
            l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']) && labels.iter().all(|x| l.contains(x))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} {labels:?} in\n{metrics}"))
}

#[test]
fn metrics_move_with_the_input() {
    let s = Server::start("metrics", "idle_timeout = \"1h\"\n");
    let events = format!("{}/v1/topics/payments/events", s.url);
    let metrics = || get(&format!("{}/metrics", s.url)).1;
    let now = weir_log::now_ms() - 1_764_374_400_000;
    assert_eq!(post(&events, &(event(1, 1, now, "1.00") + "\n" + &event(2, 2, now, "1.00"))).0, 200);
    wait_read(&s, 2);
    let m = metrics();
    let bad = "reason=\"missing_field\"";
    assert_eq!(sample(&m, "weir_ledger_entries_total", &[bad]), 0.0);
    assert_eq!(sample(&m, "weir_events_read_total", &["pipeline=\"paid\""]), 2.0);
    assert!(sample(&m, "weir_ingest_durable_latency_seconds_count", &[]) >= 1.0);
    assert_eq!(sample(&m, "weir_processing_latency_seconds_count", &[]), 2.0);
    assert!(sample(&m, "weir_checkpoint_duration_seconds_count", &[]) >= 1.0);
    assert!(sample(&m, "weir_state_bytes", &[]) > 0.0);
    // A burst of bad events grows the ledger counter by as many.
    let burst: Vec<&str> = vec!["{}", "{\"a\":[1,2]}", "{\"b\":\"text\"}", "{\"c\":42}", "{\"d\":null}"];
    assert_eq!(post(&events, &(burst.join("\n") + "\n")).0, 200);
    wait_read(&s, 7);
    assert_eq!(sample(&metrics(), "weir_ledger_entries_total", &[bad]), 5.0);
    // No events for a while: the watermark falls behind the clock.
    let age = sample(&metrics(), "weir_watermark_age_ms", &[]);
    std::thread::sleep(Duration::from_millis(1_200));
    let later = sample(&metrics(), "weir_watermark_age_ms", &[]);
    assert!(later >= age + 1_000.0, "watermark age {age} then {later}");
    assert_eq!(sample(&metrics(), "weir_consumer_lag_records", &[]), 0.0);
}

#[test]
fn a_correction_revises_its_window_and_is_in_the_ledger_status_and_metrics() {
    let contract = CONTRACT.replace("horizon = \"20m\"", "horizon = \"20m\"\non_conflict = \"correct\"");
    let s = Server::start_with("corrections", &contract, "idle_timeout = \"1h\"\n");
    let events = format!("{}/v1/topics/payments/events", s.url);
    // p1 counts in [0,1m), the watermark passes its end (a provisional row), then p1 is corrected.
    let first = [event(1, 1, 10_000, "5.00"), event(2, 1, 20_000, "1.00"), event(3, 1, 70_000, "1.00")];
    assert_eq!(post(&events, &(first.join("\n") + "\n")).0, 200);
    wait_read(&s, 3);
    assert_eq!(post(&events, &(event(1, 1, 10_000, "7.50") + "\n")).0, 200);
    wait_read(&s, 4);
    let (_, results) = get(&format!("{}/v1/pipelines/paid/results?status=provisional", s.url));
    let row: serde_json::Value =
        serde_json::from_str(results.lines().find(|l| l.contains("\"2025-11-29T00:00:00.000Z\"")).unwrap()).unwrap();
    assert_eq!(
        (row["values"]["total"].to_string(), row["events"].as_u64(), row["revision"].as_u64()),
        ("8.50".into(), Some(2), Some(2))
    );
    let (_, ledger) = get(&format!("{}/v1/pipelines/paid/ledger?reason=superseded", s.url));
    let entry: serde_json::Value = serde_json::from_str(ledger.lines().next().unwrap()).unwrap();
    assert_eq!(
        (entry["offset"].as_u64(), entry["superseded_by"].as_u64(), entry["event_id"].as_str()),
        (Some(0), Some(3), Some("p1"))
    );
    let (_, status) = get(&format!("{}/v1/pipelines/paid/status", s.url));
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["ledger"]["superseded"], 1, "{status}");
    assert_eq!(
        sample(&get(&format!("{}/metrics", s.url)).1, "weir_ledger_entries_total", &["reason=\"superseded\""]),
        1.0
    );
}

#[test]
fn annotations_mark_the_rows_of_their_range_and_are_audited() {
    let s = Server::start("annotate", "idle_timeout = \"1h\"\n");
    let events = format!("{}/v1/topics/payments/events", s.url);
    let lines: Vec<String> = (0..50u32).map(|i| event(i, 1, i64::from(i) * 6_000, "1.00")).collect();
    assert_eq!(post(&events, &(lines.join("\n") + "\n" + &event(99, 1, 3_600_000, "0") + "\n")).0, 200);
    wait_read(&s, 51);
    let url = format!("{}/v1/pipelines/paid/annotations", s.url);
    let t = |ms: i64| weir_engine::time::format_rfc3339_ms(1_764_374_400_000 + ms);
    let bad = format!(r#"{{"who":"alice","from":"{}","to":"{}","note":"x"}}"#, t(120_000), t(60_000));
    assert_eq!(post_json(&url, &bad).0, 400, "from after to");
    assert_eq!(post_json(&url, r#"{"who":"alice","note":"no range"}"#).0, 400);
    let body = format!(
        r#"{{"who":"alice","from":"{}","to":"{}","note":"gateway double-sent for 30 s"}}"#,
        t(130_000),
        t(160_000)
    );
    let (code, answer) = post_json(&url, &body);
    assert_eq!(code, 200, "{answer}");
    let id = serde_json::from_str::<serde_json::Value>(&answer).unwrap()["annotation"].as_i64().unwrap();
    for rows in
        [get(&format!("{}/v1/pipelines/paid/results", s.url)).1, get(&format!("{}/v1/pipelines/paid/changes", s.url)).1]
    {
        let mut marked = 0;
        for l in rows.lines() {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let in_range = v["window_start"] == t(120_000);
            assert_eq!(v["annotations"] == serde_json::json!([id]), in_range, "{l}");
            marked += usize::from(in_range);
        }
        assert!(marked >= 1);
    }
    let listed = get(&url).1;
    assert!(listed.contains("gateway double-sent") && listed.contains("\"who\":\"alice via test (token "), "{listed}");
    let audit = get(&format!("{}/v1/audit", s.url)).1;
    assert!(audit.contains("\"action\":\"annotate\"") && audit.contains(&format!("\"annotation\":{id}")), "{audit}");
}

fn rows_by_window(body: &str) -> std::collections::BTreeMap<(String, String), (String, u64)> {
    body.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let (k, w, values) = identity(&v);
            ((k, w), (values, v["revision"].as_u64().unwrap()))
        })
        .collect()
}

#[test]
fn a_replay_rebuilds_the_same_results_with_higher_revisions() {
    let s = Server::start("replay", "idle_timeout = \"1h\"\n[topics.payments]\npartitions = 2\nkey = \"acct\"\n");
    let events = format!("{}/v1/topics/payments/events", s.url);
    let lines: Vec<String> = (0..300u32)
        .map(|i| event(i, i % 6, i64::from(i) * 1_000 - if i % 9 == 0 { 20_000 } else { 0 }, "1.25"))
        .chain((0..6).map(|a| event(1_000 + a, a, 3_600_000, "0")))
        .collect();
    assert_eq!(post(&events, &(lines.join("\n") + "\n")).0, 200);
    wait_read(&s, lines.len());
    let results_url = format!("{}/v1/pipelines/paid/results", s.url);
    let before = rows_by_window(&get(&results_url).1);
    let replay = format!("{}/v1/pipelines/paid/replay", s.url);
    assert_eq!(post_json(&replay, r#"{"who":"alice"}"#).0, 400, "why is required");
    let (code, body) = post_json(&replay, r#"{"who":"alice","why":"rebuild after the dedup fix"}"#);
    assert_eq!(code, 202, "{body}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let st: serde_json::Value =
            serde_json::from_str(&get(&format!("{}/v1/pipelines/paid/status", s.url)).1).unwrap();
        if st["replays"] == 1 && st["events"]["read"] == lines.len() as u64 && st["lag_records"] == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the replay did not finish: {st}");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    let after = rows_by_window(&get(&results_url).1);
    assert_eq!(after.keys().collect::<Vec<_>>(), before.keys().collect::<Vec<_>>());
    let top = before.values().map(|(_, r)| *r).max().unwrap();
    for (window, (values, revision)) in &after {
        let (old_values, old_revision) = &before[window];
        assert_eq!(values, old_values, "{window:?}");
        assert!(revision > old_revision && *revision > top, "{window:?}: revision {revision} after {old_revision}");
    }
    // In the change stream every window's revisions still only go up.
    let mut last = std::collections::BTreeMap::new();
    for l in get(&format!("{}/v1/pipelines/paid/changes", s.url)).1.lines() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        let rev = v["revision"].as_u64().unwrap();
        let prev = last.insert((v["key"].to_string(), v["window_start"].to_string()), rev).unwrap_or(0);
        assert!(rev > prev, "{l}");
    }
    let m = get(&format!("{}/metrics", s.url)).1;
    assert_eq!(sample(&m, "weir_replays_total", &[]), 1.0);
    let audit = get(&format!("{}/v1/audit", s.url)).1;
    assert!(audit.contains("\"action\":\"replay\"") && audit.contains("rebuild after the dedup fix"), "{audit}");
}

#[test]
fn a_replay_from_an_event_time_republishes_only_later_windows() {
    let s = Server::start("replay-time", "idle_timeout = \"1h\"\n");
    let events = format!("{}/v1/topics/payments/events", s.url);
    let lines: Vec<String> = (0..300u32)
        .map(|i| event(i, i % 3, i64::from(i) * 1_000, "2.00"))
        .chain([event(999, 0, 3_600_000, "0")])
        .collect();
    assert_eq!(post(&events, &(lines.join("\n") + "\n")).0, 200);
    wait_read(&s, lines.len());
    let results_url = format!("{}/v1/pipelines/paid/results", s.url);
    let before = rows_by_window(&get(&results_url).1);
    let from = weir_engine::time::format_rfc3339_ms(1_764_374_400_000 + 180_000);
    let body = format!(r#"{{"who":"alice","why":"late fix","from_time":"{from}"}}"#);
    assert_eq!(post_json(&format!("{}/v1/pipelines/paid/replay", s.url), &body).0, 202);
    let bad = post_json(&format!("{}/v1/pipelines/paid/replay", s.url), r#"{"who":"a","why":"b","from_time":"soon"}"#);
    assert_eq!(bad.0, 400, "{}", bad.1);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let st: serde_json::Value =
            serde_json::from_str(&get(&format!("{}/v1/pipelines/paid/status", s.url)).1).unwrap();
        if st["replays"] == 1 && st["events"]["read"] == lines.len() as u64 && st["lag_records"] == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the replay did not finish: {st}");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    let after = rows_by_window(&get(&results_url).1);
    let (mut kept, mut republished) = (0, 0);
    for (window, (values, revision)) in &after {
        let (old_values, old_revision) = &before[window];
        assert_eq!(values, old_values);
        // Windows start on the minute and last one: ending after 00:03 means starting at 00:03 or later.
        let ends_after = window.1.as_str() >= "\"2025-11-29T00:03:00.000Z\"";
        if ends_after {
            assert!(revision > old_revision, "{window:?} was not republished");
            republished += 1;
        } else {
            assert_eq!(revision, old_revision, "{window:?} ends before from_time and keeps its row");
            kept += 1;
        }
    }
    assert!(kept >= 3 && republished >= 3, "kept {kept}, republished {republished}");
}

#[test]
fn a_stalled_consumer_grows_lag_fires_the_lag_alert_and_catches_up() {
    let (url, notes) = receiver();
    let contract = format!("{CONTRACT}\n[alerts]\nmax_lag = \"2s\"\nwebhook = \"{url}\"\n");
    let s = Server::start_with("lag", &contract, "idle_timeout = \"1h\"\nallow_private_webhooks = true\n");
    let events = format!("{}/v1/topics/payments/events", s.url);
    let lag = || sample(&get(&format!("{}/metrics", s.url)).1, "weir_consumer_lag_records", &[]);
    let now = weir_log::now_ms() - 1_764_374_400_000;
    assert_eq!(post(&events, &event(0, 1, now, "1.00")).0, 200);
    wait_read(&s, 1);
    // Another process holds the results database's write lock: the pipeline
    // cannot checkpoint, so its consumer stalls while producers go on.
    let db = rusqlite::Connection::open(s.dir.join("weir.db")).unwrap();
    db.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let mut posted = 0u32;
    let mut lags = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    let fired = loop {
        if let Ok(note) = notes.try_recv() {
            break note;
        }
        assert!(Instant::now() < deadline, "no lag alert after {posted} events; lag {lags:?}");
        posted += 1;
        assert_eq!(post(&events, &event(posted, posted % 3, now, "1.00")).0, 200);
        lags.push(lag());
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(lags.windows(2).all(|w| w[0] <= w[1]) && lags.last() > lags.first(), "lag did not grow: {lags:?}");
    assert_eq!(lag(), f64::from(posted), "every event posted during the stall is lag");
    assert_eq!((fired["status"].as_str(), fired["alert"].as_str()), (Some("firing"), Some("max_lag")), "{fired}");
    assert_eq!((fired["pipeline"].as_str(), fired["owner"].as_str()), (Some("paid"), Some("billing-ops")));
    assert_eq!(
        (fired["steward"].as_str(), fired["decision"].as_str()),
        (Some("data-platform"), Some("Unlock paid features"))
    );
    assert_eq!(fired["threshold"], "2s");
    assert!(fired["question"].as_str().is_some_and(|q| q.ends_with('?')), "{fired}");
    let status: serde_json::Value =
        serde_json::from_str(&get(&format!("{}/v1/pipelines/paid/status", s.url)).1).unwrap();
    assert!(status["lag_ms"].as_i64() >= Some(2_000), "{status}");
    assert_eq!(status["alerts"][0]["alert"], "max_lag", "{status}");
    // Held past the database's busy timeout, the checkpoint fails and the
    // pipeline restarts from its last checkpoint.
    let deadline = Instant::now() + Duration::from_secs(30);
    let metrics = || get(&format!("{}/metrics", s.url)).1;
    while sample(&metrics(), "weir_pipeline_restarts_total", &[]) < 1.0 {
        assert!(Instant::now() < deadline, "no restart while the database stayed locked");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(sample(&metrics(), "weir_pipeline_failing", &[]), 1.0);
    let status: serde_json::Value =
        serde_json::from_str(&get(&format!("{}/v1/pipelines/paid/status", s.url)).1).unwrap();
    assert!(status["failed"].as_str().is_some_and(|f| f.contains("locked")), "{status}");
    // The lock goes away: the consumer catches up and the alert resolves.
    db.execute_batch("ROLLBACK").unwrap();
    let resolved = notes.recv_timeout(Duration::from_secs(30)).expect("no resolution reached the webhook");
    assert_eq!((resolved["status"].as_str(), resolved["alert"].as_str()), (Some("resolved"), Some("max_lag")));
    wait_read(&s, posted as usize + 1);
    assert_eq!(lag(), 0.0);
    assert_eq!(sample(&metrics(), "weir_pipeline_failing", &[]), 0.0);
    // Nothing lost or counted twice across the restart, and no revision published twice.
    let mut lines: Vec<String> = (0..=posted).map(|i| event(i, if i == 0 { 1 } else { i % 3 }, now, "1.00")).collect();
    // Events an hour later close the windows of the stall.
    let later: Vec<String> = (0..3).map(|a| event(10_000 + a, a, now + 3_600_000, "0")).collect();
    assert_eq!(post(&events, &(later.join("\n") + "\n")).0, 200);
    lines.extend(later);
    wait_read(&s, lines.len());
    let mut expected = batch_values(&lines);
    let last_window = expected.iter().map(|r| r.1.clone()).max().unwrap();
    expected.retain(|r| r.1 != last_window);
    assert_eq!(expected.len(), 3, "one window per account: {expected:?}");
    let (_, body) = get(&format!("{}/v1/pipelines/paid/results?status=settled", s.url));
    let mut current: Vec<_> = body.lines().map(|l| identity(&serde_json::from_str(l).unwrap())).collect();
    current.sort();
    assert_eq!(current, expected);
    let (_, body) = get(&format!("{}/v1/pipelines/paid/changes", s.url));
    let mut last = std::collections::BTreeMap::new();
    for l in body.lines() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        let rev = v["revision"].as_u64().unwrap();
        let key = (v["key"].to_string(), v["window_start"].to_string());
        assert_eq!(last.insert(key, rev).unwrap_or(0) + 1, rev, "{l}");
    }
}

#[test]
fn provenance_names_the_log_ranges_a_row_counted_in_prov_json() {
    let s = Server::start("provenance", "idle_timeout = \"1h\"\n[topics.payments]\npartitions = 2\nkey = \"acct\"\n");
    let events = format!("{}/v1/topics/payments/events", s.url);
    let mut n = 0;
    let mut send = |lines: Vec<String>| {
        n += lines.len();
        assert_eq!(post(&events, &(lines.join("\n") + "\n")).0, 200);
        wait_read(&s, n);
    };
    // Five accounts over four one-minute windows, and one duplicate (p6: a1 at 6 s).
    let mut first: Vec<String> = (0..200).map(|i| event(i, i % 5, i64::from(i) * 1_000, "1.00")).collect();
    first.push(event(6, 1, 6_000, "1.00"));
    send(first);
    // The watermark passes the windows' ends: provisional rows.
    send((0..5).map(|a| event(1_000 + a, a, 300_000, "0")).collect());
    // A late event revises a1's first window; then the watermark settles it.
    send(vec![event(2_000, 1, 30_000, "5.00")]);
    send((0..5).map(|a| event(3_000 + a, a, 1_200_000, "0")).collect());
    // Too late for that window now: ledgered.
    send(vec![event(4_000, 1, 40_000, "7.00")]);

    let ledger: Vec<serde_json::Value> = get(&format!("{}/v1/pipelines/paid/ledger", s.url))
        .1
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(ledger.len(), 2, "{ledger:?}");
    let ledgered: std::collections::HashSet<(u64, u64)> =
        ledger.iter().map(|e| (e["partition"].as_u64().unwrap(), e["offset"].as_u64().unwrap())).collect();
    let hash = format!("{:016x}", Contract::parse("paid.toml", CONTRACT).unwrap().text_hash);
    let rows: Vec<serde_json::Value> = get(&format!("{}/v1/pipelines/paid/results?status=settled", s.url))
        .1
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 25, "5 accounts x 5 windows (0-4 min and 5 min)");
    for row in &rows {
        let seq = row["seq"].as_i64().unwrap();
        let (code, body) = get(&format!("{}/v1/pipelines/paid/results/{seq}/provenance", s.url));
        assert_eq!(code, 200, "{body}");
        let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
        let this = &doc["entity"][format!("weir:row/paid/{seq}")];
        assert_eq!((&this["weir:revision"], &this["weir:events"]), (&row["revision"], &row["events"]), "{doc:#}");
        assert_eq!(this["weir:key"], row["key"]);
        let run = doc["activity"].as_object().unwrap().values().next().unwrap();
        assert_eq!(
            (run["weir:contract_version"].as_u64(), run["weir:contract_hash"].as_str()),
            (Some(1), Some(&*hash))
        );
        assert!(run["prov:startTime"]["$"].as_str().is_some_and(|t| t.ends_with('Z')), "{run}");
        let roles: Vec<&str> =
            doc["wasAssociatedWith"].as_object().unwrap().values().map(|a| a["prov:agent"].as_str().unwrap()).collect();
        assert_eq!(roles, ["weir:agent/billing-ops", "weir:agent/data-platform"]);
        // Every range the row used, checked against the log itself.
        let (acct, start, end) = (
            row["key"]["acct"].as_str().unwrap(),
            row["window_start"].as_str().unwrap(),
            row["window_end"].as_str().unwrap(),
        );
        let mut counted = 0;
        for used in doc["used"].as_object().unwrap().values() {
            let range = &doc["entity"][used["prov:entity"].as_str().unwrap()];
            if range["prov:type"] != "weir:LogRange" {
                continue;
            }
            assert_eq!(range["weir:topic"], "payments");
            let p = range["weir:partition"].as_u64().unwrap();
            let (lo, hi) = (range["weir:first_offset"].as_u64().unwrap(), range["weir:last_offset"].as_u64().unwrap());
            let url = format!("{}/v1/topics/payments/events?partition={p}&from={lo}&limit={}", s.url, hi - lo + 1);
            let ours: Vec<u64> = get(&url)
                .1
                .lines()
                .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
                .filter(|r| {
                    let e = &r["event"];
                    let t = e["t"].as_str().unwrap();
                    e["acct"] == acct && start <= t && t < end
                })
                .map(|r| r["offset"].as_u64().unwrap())
                .filter(|o| !ledgered.contains(&(p, *o)))
                .collect();
            assert_eq!((ours.first(), ours.last()), (Some(&lo), Some(&hi)), "{range}");
            assert_eq!(ours.len() as u64, range["weir:events"].as_u64().unwrap(), "{range}");
            counted += ours.len() as u64;
        }
        assert_eq!(counted, row["events"].as_u64().unwrap(), "{doc:#}");
        // a1's first window: revised by a late event, then a duplicate and a too-late event ledgered.
        let revised = acct == "a1" && start.ends_with("00:00:00.000Z");
        assert_eq!(this["weir:late_events"], u64::from(revised));
        if revised {
            assert_eq!(this["weir:revision"], 3);
            assert_eq!(this["weir:ledgered"], serde_json::json!({"duplicate": 1, "too_late": 1}), "{doc:#}");
            let derived = doc["wasDerivedFrom"]["_:derived"]["prov:usedEntity"].as_str().unwrap();
            assert_eq!(doc["entity"][derived]["weir:revision"], 2, "{doc:#}");
            assert_eq!(doc["entity"][derived]["weir:status"], "provisional");
        } else {
            assert_eq!(this["weir:ledgered"], serde_json::json!({}), "{doc:#}");
        }
    }
    let (code, body) = get(&format!("{}/v1/pipelines/paid/results/999999/provenance", s.url));
    assert_eq!(code, 404, "{body}");
    let (code, body) = get(&format!("{}/v1/pipelines/paid/results/a1/provenance", s.url));
    assert_eq!(code, 400, "{body}");
}

#[test]
fn a_stalled_partition_grows_its_watermark_age_and_holds_the_pipelines() {
    let s = Server::start(
        "stalled-partition",
        "idle_timeout = \"1h\"\n[topics.payments]\npartitions = 2\nkey = \"acct\"\n",
    );
    let events = format!("{}/v1/topics/payments/events", s.url);
    let clock = || weir_log::now_ms() - 1_764_374_400_000;
    // One account per partition, found by where the log puts them.
    let mut by_partition = std::collections::BTreeMap::new();
    let mut n = 0;
    for acct in 0..32 {
        n += 1;
        let (code, body) = post(&events, &event(acct, acct, clock(), "1.00"));
        assert_eq!(code, 200, "{body}");
        let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
        by_partition.entry(answer["partitions"][0]["partition"].as_u64().unwrap()).or_insert(acct);
        if by_partition.len() == 2 {
            break;
        }
    }
    assert_eq!(by_partition.len(), 2, "32 accounts all hashed to one partition");
    wait_read(&s, n);
    // Partition 0 keeps receiving events of now; partition 1 falls silent.
    let live = by_partition[&0];
    let labels = |p: u32| format!("messaging_destination_partition_id=\"{p}\"");
    let age = |p: u32| sample(&get(&format!("{}/metrics", s.url)).1, "weir_partition_watermark_age_ms", &[&labels(p)]);
    let stalled_before = age(1);
    for i in 0..15 {
        n += 1;
        assert_eq!(post(&events, &event(1_000 + i, live, clock(), "1.00")).0, 200);
        std::thread::sleep(Duration::from_millis(150));
    }
    wait_read(&s, n);
    let (moving, stalled) = (age(0), age(1));
    assert!(moving < 1_500.0, "the partition with events keeps up: {moving} ms");
    assert!(
        stalled >= stalled_before + 2_000.0,
        "the silent partition's watermark age grows: {stalled_before} then {stalled}"
    );
    let pipeline = sample(&get(&format!("{}/metrics", s.url)).1, "weir_watermark_age_ms", &[]);
    assert!(
        pipeline >= stalled - 200.0,
        "the silent partition holds the pipeline's watermark: {pipeline} vs {stalled}"
    );
}

#[test]
fn connections_past_max_connections_wait_until_one_closes() {
    use std::io::{Read, Write};
    let s = Server::start("connections", "max_connections = 4\nheader_timeout = \"1m\"\n");
    let addr = s.url.trim_start_matches("http://").to_owned();
    // Four silent connections take every place.
    let mut silent: Vec<std::net::TcpStream> = (0..4).map(|_| std::net::TcpStream::connect(&addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(300));
    let ask = |timeout: Duration| -> Option<String> {
        let mut c = std::net::TcpStream::connect(&addr).unwrap();
        c.set_read_timeout(Some(timeout)).unwrap();
        c.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").unwrap();
        let mut answer = String::new();
        match c.read_to_string(&mut answer) {
            Ok(_) if !answer.is_empty() => Some(answer),
            _ => None,
        }
    };
    assert_eq!(ask(Duration::from_secs(1)), None, "a fifth connection is not served while four are open");
    // One closes: the next is served.
    drop(silent.pop());
    let answer = ask(Duration::from_secs(10)).expect("served once a place is free");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[test]
fn a_version_starting_before_the_retained_input_is_refused_naming_the_earliest_time_still_there() {
    let config = "[topics.payments]\npartitions = 1\nkey = \"acct\"\nretention = \"1s\"\n";
    let dir = std::env::temp_dir().join(format!("weir-server-test-kept-from-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let server = Server::start_in_with(dir, CONTRACT, config, Some(2048));
    // Segments of 2 KiB: these close several, which retention removes after a second.
    let lines: Vec<String> = (0..200).map(|i| event(i, i % 3, i64::from(i), "1.00")).collect();
    let events = format!("{}/v1/topics/payments/events", server.url);
    assert_eq!(post(&events, &(lines.join("\n") + "\n")).0, 200);
    std::thread::sleep(Duration::from_millis(2_500));
    assert_eq!(post(&events, &(event(500, 1, 600, "1.00") + "\n")).0, 200);
    // A backfill of a range older than the retained input is refused the same way.
    let asked = r#"{"from":"2000-01-01T00:00:00Z","to":"2000-01-02T00:00:00Z","why":"too far back"}"#;
    let (code, body) = post_json(&format!("{}/v1/pipelines/paid/backfill", server.url), asked);
    assert_eq!(code, 409, "{body}");
    assert!(
        body.contains("starts at 2000-01-01T00:00:00.000Z") && body.contains("retained input is whole only from 20"),
        "{body}"
    );
    let v2 = CONTRACT
        .replace("version = 1", "version = 2")
        .replace("decision = ", "start = \"2000-01-01T00:00:00Z\"\ndecision = ");
    let server = server.restart(&v2, config);
    let status: serde_json::Value =
        serde_json::from_str(&get(&format!("{}/v1/pipelines/paid/status", server.url)).1).unwrap();
    let failed = status["failed"].as_str().unwrap_or_default();
    assert!(
        failed.contains("starts at 2000-01-01T00:00:00.000Z")
            && failed.contains("retained input is whole only from 20"),
        "{status}"
    );
    let versions = get(&format!("{}/v1/pipelines/paid/versions", server.url)).1;
    assert_eq!(versions.lines().count(), 1, "the refused version is not stored: {versions}");
}

#[test]
fn promote_auto_makes_a_caught_up_candidate_live_and_a_superseded_version_goes_after_its_retention() {
    let config = "superseded_retention = \"2s\"\n[topics.payments]\npartitions = 1\nkey = \"acct\"\n";
    let server = Server::start("auto-promote", config);
    let events = format!("{}/v1/topics/payments/events", server.url);
    let lines: Vec<String> = (0..50).map(|i| event(i, i % 3, i64::from(i) * 10_000, "1.00")).collect();
    assert_eq!(post(&events, &(lines.join("\n") + "\n")).0, 200);
    let v2 = CONTRACT
        .replace("version = 1", "version = 2")
        .replace("decision = ", "promote = \"auto\"\ndecision = ")
        .replace("size = \"1m\"", "size = \"2m\"");
    let server = server.restart(&v2, config);
    let versions = |url: &str| -> Vec<serde_json::Value> {
        get(&format!("{url}/v1/pipelines/paid/versions")).1.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    // The candidate catches up with version 1 and is promoted by itself, audited, with its entry in the change stream.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !versions(&server.url).iter().any(|v| v["version"] == 2 && v["state"] == "live") {
        assert!(Instant::now() < deadline, "not promoted: {:?}", versions(&server.url));
        std::thread::sleep(Duration::from_millis(100));
    }
    let changes = get(&format!("{}/v1/pipelines/paid/changes?limit=100000", server.url)).1;
    let marker = changes.lines().find(|l| l.contains("\"type\":\"version\"")).unwrap_or_default();
    assert!(marker.contains("\"from\":1") && marker.contains("\"to\":2") && marker.contains("auto"), "{changes}");
    let audit = get(&format!("{}/v1/audit", server.url)).1;
    assert!(audit.lines().any(|l| l.contains("\"promote\"") && l.contains("promote = \\\"auto\\\"")), "{audit}");
    // Version 1 is superseded, readable until superseded_retention, then removed with its rows.
    assert_eq!(get(&format!("{}/v1/pipelines/paid/results?version=1", server.url)).0, 200);
    let deadline = Instant::now() + Duration::from_secs(30);
    while versions(&server.url).iter().any(|v| v["version"] == 1) {
        assert!(Instant::now() < deadline, "version 1 outlived its retention: {:?}", versions(&server.url));
        std::thread::sleep(Duration::from_millis(200));
    }
    let gone = get(&format!("{}/v1/pipelines/paid/results?version=1", server.url));
    assert_eq!(gone.0, 404, "{}", gone.1);
    let kept = get(&format!("{}/v1/pipelines/paid/results", server.url)).1;
    assert!(!kept.is_empty() && kept.lines().all(|l| l.contains("\"version\":2")), "{kept}");
}

#[test]
fn point_12_retention_ahead_of_a_stalled_pipeline_is_counted_and_alerted_and_a_replay_past_the_end_is_400() {
    let config = "idle_timeout = \"1h\"\n[topics.payments]\npartitions = 1\nkey = \"acct\"\nretention = \"1s\"\n";
    let dir = std::env::temp_dir().join(format!("weir-server-test-skipped-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let s = Server::start_in_with(dir, CONTRACT, config, Some(2048));
    let events = format!("{}/v1/topics/payments/events", s.url);
    let metrics = || get(&format!("{}/metrics", s.url)).1;
    assert_eq!(post(&events, &(event(0, 1, 0, "1.00") + "\n")).0, 200);
    wait_read(&s, 1);
    // The pipeline cannot checkpoint (another process holds the write lock)
    // while 200 events fill closed 2 KiB segments that retention deletes
    // after a second: once it restarts from its checkpoint, they are gone.
    let db = rusqlite::Connection::open(s.dir.join("weir.db")).unwrap();
    db.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let lines: Vec<String> = (1..=200).map(|i| event(i, i % 3, i64::from(i), "1.00")).collect();
    assert_eq!(post(&events, &(lines.join("\n") + "\n")).0, 200);
    let deadline = Instant::now() + Duration::from_secs(40);
    while sample(&metrics(), "weir_pipeline_restarts_total", &[]) < 1.0 {
        assert!(Instant::now() < deadline, "no restart while the database stayed locked");
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_millis(1_500));
    assert_eq!(post(&events, &(event(201, 1, 201, "1.00") + "\n")).0, 200);
    db.execute_batch("ROLLBACK").unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let skipped = loop {
        let n = sample(&metrics(), "weir_offsets_skipped_total", &["pipeline=\"paid\""]);
        if n > 0.0 {
            break n;
        }
        assert!(Instant::now() < deadline, "the offsets retention deleted were never counted");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(skipped < 202.0, "{skipped}");
    // ... and the always-on alert fires, saying what to do.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status: serde_json::Value =
            serde_json::from_str(&get(&format!("{}/v1/pipelines/paid/status", s.url)).1).unwrap();
        let alerts = status["alerts"].as_array().cloned().unwrap_or_default();
        if let Some(a) = alerts.iter().find(|a| a["alert"] == "offsets_skipped") {
            assert_eq!(a["observed"].as_str(), Some(skipped.to_string().as_str()), "{a}");
            break;
        }
        assert!(Instant::now() < deadline, "no offsets_skipped alert: {status}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // A replay from past the end of every partition is refused; from the end is fine.
    let (code, body) = post_json(&format!("{}/v1/pipelines/paid/replay", s.url), r#"{"from_offset":203,"why":"t"}"#);
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("past the end") && body.contains("202"), "{body}");
    let (code, body) = post_json(&format!("{}/v1/pipelines/paid/replay", s.url), r#"{"from_offset":202,"why":"t"}"#);
    assert_eq!(code, 202, "{body}");
}

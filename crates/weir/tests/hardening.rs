//! The findings of the outside review (issue 17), one test per point,
//! each named after it, on a running `weir serve` (the embedded log and
//! SQLite). Each test failed before its fix.

mod common;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{agent, call, get, json_lines, start, Scratch, Server};
use serde_json::Value;

const PAID: &str = r#"[pipeline]
name = "paid"
version = 1
owner = "billing-ops"
steward = "data-platform"
decision = "Revenue per account"

[source]
topic = "payments"
event_time = "approved_at"
key = ["account_id"]
event_id = "payment_id"

[window]
type = "tumbling"
size = "1m"

[[aggregate]]
name = "revenue"
fn = "sum"
field = "amount"
"#;

/// 2026-11-01T00:00:00Z
const BASE: i64 = 1_793_491_200_000;

fn payment(id: usize, account: &str, time_ms: i64) -> String {
    format!(
        r#"{{"payment_id":"p{id}","account_id":"{account}","amount":"1.50","approved_at":"{}"}}"#,
        weir_engine::time::format_rfc3339_ms(time_ms)
    )
}

struct Running {
    /// Removed when the test ends.
    _dir: Scratch,
    server: Server,
    base: String,
    port: u16,
}

fn serve(name: &str, toml: &str) -> Running {
    serve_in(Scratch::new(name), toml)
}

fn serve_in(dir: Scratch, toml: &str) -> Running {
    std::fs::create_dir_all(dir.path("contracts")).unwrap();
    dir.write("contracts/paid.toml", PAID);
    dir.write("weir.toml", &format!("{toml}\n[topics.payments]\npartitions = 2\nkey = \"account_id\"\n"));
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let server = start(&dir.0, port);
    Running { _dir: dir, server, base: format!("http://127.0.0.1:{port}"), port }
}

impl Running {
    fn post(&self, body: &str) -> (u16, String) {
        call("POST", &format!("{}/v1/topics/payments/events", self.base), Some(body))
    }

    /// Every record of the topic, read back as a raw-reader.
    fn records(&self) -> usize {
        (0..2).map(|p| self.pages(&format!("/v1/topics/payments/events?partition={p}&limit=100000")).len()).sum()
    }

    /// A GET as the path's role, following `Weir-Next` to the last page.
    fn pages(&self, first: &str) -> Vec<Value> {
        json_lines(&get(&format!("{}{first}", self.base)))
    }

    /// Resident memory of the server, and its peak so far, in bytes.
    fn memory(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.server.child.id())).unwrap();
        let kib = |name: &str| -> u64 {
            let line = status.lines().find(|l| l.starts_with(name)).unwrap();
            line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
        };
        (kib("VmRSS:"), kib("VmHWM:"))
    }

    fn read_count(&self) -> u64 {
        let status: Value = serde_json::from_str(&get(&format!("{}/v1/pipelines/paid/status", self.base))).unwrap();
        status["events"]["read"].as_u64().unwrap_or(0)
    }

    fn wait_read(&self, n: u64) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.read_count() < n {
            assert!(Instant::now() < deadline, "the pipeline read {} of {n} events", self.read_count());
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Sends `head` and `body_start` on a new connection and stalls; the answer
/// read until the server closes the connection, and how long that took.
fn stalled(port: u16, head: &str, body_start: &[u8], deadline: Duration) -> (String, Duration) {
    let mut sock = TcpStream::connect(("127.0.0.1", port)).unwrap();
    sock.set_read_timeout(Some(deadline)).unwrap();
    let began = Instant::now();
    let _ = sock.write_all(head.as_bytes());
    let _ = sock.write_all(body_start);
    let mut out = Vec::new();
    let _ = sock.read_to_end(&mut out);
    (String::from_utf8_lossy(&out).into_owned(), began.elapsed())
}

#[test]
fn point_1_a_body_on_a_public_path_is_refused_unread() {
    let r = serve("public-bodies", "header_timeout = \"2s\"\n[auth]\npublic_metrics = true");
    let (rss_before, _) = r.memory();
    let paths = ["/", "/healthz", "/readyz", "/metrics"];
    let clients: Vec<_> = (0..50)
        .map(|i| {
            let port = r.port;
            let path = paths[i % paths.len()];
            std::thread::spawn(move || {
                let head = match i % 3 {
                    0 => format!("POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: 67108864\r\n\r\n"),
                    1 => format!("GET {path} HTTP/1.1\r\nhost: x\r\ncontent-length: 67108864\r\n\r\n"),
                    _ => format!("POST {path} HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n4000000\r\n"),
                };
                stalled(port, &head, &vec![b'x'; 256 << 10], Duration::from_secs(30))
            })
        })
        .collect();
    for c in clients {
        let (answer, took) = c.join().unwrap();
        assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
        assert!(answer.contains("takes no body"), "{answer}");
        assert!(took < Duration::from_secs(2), "cut off within header_timeout, not after {took:?}");
    }
    let (rss_after, _) = r.memory();
    assert!(
        rss_after < rss_before + (16 << 20),
        "resident memory stays flat: {rss_before} bytes before, {rss_after} after 50 bodies of 64 MiB"
    );
    // Without a body they answer as before, and the refusals are counted.
    let metrics = get(&format!("{}/metrics", r.base));
    assert!(metrics.contains("reason=\"body_on_public_path\""), "{metrics}");
    assert!(get(&format!("{}/healthz", r.base)).contains("true"));
}

#[test]
fn point_2_one_request_costs_memory_in_proportion_and_every_event_is_an_object() {
    let r = serve("request-memory", "");
    // A line that is not a JSON object refuses the whole body, naming it.
    for (line, what) in [("1", "a number"), ("[1,2]", "an array"), ("\"text\"", "a string"), ("null", "null")] {
        let body =
            format!("{}\n{}\n{line}\n{}\n", payment(1, "a1", BASE), payment(2, "a2", BASE), payment(3, "a3", BASE));
        let (code, answer) = r.post(&body);
        assert_eq!(code, 400, "{answer}");
        assert!(answer.contains(&format!("line 3 is {what}, not a JSON object")), "{answer}");
        assert!(answer.contains("nothing was appended"), "{answer}");
    }
    assert_eq!(r.records(), 0, "nothing of a refused request is appended");

    // Past max_events_per_request (100,000 by default): 413, nothing appended.
    let many = "{}\n".repeat(100_001);
    let (code, answer) = r.post(&many);
    assert_eq!(code, 413, "{answer}");
    assert!(answer.contains("max_events_per_request = 100000"), "{answer}");
    assert_eq!(r.records(), 0);

    // 32 MB of `1` lines (16 million events, once): refused at the first line.
    let (_, peak_before) = r.memory();
    let ones = "1\n".repeat(16 << 20);
    assert_eq!(r.post(&ones).0, 400);
    // 100,000 payments (about 12 MB), accepted whole and processed.
    let body: Vec<String> = (0..100_000).map(|i| payment(i, &format!("a{}", i % 5000), BASE + i as i64)).collect();
    let body = body.join("\n");
    assert_eq!(r.post(&body).0, 200);
    r.wait_read(100_000);
    let (_, peak_after) = r.memory();
    let largest = ones.len().max(body.len()) as u64;
    assert!(
        peak_after.saturating_sub(peak_before) < 5 * largest,
        "peak resident memory grew by {} bytes for bodies of at most {largest} bytes (at most 5 times)",
        peak_after.saturating_sub(peak_before)
    );
    assert_eq!(r.records(), 100_000);
}

#[test]
fn point_3_limit_is_checked_and_pages_follow_weir_next() {
    let r = serve("paging", "");
    // 25,000 accounts paying in one minute, then a payment ten minutes on
    // closes it: 25,000 rows.
    for chunk in 0..5 {
        let body: Vec<String> = (chunk * 5_000..(chunk + 1) * 5_000)
            .map(|i| payment(i, &format!("a{i:05}"), BASE + (i % 50_000) as i64))
            .collect();
        assert_eq!(r.post(&body.join("\n")).0, 200);
    }
    // 2,500 payments without an account: 2,500 ledger entries.
    let unpaid: Vec<String> =
        (0..2_500).map(|i| payment(30_000 + i, "b1", BASE + 1_000).replace(r#""account_id":"b1","#, "")).collect();
    assert_eq!(r.post(&unpaid.join("\n")).0, 200);
    assert_eq!(r.post(&payment(99_999, "a00000", BASE + 600_000)).0, 200);
    r.wait_read(27_501);
    let deadline = Instant::now() + Duration::from_secs(60);
    while r.pages("/v1/pipelines/paid/changes?limit=100000").len() < 25_000 {
        assert!(Instant::now() < deadline, "the rows were not published");
        std::thread::sleep(Duration::from_millis(200));
    }

    for path in [
        "/v1/pipelines/paid/results",
        "/v1/pipelines/paid/changes",
        "/v1/pipelines/paid/ledger",
        "/v1/topics/payments/events",
        "/v1/audit",
        "/v1/pipelines/paid/backfills",
    ] {
        for limit in ["-1", "0", "abc", "100001", "1.5", ""] {
            let (code, answer) = call("GET", &format!("{}{path}?limit={limit}", r.base), None);
            assert_eq!(code, 400, "{path}?limit={limit}: {answer}");
            assert!(answer.contains("from 1 to 100000"), "{answer}");
        }
    }

    // /results: 25 pages of 1,000 and the last without Weir-Next; each row once.
    let rows = r.pages("/v1/pipelines/paid/results?limit=1000");
    let place = |r: &Value| (r["key"].to_string(), r["window_start"].to_string());
    let places: BTreeSet<(String, String)> = rows.iter().map(place).collect();
    let published: BTreeSet<(String, String)> =
        r.pages("/v1/pipelines/paid/changes?limit=100000").iter().map(place).collect();
    assert!(rows.len() >= 25_000);
    assert_eq!((rows.len(), &places), (published.len(), &published), "every row exactly once");
    // The default page is 10,000 rows, and says there is more.
    let url = format!("{}/v1/pipelines/paid/results", r.base);
    let first = common::authed(agent().get(&url), "GET", &url).call().unwrap();
    let next = first.headers().get("weir-next").map(|v| v.to_str().unwrap().to_owned());
    assert!(next.as_deref().is_some_and(|n| n.starts_with("/v1/pipelines/paid/results?after=")), "{next:?}");
    // Filters are kept from page to page.
    let a1 = r.pages("/v1/pipelines/paid/results?limit=1&key.account_id=a00001");
    assert_eq!(a1.len(), 1);
    let (code, answer) = call("GET", &format!("{url}?after=nonsense"), None);
    assert_eq!(code, 400, "{answer}");

    // /changes: seq 1..n, each once, over pages of 7,000.
    let changes = r.pages("/v1/pipelines/paid/changes?limit=7000");
    let seqs: Vec<i64> = changes.iter().map(|c| c["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs, (1..=seqs.len() as i64).collect::<Vec<_>>());
    assert!(seqs.len() >= 25_000);
    // /ledger: 2,500 entries over pages of 1,000.
    let ledger = r.pages("/v1/pipelines/paid/ledger?limit=1000");
    let ids: BTreeSet<String> = ledger.iter().map(|e| e["seq"].to_string()).collect();
    assert_eq!((ledger.len(), ids.len()), (2_500, 2_500));
    // The raw events: every record once, in pages of 3,000.
    let mut offsets = 0;
    for p in 0..2 {
        let page = r.pages(&format!("/v1/topics/payments/events?partition={p}&limit=3000"));
        let each: BTreeSet<u64> = page.iter().map(|e| e["offset"].as_u64().unwrap()).collect();
        assert_eq!(each.len(), page.len());
        offsets += page.len();
    }
    assert_eq!(offsets, 27_501);
    // The audit log (every raw read above is in it), in pages of 2.
    let audit = r.pages("/v1/audit?limit=2");
    let seqs: Vec<i64> = audit.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    assert!(seqs.len() > 4 && seqs == (1..=seqs.len() as i64).collect::<Vec<_>>(), "{seqs:?}");
}

#[test]
fn point_5_a_producer_cannot_send_its_own_kafka_member() {
    let r = serve("forged-kafka", "");
    for forged in [
        r#"{"payment_id":"p1","account_id":"a1","amount":"1","approved_at":"2026-11-01T00:00:00Z","$kafka":{"timestamp":0}}"#,
        r#"{"payment_id":"p1","account_id":"a1","amount":"1","approved_at":"2026-11-01T00:00:00Z","\u0024kafka":{}}"#,
    ] {
        let body = format!("{}\n{forged}\n", payment(0, "a0", BASE));
        let (code, answer) = r.post(&body);
        assert_eq!(code, 422, "{answer}");
        assert!(answer.contains("line 2") && answer.contains("$kafka"), "{answer}");
    }
    assert_eq!(r.records(), 0, "nothing of the request was appended");
    // Nested, it is an ordinary member.
    let nested = payment(0, "a0", BASE).replace(r#""amount""#, r#""meta":{"$kafka":1},"amount""#);
    assert_eq!(r.post(&nested).0, 200);
}

#[test]
fn point_6_a_token_sees_only_the_pipelines_it_may_read() {
    let dir = Scratch::new("leaks");
    std::fs::create_dir_all(dir.path("contracts")).unwrap();
    dir.write("contracts/paid.toml", PAID);
    dir.write("contracts/other.toml", &common::refunds("other", "1s"));
    dir.write("weir.toml", "[topics.payments]\npartitions = 2\nkey = \"account_id\"\n");
    let data = dir.path("data");
    let paid_reader = common::make_token(&data, &["--role", "reader", "--pipeline", "paid"]);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let base = format!("http://127.0.0.1:{port}");
    let server = start(&dir.0, port);
    let as_paid_reader = |path: &str| -> (u16, String) {
        let mut r = agent()
            .get(format!("{base}{path}"))
            .header("authorization", format!("Bearer {paid_reader}"))
            .call()
            .unwrap();
        (r.status().as_u16(), r.body_mut().read_to_string().unwrap())
    };
    // An old refund: pipeline other's watermark is a year old, and its alert fires.
    let refund = r#"{"account_id":"a1","at":"2025-11-01T00:00:00Z"}"#;
    assert_eq!(call("POST", &format!("{base}/v1/topics/refunds/events"), Some(refund)).0, 200);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let dashboard: Value = serde_json::from_str(&get(&format!("{base}/v1/dashboard"))).unwrap();
        if dashboard["incidents"]["alerts"]
            .as_array()
            .is_some_and(|a| a.iter().any(|i| i.to_string().contains("other")))
        {
            break;
        }
        assert!(Instant::now() < deadline, "the admin's dashboard never showed other's alert");
        std::thread::sleep(Duration::from_millis(250));
    }
    // The dashboard: paid only, and none of other's incidents.
    let (code, dashboard) = as_paid_reader("/v1/dashboard");
    assert_eq!(code, 200, "{dashboard}");
    assert!(!dashboard.contains("other") && !dashboard.contains("refunds"), "{dashboard}");
    assert!(dashboard.contains("\"paid\""));
    // A 404 names no pipeline.
    let (code, missing) = as_paid_reader("/v1/pipelines/nope/results");
    assert_eq!(code, 404, "{missing}");
    assert!(!missing.contains("other") && !missing.contains("\"paid\""), "{missing}");
    // /metrics: paid's series, none of other's.
    let (code, metrics) = as_paid_reader("/metrics");
    assert_eq!(code, 200);
    assert!(metrics.contains("pipeline=\"paid\""), "{metrics}");
    assert!(!metrics.contains("pipeline=\"other\"") && !metrics.contains("refunds"), "other's series leaked");
    let admin_metrics = get(&format!("{base}/metrics"));
    assert!(admin_metrics.contains("pipeline=\"other\""));
    drop(server);

    // /readyz with a pipeline that does not run (its contract changed
    // without a version bump): 503 for everyone, the reasons for an admin only.
    dir.write("contracts/other.toml", &common::refunds("other", "1s").replace("size = \"1m\"", "size = \"2m\""));
    let _server = start(&dir.0, port);
    let mut anyone = agent().get(format!("{base}/readyz")).call().unwrap();
    let said = anyone.body_mut().read_to_string().unwrap();
    assert_eq!(anyone.status().as_u16(), 503, "{said}");
    assert!(!said.contains("other") && !said.contains("bump"), "no names or errors without a token: {said}");
    let (code, told) = as_paid_reader("/readyz");
    assert!(code == 503 && !told.contains("other"), "nor to a reader: {told}");
    let (code, admin) = call("GET", &format!("{base}/readyz"), None);
    assert!(code == 503 && admin.contains("pipeline other does not run"), "{admin}");
}

#[test]
fn point_8_the_data_folder_is_owner_only_and_no_password_is_printed() {
    use std::os::unix::fs::PermissionsExt;
    let r = serve("private-files", "");
    let body: Vec<String> = (0..50).map(|i| payment(i, "a1", BASE + i as i64)).collect();
    assert_eq!(r.post(&body.join("\n")).0, 200);
    r.wait_read(50);
    let data = r._dir.path("data");
    let mut seen = (0, 0);
    let mut stack = vec![data.clone()];
    while let Some(dir) = stack.pop() {
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{} is {mode:o}", dir.display());
        seen.0 += 1;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
                assert_eq!(mode, 0o600, "{} is {mode:o}", path.display());
                seen.1 += 1;
            }
        }
    }
    let names: Vec<String> =
        std::fs::read_dir(&data).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert!(names.iter().any(|n| n == "weir.db-wal"), "the WAL is there and was checked: {names:?}");
    assert!(seen.0 >= 3 && seen.1 >= 4, "folders and files checked: {seen:?}");

    // A start that cannot reach Postgres names it without the password.
    let dir = Scratch::new("pg-password");
    std::fs::create_dir_all(dir.path("contracts")).unwrap();
    dir.write("contracts/paid.toml", PAID);
    let toml = "[kafka]\nbrokers = \"127.0.0.1:9\"\n\n[postgres]\nurl = \"host=127.0.0.1 port=9 user=weir password=Sup3rSecret dbname=test connect_timeout=2\"\n";
    dir.write("weir.toml", toml);
    let (data, contracts, config) = (dir.path("data"), dir.path("contracts"), dir.path("weir.toml"));
    let out = common::weir(&[
        &"serve",
        &"--data",
        &data,
        &"--contracts",
        &contracts,
        &"--config",
        &config,
        &"--listen",
        &"127.0.0.1:0",
    ]);
    let err = common::text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("cannot connect to Postgres") && err.contains("password=***"), "{err}");
    assert!(!err.contains("Sup3rSecret"), "{err}");
}

#[test]
fn point_13_a_post_with_an_idempotency_key_is_done_at_most_once() {
    let r = serve("idempotency", "");
    let url = format!("{}/v1/topics/payments/events", r.base);
    let producer = common::tokens_of(&r._dir.path("data")).producer;
    let post = |key: &str, body: &str| -> (u16, String, bool) {
        let mut a = agent()
            .post(&url)
            .header("authorization", format!("Bearer {producer}"))
            .header("idempotency-key", key)
            .send(body)
            .unwrap();
        let replayed = a.headers().contains_key("idempotent-replayed");
        (a.status().as_u16(), a.body_mut().read_to_string().unwrap(), replayed)
    };
    let body: Vec<String> = (0..10).map(|i| payment(i, &format!("a{i}"), BASE)).collect();
    let body = body.join("\n");
    let first = post("batch-1", &body);
    assert_eq!((first.0, first.2), (200, false), "{}", first.1);
    // The answer was lost; the producer sends the same body with the same key.
    let again = post("batch-1", &body);
    assert_eq!((again.0, again.1.as_str(), again.2), (200, first.1.as_str(), true), "the first answer again");
    assert_eq!(r.records(), 10, "appended once");
    // The same key with another body: 422, nothing appended.
    let other = post("batch-1", &payment(99, "a1", BASE));
    assert_eq!(other.0, 422, "{}", other.1);
    assert!(other.1.contains("another body"), "{}", other.1);
    // Keys are 1-128 visible ASCII characters.
    for bad in ["x".repeat(129), "two words".into()] {
        let (code, answer, _) = post(&bad, &body);
        assert_eq!(code, 400, "{answer}");
    }
    // Twenty producers at once with one key: one append.
    let sent: Vec<_> = (0..20)
        .map(|_| {
            let (url, producer, body) = (url.clone(), producer.clone(), body.replace("p", "q"));
            std::thread::spawn(move || loop {
                let r = agent()
                    .post(&url)
                    .header("authorization", format!("Bearer {producer}"))
                    .header("idempotency-key", "batch-2")
                    .send(&body)
                    .unwrap();
                match r.status().as_u16() {
                    409 => std::thread::sleep(Duration::from_millis(20)),
                    code => break code,
                }
            })
        })
        .collect();
    assert!(sent.into_iter().all(|t| t.join().unwrap() == 200));
    assert_eq!(r.records(), 20);
    // Issue 42, finding 6: a key is the producer's own. Another producer's
    // token with the same key and another body is another request.
    let other_producer =
        common::make_token(&r._dir.path("data"), &["--role", "producer", "--topic", "payments", "--why", "two"]);
    let mut a = agent()
        .post(&url)
        .header("authorization", format!("Bearer {other_producer}"))
        .header("idempotency-key", "batch-1")
        .send(payment(300, "c1", BASE))
        .unwrap();
    assert_eq!(a.status().as_u16(), 200, "{}", a.body_mut().read_to_string().unwrap());
    assert!(!a.headers().contains_key("idempotent-replayed"));
    assert_eq!(r.records(), 21);
    // `weir produce` sends a key per batch.
    let file =
        r._dir.write("more.jsonl", &(0..30).map(|i| payment(200 + i, "b1", BASE)).collect::<Vec<_>>().join("\n"));
    let out =
        common::weir_as(&producer, &[&"produce", &"--url", &r.base, &"--topic", &"payments", &"--batch", &"7", &file]);
    assert!(out.status.success(), "{}", common::text(&out.stderr));
    assert_eq!(r.records(), 51);
}

#[test]
fn point_10_a_webhook_to_a_metadata_address_stops_the_start_unless_allowed() {
    let dir = Scratch::new("metadata-hook");
    std::fs::create_dir_all(dir.path("contracts")).unwrap();
    let hooked =
        format!("{PAID}\n[alerts]\nmax_lag = \"1m\"\nwebhook = \"http://169.254.169.254/latest/meta-data/\"\n");
    dir.write("contracts/paid.toml", &hooked);
    dir.write("weir.toml", "");
    let (data, contracts, config) = (dir.path("data"), dir.path("contracts"), dir.path("weir.toml"));
    let args: [&dyn AsRef<std::ffi::OsStr>; 9] =
        [&"serve", &"--data", &data, &"--contracts", &contracts, &"--config", &config, &"--listen", &"127.0.0.1:0"];
    let out = common::weir(&args);
    let err = common::text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("169.254.169.254") && err.contains("allow_link_local_webhooks"), "{err}");
    // Allowed in weir.toml, it starts.
    dir.write("weir.toml", "allow_link_local_webhooks = true\n");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let _server = start(&dir.0, port);
    assert!(get(&format!("http://127.0.0.1:{port}/healthz")).contains("true"));
}

#[test]
fn point_4_a_client_that_stops_reading_is_cut_off_and_holds_no_shutdown() {
    let dir = Scratch::new("stalled-reader");
    std::fs::create_dir_all(dir.path("contracts")).unwrap();
    dir.write("contracts/paid.toml", PAID);
    dir.write("weir.toml", "write_timeout = \"2s\"\n[topics.payments]\npartitions = 1\n");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let base = format!("http://127.0.0.1:{port}");
    let mut server = start(&dir.0, port);
    let raw_reader = common::tokens_of(&dir.path("data")).raw_reader;
    // 100,000 events: about 20 MB read back, more than the sockets buffer.
    let body: Vec<String> = (0..100_000).map(|i| payment(i, &format!("a{}", i % 100), BASE)).collect();
    assert_eq!(call("POST", &format!("{base}/v1/topics/payments/events"), Some(&body.join("\n"))).0, 200);
    let download = || {
        let mut sock = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let request = format!(
            "GET /v1/topics/payments/events?partition=0&limit=100000&why=test HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {raw_reader}\r\n\r\n"
        );
        sock.write_all(request.as_bytes()).unwrap();
        let mut head = [0u8; 512];
        let n = sock.read(&mut head).unwrap();
        let head = String::from_utf8_lossy(&head[..n]).into_owned();
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        sock
    };
    // A reader that stops reading: after write_timeout the server ends the connection.
    let mut stalled = download();
    std::thread::sleep(Duration::from_secs(5));
    stalled.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut rest = Vec::new();
    let _ = stalled.read_to_end(&mut rest);
    let lines = rest.iter().filter(|&&b| b == b'\n').count();
    assert!(lines < 99_000, "the stalled answer was cut off, not sent whole: {lines} lines arrived");
    // SIGTERM while another download stalls: the server stops within write_timeout and a margin.
    let _held = download();
    let asked = Instant::now();
    let pid = server.child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if server.child.try_wait().unwrap().is_some() {
            break;
        }
        assert!(Instant::now() < deadline, "SIGTERM did not stop the server while a client stalled");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(asked.elapsed() < Duration::from_secs(6), "stopped after {:?}: write_timeout is 2 s", asked.elapsed());
}

/// Rewrites the audit log as someone who can edit weir.db but has no key
/// would: one `why` changed, every hash recomputed as a plain SHA-256
/// chain, the key's name taken out of `meta`.
fn rewrite_audit_without_key(db: &std::path::Path) {
    use sha2::{Digest, Sha256};
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.execute_batch(
        "DROP TRIGGER audit_append_only_update; DROP TRIGGER audit_append_only_delete;
         UPDATE audit SET why = 'nothing to see' WHERE action = 'pause';
         DELETE FROM meta WHERE key LIKE 'audit_key%';",
    )
    .unwrap();
    let rows: Vec<(i64, String)> = {
        let mut stmt = conn
            .prepare("SELECT seq, at_ms, who, action, pipeline, detail, why, origin FROM audit ORDER BY seq")
            .unwrap();
        let rows = stmt
            .query_map([], |r| {
                let content = serde_json::json!([
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, Option<String>>(4)?,
                    r.get::<_, String>(5)?,
                    r.get::<_, String>(6)?,
                    r.get::<_, String>(7)?
                ]);
                Ok((r.get(0)?, content.to_string()))
            })
            .unwrap();
        rows.map(Result::unwrap).collect()
    };
    let mut prev = "0".repeat(64);
    for (seq, content) in rows {
        let hash: String =
            Sha256::digest(format!("{prev}\n{content}").as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
        conn.execute(
            "UPDATE audit SET prev_hash = ?2, hash = ?3, key_id = '' WHERE seq = ?1",
            rusqlite::params![seq, prev, hash],
        )
        .unwrap();
        prev = hash;
    }
}

#[test]
fn point_9_the_audit_chain_is_keyed_and_no_action_stands_unaudited() {
    use std::os::unix::fs::PermissionsExt;
    let dir = Scratch::new("audit-key");
    let key = dir.write("audit.key", "k3Y-0f-the-audit-log-not-in-the-data-folder-0123456789\n");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let r = serve_in(dir, &format!("audit_key_file = {:?}", key.display().to_string()));
    let data = r._dir.path("data");
    let audit = |r: &Running| r.pages("/v1/audit?since=1");
    let act = |what: &str| call("POST", &format!("{}/v1/pipelines/paid/{what}", r.base), Some(r#"{"why":"drill"}"#));

    let (code, body) = act("pause");
    assert_eq!(code, 200, "{body}");
    let entries = audit(&r);
    let keyed = entries.iter().find(|e| e["action"] == "audit-key").expect("the key's first use is an entry");
    assert_eq!(keyed["detail"]["key_id"].as_str().unwrap().len(), 16, "{keyed}");
    let pause = entries.last().unwrap().clone();
    assert_eq!((pause["action"].as_str(), pause["detail"]["was_paused"].as_bool()), (Some("pause"), Some(false)));

    // An entry that cannot be keyed is not written, and neither is its action.
    let kept = std::fs::read(&key).unwrap();
    std::fs::remove_file(&key).unwrap();
    let (code, body) = act("resume");
    assert!(code >= 500, "{code} {body}");
    let (code, body) = call(
        "POST",
        &format!("{}/v1/pipelines/paid/annotations", r.base),
        Some(r#"{"from":"2026-11-01T00:00:00Z","to":"2026-11-01T01:00:00Z","note":"unkeyed"}"#),
    );
    assert!(code >= 500, "{code} {body}");
    let status: Value = serde_json::from_str(&get(&format!("{}/v1/pipelines/paid/status", r.base))).unwrap();
    assert_eq!(status["paused"], true, "the resume did not take effect: {status}");
    assert_eq!(get(&format!("{}/v1/pipelines/paid/annotations", r.base)).trim(), "", "no note was kept");
    assert_eq!(audit(&r).len(), entries.len(), "nothing was audited");
    std::fs::write(&key, &kept).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (code, body) = act("resume");
    assert_eq!(code, 200, "{body}");
    drop(r.server);

    let verify = |args: &[&dyn AsRef<std::ffi::OsStr>]| {
        let mut all: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"audit", &"verify", &"--data", &data];
        all.extend_from_slice(args);
        let out = common::weir(&all);
        (out.status.success(), common::text(&out.stdout) + &common::text(&out.stderr))
    };
    let at = format!("{}:{}", pause["seq"], pause["hash"].as_str().unwrap());
    let (ok, said) = verify(&[&"--key", &key, &"--at", &at]);
    assert!(ok, "{said}");
    assert!(said.contains(&format!("\"keyed_from\":{}", keyed["seq"])), "{said}");

    // Someone who can edit weir.db but has no key rewrites the log.
    rewrite_audit_without_key(&data.join("weir.db"));
    let (ok, said) = verify(&[]);
    assert!(ok, "the plain chain holds on its own: {said}");
    let (ok, said) = verify(&[&"--key", &key]);
    assert!(!ok && said.contains("none of the audit log's"), "{said}");
    let (ok, said) = verify(&[&"--at", &at]);
    assert!(!ok && said.contains(&format!("audit entry {} has hash", pause["seq"])), "{said}");

    // The key is refused inside the data folder, or readable by others.
    let serve_with = |toml: &str| {
        let dir = Scratch::new("audit-key-refused");
        std::fs::create_dir_all(dir.path("contracts")).unwrap();
        std::fs::create_dir_all(dir.path("data")).unwrap();
        dir.write("contracts/paid.toml", PAID);
        let inside = dir.write("data/audit.key", &"k".repeat(40));
        let open = dir.write("open.key", &"k".repeat(40));
        std::fs::set_permissions(&inside, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
        let toml = toml.replace("INSIDE", &inside.display().to_string()).replace("OPEN", &open.display().to_string());
        dir.write("weir.toml", &toml);
        let (d, c, w) = (dir.path("data"), dir.path("contracts"), dir.path("weir.toml"));
        let out =
            common::weir(&[&"serve", &"--data", &d, &"--contracts", &c, &"--config", &w, &"--listen", &"127.0.0.1:0"]);
        (out.status.success(), common::text(&out.stderr))
    };
    let (ok, err) = serve_with("audit_key_file = \"INSIDE\"");
    assert!(!ok && err.contains("is inside the data folder"), "{err}");
    let (ok, err) = serve_with("audit_key_file = \"OPEN\"");
    assert!(!ok && err.contains("chmod 600"), "{err}");
}

/// The second outside review (issue 42), finding 8: an operator's text (an
/// incident's title, why and notes, an annotation, the why of an action, a
/// backfill or a reconciliation) is at most 4 KiB. A longer one is refused
/// with 400 naming the field, and nothing is kept or audited.
#[test]
fn review_2_point_8_an_operators_text_is_at_most_4_kib() {
    let r = serve("operator-text", "");
    let url = |path: &str| format!("{}/v1/pipelines/paid/{path}", r.base);
    let long = "x".repeat(4097);
    let audited = r.pages("/v1/audit?since=1").len();
    let (from, to) = ("2026-11-01T00:00:00Z", "2026-11-01T01:00:00Z");
    let refused = [
        ("incidents", serde_json::json!({ "title": long }), "title"),
        ("incidents", serde_json::json!({ "title": "t", "why": long }), "why"),
        ("annotations", serde_json::json!({ "from": from, "to": to, "note": long }), "note"),
        ("annotations", serde_json::json!({ "from": from, "to": to, "note": "n", "who": long }), "who"),
        ("pause", serde_json::json!({ "why": long }), "why"),
        ("backfill", serde_json::json!({ "from": from, "to": to, "why": long }), "why"),
        ("drills", serde_json::json!({ "scenario": "delayed-partition", "why": long }), "why"),
    ];
    for (path, body, field) in refused {
        let (code, text) = call("POST", &url(path), Some(&body.to_string()));
        assert_eq!(code, 400, "{path} with a 4,097-byte {field}: {text}");
        assert!(text.contains(&format!("`{field}` is 4097 bytes")) && text.contains("4096"), "{path}: {text}");
    }
    let (code, text) = call("POST", &url(&format!("reconcile?why={long}&map=x")), Some("a\n"));
    assert_eq!(code, 400, "reconcile with a 4,097-byte why: {text}");
    assert!(text.contains("`why` is 4097 bytes"), "{text}");
    assert_eq!(r.pages("/v1/audit?since=1").len(), audited, "nothing refused was audited");
    assert_eq!(get(&url("annotations")).trim(), "", "no annotation was kept");
    let status: Value = serde_json::from_str(&get(&url("status"))).unwrap();
    assert_eq!(status["paused"], false, "{status}");
    // At the limit, it is taken.
    let fits = "y".repeat(4096);
    let (code, text) = call("POST", &url("incidents"), Some(&serde_json::json!({ "title": fits }).to_string()));
    assert_eq!(code, 201, "{text}");
    let id = serde_json::from_str::<Value>(&text).unwrap()["id"].as_i64().unwrap();
    let notes = url(&format!("incidents/{id}/notes"));
    let (code, text) = call("POST", &notes, Some(&serde_json::json!({ "note": long }).to_string()));
    assert_eq!(code, 400, "a note of 4,097 bytes: {text}");
}

/// The second outside review (issue 42), finding 8: a GET that says it has
/// a body is refused unread (413) instead of passing the readers' gate.
#[test]
fn review_2_point_8_a_get_with_a_body_is_refused_not_let_past_the_gate() {
    let r = serve("get-with-body", "");
    let token = common::tokens_of(&r._dir.path("data")).reader;
    for head in [
        format!("GET /v1/pipelines HTTP/1.1\r\nhost: x\r\nconnection: close\r\nauthorization: Bearer {token}\r\ncontent-length: 5\r\n\r\nhello"),
        format!("GET /v1/pipelines/paid/results HTTP/1.1\r\nhost: x\r\nconnection: close\r\nauthorization: Bearer {token}\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
    ] {
        let (answer, _) = stalled(r.port, &head, b"", Duration::from_secs(10));
        assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
        assert!(answer.contains("takes no body"), "{answer}");
    }
    // Without a body, the same read answers.
    assert!(get(&format!("{}/v1/pipelines", r.base)).contains("paid"));
    let metrics = get(&format!("{}/metrics", r.base));
    assert!(metrics.contains("reason=\"body_on_read\""), "{metrics}");
}

/// Issue 42, finding 1: a reconcile upload of a 1 MiB column name, then
/// 4,096 short lines, once asked for about 4 GiB (the header copied into
/// every row). Under an address-space limit of 1 GiB the server reads it
/// in proportion and answers; a header of a million commas and a body past
/// `max_export_bytes` are refused, and the server still serves.
#[test]
fn review_2_point_1_a_reconcile_upload_is_read_in_proportion() {
    let dir = Scratch::new("reconcile-upload");
    std::fs::create_dir_all(dir.path("contracts")).unwrap();
    dir.write("contracts/paid.toml", PAID);
    // Exports have their own limit, above the events' max_body_bytes.
    let toml = "max_body_bytes = 1048576\nmax_export_bytes = 2097152\n[topics.payments]\npartitions = 2\nkey = \"account_id\"\n";
    dir.write("weir.toml", toml);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let server = common::start_within(&dir.0, port, 1 << 20);
    let base = format!("http://127.0.0.1:{port}");
    let reconcile = |body: &str| {
        let url = format!(
            "{base}/v1/pipelines/paid/reconcile?why=review&format=csv&map=key.account_id=account,window_start=day,revenue=total"
        );
        call("POST", &url, Some(body))
    };
    let long = "c".repeat(1 << 20);
    let mut wide = format!("{long},account,day,total\n");
    for i in 0..4096 {
        wide.push_str(&format!("x,a{i},2026-11-01,{i}\n"));
    }
    assert!(wide.len() > 1 << 20, "past max_body_bytes, within max_export_bytes");
    let (code, answer) = reconcile(&wide);
    assert_eq!(code, 200, "{answer}");
    let report: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(report["windows"]["missing_in_weir"], 4096, "{report}");

    let (code, answer) = reconcile(&",".repeat(1 << 20));
    assert_eq!(code, 400, "{answer}");
    assert!(answer.contains("the header has no column `account` (it has"), "{answer}");
    assert!(answer.contains("and 1048565 more"), "{answer}");

    // Past max_export_bytes: refused before the body is read.
    let path = "/v1/pipelines/paid/reconcile?why=review&map=key.account_id=account,window_start=day,revenue=total";
    let token = common::token_for("POST", &format!("{base}{path}")).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\ncontent-length: {}\r\n\r\n",
        3 << 20
    );
    let (answer, _) = stalled(port, &head, b"account,day,total\n", Duration::from_secs(10));
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("max_export_bytes = 2097152"), "{answer}");

    assert_eq!(call("GET", &format!("{base}/healthz"), None).0, 200);
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.child.id())).unwrap();
    let peak: u64 =
        status.lines().find(|l| l.starts_with("VmHWM:")).unwrap().split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(peak < 300 << 10, "peak resident memory {peak} KiB for exports of at most 3 MiB");
}

/// Issue 42, finding 6: a producer that goes away while its request with
/// an Idempotency-Key is being done does not leave the key `pending`: the
/// request is done to its end, and the retry gets its answer. On Kafka the
/// broker is paused so that the producer leaves mid-append; before the fix
/// the retry got 409 for 24 hours.
#[test]
fn review_2_point_6_a_producer_that_goes_away_mid_request_leaves_no_key_pending() {
    let dir = Scratch::new("idempotency-gone");
    for topology in common::topology::Topology::both("idempotency_gone") {
        let config = topology.config(("payments", 2, "account_id"), "");
        let root = topology.folder(&dir, topology.name(), &[("paid.toml", common::PAID)], &config);
        let (_server, base) = topology.serve(&root);
        let producer = common::tokens_of(&root.join("data")).producer;
        let body = (0..10).map(|i| payment(i, &format!("a{i}"), BASE)).collect::<Vec<_>>().join("\n");
        let broker = match &topology {
            common::topology::Topology::Kafka(broker, _) => Some(broker),
            common::topology::Topology::Embedded => None,
        };
        if let Some(b) = broker {
            b.pause();
        }
        let port: u16 = base.rsplit(':').next().unwrap().parse().unwrap();
        let mut sock = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let head = format!(
            "POST /v1/topics/payments/events HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {producer}\r\nidempotency-key: gone-1\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        sock.write_all(head.as_bytes()).unwrap();
        sock.write_all(body.as_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(500));
        drop(sock); // gone before the answer
        std::thread::sleep(Duration::from_millis(500));
        if let Some(b) = broker {
            b.resume();
        }
        let url = format!("{base}/v1/topics/payments/events");
        let deadline = Instant::now() + Duration::from_secs(60);
        let (code, answer, replayed) = loop {
            let mut a = agent()
                .post(&url)
                .header("authorization", format!("Bearer {producer}"))
                .header("idempotency-key", "gone-1")
                .send(&body)
                .unwrap();
            let replayed = a.headers().contains_key("idempotent-replayed");
            let (code, answer) = (a.status().as_u16(), a.body_mut().read_to_string().unwrap());
            // The first request still being done: its key is held until then.
            if code == 409 && answer.contains("is being done now") && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
            break (code, answer, replayed);
        };
        assert_eq!((code, replayed), (200, true), "{}: the first request's answer: {answer}", topology.name());
        assert!(answer.contains("\"accepted\":10"), "{answer}");
        // Every event once.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let s: Value = serde_json::from_str(&get(&format!("{base}/v1/pipelines/paid/status"))).unwrap();
            if s["events"]["read"] == 10 && s["lag_records"] == 0 {
                break;
            }
            assert!(Instant::now() < deadline, "{}: {s}", topology.name());
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(Duration::from_millis(500));
        let s: Value = serde_json::from_str(&get(&format!("{base}/v1/pipelines/paid/status"))).unwrap();
        assert_eq!(s["events"]["read"], 10, "{}: appended once: {s}", topology.name());
    }
}

/// Issue 42, finding 6, the crash case: a request with an Idempotency-Key
/// that a crash of the server cut short (its key left `pending`) is
/// finished by its retry from the records that carry its tag. Two crashes
/// are made by hand in weir.db, the server stopped: one after the first
/// attempt's events were appended (the retry appends nothing and answers
/// where they went), one before (the retry appends them, although another
/// producer appended the same bytes meanwhile: before the fix, the log
/// counted those as this request's and the events were lost; on Kafka the
/// retry got 409 for 24 hours).
#[test]
fn review_2_point_6_a_key_left_pending_by_a_crash_is_finished_from_its_own_records() {
    use sha2::Digest;
    let dir = Scratch::new("idempotency-crash");
    for topology in common::topology::Topology::both("idempotency_crash") {
        let config = topology.config(("payments", 2, "account_id"), "");
        let root = topology.folder(&dir, topology.name(), &[("paid.toml", common::PAID)], &config);
        let data = root.join("data");
        let (server, base) = topology.serve(&root);
        let producer = common::tokens_of(&data).producer;
        let other = common::make_token(&data, &["--role", "producer", "--topic", "payments", "--why", "other"]);
        let post = |base: &str, token: &str, key: Option<&str>, body: &str| -> (u16, String) {
            let mut r = agent()
                .post(&format!("{base}/v1/topics/payments/events"))
                .header("authorization", format!("Bearer {token}"));
            if let Some(key) = key {
                r = r.header("idempotency-key", key);
            }
            let mut a = r.send(body).unwrap();
            (a.status().as_u16(), a.body_mut().read_to_string().unwrap())
        };
        let read = |base: &str, events: u64| {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let s: Value = serde_json::from_str(&get(&format!("{base}/v1/pipelines/paid/status"))).unwrap();
                if s["events"]["read"] == events && s["lag_records"] == 0 {
                    break;
                }
                assert!(Instant::now() < deadline, "{}: waiting for {events} events read: {s}", topology.name());
                std::thread::sleep(Duration::from_millis(100));
            }
        };
        let x = (0..10).map(|i| payment(i, &format!("a{i}"), BASE)).collect::<Vec<_>>().join("\n");
        let z = (100..110).map(|i| payment(i, &format!("a{i}"), BASE)).collect::<Vec<_>>().join("\n");
        let (code, first) = post(&base, &producer, Some("crash-1"), &x);
        assert_eq!(code, 200, "{first}");
        assert_eq!(post(&base, &other, None, &z).0, 200);
        read(&base, 20);
        drop(server);
        // The crashes, as weir.db would hold them.
        let db = rusqlite::Connection::open(data.join("weir.db")).unwrap();
        let (stored, starts, at_ms): (String, String, i64) = db
            .query_row("SELECT key, starts, at_ms FROM idempotency WHERE key LIKE '%/crash-1'", [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .unwrap();
        db.execute("UPDATE idempotency SET state = 'pending', answer = NULL WHERE key = ?1", [&stored]).unwrap();
        let hash: String = sha2::Sha256::digest(z.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
        let cut_short = stored.replace("/crash-1", "/crash-2");
        db.execute(
            "INSERT INTO idempotency (topic, key, body_hash, state, starts, at_ms) VALUES ('payments', ?1, ?2, 'pending', ?3, ?4)",
            rusqlite::params![cut_short, hash, starts, at_ms],
        )
        .unwrap();
        drop(db);
        let (_server, base) = topology.serve(&root);
        // Appended before the crash: the retry finds them and appends nothing.
        let (code, again) = post(&base, &producer, Some("crash-1"), &x);
        assert_eq!((code, again.as_str()), (200, first.as_str()), "{}: where they went", topology.name());
        // Not appended before the crash: another producer's same bytes are not this request's.
        let (code, answer) = post(&base, &producer, Some("crash-2"), &z);
        assert_eq!(code, 200, "{}: {answer}", topology.name());
        assert!(answer.contains("\"accepted\":10"), "{answer}");
        read(&base, 30);
        std::thread::sleep(Duration::from_millis(500));
        read(&base, 30);
        // Each answered now: a third try is a replay.
        let (code, replay) = post(&base, &producer, Some("crash-2"), &z);
        assert_eq!((code, replay.as_str()), (200, answer.as_str()));
    }
}

/// Issue 42, finding 4: a backfill and a reconciliation are kept with
/// their audit entry in one transaction. With the audit key gone, each
/// answers 5xx and nothing is asked, kept or published.
#[test]
fn review_2_point_4_a_backfill_or_reconciliation_that_cannot_be_audited_does_not_happen() {
    use std::os::unix::fs::PermissionsExt;
    let dir = Scratch::new("audit-actions");
    let key = dir.write("audit.key", "k3Y-0f-the-audit-log-not-in-the-data-folder-0123456789\n");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let r = serve_in(dir, &format!("audit_key_file = {:?}", key.display().to_string()));
    // Ten accounts' payments in the first minute, then a payment of each ten
    // minutes on: every partition's watermark is past the first windows.
    let first: Vec<String> = (0..10).map(|i| payment(i, &format!("a{i}"), BASE + i as i64)).collect();
    let later: Vec<String> = (0..10).map(|i| payment(100 + i, &format!("a{i}"), BASE + 600_000)).collect();
    assert_eq!(r.post(&first.join("\n")).0, 200);
    assert_eq!(r.post(&later.join("\n")).0, 200);
    r.wait_read(20);
    let backfill = || {
        let body = r#"{"from":"2026-11-01T00:00:00Z","to":"2026-11-01T00:01:00Z","why":"review"}"#;
        call("POST", &format!("{}/v1/pipelines/paid/backfill", r.base), Some(body))
    };
    let reconcile = || {
        let url = format!(
            "{}/v1/pipelines/paid/reconcile?why=review&map=key.account_id=account,window_start=minute,revenue=total",
            r.base
        );
        call("POST", &url, Some("account,minute,total\na0,2026-11-01T00:00:00Z,1.50\n"))
    };
    let listed = |what: &str| -> usize {
        let body: Value = serde_json::from_str(&get(&format!("{}/v1/pipelines/paid/{what}", r.base))).unwrap();
        body[what].as_array().unwrap().len()
    };
    let entries = r.pages("/v1/audit?since=1").len();

    let kept = std::fs::read(&key).unwrap();
    std::fs::remove_file(&key).unwrap();
    let (code, body) = backfill();
    assert!(code >= 500, "{code} {body}");
    let (code, body) = reconcile();
    assert!(code >= 500, "{code} {body}");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!((listed("backfills"), listed("reconciliations")), (0, 0), "nothing was asked or kept");
    let changes = get(&format!("{}/v1/pipelines/paid/changes?since=0&limit=100000", r.base));
    assert!(!changes.contains("\"corrected\""), "nothing was published: {changes}");
    assert_eq!(r.pages("/v1/audit?since=1").len(), entries, "nothing was audited");

    // With the key back, both are done, each with its entry.
    std::fs::write(&key, &kept).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (code, body) = backfill();
    assert_eq!(code, 202, "{body}");
    let (code, body) = reconcile();
    assert_eq!(code, 200, "{body}");
    assert_eq!((listed("backfills"), listed("reconciliations")), (1, 1));
    let audit = r.pages("/v1/audit?since=1");
    let actions: Vec<&str> = audit[entries..].iter().filter_map(|e| e["action"].as_str()).collect();
    assert_eq!(actions, ["backfill", "reconcile"], "{audit:?}");
    assert!(audit.last().unwrap()["detail"]["reconciliation"].as_i64().is_some(), "{audit:?}");
}

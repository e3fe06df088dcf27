//! Hostile input on loopback, beside good traffic: slow and stalled
//! clients, idle connections, oversized bodies and lines, deeply nested
//! events, too many fields, long keys, malformed and non-UTF-8 lines, and
//! a spray of new keys past the contract's `[limits]`. Good producers post
//! the whole time. Every good request must succeed, good requests must
//! keep completing while the attack runs, every acknowledged event must be
//! in the log exactly once and counted, and every hostile event that got
//! in must be in the ledger as `over_limit`. The review's points 1 to 4
//! (issue 17) join the attack: bodies on public paths without a token,
//! lines that are not objects and requests past `max_events_per_request`,
//! bad `limit`s, and readers asking without pause for the ledger and
//! provenance. The second review (issue 42) joins too: a reconcile upload
//! of a 1 MiB column name and one of a million commas (finding 1), readers
//! asking for diffs without pause (finding 3), and an alert webhook that
//! answers with a redirect to another local port, which is never followed
//! (finding 5).

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{start, tokens_of, Scratch};

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

[window]
type = "tumbling"
size = "1h"
late = "discard"

[[aggregate]]
name = "n"
fn = "count"

[limits]
max_depth = 4
max_keys = 10

[alerts]
max_watermark_age = "1s"
"#;

const WEIR_TOML: &str = r#"
allow_private_webhooks = true
header_timeout = "1s"
body_timeout = "2s"
max_body_bytes = 65536
max_events_per_request = 50

[topics.payments]
partitions = 2
key = "acct"
max_event_bytes = 4096
max_depth = 8
max_fields = 200
max_key_bytes = 40
"#;

/// Every event's time: one window, which stays open for the whole test.
const T: &str = "2026-11-30T12:00:00.000Z";

fn event(id: &str, acct: &str, extra: &str) -> String {
    format!(r#"{{"id":"{id}","acct":"{acct}","t":"{T}"{extra}}}"#)
}

/// A raw HTTP/1.1 request on its own connection; the status and body.
fn raw(port: u16, request: &[u8]) -> (u16, String) {
    let mut sock = TcpStream::connect(("127.0.0.1", port)).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    // The server may answer and close before the whole request is written.
    let _ = sock.write_all(request);
    let mut out = Vec::new();
    let _ = sock.read_to_end(&mut out);
    let answer = String::from_utf8_lossy(&out).into_owned();
    let code = answer.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map_or(String::new(), |(_, b)| b.to_owned());
    (code, body)
}

fn get_request(token: &str, path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n").into_bytes()
}

fn post_request(token: &str, body: impl AsRef<[u8]>) -> Vec<u8> {
    let body = body.as_ref();
    let mut request = format!(
        "POST /v1/topics/payments/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    request
}

/// An export POSTed to `.../reconcile` (as the operator `token`).
fn reconcile_request(token: &str, body: &str) -> Vec<u8> {
    let path = "/v1/pipelines/paid/reconcile?why=hostile&map=key.acct=acct,window_start=hour,n=n";
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body.as_bytes());
    request
}

/// How long until the server closes `sock`, which sends what `send` gives
/// it every 200 ms (nothing when it gives `None`).
fn held_for(mut sock: TcpStream, mut send: impl FnMut(usize) -> Option<Vec<u8>>) -> Duration {
    let began = Instant::now();
    sock.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let mut buf = [0u8; 4096];
    for i in 0.. {
        if let Some(bytes) = send(i) {
            if sock.write_all(&bytes).is_err() {
                break;
            }
        }
        match sock.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
        if began.elapsed() > Duration::from_secs(30) {
            break;
        }
    }
    began.elapsed()
}

fn status(base: &str, token: &str) -> serde_json::Value {
    let url = format!("{base}/v1/pipelines/paid/status");
    let mut r = ureq::get(&url).header("authorization", format!("Bearer {token}")).call().unwrap();
    serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap()
}

#[test]
fn good_traffic_flows_and_nothing_acknowledged_is_lost_under_hostile_requests() {
    let s = Scratch::new("hostile");
    std::fs::create_dir_all(s.path("contracts")).unwrap();
    s.write("contracts/paid.toml", CONTRACT);
    // The alert webhook answers every delivery with a redirect to another local port.
    let (elsewhere, redirected) = common::listener();
    let hook = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hook_url = format!("http://{}/hook", hook.local_addr().unwrap());
    let deliveries = Arc::new(Mutex::new(0u32));
    let counted = deliveries.clone();
    std::thread::spawn(move || {
        for stream in hook.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
            if common::request(&mut reader).is_some() {
                *counted.lock().unwrap() += 1;
                let answer = format!(
                    "HTTP/1.1 302 Found\r\nlocation: {elsewhere}/stolen\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                );
                let _ = stream.write_all(answer.as_bytes());
            }
        }
    });
    s.write("weir.toml", &format!("alert_webhook = \"{hook_url}\"\n{WEIR_TOML}"));
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let base = format!("http://127.0.0.1:{port}");
    let _server = start(&s.0, port);
    let t = tokens_of(&s.path("data"));

    // Good producers: ten accounts, twenty events a request, until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let acked: Arc<Mutex<Vec<String>>> = Arc::default();
    let done_at: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let failures: Arc<Mutex<Vec<String>>> = Arc::default();
    let producers: Vec<_> = (0..2)
        .map(|p| {
            let (stop, acked, done_at, failures) = (stop.clone(), acked.clone(), done_at.clone(), failures.clone());
            let (url, token) = (format!("{base}/v1/topics/payments/events"), t.producer.clone());
            std::thread::spawn(move || {
                let agent: ureq::Agent = ureq::Agent::config_builder()
                    .max_idle_age(Duration::from_millis(300))
                    .http_status_as_error(false)
                    .build()
                    .into();
                let mut n = 0;
                while !stop.load(Ordering::SeqCst) {
                    let ids: Vec<String> = (0..20).map(|i| format!("g{p}-{}", n * 20 + i)).collect();
                    let body: String =
                        ids.iter().enumerate().map(|(i, id)| event(id, &format!("a{}", i % 10), "") + "\n").collect();
                    n += 1;
                    match agent.post(&url).header("authorization", format!("Bearer {token}")).send(&body) {
                        Ok(r) if r.status() == 200 => {
                            acked.lock().unwrap().extend(ids);
                            done_at.lock().unwrap().push(Instant::now());
                        }
                        Ok(mut r) => failures.lock().unwrap().push(format!(
                            "{}: {}",
                            r.status(),
                            r.body_mut().read_to_string().unwrap_or_default()
                        )),
                        Err(e) => failures.lock().unwrap().push(e.to_string()),
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        })
        .collect();
    // The ten good keys hold their windows before any hostile key arrives.
    let deadline = Instant::now() + Duration::from_secs(20);
    while status(&base, &t.reader)["events"]["counted"].as_u64().unwrap_or(0) < 10 {
        assert!(Instant::now() < deadline, "good traffic did not start: {:?}", failures.lock().unwrap());
        std::thread::sleep(Duration::from_millis(50));
    }

    let attack_began = Instant::now();
    // Slow and stalled clients, each on its own thread, all at once.
    let mut slow = Vec::new();
    for i in 0..10 {
        // A request head sent a few bytes at a time, never finished.
        slow.push(std::thread::spawn(move || {
            let sock = TcpStream::connect(("127.0.0.1", port)).unwrap();
            let head = format!("POST /v1/topics/payments/events HTTP/1.1\r\nHost: slow{i}\r\n");
            let mut chunks = head.into_bytes().chunks(3).map(<[u8]>::to_vec).collect::<Vec<_>>().into_iter();
            ("slow head", held_for(sock, |_| Some(chunks.next().unwrap_or_else(|| b"X-Pad: y\r\n".to_vec()))))
        }));
        // A connection that says nothing at all.
        slow.push(std::thread::spawn(move || {
            ("silent", held_for(TcpStream::connect(("127.0.0.1", port)).unwrap(), |_| None))
        }));
    }
    for _ in 0..4 {
        // A whole head with a token, then a body that stops halfway.
        let token = t.producer.clone();
        slow.push(std::thread::spawn(move || {
            let sock = TcpStream::connect(("127.0.0.1", port)).unwrap();
            let head = format!(
                "POST /v1/topics/payments/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Length: 10000\r\n\r\n{{\"id\":"
            );
            let mut first = Some(head.into_bytes());
            ("stalled body", held_for(sock, |_| first.take()))
        }));
        // A body trickled a byte at a time, forever.
        let token = t.producer.clone();
        slow.push(std::thread::spawn(move || {
            let sock = TcpStream::connect(("127.0.0.1", port)).unwrap();
            let head = format!(
                "POST /v1/topics/payments/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Length: 10000\r\n\r\n"
            );
            let mut first = Some(head.into_bytes());
            ("trickled body", held_for(sock, |_| Some(first.take().unwrap_or_else(|| b" ".to_vec()))))
        }));
    }

    // Readers asking for the ledger, a row's provenance and a diff (of the
    // one version with itself) without pause, from four connections: each
    // answered (200, or 404 for a row not yet published), never an error
    // of the server's.
    let reads_stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..4)
        .map(|r| {
            let (stop, token) = (reads_stop.clone(), t.reader.clone());
            let paths = [
                "/v1/pipelines/paid/ledger?limit=1000",
                "/v1/pipelines/paid/results/1/provenance",
                "/v1/pipelines/paid/diff?a=1&b=1",
            ];
            std::thread::spawn(move || {
                let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
                let (mut answered, mut i) = (Vec::new(), r);
                while !stop.load(Ordering::SeqCst) {
                    i += 1;
                    let url = format!("http://127.0.0.1:{port}{}", paths[i % paths.len()]);
                    match agent.get(&url).header("authorization", format!("Bearer {token}")).call() {
                        Ok(mut a) => {
                            let _ = a.body_mut().read_to_string();
                            answered.push(a.status().as_u16());
                        }
                        Err(e) => panic!("a reader's request failed: {e}"),
                    }
                }
                answered
            })
        })
        .collect();

    // Oversized, deep, wide, long-keyed and malformed requests: refused, each with its reason.
    let p = &t.producer;
    let deep = format!("{{\"id\":\"d\",\"acct\":\"a0\",\"t\":\"{T}\",\"x\":{}1{}}}", "[".repeat(100), "]".repeat(100));
    let wide = event("w", "a0", &(0..300).map(|i| format!(",\"f{i}\":{i}")).collect::<String>());
    let long_key = event("k", &"k".repeat(60), "");
    let long_line = event("l", "a0", &format!(",\"pad\":\"{}\"", "x".repeat(5000)));
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        ("nested 100 deep", post_request(p, deep + "\n"), 422, "max_depth = 8"),
        ("300 fields", post_request(p, wide + "\n"), 422, "max_fields = 200"),
        ("a 62-byte key", post_request(p, long_key + "\n"), 422, "max_key_bytes = 40"),
        ("a 5 KB line", post_request(p, long_line + "\n"), 413, "max_event_bytes = 4096"),
        ("not JSON", post_request(p, "{\"id\": oops}\n"), 400, "line 1 is not JSON"),
        ("not UTF-8", post_request(p, b"{\"id\":\"\xff\xfe\"}\n"), 400, "line 1 is not UTF-8"),
        (
            "a declared 1 MB body",
            format!("POST /v1/topics/payments/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {p}\r\nContent-Length: 1048576\r\n\r\n").into_bytes(),
            413,
            "max_body_bytes = 65536",
        ),
        (
            "a chunked 100 KB body",
            {
                let mut r = format!("POST /v1/topics/payments/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {p}\r\nTransfer-Encoding: chunked\r\n\r\n").into_bytes();
                for _ in 0..25 {
                    r.extend_from_slice(format!("1000\r\n{}\r\n", "x".repeat(4096)).as_bytes());
                }
                r.extend_from_slice(b"0\r\n\r\n");
                r
            },
            413,
            "max_body_bytes = 65536",
        ),
        (
            "a 64 MiB body on /healthz without a token",
            format!("POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 67108864\r\n\r\n{}", "x".repeat(4096)).into_bytes(),
            413,
            "takes no body",
        ),
        ("lines that are numbers", post_request(p, "1\n2\n"), 400, "line 1 is a number, not a JSON object"),
        (
            "60 events in one request",
            post_request(p, (0..60).map(|i| event(&format!("m{i}"), "a0", "") + "\n").collect::<String>()),
            413,
            "max_events_per_request = 50",
        ),
        ("limit=-1", get_request(&t.reader, "/v1/pipelines/paid/ledger?limit=-1"), 400, "from 1 to 100000"),
        ("limit=many", get_request(&t.reader, "/v1/pipelines/paid/changes?limit=many"), 400, "from 1 to 100000"),
        ("a 100 KB header", format!("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n", "y".repeat(100_000)).into_bytes(), 431, ""),
        ("a request line of garbage", b"\x16\x03\x01\x02\x00 garbage\r\n\r\n".to_vec(), 400, ""),
        // Issue 42, finding 1: a reconcile upload read in proportion, beside the traffic.
        ("a reconcile upload of a 1 MiB column name and 4,096 lines", reconcile_request(&t.operator, &{
            let mut wide = format!("{},acct,hour,n\n", "c".repeat(1 << 20));
            for i in 0..4096 {
                wide.push_str(&format!("x,r{i},2026-11-01T00:00:00Z,{i}\n"));
            }
            wide
        }), 200, "\"missing_in_weir\":4096"),
        ("a reconcile upload of a million commas", reconcile_request(&t.operator, &",".repeat(1 << 20)), 400, "the header has no column `acct`"),
    ];
    for (what, request, code, says) in cases {
        let (got, body) = raw(port, &request);
        assert_eq!(got, code, "{what}: {body}");
        assert!(body.contains(says), "{what}: {body}");
    }

    // Past the topic's limits but within the contract's: a depth of 6 and
    // twenty new keys are accepted, and go to the ledger as over_limit.
    let mut hostile_acked = 0;
    let nested = format!(",\"x\":{}1{}", "[".repeat(5), "]".repeat(5));
    let spray: String = (0..20).map(|i| event(&format!("s{i}"), &format!("spray{i}"), "") + "\n").collect();
    let deep_ok: String = (0..5).map(|i| event(&format!("n{i}"), "a1", &nested) + "\n").collect();
    for body in [spray, deep_ok] {
        let (code, answer) = raw(port, &post_request(p, &body));
        assert_eq!(code, 200, "{answer}");
        hostile_acked += body.lines().count() as u64;
    }

    // Every slow client was cut off, within its deadline and some slack.
    for handle in slow {
        let (what, held) = handle.join().unwrap();
        let limit = if what.contains("body") { 2 } else { 1 };
        assert!(
            held >= Duration::from_millis(limit * 1000 - 300) && held < Duration::from_secs(limit + 5),
            "{what} was held {held:?}, against a deadline of {limit}s"
        );
    }
    reads_stop.store(true, Ordering::SeqCst);
    for reader in readers {
        let answered = reader.join().unwrap();
        assert!(!answered.is_empty(), "a reader got no answer during the attack");
        assert!(answered.iter().all(|c| *c == 200 || *c == 404), "readers' answers: {answered:?}");
    }
    let attack_ended = Instant::now();
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::SeqCst);
    for producer in producers {
        producer.join().unwrap();
    }

    // Good traffic never failed, and went on while the attack ran.
    assert_eq!(*failures.lock().unwrap(), Vec::<String>::new(), "good requests failed");
    let during = done_at.lock().unwrap().iter().filter(|&&at| at > attack_began && at < attack_ended).count();
    assert!(during >= 10, "only {during} good requests completed during the attack");

    // Everything acknowledged is read, once; the good events count, the hostile ones are in the ledger.
    let acked = acked.lock().unwrap().clone();
    let total = acked.len() as u64 + hostile_acked;
    let deadline = Instant::now() + Duration::from_secs(30);
    let st = loop {
        let st = status(&base, &t.reader);
        if st["events"]["read"] == total {
            break st;
        }
        assert!(Instant::now() < deadline, "read {} of {total}", st["events"]["read"]);
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(st["events"]["counted"], acked.len() as u64, "{st}");
    assert_eq!(st["ledger"]["over_limit"], hostile_acked, "{st}");
    let mut in_log: HashMap<String, u32> = HashMap::new();
    for partition in 0..2 {
        let url = format!("{base}/v1/topics/payments/events?partition={partition}&limit=100000&why=hostile-test");
        let mut r = ureq::get(&url).header("authorization", format!("Bearer {}", t.raw_reader)).call().unwrap();
        for line in r.body_mut().with_config().limit(1 << 30).read_to_string().unwrap().lines() {
            let record: serde_json::Value = serde_json::from_str(line).unwrap();
            let id = record["event"]["id"].as_str().unwrap().to_owned();
            *in_log.entry(id).or_default() += 1;
        }
    }
    for id in &acked {
        assert_eq!(in_log.get(id), Some(&1), "acknowledged event {id} is not in the log exactly once");
    }
    assert_eq!(in_log.len() as u64, total, "the log holds only what was acknowledged");

    // The refusals are counted for operators.
    let url = format!("{base}/metrics");
    let mut r = ureq::get(&url).header("authorization", format!("Bearer {}", t.reader)).call().unwrap();
    let metrics = r.body_mut().read_to_string().unwrap();
    for line in [
        "weir_http_requests_denied_total{status=\"408\",reason=\"body_timeout\"} 8",
        "weir_http_requests_denied_total{status=\"413\",reason=\"body_too_large\"} 2",
        "weir_http_requests_denied_total{status=\"413\",reason=\"body_on_public_path\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} not in:\n{metrics}");
    }
    assert!(metrics.contains("reason=\"over_limit\"} 25"), "{metrics}");

    // The alert was delivered to its webhook, whose redirect was never followed.
    let deadline = Instant::now() + Duration::from_secs(30);
    while *deliveries.lock().unwrap() == 0 {
        assert!(Instant::now() < deadline, "the alert webhook was never called");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
    assert!(redirected.try_recv().is_err(), "a redirect of the alert webhook was followed");
}

//! The change feed (SPEC.md 7, issue 40), on both topologies: `weir tail`
//! follows a pipeline's changes as server-sent events through a candidate's
//! build, a promote and two kill -9 restarts of the server, and prints the
//! whole stream once, in order, with the promote's `version` entry; a long
//! poll (`wait=`) answers as soon as a change is published; a stream
//! resumed with `Last-Event-ID` goes on after it; past `max_followers` a
//! feed is refused with 503 and `Retry-After`.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::topology::{free_port, Topology};
use common::{authed, call, get, json_lines, start, Scratch};
use serde_json::Value;

const V1: &str = common::PAID;

/// Payments `from..from + n` over 20 accounts, a second apart from `start_s`.
fn payments(from: usize, n: usize, start_s: i64) -> Vec<String> {
    (from..from + n)
        .map(|i| {
            let at = weir_engine::time::format_rfc3339_ms(1_796_000_000_000 + (start_s + i as i64) * 1000);
            format!(
                r#"{{"payment_id":"p{i}","account_id":"acct-{:02}","amount":{}.25,"status":"approved","approved_at":"{at}"}}"#,
                i % 20,
                i % 50
            )
        })
        .collect()
}

fn post(base: &str, lines: &[String]) {
    let url = format!("{base}/v1/topics/payments/events");
    for chunk in lines.chunks(500) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let r = authed(common::agent().post(&url), "POST", &url).send(&(chunk.join("\n") + "\n"));
            if matches!(&r, Ok(r) if r.status().as_u16() == 200) {
                break;
            }
            assert!(Instant::now() < deadline, "the server did not take the events");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn caught_up(base: &str, version: u32) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let s: Value =
            serde_json::from_str(&get(&format!("{base}/v1/pipelines/paid/status?version={version}"))).unwrap();
        if s["partitions"].as_array().is_some_and(|p| p.len() == 2) && s["lag_records"] == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "version {version} did not catch up: {s}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `weir tail` as a reader, its printed lines gathered as they come.
struct Tail {
    child: std::process::Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Tail {
    fn start(base: &str, reader: &str) -> Tail {
        let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
            .env("WEIR_TOKEN", reader)
            .args(["tail", "paid", "--since", "1", "--url", base])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (out, into) = (child.stdout.take().unwrap(), Arc::clone(&lines));
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                into.lock().unwrap().push(line);
            }
        });
        Tail { child, lines }
    }

    fn seqs(&self) -> Vec<i64> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .map(|l| serde_json::from_str::<Value>(l).unwrap()["seq"].as_i64().unwrap())
            .collect()
    }
}

impl Drop for Tail {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn tail_follows_a_promote_and_restarts_without_a_gap_or_a_repeat() {
    for topology in Topology::both("feed") {
        let dir = Scratch::new("feed");
        let extra = "checkpoint_interval = \"50ms\"\nmax_followers = 2";
        let root = topology.folder(
            &dir,
            "server",
            &[("paid.toml", V1)],
            &topology.config(("payments", 2, "account_id"), extra),
        );
        let port = free_port();
        let base = format!("http://127.0.0.1:{port}");
        let mut server = start(&root, port);
        let tokens = common::tokens_of(&root.join("data"));

        // A long poll waits for the first change, and answers as soon as it is published.
        let poll = {
            let url = format!("{base}/v1/pipelines/paid/changes?since=1&wait=30s");
            std::thread::spawn(move || {
                let t = Instant::now();
                let (code, body) = call("GET", &url, None);
                (code, body, t.elapsed())
            })
        };
        std::thread::sleep(Duration::from_millis(500));
        let tail = Tail::start(&base, &tokens.reader);
        post(&base, &payments(0, 400, 0));
        let (code, body, took) = poll.join().unwrap();
        assert_eq!(code, 200, "{body}");
        assert!(
            !body.is_empty() && took < Duration::from_secs(25),
            "{}: answered after {took:?}: {body}",
            topology.name()
        );

        // Past max_followers (2: the tail, once it follows, and one more), a feed is refused.
        let deadline = Instant::now() + Duration::from_secs(30);
        while tail.seqs().is_empty() {
            assert!(Instant::now() < deadline, "{}: the tail printed nothing", topology.name());
            std::thread::sleep(Duration::from_millis(50));
        }
        let sse = |since: &str| {
            let url = format!("{base}/v1/pipelines/paid/changes?since={since}");
            authed(common::agent().get(&url), "GET", &url).header("accept", "text/event-stream")
        };
        let mut held = sse("1").header("last-event-id", "3").call().unwrap();
        assert_eq!(held.status().as_u16(), 200);
        let mut reader = BufReader::new(held.body_mut().as_reader());
        let mut first_id = String::new();
        while !first_id.starts_with("id:") {
            first_id.clear();
            reader.read_line(&mut first_id).unwrap();
        }
        assert_eq!(first_id.trim(), "id: 4", "{}: resumed after Last-Event-ID 3", topology.name());
        let refused = sse("1").call().unwrap();
        assert_eq!(refused.status().as_u16(), 503, "{}: a third feed", topology.name());
        assert_eq!(refused.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
        drop(reader);
        drop(held);

        // A candidate builds, is promoted; the server is killed twice on the way.
        drop(server); // SIGKILL
        std::fs::write(
            root.join("contracts/paid.toml"),
            V1.replace("version = 1", "version = 2").replace("\"1m\"", "\"2m\""),
        )
        .unwrap();
        server = start(&root, port);
        post(&base, &payments(400, 400, 400));
        caught_up(&base, 2);
        let (code, body) =
            call("POST", &format!("{base}/v1/pipelines/paid/promote"), Some(r#"{"version":2,"why":"feed test"}"#));
        assert_eq!(code, 200, "{body}");
        post(&base, &payments(800, 400, 800));
        drop(server); // SIGKILL
        server = start(&root, port);
        post(&base, &payments(1200, 200, 3600));
        caught_up(&base, 2);

        // The tail printed the whole stream once, in order. `caught_up` sees the
        // log read, not every change published yet, so the stream is read again
        // until the tail and the stream agree (a gap or a repeat never would).
        let deadline = Instant::now() + Duration::from_secs(60);
        let expected = loop {
            let stream = json_lines(&get(&format!("{base}/v1/pipelines/paid/changes?limit=100000")));
            let expected: Vec<i64> = stream.iter().map(|c| c["seq"].as_i64().unwrap()).collect();
            let printed = tail.seqs();
            if printed == expected && stream.iter().any(|c| c["type"] == "version") {
                std::thread::sleep(Duration::from_millis(500));
                let again = json_lines(&get(&format!("{base}/v1/pipelines/paid/changes?limit=100000")));
                if again.len() == stream.len() && tail.seqs() == expected {
                    break expected;
                }
                continue;
            }
            assert!(
                Instant::now() < deadline,
                "{}: every change once, in order, with the promote: the tail printed {} ({:?}..), the stream holds {} ({:?}..)",
                topology.name(),
                printed.len(),
                printed.iter().zip(&expected).position(|(a, b)| a != b),
                expected.len(),
                expected.first(),
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        assert_eq!(expected, (1..=expected.len() as i64).collect::<Vec<_>>(), "seq 1..n");
        drop(tail);
        drop(server);
    }
}

//! Contract versions end to end on the embedded log (SPEC.md 8): version 1
//! publishes; version 2 is added, built as a candidate from the retained
//! input while version 1 serves (a kill -9 during the build loses
//! nothing), diffed, promoted and rolled back. Throughout, version 1's rows
//! stay readable and equal `weir batch`, version 2's rows equal `weir
//! batch` of its contract, and a reader following `changes?since=` sees
//! every `seq` once, in order, with the promote and the rollback as
//! entries of their own. A contract changed without a version bump is
//! refused while the other pipeline runs; a changed comment is not a change.

mod common;

use std::time::{Duration, Instant};

use common::{call, get, json_lines, receiver, start, text, weir, weir_as, Scratch};
use serde_json::Value;

/// Version 1: revenue and payments per account per minute.
const V1: &str = common::PAID;

/// The other pipeline, which runs whatever happens to `paid`.
const OTHER: &str = r#"[pipeline]
name = "other"
version = 1
owner = "billing-ops"
steward = "data-platform"
decision = "Payments per account"

[source]
topic = "payments"
event_time = "approved_at"
key = ["account_id"]
max_delay = "5s"

[window]
type = "tumbling"
size = "5m"

[[aggregate]]
name = "payments"
fn = "count"
"#;

fn v2() -> String {
    V1.replace("version = 1", "version = 2").replace("size = \"1m\"", "size = \"2m\"")
}

/// `n` payments from `first` on: 20 accounts, half a second apart with up to
/// 3 s of disorder, one in ten declined, one in fifty sent twice.
fn payments(first: usize, n: usize) -> Vec<String> {
    let base = 1_793_491_200_000i64; // 2026-11-01T00:00:00Z
    let mut out = Vec::new();
    for i in first..first + n {
        let jitter = ((i * 7919) % 6000) as i64 - 3000;
        let at = weir_engine::time::format_rfc3339_ms(base + i as i64 * 500 + jitter);
        let status = if i % 10 == 3 { "declined" } else { "approved" };
        let line = format!(
            r#"{{"payment_id":"p{i}","account_id":"a{}","amount":"{}.50","status":"{status}","approved_at":"{at}"}}"#,
            i % 20,
            i % 97
        );
        if i % 50 == 0 {
            out.push(line.clone());
        }
        out.push(line);
    }
    out
}

fn post(base: &str, lines: &[String]) {
    for chunk in lines.chunks(500) {
        let url = format!("{base}/v1/topics/payments/events");
        let (code, body) = call("POST", &url, Some(&(chunk.join("\n") + "\n")));
        assert_eq!(code, 200, "{body}");
    }
}

fn status(base: &str, query: &str) -> Value {
    serde_json::from_str(&get(&format!("{base}/v1/pipelines/paid/status{query}"))).unwrap()
}

/// Waits until `query`'s version of `paid` has read `events` and checkpointed.
fn caught_up(base: &str, query: &str, events: u64) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let s = status(base, query);
        if s["events"]["read"] == events && s["lag_records"] == 0 && s["checkpoint_age_ms"].as_i64().is_some() {
            std::thread::sleep(Duration::from_millis(300));
            return;
        }
        assert!(Instant::now() < deadline, "{query} did not catch up to {events} events: {s}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A reader of the change stream: every entry once, `seq` 1, 2, 3, ... with no gap.
struct Follower {
    seen: Vec<Value>,
}

impl Follower {
    fn follow(&mut self, base: &str) {
        let since = self.seen.last().map_or(1, |v| v["seq"].as_i64().unwrap() + 1);
        for entry in json_lines(&get(&format!("{base}/v1/pipelines/paid/changes?since={since}&limit=100000"))) {
            let expected = self.seen.len() as i64 + 1;
            assert_eq!(entry["seq"].as_i64(), Some(expected), "a gap or a step back in the change stream: {entry}");
            self.seen.push(entry);
        }
    }
}

/// (key, window start, values) of settled rows with events, the flush's window left out.
fn values(rows: &[Value]) -> Vec<(String, String, String)> {
    let mut out: Vec<_> = rows
        .iter()
        .filter(|v| v["events"] != 0 && !v["key"]["account_id"].as_str().is_some_and(|a| a.starts_with("flush")))
        .map(|v| (v["key"].to_string(), v["window_start"].to_string(), v["values"].to_string()))
        .collect();
    out.sort();
    out
}

/// Asserts two row sets are equal, naming the rows only one has.
fn same_rows(got: &[Value], expected: &[Value], what: &str) {
    let (a, b) = (values(got), values(expected));
    let only_got: Vec<_> = a.iter().filter(|r| !b.contains(r)).take(5).collect();
    let only_expected: Vec<_> = b.iter().filter(|r| !a.contains(r)).take(5).collect();
    assert!(
        a == b,
        "{what}: {} rows against {}; only published: {only_got:?}; only expected: {only_expected:?}",
        a.len(),
        b.len()
    );
}

/// The next version notification of `event` the webhook got.
fn notified(notes: &std::sync::mpsc::Receiver<Value>, event: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let note = notes.recv_timeout(left).unwrap_or_else(|_| panic!("no {event} notification reached the webhook"));
        if note["status"] == "version" && note["event"] == event {
            return note;
        }
    }
}

fn batch(dir: &Scratch, contract: &str, input: &std::path::Path) -> Vec<Value> {
    let file = dir.write(&format!("batch-{}.toml", contract.len()), contract);
    let out = dir.path(&format!("batch-{}.jsonl", contract.len()));
    let b = weir(&[&"batch", &file, &"--input", &input, &"--output", &out]);
    assert!(b.status.success(), "{}", text(&b.stderr));
    json_lines(&std::fs::read_to_string(out).unwrap())
}

#[test]
fn versions_side_by_side_candidate_promote_rollback_and_a_refused_change() {
    let dir = Scratch::new("versions");
    std::fs::create_dir_all(dir.path("contracts")).unwrap();
    dir.write("contracts/paid.toml", V1);
    dir.write("contracts/other.toml", OTHER);
    let (hook, notes) = receiver();
    dir.write(
        "weir.toml",
        &format!("alert_webhook = \"{hook}\"\nallow_private_webhooks = true\n[topics.payments]\npartitions = 2\nkey = \"account_id\"\n"),
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let base = format!("http://127.0.0.1:{port}");
    let mut follower = Follower { seen: Vec::new() };

    // 1. Version 1 publishes.
    let first = payments(0, 3000);
    let mut server = start(&dir.0, port);
    post(&base, &first);
    caught_up(&base, "", first.len() as u64);
    follower.follow(&base);
    let v1_rows_before = json_lines(&get(&format!("{base}/v1/pipelines/paid/results?limit=100000")));
    assert!(!v1_rows_before.is_empty());
    assert!(follower.seen.iter().all(|r| r["version"] == 1));
    let versions = json_lines(&get(&format!("{base}/v1/pipelines/paid/versions")));
    assert_eq!(versions.len(), 1);
    assert_eq!((versions[0]["version"].clone(), versions[0]["state"].clone()), (1.into(), "live".into()));

    // 2. Version 2 is added: a candidate, built from the retained input; a kill -9 during the build.
    drop(server);
    dir.write("contracts/paid.toml", &v2());
    server = start(&dir.0, port);
    let deadline = Instant::now() + Duration::from_secs(30);
    while status(&base, "?version=2")["events"]["read"] == 0 {
        assert!(Instant::now() < deadline, "the candidate never started reading");
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(server); // SIGKILL
    server = start(&dir.0, port);
    let versions = json_lines(&get(&format!("{base}/v1/pipelines/paid/versions")));
    let states: Vec<(Value, Value)> = versions.iter().map(|v| (v["version"].clone(), v["state"].clone())).collect();
    assert_eq!(states, [(1.into(), "live".into()), (2.into(), "candidate".into())]);
    // Version 1 keeps serving, its rows as they were.
    let v1_rows = json_lines(&get(&format!("{base}/v1/pipelines/paid/results?limit=100000")));
    assert_eq!(values(&v1_rows), values(&v1_rows_before), "the candidate moved version 1's rows");

    // 3. More events and a flush: both versions settle every window.
    let mut second = payments(3000, 3000);
    // A far-future event on every partition (keys spread over both) settles every window.
    for k in 0..8 {
        second.push(format!(
            r#"{{"payment_id":"flush{k}","account_id":"flush{k}","amount":"0","status":"approved","approved_at":"{}"}}"#,
            weir_engine::time::format_rfc3339_ms(1_798_761_600_000) // 2027-01-01
        ));
    }
    post(&base, &second);
    let total = (first.len() + second.len()) as u64;
    caught_up(&base, "?version=1", total);
    caught_up(&base, "?version=2", total);
    follower.follow(&base);
    let input = dir.write("all.jsonl", &(first.iter().chain(&second).cloned().collect::<Vec<_>>().join("\n") + "\n"));
    let v1 = json_lines(&get(&format!("{base}/v1/pipelines/paid/results?version=1&limit=100000")));
    let v2_rows = json_lines(&get(&format!("{base}/v1/pipelines/paid/results?version=2&limit=100000")));
    same_rows(&v1, &batch(&dir, V1, &input), "version 1 against its batch");
    same_rows(&v2_rows, &batch(&dir, &v2(), &input), "version 2 against its batch");
    assert!(v2_rows.iter().all(|r| r["version"] == 2) && v1.iter().all(|r| r["version"] == 1));
    // Each version's own change stream: no revision twice, none skipped.
    for v in [1, 2] {
        let mut last = std::collections::BTreeMap::new();
        for r in json_lines(&get(&format!("{base}/v1/pipelines/paid/changes?version={v}&limit=100000"))) {
            assert_eq!(r["version"], v, "{r}");
            let rev = r["revision"].as_u64().unwrap();
            let prev = last.insert((r["key"].to_string(), r["window_start"].to_string()), rev).unwrap_or(0);
            assert_eq!(prev + 1, rev, "version {v}: revision out of order: {r}");
        }
    }
    let ledger2 = json_lines(&get(&format!("{base}/v1/pipelines/paid/ledger?version=2&limit=100000")));
    assert!(!ledger2.is_empty() && ledger2.iter().all(|e| e["version"] == 2), "version 2's duplicates are its own");

    // The owner and steward were told the candidate caught up, with the diff's summary.
    let ready = notified(&notes, "candidate_ready");
    assert_eq!(
        (ready["from"].clone(), ready["to"].clone(), ready["owner"].clone()),
        (1.into(), 2.into(), "billing-ops".into())
    );
    assert!(
        ready["diff"]["windows"]["only_in_b"].is_u64() && ready["diff"]["totals"]["revenue"].is_object(),
        "{ready}"
    );

    // 4. The diff, over HTTP and from the command line.
    let diff: Value = serde_json::from_str(&get(&format!("{base}/v1/pipelines/paid/diff?a=1&b=2"))).unwrap();
    assert_eq!((diff["a"].clone(), diff["b"].clone()), (1.into(), 2.into()));
    let w = &diff["windows"];
    assert!(w["only_in_a"].as_u64() > Some(0) && w["only_in_b"].as_u64() > Some(0), "1 m and 2 m windows: {diff}");
    assert!(diff["totals"]["revenue"]["a"].is_string() && diff["totals"]["payments"]["b"].is_string(), "{diff}");
    let t = common::tokens_of(&dir.path("data"));
    let cli = weir_as(&t.reader, &[&"diff", &"paid", &"1", &"2", &"--url", &base]);
    assert!(cli.status.success(), "{}", text(&cli.stderr));
    let screen = text(&cli.stdout);
    assert!(screen.contains("paid version 1 against version 2") && screen.contains("revenue:"), "{screen}");
    let cli = weir_as(&t.reader, &[&"diff", &"paid", &"1", &"2", &"--url", &base, &"--format", &"json"]);
    let as_json: Value = serde_json::from_str(&text(&cli.stdout)).unwrap();
    assert_eq!(as_json["windows"], diff["windows"]);

    // 5. Promote (a reader may not; an operator may, with why), then roll back.
    let refused = weir_as(&t.reader, &[&"promote", &"paid", &"2", &"--why", &"try", &"--url", &base]);
    assert!(!refused.status.success());
    let promoted = weir_as(&t.operator, &[&"promote", &"paid", &"2", &"--why", &"2-minute windows", &"--url", &base]);
    assert!(promoted.status.success(), "{}", text(&promoted.stderr));
    let defaults = json_lines(&get(&format!("{base}/v1/pipelines/paid/results?limit=100000")));
    assert_eq!(values(&defaults), values(&v2_rows), "readers' default is the promoted version");
    assert_eq!(status(&base, "")["version"], 2);
    let again = call("POST", &format!("{base}/v1/pipelines/paid/promote"), Some(r#"{"version":2,"why":"again"}"#));
    assert_eq!(again.0, 409, "{}", again.1);
    follower.follow(&base);
    let marker = follower.seen.last().unwrap().clone();
    assert_eq!(
        (marker["type"].clone(), marker["from"].clone(), marker["to"].clone()),
        ("version".into(), 1.into(), 2.into())
    );
    assert_eq!(marker["why"], "2-minute windows");
    let told = notified(&notes, "promote");
    assert_eq!((told["to"].clone(), told["steward"].clone()), (2.into(), "data-platform".into()));
    assert!(told["diff"]["windows"].is_object(), "{told}");
    let rolled =
        call("POST", &format!("{base}/v1/pipelines/paid/rollback"), Some(r#"{"why":"back to 1-minute windows"}"#));
    assert_eq!(rolled.0, 200, "{}", rolled.1);
    follower.follow(&base);
    let marker = follower.seen.last().unwrap();
    assert_eq!((marker["from"].clone(), marker["to"].clone()), (2.into(), 1.into()));
    let versions = json_lines(&get(&format!("{base}/v1/pipelines/paid/versions")));
    let states: Vec<(Value, Value)> = versions.iter().map(|v| (v["version"].clone(), v["state"].clone())).collect();
    assert_eq!(states, [(1.into(), "live".into()), (2.into(), "superseded".into())]);
    assert!(versions[1]["promoted_by"].is_string() && versions[1]["promoted"].is_string(), "{versions:?}");
    // Version 1's rows were readable all along, and are the default again.
    let defaults = json_lines(&get(&format!("{base}/v1/pipelines/paid/results?limit=100000")));
    assert_eq!(values(&defaults), values(&v1));
    let audit = get(&format!("{base}/v1/audit?limit=1000"));
    assert!(audit.contains("\"promote\"") && audit.contains("\"rollback\"") && audit.contains("2-minute windows"));
    // The follower saw every entry once: the whole stream again, from 1.
    let whole = json_lines(&get(&format!("{base}/v1/pipelines/paid/changes?since=1&limit=100000")));
    assert_eq!(whole, follower.seen);

    // 6. Version 1's contract changed without a bump: refused, the other pipeline runs on.
    drop(server);
    dir.write("contracts/paid.toml", &V1.replace("allowed_lateness = \"2m\"", "allowed_lateness = \"3m\""));
    server = start(&dir.0, port);
    let s = status(&base, "");
    let failed = s["failed"].as_str().unwrap_or_default().to_owned();
    assert!(failed.contains("without a version bump") && failed.contains("version = 3"), "{s}");
    let (code, ready) = call("GET", &format!("{base}/readyz"), None);
    assert!(code == 503 && ready.contains("does not run"), "an admin is told why: {code} {ready}");
    let mut anyone = common::agent().get(format!("{base}/readyz")).call().unwrap();
    let said = anyone.body_mut().read_to_string().unwrap();
    assert_eq!(anyone.status().as_u16(), 503);
    assert!(!said.contains("paid") && !said.contains("bump"), "no names or errors without a token: {said}");
    let more = payments(6000, 10);
    post(&base, &more);
    let total = total + more.len() as u64;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let other: Value = serde_json::from_str(&get(&format!("{base}/v1/pipelines/other/status"))).unwrap();
        if other["events"]["read"] == total {
            break;
        }
        assert!(Instant::now() < deadline, "the other pipeline stopped: {other}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(status(&base, "")["events"]["read"], 0, "the refused pipeline does not run");

    // 7. A changed comment or layout is not a change.
    drop(server);
    let reworded =
        V1.replace("[window]", "# windows of one minute\n[window]").replace("size = \"1m\"", "size   =   '1m'");
    dir.write("contracts/paid.toml", &reworded);
    let _server = start(&dir.0, port);
    caught_up(&base, "", total);
    assert!(status(&base, "")["failed"].is_null());
}

/// Rows each version is given for the flood.
const FLOOD_ROWS: i64 = 1_000_000;

/// Fills version 1 and 2 of `paid` with `FLOOD_ROWS` windows each, made
/// from the row of account `a0` each version published: the same
/// window for accounts `s1`, `s2`, ..., each of version 2's tenth windows
/// with another payments count. The rows go in as the store keeps them
/// (as a row from before `latest` named rows by `seq`: with its text,
/// since the change stream has no such rows).
fn flood(topology: &common::topology::Topology, data: &std::path::Path) {
    let row = r#"replace(row, '"a0"', '"s' || i || '"')"#;
    let differ = format!(
        r#"CASE WHEN version = 2 AND i % 10 = 0 THEN replace({row}, '"payments":1', '"payments":2') ELSE {row} END"#
    );
    match topology {
        common::topology::Topology::Embedded => {
            let db = rusqlite::Connection::open(data.join("weir.db")).unwrap();
            let rows: Vec<String> = db
                .prepare("SELECT row FROM results WHERE pipeline = 'paid' AND row LIKE '%\"a0\"%' ORDER BY version")
                .unwrap()
                .query_map([], |r| r.get(0))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            assert_eq!(rows.len(), 2, "one window each: {rows:?}");
            assert!(rows.iter().all(|r| r.contains(r#""a0""#) && r.contains(r#""payments":1"#)), "{rows:?}");
            db.execute_batch(&format!(
                "INSERT INTO latest (pipeline, version, key, window_start, window_end, status, revision, row)
                 WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {FLOOD_ROWS})
                 SELECT pipeline, version, CAST(printf('k%08d', i) AS BLOB), window_start, window_end, status, revision, {differ}
                   FROM n, (SELECT * FROM results WHERE pipeline = 'paid' AND row LIKE '%\"a0\"%')"
            ))
            .unwrap();
        }
        common::topology::Topology::Kafka(_, schema) => {
            let mut db = postgres::Client::connect(&common::topology::postgres_url(), postgres::NoTls).unwrap();
            let s = &schema.0;
            let rows = db
                .query(&format!("SELECT row FROM {s}.results WHERE pipeline = 'paid' AND row LIKE '%\"a0\"%'"), &[])
                .unwrap();
            assert_eq!(rows.len(), 2, "one window each");
            db.batch_execute(&format!(
                "INSERT INTO {s}.latest (pipeline, version, key, window_start, window_end, status, revision, row)
                 SELECT pipeline, version, convert_to('k' || lpad(i::text, 8, '0'), 'UTF8'), window_start, window_end,
                        status, revision, {differ}
                   FROM generate_series(1, {FLOOD_ROWS}) AS i,
                        (SELECT * FROM {s}.results WHERE pipeline = 'paid' AND row LIKE '%\"a0\"%') t"
            ))
            .unwrap();
        }
    }
}

/// Issue 42, finding 3: a diff reads both versions a page at a time, and a
/// notification's diff is written off the alert loop. Two versions of a
/// million windows each, four diffs at once and a candidate's announcement
/// beside them: the server stays under 300 MB, every diff is whole, and an
/// alert of another pipeline is sent on time.
#[test]
fn review_2_point_3_four_diffs_of_two_versions_of_a_million_rows_stay_bounded_and_alerts_keep_time() {
    let dir = Scratch::new("diff-flood");
    for topology in common::topology::Topology::both("diff_flood") {
        let (hook, notes) = receiver();
        let extra = format!(
            "alert_webhook = \"{hook}\"\nallow_private_webhooks = true\n[topics.refunds]\npartitions = 1\nkey = \"account_id\"\n"
        );
        let config = topology.config(("payments", 2, "account_id"), &extra);
        let root = topology.folder(
            &dir,
            topology.name(),
            &[("paid.toml", V1), ("refunds.toml", &common::refunds("refunds", "1h"))],
            &config,
        );
        // One payment, and later ones on every partition that close its window.
        let (server, base) = topology.serve(&root);
        let mut first = payments(0, 1);
        for k in 0..8 {
            first.push(format!(
                r#"{{"payment_id":"flush{k}","account_id":"flush{k}","amount":"0","status":"approved","approved_at":"2027-01-01T00:00:00Z"}}"#
            ));
        }
        post(&base, &first);
        caught_up(&base, "", first.len() as u64);
        drop(server);
        // Version 2, built over them: the same windows.
        let v2 =
            V1.replace("version = 1", "version = 2").replace("allowed_lateness = \"2m\"", "allowed_lateness = \"3m\"");
        std::fs::write(root.join("contracts/paid.toml"), &v2).unwrap();
        let (server, base) = topology.serve(&root);
        caught_up(&base, "?version=2", first.len() as u64);
        drop(server);
        flood(&topology, &root.join("data"));

        // Restarted: the candidate is announced again, with a diff of the flood.
        let (server, base) = topology.serve(&root);
        let started = Instant::now();
        let diffs: Vec<_> = (0..4)
            .map(|_| {
                let url = format!("{base}/v1/pipelines/paid/diff?a=1&b=2");
                std::thread::spawn(move || {
                    let (code, body) = common::get_within(&url, Duration::from_secs(600));
                    (code, body, started.elapsed())
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(500));
        let refund = r#"{"account_id":"a1","at":"2026-11-01T00:00:00Z"}"#;
        let (code, body) = call("POST", &format!("{base}/v1/topics/refunds/events"), Some(refund));
        assert_eq!(code, 200, "{body}");
        let posted = Instant::now();
        let (mut fired, mut ready) = (None, None);
        while fired.is_none() || ready.is_none() {
            let note = notes
                .recv_timeout(Duration::from_secs(120))
                .unwrap_or_else(|_| panic!("{}: no alert or announcement ({fired:?}, {ready:?})", topology.name()));
            if note["pipeline"] == "refunds" && note["status"] == "firing" && fired.is_none() {
                fired = Some(posted.elapsed());
            }
            if note["event"] == "candidate_ready" {
                ready = Some(note);
            }
        }
        let fired = fired.unwrap_or_default();
        // a0's window matches too (the later ones' are open, so unpublished).
        let expected = (FLOOD_ROWS as u64 * 9 / 10 + 1, FLOOD_ROWS as u64 / 10);
        let ready = ready.unwrap_or_default();
        let w = &ready["diff"]["windows"];
        assert_eq!((w["matched"].as_u64(), w["differing"].as_u64()), (Some(expected.0), Some(expected.1)), "{ready}");
        let mut took = Vec::new();
        for d in diffs {
            let (code, body, elapsed) = d.join().unwrap();
            assert_eq!(code, 200, "{}: {body}", topology.name());
            let diff: Value = serde_json::from_str(&body).unwrap();
            let w = &diff["windows"];
            assert_eq!(
                (w["matched"].as_u64(), w["differing"].as_u64()),
                (Some(expected.0), Some(expected.1)),
                "{diff}"
            );
            assert_eq!((w["only_in_a"].as_u64(), w["only_in_b"].as_u64()), (Some(0), Some(0)), "{diff}");
            let payments = &diff["totals"]["payments"];
            assert_eq!((payments["a"].as_str(), payments["b"].as_str()), (Some("1000001"), Some("1100001")), "{diff}");
            assert_eq!(diff["largest_differences"].as_array().map(Vec::len), Some(crate::LARGEST), "{diff}");
            took.push(elapsed);
        }
        let status = std::fs::read_to_string(format!("/proc/{}/status", server.child.id())).unwrap();
        let peak: u64 = status
            .lines()
            .find(|l| l.starts_with("VmHWM:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse().ok())
            .unwrap();
        eprintln!(
            "{}: diffs took {took:?}; the alert fired {fired:?} after its event; peak {peak} KiB",
            topology.name()
        );
        assert!(peak < 300 << 10, "{}: peak resident memory {peak} KiB", topology.name());
        assert!(fired < Duration::from_secs(5), "{}: the alert took {fired:?}", topology.name());
    }
}

/// The largest differences a diff lists.
const LARGEST: usize = 20;

//! `weir serve` workers on a real Kafka-API broker (`tansu`, started here
//! on a free port with in-memory storage; `WEIR_TANSU` names the binary,
//! `scripts/test` installs it) and the machine's PostgreSQL
//! (`WEIR_TEST_POSTGRES`): two workers share a 4-partition topic through
//! the consumer group; when one is killed with SIGKILL the survivor takes
//! its partitions over; a frozen worker (SIGSTOP) that wakes up after losing
//! its partitions is refused by the fence; a worker that stops hands its
//! partitions to the other; a lone worker killed with SIGKILL resumes from
//! its Postgres checkpoints; everything restarts; and each time the rows in
//! Postgres equal `weir batch` over every event produced, with no revision
//! going back. The contract takes corrections (`on_conflict = "correct"`):
//! the stream carries later versions of earlier payments, with another
//! amount or void (a deletion). Pause, resume, replay and annotations
//! asked of one worker act on every worker's partitions.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::topology::{free_port, postgres_url, Broker, Schema};
use common::{authed, start, text, weir, Scratch, Server};
use serde_json::Value;

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
where = 'status == "ok"'
max_delay = "5s"

[window]
type = "tumbling"
size = "1m"
allowed_lateness = "1h"
late = "revise"
early = true

[dedup]
horizon = "2h"
on_conflict = "correct"

[[aggregate]]
name = "total"
fn = "sum"
field = "amount"

[[aggregate]]
name = "payments"
fn = "count"
"#;

/// A worker's folder: the shared contract and weir.toml, its own data.
fn worker_root(s: &Scratch, name: &str, broker: &Broker, schema: &Schema) -> PathBuf {
    let root = s.path(name);
    std::fs::create_dir_all(root.join("contracts")).unwrap();
    std::fs::write(root.join("contracts/paid.toml"), CONTRACT).unwrap();
    let config = format!(
        "[topics.payments]\npartitions = 4\nkey = \"acct\"\n\n[kafka]\nbrokers = \"{}\"\n[kafka.config]\n\"session.timeout.ms\" = \"6000\"\n\"heartbeat.interval.ms\" = \"500\"\n\n[postgres]\nurl = \"{}\"\nschema = \"{}\"\n",
        broker.url,
        postgres_url(),
        schema.0
    );
    std::fs::write(root.join("weir.toml"), config).unwrap();
    root
}

struct Worker {
    server: Server,
    base: String,
}

fn worker(root: &Path) -> Worker {
    let port = free_port();
    Worker { server: start(root, port), base: format!("http://127.0.0.1:{port}") }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).build().into()
}

/// A GET's status and body, every page of it (following `Weir-Next`).
fn get(url: &str) -> (u16, String) {
    let (code, mut body, mut next) = common::get_page(url);
    let origin = url.find("/v1/").map_or(url, |at| &url[..at]).to_owned();
    while let Some(path) = next.take().filter(|_| code == 200) {
        let (_, more, after) = common::get_page(&format!("{origin}{path}"));
        body.push_str(&more);
        next = after;
    }
    (code, body)
}

fn status(w: &Worker) -> Value {
    serde_json::from_str(&get(&format!("{}/v1/pipelines/paid/status", w.base)).1).unwrap()
}

fn held(w: &Worker) -> Vec<u64> {
    let s = status(w);
    s["partitions"].as_array().map_or_else(Vec::new, |a| a.iter().map(|p| p["partition"].as_u64().unwrap()).collect())
}

/// Waits until the workers hold all four partitions between them, each as many as `counts`.
fn wait_held(workers: &[&Worker], counts: &[usize]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got: Vec<Vec<u64>> = workers.iter().map(|w| held(w)).collect();
        let mut all: Vec<u64> = got.iter().flatten().copied().collect();
        all.sort_unstable();
        if all == [0, 1, 2, 3] && got.iter().map(Vec::len).eq(counts.iter().copied()) {
            return;
        }
        assert!(Instant::now() < deadline, "partitions held: {got:?}, expected counts {counts:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Events `from..to`: 20 accounts, times one second apart with some
/// disorder, every 25th sent twice (the same payload); after every 40th, a
/// later version of the one 13 before it with another amount, and after
/// every 70th, a void version of the one 29 before it.
fn events(from: u32, to: u32) -> Vec<String> {
    let payment = |i: u32, cents: u32, status: &str| {
        let t =
            weir_engine::time::format_rfc3339_ms(1_764_374_400_000 + i64::from(i) * 1_000 - i64::from(i % 7) * 3_000);
        let acct = i % 20;
        format!(
            r#"{{"id":"p{i}","acct":"a{acct}","t":"{t}","amount":{}.{:02},"status":"{status}"}}"#,
            cents / 100,
            cents % 100
        )
    };
    let mut out = Vec::new();
    for i in from..to {
        let line = payment(i, (i % 9) * 100 + i % 100, "ok");
        if i % 25 == 0 {
            out.push(line.clone());
        }
        out.push(line);
        if i >= 40 && i % 40 == 0 {
            out.push(payment(i - 13, 777, "ok"));
        }
        if i >= 70 && i % 70 == 0 {
            out.push(payment(i - 29, 0, "void"));
        }
    }
    out
}

/// `weir produce --kafka`: straight to the broker, whichever workers run.
fn produce(s: &Scratch, broker: &Broker, lines: &[String]) -> std::process::Child {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let file = s.write(
        &format!("produce-{}.jsonl", N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)),
        &(lines.join("\n") + "\n"),
    );
    Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["produce", "--topic", "payments", "--kafka", &broker.url, "--key", "acct", "--batch", "100"])
        .arg(file)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn produced_ok(child: std::process::Child) {
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "weir produce: {}", text(&out.stderr));
}

/// Waits until the workers together have read everything the topic holds.
fn wait_caught_up(workers: &[&Worker], total: u64) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let statuses: Vec<Value> = workers.iter().map(|w| status(w)).collect();
        let ends: u64 = statuses
            .iter()
            .flat_map(|s| s["partitions"].as_array().cloned().unwrap_or_default())
            .map(|p| p["next_offset"].as_u64().unwrap_or(0))
            .sum();
        let lag: u64 = statuses.iter().map(|s| s["lag_records"].as_u64().unwrap_or(0)).sum();
        if ends == total && lag == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "not caught up to {total}: {statuses:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn identity(v: &Value) -> (String, String, String) {
    (v["key"].to_string(), v["window_start"].to_string(), v["values"].to_string())
}

/// The rows Postgres holds now, against `weir batch` over `lines`; and the
/// change stream: `seq` 1.. in order, each window's revisions going up.
fn check_against_batch(s: &Scratch, w: &Worker, lines: &[String]) {
    check_against_batch_ledgered(s, w, lines, 1);
}

/// As [`check_against_batch`], with every event ledgered `times` times
/// (a replay ledgers again what it reads again).
fn check_against_batch_ledgered(s: &Scratch, w: &Worker, lines: &[String], times: usize) {
    let input = s.write("all.jsonl", &(lines.join("\n") + "\n"));
    let contract = s.write("paid.toml", CONTRACT);
    let out = s.path("batch.jsonl");
    let batch = weir(&[&"batch", &contract, &"--input", &input, &"--output", &out]);
    assert!(batch.status.success(), "{}", text(&batch.stderr));
    let mut expected: Vec<_> =
        std::fs::read_to_string(&out).unwrap().lines().map(|l| identity(&serde_json::from_str(l).unwrap())).collect();
    expected.sort();
    let (code, body) = get(&format!("{}/v1/pipelines/paid/results", w.base));
    assert_eq!(code, 200, "{body}");
    let mut current: Vec<_> = body
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["events"] != 0)
        .map(|v| identity(&v))
        .collect();
    current.sort();
    assert_eq!(current.len(), expected.len(), "windows in Postgres vs the batch");
    assert_eq!(current, expected, "rows in Postgres equal weir batch over every event produced");
    // Every correction and deletion superseded one version, once (nothing is too late here).
    let ledger = s.path("ledger.jsonl");
    let run = weir(&[&"run", &contract, &"--input", &input, &"--output", &"/dev/null", &"--ledger", &ledger]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    let superseded = std::fs::read_to_string(&ledger).unwrap().matches("\"superseded\"").count();
    assert!(superseded > 0);
    let (_, body) = get(&format!("{}/v1/pipelines/paid/ledger?reason=superseded&limit=100000", w.base));
    assert_eq!(body.lines().count(), superseded * times, "superseded versions in Postgres");
    let (_, body) = get(&format!("{}/v1/pipelines/paid/changes?limit=100000", w.base));
    let mut last: BTreeMap<(String, String), u64> = BTreeMap::new();
    for (i, l) in body.lines().enumerate() {
        let v: Value = serde_json::from_str(l).unwrap();
        assert_eq!(v["seq"], i as u64 + 1, "seq in commit order without gaps");
        let rev = v["revision"].as_u64().unwrap();
        let key = (v["key"].to_string(), v["window_start"].to_string());
        let before = last.insert(key, rev).unwrap_or(0);
        assert!(rev > before, "a revision went back or repeated: {before} then {l}");
    }
}

fn sigterm(w: Worker) {
    let mut server = w.server;
    let _ = Command::new("kill").arg("-TERM").arg(server.child.id().to_string()).status();
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "weir serve did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sends `signal` (`KILL`, `STOP`, `CONT`) to a worker's process.
fn signal(w: &Worker, signal: &str) {
    let status = Command::new("kill").arg(format!("-{signal}")).arg(w.server.child.id().to_string()).status().unwrap();
    assert!(status.success(), "kill -{signal}");
}

/// Waits until a worker's checkpoints were refused by the fence at least once.
fn wait_fenced(w: &Worker) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let st = status(w);
        if st["checkpoints_fenced"].as_u64() > Some(0) {
            return st;
        }
        assert!(Instant::now() < deadline, "the zombie's checkpoints were not refused: {st}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn workers_share_partitions_survive_a_kill_fence_a_zombie_hand_over_and_restart_without_counting_twice() {
    let broker = Broker::start();
    let schema = Schema::new("workers");
    let s = Scratch::new("kafka-workers");
    let (root_a, root_b) = (worker_root(&s, "a", &broker, &schema), worker_root(&s, "b", &broker, &schema));

    // Two workers in one group split the four partitions. (A joins first,
    // so A leads the group: see docs/kafka-postgres.md on tansu.)
    let a = worker(&root_a);
    wait_held(&[&a], &[4]);
    let b = worker(&root_b);
    wait_held(&[&a, &b], &[2, 2]);
    let mut produced = events(0, 1_500);
    produced_ok(produce(&s, &broker, &produced));
    wait_caught_up(&[&a, &b], produced.len() as u64);
    check_against_batch(&s, &a, &produced);

    // B is killed with SIGKILL mid-stream: when its session expires, A takes
    // its partitions over from their Postgres checkpoints.
    let more = events(1_500, 3_000);
    let producing = produce(&s, &broker, &more);
    std::thread::sleep(Duration::from_millis(300));
    signal(&b, "KILL");
    drop(b);
    produced_ok(producing);
    produced.extend(more);
    wait_held(&[&a], &[4]);
    wait_caught_up(&[&a], produced.len() as u64);
    check_against_batch(&s, &a, &produced);

    // B comes back and gets two partitions; then it freezes (SIGSTOP) mid-
    // stream, A takes them over, and B wakes up a zombie: its checkpoints are
    // refused by the fence and its uncommitted work is dropped.
    let b = worker(&root_b);
    wait_held(&[&a, &b], &[2, 2]);
    let more = events(3_000, 4_000);
    let producing = produce(&s, &broker, &more);
    std::thread::sleep(Duration::from_millis(300));
    signal(&b, "STOP");
    produced_ok(producing);
    produced.extend(more);
    wait_held(&[&a], &[4]);
    wait_caught_up(&[&a], produced.len() as u64);
    check_against_batch(&s, &a, &produced);
    signal(&b, "CONT");
    let zombie = wait_fenced(&b);
    eprintln!("the zombie: {zombie}");
    check_against_batch(&s, &a, &produced);
    wait_held(&[&a, &b], &[2, 2]);
    let more = events(4_000, 4_500);
    produced_ok(produce(&s, &broker, &more));
    produced.extend(more);
    wait_caught_up(&[&a, &b], produced.len() as u64);
    check_against_batch(&s, &b, &produced);

    // B stops (SIGTERM) mid-stream: it checkpoints and hands its partitions to A.
    let more = events(4_500, 5_500);
    let producing = produce(&s, &broker, &more);
    std::thread::sleep(Duration::from_millis(300));
    sigterm(b);
    produced_ok(producing);
    produced.extend(more);
    wait_held(&[&a], &[4]);
    wait_caught_up(&[&a], produced.len() as u64);
    check_against_batch(&s, &a, &produced);

    // A, alone, is killed with SIGKILL mid-stream, and comes back from its checkpoints.
    let more = events(5_500, 6_500);
    let producing = produce(&s, &broker, &more);
    std::thread::sleep(Duration::from_millis(300));
    drop(a);
    produced_ok(producing);
    produced.extend(more);
    let a = worker(&root_a);
    wait_held(&[&a], &[4]);
    wait_caught_up(&[&a], produced.len() as u64);
    check_against_batch(&s, &a, &produced);

    // Everything stops and starts again: nothing is counted twice.
    sigterm(a);
    let a = worker(&root_a);
    wait_held(&[&a], &[4]);
    let more = events(6_500, 7_000);
    produced_ok(produce(&s, &broker, &more));
    produced.extend(more);
    wait_caught_up(&[&a], produced.len() as u64);
    check_against_batch(&s, &a, &produced);
    let st = status(&a);
    assert!(st["partitions"].as_array().unwrap().iter().all(|p| p["generation"].as_i64() >= Some(3)), "{st}");
    assert_eq!(st["offsets_not_delivered"], 0, "{st}");
    check_provenance(&broker, &a);
    let (_, dashboard) = get(&format!("{}/v1/dashboard", a.base));
    let dashboard: Value = serde_json::from_str(&dashboard).unwrap();
    assert_eq!(dashboard["pipelines"][0]["rows"].as_array().map(Vec::len), Some(20), "the dashboard reads Postgres");
}

fn post(url: &str, body: &str) -> (u16, String) {
    let mut r = authed(agent().post(url), "POST", url).header("content-type", "application/json").send(body).unwrap();
    (r.status().as_u16(), r.body_mut().read_to_string().unwrap())
}

/// The rows `/results` and `/changes` of a worker show now.
fn published(w: &Worker) -> (String, usize) {
    let (_, results) = get(&format!("{}/v1/pipelines/paid/results", w.base));
    let (_, changes) = get(&format!("{}/v1/pipelines/paid/changes?limit=100000", w.base));
    (results, changes.lines().count())
}

/// Waits until `check` holds for a worker's status.
fn wait_status(w: &Worker, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let st = status(w);
        if check(&st) {
            return st;
        }
        assert!(Instant::now() < deadline, "{what}: {st}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn operator_actions_reach_every_worker_through_postgres() {
    let broker = Broker::start();
    let schema = Schema::new("actions");
    let s = Scratch::new("kafka-actions");
    let (root_a, root_b) = (worker_root(&s, "a", &broker, &schema), worker_root(&s, "b", &broker, &schema));
    let a = worker(&root_a);
    wait_held(&[&a], &[4]);
    let b = worker(&root_b);
    wait_held(&[&a, &b], &[2, 2]);
    let mut produced = events(0, 600);
    produced_ok(produce(&s, &broker, &produced));
    wait_caught_up(&[&a, &b], produced.len() as u64);
    check_against_batch(&s, &a, &produced);

    // Paused through A: both workers go on reading, and nothing either commits is readable, from either.
    let (code, body) = post(&format!("{}/v1/pipelines/paid/pause", a.base), r#"{"why":"amounts look wrong"}"#);
    assert_eq!(code, 200, "{body}");
    wait_status(&b, "B sees the pause", |st| st["paused"] == true);
    let before = published(&a);
    assert_eq!(published(&b), before);
    let more = events(600, 1_200);
    produced_ok(produce(&s, &broker, &more));
    produced.extend(more);
    wait_caught_up(&[&a, &b], produced.len() as u64);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(published(&a), before, "nothing is published while paused (A's reader)");
    assert_eq!(published(&b), before, "nothing is published while paused (B's reader)");

    // Resumed through B: every held row of both workers is published.
    let (code, body) = post(&format!("{}/v1/pipelines/paid/resume", b.base), r#"{"why":"checked"}"#);
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"was_paused\":true"), "{body}");
    wait_status(&a, "A sees the resume", |st| st["paused"] == false);
    check_against_batch(&s, &a, &produced);
    check_against_batch(&s, &b, &produced);

    // An annotation made through A marks the rows B reads from Postgres.
    let note = r#"{"from":"2025-11-29T00:00:00Z","to":"2025-11-29T00:05:00Z","note":"gateway incident","why":"x"}"#;
    let (code, body) = post(&format!("{}/v1/pipelines/paid/annotations", a.base), note);
    assert_eq!(code, 200, "{body}");
    let id: Value = serde_json::from_str(&body).unwrap();
    let (_, rows) = get(&format!("{}/v1/pipelines/paid/results", b.base));
    let marked = rows.lines().filter(|l| l.contains(&format!("\"annotations\":[{}]", id["annotation"]))).count();
    assert!(marked > 0 && marked < rows.lines().count(), "rows in the range are marked, others not: {marked}");
    let (_, notes) = get(&format!("{}/v1/pipelines/paid/annotations", b.base));
    assert!(notes.contains("gateway incident"), "{notes}");

    // A replay asked through A rebuilds every partition, on both workers,
    // and republishes every window above the revisions before.
    let (_, results_before) = get(&format!("{}/v1/pipelines/paid/results", a.base));
    let highest = results_before
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["revision"].as_u64().unwrap())
        .max()
        .unwrap();
    let (code, body) = post(&format!("{}/v1/pipelines/paid/replay", a.base), r#"{"why":"rebuild after the fix"}"#);
    assert_eq!(code, 202, "{body}");
    for w in [&a, &b] {
        wait_status(w, "the replay reached the worker", |st| st["replays"].as_u64() >= Some(1));
    }
    wait_caught_up(&[&a, &b], produced.len() as u64);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, rows) = get(&format!("{}/v1/pipelines/paid/results", a.base));
        // (A window whose versions were all corrected away has no row to republish.)
        let low = rows
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|v| v["events"] != 0)
            .map(|v| v["revision"].as_u64().unwrap())
            .min()
            .unwrap();
        if low > highest {
            break;
        }
        assert!(Instant::now() < deadline, "every window republished above revision {highest}: lowest {low}");
        std::thread::sleep(Duration::from_millis(200));
    }
    check_against_batch_ledgered(&s, &b, &produced, 2);
    // The embedded log's reader does not pretend to read Kafka.
    let (code, body) = get(&format!("{}/v1/topics/payments/events", a.base));
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("on Kafka"), "{body}");
    // Each action is in the audit log of the server it was asked of.
    for (w, actions) in [(&a, &["pause", "annotate", "replay"][..]), (&b, &["resume"][..])] {
        let (_, audit) = get(&format!("{}/v1/audit", w.base));
        for action in actions {
            assert!(audit.contains(&format!("\"action\":\"{action}\"")), "{action} audited: {audit}");
        }
    }
}

/// The records of `partition` from `first` to `last` (inclusive), read back from Kafka.
fn kafka_records(broker: &Broker, partition: i32, first: i64, last: i64) -> Vec<(i64, Value)> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::Message;
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &broker.url)
        .set("group.id", "test-provenance")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    // From the partition's start: the broker answers a fetch with whole record batches.
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset("payments", partition, rdkafka::Offset::Beginning).unwrap();
    consumer.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while out.last().is_none_or(|(o, _)| *o < last) {
        assert!(Instant::now() < deadline, "read {} records of partition {partition}", out.len());
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            out.push((m.offset(), serde_json::from_slice(m.payload().unwrap_or_default()).unwrap()));
        }
    }
    out.retain(|(o, _)| (first..=last).contains(o));
    out
}

/// Each of a few rows' provenance, checked against the records in Kafka.
fn check_provenance(broker: &Broker, w: &Worker) {
    let (_, body, _) = common::get_page(&format!("{}/v1/pipelines/paid/results?limit=5", w.base));
    let (_, ledger) = get(&format!("{}/v1/pipelines/paid/ledger?limit=100000", w.base));
    let ledgered: std::collections::HashSet<(u64, u64)> = ledger
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .map(|e| (e["partition"].as_u64().unwrap(), e["offset"].as_u64().unwrap()))
        .collect();
    for line in body.lines() {
        let row: Value = serde_json::from_str(line).unwrap();
        let seq = row["seq"].as_i64().unwrap();
        let (code, doc) = get(&format!("{}/v1/pipelines/paid/results/{seq}/provenance", w.base));
        assert_eq!(code, 200, "{doc}");
        let doc: Value = serde_json::from_str(&doc).unwrap();
        let (acct, start, end) = (
            row["key"]["acct"].as_str().unwrap(),
            row["window_start"].as_str().unwrap(),
            row["window_end"].as_str().unwrap(),
        );
        let mut counted = 0;
        for (_, e) in doc["entity"].as_object().unwrap() {
            if e["prov:type"] != "weir:LogRange" {
                continue;
            }
            let p = e["weir:partition"].as_u64().unwrap();
            let (lo, hi) = (e["weir:first_offset"].as_i64().unwrap(), e["weir:last_offset"].as_i64().unwrap());
            let records = kafka_records(broker, p as i32, lo, hi);
            let ours: Vec<i64> = records
                .iter()
                .filter(|(o, ev)| {
                    let t = ev["t"].as_str().unwrap();
                    *o <= hi && ev["acct"] == acct && start <= t && t < end && !ledgered.contains(&(p, *o as u64))
                })
                .map(|(o, _)| *o)
                .collect();
            assert_eq!(
                (ours.first(), ours.last()),
                (Some(&lo), Some(&hi)),
                "{e} of {row} in {:?}",
                &records[..records.len().min(5)]
            );
            assert_eq!(ours.len() as u64, e["weir:events"].as_u64().unwrap(), "{e}");
            counted += ours.len() as u64;
        }
        assert_eq!(counted, row["events"].as_u64().unwrap(), "{doc:#}");
        let run = doc["activity"].as_object().unwrap().values().next().unwrap();
        assert!(run["weir:started_because"].as_str().is_some_and(|w| w.contains("took partition")), "{run}");
    }
}

#[test]
fn a_contract_reads_the_records_kafka_timestamp_and_key() {
    let broker = Broker::start();
    let schema = Schema::new("kafkafields");
    let s = Scratch::new("kafka-fields");
    let root = s.path("w");
    std::fs::create_dir_all(root.join("contracts")).unwrap();
    let contract = CONTRACT
        .replace("event_time = \"t\"\nkey = [\"acct\"]", "event_time = \"$kafka.timestamp\"\nkey = [\"$kafka.key\"]")
        .replace("type = \"tumbling\"\nsize = \"1m\"", "type = \"global\"");
    std::fs::write(root.join("contracts/paid.toml"), &contract).unwrap();
    let config = worker_root(&s, "template", &broker, &schema).join("weir.toml");
    std::fs::copy(config, root.join("weir.toml")).unwrap();
    let w = worker(&root);
    wait_held(&[&w], &[4]);
    // Event times far in the past: the rows' watermark comes from Kafka's clock instead.
    let lines = events(0, 30);
    let before = weir_log::now_ms();
    produced_ok(produce(&s, &broker, &lines));
    // A record that brings its own `$kafka` member would forge the key and
    // the time: `weir produce` refuses it, and a worker ledgers it `bad_type`.
    let forged = r#"{"id":"forged","acct":"a1","amount":1,"status":"ok","t":"2025-11-29T00:00:00Z","$kafka":{"timestamp":0,"key":"zz"}}"#;
    let out = produce(&s, &broker, &[forged.to_owned()]).wait_with_output().unwrap();
    assert!(!out.status.success() && text(&out.stderr).contains("$kafka"), "{}", text(&out.stderr));
    {
        use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
        let producer: BaseProducer =
            rdkafka::ClientConfig::new().set("bootstrap.servers", &broker.url).create().unwrap();
        producer.send(BaseRecord::to("payments").key("a1").payload(forged)).map_err(|(e, _)| e).unwrap();
        producer.flush(Duration::from_secs(10)).unwrap();
    }
    wait_caught_up(&[&w], lines.len() as u64 + 1);
    let deadline = Instant::now() + Duration::from_secs(20);
    let rows: Vec<Value> = loop {
        let (_, body) = get(&format!("{}/v1/pipelines/paid/results", w.base));
        let rows: Vec<Value> = body.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        if rows.iter().map(|r| r["events"].as_u64().unwrap_or(0)).sum::<u64>() == 30 {
            break rows;
        }
        assert!(Instant::now() < deadline, "not all events counted: {rows:?}");
        std::thread::sleep(Duration::from_millis(200));
    };
    // 30 events, ids p0..p29, p0 and p25 sent twice: duplicates; 20 accounts by record key.
    let keys: std::collections::BTreeSet<String> = rows.iter().map(|r| r["key"]["$kafka.key"].to_string()).collect();
    assert_eq!(keys.len(), 20, "{rows:?}");
    assert!(keys.contains("\"a7\""), "{keys:?}");
    let watermark = weir_engine::time::parse_rfc3339_ms(rows[0]["watermark"].as_str().unwrap()).unwrap();
    assert!(watermark >= before - 10_000, "the watermark follows Kafka timestamps: {watermark} vs {before}");
    // The payloads, which a raw-reader reads.
    let url = format!("{}/v1/pipelines/paid/ledger?why=test", w.base);
    let raw = common::tokens_of(&root.join("data")).raw_reader;
    let ledger = agent()
        .get(&url)
        .header("authorization", format!("Bearer {raw}"))
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap();
    let mut entries: Vec<Value> = ledger.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let at = entries.iter().position(|e| e["reason"] == "bad_type").expect("the forged record is ledgered");
    let refused = entries.remove(at);
    assert!(refused["detail"].as_str().unwrap().contains("$kafka"), "{refused}");
    assert!(refused["payload"].as_str().unwrap().contains("\"zz\""), "its payload as sent: {refused}");
    assert!(!keys.contains("\"zz\""), "the forged key counted nowhere");
    assert_eq!(entries.len(), 2, "p0 and p25 resent: {ledger}");
    for e in &entries {
        assert_eq!(e["reason"], "duplicate", "the same record twice, same timestamp: {e}");
        let payload: Value = serde_json::from_str(e["payload"].as_str().unwrap()).unwrap();
        assert!(payload["$kafka"]["timestamp"].as_i64() >= Some(before - 10_000), "{e}");
        assert_eq!(payload["$kafka"]["key"], payload["acct"], "{e}");
    }
}

/// Every record of a Kafka topic, from the beginning, until `at_least` arrived and no more come.
fn consume_all(broker: &Broker, topic: &str, at_least: usize) -> Vec<Value> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::Message;
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &broker.url)
        .set("group.id", format!("test-reader-{topic}"))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut quiet_since = Instant::now();
    loop {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                let key: Value = serde_json::from_slice(m.key().unwrap_or_default()).unwrap();
                let mut row: Value = serde_json::from_slice(m.payload().unwrap_or_default()).unwrap();
                row["record_key"] = key;
                out.push(row);
                quiet_since = Instant::now();
            }
            Some(Err(e)) => panic!("reading {topic}: {e}"),
            None => {}
        }
        if out.len() >= at_least && quiet_since.elapsed() > Duration::from_secs(2) {
            return out;
        }
        assert!(Instant::now() < deadline, "{} of at least {at_least} records on {topic}", out.len());
    }
}

/// The sink holds every row of `/changes` (at least once), keyed by key and window.
fn check_sink(broker: &Broker, w: &Worker, topic: &str) {
    let (_, body) = get(&format!("{}/v1/pipelines/paid/changes?limit=100000", w.base));
    let changes: Vec<Value> = body.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(!changes.is_empty());
    let records = consume_all(broker, topic, changes.len());
    let published: std::collections::BTreeSet<(String, String, u64)> = records
        .iter()
        .map(|r| {
            assert_eq!(r["record_key"]["key"], r["key"], "{r}");
            assert_eq!(r["record_key"]["window_start"], r["window_start"], "{r}");
            (r["key"].to_string(), r["window_start"].to_string(), r["revision"].as_u64().unwrap())
        })
        .collect();
    for c in &changes {
        let id = (c["key"].to_string(), c["window_start"].to_string(), c["revision"].as_u64().unwrap());
        assert!(published.contains(&id), "row {c} is not on {topic}");
    }
}

#[test]
fn a_sink_publishes_every_row_and_ledger_entry_to_kafka_on_both_stores() {
    let broker = Broker::start();
    let schema = Schema::new("sink");
    let s = Scratch::new("kafka-sink");
    let lines = events(0, 400);

    // Kafka and Postgres.
    let root = worker_root(&s, "pg", &broker, &schema);
    let with_sink = format!("{CONTRACT}\n[sink]\ntopic = \"paid_rows\"\nledger_topic = \"paid_ledger\"\n");
    std::fs::write(root.join("contracts/paid.toml"), &with_sink).unwrap();
    let w = worker(&root);
    wait_held(&[&w], &[4]);
    produced_ok(produce(&s, &broker, &lines));
    wait_caught_up(&[&w], lines.len() as u64);
    check_sink(&broker, &w, "paid_rows");
    let ledger = consume_all(&broker, "paid_ledger", 16);
    assert!(ledger.iter().all(|e| e["reason"] == "duplicate" || e["reason"] == "superseded"), "{ledger:?}");
    assert!(ledger.iter().any(|e| e["reason"] == "superseded" && e["superseded_by"].is_u64()), "{ledger:?}");
    // The sink is read as two kafka destinations, operated as any other.
    wait_sink_caught_up(&w, &["sink", "sink_ledger"]);
    drop(w);

    // The embedded log and SQLite, the same contract with the sink's brokers named.
    let root = s.path("embedded");
    std::fs::create_dir_all(root.join("contracts")).unwrap();
    let embedded = format!(
        "{CONTRACT}\n[sink]\ntopic = \"log_rows\"\nledger_topic = \"log_ledger\"\nbrokers = \"{}\"\n",
        broker.url
    )
    .replace("max_delay", "kind = \"log\"\nmax_delay");
    std::fs::write(root.join("contracts/paid.toml"), &embedded).unwrap();
    std::fs::write(root.join("weir.toml"), "[topics.payments]\npartitions = 2\nkey = \"acct\"\n").unwrap();
    let w = worker(&root);
    let body = lines.join("\n") + "\n";
    let url = format!("{}/v1/topics/payments/events", w.base);
    let mut r = authed(agent().post(&url), "POST", &url).send(&body).unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.body_mut().read_to_string().unwrap_or_default());
    let deadline = Instant::now() + Duration::from_secs(30);
    while status(&w)["events"]["read"] != lines.len() as u64 || status(&w)["lag_records"] != 0 {
        assert!(Instant::now() < deadline, "{}", status(&w));
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    check_sink(&broker, &w, "log_rows");
    let ledger = consume_all(&broker, "log_ledger", 16);
    assert!(ledger.iter().any(|e| e["reason"] == "superseded" && e["superseded_by"].is_u64()), "{ledger:?}");
    wait_sink_caught_up(&w, &["sink", "sink_ledger"]);

    // A store the older `[sink]` publisher left: its position in `sinks`, no
    // destination's. The destination goes on from there, publishing nothing twice.
    let changes = |w: &Worker| get(&format!("{}/v1/pipelines/paid/changes?limit=100000", w.base)).1.lines().count();
    let before = changes(&w);
    assert_eq!(consume_all(&broker, "log_rows", before).len(), before, "each change once on log_rows");
    drop(w);
    let db = rusqlite::Connection::open(root.join("data/weir.db")).unwrap();
    db.execute("DELETE FROM destinations WHERE pipeline = 'paid' AND name = 'sink'", []).unwrap();
    let next = before as i64 + 1;
    db.execute("INSERT INTO sinks (pipeline, topic, next_seq) VALUES ('paid', 'log_rows', ?1)", [next]).unwrap();
    drop(db);
    let w = worker(&root);
    let url = format!("{}/v1/topics/payments/events", w.base);
    let mut r = authed(agent().post(&url), "POST", &url).send(&(events(400, 500).join("\n") + "\n")).unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.body_mut().read_to_string().unwrap_or_default());
    let deadline = Instant::now() + Duration::from_secs(30);
    while status(&w)["lag_records"] != 0 || changes(&w) == before {
        assert!(Instant::now() < deadline, "{}", status(&w));
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    wait_sink_caught_up(&w, &["sink", "sink_ledger"]);
    let after = changes(&w);
    assert_eq!(consume_all(&broker, "log_rows", after).len(), after, "went on from the sink's position");
    check_sink(&broker, &w, "log_rows");
}

/// Waits until the destinations `names` (a `[sink]`'s, in `/status`) have
/// delivered everything published: position past the head, no lag.
fn wait_sink_caught_up(w: &Worker, names: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = status(w);
        let ds = s["destinations"].as_array().cloned().unwrap_or_default();
        let found: Vec<&str> = ds.iter().filter_map(|d| d["name"].as_str()).collect();
        let done = found == names
            && ds.iter().all(|d| {
                d["kind"] == "kafka"
                    && d["state"] == "caught up"
                    && d["lag_changes"] == 0
                    && d["head"].as_i64().is_some_and(|h| h > 0 && d["position"].as_i64() == Some(h + 1))
            });
        if done {
            return;
        }
        assert!(Instant::now() < deadline, "the sink's destinations did not catch up: {}", s["destinations"]);
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn the_demo_runs_on_kafka_and_postgres() {
    let broker = Broker::start();
    let s = Scratch::new("kafka-demo");
    let data = s.path("data");
    let out = weir(&[
        &"demo",
        &"--duration",
        &"6s",
        &"--rate",
        &"500",
        &"--listen",
        &"127.0.0.1:0",
        &"--data",
        &data,
        &"--kafka",
        &broker.url,
        &"--postgres",
        &postgres_url(),
    ]);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("created Kafka topic payments"), "{err}");
    // Its pipelines read the events posted through Kafka and published to Postgres.
    let mut c = postgres::Client::connect(&postgres_url(), postgres::NoTls).unwrap();
    let changes: i64 =
        c.query_one("SELECT count(*) FROM weir_demo.changes WHERE pipeline = 'current_plan'", &[]).unwrap().get(0);
    assert!(changes > 0, "no rows in Postgres: {err}");
    let offsets: i64 =
        c.query_one("SELECT coalesce(sum(next_offset), 0)::BIGINT FROM weir_demo.partitions", &[]).unwrap().get(0);
    assert!(offsets > 0, "{err}");
    // paid_revenue's postgres destination filled its typed table, and its
    // http destination unlocked accounts at the demo's account service.
    let table: i64 = c
        .query_one(
            "SELECT count(*) FROM weir_demo_tables.paid_revenue WHERE revenue IS NOT NULL AND window_start IS NOT NULL",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(table > 0, "no rows in the destination table: {err}");
    assert!(err.contains("accounts unlocked") && !err.contains(" 0 accounts unlocked"), "{err}");
    c.batch_execute("DROP SCHEMA weir_demo CASCADE; DROP SCHEMA weir_demo_tables CASCADE").unwrap();
}

/// `paid`'s status of `version` on a worker.
fn version_status(w: &Worker, version: u32) -> Value {
    serde_json::from_str(&get(&format!("{}/v1/pipelines/paid/status?version={version}", w.base)).1).unwrap()
}

/// Waits until the workers together have read `total` records for `version`.
fn wait_version_caught_up(workers: &[&Worker], version: u32, total: u64) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let statuses: Vec<Value> = workers.iter().map(|w| version_status(w, version)).collect();
        let next: u64 = statuses
            .iter()
            .flat_map(|s| s["partitions"].as_array().cloned().unwrap_or_default())
            .map(|p| p["next_offset"].as_u64().unwrap_or(0))
            .sum();
        let lag: u64 = statuses.iter().map(|s| s["lag_records"].as_u64().unwrap_or(0)).sum();
        if next == total && lag == 0 {
            std::thread::sleep(Duration::from_millis(300));
            return;
        }
        assert!(Instant::now() < deadline, "version {version} not caught up to {total}: {statuses:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A version's rows in Postgres (through a worker) against `weir batch` of its contract over `lines`.
fn check_version_against_batch(s: &Scratch, w: &Worker, (version, contract): (u32, &str), lines: &[String]) {
    let input = s.write(&format!("all-v{version}.jsonl"), &(lines.join("\n") + "\n"));
    let file = s.write(&format!("paid-v{version}.toml"), contract);
    let out = s.path(&format!("batch-v{version}.jsonl"));
    let batch = weir(&[&"batch", &file, &"--input", &input, &"--output", &out]);
    assert!(batch.status.success(), "{}", text(&batch.stderr));
    let mut expected: Vec<_> =
        std::fs::read_to_string(&out).unwrap().lines().map(|l| identity(&serde_json::from_str(l).unwrap())).collect();
    expected.sort();
    let (code, body) = get(&format!("{}/v1/pipelines/paid/results?version={version}&limit=100000", w.base));
    assert_eq!(code, 200, "{body}");
    let rows: Vec<Value> = body.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(rows.iter().all(|r| r["version"] == version), "rows of another version in version {version}'s");
    let mut current: Vec<_> = rows.iter().filter(|v| v["events"] != 0).map(identity).collect();
    current.sort();
    assert_eq!(current, expected, "version {version}'s rows in Postgres equal weir batch of its contract");
}

#[test]
fn two_versions_run_side_by_side_on_kafka_through_a_rolling_restart_and_the_sink_publishes_both() {
    let broker = Broker::start();
    let schema = Schema::new("versions");
    let s = Scratch::new("kafka-versions");
    let v1 = format!("{CONTRACT}\n[sink]\ntopic = \"versioned_rows\"\n");
    let v2 = v1.replace("version = 1", "version = 2").replace("size = \"1m\"", "size = \"2m\"");
    let (root_a, root_b) = (worker_root(&s, "a", &broker, &schema), worker_root(&s, "b", &broker, &schema));
    std::fs::write(root_a.join("contracts/paid.toml"), &v1).unwrap();
    std::fs::write(root_b.join("contracts/paid.toml"), &v1).unwrap();

    // Version 1 on two workers.
    let a = worker(&root_a);
    wait_held(&[&a], &[4]);
    let mut b = worker(&root_b);
    wait_held(&[&a, &b], &[2, 2]);
    let mut produced = events(0, 300);
    produced_ok(produce(&s, &broker, &produced));
    wait_caught_up(&[&a, &b], produced.len() as u64);
    let (_, before) = get(&format!("{}/v1/pipelines/paid/results?limit=100000", a.base));

    // A rolling restart to version 2: B first (killed with SIGKILL once while it builds), then A.
    signal(&b, "KILL");
    drop(b);
    std::fs::write(root_b.join("contracts/paid.toml"), &v2).unwrap();
    b = worker(&root_b);
    signal(&b, "KILL");
    drop(b);
    b = worker(&root_b);
    let (_, during) = get(&format!("{}/v1/pipelines/paid/results?limit=100000", a.base));
    assert_eq!(during, before, "version 1 keeps serving, unchanged, while version 2 is built");
    let (_, versions) = get(&format!("{}/v1/pipelines/paid/versions", a.base));
    let states: Vec<(Value, Value)> = versions
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .map(|v| (v["version"].clone(), v["state"].clone()))
        .collect();
    assert_eq!(states, [(1.into(), "live".into()), (2.into(), "candidate".into())]);
    wait_version_caught_up(&[&b], 2, produced.len() as u64);
    sigterm(a);
    std::fs::write(root_a.join("contracts/paid.toml"), &v2).unwrap();
    let a = worker(&root_a);
    produced.extend(events(300, 600));
    produced_ok(produce(&s, &broker, &produced[produced.len() - events(300, 600).len()..]));
    wait_version_caught_up(&[&a, &b], 1, produced.len() as u64);
    wait_version_caught_up(&[&a, &b], 2, produced.len() as u64);
    check_version_against_batch(&s, &a, (1, &v1), &produced);
    check_version_against_batch(&s, &b, (2, &v2), &produced);

    // Promote on A: B's readers get version 2 at once (the store says which is live); roll back on B.
    let (code, answer) =
        post(&format!("{}/v1/pipelines/paid/promote", a.base), r#"{"version":2,"why":"2-minute windows"}"#);
    assert_eq!(code, 200, "{answer}");
    let (_, on_b) = get(&format!("{}/v1/pipelines/paid/results?limit=100000", b.base));
    assert!(on_b.lines().all(|l| l.contains("\"version\":2")), "{on_b}");
    let (code, answer) = post(&format!("{}/v1/pipelines/paid/rollback", b.base), r#"{"why":"not yet"}"#);
    assert_eq!(code, 200, "{answer}");
    // With Postgres the audit entry is written before the action; one that
    // did not take effect (a promote of a version never stored) says so.
    let (code, answer) =
        post(&format!("{}/v1/pipelines/paid/promote", b.base), r#"{"version":9,"why":"no such version"}"#);
    assert_eq!(code, 404, "{answer}");
    let (_, audit) = get(&format!("{}/v1/audit", b.base));
    let entries: Vec<Value> = audit.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let asked = entries.iter().find(|e| e["action"] == "promote" && e["detail"]["asked"] == 9).expect(&audit);
    assert_eq!(asked["detail"]["outcome"], "asked", "{asked}");
    let failed = entries.iter().find(|e| e["action"] == "action-failed").expect(&audit);
    assert_eq!(failed["detail"]["entry"], asked["seq"], "{failed}");
    let (_, on_a) = get(&format!("{}/v1/pipelines/paid/results?limit=100000", a.base));
    assert!(!on_a.is_empty() && on_a.lines().all(|l| l.contains("\"version\":1")), "{on_a}");

    // The change stream: seq 1.. without a gap across both versions and the two version entries.
    let (_, body) = get(&format!("{}/v1/pipelines/paid/changes?limit=100000", a.base));
    let changes: Vec<Value> = body.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    for (i, c) in changes.iter().enumerate() {
        assert_eq!(c["seq"], i as u64 + 1, "{c}");
    }
    let markers: Vec<&Value> = changes.iter().filter(|c| c["type"] == "version").collect();
    assert_eq!(markers.len(), 2, "{markers:?}");
    assert!(changes.iter().any(|c| c["version"] == 1) && changes.iter().any(|c| c["version"] == 2));

    // The sink published every row of both versions, each keyed by its version, and both entries.
    let records = consume_all(&broker, "versioned_rows", changes.len());
    let published: std::collections::BTreeSet<String> = records
        .iter()
        .map(|r| {
            if r["type"] == "version" {
                return format!("version {}", r["seq"]);
            }
            assert_eq!(r["record_key"]["version"], r["version"], "{r}");
            format!("{} {} {} {}", r["version"], r["key"], r["window_start"], r["revision"])
        })
        .collect();
    for c in &changes {
        let id = if c["type"] == "version" {
            format!("version {}", c["seq"])
        } else {
            format!("{} {} {} {}", c["version"], c["key"], c["window_start"], c["revision"])
        };
        assert!(published.contains(&id), "{c} is not on the sink's topic");
    }

    // A worker restarting with either version's file wipes nothing.
    sigterm(b);
    std::fs::write(root_b.join("contracts/paid.toml"), &v1).unwrap();
    let b = worker(&root_b);
    wait_version_caught_up(&[&a, &b], 1, produced.len() as u64);
    check_version_against_batch(&s, &b, (1, &v1), &produced);
    check_version_against_batch(&s, &b, (2, &v2), &produced);
}

/// Rows of a worker's `/results` by (key, window start): (values, events), the flush's left out.
fn rows_by_window(rows: &str) -> BTreeMap<(String, String), (String, u64)> {
    rows.lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["events"] != 0 && !r["key"]["acct"].as_str().is_some_and(|a| a.starts_with("flush")))
        .map(|r| {
            let key = (r["key"].to_string(), r["window_start"].as_str().unwrap().to_owned());
            (key, (r["values"].to_string(), r["events"].as_u64().unwrap()))
        })
        .collect()
}

/// Asks a worker for a backfill of `[from, to)` (again while the last
/// checkpoints have not reached the flush) and waits for its report.
fn backfill_on(w: &Worker, (from, to): (i64, i64), why: &str) -> Value {
    let t = weir_engine::time::format_rfc3339_ms;
    let ask = format!(r#"{{"from":"{}","to":"{}","why":"{why}"}}"#, t(from), t(to));
    let deadline = Instant::now() + Duration::from_secs(30);
    let id = loop {
        let (code, body) = post(&format!("{}/v1/pipelines/paid/backfill", w.base), &ask);
        if code == 202 {
            break serde_json::from_str::<Value>(&body).unwrap()["backfill"].as_i64().unwrap();
        }
        assert!(code == 409 && body.contains("have not settled") && Instant::now() < deadline, "{code} {body}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, body) = get(&format!("{}/v1/pipelines/paid/backfills/{id}", w.base));
        let run: Value = serde_json::from_str(&body).unwrap();
        if run["state"] == "done" || run["state"] == "failed" {
            assert_eq!(run["state"], "done", "{run}");
            return run;
        }
        assert!(Instant::now() < deadline, "backfill {id} not done: {run}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_backfill_on_kafka_corrects_settled_windows_to_the_batch_and_a_second_changes_nothing() {
    let broker = Broker::start();
    let schema = Schema::new("backfill");
    let s = Scratch::new("kafka-backfill");
    // Windows settle at once, and later payments and corrections for them are too late.
    let contract = CONTRACT
        .replace("allowed_lateness = \"1h\"", "allowed_lateness = \"0s\"")
        .replace("late = \"revise\"", "late = \"discard\"")
        .replace("early = true", "early = false")
        + "\n[sink]\ntopic = \"backfilled_rows\"\n";
    let (root_a, root_b) = (worker_root(&s, "a", &broker, &schema), worker_root(&s, "b", &broker, &schema));
    std::fs::write(root_a.join("contracts/paid.toml"), &contract).unwrap();
    std::fs::write(root_b.join("contracts/paid.toml"), &contract).unwrap();
    let a = worker(&root_a);
    wait_held(&[&a], &[4]);
    let b = worker(&root_b);
    wait_held(&[&a, &b], &[2, 2]);

    let base = 1_764_374_400_000i64;
    let t = weir_engine::time::format_rfc3339_ms;
    let mut produced = events(0, 1500);
    // Too late: three for a1 in minute 2, two for a2 in minute 4.
    for (i, (acct, minute, amount)) in
        [("a1", 2, "1000.00"), ("a1", 2, "200.00"), ("a1", 2, "30.00"), ("a2", 4, "4.00"), ("a2", 4, "0.50")]
            .iter()
            .enumerate()
    {
        let at = t(base + minute * 60_000 + i as i64 * 1_000);
        produced.push(format!(r#"{{"id":"late{i}","acct":"{acct}","t":"{at}","amount":{amount},"status":"ok"}}"#));
    }
    // A payment a year on, for enough accounts to reach every partition: every window settles.
    for k in 0..40 {
        let at = t(base + 366 * 86_400_000);
        produced.push(format!(r#"{{"id":"flush{k}","acct":"flush{k}","t":"{at}","amount":0,"status":"ok"}}"#));
    }
    produced_ok(produce(&s, &broker, &produced));
    wait_caught_up(&[&a, &b], produced.len() as u64);

    let input = s.write("all.jsonl", &(produced.join("\n") + "\n"));
    let file = s.write("paid.toml", &contract);
    let out = s.path("batch.jsonl");
    let batch = weir(&[&"batch", &file, &"--input", &input, &"--output", &out]);
    assert!(batch.status.success(), "{}", text(&batch.stderr));
    // The windows of the range (a payment dated just before it makes one more).
    let range = (base, base + 3_600_000);
    let in_range = |rows: BTreeMap<(String, String), (String, u64)>| -> BTreeMap<_, _> {
        rows.into_iter().filter(|((_, start), _)| *start >= t(range.0) && *start < t(range.1)).collect()
    };
    let expected = in_range(rows_by_window(&std::fs::read_to_string(&out).unwrap()));
    let (_, before) = get(&format!("{}/v1/pipelines/paid/results?limit=100000", a.base));
    let before = in_range(rows_by_window(&before));
    let wrong = expected.iter().filter(|(k, v)| before.get(*k) != Some(*v)).count();
    assert!(wrong >= 2, "the too-late payments left windows wrong");
    let (_, changes_before) = get(&format!("{}/v1/pipelines/paid/changes?limit=100000", a.base));

    // The payments system's export (the batch's numbers) with a refund of 25
    // applied there only (a3, minute 5): a2's late payments in minute 4 are
    // explained by the ledger, the refund is not.
    let refund_at = t(base + 5 * 60_000);
    let mut export = vec!["acct,minute,total,count".to_owned()];
    for ((key, start), (values, _)) in &expected {
        let (key, values): (Value, Value) = (serde_json::from_str(key).unwrap(), serde_json::from_str(values).unwrap());
        let acct = key["acct"].as_str().unwrap();
        let total: f64 = values["total"].to_string().parse().unwrap();
        let total = if acct == "a3" && *start == refund_at { total - 25.0 } else { total };
        export.push(format!("{acct},{start},{total:.2},{}", values["payments"]));
    }
    let url = format!(
        "{}/v1/pipelines/paid/reconcile?why=close&source=export.csv&tolerance=0.001&map=key.acct=acct,window_start=minute,total=total,payments=count",
        b.base
    );
    let (code, body) = post(&url, &(export.join("\n") + "\n"));
    assert_eq!(code, 200, "{body}");
    let report: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(report["verdict"], "fail", "{report}");
    let window = |acct: &str, start: &str| {
        report["differences"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["key"]["acct"] == acct && d["window_start"] == start)
            .cloned()
    };
    let late = window("a2", &t(base + 4 * 60_000)).unwrap_or_else(|| panic!("a2 minute 4: {report}"));
    assert_eq!(
        (late["causes"]["too_late"]["events"].clone(), late["explained"].clone()),
        (2.into(), true.into()),
        "{late}"
    );
    assert_eq!(late["accounted"]["total"], "4.5", "{late}");
    let refund = window("a3", &refund_at).unwrap_or_else(|| panic!("a3 minute 5: {report}"));
    assert_eq!(
        (refund["explained"].clone(), refund["unexplained"]["total"].clone()),
        (false.into(), "-25".into()),
        "{refund}"
    );
    let (_, kept) = get(&format!("{}/v1/pipelines/paid/reconciliations/{}", a.base, report["id"]));
    assert!(kept.contains("\"verdict\":\"fail\""), "stored in Postgres, read on the other worker: {kept}");

    // The backfill, asked of worker B, done by whichever worker claims it.
    let run = backfill_on(&b, range, "late payments");
    let report = &run["report"];
    assert_eq!(report["windows_corrected"], wrong as u64, "{report}");
    assert!(report["causes"]["too_late"]["events"].as_u64().unwrap() >= 5, "{report}");
    for w in [&a, &b] {
        let (_, after) = get(&format!("{}/v1/pipelines/paid/results?limit=100000", w.base));
        assert_eq!(in_range(rows_by_window(&after)), expected, "the rows after the backfill against weir batch");
    }
    let (_, changes) = get(&format!("{}/v1/pipelines/paid/changes?limit=100000", a.base));
    let new: Vec<Value> =
        changes.lines().skip(changes_before.lines().count()).map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(new.len(), wrong, "one corrected row per wrong window");
    assert!(new.iter().all(|r| r["status"] == "corrected"), "{new:?}");
    let seq = new[0]["seq"].as_i64().unwrap();
    let (_, prov) = get(&format!("{}/v1/pipelines/paid/results/{seq}/provenance", a.base));
    assert!(prov.contains(&format!("backfill {}", run["id"])), "{prov}");
    // The sink publishes the corrected rows like any other.
    let records = consume_all(&broker, "backfilled_rows", changes.lines().count());
    for row in &new {
        let found = records
            .iter()
            .any(|r| r["seq"] == row["seq"] && r["status"] == "corrected" && r["values"] == row["values"]);
        assert!(found, "{row} is not on the sink's topic");
    }

    // A second backfill, asked of A, changes nothing.
    let again = backfill_on(&a, range, "again");
    assert_eq!(again["report"]["windows_corrected"], 0, "{again}");
    let (_, changes_again) = get(&format!("{}/v1/pipelines/paid/changes?limit=100000", a.base));
    assert_eq!(changes_again.lines().count(), changes.lines().count());
}

#[test]
fn a_scheduled_reconciliation_on_kafka_corrects_and_compares_with_the_system_of_record() {
    let broker = Broker::start();
    let schema = Schema::new("schedule");
    let s = Scratch::new("kafka-schedule");
    let base = 1_764_374_400_000i64;
    let t = weir_engine::time::format_rfc3339_ms;
    let mut first = events(0, 600);
    for (i, minute) in [2i64, 2, 4].iter().enumerate() {
        let at = t(base + minute * 60_000 + i as i64 * 1_000);
        first.push(format!(r#"{{"id":"late{i}","acct":"a2","t":"{at}","amount":10.00,"status":"ok"}}"#));
    }
    let flush: Vec<String> = (0..40)
        .map(|k| {
            let at = t(base + 366 * 86_400_000);
            format!(r#"{{"id":"flush{k}","acct":"flush{k}","t":"{at}","amount":0,"status":"ok"}}"#)
        })
        .collect();
    // The payments system: the batch's numbers per account and minute, a refund of 25 there only (a3, minute 5).
    let plain = CONTRACT
        .replace("allowed_lateness = \"1h\"", "allowed_lateness = \"0s\"")
        .replace("late = \"revise\"", "late = \"discard\"")
        .replace("early = true", "early = false");
    let all: Vec<String> = first.iter().chain(&flush).cloned().collect();
    let input = s.write("all.jsonl", &(all.join("\n") + "\n"));
    let file = s.write("plain.toml", &plain);
    let out = s.path("batch.jsonl");
    let batch = weir(&[&"batch", &file, &"--input", &input, &"--output", &out]);
    assert!(batch.status.success(), "{}", text(&batch.stderr));
    let expected = rows_by_window(&std::fs::read_to_string(&out).unwrap());
    let table = format!("{}.payments_system", schema.0);
    let mut pg = postgres::Client::connect(&postgres_url(), postgres::NoTls).unwrap();
    pg.batch_execute(&format!(
        "CREATE SCHEMA IF NOT EXISTS {}; CREATE TABLE {table} (acct TEXT, minute TIMESTAMPTZ, total NUMERIC, n INTEGER)",
        schema.0
    ))
    .unwrap();
    for ((key, start), (values, _)) in &expected {
        let (key, values): (Value, Value) = (serde_json::from_str(key).unwrap(), serde_json::from_str(values).unwrap());
        let refund = if key["acct"] == "a3" && *start == t(base + 5 * 60_000) { " - 25" } else { "" };
        let insert = format!(
            "INSERT INTO {table} VALUES ('{}', '{start}', {}{refund}, {})",
            key["acct"].as_str().unwrap(),
            values["total"],
            values["payments"]
        );
        pg.batch_execute(&insert).unwrap();
    }
    // Every 3 s, the windows settled 8783 hours before (once the flush a year on is read: the first hour).
    let query = format!(
        "SELECT acct, minute, total, n FROM {table} WHERE minute >= $1::timestamptz AND minute < $2::timestamptz"
    );
    let contract = format!(
        "{plain}\n[reconcile]\nevery = \"10s\"\ndelay = \"8783h\"\n\n[reconcile.system_of_record]\nconnection = \"payments_system\"\nquery = \"{query}\"\nmap = \"key.acct=acct,window_start=minute,total=total,payments=n\"\ntolerance = \"0.001\"\n"
    );
    // The payments system is read as an account of its own, never the store's.
    let reader = common::topology::record_reader(&[&table]);
    let (root_a, root_b) = (worker_root(&s, "a", &broker, &schema), worker_root(&s, "b", &broker, &schema));
    for root in [&root_a, &root_b] {
        let config = std::fs::read_to_string(root.join("weir.toml")).unwrap();
        let connection = format!("\n[connections.payments_system]\nurl = \"{reader}\"\n");
        std::fs::write(root.join("weir.toml"), config + &connection).unwrap();
    }
    std::fs::write(root_a.join("contracts/paid.toml"), &contract).unwrap();
    std::fs::write(root_b.join("contracts/paid.toml"), &contract).unwrap();
    let a = worker(&root_a);
    wait_held(&[&a], &[4]);
    let b = worker(&root_b);
    wait_held(&[&a, &b], &[2, 2]);
    produced_ok(produce(&s, &broker, &first));
    wait_caught_up(&[&a, &b], first.len() as u64);
    // The first scheduled run covers the `every` before what had settled then; later ones go on from there.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !get(&format!("{}/v1/pipelines/paid/backfills", a.base)).1.contains("\"state\":\"done\"") {
        assert!(Instant::now() < deadline, "no scheduled run");
        std::thread::sleep(Duration::from_millis(200));
    }
    produced_ok(produce(&s, &broker, &flush));
    wait_caught_up(&[&a, &b], all.len() as u64);

    // A later scheduled run (asked by one worker, done by one) corrects the windows to the batch.
    let in_first_hour = |rows: BTreeMap<(String, String), (String, u64)>| -> BTreeMap<_, _> {
        rows.into_iter().filter(|((_, start), _)| *start >= t(base) && *start < t(base + 3_600_000)).collect()
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let (_, rows) = get(&format!("{}/v1/pipelines/paid/results?limit=100000", b.base));
        if in_first_hour(rows_by_window(&rows)) == in_first_hour(expected.clone()) {
            break;
        }
        assert!(Instant::now() < deadline, "the scheduled runs never corrected the windows");
        std::thread::sleep(Duration::from_millis(500));
    }
    let (_, listed) = get(&format!("{}/v1/pipelines/paid/backfills", b.base));
    let runs: Value = serde_json::from_str(&listed).unwrap();
    assert!(runs["backfills"].as_array().unwrap().iter().all(|r| r["origin"] == "schedule"), "{runs}");
    let corrected: u64 =
        runs["backfills"].as_array().unwrap().iter().filter_map(|r| r["report"]["windows_corrected"].as_u64()).sum();
    assert!(corrected >= 2, "{runs}");
    // Counted in every worker's /metrics (the totals come from Postgres).
    for w in [&a, &b] {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (_, metrics) = get(&format!("{}/metrics", w.base));
            let line = format!("weir_reconcile_corrected_windows_total{{pipeline=\"paid\",messaging_destination_name=\"payments\"}} {corrected}");
            if metrics.lines().any(|l| l == line) {
                break;
            }
            assert!(Instant::now() < deadline, "{line} not in {}'s metrics", w.base);
            std::thread::sleep(Duration::from_millis(300));
        }
    }
    // After the run, the payments system's table: only the refund is unexplained.
    let deadline = Instant::now() + Duration::from_secs(60);
    let failed = loop {
        let (_, listed) = get(&format!("{}/v1/pipelines/paid/reconciliations", a.base));
        let listed: Value = serde_json::from_str(&listed).unwrap();
        if let Some(r) = listed["reconciliations"].as_array().unwrap().iter().find(|r| r["verdict"] == "fail") {
            break r.clone();
        }
        assert!(Instant::now() < deadline, "no failed reconciliation with the system of record: {listed}");
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(failed["source"], "system_of_record", "{failed}");
    assert_eq!(failed["report"]["windows"]["unexplained"], 1, "{failed}");
    assert_eq!(failed["report"]["totals"]["total"]["unexplained"], "-25", "{failed}");
}

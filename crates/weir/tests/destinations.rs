//! Destinations (SPEC.md 11, issue 40), on both topologies: the embedded
//! log with SQLite, and Kafka (tansu) with Postgres.
//!
//! - Kill -9 the server 20 times while 50,000 payments are produced and
//!   delivered to an `http` receiver (an account service that applies each
//!   `Idempotency-Key` once), to two `postgres` tables (upsert and
//!   changes) and to a `kafka` topic (on the embedded log, a broker of its
//!   own). Afterwards every table equals the published rows, the
//!   receiver applied every change exactly once and in order per window,
//!   and no table row ever went back to an older change.
//! - A receiver that refuses a batch with 400 stops its destination and
//!   opens an incident for the owner; `weir resume --destination` sends the
//!   refused batch again and the rest after it, nothing skipped.
//! - Pausing the pipeline holds every destination: nothing is delivered
//!   until the resume publishes the held rows.
//! - A promote and a rollback: each destination switches to the new live
//!   version's rows (the upsert table and the receiver then equal that
//!   version's published rows, a new aggregate a new column), and the
//!   changes table holds every change of both versions once. Then a
//!   backfill's `corrected` row reaches every destination like any other.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::topology::{postgres_url, Broker, Topology};
use common::{authed, call, get, json_lines, text, weir, weir_as, Scratch, Server, PAID};
use serde_json::Value;

/// The account service: applies each batch's `Idempotency-Key` once, and
/// remembers what it applied.
#[derive(Default)]
struct Accounts {
    keys: BTreeSet<String>,
    /// Times each change's `seq` was applied.
    applied: BTreeMap<i64, u32>,
    /// Per key and window: the `seq` of the change it holds.
    windows: BTreeMap<(String, String), i64>,
    /// A change applied below the one its window held.
    backwards: Vec<String>,
    /// Batches received again with a key already applied.
    repeated: u64,
    /// Of those, batches whose key spans a whole window of `window` seqs
    /// (sent without a `pending` record: rebuilt from the position alone).
    repeated_whole: u64,
    /// The destination's `batch`, for `repeated_whole` (0: not counted).
    window: i64,
    /// While set, every batch is refused with 400.
    refuse: bool,
    refused: u64,
    /// While set, every batch is answered 503 (retried), so a backlog builds.
    unavailable: bool,
    /// Batches applied (not repeated).
    applied_batches: u64,
    /// How long it takes to answer once it applied a batch (a kill in
    /// between leaves a batch applied that weir has not recorded as delivered).
    answer_after: Duration,
    /// Applied a batch and not yet answered.
    answering: bool,
    /// The live version, as the last `version` entry said.
    live: Option<u64>,
}

/// One request: its head's `idempotency-key` and its body.
fn read_request(reader: &mut impl BufRead) -> Option<(String, String)> {
    let mut first = String::new();
    if reader.read_line(&mut first).ok()? == 0 {
        return None;
    }
    let (mut length, mut key) = (0usize, String::new());
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        let (name, value) = line.split_once(':').unwrap_or((&line, ""));
        match name.to_ascii_lowercase().as_str() {
            "content-length" => length = value.trim().parse().unwrap_or(0),
            "idempotency-key" => key = value.trim().to_owned(),
            _ => {}
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some((key, String::from_utf8(body).ok()?))
}

impl Accounts {
    fn apply(&mut self, key: &str, body: &str) -> (u16, &'static str) {
        if self.refuse {
            self.refused += 1;
            return (400, "{\"error\":\"account service is read-only for maintenance\"}");
        }
        if self.unavailable {
            return (503, "{\"error\":\"account service is starting\"}");
        }
        if !self.keys.insert(key.to_owned()) {
            self.repeated += 1;
            let range = key.rsplit('/').next().and_then(|r| r.split_once('-'));
            let span = range.and_then(|(a, b)| Some(b.parse::<i64>().ok()? - a.parse::<i64>().ok()? + 1));
            self.repeated_whole += u64::from(self.window > 0 && span == Some(self.window));
            return (200, "{\"applied\":false}");
        }
        self.applied_batches += 1;
        for line in body.lines() {
            let v: Value = serde_json::from_str(line).unwrap();
            let seq = v["seq"].as_i64().unwrap();
            *self.applied.entry(seq).or_default() += 1;
            if v["type"] == "version" {
                // The rows that follow are the new live version's: what was held is replaced.
                self.live = v["to"].as_u64();
                self.windows.clear();
                continue;
            }
            let window = (v["key"].to_string(), v["window_start"].to_string());
            let held = self.windows.entry(window).or_insert(0);
            if seq < *held {
                self.backwards.push(format!("{line} after seq {held}"));
            }
            *held = seq.max(*held);
        }
        (200, "{\"applied\":true}")
    }
}

/// The account service on a free loopback port: its URL.
fn account_service(state: Arc<Mutex<Accounts>>) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/unlocks", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let state = Arc::clone(&state);
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                while let Some((key, body)) = read_request(&mut reader) {
                    let (status, answer, wait) = {
                        let mut s = state.lock().unwrap();
                        let (status, answer) = s.apply(&key, &body);
                        s.answering = true;
                        (status, answer, s.answer_after)
                    };
                    std::thread::sleep(wait);
                    let reason = match status {
                        200 => "OK",
                        503 => "Service Unavailable",
                        _ => "Bad Request",
                    };
                    let head = format!(
                        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                        answer.len()
                    );
                    let written = stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(answer.as_bytes()));
                    state.lock().unwrap().answering = false;
                    if written.is_err() {
                        break;
                    }
                }
            });
        }
    });
    url
}

/// A Postgres schema for the destination tables, dropped at the end.
struct Tables(String);

impl Tables {
    fn new(name: &str) -> Tables {
        let t = Tables(format!("weir_test_dest_{name}_{}", std::process::id()));
        t.client().batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", t.0)).unwrap();
        t
    }

    fn client(&self) -> postgres::Client {
        postgres::Client::connect(&postgres_url(), postgres::NoTls).unwrap()
    }
}

impl Drop for Tables {
    fn drop(&mut self) {
        if let Ok(mut c) = postgres::Client::connect(&postgres_url(), postgres::NoTls) {
            let _ = c.batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.0));
        }
    }
}

/// The contract with an `http` destination and, with `tables`, a
/// `postgres` upsert table and a changes table in that schema.
fn contract(tables: Option<&Tables>, batch: usize) -> String {
    let mut c = format!(
        "{PAID}\n[[destination]]\nname = \"accounts\"\nkind = \"http\"\nconnection = \"accounts\"\nbatch = {batch}\n"
    );
    if let Some(t) = tables {
        c.push_str(&format!(
            "\n[[destination]]\nname = \"warehouse\"\nkind = \"postgres\"\nconnection = \"warehouse\"\ntable = \"{0}.paid\"\n\n[[destination]]\nname = \"history\"\nkind = \"postgres\"\nconnection = \"warehouse\"\ntable = \"{0}.paid_changes\"\nmode = \"changes\"\n",
            t.0
        ));
    }
    c
}

/// Where the `kafka` destination sends: the topology's broker on Kafka, a
/// broker of its own beside the embedded log (a pipeline on the embedded
/// log may send its rows to a Kafka it does not read from).
struct Stream {
    _own: Option<Broker>,
    url: String,
}

impl Stream {
    fn of(topology: &Topology) -> Stream {
        match topology {
            Topology::Kafka(broker, _) => Stream { _own: None, url: broker.url.clone() },
            Topology::Embedded => {
                let broker = Broker::start();
                Stream { url: broker.url.clone(), _own: Some(broker) }
            }
        }
    }
}

fn config(topology: &Topology, receiver: &str, stream: Option<&Stream>) -> String {
    let mut connections = format!(
        "checkpoint_interval = \"50ms\"\n\n[connections.accounts]\nurl = \"{receiver}\"\nallow_private = true\n\n[connections.warehouse]\nurl = \"{}\"\n",
        postgres_url()
    );
    if let Some(stream) = stream {
        connections.push_str(&format!("\n[connections.stream]\nurl = \"{}\"\n", stream.url));
    }
    topology.config(("payments", 2, "account_id"), &connections)
}

/// The contract with a `kafka` destination more (the topic `paid_rows`); the destinations it has.
fn with_kafka(contract: String) -> (String, usize) {
    let n = contract.matches("[[destination]]").count();
    (contract + "\n[[destination]]\nname = \"stream\"\nkind = \"kafka\"\nconnection = \"stream\"\ntopic = \"paid_rows\"\n", n + 1)
}

/// Per key and window: the `seq` and the version held.
type Held = BTreeMap<(String, String), (i64, i64)>;

/// What a consumer of the `kafka` destination holds when it applies a record
/// only if its `seq` is greater than the last it applied for that key and
/// window: per window, the `seq` and version it holds; and every `seq` read.
fn kafka_view(stream: &Stream) -> (Held, BTreeSet<i64>) {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::Message;
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &stream.url)
        .set("group.id", format!("test-reader-{}", std::process::id()))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    consumer.subscribe(&["paid_rows"]).unwrap();
    let (mut held, mut seen) = (BTreeMap::new(), BTreeSet::new());
    let mut quiet_since = Instant::now();
    while quiet_since.elapsed() < Duration::from_secs(3) {
        if let Some(m) = consumer.poll(Duration::from_millis(200)) {
            let m = m.unwrap();
            let v: Value = serde_json::from_slice(m.payload().unwrap_or_default()).unwrap();
            let seq = v["seq"].as_i64().unwrap();
            seen.insert(v["restated_from"].as_i64().unwrap_or(seq));
            quiet_since = Instant::now();
            if v["type"] == "version" {
                // The rows that follow are the new live version's: what was held is replaced.
                held.clear();
                continue;
            }
            let key: Value = serde_json::from_slice(m.key().unwrap()).unwrap();
            assert_eq!((&key["key"], &key["window_start"]), (&v["key"], &v["window_start"]), "{v}");
            let window = (v["key"].to_string(), v["window_start"].to_string());
            let version = v["version"].as_i64().unwrap();
            let e = held.entry(window).or_insert((0, version));
            if seq > e.0 {
                *e = (seq, version);
            }
        }
    }
    (held, seen)
}

fn status(base: &str) -> Value {
    serde_json::from_str(&get(&format!("{base}/v1/pipelines/paid/status"))).unwrap()
}

/// Waits until every destination has delivered the whole stream and the
/// stream stayed the same for a second.
fn wait_delivered(base: &str, destinations: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut steady_since: Option<(i64, Instant)> = None;
    loop {
        let s = status(base);
        let ds = s["destinations"].as_array().cloned().unwrap_or_default();
        let head = ds.first().map_or(-1, |d| d["head"].as_i64().unwrap_or(-1));
        // The pipeline read everything (on Kafka: once this worker holds both partitions).
        let read_all = s["partitions"].as_array().is_some_and(|p| p.len() == 2) && s["lag_records"] == 0;
        let done = read_all
            && ds.len() == destinations
            && head > 0
            && ds.iter().all(|d| d["state"] == "caught up" && d["position"].as_i64() == Some(head + 1));
        if done {
            match steady_since {
                Some((h, since)) if h == head && since.elapsed() > Duration::from_secs(1) => return,
                Some((h, _)) if h == head => {}
                _ => steady_since = Some((head, Instant::now())),
            }
        } else {
            steady_since = None;
        }
        assert!(Instant::now() < deadline, "{what}: destinations did not catch up: {}", s["destinations"]);
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Posts `lines` in batches of 500, each with its own `Idempotency-Key`,
/// retried until acknowledged (the server may be down); `pause` between
/// batches. On Kafka a key whose first request a kill cut short is refused
/// (409: whether its events reached Kafka is not known): the batch goes
/// again under a new key, and the contract's `[dedup]` counts each payment once.
fn produce(base: &Arc<Mutex<String>>, lines: &[String], tag: &str, pause: Duration) {
    for (b, batch) in lines.chunks(500).enumerate() {
        let body = batch.join("\n") + "\n";
        let mut key = format!("{tag}-{b}");
        loop {
            let url = format!("{}/v1/topics/payments/events", base.lock().unwrap());
            let sent = authed(common::agent().post(&url), "POST", &url).header("idempotency-key", &key).send(&body);
            match sent {
                Ok(r) if r.status().as_u16() == 200 => break,
                Ok(mut r) if r.status().as_u16() == 409 => {
                    if r.body_mut().read_to_string().unwrap_or_default().contains("cut short") {
                        key.push_str("-again");
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        }
        std::thread::sleep(pause);
    }
}

/// A day later, a payment per account: every window before settles.
fn flush(accounts: usize) -> Vec<String> {
    (0..accounts)
        .map(|a| {
            format!(
                r#"{{"payment_id":"flush-{a}","account_id":"acct-{a:05}","amount":0.00,"currency":"EUR","status":"approved","approved_at":"2026-12-31T00:00:00.000Z"}}"#
            )
        })
        .collect()
}

/// `events` payments over `accounts`, `rate` a second of event time.
fn payments(dir: &Scratch, (events, rate): (u64, u64), seed: u64, accounts: u64) -> Vec<String> {
    let input = dir.path("in.jsonl");
    let gen = weir(&[
        &"gen",
        &"payments",
        &"--events",
        &events.to_string(),
        &"--seed",
        &seed.to_string(),
        &"--accounts",
        &accounts.to_string(),
        &"--profile",
        &"bench",
        &"--rate",
        &rate.to_string(),
        &"--output",
        &input,
    ]);
    assert!(gen.status.success(), "{}", text(&gen.stderr));
    std::fs::read_to_string(&input).unwrap().lines().map(str::to_owned).collect()
}

/// `(key, window_start)` of a row as the tables write them: the key's text
/// and the window start in milliseconds.
fn window_of(row: &Value) -> (String, Option<i64>) {
    let key = match &row["key"]["account_id"] {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let start = row["window_start"].as_str().and_then(weir_engine::time::parse_rfc3339_ms);
    (key, start)
}

/// The upsert table: per key and window, its `seq`, status, revision and values as text.
fn upsert_table(c: &mut postgres::Client, schema: &str) -> BTreeMap<(String, Option<i64>), (i64, String)> {
    let rows = c
        .query(
            &format!(
                "SELECT account_id, (extract(epoch from window_start) * 1000)::bigint, seq,
                        status || ' ' || revision || ' ' || coalesce(revenue::text, 'null') || ' ' || payments || ' ' || events
                   FROM {schema}.paid"
            ),
            &[],
        )
        .unwrap();
    rows.into_iter().map(|r| ((r.get(0), r.get(1)), (r.get(2), r.get(3)))).collect()
}

fn published(row: &Value) -> String {
    let revenue = match &row["values"]["revenue"] {
        Value::Null => "null".to_owned(),
        v => v.to_string(),
    };
    format!(
        "{} {} {} {} {}",
        row["status"].as_str().unwrap(),
        row["revision"],
        revenue,
        row["values"]["payments"],
        row["events"]
    )
}

/// Numbers written as Postgres `numeric` text (`12.50`) and as JSON (`12.5`) compare by value.
fn same_values(a: &str, b: &str) -> bool {
    let parse = |s: &str| s.split(' ').map(|w| w.parse::<f64>().map_err(|_| w.to_owned())).collect::<Vec<_>>();
    parse(a) == parse(b)
}

#[test]
fn kill_9_twenty_times_while_delivering_loses_nothing_and_applies_nothing_twice() {
    // Small batches, so the receiver (60 ms an answer) falls behind and
    // batches of whole windows are sent while it catches up.
    const BATCH: i64 = 50;
    let seed: u64 = std::env::var("WEIR_DEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(40);
    for topology in Topology::both("destinations") {
        let name = if matches!(topology, Topology::Embedded) { "embedded" } else { "kafka" };
        eprintln!("destinations kill test on the {} (seed {seed})", topology.name());
        let dir = Scratch::new("destinations");
        let tables = Tables::new(name);
        let stream = Stream::of(&topology);
        let accounts = Arc::new(Mutex::new(Accounts {
            answer_after: Duration::from_millis(60),
            window: BATCH,
            ..Accounts::default()
        }));
        let receiver = account_service(Arc::clone(&accounts));
        let root = topology.folder(
            &dir,
            "server",
            &[("paid.toml", &with_kafka(contract(Some(&tables), BATCH as usize)).0)],
            &config(&topology, &receiver, Some(&stream)),
        );
        let lines = payments(&dir, (50_000, 50), seed, 300);
        let (server, base) = topology.serve(&root);
        let server = Arc::new(Mutex::new(server));
        let base = Arc::new(Mutex::new(base));

        // No row of the upsert table ever goes back to an older change.
        let watching = Arc::new(AtomicBool::new(true));
        let watcher = {
            let (watching, schema) = (Arc::clone(&watching), tables.0.clone());
            std::thread::spawn(move || {
                let mut seen: BTreeMap<(String, Option<i64>), i64> = BTreeMap::new();
                let mut client = postgres::Client::connect(&postgres_url(), postgres::NoTls).unwrap();
                let (mut samples, mut backwards) = (0, Vec::new());
                while watching.load(Ordering::SeqCst) {
                    let exists: bool = client
                        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&format!("{schema}.paid")])
                        .unwrap()
                        .get(0);
                    if exists {
                        for (window, (seq, _)) in upsert_table(&mut client, &schema) {
                            let before = seen.insert(window.clone(), seq).unwrap_or(0);
                            if seq < before {
                                backwards.push(format!("{window:?}: seq {seq} after {before}"));
                            }
                        }
                        samples += 1;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                (samples, backwards)
            })
        };

        // 20 kills while events arrive and rows are delivered: the events go
        // in 100 batches, and after every fifth the server is killed as soon
        // as the receiver has applied a batch and not yet answered (or after
        // 30 s without one). Every other time the receiver first answers 503
        // while five batches go in, so the destination has a backlog, and
        // the kill lands on its second batch applied after that: a whole
        // window of seqs, sent without a `pending` record.
        let (mut kills, mut mid_delivery) = (0, 0);
        for (b, batch) in lines.chunks(500).enumerate() {
            if b % 10 == 5 {
                accounts.lock().unwrap().unavailable = true;
            }
            produce(&base, batch, &format!("dest-{seed}-{b}"), Duration::ZERO);
            if b % 5 != 4 {
                continue;
            }
            if b % 10 == 9 {
                let base = base.lock().unwrap().clone();
                let waited = Instant::now();
                while waited.elapsed() < Duration::from_secs(20) {
                    let s = status(&base);
                    let lag = s["destinations"].as_array().into_iter().flatten().find(|d| d["name"] == "accounts");
                    if lag.is_some_and(|d| d["lag_changes"].as_i64().unwrap_or(0) >= 4 * BATCH) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                let since = {
                    let mut a = accounts.lock().unwrap();
                    a.unavailable = false;
                    a.applied_batches
                };
                let waited = Instant::now();
                while accounts.lock().unwrap().applied_batches < since + 2 && waited.elapsed() < Duration::from_secs(40)
                {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            let waited = Instant::now();
            while !accounts.lock().unwrap().answering && waited.elapsed() < Duration::from_secs(30) {
                std::thread::sleep(Duration::from_millis(1));
            }
            let mut s = server.lock().unwrap();
            mid_delivery += usize::from(accounts.lock().unwrap().answering);
            s.child.kill().unwrap();
            s.child.wait().unwrap();
            kills += 1;
            let (next, next_base) = topology.serve(&root);
            *s = next;
            *base.lock().unwrap() = next_base;
        }
        let base = base.lock().unwrap().clone();
        produce(&Arc::new(Mutex::new(base.clone())), &flush(300), "flush", Duration::ZERO);
        wait_delivered(&base, with_kafka(contract(Some(&tables), BATCH as usize)).1, topology.name());
        watching.store(false, Ordering::SeqCst);
        let (samples, backwards) = watcher.join().unwrap();
        eprintln!("{}: {kills} kills, {mid_delivery} mid-delivery, {samples} samples of the table", topology.name());
        assert!(mid_delivery >= 15, "most kills land between a receiver's apply and its answer: {mid_delivery}");
        assert!(samples > 10, "the table was watched");
        assert!(backwards.is_empty(), "rows went back to older changes: {backwards:?}");

        let changes = json_lines(&get(&format!("{base}/v1/pipelines/paid/changes?limit=100000")));
        let results = json_lines(&get(&format!("{base}/v1/pipelines/paid/results?limit=100000")));
        assert!(results.len() > 1000, "{} rows", results.len());

        // The account service applied every change once, and holds the latest of each window.
        let a = accounts.lock().unwrap();
        let seqs: BTreeSet<i64> = changes.iter().map(|c| c["seq"].as_i64().unwrap()).collect();
        let twice: Vec<_> = a.applied.iter().filter(|(_, n)| **n != 1).collect();
        assert!(twice.is_empty(), "changes applied more than once: {twice:?}");
        let applied: BTreeSet<i64> = a.applied.keys().copied().collect();
        assert_eq!(applied, seqs, "the receiver applied exactly the change stream");
        assert!(a.backwards.is_empty(), "{:?}", a.backwards);
        for r in &results {
            let window = (r["key"].to_string(), r["window_start"].to_string());
            assert_eq!(a.windows.get(&window), r["seq"].as_i64().as_ref(), "{r}");
        }
        eprintln!(
            "{}: {} batches sent again and not applied twice, {} of them whole windows sent without a pending record",
            topology.name(),
            a.repeated,
            a.repeated_whole
        );
        // A kill landed between the receiver's apply and weir's record of the delivery.
        assert!(a.repeated >= 1, "no kill landed mid-delivery");
        // And a batch that was never recorded (a whole window, while catching up) was rebuilt
        // after a kill under the same key: its window read the same.
        assert!(a.repeated_whole >= 1, "no whole window was sent again after a kill");
        drop(a);

        // The upsert table equals the published rows, typed.
        let mut client = tables.client();
        let table = upsert_table(&mut client, &tables.0);
        assert_eq!(table.len(), results.len(), "one table row per published row");
        for r in &results {
            let (seq, values) = table.get(&window_of(r)).unwrap_or_else(|| panic!("not in the table: {r}"));
            assert_eq!(Some(*seq), r["seq"].as_i64(), "{r}");
            assert!(same_values(values, &published(r)), "{values} against {r}");
        }
        // The changes table holds every change once.
        let stored: Vec<i64> = client
            .query(&format!("SELECT seq FROM {}.paid_changes ORDER BY seq", tables.0), &[])
            .unwrap()
            .into_iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(stored, seqs.iter().copied().collect::<Vec<_>>());
        let positions: Vec<(String, i64)> = client
            .query(
                &format!("SELECT destination, position FROM {}.weir_destination_positions ORDER BY 1", tables.0),
                &[],
            )
            .unwrap()
            .into_iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let next = seqs.last().unwrap() + 1;
        assert_eq!(positions, [("history".to_owned(), next), ("warehouse".to_owned(), next)]);
        // The topic holds every change at least once, and a consumer applying by seq holds the published rows.
        {
            let (held, seen) = kafka_view(&stream);
            assert!(seqs.is_subset(&seen), "every change is on the topic");
            assert_eq!(held.len(), results.len(), "one window per published row");
            for r in &results {
                let window = (r["key"].to_string(), r["window_start"].to_string());
                assert_eq!(held.get(&window).map(|h| h.0), r["seq"].as_i64(), "{r}");
            }
        }
        drop(server);
    }
}

/// The next `max_destination_lag` notification with this status.
fn alert(notes: &std::sync::mpsc::Receiver<Value>, status: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let note = notes.recv_timeout(left).unwrap_or_else(|_| panic!("no {status} max_destination_lag notification"));
        if note["alert"] == "max_destination_lag" && note["status"] == status {
            return note;
        }
    }
}

#[test]
fn a_refused_batch_stops_the_destination_until_an_operator_resumes_it() {
    for topology in Topology::both("refused") {
        let dir = Scratch::new("refused");
        let accounts = Arc::new(Mutex::new(Accounts::default()));
        let receiver = account_service(Arc::clone(&accounts));
        let (hook, notes) = common::receiver();
        let with_alert = format!("{}\n[alerts]\nmax_destination_lag = \"2s\"\n", contract(None, 50));
        let settings = format!(
            "alert_webhook = \"{hook}\"\nallow_private_webhooks = true\n{}",
            config(&topology, &receiver, None)
        );
        let root = topology.folder(&dir, "server", &[("paid.toml", &with_alert)], &settings);
        let lines = payments(&dir, (2_000, 10), 7, 20);
        let (server, base) = topology.serve(&root);
        let at = Arc::new(Mutex::new(base.clone()));
        produce(&at, &lines[..1_000], "first", Duration::ZERO);
        wait_delivered(&base, 1, topology.name());
        accounts.lock().unwrap().refuse = true;
        produce(&at, &lines[1_000..], "second", Duration::ZERO);
        // The receiver's 400 stops the destination: nothing more is delivered, the owner has an incident.
        let deadline = Instant::now() + Duration::from_secs(60);
        let stopped = loop {
            let s = status(&base);
            let state = s["destinations"][0]["state"].as_str().unwrap_or_default().to_owned();
            if state.starts_with("stopped") {
                break state;
            }
            assert!(Instant::now() < deadline, "{}: the destination did not stop: {s}", topology.name());
            std::thread::sleep(Duration::from_millis(100));
        };
        assert!(stopped.contains("answered 400") && stopped.contains("read-only for maintenance"), "{stopped}");
        let refused_once = accounts.lock().unwrap().refused;
        std::thread::sleep(Duration::from_secs(2));
        assert_eq!(accounts.lock().unwrap().refused, refused_once, "a stopped destination sends nothing");
        let incidents = get(&format!("{base}/v1/pipelines/paid/incidents"));
        assert!(incidents.contains("destination:accounts") && incidents.contains("billing-ops"), "{incidents}");
        // The lag grows while it is stopped: max_destination_lag fires to the owner, and operators see it.
        let fired = alert(&notes, "firing");
        assert_eq!(fired["owner"], "billing-ops", "{fired}");
        assert!(fired["question"].as_str().unwrap().contains("destination accounts"), "{fired}");
        let metrics = get(&format!("{base}/metrics"));
        let stopped_gauge = metrics
            .lines()
            .find(|l| l.starts_with("weir_destination_stopped{") && l.contains("destination=\"accounts\""));
        assert!(stopped_gauge.is_some_and(|l| l.ends_with(" 1")), "{stopped_gauge:?}");
        let tokens = common::tokens_of(&root.join("data"));
        let screen = text(&weir_as(&tokens.reader, &[&"status", &"paid", &"--url", &base]).stdout);
        assert!(screen.contains("destination accounts (http): stopped:"), "{screen}");
        assert!(
            incidents.contains("read-only for maintenance")
                || get(&format!("{base}/v1/pipelines/paid/incidents/1")).contains("read-only for maintenance")
        );

        // The operator resumes it: the refused batch goes again, then the rest.
        accounts.lock().unwrap().refuse = false;
        let resumed = weir_as(
            &tokens.operator,
            &[&"resume", &"paid", &"--destination", &"accounts", &"--why", &"maintenance over", &"--url", &base],
        );
        assert!(resumed.status.success(), "{}", text(&resumed.stderr));
        assert!(text(&resumed.stderr).contains("resumed"), "{}", text(&resumed.stderr));
        // Again: nothing is stopped now (409, nothing done).
        let again = weir_as(
            &tokens.operator,
            &[&"resume", &"paid", &"--destination", &"accounts", &"--why", &"twice", &"--url", &base],
        );
        assert!(!again.status.success() && text(&again.stderr).contains("not stopped"), "{}", text(&again.stderr));
        let audit = call("GET", &format!("{base}/v1/audit"), None).1;
        assert!(audit.contains("resume-destination") && audit.contains("maintenance over"), "{audit}");

        produce(&at, &flush(20), "flush", Duration::ZERO);
        wait_delivered(&base, 1, topology.name());
        let resolved = alert(&notes, "resolved");
        assert_eq!(resolved["alert"], "max_destination_lag", "{resolved}");
        let changes = json_lines(&get(&format!("{base}/v1/pipelines/paid/changes?limit=100000")));
        let a = accounts.lock().unwrap();
        let seqs: BTreeSet<i64> = changes.iter().map(|c| c["seq"].as_i64().unwrap()).collect();
        let applied: BTreeSet<i64> = a.applied.keys().copied().collect();
        assert_eq!(applied, seqs, "{}: every change applied, none skipped", topology.name());
        assert!(a.applied.values().all(|n| *n == 1), "none twice");
        drop(a);
        drop::<Server>(server);
    }
}

#[test]
fn pausing_the_pipeline_holds_every_destination_until_the_resume() {
    for topology in Topology::both("dest_pause") {
        let name = if matches!(topology, Topology::Embedded) { "p_embedded" } else { "p_kafka" };
        let dir = Scratch::new("dest-pause");
        let tables = Tables::new(name);
        let stream = Stream::of(&topology);
        let accounts = Arc::new(Mutex::new(Accounts::default()));
        let receiver = account_service(Arc::clone(&accounts));
        let (c, destinations) = with_kafka(contract(Some(&tables), 100));
        let root = topology.folder(&dir, "server", &[("paid.toml", &c)], &config(&topology, &receiver, Some(&stream)));
        let lines = payments(&dir, (4_000, 10), 5, 20);
        let (server, base) = topology.serve(&root);
        let at = Arc::new(Mutex::new(base.clone()));
        produce(&at, &lines[..2_000], "first", Duration::ZERO);
        wait_delivered(&base, destinations, topology.name());
        let history = || -> i64 {
            let sql = format!("SELECT count(*) FROM {}.paid_changes", tables.0);
            tables.client().query_one(&sql, &[]).unwrap().get(0)
        };
        let pause = call("POST", &format!("{base}/v1/pipelines/paid/pause"), Some(r#"{"why":"bad amounts upstream"}"#));
        assert_eq!(pause.0, 200, "{}", pause.1);
        let (applied, kept, head) =
            (accounts.lock().unwrap().applied.len(), history(), status(&base)["destinations"][0]["head"].clone());

        // Processing goes on while paused; its rows are held, and so is every destination.
        produce(&at, &lines[2_000..], "second", Duration::ZERO);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let s = status(&base);
            if s["events"]["read"].as_u64() >= Some(4_000) && s["lag_records"] == 0 {
                break;
            }
            assert!(Instant::now() < deadline, "{}: the paused pipeline did not read on: {s}", topology.name());
            std::thread::sleep(Duration::from_millis(200));
        }
        std::thread::sleep(Duration::from_millis(1_500));
        let s = status(&base);
        let states: Vec<&str> =
            s["destinations"].as_array().unwrap().iter().filter_map(|d| d["state"].as_str()).collect();
        assert_eq!(states, vec!["held: the pipeline is paused"; destinations], "{}: {s}", topology.name());
        assert_eq!(s["destinations"][0]["head"], head, "{}: no change published while paused", topology.name());
        assert_eq!(accounts.lock().unwrap().applied.len(), applied, "{}: the receiver got nothing", topology.name());
        assert_eq!(history(), kept, "{}: the changes table got nothing", topology.name());

        // The resume publishes the held rows, and every destination delivers them.
        let resume = call("POST", &format!("{base}/v1/pipelines/paid/resume"), Some(r#"{"why":"fixed upstream"}"#));
        assert_eq!(resume.0, 200, "{}", resume.1);
        wait_delivered(&base, destinations, topology.name());
        assert!(accounts.lock().unwrap().applied.len() > applied, "{}", topology.name());
        assert!(history() > kept, "{}", topology.name());
        holds(&stream, &base, &tables, &accounts, 1, "after the resume");
        drop::<Server>(server);
    }
}

fn caught_up(base: &str, version: u32) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let s: Value =
            serde_json::from_str(&get(&format!("{base}/v1/pipelines/paid/status?version={version}"))).unwrap();
        if s["partitions"].as_array().is_some_and(|p| p.len() == 2)
            && s["lag_records"] == 0
            && s["events"]["read"].as_u64() > Some(0)
        {
            return;
        }
        assert!(Instant::now() < deadline, "version {version} did not catch up: {s}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The upsert table and the receiver hold exactly `version`'s published rows.
fn holds(stream: &Stream, base: &str, tables: &Tables, accounts: &Arc<Mutex<Accounts>>, version: u32, what: &str) {
    let results = json_lines(&get(&format!("{base}/v1/pipelines/paid/results?version={version}&limit=100000")));
    assert!(results.len() > 50, "{what}: {} rows", results.len());
    let mut client = tables.client();
    let table = upsert_table(&mut client, &tables.0);
    assert_eq!(table.len(), results.len(), "{what}: one table row per published row of version {version}");
    let versions: Vec<i64> = client
        .query(&format!("SELECT DISTINCT version FROM {}.paid", tables.0), &[])
        .unwrap()
        .into_iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(versions, [i64::from(version)], "{what}");
    for r in &results {
        let (_, values) = table.get(&window_of(r)).unwrap_or_else(|| panic!("{what}: not in the table: {r}"));
        assert!(same_values(values, &published(r)), "{what}: {values} against {r}");
    }
    let a = accounts.lock().unwrap();
    assert_eq!(a.live, if version == 1 && a.live.is_none() { None } else { Some(u64::from(version)) }, "{what}");
    assert_eq!(a.windows.len(), results.len(), "{what}: the receiver holds version {version}'s windows");
    for r in &results {
        let window = (r["key"].to_string(), r["window_start"].to_string());
        assert!(a.windows.contains_key(&window), "{what}: the receiver lacks {r}");
    }
    assert!(a.backwards.is_empty(), "{what}: {:?}", a.backwards);
    drop(a);
    {
        let (held, _) = kafka_view(stream);
        let windows: BTreeSet<(String, String)> =
            results.iter().map(|r| (r["key"].to_string(), r["window_start"].to_string())).collect();
        assert_eq!(held.keys().cloned().collect::<BTreeSet<_>>(), windows, "{what}: the Kafka consumer's windows");
        assert!(
            held.values().all(|(_, v)| *v == i64::from(version)),
            "{what}: the Kafka consumer holds version {version}"
        );
    }
}

#[test]
fn promotes_rollbacks_and_backfills_reach_every_destination() {
    for topology in Topology::both("dest_versions") {
        let name = if matches!(topology, Topology::Embedded) { "v_embedded" } else { "v_kafka" };
        let dir = Scratch::new("dest-versions");
        let tables = Tables::new(name);
        let stream = Stream::of(&topology);
        let accounts = Arc::new(Mutex::new(Accounts::default()));
        let receiver = account_service(Arc::clone(&accounts));
        let (v1, destinations) = with_kafka(contract(Some(&tables), 100));
        // Version 2: two-minute windows and an aggregate more (a new column).
        let v2 = v1.replace("version = 1", "version = 2").replace("size = \"1m\"", "size = \"2m\"").replace(
            "[[aggregate]]\nname = \"payments\"",
            "[[aggregate]]\nname = \"largest\"\nfn = \"max\"\nfield = \"amount\"\n\n[[aggregate]]\nname = \"payments\"",
        );
        let root = topology.folder(&dir, "server", &[("paid.toml", &v1)], &config(&topology, &receiver, Some(&stream)));
        let lines = payments(&dir, (6_000, 10), 11, 40);
        let (server, base) = topology.serve(&root);
        let at = Arc::new(Mutex::new(base.clone()));
        produce(&at, &lines, "v", Duration::ZERO);
        produce(&at, &flush(40), "flush", Duration::ZERO);
        wait_delivered(&base, destinations, topology.name());
        holds(&stream, &base, &tables, &accounts, 1, "version 1 live");

        // Version 2 builds beside it; the destinations go on with version 1's rows.
        drop(server);
        std::fs::write(root.join("contracts/paid.toml"), &v2).unwrap();
        let (server, base) = topology.serve(&root);
        caught_up(&base, 2);
        wait_delivered(&base, destinations, topology.name());
        holds(&stream, &base, &tables, &accounts, 1, "version 2 a candidate");

        let (code, body) = call(
            "POST",
            &format!("{base}/v1/pipelines/paid/promote"),
            Some(r#"{"version":2,"why":"two-minute windows"}"#),
        );
        assert_eq!(code, 200, "{body}");
        wait_delivered(&base, destinations, topology.name());
        holds(&stream, &base, &tables, &accounts, 2, "version 2 promoted");
        let largest: i64 = tables
            .client()
            .query_one(&format!("SELECT count(*) FROM {}.paid WHERE largest IS NOT NULL", tables.0), &[])
            .unwrap()
            .get(0);
        assert!(largest > 0, "version 2's new aggregate is a column of its own");

        let (code, body) =
            call("POST", &format!("{base}/v1/pipelines/paid/rollback"), Some(r#"{"why":"back to one minute"}"#));
        assert_eq!(code, 200, "{body}");
        wait_delivered(&base, destinations, topology.name());
        holds(&stream, &base, &tables, &accounts, 1, "rolled back to version 1");

        // The changes table: every change of both versions, and both entries, once.
        let changes = json_lines(&get(&format!("{base}/v1/pipelines/paid/changes?limit=100000")));
        let stored: Vec<(i64, String)> = tables
            .client()
            .query(&format!("SELECT seq, status FROM {}.paid_changes ORDER BY seq", tables.0), &[])
            .unwrap()
            .into_iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let expected: Vec<(i64, String)> = changes
            .iter()
            .map(|c| (c["seq"].as_i64().unwrap(), c["status"].as_str().unwrap_or("version").to_owned()))
            .collect();
        assert_eq!(stored, expected, "{}", topology.name());
        assert_eq!(stored.iter().filter(|(_, s)| s == "version").count(), 2);

        // A backfill's corrected rows go out like any others: three payments
        // too late for a settled window, then a backfill over it.
        let approved = lines.iter().map(|l| serde_json::from_str::<Value>(l).unwrap());
        let first = approved.into_iter().find(|v| v["status"] == "approved").unwrap();
        let account = first["account_id"].as_str().unwrap().to_owned();
        let t0 = weir_engine::time::parse_rfc3339_ms(first["approved_at"].as_str().unwrap()).unwrap();
        let minute = t0 / 60_000 * 60_000;
        let late: Vec<String> = (0..3)
            .map(|i| {
                format!(
                    r#"{{"payment_id":"late-{i}","account_id":"{account}","amount":100.00,"currency":"EUR","status":"approved","approved_at":"{}"}}"#,
                    weir_engine::time::format_rfc3339_ms(minute + 30_000)
                )
            })
            .collect();
        produce(&Arc::new(Mutex::new(base.clone())), &late, "late", Duration::ZERO);
        let deadline = Instant::now() + Duration::from_secs(60);
        while json_lines(&get(&format!("{base}/v1/pipelines/paid/ledger?reason=too_late"))).len() < 3 {
            assert!(Instant::now() < deadline, "{}: the late payments are not in the ledger", topology.name());
            std::thread::sleep(Duration::from_millis(200));
        }
        let t = weir_engine::time::format_rfc3339_ms;
        let ask = format!(r#"{{"from":"{}","to":"{}","why":"late payments"}}"#, t(minute), t(minute + 60_000));
        let (code, body) = call("POST", &format!("{base}/v1/pipelines/paid/backfill"), Some(&ask));
        assert_eq!(code, 202, "{body}");
        let id = serde_json::from_str::<Value>(&body).unwrap()["backfill"].as_i64().unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let run = loop {
            let run: Value = serde_json::from_str(&get(&format!("{base}/v1/pipelines/paid/backfills/{id}"))).unwrap();
            if run["state"] == "done" || run["state"] == "failed" {
                break run;
            }
            assert!(Instant::now() < deadline, "backfill {id} not done: {run}");
            std::thread::sleep(Duration::from_millis(200));
        };
        assert_eq!(
            (run["state"].as_str(), run["report"]["windows_corrected"].as_u64()),
            (Some("done"), Some(1)),
            "{run}"
        );
        wait_delivered(&base, destinations, topology.name());
        holds(&stream, &base, &tables, &accounts, 1, "after a backfill");
        let results = json_lines(&get(&format!("{base}/v1/pipelines/paid/results?limit=100000")));
        let corrected =
            results.iter().find(|r| r["status"] == "corrected").unwrap_or_else(|| panic!("no corrected row"));
        let seq = corrected["seq"].as_i64().unwrap();
        assert_eq!(window_of(corrected), (account.clone(), Some(minute)), "{corrected}");
        let in_table = upsert_table(&mut tables.client(), &tables.0);
        assert_eq!(in_table[&window_of(corrected)].0, seq, "the upsert table holds the corrected row");
        let history: i64 = tables
            .client()
            .query_one(
                &format!("SELECT count(*) FROM {}.paid_changes WHERE seq = $1 AND status = 'corrected'", tables.0),
                &[&seq],
            )
            .unwrap()
            .get(0);
        assert_eq!(history, 1, "the changes table holds the corrected change once");
        let window = (corrected["key"].to_string(), corrected["window_start"].to_string());
        assert_eq!(accounts.lock().unwrap().windows.get(&window), Some(&seq), "the receiver applied the corrected row");
        {
            let (held, _) = kafka_view(&stream);
            assert_eq!(held.get(&window).map(|h| h.0), Some(seq), "the Kafka consumer holds the corrected row");
        }
        drop::<Server>(server);
    }
}

//! Backfill end to end on the embedded log and SQLite (SPEC.md 9): too-late
//! payments leave settled windows wrong; `weir backfill` publishes a
//! `corrected` row with the next revision for exactly those windows, equal
//! to `weir batch` over the log, names the cause and the amount it
//! carried, and a second backfill over the same range changes nothing. A
//! kill -9 while a backfill runs leaves no half-published run: after the
//! restart the run is done once, and the rows equal an uninterrupted run's.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{call, get, json_lines, start, text, weir, weir_as, Scratch};
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
where = 'status == "approved"'
max_delay = "5s"

[window]
type = "tumbling"
size = "1m"

[dedup]
horizon = "10m"

[[aggregate]]
name = "revenue"
fn = "sum"
field = "amount"

[[aggregate]]
name = "payments"
fn = "count"
"#;

/// 2026-11-01T00:00:00Z
const BASE: i64 = 1_793_491_200_000;

fn at(ms: i64) -> String {
    weir_engine::time::format_rfc3339_ms(ms)
}

fn payment(id: &str, account: &str, amount: &str, time_ms: i64) -> String {
    format!(
        r#"{{"payment_id":"{id}","account_id":"{account}","amount":"{amount}","status":"approved","approved_at":"{}"}}"#,
        at(time_ms)
    )
}

/// `n` payments: 20 accounts, half a second apart with up to 3 s of disorder.
fn payments(first: usize, n: usize) -> Vec<String> {
    (first..first + n)
        .map(|i| {
            let jitter = ((i * 7919) % 6000) as i64 - 3000;
            payment(
                &format!("p{i}"),
                &format!("a{}", i % 20),
                &format!("{}.25", i % 89),
                BASE + i as i64 * 500 + jitter,
            )
        })
        .collect()
}

/// Payments dated in minutes that have settled long before they arrive:
/// three for a1 in minute 2, two for a2 in minute 4.
fn too_late() -> Vec<String> {
    let minute = 60_000;
    vec![
        payment("late1", "a1", "1000.00", BASE + 2 * minute + 1_000),
        payment("late2", "a1", "200.00", BASE + 2 * minute + 2_000),
        payment("late3", "a1", "30.00", BASE + 2 * minute + 3_000),
        payment("late4", "a2", "4.00", BASE + 4 * minute + 4_000),
        payment("late5", "a2", "0.50", BASE + 4 * minute + 5_000),
    ]
}

/// A payment a year on, on every partition: every window settles.
fn flush() -> Vec<String> {
    (0..8).map(|k| payment(&format!("flush{k}"), &format!("flush{k}"), "0", BASE + 366 * 86_400_000)).collect()
}

fn post(base: &str, lines: &[String]) {
    for chunk in lines.chunks(2000) {
        let url = format!("{base}/v1/topics/payments/events");
        let (code, body) = call("POST", &url, Some(&(chunk.join("\n") + "\n")));
        assert_eq!(code, 200, "{body}");
    }
}

/// Waits until `paid` has read `events` and checkpointed.
fn caught_up(base: &str, events: u64) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let s: Value = serde_json::from_str(&get(&format!("{base}/v1/pipelines/paid/status"))).unwrap();
        if s["events"]["read"] == events && s["lag_records"] == 0 && s["checkpoint_age_ms"].as_i64().is_some() {
            std::thread::sleep(Duration::from_millis(300));
            return;
        }
        assert!(Instant::now() < deadline, "paid did not catch up to {events} events: {s}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Rows by (key, window start): (values, events), the flush's left out.
fn by_window(rows: &[Value]) -> BTreeMap<(String, String), (String, u64)> {
    rows.iter()
        .filter(|r| !r["key"]["account_id"].as_str().is_some_and(|a| a.starts_with("flush")))
        .map(|r| {
            (
                (r["key"].to_string(), r["window_start"].as_str().unwrap().to_owned()),
                (r["values"].to_string(), r["events"].as_u64().unwrap()),
            )
        })
        .collect()
}

fn batch(dir: &Scratch, input: &std::path::Path) -> Vec<Value> {
    let file = dir.write("batch.toml", PAID);
    let out = dir.path("batch.jsonl");
    let b = weir(&[&"batch", &file, &"--input", &input, &"--output", &out]);
    assert!(b.status.success(), "{}", text(&b.stderr));
    json_lines(&std::fs::read_to_string(out).unwrap())
}

/// Posts `n` payments, waits until they are read (so both partitions'
/// watermarks are past their windows), then the too-late ones and the flush,
/// and waits again; the file of every event posted, in order.
fn post_payments_then_late_ones(dir: &Scratch, base: &str, n: usize) -> std::path::PathBuf {
    let (first, late, last) = (payments(0, n), too_late(), flush());
    post(base, &first);
    caught_up(base, first.len() as u64);
    post(base, &late);
    post(base, &last);
    let all: Vec<String> = first.iter().chain(&late).chain(&last).cloned().collect();
    caught_up(base, all.len() as u64);
    dir.write("all.jsonl", &(all.join("\n") + "\n"))
}

fn setup(name: &str) -> (Scratch, u16, String) {
    let dir = Scratch::new(name);
    std::fs::create_dir_all(dir.path("contracts")).unwrap();
    dir.write("contracts/paid.toml", PAID);
    dir.write("weir.toml", "[topics.payments]\npartitions = 2\nkey = \"account_id\"\n");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    (dir, port, format!("http://127.0.0.1:{port}"))
}

/// `weir backfill` as an operator; its JSON report.
fn backfill(dir: &Scratch, base: &str, (from, to): (i64, i64), why: &str) -> Value {
    let operator = common::tokens_of(&dir.path("data")).operator;
    let (from, to) = (at(from), at(to));
    let args: [&dyn AsRef<std::ffi::OsStr>; 12] =
        [&"backfill", &"paid", &"--from", &from, &"--to", &to, &"--why", &why, &"--url", &base, &"--format", &"json"];
    let out = weir_as(&operator, &args);
    assert!(out.status.success(), "weir backfill: {}", text(&out.stderr));
    serde_json::from_str(&text(&out.stdout)).unwrap()
}

#[test]
fn a_backfill_corrects_what_too_late_events_left_wrong_and_a_second_changes_nothing() {
    let (dir, port, base) = setup("backfill");
    let _server = start(&dir.0, port);
    let input = post_payments_then_late_ones(&dir, &base, 3000);
    let expected = by_window(&batch(&dir, &input));

    // 1. The too-late payments made two settled windows wrong, and are in the ledger.
    let published = json_lines(&get(&format!("{base}/v1/pipelines/paid/results?limit=100000")));
    let before = by_window(&published);
    let wrong: Vec<_> = expected.iter().filter(|(k, v)| before.get(*k) != Some(*v)).map(|(k, _)| k.clone()).collect();
    assert_eq!(wrong.len(), 2, "{wrong:?}");
    let ledger = json_lines(&get(&format!("{base}/v1/pipelines/paid/ledger?reason=too_late&limit=1000")));
    assert_eq!(ledger.len(), 5, "{ledger:?}");
    let changes_before = json_lines(&get(&format!("{base}/v1/pipelines/paid/changes?limit=100000")));

    // 2. Refusals: a reader may not, a range past what has settled, a backwards range.
    let url = format!("{base}/v1/pipelines/paid/backfill");
    let reader = common::tokens_of(&dir.path("data")).reader;
    let r = common::agent()
        .post(&url)
        .header("authorization", format!("Bearer {reader}"))
        .header("content-type", "application/json")
        .send(&format!(r#"{{"from":"{}","to":"{}","why":"x"}}"#, at(BASE), at(BASE + 3_600_000)))
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    let unsettled = format!(r#"{{"from":"{}","to":"{}","why":"x"}}"#, at(BASE), at(BASE + 367 * 86_400_000));
    let (code, body) = call("POST", &url, Some(&unsettled));
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("have not settled") && body.contains("backfill to at most"), "{body}");
    let backwards = format!(r#"{{"from":"{}","to":"{}","why":"x"}}"#, at(BASE + 60_000), at(BASE));
    let (code, body) = call("POST", &url, Some(&backwards));
    assert_eq!(code, 400, "{body}");
    let (code, body) = call("POST", &url, Some(&format!(r#"{{"from":"{}","to":"{}"}}"#, at(BASE), at(BASE + 60_000))));
    assert_eq!(code, 400, "a backfill without why: {body}");

    // 3. The backfill corrects exactly the two windows, with the cause and its amount.
    let range = (BASE, BASE + 3_600_000);
    let run = backfill(&dir, &base, range, "late payments in minute 2 and 4");
    assert_eq!(run["state"], "done", "{run}");
    let report = &run["report"];
    assert_eq!(report["windows_corrected"], 2, "{report}");
    assert_eq!(report["windows_new"], 0, "{report}");
    assert_eq!(report["difference"]["revenue"], "1234.5", "{report}");
    assert_eq!(report["difference"]["payments"], "5", "{report}");
    assert_eq!(report["causes"]["too_late"]["events"], 5, "{report}");
    assert_eq!(report["causes"]["too_late"]["amounts"]["revenue"], "1234.5", "{report}");
    let in_range = expected.keys().filter(|(_, start)| *start >= at(range.0) && *start < at(range.1)).count();
    assert_eq!(report["windows_checked"], in_range, "{report}");
    let after = json_lines(&get(&format!("{base}/v1/pipelines/paid/results?limit=100000")));
    assert_eq!(by_window(&after), expected, "the rows after the backfill against weir batch over the log");
    let corrected: Vec<&Value> = after.iter().filter(|r| r["status"] == "corrected").collect();
    assert_eq!(corrected.len(), 2);
    for row in &corrected {
        let was =
            published.iter().find(|p| p["key"] == row["key"] && p["window_start"] == row["window_start"]).unwrap();
        assert_eq!(row["revision"].as_u64().unwrap(), was["revision"].as_u64().unwrap() + 1, "{row}");
        // Its provenance names the backfill that published it.
        let prov = get(&format!("{base}/v1/pipelines/paid/results/{}/provenance", row["seq"]));
        assert!(prov.contains(&format!("backfill {}", run["id"])), "{prov}");
    }
    // In the change stream too, at the next seq, and nothing else new.
    let changes = json_lines(&get(&format!("{base}/v1/pipelines/paid/changes?limit=100000")));
    assert_eq!(changes.len(), changes_before.len() + 2);
    let last_seq = changes_before.last().unwrap()["seq"].as_i64().unwrap();
    let new: Vec<i64> = changes[changes_before.len()..].iter().map(|c| c["seq"].as_i64().unwrap()).collect();
    assert_eq!(new, [last_seq + 1, last_seq + 2]);
    assert!(changes[changes_before.len()..].iter().all(|c| c["status"] == "corrected"));
    // Stored and listed.
    let listed: Value = serde_json::from_str(&get(&format!("{base}/v1/pipelines/paid/backfills"))).unwrap();
    assert_eq!(listed["backfills"][0]["id"], run["id"]);
    assert_eq!(listed["backfills"][0]["why"], "late payments in minute 2 and 4");
    // Audited, with the operator's token and why.
    let audit = get(&format!("{base}/v1/audit"));
    let entry = audit.lines().find(|l| l.contains("\"action\":\"backfill\"")).unwrap_or_else(|| panic!("{audit}"));
    let operator_id = common::tokens_of(&dir.path("data")).operator.split('_').nth(1).unwrap().to_owned();
    assert!(entry.contains("late payments in minute 2 and 4") && entry.contains(&operator_id), "{entry}");

    // 4. A second backfill over the same range changes nothing.
    let again = backfill(&dir, &base, range, "again");
    assert_eq!(again["report"]["windows_corrected"], 0, "{again}");
    let changes_again = json_lines(&get(&format!("{base}/v1/pipelines/paid/changes?limit=100000")));
    assert_eq!(changes_again.len(), changes.len());
    // The readable report.
    let operator = common::tokens_of(&dir.path("data")).operator;
    let (from, to) = (at(range.0), at(range.1));
    let out =
        weir_as(&operator, &[&"backfill", &"paid", &"--from", &from, &"--to", &to, &"--why", &"text", &"--url", &base]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(shown.contains("0 corrected") && shown.contains("windows checked"), "{shown}");
}

#[test]
fn a_kill_during_a_backfill_leaves_it_published_once_and_right() {
    let (dir, port, base) = setup("backfill-kill");
    let mut server = start(&dir.0, port);
    let input = post_payments_then_late_ones(&dir, &base, 200_000);
    let expected = by_window(&batch(&dir, &input));
    let changes_before = json_lines(&get(&format!("{base}/v1/pipelines/paid/changes?limit=100000"))).len();

    // Ask, and kill -9 the server as soon as the run is claimed.
    let url = format!("{base}/v1/pipelines/paid/backfill");
    let ask = format!(r#"{{"from":"{}","to":"{}","why":"kill test"}}"#, at(BASE), at(BASE + 30 * 3_600_000));
    let (code, body) = call("POST", &url, Some(&ask));
    assert_eq!(code, 202, "{body}");
    let id = serde_json::from_str::<Value>(&body).unwrap()["backfill"].as_i64().unwrap();
    let one = format!("{base}/v1/pipelines/paid/backfills/{id}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut state = String::new();
    while Instant::now() < deadline {
        state = serde_json::from_str::<Value>(&get(&one)).unwrap()["state"].as_str().unwrap().to_owned();
        if state != "pending" {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    drop(server); // SIGKILL
    assert_eq!(state, "running", "the backfill was not seen running before the kill");

    // After the restart the run is done (taken up again once its lease ran out), once.
    server = start(&dir.0, port);
    let deadline = Instant::now() + Duration::from_secs(90);
    let run = loop {
        let run: Value = serde_json::from_str(&get(&one)).unwrap();
        if run["state"] == "done" || run["state"] == "failed" {
            break run;
        }
        assert!(Instant::now() < deadline, "the backfill was never done after the restart: {run}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(run["state"], "done", "{run}");
    assert_eq!(run["report"]["windows_corrected"], 2, "{run}");
    let after = json_lines(&get(&format!("{base}/v1/pipelines/paid/results?limit=100000")));
    assert_eq!(by_window(&after), expected, "the rows after the backfill against weir batch over the log");
    let changes = json_lines(&get(&format!("{base}/v1/pipelines/paid/changes?limit=100000")));
    assert_eq!(changes.len(), changes_before + 2, "the corrections were published exactly once");
    drop(server);
}

/// The first notification of `alert` the webhook got (`received` keeps
/// the others for later looks).
fn notified(notes: &std::sync::mpsc::Receiver<Value>, received: &mut Vec<Value>, alert: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(i) = received.iter().position(|n| n["alert"] == alert) {
            return received.remove(i);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        received
            .push(notes.recv_timeout(left).unwrap_or_else(|_| panic!("no {alert} notification reached the webhook")));
    }
}

/// The machine's Postgres (`WEIR_TEST_POSTGRES`), as the payments system.
fn postgres_url() -> String {
    std::env::var("WEIR_TEST_POSTGRES").unwrap_or_else(|_| "host=127.0.0.1 user=postgres dbname=test".into())
}

#[test]
fn a_scheduled_reconciliation_corrects_counts_and_alerts_the_owner() {
    let (dir, port, base) = setup("backfill-schedule");
    let (first, late, last) = (payments(0, 3000), too_late(), flush());
    let all: Vec<String> = first.iter().chain(&late).chain(&last).cloned().collect();
    let input = dir.write("all.jsonl", &(all.join("\n") + "\n"));
    let truth = batch(&dir, &input);
    let expected = by_window(&truth);
    // The payments system: a table of revenue per account and minute, with
    // a refund of 50 applied there only (a5, minute 10).
    let schema = format!("weir_test_sor_{}", std::process::id());
    let mut pg = postgres::Client::connect(&postgres_url(), postgres::NoTls).unwrap();
    pg.batch_execute(&format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema};
         CREATE TABLE {schema}.revenue (account TEXT, minute TIMESTAMPTZ, total NUMERIC, count INTEGER);"
    ))
    .unwrap();
    for line in export_of(&truth).iter().skip(1) {
        let c: Vec<&str> = line.split(',').collect();
        let refund = if c[0] == "a5" && c[1] == at(BASE + 10 * 60_000) { " - 50" } else { "" };
        let insert =
            format!("INSERT INTO {schema}.revenue VALUES ('{}', '{}', {}{refund}, {})", c[0], c[1], c[2], c[3]);
        pg.batch_execute(&insert).unwrap();
    }
    // Every 3 s, the windows settled 8783 hours before: once the flush a
    // year on is read, those of the payments' first hour; after each run,
    // its range against the payments system's table.
    let query = format!(
        "SELECT account, minute, total, count FROM {schema}.revenue WHERE minute >= $1::timestamptz AND minute < $2::timestamptz"
    );
    let contract = format!(
        "{PAID}\n[reconcile]\nevery = \"10s\"\ndelay = \"8783h\"\n\n[reconcile.system_of_record]\nconnection = \"payments_system\"\nquery = \"{query}\"\nmap = \"key.account_id=account,window_start=minute,revenue=total,payments=count\"\ntolerance = \"0.001\"\n\n[alerts]\nmax_corrected_windows = 1\n",
    );
    dir.write("contracts/paid.toml", &contract);
    let (hook, notes) = common::receiver();
    // The payments system is read as an account of its own that may only read it.
    let reader = common::topology::record_reader(&[&format!("{schema}.revenue")]);
    dir.write(
        "weir.toml",
        &format!("alert_webhook = \"{hook}\"\nallow_private_webhooks = true\n[topics.payments]\npartitions = 2\nkey = \"account_id\"\n\n[connections.payments_system]\nurl = \"{reader}\"\n"),
    );
    let _server = start(&dir.0, port);
    post(&base, &first);
    // Read before the late payments, so both partitions' watermarks are past their windows.
    caught_up(&base, first.len() as u64);
    post(&base, &late);
    caught_up(&base, (first.len() + late.len()) as u64);
    // The first scheduled run covers the `every` before what had settled
    // then (long ago); each later one goes on from where the last ended.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !get(&format!("{base}/v1/pipelines/paid/backfills")).contains("\"state\":\"done\"") {
        assert!(Instant::now() < deadline, "no scheduled run");
        std::thread::sleep(Duration::from_millis(200));
    }
    post(&base, &last);
    caught_up(&base, all.len() as u64);

    // A later scheduled run corrects the two windows.
    let deadline = Instant::now() + Duration::from_secs(60);
    let run = loop {
        let listed: Value = serde_json::from_str(&get(&format!("{base}/v1/pipelines/paid/backfills"))).unwrap();
        let runs = listed["backfills"].as_array().unwrap().clone();
        assert!(runs.iter().all(|r| r["origin"] == "schedule" && r["who"] == "schedule"), "{runs:?}");
        if let Some(run) = runs.iter().find(|r| r["report"]["windows_corrected"].as_u64() > Some(0)) {
            break run.clone();
        }
        assert!(Instant::now() < deadline, "no scheduled run corrected anything: {runs:?}");
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(run["report"]["windows_corrected"], 2, "{run}");
    assert_eq!(run["report"]["corrected_amount"]["revenue"], "1234.5", "{run}");
    assert_eq!(by_window(&json_lines(&get(&format!("{base}/v1/pipelines/paid/results?limit=100000")))), expected);

    // Counted in /metrics, once the totals are read again.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let metrics = get(&format!("{base}/metrics"));
        let has = |line: &str| metrics.lines().any(|l| l.starts_with(line));
        if has("weir_reconcile_corrected_windows_total{pipeline=\"paid\",messaging_destination_name=\"payments\"} 2")
            && has("weir_reconcile_corrected_amount_total{pipeline=\"paid\",messaging_destination_name=\"payments\",aggregate=\"revenue\"} 1234.5")
        {
            let runs = metrics.lines().find(|l| l.starts_with("weir_reconcile_runs_total") && l.contains("schedule"));
            let n: f64 = runs.and_then(|l| l.rsplit(' ').next()).and_then(|n| n.parse().ok()).unwrap_or(0.0);
            assert!(n >= 1.0, "{runs:?}");
            break;
        }
        assert!(Instant::now() < deadline, "the reconciliation totals are not in /metrics: {metrics}");
        std::thread::sleep(Duration::from_millis(300));
    }

    // The owner is asked why.
    let mut received = Vec::new();
    let note = notified(&notes, &mut received, "max_corrected_windows");
    assert_eq!((note["status"].clone(), note["owner"].clone()), ("firing".into(), "billing-ops".into()), "{note}");
    assert_eq!(note["observed"], "2", "{note}");
    assert!(
        note["question"].as_str().unwrap().starts_with("Why did 2 windows need correcting in the last hour?"),
        "{note}"
    );

    // After the run, the payments system's query: the corrected windows
    // match it now; the refund made there only is unexplained.
    let deadline = Instant::now() + Duration::from_secs(30);
    let checked = loop {
        let listed: Value = serde_json::from_str(&get(&format!("{base}/v1/pipelines/paid/reconciliations"))).unwrap();
        let found = listed["reconciliations"].as_array().unwrap().iter().find(|r| r["verdict"] == "fail").cloned();
        if let Some(r) = found {
            break r;
        }
        assert!(Instant::now() < deadline, "no failed reconciliation with the system of record: {listed}");
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(checked["source"], "system_of_record", "{checked}");
    let report = &checked["report"];
    let windows = (report["windows"]["differing"].clone(), report["windows"]["unexplained"].clone());
    assert_eq!(windows, (1.into(), 1.into()), "{report}");
    assert_eq!(report["totals"]["revenue"]["unexplained"], "-50", "{report}");
    let note = notified(&notes, &mut received, "reconcile_unexplained");
    assert_eq!(note["owner"], "billing-ops");
    pg.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE")).unwrap();
}

/// The payments system's export: one line per account and minute, from
/// `weir batch` over every event (it counts late payments), in CSV.
fn export_of(rows: &[Value]) -> Vec<String> {
    let mut lines = vec!["account,minute,total,count".to_owned()];
    for r in rows.iter().filter(|r| !r["key"]["account_id"].as_str().unwrap().starts_with("flush")) {
        lines.push(format!(
            "{},{},{},{}",
            r["key"]["account_id"].as_str().unwrap(),
            r["window_start"].as_str().unwrap(),
            r["values"]["revenue"],
            r["values"]["payments"]
        ));
    }
    lines
}

#[test]
fn a_reconciliation_against_an_export_finds_each_planted_difference_with_its_cause() {
    let (dir, port, base) = setup("reconcile");
    let (hook, notes) = common::receiver();
    dir.write(
        "weir.toml",
        &format!("alert_webhook = \"{hook}\"\nallow_private_webhooks = true\n[topics.payments]\npartitions = 2\nkey = \"account_id\"\n"),
    );
    let _server = start(&dir.0, port);
    let input = post_payments_then_late_ones(&dir, &base, 3000);
    let mut export = export_of(&batch(&dir, &input));
    // Planted: a refund of 50 applied in the payments system only (a5, minute 10),
    // and a payment weir never saw (a99, minute 3).
    let minute = |m: i64| at(BASE + m * 60_000);
    let refund = export.iter().position(|l| l.starts_with(&format!("a5,{},", minute(10)))).unwrap();
    let cells: Vec<String> = export[refund].split(',').map(str::to_owned).collect();
    let total: f64 = cells[2].parse().unwrap();
    export[refund] = format!("{},{},{:.2},{}", cells[0], cells[1], total - 50.0, cells[3]);
    export.push(format!("a99,{},10.00,1", minute(3)));
    let file = dir.write("payments-export.csv", &(export.join("\n") + "\n"));
    let operator = common::tokens_of(&dir.path("data")).operator;
    let map = "key.account_id=account,window_start=minute,revenue=total,payments=count";
    let args: [&dyn AsRef<std::ffi::OsStr>; 14] = [
        &"reconcile",
        &"paid",
        &"--against",
        &file,
        &"--map",
        &map,
        &"--tolerance",
        &"0.001",
        &"--why",
        &"month-end close",
        &"--url",
        &base,
        &"--format",
        &"json",
    ];
    let out = weir_as(&operator, &args);
    assert_eq!(out.status.code(), Some(1), "unexplained differences exit 1: {}", text(&out.stderr));
    let report: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    let w = &report["windows"];
    assert_eq!(
        (w["differing"].clone(), w["missing_in_weir"].clone(), w["missing_in_export"].clone()),
        (3.into(), 1.into(), 0.into()),
        "{report}"
    );
    assert_eq!(w["unexplained"], 2, "{report}");
    assert_eq!(report["verdict"], "fail");
    let find = |account: &str, m: i64| {
        report["differences"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["key"]["account_id"] == account && d["window_start"] == minute(m))
            .cloned()
            .unwrap_or_else(|| panic!("{account} minute {m}: {report}"))
    };
    // The late payments: explained by the ledger's too_late entries, to the cent.
    let late_a1 = find("a1", 2);
    assert_eq!(late_a1["verdict"], "differing");
    assert_eq!(late_a1["difference"]["revenue"], "1230", "{late_a1}");
    assert_eq!(late_a1["causes"]["too_late"]["events"], 3, "{late_a1}");
    assert_eq!(late_a1["accounted"]["revenue"], "1230", "{late_a1}");
    assert_eq!((late_a1["unexplained"]["revenue"].clone(), late_a1["explained"].clone()), ("0".into(), true.into()));
    assert_eq!(find("a2", 4)["explained"], true);
    // The refund and the payment weir never saw: unexplained.
    let refund = find("a5", 10);
    assert_eq!(
        (refund["verdict"].clone(), refund["explained"].clone()),
        ("differing".into(), false.into()),
        "{refund}"
    );
    assert_eq!(refund["unexplained"]["revenue"], "-50", "{refund}");
    assert!(refund["causes"].as_object().unwrap().is_empty(), "{refund}");
    assert_eq!(find("a99", 3)["verdict"], "missing_in_weir");
    assert_eq!(report["totals"]["revenue"]["accounted"], "1234.5", "{report}");
    assert_eq!(report["totals"]["revenue"]["unexplained"], "-40", "{report}");

    // Stored, readable over HTTP, and audited.
    let id = report["id"].as_i64().unwrap();
    let audit = get(&format!("{base}/v1/audit"));
    assert!(audit.lines().any(|l| l.contains("\"action\":\"reconcile\"") && l.contains("month-end close")), "{audit}");
    let kept: Value = serde_json::from_str(&get(&format!("{base}/v1/pipelines/paid/reconciliations/{id}"))).unwrap();
    assert_eq!(
        (kept["verdict"].clone(), kept["source"].clone(), kept["why"].clone()),
        ("fail".into(), "payments-export.csv".into(), "month-end close".into())
    );
    assert_eq!(kept["report"]["differences"], report["differences"]);
    let listed = get(&format!("{base}/v1/pipelines/paid/reconciliations"));
    assert!(listed.contains(&format!("\"id\":{id}")), "{listed}");
    // The owner is alerted.
    let note = notified(&notes, &mut Vec::new(), "reconcile_unexplained");
    assert_eq!((note["owner"].clone(), note["reconciliation"].clone()), ("billing-ops".into(), id.into()), "{note}");

    // Readable by default.
    let readable: [&dyn AsRef<std::ffi::OsStr>; 12] = [
        &"reconcile",
        &"paid",
        &"--against",
        &file,
        &"--map",
        &map,
        &"--tolerance",
        &"0.001",
        &"--why",
        &"read",
        &"--url",
        &base,
    ];
    let out = weir_as(&operator, &readable);
    assert_eq!(out.status.code(), Some(1));
    let shown = text(&out.stdout);
    assert!(
        shown.contains("3 differing, 1 missing in weir")
            && shown.contains("no cause in the ledger")
            && shown.contains("too_late x3"),
        "{shown}"
    );

    // Within tolerance, it passes (exit 0); bad exports are refused naming the line and column (exit 2).
    let loose: [&dyn AsRef<std::ffi::OsStr>; 12] = [
        &"reconcile",
        &"paid",
        &"--against",
        &file,
        &"--map",
        &map,
        &"--tolerance",
        &"100%",
        &"--why",
        &"loose",
        &"--url",
        &base,
    ];
    let out = weir_as(&operator, &loose);
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
    for (name, body, words) in [
        (
            "no-column.csv",
            "account,minute,total\na1,2026-11-01T00:02:00Z,1\n",
            "line 1: the header has no column `count` (it has account, minute, total)",
        ),
        ("bad-amount.csv", "account,minute,total,count\na1,2026-11-01T00:02:00Z,lots,1\n", "line 2, column `total`"),
        (
            "twice.csv",
            "account,minute,total,count\na1,2026-11-01T00:02:00Z,1,1\na1,2026-11-01T00:02:00Z,2,1\n",
            "line 3: the same key",
        ),
    ] {
        let bad = dir.write(name, body);
        let args: [&dyn AsRef<std::ffi::OsStr>; 10] =
            [&"reconcile", &"paid", &"--against", &bad, &"--map", &map, &"--why", &"bad", &"--url", &base];
        let out = weir_as(&operator, &args);
        assert_eq!(out.status.code(), Some(2), "{name}: {}", text(&out.stderr));
        assert!(text(&out.stderr).contains(words), "{name}: {}", text(&out.stderr));
    }
}

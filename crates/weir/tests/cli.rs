//! The command line as a user meets it: exit codes, messages, files that
//! appear whole or not at all, determinism, reconcile.

mod common;

use common::{repo_root, text, weir, Scratch};

const CONTRACT: &str = r#"[pipeline]
name = "paid_revenue"
version = 1
owner = "billing-ops"
steward = "data-platform"
decision = "Unlock paid features within seconds of payment approval"

[source]
topic = "payments"
event_time = "approved_at"
key = ["account_id"]
event_id = "payment_id"
where = 'status == "approved"'
max_delay = "30s"

[window]
type = "tumbling"
size = "1m"
allowed_lateness = "2m"
late = "revise"

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

fn setup(name: &str, events: u64) -> (Scratch, std::path::PathBuf, std::path::PathBuf) {
    let s = Scratch::new(name);
    let contract = s.write("c.toml", CONTRACT);
    let input = s.path("in.jsonl");
    let gen = weir(&[
        &"gen",
        &"payments",
        &"--events",
        &events.to_string(),
        &"--seed",
        &"7",
        &"--accounts",
        &"50",
        &"--output",
        &input,
    ]);
    assert!(gen.status.success(), "{}", text(&gen.stderr));
    (s, contract, input)
}

#[test]
fn check_summarises_a_good_contract() {
    let s = Scratch::new("check");
    let c = s.write("c.toml", CONTRACT);
    let out = weir(&[&"check", &c]);
    assert!(out.status.success());
    let summary = text(&out.stdout);
    for words in
        ["paid_revenue v1", "account_id", "tumbling, 1m", "revise", "payment_id", "billing-ops", "Unlock paid features"]
    {
        assert!(summary.contains(words), "{words}: {summary}");
    }
}

#[test]
fn a_contract_that_cannot_run_exits_2_naming_file_line_and_key() {
    let s = Scratch::new("bad");
    let c = s.write("bad.toml", &CONTRACT.replace("late = \"revise\"", "late = \"discard\""));
    for cmd in ["check", "run", "batch"] {
        let input = s.write("in.jsonl", "");
        let out = if cmd == "check" { weir(&[&cmd, &c]) } else { weir(&[&cmd, &c, &"--input", &input]) };
        assert_eq!(out.status.code(), Some(2), "{cmd}");
        let err = text(&out.stderr);
        assert!(err.contains("bad.toml:19:") && err.contains("window.allowed_lateness"), "{cmd}: {err}");
    }
}

#[test]
fn weir_check_refuses_a_bad_check_expression_naming_file_line_and_key() {
    let s = Scratch::new("bad-check");
    let checked = format!(
        "{CONTRACT}\n[[check]]\nname = \"revenue_not_negative\"\nseverity = \"error\"\nquestion = \"Negative?\"\nrow = \"values.revenue >=\"\n"
    );
    let line = checked.lines().position(|l| l.starts_with("row = ")).unwrap() + 1;
    let c = s.write("checked.toml", &checked);
    let out = weir(&[&"check", &c]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("checked.toml:{line}:"))
            && err.contains("check[1].row")
            && err.contains("does not parse"),
        "{err}"
    );
}

#[test]
fn bad_arguments_exit_2_and_leave_no_partial_file() {
    let (s, c, input) = setup("args", 100);
    let missing = weir(&[&"run", &c, &"--input", &s.path("nope.jsonl")]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(text(&missing.stderr).contains("cannot read input"), "{}", text(&missing.stderr));
    let nowhere = s.path("no/such/dir/rows.jsonl");
    let out = weir(&[&"run", &c, &"--input", &input, &"--output", &nowhere]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("cannot write"), "{}", text(&out.stderr));
    assert!(!nowhere.exists());
    let unknown = weir(&[&"run", &c, &"--inptu", &input]);
    assert_eq!(unknown.status.code(), Some(2));
}

#[test]
fn run_is_deterministic_and_reports_on_stderr() {
    let (s, c, input) = setup("det", 3_000);
    let (r1, l1, r2, l2) = (s.path("r1"), s.path("l1"), s.path("r2"), s.path("l2"));
    let a = weir(&[&"run", &c, &"--input", &input, &"--output", &r1, &"--ledger", &l1]);
    let b = weir(&[&"run", &c, &"--input", &input, &"--output", &r2, &"--ledger", &l2]);
    assert!(a.status.success() && b.status.success());
    assert_eq!(std::fs::read(&r1).unwrap(), std::fs::read(&r2).unwrap());
    assert_eq!(std::fs::read(&l1).unwrap(), std::fs::read(&l2).unwrap());
    let summary = text(&a.stderr);
    for words in
        ["events read      3000", "filtered", "ledger", "duplicate", "malformed_json", "rows", "settled", "events/s"]
    {
        assert!(summary.contains(words), "{words}: {summary}");
    }
    let rows = std::fs::read_to_string(&r1).unwrap();
    assert!(rows.lines().all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok()));
    assert!(rows.contains("\"status\":\"provisional\"") && rows.contains("\"status\":\"settled\""));
}

#[test]
fn one_thread_and_two_give_the_same_rows_and_ledger() {
    let (s, _, generated) = setup("threads", 20_000);
    let contract =
        s.write("small.toml", &CONTRACT.replace("max_delay = \"30s\"", "max_delay = \"30s\"\nmax_event_bytes = 400"));
    // Lines the engine refuses in each of its first steps, spread over several of the
    // reading thread's batches (4,096 lines or 1 MiB each), one longer than a batch.
    let good = std::fs::read(&generated).unwrap();
    let mut input = Vec::new();
    for (i, line) in good.split(|&b| b == b'\n').filter(|l| !l.is_empty()).enumerate() {
        input.extend_from_slice(line);
        input.extend_from_slice(if i % 997 == 0 { b"\r\n" } else { b"\n" });
        match i % 3001 {
            5 => input.extend_from_slice(b"{\"payment_id\": \"\xff\xfe\", \"amount\": 1}\n"),
            6 => input.extend_from_slice(b"not json\n\n[1, 2]\n"),
            7 => input.extend_from_slice(format!("{{\"pad\": \"{}\"}}\n", "x".repeat(1000)).as_bytes()),
            8 => input.extend_from_slice(format!("{{\"pad\": \"{}\"}}\n", "y".repeat(2 << 20)).as_bytes()),
            _ => {}
        }
    }
    let input_path = s.path("mixed.jsonl");
    std::fs::write(&input_path, &input).unwrap();
    let mut outputs = Vec::new();
    for threads in ["1", "2", "3"] {
        let (rows, ledger) = (s.path(&format!("rows{threads}")), s.path(&format!("ledger{threads}")));
        let out = weir(&[
            &"run",
            &contract,
            &"--input",
            &input_path,
            &"--output",
            &rows,
            &"--ledger",
            &ledger,
            &"--threads",
            &threads,
        ]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        outputs.push((std::fs::read_to_string(&rows).unwrap(), std::fs::read_to_string(&ledger).unwrap()));
        let batch = s.path(&format!("batch{threads}"));
        let out = weir(&[&"batch", &contract, &"--input", &input_path, &"--output", &batch, &"--threads", &threads]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        outputs.push((std::fs::read_to_string(&batch).unwrap(), String::new()));
    }
    let (rows, ledger) = &outputs[0];
    for reason in ["too_large", "malformed_json", "duplicate", "too_late"] {
        assert!(ledger.contains(&format!("\"reason\":\"{reason}\"")), "no {reason} in the ledger");
    }
    assert!(ledger.matches("\"reason\":\"malformed_json\"").count() >= 4 * 6, "each planted line is ledgered");
    assert!(rows.lines().count() > 100, "{} rows", rows.lines().count());
    for (i, (r, l)) in outputs.iter().enumerate().skip(1) {
        let (first_rows, first_ledger) = &outputs[i % 2];
        assert!(r == first_rows, "output {i} differs from the one-thread run's");
        assert!(l == first_ledger, "ledger {i} differs from the one-thread run's");
    }
}

#[test]
fn output_to_a_named_pipe_writes_through_it_and_leaves_it_a_pipe() {
    use std::os::unix::fs::FileTypeExt;
    let (s, c, input) = setup("fifo", 500);
    let (file, pipe) = (s.path("rows"), s.path("pipe"));
    let made = std::process::Command::new("mkfifo").arg(&pipe).status().unwrap();
    assert!(made.success());
    let reader = {
        let pipe = pipe.clone();
        std::thread::spawn(move || std::fs::read(pipe).unwrap())
    };
    let piped = weir(&[&"run", &c, &"--input", &input, &"--output", &pipe]);
    assert!(piped.status.success(), "{}", text(&piped.stderr));
    // Checked before joining: a reader on a replaced pipe would wait forever.
    assert!(std::fs::metadata(&pipe).unwrap().file_type().is_fifo(), "the pipe was replaced by a file");
    let through_pipe = reader.join().unwrap();
    let to_file = weir(&[&"run", &c, &"--input", &input, &"--output", &file]);
    assert!(to_file.status.success());
    assert_eq!(through_pipe, std::fs::read(&file).unwrap());
    assert!(!through_pipe.is_empty());
}

#[test]
fn gen_is_reproducible_and_realistic() {
    let s = Scratch::new("gen");
    let (a, b, c) = (s.path("a"), s.path("b"), s.path("c"));
    for (path, seed) in [(&a, "1"), (&b, "1"), (&c, "2")] {
        assert!(weir(&[&"gen", &"payments", &"--events", &"5000", &"--seed", &seed, &"--output", path])
            .status
            .success());
    }
    let (a, b, c) = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap(), std::fs::read(&c).unwrap());
    assert_eq!(a, b);
    assert_ne!(a, c);
    let text = String::from_utf8(a).unwrap();
    assert_eq!(text.lines().count(), 5000);
    let bad =
        text.lines().filter(|l| serde_json::from_str::<serde_json::Value>(l).map_or(true, |v| !v.is_object())).count();
    assert!(bad > 0 && bad < 100, "a few malformed lines: {bad}");
    assert!(text.contains("\"status\":\"approved\"") && text.contains("\"status\":\"declined\""));
}

#[test]
fn reconcile_reports_matches_and_differences() {
    let (s, c, input) = setup("rec", 4_000);
    let (stream, batch) = (s.path("stream"), s.path("batch"));
    assert!(weir(&[&"run", &c, &"--input", &input, &"--output", &stream]).status.success());
    assert!(weir(&[&"batch", &c, &"--input", &input, &"--output", &batch]).status.success());
    // Very late events count in the batch but not in the stream: the two differ.
    let out = weir(&[&"reconcile", &"--stream", &stream, &"--batch", &batch]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let table = text(&out.stdout);
    assert!(
        table.starts_with("matched ") && table.contains("missing in stream:") && table.contains("account_id"),
        "{table}"
    );
    let json = weir(&[&"reconcile", &"--stream", &stream, &"--batch", &batch, &"--format", &"json"]);
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(report["all_match"], false);
    assert!(report["matched"].as_u64().unwrap() > 0);
    // The batch against itself matches everything.
    let same = weir(&[&"reconcile", &"--stream", &batch, &"--batch", &batch]);
    assert_eq!(same.status.code(), Some(0), "{}", text(&same.stdout));
    let not_rows = s.write("junk", "not json\n");
    assert_eq!(weir(&[&"reconcile", &"--stream", &not_rows, &"--batch", &batch]).status.code(), Some(2));
}

#[test]
fn the_benchmark_contract_in_the_repo_is_valid() {
    let out = weir(&[&"check", &repo_root().join("bench/paid_revenue.toml")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn demo_serves_posts_and_stops_by_itself_with_results_on_disk() {
    let s = Scratch::new("demo");
    let data = s.path("data");
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["demo", "--duration", "4s", "--rate", "500", "--listen", "127.0.0.1:0", "--data"])
        .arg(&data)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Its server takes 4 KiB pages, as `weir serve` does (BENCHMARKS.md, issue 19).
    let small_pages = |status: &str| status.lines().any(|l| l.split_whitespace().eq(["THP_enabled:", "0"]));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    let mut proc_status = String::new();
    while !small_pages(&proc_status) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
        proc_status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap_or_default();
    }
    let out = child.wait_with_output().unwrap();
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(small_pages(&proc_status), "{proc_status}");
    for words in
        ["served at http://127.0.0.1:", "paid_revenue", "current_plan", "accepted_invites", "posted", "stopped after"]
    {
        assert!(err.contains(words), "{words}: {err}");
    }
    // It made one token of each role and printed them; its producer's posts were accepted.
    for role in ["producer", "reader", "raw-reader", "operator", "admin"] {
        let line = err.lines().find(|l| l.trim_start().starts_with(&format!("{role} "))).unwrap_or_default();
        assert!(line.contains(" weir_"), "{role}: {err}");
    }
    assert!(err.contains("/#token=weir_") && !err.contains(", 0 events posted"), "{err}");
    let rows: i64 = rusqlite::Connection::open(data.join("weir.db"))
        .unwrap()
        .query_row("SELECT count(*) FROM changes", [], |r| r.get(0))
        .unwrap();
    assert!(rows > 0, "the demo's pipelines published rows: {err}");
    // Its producer corrects a payment now and then: the ledger says superseded.
    let superseded: i64 = rusqlite::Connection::open(data.join("weir.db"))
        .unwrap()
        .query_row(
            "SELECT count(*) FROM ledger WHERE pipeline = 'paid_revenue' AND reason = 'superseded'
               AND json_extract(entry, '$.superseded_by') IS NOT NULL",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(superseded > 0, "the demo's corrections replaced counted payments: {err}");
    // paid_revenue's http destination: the demo's account service unlocked
    // accounts, and timed new accounts from approval to unlock.
    let unlocked = err.lines().rev().find(|l| l.contains("accounts unlocked")).unwrap_or_default();
    let count: u64 = unlocked
        .split(" accounts unlocked")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(count > 0 && unlocked.contains("p99") && !unlocked.contains("of 0 new accounts"), "{unlocked}");
    // At the end, the payments system's export against paid_revenue: the
    // planted late payment explained by the ledger, the refund made there only unexplained.
    assert!(err.contains("the payments system's export") && err.contains("unexplained"), "{err}");
    let report: String = rusqlite::Connection::open(data.join("weir.db"))
        .unwrap()
        .query_row("SELECT report FROM reconciliations WHERE pipeline = 'paid_revenue'", [], |r| r.get(0))
        .unwrap();
    let report: serde_json::Value = serde_json::from_str(&report).unwrap();
    let differences = report["differences"].as_array().unwrap();
    let late =
        differences.iter().find(|d| d["key"]["account_id"] == "acct-00007" && d["causes"]["too_late"]["events"] == 1);
    assert!(late.is_some_and(|d| d["explained"] == true), "the late payment, explained: {report}");
    let refund: Vec<&serde_json::Value> = differences.iter().filter(|d| d["unexplained"]["revenue"] == "-25").collect();
    assert_eq!(refund.len(), 1, "the refund, unexplained: {report}");
    assert!(data.join("payments-export.csv").exists());
    for file in ["weir.db", "weir.toml", "contracts/paid_revenue.toml", "log/payments/0", "log/invitations/0"] {
        assert!(data.join(file).exists(), "{file}");
    }
    // The results survive the stop: serve the same folder and read them.
    let produce = weir(&[&"results", &"paid_revenue", &"--url", &"http://127.0.0.1:1"]);
    assert_eq!(produce.status.code(), Some(1), "an unreachable server is a clear failure");
    assert!(text(&produce.stderr).contains("cannot reach"), "{}", text(&produce.stderr));
}

#[test]
fn check_refuses_corrections_with_other_aggregates_naming_file_line_and_key() {
    let s = Scratch::new("correct-check");
    let correct = CONTRACT.replace("horizon = \"10m\"", "horizon = \"10m\"\non_conflict = \"correct\"");
    let good = s.write("good.toml", &correct);
    assert!(weir(&[&"check", &good]).status.success());
    let bad = s.write("bad.toml", &correct.replace("fn = \"sum\"", "fn = \"max\""));
    let out = weir(&[&"check", &bad]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("bad.toml:24:") && err.contains("dedup.on_conflict") && err.contains("max"), "{err}");
}

#[test]
fn corrections_run_batch_and_reconcile() {
    let s = Scratch::new("correct-run");
    let contract =
        s.write("c.toml", &CONTRACT.replace("horizon = \"10m\"", "horizon = \"10m\"\non_conflict = \"correct\""));
    let line = |id: &str, account: &str, at: &str, amount: &str, status: &str| {
        format!(
            r#"{{"payment_id":"{id}","account_id":"{account}","approved_at":"2026-11-29T14:{at}Z","amount":{amount},"status":"{status}"}}"#
        )
    };
    let events = [
        line("p1", "a", "00:10", "10.00", "approved"),
        line("p2", "a", "00:20", "5.00", "approved"),
        line("p3", "b", "00:30", "7.00", "approved"),
        // Past 14:01 plus 30 s of delay: [14:00, 14:01) is provisional.
        line("p4", "a", "01:45", "1.00", "approved"),
        // p1's amount corrected, p3 declined (a deletion that empties b's window).
        line("p1", "a", "00:10", "12.50", "approved"),
        line("p3", "b", "00:30", "7.00", "declined"),
    ];
    let input = s.write("in.jsonl", &(events.join("\n") + "\n"));
    let (rows, ledger, batch) = (s.path("rows.jsonl"), s.path("ledger.jsonl"), s.path("batch.jsonl"));
    let run = weir(&[&"run", &contract, &"--input", &input, &"--output", &rows, &"--ledger", &ledger]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert!(text(&run.stderr).contains("superseded 2"), "{}", text(&run.stderr));
    let ledger = std::fs::read_to_string(&ledger).unwrap();
    assert!(ledger.contains(r#""offset":1,"reason":"superseded","event_id":"p1""#), "{ledger}");
    assert!(ledger.contains(r#""superseded_by":5"#) && ledger.contains(r#""superseded_by":6"#), "{ledger}");
    let rows_text = std::fs::read_to_string(&rows).unwrap();
    assert!(rows_text.contains(r#""revenue":17.50,"payments":2},"events":2"#), "{rows_text}");
    assert!(rows_text.contains(r#""key":{"account_id":"b"}"#) && rows_text.contains(r#""events":0"#), "{rows_text}");
    let b = weir(&[&"batch", &contract, &"--input", &input, &"--output", &batch]);
    assert!(b.status.success(), "{}", text(&b.stderr));
    let batch_text = std::fs::read_to_string(&batch).unwrap();
    assert!(!batch_text.contains(r#""account_id":"b""#), "{batch_text}");
    let rec = weir(&[&"reconcile", &"--stream", &rows, &"--batch", &batch]);
    assert_eq!(rec.status.code(), Some(0), "{}{}", text(&rec.stdout), text(&rec.stderr));
}

#[test]
fn a_file_and_standard_input_give_the_same_verdicts_on_events_spelled_otherwise() {
    // Over a file, payloads are remembered by their bytes and an event is
    // read back from the file when its id comes again with other bytes;
    // standard input cannot be read twice, so there the canonical hash alone
    // decides. The verdicts must be the same.
    let (s, _, generated) = setup("respelled", 3_000);
    let good = std::fs::read_to_string(&generated).unwrap();
    let lines: Vec<&str> = good.lines().collect();
    let mut input = String::new();
    for (i, line) in lines.iter().enumerate() {
        input.push_str(line);
        input.push('\n');
        let earlier = lines[i / 2];
        match i % 10 {
            // The same event again, byte for byte.
            3 => input.push_str(&format!("{earlier}\n")),
            // The same event spelled otherwise: members reordered, spaces, escapes.
            5 => {
                // (The generator plants lines that are not objects: those are left alone.)
                let Ok(serde_json::Value::Object(v)) = serde_json::from_str(earlier) else { continue };
                let mut members: Vec<(String, serde_json::Value)> =
                    v.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                members.reverse();
                let body: Vec<String> = members.iter().map(|(k, v)| format!("{:?} : {v}", k)).collect();
                input.push_str(&format!("{{ {} }}\n", body.join(" , ").replace("\"status\"", "\"st\\u0061tus\"")));
            }
            // Another payload under an earlier id.
            7 => input.push_str(&format!("{}\n", earlier.replacen("\"amount\":", "\"amount\":1", 1))),
            _ => {}
        }
    }
    let file = s.write("respelled.jsonl", &input);
    for (name, contract) in [
        ("discard.toml", CONTRACT.to_owned()),
        ("correct.toml", CONTRACT.replace("horizon = \"10m\"", "horizon = \"10m\"\non_conflict = \"correct\"")),
    ] {
        let contract = s.write(name, &contract);
        let mut outputs = Vec::new();
        for from_stdin in [false, true] {
            let (rows, ledger) =
                (s.path(&format!("rows-{name}-{from_stdin}")), s.path(&format!("ledger-{name}-{from_stdin}")));
            let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_weir"));
            cmd.arg("run").arg(&contract).arg("--output").arg(&rows).arg("--ledger").arg(&ledger).arg("--input");
            if from_stdin {
                cmd.arg("-").stdin(std::fs::File::open(&file).unwrap());
            } else {
                cmd.arg(&file);
            }
            let out = cmd.output().unwrap();
            assert!(out.status.success(), "{}", text(&out.stderr));
            outputs.push((std::fs::read_to_string(&rows).unwrap(), std::fs::read_to_string(&ledger).unwrap()));
        }
        let (rows, ledger) = &outputs[0];
        assert!(outputs[1].0 == *rows, "{name}: rows differ between the file and standard input");
        assert!(outputs[1].1 == *ledger, "{name}: ledgers differ between the file and standard input");
        // Exact and respelled copies are duplicates; other payloads conflict or correct.
        let count = |reason: &str| ledger.matches(&format!("\"reason\":\"{reason}\"")).count();
        assert!(count("duplicate") >= 2 * 300 * 9 / 10, "{name}: {} duplicates", count("duplicate"));
        let changed = if name == "correct.toml" { count("superseded") } else { count("duplicate_conflict") };
        assert!(changed >= 300 * 9 / 10, "{name}: {changed} conflicts or corrections");
    }
}

//! `weir serve` with `weir produce` and `weir results`, and a server that
//! refuses to start on a damaged log.

mod common;

use std::time::{Duration, Instant};

use common::{authed, repo_root, start, text, tokens_of, weir, weir_as, Scratch};

fn status(base: &str, pipeline: &str) -> serde_json::Value {
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let url = format!("{base}/v1/pipelines/{pipeline}/status");
    let body = authed(agent.get(&url), "GET", &url).call().unwrap().body_mut().read_to_string();
    serde_json::from_str(&body.unwrap()).unwrap()
}

#[test]
fn produce_results_and_a_refusal_on_a_damaged_log() {
    let s = Scratch::new("serve");
    std::fs::create_dir_all(s.path("contracts")).unwrap();
    let contract = std::fs::read_to_string(repo_root().join("bench/paid_revenue.toml")).unwrap();
    s.write("contracts/paid_revenue.toml", &contract);
    s.write("weir.toml", "[topics.payments]\npartitions = 2\nkey = \"account_id\"\n");
    let input = s.path("in.jsonl");
    let gen = weir(&[
        &"gen",
        &"payments",
        &"--events",
        &"3000",
        &"--seed",
        &"5",
        &"--rate",
        &"20",
        &"--profile",
        &"bench",
        &"--output",
        &input,
    ]);
    assert!(gen.status.success());
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let base = format!("http://127.0.0.1:{port}");
    let mut server = start(&s.0, port);
    let t = tokens_of(&s.path("data"));

    let produced =
        weir_as(&t.producer, &[&"produce", &"--topic", &"payments", &input, &"--url", &base, &"--batch", &"700"]);
    assert!(produced.status.success(), "{}", text(&produced.stderr));
    assert!(text(&produced.stderr).contains("produced 3000 events to payments"), "{}", text(&produced.stderr));
    let bad = s.write("bad.jsonl", "{\"a\":1}\n{oops\n");
    let refused = weir_as(&t.producer, &[&"produce", &"--topic", &"payments", &bad, &"--url", &base]);
    assert_eq!(refused.status.code(), Some(1));
    let err = text(&refused.stderr);
    assert!(err.contains("400") && err.contains("line 2 is not JSON") && err.contains("0 events before"), "{err}");

    let deadline = Instant::now() + Duration::from_secs(30);
    while status(&base, "paid_revenue")["events"]["read"] != 3000
        || status(&base, "paid_revenue")["checkpoint_age_ms"].is_null()
    {
        assert!(Instant::now() < deadline, "not caught up: {}", status(&base, "paid_revenue"));
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(300));
    let json = weir_as(&t.reader, &[&"results", &"paid_revenue", &"--url", &base, &"--format", &"json"]);
    assert!(json.status.success(), "{}", text(&json.stderr));
    let rows: Vec<serde_json::Value> = text(&json.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(!rows.is_empty(), "tumbling windows whose end the watermark passed have rows");
    assert!(rows.iter().all(|r| r["pipeline"] == "paid_revenue" && r["values"]["payments"].as_u64() > Some(0)));
    let table = weir_as(&t.reader, &[&"results", &"paid_revenue", &"--url", &base]);
    let table = text(&table.stdout);
    let header = table.lines().next().unwrap();
    for column in ["key", "window", "status", "rev", "revenue", "payments"] {
        assert!(header.contains(column), "{header}");
    }
    assert!(table.trim_end().ends_with(&format!("{} rows", rows.len())), "{table}");
    let st = weir_as(&t.reader, &[&"status", &"--url", &base]);
    assert!(st.status.success(), "{}", text(&st.stderr));
    let screen = text(&st.stdout);
    for words in [
        "paid_revenue v1",
        "owner billing-ops",
        "events read 3000",
        "lag 0 records",
        "ledger: duplicate",
        "alerts: none",
    ] {
        assert!(screen.contains(words), "{words}: {screen}");
    }
    let paused = weir_as(
        &t.operator,
        &[&"pause", &"paid_revenue", &"--who", &"alice", &"--why", &"checking amounts", &"--url", &base],
    );
    assert!(paused.status.success(), "{}", text(&paused.stderr));
    assert!(text(&paused.stderr).contains("paid_revenue paused"), "{}", text(&paused.stderr));
    assert_eq!(status(&base, "paid_revenue")["paused"], true);
    let resumed = weir_as(
        &t.operator,
        &[&"resume", &"paid_revenue", &"--who", &"alice", &"--why", &"amounts fine", &"--url", &base],
    );
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    assert_eq!(status(&base, "paid_revenue")["paused"], false);
    let noted = weir_as(
        &t.operator,
        &[
            &"annotate",
            &"paid_revenue",
            &"--from",
            &"2026-11-29T00:00:00Z",
            &"--to",
            &"2026-11-29T00:01:00Z",
            &"--note",
            &"test traffic",
            &"--who",
            &"alice",
            &"--url",
            &base,
        ],
    );
    assert!(noted.status.success(), "{}", text(&noted.stderr));
    assert!(text(&noted.stderr).contains("annotation 1 on paid_revenue"), "{}", text(&noted.stderr));
    let replayed =
        weir_as(&t.operator, &[&"replay", &"paid_revenue", &"--who", &"alice", &"--why", &"rebuild", &"--url", &base]);
    assert!(replayed.status.success(), "{}", text(&replayed.stderr));
    let deadline = Instant::now() + Duration::from_secs(30);
    while status(&base, "paid_revenue")["replays"] != 1 {
        assert!(Instant::now() < deadline, "no replay");
        std::thread::sleep(Duration::from_millis(50));
    }
    let missing = weir_as(&t.reader, &[&"status", &"nope", &"--url", &base]);
    assert_eq!(missing.status.code(), Some(1));
    let missing = weir_as(&t.reader, &[&"results", &"nope", &"--url", &base]);
    assert!(text(&missing.stderr).contains("no pipeline \"nope\""), "{}", text(&missing.stderr));

    // The server takes 4 KiB pages (BENCHMARKS.md, issue 19): Linux says so of the process.
    let proc_status = std::fs::read_to_string(format!("/proc/{}/status", server.child.id())).unwrap();
    assert!(proc_status.lines().any(|l| l.split_whitespace().eq(["THP_enabled:", "0"])), "{proc_status}");

    // SIGTERM stops it cleanly (a last checkpoint, exit 0).
    let term = std::process::Command::new("kill").arg("-TERM").arg(server.child.id().to_string()).status().unwrap();
    assert!(term.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let exit = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "weir serve did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(exit.success(), "{exit:?}");
    // Damage a record in the middle of partition 0: the server refuses to start, naming the file.
    let seg = s.path("data/log/payments/0/00000000000000000000.seg");
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[100] ^= 0xff;
    std::fs::write(&seg, &bytes).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(s.path("data"))
        .arg("--contracts")
        .arg(s.path("contracts"))
        .arg("--config")
        .arg(s.path("weir.toml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("the log is damaged at") && err.contains("00000000000000000000.seg"), "{err}");
}

//! The operating loop (issue 18), on both topologies: the embedded log with
//! SQLite, and Kafka with Postgres. A clock that cannot be poisoned: an
//! event dated next year is ledgered `future`, counted in
//! `weir_future_events_total`, and neither settles windows nor makes later
//! events late.

mod common;

use std::time::{Duration, Instant};

use common::topology::Topology;
use common::{call, get, json_lines, Scratch};
use serde_json::Value;

const PAYMENTS: &str = r#"
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
max_future = "5m"

[window]
type = "tumbling"
size = "1m"
late = "discard"

[dedup]
horizon = "1h"

[[aggregate]]
name = "total"
fn = "sum"
field = "amount"
"#;

fn payment(id: &str, t_ms: i64, amount: &str) -> String {
    let t = weir_engine::time::format_rfc3339_ms(t_ms);
    format!(r#"{{"id":"{id}","acct":"a1","t":"{t}","amount":{amount}}}"#)
}

fn post(base: &str, lines: &[String]) {
    let (code, body) = call("POST", &format!("{base}/v1/topics/payments/events"), Some(&(lines.join("\n") + "\n")));
    assert_eq!(code, 200, "{body}");
}

fn status(base: &str) -> Value {
    serde_json::from_str(&get(&format!("{base}/v1/pipelines/paid/status"))).unwrap()
}

/// Waits until the pipeline has read `n` events.
fn wait_read(base: &str, n: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = status(base);
        if s["events"]["read"].as_u64() == Some(n) && s["lag_records"].as_u64() == Some(0) {
            return s;
        }
        assert!(Instant::now() < deadline, "not {n} events read: {s}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A metric's value from `/metrics`.
fn metric(base: &str, name: &str) -> f64 {
    let text = get(&format!("{base}/metrics"));
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']) && l.contains("pipeline=\"paid\""))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

#[test]
fn one_event_dated_next_year_neither_settles_windows_nor_makes_later_events_late() {
    for topology in Topology::both("future") {
        let s = Scratch::new("future");
        let config = topology.config(("payments", 1, "acct"), "");
        let root = topology.folder(&s, "server", &[("paid.toml", PAYMENTS)], &config);
        let (_server, base) = topology.serve(&root);
        let now = weir_log::now_ms();
        let minute = (now - 10 * 60_000) / 60_000 * 60_000; // a minute ten minutes ago
        let next_year = now + 366 * 86_400_000;
        post(&base, &[payment("p1", minute + 10_000, "1.00"), payment("p2", minute + 20_000, "2.00")]);
        post(&base, &[payment("p3", next_year, "100.00")]);
        let s3 = wait_read(&base, 3);
        let watermark = weir_engine::time::parse_rfc3339_ms(s3["watermark"].as_str().unwrap_or_default());
        assert_eq!(watermark, Some(minute + 20_000), "{}: the watermark stays put: {s3}", topology.name());
        // Earlier in the same minute: not late, it counts.
        post(&base, &[payment("p4", minute + 5_000, "4.00")]);
        wait_read(&base, 4);
        let results = get(&format!("{base}/v1/pipelines/paid/results"));
        assert_eq!(results, "", "{}: nothing settled", topology.name());
        // The next minute settles the window with the three payments.
        post(&base, &[payment("p5", minute + 70_000, "8.00")]);
        wait_read(&base, 5);
        let deadline = Instant::now() + Duration::from_secs(30);
        let rows = loop {
            let rows = json_lines(&get(&format!("{base}/v1/pipelines/paid/results")));
            if !rows.is_empty() {
                break rows;
            }
            assert!(Instant::now() < deadline, "{}: no row", topology.name());
            std::thread::sleep(Duration::from_millis(100));
        };
        assert_eq!(rows.len(), 1, "{}: {rows:?}", topology.name());
        assert_eq!(
            (rows[0]["status"].as_str(), rows[0]["events"].as_u64(), rows[0]["late_events"].as_u64()),
            (Some("settled"), Some(3), Some(0)),
            "{}: {rows:?}",
            topology.name()
        );
        assert_eq!(rows[0]["values"]["total"].to_string(), "7.00");
        let ledger = json_lines(&get(&format!("{base}/v1/pipelines/paid/ledger")));
        let reasons: Vec<(&str, &str)> =
            ledger.iter().map(|e| (e["reason"].as_str().unwrap(), e["event_id"].as_str().unwrap())).collect();
        assert_eq!(reasons, [("future", "p3")], "{}", topology.name());
        assert_eq!(status(&base)["ledger"]["future"], 1, "{}", topology.name());
        assert_eq!(metric(&base, "weir_future_events_total"), 1.0, "{}", topology.name());
    }
}

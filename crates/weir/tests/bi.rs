//! Typed views for BI tools (issue 40), read through real clients as an
//! analyst would, on both topologies: `sqlite3` on the embedded store,
//! `psql` and Python's `psycopg` as the role `weir_bi` on Postgres. Each
//! version's view equals its published rows, typed (revenue a decimal,
//! windows times); the pipeline's own view follows the live version through
//! a promote; `weir_bi` is refused weir's own tables (the ledger, raw
//! payloads, the rows' JSON).

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::topology::{postgres_url, Topology};
use common::{authed, call, get, json_lines, Scratch};

const V1: &str = common::PAID;

fn post(base: &str, lines: &[String]) {
    let url = format!("{base}/v1/topics/payments/events");
    let mut r = authed(common::agent().post(&url), "POST", &url).send(&(lines.join("\n") + "\n")).unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.body_mut().read_to_string().unwrap());
}

fn payments() -> Vec<String> {
    let mut out: Vec<String> = (0..600)
        .map(|i| {
            let at = weir_engine::time::format_rfc3339_ms(1_796_000_000_000 + i * 700);
            format!(
                r#"{{"payment_id":"p{i}","account_id":"acct-{}","amount":"{}.{:02}","status":"approved","approved_at":"{at}"}}"#,
                i % 7,
                i % 90,
                i % 100
            )
        })
        .collect();
    for k in 0..8 {
        out.push(format!(
            r#"{{"payment_id":"flush{k}","account_id":"flush{k}","amount":"0","status":"approved","approved_at":"2027-01-01T00:00:00Z"}}"#
        ));
    }
    out
}

/// Waits until `version` has read every event and its settled rows (at
/// least `rows`) stayed the same for a second.
fn settled(base: &str, version: u32, rows: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = (0, Instant::now());
    loop {
        let s: serde_json::Value =
            serde_json::from_str(&get(&format!("{base}/v1/pipelines/paid/status?version={version}"))).unwrap();
        let read_all = s["partitions"].as_array().is_some_and(|p| p.len() == 2) && s["lag_records"] == 0;
        let n = json_lines(&get(&format!(
            "{base}/v1/pipelines/paid/results?version={version}&status=settled&limit=100000"
        )))
        .len();
        if n != last.0 || !read_all {
            last = (n, Instant::now());
        } else if n >= rows && last.1.elapsed() > Duration::from_secs(1) {
            return;
        }
        assert!(Instant::now() < deadline, "version {version}: {n} settled rows: {s}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// What the published rows say, as `account|window start ms|revenue|payments`, sorted.
fn published(base: &str, version: u32) -> Vec<String> {
    let rows = json_lines(&get(&format!("{base}/v1/pipelines/paid/results?version={version}&limit=100000")));
    let mut out: Vec<String> = rows
        .iter()
        .filter(|r| !r["key"]["account_id"].as_str().unwrap().starts_with("flush"))
        .map(|r| {
            let start = weir_engine::time::parse_rfc3339_ms(r["window_start"].as_str().unwrap()).unwrap();
            format!(
                "{}|{start}|{}|{}",
                r["key"]["account_id"].as_str().unwrap(),
                decimal(&r["values"]["revenue"].to_string()),
                r["values"]["payments"]
            )
        })
        .collect();
    out.sort();
    assert!(out.len() > 10, "{out:?}");
    out
}

/// A decimal's text without trailing zeros (`12.50` and `12.5` alike).
fn decimal(text: &str) -> String {
    let t = text.trim_matches('"');
    if t.contains('.') {
        t.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        t.to_owned()
    }
}

fn run(cmd: &mut Command) -> (bool, String, String) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `account|window start ms|revenue|payments` lines of a client's output, sorted, flush rows left out.
fn lines_of(out: &str) -> Vec<String> {
    let mut v: Vec<String> = out
        .lines()
        .filter(|l| !l.starts_with("flush") && !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            format!("{}|{}|{}|{}", f[0], f[1], decimal(f[2]), f[3])
        })
        .collect();
    v.sort();
    v
}

fn sqlite3(db: &std::path::Path, sql: &str) -> String {
    let (ok, out, err) = run(Command::new("sqlite3").arg("-readonly").arg(db).arg(sql));
    assert!(ok, "sqlite3 {sql}: {err}");
    out
}

fn psql(sql: &str) -> (bool, String, String) {
    let url = format!("{} user=weir_bi", postgres_url());
    run(Command::new("psql").arg(&url).args(["-X", "-At", "-v", "ON_ERROR_STOP=1", "-c", sql]))
}

#[test]
fn analysts_read_typed_views_with_sqlite3_psql_and_psycopg() {
    for topology in Topology::both("bi") {
        let dir = Scratch::new("bi");
        let root = topology.folder(
            &dir,
            "server",
            &[("paid.toml", V1)],
            &topology.config(("payments", 2, "account_id"), "checkpoint_interval = \"50ms\""),
        );
        let (server, base) = topology.serve(&root);
        post(&base, &payments());
        settled(&base, 1, 30);
        let expected = published(&base, 1);
        let db = root.join("data/weir.db");
        let (views, live) = match &topology {
            Topology::Embedded => ("paid_v1".to_owned(), "paid".to_owned()),
            Topology::Kafka(_, schema) => (format!("{}_bi.paid_v1", schema.0), format!("{}_bi.paid", schema.0)),
        };
        // Window starts in epoch milliseconds, read from the typed column.
        let query = |view: &str, kafka: bool| {
            match kafka {
            false => format!("SELECT account_id, CAST(strftime('%s', window_start) AS INTEGER) * 1000, revenue, payments FROM {view}"),
            true => format!("SELECT account_id, (extract(epoch FROM window_start) * 1000)::bigint, revenue, payments FROM {view}"),
        }
        };
        match &topology {
            Topology::Embedded => {
                assert_eq!(
                    lines_of(&sqlite3(&db, &query(&views, false))),
                    expected,
                    "sqlite3 against the published rows"
                );
                let typed = sqlite3(&db, &format!("SELECT typeof(revenue), typeof(payments), window_start, status FROM {views} WHERE account_id = 'acct-1' LIMIT 1"));
                assert!(typed.starts_with("real|integer|20") && typed.trim().ends_with("|settled"), "{typed}");
            }
            Topology::Kafka(_, schema) => {
                let (ok, out, err) = psql(&query(&views, true));
                assert!(ok, "psql as weir_bi: {err}");
                assert_eq!(lines_of(&out), expected, "psql against the published rows");
                let (ok, out, err) = psql(&format!(
                    "SELECT pg_typeof(revenue), pg_typeof(payments), pg_typeof(window_start) FROM {views} LIMIT 1"
                ));
                assert!(ok && out.trim() == "numeric|bigint|timestamp with time zone", "{out} {err}");
                for table in ["ledger", "ledger_raw", "results", "changes"] {
                    let (ok, _, err) = psql(&format!("SELECT count(*) FROM {}.{table}", schema.0));
                    assert!(!ok && err.contains("permission denied"), "weir_bi reads {table}: {err}");
                }
                // Python's psycopg, as an analyst's notebook would.
                let script = format!(
                    "import psycopg\nwith psycopg.connect({:?}) as c:\n    rows = c.execute('SELECT revenue FROM {views}').fetchall()\n    print(type(rows[0][0]).__name__, sum(r[0] for r in rows if r[0] is not None))",
                    format!("{} user=weir_bi", postgres_url())
                );
                let (ok, out, err) = run(Command::new("/usr/bin/python3").arg("-c").arg(&script));
                assert!(ok, "psycopg: {err}");
                let total: rust_decimal::Decimal = published(&base, 1)
                    .iter()
                    .map(|l| l.split('|').nth(2).unwrap().parse::<rust_decimal::Decimal>().unwrap())
                    .sum();
                let (kind, sum) = out.trim().split_once(' ').unwrap();
                assert_eq!(kind, "Decimal", "{out}");
                assert_eq!(sum.parse::<rust_decimal::Decimal>().unwrap(), total, "{out}");
            }
        }

        // Version 2 (two-minute windows) promoted: the pipeline's view follows it.
        drop(server);
        std::fs::write(
            root.join("contracts/paid.toml"),
            V1.replace("version = 1", "version = 2").replace("\"1m\"", "\"2m\""),
        )
        .unwrap();
        let (server, base) = topology.serve(&root);
        settled(&base, 2, 15);
        let (code, body) =
            call("POST", &format!("{base}/v1/pipelines/paid/promote"), Some(r#"{"version":2,"why":"finance asked"}"#));
        assert_eq!(code, 200, "{body}");
        let v2 = published(&base, 2);
        let live_rows = match &topology {
            Topology::Embedded => lines_of(&sqlite3(&db, &query(&live, false))),
            Topology::Kafka(..) => {
                let (ok, out, err) = psql(&query(&live, true));
                assert!(ok, "{err}");
                lines_of(&out)
            }
        };
        assert_eq!(live_rows, v2, "{}: the pipeline's view is the live version's", topology.name());
        let v1_again = match &topology {
            Topology::Embedded => lines_of(&sqlite3(&db, &query(&views, false))),
            Topology::Kafka(..) => lines_of(&psql(&query(&views, true)).1),
        };
        assert_eq!(v1_again, expected, "version 1's view keeps its rows");
        drop(server);
    }
}

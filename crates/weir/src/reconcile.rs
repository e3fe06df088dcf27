//! `weir reconcile`: the stream's last row of every key and window against
//! the batch rows. Numbers compare by value (`12.5` equals `12.50`). A
//! stream row that withdraws its window (`retracted`, or `events` 0 after
//! corrections took every version out of it) stands for no row, as the
//! batch has none.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::Path;

use rust_decimal::Decimal;
use serde_json::{json, Value};

use crate::run::open_input;
use crate::Failure;

type GroupKey = (String, String);

struct Side {
    rows: BTreeMap<GroupKey, Value>,
}

fn read_rows(path: &Path, last_wins: bool) -> Result<Side, Failure> {
    let input = open_input(path)?;
    let mut rows = BTreeMap::new();
    for (i, line) in input.lines().enumerate() {
        let line = line.map_err(|e| Failure::run(anyhow::anyhow!("cannot read {}: {e}", path.display())))?;
        if line.trim().is_empty() {
            continue;
        }
        let row: Value = serde_json::from_str(&line).map_err(|e| {
            Failure::usage(format!(
                "{}:{}: not a result row ({e}); pass the output of `weir run` or `weir batch`",
                path.display(),
                i + 1
            ))
        })?;
        let (Some(key), Some(start)) = (row.get("key"), row.get("window_start")) else {
            return Err(Failure::usage(format!(
                "{}:{}: a result row needs `key` and `window_start`; pass the output of `weir run` or `weir batch`",
                path.display(),
                i + 1
            )));
        };
        let group = (key.to_string(), start.as_str().unwrap_or("(global)").to_owned());
        if last_wins || !rows.contains_key(&group) {
            rows.insert(group, row);
        }
    }
    Ok(Side { rows })
}

fn same(a: Option<&Value>, b: Option<&Value>) -> bool {
    match (a, b) {
        (Some(Value::Number(x)), Some(Value::Number(y))) => {
            let (x, y) = (x.to_string(), y.to_string());
            match (parse_number(&x), parse_number(&y)) {
                (Some(p), Some(q)) => p == q || close(&p, &q),
                _ => x == y,
            }
        }
        (a, b) => a == b,
    }
}

fn parse_number(text: &str) -> Option<Decimal> {
    if text.contains(['e', 'E']) {
        Decimal::from_scientific(text).ok()
    } else {
        text.parse().ok()
    }
}

/// Averages may be written with different numbers of digits: 1e-12 relative.
fn close(a: &Decimal, b: &Decimal) -> bool {
    let diff = (*a - *b).abs();
    let scale = a.abs().max(b.abs());
    diff <= scale * Decimal::new(1, 12)
}

/// One line for the demo: how many windows match and differ.
pub fn reconcile_summary(stream: &Path, batch: &Path) -> Result<String, Failure> {
    let report = compare(stream, batch)?;
    Ok(format!(
        "matched {}, differing {}, missing in stream {}, missing in batch {}",
        report.matched,
        report.differing.len(),
        report.missing_in_stream.len(),
        report.missing_in_batch.len()
    ))
}

struct Report {
    matched: u64,
    unsettled: u64,
    differing: Vec<Value>,
    missing_in_stream: Vec<Value>,
    missing_in_batch: Vec<Value>,
}

pub fn reconcile(stream: &Path, batch: &Path, as_json: bool) -> Result<(), Failure> {
    let Report { matched, unsettled, differing, missing_in_stream, missing_in_batch } = compare(stream, batch)?;
    let all_match = differing.is_empty() && missing_in_stream.is_empty() && missing_in_batch.is_empty();
    if as_json {
        let brief = |rows: &[Value]| -> Vec<Value> {
            rows.iter().map(|r| json!({"key": r.get("key"), "window_start": r.get("window_start"), "window_end": r.get("window_end"), "values": r.get("values"), "events": r.get("events")})).collect()
        };
        let report = json!({
            "matched": matched,
            "differing": differing,
            "missing_in_stream": brief(&missing_in_stream),
            "missing_in_batch": brief(&missing_in_batch),
            "unsettled_in_stream": unsettled,
            "all_match": all_match,
        });
        println!("{report}");
    } else {
        print_table(matched, unsettled, &differing, &missing_in_stream, &missing_in_batch);
    }
    if all_match {
        Ok(())
    } else {
        Err(Failure { code: 1, message: String::new() })
    }
}

/// A stream row that says its window holds nothing: a retracted session, or
/// a window whose every version a correction moved away or deleted.
fn withdrawn(row: &Value) -> bool {
    row.get("status").and_then(Value::as_str) == Some("retracted")
        || row.get("events").and_then(Value::as_u64) == Some(0)
}

fn compare(stream: &Path, batch: &Path) -> Result<Report, Failure> {
    let stream = read_rows(stream, true)?;
    let batch = read_rows(batch, true)?;
    let mut matched = 0u64;
    let mut unsettled = 0u64;
    let mut differing = Vec::new();
    let mut missing_in_stream = Vec::new();
    let mut missing_in_batch = Vec::new();
    for (group, b) in &batch.rows {
        let Some(s) = stream.rows.get(group).filter(|s| !withdrawn(s)) else {
            missing_in_stream.push(b.clone());
            continue;
        };
        if s.get("status").and_then(Value::as_str) != Some("settled") {
            unsettled += 1;
        }
        let mut diffs = Vec::new();
        let (sv, bv) = (s.get("values"), b.get("values"));
        let mut names: Vec<String> = Vec::new();
        for values in [sv, bv].into_iter().flatten() {
            if let Some(map) = values.as_object() {
                for name in map.keys() {
                    if !names.contains(name) {
                        names.push(name.clone());
                    }
                }
            }
        }
        for name in &names {
            let (x, y) = (sv.and_then(|v| v.get(name)), bv.and_then(|v| v.get(name)));
            if !same(x, y) {
                diffs.push(json!({"field": name, "stream": x, "batch": y}));
            }
        }
        for field in ["events", "window_end"] {
            if !same(s.get(field), b.get(field)) {
                diffs.push(json!({"field": field, "stream": s.get(field), "batch": b.get(field)}));
            }
        }
        if diffs.is_empty() {
            matched += 1;
        } else {
            differing.push(json!({
                "key": b.get("key"), "window_start": b.get("window_start"), "window_end": b.get("window_end"),
                "stream_status": s.get("status"), "stream_revision": s.get("revision"), "differences": diffs,
            }));
        }
    }
    for (group, s) in &stream.rows {
        if !batch.rows.contains_key(group) && !withdrawn(s) {
            missing_in_batch.push(s.clone());
        }
    }
    Ok(Report { matched, unsettled, differing, missing_in_stream, missing_in_batch })
}

fn cell(v: Option<&Value>) -> String {
    match v {
        None => "-".into(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

fn print_table(
    matched: u64,
    unsettled: u64,
    differing: &[Value],
    missing_in_stream: &[Value],
    missing_in_batch: &[Value],
) {
    println!(
        "matched {matched}, differing {}, missing in stream {}, missing in batch {}",
        differing.len(),
        missing_in_stream.len(),
        missing_in_batch.len()
    );
    if unsettled > 0 {
        println!("note: {unsettled} stream rows compared were not yet settled");
    }
    if !differing.is_empty() {
        let mut lines =
            vec![["key".to_string(), "window_start".into(), "field".into(), "stream".into(), "batch".into()]];
        for d in differing {
            let key = cell(d.get("key"));
            let start = cell(d.get("window_start"));
            for (i, diff) in d["differences"].as_array().into_iter().flatten().enumerate() {
                let (k, s) = if i == 0 { (key.clone(), start.clone()) } else { (String::new(), String::new()) };
                lines.push([k, s, cell(diff.get("field")), cell(diff.get("stream")), cell(diff.get("batch"))]);
            }
        }
        println!();
        print_columns(&lines);
    }
    for (title, rows) in [("missing in stream", missing_in_stream), ("missing in batch", missing_in_batch)] {
        if rows.is_empty() {
            continue;
        }
        println!("\n{title}:");
        let mut lines =
            vec![["key".to_string(), "window_start".into(), "events".into(), "values".into(), String::new()]];
        for r in rows {
            lines.push([
                cell(r.get("key")),
                cell(r.get("window_start")),
                cell(r.get("events")),
                cell(r.get("values")),
                String::new(),
            ]);
        }
        print_columns(&lines);
    }
}

fn print_columns(lines: &[[String; 5]]) {
    let widths: Vec<usize> = (0..5).map(|c| lines.iter().map(|l| l[c].chars().count()).max().unwrap_or(0)).collect();
    for line in lines {
        let mut out = String::new();
        for (c, text) in line.iter().enumerate() {
            out.push_str(text);
            if c < 4 {
                out.push_str(&" ".repeat(widths[c] - text.chars().count() + 2));
            }
        }
        println!("{}", out.trim_end());
    }
}

//! Every case in ../shared/conformance, ../shared/conformance-next (the
//! newer rules: the rule first, event-time formats, corrections) and
//! ../shared/conformance-pending (rules SPEC.md states that a release had
//! not yet followed: which windows a correction touches, 3.3), compared
//! the way their README says: rows grouped by key and window start, in
//! order, by status, revision, events, late events, window end and values
//! (numbers by value, averages to 1e-9 relative); the ledger as a multiset
//! of (offset, reason, window_start, first_offset, superseded_by).

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{repo_root, text, weir, Scratch};
use rust_decimal::Decimal;
use serde_json::Value;

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: {e}: {l}", path.display())))
        .collect()
}

fn number(v: &Value) -> Option<Decimal> {
    let Value::Number(n) = v else { return None };
    let t = n.to_string();
    if t.contains(['e', 'E']) {
        Decimal::from_scientific(&t).ok()
    } else {
        t.parse().ok().or_else(|| {
            // More digits than a Decimal holds: keep 27 significant digits.
            let (int, frac) = t.split_once('.').unwrap_or((&t, ""));
            let keep = 27usize.saturating_sub(int.trim_start_matches('-').len());
            format!("{int}.{}", &frac[..frac.len().min(keep)]).parse().ok()
        })
    }
}

fn same_value(a: &Value, b: &Value) -> bool {
    match (number(a), number(b)) {
        (Some(x), Some(y)) => {
            let diff = (x - y).abs();
            diff == Decimal::ZERO || diff <= y.abs() * Decimal::new(1, 9)
        }
        _ => a == b,
    }
}

fn compare_rows(got: &[Value], want: &[Value]) -> Vec<String> {
    let group = |rows: &[Value]| {
        let mut g: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        for r in rows {
            g.entry(format!("{} {}", r["key"], r["window_start"])).or_default().push(r.clone());
        }
        g
    };
    let (got, want) = (group(got), group(want));
    let mut problems = Vec::new();
    for id in got.keys().chain(want.keys()).collect::<std::collections::BTreeSet<_>>() {
        let (g, w) = (got.get(id).cloned().unwrap_or_default(), want.get(id).cloned().unwrap_or_default());
        if g.len() != w.len() {
            problems.push(format!("{id}: {} rows, want {}", g.len(), w.len()));
            continue;
        }
        for (a, b) in g.iter().zip(&w) {
            for field in ["status", "revision", "events", "late_events", "window_end"] {
                if a[field] != b[field] {
                    problems.push(format!("{id}: {field} {} want {}", a[field], b[field]));
                }
            }
            let (av, bv) = (a["values"].as_object().unwrap(), b["values"].as_object().unwrap());
            if av.len() != bv.len() || bv.iter().any(|(k, v)| !av.get(k).is_some_and(|x| same_value(x, v))) {
                problems.push(format!("{id}: values {} want {}", a["values"], b["values"]));
            }
        }
    }
    problems
}

fn ledger_set(entries: &[Value]) -> Vec<String> {
    let mut out: Vec<String> = entries
        .iter()
        .map(|e| {
            format!(
                "{} {} {} {} {}",
                e["offset"],
                e["reason"],
                e.get("window_start").unwrap_or(&Value::Null),
                e.get("first_offset").unwrap_or(&Value::Null),
                e.get("superseded_by").unwrap_or(&Value::Null)
            )
        })
        .collect();
    out.sort();
    out
}

fn cases(folder: &str) -> Vec<std::path::PathBuf> {
    let root = repo_root().join("..").join("shared").join(folder);
    let mut cases: Vec<_> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("the conformance cases are read from {}: {e}", root.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("contract.toml").exists())
        .collect();
    cases.sort();
    cases
}

#[test]
fn every_shared_conformance_case_passes() {
    let cases = cases("conformance");
    assert!(cases.len() >= 19, "expected the shared cases, found {}", cases.len());
    check_cases("conformance", &cases);
}

#[test]
fn every_case_of_the_newer_rules_passes() {
    let cases = cases("conformance-next");
    assert!(cases.len() >= 8, "expected the newer rules' cases, found {}", cases.len());
    check_cases("conformance-next", &cases);
}

#[test]
fn every_pending_case_passes() {
    let cases = cases("conformance-pending");
    assert!(cases.len() >= 3, "expected the pending cases, found {}", cases.len());
    check_cases("conformance-pending", &cases);
}

/// Each case at 1, 2 and 4 threads: `weir run` and `weir batch` read and
/// count on separate threads from 2, and the rows must not depend on it.
fn check_cases(folder: &str, cases: &[std::path::PathBuf]) {
    let scratch = Scratch::new(folder);
    let mut failures = Vec::new();
    for case in cases {
        for threads in ["1", "2", "4"] {
            let name = case.file_name().unwrap().to_string_lossy().into_owned();
            let (rows, ledger, batch) = (
                scratch.path(&format!("{name}.{threads}.rows")),
                scratch.path(&format!("{name}.{threads}.ledger")),
                scratch.path(&format!("{name}.{threads}.batch")),
            );
            let contract = case.join("contract.toml");
            let events = case.join("events.jsonl");
            let t = &"--threads";
            let run =
                weir(&[&"run", &contract, &"--input", &events, &"--output", &rows, &"--ledger", &ledger, t, &threads]);
            assert!(run.status.success(), "{name}: {}", text(&run.stderr));
            let b = weir(&[&"batch", &contract, &"--input", &events, &"--output", &batch, t, &threads]);
            assert!(b.status.success(), "{name}: {}", text(&b.stderr));
            let name = format!("{name} at {threads} threads");
            for p in compare_rows(&lines(&rows), &lines(&case.join("expected-rows.jsonl"))) {
                failures.push(format!("{name} rows: {p}"));
            }
            for p in compare_rows(&lines(&batch), &lines(&case.join("expected-batch.jsonl"))) {
                failures.push(format!("{name} batch: {p}"));
            }
            if ledger_set(&lines(&ledger)) != ledger_set(&lines(&case.join("expected-ledger.jsonl"))) {
                failures.push(format!(
                    "{name} ledger: {:?} want {:?}",
                    ledger_set(&lines(&ledger)),
                    ledger_set(&lines(&case.join("expected-ledger.jsonl")))
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

//! The contracts' named checks (`[[check]]`, issue 18), evaluated by the
//! alert loop every second against the live version, and served by
//! `GET /v1/pipelines/{p}/checks` (`weir-server`).
//!
//! - `row`: each row the version published (every revision), read from its
//!   change stream after the last one judged (kept in the store, so a
//!   restart goes on where it stopped);
//! - `volume`: each settled row against the same key's window one day (or
//!   week) before, from the version's results; a row with no such window is
//!   not judged;
//! - `freshness`: the watermark's age, kept when the outcome changes and at
//!   least once a minute;
//! - `reconcile`: each reconciliation once, its verdict.
//!
//! Every result is kept in the pipeline's store. A failing `error` check
//! opens an incident (`check:NAME`, owned by the contract's owner) or adds to
//! the one it opened, and the owner is notified like an alert; a `freshness`
//! or `reconcile` check passing again mitigates it. A `warn` check is only
//! kept. On Kafka each worker evaluates; a result is kept once (by its
//! subject) and only the worker that kept it acts on it. A pass reads at
//! most [`ROWS_A_PASS`] rows, so a pipeline publishing more rows a second
//! than that is judged behind (its results' `at` shows how far).

use std::collections::BTreeMap;

use serde_json::{json, Value};
use weir_contract::{Check, CheckKind, Severity};
use weir_engine::time::format_rfc3339_ms;
use weir_engine::Condition;
use weir_runtime::lock;
use weir_runtime::status::Pipeline;
use weir_store::checks::{CheckFilter, CheckResult};
use weir_store::{ResultFilter, Store};

use crate::report::Report;
use crate::watch::CheckState;
use crate::Ops;

/// Rows read from the change stream in one pass.
const ROWS_A_PASS: i64 = 2_000;
/// A freshness result is kept at least this often while the outcome holds.
const FRESHNESS_EVERY_MS: i64 = 60_000;

/// One pass over a pipeline's checks; the notifications for the owner.
pub fn evaluate(app: &Ops, name: &str, p: &Pipeline, status: &Report, now: i64) -> Vec<Value> {
    let contract = p.contract();
    if contract.checks.is_empty() {
        return Vec::new();
    }
    let version = status.version;
    let store = p.store.as_ref();
    let mut states = lock(&app.watch.checks).get(name).cloned().unwrap_or_default();
    for c in &contract.checks {
        let s = states.entry(c.name.clone()).or_default();
        if s.version != version {
            *s = CheckState { version, ..CheckState::default() };
        }
    }
    let mut results: Vec<CheckResult> = Vec::new();
    if let Err(e) = judge_rows(store, name, version, &contract.checks, &mut states, now, &mut results) {
        eprintln!("weir: {name}: checks: reading rows: {e}");
    }
    for c in &contract.checks {
        let s = states.get_mut(&c.name).unwrap_or_else(|| unreachable!("every check has a state"));
        match &c.kind {
            CheckKind::Freshness { max_age_ms } => {
                let observed = match status.watermark_age_ms {
                    Some(age) => Some((age <= *max_age_ms, format!("watermark {} old", fmt_ms(age)))),
                    None if status.events.read > 0 => Some((false, "no watermark yet".to_owned())),
                    None => None,
                };
                let Some((passed, observed)) = observed else { continue };
                if s.last.is_some() && s.failing != passed && now - s.last_kept_ms < FRESHNESS_EVERY_MS {
                    continue;
                }
                s.last_kept_ms = now;
                results.push(result(c, version, format!("at:{}", now / 1000), passed, observed, now));
            }
            CheckKind::Reconcile => {
                let newest = match store.reconciliations(name, None, 1) {
                    Ok(mut r) => r.pop(),
                    Err(e) => {
                        eprintln!("weir: {name}: checks: reading reconciliations: {e}");
                        None
                    }
                };
                let Some(r) = newest.filter(|r| r.version == version && Some(r.id) != s.reconciliation) else {
                    continue;
                };
                s.reconciliation = Some(r.id);
                let passed = r.verdict == "pass";
                let observed = format!("reconciliation {} against {}: {}", r.id, r.source, r.verdict);
                results.push(result(c, version, format!("reconciliation:{}", r.id), passed, observed, now));
            }
            CheckKind::Row { .. } | CheckKind::Volume { .. } => {}
        }
    }
    // Most passes judge nothing new: no transaction for them.
    let recorded = if results.is_empty() { Ok(Vec::new()) } else { store.record_checks(name, &results) };
    let kept = match recorded {
        Ok(kept) => kept,
        Err(e) => {
            eprintln!("weir: {name}: checks: {} results not kept ({e}); they are evaluated again", results.len());
            return Vec::new();
        }
    };
    // What each check's kept results say: failures (their count and the first), and the last outcome.
    let mut notes = Vec::new();
    for c in &contract.checks {
        let s = states.get_mut(&c.name).unwrap_or_else(|| unreachable!("every check has a state"));
        let mine: Vec<&CheckResult> = results.iter().filter(|r| r.check == c.name).collect();
        let Some(last) = mine.last() else { continue };
        s.passed += mine.iter().filter(|r| r.passed).count() as u64;
        s.failed += mine.iter().filter(|r| !r.passed).count() as u64;
        let was_failing = s.failing;
        s.failing = !last.passed;
        s.last = Some((*last).clone());
        let newly: Vec<&CheckResult> = results
            .iter()
            .zip(&kept)
            .filter(|(r, kept)| **kept && r.check == c.name && !r.passed)
            .map(|(r, _)| r)
            .collect();
        let transitions = matches!(c.kind, CheckKind::Freshness { .. } | CheckKind::Reconcile);
        let outcome = if let Some(first) = newly.first().filter(|_| !transitions || !was_failing) {
            let seen = match newly.len() {
                1 => first.observed.clone(),
                n => format!("{n} results failed; the first: {}", first.observed),
            };
            Some(("failed", seen))
        } else if transitions && was_failing && !s.failing && kept.iter().any(|k| *k) {
            Some(("passed", last.observed.clone()))
        } else {
            None
        };
        let Some((what, seen)) = outcome else { continue };
        eprintln!("weir: check {what}: {name} {} ({}): {seen}", c.name, c.severity.as_str());
        if c.severity == Severity::Warn {
            continue;
        }
        let pipeline = &contract.pipeline;
        let note = json!({
            "status": what,
            "check": c.name,
            "severity": c.severity.as_str(),
            "kind": c.kind.name(),
            "pipeline": name,
            "version": version,
            "owner": pipeline.owner,
            "steward": pipeline.steward,
            "decision": pipeline.decision,
            "observed": seen,
            "question": c.question,
            "at": format_rfc3339_ms(now),
        });
        let cause = format!("check:{}", c.name);
        let done = if what == "failed" {
            let title = format!("check {} failed on {name}: {}", c.name, c.question);
            store
                .raise_incident(name, &cause, (&title, &pipeline.owner), &format!("{} failed: {seen}", c.name))
                .map(|_| ())
        } else {
            store
                .mark_incidents(name, Some(&cause), ("check", "weir", &format!("{} passed: {seen}", c.name)), true)
                .map(|_| ())
        };
        if let Err(e) = done {
            eprintln!("weir: check not kept in an incident ({e}): {note}");
        }
        notes.push(note);
    }
    lock(&app.watch.checks).insert(name.to_owned(), states);
    notes
}

fn result(c: &Check, version: u32, subject: String, passed: bool, observed: String, now: i64) -> CheckResult {
    CheckResult {
        check: c.name.clone(),
        version,
        subject,
        seq: None,
        key: None,
        window_start_ms: None,
        window_end_ms: None,
        passed,
        observed,
        at_ms: now,
    }
}

fn fmt_ms(ms: i64) -> String {
    weir_contract::format_duration_ms(ms.max(0))
}

/// Row and volume checks over the rows published after each one's cursor.
fn judge_rows(
    store: &dyn Store,
    name: &str,
    version: u32,
    checks: &[Check],
    states: &mut BTreeMap<String, CheckState>,
    now: i64,
    out: &mut Vec<CheckResult>,
) -> weir_store::Result<()> {
    let row_checks: Vec<&Check> =
        checks.iter().filter(|c| matches!(c.kind, CheckKind::Row { .. } | CheckKind::Volume { .. })).collect();
    if row_checks.is_empty() {
        return Ok(());
    }
    let mut conditions = BTreeMap::new();
    for c in &row_checks {
        let s = states.get_mut(&c.name).unwrap_or_else(|| unreachable!("every check has a state"));
        if s.cursor.is_none() {
            s.cursor = Some(store.check_cursor(name, version, &c.name)?);
        }
        if let CheckKind::Row { expr, text } = &c.kind {
            match Condition::compile(expr) {
                Ok(cond) => {
                    conditions.insert(c.name.clone(), cond);
                }
                Err(e) => eprintln!("weir: {name}: check {} ({text}) cannot run: {e}", c.name),
            }
        }
    }
    let from = row_checks.iter().filter_map(|c| states[&c.name].cursor).min().unwrap_or(0);
    let rows = store.changes(name, Some(version), from + 1, ROWS_A_PASS)?;
    for text in rows {
        let Ok(row) = serde_json::from_str::<Value>(&text) else { continue };
        let Some(seq) = row["seq"].as_i64() else { continue };
        if row.get("values").is_none() || row["version"].as_u64() != Some(u64::from(version)) {
            for c in &row_checks {
                let s = states.get_mut(&c.name).unwrap_or_else(|| unreachable!("every check has a state"));
                s.cursor = Some(s.cursor.unwrap_or(0).max(seq));
            }
            continue;
        }
        for c in &row_checks {
            let s = states.get_mut(&c.name).unwrap_or_else(|| unreachable!("every check has a state"));
            if s.cursor.is_some_and(|at| at >= seq) {
                continue;
            }
            s.cursor = Some(seq);
            let judged = match &c.kind {
                CheckKind::Row { expr, .. } => conditions.get(&c.name).map(|cond| judge_row(cond, expr, &row)),
                CheckKind::Volume { period, band_percent } => {
                    judge_volume(store, name, version, &row, period.ms(), period.as_str(), *band_percent)?
                }
                _ => None,
            };
            let Some((passed, observed)) = judged else { continue };
            out.push(CheckResult {
                check: c.name.clone(),
                version,
                subject: format!("row:{seq}"),
                seq: Some(seq),
                key: Some(row["key"].to_string()),
                window_start_ms: row["window_start"].as_str().and_then(weir_engine::time::parse_rfc3339_ms),
                window_end_ms: row["window_end"].as_str().and_then(weir_engine::time::parse_rfc3339_ms),
                passed,
                observed,
                at_ms: now,
            });
        }
    }
    Ok(())
}

/// A row as a row expression reads it: `values`, `events`, `late_events`,
/// and `key` with dotted key names (`acct.id`) as nested members.
fn row_document(row: &Value) -> Value {
    let mut key = serde_json::Map::new();
    if let Some(fields) = row["key"].as_object() {
        for (field, value) in fields {
            let mut at = &mut key;
            let segments: Vec<&str> = field.split('.').collect();
            for segment in &segments[..segments.len() - 1] {
                let next = at.entry(segment.to_string()).or_insert_with(|| json!({}));
                if !next.is_object() {
                    *next = json!({});
                }
                at = next.as_object_mut().unwrap_or_else(|| unreachable!("made an object above"));
            }
            at.insert(segments[segments.len() - 1].to_owned(), value.clone());
        }
    }
    json!({
        "values": row["values"],
        "events": row["events"],
        "late_events": row["late_events"],
        "key": key,
    })
}

/// A row expression's outcome, and what it read: `values.revenue = -12.50`.
fn judge_row(cond: &Condition, expr: &weir_contract::Expr, row: &Value) -> (bool, String) {
    let doc = row_document(row);
    let mut fields = Vec::new();
    weir_contract::fields_of(expr, &mut fields);
    let mut read: Vec<String> = Vec::new();
    for f in fields {
        let mut v = &doc;
        for s in f.segments() {
            v = &v[s.as_str()];
        }
        let shown = format!("{f} = {v}");
        if !read.contains(&shown) {
            read.push(shown);
        }
    }
    let read = read.join(", ");
    match cond.test(&doc.to_string()) {
        Ok(true) => (true, read),
        Ok(false) => (false, read),
        Err(e) => (false, format!("{read} (cannot be evaluated: {e})")),
    }
}

/// A settled row's `events` against the same key's window one period before.
fn judge_volume(
    store: &dyn Store,
    name: &str,
    version: u32,
    row: &Value,
    period_ms: i64,
    period: &str,
    band_percent: f64,
) -> weir_store::Result<Option<(bool, String)>> {
    if row["status"] != "settled" {
        return Ok(None);
    }
    let Some(start) = row["window_start"].as_str().and_then(weir_engine::time::parse_rfc3339_ms) else {
        return Ok(None);
    };
    let key = row["key"]
        .as_object()
        .map(|o| {
            o.iter()
                .map(|(k, v)| (k.clone(), v.as_str().map_or_else(|| v.to_string(), str::to_owned)))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    let before = start - period_ms;
    let filter =
        ResultFilter { from_ms: Some(before), to_ms: Some(before + 1), key, limit: 1, ..ResultFilter::default() };
    let page = store.results(name, version, &filter)?;
    let Some(baseline) = page.rows.first().and_then(|r| serde_json::from_str::<Value>(r).ok()) else {
        return Ok(None);
    };
    let (now, then) = (row["events"].as_f64().unwrap_or(0.0), baseline["events"].as_f64().unwrap_or(0.0));
    let change = if then == 0.0 {
        if now == 0.0 {
            0.0
        } else {
            f64::INFINITY
        }
    } else {
        (now - then) / then * 100.0
    };
    let passed = change.abs() <= band_percent;
    let observed = format!("events {now} against {then} one {period} before ({change:+.1}%, band {band_percent}%)");
    Ok(Some((passed, observed)))
}

/// Each check of a version, as its contract defines it (where this server
/// runs that version) with the results kept: how many passed and failed, and
/// the last; a check no longer defined but with results kept is listed too.
pub fn summary(s: &dyn Store, name: &str, version: u32, defined: &[Check]) -> weir_store::Result<Vec<Value>> {
    let totals = s.check_totals(name, version, 0)?;
    let mut names: Vec<String> = defined.iter().map(|c| c.name.clone()).collect();
    names.extend(totals.iter().map(|t| t.check.clone()).filter(|t| !defined.iter().any(|c| &c.name == t)));
    let mut out = Vec::with_capacity(names.len());
    for check in &names {
        let def = defined.iter().find(|c| &c.name == check);
        let total = totals.iter().find(|t| &t.check == check);
        let one = CheckFilter { check: Some(check.clone()), limit: 1, ..CheckFilter::default() };
        let last = match total {
            Some(_) => s.check_results(name, version, &one)?.pop(),
            None => None,
        };
        out.push(json!({
            "check": check,
            "severity": def.map(|c| c.severity.as_str()),
            "kind": def.map(|c| c.kind.name()),
            "definition": def.map(|c| c.kind.definition()),
            "question": def.map(|c| c.question.clone()),
            "passed": total.map_or(0, |t| t.passed),
            "failed": total.map_or(0, |t| t.failed),
            "failing": last.as_ref().map(|l| !l.passed),
            "last": last.as_ref().map(shown),
        }));
    }
    Ok(out)
}

/// A kept result as served.
pub fn shown(r: &CheckResult) -> Value {
    json!({
        "check": r.check,
        "version": r.version,
        "subject": r.subject,
        "seq": r.seq,
        "key": r.key.as_deref().and_then(|k| serde_json::from_str::<Value>(k).ok()),
        "window_start": r.window_start_ms.map(format_rfc3339_ms),
        "window_end": r.window_end_ms.map(format_rfc3339_ms),
        "passed": r.passed,
        "observed": r.observed,
        "at": format_rfc3339_ms(r.at_ms),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_is_read_with_its_dotted_key_nested() {
        let row = json!({"key": {"acct.id": "a-1", "region": "eu"}, "values": {"revenue": -5.5}, "events": 2, "late_events": 0});
        let doc = row_document(&row);
        assert_eq!(doc["key"]["acct"]["id"], "a-1");
        assert_eq!(doc["key"]["region"], "eu");
        let expr = weir_contract::parse_rule("values.revenue >= 0 && key.acct.id == 'a-1'").unwrap();
        let cond = Condition::compile(&expr).unwrap();
        let (passed, observed) = judge_row(&cond, &expr, &row);
        assert!(!passed);
        assert_eq!(observed, "values.revenue = -5.5, key.acct.id = \"a-1\"");
    }
}

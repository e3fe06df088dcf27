//! Reconciliation against a system of record (SPEC.md 9): a pipeline
//! version's published rows compared, window by window, with an export of
//! the system that is right (a CSV or JSON-lines file, or the rows of a
//! query), mapped to key, window start and values.
//!
//! Everything here is pure but [`causes`]: reading an export
//! ([`read_export`]: every refusal names the line and the column), the
//! mapping and the tolerance, and [`compare`], which gives each window's
//! verdict (matched, differing, missing on either side), the ledger's
//! causes in it with the amounts they account for, and what they do not
//! account for: `unexplained`. A reconciliation fails when a window's
//! unexplained part is beyond the tolerance.
//!
//! The causes that account for a difference are the events the pipeline
//! left out that the system of record counts: `too_late` ones and
//! `duplicate_conflict` ones (another version of a counted event).
//! `duplicate` and `superseded` entries are listed but account for nothing:
//! an identical resend or a replaced version is not in the system of record.

use std::collections::{BTreeMap, BTreeSet};

use rust_decimal::Decimal;
use serde_json::{json, Map, Value};
use weir_contract::Contract;

use crate::backfill::{decimal, Causes, Published};
pub use weir_contract::reconcile::{Mapping, Tolerance};

/// How an export is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFormat {
    /// A header line of column names, then one row a line (RFC 4180 quoting).
    Csv,
    /// One JSON object a line, columns as its members.
    JsonLines,
}

impl ExportFormat {
    pub fn parse(text: &str) -> Result<ExportFormat, String> {
        match text {
            "csv" => Ok(ExportFormat::Csv),
            "jsonl" | "json" | "ndjson" => Ok(ExportFormat::JsonLines),
            other => Err(format!("format {other:?}: use csv or jsonl")),
        }
    }

    /// From a file name's extension (CSV unless it says JSON).
    pub fn of_path(path: &str) -> ExportFormat {
        if path.ends_with(".jsonl") || path.ends_with(".json") || path.ends_with(".ndjson") {
            ExportFormat::JsonLines
        } else {
            ExportFormat::Csv
        }
    }
}

/// One window as the system of record has it.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceRow {
    pub line: usize,
    /// Each key field's value as text, in the contract's key order.
    pub key: Vec<String>,
    pub window_start: i64,
    pub values: BTreeMap<String, Decimal>,
}

/// A line's cells by column (JSON-lines values as text).
pub type Cells = BTreeMap<String, String>;

/// Splits CSV text into records with their line numbers (quoted fields may
/// hold commas, quotes doubled, and line breaks).
fn csv_records(text: &str) -> Result<Vec<(usize, Vec<String>)>, String> {
    let mut records = Vec::new();
    let (mut line, mut start_line) = (1, 1);
    let (mut field, mut fields) = (String::new(), Vec::new());
    let mut chars = text.chars().peekable();
    let mut quoted = false;
    let mut any = false;
    while let Some(c) = chars.next() {
        any = true;
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => {
                if c == '\n' {
                    line += 1;
                }
                field.push(c);
            }
            (false, '"') if field.is_empty() => quoted = true,
            (false, ',') => fields.push(std::mem::take(&mut field)),
            (false, '\r') if chars.peek() == Some(&'\n') => {}
            (false, '\n') => {
                fields.push(std::mem::take(&mut field));
                if !(fields.len() == 1 && fields[0].is_empty()) {
                    records.push((start_line, std::mem::take(&mut fields)));
                }
                fields.clear();
                line += 1;
                start_line = line;
                any = false;
            }
            (false, c) => field.push(c),
        }
    }
    if quoted {
        return Err(format!("line {start_line}: a quoted field is not closed"));
    }
    if any {
        fields.push(field);
        records.push((start_line, fields));
    }
    Ok(records)
}

fn rows_of(text: &str, format: ExportFormat) -> Result<Vec<(usize, Cells)>, String> {
    match format {
        ExportFormat::Csv => {
            let mut records = csv_records(text)?.into_iter();
            let Some((_, header)) = records.next() else { return Ok(Vec::new()) };
            let header: Vec<String> = header.into_iter().map(|h| h.trim().to_owned()).collect();
            records
                .map(|(line, cells)| {
                    if cells.len() != header.len() {
                        return Err(format!(
                            "line {line}: {} fields, but the header (line 1) names {} columns",
                            cells.len(),
                            header.len()
                        ));
                    }
                    Ok((line, header.iter().cloned().zip(cells).collect()))
                })
                .collect()
        }
        ExportFormat::JsonLines => text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| {
                let v: Value = serde_json::from_str(l).map_err(|e| format!("line {}: not JSON ({e})", i + 1))?;
                let Value::Object(members) = v else { return Err(format!("line {}: not a JSON object", i + 1)) };
                let cells = members
                    .into_iter()
                    .map(|(k, v)| {
                        let text = match v {
                            Value::String(s) => s,
                            other => other.to_string(),
                        };
                        (k, text)
                    })
                    .collect();
                Ok((i + 1, cells))
            })
            .collect(),
    }
}

/// A window start: an RFC 3339 time, or a date (`2026-11-29`, its midnight UTC).
fn window_start(text: &str) -> Option<i64> {
    let t = text.trim();
    // Postgres writes a timestamptz's offset as `+00`.
    let t = &match t.len().checked_sub(3).and_then(|i| t.get(i..)) {
        Some(tail)
            if t.len() > 10
                && (tail.starts_with('+') || tail.starts_with('-'))
                && tail[1..].bytes().all(|b| b.is_ascii_digit()) =>
        {
            format!("{t}:00")
        }
        _ => t.to_owned(),
    };
    weir_engine::time::parse_rfc3339_ms(t).or_else(|| {
        (t.len() == 10).then(|| format!("{t}T00:00:00Z")).and_then(|d| weir_engine::time::parse_rfc3339_ms(&d))
    })
}

/// Reads an export: every line mapped to a window. Refused with the line
/// and column of the first problem: a missing column, an unreadable time
/// or amount, the same key and window twice.
pub fn read_export(text: &str, format: ExportFormat, mapping: &Mapping) -> Result<Vec<SourceRow>, String> {
    read_rows(rows_of(text, format)?, mapping)
}

/// Reads rows of cells (by column name, each numbered as the refusals name
/// it: a file's line, a query's row) as [`read_export`] reads a file's.
pub fn read_rows(rows: Vec<(usize, Cells)>, mapping: &Mapping) -> Result<Vec<SourceRow>, String> {
    let mut out = Vec::new();
    let mut seen: BTreeMap<(Vec<String>, i64), usize> = BTreeMap::new();
    for (line, cells) in rows {
        for column in mapping.columns() {
            if !cells.contains_key(column) {
                let have: Vec<&str> = cells.keys().map(String::as_str).collect();
                return Err(format!("line {line}: no column `{column}` (the line has {})", have.join(", ")));
            }
        }
        let cell = |c: &str| cells.get(c).map(String::as_str).unwrap_or_default();
        let key: Vec<String> = mapping.key.iter().map(|(_, c)| cell(c).trim().to_owned()).collect();
        let start_text = cell(&mapping.window_start);
        let Some(start) = window_start(start_text) else {
            return Err(format!(
                "line {line}, column `{}`: {start_text:?} is neither an RFC 3339 time nor a date (2026-11-29)",
                mapping.window_start
            ));
        };
        let mut values = BTreeMap::new();
        for (aggregate, column) in &mapping.values {
            let text = cell(column).trim();
            let amount =
                if text.contains(['e', 'E']) { Decimal::from_scientific(text).ok() } else { text.parse().ok() };
            let Some(amount) = amount else {
                return Err(format!("line {line}, column `{column}`: {text:?} is not an amount"));
            };
            values.insert(aggregate.clone(), amount);
        }
        if let Some(first) = seen.insert((key.clone(), start), line) {
            return Err(format!(
                "line {line}: the same key ({}) and window ({start_text}) as line {first}; an export has one line per key and window",
                key.join(", ")
            ));
        }
        out.push(SourceRow { line, key, window_start: start, values });
    }
    Ok(out)
}

/// A row's `key` object as the export writes it: each field's value as text.
fn key_text(key: &Value, names: &[(String, String)]) -> Vec<String> {
    names
        .iter()
        .map(|(n, _)| match key.get(n) {
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
            None => String::new(),
        })
        .collect()
}

/// The reasons whose amounts account for a difference (see the module's comment).
const ACCOUNTING: [&str; 2] = ["too_late", "duplicate_conflict"];

fn num(values: &Value, name: &str) -> Option<Decimal> {
    values.get(name).and_then(Value::as_number).and_then(decimal)
}

fn amounts(m: &BTreeMap<String, Decimal>) -> Value {
    Value::Object(m.iter().map(|(k, v)| (k.clone(), Value::String(v.normalize().to_string()))).collect())
}

/// Compares the published rows with the export (see the module's comment);
/// windows of `published` outside the export's range of window starts are
/// left out.
pub fn compare(
    contract: &Contract,
    mapping: &Mapping,
    tolerance: Tolerance,
    export: &[SourceRow],
    published: &[Published],
    causes: &Causes,
) -> Value {
    let aggregates: Vec<&str> = mapping.values.iter().map(|(a, _)| a.as_str()).collect();
    let range = export.iter().map(|r| r.window_start).min().zip(export.iter().map(|r| r.window_start).max());
    let ours: BTreeMap<(Vec<String>, i64), &Published> = published
        .iter()
        .filter(|p| p.events > 0 && p.status != "retracted")
        .filter(|p| range.is_some_and(|(lo, hi)| (lo..=hi).contains(&p.start)))
        .map(|p| ((key_text(&p.key, &mapping.key), p.start), p))
        .collect();
    let theirs: BTreeMap<(Vec<String>, i64), &SourceRow> =
        export.iter().map(|r| ((r.key.clone(), r.window_start), r)).collect();
    let windows: BTreeSet<&(Vec<String>, i64)> = ours.keys().chain(theirs.keys()).collect();
    // The causes by the key as the export writes it (a window weir has no row for has causes too).
    let by_key: BTreeMap<(Vec<String>, i64), &BTreeMap<&'static str, crate::backfill::Carried>> = causes
        .iter()
        .filter_map(|((key, start), found)| {
            let key: Value = serde_json::from_str(key).ok()?;
            Some(((key_text(&key, &mapping.key), *start), found))
        })
        .collect();
    let (mut matched, mut differing, mut missing_in_weir, mut missing_in_export, mut unexplained_windows) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut totals: BTreeMap<&str, [Decimal; 4]> = aggregates.iter().map(|a| (*a, [Decimal::ZERO; 4])).collect();
    let mut listed = Vec::new();
    for at in windows {
        let (ours, theirs) = (ours.get(at).copied(), theirs.get(at).copied());
        let key_json: Value = Value::Object(
            mapping.key.iter().zip(&at.0).map(|((n, _), v)| (n.clone(), Value::String(v.clone()))).collect(),
        );
        let found = by_key.get(at).copied();
        let (mut difference, mut accounted, mut unexplained) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
        // Whether the window's numbers can differ at all: a matched window
        // needs no cause, and a `corrected` row counts its late events already.
        let within = ours.is_some()
            && theirs.is_some()
            && aggregates.iter().all(|a| {
                let record = theirs.and_then(|r| r.values.get(*a).copied()).unwrap_or_default();
                let weir = ours.and_then(|p| num(&p.values, a)).unwrap_or_default();
                tolerance.allows(record - weir, record)
            });
        let causes_count = !within && ours.is_none_or(|p| p.status != "corrected");
        let mut explained = true;
        for a in &aggregates {
            let weir = ours.and_then(|p| num(&p.values, a)).unwrap_or_default();
            let record = theirs.and_then(|r| r.values.get(*a).copied()).unwrap_or_default();
            let d = record - weir;
            let acc: Decimal = found
                .into_iter()
                .flatten()
                .filter(|(reason, _)| causes_count && ACCOUNTING.contains(reason))
                .filter_map(|(_, carried)| num(&carried.values, a))
                .sum();
            let left = d - acc;
            explained &= tolerance.allows(left, record);
            let t = totals.entry(a).or_default();
            t[0] += record;
            t[1] += weir;
            t[2] += acc;
            t[3] += left;
            difference.insert((*a).to_owned(), d);
            accounted.insert((*a).to_owned(), acc);
            unexplained.insert((*a).to_owned(), left);
        }
        let verdict = match (ours, theirs) {
            (Some(_), None) => "missing_in_export",
            (None, Some(_)) => "missing_in_weir",
            _ if within => "matched",
            _ => "differing",
        };
        match verdict {
            "matched" => {
                matched += 1;
                continue;
            }
            "differing" => differing += 1,
            "missing_in_weir" => missing_in_weir += 1,
            _ => missing_in_export += 1,
        }
        unexplained_windows += u64::from(!explained);
        let mut listed_causes = Map::new();
        for (reason, carried) in found.into_iter().flatten() {
            listed_causes.insert(
                (*reason).to_owned(),
                json!({"events": carried.events, "values": carried.values, "accounts": causes_count && ACCOUNTING.contains(reason)}),
            );
        }
        listed.push(json!({
            "key": key_json,
            "window_start": weir_engine::time::format_rfc3339_ms(at.1),
            "verdict": verdict,
            "export": theirs.map(|r| json!({"line": r.line, "values": amounts(&r.values)})),
            "weir": ours.map(|p| json!({"revision": p.revision, "status": p.status, "values": p.values, "events": p.events})),
            "difference": amounts(&difference),
            "causes": listed_causes,
            "accounted": amounts(&accounted),
            "unexplained": amounts(&unexplained),
            "explained": explained,
        }));
    }
    // The unexplained windows first: what the owner has to look at.
    listed.sort_by_key(|d| d["explained"].as_bool());
    let totals: Map<String, Value> = totals
        .into_iter()
        .map(|(a, [record, weir, acc, left])| {
            (
                a.to_owned(),
                json!({
                    "export": record.normalize().to_string(),
                    "weir": weir.normalize().to_string(),
                    "difference": (record - weir).normalize().to_string(),
                    "accounted": acc.normalize().to_string(),
                    "unexplained": left.normalize().to_string(),
                }),
            )
        })
        .collect();
    let t = weir_engine::time::format_rfc3339_ms;
    json!({
        "pipeline": contract.pipeline.name,
        "from": range.map(|(lo, _)| t(lo)),
        "to": range.map(|(_, hi)| t(hi)),
        "tolerance": tolerance.describe(),
        "windows": {
            "matched": matched,
            "differing": differing,
            "missing_in_weir": missing_in_weir,
            "missing_in_export": missing_in_export,
            "unexplained": unexplained_windows,
        },
        "totals": totals,
        "verdict": if unexplained_windows == 0 { "pass" } else { "fail" },
        "differences_listed": listed.len().min(crate::backfill::WINDOWS_LISTED),
        "differences": listed.into_iter().take(crate::backfill::WINDOWS_LISTED).collect::<Vec<_>>(),
    })
}

/// Compares, keeps the reconciliation, and gives its id and report.
pub fn compare_and_keep(
    store: &dyn weir_store::Store,
    contract: &weir_contract::Contract,
    (pipeline, version): (&str, u32),
    (mapping, tolerance): (&Mapping, Tolerance),
    export: &[SourceRow],
    (who, why, source): (&str, &str, &str),
) -> anyhow::Result<(i64, Value)> {
    let lo = export.iter().map(|r| r.window_start).min().unwrap_or(0);
    let hi = export.iter().map(|r| r.window_start).max().map_or(0, |h| h + 1);
    let filter = weir_store::ResultFilter { from_ms: Some(lo), to_ms: Some(hi), limit: i64::MAX, ..Default::default() };
    let published: Vec<crate::backfill::Published> = store
        .results(pipeline, version, &filter)?
        .rows
        .iter()
        .filter_map(|t| crate::backfill::Published::parse(t))
        .collect();
    let causes = crate::backfill::causes_from_ledger(contract, store, (pipeline, version), (lo, hi))?;
    let mut report = compare(contract, mapping, tolerance, export, &published, &causes);
    report["version"] = version.into();
    report["source"] = source.into();
    let kept = weir_store::Reconciliation {
        id: 0,
        pipeline: pipeline.to_owned(),
        version,
        who: who.to_owned(),
        why: why.to_owned(),
        source: source.to_owned(),
        at_ms: weir_log::now_ms(),
        verdict: report["verdict"].as_str().unwrap_or("fail").to_owned(),
        report: report.to_string(),
    };
    let id = store.record_reconciliation(&kept)?;
    report["id"] = id.into();
    Ok((id, report))
}

/// The owner's notification of a failed reconciliation (`report` as
/// [`compare_and_keep`] gives it).
pub fn unexplained_note(contract: &Contract, report: &Value) -> Value {
    let c = &contract.pipeline;
    let now = weir_engine::time::format_rfc3339_ms(weir_log::now_ms());
    json!({
        "status": "firing",
        "alert": "reconcile_unexplained",
        "pipeline": c.name,
        "version": report["version"],
        "owner": c.owner,
        "steward": c.steward,
        "decision": c.decision,
        "threshold": report["tolerance"],
        "observed": report["windows"]["unexplained"],
        "question": format!(
            "Reconciliation {} against {}: {} windows differ beyond the tolerance with no cause in the ledger. What did the system of record count that weir did not see?",
            report["id"],
            report["source"].as_str().unwrap_or("the system of record"),
            report["windows"]["unexplained"]
        ),
        "reconciliation": report["id"],
        "since": now,
        "at": now,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping() -> Mapping {
        Mapping::parse(
            "key.account_id=account,window_start=day,revenue=total",
            &["account_id".into()],
            &["revenue".into(), "payments".into()],
        )
        .unwrap()
    }

    #[test]
    fn an_export_is_read_or_refused_with_its_line_and_column() {
        let csv = "account,day,total\na1,2026-11-01,12.50\n\"a,2\",2026-11-01T00:00:00Z,\"3\"\n";
        let rows = read_export(csv, ExportFormat::Csv, &mapping()).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[1].line, rows[1].key.clone()), (3, vec!["a,2".to_owned()]));
        assert_eq!(rows[0].window_start, rows[1].window_start);
        assert_eq!(rows[0].values["revenue"], Decimal::new(1250, 2));
        for (text, words) in [
            ("account,day\na1,2026-11-01\n", "line 2: no column `total`"),
            ("account,day,total\na1,2026-11-01,twelve\n", "line 2, column `total`: \"twelve\" is not an amount"),
            ("account,day,total\na1,yesterday,1\n", "line 2, column `day`"),
            (
                "account,day,total\na1,2026-11-01,1\na1,2026-11-01,2\n",
                "line 3: the same key (a1) and window (2026-11-01) as line 2",
            ),
            ("account,day,total\na1,2026-11-01\n", "line 2: 2 fields, but the header (line 1) names 3 columns"),
            ("account,day,total\n\"a1,2026-11-01,1\n", "line 2: a quoted field is not closed"),
        ] {
            let e = read_export(text, ExportFormat::Csv, &mapping()).unwrap_err();
            assert!(e.contains(words), "{text:?}: {e}");
        }
        let jsonl = "{\"account\":\"a1\",\"day\":\"2026-11-01\",\"total\":12.5}\n";
        assert_eq!(
            read_export(jsonl, ExportFormat::JsonLines, &mapping()).unwrap()[0].values["revenue"],
            Decimal::new(125, 1)
        );
        let e = read_export("{\"account\":\"a1\"}\n", ExportFormat::JsonLines, &mapping()).unwrap_err();
        assert!(e.starts_with("line 1: no column `day`"), "{e}");
    }
}

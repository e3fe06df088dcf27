//! Reconciliation against a system of record (SPEC.md 9): a pipeline
//! version's published rows compared, window by window, with an export of
//! the system that is right (a CSV or JSON-lines file, or the rows of a
//! query), mapped to key, window start and values.
//!
//! Everything here is pure but [`compare_and_keep`] and [`read_record`]
//! (a system of record's query, read-only, bounded): reading an export
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

use std::borrow::Cow;
use std::collections::BTreeMap;

use rust_decimal::Decimal;
use serde_json::{json, Map, Value};
use weir_contract::Contract;

use crate::causes::{decimal, Causes, Published};
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
    /// Each mapped aggregate's amount, in the mapping's order.
    pub values: Vec<Decimal>,
}

/// Reads an export's rows one at a time and keeps of each only what the
/// mapping names: the key, the window start and the amounts. A column the
/// mapping does not name is never copied, so what an export holds in memory
/// is its mapped cells, whatever the width of its lines or its header.
pub struct ExportReader<'m> {
    mapping: &'m Mapping,
    /// The columns the mapping reads, each once.
    columns: Vec<&'m str>,
    /// Where each of the key's, the window start's and the amounts' columns is in `columns`.
    key_at: Vec<usize>,
    start_at: usize,
    value_at: Vec<usize>,
    rows: Vec<SourceRow>,
}

/// A row's cells, in the order of [`ExportReader::columns`]; `None` where
/// the row has no such column.
pub type Picked<'a> = [Option<Cow<'a, str>>];

impl<'m> ExportReader<'m> {
    pub fn new(mapping: &'m Mapping) -> ExportReader<'m> {
        let mut columns: Vec<&str> = Vec::new();
        let mut at = |c: &'m str| match columns.iter().position(|k| *k == c) {
            Some(i) => i,
            None => {
                columns.push(c);
                columns.len() - 1
            }
        };
        let key_at = mapping.key.iter().map(|(_, c)| at(c)).collect();
        let start_at = at(&mapping.window_start);
        let value_at = mapping.values.iter().map(|(_, c)| at(c)).collect();
        ExportReader { mapping, columns, key_at, start_at, value_at, rows: Vec::new() }
    }

    /// The columns a row's cells are picked for, each once.
    pub fn columns(&self) -> &[&'m str] {
        &self.columns
    }

    /// One row, numbered as the refusals name it (a file's line, a query's row).
    pub fn row(&mut self, line: usize, cells: &Picked<'_>) -> Result<(), String> {
        for (column, cell) in self.columns.iter().zip(cells) {
            if cell.is_none() {
                return Err(format!("line {line}: no column `{column}`"));
            }
        }
        let cell = |i: usize| cells.get(i).and_then(|c| c.as_deref()).unwrap_or_default();
        let key: Vec<String> = self.key_at.iter().map(|&i| cell(i).trim().to_owned()).collect();
        let start_text = cell(self.start_at);
        let Some(start) = window_start(start_text) else {
            return Err(format!(
                "line {line}, column `{}`: {start_text:?} is neither an RFC 3339 time nor a date (2026-11-29)",
                self.mapping.window_start
            ));
        };
        let mut values = Vec::with_capacity(self.value_at.len());
        for (&i, (_, column)) in self.value_at.iter().zip(&self.mapping.values) {
            let text = cell(i).trim();
            let amount =
                if text.contains(['e', 'E']) { Decimal::from_scientific(text).ok() } else { text.parse().ok() };
            let Some(amount) = amount else {
                return Err(format!("line {line}, column `{column}`: {text:?} is not an amount"));
            };
            values.push(amount);
        }
        self.rows.push(SourceRow { line, key, window_start: start, values });
        Ok(())
    }

    /// The rows read, or the first line that repeats an earlier line's key
    /// and window (an export has one line per key and window).
    pub fn finish(mut self) -> Result<Vec<SourceRow>, String> {
        // Sorted by key and window, repeats are neighbours; the first found is the earliest repeat.
        let mut order: Vec<u32> = (0..self.rows.len() as u32).collect();
        let rows = &self.rows;
        order.sort_unstable_by(|&a, &b| {
            let (a, b) = (&rows[a as usize], &rows[b as usize]);
            (&a.key, a.window_start, a.line).cmp(&(&b.key, b.window_start, b.line))
        });
        let repeat = order
            .windows(2)
            .map(|p| (&rows[p[0] as usize], &rows[p[1] as usize]))
            .filter(|(a, b)| a.key == b.key && a.window_start == b.window_start)
            .min_by_key(|(_, b)| b.line);
        if let Some((first, again)) = repeat {
            return Err(format!(
                "line {}: the same key ({}) and window ({}) as line {}; an export has one line per key and window",
                again.line,
                again.key.join(", "),
                weir_engine::time::format_rfc3339_ms(again.window_start),
                first.line
            ));
        }
        self.rows.shrink_to_fit();
        Ok(self.rows)
    }
}

/// At most this many of a header's column names are listed in a refusal,
/// each cut to [`NAME_SHOWN`] characters.
const NAMES_SHOWN: usize = 12;
const NAME_SHOWN: usize = 40;

fn shown(names: &[String], count: usize) -> String {
    let mut listed: Vec<String> = names
        .iter()
        .map(|n| {
            if n.chars().count() > NAME_SHOWN {
                format!("{}...", n.chars().take(NAME_SHOWN).collect::<String>())
            } else {
                n.clone()
            }
        })
        .collect();
    if count > names.len() {
        listed.push(format!("and {} more", count - names.len()));
    }
    if listed.is_empty() {
        "no columns".to_owned()
    } else {
        listed.join(", ")
    }
}

/// One CSV field: where it is in its record, its text as written (a
/// quoted field's without its quotes, doubled quotes still doubled).
struct Field<'t> {
    index: usize,
    raw: &'t str,
    quoted: bool,
}

impl<'t> Field<'t> {
    fn text(&self) -> Cow<'t, str> {
        if self.quoted && self.raw.contains("\"\"") {
            Cow::Owned(self.raw.replace("\"\"", "\""))
        } else {
            Cow::Borrowed(self.raw)
        }
    }
}

/// What [`csv_walk`] finds: a field, or the end of a record with its
/// first line and its number of fields.
enum Csv<'t> {
    Field(Field<'t>),
    End { line: usize, fields: usize },
}

/// Walks CSV text field by field (RFC 4180: quoted fields may hold commas,
/// doubled quotes and line breaks; blank lines are skipped). Nothing of
/// the text is copied.
fn csv_walk<'t>(text: &'t str, mut found: impl FnMut(Csv<'t>) -> Result<(), String>) -> Result<(), String> {
    let bytes = text.as_bytes();
    let (mut pos, mut line) = (0, 1);
    while pos < bytes.len() {
        // A blank line is no record.
        if bytes[pos] == b'\n' || (bytes[pos] == b'\r' && bytes.get(pos + 1) == Some(&b'\n')) {
            pos += if bytes[pos] == b'\n' { 1 } else { 2 };
            line += 1;
            continue;
        }
        let start_line = line;
        let mut index = 0;
        loop {
            let (raw, quoted, after) = if bytes.get(pos) == Some(&b'"') {
                let mut at = pos + 1;
                let close = loop {
                    match memchr::memchr(b'"', &bytes[at..]) {
                        None => return Err(format!("line {start_line}: a quoted field is not closed")),
                        Some(i) if bytes.get(at + i + 1) == Some(&b'"') => at += i + 2,
                        Some(i) => break at + i,
                    }
                };
                line += memchr::memchr_iter(b'\n', &bytes[pos..close]).count();
                (&text[pos + 1..close], true, close + 1)
            } else {
                let stop = memchr::memchr2(b',', b'\n', &bytes[pos..]).map_or(bytes.len(), |i| pos + i);
                let raw = &text[pos..stop];
                let raw = if bytes.get(stop) == Some(&b'\n') { raw.strip_suffix('\r').unwrap_or(raw) } else { raw };
                (raw, false, stop)
            };
            found(Csv::Field(Field { index, raw, quoted }))?;
            index += 1;
            match bytes.get(after) {
                Some(b',') => pos = after + 1,
                Some(b'\n') => {
                    pos = after + 1;
                    line += 1;
                    break;
                }
                Some(b'\r') if bytes.get(after + 1) == Some(&b'\n') => {
                    pos = after + 2;
                    line += 1;
                    break;
                }
                None => {
                    pos = after;
                    break;
                }
                Some(_) => {
                    return Err(format!(
                        "line {line}: text after a quoted field's closing quote; a quote inside a quoted field is written twice (\"\")"
                    ))
                }
            }
        }
        found(Csv::End { line: start_line, fields: index })?;
    }
    Ok(())
}

/// Where a CSV export's header puts each mapped column: (field index,
/// place in [`ExportReader::columns`]), and how many columns it names.
struct Header {
    at: Vec<(usize, usize)>,
    columns: usize,
}

/// Reads a CSV export: the header names the columns, each later record is a row.
fn read_csv<'t>(text: &'t str, reader: &mut ExportReader<'_>) -> Result<(), String> {
    let wanted = reader.columns().to_vec();
    let mut header: Option<Header> = None;
    // While the header is read: the mapped columns found, and a few names for a refusal.
    let (mut at, mut names): (Vec<(usize, usize)>, Vec<String>) = (Vec::new(), Vec::new());
    let mut cells: Vec<Option<Cow<'t, str>>> = vec![None; wanted.len()];
    csv_walk(text, |found| {
        match (found, &header) {
            (Csv::Field(f), None) => {
                let name = f.text();
                let name = name.trim();
                if let Some(slot) = wanted.iter().position(|w| *w == name) {
                    if at.iter().any(|&(_, s)| s == slot) {
                        return Err(format!("line 1: the header names the column `{name}` twice"));
                    }
                    at.push((f.index, slot));
                }
                if names.len() < NAMES_SHOWN {
                    names.push(name.to_owned());
                }
            }
            (Csv::End { line, fields }, None) => {
                if let Some(missing) = (0..wanted.len()).find(|s| !at.iter().any(|(_, f)| f == s)) {
                    return Err(format!(
                        "line {line}: the header has no column `{}` (it has {})",
                        wanted[missing],
                        shown(&names, fields)
                    ));
                }
                header = Some(Header { at: std::mem::take(&mut at), columns: fields });
            }
            (Csv::Field(f), Some(h)) => {
                if let Some(&(_, slot)) = h.at.iter().find(|(i, _)| *i == f.index) {
                    cells[slot] = Some(f.text());
                }
            }
            (Csv::End { line, fields }, Some(h)) => {
                if fields != h.columns {
                    return Err(format!(
                        "line {line}: {fields} fields, but the header (line 1) names {} columns",
                        h.columns
                    ));
                }
                reader.row(line, &cells)?;
                cells.iter_mut().for_each(|c| *c = None);
            }
        }
        Ok(())
    })
}

/// Which of the wanted columns a JSON member's name is (none: skipped).
struct Which<'a>(&'a [&'a str]);

impl<'de> serde::de::DeserializeSeed<'de> for Which<'_> {
    type Value = Option<usize>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Option<usize>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Which<'_> {
    type Value = Option<usize>;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a member's name")
    }
    fn visit_str<E>(self, name: &str) -> Result<Option<usize>, E> {
        Ok(self.0.iter().position(|w| *w == name))
    }
}

/// One JSON line's wanted members as text; every other member is skipped unread.
struct Members<'c, 'a> {
    wanted: &'a [&'a str],
    cells: &'c mut [Option<Cow<'static, str>>],
}

impl<'de> serde::de::DeserializeSeed<'de> for Members<'_, '_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Members<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(which) = map.next_key_seed(Which(self.wanted))? {
            match which {
                Some(slot) => {
                    let text = match map.next_value::<Value>()? {
                        Value::String(s) => s,
                        other => other.to_string(),
                    };
                    self.cells[slot] = Some(Cow::Owned(text));
                }
                None => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

/// Reads a JSON-lines export: one object a line, its members the columns.
fn read_json_lines(text: &str, reader: &mut ExportReader<'_>) -> Result<(), String> {
    let wanted = reader.columns().to_vec();
    let mut cells: Vec<Option<Cow<'static, str>>> = vec![None; wanted.len()];
    for (i, line) in text.split('\n').enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let mut de = serde_json::Deserializer::from_str(line);
        let read = serde::de::DeserializeSeed::deserialize(Members { wanted: &wanted, cells: &mut cells }, &mut de)
            .and_then(|()| de.end());
        match read {
            Ok(()) => {}
            Err(e) if e.is_data() => return Err(format!("line {}: not a JSON object", i + 1)),
            Err(e) => return Err(format!("line {}: not JSON ({e})", i + 1)),
        }
        reader.row(i + 1, &cells)?;
        cells.iter_mut().for_each(|c| *c = None);
    }
    Ok(())
}

/// Reads an export: every line mapped to a window. Refused with the line
/// and column of the first problem: a missing column, an unreadable time
/// or amount, the same key and window twice.
pub fn read_export(text: &str, format: ExportFormat, mapping: &Mapping) -> Result<Vec<SourceRow>, String> {
    let mut reader = ExportReader::new(mapping);
    match format {
        ExportFormat::Csv => read_csv(text, &mut reader)?,
        ExportFormat::JsonLines => read_json_lines(text, &mut reader)?,
    }
    reader.finish()
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

/// How much of a system of record one reconciliation reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordLimits {
    /// At most this many rows from the query.
    pub rows: usize,
    /// How long each statement may run (Postgres's `statement_timeout`).
    pub timeout_ms: u64,
}

impl RecordLimits {
    pub const DEFAULT: RecordLimits = RecordLimits { rows: 1_000_000, timeout_ms: 60_000 };
}

/// Rows fetched from the query's cursor at a time.
const RECORD_FETCH: usize = 10_000;

/// What Postgres said, without the driver's wrapping.
fn said(e: &postgres::Error) -> String {
    e.as_db_error().map_or_else(|| e.to_string(), |db| db.message().to_owned())
}

/// The role a connection logs in as.
fn account(client: &mut postgres::Client) -> Result<String, String> {
    let row = client.query_one("SELECT current_user::text", &[]).map_err(|e| said(&e))?;
    Ok(row.get(0))
}

/// Reads the rows of `[reconcile.system_of_record]`'s query over `url`
/// (`$1` and `$2` become the range's start and end as quoted RFC 3339
/// literals; every value is read as text). The query is one statement, run
/// in a `READ ONLY` transaction that is rolled back, each statement within
/// the limits' timeout, its rows fetched from a cursor and at most the
/// limits' rows of them. An account that is also the store's (`store`,
/// weir.toml's `[postgres] url`) is refused: it owns weir's schema and
/// reads every raw payload.
pub fn read_record(
    (url, store): (&str, Option<&str>),
    query: &str,
    (from_ms, to_ms): (i64, i64),
    mapping: &Mapping,
    limits: RecordLimits,
) -> Result<Vec<SourceRow>, String> {
    let t = weir_engine::time::format_rfc3339_ms;
    let sql = query.replace("$1", &format!("'{}'", t(from_ms))).replace("$2", &format!("'{}'", t(to_ms)));
    let connect = |url: &str| weir_store::pg::connect(url).map_err(|e| format!("cannot connect: {e}"));
    let mut client = connect(url)?;
    let reader_account = account(&mut client)?;
    if let Some(store) = store {
        if account(&mut connect(store)?)? == reader_account {
            return Err(format!(
                "the connection logs in as {reader_account:?}, the account of weir's own store, which owns its schema and reads every raw payload; give the system of record a role of its own that may only read it (CREATE ROLE ... LOGIN; GRANT SELECT ON ... TO ...)"
            ));
        }
    }
    // Preparing parses without running: several statements are refused here.
    client.prepare(&sql).map_err(|e| format!("the query must be one SELECT statement: {}", said(&e)))?;
    let mut tx = client.build_transaction().read_only(true).start().map_err(|e| said(&e))?;
    let run = |e: postgres::Error| format!("the query failed: {}", said(&e));
    tx.batch_execute(&format!("SET LOCAL statement_timeout = {}", limits.timeout_ms)).map_err(run)?;
    tx.batch_execute(&format!("DECLARE weir_record NO SCROLL CURSOR FOR {sql}")).map_err(run)?;
    let mut reader = ExportReader::new(mapping);
    let wanted = reader.columns().to_vec();
    let mut places: Option<Vec<Option<usize>>> = None;
    let mut read = 0;
    loop {
        let fetched = tx.simple_query(&format!("FETCH {RECORD_FETCH} FROM weir_record")).map_err(run)?;
        let before = read;
        for message in &fetched {
            let postgres::SimpleQueryMessage::Row(row) = message else { continue };
            read += 1;
            if read > limits.rows {
                return Err(format!(
                    "the query answered more than {} rows; narrow it to the range ($1 to $2) and to one row per key and window",
                    limits.rows
                ));
            }
            let places = places.get_or_insert_with(|| {
                wanted.iter().map(|w| row.columns().iter().position(|c| c.name() == *w)).collect()
            });
            let cells: Vec<Option<Cow<'_, str>>> =
                places.iter().map(|p| p.map(|i| Cow::Borrowed(row.get(i).unwrap_or_default()))).collect();
            reader.row(read, &cells)?;
        }
        if read == before {
            break;
        }
    }
    // Nothing to keep: a read-only transaction ends without a commit.
    tx.rollback().map_err(|e| said(&e))?;
    reader.finish().map_err(|e| format!("a row weir cannot read: {e}"))
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

/// A window of the comparison: the key as the export writes it, and the start.
type At = (Vec<String>, i64);

/// What a comparison has seen so far: counts, totals, and the windows to
/// list (the unexplained first, then by key and start; at most
/// [`crate::causes::WINDOWS_LISTED`] are kept).
struct Tally<'c> {
    aggregates: Vec<&'c str>,
    tolerance: Tolerance,
    key_names: &'c [(String, String)],
    /// The causes by the key as the export writes it (a window weir has no row for has causes too).
    causes: BTreeMap<At, &'c BTreeMap<&'static str, crate::causes::Carried>>,
    counts: [u64; 5],
    totals: BTreeMap<&'c str, [Decimal; 4]>,
    listed: BTreeMap<(bool, At), Value>,
}

impl Tally<'_> {
    /// One window's verdict, counted, totalled and listed unless matched.
    fn window(&mut self, at: At, ours: Option<&Published>, theirs: Option<&SourceRow>) {
        let aggregates = &self.aggregates;
        let tolerance = self.tolerance;
        let found = self.causes.get(&at).copied();
        let (mut difference, mut accounted, mut unexplained) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
        // Whether the window's numbers can differ at all: a matched window
        // needs no cause, and a `corrected` row counts its late events already.
        let within = ours.is_some()
            && theirs.is_some()
            && aggregates.iter().enumerate().all(|(i, a)| {
                let record = theirs.and_then(|r| r.values.get(i).copied()).unwrap_or_default();
                let weir = ours.and_then(|p| num(&p.values, a)).unwrap_or_default();
                tolerance.allows(record - weir, record)
            });
        let causes_count = !within && ours.is_none_or(|p| p.status != "corrected");
        let mut explained = true;
        for (i, a) in aggregates.iter().enumerate() {
            let weir = ours.and_then(|p| num(&p.values, a)).unwrap_or_default();
            let record = theirs.and_then(|r| r.values.get(i).copied()).unwrap_or_default();
            let d = record - weir;
            let acc: Decimal = found
                .into_iter()
                .flatten()
                .filter(|(reason, _)| causes_count && ACCOUNTING.contains(reason))
                .filter_map(|(_, carried)| num(&carried.values, a))
                .sum();
            let left = d - acc;
            explained &= tolerance.allows(left, record);
            let t = self.totals.entry(a).or_default();
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
        let counted = ["matched", "differing", "missing_in_weir", "missing_in_export"];
        self.counts[counted.iter().position(|c| *c == verdict).unwrap_or(1)] += 1;
        if verdict == "matched" {
            return;
        }
        self.counts[4] += u64::from(!explained);
        let place = (explained, at);
        let listed = crate::causes::WINDOWS_LISTED;
        if self.listed.len() >= listed && self.listed.last_key_value().is_some_and(|(last, _)| *last < place) {
            return;
        }
        let mut listed_causes = Map::new();
        for (reason, carried) in found.into_iter().flatten() {
            listed_causes.insert(
                (*reason).to_owned(),
                json!({"events": carried.events, "values": carried.values, "accounts": causes_count && ACCOUNTING.contains(reason)}),
            );
        }
        let key_json: Value = Value::Object(
            self.key_names.iter().zip(&place.1 .0).map(|((n, _), v)| (n.clone(), Value::String(v.clone()))).collect(),
        );
        let entry = json!({
            "key": key_json,
            "window_start": weir_engine::time::format_rfc3339_ms(place.1 .1),
            "verdict": verdict,
            "export": theirs.map(|r| {
                let values = aggregates.iter().map(|a| (*a).to_owned()).zip(r.values.iter().copied()).collect();
                json!({"line": r.line, "values": amounts(&values)})
            }),
            "weir": ours.map(|p| json!({"revision": p.revision, "status": p.status, "values": p.values, "events": p.events})),
            "difference": amounts(&difference),
            "causes": listed_causes,
            "accounted": amounts(&accounted),
            "unexplained": amounts(&unexplained),
            "explained": explained,
        });
        self.listed.insert(place, entry);
        if self.listed.len() > listed {
            self.listed.pop_last();
        }
    }
}

/// Compares the published rows with the export (see the module's comment).
/// `published` streams the rows in the export's range of window starts
/// (others are left out); the comparison holds the export, the causes and
/// the listed windows, never all of the published rows.
pub fn compare<E>(
    contract: &Contract,
    mapping: &Mapping,
    tolerance: Tolerance,
    export: &[SourceRow],
    published: impl Iterator<Item = Result<Published, E>>,
    causes: &Causes,
) -> Result<Value, E> {
    let aggregates: Vec<&str> = mapping.values.iter().map(|(a, _)| a.as_str()).collect();
    let range = export.iter().map(|r| r.window_start).min().zip(export.iter().map(|r| r.window_start).max());
    let mut theirs: BTreeMap<At, &SourceRow> = export.iter().map(|r| ((r.key.clone(), r.window_start), r)).collect();
    let by_key = causes
        .iter()
        .filter_map(|((key, start), found)| {
            let key: Value = serde_json::from_str(key).ok()?;
            Some(((key_text(&key, &mapping.key), *start), found))
        })
        .collect();
    let mut tally = Tally {
        totals: aggregates.iter().map(|a| (*a, [Decimal::ZERO; 4])).collect(),
        aggregates,
        tolerance,
        key_names: &mapping.key,
        causes: by_key,
        counts: [0; 5],
        listed: BTreeMap::new(),
    };
    for p in published {
        let p = p?;
        if p.events == 0 || p.status == "retracted" || !range.is_some_and(|(lo, hi)| (lo..=hi).contains(&p.start)) {
            continue;
        }
        let at = (key_text(&p.key, &mapping.key), p.start);
        let record = theirs.remove(&at);
        tally.window(at, Some(&p), record);
    }
    for (at, record) in std::mem::take(&mut theirs) {
        tally.window(at, None, Some(record));
    }
    let [matched, differing, missing_in_weir, missing_in_export, unexplained_windows] = tally.counts;
    let totals: Map<String, Value> = tally
        .totals
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
    let listed: Vec<Value> = tally.listed.into_values().collect();
    Ok(json!({
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
        "differences_listed": listed.len(),
        "differences": listed,
    }))
}

/// The report of the published rows in the export's range against it,
/// read from the store a page at a time.
pub fn compared(
    store: &dyn weir_store::Store,
    contract: &weir_contract::Contract,
    (pipeline, version): (&str, u32),
    (mapping, tolerance): (&Mapping, Tolerance),
    export: &[SourceRow],
) -> crate::Result<Value> {
    let lo = export.iter().map(|r| r.window_start).min().unwrap_or(0);
    let hi = export.iter().map(|r| r.window_start).max().map_or(0, |h| h + 1);
    let filter = weir_store::ResultFilter { from_ms: Some(lo), to_ms: Some(hi), ..Default::default() };
    // A row that is not one (none is written) counts nowhere.
    let published = weir_store::ResultRows::new(store, pipeline, version, filter)
        .filter_map(|r| r.map(|(_, text)| Published::parse(&text)).transpose());
    let causes = crate::causes::causes_from_ledger(contract, store, (pipeline, version), (lo, hi))?;
    let mut report = compare(contract, mapping, tolerance, export, published, &causes)?;
    report["version"] = version.into();
    Ok(report)
}

/// A report as the store keeps it (by `who`, for `why`, against `source`).
pub fn to_keep(
    pipeline: &str,
    version: u32,
    (who, why, source): (&str, &str, &str),
    report: &Value,
) -> weir_store::Reconciliation {
    weir_store::Reconciliation {
        id: 0,
        pipeline: pipeline.to_owned(),
        version,
        who: who.to_owned(),
        why: why.to_owned(),
        source: source.to_owned(),
        at_ms: weir_log::now_ms(),
        verdict: report["verdict"].as_str().unwrap_or("fail").to_owned(),
        report: report.to_string(),
    }
}

/// Compares, keeps the reconciliation, and gives its id and report (a
/// scheduled one: the server audits an operator's in the same transaction).
pub fn compare_and_keep(
    store: &dyn weir_store::Store,
    contract: &weir_contract::Contract,
    (pipeline, version): (&str, u32),
    (mapping, tolerance): (&Mapping, Tolerance),
    export: &[SourceRow],
    (who, why, source): (&str, &str, &str),
) -> crate::Result<(i64, Value)> {
    let mut report = compared(store, contract, (pipeline, version), (mapping, tolerance), export)?;
    report["source"] = source.into();
    let id = store.record_reconciliation(&to_keep(pipeline, version, (who, why, source), &report))?;
    report["id"] = id.into();
    Ok((id, report))
}

/// Keeps a reconciliation that could not compare (its system of record
/// could not be read) as failed, with the reason; gives its report.
pub fn keep_unread(
    store: &dyn weir_store::Store,
    contract: &Contract,
    (pipeline, version): (&str, u32),
    reason: &str,
    (who, why, source): (&str, &str, &str),
) -> crate::Result<Value> {
    let mut report = json!({
        "pipeline": contract.pipeline.name,
        "version": version,
        "source": source,
        "verdict": "fail",
        "error": reason,
    });
    report["id"] = store.record_reconciliation(&to_keep(pipeline, version, (who, why, source), &report))?.into();
    Ok(report)
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
        "question": match report["error"].as_str() {
            Some(error) => format!(
                "Reconciliation {} against {} did not compare: {error}. Fix [reconcile.system_of_record] or its connection in weir.toml.",
                report["id"],
                report["source"].as_str().unwrap_or("the system of record"),
            ),
            None => format!(
                "Reconciliation {} against {}: {} windows differ beyond the tolerance with no cause in the ledger. What did the system of record count that weir did not see?",
                report["id"],
                report["source"].as_str().unwrap_or("the system of record"),
                report["windows"]["unexplained"]
            ),
        },
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
        assert_eq!(rows[0].values[0], Decimal::new(1250, 2));
        for (text, words) in [
            ("account,day\na1,2026-11-01\n", "line 1: the header has no column `total` (it has account, day)"),
            ("account,day,total\na1,2026-11-01,twelve\n", "line 2, column `total`: \"twelve\" is not an amount"),
            ("account,day,total\na1,yesterday,1\n", "line 2, column `day`"),
            (
                "account,day,total\na1,2026-11-01,1\na2,2026-11-01,1\na1,2026-11-01,2\na1,2026-11-01,3\n",
                "line 4: the same key (a1) and window (2026-11-01T00:00:00.000Z) as line 2",
            ),
            ("account,day,total\na1,2026-11-01\n", "line 2: 2 fields, but the header (line 1) names 3 columns"),
            ("account,day,total\n\"a1,2026-11-01,1\n", "line 2: a quoted field is not closed"),
            ("account,day,total\n\"a1\"x,2026-11-01,1\n", "line 2: text after a quoted field's closing quote"),
            ("account,day,total,day\n", "line 1: the header names the column `day` twice"),
        ] {
            let e = read_export(text, ExportFormat::Csv, &mapping()).unwrap_err();
            assert!(e.contains(words), "{text:?}: {e}");
        }
        let jsonl = "{\"account\":\"a1\",\"day\":\"2026-11-01\",\"total\":12.5}\n";
        assert_eq!(read_export(jsonl, ExportFormat::JsonLines, &mapping()).unwrap()[0].values[0], Decimal::new(125, 1));
        let e = read_export("{\"account\":\"a1\"}\n", ExportFormat::JsonLines, &mapping()).unwrap_err();
        assert!(e.starts_with("line 1: no column `day`"), "{e}");
        for (text, words) in [("[1]\n", "line 1: not a JSON object"), ("{\"a\":\n", "line 1: not JSON")] {
            let e = read_export(text, ExportFormat::JsonLines, &mapping()).unwrap_err();
            assert!(e.starts_with(words), "{text:?}: {e}");
        }
    }

    /// Quoted fields with commas, doubled quotes and line breaks; CRLF line
    /// ends; blank lines; members not mapped (nested, escaped) skipped.
    #[test]
    fn an_export_keeps_only_the_mapped_columns_and_reads_quoting_as_written() {
        let csv = "note,account,\"d\"\"ay\",day,total\r\n\r\n\"a, \"\"quoted\"\"\nnote\",\"x\"\"y\",0,2026-11-01,1\r\nplain,z,0,2026-11-02,2";
        let rows = read_export(csv, ExportFormat::Csv, &mapping()).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].line, rows[0].key.clone()), (3, vec!["x\"y".to_owned()]));
        assert_eq!(
            (rows[1].line, rows[1].key.clone(), rows[1].values.clone()),
            (5, vec!["z".to_owned()], vec![Decimal::TWO])
        );
        let jsonl = "{\"deep\":{\"x\":[1,{\"y\":\"\\u00e9\"}]},\"acc\\u006funt\":\"a1\",\"day\":\"2026-11-01\",\"total\":\"7\"}\n\n{\"account\":\"a2\",\"day\":\"2026-11-01\",\"total\":1e2}";
        let rows = read_export(jsonl, ExportFormat::JsonLines, &mapping()).unwrap();
        assert_eq!(
            rows.iter().map(|r| (r.line, r.key[0].clone(), r.values[0])).collect::<Vec<_>>(),
            vec![(1, "a1".to_owned(), Decimal::new(7, 0)), (3, "a2".to_owned(), Decimal::new(100, 0)),]
        );
    }

    /// Issue 42, finding 3: the published rows stream through the
    /// comparison, which keeps the export and at most `WINDOWS_LISTED`
    /// windows: the unexplained first, then by key and start.
    #[test]
    fn review_2_point_3_a_comparison_streams_the_published_rows_and_lists_a_bounded_number() {
        let contract = Contract::parse(
            "c.toml",
            "[pipeline]\nname = \"paid\"\nversion = 1\nowner = \"o\"\nsteward = \"s\"\ndecision = \"d\"\n\n[source]\ntopic = \"payments\"\nevent_time = \"t\"\nkey = [\"account_id\"]\n\n[window]\ntype = \"tumbling\"\nsize = \"1m\"\n\n[[aggregate]]\nname = \"revenue\"\nfn = \"sum\"\nfield = \"amount\"\n",
        )
        .unwrap();
        let mapping = Mapping::parse(
            "key.account_id=account,window_start=day,revenue=total",
            &["account_id".into()],
            &["revenue".into()],
        )
        .unwrap();
        const MINUTE: i64 = 60_000;
        const ROWS: i64 = 200_000;
        // The export: the first and the last minute, one account each (one matching, one not).
        let export = vec![
            SourceRow { line: 2, key: vec!["a0".into()], window_start: 0, values: vec![Decimal::from(5)] },
            SourceRow {
                line: 3,
                key: vec!["a0".into()],
                window_start: (ROWS - 1) * MINUTE,
                values: vec![Decimal::from(7)],
            },
            SourceRow { line: 4, key: vec!["b".into()], window_start: 3 * MINUTE, values: vec![Decimal::from(1)] },
        ];
        // Every minute between has a window of a0 the export does not have: made as they are read, never held.
        let published = (0..ROWS).map(|m| {
            Ok::<_, ()>(Published {
                key: json!({"account_id": "a0"}),
                start: m * MINUTE,
                end: Some((m + 1) * MINUTE),
                status: "settled".into(),
                revision: 1,
                values: json!({"revenue": 5}),
                events: 1,
            })
        });
        let tolerance = Tolerance::parse("0").unwrap();
        let report = compare(&contract, &mapping, tolerance, &export, published, &Causes::default()).unwrap();
        let w = &report["windows"];
        assert_eq!(w["matched"], 1, "{w}");
        assert_eq!(w["differing"], 1, "the last minute: 7 against 5");
        assert_eq!(w["missing_in_export"], ROWS as u64 - 2);
        assert_eq!(w["missing_in_weir"], 1, "b's window");
        assert_eq!(w["unexplained"], ROWS as u64);
        assert_eq!(report["totals"]["revenue"]["weir"], (ROWS * 5).to_string());
        let listed = report["differences"].as_array().unwrap();
        assert_eq!((listed.len(), report["differences_listed"].as_u64()), (crate::causes::WINDOWS_LISTED, Some(1000)));
        // By key as the export writes it, then start: a0's first minutes; b is past them.
        assert_eq!(listed[0]["window_start"], "1970-01-01T00:01:00.000Z", "{}", listed[0]);
        assert!(listed.iter().all(|d| d["key"]["account_id"] == "a0" && d["explained"] == false));
        let starts: Vec<&str> = listed.iter().filter_map(|d| d["window_start"].as_str()).collect();
        assert!(starts.windows(2).all(|p| p[0] < p[1]), "in order");
    }
}

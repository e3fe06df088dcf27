//! What both stores say of rows, ledger entries and their neighbours, the
//! same on SQLite and Postgres: a row or entry as served (its `seq` first),
//! a key's place, the filters and pages of `/results`, a row's origin for
//! its provenance, annotations and alert notifications.

use weir_engine::{LedgerEntry, Row, RowFormat};

/// What an erased entry's `detail` says (the detail may quote the payload).
pub const ERASED_DETAIL: &str = "payload and detail erased: older than the ledger's payload retention";

/// Where a group key's rows and ledger entries are found: a 64-bit FNV-1a
/// hash of the key's bytes, stored beside each and indexed, so that a
/// row's provenance reads its key's rows and entries, not every one.
/// Stable across releases (it is stored); equal keys have equal places,
/// and readers still compare the keys themselves.
pub fn place(key: &[u8]) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h as i64
}

/// [`place`] of a key read back from a stored row or entry: its fields in
/// the order written, each a JSON type (`string`, `number`, `boolean`, as
/// Postgres's `json_typeof` names them; SQLite's `text`, `integer`, `true`
/// and `false` too) and its text.
pub(crate) fn place_of_fields<'a>(fields: impl IntoIterator<Item = (&'a str, &'a str)>) -> i64 {
    let values = fields.into_iter().map(|(kind, text)| match kind {
        "string" | "text" => weir_engine::KeyValue::Str(text),
        "true" => weir_engine::KeyValue::Bool(true),
        "false" => weir_engine::KeyValue::Bool(false),
        "boolean" => weir_engine::KeyValue::Bool(text == "true"),
        _ => weir_engine::KeyValue::Int(text),
    });
    place(&weir_engine::encode_key(values))
}

/// The `seq` a stored row's text starts with (see [`with_seq`]).
pub(crate) fn seq_of(text: &str) -> Option<i64> {
    let rest = text.strip_prefix("{\"seq\":")?;
    let end = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// A row as served: the engine's JSON with its sequence number first,
/// appended to `out`; `scratch` holds the engine's JSON on the way (kept
/// by the caller from row to row, so that no row allocates for it).
pub(crate) fn write_row(format: &RowFormat, row: &Row, seq: i64, scratch: &mut String, out: &mut String) {
    scratch.clear();
    format.write_row(row, scratch);
    with_seq(scratch, seq, out);
}

/// A ledger entry as served: its sequence number and version first.
pub(crate) fn write_ledger(format: &RowFormat, entry: &LedgerEntry, seq: i64, version: u32, out: &mut String) {
    use std::fmt::Write;
    let mut line = String::new();
    format.write_ledger(entry, &mut line);
    let body = line.trim_end().strip_prefix('{').unwrap_or(&line);
    out.reserve(body.len() + 40);
    let _ = write!(out, "{{\"seq\":{seq},\"version\":{version},");
    out.push_str(body);
}

/// `line` (one JSON object) with `"seq"` as its first member.
pub(crate) fn with_seq(line: &str, seq: i64, out: &mut String) {
    use std::fmt::Write;
    let body = line.trim_end().strip_prefix('{').unwrap_or(line);
    out.reserve(body.len() + 30);
    let _ = write!(out, "{{\"seq\":{seq},");
    out.push_str(body);
}

/// Filters for `GET .../results`.
#[derive(Debug, Default)]
pub struct ResultFilter {
    pub status: Option<String>,
    pub from_ms: Option<i64>,
    pub to_ms: Option<i64>,
    /// `key.FIELD=value`: the key field's value as text.
    pub key: Vec<(String, String)>,
    pub limit: i64,
    /// Only rows after this one in the order rows are listed (window
    /// start, then key bytes): the place the previous page ended.
    pub after: Option<(i64, Vec<u8>)>,
}

/// Rows of `GET .../results`, and where the last one sits in their order.
#[derive(Debug, Default)]
pub struct ResultPage {
    pub rows: Vec<String>,
    /// Each row's window start and key bytes, for [`ResultFilter::after`].
    pub places: Vec<(i64, Vec<u8>)>,
}

/// An annotation: a note on an event-time range of a pipeline.
pub struct Annotation {
    pub id: i64,
    pub from_ms: i64,
    pub to_ms: i64,
    pub note: String,
    pub who: String,
    pub at_ms: i64,
}

/// `rows` with the ids of the `notes` their windows overlap.
pub(crate) fn with_annotations(notes: &[Annotation], rows: Vec<String>) -> Vec<String> {
    if notes.is_empty() {
        return rows;
    }
    rows.into_iter()
        .map(|row| {
            let (start, end) = (row_time(&row, "window_start"), row_time(&row, "window_end"));
            let ids: Vec<String> = notes
                .iter()
                .filter(|a| match (start, end) {
                    (Some(s), Some(e)) => s < a.to_ms && a.from_ms < e,
                    _ => true,
                })
                .map(|a| a.id.to_string())
                .collect();
            match row.strip_suffix('}') {
                Some(body) if !ids.is_empty() => format!("{body},\"annotations\":[{}]}}", ids.join(",")),
                _ => row,
            }
        })
        .collect()
}

/// What the store knows of one published row, for its provenance.
pub struct RowOrigin {
    pub row: serde_json::Value,
    pub at_ms: Option<i64>,
    /// `[[partition, first offset, last offset, events], ...]`.
    pub sources: Vec<[u64; 4]>,
    pub run: Option<Run>,
    /// The `seq` of the same window's previous row, if any.
    pub previous: Option<(i64, serde_json::Value)>,
    /// Ledger entries of the window's key whose window or event time is in
    /// the window, by reason (as the ledger holds them now).
    pub ledgered: Vec<(String, i64)>,
}

pub struct Run {
    pub id: i64,
    pub version: i64,
    pub text_hash: String,
    pub weir_version: String,
    pub started_ms: i64,
    pub why: String,
}

/// An alert notification as kept: when, and its JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct Notification {
    pub at_ms: i64,
    pub notification: String,
}

/// A global window's start in the `results` key (it has none).
pub(crate) const GLOBAL_START: i64 = i64::MIN;

pub(crate) fn id_bytes(id: u128) -> [u8; 16] {
    id.to_be_bytes()
}

pub(crate) fn id_from(bytes: &[u8]) -> u128 {
    let mut b = [0u8; 16];
    let n = bytes.len().min(16);
    b[..n].copy_from_slice(&bytes[..n]);
    u128::from_be_bytes(b)
}

/// `[[partition, first offset, last offset, events], ...]`.
pub(crate) fn sources_json(row: &Row, out: &mut String) {
    use std::fmt::Write;
    out.clear();
    out.push('[');
    for (i, s) in row.sources.iter().enumerate() {
        let comma = if i > 0 { "," } else { "" };
        let _ = write!(out, "{comma}[{},{},{},{}]", s.partition, s.first_offset, s.last_offset, s.events);
    }
    out.push(']');
}

/// The time of a row's `"window_start"` or `"window_end"`, `None` when null.
pub(crate) fn row_time(row: &str, field: &str) -> Option<i64> {
    let at = row.find(&format!("\"{field}\":\""))? + field.len() + 4;
    let end = row[at..].find('"')? + at;
    weir_engine::time::parse_rfc3339_ms(&row[at..end])
}

//! What the engine emits: result rows and ledger entries (SPEC.md section 4),
//! and their JSON-lines form. Writing JSON is pure: bytes into a buffer.

use serde::{Deserialize, Serialize};

use crate::agg::OutValue;
use crate::key;
use crate::text::write_str;
use crate::time::write_rfc3339_ms;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Status {
    Provisional,
    Settled,
    Retracted,
    /// Published by a backfill (SPEC.md 9): the batch's value of a settled
    /// window that the stream got wrong. The engine never emits it.
    Corrected,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Provisional => "provisional",
            Status::Settled => "settled",
            Status::Retracted => "retracted",
            Status::Corrected => "corrected",
        }
    }
}

/// One result row. `window_start` / `window_end` are `None` for a global window;
/// `watermark` is `None` while it is -infinity or once it is +infinity.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub key: KeyBytes,
    pub window_start: Option<i64>,
    pub window_end: Option<i64>,
    pub status: Status,
    pub revision: u32,
    pub values: Values,
    pub events: u64,
    pub late_events: u64,
    /// Where the counted events came from.
    pub sources: Sources,
    pub watermark: Option<i64>,
}

/// The events a window counted from one partition: the lowest and highest
/// offset and how many (others, of other keys or windows, lie between).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Source {
    pub partition: u32,
    pub first_offset: u64,
    pub last_offset: u64,
    pub events: u64,
}

/// A group key's bytes (`key::encode`): inline up to 24 bytes (a string
/// field of 19), so that a window and its last row allocate nothing for
/// their key.
pub type KeyBytes = smallvec::SmallVec<[u8; 24]>;

/// A row's values, one per aggregate in the contract's order: inline for
/// up to two, so that a close's thousands of rows allocate nothing for
/// them (each allocation there was memory the kernel zeroed again at
/// every close, freed memory being returned to the system within 10 ms).
pub type Values = smallvec::SmallVec<[OutValue; 2]>;

/// One [`Source`] per partition, in the order first seen: one inline.
pub type Sources = smallvec::SmallVec<[Source; 1]>;

pub(crate) fn add_source(sources: &mut Sources, partition: u32, offset: u64) {
    match sources.iter_mut().find(|s| s.partition == partition) {
        Some(s) => {
            s.first_offset = s.first_offset.min(offset);
            s.last_offset = s.last_offset.max(offset);
            s.events += 1;
        }
        None => sources.push(Source { partition, first_offset: offset, last_offset: offset, events: 1 }),
    }
}

/// One event of `partition` no longer counts (a correction replaced it):
/// the offset range stays, enclosing what counts.
pub(crate) fn remove_source(sources: &mut Sources, partition: u32) {
    if let Some(i) = sources.iter().position(|s| s.partition == partition) {
        sources[i].events = sources[i].events.saturating_sub(1);
        if sources[i].events == 0 {
            sources.remove(i);
        }
    }
}

pub(crate) fn merge_sources(into: &mut Sources, from: &Sources) {
    for f in from {
        match into.iter_mut().find(|s| s.partition == f.partition) {
            Some(s) => {
                s.first_offset = s.first_offset.min(f.first_offset);
                s.last_offset = s.last_offset.max(f.last_offset);
                s.events += f.events;
            }
            None => into.push(*f),
        }
    }
}

/// Why an event did not count (or did not count in one window).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Reason {
    TooLarge,
    MalformedJson,
    MissingField,
    BadType,
    RuleError,
    Duplicate,
    DuplicateConflict,
    TooLate,
    /// Past one of the contract's `[limits]`: nesting, values, key length,
    /// keys or open windows.
    OverLimit,
    /// Replaced by a later version of the same event (`on_conflict =
    /// "correct"`, SPEC.md 3.3): it counted, and counts no more.
    Superseded,
    /// An event time more than `max_future` ahead of the processing clock
    /// (SPEC.md 3.1 step 4): not counted, and it moves no watermark.
    Future,
}

impl Reason {
    pub const ALL: [Reason; 11] = [
        Reason::TooLarge,
        Reason::MalformedJson,
        Reason::MissingField,
        Reason::BadType,
        Reason::RuleError,
        Reason::Duplicate,
        Reason::DuplicateConflict,
        Reason::TooLate,
        Reason::OverLimit,
        Reason::Superseded,
        Reason::Future,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::TooLarge => "too_large",
            Reason::MalformedJson => "malformed_json",
            Reason::MissingField => "missing_field",
            Reason::BadType => "bad_type",
            Reason::RuleError => "rule_error",
            Reason::Duplicate => "duplicate",
            Reason::DuplicateConflict => "duplicate_conflict",
            Reason::TooLate => "too_late",
            Reason::OverLimit => "over_limit",
            Reason::Superseded => "superseded",
            Reason::Future => "future",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// One ledger entry: an event (or an event's share in one window) that did not count.
#[derive(Debug, Clone, PartialEq)]
pub struct LedgerEntry {
    pub partition: u32,
    pub offset: u64,
    pub reason: Reason,
    pub event_id: Option<String>,
    pub event_time: Option<i64>,
    pub key: Option<Box<[u8]>>,
    pub window: Option<(i64, i64)>,
    pub first_offset: Option<u64>,
    /// For `superseded`: the offset of the version that replaced this one.
    pub superseded_by: Option<u64>,
    pub detail: String,
    /// The event as it arrived (cut to [`PAYLOAD_BYTES_MAX`] bytes).
    pub payload: Option<String>,
}

/// Ledger payloads longer than this are cut (on a character boundary).
pub const PAYLOAD_BYTES_MAX: usize = 4096;

/// Collects what one or more events produced; the caller drains it.
#[derive(Debug, Default)]
pub struct Output {
    pub rows: Vec<Row>,
    pub ledger: Vec<LedgerEntry>,
}

impl Output {
    pub fn clear(&mut self) {
        self.rows.clear();
        self.ledger.clear();
    }
}

/// Names that rows are written with: the pipeline, its key fields and aggregates.
#[derive(Debug, Clone)]
pub struct RowFormat {
    pub pipeline: String,
    pub version: u32,
    pub key_names: Vec<String>,
    pub value_names: Vec<String>,
    heads: Heads,
}

/// What every row begins with, `{"pipeline":"…","version":N,"key":`, and
/// each key field's and value's `"name":` (after a comma but for the
/// first), written once.
#[derive(Debug, Clone)]
struct Heads {
    row: String,
    keys: Vec<String>,
    values: Vec<String>,
}

impl RowFormat {
    pub fn new(pipeline: String, version: u32, key_names: Vec<String>, value_names: Vec<String>) -> RowFormat {
        let mut row = String::from("{\"pipeline\":");
        write_str(&pipeline, &mut row);
        row.push_str(",\"version\":");
        push_num(&mut row, version);
        row.push_str(",\"key\":");
        let name_heads = |names: &[String]| {
            names
                .iter()
                .enumerate()
                .map(|(i, name)| {
                    let mut head = String::from(if i > 0 { "," } else { "" });
                    write_str(name, &mut head);
                    head.push(':');
                    head
                })
                .collect()
        };
        let heads = Heads { row, keys: name_heads(&key_names), values: name_heads(&value_names) };
        RowFormat { pipeline, version, key_names, value_names, heads }
    }

    /// Appends the row as one JSON line (with its newline).
    pub fn write_row(&self, row: &Row, out: &mut String) {
        out.push_str(&self.heads.row);
        key::write_json_with(&row.key, &self.heads.keys, out);
        out.push_str(",\"window_start\":");
        write_time(row.window_start, out);
        out.push_str(",\"window_end\":");
        write_time(row.window_end, out);
        out.push_str(",\"status\":\"");
        out.push_str(row.status.as_str());
        out.push_str("\",\"revision\":");
        push_num(out, row.revision);
        out.push_str(",\"values\":{");
        for (head, value) in self.heads.values.iter().zip(&row.values) {
            out.push_str(head);
            match value {
                OutValue::Null => out.push_str("null"),
                OutValue::Int(n) => push_num(out, n),
                OutValue::Dec(d) => push_num(out, d),
                OutValue::Json(text) => out.push_str(text),
            }
        }
        out.push_str("},\"events\":");
        push_num(out, row.events);
        out.push_str(",\"late_events\":");
        push_num(out, row.late_events);
        out.push_str(",\"watermark\":");
        write_time(row.watermark, out);
        out.push_str("}\n");
    }

    /// Appends the ledger entry as one JSON line (with its newline).
    pub fn write_ledger(&self, entry: &LedgerEntry, out: &mut String) {
        out.push_str("{\"pipeline\":");
        write_str(&self.pipeline, out);
        out.push_str(",\"version\":");
        push_num(out, self.version);
        out.push_str(",\"partition\":");
        push_num(out, entry.partition);
        out.push_str(",\"offset\":");
        push_num(out, entry.offset);
        out.push_str(",\"reason\":\"");
        out.push_str(entry.reason.as_str());
        out.push('"');
        if let Some(id) = &entry.event_id {
            out.push_str(",\"event_id\":");
            write_str(id, out);
        }
        if let Some(t) = entry.event_time {
            out.push_str(",\"event_time\":");
            write_time(Some(t), out);
        }
        if let Some(k) = &entry.key {
            out.push_str(",\"key\":");
            key::write_json(k, &self.key_names, out);
        }
        if let Some((start, end)) = entry.window {
            out.push_str(",\"window_start\":");
            write_time(Some(start), out);
            out.push_str(",\"window_end\":");
            write_time(Some(end), out);
        }
        if let Some(first) = entry.first_offset {
            out.push_str(",\"first_offset\":");
            push_num(out, first);
        }
        if let Some(by) = entry.superseded_by {
            out.push_str(",\"superseded_by\":");
            push_num(out, by);
        }
        out.push_str(",\"detail\":");
        write_str(&entry.detail, out);
        if let Some(payload) = &entry.payload {
            out.push_str(",\"payload\":");
            write_str(payload, out);
        }
        out.push_str("}\n");
    }
}

/// Every number below 100, two digits each, then the single digits: a
/// row's revision, events and counts are mostly small, and taking their
/// text from here skips a check that it is UTF-8.
const SMALL: &str = concat!(
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839",
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879",
    "8081828384858687888990919293949596979899",
);

/// The text of `n` when it is below 100.
#[inline]
fn small_number(n: u64) -> Option<&'static str> {
    match n {
        0..=9 => SMALL.get(2 * n as usize + 1..2 * n as usize + 2),
        10..=99 => SMALL.get(2 * n as usize..2 * n as usize + 2),
        _ => None,
    }
}

fn push_num(out: &mut String, n: impl PushNum) {
    n.push_to(out);
}

trait PushNum {
    fn push_to(self, out: &mut String);
}

macro_rules! push_int {
    ($($t:ty),*) => {$(
        impl PushNum for $t {
            fn push_to(self, out: &mut String) {
                if let Some(text) = small_number(u64::from(self)) {
                    out.push_str(text);
                    return;
                }
                let mut buf = [0u8; 20];
                let digits = crate::number::decimal_digits(u64::from(self), &mut buf);
                out.push_str(std::str::from_utf8(digits).unwrap_or("0"));
            }
        }
    )*};
}
push_int!(u32, u64);

impl PushNum for &u64 {
    fn push_to(self, out: &mut String) {
        (*self).push_to(out);
    }
}

impl PushNum for &rust_decimal::Decimal {
    fn push_to(self, out: &mut String) {
        crate::number::write_decimal(self, out);
    }
}

fn write_time(t: Option<i64>, out: &mut String) {
    match t {
        Some(ms) => {
            out.push('"');
            write_rfc3339_ms(ms, out);
            out.push('"');
        }
        None => out.push_str("null"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_numbers_are_written_as_their_digits() {
        for n in 0..250u64 {
            let mut out = String::new();
            push_num(&mut out, n);
            assert_eq!(out, n.to_string());
        }
    }

    #[test]
    fn a_row_is_one_json_object_with_names_escaped_once() {
        let names = |n: &[&str]| n.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let format = RowFormat::new("pay\"s".into(), 3, names(&["acc\\t", "b"]), names(&["sum", "n\u{1}", "pick"]));
        let mut key = Vec::new();
        crate::key::push_field(b's', "a\"1", &mut key);
        crate::key::push_field(b'b', "1", &mut key);
        let row = Row {
            key: key.into(),
            window_start: Some(60_000),
            window_end: None,
            status: Status::Provisional,
            revision: 7,
            values: smallvec::smallvec![
                OutValue::Dec("-12.50".parse().unwrap()),
                OutValue::Int(4),
                OutValue::Json("[1]".into())
            ],
            events: 4,
            late_events: 1,
            sources: Sources::new(),
            watermark: None,
        };
        let mut text = String::new();
        for _ in 0..2 {
            format.write_row(&row, &mut text);
        }
        let want = r#"{"pipeline":"pay\"s","version":3,"key":{"acc\\t":"a\"1","b":true},"window_start":"1970-01-01T00:01:00.000Z","window_end":null,"status":"provisional","revision":7,"values":{"sum":-12.50,"n\u0001":4,"pick":[1]},"events":4,"late_events":1,"watermark":null}"#;
        assert_eq!(text, format!("{want}\n{want}\n"));
    }
}

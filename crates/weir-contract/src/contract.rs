//! The contract: its typed form, and the parser that refuses any contract
//! that cannot run. Invariant: a `Contract` value always satisfies every rule
//! of SPEC.md section 2 (the engine relies on it and does not re-check).

use std::fmt;
use std::ops::Range;

use toml_edit::{Document, Item, Table, Value};

use crate::checks::{Check, RowShape};
use crate::duration::format_duration_ms;
pub use crate::reader::ContractError;
use crate::reader::{line_of, Reader};
use crate::rule::{parse_rule, Expr, FieldPath};
use crate::time_format::{TimeFormat, Zone};

#[derive(Debug, Clone)]
pub struct Contract {
    pub pipeline: Pipeline,
    pub source: Source,
    pub window: WindowSpec,
    pub dedup: Option<Dedup>,
    pub aggregates: Vec<Aggregate>,
    pub alerts: Option<Alerts>,
    /// `[[destination]]`: where the change stream is delivered (SPEC.md 11).
    pub destinations: Vec<crate::destinations::Destination>,
    /// `[reconcile]`: scheduled backfills (SPEC.md 9).
    pub reconcile: Option<Reconcile>,
    /// `[privacy] personal`: fields that identify a person. They may be read
    /// (in `where` rules, as the event id) but never reach a row, and only a
    /// raw-reader sees them in the ledger.
    pub personal: Vec<FieldPath>,
    /// `[limits]`: what one event and one pipeline may hold.
    pub limits: Limits,
    /// `[[check]]`: named checks a server evaluates and keeps (issue 18).
    pub checks: Vec<Check>,
    /// FNV-1a hash of the parsed contract (its canonical form: tables and
    /// keys in order, values as parsed, without comments or layout): names
    /// this exact contract in snapshots, checkpoints and provenance, so a
    /// fixed typo in a comment is not a change.
    pub text_hash: u64,
    /// The contract as written, kept with its version so that a server can
    /// run this version again from its store.
    pub text: String,
}

/// `[pipeline] promote`: how a candidate version becomes live (SPEC.md 8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Promote {
    /// By an operator (`weir promote`).
    #[default]
    Manual,
    /// As soon as the candidate's watermark reaches the live version's.
    Auto,
}

/// `[limits]`: bounds on what one event and one pipeline may hold, so that
/// hostile or runaway input costs a ledger entry (`over_limit`) instead of
/// the process's memory. Every key is optional.
///
/// ```toml
/// [limits]
/// max_depth = 64                # nesting of one event (at most 64)
/// max_fields = 100000           # values in one event, nested ones and array elements included
/// max_key_bytes = 4096          # the group key's bytes
/// max_keys = 10000000           # keys with an open window
/// max_open_windows = 10000000   # windows open at once
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_depth: usize,
    pub max_fields: usize,
    pub max_key_bytes: usize,
    pub max_keys: usize,
    pub max_open_windows: usize,
}

/// The deepest nesting an event may have, whatever `[limits]` says: the
/// engine's JSON reader recurses once a level.
pub const MAX_DEPTH: usize = 64;

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_depth: MAX_DEPTH,
            max_fields: 100_000,
            max_key_bytes: 4096,
            max_keys: 10_000_000,
            max_open_windows: 10_000_000,
        }
    }
}

/// `[alerts]`: thresholds a server checks continuously (issue 4). Every key
/// is optional; an alert fires when its observed value passes the threshold
/// and resolves when it comes back.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Alerts {
    /// Log time between the last record read and the newest record written.
    pub max_lag_ms: Option<i64>,
    /// Now minus the watermark.
    pub max_watermark_age_ms: Option<i64>,
    /// Now minus the append time of the oldest record not yet read.
    pub max_oldest_unprocessed_ms: Option<i64>,
    /// Ledger entries per event read, over the last minute (0 to 1).
    pub max_ledger_rate: Option<f64>,
    /// Windows corrected by backfills finished in the last hour.
    pub max_corrected_windows: Option<u64>,
    /// How long ago the oldest change a destination has not taken was published.
    pub max_destination_lag_ms: Option<i64>,
    /// Where notifications are POSTed (else weir.toml's `alert_webhook`).
    pub webhook: Option<String>,
}

/// `[reconcile]`: a backfill every `every` over the windows that settled
/// `delay` before (in event time: the watermark less `delay`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reconcile {
    pub every_ms: Option<i64>,
    pub delay_ms: i64,
    /// `[reconcile.system_of_record]`: after each scheduled run, the
    /// published rows of its range compared with a Postgres query's.
    pub system_of_record: Option<SystemOfRecord>,
}

/// A query on the system of record (Postgres): `$1` and `$2` stand for
/// the range's start and end as RFC 3339 text; each row one key and window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemOfRecord {
    pub query: String,
    pub map: crate::reconcile::Mapping,
    pub tolerance: crate::reconcile::Tolerance,
    /// The `[connections.NAME]` of weir.toml that reads the system of
    /// record: an account of its own, never the store's, and no URL in the
    /// contract (a contract is stored where every reader sees it).
    pub connection: String,
}

#[derive(Debug, Clone)]
pub struct Pipeline {
    pub name: String,
    pub version: u32,
    pub owner: String,
    pub steward: String,
    pub decision: String,
    /// `[pipeline] start`: where a new version's build starts reading, in
    /// epoch milliseconds; `None` for `"earliest"` (the default).
    pub start_ms: Option<i64>,
    pub promote: Promote,
}

#[derive(Debug, Clone)]
pub struct Source {
    pub topic: String,
    pub event_time: FieldPath,
    /// How the event time is written (`event_time_format`, default `auto`).
    pub event_time_format: TimeFormat,
    /// Where a pattern without an offset reads its local time (`event_time_zone`, default UTC).
    pub event_time_zone: Zone,
    pub key: Vec<FieldPath>,
    pub event_id: Option<FieldPath>,
    pub rule: Option<(String, Expr)>,
    pub max_delay_ms: i64,
    /// `max_future`: an event time further ahead of the processing clock
    /// is ledgered `future` and moves no watermark (SPEC.md 3.1).
    pub max_future_ms: Option<i64>,
    pub max_event_bytes: usize,
    /// `kind = "log"` (the embedded log) or `"kafka"`; `None`: the server's
    /// default (Kafka when weir.toml has `[kafka]`).
    pub kind: Option<SourceKind>,
    /// Kafka brokers for this contract, over weir.toml's `[kafka] brokers`.
    pub brokers: Option<String>,
    /// The Kafka consumer group; default `weir-{name}-v{version}`.
    pub group: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    Log,
    Kafka,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowKind {
    Tumbling { size_ms: i64 },
    Hopping { size_ms: i64, slide_ms: i64 },
    Session { gap_ms: i64 },
    Global,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LatePolicy {
    Discard,
    Hold,
    Revise,
}

impl LatePolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            LatePolicy::Discard => "discard",
            LatePolicy::Hold => "hold",
            LatePolicy::Revise => "revise",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowSpec {
    pub kind: WindowKind,
    pub allowed_lateness_ms: i64,
    pub late: LatePolicy,
    pub early: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dedup {
    pub horizon_ms: i64,
    pub on_conflict: OnConflict,
}

/// `[dedup] on_conflict`: what a later, different version of a counted
/// event does (SPEC.md 3.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnConflict {
    /// It goes to the ledger as `duplicate_conflict`; the first version counts.
    Ledger,
    /// It replaces the counted version (an upsert); one the contract's
    /// `where` filters out deletes it.
    Correct,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AggFn {
    Count,
    Sum,
    Min,
    Max,
    Avg,
    CountDistinct,
    First,
    Last,
}

impl AggFn {
    pub fn as_str(self) -> &'static str {
        match self {
            AggFn::Count => "count",
            AggFn::Sum => "sum",
            AggFn::Min => "min",
            AggFn::Max => "max",
            AggFn::Avg => "avg",
            AggFn::CountDistinct => "count_distinct",
            AggFn::First => "first",
            AggFn::Last => "last",
        }
    }

    fn parse(text: &str) -> Option<AggFn> {
        Some(match text {
            "count" => AggFn::Count,
            "sum" => AggFn::Sum,
            "min" => AggFn::Min,
            "max" => AggFn::Max,
            "avg" => AggFn::Avg,
            "count_distinct" => AggFn::CountDistinct,
            "first" => AggFn::First,
            "last" => AggFn::Last,
            _ => return None,
        })
    }

    /// Whether the function reads its field as a decimal number.
    pub fn is_numeric(self) -> bool {
        matches!(self, AggFn::Sum | AggFn::Min | AggFn::Max | AggFn::Avg)
    }
}

#[derive(Debug, Clone)]
pub struct Aggregate {
    pub name: String,
    pub func: AggFn,
    /// `None` only for `count`, which then counts events.
    pub field: Option<FieldPath>,
    pub rule: Option<(String, Expr)>,
}

impl WindowSpec {
    /// The window's length for the dedup horizon check: size, gap, or none.
    fn length_ms(&self) -> Option<i64> {
        match self.kind {
            WindowKind::Tumbling { size_ms } | WindowKind::Hopping { size_ms, .. } => Some(size_ms),
            WindowKind::Session { gap_ms } => Some(gap_ms),
            WindowKind::Global => None,
        }
    }
}

/// Every reason a contract cannot run, in file order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ContractErrors(pub Vec<ContractError>);

impl fmt::Display for ContractErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

const PIPELINE_KEYS: &[&str] = &["name", "version", "owner", "steward", "decision", "start", "promote"];
const SOURCE_KEYS: &[&str] = &[
    "topic",
    "event_time",
    "event_time_format",
    "event_time_zone",
    "key",
    "event_id",
    "where",
    "max_delay",
    "max_future",
    "max_event_bytes",
    "kind",
    "brokers",
    "group",
];
const WINDOW_KEYS: &[&str] = &["type", "size", "slide", "gap", "allowed_lateness", "late", "early"];
const DEDUP_KEYS: &[&str] = &["horizon", "on_conflict"];
const AGGREGATE_KEYS: &[&str] = &["name", "fn", "field", "where"];
const ALERT_KEYS: &[&str] = &[
    "max_lag",
    "max_watermark_age",
    "max_oldest_unprocessed",
    "max_ledger_rate",
    "max_corrected_windows",
    "max_destination_lag",
    "webhook",
];
const RECONCILE_KEYS: &[&str] = &["every", "delay", "system_of_record"];

/// The shortest `[reconcile] every`: each scheduled run is a backfill that
/// reads the pipeline's input over its range, so a run every millisecond
/// would keep a worker reading for nothing else.
pub const MIN_RECONCILE_EVERY_MS: i64 = 10_000;
const SYSTEM_OF_RECORD_KEYS: &[&str] = &["query", "map", "tolerance", "connection", "url"];
const SECTIONS: &[&str] = &[
    "pipeline",
    "source",
    "window",
    "dedup",
    "aggregate",
    "alerts",
    "sink",
    "privacy",
    "limits",
    "reconcile",
    "check",
    "destination",
];
const LIMIT_KEYS: &[&str] = &["max_depth", "max_fields", "max_key_bytes", "max_keys", "max_open_windows"];
const PRIVACY_KEYS: &[&str] = &["personal"];

/// Default `max_event_bytes`: 1 MiB.
pub const MAX_EVENT_BYTES_DEFAULT: usize = 1 << 20;

impl Contract {
    /// Parses and validates a contract; `file` names it in every error.
    pub fn parse(file: &str, text: &str) -> Result<Contract, ContractErrors> {
        let doc = match Document::parse(text) {
            Ok(doc) => doc,
            Err(err) => {
                let line = err.span().map(|span| line_of(text, span.start));
                let message = err.message().trim().to_owned();
                return Err(ContractErrors(vec![ContractError {
                    file: file.into(),
                    line,
                    key: "(toml)".into(),
                    message: format!("not valid TOML: {message}; fix the syntax at this line"),
                }]));
            }
        };
        let mut reader = Reader { file, text, errors: Vec::new() };
        let mut contract = reader.contract(doc.as_table());
        if let Some(c) = &mut contract {
            c.text_hash = canonical_hash(doc.as_table());
            c.text = text.to_owned();
        }
        match contract {
            Some(contract) if reader.errors.is_empty() => Ok(contract),
            _ => {
                let mut errors = reader.errors;
                errors.sort_by_key(|e| e.line.unwrap_or(usize::MAX));
                Err(ContractErrors(errors))
            }
        }
    }

    /// The FNV-1a hash of the contract's bytes: how stores and snapshots
    /// written before contracts were hashed as parsed name a contract.
    pub fn bytes_hash(&self) -> u64 {
        fnv1a(&self.text)
    }

    /// A short human summary: key, windows, lateness policy, duplicates, owner, decision.
    pub fn summary(&self) -> String {
        let p = &self.pipeline;
        let s = &self.source;
        let w = &self.window;
        let key = if s.key.is_empty() {
            "none (one group per window)".to_owned()
        } else {
            s.key.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
        };
        let windows = match w.kind {
            WindowKind::Tumbling { size_ms } => format!("tumbling, {}", format_duration_ms(size_ms)),
            WindowKind::Hopping { size_ms, slide_ms } => {
                format!("hopping, {} every {}", format_duration_ms(size_ms), format_duration_ms(slide_ms))
            }
            WindowKind::Session { gap_ms } => format!("session, gap {}", format_duration_ms(gap_ms)),
            WindowKind::Global => "global (one per key, no end)".to_owned(),
        };
        let lateness = match w.late {
            LatePolicy::Discard => {
                "discard: settled when the watermark passes the window's end; later events go to the ledger as too_late"
                    .to_owned()
            }
            LatePolicy::Hold => format!(
                "hold: settled {} after the window's end; nothing published before",
                format_duration_ms(w.allowed_lateness_ms)
            ),
            LatePolicy::Revise => format!(
                "revise: provisional at the window's end, revised for late events for {}, then settled",
                format_duration_ms(w.allowed_lateness_ms)
            ),
        };
        let duplicates = match (&self.dedup, &s.event_id) {
            (Some(d), Some(id)) => {
                let conflicts = match d.on_conflict {
                    OnConflict::Ledger => "a different version goes to the ledger",
                    OnConflict::Correct => "a different version corrects the counted one",
                };
                format!(
                    "caught by `{id}`, remembered for {} of event time; {conflicts}",
                    format_duration_ms(d.horizon_ms)
                )
            }
            _ => "not caught (no [dedup])".to_owned(),
        };
        let aggregates = self
            .aggregates
            .iter()
            .map(|a| match &a.field {
                Some(field) => format!("{} = {}({field})", a.name, a.func.as_str()),
                None => format!("{} = {}()", a.name, a.func.as_str()),
            })
            .collect::<Vec<_>>()
            .join(", ");
        let mut out = String::new();
        out.push_str(&format!("pipeline   {} v{}\n", p.name, p.version));
        out.push_str(&format!("decision   {}\n", p.decision));
        out.push_str(&format!("owner      {} (steward {})\n", p.owner, p.steward));
        out.push_str(&format!(
            "source     topic {}, event time `{}` ({}{}), max delay {}\n",
            s.topic,
            s.event_time,
            s.event_time_format.describe(),
            match (&s.event_time_format, s.event_time_zone) {
                (TimeFormat::Pattern(_), zone) if zone != Zone::Utc => format!(", local times in {}", zone.name()),
                _ => String::new(),
            },
            format_duration_ms(s.max_delay_ms)
        ));
        if let Some(ms) = s.max_future_ms {
            out.push_str(&format!(
                "future     an event time more than {} ahead of the processing clock is ledgered `future`\n",
                format_duration_ms(ms)
            ));
        }
        if let Some((text, _)) = &s.rule {
            out.push_str(&format!("where      {text}\n"));
        }
        out.push_str(&format!("key        {key}\n"));
        out.push_str(&format!("windows    {windows}{}\n", if w.early { ", early provisional rows" } else { "" }));
        out.push_str(&format!("lateness   {lateness}\n"));
        out.push_str(&format!("duplicates {duplicates}\n"));
        out.push_str(&format!("aggregates {aggregates}\n"));
        if !self.personal.is_empty() {
            let names: Vec<String> = self.personal.iter().map(ToString::to_string).collect();
            out.push_str(&format!(
                "personal   {} (never in rows; in the ledger only for raw-readers)\n",
                names.join(", ")
            ));
        }
        out
    }
}

fn fnv1a(text: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// The hash of a parsed TOML document in a canonical form: every table's
/// keys in order, every value as parsed (so `'a'` and `"a"`, `1_000` and
/// `1000` are the same), comments, whitespace and layout left out.
fn canonical_hash(table: &Table) -> u64 {
    let mut out = String::new();
    canonical_table(table.iter().map(|(k, v)| (k, Some(v), None)), &mut out);
    fnv1a(&out)
}

fn canonical_table<'a>(
    entries: impl Iterator<Item = (&'a str, Option<&'a Item>, Option<&'a Value>)>,
    out: &mut String,
) {
    let mut entries: Vec<_> = entries.collect();
    entries.sort_by_key(|e| e.0);
    out.push('{');
    for (key, item, value) in entries {
        out.push_str(&format!("{key:?}="));
        match (item, value) {
            (Some(item), _) => canonical_item(item, out),
            (None, Some(value)) => canonical_value(value, out),
            (None, None) => {}
        }
        out.push(';');
    }
    out.push('}');
}

fn canonical_item(item: &Item, out: &mut String) {
    match item {
        Item::None => out.push_str("none"),
        Item::Value(v) => canonical_value(v, out),
        Item::Table(t) => canonical_table(t.iter().map(|(k, v)| (k, Some(v), None)), out),
        Item::ArrayOfTables(a) => {
            out.push('[');
            for t in a.iter() {
                canonical_table(t.iter().map(|(k, v)| (k, Some(v), None)), out);
                out.push(',');
            }
            out.push(']');
        }
    }
}

fn canonical_value(value: &Value, out: &mut String) {
    match value {
        Value::String(s) => out.push_str(&format!("{:?}", s.value())),
        Value::Integer(i) => out.push_str(&i.value().to_string()),
        Value::Float(f) => out.push_str(&format!("{:?}", f.value())),
        Value::Boolean(b) => out.push_str(&b.value().to_string()),
        Value::Datetime(d) => out.push_str(&d.value().to_string()),
        Value::Array(a) => {
            out.push('[');
            for v in a.iter() {
                canonical_value(v, out);
                out.push(',');
            }
            out.push(']');
        }
        Value::InlineTable(t) => canonical_table(t.iter().map(|(k, v)| (k, None, Some(v))), out),
    }
}

impl Reader<'_> {
    fn contract(&mut self, root: &Table) -> Option<Contract> {
        for (name, item) in root.iter() {
            if !SECTIONS.contains(&name) {
                let span = root.key(name).and_then(|k| k.span()).or_else(|| item.span());
                self.error(
                    span,
                    name,
                    format!(
                        "unknown section; a contract has [{}] (and [[aggregate]], [alerts], [[check]], [[destination]])",
                        SECTIONS[..4].join("], [")
                    ),
                );
            }
        }
        let pipeline = self.table(root, "pipeline", true).and_then(|t| self.pipeline(t));
        let source = self.table(root, "source", true).and_then(|t| self.source(t));
        let window = self.table(root, "window", true).and_then(|t| self.window(t));
        let dedup_table = self.table(root, "dedup", false);
        let dedup = dedup_table.and_then(|t| self.dedup(t));
        let aggregates = self.aggregates(root);
        let alerts = match self.table(root, "alerts", false) {
            Some(t) => Some(self.alerts(t)?),
            None => None,
        };
        let sink = match self.table(root, "sink", false) {
            Some(t) => Some(self.sink(t)?),
            None => None,
        };

        let limits = match self.table(root, "limits", false) {
            Some(t) => self.limits(t),
            None => Some(Limits::default()),
        };
        let privacy_table = self.table(root, "privacy", false);
        let personal = match privacy_table {
            Some(t) => self.personal(t),
            None => Some(Vec::new()),
        };
        let (pipeline, source, window, aggregates, personal, limits) =
            (pipeline?, source?, window?, aggregates?, personal?, limits?);
        let reconcile = match self.table(root, "reconcile", false) {
            Some(t) => Some(self.reconcile(t, &source, &aggregates)?),
            None => None,
        };
        let row = RowShape { key: &source.key, aggregates: aggregates.iter().map(|a| a.name.as_str()).collect() };
        let checks = self.checks(root, &row)?;
        let mut destinations = self.destinations(root, &pipeline.name, &source, &aggregates)?;
        if let Some((span, sink)) = sink.map(|s| (root.get("sink").and_then(Item::span), s)) {
            for d in sink {
                if destinations.iter().any(|o| o.name == d.name) {
                    self.error(
                        span.clone(),
                        "sink",
                        format!("[sink] is read as the kafka destination `{}`, and a [[destination]] has that name too; rename that one, or write the sink as a [[destination]] (kind = \"kafka\")", d.name),
                    );
                    return None;
                }
                destinations.push(d);
            }
        }
        // What a row carries (key, aggregated fields) and the event time may not be personal.
        let span = privacy_table.and_then(|t| t.get("personal")).and_then(Item::span);
        let mut carried: Vec<(String, &FieldPath)> = source.key.iter().map(|k| ("source.key".to_owned(), k)).collect();
        carried.push(("source.event_time".into(), &source.event_time));
        for a in &aggregates {
            if let Some(f) = &a.field {
                carried.push((format!("aggregate {:?} field", a.name), f));
            }
        }
        for (what, field) in carried {
            if let Some(p) = personal.iter().find(|p| overlaps(p, field)) {
                self.error(
                    span.clone(),
                    "privacy.personal",
                    format!(
                        "{what} `{field}` is personal (personal names `{p}`), and rows never carry personal fields; key and aggregate on fields that are not personal, or remove `{p}` from personal"
                    ),
                );
            }
        }
        if let Some(dedup) = &dedup {
            let span = dedup_table.and_then(|t| t.span());
            if source.event_id.is_none() {
                self.error(span.clone(), "dedup", "[dedup] needs `event_id` in [source] to recognise a resent event; add event_id = \"<field>\" or remove [dedup]");
            }
            if dedup.on_conflict == OnConflict::Correct {
                let span = dedup_table.and_then(|t| t.get("on_conflict")).and_then(Item::span);
                self.corrections_can_run(span, &window, &aggregates);
            }
            if let Some(length) = window.length_ms() {
                let needed = length + window.allowed_lateness_ms;
                if dedup.horizon_ms < needed {
                    let span = dedup_table.and_then(|t| t.get("horizon")).and_then(Item::span).or(span);
                    self.error(
                        span,
                        "dedup.horizon",
                        format!(
                            "horizon {} is shorter than the window's length plus allowed_lateness ({}), so a duplicate could count twice; set horizon to at least \"{}\"",
                            format_duration_ms(dedup.horizon_ms),
                            format_duration_ms(needed),
                            format_duration_ms(needed)
                        ),
                    );
                }
            }
        }
        Some(Contract {
            pipeline,
            source,
            window,
            dedup,
            aggregates,
            alerts,
            destinations,
            reconcile,
            personal,
            limits,
            checks,
            text_hash: 0, // set by `Contract::parse` from the whole document
            text: String::new(),
        })
    }

    fn limits(&mut self, t: &Table) -> Option<Limits> {
        self.unknown_keys(t, "limits", LIMIT_KEYS);
        let d = Limits::default();
        let max = 1 << 40;
        let depth = self.whole(t, "limits", "max_depth", 1, MAX_DEPTH as i64);
        let fields = self.whole(t, "limits", "max_fields", 1, max);
        let key_bytes = self.whole(t, "limits", "max_key_bytes", 1, 1 << 30);
        let keys = self.whole(t, "limits", "max_keys", 1, max);
        let windows = self.whole(t, "limits", "max_open_windows", 1, max);
        let pick = |v: Option<i64>, default: usize| v.map_or(default, |v| v as usize);
        Some(Limits {
            max_depth: pick(depth?, d.max_depth),
            max_fields: pick(fields?, d.max_fields),
            max_key_bytes: pick(key_bytes?, d.max_key_bytes),
            max_keys: pick(keys?, d.max_keys),
            max_open_windows: pick(windows?, d.max_open_windows),
        })
    }

    /// An optional whole number in `min..=max`: `Some(None)` when absent, `None` when bad.
    pub(crate) fn whole(&mut self, t: &Table, section: &str, key: &str, min: i64, max: i64) -> Option<Option<i64>> {
        let Some(value) = self.value(t, section, key, false) else {
            return if t.contains_key(key) { None } else { Some(None) };
        };
        match value.as_integer() {
            Some(v) if (min..=max).contains(&v) => Some(Some(v)),
            _ => {
                self.error(
                    value.span(),
                    &format!("{section}.{key}"),
                    format!("must be a whole number from {min} to {max}"),
                );
                None
            }
        }
    }

    fn personal(&mut self, t: &Table) -> Option<Vec<FieldPath>> {
        self.unknown_keys(t, "privacy", PRIVACY_KEYS);
        let usage = "must be a list of field paths, e.g. personal = [\"email\", \"card.last4\"]";
        let value = self.value(t, "privacy", "personal", true)?;
        let Some(array) = value.as_array() else {
            self.error(value.span(), "privacy.personal", usage);
            return None;
        };
        let mut paths = Vec::new();
        for item in array.iter() {
            match item.as_str().map(FieldPath::parse) {
                Some(Ok(path)) => paths.push(path),
                Some(Err(message)) => self.error(item.span(), "privacy.personal", message),
                None => self.error(item.span(), "privacy.personal", usage),
            }
        }
        (paths.len() == array.len()).then_some(paths)
    }

    pub(crate) fn table<'t>(&mut self, root: &'t Table, name: &str, required: bool) -> Option<&'t Table> {
        match root.get(name) {
            Some(Item::Table(table)) => Some(table),
            Some(other) => {
                self.error(other.span(), name, format!("must be a table: write it as [{name}]"));
                None
            }
            None => {
                if required {
                    self.error(
                        None,
                        name,
                        format!("missing section [{name}]; every contract needs [pipeline], [source] and [window]"),
                    );
                }
                None
            }
        }
    }

    pub(crate) fn unknown_keys(&mut self, table: &Table, section: &str, allowed: &[&str]) {
        self.keys_in(table, section, &format!("[{section}]"), allowed);
    }

    /// A true-or-false setting, false when absent; `None` (an error noted)
    /// when it is something else. `name` is how the error names it, and
    /// `when_true` what true means.
    pub(crate) fn flag(&mut self, table: &Table, key: &str, name: &str, when_true: &str) -> Option<bool> {
        let Some(item) = table.get(key) else { return Some(false) };
        let flag = item.as_bool();
        if flag.is_none() {
            self.error(item.span(), name, format!("must be true ({when_true}) or false (the default)"));
        }
        flag
    }

    fn nonempty(&mut self, table: &Table, section: &str, key: &str) -> Option<String> {
        let text = self.string(table, section, key, true)?;
        if text.trim().is_empty() {
            let span = table.get(key).and_then(Item::span);
            self.error(span, &format!("{section}.{key}"), "must not be empty");
            return None;
        }
        Some(text)
    }

    fn path(&mut self, table: &Table, section: &str, key: &str, required: bool) -> Option<Option<FieldPath>> {
        let Some(text) = self.string(table, section, key, required) else {
            return if table.contains_key(key) || required { None } else { Some(None) };
        };
        match FieldPath::parse(&text) {
            Ok(path) => Some(Some(path)),
            Err(message) => {
                let span = table.get(key).and_then(Item::span);
                self.error(span, &format!("{section}.{key}"), message);
                None
            }
        }
    }

    fn rule(&mut self, table: &Table, section: &str) -> Option<Option<(String, Expr)>> {
        let Some(text) = self.string(table, section, "where", false) else {
            return if table.contains_key("where") { None } else { Some(None) };
        };
        match parse_rule(&text) {
            Ok(expr) => Some(Some((text, expr))),
            Err(message) => {
                let span = table.get("where").and_then(Item::span);
                self.error(span, &format!("{section}.where"), format!("rule does not parse: {message}"));
                None
            }
        }
    }

    /// An optional string key read by `parse`, `default` when absent; `None`
    /// (with the error recorded at its line) when it is not a string or
    /// `parse` refuses it.
    fn parsed<T>(
        &mut self,
        t: &Table,
        section: &str,
        key: &str,
        default: T,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Option<T> {
        match self.string(t, section, key, false) {
            None if t.contains_key(key) => None,
            None => Some(default),
            Some(text) => match parse(&text) {
                Ok(value) => Some(value),
                Err(message) => {
                    self.error(t.get(key).and_then(Item::span), &format!("{section}.{key}"), message);
                    None
                }
            },
        }
    }

    /// `on_conflict = "correct"` takes a counted version back out of its
    /// windows: only count, sum and avg can give back what one event added,
    /// and a session cannot split again once an event merged it.
    fn corrections_can_run(&mut self, span: Option<Range<usize>>, window: &WindowSpec, aggregates: &[Aggregate]) {
        if matches!(window.kind, WindowKind::Session { .. }) {
            self.error(
                span.clone(),
                "dedup.on_conflict",
                "on_conflict = \"correct\" cannot run with session windows (a correction cannot split a session that an event merged); use tumbling, hopping or global windows, or on_conflict = \"ledger\"",
            );
        }
        for a in aggregates {
            if !matches!(a.func, AggFn::Count | AggFn::Sum | AggFn::Avg) {
                self.error(
                    span.clone(),
                    "dedup.on_conflict",
                    format!(
                        "on_conflict = \"correct\" works with count, sum and avg only, and aggregate `{}` is {}; drop that aggregate or use on_conflict = \"ledger\"",
                        a.name,
                        a.func.as_str()
                    ),
                );
            }
        }
    }

    fn pipeline(&mut self, t: &Table) -> Option<Pipeline> {
        self.unknown_keys(t, "pipeline", PIPELINE_KEYS);
        let name = self.string(t, "pipeline", "name", true);
        if let Some(name) = &name {
            if name.is_empty()
                || name.len() > 64
                || !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            {
                let span = t.get("name").and_then(Item::span);
                self.error(
                    span,
                    "pipeline.name",
                    format!("`{name}` is not a pipeline name: use 1 to 64 of a-z, 0-9 and _"),
                );
            }
        }
        let version = match self.value(t, "pipeline", "version", true) {
            Some(value) => match value.as_integer() {
                Some(v) if (1..=i64::from(u32::MAX)).contains(&v) => Some(v as u32),
                _ => {
                    self.error(
                        value.span(),
                        "pipeline.version",
                        "must be a whole number of at least 1 (bump it on any change that alters results)",
                    );
                    None
                }
            },
            None => None,
        };
        let owner = self.nonempty(t, "pipeline", "owner");
        let steward = self.nonempty(t, "pipeline", "steward");
        let decision = self.nonempty(t, "pipeline", "decision");
        let start_ms = match self.string(t, "pipeline", "start", false) {
            None => None,
            Some(s) if s == "earliest" => None,
            Some(s) => {
                match chrono::DateTime::parse_from_rfc3339(&s) {
                    Ok(at) => Some(at.timestamp_millis()),
                    Err(e) => {
                        let span = t.get("start").and_then(Item::span);
                        self.error(
                        span,
                        "pipeline.start",
                        format!("`{s}` is not \"earliest\" or an RFC 3339 time ({e}); write e.g. \"2026-11-01T00:00:00Z\""),
                    );
                        None
                    }
                }
            }
        };
        let promote = match self.string(t, "pipeline", "promote", false).as_deref() {
            None | Some("manual") => Promote::Manual,
            Some("auto") => Promote::Auto,
            Some(other) => {
                let span = t.get("promote").and_then(Item::span);
                self.error(span, "pipeline.promote", format!("`{other}` is not \"manual\" or \"auto\""));
                Promote::Manual
            }
        };
        Some(Pipeline {
            name: name?,
            version: version?,
            owner: owner?,
            steward: steward?,
            decision: decision?,
            start_ms,
            promote,
        })
    }

    fn source(&mut self, t: &Table) -> Option<Source> {
        self.unknown_keys(t, "source", SOURCE_KEYS);
        let topic = self.nonempty(t, "source", "topic");
        let event_time = self.path(t, "source", "event_time", true).flatten();
        let key = match self.value(t, "source", "key", true) {
            Some(value) => match value.as_array() {
                Some(array) => {
                    let mut paths = Vec::new();
                    let mut ok = true;
                    for item in array.iter() {
                        match item.as_str().map(FieldPath::parse) {
                            Some(Ok(path)) => paths.push(path),
                            Some(Err(message)) => {
                                self.error(item.span(), "source.key", message);
                                ok = false;
                            }
                            None => {
                                self.error(
                                    item.span(),
                                    "source.key",
                                    "each key is a field path in quotes, e.g. key = [\"account_id\"]",
                                );
                                ok = false;
                            }
                        }
                    }
                    ok.then_some(paths)
                }
                None => {
                    self.error(
                        value.span(),
                        "source.key",
                        "must be a list of field paths, e.g. key = [\"account_id\"], or [] for one group",
                    );
                    None
                }
            },
            None => None,
        };
        let event_time_format = self.parsed(t, "source", "event_time_format", TimeFormat::Auto, TimeFormat::parse);
        let event_time_zone = self.parsed(t, "source", "event_time_zone", Zone::Utc, Zone::parse);
        let event_id = self.path(t, "source", "event_id", false);
        let rule = self.rule(t, "source");
        let max_delay = self.duration(t, "source", "max_delay");
        let max_future = self.duration(t, "source", "max_future");
        let max_event_bytes = match t.get("max_event_bytes") {
            None => Some(MAX_EVENT_BYTES_DEFAULT),
            Some(item) => match item.as_integer() {
                Some(n) if n > 0 && n <= (1 << 30) => Some(n as usize),
                _ => {
                    self.error(
                        item.span(),
                        "source.max_event_bytes",
                        "must be a whole number of bytes between 1 and 1073741824 (default 1048576)",
                    );
                    None
                }
            },
        };
        let kind = match self.string(t, "source", "kind", false).as_deref() {
            None => Some(None),
            Some("log") => Some(Some(SourceKind::Log)),
            Some("kafka") => Some(Some(SourceKind::Kafka)),
            Some(other) => {
                self.error(
                    t.get("kind").and_then(Item::span),
                    "source.kind",
                    format!("{other:?} is not a source; use \"log\" (the embedded log) or \"kafka\""),
                );
                None
            }
        };
        let brokers = self.string(t, "source", "brokers", false);
        let group = self.string(t, "source", "group", false);
        Some(Source {
            kind: kind?,
            brokers,
            group,
            topic: topic?,
            event_time: event_time?,
            event_time_format: event_time_format?,
            event_time_zone: event_time_zone?,
            key: key?,
            event_id: event_id?,
            rule: rule?,
            max_delay_ms: max_delay?.unwrap_or(0),
            max_future_ms: max_future?,
            max_event_bytes: max_event_bytes?,
        })
    }

    fn window(&mut self, t: &Table) -> Option<WindowSpec> {
        self.unknown_keys(t, "window", WINDOW_KEYS);
        let kind_text = self.string(t, "window", "type", true)?;
        let size = self.duration(t, "window", "size")?;
        let slide = self.duration(t, "window", "slide")?;
        let gap = self.duration(t, "window", "gap")?;
        let lateness = self.duration(t, "window", "allowed_lateness")?.unwrap_or(0);
        let span = |key: &str| t.get(key).and_then(Item::span);
        let kind_span = span("type");
        let not_for = |reader: &mut Self, key: &str, present: bool, kind: &str, hint: &str| {
            if present {
                reader.error(
                    span(key),
                    &format!("window.{key}"),
                    format!("`{key}` does not apply to {kind} windows; {hint}"),
                );
            }
        };
        let positive = |reader: &mut Self, key: &str, value: Option<i64>| -> Option<i64> {
            match value {
                Some(ms) if ms > 0 => Some(ms),
                Some(_) => {
                    reader.error(span(key), &format!("window.{key}"), "must be longer than zero");
                    None
                }
                None => {
                    reader.error(
                        t.span(),
                        &format!("window.{key}"),
                        format!("missing required key for these windows; add {key} = \"5m\" (for example)"),
                    );
                    None
                }
            }
        };
        let kind = match kind_text.as_str() {
            "tumbling" => {
                not_for(self, "slide", slide.is_some(), "tumbling", "remove it, or use type = \"hopping\"");
                not_for(self, "gap", gap.is_some(), "tumbling", "remove it, or use type = \"session\"");
                WindowKind::Tumbling { size_ms: positive(self, "size", size)? }
            }
            "hopping" => {
                not_for(self, "gap", gap.is_some(), "hopping", "remove it");
                let size_ms = positive(self, "size", size);
                let slide_ms = positive(self, "slide", slide);
                let (size_ms, slide_ms) = (size_ms?, slide_ms?);
                if size_ms % slide_ms != 0 {
                    self.error(
                        span("slide"),
                        "window.slide",
                        format!(
                            "slide {} does not divide size {}; choose a slide that divides the size exactly",
                            format_duration_ms(slide_ms),
                            format_duration_ms(size_ms)
                        ),
                    );
                    return None;
                }
                WindowKind::Hopping { size_ms, slide_ms }
            }
            "session" => {
                not_for(self, "size", size.is_some(), "session", "a session's length comes from `gap`");
                not_for(self, "slide", slide.is_some(), "session", "remove it");
                WindowKind::Session { gap_ms: positive(self, "gap", gap)? }
            }
            "global" => {
                not_for(self, "size", size.is_some(), "global", "a global window has no end");
                not_for(self, "slide", slide.is_some(), "global", "remove it");
                not_for(self, "gap", gap.is_some(), "global", "remove it");
                WindowKind::Global
            }
            other => {
                self.error(
                    kind_span,
                    "window.type",
                    format!("`{other}` is not a window type; use tumbling, hopping, session or global"),
                );
                return None;
            }
        };
        let late = match self.string(t, "window", "late", false) {
            Some(text) => match text.as_str() {
                "discard" => LatePolicy::Discard,
                "hold" => LatePolicy::Hold,
                "revise" => LatePolicy::Revise,
                other => {
                    self.error(
                        span("late"),
                        "window.late",
                        format!("`{other}` is not a late policy; use discard, hold or revise"),
                    );
                    return None;
                }
            },
            None if t.contains_key("late") => return None,
            // Without a policy: drop late events when there is no lateness,
            // revise when there is (what Flink does with allowed lateness).
            None if lateness > 0 => LatePolicy::Revise,
            None => LatePolicy::Discard,
        };
        if late == LatePolicy::Discard && lateness > 0 {
            self.error(
                span("allowed_lateness").or(span("late")),
                "window.allowed_lateness",
                format!(
                    "late = \"discard\" drops every late event, so allowed_lateness {} would never be used; set allowed_lateness = \"0s\" or choose late = \"hold\" or \"revise\"",
                    format_duration_ms(lateness)
                ),
            );
            return None;
        }
        let early = match t.get("early") {
            None => false,
            Some(item) => match item.as_bool() {
                Some(b) => b,
                None => {
                    self.error(item.span(), "window.early", "must be true or false");
                    return None;
                }
            },
        };
        Some(WindowSpec { kind, allowed_lateness_ms: lateness, late, early })
    }

    fn alerts(&mut self, t: &Table) -> Option<Alerts> {
        self.unknown_keys(t, "alerts", ALERT_KEYS);
        let max_lag_ms = self.duration(t, "alerts", "max_lag");
        let max_watermark_age_ms = self.duration(t, "alerts", "max_watermark_age");
        let max_oldest_unprocessed_ms = self.duration(t, "alerts", "max_oldest_unprocessed");
        let max_ledger_rate = match t.get("max_ledger_rate") {
            None => Some(None),
            Some(item) => match item.as_float().or_else(|| item.as_integer().map(|i| i as f64)) {
                Some(r) if (0.0..=1.0).contains(&r) => Some(Some(r)),
                _ => {
                    self.error(
                        item.span(),
                        "alerts.max_ledger_rate",
                        "must be a number from 0 to 1 (0.01 is one event in a hundred)",
                    );
                    None
                }
            },
        };
        let max_corrected_windows = self.whole(t, "alerts", "max_corrected_windows", 0, i64::MAX);
        let max_destination_lag_ms = self.duration(t, "alerts", "max_destination_lag");
        let webhook = self.string(t, "alerts", "webhook", false);
        if let Some(url) = &webhook {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                let span = t.get("webhook").and_then(Item::span);
                self.error(span, "alerts.webhook", "must be an http:// or https:// URL");
            }
        }
        Some(Alerts {
            max_lag_ms: max_lag_ms?,
            max_watermark_age_ms: max_watermark_age_ms?,
            max_oldest_unprocessed_ms: max_oldest_unprocessed_ms?,
            max_ledger_rate: max_ledger_rate?,
            max_corrected_windows: max_corrected_windows?.map(|n| n as u64),
            max_destination_lag_ms: max_destination_lag_ms?,
            webhook,
        })
    }

    fn reconcile(&mut self, t: &Table, source: &Source, aggregates: &[Aggregate]) -> Option<Reconcile> {
        self.unknown_keys(t, "reconcile", RECONCILE_KEYS);
        let system_of_record = match t.get("system_of_record") {
            None => None,
            Some(Item::Table(sor)) => Some(self.system_of_record(sor, source, aggregates)?),
            Some(other) => {
                let span = other.span();
                self.error(
                    span,
                    "reconcile.system_of_record",
                    "must be a table: write it as [reconcile.system_of_record]",
                );
                return None;
            }
        };
        let every = self.duration(t, "reconcile", "every");
        let delay = self.duration(t, "reconcile", "delay");
        let (every, delay) = (every?, delay?);
        if every.is_some_and(|e| e < MIN_RECONCILE_EVERY_MS) {
            self.error(
                t.get("every").and_then(Item::span),
                "reconcile.every",
                "must be at least 10s (each run is a backfill over the pipeline's input), e.g. \"1h\"",
            );
            return None;
        }
        if delay.is_some() && every.is_none() {
            let span = t.get("delay").and_then(Item::span);
            self.error(
                span,
                "reconcile.delay",
                "is the wait before a scheduled run; say how often with every = \"1h\"",
            );
            return None;
        }
        Some(Reconcile { every_ms: every, delay_ms: delay.unwrap_or(0).max(0), system_of_record })
    }

    fn system_of_record(&mut self, t: &Table, source: &Source, aggregates: &[Aggregate]) -> Option<SystemOfRecord> {
        let section = "reconcile.system_of_record";
        self.unknown_keys(t, section, SYSTEM_OF_RECORD_KEYS);
        let query = self.nonempty(t, section, "query");
        let map = self.nonempty(t, section, "map");
        let tolerance = self.string(t, section, "tolerance", false);
        if let Some(url) = t.get("url") {
            self.error(
                url.span(),
                &format!("{section}.url"),
                "a contract holds no URL (its versions are kept where every reader of the pipeline sees them): put the URL in weir.toml as [connections.NAME] url = \"...\", with an account that may only read the system of record, and write connection = \"NAME\" here",
            );
            return None;
        }
        if !t.contains_key("connection") {
            self.error(
                t.span(),
                &format!("{section}.connection"),
                "missing required key; name the [connections.NAME] of weir.toml that reads the system of record, e.g. connection = \"billing_reader\" (an account of its own that may only read it, never weir's store's)",
            );
            return None;
        }
        let connection = self.nonempty(t, section, "connection");
        let (query, map, connection) = (query?, map?, connection?);
        let key_names: Vec<String> = source.key.iter().map(ToString::to_string).collect();
        let names: Vec<String> = aggregates.iter().map(|a| a.name.clone()).collect();
        let map = match crate::reconcile::Mapping::parse(&map, &key_names, &names) {
            Ok(m) => m,
            Err(message) => {
                self.error(t.get("map").and_then(Item::span), &format!("{section}.map"), message);
                return None;
            }
        };
        let tolerance = match crate::reconcile::Tolerance::parse(tolerance.as_deref().unwrap_or("0")) {
            Ok(tol) => tol,
            Err(message) => {
                self.error(t.get("tolerance").and_then(Item::span), &format!("{section}.tolerance"), message);
                return None;
            }
        };
        Some(SystemOfRecord { query, map, tolerance, connection })
    }

    fn dedup(&mut self, t: &Table) -> Option<Dedup> {
        self.unknown_keys(t, "dedup", DEDUP_KEYS);
        let on_conflict = match self.string(t, "dedup", "on_conflict", false).as_deref() {
            None if t.contains_key("on_conflict") => return None,
            None | Some("ledger") => OnConflict::Ledger,
            Some("correct") => OnConflict::Correct,
            Some(other) => {
                self.error(
                    t.get("on_conflict").and_then(Item::span),
                    "dedup.on_conflict",
                    format!("`{other}` is not a conflict policy; use \"ledger\" (keep the first version) or \"correct\" (a later version replaces it)"),
                );
                return None;
            }
        };
        match self.duration(t, "dedup", "horizon")? {
            Some(horizon_ms) if horizon_ms > 0 => Some(Dedup { horizon_ms, on_conflict }),
            Some(_) => {
                self.error(t.get("horizon").and_then(Item::span), "dedup.horizon", "must be longer than zero");
                None
            }
            None => {
                self.error(
                    t.span(),
                    "dedup.horizon",
                    "missing required key; add horizon = \"24h\" (at least the window's length plus allowed_lateness)",
                );
                None
            }
        }
    }

    fn aggregates(&mut self, root: &Table) -> Option<Vec<Aggregate>> {
        let tables: Vec<&Table> = match root.get("aggregate") {
            None => return Some(Vec::new()),
            Some(Item::ArrayOfTables(array)) => array.iter().collect(),
            Some(other) => {
                self.error(other.span(), "aggregate", "write each aggregate as its own [[aggregate]] table");
                return None;
            }
        };
        let mut out = Vec::new();
        let mut ok = true;
        for (i, t) in tables.into_iter().enumerate() {
            let section = format!("aggregate[{}]", i + 1);
            match self.aggregate(t, &section) {
                Some(agg) => {
                    if out.iter().any(|a: &Aggregate| a.name == agg.name) {
                        self.error(
                            t.get("name").and_then(Item::span),
                            &format!("{section}.name"),
                            format!("`{}` names two aggregates; give each a unique name", agg.name),
                        );
                        ok = false;
                    }
                    out.push(agg);
                }
                None => ok = false,
            }
        }
        ok.then_some(out)
    }

    fn aggregate(&mut self, t: &Table, section: &str) -> Option<Aggregate> {
        self.item_keys(t, section, "aggregate", AGGREGATE_KEYS);
        let name = self.item_name(t, section, "an aggregate");
        let func_text = self.string(t, section, "fn", true);
        let func = match func_text.as_deref().map(|f| (f, AggFn::parse(f))) {
            Some((_, Some(func))) => Some(func),
            Some((text, None)) => {
                self.error(
                    t.get("fn").and_then(Item::span),
                    &format!("{section}.fn"),
                    format!(
                        "`{text}` is not an aggregate; use count, sum, min, max, avg, count_distinct, first or last"
                    ),
                );
                None
            }
            None => None,
        };
        let field = self.path(t, section, "field", false);
        let rule = self.rule(t, section);
        let (func, field) = (func?, field?);
        if field.is_none() && func != AggFn::Count {
            self.error(
                t.span(),
                &format!("{section}.field"),
                format!("`{}` needs a field; add field = \"<path>\"", func.as_str()),
            );
            return None;
        }
        Some(Aggregate { name: name?, func, field, rule: rule? })
    }
}

/// Whether one path is the other or inside it (`card` and `card.last4`).
pub fn overlaps(a: &FieldPath, b: &FieldPath) -> bool {
    let (a, b) = (a.segments(), b.segments());
    let n = a.len().min(b.len());
    a[..n] == b[..n]
}

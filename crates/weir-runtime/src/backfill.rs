//! Backfill (SPEC.md 9): the windows of a version starting in `[from, to)`
//! recomputed with batch semantics over the retained input, and a
//! `corrected` row published for each one whose values or `events` differ
//! from its last published row.
//!
//! The run, as a [`Worker`] does it beside the live runner (it shares no
//! state with it, and reads the input with its own reader):
//!
//! 1. the live version's checkpoints say how far it has settled (the lowest
//!    watermark over its scopes); only windows settled there are
//!    corrected, since an open window will still publish rows of its own;
//! 2. the ledger's `too_late`, `duplicate`, `duplicate_conflict` and
//!    `superseded` entries near the range are looked up, by partition and
//!    offset;
//! 3. every retained record is read once: into a batch engine (every
//!    valid, first-seen event counts, whatever its arrival time) and, when
//!    the ledger named it, into a batch engine of that cause (the events of
//!    one cause among themselves counted as a batch counts them: a later
//!    version of the same payment replaces the first), which gives the
//!    amounts the cause carried per window;
//! 4. [`decide`] compares the batch rows of the range with the published
//!    ones, purely;
//! 5. the store publishes the corrections with the run's report in one
//!    transaction, checking that each window's published revision is still
//!    the one read (else the run is computed again).
//!
//! A second backfill over the same range finds nothing to correct.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rust_decimal::Decimal;
use serde_json::{json, Map, Value};
use weir_contract::{AggFn, Contract, WindowKind};
use weir_engine::{Engine, EventIn, Mode, OutValue, Output, Row, RowFormat, Status};
use weir_log::Log;
use weir_store::{Backfill, BackfillAsk, Correction, Finish, ResultFilter, Schedule, Store};

use crate::causes::{carried, cause_entries, window_span_ms};
pub use crate::causes::{decimal, same_values, Carried, Causes, Published, CAUSES, WINDOWS_LISTED};

/// One record of the input.
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    pub partition: u32,
    pub offset: u64,
    /// Append time (the embedded log) or timestamp (Kafka).
    pub time_ms: Option<i64>,
    pub bytes: &'a [u8],
    /// A Kafka record with its own `$kafka` member, ledgered `bad_type` live.
    pub forged: bool,
}

/// A topic's retained input, read once from its first kept record to the
/// end it has when the read starts.
pub trait Input: Send {
    fn partitions(&mut self) -> crate::Result<u32>;
    /// The earliest time from which the input is whole, when retention
    /// removed older records (`None`: nothing was removed).
    fn kept_from(&mut self) -> crate::Result<Option<i64>>;
    /// Every record, partition by partition, in offset order.
    fn read(&mut self, each: &mut dyn FnMut(Record<'_>) -> crate::Result<()>) -> crate::Result<()>;
}

/// The embedded log as a backfill's input.
pub struct LogInput {
    pub log: Log,
    pub topic: String,
}

impl Input for LogInput {
    fn partitions(&mut self) -> crate::Result<u32> {
        Ok(self.log.partitions(&self.topic)?)
    }

    fn kept_from(&mut self) -> crate::Result<Option<i64>> {
        let mut kept_from = None;
        for (p, (first, end)) in self.log.bounds(&self.topic)?.into_iter().enumerate() {
            if first == 0 || first >= end {
                continue;
            }
            if let Some(r) = self.log.read(&self.topic, p as u32, first, 1, 1)?.first() {
                kept_from = Some(kept_from.map_or(r.append_ms, |k: i64| k.max(r.append_ms)));
            }
        }
        Ok(kept_from)
    }

    fn read(&mut self, each: &mut dyn FnMut(Record<'_>) -> crate::Result<()>) -> crate::Result<()> {
        for (p, (first, end)) in self.log.bounds(&self.topic)?.into_iter().enumerate() {
            let mut next = first;
            while next < end {
                let records = self.log.read(&self.topic, p as u32, next, 10_000, 4 << 20)?;
                if records.is_empty() {
                    break;
                }
                for r in records.iter().take_while(|r| r.offset < end) {
                    each(Record {
                        partition: p as u32,
                        offset: r.offset,
                        time_ms: Some(r.append_ms),
                        bytes: &r.payload,
                        forged: false,
                    })?;
                    next = r.offset + 1;
                }
                if records.last().is_some_and(|r| r.offset >= end) {
                    break;
                }
            }
        }
        Ok(())
    }
}

/// What a request for a backfill must satisfy before it is stored.
pub fn check_request(
    contract: &Contract,
    (from_ms, to_ms): (i64, i64),
    settled: Option<i64>,
    kept_from: Option<i64>,
) -> Result<(), String> {
    let name = &contract.pipeline.name;
    let t = weir_engine::time::format_rfc3339_ms;
    if from_ms >= to_ms {
        return Err(format!("`from` ({}) must be before `to` ({})", t(from_ms), t(to_ms)));
    }
    if contract.window.kind == WindowKind::Global {
        return Err(format!(
            "pipeline {name} has a global window, which settles only at the end of a batch: a stream has no settled window to correct"
        ));
    }
    if let Some(kept) = kept_from.filter(|&k| from_ms < k) {
        return Err(format!(
            "the range starts at {}, but the retained input is whole only from {} (retention removed older records); backfill from that time or later",
            t(from_ms),
            t(kept)
        ));
    }
    let Some(wm) = settled else {
        return Err(format!(
            "pipeline {name} v{} has no checkpoint yet, so no window has settled; backfill once it has read its input",
            contract.pipeline.version
        ));
    };
    if let Some(first_open) = first_unsettled_start(contract, wm).filter(|&s| to_ms > s) {
        return Err(format!(
            "the windows starting at {} or later have not settled (the watermark is {}); backfill to at most {}",
            t(first_open),
            t(wm),
            t(first_open)
        ));
    }
    Ok(())
}

/// How often a run's claim is renewed while it reads (its lease is
/// `weir_store::backfill::LEASE_MS`).
const RENEW_EVERY: Duration = Duration::from_secs(3);

/// How often a worker looks whether a scheduled run is due.
const SCHEDULE_CHECK: Duration = Duration::from_secs(5);

/// The end of the range of window starts settled at watermark `wm`: the
/// earliest unsettled fixed window's start, or for sessions `wm` less the
/// gap and lateness (each session is checked again by [`decide`]).
fn settled_before(contract: &Contract, wm: i64) -> i64 {
    first_unsettled_start(contract, wm).unwrap_or_else(|| wm.saturating_sub(window_span_ms(contract)))
}

/// The start of the earliest fixed window not settled at watermark `wm`
/// (`None` for sessions, which are checked one by one).
fn first_unsettled_start(contract: &Contract, wm: i64) -> Option<i64> {
    let (size, slide) = match contract.window.kind {
        WindowKind::Tumbling { size_ms } => (size_ms, size_ms),
        WindowKind::Hopping { size_ms, slide_ms } => (size_ms, slide_ms),
        WindowKind::Session { .. } | WindowKind::Global => return None,
    };
    // A window starting at s has settled when s + size + lateness <= wm.
    let last_settled = wm.saturating_sub(size).saturating_sub(contract.window.allowed_lateness_ms);
    Some(last_settled.div_euclid(slide).saturating_add(1).saturating_mul(slide))
}

/// How far a version has settled: the lowest watermark over its
/// checkpoints (`None` before any checkpoint or while one has none).
pub fn settled_through(contract: &Contract, headers: &[(u32, Vec<u8>)]) -> crate::Result<Option<i64>> {
    let mut lowest: Option<i64> = None;
    if headers.is_empty() {
        return Ok(None);
    }
    for (_, header) in headers {
        let engine = Engine::restore_parts(contract, header, std::iter::empty(), std::iter::empty::<&[u8]>())?;
        let Some(wm) = engine.watermark() else { return Ok(None) };
        lowest = Some(lowest.map_or(wm, |l| l.min(wm)));
    }
    Ok(lowest)
}

/// What [`decide`] found.
#[derive(Debug, Default)]
pub struct Decided {
    pub corrections: Vec<Correction>,
    /// Windows of the range compared (settled ones, from either side).
    pub checked: u64,
    /// Corrected windows that had published no row.
    pub new: u64,
    /// Corrected windows the batch has no events for.
    pub withdrawn: u64,
    /// Windows of the range not settled in the stream, left out.
    pub unsettled: u64,
    /// Per corrected window: what was published before (`None`: nothing).
    pub before: Vec<Option<Published>>,
}

/// The rule of SPEC.md 9, purely: every settled window of the range whose
/// batch values or `events` differ from its last published row gets a
/// `corrected` row with the next revision (a window with no published row,
/// revision 1; a published window the batch has no events for, a row with
/// `events` 0). Unchanged windows get nothing.
pub fn decide(
    contract: &Contract,
    format: &RowFormat,
    batch: Vec<Row>,
    published: Vec<Published>,
    (from_ms, to_ms): (i64, i64),
    settled: i64,
) -> Decided {
    let lateness = contract.window.allowed_lateness_ms;
    let is_settled = |end: Option<i64>| end.is_some_and(|e| e.saturating_add(lateness) <= settled);
    let mut by_window: HashMap<(String, i64), Published> =
        published.into_iter().map(|p| ((p.key.to_string(), p.start), p)).collect();
    let mut d = Decided::default();
    let mut line = String::new();
    for mut row in batch {
        let Some(start) = row.window_start.filter(|s| (from_ms..to_ms).contains(s)) else { continue };
        if !is_settled(row.window_end) {
            d.unsettled += 1;
            continue;
        }
        d.checked += 1;
        line.clear();
        format.write_row(&row, &mut line);
        let written: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
        let key = written.get("key").cloned().unwrap_or(Value::Null);
        let before = by_window.remove(&(key.to_string(), start));
        let values = written.get("values").cloned().unwrap_or(Value::Null);
        if let Some(p) = &before {
            if p.events == row.events && same_values(&p.values, &values) {
                continue;
            }
        }
        d.new += u64::from(before.is_none());
        row.status = Status::Corrected;
        let replaces = before.as_ref().map_or(0, |p| p.revision);
        row.revision = replaces + 1;
        row.watermark = Some(settled);
        d.corrections.push(Correction { row, replaces });
        d.before.push(before);
    }
    // Published windows of the range the batch has no events for.
    let mut rest: Vec<Published> = by_window.into_values().collect();
    rest.sort_by_key(|a| (a.start, a.key.to_string()));
    for p in rest {
        if !(from_ms..to_ms).contains(&p.start) || p.status == "provisional" || !is_settled(p.end) {
            d.unsettled += u64::from(p.status == "provisional");
            continue;
        }
        d.checked += 1;
        if p.events == 0 {
            continue;
        }
        let Some(key) = key_bytes(format, &p.key) else { continue };
        let row = Row {
            key,
            window_start: Some(p.start),
            window_end: p.end,
            status: Status::Corrected,
            revision: p.revision + 1,
            values: contract.aggregates.iter().map(|a| empty_value(a.func)).collect(),
            events: 0,
            late_events: 0,
            sources: Default::default(),
            watermark: Some(settled),
        };
        d.withdrawn += 1;
        d.corrections.push(Correction { row, replaces: p.revision });
        d.before.push(Some(p));
    }
    d
}

/// An aggregate over no events: counts are 0, the rest null.
fn empty_value(func: AggFn) -> OutValue {
    match func {
        AggFn::Count | AggFn::CountDistinct => OutValue::Int(0),
        _ => OutValue::Null,
    }
}

/// A row's `key` object back to the engine's key bytes, in the contract's key order.
fn key_bytes(format: &RowFormat, key: &Value) -> Option<weir_engine::KeyBytes> {
    let names = &format.key_names;
    let mut parts = Vec::with_capacity(names.len());
    let texts: Vec<String> = names
        .iter()
        .map(|n| match key.get(n)? {
            Value::Number(n) => Some(n.to_string()),
            _ => Some(String::new()),
        })
        .collect::<Option<_>>()?;
    for (n, text) in names.iter().zip(&texts) {
        parts.push(match key.get(n)? {
            Value::String(s) => weir_engine::KeyValue::Str(s),
            Value::Bool(b) => weir_engine::KeyValue::Bool(*b),
            Value::Number(_) => weir_engine::KeyValue::Int(text),
            _ => return None,
        });
    }
    Some(weir_engine::encode_key(parts))
}

/// A window's values before (`None`: no row) and after.
type Pair<'a> = (Option<&'a Value>, &'a Value);

/// Per numeric aggregate, `after - before` added up over `pairs` (with
/// `absolute`, each window's difference counted as a positive amount).
fn differences(contract: &Contract, pairs: &[Pair<'_>], absolute: bool) -> Map<String, Value> {
    let mut out = Map::new();
    for a in &contract.aggregates {
        let mut total = Decimal::ZERO;
        let mut numeric = false;
        for (before, after) in pairs {
            let num = |v: Option<&Value>| v.and_then(|v| v.get(&a.name)).and_then(Value::as_number).and_then(decimal);
            let (b, n) = (num(*before), num(Some(after)));
            numeric |= b.is_some() || n.is_some();
            let d = n.unwrap_or_default() - b.unwrap_or_default();
            total += if absolute { d.abs() } else { d };
        }
        if numeric {
            out.insert(a.name.clone(), Value::String(total.normalize().to_string()));
        }
    }
    out
}

/// What a backfill computed: the rows to publish and its report.
pub struct Computed {
    pub corrections: Vec<Correction>,
    pub report: Value,
    /// The windows the batch computed, in the range and its margins.
    pub batch_windows: usize,
}

/// Steps 1-4 of a run (see the module's comment). `tick` is called every
/// 10,000 records (to renew the claim when due, and to stop when it errs).
pub fn compute(
    contract: &Contract,
    input: &mut dyn Input,
    store: &dyn Store,
    run: &Backfill,
    tick: &mut dyn FnMut() -> crate::Result<()>,
) -> crate::Result<Computed> {
    let headers = store.checkpoint_headers(&run.pipeline, run.version)?;
    let settled = settled_through(contract, &headers)?.ok_or_else(|| {
        crate::refused!("version {} has no checkpoint with a watermark yet: nothing has settled", run.version)
    })?;
    let span = window_span_ms(contract);
    let wanted = cause_entries(store, (&run.pipeline, run.version), (run.from_ms, run.to_ms), span)?;
    let partitions = input.partitions()?;
    let mut batch = Engine::new(contract, Mode::Batch, partitions)?;
    batch.set_clock(weir_log::now_ms()); // what is `future` now stays out
    if let Some(times) = read_times(contract, (run.from_ms, run.to_ms)) {
        batch.read_times(times);
    }
    let mut cause_engines: BTreeMap<&'static str, Engine> = BTreeMap::new();
    for reason in CAUSES {
        cause_engines.insert(reason.as_str(), Engine::new(contract, Mode::Batch, partitions)?);
    }
    let start_ms = contract.pipeline.start_ms;
    let mut out = Output::default();
    let mut read = 0u64;
    input.read(&mut |r: Record<'_>| {
        if start_ms.is_some_and(|s| r.time_ms.is_some_and(|t| t < s)) {
            return Ok(());
        }
        let event = EventIn { partition: r.partition, offset: r.offset, bytes: r.bytes };
        if r.forged {
            batch.refuse(event, weir_engine::Reason::BadType, weir_engine::intake::reserved_why(), &mut out);
            out.clear();
            return Ok(());
        }
        batch.process(event, &mut out);
        if let Some(entries) = wanted.get(&(r.partition, r.offset)) {
            let mut seen = HashSet::new();
            for e in entries.iter().filter(|e| seen.insert(e.reason)) {
                if let Some(engine) = cause_engines.get_mut(e.reason.as_str()) {
                    engine.process(event, &mut out);
                }
            }
        }
        out.clear();
        read += 1;
        if read.is_multiple_of(10_000) {
            tick()?;
        }
        Ok(())
    })?;
    batch.finish(&mut out);
    let rows = std::mem::take(&mut out.rows);
    let format = batch.format().clone();
    let filter =
        ResultFilter { from_ms: Some(run.from_ms), to_ms: Some(run.to_ms), limit: i64::MAX, ..Default::default() };
    let published: Vec<Published> =
        store.results(&run.pipeline, run.version, &filter)?.rows.iter().filter_map(|t| Published::parse(t)).collect();
    let batch_windows = rows.len();
    let decided = decide(contract, &format, rows, published, (run.from_ms, run.to_ms), settled);
    let causes = carried(&format, &wanted, cause_engines);
    let report = report(contract, &format, run, settled, read, &decided, &causes);
    Ok(Computed { corrections: decided.corrections, report, batch_windows })
}

/// The event times whose events can change a fixed window starting in
/// `[from, to)`: those of its windows, and the dedup horizon on both sides,
/// within which another version of one of their ids is compared with it
/// (SPEC.md 3.3: an id is remembered for `horizon` of event time). A
/// version further away is not read, as a stream would have forgotten the
/// id by then. Sessions have no such bound: a session starting in the range
/// may be joined by any later event, so a backfill of sessions reads all.
fn read_times(contract: &Contract, (from_ms, to_ms): (i64, i64)) -> Option<std::ops::Range<i64>> {
    let size_ms = match contract.window.kind {
        WindowKind::Tumbling { size_ms } | WindowKind::Hopping { size_ms, .. } => size_ms,
        WindowKind::Session { .. } | WindowKind::Global => return None,
    };
    let horizon_ms = contract.dedup.as_ref().map_or(0, |d| d.horizon_ms);
    Some(from_ms.saturating_sub(horizon_ms)..to_ms.saturating_add(size_ms).saturating_add(horizon_ms))
}

/// The run's report: what it checked and changed, the difference per
/// aggregate, and the causes in the corrected windows.
fn report(
    contract: &Contract,
    format: &RowFormat,
    run: &Backfill,
    settled: i64,
    read: u64,
    d: &Decided,
    causes: &Causes,
) -> Value {
    let t = weir_engine::time::format_rfc3339_ms;
    let mut line = String::new();
    let mut windows = Vec::new();
    let mut pairs_owned: Vec<(Option<Value>, Value)> = Vec::new();
    let mut totals: BTreeMap<&'static str, (u64, Vec<Pair<'_>>)> = BTreeMap::new();
    let mut after_rows = Vec::with_capacity(d.corrections.len());
    for c in &d.corrections {
        line.clear();
        format.write_row(&c.row, &mut line);
        after_rows.push(serde_json::from_str::<Value>(&line).unwrap_or(Value::Null));
    }
    for (c, (before, after)) in d.corrections.iter().zip(d.before.iter().zip(&after_rows)) {
        let key = after.get("key").cloned().unwrap_or(Value::Null);
        let start = c.row.window_start.unwrap_or_default();
        let found = causes.get(&(key.to_string(), start));
        let mut listed = Map::new();
        for (reason, carried) in found.into_iter().flatten() {
            listed.insert((*reason).into(), json!({"events": carried.events, "values": carried.values}));
        }
        pairs_owned
            .push((before.as_ref().map(|p| p.values.clone()), after.get("values").cloned().unwrap_or(Value::Null)));
        windows.push(json!({
            "key": key,
            "window_start": after.get("window_start"),
            "window_end": after.get("window_end"),
            "revision": c.row.revision,
            "before": before.as_ref().map(|p| json!({"revision": p.revision, "values": p.values, "events": p.events})),
            "after": {"values": after.get("values"), "events": c.row.events},
            "causes": listed,
        }));
    }
    let pairs: Vec<Pair<'_>> = pairs_owned.iter().map(|(b, a)| (b.as_ref(), a)).collect();
    let difference = differences(contract, &pairs, false);
    let corrected_amount = differences(contract, &pairs, true);
    for ((key, start), found) in causes {
        let corrected = after_rows.iter().zip(&d.corrections).any(|(a, c)| {
            c.row.window_start == Some(*start) && a.get("key").map(Value::to_string).as_deref() == Some(key)
        });
        if !corrected {
            continue;
        }
        for (reason, carried) in found {
            let entry = totals.entry(reason).or_default();
            entry.0 += carried.events;
            entry.1.push((None, &carried.values));
        }
    }
    let mut cause_totals = Map::new();
    for (reason, (events, values)) in &totals {
        cause_totals
            .insert((*reason).into(), json!({"events": events, "amounts": differences(contract, values, false)}));
    }
    json!({
        "id": run.id,
        "pipeline": run.pipeline,
        "version": run.version,
        "from": t(run.from_ms),
        "to": t(run.to_ms),
        "origin": run.origin,
        "why": run.why,
        "settled_through": t(settled),
        "events_read": read,
        "windows_checked": d.checked,
        "windows_corrected": d.corrections.len(),
        "windows_new": d.new,
        "windows_withdrawn": d.withdrawn,
        "windows_unsettled": d.unsettled,
        "difference": difference,
        "corrected_amount": corrected_amount,
        "causes": cause_totals,
        "windows_listed": windows.len().min(WINDOWS_LISTED),
        "windows": windows.into_iter().take(WINDOWS_LISTED).collect::<Vec<_>>(),
    })
}

/// Makes a reader of a contract's input.
pub type InputFor = Arc<dyn Fn(&Contract) -> Box<dyn Input> + Send + Sync>;

/// Runs the pipeline's backfills beside its live runner: claims the oldest
/// one nobody holds, computes it, publishes it, and waits a second when
/// there is none. One per pipeline on every worker; the store's claim
/// makes sure one of them does each run.
pub struct Worker {
    pub pipeline: String,
    /// Each version's contract this server has.
    pub contracts: BTreeMap<u32, Arc<Contract>>,
    pub store: Arc<dyn Store>,
    /// A new reader of a version's input for each run.
    pub input: InputFor,
    /// Who this worker is in claims (unique per process).
    pub claimant: String,
    /// weir.toml's `[connections.NAME]`: what `[reconcile.system_of_record]`
    /// names to read the system of record.
    pub connections: BTreeMap<String, weir_contract::Connection>,
    /// weir.toml's `[postgres] url`: the store's own account, which never
    /// reads a system of record.
    pub store_url: Option<String>,
    /// Notifications for the owner (a failed reconciliation), sent by the server.
    pub notes: Notes,
}

/// Notifications waiting for the server's alert loop: (pipeline, notification).
pub type Notes = Arc<std::sync::Mutex<Vec<(String, Value)>>>;

impl Worker {
    /// Until `stop` is set.
    pub fn run(self, stop: Arc<AtomicBool>) {
        let mut scheduled_at: Option<std::time::Instant> = None;
        while !stop.load(Ordering::Relaxed) {
            if scheduled_at.is_none_or(|at| at.elapsed() >= SCHEDULE_CHECK) {
                scheduled_at = Some(std::time::Instant::now());
                if let Err(e) = self.schedule() {
                    eprintln!("weir: {}: scheduled reconciliation: {e:#}", self.pipeline);
                }
            }
            match self.once() {
                Ok(true) => continue,
                Ok(false) => {}
                Err(e) => eprintln!("weir: {}: backfill: {e:#}", self.pipeline),
            }
            for _ in 0..10 {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// Asks the live version's next scheduled run (`[reconcile] every`)
    /// when it is due: the windows that had settled `delay` ago, from where
    /// the last scheduled run ended.
    pub fn schedule(&self) -> crate::Result<Option<i64>> {
        let Some(live) = self.store.live_version(&self.pipeline)? else { return Ok(None) };
        let Some(contract) = self.contracts.get(&live) else { return Ok(None) };
        let Some(weir_contract::Reconcile { every_ms: Some(every), delay_ms, .. }) = contract.reconcile else {
            return Ok(None);
        };
        let headers = self.store.checkpoint_headers(&self.pipeline, live)?;
        let Some(settled) = settled_through(contract, &headers)? else { return Ok(None) };
        let to_ms = settled_before(contract, settled.saturating_sub(delay_ms));
        let why = format!(
            "[reconcile] every {} over the windows settled {} before",
            weir_contract::format_duration_ms(every),
            weir_contract::format_duration_ms(delay_ms)
        );
        let ask = BackfillAsk {
            version: live,
            from_ms: to_ms.saturating_sub(every),
            to_ms,
            who: "schedule",
            why: &why,
            origin: "schedule",
        };
        Ok(self.store.schedule_backfill(&self.pipeline, &Schedule { ask, every_ms: every })?)
    }

    /// Claims and does one run; whether there was one.
    pub fn once(&self) -> crate::Result<bool> {
        // Only runs of versions this server has: another worker of a rolling upgrade does the rest.
        let versions: Vec<u32> = self.contracts.keys().copied().collect();
        let Some(run) = self.store.claim_backfill(&self.pipeline, &self.claimant, &versions)? else {
            return Ok(false);
        };
        let Some(contract) = self.contracts.get(&run.version) else { return Ok(false) };
        for _attempt in 0..3 {
            let computed = self.compute(contract, &run);
            let computed = match computed {
                Ok(c) => c,
                Err(e) => {
                    self.store.fail_backfill(run.id, &self.claimant, &format!("{e:#}"))?;
                    return Ok(true);
                }
            };
            let format = Engine::new(contract, Mode::Batch, 1)?.format().clone();
            let report = computed.report.to_string();
            match self.store.finish_backfill(run.id, &self.claimant, &format, &computed.corrections, &report)? {
                Finish::Published { .. } if run.origin == "schedule" => {
                    if let Some(sor) = contract.reconcile.as_ref().and_then(|r| r.system_of_record.as_ref()) {
                        if let Err(e) = self.reconcile_with_record(contract, sor, &run) {
                            eprintln!("weir: {}: reconciling with the system of record: {e:#}", self.pipeline);
                        }
                    }
                    return Ok(true);
                }
                Finish::Published { .. } | Finish::NotOurs => return Ok(true),
                Finish::Moved(why) => eprintln!("weir: {}: backfill {}: computing again: {why}", self.pipeline, run.id),
            }
        }
        self.store.fail_backfill(
            run.id,
            &self.claimant,
            "the windows kept being republished while it ran; ask again",
        )?;
        Ok(true)
    }

    /// After a scheduled run: its range of the published rows against the
    /// contract's query on the system of record
    /// ([`crate::reconcile::read_record`]); kept, and the owner told when it
    /// fails. A query that cannot be read is kept as a failed
    /// reconciliation with its reason, and the owner is told that too.
    fn reconcile_with_record(
        &self,
        contract: &Contract,
        sor: &weir_contract::SystemOfRecord,
        run: &Backfill,
    ) -> crate::Result<()> {
        let why = format!("after scheduled backfill {}", run.id);
        let read = match self.connections.get(&sor.connection) {
            None => Err(format!(
                "[reconcile.system_of_record] names the connection {:?}, which weir.toml does not have; add [connections.{}] with the url of an account that may only read the system of record",
                sor.connection, sor.connection
            )),
            Some(c) => crate::reconcile::read_record(
                (&c.url, self.store_url.as_deref()),
                &sor.query,
                (run.from_ms, run.to_ms),
                &sor.map,
                crate::reconcile::RecordLimits::DEFAULT,
            ),
        };
        let report = match read {
            Ok(export) => {
                crate::reconcile::compare_and_keep(
                    self.store.as_ref(),
                    contract,
                    (&self.pipeline, run.version),
                    (&sor.map, sor.tolerance),
                    &export,
                    ("schedule", &why, "system_of_record"),
                )?
                .1
            }
            Err(reason) => crate::reconcile::keep_unread(
                self.store.as_ref(),
                contract,
                (&self.pipeline, run.version),
                &format!("the system of record could not be read: {reason}"),
                ("schedule", &why, "system_of_record"),
            )?,
        };
        if report["verdict"] == "fail" {
            let note = crate::reconcile::unexplained_note(contract, &report);
            crate::lock(&self.notes).push((self.pipeline.clone(), note));
        }
        Ok(())
    }

    fn compute(&self, contract: &Contract, run: &Backfill) -> crate::Result<Computed> {
        let mut input = (self.input)(contract);
        let store = Arc::clone(&self.store);
        let (id, claimant) = (run.id, self.claimant.clone());
        // The claim is renewed every few seconds, well within its lease (a
        // renewal is a committed write).
        let mut renewed = std::time::Instant::now();
        let mut tick = move || -> crate::Result<()> {
            if renewed.elapsed() < RENEW_EVERY {
                return Ok(());
            }
            renewed = std::time::Instant::now();
            if store.renew_backfill(id, &claimant)? {
                Ok(())
            } else {
                crate::bail!("backfill {id} is no longer this worker's")
            }
        };
        compute(contract, input.as_mut(), self.store.as_ref(), run, &mut tick)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONTRACT: &str = r#"
[pipeline]
name = "paid"
version = 1
owner = "o"
steward = "s"
decision = "d"

[source]
topic = "payments"
event_time = "t"
key = ["acct"]

[window]
type = "tumbling"
size = "1m"

[[aggregate]]
name = "total"
fn = "sum"
field = "amount"

[[aggregate]]
name = "payments"
fn = "count"
"#;

    const MINUTE: i64 = 60_000;

    /// The batch rows of `(account, minute, amount)` payments.
    fn batch(contract: &Contract, payments: &[(&str, i64, &str)]) -> (Vec<Row>, RowFormat) {
        let mut engine = Engine::new(contract, Mode::Batch, 1).unwrap();
        let mut out = Output::default();
        for (i, (acct, minute, amount)) in payments.iter().enumerate() {
            let t = weir_engine::time::format_rfc3339_ms(minute * MINUTE + 1_000);
            let line = format!(r#"{{"acct":"{acct}","t":"{t}","amount":{amount}}}"#);
            engine.process(EventIn { partition: 0, offset: i as u64, bytes: line.as_bytes() }, &mut out);
        }
        engine.finish(&mut out);
        (out.rows, engine.format().clone())
    }

    fn published(acct: &str, minute: i64, revision: u32, values: Value, events: u64) -> Published {
        Published {
            key: json!({ "acct": acct }),
            start: minute * MINUTE,
            end: Some((minute + 1) * MINUTE),
            status: "settled".into(),
            revision,
            values,
            events,
        }
    }

    #[test]
    fn review_2_point_8_a_backfill_holds_its_range_and_horizon_not_the_whole_input() {
        // Corrections with dedup: ids repeat within the horizon, some with
        // another amount (a correction) and some moved to another minute.
        let text = CONTRACT.replace("key = [\"acct\"]", "key = [\"acct\"]\nevent_id = \"id\"")
            + "\n[dedup]\nhorizon = \"10m\"\non_conflict = \"correct\"\n";
        let contract = Contract::parse("c.toml", &text).unwrap();
        let minutes = 5_000i64;
        let mut lines = Vec::new();
        for m in 0..minutes {
            for a in 0..3 {
                let t = weir_engine::time::format_rfc3339_ms(m * MINUTE + a * 1_000);
                lines.push(format!(r#"{{"id":"{m}-{a}","acct":"a{a}","t":"{t}","amount":{}}}"#, m % 7));
            }
            if m >= 4 {
                // A correction of an earlier minute's payment, moved by a minute.
                let t = weir_engine::time::format_rfc3339_ms((m - 3) * MINUTE + 5_000);
                lines.push(format!(r#"{{"id":"{}-1","acct":"a1","t":"{t}","amount":100}}"#, m - 4));
            }
        }
        let run = |times: Option<std::ops::Range<i64>>| {
            let mut engine = Engine::new(&contract, Mode::Batch, 1).unwrap();
            if let Some(times) = times {
                engine.read_times(times);
            }
            let mut out = Output::default();
            for (i, line) in lines.iter().enumerate() {
                engine.process(EventIn { partition: 0, offset: i as u64, bytes: line.as_bytes() }, &mut out);
            }
            engine.finish(&mut out);
            let format = engine.format().clone();
            let written = |r: &Row| {
                let mut line = String::new();
                format.write_row(r, &mut line);
                line
            };
            (out.rows.len(), out.rows.iter().map(|r| (r.window_start, written(r))).collect::<Vec<_>>())
        };
        let (from, to) = (2_000 * MINUTE, 2_030 * MINUTE);
        let (whole, all_rows) = run(None);
        let (held, rows) = run(read_times(&contract, (from, to)));
        // Every minute of every account but a1's first, whose payment moved.
        assert_eq!(whole, minutes as usize * 3 - 1);
        // 30 minutes, a minute of window, 10 of horizon each side: 51 minutes.
        assert!(held <= 51 * 3, "the backfill held {held} windows for a 30-minute range");
        let in_range = |rows: Vec<(Option<i64>, String)>| {
            rows.into_iter().filter(|(s, _)| s.is_some_and(|s| (from..to).contains(&s))).collect::<Vec<_>>()
        };
        let (expected, got) = (in_range(all_rows), in_range(rows));
        assert_eq!(expected.len(), 30 * 3);
        assert_eq!(got, expected, "the range's windows are those of the whole batch");
        // Sessions are read whole.
        let sessions = CONTRACT.replace("type = \"tumbling\"\nsize = \"1m\"", "type = \"session\"\ngap = \"1m\"");
        assert_eq!(read_times(&Contract::parse("s.toml", &sessions).unwrap(), (from, to)), None);
    }

    #[test]
    fn decide_corrects_what_differs_adds_what_is_missing_withdraws_what_is_gone_and_leaves_the_rest() {
        let contract = Contract::parse("c.toml", CONTRACT).unwrap();
        let (rows, format) = batch(
            &contract,
            &[("a", 0, "1.50"), ("b", 1, "2"), ("b", 1, "3"), ("c", 2, "4"), ("e", 9, "1"), ("f", 30, "1")],
        );
        let stream = vec![
            published("a", 0, 1, json!({"total": 1.5, "payments": 1}), 1), // unchanged (1.5 = 1.50)
            published("b", 1, 2, json!({"total": 2, "payments": 1}), 1),   // one payment too late: corrected
            published("d", 3, 1, json!({"total": 7, "payments": 1}), 1),   // the batch has none: withdrawn
        ];
        // Settled through minute 9's start: minute 9's window is still open; minute 30 is out of range.
        let d = decide(&contract, &format, rows, stream, (0, 20 * MINUTE), 9 * MINUTE);
        let got: Vec<(String, i64, u32, u32, u64)> = d
            .corrections
            .iter()
            .map(|c| {
                let mut key = String::new();
                weir_engine::key_json(&c.row.key, &format.key_names, &mut key);
                (key, c.row.window_start.unwrap() / MINUTE, c.row.revision, c.replaces, c.row.events)
            })
            .collect();
        assert_eq!(
            got,
            [
                (r#"{"acct":"b"}"#.to_owned(), 1, 3, 2, 2),
                (r#"{"acct":"c"}"#.to_owned(), 2, 1, 0, 1),
                (r#"{"acct":"d"}"#.to_owned(), 3, 2, 1, 0)
            ]
        );
        assert!(d.corrections.iter().all(|c| c.row.status == Status::Corrected && c.row.watermark == Some(9 * MINUTE)));
        assert_eq!(d.corrections[2].row.values[..], [OutValue::Null, OutValue::Int(0)], "no events: count 0, sum null");
        assert_eq!((d.checked, d.new, d.withdrawn, d.unsettled), (4, 1, 1, 1));
    }

    #[test]
    fn a_range_is_refused_when_not_settled_too_old_or_global() {
        let contract = Contract::parse("c.toml", CONTRACT).unwrap();
        let wm = 10 * MINUTE;
        // At watermark 10:00 the window of 09:00-10:00 has settled, the next not.
        assert_eq!(check_request(&contract, (0, 10 * MINUTE), Some(wm), None), Ok(()));
        let e = check_request(&contract, (0, 10 * MINUTE + 1), Some(wm), None).unwrap_err();
        assert!(e.contains("starting at 1970-01-01T00:10:00.000Z or later have not settled"), "{e}");
        let e = check_request(&contract, (0, MINUTE), Some(wm), Some(30_000)).unwrap_err();
        assert!(e.contains("retained input is whole only from 1970-01-01T00:00:30.000Z"), "{e}");
        assert!(check_request(&contract, (0, MINUTE), None, None).unwrap_err().contains("no checkpoint yet"));
        let global =
            Contract::parse("c.toml", &CONTRACT.replace("type = \"tumbling\"\nsize = \"1m\"", "type = \"global\""))
                .unwrap();
        assert!(check_request(&global, (0, MINUTE), Some(wm), None).unwrap_err().contains("global window"));
    }
}

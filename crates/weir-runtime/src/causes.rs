//! What a backfill and a reconciliation both say of published windows:
//! the last row each published ([`Published`]), values compared as
//! numbers, and the causes the ledger holds for a window (`too_late`,
//! `duplicate`, `duplicate_conflict`, `superseded`) with the amounts each
//! carried, recomputed from the entries' payloads by a batch engine per
//! cause.

use std::collections::{BTreeMap, HashMap, HashSet};

use rust_decimal::Decimal;
use serde_json::Value;
use weir_contract::{Contract, WindowKind};
use weir_engine::{Engine, EventIn, Mode, Output, Reason, RowFormat};
use weir_store::Store;

/// The ledger reasons a backfill looks for as causes.
pub const CAUSES: [Reason; 4] = [Reason::TooLate, Reason::Duplicate, Reason::DuplicateConflict, Reason::Superseded];

/// Corrected windows a report lists one by one, at most (the counts and
/// totals cover all of them).
pub const WINDOWS_LISTED: usize = 1_000;

/// A window's last published row, read back from `results`.
#[derive(Debug, Clone)]
pub struct Published {
    pub key: Value,
    pub start: i64,
    pub end: Option<i64>,
    pub status: String,
    pub revision: u32,
    pub values: Value,
    pub events: u64,
}

impl Published {
    /// A row as `/results` serves it; `None` when it is not one.
    pub fn parse(text: &str) -> Option<Published> {
        let v: Value = serde_json::from_str(text).ok()?;
        Some(Published {
            key: v.get("key")?.clone(),
            start: weir_engine::time::parse_rfc3339_ms(v.get("window_start")?.as_str()?)?,
            end: v.get("window_end").and_then(Value::as_str).and_then(weir_engine::time::parse_rfc3339_ms),
            status: v.get("status")?.as_str()?.to_owned(),
            revision: u32::try_from(v.get("revision")?.as_u64()?).ok()?,
            values: v.get("values")?.clone(),
            events: v.get("events")?.as_u64()?,
        })
    }
}

/// What one cause carried in one window: events and each aggregate's amount.
#[derive(Debug, Clone, Default)]
pub struct Carried {
    pub events: u64,
    pub values: Value,
}

/// The causes found per window: (key JSON text, window start) -> reason -> what it carried.
pub type Causes = HashMap<(String, i64), BTreeMap<&'static str, Carried>>;

/// Values compare by number where both are numbers (`12.5` equals `12.50`).
pub fn same_values(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same_values(v, w)))
        }
        (Value::Number(x), Value::Number(y)) => match (decimal(x), decimal(y)) {
            (Some(p), Some(q)) => p == q,
            _ => x == y,
        },
        _ => a == b,
    }
}

pub fn decimal(n: &serde_json::Number) -> Option<Decimal> {
    let text = n.to_string();
    if text.contains(['e', 'E']) {
        Decimal::from_scientific(&text).ok()
    } else {
        text.parse().ok()
    }
}

/// One ledger entry the backfill looks for in the input.
#[derive(Debug, Clone)]
pub(crate) struct CauseEntry {
    pub reason: Reason,
    /// The key and window it names, when it names one.
    window: Option<(String, i64)>,
    /// The event as it arrived (cut to 4 KiB; `None` once erased for retention).
    payload: Option<String>,
}

/// The ledger's cause entries of a version near `[from, to)`, by (partition, offset).
pub(crate) fn cause_entries(
    store: &dyn Store,
    (pipeline, version): (&str, u32),
    (from_ms, to_ms): (i64, i64),
    span_ms: i64,
) -> crate::Result<HashMap<(u32, u64), Vec<CauseEntry>>> {
    let mut found: HashMap<(u32, u64), Vec<CauseEntry>> = HashMap::new();
    let near = (from_ms.saturating_sub(span_ms))..(to_ms.saturating_add(span_ms));
    for reason in CAUSES {
        let mut since = 0;
        loop {
            let page = store.ledger(pipeline, version, Some(reason.as_str()), (since, 10_000), false)?;
            for text in &page {
                let Ok(e) = serde_json::from_str::<Value>(text) else { continue };
                since = since.max(e.get("seq").and_then(Value::as_i64).unwrap_or(0) + 1);
                let time = |f: &str| e.get(f).and_then(Value::as_str).and_then(weir_engine::time::parse_rfc3339_ms);
                let start = time("window_start");
                if !start.or(time("event_time")).is_some_and(|t| near.contains(&t)) {
                    continue;
                }
                let (Some(p), Some(o)) =
                    (e.get("partition").and_then(Value::as_u64), e.get("offset").and_then(Value::as_u64))
                else {
                    continue;
                };
                let window = start.map(|s| (e.get("key").map(Value::to_string).unwrap_or_default(), s));
                let payload = e.get("payload").and_then(Value::as_str).map(str::to_owned);
                found.entry((p as u32, o)).or_default().push(CauseEntry { reason, window, payload });
            }
            if page.len() < 10_000 {
                break;
            }
        }
    }
    Ok(found)
}

/// The causes the ledger holds for the windows of a version near
/// `[from, to)`, with the amounts their payloads carry (an entry whose
/// payload retention erased carries nothing known).
pub fn causes_from_ledger(
    contract: &Contract,
    store: &dyn Store,
    (pipeline, version): (&str, u32),
    range: (i64, i64),
) -> crate::Result<Causes> {
    let wanted = cause_entries(store, (pipeline, version), range, window_span_ms(contract))?;
    let mut engines: BTreeMap<&'static str, Engine> = BTreeMap::new();
    for reason in CAUSES {
        let mut engine = Engine::new(contract, Mode::Batch, 1)?;
        engine.read_one_partition(); // entries name any partition
        engines.insert(reason.as_str(), engine);
    }
    let mut out = Output::default();
    let mut ordered: Vec<(&(u32, u64), &Vec<CauseEntry>)> = wanted.iter().collect();
    ordered.sort_by_key(|(at, _)| **at);
    for ((partition, offset), entries) in ordered {
        let mut seen = HashSet::new();
        for e in entries.iter().filter(|e| seen.insert(e.reason)) {
            let (Some(payload), Some(engine)) = (&e.payload, engines.get_mut(e.reason.as_str())) else { continue };
            engine.process(EventIn { partition: *partition, offset: *offset, bytes: payload.as_bytes() }, &mut out);
            out.clear();
        }
    }
    let format = Engine::new(contract, Mode::Batch, 1)?.format().clone();
    Ok(carried(&format, &wanted, engines))
}

/// The longest a window lasts (fixed windows), or the session gap.
pub(crate) fn window_span_ms(contract: &Contract) -> i64 {
    match contract.window.kind {
        WindowKind::Tumbling { size_ms } | WindowKind::Hopping { size_ms, .. } => size_ms,
        WindowKind::Session { gap_ms } => gap_ms,
        WindowKind::Global => 0,
    }
    .saturating_add(contract.window.allowed_lateness_ms)
}

/// The amounts each cause carried per window: the cause engines' rows,
/// kept where the ledger named that window (an entry naming none, such as
/// a duplicate's, counts in every window of its event).
pub(crate) fn carried(
    format: &RowFormat,
    wanted: &HashMap<(u32, u64), Vec<CauseEntry>>,
    engines: BTreeMap<&'static str, Engine>,
) -> Causes {
    let mut named: HashMap<&'static str, HashSet<(String, i64)>> = HashMap::new();
    let mut anywhere: HashSet<&'static str> = HashSet::new();
    for e in wanted.values().flatten() {
        match &e.window {
            Some(w) => {
                named.entry(e.reason.as_str()).or_default().insert(w.clone());
            }
            None => {
                anywhere.insert(e.reason.as_str());
            }
        }
    }
    let mut causes = Causes::new();
    let mut out = Output::default();
    let mut line = String::new();
    for (reason, mut engine) in engines {
        engine.finish(&mut out);
        for row in out.rows.drain(..) {
            let Some(start) = row.window_start else { continue };
            line.clear();
            format.write_row(&row, &mut line);
            let Ok(written) = serde_json::from_str::<Value>(&line) else { continue };
            let at = (written.get("key").map(Value::to_string).unwrap_or_default(), start);
            if !anywhere.contains(reason) && !named.get(reason).is_some_and(|n| n.contains(&at)) {
                continue;
            }
            let values = written.get("values").cloned().unwrap_or(Value::Null);
            causes.entry(at).or_default().insert(reason, Carried { events: row.events, values });
        }
        out.clear();
    }
    causes
}

//! What the alert loop observes every second and the status, alerts and
//! dashboard read back: 15 minutes of samples per pipeline for the charts
//! the firing alerts, and the totals of the backfill runs (a leaf: it uses
//! no other module of the server).
//! The notifications themselves are kept in each pipeline's store.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::Instant;

use serde_json::{json, Value};
use weir_runtime::lock;

/// How long the charts reach back.
const WINDOW_MS: i64 = 15 * 60 * 1000;

#[derive(Default)]
pub struct Watch {
    pub alerts: Mutex<AlertState>,
    pub series: Mutex<Series>,
    /// Backfill and reconciliation totals by pipeline, from its store.
    pub reconcile: Mutex<BTreeMap<String, ReconcileTotals>>,
    /// The named checks' state by pipeline (`crate::checks`).
    pub checks: Mutex<Checks>,
}

/// What a pipeline's stored backfill runs add up to (refreshed by the
/// alert loop every [`RECONCILE_REFRESH`]).
#[derive(Debug, Clone, Default)]
pub struct ReconcileTotals {
    /// Runs done, by origin (`operator`, `schedule`).
    pub runs: BTreeMap<String, u64>,
    pub corrected_windows: u64,
    /// Per aggregate, the corrected amount (each window's change as a positive amount).
    pub corrected_amount: BTreeMap<String, f64>,
    /// Windows corrected by runs finished in the last hour.
    pub corrected_last_hour: u64,
    pub refreshed: Option<Instant>,
    /// Each finished run's part, by id: a finished run never changes, so
    /// its report is read once.
    done: BTreeMap<i64, RunSummary>,
}

#[derive(Debug, Clone, Default)]
struct RunSummary {
    origin: String,
    finished_ms: i64,
    corrected: u64,
    amounts: Vec<(String, f64)>,
}

/// How often the totals are read again from the store.
pub const RECONCILE_REFRESH: std::time::Duration = std::time::Duration::from_secs(5);

/// The runs read at the first refresh (a year of hourly runs), then the
/// newest ones each time (runs finish about in the order they are asked).
const RECONCILE_RUNS_FIRST: i64 = 10_000;
const RECONCILE_RUNS_NEWEST: i64 = 50;

/// Brings a pipeline's totals up to date with its stored runs when they are
/// older than [`RECONCILE_REFRESH`].
pub fn refresh_reconcile(watch: &Watch, name: &str, store: &dyn weir_store::Store) {
    let mut t = lock(&watch.reconcile).get(name).cloned().unwrap_or_default();
    if t.refreshed.is_some_and(|at| at.elapsed() < RECONCILE_REFRESH) {
        return;
    }
    let read = if t.refreshed.is_none() { RECONCILE_RUNS_FIRST } else { RECONCILE_RUNS_NEWEST };
    let runs = match store.backfills(name, read) {
        Ok(runs) => runs,
        Err(e) => {
            eprintln!("weir: {name}: reading backfill runs: {e}");
            return;
        }
    };
    for run in runs.iter().filter(|r| r.state == weir_store::BackfillState::Done) {
        if t.done.contains_key(&run.id) {
            continue;
        }
        let report = run.report.as_deref().and_then(|r| serde_json::from_str::<Value>(r).ok()).unwrap_or_default();
        let amounts = report["corrected_amount"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(a, v)| (a.clone(), v.as_str().and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)))
            .collect();
        let summary = RunSummary {
            origin: run.origin.clone(),
            finished_ms: run.finished_ms.unwrap_or(0),
            corrected: report["windows_corrected"].as_u64().unwrap_or(0),
            amounts,
        };
        t.done.insert(run.id, summary);
    }
    let hour_ago = weir_log::now_ms() - 3_600_000;
    let (mut runs, mut corrected, mut last_hour, mut amount) = (BTreeMap::new(), 0, 0, BTreeMap::<String, f64>::new());
    for s in t.done.values() {
        *runs.entry(s.origin.clone()).or_default() += 1;
        corrected += s.corrected;
        if s.finished_ms >= hour_ago {
            last_hour += s.corrected;
        }
        for (a, v) in &s.amounts {
            *amount.entry(a.clone()).or_default() += v;
        }
    }
    (t.runs, t.corrected_windows, t.corrected_last_hour, t.corrected_amount) = (runs, corrected, last_hour, amount);
    t.refreshed = Some(Instant::now());
    lock(&watch.reconcile).insert(name.to_owned(), t);
}

/// What this server knows of one check of one pipeline's live version.
#[derive(Debug, Clone, Default)]
pub struct CheckState {
    pub version: u32,
    /// The highest row `seq` judged (row and volume checks); `None` until read from the store.
    pub cursor: Option<i64>,
    /// The last result failed.
    pub failing: bool,
    /// Results this server evaluated since it started.
    pub passed: u64,
    pub failed: u64,
    pub last: Option<weir_store::checks::CheckResult>,
    pub last_kept_ms: i64,
    /// The newest reconciliation judged.
    pub reconciliation: Option<i64>,
}

/// Per pipeline, per check name.
pub type Checks = BTreeMap<String, BTreeMap<String, CheckState>>;

/// One firing alert.
#[derive(Debug, Clone)]
pub struct Firing {
    pub alert: &'static str,
    pub threshold: String,
    pub observed: String,
    pub since_ms: i64,
}

#[derive(Default)]
pub struct AlertState {
    /// Firing alerts by pipeline.
    pub firing: BTreeMap<String, Vec<Firing>>,
    pub history: BTreeMap<String, VecDeque<(Instant, u64, u64)>>,
    /// Offsets skipped, per pipeline: the count last seen, and those
    /// skipped in the last hour with when the last of them was.
    pub skipped: BTreeMap<String, Skipped>,
}

/// Offsets a pipeline's source did not deliver, as the alert loop saw them.
#[derive(Debug, Default, Clone, Copy)]
pub struct Skipped {
    pub seen: u64,
    pub recent: u64,
    pub last_at: Option<Instant>,
}

impl Skipped {
    /// Takes the count now (it goes back when a partition is handed over or
    /// the server restarts); the offsets skipped within the last hour.
    pub fn observe(&mut self, count: u64, now: Instant) -> u64 {
        if count > self.seen {
            self.recent += count - self.seen;
            self.last_at = Some(now);
        }
        self.seen = count;
        if self.last_at.is_some_and(|t| now.duration_since(t) > std::time::Duration::from_secs(3600)) {
            self.recent = 0;
            self.last_at = None;
        }
        self.recent
    }
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    at_ms: i64,
    read: u64,
    lag_records: i64,
    watermark_age_ms: Option<i64>,
}

/// Samples per pipeline, oldest first, 15 minutes of them.
#[derive(Default)]
pub struct Series {
    by_pipeline: BTreeMap<String, VecDeque<Sample>>,
}

/// Adds one sample of a pipeline's status (called every second).
pub fn record(watch: &Watch, name: &str, read: u64, lag_records: u64, watermark_age_ms: Option<i64>) {
    let sample = Sample {
        at_ms: weir_log::now_ms(),
        read,
        lag_records: lag_records.min(i64::MAX as u64) as i64,
        watermark_age_ms,
    };
    let mut series = lock(&watch.series);
    let samples = series.by_pipeline.entry(name.to_owned()).or_default();
    samples.push_back(sample);
    while samples.front().is_some_and(|s| s.at_ms < sample.at_ms - WINDOW_MS) {
        samples.pop_front();
    }
}

/// `[[time ms, events per second, lag records, watermark age ms or null]]`;
/// events per second from one sample to the next (a replay restarts the
/// engine's count, which shows as no throughput for that second).
pub fn chart(watch: &Watch, name: &str) -> Value {
    let series = lock(&watch.series);
    let Some(samples) = series.by_pipeline.get(name) else { return json!([]) };
    let mut points = Vec::with_capacity(samples.len());
    let mut previous: Option<Sample> = None;
    for s in samples {
        let rate = previous.map_or(0.0, |p| {
            let seconds = (s.at_ms - p.at_ms).max(1) as f64 / 1e3;
            s.read.saturating_sub(p.read) as f64 / seconds
        });
        points.push(json!([s.at_ms, rate.round(), s.lag_records, s.watermark_age_ms]));
        previous = Some(*s);
    }
    Value::Array(points)
}

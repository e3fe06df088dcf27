//! What the alert loop observes every second and the status, alerts and
//! dashboard read back: 15 minutes of samples per pipeline for the charts
//! and the firing alerts (a leaf: it uses no other module of the server).
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
}

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
    /// Notifications sent and failed for good, for status and tests.
    pub delivered: u64,
    pub undelivered: u64,
    pub(crate) history: BTreeMap<String, VecDeque<(Instant, u64, u64)>>,
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

//! A pipeline's status as one typed value ([`Report`]), computed from what
//! its runner shows ([`weir_runtime::Status`]), the log and the alert loop:
//! rendered as JSON by `GET .../status` and the dashboard, as Prometheus
//! metrics by `/metrics`, and read by the alert checks.
//!
//! In more detail: a pipeline version's status as one typed value (`Report`:
//! version and its state, watermarks, lag, partitions, counters, ledger by
//! reason, rows, checkpoint, failure, pause, alerts firing), built from the
//! runner's `Status`, the log and the alert loop; serialized by `GET
//! .../status` and the dashboard, encoded by `/metrics`, read by the alert
//! checks.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use serde::Serialize;
use weir_engine::time::format_rfc3339_ms;
use weir_engine::Reason;
use weir_log::Log;
use weir_runtime::histogram::Histogram;
use weir_runtime::{lock, Pipeline, PipelineVersion};
use weir_store::VersionState;

use crate::watch::Watch;

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub pipeline: String,
    pub version: u32,
    /// `candidate`, `live` or `superseded`, as the version's runner last read it.
    pub version_state: Option<&'static str>,
    pub watermark: Option<String>,
    pub watermark_age_ms: Option<i64>,
    pub lag_records: u64,
    /// Log time between the oldest record not yet read and the newest (largest over partitions).
    pub lag_ms: i64,
    pub oldest_unprocessed_age_ms: i64,
    pub partitions: Vec<PartitionReport>,
    pub events: Events,
    /// Ledger entries by reason, every reason present.
    pub ledger: BTreeMap<&'static str, u64>,
    pub rows: Rows,
    pub open_windows: usize,
    pub state_bytes: usize,
    pub last_checkpoint: Option<String>,
    pub checkpoint_age_ms: Option<i64>,
    /// Events were read since the last checkpoint that ended: rows they
    /// made are not in the store yet.
    pub unsaved: bool,
    pub failed: Option<String>,
    pub paused: bool,
    pub replays: u64,
    pub restarts: u64,
    pub offsets_not_delivered: u64,
    pub checkpoints_fenced: u64,
    pub alerts: Vec<FiringReport>,
    /// The contract's named checks as this server last judged them.
    pub checks: Vec<CheckReport>,
    /// Its destinations (SPEC.md 11): position, lag, state, last error.
    pub destinations: Vec<weir_runtime::destination::DestinationStatus>,
    /// Not in the JSON: the watermark in milliseconds and the latency histograms, for `/metrics`.
    #[serde(skip)]
    pub watermark_ms: Option<i64>,
    #[serde(skip)]
    pub processing: Histogram,
    #[serde(skip)]
    pub producer_lag: Histogram,
    #[serde(skip)]
    pub checkpoint_duration: Histogram,
}

#[derive(Debug, Clone, Serialize)]
pub struct PartitionReport {
    pub partition: u32,
    pub next_offset: u64,
    pub end_offset: u64,
    pub lag: u64,
    /// The embedded log: whether the partition is idle.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle: Option<bool>,
    /// Kafka: the fence generation this worker holds it under.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    pub watermark: Option<String>,
    pub watermark_age_ms: Option<i64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Events {
    pub read: u64,
    pub counted: u64,
    pub filtered: u64,
    pub late_allowed: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Rows {
    pub provisional: u64,
    pub settled: u64,
    pub retracted: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct FiringReport {
    pub alert: &'static str,
    pub threshold: String,
    pub observed: String,
    pub since: String,
}

/// One named check: its last outcome and the results judged by this server since it started.
#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    pub check: String,
    pub severity: &'static str,
    pub kind: &'static str,
    pub failing: bool,
    pub passed: u64,
    pub failed: u64,
    pub last_observed: Option<String>,
}

impl Report {
    /// Ledger entries of every reason.
    pub fn ledgered(&self) -> u64 {
        self.ledger.values().sum()
    }

    /// Events not counted because their id was seen before.
    pub fn duplicates(&self) -> u64 {
        self.ledger.get("duplicate").copied().unwrap_or(0) + self.ledger.get("duplicate_conflict").copied().unwrap_or(0)
    }
}

/// The pipeline's report now: its live version's.
pub fn report(log: &Log, watch: &Watch, name: &str, p: &Pipeline) -> Report {
    report_version(log, watch, name, p, p.live())
}

/// The report of one version of the pipeline now.
pub fn report_version(
    log: &Log,
    watch: &Watch,
    name: &str,
    p: &Pipeline,
    (version, v): (u32, &PipelineVersion),
) -> Report {
    let s = lock(&v.status).clone();
    let now = weir_log::now_ms();
    let topic = &v.contract.source.topic;
    let bounds = if s.kafka.is_some() { Vec::new() } else { log.bounds(topic).unwrap_or_default() };
    let mut partitions = Vec::new();
    let (mut lag, mut oldest, mut lag_ms) = (0u64, None::<i64>, 0i64);
    // Over Kafka: this worker's partitions; a partition's lag in time is now
    // minus the Kafka timestamp of the last record read while records wait.
    for k in s.kafka.iter().flatten() {
        let behind = k.end_offset.saturating_sub(k.next_offset);
        lag += behind;
        if behind > 0 {
            if let Some(t) = k.last_timestamp_ms {
                oldest = Some(oldest.map_or(t, |o: i64| o.min(t)));
                lag_ms = lag_ms.max(now.saturating_sub(t));
            }
        }
        partitions.push(PartitionReport {
            partition: k.partition,
            next_offset: k.next_offset,
            end_offset: k.end_offset,
            lag: behind,
            idle: None,
            generation: Some(k.generation),
            watermark: k.watermark.map(format_rfc3339_ms),
            watermark_age_ms: k.watermark.map(|w| now.saturating_sub(w)),
        });
    }
    let append_ms = |p: usize, offset: u64| {
        log.read(topic, p as u32, offset, 1, 1).ok().and_then(|r| r.first().map(|r| r.append_ms))
    };
    for (i, (start, end)) in bounds.iter().enumerate() {
        let next = s.offsets.get(i).copied().unwrap_or(0).max(*start);
        let behind = end.saturating_sub(next);
        lag += behind;
        let waiting_since = if behind > 0 { append_ms(i, next) } else { None };
        if let Some(t) = waiting_since {
            oldest = Some(oldest.map_or(t, |o: i64| o.min(t)));
            if let Some(newest) = append_ms(i, end - 1) {
                lag_ms = lag_ms.max(newest.saturating_sub(t));
            }
        }
        let watermark = s.partition_watermarks.get(i).copied().flatten();
        partitions.push(PartitionReport {
            partition: i as u32,
            next_offset: next,
            end_offset: *end,
            lag: behind,
            idle: Some(s.idle.get(i).copied().unwrap_or(false)),
            generation: None,
            watermark: watermark.map(format_rfc3339_ms),
            watermark_age_ms: watermark.map(|w| now.saturating_sub(w)),
        });
    }
    let c = &s.counters;
    let alerts = lock(&watch.alerts).firing.get(name).map_or_else(Vec::new, |f| {
        f.iter()
            .map(|f| FiringReport {
                alert: f.alert,
                threshold: f.threshold.clone(),
                observed: f.observed.clone(),
                since: format_rfc3339_ms(f.since_ms),
            })
            .collect()
    });
    let checks = {
        let state = lock(&watch.checks);
        let mine = state.get(name);
        v.contract
            .checks
            .iter()
            .map(|c| {
                let s = mine.and_then(|m| m.get(&c.name)).filter(|s| s.version == version).cloned().unwrap_or_default();
                CheckReport {
                    check: c.name.clone(),
                    severity: c.severity.as_str(),
                    kind: c.kind.name(),
                    failing: s.failing,
                    passed: s.passed,
                    failed: s.failed,
                    last_observed: s.last.map(|l| l.observed),
                }
            })
            .collect()
    };
    Report {
        pipeline: name.to_owned(),
        version,
        version_state: s.version_state.map(VersionState::as_str),
        watermark: s.watermark.map(format_rfc3339_ms),
        watermark_age_ms: s.watermark.map(|w| now.saturating_sub(w)),
        lag_records: lag,
        lag_ms,
        oldest_unprocessed_age_ms: oldest.map_or(0, |t| now.saturating_sub(t).max(0)),
        partitions,
        events: Events { read: c.read, counted: c.counted, filtered: c.filtered, late_allowed: c.late_allowed },
        ledger: Reason::ALL.iter().map(|r| (r.as_str(), c.ledger[r.index()])).collect(),
        rows: Rows { provisional: c.rows_provisional, settled: c.rows_settled, retracted: c.rows_retracted },
        open_windows: s.open_windows,
        state_bytes: s.state_bytes,
        last_checkpoint: (s.last_checkpoint_ms > 0).then(|| format_rfc3339_ms(s.last_checkpoint_ms)),
        checkpoint_age_ms: (s.last_checkpoint_ms > 0).then(|| now.saturating_sub(s.last_checkpoint_ms)),
        unsaved: s.unsaved,
        failed: p.refused.clone().or(s.failed),
        paused: p.paused.load(Ordering::SeqCst),
        replays: s.replays,
        restarts: s.restarts,
        offsets_not_delivered: s.offsets_not_delivered,
        checkpoints_fenced: s.checkpoints_fenced,
        alerts,
        checks,
        destinations: p.destinations.iter().map(|d| lock(d).clone()).collect(),
        watermark_ms: s.watermark,
        processing: s.processing,
        producer_lag: s.producer_lag,
        checkpoint_duration: s.checkpoint_duration,
    }
}

//! `GET /metrics`: per pipeline and partition what `status` shows (the same
//! [`Report`]), and the server's own counters, encoded by the
//! `prometheus-client` crate in the OpenMetrics text format. Attribute
//! names follow the OpenTelemetry messaging conventions, with dots as
//! underscores (Prometheus' own translation).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use weir_engine::Reason;
use weir_runtime::histogram::{Histogram, BOUNDS};
use weir_runtime::lock;
use weir_store::tokens::Role;

use crate::app::{forbidden, App, Caller};
use weir_ops::report::report;

pub(crate) type Labels = Vec<(String, String)>;

pub(crate) enum Value {
    Counter(u64),
    CounterF(f64),
    Gauge(i64),
    Histogram(Histogram),
}

/// One metric family: its name (a counter's without `_total`, which the
/// encoder adds), help, and samples by label set.
pub(crate) struct Family {
    pub name: &'static str,
    pub help: &'static str,
    pub samples: Vec<(Labels, Value)>,
}

/// Every family of one scrape, in the order first added.
#[derive(Default)]
pub(crate) struct Scrape {
    pub families: Vec<Family>,
}

impl std::fmt::Debug for Scrape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Scrape({} families)", self.families.len())
    }
}

impl Scrape {
    fn add(&mut self, name: &'static str, help: &'static str, labels: Labels, value: Value) {
        match self.families.iter_mut().find(|f| f.name == name) {
            Some(f) => f.samples.push((labels, value)),
            None => self.families.push(Family { name, help, samples: vec![(labels, value)] }),
        }
    }

    fn counter(&mut self, name: &'static str, help: &'static str, labels: Labels, value: u64) {
        self.add(name, help, labels, Value::Counter(value));
    }

    fn counter_f(&mut self, name: &'static str, help: &'static str, labels: Labels, value: f64) {
        self.add(name, help, labels, Value::CounterF(value));
    }

    fn gauge(&mut self, name: &'static str, help: &'static str, labels: Labels, value: i64) {
        self.add(name, help, labels, Value::Gauge(value));
    }

    fn histogram(&mut self, name: &'static str, help: &'static str, labels: Labels, h: &Histogram) {
        self.add(name, help, labels, Value::Histogram(h.clone()));
    }
}

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in &self.families {
            let kind = match f.samples.first().map(|(_, v)| v) {
                Some(Value::Counter(_) | Value::CounterF(_)) => MetricType::Counter,
                Some(Value::Histogram(_)) => MetricType::Histogram,
                _ => MetricType::Gauge,
            };
            let mut family = encoder.encode_descriptor(f.name, f.help, None, kind)?;
            for (labels, value) in &f.samples {
                let mut m = family.encode_family(labels)?;
                match value {
                    Value::Counter(n) => m.encode_counter::<NoLabelSet, _, u64>(n, None)?,
                    Value::CounterF(n) => m.encode_counter::<NoLabelSet, _, u64>(n, None)?,
                    Value::Gauge(n) => m.encode_gauge(n)?,
                    Value::Histogram(h) => Buckets(h).encode(m)?,
                }
            }
        }
        Ok(())
    }
}

/// weir's latency histogram as the encoder takes one: per-bucket counts
/// with their upper bounds, the last unbounded.
struct Buckets<'a>(&'a Histogram);

impl EncodeMetric for Buckets<'_> {
    fn encode(&self, mut encoder: prometheus_client::encoding::MetricEncoder) -> Result<(), std::fmt::Error> {
        let h = self.0;
        let buckets: Vec<(f64, u64)> = BOUNDS.iter().copied().chain([f64::MAX]).zip(h.counts.iter().copied()).collect();
        encoder.encode_histogram::<NoLabelSet>(h.sum, h.count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

fn label(k: &str, v: impl ToString) -> (String, String) {
    (k.to_owned(), v.to_string())
}

/// `status="401",reason="unknown"` (how refusals are counted) as labels.
fn parsed_labels(text: &str) -> Labels {
    text.split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.trim_matches('"').to_owned()))
        .collect()
}

pub(crate) async fn metrics(State(app): State<Arc<App>>, caller: Option<Extension<Caller>>) -> Response {
    if let Some(Extension(caller)) = &caller {
        if !matches!(caller.grant.role, Role::Reader | Role::Operator | Role::Admin) {
            return forbidden(&app, caller, "read /metrics").into_response();
        }
    }
    // A token's own pipelines only; everyone's when metrics are public and asked without one.
    let m = scrape(&app, &|name| caller.as_ref().is_none_or(|Extension(c)| c.grant.may_read(name)));
    let mut registry = Registry::default();
    registry.register_collector(Box::new(m));
    let mut text = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut text, &registry) {
        return crate::app::ApiError(axum::http::StatusCode::INTERNAL_SERVER_ERROR, format!("encoding metrics: {e}"))
            .into_response();
    }
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text).into_response()
}

/// Every metric of the server and of the pipelines `shown` lets through:
/// what `/metrics` encodes and `otel` exports.
pub(crate) fn scrape(app: &App, shown: &dyn Fn(&str) -> bool) -> Scrape {
    let mut m = Scrape::default();
    for (labels, n) in lock(&app.denied).iter() {
        m.counter(
            "weir_http_requests_denied",
            "Requests refused: 401 without a known, live token (by reason), 403 without the right (by role), 408 for a body too slow, 413 for a body too large.",
            parsed_labels(labels),
            *n,
        );
    }
    let log = app.log.stats();
    m.counter("weir_log_records_appended", "Records appended and acknowledged by the log.", vec![], log.records);
    m.counter("weir_log_group_commits", "Group commits (one fsync per touched partition each).", vec![], log.commits);
    m.counter("weir_log_appends_refused", "Appends refused because a write or fsync failed.", vec![], log.refused);
    m.counter(
        "weir_alert_notifications_dropped",
        "Alert notifications dropped because alert_queue notifications were waiting for the webhook.",
        vec![],
        app.webhooks.dropped.load(Ordering::Relaxed),
    );
    m.counter(
        "weir_log_appends_busy",
        "Appends refused with 503 because the log writer's queue held log_queue_bytes.",
        vec![],
        log.busy,
    );
    m.gauge("weir_log_healthy", "1 while the log accepts writes.", vec![], i64::from(app.log.unhealthy().is_none()));
    for ((signal, outcome), n) in app.otel_exports.totals() {
        m.counter(
            "weir_otel_exports",
            "Requests to the OpenTelemetry collector ([otel] in weir.toml), by signal and outcome.",
            vec![label("signal", signal), label("outcome", outcome)],
            n,
        );
    }
    let durable = lock(&app.durable).clone();
    m.histogram(
        "weir_ingest_durable_latency_seconds",
        "From a POST's arrival to its events fsynced.",
        vec![],
        &durable,
    );
    for (name, p) in app.pipelines.iter().filter(|(name, _)| shown(name)) {
        let s = report(&app.log, &app.watch, name, p);
        let base = vec![label("pipeline", name), label("messaging_destination_name", &p.contract().source.topic)];
        let with = |k: &str, v: &str| {
            let mut l = base.clone();
            l.push(label(k, v));
            l
        };
        let e = &s.events;
        m.counter("weir_events_read", "Events read from the log.", base.clone(), e.read);
        m.counter("weir_events_counted", "Events counted in a window.", base.clone(), e.counted);
        m.counter("weir_events_filtered", "Events a where rule left out.", base.clone(), e.filtered);
        m.counter(
            "weir_events_late_allowed",
            "Events counted in a window the watermark had passed.",
            base.clone(),
            e.late_allowed,
        );
        for r in Reason::ALL {
            m.counter(
                "weir_ledger_entries",
                "Events that did not count, by reason (the dead-letter volume).",
                with("reason", r.as_str()),
                s.ledger.get(r.as_str()).copied().unwrap_or(0),
            );
        }
        m.counter(
            "weir_future_events",
            "Events whose time was more than max_future ahead of the processing clock (ledger reason future): not counted, the watermark unmoved.",
            base.clone(),
            s.ledger.get(Reason::Future.as_str()).copied().unwrap_or(0),
        );
        for (status, n) in
            [("provisional", s.rows.provisional), ("settled", s.rows.settled), ("retracted", s.rows.retracted)]
        {
            m.counter("weir_rows_emitted", "Rows emitted, by status.", with("status", status), n);
        }
        m.gauge("weir_consumer_lag_records", "Records in the log not yet read.", base.clone(), clamp(s.lag_records));
        m.counter(
            "weir_duplicates_suppressed",
            "Events not counted because their id was seen before (duplicate and duplicate_conflict).",
            base.clone(),
            s.duplicates(),
        );
        m.gauge(
            "weir_consumer_lag_ms",
            "Log time between the oldest record not yet read and the newest record (largest over partitions).",
            base.clone(),
            s.lag_ms,
        );
        m.gauge(
            "weir_oldest_unprocessed_age_ms",
            "Age of the oldest unprocessed event, in milliseconds.",
            base.clone(),
            s.oldest_unprocessed_age_ms,
        );
        if let Some(w) = s.watermark_ms {
            m.gauge("weir_watermark_ms", "The watermark, in milliseconds since the Unix epoch.", base.clone(), w);
        }
        if let Some(age) = s.watermark_age_ms {
            m.gauge("weir_watermark_age_ms", "Now minus the watermark, in milliseconds.", base.clone(), age);
        }
        m.gauge("weir_open_windows", "Windows open in the engine.", base.clone(), clamp(s.open_windows as u64));
        m.gauge(
            "weir_state_bytes",
            "About how many bytes the engine's state holds.",
            base.clone(),
            clamp(s.state_bytes as u64),
        );
        m.histogram(
            "weir_processing_latency_seconds",
            "From an event's append to the log to its processing.",
            base.clone(),
            &s.processing,
        );
        m.histogram(
            "weir_producer_lag_seconds",
            "Producer lag: from an event's time to its append to the log (Kafka's timestamp on Kafka).",
            base.clone(),
            &s.producer_lag,
        );
        m.histogram(
            "weir_checkpoint_duration_seconds",
            "How long a checkpoint took.",
            base.clone(),
            &s.checkpoint_duration,
        );
        m.counter("weir_replays", "Replays since the server started.", base.clone(), s.replays);
        m.counter(
            "weir_pipeline_restarts",
            "Restarts from the last checkpoint after a failure, since the server started.",
            base.clone(),
            s.restarts,
        );
        m.counter(
            "weir_offsets_skipped",
            "Input offsets skipped between two records read: deleted by retention before the pipeline read them (the embedded log's or Kafka's), compaction, transaction markers or a broker fault.",
            base.clone(),
            s.offsets_not_delivered,
        );
        m.counter(
            "weir_checkpoints_fenced",
            "Checkpoints refused by the Postgres fence: another worker had taken the partition over, so this one's work was dropped.",
            base.clone(),
            s.checkpoints_fenced,
        );
        m.gauge(
            "weir_pipeline_failing",
            "1 while the pipeline's last attempt failed and no checkpoint has succeeded since.",
            base.clone(),
            i64::from(s.failed.is_some()),
        );
        m.gauge(
            "weir_pipeline_paused",
            "1 while an operator has paused publishing.",
            base.clone(),
            i64::from(s.paused),
        );
        for d in &s.destinations {
            let mut l = base.clone();
            l.push(label("destination", &d.name));
            l.push(label("kind", &d.kind));
            m.gauge(
                "weir_destination_position",
                "The next change seq the destination delivers.",
                l.clone(),
                d.position,
            );
            m.gauge(
                "weir_destination_lag_changes",
                "Changes published and not yet delivered to the destination.",
                l.clone(),
                d.lag_changes,
            );
            m.gauge(
                "weir_destination_lag_ms",
                "Milliseconds since the oldest change not yet delivered to the destination was published (0 when it is caught up).",
                l.clone(),
                (d.lag_seconds * 1000.0) as i64,
            );
            m.gauge(
                "weir_destination_stopped",
                "1 while the destination is stopped by its receiver's refusal, until an operator resumes it.",
                l.clone(),
                i64::from(d.state.starts_with("stopped")),
            );
            m.counter(
                "weir_destination_delivered",
                "Changes delivered to the destination since the server started.",
                l.clone(),
                d.delivered,
            );
            m.counter(
                "weir_destination_retries",
                "Deliveries that failed and were tried again, since the server started.",
                l,
                d.retries,
            );
        }
        let totals = lock(&app.watch.reconcile).get(name).cloned().unwrap_or_default();
        for origin in ["operator", "schedule"] {
            m.counter(
                "weir_reconcile_runs",
                "Backfill runs done, by who asked (an operator, or the contract's [reconcile] schedule).",
                with("origin", origin),
                totals.runs.get(origin).copied().unwrap_or(0),
            );
        }
        m.counter(
            "weir_reconcile_corrected_windows",
            "Windows a backfill run published a corrected row for.",
            base.clone(),
            totals.corrected_windows,
        );
        for (aggregate, amount) in &totals.corrected_amount {
            m.counter_f(
                "weir_reconcile_corrected_amount",
                "Per aggregate, what backfill runs changed, each window's change counted as a positive amount.",
                with("aggregate", aggregate),
                *amount,
            );
        }
        for c in &s.checks {
            let mut labels = with("check", &c.check);
            labels.push(label("severity", c.severity));
            for (outcome, n) in [("passed", c.passed), ("failed", c.failed)] {
                let mut l = labels.clone();
                l.push(label("outcome", outcome));
                m.counter(
                    "weir_check_results",
                    "Results of the contract's named checks judged by this server, by outcome.",
                    l,
                    n,
                );
            }
            m.gauge("weir_check_failing", "1 while a named check's last result failed.", labels, i64::from(c.failing));
        }
        if let Some(age) = s.checkpoint_age_ms {
            m.gauge("weir_checkpoint_age_ms", "Milliseconds since the last checkpoint.", base.clone(), age);
        }
        for part in &s.partitions {
            let labels = with("messaging_destination_partition_id", &part.partition.to_string());
            m.gauge(
                "weir_partition_lag_records",
                "Records in the partition not yet read.",
                labels.clone(),
                clamp(part.lag),
            );
            if let Some(age) = part.watermark_age_ms {
                m.gauge(
                    "weir_partition_watermark_age_ms",
                    "Now minus the partition's watermark, in milliseconds.",
                    labels,
                    age,
                );
            }
        }
    }
    m
}

pub(crate) fn clamp(n: u64) -> i64 {
    n.min(i64::MAX as u64) as i64
}

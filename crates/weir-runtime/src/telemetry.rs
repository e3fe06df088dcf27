//! Traces of what a runner does, through the OpenTelemetry API: a span
//! for each checkpoint. Without `[otel]` in weir.toml no tracer provider
//! is installed and the spans cost next to nothing (the API's no-op
//! tracer); with it, `weir-server::otel` exports them over OTLP.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{Span, SpanKind, Status, Tracer};
use opentelemetry::KeyValue;
use weir_contract::Contract;
use weir_store::checkpoint::Scope;

/// The instrumentation scope of weir's spans.
pub const SCOPE: &str = "weir";

/// One checkpoint of one scope, as its span tells it.
pub struct Checkpoint {
    pub scope: Scope,
    /// Events read since the scope's last checkpoint.
    pub events: u64,
    /// Rows and ledger entries it published.
    pub rows: usize,
    pub ledger: usize,
    /// False when the fence refused it (another worker holds the partition).
    pub committed: bool,
}

impl Checkpoint {
    /// Ends a `checkpoint` span that began at `began_ms` (the runner's
    /// wall clock) and took `took`.
    pub fn record(&self, contract: &Contract, began_ms: i64, took: Duration) {
        let tracer = opentelemetry::global::tracer(SCOPE);
        let start = UNIX_EPOCH + Duration::from_millis(began_ms.max(0) as u64);
        let mut attributes = vec![
            KeyValue::new("weir.pipeline", contract.pipeline.name.clone()),
            KeyValue::new("weir.contract.version", i64::from(contract.pipeline.version)),
            KeyValue::new("messaging.destination.name", contract.source.topic.clone()),
            KeyValue::new("weir.checkpoint.events", self.events as i64),
            KeyValue::new("weir.checkpoint.rows", self.rows as i64),
            KeyValue::new("weir.checkpoint.ledger_entries", self.ledger as i64),
        ];
        if let Scope::Partition(p) = self.scope {
            attributes.push(KeyValue::new("messaging.destination.partition.id", p.to_string()));
        }
        let mut span = tracer
            .span_builder("checkpoint")
            .with_kind(SpanKind::Internal)
            .with_start_time(start)
            .with_attributes(attributes)
            .start(&tracer);
        if !self.committed {
            span.set_status(Status::error("fenced: another worker holds the partition; this work was dropped"));
        }
        span.end_with_timestamp(start.checked_add(took).unwrap_or_else(SystemTime::now));
    }
}

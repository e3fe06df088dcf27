//! OpenTelemetry export (`[otel]` in weir.toml): every metric `/metrics`
//! serves, and traces of checkpoints and operator actions, pushed to a
//! collector over OTLP/HTTP (`http/protobuf` or `http/json`).
//!
//! - **Metrics** are the same [`Scrape`] `/metrics` encodes, sent every
//!   `interval` as one `ExportMetricsServiceRequest` built from the
//!   `opentelemetry-proto` types: counters as cumulative monotonic sums,
//!   gauges as gauges, and the latency histograms with their own buckets
//!   (the SDK's instruments cannot carry a histogram aggregated elsewhere).
//!   A name is the Prometheus one with its unit suffix (`_seconds`, `_ms`,
//!   `_bytes`) moved to the unit and `_` read as `.`
//!   (`weir_consumer_lag_ms` is `weir.consumer.lag` in `ms`); attributes
//!   keep the semantic conventions' names (`messaging.destination.name`,
//!   `messaging.destination.partition.id`), weir's own are `weir.*`.
//! - **Traces** go through the SDK's tracer provider, installed as the
//!   global one, with a batch processor and `opentelemetry-otlp`'s span
//!   exporter: `checkpoint` spans from `weir-runtime::telemetry`, and an
//!   HTTP server span for each operator or admin action ([`traced`]).
//! - Both are sent by `ureq` ([`Client`]); each request is counted in
//!   `weir_otel_exports_total{signal,outcome}`, and a collector that stops
//!   answering is logged once, and once more when it answers again. Nothing
//!   waits for it: a metrics export that fails is dropped (the next one is
//!   cumulative), spans wait in the processor's bounded queue.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use opentelemetry::trace::{Span, SpanKind, Status, Tracer};
use opentelemetry::KeyValue;
use opentelemetry_http::{Bytes, HttpClient, HttpError};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1 as common;
use opentelemetry_proto::tonic::metrics::v1 as proto;
use opentelemetry_proto::tonic::resource::v1::Resource as ProtoResource;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use prost::Message;
use weir_contract::{OtelConfig, OtelProtocol};
use weir_runtime::histogram::BOUNDS;
use weir_runtime::telemetry::SCOPE;

use crate::app::{App, Caller, Exports};
use crate::metrics::{clamp, scrape, Scrape, Value};

/// OTLP over HTTP with `ureq`, for the span exporter and the metrics.
#[derive(Clone)]
pub(crate) struct Client {
    agent: ureq::Agent,
    exports: Arc<Exports>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("weir::otel::Client")
    }
}

impl Client {
    /// A redirect is not followed (it is an export that failed): following
    /// one would send the headers, a collector's token among them, wherever
    /// the answer points.
    fn new(exports: Arc<Exports>) -> Client {
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .timeout_global(Some(Duration::from_secs(10)));
        Client { agent: config.build().into(), exports }
    }

    /// Sends one request and counts it under `signal`; a status other than 2xx is a failure.
    fn send(&self, signal: &'static str, request: http::Request<&[u8]>) -> Result<http::Response<Vec<u8>>, String> {
        let url = request.uri().to_string();
        let result = self.agent.run(request).map_err(|e| e.to_string()).and_then(|mut response| {
            let status = response.status();
            let body = response.body_mut().with_config().limit(4 << 20).read_to_vec().map_err(|e| e.to_string())?;
            let mut answer = http::Response::new(body);
            *answer.status_mut() = status;
            Ok(answer)
        });
        let outcome = match &result {
            Ok(r) if r.status().is_success() => Ok(()),
            Ok(r) => {
                Err(format!("the collector answered {}: {}", r.status(), String::from_utf8_lossy(r.body()).trim()))
            }
            Err(e) => Err(e.clone()),
        };
        self.exports.done(signal, &url, &outcome);
        result
    }
}

#[async_trait::async_trait]
impl HttpClient for Client {
    /// Blocks: the batch span processor runs its exports on a thread of its own.
    async fn send_bytes(
        &self,
        request: opentelemetry_http::Request<Bytes>,
    ) -> Result<opentelemetry_http::Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let answer = self.send("traces", http::Request::from_parts(parts, body.as_ref()))?;
        Ok(answer.map(Bytes::from))
    }
}

/// The installed exporters: the tracer provider, and what sends the metrics.
pub(crate) struct Otel {
    provider: SdkTracerProvider,
    metrics: Metrics,
}

struct Metrics {
    client: Client,
    url: String,
    protocol: OtelProtocol,
    headers: BTreeMap<String, String>,
    interval: Duration,
    resource: ProtoResource,
    started_ns: u64,
}

/// Installs the tracer provider as the global one (so the runners'
/// checkpoint spans and [`traced`] reach the collector) and prepares the
/// metrics export. Call before the pipelines start.
pub(crate) fn install(config: &OtelConfig, exports: &Arc<Exports>) -> crate::error::Result<Otel> {
    let started = SystemTime::now();
    let started_ns = nanos(started);
    let resource = Resource::builder()
        .with_service_name(config.service_name.clone())
        .with_attributes([
            KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
            KeyValue::new("service.instance.id", format!("{}-{started_ns:x}", std::process::id())),
        ])
        .build();
    let client = Client::new(Arc::clone(exports));
    let protocol = match config.protocol {
        OtelProtocol::Protobuf => Protocol::HttpBinary,
        OtelProtocol::Json => Protocol::HttpJson,
    };
    let headers: HashMap<String, String> = config.headers.clone().into_iter().collect();
    let spans = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client.clone())
        .with_endpoint(format!("{}/v1/traces", config.endpoint))
        .with_protocol(protocol)
        .with_headers(headers)
        .with_timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| crate::error::refused!("[otel] in weir.toml: cannot export traces to {}: {e}", config.endpoint))?;
    let delay = Duration::from_millis(config.interval_ms as u64).min(Duration::from_secs(5));
    let batch = BatchConfigBuilder::default().with_scheduled_delay(delay).build();
    let processor = BatchSpanProcessor::builder(spans).with_batch_config(batch).build();
    let provider = SdkTracerProvider::builder().with_span_processor(processor).with_resource(resource.clone()).build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    let metrics = Metrics {
        client,
        url: format!("{}/v1/metrics", config.endpoint),
        protocol: config.protocol,
        headers: config.headers.clone(),
        interval: Duration::from_millis(config.interval_ms as u64),
        resource: ProtoResource {
            attributes: resource.iter().map(|(k, v)| attribute(k.as_str(), &v.to_string())).collect(),
            ..Default::default()
        },
        started_ns,
    };
    Ok(Otel { provider, metrics })
}

impl Otel {
    /// Exports the metrics every `interval` until `stop`, then once more,
    /// and flushes the spans waiting.
    pub(crate) fn run(self, app: Arc<App>, stop: Arc<AtomicBool>) {
        let mut next = Instant::now() + self.metrics.interval;
        while !stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(100));
            if Instant::now() >= next {
                self.metrics.export(&app);
                next = Instant::now() + self.metrics.interval;
            }
        }
        self.metrics.export(&app);
        if let Err(e) = self.provider.shutdown() {
            eprintln!("weir: the last OpenTelemetry spans were not all sent: {e}");
        }
    }
}

impl Metrics {
    fn export(&self, app: &App) {
        let request = request(&scrape(app, &|_| true), &self.resource, self.started_ns, nanos(SystemTime::now()));
        let (body, content_type) = match self.protocol {
            OtelProtocol::Protobuf => (request.encode_to_vec(), "application/x-protobuf"),
            OtelProtocol::Json => match serde_json::to_vec(&request) {
                Ok(body) => (body, "application/json"),
                Err(e) => return eprintln!("weir: OpenTelemetry metrics not encoded: {e}"),
            },
        };
        let mut builder = http::Request::post(&self.url).header("content-type", content_type);
        for (name, value) in &self.headers {
            builder = builder.header(name, value);
        }
        match builder.body(body.as_slice()) {
            Ok(r) => drop(self.client.send("metrics", r)),
            Err(e) => eprintln!("weir: OpenTelemetry metrics request not built: {e}"),
        }
    }
}

/// One scrape as an OTLP metrics request.
pub(crate) fn request(
    scrape: &Scrape,
    resource: &ProtoResource,
    started_ns: u64,
    now_ns: u64,
) -> ExportMetricsServiceRequest {
    let cumulative = proto::AggregationTemporality::Cumulative as i32;
    let metrics = scrape
        .families
        .iter()
        .map(|family| {
            let (name, unit) = metric_name(family.name);
            let attributes = |labels: &[(String, String)]| -> Vec<common::KeyValue> {
                labels.iter().map(|(k, v)| attribute(&attribute_name(k), v)).collect()
            };
            let number = |labels: &[(String, String)], value: &Value| proto::NumberDataPoint {
                attributes: attributes(labels),
                start_time_unix_nano: started_ns,
                time_unix_nano: now_ns,
                value: Some(match value {
                    Value::CounterF(x) => proto::number_data_point::Value::AsDouble(*x),
                    Value::Counter(n) => proto::number_data_point::Value::AsInt(clamp(*n)),
                    Value::Gauge(n) => proto::number_data_point::Value::AsInt(*n),
                    Value::Histogram(h) => proto::number_data_point::Value::AsInt(clamp(h.count)),
                }),
                ..Default::default()
            };
            let data = match family.samples.first().map(|(_, v)| v) {
                Some(Value::Counter(_) | Value::CounterF(_)) => proto::metric::Data::Sum(proto::Sum {
                    data_points: family.samples.iter().map(|(labels, value)| number(labels, value)).collect(),
                    aggregation_temporality: cumulative,
                    is_monotonic: true,
                }),
                Some(Value::Histogram(_)) => proto::metric::Data::Histogram(proto::Histogram {
                    data_points: family
                        .samples
                        .iter()
                        .filter_map(|(labels, value)| match value {
                            Value::Histogram(h) => Some(proto::HistogramDataPoint {
                                attributes: attributes(labels),
                                start_time_unix_nano: started_ns,
                                time_unix_nano: now_ns,
                                count: h.count,
                                sum: Some(h.sum),
                                bucket_counts: h.counts.to_vec(),
                                explicit_bounds: BOUNDS.to_vec(),
                                ..Default::default()
                            }),
                            _ => None,
                        })
                        .collect(),
                    aggregation_temporality: cumulative,
                }),
                _ => proto::metric::Data::Gauge(proto::Gauge {
                    data_points: family.samples.iter().map(|(labels, value)| number(labels, value)).collect(),
                }),
            };
            proto::Metric {
                name,
                description: family.help.to_owned(),
                unit: unit.to_owned(),
                data: Some(data),
                ..Default::default()
            }
        })
        .collect();
    ExportMetricsServiceRequest {
        resource_metrics: vec![proto::ResourceMetrics {
            resource: Some(resource.clone()),
            scope_metrics: vec![proto::ScopeMetrics {
                scope: Some(common::InstrumentationScope {
                    name: SCOPE.to_owned(),
                    version: env!("CARGO_PKG_VERSION").to_owned(),
                    ..Default::default()
                }),
                metrics,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

/// A `/metrics` family's OTLP name and unit: the unit suffix moved to the
/// unit, `_` read as `.`.
pub(crate) fn metric_name(prometheus: &str) -> (String, &'static str) {
    let (stem, unit) = [("_seconds", "s"), ("_ms", "ms"), ("_bytes", "By")]
        .iter()
        .find_map(|(suffix, unit)| Some((prometheus.strip_suffix(suffix)?, *unit)))
        .unwrap_or((prometheus, ""));
    (stem.replace('_', "."), unit)
}

/// A `/metrics` label's attribute name: the semantic conventions' own
/// (`messaging_destination_name` is `messaging.destination.name`), or weir's (`weir.pipeline`).
pub(crate) fn attribute_name(label: &str) -> String {
    match label.strip_prefix("messaging_") {
        Some(rest) => format!("messaging.{}", rest.replace('_', ".")),
        None => format!("weir.{label}"),
    }
}

fn attribute(key: &str, value: &str) -> common::KeyValue {
    common::KeyValue {
        key: key.to_owned(),
        value: Some(common::AnyValue { value: Some(common::any_value::Value::StringValue(value.to_owned())) }),
        ..Default::default()
    }
}

fn nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// An HTTP server span (the semantic conventions' `{method} {route}`)
/// for each operator or admin action: every POST and DELETE but a
/// producer's events. Its attributes say who (`user.id`, the token), from
/// where (`client.address`), on which pipeline, and the answer's status;
/// a 5xx marks it an error. Without `[otel]` the tracer is the API's no-op.
pub(crate) async fn traced(req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let acts = method == http::Method::POST || method == http::Method::DELETE;
    let path = req.uri().path().to_owned();
    if !acts || path.ends_with("/events") {
        return next.run(req).await;
    }
    let route = req.extensions().get::<MatchedPath>().map_or_else(|| path.clone(), |m| m.as_str().to_owned());
    let mut attributes = vec![
        KeyValue::new("http.request.method", method.to_string()),
        KeyValue::new("http.route", route.clone()),
        KeyValue::new("url.path", path.clone()),
    ];
    if let Some(caller) = req.extensions().get::<Caller>() {
        attributes.push(KeyValue::new("user.id", caller.grant.who()));
        attributes.push(KeyValue::new("client.address", caller.origin.clone()));
    }
    if let Some(pipeline) = path.strip_prefix("/v1/pipelines/").and_then(|rest| rest.split('/').next()) {
        attributes.push(KeyValue::new("weir.pipeline", pipeline.to_owned()));
    }
    let tracer = opentelemetry::global::tracer(SCOPE);
    let mut span = tracer
        .span_builder(format!("{method} {route}"))
        .with_kind(SpanKind::Server)
        .with_attributes(attributes)
        .start(&tracer);
    let response = next.run(req).await;
    let status = response.status();
    span.set_attribute(KeyValue::new("http.response.status_code", i64::from(status.as_u16())));
    if status.is_server_error() {
        span.set_attribute(KeyValue::new("error.type", status.as_u16().to_string()));
        span.set_status(Status::error(status.to_string()));
    }
    span.end();
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn review_2_point_8_an_export_answered_with_a_redirect_is_not_followed() {
        use std::io::{Read, Write};
        // The place a redirect points at: it must see no request.
        let elsewhere = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        elsewhere.set_nonblocking(true).unwrap();
        let target = format!("http://{}/v1/metrics", elsewhere.local_addr().unwrap());
        let collector = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1/metrics", collector.local_addr().unwrap());
        let answering = std::thread::spawn(move || {
            let (mut conn, _) = collector.accept().unwrap();
            let mut head = [0u8; 4096];
            let _ = conn.read(&mut head);
            let answer =
                format!("HTTP/1.1 302 Found\r\nlocation: {target}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            conn.write_all(answer.as_bytes()).unwrap();
        });
        let exports = Arc::new(Exports::default());
        let client = Client::new(Arc::clone(&exports));
        let request = http::Request::post(&url).header("authorization", "Bearer secret").body(&b"{}"[..]).unwrap();
        let answer = client.send("metrics", request).unwrap();
        answering.join().unwrap();
        assert_eq!(answer.status().as_u16(), 302, "the redirect is the answer, not followed");
        std::thread::sleep(Duration::from_millis(200));
        assert!(elsewhere.accept().is_err(), "the redirect's target was called, the token with it");
    }

    #[test]
    fn names_follow_the_conventions() {
        assert_eq!(metric_name("weir_consumer_lag_ms"), ("weir.consumer.lag".to_owned(), "ms"));
        assert_eq!(metric_name("weir_processing_latency_seconds"), ("weir.processing.latency".to_owned(), "s"));
        assert_eq!(metric_name("weir_state_bytes"), ("weir.state".to_owned(), "By"));
        assert_eq!(metric_name("weir_events_read"), ("weir.events.read".to_owned(), ""));
        assert_eq!(attribute_name("messaging_destination_partition_id"), "messaging.destination.partition.id");
        assert_eq!(attribute_name("pipeline"), "weir.pipeline");
    }

    #[test]
    fn a_scrape_becomes_one_request_in_both_encodings() {
        let mut h = weir_runtime::histogram::Histogram::default();
        for s in [0.0005, 0.003, 100.0] {
            h.observe(s);
        }
        let labels = vec![("pipeline".to_owned(), "paid".to_owned())];
        let scrape = Scrape {
            families: vec![
                crate::metrics::Family {
                    name: "weir_events_read",
                    help: "read",
                    samples: vec![(labels.clone(), Value::Counter(7))],
                },
                crate::metrics::Family {
                    name: "weir_watermark_age_ms",
                    help: "age",
                    samples: vec![(labels.clone(), Value::Gauge(-3))],
                },
                crate::metrics::Family {
                    name: "weir_processing_latency_seconds",
                    help: "latency",
                    samples: vec![(labels, Value::Histogram(h))],
                },
            ],
        };
        let r = request(&scrape, &ProtoResource::default(), 1, 2);
        let decoded = ExportMetricsServiceRequest::decode(r.encode_to_vec().as_slice()).unwrap();
        assert_eq!(decoded, r, "protobuf round trip");
        let json: serde_json::Value = serde_json::from_slice(&serde_json::to_vec(&r).unwrap()).unwrap();
        let metrics = &json["resourceMetrics"][0]["scopeMetrics"][0]["metrics"];
        assert_eq!(metrics[0]["name"], "weir.events.read");
        assert_eq!(metrics[0]["sum"]["isMonotonic"], true);
        assert_eq!(metrics[0]["sum"]["aggregationTemporality"], 2, "cumulative");
        let point = &metrics[0]["sum"]["dataPoints"][0];
        assert_eq!(point["attributes"][0]["key"], "weir.pipeline");
        assert_eq!(point["attributes"][0]["value"]["stringValue"], "paid");
        assert_eq!(point["asInt"].to_string().trim_matches('"'), "7");
        assert_eq!(metrics[1]["unit"], "ms");
        assert_eq!(metrics[1]["gauge"]["dataPoints"][0]["asInt"].to_string().trim_matches('"'), "-3");
        let hist = &metrics[2]["histogram"]["dataPoints"][0];
        assert_eq!(metrics[2]["name"], "weir.processing.latency");
        assert_eq!(hist["count"].to_string().trim_matches('"'), "3");
        assert_eq!(hist["explicitBounds"].as_array().map(Vec::len), Some(BOUNDS.len()));
        let buckets: Vec<String> = hist["bucketCounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.to_string().trim_matches('"').to_owned())
            .collect();
        assert_eq!(buckets.len(), BOUNDS.len() + 1);
        assert_eq!((buckets[0].as_str(), buckets[2].as_str(), buckets[BOUNDS.len()].as_str()), ("1", "1", "1"));
    }
}

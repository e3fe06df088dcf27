//! `weir.toml`: how `weir serve` runs (SPEC.md section 7). Every key is
//! optional; an unknown key or a bad value is refused with the file, the
//! line, the key and what to do, as contracts are.
//!
//! ```toml
//! listen = "127.0.0.1:8080"
//! idle_timeout = "30s"          # a partition silent this long stops holding the watermark back
//! checkpoint_interval = "100ms" # results are published (and checkpointed) at least this often while behind; caught up, at once
//! checkpoint_events = 200000    # ... and after at most this many events
//! max_body_bytes = 67108864     # largest POST body
//! max_export_bytes = 268435456  # largest export POSTed to .../reconcile (read one at a time)
//! max_events_per_request = 100000 # most events in one POST (413 past it, nothing appended)
//! log_queue_bytes = 268435456   # events waiting for the log's writer; past it a POST gets 503 and Retry-After
//! max_connections = 1024        # open client connections; more wait in the listen backlog
//! max_followers = 256           # open change feeds (long polls, server-sent events); past it 503 and Retry-After
//! alert_queue = 1000            # alert notifications waiting for each webhook; past it the oldest is dropped and counted
//! allow_private_webhooks = false     # true: alerts may go to loopback and private addresses
//! allow_link_local_webhooks = false  # true: alerts may go to link-local and cloud metadata addresses
//! pool_connections = 16         # connections each reader pool (SQLite, Postgres) opens at most
//! header_timeout = "10s"        # a connection's request head must arrive within this (idle ones close too)
//! write_timeout = "30s"         # an answer the client stops reading is cut off after this; shutdown waits at most this
//! body_timeout = "60s"          # a request's body must arrive whole within this
//! store_statement_timeout = "60s" # a reader's or an action's query on the store (SQLite, Postgres) is stopped after this
//! alert_webhook = "http://..."  # where alerts go when a contract names no webhook
//! webhook_ca_cert = "/etc/weir/hooks-ca.pem" # https webhooks are checked against these PEM certificates, not the public roots
//! ledger_payload_retention = "30d" # ledger payloads (and details) are erased after this, or after
//!                               # the topic's retention when that is shorter
//! superseded_retention = "30d"  # a superseded contract version stays readable this long, then is removed
//! audit_key_file = "/etc/weir/audit.key" # the audit log's HMAC key (at least 32 bytes, mode 0600, outside the data folder)
//!
//! [topics.payments]
//! partitions = 4
//! key = "account_id"            # the top-level field whose hash picks the partition
//! retention = "7d"
//! max_event_bytes = 1048576
//! max_depth = 64                # deepest nesting of one event (at most 64)
//! max_fields = 100000           # values in one event, nested ones included
//! max_key_bytes = 4096          # the partitioning field's value, as JSON text
//!
//! [kafka]                       # Kafka as the log (with [postgres]); see docs/kafka-postgres.md
//! brokers = "127.0.0.1:9092"
//! group = "weir-billing"        # default: weir-{pipeline}-v{version}
//! [kafka.config]                # librdkafka properties, passed as they are
//! "security.protocol" = "SASL_SSL"
//!
//! [postgres]                    # results and checkpoints in PostgreSQL
//! url = "host=127.0.0.1 user=postgres dbname=test"
//! schema = "weir"
//!
//! [connections.warehouse]       # what a contract's [[destination]] names: the URL and its secrets
//! url = "host=10.0.0.5 user=weir password=... dbname=analytics"   # postgres: libpq's form or a postgres:// URL
//! [connections.accounts_api]
//! url = "https://accounts.internal/v1/unlocks"                    # http: where the batches are POSTed
//! headers = { authorization = "Bearer ..." }                     # sent with every POST
//! allow_private = false         # true: the URL may be a loopback or private address (refused by default)
//!
//! [otel]                        # OpenTelemetry: metrics and traces over OTLP/HTTP
//! endpoint = "http://127.0.0.1:4318" # the collector; /v1/metrics and /v1/traces are added
//! protocol = "http/protobuf"    # or "http/json"
//! interval = "60s"              # metrics are exported this often (spans at most 5 s after they end)
//! service_name = "weir"         # the resource's service.name
//! [otel.headers]                # sent with every export, e.g. a collector's token
//! authorization = "Bearer ..."
//! ```

use std::collections::BTreeMap;

use toml_edit::{Document, Item, Table};

use crate::contract::{Limits, MAX_DEPTH, MAX_EVENT_BYTES_DEFAULT};
use crate::reader::{line_of, Reader};
use crate::{ContractError, ContractErrors};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    pub listen: Option<String>,
    pub idle_timeout_ms: i64,
    pub checkpoint_interval_ms: i64,
    pub checkpoint_events: u64,
    pub max_body_bytes: usize,
    /// The largest export a `POST .../reconcile` takes (in place of
    /// `max_body_bytes`); one export is read at a time.
    pub max_export_bytes: usize,
    /// Most events in one POST.
    pub max_events_per_request: usize,
    /// Bytes of appends waiting for the log's writer.
    pub log_queue_bytes: usize,
    /// Open client connections.
    pub max_connections: usize,
    /// Open change feeds: long polls (`wait=`) and server-sent events.
    pub max_followers: usize,
    /// Alert notifications waiting for delivery.
    pub alert_queue: usize,
    /// Connections each of the HTTP side's pools (SQLite, Postgres) holds at most.
    pub pool_connections: u32,
    /// A client that has not sent a whole request head within this is
    /// disconnected; so is a kept-alive connection idle this long.
    pub header_timeout_ms: i64,
    /// A write to a client that makes no progress for this long ends its
    /// connection; a shutdown waits at most this for open connections.
    pub write_timeout_ms: i64,
    /// A request body that has not arrived whole within this gets 408.
    pub body_timeout_ms: i64,
    /// Ledger payloads and details older than this are erased (the
    /// entries stay); a topic's shorter `retention` applies too.
    pub ledger_payload_retention_ms: Option<i64>,
    /// How long a superseded contract version (SPEC.md 8) stays readable
    /// after it was superseded; then its rows, changes and ledger are removed.
    pub superseded_retention_ms: i64,
    /// How long a query of the HTTP side and the backfill worker on the
    /// store may run before the database stops it.
    pub store_statement_timeout_ms: i64,
    /// Where alerts go when a contract's `[alerts]` names no webhook.
    pub alert_webhook: Option<String>,
    /// A PEM file of certificates that `https` webhooks are checked
    /// against instead of the public roots (a private CA's, or a hook's own).
    pub webhook_ca_cert: Option<String>,
    pub topics: BTreeMap<String, TopicConfig>,
    pub kafka: Option<KafkaConfig>,
    pub postgres: Option<PostgresConfig>,
    /// `[auth] public_metrics = true`: `/metrics` answers without a token.
    pub public_metrics: bool,
    /// `allow_link_local_webhooks = true`: alerts may go to link-local and
    /// cloud metadata addresses (refused by default).
    pub allow_link_local_webhooks: bool,
    /// `allow_private_webhooks = true`: alerts may go to loopback and
    /// private addresses (refused by default).
    pub allow_private_webhooks: bool,
    /// The file holding the audit log's HMAC key (kept outside the data
    /// folder, so whoever can edit `weir.db` cannot recompute the chain).
    pub audit_key_file: Option<String>,
    /// `[otel]`: where metrics and traces are exported over OTLP.
    pub otel: Option<OtelConfig>,
    /// `[connections.NAME]`: what destinations name, with their secrets.
    pub connections: BTreeMap<String, Connection>,
}

/// `[connections.NAME]`: a URL with its secrets, named by a contract's
/// `[[destination]]` so that no contract holds a password or a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connection {
    /// A Postgres connection string, or the http(s) URL to POST to.
    pub url: String,
    /// Headers sent with every request (http), names in lower case.
    pub headers: BTreeMap<String, String>,
    /// The URL may resolve to a loopback or private address.
    pub allow_private: bool,
}

/// `[otel]`: an OpenTelemetry collector that weir pushes metrics and
/// traces to over OTLP/HTTP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtelConfig {
    /// The collector's base URL (`http://` or `https://`); the signal's
    /// path (`/v1/metrics`, `/v1/traces`) is added, as
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` is read.
    pub endpoint: String,
    pub protocol: OtelProtocol,
    /// How often metrics are exported.
    pub interval_ms: i64,
    pub service_name: String,
    /// Headers sent with every export.
    pub headers: BTreeMap<String, String>,
}

/// OTLP's encodings over HTTP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtelProtocol {
    /// `http/protobuf` (OTLP's default).
    Protobuf,
    /// `http/json`.
    Json,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaConfig {
    pub brokers: String,
    pub group: Option<String>,
    /// librdkafka properties (security, timeouts), passed as they are.
    pub config: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresConfig {
    pub url: String,
    pub schema: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicConfig {
    pub partitions: u32,
    pub key: Option<String>,
    pub retention_ms: Option<i64>,
    pub max_event_bytes: usize,
    /// Past these, a POST is refused (422) before anything is appended.
    pub max_depth: usize,
    pub max_fields: usize,
    pub max_key_bytes: usize,
}

impl Default for TopicConfig {
    fn default() -> TopicConfig {
        let limits = Limits::default();
        TopicConfig {
            partitions: 1,
            key: None,
            retention_ms: None,
            max_event_bytes: MAX_EVENT_BYTES_DEFAULT,
            max_depth: limits.max_depth,
            max_fields: limits.max_fields,
            max_key_bytes: limits.max_key_bytes,
        }
    }
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            listen: None,
            idle_timeout_ms: 30_000,
            checkpoint_interval_ms: 100,
            checkpoint_events: 200_000,
            max_body_bytes: 64 << 20,
            max_export_bytes: 256 << 20,
            max_events_per_request: 100_000,
            log_queue_bytes: 256 << 20,
            max_connections: 1024,
            max_followers: 256,
            alert_queue: 1000,
            pool_connections: 16,
            ledger_payload_retention_ms: None,
            superseded_retention_ms: 30 * 24 * 3_600_000,
            store_statement_timeout_ms: 60_000,
            header_timeout_ms: 10_000,
            write_timeout_ms: 30_000,
            body_timeout_ms: 60_000,
            alert_webhook: None,
            webhook_ca_cert: None,
            topics: BTreeMap::new(),
            kafka: None,
            postgres: None,
            public_metrics: false,
            allow_link_local_webhooks: false,
            allow_private_webhooks: false,
            audit_key_file: None,
            otel: None,
            connections: BTreeMap::new(),
        }
    }
}

const TOP_KEYS: &[&str] = &[
    "listen",
    "idle_timeout",
    "checkpoint_interval",
    "checkpoint_events",
    "max_body_bytes",
    "max_export_bytes",
    "max_events_per_request",
    "log_queue_bytes",
    "max_connections",
    "max_followers",
    "alert_queue",
    "pool_connections",
    "header_timeout",
    "write_timeout",
    "body_timeout",
    "alert_webhook",
    "webhook_ca_cert",
    "allow_link_local_webhooks",
    "allow_private_webhooks",
    "audit_key_file",
    "ledger_payload_retention",
    "superseded_retention",
    "store_statement_timeout",
    "topics",
    "kafka",
    "postgres",
    "auth",
    "otel",
    "connections",
];
const CONNECTION_KEYS: &[&str] = &["url", "headers", "allow_private"];
const AUTH_KEYS: &[&str] = &["public_metrics"];
const KAFKA_KEYS: &[&str] = &["brokers", "group", "config"];
const POSTGRES_KEYS: &[&str] = &["url", "schema"];
const OTEL_KEYS: &[&str] = &["endpoint", "protocol", "interval", "service_name", "headers"];
const TOPIC_KEYS: &[&str] =
    &["partitions", "key", "retention", "max_event_bytes", "max_depth", "max_fields", "max_key_bytes"];

impl ServerConfig {
    /// The settings for `topic`: its own section, or the defaults (one partition).
    pub fn topic(&self, topic: &str) -> TopicConfig {
        self.topics.get(topic).cloned().unwrap_or_default()
    }

    /// Parses and validates `weir.toml`; `file` names it in every error.
    pub fn parse(file: &str, text: &str) -> Result<ServerConfig, ContractErrors> {
        let doc = Document::parse(text).map_err(|err| {
            ContractErrors(vec![ContractError {
                file: file.into(),
                line: err.span().map(|span| line_of(text, span.start)),
                key: "(toml)".into(),
                message: format!("not valid TOML: {}; fix the syntax at this line", err.message().trim()),
            }])
        })?;
        let mut r = Reader { file, text, errors: Vec::new() };
        let config = read(&mut r, doc.as_table());
        match config {
            Some(config) if r.errors.is_empty() => Ok(config),
            _ => {
                let mut errors = r.errors;
                errors.sort_by_key(|e| e.line.unwrap_or(usize::MAX));
                Err(ContractErrors(errors))
            }
        }
    }
}

fn read(r: &mut Reader<'_>, root: &Table) -> Option<ServerConfig> {
    r.unknown_keys(root, "weir.toml", TOP_KEYS);
    let defaults = ServerConfig::default();
    let listen = r.string(root, "weir.toml", "listen", false);
    let idle = r.duration(root, "weir.toml", "idle_timeout");
    let interval = r.duration(root, "weir.toml", "checkpoint_interval");
    let events = r.whole(root, "weir.toml", "checkpoint_events", 1, u32::MAX as i64);
    let body = r.whole(root, "weir.toml", "max_body_bytes", 1024, 1 << 31);
    let export = r.whole(root, "weir.toml", "max_export_bytes", 1024, 1 << 32);
    let max_events = r.whole(root, "weir.toml", "max_events_per_request", 1, 10_000_000);
    let log_queue = r.whole(root, "weir.toml", "log_queue_bytes", 1 << 20, 1 << 40);
    let connections = r.whole(root, "weir.toml", "max_connections", 1, 1 << 20);
    let followers = r.whole(root, "weir.toml", "max_followers", 1, 1 << 20);
    let alert_queue = r.whole(root, "weir.toml", "alert_queue", 1, 1 << 20);
    let pool = r.whole(root, "weir.toml", "pool_connections", 1, 1024);
    let alert_webhook = r.string(root, "weir.toml", "alert_webhook", false);
    let webhook_ca_cert = r.string(root, "weir.toml", "webhook_ca_cert", false);
    let audit_key_file = r.string(root, "weir.toml", "audit_key_file", false);
    let ledger_retention = r.duration(root, "weir.toml", "ledger_payload_retention");
    let superseded_retention = r.duration(root, "weir.toml", "superseded_retention");
    let header_timeout = r.duration(root, "weir.toml", "header_timeout");
    let body_timeout = r.duration(root, "weir.toml", "body_timeout");
    let write_timeout = r.duration(root, "weir.toml", "write_timeout");
    let store_timeout = r.duration(root, "weir.toml", "store_statement_timeout");
    for (key, value) in [
        ("header_timeout", &header_timeout),
        ("body_timeout", &body_timeout),
        ("write_timeout", &write_timeout),
        ("store_statement_timeout", &store_timeout),
    ] {
        if let Some(Some(ms)) = value {
            if !(100..=3_600_000).contains(ms) {
                let span = root.get(key).and_then(Item::span);
                r.error(span, key, "must be between 100ms and 1h: a client may not hold a connection forever");
            }
        }
    }
    if let Some(Some(ms)) = interval {
        if !(1..=1_000).contains(&ms) {
            let span = root.get("checkpoint_interval").and_then(Item::span);
            r.error(
                span,
                "checkpoint_interval",
                "must be between 1ms and 1s: results are published at least every second",
            );
        }
    }
    let mut topics = BTreeMap::new();
    if let Some(table) = r.table(root, "topics", false) {
        for (name, item) in table.iter() {
            let Item::Table(t) = item else {
                r.error(
                    item.span(),
                    &format!("topics.{name}"),
                    format!("must be a table: write it as [topics.{name}]"),
                );
                continue;
            };
            if let Some(topic) = read_topic(r, t, name) {
                topics.insert(name.to_owned(), topic);
            }
        }
    }
    let kafka = match r.table(root, "kafka", false) {
        Some(t) => read_kafka(r, t),
        None => Some(None),
    };
    let postgres = match r.table(root, "postgres", false) {
        Some(t) => read_postgres(r, t),
        None => Some(None),
    };
    let otel = match r.table(root, "otel", false) {
        Some(t) => read_otel(r, t),
        None => Some(None),
    };
    let mut named = BTreeMap::new();
    let mut connections_ok = true;
    if let Some(table) = r.table(root, "connections", false) {
        for (name, item) in table.iter() {
            let Item::Table(t) = item else {
                r.error(
                    item.span(),
                    &format!("connections.{name}"),
                    format!("must be a table: write it as [connections.{name}]"),
                );
                connections_ok = false;
                continue;
            };
            match read_connection(r, t, name) {
                Some(c) => {
                    named.insert(name.to_owned(), c);
                }
                None => connections_ok = false,
            }
        }
    }
    let link_local = "alerts may go to link-local and cloud metadata addresses";
    let allow_link_local_webhooks =
        r.flag(root, "allow_link_local_webhooks", "allow_link_local_webhooks", link_local).unwrap_or(false);
    let private = "alerts may go to loopback and private addresses";
    let allow_private_webhooks =
        r.flag(root, "allow_private_webhooks", "allow_private_webhooks", private).unwrap_or(false);
    let mut public_metrics = false;
    if let Some(t) = r.table(root, "auth", false) {
        r.unknown_keys(t, "auth", AUTH_KEYS);
        let open = "GET /metrics without a token";
        public_metrics = r.flag(t, "public_metrics", "auth.public_metrics", open).unwrap_or(false);
    }
    if !connections_ok {
        return None;
    }
    Some(ServerConfig {
        connections: named,
        public_metrics,
        allow_link_local_webhooks,
        allow_private_webhooks,
        kafka: kafka?,
        postgres: postgres?,
        otel: otel?,
        listen,
        idle_timeout_ms: idle?.unwrap_or(defaults.idle_timeout_ms),
        checkpoint_interval_ms: interval?.unwrap_or(defaults.checkpoint_interval_ms),
        checkpoint_events: events?.map_or(defaults.checkpoint_events, |v| v as u64),
        max_body_bytes: body?.map_or(defaults.max_body_bytes, |v| v as usize),
        max_export_bytes: export?.map_or(defaults.max_export_bytes, |v| v as usize),
        max_events_per_request: max_events?.map_or(defaults.max_events_per_request, |v| v as usize),
        log_queue_bytes: log_queue?.map_or(defaults.log_queue_bytes, |v| v as usize),
        max_connections: connections?.map_or(defaults.max_connections, |v| v as usize),
        max_followers: followers?.map_or(defaults.max_followers, |v| v as usize),
        alert_queue: alert_queue?.map_or(defaults.alert_queue, |v| v as usize),
        pool_connections: pool?.map_or(defaults.pool_connections, |v| v as u32),
        ledger_payload_retention_ms: ledger_retention?,
        superseded_retention_ms: superseded_retention?.unwrap_or(defaults.superseded_retention_ms),
        store_statement_timeout_ms: store_timeout?.unwrap_or(defaults.store_statement_timeout_ms),
        header_timeout_ms: header_timeout?.unwrap_or(defaults.header_timeout_ms),
        write_timeout_ms: write_timeout?.unwrap_or(defaults.write_timeout_ms),
        body_timeout_ms: body_timeout?.unwrap_or(defaults.body_timeout_ms),
        alert_webhook,
        webhook_ca_cert,
        audit_key_file,
        topics,
    })
}

fn read_kafka(r: &mut Reader<'_>, t: &Table) -> Option<Option<KafkaConfig>> {
    r.unknown_keys(t, "kafka", KAFKA_KEYS);
    let brokers = r.string(t, "kafka", "brokers", true);
    let group = r.string(t, "kafka", "group", false);
    let mut config = BTreeMap::new();
    let mut ok = true;
    if let Some(c) = r.table(t, "config", false) {
        for (name, item) in c.iter() {
            let value = match item.as_value() {
                Some(v) if v.as_str().is_some() => v.as_str().map(str::to_owned),
                Some(v) if v.as_integer().is_some() || v.as_bool().is_some() => Some(v.to_string().trim().to_owned()),
                _ => None,
            };
            match value {
                Some(v) => {
                    config.insert(name.to_owned(), v);
                }
                None => {
                    r.error(
                        item.span(),
                        &format!("kafka.config.{name}"),
                        "must be a string, number or boolean: it is passed to librdkafka as it is",
                    );
                    ok = false;
                }
            }
        }
    }
    let brokers = brokers?;
    ok.then_some(Some(KafkaConfig { brokers, group, config }))
}

fn read_postgres(r: &mut Reader<'_>, t: &Table) -> Option<Option<PostgresConfig>> {
    r.unknown_keys(t, "postgres", POSTGRES_KEYS);
    let url = r.string(t, "postgres", "url", true);
    let schema = r.string(t, "postgres", "schema", false).unwrap_or_else(|| "weir".into());
    let valid = !schema.is_empty()
        && schema.len() <= 63
        && schema.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !schema.starts_with(|c: char| c.is_ascii_digit());
    if !valid {
        r.error(
            t.get("schema").and_then(Item::span),
            "postgres.schema",
            "must be letters, digits and _, not starting with a digit (a Postgres schema weir creates)",
        );
        return None;
    }
    Some(Some(PostgresConfig { url: url?, schema }))
}

fn read_otel(r: &mut Reader<'_>, t: &Table) -> Option<Option<OtelConfig>> {
    r.unknown_keys(t, "otel", OTEL_KEYS);
    let endpoint = r.string(t, "otel", "endpoint", true);
    let protocol = r.string(t, "otel", "protocol", false);
    let interval = r.duration(t, "otel", "interval");
    let service_name = r.string(t, "otel", "service_name", false).unwrap_or_else(|| "weir".into());
    let span = |key: &str| t.get(key).and_then(Item::span);
    let mut ok = true;
    if let Some(url) = &endpoint {
        let rest = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://"));
        if rest.is_none_or(|host| host.is_empty() || host.starts_with('/')) {
            r.error(
                span("endpoint"),
                "otel.endpoint",
                "must be the collector's http:// or https:// URL, such as \"http://127.0.0.1:4318\" (the signal's path is added)",
            );
            ok = false;
        }
    }
    let protocol = match protocol.as_deref() {
        None | Some("http/protobuf") => OtelProtocol::Protobuf,
        Some("http/json") => OtelProtocol::Json,
        Some(other) => {
            r.error(
                span("protocol"),
                "otel.protocol",
                format!(
                    "{other:?} is not an OTLP/HTTP encoding: write \"http/protobuf\" (the default) or \"http/json\""
                ),
            );
            ok = false;
            OtelProtocol::Protobuf
        }
    };
    if let Some(Some(ms)) = interval {
        if !(1_000..=3_600_000).contains(&ms) {
            r.error(span("interval"), "otel.interval", "must be between 1s and 1h");
            ok = false;
        }
    }
    let mut headers = BTreeMap::new();
    if let Some(h) = r.table(t, "headers", false) {
        for (name, item) in h.iter() {
            let valid_name = !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b));
            match item.as_str() {
                Some(v) if valid_name && !v.bytes().any(|b| b == b'\r' || b == b'\n') => {
                    headers.insert(name.to_ascii_lowercase(), v.to_owned());
                }
                _ => {
                    r.error(
                        item.span(),
                        &format!("otel.headers.{name}"),
                        "must be a string on one line, under a header name of letters, digits, - and _",
                    );
                    ok = false;
                }
            }
        }
    }
    if let (Some(url), false) = (&endpoint, headers.is_empty()) {
        if let Some(host) = url.strip_prefix("http://").filter(|rest| !on_this_machine(rest)) {
            let host = host.split('/').next().unwrap_or(host);
            r.error(
                t.get("headers").and_then(Item::span).or_else(|| span("endpoint")),
                "otel.headers",
                format!(
                    "would go to {host} over plain http://, readable on the way (a collector's token, say); use an https:// endpoint, or a collector on this machine (http://127.0.0.1:4318)"
                ),
            );
            ok = false;
        }
    }
    let (endpoint, interval) = (endpoint?, interval?);
    ok.then(|| {
        Some(OtelConfig {
            endpoint: endpoint.trim_end_matches('/').to_owned(),
            protocol,
            interval_ms: interval.unwrap_or(60_000),
            service_name,
            headers,
        })
    })
}

/// Whether a URL's rest after `http://` names this machine: `localhost`, an
/// address in 127.0.0.0/8, or `[::1]`.
fn on_this_machine(rest: &str) -> bool {
    let authority = rest.split('/').next().unwrap_or(rest);
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host.starts_with("[::1]") {
        return true;
    }
    let name = host.split(':').next().unwrap_or(host);
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
}

fn read_connection(r: &mut Reader<'_>, t: &Table, name: &str) -> Option<Connection> {
    let section = format!("connections.{name}");
    r.unknown_keys(t, &section, CONNECTION_KEYS);
    let url = r.string(t, &section, "url", true);
    if url.as_deref().is_some_and(|u| u.trim().is_empty()) {
        r.error(t.get("url").and_then(Item::span), &format!("{section}.url"), "must not be empty");
        return None;
    }
    let private = "the URL may be a loopback or private address";
    let allow_private = r.flag(t, "allow_private", &format!("{section}.allow_private"), private);
    let mut ok = allow_private.is_some();
    let allow_private = allow_private.unwrap_or(false);
    let mut headers = BTreeMap::new();
    // Each header: its name, its value when a string, and where it is written.
    type Header<'a> = (&'a str, Option<&'a str>, Option<std::ops::Range<usize>>);
    let header_items: Vec<Header<'_>> = match t.get("headers") {
        None => Vec::new(),
        Some(Item::Table(h)) => h.iter().map(|(k, v)| (k, v.as_str(), v.span())).collect(),
        Some(Item::Value(toml_edit::Value::InlineTable(h))) => {
            h.iter().map(|(k, v)| (k, v.as_str(), v.span())).collect()
        }
        Some(other) => {
            r.error(
                other.span(),
                &format!("{section}.headers"),
                "must be a table of header names to values, e.g. headers = { authorization = \"Bearer ...\" }",
            );
            return None;
        }
    };
    for (header, value, span) in header_items {
        let valid_name = !header.is_empty() && header.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b));
        match value {
            Some(v) if valid_name && !v.bytes().any(|b| b == b'\r' || b == b'\n') => {
                headers.insert(header.to_ascii_lowercase(), v.to_owned());
            }
            _ => {
                r.error(
                    span,
                    &format!("{section}.headers.{header}"),
                    "must be a string on one line, under a header name of letters, digits, - and _",
                );
                ok = false;
            }
        }
    }
    let url = url?;
    ok.then_some(Connection { url, headers, allow_private })
}

fn read_topic(r: &mut Reader<'_>, t: &Table, name: &str) -> Option<TopicConfig> {
    let section = format!("topics.{name}");
    r.unknown_keys(t, &section, TOPIC_KEYS);
    let defaults = TopicConfig::default();
    let partitions = r.whole(t, &section, "partitions", 1, 1024);
    let key = r.string(t, &section, "key", false);
    let retention = r.duration(t, &section, "retention");
    let max_event_bytes = r.whole(t, &section, "max_event_bytes", 1, 64 << 20);
    let max_depth = r.whole(t, &section, "max_depth", 1, MAX_DEPTH as i64);
    let max_fields = r.whole(t, &section, "max_fields", 1, 1 << 40);
    let max_key_bytes = r.whole(t, &section, "max_key_bytes", 1, 1 << 30);
    let pick = |v: Option<i64>, default: usize| v.map_or(default, |v| v as usize);
    Some(TopicConfig {
        max_depth: pick(max_depth?, defaults.max_depth),
        max_fields: pick(max_fields?, defaults.max_fields),
        max_key_bytes: pick(max_key_bytes?, defaults.max_key_bytes),
        partitions: partitions?.map_or(defaults.partitions, |v| v as u32),
        key,
        retention_ms: retention?,
        max_event_bytes: max_event_bytes?.map_or(defaults.max_event_bytes, |v| v as usize),
    })
}

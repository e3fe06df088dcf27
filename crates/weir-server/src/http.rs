//! The HTTP surface of SPEC.md section 7. Lists are JSON lines; errors are
//! `{"error": "..."}` with a status that says whose fault it is.
//!
//! Every endpoint but `/`, `/healthz`, `/readyz` (and `/metrics` with
//! `[auth] public_metrics = true`) needs a bearer token ([`authenticate`]);
//! each handler then checks that the token's role may do what it asks
//! (SECURITY.md has the table). A missing, unknown, expired or revoked
//! token is a 401, a token without the right a 403; both are counted in
//! `weir_http_requests_denied_total`, as are bodies too slow (408) or too
//! large (413) for `body_timeout` and `max_body_bytes`.
//!
//! `POST /v1/topics/{topic}/events` checks the whole body before anything
//! is appended: a line that is not JSON is a 400 naming the line, an event
//! over the topic's `max_event_bytes` a 413 naming the line, one past the
//! topic's `max_depth`, `max_fields` or `max_key_bytes` a 422; blank lines are
//! skipped. It answers after the log has fsynced the events, with the
//! offsets written per partition; a log that cannot write answers 503 with
//! `Retry-After` and appended nothing.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, Query, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Extension;
use axum::Router;
use weir_contract::ServerConfig;
use weir_engine::time::format_rfc3339_ms;
use weir_engine::Reason;
use weir_log::{Log, LogError};

use weir_runtime::{lock, Pipeline};
use weir_store::sqlite as store;
use weir_store::tokens::{self as auth, Grant};

pub struct App {
    pub log: Log,
    pub config: Arc<ServerConfig>,
    pub pipelines: BTreeMap<String, Pipeline>,
    pub db: std::path::PathBuf,
    pub alerts: Mutex<crate::alerts::AlertState>,
    /// From a POST's arrival to its events being durable.
    pub durable: Mutex<weir_runtime::histogram::Histogram>,
    /// The dashboard's charts.
    pub series: Mutex<crate::dashboard::Series>,
    /// `weir.db` through a pool: tokens, the audit log, and the embedded pipelines' rows.
    pub sqlite: Arc<weir_store::SqliteStore>,
    round_robin: AtomicU64,
    /// Producers for the topics Kafka pipelines read.
    pub producers: BTreeMap<String, rdkafka::producer::FutureProducer>,
    /// Refused requests by their metric labels (status and reason or role).
    pub denied: Mutex<BTreeMap<String, u64>>,
    /// Alert notifications dropped because `alert_queue` were waiting.
    pub alerts_dropped: AtomicU64,
}

impl App {
    pub fn new(
        log: Log,
        config: Arc<ServerConfig>,
        pipelines: BTreeMap<String, Pipeline>,
        db: std::path::PathBuf,
        sqlite: Arc<weir_store::SqliteStore>,
    ) -> App {
        App {
            log,
            config,
            pipelines,
            db,
            alerts: Mutex::default(),
            durable: Mutex::default(),
            series: Mutex::default(),
            sqlite,
            round_robin: AtomicU64::new(0),
            producers: BTreeMap::new(),
            denied: Mutex::default(),
            alerts_dropped: AtomicU64::new(0),
        }
    }

    /// Runs `query` on a pooled connection to `weir.db`, off the async threads.
    pub(crate) async fn read<T: Send + 'static>(
        self: &Arc<Self>,
        query: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, ApiError> {
        let sqlite = Arc::clone(&self.sqlite);
        blocking(move || sqlite.with(|c| query(c))).await
    }
}

/// Runs a store call off the async threads; a store error becomes 503 when
/// trying again may help, else 500.
pub(crate) async fn blocking<T: Send + 'static>(
    call: impl FnOnce() -> weir_store::Result<T> + Send + 'static,
) -> Result<T, ApiError> {
    match tokio::task::spawn_blocking(call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) if e.is_transient() => Err(ApiError(StatusCode::SERVICE_UNAVAILABLE, e.to_string())),
        Ok(Err(e)) => Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
        Err(e) => Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("a store call failed: {e}"))),
    }
}

/// Runs `call` on the pipeline's store (SQLite or Postgres), off the async threads.
pub(crate) async fn stored<T: Send + 'static>(
    p: &Pipeline,
    call: impl FnOnce(&dyn weir_store::Store) -> weir_store::Result<T> + Send + 'static,
) -> Result<T, ApiError> {
    let store = Arc::clone(&p.store);
    blocking(move || call(store.as_ref())).await
}

pub fn router(app: Arc<App>) -> Router {
    let body_limit = app.config.max_body_bytes;
    let auth = axum::middleware::from_fn_with_state(Arc::clone(&app), authenticate);
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/v1/tokens", get(list_tokens).post(create_token))
        .route("/v1/tokens/{id}", axum::routing::delete(revoke_token))
        .route("/v1/pipelines/{name}/contract", get(contract))
        .route("/", get(crate::dashboard::page))
        .route("/v1/dashboard", get(crate::dashboard::data))
        .route("/v1/topics/{topic}/events", get(read_events).post(post_events))
        .route("/v1/pipelines", get(list_pipelines))
        .route("/v1/pipelines/{name}/results", get(results))
        .route("/v1/pipelines/{name}/results/{seq}/provenance", get(provenance))
        .route("/v1/pipelines/{name}/changes", get(changes))
        .route("/v1/pipelines/{name}/ledger", get(ledger))
        .route("/v1/pipelines/{name}/status", get(status))
        .route("/v1/pipelines/{name}/pause", axum::routing::post(pause))
        .route("/v1/pipelines/{name}/resume", axum::routing::post(resume))
        .route("/v1/pipelines/{name}/annotations", get(list_annotations).post(annotate))
        .route("/v1/pipelines/{name}/replay", axum::routing::post(replay))
        .route("/v1/audit", get(audit))
        .route("/metrics", get(metrics))
        .layer(axum::extract::DefaultBodyLimit::max(body_limit))
        .layer(axum::middleware::from_fn_with_state(Arc::clone(&app), whole_body))
        .layer(auth)
        .with_state(app)
}

/// The caller of a request: its token's rights and where it came from.
#[derive(Clone)]
pub struct Caller {
    pub grant: Grant,
    /// The client's address, for the audit log.
    pub origin: String,
}

/// Paths that answer without a token: the dashboard's page (it holds no
/// data; its data needs a token), liveness and readiness.
fn public(app: &App, path: &str) -> bool {
    matches!(path, "/" | "/healthz" | "/readyz") || (path == "/metrics" && app.config.public_metrics)
}

impl App {
    fn count_denied(&self, labels: String) {
        *lock(&self.denied).entry(labels).or_insert(0) += 1;
    }
}

/// Reads a request's body whole before its handler runs, within
/// `body_timeout` and `max_body_bytes`: a client that sends its body slowly
/// or stops halfway gets 408 and holds nothing of the server's after.
/// Runs after [`authenticate`], so only a caller with a token is waited for.
async fn whole_body(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let headers = req.headers();
    if !headers.contains_key(header::CONTENT_LENGTH) && !headers.contains_key(header::TRANSFER_ENCODING) {
        return next.run(req).await;
    }
    let limit = app.config.max_body_bytes;
    let too_large = || {
        app.count_denied("status=\"413\",reason=\"body_too_large\"".into());
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is larger than max_body_bytes = {limit}; nothing was appended; send smaller bodies or raise max_body_bytes in weir.toml"),
        )
    };
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return too_large();
    }
    let (parts, body) = req.into_parts();
    let deadline = std::time::Duration::from_millis(app.config.body_timeout_ms as u64);
    match tokio::time::timeout(deadline, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(bytes)) => next.run(Request::from_parts(parts, axum::body::Body::from(bytes))).await,
        Ok(Err(e)) => {
            let source = std::error::Error::source(&e);
            if source.is_some_and(|s| s.is::<http_body_util::LengthLimitError>()) {
                too_large()
            } else {
                error(StatusCode::BAD_REQUEST, format!("the body could not be read: {e}; nothing was appended"))
            }
        }
        Err(_) => {
            app.count_denied("status=\"408\",reason=\"body_timeout\"".into());
            let mut r = error(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the body did not arrive whole within body_timeout = {} ms; nothing was appended; send it faster, or in smaller bodies",
                    app.config.body_timeout_ms
                ),
            );
            r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            r
        }
    }
}

/// Finds the token of every request but the public ones: 401 without a
/// known, live token; otherwise the handler gets a [`Caller`].
async fn authenticate(State(app): State<Arc<App>>, mut req: Request, next: Next) -> Response {
    if public(&app, req.uri().path()) {
        return next.run(req).await;
    }
    let header = req.headers().get(header::AUTHORIZATION).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let origin = req
        .extensions()
        .get::<ConnectInfo<crate::listen::Peer>>()
        .map_or_else(|| "unknown".to_owned(), |c| c.0 .0.to_string());
    let found = app.read(move |c| auth::authenticate(c, header.as_deref(), weir_log::now_ms())).await;
    match found {
        Ok(Ok(grant)) => {
            req.extensions_mut().insert(Caller { grant, origin });
            next.run(req).await
        }
        Ok(Err(why)) => {
            app.count_denied(format!("status=\"401\",reason=\"{}\"", why.reason()));
            let mut r = error(StatusCode::UNAUTHORIZED, why.to_string());
            r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"weir\""));
            r
        }
        Err(e) => e.into_response(),
    }
}

/// A 403 naming what was refused and what the token may do; counted.
pub(crate) fn forbidden(app: &App, caller: &Caller, what: &str) -> ApiError {
    let g = &caller.grant;
    app.count_denied(format!("status=\"403\",role=\"{}\"", g.role));
    ApiError(
        StatusCode::FORBIDDEN,
        format!("token {} ({}) may not {what}; {}; ask an admin for a token that may", g.id, g.role, g.rights()),
    )
}

async fn healthz() -> Response {
    json(serde_json::json!({ "ok": true }))
}

/// Ready: the log accepts writes and no pipeline is failing.
async fn readyz(State(app): State<Arc<App>>) -> Response {
    let mut not_ready = Vec::new();
    if let Some(why) = app.log.unhealthy() {
        not_ready.push(format!("the log cannot write: {why}"));
    }
    for (name, p) in &app.pipelines {
        if let Some(f) = &lock(&p.status).failed {
            not_ready.push(format!("pipeline {name} is failing: {f}"));
        }
    }
    if not_ready.is_empty() {
        return json(serde_json::json!({ "ready": true }));
    }
    let body = serde_json::json!({ "ready": false, "why": not_ready }).to_string() + "\n";
    (StatusCode::SERVICE_UNAVAILABLE, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// Appends to the audit log; `who` is the caller's token.
async fn audited(
    app: &Arc<App>,
    caller: &Caller,
    action: &'static str,
    pipeline: Option<String>,
    detail: serde_json::Value,
    why: String,
) -> Result<i64, ApiError> {
    let (who, origin) = (caller.grant.who(), caller.origin.clone());
    app.read(move |c| {
        let entry = weir_store::audit::Entry {
            who: &who,
            action,
            pipeline: pipeline.as_deref(),
            detail: &detail,
            why: &why,
            origin: &origin,
        };
        weir_store::audit::append(c, &entry)
    })
    .await
}

async fn list_tokens(State(app): State<Arc<App>>, Extension(caller): Extension<Caller>) -> Result<Response, ApiError> {
    if !caller.grant.is_admin() {
        return Err(forbidden(&app, &caller, "list tokens"));
    }
    let tokens = app.read(auth::list).await?;
    Ok(joined(tokens.iter().map(|g| g.json().to_string()).collect()))
}

#[derive(serde::Deserialize)]
struct NewTokenBody {
    role: String,
    name: String,
    #[serde(default)]
    topics: Vec<String>,
    #[serde(default)]
    pipelines: Vec<String>,
    expires: Option<String>,
    why: Option<String>,
}

async fn create_token(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    body: Bytes,
) -> Result<Response, ApiError> {
    if !caller.grant.is_admin() {
        return Err(forbidden(&app, &caller, "make tokens"));
    }
    let usage = "the body must be JSON like {\"role\":\"reader\",\"name\":\"alice\",\"pipelines\":[\"paid\"],\"expires\":\"30d\",\"why\":\"...\"}";
    let b: NewTokenBody = serde_json::from_slice(&body).map_err(|e| bad(format!("{usage}: {e}")))?;
    let all: Vec<&str> = auth::Role::ALL.iter().map(|r| r.as_str()).collect();
    let role = auth::Role::parse(&b.role).ok_or_else(|| bad(format!("role {:?} is not one of {all:?}", b.role)))?;
    let expires_in_ms = match &b.expires {
        None => None,
        Some(e) => Some(weir_contract::parse_duration_ms(e).map_err(|why| bad(format!("expires {e:?}: {why}")))?),
    };
    let new = auth::NewToken { role, name: b.name, topics: b.topics, pipelines: b.pipelines, expires_in_ms };
    new.check().map_err(bad)?;
    let (who, origin) = (caller.grant.who(), caller.origin.clone());
    let why = b.why.unwrap_or_default();
    let made = app.read(move |c| Ok(auth::create_audited(c, &new, &who, &origin, &why))).await?;
    let (token, grant) = made.map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")))?;
    let mut v = grant.json();
    v["token"] = token.into();
    Ok(json(v))
}

async fn revoke_token(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Result<Response, ApiError> {
    if !caller.grant.is_admin() {
        return Err(forbidden(&app, &caller, "revoke tokens"));
    }
    let (who, origin) = (caller.grant.who(), caller.origin.clone());
    let why = q.get("why").cloned().unwrap_or_default();
    let i = id.clone();
    let revoked = app.read(move |c| Ok(auth::revoke_audited(c, &i, &who, &origin, &why))).await?;
    match revoked.map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")))? {
        Some(g) => Ok(json(g.json())),
        None => Err(ApiError(StatusCode::NOT_FOUND, format!("no token {id:?}; GET /v1/tokens lists them"))),
    }
}

/// The contract weir runs for a pipeline: its identity and who answers for it.
async fn contract(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let p = may_read(&app, &caller, &name)?;
    let c = &p.contract;
    let body = serde_json::json!({
        "pipeline": name,
        "version": c.pipeline.version,
        "text_hash": format!("{:016x}", c.text_hash),
        "owner": c.pipeline.owner,
        "steward": c.pipeline.steward,
        "decision": c.pipeline.decision,
        "topic": c.source.topic,
        "key": c.source.key.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "event_time": c.source.event_time.to_string(),
    });
    Ok(json(body))
}

/// The pipeline, when the caller may read its published data.
fn may_read<'a>(app: &'a App, caller: &Caller, name: &str) -> Result<&'a Pipeline, ApiError> {
    let p = pipeline(app, name)?;
    if caller.grant.may_read(name) {
        Ok(p)
    } else {
        Err(forbidden(app, caller, &format!("read pipeline {name:?}")))
    }
}

/// A refusal: its status and what to do about it.
pub struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        error(self.0, self.1)
    }
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, message.into())
}

fn error(code: StatusCode, message: impl Into<String>) -> Response {
    let body = serde_json::json!({ "error": message.into() }).to_string() + "\n";
    (code, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn lines(body: String) -> Response {
    ([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response()
}

fn json(value: serde_json::Value) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], value.to_string() + "\n").into_response()
}

async fn post_events(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(topic): Path<String>,
    body: Bytes,
) -> Response {
    if !caller.grant.may_produce(&topic) {
        return forbidden(&app, &caller, &format!("append to topic {topic:?}")).into_response();
    }
    let kafka = app.producers.get(&topic).cloned();
    let partitions = match app.log.partitions(&topic) {
        Ok(n) => n,
        Err(_) if kafka.is_some() => 1,
        Err(_) => {
            return error(
                StatusCode::NOT_FOUND,
                format!("no topic {topic:?}: topics are the ones a contract reads or weir.toml names"),
            )
        }
    };
    let tc = app.config.topic(&topic);
    let limits = weir_engine::intake::Limits {
        max_event_bytes: tc.max_event_bytes,
        max_depth: tc.max_depth,
        max_fields: tc.max_fields,
        max_key_bytes: tc.max_key_bytes,
    };
    let events = match weir_engine::intake::parse_body(&body, tc.key.as_deref(), &limits) {
        Ok(events) => events,
        Err(weir_engine::intake::BodyError::TooLong { line, bytes }) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "line {line} is {bytes} bytes, over max_event_bytes = {} for topic {topic:?}; nothing was appended; split the event or raise [topics.{topic}] max_event_bytes in weir.toml",
                    tc.max_event_bytes
                ),
            )
        }
        Err(weir_engine::intake::BodyError::NotUtf8 { line }) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("line {line} is not UTF-8 text; nothing was appended; send JSON lines encoded as UTF-8"),
            )
        }
        Err(weir_engine::intake::BodyError::NotJson { line, why }) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("line {line} is not JSON ({why}); nothing was appended; send one JSON value per line"),
            )
        }
        Err(weir_engine::intake::BodyError::OverLimit { line, why }) => {
            return error(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!(
                    "line {line} is refused: {why}; nothing was appended; simplify the event or raise the limit in [topics.{topic}] in weir.toml"
                ),
            )
        }
    };
    if events.len() > app.config.max_events_per_request {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the body has {} events, over max_events_per_request = {} in weir.toml; nothing was appended; send them in smaller requests",
                events.len(),
                app.config.max_events_per_request
            ),
        );
    }
    let mut keys = Vec::with_capacity(events.len());
    let mut records = Vec::with_capacity(events.len());
    for (key, line) in events {
        let partition = match &key {
            Some(k) => (xxhash_rust::xxh3::xxh3_64(k.as_bytes()) % u64::from(partitions)) as u32,
            None => (app.round_robin.fetch_add(1, Ordering::Relaxed) % u64::from(partitions)) as u32,
        };
        records.push((partition, line.to_vec()));
        keys.push(key);
    }
    if records.is_empty() {
        return error(StatusCode::BAD_REQUEST, "the body has no events: send one JSON value per line");
    }
    let count = records.len();
    let arrived = std::time::Instant::now();
    let answer = match kafka {
        Some(producer) => match weir_runtime::kafka::produce(&producer, &topic, &records, &keys).await {
            Ok(offsets) => Ok(offsets),
            Err(e) => {
                let mut r = error(StatusCode::SERVICE_UNAVAILABLE, e);
                r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                return r;
            }
        },
        None => match app.log.append(&topic, records) {
            Ok(pending) => pending.wait().await,
            Err(e) => Err(e),
        },
    };
    if answer.is_ok() {
        lock(&app.durable).observe(arrived.elapsed().as_secs_f64());
    }
    match answer {
        Ok(offsets) => {
            let mut ranges: BTreeMap<u32, (u64, u64, u64)> = BTreeMap::new();
            for (p, o) in offsets {
                let r = ranges.entry(p).or_insert((o, o, 0));
                r.0 = r.0.min(o);
                r.1 = r.1.max(o);
                r.2 += 1;
            }
            let parts: Vec<_> = ranges
                .into_iter()
                .map(|(p, (first, last, n))| serde_json::json!({"partition": p, "first": first, "last": last, "count": n}))
                .collect();
            json(serde_json::json!({ "accepted": count, "partitions": parts }))
        }
        Err(LogError::Unavailable(why)) => {
            let mut r = error(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the log cannot write now ({why}); nothing was acknowledged; send again later"),
            );
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            r
        }
        Err(e @ LogError::Busy { .. }) => {
            let mut r = error(StatusCode::SERVICE_UNAVAILABLE, e.to_string());
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            r
        }
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

fn param<T: std::str::FromStr>(q: &BTreeMap<String, String>, name: &str, default: T) -> Result<T, ApiError> {
    match q.get(name) {
        None => Ok(default),
        Some(v) => v.parse().map_err(|_| bad(format!("query parameter {name}={v:?} is not a valid value"))),
    }
}

/// Raw events: raw-reader tokens only, and every read is in the audit log
/// (`?why=` says why; it is kept).
async fn read_events(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(topic): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Result<Response, ApiError> {
    if !caller.grant.may_read_raw(&topic) {
        return Err(forbidden(&app, &caller, &format!("read the events of topic {topic:?}")));
    }
    if app.producers.contains_key(&topic) {
        // The topic's events are in Kafka, not in this server's log: an empty answer would be a lie.
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!("topic {topic:?} is on Kafka, not on weir's embedded log; read its events with Kafka's tools"),
        ));
    }
    let partition = param(&q, "partition", 0u32)?;
    let from = param(&q, "from", 0u64)?;
    let limit = param(&q, "limit", 1000usize)?.min(100_000);
    let log = app.log.clone();
    let t = topic.clone();
    let read = tokio::task::spawn_blocking(move || log.read(&t, partition, from, limit, 64 << 20)).await;
    let records = match read {
        Ok(Ok(records)) => records,
        Ok(Err(e @ (LogError::NoTopic(_) | LogError::NoPartition { .. }))) => {
            return Err(ApiError(StatusCode::NOT_FOUND, e.to_string()))
        }
        Ok(Err(e)) => return Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
        Err(e) => return Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
    };
    let detail = serde_json::json!({
        "topic": topic, "partition": partition, "from": from, "limit": limit, "returned": records.len(),
    });
    audited(&app, &caller, "raw-read", None, detail, why_of(&q)).await?;
    let mut body = String::new();
    for r in records {
        body.push_str(&format!(
            "{{\"partition\":{},\"offset\":{},\"append_time\":\"{}\",\"event\":",
            r.partition,
            r.offset,
            format_rfc3339_ms(r.append_ms)
        ));
        body.push_str(&String::from_utf8_lossy(&r.payload));
        body.push_str("}\n");
    }
    Ok(lines(body))
}

/// The pipelines the caller may read (a raw-reader: those reading its topics).
async fn list_pipelines(State(app): State<Arc<App>>, Extension(caller): Extension<Caller>) -> Response {
    let g = &caller.grant;
    if g.role == auth::Role::Producer {
        return forbidden(&app, &caller, "list pipelines").into_response();
    }
    let mut body = String::new();
    for (name, p) in &app.pipelines {
        let c = &p.contract;
        if !g.may_read(name) && !g.may_read_raw(&c.source.topic) {
            continue;
        }
        body.push_str(
            &(serde_json::json!({
                "name": name,
                "version": c.pipeline.version,
                "owner": c.pipeline.owner,
                "steward": c.pipeline.steward,
                "decision": c.pipeline.decision,
                "topic": c.source.topic,
            })
            .to_string()
                + "\n"),
        );
    }
    lines(body)
}

fn pipeline<'a>(app: &'a App, name: &str) -> Result<&'a Pipeline, ApiError> {
    app.pipelines.get(name).ok_or_else(|| {
        let known: Vec<&String> = app.pipelines.keys().collect();
        ApiError(StatusCode::NOT_FOUND, format!("no pipeline {name:?}; the pipelines are {known:?}"))
    })
}

fn joined(rows: Vec<String>) -> Response {
    let mut body = rows.join("\n");
    if !body.is_empty() {
        body.push('\n');
    }
    lines(body)
}

async fn results(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Result<Response, ApiError> {
    let p = may_read(&app, &caller, &name)?;
    let time = |k: &str| -> Result<Option<i64>, ApiError> {
        let Some(v) = q.get(k) else { return Ok(None) };
        match weir_engine::time::parse_rfc3339_ms(v) {
            Some(ms) => Ok(Some(ms)),
            None => Err(bad(format!("{k}={v:?} is not an RFC 3339 time such as 2026-11-29T14:00:00Z"))),
        }
    };
    let filter = store::ResultFilter {
        status: q.get("status").cloned(),
        from_ms: time("from")?,
        to_ms: time("to")?,
        key: q.iter().filter_map(|(k, v)| Some((k.strip_prefix("key.")?.to_owned(), v.clone()))).collect(),
        limit: param(&q, "limit", 10_000i64)?,
    };
    Ok(joined(stored(p, move |s| s.results(&name, &filter)).await?))
}

/// `{seq}` is the row's place in the change stream, as `/results` and
/// `/changes` show it: one revision of one window.
async fn provenance(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path((name, seq)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let p = may_read(&app, &caller, &name)?;
    let contract = p.contract.clone();
    let Ok(seq) = seq.parse::<i64>() else {
        return Err(bad(format!("{seq:?} is not a row: use the \"seq\" of a row from /results or /changes")));
    };
    let pn = name.clone();
    let origin = stored(p, move |s| s.row_origin(&pn, seq)).await?;
    let Some(origin) = origin else {
        return Err(ApiError(StatusCode::NOT_FOUND, format!("pipeline {name:?} has published no row with seq {seq}")));
    };
    let body = crate::provenance::document(&contract, seq, &origin).to_string() + "\n";
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

async fn changes(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Result<Response, ApiError> {
    let p = may_read(&app, &caller, &name)?;
    let since = param(&q, "since", 1i64)?;
    let limit = param(&q, "limit", 10_000i64)?;
    Ok(joined(stored(p, move |s| s.changes(&name, since, limit)).await?))
}

/// The ledger: with payloads for a raw-reader of the pipeline's topic (the
/// read is audited), without them for the pipeline's readers.
async fn ledger(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Result<Response, ApiError> {
    let p = pipeline(&app, &name)?;
    let raw = caller.grant.may_read_raw(&p.contract.source.topic);
    if !raw && !caller.grant.may_read(&name) {
        return Err(forbidden(&app, &caller, &format!("read the ledger of pipeline {name:?}")));
    }
    let reason = q.get("reason").cloned();
    if let Some(r) = &reason {
        if !Reason::ALL.iter().any(|x| x.as_str() == r) {
            let all: Vec<&str> = Reason::ALL.iter().map(|x| x.as_str()).collect();
            return Err(bad(format!("reason={r:?} is not a ledger reason; use one of {all:?}")));
        }
    }
    let since = param(&q, "since", 1i64)?;
    let limit = param(&q, "limit", 10_000i64)?;
    let n = name.clone();
    let entries = stored(p, move |s| s.ledger(&n, reason.as_deref(), since, limit)).await?;
    if raw {
        let detail = serde_json::json!({ "ledger": name, "since": since, "limit": limit, "returned": entries.len() });
        audited(&app, &caller, "raw-read", Some(name), detail, why_of(&q)).await?;
        return Ok(joined(entries));
    }
    let published: Vec<String> = entries
        .iter()
        .filter_map(|e| serde_json::from_str(e).ok())
        .map(|v| weir_runtime::privacy::published(v, &p.contract).to_string())
        .collect();
    Ok(joined(published))
}

fn why_of(q: &BTreeMap<String, String>) -> String {
    q.get("why").cloned().unwrap_or_else(|| "(not given: add ?why=...)".into())
}

/// Lag and ages of one pipeline, computed now.
pub fn status_json(app: &App, name: &str, p: &Pipeline) -> serde_json::Value {
    let s = lock(&p.status).clone();
    let now = weir_log::now_ms();
    let topic = &p.contract.source.topic;
    let bounds = if s.kafka.is_some() { Vec::new() } else { app.log.bounds(topic).unwrap_or_default() };
    let mut parts = Vec::new();
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
        parts.push(serde_json::json!({
            "partition": k.partition, "next_offset": k.next_offset, "end_offset": k.end_offset, "lag": behind,
            "generation": k.generation,
            "watermark": k.watermark.map(format_rfc3339_ms),
            "watermark_age_ms": k.watermark.map(|w| now.saturating_sub(w)),
        }));
    }
    let append_ms = |p: usize, offset: u64| {
        app.log.read(topic, p as u32, offset, 1, 1).ok().and_then(|r| r.first().map(|r| r.append_ms))
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
        parts.push(serde_json::json!({
            "partition": i, "next_offset": next, "end_offset": end, "lag": behind,
            "idle": s.idle.get(i).copied().unwrap_or(false),
            "watermark": watermark.map(format_rfc3339_ms),
            "watermark_age_ms": watermark.map(|w| now.saturating_sub(w)),
        }));
    }
    let c = &s.counters;
    let ledger: serde_json::Map<String, serde_json::Value> =
        Reason::ALL.iter().map(|r| (r.as_str().to_owned(), c.ledger[r.index()].into())).collect();
    serde_json::json!({
        "pipeline": name,
        "version": p.contract.pipeline.version,
        "watermark": s.watermark.map(format_rfc3339_ms),
        "watermark_age_ms": s.watermark.map(|w| now.saturating_sub(w)),
        "lag_records": lag,
        "lag_ms": lag_ms,
        "oldest_unprocessed_age_ms": oldest.map_or(0, |t| now.saturating_sub(t).max(0)),
        "partitions": parts,
        "events": {"read": c.read, "counted": c.counted, "filtered": c.filtered, "late_allowed": c.late_allowed},
        "ledger": ledger,
        "rows": {"provisional": c.rows_provisional, "settled": c.rows_settled, "retracted": c.rows_retracted},
        "open_windows": s.open_windows,
        "state_bytes": s.state_bytes,
        "last_checkpoint": (s.last_checkpoint_ms > 0).then(|| format_rfc3339_ms(s.last_checkpoint_ms)),
        "checkpoint_age_ms": (s.last_checkpoint_ms > 0).then(|| now.saturating_sub(s.last_checkpoint_ms)),
        "failed": s.failed,
        "paused": p.paused.load(Ordering::SeqCst),
        "replays": s.replays,
        "restarts": s.restarts,
        "offsets_not_delivered": s.offsets_not_delivered,
        "checkpoints_fenced": s.checkpoints_fenced,
        "alerts": lock(&app.alerts).firing.get(name).map_or_else(Vec::new, |f| f.iter().map(|f| serde_json::json!({
            "alert": f.alert, "threshold": f.threshold, "observed": f.observed, "since": format_rfc3339_ms(f.since_ms),
        })).collect()),
    })
}

async fn status(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let p = may_read(&app, &caller, &name)?;
    Ok(json(status_json(&app, &name, p)))
}

/// Prometheus text: per pipeline and partition, what `status` shows.
/// Attribute names follow the OpenTelemetry messaging conventions, with dots
/// as underscores (Prometheus' own translation).
async fn metrics(State(app): State<Arc<App>>, caller: Option<Extension<Caller>>) -> Response {
    if let Some(Extension(caller)) = &caller {
        if !matches!(caller.grant.role, auth::Role::Reader | auth::Role::Operator | auth::Role::Admin) {
            return forbidden(&app, caller, "read /metrics").into_response();
        }
    }
    let mut m = Metrics::default();
    for (labels, n) in lock(&app.denied).iter() {
        m.counter(
            "weir_http_requests_denied_total",
            "Requests refused: 401 without a known, live token (by reason), 403 without the right (by role), 408 for a body too slow, 413 for a body too large.",
            labels,
            *n,
        );
    }
    let log = app.log.stats();
    m.counter("weir_log_records_appended_total", "Records appended and acknowledged by the log.", "", log.records);
    m.counter("weir_log_group_commits_total", "Group commits (one fsync per touched partition each).", "", log.commits);
    m.counter("weir_log_appends_refused_total", "Appends refused because a write or fsync failed.", "", log.refused);
    m.counter(
        "weir_alert_notifications_dropped_total",
        "Alert notifications dropped because alert_queue notifications were waiting for the webhook.",
        "",
        app.alerts_dropped.load(Ordering::Relaxed),
    );
    m.counter(
        "weir_log_appends_busy_total",
        "Appends refused with 503 because the log writer's queue held log_queue_bytes.",
        "",
        log.busy,
    );
    m.gauge("weir_log_healthy", "1 while the log accepts writes.", "", i64::from(app.log.unhealthy().is_none()));
    let durable = lock(&app.durable).clone();
    m.histogram("weir_ingest_durable_latency_seconds", "From a POST's arrival to its events fsynced.", "", &durable);
    for (name, p) in &app.pipelines {
        let s = status_json(&app, name, p);
        let topic = &p.contract.source.topic;
        let base = format!("pipeline=\"{name}\",messaging_destination_name=\"{topic}\"");
        for (what, help) in [
            ("read", "Events read from the log."),
            ("counted", "Events counted in a window."),
            ("filtered", "Events a where rule left out."),
            ("late_allowed", "Events counted in a window the watermark had passed."),
        ] {
            m.counter(&format!("weir_events_{what}_total"), help, &base, s["events"][what].as_u64().unwrap_or(0));
        }
        for r in Reason::ALL {
            let labels = format!("{base},reason=\"{}\"", r.as_str());
            m.counter(
                "weir_ledger_entries_total",
                "Events that did not count, by reason (the dead-letter volume).",
                &labels,
                s["ledger"][r.as_str()].as_u64().unwrap_or(0),
            );
        }
        for status in ["provisional", "settled", "retracted"] {
            let labels = format!("{base},status=\"{status}\"");
            m.counter(
                "weir_rows_emitted_total",
                "Rows emitted, by status.",
                &labels,
                s["rows"][status].as_u64().unwrap_or(0),
            );
        }
        m.gauge(
            "weir_consumer_lag_records",
            "Records in the log not yet read.",
            &base,
            s["lag_records"].as_i64().unwrap_or(0),
        );
        m.counter(
            "weir_duplicates_suppressed_total",
            "Events not counted because their id was seen before (duplicate and duplicate_conflict).",
            &base,
            ["duplicate", "duplicate_conflict"].iter().map(|r| s["ledger"][r].as_u64().unwrap_or(0)).sum(),
        );
        m.gauge(
            "weir_consumer_lag_ms",
            "Log time between the oldest record not yet read and the newest record (largest over partitions).",
            &base,
            s["lag_ms"].as_i64().unwrap_or(0),
        );
        m.gauge(
            "weir_oldest_unprocessed_age_ms",
            "Age of the oldest unprocessed event, in milliseconds.",
            &base,
            s["oldest_unprocessed_age_ms"].as_i64().unwrap_or(0),
        );
        if let Some(w) = lock(&p.status).watermark {
            m.gauge("weir_watermark_ms", "The watermark, in milliseconds since the Unix epoch.", &base, w);
        }
        if let Some(age) = s["watermark_age_ms"].as_i64() {
            m.gauge("weir_watermark_age_ms", "Now minus the watermark, in milliseconds.", &base, age);
        }
        m.gauge("weir_open_windows", "Windows open in the engine.", &base, s["open_windows"].as_i64().unwrap_or(0));
        m.gauge(
            "weir_state_bytes",
            "About how many bytes the engine's state holds.",
            &base,
            s["state_bytes"].as_i64().unwrap_or(0),
        );
        let (processing, checkpoint) = {
            let st = lock(&p.status);
            (st.processing.clone(), st.checkpoint_duration.clone())
        };
        m.histogram(
            "weir_processing_latency_seconds",
            "From an event's append to the log to its processing.",
            &base,
            &processing,
        );
        m.histogram("weir_checkpoint_duration_seconds", "How long a checkpoint took.", &base, &checkpoint);
        m.counter("weir_replays_total", "Replays since the server started.", &base, s["replays"].as_u64().unwrap_or(0));
        m.counter(
            "weir_pipeline_restarts_total",
            "Restarts from the last checkpoint after a failure, since the server started.",
            &base,
            s["restarts"].as_u64().unwrap_or(0),
        );
        m.counter(
            "weir_kafka_offsets_not_delivered_total",
            "Kafka offsets skipped between two records the broker delivered (retention, compaction, transaction markers or a broker fault).",
            &base,
            s["offsets_not_delivered"].as_u64().unwrap_or(0),
        );
        m.counter(
            "weir_checkpoints_fenced_total",
            "Checkpoints refused by the Postgres fence: another worker had taken the partition over, so this one's work was dropped.",
            &base,
            s["checkpoints_fenced"].as_u64().unwrap_or(0),
        );
        m.gauge(
            "weir_pipeline_failing",
            "1 while the pipeline's last attempt failed and no checkpoint has succeeded since.",
            &base,
            i64::from(!s["failed"].is_null()),
        );
        m.gauge(
            "weir_pipeline_paused",
            "1 while an operator has paused publishing.",
            &base,
            i64::from(s["paused"] == true),
        );
        if let Some(age) = s["checkpoint_age_ms"].as_i64() {
            m.gauge("weir_checkpoint_age_ms", "Milliseconds since the last checkpoint.", &base, age);
        }
        if let Some(parts) = s["partitions"].as_array() {
            for part in parts {
                let labels = format!("{base},messaging_destination_partition_id=\"{}\"", part["partition"]);
                m.gauge(
                    "weir_partition_lag_records",
                    "Records in the partition not yet read.",
                    &labels,
                    part["lag"].as_i64().unwrap_or(0),
                );
                if let Some(age) = part["watermark_age_ms"].as_i64() {
                    m.gauge(
                        "weir_partition_watermark_age_ms",
                        "Now minus the partition's watermark, in milliseconds.",
                        &labels,
                        age,
                    );
                }
            }
        }
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], m.text()).into_response()
}

#[derive(Default)]
struct Metrics {
    described: std::collections::BTreeSet<String>,
    families: BTreeMap<String, Vec<String>>,
}

impl Metrics {
    fn add(&mut self, name: &str, kind: &str, help: &str, labels: &str, value: String) {
        let family = self.families.entry(name.to_owned()).or_default();
        if self.described.insert(name.to_owned()) {
            family.push(format!("# HELP {name} {help}\n# TYPE {name} {kind}"));
        }
        family.push(if labels.is_empty() { format!("{name} {value}") } else { format!("{name}{{{labels}}} {value}") });
    }

    fn counter(&mut self, name: &str, help: &str, labels: &str, value: u64) {
        self.add(name, "counter", help, labels, value.to_string());
    }

    fn gauge(&mut self, name: &str, help: &str, labels: &str, value: i64) {
        self.add(name, "gauge", help, labels, value.to_string());
    }

    fn histogram(&mut self, name: &str, help: &str, labels: &str, h: &weir_runtime::histogram::Histogram) {
        let family = self.families.entry(name.to_owned()).or_default();
        if self.described.insert(name.to_owned()) {
            family.push(format!("# HELP {name} {help}\n# TYPE {name} histogram"));
        }
        family.extend(h.lines(name, labels));
    }

    fn text(&self) -> String {
        let mut out = String::new();
        for lines in self.families.values() {
            for l in lines {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }
}

/// Why an operator acts (required; the audit log keeps it), and on whose
/// behalf when the body names someone besides the token's holder.
#[derive(serde::Deserialize)]
struct Action {
    who: Option<String>,
    why: Option<String>,
}

fn why_and_for_whom(body: &Bytes) -> Result<(String, Option<String>), ApiError> {
    let a: Action = serde_json::from_slice(body)
        .map_err(|e| bad(format!("the body must be JSON like {{\"why\":\"...\"}}: {e}")))?;
    match a.why.filter(|w| !w.trim().is_empty()) {
        Some(why) => Ok((why, a.who.filter(|w| !w.trim().is_empty()))),
        None => Err(bad("say why: {\"why\":\"...\"} (it is kept in the audit log with the token that acted)")),
    }
}

/// The pipeline, when the caller may operate it.
fn may_operate<'a>(app: &'a App, caller: &Caller, name: &str, what: &str) -> Result<&'a Pipeline, ApiError> {
    let p = pipeline(app, name)?;
    if caller.grant.may_operate(name) {
        Ok(p)
    } else {
        Err(forbidden(app, caller, &format!("{what} pipeline {name:?}")))
    }
}

async fn set_paused(
    app: Arc<App>,
    caller: Caller,
    name: String,
    body: Bytes,
    pause: bool,
) -> Result<Response, ApiError> {
    let action = if pause { "pause" } else { "resume" };
    let p = may_operate(&app, &caller, &name, action)?;
    let (why, for_whom) = why_and_for_whom(&body)?;
    // The pause is a row in the pipeline's store, read by every checkpoint of every worker.
    let pn = name.clone();
    // Both answer whether it was paused before.
    let was_paused = stored(p, move |s| if pause { s.pause(&pn) } else { s.resume(&pn) }).await?;
    p.paused.store(pause, Ordering::SeqCst);
    let detail = serde_json::json!({ "was_paused": was_paused, "for": for_whom });
    let seq = audited(&app, &caller, action, Some(name.clone()), detail, why).await?;
    Ok(json(serde_json::json!({ "pipeline": name, "paused": pause, "was_paused": was_paused, "audit": seq })))
}

async fn pause(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    set_paused(app, caller, name, body, true).await
}

async fn resume(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    set_paused(app, caller, name, body, false).await
}

/// The audit log: admin tokens only.
async fn audit(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Result<Response, ApiError> {
    if !caller.grant.is_admin() {
        return Err(forbidden(&app, &caller, "read the audit log"));
    }
    let since = param(&q, "since", 1i64)?;
    let limit = param(&q, "limit", 10_000i64)?;
    Ok(joined(app.read(move |c| weir_store::audit::log(c, since, limit)).await?))
}

#[derive(serde::Deserialize)]
struct NewAnnotation {
    who: Option<String>,
    from: Option<String>,
    to: Option<String>,
    note: Option<String>,
}

async fn annotate(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let p = may_operate(&app, &caller, &name, "annotate")?;
    let usage = "the body must be JSON like {\"from\":\"2026-11-29T14:00:00Z\",\"to\":\"2026-11-29T15:00:00Z\",\"note\":\"...\"}";
    let a: NewAnnotation = serde_json::from_slice(&body).map_err(|e| bad(format!("{usage}: {e}")))?;
    let time = |v: &Option<String>, k: &str| {
        v.as_deref()
            .and_then(weir_engine::time::parse_rfc3339_ms)
            .ok_or_else(|| bad(format!("`{k}` must be an RFC 3339 time; {usage}")))
    };
    let (from_ms, to_ms) = (time(&a.from, "from")?, time(&a.to, "to")?);
    if from_ms >= to_ms {
        return Err(bad("`from` must be before `to`"));
    }
    let Some(note) = a.note.filter(|n| !n.trim().is_empty()) else {
        return Err(bad(format!("say what the note is: {usage}")));
    };
    // The annotation names the token's holder (and whom it was for, if the body says).
    let who = match a.who.filter(|w| !w.trim().is_empty()) {
        Some(w) => format!("{w} via {}", caller.grant.who()),
        None => caller.grant.who(),
    };
    let (pn, n, w, origin, actor) = (name.clone(), note.clone(), who, caller.origin.clone(), caller.grant.who());
    // The note is kept beside the rows it marks (Postgres for a pipeline on Kafka); the audit entry in weir.db.
    let id = {
        let (pn, n, w) = (pn.clone(), n.clone(), w.clone());
        stored(p, move |s| s.add_annotation(&pn, (from_ms, to_ms), &n, &w)).await?
    };
    app.read(move |c| {
            let detail = serde_json::json!({ "annotation": id, "from": format_rfc3339_ms(from_ms), "to": format_rfc3339_ms(to_ms), "for": w });
            let entry = weir_store::audit::Entry {
                who: &actor,
                action: "annotate",
                pipeline: Some(&pn),
                detail: &detail,
                why: &n,
                origin: &origin,
            };
            weir_store::audit::append(c, &entry)
        })
        .await?;
    Ok(json(serde_json::json!({ "pipeline": name, "annotation": id })))
}

async fn list_annotations(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let p = may_read(&app, &caller, &name)?;
    let notes = stored(p, move |s| s.annotations(&name)).await?;
    let rows = notes
        .iter()
        .map(|a| {
            serde_json::json!({
                "id": a.id, "from": format_rfc3339_ms(a.from_ms), "to": format_rfc3339_ms(a.to_ms),
                "note": a.note, "who": a.who, "at": format_rfc3339_ms(a.at_ms),
            })
            .to_string()
        })
        .collect();
    Ok(joined(rows))
}

#[derive(serde::Deserialize)]
struct ReplayBody {
    from_offset: Option<u64>,
    from_time: Option<String>,
}

/// Rebuilds a pipeline's state from the log; rows are republished with
/// revisions above every one published before (with `from_time`, only those
/// of windows ending after it).
async fn replay(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let p = may_operate(&app, &caller, &name, "replay")?;
    let (why, for_whom) = why_and_for_whom(&body)?;
    let r: ReplayBody = serde_json::from_slice(&body)
        .map_err(|e| bad(format!("from_offset must be a whole number, from_time an RFC 3339 time: {e}")))?;
    let from_time = match &r.from_time {
        None => None,
        Some(t) => Some(
            weir_engine::time::parse_rfc3339_ms(t)
                .ok_or_else(|| bad(format!("from_time={t:?} is not an RFC 3339 time such as 2026-11-29T14:00:00Z")))?,
        ),
    };
    // A request in the pipeline's store: every worker applies it to the partitions it holds.
    let asked = weir_store::Replay { from_offset: r.from_offset, from_time };
    let pn = name.clone();
    let id = stored(p, move |s| s.ask_replay(&pn, asked)).await?;
    let detail = serde_json::json!({
        "replay": id, "from_offset": r.from_offset.unwrap_or(0), "from_time": r.from_time, "for": for_whom
    });
    let seq = audited(&app, &caller, "replay", Some(name.clone()), detail, why).await?;
    let body = serde_json::json!({ "pipeline": name, "replay": "started", "id": id, "audit": seq }).to_string() + "\n";
    Ok((StatusCode::ACCEPTED, [(header::CONTENT_TYPE, "application/json")], body).into_response())
}

//! What every handler shares: the server's state ([`App`]), the caller of a
//! request ([`Caller`]), refusals ([`ApiError`], [`forbidden`]), the store
//! calls run off the async threads ([`stored`], [`App::on_weir_db`]), the audit
//! log, and the small response helpers.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use weir_runtime::{lock, Pipeline};
use weir_store::tokens::Grant;

use weir_ops::Ops;

/// The server's state. The operations' part ([`Ops`]: the log, the
/// config, the pipelines, `weir.db`, what the alert loop watches, the
/// webhooks, versions, owners' notes, the data folder, `closing`) is shared
/// with `weir-ops` and read through `App` as if it were its own (`Deref`).
pub struct App {
    pub ops: Arc<Ops>,
    /// From a POST's arrival to its events being durable.
    pub durable: Mutex<weir_runtime::histogram::Histogram>,
    /// `weir.db` through a pool of its own for token checks, so readers
    /// that hold every connection of `sqlite` never stall producers' tokens.
    pub auth: Arc<weir_store::SqliteStore>,
    pub(crate) round_robin: AtomicU64,
    /// Where requests other than a producer's wait their turn (see `http::gate`).
    pub(crate) gates: Gates,
    /// `(topic, Idempotency-Key)` of the POSTs being done now.
    pub(crate) in_flight: Mutex<std::collections::HashSet<(String, String)>>,
    /// Producers for the topics Kafka pipelines read.
    pub producers: BTreeMap<String, rdkafka::producer::FutureProducer>,
    /// The brokers of each topic in `producers`.
    pub brokers: BTreeMap<String, String>,
    /// Refused requests by their metric labels (status and reason or role).
    pub denied: Mutex<BTreeMap<String, u64>>,
    /// Per pipeline: a reader of its input for backfills (the log or Kafka).
    pub backfill_inputs: BTreeMap<String, weir_runtime::backfill::InputFor>,
    /// Requests to the OpenTelemetry collector, by signal and outcome.
    pub otel_exports: Arc<Exports>,
    /// The drill running on each pipeline (one at a time), by id.
    pub(crate) drills: Mutex<BTreeMap<String, i64>>,
    /// The drills' threads: a shutdown stops them (they remove their copy
    /// and shadow store) and waits for them.
    pub(crate) drill_threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// Places for open change feeds (`max_followers`).
    pub(crate) followers: Arc<tokio::sync::Semaphore>,
}

impl std::ops::Deref for App {
    type Target = Ops;

    fn deref(&self) -> &Ops {
        &self.ops
    }
}

/// Export requests by signal (`metrics`, `traces`) and outcome (`ok`,
/// `failed`), and which signals are failing now (to log a change once).
#[derive(Debug, Default)]
pub struct Exports {
    counts: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    failing: Mutex<Vec<&'static str>>,
}

impl Exports {
    pub(crate) fn done(&self, signal: &'static str, url: &str, result: &Result<(), String>) {
        let outcome = if result.is_ok() { "ok" } else { "failed" };
        *lock(&self.counts).entry((signal, outcome)).or_insert(0) += 1;
        let mut failing = lock(&self.failing);
        let was = failing.contains(&signal);
        match result {
            Err(why) if !was => {
                failing.push(signal);
                eprintln!("weir: OpenTelemetry {signal} export to {url} failed: {why}; trying again, counted in weir_otel_exports_total");
            }
            Ok(()) if was => {
                failing.retain(|s| *s != signal);
                eprintln!("weir: OpenTelemetry {signal} export to {url} works again");
            }
            _ => {}
        }
    }

    /// Every count, for `/metrics`.
    pub(crate) fn totals(&self) -> Vec<((&'static str, &'static str), u64)> {
        lock(&self.counts).iter().map(|(k, n)| (*k, *n)).collect()
    }
}

/// The places of the request gates (see `http::gate`).
pub(crate) struct Gates {
    pub readers: tokio::sync::Semaphore,
    pub public: tokio::sync::Semaphore,
    /// One export (`POST .../reconcile`) is read and compared at a time.
    pub exports: tokio::sync::Semaphore,
}

impl Gates {
    fn new() -> Gates {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Gates {
            readers: tokio::sync::Semaphore::new(2 * cores),
            public: tokio::sync::Semaphore::new(cores),
            exports: tokio::sync::Semaphore::new(1),
        }
    }
}

impl App {
    pub fn new(ops: Arc<Ops>) -> App {
        let followers = ops.config.max_followers;
        App {
            durable: Mutex::default(),
            auth: Arc::clone(&ops.sqlite),
            ops,
            round_robin: AtomicU64::new(0),
            gates: Gates::new(),
            in_flight: Mutex::default(),
            producers: BTreeMap::new(),
            brokers: BTreeMap::new(),
            denied: Mutex::default(),
            backfill_inputs: BTreeMap::new(),
            otel_exports: Arc::default(),
            drills: Mutex::default(),
            drill_threads: Mutex::default(),
            followers: Arc::new(tokio::sync::Semaphore::new(followers)),
        }
    }

    /// Runs `query` (a read or a write: tokens, idempotency keys, the audit
    /// log) on a pooled connection to `weir.db`, off the async threads.
    pub(crate) async fn on_weir_db<T: Send + 'static>(
        self: &Arc<Self>,
        query: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, ApiError> {
        let sqlite = Arc::clone(&self.sqlite);
        blocking(move || sqlite.with(|c| query(c))).await
    }

    /// [`App::on_weir_db`] for a reader's call, on the readers' threads.
    pub(crate) async fn read_as_reader<T: Send + 'static>(
        self: &Arc<Self>,
        query: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, ApiError> {
        let sqlite = Arc::clone(&self.sqlite);
        reading(move || sqlite.with(|c| query(c))).await
    }

    /// [`App::on_weir_db`] on the token checks' own pool.
    pub(crate) async fn read_tokens<T: Send + 'static>(
        self: &Arc<Self>,
        query: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, ApiError> {
        let auth = Arc::clone(&self.auth);
        blocking(move || auth.with(|c| query(c))).await
    }
}

/// Runs a store call off the async threads; a store error becomes 503 when
/// trying again may help, else 500.
pub(crate) async fn blocking<T: Send + 'static>(
    call: impl FnOnce() -> weir_store::Result<T> + Send + 'static,
) -> Result<T, ApiError> {
    match tokio::task::spawn_blocking(call).await {
        Ok(done) => answer(done),
        Err(e) => Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("a store call failed: {e}"))),
    }
}

/// [`blocking`] for a reader's call: on the readers' threads, which yield
/// the CPU to producers and pipelines (see `readers.rs`).
pub(crate) async fn reading<T: Send + 'static>(
    call: impl FnOnce() -> weir_store::Result<T> + Send + 'static,
) -> Result<T, ApiError> {
    match crate::readers::run(call).await {
        Some(done) => answer(done),
        None => Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, "a store call failed".into())),
    }
}

fn answer<T>(done: weir_store::Result<T>) -> Result<T, ApiError> {
    match done {
        Ok(v) => Ok(v),
        Err(e) if e.is_transient() => Err(ApiError(StatusCode::SERVICE_UNAVAILABLE, e.to_string())),
        Err(e) => Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
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

/// [`stored`] for a reader's call, on the readers' threads.
pub(crate) async fn read_stored<T: Send + 'static>(
    p: &Pipeline,
    call: impl FnOnce(&dyn weir_store::Store) -> weir_store::Result<T> + Send + 'static,
) -> Result<T, ApiError> {
    let store = Arc::clone(&p.store);
    reading(move || call(store.as_ref())).await
}

/// The caller of a request: its token's rights and where it came from.
#[derive(Clone)]
pub struct Caller {
    pub grant: Grant,
    /// The client's address, for the audit log.
    pub origin: String,
}

impl App {
    pub(crate) fn count_denied(&self, labels: String) {
        *lock(&self.denied).entry(labels).or_insert(0) += 1;
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

/// Appends to the audit log; `who` is the caller's token.
pub(crate) async fn audited(
    app: &Arc<App>,
    caller: &Caller,
    action: &'static str,
    pipeline: Option<String>,
    detail: serde_json::Value,
    why: String,
) -> Result<i64, ApiError> {
    let (who, origin) = (caller.grant.who(), caller.origin.clone());
    app.on_weir_db(move |c| {
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

/// Does an operator action with its audit entry, so no action stands
/// unaudited. Where the pipeline's store holds the audit log (`weir.db`),
/// both commit in one transaction. Otherwise (Postgres) the entry is
/// written first, naming the action as asked, and if the action then
/// fails a second entry (`action-failed`) says so. Returns what was done
/// and the entry's `seq` (none for a switch refused in SQLite: nothing was done).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn act_audited(
    app: &Arc<App>,
    p: &Pipeline,
    caller: &Caller,
    name: &str,
    act: weir_store::Act,
    action: &'static str,
    detail: serde_json::Value,
    why: String,
) -> Result<(weir_store::Acted, Option<i64>), ApiError> {
    let (who, origin, pipeline) = (caller.grant.who(), caller.origin.clone(), name.to_owned());
    if p.store.keeps_audit_log() {
        let done = stored(p, move |s| {
            let entry = weir_store::audit::Entry {
                who: &who,
                action,
                pipeline: Some(&pipeline),
                detail: &detail,
                why: &why,
                origin: &origin,
            };
            s.act(&pipeline, &act, Some(&entry))
        })
        .await;
        // A resume, a promote or a rollback publishes: followers and destinations look now.
        p.bell.ring();
        return done;
    }
    let mut asked = detail;
    asked["outcome"] = "asked".into();
    let seq = audited(app, caller, action, Some(pipeline.clone()), asked, why).await?;
    let done = stored(p, move |s| s.act(&pipeline, &act, None)).await;
    p.bell.ring();
    let failure = match &done {
        Ok((weir_store::Acted::Switched(Err(e)), _)) => Some(e.to_string()),
        Ok((weir_store::Acted::Incident(Err(e)), _)) => Some(e.to_string()),
        Ok(_) => None,
        Err(e) => Some(e.0.to_string() + ": " + &e.1),
    };
    if let Some(error) = failure {
        let detail = serde_json::json!({ "action": action, "entry": seq, "error": error });
        let why = "the action audited in the entry named did not take effect".to_owned();
        audited(app, caller, "action-failed", Some(name.to_owned()), detail, why).await?;
    }
    done.map(|(acted, _)| (acted, Some(seq)))
}

/// The pipeline, when the caller may read its published data.
pub(crate) fn may_read<'a>(app: &'a App, caller: &Caller, name: &str) -> Result<&'a Pipeline, ApiError> {
    let p = pipeline(app, name)?;
    if caller.grant.may_read(name) {
        Ok(p)
    } else {
        Err(forbidden(app, caller, &format!("read pipeline {name:?}")))
    }
}

/// A refusal: its status and what to do about it.
pub struct ApiError(pub StatusCode, pub String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        error(self.0, self.1)
    }
}

pub(crate) fn bad(message: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, message.into())
}

/// The most an operator's free text may hold: an incident's title, owner,
/// notes, why and proof, an annotation, the why of an action, a backfill or
/// a reconciliation, and whom it was for. Each is kept, audited and shown
/// on the dashboard and in the review, so a request body's 64 MiB is not.
pub(crate) const MAX_TEXT_BYTES: usize = 4096;

/// `text`, given as `key`, if it is at most [`MAX_TEXT_BYTES`] long.
pub(crate) fn short_text<'a>(key: &str, text: &'a str) -> Result<&'a str, ApiError> {
    if text.len() > MAX_TEXT_BYTES {
        return Err(bad(format!(
            "`{key}` is {} bytes, over the {MAX_TEXT_BYTES} an operator's text may hold; say it shorter (a link to a longer write-up will do)",
            text.len()
        )));
    }
    Ok(text)
}

pub(crate) fn error(code: StatusCode, message: impl Into<String>) -> Response {
    let body = serde_json::json!({ "error": message.into() }).to_string() + "\n";
    (code, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

pub(crate) fn lines(body: String) -> Response {
    ([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response()
}

pub(crate) fn json(value: serde_json::Value) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], value.to_string() + "\n").into_response()
}

pub(crate) fn param<T: std::str::FromStr>(q: &BTreeMap<String, String>, name: &str, default: T) -> Result<T, ApiError> {
    match q.get(name) {
        None => Ok(default),
        Some(v) => v.parse().map_err(|_| bad(format!("query parameter {name}={v:?} is not a valid value"))),
    }
}

/// The version a read names with `?version=N` (a stored one), or the
/// live one (as the store says now, so a promote on any worker counts at once).
pub(crate) async fn read_version(p: &Pipeline, name: &str, q: &BTreeMap<String, String>) -> Result<u32, ApiError> {
    let listed = || format!("GET /v1/pipelines/{name}/versions lists them");
    let asked = match q.get("version") {
        None => None,
        Some(v) => {
            Some(v.parse::<u32>().map_err(|_| bad(format!("version={v:?} is not a version number; {}", listed())))?)
        }
    };
    let n = name.to_owned();
    let versions = stored(p, move |s| s.versions(&n)).await?;
    match asked {
        Some(v) if versions.iter().any(|x| x.version == v) => Ok(v),
        Some(v) => Err(ApiError(StatusCode::NOT_FOUND, format!("pipeline {name:?} has no version {v}; {}", listed()))),
        None => Ok(versions
            .iter()
            .find(|x| x.state == weir_store::VersionState::Live)
            .map_or_else(|| p.live().0, |x| x.version)),
    }
}

/// The pipeline named `name`; a 404 names no other pipeline (a caller
/// lists the ones it may read with `GET /v1/pipelines`).
pub(crate) fn pipeline<'a>(app: &'a App, name: &str) -> Result<&'a Pipeline, ApiError> {
    app.pipelines.get(name).ok_or_else(|| {
        ApiError(
            StatusCode::NOT_FOUND,
            format!("no pipeline {name:?}; GET /v1/pipelines lists the pipelines your token may read"),
        )
    })
}

/// Most lines one answer of a list endpoint holds (SPEC.md 7).
pub(crate) const MAX_LIMIT: usize = 100_000;

/// `?limit=`: `default` when absent, else a whole number from 1 to
/// [`MAX_LIMIT`]; anything else is a 400.
pub(crate) fn page_limit(q: &BTreeMap<String, String>, default: usize) -> Result<usize, ApiError> {
    let Some(v) = q.get("limit") else { return Ok(default) };
    match v.parse::<usize>() {
        Ok(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
        _ => Err(bad(format!(
            "limit={v:?} is not a number of lines from 1 to {MAX_LIMIT}; follow the Weir-Next header for the next page"
        ))),
    }
}

/// The query of the next page: this request's path and query with `set`
/// replacing (or adding) one parameter.
pub(crate) fn next_page(path: &str, q: &BTreeMap<String, String>, set: (&str, String)) -> String {
    let mut q = q.clone();
    q.insert(set.0.to_owned(), set.1);
    let query = form_urlencoded::Serializer::new(String::new()).extend_pairs(&q).finish();
    format!("{path}?{query}")
}

/// A page of lines, with `Weir-Next` holding the next page's query when
/// there is one.
pub(crate) fn paged(rows: Vec<String>, next: Option<String>) -> Response {
    let mut r = joined(rows);
    if let Some(next) = next.and_then(|n| header::HeaderValue::from_str(&n).ok()) {
        r.headers_mut().insert(NEXT, next);
    }
    r
}

/// The response header naming the next page (SPEC.md 7).
pub(crate) const NEXT: &str = "weir-next";

/// A line's `seq`: read from its start where stored lines put it
/// (`{"seq":N,...`), else from the parsed line.
pub(crate) fn seq_of(line: &str) -> Option<i64> {
    let quick = line.strip_prefix("{\"seq\":").and_then(|rest| {
        let end = rest.find(|c: char| !c.is_ascii_digit() && c != '-')?;
        rest[..end].parse().ok()
    });
    quick.or_else(|| serde_json::from_str::<serde_json::Value>(line).ok()?.get("seq")?.as_i64())
}

/// Lines read with one more than `limit` asked: past `limit`, the first
/// left out gives the next page's `since` (its `seq`).
pub(crate) fn page_by_seq(mut rows: Vec<String>, limit: usize, path: &str, q: &BTreeMap<String, String>) -> Response {
    let next = if rows.len() > limit {
        let first_left = rows.drain(limit..).next().as_deref().and_then(seq_of);
        first_left.map(|seq| next_page(path, q, ("since", seq.to_string())))
    } else {
        None
    };
    paged(rows, next)
}

pub(crate) fn joined(rows: Vec<String>) -> Response {
    let mut body = rows.join("\n");
    if !body.is_empty() {
        body.push('\n');
    }
    lines(body)
}

pub(crate) fn why_of(q: &BTreeMap<String, String>) -> String {
    q.get("why").cloned().unwrap_or_else(|| "(not given: add ?why=...)".into())
}

/// The pipeline, when the caller may operate it.
pub(crate) fn may_operate<'a>(app: &'a App, caller: &Caller, name: &str, what: &str) -> Result<&'a Pipeline, ApiError> {
    let p = pipeline(app, name)?;
    if caller.grant.may_operate(name) {
        Ok(p)
    } else {
        Err(forbidden(app, caller, &format!("{what} pipeline {name:?}")))
    }
}

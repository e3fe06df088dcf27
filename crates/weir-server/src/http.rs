//! The HTTP surface of SPEC.md section 7. Lists are JSON lines; errors are
//! `{"error": "..."}` with a status that says whose fault it is.
//!
//! Every endpoint but `/`, `/healthz`, `/readyz` (and `/metrics` with
//! `[auth] public_metrics = true`) needs a bearer token ([`authenticate`]);
//! those public paths take no body: one that says it has a body gets 413
//! at once, unread, and the connection is closed;
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
//!
//! In more detail: axum: the router and what wraps every route: `authenticate`
//! answers a body on a public path 413 unread; `whole_body` reads every request
//! body within `body_timeout` and `max_body_bytes` (408, 413) before its
//! handler; `/healthz`, `/readyz` (the reasons for an admin token only). Lists
//! page by `?limit=` (1 to 100,000) and `Weir-Next` (`app::page_limit`,
//! `paged`): `results` by the last row's window start and key bytes (`after=`),
//! `changes`, `ledger` and the audit log by `since=`, a topic's events by
//! `from=`. The routes live by concern: `events` (POST and raw GET of a topic),
//! `pipelines` (list, contract, results, changes, ledger, provenance, status,
//! versions, diff), `actions` (pause, resume, replay, annotations, promote,
//! rollback), `backfills` (backfill: ask, list, one; reconcile against an
//! export: compare, keep, alert the owner on a failed verdict; list, one),
//! `incidents` (list, one with its timeline; open, note, mitigate, resolve:
//! operators', each an `Act::Incident` audited like any action; a backfill
//! asked or a reconciliation kept goes in the timeline of every incident not
//! resolved), `admin` (tokens, audit log), `dashboard`, `metrics`; `app` holds
//! what they share (`App`, `Caller`, `ApiError`, `short_text`, which refuses an
//! operator's text over 4 KiB, `stored`, which runs a `Store` call off the
//! async threads and answers 503 when trying again may help, else 500;
//! `read_stored` and `reading` run readers' calls on `weir-server::readers`,
//! threads at nice +10, so producers, token checks and pipelines run first).
//! `gate` wraps every route: each GET waits for one of twice-the-cores places
//! (POSTs and DELETEs, producers' and operators', pass at once; a GET or HEAD
//! with a body is refused unread, 413) (public paths have a gate of their own),
//! so a flood of reads keeps only a few tasks ready and a producer's request is
//! not queued behind them (BENCHMARKS.md, issue 17). The `authenticate`
//! middleware wraps every route (and the 404 fallback): all but `/`,
//! `/healthz`, `/readyz` (and `/metrics` with `[auth] public_metrics`) need a
//! known, live bearer token, and hand the handler a `Caller` (the token's
//! `Grant` and the client's address); each handler then checks the role
//! (`may_read`, `may_operate`, `may_produce`, `may_read_raw`, `is_admin`) and
//! answers 403 through `forbidden`, which counts it.

use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use weir_runtime::lock;
use weir_store::tokens::{self as auth};

use crate::app::*;
use crate::{actions, admin, events, metrics, pipelines};

pub fn router(app: Arc<App>) -> Router {
    let body_limit = app.config.max_body_bytes;
    let auth = axum::middleware::from_fn_with_state(Arc::clone(&app), authenticate);
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/v1/tokens", get(admin::list_tokens).post(admin::create_token))
        .route("/v1/tokens/{id}", axum::routing::delete(admin::revoke_token))
        .route("/v1/pipelines/{name}/contract", get(pipelines::contract))
        .route("/", get(crate::dashboard::page))
        .route("/v1/dashboard", get(crate::dashboard::data))
        .route("/v1/topics/{topic}/events", get(events::read_events).post(events::post_events))
        .route("/v1/pipelines", get(pipelines::list_pipelines))
        .route("/v1/pipelines/{name}/results", get(pipelines::results))
        .route("/v1/pipelines/{name}/results/{seq}/provenance", get(pipelines::provenance))
        .route("/v1/pipelines/{name}/changes", get(pipelines::changes))
        .route("/v1/pipelines/{name}/ledger", get(pipelines::ledger))
        .route("/v1/pipelines/{name}/status", get(pipelines::status))
        .route("/v1/pipelines/{name}/pause", axum::routing::post(actions::pause))
        .route("/v1/pipelines/{name}/resume", axum::routing::post(actions::resume))
        .route(
            "/v1/pipelines/{name}/destinations/{destination}/resume",
            axum::routing::post(actions::resume_destination),
        )
        .route("/v1/pipelines/{name}/annotations", get(actions::list_annotations).post(actions::annotate))
        .route("/v1/pipelines/{name}/replay", axum::routing::post(actions::replay))
        .route("/v1/pipelines/{name}/versions", get(pipelines::versions))
        .route("/v1/pipelines/{name}/diff", get(pipelines::diff))
        .route("/v1/pipelines/{name}/promote", axum::routing::post(actions::promote))
        .route("/v1/pipelines/{name}/rollback", axum::routing::post(actions::rollback))
        .route("/v1/pipelines/{name}/backfill", axum::routing::post(crate::backfills::ask))
        .route("/v1/pipelines/{name}/backfills", get(crate::backfills::list))
        .route("/v1/pipelines/{name}/backfills/{id}", get(crate::backfills::one))
        .route(
            "/v1/pipelines/{name}/reconcile",
            axum::routing::post(crate::backfills::reconcile)
                .layer(axum::extract::DefaultBodyLimit::max(app.config.max_export_bytes)),
        )
        .route("/v1/pipelines/{name}/reconciliations", get(crate::backfills::reconciliations))
        .route("/v1/pipelines/{name}/reconciliations/{id}", get(crate::backfills::reconciliation))
        .route("/v1/pipelines/{name}/checks", get(crate::checks::list))
        .route("/v1/review", get(crate::review::review))
        .route("/v1/pipelines/{name}/drills", get(crate::drills::list).post(crate::drills::ask))
        .route("/v1/pipelines/{name}/drills/{id}", get(crate::drills::one))
        .route("/v1/pipelines/{name}/incidents", get(crate::incidents::list).post(crate::incidents::open))
        .route("/v1/pipelines/{name}/incidents/{id}", get(crate::incidents::one))
        .route("/v1/pipelines/{name}/incidents/{id}/notes", axum::routing::post(crate::incidents::note))
        .route("/v1/pipelines/{name}/incidents/{id}/mitigate", axum::routing::post(crate::incidents::mitigate))
        .route("/v1/pipelines/{name}/incidents/{id}/resolve", axum::routing::post(crate::incidents::resolve))
        .route("/v1/pipelines/{name}/advice", get(crate::advice::advice))
        .route("/v1/audit", get(admin::audit))
        .route("/metrics", get(metrics::metrics))
        .layer(axum::extract::DefaultBodyLimit::max(body_limit))
        .layer(axum::middleware::from_fn_with_state(Arc::clone(&app), whole_body))
        .layer(axum::middleware::from_fn(crate::otel::traced))
        .layer(auth)
        .layer(axum::middleware::from_fn_with_state(Arc::clone(&app), gate))
        .with_state(app)
}

/// Every GET waits its turn at a gate of a few places (twice the cores;
/// public paths have a gate of their own), so a flood of reads keeps only
/// a few tasks ready at once and a producer's request is not queued behind
/// hundreds of them. The waiting requests hold no thread and no CPU.
/// Exports POSTed to `.../reconcile` pass one at a time, body and all, so
/// the memory they take is that of one (`max_export_bytes`).
/// Producers' POSTs and operators' and admins' actions pass at once: an
/// operator's pause never waits behind slow reads. A GET or HEAD that says
/// it has a body is refused (413) unread: no read takes one, and passing it
/// by the gate let a read skip its turn.
async fn gate(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let read = req.method() == axum::http::Method::GET || req.method() == axum::http::Method::HEAD;
    if read && carries_body(req.headers()) && !public(&app, path) {
        // No read takes a body, and one that came with a body would pass the
        // gate (a public path's is refused by `authenticate`, counted as such).
        app.count_denied("status=\"413\",reason=\"body_on_read\"".into());
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("a {} takes no body; send it without one (nothing was read)", req.method()),
        );
    }
    if !read && is_export(path) {
        let Ok(_turn) = app.gates.exports.acquire().await else {
            return error(StatusCode::SERVICE_UNAVAILABLE, "the server is stopping");
        };
        return next.run(req).await;
    }
    if !read || crate::feed::is_follower(path, req.uri().query(), req.headers()) {
        return next.run(req).await;
    }
    let gate = if public(&app, path) { &app.gates.public } else { &app.gates.readers };
    let Ok(_turn) = gate.acquire().await else {
        return error(StatusCode::SERVICE_UNAVAILABLE, "the server is stopping");
    };
    next.run(req).await
}

/// A reconciliation's export: `/v1/pipelines/{name}/reconcile`.
fn is_export(path: &str) -> bool {
    path.strip_prefix("/v1/pipelines/").and_then(|p| p.strip_suffix("/reconcile")).is_some_and(|n| !n.contains('/'))
}

/// Paths that answer without a token: the dashboard's page (it holds no
/// data; its data needs a token), liveness and readiness.
fn public(app: &App, path: &str) -> bool {
    matches!(path, "/" | "/healthz" | "/readyz") || (path == "/metrics" && app.config.public_metrics)
}

/// Whether a request says it has a body: a `Content-Length` other than 0,
/// or any `Transfer-Encoding`.
fn carries_body(headers: &axum::http::HeaderMap) -> bool {
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers.get(header::CONTENT_LENGTH).is_some_and(|v| v.as_bytes() != b"0")
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
    let (limit, setting) = if is_export(req.uri().path()) {
        (app.config.max_export_bytes, "max_export_bytes")
    } else {
        (app.config.max_body_bytes, "max_body_bytes")
    };
    let too_large = || {
        app.count_denied("status=\"413\",reason=\"body_too_large\"".into());
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is larger than {setting} = {limit}; nothing was read or appended; send smaller bodies or raise {setting} in weir.toml"),
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
        if carries_body(req.headers()) {
            // Never read: a caller without a token is not waited for.
            app.count_denied("status=\"413\",reason=\"body_on_public_path\"".into());
            let mut r = error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("{} takes no body; it was not read; send the request without one", req.uri().path()),
            );
            r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            return r;
        }
        return next.run(req).await;
    }
    let header = req.headers().get(header::AUTHORIZATION).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let origin = req
        .extensions()
        .get::<ConnectInfo<crate::listen::Peer>>()
        .map_or_else(|| "unknown".to_owned(), |c| c.0 .0.to_string());
    let found = app.read_tokens(move |c| auth::authenticate(c, header.as_deref(), weir_log::now_ms())).await;
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

async fn healthz() -> Response {
    json(serde_json::json!({ "ok": true }))
}

/// Ready: the log accepts writes and no pipeline is failing. Public, so it
/// says only ready or not; the reasons (pipeline names and errors) go to
/// an admin token alone.
async fn readyz(State(app): State<Arc<App>>, headers: axum::http::HeaderMap) -> Response {
    let mut not_ready = Vec::new();
    if let Some(why) = app.log.unhealthy() {
        not_ready.push(format!("the log cannot write: {why}"));
    }
    for (name, p) in &app.pipelines {
        if let Some(why) = &p.refused {
            not_ready.push(format!("pipeline {name} does not run: {why}"));
            continue;
        }
        for (version, v) in &p.versions {
            if let Some(f) = &lock(&v.status).failed {
                not_ready.push(format!("pipeline {name} version {version} is failing: {f}"));
            }
        }
    }
    if not_ready.is_empty() {
        return json(serde_json::json!({ "ready": true }));
    }
    let header = headers.get(header::AUTHORIZATION).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let admin = match header {
        None => false,
        Some(h) => matches!(
            app.read_tokens(move |c| auth::authenticate(c, Some(&h), weir_log::now_ms())).await,
            Ok(Ok(grant)) if grant.is_admin()
        ),
    };
    let body = match admin {
        true => serde_json::json!({ "ready": false, "why": not_ready }),
        false => serde_json::json!({ "ready": false, "why": ["not ready; an admin token is told why"] }),
    }
    .to_string()
        + "\n";
    (StatusCode::SERVICE_UNAVAILABLE, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

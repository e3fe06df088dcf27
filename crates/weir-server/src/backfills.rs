//! Backfill over HTTP (SPEC.md 9): `POST .../backfill` checks the range
//! (settled, retained, not a global window) and stores the run, which a
//! pipeline's backfill worker on some server claims and publishes
//! (`weir-runtime::backfill`); `GET .../backfills` and `.../backfills/{id}`
//! read the stored runs and their reports.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde_json::{json, Value};
use weir_engine::time::{format_rfc3339_ms, parse_rfc3339_ms};
use weir_store::{Act, Acted, Backfill};

use crate::actions::why_and_for_whom;
use crate::app::*;

#[derive(serde::Deserialize)]
struct BackfillBody {
    from: Option<String>,
    to: Option<String>,
    version: Option<u32>,
}

fn time_of(name: &str, value: Option<&String>) -> Result<i64, ApiError> {
    let Some(text) = value else {
        return Err(bad(format!(
            "say `{name}`: {{\"from\":\"2026-11-29T00:00:00Z\",\"to\":\"2026-11-30T00:00:00Z\",\"why\":\"...\"}}"
        )));
    };
    parse_rfc3339_ms(text)
        .ok_or_else(|| bad(format!("{name}={text:?} is not an RFC 3339 time such as 2026-11-29T14:00:00Z")))
}

/// Stores a backfill of the windows starting in `[from, to)`; 202 with its id.
pub(crate) async fn ask(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let p = may_operate(&app, &caller, &name, "backfill")?;
    let (why, for_whom) = why_and_for_whom(&body)?;
    let asked: BackfillBody = serde_json::from_slice(&body)
        .map_err(|e| bad(format!("from and to must be RFC 3339 times, version a number: {e}")))?;
    let (from_ms, to_ms) = (time_of("from", asked.from.as_ref())?, time_of("to", asked.to.as_ref())?);
    if from_ms >= to_ms {
        return Err(bad(format!(
            "from ({}) must be before to ({})",
            format_rfc3339_ms(from_ms),
            format_rfc3339_ms(to_ms)
        )));
    }
    if let Some(why) = &p.refused {
        return Err(ApiError(StatusCode::CONFLICT, format!("pipeline {name:?} does not run: {why}")));
    }
    let mut q = BTreeMap::new();
    if let Some(v) = asked.version {
        q.insert("version".to_owned(), v.to_string());
    }
    let version = read_version(p, &name, &q).await?;
    let Some(contract) = p.versions.get(&version).map(|v| v.contract.clone()) else {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!("this server does not run version {version} of {name:?}; ask a server that does"),
        ));
    };
    let Some(input_for) = app.backfill_inputs.get(&name).cloned() else {
        return Err(ApiError(StatusCode::CONFLICT, format!("pipeline {name:?} has no input this server can read")));
    };
    // How far it has settled and how far back the input is kept: both block.
    let store = Arc::clone(&p.store);
    let (pn, c) = (name.clone(), contract.clone());
    let checked = tokio::task::spawn_blocking(move || -> crate::error::Result<Result<(), String>> {
        let headers = store.checkpoint_headers(&pn, version)?;
        let settled = weir_runtime::backfill::settled_through(&c, &headers)?;
        let kept_from = input_for(&c).kept_from()?;
        Ok(weir_runtime::backfill::check_request(&c, (from_ms, to_ms), settled, kept_from))
    })
    .await
    .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
    .map_err(|e| ApiError(StatusCode::SERVICE_UNAVAILABLE, format!("{e:#}")))?;
    if let Err(refusal) = checked {
        return Err(ApiError(StatusCode::CONFLICT, format!("pipeline {name:?}: {refusal}")));
    }
    // Asked and audited in one transaction (SQLite), or audited first
    // (Postgres): a backfill that cannot be audited is not asked.
    let detail = json!({
        "version": version, "from": format_rfc3339_ms(from_ms), "to": format_rfc3339_ms(to_ms), "for": for_whom
    });
    let act = Act::Backfill { version, from_ms, to_ms, who: caller.grant.who(), why: why.clone() };
    let (acted, seq) = act_audited(&app, p, &caller, &name, act, "backfill", detail, why.clone()).await?;
    let Acted::Backfill { id } = acted else {
        return Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("the store did {acted:?}, not the backfill")));
    };
    let (pn, who, text) = (name.clone(), caller.grant.who(), format!("asked backfill {id}: {why}"));
    stored(p, move |s| s.mark_incidents(&pn, None, ("backfill", &who, &text), false)).await?;
    let location = format!("/v1/pipelines/{name}/backfills/{id}");
    let body = json!({ "pipeline": name, "backfill": id, "state": "pending", "location": location, "audit": seq });
    Ok((
        StatusCode::ACCEPTED,
        [(header::CONTENT_TYPE, "application/json".to_owned()), (header::LOCATION, location)],
        body.to_string() + "\n",
    )
        .into_response())
}

/// A stored run as served.
pub(crate) fn describe(b: &Backfill) -> Value {
    let report = b.report.as_deref().and_then(|r| serde_json::from_str::<Value>(r).ok());
    json!({
        "id": b.id,
        "pipeline": b.pipeline,
        "version": b.version,
        "from": format_rfc3339_ms(b.from_ms),
        "to": format_rfc3339_ms(b.to_ms),
        "who": b.who,
        "why": b.why,
        "origin": b.origin,
        "asked_at": format_rfc3339_ms(b.asked_ms),
        "state": b.state.as_str(),
        "finished_at": b.finished_ms.map(format_rfc3339_ms),
        "run": b.run,
        "error": b.error,
        "report": report,
    })
}

/// The newest runs, newest first (`?limit=`, default 100), without their windows.
pub(crate) async fn list(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Result<Response, ApiError> {
    let p = may_read(&app, &caller, &name)?;
    let limit = page_limit(&q, 100)? as i64;
    let pn = name.clone();
    let runs = read_stored(p, move |s| s.backfills(&pn, limit)).await?;
    let listed: Vec<Value> = runs
        .iter()
        .map(|b| {
            let mut d = describe(b);
            if let Some(report) = d.get_mut("report").and_then(Value::as_object_mut) {
                report.remove("windows");
            }
            d
        })
        .collect();
    Ok(json(json!({ "pipeline": name, "backfills": listed })))
}

/// One run with its report.
pub(crate) async fn one(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path((name, id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let p = may_read(&app, &caller, &name)?;
    let id: i64 = id.parse().map_err(|_| bad(format!("{id:?} is not a backfill id; GET .../backfills lists them")))?;
    let pn = name.clone();
    match read_stored(p, move |s| s.backfill(&pn, id)).await? {
        Some(b) => Ok(json(describe(&b))),
        None => Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("pipeline {name:?} has no backfill {id}; GET .../backfills lists them"),
        )),
    }
}

/// Compares the pipeline's published rows with the export in the body (a
/// CSV or JSON-lines file from the system of record); stores and answers
/// the report. `?map=` (which columns are the key fields, the window start
/// and the aggregates), `?tolerance=` (an amount, or a percentage),
/// `?format=csv|jsonl`, `?source=` (the export's name), `?why=`. A failed
/// verdict also reaches the owner through the alerts' webhook.
pub(crate) async fn reconcile(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let p = may_operate(&app, &caller, &name, "reconcile")?;
    let Some(why) = q.get("why").filter(|w| !w.trim().is_empty()).cloned() else {
        return Err(bad("say why: ?why=... (it is kept in the audit log with the token that acted)"));
    };
    short_text("why", &why)?;
    if let Some(source) = q.get("source") {
        short_text("source", source)?;
    }
    let version = read_version(p, &name, &q).await?;
    let Some(contract) = p.versions.get(&version).map(|v| v.contract.clone()) else {
        return Err(ApiError(StatusCode::CONFLICT, format!("this server does not run version {version} of {name:?}")));
    };
    let format =
        weir_runtime::reconcile::ExportFormat::parse(q.get("format").map_or("csv", String::as_str)).map_err(bad)?;
    let tolerance =
        weir_runtime::reconcile::Tolerance::parse(q.get("tolerance").map_or("0", String::as_str)).map_err(bad)?;
    let key_names = weir_engine::Engine::new(&contract, weir_engine::Mode::Batch, 1)
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .format()
        .key_names
        .clone();
    let aggregates: Vec<String> = contract.aggregates.iter().map(|a| a.name.clone()).collect();
    let Some(map) = q.get("map") else {
        return Err(bad("say which columns are what: ?map=key.FIELD=column,window_start=column,AGGREGATE=column"));
    };
    let mapping = weir_runtime::reconcile::Mapping::parse(map, &key_names, &aggregates).map_err(bad)?;
    let source = q.get("source").cloned().unwrap_or_else(|| "export".to_owned());
    let contract_now = contract.clone();
    let (store, pn) = (Arc::clone(&p.store), name.clone());
    // Reading the export is CPU work over up to max_export_bytes: on a
    // blocking thread, never on the server's async workers.
    let mut report = tokio::task::spawn_blocking(move || -> Result<Value, ApiError> {
        let text = std::str::from_utf8(&body).map_err(|e| bad(format!("the export is not UTF-8: {e}")))?;
        let export = weir_runtime::reconcile::read_export(text, format, &mapping)
            .map_err(|e| bad(format!("the export: {e}")))?;
        drop(body);
        weir_runtime::reconcile::compared(store.as_ref(), &contract_now, (&pn, version), (&mapping, tolerance), &export)
            .map_err(|e| ApiError(StatusCode::SERVICE_UNAVAILABLE, format!("{e:#}")))
    })
    .await
    .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
    report["source"] = source.clone().into();
    // Kept and audited in one transaction (SQLite), or audited first
    // (Postgres): a reconciliation that cannot be audited is not kept.
    let kept = weir_runtime::reconcile::to_keep(&name, version, (&caller.grant.who(), &why, &source), &report);
    let detail = json!({ "version": version, "source": source, "verdict": report["verdict"] });
    let (acted, _) =
        act_audited(&app, p, &caller, &name, Act::Reconcile(kept), "reconcile", detail, why.clone()).await?;
    let Acted::Reconciled { id } = acted else {
        return Err(ApiError(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the store did {acted:?}, not the reconciliation"),
        ));
    };
    report["id"] = id.into();
    if report["verdict"] == "fail" {
        let note = weir_runtime::reconcile::unexplained_note(&contract, &report);
        weir_runtime::lock(&app.notes).push((name.clone(), note));
    }
    let text = format!("reconciliation {id} against {source}: {}", report["verdict"].as_str().unwrap_or("?"));
    let (pn, who) = (name.clone(), caller.grant.who());
    stored(p, move |s| s.mark_incidents(&pn, None, ("reconciliation", &who, &text), false)).await?;
    Ok(json(report))
}

/// A stored reconciliation as served (its differences only when asked for one).
fn describe_reconciliation(r: &weir_store::Reconciliation, whole: bool) -> Value {
    let mut report = serde_json::from_str::<Value>(&r.report).unwrap_or(Value::Null);
    if !whole {
        if let Some(o) = report.as_object_mut() {
            o.remove("differences");
        }
    }
    report["id"] = r.id.into();
    json!({
        "id": r.id, "pipeline": r.pipeline, "version": r.version, "who": r.who, "why": r.why, "source": r.source,
        "at": format_rfc3339_ms(r.at_ms), "verdict": r.verdict, "report": report,
    })
}

/// The newest reconciliations, newest first (`?limit=`, default 100).
pub(crate) async fn reconciliations(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Result<Response, ApiError> {
    let p = may_read(&app, &caller, &name)?;
    let limit = page_limit(&q, 100)? as i64;
    let pn = name.clone();
    let kept = read_stored(p, move |s| s.reconciliations(&pn, None, limit)).await?;
    let listed: Vec<Value> = kept.iter().map(|r| describe_reconciliation(r, false)).collect();
    Ok(json(json!({ "pipeline": name, "reconciliations": listed })))
}

/// One reconciliation with every window that did not match.
pub(crate) async fn reconciliation(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path((name, id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let p = may_read(&app, &caller, &name)?;
    let id: i64 = id
        .parse()
        .map_err(|_| bad(format!("{id:?} is not a reconciliation id; GET .../reconciliations lists them")))?;
    let pn = name.clone();
    match read_stored(p, move |s| s.reconciliations(&pn, Some(id), 1)).await?.first() {
        Some(r) => Ok(json(describe_reconciliation(r, true))),
        None => Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("pipeline {name:?} has no reconciliation {id}; GET .../reconciliations lists them"),
        )),
    }
}

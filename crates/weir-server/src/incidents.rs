//! Incidents with a lifecycle (see `weir_store::cases`): listed and read
//! by a pipeline's readers; opened, noted, mitigated and resolved by its
//! operators, each step audited with who, why and from where.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde_json::{json, Value};
use weir_engine::time::format_rfc3339_ms;
use weir_store::incidents::{CaseAct, CaseError, Incident, IncidentEntry};
use weir_store::{Act, Acted};

use crate::app::*;

/// An incident as served.
pub(crate) fn describe(c: &Incident) -> Value {
    json!({
        "id": c.id,
        "pipeline": c.pipeline,
        "title": c.title,
        "owner": c.owner,
        "cause": c.cause,
        "opened_by": c.opened_by,
        "status": c.status.as_str(),
        "opened_at": format_rfc3339_ms(c.opened_ms),
        "mitigated_at": c.mitigated_ms.map(format_rfc3339_ms),
        "resolved_at": c.resolved_ms.map(format_rfc3339_ms),
        "minutes_to_mitigation": c.mitigated_ms.map(|m| (m - c.opened_ms) as f64 / 60_000.0),
        "minutes_to_resolution": c.resolved_ms.map(|r| (r - c.opened_ms) as f64 / 60_000.0),
        "proof": c.proof,
    })
}

fn entry(e: &IncidentEntry) -> Value {
    json!({ "at": format_rfc3339_ms(e.at_ms), "kind": e.kind, "who": e.who, "text": e.text })
}

/// `GET .../incidents`: the newest first (`?limit=`, default 100), one JSON object a line.
pub(crate) async fn list(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Result<Response, ApiError> {
    let p = may_read(&app, &caller, &name)?;
    let limit = page_limit(&q, 100)? as i64;
    let n = name.clone();
    let cases = read_stored(p, move |s| s.incidents(&n, limit)).await?;
    Ok(lines(cases.iter().map(|c| describe(c).to_string() + "\n").collect()))
}

/// `GET .../incidents/{id}`: the incident with its timeline, oldest entry first.
pub(crate) async fn one(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path((name, id)): Path<(String, i64)>,
) -> Result<Response, ApiError> {
    let p = may_read(&app, &caller, &name)?;
    let n = name.clone();
    match read_stored(p, move |s| s.incident(&n, id)).await? {
        None => Err(ApiError(StatusCode::NOT_FOUND, CaseError::NotFound(id).to_string())),
        Some((c, entries)) => {
            let mut v = describe(&c);
            v["timeline"] = entries.iter().map(entry).collect();
            Ok(json(v))
        }
    }
}

#[derive(serde::Deserialize)]
struct Step {
    title: Option<String>,
    owner: Option<String>,
    who: Option<String>,
    why: Option<String>,
    note: Option<String>,
    proof: Option<String>,
}

fn given(v: &Option<String>) -> Option<String> {
    v.as_deref().map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned)
}

/// `POST .../incidents` (`{"title","owner","why"}`), and `POST
/// .../incidents/{id}/notes|mitigate|resolve`.
async fn step(
    app: Arc<App>,
    caller: Caller,
    name: String,
    id: Option<i64>,
    what: &'static str,
    body: Bytes,
) -> Result<Response, ApiError> {
    let p = may_operate(&app, &caller, &name, &format!("{what} an incident of"))?;
    let usage = match what {
        "open" => "{\"title\":\"...\",\"owner\":\"...\",\"why\":\"...\"} (owner defaults to the contract's)",
        "note" => "{\"note\":\"...\"}",
        "mitigate" => "{\"why\":\"...\"}",
        _ => "{\"why\":\"...\",\"proof\":\"...\"}",
    };
    let s: Step = serde_json::from_slice(&body).map_err(|e| bad(format!("the body must be JSON like {usage}: {e}")))?;
    for (key, text) in [
        ("title", &s.title),
        ("owner", &s.owner),
        ("who", &s.who),
        ("why", &s.why),
        ("note", &s.note),
        ("proof", &s.proof),
    ] {
        if let Some(text) = text {
            short_text(key, text)?;
        }
    }
    let who = match given(&s.who) {
        Some(w) => format!("{w} via {}", caller.grant.who()),
        None => caller.grant.who(),
    };
    let need = |v: Option<String>, key: &str| v.ok_or_else(|| bad(format!("say the {key}: {usage}")));
    let (act, why) = match (what, id) {
        ("open", _) => {
            let title = need(given(&s.title), "title")?;
            let owner = given(&s.owner).unwrap_or_else(|| p.contract().pipeline.owner.clone());
            let why = given(&s.why).unwrap_or_else(|| title.clone());
            (CaseAct::Open { title, owner, who }, why)
        }
        ("note", Some(id)) => {
            let text = need(given(&s.note), "note")?;
            (CaseAct::Note { id, who, text: text.clone() }, text)
        }
        ("mitigate", Some(id)) => {
            let why = need(given(&s.why), "why")?;
            (CaseAct::Mitigate { id, who, why: why.clone() }, why)
        }
        (_, Some(id)) => {
            let why = need(given(&s.why), "why")?;
            // An empty proof is the store's to refuse (400), after the incident is found.
            let proof = given(&s.proof).unwrap_or_default();
            (CaseAct::Resolve { id, who, why: why.clone(), proof }, why)
        }
        (_, None) => return Err(bad("name the incident")),
    };
    let detail = json!({ "incident": id });
    let action = match what {
        "open" => "incident-open",
        "note" => "incident-note",
        "mitigate" => "incident-mitigate",
        _ => "incident-resolve",
    };
    let (acted, seq) = act_audited(&app, p, &caller, &name, Act::Incident(act), action, detail, why).await?;
    match acted {
        Acted::Incident(Ok(c)) => {
            let mut v = describe(&c);
            v["audit"] = json!(seq);
            let code = if what == "open" { StatusCode::CREATED } else { StatusCode::OK };
            let location = format!("/v1/pipelines/{name}/incidents/{}", c.id);
            Ok((
                code,
                [(header::CONTENT_TYPE, "application/json".to_owned()), (header::LOCATION, location)],
                v.to_string() + "\n",
            )
                .into_response())
        }
        Acted::Incident(Err(e)) => {
            let code = match e {
                CaseError::NotFound(_) => StatusCode::NOT_FOUND,
                CaseError::NoProof(_) => StatusCode::BAD_REQUEST,
                CaseError::Resolved(_) | CaseError::Mitigated(_) => StatusCode::CONFLICT,
            };
            Err(ApiError(code, e.to_string()))
        }
        other => {
            Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("the store did {other:?}, not the incident step")))
        }
    }
}

pub(crate) async fn open(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    step(app, caller, name, None, "open", body).await
}

pub(crate) async fn note(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path((name, id)): Path<(String, i64)>,
    body: Bytes,
) -> Result<Response, ApiError> {
    step(app, caller, name, Some(id), "note", body).await
}

pub(crate) async fn mitigate(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path((name, id)): Path<(String, i64)>,
    body: Bytes,
) -> Result<Response, ApiError> {
    step(app, caller, name, Some(id), "mitigate", body).await
}

pub(crate) async fn resolve(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path((name, id)): Path<(String, i64)>,
    body: Bytes,
) -> Result<Response, ApiError> {
    step(app, caller, name, Some(id), "resolve", body).await
}

//! Operator actions: pause, resume, replay, annotations, promote and
//! rollback. Each is written to the pipeline's store (read by every runner
//! of the pipeline) before it is answered, together with its audit entry
//! (who, why and from where; see [`act_audited`]).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use weir_engine::time::format_rfc3339_ms;

use weir_store::{Act, Acted};

use crate::app::*;

/// Why an operator acts (required; the audit log keeps it), and on whose
/// behalf when the body names someone besides the token's holder.
#[derive(serde::Deserialize)]
struct Action {
    who: Option<String>,
    why: Option<String>,
}

pub(crate) fn why_and_for_whom(body: &Bytes) -> Result<(String, Option<String>), ApiError> {
    let a: Action = serde_json::from_slice(body)
        .map_err(|e| bad(format!("the body must be JSON like {{\"why\":\"...\"}}: {e}")))?;
    let who = a.who.filter(|w| !w.trim().is_empty());
    if let Some(who) = &who {
        short_text("who", who)?;
    }
    match a.why.filter(|w| !w.trim().is_empty()) {
        Some(why) => Ok((short_text("why", &why)?.to_owned(), who)),
        None => Err(bad("say why: {\"why\":\"...\"} (it is kept in the audit log with the token that acted)")),
    }
}

pub(crate) async fn set_paused(
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
    let act = if pause { Act::Pause } else { Act::Resume };
    let detail = serde_json::json!({ "for": for_whom });
    let (acted, seq) = act_audited(&app, p, &caller, &name, act, action, detail, why).await?;
    // Both answer whether it was paused before.
    let was_paused = matches!(acted, Acted::Paused { was: true });
    p.paused.store(pause, Ordering::SeqCst);
    Ok(json(serde_json::json!({ "pipeline": name, "paused": pause, "was_paused": was_paused, "audit": seq })))
}

pub(crate) async fn pause(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    set_paused(app, caller, name, body, true).await
}

pub(crate) async fn resume(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    set_paused(app, caller, name, body, false).await
}

/// `POST .../destinations/{destination}/resume`: a destination its
/// receiver stopped delivers again, from the refused batch. A destination
/// that is not stopped answers 409 (nothing to do).
pub(crate) async fn resume_destination(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path((name, destination)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let p = may_operate(&app, &caller, &name, "resume-destination")?;
    if !p.contract().destinations.iter().any(|d| d.name == destination) {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!(
                "pipeline {name} has no destination {destination:?}; its contract's [[destination]] sections name them"
            ),
        ));
    }
    let (why, for_whom) = why_and_for_whom(&body)?;
    let detail = serde_json::json!({ "for": for_whom, "destination": destination });
    let act = Act::ResumeDestination { name: destination.clone() };
    let (acted, seq) = act_audited(&app, p, &caller, &name, act, "resume-destination", detail, why).await?;
    if !matches!(acted, Acted::DestinationResumed { was_stopped: true }) {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!("destination {destination} of {name} is not stopped: it delivers by itself; nothing was done"),
        ));
    }
    Ok(json(serde_json::json!({ "pipeline": name, "destination": destination, "resumed": true, "audit": seq })))
}

#[derive(serde::Deserialize)]
struct NewAnnotation {
    who: Option<String>,
    from: Option<String>,
    to: Option<String>,
    note: Option<String>,
}

pub(crate) async fn annotate(
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
    short_text("note", &note)?;
    // The annotation names the token's holder (and whom it was for, if the body says).
    let who = match a.who.filter(|w| !w.trim().is_empty()) {
        Some(w) => format!("{} via {}", short_text("who", &w)?, caller.grant.who()),
        None => caller.grant.who(),
    };
    // The note is kept beside the rows it marks (Postgres for a pipeline on Kafka).
    let detail = serde_json::json!({ "from": format_rfc3339_ms(from_ms), "to": format_rfc3339_ms(to_ms), "for": who });
    let act = Act::Annotate { range: (from_ms, to_ms), note: note.clone(), who };
    let (acted, _) = act_audited(&app, p, &caller, &name, act, "annotate", detail, note).await?;
    let Acted::Annotation { id } = acted else {
        return Err(ApiError(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the store did {acted:?}, not the annotation"),
        ));
    };
    Ok(json(serde_json::json!({ "pipeline": name, "annotation": id })))
}

pub(crate) async fn list_annotations(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let p = may_read(&app, &caller, &name)?;
    let notes = read_stored(p, move |s| s.annotations(&name)).await?;
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
pub(crate) async fn replay(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let p = may_operate(&app, &caller, &name, "replay")?;
    let (why, for_whom) = why_and_for_whom(&body)?;
    let version = read_version(p, &name, &BTreeMap::new()).await?;
    let r: ReplayBody = serde_json::from_slice(&body)
        .map_err(|e| bad(format!("from_offset must be a whole number, from_time an RFC 3339 time: {e}")))?;
    let from_time = match &r.from_time {
        None => None,
        Some(t) => Some(
            weir_engine::time::parse_rfc3339_ms(t)
                .ok_or_else(|| bad(format!("from_time={t:?} is not an RFC 3339 time such as 2026-11-29T14:00:00Z")))?,
        ),
    };
    if let Some(offset) = r.from_offset {
        let ends = topic_ends(&app, p).await?;
        let end = ends.iter().copied().max().unwrap_or(0);
        if offset > end {
            return Err(bad(format!(
                "from_offset {offset} is past the end of every partition of topic {:?} (their ends: {ends:?}); nothing would be replayed: give an offset at most {end}, or from_time",
                p.contract().source.topic
            )));
        }
    }
    // A request in the pipeline's store: every worker applies it to the partitions it holds.
    let replay = weir_store::Replay { from_offset: r.from_offset, from_time };
    let detail = serde_json::json!({
        "version": version, "from_offset": r.from_offset.unwrap_or(0), "from_time": r.from_time, "for": for_whom
    });
    let act = Act::Replay { version, replay };
    let (acted, seq) = act_audited(&app, p, &caller, &name, act, "replay", detail, why).await?;
    let Acted::Replay { id } = acted else {
        return Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("the store did {acted:?}, not the replay")));
    };
    let body = serde_json::json!({ "pipeline": name, "replay": "started", "id": id, "audit": seq }).to_string() + "\n";
    Ok((StatusCode::ACCEPTED, [(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// The end of each partition of the pipeline's topic: from the embedded
/// log, or asked of Kafka.
async fn topic_ends(app: &App, p: &weir_runtime::Pipeline) -> Result<Vec<u64>, ApiError> {
    let contract = p.contract();
    let topic = contract.source.topic.clone();
    match weir_runtime::kafka::source_of(contract, &app.config) {
        None => Ok(app
            .log
            .bounds(&topic)
            .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
            .iter()
            .map(|b| b.1)
            .collect()),
        Some((brokers, _)) => {
            let kafka = app.config.kafka.clone();
            tokio::task::spawn_blocking(move || weir_runtime::kafka::topic_ends(&brokers, kafka.as_ref(), &topic))
                .await
                .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
                .map_err(|e| {
                    ApiError(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("cannot ask Kafka where the topic ends: {e}; try again"),
                    )
                })
        }
    }
}

#[derive(serde::Deserialize)]
struct PromoteBody {
    version: Option<u32>,
}

/// Makes a version live (a candidate, or a superseded one): readers'
/// default switches to it, and the change stream gets a `version` entry.
pub(crate) async fn promote(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    may_operate(&app, &caller, &name, "promote")?;
    let (why, for_whom) = why_and_for_whom(&body)?;
    let asked: PromoteBody = serde_json::from_slice(&body)
        .map_err(|e| bad(format!("the body must be JSON like {{\"version\":2,\"why\":\"...\"}}: {e}")))?;
    let Some(version) = asked.version else {
        return Err(bad("say which version: {\"version\":2,\"why\":\"...\"}"));
    };
    switch(app, caller, name, Some(version), (why, for_whom)).await
}

/// Makes the version the live one replaced live again.
pub(crate) async fn rollback(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    may_operate(&app, &caller, &name, "rollback")?;
    let why = why_and_for_whom(&body)?;
    switch(app, caller, name, None, why).await
}

async fn switch(
    app: Arc<App>,
    caller: Caller,
    name: String,
    promote: Option<u32>,
    (why, for_whom): (String, Option<String>),
) -> Result<Response, ApiError> {
    let p = pipeline(&app, &name)?;
    let action = if promote.is_some() { "promote" } else { "rollback" };
    let act = Act::Switch { promote, who: caller.grant.who(), why: why.clone() };
    let detail = serde_json::json!({ "for": for_whom, "asked": promote });
    let (acted, audit) = act_audited(&app, p, &caller, &name, act, action, detail, why).await?;
    let Acted::Switched(switched) = acted else {
        return Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("the store did {acted:?}, not the switch")));
    };
    let (switch, seq) = switched.map_err(|e| {
        let code = match e {
            weir_store::SwitchError::Unknown { .. } => StatusCode::NOT_FOUND,
            _ => StatusCode::CONFLICT,
        };
        ApiError(code, e.to_string())
    })?;
    // This server's readers and reports follow at once; other workers within a checkpoint interval.
    weir_ops::versions::switched(p, switch);
    weir_ops::versions::notify(&app.ops, &name, action, switch);
    Ok(json(serde_json::json!({
        "pipeline": name, "from": switch.from, "to": switch.to, "seq": seq, "audit": audit
    })))
}

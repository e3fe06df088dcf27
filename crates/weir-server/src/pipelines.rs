//! A pipeline's published data and standing: the list of pipelines, the
//! contract, `results`, `changes`, `ledger`, a row's provenance, `status`;
//! read through the pipeline's [`weir_store::Store`], the same on both
//! topologies.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use weir_engine::Reason;
use weir_store::tokens::{self as auth};

use crate::app::*;

/// The contract weir runs for a pipeline: its identity and who answers for it.
pub(crate) async fn contract(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let p = may_read(&app, &caller, &name)?;
    let c = p.contract();
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

/// The pipelines the caller may read (a raw-reader: those reading its topics).
pub(crate) async fn list_pipelines(State(app): State<Arc<App>>, Extension(caller): Extension<Caller>) -> Response {
    let g = &caller.grant;
    if g.role == auth::Role::Producer {
        return forbidden(&app, &caller, "list pipelines").into_response();
    }
    let mut body = String::new();
    for (name, p) in &app.pipelines {
        let c = p.contract();
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

pub(crate) async fn results(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    uri: Uri,
    Query(q): Query<BTreeMap<String, String>>,
) -> Result<Response, ApiError> {
    let p = may_read(&app, &caller, &name)?;
    let version = read_version(p, &name, &q).await?;
    let limit = page_limit(&q, 10_000)?;
    let time = |k: &str| -> Result<Option<i64>, ApiError> {
        let Some(v) = q.get(k) else { return Ok(None) };
        match weir_engine::time::parse_rfc3339_ms(v) {
            Some(ms) => Ok(Some(ms)),
            None => Err(bad(format!("{k}={v:?} is not an RFC 3339 time such as 2026-11-29T14:00:00Z"))),
        }
    };
    let filter = weir_store::ResultFilter {
        status: q.get("status").cloned(),
        from_ms: time("from")?,
        to_ms: time("to")?,
        key: q.iter().filter_map(|(k, v)| Some((k.strip_prefix("key.")?.to_owned(), v.clone()))).collect(),
        limit: limit as i64 + 1,
        after: q.get("after").map(|a| after(a)).transpose()?,
    };
    let mut page = read_stored(p, move |s| s.results(&name, version, &filter)).await?;
    let mut next = None;
    if page.rows.len() > limit {
        page.rows.truncate(limit);
        let (start, key) = &page.places[limit - 1];
        next = Some(next_page(uri.path(), &q, ("after", format!("{start}:{}", hex(key)))));
    }
    Ok(paged(page.rows, next))
}

/// `after=START:KEY` of `Weir-Next`: the window start and the key bytes in
/// hex of the last row of the page before.
fn after(text: &str) -> Result<(i64, Vec<u8>), ApiError> {
    let refuse =
        || bad(format!("after={text:?} is not a place in the rows; use the Weir-Next header of the page before"));
    let (start, key) = text.split_once(':').ok_or_else(refuse)?;
    let start = start.parse::<i64>().map_err(|_| refuse())?;
    if key.len() % 2 != 0 {
        return Err(refuse());
    }
    let bytes = (0..key.len())
        .step_by(2)
        .map(|i| key.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect::<Option<Vec<u8>>>()
        .ok_or_else(refuse)?;
    Ok((start, bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `{seq}` is the row's place in the change stream, as `/results` and
/// `/changes` show it: one revision of one window.
pub(crate) async fn provenance(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path((name, seq)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let p = may_read(&app, &caller, &name)?;
    let Ok(seq) = seq.parse::<i64>() else {
        return Err(bad(format!("{seq:?} is not a row: use the \"seq\" of a row from /results or /changes")));
    };
    let pn = name.clone();
    let origin = read_stored(p, move |s| s.row_origin(&pn, seq)).await?;
    let Some(origin) = origin else {
        return Err(ApiError(StatusCode::NOT_FOUND, format!("pipeline {name:?} has published no row with seq {seq}")));
    };
    // The row names its version; the document names that version's contract.
    let version = origin.row["version"].as_u64().and_then(|v| u32::try_from(v).ok());
    let contract = version.and_then(|v| p.versions.get(&v)).map_or_else(|| p.contract(), |v| &v.contract);
    let body = crate::provenance::document(contract, seq, &origin).to_string() + "\n";
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

pub(crate) async fn changes(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    uri: Uri,
    headers: axum::http::HeaderMap,
    Query(q): Query<BTreeMap<String, String>>,
) -> Result<Response, ApiError> {
    let p = may_read(&app, &caller, &name)?;
    let since = param(&q, "since", 1i64)?;
    let limit = page_limit(&q, 10_000)?;
    // Without `version`: the pipeline's whole change stream, every version's
    // rows and the promotes and rollbacks between them, in `seq` order.
    let version = match q.contains_key("version") {
        true => Some(read_version(p, &name, &q).await?),
        false => None,
    };
    if crate::feed::wants_events(&headers) {
        let from = crate::feed::start_of(&headers, since)?;
        return Ok(crate::feed::events(Arc::clone(&app), name, version, from));
    }
    if let Some(wait) = q.get("wait") {
        let wait_ms = weir_contract::parse_duration_ms(wait)
            .ok()
            .filter(|ms| (0..=crate::feed::MAX_WAIT_MS).contains(ms))
            .ok_or_else(|| bad(format!("wait={wait:?} must be a duration of at most 60s, such as wait=30s")))?;
        let asked = (version, since, limit, wait_ms);
        return Ok(crate::feed::long_poll(Arc::clone(&app), name, asked, uri.path(), &q).await);
    }
    let rows = read_stored(p, move |s| s.changes(&name, version, since, limit as i64 + 1)).await?;
    Ok(page_by_seq(rows, limit, uri.path(), &q))
}

/// The ledger: with payloads for a raw-reader of the pipeline's topic (the
/// read is audited), without them for the pipeline's readers.
pub(crate) async fn ledger(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    uri: Uri,
    Query(q): Query<BTreeMap<String, String>>,
) -> Result<Response, ApiError> {
    let p = pipeline(&app, &name)?;
    let raw = caller.grant.may_read_raw(&p.contract().source.topic);
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
    let limit = page_limit(&q, 10_000)?;
    let version = read_version(p, &name, &q).await?;
    let n = name.clone();
    let page = (since, limit as i64 + 1);
    let mut entries = read_stored(p, move |s| s.ledger(&n, version, reason.as_deref(), page, raw)).await?;
    let next = match entries.len() > limit {
        true => entries.drain(limit..).next().as_deref().and_then(seq_of),
        false => None,
    }
    .map(|seq| next_page(uri.path(), &q, ("since", seq.to_string())));
    if raw {
        let detail = serde_json::json!({
            "ledger": name, "version": version, "since": since, "limit": limit, "returned": entries.len()
        });
        audited(&app, &caller, "raw-read", Some(name), detail, why_of(&q)).await?;
        return Ok(paged(entries, next));
    }
    let published: Vec<String> = entries
        .iter()
        .filter_map(|e| serde_json::from_str(e).ok())
        .map(|v| weir_runtime::privacy::published(v, p.contract()).to_string())
        .collect();
    Ok(paged(published, next))
}

pub(crate) async fn status(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Result<Response, ApiError> {
    let p = may_read(&app, &caller, &name)?;
    let version = read_version(p, &name, &q).await?;
    let Some(v) = p.version(Some(version)) else {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!("version {version} of {name:?} is stored but not run by this server (its contract was stored before versions were kept); its rows stay readable"),
        ));
    };
    Ok(json(
        serde_json::to_value(weir_ops::report::report_version(&app.log, &app.watch, &name, p, v))
            .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?,
    ))
}

/// Every stored version of the pipeline: its state, contract hash, when it
/// was started and promoted and by whom (SPEC.md 8).
pub(crate) async fn versions(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let p = may_read(&app, &caller, &name)?;
    let n = name.clone();
    let stored_versions = read_stored(p, move |s| s.versions(&n)).await?;
    let body: Vec<String> = stored_versions
        .iter()
        .map(|v| {
            let mut shown = weir_ops::versions::describe(p, v);
            shown["pipeline"] = name.clone().into();
            shown.to_string()
        })
        .collect();
    Ok(joined(body))
}

/// Two versions compared on the windows both cover (`?a=&b=`, default: the
/// live version and the newest other one).
pub(crate) async fn diff(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Result<Response, ApiError> {
    let p = may_read(&app, &caller, &name)?;
    let version = |k: &str| -> Result<Option<u32>, ApiError> {
        q.get(k).map(|v| v.parse::<u32>().map_err(|_| bad(format!("{k}={v:?} is not a version number")))).transpose()
    };
    let (a, b) = (version("a")?, version("b")?);
    let n = name.clone();
    let stored_versions = read_stored(p, move |s| s.versions(&n)).await?;
    let live = stored_versions.iter().find(|v| v.state == weir_store::VersionState::Live).map(|v| v.version);
    let newest_other = stored_versions.iter().rev().map(|v| v.version).find(|v| Some(*v) != live);
    let (Some(a), Some(b)) = (a.or(live), b.or(newest_other)) else {
        return Err(ApiError(StatusCode::CONFLICT, format!("pipeline {name:?} has one version: nothing to compare")));
    };
    for v in [a, b] {
        if !stored_versions.iter().any(|x| x.version == v) {
            return Err(ApiError(
                StatusCode::NOT_FOUND,
                format!("pipeline {name:?} has no version {v}; GET /v1/pipelines/{name}/versions lists them"),
            ));
        }
    }
    let app2 = Arc::clone(&app);
    let n = name.clone();
    let report = reading(move || match app2.pipelines.get(&n) {
        Some(p) => weir_ops::versions::diff(p, &n, a, b),
        None => Ok(serde_json::Value::Null),
    })
    .await?;
    Ok(json(report))
}

//! Admin routes: tokens (`GET`, `POST /v1/tokens`, `DELETE /v1/tokens/{id}`)
//! and the audit log (`GET /v1/audit`), for admin tokens only.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use weir_store::tokens::{self as auth};

use crate::app::*;

pub(crate) async fn list_tokens(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
) -> Result<Response, ApiError> {
    if !caller.grant.is_admin() {
        return Err(forbidden(&app, &caller, "list tokens"));
    }
    let tokens = app.on_weir_db(auth::list).await?;
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

pub(crate) async fn create_token(
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
    short_text("why", &why)?;
    let made = app.on_weir_db(move |c| Ok(auth::create_audited(c, &new, &who, &origin, &why))).await?;
    let (token, grant) = made.map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")))?;
    let mut v = grant.json();
    v["token"] = token.into();
    Ok(json(v))
}

pub(crate) async fn revoke_token(
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
    let revoked = app.on_weir_db(move |c| Ok(auth::revoke_audited(c, &i, &who, &origin, &why))).await?;
    match revoked.map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")))? {
        Some(g) => Ok(json(g.json())),
        None => Err(ApiError(StatusCode::NOT_FOUND, format!("no token {id:?}; GET /v1/tokens lists them"))),
    }
}

/// The audit log: admin tokens only.
pub(crate) async fn audit(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    uri: axum::http::Uri,
    Query(q): Query<BTreeMap<String, String>>,
) -> Result<Response, ApiError> {
    if !caller.grant.is_admin() {
        return Err(forbidden(&app, &caller, "read the audit log"));
    }
    let since = param(&q, "since", 1i64)?;
    let limit = page_limit(&q, 10_000)?;
    let rows = app.read_as_reader(move |c| weir_store::audit::log(c, since, limit as i64 + 1)).await?;
    Ok(page_by_seq(rows, limit, uri.path(), &q))
}

//! `GET /v1/pipelines/{p}/checks`: a version's checks and their kept
//! results (`weir_ops::checks` evaluates them in the alert loop).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::{Extension, Json};
use serde_json::{json, Value};
use weir_ops::checks::{shown, summary};
use weir_store::checks::CheckFilter;

use crate::app::{bad, may_read, page_limit, read_stored, read_version, ApiError, App, Caller};

/// `GET /v1/pipelines/{p}/checks[?version=N][&check=NAME][&failed=true][&limit=N]`:
/// the version's checks (as its contract defines them, with the results
/// kept: passed, failed, the last), then its newest results.
pub async fn list(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let p = may_read(&app, &caller, &name)?;
    let version = read_version(p, &name, &q).await?;
    let passed = match q.get("failed").map(String::as_str) {
        None => None,
        Some("true") => Some(false),
        Some("false") => Some(true),
        Some(other) => return Err(bad(format!("failed={other:?}: write failed=true or failed=false"))),
    };
    let filter =
        CheckFilter { check: q.get("check").cloned(), passed, since_ms: None, limit: page_limit(&q, 100)? as i64 };
    let n = name.clone();
    let defined = p.version(Some(version)).map(|(_, v)| v.contract.checks.clone()).unwrap_or_default();
    let (checks, results) = read_stored(p, move |s| {
        let checks = summary(s, &n, version, &defined)?;
        Ok((checks, s.check_results(&n, version, &filter)?))
    })
    .await?;
    Ok(Json(json!({
        "pipeline": name,
        "version": version,
        "checks": checks,
        "results": results.iter().map(shown).collect::<Vec<_>>(),
    })))
}

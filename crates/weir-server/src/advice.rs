//! `GET /v1/pipelines/{p}/advice`: the lateness advice of a version
//! (`weir_ops::advice`), from its last checkpoints.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::response::Response;
use axum::Extension;
use weir_ops::advice::{advise, observed};

use crate::app::*;

/// `GET /v1/pipelines/{p}/advice[?version=N]`.
pub(crate) async fn advice(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    Query(q): Query<std::collections::BTreeMap<String, String>>,
) -> Result<Response, ApiError> {
    let p = may_read(&app, &caller, &name)?;
    let version = read_version(p, &name, &q).await?;
    let Some(v) = p.versions.get(&version) else {
        return Err(ApiError(
            axum::http::StatusCode::CONFLICT,
            format!("this server does not run version {version} of {name:?}; ask a server that does"),
        ));
    };
    let contract = v.contract.clone();
    let state_bytes = weir_runtime::lock(&v.status).state_bytes;
    let n = name.clone();
    let headers = read_stored(p, move |s| s.checkpoint_headers(&n, version)).await?;
    let seen = observed(&contract, &headers).map_err(|e| ApiError(axum::http::StatusCode::INTERNAL_SERVER_ERROR, e))?;
    Ok(json(advise(&contract, &seen, state_bytes)))
}

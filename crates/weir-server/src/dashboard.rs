//! The dashboard: `GET /` serves one HTML page (embedded in the binary, no
//! script or style from elsewhere) that polls `GET /v1/dashboard` every
//! second and draws it.
//!
//! `/v1/dashboard` holds, per pipeline: the contract's name, version,
//! owner, steward and decision; its status (as `/status`); the last 15
//! minutes of throughput, lag and watermark age, sampled every second by the
//! alert loop; the newest published rows; ledger counts by reason and the
//! newest entries (without payloads); firing alerts; annotations; the
//! newest backfill runs and reconciliations with their verdicts. And
//! incidents: the newest alert notifications of the pipelines the caller
//! may read (kept in each pipeline's store, so they outlive a restart) and,
//! for an admin, the newest operator actions.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde_json::{json, Value};

use crate::app::{forbidden, read_stored, ApiError, App, Caller};
use weir_ops::report::report;

/// How long the charts look back.
const LATEST_ROWS: i64 = 20;
const LATEST_LEDGER: i64 = 10;
const LATEST_AUDIT: i64 = 20;
const LATEST_INCIDENTS: i64 = 50;
/// Backfill runs and reconciliations shown per pipeline.
const LATEST_RUNS: i64 = 5;

const PAGE: &str = include_str!("dashboard.html");

/// `GET /`: the page, with headers that keep it to itself: its one script
/// and one style run by their SHA-256 (nothing else, inline or from
/// elsewhere), it fetches from this server only, no other site may frame it
/// or keep a handle on its window, and no address leaves it as a referrer.
pub async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (header::CONTENT_SECURITY_POLICY, policy()),
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::HeaderName::from_static("cross-origin-opener-policy"), "same-origin"),
        ],
        PAGE,
    )
        .into_response()
}

/// The page's Content-Security-Policy, computed once from the page.
fn policy() -> &'static str {
    static POLICY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    POLICY.get_or_init(|| {
        format!(
            "default-src 'none'; script-src '{}'; style-src '{}'; connect-src 'self'; img-src 'self' data:; \
             base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
            inline_hash(PAGE, "<script>", "</script>"),
            inline_hash(PAGE, "<style>", "</style>"),
        )
    })
}

/// `sha256-BASE64` of the text between the first `open` and the `close`
/// after it, as a Content-Security-Policy source.
fn inline_hash(page: &str, open: &str, close: &str) -> String {
    use base64::Engine as _;
    use sha2::Digest as _;
    let start = page.find(open).map_or(0, |i| i + open.len());
    let end = page[start..].find(close).map_or(page.len(), |i| start + i);
    let digest = sha2::Sha256::digest(&page.as_bytes()[start..end]);
    format!("sha256-{}", base64::engine::general_purpose::STANDARD.encode(digest))
}

fn parsed(lines: Vec<String>) -> Vec<Value> {
    lines.iter().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

/// Raw payloads (and the details quoting them) stay in the ledger endpoint, for raw-readers.
fn without_payloads(entries: Vec<Value>, contract: &weir_contract::Contract) -> Vec<Value> {
    entries.into_iter().map(|e| weir_runtime::privacy::published(e, contract)).collect()
}

/// What the caller's token may read: its pipelines, and the audit log for
/// an admin.
pub async fn data(State(app): State<Arc<App>>, Extension(caller): Extension<Caller>) -> Result<Response, ApiError> {
    let g = &caller.grant;
    let names: Vec<String> = app.pipelines.keys().filter(|n| g.may_read(n)).cloned().collect();
    if names.is_empty() && !g.is_admin() {
        return Err(forbidden(&app, &caller, "read the dashboard: it reads no pipeline"));
    }
    let admin = g.is_admin();
    let audit = if admin {
        Some(parsed(app.read_as_reader(|c| weir_store::audit::latest(c, LATEST_AUDIT)).await?))
    } else {
        None
    };
    let mut pipelines = Vec::new();
    // The alert notifications of the pipelines the caller may read, from their stores.
    let mut incidents = Vec::new();
    let mut cases = Vec::new();
    for name in &names {
        let Some(p) = app.pipelines.get(name) else { continue };
        let n = name.clone();
        let (live, _) = p.live();
        let defined = p.contract().checks.clone();
        let (rows, ledger, notes, kept, versions, checks, named) = read_stored(p, move |s| {
            let named = weir_ops::checks::summary(s, &n, live, &defined)?;
            let rows = parsed(s.latest_changes(&n, live, LATEST_ROWS)?);
            let ledger = parsed(s.latest_ledger(&n, live, LATEST_LEDGER)?);
            let checks = (s.backfills(&n, LATEST_RUNS)?, s.reconciliations(&n, None, LATEST_RUNS)?);
            let kept = (s.notifications(&n, LATEST_INCIDENTS)?, s.incidents(&n, LATEST_INCIDENTS)?);
            Ok((rows, ledger, s.annotations(&n)?, kept, s.versions(&n)?, checks, named))
        })
        .await?;
        let (backfills, reconciliations) = checks;
        let backfills: Vec<Value> = backfills
            .iter()
            .map(|b| {
                let report =
                    b.report.as_deref().and_then(|r| serde_json::from_str::<Value>(r).ok()).unwrap_or_default();
                json!({
                    "id": b.id, "origin": b.origin, "state": b.state.as_str(), "why": b.why,
                    "from": weir_engine::time::format_rfc3339_ms(b.from_ms),
                    "to": weir_engine::time::format_rfc3339_ms(b.to_ms),
                    "finished": b.finished_ms.map(weir_engine::time::format_rfc3339_ms),
                    "corrected": report["windows_corrected"], "checked": report["windows_checked"],
                    "difference": report["difference"], "error": b.error,
                })
            })
            .collect();
        let reconciliations: Vec<Value> = reconciliations
            .iter()
            .map(|r| {
                let report = serde_json::from_str::<Value>(&r.report).unwrap_or_default();
                json!({
                    "id": r.id, "source": r.source, "verdict": r.verdict, "why": r.why,
                    "at": weir_engine::time::format_rfc3339_ms(r.at_ms),
                    "windows": report["windows"], "totals": report["totals"],
                })
            })
            .collect();
        let versions: Vec<Value> = versions.iter().map(|v| weir_ops::versions::describe(p, v)).collect();
        let (kept, kept_cases) = kept;
        incidents.extend(kept);
        cases.extend(kept_cases);
        let notes: Vec<Value> = notes
            .into_iter()
            .map(|a| {
                json!({
                    "id": a.id, "note": a.note, "who": a.who,
                    "from": weir_engine::time::format_rfc3339_ms(a.from_ms),
                    "to": weir_engine::time::format_rfc3339_ms(a.to_ms),
                })
            })
            .collect();
        let ledger = without_payloads(ledger, p.contract());
        let c = &p.contract().pipeline;
        pipelines.push(json!({
            "name": name,
            "version": live,
            "versions": versions,
            "owner": c.owner,
            "steward": c.steward,
            "decision": c.decision,
            "topic": p.contract().source.topic,
            "status": report(&app.log, &app.watch, name, p),
            "chart": weir_ops::watch::chart(&app.watch, name),
            "rows": rows,
            "ledger_latest": ledger,
            "annotations": notes,
            "backfills": backfills,
            "reconciliations": reconciliations,
            "checks": named,
        }));
    }
    incidents.sort_by_key(|i| std::cmp::Reverse(i.at_ms));
    // Not resolved first, then the newest.
    cases
        .sort_by_key(|c| (c.status == weir_store::incidents::IncidentStatus::Resolved, std::cmp::Reverse(c.opened_ms)));
    let cases: Vec<Value> = cases.iter().take(LATEST_INCIDENTS as usize).map(crate::incidents::describe).collect();
    let alerts: Vec<Value> = incidents
        .iter()
        .take(LATEST_INCIDENTS as usize)
        .filter_map(|i| serde_json::from_str(&i.notification).ok())
        .collect();
    let body = json!({
        "now": weir_engine::time::format_rfc3339_ms(weir_log::now_ms()),
        "pipelines": pipelines,
        "incidents": { "cases": cases, "alerts": alerts, "actions": audit },
    });
    Ok((
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-store"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body.to_string(),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dashboard_runs_only_its_own_script_and_style_and_cannot_be_framed() {
        let response = tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(page());
        let h = response.headers();
        let csp = h[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
        let script = &PAGE[PAGE.find("<script>").unwrap() + 8..PAGE.find("</script>").unwrap()];
        let style = &PAGE[PAGE.find("<style>").unwrap() + 7..PAGE.find("</style>").unwrap()];
        assert_eq!(PAGE.matches("<script").count(), 1, "one script, the one the policy names");
        assert_eq!(PAGE.matches("<style").count(), 1, "one style, the one the policy names");
        use base64::Engine as _;
        use sha2::Digest as _;
        let hash = |t: &str| base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(t.as_bytes()));
        assert!(csp.contains(&format!("script-src 'sha256-{}'", hash(script))), "{csp}");
        assert!(csp.contains(&format!("style-src 'sha256-{}'", hash(style))), "{csp}");
        assert!(csp.starts_with("default-src 'none';") && csp.contains("frame-ancestors 'none'"), "{csp}");
        assert_eq!(h[header::X_FRAME_OPTIONS], "DENY");
        assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        assert_eq!(h[header::REFERRER_POLICY], "no-referrer");
        assert_eq!(h["cross-origin-opener-policy"], "same-origin");
    }

    #[test]
    fn the_token_is_read_from_the_address_once_so_an_opener_cannot_swap_it() {
        assert!(!PAGE.contains("hashchange"), "a change of the address's fragment must not take a new token");
    }
}

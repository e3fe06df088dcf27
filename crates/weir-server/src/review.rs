//! `GET /v1/review?since=30d` and `weir review` (issue 18): the monthly
//! review of each pipeline the caller may read, from what its store keeps.
//!
//! - exceptions by cause: each ledger reason (entries ledgered in the
//!   period, every version) with its count and its materiality, the sum of
//!   each aggregated field the excluded events carried (for `count`, the
//!   events), read from the entries' payloads (an entry whose payload
//!   retention erased, or that was not JSON, is counted as unknown); and
//!   each named check that failed, with its failures;
//! - the incidents opened in the period or still not resolved, with the
//!   time to mitigation and to resolution;
//! - the drills run in the period, each with its verdict, the alerts that
//!   fired and how fast, and its recovery time;
//! - the lateness advice for the live version next to its setting;
//! - the versions promoted in the period.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::response::Response;
use axum::Extension;
use rust_decimal::Decimal;
use serde_json::{json, Value};
use weir_contract::{AggFn, Contract};
use weir_engine::time::format_rfc3339_ms;

use crate::app::*;

/// Ledger entries read in one page.
const PAGE: i64 = 10_000;
/// Incidents looked at (newest first).
const INCIDENTS: i64 = 10_000;

/// What the excluded events of one cause carried, per aggregate.
#[derive(Debug, Default)]
struct Cause {
    count: u64,
    /// Entries whose payload could not be read (erased by retention, or not JSON).
    unknown: u64,
    sums: BTreeMap<String, Decimal>,
}

/// A number as an aggregate reads it: a JSON number or a numeric string.
fn amount(v: &Value) -> Option<Decimal> {
    let text = match v {
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.trim().to_owned(),
        _ => return None,
    };
    text.parse::<Decimal>().ok().or_else(|| Decimal::from_scientific(&text).ok())
}

/// Adds one ledger entry to its cause.
fn add_entry(contract: &Contract, causes: &mut BTreeMap<String, Cause>, entry: &Value) {
    let reason = entry["reason"].as_str().unwrap_or("unknown");
    let cause = causes.entry(format!("ledger:{reason}")).or_default();
    cause.count += 1;
    let payload = entry["payload"].as_str().and_then(|p| serde_json::from_str::<Value>(p).ok());
    let Some(payload) = payload.filter(Value::is_object) else {
        cause.unknown += 1;
        return;
    };
    for a in &contract.aggregates {
        let carried = match (&a.func, &a.field) {
            (AggFn::Count, _) => Some(Decimal::ONE),
            (_, Some(field)) => {
                let mut v = &payload;
                for s in field.segments() {
                    v = &v[s.as_str()];
                }
                amount(v)
            }
            (_, None) => None,
        };
        if let Some(d) = carried {
            let sum = cause.sums.entry(a.name.clone()).or_default();
            *sum = sum.checked_add(d).unwrap_or(*sum);
        }
    }
}

/// One pipeline's review, read from its store (blocking).
fn pipeline_review(
    s: &dyn weir_store::Store,
    name: &str,
    contract: &Contract,
    (live, state_bytes): (u32, usize),
    (since_ms, now): (i64, i64),
) -> weir_store::Result<Value> {
    let versions = s.versions(name)?;
    let mut causes: BTreeMap<String, Cause> = BTreeMap::new();
    for v in &versions {
        let mut after = 0;
        loop {
            let page = s.ledger_dated(name, v.version, (since_ms, after, PAGE))?;
            for (_, _, text) in &page {
                if let Ok(entry) = serde_json::from_str::<Value>(text) {
                    add_entry(contract, &mut causes, &entry);
                }
            }
            match page.last() {
                Some((seq, _, _)) if page.len() as i64 == PAGE => after = *seq,
                _ => break,
            }
        }
    }
    let mut exceptions: Vec<Value> = causes
        .iter()
        .map(|(cause, c)| {
            let materiality: serde_json::Map<String, Value> =
                c.sums.iter().map(|(a, d)| (a.clone(), Value::String(d.normalize().to_string()))).collect();
            json!({"cause": cause, "count": c.count, "materiality": materiality, "materiality_unknown": c.unknown})
        })
        .collect();
    for v in &versions {
        for t in s.check_totals(name, v.version, since_ms)? {
            if t.failed > 0 {
                exceptions.push(json!({
                    "cause": format!("check:{}", t.check),
                    "version": v.version,
                    "count": t.failed,
                    "passed": t.passed,
                    "materiality": null,
                }));
            }
        }
    }
    exceptions.sort_by_key(|e| std::cmp::Reverse(e["count"].as_u64().unwrap_or(0)));
    let incidents: Vec<Value> = s
        .incidents(name, INCIDENTS)?
        .into_iter()
        .filter(|c| c.opened_ms >= since_ms || c.status != weir_store::incidents::IncidentStatus::Resolved)
        .map(|c| {
            let to_mitigation = c.mitigated_ms.or(c.resolved_ms).map(|t| t - c.opened_ms);
            json!({
                "id": c.id,
                "title": c.title,
                "cause": c.cause,
                "owner": c.owner,
                "status": c.status.as_str(),
                "opened": format_rfc3339_ms(c.opened_ms),
                "time_to_mitigation_ms": to_mitigation,
                "time_to_resolution_ms": c.resolved_ms.map(|t| t - c.opened_ms),
                "proof": c.proof,
            })
        })
        .collect();
    let promoted: Vec<Value> = versions
        .iter()
        .filter(|v| v.promoted_ms.is_some_and(|t| t >= since_ms))
        .map(|v| {
            json!({
                "version": v.version,
                "promoted": v.promoted_ms.map(format_rfc3339_ms),
                "promoted_by": v.promoted_by,
                "replaced": v.replaced,
                "state": v.state.as_str(),
            })
        })
        .collect();
    let drills: Vec<Value> = s
        .drills(name, None, INCIDENTS)?
        .iter()
        .filter(|d| d.started_ms >= since_ms)
        .map(|d| {
            let report = d.report.as_deref().and_then(|r| serde_json::from_str::<Value>(r).ok()).unwrap_or_default();
            json!({
                "id": d.id,
                "scenario": d.scenario,
                "started": format_rfc3339_ms(d.started_ms),
                "who": d.who,
                "verdict": d.verdict_now(now),
                "alerts": report["alerts"],
                "recovery_ms": report["recovery_ms"],
                "failures": report["failures"],
            })
        })
        .collect();
    let headers = s.checkpoint_headers(name, live)?;
    let lateness = match weir_ops::advice::observed(contract, &headers) {
        Ok(seen) => weir_ops::advice::advise(contract, &seen, state_bytes),
        Err(e) => json!({"error": e}),
    };
    let c = &contract.pipeline;
    Ok(json!({
        "pipeline": name,
        "live_version": live,
        "owner": c.owner,
        "steward": c.steward,
        "decision": c.decision,
        "exceptions": exceptions,
        "incidents": incidents,
        "drills": drills,
        "lateness": lateness,
        "versions_promoted": promoted,
        "at": format_rfc3339_ms(now),
    }))
}

/// `GET /v1/review?since=30d`: every pipeline the caller may read.
pub(crate) async fn review(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Result<Response, ApiError> {
    let since = q.get("since").map_or("30d", String::as_str);
    let period = weir_contract::parse_duration_ms(since)
        .map_err(|e| bad(format!("since={since:?}: {e}; write a duration such as 30d")))?;
    let now = weir_log::now_ms();
    let since_ms = now.saturating_sub(period);
    let names: Vec<String> = app.pipelines.keys().filter(|n| caller.grant.may_read(n)).cloned().collect();
    if names.is_empty() && !caller.grant.is_admin() {
        return Err(forbidden(&app, &caller, "read the review: it reads no pipeline"));
    }
    let mut pipelines = Vec::new();
    for name in names {
        let Some(p) = app.pipelines.get(&name) else { continue };
        let (live, v) = p.live();
        let contract = v.contract.clone();
        let state_bytes = weir_runtime::lock(&v.status).state_bytes;
        let n = name.clone();
        let one =
            read_stored(p, move |s| pipeline_review(s, &n, &contract, (live, state_bytes), (since_ms, now))).await?;
        pipelines.push(one);
    }
    Ok(json(json!({
        "since": format_rfc3339_ms(since_ms),
        "until": format_rfc3339_ms(now),
        "period": since,
        "pipelines": pipelines,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn materiality_sums_what_the_excluded_events_carried() {
        let text = "[pipeline]\nname = \"p\"\nversion = 1\nowner = \"o\"\nsteward = \"s\"\ndecision = \"d\"\n\
            [source]\ntopic = \"t\"\nevent_time = \"t\"\nkey = [\"k\"]\n\
            [window]\ntype = \"tumbling\"\nsize = \"1m\"\n\
            [[aggregate]]\nname = \"revenue\"\nfn = \"sum\"\nfield = \"amount.value\"\n\
            [[aggregate]]\nname = \"n\"\nfn = \"count\"\n";
        let c = Contract::parse("p.toml", text).unwrap();
        let mut causes = BTreeMap::new();
        for payload in [r#"{"amount":{"value":12.50}}"#, r#"{"amount":{"value":"0.25"}}"#, r#"{"amount":{}}"#] {
            add_entry(&c, &mut causes, &json!({"reason": "too_late", "payload": payload}));
        }
        add_entry(&c, &mut causes, &json!({"reason": "too_late"}));
        add_entry(&c, &mut causes, &json!({"reason": "malformed_json", "payload": "not json"}));
        let late = &causes["ledger:too_late"];
        assert_eq!((late.count, late.unknown), (4, 1));
        assert_eq!(late.sums["revenue"].to_string(), "12.75");
        assert_eq!(late.sums["n"], Decimal::from(3));
        assert_eq!((causes["ledger:malformed_json"].count, causes["ledger:malformed_json"].unknown), (1, 1));
    }
}

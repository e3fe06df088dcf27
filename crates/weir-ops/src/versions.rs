//! A pipeline's versions as the server follows them (SPEC.md 8): after a
//! promote or rollback its readers and reports switch at once; every second
//! the alert loop looks for candidates that caught up (their watermark
//! reached the live version's), tells the owner's and steward's webhook
//! with the diff's summary, and promotes those whose contract says
//! `promote = "auto"`. The decisions and the writes are the store's.
//!
//! In more detail: a pipeline's versions as the server follows them: after a
//! promote or rollback this server's readers and reports switch at once (other
//! workers within a checkpoint interval, when their runners read the store);
//! every second the alert loop finds candidates whose watermark reached the
//! live version's (announced once, with the diff's summary, to the alerts'
//! webhook and the incidents) and promotes those whose contract says `promote =
//! "auto"` (audited); the notification and its diff are written on a blocking
//! thread of their own and sent at a later tick, so a diff never holds up the
//! alerts, and a promote's answer does not wait for it. `crate::diff`:
//! two versions' rows compared on the time both cover (matched, differing,
//! missing windows; each aggregate's total per version in exact decimals; the
//! 20 largest differences), pure, by a merge of both versions' rows in the
//! store's order (window start, key bytes), read a page of 2,000 of each at a
//! time (`weir_store::ResultRows`) and parsed only for the fields compared, so
//! a diff's memory is two pages and 20 differences whatever the versions' sizes
//! (`Store::result_span` gives each version's first start and last end).

use std::sync::Arc;

use serde_json::{json, Value};
use weir_contract::Promote;
use weir_runtime::{lock, Pipeline};
use weir_store::{Act, Acted, Switch, VersionState};

use crate::Ops;

/// After a switch: this server's runners' states, until they read the store again.
pub fn switched(p: &Pipeline, switch: Switch) {
    if let Some(from) = switch.from.and_then(|v| p.versions.get(&v)) {
        lock(&from.status).version_state = Some(VersionState::Superseded);
    }
    if let Some(to) = p.versions.get(&switch.to) {
        lock(&to.status).version_state = Some(VersionState::Live);
    }
}

/// One stored version as `/versions` and the dashboard show it: its state,
/// contract hash, who started and promoted it and when, and, where this
/// server runs it, its watermark.
pub fn describe(p: &Pipeline, v: &weir_store::Version) -> Value {
    let time = |ms: Option<i64>| ms.map(weir_engine::time::format_rfc3339_ms);
    let run = p.versions.get(&v.version);
    let watermark = run.and_then(|run| lock(&run.status).watermark);
    json!({
        "version": v.version,
        "state": v.state,
        "contract_hash": v.contract_hash,
        "started": time(Some(v.started_ms)),
        "started_by": v.started_by,
        "promoted": time(v.promoted_ms),
        "promoted_by": v.promoted_by,
        "superseded": time(v.superseded_ms),
        "replaced": v.replaced,
        "runs_here": run.is_some(),
        "watermark": time(watermark),
    })
}

/// The rows of two versions compared (see `diff`), read from the store a
/// page of each at a time: its memory does not grow with the versions.
pub fn diff(p: &Pipeline, name: &str, a: u32, b: u32) -> weir_store::Result<Value> {
    let store = p.store.as_ref();
    let range = crate::diff::both_cover(store.result_span(name, a)?, store.result_span(name, b)?);
    let rows = |v: u32| weir_store::ResultRows::new(store, name, v, Default::default());
    crate::diff::compare(name, range, (a, rows(a)), (b, rows(b)))
}

/// A notification about versions for the owner's and steward's webhook:
/// `candidate_ready`, `promote` or `rollback`, with the diff's summary.
fn note(p: &Pipeline, name: &str, event: &str, switch: Switch) -> Value {
    let c = &p.contract().pipeline;
    let summary = match switch.from {
        Some(from) => match diff(p, name, from, switch.to) {
            Ok(d) => {
                json!({ "a": d["a"], "b": d["b"], "from": d["from"], "to": d["to"], "windows": d["windows"], "totals": d["totals"] })
            }
            Err(e) => json!({ "error": e.to_string() }),
        },
        None => Value::Null,
    };
    json!({
        "status": "version",
        "event": event,
        "pipeline": name,
        "from": switch.from,
        "to": switch.to,
        "owner": c.owner,
        "steward": c.steward,
        "decision": c.decision,
        "diff": summary,
        "at": weir_engine::time::format_rfc3339_ms(weir_log::now_ms()),
    })
}

/// Writes a notification about versions with its diff on a blocking
/// thread of its own, and queues it for the alert loop, which sends it at
/// its next tick. The caller does not wait: a diff of large versions takes
/// seconds, and neither a promote's answer nor the alerts wait for it.
pub fn notify(app: &Arc<Ops>, name: &str, event: &'static str, switch: Switch) {
    let (a, n) = (Arc::clone(app), name.to_owned());
    tokio::task::spawn_blocking(move || {
        if let Some(p) = a.pipelines.get(&n) {
            let note = note(p, &n, event, switch);
            lock(&a.versions).outbox.push((n, note));
        }
    });
}

/// Every second: candidates whose watermark reached the live version's are
/// announced once, and promoted when their contract says `promote = "auto"`
/// (their notifications are asked for in [`crate::VersionWatch::asked`]). Returns
/// the notifications written since, by pipeline.
pub fn check(app: &Ops) -> Vec<(String, Value)> {
    for (name, p) in &app.pipelines {
        if p.refused.is_some() {
            continue;
        }
        let (live, live_run) = p.live();
        let live_watermark = lock(&live_run.status).watermark;
        for (&version, run) in &p.versions {
            let (state, watermark, unsaved) = {
                let s = lock(&run.status);
                (s.version_state, s.watermark, s.unsaved)
            };
            let caught_up = match (watermark, live_watermark) {
                (Some(w), Some(l)) => w >= l,
                (Some(_), None) => true,
                _ => false,
            };
            // Ready once its rows are in the store: caught up, and nothing read since its last checkpoint.
            if state != Some(VersionState::Candidate) || !caught_up || unsaved {
                continue;
            }
            let switch = Switch { from: Some(live), to: version };
            let mut watch = lock(&app.versions);
            if watch.announced.insert((name.clone(), version)) {
                watch.asked.push((name.clone(), "candidate_ready", switch));
            }
            drop(watch);
            if run.contract.pipeline.promote == Promote::Auto {
                auto_promote(app, name, p, version);
            }
        }
    }
    std::mem::take(&mut lock(&app.versions).outbox)
}

/// Promotes a candidate with its audit entry: in one transaction where the
/// store keeps the audit log (SQLite); otherwise (Postgres) the entry is
/// written first, and a promote that cannot be audited does not happen.
fn auto_promote(app: &Ops, name: &str, p: &Pipeline, version: u32) {
    let (who, why) = ("weir (promote = \"auto\")", "the candidate's watermark reached the live version's");
    let act = Act::Switch { promote: Some(version), who: who.to_owned(), why: why.to_owned() };
    let entry = |detail| weir_store::audit::Entry {
        who,
        action: "promote",
        pipeline: Some(name),
        detail,
        why,
        origin: "weir serve",
    };
    let done = if p.store.keeps_audit_log() {
        p.store.act(name, &act, Some(&entry(&json!({}))))
    } else {
        let asked = json!({ "to": version, "outcome": "asked" });
        let seq = match app.sqlite.with(|c| weir_store::audit::append(c, &entry(&asked))) {
            Ok(seq) => seq,
            Err(e) => {
                eprintln!("weir: {name}: version {version} not promoted automatically: it could not be audited: {e}");
                return;
            }
        };
        let done = p.store.act(name, &act, None);
        let failure = match &done {
            Ok((Acted::Switched(Err(e)), _)) => Some(e.to_string()),
            Ok(_) => None,
            Err(e) => Some(e.to_string()),
        };
        if let Some(error) = failure {
            let detail = json!({ "action": "promote", "entry": seq, "error": error });
            let failed = weir_store::audit::Entry {
                action: "action-failed",
                detail: &detail,
                why: "the action audited in the entry named did not take effect",
                ..entry(&detail)
            };
            if let Err(e) = app.sqlite.with(|c| weir_store::audit::append(c, &failed)) {
                eprintln!("weir: {name}: the failed automatic promote of version {version} was not audited: {e}");
            }
        }
        done
    };
    match done {
        Ok((Acted::Switched(Ok((switch, _))), _)) => {
            p.bell.ring();
            switched(p, switch);
            eprintln!("weir: {name}: version {version} promoted automatically ({why})");
            lock(&app.versions).asked.push((name.to_owned(), "promote", switch));
        }
        Ok((Acted::Switched(Err(e)), _)) => {
            eprintln!("weir: {name}: version {version} not promoted automatically: {e}")
        }
        Ok((other, _)) => eprintln!("weir: {name}: version {version}: the store did {other:?}, not the promote"),
        Err(e) => eprintln!("weir: {name}: version {version} not promoted automatically: {e}"),
    }
}

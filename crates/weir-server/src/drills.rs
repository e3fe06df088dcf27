//! Failure drills (issue 18), the HTTP side: `POST /v1/pipelines/{name}/drills`
//! (an operator's, audited as `drill`: the ask checked, the pipeline's one
//! drill slot taken, the drill's thread started), `GET .../drills` and
//! `GET .../drills/{id}`. `drill_run` runs the drill.
//!
//! In more detail: `POST/GET /v1/pipelines/{p}/drills`, `GET .../drills/{id}`
//! (issue 18): an operator's drill checked (scenario, why, a running pipeline,
//! event times in the payload, events to copy, two partitions to delay one, one
//! drill at a time), kept as `running` with its audit entry (`Act::Drill`),
//! then run on a thread of its own by `weir_ops::drill_run`: the live
//! contract over a copy of what the scenario needs (the records appended within
//! the window's length and allowed lateness, or the dedup horizon if longer,
//! and at least each partition's last 64; everything for a global window:
//! `weir_runtime::drill::copy_since`; found by halving on the log's append
//! times, by `offsets_for_times` on Kafka) (each value under a `[privacy]
//! personal` field a pseudonym, `weir_runtime::drill::Pseudonyms`)
//! (`[reconcile]` dropped; its own consumer group on Kafka) with a store of its
//! own (a SQLite file under `DATA/drills/`, or the Postgres schema
//! `{schema}_drill_{id}`, its version registered live there); in a
//! `destination-down` drill a `DestinationRunner` per `[[destination]]` of the
//! contract, as an `http` destination to `weir_ops::stand_in` (a receiver on
//! 127.0.0.1 inside the server that answers 503 while the fault lasts and
//! applies each `Idempotency-Key` once), its position in the shadow's store,
//! its state in the shadow's `Report`, so no drill row reaches a real
//! destination; caught up, 3 s of steady traffic, the fault, then recovery; the
//! contract's `[alerts]` evaluated on the shadow's `Report` every half second
//! with the alert loop's own `alerts::checks`, each change sent to the webhook
//! marked `"drill"`; the live version's published rows digested before and
//! after; the verdict and report kept (`Store::finish_drill`); the copy and the
//! shadow's store removed. A shutdown stops drills (each sees `closing`,
//! removes its copy and store, and is joined); what a killed server's drill
//! left is removed at start (`remove_leftovers`: on the embedded log every
//! `TOPIC.drill-ID` topic and every file under `drills/`) and before each new
//! drill (`remove_ended`: the copies and stores of the pipeline's drills that
//! ended or whose lease ran out, on Kafka their topics and schemas, since other
//! workers may be drilling). A request dropped mid-way frees the pipeline's
//! drill slot (`Slot`); the steady phase's events are kept during that phase
//! only.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde_json::{json, Value};
use weir_contract::Contract;
use weir_engine::time::format_rfc3339_ms;
use weir_runtime::drill::{DrillLog, Scenario};
use weir_runtime::lock;
use weir_runtime::Pipeline;
use weir_store::{Act, Acted, DrillAsk};

use crate::app::*;
use weir_ops::drill_run::{drill, remove_ended, renew_lease, Plan};

#[derive(serde::Deserialize)]
struct Ask {
    scenario: Option<String>,
    why: Option<String>,
    who: Option<String>,
    /// How long the fault lasts (`delayed-partition`: the silence; `restart`:
    /// the time the pipeline is down; the others: how long the drill waits
    /// for an alert).
    #[serde(rename = "for")]
    fault: Option<String>,
    /// How long the drill waits for recovery after the fault.
    recover: Option<String>,
}

pub(crate) async fn ask(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let p = may_operate(&app, &caller, &name, "run a drill")?;
    let usage = "the body must be JSON like {\"scenario\":\"delayed-partition\",\"why\":\"...\",\"for\":\"30s\"}";
    let a: Ask = serde_json::from_slice(&body).map_err(|e| bad(format!("{usage}: {e}")))?;
    let scenario = Scenario::parse(a.scenario.as_deref().unwrap_or_default()).map_err(bad)?;
    let Some(why) = a.why.filter(|w| !w.trim().is_empty()) else {
        return Err(bad("say why: {\"why\":\"...\"} (it is kept in the audit log with the token that acted)"));
    };
    short_text("why", &why)?;
    let duration = |v: &Option<String>, key: &str| -> Result<Option<Duration>, ApiError> {
        match v {
            None => Ok(None),
            Some(text) => match weir_contract::parse_duration_ms(text) {
                Ok(ms) if (1..=600_000).contains(&ms) => Ok(Some(Duration::from_millis(ms as u64))),
                Ok(_) => Err(bad(format!("`{key}` must be between 1ms and 10m, not {text:?}"))),
                Err(e) => Err(bad(format!("`{key}`: {e}"))),
            },
        }
    };
    let (fault, recover) = (duration(&a.fault, "for")?, duration(&a.recover, "recover")?);
    if let Some(why) = &p.refused {
        return Err(ApiError(StatusCode::CONFLICT, format!("pipeline {name} does not run: {why}")));
    }
    let (version, live) = p.live();
    let contract = live.contract.clone();
    if let Some(why) = weir_runtime::drill::cannot_make_events(&contract) {
        return Err(ApiError(StatusCode::CONFLICT, format!("no drill can run on pipeline {name}: {why}")));
    }
    let dlog = drill_log(&app, p, &contract)?;
    let topic = contract.source.topic.clone();
    let ends = tokio::task::spawn_blocking(move || dlog.ends(&topic).map(|e| (e, dlog)))
        .await
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(|e| ApiError(StatusCode::SERVICE_UNAVAILABLE, format!("cannot read the topic's partitions: {e:#}")))?;
    let (ends, dlog) = ends;
    if ends.iter().all(|&e| e == 0) {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!("topic {} holds no events: a drill copies the topic and makes its events from the topic's own records; send some first", contract.source.topic),
        ));
    }
    if scenario == Scenario::DestinationDown && contract.destinations.is_empty() {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!("pipeline {name} has no [[destination]]: a destination-down drill rehearses its destinations' receivers refusing deliveries; add one to the contract, or pick another scenario"),
        ));
    }
    if scenario == Scenario::DelayedPartition && ends.len() < 2 {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!("topic {} has one partition: delaying it delays everything; a delayed-partition drill needs two or more", contract.source.topic),
        ));
    }
    {
        let mut running = lock(&app.drills);
        if let Some(id) = running.get(&name) {
            return Err(ApiError(
                StatusCode::CONFLICT,
                format!(
                    "drill {id} is running on pipeline {name}; GET /v1/pipelines/{name}/drills/{id} says when it ends"
                ),
            ));
        }
        running.insert(name.clone(), 0);
    }
    // A client that goes away mid-request drops this handler: the slot is freed then.
    let mut slot = Slot { app: Arc::clone(&app), pipeline: name.clone(), held: true };
    // What earlier drills left (a worker of this pipeline killed mid-drill) goes first.
    let (a2, n2, d2) = (Arc::clone(&app), name.clone(), dlog.clone());
    let _ = tokio::task::spawn_blocking(move || {
        if let Some(p) = a2.pipelines.get(&n2) {
            if let Err(e) = remove_ended(&a2, &n2, p, &d2) {
                eprintln!("weir: {n2}: drills' leftovers were not removed: {e:#}");
            }
        }
    })
    .await;
    let fault = fault.unwrap_or_else(|| default_fault(scenario, &contract));
    let recover = recover.unwrap_or(Duration::from_secs(60));
    let who = match a.who.filter(|w| !w.trim().is_empty()) {
        Some(w) => format!("{w} via {}", caller.grant.who()),
        None => caller.grant.who(),
    };
    let detail = json!({
        "scenario": scenario.name(),
        "version": version,
        "for": weir_contract::format_duration_ms(fault.as_millis() as i64),
        "recover": weir_contract::format_duration_ms(recover.as_millis() as i64),
    });
    let asked = DrillAsk { version, scenario: scenario.name().into(), who: who.clone(), why: why.clone() };
    let acted = act_audited(&app, p, &caller, &name, Act::Drill(asked), "drill", detail, why.clone()).await;
    let id = match acted {
        Ok((Acted::Drill { id }, _)) => id,
        Ok((other, _)) => {
            lock(&app.drills).remove(&name);
            return Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("the store did {other:?}, not the drill")));
        }
        Err(e) => {
            lock(&app.drills).remove(&name);
            return Err(e);
        }
    };
    lock(&app.drills).insert(name.clone(), id);
    let plan = Plan { id, pipeline: name.clone(), version, scenario, contract, fault, recover, who, why };
    let runtime = tokio::runtime::Handle::current();
    let thread_app = Arc::clone(&app);
    let spawned = std::thread::Builder::new().name(format!("weir-drill-{id}")).spawn(move || {
        let app = thread_app;
        let store = app.pipelines.get(&plan.pipeline).map(|p| Arc::clone(&p.store));
        let done = AtomicBool::new(false);
        let ran = std::thread::scope(|scope| {
            if let Some(store) = &store {
                scope.spawn(|| renew_lease(store.as_ref(), plan.id, &done));
            }
            // A panic fails the drill like an error, and frees the pipeline for the next one.
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drill(&app, &plan, &dlog, runtime)));
            done.store(true, Ordering::SeqCst);
            ran
        });
        let failed = |why: String| ("fail".to_owned(), json!({ "verdict": "fail", "failures": [why] }));
        let (verdict, report) = match ran {
            Ok(Ok(report)) => (report["verdict"].as_str().unwrap_or("fail").to_owned(), report),
            Ok(Err(e)) => failed(format!("the drill could not run: {e:#}")),
            Err(_) => failed("the drill's thread panicked (the server's standard error says where)".into()),
        };
        eprintln!("weir: drill {} ({}) on {}: {verdict}", plan.id, plan.scenario.name(), plan.pipeline);
        if let Some(p) = app.pipelines.get(&plan.pipeline) {
            if let Err(e) = p.store.finish_drill(plan.id, &verdict, &report.to_string()) {
                eprintln!("weir: drill {} not kept in the store ({e}): {report}", plan.id);
            }
        }
        lock(&app.drills).remove(&plan.pipeline);
    });
    let spawned = spawned.map(|thread| lock(&app.drill_threads).push(thread));
    // The drill's thread frees the slot when it ends (or the error below does).
    slot.held = false;
    if let Err(e) = spawned {
        lock(&app.drills).remove(&name);
        let report = json!({ "verdict": "fail", "failures": [format!("the drill's thread did not start: {e}")] });
        let _ = stored(p, move |s| s.finish_drill(id, "fail", &report.to_string())).await;
        return Err(ApiError(StatusCode::SERVICE_UNAVAILABLE, format!("the drill's thread did not start: {e}")));
    }
    let answer = json!({
        "pipeline": name,
        "drill": id,
        "scenario": scenario.name(),
        "verdict": "running",
        "url": format!("/v1/pipelines/{name}/drills/{id}"),
    });
    Ok((StatusCode::ACCEPTED, json(answer)).into_response())
}

pub(crate) async fn list(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let p = may_read(&app, &caller, &name)?;
    let pn = name.clone();
    let drills = read_stored(p, move |s| s.drills(&pn, None, 100)).await?;
    Ok(json(json!({ "pipeline": name, "drills": drills.iter().map(describe).collect::<Vec<_>>() })))
}

pub(crate) async fn one(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path((name, id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let p = may_read(&app, &caller, &name)?;
    let id: i64 = id.parse().map_err(|_| bad(format!("{id:?} is not a drill id; GET .../drills lists them")))?;
    let pn = name.clone();
    match read_stored(p, move |s| s.drills(&pn, Some(id), 1)).await?.first() {
        Some(d) => Ok(json(describe(d))),
        None => Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("pipeline {name:?} has no drill {id}; GET .../drills lists them"),
        )),
    }
}

/// A pipeline's drill slot taken by a request, freed when the request is
/// dropped before its drill's thread holds it.
struct Slot {
    app: Arc<App>,
    pipeline: String,
    held: bool,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.held {
            lock(&self.app.drills).remove(&self.pipeline);
        }
    }
}

/// A stored drill as the API shows it, its report inline; a running drill
/// whose lease ran out is `interrupted`.
fn describe(d: &weir_store::drills::Drill) -> Value {
    let verdict = d.verdict_now(weir_log::now_ms());
    let report = match d.report.as_deref() {
        Some(r) => serde_json::from_str::<Value>(r).ok(),
        None if verdict == "interrupted" => Some(json!({
            "verdict": verdict,
            "failures": ["the server running the drill stopped before it ended; its copy of the topic and its store may be left behind (drills/ in the data folder, or the schema ending _drill_ID)"],
        })),
        None => None,
    };
    json!({
        "id": d.id,
        "pipeline": d.pipeline,
        "version": d.version,
        "scenario": d.scenario,
        "who": d.who,
        "why": d.why,
        "started": format_rfc3339_ms(d.started_ms),
        "finished": d.finished_ms.map(format_rfc3339_ms),
        "verdict": verdict,
        "report": report,
    })
}

/// How long a fault lasts unless the operator says: a silence or an outage
/// long enough for the watermark's age or the destinations' lag to pass
/// its alert; otherwise 10 s.
fn default_fault(scenario: Scenario, contract: &Contract) -> Duration {
    let alerts = contract.alerts.as_ref();
    let past = |ms: i64, margin: i64| Duration::from_millis((ms + margin).clamp(5000, 600_000) as u64);
    match (scenario, alerts.and_then(|a| a.max_watermark_age_ms), alerts.and_then(|a| a.max_destination_lag_ms)) {
        (Scenario::DelayedPartition, Some(ms), _) => past(ms, 3000),
        // The outage also covers the copy, and a consumer group's join on Kafka.
        (Scenario::DestinationDown, _, Some(ms)) => past(ms, 6000),
        (Scenario::Restart, _, _) => Duration::from_secs(2),
        _ => Duration::from_secs(10),
    }
}

/// Where a drill copies the topic to: the embedded log, or the pipeline's Kafka.
pub(crate) fn drill_log(app: &App, p: &Pipeline, contract: &Contract) -> Result<DrillLog, ApiError> {
    if !p.on_kafka {
        return Ok(DrillLog::Embedded(app.log.clone()));
    }
    let no =
        |what: &str| ApiError(StatusCode::CONFLICT, format!("no drill can run: the pipeline reads Kafka but {what}"));
    let (brokers, _) = weir_runtime::kafka::source_of(contract, &app.config).ok_or_else(|| no("names no brokers"))?;
    let producer =
        app.producers.get(&contract.source.topic).cloned().ok_or_else(|| no("this server has no producer for it"))?;
    Ok(DrillLog::Kafka {
        brokers,
        config: Arc::clone(&app.config),
        producer,
        runtime: tokio::runtime::Handle::current(),
    })
}

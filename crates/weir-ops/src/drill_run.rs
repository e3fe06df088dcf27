//! Failure drills (issue 18), the running of one (`weir-server::drills` is
//! the HTTP side).
//!
//! A drill rehearses one failure on a shadow of the pipeline (see
//! `weir_runtime::drill`): the live contract, reading a copy of its topic,
//! publishing to a store of its own. The drill's thread steps the shadow's
//! runner and, every half second, evaluates the contract's `[alerts]`
//! against the shadow's status as the alert loop evaluates the live
//! version's; each alert that fires or resolves goes to the alerts' webhook
//! marked `"drill"`, and opens no incident. Its phases:
//!
//! 1. **copy**: the records the topic holds that can still change a
//!    window or meet a duplicate (appended within the window's length and
//!    allowed lateness, or the dedup horizon if longer; everything for a
//!    global window; at least the last 64 of each partition, which the
//!    drill's events are made from; `weir_runtime::drill::copy_since`) are
//!    copied, their personal fields replaced by pseudonyms
//!    (`weir_runtime::drill::Pseudonyms`), and the shadow catches up with
//!    them;
//! 2. **steady**: 3 s of one fresh event per partition every 200 ms (the
//!    topic's last records with the time now and a new id); the alerts
//!    firing at its end were firing before the fault (a `destination-down`
//!    outage begins before the copy instead, so that the rows the copy
//!    publishes wait for the receiver, and has no steady phase);
//! 3. **fault** (`for`): the scenario's failure: partition 0 silent, then
//!    a burst of what it held back (`delayed-partition`); the steady phase's
//!    events sent again (`duplicates`); 20 events a partition dated beyond
//!    the allowed lateness (`late-burst`) or a year ahead (`clock-skew`);
//!    the shadow killed without a last checkpoint while events keep coming,
//!    then started again (`restart`); every destination's receiver
//!    answering `503` (`destination-down`: the shadow's destinations deliver
//!    to a stand-in receiver inside the server, never to the real ones,
//!    so that no drill row reaches a destination; see `stand_in`);
//! 4. **recovery** (at most `recover`): steady events until the shadow has
//!    read everything, its destinations have delivered everything, and
//!    every alert the fault fired on the pipeline's state has resolved (`max_ledger_rate`, a rate over the last minute,
//!    is reported as it goes, not waited for).
//!
//! The report says which alerts fired and how long after the fault began,
//! which ledger reasons grew, whether the live version's published rows
//! stayed as they were (a digest before and after, and whether its topic
//! grew meanwhile), and how long recovery took. The verdict is `fail`
//! when none of the alerts that would notice the scenario fired during
//! the fault (or the contract has none), when the live rows changed while
//! its topic did not grow, or when a restart did not recover.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use weir_contract::{Connection, Contract, Destination, DestinationKind, WindowKind};
use weir_engine::time::format_rfc3339_ms;
use weir_runtime::destination::{DestinationRunner, DestinationStatus};
use weir_runtime::drill::{copy_topic, event_like, Copied, DrillLog, Scenario, Shadow};
use weir_runtime::runner::{Connected, Runner};
use weir_runtime::{Pipeline, PipelineVersion, Status};
use weir_store::{FileContract, Store};

use crate::stand_in::StandIn;
use crate::Ops;

const STEADY: Duration = Duration::from_secs(3);
const TICK: Duration = Duration::from_millis(200);
const SAMPLE: Duration = Duration::from_millis(500);
/// Events a partition of a `late-burst` or `clock-skew`.
const BURST: usize = 20;

/// What the drill's thread is given.
pub struct Plan {
    pub id: i64,
    pub pipeline: String,
    pub version: u32,
    pub scenario: Scenario,
    pub contract: Contract,
    pub fault: Duration,
    pub recover: Duration,
    pub who: String,
    pub why: String,
}

/// Removes what drills left behind: a server stopped mid-drill (a kill, a
/// crash) leaves the copy of the topic and the shadow's store. At start,
/// before the server serves: on the embedded log no drill runs before this
/// server starts one, so every copy topic (`TOPIC.drill-ID`) and every
/// file under `drills/` goes; on Kafka, other workers may be running
/// drills, so only what drills that ended or whose lease ran out left
/// ([`remove_ended`]), which is also done before each new drill, through
/// the log `dlog_of` gives for the pipeline.
pub fn remove_leftovers(app: &Ops, dlog_of: &dyn Fn(&Pipeline) -> Result<DrillLog, String>) {
    for (name, p) in &app.pipelines {
        if !p.on_kafka {
            let topic = &p.contract().source.topic;
            for copy in app.log.topics().into_iter().filter(|t| is_copy_of(t, topic)) {
                if let Err(e) = app.log.remove_topic(&copy) {
                    eprintln!("weir: a drill's leftover topic {copy} was not removed: {e}");
                }
            }
        } else {
            let removed =
                dlog_of(p).map_err(weir_runtime::Error::Refused).and_then(|dlog| remove_ended(app, name, p, &dlog));
            if let Err(e) = removed {
                eprintln!("weir: {name}: drills' leftovers were not removed: {e:#}");
            }
        }
    }
    for file in std::fs::read_dir(app.data.join("drills")).into_iter().flatten().flatten() {
        if let Err(e) = std::fs::remove_file(file.path()) {
            eprintln!("weir: a drill's leftover file {} was not removed: {e}", file.path().display());
        }
    }
}

/// Removes the copies and shadow stores of the pipeline's drills that are
/// not running (ended, or their lease ran out): on the embedded log their
/// copy topics and `drills/drill-ID.db`, on Kafka their topics and
/// schemas `SCHEMA_drill_ID`, through `dlog`, the pipeline's log.
pub fn remove_ended(app: &Ops, name: &str, p: &Pipeline, dlog: &DrillLog) -> weir_runtime::Result<()> {
    let topic = p.contract().source.topic.clone();
    let now = weir_log::now_ms();
    let drills = p.store.drills(name, None, i64::MAX)?;
    let ended: Vec<i64> = drills.iter().filter(|d| d.verdict_now(now) != "running").map(|d| d.id).collect();
    if !p.on_kafka {
        let topics = app.log.topics();
        for id in ended {
            let copy = copy_topic(&topic, id);
            if topics.contains(&copy) {
                app.log.remove_topic(&copy)?;
            }
            for suffix in ["", "-wal", "-shm"] {
                let file = app.data.join("drills").join(format!("drill-{id}.db{suffix}"));
                if file.exists() {
                    std::fs::remove_file(&file)?;
                }
            }
        }
        return Ok(());
    }
    let Some(pg) = &app.config.postgres else { return Ok(()) };
    let mut client = weir_store::pg::connect(&pg.url)?;
    let pattern = format!("{}\\_drill\\_%", pg.schema);
    let schemas: Vec<String> = client
        .query("SELECT schema_name::text FROM information_schema.schemata WHERE schema_name LIKE $1", &[&pattern])?
        .iter()
        .map(|r| r.get(0))
        .collect();
    for id in ended {
        let schema = format!("{}_drill_{id}", pg.schema);
        if schemas.contains(&schema) {
            client.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))?;
            // The topic goes with its schema (a topic already gone is no error here).
            let _ = dlog.remove(&copy_topic(&topic, id));
        }
    }
    Ok(())
}

/// Whether `name` is a drill's copy of `topic` (`TOPIC.drill-ID`).
pub fn is_copy_of(name: &str, topic: &str) -> bool {
    name.strip_prefix(topic)
        .and_then(|rest| rest.strip_prefix(".drill-"))
        .is_some_and(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
}

/// Renews the drill's lease until `done`, so that readers on any server
/// can tell a running drill from one whose server stopped.
pub fn renew_lease(store: &dyn Store, id: i64, done: &AtomicBool) {
    let every = Duration::from_millis(weir_store::drills::LEASE_MS as u64 / 3);
    let mut last = Instant::now();
    while !done.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(100));
        if last.elapsed() >= every {
            last = Instant::now();
            if let Err(e) = store.renew_drill(id) {
                eprintln!("weir: drill {id}: its lease was not renewed ({e})");
            }
        }
    }
}

/// The shadow's store: made, its version registered as live, and how to remove it.
struct ShadowStore {
    store: Arc<dyn weir_store::Store>,
    connect: Box<dyn FnMut() -> weir_runtime::Result<Connected> + Send>,
    remove: Box<dyn FnOnce() -> weir_runtime::Result<()> + Send>,
}

fn shadow_store(
    app: &Ops,
    plan: &Plan,
    contract: &Contract,
    runtime: &tokio::runtime::Handle,
) -> weir_runtime::Result<ShadowStore> {
    let id = plan.id;
    let file = FileContract {
        version: contract.pipeline.version,
        hash: contract.text_hash,
        bytes_hash: contract.bytes_hash(),
        text: &contract.text,
    };
    let p = app.pipelines.get(&plan.pipeline).ok_or_else(|| weir_runtime::refused!("no pipeline {}", plan.pipeline))?;
    if !p.on_kafka {
        let dir = app.data.join("drills");
        weir_log::create_private_dir(&dir)?;
        let db = dir.join(format!("drill-{id}.db"));
        weir_store::sqlite::migrate(&weir_store::sqlite::open(&db)?)?;
        let store = Arc::new(weir_store::SqliteStore::new(db.clone(), 2));
        store.register_version(&plan.pipeline, file, &format!("drill {id}"))?;
        let (c, log, path, rt) = (contract.clone(), app.log.clone(), db.clone(), runtime.clone());
        let connect = Box::new(move || weir_runtime::embedded::connect(&c, &log, &path, Some(rt.clone())));
        let remove = Box::new(move || -> weir_runtime::Result<()> {
            for suffix in ["", "-wal", "-shm"] {
                let f = std::path::PathBuf::from(format!("{}{suffix}", db.display()));
                if f.exists() {
                    std::fs::remove_file(&f)?;
                }
            }
            Ok(())
        });
        return Ok(ShadowStore { store, connect, remove });
    }
    let Some(pg) = app.config.postgres.clone() else {
        weir_runtime::bail!("the pipeline reads Kafka without [postgres]")
    };
    let Some((brokers, _)) = weir_runtime::kafka::source_of(contract, &app.config) else {
        weir_runtime::bail!("the pipeline reads Kafka without brokers")
    };
    let mut shadow_pg = pg.clone();
    shadow_pg.schema = format!("{}_drill_{id}", pg.schema);
    let mut client = weir_store::pg::connect(&pg.url)?;
    weir_store::pg::migrate(&mut client, &shadow_pg.schema)?;
    let store = Arc::new(weir_store::PostgresStore::new(shadow_pg.url.clone(), shadow_pg.schema.clone(), 2));
    store.register_version(&plan.pipeline, file, &format!("drill {id}"))?;
    let group = contract.source.group.clone().unwrap_or_default();
    let worker = format!("weir-drill-{}-{id}", std::process::id());
    let (c, cfg, spg) = (contract.clone(), Arc::clone(&app.config), shadow_pg.clone());
    let connect = Box::new(move || weir_runtime::kafka::connect(&c, &cfg, &spg, (&brokers, &group), &worker));
    let (url, schema) = (pg.url.clone(), shadow_pg.schema.clone());
    let remove = Box::new(move || -> weir_runtime::Result<()> {
        let mut client = weir_store::pg::connect(&url)?;
        client.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))?;
        Ok(())
    });
    Ok(ShadowStore { store, connect, remove })
}

/// The live version's published rows, as one digest and a count.
fn published(p: &Pipeline, name: &str, version: u32) -> weir_runtime::Result<(String, u64)> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut filter = weir_store::ResultFilter { limit: 10_000, ..Default::default() };
    let mut rows = 0u64;
    loop {
        let page = p.store.results(name, version, &filter)?;
        for r in &page.rows {
            r.hash(&mut h);
        }
        rows += page.rows.len() as u64;
        match page.places.last() {
            Some(last) if page.rows.len() as i64 == filter.limit => filter.after = Some(last.clone()),
            _ => break,
        }
    }
    Ok((format!("{:016x}", h.finish()), rows))
}

/// One alert's course during the drill.
#[derive(Debug, Clone)]
struct Course {
    alert: &'static str,
    threshold: String,
    observed: String,
    fired_ms: i64,
    resolved_ms: Option<i64>,
}

/// The contract's alerts evaluated on the shadow, as the alert loop evaluates them.
struct Alerting {
    history: VecDeque<(Instant, u64, u64)>,
    firing: BTreeMap<&'static str, Course>,
    courses: Vec<Course>,
}

impl Alerting {
    fn sample(&mut self, app: &Ops, plan: &Plan, status: &crate::report::Report, now: i64) {
        let (read, ledger) = (status.events.read, status.ledgered());
        self.history.push_back((Instant::now(), read, ledger));
        while self.history.len() > 2
            && self.history.front().is_some_and(|(t, _, _)| t.elapsed() > Duration::from_secs(60))
        {
            self.history.pop_front();
        }
        let rate = match (self.history.front(), self.history.back()) {
            (Some(&(_, r0, l0)), Some(&(_, r1, l1))) => crate::alerts::ledger_rate((r0, l0), (r1, l1)),
            _ => None,
        };
        let no_alerts = weir_contract::Alerts::default();
        let alerts = plan.contract.alerts.as_ref().unwrap_or(&no_alerts);
        let webhook = alerts.webhook.clone().or_else(|| app.config.alert_webhook.clone());
        for c in crate::alerts::checks(alerts, status, rate, None, 0) {
            let over = c.observed > c.threshold;
            let change = match (over, self.firing.contains_key(c.alert)) {
                (true, false) => {
                    let course = Course {
                        alert: c.alert,
                        threshold: (c.show)(c.threshold),
                        observed: (c.show)(c.observed),
                        fired_ms: now,
                        resolved_ms: None,
                    };
                    self.firing.insert(c.alert, course);
                    "firing"
                }
                (false, true) => {
                    if let Some(mut course) = self.firing.remove(c.alert) {
                        course.resolved_ms = Some(now);
                        self.courses.push(course);
                    }
                    "resolved"
                }
                _ => continue,
            };
            let since = self.firing.get(c.alert).map_or(now, |f| f.fired_ms);
            let mut note =
                crate::alerts::notification(change, &c, (&plan.pipeline, &plan.contract.pipeline), since, now);
            note["drill"] = json!({ "id": plan.id, "scenario": plan.scenario.name() });
            eprintln!(
                "weir: drill {} alert {change}: {} {} observed {}",
                plan.id,
                plan.pipeline,
                c.alert,
                (c.show)(c.observed)
            );
            if let Some(url) = &webhook {
                crate::alerts::notify(app, url, note);
            }
        }
    }

    /// Every course, those still firing last.
    fn all(&self) -> Vec<Course> {
        self.courses.iter().chain(self.firing.values()).cloned().collect()
    }
}

/// The shadow with what the drill needs around it.
struct Drilling<'a> {
    app: &'a Ops,
    plan: &'a Plan,
    dlog: &'a DrillLog,
    copy: String,
    shadow: Shadow,
    pipeline: Pipeline,
    templates: Vec<Copied>,
    alerting: Alerting,
    sent: u64,
    last_tick: Instant,
    last_sample: Instant,
    /// The steady phase's events, for `duplicates`.
    /// The steady phase's events (the `duplicates` fault sends them again);
    /// kept while `keeping` only, so a long recovery does not grow them.
    steady_events: Vec<Copied>,
    keeping: bool,
    /// What a delayed partition held back.
    held: Vec<Copied>,
    /// The shadow's destinations (`destination-down`), delivering to a stand-in.
    destinations: Option<Delivering>,
}

/// The shadow's destinations: a delivery thread each, to one stand-in receiver.
struct Delivering {
    stand_in: StandIn,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Delivering {
    /// A delivery thread for each of the contract's destinations, as an
    /// `http` destination of the same name and batch to the stand-in, with
    /// its position in the shadow's store.
    fn start(
        plan: &Plan,
        contract: &Contract,
        store: &Arc<dyn Store>,
        bell: &Arc<weir_runtime::bell::Bell>,
        runtime: &tokio::runtime::Handle,
    ) -> weir_runtime::Result<(Delivering, Vec<Arc<Mutex<DestinationStatus>>>)> {
        let stand_in = StandIn::start(runtime)?;
        let stop = Arc::new(AtomicBool::new(false));
        let (mut threads, mut statuses) = (Vec::new(), Vec::new());
        for d in &contract.destinations {
            let status = Arc::new(Mutex::new(DestinationStatus {
                name: d.name.clone(),
                kind: DestinationKind::Http.as_str().into(),
                state: "starting".into(),
                ..Default::default()
            }));
            let runner = DestinationRunner {
                pipeline: plan.pipeline.clone(),
                owner: contract.pipeline.owner.clone(),
                destination: Destination { kind: DestinationKind::Http, connection: Some("drill".into()), ..d.clone() },
                connection: Connection { url: stand_in.url(&d.name), headers: BTreeMap::new(), allow_private: true },
                contracts: BTreeMap::from([(contract.pipeline.version, contract.clone())]),
                declared_by: contract.pipeline.version,
                store: Arc::clone(store),
                exclusive: None,
                kafka: None,
                status: Arc::clone(&status),
                stop: Arc::clone(&stop),
                bell: Arc::clone(bell),
            };
            let thread = std::thread::Builder::new().name(format!("weir-drill-{}-{}", plan.id, d.name));
            threads.push(thread.spawn(move || runner.run())?);
            statuses.push(status);
        }
        Ok((Delivering { stand_in, stop, threads }, statuses))
    }

    fn close(self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

impl Drilling<'_> {
    fn report(&self) -> crate::report::Report {
        let (version, v) = self.pipeline.live();
        crate::report::report_version(&self.app.log, &self.app.watch, &self.plan.pipeline, &self.pipeline, (version, v))
    }

    fn event(&mut self, template: &Copied, time_ms: i64) -> weir_runtime::Result<Copied> {
        self.sent += 1;
        let id = format!("drill-{}-{}", self.plan.id, self.sent);
        let payload = event_like(&self.plan.contract, &template.payload, time_ms, Some(&id))
            .map_err(weir_runtime::Error::Refused)?;
        Ok(Copied { partition: template.partition, key: template.key.clone(), timestamp_ms: None, payload })
    }

    /// Steps the shadow (unless `down`) for `d` or until `until` says,
    /// sending the traffic asked every tick and sampling the alerts.
    fn run_for(
        &mut self,
        d: Duration,
        traffic: Traffic,
        down: bool,
        until: &dyn Fn(&Self) -> bool,
    ) -> weir_runtime::Result<bool> {
        let end = Instant::now() + d;
        let silent = match traffic {
            Traffic::AllBut(p) => Some(p),
            _ => None,
        };
        while Instant::now() < end {
            if *self.app.closing.borrow() {
                weir_runtime::bail!(
                    "the server stopped during the drill; its copy of the topic and its store were removed"
                );
            }
            if traffic != Traffic::None && self.last_tick.elapsed() >= TICK {
                self.last_tick = Instant::now();
                let now = weir_log::now_ms();
                let mut batch = Vec::new();
                for t in self.templates.clone() {
                    let e = self.event(&t, now)?;
                    if Some(t.partition) == silent {
                        self.held.push(e);
                    } else {
                        batch.push(e);
                    }
                }
                self.dlog.append(&self.copy, &batch)?;
                if self.keeping {
                    self.steady_events.extend(batch);
                }
            }
            if down {
                std::thread::sleep(Duration::from_millis(20));
            } else {
                self.shadow.step(Duration::from_millis(20));
            }
            if self.last_sample.elapsed() >= SAMPLE {
                self.last_sample = Instant::now();
                let r = self.report();
                self.alerting.sample(self.app, self.plan, &r, weir_log::now_ms());
                if until(self) {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// Whether the shadow runs, has read every record of its topic, and
    /// (if asked) its destinations have delivered every change.
    fn caught_up(&self, with_destinations: bool) -> bool {
        if !self.shadow.running() {
            return false;
        }
        let Ok(ends) = self.dlog.ends(&self.copy) else { return false };
        let r = self.report();
        let read: BTreeMap<u32, u64> = r.partitions.iter().map(|p| (p.partition, p.next_offset)).collect();
        r.failed.is_none()
            && ends.iter().enumerate().all(|(p, &end)| end == 0 || read.get(&(p as u32)).is_some_and(|&n| n >= end))
            && (!with_destinations || r.destinations.iter().all(|d| d.state == "caught up" && d.lag_changes == 0))
    }
}

/// What the drill sends every tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Traffic {
    None,
    All,
    /// Every partition but this one, whose events are held back.
    AllBut(u32),
}

pub fn drill(app: &Ops, plan: &Plan, dlog: &DrillLog, runtime: tokio::runtime::Handle) -> weir_runtime::Result<Value> {
    let p = app.pipelines.get(&plan.pipeline).ok_or_else(|| weir_runtime::refused!("no pipeline {}", plan.pipeline))?;
    let copy = copy_topic(&plan.contract.source.topic, plan.id);
    let live_ends_before = dlog.ends(&plan.contract.source.topic)?;
    let before = published(p, &plan.pipeline, plan.version)?;
    let pseudonyms = weir_runtime::drill::Pseudonyms::new(&plan.contract);
    let since = weir_runtime::drill::copy_since(&plan.contract, weir_log::now_ms());
    let (recent, copied) = dlog.copy(&plan.contract.source.topic, &copy, &pseudonyms, since)?;
    let templates = weir_runtime::drill::pick_templates(&plan.contract, &recent, live_ends_before.len() as u32);
    if templates.is_empty() {
        let _ = dlog.remove(&copy);
        weir_runtime::bail!(
            "none of the last {} records of any partition of {} counts under the contract: a drill makes its events from them",
            weir_runtime::drill::RECENT,
            plan.contract.source.topic
        );
    }
    if plan.scenario == Scenario::DelayedPartition && !templates.iter().any(|t| t.partition == 0) {
        let _ = dlog.remove(&copy);
        weir_runtime::bail!(
            "partition 0 of {} has no recent event that counts: nothing to delay",
            plan.contract.source.topic
        );
    }
    let mut contract = plan.contract.clone();
    contract.source.topic = copy.clone();
    contract.reconcile = None;
    if p.on_kafka {
        contract.source.group = Some(format!("weir-drill-{}", plan.id));
    }
    let made = shadow_store(app, plan, &contract, &runtime);
    let ShadowStore { store, connect, remove } = match made {
        Ok(s) => s,
        Err(e) => {
            let _ = dlog.remove(&copy);
            return Err(e);
        }
    };
    let bell: Arc<weir_runtime::bell::Bell> = Arc::default();
    let (destinations, statuses) = if plan.scenario == Scenario::DestinationDown {
        match Delivering::start(plan, &contract, &store, &bell, &runtime) {
            Ok((d, statuses)) => (Some(d), statuses),
            Err(e) => {
                let _ = dlog.remove(&copy);
                let _ = remove();
                return Err(e);
            }
        }
    } else {
        (None, Vec::new())
    };
    let status = Arc::new(Mutex::new(Status::default()));
    let runner = Runner {
        contract: contract.clone(),
        config: Arc::clone(&app.config),
        status: Arc::clone(&status),
        stop: Arc::new(AtomicBool::new(false)),
        paused: Arc::new(AtomicBool::new(false)),
        read_records: 1024,
        bell: Arc::clone(&bell),
    };
    let version = contract.pipeline.version;
    let mut versions = BTreeMap::new();
    versions.insert(version, PipelineVersion { contract: contract.clone(), status });
    let pipeline = Pipeline {
        versions,
        on_kafka: p.on_kafka,
        paused: Arc::new(AtomicBool::new(false)),
        store,
        refused: None,
        bell,
        destinations: statuses,
    };
    let mut d = Drilling {
        app,
        plan,
        dlog,
        copy: copy.clone(),
        shadow: Shadow::new(runner, connect),
        pipeline,
        templates,
        alerting: Alerting { history: VecDeque::new(), firing: BTreeMap::new(), courses: Vec::new() },
        sent: 0,
        last_tick: Instant::now(),
        last_sample: Instant::now(),
        steady_events: Vec::new(),
        keeping: false,
        held: Vec::new(),
        destinations,
    };
    let outcome = exercise(&mut d, copied, before, live_ends_before);
    if let Some(destinations) = d.destinations.take() {
        destinations.close();
    }
    d.shadow.close();
    if let Err(e) = dlog.remove(&copy) {
        eprintln!("weir: drill {}: the copy {copy} was not removed: {e:#}", plan.id);
    }
    if let Err(e) = remove() {
        eprintln!("weir: drill {}: the shadow's store was not removed: {e:#}", plan.id);
    }
    outcome
}

/// The drill's phases on a ready shadow; the report.
fn exercise(
    d: &mut Drilling<'_>,
    copied: u64,
    before: (String, u64),
    live_ends_before: Vec<u64>,
) -> weir_runtime::Result<Value> {
    let (plan, app) = (d.plan, d.app);
    let started = Instant::now();
    // A destination's outage begins before the copy, so that the rows the
    // copy publishes pile up: a contract without `early` publishes only when
    // a window closes, which the steady phase's events seldom do.
    let receiver = d.destinations.as_ref().map(|s| Arc::clone(&s.stand_in.received));
    let outage_start = match &receiver {
        Some(r) if plan.scenario == Scenario::DestinationDown => {
            r.down.store(true, Ordering::SeqCst);
            Some(weir_log::now_ms())
        }
        _ => None,
    };
    let ledger_at_start = d.report().ledger;
    // 1. copy: the shadow reads what was copied (and its destinations deliver it, unless down).
    let down = outage_start.is_some();
    let caught = d.run_for(Duration::from_secs(300), Traffic::None, false, &|d| d.caught_up(!down))?;
    if !caught {
        weir_runtime::bail!("the shadow did not read the {copied} copied events within 5 minutes");
    }
    // 2. steady traffic (before any fault but an outage that began with the copy).
    if !down {
        d.steady_events.clear();
        d.keeping = true;
        d.run_for(STEADY, Traffic::All, false, &|_| false)?;
        d.keeping = false;
    }
    // What an outage fired during the copy is the fault's.
    let firing_before: BTreeSet<&'static str> =
        if down { BTreeSet::new() } else { d.alerting.firing.keys().copied().collect() };
    let ledger_before = if down { ledger_at_start } else { d.report().ledger };
    // 3. the fault.
    let fault_start = outage_start.unwrap_or_else(weir_log::now_ms);
    let expected: Vec<&'static str> =
        plan.scenario.alerts().iter().copied().filter(|a| configured(&plan.contract, a)).collect();
    let fired_expected =
        |d: &Drilling<'_>| d.alerting.all().iter().any(|c| c.fired_ms >= fault_start && expected.contains(&c.alert));
    let mut described;
    match plan.scenario {
        Scenario::DelayedPartition => {
            d.run_for(plan.fault, Traffic::AllBut(0), false, &|_| false)?;
            let burst = std::mem::take(&mut d.held);
            described = format!(
                "partition 0 silent for {}, then a burst of the {} events it held back",
                weir_contract::format_duration_ms(plan.fault.as_millis() as i64),
                burst.len()
            );
            d.dlog.append(&d.copy, &burst)?;
        }
        Scenario::Duplicates => {
            let again = std::mem::take(&mut d.steady_events);
            described = format!("the {} events of the steady phase sent again", again.len());
            d.dlog.append(&d.copy, &again)?;
            d.run_for(plan.fault, Traffic::All, false, &fired_expected)?;
        }
        Scenario::LateBurst | Scenario::ClockSkew => {
            let at = if plan.scenario == Scenario::LateBurst {
                let watermark = d.report().watermark_ms.unwrap_or_else(weir_log::now_ms);
                let window = match plan.contract.window.kind {
                    WindowKind::Tumbling { size_ms } | WindowKind::Hopping { size_ms, .. } => size_ms,
                    WindowKind::Session { gap_ms } => gap_ms,
                    WindowKind::Global => 0,
                };
                watermark - plan.contract.window.allowed_lateness_ms - 2 * window - 60_000
            } else {
                weir_log::now_ms() + plan.contract.source.max_future_ms.unwrap_or(0) + 365 * 86_400_000
            };
            let mut burst = Vec::new();
            for t in d.templates.clone() {
                for _ in 0..BURST {
                    burst.push(d.event(&t, at)?);
                }
            }
            described = format!("{} events dated {}", burst.len(), format_rfc3339_ms(at));
            d.dlog.append(&d.copy, &burst)?;
            d.run_for(plan.fault, Traffic::All, false, &fired_expected)?;
        }
        Scenario::Restart => {
            d.shadow.kill();
            described = format!(
                "the pipeline killed without a last checkpoint, down for {} while events kept coming",
                weir_contract::format_duration_ms(plan.fault.as_millis() as i64)
            );
            d.run_for(plan.fault, Traffic::All, true, &|_| false)?;
        }
        Scenario::DestinationDown => {
            let received = receiver.ok_or_else(|| weir_runtime::refused!("the shadow has no destinations"))?;
            let so_far = Duration::from_millis((weir_log::now_ms() - fault_start).max(0) as u64);
            d.run_for(plan.fault.saturating_sub(so_far), Traffic::All, false, &|_| false)?;
            received.down.store(false, Ordering::SeqCst);
            let refused = received.refused.load(Ordering::SeqCst);
            described = format!(
                "every destination's receiver answered 503 for {}, from the start of the copy, while events kept coming ({refused} deliveries refused)",
                weir_contract::format_duration_ms(plan.fault.max(so_far).as_millis() as i64),
            );
            if refused == 0 {
                described.push_str("; no change was published meanwhile, so none waited: without `early = true` a window publishes when it closes");
            }
        }
    }
    let fault_end = weir_log::now_ms();
    // 4. recovery: caught up, and every alert on the pipeline's state that
    // the fault fired resolved (the ledger rate is a rate over the last
    // minute: it is reported, not waited for).
    let recovered = d.run_for(plan.recover, Traffic::All, false, &|d| {
        d.caught_up(true) && d.alerting.firing.keys().all(|a| firing_before.contains(a) || *a == "max_ledger_rate")
    })?;
    let recovery_ms = recovered.then(|| weir_log::now_ms() - fault_end);
    if let Some(f) = &d.shadow.failed {
        described.push_str(&format!("; the shadow's last failure: {f}"));
    }
    let report = d.report();
    let ledger: BTreeMap<&str, u64> = report
        .ledger
        .iter()
        .filter_map(|(reason, n)| {
            let grown = n.saturating_sub(ledger_before.get(reason).copied().unwrap_or(0));
            (grown > 0).then_some((*reason, grown))
        })
        .collect();
    let p = app.pipelines.get(&plan.pipeline).ok_or_else(|| weir_runtime::refused!("no pipeline {}", plan.pipeline))?;
    let after = published(p, &plan.pipeline, plan.version)?;
    let live_ends_after = d.dlog.ends(&plan.contract.source.topic)?;
    let topic_grew = live_ends_after != live_ends_before;
    let courses = d.alerting.all();
    let alerts: Vec<Value> = courses
        .iter()
        .filter(|c| c.fired_ms >= fault_start || c.resolved_ms.is_some_and(|r| r >= fault_start))
        .map(|c| {
            json!({
                "alert": c.alert,
                "threshold": c.threshold,
                "observed": c.observed,
                "fired_after_ms": (c.fired_ms >= fault_start).then_some(c.fired_ms - fault_start),
                "firing_before": c.fired_ms < fault_start,
                "resolved_after_ms": c.resolved_ms.map(|r| r - fault_start),
            })
        })
        .collect();
    let mut failures = Vec::new();
    if plan.scenario != Scenario::Restart {
        if expected.is_empty() {
            failures.push(format!(
                "the contract has no alert that would notice {}: add one of {} to [alerts]",
                plan.scenario.name(),
                plan.scenario.alerts().join(", ")
            ));
        } else if !courses.iter().any(|c| c.fired_ms >= fault_start && expected.contains(&c.alert)) {
            let before: Vec<&str> = expected.iter().copied().filter(|a| firing_before.contains(a)).collect();
            failures.push(if before.is_empty() {
                format!("no alert fired: {} did not notice {}", expected.join(" or "), plan.scenario.name())
            } else {
                format!(
                    "{} was already firing before the fault, so the drill cannot show it noticed",
                    before.join(", ")
                )
            });
        }
    } else if recovery_ms.is_none() {
        failures.push(format!(
            "the pipeline did not recover within {} of the restart",
            weir_contract::format_duration_ms(plan.recover.as_millis() as i64)
        ));
    }
    if plan.scenario == Scenario::DestinationDown && recovery_ms.is_none() {
        let behind: Vec<String> = report
            .destinations
            .iter()
            .filter(|s| s.lag_changes > 0 || s.state != "caught up")
            .map(|s| format!("{} ({}, {} changes behind)", s.name, s.state, s.lag_changes))
            .collect();
        failures.push(format!(
            "the destinations did not catch up within {} of the receiver's return: {}",
            weir_contract::format_duration_ms(plan.recover.as_millis() as i64),
            behind.join(", ")
        ));
    }
    let destinations: Vec<Value> = report
        .destinations
        .iter()
        .map(|s| {
            json!({
                "name": s.name,
                "state": s.state,
                "position": s.position,
                "head": s.head,
                "lag_changes": s.lag_changes,
                "delivered": s.delivered,
                "retries": s.retries,
                "last_error": s.last_error,
            })
        })
        .collect();
    let receiver = d.destinations.as_ref().map(|s| s.stand_in.received.describe());
    let unchanged = after == before;
    if !unchanged && !topic_grew {
        failures.push("the live version's published rows changed during the drill while its topic got no event".into());
    }
    let verdict = if failures.is_empty() { "pass" } else { "fail" };
    Ok(json!({
        "drill": plan.id,
        "pipeline": plan.pipeline,
        "version": plan.version,
        "scenario": plan.scenario.name(),
        "who": plan.who,
        "why": plan.why,
        "verdict": verdict,
        "failures": failures,
        "shadow": { "topic": d.copy, "copied": copied, "drill_events": d.sent },
        "fault": {
            "what": described,
            "started": format_rfc3339_ms(fault_start),
            "ended": format_rfc3339_ms(fault_end),
        },
        "expected_alerts": expected,
        "alerts": alerts,
        "ledger_grown": ledger,
        "published": {
            "rows_before": before.1,
            "rows_after": after.1,
            "digest_before": before.0,
            "digest_after": after.0,
            "unchanged": unchanged,
            "live_topic_grew": topic_grew,
        },
        "recovery_ms": recovery_ms,
        "destinations": destinations,
        "receiver": receiver,
        "restarts": report.restarts,
        "took_ms": started.elapsed().as_millis() as u64,
    }))
}

/// Whether the contract sets this alert.
fn configured(contract: &Contract, alert: &str) -> bool {
    let Some(a) = &contract.alerts else { return false };
    match alert {
        "max_watermark_age" => a.max_watermark_age_ms.is_some(),
        "max_ledger_rate" => a.max_ledger_rate.is_some(),
        "max_lag" => a.max_lag_ms.is_some(),
        "max_oldest_unprocessed" => a.max_oldest_unprocessed_ms.is_some(),
        "max_destination_lag" => a.max_destination_lag_ms.is_some(),
        _ => false,
    }
}

//! `weir serve`'s start, in its steps (webhooks checked, the log and
//! `weir.db` opened, ledgers masked, Kafka and Postgres prepared, each
//! pipeline started with its destinations and backfill worker, the loops
//! beside the listener), and its shutdown.
//!
//! In more detail: `serve` in its start-up steps, each a function:
//! `check_webhooks`, `open_log`, `open_weir_db` (the audit key),
//! `mask_embedded_ledgers`, `prepare_kafka` (Postgres migrated and masked,
//! topics, producers), `start_pipeline` for each contract file (its versions
//! registered, a runner thread per version, its destinations and backfill
//! worker), `start_background` (exporter, alert loop, retention), and
//! `shut_down` in the order a last checkpoint needs.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::Context;
use weir_contract::{Contract, ServerConfig};
use weir_log::{Log, LogOptions};
use weir_runtime::runner::{Runner, READ_RECORDS};
use weir_runtime::{backfill, destination, embedded};
use weir_runtime::{kafka, lock, Pipeline, PipelineVersion, Status};
use weir_store::{audit, pg, sqlite as store};
use weir_store::{FileContract, Registration, StoreError, VersionState};

use crate::{app, http, listen, otel, readers, ServeOptions};
use weir_ops::alerts;
use weir_ops::drill_run;
use weir_ops::webhooks;

/// Runs the server until `shutdown` completes, then stops every pipeline
/// after a last checkpoint. `on_listen` is told the bound address.
pub async fn serve(
    opts: ServeOptions,
    on_listen: impl FnOnce(std::net::SocketAddr),
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> crate::error::Result<()> {
    weir_log::create_private_dir(&opts.data)
        .with_context(|| format!("cannot create the data folder {}", opts.data.display()))?;
    let webhook_roots = check_webhooks(&opts)?;
    // A bad certificate or key stops the start before anything else.
    let tls = match &opts.tls {
        Some((cert, key)) => Some(listen::tls_acceptor(cert, key)?),
        None => None,
    };
    let ServeOptions { data, contracts, config, listen: address, log_options, tls: _ } = opts;
    let config = Arc::new(config);
    let log = open_log(&data, log_options, &config, &contracts)?;
    // Before any pipeline starts, so their checkpoint spans reach the collector.
    let otel_exports = Arc::new(app::Exports::default());
    let otel = config.otel.as_ref().map(|o| otel::install(o, &otel_exports)).transpose()?;
    let db = data.join("weir.db");
    let origin = format!("weir serve (process {}) reading its contracts folder", std::process::id());
    open_weir_db(&data, &config, &origin)?;
    let on_kafka = |c: &Contract| match c.source.kind {
        Some(weir_contract::SourceKind::Kafka) => true,
        Some(weir_contract::SourceKind::Log) => false,
        None => config.kafka.is_some(),
    };
    let (kafka_contracts, embedded): (Vec<Contract>, Vec<Contract>) = contracts.iter().cloned().partition(on_kafka);
    mask_embedded_ledgers(&embedded, &db)?;
    // Pipelines over Kafka publish to Postgres, shared by the workers.
    let (producers, brokers) = prepare_kafka(kafka_contracts, &config).await?;

    // One store per topology, each behind the same interface for readers and operators.
    let timeout = Duration::from_millis(config.store_statement_timeout_ms as u64);
    let sqlite =
        Arc::new(weir_store::SqliteStore::new(db.clone(), config.pool_connections).with_statement_timeout(timeout));
    let pg_store: Option<Arc<dyn weir_store::Store>> = config.postgres.as_ref().map(|pg| {
        Arc::new(weir_store::PostgresStore::timed(pg.url.clone(), pg.schema.clone(), config.pool_connections, timeout))
            as _
    });
    let starting = Starting {
        config: Arc::clone(&config),
        log: log.clone(),
        db: db.clone(),
        origin: origin.clone(),
        worker: format!("weir-{}-{}", std::process::id(), weir_log::now_ms()),
        stop: Arc::new(AtomicBool::new(false)),
        notes: backfill::Notes::default(),
    };
    let mut threads = Vec::new();
    let mut pipelines = BTreeMap::new();
    let mut backfill_inputs = BTreeMap::new();
    let mut accepted = Vec::new();
    for file in contracts {
        let kafka = on_kafka(&file);
        let store: Arc<dyn weir_store::Store> = match (kafka, &pg_store) {
            (false, _) => sqlite.clone(),
            (true, Some(store)) => Arc::clone(store),
            (true, None) => crate::error::bail!("pipeline {:?} reads Kafka: it needs [postgres]", file.pipeline.name),
        };
        let started = start_pipeline(&starting, &file, kafka, store).await?;
        threads.extend(started.threads);
        if let Some(input) = started.backfill_input {
            backfill_inputs.insert(file.pipeline.name.clone(), input);
            accepted.push(file.clone());
        }
        pipelines.insert(file.pipeline.name.clone(), started.pipeline);
    }
    audit::record_contracts(&store::open(&db)?, &accepted, &origin)?;
    readers::start(config.pool_connections);
    let mut ops = weir_ops::Ops::new(log.clone(), Arc::clone(&config), pipelines, sqlite);
    if let Some(roots) = webhook_roots {
        let _ = ops.webhooks.trusted.set(roots);
    }
    ops.notes = Arc::clone(&starting.notes);
    ops.data = data.clone();
    let mut app = app::App::new(Arc::new(ops));
    app.auth = Arc::new(weir_store::SqliteStore::new(db.clone(), 4));
    app.producers = producers;
    app.brokers = brokers;
    app.backfill_inputs = backfill_inputs;
    app.otel_exports = otel_exports;
    let app = Arc::new(app);
    {
        let (a, runtime) = (Arc::clone(&app), tokio::runtime::Handle::current());
        tokio::task::spawn_blocking(move || {
            let _entered = runtime.enter();
            drill_run::remove_leftovers(&a, &|p| crate::drills::drill_log(&a, p, p.contract()).map_err(|e| e.1))
        })
        .await?;
    }
    let background = start_background(&app, otel, &log, &db)?;
    let listener = tokio::net::TcpListener::bind(&address)
        .await
        .with_context(|| format!("cannot listen on {address}: is another server using it? choose one with --listen"))?;
    on_listen(listener.local_addr()?);
    let listener = listen::WeirListener::new(listener, tls, config.max_connections)?;
    let timeouts =
        (Duration::from_millis(config.header_timeout_ms as u64), Duration::from_millis(config.write_timeout_ms as u64));
    // Change feeds end when the server stops, so they do not hold the shutdown up.
    let closing = app.closing.clone();
    let shutdown = async move {
        shutdown.await;
        let _ = closing.send(true);
    };
    listen::serve(listener, http::router(Arc::clone(&app)), timeouts, shutdown).await;
    shut_down((app, pg_store), background, &starting.stop, threads).await;
    Ok(())
}

/// Refuses a contract's or weir.toml's webhook that weir may not call, and
/// reads the CA certificates webhooks are checked against, if weir.toml names them.
fn check_webhooks(opts: &ServeOptions) -> crate::error::Result<Option<ureq::tls::RootCerts>> {
    let allow = weir_runtime::outbound::Allow {
        private: opts.config.allow_private_webhooks,
        link_local: opts.config.allow_link_local_webhooks,
    };
    let hooks =
        opts.contracts.iter().filter_map(|c| Some((c.pipeline.name.as_str(), c.alerts.as_ref()?.webhook.as_deref()?)));
    let hooks = hooks.chain(opts.config.alert_webhook.as_deref().map(|u| ("weir.toml alert_webhook", u)));
    for (whose, url) in hooks {
        if let Some(why) = webhooks::refused(url, allow) {
            crate::error::bail!(
                "the webhook of {whose} ({}) is refused: {why} (link-local and cloud metadata addresses need allow_link_local_webhooks = true)",
                weir_store::pg::redacted(url)
            );
        }
    }
    match &opts.config.webhook_ca_cert {
        Some(path) => Ok(Some(webhooks::roots(path).map_err(crate::error::Error::Refused)?)),
        None => Ok(None),
    }
}

/// Opens the embedded log (saying what a crash tore off) with a topic for
/// each one weir.toml or a contract names.
fn open_log(
    data: &Path,
    options: LogOptions,
    config: &ServerConfig,
    contracts: &[Contract],
) -> crate::error::Result<Log> {
    let options = LogOptions { queue_bytes: config.log_queue_bytes, ..options };
    let (log, recovered) = Log::open(&data.join("log"), options)?;
    for (topic, r) in &recovered {
        if r.torn_bytes > 0 {
            eprintln!(
                "weir: log {topic}/{}: cut {} bytes of a write torn by a crash (never acknowledged)",
                r.partition, r.torn_bytes
            );
        }
    }
    let mut topics: BTreeMap<String, u32> = config.topics.iter().map(|(n, t)| (n.clone(), t.partitions)).collect();
    for c in contracts {
        topics.entry(c.source.topic.clone()).or_insert(1);
    }
    for (name, partitions) in &topics {
        let retention = config.topic(name).retention_ms.map(|ms| Duration::from_millis(ms.max(0) as u64));
        log.ensure_topic(name, *partitions, retention)?;
    }
    Ok(log)
}

/// Opens `weir.db` at its current schema, and its audit log's key: once
/// the entries are keyed, they stay keyed.
fn open_weir_db(data: &Path, config: &ServerConfig, origin: &str) -> crate::error::Result<()> {
    let db = data.join("weir.db");
    let conn = store::open(&db).with_context(|| format!("cannot open {}", db.display()))?;
    store::migrate(&conn)?;
    match (&config.audit_key_file, audit::key_named(&conn)?) {
        (Some(file), _) => {
            let file = Path::new(file);
            let key = audit::Key::load(file, data).map_err(|e| crate::error::refused!("{e}"))?;
            audit::use_key(&conn, &key, file, origin)?;
        }
        (None, Some((file, id))) => crate::error::bail!(
            "the audit log in {} is chained with key {id} from {}; set audit_key_file = {:?} in weir.toml (a keyed audit log stays keyed)",
            db.display(),
            file.display(),
            file.display().to_string()
        ),
        (None, None) => {}
    }
    Ok(())
}

/// Masks the ledger entries stored whole before their contract named
/// personal fields, for the pipelines on the embedded log.
fn mask_embedded_ledgers(embedded: &[Contract], db: &Path) -> crate::error::Result<()> {
    for c in embedded.iter().filter(|c| !c.personal.is_empty()) {
        let privacy = weir_store::privacy::Privacy::of(c);
        let masked = store::mask_ledger(&store::open(db)?, &c.pipeline.name, &privacy)?;
        if masked > 0 {
            eprintln!("weir: {}: {masked} ledger entries stored whole are now masked", c.pipeline.name);
        }
    }
    Ok(())
}

/// For the pipelines on Kafka: Postgres at its current schema (its roles,
/// and their ledgers masked as above), each source topic made, and a
/// producer for each, by topic, with the topic's brokers.
async fn prepare_kafka(
    contracts: Vec<Contract>,
    config: &Arc<ServerConfig>,
) -> crate::error::Result<(BTreeMap<String, rdkafka::producer::FutureProducer>, BTreeMap<String, String>)> {
    let (mut producers, mut by_topic) = (BTreeMap::new(), BTreeMap::new());
    if contracts.is_empty() {
        return Ok((producers, by_topic));
    }
    let Some(pg) = config.postgres.clone() else {
        let names: Vec<&str> = contracts.iter().map(|c| &*c.pipeline.name).collect();
        crate::error::bail!(
            "{names:?} read Kafka, which needs a [postgres] section in weir.toml (url = \"host=... user=... dbname=...\"): workers share their results and checkpoints there"
        );
    };
    let (url, schema) = (pg.url.clone(), pg.schema.clone());
    let masking = contracts.clone();
    tokio::task::spawn_blocking(move || -> crate::error::Result<()> {
        let mut client =
            pg::connect(&url).with_context(|| format!("cannot connect to Postgres at {:?}", pg::redacted(&url)))?;
        pg::migrate(&mut client, &schema)?;
        if let Err(e) = pg::grant_roles(&mut client, &schema) {
            eprintln!(
                "weir: cannot create the roles {schema}_reader and {schema}_raw_reader in Postgres ({e}); a DBA can create them as SECURITY.md says"
            );
        }
        for c in masking.iter().filter(|c| !c.personal.is_empty()) {
            let privacy = weir_store::privacy::Privacy::of(c);
            let masked = pg::mask_ledger(&mut client, &schema, &c.pipeline.name, &privacy).map_err(StoreError::from)?;
            if masked > 0 {
                eprintln!("weir: {}: {masked} ledger entries stored whole are now masked", c.pipeline.name);
            }
        }
        Ok(())
    })
    .await??;
    for c in &contracts {
        let Some((brokers, _)) = kafka::source_of(c, config) else {
            crate::error::bail!(
                "pipeline {:?} reads Kafka but names no brokers: set [kafka] brokers in weir.toml or brokers in its [source]",
                c.pipeline.name
            );
        };
        let topic = &c.source.topic;
        if !producers.contains_key(topic) {
            kafka::ensure_topic(&brokers, config.kafka.as_ref(), topic, config.topic(topic).partitions)
                .await
                .with_context(|| format!("Kafka topic {topic} at {brokers}"))?;
            let producer = kafka::producer(&brokers, config.kafka.as_ref())
                .with_context(|| format!("cannot make a Kafka producer for {brokers}"))?;
            producers.insert(topic.clone(), producer);
            by_topic.insert(topic.clone(), brokers);
        }
    }
    Ok((producers, by_topic))
}

/// What every pipeline's start shares.
struct Starting {
    config: Arc<ServerConfig>,
    log: Log,
    db: PathBuf,
    /// Who registers the contracts, for the audit log.
    origin: String,
    /// This server's name as a Kafka worker and a backfill's claimant.
    worker: String,
    stop: Arc<AtomicBool>,
    notes: backfill::Notes,
}

/// A started pipeline: its threads, and its backfills' input when its
/// contract file was accepted.
struct Started {
    pipeline: Pipeline,
    threads: Vec<std::thread::JoinHandle<()>>,
    backfill_input: Option<backfill::InputFor>,
}

/// Registers a contract file's version and starts a thread for each
/// version of its pipeline, then (when the file is accepted) its
/// destinations and its backfill worker.
async fn start_pipeline(
    s: &Starting,
    file: &Contract,
    kafka: bool,
    store: Arc<dyn weir_store::Store>,
) -> crate::error::Result<Started> {
    let name = file.pipeline.name.clone();
    let config = &s.config;
    // Each contract file registers its version (SPEC.md 8): a pipeline's
    // first is live, a later one a candidate built beside it.
    // Only a version with a `[pipeline] start` asks how far back the input is kept.
    let kept_from = match (kafka, kafka::source_of(file, config)) {
        _ if file.pipeline.start_ms.is_none() => None,
        (false, _) => {
            use backfill::Input;
            backfill::LogInput { log: s.log.clone(), topic: file.source.topic.clone() }.kept_from()?
        }
        (true, Some((brokers, _))) => {
            let (kafka_config, topic) = (config.kafka.clone(), file.source.topic.clone());
            tokio::task::spawn_blocking(move || kafka::input_kept_from(&brokers, kafka_config.as_ref(), &topic))
                .await??
        }
        (true, None) => None,
    };
    let (st, f, who) = (Arc::clone(&store), file.clone(), s.origin.clone());
    let (versions, refused) =
        tokio::task::spawn_blocking(move || register_versions(st.as_ref(), &f, kept_from, &who)).await??;
    if let Some(why) = &refused {
        eprintln!("weir: {why}; pipeline {name} does not run, the others do");
    }
    // The typed views for BI tools, for every stored version.
    let (st, n) = (Arc::clone(&store), name.clone());
    if let Err(e) = tokio::task::spawn_blocking(move || st.refresh_views(&n)).await? {
        eprintln!("weir: pipeline {name}: the typed views for BI tools could not be made: {e}");
    }
    let paused = Arc::new(AtomicBool::new(false));
    let bell = Arc::new(weir_runtime::bell::Bell::default());
    let mut threads = Vec::new();
    let mut running = BTreeMap::new();
    for (contract, state) in versions {
        let version = contract.pipeline.version;
        let status = Arc::new(Mutex::new(Status { version_state: Some(state), ..Status::default() }));
        if let Some(why) = &refused {
            lock(&status).failed = Some(why.clone());
            running.insert(version, PipelineVersion { contract, status });
            continue;
        }
        let runner = Runner {
            contract: contract.clone(),
            config: Arc::clone(config),
            status: Arc::clone(&status),
            stop: Arc::clone(&s.stop),
            paused: Arc::clone(&paused),
            read_records: READ_RECORDS,
            bell: Arc::clone(&bell),
        };
        let thread = std::thread::Builder::new().name(format!("weir-{name}-v{version}"));
        if kafka {
            let (Some((brokers, group)), Some(postgres)) =
                (kafka::source_of(&contract, config), config.postgres.clone())
            else {
                crate::error::bail!("pipeline {name:?} reads Kafka: it needs brokers and [postgres]");
            };
            let (c, cfg, worker) = (contract.clone(), Arc::clone(config), s.worker.clone());
            let connect = move || kafka::connect(&c, &cfg, &postgres, (&brokers, &group), &worker);
            threads.push(thread.spawn(move || runner.run(connect))?);
        } else {
            // The results database must open before the server starts; each run opens its own connection.
            drop(store::open_writer(&s.db)?);
            let runtime = tokio::runtime::Handle::current();
            let (c, log, db) = (contract.clone(), s.log.clone(), s.db.clone());
            let connect = move || embedded::connect(&c, &log, &db, Some(runtime.clone()));
            threads.push(thread.spawn(move || runner.run(connect))?);
        }
        running.insert(version, PipelineVersion { contract, status });
    }
    let mut destinations = Vec::new();
    let mut backfill_input = None;
    if refused.is_none() {
        for pv in running.values() {
            let record = pv.contract.reconcile.as_ref().and_then(|r| r.system_of_record.as_ref());
            if let Some(c) = record.map(|s| &s.connection).filter(|c| !config.connections.contains_key(*c)) {
                crate::error::bail!(
                    "pipeline {name:?} version {}: [reconcile.system_of_record] names the connection {c:?}, which weir.toml does not have; add [connections.{c}] with the url of an account that may only read the system of record",
                    pv.contract.pipeline.version
                );
            }
        }
        let exclusive = if kafka { config.postgres.clone() } else { None };
        let started = start_destinations(file, &running, config, (&store, exclusive, &bell), &s.stop)?;
        threads.extend(started.threads);
        destinations = started.statuses;
        let input = backfill_input_of(kafka, &s.log, config);
        let worker = backfill::Worker {
            pipeline: name.clone(),
            contracts: running.iter().map(|(v, pv)| (*v, Arc::new(pv.contract.clone()))).collect(),
            store: Arc::clone(&store),
            input: Arc::clone(&input),
            claimant: s.worker.clone(),
            connections: config.connections.clone(),
            store_url: config.postgres.as_ref().map(|pg| pg.url.clone()),
            notes: Arc::clone(&s.notes),
        };
        let stop = Arc::clone(&s.stop);
        let thread = std::thread::Builder::new().name(format!("weir-backfill-{name}"));
        threads.push(thread.spawn(move || worker.run(stop))?);
        backfill_input = Some(input);
    }
    let pipeline = Pipeline { versions: running, on_kafka: kafka, paused, store, refused, bell, destinations };
    Ok(Started { pipeline, threads, backfill_input })
}

/// What runs beside the listener: the OpenTelemetry exporter, the alert
/// loop and the retention sweeps.
struct Background {
    otel: Option<std::thread::JoinHandle<()>>,
    otel_stop: Arc<AtomicBool>,
    alerting: tokio::task::JoinHandle<()>,
    retention: tokio::task::JoinHandle<()>,
}

fn start_background(
    app: &Arc<app::App>,
    otel: Option<otel::Otel>,
    log: &Log,
    db: &Path,
) -> crate::error::Result<Background> {
    let config = &app.config;
    let otel_stop = Arc::new(AtomicBool::new(false));
    let otel = match otel {
        Some(o) => {
            let (app, stop) = (Arc::clone(app), Arc::clone(&otel_stop));
            Some(std::thread::Builder::new().name("weir-otel".into()).spawn(move || o.run(app, stop))?)
        }
        None => None,
    };
    let alerting = tokio::spawn(alerts::run(Arc::clone(&app.ops)));
    // Ledger payloads past retention: the topic's (weir.toml), or weir.toml's
    // shorter cap; in SQLite, or in Postgres for pipelines on Kafka.
    let erase: Vec<(String, i64, bool)> = app
        .pipelines
        .iter()
        .filter_map(|(name, p)| {
            let topic = config.topic(&p.contract().source.topic).retention_ms;
            let keep = match (topic, config.ledger_payload_retention_ms) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            keep.map(|ms| (name.clone(), ms, p.on_kafka))
        })
        .collect();
    let stores = app.pipelines.iter().map(|(name, p)| (name.clone(), Arc::clone(&p.store))).collect();
    let superseded = (config.superseded_retention_ms, stores);
    let retention = tokio::spawn(retain(log.clone(), db.to_path_buf(), config.postgres.clone(), erase, superseded));
    Ok(Background { otel, otel_stop, alerting, retention })
}

/// After the listener: drills end (removing their copy and shadow store),
/// then the loops, then every pipeline after a last checkpoint, then the
/// exporter, so that the final checkpoints' spans and metrics are sent.
async fn shut_down(
    kept: (Arc<app::App>, Option<Arc<dyn weir_store::Store>>),
    background: Background,
    stop: &AtomicBool,
    threads: Vec<std::thread::JoinHandle<()>>,
) {
    let drills = std::mem::take(&mut *lock(&kept.0.drill_threads));
    for t in drills {
        let _ = tokio::task::spawn_blocking(move || t.join()).await;
    }
    let Background { otel, otel_stop, alerting, retention } = background;
    retention.abort();
    alerting.abort();
    let _ = retention.await;
    let _ = alerting.await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for t in threads {
        let _ = tokio::task::spawn_blocking(move || t.join()).await;
    }
    otel_stop.store(true, std::sync::atomic::Ordering::SeqCst);
    if let Some(t) = otel {
        let _ = tokio::task::spawn_blocking(move || t.join()).await;
    }
    // A pooled Postgres client closes by blocking on its connection: the
    // last references to the stores are dropped on a blocking thread.
    let _ = tokio::task::spawn_blocking(move || drop(kept)).await;
}

/// Each pipeline's store, by name.
type Stores = Vec<(String, Arc<dyn weir_store::Store>)>;

/// The versions a server runs of a pipeline (each with its stored state),
/// and why its contract file was refused, if it was.
type Registered = (Vec<(Contract, VersionState)>, Option<String>);

/// Deletes what is past retention, for real: log segments older than their
/// topic's retention, and the payloads and details of ledger entries older
/// than their pipeline's period (`erase`: pipeline, period, on Kafka, whose
/// ledger is in `postgres`). Sweeps every minute, or a quarter of the
/// shortest period when that is sooner.
async fn retain(
    log: Log,
    db: std::path::PathBuf,
    postgres: Option<weir_contract::PostgresConfig>,
    erase: Vec<(String, i64, bool)>,
    superseded: (i64, Stores),
) {
    let shortest = erase.iter().map(|e| e.1).chain([superseded.0]).min().unwrap_or(i64::MAX);
    let every = Duration::from_millis((shortest / 4).clamp(100, 60_000) as u64);
    loop {
        tokio::time::sleep(every).await;
        let (log, db, postgres, erase) = (log.clone(), db.clone(), postgres.clone(), erase.clone());
        let superseded = superseded.clone();
        let swept = tokio::task::spawn_blocking(move || -> crate::error::Result<()> {
            let now = weir_log::now_ms();
            // Superseded versions past `superseded_retention` are removed with what they published.
            for (pipeline, store) in &superseded.1 {
                for v in store.versions(pipeline)? {
                    let expired = v.superseded_ms.is_some_and(|at| now.saturating_sub(at) > superseded.0);
                    if v.state == VersionState::Superseded && expired {
                        store.forget_version(pipeline, v.version)?;
                        eprintln!(
                            "weir: {pipeline}: version {} removed, superseded longer than superseded_retention",
                            v.version
                        );
                    }
                }
            }
            log.enforce_retention(now)?;
            let (on_kafka, embedded): (Vec<_>, Vec<_>) = erase.into_iter().partition(|e| e.2);
            if !embedded.is_empty() {
                let conn = store::open(&db)?;
                for (pipeline, keep_ms, _) in &embedded {
                    store::erase_ledger_payloads(&conn, pipeline, now.saturating_sub(*keep_ms))?;
                }
            }
            if let (false, Some(pg)) = (on_kafka.is_empty(), &postgres) {
                let mut client = pg::connect(&pg.url)?;
                for (pipeline, keep_ms, _) in &on_kafka {
                    pg::erase_ledger_payloads(&mut client, &pg.schema, pipeline, now.saturating_sub(*keep_ms))
                        .map_err(StoreError::from)?;
                }
            }
            Ok(())
        })
        .await;
        if let Ok(Err(e)) = swept {
            eprintln!("weir: retention: {e:#}");
        }
    }
}

/// A reader of a pipeline's input for its backfills: the embedded log, or
/// the Kafka topic its contract names.
fn backfill_input_of(kafka: bool, log: &Log, config: &Arc<ServerConfig>) -> backfill::InputFor {
    if kafka {
        let config = Arc::clone(config);
        Arc::new(move |c: &Contract| {
            let brokers = kafka::source_of(c, &config).map(|(b, _)| b).unwrap_or_default();
            Box::new(kafka::KafkaInput::new(c, Arc::clone(&config), &brokers)) as Box<dyn backfill::Input>
        })
    } else {
        let log = log.clone();
        Arc::new(move |c: &Contract| {
            Box::new(backfill::LogInput { log: log.clone(), topic: c.source.topic.clone() }) as Box<dyn backfill::Input>
        })
    }
}

/// Registers a contract file's version in its pipeline's store and gives
/// the versions to run (each from its stored contract; the live one, a
/// candidate, superseded ones a rollback may bring back), or why the file
/// is refused (then the stored versions are only read).
fn register_versions(
    store: &dyn weir_store::Store,
    file: &Contract,
    input_kept_from: Option<i64>,
    who: &str,
) -> crate::error::Result<Registered> {
    let name = &file.pipeline.name;
    let stored = store.versions(name)?;
    let is_new = !stored.iter().any(|v| v.version == file.pipeline.version);
    let too_early = match (file.pipeline.start_ms, input_kept_from) {
        (Some(start), Some(kept)) if is_new && start < kept => Some(format!(
            "pipeline {name}: version {} starts at {}, but the retained input is whole only from {} (retention removed older records); set [pipeline] start to that time or later",
            file.pipeline.version,
            weir_engine::time::format_rfc3339_ms(start),
            weir_engine::time::format_rfc3339_ms(kept),
        )),
        _ => None,
    };
    let refused = match too_early {
        Some(why) => Some(why),
        None => {
            let identity = FileContract {
                version: file.pipeline.version,
                hash: file.text_hash,
                bytes_hash: file.bytes_hash(),
                text: &file.text,
            };
            match store.register_version(name, identity, who)? {
                Registration::Refused(why) => Some(why),
                Registration::New { .. } | Registration::Known | Registration::Adopt => None,
            }
        }
    };
    let mut versions = Vec::new();
    for v in store.versions(name)? {
        let contract = if v.version == file.pipeline.version && refused.is_none() {
            file.clone()
        } else if v.contract.is_empty() {
            continue; // stored before versions kept their contract: readable, not runnable
        } else {
            match Contract::parse(&format!("{name} version {} (stored)", v.version), &v.contract) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("weir: pipeline {name}: version {} cannot run again: {e}", v.version);
                    continue;
                }
            }
        };
        versions.push((contract, v.state));
    }
    if versions.is_empty() {
        versions.push((file.clone(), VersionState::Live));
    }
    Ok((versions, refused))
}

/// The delivery threads of a contract file's destinations, and their states.
struct Destinations {
    threads: Vec<std::thread::JoinHandle<()>>,
    statuses: Vec<Arc<Mutex<destination::DestinationStatus>>>,
}

/// Starts a thread per `[[destination]]` of `file`, each with the
/// connection weir.toml names (a missing one, or an http URL weir may not
/// call, stops the start).
fn start_destinations(
    file: &Contract,
    running: &BTreeMap<u32, PipelineVersion>,
    config: &ServerConfig,
    (store, exclusive, bell): (
        &Arc<dyn weir_store::Store>,
        Option<weir_contract::PostgresConfig>,
        &Arc<weir_runtime::bell::Bell>,
    ),
    stop: &Arc<AtomicBool>,
) -> crate::error::Result<Destinations> {
    let mut out = Destinations { threads: Vec::new(), statuses: Vec::new() };
    let name = &file.pipeline.name;
    for d in &file.destinations {
        let connection = connection_of(file, d, config)?;
        if d.kind == weir_contract::DestinationKind::Http {
            weir_runtime::outbound::check_url(&connection.url, connection.allow_private).map_err(|e| {
                crate::error::refused!(
                    "pipeline {name:?}: destination {:?} (connection {:?}): {e}",
                    d.name,
                    d.connection
                )
            })?;
        }
        let status = Arc::new(Mutex::new(destination::DestinationStatus {
            name: d.name.clone(),
            kind: d.kind.as_str().into(),
            state: "starting".into(),
            ..Default::default()
        }));
        let runner = destination::DestinationRunner {
            pipeline: name.clone(),
            owner: file.pipeline.owner.clone(),
            destination: d.clone(),
            connection,
            contracts: running.iter().map(|(v, pv)| (*v, pv.contract.clone())).collect(),
            declared_by: file.pipeline.version,
            store: Arc::clone(store),
            exclusive: exclusive.clone(),
            kafka: config.kafka.clone(),
            status: Arc::clone(&status),
            stop: Arc::clone(stop),
            bell: Arc::clone(bell),
        };
        let thread = std::thread::Builder::new().name(format!("weir-dest-{name}-{}", d.name));
        out.threads.push(thread.spawn(move || runner.run())?);
        out.statuses.push(status);
    }
    Ok(out)
}

/// The connection a destination names in weir.toml; a `kafka` destination
/// without one goes to the pipeline's Kafka: the brokers its `[sink]`
/// named, else its `[source] brokers`, else weir.toml's `[kafka] brokers`.
fn connection_of(
    file: &Contract,
    d: &weir_contract::Destination,
    config: &ServerConfig,
) -> crate::error::Result<weir_contract::Connection> {
    let name = &file.pipeline.name;
    if let Some(c) = &d.connection {
        return config.connections.get(c).cloned().ok_or_else(|| {
            crate::error::refused!(
                "pipeline {name:?}: destination {:?} names the connection {c:?}, which weir.toml does not have; add [connections.{c}] with its url",
                d.name,
            )
        });
    }
    let weir_contract::DestinationKind::Kafka { brokers, .. } = &d.kind else {
        crate::error::bail!("pipeline {name:?}: destination {:?} names no connection; add `connection`", d.name);
    };
    let brokers = brokers
        .clone()
        .or_else(|| file.source.brokers.clone())
        .or_else(|| config.kafka.as_ref().map(|k| k.brokers.clone()));
    let Some(url) = brokers else {
        crate::error::bail!(
            "pipeline {name:?}: the kafka destination {:?} has no brokers: name a connection in it, or set [kafka] brokers in weir.toml",
            d.name
        );
    };
    Ok(weir_contract::Connection { url, headers: BTreeMap::new(), allow_private: true })
}

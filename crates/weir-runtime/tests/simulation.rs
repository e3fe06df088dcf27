//! A deterministic simulation of the runner, in the spirit of
//! TigerBeetle's VOPR and FoundationDB's simulator, on both stores: SQLite
//! (one engine for the topic) and Postgres (an engine and a fenced
//! checkpoint per partition, as over Kafka; the machine's Postgres,
//! `WEIR_TEST_POSTGRES`).
//!
//! One seed drives everything: a producer appending events to the embedded
//! log (some resent, some held back by a stalled partition and then
//! released as a burst), a simulated clock, the runner stepped by hand
//! ([`Run::step`]), and the faults:
//!
//! - a crash between any two steps: after an append, after an engine step
//!   (events read, not checkpointed), right after a checkpoint's commit;
//! - a crash inside a commit, and a failed commit (SQLite's commit hook
//!   turns the commit into a rollback; on Postgres the commit is refused
//!   before it is sent), after which the runner restarts from its last
//!   checkpoint as the restart loop does;
//! - on Postgres, a zombie: a run that goes on stepping after a new run
//!   has claimed its partitions (a worker paused past its session), whose
//!   commits the fence must refuse;
//! - a torn log tail (bytes of a write that never finished) and the log
//!   reopened, which cuts it;
//! - stalled partitions, which go idle and later deliver a burst;
//! - operator actions: pause, resume, replay from the start or from an
//!   event time.
//!
//! After the run, with every partition's watermark past every window, it
//! checks SPEC.md 7's promises:
//!
//! - the published rows equal a batch over the log;
//! - the change stream's `seq` (and the ledger's) runs 1, 2, 3, ... with no
//!   gap and never goes back;
//! - no window's revision is published twice, and revisions only go up;
//! - while paused, readers see nothing past the pause point.
//!
//! `WEIR_SIM_SEED=N` replays one seed exactly (a failure prints its seed);
//! `WEIR_SIM_SECONDS` bounds how long the run draws new seeds (default 60).

use std::cell::Cell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use weir_contract::{Contract, ServerConfig};
use weir_engine::{Engine, EventIn, Mode, Output};
use weir_log::{Log, LogOptions};
use weir_runtime::embedded::LogSource;
use weir_runtime::runner::{Batch, Holder, Run, Runner, Source};
use weir_runtime::{Clock, Status};
use weir_store::checkpoint::{self, Checkpoints, Claimed, Scope, Write};
use weir_store::sqlite as store;
use weir_store::{
    pg, Act, Acted, FileContract, PgCheckpoints, PostgresStore, Replay, SqliteCheckpoints, SqliteStore, Store,
    StoreError, VersionState,
};

const CONTRACT: &str = r#"
[pipeline]
name = "sim"
version = 1
owner = "sim-owner"
steward = "sim-steward"
decision = "Amount per account per second"

[source]
topic = "events"
event_time = "t"
key = ["acct"]
event_id = "id"
where = 'kind == "pay"'
max_delay = "500ms"

[window]
type = "tumbling"
size = "1s"
allowed_lateness = "5s"
late = "revise"

[dedup]
horizon = "1m"

[[aggregate]]
name = "amount"
fn = "sum"
field = "amount"

[[aggregate]]
name = "payments"
fn = "count"
"#;

const CONFIG: &str = r#"
idle_timeout = "400ms"
checkpoint_interval = "100ms"
checkpoint_events = 300

[topics.events]
partitions = 3
"#;

const PARTITIONS: u32 = 3;
/// Event time starts here (2026-12-01T00:00:00Z); the simulated wall clock too.
const EPOCH_MS: i64 = 1_764_547_200_000;

/// splitmix64: small, fast, and the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Time that moves only when the simulation says.
struct SimClock {
    ms: Cell<u64>,
}

impl Clock for SimClock {
    fn monotonic_ms(&self) -> u64 {
        self.ms.get()
    }

    fn wall_ms(&self) -> i64 {
        EPOCH_MS + self.ms.get() as i64
    }
}

impl SimClock {
    fn advance(&self, ms: u64) {
        self.ms.set(self.ms.get() + ms);
    }
}

/// What happened in one seed's run, for the failure message.
#[derive(Default, Debug)]
struct Tally {
    appended: usize,
    steps: usize,
    checkpoints: usize,
    crashes: usize,
    crashes_after_commit: usize,
    failed_commits: usize,
    torn_tails: usize,
    stalls: usize,
    pauses: usize,
    replays: usize,
    zombies: usize,
    /// Commits of a zombie the fence refused.
    fenced: usize,
}

/// The runner and its current run, or nothing between a crash and a restart.
struct Live {
    runner: Runner,
    run: Option<Run>,
    /// While set, the next commit on the runner's connection is rolled back.
    fail_commit: Arc<AtomicBool>,
}

struct World {
    dir: PathBuf,
    contract: Contract,
    config: Arc<ServerConfig>,
    log: Log,
    clock: SimClock,
    rng: Rng,
    live: Option<Live>,
    tally: Tally,
    read_records: usize,
    /// Events of each partition held back while it is stalled, and until when.
    stalled: Vec<Option<(u64, Vec<Vec<u8>>)>>,
    /// Recent events, some of which are sent again.
    recent: Vec<(u32, Vec<u8>)>,
    next_id: u64,
    /// A replay asked while a pause is in force is checked at the end only.
    paused: bool,
    seed: u64,
    backend: Backend,
    /// Readers and operators, as the HTTP side reaches them.
    store: Box<dyn Store>,
    /// Records the source leaves out ([`Skipping`]); none in the simulation.
    skip: Option<Skip>,
    /// Holds every commit until opened ([`Faulty`]); none in the simulation.
    gate: Option<Gate>,
}

/// Where the runner checkpoints.
enum Backend {
    Sqlite(PathBuf),
    /// A schema of its own in the machine's Postgres, and a client for the checks.
    Postgres {
        url: String,
        schema: String,
        client: std::cell::RefCell<Box<postgres::Client>>,
    },
}

fn postgres_url() -> String {
    std::env::var("WEIR_TEST_POSTGRES").unwrap_or_else(|_| "host=127.0.0.1 user=postgres dbname=test".into())
}

impl Backend {
    fn open(kind: Kind, dir: &Path, seed: u64) -> Backend {
        match kind {
            Kind::Sqlite => {
                let db = dir.join("weir.db");
                let conn = store::open(&db).unwrap();
                store::migrate(&conn).unwrap();
                Backend::Sqlite(db)
            }
            Kind::Postgres => {
                let (url, schema) = (postgres_url(), format!("weir_sim_{}_{seed}", std::process::id()));
                let mut client = pg::connect(&url).unwrap();
                pg::drop_schema(&mut client, &schema).unwrap();
                pg::migrate(&mut client, &schema).unwrap();
                Backend::Postgres { url, schema, client: std::cell::RefCell::new(Box::new(client)) }
            }
        }
    }

    fn store(&self) -> Box<dyn Store> {
        match self {
            Backend::Sqlite(db) => Box::new(SqliteStore::new(db.clone(), 2)),
            Backend::Postgres { url, schema, .. } => Box::new(PostgresStore::new(url.clone(), schema.clone(), 2)),
        }
    }

    /// A run's checkpoints, on a new connection whose next commit fails while `fail` is set.
    fn checkpoints(&self, contract: &Contract, fail: &Arc<AtomicBool>) -> weir_runtime::Result<Box<dyn Checkpoints>> {
        Ok(match self {
            Backend::Sqlite(db) => {
                let conn = store::open_writer(db)?;
                let armed = Arc::clone(fail);
                // The commit is turned into a rollback inside SQLite.
                conn.commit_hook(Some(move || armed.swap(false, Ordering::SeqCst)));
                Box::new(SqliteCheckpoints::new(conn, contract))
            }
            Backend::Postgres { url, schema, .. } => {
                let client = pg::connect(url)?;
                let inner = Box::new(PgCheckpoints::open(client, schema, "sim-worker", contract)?);
                Box::new(Faulty { inner, fail: Some(Arc::clone(fail)), gate: None })
            }
        })
    }

    fn per_partition(&self) -> bool {
        matches!(self, Backend::Postgres { .. })
    }

    /// Integers a query gives, in order (`{s}` is the schema's prefix).
    fn numbers(&self, sql: &str) -> Vec<i64> {
        match self {
            Backend::Sqlite(db) => {
                let conn = store::open(db).unwrap();
                let mut stmt = conn.prepare(&sql.replace("{s}", "")).unwrap();
                stmt.query_map([], |r| r.get(0)).unwrap().map(Result::unwrap).collect()
            }
            Backend::Postgres { schema, client, .. } => {
                let rows = client.borrow_mut().query(&sql.replace("{s}", &format!("{schema}.")), &[]).unwrap();
                rows.iter().map(|r| r.get::<_, i64>(0)).collect()
            }
        }
    }

    /// Every change stored, hidden or not: `(seq, row)`.
    fn changes(&self) -> Vec<(i64, serde_json::Value)> {
        let sql = "SELECT seq, row FROM {s}changes WHERE pipeline = 'sim' ORDER BY seq";
        let rows: Vec<(i64, String)> = match self {
            Backend::Sqlite(db) => {
                let conn = store::open(db).unwrap();
                let mut stmt = conn.prepare(&sql.replace("{s}", "")).unwrap();
                stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap().map(Result::unwrap).collect()
            }
            Backend::Postgres { schema, client, .. } => {
                let rows = client.borrow_mut().query(&sql.replace("{s}", &format!("{schema}.")), &[]).unwrap();
                rows.iter().map(|r| (r.get(0), r.get(1))).collect()
            }
        };
        rows.into_iter().map(|(seq, row)| (seq, serde_json::from_str(&row).unwrap())).collect()
    }

    /// The next offset stored per partition.
    fn stored_offsets(&self) -> Vec<i64> {
        match self {
            Backend::Sqlite(_) => {
                self.numbers("SELECT next_offset FROM offsets WHERE pipeline = 'sim' ORDER BY partition")
            }
            Backend::Postgres { .. } => {
                self.numbers("SELECT next_offset FROM {s}partitions WHERE pipeline = 'sim' ORDER BY partition")
            }
        }
    }

    fn close(&self) {
        if let Backend::Postgres { schema, client, .. } = self {
            let _ = pg::drop_schema(&mut client.borrow_mut(), schema);
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Sqlite,
    Postgres,
}

/// Checkpoints whose commits wait while `gate` is closed, and whose next
/// commit is refused before it is sent while `fail` is set (Postgres).
struct Faulty {
    inner: Box<dyn Checkpoints>,
    fail: Option<Arc<AtomicBool>>,
    gate: Option<Gate>,
}

impl Checkpoints for Faulty {
    fn claim(&mut self, scope: Scope, why: &str) -> checkpoint::Result<Claimed> {
        self.inner.claim(scope, why)
    }
    fn commit(&mut self, write: Write<'_>) -> checkpoint::Result<()> {
        if let Some(gate) = &self.gate {
            let mut open = gate.0.lock().unwrap();
            while !*open {
                open = gate.1.wait(open).unwrap();
            }
        }
        if self.fail.as_ref().is_some_and(|f| f.swap(false, Ordering::SeqCst)) {
            let message = "the simulation refused this commit".to_owned();
            return Err(StoreError::Unreachable { what: "Postgres", message }.into());
        }
        self.inner.commit(write)
    }
    fn start_run(&mut self, scope: Scope, why: &str) -> checkpoint::Result<i64> {
        self.inner.start_run(scope, why)
    }
    fn is_paused(&mut self) -> checkpoint::Result<bool> {
        self.inner.is_paused()
    }
    fn last_replay(&mut self) -> checkpoint::Result<Option<(i64, Replay)>> {
        self.inner.last_replay()
    }
    fn max_revision(&mut self) -> checkpoint::Result<u32> {
        self.inner.max_revision()
    }
    fn version_state(&mut self) -> checkpoint::Result<Option<VersionState>> {
        self.inner.version_state()
    }
}

/// Offsets `from..to` of one partition that a source leaves out of its
/// reads: the first read that reaches them only (`always` false: what a
/// consumer had queued and dropped when its group moved other partitions),
/// or every read (the broker no longer has them).
#[derive(Debug, Clone)]
struct Skip {
    partition: u32,
    from: u64,
    to: u64,
    always: bool,
}

/// The log as a source that leaves out the records its [`Skip`] names.
struct Skipping {
    inner: LogSource,
    skip: Skip,
    /// How many reads left records out.
    left_out: Arc<Mutex<u32>>,
}

impl Source for Skipping {
    fn per_partition(&self) -> bool {
        self.inner.per_partition()
    }
    fn open(&mut self, holder: Arc<dyn Holder>) -> weir_runtime::Result<()> {
        self.inner.open(holder)
    }
    fn read(
        &mut self,
        next: &[(u32, u64)],
        max: usize,
        wait: Duration,
        batch: &mut Batch,
    ) -> weir_runtime::Result<bool> {
        let mut all = Batch::default();
        let full = self.inner.read(next, max, wait, &mut all)?;
        let skip = &self.skip;
        let mut left_out = self.left_out.lock().unwrap();
        let mut leaving = false;
        for (rec, bytes) in all.iter() {
            let named = rec.partition == skip.partition && (skip.from..skip.to).contains(&rec.offset);
            if named && (skip.always || *left_out == 0) {
                leaving = true;
                continue;
            }
            batch.push(rec.partition, rec.offset, rec.time_ms, bytes);
        }
        if leaving {
            *left_out += 1;
        }
        Ok(full)
    }
    fn ends(&mut self, partitions: &[u32]) -> weir_runtime::Result<Vec<(u32, u64)>> {
        self.inner.ends(partitions)
    }
    fn bounds(&mut self, partition: u32) -> weir_runtime::Result<(u64, u64)> {
        self.inner.bounds(partition)
    }
    fn seek(&mut self, partition: u32, offset: u64) -> weir_runtime::Result<()> {
        self.inner.seek(partition, offset)
    }
    fn checkpointed(&mut self, offsets: &[(u32, u64)]) {
        self.inner.checkpointed(offsets)
    }
    fn close(&mut self) {
        self.inner.close()
    }
}

/// Open or closed, and the commits waiting for it to open.
type Gate = Arc<(Mutex<bool>, std::sync::Condvar)>;

fn open_gate(gate: &Gate) {
    *gate.0.lock().unwrap() = true;
    gate.1.notify_all();
}

fn log_options() -> LogOptions {
    LogOptions { segment_bytes: 16 * 1024, ..LogOptions::default() }
}

impl World {
    fn new(kind: Kind, seed: u64) -> World {
        let dir = std::env::temp_dir().join(format!("weir-sim-{}-{kind:?}-{seed}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let contract = Contract::parse("sim.toml", CONTRACT).unwrap();
        let config = Arc::new(ServerConfig::parse("weir.toml", CONFIG).unwrap());
        let (log, _) = Log::open(&dir.join("log"), log_options()).unwrap();
        log.ensure_topic("events", PARTITIONS, None).unwrap();
        let backend = Backend::open(kind, &dir, seed);
        let store = backend.store();
        // The contract's version is stored (live), as a server does at its start.
        let file = FileContract {
            version: contract.pipeline.version,
            hash: contract.text_hash,
            bytes_hash: contract.bytes_hash(),
            text: &contract.text,
        };
        store.register_version("sim", file, "simulation").unwrap();
        let mut rng = Rng(seed);
        let read_records = 1 + rng.below(40) as usize;
        World {
            dir,
            contract,
            config,
            log,
            clock: SimClock { ms: Cell::new(0) },
            rng,
            live: None,
            tally: Tally::default(),
            read_records,
            stalled: vec![None; PARTITIONS as usize],
            recent: Vec::new(),
            next_id: 0,
            paused: false,
            seed,
            backend,
            store,
            skip: None,
            gate: None,
        }
    }

    /// Starts the runner from its last checkpoint, as a restarted server does.
    fn start(&mut self, why: &str) {
        let fail_commit = Arc::new(AtomicBool::new(false));
        let runner = Runner {
            contract: self.contract.clone(),
            config: Arc::clone(&self.config),
            status: Arc::new(Mutex::new(Status::default())),
            stop: Arc::new(AtomicBool::new(false)),
            paused: Arc::new(AtomicBool::new(false)),
            read_records: self.read_records,
            bell: Arc::default(),
        };
        let mut live = Live { runner, run: None, fail_commit };
        // A failed start (its run row's commit refused) is tried again at the next step.
        live.run = self.open_run(&live, why).ok();
        self.live = Some(live);
    }

    /// A run on a new connection whose commits the test can refuse, over the log.
    fn open_run(&self, live: &Live, why: &str) -> weir_runtime::Result<Run> {
        let mut checkpoints = self.backend.checkpoints(&self.contract, &live.fail_commit)?;
        if let Some(gate) = &self.gate {
            checkpoints = Box::new(Faulty { inner: checkpoints, fail: None, gate: Some(Arc::clone(gate)) });
        }
        let mut source = LogSource::new(self.log.clone(), "events", None);
        if self.backend.per_partition() {
            source = source.engine_per_partition();
        }
        match &self.skip {
            Some(skip) => {
                let source = Skipping { inner: source, skip: skip.clone(), left_out: Arc::default() };
                Run::start(&live.runner, Box::new(source), checkpoints, &self.clock, why)
            }
            None => Run::start(&live.runner, Box::new(source), checkpoints, &self.clock, why),
        }
    }

    /// A zombie: the current run goes on stepping after a new run claimed
    /// its partitions (a worker paused past its session); the fence must
    /// refuse its commits, so it publishes nothing.
    fn zombie(&mut self) {
        let Some(mut live) = self.live.take() else { return };
        let Some(mut zombie) = live.run.take() else {
            self.live = Some(live);
            return;
        };
        self.tally.zombies += 1;
        live.run = self.open_run(&live, "a new holder").ok();
        let before = live.runner.status.lock().unwrap().checkpoints_fenced;
        self.produce();
        let steps = 1 + self.rng.below(5);
        for i in 0..steps {
            self.clock.advance(self.rng.below(150));
            // Its last step stops, which commits whatever it holds.
            if zombie.step(&live.runner, &self.clock, i + 1 == steps, Duration::ZERO).is_err() {
                break;
            }
        }
        let fenced = live.runner.status.lock().unwrap().checkpoints_fenced - before;
        self.tally.fenced += fenced as usize;
        self.live = Some(live);
    }

    /// Drops the runner and everything it held in memory.
    fn crash(&mut self) {
        self.live = None;
        self.tally.crashes += 1;
    }

    /// One step of the runner; a failure drops the run, and the next step
    /// starts again from the last checkpoint (the restart loop, without its
    /// backoff).
    fn step(&mut self, stopping: bool) -> bool {
        let Some(live) = self.live.as_ref() else {
            self.start("server start");
            return false;
        };
        if live.run.is_none() {
            let run = self.open_run(live, "restart after a failure").ok();
            if let Some(live) = self.live.as_mut() {
                live.run = run;
            }
            return false;
        }
        let Some(live) = self.live.as_mut() else { return false };
        let Some(run) = live.run.as_mut() else { return false };
        self.tally.steps += 1;
        match run.step(&live.runner, &self.clock, stopping, Duration::ZERO) {
            Ok(step) => {
                if step.checkpointed {
                    self.tally.checkpoints += 1;
                }
                step.checkpointed
            }
            Err(_) => {
                live.run = None;
                false
            }
        }
    }

    fn event(&mut self, partition: u32) -> Vec<u8> {
        let id = self.next_id;
        self.next_id += 1;
        // Disorder: up to 300 ms behind the clock.
        let t = self.clock.wall_ms() - self.rng.below(300) as i64;
        let acct = partition as u64 * 10 + self.rng.below(6);
        let cents = self.rng.below(100_000);
        format!(r#"{{"id":"e{id}","acct":"a{acct}","amount":{}.{:02},"kind":"pay","t":{t}}}"#, cents / 100, cents % 100)
            .into_bytes()
    }

    /// Appends `records`, acknowledged once fsynced.
    fn append(&mut self, records: Vec<(u32, Vec<u8>)>) {
        if records.is_empty() {
            return;
        }
        self.tally.appended += records.len();
        self.log.append("events", records).unwrap().wait_blocking().unwrap();
    }

    fn produce(&mut self) {
        let n = 1 + self.rng.below(12);
        let mut batch = Vec::new();
        for _ in 0..n {
            let p = self.rng.below(PARTITIONS as u64) as u32;
            let (p, bytes) = if !self.recent.is_empty() && self.rng.chance(8) {
                // Sent again, as a producer retrying does (the same payload: a duplicate). With an
                // engine per partition it goes where the first went, as a Kafka producer's key sends it.
                let i = self.rng.below(self.recent.len() as u64) as usize;
                let (first, bytes) = self.recent[i].clone();
                (if self.backend.per_partition() { first } else { p }, bytes)
            } else {
                let e = self.event(p);
                self.recent.push((p, e.clone()));
                if self.recent.len() > 50 {
                    self.recent.remove(0);
                }
                (p, e)
            };
            match &mut self.stalled[p as usize] {
                Some((_, held)) => held.push(bytes),
                None => batch.push((p, bytes)),
            }
        }
        self.append(batch);
    }

    /// Releases the stalled partitions whose time is up, as a burst.
    fn release(&mut self, all: bool) {
        let now = self.clock.monotonic_ms();
        for p in 0..PARTITIONS as usize {
            let due = matches!(&self.stalled[p], Some((until, _)) if all || *until <= now);
            if due {
                let (_, held) = self.stalled[p].take().unwrap();
                self.append(held.into_iter().map(|b| (p as u32, b)).collect());
            }
        }
    }

    /// A crash while a write to the log was under way: the process dies,
    /// the last segment of a partition ends in bytes of a record never
    /// acknowledged, and the reopened log cuts them.
    fn torn_tail(&mut self) {
        self.live = None;
        let p = self.rng.below(PARTITIONS as u64);
        let folder = self.dir.join("log").join("events").join(p.to_string());
        let last = last_segment(&folder);
        let mut garbage = vec![0u8; 1 + self.rng.below(60) as usize];
        garbage.iter_mut().for_each(|b| *b = self.rng.next() as u8);
        let mut bytes = std::fs::read(&last).unwrap();
        bytes.extend_from_slice(&garbage);
        std::fs::write(&last, bytes).unwrap();
        let (log, recovered) = Log::open(&self.dir.join("log"), log_options()).unwrap();
        let torn: u64 = recovered.iter().map(|(_, r)| r.torn_bytes).sum();
        assert_eq!(torn, garbage.len() as u64, "the reopened log cuts exactly the torn bytes");
        self.log = log;
        self.tally.torn_tails += 1;
        self.tally.crashes += 1;
    }

    /// While paused, what readers are served ends before the pause point.
    fn check_paused_reads(&self, seed: u64) {
        let Some(from) = self.backend.numbers("SELECT from_seq FROM {s}pauses WHERE pipeline = 'sim'").first().copied()
        else {
            return;
        };
        for row in self.store.changes("sim", None, 1, 1_000_000).unwrap() {
            let v: serde_json::Value = serde_json::from_str(&row).unwrap();
            let seq = v["seq"].as_i64().unwrap();
            assert!(seq < from, "seed {seed}: row {seq} served while paused from {from}");
        }
    }

    fn act(&mut self, seed: u64) {
        match self.rng.below(1000) {
            0..=299 => self.produce(),
            300..=499 => self.clock.advance(10 + self.rng.below(250)),
            500..=849 => {
                if self.step(false) && self.rng.chance(10) {
                    // A crash right after a checkpoint's commit.
                    self.crash();
                    self.tally.crashes_after_commit += 1;
                }
            }
            850..=879 => self.crash(),
            880..=899 => {
                // A failed commit; half the time the process dies inside it.
                if let Some(live) = &self.live {
                    live.fail_commit.store(true, Ordering::SeqCst);
                    self.tally.failed_commits += 1;
                    self.step(false);
                    if self.rng.chance(50) {
                        self.crash();
                    }
                }
            }
            900..=909 => self.torn_tail(),
            910..=939 => {
                let p = self.rng.below(PARTITIONS as u64) as usize;
                if self.stalled[p].is_none() {
                    let until = self.clock.monotonic_ms() + 500 + self.rng.below(1_500);
                    self.stalled[p] = Some((until, Vec::new()));
                    self.tally.stalls += 1;
                }
            }
            940..=969 => {
                if self.paused {
                    assert!(self.was_paused(Act::Resume), "seed {seed}: a pause to resume");
                } else {
                    assert!(!self.was_paused(Act::Pause), "seed {seed}: not paused yet");
                    self.tally.pauses += 1;
                }
                self.paused = !self.paused;
            }
            970..=984 => {
                let from_time = if self.rng.chance(50) {
                    Some(EPOCH_MS + self.clock.monotonic_ms() as i64 - self.rng.below(5_000) as i64)
                } else {
                    None
                };
                let replay = Act::Replay { version: 1, replay: Replay { from_offset: None, from_time } };
                self.store.act("sim", &replay, None).unwrap();
                self.tally.replays += 1;
            }
            985..=989 if self.backend.per_partition() => self.zombie(),
            _ => {
                for _ in 0..1 + self.rng.below(20) {
                    self.step(false);
                }
            }
        }
        self.release(false);
        self.check_paused_reads(seed);
    }

    /// A pause or a resume, as an operator asks for it: whether the
    /// pipeline was paused before.
    fn was_paused(&self, act: Act) -> bool {
        match self.store.act("sim", &act, None).unwrap().0 {
            Acted::Paused { was } => was,
            other => panic!("a pause or resume did {other:?}"),
        }
    }

    /// Lets everything through: stalls released, a pause resumed, one
    /// event an hour later on every partition (filtered by the contract's
    /// rule, but moving the watermark past every window), and the runner
    /// stepped until it has read the whole log and checkpointed.
    fn settle(&mut self) {
        // No fault is left armed: a commit failed now would leave the last checkpoint short.
        if let Some(live) = &self.live {
            live.fail_commit.store(false, Ordering::SeqCst);
        }
        self.release(true);
        if self.paused {
            self.was_paused(Act::Resume);
            self.paused = false;
        }
        let t = self.clock.wall_ms() + 3_600_000;
        let flush: Vec<(u32, Vec<u8>)> = (0..PARTITIONS)
            .map(|p| (p, format!(r#"{{"id":"flush-{p}","acct":"a0","amount":0,"kind":"flush","t":{t}}}"#).into_bytes()))
            .collect();
        self.append(flush);
        let ends: Vec<u64> = self.log.bounds("events").unwrap().iter().map(|(_, end)| *end).collect();
        let asked = self.backend.numbers("SELECT coalesce(max(id), 0) FROM {s}replays WHERE pipeline = 'sim'")[0];
        for _ in 0..100_000 {
            self.clock.advance(50);
            self.step(false);
            let caught_up =
                self.live.as_ref().and_then(|l| l.run.as_ref()).is_some_and(|r| {
                    r.offsets().iter().map(|(_, o)| *o).eq(ends.iter().copied()) && r.replayed() == asked
                });
            if caught_up {
                break;
            }
        }
        // A stop: the last checkpoint.
        self.clock.advance(200);
        self.step(true);
        let stored = self.backend.stored_offsets();
        let ends: Vec<i64> = ends.iter().map(|e| *e as i64).collect();
        assert_eq!(stored, ends, "seed {}: the last checkpoint holds the whole log", self.seed);
    }
}

fn last_segment(folder: &Path) -> PathBuf {
    let mut segments: Vec<PathBuf> = std::fs::read_dir(folder)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    segments.sort();
    segments.pop().expect("a partition has a segment")
}

/// `(key, window_start)` -> `(values, events)` of every row `rows` holds.
fn by_window(rows: impl IntoIterator<Item = serde_json::Value>) -> BTreeMap<String, (String, u64, String)> {
    rows.into_iter()
        .map(|v| {
            let id = format!("{} {}", v["key"], v["window_start"]);
            (id, (v["values"].to_string(), v["events"].as_u64().unwrap(), v["status"].as_str().unwrap().to_owned()))
        })
        .collect()
}

/// The batch over everything the log holds, partition by partition.
fn batch(world: &World) -> BTreeMap<String, (String, u64, String)> {
    let mut engine = Engine::new(&world.contract, Mode::Batch, PARTITIONS).unwrap();
    let mut out = Output::default();
    for p in 0..PARTITIONS {
        let records = world.log.read("events", p, 0, usize::MAX, usize::MAX).unwrap();
        for r in &records {
            engine.process(EventIn { partition: p, offset: r.offset, bytes: &r.payload }, &mut out);
        }
    }
    engine.finish(&mut out);
    let mut text = String::new();
    for row in &out.rows {
        engine.format().write_row(row, &mut text);
    }
    by_window(text.lines().map(|l| serde_json::from_str(l).unwrap()))
}

fn check(world: &World, seed: u64) {
    let fail = |what: String| panic!("seed {seed}: {what}\n{:?}\nreplay with WEIR_SIM_SEED={seed}", world.tally);
    let filter = weir_store::ResultFilter { limit: i64::MAX, ..Default::default() };
    let results: Vec<serde_json::Value> =
        world.store.results("sim", 1, &filter).unwrap().rows.iter().map(|r| serde_json::from_str(r).unwrap()).collect();
    let changes = world.backend.changes();
    let ledger = world.backend.numbers("SELECT seq FROM {s}ledger WHERE pipeline = 'sim' ORDER BY seq");
    // The published rows equal the batch over the log.
    let published = by_window(results);
    let expected = batch(world);
    if published != expected {
        let missing: Vec<_> = expected.iter().filter(|(k, v)| published.get(*k) != Some(v)).take(3).collect();
        let extra: Vec<_> = published.iter().filter(|(k, v)| expected.get(*k) != Some(v)).take(3).collect();
        fail(format!(
            "published rows differ from the batch over the log ({} vs {} windows); batch has {missing:?}, published {extra:?}",
            published.len(),
            expected.len()
        ));
    }
    // seq: 1, 2, 3, ... with no gap, never back; the ledger's too.
    let mut ordered: Vec<i64> = changes.iter().map(|(s, _)| *s).collect();
    ordered.sort();
    if ordered.iter().enumerate().any(|(i, s)| *s != i as i64 + 1) {
        fail(format!("the change stream's seq has a gap or a repeat: {:?}", &ordered[..ordered.len().min(20)]));
    }
    if ledger.iter().enumerate().any(|(i, s)| *s != i as i64 + 1) {
        fail("the ledger's seq has a gap or a repeat".into());
    }
    // No revision twice; revisions only go up along seq.
    let mut by_seq = changes.clone();
    by_seq.sort_by_key(|(s, _)| *s);
    let mut last: BTreeMap<String, u64> = BTreeMap::new();
    for (seq, row) in &by_seq {
        let id = format!("{} {}", row["key"], row["window_start"]);
        let revision = row["revision"].as_u64().unwrap();
        if let Some(before) = last.insert(id.clone(), revision) {
            if revision <= before {
                fail(format!("window {id}: revision {revision} at seq {seq} after revision {before}"));
            }
        }
    }
}

fn simulate(kind: Kind, seed: u64) -> Tally {
    let mut world = World::new(kind, seed);
    world.start("server start");
    let actions = 400 + world.rng.below(400);
    for _ in 0..actions {
        world.act(seed);
    }
    world.settle();
    check(&world, seed);
    world.live = None;
    world.backend.close();
    let World { dir, tally, .. } = world;
    let _ = std::fs::remove_dir_all(dir);
    tally
}

/// Seeds for `WEIR_SIM_SECONDS` (else `default_seconds`), or the one `WEIR_SIM_SEED`.
fn simulate_for(kind: Kind, default_seconds: u64) {
    if let Some(seed) = std::env::var("WEIR_SIM_SEED").ok().and_then(|s| s.parse().ok()) {
        let tally = simulate(kind, seed);
        eprintln!("{kind:?} seed {seed}: {tally:?}");
        return;
    }
    let seconds: u64 = std::env::var("WEIR_SIM_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(default_seconds);
    let started = Instant::now();
    // A new first seed each run, printed, so failures are found across runs and replayable.
    let first =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 % 1_000_000;
    eprintln!("simulation on {kind:?}: seeds from {first} for {seconds} s");
    let mut total = Tally::default();
    let mut seeds = 0u64;
    while seeds == 0 || started.elapsed() < Duration::from_secs(seconds) {
        let seed = first + seeds;
        let t = simulate(kind, seed);
        total.appended += t.appended;
        total.steps += t.steps;
        total.checkpoints += t.checkpoints;
        total.crashes += t.crashes;
        total.crashes_after_commit += t.crashes_after_commit;
        total.failed_commits += t.failed_commits;
        total.torn_tails += t.torn_tails;
        total.stalls += t.stalls;
        total.pauses += t.pauses;
        total.replays += t.replays;
        total.zombies += t.zombies;
        total.fenced += t.fenced;
        seeds += 1;
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "simulation on {kind:?}: {seeds} seeds in {secs:.1} s ({:.0} seeds a minute): {total:?}",
        seeds as f64 * 60.0 / secs
    );
    assert!(total.crashes > 0 && total.failed_commits > 0 && total.torn_tails > 0 && total.replays > 0);
    if matches!(kind, Kind::Postgres) {
        assert!(total.zombies > 0 && total.fenced > 0, "no zombie was simulated, or none was fenced");
    }
}

#[test]
fn the_runner_survives_every_fault_the_simulation_injects() {
    simulate_for(Kind::Sqlite, 60);
}

#[test]
fn the_runner_survives_every_fault_the_simulation_injects_on_postgres_with_a_fence() {
    simulate_for(Kind::Postgres, 40);
}

/// A step that has read every record waiting checkpoints (publishes) at
/// once, with no time passing; a step that left records unread waits for
/// the interval (or `checkpoint_events`), so catching up writes few large
/// checkpoints.
/// Seeds of the tests below: a world's folder is named by its process,
/// backend and seed, its Postgres schema by its process and seed, and the
/// tests of one binary share a process, so each test has a seed of its own,
/// above those `simulate_for` draws.
const CAUGHT_UP_SEED: u64 = 9_000_000;
const CAUGHT_UP_OVER_PARTITIONS_SEED: u64 = 9_000_001;

fn caught_up_publishes_at_once(kind: Kind) {
    let mut world = World::new(kind, CAUGHT_UP_SEED);
    world.read_records = 4;
    world.start("server start");
    world.step(false); // nothing to read yet
    let stored = |world: &World| world.backend.stored_offsets().first().copied();
    let first: Vec<(u32, Vec<u8>)> = (0..3).map(|_| (0, world.event(0))).collect();
    world.append(first);
    assert!(world.step(false), "{kind:?}: 3 records read, 4 allowed: caught up, so it checkpoints at once");
    assert_eq!(stored(&world), Some(3), "{kind:?}: partition 0's stored offset");
    // Ten more, read 4 at a time: behind until the last read, with the clock standing still.
    let more: Vec<(u32, Vec<u8>)> = (0..10).map(|_| (0, world.event(0))).collect();
    world.append(more);
    assert!(!world.step(false), "{kind:?}: 4 of 10 read: behind, so it waits for the interval");
    assert!(!world.step(false), "{kind:?}: 8 of 10 read: still behind");
    assert_eq!(stored(&world), Some(3), "{kind:?}: a step behind checkpointed");
    assert!(world.step(false), "{kind:?}: the last 2 read: caught up, it checkpoints");
    assert_eq!(stored(&world), Some(13), "{kind:?}: partition 0's stored offset after catching up");
    world.live = None;
    world.backend.close();
    let _ = std::fs::remove_dir_all(&world.dir);
}

/// The log reads up to `read_records` from each partition in turn: a read
/// that took more than that in all, but fewer from every partition, read
/// each to its end and is caught up.
fn caught_up_over_partitions_publishes_at_once(kind: Kind) {
    let mut world = World::new(kind, CAUGHT_UP_OVER_PARTITIONS_SEED);
    world.read_records = 4;
    world.start("server start");
    world.step(false); // nothing to read yet
    let both: Vec<(u32, Vec<u8>)> = (0..6).map(|i| (i % 2, world.event(i % 2))).collect();
    world.append(both);
    assert!(world.step(false), "{kind:?}: 3 records from each of two partitions, 4 allowed from each: caught up");
    let stored = world.backend.stored_offsets();
    assert_eq!(stored.get(..2), Some(&[3, 3][..]), "{kind:?}: partitions 0 and 1's stored offsets");
    // Four from one partition: it may have more, so the step waits for the interval.
    let more: Vec<(u32, Vec<u8>)> = (0..4).map(|_| (1, world.event(1))).collect();
    world.append(more);
    assert!(!world.step(false), "{kind:?}: 4 of partition 1's records read, 4 allowed: maybe behind");
    assert!(world.step(false), "{kind:?}: nothing more read: caught up, it checkpoints");
    assert_eq!(world.backend.stored_offsets().get(1), Some(&7), "{kind:?}: partition 1's stored offset");
    world.live = None;
    world.backend.close();
    let _ = std::fs::remove_dir_all(&world.dir);
}

#[test]
fn a_step_that_read_every_partition_to_its_end_publishes_at_once() {
    caught_up_over_partitions_publishes_at_once(Kind::Sqlite);
}

#[test]
fn a_step_that_read_every_partition_to_its_end_publishes_at_once_on_postgres() {
    caught_up_over_partitions_publishes_at_once(Kind::Postgres);
}

#[test]
fn a_caught_up_step_publishes_without_waiting_for_the_interval() {
    caught_up_publishes_at_once(Kind::Sqlite);
}

#[test]
fn a_caught_up_step_publishes_without_waiting_for_the_interval_on_postgres() {
    caught_up_publishes_at_once(Kind::Postgres);
}

/// Seeds of the tests of records a source left out (see `CAUGHT_UP_SEED`).
const LEFT_OUT_SEED: u64 = 9_000_002;

/// A source that delivers a partition's records past some it left out is
/// read again from the next offset, so every record counts; a gap that the
/// source leaves again is counted as not delivered, and reading goes on.
fn records_left_out_are_read_again(kind: Kind, always: bool) {
    let seed = LEFT_OUT_SEED + if always { 10 } else { 0 } + matches!(kind, Kind::Postgres) as u64;
    let mut world = World::new(kind, seed);
    world.read_records = 100;
    world.skip = Some(Skip { partition: 1, from: 5, to: 9, always });
    world.start("server start");
    let events: Vec<(u32, Vec<u8>)> = (0..60).map(|i| (i % PARTITIONS, world.event(i % PARTITIONS))).collect();
    world.append(events);
    world.settle();
    let not_delivered = world.live.as_ref().map(|l| l.runner.status.lock().unwrap().offsets_not_delivered);
    if always {
        assert_eq!(not_delivered, Some(4), "{kind:?}: offsets 5..9 of partition 1 are counted as not delivered");
    } else {
        assert_eq!(not_delivered, Some(0), "{kind:?}: the records left out once were read again");
        check(&world, seed);
    }
    world.live = None;
    world.backend.close();
    let _ = std::fs::remove_dir_all(&world.dir);
}

#[test]
fn records_a_source_left_out_once_are_read_again_and_count() {
    records_left_out_are_read_again(Kind::Sqlite, false);
}

#[test]
fn records_a_source_left_out_once_are_read_again_and_count_on_postgres() {
    records_left_out_are_read_again(Kind::Postgres, false);
}

#[test]
fn records_a_source_never_delivers_are_counted_as_not_delivered() {
    records_left_out_are_read_again(Kind::Sqlite, true);
}

#[test]
fn records_a_source_never_delivers_are_counted_as_not_delivered_on_postgres() {
    records_left_out_are_read_again(Kind::Postgres, true);
}

/// Seeds of the tests of a checkpoint committing behind (see `CAUGHT_UP_SEED`).
const BEHIND_SEED: u64 = 9_000_020;

/// A step that is behind commits its checkpoint on a thread of its own and
/// returns; until that commit ends, the status says rows are unsaved (a
/// candidate is not ready) and the store holds the offsets before it. A
/// step that catches up commits before it returns.
fn committing_behind_leaves_rows_unsaved_until_stored(kind: Kind) {
    let seed = BEHIND_SEED + matches!(kind, Kind::Postgres) as u64;
    let mut world = World::new(kind, seed);
    world.read_records = 4;
    let gate: Gate = Arc::default();
    world.gate = Some(Arc::clone(&gate));
    world.start("server start");
    world.step(false); // nothing to read yet
    let events: Vec<(u32, Vec<u8>)> = (0..10).map(|_| (0, world.event(0))).collect();
    world.append(events);
    // A second on: the checkpoint is due and the status is published; 4 of 10 read, so behind.
    world.clock.advance(1_100);
    let returned = !world.step(false);
    let unsaved_while_committing = world.live.as_ref().map(|l| l.runner.status.lock().unwrap().unsaved);
    let stored_while_committing = world.backend.stored_offsets().first().copied();
    open_gate(&gate);
    assert!(returned, "{kind:?}: the step behind returned without reporting a checkpoint");
    assert_eq!(unsaved_while_committing, Some(true), "{kind:?}: the status said the rows were saved");
    assert_ne!(stored_while_committing, Some(4), "{kind:?}: the store held the checkpoint before its commit ended");
    // The rest read: caught up, so the step commits before it returns.
    let mut stored = None;
    for _ in 0..20 {
        world.clock.advance(1_100);
        world.step(false);
        stored = world.backend.stored_offsets().first().copied();
        if stored == Some(10) {
            break;
        }
    }
    assert_eq!(stored, Some(10), "{kind:?}: every record checkpointed once caught up");
    let unsaved = world.live.as_ref().map(|l| l.runner.status.lock().unwrap().unsaved);
    assert_eq!(unsaved, Some(false), "{kind:?}: caught up and stored, nothing is unsaved");
    world.live = None;
    world.backend.close();
    let _ = std::fs::remove_dir_all(&world.dir);
}

#[test]
fn a_checkpoint_committing_behind_leaves_rows_unsaved_until_it_is_stored() {
    committing_behind_leaves_rows_unsaved_until_stored(Kind::Sqlite);
}

#[test]
fn a_checkpoint_committing_behind_leaves_rows_unsaved_until_it_is_stored_on_postgres() {
    committing_behind_leaves_rows_unsaved_until_stored(Kind::Postgres);
}

//! The pipeline runner, one for both topologies: it reads a [`Source`]
//! (the embedded log, [`crate::embedded::LogSource`], or Kafka,
//! [`crate::kafka::KafkaSource`]), feeds the engines, and checkpoints
//! through [`Checkpoints`] (SQLite or Postgres).
//!
//! The partitions an engine reads together are a [`Scope`]: every
//! partition of the topic for the log (the pipeline's watermark is the
//! lowest of its partitions'), one partition for Kafka (its state moves with
//! it). The source says which partitions this worker holds, as they come and
//! go ([`Holder`]); the runner claims each scope in the store, which fences
//! out a previous holder where there is a fence, and restores its last
//! checkpoint. Then each step ([`Run::step`]):
//!
//! 1. reads the operator's commands from the store every interval (a pause,
//!    a replay);
//! 2. makes a partition with unread records active before any record of
//!    the step is processed, reads what the source has, and feeds each
//!    record to its scope's engine (records below the checkpointed offset,
//!    which a source may deliver again, are skipped; offsets it skipped are
//!    counted, never silent);
//! 3. marks a partition silent for `idle_timeout` idle (where an engine
//!    reads several);
//! 4. as soon as the step has caught up (its read stopped short of its
//!    limit, and no held partition is known to have more), or while behind
//!    every `checkpoint_interval` (from the end of the last checkpoint, and
//!    at least twice as long as that one took, up to a second) or after
//!    `checkpoint_events` events, ends the engine's batch (its rows) and
//!    commits a checkpoint of each changed
//!    scope: rows, ledger entries, the engine's changed state and the
//!    offsets, in one transaction, refused by the fence if another worker
//!    took the scope (the scope is then dropped). Caught up, stopping or
//!    replaying, the step commits before it returns; behind, it commits on
//!    a thread of its own while the next steps read and count (the store
//!    is that thread's until it ends, and whatever needs the store waits
//!    for it: the next checkpoint, a claim, a hand-over, a replay, the
//!    commands, a crash);
//! 5. applies a replay to each scope that has not applied it: what it
//!    counted is checkpointed, then its state starts again from the
//!    replay's offset, with revisions above every one published.
//!
//! Time is passed in as a [`Clock`], so the simulation test
//! (`tests/simulation.rs`) drives the runner step by step, crashing it
//! between any two steps. [`Runner::run`] calls the steps on the system
//! clock under the restart loop ([`supervise`]): a failure drops every
//! engine and starts again from the last checkpoints.
//!
//! Invariant: rows become visible only with the checkpoint that holds the
//! state and offsets they came from, so after a crash the runner restores
//! that checkpoint, reads on from its offsets and publishes exactly what an
//! uninterrupted run publishes.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use weir_contract::{Contract, ServerConfig};
use weir_engine::{Delta, RowFormat};
use weir_engine::{Engine, EventIn, Mode, Output, Reason, SpareMade};
use weir_store::checkpoint::{self, CheckpointError, Checkpoints, Scope, Write};
use weir_store::{Replay, VersionState};

use crate::status::{KafkaPartition, Status};
use crate::telemetry;
use crate::{lock, supervise, Clock, KeepPublished, SystemClock};

/// Records a source is asked for in one step, by default (the log reads
/// this many from each partition).
pub const READ_RECORDS: usize = 2_000;

/// Where a runner reads records: the embedded log or Kafka.
pub trait Source: Send {
    /// Whether each partition has an engine and a checkpoint of its own
    /// ([`Scope::Partition`]) or one engine reads them all ([`Scope::Topic`]).
    fn per_partition(&self) -> bool;
    /// Starts reading for a run. The source tells `holder` which partitions
    /// this worker holds: at once, or as they come and go during [`Source::read`].
    fn open(&mut self, holder: Arc<dyn Holder>) -> crate::Result<()>;
    /// Reads what is there into `batch` (at most `max` records, or `max`
    /// from each partition where the source reads them in turn), from
    /// `next`, the runner's next offset per partition, where the source
    /// keeps no position of its own; waits up to `wait` when nothing is there.
    /// True when the read stopped at its limit (`max` records in all, or
    /// from one partition): more may be waiting.
    fn read(&mut self, next: &[(u32, u64)], max: usize, wait: Duration, batch: &mut Batch) -> crate::Result<bool>;
    /// The end (one past the last record) of each of `partitions`, as the
    /// source last learned it (it may ask the broker at most once a second).
    fn ends(&mut self, partitions: &[u32]) -> crate::Result<Vec<(u32, u64)>>;
    /// The first and end offset of a partition, asked now (a replay).
    fn bounds(&mut self, partition: u32) -> crate::Result<(u64, u64)>;
    /// Reads `partition` from `offset` on (a replay).
    fn seek(&mut self, partition: u32, offset: u64) -> crate::Result<()>;
    /// The offsets just checkpointed, for tools that read them where the
    /// source keeps them (Kafka's group offsets); weir resumes from the store's.
    fn checkpointed(&mut self, offsets: &[(u32, u64)]);
    /// Stops reading (Kafka: leaves the group, handing partitions over).
    fn close(&mut self);
}

/// What a source tells the runner as partitions come and go. Kafka's
/// rebalance callbacks call it during [`Source::read`], so a partition is
/// checkpointed before it is handed over.
pub trait Holder: Send + Sync {
    fn assigned(&self, partitions: &[u32]);
    fn revoked(&self, partitions: &[u32]);
}

/// One record as read.
#[derive(Debug, Clone, Copy)]
pub struct Record {
    pub partition: u32,
    pub offset: u64,
    /// When it was appended to the log, or Kafka's timestamp (epoch ms).
    pub time_ms: Option<i64>,
    /// The source refused it (a Kafka record with its own `$kafka`
    /// member): the engine ledgers it `bad_type` without reading it.
    pub forged: bool,
    start: usize,
    end: usize,
}

/// Records read in one step, their payloads in one buffer.
#[derive(Debug, Default)]
pub struct Batch {
    records: Vec<Record>,
    bytes: Vec<u8>,
}

impl Batch {
    pub fn push(&mut self, partition: u32, offset: u64, time_ms: Option<i64>, payload: &[u8]) {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(payload);
        self.records.push(Record { partition, offset, time_ms, forged: false, start, end: self.bytes.len() });
    }

    /// A record whose payload has its own `$kafka` member.
    pub fn push_forged(&mut self, partition: u32, offset: u64, time_ms: Option<i64>, payload: &[u8]) {
        self.push(partition, offset, time_ms, payload);
        if let Some(r) = self.records.last_mut() {
            r.forged = true;
        }
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    pub fn clear(&mut self) {
        self.records.clear();
        self.bytes.clear();
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Record, &[u8])> {
        self.records.iter().map(|r| (r, &self.bytes[r.start..r.end]))
    }
}

/// A pipeline's runner: what stays the same across its runs.
pub struct Runner {
    pub contract: Contract,
    pub config: Arc<ServerConfig>,
    pub status: Arc<Mutex<Status>>,
    pub stop: Arc<AtomicBool>,
    /// Whether the pipeline is paused, as the store last said (for status).
    pub paused: Arc<AtomicBool>,
    /// Records asked of the source in one step.
    pub read_records: usize,
    /// Rung after every checkpoint committed (see [`crate::bell`]).
    pub bell: Arc<crate::bell::Bell>,
}

/// A source and a store connection for one run.
pub type Connected = (Box<dyn Source>, Box<dyn Checkpoints>);

impl Runner {
    /// Runs until `stop` is set (then checkpoints everything and closes the
    /// source). Each run starts with `connect` (a new source and store
    /// connection); a failure (the database locked or full, the source
    /// unreadable) drops every engine and starts again from the last
    /// checkpoints after a backoff of 0.5 s doubling to 30 s, as Flink's
    /// restart strategy does: nothing was published past those checkpoints,
    /// so nothing is lost or counted twice, and the lag shows the stall meanwhile.
    pub fn run(self, mut connect: impl FnMut() -> crate::Result<Connected>) {
        let name = self.contract.pipeline.name.clone();
        let (status, stop) = (Arc::clone(&self.status), Arc::clone(&self.stop));
        let clock = SystemClock::new();
        supervise(&name, &status, &stop, |why| loop {
            let (source, mut checkpoints) = connect()?;
            // A superseded version holds nothing (no state, no partitions) until it runs again.
            if !self.wait_until_it_runs(checkpoints.as_mut())? {
                return Ok(());
            }
            let mut run = Run::start(&self, source, checkpoints, &clock, why)?;
            let mut wait = Duration::ZERO;
            loop {
                let stopping = self.stop.load(Ordering::SeqCst);
                let step = run.step(&self, &clock, stopping, wait);
                // A failure drops the run: nothing more is committed, and the next run starts from the last checkpoints.
                let step = step?;
                if stopping {
                    run.close();
                    return Ok(());
                }
                if !step.runs {
                    run.close();
                    break;
                }
                // Caught up: the next read waits for records, a checkpoint to be due, or a stop.
                wait = if step.read_any { Duration::ZERO } else { step.next_due.min(Duration::from_millis(100)) };
            }
        });
    }

    /// Waits while the contract's version is superseded (or no longer
    /// stored), reading its state every checkpoint interval; `false` on a stop.
    fn wait_until_it_runs(&self, checkpoints: &mut dyn Checkpoints) -> crate::Result<bool> {
        let every = Duration::from_millis(self.config.checkpoint_interval_ms.max(1) as u64);
        loop {
            let state = checkpoints.version_state()?;
            lock(&self.status).version_state = state;
            if state.is_some_and(VersionState::runs) {
                return Ok(true);
            }
            if self.stop.load(Ordering::SeqCst) {
                return Ok(false);
            }
            std::thread::sleep(every);
        }
    }
}

/// What one step did.
#[derive(Debug, Clone, Copy)]
pub struct Step {
    /// Records were read (so the next step may find more at once).
    pub read_any: bool,
    /// A checkpoint was committed.
    pub checkpointed: bool,
    /// A replay was applied.
    pub replayed: bool,
    /// How long until a checkpoint or a read of the commands is due.
    pub next_due: Duration,
    /// The version still runs (it is live or a candidate); when not, the
    /// step checkpointed everything, as at a stop, and the run should close.
    pub runs: bool,
}

/// One partition of a scope, as the runner sees it.
#[derive(Debug, Clone)]
struct Part {
    /// The next offset to read.
    next: u64,
    /// The source's end of the partition, as last learned.
    end: u64,
    idle: bool,
    /// When it last had data, on the monotonic clock.
    heard: u64,
    /// The time of the last record read (Kafka's timestamp).
    last_time_ms: Option<i64>,
    /// A new version's `[pipeline] start`: records appended before it are
    /// not its input, until the first one at or after it (as Kafka's
    /// offsets for a time: the earliest offset whose time is at or after it).
    from_time: Option<i64>,
    /// A record arrived past `next`: the source was sent back to `next`
    /// (this offset) once, and the partition's later records in that read
    /// were dropped. A gap found again there is the source's own.
    reread: Option<u64>,
}

/// How a runner's engine works, whether new or restored: it tracks what
/// changed for checkpoints, emits rows per batch, and has its tables'
/// next memory made ahead on other threads ([`Held::make_spares`]).
fn serving(engine: &mut Engine) {
    engine.track_changes();
    engine.emit_per_batch();
    engine.make_spares_ahead();
}

/// A claimed scope: its engine and where it stands.
struct Unit {
    engine: Engine,
    /// Memory its engine's tables asked for, being made.
    spares: Vec<std::thread::JoinHandle<SpareMade>>,
    out: Output,
    parts: BTreeMap<u32, Part>,
    generation: i64,
    run: i64,
    /// The last replay applied.
    replayed: i64,
    /// Events since the last checkpoint.
    since: u64,
    dirty: bool,
    /// During a replay from an event time: the rows left out (see
    /// [`KeepPublished`]), until each partition has read what it held when
    /// the replay started.
    republish_after: Option<(KeepPublished, Vec<(u32, u64)>)>,
}

impl Unit {
    fn offsets(&self) -> Vec<(u32, u64)> {
        self.parts.iter().map(|(p, part)| (*p, part.next)).collect()
    }
}

/// One scope's checkpoint, taken from its unit, to commit now or behind.
struct Taken {
    scope: Scope,
    generation: i64,
    format: RowFormat,
    out: Output,
    delta: Delta,
    offsets: Vec<(u32, u64)>,
    now_ms: i64,
    run: i64,
    replay: Option<i64>,
    /// Events, rows and ledger entries it holds (for its span).
    size: (u64, usize, usize),
}

impl Taken {
    fn commit(self, checkpoints: &mut dyn Checkpoints) -> checkpoint::Result<()> {
        let Taken { scope, generation, format, out, delta, offsets, now_ms, run, replay, .. } = self;
        let write =
            Write { scope, generation, format: &format, out: &out, delta, offsets: &offsets, now_ms, run, replay };
        checkpoints.commit(write)
    }
}

/// A checkpoint committed, or refused by the fence, for the step to report.
struct Committed {
    scope: Scope,
    offsets: Vec<(u32, u64)>,
    size: (u64, usize, usize),
    began_ms: i64,
    took: Duration,
    ok: bool,
}

/// A checkpoint sent to commit behind: its scope, offsets, size and start.
type Sent = (Scope, Vec<(u32, u64)>, (u64, usize, usize), i64);

/// What the thread of [`Behind`] gives back: the store, with each commit's
/// result and how long it took (it stops at the first failure other than
/// the fence's).
type Ended = (Box<dyn Checkpoints>, Vec<(checkpoint::Result<()>, Duration)>);

/// Checkpoints of a step that was behind, committing on a thread of their
/// own while the next steps read: the store is the thread's until it ends.
struct Behind {
    /// In the order committed.
    scopes: Vec<Sent>,
    job: std::thread::JoinHandle<Ended>,
}

/// What a run's steps and the source's [`Holder`] calls share.
struct Held {
    contract: Contract,
    /// `None` while [`Held::behind`] commits (or if its thread panicked).
    checkpoints: Option<Box<dyn Checkpoints>>,
    behind: Option<Behind>,
    /// Checkpoints that ended since the step last reported them.
    committed: Vec<Committed>,
    per_partition: bool,
    units: BTreeMap<Scope, Unit>,
    /// Why the run started, recorded with each claim.
    why: String,
    /// The monotonic clock at the last step.
    now: u64,
    /// A failure inside a [`Holder`] call, for the step to return.
    failed: Option<String>,
    /// Checkpoints the fence refused since the step last looked.
    fenced: u64,
    /// The run failed or was dropped: what the engines hold may be half
    /// checkpointed, so nothing more is claimed or committed.
    abandoned: bool,
}

impl Held {
    fn scope_of(&self, partition: u32) -> Scope {
        if self.per_partition {
            Scope::Partition(partition)
        } else {
            Scope::Topic
        }
    }

    fn new_engine(&self, partitions: u32) -> crate::Result<Engine> {
        let mut engine = Engine::new(&self.contract, Mode::Stream, if self.per_partition { 1 } else { partitions })?;
        if self.per_partition {
            engine.read_one_partition();
        }
        Ok(engine)
    }

    /// Claims `scope` over `partitions` and restores its last checkpoint.
    fn claim(&mut self, scope: Scope, partitions: &[u32]) -> crate::Result<()> {
        let why = self.why.clone();
        let claimed = self.store()?.claim(scope, &why)?;
        let c = &self.contract;
        let from_time = if claimed.state.is_none() { c.pipeline.start_ms } else { None };
        let mut engine = match claimed.state {
            Some(s) => Engine::restore_parts(c, &s.header, s.windows, s.id_batches)?,
            None => self.new_engine(partitions.len() as u32)?,
        };
        if self.per_partition {
            engine.read_one_partition();
        }
        serving(&mut engine);
        let mut out = Output::default();
        let mut parts = BTreeMap::new();
        for &p in partitions {
            let next = claimed.offsets.iter().find(|(q, _)| *q == p).map_or(0, |(_, o)| *o);
            parts.insert(
                p,
                Part { next, end: next, idle: false, heard: self.now, last_time_ms: None, from_time, reread: None },
            );
            if !self.per_partition {
                // Every partition starts active, as the runner sees it, whatever the checkpoint held.
                engine.set_partition_idle(p, false, &mut out);
            }
        }
        if let Scope::Partition(p) = scope {
            let from = parts.get(&p).map_or(0, |part| part.next);
            eprintln!(
                "weir: {} took partition {p} (generation {}) from offset {from}",
                c.pipeline.name, claimed.generation
            );
        }
        let unit = Unit {
            engine,
            out,
            parts,
            generation: claimed.generation,
            run: claimed.run,
            replayed: claimed.replayed,
            since: 0,
            dirty: false,
            republish_after: None,
            spares: Vec::new(),
        };
        self.units.insert(scope, unit);
        Ok(())
    }

    /// Gives each engine the spares made since the last step, and starts
    /// making, each on a thread of its own, those its tables now want. A
    /// thread that cannot start leaves its table to double as before.
    fn make_spares(&mut self) {
        for unit in self.units.values_mut() {
            let (made, making) = std::mem::take(&mut unit.spares).into_iter().partition(|job| job.is_finished());
            unit.spares = making;
            for job in made {
                if let Ok(spare) = job.join() {
                    unit.engine.give_spare(spare);
                }
            }
            for wanted in unit.engine.take_spares_wanted() {
                let job = std::thread::Builder::new().name("weir-spare".into()).spawn(move || wanted.make());
                unit.spares.extend(job.ok());
            }
        }
    }

    /// The store, once the checkpoints committing behind have ended.
    fn store(&mut self) -> crate::Result<&mut dyn Checkpoints> {
        self.settle(true);
        match self.checkpoints.as_deref_mut() {
            Some(store) => Ok(store),
            None => crate::bail!("{}", self.failed.clone().unwrap_or_else(|| "the checkpoint thread stopped".into())),
        }
    }

    /// Ends the batch of `scope` and takes its checkpoint out of the unit
    /// (its rows, ledger entries, state change and offsets); `None` when
    /// the scope is not held.
    fn take(&mut self, scope: Scope, replay: Option<i64>, now_ms: i64) -> Option<Taken> {
        let unit = self.units.get_mut(&scope)?;
        unit.engine.end_batch(&mut unit.out);
        if let Some((keep, until)) = &unit.republish_after {
            unit.out.rows.retain(|row| !keep.keeps(row));
            let read_all = until.iter().all(|(p, u)| unit.parts.get(p).is_none_or(|part| part.next >= *u));
            if read_all {
                unit.republish_after = None;
            }
        }
        let size = (unit.since, unit.out.rows.len(), unit.out.ledger.len());
        let taken = Taken {
            scope,
            generation: unit.generation,
            format: unit.engine.format().clone(),
            out: std::mem::take(&mut unit.out),
            delta: unit.engine.take_delta(),
            offsets: unit.offsets(),
            now_ms,
            run: unit.run,
            replay,
            size,
        };
        unit.since = 0;
        unit.dirty = false;
        Some(taken)
    }

    /// Commits a checkpoint of `scope` now, or with `replay` the first one
    /// of a replay; `Ok(false)` when the fence refused it (the scope is then dropped).
    fn commit(&mut self, scope: Scope, replay: Option<i64>, now_ms: i64) -> crate::Result<bool> {
        self.store()?;
        if self.abandoned {
            return Ok(false);
        }
        let Some(taken) = self.take(scope, replay, now_ms) else { return Ok(true) };
        let (offsets, size, started) = (taken.offsets.clone(), taken.size, Instant::now());
        let result = taken.commit(self.store()?);
        self.ended(scope, offsets, size, now_ms, started.elapsed(), result)
    }

    /// Commits `taken` on a thread of its own; [`Held::settle`] takes the results.
    fn commit_behind(&mut self, taken: Vec<Taken>) -> crate::Result<()> {
        if taken.is_empty() {
            return Ok(());
        }
        self.store()?;
        let Some(mut store) = self.checkpoints.take() else { return Ok(()) };
        let scopes = taken.iter().map(|t| (t.scope, t.offsets.clone(), t.size, t.now_ms)).collect();
        let job = std::thread::Builder::new().name("weir-checkpoint".into()).spawn(move || {
            let mut results = Vec::with_capacity(taken.len());
            for t in taken {
                let started = Instant::now();
                let result = t.commit(store.as_mut());
                let failed = matches!(result, Err(ref e) if !matches!(e, CheckpointError::Fenced { .. }));
                results.push((result, started.elapsed()));
                if failed {
                    break;
                }
            }
            (store, results)
        })?;
        self.behind = Some(Behind { scopes, job });
        Ok(())
    }

    /// Takes the results of the checkpoints committing behind, waiting for
    /// them when `wait` (else only when they have ended).
    fn settle(&mut self, wait: bool) {
        if !wait && self.behind.as_ref().is_some_and(|b| !b.job.is_finished()) {
            return;
        }
        let Some(Behind { scopes, job }) = self.behind.take() else { return };
        match job.join() {
            Ok((store, results)) => {
                self.checkpoints = Some(store);
                for ((scope, offsets, size, began_ms), (result, took)) in scopes.into_iter().zip(results) {
                    if let Err(e) = self.ended(scope, offsets, size, began_ms, took, result) {
                        self.failed.get_or_insert(format!("checkpointing {scope}: {e:#}"));
                    }
                }
            }
            Err(panic) => {
                let why = (panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "(no message)".to_owned());
                self.failed.get_or_insert(format!("the checkpoint thread panicked: {why}"));
                self.abandoned = true;
            }
        }
    }

    /// Records how a commit of `scope` ended: `Ok(false)` when the fence
    /// refused it (the scope is dropped); another failure abandons the run,
    /// since a later checkpoint would lack this one's change.
    fn ended(
        &mut self,
        scope: Scope,
        offsets: Vec<(u32, u64)>,
        size: (u64, usize, usize),
        began_ms: i64,
        took: Duration,
        result: checkpoint::Result<()>,
    ) -> crate::Result<bool> {
        let ok = match result {
            Ok(()) => true,
            Err(e @ CheckpointError::Fenced { .. }) => {
                eprintln!("weir: {e}");
                self.units.remove(&scope);
                self.fenced += 1;
                false
            }
            Err(e) => {
                self.abandoned = true;
                return Err(e.into());
            }
        };
        self.committed.push(Committed { scope, offsets, size, began_ms, took, ok });
        Ok(ok)
    }

    /// Applies replay `id` to `scope`: what it counted so far is
    /// checkpointed, then its state starts again from the replay's offset
    /// (with revisions above `floor`) in a checkpoint that drops the stored state.
    fn replay(
        &mut self,
        scope: Scope,
        (id, replay): (i64, Replay),
        floor: u32,
        source: &mut dyn Source,
        now_ms: i64,
    ) -> crate::Result<()> {
        if !self.commit(scope, None, now_ms)? {
            return Ok(());
        }
        let Some(partitions) = self.units.get(&scope).map(|u| u.parts.len() as u32) else { return Ok(()) };
        let mut engine = self.new_engine(partitions)?;
        engine.set_revision_floor(floor);
        serving(&mut engine);
        let run = self.store()?.start_run(scope, "replay")?;
        let (c, now) = (self.contract.clone(), self.now);
        let Some(unit) = self.units.get_mut(&scope) else { return Ok(()) };
        let replaced = std::mem::replace(&mut unit.engine, engine);
        let mut until = Vec::new();
        for (p, part) in unit.parts.iter_mut() {
            let (low, high) = source.bounds(*p)?;
            let from = replay.from_offset.unwrap_or(0).max(low);
            source.seek(*p, from)?;
            // Records before the version's start are not its input in a replay either.
            let from_time = c.pipeline.start_ms;
            *part = Part {
                next: from,
                end: high.max(from),
                idle: false,
                heard: now,
                last_time_ms: None,
                from_time,
                reread: None,
            };
            until.push((*p, high));
        }
        unit.republish_after = replay.from_time.map(|t| (KeepPublished::new(&c, t, replaced.watermark()), until));
        unit.replayed = id;
        unit.run = run;
        if self.commit(scope, Some(id), now_ms)? {
            let from: Vec<u64> =
                self.units.get(&scope).map(|u| u.parts.values().map(|p| p.next).collect()).unwrap_or_default();
            eprintln!("weir: {} replays {scope} from offsets {from:?}", c.pipeline.name);
        }
        Ok(())
    }
}

/// The [`Holder`] a run hands its source.
struct HeldRef(Arc<Mutex<Held>>);

impl Holder for HeldRef {
    fn assigned(&self, partitions: &[u32]) {
        let mut held = lock(&self.0);
        if held.abandoned {
            return;
        }
        let mut scopes: BTreeMap<Scope, Vec<u32>> = BTreeMap::new();
        for &p in partitions {
            scopes.entry(held.scope_of(p)).or_default().push(p);
        }
        for (scope, partitions) in scopes {
            if held.units.contains_key(&scope) {
                continue;
            }
            if let Err(e) = held.claim(scope, &partitions) {
                held.failed = Some(format!("taking {scope}: {e:#}"));
            }
        }
    }

    fn revoked(&self, partitions: &[u32]) {
        let mut held = lock(&self.0);
        let name = held.contract.pipeline.name.clone();
        for &p in partitions {
            let scope = held.scope_of(p);
            if held.abandoned {
                held.units.remove(&scope);
                continue;
            }
            if let Err(e) = held.commit(scope, None, weir_log::now_ms()) {
                held.failed = Some(format!("checkpointing {scope} before handing it over: {e:#}"));
            }
            if held.units.remove(&scope).is_some() {
                eprintln!("weir: {name} handed {scope} over");
            }
        }
    }
}

/// A candidate checkpoints after this many events while behind (or
/// `checkpoint_events`, when that is more).
const CANDIDATE_EVENTS: u64 = 1_000_000;

/// How long after the last checkpoint the next one is due while a step
/// reads (`interval`, in ms). Behind, committing takes at most a third of
/// the time: the next checkpoint waits at least twice as long as the last
/// one took (`last_took`), and no more than a second for that (results are
/// published at least every second), so a backlog is caught up in fewer,
/// larger transactions, each window writing one row per checkpoint.
fn pause_after(interval: u64, behind: bool, last_took: u64) -> u64 {
    match behind {
        true => interval.max(last_took.saturating_mul(2).min(1_000)),
        false => interval,
    }
}

/// One run of a pipeline between a start (from the last checkpoints) and a
/// stop or a crash. Dropping it without a stop is a crash: what it did
/// since its last checkpoints is gone, and the next [`Run::start`]
/// continues from them.
pub struct Run {
    source: Box<dyn Source>,
    held: Arc<Mutex<Held>>,
    batch: Batch,
    last_checkpoint: u64,
    /// How long the last checkpoint took (ms, every scope's commit).
    last_took: u64,
    /// Operator actions are read from the store (where the HTTP side wrote them) every interval.
    commands_read: Option<u64>,
    replay: Option<(i64, Replay)>,
    /// Whether this version runs (live or candidate), as the store last said.
    reading: bool,
    /// Whether it is a candidate (checkpointed less often: no reader waits for its rows).
    candidate: bool,
    status_published: u64,
    /// When the state's bytes were last measured (a walk of every window),
    /// and what they were: measured at most once a second, but at once
    /// while the state was empty (so a first window shows).
    bytes_measured: Option<(u64, usize)>,
    idle_after: u64,
    interval: u64,
}

impl Drop for Run {
    /// A run dropped without [`Run::close`] (a failure, a crash) commits
    /// nothing more: a source that hands partitions over as it goes only drops them.
    fn drop(&mut self) {
        let mut held = lock(&self.held);
        held.abandoned = true;
        // A checkpoint committing behind ends first, as a crash after its commit.
        held.settle(true);
    }
}

impl Run {
    /// Opens the source, claims what it holds now and restores it.
    pub fn start(
        r: &Runner,
        mut source: Box<dyn Source>,
        checkpoints: Box<dyn Checkpoints>,
        clock: &dyn Clock,
        why: &str,
    ) -> crate::Result<Run> {
        let now = clock.monotonic_ms();
        let held = Arc::new(Mutex::new(Held {
            contract: r.contract.clone(),
            checkpoints: Some(checkpoints),
            behind: None,
            committed: Vec::new(),
            per_partition: source.per_partition(),
            units: BTreeMap::new(),
            why: why.to_owned(),
            now,
            failed: None,
            fenced: 0,
            abandoned: false,
        }));
        source.open(Arc::new(HeldRef(Arc::clone(&held))))?;
        if let Some(f) = lock(&held).failed.take() {
            return Err(crate::Error::Refused(f));
        }
        let mut run = Run {
            source,
            held,
            batch: Batch::default(),
            last_checkpoint: now,
            last_took: 0,
            commands_read: None,
            replay: None,
            reading: true,
            candidate: false,
            status_published: now,
            bytes_measured: None,
            idle_after: r.config.idle_timeout_ms.max(0) as u64,
            interval: r.config.checkpoint_interval_ms.max(1) as u64,
        };
        run.publish_status(r, None, now);
        Ok(run)
    }

    /// One pass: read the operator commands when due, read what the source
    /// has (waiting up to `wait` when nothing is there), mark silent
    /// partitions idle, checkpoint when due (or `stopping`), and apply a replay.
    pub fn step(&mut self, r: &Runner, clock: &dyn Clock, stopping: bool, wait: Duration) -> crate::Result<Step> {
        let now = clock.monotonic_ms();
        lock(&self.held).now = now;
        self.read_commands(r, now)?;
        // A version superseded since the last read checkpoints what it has, as at a stop.
        let stopping = stopping || !self.reading;
        let next = self.note_ends(now)?;
        self.batch.clear();
        // A read that stopped short of its limit found no more waiting.
        let short_read = !self.source.read(&next, r.read_records.max(1), wait, &mut self.batch)?;
        let read_any = !self.batch.is_empty();
        let now = clock.monotonic_ms();
        self.process_batch(r, now, clock.wall_ms())?;
        self.mark_idle(now);
        self.take_failures(r)?;
        let any_checkpoint = self.checkpoint(r, clock, now, stopping, short_read)?;
        let replayed = self.apply_replay(clock)?;
        self.take_failures(r)?;
        let now = clock.monotonic_ms();
        if any_checkpoint || replayed || now.saturating_sub(self.status_published) >= 1_000 {
            self.publish_status(r, any_checkpoint.then(|| clock.wall_ms()), now);
            self.status_published = now;
        }
        if replayed {
            // The status shows where the replay starts before it counts the replay.
            lock(&r.status).replays += 1;
        }
        let dirty = lock(&self.held).units.values().any(|u| u.dirty);
        let next_due =
            if dirty { self.interval.saturating_sub(now.saturating_sub(self.last_checkpoint)) } else { self.interval };
        Ok(Step {
            read_any,
            checkpointed: any_checkpoint,
            replayed,
            next_due: Duration::from_millis(next_due),
            runs: self.reading,
        })
    }

    /// The operator's commands, read from the store every interval: pause,
    /// the version's state, and a replay asked since the last.
    fn read_commands(&mut self, r: &Runner, now: u64) -> crate::Result<()> {
        // Checkpoints committing behind that have ended are taken now; while they commit,
        // the store is theirs, and the commands wait for a step after them.
        let committing = {
            let mut held = lock(&self.held);
            held.settle(false);
            held.behind.is_some()
        };
        if committing || self.commands_read.is_some_and(|at| now.saturating_sub(at) < self.interval) {
            return Ok(());
        }
        let mut held = lock(&self.held);
        r.paused.store(held.store()?.is_paused()?, Ordering::SeqCst);
        let state = held.store()?.version_state()?;
        lock(&r.status).version_state = state;
        self.reading = state.is_some_and(VersionState::runs);
        self.candidate = state == Some(VersionState::Candidate);
        let oldest = held.units.values().map(|u| u.replayed).min();
        self.replay = match oldest {
            Some(oldest) => held.store()?.last_replay()?.filter(|(id, _)| *id > oldest),
            None => None,
        };
        self.commands_read = Some(now);
        Ok(())
    }

    /// Where each held partition ends now, and the offsets to read next. A
    /// partition with unread records is active before any record of this
    /// step is processed, so a burst after a silence holds the watermark
    /// back from the first record on.
    fn note_ends(&mut self, now: u64) -> crate::Result<Vec<(u32, u64)>> {
        let (held_partitions, next) = {
            let held = lock(&self.held);
            let next: Vec<(u32, u64)> = held.units.values().flat_map(Unit::offsets).collect();
            (next.iter().map(|(p, _)| *p).collect::<Vec<u32>>(), next)
        };
        let ends = self.source.ends(&held_partitions)?;
        let mut held = lock(&self.held);
        for (p, end) in ends {
            let scope = held.scope_of(p);
            let Some(unit) = held.units.get_mut(&scope) else { continue };
            let Some(part) = unit.parts.get_mut(&p) else { continue };
            part.end = end;
            if part.idle && end > part.next {
                part.idle = false;
                part.heard = now;
                unit.engine.set_partition_idle(p, false, &mut unit.out);
            }
        }
        Ok(next)
    }

    /// The records read, each through its scope's engine in offset order
    /// (a gap is read once more before it is called missing).
    fn process_batch(&mut self, r: &Runner, now: u64, wall: i64) -> crate::Result<()> {
        let mut not_delivered = 0;
        let mut held = lock(&self.held);
        let held = &mut *held;
        let name = &held.contract.pipeline.name;
        let mut latencies = Vec::with_capacity(self.batch.len());
        let mut producer_lags = Vec::with_capacity(self.batch.len());
        // Partitions sent back to their next offset in this read: their later records wait.
        let mut sent_back: Vec<u32> = Vec::new();
        for (rec, bytes) in self.batch.iter() {
            let scope = if held.per_partition { Scope::Partition(rec.partition) } else { Scope::Topic };
            // A record of a partition handed over (read before the hand-over) is not this worker's.
            let Some(unit) = held.units.get_mut(&scope) else { continue };
            let Some(part) = unit.parts.get_mut(&rec.partition) else { continue };
            if rec.offset < part.next || sent_back.contains(&rec.partition) {
                continue; // counted before the last checkpoint, or read again from `next`
            }
            if rec.offset > part.next && part.reread != Some(part.next) {
                // Records past `next`: before calling anything missing, read once
                // more from `next` (a client may have dropped what it had queued).
                eprintln!(
                    "weir: {name}: partition {}: offset {} arrived where {} was next; reading again from {}",
                    rec.partition, rec.offset, part.next, part.next
                );
                self.source.seek(rec.partition, part.next)?;
                part.reread = Some(part.next);
                sent_back.push(rec.partition);
                continue;
            }
            part.reread = None;
            if rec.offset > part.next {
                // Offsets the source did not deliver when asked again: removed by retention
                // or compaction, transaction markers, or a broker fault (tansu answers a
                // fetch from inside a record batch with the batch after it). Never silent.
                eprintln!(
                    "weir: {name}: partition {}: offset {} was delivered after {}; offsets {}..{} were not delivered",
                    rec.partition,
                    rec.offset,
                    part.next,
                    part.next,
                    rec.offset - 1
                );
                not_delivered += rec.offset - part.next;
            }
            part.next = rec.offset + 1;
            part.end = part.end.max(part.next);
            part.heard = now;
            part.last_time_ms = rec.time_ms.or(part.last_time_ms);
            if part.from_time.is_some_and(|from| rec.time_ms.is_some_and(|t| t < from)) {
                continue; // before this version's start
            }
            part.from_time = None;
            if part.idle {
                part.idle = false;
                unit.engine.set_partition_idle(rec.partition, false, &mut unit.out);
            }
            latencies.extend(rec.time_ms.map(|t| wall.saturating_sub(t).max(0) as f64 / 1e3));
            let event = EventIn { partition: rec.partition, offset: rec.offset, bytes };
            unit.engine.set_clock(wall);
            if rec.forged {
                unit.engine.refuse(event, Reason::BadType, weir_engine::intake::reserved_why(), &mut unit.out);
            } else {
                unit.engine.process(event, &mut unit.out);
                if let (Some(append), Some(t)) = (rec.time_ms, unit.engine.last_event_time()) {
                    producer_lags.push(append.saturating_sub(t).max(0) as f64 / 1e3);
                }
            }
            unit.since += 1;
            unit.dirty = true;
        }
        held.make_spares();
        if !latencies.is_empty() || not_delivered > 0 {
            let mut s = lock(&r.status);
            s.offsets_not_delivered += not_delivered;
            for l in latencies {
                s.processing.observe(l);
            }
            for l in producer_lags.drain(..) {
                s.producer_lag.observe(l);
            }
        }
        Ok(())
    }

    /// Partitions silent for `idle_timeout` are idle: the watermark stops
    /// waiting for them. Only where an engine reads several partitions.
    fn mark_idle(&mut self, now: u64) {
        let mut held = lock(&self.held);
        if held.per_partition {
            return;
        }
        for unit in held.units.values_mut() {
            for (p, part) in unit.parts.iter_mut() {
                if !part.idle && now.saturating_sub(part.heard) >= self.idle_after {
                    part.idle = true;
                    unit.engine.set_partition_idle(*p, true, &mut unit.out);
                    unit.dirty = true;
                }
            }
        }
    }

    /// Takes the checkpoints that are due and commits them, here or behind;
    /// tells the source which offsets are now checkpointed. Whether any was.
    fn checkpoint(
        &mut self,
        r: &Runner,
        clock: &dyn Clock,
        now: u64,
        stopping: bool,
        short_read: bool,
    ) -> crate::Result<bool> {
        // A candidate building from the retained input is read by no one by default: it
        // checkpoints for its own safety, not for readers, so every 5 s or CANDIDATE_EVENTS
        // events while it is behind; once caught up, as a live version.
        let behind = lock(&self.held).units.values().any(|u| u.parts.values().any(|p| p.end > p.next));
        let (interval, events) = match self.candidate && behind {
            true => (self.interval.max(5_000), r.config.checkpoint_events.max(CANDIDATE_EVENTS)),
            false => (self.interval, r.config.checkpoint_events),
        };
        // Caught up (nothing more to read now, as far as the source knows), a scope publishes at
        // once: a row waits for its checkpoint's commit, not for the interval. Behind, it waits
        // for the interval or `checkpoint_events`, so catching up writes few large checkpoints.
        let caught_up = short_read && !behind;
        let interval = pause_after(interval, behind, self.last_took);
        let due = caught_up || now.saturating_sub(self.last_checkpoint) >= interval;
        // Caught up, stopping or replaying, a step commits before it returns (a row waits for its
        // checkpoint, not for the next step). Behind, it commits on a thread of its own while the
        // next steps read, and the next checkpoint first waits for that one.
        let now_behind = !(caught_up || stopping || self.replay.is_some());
        let mut checkpointed = Vec::new();
        {
            let mut held = lock(&self.held);
            let ready: Vec<Scope> = held
                .units
                .iter()
                .filter(|(_, u)| u.dirty && (due || stopping || u.since >= events || self.replay.is_some()))
                .map(|(s, _)| *s)
                .collect();
            let sent = !ready.is_empty();
            if sent {
                held.settle(true);
                let began_ms = clock.wall_ms();
                let taken: Vec<Taken> = match held.abandoned {
                    true => Vec::new(),
                    false => ready.into_iter().filter_map(|scope| held.take(scope, None, began_ms)).collect(),
                };
                held.commit_behind(taken)?;
            }
            if !now_behind {
                held.settle(true);
            }
            if sent {
                // The interval runs from the end of a checkpoint here, or from its start behind.
                self.last_checkpoint = clock.monotonic_ms();
            }
            let mut took_ms = 0;
            for c in std::mem::take(&mut held.committed) {
                if c.ok {
                    lock(&r.status).checkpoint_duration.observe(c.took.as_secs_f64());
                    checkpointed.extend(c.offsets);
                }
                took_ms += c.took.as_millis() as u64;
                let (events, rows, ledger) = c.size;
                let span = telemetry::Checkpoint { scope: c.scope, events, rows, ledger, committed: c.ok };
                span.record(&r.contract, c.began_ms, c.took);
            }
            if took_ms > 0 {
                self.last_took = took_ms;
            }
        }
        let any_checkpoint = !checkpointed.is_empty();
        if any_checkpoint {
            self.source.checkpointed(&checkpointed);
        }
        Ok(any_checkpoint)
    }

    /// A replay the operator asked for, applied to every scope not yet replayed.
    fn apply_replay(&mut self, clock: &dyn Clock) -> crate::Result<bool> {
        let mut replayed = false;
        if let Some((id, replay)) = self.replay.take() {
            let mut held = lock(&self.held);
            let behind: Vec<Scope> = held.units.iter().filter(|(_, u)| u.replayed < id).map(|(s, _)| *s).collect();
            if !behind.is_empty() {
                let floor = held.store()?.max_revision()?;
                for scope in behind {
                    held.replay(scope, (id, replay), floor, self.source.as_mut(), clock.wall_ms())?;
                }
                replayed = true;
            }
        }
        Ok(replayed)
    }

    /// A failure in a [`Holder`] call, and the checkpoints fenced there.
    fn take_failures(&self, r: &Runner) -> crate::Result<()> {
        let (failed, fenced) = {
            let mut held = lock(&self.held);
            (held.failed.take(), std::mem::take(&mut held.fenced))
        };
        if fenced > 0 {
            lock(&r.status).checkpoints_fenced += fenced;
        }
        match failed {
            Some(f) => Err(crate::Error::Refused(f)),
            None => Ok(()),
        }
    }

    /// Stops reading: the source leaves (Kafka hands its partitions over,
    /// each checkpointed first by the [`Holder`]).
    pub fn close(&mut self) {
        self.source.close();
    }

    /// The next offset to read, per partition this run holds.
    pub fn offsets(&self) -> Vec<(u32, u64)> {
        lock(&self.held).units.values().flat_map(Unit::offsets).collect()
    }

    /// The oldest replay applied by the scopes this run holds.
    pub fn replayed(&self) -> i64 {
        lock(&self.held).units.values().map(|u| u.replayed).min().unwrap_or(0)
    }

    /// The watermark of the topic's engine (the lowest of the engines' where each reads a partition).
    pub fn watermark(&self) -> Option<i64> {
        let held = lock(&self.held);
        held.units.values().filter_map(|u| u.engine.watermark()).min()
    }

    fn publish_status(&mut self, r: &Runner, checkpoint_ms: Option<i64>, now: u64) {
        let measure_bytes = self.bytes_measured.is_none_or(|(at, bytes)| bytes == 0 || now.saturating_sub(at) >= 1_000);
        let held = lock(&self.held);
        let mut s = lock(&r.status);
        let mut counters = weir_engine::Counters::default();
        let mut watermark: Option<i64> = None;
        let (mut open, mut bytes) = (0, 0);
        let mut parts = Vec::new();
        // A checkpoint still committing behind has not stored its rows either.
        s.unsaved = held.behind.is_some() || held.units.values().any(|u| u.dirty);
        for (scope, unit) in &held.units {
            let e = &unit.engine;
            counters.add(e.counters());
            let wm = e.watermark();
            watermark = match (watermark, wm) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            open += e.open_windows();
            if measure_bytes {
                bytes += e.state_bytes();
            }
            match scope {
                Scope::Topic => {
                    s.partition_watermarks = e.partition_watermarks();
                    s.offsets = unit.parts.values().map(|p| p.next).collect();
                    s.idle = unit.parts.values().map(|p| p.idle).collect();
                }
                Scope::Partition(p) => parts.push(KafkaPartition {
                    partition: *p,
                    next_offset: unit.parts.get(p).map_or(0, |part| part.next),
                    end_offset: unit.parts.get(p).map_or(0, |part| part.end.max(part.next)),
                    generation: unit.generation,
                    watermark: wm,
                    last_timestamp_ms: unit.parts.get(p).and_then(|part| part.last_time_ms),
                }),
            }
        }
        s.watermark = watermark;
        s.counters = counters;
        s.open_windows = open;
        if measure_bytes {
            s.state_bytes = bytes;
            self.bytes_measured = Some((now, bytes));
        }
        if held.per_partition {
            s.kafka = Some(parts);
        }
        if let Some(ms) = checkpoint_ms {
            s.last_checkpoint_ms = ms;
            s.checkpoints += 1;
            s.failed = None;
            drop(s);
            r.bell.ring();
        }
    }
}

#[cfg(test)]
mod pause_tests {
    use super::pause_after;

    #[test]
    fn behind_the_next_checkpoint_waits_twice_the_last_one_up_to_a_second() {
        assert_eq!(pause_after(100, false, 500), 100, "caught up: the interval, however long the last took");
        assert_eq!(pause_after(100, true, 30), 100, "a quick checkpoint: the interval");
        assert_eq!(pause_after(100, true, 150), 300, "twice the last one");
        assert_eq!(pause_after(100, true, 900), 1_000, "at most a second for the pause");
        assert_eq!(pause_after(5_000, true, 900), 5_000, "a candidate's own interval stands");
    }
}

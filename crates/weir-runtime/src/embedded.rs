//! One pipeline running continuously: read the topic's partitions from the
//! log, feed the engine, checkpoint into SQLite.
//!
//! Each pipeline has its own thread (the engine is synchronous and
//! CPU-bound) and its own database connection. The loop:
//!
//! 1. read up to a batch from each partition, from the offsets of the last
//!    checkpoint, and process it (partition and log offset on every event);
//! 2. mark a partition idle once it has been caught up and silent for
//!    `idle_timeout` (processing time), and active again when it has data;
//! 3. every `checkpoint_interval`, or after `checkpoint_events` events,
//!    write one checkpoint: rows, ledger entries, the engine's changed state
//!    and the offsets, in one transaction (see `store`);
//! 4. when caught up, wait for the log to say the topic grew.
//!
//! The loop is [`Run::step`], one pass of steps 1-3 and the operator
//! commands, with the time passed in as a [`Clock`]: [`Runner::run`] calls
//! it on the system clock and waits between passes; the simulation test
//! (`tests/simulation.rs`) calls it on a simulated clock, crashing and
//! restarting it between any two steps.
//!
//! Invariant: rows become visible only with the checkpoint that holds the
//! state and offsets they came from, so after a crash the pipeline restores
//! that checkpoint, reads on from its offsets and publishes exactly what an
//! uninterrupted run publishes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::Connection;
use weir_contract::{Contract, ServerConfig};
use weir_engine::{Engine, EventIn, Mode, Output};
use weir_log::Log;
use weir_store::sqlite as store;
use weir_store::Replay;

use crate::status::Status;
use crate::{lock, supervise, Clock, KeepPublished, SystemClock};

pub struct Runner {
    pub contract: Contract,
    pub config: Arc<ServerConfig>,
    pub log: Log,
    pub conn: Connection,
    pub status: Arc<Mutex<Status>>,
    pub stop: Arc<AtomicBool>,
    pub paused: Arc<AtomicBool>,
    /// Records read from one partition in one step.
    pub read_records: usize,
}

/// Records read from one partition in one step, by default.
pub const READ_RECORDS: usize = 2_000;
const READ_BYTES: usize = 4 << 20;

impl Runner {
    /// Runs until `stop` is set (then writes a last checkpoint). A failure
    /// (the database locked or full, the log unreadable) drops the
    /// in-memory state and starts again from the last checkpoint after a
    /// backoff of 0.5 s doubling to 30 s, as Flink's restart strategy does:
    /// nothing was published past that checkpoint, so nothing is lost or
    /// counted twice, and the consumer's lag shows the stall meanwhile.
    pub fn run(mut self, runtime: tokio::runtime::Handle) {
        let name = self.contract.pipeline.name.clone();
        let (status, stop) = (Arc::clone(&self.status), Arc::clone(&self.stop));
        let clock = SystemClock::new();
        supervise(&name, &status, &stop, |why| self.run_inner(&clock, &runtime, why));
    }

    /// One run, from the last checkpoint; `why` is recorded with it.
    fn run_inner(&mut self, clock: &SystemClock, runtime: &tokio::runtime::Handle, why: &str) -> anyhow::Result<()> {
        let mut changes = self.log.subscribe(&self.contract.source.topic)?;
        let mut run = Run::start(self, clock, why)?;
        loop {
            let stopping = self.stop.load(Ordering::SeqCst);
            let step = run.step(self, clock, stopping)?;
            if stopping {
                return Ok(());
            }
            if !step.read_any {
                // Caught up: wait for the topic to grow, a checkpoint to be due, or a stop.
                let wait = step.next_due.min(Duration::from_millis(100));
                let _ = runtime.block_on(async { tokio::time::timeout(wait, changes.changed()).await });
            }
        }
    }

    /// One checkpoint of `out` and the engine's changes since the last one;
    /// returns the next change and ledger sequence numbers.
    fn checkpoint(
        &mut self,
        engine: &mut Engine,
        out: &Output,
        offsets: &[u64],
        (next_seq, next_ledger): (i64, i64),
        (replay, run, now_ms): (Option<i64>, i64, i64),
    ) -> anyhow::Result<(i64, i64)> {
        let c = &self.contract;
        let delta = engine.take_delta();
        let write = store::CheckpointWrite {
            pipeline: &c.pipeline.name,
            version: c.pipeline.version,
            text_hash: c.text_hash,
            format: engine.format(),
            out,
            delta,
            offsets,
            next_seq,
            next_ledger,
            now_ms,
            replay,
            run,
        };
        Ok(store::checkpoint(&mut self.conn, write)?)
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
}

/// One run of a pipeline between a start (from the last checkpoint) and a
/// stop or a crash: the engine and where it stands. Dropping it without a
/// stop is a crash: what it did since its last checkpoint is gone, and the
/// next [`Run::start`] continues from that checkpoint.
pub struct Run {
    topic: String,
    partitions: u32,
    engine: Engine,
    offsets: Vec<u64>,
    /// The last replay applied (recorded in the checkpoint).
    replayed: i64,
    next_seq: i64,
    next_ledger: i64,
    run: i64,
    idle: Vec<bool>,
    /// When each partition last had data, on the monotonic clock.
    heard: Vec<u64>,
    out: Output,
    last_checkpoint: u64,
    since_checkpoint: u64,
    dirty: bool,
    /// Operator actions are read from the store (where the HTTP side wrote them) every interval.
    commands_read: Option<u64>,
    replay: Option<(i64, Replay)>,
    /// During a replay from an event time: the rows left out (see [`KeepPublished`]), until the
    /// replay has read what the log held when it started.
    republish_after: Option<(KeepPublished, Vec<u64>)>,
    idle_after: u64,
    interval: u64,
}

impl Run {
    /// Restores the last checkpoint (or starts afresh) and records the run.
    pub fn start(r: &mut Runner, clock: &dyn Clock, why: &str) -> anyhow::Result<Run> {
        let c = r.contract.clone();
        let topic = c.source.topic.clone();
        let partitions = r.log.partitions(&topic)?;
        let loaded = store::load(&mut r.conn, &c.pipeline.name, c.pipeline.version, c.text_hash)?;
        let mut offsets = vec![0u64; partitions as usize];
        let replayed = loaded.as_ref().map_or(0, |cp| cp.replayed);
        let (mut engine, next_seq, next_ledger) = match loaded {
            Some(cp) => {
                for (p, o) in cp.offsets {
                    if let Some(slot) = offsets.get_mut(p as usize) {
                        *slot = o;
                    }
                }
                let engine = Engine::restore_parts(&c, &cp.header, cp.windows, cp.id_batches)?;
                (engine, cp.next_seq, cp.next_ledger)
            }
            None => (Engine::new(&c, Mode::Stream, partitions)?, 1, 1),
        };
        engine.track_changes();
        // Every partition starts active, as the runner sees it (`idle`), whatever the checkpoint held.
        let mut out = Output::default();
        for p in 0..partitions {
            engine.set_partition_idle(p, false, &mut out);
        }
        let run = store::start_run(&r.conn, &c.pipeline.name, c.pipeline.version, c.text_hash, why)?;
        let now = clock.monotonic_ms();
        let run = Run {
            topic,
            partitions,
            engine,
            offsets,
            replayed,
            next_seq,
            next_ledger,
            run,
            idle: vec![false; partitions as usize],
            heard: vec![now; partitions as usize],
            out,
            last_checkpoint: now,
            since_checkpoint: 0,
            dirty: false,
            commands_read: None,
            replay: None,
            republish_after: None,
            idle_after: r.config.idle_timeout_ms.max(0) as u64,
            interval: r.config.checkpoint_interval_ms.max(1) as u64,
        };
        run.publish_status(r, None);
        Ok(run)
    }

    /// One pass: read the operator commands when due, read what each
    /// partition has, mark silent partitions idle, checkpoint when due (or
    /// `stopping`), and apply a replay.
    pub fn step(&mut self, r: &mut Runner, clock: &dyn Clock, stopping: bool) -> anyhow::Result<Step> {
        let name = r.contract.pipeline.name.clone();
        let now = clock.monotonic_ms();
        if self.commands_read.is_none_or(|at| now.saturating_sub(at) >= self.interval) {
            r.paused.store(store::is_paused(&r.conn, &name)?, Ordering::SeqCst);
            self.replay = store::last_replay(&r.conn, &name)?.filter(|(id, _)| *id > self.replayed);
            self.commands_read = Some(now);
        }
        // A partition with unread records is active before any record of this step is processed,
        // so a burst after a silence holds the watermark back from the first record on.
        let bounds = r.log.bounds(&self.topic)?;
        for (i, (_, end)) in bounds.iter().enumerate().take(self.idle.len()) {
            if self.idle[i] && *end > self.offsets[i] {
                self.idle[i] = false;
                self.heard[i] = now;
                self.engine.set_partition_idle(i as u32, false, &mut self.out);
            }
        }
        let mut read_any = false;
        for p in 0..self.partitions {
            let i = p as usize;
            let records = r.log.read(&self.topic, p, self.offsets[i], r.read_records.max(1), READ_BYTES)?;
            if records.is_empty() {
                continue;
            }
            read_any = true;
            self.heard[i] = clock.monotonic_ms();
            if self.idle[i] {
                self.idle[i] = false;
                self.engine.set_partition_idle(p, false, &mut self.out);
            }
            let wall = clock.wall_ms();
            {
                let mut s = lock(&r.status);
                for rec in &records {
                    s.processing.observe(wall.saturating_sub(rec.append_ms).max(0) as f64 / 1e3);
                }
            }
            for rec in &records {
                self.engine.process(EventIn { partition: p, offset: rec.offset, bytes: &rec.payload }, &mut self.out);
                self.offsets[i] = rec.offset + 1;
            }
            self.since_checkpoint += records.len() as u64;
            self.dirty = true;
        }
        let now = clock.monotonic_ms();
        for i in 0..self.idle.len() {
            if !self.idle[i] && now.saturating_sub(self.heard[i]) >= self.idle_after {
                self.idle[i] = true;
                self.engine.set_partition_idle(i as u32, true, &mut self.out);
                self.dirty = true;
            }
        }
        let due = now.saturating_sub(self.last_checkpoint) >= self.interval
            || self.since_checkpoint >= r.config.checkpoint_events;
        let mut checkpointed = false;
        if (self.dirty && (due || stopping)) || self.replay.is_some() {
            let started = Instant::now();
            if let Some((keep, until)) = &self.republish_after {
                self.out.rows.retain(|row| !keep.keeps(row));
                if self.offsets.iter().zip(until).all(|(o, u)| o >= u) {
                    self.republish_after = None;
                }
            }
            let seqs = (self.next_seq, self.next_ledger);
            let wall = clock.wall_ms();
            (self.next_seq, self.next_ledger) =
                r.checkpoint(&mut self.engine, &self.out, &self.offsets, seqs, (None, self.run, wall))?;
            lock(&r.status).checkpoint_duration.observe(started.elapsed().as_secs_f64());
            self.out.clear();
            self.dirty = false;
            self.since_checkpoint = 0;
            // The interval runs from the end of a checkpoint, as before the step function: a checkpoint
            // slower than the interval must not make every following step checkpoint.
            self.last_checkpoint = clock.monotonic_ms();
            checkpointed = true;
            self.publish_status(r, Some(wall));
        }
        let mut replayed = false;
        if let Some((id, replay)) = self.replay.take() {
            self.apply_replay(r, clock, id, replay)?;
            replayed = true;
        }
        let next_due = if self.dirty {
            self.interval.saturating_sub(now.saturating_sub(self.last_checkpoint))
        } else {
            self.interval
        };
        Ok(Step { read_any, checkpointed, replayed, next_due: Duration::from_millis(next_due) })
    }

    /// Everything so far is checkpointed; start again from the log, with
    /// revisions above every one published, and record the replay as applied.
    fn apply_replay(&mut self, r: &mut Runner, clock: &dyn Clock, id: i64, replay: Replay) -> anyhow::Result<()> {
        let c = r.contract.clone();
        let floor = store::max_revision(&r.conn, &c.pipeline.name)?;
        let mut engine = Engine::new(&c, Mode::Stream, self.partitions)?;
        engine.set_revision_floor(floor);
        engine.track_changes();
        let replaced = std::mem::replace(&mut self.engine, engine);
        let bounds = r.log.bounds(&self.topic)?;
        for (i, (start, _)) in bounds.iter().enumerate() {
            self.offsets[i] = replay.from_offset.unwrap_or(0).max(*start);
        }
        self.republish_after = replay.from_time.map(|t| {
            let keep = KeepPublished::new(&c, t, replaced.watermark());
            (keep, bounds.iter().map(|(_, end)| *end).collect())
        });
        let now = clock.monotonic_ms();
        self.idle.iter_mut().for_each(|x| *x = false);
        self.heard.iter_mut().for_each(|h| *h = now);
        let wall = clock.wall_ms();
        self.run = store::start_run(&r.conn, &c.pipeline.name, c.pipeline.version, c.text_hash, "replay")?;
        let seqs = (self.next_seq, self.next_ledger);
        (self.next_seq, self.next_ledger) =
            r.checkpoint(&mut self.engine, &Output::default(), &self.offsets, seqs, (Some(id), self.run, wall))?;
        self.replayed = id;
        // The status shows where the replay starts before it counts the replay.
        self.publish_status(r, Some(wall));
        lock(&r.status).replays += 1;
        Ok(())
    }

    /// The next offset to read, per partition.
    pub fn offsets(&self) -> &[u64] {
        &self.offsets
    }

    /// The last replay applied.
    pub fn replayed(&self) -> i64 {
        self.replayed
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    fn publish_status(&self, r: &Runner, checkpoint_ms: Option<i64>) {
        let mut s = lock(&r.status);
        s.watermark = self.engine.watermark();
        s.partition_watermarks = self.engine.partition_watermarks();
        s.counters = self.engine.counters().clone();
        s.offsets = self.offsets.clone();
        s.idle = self.idle.clone();
        s.open_windows = self.engine.open_windows();
        s.state_bytes = self.engine.state_bytes();
        if let Some(ms) = checkpoint_ms {
            s.last_checkpoint_ms = ms;
            s.checkpoints += 1;
            s.failed = None;
        }
    }
}

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
//! Invariant: rows become visible only with the checkpoint that holds the
//! state and offsets they came from, so after a crash the pipeline restores
//! that checkpoint, reads on from its offsets and publishes exactly what an
//! uninterrupted run publishes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::Connection;
use weir_contract::{Contract, ServerConfig};
use weir_engine::{Counters, Engine, EventIn, Mode, Output};
use weir_log::Log;

use crate::histogram::Histogram;
use crate::store;

/// What the HTTP side may read of a running pipeline.
#[derive(Debug, Clone, Default)]
pub struct Status {
    pub watermark: Option<i64>,
    pub partition_watermarks: Vec<Option<i64>>,
    pub counters: Counters,
    /// The next offset to read, per partition (checkpointed).
    pub offsets: Vec<u64>,
    pub idle: Vec<bool>,
    pub open_windows: usize,
    pub last_checkpoint_ms: i64,
    pub checkpoints: u64,
    /// Why the pipeline's last attempt failed, until a checkpoint succeeds again.
    pub failed: Option<String>,
    /// Restarts from the last checkpoint after a failure, since the server started.
    pub restarts: u64,
    pub state_bytes: usize,
    /// From an event's append to the log to its processing.
    pub processing: Histogram,
    pub checkpoint_duration: Histogram,
    /// Replays done since the server started.
    pub replays: u64,
    /// Over Kafka: the partitions this worker holds (`offsets` and `idle`
    /// are then unused).
    pub kafka: Option<Vec<KafkaPartition>>,
    /// Over Kafka: offsets skipped between two records the broker delivered.
    pub offsets_not_delivered: u64,
    /// Over Kafka: checkpoints the Postgres fence refused, because another
    /// worker had taken the partition over (this worker was a zombie).
    pub checkpoints_fenced: u64,
}

/// One Kafka partition a worker holds.
#[derive(Debug, Clone)]
pub struct KafkaPartition {
    pub partition: u32,
    /// The next offset to read (checkpointed).
    pub next_offset: u64,
    /// The partition's high watermark, as last fetched.
    pub end_offset: u64,
    pub generation: i64,
    pub watermark: Option<i64>,
    /// The Kafka timestamp of the last record read.
    pub last_timestamp_ms: Option<i64>,
}

pub struct Pipeline {
    pub contract: Contract,
    /// Reads Kafka, publishes to Postgres (else the embedded log and SQLite).
    pub on_kafka: bool,
    pub status: Arc<Mutex<Status>>,
    /// Publishing paused by an operator (processing goes on), as the store
    /// last said: the pause itself is a row in the store, which every
    /// checkpoint reads.
    pub paused: Arc<AtomicBool>,
}

/// Rebuild the state from the log, from this offset of every partition
/// (its first kept record when `None` or older), and republish rows above
/// the revisions published so far: every row, or with `from_time` only the
/// rows of windows that end after it (the state is still rebuilt whole).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Replay {
    pub from_offset: Option<u64>,
    pub from_time: Option<i64>,
}

pub struct Runner {
    pub contract: Contract,
    pub config: Arc<ServerConfig>,
    pub log: Log,
    pub conn: Connection,
    pub status: Arc<Mutex<Status>>,
    pub stop: Arc<AtomicBool>,
    pub paused: Arc<AtomicBool>,
    pub runtime: tokio::runtime::Handle,
}

const READ_RECORDS: usize = 2_000;
const READ_BYTES: usize = 4 << 20;

impl Runner {
    /// Runs until `stop` is set (then writes a last checkpoint). A failure
    /// (the database locked or full, the log unreadable) drops the
    /// in-memory state and starts again from the last checkpoint after a
    /// backoff of 0.5 s doubling to 30 s, as Flink's restart strategy does:
    /// nothing was published past that checkpoint, so nothing is lost or
    /// counted twice, and the consumer's lag shows the stall meanwhile.
    pub fn run(mut self) {
        let name = self.contract.pipeline.name.clone();
        let (status, stop) = (Arc::clone(&self.status), Arc::clone(&self.stop));
        supervise(&name, &status, &stop, |why| self.run_inner(why));
    }

    /// One run, from the last checkpoint; `why` is recorded with it.
    fn run_inner(&mut self, why: &str) -> anyhow::Result<()> {
        let contract = self.contract.clone();
        let c = &contract;
        let topic = c.source.topic.clone();
        let partitions = self.log.partitions(&topic)?;
        let loaded = store::load(&mut self.conn, &c.pipeline.name, c.pipeline.version, c.text_hash)?;
        let mut offsets = vec![0u64; partitions as usize];
        let mut replayed = loaded.as_ref().map_or(0, |cp| cp.replayed);
        let (mut engine, mut next_seq, mut next_ledger) = match loaded {
            Some(cp) => {
                for (p, o) in cp.offsets {
                    if let Some(slot) = offsets.get_mut(p as usize) {
                        *slot = o;
                    }
                }
                let engine = Engine::restore_parts(c, &cp.header, cp.windows, cp.id_batches)?;
                (engine, cp.next_seq, cp.next_ledger)
            }
            None => (Engine::new(c, Mode::Stream, partitions)?, 1, 1),
        };
        engine.track_changes();
        let mut run = store::start_run(&self.conn, &c.pipeline.name, c.pipeline.version, c.text_hash, why)?;
        let idle_after = Duration::from_millis(self.config.idle_timeout_ms.max(0) as u64);
        let interval = Duration::from_millis(self.config.checkpoint_interval_ms.max(1) as u64);
        let mut changes = self.log.subscribe(&topic)?;
        let mut idle = vec![false; partitions as usize];
        let mut heard = vec![Instant::now(); partitions as usize];
        let mut out = Output::default();
        let mut last_checkpoint = Instant::now();
        let mut since_checkpoint = 0u64;
        let mut dirty = false;
        // Operator actions are read from the store (where the HTTP side wrote them) every interval.
        let mut commands_read = Instant::now() - interval;
        let mut replay: Option<(i64, Replay)> = None;
        // During a replay from an event time: rows of windows ending at or before it stay as published.
        // Until the replay has read what the log held when it started.
        let mut republish_after: Option<(i64, Vec<u64>)> = None;
        self.publish_status(&engine, &offsets, &idle, None);
        loop {
            let stopping = self.stop.load(Ordering::SeqCst);
            if commands_read.elapsed() >= interval {
                self.paused.store(store::is_paused(&self.conn, &c.pipeline.name)?, Ordering::SeqCst);
                replay = store::last_replay(&self.conn, &c.pipeline.name)?.filter(|(id, _)| *id > replayed);
                commands_read = Instant::now();
            }
            let mut read_any = false;
            for p in 0..partitions {
                let i = p as usize;
                let records = self.log.read(&topic, p, offsets[i], READ_RECORDS, READ_BYTES)?;
                if records.is_empty() {
                    continue;
                }
                read_any = true;
                heard[i] = Instant::now();
                if idle[i] {
                    idle[i] = false;
                    engine.set_partition_idle(p, false, &mut out);
                }
                let now = weir_log::now_ms();
                {
                    let mut s = lock(&self.status);
                    for r in &records {
                        s.processing.observe(now.saturating_sub(r.append_ms).max(0) as f64 / 1e3);
                    }
                }
                for r in &records {
                    engine.process(EventIn { partition: p, offset: r.offset, bytes: &r.payload }, &mut out);
                    offsets[i] = r.offset + 1;
                }
                since_checkpoint += records.len() as u64;
                dirty = true;
            }
            for i in 0..idle.len() {
                if !idle[i] && heard[i].elapsed() >= idle_after {
                    idle[i] = true;
                    engine.set_partition_idle(i as u32, true, &mut out);
                    dirty = true;
                }
            }
            let due = last_checkpoint.elapsed() >= interval || since_checkpoint >= self.config.checkpoint_events;
            if (dirty && (due || stopping)) || replay.is_some() {
                let now = weir_log::now_ms();
                let started = Instant::now();
                if let Some((after, until)) = &republish_after {
                    out.rows.retain(|r| r.window_end.is_none_or(|end| end > *after));
                    if offsets.iter().zip(until).all(|(o, u)| o >= u) {
                        republish_after = None;
                    }
                }
                let seqs = (next_seq, next_ledger);
                let (s, l) = self.checkpoint(&mut engine, &out, &offsets, seqs, None, run)?;
                lock(&self.status).checkpoint_duration.observe(started.elapsed().as_secs_f64());
                (next_seq, next_ledger) = (s, l);
                out.clear();
                dirty = false;
                since_checkpoint = 0;
                last_checkpoint = Instant::now();
                self.publish_status(&engine, &offsets, &idle, Some(now));
            }
            if let Some((id, r)) = replay.take() {
                // Everything so far is checkpointed; now start again from the log.
                let floor = store::max_revision(&self.conn, &c.pipeline.name)?;
                engine = Engine::new(c, Mode::Stream, partitions)?;
                engine.set_revision_floor(floor);
                engine.track_changes();
                let bounds = self.log.bounds(&topic)?;
                for (i, (start, _)) in bounds.iter().enumerate() {
                    offsets[i] = r.from_offset.unwrap_or(0).max(*start);
                }
                republish_after = r.from_time.map(|t| (t, bounds.iter().map(|(_, end)| *end).collect()));
                idle.iter_mut().for_each(|x| *x = false);
                heard.iter_mut().for_each(|h| *h = Instant::now());
                let now = weir_log::now_ms();
                let seqs = (next_seq, next_ledger);
                run = store::start_run(&self.conn, &c.pipeline.name, c.pipeline.version, c.text_hash, "replay")?;
                (next_seq, next_ledger) =
                    self.checkpoint(&mut engine, &Output::default(), &offsets, seqs, Some(id), run)?;
                replayed = id;
                lock(&self.status).replays += 1;
                self.publish_status(&engine, &offsets, &idle, Some(now));
            }
            if stopping {
                return Ok(());
            }
            if !read_any {
                // Caught up: wait for the topic to grow, a checkpoint to be due, or a stop.
                let wait = if dirty { interval.saturating_sub(last_checkpoint.elapsed()) } else { interval };
                let wait = wait.min(Duration::from_millis(100));
                let _ = self.runtime.block_on(async { tokio::time::timeout(wait, changes.changed()).await });
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
        replay: Option<i64>,
        run: i64,
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
            now_ms: weir_log::now_ms(),
            replay,
            run,
        };
        Ok(store::checkpoint(&mut self.conn, write)?)
    }

    fn publish_status(&self, engine: &Engine, offsets: &[u64], idle: &[bool], checkpoint_ms: Option<i64>) {
        let mut s = lock(&self.status);
        s.watermark = engine.watermark();
        s.partition_watermarks = engine.partition_watermarks();
        s.counters = engine.counters().clone();
        s.offsets = offsets.to_vec();
        s.idle = idle.to_vec();
        s.open_windows = engine.open_windows();
        s.state_bytes = engine.state_bytes();
        if let Some(ms) = checkpoint_ms {
            s.last_checkpoint_ms = ms;
            s.checkpoints += 1;
            s.failed = None;
        }
    }
}

/// Runs `attempt` (given why it starts) until it returns `Ok` (a stop) or
/// `stop` is set. After a failure it waits 0.5 s, doubling to 30 s (back to
/// 0.5 s after a minute of running), and starts it again; `status` shows
/// the failure and counts the restart.
pub fn supervise(
    name: &str,
    status: &Mutex<Status>,
    stop: &AtomicBool,
    mut attempt: impl FnMut(&str) -> anyhow::Result<()>,
) {
    let mut backoff = Duration::from_millis(500);
    let mut why = "server start".to_owned();
    loop {
        let started = Instant::now();
        let Err(e) = attempt(&why) else { return };
        why = format!("restart after a failure: {e:#}");
        let message = format!("pipeline {name} failed and restarts from its last checkpoint: {e:#}");
        eprintln!("weir: {message}");
        {
            let mut s = lock(status);
            s.failed = Some(message);
            s.restarts += 1;
        }
        if started.elapsed() > Duration::from_secs(60) {
            backoff = Duration::from_millis(500);
        }
        let until = Instant::now() + backoff;
        while Instant::now() < until {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        backoff = (backoff * 2).min(Duration::from_secs(30));
    }
}

pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

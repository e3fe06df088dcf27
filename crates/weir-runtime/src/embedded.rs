//! The embedded log as a [`Source`]: one engine reads every partition of
//! the topic ([`weir_store::Scope::Topic`]), each from the runner's next
//! offset, up to a number of records from each partition in turn; a
//! caught-up read waits for the log to say the topic grew.
//!
//! [`LogSource::engine_per_partition`] reads it the way Kafka is read, an
//! engine and a checkpoint per partition, so the runner can checkpoint the
//! log into Postgres (the simulation test drives the fenced Postgres
//! checkpoints this way, deterministically).

use std::sync::Arc;
use std::time::Duration;

use weir_contract::Contract;
use weir_log::Log;
use weir_store::SqliteCheckpoints;

use crate::runner::{Batch, Connected, Holder, Source};

/// Bytes read from one partition in one step, at most.
const READ_BYTES: usize = 4 << 20;

/// A run's source and checkpoints over the embedded log and `weir.db`.
pub fn connect(
    contract: &Contract,
    log: &Log,
    db: &std::path::Path,
    runtime: Option<tokio::runtime::Handle>,
) -> crate::Result<Connected> {
    let conn = weir_store::sqlite::open_writer(db)?;
    let source = LogSource::new(log.clone(), &contract.source.topic, runtime);
    Ok((Box::new(source), Box::new(SqliteCheckpoints::new(conn, contract))))
}

pub struct LogSource {
    log: Log,
    topic: String,
    /// To wait for the topic to grow; `None` never waits (a test stepping by hand).
    runtime: Option<tokio::runtime::Handle>,
    changes: Option<tokio::sync::watch::Receiver<u64>>,
    per_partition: bool,
}

impl LogSource {
    pub fn new(log: Log, topic: &str, runtime: Option<tokio::runtime::Handle>) -> LogSource {
        LogSource { log, topic: topic.to_owned(), runtime, changes: None, per_partition: false }
    }

    /// An engine and a checkpoint per partition ([`weir_store::Scope::Partition`]), as over Kafka.
    pub fn engine_per_partition(mut self) -> LogSource {
        self.per_partition = true;
        self
    }

    /// Reads up to `max` records of each partition in turn; true when a
    /// partition gave all `max` (it may have more). A read cut short by
    /// `READ_BYTES` is not full, but the runner still sees from the log's
    /// ends, read before, that the partition has more.
    fn read_once(&self, next: &[(u32, u64)], max: usize, batch: &mut Batch) -> crate::Result<bool> {
        let mut full = false;
        for &(p, from) in next {
            let records = self.log.read(&self.topic, p, from, max, READ_BYTES)?;
            full |= records.len() >= max;
            for rec in records {
                batch.push(p, rec.offset, Some(rec.append_ms), &rec.payload);
            }
        }
        Ok(full)
    }
}

impl Source for LogSource {
    fn per_partition(&self) -> bool {
        self.per_partition
    }

    fn open(&mut self, holder: Arc<dyn Holder>) -> crate::Result<()> {
        self.changes = Some(self.log.subscribe(&self.topic)?);
        let partitions: Vec<u32> = (0..self.log.partitions(&self.topic)?).collect();
        holder.assigned(&partitions);
        Ok(())
    }

    fn read(&mut self, next: &[(u32, u64)], max: usize, wait: Duration, batch: &mut Batch) -> crate::Result<bool> {
        let full = self.read_once(next, max, batch)?;
        if !batch.is_empty() || wait.is_zero() {
            return Ok(full);
        }
        if let (Some(runtime), Some(changes)) = (&self.runtime, self.changes.as_mut()) {
            let _ = runtime.block_on(async { tokio::time::timeout(wait, changes.changed()).await });
            return self.read_once(next, max, batch);
        }
        Ok(false)
    }

    fn ends(&mut self, partitions: &[u32]) -> crate::Result<Vec<(u32, u64)>> {
        let bounds = self.log.bounds(&self.topic)?;
        Ok(partitions.iter().filter_map(|&p| bounds.get(p as usize).map(|(_, end)| (p, *end))).collect())
    }

    fn bounds(&mut self, partition: u32) -> crate::Result<(u64, u64)> {
        let bounds = self.log.bounds(&self.topic)?;
        Ok(bounds.get(partition as usize).copied().unwrap_or((0, 0)))
    }

    fn seek(&mut self, _partition: u32, _offset: u64) -> crate::Result<()> {
        Ok(()) // the runner's next offsets are where the log is read from
    }

    fn checkpointed(&mut self, _offsets: &[(u32, u64)]) {}

    fn close(&mut self) {
        self.changes = None;
    }
}

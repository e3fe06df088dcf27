//! What a running pipeline shows: its [`Status`] (read by the HTTP side
//! for `/status`, `/metrics`, the dashboard and alerts) and the handle the
//! HTTP side keeps of it ([`Pipeline`]).

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use weir_contract::Contract;
use weir_engine::Counters;

use crate::histogram::Histogram;

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
    /// Where its rows are read and operator actions written (SQLite or Postgres).
    pub store: Arc<dyn weir_store::Store>,
}

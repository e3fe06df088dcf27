//! What a running pipeline shows: its [`Status`] (read by the HTTP side
//! for `/status`, `/metrics`, the dashboard and alerts) and the handle the
//! HTTP side keeps of it ([`Pipeline`]).

use std::collections::BTreeMap;
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
    /// Producer lag: from an event's time to its append to the log (Kafka's
    /// timestamp on Kafka), for events with a readable time.
    pub producer_lag: Histogram,
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
    /// Where this contract's version stands, as the store last said
    /// (`None` before the first read, or once the version was removed).
    pub version_state: Option<weir_store::VersionState>,
    /// Events were read since the last checkpoint that ended (one may be
    /// committing): rows they made are not in the store yet.
    pub unsaved: bool,
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

/// One version of a pipeline as this server runs it: its contract and what its runner shows.
pub struct PipelineVersion {
    pub contract: Contract,
    pub status: Arc<Mutex<Status>>,
}

/// The handle the HTTP side keeps of a pipeline: every version this server
/// runs (the live one, a candidate, superseded ones a rollback may bring
/// back), by number.
pub struct Pipeline {
    /// Never empty.
    pub versions: BTreeMap<u32, PipelineVersion>,
    /// Reads Kafka, publishes to Postgres (else the embedded log and SQLite).
    pub on_kafka: bool,
    /// Publishing paused by an operator (processing goes on), as the store
    /// last said: the pause itself is a row in the store, which every
    /// checkpoint reads.
    pub paused: Arc<AtomicBool>,
    /// Where its rows are read and operator actions written (SQLite or Postgres).
    pub store: Arc<dyn weir_store::Store>,
    /// Why this pipeline does not run: its contract file was refused (a
    /// change without a version bump, a start older than the retained input).
    pub refused: Option<String>,
    /// Rung after every checkpoint of its versions and every action that publishes.
    pub bell: Arc<crate::bell::Bell>,
    /// Its destinations' states, in the contract's order.
    pub destinations: Vec<Arc<Mutex<crate::destination::DestinationStatus>>>,
}

impl Pipeline {
    /// The live version, as its runner last read it from the store (a
    /// promote or rollback here sets it at once; one on another worker is
    /// seen within a checkpoint interval), else the newest.
    pub fn live(&self) -> (u32, &PipelineVersion) {
        let live = self
            .versions
            .iter()
            .rev()
            .find(|(_, v)| crate::lock(&v.status).version_state == Some(weir_store::VersionState::Live));
        match live.or_else(|| self.versions.iter().next_back()) {
            Some((n, v)) => (*n, v),
            None => unreachable!("a pipeline has at least one version"),
        }
    }

    /// The live version's contract.
    pub fn contract(&self) -> &Contract {
        &self.live().1.contract
    }

    /// `version`, or the live one.
    pub fn version(&self, version: Option<u32>) -> Option<(u32, &PipelineVersion)> {
        match version {
            None => Some(self.live()),
            Some(n) => self.versions.get(&n).map(|v| (n, v)),
        }
    }
}

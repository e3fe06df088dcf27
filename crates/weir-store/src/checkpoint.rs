//! The checkpoint protocol's side in the store, one interface for both
//! topologies: a runner claims a [`Scope`] (the partitions one engine
//! reads), restores what it gets, and commits checkpoints of it; it reads
//! the operator's commands (pause, replay) through the same interface.
//!
//! | | [`SqliteCheckpoints`] | [`PgCheckpoints`] |
//! |---|---|---|
//! | scope | the whole topic ([`Scope::Topic`]) | one partition ([`Scope::Partition`]) |
//! | fence | none: one server owns its data folder | a generation from a sequence never reset, and the contract's version and hash |
//! | sequence numbers | counted by the writer (it is the only one) | taken from the pipeline's row under its lock |
//!
//! A commit either writes everything (rows, ledger, state, offsets) or
//! nothing; [`CheckpointError::Fenced`] says another worker took the scope.

use weir_contract::Contract;
use weir_engine::{Delta, Output, RowFormat};

use crate::versions::VersionState;
use crate::{Replay, StoreError};

/// The partitions that share one engine and one checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// Every partition of the topic (the embedded log: the pipeline's
    /// watermark is the lowest of its partitions').
    Topic,
    /// One partition (Kafka: the partition's state moves with it).
    Partition(u32),
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scope::Topic => f.write_str("the topic"),
            Scope::Partition(p) => write!(f, "partition {p}"),
        }
    }
}

/// An engine's stored state, as [`weir_engine::Engine::restore_parts`] reads it.
#[derive(Debug, Default)]
pub struct State {
    pub header: Vec<u8>,
    pub windows: Vec<(u128, Vec<u8>)>,
    /// The engine's id batches, in the order written (`Delta::ids`).
    pub id_batches: Vec<Vec<u8>>,
}

/// What a runner gets when it claims a scope.
#[derive(Debug)]
pub struct Claimed {
    /// Its fencing token: a checkpoint commits only while it is current (0 where there is no fence).
    pub generation: i64,
    /// The next offset to read, per partition checkpointed.
    pub offsets: Vec<(u32, u64)>,
    /// `None` when the scope was never checkpointed.
    pub state: Option<State>,
    /// The run its rows carry.
    pub run: i64,
    /// The last replay (`replays.id`) applied, 0 for none.
    pub replayed: i64,
}

/// One checkpoint of a scope.
pub struct Write<'a> {
    pub scope: Scope,
    pub generation: i64,
    pub format: &'a RowFormat,
    pub out: &'a Output,
    pub delta: Delta,
    /// The next offset to read, per partition of the scope.
    pub offsets: &'a [(u32, u64)],
    pub now_ms: i64,
    pub run: i64,
    /// A replay starts: the stored state is dropped first, and the replay
    /// (`replays.id`) is marked applied.
    pub replay: Option<i64>,
}

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Another worker (or a worker of another contract) claimed the scope since this one did.
    #[error(
        "{scope} of {pipeline} was taken by another worker or contract (generation {now}, ours {ours}); this worker's work on it since its last checkpoint is dropped"
    )]
    Fenced { pipeline: String, scope: Scope, ours: i64, now: i64 },
    /// The store holds another contract than the runner's.
    #[error("{0}")]
    Contract(String),
    /// This store keeps checkpoints of another scope.
    #[error("{store} keeps checkpoints of {keeps}, not of {asked}")]
    Scope { store: &'static str, keeps: &'static str, asked: Scope },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<rusqlite::Error> for CheckpointError {
    fn from(e: rusqlite::Error) -> Self {
        CheckpointError::Store(StoreError::Sqlite(e))
    }
}

impl From<postgres::Error> for CheckpointError {
    fn from(e: postgres::Error) -> Self {
        CheckpointError::Store(StoreError::Postgres(e))
    }
}

pub type Result<T> = std::result::Result<T, CheckpointError>;

/// A runner's connection to where its checkpoints are kept, for one
/// pipeline and contract. Calls block.
pub trait Checkpoints: Send {
    /// Takes `scope` (fencing out its previous holder, where there is a
    /// fence), reads its last checkpoint and records a run started for `why`.
    fn claim(&mut self, scope: Scope, why: &str) -> Result<Claimed>;
    /// Writes one checkpoint, all or nothing.
    fn commit(&mut self, write: Write<'_>) -> Result<()>;
    /// Records another run of a claimed scope (a replay); its id.
    fn start_run(&mut self, scope: Scope, why: &str) -> Result<i64>;
    /// Whether an operator paused publishing.
    fn is_paused(&mut self) -> Result<bool>;
    /// The newest replay asked, with its id.
    fn last_replay(&mut self) -> Result<Option<(i64, Replay)>>;
    /// The highest revision published (or held while paused).
    fn max_revision(&mut self) -> Result<u32>;
    /// Where this contract's version stands (`None`: no longer stored); a
    /// superseded version's runner reads nothing.
    fn version_state(&mut self) -> Result<Option<VersionState>>;
}

/// The contract's identity as stored: name, version and text hash.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    pub pipeline: String,
    pub version: u32,
    pub text_hash: u64,
    pub privacy: crate::privacy::Privacy,
}

impl Identity {
    pub(crate) fn of(contract: &Contract) -> Identity {
        Identity {
            pipeline: contract.pipeline.name.clone(),
            version: contract.pipeline.version,
            text_hash: contract.text_hash,
            privacy: crate::privacy::Privacy::of(contract),
        }
    }
}

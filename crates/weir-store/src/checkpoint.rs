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

use rusqlite::Connection;
use weir_contract::Contract;
use weir_engine::{Delta, Output, RowFormat};

use crate::versions::VersionState;
use crate::{pg, sqlite, Replay, StoreError};

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
struct Identity {
    pipeline: String,
    version: u32,
    text_hash: u64,
    privacy: crate::privacy::Privacy,
}

impl Identity {
    fn of(contract: &Contract) -> Identity {
        Identity {
            pipeline: contract.pipeline.name.clone(),
            version: contract.pipeline.version,
            text_hash: contract.text_hash,
            privacy: crate::privacy::Privacy::of(contract),
        }
    }
}

/// Checkpoints in `weir.db`: one per pipeline version, of the whole topic.
pub struct SqliteCheckpoints {
    conn: Connection,
    id: Identity,
    /// Copies the write-ahead log that `conn`'s commits leave ([`sqlite::open_writer`]).
    _wal: Option<sqlite::WalCopier>,
}

impl SqliteCheckpoints {
    pub fn new(conn: Connection, contract: &Contract) -> SqliteCheckpoints {
        let wal = conn.path().filter(|p| !p.is_empty()).map(|p| sqlite::WalCopier::start(std::path::Path::new(p)));
        SqliteCheckpoints { conn, id: Identity::of(contract), _wal: wal }
    }

    /// The connection, for what is not a checkpoint (tests look into it).
    pub fn connection(&mut self) -> &mut Connection {
        &mut self.conn
    }

    fn topic_only(scope: Scope) -> Result<()> {
        match scope {
            Scope::Topic => Ok(()),
            asked => Err(CheckpointError::Scope { store: "SQLite", keeps: "the whole topic", asked }),
        }
    }
}

impl Checkpoints for SqliteCheckpoints {
    fn claim(&mut self, scope: Scope, why: &str) -> Result<Claimed> {
        Self::topic_only(scope)?;
        let id = &self.id;
        let loaded = sqlite::load(&mut self.conn, &id.pipeline, id.version)?;
        let run = sqlite::start_run(&self.conn, &id.pipeline, id.version, id.text_hash, why)?;
        Ok(match loaded {
            Some(cp) => {
                let state = State { header: cp.header, windows: cp.windows, id_batches: cp.id_batches };
                Claimed { generation: 0, offsets: cp.offsets, state: Some(state), run, replayed: cp.replayed }
            }
            None => Claimed { generation: 0, offsets: Vec::new(), state: None, run, replayed: 0 },
        })
    }

    fn commit(&mut self, w: Write<'_>) -> Result<()> {
        Self::topic_only(w.scope)?;
        let mut offsets = Vec::new();
        for &(p, o) in w.offsets {
            let i = p as usize;
            if offsets.len() <= i {
                offsets.resize(i + 1, 0);
            }
            offsets[i] = o;
        }
        let id = &self.id;
        let write = sqlite::CheckpointWrite {
            pipeline: &id.pipeline,
            version: id.version,
            text_hash: id.text_hash,
            format: w.format,
            out: w.out,
            delta: w.delta,
            offsets: &offsets,
            now_ms: w.now_ms,
            replay: w.replay,
            run: w.run,
            privacy: &id.privacy,
        };
        Ok(sqlite::checkpoint(&mut self.conn, write)?)
    }

    fn start_run(&mut self, scope: Scope, why: &str) -> Result<i64> {
        Self::topic_only(scope)?;
        let id = &self.id;
        Ok(sqlite::start_run(&self.conn, &id.pipeline, id.version, id.text_hash, why)?)
    }

    fn is_paused(&mut self) -> Result<bool> {
        Ok(sqlite::is_paused(&self.conn, &self.id.pipeline)?)
    }

    fn last_replay(&mut self) -> Result<Option<(i64, Replay)>> {
        Ok(sqlite::last_replay(&self.conn, &self.id.pipeline, self.id.version)?)
    }

    fn max_revision(&mut self) -> Result<u32> {
        Ok(sqlite::max_revision(&self.conn, &self.id.pipeline, self.id.version)?)
    }

    fn version_state(&mut self) -> Result<Option<VersionState>> {
        Ok(sqlite::version_state(&self.conn, &self.id.pipeline, self.id.version)?)
    }
}

/// Checkpoints in the `[postgres]` schema: one per partition, fenced.
pub struct PgCheckpoints {
    client: postgres::Client,
    schema: String,
    worker: String,
    id: Identity,
}

impl PgCheckpoints {
    /// Checkpoints of `contract`'s version as `worker` (the version is
    /// registered by the server at its start, [`pg::register_version`]).
    pub fn open(
        client: postgres::Client,
        schema: &str,
        worker: &str,
        contract: &Contract,
    ) -> anyhow::Result<PgCheckpoints> {
        let id = Identity::of(contract);
        Ok(PgCheckpoints { client, schema: schema.to_owned(), worker: worker.to_owned(), id })
    }

    fn partition_only(scope: Scope) -> Result<u32> {
        match scope {
            Scope::Partition(p) => Ok(p),
            asked => Err(CheckpointError::Scope { store: "Postgres", keeps: "one partition each", asked }),
        }
    }
}

impl Checkpoints for PgCheckpoints {
    fn claim(&mut self, scope: Scope, _why: &str) -> Result<Claimed> {
        let p = Self::partition_only(scope)?;
        let id = &self.id;
        let claim =
            pg::claim(&mut self.client, &self.schema, &id.pipeline, p, &self.worker, (id.version, id.text_hash))
                .map_err(|e| match e.downcast::<postgres::Error>() {
                    Ok(db) => CheckpointError::from(db),
                    Err(other) => CheckpointError::Contract(format!("{other:#}")),
                })?;
        Ok(Claimed {
            generation: claim.generation,
            offsets: vec![(p, claim.next_offset)],
            state: claim.checkpoint,
            run: claim.run,
            replayed: claim.replayed,
        })
    }

    fn commit(&mut self, w: Write<'_>) -> Result<()> {
        let partition = Self::partition_only(w.scope)?;
        let next_offset = w.offsets.iter().find(|(p, _)| *p == partition).map_or(0, |(_, o)| *o);
        let id = &self.id;
        let write = pg::PartitionWrite {
            pipeline: &id.pipeline,
            partition,
            generation: w.generation,
            version: id.version,
            text_hash: id.text_hash,
            format: w.format,
            out: w.out,
            delta: w.delta,
            next_offset,
            now_ms: w.now_ms,
            run: w.run,
            replay: w.replay,
            privacy: &id.privacy,
        };
        pg::checkpoint(&mut self.client, &self.schema, write)
    }

    fn start_run(&mut self, scope: Scope, _why: &str) -> Result<i64> {
        let p = Self::partition_only(scope)?;
        let id = &self.id;
        Ok(pg::start_run(&mut self.client, &self.schema, &id.pipeline, p, &self.worker, (id.version, id.text_hash))?)
    }

    fn is_paused(&mut self) -> Result<bool> {
        Ok(pg::is_paused(&mut self.client, &self.schema, &self.id.pipeline)?)
    }

    fn last_replay(&mut self) -> Result<Option<(i64, Replay)>> {
        Ok(pg::last_replay(&mut self.client, &self.schema, &self.id.pipeline, self.id.version)?)
    }

    fn max_revision(&mut self) -> Result<u32> {
        Ok(pg::max_revision(&mut self.client, &self.schema, &self.id.pipeline, self.id.version)?)
    }

    fn version_state(&mut self) -> Result<Option<VersionState>> {
        Ok(pg::version_state(&mut self.client, &self.schema, &self.id.pipeline, self.id.version)?)
    }
}

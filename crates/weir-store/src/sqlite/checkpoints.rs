//! [`SqliteCheckpoints`]: a runner's [`Checkpoints`] in `weir.db`.

use rusqlite::Connection;
use weir_contract::Contract;

use crate::checkpoint::{CheckpointError, Checkpoints, Claimed, Identity, Result, Scope, State, Write};
use crate::versions::VersionState;
use crate::window_batches::Pending;
use crate::{sqlite, Replay};

/// Checkpoints in `weir.db`: one per pipeline version, of the whole topic.
pub struct SqliteCheckpoints {
    conn: Connection,
    id: Identity,
    /// Copies the write-ahead log that `conn`'s commits leave ([`sqlite::open_writer`]).
    _wal: Option<sqlite::WalCopier>,
    /// The pending window batches this writer wrote, for its next fold.
    pending: Pending,
}

impl SqliteCheckpoints {
    pub fn new(conn: Connection, contract: &Contract) -> SqliteCheckpoints {
        let wal = conn.path().filter(|p| !p.is_empty()).map(|p| sqlite::WalCopier::start(std::path::Path::new(p)));
        SqliteCheckpoints { conn, id: Identity::of(contract), _wal: wal, pending: Pending::default() }
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
        Ok(sqlite::checkpoint_keeping(&mut self.conn, write, &mut self.pending)?)
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

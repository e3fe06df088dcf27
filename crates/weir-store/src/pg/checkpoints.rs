//! [`PgCheckpoints`]: a runner's [`Checkpoints`] in the `[postgres]`
//! schema, fenced per partition.

use weir_contract::Contract;

use crate::checkpoint::{CheckpointError, Checkpoints, Claimed, Identity, Result, Scope, Write};
use crate::versions::VersionState;
use crate::{pg, Replay, StoreError};

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
    pub fn open(client: postgres::Client, schema: &str, worker: &str, contract: &Contract) -> Result<PgCheckpoints> {
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
                .map_err(|e| match e {
                    StoreError::Refused(why) => CheckpointError::Contract(why),
                    other => CheckpointError::Store(other),
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

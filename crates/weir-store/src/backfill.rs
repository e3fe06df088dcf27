//! Backfill runs (SPEC.md 9), kept beside the rows they correct.
//!
//! A run is asked for (by an operator, or by a contract's `[reconcile]`
//! schedule) as a `pending` row; one worker claims it under a lease
//! ([`LEASE_MS`], renewed while it reads), so on Kafka with several workers
//! one of them does it, and a run whose worker died is taken up again once
//! its lease runs out. Its corrected rows, the run that published them and
//! its report are written in one transaction ([`Finish`]): a run is wholly
//! published or not at all, and a kill -9 in the middle leaves it to be
//! redone.
//!
//! Each corrected row names the revision it replaces; the transaction
//! checks that this is still the window's published revision (a replay may
//! have republished it meanwhile), so a revision is never published twice.

use postgres::Client;
use rusqlite::{params, Connection, OptionalExtension};
use weir_engine::{Row, RowFormat};

use crate::rows::GLOBAL_START;
use crate::sqlite::RowsWrite;

/// How long a claim holds without being renewed.
pub const LEASE_MS: i64 = 15_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackfillState {
    /// Asked for; no worker holds it (or its worker's lease ran out).
    Pending,
    Running,
    Done,
    /// It could not be done; `error` says why. Nothing was published.
    Failed,
}

impl BackfillState {
    pub fn as_str(self) -> &'static str {
        match self {
            BackfillState::Pending => "pending",
            BackfillState::Running => "running",
            BackfillState::Done => "done",
            BackfillState::Failed => "failed",
        }
    }

    fn parse(text: &str) -> BackfillState {
        match text {
            "running" => BackfillState::Running,
            "done" => BackfillState::Done,
            "failed" => BackfillState::Failed,
            _ => BackfillState::Pending,
        }
    }
}

/// A backfill to do: the windows of `version` starting in `[from_ms, to_ms)`.
#[derive(Debug, Clone, Copy)]
pub struct BackfillAsk<'a> {
    pub version: u32,
    pub from_ms: i64,
    pub to_ms: i64,
    pub who: &'a str,
    pub why: &'a str,
    /// `operator` or `schedule`.
    pub origin: &'a str,
}

/// The next scheduled run (`[reconcile] every`): `ask` covers up to its
/// `to_ms`; it starts where the last scheduled run of the version ended
/// (the first one at `ask.from_ms`), and is asked only when the last one
/// was asked `every_ms` ago or more.
#[derive(Debug, Clone, Copy)]
pub struct Schedule<'a> {
    pub ask: BackfillAsk<'a>,
    pub every_ms: i64,
}

impl<'a> Schedule<'a> {
    /// The run to ask now, given the last scheduled one's (asked, to).
    pub fn next(&self, last: Option<(i64, i64)>, now_ms: i64) -> Option<BackfillAsk<'a>> {
        if last.is_some_and(|(asked, _)| now_ms - asked < self.every_ms) {
            return None;
        }
        let from_ms = last.map_or(self.ask.from_ms, |(_, to)| to);
        (from_ms < self.ask.to_ms).then_some(BackfillAsk { from_ms, ..self.ask })
    }
}

/// A stored backfill run.
#[derive(Debug, Clone)]
pub struct Backfill {
    pub id: i64,
    pub pipeline: String,
    pub version: u32,
    pub from_ms: i64,
    pub to_ms: i64,
    pub who: String,
    pub why: String,
    pub origin: String,
    pub asked_ms: i64,
    pub state: BackfillState,
    pub claimed_by: Option<String>,
    pub finished_ms: Option<i64>,
    /// The run (`runs.id`) its rows carry.
    pub run: Option<i64>,
    /// What it checked and changed, as JSON, once done.
    pub report: Option<String>,
    pub error: Option<String>,
}

/// One window's corrected row and the revision it replaces (0: the window
/// had published nothing).
#[derive(Debug, Clone)]
pub struct Correction {
    pub row: Row,
    pub replaces: u32,
}

/// How publishing a run went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finish {
    /// The rows are published from `first_seq` on, as `run`.
    Published { run: i64, first_seq: i64, rows: usize },
    /// Another worker holds the run now (this one's lease ran out).
    NotOurs,
    /// A window's published revision is not the one the run read: compute again.
    Moved(String),
}

const COLUMNS: &str = "id, pipeline, version, from_ms, to_ms, who, why, origin, asked_ms, state, claimed_by, \
                       finished_ms, run, report, error";

fn from_sqlite(r: &rusqlite::Row<'_>) -> rusqlite::Result<Backfill> {
    Ok(Backfill {
        id: r.get(0)?,
        pipeline: r.get(1)?,
        version: r.get(2)?,
        from_ms: r.get(3)?,
        to_ms: r.get(4)?,
        who: r.get(5)?,
        why: r.get(6)?,
        origin: r.get(7)?,
        asked_ms: r.get(8)?,
        state: BackfillState::parse(&r.get::<_, String>(9)?),
        claimed_by: r.get(10)?,
        finished_ms: r.get(11)?,
        run: r.get(12)?,
        report: r.get(13)?,
        error: r.get(14)?,
    })
}

fn from_pg(r: &postgres::Row) -> Backfill {
    Backfill {
        id: r.get(0),
        pipeline: r.get(1),
        version: r.get::<_, i32>(2) as u32,
        from_ms: r.get(3),
        to_ms: r.get(4),
        who: r.get(5),
        why: r.get(6),
        origin: r.get(7),
        asked_ms: r.get(8),
        state: BackfillState::parse(r.get(9)),
        claimed_by: r.get(10),
        finished_ms: r.get(11),
        run: r.get(12),
        report: r.get(13),
        error: r.get(14),
    }
}

/// The run text the corrected rows' provenance names.
fn run_why(b: &Backfill) -> String {
    format!("backfill {} ({}): {}", b.id, b.origin, b.why)
}

pub mod sqlite {
    use super::*;

    pub fn ask(conn: &Connection, pipeline: &str, a: &BackfillAsk<'_>) -> rusqlite::Result<i64> {
        ask_in(conn, pipeline, a)
    }

    fn ask_in(conn: &Connection, pipeline: &str, a: &BackfillAsk<'_>) -> rusqlite::Result<i64> {
        conn.execute(
            "INSERT INTO backfills (pipeline, version, from_ms, to_ms, who, why, origin, asked_ms, state)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'pending')",
            params![pipeline, a.version, a.from_ms, a.to_ms, a.who, a.why, a.origin, weir_log::now_ms()],
        )?;
        Ok(conn.last_insert_rowid())
    }

    /// Asks the next scheduled run (see [`Schedule`]); its id, or `None`
    /// when one was asked less than `every_ms` ago or the range is empty.
    pub fn schedule(conn: &mut Connection, pipeline: &str, s: &Schedule<'_>) -> rusqlite::Result<Option<i64>> {
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let last: Option<(i64, i64)> = tx
            .query_row(
                "SELECT asked_ms, to_ms FROM backfills WHERE pipeline = ?1 AND version = ?2 AND origin = 'schedule'
                 ORDER BY id DESC LIMIT 1",
                params![pipeline, s.ask.version],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        let Some(ask) = s.next(last, weir_log::now_ms()) else { return Ok(None) };
        let id = ask_in(&tx, pipeline, &ask)?;
        tx.commit()?;
        Ok(Some(id))
    }

    pub fn get(conn: &Connection, pipeline: &str, id: i64) -> rusqlite::Result<Option<Backfill>> {
        conn.query_row(
            &format!("SELECT {COLUMNS} FROM backfills WHERE pipeline = ?1 AND id = ?2"),
            params![pipeline, id],
            from_sqlite,
        )
        .optional()
    }

    /// The newest runs first.
    pub fn list(conn: &Connection, pipeline: &str, limit: i64) -> rusqlite::Result<Vec<Backfill>> {
        let mut stmt =
            conn.prepare(&format!("SELECT {COLUMNS} FROM backfills WHERE pipeline = ?1 ORDER BY id DESC LIMIT ?2"))?;
        let rows = stmt.query_map(params![pipeline, limit], from_sqlite)?;
        rows.collect()
    }

    /// The oldest run of one of `versions` nobody holds, now held by
    /// `claimant` for [`LEASE_MS`].
    pub fn claim(
        conn: &mut Connection,
        pipeline: &str,
        claimant: &str,
        versions: &[u32],
    ) -> rusqlite::Result<Option<Backfill>> {
        let now = weir_log::now_ms();
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let listed = versions.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        let id: Option<i64> = tx
            .query_row(
                &format!(
                    "SELECT id FROM backfills WHERE pipeline = ?1 AND version IN ({listed})
                       AND (state = 'pending' OR (state = 'running' AND lease_until < ?2)) ORDER BY id LIMIT 1"
                ),
                params![pipeline, now],
                |r| r.get(0),
            )
            .optional()?;
        let Some(id) = id else { return Ok(None) };
        tx.execute(
            "UPDATE backfills SET state = 'running', claimed_by = ?2, lease_until = ?3 WHERE id = ?1",
            params![id, claimant, now + LEASE_MS],
        )?;
        let run = tx.query_row(&format!("SELECT {COLUMNS} FROM backfills WHERE id = ?1"), [id], from_sqlite)?;
        tx.commit()?;
        Ok(Some(run))
    }

    /// Extends the claim; false when the run is no longer `claimant`'s.
    pub fn renew(conn: &Connection, id: i64, claimant: &str) -> rusqlite::Result<bool> {
        let n = conn.execute(
            "UPDATE backfills SET lease_until = ?3 WHERE id = ?1 AND claimed_by = ?2 AND state = 'running'",
            params![id, claimant, weir_log::now_ms() + LEASE_MS],
        )?;
        Ok(n == 1)
    }

    pub fn fail(conn: &Connection, id: i64, claimant: &str, error: &str) -> rusqlite::Result<bool> {
        let n = conn.execute(
            "UPDATE backfills SET state = 'failed', error = ?3, finished_ms = ?4, lease_until = NULL
             WHERE id = ?1 AND claimed_by = ?2 AND state = 'running'",
            params![id, claimant, error, weir_log::now_ms()],
        )?;
        Ok(n == 1)
    }

    /// Publishes the run's corrections and stores its report, in one transaction.
    pub fn finish(
        conn: &mut Connection,
        id: i64,
        claimant: &str,
        format: &RowFormat,
        corrections: &[Correction],
        report: &str,
    ) -> rusqlite::Result<Finish> {
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let run = tx.query_row(&format!("SELECT {COLUMNS} FROM backfills WHERE id = ?1"), [id], from_sqlite)?;
        if run.state != BackfillState::Running || run.claimed_by.as_deref() != Some(claimant) {
            return Ok(Finish::NotOurs);
        }
        let (pipeline, version) = (run.pipeline.as_str(), run.version);
        {
            let mut published = tx.prepare_cached(
                "SELECT max(revision) FROM (
                   SELECT revision FROM latest WHERE pipeline = ?1 AND version = ?2 AND key = ?3 AND window_start = ?4
                   UNION ALL
                   SELECT revision FROM held_latest WHERE pipeline = ?1 AND version = ?2 AND key = ?3 AND window_start = ?4)",
            )?;
            for c in corrections {
                let start = c.row.window_start.unwrap_or(GLOBAL_START);
                let now: Option<u32> =
                    published.query_row(params![pipeline, version, &c.row.key[..], start], |r| r.get(0))?;
                if now.unwrap_or(0) != c.replaces {
                    return Ok(Finish::Moved(format!(
                        "the window starting at {start} ms was republished (revision {} now, {} read)",
                        now.unwrap_or(0),
                        c.replaces
                    )));
                }
            }
        }
        let paused = tx.prepare_cached("SELECT 1 FROM pauses WHERE pipeline = ?1")?.exists([pipeline])?;
        let now_ms = weir_log::now_ms();
        tx.execute(
            "INSERT INTO runs (pipeline, version, text_hash, weir_version, started_ms, why)
             SELECT pipeline, version, contract_hash, ?3, ?4, ?5 FROM versions WHERE pipeline = ?1 AND version = ?2",
            params![pipeline, version, env!("CARGO_PKG_VERSION"), now_ms, run_why(&run)],
        )?;
        let run_id = tx.last_insert_rowid();
        let (first_seq, lseq) = crate::sqlite::stream_position(&tx, pipeline)?;
        let rows: Vec<Row> = corrections.iter().map(|c| c.row.clone()).collect();
        let at = RowsWrite { pipeline, version, format, now_ms, run: run_id };
        let next =
            crate::sqlite::write_rows(&tx, &at, &rows, first_seq, if paused { "held_latest" } else { "latest" })?;
        crate::sqlite::set_stream_position(&tx, pipeline, (next, lseq))?;
        tx.execute(
            "UPDATE backfills SET state = 'done', finished_ms = ?2, run = ?3, report = ?4, lease_until = NULL WHERE id = ?1",
            params![id, now_ms, run_id, report],
        )?;
        tx.commit()?;
        Ok(Finish::Published { run: run_id, first_seq, rows: rows.len() })
    }

    /// The engine headers of a version's checkpoints (one: the whole topic).
    pub fn headers(conn: &Connection, pipeline: &str, version: u32) -> rusqlite::Result<Vec<(u32, Vec<u8>)>> {
        let header: Option<Vec<u8>> = conn
            .query_row(
                "SELECT header FROM pipelines WHERE name = ?1 AND version = ?2",
                params![pipeline, version],
                |r| r.get(0),
            )
            .optional()?;
        Ok(header.map(|h| (0, h)).into_iter().collect())
    }
}

pub mod pg {
    use super::*;

    pub fn ask(client: &mut Client, schema: &str, pipeline: &str, a: &BackfillAsk<'_>) -> Result<i64, postgres::Error> {
        ask_in(client, schema, pipeline, a)
    }

    fn ask_in(
        client: &mut impl postgres::GenericClient,
        schema: &str,
        pipeline: &str,
        a: &BackfillAsk<'_>,
    ) -> Result<i64, postgres::Error> {
        let row = client.query_one(
            &format!(
                "INSERT INTO {schema}.backfills (pipeline, version, from_ms, to_ms, who, why, origin, asked_ms, state)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'pending') RETURNING id"
            ),
            &[&pipeline, &(a.version as i32), &a.from_ms, &a.to_ms, &a.who, &a.why, &a.origin, &weir_log::now_ms()],
        )?;
        Ok(row.get(0))
    }

    /// Asks the next scheduled run (see [`Schedule`]), under a lock every
    /// worker of the pipeline takes for it, so one of them asks.
    pub fn schedule(
        client: &mut Client,
        schema: &str,
        pipeline: &str,
        s: &Schedule<'_>,
    ) -> Result<Option<i64>, postgres::Error> {
        let mut tx = client.transaction()?;
        tx.execute("SELECT pg_advisory_xact_lock(hashtext('weir backfill schedule ' || $1))", &[&pipeline])?;
        let last = tx
            .query_opt(
                &format!(
                    "SELECT asked_ms, to_ms FROM {schema}.backfills WHERE pipeline = $1 AND version = $2 AND origin = 'schedule'
                     ORDER BY id DESC LIMIT 1"
                ),
                &[&pipeline, &(s.ask.version as i32)],
            )?
            .map(|r| (r.get::<_, i64>(0), r.get::<_, i64>(1)));
        let Some(a) = s.next(last, weir_log::now_ms()) else { return Ok(None) };
        let id = ask_in(&mut tx, schema, pipeline, &a)?;
        tx.commit()?;
        Ok(Some(id))
    }

    pub fn get(
        client: &mut Client,
        schema: &str,
        pipeline: &str,
        id: i64,
    ) -> Result<Option<Backfill>, postgres::Error> {
        let row = client.query_opt(
            &format!("SELECT {COLUMNS} FROM {schema}.backfills WHERE pipeline = $1 AND id = $2"),
            &[&pipeline, &id],
        )?;
        Ok(row.as_ref().map(from_pg))
    }

    pub fn list(
        client: &mut Client,
        schema: &str,
        pipeline: &str,
        limit: i64,
    ) -> Result<Vec<Backfill>, postgres::Error> {
        let rows = client.query(
            &format!("SELECT {COLUMNS} FROM {schema}.backfills WHERE pipeline = $1 ORDER BY id DESC LIMIT $2"),
            &[&pipeline, &limit],
        )?;
        Ok(rows.iter().map(from_pg).collect())
    }

    /// The oldest run of one of `versions` nobody holds, now held by `claimant`.
    pub fn claim(
        client: &mut Client,
        schema: &str,
        pipeline: &str,
        claimant: &str,
        versions: &[u32],
    ) -> Result<Option<Backfill>, postgres::Error> {
        let now = weir_log::now_ms();
        let versions: Vec<i32> = versions.iter().map(|v| *v as i32).collect();
        let row = client.query_opt(
            &format!(
                "UPDATE {schema}.backfills SET state = 'running', claimed_by = $2, lease_until = $3
                 WHERE id = (SELECT id FROM {schema}.backfills WHERE pipeline = $1 AND version = ANY($5)
                               AND (state = 'pending' OR (state = 'running' AND lease_until < $4))
                             ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
                 RETURNING {COLUMNS}"
            ),
            &[&pipeline, &claimant, &(now + LEASE_MS), &now, &versions],
        )?;
        Ok(row.as_ref().map(from_pg))
    }

    pub fn renew(client: &mut Client, schema: &str, id: i64, claimant: &str) -> Result<bool, postgres::Error> {
        let n = client.execute(
            &format!(
                "UPDATE {schema}.backfills SET lease_until = $3 WHERE id = $1 AND claimed_by = $2 AND state = 'running'"
            ),
            &[&id, &claimant, &(weir_log::now_ms() + LEASE_MS)],
        )?;
        Ok(n == 1)
    }

    pub fn fail(
        client: &mut Client,
        schema: &str,
        id: i64,
        claimant: &str,
        error: &str,
    ) -> Result<bool, postgres::Error> {
        let n = client.execute(
            &format!(
                "UPDATE {schema}.backfills SET state = 'failed', error = $3, finished_ms = $4, lease_until = NULL
                 WHERE id = $1 AND claimed_by = $2 AND state = 'running'"
            ),
            &[&id, &claimant, &error, &weir_log::now_ms()],
        )?;
        Ok(n == 1)
    }

    pub fn finish(
        client: &mut Client,
        schema: &str,
        id: i64,
        claimant: &str,
        format: &RowFormat,
        corrections: &[Correction],
        report: &str,
    ) -> Result<Finish, postgres::Error> {
        let mut tx = client.transaction()?;
        let found =
            tx.query_opt(&format!("SELECT {COLUMNS} FROM {schema}.backfills WHERE id = $1 FOR UPDATE"), &[&id])?;
        let Some(run) = found.as_ref().map(from_pg) else { return Ok(Finish::NotOurs) };
        if run.state != BackfillState::Running || run.claimed_by.as_deref() != Some(claimant) {
            return Ok(Finish::NotOurs);
        }
        let (pipeline, version) = (run.pipeline.as_str(), run.version as i32);
        // The pipeline row's lock orders this with every publishing checkpoint and a pause.
        let rows = corrections.len() as i64;
        let r = tx.query_one(
            &format!("UPDATE {schema}.pipelines SET next_seq = next_seq + $2 WHERE name = $1 RETURNING next_seq - $2"),
            &[&pipeline, &rows],
        )?;
        let first_seq: i64 = r.get(0);
        for c in corrections {
            let start = c.row.window_start.unwrap_or(GLOBAL_START);
            let now: Option<i64> = tx
                .query_one(
                    &format!(
                        "SELECT max(revision) FROM (
                           SELECT revision FROM {schema}.latest WHERE pipeline = $1 AND version = $2 AND key = $3 AND window_start = $4
                           UNION ALL
                           SELECT revision FROM {schema}.held_latest WHERE pipeline = $1 AND version = $2 AND key = $3 AND window_start = $4) r"
                    ),
                    &[&pipeline, &version, &&c.row.key[..], &start],
                )?
                .get(0);
            if now.unwrap_or(0) != i64::from(c.replaces) {
                return Ok(Finish::Moved(format!(
                    "the window starting at {start} ms was republished (revision {} now, {} read)",
                    now.unwrap_or(0),
                    c.replaces
                )));
            }
        }
        let paused =
            tx.query_opt(&format!("SELECT 1 FROM {schema}.pauses WHERE pipeline = $1"), &[&pipeline])?.is_some();
        let now_ms = weir_log::now_ms();
        let run_id: i64 = tx
            .query_one(
                &format!(
                    "INSERT INTO {schema}.runs (pipeline, partition, version, text_hash, weir_version, worker, started_ms)
                     SELECT pipeline, -1, version, contract_hash, $3, $4, $5 FROM {schema}.versions
                      WHERE pipeline = $1 AND version = $2 RETURNING id"
                ),
                &[&pipeline, &version, &env!("CARGO_PKG_VERSION"), &run_why(&run), &now_ms],
            )?
            .get(0);
        let rows: Vec<Row> = corrections.iter().map(|c| c.row.clone()).collect();
        let at = crate::pg::RowsAt { pipeline, partition: -1, version: run.version, format, now_ms, run: run_id };
        crate::pg::write_rows(&mut tx, schema, &at, &rows, first_seq, paused)?;
        tx.execute(
            &format!(
                "UPDATE {schema}.backfills SET state = 'done', finished_ms = $2, run = $3, report = $4, lease_until = NULL
                 WHERE id = $1"
            ),
            &[&id, &now_ms, &run_id, &report],
        )?;
        tx.commit()?;
        Ok(Finish::Published { run: run_id, first_seq, rows: rows.len() })
    }

    /// The engine headers of a version's checkpoints, one per partition.
    pub fn headers(
        client: &mut Client,
        schema: &str,
        pipeline: &str,
        version: u32,
    ) -> Result<Vec<(u32, Vec<u8>)>, postgres::Error> {
        let rows = client.query(
            &format!(
                "SELECT partition, header FROM {schema}.partitions
                  WHERE pipeline = $1 AND version = $2 AND header IS NOT NULL ORDER BY partition"
            ),
            &[&pipeline, &(version as i32)],
        )?;
        Ok(rows.iter().map(|r| (r.get::<_, i32>(0) as u32, r.get(1))).collect())
    }
}

/// A stored reconciliation against a system of record: its report as JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct Reconciliation {
    pub id: i64,
    pub pipeline: String,
    pub version: u32,
    pub who: String,
    pub why: String,
    /// The export's name, or `system_of_record` for a contract's query.
    pub source: String,
    pub at_ms: i64,
    /// `pass` or `fail`.
    pub verdict: String,
    pub report: String,
}

const RECONCILIATION_COLUMNS: &str = "id, pipeline, version, who, why, source, at_ms, verdict, report";

pub mod reconciliations {
    use super::*;

    fn from_sqlite(r: &rusqlite::Row<'_>) -> rusqlite::Result<Reconciliation> {
        Ok(Reconciliation {
            id: r.get(0)?,
            pipeline: r.get(1)?,
            version: r.get(2)?,
            who: r.get(3)?,
            why: r.get(4)?,
            source: r.get(5)?,
            at_ms: r.get(6)?,
            verdict: r.get(7)?,
            report: r.get(8)?,
        })
    }

    fn from_pg(r: &postgres::Row) -> Reconciliation {
        Reconciliation {
            id: r.get(0),
            pipeline: r.get(1),
            version: r.get::<_, i32>(2) as u32,
            who: r.get(3),
            why: r.get(4),
            source: r.get(5),
            at_ms: r.get(6),
            verdict: r.get(7),
            report: r.get(8),
        }
    }

    /// Keeps a reconciliation (its `id` is ignored); its id.
    pub fn record_sqlite(conn: &Connection, r: &Reconciliation) -> rusqlite::Result<i64> {
        conn.execute(
            "INSERT INTO reconciliations (pipeline, version, who, why, source, at_ms, verdict, report)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![r.pipeline, r.version, r.who, r.why, r.source, r.at_ms, r.verdict, r.report],
        )?;
        Ok(conn.last_insert_rowid())
    }

    /// The newest first; with `id`, that one only.
    pub fn list_sqlite(
        conn: &Connection,
        pipeline: &str,
        id: Option<i64>,
        limit: i64,
    ) -> rusqlite::Result<Vec<Reconciliation>> {
        let mut stmt = conn.prepare(&format!(
            "SELECT {RECONCILIATION_COLUMNS} FROM reconciliations WHERE pipeline = ?1 AND (?2 IS NULL OR id = ?2)
             ORDER BY id DESC LIMIT ?3"
        ))?;
        let rows = stmt.query_map(params![pipeline, id, limit], from_sqlite)?;
        rows.collect()
    }

    pub fn record_pg(client: &mut Client, schema: &str, r: &Reconciliation) -> Result<i64, postgres::Error> {
        let row = client.query_one(
            &format!(
                "INSERT INTO {schema}.reconciliations (pipeline, version, who, why, source, at_ms, verdict, report)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id"
            ),
            &[&r.pipeline, &(r.version as i32), &r.who, &r.why, &r.source, &r.at_ms, &r.verdict, &r.report],
        )?;
        Ok(row.get(0))
    }

    pub fn list_pg(
        client: &mut Client,
        schema: &str,
        pipeline: &str,
        id: Option<i64>,
        limit: i64,
    ) -> Result<Vec<Reconciliation>, postgres::Error> {
        let rows = client.query(
            &format!(
                "SELECT {RECONCILIATION_COLUMNS} FROM {schema}.reconciliations
                  WHERE pipeline = $1 AND ($2::BIGINT IS NULL OR id = $2) ORDER BY id DESC LIMIT $3"
            ),
            &[&pipeline, &id, &limit],
        )?;
        Ok(rows.iter().map(from_pg).collect())
    }
}

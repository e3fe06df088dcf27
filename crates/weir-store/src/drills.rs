//! Failure drills (issue 18): each drill asked of a pipeline, kept in its
//! store (`drills`, SQLite or Postgres) from the moment it is asked
//! (`running`, in the same transaction as its audit entry on SQLite) to its
//! verdict (`pass` or `fail`) and report, so `weir review` lists the drills
//! run in its period on either topology. A running drill holds a lease
//! that its server renews; one whose lease ran out was cut off by a stop or
//! a crash, and is shown `interrupted` (see [`Drill::verdict_now`]).

use serde::Serialize;

/// One drill.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Drill {
    pub id: i64,
    pub pipeline: String,
    /// The live version the drill's shadow ran.
    pub version: u32,
    pub scenario: String,
    pub who: String,
    pub why: String,
    pub started_ms: i64,
    pub finished_ms: Option<i64>,
    /// `running`, `pass` or `fail`.
    pub verdict: String,
    /// The report, JSON, once finished.
    pub report: Option<String>,
    /// Until when the server running it answers for it.
    pub lease_until_ms: Option<i64>,
}

/// How long a drill's lease lasts; its server renews it every third of that.
pub const LEASE_MS: i64 = 15_000;

impl Drill {
    /// The verdict, or `interrupted` for a running drill whose server
    /// stopped renewing its lease.
    pub fn verdict_now(&self, now_ms: i64) -> &str {
        match self.lease_until_ms {
            Some(until) if self.verdict == "running" && until < now_ms => "interrupted",
            _ => &self.verdict,
        }
    }
}

const COLUMNS: &str =
    "id, pipeline, version, scenario, who, why, started_ms, finished_ms, verdict, report, lease_until_ms";

pub mod sqlite {
    use rusqlite::{params, Connection};

    use super::*;

    pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS drills (
    id INTEGER PRIMARY KEY AUTOINCREMENT, pipeline TEXT NOT NULL, version INTEGER NOT NULL, scenario TEXT NOT NULL,
    who TEXT NOT NULL, why TEXT NOT NULL, started_ms INTEGER NOT NULL, finished_ms INTEGER,
    verdict TEXT NOT NULL, report TEXT, lease_until_ms INTEGER);
CREATE INDEX IF NOT EXISTS drills_by_pipeline ON drills (pipeline, id);
";

    /// Adds `lease_until_ms` to a `drills` table made before it.
    pub fn migrate(conn: &Connection) -> rusqlite::Result<()> {
        let has = conn.prepare("SELECT 1 FROM pragma_table_info('drills') WHERE name = 'lease_until_ms'")?.exists([])?;
        if !has {
            conn.execute_batch("ALTER TABLE drills ADD COLUMN lease_until_ms INTEGER")?;
        }
        Ok(())
    }

    /// Keeps a drill as `running`; its id.
    pub fn start(conn: &Connection, pipeline: &str, d: &crate::DrillAsk) -> rusqlite::Result<i64> {
        conn.execute(
            "INSERT INTO drills (pipeline, version, scenario, who, why, started_ms, verdict, lease_until_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'running', ?7)",
            params![pipeline, d.version, d.scenario, d.who, d.why, weir_log::now_ms(), weir_log::now_ms() + LEASE_MS],
        )?;
        Ok(conn.last_insert_rowid())
    }

    pub fn renew(conn: &Connection, id: i64) -> rusqlite::Result<()> {
        conn.execute(
            "UPDATE drills SET lease_until_ms = ?2 WHERE id = ?1 AND verdict = 'running'",
            params![id, weir_log::now_ms() + LEASE_MS],
        )?;
        Ok(())
    }

    pub fn finish(conn: &Connection, id: i64, verdict: &str, report: &str) -> rusqlite::Result<()> {
        conn.execute(
            "UPDATE drills SET finished_ms = ?2, verdict = ?3, report = ?4 WHERE id = ?1",
            params![id, weir_log::now_ms(), verdict, report],
        )?;
        Ok(())
    }

    /// The newest first; with `id`, that one only.
    pub fn list(conn: &Connection, pipeline: &str, id: Option<i64>, limit: i64) -> rusqlite::Result<Vec<Drill>> {
        let mut stmt = conn.prepare(&format!(
            "SELECT {COLUMNS} FROM drills WHERE pipeline = ?1 AND (?2 IS NULL OR id = ?2) ORDER BY id DESC LIMIT ?3"
        ))?;
        let rows = stmt.query_map(params![pipeline, id, limit], |r| {
            Ok(Drill {
                id: r.get(0)?,
                pipeline: r.get(1)?,
                version: r.get(2)?,
                scenario: r.get(3)?,
                who: r.get(4)?,
                why: r.get(5)?,
                started_ms: r.get(6)?,
                finished_ms: r.get(7)?,
                verdict: r.get(8)?,
                report: r.get(9)?,
                lease_until_ms: r.get(10)?,
            })
        })?;
        rows.collect()
    }
}

pub mod pg {
    use postgres::Client;

    use super::*;

    pub fn schema(schema: &str) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {schema}.drills (
    id BIGSERIAL PRIMARY KEY, pipeline TEXT NOT NULL, version INTEGER NOT NULL, scenario TEXT NOT NULL,
    who TEXT NOT NULL, why TEXT NOT NULL, started_ms BIGINT NOT NULL, finished_ms BIGINT,
    verdict TEXT NOT NULL, report TEXT, lease_until_ms BIGINT);
ALTER TABLE {schema}.drills ADD COLUMN IF NOT EXISTS lease_until_ms BIGINT;
CREATE INDEX IF NOT EXISTS drills_by_pipeline ON {schema}.drills (pipeline, id);
"
        )
    }

    pub fn start(
        client: &mut Client,
        schema: &str,
        pipeline: &str,
        d: &crate::DrillAsk,
    ) -> Result<i64, postgres::Error> {
        let row = client.query_one(
            &format!(
                "INSERT INTO {schema}.drills (pipeline, version, scenario, who, why, started_ms, verdict, lease_until_ms)
                 VALUES ($1, $2, $3, $4, $5, $6, 'running', $7) RETURNING id"
            ),
            &[&pipeline, &(d.version as i32), &d.scenario, &d.who, &d.why, &weir_log::now_ms(), &(weir_log::now_ms() + LEASE_MS)],
        )?;
        Ok(row.get(0))
    }

    pub fn renew(client: &mut Client, schema: &str, id: i64) -> Result<(), postgres::Error> {
        client.execute(
            &format!("UPDATE {schema}.drills SET lease_until_ms = $2 WHERE id = $1 AND verdict = 'running'"),
            &[&id, &(weir_log::now_ms() + LEASE_MS)],
        )?;
        Ok(())
    }

    pub fn finish(
        client: &mut Client,
        schema: &str,
        id: i64,
        verdict: &str,
        report: &str,
    ) -> Result<(), postgres::Error> {
        client.execute(
            &format!("UPDATE {schema}.drills SET finished_ms = $2, verdict = $3, report = $4 WHERE id = $1"),
            &[&id, &weir_log::now_ms(), &verdict, &report],
        )?;
        Ok(())
    }

    pub fn list(
        client: &mut Client,
        schema: &str,
        pipeline: &str,
        id: Option<i64>,
        limit: i64,
    ) -> Result<Vec<Drill>, postgres::Error> {
        let rows = client.query(
            &format!(
                "SELECT {COLUMNS} FROM {schema}.drills
                  WHERE pipeline = $1 AND ($2::BIGINT IS NULL OR id = $2) ORDER BY id DESC LIMIT $3"
            ),
            &[&pipeline, &id, &limit],
        )?;
        Ok(rows
            .iter()
            .map(|r| Drill {
                id: r.get(0),
                pipeline: r.get(1),
                version: r.get::<_, i32>(2) as u32,
                scenario: r.get(3),
                who: r.get(4),
                why: r.get(5),
                started_ms: r.get(6),
                finished_ms: r.get(7),
                verdict: r.get(8),
                report: r.get(9),
                lease_until_ms: r.get(10),
            })
            .collect())
    }
}

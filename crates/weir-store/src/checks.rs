//! The results of the contracts' named checks (issue 18): every evaluation
//! kept in `check_results`, in the pipeline's store (SQLite or Postgres),
//! beside the rows it judged.
//!
//! A result is identified by its pipeline, version, check and `subject`
//! (`row:SEQ` for a published row, `at:MINUTE` for an observation of the
//! watermark, `reconciliation:ID`), so two workers that evaluate the same
//! row keep one result, and the one that kept it is the one that acts.

use serde::Serialize;

/// One evaluation of one check.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckResult {
    pub check: String,
    pub version: u32,
    pub subject: String,
    /// The judged row's place in the change stream, for row and volume checks.
    pub seq: Option<i64>,
    /// The judged row's key, as JSON.
    pub key: Option<String>,
    pub window_start_ms: Option<i64>,
    pub window_end_ms: Option<i64>,
    pub passed: bool,
    /// What was seen, in words (`values.revenue = -12.50`, `watermark 14m old`).
    pub observed: String,
    pub at_ms: i64,
}

/// Which results a listing wants.
#[derive(Debug, Clone, Default)]
pub struct CheckFilter {
    pub check: Option<String>,
    /// Only failed (`Some(false)`) or passed results.
    pub passed: Option<bool>,
    pub since_ms: Option<i64>,
    pub limit: i64,
}

/// How often a check passed and failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckTotal {
    pub check: String,
    pub passed: i64,
    pub failed: i64,
}

const COLUMNS: &str = "check_name, version, subject, seq, key, window_start_ms, window_end_ms, passed, observed, at_ms";

pub mod sqlite {
    use rusqlite::{params, Connection};

    use super::*;

    pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS check_results (
    id INTEGER PRIMARY KEY AUTOINCREMENT, pipeline TEXT NOT NULL, version INTEGER NOT NULL,
    check_name TEXT NOT NULL, subject TEXT NOT NULL, seq INTEGER, key TEXT,
    window_start_ms INTEGER, window_end_ms INTEGER, passed INTEGER NOT NULL, observed TEXT NOT NULL,
    at_ms INTEGER NOT NULL, UNIQUE (pipeline, version, check_name, subject));
CREATE INDEX IF NOT EXISTS check_results_by_time ON check_results (pipeline, version, at_ms);
";

    fn result(r: &rusqlite::Row<'_>) -> rusqlite::Result<CheckResult> {
        Ok(CheckResult {
            check: r.get(0)?,
            version: r.get(1)?,
            subject: r.get(2)?,
            seq: r.get(3)?,
            key: r.get(4)?,
            window_start_ms: r.get(5)?,
            window_end_ms: r.get(6)?,
            passed: r.get(7)?,
            observed: r.get(8)?,
            at_ms: r.get(9)?,
        })
    }

    /// Keeps each result not kept before; which ones were new.
    pub fn record(conn: &mut Connection, pipeline: &str, results: &[CheckResult]) -> rusqlite::Result<Vec<bool>> {
        let tx = conn.transaction()?;
        let mut out = Vec::with_capacity(results.len());
        {
            let mut stmt = tx.prepare_cached(&format!(
                "INSERT OR IGNORE INTO check_results (pipeline, {COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"
            ))?;
            for r in results {
                let n = stmt.execute(params![
                    pipeline,
                    r.check,
                    r.version,
                    r.subject,
                    r.seq,
                    r.key,
                    r.window_start_ms,
                    r.window_end_ms,
                    r.passed,
                    r.observed,
                    r.at_ms
                ])?;
                out.push(n == 1);
            }
        }
        tx.commit()?;
        Ok(out)
    }

    /// The newest results first.
    pub fn list(
        conn: &Connection,
        pipeline: &str,
        version: u32,
        f: &CheckFilter,
    ) -> rusqlite::Result<Vec<CheckResult>> {
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM check_results WHERE pipeline = ?1 AND version = ?2
               AND (?3 IS NULL OR check_name = ?3) AND (?4 IS NULL OR passed = ?4) AND (?5 IS NULL OR at_ms >= ?5)
             ORDER BY at_ms DESC, id DESC LIMIT ?6"
        ))?;
        let rows = stmt.query_map(params![pipeline, version, f.check, f.passed, f.since_ms, f.limit], result)?;
        rows.collect()
    }

    pub fn totals(conn: &Connection, pipeline: &str, version: u32, since_ms: i64) -> rusqlite::Result<Vec<CheckTotal>> {
        let mut stmt = conn.prepare_cached(
            "SELECT check_name, SUM(passed), SUM(1 - passed) FROM check_results
             WHERE pipeline = ?1 AND version = ?2 AND at_ms >= ?3 GROUP BY check_name ORDER BY check_name",
        )?;
        let rows = stmt.query_map(params![pipeline, version, since_ms], |r| {
            Ok(CheckTotal { check: r.get(0)?, passed: r.get(1)?, failed: r.get(2)? })
        })?;
        rows.collect()
    }

    /// The highest row `seq` a check has judged.
    pub fn cursor(conn: &Connection, pipeline: &str, version: u32, check: &str) -> rusqlite::Result<i64> {
        conn.query_row(
            "SELECT COALESCE(MAX(seq), 0) FROM check_results WHERE pipeline = ?1 AND version = ?2 AND check_name = ?3",
            params![pipeline, version, check],
            |r| r.get(0),
        )
    }
}

pub mod pg {
    use postgres::Client;

    use super::*;

    pub fn schema(schema: &str) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {schema}.check_results (
    id BIGSERIAL PRIMARY KEY, pipeline TEXT NOT NULL, version BIGINT NOT NULL,
    check_name TEXT NOT NULL, subject TEXT NOT NULL, seq BIGINT, key TEXT,
    window_start_ms BIGINT, window_end_ms BIGINT, passed BOOLEAN NOT NULL, observed TEXT NOT NULL,
    at_ms BIGINT NOT NULL, UNIQUE (pipeline, version, check_name, subject));
CREATE INDEX IF NOT EXISTS check_results_by_time ON {schema}.check_results (pipeline, version, at_ms);
"
        )
    }

    fn result(r: &postgres::Row) -> CheckResult {
        CheckResult {
            check: r.get(0),
            version: r.get::<_, i64>(1) as u32,
            subject: r.get(2),
            seq: r.get(3),
            key: r.get(4),
            window_start_ms: r.get(5),
            window_end_ms: r.get(6),
            passed: r.get(7),
            observed: r.get(8),
            at_ms: r.get(9),
        }
    }

    pub fn record(
        client: &mut Client,
        s: &str,
        pipeline: &str,
        results: &[CheckResult],
    ) -> Result<Vec<bool>, postgres::Error> {
        let mut tx = client.transaction()?;
        let stmt = tx.prepare(&format!(
            "INSERT INTO {s}.check_results (pipeline, {COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
             ON CONFLICT (pipeline, version, check_name, subject) DO NOTHING"
        ))?;
        let mut out = Vec::with_capacity(results.len());
        for r in results {
            let n = tx.execute(
                &stmt,
                &[
                    &pipeline,
                    &r.check,
                    &(r.version as i64),
                    &r.subject,
                    &r.seq,
                    &r.key,
                    &r.window_start_ms,
                    &r.window_end_ms,
                    &r.passed,
                    &r.observed,
                    &r.at_ms,
                ],
            )?;
            out.push(n == 1);
        }
        tx.commit()?;
        Ok(out)
    }

    pub fn list(
        client: &mut Client,
        s: &str,
        pipeline: &str,
        version: u32,
        f: &CheckFilter,
    ) -> Result<Vec<CheckResult>, postgres::Error> {
        let rows = client.query(
            &format!(
                "SELECT {COLUMNS} FROM {s}.check_results WHERE pipeline = $1 AND version = $2
                   AND ($3::TEXT IS NULL OR check_name = $3) AND ($4::BOOLEAN IS NULL OR passed = $4)
                   AND ($5::BIGINT IS NULL OR at_ms >= $5)
                 ORDER BY at_ms DESC, id DESC LIMIT $6"
            ),
            &[&pipeline, &(version as i64), &f.check, &f.passed, &f.since_ms, &f.limit],
        )?;
        Ok(rows.iter().map(result).collect())
    }

    pub fn totals(
        client: &mut Client,
        s: &str,
        pipeline: &str,
        version: u32,
        since_ms: i64,
    ) -> Result<Vec<CheckTotal>, postgres::Error> {
        let rows = client.query(
            &format!(
                "SELECT check_name, COUNT(*) FILTER (WHERE passed), COUNT(*) FILTER (WHERE NOT passed)
                 FROM {s}.check_results WHERE pipeline = $1 AND version = $2 AND at_ms >= $3
                 GROUP BY check_name ORDER BY check_name"
            ),
            &[&pipeline, &(version as i64), &since_ms],
        )?;
        Ok(rows.iter().map(|r| CheckTotal { check: r.get(0), passed: r.get(1), failed: r.get(2) }).collect())
    }

    pub fn cursor(
        client: &mut Client,
        s: &str,
        pipeline: &str,
        version: u32,
        check: &str,
    ) -> Result<i64, postgres::Error> {
        Ok(client
            .query_one(
                &format!(
                    "SELECT COALESCE(MAX(seq), 0) FROM {s}.check_results WHERE pipeline = $1 AND version = $2 AND check_name = $3"
                ),
                &[&pipeline, &(version as i64), &check],
            )?
            .get(0))
    }
}

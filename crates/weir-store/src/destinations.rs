//! Where each destination (SPEC.md 11) stands in its pipeline's change
//! stream, kept in the pipeline's store (`destinations`, SQLite or
//! Postgres) so that every worker and every restart sees the same:
//!
//! - `position`: the next `seq` to deliver;
//! - `pending`: the batch being delivered, written before it is sent, so a
//!   delivery cut off by a crash is sent again exactly as it was (the same
//!   changes under the same idempotency key);
//! - `stopped`: why the receiver refused a batch, until an operator
//!   resumes the destination (`Act::ResumeDestination`, audited).
//!
//! A `postgres` destination commits its position in its own database, with
//! the rows; what is kept here is then its last known place, for status.
//! The table was added without a schema version change: older builds
//! ignore it.

use serde::Serialize;

/// A destination's place in its pipeline's change stream.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Place {
    /// The next `seq` to deliver (1 for a destination that delivered nothing).
    pub position: i64,
    /// The batch being delivered (its description, JSON), sent again as it is.
    pub pending: Option<String>,
    /// Why the receiver refused, until an operator resumes it.
    pub stopped: Option<String>,
    pub stopped_ms: Option<i64>,
    /// When a batch was last delivered.
    pub delivered_ms: Option<i64>,
}

/// What a deliverer records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// A batch is about to be sent (`pending`), from `position`.
    Sending { position: i64, pending: String },
    /// Everything below `next` is delivered; nothing pending.
    Delivered { next: i64 },
    /// The receiver refused: stopped, with the batch kept pending.
    Stopped { why: String },
}

/// The last visible change of a stream and the time of one in it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Head {
    /// The highest published `seq` (0 for an empty stream).
    pub last: i64,
    /// When the change at the asked `seq` was checkpointed, if it is published.
    pub at_ms: Option<i64>,
}

pub mod sqlite {
    use rusqlite::{params, Connection, OptionalExtension};

    use super::*;

    pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS destinations (
    pipeline TEXT NOT NULL, name TEXT NOT NULL, position INTEGER NOT NULL, pending TEXT,
    stopped TEXT, stopped_ms INTEGER, delivered_ms INTEGER, PRIMARY KEY (pipeline, name));
";

    pub fn place(conn: &Connection, pipeline: &str, name: &str) -> rusqlite::Result<Place> {
        let found = conn
            .query_row(
                "SELECT position, pending, stopped, stopped_ms, delivered_ms FROM destinations
                  WHERE pipeline = ?1 AND name = ?2",
                params![pipeline, name],
                |r| {
                    Ok(Place {
                        position: r.get(0)?,
                        pending: r.get(1)?,
                        stopped: r.get(2)?,
                        stopped_ms: r.get(3)?,
                        delivered_ms: r.get(4)?,
                    })
                },
            )
            .optional()?;
        Ok(found.unwrap_or(Place { position: 1, ..Place::default() }))
    }

    pub fn record(conn: &Connection, pipeline: &str, name: &str, step: &Step) -> rusqlite::Result<()> {
        let now = weir_log::now_ms();
        match step {
            Step::Sending { position, pending } => conn.execute(
                "INSERT INTO destinations (pipeline, name, position, pending) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (pipeline, name) DO UPDATE SET position = excluded.position, pending = excluded.pending",
                params![pipeline, name, position, pending],
            )?,
            Step::Delivered { next } => conn.execute(
                "INSERT INTO destinations (pipeline, name, position, delivered_ms) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (pipeline, name) DO UPDATE
                   SET position = excluded.position, pending = NULL, delivered_ms = excluded.delivered_ms",
                params![pipeline, name, next, now],
            )?,
            Step::Stopped { why } => conn.execute(
                "INSERT INTO destinations (pipeline, name, position, stopped, stopped_ms) VALUES (?1, ?2, 1, ?3, ?4)
                 ON CONFLICT (pipeline, name) DO UPDATE SET stopped = excluded.stopped, stopped_ms = excluded.stopped_ms",
                params![pipeline, name, why, now],
            )?,
        };
        Ok(())
    }

    /// Clears a stop; whether the destination was stopped.
    pub fn resume(conn: &Connection, pipeline: &str, name: &str) -> rusqlite::Result<bool> {
        let n = conn.execute(
            "UPDATE destinations SET stopped = NULL, stopped_ms = NULL
              WHERE pipeline = ?1 AND name = ?2 AND stopped IS NOT NULL",
            params![pipeline, name],
        )?;
        Ok(n > 0)
    }

    /// The published `version` entries from `since`, in order.
    pub fn version_entries(conn: &Connection, pipeline: &str, since: i64, limit: i64) -> rusqlite::Result<Vec<String>> {
        let mut stmt = conn.prepare_cached(
            "SELECT row FROM changes WHERE pipeline = ?1 AND kind = 'version' AND seq >= ?2
               AND seq < coalesce((SELECT from_seq FROM pauses WHERE pipeline = ?1), 9223372036854775807)
             ORDER BY seq LIMIT ?3",
        )?;
        let rows = stmt.query_map(params![pipeline, since, limit], |r| r.get::<_, String>(0))?;
        rows.collect()
    }

    pub fn head(conn: &Connection, pipeline: &str, at: i64) -> rusqlite::Result<Head> {
        let below = "coalesce((SELECT from_seq FROM pauses WHERE pipeline = ?1), 9223372036854775807)";
        let last: Option<i64> = conn.query_row(
            &format!("SELECT max(seq) FROM changes WHERE pipeline = ?1 AND seq < {below}"),
            params![pipeline],
            |r| r.get(0),
        )?;
        let at_ms: Option<Option<i64>> = conn
            .query_row(
                &format!("SELECT at_ms FROM changes WHERE pipeline = ?1 AND seq = ?2 AND seq < {below}"),
                params![pipeline, at],
                |r| r.get(0),
            )
            .optional()?;
        Ok(Head { last: last.unwrap_or(0), at_ms: at_ms.flatten() })
    }

    pub fn ledger_head(conn: &Connection, pipeline: &str, at: i64) -> rusqlite::Result<Head> {
        let last: Option<i64> =
            conn.query_row("SELECT max(seq) FROM ledger WHERE pipeline = ?1", params![pipeline], |r| r.get(0))?;
        let at_ms: Option<i64> = conn
            .query_row("SELECT at_ms FROM ledger WHERE pipeline = ?1 AND seq = ?2", params![pipeline, at], |r| r.get(0))
            .optional()?;
        Ok(Head { last: last.unwrap_or(0), at_ms })
    }
}

pub mod pg {
    use postgres::Client;

    use super::*;

    pub fn schema(schema: &str) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {schema}.destinations (
    pipeline TEXT NOT NULL, name TEXT NOT NULL, position BIGINT NOT NULL, pending TEXT,
    stopped TEXT, stopped_ms BIGINT, delivered_ms BIGINT, PRIMARY KEY (pipeline, name));
"
        )
    }

    pub fn place(client: &mut Client, schema: &str, pipeline: &str, name: &str) -> Result<Place, postgres::Error> {
        let row = client.query_opt(
            &format!(
                "SELECT position, pending, stopped, stopped_ms, delivered_ms FROM {schema}.destinations
                  WHERE pipeline = $1 AND name = $2"
            ),
            &[&pipeline, &name],
        )?;
        Ok(row.map_or(Place { position: 1, ..Place::default() }, |r| Place {
            position: r.get(0),
            pending: r.get(1),
            stopped: r.get(2),
            stopped_ms: r.get(3),
            delivered_ms: r.get(4),
        }))
    }

    pub fn record(
        client: &mut Client,
        schema: &str,
        pipeline: &str,
        name: &str,
        step: &Step,
    ) -> Result<(), postgres::Error> {
        let now = weir_log::now_ms();
        match step {
            Step::Sending { position, pending } => client.execute(
                &format!(
                    "INSERT INTO {schema}.destinations (pipeline, name, position, pending) VALUES ($1, $2, $3, $4)
                     ON CONFLICT (pipeline, name) DO UPDATE SET position = excluded.position, pending = excluded.pending"
                ),
                &[&pipeline, &name, position, pending],
            )?,
            Step::Delivered { next } => client.execute(
                &format!(
                    "INSERT INTO {schema}.destinations (pipeline, name, position, delivered_ms) VALUES ($1, $2, $3, $4)
                     ON CONFLICT (pipeline, name) DO UPDATE
                       SET position = excluded.position, pending = NULL, delivered_ms = excluded.delivered_ms"
                ),
                &[&pipeline, &name, next, &now],
            )?,
            Step::Stopped { why } => client.execute(
                &format!(
                    "INSERT INTO {schema}.destinations (pipeline, name, position, stopped, stopped_ms) VALUES ($1, $2, 1, $3, $4)
                     ON CONFLICT (pipeline, name) DO UPDATE SET stopped = excluded.stopped, stopped_ms = excluded.stopped_ms"
                ),
                &[&pipeline, &name, why, &now],
            )?,
        };
        Ok(())
    }

    /// Clears a stop; whether the destination was stopped.
    pub fn resume(client: &mut Client, schema: &str, pipeline: &str, name: &str) -> Result<bool, postgres::Error> {
        let n = client.execute(
            &format!(
                "UPDATE {schema}.destinations SET stopped = NULL, stopped_ms = NULL
                  WHERE pipeline = $1 AND name = $2 AND stopped IS NOT NULL"
            ),
            &[&pipeline, &name],
        )?;
        Ok(n > 0)
    }

    pub fn version_entries(
        client: &mut Client,
        schema: &str,
        pipeline: &str,
        since: i64,
        limit: i64,
    ) -> Result<Vec<String>, postgres::Error> {
        let below =
            format!("coalesce((SELECT from_seq FROM {schema}.pauses WHERE pipeline = $1), 9223372036854775807)");
        let rows = client.query(
            &format!(
                "SELECT row FROM {schema}.changes WHERE pipeline = $1 AND kind = 'version' AND seq >= $2 AND seq < {below}
                 ORDER BY seq LIMIT $3"
            ),
            &[&pipeline, &since, &limit],
        )?;
        Ok(rows.into_iter().map(|r| r.get(0)).collect())
    }

    pub fn head(client: &mut Client, schema: &str, pipeline: &str, at: i64) -> Result<Head, postgres::Error> {
        let below =
            format!("coalesce((SELECT from_seq FROM {schema}.pauses WHERE pipeline = $1), 9223372036854775807)");
        let last: Option<i64> = client
            .query_one(
                &format!("SELECT max(seq) FROM {schema}.changes WHERE pipeline = $1 AND seq < {below}"),
                &[&pipeline],
            )?
            .get(0);
        let at_ms: Option<i64> = client
            .query_opt(
                &format!("SELECT at_ms FROM {schema}.changes WHERE pipeline = $1 AND seq = $2 AND seq < {below}"),
                &[&pipeline, &at],
            )?
            .map(|r| r.get(0));
        Ok(Head { last: last.unwrap_or(0), at_ms })
    }

    pub fn ledger_head(client: &mut Client, schema: &str, pipeline: &str, at: i64) -> Result<Head, postgres::Error> {
        let last: Option<i64> = client
            .query_one(&format!("SELECT max(seq) FROM {schema}.ledger WHERE pipeline = $1"), &[&pipeline])?
            .get(0);
        let at_ms: Option<i64> = client
            .query_opt(
                &format!("SELECT at_ms FROM {schema}.ledger WHERE pipeline = $1 AND seq = $2"),
                &[&pipeline, &at],
            )?
            .map(|r| r.get(0));
        Ok(Head { last: last.unwrap_or(0), at_ms })
    }
}

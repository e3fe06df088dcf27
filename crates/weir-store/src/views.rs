//! Typed views for BI tools (issue 40): each pipeline version's current
//! rows with the typed columns of a `postgres` destination
//! (`weir_contract::typed_columns`, then `seq`), read out of the rows'
//! JSON, so an analyst writes `SELECT revenue FROM paid_revenue` instead
//! of JSON functions.
//!
//! - `{pipeline}_v{N}`: version N's rows;
//! - `{pipeline}`: the live version's rows, whichever it is now (its
//!   columns are those of every version, null where a version has none).
//!
//! SQLite keeps them in `weir.db` beside weir's tables (a name that is one
//! of weir's own tables is left out, with a log line); it has no roles, so
//! reading them means reading the file. Postgres keeps them in a schema
//! of their own, `{schema}_bi`, which the role `weir_bi` may read and
//! nothing else: it has no privilege on weir's schema (the ledger, raw
//! payloads), and a view reads `results` with its owner's rights.
//!
//! They are made again at every start, after the contract files registered
//! their versions.

use weir_contract::{typed_columns, Column, ColumnSource, Contract, SqlType};

use crate::versions::Version;

/// A version with its typed columns (one whose contract is not stored, or
/// no longer parses, has no view).
struct Typed {
    version: u32,
    columns: Vec<Column>,
}

fn typed(pipeline: &str, stored: &[Version]) -> Vec<Typed> {
    stored
        .iter()
        .filter(|v| !v.contract.is_empty())
        .filter_map(|v| {
            let c = Contract::parse(&format!("{pipeline} version {}", v.version), &v.contract).ok()?;
            Some(Typed { version: v.version, columns: typed_columns(&c.source, &c.aggregates) })
        })
        .collect()
}

/// Every version's columns, each name once (the newest version's type).
fn union(versions: &[Typed]) -> Vec<Column> {
    let mut out: Vec<Column> = Vec::new();
    for v in versions.iter().rev() {
        for c in &v.columns {
            if !out.iter().any(|o| o.name == c.name) {
                out.push(c.clone());
            }
        }
    }
    // Key fields and windows first, as in a version's own order.
    let order = |c: &Column| match c.source {
        ColumnSource::Key(_) => 0,
        ColumnSource::Row("window_start" | "window_end") => 1,
        ColumnSource::Value(_) => 2,
        ColumnSource::Row(_) => 3,
    };
    out.sort_by_key(order);
    out
}

fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The JSON path of a column's value in a row, as (member, member).
fn path(c: &Column) -> (&str, Option<&str>) {
    match &c.source {
        ColumnSource::Key(k) => ("key", Some(k.as_str())),
        ColumnSource::Value(a) => ("values", Some(a.as_str())),
        ColumnSource::Row("as_of") => ("watermark", None),
        ColumnSource::Row(f) => (f, None),
    }
}

pub mod sqlite {
    use rusqlite::Connection;

    use super::*;

    fn expr(c: &Column) -> String {
        let p = match path(c) {
            (outer, Some(inner)) => format!("$.{outer}.\"{}\"", inner.replace('"', "")),
            (outer, None) => format!("$.{outer}"),
        };
        let read = format!("json_extract(row, '{}')", p.replace('\'', "''"));
        match c.sql {
            // A key field is text whatever its JSON type, as in a postgres destination.
            SqlType::Text => format!("CAST({read} AS TEXT)"),
            _ => read,
        }
    }

    fn select(columns: &[Column]) -> String {
        let mut out: Vec<String> = columns.iter().map(|c| format!("{} AS {}", expr(c), ident(&c.name))).collect();
        out.push(format!("json_extract(row, '$.seq') AS {}", ident("seq")));
        out.join(", ")
    }

    /// A table of weir's, or one of the views weir reads its results through.
    fn is_weirs_own(conn: &Connection, name: &str) -> rusqlite::Result<bool> {
        if ["results", "held_results"].contains(&name) {
            return Ok(true);
        }
        conn.prepare("SELECT 1 FROM sqlite_master WHERE name = ?1 AND type != 'view'")?.exists([name])
    }

    fn make(conn: &Connection, name: &str, sql: &str) -> rusqlite::Result<()> {
        if is_weirs_own(conn, name)? {
            eprintln!("weir: no view {name}: weir has a table of that name; read {name}_vN instead");
            return Ok(());
        }
        conn.execute_batch(&format!("DROP VIEW IF EXISTS {0}; CREATE VIEW {0} AS {sql};", ident(name)))
    }

    /// Makes the pipeline's views again, in one transaction.
    pub fn refresh(conn: &Connection, pipeline: &str) -> rusqlite::Result<()> {
        let versions = typed(pipeline, &crate::sqlite::versions(conn, pipeline)?);
        if versions.is_empty() {
            return Ok(());
        }
        let p = pipeline.replace('\'', "''");
        conn.execute_batch("BEGIN IMMEDIATE")?;
        let made = (|| {
            for v in &versions {
                let sql = format!(
                    "SELECT {} FROM results WHERE pipeline = '{p}' AND version = {}",
                    select(&v.columns),
                    v.version
                );
                make(conn, &format!("{pipeline}_v{}", v.version), &sql)?;
            }
            let live = format!(
                "SELECT {} FROM results WHERE pipeline = '{p}'
                   AND version = (SELECT version FROM versions WHERE pipeline = '{p}' AND state = 'live')",
                select(&union(&versions))
            );
            make(conn, pipeline, &live)
        })();
        match made {
            Ok(()) => conn.execute_batch("COMMIT"),
            Err(e) => {
                let _ = conn.execute_batch("ROLLBACK");
                Err(e)
            }
        }
    }
}

pub mod pg {
    use postgres::Client;

    use super::*;

    /// The schema the views live in.
    pub fn schema_of(schema: &str) -> String {
        format!("{schema}_bi")
    }

    /// The role that may read the views and nothing else.
    pub const ROLE: &str = "weir_bi";

    fn expr(c: &Column) -> String {
        let read = match path(c) {
            (outer, Some(inner)) => format!("(j -> '{outer}' ->> '{}')", inner.replace('\'', "''")),
            (outer, None) => format!("(j ->> '{outer}')"),
        };
        match c.sql {
            SqlType::Text => read,
            other => format!("{read}::{}", other.postgres()),
        }
    }

    fn select(columns: &[Column]) -> String {
        let mut out: Vec<String> = columns.iter().map(|c| format!("{} AS {}", expr(c), ident(&c.name))).collect();
        out.push("(j ->> 'seq')::bigint AS seq".into());
        out.join(", ")
    }

    /// Makes the pipeline's views again, and lets `weir_bi` read them, in one transaction.
    pub fn refresh(client: &mut Client, schema: &str, pipeline: &str) -> Result<(), postgres::Error> {
        let mut tx = client.transaction()?;
        tx.execute("SELECT pg_advisory_xact_lock(hashtext('weir bi views'))", &[])?;
        let versions = typed(pipeline, &crate::pg::versions(&mut tx, schema, pipeline)?);
        if versions.is_empty() {
            return tx.commit();
        }
        let bi = schema_of(schema);
        let p = pipeline.replace('\'', "''");
        tx.batch_execute(&format!(
            "DO $$ BEGIN
               IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{ROLE}') THEN
                 CREATE ROLE {ROLE} LOGIN;
               END IF;
             END $$;
             CREATE SCHEMA IF NOT EXISTS {bi};
             GRANT USAGE ON SCHEMA {bi} TO {ROLE};"
        ))?;
        let from = |version: String| {
            format!("(SELECT r.row::jsonb AS j FROM {schema}.results r WHERE r.pipeline = '{p}' AND r.version = {version}) s")
        };
        for v in &versions {
            let name = format!("{bi}.{}", ident(&format!("{pipeline}_v{}", v.version)));
            let sql = format!("SELECT {} FROM {}", select(&v.columns), from(v.version.to_string()));
            tx.batch_execute(&format!("DROP VIEW IF EXISTS {name}; CREATE VIEW {name} AS {sql};"))?;
        }
        let live_version = format!("(SELECT version FROM {schema}.versions WHERE pipeline = '{p}' AND state = 'live')");
        let name = format!("{bi}.{}", ident(pipeline));
        let sql = format!("SELECT {} FROM {}", select(&union(&versions)), from(live_version));
        tx.batch_execute(&format!(
            "DROP VIEW IF EXISTS {name}; CREATE VIEW {name} AS {sql};
             GRANT SELECT ON ALL TABLES IN SCHEMA {bi} TO {ROLE};"
        ))?;
        tx.commit()
    }
}

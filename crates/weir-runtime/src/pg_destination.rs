//! The `postgres` destination (SPEC.md 11): a table in any Postgres (15 or
//! later), created if missing, with typed columns (`weir_contract::
//! typed_columns`: key fields as text, `window_start` and `window_end` as
//! timestamptz, each aggregate with its type, `status`, `revision`,
//! `version`, `events`, `late_events`, `as_of`), then `updated_at` and
//! `seq`, the change that wrote the row.
//!
//! - `mode = "upsert"`: one row per key and `window_start` (a unique index
//!   with `NULLS NOT DISTINCT`, so a global window's null start is one
//!   window). A row is written only if its change's `seq` is greater than
//!   the stored one, so a retried or replayed batch never moves a row back.
//!   At a `version` entry the new live version's rows are written with the
//!   entry's `seq` (page by page), and the last page's transaction deletes
//!   the rows of every other version: the table then holds the live
//!   version's rows only.
//! - `mode = "changes"`: every change appended once, keyed by `seq`
//!   (`ON CONFLICT (seq) DO NOTHING`); a `version` entry is a row with
//!   `status = 'version'` and the version it makes live.
//!
//! The position (the next `seq`) is committed in the same transaction, in
//! `weir_destination_positions` beside the table, and only if it is still
//! where this deliverer found it: a crash at any moment neither loses a
//! change nor applies one twice, and a deliverer that lost its lock to
//! another worker commits nothing.

use std::collections::BTreeMap;

use weir_contract::{typed_columns, Column, ColumnSource, Contract, SqlType, TableMode, TableName};

use crate::destination::{Change, Failure, Target, Work};

pub struct PgTarget {
    client: postgres::Client,
    layout: Layout,
}

/// What the destination's table looks like and whose it is.
struct Layout {
    pipeline: String,
    name: String,
    table: TableName,
    mode: TableMode,
    /// The table's typed columns, in table order.
    columns: Vec<(String, SqlType)>,
    /// The columns of the unique key: the declaring version's key fields, and `window_start`.
    key: Vec<String>,
    contracts: BTreeMap<u32, Contract>,
    declared_by: u32,
}

/// `name` as a quoted SQL identifier.
fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn sql_error(what: &str, e: postgres::Error) -> Failure {
    let detail = e.as_db_error().map(|d| d.message().to_string()).unwrap_or_else(|| e.to_string());
    Failure::Retry(format!("{what}: {detail}"))
}

impl PgTarget {
    /// Connects and makes the table, its key and the positions table if missing.
    pub fn connect(
        url: &str,
        (pipeline, name): (&str, &str),
        (table, mode): (&TableName, TableMode),
        contracts: &BTreeMap<u32, Contract>,
        declared_by: u32,
    ) -> Result<PgTarget, String> {
        let client = weir_store::pg::connect(url)
            .map_err(|e| format!("cannot reach the destination's Postgres ({}): {e}", weir_store::pg::redacted(url)))?;
        let layout = Layout {
            pipeline: pipeline.to_owned(),
            name: name.to_owned(),
            table: table.clone(),
            mode,
            columns: Vec::new(),
            key: Vec::new(),
            contracts: contracts.clone(),
            declared_by,
        };
        let mut target = PgTarget { client, layout };
        target.setup().map_err(|f| match f {
            Failure::Retry(e) | Failure::Refused(e) => e,
        })?;
        Ok(target)
    }

    fn setup(&mut self) -> Result<(), Failure> {
        let version: i32 = self
            .client
            .query_one("SELECT current_setting('server_version_num')::int", &[])
            .map_err(|e| sql_error("cannot read the server's version", e))?
            .get(0);
        if version < 150_000 && self.layout.mode == TableMode::Upsert {
            return Err(Failure::Refused(format!(
                "the destination's Postgres is version {version}; an upsert table needs PostgreSQL 15 or later (its key is NULLS NOT DISTINCT, for global windows)"
            )));
        }
        let declared = self.layout.version_columns(self.layout.declared_by);
        self.layout.key = declared
            .iter()
            .filter(|c| matches!(c.source, ColumnSource::Key(_)) || c.name == "window_start")
            .map(|c| c.name.clone())
            .collect();
        let columns: Vec<String> =
            declared.iter().map(|c| format!("{} {}", ident(&c.name), c.sql.postgres())).collect();
        let table = self.layout.table.quoted();
        let index = match self.layout.mode {
            TableMode::Upsert => format!(
                "CREATE UNIQUE INDEX IF NOT EXISTS {} ON {table} ({}) NULLS NOT DISTINCT;",
                ident(&format!("{}_weir_key", self.layout.table.table)),
                self.layout.key.iter().map(|k| ident(k)).collect::<Vec<_>>().join(", ")
            ),
            TableMode::Changes => {
                format!(
                    "CREATE UNIQUE INDEX IF NOT EXISTS {} ON {table} (seq);",
                    ident(&format!("{}_weir_seq", self.layout.table.table))
                )
            }
        };
        let schema = self
            .layout
            .table
            .schema
            .as_ref()
            .map(|s| format!("CREATE SCHEMA IF NOT EXISTS {};", ident(s)))
            .unwrap_or_default();
        let positions = self.layout.positions();
        let ddl = format!(
            "SELECT pg_advisory_xact_lock(hashtext('weir destination tables'));
             {schema}
             CREATE TABLE IF NOT EXISTS {table} ({}, updated_at timestamptz NOT NULL DEFAULT now(), seq bigint NOT NULL);
             {index}
             CREATE TABLE IF NOT EXISTS {positions} (
                 pipeline text NOT NULL, destination text NOT NULL, position bigint NOT NULL,
                 updated_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (pipeline, destination));",
            columns.join(", ")
        );
        let mut tx = self.client.transaction().map_err(|e| sql_error("cannot begin", e))?;
        tx.batch_execute(&ddl).map_err(|e| sql_error(&format!("cannot make the table {}", self.layout.table), e))?;
        tx.execute(
            &format!(
                "INSERT INTO {positions} (pipeline, destination, position) VALUES ($1, $2, 1) ON CONFLICT DO NOTHING"
            ),
            &[&self.layout.pipeline, &self.layout.name],
        )
        .map_err(|e| sql_error("cannot keep the position", e))?;
        tx.commit().map_err(|e| sql_error("cannot commit the table", e))?;
        self.read_columns()?;
        for v in self.layout.contracts.keys().copied().collect::<Vec<_>>() {
            self.ensure_columns(v)?;
        }
        Ok(())
    }

    /// The typed columns the table has now.
    fn read_columns(&mut self) -> Result<(), Failure> {
        let rows = self
            .client
            .query(
                "SELECT column_name, data_type FROM information_schema.columns
                  WHERE table_schema = coalesce($1, current_schema()) AND table_name = $2 ORDER BY ordinal_position",
                &[&self.layout.table.schema, &self.layout.table.table],
            )
            .map_err(|e| sql_error("cannot read the table's columns", e))?;
        self.layout.columns = rows
            .into_iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
            .filter(|(name, _)| name != "updated_at" && name != "seq")
            .map(|(name, t)| {
                let sql = match t.as_str() {
                    "bigint" | "integer" | "smallint" => SqlType::BigInt,
                    "numeric" | "double precision" | "real" => SqlType::Numeric,
                    "timestamp with time zone" | "timestamp without time zone" => SqlType::Timestamp,
                    _ => SqlType::Text,
                };
                (name, sql)
            })
            .collect();
        Ok(())
    }

    /// Adds the columns a version's rows have that the table lacks.
    fn ensure_columns(&mut self, version: u32) -> Result<(), Failure> {
        let missing: Vec<Column> = self
            .layout
            .version_columns(version)
            .into_iter()
            .filter(|c| !self.layout.columns.iter().any(|(n, _)| n == &c.name))
            .collect();
        for c in &missing {
            let sql = format!(
                "ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}",
                self.layout.table.quoted(),
                ident(&c.name),
                c.sql.postgres()
            );
            self.client.batch_execute(&sql).map_err(|e| sql_error("cannot add a column", e))?;
        }
        if !missing.is_empty() {
            self.read_columns()?;
        }
        Ok(())
    }

    /// Writes `rows` (each with its `seq`, or at least `floor`) in one statement.
    fn write(tx: &mut postgres::Transaction<'_>, target: &Layout, rows: &[&Change], floor: i64) -> Result<(), Failure> {
        if rows.is_empty() {
            return Ok(());
        }
        // One row per key and window in an upsert: the newest change's.
        let mut chosen: Vec<(Vec<Option<String>>, i64)> = Vec::with_capacity(rows.len());
        let mut at: std::collections::HashMap<Vec<Option<String>>, usize> = std::collections::HashMap::new();
        let key_at: Vec<usize> =
            target.key.iter().filter_map(|k| target.columns.iter().position(|(n, _)| n == k)).collect();
        for row in rows {
            let values = target.values(row);
            let seq = row.seq.max(floor);
            if target.mode == TableMode::Changes {
                chosen.push((values, seq));
                continue;
            }
            let key: Vec<Option<String>> = key_at.iter().map(|&i| values[i].clone()).collect();
            match at.get(&key) {
                Some(&i) if chosen[i].1 >= seq => {}
                Some(&i) => chosen[i] = (values, seq),
                None => {
                    at.insert(key, chosen.len());
                    chosen.push((values, seq));
                }
            }
        }
        let n = target.columns.len();
        let mut arrays: Vec<Vec<Option<String>>> = vec![Vec::with_capacity(chosen.len()); n];
        let mut seqs = Vec::with_capacity(chosen.len());
        for (values, seq) in chosen {
            for (i, v) in values.into_iter().enumerate() {
                arrays[i].push(v);
            }
            seqs.push(seq);
        }
        let names: Vec<String> = target.columns.iter().map(|(c, _)| ident(c)).collect();
        let casts: Vec<String> = target
            .columns
            .iter()
            .enumerate()
            .map(|(i, (_, t))| match t {
                SqlType::Text => format!("u.c{i}"),
                other => format!("u.c{i}::{}", other.postgres()),
            })
            .collect();
        let unnest: Vec<String> = (1..=n).map(|i| format!("${i}::text[]")).collect();
        let aliases: Vec<String> = (0..n).map(|i| format!("c{i}")).collect();
        let conflict = match target.mode {
            TableMode::Changes => "ON CONFLICT (seq) DO NOTHING".to_owned(),
            TableMode::Upsert => {
                let sets: Vec<String> = names.iter().map(|c| format!("{c} = EXCLUDED.{c}")).collect();
                format!(
                    "ON CONFLICT ({}) DO UPDATE SET {}, updated_at = EXCLUDED.updated_at, seq = EXCLUDED.seq WHERE {}.seq < EXCLUDED.seq",
                    target.key.iter().map(|k| ident(k)).collect::<Vec<_>>().join(", "),
                    sets.join(", "),
                    target.table.quoted()
                )
            }
        };
        let sql = format!(
            "INSERT INTO {} ({}, updated_at, seq) SELECT {}, now(), u.seq FROM unnest({}, ${}::bigint[]) AS u({}, seq) {conflict}",
            target.table.quoted(),
            names.join(", "),
            casts.join(", "),
            unnest.join(", "),
            n + 1,
            aliases.join(", "),
        );
        let mut params: Vec<&(dyn postgres::types::ToSql + Sync)> = arrays.iter().map(|a| a as _).collect();
        params.push(&seqs);
        tx.execute(&sql, &params).map_err(|e| sql_error(&format!("cannot write to {}", target.table), e))?;
        Ok(())
    }
}

impl Layout {
    fn version_columns(&self, version: u32) -> Vec<Column> {
        let c = self.contracts.get(&version).or_else(|| self.contracts.get(&self.declared_by));
        c.map(|c| typed_columns(&c.source, &c.aggregates)).unwrap_or_default()
    }

    fn positions(&self) -> String {
        match &self.table.schema {
            Some(s) => format!("{}.weir_destination_positions", ident(s)),
            None => "weir_destination_positions".into(),
        }
    }

    /// The text of each table column for `row` (NULL where its version has no such column).
    fn values(&self, row: &Change) -> Vec<Option<String>> {
        let own = self.version_columns(row.version);
        self.columns
            .iter()
            .map(|(name, _)| {
                if row.is_switch() {
                    return match name.as_str() {
                        "status" => Some("version".into()),
                        "version" => Some(row.version.to_string()),
                        _ => None,
                    };
                }
                let source = own.iter().find(|c| &c.name == name).map(|c| &c.source)?;
                let v = match source {
                    ColumnSource::Key(path) => &row.value()["key"][path.as_str()],
                    ColumnSource::Value(agg) => &row.value()["values"][agg.as_str()],
                    ColumnSource::Row("as_of") => &row.value()["watermark"],
                    ColumnSource::Row(field) => &row.value()[*field],
                };
                text_of(v)
            })
            .collect()
    }
}

/// A JSON value as the text Postgres casts: a string's characters, a
/// number's exact digits, a boolean's word; null as NULL.
fn text_of(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::Null => None,
        serde_json::Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

impl Target for PgTarget {
    fn position(&mut self) -> Result<Option<i64>, Failure> {
        let row = self
            .client
            .query_one(
                &format!("SELECT position FROM {} WHERE pipeline = $1 AND destination = $2", self.layout.positions()),
                &[&self.layout.pipeline, &self.layout.name],
            )
            .map_err(|e| sql_error("cannot read the position", e))?;
        Ok(Some(row.get(0)))
    }

    fn deliver(&mut self, work: &Work, from: i64, next: i64) -> Result<(), Failure> {
        let (lines, floor) = match work {
            Work::Changes { taken, .. } => (taken.iter().collect::<Vec<_>>(), 0),
            Work::Switch { rows, entry, .. } => (rows.iter().collect(), entry.seq),
        };
        for v in lines.iter().map(|c| c.version).collect::<std::collections::BTreeSet<_>>() {
            self.ensure_columns(v)?;
        }
        let positions = self.layout.positions();
        let this = &self.layout;
        let mut tx = self.client.transaction().map_err(|e| sql_error("cannot begin", e))?;
        PgTarget::write(&mut tx, this, &lines, floor)?;
        if let Work::Switch { entry, last_page: true, .. } = work {
            if this.mode == TableMode::Upsert {
                tx.execute(
                    &format!("DELETE FROM {} WHERE version IS DISTINCT FROM $1", this.table.quoted()),
                    &[&i64::from(entry.version)],
                )
                .map_err(|e| sql_error("cannot remove the other versions' rows", e))?;
            }
        }
        let moved = tx
            .execute(
                &format!(
                    "UPDATE {positions} SET position = $3, updated_at = now() WHERE pipeline = $1 AND destination = $2 AND position = $4"
                ),
                &[&this.pipeline, &this.name, &next, &from],
            )
            .map_err(|e| sql_error("cannot keep the position", e))?;
        if moved != 1 {
            return Err(Failure::Retry(format!(
                "the position of destination {} is no longer {from} (another deliverer moved it); starting again from the stored one",
                this.name
            )));
        }
        tx.commit().map_err(|e| sql_error("cannot commit", e))
    }
}

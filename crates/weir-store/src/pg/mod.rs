//! Results, the change stream, the ledger and per-partition checkpoints in
//! PostgreSQL, for workers sharing a Kafka topic's partitions.
//!
//! Every table is in one schema (`weir` unless weir.toml's `[postgres]
//! schema` says otherwise), created and migrated by weir (`meta` holds the
//! schema version).
//!
//! | table | holds |
//! |---|---|
//! | `meta` | `schema_version` |
//! | `pipelines` | per pipeline: the next change and ledger `seq` (shared by its versions); its row's lock orders every publishing checkpoint, pause and promote |
//! | `versions` | per pipeline and contract version: its state, contract text and hash, who started and promoted it (SPEC.md 8) |
//! | `generations` | a sequence, never reset: every claim of a partition takes the next value as its fencing generation |
//! | `partitions` | per pipeline, contract version and partition: the fencing `generation`, the worker that holds it and its contract (version and hash), the next Kafka offset to read, the engine header, the last checkpoint time, the last replay applied |
//! | `state_windows` | per partition: the engine's open windows, by their hash, as of the last fold |
//! | `state_window_batches` | per partition: the windows each checkpoint since the last fold changed or dropped, one row per checkpoint, applied over `state_windows` in `seq` order (see `window_batches.rs`) |
//! | `state_ids` | per partition: the ids each checkpoint remembered or forgot, one row per checkpoint in the engine's batch form (`Delta::ids`), deleted once all have expired |
//! | `latest` | the `seq` of the latest row of every key and window, with its revision; the row's text is its change's (`row` holds it only for a row from before version 10 whose change was not found) |
//! | `results` (a view) | `latest` with each row's text: the columns `results` had as a table |
//! | `changes` | every row in commit order (`seq` from 1 per pipeline), with partition, time, run and sources |
//! | `ledger` | every ledger entry in commit order (`seq` from 1 per pipeline), with its checkpoint's time (`at_ms`); `erased` once its payload and detail are erased for retention |
//! | `sinks` | per pipeline and Kafka sink topic: the next `seq` to publish |
//! | `runs` | every time a worker took a partition: contract version and hash, weir's version, the worker |
//! | `pauses` | a paused pipeline: the first change `seq` not published |
//! | `held_latest`, `held_results` (a view) | the same for the windows that changed while paused, moved to `latest` on resume |
//! | `replays` | replays an operator asked for; each partition's holder applies those above its `replayed` |
//! | `annotations` | notes on a pipeline and an event-time range; rows whose window overlaps one carry its id |
//! | `notifications` | every alert notification (firing, resolved) of a pipeline, with its time |
//! | `incidents`, `incident_entries` | incidents and their timelines (`crate::incidents`) |
//!
//! Invariants:
//!
//! - **A checkpoint is one transaction** holding one partition's rows,
//!   ledger entries, changed state and next offset. It first locks the
//!   partition's row and compares its `generation`, contract version and
//!   hash with the ones the worker got when it claimed the partition.
//!   Generations come from one sequence that is never reset (not even when
//!   a contract change removes a pipeline's partitions), so another
//!   worker's claim since then, of any contract, changed it, and a worker
//!   that lost its partition (a zombie) can never commit
//!   ([`CheckpointError::Fenced`]).
//! - **Operator actions are rows, not messages**: a pause is a `pauses` row
//!   written under the lock of the pipeline's `pipelines` row, and every
//!   checkpoint that publishes rows takes that lock first and then reads
//!   it, so rows of every worker past the pause point are held; a resume
//!   moves the held rows to `latest` in the same transaction that removes
//!   the pause. A replay is a `replays` row that every worker reads.
//! - **A row never goes back**: `latest` is updated only by a higher
//!   revision.
//! - **`seq` is the commit order**: the pipeline's counters are taken under
//!   the lock of its `pipelines` row, held to the commit, so a reader paging
//!   `changes` by `seq` never skips a row another worker commits later.

pub mod checkpoints;
pub mod store;

use postgres::{Client, Transaction};
use weir_engine::{Delta, Output, Row, RowFormat};

use crate::checkpoint::{CheckpointError, Scope, State};
use crate::rows::{id_bytes, id_from, sources_json, write_ledger, write_row, GLOBAL_START};
use crate::versions::{hash_text, FileContract, Registration, Switch, SwitchError, Version, VersionState};

/// Version 2 dates ledger entries (`at_ms`) and marks erased payloads;
/// version 3 adds the generation sequence, the claimant's contract on each
/// partition, pauses, held rows, replays and annotations.
/// version 4 keys a pipeline's tables by contract version too and adds
/// `versions` (SPEC.md 8); version 5 gives rows and ledger entries their
/// key's `place` (see `rows::place`), indexed for provenance; version 6
/// has each row name its window's previous row (`previous`, see
/// `sqlite::migrate_8_to_9`) in place of the index of rows by place, and
/// keys `results` and `held_results` by window start before key; version
/// 9 adds `state_window_batches`, which a weir before it would not read;
/// version 10 names each window's latest row by its `seq` in `latest` and
/// `held_latest`, with `results` and `held_results` views of the columns
/// they had as tables (see [`rows_named_by_seq`]).
pub const SCHEMA_VERSION: i64 = 10;

/// Connects to `url` (`postgresql://user@host:port/db` or `host=... user=...`),
/// with TLS as its libpq settings say (see [`crate::pg_tls`]).
pub fn connect(url: &str) -> Result<Client, crate::pg_tls::ConnectError> {
    crate::pg_tls::connect(url)
}

pub use crate::pg_tls::redacted;

fn schema_sql(schema: &str) -> String {
    format!(
        "CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {schema}.meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS {schema}.pipelines (
    name TEXT PRIMARY KEY, version INTEGER NOT NULL, text_hash TEXT NOT NULL,
    next_seq BIGINT NOT NULL DEFAULT 1, next_ledger BIGINT NOT NULL DEFAULT 1);
CREATE SEQUENCE IF NOT EXISTS {schema}.generations;
CREATE TABLE IF NOT EXISTS {schema}.versions (
    pipeline TEXT NOT NULL, version INTEGER NOT NULL, state TEXT NOT NULL, contract_hash TEXT NOT NULL,
    contract TEXT NOT NULL, started_ms BIGINT NOT NULL, started_by TEXT NOT NULL,
    promoted_ms BIGINT, promoted_by TEXT, superseded_ms BIGINT, replaced INTEGER,
    PRIMARY KEY (pipeline, version));
CREATE TABLE IF NOT EXISTS {schema}.partitions (
    pipeline TEXT NOT NULL, partition INTEGER NOT NULL, generation BIGINT NOT NULL, owner TEXT NOT NULL,
    next_offset BIGINT NOT NULL DEFAULT 0, header BYTEA, checkpoint_ms BIGINT,
    version INTEGER NOT NULL DEFAULT 0, text_hash TEXT NOT NULL DEFAULT '', replayed BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (pipeline, version, partition));
CREATE TABLE IF NOT EXISTS {schema}.state_windows (
    pipeline TEXT NOT NULL, version INTEGER NOT NULL DEFAULT 0, partition INTEGER NOT NULL, id BYTEA NOT NULL,
    data BYTEA NOT NULL, PRIMARY KEY (pipeline, version, partition, id));
CREATE TABLE IF NOT EXISTS {schema}.state_window_batches (
    pipeline TEXT NOT NULL, version INTEGER NOT NULL, partition INTEGER NOT NULL, seq BIGSERIAL,
    data BYTEA NOT NULL, PRIMARY KEY (pipeline, version, partition, seq));
CREATE TABLE IF NOT EXISTS {schema}.state_ids (
    pipeline TEXT NOT NULL, version INTEGER NOT NULL DEFAULT 0, partition INTEGER NOT NULL, seq BIGSERIAL,
    max_expires BIGINT NOT NULL, data BYTEA NOT NULL, PRIMARY KEY (pipeline, version, partition, seq));
CREATE TABLE IF NOT EXISTS {schema}.results (
    pipeline TEXT NOT NULL, version INTEGER NOT NULL DEFAULT 0, key BYTEA NOT NULL, window_start BIGINT NOT NULL,
    window_end BIGINT, status TEXT NOT NULL, revision BIGINT NOT NULL, row TEXT NOT NULL,
    PRIMARY KEY (pipeline, version, window_start, key));
CREATE TABLE IF NOT EXISTS {schema}.latest (
    pipeline TEXT NOT NULL, version INTEGER NOT NULL, key BYTEA NOT NULL, window_start BIGINT NOT NULL,
    window_end BIGINT, status TEXT NOT NULL, revision BIGINT NOT NULL, seq BIGINT, row TEXT,
    PRIMARY KEY (pipeline, version, window_start, key));
CREATE TABLE IF NOT EXISTS {schema}.held_latest (
    pipeline TEXT NOT NULL, version INTEGER NOT NULL, key BYTEA NOT NULL, window_start BIGINT NOT NULL,
    window_end BIGINT, status TEXT NOT NULL, revision BIGINT NOT NULL, seq BIGINT, row TEXT,
    PRIMARY KEY (pipeline, version, window_start, key));
CREATE TABLE IF NOT EXISTS {schema}.changes (
    pipeline TEXT NOT NULL, seq BIGINT NOT NULL, partition INTEGER NOT NULL, row TEXT NOT NULL,
    at_ms BIGINT NOT NULL, run BIGINT NOT NULL, sources TEXT NOT NULL,
    version INTEGER NOT NULL DEFAULT 0, kind TEXT NOT NULL DEFAULT 'row', place BIGINT, previous BIGINT,
    PRIMARY KEY (pipeline, seq));
CREATE TABLE IF NOT EXISTS {schema}.ledger (
    pipeline TEXT NOT NULL, seq BIGINT NOT NULL, partition INTEGER NOT NULL, reason TEXT NOT NULL, entry TEXT NOT NULL,
    at_ms BIGINT NOT NULL DEFAULT 0, erased BOOLEAN NOT NULL DEFAULT false, version INTEGER NOT NULL DEFAULT 0,
    place BIGINT, PRIMARY KEY (pipeline, seq));
CREATE TABLE IF NOT EXISTS {schema}.ledger_masked (
    pipeline TEXT PRIMARY KEY, personal TEXT NOT NULL, through_seq BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS {schema}.ledger_raw (
    pipeline TEXT NOT NULL, seq BIGINT NOT NULL, version INTEGER NOT NULL, entry TEXT NOT NULL,
    PRIMARY KEY (pipeline, seq));
CREATE TABLE IF NOT EXISTS {schema}.sinks (
    pipeline TEXT NOT NULL, topic TEXT NOT NULL, next_seq BIGINT NOT NULL, PRIMARY KEY (pipeline, topic));
CREATE TABLE IF NOT EXISTS {schema}.runs (
    id BIGSERIAL PRIMARY KEY, pipeline TEXT NOT NULL, partition INTEGER NOT NULL, version INTEGER NOT NULL,
    text_hash TEXT NOT NULL, weir_version TEXT NOT NULL, worker TEXT NOT NULL, started_ms BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS {schema}.pauses (pipeline TEXT PRIMARY KEY, from_seq BIGINT NOT NULL, at_ms BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS {schema}.held_results (
    pipeline TEXT NOT NULL, version INTEGER NOT NULL DEFAULT 0, key BYTEA NOT NULL, window_start BIGINT NOT NULL,
    window_end BIGINT, status TEXT NOT NULL, revision BIGINT NOT NULL, row TEXT NOT NULL,
    PRIMARY KEY (pipeline, version, window_start, key));
CREATE TABLE IF NOT EXISTS {schema}.replays (
    id BIGSERIAL PRIMARY KEY, pipeline TEXT NOT NULL, from_offset BIGINT, from_time BIGINT, asked_ms BIGINT NOT NULL,
    version INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS {schema}.notifications (
    id BIGSERIAL PRIMARY KEY, pipeline TEXT NOT NULL, at_ms BIGINT NOT NULL, notification TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS notifications_by_pipeline ON {schema}.notifications (pipeline, id);
CREATE TABLE IF NOT EXISTS {schema}.reconciliations (
    id BIGSERIAL PRIMARY KEY, pipeline TEXT NOT NULL, version INTEGER NOT NULL, who TEXT NOT NULL,
    why TEXT NOT NULL, source TEXT NOT NULL, at_ms BIGINT NOT NULL, verdict TEXT NOT NULL, report TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS {schema}.backfills (
    id BIGSERIAL PRIMARY KEY, pipeline TEXT NOT NULL, version INTEGER NOT NULL,
    from_ms BIGINT NOT NULL, to_ms BIGINT NOT NULL, who TEXT NOT NULL, why TEXT NOT NULL, origin TEXT NOT NULL,
    asked_ms BIGINT NOT NULL, state TEXT NOT NULL, claimed_by TEXT, lease_until BIGINT, finished_ms BIGINT,
    run BIGINT, report TEXT, error TEXT);
CREATE TABLE IF NOT EXISTS {schema}.annotations (
    id BIGSERIAL PRIMARY KEY, pipeline TEXT NOT NULL, from_ms BIGINT NOT NULL, to_ms BIGINT NOT NULL,
    note TEXT NOT NULL, who TEXT NOT NULL, at_ms BIGINT NOT NULL);
"
    )
}

/// A schema name is used in SQL text: letters, digits and `_` only.
pub fn check_schema_name(schema: &str) -> Result<(), String> {
    let ok = !schema.is_empty()
        && schema.len() <= 63
        && schema.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !schema.starts_with(|c: char| c.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(format!("{schema:?} is not a schema name weir uses: letters, digits and _, not starting with a digit"))
    }
}

/// Gives the rows and ledger entries stored before places were theirs
/// (the migration to version 5, inside its transaction), in pages of
/// 10,000. A key's fields are read in the order written (`json`, not
/// `jsonb`, keeps it).
fn place_stored(tx: &mut Transaction<'_>, schema: &str) -> Result<(), postgres::Error> {
    for (table, column, only_rows) in [("changes", "row", " AND kind = 'row'"), ("ledger", "entry", "")] {
        let read = format!(
            "SELECT t.pipeline, t.seq, json_typeof(j.value), j.value #>> '{{}}'
               FROM (SELECT pipeline, seq, {column} AS doc FROM {schema}.{table}
                      WHERE (pipeline, seq) > ($1, $2){only_rows} ORDER BY pipeline, seq LIMIT 10000) t
               LEFT JOIN LATERAL json_each(CASE WHEN json_typeof(t.doc::json -> 'key') = 'object'
                                                THEN t.doc::json -> 'key' END) WITH ORDINALITY j ON true
              ORDER BY t.pipeline, t.seq, j.ordinality"
        );
        let set = format!(
            "UPDATE {schema}.{table} t SET place = u.place
               FROM UNNEST($1::TEXT[], $2::BIGINT[], $3::BIGINT[]) AS u(pipeline, seq, place)
              WHERE t.pipeline = u.pipeline AND t.seq = u.seq"
        );
        let mut after = (String::new(), i64::MIN);
        loop {
            let page = tx.query(&read, &[&after.0, &after.1])?;
            let Some(last) = page.last() else { break };
            after = (last.get(0), last.get(1));
            let fields: Vec<(String, i64, Option<String>, Option<String>)> =
                page.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3))).collect();
            let (mut pipelines, mut seqs, mut places) = (Vec::new(), Vec::new(), Vec::new());
            for one in fields.chunk_by(|a, b| (&a.0, a.1) == (&b.0, b.1)) {
                if one[0].2.is_none() {
                    continue;
                }
                let each = one.iter().map(|f| (f.2.as_deref().unwrap_or(""), f.3.as_deref().unwrap_or("")));
                pipelines.push(one[0].0.clone());
                seqs.push(one[0].1);
                places.push(crate::rows::place_of_fields(each));
            }
            tx.execute(&set, &[&pipelines, &seqs, &places])?;
        }
    }
    Ok(())
}

/// Version 7 to 8, done first of all, before the schema's tables are made:
/// the tables are named for what they hold. The incidents (`cases`,
/// `case_entries` and its `case_id`) take the name `incidents`
/// (`incident_entries`, `incident_id`), and the alert notifications, which
/// had it, are `notifications`; their indexes are renamed with them, and
/// the roles' grants go with the tables. Nothing is done once `cases` is gone.
fn rename_incidents(tx: &mut postgres::Transaction<'_>, schema: &str) -> Result<(), postgres::Error> {
    let old: Option<String> = tx.query_one(&format!("SELECT to_regclass('{schema}.cases')::text"), &[])?.get(0);
    if old.is_none() {
        return Ok(());
    }
    tx.batch_execute(&format!(
        "ALTER TABLE IF EXISTS {schema}.incidents RENAME TO notifications;
         ALTER INDEX IF EXISTS {schema}.incidents_by_pipeline RENAME TO notifications_by_pipeline;
         ALTER TABLE {schema}.cases RENAME TO incidents;
         ALTER INDEX IF EXISTS {schema}.cases_by_pipeline RENAME TO incidents_by_pipeline;
         ALTER TABLE IF EXISTS {schema}.case_entries RENAME TO incident_entries;
         ALTER INDEX IF EXISTS {schema}.case_entries_by_case RENAME TO incident_entries_by_incident;
         ALTER TABLE IF EXISTS {schema}.incident_entries RENAME COLUMN case_id TO incident_id;"
    ))
}

/// Creates the schema, or checks that the database's is this build's. Two
/// workers starting together serialize on an advisory lock.
pub fn migrate(client: &mut Client, schema: &str) -> crate::Result<()> {
    check_schema_name(schema).map_err(crate::StoreError::Refused)?;
    let mut tx = client.transaction()?;
    tx.execute("SELECT pg_advisory_xact_lock(hashtext('weir schema ' || $1))", &[&schema])?;
    rename_incidents(&mut tx, schema)?;
    tx.batch_execute(&schema_sql(schema))?;
    tx.batch_execute(&crate::incidents::pg::schema(schema))?;
    tx.batch_execute(&crate::checks::pg::schema(schema))?;
    tx.batch_execute(&crate::drills::pg::schema(schema))?;
    tx.batch_execute(&crate::destinations::pg::schema(schema))?;
    let found = tx.query_opt(&format!("SELECT value FROM {schema}.meta WHERE key = 'schema_version'"), &[])?;
    let fresh = found.is_none();
    let mut version = match found.map(|r| r.get::<_, String>(0)) {
        None => {
            tx.execute(
                &format!("INSERT INTO {schema}.meta (key, value) VALUES ('schema_version', $1)"),
                &[&SCHEMA_VERSION.to_string()],
            )?;
            SCHEMA_VERSION
        }
        Some(v) => v.parse::<i64>().unwrap_or(i64::MAX),
    };
    if version == 1 {
        // Entries from before are dated now: retention counts from here.
        let now = weir_log::now_ms();
        tx.batch_execute(&format!(
            "ALTER TABLE {schema}.ledger ADD COLUMN IF NOT EXISTS at_ms BIGINT NOT NULL DEFAULT {now};
             ALTER TABLE {schema}.ledger ADD COLUMN IF NOT EXISTS erased BOOLEAN NOT NULL DEFAULT false;"
        ))?;
        version = 2;
    }
    if version == 2 {
        // The sequence starts above every generation handed out before it.
        tx.batch_execute(&format!(
            "ALTER TABLE {schema}.partitions ADD COLUMN IF NOT EXISTS version INTEGER NOT NULL DEFAULT 0;
             ALTER TABLE {schema}.partitions ADD COLUMN IF NOT EXISTS text_hash TEXT NOT NULL DEFAULT '';
             ALTER TABLE {schema}.partitions ADD COLUMN IF NOT EXISTS replayed BIGINT NOT NULL DEFAULT 0;
             SELECT setval('{schema}.generations', (SELECT coalesce(max(generation), 0) + 1 FROM {schema}.partitions), false);
             UPDATE {schema}.partitions p SET version = l.version, text_hash = l.text_hash
               FROM {schema}.pipelines l WHERE l.name = p.pipeline;"
        ))?;
        version = 3;
    }
    if version == 3 {
        // Each pipeline's data belongs to the version its registration names.
        let mut sql = String::new();
        for (table, key) in [
            ("partitions", "pipeline, version, partition"),
            ("state_windows", "pipeline, version, partition, id"),
            ("state_ids", "pipeline, version, partition, seq"),
            ("results", "pipeline, version, key, window_start"),
            ("held_results", "pipeline, version, key, window_start"),
            ("changes", ""),
            ("ledger", ""),
            ("replays", ""),
        ] {
            sql.push_str(&format!(
                "ALTER TABLE {schema}.{table} ADD COLUMN IF NOT EXISTS version INTEGER NOT NULL DEFAULT 0;
                 UPDATE {schema}.{table} t SET version = l.version FROM {schema}.pipelines l WHERE l.name = t.pipeline;"
            ));
            if !key.is_empty() {
                sql.push_str(&format!(
                    "ALTER TABLE {schema}.{table} DROP CONSTRAINT IF EXISTS {table}_pkey, ADD PRIMARY KEY ({key});"
                ));
            }
        }
        sql.push_str(&format!(
            "ALTER TABLE {schema}.changes ADD COLUMN IF NOT EXISTS kind TEXT NOT NULL DEFAULT 'row';
             INSERT INTO {schema}.versions (pipeline, version, state, contract_hash, contract, started_ms, started_by)
               SELECT name, version, 'live', text_hash, '', 0, 'a schema from before versions' FROM {schema}.pipelines
             ON CONFLICT DO NOTHING;"
        ));
        tx.batch_execute(&sql)?;
        version = 4;
    }
    if version == 4 {
        // Rows and ledger entries name their key's place (see `rows::place`).
        tx.batch_execute(&format!(
            "ALTER TABLE {schema}.changes ADD COLUMN IF NOT EXISTS place BIGINT;
             ALTER TABLE {schema}.ledger ADD COLUMN IF NOT EXISTS place BIGINT;"
        ))?;
        place_stored(&mut tx, schema)?;
        version = 5;
    }
    if version == 5 {
        // Each row names its key and window's previous row in its version.
        tx.batch_execute(&format!(
            "ALTER TABLE {schema}.changes ADD COLUMN IF NOT EXISTS previous BIGINT;
             UPDATE {schema}.changes c SET previous = p.prev
               FROM (SELECT pipeline, seq, lag(seq) OVER (
                         PARTITION BY pipeline, version, row::jsonb -> 'key', row::jsonb -> 'window_start'
                         ORDER BY seq) AS prev
                       FROM {schema}.changes WHERE kind = 'row') p
              WHERE c.pipeline = p.pipeline AND c.seq = p.seq AND p.prev IS NOT NULL;
             ALTER TABLE {schema}.results DROP CONSTRAINT IF EXISTS results_pkey,
               ADD PRIMARY KEY (pipeline, version, window_start, key);
             ALTER TABLE {schema}.held_results DROP CONSTRAINT IF EXISTS held_results_pkey,
               ADD PRIMARY KEY (pipeline, version, window_start, key);"
        ))?;
        version = 6;
    }
    if version == 6 || fresh {
        // An id batch is a checkpoint's remembered ids, hashes that do not
        // compress: stored as it is, Postgres spends no time compressing it
        // (pglz took 7% of the machine's time in `bench/kafka.sh`). CREATE
        // TABLE says it only from Postgres 16 on.
        tx.batch_execute(&format!("ALTER TABLE {schema}.state_ids ALTER COLUMN data SET STORAGE EXTERNAL;"))?;
        version = version.max(7);
    }
    if version == 7 {
        // The tables were renamed before the schema was made (`rename_incidents`).
        version = 8;
    }
    if version == 8 || fresh {
        // `state_window_batches` was made by the schema; its batches are
        // stored as they are, as id batches are.
        tx.batch_execute(&format!(
            "ALTER TABLE {schema}.state_window_batches ALTER COLUMN data SET STORAGE EXTERNAL;"
        ))?;
        version = version.max(9);
    }
    if version == 9 || fresh {
        rows_named_by_seq(&mut tx, schema)?;
        version = version.max(10);
    }
    if version != SCHEMA_VERSION {
        return Err(crate::StoreError::Refused(format!(
            "the Postgres schema {schema} has weir schema version {version}; this weir reads version {SCHEMA_VERSION}; use the weir release that wrote it, or another [postgres] schema"
        )));
    }
    tx.execute(
        &format!("UPDATE {schema}.meta SET value = $1 WHERE key = 'schema_version'"),
        &[&SCHEMA_VERSION.to_string()],
    )?;
    index_ledger_and_changes(&mut tx, schema)?;
    tx.commit()?;
    Ok(())
}

/// Version 9 to 10, as `sqlite::rows_named_by_seq` (SQLite's version 13):
/// a window's latest row is stored once, in `changes`, and `latest` (and
/// `held_latest` while paused) names it by its `seq`; `results` and
/// `held_results` become views of the same columns. A row whose `seq` has
/// no change of the same text keeps its text. Views already made are left
/// as they are. The typed views of `{schema}_bi` read `results`: they go
/// with the table and are made again at the start (`views.rs`).
fn rows_named_by_seq(tx: &mut Transaction<'_>, schema: &str) -> Result<(), postgres::Error> {
    for (table, named) in [("results", "latest"), ("held_results", "held_latest")] {
        let kind: Option<i8> = tx
            .query_opt(
                "SELECT c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                  WHERE n.nspname = $1 AND c.relname = $2",
                &[&schema, &table],
            )?
            .map(|r| r.get(0));
        if kind != Some(b'r' as i8) {
            continue;
        }
        tx.batch_execute(&format!(
            "INSERT INTO {schema}.{named} (pipeline, version, key, window_start, window_end, status, revision, seq, row)
                 SELECT r.pipeline, r.version, r.key, r.window_start, r.window_end, r.status, r.revision, r.seq,
                        CASE WHEN EXISTS (SELECT 1 FROM {schema}.changes c
                                           WHERE c.pipeline = r.pipeline AND c.seq = r.seq AND c.row = r.row)
                             THEN NULL ELSE r.row END
                   FROM (SELECT *, substring(row from '^\\{{\"seq\":([0-9]+)')::BIGINT AS seq FROM {schema}.{table}) r;
             DROP TABLE {schema}.{table} CASCADE;
             CREATE VIEW {schema}.{table} AS
                 SELECT l.pipeline, l.version, l.key, l.window_start, l.window_end, l.status, l.revision,
                        coalesce(l.row, c.row) AS row
                   FROM {schema}.{named} l LEFT JOIN {schema}.changes c ON c.pipeline = l.pipeline AND c.seq = l.seq;"
        ))?;
    }
    Ok(())
}

/// Creates the indexes of `ledger` and `changes` that are missing and drops
/// those that are no longer used, reading the catalog first: `CREATE INDEX
/// IF NOT EXISTS` locks its table before it looks, and a worker starting
/// while another checkpoints (rows into `changes`, then entries into
/// `ledger`) deadlocked with it and stopped. A current schema takes no lock
/// on either table here.
fn index_ledger_and_changes(tx: &mut Transaction<'_>, schema: &str) -> Result<(), postgres::Error> {
    let present: Vec<String> = tx
        .query("SELECT indexname::TEXT FROM pg_indexes WHERE schemaname = $1", &[&schema])?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let has = |name: &str| present.iter().any(|p| p == name);
    let wanted = [
        ("ledger_unerased", "ledger (pipeline, at_ms) WHERE NOT erased"),
        ("ledger_by_version", "ledger (pipeline, version, reason, seq)"),
        ("changes_by_version", "changes (pipeline, version, seq)"),
        ("ledger_by_place", "ledger (pipeline, version, place) WHERE place IS NOT NULL"),
    ];
    for (name, on) in wanted.into_iter().filter(|(name, _)| !has(name)) {
        tx.batch_execute(&format!("CREATE INDEX IF NOT EXISTS {name} ON {schema}.{on}"))?;
    }
    for name in ["ledger_reason", "changes_by_place"].into_iter().filter(|name| has(name)) {
        tx.batch_execute(&format!("DROP INDEX IF EXISTS {schema}.{name}"))?;
    }
    Ok(())
}

/// Erases the payload and detail of `pipeline`'s ledger entries written
/// before `before_ms` (the entries stay), as [`crate::sqlite::erase_ledger_payloads`]
/// does in SQLite. The entry's text keeps its order: `detail` and `payload`
/// are its last members, and a `,"detail":` with an unescaped quote cannot
/// occur inside an earlier string. Returns how many entries were erased.
pub fn erase_ledger_payloads(
    client: &mut Client,
    schema: &str,
    pipeline: &str,
    before_ms: i64,
) -> Result<u64, postgres::Error> {
    let mut detail = String::new();
    weir_engine::write_str(crate::rows::ERASED_DETAIL, &mut detail);
    let mut tx = client.transaction()?;
    tx.execute(
        &format!(
            "DELETE FROM {schema}.ledger_raw WHERE pipeline = $1 AND seq IN
                 (SELECT seq FROM {schema}.ledger WHERE pipeline = $1 AND NOT erased AND at_ms < $2)"
        ),
        &[&pipeline, &before_ms],
    )?;
    // A masked entry (no `detail`; its members in another order) is rewritten as JSON.
    let erased = tx.execute(
        &format!(
            "UPDATE {schema}.ledger
             SET entry = CASE WHEN strpos(entry, ',\"detail\":') > 0
                 THEN left(entry, strpos(entry, ',\"detail\":') - 1) || ',\"detail\":' || $3 || '}}'
                 ELSE ((entry::jsonb - 'payload') || jsonb_build_object('detail', $4::TEXT))::TEXT END,
                 erased = true
             WHERE pipeline = $1 AND NOT erased AND at_ms < $2"
        ),
        &[&pipeline, &before_ms, &detail, &crate::rows::ERASED_DETAIL],
    )?;
    tx.commit()?;
    Ok(erased)
}

/// Masks `pipeline`'s ledger entries stored whole, as
/// [`crate::sqlite::mask_ledger`] does (Postgres frees the old row
/// versions at its next vacuum). Returns how many entries were masked.
pub fn mask_ledger(
    client: &mut Client,
    schema: &str,
    pipeline: &str,
    privacy: &crate::privacy::Privacy,
) -> Result<usize, postgres::Error> {
    if !privacy.masks() {
        return Ok(0);
    }
    let mut tx = client.transaction()?;
    let fields = privacy.fields_text();
    let after: i64 = tx
        .query_opt(
            &format!("SELECT through_seq FROM {schema}.ledger_masked WHERE pipeline = $1 AND personal = $2"),
            &[&pipeline, &fields],
        )?
        .map_or(i64::MIN, |r| r.get(0));
    let whole = tx.query(
        &format!(
            "SELECT seq, version, entry FROM {schema}.ledger l WHERE pipeline = $1 AND seq > $2 AND NOT erased
               AND NOT EXISTS (SELECT 1 FROM {schema}.ledger_raw r WHERE r.pipeline = l.pipeline AND r.seq = l.seq)"
        ),
        &[&pipeline, &after],
    )?;
    for row in &whole {
        let (seq, version, entry): (i64, i32, String) = (row.get(0), row.get(1), row.get(2));
        tx.execute(
            &format!("INSERT INTO {schema}.ledger_raw (pipeline, seq, version, entry) VALUES ($1, $2, $3, $4)"),
            &[&pipeline, &seq, &version, &entry],
        )?;
        tx.execute(
            &format!("UPDATE {schema}.ledger SET entry = $3 WHERE pipeline = $1 AND seq = $2"),
            &[&pipeline, &seq, &privacy.masked_entry(&entry)],
        )?;
    }
    tx.execute(
        &format!(
            "INSERT INTO {schema}.ledger_masked (pipeline, personal, through_seq)
             VALUES ($1, $2, coalesce((SELECT max(seq) FROM {schema}.ledger WHERE pipeline = $1), -1))
             ON CONFLICT (pipeline) DO UPDATE SET personal = excluded.personal, through_seq = excluded.through_seq"
        ),
        &[&pipeline, &fields],
    )?;
    tx.commit()?;
    Ok(whole.len())
}

/// The roles a DBA grants to people who read the schema directly:
/// `{schema}_reader` reads every table but `ledger_raw`, which only
/// `{schema}_raw_reader` reads (SECURITY.md). Needs the right to create
/// roles; without it the server says so and runs on.
pub fn grant_roles(client: &mut Client, schema: &str) -> Result<(), postgres::Error> {
    let mut tx = client.transaction()?;
    tx.batch_execute(&format!(
        "DO $$ BEGIN
             IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{schema}_reader') THEN CREATE ROLE {schema}_reader NOLOGIN; END IF;
             IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{schema}_raw_reader') THEN CREATE ROLE {schema}_raw_reader NOLOGIN; END IF;
         END $$;
         GRANT USAGE ON SCHEMA {schema} TO {schema}_reader, {schema}_raw_reader;
         GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {schema}_reader;
         REVOKE ALL ON {schema}.ledger_raw FROM PUBLIC, {schema}_reader;
         GRANT SELECT ON {schema}.ledger_raw TO {schema}_raw_reader;"
    ))?;
    tx.commit()
}

/// Drops `schema` and everything in it (`weir demo --postgres` starts afresh).
pub fn drop_schema(client: &mut Client, schema: &str) -> crate::Result<()> {
    check_schema_name(schema).map_err(crate::StoreError::Refused)?;
    client.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))?;
    Ok(())
}

fn version_of(r: &postgres::Row) -> Version {
    Version {
        version: r.get::<_, i32>(0) as u32,
        state: VersionState::parse(r.get(1)),
        contract_hash: r.get(2),
        contract: r.get(3),
        started_ms: r.get(4),
        started_by: r.get(5),
        promoted_ms: r.get(6),
        promoted_by: r.get(7),
        superseded_ms: r.get(8),
        replaced: r.get::<_, Option<i32>>(9).map(|v| v as u32),
    }
}

/// Every stored version of `pipeline`, oldest first.
pub fn versions(
    client: &mut impl postgres::GenericClient,
    schema: &str,
    pipeline: &str,
) -> Result<Vec<Version>, postgres::Error> {
    let rows = client.query(
        &format!(
            "SELECT version, state, contract_hash, contract, started_ms, started_by, promoted_ms, promoted_by,
                    superseded_ms, replaced
             FROM {schema}.versions WHERE pipeline = $1 ORDER BY version"
        ),
        &[&pipeline],
    )?;
    Ok(rows.iter().map(version_of).collect())
}

pub fn live_version(client: &mut Client, schema: &str, pipeline: &str) -> Result<Option<u32>, postgres::Error> {
    let row = client.query_opt(
        &format!("SELECT version FROM {schema}.versions WHERE pipeline = $1 AND state = 'live'"),
        &[&pipeline],
    )?;
    Ok(row.map(|r| r.get::<_, i32>(0) as u32))
}

pub fn version_state(
    client: &mut Client,
    schema: &str,
    pipeline: &str,
    version: u32,
) -> Result<Option<VersionState>, postgres::Error> {
    let row = client.query_opt(
        &format!("SELECT state FROM {schema}.versions WHERE pipeline = $1 AND version = $2"),
        &[&pipeline, &(version as i32)],
    )?;
    Ok(row.map(|r| VersionState::parse(r.get(0))))
}

/// Registers a contract file's version of `pipeline`, as
/// [`crate::sqlite::register_version`] does, under the lock of the
/// pipeline's row (so workers starting together decide one after another).
pub fn register_version(
    client: &mut Client,
    schema: &str,
    pipeline: &str,
    file: FileContract<'_>,
    who: &str,
) -> Result<Registration, postgres::Error> {
    let mut tx = client.transaction()?;
    tx.execute(
        &format!(
            "INSERT INTO {schema}.pipelines (name, version, text_hash) VALUES ($1, 0, '') ON CONFLICT (name) DO NOTHING"
        ),
        &[&pipeline],
    )?;
    tx.query_one(&format!("SELECT 1 FROM {schema}.pipelines WHERE name = $1 FOR UPDATE"), &[&pipeline])?;
    let stored = versions(&mut tx, schema, pipeline)?;
    let decision = crate::versions::register(pipeline, &stored, file);
    let now = weir_log::now_ms();
    let v = file.version as i32;
    match &decision {
        Registration::Known | Registration::Refused(_) => {}
        Registration::Adopt => {
            tx.execute(
                &format!(
                    "UPDATE {schema}.versions SET contract = $3, contract_hash = $4 WHERE pipeline = $1 AND version = $2"
                ),
                &[&pipeline, &v, &file.text, &hash_text(file.hash)],
            )?;
        }
        Registration::New { state, supersedes } => {
            for old in supersedes {
                tx.execute(
                    &format!(
                        "UPDATE {schema}.versions SET state = 'superseded', superseded_ms = $3
                         WHERE pipeline = $1 AND version = $2"
                    ),
                    &[&pipeline, &(*old as i32), &now],
                )?;
            }
            tx.execute(
                &format!(
                    "INSERT INTO {schema}.versions (pipeline, version, state, contract_hash, contract, started_ms, started_by)
                     VALUES ($1, $2, $3, $4, $5, $6, $7)"
                ),
                &[&pipeline, &v, &state.as_str(), &hash_text(file.hash), &file.text, &now, &who],
            )?;
        }
    }
    tx.commit()?;
    Ok(decision)
}

/// A promote (`Some(version)`) or a rollback (`None`), as
/// [`crate::sqlite::switch_version`]: one transaction under the pipeline
/// row's lock, which orders its `version` entry among the checkpoints' rows.
pub fn switch_version(
    client: &mut Client,
    schema: &str,
    pipeline: &str,
    promote: Option<u32>,
    who: &str,
    why: &str,
) -> Result<Result<(Switch, i64), SwitchError>, postgres::Error> {
    let mut tx = client.transaction()?;
    let locked =
        tx.query_opt(&format!("SELECT next_seq FROM {schema}.pipelines WHERE name = $1 FOR UPDATE"), &[&pipeline])?;
    let stored = versions(&mut tx, schema, pipeline)?;
    let decided = match promote {
        Some(v) => crate::versions::promote(pipeline, &stored, v),
        None => crate::versions::rollback(pipeline, &stored),
    };
    let (switch, Some(locked)) = (
        match decided {
            Ok(s) => s,
            Err(e) => return Ok(Err(e)),
        },
        locked,
    ) else {
        return Ok(Err(SwitchError::NoLive { pipeline: pipeline.to_owned() }));
    };
    let seq: i64 = locked.get(0);
    let now = weir_log::now_ms();
    if let Some(from) = switch.from {
        tx.execute(
            &format!(
                "UPDATE {schema}.versions SET state = 'superseded', superseded_ms = $3 WHERE pipeline = $1 AND version = $2"
            ),
            &[&pipeline, &(from as i32), &now],
        )?;
    }
    let replaced = if promote.is_some() { switch.from.map(|v| v as i32) } else { None };
    tx.execute(
        &format!(
            "UPDATE {schema}.versions SET state = 'live', promoted_ms = $3, promoted_by = $4, superseded_ms = NULL,
                    replaced = coalesce($5, replaced)
             WHERE pipeline = $1 AND version = $2"
        ),
        &[&pipeline, &(switch.to as i32), &now, &who, &replaced],
    )?;
    let mut entry = String::new();
    crate::rows::with_seq(&crate::versions::marker(pipeline, switch, now, why, who), seq, &mut entry);
    tx.execute(
        &format!(
            "INSERT INTO {schema}.changes (pipeline, seq, partition, row, at_ms, run, sources, version, kind)
             VALUES ($1, $2, -1, $3, $4, 0, '[]', $5, 'version')"
        ),
        &[&pipeline, &seq, &entry, &now, &(switch.to as i32)],
    )?;
    tx.execute(&format!("UPDATE {schema}.pipelines SET next_seq = next_seq + 1 WHERE name = $1"), &[&pipeline])?;
    tx.commit()?;
    Ok(Ok((switch, seq)))
}

/// Removes one version of a pipeline (a superseded version past its
/// retention): its partitions' checkpoints, rows, change stream entries and ledger.
pub fn forget_version(client: &mut Client, schema: &str, pipeline: &str, version: u32) -> Result<(), postgres::Error> {
    let v = version as i32;
    let mut tx = client.transaction()?;
    for table in [
        "partitions",
        "state_windows",
        "state_window_batches",
        "state_ids",
        "latest",
        "held_latest",
        "ledger",
        "ledger_raw",
        "replays",
        "versions",
    ] {
        tx.execute(&format!("DELETE FROM {schema}.{table} WHERE pipeline = $1 AND version = $2"), &[&pipeline, &v])?;
    }
    tx.execute(
        &format!("DELETE FROM {schema}.changes WHERE pipeline = $1 AND version = $2 AND kind = 'row'"),
        &[&pipeline, &v],
    )?;
    tx.commit()?;
    Ok(())
}

/// What a worker gets when it takes a partition.
#[derive(Debug)]
pub struct Claim {
    /// Its fencing token: a checkpoint commits only while it is current.
    pub generation: i64,
    /// The next offset to read (0 when the partition was never checkpointed).
    pub next_offset: u64,
    /// `None` when the partition was never checkpointed.
    pub checkpoint: Option<State>,
    /// The run its rows carry.
    pub run: i64,
    /// The last replay (`replays.id`) applied to the partition, 0 for none.
    pub replayed: i64,
}

/// Takes a partition for `worker`: gives it the next generation of the
/// sequence (fencing out the previous holder) and reads its last
/// checkpoint. Refused when the pipeline is registered with another
/// contract than `(version, text_hash)`.
pub fn claim(
    client: &mut Client,
    schema: &str,
    pipeline: &str,
    partition: u32,
    worker: &str,
    (version, text_hash): (u32, u64),
) -> crate::Result<Claim> {
    let p = partition as i32;
    let hash = format!("{text_hash:016x}");
    let mut tx = client.transaction()?;
    let v = version as i32;
    let registered = tx.query_opt(
        &format!("SELECT contract_hash FROM {schema}.versions WHERE pipeline = $1 AND version = $2 FOR SHARE"),
        &[&pipeline, &v],
    )?;
    let registered: Option<String> = registered.map(|r| r.get(0));
    if registered.as_ref() != Some(&hash) {
        let now = match registered {
            Some(h) => format!("contract hash {h}"),
            None => "no contract".to_owned(),
        };
        return Err(crate::StoreError::Refused(format!(
            "version {version} of pipeline {pipeline} is registered in Postgres with {now}, not this worker's contract hash {hash}; this worker stops claiming until it runs the registered contract"
        )));
    }
    let row = tx.query_one(
        &format!(
            "INSERT INTO {schema}.partitions (pipeline, partition, generation, owner, version, text_hash)
             VALUES ($1, $2, nextval('{schema}.generations'), $3, $4, $5)
             ON CONFLICT (pipeline, version, partition) DO UPDATE
               SET generation = excluded.generation, owner = excluded.owner, text_hash = excluded.text_hash
             RETURNING generation, next_offset, header, replayed"
        ),
        &[&pipeline, &p, &worker, &v, &hash],
    )?;
    let generation: i64 = row.get(0);
    let next_offset = row.get::<_, i64>(1).max(0) as u64;
    let header: Option<Vec<u8>> = row.get(2);
    let replayed: i64 = row.get(3);
    let checkpoint = match header {
        None => None,
        Some(header) => {
            let windows = tx
                .query(
                    &format!(
                        "SELECT id, data FROM {schema}.state_windows WHERE pipeline = $1 AND version = $3 AND partition = $2"
                    ),
                    &[&pipeline, &p, &v],
                )?
                .into_iter()
                .map(|r| (id_from(r.get::<_, &[u8]>(0)), r.get::<_, Vec<u8>>(1)))
                .collect();
            let batches = window_batches(&mut tx, schema, pipeline, (p, v))?;
            let windows = crate::window_batches::restored(windows, &batches)
                .map_err(|e| crate::StoreError::Refused(format!("partition {partition} of {pipeline}: {e}")))?;
            let id_batches = tx
                .query(
                    &format!(
                        "SELECT data FROM {schema}.state_ids WHERE pipeline = $1 AND version = $3 AND partition = $2 ORDER BY seq"
                    ),
                    &[&pipeline, &p, &v],
                )?
                .into_iter()
                .map(|r| r.get::<_, Vec<u8>>(0))
                .collect();
            Some(State { header, windows, id_batches })
        }
    };
    let run = start_run(&mut tx, schema, pipeline, partition, worker, (version, text_hash))?;
    tx.commit()?;
    Ok(Claim { generation, next_offset, checkpoint, run, replayed })
}

/// Records a run of a partition by `worker` (a claim, a replay); the run's id, which its rows carry.
pub fn start_run(
    client: &mut impl postgres::GenericClient,
    schema: &str,
    pipeline: &str,
    partition: u32,
    worker: &str,
    (version, text_hash): (u32, u64),
) -> Result<i64, postgres::Error> {
    let hash = format!("{text_hash:016x}");
    let row = client.query_one(
        &format!(
            "INSERT INTO {schema}.runs (pipeline, partition, version, text_hash, weir_version, worker, started_ms)
             VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id"
        ),
        &[
            &pipeline,
            &(partition as i32),
            &(version as i32),
            &hash,
            &env!("CARGO_PKG_VERSION"),
            &worker,
            &weir_log::now_ms(),
        ],
    )?;
    Ok(row.get(0))
}

/// One partition's checkpoint.
pub struct PartitionWrite<'a> {
    pub pipeline: &'a str,
    pub partition: u32,
    /// The claim's generation and the worker's contract (version, hash):
    /// the checkpoint commits only while the partition's are these.
    pub generation: i64,
    pub version: u32,
    pub text_hash: u64,
    pub format: &'a RowFormat,
    pub out: &'a Output,
    pub delta: Delta,
    pub next_offset: u64,
    pub now_ms: i64,
    pub run: i64,
    /// A replay starts: the partition's stored windows and ids are dropped
    /// first, and the replay (`replays.id`) is marked applied.
    pub replay: Option<i64>,
    /// The contract's personal fields: ledger entries are stored masked,
    /// the raw entry in `ledger_raw` (see `privacy.rs`).
    pub privacy: &'a crate::privacy::Privacy,
}

/// Writes one partition's checkpoint in one transaction, refused unless the
/// partition's generation, contract version and hash are still the
/// worker's. Rows committed while the pipeline is paused go to the change
/// stream past the pause point and to `held_results`.
pub fn checkpoint(client: &mut Client, schema: &str, w: PartitionWrite<'_>) -> Result<(), CheckpointError> {
    let (p, v) = (w.partition as i32, w.version as i32);
    let hash = format!("{:016x}", w.text_hash);
    let mut tx = client.transaction()?;
    let now: i64 = tx
        .query_opt(
            &format!(
                "SELECT generation FROM {schema}.partitions WHERE pipeline = $1 AND partition = $2
                   AND version = $3 AND text_hash = $4 FOR UPDATE"
            ),
            &[&w.pipeline, &p, &v, &hash],
        )?
        .map_or(0, |r| r.get(0));
    if now != w.generation {
        return Err(CheckpointError::Fenced {
            pipeline: w.pipeline.to_owned(),
            scope: Scope::Partition(w.partition),
            ours: w.generation,
            now,
        });
    }
    let (rows, entries) = (w.out.rows.len() as i64, w.out.ledger.len() as i64);
    let (mut seq, mut lseq) = (0i64, 0i64);
    let mut paused = false;
    if rows > 0 || entries > 0 {
        // Under the pipeline row's lock, which a pause takes too.
        let r = tx.query_one(
            &format!(
                "UPDATE {schema}.pipelines SET next_seq = next_seq + $2, next_ledger = next_ledger + $3 WHERE name = $1
                 RETURNING next_seq - $2, next_ledger - $3"
            ),
            &[&w.pipeline, &rows, &entries],
        )?;
        (seq, lseq) = (r.get(0), r.get(1));
        paused = tx.query_opt(&format!("SELECT 1 FROM {schema}.pauses WHERE pipeline = $1"), &[&w.pipeline])?.is_some();
    }
    if w.replay.is_some() {
        for table in ["state_windows", "state_window_batches", "state_ids"] {
            tx.execute(
                &format!("DELETE FROM {schema}.{table} WHERE pipeline = $1 AND version = $3 AND partition = $2"),
                &[&w.pipeline, &p, &v],
            )?;
        }
    }
    let at = RowsAt {
        pipeline: w.pipeline,
        partition: p,
        version: w.version,
        format: w.format,
        now_ms: w.now_ms,
        run: w.run,
    };
    write_rows(&mut tx, schema, &at, &w.out.rows, seq, paused)?;
    if entries > 0 {
        let (mut seqs, mut reasons, mut texts, mut raws) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut places = Vec::new();
        for entry in &w.out.ledger {
            let mut text = String::new();
            write_ledger(w.format, entry, lseq, w.version, &mut text);
            seqs.push(lseq);
            places.push(entry.key.as_deref().map(crate::rows::place));
            reasons.push(entry.reason.as_str());
            if w.privacy.masks() {
                texts.push(w.privacy.masked_entry(&text));
                raws.push(text);
            } else {
                texts.push(text);
            }
            lseq += 1;
        }
        if !raws.is_empty() {
            tx.execute(
                &format!(
                    "INSERT INTO {schema}.ledger_raw (pipeline, seq, version, entry)
                     SELECT $1, s, $2, e FROM UNNEST($3::BIGINT[], $4::TEXT[]) AS t(s, e)"
                ),
                &[&w.pipeline, &v, &seqs, &raws],
            )?;
        }
        tx.execute(
            &format!(
                "INSERT INTO {schema}.ledger (pipeline, seq, partition, reason, entry, at_ms, version, place)
                 SELECT $1, s, $2, r, e, $6, $7, pl
                   FROM UNNEST($3::BIGINT[], $4::TEXT[], $5::TEXT[], $8::BIGINT[]) AS t(s, r, e, pl)"
            ),
            &[&w.pipeline, &p, &seqs, &reasons, &texts, &w.now_ms, &v, &places],
        )?;
    }
    write_state(&mut tx, schema, &w)?;
    tx.execute(
        &format!(
            "UPDATE {schema}.partitions SET next_offset = $3, header = $4, checkpoint_ms = $5,
                    replayed = greatest(replayed, $6)
             WHERE pipeline = $1 AND partition = $2 AND version = $7"
        ),
        &[&w.pipeline, &p, &(w.next_offset as i64), &w.delta.header, &w.now_ms, &w.replay.unwrap_or(0), &v],
    )?;
    tx.commit()?;
    Ok(())
}

/// Where rows go and what they carry besides themselves (`partition` -1:
/// no partition's, a backfill's).
pub(crate) struct RowsAt<'a> {
    pub pipeline: &'a str,
    pub partition: i32,
    pub version: u32,
    pub format: &'a RowFormat,
    pub now_ms: i64,
    pub run: i64,
}

/// Writes `rows` to the change stream from `first_seq` on and names each
/// window's last one by its `seq` in `latest` (`held_latest` while
/// paused), only over a lower revision. Each row names its window's
/// previous row: an earlier one of these rows, or the one `held_latest`
/// (while paused) or `latest` names.
pub(crate) fn write_rows(
    tx: &mut Transaction<'_>,
    schema: &str,
    w: &RowsAt<'_>,
    rows: &[Row],
    first_seq: i64,
    paused: bool,
) -> Result<(), postgres::Error> {
    if rows.is_empty() {
        return Ok(());
    }
    let (p, v) = (w.partition, w.version as i32);
    let mut seqs = Vec::with_capacity(rows.len());
    let mut texts = Vec::with_capacity(rows.len());
    let mut sources = Vec::with_capacity(rows.len());
    let mut places = Vec::with_capacity(rows.len());
    let (mut earlier, mut keys, mut starts) =
        (Vec::with_capacity(rows.len()), Vec::with_capacity(rows.len()), Vec::with_capacity(rows.len()));
    let mut last: std::collections::HashMap<(&[u8], i64), usize> = std::collections::HashMap::with_capacity(rows.len());
    let (mut one, mut scratch) = (String::new(), String::new());
    for (i, row) in rows.iter().enumerate() {
        let seq = first_seq + i as i64;
        let mut text = String::new();
        write_row(w.format, row, seq, &mut scratch, &mut text);
        sources_json(row, &mut one);
        seqs.push(seq);
        places.push(crate::rows::place(&row.key));
        texts.push(text);
        sources.push(one.clone());
        let start = row.window_start.unwrap_or(GLOBAL_START);
        earlier.push(last.insert((&row.key[..], start), i).map(|e| first_seq + e as i64));
        keys.push(&row.key[..]);
        starts.push(start);
    }
    // A window's first row of the checkpoint: its previous is the stored one.
    let stored = |table: &str| {
        format!(
            "(SELECT coalesce(o.seq, substring(o.row from '^\\{{\"seq\":([0-9]+)')::BIGINT) FROM {schema}.{table} o
               WHERE o.pipeline = $1 AND o.version = $8 AND o.key = k AND o.window_start = ws)"
        )
    };
    let previous = match paused {
        true => format!("coalesce(pv, {}, {})", stored("held_latest"), stored("latest")),
        false => format!("coalesce(pv, {})", stored("latest")),
    };
    tx.execute(
        &format!(
            "INSERT INTO {schema}.changes (pipeline, seq, partition, row, at_ms, run, sources, version, place, previous)
             SELECT $1, s, $2, r, $3, $4, src, $8, pl, {previous}
               FROM UNNEST($5::BIGINT[], $6::TEXT[], $7::TEXT[], $9::BIGINT[], $10::BIGINT[], $11::BYTEA[], $12::BIGINT[])
                 AS t(s, r, src, pl, pv, k, ws)"
        ),
        &[&w.pipeline, &p, &w.now_ms, &w.run, &seqs, &texts, &sources, &v, &places, &earlier, &keys, &starts],
    )?;
    // Only each window's last row of the checkpoint is named in `latest`,
    // and only over a lower revision.
    let mut latest: Vec<usize> = last.into_values().collect();
    latest.sort_unstable();
    let (mut keys, mut starts, mut ends, mut statuses, mut revisions, mut latest_seqs) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in latest {
        let row = &rows[i];
        keys.push(row.key.to_vec());
        starts.push(row.window_start.unwrap_or(GLOBAL_START));
        ends.push(row.window_end);
        statuses.push(row.status.as_str());
        revisions.push(i64::from(row.revision));
        latest_seqs.push(seqs[i]);
    }
    let table = if paused { "held_latest" } else { "latest" };
    tx.execute(
        &format!(
            "INSERT INTO {schema}.{table} (pipeline, version, key, window_start, window_end, status, revision, seq)
             SELECT $1, $8, k, s, e, st, rv, q
               FROM UNNEST($2::BYTEA[], $3::BIGINT[], $4::BIGINT[], $5::TEXT[], $6::BIGINT[], $7::BIGINT[]) AS t(k, s, e, st, rv, q)
             ON CONFLICT (pipeline, version, window_start, key) DO UPDATE
               SET window_end = excluded.window_end, status = excluded.status,
                   revision = excluded.revision, seq = excluded.seq, row = NULL
               WHERE {schema}.{table}.revision < excluded.revision"
        ),
        &[&w.pipeline, &keys, &starts, &ends, &statuses, &revisions, &latest_seqs, &v],
    )?;
    Ok(())
}

/// A partition's pending window batches, in `seq` order.
fn window_batches(
    tx: &mut Transaction<'_>,
    schema: &str,
    pipeline: &str,
    (p, v): (i32, i32),
) -> Result<Vec<(i64, Vec<u8>)>, postgres::Error> {
    let rows = tx.query(
        &format!(
            "SELECT seq, data FROM {schema}.state_window_batches
              WHERE pipeline = $1 AND version = $3 AND partition = $2 ORDER BY seq"
        ),
        &[&pipeline, &p, &v],
    )?;
    Ok(rows.into_iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// Appends a checkpoint's changed windows to `state_window_batches` as one
/// batch and, once enough are pending, folds the oldest into
/// `state_windows` and deletes them (see `window_batches.rs`).
fn write_windows(tx: &mut Transaction<'_>, schema: &str, w: &PartitionWrite<'_>) -> Result<(), CheckpointError> {
    let (p, v) = (w.partition as i32, w.version as i32);
    if w.delta.windows.is_empty() {
        return Ok(());
    }
    let batch = crate::window_batches::encode(&w.delta.windows);
    let r = tx.query_one(
        &format!(
            "SELECT count(*), coalesce(sum(length(data)), 0)::BIGINT FROM {schema}.state_window_batches
              WHERE pipeline = $1 AND version = $3 AND partition = $2"
        ),
        &[&w.pipeline, &p, &v],
    )?;
    tx.execute(
        &format!(
            "INSERT INTO {schema}.state_window_batches (pipeline, version, partition, data) VALUES ($1, $3, $2, $4)"
        ),
        &[&w.pipeline, &p, &v, &batch],
    )?;
    if !crate::window_batches::folds((r.get(0), r.get(1)), batch.len()) {
        return Ok(());
    }
    // Read back: a partition's writer changes at every claim.
    let batches = window_batches(tx, schema, w.pipeline, (p, v))?;
    let mut pending = crate::window_batches::Pending::read(&batches).map_err(|e| {
        CheckpointError::Store(crate::StoreError::Refused(format!("partition {} of {}: {e}", w.partition, w.pipeline)))
    })?;
    let Some(upto) = pending.fold_through() else { return Ok(()) };
    let state = pending.fold(upto);
    let (mut put_ids, mut put_data, mut drop_ids) = (Vec::new(), Vec::new(), Vec::new());
    for (id, data) in &state {
        match data {
            Some(bytes) => {
                put_ids.push(id_bytes(*id).to_vec());
                put_data.push(bytes.as_slice());
            }
            None => drop_ids.push(id_bytes(*id).to_vec()),
        }
    }
    if !put_ids.is_empty() {
        tx.execute(
            &format!(
                "INSERT INTO {schema}.state_windows (pipeline, version, partition, id, data)
                 SELECT $1, $5, $2, i, d FROM UNNEST($3::BYTEA[], $4::BYTEA[]) AS t(i, d)
                 ON CONFLICT (pipeline, version, partition, id) DO UPDATE SET data = excluded.data"
            ),
            &[&w.pipeline, &p, &put_ids, &put_data, &v],
        )?;
    }
    if !drop_ids.is_empty() {
        tx.execute(
            &format!(
                "DELETE FROM {schema}.state_windows WHERE pipeline = $1 AND version = $4 AND partition = $2 AND id = ANY($3::BYTEA[])"
            ),
            &[&w.pipeline, &p, &drop_ids, &v],
        )?;
    }
    tx.execute(
        &format!(
            "DELETE FROM {schema}.state_window_batches WHERE pipeline = $1 AND version = $3 AND partition = $2 AND seq <= $4"
        ),
        &[&w.pipeline, &p, &v, &upto],
    )?;
    Ok(())
}

fn write_state(tx: &mut Transaction<'_>, schema: &str, w: &PartitionWrite<'_>) -> Result<(), CheckpointError> {
    let (p, v) = (w.partition as i32, w.version as i32);
    write_windows(tx, schema, w)?;
    if !w.delta.ids.is_empty() {
        let (data, max_expires) = (&w.delta.ids, w.delta.ids_keep_until);
        tx.execute(
            &format!(
                "INSERT INTO {schema}.state_ids (pipeline, version, partition, max_expires, data) VALUES ($1, $5, $2, $3, $4)"
            ),
            &[&w.pipeline, &p, &max_expires, &data, &v],
        )?;
    }
    tx.execute(
        &format!(
            "DELETE FROM {schema}.state_ids WHERE pipeline = $1 AND version = $4 AND partition = $2 AND max_expires <= $3"
        ),
        &[&w.pipeline, &p, &w.delta.forget_ids_through, &v],
    )?;
    Ok(())
}

/// Filters for `GET .../results`, as [`crate::rows::ResultFilter`].
pub fn results(
    client: &mut Client,
    schema: &str,
    pipeline: &str,
    version: u32,
    f: &crate::rows::ResultFilter,
) -> Result<crate::rows::ResultPage, postgres::Error> {
    let mut sql = format!("SELECT row, window_start, key FROM {schema}.results WHERE pipeline = $1 AND version = $2");
    let mut args: Vec<Box<dyn postgres::types::ToSql + Sync>> =
        vec![Box::new(pipeline.to_owned()), Box::new(version as i32)];
    if let Some(s) = &f.status {
        args.push(Box::new(s.clone()));
        sql.push_str(&format!(" AND status = ${}", args.len()));
    }
    if let Some(from) = f.from_ms {
        args.push(Box::new(from));
        sql.push_str(&format!(" AND window_start >= ${} AND window_start != {GLOBAL_START}", args.len()));
    }
    if let Some(to) = f.to_ms {
        args.push(Box::new(to));
        sql.push_str(&format!(" AND window_start < ${} AND window_start != {GLOBAL_START}", args.len()));
    }
    for (field, value) in &f.key {
        args.push(Box::new(field.clone()));
        let path = args.len();
        args.push(Box::new(value.clone()));
        sql.push_str(&format!(" AND (row::jsonb -> 'key') ->> ${path} = ${}", args.len()));
    }
    if let Some((start, key)) = &f.after {
        args.push(Box::new(*start));
        args.push(Box::new(key.clone()));
        sql.push_str(&format!(" AND (window_start, key) > (${}, ${})", args.len() - 1, args.len()));
    }
    args.push(Box::new(f.limit));
    sql.push_str(&format!(" ORDER BY window_start, key LIMIT ${}", args.len()));
    let params: Vec<&(dyn postgres::types::ToSql + Sync)> = args.iter().map(|a| a.as_ref()).collect();
    let mut page = crate::rows::ResultPage::default();
    for r in client.query(&sql, &params)? {
        page.rows.push(r.get(0));
        page.places.push((r.get(1), r.get(2)));
    }
    page.rows = annotate(client, schema, pipeline, page.rows)?;
    Ok(page)
}

/// `[first start, last end)` of a version's timed windows (see [`crate::Store::result_span`]).
pub fn result_span(
    client: &mut Client,
    schema: &str,
    pipeline: &str,
    version: u32,
) -> Result<Option<(i64, i64)>, postgres::Error> {
    let row = client.query_one(
        &format!(
            "SELECT min(window_start), max(window_end) FROM {schema}.latest
              WHERE pipeline = $1 AND version = $2 AND window_start != {GLOBAL_START} AND window_end IS NOT NULL"
        ),
        &[&pipeline, &(version as i32)],
    )?;
    let (first, last): (Option<i64>, Option<i64>) = (row.get(0), row.get(1));
    Ok(first.zip(last))
}

/// The change stream from `since`, in commit order: every version's rows
/// and the `version` entries, or with `version` that version's rows and the
/// `version` entries (see [`crate::sqlite::changes`]).
pub fn changes(
    client: &mut Client,
    schema: &str,
    pipeline: &str,
    version: Option<u32>,
    since: i64,
    limit: i64,
) -> Result<Vec<String>, postgres::Error> {
    let rows = client.query(
        &format!(
            "SELECT row FROM {schema}.changes WHERE pipeline = $1 AND seq >= $2 AND seq < {}
               AND ($4::INTEGER IS NULL OR version = $4 OR kind = 'version')
             ORDER BY seq LIMIT $3",
            published_below(schema)
        ),
        &[&pipeline, &since, &limit, &version.map(|v| v as i32)],
    )?;
    annotate(client, schema, pipeline, rows.into_iter().map(|r| r.get(0)).collect())
}

/// Entries as stored for everyone (masked where the contract names personal
/// fields), or with `raw` as they arrived (only a raw-reader's read).
#[allow(clippy::too_many_arguments)]
pub fn ledger(
    client: &mut Client,
    schema: &str,
    pipeline: &str,
    version: Option<u32>,
    reason: Option<&str>,
    (since, limit): (i64, i64),
    raw: bool,
) -> Result<Vec<String>, postgres::Error> {
    let entry = if raw {
        format!("coalesce((SELECT r.entry FROM {schema}.ledger_raw r WHERE r.pipeline = l.pipeline AND r.seq = l.seq), l.entry)")
    } else {
        "l.entry".to_owned()
    };
    let rows = client.query(
        &format!(
            "SELECT {entry} FROM {schema}.ledger l WHERE pipeline = $1 AND ($5::INTEGER IS NULL OR version = $5) AND ($2::TEXT IS NULL OR reason = $2)
               AND seq >= $3
             ORDER BY seq LIMIT $4"
        ),
        &[&pipeline, &reason, &since, &limit, &version.map(|v| v as i32)],
    )?;
    Ok(rows.into_iter().map(|r| r.get(0)).collect())
}

/// A version's ledger entries ledgered at `from_ms` or later, after
/// `after_seq`, as stored for everyone: `(seq, at_ms, entry)`.
pub fn ledger_dated(
    client: &mut Client,
    schema: &str,
    pipeline: &str,
    version: u32,
    (from_ms, after_seq, limit): (i64, i64, i64),
) -> Result<Vec<(i64, i64, String)>, postgres::Error> {
    let rows = client.query(
        &format!(
            "SELECT seq, at_ms, entry FROM {schema}.ledger WHERE pipeline = $1 AND version = $2 AND at_ms >= $3 AND seq > $4
             ORDER BY seq LIMIT $5"
        ),
        &[&pipeline, &(version as i32), &from_ms, &after_seq, &limit],
    )?;
    Ok(rows.into_iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect())
}

/// Each partition's next offset, generation and holder for one version, by partition.
pub fn partitions(
    client: &mut Client,
    schema: &str,
    pipeline: &str,
    version: u32,
) -> Result<Vec<(u32, u64, i64, String)>, postgres::Error> {
    let rows = client.query(
        &format!(
            "SELECT partition, next_offset, generation, owner FROM {schema}.partitions WHERE pipeline = $1 AND version = $2
             ORDER BY partition"
        ),
        &[&pipeline, &(version as i32)],
    )?;
    Ok(rows
        .into_iter()
        .map(|r| (r.get::<_, i32>(0) as u32, r.get::<_, i64>(1).max(0) as u64, r.get(2), r.get(3)))
        .collect())
}

/// The next `seq` the older `[sink]` publisher recorded for `topic` (1 if none): a `kafka` destination on that topic goes on from it.
pub fn sink_position(client: &mut Client, schema: &str, pipeline: &str, topic: &str) -> Result<i64, postgres::Error> {
    let row = client.query_opt(
        &format!("SELECT next_seq FROM {schema}.sinks WHERE pipeline = $1 AND topic = $2"),
        &[&pipeline, &topic],
    )?;
    Ok(row.map_or(1, |r| r.get(0)))
}

/// The published row `seq` with where it came from (see
/// [`crate::sqlite::row_origin`]); the run is the worker's claim of the
/// row's partition.
pub fn row_origin(
    client: &mut Client,
    schema: &str,
    pipeline: &str,
    seq: i64,
) -> Result<Option<crate::rows::RowOrigin>, postgres::Error> {
    let Some(found) = client.query_opt(
        &format!(
            "SELECT c.row, c.at_ms, c.sources, r.id, r.version, r.text_hash, r.weir_version, r.started_ms, r.worker, r.partition,
                    c.place, c.previous
               FROM {schema}.changes c LEFT JOIN {schema}.runs r ON r.id = c.run
              WHERE c.pipeline = $1 AND c.seq = $2 AND c.kind = 'row' AND c.seq < {}",
            published_below(schema)
        ),
        &[&pipeline, &seq],
    )?
    else {
        return Ok(None);
    };
    let text: String = found.get(0);
    let row: serde_json::Value = serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
    let sources: String = found.get(2);
    let run = found.get::<_, Option<i64>>(3).map(|id| crate::rows::Run {
        id,
        version: i64::from(found.get::<_, i32>(4)),
        text_hash: found.get(5),
        weir_version: found.get(6),
        started_ms: found.get(7),
        // A backfill's run has no partition: its worker column says which backfill.
        why: match found.get::<_, i32>(9) {
            -1 => found.get(8),
            p => format!("worker {} took partition {p}", found.get::<_, String>(8)),
        },
    });
    // Only the entries of the row's key are read (see `sqlite::row_origin`).
    let at: Option<i64> = found.get(10);
    let of_key = |n: usize| match at {
        Some(_) => format!("place = ${n}"),
        None => format!("${n}::BIGINT IS NULL"),
    };
    let previous = match found.get::<_, Option<i64>>(11) {
        Some(p) => client
            .query_opt(&format!("SELECT row FROM {schema}.changes WHERE pipeline = $1 AND seq = $2"), &[&pipeline, &p])?
            .map(|r| (p, serde_json::from_str(&r.get::<_, String>(0)).unwrap_or(serde_json::Value::Null))),
        None => None,
    };
    let ledgered = client
        .query(
            &format!(
                "SELECT reason, count(*) FROM {schema}.ledger WHERE pipeline = $1
                   AND version = ($2::text::jsonb ->> 'version')::INTEGER AND {}
                   AND (entry::jsonb -> 'key') = ($2::text::jsonb -> 'key')
                   AND (jsonb_typeof($2::text::jsonb -> 'window_start') = 'null'
                        OR (entry::jsonb -> 'window_start') = ($2::text::jsonb -> 'window_start')
                        OR (entry::jsonb -> 'window_start' IS NULL
                            AND entry::jsonb ->> 'event_time' >= $2::text::jsonb ->> 'window_start'
                            AND entry::jsonb ->> 'event_time' < $2::text::jsonb ->> 'window_end'))
                 GROUP BY reason ORDER BY reason",
                of_key(3)
            ),
            &[&pipeline, &text, &at],
        )?
        .into_iter()
        .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1)))
        .collect();
    Ok(Some(crate::rows::RowOrigin {
        row,
        at_ms: Some(found.get(1)),
        sources: serde_json::from_str(&sources).unwrap_or_default(),
        run,
        previous,
        ledgered,
    }))
}

/// The newest `limit` rows of a version, newest first.
pub fn latest_changes(
    client: &mut Client,
    schema: &str,
    pipeline: &str,
    version: u32,
    limit: i64,
) -> Result<Vec<String>, postgres::Error> {
    let rows = latest(
        client,
        &format!("SELECT row FROM {schema}.changes WHERE seq < {} AND kind = 'row' AND", published_below(schema)),
        (pipeline, version),
        limit,
    )?;
    annotate(client, schema, pipeline, rows)
}

/// The newest `limit` ledger entries of a version, newest first.
pub fn latest_ledger(
    client: &mut Client,
    schema: &str,
    pipeline: &str,
    version: u32,
    limit: i64,
) -> Result<Vec<String>, postgres::Error> {
    latest(client, &format!("SELECT entry FROM {schema}.ledger WHERE"), (pipeline, version), limit)
}

fn latest(
    client: &mut Client,
    select: &str,
    (pipeline, version): (&str, u32),
    limit: i64,
) -> Result<Vec<String>, postgres::Error> {
    let rows = client.query(
        &format!("{select} pipeline = $1 AND version = $3 ORDER BY seq DESC LIMIT $2"),
        &[&pipeline, &limit, &(version as i32)],
    )?;
    Ok(rows.into_iter().map(|r| r.get(0)).collect())
}

/// The first change `seq` readers may not see yet: a pause's point, else
/// none (SQL, with the pipeline as `$1`).
fn published_below(schema: &str) -> String {
    format!("coalesce((SELECT from_seq FROM {schema}.pauses WHERE pipeline = $1), 9223372036854775807)")
}

/// Pauses publishing: rows any worker commits from now on are held until
/// [`resume`]. Returns whether it was paused already.
pub fn pause(client: &mut Client, schema: &str, pipeline: &str) -> Result<bool, postgres::Error> {
    let mut tx = client.transaction()?;
    // The pipeline row's lock orders the pause with every checkpoint that publishes.
    let next = tx
        .query_opt(&format!("SELECT next_seq FROM {schema}.pipelines WHERE name = $1 FOR UPDATE"), &[&pipeline])?
        .map_or(1, |r| r.get::<_, i64>(0));
    let added = tx.execute(
        &format!("INSERT INTO {schema}.pauses (pipeline, from_seq, at_ms) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING"),
        &[&pipeline, &next, &weir_log::now_ms()],
    )?;
    tx.commit()?;
    Ok(added == 0)
}

/// Resumes publishing: the held rows reach `results` (over lower revisions
/// only) and the change stream past the pause point becomes readable, in
/// one transaction. Returns whether it was paused.
pub fn resume(client: &mut Client, schema: &str, pipeline: &str) -> Result<bool, postgres::Error> {
    let mut tx = client.transaction()?;
    tx.query_opt(&format!("SELECT 1 FROM {schema}.pipelines WHERE name = $1 FOR UPDATE"), &[&pipeline])?;
    let removed = tx.execute(&format!("DELETE FROM {schema}.pauses WHERE pipeline = $1"), &[&pipeline])?;
    if removed > 0 {
        tx.execute(
            &format!(
                "INSERT INTO {schema}.latest (pipeline, version, key, window_start, window_end, status, revision, seq, row)
                 SELECT pipeline, version, key, window_start, window_end, status, revision, seq, row
                   FROM {schema}.held_latest
                  WHERE pipeline = $1
                 ON CONFLICT (pipeline, version, window_start, key) DO UPDATE
                   SET window_end = excluded.window_end, status = excluded.status,
                       revision = excluded.revision, seq = excluded.seq, row = excluded.row
                   WHERE {schema}.latest.revision < excluded.revision"
            ),
            &[&pipeline],
        )?;
        tx.execute(&format!("DELETE FROM {schema}.held_latest WHERE pipeline = $1"), &[&pipeline])?;
    }
    tx.commit()?;
    Ok(removed > 0)
}

pub fn is_paused(client: &mut Client, schema: &str, pipeline: &str) -> Result<bool, postgres::Error> {
    Ok(client.query_opt(&format!("SELECT 1 FROM {schema}.pauses WHERE pipeline = $1"), &[&pipeline])?.is_some())
}

/// Asks every worker of a version of the pipeline to replay; returns the replay's id.
pub fn ask_replay(
    client: &mut Client,
    schema: &str,
    pipeline: &str,
    version: u32,
    replay: crate::Replay,
) -> Result<i64, postgres::Error> {
    let from_offset = replay.from_offset.map(|o| o.min(i64::MAX as u64) as i64);
    Ok(client
        .query_one(
            &format!(
                "INSERT INTO {schema}.replays (pipeline, version, from_offset, from_time, asked_ms)
                 VALUES ($1, $5, $2, $3, $4) RETURNING id"
            ),
            &[&pipeline, &from_offset, &replay.from_time, &weir_log::now_ms(), &(version as i32)],
        )?
        .get(0))
}

/// The newest replay asked of the pipeline's `version`, with its id.
pub fn last_replay(
    client: &mut Client,
    schema: &str,
    pipeline: &str,
    version: u32,
) -> Result<Option<(i64, crate::Replay)>, postgres::Error> {
    let row = client.query_opt(
        &format!(
            "SELECT id, from_offset, from_time FROM {schema}.replays WHERE pipeline = $1 AND version = $2
             ORDER BY id DESC LIMIT 1"
        ),
        &[&pipeline, &(version as i32)],
    )?;
    Ok(row.map(|r| {
        let replay =
            crate::Replay { from_offset: r.get::<_, Option<i64>>(1).map(|o| o.max(0) as u64), from_time: r.get(2) };
        (r.get(0), replay)
    }))
}

/// The highest revision a version has published (or holds while paused).
pub fn max_revision(client: &mut Client, schema: &str, pipeline: &str, version: u32) -> Result<u32, postgres::Error> {
    let v: i64 = client
        .query_one(
            &format!(
                "SELECT greatest(coalesce((SELECT max(revision) FROM {schema}.latest WHERE pipeline = $1 AND version = $2), 0),
                                 coalesce((SELECT max(revision) FROM {schema}.held_latest WHERE pipeline = $1 AND version = $2), 0))"
            ),
            &[&pipeline, &(version as i32)],
        )?
        .get(0);
    Ok(v.clamp(0, i64::from(u32::MAX)) as u32)
}

pub fn add_annotation(
    client: &mut Client,
    schema: &str,
    pipeline: &str,
    (from_ms, to_ms): (i64, i64),
    note: &str,
    who: &str,
) -> Result<i64, postgres::Error> {
    Ok(client
        .query_one(
            &format!(
                "INSERT INTO {schema}.annotations (pipeline, from_ms, to_ms, note, who, at_ms)
                 VALUES ($1, $2, $3, $4, $5, $6) RETURNING id"
            ),
            &[&pipeline, &from_ms, &to_ms, &note, &who, &weir_log::now_ms()],
        )?
        .get(0))
}

pub fn annotations(
    client: &mut Client,
    schema: &str,
    pipeline: &str,
) -> Result<Vec<crate::rows::Annotation>, postgres::Error> {
    let rows = client.query(
        &format!(
            "SELECT id, from_ms, to_ms, note, who, at_ms FROM {schema}.annotations WHERE pipeline = $1 ORDER BY id"
        ),
        &[&pipeline],
    )?;
    Ok(rows
        .into_iter()
        .map(|r| crate::rows::Annotation {
            id: r.get(0),
            from_ms: r.get(1),
            to_ms: r.get(2),
            note: r.get(3),
            who: r.get(4),
            at_ms: r.get(5),
        })
        .collect())
}

/// Keeps an alert notification of `pipeline`, as [`crate::sqlite::record_incident`].
pub fn record_notification(
    client: &mut Client,
    schema: &str,
    pipeline: &str,
    at_ms: i64,
    notification: &str,
) -> Result<i64, postgres::Error> {
    let row = client.query_one(
        &format!("INSERT INTO {schema}.notifications (pipeline, at_ms, notification) VALUES ($1, $2, $3) RETURNING id"),
        &[&pipeline, &at_ms, &notification],
    )?;
    Ok(row.get(0))
}

/// The newest alert notifications of `pipeline`, newest first.
pub fn notifications(
    client: &mut Client,
    schema: &str,
    pipeline: &str,
    limit: i64,
) -> Result<Vec<crate::rows::Notification>, postgres::Error> {
    let rows = client.query(
        &format!(
            "SELECT at_ms, notification FROM {schema}.notifications WHERE pipeline = $1 ORDER BY id DESC LIMIT $2"
        ),
        &[&pipeline, &limit],
    )?;
    Ok(rows.into_iter().map(|r| crate::rows::Notification { at_ms: r.get(0), notification: r.get(1) }).collect())
}

/// `rows` with the ids of the annotations their windows overlap.
fn annotate(
    client: &mut Client,
    schema: &str,
    pipeline: &str,
    rows: Vec<String>,
) -> Result<Vec<String>, postgres::Error> {
    if rows.is_empty() {
        return Ok(rows);
    }
    let notes = annotations(client, schema, pipeline)?;
    Ok(crate::rows::with_annotations(&notes, rows))
}

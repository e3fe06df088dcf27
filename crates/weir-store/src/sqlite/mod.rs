//! Results, the change stream, the ledger and checkpoints in one SQLite
//! database (`DATA/weir.db`, WAL mode, `synchronous = FULL`), so a user can
//! open it with `sqlite3`.
//!
//! Invariant: a checkpoint ([`checkpoint`]) is one transaction
//! holding the rows and ledger entries a pipeline emitted since the last
//! one, the engine's changed state, and the log offsets it consumed. After
//! any crash the database holds some checkpoint whole, never a part.
//!
//! Schema version 13 (older ones are migrated in place: version 1's
//! `changes` gains `at_ms`, `run` and `sources`, and `runs` is created;
//! version 2's `audit` gains `origin` and its hash chain, and `tokens` is
//! created; version 3's `ledger` gains `at_ms` and `erased`, its entries
//! dated at the migration; version 4's `pipelines` gains `replayed`;
//! version 5's tables are keyed by contract version too, see `migrate_5_to_6`;
//! version 6's `audit` gains `key_id`; version 7's `changes` and `ledger`
//! gain `place`; version 8's `changes` gains `previous`, computed for every
//! row stored, and loses the index `changes_by_place`, and its `results` and
//! `held_results` are keyed by window start before key; version 12's
//! `results` and `held_results` become `latest` and `held_latest`, each
//! row named by its change's `seq`, with views of the old names and
//! columns, see `rows_named_by_seq`):
//!
//! | table | holds |
//! |---|---|
//! | `meta` | `schema_version`; `audit_key_file` and `audit_key_id` when the audit log is keyed |
//! | `versions` | per pipeline and contract version: its state (`candidate`, `live`, `superseded`), contract text and hash, who started and promoted it and when, the version it replaced (SPEC.md 8, see `versions.rs`) |
//! | `streams` | per pipeline: the next change and ledger `seq`, shared by its versions |
//! | `pipelines` | per pipeline and version: contract hash, engine header, last checkpoint time, the last replay applied |
//! | `offsets` | per pipeline, version and partition: the next log offset to read |
//! | `state_windows` | the engine's open windows, by their hash, as of the last fold |
//! | `state_window_batches` | the windows each checkpoint changed or dropped, one row per checkpoint; those past the last fold are applied over `state_windows` in `seq` order (see `window_batches.rs`), those folded are deleted a few a checkpoint |
//! | `state_window_folds` | per pipeline and version: the last window batch `seq` folded into `state_windows` |
//! | `state_id_batches` | the ids each checkpoint remembered (or forgot, by a correction), one row per checkpoint in the engine's batch form (`Delta::ids`; 44 bytes an id without corrections), deleted once all have expired |
//! | `latest` | per version: the `seq` of the latest row of every window and key, in that order (so the windows a checkpoint changes sit side by side, new windows at the end); the row's text is its change's (`row` holds it only for a row from before version 13 whose change was not found) |
//! | `results` (a view) | `latest` with each row's text: the columns `results` had as a table, read by `/results`, the typed views and anyone's SQL |
//! | `changes` | every row of every version in emission order (`seq` from 1 per pipeline), with its version, the checkpoint's time, the run that made it, its sources (`[[partition, first offset, last offset, events], ...]`), its key's `place` (see [`place`]) and `previous`, the `seq` of the row its key and window had before it (none for a window's first); and the `version` entries of promotes and rollbacks (`kind = 'version'`) |
//! | `runs` | every start of a pipeline (at server start, after a failure, at a replay): contract version and hash, weir's version |
//! | `ledger` | every ledger entry in order (`seq` from 1), with its checkpoint's time and its key's `place`; `erased` once its payload and detail are erased for retention ([`erase_ledger_payloads`]) |
//! | `ledger_raw` | where the contract names personal fields: each ledger entry whole (the `ledger` row is masked); read only for a raw-reader (see `privacy.rs`) |
//! | `pauses` | a paused pipeline: the first change `seq` not published (written by the operator's action; every checkpoint reads it) |
//! | `replays` | replays an operator asked for; the pipeline applies those above its `replayed` |
//! | `held_latest`, `held_results` (a view) | the same for the windows that changed while paused, moved to `latest` on resume |
//! | `annotations` | notes on a pipeline and an event-time range; rows whose window overlaps one carry its id |
//! | `reconciliations` | reconciliations against a system of record: who, why, the export, the verdict and the report (added without a version change) |
//! | `backfills` | backfill runs (SPEC.md 9): range, who and why, state, the worker holding it and until when, its run and report (see `backfill.rs`; added without a version change: older builds ignore it) |
//! | `sinks` | per pipeline and Kafka sink topic: the next `seq` to publish (table added without a version change: older builds ignore it) |
//! | `audit` | token changes, operator actions, contract changes, replays and raw reads: who, when, what, why, from where; each entry's `hash` chains it to the one before, with the key `key_id` names if any (append-only: triggers refuse updates and deletes; see `audit.rs`) |
//! | `tokens` | bearer tokens: id, role, what they name, expiry, revocation, and the SHA-256 of the secret (see `tokens.rs`) |

pub mod checkpoints;
pub mod store;

use std::path::Path;

/// A connection to `weir.db`, as [`open`] and [`open_read_only`] give it.
pub use rusqlite::Connection;
use rusqlite::{params, OptionalExtension};
use weir_engine::{Delta, Output, Row, RowFormat};

use crate::rows::{
    id_bytes, id_from, place_of_fields, seq_of, sources_json, with_annotations, with_seq, write_ledger, write_row,
    GLOBAL_START,
};
use crate::rows::{place, Annotation, Notification, ResultFilter, ResultPage, RowOrigin, Run, ERASED_DETAIL};
use crate::versions::{hash_text, FileContract, Registration, Switch, SwitchError, Version, VersionState};
use crate::window_batches::Pending;

pub const SCHEMA_VERSION: i64 = 13;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS pipelines (
    name TEXT NOT NULL, version INTEGER NOT NULL, text_hash TEXT NOT NULL, header BLOB NOT NULL,
    checkpoint_ms INTEGER NOT NULL, replayed INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (name, version));
CREATE TABLE IF NOT EXISTS streams (
    pipeline TEXT PRIMARY KEY, next_seq INTEGER NOT NULL, next_ledger INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS versions (
    pipeline TEXT NOT NULL, version INTEGER NOT NULL, state TEXT NOT NULL, contract_hash TEXT NOT NULL,
    contract TEXT NOT NULL, started_ms INTEGER NOT NULL, started_by TEXT NOT NULL,
    promoted_ms INTEGER, promoted_by TEXT, superseded_ms INTEGER, replaced INTEGER,
    PRIMARY KEY (pipeline, version));
CREATE TABLE IF NOT EXISTS offsets (
    pipeline TEXT NOT NULL, version INTEGER NOT NULL, partition INTEGER NOT NULL, next_offset INTEGER NOT NULL,
    PRIMARY KEY (pipeline, version, partition));
CREATE TABLE IF NOT EXISTS state_windows (
    pipeline TEXT NOT NULL, version INTEGER NOT NULL, id BLOB NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (pipeline, version, id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS state_window_batches (
    pipeline TEXT NOT NULL, version INTEGER NOT NULL, seq INTEGER NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (pipeline, version, seq));
CREATE TABLE IF NOT EXISTS state_window_folds (
    pipeline TEXT NOT NULL, version INTEGER NOT NULL, through INTEGER NOT NULL, PRIMARY KEY (pipeline, version));
CREATE TABLE IF NOT EXISTS state_id_batches (
    pipeline TEXT NOT NULL, version INTEGER NOT NULL, seq INTEGER NOT NULL, max_expires INTEGER NOT NULL,
    data BLOB NOT NULL, PRIMARY KEY (pipeline, version, seq));
-- `results` and `held_results` as tables, for the migrations from before
-- version 13, which make them views (a view of the name keeps these out).
CREATE TABLE IF NOT EXISTS results (
    pipeline TEXT NOT NULL, version INTEGER NOT NULL, key BLOB NOT NULL, window_start INTEGER NOT NULL,
    window_end INTEGER, status TEXT NOT NULL, revision INTEGER NOT NULL, row TEXT NOT NULL,
    PRIMARY KEY (pipeline, version, window_start, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS latest (
    pipeline TEXT NOT NULL, version INTEGER NOT NULL, key BLOB NOT NULL, window_start INTEGER NOT NULL,
    window_end INTEGER, status TEXT NOT NULL, revision INTEGER NOT NULL, seq INTEGER, row TEXT,
    PRIMARY KEY (pipeline, version, window_start, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS changes (
    pipeline TEXT NOT NULL, seq INTEGER NOT NULL, row TEXT NOT NULL,
    at_ms INTEGER, run INTEGER, sources TEXT, version INTEGER NOT NULL DEFAULT 0, kind TEXT NOT NULL DEFAULT 'row',
    place INTEGER, previous INTEGER, PRIMARY KEY (pipeline, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT, pipeline TEXT NOT NULL, version INTEGER NOT NULL,
    text_hash TEXT NOT NULL, weir_version TEXT NOT NULL, started_ms INTEGER NOT NULL, why TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS ledger (
    pipeline TEXT NOT NULL, seq INTEGER NOT NULL, reason TEXT NOT NULL, entry TEXT NOT NULL,
    at_ms INTEGER NOT NULL DEFAULT 0, erased INTEGER NOT NULL DEFAULT 0, version INTEGER NOT NULL DEFAULT 0,
    place INTEGER, PRIMARY KEY (pipeline, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS pauses (pipeline TEXT PRIMARY KEY, from_seq INTEGER NOT NULL, at_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS held_results (
    pipeline TEXT NOT NULL, version INTEGER NOT NULL, key BLOB NOT NULL, window_start INTEGER NOT NULL,
    window_end INTEGER, status TEXT NOT NULL, revision INTEGER NOT NULL, row TEXT NOT NULL,
    PRIMARY KEY (pipeline, version, window_start, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS held_latest (
    pipeline TEXT NOT NULL, version INTEGER NOT NULL, key BLOB NOT NULL, window_start INTEGER NOT NULL,
    window_end INTEGER, status TEXT NOT NULL, revision INTEGER NOT NULL, seq INTEGER, row TEXT,
    PRIMARY KEY (pipeline, version, window_start, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS annotations (
    id INTEGER PRIMARY KEY AUTOINCREMENT, pipeline TEXT NOT NULL, from_ms INTEGER NOT NULL, to_ms INTEGER NOT NULL,
    note TEXT NOT NULL, who TEXT NOT NULL, at_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS audit (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, at_ms INTEGER NOT NULL, who TEXT NOT NULL, action TEXT NOT NULL,
    pipeline TEXT, detail TEXT NOT NULL, why TEXT NOT NULL,
    origin TEXT NOT NULL DEFAULT '', prev_hash TEXT NOT NULL DEFAULT '', hash TEXT NOT NULL DEFAULT '',
    key_id TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS replays (
    id INTEGER PRIMARY KEY AUTOINCREMENT, pipeline TEXT NOT NULL, from_offset INTEGER, from_time INTEGER,
    asked_ms INTEGER NOT NULL, version INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS sinks (pipeline TEXT NOT NULL, topic TEXT NOT NULL, next_seq INTEGER NOT NULL,
    PRIMARY KEY (pipeline, topic));
CREATE TABLE IF NOT EXISTS notifications (
    id INTEGER PRIMARY KEY AUTOINCREMENT, pipeline TEXT NOT NULL, at_ms INTEGER NOT NULL,
    notification TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS notifications_by_pipeline ON notifications (pipeline, id);
CREATE TABLE IF NOT EXISTS reconciliations (
    id INTEGER PRIMARY KEY AUTOINCREMENT, pipeline TEXT NOT NULL, version INTEGER NOT NULL, who TEXT NOT NULL,
    why TEXT NOT NULL, source TEXT NOT NULL, at_ms INTEGER NOT NULL, verdict TEXT NOT NULL, report TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS backfills (
    id INTEGER PRIMARY KEY AUTOINCREMENT, pipeline TEXT NOT NULL, version INTEGER NOT NULL,
    from_ms INTEGER NOT NULL, to_ms INTEGER NOT NULL, who TEXT NOT NULL, why TEXT NOT NULL, origin TEXT NOT NULL,
    asked_ms INTEGER NOT NULL, state TEXT NOT NULL, claimed_by TEXT, lease_until INTEGER, finished_ms INTEGER,
    run INTEGER, report TEXT, error TEXT);
CREATE TABLE IF NOT EXISTS ledger_masked (
    pipeline TEXT PRIMARY KEY, personal TEXT NOT NULL, through_seq INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS ledger_raw (
    pipeline TEXT NOT NULL, seq INTEGER NOT NULL, version INTEGER NOT NULL, entry TEXT NOT NULL,
    PRIMARY KEY (pipeline, seq));
CREATE TRIGGER IF NOT EXISTS audit_append_only_update BEFORE UPDATE ON audit
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
CREATE TRIGGER IF NOT EXISTS audit_append_only_delete BEFORE DELETE ON audit
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
";

/// Indexes on columns that versions 6 and 8 added (created once the migration ran).
/// `changes_by_place` (version 8) is gone: each row names its previous one.
const INDEXES: &str = "
CREATE INDEX IF NOT EXISTS ledger_unerased ON ledger (pipeline, at_ms) WHERE erased = 0;
DROP INDEX IF EXISTS ledger_reason;
CREATE INDEX IF NOT EXISTS ledger_by_version ON ledger (pipeline, version, reason, seq);
CREATE INDEX IF NOT EXISTS changes_by_version ON changes (pipeline, version, seq);
DROP INDEX IF EXISTS changes_by_place;
CREATE INDEX IF NOT EXISTS ledger_by_place ON ledger (pipeline, version, place) WHERE place IS NOT NULL;
CREATE INDEX IF NOT EXISTS state_id_batches_by_expiry ON state_id_batches (pipeline, version, max_expires);
";

/// Version 5 to 6: a pipeline's tables keyed by version too. Each
/// version-5 pipeline's data belongs to the version its checkpoint names;
/// it becomes that version's, `live`, with no contract text until its file
/// is read again (the text's hash then identifies it). Tables an older
/// database never had were created by `SCHEMA` in the new form already.
fn migrate_5_to_6(conn: &Connection) -> rusqlite::Result<()> {
    let has = |table: &str, column: &str| -> rusqlite::Result<bool> {
        conn.prepare(&format!("SELECT 1 FROM pragma_table_info('{table}') WHERE name = ?1"))?.exists([column])
    };
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let mut rebuilt = Vec::new();
    if has("pipelines", "next_seq")? {
        conn.execute_batch(
            "INSERT OR IGNORE INTO streams (pipeline, next_seq, next_ledger) SELECT name, next_seq, next_ledger FROM pipelines;
             INSERT OR IGNORE INTO versions (pipeline, version, state, contract_hash, contract, started_ms, started_by)
                 SELECT name, version, 'live', text_hash, '', checkpoint_ms, 'a results database from before versions'
                 FROM pipelines;
             ALTER TABLE pipelines RENAME TO pipelines_v5;",
        )?;
        rebuilt.push(("pipelines", "name, version, text_hash, header, checkpoint_ms, replayed", ""));
    }
    for (table, columns) in [
        ("offsets", "partition, next_offset"),
        ("state_windows", "id, data"),
        ("state_id_batches", "seq, max_expires, data"),
        ("results", "key, window_start, window_end, status, revision, row"),
        ("held_results", "key, window_start, window_end, status, revision, row"),
    ] {
        if !has(table, "version")? {
            conn.execute_batch(&format!("ALTER TABLE {table} RENAME TO {table}_v5;"))?;
            rebuilt.push((table, columns, "pipeline"));
        }
    }
    for (table, column, ddl) in [
        ("changes", "version", "INTEGER NOT NULL DEFAULT 0"),
        ("changes", "kind", "TEXT NOT NULL DEFAULT 'row'"),
        ("ledger", "version", "INTEGER NOT NULL DEFAULT 0"),
        ("replays", "version", "INTEGER NOT NULL DEFAULT 0"),
    ] {
        if !has(table, column)? {
            conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {ddl};"))?;
        }
    }
    conn.execute_batch(SCHEMA)?;
    let version_of =
        |column: &str| format!("coalesce((SELECT v.version FROM versions v WHERE v.pipeline = o.{column}), 0)");
    for (table, columns, by) in rebuilt {
        let select = match by {
            "" => columns.to_owned(),
            _ => format!("o.pipeline, {}, {columns}", version_of(by)),
        };
        conn.execute_batch(&format!("INSERT INTO {table} SELECT {select} FROM {table}_v5 o; DROP TABLE {table}_v5;"))?;
    }
    for table in ["changes", "ledger", "replays"] {
        conn.execute_batch(&format!(
            "UPDATE {table} AS o SET version = {} WHERE version = 0;",
            version_of("pipeline")
        ))?;
    }
    conn.execute_batch("UPDATE meta SET value = '6' WHERE key = 'schema_version'; COMMIT;")
}

/// Opens (or creates, owner-only: 0600, which SQLite gives its `-wal` and
/// `-shm` files too) the results database.
pub fn open(path: &Path) -> rusqlite::Result<Connection> {
    if let Err(e) = weir_log::create_private_file(path) {
        return Err(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CANTOPEN),
            Some(format!("cannot create {}: {e}", path.display())),
        ));
    }
    let conn = Connection::open(path)?;
    // A writer waiting for the lock looks again every millisecond for 10 s:
    // SQLite's own wait sleeps up to 100 ms at a time, so a connection that
    // writes now and then (a destination's position, an operator's action)
    // could miss the moments a pipeline that commits every few milliseconds
    // leaves the lock free, and wait hundreds of milliseconds.
    conn.busy_handler(Some(wait_a_millisecond))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    // Text deleted, replaced or moved (a page split copies cells) is
    // overwritten, so a ledger payload erased or forgotten leaves no copy
    // in the file's free space (SECURITY.md, "Personal data").
    conn.pragma_update(None, "secure_delete", "ON")?;
    Ok(conn)
}

/// The busy handler of every connection: true (try again) for 10 s of 1 ms waits.
fn wait_a_millisecond(attempts: i32) -> bool {
    std::thread::sleep(std::time::Duration::from_millis(1));
    attempts < 10_000
}

/// Opens `path` read-only and checks that it holds this weir's schema
/// version (listing and verifying change nothing).
pub fn open_read_only(path: &Path) -> crate::Result<Connection> {
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags)
        .map_err(|e| crate::StoreError::Refused(format!("cannot open {}: {e}", path.display())))?;
    let version: Option<String> = conn
        .query_row("SELECT value FROM meta WHERE key = 'schema_version'", [], |r| r.get(0))
        .map_err(|e| crate::StoreError::Refused(format!("{} is not a weir results database: {e}", path.display())))?;
    if version.as_deref() != Some(&SCHEMA_VERSION.to_string()) {
        return Err(crate::StoreError::Refused(format!(
            "{} has schema version {}; this weir reads version {SCHEMA_VERSION}: start this weir's server on it once (it migrates), or use the weir that wrote it",
            path.display(),
            version.unwrap_or_default(),
        )));
    }
    Ok(conn)
}

/// A pipeline's writing connection: a page cache of up to 64 MiB, so the
/// tables a checkpoint touches stay in memory; its commits do not copy the
/// write-ahead log into the database (a [`WalCopier`] does, on a thread of its own).
pub fn open_writer(path: &Path) -> rusqlite::Result<Connection> {
    let conn = open(path)?;
    conn.pragma_update(None, "cache_size", -65_536)?;
    conn.pragma_update(None, "wal_autocheckpoint", 0)?;
    Ok(conn)
}

/// How often a [`WalCopier`] copies the write-ahead log into the database.
const WAL_COPY_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// Copies a database's write-ahead log into the database every
/// [`WAL_COPY_EVERY`] (SQLite's passive checkpoint), on a thread of its own,
/// for a writer whose commits do not ([`open_writer`]): a pipeline's commit
/// appends its pages to the log and returns, and the copy, with its fsync of
/// the database file, runs on the other core. Stops when dropped.
pub struct WalCopier {
    stop: std::sync::Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl WalCopier {
    pub fn start(path: &Path) -> WalCopier {
        let stop = std::sync::Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
        let (flag, path) = (std::sync::Arc::clone(&stop), path.to_owned());
        let thread = std::thread::Builder::new()
            .name("weir-wal-copy".into())
            .spawn(move || {
                // Without its own connection the copy falls to the next connection that opens or closes.
                let Ok(conn) = Connection::open(&path) else { return };
                let (stopped, wake) = &*flag;
                let mut stopped = stopped.lock().unwrap_or_else(|e| e.into_inner());
                while !*stopped {
                    stopped = wake.wait_timeout(stopped, WAL_COPY_EVERY).unwrap_or_else(|e| e.into_inner()).0;
                    // Passive: never waits for a reader or a writer; what it cannot copy now, the next copy does.
                    let _: rusqlite::Result<(i64, i64, i64)> =
                        conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)));
                }
            })
            .ok();
        WalCopier { stop, thread }
    }
}

impl Drop for WalCopier {
    fn drop(&mut self) {
        let (stopped, wake) = &*self.stop;
        *stopped.lock().unwrap_or_else(|e| e.into_inner()) = true;
        wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Creates the schema, or checks that the database's is this build's.
pub fn migrate(conn: &Connection) -> crate::Result<()> {
    if let Err(e) = rename_incidents(conn) {
        let _ = conn.execute_batch("ROLLBACK");
        return Err(e.into());
    }
    conn.execute_batch(SCHEMA)?;
    conn.execute_batch(crate::tokens::SCHEMA)?;
    conn.execute_batch(crate::idempotency::SCHEMA)?;
    conn.execute_batch(crate::incidents::sqlite::SCHEMA)?;
    conn.execute_batch(crate::checks::sqlite::SCHEMA)?;
    conn.execute_batch(crate::drills::sqlite::SCHEMA)?;
    conn.execute_batch(crate::destinations::sqlite::SCHEMA)?;
    crate::drills::sqlite::migrate(conn)?;
    let found: Option<String> =
        conn.query_row("SELECT value FROM meta WHERE key = 'schema_version'", [], |r| r.get(0)).optional()?;
    let mut version = match found {
        None => {
            // A new database: its `results` tables are made views at once.
            conn.execute("INSERT INTO meta (key, value) VALUES ('schema_version', '12')", [])?;
            12
        }
        Some(v) => v.parse::<i64>().unwrap_or(i64::MAX),
    };
    if version == 1 {
        conn.execute_batch(
            "BEGIN IMMEDIATE;
             ALTER TABLE changes ADD COLUMN at_ms INTEGER;
             ALTER TABLE changes ADD COLUMN run INTEGER;
             ALTER TABLE changes ADD COLUMN sources TEXT;
             UPDATE meta SET value = '2' WHERE key = 'schema_version';
             COMMIT;",
        )?;
        version = 2;
    }
    if version == 2 {
        crate::audit::migrate_to_chain(conn)?;
        version = 3;
    }
    if version == 3 {
        // Entries from before have no time: they are dated now, so
        // retention erases their payloads one retention period from now.
        // (A database older than version 3 got the new table whole above.)
        let now = weir_log::now_ms();
        let dated = conn.prepare("SELECT 1 FROM pragma_table_info('ledger') WHERE name = 'at_ms'")?.exists([])?;
        let add = if dated {
            String::new()
        } else {
            format!(
                "ALTER TABLE ledger ADD COLUMN at_ms INTEGER NOT NULL DEFAULT {now};
                 ALTER TABLE ledger ADD COLUMN erased INTEGER NOT NULL DEFAULT 0;"
            )
        };
        conn.execute_batch(&format!(
            "BEGIN IMMEDIATE; {add} UPDATE meta SET value = '4' WHERE key = 'schema_version'; COMMIT;"
        ))?;
        version = 4;
    }
    if version == 4 {
        // Replays became requests in the store (the table is created above).
        let has = conn.prepare("SELECT 1 FROM pragma_table_info('pipelines') WHERE name = 'replayed'")?.exists([])?;
        let add = if has { "" } else { "ALTER TABLE pipelines ADD COLUMN replayed INTEGER NOT NULL DEFAULT 0;" };
        conn.execute_batch(&format!(
            "BEGIN IMMEDIATE; {add} UPDATE meta SET value = '5' WHERE key = 'schema_version'; COMMIT;"
        ))?;
        version = 5;
    }
    if version == 5 {
        if let Err(e) = migrate_5_to_6(conn) {
            let _ = conn.execute_batch("ROLLBACK");
            return Err(e.into());
        }
        version = 6;
    }
    if version == 6 {
        // The audit log's entries name the key that chains them ('' for none).
        let has = conn.prepare("SELECT 1 FROM pragma_table_info('audit') WHERE name = 'key_id'")?.exists([])?;
        let add = if has { "" } else { "ALTER TABLE audit ADD COLUMN key_id TEXT NOT NULL DEFAULT '';" };
        conn.execute_batch(&format!(
            "BEGIN IMMEDIATE; {add} UPDATE meta SET value = '7' WHERE key = 'schema_version'; COMMIT;"
        ))?;
        version = 7;
    }
    if version == 7 {
        // Rows and ledger entries name their key's place (see [`place`]);
        // those from before have none, and their provenance is a scan.
        let mut add = String::new();
        for table in ["changes", "ledger"] {
            let has = conn.prepare("SELECT 1 FROM pragma_table_info(?1) WHERE name = 'place'")?.exists([table])?;
            if !has {
                add.push_str(&format!("ALTER TABLE {table} ADD COLUMN place INTEGER;"));
            }
        }
        conn.execute_batch(&format!("BEGIN IMMEDIATE; {add}"))?;
        let placed = place_stored(conn)
            .and_then(|()| conn.execute_batch("UPDATE meta SET value = '8' WHERE key = 'schema_version'; COMMIT;"));
        if let Err(e) = placed {
            let _ = conn.execute_batch("ROLLBACK");
            return Err(e.into());
        }
        version = 8;
    }
    if version == 8 {
        if let Err(e) = migrate_8_to_9(conn) {
            let _ = conn.execute_batch("ROLLBACK");
            return Err(e.into());
        }
        version = 9;
    }
    if version == 9 {
        if let Err(e) = migrate_9_to_10(conn) {
            let _ = conn.execute_batch("ROLLBACK");
            return Err(e.into());
        }
        version = 10;
    }
    if version == 10 {
        // The tables were renamed before the schema was made (`rename_incidents`).
        conn.execute("UPDATE meta SET value = '11' WHERE key = 'schema_version'", [])?;
        version = 11;
    }
    if version == 11 {
        // `state_window_batches` and `state_window_folds` were made by the
        // schema; a weir before them would restore windows without their
        // batches, so it must refuse.
        conn.execute("UPDATE meta SET value = '12' WHERE key = 'schema_version'", [])?;
        version = 12;
    }
    if version == 12 {
        if let Err(e) = rows_named_by_seq(conn) {
            let _ = conn.execute_batch("ROLLBACK");
            return Err(e.into());
        }
        version = 13;
    }
    if version != SCHEMA_VERSION {
        return Err(crate::StoreError::Refused(format!(
            "the results database has schema version {version}; this weir reads version {SCHEMA_VERSION}; use the weir release that wrote it, or move weir.db aside to rebuild results from the log"
        )));
    }
    conn.execute_batch(INDEXES)?;
    Ok(())
}

/// Version 10 to 11, done first of all, before the schema's tables are
/// made: the tables are named for what they hold. The incidents
/// (`cases`, `case_entries` and its `case_id`) take the name `incidents`
/// (`incident_entries`, `incident_id`), and the alert notifications, which
/// had it, are `notifications`. Their indexes are made again under the new
/// names by the schema. Nothing is done once `cases` is gone.
fn rename_incidents(conn: &Connection) -> rusqlite::Result<()> {
    let exists = |table: &str| -> rusqlite::Result<bool> {
        conn.prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1")?.exists([table])
    };
    if !exists("cases")? {
        return Ok(());
    }
    let mut sql = String::from("BEGIN IMMEDIATE;");
    if exists("incidents")? {
        sql.push_str("DROP INDEX IF EXISTS incidents_by_pipeline; ALTER TABLE incidents RENAME TO notifications;");
    }
    sql.push_str("DROP INDEX IF EXISTS cases_by_pipeline; ALTER TABLE cases RENAME TO incidents;");
    if exists("case_entries")? {
        sql.push_str(
            "DROP INDEX IF EXISTS case_entries_by_case; ALTER TABLE case_entries RENAME TO incident_entries;
             ALTER TABLE incident_entries RENAME COLUMN case_id TO incident_id;",
        );
    }
    sql.push_str("COMMIT;");
    conn.execute_batch(&sql)
}

/// Version 8 to 9: each row names the `seq` of the row its key and window
/// had before it in its version (`previous`, the row provenance shows it
/// was derived from), so provenance reads it, not an index of every row by
/// key: the index's inserts, in the key's hash order, took about a quarter
/// of a checkpoint's time and a third of its bytes (BENCHMARKS.md, issue 19).
/// And `results` and `held_results` are keyed by window start, then key
/// (their tables rebuilt), so a checkpoint's upserts land on the pages of
/// the windows it changed, not one page a row all over the table.
fn migrate_8_to_9(conn: &Connection) -> rusqlite::Result<()> {
    let has = conn.prepare("SELECT 1 FROM pragma_table_info('changes') WHERE name = 'previous'")?.exists([])?;
    let add = if has { "" } else { "ALTER TABLE changes ADD COLUMN previous INTEGER;" };
    let mut rekey = String::new();
    for table in ["results", "held_results"] {
        let by_window: Option<i64> = conn
            .query_row(&format!("SELECT pk FROM pragma_table_info('{table}') WHERE name = 'window_start'"), [], |r| {
                r.get(0)
            })
            .optional()?;
        if by_window != Some(3) {
            rekey.push_str(&format!(
                "CREATE TABLE {table}_by_window (
                     pipeline TEXT NOT NULL, version INTEGER NOT NULL, key BLOB NOT NULL, window_start INTEGER NOT NULL,
                     window_end INTEGER, status TEXT NOT NULL, revision INTEGER NOT NULL, row TEXT NOT NULL,
                     PRIMARY KEY (pipeline, version, window_start, key)) WITHOUT ROWID;
                 INSERT INTO {table}_by_window (pipeline, version, key, window_start, window_end, status, revision, row)
                     SELECT pipeline, version, key, window_start, window_end, status, revision, row FROM {table};
                 DROP TABLE {table};
                 ALTER TABLE {table}_by_window RENAME TO {table};"
            ));
        }
    }
    conn.execute_batch(&format!(
        "BEGIN IMMEDIATE; {add} {rekey}
         UPDATE changes SET previous = p.prev
           FROM (SELECT pipeline, seq, lag(seq) OVER (
                     PARTITION BY pipeline, version, json_extract(row, '$.key'), json_extract(row, '$.window_start')
                     ORDER BY seq) AS prev
                   FROM changes WHERE kind = 'row' AND json_valid(row)) p
          WHERE changes.pipeline = p.pipeline AND changes.seq = p.seq AND p.prev IS NOT NULL;
         UPDATE meta SET value = '9' WHERE key = 'schema_version';
         COMMIT;"
    ))
}

/// The views `results` and `held_results` over `latest` and `held_latest`:
/// each window's row is its change's text (`seq`), or, for a row a
/// version before 13 stored whose change is not in `changes` with the
/// same text, the text kept beside it (`row`, else NULL).
const RESULT_VIEWS: &str = "
CREATE VIEW results AS
    SELECT l.pipeline, l.version, l.key, l.window_start, l.window_end, l.status, l.revision,
           coalesce(l.row, c.row) AS row
      FROM latest l LEFT JOIN changes c ON c.pipeline = l.pipeline AND c.seq = l.seq;
CREATE VIEW held_results AS
    SELECT l.pipeline, l.version, l.key, l.window_start, l.window_end, l.status, l.revision,
           coalesce(l.row, c.row) AS row
      FROM held_latest l LEFT JOIN changes c ON c.pipeline = l.pipeline AND c.seq = l.seq;
";

/// Version 12 to 13: a window's latest row is stored once, in `changes`;
/// `latest` (and `held_latest` while paused) names it by its `seq`, and
/// `results` and `held_results` become views of the same columns as the
/// tables they were. A checkpoint wrote each row's text twice, and the
/// upserts of about 300-byte rows in key order dirtied most of the
/// table's pages (BENCHMARKS.md, "A window's latest row named by its seq").
/// A row whose `seq` has no change of the same text keeps its text.
/// Views already made are left as they are.
fn rows_named_by_seq(conn: &Connection) -> rusqlite::Result<()> {
    let viewed = conn.prepare("SELECT 1 FROM sqlite_master WHERE type = 'view' AND name = 'results'")?.exists([])?;
    if viewed {
        return conn.execute_batch("UPDATE meta SET value = '13' WHERE key = 'schema_version'");
    }
    let mut sql = String::from("BEGIN IMMEDIATE;");
    for (table, named) in [("results", "latest"), ("held_results", "held_latest")] {
        sql.push_str(&format!(
            "INSERT INTO {named} (pipeline, version, key, window_start, window_end, status, revision, seq, row)
                 SELECT r.pipeline, r.version, r.key, r.window_start, r.window_end, r.status, r.revision, r.seq,
                        CASE WHEN EXISTS (SELECT 1 FROM changes c WHERE c.pipeline = r.pipeline AND c.seq = r.seq
                                                                    AND c.row = r.row)
                             THEN NULL ELSE r.row END
                   FROM (SELECT *, CAST(json_extract(CASE WHEN json_valid(row) THEN row END, '$.seq') AS INTEGER) AS seq
                           FROM {table}) r;
             DROP TABLE {table};"
        ));
    }
    sql.push_str(RESULT_VIEWS);
    sql.push_str("UPDATE meta SET value = '13' WHERE key = 'schema_version'; COMMIT;");
    conn.execute_batch(&sql)
}

/// Version 9 to 10: `state_id_batches` keeps its blobs (tens of kilobytes,
/// a checkpoint's ids) in a table with row ids, its key in an index of its
/// own. Without row ids every row was a key of the table's one index, and
/// SQLite compares such a key in full: each checkpoint's insert and its
/// scan for expired batches read every batch whole, so a checkpoint cost
/// grew with the ids remembered (BENCHMARKS.md, "Where results go").
fn migrate_9_to_10(conn: &Connection) -> rusqlite::Result<()> {
    let sql: String =
        conn.query_row("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'state_id_batches'", [], |r| {
            r.get(0)
        })?;
    let rebuild = if sql.to_ascii_uppercase().contains("WITHOUT ROWID") {
        "CREATE TABLE state_id_batches_rowid (
             pipeline TEXT NOT NULL, version INTEGER NOT NULL, seq INTEGER NOT NULL, max_expires INTEGER NOT NULL,
             data BLOB NOT NULL, PRIMARY KEY (pipeline, version, seq));
         INSERT INTO state_id_batches_rowid (pipeline, version, seq, max_expires, data)
             SELECT pipeline, version, seq, max_expires, data FROM state_id_batches;
         DROP TABLE state_id_batches;
         ALTER TABLE state_id_batches_rowid RENAME TO state_id_batches;"
    } else {
        ""
    };
    conn.execute_batch(&format!(
        "BEGIN IMMEDIATE; {rebuild} UPDATE meta SET value = '10' WHERE key = 'schema_version'; COMMIT;"
    ))
}

/// Masks `pipeline`'s ledger entries stored whole (written before its
/// contract named personal fields, or by a weir that did not mask): each
/// raw entry moves to `ledger_raw` and `ledger` keeps it masked; the old
/// text is overwritten (`secure_delete`) and the write-ahead log truncated.
/// `ledger_masked` remembers the fields and the last entry masked for, so
/// a start with the same fields reads only the entries written since.
/// Returns how many entries were masked.
pub fn mask_ledger(conn: &Connection, pipeline: &str, privacy: &crate::privacy::Privacy) -> rusqlite::Result<usize> {
    if !privacy.masks() {
        return Ok(0);
    }
    conn.pragma_update(None, "secure_delete", "ON")?;
    let tx = own_transaction(conn)?;
    let fields = privacy.fields_text();
    let after: i64 = conn
        .query_row(
            "SELECT through_seq FROM ledger_masked WHERE pipeline = ?1 AND personal = ?2",
            params![pipeline, fields],
            |r| r.get(0),
        )
        .optional()?
        .unwrap_or(i64::MIN);
    let whole: Vec<(i64, i64, String)> = {
        let mut stmt = conn.prepare(
            "SELECT seq, version, entry FROM ledger l WHERE pipeline = ?1 AND seq > ?2 AND erased = 0
               AND NOT EXISTS (SELECT 1 FROM ledger_raw r WHERE r.pipeline = l.pipeline AND r.seq = l.seq)",
        )?;
        let rows = stmt.query_map(params![pipeline, after], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    for (seq, version, entry) in &whole {
        conn.execute(
            "INSERT INTO ledger_raw (pipeline, seq, version, entry) VALUES (?1, ?2, ?3, ?4)",
            params![pipeline, seq, version, entry],
        )?;
        conn.execute(
            "UPDATE ledger SET entry = ?3 WHERE pipeline = ?1 AND seq = ?2",
            params![pipeline, seq, privacy.masked_entry(entry)],
        )?;
    }
    conn.execute(
        "INSERT INTO ledger_masked (pipeline, personal, through_seq)
         VALUES (?1, ?2, coalesce((SELECT max(seq) FROM ledger WHERE pipeline = ?1), -1))
         ON CONFLICT (pipeline) DO UPDATE SET personal = excluded.personal, through_seq = excluded.through_seq",
        params![pipeline, fields],
    )?;
    commit(tx)?;
    if !whole.is_empty() {
        truncate_wal(conn);
    }
    Ok(whole.len())
}

/// Erases the payload and detail of `pipeline`'s ledger entries written
/// before `before_ms`, for retention; the entries themselves (reason,
/// offset, key, times) stay. Deleted text is overwritten in the database
/// file (`secure_delete`) and the write-ahead log is truncated after, so
/// the payloads are gone from disk, not only from answers. Returns how
/// many entries were erased.
pub fn erase_ledger_payloads(conn: &Connection, pipeline: &str, before_ms: i64) -> rusqlite::Result<usize> {
    conn.pragma_update(None, "secure_delete", "ON")?;
    let tx = own_transaction(conn)?;
    conn.execute(
        "DELETE FROM ledger_raw WHERE pipeline = ?1 AND seq IN
             (SELECT seq FROM ledger WHERE pipeline = ?1 AND erased = 0 AND at_ms < ?2)",
        params![pipeline, before_ms],
    )?;
    let erased = conn.execute(
        "UPDATE ledger SET entry = json_set(json_remove(entry, '$.payload'), '$.detail', ?3), erased = 1
         WHERE pipeline = ?1 AND erased = 0 AND at_ms < ?2",
        params![pipeline, before_ms, ERASED_DETAIL],
    )?;
    commit(tx)?;
    if erased > 0 {
        truncate_wal(conn);
    }
    Ok(erased)
}

/// A pipeline's last checkpoint.
pub struct Checkpoint {
    pub header: Vec<u8>,
    pub windows: Vec<(u128, Vec<u8>)>,
    /// The engine's id batches, in the order written (`Delta::ids`).
    pub id_batches: Vec<Vec<u8>>,
    pub offsets: Vec<(u32, u64)>,
    /// The last replay (`replays.id`) applied, 0 for none.
    pub replayed: i64,
}

/// The last checkpoint of `pipeline`'s `version`; `Ok(None)` when there
/// is none. (The version's contract is fixed by `versions`; the engine
/// checks the checkpoint's identity when it restores it.)
pub fn load(conn: &mut Connection, pipeline: &str, version: u32) -> rusqlite::Result<Option<Checkpoint>> {
    let found: Option<(Vec<u8>, i64)> = conn
        .query_row(
            "SELECT header, replayed FROM pipelines WHERE name = ?1 AND version = ?2",
            params![pipeline, version],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    let Some((header, replayed)) = found else { return Ok(None) };
    let mut windows = Vec::new();
    let mut stmt = conn.prepare("SELECT id, data FROM state_windows WHERE pipeline = ?1 AND version = ?2")?;
    let rows = stmt
        .query_map(params![pipeline, version], |r| Ok((id_from(&r.get::<_, Vec<u8>>(0)?), r.get::<_, Vec<u8>>(1)?)))?;
    for row in rows {
        windows.push(row?);
    }
    let batches = window_batches(conn, pipeline, version)?;
    let windows = crate::window_batches::restored(windows, &batches).map_err(corrupt_batch)?;
    // In order: a later batch's record of an id replaces an earlier one.
    let mut stmt =
        conn.prepare("SELECT data FROM state_id_batches WHERE pipeline = ?1 AND version = ?2 ORDER BY seq")?;
    let id_batches =
        stmt.query_map(params![pipeline, version], |r| r.get::<_, Vec<u8>>(0))?.collect::<Result<_, _>>()?;
    let mut offsets = Vec::new();
    let mut stmt = conn.prepare("SELECT partition, next_offset FROM offsets WHERE pipeline = ?1 AND version = ?2")?;
    let rows = stmt.query_map(params![pipeline, version], |r| Ok((r.get::<_, u32>(0)?, r.get::<_, i64>(1)? as u64)))?;
    for row in rows {
        offsets.push(row?);
    }
    Ok(Some(Checkpoint { header, windows, id_batches, offsets, replayed }))
}

/// Removes one version of a pipeline: its checkpoint, rows, change stream
/// entries and ledger (a superseded version past its retention).
pub fn forget_version(conn: &mut Connection, pipeline: &str, version: u32) -> rusqlite::Result<()> {
    // What is deleted is overwritten in the file, not only unlinked.
    conn.pragma_update(None, "secure_delete", "ON")?;
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let tables = [
        "offsets",
        "state_windows",
        "state_window_batches",
        "state_window_folds",
        "state_id_batches",
        "latest",
        "held_latest",
        "ledger",
        "ledger_raw",
    ];
    for table in tables.into_iter().chain(["replays"]) {
        tx.execute(&format!("DELETE FROM {table} WHERE pipeline = ?1 AND version = ?2"), params![pipeline, version])?;
    }
    tx.execute(
        "DELETE FROM changes WHERE pipeline = ?1 AND version = ?2 AND kind = 'row'",
        params![pipeline, version],
    )?;
    tx.execute("DELETE FROM pipelines WHERE name = ?1 AND version = ?2", params![pipeline, version])?;
    tx.execute("DELETE FROM versions WHERE pipeline = ?1 AND version = ?2", params![pipeline, version])?;
    tx.commit()?;
    truncate_wal(conn);
    Ok(())
}

/// Copies the write-ahead log into the database and empties it, so text
/// deleted with `secure_delete` is gone from the `-wal` file too. Busy
/// readers can hold part of it back; the next call finishes it.
fn truncate_wal(conn: &Connection) {
    let _: rusqlite::Result<(i64, i64, i64)> =
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)));
}

/// What one checkpoint writes.
pub struct CheckpointWrite<'a> {
    pub pipeline: &'a str,
    pub version: u32,
    pub text_hash: u64,
    pub format: &'a RowFormat,
    pub out: &'a Output,
    pub delta: Delta,
    pub offsets: &'a [u64],
    pub now_ms: i64,
    /// A replay starts: the stored windows and ids are dropped first, and
    /// the replay (`replays.id`) is marked applied.
    pub replay: Option<i64>,
    /// The run (see [`start_run`]) the rows come from.
    pub run: i64,
    /// The contract's personal fields: ledger entries are stored masked,
    /// the raw entry in `ledger_raw` (see `privacy.rs`).
    pub privacy: &'a crate::privacy::Privacy,
}

/// Records a start of a pipeline; returns the run's id, which its rows carry.
pub fn start_run(conn: &Connection, pipeline: &str, version: u32, text_hash: u64, why: &str) -> rusqlite::Result<i64> {
    conn.execute(
        "INSERT INTO runs (pipeline, version, text_hash, weir_version, started_ms, why) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![pipeline, version, format!("{text_hash:016x}"), env!("CARGO_PKG_VERSION"), weir_log::now_ms(), why],
    )?;
    Ok(conn.last_insert_rowid())
}

/// The pipeline's next change and ledger `seq`, shared by its versions.
pub(crate) fn stream_position(conn: &Connection, pipeline: &str) -> rusqlite::Result<(i64, i64)> {
    conn.prepare_cached("SELECT next_seq, next_ledger FROM streams WHERE pipeline = ?1")?
        .query_row([pipeline], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()
        .map(|found| found.unwrap_or((1, 1)))
}

pub(crate) fn set_stream_position(conn: &Connection, pipeline: &str, (seq, lseq): (i64, i64)) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO streams (pipeline, next_seq, next_ledger) VALUES (?1, ?2, ?3)
         ON CONFLICT (pipeline) DO UPDATE SET next_seq = excluded.next_seq, next_ledger = excluded.next_ledger",
    )?
    .execute(params![pipeline, seq, lseq])?;
    Ok(())
}

/// Writes one checkpoint of one version in one transaction. Its rows and
/// ledger entries take the pipeline's next sequence numbers (shared by
/// every version, so `seq` never goes back), read in the transaction.
pub fn checkpoint(conn: &mut Connection, w: CheckpointWrite<'_>) -> rusqlite::Result<()> {
    checkpoint_keeping(conn, w, &mut Pending::default())
}

/// [`checkpoint`], by a writer that keeps a copy of the version's pending
/// window batches in `pending`, so that a fold does not read them back
/// (see `window_batches.rs`).
pub fn checkpoint_keeping(
    conn: &mut Connection,
    mut w: CheckpointWrite<'_>,
    pending: &mut Pending,
) -> rusqlite::Result<()> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let (mut seq, mut lseq) = stream_position(&tx, w.pipeline)?;
    // Paused by an operator (see [`pause`]): rows go to the change stream
    // past the pause point, hidden from readers, and to `held_results`.
    let paused = tx.prepare_cached("SELECT 1 FROM pauses WHERE pipeline = ?1")?.exists([w.pipeline])?;
    if w.replay.is_some() {
        for table in ["state_windows", "state_window_batches", "state_window_folds", "state_id_batches"] {
            tx.prepare_cached(&format!("DELETE FROM {table} WHERE pipeline = ?1 AND version = ?2"))?
                .execute(params![w.pipeline, w.version])?;
        }
    }
    let latest_table = if paused { "held_latest" } else { "latest" };
    {
        let rows =
            RowsWrite { pipeline: w.pipeline, version: w.version, format: w.format, now_ms: w.now_ms, run: w.run };
        seq = write_rows(&tx, &rows, &w.out.rows, seq, latest_table)?;
        let mut text = String::new();
        let mut ledger = tx.prepare_cached(
            "INSERT INTO ledger (pipeline, seq, reason, entry, at_ms, version, place) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )?;
        let mut raw =
            tx.prepare_cached("INSERT INTO ledger_raw (pipeline, seq, version, entry) VALUES (?1, ?2, ?3, ?4)")?;
        for entry in &w.out.ledger {
            text.clear();
            write_ledger(w.format, entry, lseq, w.version, &mut text);
            let at = entry.key.as_deref().map(place);
            if w.privacy.masks() {
                let masked = w.privacy.masked_entry(&text);
                ledger.execute(params![w.pipeline, lseq, entry.reason.as_str(), masked, w.now_ms, w.version, at])?;
                raw.execute(params![w.pipeline, lseq, w.version, text])?;
            } else {
                ledger.execute(params![w.pipeline, lseq, entry.reason.as_str(), text, w.now_ms, w.version, at])?;
            }
            lseq += 1;
        }
        write_windows(&tx, (w.pipeline, w.version), std::mem::take(&mut w.delta.windows), pending)?;
        if !w.delta.ids.is_empty() {
            let (data, max_expires) = (&w.delta.ids, w.delta.ids_keep_until);
            tx.prepare_cached(
                "INSERT INTO state_id_batches (pipeline, version, seq, max_expires, data)
                 VALUES (?1, ?2, (SELECT coalesce(max(seq), 0) + 1 FROM state_id_batches WHERE pipeline = ?1 AND version = ?2), ?3, ?4)",
            )?
            .execute(params![w.pipeline, w.version, max_expires, data])?;
        }
        tx.prepare_cached("DELETE FROM state_id_batches WHERE pipeline = ?1 AND version = ?2 AND max_expires <= ?3")?
            .execute(params![w.pipeline, w.version, w.delta.forget_ids_through])?;
        let mut offset = tx.prepare_cached(
            "INSERT OR REPLACE INTO offsets (pipeline, version, partition, next_offset) VALUES (?1, ?2, ?3, ?4)",
        )?;
        for (p, o) in w.offsets.iter().enumerate() {
            offset.execute(params![w.pipeline, w.version, p as i64, *o as i64])?;
        }
        tx.prepare_cached(
            "INSERT INTO pipelines (name, version, text_hash, header, checkpoint_ms, replayed)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT (name, version) DO UPDATE SET text_hash = excluded.text_hash,
               header = excluded.header, checkpoint_ms = excluded.checkpoint_ms,
               replayed = max(replayed, excluded.replayed)",
        )?
        .execute(params![
            w.pipeline,
            w.version,
            format!("{:016x}", w.text_hash),
            w.delta.header,
            w.now_ms,
            w.replay.unwrap_or(0)
        ])?;
    }
    set_stream_position(&tx, w.pipeline, (seq, lseq))?;
    tx.commit()?;
    Ok(())
}

/// The last window batch `seq` of a version folded into `state_windows`
/// (0 for none).
fn folded_through(conn: &Connection, pipeline: &str, version: u32) -> rusqlite::Result<i64> {
    conn.prepare_cached("SELECT through FROM state_window_folds WHERE pipeline = ?1 AND version = ?2")?
        .query_row(params![pipeline, version], |r| r.get(0))
        .optional()
        .map(Option::unwrap_or_default)
}

/// A version's pending window batches (those past its last fold), in `seq` order.
fn window_batches(conn: &Connection, pipeline: &str, version: u32) -> rusqlite::Result<Vec<(i64, Vec<u8>)>> {
    let through = folded_through(conn, pipeline, version)?;
    conn.prepare_cached(
        "SELECT seq, data FROM state_window_batches WHERE pipeline = ?1 AND version = ?2 AND seq > ?3 ORDER BY seq",
    )?
    .query_map(params![pipeline, version, through], |r| Ok((r.get(0)?, r.get(1)?)))?
    .collect()
}

fn corrupt_batch(e: crate::window_batches::Corrupt) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(1, rusqlite::types::Type::Blob, Box::new(e))
}

/// Folded window batches deleted by each checkpoint: deleting all of a
/// fold's at once (16 MB of them, in a first version) took longer than
/// the fold's writes.
const FOLDED_DELETED_PER_CHECKPOINT: i64 = 8;

/// Appends a checkpoint's changed windows to `state_window_batches` as one
/// batch and, once enough are pending, folds the oldest into
/// `state_windows` and marks them folded (see `window_batches.rs`).
/// `pending` is the writer's copy of the pending batches, read back only
/// when it is not sure. Deletes a few folded batches.
fn write_windows(
    tx: &Connection,
    (pipeline, version): (&str, u32),
    windows: Vec<(u128, Option<Vec<u8>>)>,
    pending: &mut Pending,
) -> rusqlite::Result<()> {
    let through = folded_through(tx, pipeline, version)?;
    tx.prepare_cached(
        "DELETE FROM state_window_batches WHERE pipeline = ?1 AND version = ?2 AND seq IN (
           SELECT seq FROM state_window_batches WHERE pipeline = ?1 AND version = ?2 AND seq <= ?3 ORDER BY seq LIMIT ?4)",
    )?
    .execute(params![pipeline, version, through, FOLDED_DELETED_PER_CHECKPOINT])?;
    if windows.is_empty() {
        return Ok(());
    }
    let batch = crate::window_batches::encode(&windows);
    let (count, bytes, last): (i64, i64, i64) = tx
        .prepare_cached(
            "SELECT count(*), coalesce(sum(length(data)), 0), coalesce(max(seq), ?3)
               FROM state_window_batches WHERE pipeline = ?1 AND version = ?2 AND seq > ?3",
        )?
        .query_row(params![pipeline, version, through], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
    tx.prepare_cached("INSERT INTO state_window_batches (pipeline, version, seq, data) VALUES (?1, ?2, ?3, ?4)")?
        .execute(params![pipeline, version, last + 1, batch])?;
    let folds = crate::window_batches::folds((count, bytes), batch.len());
    pending.wrote((count, last), batch.len(), windows);
    if !folds {
        return Ok(());
    }
    if !pending.holds(count + 1, last + 1) {
        *pending = Pending::read(&window_batches(tx, pipeline, version)?).map_err(corrupt_batch)?;
    }
    let Some(upto) = pending.fold_through() else { return Ok(()) };
    let mut put = tx
        .prepare_cached("INSERT OR REPLACE INTO state_windows (pipeline, version, id, data) VALUES (?1, ?2, ?3, ?4)")?;
    let mut drop = tx.prepare_cached("DELETE FROM state_windows WHERE pipeline = ?1 AND version = ?2 AND id = ?3")?;
    for (id, data) in pending.fold(upto) {
        match data {
            Some(bytes) => put.execute(params![pipeline, version, &id_bytes(id)[..], bytes])?,
            None => drop.execute(params![pipeline, version, &id_bytes(id)[..]])?,
        };
    }
    tx.prepare_cached(
        "INSERT INTO state_window_folds (pipeline, version, through) VALUES (?1, ?2, ?3)
         ON CONFLICT (pipeline, version) DO UPDATE SET through = excluded.through",
    )?
    .execute(params![pipeline, version, upto])?;
    Ok(())
}

/// Where rows go and what they carry besides themselves.
pub(crate) struct RowsWrite<'a> {
    pub pipeline: &'a str,
    pub version: u32,
    pub format: &'a RowFormat,
    pub now_ms: i64,
    pub run: i64,
}

/// Writes `rows` to the change stream from `seq` on and names each
/// window's last one by its `seq` in `latest_table` (`latest`, or
/// `held_latest` while paused); returns the next `seq`. Each row names its
/// window's previous row: an earlier one of these rows, or the one
/// `latest_table` (then `latest`) names.
pub(crate) fn write_rows(
    tx: &Connection,
    w: &RowsWrite<'_>,
    rows: &[Row],
    mut seq: i64,
    latest_table: &str,
) -> rusqlite::Result<i64> {
    let mut change = tx.prepare_cached(
        "INSERT INTO changes (pipeline, seq, row, at_ms, run, sources, version, place, previous)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    )?;
    let stored_seq = |table: &str| {
        tx.prepare_cached(&format!(
            "SELECT seq, row FROM {table} WHERE pipeline = ?1 AND version = ?2 AND key = ?3 AND window_start = ?4"
        ))
    };
    let mut held = stored_seq(latest_table)?;
    let mut published = if latest_table == "latest" { None } else { Some(stored_seq("latest")?) };
    let mut latest = tx.prepare_cached(&format!(
        "INSERT INTO {latest_table} (pipeline, version, key, window_start, window_end, status, revision, seq)
         VALUES (?1, ?8, ?2, ?3, ?4, ?5, ?6, ?7)
         ON CONFLICT (pipeline, version, window_start, key) DO UPDATE SET
           window_end = excluded.window_end, status = excluded.status,
           revision = excluded.revision, seq = excluded.seq, row = NULL"
    ))?;
    // Every row goes to the change stream; only the last of each window is
    // named in `latest`. First, each row's earlier row of its window among
    // these (its previous) and which rows are their window's last.
    let mut last: std::collections::HashMap<(&[u8], i64), usize> = std::collections::HashMap::with_capacity(rows.len());
    let earlier: Vec<Option<usize>> = rows
        .iter()
        .enumerate()
        .map(|(i, row)| last.insert((&row.key[..], row.window_start.unwrap_or(GLOBAL_START)), i))
        .collect();
    let mut is_last = vec![false; rows.len()];
    for &i in last.values() {
        is_last[i] = true;
    }
    let (mut text, mut scratch, mut sources) = (String::new(), String::new(), String::new());
    let first_seq = seq;
    for (i, row) in rows.iter().enumerate() {
        text.clear();
        write_row(w.format, row, seq, &mut scratch, &mut text);
        sources_json(row, &mut sources);
        let start = row.window_start.unwrap_or(GLOBAL_START);
        let previous = match earlier[i] {
            Some(earlier) => Some(first_seq + earlier as i64),
            None => {
                let mut found = None;
                for stmt in std::iter::once(&mut held).chain(published.as_mut()) {
                    let args = params![w.pipeline, w.version, &row.key[..], start];
                    found = stmt.query_row(args, stored_seq_of).optional()?.flatten();
                    if found.is_some() {
                        break;
                    }
                }
                found
            }
        };
        let args = params![w.pipeline, seq, text, w.now_ms, w.run, sources, w.version, place(&row.key), previous];
        change.execute(args)?;
        seq += 1;
    }
    // In the rows' order, as they were pushed.
    for (i, row) in rows.iter().enumerate().filter(|(i, _)| is_last[*i]) {
        latest.execute(params![
            w.pipeline,
            &row.key[..],
            row.window_start.unwrap_or(GLOBAL_START),
            row.window_end,
            row.status.as_str(),
            row.revision,
            first_seq + i as i64,
            w.version
        ])?;
    }
    Ok(seq)
}

/// The `seq` a `latest` row names, or for a row kept from before version
/// 13 whose `seq` was not found, the one its text starts with.
fn stored_seq_of(r: &rusqlite::Row<'_>) -> rusqlite::Result<Option<i64>> {
    match r.get::<_, Option<i64>>(0)? {
        Some(seq) => Ok(Some(seq)),
        None => Ok(r.get::<_, Option<String>>(1)?.as_deref().and_then(seq_of)),
    }
}

/// Gives the rows and ledger entries stored before places were theirs
/// (the schema's migration to version 8, inside its transaction).
fn place_stored(conn: &Connection) -> rusqlite::Result<()> {
    for (table, column, only_rows) in [("changes", "row", " AND kind = 'row'"), ("ledger", "entry", "")] {
        // In pages of 10,000, so a large database is not held in memory.
        let mut read = conn.prepare(&format!(
            "SELECT t.pipeline, t.seq, j.type, CAST(j.atom AS TEXT)
               FROM (SELECT pipeline, seq, {column} AS doc FROM {table}
                      WHERE (pipeline, seq) > (?1, ?2){only_rows} ORDER BY pipeline, seq LIMIT 10000) t
               LEFT JOIN json_each(CASE WHEN json_valid(t.doc) THEN t.doc END, '$.key') j
              ORDER BY t.pipeline, t.seq, j.id"
        ))?;
        let mut set = conn.prepare(&format!("UPDATE {table} SET place = ?3 WHERE pipeline = ?1 AND seq = ?2"))?;
        let mut after = (String::new(), i64::MIN);
        loop {
            type Field = (String, i64, Option<String>, Option<String>);
            let page: Vec<Field> = read
                .query_map(params![after.0, after.1], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
                .collect::<rusqlite::Result<_>>()?;
            let Some(last) = page.last() else { break };
            after = (last.0.clone(), last.1);
            for one in page.chunk_by(|a, b| (&a.0, a.1) == (&b.0, b.1)) {
                // Keyless entries (and text that is not JSON) have no place.
                if one[0].2.is_none() {
                    continue;
                }
                let fields = one.iter().map(|f| (f.2.as_deref().unwrap_or(""), f.3.as_deref().unwrap_or("")));
                set.execute(params![one[0].0, one[0].1, place_of_fields(fields)])?;
            }
        }
    }
    Ok(())
}

pub fn results(conn: &Connection, pipeline: &str, version: u32, f: &ResultFilter) -> rusqlite::Result<ResultPage> {
    let mut sql = String::from("SELECT row, window_start, key FROM results WHERE pipeline = ?1 AND version = ?2");
    let mut args: Vec<rusqlite::types::Value> = vec![pipeline.to_owned().into(), i64::from(version).into()];
    if let Some(s) = &f.status {
        args.push(s.clone().into());
        sql.push_str(&format!(" AND status = ?{}", args.len()));
    }
    if let Some(from) = f.from_ms {
        args.push(from.into());
        sql.push_str(&format!(" AND window_start >= ?{} AND window_start != {GLOBAL_START}", args.len()));
    }
    if let Some(to) = f.to_ms {
        args.push(to.into());
        sql.push_str(&format!(" AND window_start < ?{} AND window_start != {GLOBAL_START}", args.len()));
    }
    for (field, value) in &f.key {
        args.push(format!("$.key.\"{}\"", field.replace('"', "")).into());
        let path = args.len();
        args.push(value.clone().into());
        sql.push_str(&format!(" AND CAST(json_extract(row, ?{path}) AS TEXT) = ?{}", args.len()));
    }
    if let Some((start, key)) = &f.after {
        args.push((*start).into());
        args.push(key.clone().into());
        sql.push_str(&format!(" AND (window_start, key) > (?{}, ?{})", args.len() - 1, args.len()));
    }
    args.push(f.limit.into());
    sql.push_str(&format!(" ORDER BY window_start, key LIMIT ?{}", args.len()));
    let mut stmt = conn.prepare(&sql)?;
    let found = stmt.query_map(rusqlite::params_from_iter(args), |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?, r.get::<_, Vec<u8>>(2)?))
    })?;
    let mut page = ResultPage::default();
    for f in found {
        let (row, start, key) = f?;
        page.rows.push(row);
        page.places.push((start, key));
    }
    page.rows = annotate_rows(conn, pipeline, page.rows)?;
    Ok(page)
}

/// `[first start, last end)` of a version's timed windows (see [`crate::Store::result_span`]).
pub fn result_span(conn: &Connection, pipeline: &str, version: u32) -> rusqlite::Result<Option<(i64, i64)>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT min(window_start), max(window_end) FROM latest
          WHERE pipeline = ?1 AND version = ?2 AND window_start != {GLOBAL_START} AND window_end IS NOT NULL"
    ))?;
    let (first, last): (Option<i64>, Option<i64>) =
        stmt.query_row(params![pipeline, version], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok(first.zip(last))
}

/// The published change stream from `since`: every version's rows and the
/// `version` entries of promotes and rollbacks, or with `version` that
/// version's rows and the `version` entries. Rows past a pause point stay
/// hidden until the pipeline resumes.
pub fn changes(
    conn: &Connection,
    pipeline: &str,
    version: Option<u32>,
    since: i64,
    limit: i64,
) -> rusqlite::Result<Vec<String>> {
    let mut stmt = conn.prepare_cached(
        "SELECT row FROM changes WHERE pipeline = ?1 AND seq >= ?2
           AND (?4 IS NULL OR version = ?4 OR kind = 'version')
           AND seq < coalesce((SELECT from_seq FROM pauses WHERE pipeline = ?1), 9223372036854775807)
         ORDER BY seq LIMIT ?3",
    )?;
    let rows = stmt.query_map(params![pipeline, since, limit, version], |r| r.get::<_, String>(0))?;
    annotate_rows(conn, pipeline, rows.collect::<rusqlite::Result<Vec<String>>>()?)
}

/// Entries as stored for everyone (masked where the contract names personal
/// fields), or with `raw` as they arrived (only a raw-reader's read).
pub fn ledger(
    conn: &Connection,
    pipeline: &str,
    version: Option<u32>,
    reason: Option<&str>,
    (since, limit): (i64, i64),
    raw: bool,
) -> rusqlite::Result<Vec<String>> {
    let entry = if raw {
        "coalesce((SELECT r.entry FROM ledger_raw r WHERE r.pipeline = l.pipeline AND r.seq = l.seq), l.entry)"
    } else {
        "l.entry"
    };
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {entry} FROM ledger l WHERE pipeline = ?1 AND (?5 IS NULL OR version = ?5) AND (?2 IS NULL OR reason = ?2) AND seq >= ?3
         ORDER BY seq LIMIT ?4"
    ))?;
    let rows = stmt.query_map(params![pipeline, reason, since, limit, version], |r| r.get::<_, String>(0))?;
    rows.collect()
}

/// A version's ledger entries ledgered at `from_ms` or later, after
/// `after_seq`, as stored for everyone: `(seq, at_ms, entry)`.
pub fn ledger_dated(
    conn: &Connection,
    pipeline: &str,
    version: u32,
    (from_ms, after_seq, limit): (i64, i64, i64),
) -> rusqlite::Result<Vec<(i64, i64, String)>> {
    let mut stmt = conn.prepare_cached(
        "SELECT seq, at_ms, entry FROM ledger WHERE pipeline = ?1 AND version = ?2 AND at_ms >= ?3 AND seq > ?4
         ORDER BY seq LIMIT ?5",
    )?;
    let rows = stmt
        .query_map(params![pipeline, version, from_ms, after_seq, limit], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
    rows.collect()
}

/// Pauses publishing: rows checkpointed from now on are held until
/// [`resume`] (a pause survives restarts). Returns whether it was paused
/// already.
pub fn pause(conn: &Connection, pipeline: &str) -> rusqlite::Result<bool> {
    let tx = own_transaction(conn)?;
    let (next, _) = stream_position(conn, pipeline)?;
    let added = conn.execute(
        "INSERT OR IGNORE INTO pauses (pipeline, from_seq, at_ms) VALUES (?1, ?2, ?3)",
        params![pipeline, next, weir_log::now_ms()],
    )?;
    commit(tx)?;
    Ok(added == 0)
}

/// A transaction of its own, unless `conn` is in the caller's (dropped
/// before its commit, it rolls back).
fn own_transaction(conn: &Connection) -> rusqlite::Result<Option<rusqlite::Transaction<'_>>> {
    match conn.is_autocommit() {
        true => Ok(Some(rusqlite::Transaction::new_unchecked(conn, rusqlite::TransactionBehavior::Immediate)?)),
        false => Ok(None),
    }
}

fn commit(tx: Option<rusqlite::Transaction<'_>>) -> rusqlite::Result<()> {
    tx.map_or(Ok(()), |tx| tx.commit())
}

/// Resumes publishing: the held rows reach `results` and the change stream
/// past the pause point becomes readable, in one transaction. Returns
/// whether it was paused.
pub fn resume(conn: &Connection, pipeline: &str) -> rusqlite::Result<bool> {
    let tx = own_transaction(conn)?;
    let removed = conn.execute("DELETE FROM pauses WHERE pipeline = ?1", [pipeline])?;
    if removed > 0 {
        conn.execute("INSERT OR REPLACE INTO latest SELECT * FROM held_latest WHERE pipeline = ?1", [pipeline])?;
        conn.execute("DELETE FROM held_latest WHERE pipeline = ?1", [pipeline])?;
    }
    commit(tx)?;
    Ok(removed > 0)
}

/// Asks a version of the pipeline to replay; returns the replay's id.
pub fn ask_replay(conn: &Connection, pipeline: &str, version: u32, replay: crate::Replay) -> rusqlite::Result<i64> {
    let from_offset = replay.from_offset.map(|o| o.min(i64::MAX as u64) as i64);
    conn.execute(
        "INSERT INTO replays (pipeline, version, from_offset, from_time, asked_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
        params![pipeline, version, from_offset, replay.from_time, weir_log::now_ms()],
    )?;
    Ok(conn.last_insert_rowid())
}

/// The newest replay asked of the pipeline's `version`, with its id.
pub fn last_replay(conn: &Connection, pipeline: &str, version: u32) -> rusqlite::Result<Option<(i64, crate::Replay)>> {
    conn.prepare_cached(
        "SELECT id, from_offset, from_time FROM replays WHERE pipeline = ?1 AND version = ?2 ORDER BY id DESC LIMIT 1",
    )?
    .query_row(params![pipeline, version], |r| {
        let replay =
            crate::Replay { from_offset: r.get::<_, Option<i64>>(1)?.map(|o| o.max(0) as u64), from_time: r.get(2)? };
        Ok((r.get(0)?, replay))
    })
    .optional()
}

/// Whether the pipeline's publishing was paused (a pause survives restarts).
pub fn is_paused(conn: &Connection, pipeline: &str) -> rusqlite::Result<bool> {
    conn.query_row("SELECT count(*) FROM pauses WHERE pipeline = ?1", [pipeline], |r| r.get::<_, i64>(0)).map(|n| n > 0)
}

pub fn add_annotation(
    conn: &Connection,
    pipeline: &str,
    (from_ms, to_ms): (i64, i64),
    note: &str,
    who: &str,
) -> rusqlite::Result<i64> {
    conn.execute(
        "INSERT INTO annotations (pipeline, from_ms, to_ms, note, who, at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![pipeline, from_ms, to_ms, note, who, weir_log::now_ms()],
    )?;
    Ok(conn.last_insert_rowid())
}

pub fn annotations(conn: &Connection, pipeline: &str) -> rusqlite::Result<Vec<Annotation>> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, from_ms, to_ms, note, who, at_ms FROM annotations WHERE pipeline = ?1 ORDER BY id",
    )?;
    let rows = stmt.query_map([pipeline], |r| {
        Ok(Annotation {
            id: r.get(0)?,
            from_ms: r.get(1)?,
            to_ms: r.get(2)?,
            note: r.get(3)?,
            who: r.get(4)?,
            at_ms: r.get(5)?,
        })
    })?;
    rows.collect()
}

/// Adds `"annotations":[ids]` to each row whose window overlaps an
/// annotation's range (a global window overlaps every range).
fn annotate_rows(conn: &Connection, pipeline: &str, rows: Vec<String>) -> rusqlite::Result<Vec<String>> {
    if rows.is_empty() {
        return Ok(rows);
    }
    Ok(with_annotations(&annotations(conn, pipeline)?, rows))
}

/// The highest revision a version has published (or holds while paused).
pub fn max_revision(conn: &Connection, pipeline: &str, version: u32) -> rusqlite::Result<u32> {
    conn.query_row(
        "SELECT max(coalesce((SELECT max(revision) FROM latest WHERE pipeline = ?1 AND version = ?2), 0),
                    coalesce((SELECT max(revision) FROM held_latest WHERE pipeline = ?1 AND version = ?2), 0))",
        params![pipeline, version],
        |r| r.get::<_, i64>(0),
    )
    .map(|v| v.clamp(0, i64::from(u32::MAX)) as u32)
}

/// The published row `seq` of `pipeline` with where it came from; `None`
/// when there is none (or it is held by a pause).
pub fn row_origin(conn: &Connection, pipeline: &str, seq: i64) -> rusqlite::Result<Option<RowOrigin>> {
    /// The row's text, checkpoint time, run, sources, key's place and previous row.
    type Found = (String, Option<i64>, Option<i64>, Option<String>, Option<i64>, Option<i64>);
    let found: Option<Found> = conn
        .query_row(
            "SELECT row, at_ms, run, sources, place, previous FROM changes WHERE pipeline = ?1 AND seq = ?2 AND kind = 'row'
               AND seq < coalesce((SELECT from_seq FROM pauses WHERE pipeline = ?1), 9223372036854775807)",
            params![pipeline, seq],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?)),
        )
        .optional()?;
    let Some((text, at_ms, run, sources, at, previous)) = found else { return Ok(None) };
    let row: serde_json::Value = serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
    let sources = sources.and_then(|s| serde_json::from_str(&s).ok()).unwrap_or_default();
    let run = match run {
        Some(id) => conn
            .query_row("SELECT version, text_hash, weir_version, started_ms, why FROM runs WHERE id = ?1", [id], |r| {
                Ok(Run {
                    id,
                    version: r.get(0)?,
                    text_hash: r.get(1)?,
                    weir_version: r.get(2)?,
                    started_ms: r.get(3)?,
                    why: r.get(4)?,
                })
            })
            .optional()?,
        None => None,
    };
    // The same key and window's row before this one, as the write named it.
    let previous = match previous {
        Some(p) => conn
            .prepare_cached("SELECT row FROM changes WHERE pipeline = ?1 AND seq = ?2")?
            .query_row(params![pipeline, p], |r| r.get::<_, String>(0))
            .optional()?
            .map(|t| (p, serde_json::from_str(&t).unwrap_or(serde_json::Value::Null))),
        None => None,
    };
    // Only the entries of the row's key are read: those at its place (by
    // the index), or, for an entry stored before places were, all. Keys
    // are then compared as written, in the contract's field order. The
    // planner, without statistics, prefers the primary key's range (a scan
    // of every entry): the index is named.
    let (ledger, of_key) = match at {
        Some(_) => ("ledger INDEXED BY ledger_by_place", "place = ?3"),
        None => ("ledger", "?3 IS NULL"),
    };
    // RFC 3339 times with milliseconds in UTC compare as text.
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT reason, count(*) FROM {ledger} WHERE pipeline = ?1 AND version = json_extract(?2, '$.version')
           AND {} AND json_extract(entry, '$.key') = json_extract(?2, '$.key')
           AND (json_extract(?2, '$.window_start') IS NULL
                OR json_extract(entry, '$.window_start') = json_extract(?2, '$.window_start')
                OR (json_extract(entry, '$.window_start') IS NULL
                    AND json_extract(entry, '$.event_time') >= json_extract(?2, '$.window_start')
                    AND json_extract(entry, '$.event_time') < json_extract(?2, '$.window_end')))
         GROUP BY reason ORDER BY reason",
        of_key
    ))?;
    let ledgered = stmt
        .query_map(params![pipeline, text, at], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(Some(RowOrigin { row, at_ms, sources, run, previous, ledgered }))
}

/// The newest `limit` published rows of a version, newest first.
pub fn latest_changes(conn: &Connection, pipeline: &str, version: u32, limit: i64) -> rusqlite::Result<Vec<String>> {
    let mut stmt = conn.prepare_cached(
        "SELECT row FROM changes WHERE pipeline = ?1 AND version = ?3 AND kind = 'row'
           AND seq < coalesce((SELECT from_seq FROM pauses WHERE pipeline = ?1), 9223372036854775807)
         ORDER BY seq DESC LIMIT ?2",
    )?;
    let rows = stmt.query_map(params![pipeline, limit, version], |r| r.get::<_, String>(0))?;
    annotate_rows(conn, pipeline, rows.collect::<rusqlite::Result<Vec<String>>>()?)
}

/// The newest `limit` ledger entries of a version, newest first.
pub fn latest_ledger(conn: &Connection, pipeline: &str, version: u32, limit: i64) -> rusqlite::Result<Vec<String>> {
    let mut stmt = conn
        .prepare_cached("SELECT entry FROM ledger WHERE pipeline = ?1 AND version = ?3 ORDER BY seq DESC LIMIT ?2")?;
    let rows = stmt.query_map(params![pipeline, limit, version], |r| r.get::<_, String>(0))?;
    rows.collect()
}

/// Keeps an alert notification (firing or resolved) of `pipeline`.
pub fn record_notification(conn: &Connection, pipeline: &str, at_ms: i64, notification: &str) -> rusqlite::Result<i64> {
    conn.prepare_cached("INSERT INTO notifications (pipeline, at_ms, notification) VALUES (?1, ?2, ?3)")?
        .execute(params![pipeline, at_ms, notification])?;
    Ok(conn.last_insert_rowid())
}

/// The newest alert notifications of `pipeline`, newest first.
pub fn notifications(conn: &Connection, pipeline: &str, limit: i64) -> rusqlite::Result<Vec<Notification>> {
    let mut stmt = conn.prepare_cached(
        "SELECT at_ms, notification FROM notifications WHERE pipeline = ?1 ORDER BY id DESC LIMIT ?2",
    )?;
    let rows =
        stmt.query_map(params![pipeline, limit], |r| Ok(Notification { at_ms: r.get(0)?, notification: r.get(1)? }))?;
    rows.collect()
}

/// The next `seq` the older `[sink]` publisher recorded for `topic` (1 if none): a `kafka` destination on that topic goes on from it.
pub fn sink_position(conn: &Connection, pipeline: &str, topic: &str) -> rusqlite::Result<i64> {
    conn.query_row("SELECT next_seq FROM sinks WHERE pipeline = ?1 AND topic = ?2", params![pipeline, topic], |r| {
        r.get(0)
    })
    .optional()
    .map(|v| v.unwrap_or(1))
}

fn version_of(r: &rusqlite::Row<'_>) -> rusqlite::Result<Version> {
    Ok(Version {
        version: r.get(0)?,
        state: VersionState::parse(&r.get::<_, String>(1)?),
        contract_hash: r.get(2)?,
        contract: r.get(3)?,
        started_ms: r.get(4)?,
        started_by: r.get(5)?,
        promoted_ms: r.get(6)?,
        promoted_by: r.get(7)?,
        superseded_ms: r.get(8)?,
        replaced: r.get(9)?,
    })
}

/// Every stored version of `pipeline`, oldest first.
pub fn versions(conn: &Connection, pipeline: &str) -> rusqlite::Result<Vec<Version>> {
    let mut stmt = conn.prepare_cached(
        "SELECT version, state, contract_hash, contract, started_ms, started_by, promoted_ms, promoted_by,
                superseded_ms, replaced
         FROM versions WHERE pipeline = ?1 ORDER BY version",
    )?;
    let rows = stmt.query_map([pipeline], version_of)?;
    rows.collect()
}

/// The live version of `pipeline`, if it has one.
pub fn live_version(conn: &Connection, pipeline: &str) -> rusqlite::Result<Option<u32>> {
    conn.prepare_cached("SELECT version FROM versions WHERE pipeline = ?1 AND state = 'live'")?
        .query_row([pipeline], |r| r.get(0))
        .optional()
}

/// Where `version` of `pipeline` stands (`None`: not stored, e.g. removed for retention).
pub fn version_state(conn: &Connection, pipeline: &str, version: u32) -> rusqlite::Result<Option<VersionState>> {
    conn.prepare_cached("SELECT state FROM versions WHERE pipeline = ?1 AND version = ?2")?
        .query_row(params![pipeline, version], |r| r.get::<_, String>(0))
        .optional()
        .map(|s| s.map(|s| VersionState::parse(&s)))
}

/// Registers a contract file's version of `pipeline` (one transaction):
/// stores a new version (a pipeline's first is live, a later one a
/// candidate, superseding older candidates), stores the text of a version
/// kept from before versions, or says why the file is refused.
pub fn register_version(
    conn: &mut Connection,
    pipeline: &str,
    file: FileContract<'_>,
    who: &str,
) -> rusqlite::Result<Registration> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let stored = versions(&tx, pipeline)?;
    let decision = crate::versions::register(pipeline, &stored, file);
    let now = weir_log::now_ms();
    match &decision {
        Registration::Known | Registration::Refused(_) => {}
        Registration::Adopt => {
            tx.execute(
                "UPDATE versions SET contract = ?3, contract_hash = ?4 WHERE pipeline = ?1 AND version = ?2",
                params![pipeline, file.version, file.text, hash_text(file.hash)],
            )?;
        }
        Registration::New { state, supersedes } => {
            for old in supersedes {
                tx.execute(
                    "UPDATE versions SET state = 'superseded', superseded_ms = ?3 WHERE pipeline = ?1 AND version = ?2",
                    params![pipeline, old, now],
                )?;
            }
            tx.execute(
                "INSERT INTO versions (pipeline, version, state, contract_hash, contract, started_ms, started_by)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![pipeline, file.version, state.as_str(), hash_text(file.hash), file.text, now, who],
            )?;
        }
    }
    tx.commit()?;
    Ok(decision)
}

/// A promote (`Some(version)`) or a rollback (`None`), in one transaction
/// with its `version` entry in the change stream; the switch and the
/// entry's `seq`, or why it cannot happen.
pub fn switch_version(
    conn: &Connection,
    pipeline: &str,
    promote: Option<u32>,
    who: &str,
    why: &str,
) -> rusqlite::Result<Result<(Switch, i64), SwitchError>> {
    let tx = own_transaction(conn)?;
    let stored = versions(conn, pipeline)?;
    let decided = match promote {
        Some(v) => crate::versions::promote(pipeline, &stored, v),
        None => crate::versions::rollback(pipeline, &stored),
    };
    let switch = match decided {
        Ok(s) => s,
        Err(e) => return Ok(Err(e)),
    };
    let now = weir_log::now_ms();
    if let Some(from) = switch.from {
        conn.execute(
            "UPDATE versions SET state = 'superseded', superseded_ms = ?3 WHERE pipeline = ?1 AND version = ?2",
            params![pipeline, from, now],
        )?;
    }
    let replaced = if promote.is_some() { switch.from } else { None };
    conn.execute(
        "UPDATE versions SET state = 'live', promoted_ms = ?3, promoted_by = ?4, superseded_ms = NULL,
                replaced = coalesce(?5, replaced)
         WHERE pipeline = ?1 AND version = ?2",
        params![pipeline, switch.to, now, who, replaced],
    )?;
    let (seq, lseq) = stream_position(conn, pipeline)?;
    let mut entry = String::new();
    with_seq(&crate::versions::marker(pipeline, switch, now, why, who), seq, &mut entry);
    conn.execute(
        "INSERT INTO changes (pipeline, seq, row, at_ms, version, kind) VALUES (?1, ?2, ?3, ?4, ?5, 'version')",
        params![pipeline, seq, entry, now, switch.to],
    )?;
    set_stream_position(conn, pipeline, (seq + 1, lseq))?;
    commit(tx)?;
    Ok(Ok((switch, seq)))
}

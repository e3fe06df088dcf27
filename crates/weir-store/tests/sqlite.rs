//! The results database's schema: created fresh, and migrated in place
//! from an earlier version without losing what it holds.

mod common;

use common::{event, CONTRACT};
use rusqlite::Connection;

/// A directory of one test's own (`weir-store-WHAT-PID` in the system's
/// temporary directory), removed when dropped.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(what: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("weir-store-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    /// `weir.db` in it, opened and migrated to this build's schema.
    fn migrated(&self) -> Connection {
        let conn = weir_store::sqlite::open(&self.0.join("weir.db")).unwrap();
        weir_store::sqlite::migrate(&conn).unwrap();
        conn
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The first two columns of each row `sql` selects.
fn pairs<A: rusqlite::types::FromSql, B: rusqlite::types::FromSql>(conn: &Connection, sql: &str) -> Vec<(A, B)> {
    conn.prepare(sql)
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap()
}

#[test]
fn a_version_1_database_is_migrated_in_place() {
    let scratch = Scratch::new("migrate");
    let dir = &scratch.0;
    let path = dir.join("weir.db");
    {
        // What schema version 1 wrote of the tables version 2 changes.
        let old = Connection::open(&path).unwrap();
        old.execute_batch(
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
             INSERT INTO meta VALUES ('schema_version', '1');
             CREATE TABLE changes (
                 pipeline TEXT NOT NULL, seq INTEGER NOT NULL, row TEXT NOT NULL, PRIMARY KEY (pipeline, seq)) WITHOUT ROWID;
             INSERT INTO changes VALUES ('paid', 1, '{\"seq\":1}');",
        )
        .unwrap();
    }
    let conn = weir_store::sqlite::open(&path).unwrap();
    weir_store::sqlite::migrate(&conn).unwrap();
    let version: String =
        conn.query_row("SELECT value FROM meta WHERE key = 'schema_version'", [], |r| r.get(0)).unwrap();
    assert_eq!(version, weir_store::sqlite::SCHEMA_VERSION.to_string());
    let kept: (String, Option<String>) =
        conn.query_row("SELECT row, sources FROM changes WHERE seq = 1", [], |r| Ok((r.get(0)?, r.get(1)?))).unwrap();
    assert_eq!(kept, ("{\"seq\":1}".to_owned(), None));
    let run = weir_store::sqlite::start_run(&conn, "paid", 1, 7, "test").unwrap();
    assert!(run >= 1);
    // Migrating again changes nothing; a newer version is refused with what to do.
    weir_store::sqlite::migrate(&conn).unwrap();
    conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'", []).unwrap();
    let refused = weir_store::sqlite::migrate(&conn).unwrap_err().to_string();
    assert!(refused.contains("schema version 99") && refused.contains("move weir.db aside"), "{refused}");
}

#[test]
fn a_version_2_audit_log_is_chained_when_migrated() {
    let scratch = Scratch::new("migrate-2");
    let dir = &scratch.0;
    let path = dir.join("weir.db");
    {
        // What schema version 2 wrote of the audit log, with its triggers.
        let old = Connection::open(&path).unwrap();
        old.execute_batch(
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
             INSERT INTO meta VALUES ('schema_version', '2');
             CREATE TABLE audit (
                 seq INTEGER PRIMARY KEY AUTOINCREMENT, at_ms INTEGER NOT NULL, who TEXT NOT NULL, action TEXT NOT NULL,
                 pipeline TEXT, detail TEXT NOT NULL, why TEXT NOT NULL);
             INSERT INTO audit (at_ms, who, action, pipeline, detail, why) VALUES (1, 'alice', 'pause', 'paid', '{}', 'checking');
             INSERT INTO audit (at_ms, who, action, pipeline, detail, why) VALUES (2, 'alice', 'resume', 'paid', '{}', 'fine');
             CREATE TRIGGER audit_append_only_update BEFORE UPDATE ON audit
                 BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;",
        )
        .unwrap();
    }
    let conn = weir_store::sqlite::open(&path).unwrap();
    weir_store::sqlite::migrate(&conn).unwrap();
    // The old entries are chained in order, and new ones chain on.
    let verified = weir_store::audit::verify(&conn, &[]).unwrap().unwrap();
    assert_eq!(verified.entries, 2);
    let detail = serde_json::json!({});
    let entry = weir_store::audit::Entry {
        who: "bob",
        action: "replay",
        pipeline: None,
        detail: &detail,
        why: "x",
        origin: "test",
    };
    assert_eq!(weir_store::audit::append(&conn, &entry).unwrap(), 3);
    let verified = weir_store::audit::verify(&conn, &[]).unwrap().unwrap();
    assert_eq!(verified.entries, 3);
    assert!(conn.execute("UPDATE audit SET why = 'x'", []).unwrap_err().to_string().contains("append-only"));
}

#[test]
fn a_version_3_ledger_is_dated_and_its_payloads_can_be_erased_from_disk() {
    let scratch = Scratch::new("migrate-3");
    let dir = &scratch.0;
    let path = dir.join("weir.db");
    let marker = "card-4242-4242-marker";
    {
        // What schema version 3 wrote of the ledger: no time.
        let old = Connection::open(&path).unwrap();
        old.execute_batch(
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
             INSERT INTO meta VALUES ('schema_version', '3');
             CREATE TABLE ledger (
                 pipeline TEXT NOT NULL, seq INTEGER NOT NULL, reason TEXT NOT NULL, entry TEXT NOT NULL,
                 PRIMARY KEY (pipeline, seq)) WITHOUT ROWID;",
        )
        .unwrap();
        let entry = serde_json::json!({
            "seq": 1, "reason": "bad_type",
            "detail": format!("amount is \"{marker}\""),
            "payload": format!("{{\"amount\":\"{marker}\"}}"),
        });
        let insert = "INSERT INTO ledger VALUES (?1, 1, 'bad_type', ?2)";
        old.execute(insert, ["paid", &entry.to_string()]).unwrap();
        old.execute(insert, ["other", &serde_json::json!({"seq": 1, "payload": "{}"}).to_string()]).unwrap();
    }
    let before = weir_log::now_ms();
    let conn = weir_store::sqlite::open(&path).unwrap();
    weir_store::sqlite::migrate(&conn).unwrap();
    let (at, erased): (i64, i64) = conn
        .query_row("SELECT at_ms, erased FROM ledger WHERE pipeline = 'paid'", [], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap();
    assert!(at >= before && erased == 0, "migrated entries are dated at the migration: {at}");
    // Nothing is older than the migration yet.
    assert_eq!(weir_store::sqlite::erase_ledger_payloads(&conn, "paid", before).unwrap(), 0);
    assert_eq!(weir_store::sqlite::erase_ledger_payloads(&conn, "paid", at + 1).unwrap(), 1);
    assert_eq!(weir_store::sqlite::erase_ledger_payloads(&conn, "paid", at + 1).unwrap(), 0, "erased once");
    let entry: String = conn.query_row("SELECT entry FROM ledger WHERE pipeline = 'paid'", [], |r| r.get(0)).unwrap();
    let entry: serde_json::Value = serde_json::from_str(&entry).unwrap();
    assert_eq!(entry["reason"], "bad_type", "the entry stays: {entry}");
    assert!(entry.get("payload").is_none(), "{entry}");
    assert_eq!(entry["detail"], weir_store::rows::ERASED_DETAIL);
    let other: String = conn.query_row("SELECT entry FROM ledger WHERE pipeline = 'other'", [], |r| r.get(0)).unwrap();
    assert!(other.contains("payload"), "another pipeline's entries are its own retention's");
    drop(conn);
    for file in ["weir.db", "weir.db-wal"] {
        let bytes = std::fs::read(dir.join(file)).unwrap_or_default();
        let found = bytes.windows(marker.len()).any(|w| w == marker.as_bytes());
        assert!(!found, "the erased payload is still in {file}");
    }
}

#[test]
fn a_version_5_database_keeps_its_rows_as_the_live_version() {
    let scratch = Scratch::new("migrate-5");
    let dir = &scratch.0;
    let path = dir.join("weir.db");
    {
        // What schema version 5 wrote: one pipeline at version 3, its checkpoint, a row, a change, a ledger entry.
        let old = Connection::open(&path).unwrap();
        old.execute_batch(
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
             INSERT INTO meta VALUES ('schema_version', '5');
             CREATE TABLE pipelines (
                 name TEXT PRIMARY KEY, version INTEGER NOT NULL, text_hash TEXT NOT NULL, header BLOB NOT NULL,
                 next_seq INTEGER NOT NULL, next_ledger INTEGER NOT NULL, checkpoint_ms INTEGER NOT NULL,
                 replayed INTEGER NOT NULL DEFAULT 0);
             INSERT INTO pipelines VALUES ('paid', 3, '00000000000000aa', x'00', 2, 2, 1000, 0);
             CREATE TABLE offsets (
                 pipeline TEXT NOT NULL, partition INTEGER NOT NULL, next_offset INTEGER NOT NULL,
                 PRIMARY KEY (pipeline, partition));
             INSERT INTO offsets VALUES ('paid', 0, 17);
             CREATE TABLE results (
                 pipeline TEXT NOT NULL, key BLOB NOT NULL, window_start INTEGER NOT NULL, window_end INTEGER,
                 status TEXT NOT NULL, revision INTEGER NOT NULL, row TEXT NOT NULL,
                 PRIMARY KEY (pipeline, key, window_start)) WITHOUT ROWID;
             INSERT INTO results VALUES ('paid', x'01', 0, 60000, 'settled', 1, '{\"seq\":1,\"version\":3}');
             CREATE TABLE changes (
                 pipeline TEXT NOT NULL, seq INTEGER NOT NULL, row TEXT NOT NULL,
                 at_ms INTEGER, run INTEGER, sources TEXT, PRIMARY KEY (pipeline, seq)) WITHOUT ROWID;
             INSERT INTO changes VALUES ('paid', 1, '{\"seq\":1,\"version\":3}', 1000, 1, '[]');
             CREATE TABLE ledger (
                 pipeline TEXT NOT NULL, seq INTEGER NOT NULL, reason TEXT NOT NULL, entry TEXT NOT NULL,
                 at_ms INTEGER NOT NULL DEFAULT 0, erased INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (pipeline, seq)) WITHOUT ROWID;
             INSERT INTO ledger VALUES ('paid', 1, 'duplicate', '{\"seq\":1}', 1000, 0);
             CREATE TABLE replays (
                 id INTEGER PRIMARY KEY AUTOINCREMENT, pipeline TEXT NOT NULL, from_offset INTEGER, from_time INTEGER,
                 asked_ms INTEGER NOT NULL);",
        )
        .unwrap();
    }
    let mut conn = weir_store::sqlite::open(&path).unwrap();
    weir_store::sqlite::migrate(&conn).unwrap();
    let versions = weir_store::sqlite::versions(&conn, "paid").unwrap();
    assert_eq!(versions.len(), 1);
    assert_eq!((versions[0].version, versions[0].state), (3, weir_store::VersionState::Live));
    assert_eq!(versions[0].contract_hash, "00000000000000aa");
    let all = weir_store::ResultFilter { limit: 10, ..Default::default() };
    assert_eq!(weir_store::sqlite::results(&conn, "paid", 3, &all).unwrap().rows.len(), 1);
    assert_eq!(weir_store::sqlite::changes(&conn, "paid", Some(3), 1, 10).unwrap().len(), 1);
    assert_eq!(weir_store::sqlite::ledger(&conn, "paid", Some(3), None, (1, 10), true).unwrap().len(), 1);
    let checkpoint = weir_store::sqlite::load(&mut conn, "paid", 3).unwrap().unwrap();
    assert_eq!(checkpoint.offsets, [(0, 17)]);
    // The stream goes on from where version 5 left it: a promote takes seq 2.
    let file = weir_store::FileContract { version: 4, hash: 0xbb, bytes_hash: 0xcc, text: "[pipeline]" };
    let registered = weir_store::sqlite::register_version(&mut conn, "paid", file, "test").unwrap();
    assert!(matches!(registered, weir_store::Registration::New { state: weir_store::VersionState::Candidate, .. }));
    let (_, seq) = weir_store::sqlite::switch_version(&conn, "paid", Some(4), "op", "test").unwrap().unwrap();
    assert_eq!(seq, 2);
}

#[test]
fn point_7_entries_stored_whole_are_masked_and_forgetting_a_version_overwrites_its_text() {
    let scratch = Scratch::new("forget");
    let dir = &scratch.0;
    let path = dir.join("weir.db");
    let mut conn = weir_store::sqlite::open(&path).unwrap();
    weir_store::sqlite::migrate(&conn).unwrap();
    let marker = "eve.forgotten@example.com";
    // Version 2's ledger as a weir that did not mask stored it, and version 1's.
    for seq in 1..=400i64 {
        let version = if seq % 2 == 0 { 2 } else { 1 };
        let payload = format!(r#"{{"email":"{marker}","amount":"{seq}"}}"#);
        let entry = serde_json::json!({ "seq": seq, "reason": "duplicate", "detail": marker, "payload": payload });
        conn.execute(
            "INSERT INTO ledger (pipeline, seq, reason, entry, at_ms, version) VALUES ('paid', ?1, 'duplicate', ?2, 0, ?3)",
            rusqlite::params![seq, entry.to_string(), version],
        )
        .unwrap();
    }
    let privacy = weir_store::privacy::Privacy {
        personal: vec![weir_contract::FieldPath::parse("email").unwrap()],
        event_id: false,
    };
    assert_eq!(weir_store::sqlite::mask_ledger(&conn, "paid", &privacy).unwrap(), 400);
    assert_eq!(weir_store::sqlite::mask_ledger(&conn, "paid", &privacy).unwrap(), 0, "masked once");
    // The next start reads only the entries written since the last one masked.
    let through = |conn: &rusqlite::Connection| -> i64 {
        conn.query_row("SELECT through_seq FROM ledger_masked WHERE pipeline = 'paid'", [], |r| r.get(0)).unwrap()
    };
    assert_eq!(through(&conn), 400);
    let later =
        serde_json::json!({ "seq": 401, "reason": "duplicate", "payload": format!(r#"{{"email":"{marker}"}}"#) });
    conn.execute(
        "INSERT INTO ledger (pipeline, seq, reason, entry, at_ms, version) VALUES ('paid', 401, 'duplicate', ?1, 0, 2)",
        [later.to_string()],
    )
    .unwrap();
    assert_eq!(weir_store::sqlite::mask_ledger(&conn, "paid", &privacy).unwrap(), 1, "the one written since");
    assert_eq!(through(&conn), 401);
    conn.execute("DELETE FROM ledger WHERE pipeline = 'paid' AND seq = 401", []).unwrap();
    conn.execute("DELETE FROM ledger_raw WHERE pipeline = 'paid' AND seq = 401", []).unwrap();
    let everyone = weir_store::sqlite::ledger(&conn, "paid", None, None, (1, 1000), false).unwrap();
    assert!(everyone.len() == 400 && everyone.iter().all(|e| !e.contains(marker) && e.contains("(personal)")));
    let raw = weir_store::sqlite::ledger(&conn, "paid", Some(2), None, (1, 1000), true).unwrap();
    assert!(raw.len() == 200 && raw.iter().all(|e| e.contains(marker)), "the raw-reader's read");

    // Forgetting both versions leaves no trace of the text in the file or its WAL.
    weir_store::sqlite::forget_version(&mut conn, "paid", 1).unwrap();
    weir_store::sqlite::forget_version(&mut conn, "paid", 2).unwrap();
    let on_disk: Vec<&str> = ["weir.db", "weir.db-wal"]
        .into_iter()
        .filter(|f| {
            let bytes = std::fs::read(dir.join(f)).unwrap_or_default();
            bytes.windows(marker.len()).any(|w| w == marker.as_bytes())
        })
        .collect();
    assert!(on_disk.is_empty(), "{marker} is still in {on_disk:?} at {dir:?}");
    drop(conn);
}

#[test]
fn point_4_provenance_reads_its_keys_entries_by_place_and_older_rows_are_placed_and_named_when_migrated() {
    let scratch = Scratch::new("place");
    let dir = &scratch.0;
    let path = dir.join("weir.db");
    let conn = weir_store::sqlite::open(&path).unwrap();
    weir_store::sqlite::migrate(&conn).unwrap();
    // Rows and entries as version 7 stored them: no place. Three keys of
    // two fields (a string and an integer, or a boolean), two windows, two
    // revisions each, and ledger entries by window and by event time.
    let key = |k: usize| match k {
        0 => r#"{"acct":"a-0","n":7}"#.to_owned(),
        1 => r#"{"acct":"a \"1\"","n":-3}"#.to_owned(),
        _ => r#"{"acct":"a-2","vip":true}"#.to_owned(),
    };
    let window = |w: usize| (format!("2026-01-01T00:0{w}:00.000Z"), format!("2026-01-01T00:0{}:00.000Z", w + 1));
    let mut seq = 0;
    for revision in 1..=2 {
        for k in 0..3 {
            for w in 0..2 {
                seq += 1;
                let (start, end) = window(w);
                let row = format!(
                    r#"{{"seq":{seq},"pipeline":"paid","version":1,"key":{},"window_start":"{start}","window_end":"{end}","status":"provisional","revision":{revision},"values":{{}},"events":1,"late_events":0,"watermark":null}}"#,
                    key(k)
                );
                conn.execute(
                    "INSERT INTO changes (pipeline, seq, row, at_ms, sources, version) VALUES ('paid', ?1, ?2, 0, '[]', 1)",
                    rusqlite::params![seq, row],
                )
                .unwrap();
            }
        }
    }
    for (lseq, (k, reason, at)) in
        [(0, "duplicate", "window"), (0, "too_late", "time"), (1, "duplicate", "window"), (0, "bad_type", "none")]
            .into_iter()
            .enumerate()
    {
        let (start, end) = window(0);
        let place = match at {
            "window" => format!(r#","key":{},"window_start":"{start}","window_end":"{end}""#, key(k)),
            "time" => format!(r#","key":{},"event_time":"2026-01-01T00:00:30.000Z""#, key(k)),
            _ => String::new(),
        };
        let entry = format!(r#"{{"seq":{},"version":1,"reason":"{reason}"{place}}}"#, lseq + 1);
        conn.execute(
            "INSERT INTO ledger (pipeline, seq, reason, entry, at_ms, version) VALUES ('paid', ?1, ?2, ?3, 0, 1)",
            rusqlite::params![lseq as i64 + 1, reason, entry],
        )
        .unwrap();
    }
    // `results` as version 8 keyed it: by key, then window start (a table
    // then, as `held_results` was).
    conn.execute_batch(
        "DROP VIEW results;
         DROP VIEW held_results;
         CREATE TABLE held_results (
             pipeline TEXT NOT NULL, version INTEGER NOT NULL, key BLOB NOT NULL, window_start INTEGER NOT NULL,
             window_end INTEGER, status TEXT NOT NULL, revision INTEGER NOT NULL, row TEXT NOT NULL,
             PRIMARY KEY (pipeline, version, key, window_start)) WITHOUT ROWID;
         CREATE TABLE results (
             pipeline TEXT NOT NULL, version INTEGER NOT NULL, key BLOB NOT NULL, window_start INTEGER NOT NULL,
             window_end INTEGER, status TEXT NOT NULL, revision INTEGER NOT NULL, row TEXT NOT NULL,
             PRIMARY KEY (pipeline, version, key, window_start)) WITHOUT ROWID;
         INSERT INTO results VALUES ('paid', 1, x'02', 60000, 120000, 'settled', 2, '{\"seq\":12}'),
                                    ('paid', 1, x'01', 60000, 120000, 'settled', 2, '{\"seq\":11}'),
                                    ('paid', 1, x'02', 0, 60000, 'settled', 2, '{\"seq\":8}');",
    )
    .unwrap();
    conn.execute("UPDATE meta SET value = '7' WHERE key = 'schema_version'", []).unwrap();
    weir_store::sqlite::migrate(&conn).unwrap();
    // Now keyed by window start, then key, with every row kept (named by
    // its seq in `latest`; these texts are not their changes', so kept too).
    let keyed: Vec<String> = conn
        .prepare("SELECT name FROM pragma_table_info('latest') WHERE pk > 0 ORDER BY pk")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert_eq!(keyed, ["pipeline", "version", "window_start", "key"]);
    let kept: Vec<(i64, Vec<u8>, String)> = conn
        .prepare("SELECT window_start, key, row FROM results")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    let seq = |n: i64| format!("{{\"seq\":{n}}}");
    assert_eq!(kept, [(0, vec![2], seq(8)), (60000, vec![1], seq(11)), (60000, vec![2], seq(12))], "in the new order");

    // Each row's place is the one the write path gives its key's bytes.
    use weir_engine::KeyValue::{Bool, Int, Str};
    let places = [
        weir_store::rows::place(&weir_engine::encode_key([Str("a-0"), Int("7")])),
        weir_store::rows::place(&weir_engine::encode_key([Str("a \"1\""), Int("-3")])),
        weir_store::rows::place(&weir_engine::encode_key([Str("a-2"), Bool(true)])),
    ];
    let stored: Vec<Option<i64>> = conn
        .prepare("SELECT place FROM changes WHERE pipeline = 'paid' ORDER BY seq")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    let expected: Vec<Option<i64>> = (0..12).map(|i| Some(places[(i % 6) / 2])).collect();
    assert_eq!(stored, expected);
    let ledger: Vec<Option<i64>> = conn
        .prepare("SELECT place FROM ledger WHERE pipeline = 'paid' ORDER BY seq")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert_eq!(ledger, [Some(places[0]), Some(places[0]), Some(places[1]), None], "a keyless entry has no place");

    // Revision 2 of key 0's first window (seq 7): its previous is seq 1,
    // and the window's ledger entries are the two of key 0.
    let origin = weir_store::sqlite::row_origin(&conn, "paid", 7).unwrap().unwrap();
    assert_eq!(origin.previous.as_ref().map(|p| p.0), Some(1));
    assert_eq!(origin.ledgered, [("duplicate".to_owned(), 1), ("too_late".to_owned(), 1)]);
    // Key 1's revision 1 (seq 3) has no previous; its window has one duplicate.
    let origin = weir_store::sqlite::row_origin(&conn, "paid", 3).unwrap().unwrap();
    assert_eq!(origin.previous, None);
    assert_eq!(origin.ledgered, [("duplicate".to_owned(), 1)]);
    // Each revision-2 row names its revision 1 (six rows before it).
    let previous: Vec<Option<i64>> = conn
        .prepare("SELECT previous FROM changes WHERE pipeline = 'paid' ORDER BY seq")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    let expected: Vec<Option<i64>> = (1..=12).map(|seq| (seq > 6).then_some(seq - 6)).collect();
    assert_eq!(previous, expected);
    // A wrong place finds no entries: the ledger is read by place, not by
    // scan; the previous row is the one the row names.
    conn.execute("UPDATE changes SET place = place + 1 WHERE seq = 7", []).unwrap();
    let origin = weir_store::sqlite::row_origin(&conn, "paid", 7).unwrap().unwrap();
    assert_eq!(origin.previous.as_ref().map(|p| p.0), Some(1));
    assert_eq!(origin.ledgered, []);
    drop(conn);
}

/// A pipeline's writing connection leaves its pages in the write-ahead log
/// at each commit; its `WalCopier` copies them into the database file.
#[test]
fn a_writers_commits_stay_in_the_wal_until_its_copier_copies_them() {
    let scratch = Scratch::new("wal-copy");
    let dir = &scratch.0;
    let path = dir.join("weir.db");
    let conn = weir_store::sqlite::open_writer(&path).unwrap();
    conn.execute_batch("CREATE TABLE filler (b BLOB NOT NULL)").unwrap();
    // Far past SQLite's default of copying at 1,000 pages of log.
    for _ in 0..100 {
        conn.execute("INSERT INTO filler VALUES (zeroblob(65536))", []).unwrap();
    }
    let size = || std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    assert!(size() < 1 << 20, "the commits copied the log into the database: {} bytes", size());
    let copier = weir_store::sqlite::WalCopier::start(&path);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while size() < 6 << 20 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(size() >= 6 << 20, "the copier did not copy the log: the database has {} bytes", size());
    drop(copier);
    drop(conn);
}

/// Each row written names its window's previous row: one of the same
/// checkpoint, the one in `results`, or while paused the one held.
#[test]
fn point_4_each_row_written_names_its_windows_previous_row() {
    use weir_engine::{Engine, EventIn, Mode, Output};
    let scratch = Scratch::new("previous");
    let mut conn = scratch.migrated();
    let c = weir_contract::Contract::parse("paid.toml", CONTRACT).unwrap();
    let privacy = weir_store::privacy::Privacy::of(&c);
    let run = weir_store::sqlite::start_run(&conn, "paid", 1, c.text_hash, "test").unwrap();
    let mut engine = Engine::new(&c, Mode::Stream, 1).unwrap();
    engine.track_changes();
    let mut offset = 0;
    let mut commit = |conn: &mut Connection, engine: &mut Engine, events: &[String]| {
        let mut out = Output::default();
        for e in events {
            engine.process(EventIn { partition: 0, offset, bytes: e.as_bytes() }, &mut out);
            offset += 1;
        }
        let delta = engine.take_delta();
        let w = weir_store::sqlite::CheckpointWrite {
            pipeline: "paid",
            version: 1,
            text_hash: c.text_hash,
            format: engine.format(),
            out: &out,
            delta,
            offsets: &[offset],
            now_ms: weir_log::now_ms(),
            replay: None,
            run,
            privacy: &privacy,
        };
        weir_store::sqlite::checkpoint(conn, w).unwrap();
    };
    // Seq 1-6: a1's first window twice (seq 1, 3), a2's (seq 2), both
    // settled by the watermark of a1's second window (seq 4, 5, 6).
    let first = [event(1, 1, 0, "1.00"), event(2, 2, 1, "2.00"), event(3, 1, 2, "4.00"), event(4, 1, 70, "8.00")];
    commit(&mut conn, &mut engine, &first);
    // a1's first window revised, late: seq 7 in a later checkpoint, seq 8
    // and 9 while paused.
    commit(&mut conn, &mut engine, &[event(5, 1, 3, "16.00")]);
    assert!(!weir_store::sqlite::pause(&conn, "paid").unwrap());
    commit(&mut conn, &mut engine, &[event(6, 1, 4, "32.00")]);
    commit(&mut conn, &mut engine, &[event(7, 1, 5, "64.00")]);
    assert!(weir_store::sqlite::resume(&conn, "paid").unwrap());
    let previous: Vec<(i64, Option<i64>)> =
        pairs(&conn, "SELECT seq, previous FROM changes WHERE pipeline = 'paid' ORDER BY seq");
    let expected = [(3, Some(1)), (4, Some(3)), (5, Some(2)), (6, None), (7, Some(4)), (8, Some(7)), (9, Some(8))];
    assert_eq!(previous, [&[(1, None), (2, None)][..], &expected].concat());
    let origin = weir_store::sqlite::row_origin(&conn, "paid", 9).unwrap().unwrap();
    let named =
        origin.previous.as_ref().map(|(seq, row)| (*seq, row["revision"].as_i64(), row["values"]["total"].to_string()));
    assert_eq!(named, Some((8, Some(5), "53.00".to_owned())));
    // Each window's latest row is stored once, in `changes`: `latest`
    // names it by its seq and keeps no text.
    let named: Vec<(Option<i64>, bool)> =
        pairs(&conn, "SELECT seq, row IS NULL FROM latest WHERE pipeline = 'paid' ORDER BY seq");
    assert_eq!(named, [(Some(5), true), (Some(6), true), (Some(9), true)]);
    drop(conn);
}

#[test]
fn a_version_12_databases_results_are_named_by_seq_and_read_the_same() {
    let scratch = Scratch::new("migrate-12");
    let conn = scratch.migrated();
    let kind: String =
        conn.query_row("SELECT type FROM sqlite_master WHERE name = 'results'", [], |r| r.get(0)).unwrap();
    assert_eq!(kind, "view", "a new database reads its results through a view");
    // `results` and `held_results` as version 12 stored them: the row's
    // text in each. Window 1's is its change's (seq 2); window 2's names
    // seq 3, whose change has another text; window 3's is no JSON; the
    // held row is seq 4's.
    let text = |seq: i64, total: &str| format!(r#"{{"seq":{seq},"pipeline":"paid","values":{{"total":{total}}}}}"#);
    let table = |name: &str| {
        format!(
            "CREATE TABLE {name} (
                 pipeline TEXT NOT NULL, version INTEGER NOT NULL, key BLOB NOT NULL, window_start INTEGER NOT NULL,
                 window_end INTEGER, status TEXT NOT NULL, revision INTEGER NOT NULL, row TEXT NOT NULL,
                 PRIMARY KEY (pipeline, version, window_start, key)) WITHOUT ROWID;"
        )
    };
    conn.execute_batch(&format!(
        "DROP VIEW results; DROP VIEW held_results; {} {}
         INSERT INTO pauses VALUES ('paid', 4, 0);
         UPDATE meta SET value = '12' WHERE key = 'schema_version';",
        table("results"),
        table("held_results")
    ))
    .unwrap();
    for (seq, total) in [(1, "1"), (2, "3"), (3, "5"), (4, "7")] {
        conn.execute(
            "INSERT INTO changes (pipeline, seq, row, version) VALUES ('paid', ?1, ?2, 1)",
            rusqlite::params![seq, text(seq, total)],
        )
        .unwrap();
    }
    let stored = [(1, text(2, "3")), (2, text(3, "4")), (3, "not json".to_owned())];
    for (window, row) in &stored {
        conn.execute(
            "INSERT INTO results VALUES ('paid', 1, x'01', ?1, ?1 + 1, 'settled', 1, ?2)",
            rusqlite::params![window, row],
        )
        .unwrap();
    }
    conn.execute("INSERT INTO held_results VALUES ('paid', 1, x'01', 1, 2, 'provisional', 2, ?1)", [text(4, "7")])
        .unwrap();
    weir_store::sqlite::migrate(&conn).unwrap();
    let version: String =
        conn.query_row("SELECT value FROM meta WHERE key = 'schema_version'", [], |r| r.get(0)).unwrap();
    assert_eq!(version, weir_store::sqlite::SCHEMA_VERSION.to_string());
    let named = |table: &str| -> Vec<(Option<i64>, Option<String>)> {
        conn.prepare(&format!("SELECT seq, row FROM {table} ORDER BY window_start"))
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap()
    };
    // Only the texts their changes do not hold are kept.
    assert_eq!(named("latest"), [(Some(2), None), (Some(3), Some(text(3, "4"))), (None, Some("not json".into()))]);
    assert_eq!(named("held_latest"), [(Some(4), None)]);
    let all = weir_store::ResultFilter { limit: 10, ..Default::default() };
    let page = weir_store::sqlite::results(&conn, "paid", 1, &all).unwrap();
    assert_eq!(page.rows, stored.iter().map(|(_, row)| row.clone()).collect::<Vec<_>>(), "the same texts");
    // A resume publishes the held row by its seq.
    assert!(weir_store::sqlite::resume(&conn, "paid").unwrap());
    let page = weir_store::sqlite::results(&conn, "paid", 1, &all).unwrap();
    assert_eq!(page.rows[0], text(4, "7"));
    assert_eq!(named("held_latest"), []);
    assert_eq!(weir_store::sqlite::max_revision(&conn, "paid", 1).unwrap(), 2);
    drop(conn);
}

#[test]
fn a_version_9_id_table_gets_row_ids_and_keeps_its_batches() {
    let scratch = Scratch::new("migrate-9");
    let conn = scratch.migrated();
    // The table as version 9 made it: without row ids, each batch a key of its one index.
    conn.execute_batch(
        "DROP TABLE state_id_batches;
         CREATE TABLE state_id_batches (
             pipeline TEXT NOT NULL, version INTEGER NOT NULL, seq INTEGER NOT NULL, max_expires INTEGER NOT NULL,
             data BLOB NOT NULL, PRIMARY KEY (pipeline, version, seq)) WITHOUT ROWID;
         UPDATE meta SET value = '9' WHERE key = 'schema_version';",
    )
    .unwrap();
    for seq in 1..=3i64 {
        let data = vec![seq as u8; 40_000];
        conn.execute(
            "INSERT INTO state_id_batches VALUES ('paid', 1, ?1, ?2, ?3)",
            rusqlite::params![seq, seq * 1000, data],
        )
        .unwrap();
    }
    weir_store::sqlite::migrate(&conn).unwrap();
    let sql: String = conn
        .query_row("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'state_id_batches'", [], |r| r.get(0))
        .unwrap();
    assert!(!sql.to_ascii_uppercase().contains("WITHOUT ROWID"), "{sql}");
    let kept: Vec<(i64, i64, usize, u8)> = conn
        .prepare("SELECT seq, max_expires, length(data), data FROM state_id_batches ORDER BY seq")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get::<_, i64>(2)? as usize, r.get::<_, Vec<u8>>(3)?[0])))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert_eq!(kept, [(1, 1000, 40_000, 1), (2, 2000, 40_000, 2), (3, 3000, 40_000, 3)]);
    // Expired batches are found by their expiry, not by reading every batch.
    let plan: String = conn
        .query_row(
            "EXPLAIN QUERY PLAN DELETE FROM state_id_batches WHERE pipeline = 'paid' AND version = 1 AND max_expires <= 1500",
            [],
            |r| r.get(3),
        )
        .unwrap();
    assert!(plan.contains("state_id_batches_by_expiry"), "{plan}");
    let version: String =
        conn.query_row("SELECT value FROM meta WHERE key = 'schema_version'", [], |r| r.get(0)).unwrap();
    assert_eq!(version, weir_store::sqlite::SCHEMA_VERSION.to_string());
}

#[test]
fn windows_written_as_batches_restore_the_same_before_and_after_a_fold() {
    batches_and_a_fold(false);
}

#[test]
fn a_writer_folds_from_its_own_copy_of_the_batches_and_reads_them_back_after_a_checkpoint_that_failed() {
    batches_and_a_fold(true);
}

/// Checkpoints of `common::window_changes` past a fold, restored at points
/// on either side of it. With `keep`, one writer keeps its copy of the
/// pending batches across checkpoints, and one checkpoint, with windows no
/// other has, fails after writing its batch and is then written again.
fn batches_and_a_fold(keep: bool) {
    use weir_engine::{Delta, Engine, Mode, Output};
    let scratch = Scratch::new(&format!("window-batches-{keep}"));
    let mut conn = scratch.migrated();
    let c = weir_contract::Contract::parse("paid.toml", CONTRACT).unwrap();
    let privacy = weir_store::privacy::Privacy::of(&c);
    let run = weir_store::sqlite::start_run(&conn, "paid", 1, c.text_hash, "test").unwrap();
    let engine = Engine::new(&c, Mode::Stream, 1).unwrap();
    let count = |conn: &Connection, table: &str| -> i64 {
        conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0)).unwrap()
    };
    let mut kept = weir_store::window_batches::Pending::default();
    let mut commit = |conn: &mut Connection, i: u64, windows| {
        let delta = Delta {
            header: i.to_le_bytes().to_vec(),
            windows,
            ids: Vec::new(),
            ids_keep_until: 0,
            forget_ids_through: 0,
        };
        let w = weir_store::sqlite::CheckpointWrite {
            pipeline: "paid",
            version: 1,
            text_hash: c.text_hash,
            format: engine.format(),
            out: &Output::default(),
            delta,
            offsets: &[i],
            now_ms: weir_log::now_ms(),
            replay: None,
            run,
            privacy: &privacy,
        };
        match keep {
            true => weir_store::sqlite::checkpoint_keeping(conn, w, &mut kept),
            false => weir_store::sqlite::checkpoint(conn, w),
        }
    };
    let fold_at = weir_store::window_batches::FOLD_BATCHES as u64;
    for i in 1..=fold_at + 150 {
        if keep && i == 700 {
            conn.execute_batch(
                "CREATE TEMP TRIGGER fail_once BEFORE INSERT ON offsets
                 BEGIN SELECT RAISE(ABORT, 'a checkpoint that does not commit'); END;",
            )
            .unwrap();
            let other: Vec<_> =
                (0..300).map(|w| (u128::from(w as u64) << 64 | 7, Some(b"never written".to_vec()))).collect();
            let failed = commit(&mut conn, i, other).unwrap_err().to_string();
            assert!(failed.contains("does not commit"), "{failed}");
            conn.execute_batch("DROP TRIGGER fail_once").unwrap();
        }
        commit(&mut conn, i, common::window_changes(i)).unwrap();
        if [1, 600, fold_at - 1, fold_at, fold_at + 50, fold_at + 150].contains(&i) {
            let mut windows = weir_store::sqlite::load(&mut conn, "paid", 1).unwrap().unwrap().windows;
            windows.sort();
            assert_eq!(windows, common::windows_after(i), "after checkpoint {i}");
        }
        // Nothing folded before the bound; then each fold takes the oldest
        // FOLD_STEP_BATCHES (these are small) and writes only the windows
        // no later batch changed, and later checkpoints delete the folded
        // batches, 8 each; the next fold comes when as many are pending again.
        let counts = (count(&conn, "state_window_batches"), count(&conn, "state_windows"));
        let step = weir_store::window_batches::FOLD_STEP_BATCHES as u64;
        let settled = common::windows_last_changed_through(step, fold_at);
        assert!(settled.len() >= 20, "the first fold has windows to write");
        let (i, fold_at, step) = (i as i64, fold_at as i64, step as i64);
        match i {
            i if i < fold_at => assert_eq!(counts, (i, 0)),
            i if i == fold_at => assert_eq!(counts, (fold_at, settled.len() as i64)),
            i if i == fold_at + 50 => assert_eq!(counts.0, fold_at + 50 - step),
            i if i == fold_at + 150 => assert_eq!(counts.0, fold_at + 150 - 2 * step, "every folded batch deleted"),
            _ => {}
        }
    }
    // A batch changed outside weir is refused with where it broke, not restored wrong.
    conn.execute("UPDATE state_window_batches SET data = substr(data, 1, 30) WHERE seq = (SELECT max(seq) FROM state_window_batches)", []).unwrap();
    let err = weir_store::sqlite::load(&mut conn, "paid", 1).err().expect("a batch cut short is refused").to_string();
    assert!(
        err.contains("30 bytes) has an entry at byte 0 that runs past its end") && err.contains("changed outside weir"),
        "{err}"
    );
    drop(conn);
}

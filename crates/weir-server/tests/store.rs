//! The results database's schema: created fresh, and migrated in place
//! from an earlier version without losing what it holds.

use rusqlite::Connection;

#[test]
fn a_version_1_database_is_migrated_in_place() {
    let dir = std::env::temp_dir().join(format!("weir-store-migrate-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
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
    let conn = weir_server::store::open(&path).unwrap();
    weir_server::store::migrate(&conn).unwrap();
    let version: String =
        conn.query_row("SELECT value FROM meta WHERE key = 'schema_version'", [], |r| r.get(0)).unwrap();
    assert_eq!(version, weir_server::store::SCHEMA_VERSION.to_string());
    let kept: (String, Option<String>) =
        conn.query_row("SELECT row, sources FROM changes WHERE seq = 1", [], |r| Ok((r.get(0)?, r.get(1)?))).unwrap();
    assert_eq!(kept, ("{\"seq\":1}".to_owned(), None));
    let run = weir_server::store::start_run(&conn, "paid", 1, 7, "test").unwrap();
    assert!(run >= 1);
    // Migrating again changes nothing; a newer version is refused with what to do.
    weir_server::store::migrate(&conn).unwrap();
    conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'", []).unwrap();
    let refused = weir_server::store::migrate(&conn).unwrap_err().to_string();
    assert!(refused.contains("schema version 99") && refused.contains("move weir.db aside"), "{refused}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_version_2_audit_log_is_chained_when_migrated() {
    let dir = std::env::temp_dir().join(format!("weir-store-migrate-2-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
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
    let conn = weir_server::store::open(&path).unwrap();
    weir_server::store::migrate(&conn).unwrap();
    // The old entries are chained in order, and new ones chain on.
    let verified = weir_server::audit::verify(&conn).unwrap().unwrap();
    assert_eq!(verified.entries, 2);
    let detail = serde_json::json!({});
    let entry = weir_server::audit::Entry {
        who: "bob",
        action: "replay",
        pipeline: None,
        detail: &detail,
        why: "x",
        origin: "test",
    };
    assert_eq!(weir_server::audit::append(&conn, &entry).unwrap(), 3);
    let verified = weir_server::audit::verify(&conn).unwrap().unwrap();
    assert_eq!(verified.entries, 3);
    assert!(conn.execute("UPDATE audit SET why = 'x'", []).unwrap_err().to_string().contains("append-only"));
    let _ = std::fs::remove_dir_all(&dir);
}

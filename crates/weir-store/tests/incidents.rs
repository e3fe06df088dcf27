//! Alert notifications are kept by the pipeline's store, on both
//! topologies: SQLite (`weir.db`) and the machine's Postgres
//! (`WEIR_TEST_POSTGRES`, default `host=127.0.0.1 user=postgres dbname=test`).

use weir_store::{pg, PostgresStore, SqliteStore, Store};

fn url() -> String {
    std::env::var("WEIR_TEST_POSTGRES").unwrap_or_else(|_| "host=127.0.0.1 user=postgres dbname=test".into())
}

/// Two notifications of one pipeline and one of another, written through
/// one store value and read back through a new one (as after a restart).
fn kept_newest_first(write: &dyn Store, read: &dyn Store) {
    let firing = r#"{"status":"firing","alert":"max_lag","pipeline":"paid"}"#;
    let resolved = r#"{"status":"resolved","alert":"max_lag","pipeline":"paid"}"#;
    let other = r#"{"status":"firing","alert":"max_lag","pipeline":"other"}"#;
    let first = write.record_notification("paid", 1_000, firing).unwrap();
    write.record_notification("other", 1_500, other).unwrap();
    let second = write.record_notification("paid", 2_000, resolved).unwrap();
    assert!(second > first, "ids grow: {first} then {second}");
    let kept = read.notifications("paid", 10).unwrap();
    let texts: Vec<(i64, &str)> = kept.iter().map(|i| (i.at_ms, i.notification.as_str())).collect();
    assert_eq!(texts, vec![(2_000, resolved), (1_000, firing)], "newest first, the pipeline's only");
    assert_eq!(read.notifications("paid", 1).unwrap().len(), 1, "the limit holds");
    assert!(read.notifications("nobody", 10).unwrap().is_empty());
}

/// Incidents with a lifecycle: an alert raised twice keeps one incident, a
/// pause goes in its timeline, the alert's resolution mitigates it, an
/// operator resolves it with a proof and it takes nothing more; another
/// pipeline's stay apart.
fn cases_follow_their_lifecycle(write: &dyn Store, read: &dyn Store) {
    use weir_store::incidents::{CaseAct, CaseError, IncidentStatus};
    use weir_store::{Act, Acted};
    let cause = "alert:max_lag";
    let first = write.raise_incident("paid", cause, ("max_lag firing", "billing-ops"), "firing 1").unwrap();
    let again = write.raise_incident("paid", cause, ("max_lag firing", "billing-ops"), "firing 2").unwrap();
    assert_eq!(first, again, "one incident while it is not resolved");
    let other = write.raise_incident("other", cause, ("max_lag firing", "ops"), "firing").unwrap();
    assert_ne!(other, first);
    let (acted, _) = write.act("paid", &Act::Pause, None).unwrap();
    assert_eq!(acted, Acted::Paused { was: false });
    assert_eq!(write.mark_incidents("paid", Some(cause), ("alert", "weir", "resolved"), true).unwrap(), 1);
    let (c, entries) = read.incident("paid", first).unwrap().unwrap();
    assert_eq!((c.status, c.owner.as_str(), c.cause.as_str()), (IncidentStatus::Mitigated, "billing-ops", cause));
    let kinds: Vec<(&str, &str)> = entries.iter().map(|e| (e.kind.as_str(), e.text.as_str())).collect();
    assert_eq!(
        kinds,
        [
            ("opened", "max_lag firing (owner billing-ops)"),
            ("alert", "firing 1"),
            ("alert", "firing 2"),
            ("action", "paused publishing"),
            ("alert", "resolved")
        ]
    );
    let resolve = |proof: &str| {
        Act::Incident(CaseAct::Resolve { id: first, who: "ops".into(), why: "over".into(), proof: proof.into() })
    };
    assert_eq!(write.act("paid", &resolve(""), None).unwrap().0, Acted::Incident(Err(CaseError::NoProof(first))));
    let Acted::Incident(Ok(done)) = write.act("paid", &resolve("reconciliation 3 passed"), None).unwrap().0 else {
        panic!("not resolved")
    };
    assert_eq!((done.status, done.proof.as_deref()), (IncidentStatus::Resolved, Some("reconciliation 3 passed")));
    let note = Act::Incident(CaseAct::Note { id: first, who: "ops".into(), text: "late".into() });
    assert_eq!(write.act("paid", &note, None).unwrap().0, Acted::Incident(Err(CaseError::Resolved(first))));
    // Resolved: the same alert opens a new one.
    let next = write.raise_incident("paid", cause, ("max_lag firing", "billing-ops"), "firing 3").unwrap();
    assert!(next > first);
    let listed: Vec<(i64, IncidentStatus)> =
        read.incidents("paid", 10).unwrap().iter().map(|c| (c.id, c.status)).collect();
    assert_eq!(listed, [(next, IncidentStatus::Open), (first, IncidentStatus::Resolved)]);
    assert_eq!(read.incidents("other", 10).unwrap().len(), 1);
    assert!(read.incident("other", first).unwrap().is_none(), "another pipeline's incident is not found");
}

#[test]
fn incidents_outlive_the_store_value_on_sqlite() {
    let dir = std::env::temp_dir().join(format!("weir-store-incidents-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("weir.db");
    weir_store::sqlite::migrate(&weir_store::sqlite::open(&db).unwrap()).unwrap();
    {
        let write = SqliteStore::new(db.clone(), 2);
        let read = SqliteStore::new(db.clone(), 2);
        kept_newest_first(&write, &read);
        cases_follow_their_lifecycle(&write, &read);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// An alert raised while another connection (the pipeline's checkpoint)
/// holds the write lock and then commits waits its turn and is kept, rather
/// than failing with "database is locked" on a snapshot the commit made stale.
#[test]
fn an_incident_raised_during_another_write_waits_and_is_kept_on_sqlite() {
    let dir = std::env::temp_dir().join(format!("weir-store-incidents-busy-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("weir.db");
    weir_store::sqlite::migrate(&weir_store::sqlite::open(&db).unwrap()).unwrap();
    let store = SqliteStore::new(db.clone(), 2);
    let cause = "alert:max_watermark_age";
    store.raise_incident("paid", cause, ("max_watermark_age firing", "billing-ops"), "before").unwrap();
    for round in 0..5 {
        let writer = weir_store::sqlite::open(&db).unwrap();
        writer.execute_batch("BEGIN IMMEDIATE").unwrap();
        writer
            .execute("INSERT INTO notifications (pipeline, at_ms, notification) VALUES ('paid', 1, '{}')", [])
            .unwrap();
        let commit = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(200));
            writer.execute_batch("COMMIT").unwrap();
        });
        let text = format!("during write {round}");
        store.raise_incident("paid", cause, ("max_watermark_age firing", "billing-ops"), &text).unwrap();
        let marked = store.mark_incidents("paid", Some(cause), ("note", "weir", "marked"), false).unwrap();
        assert_eq!(marked, 1);
        commit.join().unwrap();
    }
    let cases = store.incidents("paid", 10).unwrap();
    assert_eq!(cases.len(), 1, "one incident for the one cause");
    let (_, entries) = store.incident("paid", cases[0].id).unwrap().unwrap();
    for round in 0..5 {
        let text = format!("during write {round}");
        assert!(entries.iter().any(|e| e.text == text), "{text} kept");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn incidents_outlive_the_store_value_on_postgres() {
    let schema = format!("weir_test_incidents_{}", std::process::id());
    let mut client = pg::connect(&url())
        .unwrap_or_else(|e| panic!("cannot connect to Postgres at {:?}: {e}; start it (scripts/test does)", url()));
    pg::drop_schema(&mut client, &schema).unwrap();
    pg::migrate(&mut client, &schema).unwrap();
    {
        let write = PostgresStore::new(url(), schema.clone(), 2);
        let read = PostgresStore::new(url(), schema.clone(), 2);
        kept_newest_first(&write, &read);
        cases_follow_their_lifecycle(&write, &read);
    }
    pg::drop_schema(&mut client, &schema).unwrap();
}

/// Writes an incident with an entry and a notification, then puts the
/// tables back under the names they had before (`cases`, `case_entries`
/// with `case_id`, and the notifications' `incidents`) with the schema
/// version that had them, as a store written by an older weir holds them.
fn stored_under_the_old_names(store: &dyn Store) -> i64 {
    let id = store.raise_incident("paid", "alert:max_lag", ("max_lag firing", "billing-ops"), "firing").unwrap();
    store.record_notification("paid", 1_000, r#"{"status":"firing","alert":"max_lag"}"#).unwrap();
    id
}

const BACK_TO_THE_OLD_NAMES: &str = "
ALTER TABLE notifications RENAME TO incidents_was_notifications;
ALTER TABLE incidents RENAME TO cases;
ALTER TABLE incidents_was_notifications RENAME TO incidents;
ALTER TABLE incident_entries RENAME TO case_entries;
ALTER TABLE case_entries RENAME COLUMN incident_id TO case_id;";

/// The old names are the new ones after the migration, and what they held
/// reads back through the store: the incident with its timeline, and the
/// notification.
fn kept_under_the_new_names(store: &dyn Store, id: i64) {
    let (incident, entries) = store.incident("paid", id).unwrap().expect("the incident is kept");
    assert_eq!(incident.title, "max_lag firing");
    assert!(entries.iter().any(|e| e.text == "firing"), "its timeline is kept");
    let kept = store.notifications("paid", 10).unwrap();
    assert_eq!(kept.len(), 1, "the notification is kept, and nothing else is one");
    assert!(kept[0].notification.contains("max_lag"));
    let next = store.raise_incident("paid", "alert:max_lag", ("max_lag firing", "billing-ops"), "again").unwrap();
    assert_eq!(next, id, "the incident not resolved takes the entry");
}

#[test]
fn incidents_and_notifications_under_the_old_table_names_are_renamed_in_place_on_sqlite() {
    let dir = std::env::temp_dir().join(format!("weir-store-incidents-renamed-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("weir.db");
    weir_store::sqlite::migrate(&weir_store::sqlite::open(&db).unwrap()).unwrap();
    let id = stored_under_the_old_names(&SqliteStore::new(db.clone(), 2));
    let conn = weir_store::sqlite::open(&db).unwrap();
    conn.execute_batch(&format!(
        "DROP INDEX incidents_by_pipeline; DROP INDEX notifications_by_pipeline; DROP INDEX incident_entries_by_incident;
         {BACK_TO_THE_OLD_NAMES}
         CREATE INDEX cases_by_pipeline ON cases (pipeline, id);
         CREATE INDEX incidents_by_pipeline ON incidents (pipeline, id);
         CREATE INDEX case_entries_by_case ON case_entries (case_id, id);
         UPDATE meta SET value = '10' WHERE key = 'schema_version';"
    ))
    .unwrap();
    weir_store::sqlite::migrate(&conn).unwrap();
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name IN ('cases', 'case_entries') ")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(tables.is_empty(), "{tables:?} are left");
    let version: String =
        conn.query_row("SELECT value FROM meta WHERE key = 'schema_version'", [], |r| r.get(0)).unwrap();
    assert_eq!(version, weir_store::sqlite::SCHEMA_VERSION.to_string());
    kept_under_the_new_names(&SqliteStore::new(db.clone(), 2), id);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn incidents_and_notifications_under_the_old_table_names_are_renamed_in_place_on_postgres() {
    let schema = format!("weir_test_incidents_renamed_{}", std::process::id());
    let mut client = pg::connect(&url()).unwrap();
    pg::drop_schema(&mut client, &schema).unwrap();
    pg::migrate(&mut client, &schema).unwrap();
    let id = stored_under_the_old_names(&PostgresStore::new(url(), schema.clone(), 2));
    let old = BACK_TO_THE_OLD_NAMES.replace("ALTER TABLE ", &format!("ALTER TABLE {schema}."));
    client
        .batch_execute(&format!(
            "SET search_path TO {schema};
             ALTER INDEX incidents_by_pipeline RENAME TO cases_by_pipeline;
             ALTER INDEX notifications_by_pipeline RENAME TO incidents_by_pipeline;
             ALTER INDEX incident_entries_by_incident RENAME TO case_entries_by_case;
             {old}
             UPDATE meta SET value = '7' WHERE key = 'schema_version';
             RESET search_path;"
        ))
        .unwrap();
    pg::migrate(&mut client, &schema).unwrap();
    let left: i64 = client
        .query_one(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = $1 AND table_name IN ('cases', 'case_entries')",
            &[&schema],
        )
        .unwrap()
        .get(0);
    assert_eq!(left, 0);
    kept_under_the_new_names(&PostgresStore::new(url(), schema.clone(), 2), id);
    pg::drop_schema(&mut client, &schema).unwrap();
}

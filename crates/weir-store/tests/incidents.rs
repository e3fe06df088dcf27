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
    let first = write.record_incident("paid", 1_000, firing).unwrap();
    write.record_incident("other", 1_500, other).unwrap();
    let second = write.record_incident("paid", 2_000, resolved).unwrap();
    assert!(second > first, "ids grow: {first} then {second}");
    let kept = read.incidents("paid", 10).unwrap();
    let texts: Vec<(i64, &str)> = kept.iter().map(|i| (i.at_ms, i.notification.as_str())).collect();
    assert_eq!(texts, vec![(2_000, resolved), (1_000, firing)], "newest first, the pipeline's only");
    assert_eq!(read.incidents("paid", 1).unwrap().len(), 1, "the limit holds");
    assert!(read.incidents("nobody", 10).unwrap().is_empty());
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
    }
    pg::drop_schema(&mut client, &schema).unwrap();
}

//! Issue 42, finding 8: a store query has a statement timeout, on SQLite
//! (the progress handler stops a call past it) and on Postgres
//! (`statement_timeout` on every pooled connection), and the connection
//! serves the next call.

use std::time::{Duration, Instant};

use weir_store::{PostgresStore, SqliteStore, StoreError};

/// Counts without end: only a timeout stops it.
const ENDLESS: &str = "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT count(*) FROM r";

#[test]
fn review_2_point_8_a_sqlite_query_past_the_timeout_is_stopped() {
    let dir = std::env::temp_dir().join(format!("weir-store-timeout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let store = SqliteStore::new(dir.join("weir.db"), 1).with_statement_timeout(Duration::from_millis(200));
    let started = Instant::now();
    let stopped = store.with(|c| c.query_row(ENDLESS, [], |r| r.get::<_, i64>(0)));
    assert!(matches!(stopped, Err(StoreError::TimedOut { .. })), "{stopped:?}");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    let said = stopped.unwrap_err().to_string();
    assert!(said.contains("store_statement_timeout"), "{said}");
    // The same (only) connection answers the next call, with a new deadline.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(store.with(|c| c.query_row("SELECT 7", [], |r| r.get::<_, i64>(0))).unwrap(), 7);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn review_2_point_8_a_postgres_query_past_the_timeout_is_stopped() {
    let url = std::env::var("WEIR_TEST_POSTGRES").unwrap_or_else(|_| "host=127.0.0.1 user=postgres dbname=test".into());
    let store = PostgresStore::timed(url, "weir_test_timeouts".into(), 1, Duration::from_millis(200));
    let started = Instant::now();
    let stopped = store.with(|c, _| c.simple_query("SELECT pg_sleep(5)"));
    assert!(matches!(stopped, Err(StoreError::TimedOut { .. })), "{stopped:?}");
    assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
    let row = store.with(|c, _| c.query_one("SELECT 7::INT", &[])).unwrap();
    assert_eq!(row.get::<_, i32>(0), 7);
}

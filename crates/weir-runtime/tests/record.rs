//! Issue 42, finding 2: a system of record is read through a connection of
//! its own, one statement in a read-only transaction, with a timeout and a
//! row cap, on the machine's Postgres (`WEIR_TEST_POSTGRES`).

use weir_runtime::reconcile::{read_record, Mapping, RecordLimits};

fn postgres_url() -> String {
    std::env::var("WEIR_TEST_POSTGRES").unwrap_or_else(|_| "host=127.0.0.1 user=postgres dbname=test".into())
}

/// A role of its own that may read the schema `schema` (and, to show that
/// the transaction is what stops them, create tables in it and insert),
/// and a URL that logs in as it.
fn reader_of(admin: &mut postgres::Client, schema: &str) -> String {
    let role = "weir_test_record_reader";
    admin
        .batch_execute(&format!(
            "DO $$ BEGIN CREATE ROLE {role} LOGIN; EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;
             GRANT USAGE, CREATE ON SCHEMA {schema} TO {role};
             GRANT SELECT, INSERT ON ALL TABLES IN SCHEMA {schema} TO {role};"
        ))
        .unwrap();
    format!("{} user={role}", postgres_url())
}

fn mapping() -> Mapping {
    Mapping::parse("key.account_id=account,window_start=day,revenue=total", &["account_id".into()], &["revenue".into()])
        .unwrap()
}

const RANGE: (i64, i64) = (0, 4_102_444_800_000);

#[test]
fn review_2_point_2_a_system_of_record_is_read_read_only_one_statement_and_bounded() {
    let schema = format!("weir_test_record_{}", std::process::id());
    let mut admin = postgres::Client::connect(&postgres_url(), postgres::NoTls).unwrap();
    admin
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema};
             CREATE TABLE {schema}.revenue (account TEXT, day DATE, total NUMERIC);
             INSERT INTO {schema}.revenue VALUES ('a1', '2026-11-01', 12.5), ('a2', '2026-11-01', 3);"
        ))
        .unwrap();
    let reader = reader_of(&mut admin, &schema);
    let read = |url: &str, query: &str, limits: RecordLimits| {
        read_record((url, Some(&postgres_url())), query, RANGE, &mapping(), limits)
    };
    let select = format!("SELECT account, day, total FROM {schema}.revenue WHERE day >= $1::date AND day < $2::date");

    // Read as its own account: the rows, mapped.
    let rows = read(&reader, &select, RecordLimits::DEFAULT).unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!((rows[0].key.clone(), rows[0].values[0].to_string()), (vec!["a1".to_owned()], "12.5".to_owned()));

    // Two statements: refused before anything runs; no table is made.
    let two = format!("CREATE TABLE {schema}.made (x INT); {select}");
    let e = read(&reader, &two, RecordLimits::DEFAULT).unwrap_err();
    assert!(e.contains("the query must be one SELECT statement"), "{e}");
    // One statement that writes: refused by the read-only transaction,
    // whether the write is in the query or in a function it calls.
    let writes = format!("WITH w AS (INSERT INTO {schema}.revenue VALUES ('a3', '2026-11-01', 1) RETURNING *) SELECT account, day, total FROM w");
    let e = read(&reader, &writes, RecordLimits::DEFAULT).unwrap_err();
    assert!(e.contains("must not contain data-modifying statements"), "{e}");
    admin
        .batch_execute(&format!(
            "CREATE FUNCTION {schema}.sneak() RETURNS INT LANGUAGE sql AS $$ INSERT INTO {schema}.revenue VALUES ('a3', '2026-11-01', 1); SELECT 1 $$"
        ))
        .unwrap();
    let calls = format!("SELECT account, day, total FROM {schema}.revenue, {schema}.sneak()");
    let e = read(&reader, &calls, RecordLimits::DEFAULT).unwrap_err();
    assert!(e.contains("cannot execute INSERT in a read-only transaction"), "{e}");
    let made = admin
        .query_one("SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = 'made'", &[&schema])
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(made, 0, "the CREATE TABLE ran");
    let count: i64 = admin.query_one(&format!("SELECT count(*) FROM {schema}.revenue"), &[]).unwrap().get(0);
    assert_eq!(count, 2, "the INSERT ran");

    // The store's own account is never the system of record's.
    let e = read(&postgres_url(), &select, RecordLimits::DEFAULT).unwrap_err();
    assert!(e.contains("the account of weir's own store"), "{e}");

    // A row cap and a statement timeout.
    let many = "SELECT 'a' || g AS account, DATE '2026-11-01' + g AS day, 1 AS total FROM generate_series(1, 11) g";
    let e = read(&reader, many, RecordLimits { rows: 10, timeout_ms: 60_000 }).unwrap_err();
    assert!(e.contains("more than 10 rows"), "{e}");
    assert_eq!(read(&reader, many, RecordLimits { rows: 11, timeout_ms: 60_000 }).unwrap().len(), 11);
    let slow = "SELECT 'a' AS account, DATE '2026-11-01' AS day, 1 AS total FROM pg_sleep(5)";
    let started = std::time::Instant::now();
    let e = read(&reader, slow, RecordLimits { rows: 10, timeout_ms: 200 }).unwrap_err();
    assert!(e.contains("statement timeout"), "{e}");
    assert!(started.elapsed() < std::time::Duration::from_secs(4), "{:?}", started.elapsed());

    admin.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE")).unwrap();
}

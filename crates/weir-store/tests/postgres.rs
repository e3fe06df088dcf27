//! The Postgres destination against the machine's PostgreSQL
//! (`WEIR_TEST_POSTGRES`, default `host=127.0.0.1 user=postgres dbname=test`):
//! schema creation, claiming partitions, the fence that refuses a worker
//! which lost its partition, restore from a checkpoint, and rows that never
//! go back to a lower revision. Each test uses a schema of its own.

mod common;

use common::{event, CONTRACT};
use weir_contract::Contract;
use weir_engine::{Engine, EventIn, Mode, Output};
use weir_store::pg;

fn url() -> String {
    std::env::var("WEIR_TEST_POSTGRES").unwrap_or_else(|_| "host=127.0.0.1 user=postgres dbname=test".into())
}

/// A schema of this test's own, dropped at the end.
struct Schema {
    client: postgres::Client,
    name: String,
}

impl Schema {
    fn new(test: &str) -> Schema {
        let mut client = pg::connect(&url())
            .unwrap_or_else(|e| panic!("cannot connect to Postgres at {:?}: {e}; start it (scripts/test does)", url()));
        let name = format!("weir_test_{test}_{}", std::process::id());
        client.batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE")).unwrap();
        pg::migrate(&mut client, &name).unwrap();
        Schema { client, name }
    }

    /// Migrates the schema and checks that it reached this build's version.
    fn migrated_to_this_version(&mut self) {
        pg::migrate(&mut self.client, &self.name).unwrap();
        let sql = format!("SELECT value FROM {}.meta WHERE key = 'schema_version'", self.name);
        let version: String = self.client.query_one(&sql, &[]).unwrap().get(0);
        assert_eq!(version, pg::SCHEMA_VERSION.to_string());
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        let _ = self.client.batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name));
    }
}

/// Feeds `events` (offsets from `first`) to `engine`.
fn feed(engine: &mut Engine, partition: u32, first: u64, events: &[String]) -> Output {
    let mut out = Output::default();
    for (i, e) in events.iter().enumerate() {
        engine.process(EventIn { partition, offset: first + i as u64, bytes: e.as_bytes() }, &mut out);
    }
    out
}

/// One checkpoint of `out` and the engine's changes, on partition 3.
fn commit(
    client: &mut postgres::Client,
    schema: &str,
    engine: &mut Engine,
    out: &Output,
    (generation, run): (i64, i64),
    next_offset: u64,
) -> Result<(), weir_store::CheckpointError> {
    let c = Contract::parse("paid.toml", CONTRACT).unwrap();
    commit_as(client, schema, engine, out, (3, generation, run), next_offset, &c)
}

/// One checkpoint of a partition, as a worker of contract `c`.
fn commit_as(
    client: &mut postgres::Client,
    schema: &str,
    engine: &mut Engine,
    out: &Output,
    (partition, generation, run): (u32, i64, i64),
    next_offset: u64,
    c: &Contract,
) -> Result<(), weir_store::CheckpointError> {
    let delta = engine.take_delta();
    let privacy = weir_store::privacy::Privacy::of(c);
    let w = pg::PartitionWrite {
        pipeline: "paid",
        partition,
        generation,
        version: c.pipeline.version,
        text_hash: c.text_hash,
        format: engine.format(),
        out,
        delta,
        next_offset,
        now_ms: weir_log::now_ms(),
        run,
        replay: None,
        privacy: &privacy,
    };
    pg::checkpoint(client, schema, w)
}

/// Stores `c`'s version of its pipeline, as a server does at its start.
fn register(client: &mut postgres::Client, schema: &str, c: &Contract) {
    let file = weir_store::FileContract {
        version: c.pipeline.version,
        hash: c.text_hash,
        bytes_hash: c.bytes_hash(),
        text: &c.text,
    };
    let registered = pg::register_version(client, schema, &c.pipeline.name, file, "test").unwrap();
    assert!(!matches!(registered, weir_store::Registration::Refused(_)), "{registered:?}");
}

#[test]
fn a_worker_that_lost_its_partition_cannot_commit_and_the_new_holder_restores() {
    let mut s = Schema::new("fence");
    let c = Contract::parse("paid.toml", CONTRACT).unwrap();
    let identity = (c.pipeline.version, c.text_hash);
    register(&mut s.client, &s.name, &c);

    // Worker A takes partition 3 and checkpoints two events.
    let a = pg::claim(&mut s.client, &s.name, "paid", 3, "worker-a", identity).unwrap();
    assert_eq!((a.next_offset, a.checkpoint.is_none()), (0, true));
    let mut engine_a = Engine::new(&c, Mode::Stream, 1).unwrap();
    engine_a.track_changes();
    let out = feed(&mut engine_a, 3, 0, &[event(1, 1, 0, "1.00"), event(2, 1, 1, "2.00")]);
    commit(&mut s.client, &s.name, &mut engine_a, &out, (a.generation, a.run), 2).unwrap();

    // Worker B takes it over (A is now a zombie) and restores A's checkpoint.
    let mut other = pg::connect(&url()).unwrap();
    let b = pg::claim(&mut other, &s.name, "paid", 3, "worker-b", identity).unwrap();
    assert_eq!(b.next_offset, 2);
    assert!(b.generation > a.generation);
    let cp = b.checkpoint.expect("B restores A's checkpoint");
    let mut engine_b = Engine::restore_parts(&c, &cp.header, cp.windows, cp.id_batches).unwrap();
    engine_b.track_changes();

    // The zombie goes on and tries to commit: refused, nothing of it written.
    let out = feed(&mut engine_a, 3, 2, &[event(3, 1, 2, "4.00")]);
    let refused = commit(&mut s.client, &s.name, &mut engine_a, &out, (a.generation, a.run), 3).unwrap_err();
    assert!(
        matches!(refused, weir_store::CheckpointError::Fenced { ours, now, .. } if ours == a.generation && now == b.generation),
        "{refused}"
    );
    assert!(refused.to_string().contains("taken by another worker"), "{refused}");
    let changes = pg::changes(&mut s.client, &s.name, "paid", None, 1, 100).unwrap();
    assert_eq!(changes.len(), 2, "only A's first checkpoint: {changes:?}");

    // B processes the same event from the same offset and commits.
    let out = feed(&mut engine_b, 3, 2, &[event(3, 1, 2, "4.00")]);
    commit(&mut other, &s.name, &mut engine_b, &out, (b.generation, b.run), 3).unwrap();
    let changes = pg::changes(&mut s.client, &s.name, "paid", None, 1, 100).unwrap();
    let revisions: Vec<(i64, u64, String)> = changes
        .iter()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (v["seq"].as_i64().unwrap(), v["revision"].as_u64().unwrap(), v["values"]["total"].to_string())
        })
        .collect();
    assert_eq!(
        revisions,
        [(1, 1, "1.00".into()), (2, 2, "3.00".into()), (3, 3, "7.00".into())],
        "seq from 1 in commit order, revisions 1..n, nothing counted twice"
    );
    let results = pg::results(
        &mut s.client,
        &s.name,
        "paid",
        1,
        &weir_store::rows::ResultFilter { limit: 10, ..Default::default() },
    )
    .unwrap()
    .rows;
    assert_eq!(results.len(), 1);
    assert!(results[0].contains("\"revision\":3") && results[0].contains("7.00"), "{results:?}");
    let parts = pg::partitions(&mut s.client, &s.name, "paid", 1).unwrap();
    assert_eq!(parts, [(3, 3, b.generation, "worker-b".to_owned())]);
}

#[test]
fn a_row_never_goes_back_to_a_lower_revision() {
    let mut s = Schema::new("revision");
    let c = Contract::parse("paid.toml", CONTRACT).unwrap();
    register(&mut s.client, &s.name, &c);
    let claim = pg::claim(&mut s.client, &s.name, "paid", 3, "w", (1, c.text_hash)).unwrap();
    // Three revisions of one window in one engine; the first two replayed
    // by a second engine after the third was stored.
    let mut engine = Engine::new(&c, Mode::Stream, 1).unwrap();
    engine.track_changes();
    let events = [event(1, 1, 0, "1.00"), event(2, 1, 1, "2.00"), event(3, 1, 2, "4.00")];
    let out = feed(&mut engine, 3, 0, &events);
    commit(&mut s.client, &s.name, &mut engine, &out, (claim.generation, claim.run), 3).unwrap();
    let mut replayed = Engine::new(&c, Mode::Stream, 1).unwrap();
    replayed.track_changes();
    let out = feed(&mut replayed, 3, 0, &events[..2]);
    commit(&mut s.client, &s.name, &mut replayed, &out, (claim.generation, claim.run), 2).unwrap();
    let results = pg::results(
        &mut s.client,
        &s.name,
        "paid",
        1,
        &weir_store::rows::ResultFilter { limit: 10, ..Default::default() },
    )
    .unwrap()
    .rows;
    assert!(results[0].contains("\"revision\":3") && results[0].contains("7.00"), "{results:?}");
}

#[test]
fn a_newer_schema_version_is_refused_and_a_bad_schema_name_too() {
    let mut s = Schema::new("version");
    pg::migrate(&mut s.client, &s.name).unwrap();
    s.client.execute(&format!("UPDATE {}.meta SET value = '99' WHERE key = 'schema_version'", s.name), &[]).unwrap();
    let refused = pg::migrate(&mut s.client, &s.name).unwrap_err().to_string();
    assert!(refused.contains("version 99") && refused.contains("another [postgres] schema"), "{refused}");
    let bad = pg::migrate(&mut s.client, "weir; DROP TABLE x").unwrap_err().to_string();
    assert!(bad.contains("not a schema name"), "{bad}");
}

/// Why connecting to `url` failed; panics if it did not.
fn refusal(url: &str) -> String {
    match pg::connect(url) {
        Ok(_) => panic!("{url} connected"),
        Err(e) => e.to_string(),
    }
}

/// Whether the session on `client` is encrypted, by the server's own account.
fn encrypted(client: &mut postgres::Client) -> bool {
    client.query_one("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", &[]).unwrap().get(0)
}

#[test]
fn tls_to_postgres_follows_sslmode_as_libpq_does() {
    // The machine's PostgreSQL serves TLS with its own certificate (Debian's
    // snakeoil: self-signed, for `localhost`); the tests trust it by its file.
    let mut plain = pg::connect(&url()).unwrap();
    let ssl_on: String = plain.query_one("SHOW ssl", &[]).unwrap().get(0);
    assert_eq!(ssl_on, "on", "these checks need PostgreSQL with ssl = on (Debian's default)");
    let cert_file: String = plain.query_one("SHOW ssl_cert_file", &[]).unwrap().get(0);
    let base = url();
    assert!(base.contains("host=127.0.0.1"), "this test needs the key=value form of WEIR_TEST_POSTGRES: {base}");
    let by_name = base.replace("host=127.0.0.1", "host=localhost");

    // prefer (the default) and require encrypt; disable does not.
    assert!(encrypted(&mut plain), "the default, prefer, encrypts when the server offers TLS");
    assert!(encrypted(&mut pg::connect(&format!("{base} sslmode=require")).unwrap()));
    assert!(!encrypted(&mut pg::connect(&format!("{base} sslmode=disable")).unwrap()));

    // verify-full checks the chain and the name; verify-ca only the chain.
    let trusted = format!("sslrootcert='{cert_file}'");
    assert!(encrypted(&mut pg::connect(&format!("{by_name} sslmode=verify-full {trusted}")).unwrap()));
    assert!(encrypted(&mut pg::connect(&format!("{base} sslmode=verify-ca {trusted}")).unwrap()));
    let wrong_name = refusal(&format!("{base} sslmode=verify-full {trusted}"));
    assert!(wrong_name.contains("not valid for name"), "{wrong_name}");

    // A CA that did not sign the server's certificate is refused.
    let other = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let other_file = std::env::temp_dir().join(format!("weir-other-ca-{}.pem", std::process::id()));
    std::fs::write(&other_file, other.cert.pem()).unwrap();
    let untrusted = format!("{by_name} sslmode=verify-full sslrootcert={}", other_file.display());
    let refused = refusal(&untrusted);
    assert!(refused.contains("UnknownIssuer") || refused.contains("unknown issuer"), "{refused}");
    let _ = std::fs::remove_file(&other_file);

    // Settings that cannot work say so.
    let cases = [
        ("sslmode=maybe", "is not one of disable, allow, prefer"),
        ("sslmode=verify-full", "need sslrootcert=FILE"),
        ("sslmode=verify-ca sslrootcert=/nonexistent.pem", "cannot read sslrootcert /nonexistent.pem"),
        ("sslcert=/c.pem", "sslcert and sslkey go together"),
    ];
    for (settings, says) in cases {
        let error = refusal(&format!("{base} {settings}"));
        assert!(error.contains(says), "{settings}: {error}");
    }
}

#[test]
fn a_version_1_ledger_is_dated_and_its_payloads_erased_in_order() {
    let mut client = pg::connect(&url()).unwrap();
    let name = format!("weir_test_ledger_v1_{}", std::process::id());
    client.batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE")).unwrap();
    // What schema version 1 wrote of the ledger: no time.
    client
        .batch_execute(&format!(
            "CREATE SCHEMA {name};
             CREATE TABLE {name}.meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
             INSERT INTO {name}.meta VALUES ('schema_version', '1');
             CREATE TABLE {name}.ledger (
                 pipeline TEXT NOT NULL, seq BIGINT NOT NULL, partition INTEGER NOT NULL, reason TEXT NOT NULL,
                 entry TEXT NOT NULL, PRIMARY KEY (pipeline, seq));"
        ))
        .unwrap();
    let entry = r#"{"seq":1,"offset":7,"partition":0,"reason":"bad_type","event_id":"x,\"detail\":1","detail":"amount is \"4242\"","payload":"{\"amount\":\"4242\"}"}"#;
    client.execute(&format!("INSERT INTO {name}.ledger VALUES ('paid', 1, 0, 'bad_type', $1)"), &[&entry]).unwrap();
    let before = weir_log::now_ms();
    pg::migrate(&mut client, &name).unwrap();
    let at: i64 = client.query_one(&format!("SELECT at_ms FROM {name}.ledger"), &[]).unwrap().get(0);
    assert!(at >= before, "migrated entries are dated at the migration");
    assert_eq!(pg::erase_ledger_payloads(&mut client, &name, "paid", before).unwrap(), 0);
    assert_eq!(pg::erase_ledger_payloads(&mut client, &name, "paid", at + 1).unwrap(), 1);
    assert_eq!(pg::erase_ledger_payloads(&mut client, &name, "paid", at + 1).unwrap(), 0, "erased once");
    let erased: String = client.query_one(&format!("SELECT entry FROM {name}.ledger"), &[]).unwrap().get(0);
    // The members before `detail` keep their text and order; the id's escaped quote did not mislead the cut.
    assert!(erased
        .starts_with(r#"{"seq":1,"offset":7,"partition":0,"reason":"bad_type","event_id":"x,\"detail\":1","detail":"#));
    let parsed: serde_json::Value = serde_json::from_str(&erased).unwrap();
    assert!(parsed.get("payload").is_none() && !erased.contains("4242"), "{erased}");
    assert_eq!(parsed["detail"], weir_store::rows::ERASED_DETAIL);
    client.batch_execute(&format!("DROP SCHEMA {name} CASCADE")).unwrap();
}

#[test]
fn two_versions_hold_a_partition_side_by_side_each_fenced_and_seq_shared() {
    let mut s = Schema::new("fence_versions");
    let v1 = Contract::parse("paid.toml", CONTRACT).unwrap();
    let v2 = Contract::parse("paid.toml", &CONTRACT.replace("version = 1", "version = 2")).unwrap();
    register(&mut s.client, &s.name, &v1);
    let a = pg::claim(&mut s.client, &s.name, "paid", 0, "worker-a", (1, v1.text_hash)).unwrap();
    let mut engine_a = Engine::new(&v1, Mode::Stream, 1).unwrap();
    engine_a.track_changes();

    // Version 2 arrives as a candidate; B claims partition 0 for it. Version 1's rows stay.
    let mut other = pg::connect(&url()).unwrap();
    register(&mut other, &s.name, &v2);
    let versions = pg::versions(&mut other, &s.name, "paid").unwrap();
    let states: Vec<_> = versions.iter().map(|v| (v.version, v.state)).collect();
    assert_eq!(states, [(1, weir_store::VersionState::Live), (2, weir_store::VersionState::Candidate)]);
    let b = pg::claim(&mut other, &s.name, "paid", 0, "worker-b", (2, v2.text_hash)).unwrap();
    assert!(
        b.generation > a.generation,
        "generations are never handed out twice: {} then {}",
        a.generation,
        b.generation
    );

    // A commits version 1's row: B's claim of version 2 does not fence it.
    let out = feed(&mut engine_a, 0, 0, &[event(1, 1, 0, "1.00")]);
    commit_as(&mut s.client, &s.name, &mut engine_a, &out, (0, a.generation, a.run), 1, &v1).unwrap();
    // A checkpoint of version 1 with version 2's generation is refused.
    let refused = commit_as(&mut s.client, &s.name, &mut engine_a, &out, (0, b.generation, a.run), 1, &v1).unwrap_err();
    assert!(matches!(refused, weir_store::CheckpointError::Fenced { .. }), "{refused}");
    // A claim with another contract under version 1's number is refused.
    let claim = pg::claim(&mut s.client, &s.name, "paid", 1, "worker-a", (1, v1.text_hash ^ 1)).unwrap_err();
    assert!(claim.to_string().contains("not this worker's contract hash"), "{claim}");

    // B commits version 2's row; a promote is an entry of its own. `seq` is 1, 2, 3 across versions.
    let mut engine_b = Engine::new(&v2, Mode::Stream, 1).unwrap();
    engine_b.track_changes();
    let out = feed(&mut engine_b, 0, 0, &[event(1, 1, 0, "1.00")]);
    commit_as(&mut other, &s.name, &mut engine_b, &out, (0, b.generation, b.run), 1, &v2).unwrap();
    let (switch, seq) = pg::switch_version(&mut other, &s.name, "paid", Some(2), "op", "test").unwrap().unwrap();
    assert_eq!((switch.from, switch.to, seq), (Some(1), 2, 3));
    let all = pg::changes(&mut s.client, &s.name, "paid", None, 1, 100).unwrap();
    let seqs: Vec<i64> =
        all.iter().map(|r| serde_json::from_str::<serde_json::Value>(r).unwrap()["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs, [1, 2, 3]);
    assert!(all[2].contains(r#""type":"version""#) && all[2].contains(r#""from":1"#), "{}", all[2]);
    let only_v1 = pg::changes(&mut s.client, &s.name, "paid", Some(1), 1, 100).unwrap();
    assert_eq!(only_v1.len(), 2, "version 1's row and the promote: {only_v1:?}");
    let filter = weir_store::rows::ResultFilter { limit: 10, ..Default::default() };
    assert_eq!(pg::results(&mut s.client, &s.name, "paid", 1, &filter).unwrap().rows.len(), 1);
    assert_eq!(pg::results(&mut s.client, &s.name, "paid", 2, &filter).unwrap().rows.len(), 1);
    // A rollback makes version 1 live again.
    let (switch, seq) = pg::switch_version(&mut other, &s.name, "paid", None, "op", "test").unwrap().unwrap();
    assert_eq!((switch.from, switch.to, seq), (Some(2), 1, 4));
    assert_eq!(pg::live_version(&mut other, &s.name, "paid").unwrap(), Some(1));
}

#[test]
fn a_pause_holds_the_rows_of_every_worker_and_a_resume_publishes_them() {
    let mut s = Schema::new("pause");
    let c = Contract::parse("paid.toml", CONTRACT).unwrap();
    let identity = (c.pipeline.version, c.text_hash);
    register(&mut s.client, &s.name, &c);
    let mut other = pg::connect(&url()).unwrap();
    // Two workers, a partition each.
    let a = pg::claim(&mut s.client, &s.name, "paid", 0, "worker-a", identity).unwrap();
    let b = pg::claim(&mut other, &s.name, "paid", 1, "worker-b", identity).unwrap();
    let (mut ea, mut eb) = (Engine::new(&c, Mode::Stream, 1).unwrap(), Engine::new(&c, Mode::Stream, 1).unwrap());
    ea.track_changes();
    eb.track_changes();
    let out = feed(&mut ea, 0, 0, &[event(1, 1, 0, "1.00")]);
    commit_as(&mut s.client, &s.name, &mut ea, &out, (0, a.generation, a.run), 1, &c).unwrap();
    let published = |client: &mut postgres::Client| {
        let f = weir_store::rows::ResultFilter { limit: 100, ..Default::default() };
        let results = pg::results(client, &s.name, "paid", 1, &f).unwrap().rows;
        (pg::changes(client, &s.name, "paid", None, 1, 100).unwrap().len(), results)
    };
    let mut reader = pg::connect(&url()).unwrap();
    let (changes_before, results_before) = published(&mut reader);
    assert_eq!(changes_before, 1);

    assert!(!pg::pause(&mut reader, &s.name, "paid").unwrap(), "it was not paused");
    assert!(pg::pause(&mut reader, &s.name, "paid").unwrap(), "pausing twice says it was paused");
    assert!(pg::is_paused(&mut reader, &s.name, "paid").unwrap());
    // Both workers go on committing; nothing of it is readable.
    let out = feed(&mut ea, 0, 1, &[event(2, 1, 1, "2.00")]);
    commit_as(&mut s.client, &s.name, &mut ea, &out, (0, a.generation, a.run), 2, &c).unwrap();
    let out = feed(&mut eb, 1, 0, &[event(3, 2, 0, "5.00")]);
    commit_as(&mut other, &s.name, &mut eb, &out, (1, b.generation, b.run), 1, &c).unwrap();
    assert_eq!(published(&mut reader), (changes_before, results_before.clone()), "nothing published while paused");
    // The sink and the dashboard read the same change stream.
    assert!(pg::latest_changes(&mut reader, &s.name, "paid", 1, 10).unwrap().len() == 1);

    assert!(pg::resume(&mut reader, &s.name, "paid").unwrap(), "it was paused");
    assert!(!pg::resume(&mut reader, &s.name, "paid").unwrap(), "resuming twice says it was not");
    let (changes, results) = published(&mut reader);
    assert_eq!(changes, 3, "every row held is published, in seq order");
    assert_eq!(results.len(), 2);
    assert!(results.iter().any(|r| r.contains("\"revision\":2") && r.contains("3.00")), "{results:?}");
    assert!(results.iter().any(|r| r.contains("5.00")), "{results:?}");
}

/// How Postgres stores `state_ids.data`: `e` (external) is as it is, `x` compressed.
/// How the id and window batches' `data` is stored ("e": as it is, not compressed).
fn batch_storage(s: &mut Schema) -> [String; 2] {
    ["state_ids", "state_window_batches"].map(|table| {
        let sql = format!(
            "SELECT attstorage::TEXT FROM pg_attribute WHERE attrelid = '{}.{table}'::regclass AND attname = 'data'",
            s.name
        );
        s.client.query_one(&sql, &[]).unwrap().get(0)
    })
}

#[test]
fn id_and_window_batches_are_stored_uncompressed_in_a_new_schema() {
    let mut s = Schema::new("idstorage");
    assert_eq!(batch_storage(&mut s), ["e", "e"]);
    // Starting again on it changes nothing.
    pg::migrate(&mut s.client, &s.name).unwrap();
    assert_eq!(batch_storage(&mut s), ["e", "e"]);
}

#[test]
fn a_worker_starting_while_another_writes_rows_and_ledger_takes_no_lock_on_them() {
    let s = Schema::new("startlocks");
    // Another worker's checkpoint, between its rows and its ledger entries.
    let mut writer = pg::connect(&url()).unwrap();
    let mut tx = writer.transaction().unwrap();
    tx.batch_execute(&format!("LOCK TABLE {0}.changes, {0}.ledger IN ROW EXCLUSIVE MODE", s.name)).unwrap();
    // A worker starting now migrates the current schema: it must not wait for
    // either table (waiting there deadlocked with such a checkpoint).
    let mut starting = pg::connect(&url()).unwrap();
    starting.batch_execute("SET lock_timeout = '2s'").unwrap();
    let migrated = pg::migrate(&mut starting, &s.name);
    tx.rollback().unwrap();
    migrated.unwrap_or_else(|e| panic!("migrating a current schema waited for a checkpoint's tables: {e}"));
    // An index that is missing is still made.
    starting.batch_execute(&format!("DROP INDEX {}.changes_by_version", s.name)).unwrap();
    pg::migrate(&mut starting, &s.name).unwrap();
    let found: i64 = starting
        .query_one(
            "SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND indexname = 'changes_by_version'",
            &[&s.name],
        )
        .unwrap()
        .get(0);
    assert_eq!(found, 1);
}

#[test]
fn a_version_2_schema_is_migrated_and_generations_go_on_above_the_old_ones() {
    let mut s = Schema::new("migrate3");
    let c = Contract::parse("paid.toml", CONTRACT).unwrap();
    // Make the schema look like version 2 with a partition at generation 7
    // (its `results` a table, which the schema makes again).
    s.client
        .batch_execute(&format!(
            "DROP SEQUENCE {0}.generations; DROP VIEW {0}.results, {0}.held_results;
             DROP TABLE {0}.pauses, {0}.replays, {0}.annotations;
             ALTER TABLE {0}.partitions DROP COLUMN version, DROP COLUMN text_hash, DROP COLUMN replayed;
             UPDATE {0}.meta SET value = '2' WHERE key = 'schema_version';
             INSERT INTO {0}.pipelines (name, version, text_hash) VALUES ('paid', 1, '{1:016x}');
             INSERT INTO {0}.partitions (pipeline, partition, generation, owner) VALUES ('paid', 0, 7, 'old');",
            s.name, c.text_hash
        ))
        .unwrap();
    s.migrated_to_this_version();
    assert_eq!(batch_storage(&mut s), ["e", "e"], "a migrated schema stores id and window batches uncompressed");
    let claim = pg::claim(&mut s.client, &s.name, "paid", 0, "new", (1, c.text_hash)).unwrap();
    assert!(claim.generation > 7, "{}", claim.generation);
    let other = pg::claim(&mut s.client, &s.name, "paid", 1, "new", (1, c.text_hash)).unwrap();
    assert!(other.generation > claim.generation);
}

#[test]
fn point_7_personal_fields_are_stored_masked_and_the_raw_entry_only_for_its_role() {
    let mut s = Schema::new("masked");
    pg::grant_roles(&mut s.client, &s.name).unwrap();
    let text =
        CONTRACT.replace("[window]", "[privacy]\npersonal = [\"email\"]\n\n[dedup]\nhorizon = \"1h\"\n\n[window]");
    let c = Contract::parse("paid.toml", &text).unwrap();
    register(&mut s.client, &s.name, &c);
    let a = pg::claim(&mut s.client, &s.name, "paid", 3, "worker-a", (c.pipeline.version, c.text_hash)).unwrap();
    let mut engine = Engine::new(&c, Mode::Stream, 1).unwrap();
    engine.track_changes();
    let with_email =
        |id: u32, amount: &str| event(id, 1, 0, amount).replace("}", r#","email":"eve.secret@example.com"}"#);
    // Two duplicates: two ledger entries carrying the e-mail address.
    let events = [with_email(1, "1.00"), with_email(1, "1.00"), with_email(1, "1.00")];
    let out = feed(&mut engine, 3, 0, &events);
    assert_eq!(out.ledger.len(), 2);
    commit_as(&mut s.client, &s.name, &mut engine, &out, (3, a.generation, a.run), 3, &c).unwrap();

    let secret = "eve.secret@example.com";
    let stored: Vec<String> = s
        .client
        .query(&format!("SELECT entry FROM {}.ledger ORDER BY seq", s.name), &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(stored.len(), 2);
    for e in &stored {
        assert!(!e.contains(secret) && e.contains("(personal)"), "{e}");
    }
    let everyone = pg::ledger(&mut s.client, &s.name, "paid", Some(1), None, (1, 10), false).unwrap();
    assert!(everyone.iter().all(|e| !e.contains(secret)), "{everyone:?}");
    let raw = pg::ledger(&mut s.client, &s.name, "paid", Some(1), None, (1, 10), true).unwrap();
    assert!(raw.len() == 2 && raw.iter().all(|e| e.contains(secret)), "{raw:?}");

    // The raw table is the raw-reader role's alone.
    let may = |client: &mut postgres::Client, role: &str, table: &str| -> bool {
        let q = "SELECT has_table_privilege($1, $2, 'SELECT')";
        client.query_one(q, &[&role, &format!("{}.{table}", s.name)]).unwrap().get(0)
    };
    let (reader, raw_reader) = (format!("{}_reader", s.name), format!("{}_raw_reader", s.name));
    assert!(may(&mut s.client, &reader, "ledger") && may(&mut s.client, &reader, "results"));
    assert!(!may(&mut s.client, &reader, "ledger_raw"));
    assert!(may(&mut s.client, &raw_reader, "ledger_raw"));

    // Entries stored whole before the contract named the field are masked at the next start.
    let whole = raw[0].replace("\"seq\":1,", "\"seq\":99,");
    let insert = format!("INSERT INTO {}.ledger VALUES ('paid', 99, 3, 'duplicate', $1, $2, false, 1)", s.name);
    s.client.execute(&insert, &[&whole, &weir_log::now_ms()]).unwrap();
    let privacy = weir_store::privacy::Privacy::of(&c);
    assert_eq!(pg::mask_ledger(&mut s.client, &s.name, "paid", &privacy).unwrap(), 1);
    assert_eq!(pg::mask_ledger(&mut s.client, &s.name, "paid", &privacy).unwrap(), 0, "masked once");
    // The next start reads only the entries written since the last one masked.
    let q = format!("SELECT through_seq FROM {}.ledger_masked WHERE pipeline = 'paid'", s.name);
    assert_eq!(s.client.query_one(&q, &[]).unwrap().get::<_, i64>(0), 99);
    let everyone = pg::ledger(&mut s.client, &s.name, "paid", Some(1), None, (1, 10), false).unwrap();
    assert!(everyone.len() == 3 && everyone.iter().all(|e| !e.contains(secret)), "{everyone:?}");

    // Retention erases the raw entries with the payloads.
    assert_eq!(pg::erase_ledger_payloads(&mut s.client, &s.name, "paid", i64::MAX).unwrap(), 3);
    let left: i64 = s.client.query_one(&format!("SELECT count(*) FROM {}.ledger_raw", s.name), &[]).unwrap().get(0);
    assert_eq!(left, 0);
    let erased = pg::ledger(&mut s.client, &s.name, "paid", Some(1), None, (1, 10), true).unwrap();
    for e in &erased {
        let v: serde_json::Value = serde_json::from_str(e).unwrap();
        assert!(v.get("payload").is_none() && v["detail"] == weir_store::rows::ERASED_DETAIL, "{e}");
    }
    for role in [reader, raw_reader] {
        s.client
            .batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE; DROP ROLE IF EXISTS {role}", s.name))
            .unwrap();
    }
}

#[test]
fn point_4_provenance_reads_each_rows_previous_as_written_and_older_rows_are_named_when_migrated() {
    let mut s = Schema::new("place");
    let c = Contract::parse("paid.toml", &format!("{CONTRACT}\n[dedup]\nhorizon = \"1h\"\n")).unwrap();
    register(&mut s.client, &s.name, &c);
    let claim = pg::claim(&mut s.client, &s.name, "paid", 3, "w", (1, c.text_hash)).unwrap();
    let mut engine = Engine::new(&c, Mode::Stream, 1).unwrap();
    engine.track_changes();
    // Two accounts, two revisions of a1's first window, and a duplicate of a1 and of a2.
    let events = [
        event(1, 1, 0, "1.00"),
        event(2, 2, 1, "2.00"),
        event(1, 1, 0, "1.00"),
        event(3, 1, 2, "4.00"),
        event(2, 2, 1, "2.00"),
        event(4, 1, 70, "8.00"),
    ];
    let out = feed(&mut engine, 3, 0, &events);
    let at = (3, claim.generation, claim.run);
    commit_as(&mut s.client, &s.name, &mut engine, &out, at, 6, &c).unwrap();
    // a1's first window again in a later checkpoint (seq 5, its previous
    // from `results`), then twice while paused (seq 6 from `results`,
    // seq 7 from `held_results`).
    let out = feed(&mut engine, 3, 6, &[event(5, 1, 3, "16.00")]);
    commit_as(&mut s.client, &s.name, &mut engine, &out, at, 7, &c).unwrap();
    assert!(!pg::pause(&mut s.client, &s.name, "paid").unwrap());
    for (i, id) in [6, 7].into_iter().enumerate() {
        let out = feed(&mut engine, 3, 7 + i as u64, &[event(id, 1, 4, "32.00")]);
        commit_as(&mut s.client, &s.name, &mut engine, &out, at, 8 + i as u64, &c).unwrap();
    }
    assert!(pg::resume(&mut s.client, &s.name, "paid").unwrap());
    let read = |client: &mut postgres::Client, table: &str, column: &str| -> Vec<Option<i64>> {
        let sql = format!("SELECT {column} FROM {}.{table} WHERE pipeline = 'paid' ORDER BY seq", s.name);
        client.query(&sql, &[]).unwrap().iter().map(|r| r.get(0)).collect()
    };
    let a1 = weir_store::rows::place(&weir_engine::encode_key([weir_engine::KeyValue::Str("a1")]));
    let a2 = weir_store::rows::place(&weir_engine::encode_key([weir_engine::KeyValue::Str("a2")]));
    let rows = read(&mut s.client, "changes", "place");
    let entries = read(&mut s.client, "ledger", "place");
    let previous = read(&mut s.client, "changes", "previous");
    assert_eq!(rows, [Some(a1), Some(a2), Some(a1), Some(a1), Some(a1), Some(a1), Some(a1)], "each row's key's place");
    assert_eq!(entries, [Some(a1), Some(a2)], "each duplicate's key's place");
    assert_eq!(previous, [None, None, Some(1), None, Some(3), Some(5), Some(6)], "each row's previous");
    // a1's first window, revision 2 (seq 3): its previous is seq 1, and its duplicate.
    let origin = pg::row_origin(&mut s.client, &s.name, "paid", 3).unwrap().unwrap();
    assert_eq!(origin.previous.as_ref().map(|p| (p.0, p.1["revision"].as_i64())), Some((1, Some(1))));
    assert_eq!(origin.ledgered, [("duplicate".to_owned(), 1)]);
    let held = pg::row_origin(&mut s.client, &s.name, "paid", 7).unwrap().unwrap();
    assert_eq!(held.previous.as_ref().map(|p| (p.0, p.1["revision"].as_i64())), Some((6, Some(4))));

    // The same as version 4 stored it, without places or previous rows,
    // and with `results` and `held_results` tables of the rows' texts:
    // migrated, each has its place and its previous again.
    s.client
        .batch_execute(&format!(
            "UPDATE {0}.changes SET place = NULL, previous = NULL; UPDATE {0}.ledger SET place = NULL;
             CREATE TABLE {0}.results_v4 AS SELECT * FROM {0}.results;
             CREATE TABLE {0}.held_results_v4 AS SELECT * FROM {0}.held_results;
             DROP VIEW {0}.results, {0}.held_results; DELETE FROM {0}.latest; DELETE FROM {0}.held_latest;
             ALTER TABLE {0}.results_v4 RENAME TO results; ALTER TABLE {0}.held_results_v4 RENAME TO held_results;
             ALTER TABLE {0}.results ADD PRIMARY KEY (pipeline, version, key, window_start);
             UPDATE {0}.meta SET value = '4' WHERE key = 'schema_version';",
            s.name
        ))
        .unwrap();
    let all = weir_store::rows::ResultFilter { limit: 100, ..Default::default() };
    let results_before = pg::results(&mut s.client, &s.name, "paid", 1, &all).unwrap().rows;
    assert_eq!(results_before.len(), 3, "a1's two windows and a2's: {results_before:?}");
    pg::migrate(&mut s.client, &s.name).unwrap();
    // `latest` is keyed by window start before key, and `results` holds the
    // same rows, named by their seqs (no text kept: each is its change's).
    let keyed: Vec<String> = s
        .client
        .query(
            "SELECT a.attname::TEXT FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid
              WHERE i.indrelid = $1::TEXT::regclass AND i.indisprimary AND a.attnum = ANY(i.indkey)
              ORDER BY array_position(i.indkey::INT2[], a.attnum)",
            &[&format!("{}.latest", s.name)],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(keyed, ["pipeline", "version", "window_start", "key"]);
    let results_after = pg::results(&mut s.client, &s.name, "paid", 1, &all).unwrap().rows;
    assert_eq!(results_after, results_before);
    let kept: i64 = s
        .client
        .query_one(&format!("SELECT count(*) FROM {}.latest WHERE seq IS NULL OR row IS NOT NULL", s.name), &[])
        .unwrap()
        .get(0);
    assert_eq!(kept, 0, "every row named by its seq, no text kept");
    assert_eq!(read(&mut s.client, "changes", "place"), rows);
    assert_eq!(read(&mut s.client, "ledger", "place"), entries);
    assert_eq!(read(&mut s.client, "changes", "previous"), previous);
    let again = pg::row_origin(&mut s.client, &s.name, "paid", 3).unwrap().unwrap();
    assert_eq!((again.previous, again.ledgered), (origin.previous, origin.ledgered));
}

#[test]
fn a_version_9_schemas_results_are_named_by_seq_and_read_the_same() {
    let mut s = Schema::new("migrate10");
    let kind: i8 = s
        .client
        .query_one(&format!("SELECT relkind FROM pg_class WHERE oid = '{}.results'::regclass", s.name), &[])
        .unwrap()
        .get(0);
    assert_eq!(kind, b'v' as i8, "a new schema reads its results through a view");
    // `results` and `held_results` as version 9 stored them: the row's
    // text in each. Window 1's is its change's (seq 2); window 2's names
    // seq 3, whose change has another text; window 3's has no seq; the
    // held row is seq 4's.
    let text = |seq: i64, total: &str| format!(r#"{{"seq":{seq},"pipeline":"paid","values":{{"total":{total}}}}}"#);
    let table = |name: &str| {
        format!(
            "CREATE TABLE {}.{name} (
                 pipeline TEXT NOT NULL, version INTEGER NOT NULL, key BYTEA NOT NULL, window_start BIGINT NOT NULL,
                 window_end BIGINT, status TEXT NOT NULL, revision BIGINT NOT NULL, row TEXT NOT NULL,
                 PRIMARY KEY (pipeline, version, window_start, key));",
            s.name
        )
    };
    let old = format!(
        "DROP VIEW {0}.results, {0}.held_results; {1} {2}
         INSERT INTO {0}.pipelines (name, version, text_hash) VALUES ('paid', 1, '');
         INSERT INTO {0}.pauses VALUES ('paid', 4, 0);
         UPDATE {0}.meta SET value = '9' WHERE key = 'schema_version';",
        s.name,
        table("results"),
        table("held_results")
    );
    s.client.batch_execute(&old).unwrap();
    for (seq, total) in [(1i64, "1"), (2, "3"), (3, "5"), (4, "7")] {
        let sql = format!(
            "INSERT INTO {}.changes (pipeline, seq, partition, row, at_ms, run, sources, version)
             VALUES ('paid', $1, 0, $2, 0, 0, '[]', 1)",
            s.name
        );
        s.client.execute(&sql, &[&seq, &text(seq, total)]).unwrap();
    }
    let stored = [(1i64, text(2, "3")), (2, text(3, "4")), (3, "{}".to_owned())];
    for (window, row) in &stored {
        let sql =
            format!("INSERT INTO {}.results VALUES ('paid', 1, '\\x01', $1, $1::BIGINT + 1, 'settled', 1, $2)", s.name);
        s.client.execute(&sql, &[window, row]).unwrap();
    }
    let sql = format!("INSERT INTO {}.held_results VALUES ('paid', 1, '\\x01', 1, 2, 'provisional', 2, $1)", s.name);
    s.client.execute(&sql, &[&text(4, "7")]).unwrap();
    s.migrated_to_this_version();
    let mut named = |table: &str| -> Vec<(Option<i64>, Option<String>)> {
        let sql = format!("SELECT seq, row FROM {}.{table} ORDER BY window_start", s.name);
        s.client.query(&sql, &[]).unwrap().iter().map(|r| (r.get(0), r.get(1))).collect()
    };
    // Only the texts their changes do not hold are kept.
    assert_eq!(named("latest"), [(Some(2), None), (Some(3), Some(text(3, "4"))), (None, Some("{}".into()))]);
    assert_eq!(named("held_latest"), [(Some(4), None)]);
    let all = weir_store::rows::ResultFilter { limit: 10, ..Default::default() };
    let page = pg::results(&mut s.client, &s.name, "paid", 1, &all).unwrap();
    assert_eq!(page.rows, stored.iter().map(|(_, row)| row.clone()).collect::<Vec<_>>(), "the same texts");
    // A resume publishes the held row by its seq.
    assert!(pg::resume(&mut s.client, &s.name, "paid").unwrap());
    let page = pg::results(&mut s.client, &s.name, "paid", 1, &all).unwrap();
    assert_eq!(page.rows[0], text(4, "7"));
    assert_eq!(pg::max_revision(&mut s.client, &s.name, "paid", 1).unwrap(), 2);
}

#[test]
fn windows_written_as_batches_restore_the_same_before_and_after_a_fold() {
    let mut s = Schema::new("window_batches");
    let c = Contract::parse("paid.toml", CONTRACT).unwrap();
    let identity = (c.pipeline.version, c.text_hash);
    register(&mut s.client, &s.name, &c);
    let mut claim = pg::claim(&mut s.client, &s.name, "paid", 3, "worker-a", identity).unwrap();
    let engine = Engine::new(&c, Mode::Stream, 1).unwrap();
    let privacy = weir_store::privacy::Privacy::of(&c);
    let count = |client: &mut postgres::Client, table: &str| -> i64 {
        client.query_one(&format!("SELECT count(*) FROM {}.{table}", s.name), &[]).unwrap().get(0)
    };
    let fold_at = weir_store::window_batches::FOLD_BATCHES as u64;
    let mut other = pg::connect(&url()).unwrap();
    for i in 1..=fold_at + 50 {
        let delta = weir_engine::Delta {
            header: i.to_le_bytes().to_vec(),
            windows: common::window_changes(i),
            ids: Vec::new(),
            ids_keep_until: 0,
            forget_ids_through: 0,
        };
        let w = pg::PartitionWrite {
            pipeline: "paid",
            partition: 3,
            generation: claim.generation,
            version: c.pipeline.version,
            text_hash: c.text_hash,
            format: engine.format(),
            out: &Output::default(),
            delta,
            next_offset: i,
            now_ms: weir_log::now_ms(),
            run: claim.run,
            replay: None,
            privacy: &privacy,
        };
        pg::checkpoint(&mut s.client, &s.name, w).unwrap();
        if [1, 600, fold_at - 1, fold_at, fold_at + 50].contains(&i) {
            // Another worker's claim restores what this one wrote; this one then claims back.
            let taken = pg::claim(&mut other, &s.name, "paid", 3, "worker-b", identity).unwrap();
            let mut windows = taken.checkpoint.unwrap().windows;
            windows.sort();
            assert_eq!(windows, common::windows_after(i), "after checkpoint {i}");
            let back = pg::claim(&mut s.client, &s.name, "paid", 3, "worker-a", identity).unwrap();
            assert!(back.generation > taken.generation);
            claim = back;
        }
        // Nothing folded before the bound; then each fold takes the oldest
        // FOLD_STEP_BATCHES (these are small), writes only the windows no
        // later batch changed and deletes the batches it took.
        let counts = (count(&mut s.client, "state_window_batches"), count(&mut s.client, "state_windows"));
        let step = weir_store::window_batches::FOLD_STEP_BATCHES as u64;
        if i < fold_at {
            assert_eq!(counts, (i as i64, 0));
        }
        if i == fold_at {
            let settled = common::windows_last_changed_through(step, fold_at).len() as i64;
            assert!(settled >= 20, "the first fold has windows to write");
            assert_eq!(counts, ((fold_at - step) as i64, settled));
        }
        if i == fold_at + 50 {
            assert_eq!(counts.0, (fold_at + 50 - step) as i64);
        }
    }
}

//! `Idempotency-Key` (SPEC.md 7): a POST of events with a key is done at
//! most once. Each key (per topic, and per token: the server stores it as
//! `TOKEN_ID/KEY`) keeps the SHA-256 of its body and, once the
//! events are durable, the answer given; a repeat within 24 hours with the
//! same body gets that answer again, with another body a 422.
//!
//! A key is stored as `pending`, with where each partition of the topic
//! ended (on the embedded log) and the time, before its events are
//! appended, and as `done` with the answer after. The records appended
//! carry the request's tag (a hash of the stored key: the log's record tag,
//! Kafka's `weir-request` header). A key found `pending` belongs to an
//! attempt a crash cut short: the caller looks past those ends (on Kafka,
//! from that time) for the records with its tag, and appends only the rest.

use rusqlite::{params, Connection, OptionalExtension};

/// How long a key is remembered.
pub const KEEP_MS: i64 = 24 * 3600 * 1000;

pub(crate) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS idempotency (
    topic TEXT NOT NULL, key TEXT NOT NULL, body_hash TEXT NOT NULL, state TEXT NOT NULL,
    starts TEXT NOT NULL, answer TEXT, at_ms INTEGER NOT NULL,
    PRIMARY KEY (topic, key)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idempotency_at ON idempotency (at_ms);
";

/// Keys past [`KEEP_MS`] forgotten by each request that carries a key: a
/// few at a time, found by the time index, so no request scans the table
/// inside the write lock.
pub const PURGED_AT_ONCE: i64 = 64;

/// What a key's record says about a request that carries it.
#[derive(Debug, PartialEq, Eq)]
pub enum Found {
    /// Never seen (or forgotten after 24 hours): now stored as pending.
    New,
    /// Done before: the answer given then (when the body is the same).
    Done { same_body: bool, answer: String },
    /// An attempt a crash cut short: where each partition ended before it
    /// (on the embedded log), and when it began.
    Pending { same_body: bool, starts: Vec<u64>, at_ms: i64 },
}

/// Looks `key` up for a request whose body hashes to `body_hash`, storing
/// it as pending (with `starts`) when it is new. One transaction.
pub fn begin(
    conn: &Connection,
    topic: &str,
    key: &str,
    body_hash: &str,
    starts: &[u64],
    now_ms: i64,
) -> rusqlite::Result<Found> {
    let tx = conn.unchecked_transaction()?;
    tx.execute(
        "DELETE FROM idempotency WHERE (topic, key) IN
             (SELECT topic, key FROM idempotency WHERE at_ms < ?1 ORDER BY at_ms LIMIT ?2)",
        params![now_ms - KEEP_MS, PURGED_AT_ONCE],
    )?;
    let found: Option<(String, String, String, Option<String>, i64)> = tx
        .query_row(
            "SELECT body_hash, state, starts, answer, at_ms FROM idempotency WHERE topic = ?1 AND key = ?2",
            params![topic, key],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
        )
        .optional()?;
    let result = match found {
        Some((hash, state, stored_starts, answer, at_ms)) => {
            let same_body = hash == body_hash;
            match (state.as_str(), answer) {
                ("done", Some(answer)) => Found::Done { same_body, answer },
                _ => {
                    let starts = serde_json::from_str(&stored_starts).unwrap_or_default();
                    Found::Pending { same_body, starts, at_ms }
                }
            }
        }
        None => {
            let starts = serde_json::to_string(starts).unwrap_or_else(|_| "[]".into());
            tx.execute(
                "INSERT INTO idempotency (topic, key, body_hash, state, starts, at_ms) VALUES (?1, ?2, ?3, 'pending', ?4, ?5)",
                params![topic, key, body_hash, starts, now_ms],
            )?;
            Found::New
        }
    };
    tx.commit()?;
    Ok(result)
}

/// The events are durable: a repeat gets `answer`.
pub fn finish(conn: &Connection, topic: &str, key: &str, answer: &str) -> rusqlite::Result<()> {
    conn.execute(
        "UPDATE idempotency SET state = 'done', answer = ?3 WHERE topic = ?1 AND key = ?2",
        params![topic, key, answer],
    )?;
    Ok(())
}

/// Nothing was appended (the log refused it): the key is free again.
pub fn forget(conn: &Connection, topic: &str, key: &str) -> rusqlite::Result<()> {
    conn.execute("DELETE FROM idempotency WHERE topic = ?1 AND key = ?2 AND state = 'pending'", params![topic, key])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_new_then_pending_then_done_and_forgotten_after_a_day() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(SCHEMA).unwrap();
        assert_eq!(begin(&conn, "t", "k1", "h1", &[3, 4], 1_000).unwrap(), Found::New);
        assert_eq!(
            begin(&conn, "t", "k1", "h1", &[9, 9], 2_000).unwrap(),
            Found::Pending { same_body: true, starts: vec![3, 4], at_ms: 1_000 }
        );
        finish(&conn, "t", "k1", "{\"accepted\":2}").unwrap();
        assert_eq!(
            begin(&conn, "t", "k1", "h1", &[], 3_000).unwrap(),
            Found::Done { same_body: true, answer: "{\"accepted\":2}".into() }
        );
        assert!(matches!(begin(&conn, "t", "k1", "h2", &[], 3_000).unwrap(), Found::Done { same_body: false, .. }));
        assert_eq!(begin(&conn, "other", "k1", "h2", &[], 3_000).unwrap(), Found::New, "keys are per topic");
        assert_eq!(begin(&conn, "t", "k1", "h2", &[], 1_000 + KEEP_MS + 1).unwrap(), Found::New, "a day later");
        forget(&conn, "t", "k1").unwrap();
        assert_eq!(begin(&conn, "t", "k1", "h3", &[], 1_000 + KEEP_MS + 2).unwrap(), Found::New);
    }

    /// Issue 42, finding 6: a request forgets old keys a few at a time,
    /// through the time index, not the whole table at once.
    #[test]
    fn old_keys_are_forgotten_a_few_at_a_time_through_the_time_index() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(SCHEMA).unwrap();
        for i in 0..200 {
            begin(&conn, "t", &format!("old{i}"), "h", &[], 1_000 + i).unwrap();
        }
        let count = || conn.query_row("SELECT count(*) FROM idempotency", [], |r| r.get::<_, i64>(0)).unwrap();
        let later = 1_000 + KEEP_MS + 1_000;
        begin(&conn, "t", "new1", "h", &[], later).unwrap();
        assert_eq!(count(), 200 - PURGED_AT_ONCE + 1);
        for i in 2..=4 {
            begin(&conn, "t", &format!("new{i}"), "h", &[], later).unwrap();
        }
        assert_eq!(count(), 4, "the old keys are gone, the new ones stay");
        let plan: String = conn
            .query_row(
                "EXPLAIN QUERY PLAN SELECT topic, key FROM idempotency WHERE at_ms < 5 ORDER BY at_ms LIMIT 64",
                [],
                |r| r.get(3),
            )
            .unwrap();
        assert!(plan.contains("idempotency_at"), "{plan}");
    }
}

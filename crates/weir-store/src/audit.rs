//! The audit log: token changes, operator actions, contract changes,
//! replays and raw reads, each with who, when, what, why and from where.
//!
//! It is append-only (SQLite triggers refuse updates and deletes) and
//! tamper-evident: every entry stores `hash = SHA-256(prev_hash "\n"
//! content)`, where `content` is the JSON array `[seq, at_ms, who, action,
//! pipeline, detail, why, origin]` and `prev_hash` is the hash of the entry
//! before it (64 zeros for the first). Changing, removing or inserting an
//! entry breaks the chain at that entry, which [`verify`] names. Removing
//! entries from the end leaves a shorter valid chain: `weir audit verify`
//! prints the count and the last hash so they can be kept elsewhere and
//! compared (`--expect-head`).

use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};

use crate::digest::sha256_hex;

const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// One entry to append.
pub struct Entry<'a> {
    pub who: &'a str,
    pub action: &'a str,
    pub pipeline: Option<&'a str>,
    pub detail: &'a serde_json::Value,
    pub why: &'a str,
    /// Where the action came from: the client's address, or `cli (user)`.
    pub origin: &'a str,
}

#[allow(clippy::too_many_arguments)]
fn content(
    seq: i64,
    at_ms: i64,
    who: &str,
    action: &str,
    pipeline: Option<&str>,
    detail: &str,
    why: &str,
    origin: &str,
) -> String {
    serde_json::json!([seq, at_ms, who, action, pipeline, detail, why, origin]).to_string()
}

/// The content of a row whose first columns are `seq, at_ms, who, action,
/// pipeline, detail, why, origin`.
fn row_content(r: &rusqlite::Row<'_>) -> rusqlite::Result<String> {
    Ok(content(
        r.get(0)?,
        r.get(1)?,
        &r.get::<_, String>(2)?,
        &r.get::<_, String>(3)?,
        r.get::<_, Option<String>>(4)?.as_deref(),
        &r.get::<_, String>(5)?,
        &r.get::<_, String>(6)?,
        &r.get::<_, String>(7)?,
    ))
}

fn chained(prev: &str, content: &str) -> String {
    sha256_hex(format!("{prev}\n{content}").as_bytes())
}

/// Appends an entry; returns its `seq`. Runs in a transaction of its own
/// (or the caller's), so two appends never chain to the same entry.
pub fn append(conn: &Connection, e: &Entry<'_>) -> rusqlite::Result<i64> {
    // Rolled back when dropped before its commit.
    let own = match conn.is_autocommit() {
        true => Some(Transaction::new_unchecked(conn, TransactionBehavior::Immediate)?),
        false => None,
    };
    let (last, prev): (i64, String) = conn.query_row(
        "SELECT coalesce(max(seq), 0), coalesce((SELECT hash FROM audit ORDER BY seq DESC LIMIT 1), ?1) FROM audit",
        [GENESIS],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let seq = last + 1;
    let at_ms = weir_log::now_ms();
    let detail = e.detail.to_string();
    let hash = chained(&prev, &content(seq, at_ms, e.who, e.action, e.pipeline, &detail, e.why, e.origin));
    conn.execute(
        "INSERT INTO audit (seq, at_ms, who, action, pipeline, detail, why, origin, prev_hash, hash)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        params![seq, at_ms, e.who, e.action, e.pipeline, detail, e.why, e.origin, prev, hash],
    )?;
    if let Some(tx) = own {
        tx.commit()?;
    }
    Ok(seq)
}

/// The audit log from `since`, as JSON lines.
pub fn log(conn: &Connection, since: i64, limit: i64) -> rusqlite::Result<Vec<String>> {
    let mut stmt = conn.prepare_cached(
        "SELECT seq, at_ms, who, action, pipeline, detail, why, origin, hash FROM audit WHERE seq >= ?1 ORDER BY seq LIMIT ?2",
    )?;
    let rows = stmt.query_map(params![since, limit], |r| {
        let detail: String = r.get(5)?;
        Ok(serde_json::json!({
            "seq": r.get::<_, i64>(0)?,
            "at": weir_engine::time::format_rfc3339_ms(r.get(1)?),
            "who": r.get::<_, String>(2)?,
            "action": r.get::<_, String>(3)?,
            "pipeline": r.get::<_, Option<String>>(4)?,
            "detail": serde_json::from_str::<serde_json::Value>(&detail).unwrap_or(serde_json::Value::Null),
            "why": r.get::<_, String>(6)?,
            "from": r.get::<_, String>(7)?,
            "hash": r.get::<_, String>(8)?,
        })
        .to_string())
    })?;
    rows.collect()
}

/// The newest `limit` entries, newest first.
pub fn latest(conn: &Connection, limit: i64) -> rusqlite::Result<Vec<String>> {
    let last: i64 = conn.query_row("SELECT coalesce(max(seq), 0) FROM audit", [], |r| r.get(0))?;
    let mut rows = log(conn, (last - limit + 1).max(1), limit)?;
    rows.reverse();
    Ok(rows)
}

/// A chain that holds: how many entries, and the last one's hash.
#[derive(Debug, PartialEq, Eq)]
pub struct Verified {
    pub entries: i64,
    pub head: String,
}

/// Where the chain breaks.
#[derive(Debug, PartialEq, Eq)]
pub struct Broken {
    pub seq: i64,
    pub why: String,
}

impl std::fmt::Display for Broken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "audit entry {}: {}", self.seq, self.why)
    }
}

/// Walks the chain from the first entry.
pub fn verify(conn: &Connection) -> rusqlite::Result<Result<Verified, Broken>> {
    let mut stmt = conn.prepare(
        "SELECT seq, at_ms, who, action, pipeline, detail, why, origin, prev_hash, hash FROM audit ORDER BY seq",
    )?;
    let mut rows = stmt.query([])?;
    let (mut expected_seq, mut prev, mut entries) = (1i64, GENESIS.to_owned(), 0i64);
    while let Some(r) = rows.next()? {
        let seq: i64 = r.get(0)?;
        let (stored_prev, hash): (String, String) = (r.get(8)?, r.get(9)?);
        if seq != expected_seq {
            return Ok(Err(Broken {
                seq,
                why: format!("entries {expected_seq} to {} are missing (removed)", seq - 1),
            }));
        }
        if stored_prev != prev {
            return Ok(Err(Broken {
                seq,
                why: "it does not chain to the entry before it (an entry before it was changed, removed or inserted)"
                    .into(),
            }));
        }
        if chained(&prev, &row_content(r)?) != hash {
            return Ok(Err(Broken {
                seq,
                why: "its content does not match its hash (it was changed after it was written)".into(),
            }));
        }
        prev = hash;
        expected_seq += 1;
        entries += 1;
    }
    Ok(Ok(Verified { entries, head: prev }))
}

/// Schema version 2 to 3: `audit` gains `origin` and the hash chain (the
/// entries already there are chained in order), and `tokens` is created.
pub(crate) fn migrate_to_chain(conn: &Connection) -> rusqlite::Result<()> {
    let tx = Transaction::new_unchecked(conn, TransactionBehavior::Immediate)?;
    let mut columns = Vec::new();
    {
        let mut stmt = conn.prepare("SELECT name FROM pragma_table_info('audit')")?;
        let names = stmt.query_map([], |r| r.get::<_, String>(0))?;
        for n in names {
            columns.push(n?);
        }
    }
    for column in ["origin", "prev_hash", "hash"] {
        if !columns.iter().any(|c| c == column) {
            conn.execute_batch(&format!("ALTER TABLE audit ADD COLUMN {column} TEXT NOT NULL DEFAULT ''"))?;
        }
    }
    conn.execute_batch("DROP TRIGGER IF EXISTS audit_append_only_update")?;
    let mut prev = GENESIS.to_owned();
    let old: Vec<(i64, String)> = {
        let mut stmt =
            conn.prepare("SELECT seq, at_ms, who, action, pipeline, detail, why, origin FROM audit ORDER BY seq")?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, i64>(0)?, row_content(r)?)))?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    for (seq, c) in old {
        let hash = chained(&prev, &c);
        conn.execute("UPDATE audit SET prev_hash = ?2, hash = ?3 WHERE seq = ?1", params![seq, prev, hash])?;
        prev = hash;
    }
    conn.execute_batch(
        "CREATE TRIGGER audit_append_only_update BEFORE UPDATE ON audit
             BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
         UPDATE meta SET value = '3' WHERE key = 'schema_version';",
    )?;
    tx.commit()
}

/// At start: a contract that is new, or whose version or text changed since
/// the last one the audit log saw, gets an entry (`contract-add`,
/// `contract-change`) with both versions and text hashes.
pub fn record_contracts(
    conn: &Connection,
    contracts: &[weir_contract::Contract],
    origin: &str,
) -> rusqlite::Result<()> {
    for c in contracts {
        let name = &c.pipeline.name;
        let last: Option<String> = conn
            .query_row(
                "SELECT detail FROM audit WHERE pipeline = ?1 AND action IN ('contract-add', 'contract-change')
                 ORDER BY seq DESC LIMIT 1",
                [name],
                |r| r.get(0),
            )
            .optional()?;
        let last: Option<serde_json::Value> = last.and_then(|d| serde_json::from_str(&d).ok());
        let hash = format!("{:016x}", c.text_hash);
        let (action, why) = match &last {
            None => ("contract-add", "a contract weir had not run before"),
            Some(d) if d["version"] == c.pipeline.version && d["text_hash"] == hash.as_str() => continue,
            Some(_) => (
                "contract-change",
                "the contract's file names another version: it is built beside the stored ones (SPEC.md 8)",
            ),
        };
        let mut detail = serde_json::json!({ "version": c.pipeline.version, "text_hash": hash });
        if let Some(d) = last {
            detail["was_version"] = d["version"].clone();
            detail["was_text_hash"] = d["text_hash"].clone();
        }
        let entry = Entry { who: "weir serve", action, pipeline: Some(name), detail: &detail, why, origin };
        append(conn, &entry)?;
    }
    Ok(())
}

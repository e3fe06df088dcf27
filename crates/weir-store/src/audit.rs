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
//! compared (`--expect-head`, or `--at SEQ:HASH` for any entry kept).
//!
//! With a key (weir.toml `audit_key_file`, kept outside the data folder)
//! the chain is an HMAC instead: `hash = HMAC-SHA-256(key, prev_hash "\n"
//! content)`, and the entry names the key by its id (`key_id`). Whoever can
//! edit `weir.db` but not read the key cannot recompute it. Once an entry
//! is keyed every later one must be: an unkeyed entry after a keyed one
//! breaks the chain. `weir.db` names the key's file and id (`meta`), so
//! every writer (the server, `weir token`) keys its entries with it, and an
//! entry that cannot be keyed (the file gone or changed) is not written,
//! and neither is the action it records.

use std::path::{Path, PathBuf};

use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};

use crate::digest::{hmac_sha256_hex, sha256_hex};

const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// One entry to append.
#[derive(Clone, Copy)]
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

fn chained(key: Option<&Key>, prev: &str, content: &str) -> String {
    let message = format!("{prev}\n{content}");
    match key {
        Some(k) => hmac_sha256_hex(&k.secret, message.as_bytes()),
        None => sha256_hex(message.as_bytes()),
    }
}

/// The shortest key accepted, in bytes.
pub const MIN_KEY_BYTES: usize = 32;

/// The audit log's HMAC key, read from its file.
pub struct Key {
    secret: Vec<u8>,
    /// Names the key in each entry it chains, without revealing it.
    pub id: String,
}

impl Key {
    /// Reads a key file: its bytes without trailing white space, at least
    /// [`MIN_KEY_BYTES`] of them.
    pub fn read(path: &Path) -> Result<Key, String> {
        let bytes = std::fs::read(path).map_err(|e| {
            format!(
                "cannot read the audit key file {}: {e}; check the path and that weir's user may read it",
                path.display()
            )
        })?;
        let end = bytes.iter().rposition(|b| !b.is_ascii_whitespace()).map_or(0, |i| i + 1);
        let secret = bytes[..end].to_vec();
        if secret.len() < MIN_KEY_BYTES {
            return Err(format!(
                "the audit key file {} holds {} bytes; a key needs at least {MIN_KEY_BYTES}: make one with `head -c 32 /dev/urandom | base64 > {}`",
                path.display(),
                secret.len(),
                path.display()
            ));
        }
        let id = sha256_hex(&[b"weir audit key\n".as_slice(), &secret].concat())[..16].to_owned();
        Ok(Key { secret, id })
    }

    /// Reads the key a server is configured with: the file must lie outside
    /// the data folder `data` and be readable by its owner only.
    pub fn load(path: &Path, data: &Path) -> Result<Key, String> {
        let file = std::fs::canonicalize(path).map_err(|e| {
            format!("cannot read the audit key file {}: {e}; check audit_key_file in weir.toml", path.display())
        })?;
        let folder = std::fs::canonicalize(data).unwrap_or_else(|_| data.to_path_buf());
        if file.starts_with(&folder) {
            return Err(format!(
                "the audit key file {} is inside the data folder {}: whoever can edit weir.db could read it there; keep it elsewhere (e.g. /etc/weir/audit.key) and point audit_key_file at it",
                path.display(),
                data.display()
            ));
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&file)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?
                .permissions()
                .mode();
            if mode & 0o077 != 0 {
                return Err(format!(
                    "the audit key file {} may be read by others (mode {:o}); run `chmod 600 {}`",
                    path.display(),
                    mode & 0o777,
                    path.display()
                ));
            }
        }
        Key::read(&file)
    }
}

/// The key `weir.db` says its new entries are chained with: none, or the
/// key its file holds, which must still be the one named.
fn current_key(conn: &Connection) -> rusqlite::Result<Option<Key>> {
    let Some((file, id)) = key_named(conn)? else { return Ok(None) };
    let refuse = |message: String| rusqlite::Error::ToSqlConversionFailure(message.into());
    let key = Key::read(&file).map_err(|e| refuse(format!("{e}; audited actions are refused until it can be read")))?;
    if key.id != id {
        return Err(refuse(format!(
            "the audit key file {} holds key {}, not the key {id} this audit log is chained with; put the key back, or restart weir serve to chain on with the new one",
            file.display(),
            key.id
        )));
    }
    Ok(Some(key))
}

/// The key file and key id `weir.db` names, if its log is keyed.
pub fn key_named(conn: &Connection) -> rusqlite::Result<Option<(PathBuf, String)>> {
    let get =
        |k: &str| conn.query_row("SELECT value FROM meta WHERE key = ?1", [k], |r| r.get::<_, String>(0)).optional();
    Ok(match (get("audit_key_file")?, get("audit_key_id")?) {
        (Some(file), Some(id)) => Some((PathBuf::from(file), id)),
        _ => None,
    })
}

/// Chains new entries with `key` from now on (a server's start): `weir.db`
/// names its file and id, and an `audit-key` entry, the first chained with
/// it, records the change. Nothing is written when the key is the one in use.
pub fn use_key(conn: &Connection, key: &Key, file: &Path, origin: &str) -> rusqlite::Result<()> {
    let tx = Transaction::new_unchecked(conn, TransactionBehavior::Immediate)?;
    let was = key_named(conn)?;
    let file = std::fs::canonicalize(file).unwrap_or_else(|_| file.to_path_buf());
    if let Some((f, id)) = &was {
        if *id == key.id && *f == file {
            return tx.commit();
        }
    }
    let path = file.to_string_lossy();
    for (k, v) in [("audit_key_file", path.as_ref()), ("audit_key_id", key.id.as_str())] {
        conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)", [k, v])?;
    }
    let detail = serde_json::json!({ "key_id": key.id, "file": path, "was_key_id": was.map(|w| w.1) });
    let why = "weir.toml names this audit_key_file: entries from here on are chained with it";
    append(conn, &Entry { who: "weir serve", action: "audit-key", pipeline: None, detail: &detail, why, origin })?;
    tx.commit()
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
    let key = current_key(conn)?;
    let content = content(seq, at_ms, e.who, e.action, e.pipeline, &detail, e.why, e.origin);
    let hash = chained(key.as_ref(), &prev, &content);
    let key_id = key.as_ref().map_or("", |k| k.id.as_str());
    conn.execute(
        "INSERT INTO audit (seq, at_ms, who, action, pipeline, detail, why, origin, prev_hash, hash, key_id)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
        params![seq, at_ms, e.who, e.action, e.pipeline, detail, e.why, e.origin, prev, hash, key_id],
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

/// A chain that holds: how many entries, the last one's hash, and the
/// first entry chained with a key.
#[derive(Debug, PartialEq, Eq)]
pub struct Verified {
    pub entries: i64,
    pub head: String,
    pub keyed_from: Option<i64>,
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

/// Walks the chain from the first entry; keyed entries are checked with
/// the one of `keys` they name.
pub fn verify(conn: &Connection, keys: &[Key]) -> rusqlite::Result<Result<Verified, Broken>> {
    let mut stmt = conn.prepare(
        "SELECT seq, at_ms, who, action, pipeline, detail, why, origin, prev_hash, hash, key_id FROM audit ORDER BY seq",
    )?;
    let mut rows = stmt.query([])?;
    let (mut expected_seq, mut prev, mut entries, mut keyed_from) = (1i64, GENESIS.to_owned(), 0i64, None);
    while let Some(r) = rows.next()? {
        let seq: i64 = r.get(0)?;
        let (stored_prev, hash, key_id): (String, String, String) = (r.get(8)?, r.get(9)?, r.get(10)?);
        let broken = |why: String| Ok(Err(Broken { seq, why }));
        if seq != expected_seq {
            return broken(format!("entries {expected_seq} to {} are missing (removed)", seq - 1));
        }
        if stored_prev != prev {
            return broken(
                "it does not chain to the entry before it (an entry before it was changed, removed or inserted)".into(),
            );
        }
        let key = match (key_id.as_str(), keyed_from) {
            ("", None) => None,
            ("", Some(first)) => {
                return broken(format!(
                    "it is not keyed, but entry {first} and those after it were: a keyed log never goes back to plain hashes (it was rewritten without the key)"
                ))
            }
            (id, _) => match keys.iter().find(|k| k.id == id) {
                Some(k) => Some(k),
                None => return broken(format!("it is chained with key {id}; give that key's file (--key) to check it")),
            },
        };
        if chained(key, &prev, &row_content(r)?) != hash {
            return broken("its content does not match its hash (it was changed after it was written)".into());
        }
        if key.is_some() && keyed_from.is_none() {
            keyed_from = Some(seq);
        }
        prev = hash;
        expected_seq += 1;
        entries += 1;
    }
    Ok(Ok(Verified { entries, head: prev, keyed_from }))
}

/// The stored hash of entry `seq`, if there is one.
pub fn hash_at(conn: &Connection, seq: i64) -> rusqlite::Result<Option<String>> {
    conn.query_row("SELECT hash FROM audit WHERE seq = ?1", [seq], |r| r.get(0)).optional()
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
        let hash = chained(None, &prev, &c);
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

//! Bearer tokens and roles (SECURITY.md has the table of what each role
//! may do).
//!
//! A token is `weir_<id>_<secret>`: the id (16 hex digits) names it in
//! `weir token list`, the audit log and metrics; the secret (48 hex digits,
//! 192 random bits) is shown once, when the token is made. Only the
//! SHA-256 of the secret is stored, in the `tokens` table of `weir.db`, and
//! every request looks its token up there, so a revocation or an expiry
//! takes effect on the next request, in every process sharing the data
//! folder.

use crate::digest::{hex, sha256_hex};
use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};

/// What a token may do; one role a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Appends events to its topics.
    Producer,
    /// Reads published results, changes, status and the ledger (without
    /// payloads) of its pipelines.
    Reader,
    /// Reads the events of its topics and the ledger, payloads included, of
    /// the pipelines reading them.
    RawReader,
    /// What a reader may, plus pause, resume, annotate and replay its pipelines.
    Operator,
    /// Tokens, the audit log and contracts; reads every pipeline's published data.
    Admin,
}

impl Role {
    pub const ALL: [Role; 5] = [Role::Producer, Role::Reader, Role::RawReader, Role::Operator, Role::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Producer => "producer",
            Role::Reader => "reader",
            Role::RawReader => "raw-reader",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A token's rights, as stored.
#[derive(Debug, Clone)]
pub struct Grant {
    pub id: String,
    /// Whom the token was made for (`--name`), for the audit log.
    pub name: String,
    pub role: Role,
    /// Topics (producer, raw-reader); `*` is every topic.
    pub topics: Vec<String>,
    /// Pipelines (reader, operator); `*` is every pipeline.
    pub pipelines: Vec<String>,
    pub created_ms: i64,
    pub expires_ms: Option<i64>,
    pub revoked_ms: Option<i64>,
}

fn named(list: &[String], name: &str) -> bool {
    list.iter().any(|x| x == "*" || x == name)
}

impl Grant {
    /// Who acted, for the audit log: the name and the token's id.
    pub fn who(&self) -> String {
        format!("{} (token {})", self.name, self.id)
    }

    pub fn may_produce(&self, topic: &str) -> bool {
        self.role == Role::Producer && named(&self.topics, topic)
    }

    /// Events of a topic, and ledger payloads of pipelines reading it.
    pub fn may_read_raw(&self, topic: &str) -> bool {
        self.role == Role::RawReader && named(&self.topics, topic)
    }

    /// Published rows, changes, status, provenance, annotations and the
    /// ledger without payloads.
    pub fn may_read(&self, pipeline: &str) -> bool {
        match self.role {
            Role::Admin => true,
            Role::Reader | Role::Operator => named(&self.pipelines, pipeline),
            Role::Producer | Role::RawReader => false,
        }
    }

    pub fn may_operate(&self, pipeline: &str) -> bool {
        self.role == Role::Operator && named(&self.pipelines, pipeline)
    }

    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }

    /// What the token may do, in words, for a 403.
    pub fn rights(&self) -> String {
        let list = |l: &[String]| if l.iter().any(|x| x == "*") { "every".to_owned() } else { format!("{l:?}") };
        match self.role {
            Role::Producer => format!("it may append events to topics {}", list(&self.topics)),
            Role::RawReader => {
                format!(
                    "it may read the events of topics {} and the ledgers of pipelines reading them",
                    list(&self.topics)
                )
            }
            Role::Reader => format!("it may read the published data of pipelines {}", list(&self.pipelines)),
            Role::Operator => {
                format!("it may read, pause, resume, annotate and replay pipelines {}", list(&self.pipelines))
            }
            Role::Admin => "it may manage tokens, read the audit log and read every pipeline's published data".into(),
        }
    }

    pub fn json(&self) -> serde_json::Value {
        use weir_engine::time::format_rfc3339_ms as at;
        serde_json::json!({
            "id": self.id,
            "name": self.name,
            "role": self.role.as_str(),
            "topics": self.topics,
            "pipelines": self.pipelines,
            "created": at(self.created_ms),
            "expires": self.expires_ms.map(at),
            "revoked": self.revoked_ms.map(at),
        })
    }
}

/// What `weir token create` (or `POST /v1/tokens`) asks for.
#[derive(Debug, Clone)]
pub struct NewToken {
    pub role: Role,
    pub name: String,
    pub topics: Vec<String>,
    pub pipelines: Vec<String>,
    /// How long from now it lasts; `None`: until revoked.
    pub expires_in_ms: Option<i64>,
}

impl NewToken {
    /// Refuses a token that names what its role does not use, or lacks what it needs.
    pub fn check(&self) -> Result<(), String> {
        let r = self.role;
        let needs_topics = matches!(r, Role::Producer | Role::RawReader);
        let needs_pipelines = matches!(r, Role::Reader | Role::Operator);
        if needs_topics && self.topics.is_empty() {
            return Err(format!(
                "a {r} token names the topics it may use: add --topic T (repeat it, or * for every topic)"
            ));
        }
        if needs_pipelines && self.pipelines.is_empty() {
            return Err(format!(
                "a {r} token names the pipelines it may use: add --pipeline P (repeat it, or * for every pipeline)"
            ));
        }
        if !needs_topics && !self.topics.is_empty() {
            return Err(format!("a {r} token does not use topics; remove --topic"));
        }
        if !needs_pipelines && !self.pipelines.is_empty() {
            return Err(format!("a {r} token does not use pipelines; remove --pipeline"));
        }
        if self.name.trim().is_empty() {
            return Err("say whom the token is for: --name NAME (it is kept in the audit log)".into());
        }
        if let Some(ms) = self.expires_in_ms {
            if ms <= 0 {
                return Err("--expires must be a positive duration such as 30d or 12h".into());
            }
        }
        Ok(())
    }
}

pub(crate) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS tokens (
    id TEXT PRIMARY KEY, secret_sha256 TEXT NOT NULL, name TEXT NOT NULL, role TEXT NOT NULL,
    topics TEXT NOT NULL, pipelines TEXT NOT NULL, created_ms INTEGER NOT NULL,
    expires_ms INTEGER, revoked_ms INTEGER);
";

fn random_hex(n: usize) -> crate::Result<String> {
    let mut bytes = vec![0u8; n];
    getrandom::fill(&mut bytes)
        .map_err(|e| crate::StoreError::Refused(format!("no random numbers from the system: {e}")))?;
    Ok(hex(&bytes))
}

/// Makes a token; returns its text (shown once) and its rights. The
/// caller writes the audit entry.
pub fn create(conn: &Connection, new: &NewToken) -> crate::Result<(String, Grant)> {
    new.check().map_err(crate::StoreError::Refused)?;
    let (id, secret) = (random_hex(8)?, random_hex(24)?);
    let now = weir_log::now_ms();
    let grant = Grant {
        id: id.clone(),
        name: new.name.clone(),
        role: new.role,
        topics: new.topics.clone(),
        pipelines: new.pipelines.clone(),
        created_ms: now,
        expires_ms: new.expires_in_ms.map(|ms| now.saturating_add(ms)),
        revoked_ms: None,
    };
    conn.execute(
        "INSERT INTO tokens (id, secret_sha256, name, role, topics, pipelines, created_ms, expires_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![
            id,
            sha256_hex(secret.as_bytes()),
            grant.name,
            grant.role.as_str(),
            serde_json::to_string(&grant.topics).map_err(|e| crate::StoreError::Refused(e.to_string()))?,
            serde_json::to_string(&grant.pipelines).map_err(|e| crate::StoreError::Refused(e.to_string()))?,
            now,
            grant.expires_ms
        ],
    )?;
    Ok((format!("weir_{id}_{secret}"), grant))
}

/// [`create`], with its `token-create` audit entry, in one transaction.
pub fn create_audited(
    conn: &Connection,
    new: &NewToken,
    who: &str,
    origin: &str,
    why: &str,
) -> crate::Result<(String, Grant)> {
    let tx = Transaction::new_unchecked(conn, TransactionBehavior::Immediate)?;
    let (token, grant) = create(&tx, new)?;
    let mut detail = grant.json();
    if let Some(m) = detail.as_object_mut() {
        m.remove("revoked");
    }
    let entry = crate::audit::Entry { who, action: "token-create", pipeline: None, detail: &detail, why, origin };
    crate::audit::append(&tx, &entry)?;
    tx.commit()?;
    Ok((token, grant))
}

/// [`revoke`], with its `token-revoke` audit entry, in one transaction.
pub fn revoke_audited(conn: &Connection, id: &str, who: &str, origin: &str, why: &str) -> crate::Result<Option<Grant>> {
    let tx = Transaction::new_unchecked(conn, TransactionBehavior::Immediate)?;
    let Some(grant) = revoke(&tx, id)? else { return Ok(None) };
    let detail = serde_json::json!({ "id": grant.id, "name": grant.name, "role": grant.role.as_str() });
    let entry = crate::audit::Entry { who, action: "token-revoke", pipeline: None, detail: &detail, why, origin };
    crate::audit::append(&tx, &entry)?;
    tx.commit()?;
    Ok(Some(grant))
}

fn grant_of(r: &rusqlite::Row<'_>) -> rusqlite::Result<(Grant, String)> {
    let list = |i: usize| -> rusqlite::Result<Vec<String>> {
        Ok(serde_json::from_str(&r.get::<_, String>(i)?).unwrap_or_default())
    };
    let role: String = r.get(3)?;
    Ok((
        Grant {
            id: r.get(0)?,
            name: r.get(2)?,
            // An unknown role (a newer weir wrote it) grants nothing a reader would not.
            role: Role::parse(&role).unwrap_or(Role::Reader),
            topics: list(4)?,
            pipelines: list(5)?,
            created_ms: r.get(6)?,
            expires_ms: r.get(7)?,
            revoked_ms: r.get(8)?,
        },
        r.get(1)?,
    ))
}

const COLUMNS: &str = "id, secret_sha256, name, role, topics, pipelines, created_ms, expires_ms, revoked_ms";

/// Every token ever made, newest first, with no secret or hash.
pub fn list(conn: &Connection) -> rusqlite::Result<Vec<Grant>> {
    let mut stmt = conn.prepare(&format!("SELECT {COLUMNS} FROM tokens ORDER BY created_ms DESC, id"))?;
    let rows = stmt.query_map([], grant_of)?;
    rows.map(|r| r.map(|(g, _)| g)).collect()
}

/// Revokes a token; `Ok(None)` when there is no such token, the token as it
/// was when it already was revoked.
pub fn revoke(conn: &Connection, id: &str) -> rusqlite::Result<Option<Grant>> {
    let found = conn.query_row(&format!("SELECT {COLUMNS} FROM tokens WHERE id = ?1"), [id], grant_of).optional()?;
    let Some((mut grant, _)) = found else { return Ok(None) };
    if grant.revoked_ms.is_none() {
        let now = weir_log::now_ms();
        conn.execute("UPDATE tokens SET revoked_ms = ?2 WHERE id = ?1", params![id, now])?;
        grant.revoked_ms = Some(now);
    }
    Ok(Some(grant))
}

/// Why a request has no identity: each is a 401.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unauthorized {
    Missing,
    Malformed,
    Unknown,
    Expired(String, i64),
    Revoked(String, i64),
}

impl Unauthorized {
    /// For the metrics' `reason` label.
    pub fn reason(&self) -> &'static str {
        match self {
            Unauthorized::Missing => "missing",
            Unauthorized::Malformed => "malformed",
            Unauthorized::Unknown => "unknown",
            Unauthorized::Expired(..) => "expired",
            Unauthorized::Revoked(..) => "revoked",
        }
    }
}

impl std::fmt::Display for Unauthorized {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use weir_engine::time::format_rfc3339_ms as at;
        match self {
            Unauthorized::Missing => f.write_str(
                "no token: send the header `Authorization: Bearer <token>`; `weir token create` makes one",
            ),
            Unauthorized::Malformed => f.write_str(
                "the Authorization header is not `Bearer weir_<id>_<secret>`; send the token `weir token create` printed",
            ),
            Unauthorized::Unknown => {
                f.write_str("the token is not known: it is mistyped, or not from this server's data folder")
            }
            Unauthorized::Expired(id, ms) => write!(f, "token {id} expired at {}; ask an admin for a new one", at(*ms)),
            Unauthorized::Revoked(id, ms) => {
                write!(f, "token {id} was revoked at {}; ask an admin for a new one", at(*ms))
            }
        }
    }
}

/// The rights of the token in an `Authorization` header's value.
pub fn authenticate(
    conn: &Connection,
    header: Option<&str>,
    now_ms: i64,
) -> rusqlite::Result<Result<Grant, Unauthorized>> {
    let Some(header) = header else { return Ok(Err(Unauthorized::Missing)) };
    let token = match header.trim().split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => token.trim(),
        _ => return Ok(Err(Unauthorized::Malformed)),
    };
    let Some((id, secret)) = token.strip_prefix("weir_").and_then(|t| t.split_once('_')) else {
        return Ok(Err(Unauthorized::Malformed));
    };
    if id.len() != 16 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Ok(Err(Unauthorized::Malformed));
    }
    let mut stmt = conn.prepare_cached(&format!("SELECT {COLUMNS} FROM tokens WHERE id = ?1"))?;
    let Some((grant, stored)) = stmt.query_row([id], grant_of).optional()? else {
        return Ok(Err(Unauthorized::Unknown));
    };
    // Compared whole, without stopping at the first difference.
    let given = sha256_hex(secret.as_bytes());
    let differ =
        given.bytes().zip(stored.bytes()).fold(given.len() ^ stored.len(), |acc, (a, b)| acc | usize::from(a ^ b));
    if differ != 0 {
        return Ok(Err(Unauthorized::Unknown));
    }
    if let Some(ms) = grant.revoked_ms {
        return Ok(Err(Unauthorized::Revoked(grant.id, ms)));
    }
    if let Some(ms) = grant.expires_ms.filter(|ms| *ms <= now_ms) {
        return Ok(Err(Unauthorized::Expired(grant.id, ms)));
    }
    Ok(Ok(grant))
}

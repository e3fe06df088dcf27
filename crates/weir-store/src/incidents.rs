//! Incidents with a lifecycle (issue 18): opened by an operator, an alert
//! or an error check; `open`, then `mitigated`, then `resolved` with the
//! proof that closed it; each with a timeline of what happened while it was
//! not resolved (alerts, operator actions, annotations, backfills, notes).
//! Kept in the pipeline's store (tables `incidents` and `incident_entries`;
//! before schema version 11 in SQLite and 8 in Postgres they were `cases`
//! and `incident_entries`, renamed in place at the first start), so they
//! outlive a restart and every worker of a pipeline on Kafka sees the same.
//! The alert notifications are another thing: `Store::notifications`, in
//! the table `notifications`.
//!
//! What a step does is decided here ([`decide`]); `sqlite` and `pg` below
//! write it.

use serde::Serialize;

/// Where an incident stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IncidentStatus {
    Open,
    Mitigated,
    Resolved,
}

impl IncidentStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            IncidentStatus::Open => "open",
            IncidentStatus::Mitigated => "mitigated",
            IncidentStatus::Resolved => "resolved",
        }
    }

    pub fn parse(s: &str) -> Option<IncidentStatus> {
        [IncidentStatus::Open, IncidentStatus::Mitigated, IncidentStatus::Resolved]
            .into_iter()
            .find(|c| c.as_str() == s)
    }
}

/// One incident as kept.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Incident {
    pub id: i64,
    pub pipeline: String,
    pub title: String,
    pub owner: String,
    /// `operator`, `alert:NAME` or `check:NAME`.
    pub cause: String,
    pub opened_by: String,
    pub status: IncidentStatus,
    pub opened_ms: i64,
    pub mitigated_ms: Option<i64>,
    pub resolved_ms: Option<i64>,
    /// What showed it was over (for example a reconciliation within tolerance).
    pub proof: Option<String>,
}

/// One line of an incident's timeline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IncidentEntry {
    pub at_ms: i64,
    /// `opened`, `note`, `mitigated`, `resolved`, `alert`, `action`, `backfill`, `reconciliation`.
    pub kind: String,
    pub who: String,
    pub text: String,
}

/// An operator's step on an incident.
#[derive(Debug, Clone, PartialEq)]
pub enum CaseAct {
    Open { title: String, owner: String, who: String },
    Note { id: i64, who: String, text: String },
    Mitigate { id: i64, who: String, why: String },
    Resolve { id: i64, who: String, why: String, proof: String },
}

/// Why a step was not taken (nothing was written).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CaseError {
    #[error("no incident {0} on this pipeline; list them with GET .../incidents")]
    NotFound(i64),
    #[error("incident {0} is resolved: open a new one for what happened since")]
    Resolved(i64),
    #[error("incident {0} is mitigated already; resolve it with the proof that it is over")]
    Mitigated(i64),
    #[error(
        "say what proves incident {0} is over (for example a reconciliation within tolerance): {{\"proof\":\"...\"}}"
    )]
    NoProof(i64),
}

/// What a step on an incident in `status` does: the status it leaves and
/// the timeline entry's kind, or why not.
pub fn decide(
    id: i64,
    status: Option<IncidentStatus>,
    act: &CaseAct,
) -> Result<(IncidentStatus, &'static str), CaseError> {
    let status = status.ok_or(CaseError::NotFound(id))?;
    if status == IncidentStatus::Resolved {
        return Err(CaseError::Resolved(id));
    }
    match act {
        CaseAct::Open { .. } => Ok((IncidentStatus::Open, "opened")),
        CaseAct::Note { .. } => Ok((status, "note")),
        CaseAct::Mitigate { .. } if status == IncidentStatus::Mitigated => Err(CaseError::Mitigated(id)),
        CaseAct::Mitigate { .. } => Ok((IncidentStatus::Mitigated, "mitigated")),
        CaseAct::Resolve { proof, .. } if proof.trim().is_empty() => Err(CaseError::NoProof(id)),
        CaseAct::Resolve { .. } => Ok((IncidentStatus::Resolved, "resolved")),
    }
}

/// The entry a step writes: who and what.
fn entry_of(act: &CaseAct) -> (&str, String) {
    match act {
        CaseAct::Open { title, owner, who } => (who, format!("{title} (owner {owner})")),
        CaseAct::Note { who, text, .. } => (who, text.clone()),
        CaseAct::Mitigate { who, why, .. } => (who, why.clone()),
        CaseAct::Resolve { who, why, proof, .. } => (who, format!("{why}; proof: {proof}")),
    }
}

pub mod sqlite {
    use rusqlite::{params, Connection, OptionalExtension};

    use super::*;

    pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS incidents (
    id INTEGER PRIMARY KEY AUTOINCREMENT, pipeline TEXT NOT NULL, title TEXT NOT NULL, owner TEXT NOT NULL,
    cause TEXT NOT NULL, opened_by TEXT NOT NULL, status TEXT NOT NULL, opened_ms INTEGER NOT NULL,
    mitigated_ms INTEGER, resolved_ms INTEGER, proof TEXT);
CREATE INDEX IF NOT EXISTS incidents_by_pipeline ON incidents (pipeline, id);
CREATE TABLE IF NOT EXISTS incident_entries (
    id INTEGER PRIMARY KEY AUTOINCREMENT, incident_id INTEGER NOT NULL, at_ms INTEGER NOT NULL, kind TEXT NOT NULL,
    who TEXT NOT NULL, text TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS incident_entries_by_incident ON incident_entries (incident_id, id);
";

    const COLUMNS: &str =
        "id, pipeline, title, owner, cause, opened_by, status, opened_ms, mitigated_ms, resolved_ms, proof";

    fn case(r: &rusqlite::Row<'_>) -> rusqlite::Result<Incident> {
        let status: String = r.get(6)?;
        Ok(Incident {
            id: r.get(0)?,
            pipeline: r.get(1)?,
            title: r.get(2)?,
            owner: r.get(3)?,
            cause: r.get(4)?,
            opened_by: r.get(5)?,
            status: IncidentStatus::parse(&status).unwrap_or(IncidentStatus::Open),
            opened_ms: r.get(7)?,
            mitigated_ms: r.get(8)?,
            resolved_ms: r.get(9)?,
            proof: r.get(10)?,
        })
    }

    fn entry(conn: &Connection, id: i64, at_ms: i64, kind: &str, who: &str, text: &str) -> rusqlite::Result<()> {
        conn.prepare_cached(
            "INSERT INTO incident_entries (incident_id, at_ms, kind, who, text) VALUES (?1, ?2, ?3, ?4, ?5)",
        )?
        .execute(params![id, at_ms, kind, who, text])?;
        Ok(())
    }

    fn open(
        conn: &Connection,
        pipeline: &str,
        (title, owner, cause, who): (&str, &str, &str, &str),
        at_ms: i64,
    ) -> rusqlite::Result<i64> {
        conn.execute(
            "INSERT INTO incidents (pipeline, title, owner, cause, opened_by, status, opened_ms) VALUES (?1, ?2, ?3, ?4, ?5, 'open', ?6)",
            params![pipeline, title, owner, cause, who, at_ms],
        )?;
        let id = conn.last_insert_rowid();
        entry(conn, id, at_ms, "opened", who, &format!("{title} (owner {owner})"))?;
        Ok(id)
    }

    /// An operator's step, in the caller's transaction.
    pub fn act(
        conn: &Connection,
        pipeline: &str,
        act: &CaseAct,
        at_ms: i64,
    ) -> rusqlite::Result<Result<Incident, CaseError>> {
        let id = match act {
            CaseAct::Open { title, owner, who } => open(conn, pipeline, (title, owner, "operator", who), at_ms)?,
            CaseAct::Note { id, .. } | CaseAct::Mitigate { id, .. } | CaseAct::Resolve { id, .. } => {
                let status: Option<String> = conn
                    .query_row(
                        "SELECT status FROM incidents WHERE pipeline = ?1 AND id = ?2",
                        params![pipeline, id],
                        |r| r.get(0),
                    )
                    .optional()?;
                let (to, kind) = match decide(*id, status.as_deref().and_then(IncidentStatus::parse), act) {
                    Ok(d) => d,
                    Err(e) => return Ok(Err(e)),
                };
                let (who, text) = entry_of(act);
                let proof = match act {
                    CaseAct::Resolve { proof, .. } => Some(proof.as_str()),
                    _ => None,
                };
                conn.execute(
                    "UPDATE incidents SET status = ?2,
                         mitigated_ms = CASE WHEN ?2 = 'mitigated' THEN ?3 ELSE mitigated_ms END,
                         resolved_ms = CASE WHEN ?2 = 'resolved' THEN ?3 ELSE resolved_ms END,
                         proof = COALESCE(?4, proof)
                     WHERE id = ?1",
                    params![id, to.as_str(), at_ms, proof],
                )?;
                entry(conn, *id, at_ms, kind, who, &text)?;
                *id
            }
        };
        Ok(get(conn, pipeline, id)?.map(|(c, _)| c).ok_or(CaseError::NotFound(id)))
    }

    /// An alert or check (`cause`) fired: a new incident unless one of the
    /// same cause is not resolved, which gets the entry instead; its id.
    pub fn raise(
        conn: &Connection,
        pipeline: &str,
        cause: &str,
        (title, owner): (&str, &str),
        text: &str,
        at_ms: i64,
    ) -> rusqlite::Result<i64> {
        // Immediate: a read first would leave a snapshot that another
        // writer's commit makes stale, and the write would then fail at once
        // ("database is locked") instead of waiting its turn.
        let tx = rusqlite::Transaction::new_unchecked(conn, rusqlite::TransactionBehavior::Immediate)?;
        let found: Option<i64> = tx
            .query_row(
                "SELECT id FROM incidents WHERE pipeline = ?1 AND cause = ?2 AND status != 'resolved' ORDER BY id DESC LIMIT 1",
                params![pipeline, cause],
                |r| r.get(0),
            )
            .optional()?;
        let id = match found {
            Some(id) => id,
            None => open(&tx, pipeline, (title, owner, cause, "weir"), at_ms)?,
        };
        entry(&tx, id, at_ms, kind_of(cause), "weir", text)?;
        tx.commit()?;
        Ok(id)
    }

    /// Adds an entry to every incident of the pipeline not resolved (of one
    /// cause, where given); with `mitigate`, those still open become mitigated.
    pub fn mark(
        conn: &Connection,
        pipeline: &str,
        cause: Option<&str>,
        (kind, who, text): (&str, &str, &str),
        mitigate: bool,
        at_ms: i64,
    ) -> rusqlite::Result<usize> {
        let ids: Vec<i64> = conn
            .prepare_cached(
                "SELECT id FROM incidents WHERE pipeline = ?1 AND status != 'resolved' AND (?2 IS NULL OR cause = ?2)",
            )?
            .query_map(params![pipeline, cause], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        for &id in &ids {
            entry(conn, id, at_ms, kind, who, text)?;
            if mitigate {
                conn.execute(
                    "UPDATE incidents SET status = 'mitigated', mitigated_ms = ?2 WHERE id = ?1 AND status = 'open'",
                    params![id, at_ms],
                )?;
            }
        }
        Ok(ids.len())
    }

    /// The newest incidents first.
    pub fn list(conn: &Connection, pipeline: &str, limit: i64) -> rusqlite::Result<Vec<Incident>> {
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM incidents WHERE pipeline = ?1 ORDER BY id DESC LIMIT ?2"
        ))?;
        let rows = stmt.query_map(params![pipeline, limit], case)?;
        rows.collect()
    }

    /// One incident and its timeline, oldest entry first.
    pub fn get(conn: &Connection, pipeline: &str, id: i64) -> rusqlite::Result<Option<(Incident, Vec<IncidentEntry>)>> {
        let Some(c) = conn
            .query_row(
                &format!("SELECT {COLUMNS} FROM incidents WHERE pipeline = ?1 AND id = ?2"),
                params![pipeline, id],
                case,
            )
            .optional()?
        else {
            return Ok(None);
        };
        let mut stmt = conn
            .prepare_cached("SELECT at_ms, kind, who, text FROM incident_entries WHERE incident_id = ?1 ORDER BY id")?;
        let entries = stmt
            .query_map([id], |r| {
                Ok(IncidentEntry { at_ms: r.get(0)?, kind: r.get(1)?, who: r.get(2)?, text: r.get(3)? })
            })?
            .collect::<rusqlite::Result<_>>()?;
        Ok(Some((c, entries)))
    }
}

/// The timeline kind of an entry a cause adds.
fn kind_of(cause: &str) -> &'static str {
    if cause.starts_with("check:") {
        "check"
    } else {
        "alert"
    }
}

pub mod pg {
    use postgres::Client;

    use super::*;

    pub fn schema(schema: &str) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {schema}.incidents (
    id BIGSERIAL PRIMARY KEY, pipeline TEXT NOT NULL, title TEXT NOT NULL, owner TEXT NOT NULL,
    cause TEXT NOT NULL, opened_by TEXT NOT NULL, status TEXT NOT NULL, opened_ms BIGINT NOT NULL,
    mitigated_ms BIGINT, resolved_ms BIGINT, proof TEXT);
CREATE INDEX IF NOT EXISTS incidents_by_pipeline ON {schema}.incidents (pipeline, id);
CREATE TABLE IF NOT EXISTS {schema}.incident_entries (
    id BIGSERIAL PRIMARY KEY, incident_id BIGINT NOT NULL, at_ms BIGINT NOT NULL, kind TEXT NOT NULL,
    who TEXT NOT NULL, text TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS incident_entries_by_incident ON {schema}.incident_entries (incident_id, id);
"
        )
    }

    const COLUMNS: &str =
        "id, pipeline, title, owner, cause, opened_by, status, opened_ms, mitigated_ms, resolved_ms, proof";

    fn case(r: &postgres::Row) -> Incident {
        let status: String = r.get(6);
        Incident {
            id: r.get(0),
            pipeline: r.get(1),
            title: r.get(2),
            owner: r.get(3),
            cause: r.get(4),
            opened_by: r.get(5),
            status: IncidentStatus::parse(&status).unwrap_or(IncidentStatus::Open),
            opened_ms: r.get(7),
            mitigated_ms: r.get(8),
            resolved_ms: r.get(9),
            proof: r.get(10),
        }
    }

    fn entry(
        c: &mut impl postgres::GenericClient,
        s: &str,
        (id, at_ms): (i64, i64),
        kind: &str,
        who: &str,
        text: &str,
    ) -> Result<(), postgres::Error> {
        c.execute(
            &format!(
                "INSERT INTO {s}.incident_entries (incident_id, at_ms, kind, who, text) VALUES ($1, $2, $3, $4, $5)"
            ),
            &[&id, &at_ms, &kind, &who, &text],
        )?;
        Ok(())
    }

    fn open(
        c: &mut impl postgres::GenericClient,
        s: &str,
        pipeline: &str,
        (title, owner, cause, who): (&str, &str, &str, &str),
        at_ms: i64,
    ) -> Result<i64, postgres::Error> {
        let id: i64 = c
            .query_one(
                &format!(
                    "INSERT INTO {s}.incidents (pipeline, title, owner, cause, opened_by, status, opened_ms)
                     VALUES ($1, $2, $3, $4, $5, 'open', $6) RETURNING id"
                ),
                &[&pipeline, &title, &owner, &cause, &who, &at_ms],
            )?
            .get(0);
        entry(c, s, (id, at_ms), "opened", who, &format!("{title} (owner {owner})"))?;
        Ok(id)
    }

    pub fn act(
        client: &mut Client,
        s: &str,
        pipeline: &str,
        act: &CaseAct,
        at_ms: i64,
    ) -> Result<Result<Incident, CaseError>, postgres::Error> {
        let mut tx = client.transaction()?;
        let id = match act {
            CaseAct::Open { title, owner, who } => open(&mut tx, s, pipeline, (title, owner, "operator", who), at_ms)?,
            CaseAct::Note { id, .. } | CaseAct::Mitigate { id, .. } | CaseAct::Resolve { id, .. } => {
                let status: Option<String> = tx
                    .query_opt(
                        &format!("SELECT status FROM {s}.incidents WHERE pipeline = $1 AND id = $2 FOR UPDATE"),
                        &[&pipeline, id],
                    )?
                    .map(|r| r.get(0));
                let (to, kind) = match decide(*id, status.as_deref().and_then(IncidentStatus::parse), act) {
                    Ok(d) => d,
                    Err(e) => return Ok(Err(e)),
                };
                let (who, text) = entry_of(act);
                let proof = match act {
                    CaseAct::Resolve { proof, .. } => Some(proof.as_str()),
                    _ => None,
                };
                tx.execute(
                    &format!(
                        "UPDATE {s}.incidents SET status = $2,
                             mitigated_ms = CASE WHEN $2 = 'mitigated' THEN $3 ELSE mitigated_ms END,
                             resolved_ms = CASE WHEN $2 = 'resolved' THEN $3 ELSE resolved_ms END,
                             proof = COALESCE($4, proof)
                         WHERE id = $1"
                    ),
                    &[id, &to.as_str(), &at_ms, &proof],
                )?;
                entry(&mut tx, s, (*id, at_ms), kind, who, &text)?;
                *id
            }
        };
        tx.commit()?;
        Ok(get(client, s, pipeline, id)?.map(|(c, _)| c).ok_or(CaseError::NotFound(id)))
    }

    pub fn raise(
        client: &mut Client,
        s: &str,
        pipeline: &str,
        cause: &str,
        (title, owner): (&str, &str),
        text: &str,
        at_ms: i64,
    ) -> Result<i64, postgres::Error> {
        let mut tx = client.transaction()?;
        // One worker at a time opens an incident for a cause.
        tx.execute("SELECT pg_advisory_xact_lock(hashtext($1))", &[&format!("{s}.incidents.{pipeline}.{cause}")])?;
        let found: Option<i64> = tx
            .query_opt(
                &format!(
                    "SELECT id FROM {s}.incidents WHERE pipeline = $1 AND cause = $2 AND status != 'resolved' ORDER BY id DESC LIMIT 1"
                ),
                &[&pipeline, &cause],
            )?
            .map(|r| r.get(0));
        let id = match found {
            Some(id) => id,
            None => open(&mut tx, s, pipeline, (title, owner, cause, "weir"), at_ms)?,
        };
        entry(&mut tx, s, (id, at_ms), kind_of(cause), "weir", text)?;
        tx.commit()?;
        Ok(id)
    }

    pub fn mark(
        client: &mut Client,
        s: &str,
        pipeline: &str,
        cause: Option<&str>,
        (kind, who, text): (&str, &str, &str),
        mitigate: bool,
        at_ms: i64,
    ) -> Result<usize, postgres::Error> {
        let mut tx = client.transaction()?;
        let ids: Vec<i64> = tx
            .query(
                &format!(
                    "SELECT id FROM {s}.incidents WHERE pipeline = $1 AND status != 'resolved' AND ($2::TEXT IS NULL OR cause = $2)"
                ),
                &[&pipeline, &cause],
            )?
            .iter()
            .map(|r| r.get(0))
            .collect();
        for &id in &ids {
            entry(&mut tx, s, (id, at_ms), kind, who, text)?;
            if mitigate {
                tx.execute(
                    &format!("UPDATE {s}.incidents SET status = 'mitigated', mitigated_ms = $2 WHERE id = $1 AND status = 'open'"),
                    &[&id, &at_ms],
                )?;
            }
        }
        tx.commit()?;
        Ok(ids.len())
    }

    pub fn list(client: &mut Client, s: &str, pipeline: &str, limit: i64) -> Result<Vec<Incident>, postgres::Error> {
        let rows = client.query(
            &format!("SELECT {COLUMNS} FROM {s}.incidents WHERE pipeline = $1 ORDER BY id DESC LIMIT $2"),
            &[&pipeline, &limit],
        )?;
        Ok(rows.iter().map(case).collect())
    }

    pub fn get(
        client: &mut Client,
        s: &str,
        pipeline: &str,
        id: i64,
    ) -> Result<Option<(Incident, Vec<IncidentEntry>)>, postgres::Error> {
        let Some(row) = client.query_opt(
            &format!("SELECT {COLUMNS} FROM {s}.incidents WHERE pipeline = $1 AND id = $2"),
            &[&pipeline, &id],
        )?
        else {
            return Ok(None);
        };
        let entries = client
            .query(
                &format!("SELECT at_ms, kind, who, text FROM {s}.incident_entries WHERE incident_id = $1 ORDER BY id"),
                &[&id],
            )?
            .iter()
            .map(|r| IncidentEntry { at_ms: r.get(0), kind: r.get(1), who: r.get(2), text: r.get(3) })
            .collect();
        Ok(Some((case(&row), entries)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(id: i64) -> CaseAct {
        CaseAct::Note { id, who: "o".into(), text: "t".into() }
    }

    #[test]
    fn steps_go_open_mitigated_resolved_and_stop_there() {
        let mitigate = CaseAct::Mitigate { id: 1, who: "o".into(), why: "w".into() };
        let resolve = |proof: &str| CaseAct::Resolve { id: 1, who: "o".into(), why: "w".into(), proof: proof.into() };
        assert_eq!(decide(1, None, &note(1)), Err(CaseError::NotFound(1)));
        assert_eq!(decide(1, Some(IncidentStatus::Open), &note(1)), Ok((IncidentStatus::Open, "note")));
        assert_eq!(decide(1, Some(IncidentStatus::Open), &mitigate), Ok((IncidentStatus::Mitigated, "mitigated")));
        assert_eq!(decide(1, Some(IncidentStatus::Mitigated), &mitigate), Err(CaseError::Mitigated(1)));
        assert_eq!(decide(1, Some(IncidentStatus::Mitigated), &resolve(" ")), Err(CaseError::NoProof(1)));
        assert_eq!(
            decide(1, Some(IncidentStatus::Open), &resolve("reconciliation 4 passed")),
            Ok((IncidentStatus::Resolved, "resolved"))
        );
        assert_eq!(decide(1, Some(IncidentStatus::Resolved), &note(1)), Err(CaseError::Resolved(1)));
    }
}

//! [`SqliteStore`]: the [`Store`] of the embedded topology, `weir.db`
//! through a pool, each call stopped past the statement timeout.

use std::path::PathBuf;

use crate::{audit, backfill, checks, destinations, detail_with, drills, incidents, pool, sqlite, views};
use crate::{
    Act, Acted, Annotation, Backfill, BackfillAsk, Correction, FileContract, Finish, Notification, Reconciliation,
    Registration, Result, ResultFilter, ResultPage, RowOrigin, Schedule, Store, StoreError, Switch, SwitchError,
    Version, STATEMENT_TIMEOUT,
};

/// The embedded topology's store: `weir.db`, through a pool.
pub struct SqliteStore {
    pool: r2d2::Pool<pool::Sqlite>,
    size: u32,
    /// How long one call may run before SQLite is told to stop it.
    timeout: std::time::Duration,
}

impl SqliteStore {
    /// At most `size` connections (weir.toml `pool_connections`), opened when needed.
    pub fn new(path: PathBuf, size: u32) -> SqliteStore {
        SqliteStore { pool: pool::build(pool::Sqlite { path }, size), size, timeout: STATEMENT_TIMEOUT }
    }

    /// Each call stopped after `timeout` ([`STATEMENT_TIMEOUT`] unless set).
    pub fn with_statement_timeout(mut self, timeout: std::time::Duration) -> SqliteStore {
        self.timeout = timeout;
        self
    }

    /// Runs `f` on a pooled connection; SQLite stops it (`interrupted`) once
    /// it has run past the statement timeout.
    pub fn with<T>(&self, f: impl FnOnce(&mut rusqlite::Connection) -> rusqlite::Result<T>) -> Result<T> {
        let mut conn =
            self.pool.get().map_err(|_| StoreError::Busy { what: "the results database", size: self.size })?;
        let deadline = std::time::Instant::now() + self.timeout;
        // Asked every few thousand virtual machine steps: a cheap clock read.
        conn.progress_handler(4096, Some(move || std::time::Instant::now() > deadline));
        let done = f(&mut conn);
        conn.progress_handler(4096, None::<fn() -> bool>);
        done.map_err(|e| match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::OperationInterrupted) => {
                StoreError::TimedOut { what: "the results database", seconds: self.timeout.as_secs() }
            }
            _ => StoreError::Sqlite(e),
        })
    }
}

impl Store for SqliteStore {
    fn keeps_audit_log(&self) -> bool {
        true
    }
    fn act(&self, pipeline: &str, act: &Act, audit: Option<&audit::Entry<'_>>) -> Result<(Acted, Option<i64>)> {
        self.with(|c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let acted = match act {
                Act::Pause => Acted::Paused { was: sqlite::pause(&tx, pipeline)? },
                Act::Resume => Acted::Paused { was: sqlite::resume(&tx, pipeline)? },
                Act::Replay { version, replay } => {
                    Acted::Replay { id: sqlite::ask_replay(&tx, pipeline, *version, *replay)? }
                }
                Act::Annotate { range, note, who } => {
                    Acted::Annotation { id: sqlite::add_annotation(&tx, pipeline, *range, note, who)? }
                }
                Act::Switch { promote, who, why } => {
                    Acted::Switched(sqlite::switch_version(&tx, pipeline, *promote, who, why)?)
                }
                Act::Incident(step) => {
                    Acted::Incident(incidents::sqlite::act(&tx, pipeline, step, weir_log::now_ms())?)
                }
                Act::Drill(ask) => Acted::Drill { id: drills::sqlite::start(&tx, pipeline, ask)? },
                Act::ResumeDestination { name } => {
                    Acted::DestinationResumed { was_stopped: destinations::sqlite::resume(&tx, pipeline, name)? }
                }
                Act::Backfill { version, from_ms, to_ms, who, why } => {
                    let ask = BackfillAsk {
                        version: *version,
                        from_ms: *from_ms,
                        to_ms: *to_ms,
                        who,
                        why,
                        origin: "operator",
                    };
                    Acted::Backfill { id: backfill::sqlite::ask(&tx, pipeline, &ask)? }
                }
                Act::Reconcile(r) => Acted::Reconciled { id: backfill::reconciliations::record_sqlite(&tx, r)? },
            };
            if let (Some(text), Some(_)) = (act.timeline(), acted.detail()) {
                let entry = ("action", act.who(), text.as_str());
                incidents::sqlite::mark(&tx, pipeline, None, entry, false, weir_log::now_ms())?;
            }
            let seq = match (audit, acted.detail()) {
                (Some(e), Some(_)) => {
                    let detail = detail_with(e.detail, &acted);
                    Some(audit::append(&tx, &audit::Entry { detail: &detail, ..*e })?)
                }
                _ => None,
            };
            tx.commit()?;
            Ok((acted, seq))
        })
    }
    fn results(&self, pipeline: &str, version: u32, filter: &ResultFilter) -> Result<ResultPage> {
        self.with(|c| sqlite::results(c, pipeline, version, filter))
    }
    fn result_span(&self, pipeline: &str, version: u32) -> Result<Option<(i64, i64)>> {
        self.with(|c| sqlite::result_span(c, pipeline, version))
    }
    fn changes(&self, pipeline: &str, version: Option<u32>, since: i64, limit: i64) -> Result<Vec<String>> {
        self.with(|c| sqlite::changes(c, pipeline, version, since, limit))
    }
    fn ledger(
        &self,
        pipeline: &str,
        version: u32,
        reason: Option<&str>,
        page: (i64, i64),
        raw: bool,
    ) -> Result<Vec<String>> {
        self.with(|c| sqlite::ledger(c, pipeline, Some(version), reason, page, raw))
    }
    fn ledger_dated(&self, pipeline: &str, version: u32, page: (i64, i64, i64)) -> Result<Vec<(i64, i64, String)>> {
        self.with(|c| sqlite::ledger_dated(c, pipeline, version, page))
    }
    fn latest_changes(&self, pipeline: &str, version: u32, limit: i64) -> Result<Vec<String>> {
        self.with(|c| sqlite::latest_changes(c, pipeline, version, limit))
    }
    fn latest_ledger(&self, pipeline: &str, version: u32, limit: i64) -> Result<Vec<String>> {
        self.with(|c| sqlite::latest_ledger(c, pipeline, version, limit))
    }
    fn row_origin(&self, pipeline: &str, seq: i64) -> Result<Option<RowOrigin>> {
        self.with(|c| sqlite::row_origin(c, pipeline, seq))
    }
    fn is_paused(&self, pipeline: &str) -> Result<bool> {
        self.with(|c| sqlite::is_paused(c, pipeline))
    }
    fn versions(&self, pipeline: &str) -> Result<Vec<Version>> {
        self.with(|c| sqlite::versions(c, pipeline))
    }
    fn live_version(&self, pipeline: &str) -> Result<Option<u32>> {
        self.with(|c| sqlite::live_version(c, pipeline))
    }
    fn register_version(&self, pipeline: &str, file: FileContract<'_>, who: &str) -> Result<Registration> {
        self.with(|c| sqlite::register_version(c, pipeline, file, who))
    }
    fn switch_version(
        &self,
        pipeline: &str,
        promote: Option<u32>,
        who: &str,
        why: &str,
    ) -> Result<std::result::Result<(Switch, i64), SwitchError>> {
        self.with(|c| sqlite::switch_version(c, pipeline, promote, who, why))
    }
    fn forget_version(&self, pipeline: &str, version: u32) -> Result<()> {
        self.with(|c| sqlite::forget_version(c, pipeline, version))
    }
    fn annotations(&self, pipeline: &str) -> Result<Vec<Annotation>> {
        self.with(|c| sqlite::annotations(c, pipeline))
    }
    fn record_notification(&self, pipeline: &str, at_ms: i64, notification: &str) -> Result<i64> {
        self.with(|c| sqlite::record_notification(c, pipeline, at_ms, notification))
    }
    fn notifications(&self, pipeline: &str, limit: i64) -> Result<Vec<Notification>> {
        self.with(|c| sqlite::notifications(c, pipeline, limit))
    }
    fn raise_incident(&self, pipeline: &str, cause: &str, title_owner: (&str, &str), text: &str) -> Result<i64> {
        self.with(|c| incidents::sqlite::raise(c, pipeline, cause, title_owner, text, weir_log::now_ms()))
    }
    fn mark_incidents(
        &self,
        pipeline: &str,
        cause: Option<&str>,
        entry: (&str, &str, &str),
        mitigate: bool,
    ) -> Result<usize> {
        self.with(|c| {
            // Immediate, as `incidents::sqlite::raise`: it reads, then writes.
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let n = incidents::sqlite::mark(&tx, pipeline, cause, entry, mitigate, weir_log::now_ms())?;
            tx.commit()?;
            Ok(n)
        })
    }
    fn incidents(&self, pipeline: &str, limit: i64) -> Result<Vec<incidents::Incident>> {
        self.with(|c| incidents::sqlite::list(c, pipeline, limit))
    }
    fn incident(
        &self,
        pipeline: &str,
        id: i64,
    ) -> Result<Option<(incidents::Incident, Vec<incidents::IncidentEntry>)>> {
        self.with(|c| incidents::sqlite::get(c, pipeline, id))
    }
    fn record_checks(&self, pipeline: &str, results: &[checks::CheckResult]) -> Result<Vec<bool>> {
        self.with(|c| checks::sqlite::record(c, pipeline, results))
    }
    fn check_results(
        &self,
        pipeline: &str,
        version: u32,
        filter: &checks::CheckFilter,
    ) -> Result<Vec<checks::CheckResult>> {
        self.with(|c| checks::sqlite::list(c, pipeline, version, filter))
    }
    fn check_totals(&self, pipeline: &str, version: u32, since_ms: i64) -> Result<Vec<checks::CheckTotal>> {
        self.with(|c| checks::sqlite::totals(c, pipeline, version, since_ms))
    }
    fn check_cursor(&self, pipeline: &str, version: u32, check: &str) -> Result<i64> {
        self.with(|c| checks::sqlite::cursor(c, pipeline, version, check))
    }
    fn ask_backfill(&self, pipeline: &str, ask: &BackfillAsk<'_>) -> Result<i64> {
        self.with(|c| backfill::sqlite::ask(c, pipeline, ask))
    }
    fn backfill(&self, pipeline: &str, id: i64) -> Result<Option<Backfill>> {
        self.with(|c| backfill::sqlite::get(c, pipeline, id))
    }
    fn schedule_backfill(&self, pipeline: &str, schedule: &Schedule<'_>) -> Result<Option<i64>> {
        self.with(|c| backfill::sqlite::schedule(c, pipeline, schedule))
    }
    fn backfills(&self, pipeline: &str, limit: i64) -> Result<Vec<Backfill>> {
        self.with(|c| backfill::sqlite::list(c, pipeline, limit))
    }
    fn claim_backfill(&self, pipeline: &str, claimant: &str, versions: &[u32]) -> Result<Option<Backfill>> {
        self.with(|c| backfill::sqlite::claim(c, pipeline, claimant, versions))
    }
    fn renew_backfill(&self, id: i64, claimant: &str) -> Result<bool> {
        self.with(|c| backfill::sqlite::renew(c, id, claimant))
    }
    fn fail_backfill(&self, id: i64, claimant: &str, error: &str) -> Result<bool> {
        self.with(|c| backfill::sqlite::fail(c, id, claimant, error))
    }
    fn finish_backfill(
        &self,
        id: i64,
        claimant: &str,
        format: &weir_engine::RowFormat,
        corrections: &[Correction],
        report: &str,
    ) -> Result<Finish> {
        self.with(|c| backfill::sqlite::finish(c, id, claimant, format, corrections, report))
    }
    fn checkpoint_headers(&self, pipeline: &str, version: u32) -> Result<Vec<(u32, Vec<u8>)>> {
        self.with(|c| backfill::sqlite::headers(c, pipeline, version))
    }
    fn record_reconciliation(&self, r: &Reconciliation) -> Result<i64> {
        self.with(|c| backfill::reconciliations::record_sqlite(c, r))
    }
    fn reconciliations(&self, pipeline: &str, id: Option<i64>, limit: i64) -> Result<Vec<Reconciliation>> {
        self.with(|c| backfill::reconciliations::list_sqlite(c, pipeline, id, limit))
    }
    fn finish_drill(&self, id: i64, verdict: &str, report: &str) -> Result<()> {
        self.with(|c| drills::sqlite::finish(c, id, verdict, report))
    }
    fn renew_drill(&self, id: i64) -> Result<()> {
        self.with(|c| drills::sqlite::renew(c, id))
    }
    fn drills(&self, pipeline: &str, id: Option<i64>, limit: i64) -> Result<Vec<drills::Drill>> {
        self.with(|c| drills::sqlite::list(c, pipeline, id, limit))
    }
    fn destination(&self, pipeline: &str, name: &str) -> Result<destinations::Place> {
        self.with(|c| destinations::sqlite::place(c, pipeline, name))
    }
    fn record_destination(&self, pipeline: &str, name: &str, step: &destinations::Step) -> Result<()> {
        self.with(|c| destinations::sqlite::record(c, pipeline, name, step))
    }
    fn version_entries(&self, pipeline: &str, since: i64, limit: i64) -> Result<Vec<String>> {
        self.with(|c| destinations::sqlite::version_entries(c, pipeline, since, limit))
    }
    fn stream_head(&self, pipeline: &str, at: i64) -> Result<destinations::Head> {
        self.with(|c| destinations::sqlite::head(c, pipeline, at))
    }
    fn refresh_views(&self, pipeline: &str) -> Result<()> {
        self.with(|c| views::sqlite::refresh(c, pipeline))
    }
    fn ledger_stream(&self, pipeline: &str, since: i64, limit: i64) -> Result<Vec<String>> {
        self.with(|c| sqlite::ledger(c, pipeline, None, None, (since, limit), false))
    }
    fn ledger_head(&self, pipeline: &str, at: i64) -> Result<destinations::Head> {
        self.with(|c| destinations::sqlite::ledger_head(c, pipeline, at))
    }
    fn sink_position(&self, pipeline: &str, topic: &str) -> Result<i64> {
        self.with(|c| sqlite::sink_position(c, pipeline, topic))
    }
}

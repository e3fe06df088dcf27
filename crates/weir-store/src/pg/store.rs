//! [`PostgresStore`]: the [`Store`] of the Kafka topology, the
//! `[postgres]` schema through a pool, each statement stopped past the
//! statement timeout.

use crate::{audit, backfill, checks, destinations, drills, incidents, pg, pool, views};
use crate::{
    Act, Acted, Annotation, Backfill, BackfillAsk, Correction, FileContract, Finish, Notification, Reconciliation,
    Registration, Result, ResultFilter, ResultPage, RowOrigin, Schedule, Store, StoreError, Switch, SwitchError,
    Version, STATEMENT_TIMEOUT,
};

/// The Kafka topology's store: the `[postgres]` schema, through a pool.
pub struct PostgresStore {
    pool: r2d2::Pool<pool::Postgres>,
    schema: String,
    size: u32,
    timeout: std::time::Duration,
}

impl PostgresStore {
    /// At most `size` clients (weir.toml `pool_connections`), opened when needed.
    pub fn new(url: String, schema: String, size: u32) -> PostgresStore {
        PostgresStore::timed(url, schema, size, STATEMENT_TIMEOUT)
    }

    /// [`PostgresStore::new`] whose every statement Postgres stops after
    /// `timeout` (`statement_timeout` on each pooled connection).
    pub fn timed(url: String, schema: String, size: u32, timeout: std::time::Duration) -> PostgresStore {
        let manager = pool::Postgres { url, statement_timeout: Some(timeout) };
        PostgresStore { pool: pool::build(manager, size), schema, size, timeout }
    }

    /// Runs `f` on a pooled client with the schema's name.
    pub fn with<T>(
        &self,
        f: impl FnOnce(&mut postgres::Client, &str) -> std::result::Result<T, postgres::Error>,
    ) -> Result<T> {
        let mut client = self.pool.get().map_err(|e| {
            let message = e.to_string();
            if message.contains("timed out") {
                StoreError::Busy { what: "Postgres", size: self.size }
            } else {
                StoreError::Unreachable { what: "Postgres", message }
            }
        })?;
        f(&mut client, &self.schema).map_err(|e| match e.code() {
            Some(&postgres::error::SqlState::QUERY_CANCELED) => {
                StoreError::TimedOut { what: "Postgres", seconds: self.timeout.as_secs() }
            }
            _ => StoreError::Postgres(e),
        })
    }
}

impl Store for PostgresStore {
    fn keeps_audit_log(&self) -> bool {
        false
    }
    fn act(&self, pipeline: &str, act: &Act, _audit: Option<&audit::Entry<'_>>) -> Result<(Acted, Option<i64>)> {
        let acted = match act {
            Act::Pause => Acted::Paused { was: self.with(|c, s| pg::pause(c, s, pipeline))? },
            Act::Resume => Acted::Paused { was: self.with(|c, s| pg::resume(c, s, pipeline))? },
            Act::Replay { version, replay } => {
                Acted::Replay { id: self.with(|c, s| pg::ask_replay(c, s, pipeline, *version, *replay))? }
            }
            Act::Annotate { range, note, who } => {
                Acted::Annotation { id: self.with(|c, s| pg::add_annotation(c, s, pipeline, *range, note, who))? }
            }
            Act::Switch { promote, who, why } => Acted::Switched(self.switch_version(pipeline, *promote, who, why)?),
            Act::Incident(step) => {
                Acted::Incident(self.with(|c, s| incidents::pg::act(c, s, pipeline, step, weir_log::now_ms()))?)
            }
            Act::Drill(ask) => Acted::Drill { id: self.with(|c, s| drills::pg::start(c, s, pipeline, ask))? },
            Act::ResumeDestination { name } => Acted::DestinationResumed {
                was_stopped: self.with(|c, s| destinations::pg::resume(c, s, pipeline, name))?,
            },
            Act::Backfill { version, from_ms, to_ms, who, why } => {
                let ask =
                    BackfillAsk { version: *version, from_ms: *from_ms, to_ms: *to_ms, who, why, origin: "operator" };
                Acted::Backfill { id: self.ask_backfill(pipeline, &ask)? }
            }
            Act::Reconcile(r) => Acted::Reconciled { id: self.record_reconciliation(r)? },
        };
        if let (Some(text), Some(_)) = (act.timeline(), acted.detail()) {
            self.mark_incidents(pipeline, None, ("action", act.who(), &text), false)?;
        }
        Ok((acted, None))
    }
    fn results(&self, pipeline: &str, version: u32, filter: &ResultFilter) -> Result<ResultPage> {
        self.with(|c, s| pg::results(c, s, pipeline, version, filter))
    }
    fn result_span(&self, pipeline: &str, version: u32) -> Result<Option<(i64, i64)>> {
        self.with(|c, s| pg::result_span(c, s, pipeline, version))
    }
    fn changes(&self, pipeline: &str, version: Option<u32>, since: i64, limit: i64) -> Result<Vec<String>> {
        self.with(|c, s| pg::changes(c, s, pipeline, version, since, limit))
    }
    fn ledger(
        &self,
        pipeline: &str,
        version: u32,
        reason: Option<&str>,
        page: (i64, i64),
        raw: bool,
    ) -> Result<Vec<String>> {
        self.with(|c, s| pg::ledger(c, s, pipeline, Some(version), reason, page, raw))
    }
    fn ledger_dated(&self, pipeline: &str, version: u32, page: (i64, i64, i64)) -> Result<Vec<(i64, i64, String)>> {
        self.with(|c, s| pg::ledger_dated(c, s, pipeline, version, page))
    }
    fn latest_changes(&self, pipeline: &str, version: u32, limit: i64) -> Result<Vec<String>> {
        self.with(|c, s| pg::latest_changes(c, s, pipeline, version, limit))
    }
    fn latest_ledger(&self, pipeline: &str, version: u32, limit: i64) -> Result<Vec<String>> {
        self.with(|c, s| pg::latest_ledger(c, s, pipeline, version, limit))
    }
    fn row_origin(&self, pipeline: &str, seq: i64) -> Result<Option<RowOrigin>> {
        self.with(|c, s| pg::row_origin(c, s, pipeline, seq))
    }
    fn is_paused(&self, pipeline: &str) -> Result<bool> {
        self.with(|c, s| pg::is_paused(c, s, pipeline))
    }
    fn versions(&self, pipeline: &str) -> Result<Vec<Version>> {
        self.with(|c, s| pg::versions(c, s, pipeline))
    }
    fn live_version(&self, pipeline: &str) -> Result<Option<u32>> {
        self.with(|c, s| pg::live_version(c, s, pipeline))
    }
    fn register_version(&self, pipeline: &str, file: FileContract<'_>, who: &str) -> Result<Registration> {
        self.with(|c, s| pg::register_version(c, s, pipeline, file, who))
    }
    fn switch_version(
        &self,
        pipeline: &str,
        promote: Option<u32>,
        who: &str,
        why: &str,
    ) -> Result<std::result::Result<(Switch, i64), SwitchError>> {
        self.with(|c, s| pg::switch_version(c, s, pipeline, promote, who, why))
    }
    fn forget_version(&self, pipeline: &str, version: u32) -> Result<()> {
        self.with(|c, s| pg::forget_version(c, s, pipeline, version))
    }
    fn annotations(&self, pipeline: &str) -> Result<Vec<Annotation>> {
        self.with(|c, s| pg::annotations(c, s, pipeline))
    }
    fn record_notification(&self, pipeline: &str, at_ms: i64, notification: &str) -> Result<i64> {
        self.with(|c, s| pg::record_notification(c, s, pipeline, at_ms, notification))
    }
    fn notifications(&self, pipeline: &str, limit: i64) -> Result<Vec<Notification>> {
        self.with(|c, s| pg::notifications(c, s, pipeline, limit))
    }
    fn raise_incident(&self, pipeline: &str, cause: &str, title_owner: (&str, &str), text: &str) -> Result<i64> {
        self.with(|c, s| incidents::pg::raise(c, s, pipeline, cause, title_owner, text, weir_log::now_ms()))
    }
    fn mark_incidents(
        &self,
        pipeline: &str,
        cause: Option<&str>,
        entry: (&str, &str, &str),
        mitigate: bool,
    ) -> Result<usize> {
        self.with(|c, s| incidents::pg::mark(c, s, pipeline, cause, entry, mitigate, weir_log::now_ms()))
    }
    fn incidents(&self, pipeline: &str, limit: i64) -> Result<Vec<incidents::Incident>> {
        self.with(|c, s| incidents::pg::list(c, s, pipeline, limit))
    }
    fn incident(
        &self,
        pipeline: &str,
        id: i64,
    ) -> Result<Option<(incidents::Incident, Vec<incidents::IncidentEntry>)>> {
        self.with(|c, s| incidents::pg::get(c, s, pipeline, id))
    }
    fn record_checks(&self, pipeline: &str, results: &[checks::CheckResult]) -> Result<Vec<bool>> {
        self.with(|c, s| checks::pg::record(c, s, pipeline, results))
    }
    fn check_results(
        &self,
        pipeline: &str,
        version: u32,
        filter: &checks::CheckFilter,
    ) -> Result<Vec<checks::CheckResult>> {
        self.with(|c, s| checks::pg::list(c, s, pipeline, version, filter))
    }
    fn check_totals(&self, pipeline: &str, version: u32, since_ms: i64) -> Result<Vec<checks::CheckTotal>> {
        self.with(|c, s| checks::pg::totals(c, s, pipeline, version, since_ms))
    }
    fn check_cursor(&self, pipeline: &str, version: u32, check: &str) -> Result<i64> {
        self.with(|c, s| checks::pg::cursor(c, s, pipeline, version, check))
    }
    fn ask_backfill(&self, pipeline: &str, ask: &BackfillAsk<'_>) -> Result<i64> {
        self.with(|c, s| backfill::pg::ask(c, s, pipeline, ask))
    }
    fn backfill(&self, pipeline: &str, id: i64) -> Result<Option<Backfill>> {
        self.with(|c, s| backfill::pg::get(c, s, pipeline, id))
    }
    fn schedule_backfill(&self, pipeline: &str, schedule: &Schedule<'_>) -> Result<Option<i64>> {
        self.with(|c, s| backfill::pg::schedule(c, s, pipeline, schedule))
    }
    fn backfills(&self, pipeline: &str, limit: i64) -> Result<Vec<Backfill>> {
        self.with(|c, s| backfill::pg::list(c, s, pipeline, limit))
    }
    fn claim_backfill(&self, pipeline: &str, claimant: &str, versions: &[u32]) -> Result<Option<Backfill>> {
        self.with(|c, s| backfill::pg::claim(c, s, pipeline, claimant, versions))
    }
    fn renew_backfill(&self, id: i64, claimant: &str) -> Result<bool> {
        self.with(|c, s| backfill::pg::renew(c, s, id, claimant))
    }
    fn fail_backfill(&self, id: i64, claimant: &str, error: &str) -> Result<bool> {
        self.with(|c, s| backfill::pg::fail(c, s, id, claimant, error))
    }
    fn finish_backfill(
        &self,
        id: i64,
        claimant: &str,
        format: &weir_engine::RowFormat,
        corrections: &[Correction],
        report: &str,
    ) -> Result<Finish> {
        self.with(|c, s| backfill::pg::finish(c, s, id, claimant, format, corrections, report))
    }
    fn checkpoint_headers(&self, pipeline: &str, version: u32) -> Result<Vec<(u32, Vec<u8>)>> {
        self.with(|c, s| backfill::pg::headers(c, s, pipeline, version))
    }
    fn record_reconciliation(&self, r: &Reconciliation) -> Result<i64> {
        self.with(|c, s| backfill::reconciliations::record_pg(c, s, r))
    }
    fn reconciliations(&self, pipeline: &str, id: Option<i64>, limit: i64) -> Result<Vec<Reconciliation>> {
        self.with(|c, s| backfill::reconciliations::list_pg(c, s, pipeline, id, limit))
    }
    fn finish_drill(&self, id: i64, verdict: &str, report: &str) -> Result<()> {
        self.with(|c, s| drills::pg::finish(c, s, id, verdict, report))
    }
    fn renew_drill(&self, id: i64) -> Result<()> {
        self.with(|c, s| drills::pg::renew(c, s, id))
    }
    fn drills(&self, pipeline: &str, id: Option<i64>, limit: i64) -> Result<Vec<drills::Drill>> {
        self.with(|c, s| drills::pg::list(c, s, pipeline, id, limit))
    }
    fn destination(&self, pipeline: &str, name: &str) -> Result<destinations::Place> {
        self.with(|c, s| destinations::pg::place(c, s, pipeline, name))
    }
    fn record_destination(&self, pipeline: &str, name: &str, step: &destinations::Step) -> Result<()> {
        self.with(|c, s| destinations::pg::record(c, s, pipeline, name, step))
    }
    fn version_entries(&self, pipeline: &str, since: i64, limit: i64) -> Result<Vec<String>> {
        self.with(|c, s| destinations::pg::version_entries(c, s, pipeline, since, limit))
    }
    fn stream_head(&self, pipeline: &str, at: i64) -> Result<destinations::Head> {
        self.with(|c, s| destinations::pg::head(c, s, pipeline, at))
    }
    fn refresh_views(&self, pipeline: &str) -> Result<()> {
        self.with(|c, s| views::pg::refresh(c, s, pipeline))
    }
    fn ledger_stream(&self, pipeline: &str, since: i64, limit: i64) -> Result<Vec<String>> {
        self.with(|c, s| pg::ledger(c, s, pipeline, None, None, (since, limit), false))
    }
    fn ledger_head(&self, pipeline: &str, at: i64) -> Result<destinations::Head> {
        self.with(|c, s| destinations::pg::ledger_head(c, s, pipeline, at))
    }
    fn sink_position(&self, pipeline: &str, topic: &str) -> Result<i64> {
        self.with(|c, s| pg::sink_position(c, s, pipeline, topic))
    }
}

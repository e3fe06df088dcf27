//! Where weir keeps everything it publishes and everything it must
//! remember: checkpoints with their fence, rows, the change stream, the
//! ledger, runs, operator actions (pauses, replays, annotations), tokens and
//! the audit log.
//!
//! Two implementations of one interface:
//!
//! | | the embedded topology | the Kafka topology |
//! |---|---|---|
//! | module | [`sqlite`] (`DATA/weir.db`) | [`pg`] (`[postgres] schema`) |
//! | checkpoint | per pipeline, one transaction | per partition, one transaction, fenced by generation, version and hash |
//! | readers and operator actions | [`Store`] over a [`pool`] | [`Store`] over a [`pool`] |
//!
//! Tokens and the audit log ([`tokens`], [`audit`]) are kept in the data
//! folder's SQLite on both topologies.
//!
//! Nothing here knows HTTP, Kafka or the engine's internals: the runtime
//! hands in the engine's output and delta, the HTTP side asks through
//! [`Store`] and gets a [`StoreError`] it can map to a status.

pub mod audit;
pub mod backfill;
pub mod cases;
pub mod checkpoint;
pub mod checks;
pub mod destinations;
mod digest;
pub mod drills;
pub mod idempotency;
pub mod pg;
pub mod pg_tls;
pub mod pool;
pub mod privacy;
pub mod sqlite;
pub mod tokens;
pub mod versions;
pub mod views;

use std::path::PathBuf;

pub use backfill::{Backfill, BackfillAsk, BackfillState, Correction, Finish, Reconciliation, Schedule};
pub use checkpoint::{CheckpointError, Checkpoints, Claimed, PgCheckpoints, Scope, SqliteCheckpoints};
pub use sqlite::{Annotation, Incident, ResultFilter, ResultPage, RowOrigin, Run};
pub use versions::{FileContract, Registration, Switch, SwitchError, Version, VersionState};

/// Rebuild the state from the log, from this offset of every partition
/// (its first kept record when `None` or older), and republish rows above
/// the revisions published so far: every row, or with `from_time` only the
/// rows of windows that end after it (the state is still rebuilt whole).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Replay {
    pub from_offset: Option<u64>,
    pub from_time: Option<i64>,
}

/// An operator action on a pipeline, done by [`Store::act`] with its audit entry.
#[derive(Debug, Clone, PartialEq)]
pub enum Act {
    /// Hold publishing from the next checkpoint on.
    Pause,
    /// Publish what was held and stop holding.
    Resume,
    /// Ask every runner of a version to replay.
    Replay { version: u32, replay: Replay },
    /// A note on an event-time range, by `who`.
    Annotate { range: (i64, i64), note: String, who: String },
    /// A promote (`Some(version)`) or a rollback (`None`), by `who`, with
    /// its change stream entry.
    Switch { promote: Option<u32>, who: String, why: String },
    /// A step on an incident: open, note, mitigate, resolve.
    Incident(cases::CaseAct),
    /// A failure drill asked: kept as running until its verdict.
    Drill(DrillAsk),
    /// A destination stopped by its receiver's refusal delivers again,
    /// from the refused batch.
    ResumeDestination { name: String },
    /// A backfill asked by an operator, of the windows starting in
    /// `[from_ms, to_ms)`.
    Backfill { version: u32, from_ms: i64, to_ms: i64, who: String, why: String },
    /// A reconciliation's report kept.
    Reconcile(Reconciliation),
}

/// A drill as an operator asks it: the scenario, on the live version.
#[derive(Debug, Clone, PartialEq)]
pub struct DrillAsk {
    pub version: u32,
    pub scenario: String,
    pub who: String,
    pub why: String,
}

impl Act {
    /// How an incident's timeline names this action (an incident's own steps are entries of their own).
    fn timeline(&self) -> Option<String> {
        Some(match self {
            Act::Pause => "paused publishing".into(),
            Act::Resume => "resumed publishing".into(),
            Act::Replay { version, .. } => format!("asked version {version} to replay from the log"),
            Act::Annotate { note, .. } => format!("annotated: {note}"),
            Act::Switch { promote: Some(v), why, .. } => format!("promoted version {v}: {why}"),
            Act::Switch { promote: None, why, .. } => format!("rolled back: {why}"),
            Act::ResumeDestination { name } => format!("resumed destination {name}"),
            Act::Incident(_) | Act::Drill(_) | Act::Backfill { .. } | Act::Reconcile(_) => return None,
        })
    }

    fn who(&self) -> &str {
        match self {
            Act::Annotate { who, .. } | Act::Switch { who, .. } | Act::Backfill { who, .. } => who,
            _ => "operator",
        }
    }
}

/// What an [`Act`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Acted {
    /// Paused or resumed; whether it was paused before.
    Paused {
        was: bool,
    },
    Replay {
        id: i64,
    },
    Annotation {
        id: i64,
    },
    /// The switch and its change stream entry's `seq`, or why there was none
    /// (then nothing was done, and nothing audited).
    Switched(std::result::Result<(Switch, i64), SwitchError>),
    /// The incident as the step left it, or why nothing was done.
    Incident(std::result::Result<cases::Case, cases::CaseError>),
    Drill {
        id: i64,
    },
    /// A destination resumed; whether it was stopped (if not, nothing was done).
    DestinationResumed {
        was_stopped: bool,
    },
    Backfill {
        id: i64,
    },
    Reconciled {
        id: i64,
    },
}

impl Acted {
    /// What the audit entry adds to its detail; `None` when nothing was done.
    pub fn detail(&self) -> Option<serde_json::Value> {
        Some(match self {
            Acted::Paused { was } => serde_json::json!({ "was_paused": was }),
            Acted::Replay { id } => serde_json::json!({ "replay": id }),
            Acted::Annotation { id } => serde_json::json!({ "annotation": id }),
            Acted::Switched(Ok((s, seq))) => serde_json::json!({ "from": s.from, "to": s.to, "seq": seq }),
            Acted::Switched(Err(_)) | Acted::Incident(Err(_)) => return None,
            Acted::Incident(Ok(c)) => serde_json::json!({ "incident": c.id, "status": c.status.as_str() }),
            Acted::Drill { id } => serde_json::json!({ "drill": id }),
            Acted::DestinationResumed { was_stopped: false } => return None,
            Acted::DestinationResumed { was_stopped: true } => serde_json::json!({ "was_stopped": true }),
            Acted::Backfill { id } => serde_json::json!({ "backfill": id }),
            Acted::Reconciled { id } => serde_json::json!({ "reconciliation": id }),
        })
    }
}

/// An audit entry's detail with what the action did added.
pub fn detail_with(detail: &serde_json::Value, acted: &Acted) -> serde_json::Value {
    let mut d = detail.clone();
    if let (Some(obj), Some(serde_json::Value::Object(more))) = (d.as_object_mut(), acted.detail()) {
        obj.extend(more);
    }
    d
}

/// What went wrong in the store, by whose move it is.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Every pooled connection stayed in use for [`pool::WAIT`].
    #[error(
        "every one of the {size} connections to {what} stayed busy for 10 s; try again, or raise pool_connections in weir.toml"
    )]
    Busy { what: &'static str, size: u32 },
    /// The database could not be reached.
    #[error("cannot reach {what}: {message}")]
    Unreachable { what: &'static str, message: String },
    /// A call ran past the store's statement timeout and was stopped.
    #[error(
        "{what} stopped the query after {seconds} s (store_statement_timeout in weir.toml); ask for less (a narrower range, a smaller page), or raise it"
    )]
    TimedOut { what: &'static str, seconds: u64 },
    #[error("the results database failed: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("Postgres failed: {0}")]
    Postgres(#[from] postgres::Error),
}

impl StoreError {
    /// Whether trying again later may succeed (a full pool, a database
    /// away), as opposed to a fault in the request or the data.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Busy { .. }
            | StoreError::Unreachable { .. }
            | StoreError::TimedOut { .. }
            | StoreError::Postgres(_) => true,
            StoreError::Sqlite(e) => matches!(
                e.sqlite_error_code(),
                Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
            ),
        }
    }
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// Where a row sits in the order the store lists a version's rows: its
/// window start, then its key's bytes.
pub type Place = (i64, Vec<u8>);

/// A version's rows that pass a filter, read a page at a time in the order
/// the store lists them (window start, then key bytes): reading all of
/// them holds one page, whatever the version's size. Each page is its own
/// store call (with its own statement timeout); rows written meanwhile are
/// seen where their place falls after the page read last.
pub struct ResultRows<'s> {
    store: &'s dyn Store,
    pipeline: &'s str,
    version: u32,
    filter: ResultFilter,
    page: std::iter::Zip<std::vec::IntoIter<String>, std::vec::IntoIter<Place>>,
    done: bool,
}

impl<'s> ResultRows<'s> {
    /// Rows a page holds.
    pub const PAGE: i64 = 2_000;

    pub fn new(store: &'s dyn Store, pipeline: &'s str, version: u32, filter: ResultFilter) -> ResultRows<'s> {
        let page = Vec::new().into_iter().zip(Vec::new());
        ResultRows { store, pipeline, version, filter: ResultFilter { limit: Self::PAGE, ..filter }, page, done: false }
    }
}

impl Iterator for ResultRows<'_> {
    type Item = Result<(Place, String)>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some((row, place)) = self.page.next() {
                self.filter.after = Some(place.clone());
                return Some(Ok((place, row)));
            }
            if self.done {
                return None;
            }
            match self.store.results(self.pipeline, self.version, &self.filter) {
                Ok(page) => {
                    self.done = (page.rows.len() as i64) < Self::PAGE;
                    self.page = page.rows.into_iter().zip(page.places);
                }
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
    }
}

/// What a pipeline's readers and operators ask of the store, the same on
/// both topologies. Calls block (run them off async threads); each takes a
/// pooled connection for its duration.
pub trait Store: Send + Sync {
    /// Latest row per window of a version, filtered (`GET .../results`).
    fn results(&self, pipeline: &str, version: u32, filter: &ResultFilter) -> Result<ResultPage>;
    /// `[first start, last end)` of a version's timed windows, in ms;
    /// none when it has no timed window (`GET .../diff` compares the time
    /// two versions both cover).
    fn result_span(&self, pipeline: &str, version: u32) -> Result<Option<(i64, i64)>>;
    /// The change stream from `since`, published entries only: every
    /// version's rows and the `version` entries, or one version's rows and
    /// the `version` entries.
    fn changes(&self, pipeline: &str, version: Option<u32>, since: i64, limit: i64) -> Result<Vec<String>>;
    /// A version's ledger entries from `since`, of one reason or all: as
    /// stored for everyone (personal fields masked), or with `raw` as they
    /// arrived (a raw-reader's read).
    fn ledger(
        &self,
        pipeline: &str,
        version: u32,
        reason: Option<&str>,
        page: (i64, i64),
        raw: bool,
    ) -> Result<Vec<String>>;
    /// A version's ledger entries ledgered at `from_ms` or later, after
    /// `after_seq`, as stored for everyone: `(seq, at_ms, entry)` (for `weir review`).
    fn ledger_dated(&self, pipeline: &str, version: u32, page: (i64, i64, i64)) -> Result<Vec<(i64, i64, String)>>;
    /// A version's newest published rows, newest first.
    fn latest_changes(&self, pipeline: &str, version: u32, limit: i64) -> Result<Vec<String>>;
    /// A version's newest ledger entries, newest first.
    fn latest_ledger(&self, pipeline: &str, version: u32, limit: i64) -> Result<Vec<String>>;
    /// One published row with where it came from.
    fn row_origin(&self, pipeline: &str, seq: i64) -> Result<Option<RowOrigin>>;
    /// Whether the audit log is in this store's database (`weir.db`), so
    /// [`Store::act`] commits an action and its audit entry together.
    fn keeps_audit_log(&self) -> bool;
    /// Does an operator action. With `audit` (only where
    /// [`Store::keeps_audit_log`]), its entry, the detail gaining what the
    /// action did, is appended in the same transaction: both happen or
    /// neither does. Returns what was done and the entry's `seq`.
    fn act(&self, pipeline: &str, act: &Act, audit: Option<&audit::Entry<'_>>) -> Result<(Acted, Option<i64>)>;
    fn is_paused(&self, pipeline: &str) -> Result<bool>;
    /// Every stored version, oldest first.
    fn versions(&self, pipeline: &str) -> Result<Vec<Version>>;
    /// The live version (what readers get by default).
    fn live_version(&self, pipeline: &str) -> Result<Option<u32>>;
    /// Stores a contract file's version, or says why it is refused.
    fn register_version(&self, pipeline: &str, file: FileContract<'_>, who: &str) -> Result<Registration>;
    /// A promote (`Some(version)`) or a rollback (`None`) with its change
    /// stream entry: the switch and the entry's `seq`, or why not.
    fn switch_version(
        &self,
        pipeline: &str,
        promote: Option<u32>,
        who: &str,
        why: &str,
    ) -> Result<std::result::Result<(Switch, i64), SwitchError>>;
    /// Removes a version and everything it published (retention).
    fn forget_version(&self, pipeline: &str, version: u32) -> Result<()>;
    fn annotations(&self, pipeline: &str) -> Result<Vec<Annotation>>;
    /// Keeps an alert notification (firing or resolved), so incidents outlive a restart; its id.
    fn record_incident(&self, pipeline: &str, at_ms: i64, notification: &str) -> Result<i64>;
    /// The newest alert notifications, newest first.
    fn incidents(&self, pipeline: &str, limit: i64) -> Result<Vec<Incident>>;
    /// An alert or check (`cause`, `alert:NAME` or `check:NAME`) fired: a
    /// new incident (`title`, `owner`) unless one of the same cause is not
    /// resolved, which gets `text` in its timeline instead; its id.
    fn raise_incident(&self, pipeline: &str, cause: &str, title_owner: (&str, &str), text: &str) -> Result<i64>;
    /// Adds (`kind`, `who`, `text`) to the timeline of every incident of the
    /// pipeline not resolved (of one cause, where given); with `mitigate`,
    /// those open become mitigated. How many it touched.
    fn mark_incidents(
        &self,
        pipeline: &str,
        cause: Option<&str>,
        entry: (&str, &str, &str),
        mitigate: bool,
    ) -> Result<usize>;
    /// The newest incidents first.
    fn incident_cases(&self, pipeline: &str, limit: i64) -> Result<Vec<cases::Case>>;
    /// One incident and its timeline.
    fn incident_case(&self, pipeline: &str, id: i64) -> Result<Option<(cases::Case, Vec<cases::CaseEntry>)>>;
    /// Stores a backfill to do; its id.
    /// Keeps each check result not kept before (by pipeline, version, check
    /// and subject); which ones were new.
    fn record_checks(&self, pipeline: &str, results: &[checks::CheckResult]) -> Result<Vec<bool>>;
    /// A version's check results, newest first.
    fn check_results(
        &self,
        pipeline: &str,
        version: u32,
        filter: &checks::CheckFilter,
    ) -> Result<Vec<checks::CheckResult>>;
    /// How often each check of a version passed and failed since `since_ms`.
    fn check_totals(&self, pipeline: &str, version: u32, since_ms: i64) -> Result<Vec<checks::CheckTotal>>;
    /// The highest row `seq` a check of a version has judged (0 for none).
    fn check_cursor(&self, pipeline: &str, version: u32, check: &str) -> Result<i64>;
    fn ask_backfill(&self, pipeline: &str, ask: &BackfillAsk<'_>) -> Result<i64>;
    fn backfill(&self, pipeline: &str, id: i64) -> Result<Option<Backfill>>;
    /// Asks the next scheduled backfill, unless one was asked too recently; its id.
    fn schedule_backfill(&self, pipeline: &str, schedule: &Schedule<'_>) -> Result<Option<i64>>;
    /// The newest backfill runs, newest first.
    fn backfills(&self, pipeline: &str, limit: i64) -> Result<Vec<Backfill>>;
    /// The oldest backfill of one of `versions` nobody holds, now held by
    /// `claimant` (see [`backfill::LEASE_MS`]).
    fn claim_backfill(&self, pipeline: &str, claimant: &str, versions: &[u32]) -> Result<Option<Backfill>>;
    /// Extends a claim; false when the run is no longer `claimant`'s.
    fn renew_backfill(&self, id: i64, claimant: &str) -> Result<bool>;
    fn fail_backfill(&self, id: i64, claimant: &str, error: &str) -> Result<bool>;
    /// Publishes a backfill's corrections with its report, all or nothing.
    fn finish_backfill(
        &self,
        id: i64,
        claimant: &str,
        format: &weir_engine::RowFormat,
        corrections: &[Correction],
        report: &str,
    ) -> Result<Finish>;
    /// Keeps a reconciliation against a system of record; its id.
    fn record_reconciliation(&self, r: &Reconciliation) -> Result<i64>;
    /// The newest reconciliations first; with `id`, that one only.
    fn reconciliations(&self, pipeline: &str, id: Option<i64>, limit: i64) -> Result<Vec<Reconciliation>>;
    /// The engine headers of a version's last checkpoints, by partition
    /// (one, numbered 0, where one engine reads the whole topic).
    fn checkpoint_headers(&self, pipeline: &str, version: u32) -> Result<Vec<(u32, Vec<u8>)>>;
    /// Keeps a drill's verdict (`pass`, `fail`) and report.
    fn finish_drill(&self, id: i64, verdict: &str, report: &str) -> Result<()>;
    /// Renews a running drill's lease: its server still runs it.
    fn renew_drill(&self, id: i64) -> Result<()>;
    /// The newest drills first; with `id`, that one only.
    fn drills(&self, pipeline: &str, id: Option<i64>, limit: i64) -> Result<Vec<drills::Drill>>;
    /// Where a destination stands (position 1 for one never seen).
    fn destination(&self, pipeline: &str, name: &str) -> Result<destinations::Place>;
    /// Records a destination's step: a batch being sent, delivered, or refused.
    fn record_destination(&self, pipeline: &str, name: &str, step: &destinations::Step) -> Result<()>;
    /// The published `version` entries of the change stream from `since`.
    fn version_entries(&self, pipeline: &str, since: i64, limit: i64) -> Result<Vec<String>>;
    /// The last published `seq`, and when the change at `at` was checkpointed.
    fn stream_head(&self, pipeline: &str, at: i64) -> Result<destinations::Head>;
    /// Makes the pipeline's typed views for BI tools again (see [`views`]).
    fn refresh_views(&self, pipeline: &str) -> Result<()>;
    /// Every version's ledger entries from `since`, in `seq` order, as
    /// stored for everyone (a `kafka` destination in `ledger` mode reads them).
    fn ledger_stream(&self, pipeline: &str, since: i64, limit: i64) -> Result<Vec<String>>;
    /// The last ledger `seq`, and when the entry at `at` was ledgered.
    fn ledger_head(&self, pipeline: &str, at: i64) -> Result<destinations::Head>;
    /// The next `seq` the older `[sink]` publisher would have published to
    /// `topic` (1 if it never published there): where its destination goes on.
    fn sink_position(&self, pipeline: &str, topic: &str) -> Result<i64>;
}

/// The embedded topology's store: `weir.db`, through a pool.
pub struct SqliteStore {
    pool: r2d2::Pool<pool::Sqlite>,
    size: u32,
    /// How long one call may run before SQLite is told to stop it.
    timeout: std::time::Duration,
}

/// How long one store query may run, unless weir.toml's
/// `store_statement_timeout` says otherwise.
pub const STATEMENT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

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
                Act::Incident(step) => Acted::Incident(cases::sqlite::act(&tx, pipeline, step, weir_log::now_ms())?),
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
                cases::sqlite::mark(&tx, pipeline, None, entry, false, weir_log::now_ms())?;
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
    fn record_incident(&self, pipeline: &str, at_ms: i64, notification: &str) -> Result<i64> {
        self.with(|c| sqlite::record_incident(c, pipeline, at_ms, notification))
    }
    fn incidents(&self, pipeline: &str, limit: i64) -> Result<Vec<Incident>> {
        self.with(|c| sqlite::incidents(c, pipeline, limit))
    }
    fn raise_incident(&self, pipeline: &str, cause: &str, title_owner: (&str, &str), text: &str) -> Result<i64> {
        self.with(|c| cases::sqlite::raise(c, pipeline, cause, title_owner, text, weir_log::now_ms()))
    }
    fn mark_incidents(
        &self,
        pipeline: &str,
        cause: Option<&str>,
        entry: (&str, &str, &str),
        mitigate: bool,
    ) -> Result<usize> {
        self.with(|c| {
            // Immediate, as `cases::sqlite::raise`: it reads, then writes.
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let n = cases::sqlite::mark(&tx, pipeline, cause, entry, mitigate, weir_log::now_ms())?;
            tx.commit()?;
            Ok(n)
        })
    }
    fn incident_cases(&self, pipeline: &str, limit: i64) -> Result<Vec<cases::Case>> {
        self.with(|c| cases::sqlite::list(c, pipeline, limit))
    }
    fn incident_case(&self, pipeline: &str, id: i64) -> Result<Option<(cases::Case, Vec<cases::CaseEntry>)>> {
        self.with(|c| cases::sqlite::get(c, pipeline, id))
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
                Acted::Incident(self.with(|c, s| cases::pg::act(c, s, pipeline, step, weir_log::now_ms()))?)
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
    fn record_incident(&self, pipeline: &str, at_ms: i64, notification: &str) -> Result<i64> {
        self.with(|c, s| pg::record_incident(c, s, pipeline, at_ms, notification))
    }
    fn incidents(&self, pipeline: &str, limit: i64) -> Result<Vec<Incident>> {
        self.with(|c, s| pg::incidents(c, s, pipeline, limit))
    }
    fn raise_incident(&self, pipeline: &str, cause: &str, title_owner: (&str, &str), text: &str) -> Result<i64> {
        self.with(|c, s| cases::pg::raise(c, s, pipeline, cause, title_owner, text, weir_log::now_ms()))
    }
    fn mark_incidents(
        &self,
        pipeline: &str,
        cause: Option<&str>,
        entry: (&str, &str, &str),
        mitigate: bool,
    ) -> Result<usize> {
        self.with(|c, s| cases::pg::mark(c, s, pipeline, cause, entry, mitigate, weir_log::now_ms()))
    }
    fn incident_cases(&self, pipeline: &str, limit: i64) -> Result<Vec<cases::Case>> {
        self.with(|c, s| cases::pg::list(c, s, pipeline, limit))
    }
    fn incident_case(&self, pipeline: &str, id: i64) -> Result<Option<(cases::Case, Vec<cases::CaseEntry>)>> {
        self.with(|c, s| cases::pg::get(c, s, pipeline, id))
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

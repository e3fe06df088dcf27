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
pub mod checkpoint;
pub mod checks;
pub mod destinations;
pub mod digest;
pub mod drills;
pub mod idempotency;
pub mod incidents;
pub mod pg;
pub mod pg_tls;
pub mod pool;
pub mod privacy;
pub mod rows;
pub mod sqlite;
pub mod tokens;
pub mod versions;
pub mod views;
pub mod window_batches;

pub use backfill::{Backfill, BackfillAsk, BackfillState, Correction, Finish, Reconciliation, Schedule};
pub use checkpoint::{CheckpointError, Checkpoints, Claimed, Scope};
pub use pg::checkpoints::PgCheckpoints;
pub use pg::store::PostgresStore;
pub use rows::{Annotation, Notification, ResultFilter, ResultPage, RowOrigin, Run};
pub use sqlite::checkpoints::SqliteCheckpoints;
pub use sqlite::store::SqliteStore;
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
    Incident(incidents::CaseAct),
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
    Incident(std::result::Result<incidents::Incident, incidents::CaseError>),
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
    /// What cannot be done, and what to do, in full (a schema of another
    /// version, a name refused, a token that cannot be made).
    #[error("{0}")]
    Refused(String),
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
            StoreError::Refused(_) => false,
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
    fn record_notification(&self, pipeline: &str, at_ms: i64, notification: &str) -> Result<i64>;
    /// The newest alert notifications, newest first.
    fn notifications(&self, pipeline: &str, limit: i64) -> Result<Vec<Notification>>;
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
    fn incidents(&self, pipeline: &str, limit: i64) -> Result<Vec<incidents::Incident>>;
    /// One incident and its timeline.
    fn incident(&self, pipeline: &str, id: i64)
        -> Result<Option<(incidents::Incident, Vec<incidents::IncidentEntry>)>>;
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

/// How long one store query may run, unless weir.toml's
/// `store_statement_timeout` says otherwise.
pub const STATEMENT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

//! Destinations (SPEC.md 11): a pipeline's change stream delivered to
//! where the decision acts, at least once, made effective once by the
//! destination.
//!
//! One [`DestinationRunner`] thread per destination reads the change
//! stream from the store in `seq` order (every version's rows and the
//! `version` entries, as `/changes` serves them; rows held by a pause are
//! not there until the resume, so a pause holds every destination) and
//! delivers it in batches:
//!
//! - **What a destination takes.** An `http` destination and a `postgres`
//!   table in `upsert` mode take the *live* version's rows: a row is taken
//!   when its version is the one live at its place in the stream (the
//!   `from` of the next `version` entry, else the live version). At a
//!   `version` entry (a promote or a rollback) they take the entry, then
//!   the new live version's rows as they stood at it (its `results` whose
//!   `seq` is below the entry's), in pages of `batch`, so the destination
//!   holds the new version's rows from there on. A table in `changes` mode
//!   takes every change as it is, entries included, and so does a `kafka`
//!   destination in `changes` mode; one in `ledger` mode reads the ledger
//!   instead (every version's entries in their `seq` order, personal fields
//!   masked), its position a ledger `seq`.
//! - **`http`.** Each batch of consecutive changes is one POST of JSON
//!   lines with `Idempotency-Key: {pipeline}/{version}/{first seq}-{last
//!   seq}` (a version entry's pages: `{pipeline}/{to}/{seq}-{seq}`, then
//!   `.../{seq}-{seq}/{page}` from the second page). A batch is the changes
//!   in the window of `batch` seqs from the position, cut before a `version`
//!   entry. Once a change past the window is published, the window reads
//!   the same after a crash, so the batch is sent again as it was from the
//!   position alone; a batch at the stream's head (more changes may join
//!   its window) and a version entry's page are written to the store as
//!   `pending` before they are sent, and sent again exactly as they were.
//!   So a receiver that applies each key once applies each change once,
//!   and catching up writes nothing to the store per batch. The position
//!   delivered is recorded by the next `pending`, else at most once a
//!   second: a crash sends the batches since again, under their keys.
//!   408, 429, 5xx and network errors are retried with backoff (0.5 s
//!   doubling to 30 s); any other answer stops the destination (`stopped`,
//!   an incident for the owner with the receiver's answer, the refused
//!   batch recorded `pending`) until an operator resumes it
//!   (`Act::ResumeDestination`), which sends the refused batch again.
//! - **`postgres`.** See [`crate::pg_destination`]: rows and the position
//!   commit in one transaction of the destination's database.
//!
//! With Postgres as the store (the Kafka topology), one worker delivers
//! each destination: the one holding its advisory lock.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use weir_contract::{Connection, Contract, Destination, DestinationKind, KafkaMode, PostgresConfig, TableMode};
use weir_store::destinations::Step;
use weir_store::{ResultFilter, Store};

use crate::lock;

/// A change of the stream as a destination reads it: the line `/changes`
/// serves, with what delivering it needs read from it. The whole line is
/// parsed only by a destination that reads its fields ([`Change::value`]):
/// an `http` destination sends the line as it is.
#[derive(Debug, Clone)]
pub struct Change {
    pub seq: i64,
    /// The row's version, or the version a `version` entry makes live.
    pub version: u32,
    /// For a `version` entry, the version it replaced.
    pub switch_from: Option<Option<u32>>,
    pub line: String,
    value: std::cell::OnceCell<serde_json::Value>,
}

/// The fields of a change's line that say where it stands; serde skips the rest.
#[derive(serde::Deserialize)]
struct Head {
    seq: Option<i64>,
    version: Option<u64>,
    #[serde(rename = "type")]
    kind: Option<String>,
    from: Option<u64>,
    to: Option<u64>,
}

impl Change {
    pub fn parse(line: String) -> Result<Change, String> {
        let head: Head =
            serde_json::from_str(&line).map_err(|e| format!("a stored change is not JSON ({e}): {line:.200}"))?;
        let seq = head.seq.ok_or_else(|| format!("a stored change has no seq: {line:.200}"))?;
        let (version, switch_from) = if head.kind.as_deref() == Some("version") {
            let to = head.to.ok_or_else(|| format!("version entry {seq} has no `to`"))?;
            (to as u32, Some(head.from.map(|v| v as u32)))
        } else {
            (head.version.ok_or_else(|| format!("change {seq} has no version"))? as u32, None)
        };
        Ok(Change { seq, version, switch_from, line, value: std::cell::OnceCell::new() })
    }

    /// A change read already as a JSON value (a ledger entry, masked).
    fn of_value(seq: i64, version: u32, line: String, value: serde_json::Value) -> Change {
        Change { seq, version, switch_from: None, line, value: std::cell::OnceCell::from(value) }
    }

    /// The whole line as JSON, parsed at the first call.
    pub fn value(&self) -> &serde_json::Value {
        // The line parsed as JSON in `parse`, so this parse does not fail.
        self.value.get_or_init(|| serde_json::from_str(&self.line).unwrap_or(serde_json::Value::Null))
    }

    pub fn is_switch(&self) -> bool {
        self.switch_from.is_some()
    }
}

/// What one delivery carries.
#[derive(Debug, Clone)]
pub enum Work {
    /// The changes `first..=last` of the stream; `taken` those the
    /// destination takes, in order (none: the batch only moves the position).
    /// `settled`: read again from `first`, the batch is the same (see
    /// [`DestinationRunner::next`]), so it needs no `pending` record.
    Changes { first: i64, last: i64, version: u32, taken: Vec<Change>, settled: bool },
    /// A page of a `version` entry's delivery: the entry (on the first
    /// page) and the new live version's rows as they stood at it.
    Switch {
        entry: Change,
        page: u32,
        /// Where in `results`' order (window start, key bytes) the page starts, and where the next one does.
        after: Option<(i64, Vec<u8>)>,
        next_after: Option<(i64, Vec<u8>)>,
        rows: Vec<Change>,
        last_page: bool,
    },
}

impl Work {
    /// The `Idempotency-Key` of this batch.
    pub fn key(&self, pipeline: &str) -> String {
        match self {
            Work::Changes { first, last, version, .. } => format!("{pipeline}/{version}/{first}-{last}"),
            Work::Switch { entry, page: 1, .. } => format!("{pipeline}/{}/{}-{}", entry.version, entry.seq, entry.seq),
            Work::Switch { entry, page, .. } => {
                format!("{pipeline}/{}/{}-{}/{page}", entry.version, entry.seq, entry.seq)
            }
        }
    }

    /// Whether the batch is read the same again after a crash without a `pending` record.
    fn settled(&self) -> bool {
        matches!(self, Work::Changes { settled: true, .. })
    }

    /// The lines sent, in order.
    pub fn lines(&self) -> Vec<&Change> {
        match self {
            Work::Changes { taken, .. } => taken.iter().collect(),
            Work::Switch { entry, page, rows, .. } => {
                let first = (*page == 1).then_some(entry);
                first.into_iter().chain(rows.iter()).collect()
            }
        }
    }

    /// The batch as `pending` names it, to send it again as it was.
    fn pending(&self) -> Pending {
        match self {
            Work::Changes { first, last, .. } => Pending::Changes { first: *first, last: *last },
            Work::Switch { entry, page, after, .. } => {
                Pending::Switch { seq: entry.seq, page: *page, after: after.clone() }
            }
        }
    }

    /// Where the stream stands once this batch is delivered: the next
    /// position, and the next page of a version entry's delivery.
    fn after_delivery(&self) -> (i64, Option<Pending>) {
        match self {
            Work::Changes { last, .. } => (last + 1, None),
            Work::Switch { entry, last_page: true, .. } => (entry.seq + 1, None),
            Work::Switch { entry, page, next_after, .. } => {
                (entry.seq, Some(Pending::Switch { seq: entry.seq, page: page + 1, after: next_after.clone() }))
            }
        }
    }
}

/// A batch to send again, as `pending` describes it.
#[derive(Debug, Clone, PartialEq)]
enum Pending {
    Changes { first: i64, last: i64 },
    Switch { seq: i64, page: u32, after: Option<(i64, Vec<u8>)> },
}

impl Pending {
    fn parse(text: &str) -> Result<Pending, String> {
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("a pending batch is not JSON ({e}): {text:.200}"))?;
        if let (Some(first), Some(last)) = (v["first"].as_i64(), v["last"].as_i64()) {
            return Ok(Pending::Changes { first, last });
        }
        let (Some(seq), Some(page)) = (v["switch"].as_i64(), v["page"].as_u64()) else {
            return Err(format!("a pending batch names no changes: {text:.200}"));
        };
        let after = match &v["after"] {
            serde_json::Value::Array(a) => {
                let start = a.first().and_then(serde_json::Value::as_i64);
                let key = a.get(1).and_then(serde_json::Value::as_str).and_then(unhex);
                Some((
                    start.ok_or("a pending page's place has no start")?,
                    key.ok_or("a pending page's key is not hex")?,
                ))
            }
            _ => None,
        };
        Ok(Pending::Switch { seq, page: page as u32, after })
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

/// Why a delivery did not happen.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    /// Worth trying again: a network error, a busy or failing receiver.
    Retry(String),
    /// The receiver refused the batch: the destination stops until resumed.
    Refused(String),
}

/// Where a destination delivers.
pub trait Target {
    /// The position the target keeps itself (committed with what it
    /// applied), if it keeps one.
    fn position(&mut self) -> Result<Option<i64>, Failure>;
    /// Applies a batch; a target that keeps its position commits
    /// `next` (the position after it) with it, only if its stored
    /// position is still `from`.
    fn deliver(&mut self, work: &Work, from: i64, next: i64) -> Result<(), Failure>;
}

/// A destination's state, for `/status`, `/metrics` and the dashboard.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DestinationStatus {
    pub name: String,
    pub kind: String,
    /// `delivering`, `caught up`, `held: the pipeline is paused`,
    /// `stopped: WHY`, `failing: WHY`, `waiting: another worker delivers`.
    pub state: String,
    /// The next `seq` to deliver.
    pub position: i64,
    /// The last published `seq`.
    pub head: i64,
    /// Changes published and not yet delivered.
    pub lag_changes: i64,
    /// Seconds since the oldest change not yet delivered was published.
    pub lag_seconds: f64,
    pub last_error: Option<String>,
    /// Batches and lines delivered since the server started.
    pub batches: u64,
    pub delivered: u64,
    /// Attempts that failed and were tried again.
    pub retries: u64,
}

/// One destination's delivery thread.
pub struct DestinationRunner {
    pub pipeline: String,
    /// Who an incident goes to (the contract's owner).
    pub owner: String,
    pub destination: Destination,
    pub connection: Connection,
    /// Every version's contract this server knows, for a table's columns.
    pub contracts: BTreeMap<u32, Contract>,
    /// The version whose contract declares the destination.
    pub declared_by: u32,
    pub store: Arc<dyn Store>,
    /// With Postgres as the store, where the advisory lock is taken.
    pub exclusive: Option<PostgresConfig>,
    /// weir.toml's `[kafka]`, whose librdkafka settings (TLS, SASL) a `kafka` destination uses too.
    pub kafka: Option<weir_contract::KafkaConfig>,
    pub status: Arc<Mutex<DestinationStatus>>,
    pub stop: Arc<AtomicBool>,
    /// The pipeline's bell: a checkpoint here wakes a caught-up destination at once.
    pub bell: Arc<crate::bell::Bell>,
}

const BACKOFF_FIRST: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// How often a destination that keeps delivering records its position.
const SAVE_EVERY: Duration = Duration::from_secs(1);
/// How often a delivering destination measures its lag.
const MEASURE_EVERY: Duration = Duration::from_millis(500);
/// How often a caught-up destination looks for new changes without a ring
/// of the bell: often where other workers commit too (Postgres), rarely where
/// every commit rings it.
const POLL_SHARED: Duration = Duration::from_millis(100);
const POLL_ALONE: Duration = Duration::from_secs(1);

impl DestinationRunner {
    /// Delivers until `stop`, starting again after any failure.
    pub fn run(self) {
        let mut backoff = BACKOFF_FIRST;
        while !self.stop.load(Ordering::SeqCst) {
            let started = Instant::now();
            match self.deliver_all() {
                Ok(()) => backoff = BACKOFF_FIRST,
                Err(e) => {
                    self.set(|s| {
                        s.state = format!("failing: {e}");
                        s.last_error = Some(e.clone());
                        s.retries += 1;
                    });
                    if started.elapsed() > Duration::from_secs(60) {
                        backoff = BACKOFF_FIRST;
                    }
                    self.sleep(backoff);
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
    }

    fn set(&self, f: impl FnOnce(&mut DestinationStatus)) {
        f(&mut lock(&self.status));
    }

    /// Sleeps up to `d`, waking early when the server stops.
    fn sleep(&self, d: Duration) {
        let until = Instant::now() + d;
        while Instant::now() < until && !self.stop.load(Ordering::SeqCst) {
            std::thread::sleep((until - Instant::now()).min(Duration::from_millis(50)));
        }
    }

    /// Sleeps up to `d` like [`Self::sleep`], measuring the lag meanwhile, so
    /// that `/status` and `max_destination_lag` see it grow during a backoff.
    fn wait_measuring(&self, d: Duration, position: i64) -> Result<(), String> {
        let until = Instant::now() + d;
        while Instant::now() < until && !self.stop.load(Ordering::SeqCst) {
            self.sleep((until - Instant::now()).min(MEASURE_EVERY));
            self.measure(position)?;
        }
        Ok(())
    }

    fn name(&self) -> &str {
        &self.destination.name
    }

    /// Takes the destination (the advisory lock, on Postgres), connects to
    /// it and delivers until stopped; an error ends the attempt.
    fn deliver_all(&self) -> Result<(), String> {
        let _held = match &self.exclusive {
            Some(pg) => match take_lock(pg, &self.pipeline, self.name())? {
                Some(client) => Some(client),
                None => {
                    self.set(|s| s.state = "waiting: another worker delivers".into());
                    self.sleep(Duration::from_secs(1));
                    return Ok(());
                }
            },
            None => None,
        };
        let mut target = self.connect()?;
        let stored = self.store.destination(&self.pipeline, self.name()).map_err(|e| e.to_string())?;
        let mut position = stored.position;
        let mut pending = stored.pending.as_deref().map(Pending::parse).transpose()?;
        let mut stopped = stored.stopped;
        if let Some(own) = target.position().map_err(failure_text)? {
            (position, pending) = (own, None);
        }
        if let (DestinationKind::Kafka { topic, mode: KafkaMode::Changes | KafkaMode::Ledger, .. }, None) =
            (&self.destination.kind, stored.delivered_ms)
        {
            // Never delivered: go on from where the older `[sink]` publisher on this topic stopped.
            if position == 1 && pending.is_none() {
                position = self.store.sink_position(&self.pipeline, topic).map_err(|e| e.to_string())?;
            }
        }
        let mut live = self.live_at(position)?;
        let mut backoff = BACKOFF_FIRST;
        let mut measured = Instant::now();
        // A position delivered and not yet recorded in the store, and when one last was.
        let (mut unsaved, mut saved): (Option<i64>, Instant) = (None, Instant::now());
        while !self.stop.load(Ordering::SeqCst) {
            if let Some(why) = &stopped {
                self.set(|s| s.state = format!("stopped: {why}"));
                self.measure(position)?;
                self.sleep(Duration::from_secs(1));
                stopped = self.store.destination(&self.pipeline, self.name()).map_err(|e| e.to_string())?.stopped;
                continue;
            }
            let rung = self.bell.rung();
            let work = match &pending {
                Some(p) => Some(self.rebuild(p, live)?),
                None => self.next(position, live)?,
            };
            let Some(work) = work else {
                if let Some(next) = unsaved.filter(|_| saved.elapsed() > SAVE_EVERY) {
                    self.save(next)?;
                    (unsaved, saved) = (None, Instant::now());
                }
                self.caught_up(position)?;
                let poll = if self.exclusive.is_some() { POLL_SHARED } else { POLL_ALONE };
                self.bell.wait(rung, poll);
                continue;
            };
            let keeps_position = matches!(self.destination.kind, DestinationKind::Postgres { .. });
            let keyed = self.destination.kind == DestinationKind::Http;
            if keyed && pending.is_none() && !work.lines().is_empty() && !work.settled() {
                let step = Step::Sending { position, pending: describe_pending(&work.pending()) };
                self.store.record_destination(&self.pipeline, self.name(), &step).map_err(|e| e.to_string())?;
            }
            let (next, next_pending) = work.after_delivery();
            match target.deliver(&work, position, next) {
                Ok(()) => {
                    backoff = BACKOFF_FIRST;
                    self.delivered(&work, next, next_pending.as_ref())?;
                    unsaved = next_pending.is_none().then_some(next);
                    if unsaved.is_some() && saved.elapsed() > SAVE_EVERY {
                        self.save(next)?;
                        (unsaved, saved) = (None, Instant::now());
                    }
                    if measured.elapsed() > MEASURE_EVERY {
                        self.measure(next)?;
                        measured = Instant::now();
                    }
                    if let Work::Switch { entry, last_page: true, .. } = &work {
                        live = entry.version;
                    }
                    (position, pending) = (next, next_pending);
                }
                Err(Failure::Retry(e)) => {
                    self.set(|s| {
                        s.state = format!("failing: {e}");
                        s.last_error = Some(e.clone());
                        s.retries += 1;
                    });
                    self.measure(position)?;
                    if keeps_position {
                        return Err(e);
                    }
                    pending = Some(work.pending());
                    self.wait_measuring(backoff, position)?;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
                Err(Failure::Refused(why)) => {
                    self.refused(&work, position, &why)?;
                    pending = Some(work.pending());
                    stopped = Some(why);
                }
            }
        }
        Ok(())
    }

    fn connect(&self) -> Result<Box<dyn Target>, String> {
        Ok(match &self.destination.kind {
            DestinationKind::Http => Box::new(HttpTarget {
                agent: crate::outbound::agent(self.connection.allow_private, Duration::from_secs(30)),
                url: self.connection.url.clone(),
                headers: self.connection.headers.clone(),
                pipeline: self.pipeline.clone(),
            }),
            DestinationKind::Kafka { topic, mode, .. } => {
                Box::new(KafkaTarget::connect(&self.connection.url, self.kafka.as_ref(), topic, *mode)?)
            }
            DestinationKind::Postgres { table, mode } => Box::new(crate::pg_destination::PgTarget::connect(
                &self.connection.url,
                (&self.pipeline, self.name()),
                (table, *mode),
                &self.contracts,
                self.declared_by,
            )?),
        })
    }

    /// Whether this destination takes only the live version's rows.
    fn live_only(&self) -> bool {
        !matches!(
            self.destination.kind,
            DestinationKind::Postgres { mode: TableMode::Changes, .. }
                | DestinationKind::Kafka { mode: KafkaMode::Changes | KafkaMode::Ledger, .. }
        )
    }

    /// Whether this destination reads the ledger instead of the change stream.
    fn reads_ledger(&self) -> bool {
        matches!(self.destination.kind, DestinationKind::Kafka { mode: KafkaMode::Ledger, .. })
    }

    /// The stream from `since`, at most `limit`: the changes, or the ledger's
    /// entries with their personal fields masked.
    fn read(&self, since: i64, limit: i64) -> Result<Vec<Change>, String> {
        if !self.reads_ledger() {
            let lines = self.store.changes(&self.pipeline, None, since, limit).map_err(|e| e.to_string())?;
            return lines.into_iter().map(Change::parse).collect();
        }
        let lines = self.store.ledger_stream(&self.pipeline, since, limit).map_err(|e| e.to_string())?;
        lines
            .into_iter()
            .map(|line| {
                let value: serde_json::Value = serde_json::from_str(&line)
                    .map_err(|e| format!("a stored ledger entry is not JSON ({e}): {line:.200}"))?;
                let seq =
                    value["seq"].as_i64().ok_or_else(|| format!("a stored ledger entry has no seq: {line:.200}"))?;
                let version = value["version"].as_u64().map_or(self.declared_by, |v| v as u32);
                let contract = self.contracts.get(&version).or_else(|| self.contracts.get(&self.declared_by));
                match contract {
                    Some(c) if !c.personal.is_empty() => {
                        let value = crate::privacy::for_sink(value, c);
                        Ok(Change::of_value(seq, version, value.to_string(), value))
                    }
                    _ => Ok(Change::of_value(seq, version, line, value)),
                }
            })
            .collect()
    }

    /// The version live at `position` of the stream: the `from` of the next
    /// `version` entry, else the live version now.
    fn live_at(&self, position: i64) -> Result<u32, String> {
        // The live version first: an entry committed between the two reads is then seen by the second.
        let now = self.store.live_version(&self.pipeline).map_err(|e| e.to_string())?.unwrap_or(self.declared_by);
        let entries = self.store.version_entries(&self.pipeline, position, 1).map_err(|e| e.to_string())?;
        match entries.into_iter().next() {
            Some(line) => {
                let entry = Change::parse(line)?;
                Ok(entry.switch_from.flatten().unwrap_or(entry.version))
            }
            None => Ok(now),
        }
    }

    /// The next batch from `position`, or `None` when there is nothing new:
    /// the changes in the window of `batch` seqs from `position`, cut before
    /// a `version` entry where the destination takes only the live version.
    ///
    /// Once a change at or past the window's end is published (or the cut
    /// is made), the batch is `settled`: read again after a crash, from the
    /// same position, it is the same batch under the same key, so it is sent
    /// without a `pending` record, and the stream's commits do not wait for a
    /// write of the store per batch while the destination catches up. A
    /// batch at the stream's head is not settled (more changes may join its
    /// window) and is recorded as `pending` before it is sent.
    fn next(&self, position: i64, live: u32) -> Result<Option<Work>, String> {
        let size = self.destination.batch as i64;
        let end = position.saturating_add(size - 1);
        let mut changes = self.read(position, size + 1)?;
        let whole = changes.last().is_some_and(|c| c.seq >= end);
        changes.retain(|c| c.seq <= end);
        let Some(first) = changes.first() else {
            // A window with no change in it (a gap in the seqs), already passed.
            return Ok(whole.then_some(Work::Changes {
                first: position,
                last: end,
                version: live,
                taken: Vec::new(),
                settled: true,
            }));
        };
        if first.is_switch() && self.live_only() {
            return self.switch_page(first.clone(), 1, None).map(Some);
        }
        Ok(Some(self.changes_work(changes, live, position, whole.then_some(end))))
    }

    /// The changes up to (not including) the next `version` entry, as one
    /// batch from `position`; `end`: the window read is whole up to there.
    fn changes_work(&self, changes: Vec<Change>, live: u32, position: i64, end: Option<i64>) -> Work {
        let live_only = self.live_only();
        let first = changes.first().map_or(0, |c| c.seq);
        let mut last = first;
        let mut taken = Vec::new();
        let mut cut = None;
        for c in changes {
            if c.is_switch() && live_only {
                cut = Some(c.seq - 1);
                break;
            }
            last = c.seq;
            if !live_only || c.version == live {
                taken.push(c);
            }
        }
        match cut.or(end) {
            Some(last) => Work::Changes { first: position, last, version: live, taken, settled: true },
            None => Work::Changes { first, last, version: live, taken, settled: false },
        }
    }

    /// A pending batch, read again as it was first read.
    fn rebuild(&self, pending: &Pending, live: u32) -> Result<Work, String> {
        match pending {
            Pending::Changes { first, last } => {
                let changes = self.read(*first, last - first + 1)?;
                let changes: Vec<Change> = changes.into_iter().filter(|c| c.seq <= *last).collect();
                match self.changes_work(changes, live, *first, None) {
                    Work::Changes { version, taken, .. } => {
                        Ok(Work::Changes { first: *first, last: *last, version, taken, settled: false })
                    }
                    other => Ok(other),
                }
            }
            Pending::Switch { seq, page, after } => {
                let lines = self.store.changes(&self.pipeline, None, *seq, 1).map_err(|e| e.to_string())?;
                let entry = lines.into_iter().next().map(Change::parse).transpose()?;
                match entry {
                    Some(e) if e.seq == *seq && e.is_switch() => self.switch_page(e, *page, after.clone()),
                    _ => Err(format!("the version entry {seq} a pending batch names is not published")),
                }
            }
        }
    }

    /// Page `page` of a `version` entry's delivery: the new live version's
    /// rows below the entry's `seq`, from `after` in `results`' order.
    fn switch_page(&self, entry: Change, page: u32, after: Option<(i64, Vec<u8>)>) -> Result<Work, String> {
        let limit = self.destination.batch as i64;
        let filter = ResultFilter { limit, after: after.clone(), ..ResultFilter::default() };
        let found = self.store.results(&self.pipeline, entry.version, &filter).map_err(|e| e.to_string())?;
        let last_page = (found.rows.len() as i64) < limit;
        let next_after = found.places.last().cloned();
        let mut rows = Vec::new();
        for line in found.rows {
            let row = Change::parse(line)?;
            // A row newer than the entry comes later in the stream anyway.
            if row.seq < entry.seq {
                rows.push(row);
            }
        }
        Ok(Work::Switch { entry, page, after, next_after, rows, last_page })
    }

    /// Records a delivered batch and what it moved.
    ///
    /// The next page of a version entry's delivery is recorded at once (it is
    /// sent next, as it is); a plain position is recorded by the next batch's
    /// `Sending`, or by [`Self::save`] at most once a second: a
    /// crash before that sends the batch again under its key, which the
    /// receiver applies once, so the stream's commits do not wait for a
    /// write of the store per batch.
    fn delivered(&self, work: &Work, next: i64, next_pending: Option<&Pending>) -> Result<(), String> {
        if let Some(p) = next_pending {
            let step = Step::Sending { position: next, pending: describe_pending(p) };
            self.store.record_destination(&self.pipeline, self.name(), &step).map_err(|e| e.to_string())?;
        }
        let lines = work.lines().len() as u64;
        self.set(|s| {
            s.state = "delivering".into();
            s.position = next;
            s.batches += 1;
            s.delivered += lines;
            s.last_error = None;
        });
        Ok(())
    }

    /// Records the position delivered up to (nothing pending).
    fn save(&self, next: i64) -> Result<(), String> {
        let step = Step::Delivered { next };
        self.store.record_destination(&self.pipeline, self.name(), &step).map_err(|e| e.to_string())
    }

    /// Nothing new to deliver: how far behind the stream's head it is.
    fn caught_up(&self, position: i64) -> Result<(), String> {
        self.measure(position)?;
        let paused = self.store.is_paused(&self.pipeline).map_err(|e| e.to_string())?;
        self.set(|s| s.state = if paused { "held: the pipeline is paused".into() } else { "caught up".into() });
        Ok(())
    }

    /// How far behind the stream's head `position` is: in changes, and in
    /// time since the oldest change not delivered was published.
    fn measure(&self, position: i64) -> Result<(), String> {
        let head = if self.reads_ledger() {
            self.store.ledger_head(&self.pipeline, position)
        } else {
            self.store.stream_head(&self.pipeline, position)
        };
        let head = head.map_err(|e| e.to_string())?;
        let lag_seconds = head.at_ms.map_or(0.0, |at| (weir_log::now_ms() - at).max(0) as f64 / 1000.0);
        self.set(|s| {
            s.position = position;
            s.head = head.last;
            s.lag_changes = (head.last - position + 1).max(0);
            s.lag_seconds = lag_seconds;
        });
        Ok(())
    }

    /// The receiver refused a batch: stopped until an operator resumes it,
    /// with an incident for the owner.
    fn refused(&self, work: &Work, position: i64, why: &str) -> Result<(), String> {
        if work.settled() {
            // Sent without a record: recorded now, so a resume after a restart sends this batch first.
            let step = Step::Sending { position, pending: describe_pending(&work.pending()) };
            self.store.record_destination(&self.pipeline, self.name(), &step).map_err(|e| e.to_string())?;
        }
        let step = Step::Stopped { why: why.to_owned() };
        self.store.record_destination(&self.pipeline, self.name(), &step).map_err(|e| e.to_string())?;
        let title =
            format!("Destination {} stopped: its receiver refused batch {}", self.name(), work.key(&self.pipeline));
        let text = format!(
            "Why did the receiver of destination {} refuse batch {}? It answered: {why}. Nothing after this batch is delivered until an operator runs `weir resume {} --destination {}`, which sends this batch again.",
            self.name(),
            work.key(&self.pipeline),
            self.pipeline,
            self.name()
        );
        let cause = format!("destination:{}", self.name());
        self.store.raise_incident(&self.pipeline, &cause, (&title, &self.owner), &text).map_err(|e| e.to_string())?;
        eprintln!("weir: {}: {title}: {why}", self.pipeline);
        self.set(|s| {
            s.state = format!("stopped: {why}");
            s.last_error = Some(why.to_owned());
        });
        Ok(())
    }
}

fn describe_pending(p: &Pending) -> String {
    match p {
        Pending::Changes { first, last } => serde_json::json!({ "first": first, "last": last }).to_string(),
        Pending::Switch { seq, page, after } => serde_json::json!({
            "switch": seq,
            "page": page,
            "after": after.as_ref().map(|(start, key)| (start, hex(key))),
        })
        .to_string(),
    }
}

fn failure_text(f: Failure) -> String {
    match f {
        Failure::Retry(e) | Failure::Refused(e) => e,
    }
}

/// The advisory lock that makes one worker deliver a destination, held by
/// the returned client's session; `None` while another worker holds it.
fn take_lock(pg: &PostgresConfig, pipeline: &str, name: &str) -> Result<Option<postgres::Client>, String> {
    let mut client = weir_store::pg::connect(&pg.url)
        .map_err(|e| format!("cannot reach Postgres for the destination's lock: {e}"))?;
    let key = format!("weir destination {}.{pipeline}/{name}", pg.schema);
    let held: bool = client
        .query_one("SELECT pg_try_advisory_lock(hashtext($1))", &[&key])
        .map_err(|e| format!("cannot take the destination's lock: {e}"))?
        .get(0);
    Ok(held.then_some(client))
}

/// A `kafka` destination: each change one record on the topic,
/// acknowledged by every in-sync replica before the position moves. At
/// least once: a consumer applies a record only if its `seq` is greater
/// than the last it applied for that record key.
///
/// - `live`: keyed by `{"key":...,"window_start":...}` (a `version` entry
///   by `{"type":"version"}`). A row restated at a `version` entry carries
///   the entry's `seq` (and its own as `restated_from`), so it replaces
///   what the consumer holds.
/// - `changes`: every version's rows, keyed by
///   `{"version":...,"key":...,"window_start":...}` (a `version` entry by
///   `{"type":"version","to":...}`), as the older `[sink]` published them.
/// - `ledger`: each entry keyed by `{"version":...,"partition":...,"offset":...}`.
struct KafkaTarget {
    producer: rdkafka::producer::FutureProducer,
    topic: String,
    mode: KafkaMode,
    runtime: tokio::runtime::Runtime,
}

impl KafkaTarget {
    fn connect(
        url: &str,
        kafka: Option<&weir_contract::KafkaConfig>,
        topic: &str,
        mode: KafkaMode,
    ) -> Result<KafkaTarget, String> {
        let brokers = url.strip_prefix("kafka://").unwrap_or(url);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start a runtime for Kafka: {e}"))?;
        runtime
            .block_on(crate::kafka::ensure_topic(brokers, kafka, topic, 1))
            .map_err(|e| format!("the Kafka topic {topic} at {brokers}: {e:#}"))?;
        let producer = crate::kafka::producer(brokers, kafka)
            .map_err(|e| format!("cannot make a Kafka producer for {brokers}: {e}"))?;
        Ok(KafkaTarget { producer, topic: topic.to_owned(), mode, runtime })
    }
}

/// A change's record key in `mode` (see [`KafkaTarget`]).
fn record_key(c: &Change, mode: KafkaMode) -> String {
    let v = c.value();
    let key = match (mode, c.is_switch()) {
        (KafkaMode::Ledger, _) => {
            serde_json::json!({ "version": v["version"], "partition": v["partition"], "offset": v["offset"] })
        }
        (KafkaMode::Live, true) => serde_json::json!({ "type": "version" }),
        (KafkaMode::Changes, true) => serde_json::json!({ "type": "version", "to": v["to"] }),
        (KafkaMode::Live, false) => serde_json::json!({ "key": v["key"], "window_start": v["window_start"] }),
        (KafkaMode::Changes, false) => {
            serde_json::json!({ "version": v["version"], "key": v["key"], "window_start": v["window_start"] })
        }
    };
    key.to_string()
}

impl Target for KafkaTarget {
    fn position(&mut self) -> Result<Option<i64>, Failure> {
        Ok(None)
    }

    fn deliver(&mut self, work: &Work, _from: i64, _next: i64) -> Result<(), Failure> {
        let restated_at = match work {
            Work::Switch { entry, .. } => Some(entry.seq),
            Work::Changes { .. } => None,
        };
        let (mut records, mut keys) = (Vec::new(), Vec::new());
        for c in work.lines() {
            let value = match restated_at {
                Some(at) if !c.is_switch() => {
                    let mut v = c.value().clone();
                    v["restated_from"] = v["seq"].clone();
                    v["seq"] = at.into();
                    v.to_string()
                }
                _ => c.line.trim_end().to_owned(),
            };
            records.push((0, value.into_bytes()));
            keys.push(Some(record_key(c, self.mode)));
        }
        if records.is_empty() {
            return Ok(());
        }
        self.runtime
            .block_on(crate::kafka::produce(
                &self.producer,
                &self.topic,
                records.iter().map(|(_, p)| &p[..]),
                &keys,
                None,
            ))
            .map(|_| ())
            .map_err(|e| Failure::Retry(format!("producing to {} failed: {e}", self.topic)))
    }
}

/// An `http` destination: each batch one POST of JSON lines.
struct HttpTarget {
    agent: ureq::Agent,
    url: String,
    headers: BTreeMap<String, String>,
    pipeline: String,
}

impl Target for HttpTarget {
    fn position(&mut self) -> Result<Option<i64>, Failure> {
        Ok(None)
    }

    fn deliver(&mut self, work: &Work, _from: i64, _next: i64) -> Result<(), Failure> {
        let lines = work.lines();
        if lines.is_empty() {
            return Ok(());
        }
        let mut body = String::new();
        for c in lines {
            body.push_str(c.line.trim_end());
            body.push('\n');
        }
        let key = work.key(&self.pipeline);
        let mut request =
            self.agent.post(&self.url).header("content-type", "application/x-ndjson").header("idempotency-key", &key);
        for (name, value) in &self.headers {
            request = request.header(name.as_str(), value.as_str());
        }
        let mut answer = match request.send(&body) {
            Ok(a) => a,
            Err(ureq::Error::Io(e)) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                return Err(Failure::Refused(e.to_string()))
            }
            Err(e) => return Err(Failure::Retry(format!("POST {} failed: {e}", self.url))),
        };
        let status = answer.status().as_u16();
        if (200..300).contains(&status) {
            return Ok(());
        }
        let said: String = answer.body_mut().read_to_string().unwrap_or_default().chars().take(500).collect();
        let what = format!("{} answered {status} to batch {key}: {}", self.url, said.trim());
        match status {
            408 | 429 | 500..=599 => Err(Failure::Retry(what)),
            300..=399 => Err(Failure::Refused(format!("{what} (redirects are not followed)"))),
            _ => Err(Failure::Refused(what)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(seq: i64, version: u32) -> Change {
        Change::parse(format!("{{\"seq\":{seq},\"version\":{version},\"key\":{{}}}}")).unwrap()
    }

    #[test]
    fn keys_name_the_pipeline_version_and_range() {
        let w = Work::Changes { first: 10, last: 20, version: 2, taken: vec![change(10, 2)], settled: false };
        assert_eq!(w.key("paid"), "paid/2/10-20");
        let entry = Change::parse(r#"{"seq":21,"type":"version","from":2,"to":3}"#.into()).unwrap();
        assert_eq!(entry.switch_from, Some(Some(2)));
        let page = |page| Work::Switch {
            entry: entry.clone(),
            page,
            after: None,
            next_after: None,
            rows: vec![],
            last_page: false,
        };
        assert_eq!(page(1).key("paid"), "paid/3/21-21");
        assert_eq!(page(2).key("paid"), "paid/3/21-21/2");
        assert_eq!(page(1).lines().len(), 1, "the entry goes first");
        assert_eq!(page(2).lines().len(), 0);
    }

    #[test]
    fn a_pending_batch_reads_back_as_it_was_described() {
        let w = Work::Changes { first: 5, last: 9, version: 1, taken: vec![], settled: false };
        assert_eq!(Pending::parse(&describe_pending(&w.pending())).unwrap(), Pending::Changes { first: 5, last: 9 });
        let p = Pending::Switch { seq: 7, page: 3, after: Some((60_000, vec![0x73, 0, 1])) };
        assert_eq!(Pending::parse(&describe_pending(&p)).unwrap(), p);
        assert!(Pending::parse("{}").is_err());
    }
}

//! The engine: SPEC.md section 3, one event at a time.
//!
//! Pure: events (bytes with a partition and an offset) in, rows and ledger
//! entries out. No I/O, no clock, no threads. Stream, batch, replay and tests
//! all drive this one type.
//!
//! Invariants:
//! - **The watermark never goes back**: `wm` only grows (`advance`).
//! - **Every open timed window has exactly one timer** `(end, window key)`, and
//!   every session is in `sessions` under its key with its current end.
//! - **An event counts whole or not at all**: steps 1-6 decide everything that
//!   could refuse it before any window changes.
//! - **Revisions per window are 1..n and nothing follows `settled` or
//!   `retracted`**: a window that emits either is removed in the same step.
//!
//! In more detail: SPEC.md section 3: intake steps 1-7, per-partition
//! watermarks, dedup memory, corrections (SPEC.md 3.3: `correct`,
//! `delete_version`, and `withdraw`, which takes a version out of the windows
//! it counts in (`first_counted`: those not expired when it arrived) and
//! ledgers it `superseded`), window assignment (tumbling, hopping, session,
//! global), emission rules 1-3 per event (`weir run`, the conformance cases) or
//! per batch (`Engine::emit_per_batch`, every server engine: the changed and
//! due windows emit at `Engine::end_batch`, which the runner calls before each
//! checkpoint's delta; a window whose time to settle comes settles and is
//! forgotten at that event, so intake sees what it would per event),
//! forgetting; `max_future` against the processing clock the caller tells it
//! (`Engine::set_clock`: the runner's wall clock at each record, the start of
//! `weir run`, a backfill's own time; none told, nothing is `future`). Steps 1
//! and 2 (size, UTF-8, the parse with the canonical hash) need the contract and
//! no state: an `EventReader` (`Engine::reader`) does them into a `ReadEvent`
//! on any thread, and `Engine::process_read` goes on from there exactly as
//! `Engine::process` would.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use hashbrown::HashMap;
use serde::{Deserialize, Serialize};
use weir_contract::{AggFn, Contract, LatePolicy, TimeFormat, WindowKind};

use crate::agg::{AggState, Contrib};
use crate::json::{raw_hash, Doc, Event, ParseError, Tag, Val};
use crate::key;
use crate::number::parse_decimal;
use crate::output::{
    KeyBytes, LedgerEntry, Output, Reason, Row, RowFormat, Sources, Status, Values, PAYLOAD_BYTES_MAX,
};
use crate::plan::Plan;
use crate::recall::{Recall, Recalled};
use crate::rule::RuleError;
use crate::table::{HashedTable, Spare};
use crate::time::{parse_rfc3339_ms, TIME_MAX_MS, TIME_MIN_MS};

/// Watermark before any event: -infinity.
pub const WM_MIN: i64 = i64::MIN;
/// Watermark at the end of a bounded input: +infinity.
pub const WM_MAX: i64 = i64::MAX;

/// How many windows ahead of the one decided at a close their table slots
/// are asked for: a close of thousands of windows otherwise waits on a
/// cache miss or two for each.
const DECIDE_AHEAD: usize = 4;

/// One event as it arrives: raw bytes at a partition and offset.
#[derive(Debug, Clone, Copy)]
pub struct EventIn<'a> {
    pub partition: u32,
    pub offset: u64,
    pub bytes: &'a [u8],
}

/// Steps 1 and 2 of SPEC.md 3.1 for one event: its size, and the parse
/// (with the canonical payload hash under `[dedup]`, and where the plan's
/// top-level names are). They need the contract and nothing of the engine's
/// state, so another thread can do them while the engine counts the events
/// before ([`Engine::process_read`]). Reuse one [`ReadEvent`] per event
/// slot: its arena grows once.
#[derive(Debug)]
pub struct EventReader {
    plan: Arc<Plan>,
    hash_scratch: Vec<u8>,
    /// The payload hash is of the event's bytes, not canonical
    /// ([`Engine::recall_with`]).
    raw: bool,
}

/// What an [`EventReader`] made of one event.
#[derive(Debug)]
pub struct ReadEvent {
    doc: Doc,
    slots: Vec<u32>,
    parsed: Result<u64, ParseError>,
    /// `parsed` holds the hash of the event's bytes, not its canonical hash.
    raw: bool,
    too_large: bool,
    utf8_ok: bool,
    done: bool,
    fields: Fields,
}

/// Step 4's fields of an event that parsed as an object, read with the
/// parse: they depend on the event and the plan alone, so the reader's
/// thread reads them, and the engine, given a batch, can load the table
/// slots of the events ahead of the one it counts ([`Engine::prefetch`]).
/// The engine still decides, in the rules' order, which of them matter.
#[derive(Debug)]
struct Fields {
    /// Whether the fields below were read (the event was an object).
    read: bool,
    time: Result<i64, FieldError>,
    /// The key's length in the event's text, its bytes in `key_buf`.
    key: Result<usize, FieldError>,
    key_buf: Vec<u8>,
    /// The id's dedup identity, when `[dedup]` is on and the id is readable.
    id_key: Option<u128>,
    /// The fixed windows (tumbling, hopping, global) the event falls in,
    /// when its time and key are readable: the first's start and the ids
    /// of the first [`KNOWN_WINDOWS`], hashed here, which the engine looks
    /// them up by and asks for ahead.
    windows: KnownWindows,
    /// The contract's `where` (step 3); true when it has none.
    rule: Result<bool, RuleError>,
    /// When `rule` passed: each aggregate's `where`, then what the event
    /// gives it (step 5), in the plan's order; `agg_fault` is the first
    /// that failed, in the engine's order (every rule before any value).
    agg_pass: Vec<bool>,
    contribs: Vec<Contrib>,
    agg_fault: Option<AggFault>,
}

/// Why an event gives its aggregates nothing: aggregate `n`'s `where`
/// could not be evaluated, or its value is not one it takes.
#[derive(Debug)]
enum AggFault {
    Rule(usize, RuleError),
    Value(usize, String),
}

impl Default for Fields {
    fn default() -> Fields {
        Fields {
            read: false,
            time: Ok(0),
            key: Ok(0),
            key_buf: Vec::new(),
            id_key: None,
            windows: KnownWindows::default(),
            rule: Ok(true),
            agg_pass: Vec::new(),
            contribs: Vec::new(),
            agg_fault: None,
        }
    }
}

impl Fields {
    fn read(&mut self, root: Event<'_>, plan: &Plan) {
        self.read = true;
        self.time = read_time(root.get(&plan.time_path), plan);
        self.key = read_key(root, plan, &mut self.key_buf);
        self.id_key = None;
        if let (Some(id_path), Some(_)) = (&plan.id_path, plan.horizon_ms) {
            let val = root.get(id_path);
            if let Ok(id) = read_id(val, &plan.id_name) {
                self.id_key = Some(dedup_key(val, &id));
            }
        }
        self.windows.ids.clear();
        if let (Ok(time), Ok(_)) = (&self.time, &self.key) {
            if let Some((start, slide, count)) = fixed_starts(plan.kind, *time) {
                self.windows.first = start;
                let known = count.min(KNOWN_WINDOWS as i64);
                let key = &self.key_buf;
                self.windows.ids.extend((0..known).map(|n| win_id(start + n * slide, key)));
            }
        }
        // The rules and the aggregates' values depend on the event alone:
        // read here, while its nodes are in this core's cache, they leave
        // the engine's thread only results to look at.
        self.rule = plan.rule.as_ref().map_or(Ok(true), |rule| rule.test(root));
        self.agg_pass.clear();
        self.contribs.clear();
        self.agg_fault = None;
        if matches!(self.rule, Ok(true)) {
            self.agg_fault = self.read_aggregates(root, plan);
        }
    }

    /// Each aggregate's `where`, then each one's value; the first fault.
    fn read_aggregates(&mut self, root: Event<'_>, plan: &Plan) -> Option<AggFault> {
        for (i, agg) in plan.aggs.iter().enumerate() {
            match agg.rule.as_ref().map_or(Ok(true), |rule| rule.test(root)) {
                Ok(pass) => self.agg_pass.push(pass),
                Err(detail) => return Some(AggFault::Rule(i, detail)),
            }
        }
        for (i, (agg, &pass)) in plan.aggs.iter().zip(&self.agg_pass).enumerate() {
            match contribution(root, agg, pass) {
                Ok(c) => self.contribs.push(c),
                Err(detail) => return Some(AggFault::Value(i, detail)),
            }
        }
        None
    }
}

impl Default for ReadEvent {
    fn default() -> ReadEvent {
        ReadEvent {
            doc: Doc::default(),
            slots: Vec::new(),
            parsed: Ok(0),
            raw: false,
            too_large: false,
            utf8_ok: true,
            done: false,
            fields: Fields::default(),
        }
    }
}

impl EventReader {
    /// Reads one event: `text` is its bytes as text (with replacement
    /// characters where `utf8_ok` is false), `bytes` their length.
    pub fn read(&mut self, text: &str, bytes: usize, utf8_ok: bool, into: &mut ReadEvent) {
        into.done = true;
        into.fields.read = false;
        into.utf8_ok = utf8_ok;
        into.too_large = bytes > self.plan.max_event_bytes;
        if into.too_large {
            return;
        }
        let hashing = self.plan.horizon_ms.is_some();
        into.raw = self.raw;
        into.parsed = if utf8_ok {
            let scratch = (hashing && !self.raw).then_some(&mut self.hash_scratch);
            into.doc.parse_event(text, scratch, &self.plan.names, &mut into.slots, self.plan.bounds)
        } else {
            Err(ParseError::Malformed("not UTF-8 text".to_owned()))
        };
        if let (Ok(hash), true, true) = (&mut into.parsed, hashing, self.raw) {
            *hash = raw_hash(text);
        }
        if into.parsed.is_ok() {
            let root = into.doc.root(text);
            if root.tag() == Tag::Object {
                into.fields.read(Event::from_slots(root, &into.slots), &self.plan);
            }
        }
    }
}

/// How the engine treats time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    /// Watermarks, lateness and emission as events arrive.
    Stream,
    /// No watermark until the end: every valid, first-seen, included event
    /// counts whatever its arrival order; one settled row per window at `finish`.
    Batch,
}

/// What the engine has seen and done; kept in snapshots.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    pub read: u64,
    pub counted: u64,
    pub filtered: u64,
    /// Events late but allowed: counted in a window whose end the watermark had passed.
    pub late_allowed: u64,
    /// Ledger entries by [`Reason::index`].
    pub ledger: [u64; Reason::ALL.len()],
    pub rows_provisional: u64,
    pub rows_settled: u64,
    pub rows_retracted: u64,
    /// How far behind the watermark each event that reached step 7 arrived.
    pub lateness: crate::lateness::Lateness,
}

impl Counters {
    pub fn ledger_total(&self) -> u64 {
        self.ledger.iter().sum()
    }

    pub fn rows_total(&self) -> u64 {
        self.rows_provisional + self.rows_settled + self.rows_retracted
    }

    /// Adds another engine's counters (the engines of several partitions).
    pub fn add(&mut self, other: &Counters) {
        self.read += other.read;
        self.counted += other.counted;
        self.filtered += other.filtered;
        self.late_allowed += other.late_allowed;
        for (a, b) in self.ledger.iter_mut().zip(other.ledger) {
            *a += b;
        }
        self.rows_provisional += other.rows_provisional;
        self.rows_settled += other.rows_settled;
        self.rows_retracted += other.rows_retracted;
        self.lateness.add(&other.lateness);
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Window {
    /// The group key's bytes (see `key`).
    pub key: KeyBytes,
    pub start: i64,
    pub end: i64,
    pub events: u64,
    pub late_events: u64,
    /// The revision of the last row emitted; 0 before the first.
    pub revision: u32,
    /// Changed since its last row.
    pub dirty: bool,
    /// A row was emitted while the watermark was at or past `end`.
    pub past_end_emitted: bool,
    /// Inline for up to two aggregates: adding an event then touches the
    /// window's table entry and nothing else.
    pub aggs: Aggs,
    /// Where the counted events came from, for provenance.
    pub sources: Sources,
}

pub(crate) type Aggs = smallvec::SmallVec<[AggState; 2]>;

/// An event id remembered for dedup.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Seen {
    pub partition: u32,
    pub offset: u64,
    pub payload_hash: u64,
    /// Forgotten once the watermark reaches this (event time + horizon).
    pub expires: i64,
}

/// What the counting version of a remembered id gave, so that a correction
/// can take it back (`on_conflict = "correct"` only).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Counted {
    pub time: i64,
    /// The first window it counted in: with `time` and `wm_at`, which
    /// windows those are (the window holds the group key's bytes, so they
    /// are not kept twice). Unused when it counted nowhere.
    pub window: WinId,
    /// The watermark when it counted: it is late in every window that had
    /// ended by then, and counts in none that had expired (SPEC.md 3.3: a
    /// correction touches only the windows it counts in).
    pub wm_at: i64,
    /// Per aggregate, what it gave ([`Contrib::kept`]).
    pub given: Box<[Option<rust_decimal::Decimal>]>,
    /// The latest expiry of any version of this id since it was first
    /// remembered: a store keeps the id's record at least this long, so an
    /// older record of it never comes back.
    pub keep_until: i64,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct State {
    pub part_wm: Vec<i64>,
    pub part_idle: Vec<bool>,
    pub wm: i64,
    pub windows: HashedTable<Window>,
    pub timers: crate::timers::Timers,
    pub sessions: HashMap<KeyBytes, BTreeMap<i64, i64>>,
    /// With [`Plan::count_keys`]: open windows by a 128-bit hash of their
    /// key (see `key_id`). Not in snapshots: rebuilt from the windows.
    pub keys: HashedTable<u32>,
    /// Remembered event ids, by a 128-bit hash of the id (see `dedup_key`).
    /// An entry whose `expires` the watermark has reached counts as
    /// forgotten; [`Engine::forget_ids`] removes such entries in sweeps.
    pub seen: HashedTable<Seen>,
    /// With [`Plan::corrects`]: what each remembered id's counting version
    /// gave, by the same key as `seen`.
    pub counted: HashedTable<Counted>,
    /// Ids a deletion forgot since the last delta, with their `keep_until`
    /// (while tracking changes): a store must forget them too.
    pub forgotten: Vec<(u128, i64)>,
    pub counters: Counters,
    /// A window's first row has revision `revision_floor + 1`: above every
    /// revision published before a replay (0 otherwise).
    pub revision_floor: u32,
}

/// A window's identity: a 128-bit hash of its start and group key. Two
/// windows share one with probability about 2^-128 per pair, as event ids do.
pub(crate) type WinId = u128;

/// What intake learned about one event, for its ledger entries.
struct Ctx<'a> {
    partition: u32,
    offset: u64,
    payload: &'a str,
    time: Option<i64>,
    /// The event's id, once read: as text, or (`id_at`) the value the
    /// reader already found to be a string or an integer, read as text only
    /// when a ledger entry or a `first`/`last` aggregate wants it.
    id: Option<Cow<'a, str>>,
    id_at: Option<Val<'a>>,
}

impl<'a> Ctx<'a> {
    fn id(&self) -> Option<Cow<'a, str>> {
        self.id.clone().or_else(|| read_id(self.id_at, "").ok())
    }
}

pub struct Engine {
    pub(crate) plan: Arc<Plan>,
    pub(crate) mode: Mode,
    pub(crate) st: State,
    /// Taken out while an event is processed, with the plan it holds.
    reader: Option<EventReader>,
    /// Taken out while an event is processed (a pointer moved, not the arena).
    read: Option<Box<ReadEvent>>,
    /// Where earlier events are read back, when payloads are remembered by
    /// their bytes ([`Engine::recall_with`]).
    pub(crate) recall: Option<Box<Recalled>>,
    contribs: Vec<Contrib>,
    dirty: Vec<WinId>,
    /// Rows of this step with their window's end, sorted before they go out.
    pending: Vec<(i64, Row)>,
    /// Arrays a close works in, kept from one close to the next: the
    /// windows to decide and the order of their rows.
    candidates: Vec<(i64, WinId)>,
    order: crate::order::Order,
    /// The engine reads one partition, whatever its number: the watermark
    /// is that partition's (see [`Engine::read_one_partition`]).
    one_partition: bool,
    /// The processing clock (ms since the epoch) as the caller last told
    /// it ([`Engine::set_clock`]); `max_future` is measured from it.
    clock_ms: Option<i64>,
    /// The event time of the last event processed, when it had a readable one
    /// within `max_future` ([`Engine::last_event_time`]). Not kept in snapshots.
    last_time: Option<i64>,
    /// Rows go out per batch ([`Engine::emit_per_batch`]), not per event.
    per_batch: bool,
    /// Per batch: the watermark before the batch's first event, while the
    /// batch has rows to emit ([`Engine::end_batch`]).
    batch_from: Option<i64>,
    /// The start of the last window [`Engine::fixed_span`] found, and where
    /// that start's slide ends.
    span_at: std::cell::Cell<(i64, i64)>,
    /// A batch reads only events whose time is in this range
    /// ([`Engine::read_times`]).
    times: Option<std::ops::Range<i64>>,
    /// Set by [`Engine::make_spares_ahead`]: [`Engine::take_spares_wanted`]
    /// asks the tables what they want.
    spares_ahead: bool,
}

/// Memory one of an engine's tables will want when it doubles, to make on
/// another thread ([`SpareWanted::make`]) and give back with
/// [`Engine::give_spare`] (see [`Engine::make_spares_ahead`]).
#[derive(Debug)]
pub struct SpareWanted(Table, usize);

/// A spare made by [`SpareWanted::make`].
#[derive(Debug)]
pub struct SpareMade(Made);

#[derive(Debug, Clone, Copy)]
enum Table {
    Windows,
    Keys,
    Seen,
    Counted,
}

#[derive(Debug)]
enum Made {
    Windows(Spare<Window>),
    Keys(Spare<u32>),
    Seen(Spare<Seen>),
    Counted(Spare<Counted>),
}

impl SpareWanted {
    /// Allocates and first writes the memory: the kernel zeroes its pages
    /// here, on the caller's thread, not on the engine's when it doubles.
    pub fn make(self) -> SpareMade {
        let SpareWanted(table, slots) = self;
        SpareMade(match table {
            Table::Windows => Made::Windows(Spare::make(slots)),
            Table::Keys => Made::Keys(Spare::make(slots)),
            Table::Seen => Made::Seen(Spare::make(slots)),
            Table::Counted => Made::Counted(Spare::make(slots)),
        })
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("pipeline", &self.plan.name)
            .field("version", &self.plan.version)
            .field("mode", &self.mode)
            .field("watermark", &self.watermark())
            .field("open_windows", &self.st.windows.len())
            .field("remembered_ids", &self.remembered_ids())
            .finish()
    }
}

/// A contract the engine cannot run (beyond what the contract crate checks).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PlanError(pub String);

impl Engine {
    /// An engine for `contract`, reading `partitions` partitions (at least one).
    pub fn new(contract: &Contract, mode: Mode, partitions: u32) -> Result<Engine, PlanError> {
        let plan = Plan::compile(contract).map_err(PlanError)?;
        let n = partitions.max(1) as usize;
        let st = State { part_wm: vec![WM_MIN; n], part_idle: vec![false; n], wm: WM_MIN, ..State::default() };
        Ok(Engine::from_parts(Arc::new(plan), mode, st))
    }

    pub(crate) fn from_parts(plan: Arc<Plan>, mode: Mode, st: State) -> Engine {
        Engine {
            reader: Some(EventReader { plan: Arc::clone(&plan), hash_scratch: Vec::new(), raw: false }),
            read: None,
            recall: None,
            plan,
            mode,
            st,
            contribs: Vec::new(),
            dirty: Vec::new(),
            pending: Vec::new(),
            candidates: Vec::new(),
            order: crate::order::Order::default(),
            one_partition: false,
            clock_ms: None,
            last_time: None,
            per_batch: false,
            batch_from: None,
            span_at: std::cell::Cell::new((0, 0)),
            times: None,
            spares_ahead: false,
        }
    }

    /// From now on the engine's tables ask for their next memory ahead of
    /// doubling: between steps, [`Engine::take_spares_wanted`] gives what
    /// they want, which the caller makes on another thread and
    /// gives back ([`Engine::give_spare`]). A table of a million slots then
    /// doubles without its thread waiting for the kernel to zero tens of
    /// megabytes, a stall that a server's latency shows. A spare that comes
    /// too late is dropped; what the engine holds never depends on them.
    /// Not kept in snapshots; set it again after a restore.
    pub fn make_spares_ahead(&mut self) {
        self.spares_ahead = true;
    }

    /// The spares the tables want made (see [`Engine::make_spares_ahead`]),
    /// asked once a step: a spare comes back at the caller's next step at
    /// the earliest, so asking after every event would not bring it sooner.
    /// Tables nearing their doubling ask; entries a sweep would keep are
    /// those of windows and keys, ids the watermark has not expired, and
    /// corrections within the horizon.
    pub fn take_spares_wanted(&mut self) -> Vec<SpareWanted> {
        if !self.spares_ahead {
            return Vec::new();
        }
        let wm = self.st.wm;
        let st = &mut self.st;
        let horizon = self.plan.horizon_ms.filter(|_| self.plan.corrects);
        let asked = [
            (Table::Windows, st.windows.wants_spare(|_| true)),
            (Table::Keys, st.keys.wants_spare(|_| true)),
            (Table::Seen, st.seen.wants_spare(|s| s.expires > wm)),
            (Table::Counted, st.counted.wants_spare(|c| horizon.is_none_or(|h| c.time.saturating_add(h) > wm))),
        ];
        asked.into_iter().filter_map(|(table, slots)| Some(SpareWanted(table, slots?))).collect()
    }

    /// Gives a table the spare it asked for.
    pub fn give_spare(&mut self, made: SpareMade) {
        match made.0 {
            Made::Windows(s) => self.st.windows.give_spare(s),
            Made::Keys(s) => self.st.keys.give_spare(s),
            Made::Seen(s) => self.st.seen.give_spare(s),
            Made::Counted(s) => self.st.counted.give_spare(s),
        }
    }

    /// How many times a table doubled into a spare given to it.
    pub fn spares_used(&self) -> u32 {
        let st = &self.st;
        st.windows.spares_used() + st.keys.spares_used() + st.seen.spares_used() + st.counted.spares_used()
    }

    /// Tells the engine the processing clock, in milliseconds since the
    /// epoch: an event time more than `max_future` ahead of it is ledgered
    /// `future` (SPEC.md 3.1 step 4). The engine reads no clock; until it is
    /// told one, no event is `future`. Not kept in snapshots.
    pub fn set_clock(&mut self, now_ms: i64) {
        self.clock_ms = Some(now_ms);
    }

    /// A batch from now on passes over every event whose time is readable
    /// and outside `times`: it is neither counted, remembered nor ledgered.
    /// A backfill gives the range its windows need, with the dedup horizon
    /// on both sides, so that it holds the range and not the whole input.
    /// An event with no readable time goes on as usual. Not kept in
    /// snapshots; a stream engine ignores it.
    pub fn read_times(&mut self, times: std::ops::Range<i64>) {
        self.times = (self.mode == Mode::Batch).then_some(times);
    }

    /// The event time of the last event [`Engine::process`] read, if it had
    /// a readable one that was not `future` (whether or not it counted): the
    /// runner's producer lag is its append time less this.
    pub fn last_event_time(&self) -> Option<i64> {
        self.last_time
    }

    /// From now on the engine reads a single partition, whichever number
    /// its events carry (they keep it in the ledger and in rows' sources):
    /// a worker's engine for one Kafka partition. Not kept in snapshots;
    /// set it again after a restore.
    pub fn read_one_partition(&mut self) {
        self.one_partition = true;
        self.st.part_wm.truncate(1);
        self.st.part_idle.truncate(1);
    }

    /// From now on a stream engine emits rows per batch, as SPEC.md 3.4
    /// allows a server: each window changed or due since the last
    /// [`Engine::end_batch`] emits at most one row there, from its state at
    /// that point, instead of a row at every event. Intake is unchanged
    /// (an event is late or too late by the watermark as it reads it), so
    /// the rows a batch ends with, and every `settled` row, are those of an
    /// engine emitting per event; only revisions nobody could have read
    /// apart are left out. Call `end_batch` before [`Engine::take_delta`].
    /// Not kept in snapshots; set it again after a restore.
    pub fn emit_per_batch(&mut self) {
        self.per_batch = true;
    }

    /// Emits the rows of the batch since the last call (see
    /// [`Engine::emit_per_batch`]); nothing when emitting per event.
    pub fn end_batch(&mut self, out: &mut Output) {
        if let Some(wm_before) = self.batch_from.take() {
            self.emit(wm_before, false, out);
        }
    }

    /// Step 9 after an event or an idleness change: now, or per batch. Per
    /// batch, a window whose time to settle came still settles (and is
    /// forgotten) at once, as per event, so that what an event finds open
    /// (`max_open_windows`, the key of a counted version) is the same; the
    /// other rows wait for the batch's end.
    fn emit_step(&mut self, wm_before: i64, out: &mut Output) {
        if !self.per_batch {
            return self.emit(wm_before, false, out);
        }
        self.batch_from.get_or_insert(wm_before);
        if self.st.wm > wm_before {
            let settle_to = self.st.wm.saturating_sub(self.plan.lateness_ms);
            let mut due = Vec::new();
            self.st.timers.take_due(settle_to, &mut due);
            for (end, id) in due {
                if let Some(row) = self.decide(id) {
                    self.pending.push((end, row));
                }
            }
            self.send_pending(out);
        }
    }

    /// The watermark slot of `partition`.
    fn slot(&self, partition: u32) -> u32 {
        if self.one_partition {
            0
        } else {
            partition
        }
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The pipeline watermark; `None` while it is -infinity.
    pub fn watermark(&self) -> Option<i64> {
        (self.st.wm != WM_MIN).then_some(self.st.wm)
    }

    /// Each partition's watermark; `None` while it is -infinity.
    pub fn partition_watermarks(&self) -> Vec<Option<i64>> {
        self.st.part_wm.iter().map(|&w| (w != WM_MIN).then_some(w)).collect()
    }

    pub fn counters(&self) -> &Counters {
        &self.st.counters
    }

    pub fn open_windows(&self) -> usize {
        self.st.windows.len()
    }

    /// About how many bytes the state holds: the window and id tables'
    /// slots, the timers, and the windows' own allocations (keys, first/last
    /// picks and distinct sets not counted).
    pub fn state_bytes(&self) -> usize {
        let windows = self.st.windows.slots() * (16 + std::mem::size_of::<Window>());
        let windows_keys: usize = self.st.windows.iter().map(|(_, w)| w.key.len()).sum();
        windows + windows_keys + self.id_bytes() + self.st.timers.len() * 32
    }

    /// About how many bytes the dedup memory holds: the id table's slots
    /// and, with corrections, what each id's counting version gave (its
    /// table's slots and the contributions).
    pub fn id_bytes(&self) -> usize {
        let ids = self.st.seen.slots() * (16 + std::mem::size_of::<Seen>());
        let counted = self.st.counted.slots() * (16 + std::mem::size_of::<Counted>());
        // What each counting version gave: one value per aggregate (counted
        // from the table's length, so a status does not walk every id).
        let counted_heap =
            self.st.counted.len() * self.plan.aggs.len() * std::mem::size_of::<Option<rust_decimal::Decimal>>();
        ids + counted + counted_heap
    }

    /// Makes every window's first row revision `floor + 1` from now on: a
    /// replay republishes rows above the revisions published before it.
    pub fn set_revision_floor(&mut self, floor: u32) {
        self.st.revision_floor = floor;
    }

    /// Event ids remembered for duplicate detection (expired ones not counted).
    pub fn remembered_ids(&self) -> usize {
        let wm = self.st.wm;
        self.st.seen.iter().filter(|(_, s)| s.expires > wm).count()
    }

    /// How to write this engine's rows and ledger entries as JSON.
    pub fn format(&self) -> &RowFormat {
        &self.plan.format
    }

    /// Processes one event: steps 1-9 of SPEC.md section 3.1.
    pub fn process(&mut self, event: EventIn<'_>, out: &mut Output) {
        let lossy;
        let (text, utf8_ok) = match std::str::from_utf8(event.bytes) {
            Ok(text) => (text, true),
            Err(_) => {
                lossy = String::from_utf8_lossy(event.bytes).into_owned();
                (lossy.as_str(), false)
            }
        };
        let mut read = self.read.take().unwrap_or_default();
        let mut reader = self.reader.take().unwrap_or_else(|| self.reader());
        reader.read(text, event.bytes.len(), utf8_ok, &mut read);
        // One event alone: its slots come into the cache while its rules run.
        self.prefetch(&read);
        // The reader's plan is the engine's: no count of references changes.
        self.count_read(&reader.plan, event.partition, event.offset, text, &read, out);
        self.reader = Some(reader);
        self.read = Some(read);
    }

    /// An event its source refused before the engine read it (a Kafka
    /// record with its own `$kafka` member): read, ledgered with `reason`
    /// and `detail`, counted nowhere, the watermark unmoved.
    pub fn refuse(&mut self, event: EventIn<'_>, reason: Reason, detail: String, out: &mut Output) {
        self.st.counters.read += 1;
        let text = String::from_utf8_lossy(event.bytes);
        let ctx =
            Ctx { partition: event.partition, offset: event.offset, payload: &text, time: None, id: None, id_at: None };
        record(&mut self.st.counters, out, &ctx, None, reason, detail, None, None);
    }

    /// Processes events in order; the same as calling [`Engine::process`] for each.
    pub fn process_batch<'a>(&mut self, events: impl IntoIterator<Item = EventIn<'a>>, out: &mut Output) {
        for event in events {
            self.process(event, out);
        }
    }

    /// The end of a bounded input: the watermark becomes +infinity and every
    /// remaining window emits `settled`, global ones included.
    pub fn finish(&mut self, out: &mut Output) {
        let wm_before = self.batch_from.take().unwrap_or(self.st.wm);
        self.st.wm = WM_MAX;
        self.emit(wm_before, true, out);
    }

    /// Marks a partition idle (it stops holding the watermark back) or active.
    pub fn set_partition_idle(&mut self, partition: u32, idle: bool, out: &mut Output) {
        if self.mode == Mode::Batch {
            return;
        }
        let partition = self.slot(partition);
        self.ensure_partition(partition);
        self.st.part_idle[partition as usize] = idle;
        let wm_before = self.st.wm;
        self.recompute_watermark();
        self.emit_step(wm_before, out);
    }

    fn ensure_partition(&mut self, partition: u32) {
        let p = partition as usize;
        if p >= self.st.part_wm.len() {
            self.st.part_wm.resize(p + 1, WM_MIN);
            self.st.part_idle.resize(p + 1, false);
        }
    }

    /// Step 8: `W = max(W, t - max_delay)` for the partition, then the minimum.
    fn advance(&mut self, partition: u32, time: i64) {
        let partition = self.slot(partition);
        self.ensure_partition(partition);
        let p = partition as usize;
        let candidate = time - self.plan.max_delay_ms;
        if candidate > self.st.part_wm[p] {
            self.st.part_wm[p] = candidate;
        }
        self.st.part_idle[p] = false;
        self.recompute_watermark();
    }

    /// The minimum over active partitions; when every partition is idle,
    /// none holds the watermark back and the most advanced one sets it.
    fn recompute_watermark(&mut self) {
        let active = self.st.part_wm.iter().zip(&self.st.part_idle).filter(|(_, idle)| !**idle);
        let candidate = active.map(|(wm, _)| *wm).min().or_else(|| self.st.part_wm.iter().copied().max());
        if let Some(wm) = candidate {
            if wm > self.st.wm {
                self.st.wm = wm;
            }
        }
    }

    /// Processes one event whose steps 1 and 2 an [`EventReader`] of this
    /// engine already did (on another thread, say), `text` being what it
    /// read: the same as [`Engine::process`] of the event's bytes.
    pub fn process_read(&mut self, partition: u32, offset: u64, text: &str, read: &ReadEvent, out: &mut Output) {
        // The plan is read through the engine's own reader, taken out for the
        // event: cloning the `Arc` instead is an atomic operation, which
        // waits for every store before it, and took a fifth of this
        // function's time when done for each event.
        let reader = self.reader.take().unwrap_or_else(|| self.reader());
        self.count_read(&reader.plan, partition, offset, text, read, out);
        self.reader = Some(reader);
    }

    /// Counts an event read by an [`EventReader`], `plan` being this engine's.
    fn count_read(&mut self, plan: &Plan, partition: u32, offset: u64, text: &str, read: &ReadEvent, out: &mut Output) {
        debug_assert!(read.done, "an EventReader reads the event first");
        self.st.counters.read += 1;
        let wm_before = self.st.wm;
        self.last_time = self.intake_read(plan, partition, offset, text, read, wm_before, out);
        if let Some(time) = self.last_time {
            if self.mode == Mode::Stream {
                self.advance(partition, time);
            }
        }
        if self.mode == Mode::Stream {
            self.emit_step(wm_before, out);
        }
    }

    /// Starts loading the table slots that counting `read`'s event will
    /// touch: its id's and its first window's. A caller holding a batch of
    /// read events calls it a few events ahead of [`Engine::process_read`],
    /// so that the slots arrive while the events before are counted (the id
    /// table outgrows the caches). It changes nothing the engine does.
    pub fn prefetch(&self, read: &ReadEvent) {
        let fields = &read.fields;
        if !fields.read {
            return;
        }
        if let Some(id_key) = fields.id_key {
            self.st.seen.prefetch(id_key);
            if self.plan.corrects {
                self.st.counted.prefetch(id_key);
            }
        }
        for &window in &fields.windows.ids {
            self.st.windows.prefetch(window);
        }
    }

    /// Remembers each event's payload by a hash of its bytes, and reads an
    /// earlier version back through `recall` when an id comes again with
    /// other bytes (the `recall` module): the same verdicts for about a
    /// tenth less work an event. For an engine that keeps no snapshot (a run
    /// over a file): the payload hashes in snapshots and deltas are
    /// canonical. Refused once the engine has read an event, and for an
    /// engine that tracks its changes.
    pub fn recall_with(&mut self, recall: Box<dyn Recall>) -> Result<(), PlanError> {
        if self.st.counters.read > 0 || self.st.seen.is_tracking() {
            return Err(PlanError(
                "payloads can be remembered by their bytes only from an engine's start, without snapshots".into(),
            ));
        }
        self.recall = Some(Box::new(Recalled::new(recall)));
        if let Some(reader) = &mut self.reader {
            reader.raw = true;
        }
        Ok(())
    }

    /// The first event an engine that reads events back
    /// ([`Engine::recall_with`]) could not read back, and why: from then
    /// on, its verdicts on that id may be wrong, so its caller stops.
    pub fn recall_failure(&self) -> Option<&str> {
        self.recall.as_ref().and_then(|r| r.failure())
    }

    /// An event's payload hash of the kind this engine remembers, from the
    /// one its reader gave (of the other kind when the reader was made
    /// before [`Engine::recall_with`]).
    fn payload_hash(&self, read: &ReadEvent, hash: u64, text: &str) -> u64 {
        if read.raw == self.recall.is_some() || self.plan.horizon_ms.is_none() {
            return hash;
        }
        if self.recall.is_some() {
            return raw_hash(text);
        }
        Doc::default().canonical_hash_of(text, &mut Vec::new(), self.plan.bounds).unwrap_or(hash)
    }

    /// A reader for this engine's contract, to do steps 1 and 2 of events
    /// apart from it ([`Engine::process_read`]).
    pub fn reader(&self) -> EventReader {
        EventReader { plan: Arc::clone(&self.plan), hash_scratch: Vec::new(), raw: self.recall.is_some() }
    }

    /// Steps 1-7 of an event read by an [`EventReader`].
    #[allow(clippy::too_many_arguments)]
    fn intake_read(
        &mut self,
        plan: &Plan,
        partition: u32,
        offset: u64,
        text: &str,
        read: &ReadEvent,
        wm: i64,
        out: &mut Output,
    ) -> Option<i64> {
        let ctx = Ctx { partition, offset, payload: text, time: None, id: None, id_at: None };
        // 1. Size.
        if read.too_large {
            let detail = format!(
                "event is larger than max_event_bytes = {}; split it or raise the limit in [source]",
                self.plan.max_event_bytes
            );
            record(&mut self.st.counters, out, &ctx, None, Reason::TooLarge, detail, None, None);
            return None;
        }
        // 2. Parse (done by the reader).
        match &read.parsed {
            Err(ParseError::Malformed(why)) => {
                let detail = if read.utf8_ok { format!("not JSON: {why}") } else { why.clone() };
                record(&mut self.st.counters, out, &ctx, None, Reason::MalformedJson, detail, None, None);
                None
            }
            Err(ParseError::OverLimit(why)) => {
                let detail = format!("event is {why}; simplify the event or raise the limit in [limits]");
                record(&mut self.st.counters, out, &ctx, None, Reason::OverLimit, detail, None, None);
                None
            }
            Ok(payload_hash) => {
                let root = read.doc.root(text);
                if root.tag() != Tag::Object {
                    record(
                        &mut self.st.counters,
                        out,
                        &ctx,
                        None,
                        Reason::MalformedJson,
                        "not a JSON object: an event is one {...} per line".into(),
                        None,
                        None,
                    );
                    None
                } else {
                    let mut ctx = Ctx { id: None, id_at: None, ..ctx };
                    let event = Event::from_slots(root, &read.slots);
                    let hash = self.payload_hash(read, *payload_hash, text);
                    self.intake_object(plan, event, &read.fields, hash, &mut ctx, wm, out)
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn intake_object<'a>(
        &mut self,
        plan: &Plan,
        root: Event<'a>,
        fields: &Fields,
        hash: u64,
        ctx: &mut Ctx<'a>,
        wm: i64,
        out: &mut Output,
    ) -> Option<i64> {
        // Read first, refused only at step 4: any readable time moves the
        // watermark (step 8), whatever else happens to the event.
        debug_assert!(fields.read, "the reader reads an object's fields");
        let key_bytes = &fields.key_buf[..];
        let time = fields.time.clone();
        if let (Ok(t), Some(times)) = (&time, &self.times) {
            if !times.contains(t) {
                return None;
            }
        }
        // A time too far ahead of the processing clock moves no watermark (step 8).
        let ahead = match (&time, plan.max_future_ms, self.clock_ms) {
            (Ok(t), Some(max), Some(now)) if *t > now.saturating_add(max) => Some((*t, now, max)),
            _ => None,
        };
        let readable = time.as_ref().ok().copied().filter(|_| ahead.is_none());
        // 3. The contract's rule, before any field is required (the reader tested it).
        if plan.rule.is_some() {
            match &fields.rule {
                Ok(true) => {}
                Ok(false) => {
                    self.st.counters.filtered += 1;
                    if plan.corrects {
                        ctx.time = readable;
                        self.delete_version(root, ctx, wm, out);
                    }
                    return readable;
                }
                Err(detail) => {
                    ctx.time = readable;
                    let detail = format!("source.where: {detail}");
                    record(&mut self.st.counters, out, ctx, None, Reason::RuleError, detail, None, None);
                    return readable;
                }
            }
        }
        // 4. Fields: event time, key fields, event id.
        let time = match time {
            Ok(t) => t,
            Err((reason, detail)) => {
                record(&mut self.st.counters, out, ctx, None, reason, detail, None, None);
                return None;
            }
        };
        ctx.time = Some(time);
        if let Some((t, now, max)) = ahead {
            let detail = format!(
                "event time {} is {} ahead of the processing clock ({}), more than max_future = {}; \
                 fix the producer's clock, or raise [source] max_future if such times are real",
                crate::time::format_rfc3339_ms(t),
                weir_contract::format_duration_ms(t.saturating_sub(now)),
                crate::time::format_rfc3339_ms(now),
                weir_contract::format_duration_ms(max)
            );
            // The key and id, where they can be read, say whose clock it was.
            if let Some(id_path) = &plan.id_path {
                ctx.id = read_id(root.get(id_path), &plan.id_name).ok();
            }
            let key = fields.key.as_ref().is_ok_and(|n| *n <= plan.max_key_bytes);
            record(&mut self.st.counters, out, ctx, key.then_some(key_bytes), Reason::Future, detail, None, None);
            return None;
        }
        match &fields.key {
            Err((reason, detail)) => {
                record(&mut self.st.counters, out, ctx, None, *reason, detail.clone(), None, None);
                return Some(time);
            }
            Ok(bytes) if *bytes > plan.max_key_bytes => {
                let detail = format!(
                    "key is {bytes} bytes, over max_key_bytes = {}; key on shorter fields or raise the limit in [limits]",
                    plan.max_key_bytes
                );
                record(&mut self.st.counters, out, ctx, None, Reason::OverLimit, detail, None, None);
                return Some(time);
            }
            Ok(_) => {}
        }
        let mut id_key = None;
        if let Some(id_path) = &plan.id_path {
            let val = root.get(id_path);
            match (fields.id_key, plan.horizon_ms) {
                // The reader read the id (a string or an integer) and its
                // identity, whose slot was asked for already (`Engine::prefetch`).
                (Some(known), Some(_)) => {
                    id_key = Some(known);
                    ctx.id_at = val;
                }
                _ => match read_id(val, &plan.id_name) {
                    Ok(id) => {
                        if plan.horizon_ms.is_some() {
                            id_key = Some(dedup_key(val, &id));
                        }
                        ctx.id = Some(id);
                    }
                    Err((reason, detail)) if plan.horizon_ms.is_some() => {
                        record(&mut self.st.counters, out, ctx, Some(key_bytes), reason, detail, None, None);
                        return Some(time);
                    }
                    Err(_) => {}
                },
            }
        }
        // 5. Aggregates: each one's rule, then its field (the reader read both).
        match &fields.agg_fault {
            None => self.contribs.clone_from(&fields.contribs),
            Some(AggFault::Rule(i, detail)) => {
                let detail = format!("aggregate {}: where: {detail}", plan.format.value_names[*i]);
                record(&mut self.st.counters, out, ctx, Some(key_bytes), Reason::RuleError, detail, None, None);
                return Some(time);
            }
            Some(AggFault::Value(i, detail)) => {
                let detail = format!("aggregate {}: {detail}", plan.format.value_names[*i]);
                record(&mut self.st.counters, out, ctx, Some(key_bytes), Reason::BadType, detail, None, None);
                return Some(time);
            }
        }
        // 6. Duplicates and corrections.
        let mut remembered = None;
        if let (Some(horizon), Some(id_key)) = (plan.horizon_ms, id_key) {
            let expires = time.saturating_add(horizon);
            let fresh = Seen { partition: ctx.partition, offset: ctx.offset, payload_hash: hash, expires };
            if self.st.seen.is_full() {
                self.forget_ids();
            }
            let earlier = if plan.corrects {
                self.st.seen.get(id_key).filter(|s| s.expires > wm).copied()
            } else {
                remember(&mut self.st.seen, id_key, fresh, wm)
            };
            let same = match (&earlier, self.recall.as_mut()) {
                (Some(seen), Some(recall)) => recall.same(seen, hash, ctx.payload, plan.bounds),
                (Some(seen), None) => seen.payload_hash == hash,
                (None, _) => false,
            };
            match earlier {
                Some(seen) if same || !plan.corrects => {
                    let (reason, how) = if same {
                        (Reason::Duplicate, "the same event")
                    } else {
                        (Reason::DuplicateConflict, "an event with this id but a different payload")
                    };
                    let detail = format!(
                        "{how} arrived first at partition {} offset {}; this one did not count",
                        seen.partition, seen.offset
                    );
                    record(&mut self.st.counters, out, ctx, Some(key_bytes), reason, detail, None, Some(seen.offset));
                    return Some(time);
                }
                Some(seen) => {
                    self.correct(id_key, seen, fresh, ctx, key_bytes, wm, out);
                    return Some(time);
                }
                None => remembered = Some((id_key, fresh)),
            }
        }
        // 7. Windows. How far behind the watermark the event arrived (the lateness advisor's input).
        if self.mode == Mode::Stream {
            let behind = if wm == WM_MIN { 0 } else { wm.saturating_sub(time) };
            self.st.counters.lateness.record(behind, self.clock_ms);
        }
        if let Some(detail) = self.over_state_limit(time, key_bytes, wm) {
            record(&mut self.st.counters, out, ctx, Some(key_bytes), Reason::OverLimit, detail, None, None);
            if let (Some((id_key, _)), false) = (remembered, plan.corrects) {
                // Refused whole: not remembered, so a resend counts once there is room.
                self.st.seen.remove(id_key);
            }
            return Some(time);
        }
        let counted = match plan.kind {
            WindowKind::Session { gap_ms } => self.assign_session(ctx, time, key_bytes, gap_ms, wm, out),
            _ => self.assign_fixed(ctx, time, key_bytes, &fields.windows, wm, out),
        };
        if let (Some((id_key, fresh)), true) = (remembered, plan.corrects) {
            self.remember_counted(id_key, fresh, time, key_bytes, wm, fresh.expires);
        }
        if counted {
            self.st.counters.counted += 1;
        }
        Some(time)
    }

    /// Remembers a counting version and what it gave (`on_conflict = "correct"`).
    fn remember_counted(&mut self, id_key: u128, fresh: Seen, time: i64, key: &[u8], wm: i64, keep_until: i64) {
        self.st.seen.insert(id_key, fresh);
        let given = self.contribs.iter().map(Contrib::kept).collect();
        let first = self.first_counted(time, wm).unwrap_or(self.fixed_span(time).first);
        let window = win_id(first, key);
        self.st.counted.insert(id_key, Counted { time, window, wm_at: wm, given, keep_until });
    }

    /// The group key of a counted version, from the first window it counts
    /// in (there while that window is open); `None` if it counts nowhere.
    fn counted_key(&self, c: &Counted) -> Option<KeyBytes> {
        self.first_counted(c.time, c.wm_at)?;
        self.st.windows.get(c.window).map(|w| w.key.clone())
    }

    /// The start of the first window a version at `time` counts in, given
    /// the watermark when it arrived: the windows it was too late for
    /// (`end + L <= wm_at`) start first, so it counts in the rest, or in
    /// none (`None`). A global window always counts.
    fn first_counted(&self, time: i64, wm_at: i64) -> Option<i64> {
        let FixedSpan { size, slide, first, last } = self.fixed_span(time);
        if size == 0 {
            return Some(first);
        }
        let mut start = first;
        while (start + size).saturating_add(self.plan.lateness_ms) <= wm_at {
            if start >= last {
                return None;
            }
            start += slide;
        }
        Some(start)
    }

    /// The earliest-starting window a counted version counts in that has
    /// expired since (`end + L <= W`), if any.
    fn counted_expired(&self, old: &Counted, wm: i64) -> Option<(i64, i64)> {
        let size = self.fixed_span(old.time).size;
        let start = self.first_counted(old.time, old.wm_at)?;
        let end = start.checked_add(size).filter(|_| size > 0)?;
        (end.saturating_add(self.plan.lateness_ms) <= wm).then_some((start, end))
    }

    /// SPEC.md 3.3: a later, different version of a counted event replaces
    /// it, all or nothing. The old version leaves the windows it counts in
    /// (ledger `superseded`), the new one joins its own. It touches those
    /// windows only: one the old version was too late for does not refuse it.
    #[allow(clippy::too_many_arguments)]
    fn correct(&mut self, id_key: u128, seen: Seen, fresh: Seen, ctx: &Ctx<'_>, key: &[u8], wm: i64, out: &mut Output) {
        let Some(old) = self.st.counted.get(id_key).cloned() else {
            debug_assert!(false, "a remembered id has no counted version");
            return;
        };
        let time = ctx.time.unwrap_or(old.time);
        let expired = [self.counted_expired(&old, wm), self.earliest_expired(time, wm)].into_iter().flatten().min();
        if let Some(window) = expired {
            let detail = format!(
                "a correction of the event at partition {} offset {}, refused whole: one of the windows it touches had closed (the watermark had passed its end plus allowed_lateness, {}ms); the earlier version still counts",
                seen.partition, seen.offset, self.plan.lateness_ms
            );
            record(&mut self.st.counters, out, ctx, Some(key), Reason::TooLate, detail, Some(window), None);
            return;
        }
        if let Some(detail) = self.over_state_limit(time, key, wm) {
            record(&mut self.st.counters, out, ctx, Some(key), Reason::OverLimit, detail, None, None);
            return;
        }
        if !self.withdraw(&old, seen, ctx, out) {
            return;
        }
        self.assign_fixed(ctx, time, key, &KnownWindows::default(), wm, out);
        self.st.counters.counted += 1;
        let keep_until = old.keep_until.max(fresh.expires);
        self.remember_counted(id_key, fresh, time, key, wm, keep_until);
    }

    /// SPEC.md 3.3: a version the contract's `where` filters out deletes the
    /// counted version of its id, all or nothing; the id is then forgotten.
    fn delete_version(&mut self, root: Event<'_>, ctx: &mut Ctx<'_>, wm: i64, out: &mut Output) {
        let Some(id_path) = &self.plan.id_path else { return };
        let val = root.get(id_path);
        let Ok(id) = read_id(val, &self.plan.id_name) else { return };
        let id_key = dedup_key(val, &id);
        let Some(seen) = self.st.seen.get(id_key).filter(|s| s.expires > wm).copied() else { return };
        let Some(old) = self.st.counted.get(id_key).cloned() else { return };
        ctx.id = Some(Cow::Owned(id.into_owned()));
        if let Some(window) = self.counted_expired(&old, wm) {
            let detail = format!(
                "a deletion (this version does not pass source.where) of the event at partition {} offset {}, refused: its window had closed (the watermark had passed its end plus allowed_lateness, {}ms); the earlier version still counts",
                seen.partition, seen.offset, self.plan.lateness_ms
            );
            let key = self.counted_key(&old);
            record(&mut self.st.counters, out, ctx, key.as_deref(), Reason::TooLate, detail, Some(window), None);
            return;
        }
        if !self.withdraw(&old, seen, ctx, out) {
            return;
        }
        self.st.seen.remove(id_key);
        self.st.counted.remove(id_key);
        if self.st.seen.is_tracking() {
            self.st.forgotten.push((id_key, old.keep_until));
        }
    }

    /// The earliest-starting window an event at `time` falls in that has
    /// expired (`end + L <= W`), if any: windows end in order of start, so
    /// it is the first one or none.
    fn earliest_expired(&self, time: i64, wm: i64) -> Option<(i64, i64)> {
        let span = self.fixed_span(time);
        if span.size == 0 {
            return None;
        }
        let end = span.first + span.size;
        (end.saturating_add(self.plan.lateness_ms) <= wm).then_some((span.first, end))
    }

    /// Takes a counted version out of the windows it counts in, with its
    /// `superseded` entry naming `by`; false (nothing changed) if its first
    /// such window is gone, which the caller's expiry check rules out. A
    /// version that counts nowhere leaves nothing, and is superseded all the
    /// same.
    fn withdraw(&mut self, old: &Counted, seen: Seen, by: &Ctx<'_>, out: &mut Output) -> bool {
        let key = match self.first_counted(old.time, old.wm_at) {
            None => None,
            Some(from) => {
                let Some(key) = self.counted_key(old) else {
                    debug_assert!(false, "an open window of a counted version is missing");
                    return false;
                };
                self.take_out(old, from, &key, seen);
                Some(key)
            }
        };
        self.supersede(old, key, seen, by, out);
        true
    }

    /// Takes a counted version's contribution out of each window it counts
    /// in, the first starting at `from`.
    fn take_out(&mut self, old: &Counted, from: i64, key: &[u8], seen: Seen) {
        let FixedSpan { size, slide, last, .. } = self.fixed_span(old.time);
        let global = size == 0;
        let mut start = from;
        loop {
            let id = win_id(start, key);
            if let Some(w) = self.st.windows.get_mut(id) {
                for (state, given) in w.aggs.iter_mut().zip(old.given.iter()) {
                    state.take_back(*given);
                }
                crate::output::remove_source(&mut w.sources, seen.partition);
                w.events = w.events.saturating_sub(1);
                if !global && w.end <= old.wm_at {
                    w.late_events = w.late_events.saturating_sub(1);
                }
                if !w.dirty {
                    w.dirty = true;
                    self.dirty.push(id);
                }
            } else {
                debug_assert!(false, "a counted version's window is missing");
            }
            if global || start >= last {
                break;
            }
            start += slide;
        }
    }

    /// The ledger entry of a version that counted and was replaced.
    fn supersede(&mut self, old: &Counted, key: Option<KeyBytes>, seen: Seen, by: &Ctx<'_>, out: &mut Output) {
        self.st.counters.ledger[Reason::Superseded.index()] += 1;
        out.ledger.push(LedgerEntry {
            partition: seen.partition,
            offset: seen.offset,
            reason: Reason::Superseded,
            event_id: by.id().map(Cow::into_owned),
            event_time: Some(old.time),
            key: key.map(|k| k[..].into()),
            window: None,
            first_offset: None,
            superseded_by: Some(by.offset),
            detail: format!(
                "replaced by a later version of the same event at partition {} offset {}: it counts no more",
                by.partition, by.offset
            ),
            payload: None,
        });
    }

    /// Adds the event's contributions to a window.
    fn add_to(&mut self, id: WinId, ctx: &Ctx<'_>, time: i64, late: bool) {
        let Some(w) = self.st.windows.get_mut(id) else {
            debug_assert!(false, "window to add to is missing");
            return;
        };
        if add_event(w, &self.contribs, ctx, time, late) {
            self.dirty.push(id);
        }
    }

    /// Tumbling, hopping and global windows. `known`: the windows' ids the
    /// reader took ([`Fields::windows`]; none for a correction's windows).
    fn assign_fixed(
        &mut self,
        ctx: &Ctx<'_>,
        time: i64,
        key_bytes: &[u8],
        known: &KnownWindows,
        wm: i64,
        out: &mut Output,
    ) -> bool {
        let FixedSpan { size, slide, first, last } = self.fixed_span(time);
        let global = size == 0;
        let mut counted = false;
        let mut late_any = false;
        let mut start = first;
        loop {
            let end = if global { WM_MAX } else { start + size };
            if !global && end.saturating_add(self.plan.lateness_ms) <= wm {
                let detail = format!(
                    "too late for its window: the watermark had passed the window's end plus allowed_lateness ({}ms)",
                    self.plan.lateness_ms
                );
                record(
                    &mut self.st.counters,
                    out,
                    ctx,
                    Some(key_bytes),
                    Reason::TooLate,
                    detail,
                    Some((start, end)),
                    None,
                );
            } else {
                let hashed =
                    if known.first == first { known.ids.get(((start - first) / slide.max(1)) as usize) } else { None };
                let id = match hashed {
                    Some(&id) => id,
                    None => win_id(start, key_bytes),
                };
                debug_assert_eq!(id, win_id(start, key_bytes), "the reader's window id is the engine's");
                let late = !global && end <= wm;
                late_any |= late;
                let (w, made) =
                    self.st.windows.get_or_insert_with(id, || new_window(&self.plan, key_bytes, start, end));
                if made && !global {
                    self.st.timers.insert(end, id);
                    if self.plan.count_keys {
                        *self.st.keys.get_or_insert_with(key_id(key_bytes), || 0).0 += 1;
                    }
                }
                if add_event(w, &self.contribs, ctx, time, late) {
                    self.dirty.push(id);
                }
                counted = true;
            }
            if global || start >= last {
                break;
            }
            start += slide;
        }
        if late_any {
            self.st.counters.late_allowed += 1;
        }
        counted
    }

    /// Step 7's limits, checked before any window changes (an event counts
    /// whole or not at all): the event would open a window past
    /// `max_open_windows`, or a key past `max_keys`. Stream mode only: a
    /// batch holds every window of its range until the end, and is bounded
    /// by the range it is given.
    fn over_state_limit(&self, time: i64, key_bytes: &[u8], wm: i64) -> Option<String> {
        let plan = &self.plan;
        let st = &self.st;
        if self.mode == Mode::Batch {
            return None;
        }
        let open = st.windows.len();
        // Fast paths: far enough below both limits that no lookup is needed.
        let room = open < plan.max_open_windows;
        let (new_windows, new_key, keys) = match plan.kind {
            WindowKind::Session { .. } if room && st.sessions.len() < plan.max_keys => return None,
            WindowKind::Global if room && open < plan.max_keys => return None,
            WindowKind::Session { gap_ms } => {
                let sessions = st.sessions.get(key_bytes);
                let joins =
                    sessions.is_some_and(|s| s.range(..time + gap_ms).next_back().is_some_and(|(_, &e)| e > time));
                (usize::from(!joins), sessions.is_none(), st.sessions.len())
            }
            WindowKind::Global => {
                let new = st.windows.get(win_id(WM_MIN, key_bytes)).is_none();
                (usize::from(new), new, open)
            }
            _ => {
                let span = self.fixed_span(time);
                let most = ((span.last - span.first) / span.slide.max(1)) as usize + 1;
                if open + most <= plan.max_open_windows && (!plan.count_keys || st.keys.len() < plan.max_keys) {
                    return None;
                }
                let mut new = 0;
                let mut start = span.first;
                while start <= span.last {
                    let live = (start + span.size).saturating_add(plan.lateness_ms) > wm;
                    if live && st.windows.get(win_id(start, key_bytes)).is_none() {
                        new += 1;
                    }
                    start += span.slide.max(1);
                }
                let new_key = plan.count_keys && new > 0 && st.keys.get(key_id(key_bytes)).is_none();
                (new, new_key, st.keys.len())
            }
        };
        if new_windows > 0 && open + new_windows > plan.max_open_windows {
            Some(format!(
                "the pipeline holds {open} open windows and this event would open {new_windows} more, past max_open_windows = {}; raise the limit in [limits] or shorten the windows",
                plan.max_open_windows
            ))
        } else if new_key && keys >= plan.max_keys {
            Some(format!(
                "the pipeline holds windows for {keys} keys and this event's key would be one more, past max_keys = {}; raise the limit in [limits]",
                plan.max_keys
            ))
        } else {
            None
        }
    }

    /// Session windows: merge first, then test the merged window.
    fn assign_session(
        &mut self,
        ctx: &Ctx<'_>,
        time: i64,
        key_bytes: &[u8],
        gap: i64,
        wm: i64,
        out: &mut Output,
    ) -> bool {
        let (mut start, mut end) = (time, time + gap);
        let overlapping: Vec<(i64, i64)> = match self.st.sessions.get(key_bytes) {
            Some(sessions) => {
                sessions.range(..end).rev().take_while(|(_, &e)| e > time).map(|(&s, &e)| (s, e)).collect()
            }
            None => Vec::new(),
        };
        for &(s, e) in &overlapping {
            start = start.min(s);
            end = end.max(e);
        }
        if end.saturating_add(self.plan.lateness_ms) <= wm {
            let detail = format!(
                "too late for its session: the watermark had passed the session's end plus allowed_lateness ({}ms)",
                self.plan.lateness_ms
            );
            record(&mut self.st.counters, out, ctx, Some(key_bytes), Reason::TooLate, detail, Some((start, end)), None);
            return false;
        }
        // The merged session keeps the identity of the one that starts earliest,
        // or is new when this event starts before all of them.
        let mut merged = new_window(&self.plan, key_bytes, start, end);
        let mut identity: Option<(WinId, Window)> = None;
        for &(s, e) in overlapping.iter().rev() {
            let id = win_id(s, key_bytes);
            let Some(w) = self.st.windows.remove(id) else {
                debug_assert!(false, "session index names a missing window");
                continue;
            };
            self.st.timers.remove(e, id);
            if let Some(sessions) = self.st.sessions.get_mut(key_bytes) {
                sessions.remove(&s);
            }
            if s == start && identity.is_none() {
                identity = Some((id, w));
                continue;
            }
            if w.revision > 0 {
                let row = self.row(&w, Status::Retracted, w.revision + 1);
                self.pending.push((w.end, row));
            }
            for (into, from) in merged.aggs.iter_mut().zip(w.aggs) {
                into.merge(from);
            }
            merged.events += w.events;
            merged.late_events += w.late_events;
            crate::output::merge_sources(&mut merged.sources, &w.sources);
        }
        let id = match identity {
            Some((id, mut w)) => {
                for (into, from) in w.aggs.iter_mut().zip(merged.aggs) {
                    into.merge(from);
                }
                w.events += merged.events;
                w.late_events += merged.late_events;
                crate::output::merge_sources(&mut w.sources, &merged.sources);
                if w.end != end {
                    w.end = end;
                    w.past_end_emitted = false;
                }
                w.dirty = w.dirty || merged.events > 0;
                self.st.windows.insert(id, w);
                id
            }
            None => {
                let id = win_id(start, key_bytes);
                merged.dirty = merged.events > 0;
                self.st.windows.insert(id, merged);
                id
            }
        };
        if self.st.windows.get(id).is_some_and(|w| w.dirty) {
            self.dirty.push(id);
        }
        self.st.timers.insert(end, id);
        self.st.sessions.entry(key_bytes.into()).or_default().insert(start, end);
        let late = end <= wm;
        if late {
            self.st.counters.late_allowed += 1;
        }
        // add_to pushes the window on the dirty list only when it was clean.
        self.add_to(id, ctx, time, late);
        true
    }

    fn row(&self, w: &Window, status: Status, revision: u32) -> Row {
        self.row_with(w, status, revision, w.key.clone(), w.sources.clone())
    }

    fn row_with(&self, w: &Window, status: Status, revision: u32, key: KeyBytes, sources: Sources) -> Row {
        let global = matches!(self.plan.kind, WindowKind::Global);
        let wm = self.st.wm;
        Row {
            key,
            window_start: (!global).then_some(w.start),
            window_end: (!global).then_some(w.end),
            status,
            revision,
            values: w.aggs.iter().zip(&self.plan.aggs).map(|(s, a)| s.value(a.func)).collect(),
            events: w.events,
            late_events: w.late_events,
            sources,
            watermark: (wm != WM_MIN && wm != WM_MAX).then_some(wm),
        }
    }

    /// [`Engine::row`] for a window that settles and is forgotten: the row
    /// takes its key and sources instead of copies.
    fn settled_row(&self, mut w: Window, revision: u32) -> Row {
        let (key, sources) = (std::mem::take(&mut w.key), std::mem::take(&mut w.sources));
        self.row_with(&w, Status::Settled, revision, key, sources)
    }

    /// Step 9: rows for the windows that changed or whose time came, in order
    /// of window end, window start and key; then settled windows are forgotten.
    fn emit(&mut self, wm_before: i64, everything: bool, out: &mut Output) {
        let wm = self.st.wm;
        let mut candidates = std::mem::take(&mut self.candidates);
        candidates.clear();
        // A changed window can only emit early, past its end under revise,
        // or as a global window; otherwise its time decides (the timers below).
        let plan = &self.plan;
        let global = matches!(plan.kind, WindowKind::Global);
        for id in self.dirty.drain(..) {
            if let Some(w) = self.st.windows.get(id) {
                if global || plan.early || (plan.late == LatePolicy::Revise && w.end <= wm) {
                    candidates.push((w.end, id));
                }
            }
        }
        // Changed windows may repeat, and may be among the timed ones below
        // (which never repeat): they are sorted, and the timed ones among
        // them left out, so each window is decided once. The order decided
        // in does not matter: `send_pending` puts the rows in order.
        if candidates.len() > 1 {
            candidates.sort_unstable();
            candidates.dedup();
        }
        let changed = candidates.len();
        if everything {
            // Every window settles (the watermark is at its end): none is timed any more.
            self.st.timers.clear();
            candidates.extend(self.st.windows.iter().map(|(id, w)| (w.end, id)));
        } else if wm > wm_before {
            // The windows whose time to settle came are taken off the timers first,
            // so settling each does not look for its timer.
            let settle_to = wm.saturating_sub(self.plan.lateness_ms);
            self.st.timers.take_due(settle_to, &mut candidates);
            if self.plan.late == LatePolicy::Revise {
                self.st.timers.between(wm_before.max(settle_to), wm, &mut candidates);
            }
        }
        if candidates.is_empty() && self.pending.is_empty() {
            self.candidates = candidates;
            return;
        }
        if changed > 0 {
            let mut kept = changed;
            for at in changed..candidates.len() {
                let timed = candidates[at];
                if candidates[..changed].binary_search(&timed).is_err() {
                    candidates[kept] = timed;
                    kept += 1;
                }
            }
            candidates.truncate(kept);
        }
        // Each window decided is a table slot not touched since its last
        // event: the slots of those [`DECIDE_AHEAD`] ahead are asked for
        // while this one is decided.
        for &(_, id) in candidates.iter().take(DECIDE_AHEAD) {
            self.st.windows.prefetch(id);
        }
        for (at, &(end, id)) in candidates.iter().enumerate() {
            if let Some(&(_, ahead)) = candidates.get(at + DECIDE_AHEAD) {
                self.st.windows.prefetch(ahead);
            }
            if let Some(row) = self.decide(id) {
                self.pending.push((end, row));
            }
        }
        self.candidates = candidates;
        self.send_pending(out);
    }

    /// The rows of this step, in order of window end, window start and key.
    /// The order is found over a compact copy of each row's place (its end,
    /// start, the first 16 bytes of its key and its position; ties, which
    /// one window per row rules out, in the order decided), and only keys
    /// that share those bytes are compared whole: a close of thousands of
    /// windows sorts in one array instead of reaching into every row.
    fn send_pending(&mut self, out: &mut Output) {
        let counters = &mut self.st.counters;
        if self.pending.len() < 2 {
            self.pending.drain(..).for_each(|(_, row)| send(counters, row, out));
            return;
        }
        let pending = &self.pending;
        let order = self.order.sorted(pending.len(), |i| (pending[i].0, pending[i].1.window_start, &pending[i].1.key));
        // Each row moved out in its turn, an empty one (no allocation) left
        // in its place until the step's rows are cleared.
        for &at in order {
            if let Some((_, row)) = self.pending.get_mut(at as usize) {
                send(counters, taken(row), out);
            }
        }
        self.pending.clear();
    }

    /// Rules 1-3 of SPEC.md section 3.4 for one window.
    fn decide(&mut self, id: WinId) -> Option<Row> {
        let wm = self.st.wm;
        let plan = &self.plan;
        let w = self.st.windows.get(id)?;
        let global = matches!(plan.kind, WindowKind::Global);
        if w.events == 0 && w.revision == 0 {
            // Every version that counted here was corrected away before the
            // window published a row: it has nothing to say, as in a batch.
            if wm == WM_MAX || (!global && w.end.saturating_add(plan.lateness_ms) <= wm) {
                self.forget_window(id);
            } else if let Some(w) = self.st.windows.get_mut(id) {
                // Off the dirty list now: its next change puts it back.
                w.dirty = false;
            }
            return None;
        }
        let status = if global {
            if wm == WM_MAX {
                Status::Settled
            } else if w.dirty {
                Status::Provisional
            } else {
                return None;
            }
        } else if w.end.saturating_add(plan.lateness_ms) <= wm {
            Status::Settled
        } else if (plan.late == LatePolicy::Revise && wm >= w.end && (w.dirty || !w.past_end_emitted))
            || (plan.early && w.dirty)
        {
            // Rule 2 (revise, past the end) or rule 3 (early).
            Status::Provisional
        } else {
            return None;
        };
        let revision = if w.revision == 0 { self.st.revision_floor.saturating_add(1) } else { w.revision + 1 };
        if status == Status::Settled {
            // Its last row takes the window's key and sources, not copies.
            let w = self.st.windows.remove(id)?;
            self.forget_removed(id, &w);
            return Some(self.settled_row(w, revision));
        }
        let row = self.row(w, status, revision);
        if let Some(w) = self.st.windows.get_mut(id) {
            w.revision = revision;
            w.dirty = false;
            if wm >= w.end {
                w.past_end_emitted = true;
            }
        }
        Some(row)
    }

    fn forget_window(&mut self, id: WinId) {
        if let Some(w) = self.st.windows.remove(id) {
            self.forget_removed(id, &w);
        }
    }

    /// What else a window taken out of the table leaves: its timer, its
    /// key's count, its session.
    fn forget_removed(&mut self, id: WinId, w: &Window) {
        self.st.timers.remove(w.end, id);
        if self.plan.count_keys {
            let k = key_id(&w.key);
            if let Some(n) = self.st.keys.get_mut(k) {
                *n -= 1;
                if *n == 0 {
                    self.st.keys.remove(k);
                }
            }
        }
        if let WindowKind::Session { .. } = self.plan.kind {
            if let Some(sessions) = self.st.sessions.get_mut(&w.key) {
                sessions.remove(&w.start);
                if sessions.is_empty() {
                    self.st.sessions.remove(&w.key);
                }
            }
        }
    }

    /// Forgets event ids whose horizon the watermark has reached, in one
    /// pass, when the table is full; grows it when that freed too little.
    /// Sweeping only when full keeps the table within a constant factor of
    /// the ids a horizon holds (memory stays flat) and makes the sweep's cost
    /// per event small. A lookup checks the exact expiry, so when the sweep
    /// runs never changes what counts as a duplicate.
    fn forget_ids(&mut self) {
        let wm = self.st.wm;
        self.st.seen.retain(|seen| seen.expires > wm);
        self.st.seen.grow_if_half_full();
        if let (true, Some(horizon)) = (self.plan.corrects, self.plan.horizon_ms) {
            self.st.counted.retain(|c| c.time.saturating_add(horizon) > wm);
        }
    }
}

fn new_window(plan: &Plan, key: &[u8], start: i64, end: i64) -> Window {
    Window {
        key: KeyBytes::from_slice(key),
        start,
        end,
        events: 0,
        late_events: 0,
        revision: 0,
        dirty: false,
        past_end_emitted: false,
        aggs: plan.aggs.iter().map(|a| AggState::new(a.func)).collect(),
        sources: Sources::new(),
    }
}

/// `row`, moved out with an empty row left in its place: no allocation.
fn taken(row: &mut Row) -> Row {
    let empty = Row {
        key: KeyBytes::new(),
        window_start: None,
        window_end: None,
        status: row.status,
        revision: 0,
        values: Values::new(),
        events: 0,
        late_events: 0,
        sources: Sources::new(),
        watermark: None,
    };
    std::mem::replace(row, empty)
}

/// Adds one event to a window; true when the window just became dirty.
fn add_event(w: &mut Window, contribs: &[Contrib], ctx: &Ctx<'_>, time: i64, late: bool) -> bool {
    // Only `first` and `last` keep the id.
    let id = if contribs.iter().any(|c| matches!(c, Contrib::Pick { .. })) { ctx.id() } else { None };
    for (state, contrib) in w.aggs.iter_mut().zip(contribs) {
        state.add(contrib, time, id.as_deref());
    }
    crate::output::add_source(&mut w.sources, ctx.partition, ctx.offset);
    w.events += 1;
    if late {
        w.late_events += 1;
    }
    let was_clean = !w.dirty;
    w.dirty = true;
    was_clean
}

/// Records a ledger entry: the event (or its share in one window) did not count.
#[allow(clippy::too_many_arguments)]
fn record(
    counters: &mut Counters,
    out: &mut Output,
    ctx: &Ctx<'_>,
    key: Option<&[u8]>,
    reason: Reason,
    detail: String,
    window: Option<(i64, i64)>,
    first_offset: Option<u64>,
) {
    counters.ledger[reason.index()] += 1;
    out.ledger.push(LedgerEntry {
        partition: ctx.partition,
        offset: ctx.offset,
        reason,
        event_id: ctx.id().map(Cow::into_owned),
        event_time: ctx.time,
        key: key.map(Into::into),
        window,
        first_offset,
        superseded_by: None,
        detail,
        payload: Some(cut(ctx.payload, PAYLOAD_BYTES_MAX).to_owned()),
    });
}

fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

type FieldError = (Reason, String);

fn read_time(val: Option<Val<'_>>, plan: &Plan) -> Result<i64, FieldError> {
    let name = &plan.time_name;
    let val = match val {
        Some(v) if v.tag() != Tag::Null => v,
        _ => return Err((Reason::MissingField, format!("event time missing: no `{name}` in the event"))),
    };
    let bad = |what: String| {
        (Reason::BadType, format!("unreadable time: `{name}` is {what}; expected {}", plan.time_format.describe()))
    };
    let in_range = |ms: i64| (TIME_MIN_MS..=TIME_MAX_MS).contains(&ms).then_some(ms);
    match (&plan.time_format, val.tag()) {
        (TimeFormat::Auto, Tag::String) => {
            let text = val.str().unwrap_or_default();
            parse_rfc3339_ms(&text).ok_or_else(|| bad(format!("\"{}\"", cut(&text, 64))))
        }
        (TimeFormat::Auto, Tag::Number) => {
            let raw = val.raw();
            raw.parse::<i64>().ok().and_then(in_range).ok_or_else(|| bad(format!("the number {}", cut(raw, 64))))
        }
        (TimeFormat::Epoch(unit), Tag::Number | Tag::String) => {
            let text = if val.tag() == Tag::Number { Cow::Borrowed(val.raw()) } else { val.str().unwrap_or_default() };
            let digits = text.strip_prefix('-').unwrap_or(&text);
            let whole = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
            let ms = whole.then(|| text.parse::<i128>().ok()).flatten().and_then(|n| unit.to_millis(n));
            ms.and_then(in_range).ok_or_else(|| bad(cut(val.json_text(), 64).to_owned()))
        }
        (TimeFormat::Pattern(pattern), Tag::String) => {
            let text = val.str().unwrap_or_default();
            let ms = pattern.read(&text, plan.time_zone).and_then(in_range);
            ms.ok_or_else(|| bad(format!("\"{}\"", cut(&text, 64))))
        }
        (TimeFormat::Pattern(_), _) => Err(bad(format!("{}, not a string", cut(val.json_text(), 64)))),
        _ => Err(bad(format!("{}, not a string or a number", cut(val.json_text(), 64)))),
    }
}

/// Reads the group key into `out`; returns the length of its values' text.
fn read_key(root: Event<'_>, plan: &Plan, out: &mut Vec<u8>) -> Result<usize, FieldError> {
    out.clear();
    let mut text = 0;
    for (path, name) in plan.key_paths.iter().zip(&plan.key_names) {
        let val = match root.get(path) {
            Some(v) if v.tag() != Tag::Null => v,
            _ => return Err((Reason::MissingField, format!("key missing: no `{name}` in the event"))),
        };
        text += val.raw().len();
        match val.tag() {
            Tag::String => key::push_field(b's', &val.str().unwrap_or_default(), out),
            Tag::True => key::push_field(b'b', "1", out),
            Tag::False => key::push_field(b'b', "0", out),
            Tag::Number if !val.raw().contains(['.', 'e', 'E']) => key::push_field(b'i', val.raw(), out),
            _ => {
                return Err((
                    Reason::BadType,
                    format!("key `{name}` is {}, not a string, integer or boolean", cut(val.json_text(), 64)),
                ))
            }
        }
    }
    Ok(text)
}

/// A key's identity in [`State::keys`].
pub(crate) fn key_id(key_bytes: &[u8]) -> u128 {
    xxhash_rust::xxh3::xxh3_128(key_bytes)
}

fn read_id<'a>(val: Option<Val<'a>>, name: &str) -> Result<Cow<'a, str>, FieldError> {
    match val {
        Some(v) if v.tag() == Tag::String => Ok(v.str().unwrap_or_default()),
        Some(v) if v.tag() == Tag::Number && !v.raw().contains(['.', 'e', 'E']) => Ok(Cow::Borrowed(v.raw())),
        Some(v) if v.tag() != Tag::Null => Err((
            Reason::BadType,
            format!("event id `{name}` is {}, not a string or an integer", cut(v.json_text(), 64)),
        )),
        _ => Err((Reason::MissingField, format!("event id missing: no `{name}` in the event (needed by [dedup])"))),
    }
}

/// The fixed windows (tumbling, hopping, global) an event time falls in:
/// starts `first..=last`, `slide` apart; `size` 0 for the global window.
struct FixedSpan {
    size: i64,
    slide: i64,
    first: i64,
    last: i64,
}

impl Engine {
    /// The tumbling or hopping windows `time` falls in. The slide divides
    /// the size (the contract says so), so the last window's start gives the
    /// first's. Events come mostly in order, so the last start found is
    /// kept with the slide it covers, and a time inside it needs no division.
    fn fixed_span(&self, time: i64) -> FixedSpan {
        let Some((size, slide)) = size_and_slide(self.plan.kind) else {
            return FixedSpan { size: 0, slide: 0, first: WM_MIN, last: WM_MIN };
        };
        let (from, to) = self.span_at.get();
        let last = if from <= time && time < to {
            from
        } else {
            let last = time - time.rem_euclid(slide);
            self.span_at.set((last, last.saturating_add(slide)));
            last
        };
        FixedSpan { size, slide, first: last - (size - slide), last }
    }
}

/// A window's id: its group key's bytes hashed with its start as the seed.
fn win_id(start: i64, key_bytes: &[u8]) -> WinId {
    xxhash_rust::xxh3::xxh3_128_with_seed(key_bytes, start as u64)
}

/// How many of an event's fixed windows the reader hashes ahead: a hopping
/// window's size is at most this many slides in most contracts (q5a: five);
/// the engine hashes any further ones itself.
const KNOWN_WINDOWS: usize = 8;

/// An event's fixed windows as the reader found them ([`Fields::windows`]).
#[derive(Debug, Default)]
struct KnownWindows {
    /// The first window's start ([`Engine::fixed_span`]'s `first`).
    first: i64,
    /// The ids of the windows from `first`, a slide apart; empty when the
    /// event's time or key could not be read, or its windows are sessions.
    ids: Vec<WinId>,
}

/// The first fixed window `time` falls in ([`Engine::fixed_span`]'s
/// `first`, without its cache): its start, the slide and how many windows
/// the time falls in; `None` for session windows.
fn fixed_starts(kind: WindowKind, time: i64) -> Option<(i64, i64, i64)> {
    match (kind, size_and_slide(kind)) {
        (_, Some((size, slide))) => Some((time - time.rem_euclid(slide) - (size - slide), slide, size / slide)),
        (WindowKind::Global, None) => Some((WM_MIN, 0, 1)),
        _ => None,
    }
}

/// A tumbling or hopping window's size and slide (a tumbling window slides by its size).
fn size_and_slide(kind: WindowKind) -> Option<(i64, i64)> {
    match kind {
        WindowKind::Tumbling { size_ms } => Some((size_ms, size_ms)),
        WindowKind::Hopping { size_ms, slide_ms } => Some((size_ms, slide_ms)),
        WindowKind::Global | WindowKind::Session { .. } => None,
    }
}

/// One row out, counted by its status.
fn send(counters: &mut Counters, row: Row, out: &mut Output) {
    match row.status {
        Status::Provisional => counters.rows_provisional += 1,
        Status::Settled => counters.rows_settled += 1,
        Status::Retracted => counters.rows_retracted += 1,
        Status::Corrected => {} // a backfill's, never the engine's
    }
    out.rows.push(row);
}

/// The live entry for `id` (one whose `expires` is past `wm`), left as it
/// is; otherwise `fresh` is stored for `id` and the result is `None`.
fn remember(seen: &mut HashedTable<Seen>, id: u128, fresh: Seen, wm: i64) -> Option<Seen> {
    let (entry, made) = seen.get_or_insert_with(id, || fresh);
    if made {
        return None;
    }
    if entry.expires > wm {
        return Some(*entry);
    }
    *entry = fresh;
    None
}

/// Dedup identity: a 128-bit hash of the id's type and text, so memory per
/// remembered id is fixed (`"5"` and `5` differ). Two ids share a hash with
/// probability about 2^-128 per pair.
fn dedup_key(val: Option<Val<'_>>, id: &str) -> u128 {
    let tag = match val.map(|v| v.tag()) {
        Some(Tag::Number) => b'i',
        _ => b's',
    };
    xxhash_rust::xxh3::xxh3_128_with_seed(id.as_bytes(), u64::from(tag))
}

/// Step 5 for one aggregate: what the event gives it, or why it cannot.
fn contribution(root: Event<'_>, agg: &crate::plan::AggPlan, pass: bool) -> Result<Contrib, String> {
    if !pass {
        return Ok(Contrib::Skip);
    }
    let Some(path) = &agg.field else {
        return Ok(Contrib::One);
    };
    let val = match root.get(path) {
        Some(v) if v.tag() != Tag::Null => v,
        _ => return Ok(Contrib::Skip),
    };
    Ok(match agg.func {
        AggFn::Count => Contrib::One,
        AggFn::CountDistinct => Contrib::Distinct(val.canonical_hash128()),
        AggFn::First | AggFn::Last => Contrib::Pick { json: val.json_text().into(), hash: val.canonical_hash() },
        AggFn::Sum | AggFn::Min | AggFn::Max | AggFn::Avg => {
            let decimal = match val.tag() {
                Tag::Number => parse_decimal(val.raw()),
                Tag::String => parse_decimal(&val.str().unwrap_or_default()),
                _ => None,
            };
            match decimal {
                Some(d) => Contrib::Num(d),
                None if val.tag() == Tag::String => {
                    return Err(format!("string is not a number: `{}` is {}", agg.field_name, cut(val.json_text(), 64)))
                }
                None if val.tag() == Tag::Number => {
                    return Err(format!(
                        "`{}` = {} has more than 28 significant digits",
                        agg.field_name,
                        cut(val.raw(), 64)
                    ))
                }
                None => return Err(format!("`{}` is {}, not a number", agg.field_name, cut(val.json_text(), 64))),
            }
        }
    })
}

//! Properties over random inputs (proptest; a failing case prints its seed
//! and shrinks). Differential: a stream run, after the final watermark,
//! against the batch on the same events in any arrival order.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use proptest::prelude::*;
use weir_contract::Contract;
use weir_engine::{Counters, Engine, EventIn, Mode, Output, ReadEvent, Recall, Row, Status};

#[derive(Debug, Clone)]
struct Shape {
    window: &'static str,
    late: &'static str,
    early: bool,
    dedup: bool,
    /// `on_conflict = "correct"`: count, sum and avg only, no sessions.
    corrects: bool,
}

fn contract(shape: &Shape, lateness_ms: i64, max_delay_ms: i64) -> Contract {
    let late = if lateness_ms == 0 && shape.late != "discard" { "discard" } else { shape.late };
    let lateness = if late == "discard" { 0 } else { lateness_ms };
    let dedup = match (shape.corrects, shape.dedup) {
        (true, _) => "[dedup]\nhorizon = \"1h\"\non_conflict = \"correct\"\n",
        (false, true) => "[dedup]\nhorizon = \"1h\"\n",
        (false, false) => "",
    };
    let window = if shape.corrects && shape.window.contains("session") { WINDOWS[0] } else { shape.window };
    let others = if shape.corrects { "" } else { OTHER_AGGREGATES };
    let text = format!(
        r#"[pipeline]
name = "prop"
version = 1
owner = "o"
steward = "s"
decision = "d"

[source]
topic = "t"
event_time = "t"
key = ["k"]
event_id = "id"
where = 'status != "void"'
max_delay = "{max_delay_ms}ms"

[window]
{window}
allowed_lateness = "{lateness}ms"
late = "{late}"
early = {early}

{dedup}
[[aggregate]]
name = "n"
fn = "count"

[[aggregate]]
name = "total"
fn = "sum"
field = "amount"

[[aggregate]]
name = "mean"
fn = "avg"
field = "amount"
{others}"#,
        early = shape.early,
    );
    Contract::parse("prop.toml", &text).unwrap()
}

const WINDOWS: [&str; 4] = [
    "type = \"tumbling\"\nsize = \"10s\"",
    "type = \"hopping\"\nsize = \"10s\"\nslide = \"5s\"",
    "type = \"session\"\ngap = \"3s\"",
    "type = \"global\"",
];

/// What a contract without corrections aggregates besides count, sum and avg.
const OTHER_AGGREGATES: &str = r#"
[[aggregate]]
name = "hi"
fn = "max"
field = "amount"

[[aggregate]]
name = "firsts"
fn = "first"
field = "amount"

[[aggregate]]
name = "lasts"
fn = "last"
field = "amount"

[[aggregate]]
name = "kinds"
fn = "count_distinct"
field = "amount"
"#;

fn shape() -> impl Strategy<Value = Shape> {
    (
        prop::sample::select(WINDOWS.to_vec()),
        prop::sample::select(vec!["discard", "hold", "revise"]),
        any::<bool>(),
        any::<bool>(),
        prop::bool::weighted(0.3),
    )
        .prop_map(|(window, late, early, dedup, corrects)| Shape { window, late, early, dedup, corrects })
}

const T0: i64 = 1_795_910_400_000;

fn line(k: usize, t: i64, id: usize, cents: u32, status: &str) -> String {
    format!(
        r#"{{"k":"{}","t":{},"id":"e{id}","amount":{}.{:02},"status":"{status}"}}"#,
        ["a", "b", "c"][k],
        T0 + t,
        cents / 100,
        cents % 100
    )
}

/// Events as (event time ms, line). Duplicates are exact copies.
fn events() -> impl Strategy<Value = Vec<(i64, String)>> {
    versions(0.0, 0.0)
}

/// Events as (event time ms, line): exact duplicates, and (with the given
/// weights) later versions of an earlier event, with another amount, key
/// or a time up to 2 s away, and `void` versions (filtered out: a deletion
/// under `on_conflict = "correct"`).
fn versions(correct: f64, void: f64) -> impl Strategy<Value = Vec<(i64, String)>> {
    let item = (
        0usize..3,
        0i64..60_000,
        0u32..5_000,
        prop::option::weighted(0.15, 0usize..1000),
        (0.0..1.0, 0usize..1000, -2_000i64..2_000),
        0.0..1.0,
    );
    prop::collection::vec(item, 1..50).prop_map(move |raw| {
        // (key, time, id, cents) of every first version, to make later ones of.
        let mut firsts: Vec<(usize, i64, usize, u32)> = Vec::new();
        let mut out: Vec<(i64, String)> = Vec::new();
        for (i, (k, t, cents, dup, (p, j, shift), v)) in raw.into_iter().enumerate() {
            let version = (p < correct).then_some((j, shift));
            let void = v < void;
            match (dup, version) {
                (Some(j), _) if !out.is_empty() => {
                    let copy = out[j % out.len()].clone();
                    out.push(copy);
                }
                (_, Some((j, shift))) if !firsts.is_empty() => {
                    let (_, t0, id, _) = firsts[j % firsts.len()];
                    let t = (t0 + shift).max(0);
                    out.push((T0 + t, line(k, t, id, cents, if void { "void" } else { "ok" })));
                }
                _ => {
                    firsts.push((k, t, i, cents));
                    out.push((T0 + t, line(k, t, i, cents, "ok")));
                }
            }
        }
        out
    })
}

fn run(c: &Contract, mode: Mode, lines: &[&str]) -> Output {
    run_counted(c, mode, lines).0
}

fn run_counted(c: &Contract, mode: Mode, lines: &[&str]) -> (Output, Counters) {
    let mut engine = Engine::new(c, mode, 1).unwrap();
    let mut out = Output::default();
    for (i, line) in lines.iter().enumerate() {
        engine.process(EventIn { partition: 0, offset: i as u64 + 1, bytes: line.as_bytes() }, &mut out);
    }
    engine.finish(&mut out);
    (out, engine.counters().clone())
}

type WindowId = (weir_engine::KeyBytes, Option<i64>);

/// The last row of every key and window that was not retracted, and that
/// holds events (a window whose versions were all corrected away says it
/// holds none, as a batch says by having no row): values and events.
fn finals(rows: &[Row]) -> BTreeMap<WindowId, String> {
    let mut last: BTreeMap<WindowId, &Row> = BTreeMap::new();
    for row in rows {
        last.insert((row.key.clone(), row.window_start), row);
    }
    last.into_iter()
        .filter(|(_, r)| r.status != Status::Retracted && r.events > 0)
        .map(|(id, r)| (id, format!("{:?} end={:?} events={}", r.values, r.window_end, r.events)))
        .collect()
}

/// Arrival order with disorder bounded by `disorder_ms`: sort by time plus a jitter in [0, disorder].
fn arrive(events: &[(i64, String)], jitter: &[i64], disorder_ms: i64) -> Vec<String> {
    let mut keyed: Vec<(i64, usize)> = events
        .iter()
        .enumerate()
        .map(|(i, (t, _))| (t + jitter[i % jitter.len()].rem_euclid(disorder_ms + 1), i))
        .collect();
    keyed.sort();
    keyed.into_iter().map(|(_, i)| events[i].1.clone()).collect()
}

/// Another spelling of the same JSON as a line of [`line`]: members in
/// reverse order, spaces around them, and the amount with a zero more.
fn respell(line: &str) -> String {
    let inner = line.trim_start_matches('{').trim_end_matches('}');
    let members: Vec<String> = inner
        .split(',')
        .rev()
        .map(|m| if m.starts_with("\"amount\":") { format!("{m}0") } else { m.replacen(':', " : ", 1) })
        .collect();
    format!("{{ {} }}", members.join(" ,\t"))
}

/// Events read back by their offset (the 1-based position in `lines`),
/// counting how often.
struct ReadBack {
    lines: Vec<String>,
    calls: Arc<AtomicUsize>,
}

impl Recall for ReadBack {
    fn recall(&mut self, partition: u32, offset: u64) -> Result<String, String> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        assert_eq!(partition, 0);
        let at = usize::try_from(offset).ok().and_then(|o| o.checked_sub(1));
        at.and_then(|at| self.lines.get(at)).cloned().ok_or_else(|| format!("no event at offset {offset}"))
    }
}

/// [`run_counted`] by an engine that remembers payloads by their bytes and
/// reads them back from `read_back` (the lines themselves unless given):
/// also how many events it read back, and its failure.
fn run_reading_back(
    c: &Contract,
    lines: &[&str],
    read_back: Option<Vec<String>>,
) -> (Output, Counters, usize, Option<String>) {
    let mut engine = Engine::new(c, Mode::Stream, 1).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let lines_back = read_back.unwrap_or_else(|| lines.iter().map(|l| (*l).to_owned()).collect());
    engine.recall_with(Box::new(ReadBack { lines: lines_back, calls: Arc::clone(&calls) })).unwrap();
    let mut out = Output::default();
    for (i, line) in lines.iter().enumerate() {
        engine.process(EventIn { partition: 0, offset: i as u64 + 1, bytes: line.as_bytes() }, &mut out);
    }
    engine.finish(&mut out);
    let failure = engine.recall_failure().map(str::to_owned);
    (out, engine.counters().clone(), calls.load(Ordering::Relaxed), failure)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// (a) With lateness longer than the input's disorder, the stream's final
    /// rows equal the batch's, whatever the arrival order, duplicates included.
    #[test]
    fn stream_settles_to_batch(
        shape in shape(),
        events in events(),
        jitter in prop::collection::vec(0i64..1_000_000, 1..64),
        disorder_ms in 0i64..20_000,
        max_delay_ms in prop::sample::select(vec![0i64, 1_000, 5_000]),
    ) {
        let lateness = disorder_ms + 1;
        let shape = Shape { late: if shape.late == "discard" { "hold" } else { shape.late }, ..shape };
        let c = contract(&shape, lateness, max_delay_ms);
        let lines = arrive(&events, &jitter, disorder_ms);
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        let stream = run(&c, Mode::Stream, &refs);
        prop_assert!(stream.ledger.iter().all(|l| l.reason.as_str() != "too_late"), "nothing may be too late: {:?}", stream.ledger);
        let mut sorted = events.clone();
        sorted.sort();
        let batch_refs: Vec<&str> = sorted.iter().map(|(_, l)| l.as_str()).collect();
        let batch = run(&c, Mode::Batch, &batch_refs);
        prop_assert_eq!(finals(&stream.rows), finals(&batch.rows));
    }

    /// (a, with corrections) `on_conflict = "correct"`: later versions
    /// replace counted ones (another amount, key or time up to 2 s away) and
    /// `void` versions delete them. With lateness longer than the disorder
    /// plus that 2 s, nothing is refused, and the stream's final rows equal
    /// the batch's over the same arrival order, where the last version of
    /// each id counts.
    #[test]
    fn stream_with_corrections_settles_to_batch(
        window in prop::sample::select(vec![WINDOWS[0], WINDOWS[1], WINDOWS[3]]),
        late in prop::sample::select(vec!["hold", "revise"]),
        early in any::<bool>(),
        events in versions(0.3, 0.25),
        jitter in prop::collection::vec(0i64..1_000_000, 1..64),
        disorder_ms in 0i64..20_000,
        max_delay_ms in prop::sample::select(vec![0i64, 1_000, 5_000]),
    ) {
        let shape = Shape { window, late, early, dedup: true, corrects: true };
        let c = contract(&shape, disorder_ms + 2_001, max_delay_ms);
        let lines = arrive(&events, &jitter, disorder_ms);
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        let stream = run(&c, Mode::Stream, &refs);
        prop_assert!(stream.ledger.iter().all(|l| l.reason.as_str() != "too_late"), "nothing may be too late: {:?}", stream.ledger);
        let batch = run(&c, Mode::Batch, &refs);
        prop_assert_eq!(finals(&stream.rows), finals(&batch.rows));
        let superseded = |o: &Output| o.ledger.iter().filter(|l| l.reason.as_str() == "superseded").count();
        prop_assert_eq!(superseded(&stream), superseded(&batch));
        // From scratch: only the last version of each id to arrive, unless it is void.
        let mut last: BTreeMap<String, &str> = BTreeMap::new();
        for l in &refs {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            last.insert(v["id"].as_str().unwrap().to_owned(), l);
        }
        let kept: Vec<&str> = last.into_values().filter(|l| !l.contains("\"void\"")).collect();
        let truth = run(&c, Mode::Batch, &kept);
        prop_assert_eq!(finals(&batch.rows), finals(&truth.rows));
    }

    /// Events read apart by an [`EventReader`] (as `weir run` does on a
    /// second thread) and counted with the table slots of other events asked
    /// for ahead ([`Engine::prefetch`]) give the rows, ledger and counters of
    /// events given to [`Engine::process`] one by one.
    #[test]
    fn reading_apart_and_prefetching_change_nothing(
        window in prop::sample::select(WINDOWS.to_vec()),
        late in prop::sample::select(vec!["hold", "revise", "discard"]),
        events in versions(0.3, 0.25),
        jitter in prop::collection::vec(0i64..1_000_000, 1..64),
        disorder_ms in 0i64..20_000,
        corrects in any::<bool>(),
        ahead in 0usize..6,
    ) {
        let shape = Shape { window, late, early: true, dedup: true, corrects };
        let c = contract(&shape, 1_000, 0);
        let mut lines = arrive(&events, &jitter, disorder_ms);
        lines.insert(lines.len() / 2, "not json".to_owned());
        lines.insert(lines.len() / 3, "[1, 2]".to_owned());
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        let (one_by_one, counters) = run_counted(&c, Mode::Stream, &refs);

        let mut engine = Engine::new(&c, Mode::Stream, 1).unwrap();
        let mut reader = engine.reader();
        let reads: Vec<ReadEvent> = refs
            .iter()
            .map(|line| {
                let mut read = ReadEvent::default();
                reader.read(line, line.len(), true, &mut read);
                read
            })
            .collect();
        let mut out = Output::default();
        for (i, (line, read)) in refs.iter().zip(&reads).enumerate() {
            if let Some(next) = reads.get(i + ahead) {
                engine.prefetch(next);
            }
            // A slot asked for and never used changes nothing either.
            engine.prefetch(&reads[(i * 7) % reads.len()]);
            engine.process_read(0, i as u64 + 1, line, read, &mut out);
        }
        engine.finish(&mut out);
        prop_assert_eq!(format!("{:?}", out.rows), format!("{:?}", one_by_one.rows));
        prop_assert_eq!(format!("{:?}", out.ledger), format!("{:?}", one_by_one.ledger));
        prop_assert_eq!(engine.counters(), &counters);
    }

    /// Payloads remembered by their bytes, read back when an id comes again
    /// with other bytes (`Engine::recall_with`), give the rows, ledger and
    /// counters of the canonical hash alone: over exact copies, the same
    /// events spelled otherwise, conflicts and corrections.
    #[test]
    fn remembering_payloads_by_their_bytes_changes_nothing(
        window in prop::sample::select(WINDOWS.to_vec()),
        late in prop::sample::select(vec!["hold", "revise", "discard"]),
        events in versions(0.3, 0.25),
        respelled in prop::collection::vec((0usize..1000, 0usize..1000), 0..12),
        jitter in prop::collection::vec(0i64..1_000_000, 1..64),
        disorder_ms in 0i64..20_000,
        corrects in any::<bool>(),
    ) {
        let shape = Shape { window, late, early: true, dedup: true, corrects };
        let c = contract(&shape, 1_000, 0);
        let mut lines = arrive(&events, &jitter, disorder_ms);
        for (from, to) in &respelled {
            let copy = respell(&lines[from % lines.len()]);
            lines.insert(to % (lines.len() + 1), copy);
        }
        lines.insert(lines.len() / 2, "not json".to_owned());
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        let (canonical, counters) = run_counted(&c, Mode::Stream, &refs);
        let (raw, raw_counters, _, failure) = run_reading_back(&c, &refs, None);
        prop_assert_eq!(failure, None);
        prop_assert_eq!(format!("{:?}", raw.rows), format!("{:?}", canonical.rows));
        prop_assert_eq!(format!("{:?}", raw.ledger), format!("{:?}", canonical.ledger));
        prop_assert_eq!(&raw_counters, &counters);
    }

    /// (b) A snapshot after any event, restored, continues with exactly the
    /// rows and ledger entries of an uninterrupted run.
    #[test]
    fn snapshot_and_restore_change_nothing(
        shape in shape(),
        events in versions(0.2, 0.2),
        jitter in prop::collection::vec(0i64..1_000_000, 1..64),
        disorder_ms in 0i64..30_000,
        lateness in 0i64..10_000,
        cut in any::<prop::sample::Index>(),
    ) {
        let c = contract(&shape, lateness, 2_000);
        let lines = arrive(&events, &jitter, disorder_ms);
        let (whole, whole_counters) = run_counted(&c, Mode::Stream, &lines.iter().map(String::as_str).collect::<Vec<_>>());
        let k = cut.index(lines.len() + 1);
        let mut first = Engine::new(&c, Mode::Stream, 1).unwrap();
        let mut out = Output::default();
        for (i, line) in lines[..k].iter().enumerate() {
            first.process(EventIn { partition: 0, offset: i as u64 + 1, bytes: line.as_bytes() }, &mut out);
        }
        let bytes = first.snapshot();
        let mut second = Engine::restore(&c, &bytes).unwrap();
        prop_assert_eq!(second.snapshot(), bytes, "a restored engine snapshots to the same bytes");
        for (i, line) in lines[k..].iter().enumerate() {
            second.process(EventIn { partition: 0, offset: (k + i) as u64 + 1, bytes: line.as_bytes() }, &mut out);
        }
        second.finish(&mut out);
        prop_assert_eq!(&out.rows, &whole.rows);
        prop_assert_eq!(&out.ledger, &whole.ledger);
        prop_assert_eq!(second.counters(), &whole_counters);
    }

    /// (b, in parts) Deltas taken at random points and applied to a store of
    /// windows and ids restore an engine equal to one snapshotted whole, and
    /// it continues with exactly the rows of an uninterrupted run.
    #[test]
    fn deltas_restore_what_a_snapshot_restores(
        shape in shape(),
        events in versions(0.2, 0.2),
        jitter in prop::collection::vec(0i64..1_000_000, 1..64),
        disorder_ms in 0i64..30_000,
        lateness in 0i64..10_000,
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 1..5),
    ) {
        let c = contract(&shape, lateness, 2_000);
        let lines = arrive(&events, &jitter, disorder_ms);
        let (whole, _) = run_counted(&c, Mode::Stream, &lines.iter().map(String::as_str).collect::<Vec<_>>());
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c.index(lines.len() + 1)).collect();
        cuts.sort_unstable();
        let mut engine = Engine::new(&c, Mode::Stream, 1).unwrap();
        engine.track_changes();
        let mut out = Output::default();
        let (mut header, mut windows, mut batches) = (Vec::new(), BTreeMap::new(), Vec::<(i64, Vec<u8>)>::new());
        let mut done = 0;
        for &cut in &cuts {
            for (i, line) in lines[done..cut].iter().enumerate() {
                engine.process(EventIn { partition: 0, offset: (done + i) as u64 + 1, bytes: line.as_bytes() }, &mut out);
            }
            done = cut;
            let delta = engine.take_delta();
            header = delta.header;
            for (k, w) in delta.windows {
                match w {
                    Some(bytes) => windows.insert(k, bytes),
                    None => windows.remove(&k),
                };
            }
            if !delta.ids.is_empty() {
                batches.push((delta.ids_keep_until, delta.ids));
            }
            batches.retain(|(keep_until, _)| *keep_until > delta.forget_ids_through);
        }
        let mut restored = Engine::restore_parts(&c, &header, windows, batches.iter().map(|(_, b)| b)).unwrap();
        prop_assert_eq!(restored.snapshot(), engine.snapshot());
        for (i, line) in lines[done..].iter().enumerate() {
            restored.process(EventIn { partition: 0, offset: (done + i) as u64 + 1, bytes: line.as_bytes() }, &mut out);
        }
        restored.finish(&mut out);
        prop_assert_eq!(&out.rows, &whole.rows);
        prop_assert_eq!(&out.ledger, &whole.ledger);
    }

    /// (c) Per window: revisions are 1..n, nothing follows `settled` or
    /// `retracted`, and every row before the last is `provisional`.
    ///
    /// A session is one window from its first row to its settled or
    /// retracted row. Only sessions can come back under the same key and
    /// start: a very late event that overlaps an open session can take the
    /// start of one already settled (SPEC.md 3.4: merge first, then test the
    /// merged window; the merged session starts again at revision 1).
    #[test]
    fn revisions_are_one_to_n_and_final_rows_are_last(
        shape in shape(),
        events in events(),
        jitter in prop::collection::vec(0i64..1_000_000, 1..64),
        disorder_ms in 0i64..60_000,
        lateness in 0i64..10_000,
    ) {
        let c = contract(&shape, lateness, 1_000);
        let session = shape.window.contains("session");
        let lines = arrive(&events, &jitter, disorder_ms);
        let out = run(&c, Mode::Stream, &lines.iter().map(String::as_str).collect::<Vec<_>>());
        let mut per_window: BTreeMap<WindowId, Vec<&Row>> = BTreeMap::new();
        for row in &out.rows {
            per_window.entry((row.key.clone(), row.window_start)).or_default().push(row);
        }
        for (id, rows) in per_window {
            let mut lives: Vec<Vec<&Row>> = vec![Vec::new()];
            for row in rows {
                lives.last_mut().unwrap().push(row);
                if row.status != Status::Provisional {
                    lives.push(Vec::new());
                }
            }
            if lives.last().is_some_and(Vec::is_empty) {
                lives.pop();
            }
            prop_assert!(session || lives.len() == 1, "only sessions come back: {:?}", id);
            for life in lives {
                for (i, row) in life.iter().enumerate() {
                    prop_assert_eq!(row.revision as usize, i + 1, "{:?}", id);
                    if i + 1 < life.len() {
                        prop_assert_eq!(row.status, Status::Provisional, "{:?}", id);
                    }
                }
                prop_assert!(life.last().is_some_and(|r| r.status != Status::Provisional), "every window ends settled or retracted: {:?}", id);
            }
        }
    }

    /// (d) A server's engine emits per batch (SPEC.md 3.4): over the same
    /// events cut into random batches, its ledger and final rows are those
    /// of an engine emitting per event; before a batch ends only windows
    /// that settle emit (as per event); in each batch a window emits at most
    /// one row, equal to the last one the per-event engine emitted for it
    /// there (status, values, events), and where only the per-event engine
    /// emitted, its last row holds no event (every version corrected away
    /// before the per-batch engine published the window); revisions still go
    /// 1..n without a gap.
    #[test]
    fn per_batch_emission_ends_each_batch_where_per_event_emission_does(
        shape in shape(),
        events in versions(0.2, 0.2),
        jitter in prop::collection::vec(0i64..1_000_000, 1..64),
        disorder_ms in 0i64..30_000,
        lateness in 0i64..10_000,
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
    ) {
        let c = contract(&shape, lateness, 2_000);
        let session = shape.window.contains("session");
        let lines = arrive(&events, &jitter, disorder_ms);
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c.index(lines.len() + 1)).collect();
        cuts.push(lines.len());
        cuts.sort_unstable();
        let (mut each, mut batched) = (Engine::new(&c, Mode::Stream, 1).unwrap(), Engine::new(&c, Mode::Stream, 1).unwrap());
        batched.emit_per_batch();
        let (mut each_out, mut batched_out) = (Output::default(), Output::default());
        // Per batch, the rows each engine emitted in it; the last batch is the finish.
        let (mut each_rows, mut batched_rows): (Vec<Vec<Row>>, Vec<Vec<Row>>) = (Vec::new(), Vec::new());
        let mut done = 0;
        for cut in cuts.iter().copied().chain([usize::MAX]) {
            if cut == usize::MAX {
                each.finish(&mut each_out);
                batched.finish(&mut batched_out);
            } else {
                for (i, line) in lines[done..cut].iter().enumerate() {
                    let event = || EventIn { partition: 0, offset: (done + i) as u64 + 1, bytes: line.as_bytes() };
                    each.process(event(), &mut each_out);
                    batched.process(event(), &mut batched_out);
                }
                done = cut;
                let early: Vec<&Row> = batched_out.rows.iter().filter(|r| r.status == Status::Provisional).collect();
                prop_assert!(early.is_empty(), "only a settling window emits before its batch ends: {:?}", early);
                batched.end_batch(&mut batched_out);
            }
            each_rows.push(std::mem::take(&mut each_out.rows));
            batched_rows.push(std::mem::take(&mut batched_out.rows));
        }
        prop_assert_eq!(&each_out.ledger, &batched_out.ledger);
        let all = |rows: &[Vec<Row>]| rows.concat();
        prop_assert_eq!(finals(&all(&each_rows)), finals(&all(&batched_rows)));
        let seen = |r: &Row| format!("{:?} {:?} end={:?} events={} late={}", r.status, r.values, r.window_end, r.events, r.late_events);
        let mut published: std::collections::BTreeSet<WindowId> = Default::default();
        let mut revisions: BTreeMap<WindowId, u32> = BTreeMap::new();
        for (b, (each_b, batched_b)) in each_rows.iter().zip(&batched_rows).enumerate() {
            let mut last: BTreeMap<WindowId, &Row> = BTreeMap::new();
            for row in each_b {
                last.insert((row.key.clone(), row.window_start), row);
            }
            // A session that settled can come back under its start (a new life, from revision 1).
            let mut once: BTreeMap<WindowId, Status> = BTreeMap::new();
            for row in batched_b {
                let id = (row.key.clone(), row.window_start);
                let before = once.insert(id.clone(), row.status);
                prop_assert!(before.is_none_or(|s| session && s != Status::Provisional), "batch {}: {:?} emitted twice", b, id);
                let next = revisions.get(&id).map_or(1, |r| r + 1);
                if !session {
                    prop_assert_eq!(row.revision, next, "batch {}: {:?}", b, id);
                    let theirs = last.get(&id).map(|r| seen(r));
                    prop_assert_eq!(Some(seen(row)), theirs, "batch {}: {:?}", b, id);
                }
                revisions.insert(id.clone(), row.revision);
                published.insert(id);
            }
            if !session {
                for (id, row) in last {
                    if !once.contains_key(&id) {
                        prop_assert!(row.events == 0 && !published.contains(&id), "batch {}: {:?} emitted only per event: {:?}", b, id, row);
                    }
                }
            }
        }
    }

    /// Event intake: no input panics, and every line either counts, is
    /// filtered, or is in the ledger.
    #[test]
    fn any_bytes_are_handled(lines in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..200), 1..20), shape in shape()) {
        let c = contract(&shape, 5_000, 1_000);
        let refs: Vec<&[u8]> = lines.iter().map(Vec::as_slice).collect();
        let mut engine = Engine::new(&c, Mode::Stream, 1).unwrap();
        let mut out = Output::default();
        for (i, line) in refs.iter().enumerate() {
            engine.process(EventIn { partition: 0, offset: i as u64 + 1, bytes: line }, &mut out);
        }
        engine.finish(&mut out);
        let counters = engine.counters();
        prop_assert_eq!(counters.read, lines.len() as u64);
        prop_assert!(counters.counted + counters.filtered + counters.ledger_total() >= counters.read);
    }

    /// Event intake on JSON-shaped text (likelier to reach deep code paths).
    #[test]
    fn any_json_shaped_text_is_handled(lines in prop::collection::vec("[{}\\[\\]\":,0-9a-z.eE+\\- \\\\tkidamoun]{0,120}", 1..20), shape in shape()) {
        let c = contract(&shape, 5_000, 1_000);
        let mut engine = Engine::new(&c, Mode::Stream, 1).unwrap();
        let mut out = Output::default();
        for (i, line) in lines.iter().enumerate() {
            engine.process(EventIn { partition: 0, offset: i as u64 + 1, bytes: line.as_bytes() }, &mut out);
        }
        engine.finish(&mut out);
        prop_assert_eq!(engine.counters().read, lines.len() as u64);
    }
}

#[test]
fn spares_made_ahead_change_nothing() {
    // Ids remembered and corrections kept for an hour: 100,000 events double
    // the id tables past 2^15 slots, where spares are asked for.
    let shape = Shape { window: WINDOWS[0], late: "discard", early: true, dedup: true, corrects: true };
    let c = contract(&shape, 0, 1_000);
    let mut lines: Vec<String> = (0..100_000).map(|i| line(i % 3, i as i64 * 20, i, (i % 1000) as u32, "ok")).collect();
    for i in (9..lines.len()).step_by(10) {
        lines[i] = lines[i - 3].clone();
    }
    let run = |spares: bool| {
        let mut engine = Engine::new(&c, Mode::Stream, 1).unwrap();
        if spares {
            engine.make_spares_ahead();
        }
        let mut out = Output::default();
        for (i, l) in lines.iter().enumerate() {
            engine.process(EventIn { partition: 0, offset: i as u64 + 1, bytes: l.as_bytes() }, &mut out);
            for wanted in engine.take_spares_wanted() {
                engine.give_spare(wanted.make());
            }
        }
        engine.finish(&mut out);
        (out.rows, out.ledger, engine.spares_used())
    };
    let (rows, ledger, used) = run(true);
    let (plain_rows, plain_ledger, plain_used) = run(false);
    assert_eq!((used, plain_used), (4, 0), "the id and correction tables doubled twice each into spares");
    assert!(rows == plain_rows && ledger == plain_ledger, "{} rows, {} ledger entries", rows.len(), ledger.len());
    assert!(ledger.iter().any(|e| e.reason.as_str() == "duplicate"));
}

#[test]
fn snapshots_refuse_another_format_or_contract() {
    let shape = Shape { window: "type = \"global\"", late: "discard", early: false, dedup: false, corrects: false };
    let c = contract(&shape, 0, 0);
    let engine = Engine::new(&c, Mode::Stream, 1).unwrap();
    let mut bytes = engine.snapshot();
    assert!(Engine::restore(&c, &bytes).is_ok());
    let other = contract(&Shape { dedup: true, ..shape }, 0, 0);
    assert!(Engine::restore(&other, &bytes).unwrap_err().to_string().contains("belongs to pipeline"));
    bytes[8] = 99;
    assert!(Engine::restore(&c, &bytes).unwrap_err().to_string().contains("format 99"));
    assert!(Engine::restore(&c, b"garbage").unwrap_err().to_string().contains("not a weir snapshot"));
    let mut cut = engine.snapshot();
    cut.truncate(14);
    assert!(Engine::restore(&c, &cut).unwrap_err().to_string().contains("damaged"));
}

#[test]
fn an_event_is_read_back_only_when_its_id_comes_again_with_other_bytes() {
    let shape = Shape { window: WINDOWS[0], late: "discard", early: false, dedup: true, corrects: false };
    let c = contract(&shape, 1_000, 0);
    let first = line(0, 10, 1, 1250, "ok");
    let conflict = line(0, 10, 1, 1300, "ok");
    let other = line(1, 20, 2, 700, "ok");
    let check = |lines: &[&str], reads: usize, reasons: &[&str]| {
        let (out, _, calls, failure) = run_reading_back(&c, lines, None);
        assert_eq!((calls, failure), (reads, None), "{lines:?}");
        let got: Vec<&str> = out.ledger.iter().map(|l| l.reason.as_str()).collect();
        assert_eq!(got, reasons, "{lines:?}");
    };
    // Seen once each, or again byte for byte: nothing read back.
    check(&[&first, &other], 0, &[]);
    check(&[&first, &other, &first], 0, &["duplicate"]);
    // The same event spelled otherwise: read back once, still a duplicate.
    let respelled = respell(&first);
    assert_ne!(respelled, first);
    check(&[&first, &respelled], 1, &["duplicate"]);
    // Another payload under the same id: read back, a conflict.
    check(&[&first, &other, &conflict], 1, &["duplicate_conflict"]);
}

#[test]
fn an_event_that_cannot_be_read_back_as_it_was_is_a_failure_the_caller_sees() {
    let shape = Shape { window: WINDOWS[0], late: "discard", early: false, dedup: true, corrects: false };
    let c = contract(&shape, 1_000, 0);
    let first = line(0, 10, 1, 1250, "ok");
    let respelled = respell(&first);
    // The input changed under the engine: what is read back is not the event remembered.
    let changed = vec![line(0, 10, 1, 9999, "ok"), respelled.clone()];
    let (_, _, calls, failure) = run_reading_back(&c, &[&first, &respelled], Some(changed));
    assert_eq!(calls, 1);
    let failure = failure.expect("a failure");
    assert!(failure.contains("partition 0 offset 1") && failure.contains("changed"), "{failure}");
    // Gone: the reason is passed on.
    let (_, _, _, failure) = run_reading_back(&c, &[&first, &respelled], Some(Vec::new()));
    assert!(failure.expect("a failure").contains("no event at offset 1"));
    // An engine that has read an event cannot start reading back.
    let mut engine = Engine::new(&c, Mode::Stream, 1).unwrap();
    engine.process(EventIn { partition: 0, offset: 1, bytes: first.as_bytes() }, &mut Output::default());
    let calls = Arc::new(AtomicUsize::new(0));
    assert!(engine.recall_with(Box::new(ReadBack { lines: Vec::new(), calls })).is_err());
}

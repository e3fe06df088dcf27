//! `weir run` and `weir batch`: a JSON-lines file through one contract, as
//! one partition, rows and ledger entries out as JSON lines.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::time::Instant;

use anyhow::{Context, Result};
use weir_contract::Contract;
use weir_engine::{Counters, Engine, EventReader, Mode, Output, ReadEvent, Reason, RowFormat};

use crate::outfile::Sink;
use crate::procstat;
use crate::{load_contract, Failure};

pub struct RunArgs {
    pub contract: PathBuf,
    pub input: PathBuf,
    pub output: Option<PathBuf>,
    pub ledger: Option<PathBuf>,
    pub no_final: bool,
    pub mode: Mode,
    /// 1: one thread does everything. 2 or more: one thread reads and
    /// parses while another counts and writes. The output is the same.
    pub threads: usize,
}

/// How many threads `weir run` uses unless told: two where the machine has
/// two cores or more.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(2))
}

type Input = Box<dyn std::io::BufRead + Send>;

/// Opens an input file or standard input (`-`).
pub fn open_input(path: &Path) -> Result<Input, Failure> {
    if path == Path::new("-") {
        return Ok(Box::new(BufReader::with_capacity(1 << 20, std::io::stdin())));
    }
    let file = File::open(path).map_err(|e| {
        Failure::usage(format!("cannot read input {}: {e}; check the path and its permissions", path.display()))
    })?;
    Ok(Box::new(BufReader::with_capacity(1 << 20, file)))
}

pub fn run(args: RunArgs) -> Result<(), Failure> {
    let contract = load_contract(&args.contract)?;
    let input = open_input(&args.input)?;
    let mut engine = Engine::new(&contract, args.mode, 1).map_err(|e| Failure::contract(e.to_string()))?;
    // `max_future` is measured from when the run starts.
    engine.set_clock(weir_log::now_ms());
    // A file can be read twice: payloads are remembered by their bytes, and
    // an event is read back when its id comes again with other bytes.
    let recall = (args.input != Path::new("-"))
        .then(|| crate::input::FileRecall::open(&args.input, contract.source.max_event_bytes))
        .flatten();
    if let Some(recall) = recall {
        engine.recall_with(Box::new(recall)).map_err(|e| Failure::contract(e.to_string()))?;
    }
    let mut rows = Sink::create(args.output.as_deref()).map_err(Failure::usage_from)?;
    let mut ledger = match &args.ledger {
        Some(path) => Sink::create(Some(path)).map_err(Failure::usage_from)?,
        None => Sink::Discard,
    };
    let started = Instant::now();
    let cpu_before = procstat::cpu_seconds();
    let finish = !args.no_final;
    if args.threads > 1 {
        stream_parallel(&contract, &mut engine, input, &mut rows, &mut ledger, finish).map_err(Failure::run)?;
    } else {
        stream(&contract, &mut engine, input, &mut rows, &mut ledger, finish).map_err(Failure::run)?;
    }
    rows.commit().map_err(Failure::run)?;
    ledger.commit().map_err(Failure::run)?;
    summarise(&contract, &engine, args.mode, started, cpu_before);
    Ok(())
}

fn stream(
    contract: &Contract,
    engine: &mut Engine,
    input: Input,
    rows: &mut Sink,
    ledger: &mut Sink,
    finish: bool,
) -> Result<()> {
    let mut lines = crate::input::Lines::new(input, contract.source.max_event_bytes);
    let mut reader = engine.reader();
    let mut batch = Batch::default();
    let mut out = Output::default();
    let mut written = Written::new(rows, ledger);
    loop {
        let ended = fill(&mut lines, &mut reader, &mut batch, SMALL_BATCH_EVENTS).context("cannot read the input")?;
        count(engine, &batch, &mut out, &mut written)?;
        if ended {
            break;
        }
    }
    if finish {
        engine.finish(&mut out);
    }
    written.drain(engine.format(), &mut out)?;
    written.finish()
}

/// Lines handed from the reading thread to the engine's: their text, and
/// what the contract's [`EventReader`] made of each (steps 1 and 2).
#[derive(Default)]
struct Batch {
    text: String,
    lines: Vec<BatchLine>,
    reads: Vec<ReadEvent>,
}

struct BatchLine {
    start: usize,
    end: usize,
    number: u64,
    /// The line's length in bytes as read (before any replacement character).
    bytes: usize,
    utf8_ok: bool,
}

/// A batch ends at this many events or bytes, whichever comes first.
const BATCH_EVENTS: usize = 4096;
const BATCH_BYTES: usize = 1 << 20;
/// On one thread, a batch is only there to see the events ahead: small
/// enough that what the parse wrote is still in the cache when it is counted.
const SMALL_BATCH_EVENTS: usize = 64;
/// How many events ahead of the one counted their table slots are asked for
/// ([`Engine::prefetch`]).
const PREFETCH_AHEAD: usize = 4;
/// Batches read ahead of the engine.
const BATCHES_AHEAD: usize = 4;

/// [`stream`] on two threads: this one counts and writes, another reads the
/// input and parses each line. The engine sees the same events in the same
/// order, so rows and ledger are the same as [`stream`]'s.
fn stream_parallel(
    contract: &Contract,
    engine: &mut Engine,
    input: Input,
    rows: &mut Sink,
    ledger: &mut Sink,
    finish: bool,
) -> Result<()> {
    let (full_tx, full_rx) = mpsc::sync_channel::<Result<Batch>>(BATCHES_AHEAD);
    let (empty_tx, empty_rx) = mpsc::channel::<Batch>();
    let reader = engine.reader();
    let limit = contract.source.max_event_bytes;
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("weir-read".into())
            .spawn_scoped(scope, move || read_batches(input, limit, reader, full_tx, empty_rx))
            .context("cannot start the reading thread")?;
        let mut out = Output::default();
        let mut written = Written::new(rows, ledger);
        for batch in full_rx {
            let batch = batch?;
            count(engine, &batch, &mut out, &mut written)?;
            // The reader may have stopped; then the batch is dropped here.
            let _ = empty_tx.send(batch);
        }
        if finish {
            engine.finish(&mut out);
        }
        written.drain(engine.format(), &mut out)?;
        written.finish()
    })
}

/// The reading thread of [`stream_parallel`]: fills batches (reusing those
/// sent back) and parses their lines, until the input ends, it cannot be
/// read (the error is sent on), or the engine's thread stops taking them.
fn read_batches(
    input: Input,
    limit: usize,
    mut reader: EventReader,
    full: SyncSender<Result<Batch>>,
    empty: Receiver<Batch>,
) {
    let mut lines = crate::input::Lines::new(input, limit);
    loop {
        let mut batch = empty.try_recv().unwrap_or_default();
        let ended = match fill(&mut lines, &mut reader, &mut batch, BATCH_EVENTS) {
            Ok(ended) => ended,
            Err(e) => {
                let _ = full.send(Err(anyhow::Error::new(e).context("cannot read the input")));
                return;
            }
        };
        if !batch.lines.is_empty() && full.send(Ok(batch)).is_err() {
            return;
        }
        if ended {
            return;
        }
    }
}

/// Fills `batch` with the next lines (at most `events`, or [`BATCH_BYTES`])
/// and reads each with `reader` (steps 1 and 2, and the fields); true when
/// the input has ended.
fn fill<R: std::io::BufRead>(
    lines: &mut crate::input::Lines<R>,
    reader: &mut EventReader,
    batch: &mut Batch,
    events: usize,
) -> std::io::Result<bool> {
    batch.lines.clear();
    // The lines' bytes go in one buffer, checked as UTF-8 at once (a call a
    // line cost more than the check); only a batch with a line that is not
    // UTF-8 is checked again line by line, that line's text with
    // replacement characters.
    let mut bytes = std::mem::take(&mut batch.text).into_bytes();
    bytes.clear();
    let mut ended = false;
    while batch.lines.len() < events && bytes.len() < BATCH_BYTES {
        let Some(line) = lines.next_line()? else {
            ended = true;
            break;
        };
        let start = bytes.len();
        bytes.extend_from_slice(line.bytes);
        let end = bytes.len();
        batch.lines.push(BatchLine { start, end, number: line.number, bytes: line.bytes.len(), utf8_ok: true });
    }
    batch.text = String::from_utf8(bytes).unwrap_or_else(|not_utf8| {
        let bytes = not_utf8.into_bytes();
        let mut text = String::with_capacity(bytes.len());
        for line in &mut batch.lines {
            let raw = &bytes[line.start..line.end];
            line.start = text.len();
            match std::str::from_utf8(raw) {
                Ok(ok) => text.push_str(ok),
                Err(_) => {
                    text.push_str(&String::from_utf8_lossy(raw));
                    line.utf8_ok = false;
                }
            }
            line.end = text.len();
        }
        text
    });
    if batch.reads.len() < batch.lines.len() {
        batch.reads.resize_with(batch.lines.len(), ReadEvent::default);
    }
    for (line, read) in batch.lines.iter().zip(&mut batch.reads) {
        reader.read(&batch.text[line.start..line.end], line.bytes, line.utf8_ok, read);
    }
    Ok(ended)
}

/// Counts a batch's events in order, asking for the table slots of the
/// events [`PREFETCH_AHEAD`] ahead, and writes what they give.
fn count(engine: &mut Engine, batch: &Batch, out: &mut Output, written: &mut Written<'_>) -> Result<()> {
    let reads = &batch.reads[..batch.lines.len()];
    for read in reads.iter().take(PREFETCH_AHEAD) {
        engine.prefetch(read);
    }
    for (i, (line, read)) in batch.lines.iter().zip(reads).enumerate() {
        if let Some(ahead) = reads.get(i + PREFETCH_AHEAD) {
            engine.prefetch(ahead);
        }
        engine.process_read(0, line.number, &batch.text[line.start..line.end], read, out);
        if !out.rows.is_empty() || !out.ledger.is_empty() {
            written.drain(engine.format(), out)?;
        }
    }
    if let Some(why) = engine.recall_failure() {
        anyhow::bail!("cannot tell a repeated event id's versions apart: {why}; run over a file that does not change while it is read");
    }
    Ok(())
}

/// Where a run's output goes: rows gathered and written 64 KiB at a time,
/// ledger entries (unless discarded) as they come.
struct Written<'a> {
    text: String,
    rows: &'a mut Sink,
    ledger: &'a mut Sink,
}

impl<'a> Written<'a> {
    fn new(rows: &'a mut Sink, ledger: &'a mut Sink) -> Written<'a> {
        Written { text: String::with_capacity(1 << 16), rows, ledger }
    }

    /// Writes (or gathers) what `out` holds and empties it.
    fn drain(&mut self, format: &RowFormat, out: &mut Output) -> Result<()> {
        for row in out.rows.drain(..) {
            format.write_row(&row, &mut self.text);
            // A close of thousands of windows goes out 64 KiB at a time,
            // not gathered into megabytes that grow by copying.
            if self.text.len() >= 1 << 16 {
                self.rows.write(&self.text)?;
                self.text.clear();
            }
        }
        if !matches!(self.ledger, Sink::Discard) && !out.ledger.is_empty() {
            let mut ledger_text = String::new();
            for entry in &out.ledger {
                format.write_ledger(entry, &mut ledger_text);
            }
            self.ledger.write(&ledger_text)?;
        }
        out.ledger.clear();
        Ok(())
    }

    /// Writes the rows gathered last.
    fn finish(self) -> Result<()> {
        self.rows.write(&self.text)
    }
}

fn summarise(contract: &Contract, engine: &Engine, mode: Mode, started: Instant, cpu_before: Option<f64>) {
    let c: &Counters = engine.counters();
    let elapsed = started.elapsed().as_secs_f64();
    let name = if mode == Mode::Batch { "batch" } else { "run" };
    let mut s = format!("weir {name}: {} v{}\n", contract.pipeline.name, contract.pipeline.version);
    s.push_str(&format!("  events read      {}\n", c.read));
    s.push_str(&format!("  counted          {}\n", c.counted));
    s.push_str(&format!("  filtered         {}\n", c.filtered));
    s.push_str(&format!("  late, allowed    {}\n", c.late_allowed));
    let reasons: Vec<String> = Reason::ALL
        .iter()
        .filter(|r| c.ledger[r.index()] > 0)
        .map(|r| format!("{} {}", r.as_str(), c.ledger[r.index()]))
        .collect();
    s.push_str(&format!(
        "  ledger           {}{}\n",
        c.ledger_total(),
        if reasons.is_empty() { String::new() } else { format!(" ({})", reasons.join(", ")) }
    ));
    s.push_str(&format!(
        "  rows             {} (provisional {}, settled {}, retracted {})\n",
        c.rows_total(),
        c.rows_provisional,
        c.rows_settled,
        c.rows_retracted
    ));
    s.push_str(&format!("  open windows     {}\n", engine.open_windows()));
    let (ids, bytes) = (engine.remembered_ids(), engine.id_bytes());
    if let Some(per_id) = bytes.checked_div(ids) {
        s.push_str(&format!(
            "  remembered ids   {ids} ({:.1} MiB, {per_id} bytes an id)\n",
            bytes as f64 / (1 << 20) as f64
        ));
    }
    let rate = if elapsed > 0.0 { c.read as f64 / elapsed } else { 0.0 };
    s.push_str(&format!("  wall time        {elapsed:.3} s, {} events/s\n", human(rate)));
    if let (Some(now), Some(before)) = (procstat::cpu_seconds(), cpu_before) {
        let cpu = now - before;
        let per_cpu = if cpu > 0.0 { c.read as f64 / cpu } else { 0.0 };
        s.push_str(&format!("  cpu time         {cpu:.2} s user+system, {} events per CPU-second\n", human(per_cpu)));
        s.push_str(&format!("  process cpu      {now:.2} s user+system since start\n"));
    }
    if let Some(rss) = procstat::peak_rss_bytes() {
        s.push_str(&format!("  peak memory      {:.1} MiB\n", rss as f64 / (1 << 20) as f64));
    }
    eprint!("{s}");
}

fn human(rate: f64) -> String {
    if rate >= 1e6 {
        format!("{:.2}M", rate / 1e6)
    } else if rate >= 1e3 {
        format!("{:.1}k", rate / 1e3)
    } else {
        format!("{rate:.0}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line of a batch: its text, whether it was UTF-8, its length as read.
    type Seen<'a> = (&'a str, bool, usize);

    #[test]
    fn a_batch_with_a_line_that_is_not_utf8_keeps_every_line_in_place() {
        let text = include_str!("../../../bench/paid_revenue.toml");
        let contract = Contract::parse("paid_revenue.toml", text).expect("the benchmark contract");
        let engine = Engine::new(&contract, Mode::Stream, 1).unwrap();
        let mut reader = engine.reader();
        let (a, e) = (("{\"a\":1}", true, 7), ("{\"b\":\"\u{e9}\"}", true, 10));
        let cases: [(&[u8], Vec<Seen<'_>>); 2] = [
            (
                b"{\"a\":1}\n\xff\xfe x\n{\"b\":\"\xc3\xa9\"}\n\n",
                vec![a, ("\u{fffd}\u{fffd} x", false, 4), e, ("", true, 0)],
            ),
            (b"{\"a\":1}\n{\"b\":\"\xc3\xa9\"}\n\n", vec![a, e, ("", true, 0)]),
        ];
        for (input, want) in cases {
            let mut lines = crate::input::Lines::new(input, 1000);
            let mut batch = Batch::default();
            // A batch reused: what the one before held does not stay.
            batch.text.push_str("left over");
            assert!(fill(&mut lines, &mut reader, &mut batch, 64).unwrap());
            let got: Vec<Seen<'_>> =
                batch.lines.iter().map(|l| (&batch.text[l.start..l.end], l.utf8_ok, l.bytes)).collect();
            assert_eq!(got, want);
        }
    }
}

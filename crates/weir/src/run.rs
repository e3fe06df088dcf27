//! `weir run` and `weir batch`: a JSON-lines file through one contract, as
//! one partition, rows and ledger entries out as JSON lines.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use weir_contract::Contract;
use weir_engine::{Counters, Engine, EventIn, Mode, Output, Reason};

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
}

/// Opens an input file or standard input (`-`).
pub fn open_input(path: &Path) -> Result<Box<dyn std::io::BufRead>, Failure> {
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
    let mut rows = Sink::create(args.output.as_deref()).map_err(Failure::usage_from)?;
    let mut ledger = match &args.ledger {
        Some(path) => Sink::create(Some(path)).map_err(Failure::usage_from)?,
        None => Sink::Discard,
    };
    let started = Instant::now();
    let cpu_before = procstat::cpu_seconds();
    stream(&contract, &mut engine, input, &mut rows, &mut ledger, !args.no_final).map_err(Failure::run)?;
    rows.commit().map_err(Failure::run)?;
    ledger.commit().map_err(Failure::run)?;
    summarise(&contract, &engine, args.mode, started, cpu_before);
    Ok(())
}

fn stream(
    contract: &Contract,
    engine: &mut Engine,
    input: Box<dyn std::io::BufRead>,
    rows: &mut Sink,
    ledger: &mut Sink,
    finish: bool,
) -> Result<()> {
    let mut lines = crate::input::Lines::new(input, contract.source.max_event_bytes);
    let mut out = Output::default();
    let mut text = String::with_capacity(1 << 16);
    let write_ledger = !matches!(ledger, Sink::Discard);
    loop {
        let line = lines.next_line().context("cannot read the input")?;
        let Some(line) = line else { break };
        engine.process(EventIn { partition: 0, offset: line.number, bytes: line.bytes }, &mut out);
        if !out.rows.is_empty() || !out.ledger.is_empty() {
            drain(engine, &mut out, &mut text, rows, ledger, write_ledger)?;
        }
    }
    if finish {
        engine.finish(&mut out);
    }
    drain(engine, &mut out, &mut text, rows, ledger, write_ledger)?;
    rows.write(&text)?;
    Ok(())
}

fn drain(
    engine: &Engine,
    out: &mut Output,
    text: &mut String,
    rows: &mut Sink,
    ledger: &mut Sink,
    write_ledger: bool,
) -> Result<()> {
    let format = engine.format();
    for row in out.rows.drain(..) {
        format.write_row(&row, text);
    }
    if write_ledger && !out.ledger.is_empty() {
        let mut ledger_text = String::new();
        for entry in &out.ledger {
            format.write_ledger(entry, &mut ledger_text);
        }
        ledger.write(&ledger_text)?;
    }
    out.ledger.clear();
    if text.len() >= 1 << 16 {
        rows.write(text)?;
        text.clear();
    }
    Ok(())
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

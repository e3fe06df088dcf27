//! Event intake: any bytes as events of a contract that reads nested
//! fields, rules, dedup, sessions and sums under tight `[limits]`, and of
//! one that takes corrections over hopping windows with times in a
//! pattern and a zone (its state snapshotted and restored halfway); then
//! the watermark to the end.
//! Nothing may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weir_contract::Contract;
use weir_engine::{Engine, EventIn, Mode, Output};

const CONTRACT: &str = r#"
[pipeline]
name = "fuzz"
version = 1
owner = "o"
steward = "s"
decision = "d"

[source]
topic = "t"
event_time = "at"
key = ["acct.id", "region"]
event_id = "id"
where = 'status == "ok" && amount > 0'
max_delay = "5s"

[window]
type = "session"
gap = "30s"
allowed_lateness = "1m"
late = "revise"
early = true

[dedup]
horizon = "10m"

[[aggregate]]
name = "total"
fn = "sum"
field = "amount"

[[aggregate]]
name = "last_plan"
fn = "last"
field = "plan"

[[aggregate]]
name = "n"
fn = "count"

[limits]
max_depth = 4
max_fields = 40
max_key_bytes = 24
max_keys = 8
max_open_windows = 12
"#;

const CORRECTIONS: &str = r#"
[pipeline]
name = "fuzz_corrections"
version = 1
owner = "o"
steward = "s"
decision = "d"

[source]
topic = "t"
event_time = "at"
event_time_format = "%Y-%m-%d %H:%M:%S%.3f"
event_time_zone = "Europe/Berlin"
key = ["acct"]
event_id = "id"
where = '!has(status) || status != "void"'
max_delay = "2s"

[window]
type = "hopping"
size = "10s"
slide = "5s"
allowed_lateness = "5s"
late = "revise"

[dedup]
horizon = "1m"
on_conflict = "correct"

[[aggregate]]
name = "total"
fn = "sum"
field = "amount"

[[aggregate]]
name = "mean"
fn = "avg"
field = "amount"

[[aggregate]]
name = "n"
fn = "count"
where = 'has(amount)'

[limits]
max_open_windows = 16
"#;

fuzz_target!(|data: &[u8]| {
    let contract = Contract::parse("fuzz.toml", CORRECTIONS).expect("the corrections contract is valid");
    let mut engine = Engine::new(&contract, Mode::Stream, 1).expect("the corrections contract compiles");
    let mut out = Output::default();
    let lines: Vec<&[u8]> = data.split(|&b| b == b'\n').collect();
    for (offset, line) in lines.iter().enumerate() {
        if offset == lines.len() / 2 {
            engine = Engine::restore(&contract, &engine.snapshot()).expect("a snapshot restores");
        }
        engine.process(EventIn { partition: 0, offset: offset as u64, bytes: line }, &mut out);
    }
    engine.finish(&mut out);

    // Fixed contracts: refusing one would be a bug in this target, so it panics.
    let contract = Contract::parse("fuzz.toml", CONTRACT).expect("the fuzz contract is valid");
    let mut engine = Engine::new(&contract, Mode::Stream, 2).expect("the fuzz contract compiles");
    let mut out = Output::default();
    for (offset, line) in data.split(|&b| b == b'\n').enumerate() {
        let partition = (offset % 2) as u32;
        engine.process(EventIn { partition, offset: offset as u64, bytes: line }, &mut out);
    }
    engine.finish(&mut out);
});

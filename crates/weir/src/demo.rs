//! `weir demo`: weir's main job end to end on the embedded default, with
//! nothing else installed. It writes a payments contract and a realistic
//! generated stream (late, very late, duplicate, conflicting and malformed
//! events included) to a folder, streams it, runs the same contract as a
//! batch, and reconciles the two.

use std::path::{Path, PathBuf};

use crate::gen::{self, PaymentsArgs, Profile};
use crate::run::{self, RunArgs};
use crate::{reconcile, Failure};
use weir_engine::Mode;

pub const DEMO_CONTRACT: &str = r#"# Payments approved per account per minute: the number that unlocks paid features.
[pipeline]
name = "paid_revenue"
version = 1
owner = "billing-ops"
steward = "data-platform"
decision = "Unlock paid features within seconds of payment approval"

[source]
topic = "payments"
event_time = "approved_at"
key = ["account_id"]
event_id = "payment_id"
where = 'status == "approved"'
max_delay = "30s"

[window]
type = "tumbling"
size = "1m"
allowed_lateness = "2m"
late = "revise"

[dedup]
horizon = "10m"

[[aggregate]]
name = "revenue"
fn = "sum"
field = "amount"

[[aggregate]]
name = "payments"
fn = "count"

[[aggregate]]
name = "largest"
fn = "max"
field = "amount"
"#;

pub fn demo(events: u64, dir: Option<&Path>) -> Result<(), Failure> {
    let dir: PathBuf = match dir {
        Some(d) => d.to_owned(),
        None => std::env::temp_dir().join(format!("weir-demo-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir).map_err(|e| {
        Failure::usage(format!("cannot create {}: {e}; pass --dir with a writable folder", dir.display()))
    })?;
    let contract = dir.join("paid_revenue.toml");
    std::fs::write(&contract, DEMO_CONTRACT)
        .map_err(|e| Failure::usage(format!("cannot write {}: {e}", contract.display())))?;
    let input = dir.join("payments.jsonl");
    let (rows, ledger, batch) = (dir.join("rows.jsonl"), dir.join("ledger.jsonl"), dir.join("batch.jsonl"));
    eprintln!(
        "weir demo: {} payments for 2,000 accounts, with late, very late, duplicate, conflicting and malformed events",
        events
    );
    gen::payments(
        PaymentsArgs { events, seed: 2026, accounts: 2_000, rate: 200, profile: Profile::Realistic, corrections: None },
        Some(&input),
    )?;
    eprintln!("\n1. stream: rows as they would be published, provisional then settled\n");
    run::run(RunArgs {
        contract: contract.clone(),
        input: input.clone(),
        output: Some(rows.clone()),
        ledger: Some(ledger.clone()),
        no_final: false,
        mode: Mode::Stream,
        threads: run::default_threads(),
    })?;
    eprintln!("\n2. batch: the same contract over the same events, whatever their arrival order\n");
    run::run(RunArgs {
        contract,
        input,
        output: Some(batch.clone()),
        ledger: None,
        no_final: false,
        mode: Mode::Batch,
        threads: run::default_threads(),
    })?;
    eprintln!("\n3. reconcile: the stream's last row of every window against the batch\n");
    let outcome = reconcile::reconcile_summary(&rows, &batch)?;
    eprintln!("{outcome}");
    eprintln!("\nfiles in {}:", dir.display());
    for (name, what) in [
        ("paid_revenue.toml", "the contract"),
        ("payments.jsonl", "the input"),
        ("rows.jsonl", "every row the stream emitted"),
        ("ledger.jsonl", "every event that did not count, with its reason"),
        ("batch.jsonl", "the batch's settled rows"),
    ] {
        eprintln!("  {name:<18} {what}");
    }
    eprintln!("\nthe differences are very late events: too late for the stream (see ledger.jsonl, reason too_late), counted by the batch.");
    Ok(())
}

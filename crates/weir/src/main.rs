//! The `weir` command line (SPEC.md section 6). Exit status: 0 success,
//! 1 a failed comparison or run, 2 bad arguments or a contract that cannot run.
//!
//! In more detail: the command line: `run`, `batch`, `reconcile` (two files, or
//! `PIPELINE --against FILE` on a server), `backfill`, `check`, `gen payments`,
//! `serve`, `demo` (`live.rs`: the server with three billing contracts and a
//! producer, with a token of each role made first, ending with a late payment
//! and a reconciliation against the payments system's export it writes, a
//! refund planted; `demo.rs`: the files walk-through), `produce`, `results`
//! (`client.rs`, ureq; the token from `WEIR_TOKEN`), `token create|revoke|list`
//! and `audit verify` (`access.rs`, on the data folder directly: the first
//! admin token needs no server; list and verify open the database read-only),
//! `bench` (`bench.rs`: ingest, latency, recovery); `run` and `batch` on two
//! threads by default on a machine with two cores (`--threads`; `run.rs`: a
//! reading thread fills batches of up to 4,096 lines or 1 MiB as text and
//! parses each with the contract's `EventReader`, at most 4 batches ahead,
//! while the calling thread feeds them to the engine in order and writes;
//! batches go back to the reader to be reused; the output is the same as one
//! thread's); line reading that hands out lines from the read buffer without
//! copying and measures over-long lines without holding them; output files
//! written under a temporary name and renamed when complete (a device or named
//! pipe, such as `/dev/null`, is written directly); mimalloc as the allocator
//! (`allocator.rs`, the binary's one module allowed `unsafe`: freed memory goes
//! back to the system after 10 ms instead of mimalloc 3's second, which kept
//! the 5M payments' peak over 250 MiB).

mod access;
mod accounts;
mod allocator;
mod bench;
mod client;
mod demo;
mod gen;
mod input;
mod live;
mod outfile;
mod procstat;
mod reconcile;
mod review;
mod run;
mod serve;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use weir_contract::Contract;
use weir_engine::Mode;

#[derive(Parser)]
#[command(name = "weir", version, about = "A stream processor for decisions that cannot wait for the nightly batch")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum Format {
    Table,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Stream a JSON-lines file through a contract, in line order, as one partition.
    Run {
        contract: PathBuf,
        #[arg(long)]
        input: PathBuf,
        /// Rows as JSON lines (default: standard output).
        #[arg(long)]
        output: Option<PathBuf>,
        /// Ledger entries as JSON lines.
        #[arg(long)]
        ledger: Option<PathBuf>,
        /// Do not force the watermark to +infinity at the end of the input.
        #[arg(long)]
        no_final: bool,
        /// 1: one thread; 2: one reads and parses while the other counts
        /// (the same output). Default: 2 on a machine with two cores or more.
        #[arg(long)]
        threads: Option<usize>,
    },
    /// Run a contract as a batch: every valid, first-seen, included event counts; one settled row per key and window.
    Batch {
        contract: PathBuf,
        #[arg(long)]
        input: PathBuf,
        #[arg(long)]
        output: Option<PathBuf>,
        #[arg(long)]
        ledger: Option<PathBuf>,
        /// As for `weir run`.
        #[arg(long)]
        threads: Option<usize>,
    },
    /// Compare a pipeline's published rows with a system of record's export
    /// (`weir reconcile PIPELINE --against FILE --map ...`, on a server), or
    /// the last row of every key and window of a stream output with batch
    /// rows (`--stream FILE --batch FILE`). Exit 1 when they disagree beyond
    /// what the ledger explains and the tolerance allows.
    Reconcile {
        /// The pipeline to reconcile (with --against).
        pipeline: Option<String>,
        /// A CSV (header line of column names) or JSON-lines export of the system of record.
        #[arg(long)]
        against: Option<PathBuf>,
        /// Which columns are what: key.FIELD=column,...,window_start=column (a time, or a date for daily windows),AGGREGATE=column,...
        #[arg(long)]
        map: Option<String>,
        /// How far apart amounts may be: an amount (0.01) or a percentage (1%).
        #[arg(long, default_value = "0")]
        tolerance: String,
        #[arg(long)]
        why: Option<String>,
        /// The version to reconcile (default: the live one).
        #[arg(long)]
        version: Option<u32>,
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        url: String,
        #[arg(long)]
        stream: Option<PathBuf>,
        #[arg(long)]
        batch: Option<PathBuf>,
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// See weir work: a server with three billing contracts and a producer posting a realistic stream to it.
    Demo {
        /// Folder for the log, the results database and the contracts (default: a new temporary folder).
        #[arg(long)]
        data: Option<PathBuf>,
        /// Events posted per second.
        #[arg(long, default_value_t = 2_000)]
        rate: u64,
        /// Stop by itself after this long (e.g. 30s, 5m); default: until Ctrl-C.
        #[arg(long)]
        duration: Option<String>,
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: String,
        /// Instead: the files walk-through (generate, run, batch, reconcile), no server.
        #[arg(long)]
        files: bool,
        /// With --files: events to generate.
        #[arg(long, default_value_t = 200_000)]
        events: u64,
        /// Run the pipelines on these Kafka brokers (needs --postgres).
        #[arg(long, requires = "postgres")]
        kafka: Option<String>,
        /// Publish results and checkpoints to this PostgreSQL (e.g. "host=127.0.0.1 user=postgres dbname=test"; needs --kafka).
        #[arg(long, requires = "kafka")]
        postgres: Option<String>,
    },
    /// Validate a contract and print a short summary of it.
    Check { contract: PathBuf },
    /// Post a JSON-lines file (or - for standard input) to a running server, in batches, retrying what was not acknowledged.
    Produce {
        #[arg(long)]
        topic: String,
        file: PathBuf,
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        url: String,
        /// Events per POST.
        #[arg(long, default_value_t = 1000)]
        batch: usize,
        /// Give up on a batch the server has not acknowledged for this many seconds.
        #[arg(long, default_value_t = 60)]
        retry_for: u64,
        /// Produce straight to these Kafka brokers instead of a weir server.
        #[arg(long)]
        kafka: Option<String>,
        /// With --kafka: the top-level field whose value is the record key (the contract's key, so a key's events share a partition).
        #[arg(long)]
        key: Option<String>,
    },
    /// A one-screen health summary of every pipeline (or one) of a running server.
    Status {
        pipeline: Option<String>,
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        url: String,
    },
    /// Stop publishing a pipeline's rows (processing goes on; nothing is lost); recorded in the audit log.
    Pause {
        pipeline: String,
        /// On whose behalf, when not the token's holder (the token says who acts).
        #[arg(long)]
        who: Option<String>,
        #[arg(long)]
        why: String,
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        url: String,
    },
    /// Publish everything held since the pause, and go on publishing; with
    /// --destination, start a destination its receiver stopped again, from
    /// the refused batch. Recorded in the audit log.
    Resume {
        pipeline: String,
        /// A destination stopped by its receiver's refusal (its name in the contract).
        #[arg(long)]
        destination: Option<String>,
        /// On whose behalf, when not the token's holder (the token says who acts).
        #[arg(long)]
        who: Option<String>,
        #[arg(long)]
        why: String,
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        url: String,
    },
    /// Make a version of a pipeline live (a candidate, or a superseded one): readers' default switches to it; audited.
    Promote {
        pipeline: String,
        version: u32,
        /// On whose behalf, when not the token's holder (the token says who acts).
        #[arg(long)]
        who: Option<String>,
        #[arg(long)]
        why: String,
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        url: String,
    },
    /// Make the version the live one replaced live again; audited.
    Rollback {
        pipeline: String,
        /// On whose behalf, when not the token's holder (the token says who acts).
        #[arg(long)]
        who: Option<String>,
        #[arg(long)]
        why: String,
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        url: String,
    },
    /// Compare two versions of a pipeline on the windows both cover: matched, differing, missing, totals.
    Diff {
        pipeline: String,
        a: u32,
        b: u32,
        /// `text` (readable) or `json` (for scripts).
        #[arg(long, default_value = "text")]
        format: String,
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        url: String,
    },
    /// Recompute the windows starting in [from, to) with batch semantics over
    /// the retained input and publish a `corrected` row for each that differs
    /// from its last published row (SPEC.md 9); audited. Waits for the run
    /// and prints its report.
    Backfill {
        pipeline: String,
        /// RFC 3339, e.g. 2026-11-29T00:00:00Z
        #[arg(long)]
        from: String,
        /// RFC 3339, after `from`
        #[arg(long)]
        to: String,
        #[arg(long)]
        why: String,
        /// On whose behalf, when not the token's holder (the token says who acts).
        #[arg(long)]
        who: Option<String>,
        /// The version to backfill (default: the live one).
        #[arg(long)]
        version: Option<u32>,
        /// `text` (readable) or `json` (for scripts).
        #[arg(long, default_value = "text")]
        format: String,
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        url: String,
    },
    /// Note something about an event-time range of a pipeline; rows of windows in the range carry the note's id.
    Annotate {
        pipeline: String,
        /// RFC 3339, e.g. 2026-11-29T14:00:00Z
        #[arg(long)]
        from: String,
        #[arg(long)]
        to: String,
        #[arg(long)]
        note: String,
        /// On whose behalf, when not the token's holder (the token says who acts).
        #[arg(long)]
        who: Option<String>,
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        url: String,
    },
    /// Rebuild a pipeline's state from the log and republish its rows with higher revisions; recorded in the audit log.
    Replay {
        pipeline: String,
        /// On whose behalf, when not the token's holder (the token says who acts).
        #[arg(long)]
        who: Option<String>,
        #[arg(long)]
        why: String,
        /// Start every partition at this offset (default: the first record kept).
        #[arg(long)]
        from_offset: Option<u64>,
        /// Republish only the rows of windows ending after this event time (RFC 3339); the state is rebuilt whole.
        #[arg(long)]
        from_time: Option<String>,
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        url: String,
    },
    /// Print a pipeline's current rows from a running server.
    Results {
        pipeline: String,
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        url: String,
        /// Only rows with this status (provisional, settled, retracted).
        #[arg(long)]
        status: Option<String>,
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Print a pipeline's changes as they are published (server-sent events;
    /// after a dropped connection it goes on from the last change printed).
    Tail {
        pipeline: String,
        /// The first change to print (its seq); default: the next one published.
        #[arg(long)]
        since: Option<i64>,
        /// Only this version's rows (and the promotes and rollbacks).
        #[arg(long)]
        version: Option<u32>,
        /// Stop after this many changes.
        #[arg(long)]
        limit: Option<u64>,
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        url: String,
    },
    /// Run every contract in a folder continuously over the embedded log, with the HTTP API.
    Serve {
        /// Folder for the log and the results database (created if missing).
        #[arg(long)]
        data: PathBuf,
        /// Folder of contracts (*.toml).
        #[arg(long)]
        contracts: PathBuf,
        /// weir.toml: topics, partitions, retention, timeouts.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Address to listen on (default: weir.toml's `listen`, else 127.0.0.1:8080; port 0 picks a free one).
        #[arg(long)]
        listen: Option<String>,
        /// Serve HTTPS with this PEM certificate chain (needs --tls-key).
        #[arg(long, requires = "tls_key")]
        tls_cert: Option<PathBuf>,
        /// The PEM private key of --tls-cert.
        #[arg(long, requires = "tls_cert")]
        tls_key: Option<PathBuf>,
    },
    /// The server's benchmarks; each starts its own weir serve on a temporary folder.
    Bench {
        #[command(subcommand)]
        what: BenchWhat,
    },
    /// Generate a realistic event stream as JSON lines.
    Gen {
        #[command(subcommand)]
        what: GenWhat,
    },
    /// Make, revoke and list the bearer tokens of a server's data folder (run on the server's machine).
    Token {
        #[command(subcommand)]
        what: TokenWhat,
    },
    /// Suggest allowed_lateness for too-late rates of 1%, 0.1% and 0.01%, from how late events have arrived, with the cost of each.
    Advise {
        pipeline: String,
        /// text (the default) or json
        #[arg(long, default_value = "text")]
        format: String,
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        url: String,
    },
    /// The review of a running server's pipelines over a period: exceptions by cause with their materiality, incidents with their times to mitigation and resolution, lateness advice, versions promoted.
    Review {
        /// How far back: 30d, 7d, 12h.
        #[arg(long, default_value = "30d")]
        since: String,
        /// md (the default), html (one self-contained file with charts) or json
        #[arg(long, default_value = "md")]
        format: String,
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        url: String,
    },
    /// Rehearse a failure on a shadow copy of a running server's pipeline (operator; audited): delayed-partition, duplicates, late-burst, clock-skew, restart or destination-down. Prints what the operator would have seen; exits 1 when the expected alert did not fire.
    Drill {
        scenario: String,
        #[arg(long)]
        pipeline: String,
        /// Why the drill runs (kept in the audit log).
        #[arg(long, default_value = "a failure drill")]
        why: String,
        /// How long the fault lasts: the silence, the time down, the receiver's outage, or the wait for an alert (default: the scenario's).
        #[arg(long = "for")]
        fault: Option<String>,
        /// How long to wait for recovery after the fault (default 60s).
        #[arg(long)]
        recover: Option<String>,
        /// text (the default) or json
        #[arg(long, default_value = "text")]
        format: String,
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        url: String,
    },
    /// Incidents of a running server's pipeline: open, note, mitigate, resolve (each audited), list and show.
    Incident {
        #[command(subcommand)]
        what: IncidentWhat,
    },
    /// Check the audit log's hash chain (an HMAC with the key of weir.toml `audit_key_file`).
    Audit {
        #[command(subcommand)]
        what: AuditWhat,
    },
}

#[derive(Subcommand)]
enum IncidentWhat {
    /// Open an incident; prints its id.
    Open {
        pipeline: String,
        #[arg(long)]
        title: String,
        /// Who owns it (default: the contract's owner).
        #[arg(long)]
        owner: Option<String>,
        #[arg(long)]
        why: Option<String>,
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        url: String,
    },
    /// Add a note to an incident's timeline.
    Note {
        pipeline: String,
        id: i64,
        #[arg(long)]
        note: String,
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        url: String,
    },
    /// Mark an incident mitigated: the harm has stopped, the proof it is over is to come.
    Mitigate {
        pipeline: String,
        id: i64,
        #[arg(long)]
        why: String,
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        url: String,
    },
    /// Resolve an incident with the proof that closed it (for example a reconciliation within tolerance).
    Resolve {
        pipeline: String,
        id: i64,
        #[arg(long)]
        proof: String,
        #[arg(long)]
        why: String,
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        url: String,
    },
    /// The newest incidents, or one with its timeline.
    Show {
        pipeline: String,
        id: Option<i64>,
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        url: String,
    },
}

#[derive(Subcommand)]
enum TokenWhat {
    /// Make a token and print it (once; only its hash is kept). Commands against a server read it from WEIR_TOKEN.
    Create {
        /// The server's data folder (`weir serve --data`).
        #[arg(long)]
        data: PathBuf,
        /// producer, reader, raw-reader, operator or admin.
        #[arg(long)]
        role: String,
        /// Whom it is for (kept in the audit log with everything the token does).
        #[arg(long)]
        name: String,
        /// A topic a producer or raw-reader may use (repeat it; * for every topic).
        #[arg(long = "topic")]
        topics: Vec<String>,
        /// A pipeline a reader or operator may use (repeat it; * for every pipeline).
        #[arg(long = "pipeline")]
        pipelines: Vec<String>,
        /// It stops working after this long (e.g. 30d, 12h); default: until revoked.
        #[arg(long)]
        expires: Option<String>,
        #[arg(long, default_value = "")]
        why: String,
    },
    /// Revoke a token by its id: requests with it are refused from the next one on.
    Revoke {
        id: String,
        #[arg(long)]
        data: PathBuf,
        #[arg(long, default_value = "")]
        why: String,
    },
    /// Every token made, as JSON lines (no secrets).
    List {
        #[arg(long)]
        data: PathBuf,
    },
}

#[derive(Subcommand)]
enum AuditWhat {
    /// Walk the hash chain from the first entry; exit 1 naming the first entry that breaks it.
    Verify {
        #[arg(long)]
        data: PathBuf,
        /// The head hash an earlier verify printed: also proves no entry was removed from the end since.
        #[arg(long)]
        expect_head: Option<String>,
        /// An entry kept from earlier, as SEQ:HASH (the `seq` and `hash` of a line of GET /v1/audit): it must still be there, unchanged.
        #[arg(long)]
        at: Vec<String>,
        /// The audit key file (weir.toml `audit_key_file`; repeat it for a key used before): keyed entries are checked with it.
        /// Default: the file weir.db names, which whoever edited weir.db could have changed.
        #[arg(long = "key")]
        keys: Vec<PathBuf>,
    },
}

#[derive(Subcommand)]
enum BenchWhat {
    /// Events per second acknowledged (fsynced) over HTTP.
    Ingest {
        #[arg(long, default_value_t = 2_000_000)]
        events: u64,
        #[arg(long, default_value_t = 1_000)]
        batch: usize,
        #[arg(long, default_value_t = 4)]
        connections: usize,
    },
    /// From POST to the row visible in /changes, at a steady rate; also how long the checkpoints took and when the slowest probes were sent.
    Latency {
        #[arg(long, default_value_t = 20_000)]
        rate: u64,
        #[arg(long, default_value_t = 30)]
        seconds: u64,
    },
    /// From a payment's POST to its account unlocked by the receiver of an http destination, at a steady rate.
    Effect {
        #[arg(long, default_value_t = 20_000)]
        rate: u64,
        #[arg(long, default_value_t = 20)]
        seconds: u64,
    },
    /// How fast a postgres destination (upsert) takes a change stream already published.
    Destination {
        #[arg(long, default_value_t = 1_000_000)]
        events: u64,
        /// The Postgres to deliver to (a schema weir_bench_destination is made and dropped there).
        #[arg(long, default_value = "host=127.0.0.1 user=postgres dbname=test")]
        postgres: String,
        /// The table's mode: upsert (a row per key and window) or changes (every change a row).
        #[arg(long, default_value = "upsert")]
        mode: String,
        /// Changes per transaction (the destination's `batch`).
        #[arg(long, default_value_t = 10_000)]
        batch: usize,
    },
    /// A new contract version built as a candidate over this many events in the log, next to `weir run` on the same events.
    Candidate {
        #[arg(long, default_value_t = 5_000_000)]
        events: u64,
        /// Version 2 publishes a provisional row after every event (`early = true`), as version 1 does.
        #[arg(long)]
        early: bool,
    },
    /// A backfill over this many events in the log (every window settled), next to `weir batch` on the same events.
    Backfill {
        #[arg(long, default_value_t = 5_000_000)]
        events: u64,
    },
    /// Provenance requests one at a time, and a producer's POST time idle and while many readers ask for provenance.
    Provenance {
        #[arg(long, default_value_t = 1_000_000)]
        events: u64,
        #[arg(long, default_value_t = 300)]
        readers: usize,
        #[arg(long, default_value_t = 10)]
        seconds: u64,
    },
    /// Time to serve again after kill -9 with this many events in the log.
    Recovery {
        #[arg(long, default_value_t = 1_000_000)]
        events: u64,
    },
}

#[derive(Subcommand)]
enum GenWhat {
    /// Card payments: accounts, amounts with cents, currencies, statuses.
    Payments {
        #[arg(long, default_value_t = 10_000)]
        events: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Distinct accounts.
        #[arg(long, default_value_t = 10_000)]
        accounts: u64,
        /// Events per second of event time.
        #[arg(long, default_value_t = 1_000)]
        rate: u64,
        /// `realistic`: late, very late, duplicate, conflicting and malformed events;
        /// `bench`: only 5% out of order by up to 20 s and 1% exact duplicates.
        #[arg(long, value_enum, default_value = "realistic")]
        profile: gen::Profile,
        /// Later versions of recent payments per thousand events, half with
        /// another amount and half declined (default: 5 realistic, 0 bench).
        #[arg(long)]
        corrections: Option<u64>,
        #[arg(long)]
        output: Option<PathBuf>,
    },
}

/// A command that did not succeed, with its exit status.
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl Failure {
    pub fn usage(message: String) -> Failure {
        Failure { code: 2, message }
    }

    pub fn usage_from(err: anyhow::Error) -> Failure {
        Failure { code: 2, message: format!("{err:#}") }
    }

    pub fn contract(message: String) -> Failure {
        Failure { code: 2, message }
    }

    pub fn run(err: impl Into<anyhow::Error>) -> Failure {
        Failure { code: 1, message: format!("{:#}", err.into()) }
    }
}

/// Reads and validates a contract; every refusal exits 2.
pub fn load_contract(path: &Path) -> Result<Contract, Failure> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::usage(format!("cannot read contract {}: {e}; check the path", path.display())))?;
    Contract::parse(&path.display().to_string(), &text).map_err(|errors| {
        Failure::contract(format!(
            "{errors}\nweir: the contract cannot run; fix the lines above and run `weir check {}`",
            path.display()
        ))
    })
}

fn main() -> ExitCode {
    allocator::return_freed_memory_promptly();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            let code = if err.use_stderr() { 2 } else { 0 };
            let _ = err.print();
            return ExitCode::from(code);
        }
    };
    let result = match cli.command {
        Command::Run { contract, input, output, ledger, no_final, threads } => {
            let threads = threads.unwrap_or_else(run::default_threads);
            run::run(run::RunArgs { contract, input, output, ledger, no_final, mode: Mode::Stream, threads })
        }
        Command::Batch { contract, input, output, ledger, threads } => {
            let threads = threads.unwrap_or_else(run::default_threads);
            run::run(run::RunArgs { contract, input, output, ledger, no_final: false, mode: Mode::Batch, threads })
        }
        Command::Reconcile { pipeline, against, map, tolerance, why, version, url, stream, batch, format } => {
            match (pipeline, against, stream, batch) {
                (Some(pipeline), Some(against), None, None) => match map {
                    None => Err(Failure::usage(
                        "say which columns are what: --map key.FIELD=column,window_start=column,AGGREGATE=column".into(),
                    )),
                    Some(map) => {
                        let asked = client::ReconcileAsk {
                            export: &against,
                            map: &map,
                            tolerance: &tolerance,
                            why: why.as_deref().unwrap_or("reconciliation"),
                            version,
                        };
                        client::reconcile_against(&url, &pipeline, &asked, format == Format::Json)
                    }
                },
                (None, None, Some(stream), Some(batch)) => reconcile::reconcile(&stream, &batch, format == Format::Json),
                _ => Err(Failure::usage(
                    "use `weir reconcile PIPELINE --against FILE --map ...` or `weir reconcile --stream FILE --batch FILE`".into(),
                )),
            }
        }
        Command::Demo { files: true, events, data, .. } => demo::demo(events, data.as_deref()),
        Command::Demo { data, rate, duration, listen, kafka, postgres, .. } => {
            match duration.as_deref().map(weir_contract::parse_duration_ms) {
                Some(Err(e)) => Err(Failure::usage(format!("--duration: {e}"))),
                Some(Ok(ms)) => live::demo(live::LiveArgs {
                    data,
                    rate,
                    duration: Some(std::time::Duration::from_millis(ms.max(0) as u64)),
                    listen,
                    kafka,
                    postgres,
                }),
                None => live::demo(live::LiveArgs { data, rate, duration: None, listen, kafka, postgres }),
            }
        }
        Command::Serve { data, contracts, config, listen, tls_cert, tls_key } => {
            let tls = tls_cert.zip(tls_key);
            serve::serve(serve::ServeArgs { data, contracts, config, listen, tls })
        }
        Command::Produce { topic, file, url, batch, retry_for, kafka, key } => client::produce(client::ProduceArgs {
            kafka: kafka.as_deref(),
            key: key.as_deref(),
            url: &url,
            topic: &topic,
            file: &file,
            batch: batch.max(1),
            give_up_after: std::time::Duration::from_secs(retry_for),
        }),
        Command::Pause { pipeline, who, why, url } => {
            client::act(&url, &pipeline, "pause", who.as_deref(), &why, client::ReplayFrom::default())
        }
        Command::Resume { pipeline, destination: Some(d), who, why, url } => {
            client::resume_destination(&url, &pipeline, &d, who.as_deref(), &why)
        }
        Command::Resume { pipeline, destination: None, who, why, url } => {
            client::act(&url, &pipeline, "resume", who.as_deref(), &why, client::ReplayFrom::default())
        }
        Command::Replay { pipeline, who, why, from_offset, from_time, url } => client::act(
            &url,
            &pipeline,
            "replay",
            who.as_deref(),
            &why,
            client::ReplayFrom { offset: from_offset, time: from_time },
        ),
        Command::Promote { pipeline, version, who, why, url } => {
            client::switch(&url, &pipeline, Some(version), who.as_deref(), &why)
        }
        Command::Rollback { pipeline, who, why, url } => client::switch(&url, &pipeline, None, who.as_deref(), &why),
        Command::Diff { pipeline, a, b, format, url } => client::diff(&url, &pipeline, (a, b), &format),
        Command::Backfill { pipeline, from, to, why, who, version, format, url } => {
            let asked = client::BackfillAsk { from: &from, to: &to, why: &why, who: who.as_deref(), version };
            client::backfill(&url, &pipeline, &asked, &format)
        }
        Command::Annotate { pipeline, from, to, note, who, url } => {
            client::annotate(&url, &pipeline, (&from, &to), &note, who.as_deref())
        }
        Command::Advise { pipeline, format, url } => client::advise(&url, &pipeline, &format),
        Command::Review { since, format, url } => review::review(&url, &since, &format),
        Command::Drill { scenario, pipeline, why, fault, recover, format, url } => {
            let ask = client::DrillAsk {
                scenario: &scenario,
                why: &why,
                fault: fault.as_deref(),
                recover: recover.as_deref(),
            };
            client::drill(&url, &pipeline, &ask, &format)
        }
        Command::Incident { what } => match what {
            IncidentWhat::Open { pipeline, title, owner, why, url } => client::incident(
                &url,
                &pipeline,
                None,
                serde_json::json!({ "title": title, "owner": owner, "why": why }),
            ),
            IncidentWhat::Note { pipeline, id, note, url } => {
                client::incident(&url, &pipeline, Some((id, "notes")), serde_json::json!({ "note": note }))
            }
            IncidentWhat::Mitigate { pipeline, id, why, url } => {
                client::incident(&url, &pipeline, Some((id, "mitigate")), serde_json::json!({ "why": why }))
            }
            IncidentWhat::Resolve { pipeline, id, proof, why, url } => client::incident(
                &url,
                &pipeline,
                Some((id, "resolve")),
                serde_json::json!({ "why": why, "proof": proof }),
            ),
            IncidentWhat::Show { pipeline, id, url } => client::incidents(&url, &pipeline, id),
        },
        Command::Status { pipeline, url } => client::status(&url, pipeline.as_deref()),
        Command::Tail { pipeline, since, version, limit, url } => {
            client::tail(&url, &pipeline, (since, version), limit)
        }
        Command::Results { pipeline, url, status, format } => {
            client::results(&url, &pipeline, status.as_deref(), format == Format::Json)
        }
        Command::Bench { what: BenchWhat::Ingest { events, batch, connections } } => {
            bench::ingest(events, batch.max(1), connections)
        }
        Command::Bench { what: BenchWhat::Latency { rate, seconds } } => bench::latency(rate, seconds),
        Command::Bench { what: BenchWhat::Effect { rate, seconds } } => bench::effect(rate, seconds),
        Command::Bench { what: BenchWhat::Destination { events, postgres, mode, batch } } => {
            bench::destination(events, &postgres, (&mode, batch))
        }
        Command::Bench { what: BenchWhat::Recovery { events } } => bench::recovery(events),
        Command::Bench { what: BenchWhat::Candidate { events, early } } => bench::candidate(events, early),
        Command::Bench { what: BenchWhat::Backfill { events } } => bench::backfill(events),
        Command::Bench { what: BenchWhat::Provenance { events, readers, seconds } } => {
            bench::provenance(events, readers, seconds)
        }
        Command::Token { what: TokenWhat::Create { data, role, name, topics, pipelines, expires, why } } => {
            access::create(access::CreateArgs {
                data: &data,
                role: &role,
                name: &name,
                topics,
                pipelines,
                expires: expires.as_deref(),
                why: &why,
            })
        }
        Command::Token { what: TokenWhat::Revoke { id, data, why } } => access::revoke(&data, &id, &why),
        Command::Token { what: TokenWhat::List { data } } => access::list(&data),
        Command::Audit { what: AuditWhat::Verify { data, expect_head, at, keys } } => {
            access::verify(&data, expect_head.as_deref(), &at, &keys)
        }
        Command::Check { contract } => load_contract(&contract).map(|c| print!("{}", c.summary())),
        Command::Gen { what: GenWhat::Payments { events, seed, accounts, rate, profile, corrections, output } } => {
            let args = gen::PaymentsArgs { events, seed, accounts, rate, profile, corrections };
            gen::payments(args, output.as_deref())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            if !failure.message.is_empty() {
                eprintln!("weir: {}", failure.message);
            }
            ExitCode::from(failure.code)
        }
    }
}

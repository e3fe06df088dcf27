//! `weir bench ingest|latency|recovery|candidate|backfill|provenance`: the server's benchmarks
//! (BENCHMARKS.md). Each starts its own `weir serve` on a temporary folder
//! with the demo's payments contract and prints what it measured. With
//! `WEIR_BENCH_SERVER=PATH`, that binary serves, so two builds can be
//! measured alternately by the same client.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::gen::{PaymentStream, Profile, GEN_START_MS};
use crate::Failure;

/// The demo's payments contract (`early = true`, 2 minutes of lateness, dedup by payment id).
const CONTRACT: &str = crate::live::PAYMENTS;

const CONFIG: &str = "[topics.payments]\npartitions = 2\nkey = \"account_id\"\n";

fn fail(message: String) -> Failure {
    Failure::run(anyhow::anyhow!(message))
}

struct Folder(PathBuf);

impl Folder {
    fn new(what: &str) -> Result<Folder, Failure> {
        Folder::with(what, CONTRACT, CONFIG)
    }

    /// A folder with this contract and weir.toml.
    fn with(what: &str, contract: &str, config: &str) -> Result<Folder, Failure> {
        let dir = std::env::temp_dir().join(format!("weir-bench-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("contracts"))
            .map_err(|e| fail(format!("cannot create {}: {e}", dir.display())))?;
        let write =
            |p: PathBuf, t: &str| std::fs::write(&p, t).map_err(|e| fail(format!("cannot write {}: {e}", p.display())));
        write(dir.join("contracts/paid_revenue.toml"), contract)?;
        write(dir.join("weir.toml"), config)?;
        Ok(Folder(dir))
    }
}

impl Drop for Folder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Server {
    child: Child,
    base: String,
    /// Tokens made on the server's data folder before it started.
    producer: String,
    reader: String,
    operator: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `weir serve` on `dir` and returns once it serves.
fn serve(dir: &Path, port: u16) -> Result<Server, Failure> {
    let exe = server_exe()?;
    // The tokens come from the serving binary, whose schema the folder gets.
    let token = |role: &str, scope: &str| -> Result<String, Failure> {
        let made = Command::new(&exe)
            .args(["token", "create", "--name", "weir bench", "--role", role, scope, "*", "--data"])
            .arg(dir.join("data"))
            .output()
            .map_err(|e| fail(format!("cannot run {} token create: {e}", exe.display())))?;
        match made.status.success() {
            true => Ok(String::from_utf8_lossy(&made.stdout).trim().to_owned()),
            false => Err(fail(format!("token create failed: {}", String::from_utf8_lossy(&made.stderr)))),
        }
    };
    let (producer, reader, operator) =
        (token("producer", "--topic")?, token("reader", "--pipeline")?, token("operator", "--pipeline")?);
    let mut child = Command::new(exe)
        .arg("serve")
        .arg("--data")
        .arg(dir.join("data"))
        .arg("--contracts")
        .arg(dir.join("contracts"))
        .arg("--config")
        .arg(dir.join("weir.toml"))
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| fail(format!("cannot start weir serve: {e}")))?;
    let stderr = child.stderr.take().ok_or_else(|| fail("no stderr".into()))?;
    let mut lines = BufReader::new(stderr).lines();
    loop {
        match lines.next() {
            Some(Ok(line)) if line.contains("serving http://") => break,
            Some(Ok(_)) => {}
            _ => return Err(fail("weir serve stopped before serving".into())),
        }
    }
    // What the server says from here on (a failure, a restart) shows with the figures.
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            eprintln!("  weir serve: {line}");
        }
    });
    Ok(Server { child, base: format!("http://127.0.0.1:{port}"), producer, reader, operator })
}

/// The binary that serves: `WEIR_BENCH_SERVER` when set (another build, for
/// a before-and-after in one sitting), else this one.
fn server_exe() -> Result<PathBuf, Failure> {
    match std::env::var_os("WEIR_BENCH_SERVER") {
        Some(path) => Ok(PathBuf::from(path)),
        None => std::env::current_exe().map_err(|e| fail(format!("cannot find the weir binary: {e}"))),
    }
}

fn free_port() -> Result<u16, Failure> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| fail(format!("no free port: {e}")))?;
    Ok(l.local_addr().map_err(|e| fail(e.to_string()))?.port())
}

/// Batches of `batch` generated payments (bench profile), event times from `start_ms` at `rate` per second.
fn batches(events: u64, batch: usize, start_ms: i64, rate: u64) -> Vec<String> {
    batches_from(0, events, batch, start_ms, rate)
}

/// [`batches`] with payment ids from `first_id` on.
fn batches_from(first_id: u64, events: u64, batch: usize, start_ms: i64, rate: u64) -> Vec<String> {
    let mut stream = PaymentStream::new(11, 10_000, Profile::Bench, true).with_first_id(first_id);
    let mut out = Vec::new();
    let mut text = String::new();
    for i in 0..events {
        stream.next(start_ms + (i * 1000 / rate.max(1)) as i64, &mut text);
        if (i + 1) % batch as u64 == 0 {
            out.push(std::mem::take(&mut text));
        }
    }
    if !text.is_empty() {
        out.push(text);
    }
    out
}

fn status(agent: &ureq::Agent, server: &Server) -> Option<serde_json::Value> {
    let url = format!("{}/v1/pipelines/paid_revenue/status", server.base);
    let mut r = crate::client::with_token(agent.get(&url), Some(&server.reader)).call().ok()?;
    serde_json::from_str(&r.body_mut().read_to_string().ok()?).ok()
}

/// Posts all batches from `connections` threads; returns the wall time.
fn post_all(server: &Server, batches: &[String], connections: usize) -> Result<Duration, Failure> {
    let url = format!("{}/v1/topics/payments/events", server.base);
    let next = AtomicU64::new(0);
    let failed = Mutex::new(None);
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..connections.max(1) {
            s.spawn(|| {
                let agent = crate::client::agent();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                    let Some(body) = batches.get(i) else { break };
                    if let Err(e) =
                        crate::client::post_batch(&agent, &url, body, Some(&server.producer)).and_then(|ok| {
                            if ok {
                                Ok(())
                            } else {
                                Err("not acknowledged".to_owned())
                            }
                        })
                    {
                        *failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                        break;
                    }
                }
            });
        }
    });
    match failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(fail(e)),
        None => Ok(started.elapsed()),
    }
}

/// Waits until the pipeline has read `events` and checkpointed them.
fn caught_up(server: &Server, events: u64, within: Duration) -> Result<Duration, Failure> {
    let agent = crate::client::agent();
    let started = Instant::now();
    loop {
        if let Some(s) = status(&agent, server) {
            // Read, and stored: no checkpoint still committing.
            if s["events"]["read"].as_u64() >= Some(events) && s["lag_records"] == 0 && s["unsaved"] == false {
                return Ok(started.elapsed());
            }
        }
        if started.elapsed() > within {
            return Err(fail(format!("the pipeline did not catch up within {within:?}")));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn ingest(events: u64, batch: usize, connections: usize) -> Result<(), Failure> {
    let dir = Folder::new("ingest")?;
    let server = serve(&dir.0, free_port()?)?;
    let batches = batches(events, batch, GEN_START_MS, 1_000);
    let wall = post_all(&server, &batches, connections)?;
    let rate = events as f64 / wall.as_secs_f64();
    println!(
        "ingest: {events} events in batches of {batch} from {connections} connections: {:.2} s, {rate:.0} events/s acknowledged (fsynced)",
        wall.as_secs_f64()
    );
    let behind = caught_up(&server, events, Duration::from_secs(300))?;
    println!("        the pipeline had read and checkpointed them all {:.2} s later", behind.as_secs_f64());
    Ok(())
}

/// Sleeps until the next 50 ms tick after `next`; a tick already past (a
/// slow POST) starts the ticks again from now, so no burst catches up.
fn wait_tick(next: &mut Instant) {
    *next += Duration::from_millis(50);
    match next.checked_duration_since(Instant::now()) {
        Some(rest) => std::thread::sleep(rest),
        None => *next = Instant::now(),
    }
}

pub fn latency(rate: u64, seconds: u64) -> Result<(), Failure> {
    let dir = Folder::new("latency")?;
    let server = serve(&dir.0, free_port()?)?;
    let url = format!("{}/v1/topics/payments/events", server.base);
    // Every 50 ms a batch of rate/20 events, the first of each with its own
    // key: the row for that key shows when the batch became visible.
    let per_batch = (rate / 20).max(1);
    let sent_at: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    let poller = {
        let (base, sent_at, done) = (server.base.clone(), Arc::clone(&sent_at), Arc::clone(&done));
        let reader = server.reader.clone();
        std::thread::spawn(move || {
            let agent = crate::client::agent();
            let mut since = 1u64;
            let mut latencies = Vec::new();
            let mut seen = std::collections::HashSet::new();
            while !done.load(Ordering::SeqCst) {
                let url = format!("{base}/v1/pipelines/paid_revenue/changes?since={since}");
                let got = crate::client::with_token(agent.get(&url), Some(&reader)).call();
                let now = Instant::now();
                if let Ok(mut r) = got {
                    let body = r.body_mut().with_config().limit(1 << 30).read_to_string().unwrap_or_default();
                    for line in body.lines() {
                        since += 1;
                        let Some(at) = line.find("\"account_id\":\"probe-") else { continue };
                        let n: usize =
                            line[at + 20..].split('"').next().and_then(|s| s.parse().ok()).unwrap_or(usize::MAX);
                        // Only a probe's first row: its window emits again when the watermark passes its end.
                        if !seen.insert(n) {
                            continue;
                        }
                        if let Some(t) = sent_at.lock().unwrap_or_else(|e| e.into_inner()).get(n) {
                            latencies.push((now.duration_since(*t), n));
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            latencies
        })
    };
    let mut stream = PaymentStream::new(3, 10_000, Profile::Bench, true);
    let agent = crate::client::agent();
    let started = Instant::now();
    let mut next = Instant::now();
    let mut posted = 0u64;
    let mut b = 0usize;
    while started.elapsed() < Duration::from_secs(seconds) {
        let now_ms = weir_log::now_ms();
        let mut body = format!(
            "{{\"payment_id\":\"probe-{b}\",\"account_id\":\"probe-{b}\",\"amount\":1.00,\"currency\":\"EUR\",\"status\":\"approved\",\"approved_at\":\"{}\"}}\n",
            weir_engine::time::format_rfc3339_ms(now_ms)
        );
        for _ in 1..per_batch {
            stream.next(now_ms, &mut body);
        }
        sent_at.lock().unwrap_or_else(|e| e.into_inner()).push(Instant::now());
        if !matches!(crate::client::post_batch(&agent, &url, &body, Some(&server.producer)), Ok(true)) {
            return Err(fail("a batch was not acknowledged".into()));
        }
        posted += per_batch;
        b += 1;
        wait_tick(&mut next);
    }
    let achieved = posted as f64 / started.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_secs(2));
    done.store(true, Ordering::SeqCst);
    let mut l = poller.join().map_err(|_| fail("the poller panicked".into()))?;
    if l.is_empty() {
        return Err(fail("no probe row was seen".into()));
    }
    l.sort();
    let pct = |p: f64| l[((l.len() as f64 * p).ceil() as usize).clamp(1, l.len()) - 1].0.as_secs_f64() * 1e3;
    println!(
        "latency: {posted} events at {achieved:.0}/s for {seconds} s; POST to row visible in /changes over {} batches: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        l.len(),
        pct(0.50),
        pct(0.99),
        pct(1.0)
    );
    // Where the time goes: how many checkpoints, how long each took, and an event's wait for processing.
    let metrics = metrics_text(&agent, &server).unwrap_or_default();
    let mean = |name: &str| metric(&metrics, &format!("{name}_sum")).zip(metric(&metrics, &format!("{name}_count")));
    if let (Some((cs, cn)), Some((ps, pn))) =
        (mean("weir_checkpoint_duration_seconds"), mean("weir_processing_latency_seconds"))
    {
        println!(
            "latency: {cn:.0} checkpoints of paid_revenue, {:.1} ms each on average; append to processing {:.1} ms on average",
            cs / cn.max(1.0) * 1e3,
            ps / pn.max(1.0) * 1e3
        );
    }
    // The tail: how many checkpoints took longer than each bound, and when the slowest probes were sent.
    let buckets = histogram(&metrics, "weir_checkpoint_duration_seconds");
    if let Some(&(_, all)) = buckets.last() {
        let over: Vec<String> = buckets
            .iter()
            .filter(|(le, _)| (0.01..=0.25).contains(le))
            .map(|(le, n)| format!("{:.0} over {:.0} ms", all - n, le * 1e3))
            .collect();
        println!("latency: of {all:.0} checkpoints, {}", over.join(", "));
    }
    let slowest: Vec<String> = l
        .iter()
        .rev()
        .take(5)
        .map(|(d, n)| format!("{:.0} ms sent at {:.2} s", d.as_secs_f64() * 1e3, *n as f64 * 0.05))
        .collect();
    println!("latency: slowest probes: {}", slowest.join(", "));
    Ok(())
}

/// The server's `/metrics`, read once for every figure taken from it.
fn metrics_text(agent: &ureq::Agent, server: &Server) -> Option<String> {
    let url = format!("{}/metrics", server.base);
    crate::client::with_token(agent.get(&url), Some(&server.operator)).call().ok()?.body_mut().read_to_string().ok()
}

/// The cumulative buckets `(le, count)` of the histogram `name` for the
/// pipeline `paid_revenue` in `metrics`, `+Inf` last.
fn histogram(text: &str, name: &str) -> Vec<(f64, f64)> {
    let prefix = format!("{name}_bucket{{");
    text.lines()
        .filter(|l| l.starts_with(&prefix) && l.contains("pipeline=\"paid_revenue\""))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            Some((le, l.rsplit(' ').next()?.parse().ok()?))
        })
        .collect()
}

/// A sample of `name` for the pipeline `paid_revenue` in `metrics`.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains("pipeline=\"paid_revenue\""))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

pub fn recovery(events: u64) -> Result<(), Failure> {
    let dir = Folder::new("recovery")?;
    let port = free_port()?;
    let server = serve(&dir.0, port)?;
    let batches = batches(events, 1_000, GEN_START_MS, 1_000);
    post_all(&server, &batches, 4)?;
    caught_up(&server, events, Duration::from_secs(600))?;
    // A checkpoint about a second old: wait, then a few more events.
    std::thread::sleep(Duration::from_secs(1));
    let mut server = server;
    let _ = server.child.kill();
    let _ = server.child.wait();
    let started = Instant::now();
    let server = serve(&dir.0, port)?;
    let serving = started.elapsed();
    let agent = crate::client::agent();
    while status(&agent, &server).is_none() {
        std::thread::sleep(Duration::from_millis(5));
    }
    let answering = started.elapsed();
    caught_up(&server, 0, Duration::from_secs(60))?;
    let restored = loop {
        if let Some(s) = status(&agent, &server) {
            if s["events"]["read"].as_u64() > Some(0) || s["open_windows"].as_u64() > Some(0) {
                break started.elapsed();
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    println!(
        "recovery: {events} events in the log, kill -9, restart: serving after {:.2} s, answering status after {:.2} s, pipeline state restored after {:.2} s",
        serving.as_secs_f64(),
        answering.as_secs_f64(),
        restored.as_secs_f64()
    );
    Ok(())
}

/// `paid_revenue`'s status of `version`.
fn version_status(agent: &ureq::Agent, server: &Server, version: u32) -> Option<serde_json::Value> {
    let url = format!("{}/v1/pipelines/paid_revenue/status?version={version}", server.base);
    let mut r = crate::client::with_token(agent.get(&url), Some(&server.reader)).call().ok()?;
    serde_json::from_str(&r.body_mut().read_to_string().ok()?).ok()
}

/// Version 1 reads `events` posted events; then the server restarts with
/// version 2 (2-minute windows; with `early`, a provisional row after every
/// event as version 1 has, else settled rows only), which is built as a
/// candidate from the log while version 1 serves: its events per second,
/// from the restart to the last event read and checkpointed, next to `weir
/// run` of version 2's contract over the same events as a file (the
/// contract's work without a log or a store).
pub fn candidate(events: u64, early: bool) -> Result<(), Failure> {
    let dir = Folder::new("candidate")?;
    let port = free_port()?;
    let server = serve(&dir.0, port)?;
    let batches = batches(events, 1_000, GEN_START_MS, 1_000);
    post_all(&server, &batches, 4)?;
    caught_up(&server, events, Duration::from_secs(1200))?;
    drop(server);

    let mut v2 = CONTRACT.replace("version = 1", "version = 2").replace("size = \"1m\"", "size = \"2m\"");
    if !early {
        v2 = v2.replace("early = true", "early = false");
    }
    let file = dir.0.join("contracts/paid_revenue.toml");
    std::fs::write(&file, &v2).map_err(|e| fail(format!("cannot write {}: {e}", file.display())))?;

    // `weir run` of version 2 on the same events, as a file.
    let input = dir.0.join("events.jsonl");
    std::fs::write(&input, batches.concat()).map_err(|e| fail(format!("cannot write {}: {e}", input.display())))?;
    drop(batches);
    let exe = std::env::current_exe().map_err(|e| fail(format!("cannot find the weir binary: {e}")))?;
    let started = Instant::now();
    let run = Command::new(&exe)
        .arg("run")
        .arg(&file)
        .arg("--input")
        .arg(&input)
        // One thread, as the candidate is built on one.
        .args(["--output", "/dev/null", "--ledger", "/dev/null", "--threads", "1"])
        .output()
        .map_err(|e| fail(format!("cannot run weir run: {e}")))?;
    if !run.status.success() {
        return Err(fail(format!("weir run failed: {}", String::from_utf8_lossy(&run.stderr))));
    }
    let run_secs = started.elapsed().as_secs_f64();

    let started = Instant::now();
    let server = serve(&dir.0, port)?;
    let agent = crate::client::agent();
    let built = loop {
        if let Some(s) = version_status(&agent, &server, 2) {
            // Built once it has read every event and its last checkpoint has committed.
            let checkpointed = s["checkpoint_age_ms"].as_i64().is_some() && s["unsaved"] == false;
            if s["events"]["read"].as_u64() >= Some(events) && s["lag_records"] == 0 && checkpointed {
                break started.elapsed().as_secs_f64();
            }
        }
        if started.elapsed() > Duration::from_secs(1200) {
            return Err(fail("the candidate was not built within 20 minutes".into()));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (run_rate, built_rate) = (events as f64 / run_secs, events as f64 / built);
    println!(
        "candidate ({}): {events} events in the log: version 2 built in {built:.2} s, {built_rate:.0} events/s; weir run on the same events {run_secs:.2} s, {run_rate:.0} events/s; ratio {:.2}",
        if early { "early rows" } else { "settled rows" },
        built_rate / run_rate
    );
    Ok(())
}

/// A backfill over `events` in the log (every window settled, settled rows
/// only), timed from the request to the run's report, next to `weir batch`
/// over the same events as a file, one after the other.
pub fn backfill(events: u64) -> Result<(), Failure> {
    let dir = Folder::new("backfill")?;
    let contract = CONTRACT.replace("early = true", "early = false");
    let file = dir.0.join("contracts/paid_revenue.toml");
    std::fs::write(&file, &contract).map_err(|e| fail(format!("cannot write {}: {e}", file.display())))?;
    let port = free_port()?;
    let server = serve(&dir.0, port)?;
    let mut posted = batches(events, 1_000, GEN_START_MS, 1_000);
    // A payment two days on for enough accounts to reach both partitions: every window settles.
    let flush_ms = GEN_START_MS + 2 * 86_400_000;
    let flush: String = (0..40)
        .map(|k| {
            format!(
                "{{\"payment_id\":\"flush-{k}\",\"account_id\":\"flush-{k}\",\"amount\":1,\"status\":\"approved\",\"approved_at\":\"{}\"}}\n",
                weir_engine::time::format_rfc3339_ms(flush_ms)
            )
        })
        .collect();
    posted.push(flush);
    post_all(&server, &posted, 4)?;
    caught_up(&server, events + 40, Duration::from_secs(1200))?;

    let input = dir.0.join("events.jsonl");
    std::fs::write(&input, posted.concat()).map_err(|e| fail(format!("cannot write {}: {e}", input.display())))?;
    drop(posted);
    let exe = std::env::current_exe().map_err(|e| fail(format!("cannot find the weir binary: {e}")))?;
    let started = Instant::now();
    let batch = Command::new(&exe)
        .arg("batch")
        .arg(&file)
        .arg("--input")
        .arg(&input)
        // One thread, as the backfill runs on one.
        .args(["--output", "/dev/null", "--ledger", "/dev/null", "--threads", "1"])
        .output()
        .map_err(|e| fail(format!("cannot run weir batch: {e}")))?;
    if !batch.status.success() {
        return Err(fail(format!("weir batch failed: {}", String::from_utf8_lossy(&batch.stderr))));
    }
    let batch_secs = started.elapsed().as_secs_f64();

    // Live processing beside a backfill: the time to post and read a probe
    // of 200,000 later events, before the backfill and while it runs.
    let probe = |n: u64| batches_from(n * 1_000_000_000, 200_000, 1_000, flush_ms + n as i64 * 600_000, 1_000);
    let mut total = events + 40;
    let started = Instant::now();
    post_all(&server, &probe(1), 2)?;
    total += 200_000;
    caught_up(&server, total, Duration::from_secs(600))?;
    let idle_probe = started.elapsed().as_secs_f64();

    let agent = crate::client::agent();
    let url = format!("{}/v1/pipelines/paid_revenue/backfill", server.base);
    let asked = serde_json::json!({
        "from": weir_engine::time::format_rfc3339_ms(GEN_START_MS - 86_400_000),
        "to": weir_engine::time::format_rfc3339_ms(flush_ms - 3_600_000),
        "why": "weir bench backfill",
    });
    let started = Instant::now();
    let mut r = crate::client::with_token(agent.post(&url), Some(&server.operator))
        .header("content-type", "application/json")
        .send(&asked.to_string())
        .map_err(|e| fail(format!("cannot ask the backfill: {e}")))?;
    let answer: serde_json::Value =
        serde_json::from_str(&r.body_mut().read_to_string().unwrap_or_default()).unwrap_or_default();
    let Some(id) = answer["backfill"].as_i64() else { return Err(fail(format!("the backfill was refused: {answer}"))) };
    let one = format!("{}/v1/pipelines/paid_revenue/backfills/{id}", server.base);
    let probe_started = Instant::now();
    post_all(&server, &probe(2), 2)?;
    total += 200_000;
    caught_up(&server, total, Duration::from_secs(600))?;
    let busy_probe = probe_started.elapsed().as_secs_f64();
    let run = loop {
        let mut r = crate::client::with_token(agent.get(&one), Some(&server.reader))
            .call()
            .map_err(|e| fail(format!("cannot read the backfill: {e}")))?;
        let run: serde_json::Value =
            serde_json::from_str(&r.body_mut().read_to_string().unwrap_or_default()).unwrap_or_default();
        if run["state"] == "done" || run["state"] == "failed" {
            break run;
        }
        if started.elapsed() > Duration::from_secs(1200) {
            return Err(fail("the backfill was not done within 20 minutes".into()));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let secs = started.elapsed().as_secs_f64();
    if run["state"] != "done" {
        return Err(fail(format!("the backfill failed: {}", run["error"])));
    }
    let read = run["report"]["events_read"].as_u64().unwrap_or(0);
    let (rate, batch_rate) = (read as f64 / secs, (events + 40) as f64 / batch_secs);
    println!(
        "backfill: {read} events in the log, {} windows checked, {} corrected: {secs:.2} s, {rate:.0} events/s; weir batch on the same events {batch_secs:.2} s, {batch_rate:.0} events/s; ratio {:.2}",
        run["report"]["windows_checked"],
        run["report"]["windows_corrected"],
        rate / batch_rate
    );
    println!(
        "  live beside it: 200,000 events posted and read in {idle_probe:.2} s before the backfill, {busy_probe:.2} s while it ran{}",
        if busy_probe < secs { "" } else { " (the backfill ended first)" }
    );
    Ok(())
}

/// A POST of `body` to the payments topic, timed; an error unless acknowledged.
fn timed_post(agent: &ureq::Agent, server: &Server, body: &str) -> Result<Duration, Failure> {
    let url = format!("{}/v1/topics/payments/events", server.base);
    let started = Instant::now();
    match crate::client::post_batch(agent, &url, body, Some(&server.producer)) {
        Ok(true) => Ok(started.elapsed()),
        Ok(false) => Err(fail("a batch was not acknowledged".into())),
        Err(e) => Err(fail(e)),
    }
}

/// The `p` quantile of `d` (sorted here), in milliseconds.
fn quantile_ms(d: &mut [Duration], p: f64) -> f64 {
    d.sort_unstable();
    match d.len() {
        0 => f64::NAN,
        n => d[((n as f64 * p).ceil() as usize).clamp(1, n) - 1].as_secs_f64() * 1e3,
    }
}

/// Provenance with `events` in the pipeline: one request at a time, then a
/// steady producer's POST time (100 events every 10 ms, for `seconds`)
/// alone and while `readers` clients ask for provenance without pause.
pub fn provenance(events: u64, readers: usize, seconds: u64) -> Result<(), Failure> {
    let dir = Folder::new("provenance")?;
    let server = serve(&dir.0, free_port()?)?;
    post_all(&server, &batches(events, 1_000, GEN_START_MS, 1_000), 4)?;
    caught_up(&server, events, Duration::from_secs(1200))?;
    let agent = crate::client::agent();
    // The rows' seqs, newest first: every revision of the latest windows.
    let url = format!("{}/v1/pipelines/paid_revenue/results?limit=10000", server.base);
    let body = crate::client::with_token(agent.get(&url), Some(&server.reader))
        .call()
        .and_then(|mut r| r.body_mut().with_config().limit(1 << 30).read_to_string())
        .map_err(|e| fail(format!("cannot read the rows: {e}")))?;
    let seqs: Vec<u64> =
        body.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()?["seq"].as_u64()).collect();
    if seqs.is_empty() {
        return Err(fail("the pipeline published no row".into()));
    }
    let ask = |agent: &ureq::Agent, i: u64| -> Result<Duration, String> {
        let seq = seqs[(i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 33) as usize % seqs.len()];
        let url = format!("{}/v1/pipelines/paid_revenue/results/{seq}/provenance", server.base);
        let started = Instant::now();
        let mut r =
            crate::client::with_token(agent.get(&url), Some(&server.reader)).call().map_err(|e| e.to_string())?;
        r.body_mut().read_to_string().map_err(|e| e.to_string())?;
        Ok(started.elapsed())
    };
    let mut alone = Vec::new();
    for i in 0..500 {
        alone.push(ask(&agent, i).map_err(|e| fail(format!("a provenance request failed: {e}")))?);
    }
    let mut stream = PaymentStream::new(5, 10_000, Profile::Bench, true).with_first_id(1_000_000_000);
    let mut at_ms = GEN_START_MS + events as i64;
    // A steady producer: a POST of 100 events every 10 ms.
    let mut produce = |until: Instant| -> Result<Vec<Duration>, Failure> {
        let mut took = Vec::new();
        let mut next = Instant::now();
        while next < until {
            let mut body = String::new();
            for _ in 0..100 {
                stream.next(at_ms, &mut body);
                at_ms += 1;
            }
            took.push(timed_post(&agent, &server, &body)?);
            next += Duration::from_millis(10);
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
        Ok(took)
    };
    let mut idle = produce(Instant::now() + Duration::from_secs(seconds))?;
    let stop = Arc::new(AtomicBool::new(false));
    let paths: Vec<String> =
        seqs.iter().map(|seq| format!("/v1/pipelines/paid_revenue/results/{seq}/provenance")).collect();
    let port = server.base.rsplit(':').next().and_then(|p| p.parse::<u16>().ok()).unwrap_or(0);
    let flood = {
        let (stop, reader) = (Arc::clone(&stop), server.reader.clone());
        std::thread::spawn(move || flood(port, &reader, paths, readers, stop))
    };
    let started = Instant::now();
    let loaded = produce(Instant::now() + Duration::from_secs(seconds));
    stop.store(true, Ordering::Relaxed);
    let (answered, refused) = flood.join().map_err(|_| fail("the readers' thread panicked".into()))?;
    let mut loaded = loaded?;
    let flood_secs = started.elapsed().as_secs_f64();
    println!(
        "provenance: {events} events, {} rows to ask about; one at a time: p50 {:.2} ms, p99 {:.2} ms",
        seqs.len(),
        quantile_ms(&mut alone, 0.5),
        quantile_ms(&mut alone, 0.99)
    );
    println!(
        "            a producer's POST of 100 events every 10 ms: alone p50 {:.2} ms, p99 {:.2} ms ({} posts); with {readers} readers asking for provenance: p50 {:.2} ms, p99 {:.2} ms ({} posts), {:.0} provenance answers/s, {} failed",
        quantile_ms(&mut idle, 0.5),
        quantile_ms(&mut idle, 0.99),
        idle.len(),
        quantile_ms(&mut loaded, 0.5),
        quantile_ms(&mut loaded, 0.99),
        loaded.len(),
        answered as f64 / flood_secs,
        refused
    );
    Ok(())
}

/// `readers` connections to 127.0.0.1:`port`, each asking for one of
/// `paths` after another until `stop`, all from one thread (readers stand
/// for clients on other machines: hundreds of client threads here would
/// take the CPU from the server they measure). Returns the answers with
/// status 200 and the others.
fn flood(port: u16, token: &str, paths: Vec<String>, readers: usize, stop: Arc<AtomicBool>) -> (u64, u64) {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return (0, 0) };
    let (paths, token) = (Arc::new(paths), Arc::new(token.to_owned()));
    let counts = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
    rt.block_on(async {
        let mut all = tokio::task::JoinSet::new();
        for r in 0..readers {
            let (paths, token, counts, stop) =
                (Arc::clone(&paths), Arc::clone(&token), Arc::clone(&counts), Arc::clone(&stop));
            all.spawn(async move {
                let (answered, failed) = ask_until(port, &token, &paths, r, &stop).await;
                counts.0.fetch_add(answered, Ordering::Relaxed);
                counts.1.fetch_add(failed, Ordering::Relaxed);
            });
        }
        while all.join_next().await.is_some() {}
    });
    (counts.0.load(Ordering::Relaxed), counts.1.load(Ordering::Relaxed))
}

/// One reader of [`flood`] on one keep-alive connection: its answers with
/// status 200 and the others (a connection that fails is one).
async fn ask_until(port: u16, token: &str, paths: &[String], r: usize, stop: &AtomicBool) -> (u64, u64) {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    let Ok(conn) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else { return (0, 1) };
    let mut conn = tokio::io::BufReader::new(conn);
    let (mut answered, mut i) = (0, r * 7919);
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let path = &paths[i % paths.len()];
        let ask = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\r\n");
        if conn.get_mut().write_all(ask.as_bytes()).await.is_err() {
            return (answered, 1);
        }
        // The status line, the headers up to the blank line, then Content-Length bytes.
        let (mut line, mut ok, mut length) = (String::new(), false, 0usize);
        loop {
            line.clear();
            if conn.read_line(&mut line).await.unwrap_or(0) == 0 {
                return (answered, 1);
            }
            if line.starts_with("HTTP/1.1 ") {
                ok = line.starts_with("HTTP/1.1 200");
            } else if let Some(n) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = n.trim().parse().unwrap_or(0);
            } else if line == "\r\n" {
                break;
            }
        }
        let mut body = vec![0; length];
        if !ok || conn.read_exact(&mut body).await.is_err() {
            return (answered, 1);
        }
        answered += 1;
    }
    (answered, 0)
}

/// `weir bench effect`: from a payment's approval (its POST) to its
/// account unlocked by the account service an `http` destination delivers
/// to, at a steady rate: every 50 ms a batch of `rate / 20` payments, the
/// first of each the first payment of a new account, whose unlock is timed.
pub fn effect(rate: u64, seconds: u64) -> Result<(), Failure> {
    let accounts = crate::accounts::AccountService::start().map_err(|e| fail(format!("no account service: {e}")))?;
    let contract = format!(
        "{CONTRACT}\n[[destination]]\nname = \"account_service\"\nkind = \"http\"\nconnection = \"account_service\"\nbatch = 1000\n"
    );
    let config = format!("{CONFIG}\n[connections.account_service]\nurl = \"{}\"\nallow_private = true\n", accounts.url);
    let dir = Folder::with("effect", &contract, &config)?;
    let server = serve(&dir.0, free_port()?)?;
    let url = format!("{}/v1/topics/payments/events", server.base);
    let per_batch = (rate / 20).max(1);
    let mut stream = PaymentStream::new(3, 10_000, Profile::Bench, true);
    let agent = crate::client::agent();
    let (started, mut next, mut posted) = (Instant::now(), Instant::now(), 0u64);
    let started_ms = weir_log::now_ms();
    let mut b = 0u64;
    while started.elapsed() < Duration::from_secs(seconds) {
        let now_ms = weir_log::now_ms();
        let account = format!("probe-{b}");
        let mut body = format!(
            "{{\"payment_id\":\"probe-{b}\",\"account_id\":\"{account}\",\"amount\":1.00,\"currency\":\"EUR\",\"status\":\"approved\",\"approved_at\":\"{}\"}}\n",
            weir_engine::time::format_rfc3339_ms(now_ms)
        );
        for _ in 1..per_batch {
            stream.next(now_ms, &mut body);
        }
        accounts.approved(&account);
        if !matches!(crate::client::post_batch(&agent, &url, &body, Some(&server.producer)), Ok(true)) {
            return Err(fail("a batch was not acknowledged".into()));
        }
        (posted, b) = (posted + per_batch, b + 1);
        wait_tick(&mut next);
    }
    let achieved = posted as f64 / started.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_secs(2));
    let s = accounts.summary();
    let ms = |q: f64| s.quantile(q).map_or(f64::NAN, |d| d.as_secs_f64() * 1e3);
    println!(
        "effect: {posted} events at {achieved:.0}/s for {seconds} s; approval (POST) to the account unlocked by the http destination's receiver, {} of {b} new accounts: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms; {} batches received",
        s.latencies.len(),
        ms(0.5),
        ms(0.99),
        ms(1.0),
        s.batches
    );
    // The tail: when the slowest probes were sent (probe-N went N x 50 ms after the start).
    let slowest: Vec<String> = s
        .slowest
        .iter()
        .map(|(d, a)| {
            let n: u64 = a.trim_start_matches("probe-").parse().unwrap_or(0);
            format!("{:.0} ms (sent at {:.2} s)", d.as_secs_f64() * 1e3, n as f64 * 0.05)
        })
        .collect();
    println!("effect: the slowest: {}", slowest.join(", "));
    println!("effect: {}", window_closes(started_ms, seconds));
    Ok(())
}

/// When, in a run of `seconds` from `started_ms`, the contract's windows
/// closed: every account's window of a minute at once, as the watermark
/// (the newest approval less `max_delay`) passed the minute. Whether a run
/// holds one depends on the clock, and its tail with it.
fn window_closes(started_ms: i64, seconds: u64) -> String {
    let Ok(c) = weir_contract::Contract::parse("bench", CONTRACT) else { return String::new() };
    let weir_contract::WindowKind::Tumbling { size_ms } = c.window.kind else { return String::new() };
    let end_ms = started_ms + seconds as i64 * 1000;
    let mut at = Vec::new();
    let mut boundary = (started_ms - c.source.max_delay_ms).div_euclid(size_ms) * size_ms + size_ms;
    while boundary + c.source.max_delay_ms < end_ms {
        at.push(format!("{:.1} s", (boundary + c.source.max_delay_ms - started_ms) as f64 / 1000.0));
        boundary += size_ms;
    }
    match at.is_empty() {
        true => "no window closed during the run".into(),
        false => format!("windows closed at {} (every account's window of the minute at once)", at.join(", ")),
    }
}

/// `weir bench destination`: how fast a `postgres` destination (upsert)
/// takes a change stream already published. The server first publishes
/// the rows of `events` payments (every provisional revision, `early =
/// true`) and stops; then a destination runner in this process delivers
/// the whole stream into a new table of `postgres`, and is timed until it
/// has delivered the last change.
pub fn destination(events: u64, postgres: &str, (mode, batch): (&str, usize)) -> Result<(), Failure> {
    let dir = Folder::new("destination")?;
    let server = serve(&dir.0, free_port()?)?;
    let posted = post_all(&server, &batches(events, 5_000, 1_764_000_000_000, 2_000), 2)?;
    caught_up(&server, events, Duration::from_secs(600))?;
    drop(server);
    let db = dir.0.join("data/weir.db");
    let store: Arc<dyn weir_store::Store> = Arc::new(weir_store::SqliteStore::new(db, 4));
    let head = store.stream_head("paid_revenue", 1).map_err(|e| fail(e.to_string()))?.last;
    let mut client = weir_store::pg::connect(postgres).map_err(|e| fail(format!("cannot reach {postgres}: {e}")))?;
    client.batch_execute("DROP SCHEMA IF EXISTS weir_bench_destination CASCADE").map_err(|e| fail(e.to_string()))?;
    let contract_text = format!(
        "{CONTRACT}\n[[destination]]\nname = \"warehouse\"\nkind = \"postgres\"\nconnection = \"warehouse\"\ntable = \"weir_bench_destination.paid_revenue\"\nmode = \"{mode}\"\nbatch = {batch}\n"
    );
    let contract = weir_contract::Contract::parse("bench", &contract_text).map_err(|e| fail(e.to_string()))?;
    let status = Arc::new(Mutex::new(weir_runtime::destination::DestinationStatus::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let runner = weir_runtime::destination::DestinationRunner {
        pipeline: "paid_revenue".into(),
        owner: contract.pipeline.owner.clone(),
        destination: contract.destinations[0].clone(),
        connection: weir_contract::Connection {
            url: postgres.into(),
            headers: Default::default(),
            allow_private: true,
        },
        contracts: [(1, contract.clone())].into_iter().collect(),
        declared_by: 1,
        store,
        exclusive: None,
        kafka: None,
        status: Arc::clone(&status),
        stop: Arc::clone(&stop),
        bell: Arc::default(),
    };
    let started = Instant::now();
    let thread = std::thread::spawn(move || runner.run());
    while status.lock().unwrap_or_else(|e| e.into_inner()).position <= head {
        if started.elapsed() > Duration::from_secs(600) {
            return Err(fail("the destination did not deliver the stream within 10 minutes".into()));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let took = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    let _ = thread.join();
    let rows: i64 = client
        .query_one("SELECT count(*) FROM weir_bench_destination.paid_revenue", &[])
        .map_err(|e| fail(e.to_string()))?
        .get(0);
    let _ = client.batch_execute("DROP SCHEMA IF EXISTS weir_bench_destination CASCADE");
    println!(
        "destination: {events} events posted in {:.1} s made {head} changes; a postgres destination ({mode}, batches of {batch}) delivered them in {:.2} s: {:.0} changes/s into {rows} table rows",
        posted.as_secs_f64(),
        took.as_secs_f64(),
        head as f64 / took.as_secs_f64()
    );
    Ok(())
}

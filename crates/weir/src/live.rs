//! `weir demo`: the server on the embedded default with three contracts of a
//! SaaS billing team, and a built-in producer posting a realistic stream to
//! its HTTP API at a steady rate. Prints the URLs to look at and a line per
//! pipeline every few seconds; stops after `--duration` or on Ctrl-C, with a
//! last checkpoint.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_contract::{Contract, ServerConfig};
use weir_log::LogOptions;

use crate::accounts::{AccountService, Summary};
use crate::gen::{PaymentStream, Profile, Rng};
use crate::Failure;

pub const PAYMENTS: &str = r#"# Payments approved per account per minute: the number that unlocks paid features.
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
max_delay = "5s"

[window]
type = "tumbling"
size = "1m"
allowed_lateness = "2m"
late = "revise"
early = true

[dedup]
horizon = "10m"
# A payment corrected upstream (another amount, or declined) replaces the one
# that counted: the ledger says `superseded`, and its window is revised.
on_conflict = "correct"

[[aggregate]]
name = "revenue"
fn = "sum"
field = "amount"

[[aggregate]]
name = "payments"
fn = "count"

# Named checks: each material assumption, evaluated and kept (GET .../checks).
[[check]]
name = "revenue_not_negative"
severity = "error"
question = "Can a minute's approved payments sum below zero? A negative amount is a refund sent as a payment."
row = "values.revenue == null || values.revenue >= 0"

[[check]]
name = "payments_fresh"
severity = "warn"
question = "Has the payments gateway stopped sending approvals?"
freshness = "10m"

# What the operator is told, and what `weir drill` rehearses: a partition that
# stops sending holds the watermark back (max_delay is 5s, so 8s means 3s of
# silence); resends, late bursts and skewed clocks raise the ledger's share.
[alerts]
max_watermark_age = "8s"
max_ledger_rate = 0.2
"#;

/// Where `paid_revenue`'s decision acts: the account service the demo runs
/// beside the server (weir.toml names its URL).
const TO_ACCOUNTS: &str = r#"
# Where the decision acts: the account service unlocks an account's paid
# features when a row with its payment arrives. weir.toml's
# [connections.account_service] holds its URL; each batch carries an
# Idempotency-Key, which the service applies once.
[[destination]]
name = "account_service"
kind = "http"
connection = "account_service"
batch = 500
"#;

/// On Kafka and Postgres, the rows also go to a typed table a BI tool reads.
const TO_WAREHOUSE: &str = r#"
# And a typed table in Postgres (weir_demo_tables.paid_revenue), upserted by
# key and minute, never moved back to an older change.
[[destination]]
name = "warehouse"
kind = "postgres"
connection = "warehouse"
table = "weir_demo_tables.paid_revenue"
"#;

const PLANS: &str = r#"# Each account's current plan: what the product shows and bills.
[pipeline]
name = "current_plan"
version = 1
owner = "billing-ops"
steward = "data-platform"
decision = "Which features an account may use right now"

[source]
topic = "plan_changes"
event_time = "changed_at"
key = ["account_id"]
event_id = "change_id"
max_delay = "5s"

[window]
type = "global"
early = true

[dedup]
horizon = "1h"

[[aggregate]]
name = "plan"
fn = "last"
field = "plan"
"#;

const INVITES: &str = r#"# Accepted teammate invitations per account per hour: seat growth for the sales team.
[pipeline]
name = "accepted_invites"
version = 1
owner = "growth"
steward = "data-platform"
decision = "Offer a larger plan to accounts adding seats quickly"

[source]
topic = "invitations"
event_time = "accepted_at"
key = ["account_id"]
event_id = "invite_id"
where = 'status == "accepted"'
max_delay = "10s"

[window]
type = "tumbling"
size = "1h"
allowed_lateness = "10m"
late = "revise"
early = true

[dedup]
horizon = "2h"

[[aggregate]]
name = "accepted"
fn = "count"
"#;

const CONFIG: &str = r#"idle_timeout = "5s"
checkpoint_interval = "100ms"

[topics.payments]
partitions = 2
key = "account_id"
retention = "1d"

[topics.plan_changes]
partitions = 1
key = "account_id"

[topics.invitations]
partitions = 1
key = "account_id"
"#;

pub struct LiveArgs {
    pub data: Option<PathBuf>,
    pub rate: u64,
    pub duration: Option<Duration>,
    pub listen: String,
    /// Kafka brokers and a Postgres URL: the same contracts on Kafka and Postgres.
    pub kafka: Option<String>,
    pub postgres: Option<String>,
}

pub fn demo(args: LiveArgs) -> Result<(), Failure> {
    let data = match &args.data {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("weir-demo-{}", std::process::id())),
    };
    let contracts_dir = data.join("contracts");
    std::fs::create_dir_all(&contracts_dir).map_err(|e| {
        Failure::usage(format!("cannot create {}: {e}; pass --data with a writable folder", contracts_dir.display()))
    })?;
    let accounts = Arc::new(
        AccountService::start()
            .map_err(|e| Failure::run(anyhow::anyhow!("cannot start the demo's account service: {e}")))?,
    );
    let on_kafka = args.kafka.is_some() && args.postgres.is_some();
    let payments_text = format!("{PAYMENTS}{TO_ACCOUNTS}{}", if on_kafka { TO_WAREHOUSE } else { "" });
    let mut contracts = Vec::new();
    for (file, text) in [
        ("paid_revenue.toml", payments_text.as_str()),
        ("current_plan.toml", PLANS),
        ("accepted_invites.toml", INVITES),
    ] {
        let path = contracts_dir.join(file);
        std::fs::write(&path, text).map_err(|e| Failure::usage(format!("cannot write {}: {e}", path.display())))?;
        contracts
            .push(Contract::parse(&path.display().to_string(), text).map_err(|e| Failure::contract(e.to_string()))?);
    }
    let config_path = data.join("weir.toml");
    let quote = |s: &str| serde_json::Value::from(s).to_string();
    let mut config_text =
        format!("{CONFIG}\n[connections.account_service]\nurl = {}\nallow_private = true\n", quote(&accounts.url));
    if let (Some(brokers), Some(url)) = (&args.kafka, &args.postgres) {
        // A demo starts afresh: offsets kept from another run would not match the topic.
        let mut client = weir_store::pg::connect(url).map_err(|e| {
            let url = weir_store::pg::redacted(url);
            Failure::usage(format!("cannot connect to Postgres at {url:?}: {e}; check --postgres"))
        })?;
        for schema in ["weir_demo", "weir_demo_tables"] {
            weir_store::pg::drop_schema(&mut client, schema)
                .map_err(|e| Failure::run(anyhow::anyhow!("cannot reset the schema {schema}: {e}")))?;
        }
        eprintln!("weir demo: results and checkpoints in Postgres schema weir_demo (emptied first), events on Kafka at {brokers}; paid_revenue's rows also in the table weir_demo_tables.paid_revenue");
        config_text.push_str(&format!(
            "\n[kafka]\nbrokers = {}\n\n[postgres]\nurl = {}\nschema = \"weir_demo\"\n\n[connections.warehouse]\nurl = {}\n",
            quote(brokers),
            quote(url),
            quote(url)
        ));
    }
    std::fs::write(&config_path, &config_text)
        .map_err(|e| Failure::usage(format!("cannot write {}: {e}", config_path.display())))?;
    let config = ServerConfig::parse(&config_path.display().to_string(), &config_text)
        .map_err(|e| Failure::contract(e.to_string()))?;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::run(anyhow::anyhow!("cannot start the runtime: {e}")))?;
    let listen = match std::net::TcpListener::bind(&args.listen) {
        Ok(l) => {
            drop(l);
            args.listen.clone()
        }
        Err(_) => "127.0.0.1:0".to_owned(),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let shutdown = {
        let stop = Arc::clone(&stop);
        async move {
            tokio::select! {
                _ = crate::serve::shutdown_signal() => {}
                _ = async { while !stop.load(Ordering::SeqCst) { tokio::time::sleep(Duration::from_millis(100)).await; } } => {}
            }
        }
    };
    // One token of each role, made before the server starts and printed.
    let tokens = crate::access::role_tokens(&data, "weir demo")?;
    let opts = weir_server::ServeOptions {
        data: data.clone(),
        contracts,
        config,
        listen,
        log_options: LogOptions::default(),
        tls: None,
    };
    crate::serve::small_pages();
    let server = std::thread::spawn(move || {
        runtime.block_on(weir_server::serve(
            opts,
            move |addr| {
                let _ = addr_tx.send(addr);
            },
            shutdown,
        ))
    });
    let addr = match addr_rx.recv_timeout(Duration::from_secs(60)) {
        Ok(addr) => addr,
        Err(_) => {
            let why = match server.join() {
                Ok(Err(e)) => format!("{e:#}"),
                _ => "it did not start".into(),
            };
            return Err(Failure::run(anyhow::anyhow!("the demo server failed: {why}")));
        }
    };
    let base = format!("http://{addr}");
    print_intro(&base, &data, args.rate, &tokens);
    let sent = Arc::new(AtomicU64::new(0));
    let producing = Arc::new(AtomicBool::new(true));
    let kept: Kept = Arc::new(std::sync::Mutex::new(Some(Vec::new())));
    let mut producer = Some({
        let (base, producing, sent, token) =
            (base.clone(), Arc::clone(&producing), Arc::clone(&sent), tokens.producer.clone());
        let (kept, accounts) = (Arc::clone(&kept), Arc::clone(&accounts));
        std::thread::spawn(move || produce(&base, &token, args.rate.max(1), (&producing, &sent), (&kept, &accounts)))
    });
    let started = Instant::now();
    let mut next_report = Instant::now() + Duration::from_secs(5);
    while !server.is_finished() {
        std::thread::sleep(Duration::from_millis(100));
        if args.duration.is_some_and(|d| started.elapsed() >= d) && !stop.load(Ordering::SeqCst) {
            // The payments system's side of the story, before the server stops.
            producing.store(false, Ordering::SeqCst);
            if let Some(p) = producer.take() {
                let _ = p.join();
            }
            if let Err(e) = reconcile_demo(&base, &data, &tokens, &kept) {
                eprintln!("weir demo: the reconciliation did not run: {e:#}");
            }
            stop.store(true, Ordering::SeqCst);
        }
        if Instant::now() >= next_report {
            next_report += Duration::from_secs(5);
            report(&base, &tokens.reader, sent.load(Ordering::Relaxed));
            eprintln!("  account service     {}", unlocks(&accounts.summary()));
        }
    }
    stop.store(true, Ordering::SeqCst);
    producing.store(false, Ordering::SeqCst);
    if let Some(p) = producer {
        let _ = p.join();
    }
    let served = server.join().map_err(|_| Failure::run(anyhow::anyhow!("the demo server panicked")))?;
    served.map_err(Failure::run)?;
    eprintln!("\nweir demo: the account service (paid_revenue's http destination): {}", unlocks(&accounts.summary()));
    let d = data.display();
    eprintln!(
        "\nweir demo: stopped after {:.0} s, {} events posted. Everything is in {d}:\n  weir.db (try: sqlite3 {d}/weir.db 'select row from results limit 5'), log/, contracts/, weir.toml\n  run it again with: weir serve --data {d} --contracts {d}/contracts --config {d}/weir.toml",
        started.elapsed().as_secs_f64(),
        sent.load(Ordering::Relaxed),
    );
    Ok(())
}

fn print_intro(base: &str, data: &Path, rate: u64, t: &crate::access::RoleTokens) {
    eprintln!("weir demo: a SaaS billing team's three decisions, served at {base}");
    eprintln!("  data (log, results in SQLite, contracts): {}", data.display());
    eprintln!("  posting about {rate} events/s: payments, plan changes, teammate invitations;");
    eprintln!("  a few per cent late, duplicated, corrected upstream or malformed\n");
    eprintln!("tokens (every request needs one; `weir token create --data {}` makes more):", data.display());
    eprintln!("  producer   {}", t.producer);
    eprintln!("  reader     {}", t.reader);
    eprintln!("  raw-reader {}", t.raw_reader);
    eprintln!("  operator   {}", t.operator);
    eprintln!("  admin      {}\n", t.admin);
    eprintln!("look at:");
    eprintln!("  {base}/#token={}    (the dashboard: live charts, latest rows, ledger, alerts, incidents)", t.admin);
    eprintln!("  curl -H 'Authorization: Bearer {}' {base}/v1/pipelines", t.reader);
    for p in ["paid_revenue", "current_plan", "accepted_invites"] {
        eprintln!("  {base}/v1/pipelines/{p}/results    .../changes?since=1    .../ledger    .../status    .../checks");
    }
    eprintln!("  {base}/v1/topics/payments/events?partition=0&from=0&limit=10    (raw-reader; audited)");
    eprintln!("  or: WEIR_TOKEN={} weir results paid_revenue --url {base}\n", t.reader);
    eprintln!("Ctrl-C stops it (after a last checkpoint).\n");
}

/// The account service's line: accounts unlocked, and the time from a new
/// account's first payment (posted) to its unlock.
fn unlocks(s: &Summary) -> String {
    let ms = |d: Option<Duration>| d.map_or("-".to_owned(), |d| format!("{} ms", d.as_millis()));
    format!(
        "{} accounts unlocked; approval to unlock of {} new accounts: p50 {}, p99 {}; {} batches, {} sent again and not applied twice",
        s.unlocked,
        s.latencies.len(),
        ms(s.quantile(0.5)),
        ms(s.quantile(0.99)),
        s.batches,
        s.repeated
    )
}

/// Posts every 100 ms a tenth of a second's worth of events, with event
/// times around now, until `stop`; with each tick, the first payment of a
/// new account, whose unlock the account service times.
fn produce(
    base: &str,
    token: &str,
    rate: u64,
    (producing, sent): (&AtomicBool, &AtomicU64),
    (kept, accounts): (&Kept, &AccountService),
) {
    let agent = crate::client::agent();
    // One payment in a hundred is a later version of a recent one: a corrected amount or a decline.
    let mut payments = PaymentStream::new(2026, 2_000, Profile::Realistic, true).with_corrections(10);
    let mut rng = Rng::new(7);
    let tick = Duration::from_millis(100);
    let mut next = Instant::now();
    let mut n = 0u64;
    let per_tick = (rate / 10).max(1);
    let stop = producing;
    while stop.load(Ordering::SeqCst) {
        let now = weir_log::now_ms();
        let (mut pay, mut plans, mut invites) = (String::new(), String::new(), String::new());
        for _ in 0..per_tick {
            n += 1;
            match rng.below(100) {
                0..=4 => plan_change(&mut rng, n, now, &mut plans),
                5..=14 => invitation(&mut rng, n, now, &mut invites),
                _ => payments.next(now, &mut pay),
            }
        }
        // A new account's first payment: approved now, posted now.
        let account = format!("new-{n:08}");
        pay.push_str(&format!(
            "{{\"payment_id\":\"pay-new-{n}\",\"account_id\":\"{account}\",\"amount\":29.00,\"currency\":\"EUR\",\"status\":\"approved\",\"approved_at\":\"{}\"}}\n",
            weir_engine::time::format_rfc3339_ms(now)
        ));
        accounts.approved(&account);
        for (topic, body) in [("payments", &pay), ("plan_changes", &plans), ("invitations", &invites)] {
            if body.is_empty() {
                continue;
            }
            let url = format!("{base}/v1/topics/{topic}/events");
            let mut wait = Duration::from_millis(50);
            // Retried until acknowledged: a 503 or a dropped connection loses nothing.
            let mut posted = false;
            while stop.load(Ordering::SeqCst) {
                if matches!(crate::client::post_batch(&agent, &url, body, Some(token)), Ok(true)) {
                    posted = true;
                    break;
                }
                std::thread::sleep(wait);
                wait = (wait * 2).min(Duration::from_secs(2));
            }
            if !posted {
                break;
            }
            sent.fetch_add(body.lines().count() as u64, Ordering::Relaxed);
            if topic == "payments" {
                keep(kept, body);
            }
        }
        next += tick;
        if let Some(rest) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(rest);
        } else {
            next = Instant::now();
        }
    }
}

/// The payments posted, for the payments system's export at the end
/// (`None` once the demo ran too long to keep them all).
type Kept = Arc<std::sync::Mutex<Option<Vec<String>>>>;

/// Payment lines kept for the export, at most.
const KEPT_MAX: usize = 2_000_000;

fn keep(kept: &Kept, body: &str) {
    let mut kept = kept.lock().unwrap_or_else(|e| e.into_inner());
    let full = kept.as_ref().is_some_and(|k| k.len() > KEPT_MAX);
    if full {
        *kept = None;
    } else if let Some(k) = kept.as_mut() {
        k.extend(body.lines().map(str::to_owned));
    }
}

/// The end of a demo: a late payment posted, then the payments system's
/// export (every payment posted, counted as a batch counts, with a refund
/// applied there only) written to `DATA/payments-export.csv`, and
/// `paid_revenue` reconciled against it: what the ledger explains, and
/// what it does not.
fn reconcile_demo(base: &str, data: &Path, tokens: &crate::access::RoleTokens, kept: &Kept) -> anyhow::Result<()> {
    let Some(mut lines) = kept.lock().unwrap_or_else(|e| e.into_inner()).take() else {
        anyhow::bail!("the demo ran too long to keep every payment for the export");
    };
    // A payment approved ten minutes ago reaches weir only now: too late for its window.
    let late = format!(
        "{{\"payment_id\":\"pay-late-demo\",\"account_id\":\"acct-00007\",\"amount\":42.00,\"currency\":\"EUR\",\"status\":\"approved\",\"approved_at\":\"{}\"}}",
        weir_engine::time::format_rfc3339_ms(weir_log::now_ms() - 600_000)
    );
    let agent = crate::client::agent();
    let url = format!("{base}/v1/topics/payments/events");
    if !matches!(crate::client::post_batch(&agent, &url, &format!("{late}\n"), Some(&tokens.producer)), Ok(true)) {
        anyhow::bail!("the late payment was not accepted");
    }
    lines.push(late);
    caught_up(base, &tokens.reader);
    let (export, refund) = payments_export(&lines)?;
    let path = data.join("payments-export.csv");
    std::fs::write(&path, export.join("\n") + "\n")?;
    let map = "key.account_id=account,window_start=minute,revenue=revenue,payments=payments";
    let target = format!("{base}/v1/pipelines/paid_revenue/reconcile");
    let query = [
        ("map", map),
        ("tolerance", "0.01"),
        ("format", "csv"),
        ("source", "payments-export.csv"),
        ("why", "weir demo: the month-end check"),
    ];
    let mut r = crate::client::with_token(agent.post(&target), Some(&tokens.operator))
        .query_pairs(query)
        .header("content-type", "text/csv")
        .send(&(export.join("\n") + "\n"))?;
    let body = r.body_mut().with_config().limit(1 << 30).read_to_string()?;
    let report: serde_json::Value = serde_json::from_str(&body)?;
    let text = crate::client::reconcile_text(&report);
    eprintln!("\nweir demo: the payments system's export ({}), with a late payment (acct-00007, ten minutes ago) and a refund applied there only ({refund}), against paid_revenue:", path.display());
    for (i, line) in text.lines().enumerate() {
        if i == 12 {
            eprintln!("  ... (GET {base}/v1/pipelines/paid_revenue/reconciliations/{} has them all)", report["id"]);
            break;
        }
        eprintln!("{line}");
    }
    eprintln!(
        "  the ledger explains the late payments (too_late); the refund is in no ledger: it is `unexplained`, so the owner was alerted.\n  again, with the server running: WEIR_TOKEN={} weir reconcile paid_revenue --against {} --map {map} --tolerance 0.01 --url {base}",
        tokens.operator,
        path.display()
    );
    Ok(())
}

/// Waits (at most 15 s) until `paid_revenue` has read everything posted.
fn caught_up(base: &str, token: &str) {
    let agent = crate::client::agent();
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut quiet = 0;
    while Instant::now() < deadline && quiet < 3 {
        std::thread::sleep(Duration::from_millis(300));
        let url = format!("{base}/v1/pipelines/paid_revenue/status");
        let Ok(mut r) = crate::client::with_token(agent.get(&url), Some(token)).call() else { continue };
        let s: serde_json::Value =
            serde_json::from_str(&r.body_mut().read_to_string().unwrap_or_default()).unwrap_or_default();
        quiet = if s["lag_records"] == 0 { quiet + 1 } else { 0 };
    }
}

/// The payments system's export: revenue and payments per account and
/// minute, as a batch counts every payment posted (late ones too), with
/// one refund of 25.00 applied in the payments system only; the export's
/// lines and which window the refund changed.
fn payments_export(lines: &[String]) -> anyhow::Result<(Vec<String>, String)> {
    let contract = Contract::parse("paid_revenue.toml", PAYMENTS).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut engine = weir_engine::Engine::new(&contract, weir_engine::Mode::Batch, 1)?;
    engine.read_one_partition();
    let mut out = weir_engine::Output::default();
    for (i, line) in lines.iter().enumerate() {
        engine.process(weir_engine::EventIn { partition: 0, offset: i as u64, bytes: line.as_bytes() }, &mut out);
        out.ledger.clear();
    }
    engine.finish(&mut out);
    let format = engine.format().clone();
    let mut export = vec!["account,minute,revenue,payments".to_owned()];
    let mut refund = String::new();
    let mut text = String::new();
    for row in &out.rows {
        text.clear();
        format.write_row(row, &mut text);
        let v: serde_json::Value = serde_json::from_str(&text)?;
        let (account, minute) =
            (v["key"]["account_id"].as_str().unwrap_or_default(), v["window_start"].as_str().unwrap_or_default());
        let mut revenue = v["values"]["revenue"].to_string();
        if refund.is_empty() && v["values"]["payments"].as_u64() >= Some(2) {
            if let Ok(r) = revenue.parse::<rust_decimal::Decimal>() {
                if r > rust_decimal::Decimal::new(50, 0) {
                    revenue = (r - rust_decimal::Decimal::new(25, 0)).to_string();
                    refund = format!("{account} at {minute}");
                }
            }
        }
        export.push(format!("{account},{minute},{revenue},{}", v["values"]["payments"]));
    }
    Ok((export, refund))
}

const PLANS_NAMES: [&str; 4] = ["free", "team", "business", "enterprise"];

fn plan_change(rng: &mut Rng, n: u64, now: i64, out: &mut String) {
    let account = rng.below(2_000);
    let plan = PLANS_NAMES[rng.below(4) as usize];
    // A few arrive late: the last change by event time still wins.
    let t = now - if rng.chance(50) { 20_000 + rng.below(60_000) as i64 } else { rng.below(2_000) as i64 };
    out.push_str(&format!(
        "{{\"change_id\":\"chg-{n}\",\"account_id\":\"acct-{account:05}\",\"plan\":\"{plan}\",\"changed_at\":\"{}\"}}\n",
        weir_engine::time::format_rfc3339_ms(t)
    ));
}

fn invitation(rng: &mut Rng, n: u64, now: i64, out: &mut String) {
    let account = rng.below(2_000);
    let status = match rng.below(10) {
        0..=5 => "accepted",
        6..=8 => "sent",
        _ => "expired",
    };
    let t = now - rng.below(3_000) as i64;
    let id = if rng.chance(20) && n > 10 { n - 1 - rng.below(5) } else { n };
    out.push_str(&format!(
        "{{\"invite_id\":\"inv-{id}\",\"account_id\":\"acct-{account:05}\",\"invitee\":\"user{n}@example.com\",\"status\":\"{status}\",\"accepted_at\":\"{}\"}}\n",
        weir_engine::time::format_rfc3339_ms(t)
    ));
}

/// One line per pipeline from its status endpoint.
fn report(base: &str, token: &str, sent: u64) {
    let agent = crate::client::agent();
    let mut line = format!("posted {sent:>8}");
    for p in ["paid_revenue", "current_plan", "accepted_invites"] {
        let url = format!("{base}/v1/pipelines/{p}/status");
        let Ok(mut r) = crate::client::with_token(agent.get(&url), Some(token)).call() else { continue };
        let Ok(body) = r.body_mut().read_to_string() else { continue };
        let Ok(s) = serde_json::from_str::<serde_json::Value>(&body) else { continue };
        let ledger: Vec<String> = s["ledger"]
            .as_object()
            .map(|m| m.iter().filter(|(_, v)| v.as_u64() != Some(0)).map(|(k, v)| format!("{k} {v}")).collect())
            .unwrap_or_default();
        line.push_str(&format!(
            "\n  {p:<17} in {:>7}  lag {:>5}  watermark {}  rows provisional {} settled {}  ledger: {}",
            s["events"]["read"],
            s["lag_records"],
            s["watermark"].as_str().map_or("-", |w| w.get(11..19).unwrap_or(w)),
            s["rows"]["provisional"],
            s["rows"]["settled"],
            if ledger.is_empty() { "none".to_owned() } else { ledger.join(", ") }
        ));
    }
    eprintln!("{line}");
}

//! Commands against a running `weir serve`: `weir produce` posts JSON lines
//! in batches and retries what was not acknowledged (each batch with its own
//! `Idempotency-Key`, so a retry appends nothing twice); `weir results` prints
//! a pipeline's current rows.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::Failure;

/// The client of the commands against a server: `https://` URLs are
/// checked against the usual public roots, or only against the PEM
/// certificates in the file `WEIR_CA_CERT` names (a server started with
/// `--tls-cert` and a certificate of its own).
pub fn agent() -> ureq::Agent {
    let mut config =
        ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(Duration::from_secs(60)));
    if let Some(roots) = ca_certs() {
        config = config.tls_config(ureq::tls::TlsConfig::builder().root_certs(roots).build());
    }
    config.build().into()
}

/// The certificates of `WEIR_CA_CERT`, when it names a readable PEM file.
fn ca_certs() -> Option<ureq::tls::RootCerts> {
    let path = std::env::var_os("WEIR_CA_CERT")?;
    let pem = match std::fs::read(&path) {
        Ok(pem) => pem,
        Err(e) => {
            eprintln!("weir: WEIR_CA_CERT {}: {e}; using the public roots", std::path::Path::new(&path).display());
            return None;
        }
    };
    let certs: Vec<ureq::tls::Certificate<'static>> = ureq::tls::parse_pem(&pem)
        .filter_map(|item| match item {
            Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
            _ => None,
        })
        .collect();
    Some(ureq::tls::RootCerts::from(certs))
}

/// The token commands against a server send: `WEIR_TOKEN`.
pub fn env_token() -> Option<String> {
    std::env::var("WEIR_TOKEN").ok().map(|t| t.trim().to_owned()).filter(|t| !t.is_empty())
}

/// A request with `token` as its bearer token.
pub fn with_token<B>(r: ureq::RequestBuilder<B>, token: Option<&str>) -> ureq::RequestBuilder<B> {
    match token {
        Some(t) => r.header("authorization", format!("Bearer {t}")),
        None => r,
    }
}

fn authed<B>(r: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
    with_token(r, env_token().as_deref())
}

/// One POST of a batch: `Ok(true)` acknowledged, `Ok(false)` worth retrying
/// (the server was unreachable or answered 503), `Err` a refusal to report.
pub fn post_batch(agent: &ureq::Agent, url: &str, body: &str, token: Option<&str>) -> Result<bool, String> {
    post_batch_keyed(agent, url, body, token, None)
}

/// [`post_batch`] with an `Idempotency-Key` (SPEC.md 7): sent again with
/// the same key, a batch whose answer was lost is appended once.
pub fn post_batch_keyed(
    agent: &ureq::Agent,
    url: &str,
    body: &str,
    token: Option<&str>,
    key: Option<&str>,
) -> Result<bool, String> {
    let mut request = with_token(agent.post(url), token).header("content-type", "application/x-ndjson");
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    match request.send(body) {
        Ok(mut r) => {
            let code = r.status().as_u16();
            let text = r.body_mut().read_to_string().unwrap_or_default();
            let busy = code == 409 && text.contains("being done now");
            match code {
                200 => Ok(true),
                502..=504 => Ok(false),
                409 if busy => Ok(false),
                _ => Err(format!("the server refused a batch ({code}): {}", error_text(&text))),
            }
        }
        Err(_) => Ok(false),
    }
}

fn error_text(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_owned))
        .unwrap_or_else(|| body.trim().to_owned())
}

pub struct ProduceArgs<'a> {
    /// Kafka brokers to produce to instead of `url`.
    pub kafka: Option<&'a str>,
    /// With `kafka`: the field whose value is the record key.
    pub key: Option<&'a str>,
    pub url: &'a str,
    pub topic: &'a str,
    pub file: &'a Path,
    pub batch: usize,
    pub give_up_after: Duration,
}

/// Posts every line of a file in batches; a batch that is not acknowledged
/// is sent again (with backoff) until it is, or until `give_up_after`.
pub fn produce(args: ProduceArgs<'_>) -> Result<(), Failure> {
    let reader: Box<dyn Read> = if args.file == Path::new("-") {
        Box::new(std::io::stdin())
    } else {
        Box::new(
            std::fs::File::open(args.file)
                .map_err(|e| Failure::usage(format!("cannot read {}: {e}; check the path", args.file.display())))?,
        )
    };
    let url = format!("{}/v1/topics/{}/events", args.url.trim_end_matches('/'), args.topic);
    let target = args.kafka.map_or_else(|| url.clone(), |b| format!("Kafka at {b}"));
    let to_kafka = match args.kafka {
        Some(brokers) => Some(KafkaTarget::new(brokers, args.topic, args.key)?),
        None => None,
    };
    let agent = agent();
    let token = env_token();
    let started = Instant::now();
    // One Idempotency-Key per batch, the same for each retry of it.
    let run = format!("{:x}{:x}", std::process::id(), weir_log::now_ms());
    let (mut sent, mut retries, mut batch, mut first_line) = (0u64, 0u64, String::new(), 1u64);
    let mut lines = BufReader::new(reader).lines();
    let mut n = 0u64;
    loop {
        let line = lines.next().transpose().map_err(|e| Failure::usage(format!("cannot read the input: {e}")))?;
        if let Some(line) = &line {
            n += 1;
            batch.push_str(line);
            batch.push('\n');
        }
        let full = n - first_line + 1 >= args.batch as u64;
        if !batch.is_empty() && (full || line.is_none()) {
            let count = batch.lines().filter(|l| !l.trim().is_empty()).count() as u64;
            let mut wait = Duration::from_millis(100);
            let since = Instant::now();
            loop {
                let sent_batch = match &to_kafka {
                    Some(k) => k.send(&batch, first_line),
                    None => {
                        let key = format!("weir-produce-{run}-{first_line}");
                        post_batch_keyed(&agent, &url, &batch, token.as_deref(), Some(&key))
                    }
                };
                match sent_batch {
                    Ok(true) => break,
                    Ok(false) if since.elapsed() < args.give_up_after => {
                        retries += 1;
                        std::thread::sleep(wait);
                        wait = (wait * 2).min(Duration::from_secs(5));
                    }
                    Ok(false) => {
                        return Err(Failure::run(anyhow::anyhow!(
                            "{target} did not acknowledge lines {first_line}-{n} for {:?}; {sent} events before them were acknowledged; start again from line {first_line}",
                            args.give_up_after
                        )))
                    }
                    Err(why) => {
                        return Err(Failure::run(anyhow::anyhow!(
                            "{why}\nlines {first_line}-{n} were not appended; {sent} events before them were acknowledged"
                        )))
                    }
                }
            }
            sent += count;
            batch.clear();
            first_line = n + 1;
        }
        if line.is_none() {
            break;
        }
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "weir: produced {sent} events to {} in {secs:.2} s ({:.0} events/s), {retries} retries",
        args.topic,
        sent as f64 / secs.max(1e-9)
    );
    Ok(())
}

/// `weir results`: the current rows of a pipeline, as a table or JSON lines.
pub fn results(url: &str, pipeline: &str, status: Option<&str>, json: bool) -> Result<(), Failure> {
    let base = url.trim_end_matches('/');
    let mut target = format!("{base}/v1/pipelines/{pipeline}/results?limit=100000");
    if let Some(s) = status {
        target.push_str(&format!("&status={s}"));
    }
    let body = get_all(&agent(), base, &target)?;
    if json {
        print!("{body}");
        return Ok(());
    }
    let rows: Vec<serde_json::Value> = body.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    print!("{}", table(&rows));
    Ok(())
}

/// Rows as an aligned table: key, window, status, revision, then each value.
pub fn table(rows: &[serde_json::Value]) -> String {
    let mut value_names: Vec<String> = Vec::new();
    for r in rows {
        if let Some(values) = r["values"].as_object() {
            for k in values.keys() {
                if !value_names.contains(k) {
                    value_names.push(k.clone());
                }
            }
        }
    }
    let mut head = vec!["key".to_owned(), "window".to_owned(), "status".to_owned(), "rev".to_owned()];
    head.extend(value_names.iter().cloned());
    let mut cells = vec![head];
    for r in rows {
        let key = match r["key"].as_object() {
            Some(k) if !k.is_empty() => {
                k.iter().map(|(k, v)| format!("{k}={}", plain(v))).collect::<Vec<_>>().join(" ")
            }
            _ => "-".into(),
        };
        let window = match (r["window_start"].as_str(), r["window_end"].as_str()) {
            (Some(s), Some(e)) => format!("{s} .. {}", e.get(11..).unwrap_or(e)),
            _ => "global".into(),
        };
        let mut line = vec![key, window, plain(&r["status"]), plain(&r["revision"])];
        line.extend(value_names.iter().map(|n| plain(&r["values"][n])));
        cells.push(line);
    }
    let widths: Vec<usize> =
        (0..cells[0].len()).map(|i| cells.iter().map(|c| c[i].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for c in &cells {
        let line: Vec<String> = c.iter().zip(&widths).map(|(s, w)| format!("{s:<w$}")).collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out.push_str(&format!("{} rows\n", rows.len()));
    out
}

fn plain(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// GETs a body the server answered with 200, else its error as a failure.
pub fn get_ok(agent: &ureq::Agent, url: &str) -> Result<String, Failure> {
    get_page(agent, url).map(|(body, _)| body)
}

/// One page of a list and the query of the next (`Weir-Next`, SPEC.md 7).
fn get_page(agent: &ureq::Agent, url: &str) -> Result<(String, Option<String>), Failure> {
    let mut r = authed(agent.get(url))
        .call()
        .map_err(|e| Failure::run(anyhow::anyhow!("cannot reach {url}: {e}; is weir serve running there?")))?;
    let code = r.status().as_u16();
    let next = r.headers().get("weir-next").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let body = r.body_mut().with_config().limit(1 << 30).read_to_string().unwrap_or_default();
    if code != 200 {
        return Err(Failure::run(anyhow::anyhow!("{} ({code})", error_text(&body))));
    }
    Ok((body, next))
}

/// Every page of a list, from `url` on, following `Weir-Next` (a path on `base`).
fn get_all(agent: &ureq::Agent, base: &str, url: &str) -> Result<String, Failure> {
    let (mut body, mut next) = get_page(agent, url)?;
    while let Some(path) = next.take() {
        let (more, after) = get_page(agent, &format!("{base}{path}"))?;
        body.push_str(&more);
        next = after;
    }
    Ok(body)
}

/// POSTs a JSON body; the answer as JSON when the server accepted it (2xx),
/// else its error as a failure.
fn post_json(url: &str, body: &serde_json::Value) -> Result<serde_json::Value, Failure> {
    let mut r = authed(agent().post(url))
        .header("content-type", "application/json")
        .send(&body.to_string())
        .map_err(|e| Failure::run(anyhow::anyhow!("cannot reach {url}: {e}; is weir serve running there?")))?;
    let code = r.status().as_u16();
    let text = r.body_mut().read_to_string().unwrap_or_default();
    if !(200..300).contains(&code) {
        return Err(Failure::run(anyhow::anyhow!("{} ({code})", error_text(&text))));
    }
    Ok(serde_json::from_str(&text).unwrap_or_default())
}

/// `weir status [PIPELINE]`: a one-screen health summary of each pipeline.
pub fn status(url: &str, pipeline: Option<&str>) -> Result<(), Failure> {
    let base = url.trim_end_matches('/');
    let agent = agent();
    let listed = get_ok(&agent, &format!("{base}/v1/pipelines"))?;
    let mut shown = 0;
    for line in listed.lines() {
        let p: serde_json::Value = serde_json::from_str(line).unwrap_or_default();
        let Some(name) = p["name"].as_str() else { continue };
        if pipeline.is_some_and(|want| want != name) {
            continue;
        }
        let s: serde_json::Value =
            serde_json::from_str(&get_ok(&agent, &format!("{base}/v1/pipelines/{name}/status"))?).unwrap_or_default();
        print!("{}", summary(&p, &s));
        shown += 1;
    }
    if shown == 0 {
        let want = pipeline.unwrap_or("any");
        return Err(Failure::run(anyhow::anyhow!("no pipeline {want:?} at {base}; see {base}/v1/pipelines")));
    }
    Ok(())
}

fn age(ms: &serde_json::Value) -> String {
    match ms.as_i64() {
        Some(ms) if ms < 1_000 => format!("{ms}ms"),
        Some(ms) if ms < 120_000 => format!("{:.1}s", ms as f64 / 1e3),
        Some(ms) => weir_contract::format_duration_ms(ms / 1000 * 1000),
        None => "-".into(),
    }
}

/// One pipeline's summary: identity, time, volume, output, ledger, alerts.
pub fn summary(p: &serde_json::Value, s: &serde_json::Value) -> String {
    let mut out = format!(
        "{} v{}  owner {}, steward {}\n  decision: {}\n",
        plain(&p["name"]),
        plain(&p["version"]),
        plain(&p["owner"]),
        plain(&p["steward"]),
        plain(&p["decision"])
    );
    if let Some(f) = s["failed"].as_str() {
        out.push_str(&format!("  STOPPED: {f}\n"));
    }
    out.push_str(&format!(
        "  watermark {} (age {})  lag {} records ({})  oldest unprocessed {}\n",
        plain(&s["watermark"]),
        age(&s["watermark_age_ms"]),
        plain(&s["lag_records"]),
        age(&s["lag_ms"]),
        age(&s["oldest_unprocessed_age_ms"])
    ));
    let e = &s["events"];
    out.push_str(&format!(
        "  events read {} counted {} filtered {} late-allowed {}\n",
        plain(&e["read"]),
        plain(&e["counted"]),
        plain(&e["filtered"]),
        plain(&e["late_allowed"])
    ));
    let r = &s["rows"];
    out.push_str(&format!(
        "  rows provisional {} settled {} retracted {}  open windows {}  checkpoint {} ago\n",
        plain(&r["provisional"]),
        plain(&r["settled"]),
        plain(&r["retracted"]),
        plain(&s["open_windows"]),
        age(&s["checkpoint_age_ms"])
    ));
    let ledger: Vec<String> = s["ledger"]
        .as_object()
        .map(|m| m.iter().filter(|(_, v)| v.as_u64() != Some(0)).map(|(k, v)| format!("{k} {v}")).collect())
        .unwrap_or_default();
    out.push_str(&format!(
        "  ledger: {}\n",
        if ledger.is_empty() { "nothing left out".into() } else { ledger.join(", ") }
    ));
    let alerts: Vec<String> = s["alerts"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|f| {
                    format!(
                        "FIRING {} observed {} (threshold {}) since {}",
                        plain(&f["alert"]),
                        plain(&f["observed"]),
                        plain(&f["threshold"]),
                        plain(&f["since"])
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    out.push_str(&format!("  alerts: {}\n", if alerts.is_empty() { "none".into() } else { alerts.join("; ") }));
    for d in s["destinations"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "  destination {} ({}): {}  at seq {}, {} changes behind ({}s)\n",
            plain(&d["name"]),
            plain(&d["kind"]),
            plain(&d["state"]),
            plain(&d["position"]),
            plain(&d["lag_changes"]),
            plain(&d["lag_seconds"])
        ));
    }
    out
}

/// `weir pause|resume PIPELINE --who --why`: an operator action, kept in the audit log.
/// Where a replay starts: an offset of every partition, and an event time
/// before which windows keep their published rows.
#[derive(Default)]
pub struct ReplayFrom {
    pub offset: Option<u64>,
    pub time: Option<String>,
}

pub fn act(
    url: &str,
    pipeline: &str,
    action: &str,
    who: Option<&str>,
    why: &str,
    from: ReplayFrom,
) -> Result<(), Failure> {
    let target = format!("{}/v1/pipelines/{pipeline}/{action}", url.trim_end_matches('/'));
    let body = serde_json::json!({ "who": who, "why": why, "from_offset": from.offset, "from_time": from.time });
    let v = post_json(&target, &body)?;
    if action == "replay" {
        eprintln!("weir: {pipeline} replaying from the log (audit entry {}); watch `weir status`", plain(&v["audit"]));
        return Ok(());
    }
    eprintln!(
        "weir: {pipeline} {} (audit entry {}){}",
        if action == "pause" {
            "paused: rows are held until resume; processing goes on"
        } else {
            "resumed: held rows are published"
        },
        plain(&v["audit"]),
        if v["was_paused"] == (action == "pause") { "; it already was" } else { "" }
    );
    Ok(())
}

/// `weir tail`: the change stream as server-sent events, each change's line
/// printed as it comes; a dropped connection is taken up again after a
/// second from the last change printed (`Last-Event-ID`). Without `since`
/// it starts at the stream's next change.
pub fn tail(
    url: &str,
    pipeline: &str,
    (since, version): (Option<i64>, Option<u32>),
    limit: Option<u64>,
) -> Result<(), Failure> {
    let base = url.trim_end_matches('/');
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let mut from = match since {
        Some(s) => s,
        None => next_seq(&agent, base, pipeline)?,
    };
    let mut printed = 0u64;
    let mut out = std::io::stdout().lock();
    loop {
        let mut target = format!("{base}/v1/pipelines/{pipeline}/changes?since={from}");
        if let Some(v) = version {
            target.push_str(&format!("&version={v}"));
        }
        let answer = authed(agent.get(&target)).header("accept", "text/event-stream").call();
        let mut answer = match answer {
            Ok(a) => a,
            Err(e) => {
                eprintln!("weir: cannot reach {base} ({e}); trying again in 1 s");
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
        };
        let code = answer.status().as_u16();
        if code != 200 {
            let body = answer.body_mut().read_to_string().unwrap_or_default();
            if code == 503 {
                eprintln!("weir: {} ({code}); trying again in 1 s", error_text(&body));
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
            return Err(Failure::run(anyhow::anyhow!("{} ({code})", error_text(&body))));
        }
        let reader = BufReader::new(answer.into_body().into_reader());
        for line in reader.lines() {
            let Ok(line) = line else { break };
            if let Some(data) = line.strip_prefix("data:") {
                let data = data.strip_prefix(' ').unwrap_or(data);
                std::io::Write::write_all(&mut out, format!("{data}\n").as_bytes())
                    .map_err(|e| Failure::run(anyhow::anyhow!("cannot write the output: {e}")))?;
                let _ = std::io::Write::flush(&mut out);
                if let Some(seq) = seq_in(data) {
                    from = seq + 1;
                }
                printed += 1;
                if limit.is_some_and(|l| printed >= l) {
                    return Ok(());
                }
            }
        }
        eprintln!("weir: the feed of {pipeline} closed; going on from {from} in 1 s");
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The `seq` of a change's line.
fn seq_in(line: &str) -> Option<i64> {
    serde_json::from_str::<serde_json::Value>(line).ok()?["seq"].as_i64()
}

/// The seq after the newest change of the stream (1 when it is empty).
fn next_seq(agent: &ureq::Agent, base: &str, pipeline: &str) -> Result<i64, Failure> {
    let mut since = 1;
    loop {
        let (body, next) =
            get_page(agent, &format!("{base}/v1/pipelines/{pipeline}/changes?since={since}&limit=100000"))?;
        if let Some(seq) = body.lines().last().and_then(seq_in) {
            since = seq + 1;
        }
        if next.is_none() {
            return Ok(since);
        }
    }
}

/// `weir resume PIPELINE --destination NAME --why`: the refused batch is sent again.
pub fn resume_destination(
    url: &str,
    pipeline: &str,
    destination: &str,
    who: Option<&str>,
    why: &str,
) -> Result<(), Failure> {
    let target = format!("{}/v1/pipelines/{pipeline}/destinations/{destination}/resume", url.trim_end_matches('/'));
    let v = post_json(&target, &serde_json::json!({ "who": who, "why": why }))?;
    eprintln!(
        "weir: {pipeline}: destination {destination} resumed: the refused batch is sent again (audit entry {})",
        plain(&v["audit"])
    );
    Ok(())
}

/// `weir promote PIPELINE N --why` (`Some(N)`) or `weir rollback PIPELINE --why`.
pub fn switch(url: &str, pipeline: &str, version: Option<u32>, who: Option<&str>, why: &str) -> Result<(), Failure> {
    let action = if version.is_some() { "promote" } else { "rollback" };
    let target = format!("{}/v1/pipelines/{pipeline}/{action}", url.trim_end_matches('/'));
    let body = serde_json::json!({ "version": version, "who": who, "why": why });
    let v = post_json(&target, &body)?;
    eprintln!(
        "weir: {pipeline}: version {} is live (was {}); the change stream marks it at seq {} (audit entry {})",
        plain(&v["to"]),
        plain(&v["from"]),
        plain(&v["seq"]),
        plain(&v["audit"])
    );
    Ok(())
}

/// `weir diff PIPELINE A B [--format json]`.
pub fn diff(url: &str, pipeline: &str, (a, b): (u32, u32), format: &str) -> Result<(), Failure> {
    if format != "text" && format != "json" {
        return Err(Failure::usage(format!("--format {format:?}: use text or json")));
    }
    let target = format!("{}/v1/pipelines/{pipeline}/diff?a={a}&b={b}", url.trim_end_matches('/'));
    let body = get_ok(&agent(), &target)?;
    if format == "json" {
        print!("{body}");
        return Ok(());
    }
    let d: serde_json::Value =
        serde_json::from_str(&body).map_err(|e| Failure::run(anyhow::anyhow!("{target} did not answer JSON: {e}")))?;
    print!("{}", diff_text(&d));
    Ok(())
}

/// What `weir reconcile PIPELINE --against FILE` asks for.
pub struct ReconcileAsk<'a> {
    pub export: &'a std::path::Path,
    pub map: &'a str,
    pub tolerance: &'a str,
    pub why: &'a str,
    pub version: Option<u32>,
}

/// `weir reconcile PIPELINE --against FILE`: sends the export to the
/// server, which compares, keeps and answers the report; prints it. Exit 1
/// when a window's unexplained difference is beyond the tolerance.
pub fn reconcile_against(url: &str, pipeline: &str, a: &ReconcileAsk<'_>, as_json: bool) -> Result<(), Failure> {
    let body = std::fs::read(a.export)
        .map_err(|e| Failure::usage(format!("cannot read {}: {e}; check the path", a.export.display())))?;
    let path = a.export.display().to_string();
    let format = match weir_runtime::reconcile::ExportFormat::of_path(&path) {
        weir_runtime::reconcile::ExportFormat::JsonLines => "jsonl",
        weir_runtime::reconcile::ExportFormat::Csv => "csv",
    };
    let name = a.export.file_name().map_or(path.clone(), |n| n.to_string_lossy().into_owned());
    let base = url.trim_end_matches('/');
    let mut target = format!("{base}/v1/pipelines/{pipeline}/reconcile");
    let mut query =
        vec![("map", a.map.to_owned()), ("tolerance", a.tolerance.to_owned()), ("format", format.to_owned())];
    query.extend([("source", name), ("why", a.why.to_owned())]);
    if let Some(v) = a.version {
        query.push(("version", v.to_string()));
    }
    let mut r = authed(agent().post(&target))
        .query_pairs(query.iter().map(|(k, v)| (*k, v.as_str())))
        .header("content-type", if format == "csv" { "text/csv" } else { "application/x-ndjson" })
        .send(&body[..])
        .map_err(|e| Failure::run(anyhow::anyhow!("cannot reach {target}: {e}; is weir serve running there?")))?;
    target.clear();
    let code = r.status().as_u16();
    let text = r.body_mut().with_config().limit(1 << 30).read_to_string().unwrap_or_default();
    if (400..500).contains(&code) {
        return Err(Failure::usage(format!("{}: {} ({code})", a.export.display(), error_text(&text))));
    }
    if code != 200 {
        return Err(Failure::run(anyhow::anyhow!("{} ({code})", error_text(&text))));
    }
    let report: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    if as_json {
        print!("{text}");
    } else {
        print!("{}", reconcile_text(&report));
    }
    if report["verdict"] == "fail" {
        return Err(Failure::run(anyhow::anyhow!(
            "{} windows differ beyond the tolerance with no cause in the ledger (reconciliation {}); the owner was alerted",
            plain(&report["windows"]["unexplained"]),
            plain(&report["id"])
        )));
    }
    Ok(())
}

/// A reconciliation report, readable.
pub fn reconcile_text(r: &serde_json::Value) -> String {
    let w = &r["windows"];
    let mut out = format!(
        "reconciliation {} of {} version {} against {}, windows from {} to {}, tolerance {}: {}\n",
        plain(&r["id"]),
        plain(&r["pipeline"]),
        plain(&r["version"]),
        plain(&r["source"]),
        plain(&r["from"]),
        plain(&r["to"]),
        plain(&r["tolerance"]),
        plain(&r["verdict"])
    );
    out.push_str(&format!(
        "  windows: {} matched, {} differing, {} missing in weir, {} missing in the export; {} unexplained\n",
        plain(&w["matched"]),
        plain(&w["differing"]),
        plain(&w["missing_in_weir"]),
        plain(&w["missing_in_export"]),
        plain(&w["unexplained"])
    ));
    for (name, t) in r["totals"].as_object().into_iter().flatten() {
        out.push_str(&format!(
            "  {name}: {} in the export, {} in weir; difference {}, of which the ledger explains {} and {} is unexplained\n",
            plain(&t["export"]),
            plain(&t["weir"]),
            plain(&t["difference"]),
            plain(&t["accounted"]),
            plain(&t["unexplained"])
        ));
    }
    for d in r["differences"].as_array().into_iter().flatten() {
        let causes: Vec<String> = d["causes"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(reason, c)| format!("{reason} x{} {}", plain(&c["events"]), c["values"]))
            .collect();
        out.push_str(&format!(
            "  {} {} {}: difference {}; {}; unexplained {}\n",
            d["key"],
            plain(&d["window_start"]),
            plain(&d["verdict"]),
            d["difference"],
            if causes.is_empty() {
                "no cause in the ledger".to_owned()
            } else {
                format!("causes {}", causes.join(", "))
            },
            d["unexplained"]
        ));
    }
    out
}

/// What `weir backfill` asks for.
pub struct BackfillAsk<'a> {
    pub from: &'a str,
    pub to: &'a str,
    pub why: &'a str,
    pub who: Option<&'a str>,
    pub version: Option<u32>,
}

/// `weir backfill`: asks for the run, waits until it is done or failed,
/// prints its report (exit 1 when it failed).
pub fn backfill(url: &str, pipeline: &str, a: &BackfillAsk<'_>, format: &str) -> Result<(), Failure> {
    if format != "text" && format != "json" {
        return Err(Failure::usage(format!("--format {format:?}: use text or json")));
    }
    let base = url.trim_end_matches('/');
    let mut body = serde_json::json!({ "from": a.from, "to": a.to, "why": a.why });
    if let Some(who) = a.who {
        body["who"] = who.into();
    }
    if let Some(v) = a.version {
        body["version"] = v.into();
    }
    let asked = post_json(&format!("{base}/v1/pipelines/{pipeline}/backfill"), &body)?;
    let Some(id) = asked["backfill"].as_i64() else {
        return Err(Failure::run(anyhow::anyhow!("the server did not say which backfill it stored: {asked}")));
    };
    let target = format!("{base}/v1/pipelines/{pipeline}/backfills/{id}");
    let agent = agent();
    loop {
        let text = get_ok(&agent, &target)?;
        let run: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Failure::run(anyhow::anyhow!("{target} did not answer JSON: {e}")))?;
        match run["state"].as_str() {
            Some("done") => {
                if format == "json" {
                    print!("{text}");
                } else {
                    print!("{}", backfill_text(&run));
                }
                return Ok(());
            }
            Some("failed") => {
                return Err(Failure::run(anyhow::anyhow!("backfill {id} failed: {}", plain(&run["error"]))));
            }
            _ => std::thread::sleep(std::time::Duration::from_millis(200)),
        }
    }
}

/// A backfill's report, readable.
pub fn backfill_text(run: &serde_json::Value) -> String {
    let r = &run["report"];
    let mut out = format!(
        "backfill {} of {} version {}, windows starting from {} to {} (settled through {})\n",
        plain(&run["id"]),
        plain(&run["pipeline"]),
        plain(&run["version"]),
        plain(&run["from"]),
        plain(&run["to"]),
        plain(&r["settled_through"])
    );
    out.push_str(&format!(
        "  {} events read; {} windows checked, {} corrected ({} new, {} withdrawn), {} not settled and left out\n",
        plain(&r["events_read"]),
        plain(&r["windows_checked"]),
        plain(&r["windows_corrected"]),
        plain(&r["windows_new"]),
        plain(&r["windows_withdrawn"]),
        plain(&r["windows_unsettled"])
    ));
    for (name, d) in r["difference"].as_object().into_iter().flatten() {
        out.push_str(&format!("  {name}: {} corrected in total\n", plain(d)));
    }
    for (reason, c) in r["causes"].as_object().into_iter().flatten() {
        let amounts: Vec<String> =
            c["amounts"].as_object().into_iter().flatten().map(|(k, v)| format!("{k} {}", plain(v))).collect();
        out.push_str(&format!("  cause {reason}: {} events carrying {}\n", plain(&c["events"]), amounts.join(", ")));
    }
    for w in r["windows"].as_array().into_iter().flatten().take(20) {
        let before = if w["before"].is_null() {
            "nothing published".to_owned()
        } else {
            format!("{} ({} events)", w["before"]["values"], plain(&w["before"]["events"]))
        };
        out.push_str(&format!(
            "  {} {}: {} -> {} ({} events), revision {}\n",
            w["key"],
            plain(&w["window_start"]),
            before,
            w["after"]["values"],
            plain(&w["after"]["events"]),
            plain(&w["revision"])
        ));
    }
    out
}

/// A diff report, readable.
pub fn diff_text(d: &serde_json::Value) -> String {
    let w = &d["windows"];
    let mut out = format!(
        "{} version {} against version {}, windows from {} to {}\n",
        plain(&d["pipeline"]),
        plain(&d["a"]),
        plain(&d["b"]),
        plain(&d["from"]),
        plain(&d["to"])
    );
    out.push_str(&format!(
        "  windows: {} matched, {} differing, {} only in {}, {} only in {}\n",
        plain(&w["matched"]),
        plain(&w["differing"]),
        plain(&w["only_in_a"]),
        plain(&d["a"]),
        plain(&w["only_in_b"]),
        plain(&d["b"])
    ));
    for (name, t) in d["totals"].as_object().into_iter().flatten() {
        out.push_str(&format!(
            "  {name}: {} in {}, {} in {} (difference {})\n",
            plain(&t["a"]),
            plain(&d["a"]),
            plain(&t["b"]),
            plain(&d["b"]),
            plain(&t["difference"])
        ));
    }
    let largest = d["largest_differences"].as_array().cloned().unwrap_or_default();
    if !largest.is_empty() {
        out.push_str("  largest differences:\n");
    }
    for x in largest {
        out.push_str(&format!(
            "    {} {}..{}: {} -> {} (difference {})\n",
            x["key"],
            plain(&x["window_start"]),
            plain(&x["window_end"]),
            x["a"]["values"],
            x["b"]["values"],
            plain(&x["difference"])
        ));
    }
    out
}

/// `weir annotate PIPELINE --from --to --note --who`: a note on an event-time range.
pub fn annotate(
    url: &str,
    pipeline: &str,
    (from, to): (&str, &str),
    note: &str,
    who: Option<&str>,
) -> Result<(), Failure> {
    let target = format!("{}/v1/pipelines/{pipeline}/annotations", url.trim_end_matches('/'));
    let body = serde_json::json!({ "who": who, "from": from, "to": to, "note": note });
    let v = post_json(&target, &body)?;
    eprintln!(
        "weir: annotation {} on {pipeline} from {from} to {to}; rows of windows in that range carry it",
        plain(&v["annotation"])
    );
    Ok(())
}

/// `weir advise PIPELINE [--format json]`: the lateness advisor.
pub fn advise(url: &str, pipeline: &str, format: &str) -> Result<(), Failure> {
    if format != "text" && format != "json" {
        return Err(Failure::usage(format!("--format {format:?}: use text or json")));
    }
    let target = format!("{}/v1/pipelines/{pipeline}/advice", url.trim_end_matches('/'));
    let body = get_ok(&agent(), &target)?;
    if format == "json" {
        print!("{body}");
        return Ok(());
    }
    let a: serde_json::Value = serde_json::from_str(&body).map_err(Failure::run)?;
    print!("{}", advice_text(&a));
    Ok(())
}

pub fn advice_text(a: &serde_json::Value) -> String {
    let (p, c) = (&a["period"], &a["current"]);
    let pct = |v: &serde_json::Value| format!("{:.3}%", v.as_f64().unwrap_or(0.0) * 100.0);
    let mut out = format!(
        "{} v{}: {} events observed from {} to {}\nnow: allowed_lateness = {} (late = {}): {} too late, {} bytes of state\n",
        plain(&a["pipeline"]),
        plain(&a["version"]),
        plain(&p["events"]),
        plain(&p["from"]),
        plain(&p["to"]),
        plain(&c["allowed_lateness"]),
        plain(&c["late"]),
        pct(&c["too_late_rate"]),
        plain(&c["state_bytes"]),
    );
    if let Some(note) = a["note"].as_str() {
        out.push_str(note);
        out.push('\n');
    }
    for s in a["suggestions"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "for at most {} too late: allowed_lateness = {:<10} ({} observed; {} more events counted, {} extra revisions, state x{:.2} = {} bytes)\n",
            pct(&s["target_too_late_rate"]),
            plain(&s["allowed_lateness"]),
            pct(&s["too_late_rate"]),
            plain(&s["more_events_counted"]),
            plain(&s["extra_revisions"]),
            s["state_factor"].as_f64().unwrap_or(1.0),
            plain(&s["state_bytes"]),
        ));
    }
    out
}

/// `weir incident open|note|mitigate|resolve`: `step` names the incident and the step; none opens one.
pub fn incident(url: &str, pipeline: &str, step: Option<(i64, &str)>, body: serde_json::Value) -> Result<(), Failure> {
    let base = format!("{}/v1/pipelines/{pipeline}/incidents", url.trim_end_matches('/'));
    let target = match step {
        None => base,
        Some((id, what)) => format!("{base}/{id}/{what}"),
    };
    let v = post_json(&target, &body)?;
    println!("{}", plain(&v["id"]));
    eprintln!(
        "weir: incident {} of {pipeline} is {} (owner {}; audit entry {})",
        plain(&v["id"]),
        plain(&v["status"]),
        plain(&v["owner"]),
        plain(&v["audit"])
    );
    Ok(())
}

/// `weir incident show PIPELINE [ID]`: the newest incidents, or one with its timeline.
pub fn incidents(url: &str, pipeline: &str, id: Option<i64>) -> Result<(), Failure> {
    let base = format!("{}/v1/pipelines/{pipeline}/incidents", url.trim_end_matches('/'));
    let line = |c: &serde_json::Value| {
        format!(
            "#{} {} {} opened {} by {} (owner {}){}",
            plain(&c["id"]),
            plain(&c["status"]),
            plain(&c["title"]),
            plain(&c["opened_at"]),
            plain(&c["opened_by"]),
            plain(&c["owner"]),
            c["proof"].as_str().map(|p| format!("; proof: {p}")).unwrap_or_default()
        )
    };
    match id {
        None => {
            for l in get_ok(&agent(), &base)?.lines() {
                let c: serde_json::Value = serde_json::from_str(l).map_err(Failure::run)?;
                println!("{}", line(&c));
            }
        }
        Some(id) => {
            let c: serde_json::Value =
                serde_json::from_str(&get_ok(&agent(), &format!("{base}/{id}"))?).map_err(Failure::run)?;
            println!("{}", line(&c));
            for e in c["timeline"].as_array().into_iter().flatten() {
                println!("  {} {:<14} {}: {}", plain(&e["at"]), plain(&e["kind"]), plain(&e["who"]), plain(&e["text"]));
            }
        }
    }
    Ok(())
}

/// `weir produce --kafka`: batches produced straight to a Kafka topic.
struct KafkaTarget {
    producer: rdkafka::producer::FutureProducer,
    runtime: tokio::runtime::Runtime,
    topic: String,
    key: Option<String>,
}

impl KafkaTarget {
    fn new(brokers: &str, topic: &str, key: Option<&str>) -> Result<KafkaTarget, Failure> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Failure::run(anyhow::anyhow!("cannot start a runtime: {e}")))?;
        let producer = weir_runtime::kafka::producer(brokers, None)
            .map_err(|e| Failure::usage(format!("cannot make a Kafka producer for {brokers}: {e}")))?;
        Ok(KafkaTarget { producer, runtime, topic: topic.to_owned(), key: key.map(str::to_owned) })
    }

    /// `Ok(true)` when every line was acknowledged, `Ok(false)` to try again,
    /// `Err` for a line that is not JSON (nothing of the batch is sent).
    fn send(&self, batch: &str, first_line: u64) -> Result<bool, String> {
        let mut records = Vec::new();
        let mut keys = Vec::new();
        for (i, line) in batch.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let key = weir_runtime::kafka::key_of_line(line, self.key.as_deref()).map_err(|e| {
                format!("line {} is not JSON ({e}); send one JSON object per line", first_line + i as u64)
            })?;
            records.push((0, line.as_bytes().to_vec()));
            keys.push(key);
        }
        let sent = self.runtime.block_on(weir_runtime::kafka::produce(
            &self.producer,
            &self.topic,
            records.iter().map(|(_, p)| &p[..]),
            &keys,
            None,
        ));
        match sent {
            Ok(_) => Ok(true),
            Err(why) => {
                eprintln!("weir: {why}");
                Ok(false)
            }
        }
    }
}

/// What `weir drill` asks.
pub struct DrillAsk<'a> {
    pub scenario: &'a str,
    pub why: &'a str,
    pub fault: Option<&'a str>,
    pub recover: Option<&'a str>,
}

/// `weir drill SCENARIO --pipeline P`: asks the server for a drill, waits
/// for its verdict and prints the report; a drill that failed exits 1.
pub fn drill(url: &str, pipeline: &str, a: &DrillAsk<'_>, format: &str) -> Result<(), Failure> {
    if format != "text" && format != "json" {
        return Err(Failure::usage(format!("--format {format:?}: use text or json")));
    }
    let base = url.trim_end_matches('/');
    let mut body = serde_json::json!({ "scenario": a.scenario, "why": a.why });
    if let Some(f) = a.fault {
        body["for"] = f.into();
    }
    if let Some(r) = a.recover {
        body["recover"] = r.into();
    }
    let asked = post_json(&format!("{base}/v1/pipelines/{pipeline}/drills"), &body)?;
    let Some(id) = asked["drill"].as_i64() else {
        return Err(Failure::run(anyhow::anyhow!("the server did not say which drill it started: {asked}")));
    };
    eprintln!("drill {id} ({}) running on {pipeline}", a.scenario);
    let target = format!("{base}/v1/pipelines/{pipeline}/drills/{id}");
    let agent = agent();
    loop {
        let text = get_ok(&agent, &target)?;
        let d: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Failure::run(anyhow::anyhow!("{target} did not answer JSON: {e}")))?;
        match d["verdict"].as_str() {
            Some("running") | None => std::thread::sleep(std::time::Duration::from_millis(500)),
            Some(verdict) => {
                if format == "json" {
                    print!("{text}");
                } else {
                    print!("{}", drill_text(&d));
                }
                if verdict == "pass" {
                    return Ok(());
                }
                let failures: Vec<String> =
                    d["report"]["failures"].as_array().into_iter().flatten().map(plain).collect();
                return Err(Failure::run(anyhow::anyhow!("drill {id} failed: {}", failures.join("; "))));
            }
        }
    }
}

/// A drill's report, readable.
pub fn drill_text(d: &serde_json::Value) -> String {
    let r = &d["report"];
    let mut out = format!(
        "drill {} on {} v{}: {} ({})\nfault: {}\n",
        plain(&d["id"]),
        plain(&d["pipeline"]),
        plain(&d["version"]),
        plain(&d["scenario"]),
        plain(&d["verdict"]),
        plain(&r["fault"]["what"]),
    );
    let alerts = r["alerts"].as_array().cloned().unwrap_or_default();
    if alerts.is_empty() {
        out.push_str("alerts: none fired\n");
    }
    for a in &alerts {
        let fired = match a["fired_after_ms"].as_i64() {
            Some(ms) => format!("fired {:.1} s after the fault began", ms as f64 / 1000.0),
            None => "was firing before the fault".into(),
        };
        let resolved = match a["resolved_after_ms"].as_i64() {
            Some(ms) => format!("resolved {:.1} s after it began", ms as f64 / 1000.0),
            None => "still firing at the drill's end".into(),
        };
        out.push_str(&format!(
            "alert {}: {fired} (observed {}, threshold {}), {resolved}\n",
            plain(&a["alert"]),
            plain(&a["observed"]),
            plain(&a["threshold"])
        ));
    }
    let grown: Vec<String> = r["ledger_grown"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(reason, n)| format!("{reason} +{}", plain(n)))
        .collect();
    out.push_str(&format!("ledger: {}\n", if grown.is_empty() { "no reason grew".into() } else { grown.join(", ") }));
    let p = &r["published"];
    out.push_str(&if p["unchanged"] == true {
        format!("published numbers: unchanged ({} rows of the live version)\n", plain(&p["rows_after"]))
    } else {
        format!(
            "published numbers: {} rows before, {} after (the live topic {})\n",
            plain(&p["rows_before"]),
            plain(&p["rows_after"]),
            if p["live_topic_grew"] == true { "got events meanwhile" } else { "got no event" }
        )
    });
    out.push_str(&match r["recovery_ms"].as_i64() {
        Some(ms) => format!("recovery: {:.1} s after the fault ended\n", ms as f64 / 1000.0),
        None => "recovery: not within the drill's wait\n".into(),
    });
    for f in r["failures"].as_array().into_iter().flatten() {
        out.push_str(&format!("FAILED: {}\n", plain(f)));
    }
    out
}

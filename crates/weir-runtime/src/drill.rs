//! Failure drills (issue 18): the parts that touch a log and a runner.
//!
//! A drill runs the live contract in a *shadow*: a copy of the pipeline's
//! topic (`{topic}.drill-{id}`, on the embedded log or on Kafka), read by a
//! runner of its own whose checkpoints, rows and ledger go to a store of
//! its own (a SQLite file under `DATA/drills/`, or the Postgres schema
//! `{schema}_drill_{id}`), so nothing a drill does reaches the live
//! version's rows, change stream or sink. The drill's events are made from
//! the topic's own records ([`event_like`]): the same keys and fields, with
//! the event time and id the scenario needs. `weir-server::drills` decides
//! what to send when and judges what the operator would have seen.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::Value;
use weir_contract::{Contract, ServerConfig, TimeFormat, WindowKind};
use weir_log::Log;

use crate::runner::{Connected, Run, Runner};
use crate::{Status, SystemClock};

/// What a drill rehearses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// One partition silent for a while, then a burst of what it held back.
    DelayedPartition,
    /// A burst of events sent again.
    Duplicates,
    /// Events beyond the allowed lateness.
    LateBurst,
    /// Events dated far ahead of the clock.
    ClockSkew,
    /// The pipeline killed without a last checkpoint, then recovered.
    Restart,
    /// Every destination's receiver refusing deliveries, then taking them again.
    DestinationDown,
}

pub const SCENARIOS: &[Scenario] = &[
    Scenario::DelayedPartition,
    Scenario::Duplicates,
    Scenario::LateBurst,
    Scenario::ClockSkew,
    Scenario::Restart,
    Scenario::DestinationDown,
];

impl Scenario {
    pub fn parse(text: &str) -> Result<Scenario, String> {
        SCENARIOS.iter().copied().find(|s| s.name() == text).ok_or_else(|| {
            let names: Vec<&str> = SCENARIOS.iter().map(|s| s.name()).collect();
            format!("no drill scenario {text:?}; one of {}", names.join(", "))
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Scenario::DelayedPartition => "delayed-partition",
            Scenario::Duplicates => "duplicates",
            Scenario::LateBurst => "late-burst",
            Scenario::ClockSkew => "clock-skew",
            Scenario::Restart => "restart",
            Scenario::DestinationDown => "destination-down",
        }
    }

    /// The `[alerts]` that would tell an operator of this failure: the
    /// drill passes when one of them fires. A restart needs none: it passes
    /// when the pipeline recovers.
    pub fn alerts(self) -> &'static [&'static str] {
        match self {
            // The watermark held back by the silent partition; once the
            // partition is idle, its burst arrives too late.
            Scenario::DelayedPartition => &["max_watermark_age", "max_ledger_rate"],
            Scenario::Duplicates | Scenario::LateBurst | Scenario::ClockSkew => &["max_ledger_rate"],
            Scenario::Restart => &[],
            Scenario::DestinationDown => &["max_destination_lag"],
        }
    }
}

/// One record of a topic: its partition, Kafka key and timestamp (none on
/// the embedded log) and payload.
#[derive(Debug, Clone)]
pub struct Copied {
    pub partition: u32,
    pub key: Option<Vec<u8>>,
    pub timestamp_ms: Option<i64>,
    pub payload: Vec<u8>,
}

/// The contract's personal fields as a drill's copy holds them: every
/// value under a `[privacy] personal` field replaced by a pseudonym, the
/// SHA-256 of a secret the drill draws and never keeps, and the value. The
/// same value gets the same pseudonym within a drill, so an event id that
/// is personal still tells events apart and repeats, and nothing of the
/// value is in the copy. A line that is not JSON cannot be masked and is
/// copied as a line that is not JSON either. A `where` rule that reads a
/// personal field sees the pseudonym.
pub struct Pseudonyms {
    personal: Vec<weir_contract::FieldPath>,
    secret: [u8; 32],
}

impl Pseudonyms {
    pub fn new(contract: &Contract) -> Pseudonyms {
        let mut secret = [0u8; 32];
        let drawn =
            std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut secret));
        if drawn.is_err() {
            // Without /dev/urandom: the process's random hasher keys, and the time.
            use std::hash::{BuildHasher, Hasher};
            for chunk in secret.chunks_mut(8) {
                let mut h = std::collections::hash_map::RandomState::new().build_hasher();
                h.write_u128(
                    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos(),
                );
                chunk.copy_from_slice(&h.finish().to_le_bytes());
            }
        }
        Pseudonyms { personal: contract.personal.clone(), secret }
    }

    /// `payload` as the copy holds it.
    pub fn apply(&self, payload: Vec<u8>) -> Vec<u8> {
        if self.personal.is_empty() {
            return payload;
        }
        let Ok(mut event) = serde_json::from_slice::<Value>(&payload) else {
            return b"(an event that is not JSON, left out of the drill's copy: it may hold personal fields)".to_vec();
        };
        for path in &self.personal {
            let mut at = Some(&mut event);
            for segment in path.segments() {
                at = at.and_then(|v| v.as_object_mut()).and_then(|m| m.get_mut(segment));
            }
            if let Some(v) = at {
                self.replace(v);
            }
        }
        event.to_string().into_bytes()
    }

    fn replace(&self, v: &mut Value) {
        match v {
            Value::Null => {}
            Value::Object(m) => m.values_mut().for_each(|x| self.replace(x)),
            Value::Array(a) => a.iter_mut().for_each(|x| self.replace(x)),
            scalar => {
                use sha2::Digest;
                let mut h = sha2::Sha256::new();
                h.update(self.secret);
                h.update(scalar.to_string().as_bytes());
                let hex: String = h.finalize().iter().take(12).map(|b| format!("{b:02x}")).collect();
                *scalar = Value::String(format!("(personal) {hex}"));
            }
        }
    }
}

/// The log a drill copies the topic in and sends its events to.
#[derive(Clone)]
pub enum DrillLog {
    Embedded(Log),
    Kafka { brokers: String, config: Arc<ServerConfig>, producer: FutureProducer, runtime: tokio::runtime::Handle },
}

/// The first offset in `[first, end)` of `topic`'s partition `p` whose
/// record was appended at or after `since_ms` (`end` when none was),
/// found by halving: append times rise with offsets, as one writer stamps
/// each group commit with its clock.
fn first_appended_since(log: &Log, topic: &str, p: u32, (first, end): (u64, u64), since_ms: i64) -> crate::Result<u64> {
    let (mut lo, mut hi) = (first, end);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        match log.read(topic, p, mid, 1, 1)?.first() {
            Some(r) if r.append_ms < since_ms => lo = r.offset + 1,
            Some(_) => hi = mid,
            None => hi = mid,
        }
    }
    Ok(lo)
}

/// How far back a drill copies a pipeline's topic: the event time that can
/// still change a window now (the window's length and allowed lateness)
/// or meet a duplicate (the dedup horizon), whichever is longer, measured
/// back from `now_ms` in append time. A global window never closes, so its
/// drill copies everything (`None`).
pub fn copy_since(contract: &Contract, now_ms: i64) -> Option<i64> {
    let window = match contract.window.kind {
        WindowKind::Tumbling { size_ms } | WindowKind::Hopping { size_ms, .. } => size_ms,
        WindowKind::Session { gap_ms } => gap_ms,
        WindowKind::Global => return None,
    };
    let span = window.saturating_add(contract.window.allowed_lateness_ms);
    let span = span.max(contract.dedup.as_ref().map_or(0, |d| d.horizon_ms));
    Some(now_ms.saturating_sub(span))
}

/// The name of drill `id`'s copy of `topic`.
pub fn copy_topic(topic: &str, id: i64) -> String {
    format!("{topic}.drill-{id}")
}

impl DrillLog {
    /// The topic's partitions.
    pub fn partitions(&self, topic: &str) -> crate::Result<u32> {
        match self {
            DrillLog::Embedded(log) => Ok(log.partitions(topic)?),
            DrillLog::Kafka { brokers, config, .. } => {
                let consumer: BaseConsumer = crate::kafka::client_config(brokers, config.kafka.as_ref()).create()?;
                let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
                Ok(metadata.topics().first().map_or(0, |t| t.partitions().len()) as u32)
            }
        }
    }

    /// The end of each partition of `topic` (the next offset).
    pub fn ends(&self, topic: &str) -> crate::Result<Vec<u64>> {
        match self {
            DrillLog::Embedded(log) => Ok(log.bounds(topic)?.into_iter().map(|(_, end)| end).collect()),
            DrillLog::Kafka { brokers, config, .. } => {
                let consumer: BaseConsumer = crate::kafka::client_config(brokers, config.kafka.as_ref()).create()?;
                let mut ends = Vec::new();
                for p in 0..self.partitions(topic)? as i32 {
                    let (_, high) = consumer.fetch_watermarks(topic, p, Duration::from_secs(10))?;
                    ends.push(high.max(0) as u64);
                }
                Ok(ends)
            }
        }
    }

    /// Copies the records `from` holds now that were appended at or after
    /// `since_ms` (all, when `None`), and at least the last [`RECENT`] of
    /// each partition, into `to` (created with as many partitions),
    /// partition by partition, their personal fields replaced by
    /// `pseudonyms`; the last [`RECENT`] records of each partition as
    /// copied (where [`pick_templates`] looks) and how many were copied.
    pub fn copy(
        &self,
        from: &str,
        to: &str,
        pseudonyms: &Pseudonyms,
        since_ms: Option<i64>,
    ) -> crate::Result<(Vec<Copied>, u64)> {
        let partitions = self.partitions(from)?;
        let mut last: Vec<Copied> = Vec::new();
        let keep = |c: Copied, last: &mut Vec<Copied>| {
            let of_partition = last.iter().filter(|l| l.partition == c.partition).count();
            if of_partition >= RECENT {
                if let Some(i) = last.iter().position(|l| l.partition == c.partition) {
                    last.remove(i);
                }
            }
            last.push(c);
        };
        let mut copied = 0u64;
        match self {
            DrillLog::Embedded(log) => {
                log.ensure_topic(to, partitions, None)?;
                for (p, (first, end)) in log.bounds(from)?.into_iter().enumerate() {
                    let mut next = match since_ms {
                        Some(since) => first_appended_since(log, from, p as u32, (first, end), since)?
                            .min(end.saturating_sub(RECENT as u64))
                            .max(first),
                        None => first,
                    };
                    while next < end {
                        let records = log.read(from, p as u32, next, 4096, 4 << 20)?;
                        let Some(r) = records.last() else { break };
                        next = r.offset + 1;
                        let batch: Vec<(u32, Vec<u8>)> = records
                            .into_iter()
                            .filter(|r| r.offset < end)
                            .map(|r| (p as u32, pseudonyms.apply(r.payload)))
                            .collect();
                        copied += batch.len() as u64;
                        for (_, payload) in batch.iter().rev().take(RECENT).rev() {
                            let c =
                                Copied { partition: p as u32, key: None, timestamp_ms: None, payload: payload.clone() };
                            keep(c, &mut last);
                        }
                        log.append(to, batch)?.wait_blocking()?;
                    }
                }
            }
            DrillLog::Kafka { brokers, config, runtime, .. } => {
                runtime.block_on(crate::kafka::ensure_topic(brokers, config.kafka.as_ref(), to, partitions))?;
                let consumer: BaseConsumer = crate::kafka::client_config(brokers, config.kafka.as_ref())
                    .set("group.id", format!("weir-drill-copy-{to}"))
                    .set("enable.auto.commit", "false")
                    .set("enable.partition.eof", "true")
                    .create()?;
                let starts = match since_ms {
                    Some(since) => crate::kafka::offsets_at(&consumer, from, partitions as i32, since)?,
                    None => Vec::new(),
                };
                for p in 0..partitions as i32 {
                    let (low, high) = consumer.fetch_watermarks(from, p, Duration::from_secs(10))?;
                    if low >= high {
                        continue;
                    }
                    // The first record at or after `since_ms` (the end when
                    // there is none), or the last RECENT, whichever is first.
                    let start = match (since_ms, starts.get(p as usize).copied().flatten()) {
                        (None, _) => low,
                        (Some(_), Some(o)) => o.min(high - RECENT as i64).max(low),
                        (Some(_), None) => (high - RECENT as i64).max(low),
                    };
                    let mut batch = Vec::new();
                    crate::kafka::read_partition(&consumer, (from, p), (start, high), "copying", &mut |m| {
                        let c = Copied {
                            partition: p as u32,
                            key: m.key().map(<[u8]>::to_vec),
                            timestamp_ms: m.timestamp().to_millis(),
                            payload: pseudonyms.apply(m.payload().unwrap_or_default().to_vec()),
                        };
                        keep(c.clone(), &mut last);
                        batch.push(c);
                        if batch.len() >= 4096 {
                            copied += batch.len() as u64;
                            self.append(to, &batch)?;
                            batch.clear();
                        }
                        Ok(())
                    })?;
                    copied += batch.len() as u64;
                    self.append(to, &batch)?;
                }
            }
        }
        Ok((last, copied))
    }

    /// Appends `records` to their partitions of `topic` and waits until they are durable.
    pub fn append(&self, topic: &str, records: &[Copied]) -> crate::Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        match self {
            DrillLog::Embedded(log) => {
                let batch: Vec<_> = records.iter().map(|r| (r.partition, r.payload.clone())).collect();
                log.append(topic, batch)?.wait_blocking()?;
            }
            DrillLog::Kafka { producer, runtime, .. } => {
                let mut pending = Vec::with_capacity(records.len());
                for r in records {
                    let mut record =
                        FutureRecord::<[u8], [u8]>::to(topic).payload(&r.payload).partition(r.partition as i32);
                    if let Some(k) = &r.key {
                        record = record.key(k);
                    }
                    if let Some(t) = r.timestamp_ms {
                        record = record.timestamp(t);
                    }
                    match producer.send_result(record) {
                        Ok(delivery) => pending.push(delivery),
                        Err((e, _)) => crate::bail!("Kafka refused a drill event for {topic}: {e}"),
                    }
                }
                for delivery in pending {
                    match runtime.block_on(delivery) {
                        Ok(Ok(_)) => {}
                        Ok(Err((e, _))) => crate::bail!("Kafka did not acknowledge a drill event for {topic}: {e}"),
                        Err(_) => crate::bail!("the Kafka producer stopped before acknowledging a drill event"),
                    }
                }
            }
        }
        Ok(())
    }

    /// Removes a drill's copy of the topic.
    pub fn remove(&self, topic: &str) -> crate::Result<()> {
        match self {
            DrillLog::Embedded(log) => {
                log.remove_topic(topic)?;
            }
            DrillLog::Kafka { brokers, config, runtime, .. } => {
                use rdkafka::admin::{AdminClient, AdminOptions};
                use rdkafka::client::DefaultClientContext;
                let admin: AdminClient<DefaultClientContext> =
                    crate::kafka::client_config(brokers, config.kafka.as_ref()).create()?;
                for r in runtime.block_on(admin.delete_topics(&[topic], &AdminOptions::new()))? {
                    if let Err((name, code)) = r {
                        crate::bail!("cannot delete the Kafka topic {name}: {code}");
                    }
                }
            }
        }
        Ok(())
    }
}

/// Why a contract's events cannot be made by a drill, if they cannot: a
/// drill writes the event time (and id) into the payload.
pub fn cannot_make_events(contract: &Contract) -> Option<String> {
    let s = &contract.source;
    std::iter::once(&s.event_time).chain(&s.event_id).find(|f| f.segments().first().is_some_and(|s| s == "$kafka")).map(
        |f| format!("the contract reads {f} from the Kafka record, and a drill writes its event times and ids into the payload"),
    )
}

/// An event like `template` (a record of the topic), with the contract's
/// event time set to `time_ms` in its `event_time_format` and, when the
/// contract has an event id and `id` is given, that id.
pub fn event_like(contract: &Contract, template: &[u8], time_ms: i64, id: Option<&str>) -> Result<Vec<u8>, String> {
    let mut event: serde_json::Value =
        serde_json::from_slice(template).map_err(|e| format!("a record of the topic is not JSON ({e})"))?;
    if !event.is_object() {
        return Err("a record of the topic is not a JSON object".into());
    }
    let s = &contract.source;
    let time = match &s.event_time_format {
        TimeFormat::Auto => serde_json::Value::String(weir_engine::time::format_rfc3339_ms(time_ms)),
        TimeFormat::Epoch(unit) => {
            let n = match unit {
                weir_contract::EpochUnit::Seconds => time_ms.div_euclid(1000) as i128,
                weir_contract::EpochUnit::Millis => time_ms as i128,
                weir_contract::EpochUnit::Micros => time_ms as i128 * 1000,
                weir_contract::EpochUnit::Nanos => time_ms as i128 * 1_000_000,
            };
            serde_json::Value::Number(serde_json::Number::from_string_unchecked(n.to_string()))
        }
        TimeFormat::Pattern(p) => serde_json::Value::String(
            p.write(time_ms, s.event_time_zone).ok_or_else(|| format!("{time_ms} ms is beyond the calendar"))?,
        ),
    };
    set(&mut event, s.event_time.segments(), time);
    if let (Some(field), Some(id)) = (&s.event_id, id) {
        set(&mut event, field.segments(), serde_json::Value::String(id.to_owned()));
    }
    serde_json::to_vec(&event).map_err(|e| e.to_string())
}

/// How many of each partition's last records [`pick_templates`] looks at.
pub const RECENT: usize = 64;

/// Per partition, the newest of `recent` that, made into a drill event
/// ([`event_like`]), a fresh engine counts: the drill's events then pass
/// the contract's rule and fields as the topic's own events do.
pub fn pick_templates(contract: &Contract, recent: &[Copied], partitions: u32) -> Vec<Copied> {
    let now = weir_log::now_ms();
    let mut picked: Vec<Copied> = Vec::new();
    for c in recent.iter().rev() {
        if picked.iter().any(|p| p.partition == c.partition) {
            continue;
        }
        let Ok(bytes) = event_like(contract, &c.payload, now, Some("drill-template")) else { continue };
        let Ok(mut engine) = weir_engine::Engine::new(contract, weir_engine::Mode::Batch, partitions) else {
            return Vec::new();
        };
        let mut out = weir_engine::Output::default();
        engine.process(weir_engine::EventIn { partition: c.partition, offset: 0, bytes: &bytes }, &mut out);
        if engine.counters().counted == 1 {
            picked.push(c.clone());
        }
    }
    picked.sort_by_key(|c| c.partition);
    picked
}

/// Sets the value at `path`, making the objects on the way.
fn set(value: &mut serde_json::Value, path: &[String], to: serde_json::Value) {
    let Some((last, parents)) = path.split_last() else { return };
    let mut at = value;
    for name in parents {
        if !at.get(name).is_some_and(serde_json::Value::is_object) {
            at[name.as_str()] = serde_json::json!({});
        }
        at = &mut at[name.as_str()];
    }
    at[last.as_str()] = to;
}

/// The shadow's runner, stepped by the drill's own thread so that a
/// `restart` can kill it: a run dropped without closing commits nothing
/// more, and the next one starts from its last checkpoint, as after a crash.
pub struct Shadow {
    pub runner: Runner,
    connect: Box<dyn FnMut() -> crate::Result<Connected> + Send>,
    run: Option<Run>,
    clock: SystemClock,
    /// The last failure, when the run failed and starts again at the next step.
    pub failed: Option<String>,
}

impl Shadow {
    pub fn new(runner: Runner, connect: Box<dyn FnMut() -> crate::Result<Connected> + Send>) -> Shadow {
        lock_status(&runner.status).version_state = Some(weir_store::VersionState::Live);
        Shadow { runner, connect, run: None, clock: SystemClock::new(), failed: None }
    }

    pub fn status(&self) -> Arc<Mutex<Status>> {
        Arc::clone(&self.runner.status)
    }

    /// One step of the run (started first when there is none), waiting up
    /// to `wait` for records; a failure drops the run.
    pub fn step(&mut self, wait: Duration) {
        if let Err(e) = self.try_step(wait) {
            self.failed = Some(format!("{e:#}"));
            self.run = None;
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn try_step(&mut self, wait: Duration) -> crate::Result<()> {
        if self.run.is_none() {
            let (source, checkpoints) = (self.connect)()?;
            self.run = Some(Run::start(&self.runner, source, checkpoints, &self.clock, "drill")?);
        }
        if let Some(run) = &mut self.run {
            run.step(&self.runner, &self.clock, false, wait)?;
        }
        Ok(())
    }

    /// Kills the run: nothing since its last checkpoint is kept.
    pub fn kill(&mut self) {
        self.run = None;
        lock_status(&self.runner.status).restarts += 1;
    }

    /// Whether a run is going.
    pub fn running(&self) -> bool {
        self.run.is_some()
    }

    /// A last checkpoint, then the source closed.
    pub fn close(mut self) {
        if let Some(mut run) = self.run.take() {
            let _ = run.step(&self.runner, &self.clock, true, Duration::ZERO);
            run.close();
        }
    }
}

fn lock_status(s: &Mutex<Status>) -> std::sync::MutexGuard<'_, Status> {
    crate::lock(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contract(extra: &str) -> Contract {
        let text = format!(
            r#"[pipeline]
name = "p"
version = 1
owner = "o"
steward = "s"
decision = "d"
[source]
topic = "t"
event_time = "at.when"
key = ["account"]
event_id = "id"
{extra}
[window]
type = "tumbling"
size = "1m"
[[aggregate]]
name = "n"
fn = "count"
"#
        );
        Contract::parse("test", &text).unwrap()
    }

    #[test]
    fn scenarios_are_named_and_refused_by_name() {
        for s in SCENARIOS {
            assert_eq!(Scenario::parse(s.name()), Ok(*s));
        }
        let e = Scenario::parse("flood").unwrap_err();
        assert!(e.contains("delayed-partition") && e.contains("restart"), "{e}");
    }

    #[test]
    fn events_carry_the_time_in_the_contracts_format_and_a_new_id() {
        let at = weir_engine::time::parse_rfc3339_ms("2026-12-03T10:00:01.500Z").unwrap();
        let template = br#"{"account":"a","id":"x","amount":5,"at":{"when":"2020-01-01T00:00:00Z"}}"#;
        let e: serde_json::Value =
            serde_json::from_slice(&event_like(&contract(""), template, at, Some("d-1")).unwrap()).unwrap();
        assert_eq!(e["at"]["when"], "2026-12-03T10:00:01.500Z");
        assert_eq!((e["id"].as_str(), e["account"].as_str()), (Some("d-1"), Some("a")));
        assert_eq!(e["amount"].to_string(), "5");
        let epoch = contract("event_time_format = \"epoch_s\"");
        let e: serde_json::Value = serde_json::from_slice(&event_like(&epoch, template, at, None).unwrap()).unwrap();
        assert_eq!((e["at"]["when"].to_string(), e["id"].as_str()), ((at / 1000).to_string(), Some("x")));
        let pattern = contract("event_time_format = \"%d.%m.%Y %H:%M:%S\"\nevent_time_zone = \"Europe/Berlin\"");
        let e: serde_json::Value = serde_json::from_slice(&event_like(&pattern, template, at, None).unwrap()).unwrap();
        assert_eq!(e["at"]["when"], "03.12.2026 11:00:01");
        assert!(event_like(&contract(""), b"[1]", at, None).unwrap_err().contains("not a JSON object"));
        assert!(event_like(&contract(""), b"{", at, None).unwrap_err().contains("not JSON"));
    }

    #[test]
    fn a_time_read_from_kafka_cannot_be_drilled() {
        let kafka = contract("").source.event_time.clone();
        assert!(cannot_make_events(&contract("")).is_none(), "{kafka}");
        let text = contract("").text.replace("event_time = \"at.when\"", "event_time = \"$kafka.timestamp\"");
        let c = Contract::parse("test", &text).unwrap();
        assert!(cannot_make_events(&c).unwrap().contains("$kafka.timestamp"));
    }

    /// Issue 42, finding 7: a drill copies what its scenario needs, the
    /// records appended since the contract's window and lateness (or dedup
    /// horizon) began, and at least the last 64 of each partition; not the
    /// whole topic. A global window copies everything.
    #[test]
    fn review_2_point_7_a_drill_copies_the_recent_records_not_the_whole_topic() {
        let c = contract("");
        let dir = std::env::temp_dir().join(format!("weir-drill-since-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (log, _) = Log::open(&dir, weir_log::LogOptions::default()).unwrap();
        log.ensure_topic("t", 2, None).unwrap();
        let event = |i: usize| format!(r#"{{"id":"e{i}","account":"a{}","amount":1}}"#, i % 7).into_bytes();
        let old: Vec<(u32, Vec<u8>)> = (0..1_000).map(|i| ((i % 2) as u32, event(i))).collect();
        log.append("t", old).unwrap().wait_blocking().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(30));
        let since = weir_log::now_ms();
        std::thread::sleep(std::time::Duration::from_millis(30));
        let new: Vec<(u32, Vec<u8>)> = (1_000..1_300).map(|i| (0, event(i))).collect();
        log.append("t", new).unwrap().wait_blocking().unwrap();
        let dlog = DrillLog::Embedded(log.clone());
        let pseudonyms = Pseudonyms::new(&c);
        // Partition 0: its 300 new records; partition 1, with none new: its last 64.
        let (_, copied) = dlog.copy("t", "t.drill-1", &pseudonyms, Some(since)).unwrap();
        assert_eq!(copied, 300 + RECENT as u64);
        let bounds = log.bounds("t.drill-1").unwrap();
        assert_eq!(bounds, vec![(0, 300), (0, RECENT as u64)]);
        let first = &log.read("t.drill-1", 0, 0, 1, 1 << 20).unwrap()[0].payload;
        assert!(String::from_utf8_lossy(first).contains("e1000"), "{}", String::from_utf8_lossy(first));
        // From a time before everything, or with none: all of it.
        let (_, all) = dlog.copy("t", "t.drill-2", &pseudonyms, Some(0)).unwrap();
        assert_eq!(all, 1_300);
        assert_eq!(dlog.copy("t", "t.drill-3", &pseudonyms, None).unwrap().1, 1_300);
        // What reaches back how far: the window and its lateness, or the horizon.
        let now = 10_000_000_000;
        assert_eq!(copy_since(&c, now), Some(now - 60_000 - c.window.allowed_lateness_ms));
        let mut global = c.clone();
        global.window.kind = WindowKind::Global;
        assert_eq!(copy_since(&global, now), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Issue 42, finding 7: a drill's copy holds no personal value. Each is
    /// a pseudonym, the same for the same value, so a personal event id
    /// still tells events apart and a resend is still a duplicate.
    #[test]
    fn review_2_point_7_a_drills_copy_holds_pseudonyms_not_personal_fields() {
        let c = contract("[privacy]\npersonal = [\"id\", \"customer\"]");
        let dir = std::env::temp_dir().join(format!("weir-drill-copy-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (log, _) = Log::open(&dir, weir_log::LogOptions::default()).unwrap();
        log.ensure_topic("t", 1, None).unwrap();
        let event = |id: &str, name: &str| {
            format!(
                r#"{{"id":"{id}","account":"a1","amount":5,"at":{{"when":"2026-12-03T10:00:00Z"}},"customer":{{"name":"{name}","tags":["vip"],"born":1990}}}}"#
            )
            .into_bytes()
        };
        let records =
            vec![(0, event("e1", "Ann Example")), (0, event("e1", "Ann Example")), (0, event("e2", "Ann Example"))];
        log.append("t", records).unwrap().wait_blocking().unwrap();
        log.append("t", vec![(0, b"not json: Ann Example".to_vec())]).unwrap().wait_blocking().unwrap();
        let dlog = DrillLog::Embedded(log.clone());
        let (recent, copied) = dlog.copy("t", "t.drill-1", &Pseudonyms::new(&c), None).unwrap();
        assert_eq!(copied, 4);
        let read: Vec<Vec<u8>> =
            log.read("t.drill-1", 0, 0, 100, 1 << 20).unwrap().into_iter().map(|r| r.payload).collect();
        assert_eq!(read.len(), 4);
        assert_eq!(recent.iter().map(|r| r.payload.clone()).collect::<Vec<_>>(), read, "templates come from the copy");
        for line in &read {
            let text = String::from_utf8_lossy(line);
            for secret in ["Ann", "vip", "1990", "\"e1\"", "\"e2\""] {
                assert!(!text.contains(secret), "{secret} in the copy: {text}");
            }
        }
        let events: Vec<Value> = read[..3].iter().map(|l| serde_json::from_slice(l).unwrap()).collect();
        assert_eq!(events[0], events[1], "a resend stays a resend");
        assert_ne!(events[0]["id"], events[2]["id"], "ids still tell events apart");
        assert_eq!(events[0]["customer"]["name"], events[2]["customer"]["name"], "one value, one pseudonym");
        assert!(events[0]["id"].as_str().is_some_and(|id| id.starts_with("(personal) ")), "{}", events[0]);
        assert_eq!((events[0]["amount"].clone(), events[0]["account"].clone()), (5.into(), "a1".into()));
        assert_eq!(events[0]["at"]["when"], "2026-12-03T10:00:00Z");
        // Another drill, another secret.
        let again = Pseudonyms::new(&c).apply(event("e1", "Ann Example"));
        assert_ne!(serde_json::from_slice::<Value>(&again).unwrap()["id"], events[0]["id"]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

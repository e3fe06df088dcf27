//! Pipelines over Kafka, with results and checkpoints in Postgres.
//!
//! Each `weir serve` worker joins the pipeline's consumer group; Kafka's
//! group protocol decides which worker reads which partition (no
//! coordinator of weir's own). A worker keeps one engine per partition it
//! holds, so a partition's state moves with it:
//!
//! 1. **assigned** (the rebalance callback, inside `poll`): the worker
//!    claims the partition in Postgres, which gives it a new fencing
//!    generation, restores its last checkpoint and reads on from its stored
//!    offset (records below it, which Kafka may deliver again, are skipped);
//! 2. **reading**: records go to their partition's engine; every
//!    `checkpoint_interval` (or `checkpoint_events`) each changed partition
//!    is checkpointed in one Postgres transaction (rows, ledger, state,
//!    next offset), refused if another worker claimed it since; after the
//!    commit the offset is also committed to Kafka, for tools that read
//!    group lag;
//! 3. **revoked** (the rebalance callback, before the partitions go): each
//!    is checkpointed, then dropped; a worker that lost a partition without
//!    being told (paused too long, cut off) is refused by the fence and
//!    drops it.
//!
//! Operator actions reach every worker through Postgres: a pause is a row
//! that every checkpoint reads (see [`weir_store::pg`]), and a replay is a row
//! that each worker applies to the partitions it holds, or takes when it
//! claims one: the partition's state is rebuilt from the replay's offset
//! (the consumer seeks there), and its rows are published above every
//! revision published before.
//!
//! A record's partition and offset are its Kafka ones, in the ledger and in
//! provenance. A contract can read the record's Kafka attributes as
//! `$kafka.timestamp`, `$kafka.key`, `$kafka.partition`, `$kafka.offset`
//! and `$kafka.headers.NAME` (see [`KafkaFields`]): they are added to the
//! event as a `"$kafka"` member, so they are also in ledger payloads and
//! in duplicate comparison (a record resent by a producer has another
//! timestamp, so with `$kafka.timestamp` it is a `duplicate_conflict`). Windows close on their partition's watermark, so a topic
//! must be partitioned by the contract's key (as a Kafka Streams
//! aggregation requires): `weir produce` and the HTTP API use the topic's
//! `key` field as the record key.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use weir_contract::{Contract, KafkaConfig, PostgresConfig, ServerConfig};
use weir_engine::{Engine, EventIn, Mode, Output};

use crate::status::{KafkaPartition, Status};
use crate::{lock, KeepPublished};
use weir_store::pg;
use weir_store::Replay;

/// The librdkafka settings of `kafka` (brokers first, then its `config`).
pub fn client_config(brokers: &str, kafka: Option<&KafkaConfig>) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers);
    if let Some(k) = kafka {
        for (name, value) in &k.config {
            c.set(name, value);
        }
        if k.config.contains_key("debug") {
            c.set_log_level(rdkafka::config::RDKafkaLogLevel::Debug);
        }
    }
    c
}

/// Where a contract's Kafka source is: brokers and group id.
pub fn source_of(contract: &Contract, config: &ServerConfig) -> Option<(String, String)> {
    let brokers = contract.source.brokers.clone().or_else(|| config.kafka.as_ref().map(|k| k.brokers.clone()))?;
    let p = &contract.pipeline;
    let group = contract
        .source
        .group
        .clone()
        .or_else(|| config.kafka.as_ref().and_then(|k| k.group.clone()))
        .unwrap_or_else(|| format!("weir-{}-v{}", p.name, p.version));
    Some((brokers, group))
}

/// One partition this worker holds.
struct Part {
    engine: Engine,
    out: Output,
    generation: i64,
    run: i64,
    next_offset: u64,
    /// Events since the last checkpoint.
    since: u64,
    dirty: bool,
    end_offset: u64,
    last_timestamp_ms: Option<i64>,
    /// The last replay applied to the partition (`replays.id`).
    replayed: i64,
    /// During a replay from an event time: the rows left out (see
    /// [`KeepPublished`]), until the offset the partition ended at when the
    /// replay started.
    republish_after: Option<(KeepPublished, u64)>,
}

/// What the loop and the rebalance callbacks (which run inside `poll`, on
/// the loop's thread) share.
struct Shared {
    contract: Contract,
    schema: String,
    worker: String,
    client: postgres::Client,
    parts: BTreeMap<u32, Part>,
    /// A failure inside a callback, for the loop to return.
    failed: Option<String>,
    /// Partitions dropped since the loop last looked, for Kafka offset commits.
    changed: bool,
    /// Checkpoints the fence refused since the loop last looked.
    fenced: u64,
}

impl Shared {
    fn claim(&mut self, partition: u32) -> anyhow::Result<()> {
        let c = &self.contract;
        let identity = (c.pipeline.version, c.text_hash);
        let claim = pg::claim(&mut self.client, &self.schema, &c.pipeline.name, partition, &self.worker, identity)?;
        let mut engine = match claim.checkpoint {
            Some(cp) => Engine::restore_parts(c, &cp.header, cp.windows, cp.id_batches)?,
            None => Engine::new(c, Mode::Stream, 1)?,
        };
        engine.read_one_partition();
        engine.track_changes();
        eprintln!(
            "weir: {} took partition {partition} (generation {}) from offset {}",
            c.pipeline.name, claim.generation, claim.next_offset
        );
        self.parts.insert(
            partition,
            Part {
                engine,
                out: Output::default(),
                generation: claim.generation,
                run: claim.run,
                next_offset: claim.next_offset,
                since: 0,
                dirty: false,
                end_offset: claim.next_offset,
                last_timestamp_ms: None,
                replayed: claim.replayed,
                republish_after: None,
            },
        );
        self.changed = true;
        Ok(())
    }

    /// Checkpoints a partition; `Ok(false)` when the fence refused it (the
    /// partition is then dropped).
    fn checkpoint(&mut self, partition: u32) -> anyhow::Result<bool> {
        self.write(partition, None)
    }

    /// A checkpoint, or with `replay` the first one of a replay (the stored
    /// state is dropped and the replay marked applied).
    fn write(&mut self, partition: u32, replay: Option<i64>) -> anyhow::Result<bool> {
        let Some(part) = self.parts.get_mut(&partition) else { return Ok(true) };
        if let Some((keep, until)) = part.republish_after {
            part.out.rows.retain(|r| !keep.keeps(r));
            if part.next_offset >= until {
                part.republish_after = None;
            }
        }
        let delta = part.engine.take_delta();
        let c = &self.contract;
        let write = pg::PartitionWrite {
            pipeline: &c.pipeline.name,
            partition,
            generation: part.generation,
            version: c.pipeline.version,
            text_hash: c.text_hash,
            format: part.engine.format(),
            out: &part.out,
            delta,
            next_offset: part.next_offset,
            now_ms: weir_log::now_ms(),
            run: part.run,
            replay,
        };
        match pg::checkpoint(&mut self.client, &self.schema, write) {
            Ok(()) => {
                part.out.clear();
                part.since = 0;
                part.dirty = false;
                Ok(true)
            }
            Err(e @ pg::CheckpointError::Fenced { .. }) => {
                eprintln!("weir: {e}");
                self.parts.remove(&partition);
                self.changed = true;
                self.fenced += 1;
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Applies replay `id` to a partition this worker holds: what it counted
    /// so far is checkpointed, then its state starts again from `from`
    /// (with revisions above `floor`) in a checkpoint that drops the stored
    /// state. Returns the offset to read from, `None` when the partition is
    /// no longer this worker's.
    fn replay(
        &mut self,
        partition: u32,
        (id, r): (i64, Replay),
        floor: u32,
        (low, high): (u64, u64),
    ) -> anyhow::Result<Option<u64>> {
        if !self.checkpoint(partition)? {
            return Ok(None);
        }
        let c = self.contract.clone();
        let Some(part) = self.parts.get_mut(&partition) else { return Ok(None) };
        let mut engine = Engine::new(&c, Mode::Stream, 1)?;
        engine.read_one_partition();
        engine.set_revision_floor(floor);
        engine.track_changes();
        let replaced = std::mem::replace(&mut part.engine, engine);
        let from = r.from_offset.unwrap_or(0).max(low);
        part.next_offset = from;
        part.end_offset = high.max(part.next_offset);
        part.republish_after = r.from_time.map(|t| (KeepPublished::new(&c, t, replaced.watermark()), high));
        part.replayed = id;
        if !self.write(partition, Some(id))? {
            return Ok(None);
        }
        eprintln!("weir: {} replays partition {partition} from offset {from}", c.pipeline.name);
        Ok(Some(from))
    }

    fn release(&mut self, partition: u32) {
        if let Err(e) = self.checkpoint(partition) {
            self.failed = Some(format!("checkpointing partition {partition} before handing it over: {e:#}"));
        }
        if self.parts.remove(&partition).is_some() {
            eprintln!("weir: {} handed partition {partition} over", self.contract.pipeline.name);
        }
        self.changed = true;
    }
}

struct Ctx {
    shared: Arc<Mutex<Shared>>,
    topic: String,
}

impl ClientContext for Ctx {
    /// librdkafka's own messages (all of them when weir.toml's
    /// `[kafka.config] debug` asks for some) on standard error.
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        eprintln!("weir: kafka {level:?} {fac}: {message}");
    }
}

impl ConsumerContext for Ctx {
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            let mut shared = lock(&self.shared);
            for e in tpl.elements_for_topic(&self.topic) {
                shared.release(e.partition() as u32);
            }
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                let mut shared = lock(&self.shared);
                for e in tpl.elements_for_topic(&self.topic) {
                    let p = e.partition() as u32;
                    if shared.parts.contains_key(&p) {
                        continue;
                    }
                    if let Err(err) = shared.claim(p) {
                        shared.failed = Some(format!("taking partition {p}: {err:#}"));
                    }
                }
            }
            Rebalance::Error(e) => eprintln!("weir: rebalance failed: {e}"),
            Rebalance::Revoke(_) => {}
        }
    }
}

/// A pipeline reading a Kafka topic as one worker of its consumer group.
pub struct KafkaRunner {
    pub contract: Contract,
    pub config: Arc<ServerConfig>,
    pub postgres: PostgresConfig,
    pub brokers: String,
    pub group: String,
    pub worker: String,
    pub status: Arc<Mutex<Status>>,
    pub stop: Arc<AtomicBool>,
    /// Whether the pipeline is paused, as Postgres last said (for status).
    pub paused: Arc<AtomicBool>,
}

const READ_RECORDS: usize = 2_000;

impl KafkaRunner {
    /// Runs until `stop` (then checkpoints every partition and leaves the
    /// group); after a failure, starts again (a new consumer, which rejoins
    /// the group and claims its partitions again) after a backoff.
    pub fn run(mut self) {
        let name = self.contract.pipeline.name.clone();
        let (status, stop) = (Arc::clone(&self.status), Arc::clone(&self.stop));
        crate::supervise(&name, &status, &stop, |_| self.run_once());
    }

    fn run_once(&mut self) -> anyhow::Result<()> {
        let c = self.contract.clone();
        let topic = c.source.topic.clone();
        let schema = self.postgres.schema.clone();
        let mut client = pg::connect(&self.postgres.url)?;
        pg::prepare_pipeline(&mut client, &schema, &c.pipeline.name, c.pipeline.version, c.text_hash)?;
        let shared = Arc::new(Mutex::new(Shared {
            contract: c.clone(),
            schema,
            worker: self.worker.clone(),
            client,
            parts: BTreeMap::new(),
            failed: None,
            changed: false,
            fenced: 0,
        }));
        let mut config = client_config(&self.brokers, self.config.kafka.as_ref());
        config
            .set("group.id", &self.group)
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .set("enable.partition.eof", "false");
        if !self.config.kafka.as_ref().is_some_and(|k| k.config.contains_key("partition.assignment.strategy")) {
            // Incremental rebalances: a partition that stays put is not
            // checkpointed, dropped and restored when another one moves.
            config.set("partition.assignment.strategy", "cooperative-sticky");
        }
        let ctx = Ctx { shared: Arc::clone(&shared), topic: topic.clone() };
        let consumer: BaseConsumer<Ctx> = config.create_with_context(ctx)?;
        consumer.subscribe(&[&topic])?;
        let interval = Duration::from_millis(self.config.checkpoint_interval_ms.max(1) as u64);
        let kafka_fields = KafkaFields::of(&c);
        let mut decorated = Vec::new();
        let mut last_checkpoint = Instant::now();
        let mut last_ends = Instant::now() - Duration::from_secs(10);
        let mut commands_read = Instant::now() - interval;
        loop {
            let stopping = self.stop.load(Ordering::SeqCst);
            // Poll a batch first (the rebalance callbacks lock `shared` inside
            // `poll`), then process it under one lock of each.
            let mut batch = Vec::new();
            while batch.len() < READ_RECORDS && !stopping {
                let wait = if batch.is_empty() { Duration::from_millis(50) } else { Duration::ZERO };
                match consumer.poll(wait) {
                    None => break,
                    Some(Ok(m)) => batch.push(m),
                    Some(Err(e)) => {
                        eprintln!("weir: {}: reading {topic}: {e}", c.pipeline.name);
                        break;
                    }
                }
            }
            let now = weir_log::now_ms();
            let (mut latencies, mut not_delivered) = (Vec::with_capacity(batch.len()), 0);
            {
                let mut sh = lock(&shared);
                for m in &batch {
                    let p = m.partition() as u32;
                    let offset = m.offset().max(0) as u64;
                    // Only the assignment callback claims: a record of a partition
                    // handed over (fetched before the rebalance) is not this worker's.
                    let Some(part) = sh.parts.get_mut(&p) else { continue };
                    if offset < part.next_offset {
                        continue; // counted before the last checkpoint
                    }
                    if offset > part.next_offset {
                        // Offsets the broker did not deliver: removed by retention or
                        // compaction, transaction markers, or a broker fault. Never silent.
                        eprintln!(
                            "weir: {}: partition {p}: the broker delivered offset {offset} after {}; offsets {}..{} were not delivered",
                            c.pipeline.name,
                            part.next_offset,
                            part.next_offset,
                            offset - 1
                        );
                        not_delivered += offset - part.next_offset;
                    }
                    let ts = m.timestamp().to_millis();
                    let bytes = kafka_fields.decorate(m, m.payload().unwrap_or_default(), &mut decorated);
                    part.engine.process(EventIn { partition: p, offset, bytes }, &mut part.out);
                    part.next_offset = offset + 1;
                    part.since += 1;
                    part.dirty = true;
                    part.last_timestamp_ms = ts;
                    latencies.extend(ts.map(|t| now.saturating_sub(t).max(0) as f64 / 1e3));
                }
            }
            drop(batch);
            if !latencies.is_empty() || not_delivered > 0 {
                let mut st = lock(&self.status);
                st.offsets_not_delivered += not_delivered;
                for l in latencies {
                    st.processing.observe(l);
                }
            }
            let (failed, fenced) = {
                let mut sh = lock(&shared);
                (sh.failed.take(), std::mem::take(&mut sh.fenced))
            };
            if fenced > 0 {
                lock(&self.status).checkpoints_fenced += fenced;
            }
            if let Some(f) = failed {
                anyhow::bail!(f);
            }
            if commands_read.elapsed() >= interval {
                self.apply_commands(&shared, &consumer, &topic)?;
                commands_read = Instant::now();
            }
            let due = last_checkpoint.elapsed() >= interval;
            let mut committed = TopicPartitionList::new();
            {
                let mut sh = lock(&shared);
                let ready: Vec<u32> = sh
                    .parts
                    .iter()
                    .filter(|(_, part)| part.dirty && (due || stopping || part.since >= self.config.checkpoint_events))
                    .map(|(p, _)| *p)
                    .collect();
                for p in ready {
                    let started = Instant::now();
                    if sh.checkpoint(p)? {
                        lock(&self.status).checkpoint_duration.observe(started.elapsed().as_secs_f64());
                        let next = sh.parts.get(&p).map_or(0, |part| part.next_offset);
                        committed.add_partition_offset(&topic, p as i32, Offset::Offset(next as i64))?;
                    }
                }
                if due {
                    last_checkpoint = Instant::now();
                }
            }
            if committed.count() > 0 {
                // For tools that read the group's lag; Postgres holds the offsets weir resumes from.
                if let Err(e) = consumer.commit(&committed, CommitMode::Async) {
                    eprintln!("weir: {}: committing offsets to Kafka: {e}", c.pipeline.name);
                }
                self.publish_status(&shared, Some(weir_log::now_ms()));
            }
            if last_ends.elapsed() >= Duration::from_secs(1) {
                let held: Vec<u32> = lock(&shared).parts.keys().copied().collect();
                for p in held {
                    if let Ok((_, high)) = consumer.fetch_watermarks(&topic, p as i32, Duration::from_secs(1)) {
                        if let Some(part) = lock(&shared).parts.get_mut(&p) {
                            part.end_offset = high.max(0) as u64;
                        }
                    }
                }
                last_ends = Instant::now();
                self.publish_status(&shared, None);
            }
            if stopping {
                consumer.unsubscribe();
                return Ok(());
            }
        }
    }

    /// Reads the operator's actions from Postgres: the pause (for status;
    /// the checkpoints read it themselves) and a replay the partitions this
    /// worker holds have not applied yet.
    fn apply_commands(&self, shared: &Mutex<Shared>, consumer: &BaseConsumer<Ctx>, topic: &str) -> anyhow::Result<()> {
        let name = &self.contract.pipeline.name;
        let mut sh = lock(shared);
        let schema = sh.schema.clone();
        self.paused.store(pg::is_paused(&mut sh.client, &schema, name)?, Ordering::SeqCst);
        let Some((id, replay)) = pg::last_replay(&mut sh.client, &schema, name)? else { return Ok(()) };
        let behind: Vec<u32> = sh.parts.iter().filter(|(_, p)| p.replayed < id).map(|(p, _)| *p).collect();
        if behind.is_empty() {
            return Ok(());
        }
        let floor = pg::max_revision(&mut sh.client, &schema, name)?;
        for p in behind {
            let (low, high) = consumer.fetch_watermarks(topic, p as i32, Duration::from_secs(5))?;
            let bounds = (low.max(0) as u64, high.max(0) as u64);
            if let Some(from) = sh.replay(p, (id, replay), floor, bounds)? {
                consumer.seek(topic, p as i32, Offset::Offset(from as i64), Duration::from_secs(5))?;
            }
        }
        drop(sh);
        // The status shows where the replay starts before it counts the replay.
        self.publish_status(shared, None);
        lock(&self.status).replays += 1;
        Ok(())
    }

    fn publish_status(&self, shared: &Mutex<Shared>, checkpoint_ms: Option<i64>) {
        let sh = lock(shared);
        let mut s = lock(&self.status);
        let mut counters = weir_engine::Counters::default();
        let mut parts = Vec::new();
        let mut watermark: Option<i64> = None;
        let (mut open, mut bytes) = (0, 0);
        for (p, part) in &sh.parts {
            counters.add(part.engine.counters());
            let wm = part.engine.watermark();
            watermark = match (watermark, wm) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            open += part.engine.open_windows();
            bytes += part.engine.state_bytes();
            parts.push(KafkaPartition {
                partition: *p,
                next_offset: part.next_offset,
                end_offset: part.end_offset.max(part.next_offset),
                generation: part.generation,
                watermark: wm,
                last_timestamp_ms: part.last_timestamp_ms,
            });
        }
        s.watermark = watermark;
        s.counters = counters;
        s.open_windows = open;
        s.state_bytes = bytes;
        s.kafka = Some(parts);
        if let Some(ms) = checkpoint_ms {
            s.last_checkpoint_ms = ms;
            s.checkpoints += 1;
            s.failed = None;
        }
    }
}

/// A producer for the HTTP API and `weir produce`: every record
/// acknowledged by all in-sync replicas (`acks=all`).
pub fn producer(brokers: &str, kafka: Option<&KafkaConfig>) -> rdkafka::error::KafkaResult<FutureProducer> {
    let mut c = client_config(brokers, kafka);
    c.set("acks", "all").set("message.timeout.ms", "30000");
    c.create()
}

/// The record key for a partitioning field's JSON text: a string's own
/// text, anything else as written.
pub fn record_key(json: &str) -> String {
    serde_json::from_str::<String>(json).unwrap_or_else(|_| json.to_owned())
}

/// Produces `records` (payload with their partitioning field's JSON text)
/// and waits for every acknowledgement; the partitions and offsets written.
/// Kafka has no all-or-nothing append without transactions: after an error
/// some records may be written; sending again is safe with `[dedup]`.
pub async fn produce(
    producer: &FutureProducer,
    topic: &str,
    records: &[(u32, Vec<u8>)],
    keys: &[Option<String>],
) -> Result<Vec<(u32, u64)>, String> {
    let mut pending = Vec::with_capacity(records.len());
    for ((_, payload), key) in records.iter().zip(keys) {
        let key = key.as_deref().map(record_key);
        let mut record = FutureRecord::<String, Vec<u8>>::to(topic).payload(payload);
        if let Some(k) = &key {
            record = record.key(k);
        }
        match producer.send_result(record) {
            Ok(delivery) => pending.push(delivery),
            Err((e, _)) => return Err(format!("Kafka refused an event of the batch ({e}); send the batch again")),
        }
    }
    let mut offsets = Vec::with_capacity(pending.len());
    for delivery in pending {
        match delivery.await {
            Ok(Ok(d)) => offsets.push((d.partition.max(0) as u32, d.offset.max(0) as u64)),
            Ok(Err((e, _))) => {
                return Err(format!(
                    "Kafka did not acknowledge an event ({e}); some of the batch may be written; send it again (duplicates are caught by [dedup])"
                ))
            }
            Err(_) => return Err("the Kafka producer stopped before acknowledging; send the batch again".into()),
        }
    }
    Ok(offsets)
}

/// Creates `topic` with `partitions` partitions (replication factor 1 on a
/// single broker, else the broker's default) unless it exists; returns its
/// partition count. weir.toml's `[topics.NAME] partitions` says how many.
pub async fn ensure_topic(
    brokers: &str,
    kafka: Option<&KafkaConfig>,
    topic: &str,
    partitions: u32,
) -> anyhow::Result<u32> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> = client_config(brokers, kafka).create()?;
    let existing = |admin: &AdminClient<DefaultClientContext>| -> anyhow::Result<Option<u32>> {
        let metadata = admin.inner().fetch_metadata(Some(topic), Duration::from_secs(10))?;
        Ok(metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty())
            .map(|t| t.partitions().len() as u32))
    };
    if let Some(n) = existing(&admin)? {
        return Ok(n);
    }
    let brokers_known = admin.inner().fetch_metadata(None, Duration::from_secs(10))?.brokers().len();
    let replication = if brokers_known <= 1 { TopicReplication::Fixed(1) } else { TopicReplication::Fixed(-1) };
    let new = NewTopic::new(topic, partitions as i32, replication);
    let results = admin.create_topics([&new], &AdminOptions::new()).await?;
    for r in results {
        if let Err((name, code)) = r {
            if code != rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists {
                anyhow::bail!("cannot create the Kafka topic {name}: {code}; create it with {partitions} partitions, keyed by the contract's key");
            }
        }
    }
    eprintln!("weir: created Kafka topic {topic} with {partitions} partitions");
    Ok(partitions)
}

/// Checks that `line` is one JSON value and returns the JSON text of its
/// top-level `field`, if it has one: the HTTP API's check, for `weir produce --kafka`.
pub fn key_of_line(line: &str, field: Option<&str>) -> Result<Option<String>, serde_json::Error> {
    weir_engine::intake::key_of(line.as_bytes(), field)
}

/// Which of a record's Kafka attributes a contract reads as `$kafka.NAME`
/// (in `event_time`, `key`, `event_id` or an aggregate's `field`):
/// `timestamp` (epoch milliseconds), `key`, `partition`, `offset`,
/// `headers` (an object of the headers that are UTF-8).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct KafkaFields {
    timestamp: bool,
    key: bool,
    partition: bool,
    offset: bool,
    headers: bool,
}

impl KafkaFields {
    pub fn of(contract: &Contract) -> KafkaFields {
        let s = &contract.source;
        let mut paths: Vec<&weir_contract::FieldPath> = vec![&s.event_time];
        paths.extend(&s.key);
        paths.extend(&s.event_id);
        paths.extend(contract.aggregates.iter().filter_map(|a| a.field.as_ref()));
        let mut f = KafkaFields::default();
        for p in paths {
            if let [first, name, ..] = p.segments() {
                if first == "$kafka" {
                    match name.as_str() {
                        "timestamp" => f.timestamp = true,
                        "key" => f.key = true,
                        "partition" => f.partition = true,
                        "offset" => f.offset = true,
                        "headers" => f.headers = true,
                        _ => {}
                    }
                }
            }
        }
        f
    }

    fn any(self) -> bool {
        self.timestamp || self.key || self.partition || self.offset || self.headers
    }

    /// The payload with a `"$kafka"` member first, holding the attributes the
    /// contract reads; other payloads (not an object) as they are.
    fn decorate<'a>(
        self,
        m: &rdkafka::message::BorrowedMessage<'_>,
        payload: &'a [u8],
        buf: &'a mut Vec<u8>,
    ) -> &'a [u8] {
        use rdkafka::message::Headers;
        let trimmed = payload.trim_ascii_start();
        if !self.any() || !trimmed.starts_with(b"{") {
            return payload;
        }
        let mut meta = serde_json::Map::new();
        if self.timestamp {
            meta.insert("timestamp".into(), m.timestamp().to_millis().into());
        }
        if self.key {
            let key = m.key().map(|k| String::from_utf8_lossy(k).into_owned());
            meta.insert("key".into(), key.into());
        }
        if self.partition {
            meta.insert("partition".into(), m.partition().into());
        }
        if self.offset {
            meta.insert("offset".into(), m.offset().into());
        }
        if self.headers {
            let mut headers = serde_json::Map::new();
            if let Some(hs) = m.headers() {
                for h in hs.iter() {
                    if let Some(v) = h.value.and_then(|v| std::str::from_utf8(v).ok()) {
                        headers.insert(h.key.to_owned(), v.into());
                    }
                }
            }
            meta.insert("headers".into(), headers.into());
        }
        buf.clear();
        buf.extend_from_slice(b"{\"$kafka\":");
        buf.extend_from_slice(serde_json::Value::Object(meta).to_string().as_bytes());
        let rest = trimmed[1..].trim_ascii_start();
        if !rest.starts_with(b"}") {
            buf.push(b',');
        }
        buf.extend_from_slice(rest);
        buf
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn kafka(settings: &[(&str, &str)]) -> KafkaConfig {
        let config: BTreeMap<String, String> = settings.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        KafkaConfig { brokers: "127.0.0.1:9".into(), group: None, config }
    }

    #[test]
    fn tls_and_sasl_settings_reach_librdkafka_as_they_are() {
        let k = kafka(&[
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanisms", "SCRAM-SHA-256"),
            ("sasl.username", "weir"),
            ("sasl.password", "secret"),
        ]);
        let c = client_config(&k.brokers, Some(&k));
        assert_eq!(c.get("security.protocol"), Some("SASL_SSL"));
        assert_eq!(c.get("sasl.mechanisms"), Some("SCRAM-SHA-256"));
        assert!(producer(&k.brokers, Some(&k)).is_ok(), "librdkafka takes SASL over TLS (it is built with both)");
        // librdkafka itself reads them: a CA file that is not there stops the client at creation.
        let k = kafka(&[("security.protocol", "SSL"), ("ssl.ca.location", "/nonexistent/ca.pem")]);
        let refused = producer(&k.brokers, Some(&k)).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(refused.contains("ssl.ca.location") || refused.contains("/nonexistent/ca.pem"), "{refused}");
        let k = kafka(&[("security.protocol", "PIGEON")]);
        assert!(producer(&k.brokers, Some(&k)).is_err(), "an unknown protocol is refused");
    }
}

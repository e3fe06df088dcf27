//! Kafka as a source, with results and checkpoints in Postgres.
//!
//! Each `weir serve` worker joins the pipeline's consumer group; Kafka's
//! group protocol decides which worker reads which partition (no
//! coordinator of weir's own). The runner ([`crate::runner`]) keeps one
//! engine per partition the worker holds, so a partition's state moves
//! with it:
//!
//! 1. **assigned** (the rebalance callback, inside `poll`): the runner
//!    claims the partition in Postgres, which gives it a new fencing
//!    generation, restores its last checkpoint and reads on from its stored
//!    offset (records below it, which Kafka may deliver again, are skipped);
//! 2. **reading**: records go to their partition's engine; each changed
//!    partition is checkpointed in one Postgres transaction (rows, ledger,
//!    state, next offset), refused if another worker claimed it since;
//!    after the commit the offset is also committed to Kafka, for tools that
//!    read group lag;
//! 3. **revoked** (the rebalance callback, before the partitions go): each
//!    is checkpointed, then dropped; a worker that lost a partition without
//!    being told (paused too long, cut off) is refused by the fence and
//!    drops it.
//!
//! Operator actions reach every worker through Postgres, as they reach the
//! embedded runner through SQLite: a pause is a row that every checkpoint
//! reads, and a replay is a row that each worker applies to the partitions
//! it holds (the consumer seeks to the replay's offset).
//!
//! A record's partition and offset are its Kafka ones, in the ledger and in
//! provenance. A contract can read the record's Kafka attributes as
//! `$kafka.timestamp`, `$kafka.key`, `$kafka.partition`, `$kafka.offset`
//! and `$kafka.headers.NAME` (see [`KafkaFields`]): they are added to the
//! event as a `"$kafka"` member, so they are also in ledger payloads and
//! in duplicate comparison (a record resent by a producer has another
//! timestamp, so with `$kafka.timestamp` it is a `duplicate_conflict`).
//! The `weir-request` header, which the HTTP API sets on the records of a
//! request with an `Idempotency-Key`, is not among them: a retry with
//! another key reads the same.
//! A record whose payload has its own top-level `$kafka` member (however
//! its name is escaped) would forge them: it is ledgered `bad_type` and
//! counts nowhere, whatever the contract reads.
//! Windows close on their partition's watermark, so a topic must be
//! partitioned by the contract's key (as a Kafka Streams aggregation
//! requires): `weir produce` and the HTTP API use the topic's `key` field
//! as the record key.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use weir_contract::{Contract, KafkaConfig, PostgresConfig, ServerConfig};
use weir_store::PgCheckpoints;

use crate::lock;
use crate::runner::{Batch, Connected, Holder, Source};

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

/// How long a fetch may wait at the broker for records, unless
/// `[kafka.config]` says `fetch.wait.max.ms` (librdkafka's default is 500
/// ms). Apache Kafka answers a fetch as soon as it has a record, so there
/// this only makes an idle consumer ask more often; a broker that holds
/// every fetch for its whole wait (tansu does) would otherwise cap a
/// consumer at one fetch per partition each 500 ms: 62,000-64,000 events/s
/// with one worker in `bench/kafka.sh 1000000`, 126,000-131,000 with 10 ms.
const FETCH_WAIT_MS: &str = "10";

/// How long a partition's fetching pauses once its local queue holds
/// `queued.min.messages` (100,000) records, unless `[kafka.config]` says
/// `fetch.queue.backoff.ms` (librdkafka's default is 1,000 ms). A worker
/// that reads faster than a second's fetches found its queue empty at the
/// end of each pause and waited: 116,000-136,000 events/s with one worker
/// in `bench/kafka.sh 1000000`, 187,000-194,000 with 10 or 50 ms. The
/// queue's bound stays the same; only the pause is shorter.
const FETCH_QUEUE_BACKOFF_MS: &str = "10";

/// [`client_config`] for a consumer that reads records: with
/// [`FETCH_WAIT_MS`] and [`FETCH_QUEUE_BACKOFF_MS`] unless `kafka` sets them.
fn consumer_config(brokers: &str, kafka: Option<&KafkaConfig>) -> ClientConfig {
    let mut c = client_config(brokers, kafka);
    for (key, value) in [("fetch.wait.max.ms", FETCH_WAIT_MS), ("fetch.queue.backoff.ms", FETCH_QUEUE_BACKOFF_MS)] {
        if !kafka.is_some_and(|k| k.config.contains_key(key)) {
            c.set(key, value);
        }
    }
    c
}

/// The earliest timestamp from which the broker still holds `topic`
/// whole, when retention removed older records (`None`: every partition
/// starts at offset 0). Blocks: it reads each trimmed partition's first record.
pub fn input_kept_from(brokers: &str, kafka: Option<&KafkaConfig>, topic: &str) -> crate::Result<Option<i64>> {
    let consumer: BaseConsumer = client_config(brokers, kafka)
        .set("group.id", "weir-input-kept-from")
        .set("enable.auto.commit", "false")
        .create()?;
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let partitions = metadata.topics().first().map_or(0, |t| t.partitions().len());
    let mut kept_from = None;
    for p in 0..partitions as i32 {
        let (low, high) = consumer.fetch_watermarks(topic, p, Duration::from_secs(10))?;
        if low <= 0 || low >= high {
            continue;
        }
        let mut one = TopicPartitionList::new();
        one.add_partition_offset(topic, p, Offset::Offset(low))?;
        consumer.assign(&one)?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(message) = consumer.poll(Duration::from_millis(200)) {
                if let Some(t) = message?.timestamp().to_millis() {
                    kept_from = Some(kept_from.map_or(t, |k: i64| k.max(t)));
                }
                break;
            }
        }
    }
    Ok(kept_from)
}

/// The end (high watermark) of each partition of `topic`, asked now. Blocks.
pub fn topic_ends(brokers: &str, kafka: Option<&KafkaConfig>, topic: &str) -> crate::Result<Vec<u64>> {
    let consumer: BaseConsumer =
        client_config(brokers, kafka).set("group.id", "weir-topic-ends").set("enable.auto.commit", "false").create()?;
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let partitions = metadata.topics().first().map_or(0, |t| t.partitions().len());
    (0..partitions as i32)
        .map(|p| Ok(consumer.fetch_watermarks(topic, p, Duration::from_secs(10))?.1.max(0) as u64))
        .collect()
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

/// Kafka as a [`Source`]: one worker of the pipeline's consumer group,
/// with an engine per partition it holds ([`weir_store::Scope::Partition`]).
/// The group's rebalance callbacks tell the runner which partitions come
/// and go (inside `poll`, so a revoked partition is checkpointed before it
/// is handed over).
pub struct KafkaSource {
    name: String,
    topic: String,
    brokers: String,
    group: String,
    config: Arc<ServerConfig>,
    fields: KafkaFields,
    consumer: Option<BaseConsumer<Ctx>>,
    decorated: Vec<u8>,
    /// Each held partition's high watermark, as last fetched, and when.
    ends: BTreeMap<u32, u64>,
    ends_fetched: Option<Instant>,
}

impl KafkaSource {
    pub fn new(contract: &Contract, config: Arc<ServerConfig>, brokers: &str, group: &str) -> KafkaSource {
        KafkaSource {
            name: contract.pipeline.name.clone(),
            topic: contract.source.topic.clone(),
            brokers: brokers.to_owned(),
            group: group.to_owned(),
            config,
            fields: KafkaFields::of(contract),
            consumer: None,
            decorated: Vec::new(),
            ends: BTreeMap::new(),
            ends_fetched: None,
        }
    }

    fn consumer(&self) -> crate::Result<&BaseConsumer<Ctx>> {
        self.consumer.as_ref().ok_or_else(|| crate::refused!("the Kafka source of {} is not open", self.name))
    }
}

/// A run's source and checkpoints over Kafka and Postgres, as `worker`.
pub fn connect(
    contract: &Contract,
    config: &Arc<ServerConfig>,
    postgres: &PostgresConfig,
    (brokers, group): (&str, &str),
    worker: &str,
) -> crate::Result<Connected> {
    let client = weir_store::pg::connect(&postgres.url)?;
    let checkpoints = PgCheckpoints::open(client, &postgres.schema, worker, contract)?;
    let source = KafkaSource::new(contract, Arc::clone(config), brokers, group);
    Ok((Box::new(source), Box::new(checkpoints)))
}

struct Ctx {
    holder: Arc<dyn Holder>,
    topic: String,
    /// A panic caught in a rebalance callback: the run fails at its next
    /// read (a panic may not cross into librdkafka, which would abort).
    panicked: Mutex<Option<String>>,
}

impl Ctx {
    fn guarded(&self, what: &str, f: impl FnOnce()) {
        if let Err(why) = crate::caught(f) {
            eprintln!("weir: the rebalance callback ({what}) panicked: {why}");
            lock(&self.panicked).get_or_insert(format!("the rebalance callback ({what}) panicked: {why}"));
        }
    }
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
            let partitions: Vec<u32> =
                tpl.elements_for_topic(&self.topic).iter().map(|e| e.partition() as u32).collect();
            self.guarded("revoke", || self.holder.revoked(&partitions));
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                let partitions: Vec<u32> =
                    tpl.elements_for_topic(&self.topic).iter().map(|e| e.partition() as u32).collect();
                self.guarded("assign", || self.holder.assigned(&partitions));
            }
            Rebalance::Error(e) => eprintln!("weir: rebalance failed: {e}"),
            Rebalance::Revoke(_) => {}
        }
    }
}

impl Source for KafkaSource {
    fn per_partition(&self) -> bool {
        true
    }

    fn open(&mut self, holder: Arc<dyn Holder>) -> crate::Result<()> {
        let mut config = consumer_config(&self.brokers, self.config.kafka.as_ref());
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
        let ctx = Ctx { holder, topic: self.topic.clone(), panicked: Mutex::new(None) };
        let consumer: BaseConsumer<Ctx> = config.create_with_context(ctx)?;
        consumer.subscribe(&[&self.topic])?;
        self.consumer = Some(consumer);
        Ok(())
    }

    fn read(&mut self, _next: &[(u32, u64)], max: usize, wait: Duration, batch: &mut Batch) -> crate::Result<bool> {
        let Some(consumer) = self.consumer.as_ref() else { return Ok(false) };
        while batch.len() < max {
            let wait = if batch.is_empty() { wait } else { Duration::ZERO };
            let polled = consumer.poll(wait);
            if let Some(why) = lock(&consumer.context().panicked).take() {
                crate::bail!("{why}");
            }
            match polled {
                None => break,
                Some(Ok(m)) => {
                    let payload = m.payload().unwrap_or_default();
                    let (partition, offset, time) =
                        (m.partition() as u32, m.offset().max(0) as u64, m.timestamp().to_millis());
                    if weir_engine::intake::has_reserved_member(payload) {
                        batch.push_forged(partition, offset, time, payload);
                    } else {
                        batch.push(partition, offset, time, self.fields.decorate(&m, payload, &mut self.decorated));
                    }
                }
                Some(Err(e)) => {
                    eprintln!("weir: {}: reading {}: {e}", self.name, self.topic);
                    break;
                }
            }
        }
        Ok(batch.len() >= max)
    }

    fn ends(&mut self, partitions: &[u32]) -> crate::Result<Vec<(u32, u64)>> {
        let stale = self.ends_fetched.is_none_or(|at| at.elapsed() >= Duration::from_secs(1));
        if stale {
            let consumer = self.consumer()?;
            let mut ends = BTreeMap::new();
            for &p in partitions {
                if let Ok((_, high)) = consumer.fetch_watermarks(&self.topic, p as i32, Duration::from_secs(1)) {
                    ends.insert(p, high.max(0) as u64);
                }
            }
            self.ends = ends;
            self.ends_fetched = Some(Instant::now());
        }
        Ok(partitions.iter().filter_map(|p| self.ends.get(p).map(|end| (*p, *end))).collect())
    }

    fn bounds(&mut self, partition: u32) -> crate::Result<(u64, u64)> {
        let (low, high) = self.consumer()?.fetch_watermarks(&self.topic, partition as i32, Duration::from_secs(5))?;
        Ok((low.max(0) as u64, high.max(0) as u64))
    }

    fn seek(&mut self, partition: u32, offset: u64) -> crate::Result<()> {
        let topic = self.topic.clone();
        self.consumer()?.seek(&topic, partition as i32, Offset::Offset(offset as i64), Duration::from_secs(5))?;
        Ok(())
    }

    fn checkpointed(&mut self, offsets: &[(u32, u64)]) {
        let Some(consumer) = self.consumer.as_ref() else { return };
        let mut list = TopicPartitionList::new();
        for (p, next) in offsets {
            if list.add_partition_offset(&self.topic, *p as i32, Offset::Offset(*next as i64)).is_err() {
                return;
            }
        }
        // For tools that read the group's lag; Postgres holds the offsets weir resumes from.
        if let Err(e) = consumer.commit(&list, CommitMode::Async) {
            eprintln!("weir: {}: committing offsets to Kafka: {e}", self.name);
        }
    }

    fn close(&mut self) {
        if let Some(consumer) = self.consumer.take() {
            consumer.unsubscribe();
        }
    }
}

/// Kafka as a backfill's input ([`crate::backfill::Input`]): every
/// partition of the topic assigned (no group membership, nothing
/// committed), read from its first kept record to the high watermark it
/// had when the read started.
pub struct KafkaInput {
    pub brokers: String,
    pub config: Arc<ServerConfig>,
    pub topic: String,
    pub fields: KafkaFields,
}

impl KafkaInput {
    pub fn new(contract: &Contract, config: Arc<ServerConfig>, brokers: &str) -> KafkaInput {
        KafkaInput {
            brokers: brokers.to_owned(),
            config,
            topic: contract.source.topic.clone(),
            fields: KafkaFields::of(contract),
        }
    }

    fn consumer(&self) -> crate::Result<BaseConsumer> {
        Ok(consumer_config(&self.brokers, self.config.kafka.as_ref())
            .set("group.id", format!("weir-backfill-{}", self.topic))
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "true")
            .create()?)
    }
}

impl crate::backfill::Input for KafkaInput {
    fn partitions(&mut self) -> crate::Result<u32> {
        let metadata = self.consumer()?.fetch_metadata(Some(&self.topic), Duration::from_secs(10))?;
        Ok(metadata.topics().first().map_or(0, |t| t.partitions().len()) as u32)
    }

    fn kept_from(&mut self) -> crate::Result<Option<i64>> {
        input_kept_from(&self.brokers, self.config.kafka.as_ref(), &self.topic)
    }

    fn read(&mut self, each: &mut dyn FnMut(crate::backfill::Record<'_>) -> crate::Result<()>) -> crate::Result<()> {
        let partitions = self.partitions()?;
        let consumer = self.consumer()?;
        for p in 0..partitions as i32 {
            let (low, high) = consumer.fetch_watermarks(&self.topic, p, Duration::from_secs(10))?;
            if low >= high {
                continue;
            }
            let mut decorated = Vec::new();
            read_partition(&consumer, (&self.topic, p), (low, high), "reading for a backfill", &mut |m| {
                let payload = m.payload().unwrap_or_default();
                let forged = weir_engine::intake::has_reserved_member(payload);
                let bytes = if forged { payload } else { self.fields.decorate(m, payload, &mut decorated) };
                each(crate::backfill::Record {
                    partition: p as u32,
                    offset: m.offset().max(0) as u64,
                    time_ms: m.timestamp().to_millis(),
                    bytes,
                    forged,
                })
            })?;
        }
        Ok(())
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

/// The header that says which request with an `Idempotency-Key` produced
/// a record: its value is the request's tag, in hex.
pub const REQUEST_HEADER: &str = "weir-request";

/// Produces `payloads` (each with its partitioning field's JSON text in `keys`)
/// and waits for every acknowledgement; the partitions and offsets written.
/// `tag` (hex) goes in each record's [`REQUEST_HEADER`].
/// Kafka has no all-or-nothing append without transactions: after an error
/// some records may be written; sending again is safe with `[dedup]`.
pub async fn produce(
    producer: &FutureProducer,
    topic: &str,
    payloads: impl IntoIterator<Item = &[u8]>,
    keys: &[Option<String>],
    tag: Option<&str>,
) -> Result<Vec<(u32, u64)>, String> {
    let mut pending = Vec::with_capacity(keys.len());
    for (payload, key) in payloads.into_iter().zip(keys) {
        let key = key.as_deref().map(record_key);
        let mut record = FutureRecord::<String, [u8]>::to(topic).payload(payload);
        if let Some(k) = &key {
            record = record.key(k);
        }
        if let Some(tag) = tag {
            let header = rdkafka::message::Header { key: REQUEST_HEADER, value: Some(tag) };
            record = record.headers(rdkafka::message::OwnedHeaders::new().insert(header));
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

/// Reads `topic`'s partition `p` with `consumer` (made with
/// `enable.partition.eof`) from offset `start` to its end, handing each
/// record to `each`. The end is the end-of-partition event once past
/// `high` (the high watermark asked before): a broker may report a lower
/// one than it serves. Nothing arriving for 30 s is an error naming `what`.
pub(crate) fn read_partition(
    consumer: &BaseConsumer,
    (topic, p): (&str, i32),
    (start, high): (i64, i64),
    what: &str,
    each: &mut dyn FnMut(&rdkafka::message::BorrowedMessage<'_>) -> crate::Result<()>,
) -> crate::Result<()> {
    let mut one = TopicPartitionList::new();
    one.add_partition_offset(topic, p, Offset::Offset(start))?;
    consumer.assign(&one)?;
    let (mut next, mut silent) = (start, Instant::now());
    loop {
        match consumer.poll(Duration::from_millis(200)) {
            None if silent.elapsed() > Duration::from_secs(30) => crate::bail!(
                "{what} {topic} partition {p}: nothing arrived for 30 s at offset {next} (the high watermark was {high})"
            ),
            None => {}
            Some(Err(KafkaError::PartitionEOF(_))) if next >= high => return Ok(()),
            Some(Err(KafkaError::PartitionEOF(_))) => {}
            Some(Err(e)) => return Err(e.into()),
            Some(Ok(m)) => {
                silent = Instant::now();
                next = m.offset() + 1;
                each(&m)?;
            }
        }
    }
}

/// For each of `partitions` partitions of `topic`, the offset of its first
/// record stamped at or after `since_ms`, `None` where there is none.
pub(crate) fn offsets_at(
    consumer: &BaseConsumer,
    topic: &str,
    partitions: i32,
    since_ms: i64,
) -> crate::Result<Vec<Option<i64>>> {
    let mut times = TopicPartitionList::new();
    for p in 0..partitions {
        times.add_partition_offset(topic, p, Offset::Offset(since_ms))?;
    }
    let found = consumer.offsets_for_times(times, Duration::from_secs(10))?;
    Ok((0..partitions)
        .map(|p| match found.find_partition(topic, p).map(|e| e.offset()) {
            Some(Offset::Offset(o)) => Some(o),
            _ => None,
        })
        .collect())
}

/// The records of `topic` whose [`REQUEST_HEADER`] is `tag`, produced at
/// or after `since_ms` (by their timestamps, as the broker finds them):
/// `(partition, offset, payload)`, in offset order per partition. Blocks:
/// it reads each partition from that time to its end. A request cut short
/// by a crash is finished with it.
pub fn tagged_since(
    brokers: &str,
    kafka: Option<&KafkaConfig>,
    topic: &str,
    since_ms: i64,
    tag: &str,
) -> crate::Result<Vec<(u32, u64, Vec<u8>)>> {
    let consumer: BaseConsumer = consumer_config(brokers, kafka)
        .set("group.id", "weir-tagged-since")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .create()?;
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let partitions = metadata.topics().first().map_or(0, |t| t.partitions().len()) as i32;
    let starts = offsets_at(&consumer, topic, partitions, since_ms)?;
    let mut found = Vec::new();
    for (p, start) in (0..partitions).zip(starts) {
        let (_, high) = consumer.fetch_watermarks(topic, p, Duration::from_secs(10))?;
        let Some(start) = start.filter(|&o| o < high) else { continue }; // nothing at or after that time
        read_partition(&consumer, (topic, p), (start, high), "reading", &mut |m| {
            let ours = m
                .headers()
                .is_some_and(|hs| hs.iter().any(|h| h.key == REQUEST_HEADER && h.value == Some(tag.as_bytes())));
            if ours {
                found.push((p as u32, m.offset().max(0) as u64, m.payload().unwrap_or_default().to_vec()));
            }
            Ok(())
        })?;
    }
    Ok(found)
}

/// Creates `topic` with `partitions` partitions (replication factor 1 on a
/// single broker, else the broker's default) unless it exists; returns its
/// partition count. weir.toml's `[topics.NAME] partitions` says how many.
pub async fn ensure_topic(
    brokers: &str,
    kafka: Option<&KafkaConfig>,
    topic: &str,
    partitions: u32,
) -> crate::Result<u32> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> = client_config(brokers, kafka).create()?;
    let existing = |admin: &AdminClient<DefaultClientContext>| -> crate::Result<Option<u32>> {
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
                crate::bail!("cannot create the Kafka topic {name}: {code}; create it with {partitions} partitions, keyed by the contract's key");
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
                for h in hs.iter().filter(|h| h.key != REQUEST_HEADER) {
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

    struct Panicking;

    impl Holder for Panicking {
        fn assigned(&self, _: &[u32]) {
            panic!("the holder broke");
        }
        fn revoked(&self, _: &[u32]) {}
    }

    #[test]
    fn point_11_a_panic_in_a_rebalance_callback_fails_the_run_instead_of_aborting() {
        let ctx = Ctx { holder: Arc::new(Panicking), topic: "payments".into(), panicked: Mutex::new(None) };
        ctx.guarded("assign", || ctx.holder.assigned(&[0]));
        let why = lock(&ctx.panicked).clone().unwrap_or_default();
        assert_eq!(why, "the rebalance callback (assign) panicked: the holder broke");
        ctx.guarded("revoke", || ctx.holder.revoked(&[0]));
        assert_eq!(lock(&ctx.panicked).as_deref(), Some(why.as_str()), "the first panic is the one kept");
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

    /// Each of weir's consumer defaults, set unless `[kafka.config]` names
    /// it (and then only that one is left to the configuration).
    fn consumer_default_unless_told_otherwise(key: &str, default: &str, other: (&str, &str)) {
        assert_eq!(consumer_config("127.0.0.1:9092", None).get(key), Some(default), "{key}");
        let k = kafka(&[(key, "250")]);
        assert_eq!(consumer_config(&k.brokers, Some(&k)).get(key), Some("250"), "{key} as configured");
        assert_eq!(consumer_config(&k.brokers, Some(&k)).get(other.0), Some(other.1), "{} kept", other.0);
        let created: crate::Result<BaseConsumer> =
            consumer_config(&k.brokers, None).set("group.id", "weir-test").create().map_err(Into::into);
        assert!(created.is_ok(), "librdkafka takes {key}");
        assert_eq!(client_config(&k.brokers, None).get(key), None, "producers are not given {key}");
    }

    #[test]
    fn a_consumer_waits_at_most_10_ms_at_the_broker_unless_told_otherwise() {
        let other = ("fetch.queue.backoff.ms", FETCH_QUEUE_BACKOFF_MS);
        consumer_default_unless_told_otherwise("fetch.wait.max.ms", FETCH_WAIT_MS, other);
    }

    #[test]
    fn a_full_fetch_queue_pauses_a_partition_10_ms_unless_told_otherwise() {
        let other = ("fetch.wait.max.ms", FETCH_WAIT_MS);
        consumer_default_unless_told_otherwise("fetch.queue.backoff.ms", FETCH_QUEUE_BACKOFF_MS, other);
    }
}

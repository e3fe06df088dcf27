//! `[sink]`: a pipeline's published rows (and, with `ledger_topic`, its
//! ledger entries) also go to Kafka topics, for consumers that subscribe
//! instead of polling `/changes`.
//!
//! The publisher reads the pipeline's change stream from the store, in
//! `seq` order: every version's rows and the `version` entries of promotes
//! and rollbacks (SPEC.md 8). `seq` is shared by the versions and never
//! goes back, so one position per sink topic covers every version and no
//! row of any version is skipped. It produces each row (record key:
//! `{"version":...,"key":...,"window_start":...}`, value: the row with its
//! `seq`, `version` and `revision`), waits until Kafka acknowledges
//! all of them, then records the next `seq` in the store (`sinks` table).
//! Delivery is **at least once**: a publisher that stops between Kafka's
//! acknowledgement and that record produces those rows again when it
//! restarts, so a consumer keeps, per key and window, the highest revision
//! it has seen. Rows held by a pause are not published until the resume.
//! With Postgres, one worker per pipeline publishes: the one holding the
//! pipeline's sink advisory lock (another takes over if its session ends).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::producer::FutureProducer;
use weir_contract::{Contract, PostgresConfig};

use weir_store::sqlite as store;

/// Where the change stream is read from.
pub enum SinkStore {
    Sqlite(std::path::PathBuf),
    Postgres(PostgresConfig),
}

pub struct SinkRunner {
    pub contract: Contract,
    pub producer: FutureProducer,
    pub store: SinkStore,
    pub stop: Arc<AtomicBool>,
    pub runtime: tokio::runtime::Handle,
}

const BATCH: i64 = 2_000;

/// Rows or ledger entries: `(seq, record key, line)`.
type Lines = Vec<(i64, String, String)>;

enum Conn {
    Sqlite(rusqlite::Connection),
    Postgres(Box<postgres::Client>, String),
}

impl Conn {
    fn position(&mut self, pipeline: &str, topic: &str) -> anyhow::Result<i64> {
        Ok(match self {
            Conn::Sqlite(c) => store::sink_position(c, pipeline, topic)?,
            Conn::Postgres(c, schema) => weir_store::pg::sink_position(c, schema, pipeline, topic)?,
        })
    }

    fn set_position(&mut self, pipeline: &str, topic: &str, next: i64) -> anyhow::Result<()> {
        match self {
            Conn::Sqlite(c) => store::set_sink_position(c, pipeline, topic, next)?,
            Conn::Postgres(c, schema) => weir_store::pg::set_sink_position(c, schema, pipeline, topic, next)?,
        }
        Ok(())
    }

    fn read(&mut self, contract: &weir_contract::Contract, ledger: bool, since: i64) -> anyhow::Result<Lines> {
        let pipeline = &contract.pipeline.name;
        let lines = match (self, ledger) {
            (Conn::Sqlite(c), false) => store::changes(c, pipeline, None, since, BATCH)?,
            (Conn::Sqlite(c), true) => store::ledger(c, pipeline, None, None, (since, BATCH), false)?,
            (Conn::Postgres(c, schema), false) => weir_store::pg::changes(c, schema, pipeline, None, since, BATCH)?,
            (Conn::Postgres(c, schema), true) => {
                weir_store::pg::ledger(c, schema, pipeline, None, None, (since, BATCH), false)?
            }
        };
        Ok(lines
            .into_iter()
            .filter_map(|l| {
                let v = serde_json::from_str::<serde_json::Value>(&l).ok()?;
                let (seq, key) = (v["seq"].as_i64()?, record_key(&v, ledger));
                if ledger && !contract.personal.is_empty() {
                    return Some((seq, key, crate::privacy::for_sink(v, contract).to_string()));
                }
                Some((seq, key, l))
            })
            .collect())
    }
}

impl SinkRunner {
    pub fn run(self) {
        let name = self.contract.pipeline.name.clone();
        while !self.stop.load(Ordering::SeqCst) {
            if let Err(e) = self.run_once() {
                eprintln!("weir: {name}: publishing to Kafka failed, trying again in 1 s: {e:#}");
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }

    fn connect(&self) -> anyhow::Result<Option<Conn>> {
        Ok(Some(match &self.store {
            SinkStore::Sqlite(path) => Conn::Sqlite(store::open(path)?),
            SinkStore::Postgres(pg) => {
                let mut client = weir_store::pg::connect(&pg.url)?;
                let key = format!("weir sink {}", self.contract.pipeline.name);
                let held: bool = client.query_one("SELECT pg_try_advisory_lock(hashtext($1))", &[&key])?.get(0);
                if !held {
                    return Ok(None);
                }
                Conn::Postgres(Box::new(client), pg.schema.clone())
            }
        }))
    }

    fn run_once(&self) -> anyhow::Result<()> {
        let Some(sink) = &self.contract.sink else { return Ok(()) };
        let Some(mut conn) = self.connect()? else {
            // Another worker publishes this pipeline.
            std::thread::sleep(Duration::from_secs(1));
            return Ok(());
        };
        let pipeline = &self.contract.pipeline.name;
        let mut topics = vec![(sink.topic.clone(), false)];
        if let Some(t) = &sink.ledger_topic {
            topics.push((t.clone(), true));
        }
        while !self.stop.load(Ordering::SeqCst) {
            let mut sent = 0;
            for (topic, ledger) in &topics {
                let since = conn.position(pipeline, topic)?;
                let lines = conn.read(&self.contract, *ledger, since)?;
                let Some(&(last, _, _)) = lines.last() else { continue };
                let keys: Vec<Option<String>> = lines.iter().map(|(_, k, _)| Some(k.clone())).collect();
                let records: Vec<(u32, Vec<u8>)> = lines.iter().map(|(_, _, l)| (0, l.as_bytes().to_vec())).collect();
                self.runtime
                    .block_on(crate::kafka::produce(&self.producer, topic, &records, &keys))
                    .map_err(anyhow::Error::msg)?;
                conn.set_position(pipeline, topic, last + 1)?;
                sent += lines.len();
            }
            if sent == 0 {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(())
    }
}

/// `{"version":...,"key":...,"window_start":...}` of a row (versions of
/// one window are different records), `{"type":"version","to":...}` of a
/// promote or rollback, or the ledger entry's version, partition and
/// offset, as the record key's JSON text.
fn record_key(v: &serde_json::Value, ledger: bool) -> String {
    if ledger {
        serde_json::json!({ "version": v["version"], "partition": v["partition"], "offset": v["offset"] }).to_string()
    } else if v["type"] == "version" {
        serde_json::json!({ "type": "version", "to": v["to"] }).to_string()
    } else {
        serde_json::json!({ "version": v["version"], "key": v["key"], "window_start": v["window_start"] }).to_string()
    }
}

//! The two topologies a server test runs on: the embedded log with SQLite,
//! and a real Kafka-API broker (`tansu`, started on a free port with
//! in-memory storage; `WEIR_TANSU` names the binary, `scripts/test`
//! installs it) with the machine's PostgreSQL (`WEIR_TEST_POSTGRES`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{start, Scratch, Server};

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A tansu broker on a free port, stopped when dropped.
pub struct Broker {
    child: Child,
    pub url: String,
}

impl Broker {
    pub fn start() -> Broker {
        let bin = std::env::var("WEIR_TANSU").unwrap_or_else(|_| "tansu".into());
        let port = free_port();
        let listener = format!("tcp://127.0.0.1:{port}");
        let child = Command::new(&bin)
            .args(["broker", "--listener-url", &listener, "--advertised-listener-url", &listener])
            .args(["--storage-engine", "memory://tansu/"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start {bin}: {e}; install it with `cargo install tansu --locked --features dynostore` (scripts/test does)")
            });
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "tansu did not listen on {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        Broker { child, url: format!("127.0.0.1:{port}") }
    }
}

impl Broker {
    /// Stops the broker's process where it is (SIGSTOP): requests to it wait.
    pub fn pause(&self) {
        signal(self.child.id(), "-STOP");
    }

    /// Lets a paused broker go on (SIGCONT).
    pub fn resume(&self) {
        signal(self.child.id(), "-CONT");
    }
}

fn signal(pid: u32, which: &str) {
    let done = Command::new("kill").args([which, &pid.to_string()]).status().unwrap();
    assert!(done.success(), "kill {which} {pid}");
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn postgres_url() -> String {
    std::env::var("WEIR_TEST_POSTGRES").unwrap_or_else(|_| "host=127.0.0.1 user=postgres dbname=test".into())
}

/// A role of its own that may only read `tables` (each `schema.table`), and
/// a URL that logs in as it: what a system of record's `[connections.NAME]`
/// holds (never the store's own account).
pub fn record_reader(tables: &[&str]) -> String {
    let role = "weir_test_record_reader";
    let mut c = postgres::Client::connect(&postgres_url(), postgres::NoTls).unwrap();
    c.batch_execute(&format!(
        "DO $$ BEGIN CREATE ROLE {role} LOGIN; EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
    ))
    .unwrap();
    for table in tables {
        let schema = table.split('.').next().unwrap();
        c.batch_execute(&format!("GRANT USAGE ON SCHEMA {schema} TO {role}; GRANT SELECT ON {table} TO {role}"))
            .unwrap();
    }
    format!("{} user={role}", postgres_url())
}

/// A Postgres schema of this test's own, dropped at the end.
pub struct Schema(pub String);

impl Schema {
    pub fn new(name: &str) -> Schema {
        let s = format!("weir_test_{name}_{}", std::process::id());
        let mut c = postgres::Client::connect(&postgres_url(), postgres::NoTls).unwrap();
        c.batch_execute(&format!("DROP SCHEMA IF EXISTS {s} CASCADE")).unwrap();
        Schema(s)
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        if let Ok(mut c) = postgres::Client::connect(&postgres_url(), postgres::NoTls) {
            let _ = c.batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.0));
        }
    }
}

/// Where a test's server keeps its events and results.
pub enum Topology {
    /// The embedded log and SQLite.
    Embedded,
    /// Kafka and Postgres.
    Kafka(Broker, Schema),
}

impl Topology {
    /// Both, the embedded one first; `name` names the Postgres schema.
    pub fn both(name: &str) -> [Topology; 2] {
        [Topology::Embedded, Topology::Kafka(Broker::start(), Schema::new(name))]
    }

    pub fn name(&self) -> &'static str {
        match self {
            Topology::Embedded => "embedded log and SQLite",
            Topology::Kafka(..) => "Kafka and Postgres",
        }
    }

    /// `weir.toml`: the topic `topic` with `partitions` partitions keyed by
    /// `key`, then `extra`, then (on Kafka) the broker and the schema.
    pub fn config(&self, (topic, partitions, key): (&str, u32, &str), extra: &str) -> String {
        let mut out = format!("{extra}\n[topics.{topic}]\npartitions = {partitions}\nkey = \"{key}\"\n");
        if let Topology::Kafka(broker, schema) = self {
            out.push_str(&format!(
                "\n[kafka]\nbrokers = \"{}\"\n[kafka.config]\n\"session.timeout.ms\" = \"6000\"\n\"heartbeat.interval.ms\" = \"500\"\n\n[postgres]\nurl = \"{}\"\nschema = \"{}\"\n",
                broker.url,
                postgres_url(),
                schema.0
            ));
        }
        out
    }

    /// A server folder under `s` with these contracts (file name, text) and
    /// weir.toml; started with [`Topology::serve`].
    pub fn folder(&self, s: &Scratch, name: &str, contracts: &[(&str, &str)], config: &str) -> PathBuf {
        let root = s.path(name);
        std::fs::create_dir_all(root.join("contracts")).unwrap();
        for (file, text) in contracts {
            std::fs::write(root.join("contracts").join(file), text).unwrap();
        }
        std::fs::write(root.join("weir.toml"), config).unwrap();
        root
    }

    /// `weir serve` on `root`; the server and its base URL.
    pub fn serve(&self, root: &Path) -> (Server, String) {
        let port = free_port();
        (start(root, port), format!("http://127.0.0.1:{port}"))
    }
}

//! weir's operations, apart from the HTTP side that serves them: the alert
//! loop (`alerts`), the contracts' checks (`checks`), versions followed,
//! announced and promoted (`versions`), what the loop observed (`watch`), a
//! pipeline version's status as one value (`report`), the delivery of
//! notifications to webhooks (`webhooks`), and the difference between two
//! versions' rows (`diff`), the lateness advice (`advice`), and failure
//! drills (`drill_run`, with `stand_in`, the receiver a drill delivers to).
//! They share [`Ops`]. `weir-server` keeps the
//! listener, `App` (which holds an `Ops`), the routes and their handlers,
//! and starts the alert loop.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use weir_contract::ServerConfig;
use weir_log::Log;
use weir_runtime::Pipeline;
use weir_store::Switch;

pub mod advice;
pub mod alerts;
pub mod checks;
pub mod diff;
pub mod drill_run;
pub mod report;
pub mod stand_in;
pub mod versions;
pub mod watch;
pub mod webhooks;

/// The operations fail as the runtime parts they run do.
pub use weir_runtime::{Error, Result};

/// What the operations share with each other and with the HTTP side.
pub struct Ops {
    pub log: Log,
    pub config: Arc<ServerConfig>,
    pub pipelines: BTreeMap<String, Pipeline>,
    /// `weir.db` through a pool: tokens, the audit log, and the embedded pipelines' rows.
    pub sqlite: Arc<weir_store::SqliteStore>,
    /// What the alert loop observed: chart samples, firing alerts, notifications.
    pub watch: watch::Watch,
    /// The webhooks' queues and delivery counts.
    pub webhooks: webhooks::Webhooks,
    /// Candidates announced, and version notifications waiting to be sent.
    pub versions: Mutex<VersionWatch>,
    /// Notifications for the owners (a failed reconciliation), sent by the alert loop.
    pub notes: weir_runtime::backfill::Notes,
    /// The data folder (drills keep their shadows' stores under `drills/`).
    pub data: std::path::PathBuf,
    /// Set once the server stops: change feeds and drills end.
    pub closing: tokio::sync::watch::Sender<bool>,
}

impl Ops {
    pub fn new(
        log: Log,
        config: Arc<ServerConfig>,
        pipelines: BTreeMap<String, Pipeline>,
        sqlite: Arc<weir_store::SqliteStore>,
    ) -> Ops {
        Ops {
            log,
            config,
            pipelines,
            sqlite,
            watch: watch::Watch::default(),
            webhooks: webhooks::Webhooks::default(),
            versions: Mutex::default(),
            notes: weir_runtime::backfill::Notes::default(),
            data: std::path::PathBuf::new(),
            closing: tokio::sync::watch::Sender::new(false),
        }
    }
}

/// What the version loop remembers: the candidates it announced, the
/// notifications it asked for (each is written with a diff, off the alert
/// loop, by [`versions::notify`]), and those written, waiting for the alert
/// loop's webhook queue.
#[derive(Default)]
pub struct VersionWatch {
    pub announced: BTreeSet<(String, u32)>,
    pub asked: Vec<(String, &'static str, Switch)>,
    pub outbox: Vec<(String, Value)>,
}

//! `weir serve`: every contract in a folder running continuously over the
//! embedded log (`weir-log`), results and checkpoints in SQLite, and the
//! HTTP API of SPEC.md section 7.
//!
//! ```text
//!  POST events ──> weir-log (fsync, group commit) ──> pipeline thread per contract
//!                                                      │ Engine (weir-engine)
//!  GET results/changes/ledger <── SQLite (weir.db) <───┘ one transaction per checkpoint
//! ```
//!
//! Layout of `--data`: `log/` (the log's topics), `weir.db` (SQLite).

mod actions;
mod admin;
mod advice;
mod app;
mod backfills;
mod checks;
mod dashboard;
mod drills;
pub mod error;
mod events;
mod feed;
mod http;
mod incidents;
pub mod listen;
mod metrics;
mod otel;
mod pipelines;
mod provenance;
mod readers;
mod review;
mod start;

use std::path::{Path, PathBuf};

use weir_contract::{Contract, ServerConfig};
use weir_log::LogOptions;

pub use weir_runtime::privacy;

pub struct ServeOptions {
    pub data: PathBuf,
    pub contracts: Vec<Contract>,
    pub config: ServerConfig,
    pub listen: String,
    /// Where the log's injected failures are switched (tests and drills).
    pub log_options: LogOptions,
    /// HTTPS: a PEM certificate chain and its PEM private key.
    pub tls: Option<(PathBuf, PathBuf)>,
}

/// Reads every `*.toml` in `dir` as a contract, in name order.
pub fn load_contracts(dir: &Path) -> Result<Vec<Contract>, String> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot read the contracts folder {}: {e}; check the --contracts path", dir.display()))?;
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    paths.sort();
    let mut contracts: Vec<Contract> = Vec::new();
    let mut errors = Vec::new();
    for path in paths {
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) => {
                errors.push(format!("{}: cannot read: {e}", path.display()));
                continue;
            }
        };
        match Contract::parse(&path.display().to_string(), &text) {
            Ok(c) => {
                if let Some(other) = contracts.iter().find(|o| o.pipeline.name == c.pipeline.name) {
                    errors.push(format!(
                        "{}: pipeline {:?} is also defined by another contract (version {}); each pipeline name may appear once",
                        path.display(),
                        c.pipeline.name,
                        other.pipeline.version
                    ));
                } else {
                    contracts.push(c);
                }
            }
            Err(e) => errors.push(e.to_string()),
        }
    }
    if !errors.is_empty() {
        return Err(errors.join("\n"));
    }
    if contracts.is_empty() {
        return Err(format!("no contracts (*.toml) in {}; add one, e.g. from weir demo's folder", dir.display()));
    }
    Ok(contracts)
}

pub use error::{Error, Result};
pub use start::serve;

//! A pipeline's contract versions (SPEC.md section 8): which are stored,
//! which one is live, and what a contract file or an operator's promote or
//! rollback does to them.
//!
//! Each version is a run of its own, with its own state, rows, change
//! stream entries and ledger; the `versions` table (in SQLite and in
//! Postgres alike) holds one row per version with its state, its contract
//! (text and hash) and who started and promoted it.
//!
//! Invariants:
//!
//! - **At most one version of a pipeline is live**, and once a pipeline has
//!   a version, exactly one is.
//! - **A stored version's contract never changes**: a file naming a stored
//!   version with another parsed contract is refused ([`Registration::Refused`]).
//! - **Versions only grow**: a file naming an unknown version below the
//!   newest stored one is refused.
//!
//! The decisions ([`register`], [`promote`], [`rollback`]) are pure: they
//! read the stored versions and say what to write; `sqlite` and `pg` do the
//! writing, each in one transaction that also appends the `version` entry
//! to the change stream.

use serde::Serialize;

/// Where a version stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum VersionState {
    /// Being built beside the live version; readable with `?version=N`.
    Candidate,
    /// What readers get by default.
    Live,
    /// Replaced by a promote or a rollback; readable until its retention ends.
    Superseded,
}

impl VersionState {
    pub fn as_str(self) -> &'static str {
        match self {
            VersionState::Candidate => "candidate",
            VersionState::Live => "live",
            VersionState::Superseded => "superseded",
        }
    }

    pub fn parse(s: &str) -> VersionState {
        match s {
            "live" => VersionState::Live,
            "candidate" => VersionState::Candidate,
            _ => VersionState::Superseded,
        }
    }

    /// Whether a runner of this version reads its source.
    pub fn runs(self) -> bool {
        self != VersionState::Superseded
    }
}

/// One stored version.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Version {
    pub version: u32,
    pub state: VersionState,
    /// The parsed contract's hash (16 hex digits).
    pub contract_hash: String,
    /// The contract as written (empty for a version stored before versions
    /// were kept, until its file is read again).
    #[serde(skip)]
    pub contract: String,
    pub started_ms: i64,
    pub started_by: String,
    pub promoted_ms: Option<i64>,
    pub promoted_by: Option<String>,
    /// When it stopped being live (or a candidate).
    pub superseded_ms: Option<i64>,
    /// The version that was live when this one was promoted (what a rollback goes back to).
    pub replaced: Option<u32>,
}

/// A contract file's identity: version, parsed hash, the hash of its bytes
/// (how versions stored before parsed hashes name it), and its text.
#[derive(Debug, Clone, Copy)]
pub struct FileContract<'a> {
    pub version: u32,
    pub hash: u64,
    pub bytes_hash: u64,
    pub text: &'a str,
}

/// What a contract file does to the stored versions.
#[derive(Debug, Clone, PartialEq)]
pub enum Registration {
    /// The version is stored with this contract: nothing to write.
    Known,
    /// The version is stored from before contracts were kept: store its text and parsed hash.
    Adopt,
    /// A new version: stored in this state (`Live` for a pipeline's first),
    /// superseding the older candidates listed.
    New { state: VersionState, supersedes: Vec<u32> },
    /// Not run: why, and what to do.
    Refused(String),
}

pub fn hash_text(hash: u64) -> String {
    format!("{hash:016x}")
}

/// What `file` does to `pipeline`'s stored versions.
pub fn register(pipeline: &str, stored: &[Version], file: FileContract<'_>) -> Registration {
    let newest = stored.iter().map(|v| v.version).max();
    if let Some(found) = stored.iter().find(|v| v.version == file.version) {
        if found.contract_hash == hash_text(file.hash) {
            return Registration::Known;
        }
        if found.contract.is_empty() && found.contract_hash == hash_text(file.bytes_hash) {
            return Registration::Adopt;
        }
        return Registration::Refused(format!(
            "pipeline {pipeline}: the contract of version {} changed without a version bump (stored contract hash {}, the file's {}); set [pipeline] version = {} to run the change as a new version, or restore version {}'s contract",
            file.version,
            found.contract_hash,
            hash_text(file.hash),
            newest.unwrap_or(file.version) + 1,
            file.version,
        ));
    }
    match newest {
        None => Registration::New { state: VersionState::Live, supersedes: Vec::new() },
        Some(newest) if file.version < newest => Registration::Refused(format!(
            "pipeline {pipeline}: version {} is older than version {newest}, which is stored; versions only grow: set [pipeline] version = {} for a new version",
            file.version,
            newest + 1
        )),
        Some(_) => Registration::New {
            state: VersionState::Candidate,
            supersedes: stored.iter().filter(|v| v.state == VersionState::Candidate).map(|v| v.version).collect(),
        },
    }
}

/// A promote or a rollback, decided: which version goes live and which one it replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Switch {
    pub from: Option<u32>,
    pub to: u32,
}

/// Why a promote or a rollback cannot happen (the HTTP side answers 409 or 404).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SwitchError {
    #[error("pipeline {pipeline} has no version {version}; GET /v1/pipelines/{pipeline}/versions lists them")]
    Unknown { pipeline: String, version: u32 },
    #[error("version {version} of {pipeline} is live already")]
    AlreadyLive { pipeline: String, version: u32 },
    #[error(
        "version {version} of {pipeline} was stored before versions kept their contract: add its contract file back and restart first"
    )]
    NoContract { pipeline: String, version: u32 },
    #[error(
        "pipeline {pipeline} has no earlier live version to roll back to (version {live} was never promoted over another)"
    )]
    NothingToRollBack { pipeline: String, live: u32 },
    #[error("pipeline {pipeline} has no live version")]
    NoLive { pipeline: String },
}

/// Promoting `version`: a candidate, or a superseded version (which then
/// catches up from its own checkpoint).
pub fn promote(pipeline: &str, stored: &[Version], version: u32) -> Result<Switch, SwitchError> {
    let Some(target) = stored.iter().find(|v| v.version == version) else {
        return Err(SwitchError::Unknown { pipeline: pipeline.to_owned(), version });
    };
    if target.state == VersionState::Live {
        return Err(SwitchError::AlreadyLive { pipeline: pipeline.to_owned(), version });
    }
    if target.contract.is_empty() {
        return Err(SwitchError::NoContract { pipeline: pipeline.to_owned(), version });
    }
    let from = stored.iter().find(|v| v.state == VersionState::Live).map(|v| v.version);
    Ok(Switch { from, to: version })
}

/// Rolling back: the version the live one replaced goes live again.
pub fn rollback(pipeline: &str, stored: &[Version]) -> Result<Switch, SwitchError> {
    let Some(live) = stored.iter().find(|v| v.state == VersionState::Live) else {
        return Err(SwitchError::NoLive { pipeline: pipeline.to_owned() });
    };
    let Some(previous) = live.replaced else {
        return Err(SwitchError::NothingToRollBack { pipeline: pipeline.to_owned(), live: live.version });
    };
    match stored.iter().find(|v| v.version == previous) {
        Some(v) if v.contract.is_empty() => {
            Err(SwitchError::NoContract { pipeline: pipeline.to_owned(), version: previous })
        }
        Some(_) => Ok(Switch { from: Some(live.version), to: previous }),
        None => Err(SwitchError::Unknown { pipeline: pipeline.to_owned(), version: previous }),
    }
}

/// The change stream's entry for a switch (`"type":"version"`), without its `seq` (the store puts it first).
pub fn marker(pipeline: &str, switch: Switch, at_ms: i64, why: &str, who: &str) -> String {
    serde_json::json!({
        "type": "version",
        "pipeline": pipeline,
        "from": switch.from,
        "to": switch.to,
        "at": weir_engine::time::format_rfc3339_ms(at_ms),
        "why": why,
        "who": who,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(version: u32, state: VersionState, hash: u64, replaced: Option<u32>) -> Version {
        Version {
            version,
            state,
            contract_hash: hash_text(hash),
            contract: "text".into(),
            started_ms: 0,
            started_by: "test".into(),
            promoted_ms: None,
            promoted_by: None,
            superseded_ms: None,
            replaced,
        }
    }

    fn file(version: u32, hash: u64) -> FileContract<'static> {
        FileContract { version, hash, bytes_hash: 99, text: "text" }
    }

    #[test]
    fn a_file_registers_its_version_as_the_stored_ones_allow() {
        let none: Vec<Version> = Vec::new();
        assert_eq!(
            register("p", &none, file(1, 7)),
            Registration::New { state: VersionState::Live, supersedes: vec![] }
        );
        let v1 = vec![stored(1, VersionState::Live, 7, None)];
        assert_eq!(register("p", &v1, file(1, 7)), Registration::Known);
        let Registration::Refused(why) = register("p", &v1, file(1, 8)) else { panic!("a changed contract ran") };
        assert!(why.contains("without a version bump") && why.contains("version = 2"), "{why}");
        let two = vec![stored(1, VersionState::Live, 7, None), stored(2, VersionState::Candidate, 8, None)];
        assert_eq!(
            register("p", &two, file(3, 9)),
            Registration::New { state: VersionState::Candidate, supersedes: vec![2] }
        );
        let Registration::Refused(why) = register("p", &[stored(3, VersionState::Live, 7, None)], file(2, 1)) else {
            panic!("an older version registered")
        };
        assert!(why.contains("only grow"), "{why}");
        let mut legacy = stored(1, VersionState::Live, 99, None);
        legacy.contract.clear();
        assert_eq!(register("p", &[legacy], file(1, 7)), Registration::Adopt);
    }

    #[test]
    fn promote_and_rollback_switch_between_versions() {
        let v = vec![stored(1, VersionState::Live, 1, None), stored(2, VersionState::Candidate, 2, None)];
        assert_eq!(promote("p", &v, 2), Ok(Switch { from: Some(1), to: 2 }));
        assert!(matches!(promote("p", &v, 1), Err(SwitchError::AlreadyLive { .. })));
        assert!(matches!(promote("p", &v, 5), Err(SwitchError::Unknown { .. })));
        assert!(matches!(rollback("p", &v), Err(SwitchError::NothingToRollBack { .. })));
        let after = vec![stored(1, VersionState::Superseded, 1, None), stored(2, VersionState::Live, 2, Some(1))];
        assert_eq!(rollback("p", &after), Ok(Switch { from: Some(2), to: 1 }));
    }
}

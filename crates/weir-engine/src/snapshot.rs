//! Snapshot and restore of an engine's whole state: open windows, dedup
//! memory, watermarks, revision counters and counters. Also in parts: a
//! server checkpoints only what changed ([`Engine::take_delta`]) into a
//! store keyed by window and id, and restores from the parts.
//!
//! Layout: the 8 bytes `WEIRSNAP`, the format number (u32, little-endian),
//! then the state in postcard. Maps are written in sorted order, so the same
//! state always gives the same bytes. Invariant: restore(snapshot(e)) continues
//! with exactly the rows `e` would have emitted.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use weir_contract::{Contract, WindowKind};

use crate::engine::{Counters, Engine, Mode, PlanError, Seen, State, Window};
use crate::plan::Plan;

const MAGIC: &[u8; 8] = b"WEIRSNAP";
/// The snapshot format this build writes. It also reads format 4, the one
/// before: format 5 counts ledger entries of the reason `over_limit`.
/// Format 4 adds each
/// window's sources (partition, offset range, events); format 3 the
/// revision floor (replays); format 2: window ids are `xxh3_128(key, seed =
/// start)`; format 1 hashed start and key together.
pub const SNAPSHOT_FORMAT: u32 = 5;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    #[error("not a weir snapshot (it does not start with WEIRSNAP); check the file or checkpoint it came from")]
    NotASnapshot,
    #[error("snapshot format {found} is not readable by this weir, which reads format {SNAPSHOT_FORMAT}; restore it with the weir release that wrote it, or replay from the log")]
    Format { found: u32 },
    #[error("snapshot belongs to pipeline {found}, not {expected}; a changed contract must start from the log, not from an old snapshot")]
    Contract { found: String, expected: String },
    #[error("snapshot is damaged: {0}; restore an earlier checkpoint or replay from the log")]
    Corrupt(String),
    #[error("{0}")]
    Plan(#[from] PlanError),
}

type Image = ImageOf<Counters>;

#[derive(Serialize, Deserialize)]
struct ImageOf<C> {
    pipeline: String,
    version: u32,
    text_hash: u64,
    mode: Mode,
    part_wm: Vec<i64>,
    part_idle: Vec<bool>,
    wm: i64,
    windows: Vec<(u128, Window)>,
    seen: Vec<(u128, Seen)>,
    counters: C,
    revision_floor: u32,
}

/// Format 4's counters: one reason fewer.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct Counters4 {
    read: u64,
    counted: u64,
    filtered: u64,
    late_allowed: u64,
    ledger: [u64; 8],
    rows_provisional: u64,
    rows_settled: u64,
    rows_retracted: u64,
}

impl ImageOf<Counters4> {
    fn upgrade(self) -> Image {
        let c = self.counters;
        let mut ledger = [0; 9];
        ledger[..8].copy_from_slice(&c.ledger);
        ImageOf {
            pipeline: self.pipeline,
            version: self.version,
            text_hash: self.text_hash,
            mode: self.mode,
            part_wm: self.part_wm,
            part_idle: self.part_idle,
            wm: self.wm,
            windows: self.windows,
            seen: self.seen,
            counters: Counters {
                read: c.read,
                counted: c.counted,
                filtered: c.filtered,
                late_allowed: c.late_allowed,
                ledger,
                rows_provisional: c.rows_provisional,
                rows_settled: c.rows_settled,
                rows_retracted: c.rows_retracted,
            },
            revision_floor: self.revision_floor,
        }
    }
}

fn identity(name: &str, version: u32, hash: u64) -> String {
    format!("{name} v{version} (contract {hash:016x})")
}

impl Engine {
    /// The engine's whole state as bytes.
    pub fn snapshot(&self) -> Vec<u8> {
        let st = &self.st;
        let mut windows: Vec<(u128, Window)> = st.windows.iter().map(|(k, w)| (k, w.clone())).collect();
        windows.sort_by_key(|w| w.0);
        // Expired ids not yet swept out are forgotten already: leave them out,
        // so the bytes do not depend on when the last sweep ran.
        let mut seen: Vec<(u128, Seen)> =
            st.seen.iter().filter(|(_, s)| s.expires > st.wm).map(|(k, s)| (k, *s)).collect();
        seen.sort_by_key(|a| a.0);
        self.image_bytes(windows, seen)
    }

    /// The snapshot format around the state, with these windows and ids.
    fn image_bytes(&self, windows: Vec<(u128, Window)>, seen: Vec<(u128, Seen)>) -> Vec<u8> {
        let st = &self.st;
        let image = Image {
            pipeline: self.plan.name.clone(),
            version: self.plan.version,
            text_hash: self.plan.text_hash,
            mode: self.mode,
            part_wm: st.part_wm.clone(),
            part_idle: st.part_idle.clone(),
            wm: st.wm,
            windows,
            seen,
            counters: st.counters.clone(),
            revision_floor: st.revision_floor,
        };
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&SNAPSHOT_FORMAT.to_le_bytes());
        // Serialising plain data into a Vec cannot fail.
        out.extend(postcard::to_allocvec(&image).unwrap_or_default());
        out
    }

    /// An engine for `contract` continuing from `bytes`.
    pub fn restore(contract: &Contract, bytes: &[u8]) -> Result<Engine, SnapshotError> {
        let (plan, mut image) = decode(contract, bytes)?;
        let windows = std::mem::take(&mut image.windows);
        let seen = std::mem::take(&mut image.seen);
        build(plan, image, windows.into_iter().map(Ok), seen)
    }

    /// Starts recording what changes, for [`Engine::take_delta`].
    pub fn track_changes(&mut self) {
        self.st.windows.track();
        self.st.seen.track();
    }

    /// What changed since the last delta (or since [`Engine::track_changes`]):
    /// applied in order to a store holding the windows and ids by their
    /// keys, the deltas hold what [`Engine::restore_parts`] needs.
    pub fn take_delta(&mut self) -> Delta {
        let mut keys = self.st.windows.take_touched();
        keys.sort_unstable();
        keys.dedup();
        let windows = keys
            .into_iter()
            .map(|k| (k, self.st.windows.get(k).map(|w| postcard::to_allocvec(w).unwrap_or_default())))
            .collect();
        let wm = self.st.wm;
        let mut keys = self.st.seen.take_touched();
        keys.sort_unstable();
        keys.dedup();
        let ids = keys
            .into_iter()
            .filter_map(|k| self.st.seen.get(k).filter(|s| s.expires > wm).map(|s| (k, IdEntry::from(*s))))
            .collect();
        Delta { header: self.image_bytes(Vec::new(), Vec::new()), windows, ids, forget_ids_through: wm }
    }

    /// An engine for `contract` from a store that applied every delta: the
    /// last header, every window and every id whose `expires` is past the
    /// last delta's `forget_ids_through` (older ones may be left out).
    pub fn restore_parts(
        contract: &Contract,
        header: &[u8],
        windows: impl IntoIterator<Item = (u128, Vec<u8>)>,
        ids: impl IntoIterator<Item = (u128, IdEntry)>,
    ) -> Result<Engine, SnapshotError> {
        let (plan, image) = decode(contract, header)?;
        let windows = windows.into_iter().map(|(k, bytes)| {
            postcard::from_bytes::<Window>(&bytes).map(|w| (k, w)).map_err(|e| SnapshotError::Corrupt(e.to_string()))
        });
        let wm = image.wm;
        let ids = ids.into_iter().map(|(k, e)| (k, Seen::from(e))).filter(move |(_, s)| s.expires > wm);
        build(plan, image, windows, ids)
    }
}

/// A checkpoint's worth of change (see [`Engine::take_delta`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delta {
    /// Watermarks, counters and the contract's identity: a snapshot without
    /// windows and ids. Replaces the previous header.
    pub header: Vec<u8>,
    /// Windows written (`Some(bytes)`) or removed (`None`).
    pub windows: Vec<(u128, Option<Vec<u8>>)>,
    /// Ids remembered or remembered again.
    pub ids: Vec<(u128, IdEntry)>,
    /// Ids whose `expires` is at or before this are forgotten: a store may delete them.
    pub forget_ids_through: i64,
}

/// A remembered event id, as a store keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdEntry {
    pub partition: u32,
    pub offset: u64,
    pub payload_hash: u64,
    pub expires: i64,
}

impl From<Seen> for IdEntry {
    fn from(s: Seen) -> IdEntry {
        IdEntry { partition: s.partition, offset: s.offset, payload_hash: s.payload_hash, expires: s.expires }
    }
}

impl From<IdEntry> for Seen {
    fn from(e: IdEntry) -> Seen {
        Seen { partition: e.partition, offset: e.offset, payload_hash: e.payload_hash, expires: e.expires }
    }
}

fn decode(contract: &Contract, bytes: &[u8]) -> Result<(Plan, Image), SnapshotError> {
    if bytes.len() < 12 || &bytes[..8] != MAGIC {
        return Err(SnapshotError::NotASnapshot);
    }
    let found = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    let corrupt = |e: postcard::Error| SnapshotError::Corrupt(e.to_string());
    let image: Image = match found {
        SNAPSHOT_FORMAT => postcard::from_bytes(&bytes[12..]).map_err(corrupt)?,
        4 => postcard::from_bytes::<ImageOf<Counters4>>(&bytes[12..]).map_err(corrupt)?.upgrade(),
        _ => return Err(SnapshotError::Format { found }),
    };
    let plan = Plan::compile(contract).map_err(PlanError)?;
    if image.pipeline != plan.name || image.version != plan.version || image.text_hash != plan.text_hash {
        return Err(SnapshotError::Contract {
            found: identity(&image.pipeline, image.version, image.text_hash),
            expected: identity(&plan.name, plan.version, plan.text_hash),
        });
    }
    if image.part_wm.len() != image.part_idle.len() || image.part_wm.is_empty() {
        return Err(SnapshotError::Corrupt("partition watermarks do not match".into()));
    }
    Ok((plan, image))
}

fn build(
    plan: Plan,
    image: Image,
    windows: impl IntoIterator<Item = Result<(u128, Window), SnapshotError>>,
    seen: impl IntoIterator<Item = (u128, Seen)>,
) -> Result<Engine, SnapshotError> {
    let mut st = State {
        part_wm: image.part_wm,
        part_idle: image.part_idle,
        wm: image.wm,
        counters: image.counters,
        revision_floor: image.revision_floor,
        ..State::default()
    };
    let global = matches!(plan.kind, WindowKind::Global);
    let session = matches!(plan.kind, WindowKind::Session { .. });
    for window in windows {
        let (id, w) = window?;
        if w.aggs.len() != plan.aggs.len() {
            return Err(SnapshotError::Corrupt("a window does not match the contract".into()));
        }
        if !global {
            st.timers.insert((w.end, id));
        }
        if session {
            st.sessions.entry(w.key.clone()).or_default().insert(w.start, w.end);
        }
        if plan.count_keys {
            *st.keys.get_or_insert_with(crate::engine::key_id(&w.key), || 0).0 += 1;
        }
        st.windows.insert(id, w);
    }
    for (id, s) in seen {
        st.seen.insert(id, s);
    }
    Ok(Engine::from_parts(Arc::new(plan), image.mode, st))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EventIn, Output};

    #[test]
    fn a_format_4_snapshot_is_read_with_its_counters() {
        let text = "[pipeline]\nname = \"p\"\nversion = 1\nowner = \"o\"\nsteward = \"s\"\ndecision = \"d\"\n\
            [source]\ntopic = \"t\"\nevent_time = \"t\"\nkey = [\"k\"]\n\
            [window]\ntype = \"tumbling\"\nsize = \"10s\"\n[[aggregate]]\nname = \"n\"\nfn = \"count\"\n";
        let c = Contract::parse("p.toml", text).unwrap();
        let mut engine = Engine::new(&c, Mode::Stream, 1).unwrap();
        let mut out = Output::default();
        for (i, e) in [r#"{"k":"a","t":1000}"#, "{", r#"{"k":"a","t":2000}"#].iter().enumerate() {
            engine.process(EventIn { partition: 0, offset: i as u64 + 1, bytes: e.as_bytes() }, &mut out);
        }
        // The same state as format 4 wrote it: eight ledger counters.
        let (_, image) = decode(&c, &engine.snapshot()).unwrap();
        let k = image.counters.clone();
        let old = ImageOf {
            counters: Counters4 {
                read: k.read,
                counted: k.counted,
                filtered: k.filtered,
                late_allowed: k.late_allowed,
                ledger: k.ledger[..8].try_into().unwrap(),
                rows_provisional: k.rows_provisional,
                rows_settled: k.rows_settled,
                rows_retracted: k.rows_retracted,
            },
            pipeline: image.pipeline,
            version: image.version,
            text_hash: image.text_hash,
            mode: image.mode,
            part_wm: image.part_wm,
            part_idle: image.part_idle,
            wm: image.wm,
            windows: image.windows,
            seen: image.seen,
            revision_floor: image.revision_floor,
        };
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&4u32.to_le_bytes());
        bytes.extend(postcard::to_allocvec(&old).unwrap());
        let restored = Engine::restore(&c, &bytes).unwrap();
        assert_eq!(restored.counters(), engine.counters());
        assert_eq!(restored.counters().ledger[1], 1);
        assert_eq!(restored.snapshot(), engine.snapshot());
        bytes[8] = 3;
        assert_eq!(Engine::restore(&c, &bytes).unwrap_err(), SnapshotError::Format { found: 3 });
    }
}

//! Snapshot and restore of an engine's whole state: open windows, dedup
//! memory (with what each id's counting version gave, under
//! `on_conflict = "correct"`), watermarks, revision counters and counters.
//! Also in parts: a server checkpoints only what changed
//! ([`Engine::take_delta`]): windows by their id, and remembered ids as one
//! batch per checkpoint, which the store keeps in order and hands back.
//!
//! Layout: the 8 bytes `WEIRSNAP`, the format number (u32, little-endian),
//! then the state in postcard, then (format 6) the counted versions in
//! postcard. Maps are written in sorted order, so the same state always gives
//! the same bytes. Invariant: restore(snapshot(e)) continues with exactly the
//! rows `e` would have emitted.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use weir_contract::{Contract, WindowKind};

use crate::engine::{Counted, Counters, Engine, Mode, PlanError, Seen, State, Window};
use crate::output::Reason;
use crate::plan::Plan;
use crate::table::HashedTable;

const MAGIC: &[u8; 8] = b"WEIRSNAP";
/// The snapshot format this build writes. It also reads formats 6, 5 and 4:
/// format 7 counts ledger entries of the reason `future` and keeps the
/// lateness histogram (`crate::lateness`); format 6 counts ledger entries of the reason `superseded` and keeps what
/// each remembered id's counting version gave (corrections); format 5
/// counts ledger entries of the reason `over_limit`. Format 4 adds each
/// window's sources (partition, offset range, events); format 3 the
/// revision floor (replays); format 2: window ids are `xxh3_128(key, seed =
/// start)`; format 1 hashed start and key together.
pub const SNAPSHOT_FORMAT: u32 = 7;

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

macro_rules! old_counters {
    ($name:ident, $reasons:literal) => {
        /// An older format's counters: fewer ledger reasons.
        #[derive(Deserialize)]
        #[cfg_attr(test, derive(Serialize))]
        struct $name {
            read: u64,
            counted: u64,
            filtered: u64,
            late_allowed: u64,
            ledger: [u64; $reasons],
            rows_provisional: u64,
            rows_settled: u64,
            rows_retracted: u64,
        }

        impl From<$name> for Counters {
            fn from(c: $name) -> Counters {
                let mut ledger = [0; Reason::ALL.len()];
                ledger[..$reasons].copy_from_slice(&c.ledger);
                Counters {
                    read: c.read,
                    counted: c.counted,
                    filtered: c.filtered,
                    late_allowed: c.late_allowed,
                    ledger,
                    rows_provisional: c.rows_provisional,
                    rows_settled: c.rows_settled,
                    rows_retracted: c.rows_retracted,
                    lateness: Default::default(),
                }
            }
        }
    };
}
old_counters!(Counters4, 8);
old_counters!(Counters5, 9);
old_counters!(Counters6, 10);

impl<C: Into<Counters>> ImageOf<C> {
    fn upgrade(self) -> Image {
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
            counters: self.counters.into(),
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
        debug_assert!(self.recall.is_none(), "a snapshot's payload hashes are canonical");
        let st = &self.st;
        let mut windows: Vec<(u128, Window)> = st.windows.iter().map(|(k, w)| (k, w.clone())).collect();
        windows.sort_by_key(|w| w.0);
        // Expired ids not yet swept out are forgotten already: leave them out,
        // so the bytes do not depend on when the last sweep ran.
        let mut seen: Vec<(u128, Seen)> =
            st.seen.iter().filter(|(_, s)| s.expires > st.wm).map(|(k, s)| (k, *s)).collect();
        seen.sort_by_key(|a| a.0);
        // The counted versions of the live ids, in the same (sorted) order.
        let counted: Vec<(u128, Counted)> =
            seen.iter().filter_map(|(k, _)| st.counted.get(*k).map(|c| (*k, c.clone()))).collect();
        let mut out = self.image_bytes(windows, seen);
        out.extend(postcard::to_allocvec(&counted).unwrap_or_default());
        out
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
        let (plan, mut image, counted) = decode(contract, bytes)?;
        let windows = std::mem::take(&mut image.windows);
        let seen = std::mem::take(&mut image.seen);
        let mut counted: std::collections::HashMap<u128, Counted> = counted.into_iter().collect();
        let mut ids = Ids::default();
        for (k, s) in seen {
            ids.remember(&plan, k, s, counted.remove(&k))?;
        }
        build(plan, image, windows.into_iter().map(Ok), ids)
    }

    /// Starts recording what changes, for [`Engine::take_delta`].
    pub fn track_changes(&mut self) {
        debug_assert!(self.recall.is_none(), "a delta's payload hashes are canonical");
        self.st.windows.track();
        self.st.seen.track();
    }

    /// What changed since the last delta (or since [`Engine::track_changes`]):
    /// applied in order to a store holding the windows by their keys and
    /// every id batch in order, the deltas hold what
    /// [`Engine::restore_parts`] needs.
    pub fn take_delta(&mut self) -> Delta {
        let mut keys = self.st.windows.take_touched();
        keys.sort_unstable();
        keys.dedup();
        let windows = keys
            .into_iter()
            .map(|k| (k, self.st.windows.get(k).map(|w| postcard::to_allocvec(w).unwrap_or_default())))
            .collect();
        let wm = self.st.wm;
        let keys = self.st.seen.take_touched_in_slot_order();
        let forgotten = std::mem::take(&mut self.st.forgotten);
        let (seen, counted) = (&self.st.seen, &self.st.counted);
        let live = |k: u128| seen.get(k).filter(|s| s.expires > wm);
        let (ids, ids_keep_until) = if self.plan.corrects {
            // Written straight from the tables: a million ids a checkpoint, no copy of each first.
            let base = keys.iter().find_map(|k| live(*k).and(counted.get(*k))).map_or(0, |c| c.time);
            let mut batch = RecordsWriter::new(base, forgotten.len() + keys.len());
            for (id, keep_until) in forgotten {
                if live(id).is_none() {
                    batch.forgotten(id, keep_until);
                }
            }
            for (i, &id) in keys.iter().enumerate() {
                if let Some(&ahead) = keys.get(i + PREFETCH_AHEAD) {
                    seen.prefetch(ahead);
                    counted.prefetch(ahead);
                }
                // Halfway there its slot has arrived: the amounts it gave are on the heap, a miss of their own.
                if let Some(c) = keys.get(i + PREFETCH_AHEAD / 2).and_then(|k| counted.get(*k)) {
                    if let Some(first) = c.given.first() {
                        crate::prefetch::read(first);
                    }
                }
                if let (Some(s), Some(c)) = (live(id), counted.get(id)) {
                    batch.counted(id, c.keep_until, s, c);
                }
            }
            batch.finish()
        } else {
            encode_ids(keys.into_iter().filter_map(|k| live(k).map(|s| (k, *s))))
        };
        Delta { header: self.image_bytes(Vec::new(), Vec::new()), windows, ids, ids_keep_until, forget_ids_through: wm }
    }

    /// An engine for `contract` from a store that applied every delta: the
    /// last header, every window, and every id batch in the order written
    /// (a later batch's record of an id replaces an earlier one; batches
    /// whose `ids_keep_until` the last delta's `forget_ids_through` reached
    /// may be left out).
    pub fn restore_parts<B: AsRef<[u8]>>(
        contract: &Contract,
        header: &[u8],
        windows: impl IntoIterator<Item = (u128, Vec<u8>)>,
        id_batches: impl IntoIterator<Item = B>,
    ) -> Result<Engine, SnapshotError> {
        let (plan, image, _) = decode(contract, header)?;
        let windows = windows.into_iter().map(|(k, bytes)| {
            postcard::from_bytes::<Window>(&bytes).map(|w| (k, w)).map_err(|e| SnapshotError::Corrupt(e.to_string()))
        });
        // Straight into the engine's tables: an id's last record decides,
        // so a record that forgets it, or one already expired, removes it.
        let wm = image.wm;
        let batches: Vec<B> = id_batches.into_iter().collect();
        let mut ids = Ids::default();
        // Room for every record at once: a later record of an id replaces
        // an earlier one, so this is at most what the batches hold.
        let records: usize = batches.iter().map(|b| records_in(b.as_ref(), plan.corrects)).sum();
        ids.seen.reserve(records);
        if plan.corrects {
            ids.counted.reserve(records);
        }
        for batch in &batches {
            let batch = batch.as_ref();
            if batch.is_empty() {
                continue;
            }
            if plan.corrects {
                let records = decode_records(batch, plan.aggs.len())?;
                let keys: Vec<u128> = records.iter().map(|r| r.id).collect();
                for (i, r) in records.into_iter().enumerate() {
                    if let Some(&ahead) = keys.get(i + PREFETCH_AHEAD) {
                        ids.prefetch(ahead);
                    }
                    match r.entry {
                        Some((s, c)) if s.expires > wm => ids.remember(&plan, r.id, s, Some(c))?,
                        _ => ids.forget(r.id),
                    }
                }
            } else {
                decode_ids(batch, |id, s, ahead| {
                    if let Some(ahead) = ahead {
                        ids.prefetch(ahead);
                    }
                    match s.expires > wm {
                        true => ids.remember(&plan, id, s, None),
                        false => {
                            ids.forget(id);
                            Ok(())
                        }
                    }
                })?;
            }
        }
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
    /// The ids remembered, remembered again or forgotten since the last
    /// delta, as one batch for the store to keep after the earlier ones;
    /// empty when there are none.
    pub ids: Vec<u8>,
    /// The watermark at which every record in `ids` is forgotten: then the
    /// store may delete the batch.
    pub ids_keep_until: i64,
    /// The watermark now: a store may delete every batch whose
    /// `ids_keep_until` is at or before it.
    pub forget_ids_through: i64,
}

/// One id in a batch under `on_conflict = "correct"`: remembered with its
/// counting version, or (`entry: None`) forgotten by a deletion.
#[derive(Serialize, Deserialize)]
struct IdRecord {
    id: u128,
    keep_until: i64,
    entry: Option<(Seen, Counted)>,
}

/// An id batch under corrections written by earlier builds starts with
/// this, then the number of records (u64) and the records: id (u128), keep
/// until (i64), then 0 (forgotten) or 1 and the counted version: partition
/// (u32), offset, payload hash (u64), expiry, time (i64), first window
/// (u128), watermark when counted, keep until (i64), the number of
/// aggregates (u16) and for each 0 (nothing given), 1 and a mantissa (i128)
/// and a scale (u8), or 2 and a mantissa that fits an i64 and a scale; all
/// little-endian. 113 to 123 bytes a record for one or two aggregates.
/// Batches written before it are a postcard `Vec<IdRecord>`, which cannot
/// start with ten bytes of 0xff (a varint is at most ten bytes, and its
/// tenth has no continuation bit).
const RECORDS_MARK: [u8; 10] = [0xff; 10];

/// An id batch under corrections as this build writes it: this mark (no
/// postcard batch starts with it either), the number of records (u64), a
/// base time (i64), then the records. Each is its id (u128, fixed) and:
/// - 0 and the keep-until (a zigzag varint): forgotten;
/// - 1 or 2 and the counted version: partition and offset (varints),
///   payload hash (u64, fixed), time (zigzag varint, from the base),
///   expiry (from the time), first window (u128, fixed), watermark when
///   counted (from the time), the version's keep-until (from the expiry),
///   then under 2 only the record's own keep-until (from the version's;
///   under 1 it is the version's), the number of aggregates (varint) and
///   for each 0 (nothing given) or 1, a mantissa (zigzag varint) and a
///   scale (u8).
///
/// Differences wrap, so every value reads back exactly. Times differ by
/// the horizon or less, so a record takes 60 to 70 bytes, about half of
/// [`RECORDS_MARK`]'s: a candidate's checkpoint of a million ids writes
/// 60 MB, not 120.
const COMPACT_MARK: [u8; 10] = [0xfe; 10];

/// The fewest bytes a record takes (a forgotten id) under [`RECORDS_MARK`].
const RECORD_MIN_BYTES: usize = 25;
/// The fewest bytes a record takes (a forgotten id) under [`COMPACT_MARK`].
const COMPACT_MIN_BYTES: usize = 18;

fn put_varint(out: &mut Vec<u8>, mut v: u128) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn zigzag(v: i64) -> u128 {
    ((v << 1) ^ (v >> 63)) as u64 as u128
}

fn zigzag128(v: i128) -> u128 {
    ((v << 1) ^ (v >> 127)) as u128
}

/// Writes an id batch in the [`COMPACT_MARK`] encoding, record by record.
struct RecordsWriter {
    out: Vec<u8>,
    base: i64,
    count: u64,
    keep_until: i64,
}

impl RecordsWriter {
    /// A batch whose times are written from `base`, with room for about `records`.
    fn new(base: i64, records: usize) -> RecordsWriter {
        let mut out = Vec::with_capacity(26 + records * 72);
        out.extend_from_slice(&COMPACT_MARK);
        out.extend_from_slice(&0u64.to_le_bytes());
        out.extend_from_slice(&base.to_le_bytes());
        RecordsWriter { out, base, count: 0, keep_until: i64::MIN }
    }

    fn forgotten(&mut self, id: u128, keep_until: i64) {
        let out = &mut self.out;
        out.extend_from_slice(&id.to_le_bytes());
        out.push(0);
        put_varint(out, zigzag(keep_until));
        self.count += 1;
        self.keep_until = self.keep_until.max(keep_until);
    }

    /// `id` remembered as `s`, counted as `c`, its record kept until `keep_until`.
    fn counted(&mut self, id: u128, keep_until: i64, s: &Seen, c: &Counted) {
        let out = &mut self.out;
        out.extend_from_slice(&id.to_le_bytes());
        let own = keep_until != c.keep_until;
        out.push(if own { 2 } else { 1 });
        put_varint(out, s.partition.into());
        put_varint(out, s.offset.into());
        out.extend_from_slice(&s.payload_hash.to_le_bytes());
        put_varint(out, zigzag(c.time.wrapping_sub(self.base)));
        put_varint(out, zigzag(s.expires.wrapping_sub(c.time)));
        out.extend_from_slice(&c.window.to_le_bytes());
        put_varint(out, zigzag(c.wm_at.wrapping_sub(c.time)));
        put_varint(out, zigzag(c.keep_until.wrapping_sub(s.expires)));
        if own {
            put_varint(out, zigzag(keep_until.wrapping_sub(c.keep_until)));
        }
        put_varint(out, c.given.len() as u128);
        for g in c.given.iter() {
            match g {
                None => out.push(0),
                Some(d) => {
                    out.push(1);
                    put_varint(out, zigzag128(d.mantissa()));
                    out.push(d.scale() as u8);
                }
            }
        }
        self.count += 1;
        self.keep_until = self.keep_until.max(keep_until);
    }

    /// The batch (empty when it holds no record) and the latest keep-until of its records.
    fn finish(mut self) -> (Vec<u8>, i64) {
        if self.count == 0 {
            return (Vec::new(), i64::MIN);
        }
        self.out[COMPACT_MARK.len()..COMPACT_MARK.len() + 8].copy_from_slice(&self.count.to_le_bytes());
        (self.out, self.keep_until)
    }
}

#[cfg(test)]
fn encode_records(records: &[IdRecord]) -> Vec<u8> {
    let base = records.iter().find_map(|r| r.entry.as_ref().map(|(_, c)| c.time)).unwrap_or(0);
    let mut batch = RecordsWriter::new(base, records.len());
    for r in records {
        match &r.entry {
            None => batch.forgotten(r.id, r.keep_until),
            Some((s, c)) => batch.counted(r.id, r.keep_until, s, c),
        }
    }
    batch.finish().0
}

/// Reads fixed-size little-endian fields off the front of a batch.
struct Fields<'a>(&'a [u8]);

impl Fields<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], SnapshotError> {
        let (head, rest) = self.0.split_first_chunk::<N>().ok_or_else(|| {
            SnapshotError::Corrupt(format!("an id batch ends {} bytes into a field of {N}", self.0.len()))
        })?;
        self.0 = rest;
        Ok(*head)
    }
    fn u8(&mut self) -> Result<u8, SnapshotError> {
        Ok(self.take::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, SnapshotError> {
        self.take().map(u16::from_le_bytes)
    }
    fn u32(&mut self) -> Result<u32, SnapshotError> {
        self.take().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Result<u64, SnapshotError> {
        self.take().map(u64::from_le_bytes)
    }
    fn i64(&mut self) -> Result<i64, SnapshotError> {
        self.take().map(i64::from_le_bytes)
    }
    fn u128(&mut self) -> Result<u128, SnapshotError> {
        self.take().map(u128::from_le_bytes)
    }
    /// A varint of at most `bits` bits.
    fn varint(&mut self, bits: u32) -> Result<u128, SnapshotError> {
        let mut v = 0u128;
        for shift in (0..bits).step_by(7) {
            let byte = self.u8()?;
            let part = u128::from(byte & 0x7f);
            if shift + 7 > bits && part >> (bits - shift) != 0 {
                return Err(SnapshotError::Corrupt(format!("an id batch holds a varint past {bits} bits")));
            }
            v |= part << shift;
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(SnapshotError::Corrupt(format!("an id batch holds a varint past {bits} bits")))
    }
    fn var_u32(&mut self) -> Result<u32, SnapshotError> {
        Ok(self.varint(32)? as u32)
    }
    fn var_u64(&mut self) -> Result<u64, SnapshotError> {
        Ok(self.varint(64)? as u64)
    }
    /// A zigzag varint added (wrapping) to `to`.
    fn var_i64(&mut self, to: i64) -> Result<i64, SnapshotError> {
        let z = self.varint(64)? as u64;
        Ok(to.wrapping_add((z >> 1) as i64 ^ -((z & 1) as i64)))
    }
    fn var_i128(&mut self) -> Result<i128, SnapshotError> {
        let z = self.varint(128)?;
        Ok((z >> 1) as i128 ^ -((z & 1) as i128))
    }
}

/// The records of an id batch under corrections, in any of its three encodings (postcard, fixed, compact);
/// `aggs` bounds what a record may say it gave.
fn decode_records(batch: &[u8], aggs: usize) -> Result<Vec<IdRecord>, SnapshotError> {
    if let Some(rest) = batch.strip_prefix(&COMPACT_MARK) {
        return decode_compact(rest, aggs);
    }
    let Some(rest) = batch.strip_prefix(&RECORDS_MARK) else {
        return postcard::from_bytes(batch).map_err(|e| SnapshotError::Corrupt(format!("an id batch: {e}")));
    };
    let mut f = Fields(rest);
    let count = f.u64()?;
    let corrupt = |what: String| SnapshotError::Corrupt(format!("an id batch: {what}"));
    if count > (rest.len() / RECORD_MIN_BYTES) as u64 {
        return Err(corrupt(format!("{count} records in {} bytes", batch.len())));
    }
    let mut records = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let id = f.u128()?;
        let keep_until = f.i64()?;
        let entry = match f.u8()? {
            0 => None,
            1 => {
                let seen = Seen { partition: f.u32()?, offset: f.u64()?, payload_hash: f.u64()?, expires: f.i64()? };
                let (time, window, wm_at, keep_until) = (f.i64()?, f.u128()?, f.i64()?, f.i64()?);
                let n = f.u16()?.into();
                let given = read_given(&mut f, n, aggs, |f, tag| match tag {
                    1 => Ok(Some(i128::from_le_bytes(f.take()?))),
                    2 => Ok(Some(f.i64()?.into())),
                    _ => Ok(None),
                })?;
                Some((seen, Counted { time, window, wm_at, given, keep_until }))
            }
            t => return Err(corrupt(format!("a record tagged {t}"))),
        };
        records.push(IdRecord { id, keep_until, entry });
    }
    if !f.0.is_empty() {
        return Err(corrupt(format!("{} bytes after its {count} records", f.0.len())));
    }
    Ok(records)
}

/// A record's `n` amounts, where the contract has `aggs`: each a tag, 0
/// for nothing given, or one whose mantissa `mantissa` reads (`None` for
/// a tag it does not know), then a scale (u8).
fn read_given(
    f: &mut Fields<'_>,
    n: usize,
    aggs: usize,
    mut mantissa: impl FnMut(&mut Fields<'_>, u8) -> Result<Option<i128>, SnapshotError>,
) -> Result<Box<[Option<rust_decimal::Decimal>]>, SnapshotError> {
    let corrupt = |what: String| SnapshotError::Corrupt(format!("an id batch: {what}"));
    if n != aggs {
        return Err(corrupt(format!("a record gives {n} aggregates where the contract has {aggs}")));
    }
    let mut given = Vec::with_capacity(n);
    for _ in 0..n {
        let tag = f.u8()?;
        if tag == 0 {
            given.push(None);
            continue;
        }
        let Some(m) = mantissa(f, tag)? else { return Err(corrupt(format!("an amount tagged {tag}"))) };
        let d = rust_decimal::Decimal::try_from_i128_with_scale(m, f.u8()?.into())
            .map_err(|e| corrupt(format!("an amount given: {e}")))?;
        given.push(Some(d));
    }
    Ok(given.into_boxed_slice())
}

/// The records after [`COMPACT_MARK`].
fn decode_compact(rest: &[u8], aggs: usize) -> Result<Vec<IdRecord>, SnapshotError> {
    let corrupt = |what: String| SnapshotError::Corrupt(format!("an id batch: {what}"));
    let mut f = Fields(rest);
    let count = f.u64()?;
    let base = f.i64()?;
    if count > (f.0.len() / COMPACT_MIN_BYTES) as u64 {
        return Err(corrupt(format!("{count} records in {} bytes", rest.len() + COMPACT_MARK.len())));
    }
    let mut records = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let id = f.u128()?;
        let tag = f.u8()?;
        if tag == 0 {
            records.push(IdRecord { id, keep_until: f.var_i64(0)?, entry: None });
            continue;
        }
        if tag > 2 {
            return Err(corrupt(format!("a record tagged {tag}")));
        }
        let (partition, offset, payload_hash) = (f.var_u32()?, f.var_u64()?, f.u64()?);
        let time = f.var_i64(base)?;
        let expires = f.var_i64(time)?;
        let window = f.u128()?;
        let wm_at = f.var_i64(time)?;
        let counted_until = f.var_i64(expires)?;
        let keep_until = match tag {
            2 => f.var_i64(counted_until)?,
            _ => counted_until,
        };
        let n = f.varint(16)? as usize;
        let given = read_given(&mut f, n, aggs, |f, tag| match tag {
            1 => f.var_i128().map(Some),
            _ => Ok(None),
        })?;
        let seen = Seen { partition, offset, payload_hash, expires };
        let counted = Counted { time, window, wm_at, given, keep_until: counted_until };
        records.push(IdRecord { id, keep_until, entry: Some((seen, counted)) });
    }
    if !f.0.is_empty() {
        return Err(corrupt(format!("{} bytes after its {count} records", f.0.len())));
    }
    Ok(records)
}

/// An id batch without corrections: 44 bytes an id (id, partition, offset,
/// payload hash, expiry; little-endian).
const ID_BYTES: usize = 44;

fn encode_ids(ids: impl Iterator<Item = (u128, Seen)>) -> (Vec<u8>, i64) {
    let mut out = Vec::new();
    let mut max = i64::MIN;
    for (id, e) in ids {
        out.extend_from_slice(&id.to_le_bytes());
        out.extend_from_slice(&e.partition.to_le_bytes());
        out.extend_from_slice(&e.offset.to_le_bytes());
        out.extend_from_slice(&e.payload_hash.to_le_bytes());
        out.extend_from_slice(&e.expires.to_le_bytes());
        max = max.max(e.expires);
    }
    (out, max)
}

/// How many records an id batch holds, from its length or, under
/// corrections, its leading count (0 when that cannot be read: decoding
/// the batch then says what is wrong).
fn records_in(batch: &[u8], corrects: bool) -> usize {
    if !corrects {
        return batch.len() / ID_BYTES;
    }
    for (mark, least) in [(&COMPACT_MARK, COMPACT_MIN_BYTES), (&RECORDS_MARK, RECORD_MIN_BYTES)] {
        if let Some(rest) = batch.strip_prefix(mark) {
            let count = rest.first_chunk::<8>().map_or(0, |c| u64::from_le_bytes(*c));
            return usize::try_from(count).unwrap_or(0).min(rest.len() / least);
        }
    }
    let mut count = 0usize;
    for (i, byte) in batch.iter().take(10).enumerate() {
        count |= ((byte & 0x7f) as usize).checked_shl(7 * i as u32).unwrap_or(0);
        if byte & 0x80 == 0 {
            // Never more records than bytes: a damaged count reserves no more than the batch's length.
            return count.min(batch.len());
        }
    }
    0
}

/// Remembered ids as the engine keeps them, being restored.
#[derive(Default)]
struct Ids {
    seen: HashedTable<Seen>,
    counted: HashedTable<Counted>,
}

impl Ids {
    /// Remembers `id` as `seen`, replacing what an earlier record said; under
    /// `on_conflict = "correct"` with what its counting version gave.
    fn remember(&mut self, plan: &Plan, id: u128, seen: Seen, counted: Option<Counted>) -> Result<(), SnapshotError> {
        match (plan.corrects, counted) {
            (false, _) => self.seen.insert(id, seen),
            (true, Some(c)) if c.given.len() == plan.aggs.len() => {
                self.seen.insert(id, seen);
                self.counted.insert(id, c);
            }
            (true, _) => {
                return Err(SnapshotError::Corrupt(
                    "a remembered id does not say what it counted, as on_conflict = \"correct\" needs".into(),
                ))
            }
        }
        Ok(())
    }

    /// Starts loading the slots `id` will take, a few records ahead: the
    /// tables are far larger than the cache, so each insert is otherwise a miss.
    fn prefetch(&self, id: u128) {
        self.seen.prefetch(id);
        self.counted.prefetch(id);
    }

    fn forget(&mut self, id: u128) {
        self.seen.remove(id);
        self.counted.remove(id);
    }
}

/// How many records ahead a restore prefetches the slots of an id.
const PREFETCH_AHEAD: usize = 8;

/// Calls `each` with every id of a batch without corrections, its record,
/// and the id [`PREFETCH_AHEAD`] records on.
fn decode_ids(
    bytes: &[u8],
    mut each: impl FnMut(u128, Seen, Option<u128>) -> Result<(), SnapshotError>,
) -> Result<(), SnapshotError> {
    if !bytes.len().is_multiple_of(ID_BYTES) {
        return Err(SnapshotError::Corrupt(format!("an id batch of {} bytes is not whole records", bytes.len())));
    }
    let id_at = |c: &[u8]| u128::from_le_bytes(c[0..16].try_into().unwrap_or_default());
    for (i, c) in bytes.chunks_exact(ID_BYTES).enumerate() {
        let ahead = bytes.get((i + PREFETCH_AHEAD) * ID_BYTES..).filter(|r| r.len() >= ID_BYTES).map(id_at);
        let word = |at: usize| u64::from_le_bytes(c[at..at + 8].try_into().unwrap_or_default());
        let id = id_at(c);
        let partition = u32::from_le_bytes(c[16..20].try_into().unwrap_or_default());
        each(id, Seen { partition, offset: word(20), payload_hash: word(28), expires: word(36) as i64 }, ahead)?;
    }
    Ok(())
}

/// The counted versions after the image (formats 6 and 7). A header
/// (take_delta) ends with the image: its ids are in batches.
fn counted_after(rest: &[u8]) -> Result<Vec<(u128, Counted)>, SnapshotError> {
    if rest.is_empty() {
        return Ok(Vec::new());
    }
    postcard::from_bytes(rest).map_err(|e| SnapshotError::Corrupt(e.to_string()))
}

/// A snapshot read: its plan, its image, and its counted versions (format 6).
type Decoded = (Plan, Image, Vec<(u128, Counted)>);

fn decode(contract: &Contract, bytes: &[u8]) -> Result<Decoded, SnapshotError> {
    if bytes.len() < 12 || &bytes[..8] != MAGIC {
        return Err(SnapshotError::NotASnapshot);
    }
    let found = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    let corrupt = |e: postcard::Error| SnapshotError::Corrupt(e.to_string());
    let (image, counted): (Image, Vec<(u128, Counted)>) = match found {
        SNAPSHOT_FORMAT => {
            let (image, rest) = postcard::take_from_bytes(&bytes[12..]).map_err(corrupt)?;
            (image, counted_after(rest)?)
        }
        6 => {
            let (image, rest) = postcard::take_from_bytes::<ImageOf<Counters6>>(&bytes[12..]).map_err(corrupt)?;
            (image.upgrade(), counted_after(rest)?)
        }
        5 => (postcard::from_bytes::<ImageOf<Counters5>>(&bytes[12..]).map_err(corrupt)?.upgrade(), Vec::new()),
        4 => (postcard::from_bytes::<ImageOf<Counters4>>(&bytes[12..]).map_err(corrupt)?.upgrade(), Vec::new()),
        _ => return Err(SnapshotError::Format { found }),
    };
    let plan = Plan::compile(contract).map_err(PlanError)?;
    let same_text = image.text_hash == plan.text_hash || image.text_hash == plan.bytes_hash;
    if image.pipeline != plan.name || image.version != plan.version || !same_text {
        return Err(SnapshotError::Contract {
            found: identity(&image.pipeline, image.version, image.text_hash),
            expected: identity(&plan.name, plan.version, plan.text_hash),
        });
    }
    if image.part_wm.len() != image.part_idle.len() || image.part_wm.is_empty() {
        return Err(SnapshotError::Corrupt("partition watermarks do not match".into()));
    }
    Ok((plan, image, counted))
}

fn build(
    plan: Plan,
    image: Image,
    windows: impl IntoIterator<Item = Result<(u128, Window), SnapshotError>>,
    ids: Ids,
) -> Result<Engine, SnapshotError> {
    let mut st = State {
        part_wm: image.part_wm,
        part_idle: image.part_idle,
        wm: image.wm,
        counters: image.counters,
        revision_floor: image.revision_floor,
        seen: ids.seen,
        counted: ids.counted,
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
            st.timers.insert(w.end, id);
        }
        if session {
            st.sessions.entry(w.key.clone()).or_default().insert(w.start, w.end);
        }
        if plan.count_keys {
            *st.keys.get_or_insert_with(crate::engine::key_id(&w.key), || 0).0 += 1;
        }
        st.windows.insert(id, w);
    }
    Ok(Engine::from_parts(Arc::new(plan), image.mode, st))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EventIn, Output};

    /// The same state as an older format wrote it: fewer ledger counters, no counted versions.
    fn older<C: Serialize>(c: &Contract, engine: &Engine, format: u32, counters: impl Fn(&Counters) -> C) -> Vec<u8> {
        let (_, image, _) = decode(c, &engine.snapshot()).unwrap();
        let old = ImageOf {
            counters: counters(&image.counters),
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
        bytes.extend_from_slice(&format.to_le_bytes());
        bytes.extend(postcard::to_allocvec(&old).unwrap());
        bytes
    }

    #[test]
    fn a_batch_says_how_many_records_it_holds() {
        for n in [0usize, 1, 127, 128, 300, 20_000] {
            let batch = postcard::to_allocvec(&vec![7u16; n]).unwrap();
            assert_eq!(records_in(&batch, true), n);
        }
        assert_eq!(records_in(&[0xff; 12], true), 0, "a count past ten bytes");
        assert_eq!(records_in(&[0xff, 0x7f], true), 2, "never more than the batch's bytes");
        assert_eq!(records_in(&[0; ID_BYTES * 3], false), 3);
    }

    #[test]
    fn an_id_batch_under_corrections_reads_the_same_in_each_encoding_and_damage_is_an_error() {
        let text = "[pipeline]\nname = \"p\"\nversion = 1\nowner = \"o\"\nsteward = \"s\"\ndecision = \"d\"\n\
            [source]\ntopic = \"t\"\nevent_time = \"t\"\nkey = [\"k\"]\nevent_id = \"id\"\n\
            where = '!has(status) || status != \"void\"'\n\
            [window]\ntype = \"tumbling\"\nsize = \"10s\"\n[dedup]\nhorizon = \"1m\"\non_conflict = \"correct\"\n\
            [[aggregate]]\nname = \"n\"\nfn = \"count\"\n\
            [[aggregate]]\nname = \"total\"\nfn = \"sum\"\nfield = \"amount\"\n";
        let c = Contract::parse("p.toml", text).unwrap();
        let mut engine = Engine::new(&c, Mode::Stream, 1).unwrap();
        engine.track_changes();
        let mut out = Output::default();
        let events = [
            r#"{"k":"a","t":1000,"id":"1","amount":"12.50"}"#,
            r#"{"k":"b","t":2000,"id":"2","amount":-3}"#,
            r#"{"k":"a","t":3000,"id":"3"}"#,
            // A mantissa past an i64.
            r#"{"k":"a","t":3500,"id":"4","amount":"123456789012345678901.5"}"#,
            // A correction (another amount, another key) and a deletion.
            r#"{"k":"b","t":1500,"id":"1","amount":"0.0001"}"#,
            r#"{"id":"2","status":"void"}"#,
        ];
        for (i, e) in events.iter().enumerate() {
            engine.process(EventIn { partition: 0, offset: i as u64 + 1, bytes: e.as_bytes() }, &mut out);
        }
        let delta = engine.take_delta();
        assert!(delta.ids.starts_with(&COMPACT_MARK));
        let records = decode_records(&delta.ids, 2).unwrap();
        assert_eq!(records.len(), 4);
        assert!(records.iter().any(|r| r.entry.is_none()), "the deletion's record");
        let given: Vec<_> =
            records.iter().filter_map(|r| r.entry.as_ref()).flat_map(|(_, c)| c.given.to_vec()).collect();
        assert!(given.contains(&Some(rust_decimal::Decimal::new(1, 4))), "{given:?}");
        let big = rust_decimal::Decimal::from_i128_with_scale(1_234_567_890_123_456_789_015, 1);
        assert!(given.contains(&Some(big)), "{given:?}");
        // The same records as batches written before this encoding: fixed fields, and postcard before them.
        let fixed = encode_fixed(&records);
        assert!(fixed.len() > delta.ids.len() * 3 / 2, "{} bytes fixed, {} compact", fixed.len(), delta.ids.len());
        let older = postcard::to_allocvec(&records).unwrap();
        let windows: Vec<(u128, Vec<u8>)> = delta.windows.iter().filter_map(|(k, w)| Some((*k, w.clone()?))).collect();
        for batch in [&delta.ids, &fixed, &older] {
            let restored = Engine::restore_parts(&c, &delta.header, windows.clone(), [batch]).unwrap();
            assert_eq!(restored.snapshot(), engine.snapshot());
        }
        assert_eq!(records_in(&fixed, true), 4);
        assert_eq!(records_in(&delta.ids, true), 4);
        // Every cut short and every byte changed: an error or records, never a panic.
        for cut in 0..delta.ids.len() {
            assert!(decode_records(&delta.ids[..cut], 2).is_err(), "cut at {cut}");
        }
        for at in 0..delta.ids.len() {
            let mut bytes = delta.ids.clone();
            bytes[at] ^= 0x80;
            let _ = decode_records(&bytes, 2);
            let _ = Engine::restore_parts(&c, &delta.header, windows.clone(), [&bytes]);
        }
        assert!(decode_records(&delta.ids, 1).is_err(), "a record with more aggregates than the contract");
    }

    /// A batch in the fixed encoding that builds before [`COMPACT_MARK`] wrote.
    fn encode_fixed(records: &[IdRecord]) -> Vec<u8> {
        let mut out = RECORDS_MARK.to_vec();
        out.extend_from_slice(&(records.len() as u64).to_le_bytes());
        for r in records {
            out.extend_from_slice(&r.id.to_le_bytes());
            out.extend_from_slice(&r.keep_until.to_le_bytes());
            let Some((s, c)) = &r.entry else {
                out.push(0);
                continue;
            };
            out.push(1);
            for field in [&s.partition.to_le_bytes()[..], &s.offset.to_le_bytes(), &s.payload_hash.to_le_bytes()] {
                out.extend_from_slice(field);
            }
            for field in [s.expires, c.time] {
                out.extend_from_slice(&field.to_le_bytes());
            }
            out.extend_from_slice(&c.window.to_le_bytes());
            out.extend_from_slice(&c.wm_at.to_le_bytes());
            out.extend_from_slice(&c.keep_until.to_le_bytes());
            out.extend_from_slice(&(c.given.len() as u16).to_le_bytes());
            for g in c.given.iter() {
                match g {
                    None => out.push(0),
                    Some(d) => match i64::try_from(d.mantissa()) {
                        Ok(small) => {
                            out.push(2);
                            out.extend_from_slice(&small.to_le_bytes());
                            out.push(d.scale() as u8);
                        }
                        Err(_) => {
                            out.push(1);
                            out.extend_from_slice(&d.mantissa().to_le_bytes());
                            out.push(d.scale() as u8);
                        }
                    },
                }
            }
        }
        out
    }

    #[test]
    fn a_compact_batch_reads_back_every_value_at_its_extremes() {
        let max = rust_decimal::Decimal::MAX;
        let min = rust_decimal::Decimal::MIN;
        let tiny = rust_decimal::Decimal::new(-1, 28);
        let record = |id: u128, times: [i64; 5], given: Vec<Option<rust_decimal::Decimal>>| {
            let [time, expires, wm_at, counted_until, keep_until] = times;
            let seen = Seen { partition: u32::MAX, offset: u64::MAX, payload_hash: id as u64, expires };
            let counted =
                Counted { time, window: !id, wm_at, given: given.into_boxed_slice(), keep_until: counted_until };
            IdRecord { id, keep_until, entry: Some((seen, counted)) }
        };
        let records = vec![
            record(1, [i64::MAX, i64::MIN, i64::MAX, i64::MIN, i64::MAX], vec![Some(max), None]),
            record(u128::MAX, [i64::MIN, i64::MAX, i64::MIN, i64::MAX, i64::MAX], vec![Some(min), Some(tiny)]),
            record(3, [0, 0, 0, 0, 0], vec![None, Some(rust_decimal::Decimal::ZERO)]),
            IdRecord { id: 4, keep_until: i64::MIN, entry: None },
            IdRecord { id: 5, keep_until: i64::MAX, entry: None },
        ];
        let batch = encode_records(&records);
        let read = decode_records(&batch, 2).unwrap();
        assert_eq!(postcard::to_allocvec(&read).unwrap(), postcard::to_allocvec(&records).unwrap());
        assert_eq!(records_in(&batch, true), records.len());
        // Every cut short and every byte changed: an error or records, never a panic.
        for cut in 0..batch.len() {
            assert!(decode_records(&batch[..cut], 2).is_err(), "cut at {cut}");
        }
        for at in 0..batch.len() {
            for flip in [0x01, 0x80, 0xff] {
                let mut bytes = batch.clone();
                bytes[at] ^= flip;
                let _ = decode_records(&bytes, 2);
            }
        }
        // A varint longer than its field is damage, not a value cut to size.
        let mut f = Fields(&[0xff, 0xff, 0xff, 0xff, 0x7f]);
        assert!(f.var_u32().is_err());
        let mut f = Fields(&[0xff, 0xff, 0xff, 0xff, 0x0f]);
        assert_eq!(f.var_u32().unwrap(), u32::MAX);
    }

    #[test]
    fn format_4_5_and_6_snapshots_are_read_with_their_counters() {
        let text = "[pipeline]\nname = \"p\"\nversion = 1\nowner = \"o\"\nsteward = \"s\"\ndecision = \"d\"\n\
            [source]\ntopic = \"t\"\nevent_time = \"t\"\nkey = [\"k\"]\nevent_id = \"id\"\n\
            [window]\ntype = \"tumbling\"\nsize = \"10s\"\n[dedup]\nhorizon = \"1m\"\n\
            [[aggregate]]\nname = \"n\"\nfn = \"count\"\n";
        let c = Contract::parse("p.toml", text).unwrap();
        let mut engine = Engine::new(&c, Mode::Stream, 1).unwrap();
        let mut out = Output::default();
        let events = [r#"{"k":"a","t":1000,"id":1}"#, "{", r#"{"k":"a","t":2000,"id":2}"#];
        for (i, e) in events.iter().enumerate() {
            engine.process(EventIn { partition: 0, offset: i as u64 + 1, bytes: e.as_bytes() }, &mut out);
        }
        let v4 = older(&c, &engine, 4, |k| Counters4 {
            read: k.read,
            counted: k.counted,
            filtered: k.filtered,
            late_allowed: k.late_allowed,
            ledger: k.ledger[..8].try_into().unwrap(),
            rows_provisional: k.rows_provisional,
            rows_settled: k.rows_settled,
            rows_retracted: k.rows_retracted,
        });
        let v5 = older(&c, &engine, 5, |k| Counters5 {
            read: k.read,
            counted: k.counted,
            filtered: k.filtered,
            late_allowed: k.late_allowed,
            ledger: k.ledger[..9].try_into().unwrap(),
            rows_provisional: k.rows_provisional,
            rows_settled: k.rows_settled,
            rows_retracted: k.rows_retracted,
        });
        let v6 = older(&c, &engine, 6, |k| Counters6 {
            read: k.read,
            counted: k.counted,
            filtered: k.filtered,
            late_allowed: k.late_allowed,
            ledger: k.ledger[..10].try_into().unwrap(),
            rows_provisional: k.rows_provisional,
            rows_settled: k.rows_settled,
            rows_retracted: k.rows_retracted,
        });
        // Older formats kept no lateness histogram.
        engine.st.counters.lateness = Default::default();
        for mut bytes in [v4, v5, v6] {
            let restored = Engine::restore(&c, &bytes).unwrap();
            assert_eq!(restored.counters(), engine.counters());
            assert_eq!(restored.counters().ledger[1], 1);
            assert_eq!(restored.remembered_ids(), 2);
            assert_eq!(restored.snapshot(), engine.snapshot());
            bytes[8] = 3;
            assert_eq!(Engine::restore(&c, &bytes).unwrap_err(), SnapshotError::Format { found: 3 });
        }
    }
}

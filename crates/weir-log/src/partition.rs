//! One partition: its segment files, recovery, appends and reads.
//!
//! A partition is a folder of segment files named by the offset of their
//! first record (`00000000000000000000.seg`). Only the last segment is
//! written; a segment is closed when it reaches the configured size.
//!
//! Invariants: the segments' offsets are contiguous, from `start_offset`
//! to `durable_end` (exclusive); every byte below `durable` of the last
//! segment was fsynced and is what readers see; bytes past it belong to a
//! write not yet acknowledged and are cut back on failure.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::record::{self, Parsed, Record, HEADER};
use crate::LogError;

/// An index entry every this many bytes of a segment.
const INDEX_EVERY: u64 = 4096;

#[derive(Debug)]
pub(crate) struct Segment {
    pub base: u64,
    pub path: PathBuf,
    pub file: Arc<File>,
    /// Bytes readers may see (durable).
    pub len: u64,
    /// The offset after the segment's last durable record.
    pub end: u64,
    /// The newest append time in the segment (for retention).
    pub newest_ms: i64,
    /// `(offset, position)` of some records, in order, for seeking.
    pub index: Vec<(u64, u64)>,
}

#[derive(Debug)]
pub(crate) struct Partition {
    pub dir: PathBuf,
    pub segments: Vec<Segment>,
    /// Records appended since the last sync, encoded.
    pending: Vec<u8>,
    /// Offsets and append times of the pending records.
    pending_meta: Vec<(u64, i64, u64)>,
    next_offset: u64,
}

/// What recovery did to a partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovered {
    pub partition: u32,
    pub records: u64,
    /// Bytes cut from the end of the last segment: a write torn by a crash.
    pub torn_bytes: u64,
}

fn segment_name(base: u64) -> String {
    format!("{base:020}.seg")
}

impl Partition {
    /// Creates an empty partition folder.
    pub(crate) fn create(dir: &Path) -> Result<Partition, LogError> {
        crate::create_private_dir(dir).map_err(|e| LogError::io(dir, "create the partition folder", e))?;
        let mut p = Partition {
            dir: dir.to_owned(),
            segments: Vec::new(),
            pending: Vec::new(),
            pending_meta: Vec::new(),
            next_offset: 0,
        };
        p.roll(0)?;
        Ok(p)
    }

    /// Opens a partition folder, checking every record: a torn tail of the
    /// last segment is cut off; damage anywhere else is refused. Each
    /// segment is read into `buf`, kept by the caller so that one
    /// allocation serves every segment.
    pub(crate) fn open(dir: &Path, id: u32, buf: &mut Vec<u8>) -> Result<(Partition, Recovered), LogError> {
        let mut bases = Vec::new();
        let entries = std::fs::read_dir(dir).map_err(|e| LogError::io(dir, "list the partition folder", e))?;
        for entry in entries {
            let entry = entry.map_err(|e| LogError::io(dir, "list the partition folder", e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(base) = name.strip_suffix(".seg").and_then(|b| b.parse::<u64>().ok()) {
                bases.push(base);
            }
        }
        bases.sort_unstable();
        if bases.is_empty() {
            let p = Partition::create(dir)?;
            return Ok((p, Recovered { partition: id, records: 0, torn_bytes: 0 }));
        }
        let mut segments = Vec::new();
        let mut records = 0;
        let mut torn_bytes = 0;
        for (i, &base) in bases.iter().enumerate() {
            let last = i + 1 == bases.len();
            let path = dir.join(segment_name(base));
            if let Some(prev) = segments.last() {
                let prev: &Segment = prev;
                if prev.end != base {
                    return Err(LogError::Corrupt {
                        file: path,
                        position: 0,
                        detail: format!(
                            "the segment starts at offset {base}, but the one before it ends at {}",
                            prev.end
                        ),
                    });
                }
            }
            let (segment, count, torn) = scan_segment(&path, base, last, buf)?;
            records += count;
            torn_bytes += torn;
            segments.push(segment);
        }
        let next_offset = segments.last().map_or(0, |s| s.end);
        let p = Partition { dir: dir.to_owned(), segments, pending: Vec::new(), pending_meta: Vec::new(), next_offset };
        Ok((p, Recovered { partition: id, records, torn_bytes }))
    }

    pub(crate) fn start_offset(&self) -> u64 {
        self.segments.first().map_or(0, |s| s.base)
    }

    pub(crate) fn durable_end(&self) -> u64 {
        self.segments.last().map_or(0, |s| s.end)
    }

    /// Encodes a record into the pending write; returns its offset.
    pub(crate) fn push(&mut self, payload: &[u8], tag: Option<&[u8; record::TAG]>, append_ms: i64) -> u64 {
        let offset = self.next_offset;
        let at = self.pending.len() as u64;
        record::encode(offset, append_ms, payload, tag, &mut self.pending);
        self.pending_meta.push((offset, append_ms, at));
        self.next_offset += 1;
        offset
    }

    pub(crate) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Writes and fsyncs the pending records (phase one of a group
    /// commit). Readers see nothing of them until [`Partition::publish`].
    pub(crate) fn write_pending(&mut self, fail: bool) -> Result<(), LogError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let seg = self.segments.last().ok_or_else(|| LogError::Unavailable("no segment".into()))?;
        let mut file: &File = &seg.file;
        file.write_all(&self.pending).map_err(|e| LogError::io(&seg.path, "write", e))?;
        if fail {
            // As a full disk or a failing device would: the bytes may be in
            // the file, but they are not durable.
            return Err(LogError::io(&seg.path, "fsync", std::io::Error::other("injected failure")));
        }
        seg.file.sync_data().map_err(|e| LogError::io(&seg.path, "fsync", e))
    }

    /// Makes the written records visible (phase two), and starts a new
    /// segment when this one is full.
    pub(crate) fn publish(&mut self, segment_bytes: u64) -> Result<(), LogError> {
        let Some(seg) = self.segments.last_mut() else { return Ok(()) };
        let base_len = seg.len;
        for &(offset, append_ms, at) in &self.pending_meta {
            let pos = base_len + at;
            if seg.index.last().is_none_or(|&(_, p)| pos >= p + INDEX_EVERY) {
                seg.index.push((offset, pos));
            }
            seg.newest_ms = seg.newest_ms.max(append_ms);
        }
        seg.len += self.pending.len() as u64;
        seg.end = self.next_offset;
        self.pending.clear();
        self.pending_meta.clear();
        if seg.len >= segment_bytes {
            self.roll(self.next_offset)?;
        }
        Ok(())
    }

    /// Forgets the pending records and cuts the file back to what was durable.
    pub(crate) fn discard_pending(&mut self) {
        self.pending.clear();
        self.pending_meta.clear();
        if let Some(seg) = self.segments.last() {
            self.next_offset = seg.end;
            // The cut made durable, so refused records cannot come back
            // after a crash. Best effort: if this fails too, the partition
            // stays unhealthy, and its probe cuts and syncs again before
            // any write is taken.
            if seg.file.set_len(seg.len).is_ok() {
                let _ = seg.file.sync_all();
            }
        }
    }

    /// Checks that the partition can write and sync again.
    pub(crate) fn probe(&mut self) -> Result<(), LogError> {
        let seg = self.segments.last().ok_or_else(|| LogError::Unavailable("no segment".into()))?;
        seg.file.set_len(seg.len).map_err(|e| LogError::io(&seg.path, "truncate", e))?;
        seg.file.sync_all().map_err(|e| LogError::io(&seg.path, "fsync", e))
    }

    /// Starts a new segment at `base`.
    fn roll(&mut self, base: u64) -> Result<(), LogError> {
        let path = self.dir.join(segment_name(base));
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .append(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| LogError::io(&path, "create a segment", e))?;
        sync_dir(&self.dir)?;
        self.segments.push(Segment {
            base,
            path,
            file: Arc::new(file),
            len: 0,
            end: base,
            newest_ms: i64::MIN,
            index: Vec::new(),
        });
        Ok(())
    }

    /// Deletes closed segments whose newest record is older than `cutoff_ms`.
    pub(crate) fn drop_older_than(&mut self, cutoff_ms: i64) -> Result<u64, LogError> {
        let mut dropped = 0;
        while self.segments.len() > 1 && self.segments[0].newest_ms < cutoff_ms {
            let seg = self.segments.remove(0);
            std::fs::remove_file(&seg.path).map_err(|e| LogError::io(&seg.path, "delete an expired segment", e))?;
            dropped += 1;
        }
        if dropped > 0 {
            sync_dir(&self.dir)?;
        }
        Ok(dropped)
    }

    /// Where reading from `from` starts (from the first kept record when
    /// `from` is older), or `None` when no durable record is at or after it.
    pub(crate) fn locate(&self, from: u64) -> Option<ReadPlan> {
        let from = from.max(self.start_offset());
        let i = self.segments.partition_point(|s| s.base <= from).checked_sub(1)?;
        let seg = &self.segments[i];
        if from >= seg.end {
            return None;
        }
        let j = seg.index.partition_point(|&(o, _)| o <= from);
        let pos = if j == 0 { 0 } else { seg.index[j - 1].1 };
        Some(ReadPlan { file: Arc::clone(&seg.file), path: seg.path.clone(), pos, len: seg.len, from, end: seg.end })
    }
}

/// Where to read: a segment's file from `pos` to `len`, keeping records
/// from offset `from`; `end` is the offset after the segment's last record.
pub(crate) struct ReadPlan {
    pub file: Arc<File>,
    pub path: PathBuf,
    pub pos: u64,
    pub len: u64,
    pub from: u64,
    pub end: u64,
}

/// Reads records from `pos` of a segment file up to `len`, skipping those
/// before `from`, until `max_records` or about `max_bytes` of payload.
pub(crate) fn read_segment(
    plan: &ReadPlan,
    partition: u32,
    max_records: usize,
    max_bytes: usize,
    out: &mut Vec<Record>,
) -> Result<(), LogError> {
    let ReadPlan { file, path, len, from, .. } = plan;
    let (len, from) = (*len, *from);
    let mut pos = plan.pos;
    let mut bytes_out: usize = out.iter().map(|r| r.payload.len()).sum();
    let mut buf = vec![0u8; 64 << 10];
    while pos < len && out.len() < max_records && bytes_out < max_bytes {
        let want = ((len - pos) as usize).min(buf.len());
        file.read_exact_at(&mut buf[..want], pos).map_err(|e| LogError::io(path, "read", e))?;
        let mut at = 0;
        loop {
            match record::parse(&buf[at..want]) {
                Parsed::Record { offset, append_ms, payload, tag, size } => {
                    if offset >= from {
                        bytes_out += payload.len();
                        out.push(Record { partition, offset, append_ms, payload: payload.to_vec(), tag: tag.copied() });
                    }
                    at += size;
                    if out.len() >= max_records || bytes_out >= max_bytes {
                        break;
                    }
                }
                Parsed::Short if at > 0 => break,
                Parsed::Short => {
                    // One record larger than the buffer: read it whole.
                    let size = HEADER + record::body_len(buf[0..4].try_into().unwrap_or_default());
                    if size as u64 > len - pos || size > record::RECORD_MAX + HEADER {
                        let detail = "a record cut short inside the durable bytes".into();
                        return Err(LogError::Corrupt { file: path.to_owned(), position: pos, detail });
                    }
                    buf.resize(size, 0);
                    break;
                }
                Parsed::Bad(why) => {
                    return Err(LogError::Corrupt {
                        file: path.to_owned(),
                        position: pos + at as u64,
                        detail: why.into(),
                    })
                }
            }
        }
        pos += at as u64;
    }
    Ok(())
}

/// Checks every record of a segment; returns the segment, its record count
/// and the bytes of torn tail cut off (only the last segment may have one).
fn scan_segment(path: &Path, base: u64, last: bool, buf: &mut Vec<u8>) -> Result<(Segment, u64, u64), LogError> {
    buf.clear();
    File::open(path)
        .and_then(|mut f| std::io::Read::read_to_end(&mut f, buf))
        .map_err(|e| LogError::io(path, "read", e))?;
    let bytes = &buf[..];
    let mut pos = 0usize;
    let mut expected = base;
    let mut newest_ms = i64::MIN;
    let mut index = Vec::new();
    let mut count = 0;
    while pos < bytes.len() {
        let problem = match record::parse(&bytes[pos..]) {
            Parsed::Record { offset, append_ms, size, .. } if offset == expected => {
                if index.last().is_none_or(|&(_, p)| pos as u64 >= p + INDEX_EVERY) {
                    index.push((offset, pos as u64));
                }
                newest_ms = newest_ms.max(append_ms);
                expected += 1;
                count += 1;
                pos += size;
                continue;
            }
            Parsed::Record { offset, .. } => format!("a record with offset {offset} where offset {expected} belongs"),
            Parsed::Short => "a record cut short".to_owned(),
            Parsed::Bad(why) => why.to_owned(),
        };
        let torn = last && !record::any_record_from(&bytes[pos..], expected);
        if !torn {
            return Err(LogError::Corrupt {
                file: path.to_owned(),
                position: pos as u64,
                detail: format!("{problem} (offset {expected}), and records follow it"),
            });
        }
        break;
    }
    let torn_bytes = (bytes.len() - pos) as u64;
    let file = OpenOptions::new().read(true).append(true).open(path).map_err(|e| LogError::io(path, "open", e))?;
    if torn_bytes > 0 {
        file.set_len(pos as u64).map_err(|e| LogError::io(path, "cut the torn tail from", e))?;
        file.sync_all().map_err(|e| LogError::io(path, "fsync", e))?;
    }
    let segment =
        Segment { base, path: path.to_owned(), file: Arc::new(file), len: pos as u64, end: expected, newest_ms, index };
    Ok((segment, count, torn_bytes))
}

fn sync_dir(dir: &Path) -> Result<(), LogError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| LogError::io(dir, "fsync the folder", e))
}

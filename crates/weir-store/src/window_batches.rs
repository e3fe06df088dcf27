//! A checkpoint's changed windows, stored as one record
//! (`state_window_batches`) and folded into `state_windows` once enough
//! have gathered, in both stores.
//!
//! Writing each changed window to `state_windows` in every checkpoint
//! dirtied a page of that table per window: the table is ordered by the
//! window's hash, so about 1,000 windows a checkpoint touched about 1,000
//! pages. A batch is appended instead, and a checkpoint that finds
//! [`FOLD_BYTES`] or [`FOLD_BATCHES`] pending folds them all, with its
//! own, into `state_windows` in one pass: a window changed in many
//! checkpoints is written there once.
//!
//! **Invariant:** a scope's state is `state_windows` with its pending
//! batches applied over it in `seq` order; a fold and a restore both read
//! it so, and a fold deletes the batches it applied in the same
//! transaction.
//!
//! A batch holds, per window: its id (16 bytes, big-endian), the length of
//! its data (4 bytes, little-endian; [`DROPPED`] for a window the engine
//! dropped) and the data.

use std::collections::HashMap;

/// The pending bytes of a scope's batches that make its next checkpoint
/// fold them. A restore reads at most this much besides `state_windows`.
pub const FOLD_BYTES: i64 = 8 << 20;

/// The pending batches of a scope that make its next checkpoint fold them.
pub const FOLD_BATCHES: i64 = 1024;

/// The length that marks a dropped window.
const DROPPED: u32 = u32::MAX;

/// `windows` as one batch.
pub(crate) fn encode(windows: &[(u128, Option<Vec<u8>>)]) -> Vec<u8> {
    let size = windows.iter().map(|(_, d)| 20 + d.as_ref().map_or(0, Vec::len)).sum();
    let mut out = Vec::with_capacity(size);
    for (id, data) in windows {
        out.extend_from_slice(&id.to_be_bytes());
        match data {
            Some(bytes) => {
                // A window's data is far below 4 GiB: the engine limits an event and a window's keys.
                out.extend_from_slice(&u32::try_from(bytes.len()).unwrap_or(DROPPED - 1).to_le_bytes());
                out.extend_from_slice(bytes);
            }
            None => out.extend_from_slice(&DROPPED.to_le_bytes()),
        }
    }
    out
}

/// A batch that does not decode: the store was changed outside weir.
#[derive(Debug, thiserror::Error)]
#[error(
    "a stored batch of changed windows (state_window_batches, seq {seq}, {len} bytes) has an entry at byte {at} that runs past its end; the results database was changed outside weir: restore it from a backup, or move it aside to rebuild results from the log"
)]
pub struct Corrupt {
    pub seq: i64,
    pub at: usize,
    pub len: usize,
}

/// Applies one batch over `state`, in its order: a later record of a
/// window replaces an earlier one; `None` marks a dropped window.
pub(crate) fn apply(batch: &[u8], seq: i64, state: &mut HashMap<u128, Option<Vec<u8>>>) -> Result<(), Corrupt> {
    let mut at = 0;
    while at < batch.len() {
        let corrupt = Corrupt { seq, at, len: batch.len() };
        let Some(head) = batch.get(at..at + 20) else { return Err(corrupt) };
        let id = u128::from_be_bytes(head[..16].try_into().unwrap_or_default());
        let len = u32::from_le_bytes(head[16..].try_into().unwrap_or_default());
        at += 20;
        if len == DROPPED {
            state.insert(id, None);
            continue;
        }
        let Some(data) = batch.get(at..at + len as usize) else { return Err(corrupt) };
        state.insert(id, Some(data.to_vec()));
        at += len as usize;
    }
    Ok(())
}

/// A restore's windows: the folded ones, then each pending batch over them.
/// Only the pending windows are hashed: the folded ones keep their order,
/// with those a batch wrote again replaced or dropped, and the windows only
/// a batch holds come after them (the engine reads them in any order).
pub(crate) fn restored(
    folded: Vec<(u128, Vec<u8>)>,
    batches: &[(i64, Vec<u8>)],
) -> Result<Vec<(u128, Vec<u8>)>, Corrupt> {
    let mut pending = decoded(batches)?;
    if pending.is_empty() {
        return Ok(folded);
    }
    let mut windows = Vec::with_capacity(folded.len() + pending.len());
    for (id, data) in folded {
        match pending.remove(&id) {
            None => windows.push((id, data)),
            Some(Some(newer)) => windows.push((id, newer)),
            Some(None) => {}
        }
    }
    windows.extend(pending.into_iter().filter_map(|(id, d)| Some((id, d?))));
    Ok(windows)
}

/// The latest record of each window in a scope's pending batches.
pub(crate) type Windows = HashMap<u128, Option<Vec<u8>>>;

/// The pending batches decoded, in `seq` order.
pub(crate) fn decoded(batches: &[(i64, Vec<u8>)]) -> Result<Windows, Corrupt> {
    let mut state = HashMap::new();
    for (seq, batch) in batches {
        apply(batch, *seq, &mut state)?;
    }
    Ok(state)
}

/// What a fold writes to `state_windows`: the pending batches' windows,
/// then the checkpoint's own, each window once, in the order of their ids
/// (the table's).
pub(crate) fn folded(mut pending: Windows, windows: Vec<(u128, Option<Vec<u8>>)>) -> Vec<(u128, Option<Vec<u8>>)> {
    pending.extend(windows);
    let mut state: Vec<_> = pending.into_iter().collect();
    state.sort_unstable_by_key(|(id, _)| *id);
    state
}

/// A writer's copy of the windows of a scope's pending batches, so that a
/// fold need not read them back from the store. It is trusted only while
/// the store's pending batches are the ones it saw written: a checkpoint
/// that did not commit, a replay or another writer make the store's count
/// or last `seq` differ, and the fold then reads the batches.
#[derive(Debug, Default)]
pub struct Pending {
    windows: Windows,
    /// The count and last `seq` of the batches `windows` holds.
    holds: Option<(i64, i64)>,
}

impl Pending {
    /// Whether this copy holds every pending batch, given the store's
    /// count and last `seq` of them. With none pending, it holds them: it
    /// starts again from none.
    pub(crate) fn holds(&mut self, count: i64, last: i64) -> bool {
        if count == 0 {
            self.windows = HashMap::new();
            self.holds = Some((0, last));
        }
        self.holds == Some((count, last))
    }

    /// A batch written after the `count` ending at `last`: kept when this
    /// copy held those, else the copy is unknown.
    pub(crate) fn wrote(&mut self, (count, last): (i64, i64), windows: Vec<(u128, Option<Vec<u8>>)>) {
        if self.holds(count, last) {
            self.windows.extend(windows);
            self.holds = Some((count + 1, last + 1));
        } else {
            self.forget();
        }
    }

    /// The pending windows, for a fold; the copy then holds none, as the
    /// store will once the fold commits.
    pub(crate) fn take(&mut self) -> Windows {
        self.holds = Some((0, 0));
        std::mem::take(&mut self.windows)
    }

    /// Drops the copy: the next fold reads the store.
    pub(crate) fn forget(&mut self) {
        self.windows = HashMap::new();
        self.holds = None;
    }
}

/// Whether a checkpoint folds, given the scope's pending `(batches, bytes)`
/// and its own batch's size.
pub(crate) fn folds((batches, bytes): (i64, i64), own: usize) -> bool {
    batches + 1 >= FOLD_BATCHES || bytes.saturating_add(own as i64) >= FOLD_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(mut v: Vec<(u128, Vec<u8>)>) -> Vec<(u128, Vec<u8>)> {
        v.sort();
        v
    }

    #[test]
    fn batches_over_the_folded_windows_give_the_latest_of_each_and_drop_the_dropped() {
        let folded = vec![(1, b"one".to_vec()), (2, b"two".to_vec()), (3, b"three".to_vec())];
        let first = encode(&[(2, None), (4, Some(b"four".to_vec())), (1, Some(b"uno".to_vec()))]);
        let second = encode(&[(4, Some(Vec::new())), (2, Some(b"back".to_vec())), (3, None)]);
        let got = restored(folded, &[(7, first), (8, second)]).unwrap();
        let want = vec![(1, b"uno".to_vec()), (2, b"back".to_vec()), (4, Vec::new())];
        assert_eq!(sorted(got), want);
        // Folded windows no batch wrote again keep their place, first.
        let got = restored(
            vec![(9, b"x".to_vec()), (1, b"y".to_vec())],
            &[(1, encode(&[(5, None), (3, Some(b"z".to_vec()))]))],
        );
        assert_eq!(got.unwrap(), vec![(9, b"x".to_vec()), (1, b"y".to_vec()), (3, b"z".to_vec())]);
    }

    #[test]
    fn a_fold_writes_each_window_once_its_own_windows_last() {
        let first = encode(&[(5, Some(b"a".to_vec())), (6, Some(b"b".to_vec()))]);
        let second = encode(&[(5, Some(b"c".to_vec())), (7, None)]);
        let pending = decoded(&[(1, first), (2, second)]).unwrap();
        let got = folded(pending, vec![(6, None), (8, Some(b"d".to_vec()))]);
        assert_eq!(got, vec![(5, Some(b"c".to_vec())), (6, None), (7, None), (8, Some(b"d".to_vec()))]);
    }

    #[test]
    fn a_batch_cut_short_is_refused_with_where() {
        let whole = encode(&[(9, Some(b"nine".to_vec())), (10, None)]);
        for cut in [1, 19, 21, 23, whole.len() - 1] {
            let err = restored(Vec::new(), &[(3, whole[..cut].to_vec())]).unwrap_err();
            assert_eq!(err.seq, 3);
            let at = if cut < 24 { 0 } else { 24 };
            assert!(err.to_string().contains(&format!("seq 3, {cut} bytes) has an entry at byte {at}")), "{err}");
        }
        assert_eq!(restored(Vec::new(), &[(3, whole)]).unwrap(), vec![(9, b"nine".to_vec())]);
    }

    #[test]
    fn a_writers_copy_is_trusted_only_while_it_saw_every_pending_batch() {
        let mut pending = Pending::default();
        // A fresh writer knows nothing of batches pending, and stays so until a fold.
        pending.wrote((3, 9), vec![(1, Some(b"a".to_vec()))]);
        assert!(!pending.holds(4, 10));
        assert!(pending.take().is_empty() && pending.holds(0, 0));
        // With none pending, it knows them all, whatever it held.
        let mut fresh = Pending::default();
        fresh.wrote((0, 0), vec![(9, None)]);
        assert!(fresh.holds(1, 1));
        fresh.wrote((5, 5), vec![(8, None)]);
        assert!(fresh.holds(0, 0) && fresh.take().is_empty());
        pending.wrote((0, 0), vec![(1, Some(b"a".to_vec())), (2, Some(b"b".to_vec()))]);
        pending.wrote((1, 1), vec![(2, None)]);
        assert!(pending.holds(2, 2));
        // A checkpoint that did not commit leaves the store a batch behind.
        pending.wrote((2, 2), vec![(3, Some(b"c".to_vec()))]);
        assert!(!pending.holds(2, 2));
        pending.wrote((2, 2), vec![(4, Some(b"d".to_vec()))]);
        assert!(!pending.holds(3, 3), "one that missed a batch forgets");
        pending.take();
        pending.wrote((0, 0), vec![(5, None)]);
        let got = folded(pending.take(), vec![(1, Some(b"e".to_vec()))]);
        assert_eq!(got, vec![(1, Some(b"e".to_vec())), (5, None)]);
    }

    #[test]
    fn a_checkpoint_folds_at_either_bound() {
        assert!(!folds((0, 0), 100));
        assert!(folds((FOLD_BATCHES - 1, 0), 0));
        assert!(!folds((FOLD_BATCHES - 2, FOLD_BYTES - 101), 100));
        assert!(folds((1, FOLD_BYTES - 100), 100));
    }
}

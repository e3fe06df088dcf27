//! A checkpoint's changed windows, stored as one record
//! (`state_window_batches`) and folded into `state_windows` once enough
//! have gathered, in both stores.
//!
//! Writing each changed window to `state_windows` in every checkpoint
//! dirtied a page of that table per window: the table is ordered by the
//! window's hash, so about 1,000 windows a checkpoint touched about 1,000
//! pages. A batch is appended instead, and a checkpoint that finds
//! [`FOLD_BYTES`] or [`FOLD_BATCHES`] pending folds the oldest of them
//! ([`FOLD_STEP_BYTES`]) into `state_windows`: each window whose latest
//! record is in them, once, so that a window changed in many checkpoints
//! is written there once, when it has stopped changing (see [`Pending`]).
//! Folding every pending batch at once wrote every window changed in the
//! last 8 MB in one checkpoint (20,000 windows, 33 ms, in the latency
//! bench), which held the results of every event behind it.
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
/// fold the oldest. A restore reads less than this besides `state_windows`.
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

/// The oldest pending batches a fold takes: those that reach this many
/// bytes, or this many batches, whichever comes first.
pub const FOLD_STEP_BYTES: i64 = 1 << 20;

/// See [`FOLD_STEP_BYTES`].
pub const FOLD_STEP_BATCHES: usize = 128;

/// A scope's pending batches as a writer holds them: each window's latest
/// record with the `seq` of the batch that holds it, and each batch's
/// `seq` and size, oldest first.
///
/// A fold takes the oldest batches ([`FOLD_STEP_BYTES`]) and writes only
/// the windows whose latest record is in them: a window a later batch
/// holds again is left for that batch's fold, and the restore, which
/// applies the later batch over `state_windows`, reads it right meanwhile.
/// So a fold's writes are bounded by the step, whatever is pending, and
/// no checkpoint writes every pending window at once.
///
/// The SQLite writer keeps one across checkpoints, trusted only while the
/// store's pending batches are the ones it saw written: a checkpoint that
/// did not commit, a replay or another writer make the store's count or
/// last `seq` differ, and the fold then reads the batches back.
#[derive(Debug, Default)]
pub struct Pending {
    latest: HashMap<u128, (i64, Option<Vec<u8>>)>,
    batches: std::collections::VecDeque<(i64, usize)>,
    /// Whether `batches` is every pending batch (a fresh writer knows none).
    known: bool,
}

impl Pending {
    /// The store's pending batches, in `seq` order.
    pub(crate) fn read(batches: &[(i64, Vec<u8>)]) -> Result<Pending, Corrupt> {
        let mut pending = Pending { known: true, ..Pending::default() };
        for (seq, batch) in batches {
            let mut windows = HashMap::new();
            apply(batch, *seq, &mut windows)?;
            pending.latest.extend(windows.into_iter().map(|(id, data)| (id, (*seq, data))));
            pending.batches.push_back((*seq, batch.len()));
        }
        Ok(pending)
    }

    /// Whether this copy holds every pending batch, given the store's
    /// count and last `seq` of them. With none pending, it holds them: it
    /// starts again from none.
    pub(crate) fn holds(&mut self, count: i64, last: i64) -> bool {
        if count == 0 {
            *self = Pending { known: true, ..Pending::default() };
            return true;
        }
        self.known && self.batches.len() as i64 == count && self.batches.back().is_some_and(|b| b.0 == last)
    }

    /// Batch `last + 1` of `bytes`, written after the `count` ending at
    /// `last`: kept when this copy held those, else the copy is unknown.
    pub(crate) fn wrote(&mut self, (count, last): (i64, i64), bytes: usize, windows: Vec<(u128, Option<Vec<u8>>)>) {
        if !self.holds(count, last) {
            self.forget();
            return;
        }
        let seq = last + 1;
        self.latest.extend(windows.into_iter().map(|(id, data)| (id, (seq, data))));
        self.batches.push_back((seq, bytes));
    }

    /// The last `seq` of the oldest batches a fold takes; `None` with none
    /// pending. It takes [`FOLD_STEP_BYTES`] or [`FOLD_STEP_BATCHES`], and
    /// more if the rest would still be past [`FOLD_BYTES`] or
    /// [`FOLD_BATCHES`] less a step: so after any checkpoint less than
    /// [`FOLD_BYTES`] is pending, however large its batches.
    pub(crate) fn fold_through(&self) -> Option<i64> {
        let mut rest = self.batches.iter().map(|b| b.1 as i64).sum::<i64>();
        let (mut bytes, mut through) = (0, None);
        for (n, &(seq, size)) in self.batches.iter().enumerate() {
            (bytes, rest, through) = (bytes + size as i64, rest - size as i64, Some(seq));
            let (taken, left) = (n + 1, self.batches.len() - n - 1);
            let stepped = bytes >= FOLD_STEP_BYTES || taken >= FOLD_STEP_BATCHES;
            let under = rest <= FOLD_BYTES - FOLD_STEP_BYTES && left as i64 <= FOLD_BATCHES - FOLD_STEP_BATCHES as i64;
            if stepped && under {
                break;
            }
        }
        through
    }

    /// Folds the batches through `through`: what it writes to
    /// `state_windows`, the windows whose latest record is in them, in the
    /// order of their ids (the table's). The copy then holds the batches after.
    pub(crate) fn fold(&mut self, through: i64) -> Vec<(u128, Option<Vec<u8>>)> {
        while self.batches.front().is_some_and(|b| b.0 <= through) {
            self.batches.pop_front();
        }
        let mut state: Vec<_> =
            self.latest.extract_if(|_, (seq, _)| *seq <= through).map(|(id, (_, data))| (id, data)).collect();
        state.sort_unstable_by_key(|(id, _)| *id);
        state
    }

    /// Drops the copy: the next fold reads the store.
    pub(crate) fn forget(&mut self) {
        *self = Pending::default();
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
    fn a_fold_takes_the_oldest_batches_and_writes_the_windows_no_later_batch_holds() {
        let big = vec![0u8; FOLD_STEP_BYTES as usize];
        let batches = [
            (1, encode(&[(5, Some(b"a".to_vec())), (6, Some(b"b".to_vec()))])),
            (2, encode(&[(5, Some(b"c".to_vec())), (7, None), (9, Some(big.clone()))])),
            (3, encode(&[(6, None), (8, Some(b"d".to_vec())), (9, Some(b"e".to_vec()))])),
        ];
        let mut pending = Pending::read(&batches).unwrap();
        // The second batch's bytes reach the step: the first two are taken.
        assert_eq!(pending.fold_through(), Some(2));
        // 6 and 9 are held again by the third: left for its fold.
        assert_eq!(pending.fold(2), vec![(5, Some(b"c".to_vec())), (7, None)]);
        assert_eq!(pending.fold_through(), Some(3));
        assert_eq!(pending.fold(3), vec![(6, None), (8, Some(b"d".to_vec())), (9, Some(b"e".to_vec()))]);
        assert_eq!(pending.fold_through(), None);
        // A step holds at most FOLD_STEP_BATCHES small batches.
        let small: Vec<_> = (1..=FOLD_STEP_BATCHES as i64 + 5).map(|seq| (seq, encode(&[(1, None)]))).collect();
        assert_eq!(Pending::read(&small).unwrap().fold_through(), Some(FOLD_STEP_BATCHES as i64));
        // More when the rest would still be past the bound less a step.
        let many: Vec<_> = (1..=FOLD_BATCHES + 76).map(|seq| (seq, encode(&[(1, None)]))).collect();
        let through = FOLD_BATCHES + 76 - (FOLD_BATCHES - FOLD_STEP_BATCHES as i64);
        assert_eq!(Pending::read(&many).unwrap().fold_through(), Some(through));
        let third = vec![0u8; (FOLD_BYTES / 3) as usize];
        let large: Vec<_> = (1..=4).map(|seq| (seq, encode(&[(seq as u128, Some(third.clone()))]))).collect();
        assert_eq!(Pending::read(&large).unwrap().fold_through(), Some(2), "the rest under 8 MB less a step");
    }

    /// Random batches, folded at random checkpoints: `state_windows` with
    /// the batches after the last fold applied over it is always the
    /// windows every batch leaves, and each fold writes at most the
    /// windows of the batches it takes.
    #[test]
    fn folds_of_the_oldest_batches_leave_the_state_every_batch_gives() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        for _ in 0..50 {
            let (mut table, mut truth) = (HashMap::new(), HashMap::new());
            let mut stored: Vec<(i64, Vec<u8>)> = Vec::new();
            let mut pending = Pending::default();
            for seq in 1..=300i64 {
                let windows: Vec<_> = (0..next(40))
                    .map(|_| {
                        let id = u128::from(next(60));
                        (id, (next(4) > 0).then(|| vec![seq as u8; next(3000) as usize]))
                    })
                    .collect();
                for (id, data) in &windows {
                    truth.insert(*id, data.clone());
                }
                let (count, last) = (stored.len() as i64, stored.last().map_or(seq - 1, |b| b.0));
                let batch = encode(&windows);
                stored.push((seq, batch.clone()));
                pending.wrote((count, last), batch.len(), windows);
                if next(5) == 0 {
                    // Now and then the copy is lost and read back.
                    if next(3) == 0 {
                        pending.forget();
                    }
                    if !pending.holds(stored.len() as i64, seq) {
                        pending = Pending::read(&stored).unwrap();
                    }
                    let upto = pending.fold_through().unwrap();
                    let taken: usize = stored.iter().filter(|b| b.0 <= upto).map(|b| b.1.len() / 20).sum();
                    let writes = pending.fold(upto);
                    assert!(writes.len() <= taken && writes.is_sorted_by_key(|w| w.0));
                    let left = stored.iter().filter(|b| b.0 > upto).map(|b| b.1.len() as i64).sum::<i64>();
                    assert!(left <= FOLD_BYTES - FOLD_STEP_BYTES, "{left} bytes left after a fold");
                    for (id, data) in writes {
                        match data {
                            Some(d) => table.insert(id, d),
                            None => table.remove(&id),
                        };
                    }
                    stored.retain(|b| b.0 > upto);
                }
                let got: HashMap<_, _> =
                    restored(table.clone().into_iter().collect(), &stored).unwrap().into_iter().collect();
                let want: HashMap<_, _> = truth.iter().filter_map(|(id, d)| Some((*id, d.clone()?))).collect();
                assert_eq!(got, want, "after batch {seq}");
            }
        }
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
        // A fresh writer knows nothing of batches pending, and stays so until none are.
        pending.wrote((3, 9), 20, vec![(1, Some(b"a".to_vec()))]);
        assert!(!pending.holds(4, 10));
        pending.wrote((4, 10), 20, vec![(1, Some(b"a".to_vec()))]);
        assert!(!pending.holds(5, 11));
        // With none pending, it knows them all, whatever it held.
        assert!(pending.holds(0, 11) && pending.fold_through().is_none());
        pending.wrote((0, 11), 24, vec![(1, Some(b"a".to_vec()))]);
        pending.wrote((1, 12), 20, vec![(2, None)]);
        assert!(pending.holds(2, 13));
        // A checkpoint that did not commit leaves the store a batch behind.
        pending.wrote((2, 13), 20, vec![(3, Some(b"c".to_vec()))]);
        assert!(!pending.holds(2, 13));
        pending.wrote((2, 13), 20, vec![(4, Some(b"d".to_vec()))]);
        assert!(!pending.holds(3, 14), "one that missed a batch forgets");
        assert_eq!(pending.fold_through(), None);
        // Read back, it holds them again, and a fold leaves it the later ones.
        let batches = [(12, encode(&[(1, Some(b"a".to_vec()))])), (13, encode(&[(2, None)]))];
        let mut pending = Pending::read(&batches).unwrap();
        assert!(pending.holds(2, 13));
        assert_eq!(pending.fold(12), vec![(1, Some(b"a".to_vec()))]);
        assert!(pending.holds(1, 13) && !pending.holds(2, 13));
    }

    #[test]
    fn a_checkpoint_folds_at_either_bound() {
        assert!(!folds((0, 0), 100));
        assert!(folds((FOLD_BATCHES - 1, 0), 0));
        assert!(!folds((FOLD_BATCHES - 2, FOLD_BYTES - 101), 100));
        assert!(folds((1, FOLD_BYTES - 100), 100));
    }
}

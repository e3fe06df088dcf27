//! Window timers: which windows' time comes when the watermark reaches a
//! point.
//!
//! Tumbling and hopping windows are aligned, so thousands of windows share
//! an end: the timers keep one entry per end, holding the windows that end
//! there, instead of one tree entry per window. The ends that are due are
//! taken out whole ([`Timers::take_due`]), so settling a window does not
//! look for it again; a window that goes before its time (a session merged
//! into another) is taken out of its end's list, which for sessions is
//! short.

use std::collections::BTreeMap;
use std::ops::Bound;

use crate::engine::WinId;

#[derive(Debug, Clone, Default)]
pub(crate) struct Timers {
    by_end: BTreeMap<i64, Vec<WinId>>,
    len: usize,
    /// Lists of ends taken out, emptied, for the next ends: a minute's list
    /// of 160,000 windows otherwise grows from nothing each minute, on
    /// fresh pages the kernel zeroes.
    spare: Vec<Vec<WinId>>,
}

/// At most this many emptied lists are kept.
const SPARE_LISTS: usize = 4;

impl Timers {
    pub(crate) fn insert(&mut self, end: i64, id: WinId) {
        let spare = &mut self.spare;
        self.by_end.entry(end).or_insert_with(|| spare.pop().unwrap_or_default()).push(id);
        self.len += 1;
    }

    /// Takes one window's timer out (a look through the windows of its end).
    pub(crate) fn remove(&mut self, end: i64, id: WinId) {
        let Some(ids) = self.by_end.get_mut(&end) else { return };
        if let Some(at) = ids.iter().position(|x| *x == id) {
            ids.swap_remove(at);
            self.len -= 1;
            if ids.is_empty() {
                self.by_end.remove(&end);
            }
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn clear(&mut self) {
        self.by_end.clear();
        self.len = 0;
    }

    /// Takes out every timer ending at or before `to`, adding them to
    /// `into` in order of end (within an end, as inserted).
    pub(crate) fn take_due(&mut self, to: i64, into: &mut Vec<(i64, WinId)>) {
        // Most calls (the watermark moved, no window's end reached) take
        // nothing: say so without splitting the tree.
        if self.by_end.first_key_value().is_none_or(|(end, _)| *end > to) {
            return;
        }
        let later = match to.checked_add(1) {
            Some(after) => self.by_end.split_off(&after),
            None => BTreeMap::new(),
        };
        for (end, mut ids) in std::mem::replace(&mut self.by_end, later) {
            self.len -= ids.len();
            into.extend(ids.drain(..).map(|id| (end, id)));
            if self.spare.len() < SPARE_LISTS {
                self.spare.push(ids);
            }
        }
    }

    /// The timers ending after `from` and at or before `to`, left in place,
    /// added to `into` (in order of end; within an end, as inserted).
    pub(crate) fn between(&self, from: i64, to: i64, into: &mut Vec<(i64, WinId)>) {
        if from >= to {
            return;
        }
        for (end, ids) in self.by_end.range((Bound::Excluded(from), Bound::Included(to))) {
            into.extend(ids.iter().map(|id| (*end, *id)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The timers against a set of (end, window) pairs, over a random mix
    /// of inserts, removals and takes.
    #[test]
    fn the_timers_hold_what_a_sorted_set_would() {
        let mut timers = Timers::default();
        let mut set = std::collections::BTreeSet::new();
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut floor = 0;
        for _ in 0..20_000 {
            let r = next();
            let end = floor + (r % 50) as i64 * 10;
            let id = u128::from((r >> 8) % 300);
            match r % 7 {
                0..=3 => {
                    if set.insert((end, id)) {
                        timers.insert(end, id);
                    }
                }
                4 => {
                    set.remove(&(end, id));
                    timers.remove(end, id);
                }
                5 => {
                    let mut between = Vec::new();
                    timers.between(floor, end, &mut between);
                    between.sort_unstable();
                    let want: Vec<(i64, u128)> = set.iter().copied().filter(|(e, _)| *e > floor && *e <= end).collect();
                    assert_eq!(between, want);
                }
                _ => {
                    floor = end - 10;
                    let mut due = Vec::new();
                    timers.take_due(floor, &mut due);
                    due.sort_unstable();
                    let want: Vec<(i64, u128)> = set.iter().copied().take_while(|(e, _)| *e <= floor).collect();
                    set.retain(|(e, _)| *e > floor);
                    assert_eq!(due, want);
                }
            }
            assert_eq!(timers.len(), set.len());
        }
        let mut all = Vec::new();
        timers.take_due(i64::MAX, &mut all);
        all.sort_unstable();
        assert_eq!(all, set.iter().copied().collect::<Vec<_>>());
        assert_eq!(timers.len(), 0);
    }
}

//! A map from 128-bit hashes (window ids, event ids) to values, built so the
//! engine can prefetch an entry before it needs it.
//!
//! Keys are already uniform hashes, so the table is open addressing with
//! linear probing and a key's home slot is its low bits. The engine calls
//! [`HashedTable::prefetch`] as soon as it knows a key (an event's id and its
//! window's id, right after reading the event's fields) and does the rest of
//! the event's work while the slot's cache lines arrive: with a million
//! remembered ids or tens of thousands of windows, each lookup is otherwise a
//! cache miss on every event.
//!
//! Invariants: `keys` and `values` have the same power-of-two length; key 0
//! marks an empty slot (a real key of 0 is stored as 1, which merges two keys
//! with probability 2^-128, as any two hashes may); every key sits in the run
//! of occupied slots that starts at its home slot; at most 7/10 of the slots
//! are occupied, so every run ends; an empty slot holds `V::default()`.
//!
//! A table can have its next, doubled slots made ahead ([`Spare`]): the
//! first write to new memory is the kernel zeroing its pages, which for a
//! table of millions of slots stalls the thread that doubles it for tens
//! of milliseconds. [`HashedTable::wants_spare`] says when a table nears
//! its doubling; the caller makes the [`Spare`] on another thread and
//! gives it back ([`HashedTable::give_spare`]), and the doubling moves the
//! entries into it. A spare only changes where memory comes from, never
//! what the table holds.

#[derive(Debug, Clone, Default)]
pub(crate) struct HashedTable<V> {
    keys: Vec<u128>,
    values: Vec<V>,
    len: usize,
    /// Keys written or removed since the last `take_touched`, while tracking
    /// (`retain` does not record what it drops).
    touched: Option<Vec<u128>>,
    /// The next slots, made ahead, and whether they were asked for since
    /// the table last doubled or swept.
    spare: Kept<V>,
}

const MIN_SLOTS: usize = 64;

/// Below this many slots a table doubles without a spare: the memory is
/// small enough to zero at once.
pub(crate) const SPARE_MIN_SLOTS: usize = 1 << 15;

/// A table's next slots, every page of them written already (see the
/// module's comment). Made on any thread.
#[derive(Debug)]
pub(crate) struct Spare<V> {
    keys: Vec<u128>,
    values: Vec<V>,
}

impl<V: Default> Spare<V> {
    /// `slots` empty slots, each written once, so that no later write to
    /// them waits for the kernel.
    pub(crate) fn make(slots: usize) -> Spare<V> {
        // Not `vec![0; slots]`: that may take untouched zeroed pages from the
        // system, which the kernel would zero at the doubling's first write.
        #[expect(clippy::slow_vector_initialization, reason = "the write is the point: it touches every page here")]
        let mut keys = Vec::with_capacity(slots);
        keys.resize(slots, 0);
        let mut values = Vec::with_capacity(slots);
        values.resize_with(slots, V::default);
        Spare { keys, values }
    }
}

/// A table's spare and whether it was asked for: not copied with the table.
#[derive(Debug)]
struct Kept<V> {
    spare: Option<Spare<V>>,
    asked: bool,
    /// Doublings that moved into a spare.
    used: u32,
}

impl<V> Default for Kept<V> {
    fn default() -> Self {
        Kept { spare: None, asked: false, used: 0 }
    }
}

impl<V> Clone for Kept<V> {
    fn clone(&self) -> Self {
        Kept::default()
    }
}

impl<V: Default> HashedTable<V> {
    pub(crate) fn track(&mut self) {
        self.touched.get_or_insert_with(Vec::new);
    }

    pub(crate) fn is_tracking(&self) -> bool {
        self.touched.is_some()
    }

    pub(crate) fn take_touched(&mut self) -> Vec<u128> {
        self.touched.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// The keys touched since the last take, each once, in the order of
    /// their home slots (then by key): looked up in this order, a million
    /// keys walk the table's memory forward instead of missing the cache
    /// on each.
    pub(crate) fn take_touched_in_slot_order(&mut self) -> Vec<u128> {
        let mut keys = self.take_touched();
        // Rotated, a key's home slot (its low bits) leads its value, so a plain sort orders by slot.
        let bits = self.keys.len().max(1).trailing_zeros();
        keys.iter_mut().for_each(|k| *k = k.rotate_right(bits));
        keys.sort_unstable();
        keys.dedup();
        keys.iter_mut().for_each(|k| *k = k.rotate_left(bits));
        keys
    }

    fn touch(&mut self, key: u128) {
        if let Some(touched) = &mut self.touched {
            touched.push(key);
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Slots allocated (memory is slots times the key and value sizes).
    pub(crate) fn slots(&self) -> usize {
        self.keys.len()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (u128, &V)> {
        self.keys.iter().zip(&self.values).filter(|(k, _)| **k != 0).map(|(k, v)| (*k, v))
    }

    /// Starts loading the cache lines a lookup of `key` will touch.
    pub(crate) fn prefetch(&self, key: u128) {
        if self.keys.is_empty() {
            return;
        }
        let slot = self.home(stored(key));
        crate::prefetch::read(&self.keys[slot]);
        crate::prefetch::read_whole(&self.values[slot]);
    }

    pub(crate) fn get(&self, key: u128) -> Option<&V> {
        self.find(stored(key)).ok().map(|slot| &self.values[slot])
    }

    pub(crate) fn get_mut(&mut self, key: u128) -> Option<&mut V> {
        self.touch(key);
        self.find(stored(key)).ok().map(|slot| &mut self.values[slot])
    }

    /// Makes room for `more` keys beyond those held, at once, so that
    /// inserting them does not grow the table step by step.
    pub(crate) fn reserve(&mut self, more: usize) {
        let need = self.len.saturating_add(more);
        if need * 10 <= self.keys.len() * 7 {
            return;
        }
        let mut slots = self.keys.len().max(MIN_SLOTS);
        while need.saturating_mul(10) > slots.saturating_mul(7) && slots < usize::MAX / 4 {
            slots *= 2;
        }
        self.rehash(slots);
    }

    /// True when one more key would make the table grow.
    pub(crate) fn is_full(&self) -> bool {
        (self.len + 1) * 10 > self.keys.len() * 7
    }

    /// The size of the spare this table will soon want, once: when it is
    /// 6/10 full, has at least [`SPARE_MIN_SLOTS`], and at least 4/10 of its
    /// slots hold entries `live` keeps (a sweep at 7/10 that leaves less
    /// than half does not double). Asked again after it doubles or sweeps.
    pub(crate) fn wants_spare(&mut self, mut live: impl FnMut(&V) -> bool) -> Option<usize> {
        let slots = self.keys.len();
        if self.spare.asked || self.len * 10 < slots * 6 || slots < SPARE_MIN_SLOTS {
            return None;
        }
        self.spare.asked = true;
        let live = self.keys.iter().zip(&self.values).filter(|(k, v)| **k != 0 && live(v)).count();
        (live * 10 >= slots * 4).then_some(slots * 2)
    }

    /// Keeps `spare` for the next doubling; drops one of another size (the
    /// table doubled before it came).
    pub(crate) fn give_spare(&mut self, spare: Spare<V>) {
        if spare.keys.len() == self.keys.len() * 2 {
            self.spare.spare = Some(spare);
        }
    }

    /// Doublings that moved into a spare.
    pub(crate) fn spares_used(&self) -> u32 {
        self.spare.used
    }

    /// Doubles the slots when at least half are taken.
    pub(crate) fn grow_if_half_full(&mut self) {
        if self.len * 2 >= self.keys.len() {
            self.grow();
        }
    }

    /// The value for `key`, made by `make` when there is none; true when it was made.
    pub(crate) fn get_or_insert_with(&mut self, key: u128, make: impl FnOnce() -> V) -> (&mut V, bool) {
        if self.is_full() {
            self.grow();
        }
        self.touch(key);
        let key = stored(key);
        match self.find(key) {
            Ok(slot) => (&mut self.values[slot], false),
            Err(slot) => {
                self.keys[slot] = key;
                self.values[slot] = make();
                self.len += 1;
                (&mut self.values[slot], true)
            }
        }
    }

    /// Stores `value` for `key`, replacing any value it had.
    pub(crate) fn insert(&mut self, key: u128, value: V) {
        let mut value = Some(value);
        let (slot, made) = self.get_or_insert_with(key, || value.take().unwrap_or_default());
        if !made {
            *slot = value.take().unwrap_or_default();
        }
    }

    pub(crate) fn remove(&mut self, key: u128) -> Option<V> {
        self.touch(key);
        let slot = self.find(stored(key)).ok()?;
        Some(self.delete(slot))
    }

    /// Keeps only the entries for which `keep` is true, in one pass.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&V) -> bool) {
        if self.len == 0 {
            return;
        }
        let mask = self.mask();
        // Scan from an empty slot, so that no run wraps past the scan's start
        // and every entry a deletion moves back is one not yet scanned.
        let Some(start) = self.keys.iter().position(|&k| k == 0) else { return };
        let mut step = 1;
        while step < self.keys.len() {
            let slot = (start + step) & mask;
            if self.keys[slot] != 0 && !keep(&self.values[slot]) {
                // The slot may now hold a later entry of its run: look at it again.
                self.delete(slot);
            } else {
                step += 1;
            }
        }
        self.spare.asked = false;
        if self.len * 2 < self.keys.len() {
            self.spare.spare = None;
        }
    }

    fn mask(&self) -> usize {
        self.keys.len().wrapping_sub(1)
    }

    fn home(&self, key: u128) -> usize {
        key as usize & self.mask()
    }

    /// `Ok(slot)` holding `key`, or `Err(slot)`: the empty slot ending its run.
    fn find(&self, key: u128) -> Result<usize, usize> {
        if self.keys.is_empty() {
            return Err(0);
        }
        let mask = self.mask();
        let mut slot = self.home(key);
        loop {
            match self.keys[slot] {
                0 => return Err(slot),
                k if k == key => return Ok(slot),
                _ => slot = (slot + 1) & mask,
            }
        }
    }

    /// Empties `hole` and moves later entries of its run back so each stays
    /// reachable from its home slot (backward-shift deletion).
    fn delete(&mut self, mut hole: usize) -> V {
        let removed = std::mem::take(&mut self.values[hole]);
        let mask = self.mask();
        let mut next = (hole + 1) & mask;
        while self.keys[next] != 0 {
            let home = self.home(self.keys[next]);
            // The entry may move to `hole` when `hole` lies between its home and it.
            if (next.wrapping_sub(home) & mask) >= (next.wrapping_sub(hole) & mask) {
                self.keys[hole] = self.keys[next];
                // `hole` holds an empty value: a swap moves the entry back and
                // leaves the empty value behind, with no drop or second copy.
                self.values.swap(hole, next);
                hole = next;
            }
            next = (next + 1) & mask;
        }
        self.keys[hole] = 0;
        self.len -= 1;
        removed
    }

    fn grow(&mut self) {
        self.rehash((self.keys.len() * 2).max(MIN_SLOTS));
    }

    /// Moves every entry into a table of `slots` slots (a power of two that holds them).
    fn rehash(&mut self, slots: usize) {
        self.spare.asked = false;
        let (keys, mut values) = match self.spare.spare.take() {
            Some(spare) if spare.keys.len() == slots => {
                self.spare.used += 1;
                (std::mem::replace(&mut self.keys, spare.keys), std::mem::replace(&mut self.values, spare.values))
            }
            _ => {
                let values = std::mem::take(&mut self.values);
                self.values.resize_with(slots, V::default);
                (std::mem::replace(&mut self.keys, vec![0; slots]), values)
            }
        };
        for (key, value) in keys.into_iter().zip(values.drain(..)).filter(|(k, _)| *k != 0) {
            let Err(slot) = self.find(key) else { continue };
            self.keys[slot] = key;
            self.values[slot] = value;
        }
    }
}

fn stored(key: u128) -> u128 {
    key.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_stay_whole_through_growth_removal_and_sweeps() {
        let mut table = HashedTable::<i64>::default();
        // Keys that share home slots at the table's end, so runs form and wrap.
        let keys: Vec<u128> = (0..3000u128).map(|i| (i << 64) | (u64::MAX - (i % 7) as u64) as u128).collect();
        for (n, key) in keys.iter().enumerate() {
            let (value, made) = table.get_or_insert_with(*key, || n as i64 % 10);
            assert!(made && *value == n as i64 % 10);
        }
        assert_eq!(table.len(), 3000);
        for (n, key) in keys.iter().enumerate() {
            assert_eq!(table.get(*key), Some(&(n as i64 % 10)));
        }
        table.retain(|v| *v > 4);
        assert_eq!(table.len(), 1500);
        for (n, key) in keys.iter().enumerate() {
            assert_eq!(table.get(*key).is_some(), n as i64 % 10 > 4, "key {n}");
        }
        for key in keys.iter().step_by(2) {
            table.remove(*key);
        }
        for (n, key) in keys.iter().enumerate() {
            assert_eq!(table.get(*key).is_some(), n % 2 == 1 && n as i64 % 10 > 4, "key {n}");
        }
        assert_eq!(table.len(), table.iter().count());
        table.retain(|_| false);
        assert_eq!((table.len(), table.iter().count()), (0, 0));
    }

    #[test]
    fn touched_keys_come_once_each_in_the_order_of_their_home_slots() {
        let mut table = HashedTable::<i64>::default();
        table.track();
        // Keys whose high bits disagree with their low bits' order, some touched twice.
        let keys: Vec<u128> =
            (0..5000u128).map(|i| ((5000 - i) << 100) | i.wrapping_mul(0x9e37_79b9_7f4a_7c15)).collect();
        for (n, key) in keys.iter().enumerate() {
            table.insert(*key, n as i64);
        }
        for key in keys.iter().step_by(3) {
            table.insert(*key, -1);
        }
        let taken = table.take_touched_in_slot_order();
        let mut expected = keys.clone();
        expected.sort_unstable_by_key(|k| (table.home(*k), *k));
        assert_eq!(taken, expected);
        assert!(table.take_touched_in_slot_order().is_empty(), "taken once");
    }

    #[test]
    fn reserving_makes_room_at_once_and_keeps_every_entry() {
        let mut table = HashedTable::<i64>::default();
        for n in 0..100i64 {
            table.insert((n as u128) << 70 | 3, n);
        }
        table.reserve(10_000);
        let slots = table.slots();
        assert!(slots.is_power_of_two() && (100 + 10_000) * 10 <= slots * 7, "{slots} slots");
        for n in 100..10_100i64 {
            table.insert((n as u128) << 70 | 3, n);
        }
        assert_eq!((table.slots(), table.len()), (slots, 10_100), "inserting what was reserved grew the table");
        for n in 0..10_100i64 {
            assert_eq!(table.get((n as u128) << 70 | 3), Some(&n));
        }
        table.reserve(1);
        assert_eq!(table.slots(), slots, "room already there");
    }

    #[test]
    fn a_spare_made_ahead_takes_the_doubling_and_every_entry_stays() {
        let mut table = HashedTable::<i64>::default();
        table.reserve(SPARE_MIN_SLOTS / 2);
        assert_eq!(table.slots(), SPARE_MIN_SLOTS);
        let key = |n: i64| (n as u128).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835) | 1;
        let mut asked = Vec::new();
        for n in 0..(SPARE_MIN_SLOTS as i64) {
            table.insert(key(n), n);
            if let Some(slots) = table.wants_spare(|_| true) {
                asked.push((table.len(), slots));
                // One of the wrong size first: a table that doubled meanwhile drops it.
                table.give_spare(Spare::make(slots / 2));
                table.give_spare(Spare::make(slots));
            }
        }
        // Asked once, at 6/10 (the doubled table holds these under 6/10).
        let first = (SPARE_MIN_SLOTS * 6).div_ceil(10);
        assert_eq!(asked, vec![(first, SPARE_MIN_SLOTS * 2)]);
        assert_eq!((table.slots(), table.spares_used()), (SPARE_MIN_SLOTS * 2, 1));
        for n in 0..(SPARE_MIN_SLOTS as i64) {
            assert_eq!(table.get(key(n)), Some(&n), "entry {n}");
        }
        assert_eq!(table.iter().count(), SPARE_MIN_SLOTS);
    }

    #[test]
    fn a_table_a_sweep_would_empty_asks_for_no_spare_until_it_swept() {
        let mut table = HashedTable::<i64>::default();
        table.reserve(SPARE_MIN_SLOTS / 2);
        let live = |v: &i64| *v % 4 == 0;
        let mut n = 0i64;
        while table.len() * 10 < SPARE_MIN_SLOTS * 6 {
            table.insert(n as u128 + 1, n);
            n += 1;
        }
        // A quarter of the entries live: a sweep at 7/10 would leave a table under half full.
        assert_eq!(table.wants_spare(live), None);
        assert_eq!(table.wants_spare(|_| true), None, "asked once a cycle");
        table.retain(live);
        assert_eq!(table.slots(), SPARE_MIN_SLOTS);
        while table.len() * 10 < SPARE_MIN_SLOTS * 6 {
            table.insert(n as u128 + 1, 4 * n);
            n += 1;
        }
        assert_eq!(table.wants_spare(live), Some(SPARE_MIN_SLOTS * 2), "asked again after the sweep");
        table.give_spare(Spare::make(SPARE_MIN_SLOTS * 2));
        // A sweep that leaves it under half full drops the spare.
        table.retain(|_| false);
        while !table.is_full() {
            table.insert(n as u128 + 1, n);
            n += 1;
        }
        table.insert(n as u128 + 1, n);
        assert_eq!((table.slots(), table.spares_used()), (SPARE_MIN_SLOTS * 2, 0));
    }

    #[test]
    fn key_zero_and_replacing() {
        let mut table = HashedTable::<i64>::default();
        assert_eq!(table.get(0), None);
        table.insert(0, 5);
        assert_eq!(table.get(1), Some(&5));
        table.insert(1, 6);
        assert_eq!((table.get(0), table.len()), (Some(&6), 1));
        if let Some(v) = table.get_mut(0) {
            *v += 1;
        }
        assert_eq!(table.remove(0), Some(7));
        assert_eq!(table.remove(0), None);
    }
}

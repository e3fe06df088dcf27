//! The order a close's rows go out in: by window end, then window start
//! (none first), then the key's bytes, then the order they were decided in.
//!
//! A close can hold tens of thousands of rows (a minute of 200,000
//! accounts), and a comparison sort cost about 900 instructions a row. So a
//! large close is sorted by radix over a fixed 32-byte image of each row
//! (end, start, the key's first 16 bytes), with no pass for the bytes every
//! row shares; only rows whose images tie are then ordered by their whole
//! keys.
//! Invariant: [`sorted`] gives the order the comparison gives, for any rows.

use std::cmp::Ordering;

/// Below this many rows the comparison sort is as fast.
const RADIX_FROM: usize = 256;

/// One row's image: four words compared in turn, most significant first,
/// and its position.
#[derive(Debug, Clone, Copy)]
struct Image {
    words: [u64; 4],
    at: u32,
}

/// The arrays a sort works in, kept from one close to the next: a close of
/// 160,000 rows otherwise asks the kernel for fresh, zeroed pages for them
/// each time (BENCHMARKS.md, "A close's arrays kept").
#[derive(Debug, Default)]
pub(crate) struct Order {
    images: Vec<Image>,
    spare: Vec<Image>,
    at: Vec<u32>,
}

/// The positions of `n` rows in the order they go out; `row(i)` is the
/// `i`-th row's window end, start and key.
#[cfg(test)]
pub(crate) fn sorted<'k>(n: usize, row: impl Fn(usize) -> (i64, Option<i64>, &'k [u8])) -> Vec<u32> {
    Order::default().sorted(n, row).to_vec()
}

impl Order {
    /// The positions of `n` rows in the order they go out; `row(i)` is the
    /// `i`-th row's window end, start and key.
    pub(crate) fn sorted<'k>(&mut self, n: usize, row: impl Fn(usize) -> (i64, Option<i64>, &'k [u8])) -> &[u32] {
        let starts = (0..n).map(|i| row(i).1.is_some());
        let mixed = starts.clone().any(|s| s) && starts.clone().any(|s| !s);
        self.at.clear();
        if n < RADIX_FROM || mixed {
            // A start that is none sorts first; the image spells it as 0, which
            // a start of i64::MIN shares: rows of both kinds go by comparison.
            self.at.extend(by_comparison(n, &row));
            return &self.at;
        }
        let images = &mut self.images;
        images.clear();
        images.extend((0..n).map(|i| {
            let (end, start, key) = row(i);
            let prefix = key_prefix(key);
            let words = [flip(end), start.map_or(0, flip), (prefix >> 64) as u64, prefix as u64];
            Image { words, at: i as u32 }
        }));
        radix(images, &mut self.spare);
        // Rows whose images tie go by their whole keys, then by position (the
        // radix sort is stable, so a stable sort by key keeps that).
        let mut from = 0;
        while from < images.len() {
            let mut to = from + 1;
            while to < images.len() && images[to].words == images[from].words {
                to += 1;
            }
            if to - from > 1 {
                images[from..to].sort_by(|a, b| row(a.at as usize).2.cmp(row(b.at as usize).2));
            }
            from = to;
        }
        self.at.extend(images.iter().map(|image| image.at));
        &self.at
    }
}

/// The comparison the radix sort must agree with.
fn by_comparison<'k>(n: usize, row: &impl Fn(usize) -> (i64, Option<i64>, &'k [u8])) -> Vec<u32> {
    let mut order: Vec<(i64, Option<i64>, u128, u32)> = (0..n)
        .map(|i| {
            let (end, start, key) = row(i);
            (end, start, key_prefix(key), i as u32)
        })
        .collect();
    order.sort_unstable_by(|a, b| compare(a, b, row));
    order.into_iter().map(|(_, _, _, at)| at).collect()
}

fn compare<'k>(
    a: &(i64, Option<i64>, u128, u32),
    b: &(i64, Option<i64>, u128, u32),
    row: &impl Fn(usize) -> (i64, Option<i64>, &'k [u8]),
) -> Ordering {
    (a.0, a.1, a.2).cmp(&(b.0, b.1, b.2)).then_with(|| row(a.3 as usize).2.cmp(row(b.3 as usize).2)).then(a.3.cmp(&b.3))
}

/// A signed time as an unsigned word in the same order.
fn flip(t: i64) -> u64 {
    (t as u64) ^ (1 << 63)
}

/// A key's first 16 bytes as a big-endian number (zeros past its end): keys
/// ordered by prefix, then by whole bytes, are ordered as their bytes are.
fn key_prefix(key: &[u8]) -> u128 {
    let mut head = [0u8; 16];
    let n = key.len().min(16);
    head[..n].copy_from_slice(&key[..n]);
    u128::from_be_bytes(head)
}

/// A stable least-significant-byte-first radix sort of the images by their
/// words. A byte every image shares takes no pass: one pass over the images
/// finds the bits that vary, and each byte holding one is counted, then
/// scattered (the keys of a close mostly differ in a few bytes).
fn radix(images: &mut Vec<Image>, spare: &mut Vec<Image>) {
    let Some(first) = images.first().map(|image| image.words) else { return };
    let mut varies = [0u64; 4];
    for image in images.iter() {
        for (v, (w, f)) in varies.iter_mut().zip(image.words.iter().zip(&first)) {
            *v |= w ^ f;
        }
    }
    spare.clear();
    spare.extend_from_slice(images);
    for byte in (0..32).filter(|&byte| (varies[3 - byte / 8] >> ((byte % 8) * 8)) & 0xff != 0) {
        let mut next = [0usize; 256];
        for image in images.iter() {
            next[digit(image, byte)] += 1;
        }
        let mut sum = 0;
        for slot in next.iter_mut() {
            let count = *slot;
            *slot = sum;
            sum += count;
        }
        for image in images.iter() {
            let d = digit(image, byte);
            spare[next[d]] = *image;
            next[d] += 1;
        }
        std::mem::swap(images, spare);
    }
}

/// Byte `byte` of an image, counted from the least significant (byte 0 is
/// the low byte of the last word).
#[inline(always)]
fn digit(image: &Image, byte: usize) -> usize {
    ((image.words[3 - byte / 8] >> ((byte % 8) * 8)) & 0xff) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rows() -> impl Strategy<Value = Vec<(i64, Option<i64>, Vec<u8>)>> {
        // Few ends and starts, keys sharing long prefixes: ties at every level.
        let key = prop::collection::vec(prop::sample::select(vec![0u8, 1, b'a', b'b', 0xff]), 0..24);
        let some = prop::collection::vec((-2i64..3, prop::option::of(-2i64..3), key.clone()), 0..1200);
        let edge = prop::collection::vec(
            (
                prop::sample::select(vec![i64::MIN, -1, 0, i64::MAX]),
                prop::option::of(prop::sample::select(vec![i64::MIN, 0, i64::MAX])),
                key,
            ),
            0..600,
        );
        prop_oneof![
            some.clone(),
            some.prop_map(|r| r.into_iter().map(|(e, s, k)| (e, s.or(Some(0)), k)).collect()),
            edge
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// The radix order is the comparison's, for any rows: mixed starts,
        /// extreme times, keys equal in their first 16 bytes or whole.
        #[test]
        fn the_radix_order_is_the_comparisons(rows in rows()) {
            let row = |i: usize| (rows[i].0, rows[i].1, &rows[i].2[..]);
            prop_assert_eq!(sorted(rows.len(), row), by_comparison(rows.len(), &row));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(50))]
        /// One [`Order`] kept across closes of other sizes orders each as
        /// the comparison does: nothing of an earlier close stays in its
        /// arrays.
        #[test]
        fn an_order_kept_across_closes_orders_each_as_the_comparison(closes in prop::collection::vec(rows(), 1..6)) {
            let mut order = Order::default();
            for rows in &closes {
                let row = |i: usize| (rows[i].0, rows[i].1, &rows[i].2[..]);
                prop_assert_eq!(order.sorted(rows.len(), row).to_vec(), by_comparison(rows.len(), &row));
            }
        }
    }

    /// A close past the threshold comes out in the keys' order.
    #[test]
    fn a_large_close_is_sorted_by_radix_and_in_order() {
        let keys: Vec<Vec<u8>> =
            (0..5_000u32).map(|i| format!("acct-{:06}", (i * 7919) % 5_000).into_bytes()).collect();
        let row = |i: usize| (60_000, Some(0), &keys[i][..]);
        let order = sorted(keys.len(), row);
        assert_eq!(order, by_comparison(keys.len(), &row));
        assert!(order.windows(2).all(|w| keys[w[0] as usize] < keys[w[1] as usize]));
    }

    proptest! {
        /// Keys ordered by their prefixes, and whole only when those are
        /// equal, order as the keys do: short keys, keys with zero bytes,
        /// keys that share their first 16 bytes.
        #[test]
        fn keys_ordered_by_prefix_then_whole_order_as_the_bytes_do(
            keys in proptest::collection::vec(
                (proptest::collection::vec(prop_oneof![Just(0u8), Just(b'a'), any::<u8>()], 0..24), any::<bool>()),
                2..40,
            ),
        ) {
            let shared = b"0123456789abcdef";
            let keys: Vec<Vec<u8>> =
                keys.into_iter().map(|(k, long)| if long { [&shared[..], &k[..]].concat() } else { k }).collect();
            let mut by_prefix = keys.clone();
            by_prefix.sort_by(|a, b| key_prefix(a).cmp(&key_prefix(b)).then_with(|| a.cmp(b)));
            let mut by_bytes = keys;
            by_bytes.sort();
            prop_assert_eq!(by_prefix, by_bytes);
        }
    }
}

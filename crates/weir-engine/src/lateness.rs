//! How late events arrive: a histogram of how far behind the watermark
//! each event's time was when it arrived (0 for an event at or ahead of
//! it), over the processing-clock period it covers. Buckets grow by a
//! quarter of a power of two, so a quantile is known within 25%, and the
//! histogram is a few hundred bytes whatever the input's length. Read by
//! the lateness advisor (`GET .../advice`, `weir advise`).

use serde::{Deserialize, Serialize};

/// The largest power of two a bucket starts at (2^45 ms is about 1,100 years).
const TOP: u32 = 45;
/// 0, 1, 2 and 3 ms each, then four buckets for each power of two from 4 to 2^TOP.
const BUCKETS: usize = 4 + 4 * (TOP as usize - 1);

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lateness {
    /// Events by bucket (empty until the first).
    counts: Vec<u64>,
    /// The processing clock at the first and the last event recorded.
    pub since_ms: Option<i64>,
    pub until_ms: Option<i64>,
}

/// The bucket of `ms` behind the watermark.
fn bucket(ms: i64) -> usize {
    if ms < 4 {
        return ms.max(0) as usize;
    }
    let x = ms as u64;
    let b = 63 - x.leading_zeros();
    if b > TOP {
        return BUCKETS - 1;
    }
    let sub = ((x >> (b - 2)) & 3) as usize;
    4 + 4 * (b as usize - 2) + sub
}

/// The largest lateness a bucket holds (ms).
fn upper(i: usize) -> i64 {
    if i < 4 {
        return i as i64;
    }
    let (b, sub) = ((i - 4) / 4 + 2, (i - 4) % 4);
    let base = 1i64 << b;
    base + (sub as i64 + 1) * (base >> 2) - 1
}

impl Lateness {
    /// One event, `behind_ms` behind the watermark, at processing time `now`.
    pub fn record(&mut self, behind_ms: i64, now: Option<i64>) {
        if self.counts.is_empty() {
            self.counts = vec![0; BUCKETS];
        }
        self.counts[bucket(behind_ms)] += 1;
        if let Some(now) = now {
            self.since_ms = Some(self.since_ms.map_or(now, |s| s.min(now)));
            self.until_ms = Some(self.until_ms.map_or(now, |u| u.max(now)));
        }
    }

    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// About how many events were more than `ms` behind the watermark:
    /// exact at a bucket's edge, spread evenly within the bucket `ms` falls in.
    pub fn over(&self, ms: i64) -> u64 {
        let mut n = 0.0;
        for (i, &count) in self.counts.iter().enumerate() {
            let (low, high) = (if i == 0 { i64::MIN } else { upper(i - 1) + 1 }, upper(i));
            if low > ms {
                n += count as f64;
            } else if high > ms {
                n += count as f64 * (high - ms) as f64 / (high - low.max(0) + 1) as f64;
            }
        }
        n.round() as u64
    }

    /// The smallest lateness (a bucket's top) that at most `rate` of the events exceed.
    pub fn bound_for(&self, rate: f64) -> i64 {
        let total = self.total();
        let allowed = (total as f64 * rate).floor() as u64;
        let mut above = total;
        for (i, n) in self.counts.iter().enumerate() {
            above -= n;
            if above <= allowed {
                return upper(i);
            }
        }
        0
    }

    /// Adds another engine's histogram (the engines of several partitions).
    pub fn add(&mut self, other: &Lateness) {
        if other.counts.is_empty() {
            return;
        }
        if self.counts.is_empty() {
            self.counts = vec![0; BUCKETS];
        }
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.since_ms = match (self.since_ms, other.since_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.until_ms = match (self.until_ms, other.until_ms) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_hold_what_their_bounds_say() {
        let mut last = -1;
        for i in 0..BUCKETS {
            assert!(upper(i) > last, "bucket {i} ends at {} after {last}", upper(i));
            last = upper(i);
        }
        for ms in [0i64, 1, 2, 3, 4, 5, 6, 7, 8, 9, 100, 1000, 1023, 1024, 1025, 65_537, 86_400_000, 1 << 44] {
            let i = bucket(ms);
            assert!(ms <= upper(i), "{ms} in bucket {i} ending {}", upper(i));
            assert!(i == 0 || ms > upper(i - 1), "{ms} belongs below bucket {i}");
            assert!(upper(i) <= ms + ms / 4 + 1, "{ms}: bucket {i} too wide ({})", upper(i));
        }
    }

    #[test]
    fn a_bound_leaves_at_most_the_rate_above_it() {
        let mut h = Lateness::default();
        for ms in 0..10_000 {
            h.record(ms, Some(ms));
        }
        for rate in [0.01, 0.001, 0.0001] {
            let bound = h.bound_for(rate);
            let above = (0..10_000).filter(|&ms| ms > bound).count() as f64;
            assert!(above <= rate * 10_000.0, "{rate}: {above} above {bound}");
            assert!(bound as f64 <= 10_000.0 * (1.0 - rate) * 1.25 + 1.0, "{rate}: {bound} is too high");
        }
        assert_eq!((h.since_ms, h.until_ms), (Some(0), Some(9_999)));
    }
}

//! Aggregate state per window (SPEC.md section 3.2): exact decimals, results
//! that do not depend on arrival order, and merging for sessions.

use std::cmp::Ordering;

use hashbrown::HashSet;
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use weir_contract::AggFn;

/// What one event gives one aggregate, decided before any window changes.
#[derive(Debug, Clone)]
pub(crate) enum Contrib {
    /// The aggregate's `where` is false, or the field is missing or null.
    Skip,
    /// `count`: one more.
    One,
    Num(Decimal),
    /// `count_distinct`: the value's canonical hash.
    Distinct(u128),
    /// `first` / `last`: the value's JSON text and canonical hash.
    Pick {
        json: Box<str>,
        hash: u64,
    },
}

/// The value `first` / `last` keep, with what orders it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Pick {
    pub time: i64,
    pub id: Option<String>,
    pub hash: u64,
    pub json: Box<str>,
}

impl Pick {
    /// Event time, then event id as text, then the value itself: a total
    /// order, so the pick never depends on arrival order.
    fn order(&self, other: &Pick) -> Ordering {
        self.time.cmp(&other.time).then_with(|| self.id.cmp(&other.id)).then_with(|| self.hash.cmp(&other.hash))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum AggState {
    Count(u64),
    /// Sum and avg: the exact sum and how many values; `overflow` once the
    /// sum left the 28-digit range (the value is then null).
    Sum {
        sum: Decimal,
        n: u64,
        overflow: bool,
    },
    Min(Option<Decimal>),
    Max(Option<Decimal>),
    // Boxed, so that the common states stay small enough to live inside
    // their window (see `Window::aggs`).
    Distinct(Box<DistinctSet>),
    First(Option<Box<Pick>>),
    Last(Option<Box<Pick>>),
}

/// Canonical hashes of the distinct values; serialised sorted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct DistinctSet(pub HashSet<u128>);

impl Serialize for DistinctSet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut values: Vec<u128> = self.0.iter().copied().collect();
        values.sort_unstable();
        values.serialize(s)
    }
}

impl<'de> Deserialize<'de> for DistinctSet {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(DistinctSet(Vec::<u128>::deserialize(d)?.into_iter().collect()))
    }
}

/// An aggregate's value in a row.
#[derive(Debug, Clone, PartialEq)]
pub enum OutValue {
    Null,
    Int(u64),
    Dec(Decimal),
    /// A JSON value as the event held it (`first`, `last`).
    Json(Box<str>),
}

impl Contrib {
    /// What a correction must take back later (count, sum and avg only):
    /// `None` when the event gave this aggregate nothing.
    pub(crate) fn kept(&self) -> Option<Decimal> {
        match self {
            Contrib::One => Some(Decimal::ONE),
            Contrib::Num(d) => Some(*d),
            _ => None,
        }
    }
}

impl AggState {
    pub(crate) fn new(func: AggFn) -> AggState {
        match func {
            AggFn::Count => AggState::Count(0),
            AggFn::Sum | AggFn::Avg => AggState::Sum { sum: Decimal::ZERO, n: 0, overflow: false },
            AggFn::Min => AggState::Min(None),
            AggFn::Max => AggState::Max(None),
            AggFn::CountDistinct => AggState::Distinct(Box::default()),
            AggFn::First => AggState::First(None),
            AggFn::Last => AggState::Last(None),
        }
    }

    pub(crate) fn add(&mut self, contrib: &Contrib, time: i64, id: Option<&str>) {
        match (self, contrib) {
            (_, Contrib::Skip) => {}
            (AggState::Count(n), _) => *n += 1,
            (AggState::Sum { sum, n, overflow }, Contrib::Num(v)) => {
                match sum.checked_add(*v) {
                    Some(s) => *sum = s,
                    None => *overflow = true,
                }
                *n += 1;
            }
            (AggState::Min(m), Contrib::Num(v)) => *m = Some(m.map_or(*v, |m| m.min(*v))),
            (AggState::Max(m), Contrib::Num(v)) => *m = Some(m.map_or(*v, |m| m.max(*v))),
            (AggState::Distinct(set), Contrib::Distinct(h)) => {
                set.0.insert(*h);
            }
            (AggState::First(slot), Contrib::Pick { json, hash }) => {
                let pick = Pick { time, id: id.map(str::to_owned), hash: *hash, json: json.clone() };
                keep(slot, pick, Ordering::Less);
            }
            (AggState::Last(slot), Contrib::Pick { json, hash }) => {
                let pick = Pick { time, id: id.map(str::to_owned), hash: *hash, json: json.clone() };
                keep(slot, pick, Ordering::Greater);
            }
            _ => debug_assert!(false, "contribution does not match its aggregate"),
        }
    }

    /// Takes back what one event gave ([`Contrib::kept`]): a correction
    /// replaced it. Count, sum and avg only (the contract refuses the rest);
    /// a sum that once left the 28-digit range stays null.
    pub(crate) fn take_back(&mut self, given: Option<Decimal>) {
        match (self, given) {
            (_, None) => {}
            (AggState::Count(n), Some(_)) => *n = n.saturating_sub(1),
            (AggState::Sum { sum, n, overflow }, Some(v)) => {
                match sum.checked_sub(v) {
                    Some(s) => *sum = s,
                    None => *overflow = true,
                }
                *n = n.saturating_sub(1);
            }
            _ => debug_assert!(false, "only count, sum and avg take a contribution back"),
        }
    }

    /// Folds another window's state into this one (sessions that merge).
    pub(crate) fn merge(&mut self, other: AggState) {
        match (self, other) {
            (AggState::Count(a), AggState::Count(b)) => *a += b,
            (AggState::Sum { sum, n, overflow }, AggState::Sum { sum: s2, n: n2, overflow: o2 }) => {
                match sum.checked_add(s2) {
                    Some(s) => *sum = s,
                    None => *overflow = true,
                }
                *n += n2;
                *overflow |= o2;
            }
            (AggState::Min(a), AggState::Min(b)) => *a = opt(*a, b, Decimal::min),
            (AggState::Max(a), AggState::Max(b)) => *a = opt(*a, b, Decimal::max),
            (AggState::Distinct(a), AggState::Distinct(b)) => a.0.extend(b.0.iter()),
            (AggState::First(a), AggState::First(Some(b))) => keep(a, *b, Ordering::Less),
            (AggState::Last(a), AggState::Last(Some(b))) => keep(a, *b, Ordering::Greater),
            _ => {}
        }
    }

    pub(crate) fn value(&self, func: AggFn) -> OutValue {
        match self {
            AggState::Count(n) => OutValue::Int(*n),
            AggState::Sum { n: 0, .. } | AggState::Sum { overflow: true, .. } => OutValue::Null,
            AggState::Sum { sum, n, .. } if func == AggFn::Avg => match sum.checked_div(Decimal::from(*n)) {
                Some(avg) => OutValue::Dec(avg.normalize()),
                None => OutValue::Null,
            },
            AggState::Sum { sum, .. } => OutValue::Dec(*sum),
            AggState::Min(m) | AggState::Max(m) => m.map_or(OutValue::Null, OutValue::Dec),
            AggState::Distinct(set) => OutValue::Int(set.0.len() as u64),
            AggState::First(p) | AggState::Last(p) => {
                p.as_ref().map_or(OutValue::Null, |p| OutValue::Json(p.json.clone()))
            }
        }
    }
}

fn opt(a: Option<Decimal>, b: Option<Decimal>, pick: fn(Decimal, Decimal) -> Decimal) -> Option<Decimal> {
    match (a, b) {
        (Some(a), Some(b)) => Some(pick(a, b)),
        (a, b) => a.or(b),
    }
}

/// Keeps `candidate` when it orders `wanted` relative to the current pick.
fn keep(slot: &mut Option<Box<Pick>>, candidate: Pick, wanted: Ordering) {
    let replace = match slot {
        None => true,
        Some(current) => candidate.order(current) == wanted,
    };
    if replace {
        *slot = Some(Box::new(candidate));
    }
}

//! `GET .../diff?a=&b=`: two versions of a pipeline compared on the time
//! both cover (SPEC.md 8). A window is a key and a `[start, end)`; within
//! the range both versions have rows for, each window is matched (the same
//! values and `events`), differing, or missing from one side. Each
//! aggregate's total is summed per version over that range, in exact
//! decimals, so versions with other window sizes still compare.
//!
//! Streaming: both versions' rows come in the order the store lists them
//! (window start, then key bytes) and are merged, so a diff holds one page
//! of each and the [`LARGEST`] differences, whatever the versions' sizes.
//! Pure: rows in, a report out ([`crate::versions::diff`] reads the rows).

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::str::FromStr;

use rust_decimal::Decimal;
use serde_json::{json, Value};

/// The largest differences a report lists.
pub const LARGEST: usize = 20;

pub use weir_store::Place;

/// One window of one version: its identity and what is compared and shown
/// of its row (read without the rest of it).
#[derive(serde::Deserialize)]
struct Window {
    /// The key object as the row writes it.
    #[serde(deserialize_with = "raw_text")]
    key: String,
    #[serde(default)]
    window_start: Option<String>,
    #[serde(default)]
    window_end: Option<String>,
    #[serde(default)]
    values: Value,
    #[serde(default)]
    events: Value,
    #[serde(default)]
    revision: Value,
    #[serde(default)]
    status: Value,
}

fn raw_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let raw: Box<serde_json::value::RawValue> = serde::Deserialize::deserialize(d)?;
    Ok(raw.get().to_owned())
}

impl Window {
    /// A row as the store keeps it; none when it is not one (none is written).
    fn of(row: &str) -> Option<Window> {
        serde_json::from_str(row).ok()
    }

    fn id(&self) -> (&str, Option<&str>, Option<&str>) {
        (&self.key, self.window_start.as_deref(), self.window_end.as_deref())
    }

    /// The window as a report shows it, with one side's row.
    fn side(&self) -> Value {
        json!({ "values": self.values, "events": self.events, "revision": self.revision, "status": self.status })
    }
}

fn decimal(v: &Value) -> Option<Decimal> {
    match v {
        Value::Number(n) => {
            Decimal::from_str(&n.to_string()).or_else(|_| Decimal::from_scientific(&n.to_string())).ok()
        }
        _ => None,
    }
}

/// Equal as values: numbers by their decimal value (`1.10` is `1.1`),
/// objects member by member, anything else as JSON.
fn same(x: &Value, y: &Value) -> bool {
    match (x, y) {
        (Value::Number(_), Value::Number(_)) => decimal(x).is_some() && decimal(x) == decimal(y),
        (Value::Object(a), Value::Object(b)) => {
            a.len() == b.len() && a.iter().all(|(k, v)| b.get(k).is_some_and(|w| same(v, w)))
        }
        _ => x == y,
    }
}

/// The time two versions both cover, from each one's `[first start, last
/// end)` in ms (`None` for a version with no timed window): RFC 3339 UTC
/// times with milliseconds, which compare as text.
pub fn both_cover(a: Option<(i64, i64)>, b: Option<(i64, i64)>) -> Option<(String, String)> {
    let ((fa, la), (fb, lb)) = (a?, b?);
    let t = weir_engine::time::format_rfc3339_ms;
    Some((t(fa.max(fb)), t(la.min(lb))))
}

/// What a comparison has seen so far: counts, totals and the largest
/// differences (at most [`LARGEST`] of them are kept).
#[derive(Default)]
struct Tally {
    matched: u64,
    differing: u64,
    only: [u64; 2],
    totals: BTreeMap<String, [Decimal; 2]>,
    largest: Vec<(Decimal, Window, Window)>,
}

impl Tally {
    fn add_totals(&mut self, side: usize, w: &Window) {
        for (name, v) in w.values.as_object().into_iter().flatten() {
            let t = match self.totals.get_mut(name) {
                Some(t) => t,
                None => self.totals.entry(name.clone()).or_insert([Decimal::ZERO; 2]),
            };
            if let Some(d) = decimal(v) {
                t[side] = t[side].saturating_add(d);
            }
        }
    }

    fn both(&mut self, w: Window, other: Window) {
        if same(&w.values, &other.values) && same(&w.events, &other.events) {
            self.matched += 1;
            return;
        }
        self.differing += 1;
        // A window's difference: the largest of its aggregates' (and its events').
        let mut largest = Decimal::ZERO;
        let mut fields: Vec<(&Value, &Value)> = vec![(&w.events, &other.events)];
        for (name, v) in w.values.as_object().into_iter().flatten() {
            fields.push((v, &other.values[name]));
        }
        for (x, y) in &fields {
            if let (Some(x), Some(y)) = (decimal(x), decimal(y)) {
                largest = largest.max((x - y).abs());
            }
        }
        self.largest.push((largest, w, other));
        if self.largest.len() >= 2 * LARGEST {
            self.keep_largest();
        }
    }

    /// Sorts the differences, largest first, and keeps [`LARGEST`].
    fn keep_largest(&mut self) {
        self.largest.sort_by(|x, y| y.0.cmp(&x.0).then_with(|| x.1.id().cmp(&y.1.id())));
        self.largest.truncate(LARGEST);
    }
}

/// Compares the rows (latest per window, as `/results` serves them) of
/// versions `a` and `b`, each in the order the store lists them, on the
/// time both cover (`range`, from [`both_cover`]).
pub fn compare<E>(
    pipeline: &str,
    range: Option<(String, String)>,
    (a, mut rows_a): (u32, impl Iterator<Item = Result<(Place, String), E>>),
    (b, mut rows_b): (u32, impl Iterator<Item = Result<(Place, String), E>>),
) -> Result<Value, E> {
    // Global windows (no start) are compared whole.
    let inside = |w: &Window| match (&w.window_start, &w.window_end, &range) {
        (None, None, _) => true,
        (Some(s), Some(e), Some((from, to))) => s >= from && e <= to,
        _ => false,
    };
    let mut tally = Tally::default();
    let one = |side: usize, row: String, tally: &mut Tally| {
        if let Some(w) = Window::of(&row).filter(|w| inside(w)) {
            tally.add_totals(side, &w);
            tally.only[side] += 1;
        }
    };
    let (mut x, mut y) = (rows_a.next().transpose()?, rows_b.next().transpose()?);
    loop {
        let order = match (&x, &y) {
            (None, None) => break,
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some((pa, _)), Some((pb, _))) => pa.cmp(pb),
        };
        if order == Ordering::Less {
            one(0, x.take().map(|r| r.1).unwrap_or_default(), &mut tally);
            x = rows_a.next().transpose()?;
            continue;
        }
        if order == Ordering::Greater {
            one(1, y.take().map(|r| r.1).unwrap_or_default(), &mut tally);
            y = rows_b.next().transpose()?;
            continue;
        }
        let (ra, rb) = (x.take().map(|r| r.1).unwrap_or_default(), y.take().map(|r| r.1).unwrap_or_default());
        match (Window::of(&ra), Window::of(&rb)) {
            (Some(wa), Some(wb)) if wa.id() == wb.id() && inside(&wa) => {
                tally.add_totals(0, &wa);
                tally.add_totals(1, &wb);
                tally.both(wa, wb);
            }
            // The same start and key with another end: two windows, one on each side.
            (wa, wb) => {
                for (side, w) in [(0, wa), (1, wb)] {
                    if let Some(w) = w.filter(|w| inside(w)) {
                        tally.add_totals(side, &w);
                        tally.only[side] += 1;
                    }
                }
            }
        }
        (x, y) = (rows_a.next().transpose()?, rows_b.next().transpose()?);
    }
    tally.keep_largest();
    let largest: Vec<Value> = tally
        .largest
        .iter()
        .map(|(d, x, y)| {
            json!({
                "key": serde_json::from_str::<Value>(&x.key).unwrap_or_default(),
                "window_start": x.window_start, "window_end": x.window_end,
                "difference": d.normalize().to_string(),
                "a": x.side(),
                "b": y.side(),
            })
        })
        .collect();
    let totals: BTreeMap<String, Value> = tally
        .totals
        .into_iter()
        .map(|(name, [x, y])| {
            let t = json!({
                "a": x.normalize().to_string(), "b": y.normalize().to_string(),
                "difference": (y - x).normalize().to_string(),
            });
            (name, t)
        })
        .collect();
    Ok(json!({
        "pipeline": pipeline,
        "a": a,
        "b": b,
        "from": range.as_ref().map(|r| r.0.clone()),
        "to": range.as_ref().map(|r| r.1.clone()),
        "windows": {
            "matched": tally.matched,
            "differing": tally.differing,
            "only_in_a": tally.only[0],
            "only_in_b": tally.only[1],
        },
        "totals": totals,
        "largest_differences": largest,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(key: &str, start: &str, end: &str, revenue: &str, events: u64) -> Value {
        serde_json::from_str(&format!(
            r#"{{"key":{{"a":"{key}"}},"window_start":"{start}","window_end":"{end}","values":{{"revenue":{revenue}}},"events":{events}}}"#
        ))
        .unwrap()
    }

    #[test]
    fn windows_both_cover_are_matched_differing_or_missing() {
        let a = vec![
            row("x", "2026-01-01T00:00:00.000Z", "2026-01-01T00:01:00.000Z", "1.10", 1),
            row("y", "2026-01-01T00:00:00.000Z", "2026-01-01T00:01:00.000Z", "2", 1),
            row("x", "2026-01-01T00:01:00.000Z", "2026-01-01T00:02:00.000Z", "5", 2),
            // outside b's range: left out
            row("x", "2026-01-01T00:05:00.000Z", "2026-01-01T00:06:00.000Z", "100", 9),
        ];
        let b = vec![
            row("x", "2026-01-01T00:00:00.000Z", "2026-01-01T00:01:00.000Z", "1.1", 1),
            row("y", "2026-01-01T00:00:00.000Z", "2026-01-01T00:01:00.000Z", "3.5", 2),
            row("z", "2026-01-01T00:01:00.000Z", "2026-01-01T00:02:00.000Z", "7", 1),
        ];
        // In the store's order, with each version's span.
        let listed = |rows: Vec<Value>| {
            let mut rows: Vec<(Place, String)> = rows
                .into_iter()
                .map(|r| {
                    let start = weir_engine::time::parse_rfc3339_ms(r["window_start"].as_str().unwrap()).unwrap();
                    ((start, r["key"].to_string().into_bytes()), r.to_string())
                })
                .collect();
            rows.sort_by(|x, y| x.0.cmp(&y.0));
            rows
        };
        let span = |rows: &[(Place, String)]| {
            let end = |r: &str| {
                let r: Value = serde_json::from_str(r).unwrap();
                weir_engine::time::parse_rfc3339_ms(r["window_end"].as_str().unwrap()).unwrap()
            };
            Some((rows.iter().map(|r| r.0 .0).min()?, rows.iter().map(|r| end(&r.1)).max()?))
        };
        let (a, b) = (listed(a), listed(b));
        let range = both_cover(span(&a), span(&b));
        let rows = |rows: Vec<(Place, String)>| rows.into_iter().map(Ok::<_, ()>);
        let d = compare("p", range, (1, rows(a)), (2, rows(b))).unwrap();
        assert_eq!(d["windows"]["matched"], 1, "{d}");
        assert_eq!(d["windows"]["differing"], 1);
        assert_eq!(d["windows"]["only_in_a"], 1);
        assert_eq!(d["windows"]["only_in_b"], 1);
        assert_eq!(d["totals"]["revenue"]["a"], "8.1");
        assert_eq!(d["totals"]["revenue"]["b"], "11.6");
        assert_eq!(d["largest_differences"][0]["difference"], "1.5");
        assert_eq!(d["to"], "2026-01-01T00:02:00.000Z");
    }
}

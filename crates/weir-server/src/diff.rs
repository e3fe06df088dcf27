//! `GET .../diff?a=&b=`: two versions of a pipeline compared on the time
//! both cover (SPEC.md 8). A window is a key and a `[start, end)`; within
//! the range both versions have rows for, each window is matched (the same
//! values and `events`), differing, or missing from one side. Each
//! aggregate's total is summed per version over that range, in exact
//! decimals, so versions with other window sizes still compare.
//!
//! Pure: rows in, a report out (the route reads the rows).

use std::collections::BTreeMap;
use std::str::FromStr;

use rust_decimal::Decimal;
use serde_json::{json, Value};

/// The largest differences a report lists.
pub const LARGEST: usize = 20;

/// One window of one version: its identity and its row.
struct Window {
    key: String,
    start: Option<String>,
    end: Option<String>,
    row: Value,
}

impl Window {
    fn of(row: Value) -> Option<Window> {
        let key = row.get("key")?.to_string();
        let text = |f: &str| row.get(f).and_then(Value::as_str).map(str::to_owned);
        Some(Window { key, start: text("window_start"), end: text("window_end"), row })
    }

    fn id(&self) -> (String, Option<String>, Option<String>) {
        (self.key.clone(), self.start.clone(), self.end.clone())
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

/// `[first start, last end)` of a version's timed windows (RFC 3339 UTC
/// times with milliseconds compare as text).
fn span(windows: &[Window]) -> Option<(String, String)> {
    let first = windows.iter().filter_map(|w| w.start.clone()).min()?;
    let last = windows.iter().filter_map(|w| w.end.clone()).max()?;
    Some((first, last))
}

/// Compares the rows (latest per window, as `/results` serves them) of
/// versions `a` and `b`.
pub fn compare(pipeline: &str, (a, rows_a): (u32, Vec<Value>), (b, rows_b): (u32, Vec<Value>)) -> Value {
    let wa: Vec<Window> = rows_a.into_iter().filter_map(Window::of).collect();
    let wb: Vec<Window> = rows_b.into_iter().filter_map(Window::of).collect();
    // The time both cover; global windows (no start) are compared whole.
    let range = match (span(&wa), span(&wb)) {
        (Some((fa, la)), Some((fb, lb))) => Some((fa.max(fb), la.min(lb))),
        _ => None,
    };
    let inside = |w: &Window| match (&w.start, &w.end, &range) {
        (None, None, _) => true,
        (Some(s), Some(e), Some((from, to))) => s >= from && e <= to,
        _ => false,
    };
    let side = |ws: Vec<Window>| -> BTreeMap<_, Window> {
        ws.into_iter().filter(|w| inside(w)).map(|w| (w.id(), w)).collect()
    };
    let (sa, sb) = (side(wa), side(wb));
    let mut totals: BTreeMap<String, [Decimal; 2]> = BTreeMap::new();
    for (i, s) in [&sa, &sb].into_iter().enumerate() {
        for w in s.values() {
            for (name, v) in w.row["values"].as_object().into_iter().flatten() {
                let t = totals.entry(name.clone()).or_insert([Decimal::ZERO; 2]);
                if let Some(d) = decimal(v) {
                    t[i] = t[i].saturating_add(d);
                }
            }
        }
    }
    let (mut matched, mut differing, mut only_a, mut only_b) = (0u64, Vec::new(), 0u64, 0u64);
    for (id, w) in &sa {
        let Some(other) = sb.get(id) else {
            only_a += 1;
            continue;
        };
        if same(&w.row["values"], &other.row["values"]) && same(&w.row["events"], &other.row["events"]) {
            matched += 1;
            continue;
        }
        // A window's difference: the largest of its aggregates' (and its events').
        let mut largest = Decimal::ZERO;
        let mut fields: Vec<(&str, &Value, &Value)> = vec![("events", &w.row["events"], &other.row["events"])];
        for (name, v) in w.row["values"].as_object().into_iter().flatten() {
            fields.push((name, v, &other.row["values"][name]));
        }
        for (_, x, y) in &fields {
            if let (Some(x), Some(y)) = (decimal(x), decimal(y)) {
                largest = largest.max((x - y).abs());
            }
        }
        differing.push((largest, w, other));
    }
    only_b += sb.keys().filter(|id| !sa.contains_key(*id)).count() as u64;
    differing.sort_by(|x, y| y.0.cmp(&x.0).then_with(|| x.1.id().cmp(&y.1.id())));
    let largest: Vec<Value> = differing
        .iter()
        .take(LARGEST)
        .map(|(d, x, y)| {
            json!({
                "key": x.row["key"], "window_start": x.row["window_start"], "window_end": x.row["window_end"],
                "difference": d.normalize().to_string(),
                "a": { "values": x.row["values"], "events": x.row["events"], "revision": x.row["revision"], "status": x.row["status"] },
                "b": { "values": y.row["values"], "events": y.row["events"], "revision": y.row["revision"], "status": y.row["status"] },
            })
        })
        .collect();
    let totals: BTreeMap<String, Value> = totals
        .into_iter()
        .map(|(name, [x, y])| {
            let t = json!({
                "a": x.normalize().to_string(), "b": y.normalize().to_string(),
                "difference": (y - x).normalize().to_string(),
            });
            (name, t)
        })
        .collect();
    json!({
        "pipeline": pipeline,
        "a": a,
        "b": b,
        "from": range.as_ref().map(|r| r.0.clone()),
        "to": range.as_ref().map(|r| r.1.clone()),
        "windows": {
            "matched": matched,
            "differing": differing.len(),
            "only_in_a": only_a,
            "only_in_b": only_b,
        },
        "totals": totals,
        "largest_differences": largest,
    })
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
        let d = compare("p", (1, a), (2, b));
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

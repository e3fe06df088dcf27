//! The lateness advisor: `allowed_lateness` for a target too-late rate, from
//! how late events have arrived (`weir_engine::lateness`), read from the
//! version's last checkpoints, so on Kafka it covers every worker's
//! partitions. Each suggestion says what it would cost next to today's
//! setting: events that would count instead of being ledgered `too_late`
//! (with `late = "revise"` each may revise a published row) and the state
//! held, which grows with how long a window stays open.
//!
//! In more detail: `GET .../advice` (`weir-server`) and `weir advise`: the lateness histograms
//! of a version's last checkpoints (every partition, so every worker's on
//! Kafka) merged, and for too-late rates of 1%, 0.1% and 0.01% the smallest
//! `allowed_lateness` (a bucket's top, rounded up to a second) that at most
//! that share of the observed events exceeded, each with the events it would
//! count instead of ledgering `too_late` (revisions, with `late = "revise"`)
//! and the state it would hold (today's state scaled by the window's length
//! plus lateness); a global window gets a note and no suggestion, since nothing
//! is too late there; `advise` is pure.

use serde_json::{json, Value};
use weir_contract::{format_duration_ms, Contract, WindowKind};
use weir_engine::lateness::Lateness;
use weir_engine::time::format_rfc3339_ms;

/// The too-late rates a suggestion is made for.
pub const TARGETS: [f64; 3] = [0.01, 0.001, 0.0001];

/// How long a window is open before the watermark passes its end.
fn window_ms(c: &Contract) -> i64 {
    match c.window.kind {
        WindowKind::Tumbling { size_ms } | WindowKind::Hopping { size_ms, .. } => size_ms,
        WindowKind::Session { gap_ms } => gap_ms,
        WindowKind::Global => 0,
    }
}

/// Rounded up to a whole second (a contract's duration reads better so).
fn whole_seconds(ms: i64) -> i64 {
    (ms + 999) / 1000 * 1000
}

/// What a global window's advice says instead of suggestions.
pub const GLOBAL_NOTE: &str =
    "a global window never closes, so no event is too late for it and allowed_lateness changes nothing: there is nothing to advise";

/// The advice for `contract` from `seen`, with `state_bytes` held now. A
/// global window gets no suggestions: no event is too late there, however
/// far behind the watermark it arrives.
pub fn advise(c: &Contract, seen: &Lateness, state_bytes: usize) -> Value {
    let total = seen.total();
    let now_ms = c.window.allowed_lateness_ms;
    let rate = |over: u64| if total == 0 { 0.0 } else { over as f64 / total as f64 };
    let global = matches!(c.window.kind, WindowKind::Global);
    let too_late_now = if global { 0 } else { seen.over(now_ms) };
    let window = window_ms(c);
    let targets: &[f64] = if global { &[] } else { &TARGETS };
    let suggestions: Vec<Value> = targets
        .iter()
        .map(|&target| {
            let ms = whole_seconds(seen.bound_for(target));
            let over = seen.over(ms);
            // A window stays open for its length plus the lateness.
            let factor = if window + now_ms == 0 { 1.0 } else { (window + ms) as f64 / (window + now_ms) as f64 };
            json!({
                "target_too_late_rate": target,
                "allowed_lateness": format_duration_ms(ms),
                "allowed_lateness_ms": ms,
                "too_late_rate": rate(over),
                "too_late_events": over,
                "more_events_counted": too_late_now as i64 - over as i64,
                "extra_revisions": if c.window.late == weir_contract::LatePolicy::Revise {
                    (too_late_now as i64 - over as i64).max(0)
                } else {
                    0
                },
                "state_factor": factor,
                "state_bytes": (state_bytes as f64 * factor).round() as u64,
            })
        })
        .collect();
    let mut advice = json!({
        "pipeline": c.pipeline.name,
        "version": c.pipeline.version,
        "period": {
            "from": seen.since_ms.map(format_rfc3339_ms),
            "to": seen.until_ms.map(format_rfc3339_ms),
            "events": total,
        },
        "current": {
            "allowed_lateness": format_duration_ms(now_ms),
            "late": c.window.late.as_str(),
            "too_late_rate": rate(too_late_now),
            "too_late_events": too_late_now,
            "state_bytes": state_bytes,
        },
        "suggestions": suggestions,
        "method": "each event's lateness is how far behind the watermark its time was when it arrived; a suggestion is the smallest bucket bound (within 25%, rounded up to a second) that at most the target share of the events observed exceeded; an event behind the watermark by less than allowed_lateness is never too late, so the rates are upper bounds",
    });
    if global {
        advice["note"] = json!(GLOBAL_NOTE);
    }
    advice
}

/// The lateness histograms of a version's checkpoint headers, merged.
pub fn observed(contract: &Contract, headers: &[(u32, Vec<u8>)]) -> Result<Lateness, String> {
    let mut seen = Lateness::default();
    for (partition, header) in headers {
        let engine =
            weir_engine::Engine::restore_parts(contract, header, std::iter::empty(), std::iter::empty::<&[u8]>())
                .map_err(|e| format!("checkpoint of partition {partition}: {e}"))?;
        seen.add(&engine.counters().lateness);
    }
    Ok(seen)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_global_window_gets_no_lateness_advice_since_no_event_is_too_late_there() {
        let text = "[pipeline]\nname = \"p\"\nversion = 1\nowner = \"o\"\nsteward = \"s\"\ndecision = \"d\"\n\
            [source]\ntopic = \"t\"\nevent_time = \"t\"\nkey = [\"k\"]\n\
            [window]\ntype = \"global\"\n\
            [[aggregate]]\nname = \"n\"\nfn = \"count\"\n";
        let c = Contract::parse("p.toml", text).unwrap();
        let mut seen = Lateness::default();
        // Events up to a minute and a half behind the watermark.
        for ms in (0..90_000).step_by(100) {
            seen.record(ms, Some(1_000 + ms));
        }
        let a = advise(&c, &seen, 1_000);
        assert_eq!(a["period"]["events"], 900);
        assert_eq!(a["current"]["too_late_events"], 0, "{a}");
        assert_eq!(a["current"]["too_late_rate"], 0.0, "{a}");
        assert_eq!(a["suggestions"], json!([]), "{a}");
        assert_eq!(a["note"], GLOBAL_NOTE);
    }

    #[test]
    fn suggestions_leave_at_most_their_rate_too_late_and_say_the_cost() {
        let text = "[pipeline]\nname = \"p\"\nversion = 1\nowner = \"o\"\nsteward = \"s\"\ndecision = \"d\"\n\
            [source]\ntopic = \"t\"\nevent_time = \"t\"\nkey = [\"k\"]\n\
            [window]\ntype = \"tumbling\"\nsize = \"1m\"\nallowed_lateness = \"9s\"\nlate = \"revise\"\n\
            [[aggregate]]\nname = \"n\"\nfn = \"count\"\n";
        let c = Contract::parse("p.toml", text).unwrap();
        let mut seen = Lateness::default();
        // 8,192 events: lateness 0 to 8.191 s, one each millisecond.
        for ms in 0..8_192 {
            seen.record(ms, Some(1_000 + ms));
        }
        let a = advise(&c, &seen, 1_000);
        assert_eq!(a["period"]["events"], 8_192);
        assert_eq!(a["current"]["too_late_events"], 0, "{a}");
        assert!(a.get("note").is_none(), "{a}");
        for s in a["suggestions"].as_array().unwrap() {
            let (target, rate) = (s["target_too_late_rate"].as_f64().unwrap(), s["too_late_rate"].as_f64().unwrap());
            assert!(rate <= target, "{s}");
            let ms = s["allowed_lateness_ms"].as_i64().unwrap();
            assert!(ms % 1000 == 0 && (9_000..=13_000).contains(&ms), "{s}");
            // Today's 9 s already counts everything: no more events count, state changes with the window's time open.
            assert!(s["more_events_counted"].as_i64().unwrap() <= 0, "{s}");
            let factor = s["state_factor"].as_f64().unwrap();
            assert!((factor - (60_000 + ms) as f64 / 69_000.0).abs() < 1e-9, "{s}");
        }
    }
}

//! A Nexmark-shaped stream, as a new user brings it: persons, auctions and
//! bids on one topic (`event_type` 0, 1, 2, each kind's fields nested under
//! its name), times written the SQL way (`2024-01-01 00:00:00.000`, UTC),
//! events shuffled within groups of 50 (up to 49 ms of disorder).
//! Contracts in the style of Nexmark q7a (the highest bid per 10 s tumbling
//! window) and q5a (bids per auction per 10 s window sliding every 2 s)
//! pick the bids with their `where` (SPEC.md 3.1: the rule comes first, so
//! persons and auctions are filtered, not ledgered) and read the time with
//! `event_time_format`. `weir batch` and the settled rows of `weir run` must
//! equal a plain recomputation over the generated bids.

mod common;

use std::collections::BTreeMap;

use common::{text, weir, Scratch};
use serde_json::Value;

const BASE_MS: i64 = 1_704_067_200_000; // 2024-01-01T00:00:00Z

fn sql_time(ms: i64) -> String {
    weir_engine::time::format_rfc3339_ms(ms).replace('T', " ").trim_end_matches('Z').to_owned()
}

struct Rng(u64);

impl Rng {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n
    }
}

struct Bid {
    time: i64,
    auction: u64,
    price: u64,
}

/// `n` events (about 46 bids in 50) at 1,000 per second of event time.
fn nexmark(n: u64) -> (Vec<String>, Vec<Bid>) {
    let mut rng = Rng(42);
    let (mut lines, mut bids) = (Vec::new(), Vec::new());
    for k in 0..n {
        // A fixed permutation inside each group of 50: bounded disorder.
        let a = (k / 50) * 50 + (k * 953) % 50;
        let time = BASE_MS + a as i64;
        let at = sql_time(time);
        let line = match a % 50 {
            0 => format!(
                r#"{{"event_type":0,"person":{{"id":{},"name":"p{a}","emailAddress":"p{a}@example.com","city":"Bend","state":"OR","dateTime":"{at}","extra":""}}}}"#,
                1000 + a / 50
            ),
            1..=3 => format!(
                r#"{{"event_type":1,"auction":{{"id":{},"itemName":"i{a}","initialBid":{},"reserve":{},"dateTime":"{at}","expires":"{}","seller":{},"category":{}}}}}"#,
                1000 + 3 * (a / 50) + a % 50 - 1,
                100 + rng.next(1000),
                2000 + rng.next(1000),
                sql_time(time + 10_000),
                1000 + rng.next(a / 50 + 1),
                10 + rng.next(5)
            ),
            _ => {
                let last = 1000 + 3 * (a / 50);
                let auction = if rng.next(2) == 0 { last / 100 * 100 } else { last.saturating_sub(rng.next(100)) };
                let price = 100 + rng.next(1_000_000);
                bids.push(Bid { time, auction, price });
                format!(
                    r#"{{"event_type":2,"bid":{{"auction":{auction},"bidder":{},"price":{price},"channel":"Google","url":"https://example.com/{a}","dateTime":"{at}","extra":""}}}}"#,
                    1000 + rng.next(1000)
                )
            }
        };
        lines.push(line);
    }
    (lines, bids)
}

fn contract(name: &str, key: &str, window: &str, aggregate: &str) -> String {
    format!(
        r#"[pipeline]
name = "{name}"
version = 1
owner = "auctions"
steward = "data-platform"
decision = "Nexmark, as a new user writes it"

[source]
topic = "nexmark"
event_time = "bid.dateTime"
event_time_format = "%Y-%m-%d %H:%M:%S%.3f"
event_time_zone = "UTC"
key = [{key}]
where = 'event_type == 2'
max_delay = "4s"

[window]
{window}
late = "discard"

{aggregate}
"#
    )
}

/// (key, window start in ms, the aggregate's value) of each row.
fn rows(path: &std::path::Path, value: &str, settled_only: bool) -> Vec<(String, i64, u64)> {
    let mut out: Vec<_> = std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| !settled_only || r["status"] == "settled")
        .map(|r| {
            let start = weir_engine::time::parse_rfc3339_ms(r["window_start"].as_str().unwrap()).unwrap();
            (r["key"].to_string(), start, r["values"][value].as_u64().unwrap())
        })
        .collect();
    out.sort();
    out
}

/// Runs `contract` as a stream and a batch over `input`: both must equal
/// `expected`, and nothing may be ledgered (every bid is good; the rest is
/// filtered).
fn check(
    s: &Scratch,
    name: &str,
    contract: &str,
    input: &std::path::Path,
    value: &str,
    expected: &[(String, i64, u64)],
) {
    let c = s.write(&format!("{name}.toml"), contract);
    let (out, ledger, batch) =
        (s.path(&format!("{name}.rows")), s.path(&format!("{name}.ledger")), s.path(&format!("{name}.batch")));
    let run = weir(&[&"run", &c, &"--input", &input, &"--output", &out, &"--ledger", &ledger]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    let summary = text(&run.stderr);
    assert_eq!(std::fs::read_to_string(&ledger).unwrap(), "", "{name}: persons and auctions are filtered: {summary}");
    assert_eq!(rows(&out, value, true), expected, "{name}: the stream's settled rows");
    let b = weir(&[&"batch", &c, &"--input", &input, &"--output", &batch]);
    assert!(b.status.success(), "{}", text(&b.stderr));
    assert_eq!(rows(&batch, value, false), expected, "{name}: the batch");
}

#[test]
fn nexmark_q7a_and_q5a_run_on_one_topic_of_three_kinds_with_sql_times() {
    let s = Scratch::new("nexmark");
    let (lines, bids) = nexmark(60_000);
    let input = s.write("nexmark.jsonl", &(lines.join("\n") + "\n"));
    assert!(bids.len() > 50_000 && lines.len() == 60_000);

    // q7a: the highest bid per 10 s tumbling window.
    let mut q7a: BTreeMap<i64, u64> = BTreeMap::new();
    for b in &bids {
        let start = (b.time - BASE_MS).div_euclid(10_000) * 10_000 + BASE_MS;
        let best = q7a.entry(start).or_default();
        *best = (*best).max(b.price);
    }
    let expected: Vec<_> = q7a.into_iter().map(|(start, price)| ("{}".to_owned(), start, price)).collect();
    assert_eq!(expected.len(), 6, "60,000 events at 1,000 a second: 60 s, six windows");
    let q7a = contract(
        "q7a",
        "",
        "type = \"tumbling\"\nsize = \"10s\"",
        "[[aggregate]]\nname = \"max_price\"\nfn = \"max\"\nfield = \"bid.price\"",
    );
    check(&s, "q7a", &q7a, &input, "max_price", &expected);

    // q5a: bids per auction in every 10 s window, sliding by 2 s.
    let mut q5a: BTreeMap<(String, i64), u64> = BTreeMap::new();
    for b in &bids {
        let last = (b.time).div_euclid(2_000) * 2_000;
        let mut start = last - 8_000;
        while start <= last {
            *q5a.entry((format!("{{\"bid.auction\":{}}}", b.auction), start)).or_default() += 1;
            start += 2_000;
        }
    }
    let expected: Vec<_> = q5a.into_iter().map(|((key, start), n)| (key, start, n)).collect();
    assert!(expected.len() > 100, "{}", expected.len());
    let q5a = contract(
        "q5a",
        "\"bid.auction\"",
        "type = \"hopping\"\nsize = \"10s\"\nslide = \"2s\"",
        "[[aggregate]]\nname = \"bids\"\nfn = \"count\"",
    );
    check(&s, "q5a", &q5a, &input, "bids", &expected);
}

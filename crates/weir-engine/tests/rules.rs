//! SPEC.md section 3, one rule at a time: each test is a small, readable
//! event sequence and the rows and ledger entries it must produce.
//!
//! Events carry `t` in seconds (written as epoch milliseconds), key `k`, id
//! `id` and `amount`. Rows print as `k [start,end) status#revision
//! events=.. late=.. {values}`; ledger entries as `offset reason [window]`.

use weir_contract::Contract;
use weir_engine::{Engine, EventIn, Mode, OutValue, Output, Reason, Row};

const HEAD: &str = r#"
[pipeline]
name = "rules"
version = 1
owner = "o"
steward = "s"
decision = "d"
"#;

fn contract(source_extra: &str, window: &str, rest: &str) -> Contract {
    let text = format!(
        "{HEAD}\n[source]\ntopic = \"t\"\nevent_time = \"t\"\nkey = [\"k\"]\nevent_id = \"id\"\n{source_extra}\n[window]\n{window}\n{rest}\n[[aggregate]]\nname = \"n\"\nfn = \"count\"\n\n[[aggregate]]\nname = \"sum\"\nfn = \"sum\"\nfield = \"amount\"\n"
    );
    Contract::parse("test.toml", &text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// `k`, `t` seconds, `id`, `amount` as one event line.
fn ev(k: &str, t: i64, id: &str, amount: &str) -> String {
    format!(r#"{{"k":"{k}","t":{},"id":"{id}","amount":{amount}}}"#, t * 1000)
}

fn secs(ms: Option<i64>) -> String {
    ms.map_or("-".into(), |ms| format!("{}", ms / 1000))
}

fn value(v: &OutValue) -> String {
    match v {
        OutValue::Null => "null".into(),
        OutValue::Int(n) => n.to_string(),
        OutValue::Dec(d) => d.normalize().to_string(),
        OutValue::Json(t) => t.to_string(),
    }
}

fn show_row(row: &Row) -> String {
    // The first key field's text (tests use one string key, or none).
    let key = String::from_utf8_lossy(row.key.get(5..).unwrap_or_default()).into_owned();
    let values: Vec<String> = row.values.iter().map(value).collect();
    let window = format!(
        "[{},{}) {}#{} events={} late={} {{{}}}",
        secs(row.window_start),
        secs(row.window_end),
        row.status.as_str(),
        row.revision,
        row.events,
        row.late_events,
        values.join(",")
    );
    if key.is_empty() {
        window
    } else {
        format!("{key} {window}")
    }
}

struct Run {
    rows: Vec<String>,
    ledger: Vec<String>,
}

fn run_mode(contract: &Contract, mode: Mode, events: &[String], finish: bool) -> Run {
    let mut engine = Engine::new(contract, mode, 1).unwrap();
    let mut out = Output::default();
    for (i, e) in events.iter().enumerate() {
        engine.process(EventIn { partition: 0, offset: i as u64 + 1, bytes: e.as_bytes() }, &mut out);
    }
    if finish {
        engine.finish(&mut out);
    }
    Run {
        rows: out.rows.iter().map(show_row).collect(),
        ledger: out
            .ledger
            .iter()
            .map(|l| match l.window {
                Some((s, e)) => format!("{} {} [{},{})", l.offset, l.reason.as_str(), s / 1000, e / 1000),
                None => match (l.first_offset, l.superseded_by) {
                    (Some(first), _) => format!("{} {} first={first}", l.offset, l.reason.as_str()),
                    (_, Some(by)) => format!("{} {} by={by}", l.offset, l.reason.as_str()),
                    _ => format!("{} {}", l.offset, l.reason.as_str()),
                },
            })
            .collect(),
    }
}

fn check(contract: &Contract, events: &[String], rows: &[&str], ledger: &[&str]) {
    let got = run_mode(contract, Mode::Stream, events, true);
    assert_eq!(got.rows, rows, "rows");
    assert_eq!(got.ledger, ledger, "ledger");
}

const TUMBLING_10S: &str = "type = \"tumbling\"\nsize = \"10s\"";

#[test]
fn discard_settles_at_the_windows_end_and_refuses_later_events() {
    let c = contract("", &format!("{TUMBLING_10S}\nlate = \"discard\""), "");
    check(
        &c,
        &[ev("a", 1, "1", "2"), ev("a", 5, "2", "3"), ev("a", 10, "3", "1"), ev("a", 4, "4", "9")],
        &["a [0,10) settled#1 events=2 late=0 {2,5}", "a [10,20) settled#1 events=1 late=0 {1,1}"],
        &["4 too_late [0,10)"],
    );
}

#[test]
fn hold_publishes_once_after_the_lateness() {
    let c = contract("", &format!("{TUMBLING_10S}\nallowed_lateness = \"5s\"\nlate = \"hold\""), "");
    check(
        &c,
        &[
            ev("a", 1, "1", "2"),
            ev("a", 12, "2", "3"),
            ev("a", 9, "3", "4"),
            ev("a", 15, "4", "1"),
            ev("a", 2, "5", "7"),
        ],
        &["a [0,10) settled#1 events=2 late=1 {2,6}", "a [10,20) settled#1 events=2 late=0 {2,4}"],
        &["5 too_late [0,10)"],
    );
}

#[test]
fn revise_is_provisional_at_the_end_revised_by_late_events_then_settled() {
    let c = contract("", &format!("{TUMBLING_10S}\nallowed_lateness = \"5s\"\nlate = \"revise\""), "");
    check(
        &c,
        &[
            ev("a", 1, "1", "2"),
            ev("a", 11, "2", "3"),
            ev("a", 8, "3", "4"),
            ev("a", 13, "4", "1"),
            ev("a", 15, "5", "1"),
        ],
        &[
            "a [0,10) provisional#1 events=1 late=0 {1,2}",
            "a [0,10) provisional#2 events=2 late=1 {2,6}",
            "a [0,10) settled#3 events=2 late=1 {2,6}",
            "a [10,20) settled#1 events=3 late=0 {3,5}",
        ],
        &[],
    );
}

#[test]
fn early_emits_a_provisional_row_per_change() {
    let c = contract("", &format!("{TUMBLING_10S}\nlate = \"discard\"\nearly = true"), "");
    check(
        &c,
        &[ev("a", 1, "1", "2"), ev("b", 2, "2", "3"), ev("a", 3, "3", "4"), ev("a", 10, "4", "1")],
        &[
            "a [0,10) provisional#1 events=1 late=0 {1,2}",
            "b [0,10) provisional#1 events=1 late=0 {1,3}",
            "a [0,10) provisional#2 events=2 late=0 {2,6}",
            "a [0,10) settled#3 events=2 late=0 {2,6}",
            "b [0,10) settled#2 events=1 late=0 {1,3}",
            "a [10,20) provisional#1 events=1 late=0 {1,1}",
            "a [10,20) settled#2 events=1 late=0 {1,1}",
        ],
        &[],
    );
}

#[test]
fn hopping_counts_an_event_in_every_window_and_refuses_only_expired_ones() {
    let c = contract("", "type = \"hopping\"\nsize = \"10s\"\nslide = \"5s\"\nlate = \"discard\"", "");
    check(
        &c,
        &[ev("a", 7, "1", "1"), ev("a", 12, "2", "1"), ev("a", 9, "3", "1")],
        &[
            "a [0,10) settled#1 events=1 late=0 {1,1}",
            "a [5,15) settled#1 events=3 late=0 {3,3}",
            "a [10,20) settled#1 events=1 late=0 {1,1}",
        ],
        &["3 too_late [0,10)"],
    );
}

#[test]
fn sessions_merge_retract_and_restart_revisions() {
    let c = contract(
        "max_delay = \"30s\"",
        "type = \"session\"\ngap = \"5s\"\nallowed_lateness = \"30s\"\nlate = \"revise\"\nearly = true",
        "",
    );
    check(
        &c,
        &[ev("a", 10, "1", "1"), ev("a", 17, "2", "1"), ev("a", 13, "3", "1"), ev("a", 7, "4", "1")],
        &[
            "a [10,15) provisional#1 events=1 late=0 {1,1}",
            "a [17,22) provisional#1 events=1 late=0 {1,1}",
            // 13 bridges [10,15) and [17,22): the merge keeps the earlier start,
            // and the later session is retracted.
            "a [10,22) provisional#2 events=3 late=0 {3,3}",
            "a [17,22) retracted#2 events=1 late=0 {1,1}",
            // 7 starts before the merged session: a new start begins at revision 1.
            "a [7,22) provisional#1 events=4 late=0 {4,4}",
            "a [10,22) retracted#3 events=3 late=0 {3,3}",
            "a [7,22) settled#2 events=4 late=0 {4,4}",
        ],
        &[],
    );
}

#[test]
fn touching_sessions_do_not_merge() {
    let c = contract("max_delay = \"30s\"", "type = \"session\"\ngap = \"5s\"\nlate = \"discard\"", "");
    check(
        &c,
        &[ev("a", 10, "1", "1"), ev("a", 15, "2", "1")],
        &["a [10,15) settled#1 events=1 late=0 {1,1}", "a [15,20) settled#1 events=1 late=0 {1,1}"],
        &[],
    );
}

#[test]
fn a_session_too_late_after_merging_changes_nothing() {
    let c = contract("", "type = \"session\"\ngap = \"5s\"\nlate = \"discard\"", "");
    check(
        &c,
        &[ev("a", 10, "1", "1"), ev("a", 30, "2", "1"), ev("a", 2, "3", "1")],
        &["a [10,15) settled#1 events=1 late=0 {1,1}", "a [30,35) settled#1 events=1 late=0 {1,1}"],
        &["3 too_late [2,7)"],
    );
}

#[test]
fn global_windows_revise_on_every_change_and_settle_at_the_end() {
    let c = contract("", "type = \"global\"", "");
    check(
        &c,
        &[ev("a", 1, "1", "2"), ev("a", 100, "2", "3")],
        &[
            "a [-,-) provisional#1 events=1 late=0 {1,2}",
            "a [-,-) provisional#2 events=2 late=0 {2,5}",
            "a [-,-) settled#3 events=2 late=0 {2,5}",
        ],
        &[],
    );
}

#[test]
fn duplicates_and_conflicts_are_ledgered_and_parsed_json_decides() {
    let c = contract("", &format!("{TUMBLING_10S}\nlate = \"discard\""), "[dedup]\nhorizon = \"1m\"");
    let reordered = r#"{"amount":2.0,"id":"1","t":1000,"k":"a"}"#.to_string();
    check(
        &c,
        &[ev("a", 1, "1", "2"), reordered, ev("a", 2, "1", "5"), ev("a", 3, "2", "1")],
        &["a [0,10) settled#1 events=2 late=0 {2,3}"],
        &["2 duplicate first=1", "3 duplicate_conflict first=1"],
    );
}

#[test]
fn a_ledger_entry_names_the_event_id_as_the_event_wrote_it() {
    let c = contract("", &format!("{TUMBLING_10S}\nlate = \"discard\""), "[dedup]\nhorizon = \"1m\"");
    let events = [
        ev("a", 1, "p-1", "2"),
        ev("a", 1, "p-1", "2"),
        r#"{"k":"a","t":2000,"id":42,"amount":1}"#.to_string(),
        r#"{"k":"a","t":2000,"id":42,"amount":3}"#.to_string(),
        ev("a", 30, "p-2", "1"),
        r#"{"k":"a","t":3000,"id":"p-\u0033","amount":1}"#.to_string(),
    ];
    let mut engine = Engine::new(&c, Mode::Stream, 1).unwrap();
    let mut out = Output::default();
    for (i, e) in events.iter().enumerate() {
        engine.process(EventIn { partition: 0, offset: i as u64 + 1, bytes: e.as_bytes() }, &mut out);
    }
    let got: Vec<(u64, &str, Option<&str>)> =
        out.ledger.iter().map(|l| (l.offset, l.reason.as_str(), l.event_id.as_deref())).collect();
    assert_eq!(
        got,
        [(2, "duplicate", Some("p-1")), (4, "duplicate_conflict", Some("42")), (6, "too_late", Some("p-3"))]
    );
}

#[test]
fn an_id_is_forgotten_once_the_watermark_passes_its_horizon() {
    let c = contract(
        "",
        &format!("{TUMBLING_10S}\nallowed_lateness = \"10s\"\nlate = \"hold\""),
        "[dedup]\nhorizon = \"20s\"",
    );
    check(
        &c,
        &[
            ev("a", 1, "x", "1"),
            ev("a", 20, "y", "1"),
            ev("a", 21, "x", "1"),
            ev("a", 30, "z", "1"),
            ev("a", 21, "x", "1"),
        ],
        &[
            "a [0,10) settled#1 events=1 late=0 {1,1}",
            // y, and x re-sent once its first arrival was forgotten (late, allowed).
            "a [20,30) settled#1 events=2 late=1 {2,2}",
            "a [30,40) settled#1 events=1 late=0 {1,1}",
        ],
        &["3 duplicate_conflict first=1"],
    );
}

#[test]
fn a_refused_event_is_not_remembered_so_a_corrected_resend_counts() {
    let c = contract("", &format!("{TUMBLING_10S}\nlate = \"discard\""), "[dedup]\nhorizon = \"1m\"");
    check(
        &c,
        &[ev("a", 1, "1", "\"n/a\""), ev("a", 1, "1", "2")],
        &["a [0,10) settled#1 events=1 late=0 {1,2}"],
        &["1 bad_type"],
    );
}

#[test]
fn every_ledger_reason_in_order_of_the_checks() {
    let c = contract(
        "where = 'status == \"ok\"'\nmax_event_bytes = 120",
        &format!("{TUMBLING_10S}\nlate = \"discard\""),
        "[dedup]\nhorizon = \"1m\"",
    );
    let long = format!(r#"{{"k":"a","t":1000,"id":"1","status":"ok","pad":"{}"}}"#, "x".repeat(200));
    let events: Vec<String> = [
        long.as_str(),
        r#"{"k":"a","t":1000"#,
        r#"["not","an","object"]"#,
        r#"{"k":"a","id":"1","status":"ok"}"#,
        r#"{"k":"a","t":"yesterday","id":"1","status":"ok"}"#,
        r#"{"t":1000,"id":"1","status":"ok"}"#,
        r#"{"k":1.5,"t":1000,"id":"1","status":"ok"}"#,
        r#"{"k":"a","t":1000,"status":"ok"}"#,
        r#"{"k":"a","t":1000,"id":"1"}"#,
        r#"{"k":"a","t":1000,"id":"1","status":"no"}"#,
        r#"{"k":"a","t":1000,"id":"1","status":"ok","amount":true}"#,
        r#"{"k":"a","t":1000,"id":"1","status":"ok","amount":1}"#,
        r#"{"k":"a","t":1000,"id":"1","status":"ok","amount":1}"#,
        r#"{"k":"a","t":20000,"id":"2","status":"ok"}"#,
        r#"{"k":"a","t":1000,"id":"3","status":"ok"}"#,
        "",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    check(
        &c,
        &events,
        &["a [0,10) settled#1 events=1 late=0 {1,1}", "a [20,30) settled#1 events=1 late=0 {1,null}"],
        &[
            "1 too_large",
            "2 malformed_json",
            "3 malformed_json",
            "4 missing_field",
            "5 bad_type",
            "6 missing_field",
            "7 bad_type",
            "8 missing_field",
            "9 rule_error",
            "11 bad_type",
            "13 duplicate first=12",
            "15 too_late [0,10)",
            "16 malformed_json",
        ],
    );
}

#[test]
fn a_ledgered_event_with_a_time_still_moves_the_watermark() {
    let c = contract("", &format!("{TUMBLING_10S}\nlate = \"discard\""), "");
    // The second event has no key, but its time closes [0,10).
    let run = run_mode(&c, Mode::Stream, &[ev("a", 1, "1", "1"), r#"{"t":15000,"id":"2"}"#.into()], false);
    assert_eq!(run.rows, ["a [0,10) settled#1 events=1 late=0 {1,1}"]);
    assert_eq!(run.ledger, ["2 missing_field"]);
}

#[test]
fn the_watermark_is_the_minimum_over_partitions_and_idle_ones_step_aside() {
    let c = contract("", &format!("{TUMBLING_10S}\nlate = \"discard\""), "");
    let mut engine = Engine::new(&c, Mode::Stream, 2).unwrap();
    let mut out = Output::default();
    let e1 = ev("a", 1, "1", "1");
    let e2 = ev("a", 30, "2", "1");
    engine.process(EventIn { partition: 0, offset: 1, bytes: e1.as_bytes() }, &mut out);
    engine.process(EventIn { partition: 0, offset: 2, bytes: e2.as_bytes() }, &mut out);
    assert!(out.rows.is_empty(), "partition 1 has said nothing: the watermark must wait");
    assert_eq!(engine.watermark(), None);
    engine.set_partition_idle(1, true, &mut out);
    assert_eq!(engine.watermark(), Some(30_000));
    assert_eq!(out.rows.iter().map(show_row).collect::<Vec<_>>(), ["a [0,10) settled#1 events=1 late=0 {1,1}"]);
}

#[test]
fn when_every_partition_is_idle_the_most_advanced_one_sets_the_watermark() {
    let c = contract("", &format!("{TUMBLING_10S}\nlate = \"discard\""), "");
    let mut engine = Engine::new(&c, Mode::Stream, 2).unwrap();
    let mut out = Output::default();
    let e1 = ev("a", 1, "1", "1");
    let e2 = ev("a", 30, "2", "1");
    engine.process(EventIn { partition: 0, offset: 1, bytes: e1.as_bytes() }, &mut out);
    engine.process(EventIn { partition: 0, offset: 2, bytes: e2.as_bytes() }, &mut out);
    // Both fall silent at once; the one with data is marked first.
    engine.set_partition_idle(0, true, &mut out);
    assert_eq!(engine.watermark(), None, "partition 1 is still active and has said nothing");
    engine.set_partition_idle(1, true, &mut out);
    assert_eq!(engine.watermark(), Some(30_000), "nothing holds the watermark back any more");
    assert_eq!(out.rows.iter().map(show_row).collect::<Vec<_>>(), ["a [0,10) settled#1 events=1 late=0 {1,1}"]);
}

#[test]
fn aggregates_are_exact_and_order_free() {
    let text = format!(
        "{HEAD}\n[source]\ntopic = \"t\"\nevent_time = \"t\"\nkey = []\nevent_id = \"id\"\n[window]\ntype = \"global\"\n{}",
        [
            ("total", "sum", "amount", ""),
            ("lo", "min", "amount", ""),
            ("hi", "max", "amount", ""),
            ("mean", "avg", "amount", ""),
            ("kinds", "count_distinct", "amount", ""),
            ("first_plan", "first", "plan", ""),
            ("last_plan", "last", "plan", ""),
            ("eur", "count", "", "where = 'currency == \"EUR\"'"),
        ]
        .iter()
        .map(|(n, f, field, w)| {
            let field = if field.is_empty() { String::new() } else { format!("field = \"{field}\"\n") };
            format!("[[aggregate]]\nname = \"{n}\"\nfn = \"{f}\"\n{field}{w}\n")
        })
        .collect::<String>()
    );
    let c = Contract::parse("agg.toml", &text).unwrap();
    let events = [
        r#"{"t":1000,"id":"b","amount":0.1,"plan":"pro","currency":"EUR"}"#,
        r#"{"t":1000,"id":"a","amount":"0.2","plan":"free","currency":"USD"}"#,
        r#"{"t":2000,"id":"c","amount":0.10,"plan":"team","currency":"EUR"}"#,
        r#"{"t":500,"id":"d","amount":null,"currency":"EUR"}"#,
    ];
    let expect = "[-,-) settled#1 events=4 late=0 {0.4,0.1,0.2,0.1333333333333333333333333333,2,\"free\",\"team\",3}";
    for order in [[0, 1, 2, 3], [3, 2, 1, 0], [2, 0, 3, 1]] {
        let evs: Vec<String> = order.iter().map(|&i| events[i].to_string()).collect();
        let run = run_mode(&c, Mode::Batch, &evs, true);
        assert_eq!(run.rows.len(), 1);
        assert!(run.rows[0].ends_with(expect), "{order:?}: {}", run.rows[0]);
    }
}

#[test]
fn sum_stays_an_integer_while_every_input_is_one() {
    let c = contract("", "type = \"global\"", "");
    let run = run_mode(&c, Mode::Batch, &[ev("a", 1, "1", "2"), ev("a", 2, "2", "40")], true);
    assert_eq!(run.rows, ["a [-,-) settled#1 events=2 late=0 {2,42}"]);
    let mut engine = Engine::new(&c, Mode::Batch, 1).unwrap();
    let mut out = Output::default();
    for (i, e) in [ev("a", 1, "1", "2"), ev("a", 2, "2", "40")].iter().enumerate() {
        engine.process(EventIn { partition: 0, offset: i as u64 + 1, bytes: e.as_bytes() }, &mut out);
    }
    engine.finish(&mut out);
    let mut line = String::new();
    engine.format().write_row(&out.rows[0], &mut line);
    assert!(line.contains(r#""sum":42}"#), "{line}");
}

#[test]
fn keys_may_be_nested_paths_or_none() {
    let text = format!("{HEAD}\n[source]\ntopic = \"t\"\nevent_time = \"t\"\nkey = [\"acct.id\", \"vip\"]\n[window]\ntype = \"global\"\n[[aggregate]]\nname = \"n\"\nfn = \"count\"\n");
    let c = Contract::parse("k.toml", &text).unwrap();
    let mut engine = Engine::new(&c, Mode::Batch, 1).unwrap();
    let mut out = Output::default();
    let e = r#"{"t":1,"acct":{"id":7},"vip":true}"#;
    engine.process(EventIn { partition: 0, offset: 1, bytes: e.as_bytes() }, &mut out);
    engine.finish(&mut out);
    let mut line = String::new();
    engine.format().write_row(&out.rows[0], &mut line);
    assert!(line.contains(r#""key":{"acct.id":7,"vip":true}"#), "{line}");
}

#[test]
fn batches_of_events_give_what_single_events_give() {
    let c = contract("", &format!("{TUMBLING_10S}\nallowed_lateness = \"5s\"\nlate = \"revise\"\nearly = true"), "");
    let events: Vec<String> =
        (0..60).map(|i| ev(["a", "b", "c"][i % 3], ((i * 7) % 40) as i64, &i.to_string(), "1")).collect();
    let one = run_mode(&c, Mode::Stream, &events, true);
    let mut engine = Engine::new(&c, Mode::Stream, 1).unwrap();
    let mut out = Output::default();
    engine.process_batch(
        events.iter().enumerate().map(|(i, e)| EventIn { partition: 0, offset: i as u64 + 1, bytes: e.as_bytes() }),
        &mut out,
    );
    engine.finish(&mut out);
    assert_eq!(out.rows.iter().map(show_row).collect::<Vec<_>>(), one.rows);
}

#[test]
fn batch_counts_what_the_stream_refused_as_too_late() {
    let c = contract("", &format!("{TUMBLING_10S}\nlate = \"discard\""), "");
    let events = [ev("a", 20, "1", "1"), ev("a", 3, "2", "1")];
    let batch = run_mode(&c, Mode::Batch, &events, true);
    assert_eq!(batch.rows, ["a [0,10) settled#1 events=1 late=0 {1,1}", "a [20,30) settled#1 events=1 late=0 {1,1}"]);
    assert!(batch.ledger.is_empty());
}

/// Rows name where their events came from: per partition, the lowest and
/// highest offset counted and how many; merged sessions add theirs up.
#[test]
fn rows_carry_the_partitions_and_offsets_they_counted() {
    let c = contract("max_delay = \"30s\"", "type = \"session\"\ngap = \"5s\"\nlate = \"discard\"", "");
    let mut engine = Engine::new(&c, Mode::Stream, 2).unwrap();
    let mut out = Output::default();
    // (partition, offset, event): two sessions of `a`, then an event joining them.
    let events = [
        (0, 10, ev("a", 1, "1", "1")),
        (1, 3, ev("a", 2, "2", "1")),
        (0, 11, ev("b", 2, "3", "1")),
        (1, 7, ev("a", 12, "4", "1")),
        (0, 15, ev("a", 9, "5", "1")),
        (1, 9, ev("a", 6, "6", "1")),
    ];
    for (partition, offset, e) in &events {
        engine.process(EventIn { partition: *partition, offset: *offset, bytes: e.as_bytes() }, &mut out);
    }
    engine.finish(&mut out);
    let shown: Vec<String> = out
        .rows
        .iter()
        .map(|r| {
            let sources: Vec<String> = r
                .sources
                .iter()
                .map(|s| format!("p{}:{}-{}x{}", s.partition, s.first_offset, s.last_offset, s.events))
                .collect();
            format!("{} {}", show_row(r), sources.join(" "))
        })
        .collect();
    assert_eq!(
        shown,
        [
            "b [2,7) settled#1 events=1 late=0 {1,1} p0:11-11x1",
            "a [1,17) settled#1 events=5 late=0 {5,5} p0:10-15x2 p1:3-9x3",
        ]
    );
}

/// An engine reading one partition numbered 3 (a worker's share of a Kafka
/// topic) closes windows on that partition's watermark and keeps the number
/// in its ledger and sources.
#[test]
fn one_partition_of_a_topic_closes_windows_on_its_own_watermark() {
    let c = contract("", &format!("{TUMBLING_10S}\nlate = \"discard\""), "");
    let mut engine = Engine::new(&c, Mode::Stream, 1).unwrap();
    engine.read_one_partition();
    let mut out = Output::default();
    for (offset, e) in [(40, ev("a", 1, "1", "2")), (41, ev("a", 12, "2", "3")), (42, ev("a", 3, "3", "1"))] {
        engine.process(EventIn { partition: 3, offset, bytes: e.as_bytes() }, &mut out);
    }
    let rows: Vec<String> = out.rows.iter().map(show_row).collect();
    assert_eq!(rows, ["a [0,10) settled#1 events=1 late=0 {1,2}"]);
    assert_eq!((out.rows[0].sources[0].partition, out.rows[0].sources[0].first_offset), (3, 40));
    assert_eq!((out.ledger[0].partition, out.ledger[0].offset, out.ledger[0].reason.as_str()), (3, 42, "too_late"));
    assert_eq!(engine.partition_watermarks(), [Some(12_000)]);
}

#[test]
fn events_past_the_limits_go_to_the_ledger_as_over_limit() {
    let c = contract(
        "",
        &format!("{TUMBLING_10S}\nlate = \"discard\""),
        "[limits]\nmax_depth = 3\nmax_fields = 8\nmax_key_bytes = 4\nmax_keys = 2\nmax_open_windows = 3",
    );
    let events: Vec<String> = [
        // Within every limit: two keys, two windows of `a`.
        ev("a", 1, "1", "1"),
        ev("b", 2, "2", "1"),
        // Nesting: the root object, `x` and `y` are three levels; `z` is a fourth.
        r#"{"k":"a","t":3000,"id":"3","x":{"y":{"z":[]}}}"#.to_owned(),
        r#"{"k":"a","t":3000,"id":"4","x":{"y":{}}}"#.to_owned(),
        // Values: the root and its members count, nested ones too.
        r#"{"k":"a","t":3000,"id":"5","x":[1,2,3,4]}"#.to_owned(),
        // Key length: "abcde" is five bytes.
        ev("abcde", 3, "6", "1"),
        // A third key would open a third key's window.
        ev("c", 4, "7", "1"),
        // A second window for `a` is the third window open.
        ev("a", 12, "8", "1"),
        // A fourth window is past max_open_windows; `b` already has one in [10,20) after the next.
        ev("b", 13, "9", "1"),
        ev("b", 14, "10", "1"),
    ]
    .to_vec();
    check(
        &c,
        &events,
        &[
            "a [0,10) settled#1 events=2 late=0 {2,1}",
            "b [0,10) settled#1 events=1 late=0 {1,1}",
            "a [10,20) settled#1 events=1 late=0 {1,1}",
            "b [10,20) settled#1 events=2 late=0 {2,2}",
        ],
        &["3 over_limit", "5 over_limit", "6 over_limit", "7 over_limit"],
    );
    // The detail names the limit and what to do.
    let mut engine = Engine::new(&c, Mode::Stream, 1).unwrap();
    let mut out = Output::default();
    for (i, e) in events.iter().enumerate() {
        engine.process(EventIn { partition: 0, offset: i as u64 + 1, bytes: e.as_bytes() }, &mut out);
    }
    let details: Vec<&str> = out.ledger.iter().map(|l| l.detail.as_str()).collect();
    assert!(details[0].contains("nested deeper than max_depth = 3") && details[0].contains("[limits]"), "{details:?}");
    assert!(details[1].contains("more than max_fields = 8 values"), "{details:?}");
    assert!(details[2].contains("key is 5 bytes, over max_key_bytes = 4"), "{details:?}");
    assert!(details[3].contains("past max_keys = 2"), "{details:?}");
    assert_eq!(engine.counters().ledger[Reason::OverLimit.index()], 4);
    // A batch is bounded by its range, not by the window limits.
    let batch = run_mode(&c, Mode::Batch, &events, true);
    assert_eq!(batch.ledger, ["3 over_limit", "5 over_limit", "6 over_limit"]);
}

#[test]
fn the_open_window_limit_refuses_an_event_whole() {
    // A hopping event needing two new windows past the limit counts in none.
    let c = contract(
        "",
        "type = \"hopping\"\nsize = \"10s\"\nslide = \"5s\"\nlate = \"discard\"",
        "[limits]\nmax_open_windows = 3",
    );
    check(
        &c,
        &[ev("a", 7, "1", "1"), ev("b", 8, "2", "1"), ev("a", 9, "3", "1")],
        &["a [0,10) settled#1 events=2 late=0 {2,2}", "a [5,15) settled#1 events=2 late=0 {2,2}"],
        &["2 over_limit"],
    );
    // Sessions: a new session is a new window; joining one is not. A
    // window is open until the watermark settles it, after the event that
    // moved the watermark (step 9): `b` at 20 finds `a`'s session still
    // open, and is refused, but moves the watermark; `b` at 21 counts.
    let c = contract("", "type = \"session\"\ngap = \"5s\"\nlate = \"discard\"", "[limits]\nmax_open_windows = 1");
    check(
        &c,
        &[
            ev("a", 1, "1", "1"),
            ev("b", 2, "2", "1"),
            ev("a", 3, "3", "1"),
            ev("b", 20, "4", "1"),
            ev("b", 21, "5", "1"),
        ],
        &["a [1,8) settled#1 events=2 late=0 {2,2}", "b [21,26) settled#1 events=1 late=0 {1,1}"],
        &["2 over_limit", "4 over_limit"],
    );
    // Global windows: one per key, so the key limit is the window limit.
    let c = contract("", "type = \"global\"", "[limits]\nmax_keys = 1");
    let got = run_mode(&c, Mode::Stream, &[ev("a", 1, "1", "1"), ev("b", 2, "2", "1"), ev("a", 3, "3", "1")], true);
    assert_eq!(got.ledger, ["2 over_limit"]);
}

#[test]
fn limits_survive_a_snapshot() {
    let c = contract("", &format!("{TUMBLING_10S}\nlate = \"discard\""), "[limits]\nmax_keys = 1");
    let mut engine = Engine::new(&c, Mode::Stream, 1).unwrap();
    let mut out = Output::default();
    engine.process(EventIn { partition: 0, offset: 1, bytes: ev("a", 1, "1", "1").as_bytes() }, &mut out);
    let mut restored = Engine::restore(&c, &engine.snapshot()).unwrap();
    restored.process(EventIn { partition: 0, offset: 2, bytes: ev("b", 2, "2", "1").as_bytes() }, &mut out);
    restored.process(EventIn { partition: 0, offset: 3, bytes: ev("a", 3, "3", "1").as_bytes() }, &mut out);
    assert_eq!(out.ledger.iter().map(|l| l.offset).collect::<Vec<_>>(), [2]);
    // `b` at 15 is refused too, but moves the watermark past `a`'s window:
    // once it settles, its key is forgotten and `b` has room.
    restored.process(EventIn { partition: 0, offset: 4, bytes: ev("b", 15, "4", "1").as_bytes() }, &mut out);
    restored.process(EventIn { partition: 0, offset: 5, bytes: ev("b", 16, "5", "1").as_bytes() }, &mut out);
    let reasons: Vec<(u64, &str)> = out.ledger.iter().map(|l| (l.offset, l.reason.as_str())).collect();
    assert_eq!(reasons, [(2, "over_limit"), (4, "over_limit")]);
    assert_eq!(out.rows.iter().map(|r| r.events).collect::<Vec<_>>(), [2]);
    restored.finish(&mut out);
    assert_eq!(out.rows.iter().map(|r| r.events).collect::<Vec<_>>(), [2, 1]);
}

// SPEC.md 3.1 step 3: the rule comes first.

#[test]
fn the_rule_comes_before_any_field_so_other_kinds_are_filtered_and_move_the_watermark() {
    let c = contract(
        "where = 'kind == \"bid\"'",
        &format!("{TUMBLING_10S}\nlate = \"discard\""),
        "[dedup]\nhorizon = \"1m\"",
    );
    let events: Vec<String> = [
        r#"{"kind":"bid","k":"a","t":1000,"id":"1","amount":2}"#,
        // Another kind without a key, an id or an amount: filtered, not ledgered,
        // and its time closes [0,10).
        r#"{"kind":"person","t":12000,"name":"x"}"#,
        // Another kind whose time is unreadable: filtered all the same.
        r#"{"kind":"auction","t":"soon"}"#,
        // A bid without a key: the rule passed, so the fields are required.
        r#"{"kind":"bid","t":13000,"id":"2","amount":1}"#,
        // No kind at all: the rule cannot be evaluated.
        r#"{"k":"a","t":14000,"id":"3"}"#,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let run = run_mode(&c, Mode::Stream, &events, false);
    assert_eq!(run.rows, ["a [0,10) settled#1 events=1 late=0 {1,2}"]);
    assert_eq!(run.ledger, ["4 missing_field", "5 rule_error"]);
}

#[test]
fn an_aggregates_rule_is_evaluated_after_the_fields() {
    let text = format!(
        "{HEAD}\n[source]\ntopic = \"t\"\nevent_time = \"t\"\nkey = [\"k\"]\n[window]\n{TUMBLING_10S}\n[[aggregate]]\nname = \"eur\"\nfn = \"count\"\nwhere = 'currency == \"EUR\"'\n"
    );
    let c = Contract::parse("test.toml", &text).unwrap();
    // Both lack the currency its rule reads; the first also lacks its key,
    // which step 4 finds before step 5 evaluates the aggregate's rule.
    let run = run_mode(&c, Mode::Stream, &[r#"{"t":1000}"#.into(), r#"{"k":"a","t":1000}"#.into()], true);
    assert_eq!(run.ledger, ["1 missing_field", "2 rule_error"]);
}

// SPEC.md 2: event-time formats.

fn timed(format: &str, zone: &str, times: &[&str]) -> Run {
    let extra = format!("event_time_format = \"{format}\"\nevent_time_zone = \"{zone}\"");
    let c = contract(&extra, &format!("{TUMBLING_10S}\nlate = \"discard\""), "");
    let events: Vec<String> =
        times.iter().enumerate().map(|(i, t)| format!(r#"{{"k":"a","t":{t},"id":"{i}","amount":1}}"#)).collect();
    run_mode(&c, Mode::Stream, &events, true)
}

#[test]
fn a_pattern_without_an_offset_reads_its_zone() {
    // 2026-11-29 01:00:05 in Berlin (CET, +01:00) is 00:00:05Z; 00:59:55 is 23:59:55Z the day before.
    let run = timed("%Y-%m-%d %H:%M:%S", "Europe/Berlin", &["\"2026-11-29 01:00:05\"", "\"2026-11-29 00:59:55\""]);
    assert_eq!(
        run.rows,
        ["a [1795910400,1795910410) settled#1 events=1 late=0 {1,1}"],
        "00:59:55 local fell behind the watermark of 01:00:05 local, in the window before"
    );
    assert_eq!(run.ledger, ["2 too_late [1795910390,1795910400)"]);
    // 02:30 on 2026-03-29 is skipped in Berlin (CET to CEST): the earlier
    // instant, 00:30Z; 02:30 on 2026-10-25 happens twice: the first, 00:30Z.
    let run = timed("%Y-%m-%d %H:%M", "Europe/Berlin", &["\"2026-03-29 02:30\"", "\"2026-10-25 02:30\""]);
    let spring = 1_774_744_200; // 2026-03-29T00:30:00Z
    let autumn = 1_792_888_200; // 2026-10-25T00:30:00Z
    assert_eq!(
        run.rows,
        [
            format!("a [{spring},{}) settled#1 events=1 late=0 {{1,1}}", spring + 10),
            format!("a [{autumn},{}) settled#1 events=1 late=0 {{1,1}}", autumn + 10)
        ]
    );
}

#[test]
fn epoch_units_read_integers_and_digit_strings_rounded_down() {
    let run = timed("epoch_s", "UTC", &["12", "\"13\"", "-1"]);
    assert_eq!(run.rows, ["a [10,20) settled#1 events=2 late=0 {2,2}"]);
    assert_eq!(run.ledger, ["3 too_late [-10,0)"]);
    let run = timed("epoch_us", "UTC", &["\"-1\"", "12999999"]);
    assert_eq!(run.rows, ["a [-10,0) settled#1 events=1 late=0 {1,1}", "a [10,20) settled#1 events=1 late=0 {1,1}"]);
    let run = timed("epoch_ns", "UTC", &["12999999999"]);
    assert_eq!(run.rows, ["a [10,20) settled#1 events=1 late=0 {1,1}"]);
}

#[test]
fn a_value_in_the_wrong_format_is_bad_type_quoting_it_and_the_format() {
    let extra = "event_time_format = \"%d/%m/%Y %H:%M:%S\"";
    let c = contract(extra, &format!("{TUMBLING_10S}\nlate = \"discard\""), "");
    let events = [
        r#"{"k":"a","t":"29/11/2026 00:00:05","id":"1","amount":1}"#,
        r#"{"k":"a","t":"2026-11-29T00:00:05Z","id":"2","amount":1}"#,
        r#"{"k":"a","t":1795910405000,"id":"3","amount":1}"#,
    ];
    let mut engine = Engine::new(&c, Mode::Stream, 1).unwrap();
    let mut out = Output::default();
    for (i, e) in events.iter().enumerate() {
        engine.process(EventIn { partition: 0, offset: i as u64 + 1, bytes: e.as_bytes() }, &mut out);
    }
    let details: Vec<(Reason, &str)> = out.ledger.iter().map(|l| (l.reason, l.detail.as_str())).collect();
    assert_eq!(details.len(), 2, "{details:?}");
    assert_eq!(details[0].0, Reason::BadType);
    assert!(
        details[0].1.contains("\"2026-11-29T00:00:05Z\"") && details[0].1.contains("%d/%m/%Y %H:%M:%S"),
        "{}",
        details[0].1
    );
    assert_eq!(details[1].0, Reason::BadType);
    assert!(details[1].1.contains("1795910405000") && details[1].1.contains("not a string"), "{}", details[1].1);
    let epoch = timed("epoch_s", "UTC", &["12.5", "\"1e3\"", "true"]);
    assert_eq!(epoch.ledger, ["1 bad_type", "2 bad_type", "3 bad_type"]);
}

// SPEC.md 3.3: corrections.

const CORRECT: &str = "[dedup]\nhorizon = \"1m\"\non_conflict = \"correct\"";

#[test]
fn a_correction_moves_to_another_window_and_revises_both() {
    let c = contract("", &format!("{TUMBLING_10S}\nallowed_lateness = \"20s\"\nlate = \"revise\""), CORRECT);
    check(
        &c,
        &[ev("a", 1, "1", "2"), ev("a", 11, "2", "3"), ev("a", 15, "1", "4")],
        &[
            "a [0,10) provisional#1 events=1 late=0 {1,2}",
            // The correction leaves [0,10) empty: a change is a change.
            "a [0,10) provisional#2 events=0 late=0 {0,null}",
            "a [0,10) settled#3 events=0 late=0 {0,null}",
            "a [10,20) settled#1 events=2 late=0 {2,7}",
        ],
        &["1 superseded by=3"],
    );
}

#[test]
fn a_correction_moves_to_another_key() {
    let c = contract("", &format!("{TUMBLING_10S}\nallowed_lateness = \"5s\"\nlate = \"hold\""), CORRECT);
    check(
        &c,
        &[ev("a", 1, "1", "2"), ev("a", 2, "2", "3"), ev("b", 1, "1", "2")],
        &["a [0,10) settled#1 events=1 late=0 {1,3}", "b [0,10) settled#1 events=1 late=0 {1,2}"],
        &["1 superseded by=3"],
    );
    // A key whose only version moved away before it published has no row.
    check(
        &c,
        &[ev("a", 1, "1", "2"), ev("b", 1, "1", "2")],
        &["b [0,10) settled#1 events=1 late=0 {1,2}"],
        &["1 superseded by=2"],
    );
}

#[test]
fn a_version_the_rule_filters_out_deletes_the_counted_one() {
    let c = contract(
        "where = '!has(status) || status != \"void\"'",
        &format!("{TUMBLING_10S}\nallowed_lateness = \"5s\"\nlate = \"hold\""),
        CORRECT,
    );
    let void = r#"{"id":"1","status":"void"}"#.to_string();
    check(
        &c,
        &[ev("a", 1, "1", "2"), ev("a", 2, "2", "3"), void.clone(), ev("a", 3, "1", "5"), void],
        &["a [0,10) settled#1 events=1 late=0 {1,3}"],
        // The id is forgotten: its next version counts anew and is deleted again.
        &["1 superseded by=3", "4 superseded by=5"],
    );
}

#[test]
fn a_correction_is_all_or_nothing_across_hopping_windows() {
    let c = contract("", "type = \"hopping\"\nsize = \"10s\"\nslide = \"5s\"\nlate = \"discard\"", CORRECT);
    check(
        &c,
        // 7 is in [0,10) and [5,15); at 12, [0,10) has closed, so its correction is refused whole.
        &[ev("a", 7, "1", "2"), ev("a", 12, "2", "3"), ev("a", 8, "1", "9")],
        &[
            "a [0,10) settled#1 events=1 late=0 {1,2}",
            "a [5,15) settled#1 events=2 late=0 {2,5}",
            "a [10,20) settled#1 events=1 late=0 {1,3}",
        ],
        &["3 too_late [0,10)"],
    );
    // The same when only the new version's window has closed.
    check(
        &c,
        &[ev("a", 12, "1", "2"), ev("a", 16, "2", "3"), ev("a", 4, "1", "9")],
        &[
            "a [5,15) settled#1 events=1 late=0 {1,2}",
            "a [10,20) settled#1 events=2 late=0 {2,5}",
            "a [15,25) settled#1 events=1 late=0 {1,3}",
        ],
        // 4 falls in [-5,5) and [0,10): the entry names the earliest-starting.
        &["3 too_late [-5,5)"],
    );
}

#[test]
fn a_correction_touches_only_the_windows_its_first_version_counts_in() {
    let c = contract(
        "",
        "type = \"hopping\"\nsize = \"10s\"\nslide = \"5s\"\nallowed_lateness = \"2s\"\nlate = \"revise\"",
        CORRECT,
    );
    check(
        &c,
        // At watermark 10, 4 is too late for [-5,5) and late in [0,10); its
        // correction to 8 touches [0,10) (where it counts) and [5,15), both
        // open, so it applies though [-5,5) has closed.
        &[ev("b", 10, "2", "1"), ev("a", 4, "1", "2"), ev("a", 8, "1", "5"), ev("z", 30, "9", "1")],
        &[
            "a [0,10) provisional#1 events=1 late=1 {1,2}",
            "a [0,10) provisional#2 events=1 late=1 {1,5}",
            "a [0,10) settled#3 events=1 late=1 {1,5}",
            "a [5,15) settled#1 events=1 late=0 {1,5}",
            "b [5,15) settled#1 events=1 late=0 {1,1}",
            "b [10,20) settled#1 events=1 late=0 {1,1}",
            "z [25,35) settled#1 events=1 late=0 {1,1}",
            "z [30,40) settled#1 events=1 late=0 {1,1}",
        ],
        &["2 too_late [-5,5)", "2 superseded by=3"],
    );
}

#[test]
fn a_version_too_late_everywhere_is_remembered_and_its_deletion_applies() {
    let c = contract(
        "where = '!has(status) || status != \"void\"'",
        "type = \"hopping\"\nsize = \"10s\"\nslide = \"5s\"\nallowed_lateness = \"2s\"\nlate = \"revise\"",
        CORRECT,
    );
    let void = r#"{"id":"1","status":"void"}"#.to_string();
    check(
        &c,
        // At watermark 20, 4 is too late for both its windows; the void
        // version deletes it all the same, and no row changes.
        &[ev("b", 20, "2", "1"), ev("a", 4, "1", "2"), void],
        &["b [15,25) settled#1 events=1 late=0 {1,1}", "b [20,30) settled#1 events=1 late=0 {1,1}"],
        &["2 too_late [-5,5)", "2 too_late [0,10)", "2 superseded by=3"],
    );
}

#[test]
fn a_refused_correction_of_a_version_that_counts_nowhere_names_the_new_window() {
    let c = contract(
        "",
        &format!(
            "{TUMBLING_10S}
allowed_lateness = \"2s\"\nlate = \"revise\""
        ),
        CORRECT,
    );
    check(
        &c,
        // At watermark 30, 4 counts nowhere; its correction to 15 would join
        // [10,20), closed too: refused, naming [10,20), not [0,10).
        &[ev("b", 30, "2", "1"), ev("a", 4, "1", "2"), ev("a", 15, "1", "5")],
        &["b [30,40) settled#1 events=1 late=0 {1,1}"],
        &["2 too_late [0,10)", "3 too_late [10,20)"],
    );
}

#[test]
fn an_identical_resend_is_still_a_duplicate_of_the_version_that_counts() {
    let c = contract("", &format!("{TUMBLING_10S}\nlate = \"discard\""), CORRECT);
    check(
        &c,
        &[ev("a", 1, "1", "2"), ev("a", 1, "1", "4"), ev("a", 1, "1", "4"), ev("a", 1, "1", "2")],
        &["a [0,10) settled#1 events=1 late=0 {1,2}"],
        // The resend of the first version differs from the one that counts: a correction back.
        &["1 superseded by=2", "3 duplicate first=2", "2 superseded by=4"],
    );
}

#[test]
fn a_correction_after_the_horizon_counts_as_a_new_event() {
    let c = contract(
        "",
        &format!("{TUMBLING_10S}\nlate = \"discard\""),
        "[dedup]\nhorizon = \"10s\"\non_conflict = \"correct\"",
    );
    check(
        &c,
        &[ev("a", 1, "1", "2"), ev("a", 25, "2", "3"), ev("a", 26, "1", "4")],
        &["a [0,10) settled#1 events=1 late=0 {1,2}", "a [20,30) settled#1 events=2 late=0 {2,7}"],
        &[],
    );
}

#[test]
fn a_late_correction_counts_as_late_where_it_lands() {
    let c = contract("", &format!("{TUMBLING_10S}\nallowed_lateness = \"20s\"\nlate = \"revise\""), CORRECT);
    check(
        &c,
        // 3 arrives late in [0,10); its correction at 4 is late there too, and
        // the correction moving it to [10,20) (not yet ended) is not.
        &[ev("a", 12, "2", "1"), ev("a", 3, "1", "2"), ev("a", 4, "1", "5"), ev("a", 14, "1", "6")],
        &[
            "a [0,10) provisional#1 events=1 late=1 {1,2}",
            "a [0,10) provisional#2 events=1 late=1 {1,5}",
            "a [0,10) provisional#3 events=0 late=0 {0,null}",
            "a [0,10) settled#4 events=0 late=0 {0,null}",
            "a [10,20) settled#1 events=2 late=0 {2,7}",
        ],
        &["2 superseded by=3", "3 superseded by=4"],
    );
}

#[test]
fn a_batch_counts_the_last_version_of_each_id() {
    let c = contract(
        "where = '!has(status) || status != \"void\"'",
        &format!("{TUMBLING_10S}\nlate = \"discard\""),
        CORRECT,
    );
    let events = [
        ev("a", 1, "1", "2"),
        ev("a", 25, "2", "3"),
        // Too late for a stream (its window closed at 25); a batch has no watermark.
        ev("a", 3, "1", "7"),
        r#"{"id":"2","status":"void"}"#.to_string(),
    ];
    let batch = run_mode(&c, Mode::Batch, &events, true);
    assert_eq!(batch.rows, ["a [0,10) settled#1 events=1 late=0 {1,7}"]);
    assert_eq!(batch.ledger, ["1 superseded by=3", "2 superseded by=4"]);
    let stream = run_mode(&c, Mode::Stream, &events, true);
    assert_eq!(stream.ledger, ["3 too_late [0,10)", "2 superseded by=4"]);
}

#[test]
fn corrections_survive_a_snapshot_and_deltas() {
    let c = contract(
        "where = '!has(status) || status != \"void\"'",
        &format!("{TUMBLING_10S}\nallowed_lateness = \"20s\"\nlate = \"revise\""),
        CORRECT,
    );
    let first = [ev("a", 1, "1", "2"), ev("a", 2, "2", "3"), ev("a", 11, "3", "1")];
    let then = [ev("b", 1, "1", "5"), r#"{"id":"2","status":"void"}"#.to_string(), ev("a", 2, "2", "3")];
    let whole = run_mode(&c, Mode::Stream, &[&first[..], &then[..]].concat(), true);
    let mut engine = Engine::new(&c, Mode::Stream, 1).unwrap();
    engine.track_changes();
    let mut out = Output::default();
    for (i, e) in first.iter().enumerate() {
        engine.process(EventIn { partition: 0, offset: i as u64 + 1, bytes: e.as_bytes() }, &mut out);
    }
    let d1 = engine.take_delta();
    engine.process(EventIn { partition: 0, offset: 4, bytes: then[0].as_bytes() }, &mut out);
    engine.process(EventIn { partition: 0, offset: 5, bytes: then[1].as_bytes() }, &mut out);
    let d2 = engine.take_delta();
    let mut windows = std::collections::BTreeMap::new();
    for (k, w) in d1.windows.into_iter().chain(d2.windows) {
        match w {
            Some(bytes) => windows.insert(k, bytes),
            None => windows.remove(&k),
        };
    }
    let mut from_parts = Engine::restore_parts(&c, &d2.header, windows, [d1.ids, d2.ids]).unwrap();
    let mut from_snapshot = Engine::restore(&c, &engine.snapshot()).unwrap();
    assert_eq!(from_parts.snapshot(), engine.snapshot());
    for restored in [&mut from_parts, &mut from_snapshot] {
        let mut rest = Output { rows: out.rows.clone(), ledger: out.ledger.clone() };
        restored.process(EventIn { partition: 0, offset: 6, bytes: then[2].as_bytes() }, &mut rest);
        restored.finish(&mut rest);
        let shown: Vec<String> = rest.rows.iter().map(show_row).collect();
        assert_eq!(shown, whole.rows);
        assert_eq!(rest.ledger.len(), whole.ledger.len());
    }
}

/// SPEC.md 3.1 steps 4 and 8: with `max_future`, an event time further ahead
/// of the processing clock than that is ledgered `future`, counts nowhere
/// and moves no watermark, whichever step would have refused it later; a
/// filtered event that far ahead moves none either.
#[test]
fn an_event_dated_next_year_neither_settles_windows_nor_makes_later_events_late() {
    let year = 366 * 86_400;
    let c = contract("max_future = \"5m\"\nwhere = 'amount != 0'", &format!("{TUMBLING_10S}\nlate = \"discard\""), "");
    let mut engine = Engine::new(&c, Mode::Stream, 1).unwrap();
    engine.set_clock(20_000); // the processing clock: t = 20 s
    let mut out = Output::default();
    let events = [
        ev("a", 1, "1", "2"),
        ev("a", year, "2", "100"),                             // next year: future
        r#"{"t":31622400000,"id":"3","amount":1}"#.to_owned(), // next year, no key: future first
        ev("a", year, "4", "0"),                               // filtered, and moves nothing
        ev("a", 5, "5", "3"),                                  // not late: the watermark is still 1 s
        ev("a", 320, "6", "1"),                                // 300 s ahead exactly: not future
    ];
    for (i, e) in events.iter().enumerate() {
        engine.process(EventIn { partition: 0, offset: i as u64 + 1, bytes: e.as_bytes() }, &mut out);
    }
    let ledger: Vec<(u64, &str)> = out.ledger.iter().map(|l| (l.offset, l.reason.as_str())).collect();
    assert_eq!(ledger, [(2, "future"), (3, "future")]);
    assert_eq!(out.ledger[0].event_time, Some(year * 1000));
    assert!(out.ledger[0].detail.contains("max_future = 5m"), "{}", out.ledger[0].detail);
    assert_eq!(engine.counters().ledger[Reason::Future.index()], 2);
    assert_eq!(engine.counters().counted, 3);
    // Only the event at 320 s moved the watermark past [0,10): one settled row with both payments.
    assert_eq!(engine.watermark(), Some(320_000));
    let rows: Vec<String> = out.rows.iter().map(show_row).collect();
    assert_eq!(rows, ["a [0,10) settled#1 events=2 late=0 {2,5}"]);

    // Without a clock told, or without max_future, the same event moves the watermark.
    for (c, clock) in [(c.clone(), None), (contract("", TUMBLING_10S, ""), Some(20_000))] {
        let mut engine = Engine::new(&c, Mode::Stream, 1).unwrap();
        if let Some(now) = clock {
            engine.set_clock(now);
        }
        let mut out = Output::default();
        engine.process(EventIn { partition: 0, offset: 1, bytes: ev("a", year, "2", "1").as_bytes() }, &mut out);
        engine.process(EventIn { partition: 0, offset: 2, bytes: ev("a", 5, "5", "3").as_bytes() }, &mut out);
        let reasons: Vec<&str> = out.ledger.iter().map(|l| l.reason.as_str()).collect();
        assert_eq!(reasons, ["too_late"]);
    }
}

#[test]
fn future_counts_survive_a_snapshot() {
    let c = contract("max_future = \"0s\"", TUMBLING_10S, "");
    let mut engine = Engine::new(&c, Mode::Stream, 1).unwrap();
    engine.set_clock(1_000);
    let mut out = Output::default();
    engine.process(EventIn { partition: 0, offset: 1, bytes: ev("a", 2, "1", "1").as_bytes() }, &mut out);
    assert_eq!(out.ledger[0].reason, Reason::Future);
    let restored = Engine::restore(&c, &engine.snapshot()).unwrap();
    assert_eq!(restored.counters().ledger[Reason::Future.index()], 1);
    assert_eq!(restored.watermark(), None);
}

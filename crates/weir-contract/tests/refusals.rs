//! Every refusal of SPEC.md section 2 names the file, the line, the key and
//! what to do. `check(contract, line, key, words)` is one case per line.

use proptest::prelude::*;
use weir_contract::{typed_columns, Contract, DestinationKind, LatePolicy, TableMode, WindowKind};

const GOOD: &str = r#"[pipeline]
name = "paid_revenue"
version = 1
owner = "billing-ops"
steward = "data-platform"
decision = "Unlock paid features"

[source]
topic = "payments"
event_time = "approved_at"
key = ["account_id"]
event_id = "payment_id"
where = 'status == "approved"'
max_delay = "30s"

[window]
type = "tumbling"
size = "1m"
allowed_lateness = "2m"
late = "revise"

[dedup]
horizon = "10m"

[[aggregate]]
name = "revenue"
fn = "sum"
field = "amount"

[[aggregate]]
name = "payments"
fn = "count"
"#;

/// Replaces the first line that starts with `from` (or appends `to` when `from` is empty).
fn edit(from: &str, to: &str) -> String {
    if from.is_empty() {
        return format!("{GOOD}{to}\n");
    }
    let mut done = false;
    GOOD.lines()
        .map(|line| {
            if !done && line.starts_with(from) {
                done = true;
                to.to_owned()
            } else {
                line.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn check(text: &str, line: Option<usize>, key: &str, words: &str) {
    let errors = Contract::parse("c.toml", text).expect_err("must be refused").0;
    let found = errors.iter().find(|e| e.key == key).unwrap_or_else(|| panic!("no error for `{key}`: {errors:?}"));
    assert_eq!(found.file, "c.toml");
    assert_eq!(found.line, line, "{found}");
    assert!(found.message.contains(words), "{found}");
    let place = match line {
        Some(line) => format!("c.toml:{line}: "),
        None => "c.toml: ".to_owned(),
    };
    assert!(found.to_string().starts_with(&place), "{found}");
}

#[test]
fn the_good_contract_parses() {
    let c = Contract::parse("c.toml", GOOD).unwrap();
    assert_eq!(c.pipeline.name, "paid_revenue");
    assert_eq!(c.window.kind, WindowKind::Tumbling { size_ms: 60_000 });
    assert_eq!(c.window.late, LatePolicy::Revise);
    assert_eq!(c.dedup.map(|d| d.horizon_ms), Some(600_000));
    assert_eq!(c.aggregates.len(), 2);
    let summary = c.summary();
    for words in
        ["paid_revenue v1", "account_id", "tumbling, 1m", "revise", "payment_id", "billing-ops", "Unlock paid features"]
    {
        assert!(summary.contains(words), "{words}: {summary}");
    }
}

#[test]
fn alerts_parse_and_bad_ones_are_refused() {
    let text = edit("", "[alerts]\nmax_lag = \"30s\"\nmax_watermark_age = \"2m\"\nmax_oldest_unprocessed = \"1m\"\nmax_ledger_rate = 0.01\nmax_destination_lag = \"10s\"\nwebhook = \"http://127.0.0.1:9/hook\"");
    let a = Contract::parse("c.toml", &text).unwrap().alerts.unwrap();
    assert_eq!(
        (a.max_lag_ms, a.max_watermark_age_ms, a.max_oldest_unprocessed_ms),
        (Some(30_000), Some(120_000), Some(60_000))
    );
    assert_eq!((a.max_ledger_rate, a.webhook.as_deref()), (Some(0.01), Some("http://127.0.0.1:9/hook")));
    assert_eq!(a.max_destination_lag_ms, Some(10_000));
    assert!(Contract::parse("c.toml", GOOD).unwrap().alerts.is_none());
    check(&edit("", "[alerts]\nmax_lags = \"30s\""), Some(34), "alerts.max_lags", "unknown key");
    check(&edit("", "[alerts]\nmax_lag = \"soon\""), Some(34), "alerts.max_lag", "");
    check(&edit("", "[alerts]\nmax_ledger_rate = 2"), Some(34), "alerts.max_ledger_rate", "from 0 to 1");
    check(&edit("", "[alerts]\nwebhook = \"ftp://x\""), Some(34), "alerts.webhook", "http://");
    check(&edit("", "[alerts]\nmax_corrected_windows = -1"), Some(34), "alerts.max_corrected_windows", "whole number");
    check(&edit("", "[alerts]\nmax_destination_lag = \"later\""), Some(34), "alerts.max_destination_lag", "");
}

#[test]
fn reconcile_parses_and_bad_values_are_refused() {
    let text = edit("", "[reconcile]\nevery = \"1h\"\ndelay = \"2h\"\n\n[alerts]\nmax_corrected_windows = 14");
    let c = Contract::parse("c.toml", &text).unwrap();
    let r = c.reconcile.unwrap();
    assert_eq!((r.every_ms, r.delay_ms, r.system_of_record), (Some(3_600_000), 7_200_000, None));
    assert_eq!(c.alerts.unwrap().max_corrected_windows, Some(14));
    assert!(Contract::parse("c.toml", GOOD).unwrap().reconcile.is_none());
    check(&edit("", "[reconcile]\nevery = \"0s\""), Some(34), "reconcile.every", "at least 10s");
    // Issue 42, finding 8: a run every millisecond is refused; 10 s is the floor.
    check(&edit("", "[reconcile]\nevery = \"1ms\""), Some(34), "reconcile.every", "at least 10s");
    check(&edit("", "[reconcile]\nevery = \"9999ms\""), Some(34), "reconcile.every", "at least 10s");
    let floor = Contract::parse("c.toml", &edit("", "[reconcile]\nevery = \"10s\"")).unwrap();
    assert_eq!(floor.reconcile.unwrap().every_ms, Some(10_000));
    check(&edit("", "[reconcile]\ndelay = \"2h\""), Some(34), "reconcile.delay", "every");
    check(&edit("", "[reconcile]\nevry = \"1h\""), Some(34), "reconcile.evry", "unknown key");
    let sor = |body: &str| edit("", &format!("[reconcile]\nevery = \"1h\"\n\n[reconcile.system_of_record]\n{body}"));
    let good = "query = \"SELECT 1\"\nmap = \"key.account_id=a,window_start=d,revenue=r\"\ntolerance = \"1%\"\nconnection = \"ledger\"";
    let r = Contract::parse("c.toml", &sor(good)).unwrap().reconcile.unwrap().system_of_record.unwrap();
    assert_eq!((r.query.as_str(), r.map.window_start.as_str(), r.connection.as_str()), ("SELECT 1", "d", "ledger"));
    // Issue 42, finding 2: the system of record is read through a connection
    // of weir.toml, never a URL kept in the contract.
    let no_connection = "query = \"SELECT 1\"\nmap = \"key.account_id=a,window_start=d,revenue=r\"";
    check(&sor(no_connection), Some(36), "reconcile.system_of_record.connection", "[connections.NAME] of weir.toml");
    let with_url = format!("{good}\nurl = \"postgres://reader:secret@db/billing\"");
    check(&sor(&with_url), Some(41), "reconcile.system_of_record.url", "a contract holds no URL");
    check(
        &sor("map = \"key.account_id=a,window_start=d,revenue=r\""),
        Some(36),
        "reconcile.system_of_record.query",
        "missing required key",
    );
    check(
        &sor("query = \"q\"\nmap = \"window_start=d,revenue=r\"\nconnection = \"c\""),
        Some(38),
        "reconcile.system_of_record.map",
        "key field `account_id` is not mapped",
    );
    check(
        &sor("query = \"q\"\nmap = \"key.account_id=a,window_start=d,revenue=r\"\ntolerance = \"some\"\nconnection = \"c\""),
        Some(39),
        "reconcile.system_of_record.tolerance",
        "percentage",
    );
}

#[test]
fn personal_fields_parse_and_may_not_reach_a_row() {
    let c = Contract::parse("c.toml", &edit("", "[privacy]\npersonal = [\"email\", \"card.last4\"]")).unwrap();
    let names: Vec<String> = c.personal.iter().map(ToString::to_string).collect();
    assert_eq!(names, ["email", "card.last4"]);
    assert!(c.summary().contains("personal   email, card.last4"), "{}", c.summary());
    assert!(Contract::parse("c.toml", GOOD).unwrap().personal.is_empty());
    // The key, the event time or an aggregated field personal (or inside a personal field): refused.
    check(
        &edit("", "[privacy]\npersonal = [\"account_id\"]"),
        Some(34),
        "privacy.personal",
        "source.key `account_id` is personal",
    );
    check(&edit("", "[privacy]\npersonal = [\"approved_at\"]"), Some(34), "privacy.personal", "event_time");
    check(&edit("", "[privacy]\npersonal = [\"amount\"]"), Some(34), "privacy.personal", "aggregate \"revenue\" field");
    let nested = edit("", "[privacy]\npersonal = [\"account\"]").replace("[\"account_id\"]", "[\"account.id\"]");
    check(&nested, Some(34), "privacy.personal", "personal names `account`");
    check(&edit("", "[privacy]\npersonal = \"email\""), Some(34), "privacy.personal", "list of field paths");
    check(&edit("", "[privacy]\npersonal = [\"a..b\"]"), Some(34), "privacy.personal", "segment is empty");
    check(&edit("", "[privacy]\nsecret = []"), Some(34), "privacy.secret", "unknown key");
    // The event id may be personal: it is masked where it is shown.
    assert!(Contract::parse("c.toml", &edit("", "[privacy]\npersonal = [\"payment_id\"]")).is_ok());
}

#[test]
fn refusals_name_file_line_key_and_fix() {
    check(&edit("owner", "ownr = \"x\""), Some(4), "pipeline.ownr", "unknown key");
    check(&edit("owner", "# no owner"), Some(1), "pipeline.owner", "missing required key");
    check(&edit("max_delay", "max_delay = \"30secs\""), Some(14), "source.max_delay", "unknown unit");
    check(&edit("max_delay", "max_delay = \"30\""), Some(14), "source.max_delay", "without a unit");
    check(&edit("max_delay", "max_future = \"soon\""), Some(14), "source.max_future", "");
    check(&edit("max_delay", "max_future = 5"), Some(14), "source.max_future", "");
    check(
        &edit("size", "size = \"7m\"\nslide = \"2m\"").replace("tumbling", "hopping"),
        Some(19),
        "window.slide",
        "does not divide",
    );
    check(&edit("late", "late = \"discard\""), Some(19), "window.allowed_lateness", "discard");
    check(&edit("event_id", "# no id"), Some(22), "dedup", "event_id");
    check(&edit("horizon", "horizon = \"2m\""), Some(23), "dedup.horizon", "at least \"3m\"");
    check(&edit("where", "where = 'status = \"approved\"'"), Some(13), "source.where", "does not parse");
    check(&edit("name = \"payments\"", "name = \"revenue\""), Some(31), "aggregate[2].name", "two aggregates");
    check(&edit("field", "# no field"), Some(25), "aggregate[1].field", "needs a field");
    check(&edit("type", "type = \"sliding\""), Some(17), "window.type", "tumbling, hopping, session or global");
    check(&edit("", "[output]\nkind = \"kafka\""), Some(33), "output", "unknown section");
    check(&edit("version", "version = 0"), Some(3), "pipeline.version", "at least 1");
    check(&edit("name = \"paid", "name = \"Paid Revenue\""), Some(2), "pipeline.name", "a-z, 0-9 and _");
    check(&edit("fn = \"sum\"", "fn = \"median\""), Some(27), "aggregate[1].fn", "not an aggregate");
    check(&edit("key", "key = \"account_id\""), Some(11), "source.key", "list of field paths");
    check("[pipeline\nname=1", Some(1), "(toml)", "not valid TOML");
    check(
        &edit("type", "type = \"session\"\ngap = \"0s\"").replace("size = \"1m\"", ""),
        Some(18),
        "window.gap",
        "longer than zero",
    );
}

#[test]
fn every_problem_is_reported_at_once() {
    let text = edit("owner", "ownr = \"x\"").replace("max_delay = \"30s\"", "max_delay = \"soon\"");
    let errors = Contract::parse("c.toml", &text).unwrap_err().0;
    assert!(errors.len() >= 3, "{errors:?}");
}

#[test]
fn late_policy_defaults_follow_lateness() {
    let c = Contract::parse("c.toml", &edit("late", "")).unwrap();
    assert_eq!(c.window.late, LatePolicy::Revise);
    let text = edit("late", "").replace("allowed_lateness = \"2m\"", "");
    let c = Contract::parse("c.toml", &text).unwrap();
    assert_eq!(c.window.late, LatePolicy::Discard);
}

proptest! {
    /// No text panics the parser; it is accepted or refused with reasons.
    #[test]
    fn any_text_is_accepted_or_refused(text in ".{0,400}") {
        if let Err(errors) = Contract::parse("fuzz.toml", &text) {
            prop_assert!(!errors.0.is_empty());
        }
    }

    /// Mutations of a good contract: accepted or refused with reasons, never a panic.
    #[test]
    fn mutated_contracts_are_accepted_or_refused(at in 0usize..GOOD.len(), cut in 0usize..40, insert in "[\\[\\]=\"'a-z0-9_ .\n]{0,20}") {
        let mut text = GOOD.to_owned();
        let at = (0..=at).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
        let end = (at + cut).min(text.len());
        let end = (end..=text.len()).find(|&i| text.is_char_boundary(i)).unwrap_or(text.len());
        text.replace_range(at..end, &insert);
        if let Err(errors) = Contract::parse("fuzz.toml", &text) {
            prop_assert!(errors.0.iter().all(|e| !e.message.is_empty()));
        }
    }
}

#[test]
fn a_source_kind_is_log_or_kafka() {
    let base = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../bench/paid_revenue.toml")).unwrap();
    let kafka = base.replacen("[source]\n", "[source]\nkind = \"kafka\"\ngroup = \"billing\"\n", 1);
    let c = weir_contract::Contract::parse("c.toml", &kafka).unwrap();
    assert_eq!((c.source.kind, c.source.group.as_deref()), (Some(weir_contract::SourceKind::Kafka), Some("billing")));
    let bad = base.replacen("[source]\n", "[source]\nkind = \"kinesis\"\n", 1);
    let err = weir_contract::Contract::parse("c.toml", &bad).unwrap_err().to_string();
    assert!(err.contains("`source.kind`") && err.contains("\"kinesis\" is not a source"), "{err}");
}

#[test]
fn a_sink_is_read_as_kafka_destinations() {
    use weir_contract::{DestinationKind, KafkaMode};
    let c = Contract::parse(
        "c.toml",
        &edit("", "[sink]\ntopic = \"paid_rows\"\nledger_topic = \"paid_ledger\"\nbrokers = \"b:9092\""),
    )
    .unwrap();
    let read: Vec<_> = c.destinations.iter().map(|d| (d.name.as_str(), d.kind.clone(), d.connection.clone())).collect();
    let kafka =
        |topic: &str, mode| DestinationKind::Kafka { topic: topic.into(), mode, brokers: Some("b:9092".into()) };
    assert_eq!(
        read,
        [
            ("sink", kafka("paid_rows", KafkaMode::Changes), None),
            ("sink_ledger", kafka("paid_ledger", KafkaMode::Ledger), None)
        ]
    );
    check(&edit("", "[sink]\nkind = \"kafka\""), Some(33), "sink.topic", "missing required key");
    check(&edit("", "[sink]\ntopic = \"t\"\nkind = \"kafka\""), Some(35), "sink.kind", "unknown key");
    check(&edit("", "[sink]\ntopic = \"a b\""), Some(34), "sink.topic", "not a Kafka topic name");
    let clash = edit("", "[sink]\ntopic = \"t\"\n\n[[destination]]\nname = \"sink\"\nkind = \"kafka\"\ntopic = \"u\"");
    check(&clash, Some(33), "sink", "has that name too");
}

#[test]
fn event_time_formats_and_zones_parse_and_bad_ones_are_refused() {
    use weir_contract::{EpochUnit, TimeFormat, Zone};
    let c = Contract::parse("c.toml", GOOD).unwrap();
    assert!(matches!(c.source.event_time_format, TimeFormat::Auto));
    assert_eq!(c.source.event_time_zone, Zone::Utc);
    let with = |format: &str, zone: &str| {
        edit(
            "event_time",
            &format!("event_time = \"approved_at\"\nevent_time_format = \"{format}\"\nevent_time_zone = \"{zone}\""),
        )
    };
    let c = Contract::parse("c.toml", &with("epoch_us", "UTC")).unwrap();
    assert!(matches!(c.source.event_time_format, TimeFormat::Epoch(EpochUnit::Micros)));
    let c = Contract::parse("c.toml", &with("%Y-%m-%d %H:%M:%S%.3f", "America/New_York")).unwrap();
    assert!(matches!(c.source.event_time_format, TimeFormat::Pattern(_)));
    assert_eq!(c.source.event_time_zone.name(), "America/New_York");
    assert!(c.summary().contains("%Y-%m-%d %H:%M:%S%.3f\", local times in America/New_York"), "{}", c.summary());
    check(&with("iso8601", "UTC"), Some(11), "source.event_time_format", "not an event time format");
    check(&with("%Y-%m-%d", "UTC"), Some(11), "source.event_time_format", "cannot yield a date and a time");
    check(&with("%H:%M:%S", "UTC"), Some(11), "source.event_time_format", "cannot yield a date and a time");
    check(&with("%Y-%m-%d %H:%M %Q", "UTC"), Some(11), "source.event_time_format", "does not know");
    check(&with("auto", "Mars/Olympus_Mons"), Some(12), "source.event_time_zone", "not a time zone");
    check(&with("auto", "utc"), Some(12), "source.event_time_zone", "IANA");
    check(
        &edit("event_time", "event_time = \"approved_at\"\nevent_time_format = 13"),
        Some(11),
        "source.event_time_format",
        "",
    );
}

#[test]
fn corrections_take_count_sum_and_avg_and_no_sessions() {
    use weir_contract::OnConflict;
    let correct = |text: &str| text.replace("horizon = \"10m\"", "horizon = \"10m\"\non_conflict = \"correct\"");
    let c = Contract::parse("c.toml", &correct(GOOD)).unwrap();
    assert_eq!(c.dedup.map(|d| d.on_conflict), Some(OnConflict::Correct));
    assert!(c.summary().contains("corrects the counted one"), "{}", c.summary());
    assert_eq!(Contract::parse("c.toml", GOOD).unwrap().dedup.map(|d| d.on_conflict), Some(OnConflict::Ledger));
    let avg = correct(GOOD).replace("fn = \"sum\"", "fn = \"avg\"");
    assert!(Contract::parse("c.toml", &avg).is_ok());
    // Line 24 is on_conflict.
    for func in ["min", "max", "count_distinct", "first", "last"] {
        let text = correct(GOOD).replace("fn = \"sum\"", &format!("fn = \"{func}\""));
        check(&text, Some(24), "dedup.on_conflict", &format!("aggregate `revenue` is {func}"));
    }
    let session = correct(GOOD).replace("type = \"tumbling\"\nsize = \"1m\"", "type = \"session\"\ngap = \"1m\"");
    check(&session, Some(24), "dedup.on_conflict", "session windows");
    check(
        &GOOD.replace("horizon = \"10m\"", "horizon = \"10m\"\non_conflict = \"upsert\""),
        Some(24),
        "dedup.on_conflict",
        "not a conflict policy",
    );
}

#[test]
fn named_checks_parse_and_bad_ones_are_refused_with_line_and_key() {
    use weir_contract::{CheckKind, Severity, VolumePeriod};
    let checks = "[[check]]\nname = \"revenue_not_negative\"\nseverity = \"error\"\nquestion = \"Negative?\"\nrow = \"values.revenue >= 0 && events > 0 && key.account_id != ''\"\n\n[[check]]\nname = \"fresh\"\nseverity = \"warn\"\nquestion = \"Stopped?\"\nfreshness = \"10m\"\n\n[[check]]\nname = \"steady\"\nseverity = \"warn\"\nquestion = \"Dropped?\"\nvolume = \"week\"\nband = \"30%\"\n\n[[check]]\nname = \"books\"\nseverity = \"error\"\nquestion = \"Do the books agree?\"\nreconcile = true";
    let c = Contract::parse("c.toml", &edit("", checks)).unwrap();
    let got: Vec<(&str, Severity, &str)> =
        c.checks.iter().map(|c| (c.name.as_str(), c.severity, c.kind.name())).collect();
    assert_eq!(
        got,
        [
            ("revenue_not_negative", Severity::Error, "row"),
            ("fresh", Severity::Warn, "freshness"),
            ("steady", Severity::Warn, "volume"),
            ("books", Severity::Error, "reconcile")
        ]
    );
    assert_eq!(c.checks[1].kind, CheckKind::Freshness { max_age_ms: 600_000 });
    assert_eq!(c.checks[2].kind, CheckKind::Volume { period: VolumePeriod::Week, band_percent: 30.0 });
    assert!(Contract::parse("c.toml", GOOD).unwrap().checks.is_empty());

    // Lines 33 on: [[check]], name, severity, question, then the kind.
    let one =
        |rest: &str| edit("", &format!("[[check]]\nname = \"x\"\nseverity = \"error\"\nquestion = \"q\"\n{rest}"));
    let row = |expr: &str| one(&format!("row = \"{expr}\""));
    check(&row("values.revenue >="), Some(37), "check[1].row", "does not parse");
    check(&row("values.refunds >= 0"), Some(37), "check[1].row", "values.revenue, values.payments");
    check(&row("amount > 0"), Some(37), "check[1].row", "not part of a row");
    check(&row("key.customer == 'x'"), Some(37), "check[1].row", "its key is key.account_id");
    check(&one("freshness = \"soon\""), Some(37), "check[1].freshness", "");
    check(&one("volume = \"month\"\nband = \"10%\""), Some(37), "check[1].volume", "\"day\" or \"week\"");
    check(&one("volume = \"day\"\nband = \"half\""), Some(38), "check[1].band", "percentage");
    check(&one("volume = \"day\""), Some(33), "check[1].band", "missing required key");
    check(&one("reconcile = false"), Some(37), "check[1].reconcile", "must be true");
    check(&one("row = \"events > 0\"\nfreshness = \"1m\""), Some(38), "check[1].freshness", "one kind");
    check(&one("freshness = \"1m\"\nband = \"5%\""), Some(38), "check[1].band", "volume check");
    check(&one(""), Some(33), "check[1]", "needs one of");
    check(&one("row = \"events > 0\"\nlimit = 3"), Some(38), "check[1].limit", "unknown key");
    let sev = edit("", "[[check]]\nname = \"x\"\nseverity = \"fatal\"\nquestion = \"q\"\nrow = \"events > 0\"");
    check(&sev, Some(35), "check[1].severity", "\"warn\"");
    let twice = format!(
        "{}\n[[check]]\nname = \"x\"\nseverity = \"warn\"\nquestion = \"q\"\nrow = \"events > 1\"",
        one("row = \"events > 0\"")
    );
    check(&twice, Some(40), "check[2].name", "names two checks");
}

#[test]
fn destinations_parse_with_their_typed_columns() {
    let text = format!(
        "{GOOD}\n[[destination]]\nname = \"accounts\"\nkind = \"http\"\nconnection = \"accounts_api\"\nbatch = 200\n\n[[destination]]\nname = \"warehouse\"\nkind = \"postgres\"\nconnection = \"dw\"\ntable = \"bi.paid\"\nmode = \"changes\"\n\n[[destination]]\nname = \"plain\"\nkind = \"postgres\"\nconnection = \"dw\"\n"
    );
    let c = Contract::parse("c.toml", &text).unwrap();
    let kinds: Vec<(&str, &str, usize)> =
        c.destinations.iter().map(|d| (d.name.as_str(), d.kind.as_str(), d.batch)).collect();
    assert_eq!(kinds, [("accounts", "http", 200), ("warehouse", "postgres", 1000), ("plain", "postgres", 1000)]);
    match &c.destinations[1].kind {
        DestinationKind::Postgres { table, mode } => {
            assert_eq!((table.quoted(), *mode), ("\"bi\".\"paid\"".to_owned(), TableMode::Changes));
        }
        other => panic!("{other:?}"),
    }
    match &c.destinations[2].kind {
        DestinationKind::Postgres { table, mode } => {
            assert_eq!((table.to_string(), *mode), ("paid_revenue".to_owned(), TableMode::Upsert));
        }
        other => panic!("{other:?}"),
    }
    let columns: Vec<(String, &str)> =
        typed_columns(&c.source, &c.aggregates).into_iter().map(|col| (col.name, col.sql.postgres())).collect();
    let expected = [
        ("account_id", "text"),
        ("window_start", "timestamptz"),
        ("window_end", "timestamptz"),
        ("revenue", "numeric"),
        ("payments", "bigint"),
        ("status", "text"),
        ("revision", "bigint"),
        ("version", "bigint"),
        ("events", "bigint"),
        ("late_events", "bigint"),
        ("as_of", "timestamptz"),
    ];
    assert_eq!(columns, expected.map(|(n, t)| (n.to_owned(), t)));
}

#[test]
fn bad_destinations_are_refused_with_their_line() {
    let d = |body: &str| format!("{GOOD}\n[[destination]]\n{body}\n");
    let line = GOOD.lines().count() + 3;
    check(
        &d("name = \"a\"\nkind = \"ftp\"\nconnection = \"c\""),
        Some(line + 1),
        "destination[1].kind",
        "not a destination kind",
    );
    check(&d("name = \"a\"\nkind = \"http\""), Some(line - 1), "destination[1].connection", "missing required key");
    check(
        &d("name = \"a\"\nkind = \"http\"\nconnection = \"c\"\nurl = \"http://x\""),
        Some(line + 3),
        "destination[1].url",
        "unknown key",
    );
    check(
        &d("name = \"a\"\nkind = \"http\"\nconnection = \"c\"\ntable = \"t\""),
        Some(line + 3),
        "destination[1].table",
        "only a postgres destination",
    );
    check(
        &d("name = \"a\"\nkind = \"kafka\"\nconnection = \"c\""),
        Some(line - 1),
        "destination[1].topic",
        "missing required key",
    );
    check(
        &d("name = \"a\"\nkind = \"kafka\"\nconnection = \"c\"\ntopic = \"a b\""),
        Some(line + 3),
        "destination[1].topic",
        "not a Kafka topic name",
    );
    check(
        &d("name = \"a\"\nkind = \"kafka\"\ntopic = \"t\"\nmode = \"upsert\""),
        Some(line + 3),
        "destination[1].mode",
        "not a kafka mode",
    );
    // A kafka destination without a connection goes to the pipeline's Kafka.
    let own = Contract::parse("c.toml", &d("name = \"rows\"\nkind = \"kafka\"\ntopic = \"t\"")).unwrap();
    assert_eq!(own.destinations[0].connection, None);
    assert_eq!(
        own.destinations[0].kind,
        weir_contract::DestinationKind::Kafka {
            topic: "t".into(),
            mode: weir_contract::KafkaMode::Live,
            brokers: None
        }
    );
    check(
        &d("name = \"a\"\nkind = \"postgres\"\nconnection = \"c\"\ntopic = \"t\""),
        Some(line + 3),
        "destination[1].topic",
        "only a kafka destination",
    );
    check(
        &d("name = \"a\"\nkind = \"postgres\"\nconnection = \"c\"\ntable = \"Bad-Name\""),
        Some(line + 3),
        "destination[1].table",
        "not a table weir can create",
    );
    check(
        &d("name = \"a\"\nkind = \"postgres\"\nconnection = \"c\"\nmode = \"append\""),
        Some(line + 3),
        "destination[1].mode",
        "not a mode",
    );
    check(
        &d("name = \"a\"\nkind = \"http\"\nconnection = \"c\"\nbatch = 0"),
        Some(line + 3),
        "destination[1].batch",
        "from 1 to 10000",
    );
    let twice = format!("{GOOD}\n[[destination]]\nname = \"a\"\nkind = \"http\"\nconnection = \"c\"\n\n[[destination]]\nname = \"a\"\nkind = \"http\"\nconnection = \"c\"\n");
    check(&twice, Some(line + 5), "destination[2].name", "names two destinations");
    // An aggregate named like one of the table's own columns.
    let clash = format!(
        "{}\n[[destination]]\nname = \"a\"\nkind = \"postgres\"\nconnection = \"c\"\n",
        GOOD.replace("name = \"payments\"", "name = \"events\"")
    );
    check(&clash, Some(line - 1), "destination[1]", "aggregate `events` would be the table's column `events`");
}

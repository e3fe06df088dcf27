//! Tokens, roles and the audit log against a real `weir serve`: every
//! endpoint with every role (a table: role x endpoint -> status), tokens
//! made, listed, expired and revoked with `weir token`, refusals counted in
//! `/metrics`, raw payloads only for raw-readers, and `weir audit verify`
//! finding the entry where a tampered audit log breaks.

mod common;

use std::time::{Duration, Instant};

use common::{make_token, start, text, weir, Scratch};
use serde_json::Value;

const CONTRACT: &str = r#"
[pipeline]
name = "paid"
version = 1
owner = "billing-ops"
steward = "data-platform"
decision = "Unlock paid features"

[source]
topic = "payments"
event_time = "t"
key = ["acct"]
event_id = "id"
max_delay = "0s"

[window]
type = "tumbling"
size = "1m"
allowed_lateness = "0s"
late = "discard"

[[aggregate]]
name = "total"
fn = "sum"
field = "amount"
"#;

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).build().into()
}

/// One request; `token` as the bearer token when given.
fn call(method: &str, url: &str, token: Option<&str>, body: Option<&str>) -> (u16, String) {
    let a = agent();
    let bearer = token.map(|t| format!("Bearer {t}"));
    let answer = match (method, body) {
        ("POST", b) => {
            let mut r = a.post(url);
            if let Some(h) = &bearer {
                r = r.header("authorization", h);
            }
            r.send(b.unwrap_or(""))
        }
        ("DELETE", _) => {
            let mut r = a.delete(url);
            if let Some(h) = &bearer {
                r = r.header("authorization", h);
            }
            r.call()
        }
        _ => {
            let mut r = a.get(url);
            if let Some(h) = &bearer {
                r = r.header("authorization", h);
            }
            r.call()
        }
    };
    let mut r = answer.unwrap();
    (r.status().as_u16(), r.body_mut().with_config().limit(1 << 30).read_to_string().unwrap_or_default())
}

fn event(id: u32, acct: u32, t_s: i64, amount: &str) -> String {
    let t = weir_engine::time::format_rfc3339_ms(1_764_374_400_000 + t_s * 1_000);
    format!(r#"{{"id":"p{id}","acct":"a{acct}","t":"{t}","amount":{amount},"email":"a{acct}@example.com"}}"#)
}

struct Setup {
    _s: Scratch,
    _server: common::Server,
    base: String,
    data: std::path::PathBuf,
}

fn serve(name: &str, config: &str) -> Setup {
    let s = Scratch::new(name);
    std::fs::create_dir_all(s.path("contracts")).unwrap();
    s.write("contracts/paid.toml", CONTRACT);
    s.write(
        "contracts/other.toml",
        &CONTRACT.replace("name = \"paid\"", "name = \"other\"").replace("\"payments\"", "\"refunds\""),
    );
    s.write("weir.toml", config);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let server = start(&s.0, port);
    let data = s.path("data");
    Setup { _s: s, _server: server, base: format!("http://127.0.0.1:{port}"), data }
}

/// The statuses each role gets, in this order.
const ROLES: [&str; 7] = ["none", "producer", "reader", "raw-reader", "operator", "admin", "reader-of-other"];

#[test]
fn every_role_against_every_endpoint() {
    let st = serve("access-table", "[topics.payments]\npartitions = 1\n");
    let (base, data) = (&st.base, &st.data);
    let tokens: Vec<Option<String>> = vec![
        None,
        Some(make_token(data, &["--role", "producer", "--topic", "payments"])),
        Some(make_token(data, &["--role", "reader", "--pipeline", "paid"])),
        Some(make_token(data, &["--role", "raw-reader", "--topic", "payments"])),
        Some(make_token(data, &["--role", "operator", "--pipeline", "paid"])),
        Some(make_token(data, &["--role", "admin"])),
        Some(make_token(data, &["--role", "reader", "--pipeline", "other"])),
    ];
    let (producer, reader, raw, admin) =
        (tokens[1].as_deref(), tokens[2].as_deref(), tokens[3].as_deref(), tokens[5].as_deref());
    // A row to ask the provenance of, and an entry in the ledger with its payload.
    let lines = [
        event(1, 1, 0, "2.00"),
        event(2, 1, 10, "3.00"),
        event(3, 2, 200, "1.00"),
        "{\"acct\":\"a9\",\"t\":\"soon\"}".into(),
    ];
    let (code, answer) =
        call("POST", &format!("{base}/v1/topics/payments/events"), producer, Some(&(lines.join("\n") + "\n")));
    assert_eq!(code, 200, "{answer}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !call("GET", &format!("{base}/v1/pipelines/paid/changes"), reader, None).1.contains("\"seq\":1") {
        assert!(Instant::now() < deadline, "no row published");
        std::thread::sleep(Duration::from_millis(100));
    }
    // A token for admins to revoke in the table.
    let spare = make_token(data, &["--role", "reader", "--pipeline", "paid"]);
    let spare_id = spare.split('_').nth(1).unwrap().to_owned();

    let p = "/v1/pipelines/paid";
    let why = r#"{"why":"table test"}"#;
    let promote = r#"{"version":1,"why":"table test"}"#;
    let backfill = r#"{"from":"2025-11-29T00:00:00Z","to":"2099-01-01T00:00:00Z","why":"table test"}"#;
    let note = r#"{"from":"2025-11-29T00:00:00Z","to":"2025-11-29T00:01:00Z","note":"table test"}"#;
    let incident = r#"{"title":"table test"}"#;
    let incident_note = r#"{"note":"table test"}"#;
    let proof = r#"{"why":"table test","proof":"table test"}"#;
    let new_token = r#"{"role":"reader","name":"carol","pipelines":["paid"],"expires":"1h"}"#;
    let event_line = event(10, 3, 300, "1.00") + "\n";
    let revoke = format!("/v1/tokens/{spare_id}");
    #[rustfmt::skip]
    let table: Vec<(&str, String, Option<&str>, [u16; 7])> = vec![
        //                                                        none prod read raw  oper admin other
        ("GET",    "/".into(),                          None,     [200, 200, 200, 200, 200, 200, 200]),
        ("GET",    "/healthz".into(),                   None,     [200, 200, 200, 200, 200, 200, 200]),
        ("GET",    "/readyz".into(),                    None,     [200, 200, 200, 200, 200, 200, 200]),
        ("POST",   "/v1/topics/payments/events".into(), Some(&event_line), [401, 200, 403, 403, 403, 403, 403]),
        ("POST",   "/v1/topics/refunds/events".into(),  Some(&event_line), [401, 403, 403, 403, 403, 403, 403]),
        ("GET",    "/v1/topics/payments/events".into(), None,     [401, 403, 403, 200, 403, 403, 403]),
        ("GET",    "/v1/topics/refunds/events".into(),  None,     [401, 403, 403, 403, 403, 403, 403]),
        ("GET",    "/v1/pipelines".into(),              None,     [401, 403, 200, 200, 200, 200, 200]),
        ("GET",    format!("{p}/results"),              None,     [401, 403, 200, 403, 200, 200, 403]),
        ("GET",    format!("{p}/results/1/provenance"), None,     [401, 403, 200, 403, 200, 200, 403]),
        ("GET",    format!("{p}/changes"),              None,     [401, 403, 200, 403, 200, 200, 403]),
        ("GET",    format!("{p}/status"),               None,     [401, 403, 200, 403, 200, 200, 403]),
        ("GET",    format!("{p}/contract"),             None,     [401, 403, 200, 403, 200, 200, 403]),
        ("GET",    format!("{p}/ledger"),               None,     [401, 403, 200, 200, 200, 200, 403]),
        ("GET",    format!("{p}/annotations"),          None,     [401, 403, 200, 403, 200, 200, 403]),
        ("POST",   format!("{p}/annotations"),          Some(note), [401, 403, 403, 403, 200, 403, 403]),
        ("POST",   format!("{p}/pause"),                Some(why), [401, 403, 403, 403, 200, 403, 403]),
        ("POST",   format!("{p}/resume"),               Some(why), [401, 403, 403, 403, 200, 403, 403]),
        ("POST",   format!("{p}/replay"),               Some(why), [401, 403, 403, 403, 202, 403, 403]),
        // No such destination (404 names where destinations come from).
        ("POST",   format!("{p}/destinations/crm/resume"), Some(why), [401, 403, 403, 403, 404, 403, 403]),
        ("GET",    format!("{p}/versions"),             None,     [401, 403, 200, 403, 200, 200, 403]),
        // One version: nothing to compare, nothing to promote or roll back to (409 says why).
        ("GET",    format!("{p}/diff"),                 None,     [401, 403, 409, 403, 409, 409, 403]),
        ("POST",   format!("{p}/promote"),              Some(promote), [401, 403, 403, 403, 409, 403, 403]),
        ("POST",   format!("{p}/rollback"),             Some(why), [401, 403, 403, 403, 409, 403, 403]),
        // Windows up to 2099 have not settled (409 says so).
        ("POST",   format!("{p}/backfill"),             Some(backfill), [401, 403, 403, 403, 409, 403, 403]),
        ("GET",    format!("{p}/backfills"),            None,     [401, 403, 200, 403, 200, 200, 403]),
        ("GET",    format!("{p}/backfills/999"),        None,     [401, 403, 404, 403, 404, 404, 403]),
        // An export the mapping cannot read (400 names the line and column).
        ("POST",   format!("{p}/reconcile?why=t&map=key.acct=a,window_start=w,total=t"), Some("a,w\n1,2\n"), [401, 403, 403, 403, 400, 403, 403]),
        ("GET",    format!("{p}/reconciliations"),      None,     [401, 403, 200, 403, 200, 200, 403]),
        ("GET",    format!("{p}/reconciliations/999"),  None,     [401, 403, 404, 403, 404, 404, 403]),
        ("GET",    format!("{p}/advice"),               None,     [401, 403, 200, 403, 200, 200, 403]),
        ("GET",    format!("{p}/checks"),               None,     [401, 403, 200, 403, 200, 200, 403]),
        ("POST",   format!("{p}/incidents"),            Some(incident), [401, 403, 403, 403, 201, 403, 403]),
        ("GET",    format!("{p}/incidents"),            None,     [401, 403, 200, 403, 200, 200, 403]),
        ("GET",    format!("{p}/incidents/1"),          None,     [401, 403, 200, 403, 200, 200, 403]),
        ("GET",    format!("{p}/incidents/999"),        None,     [401, 403, 404, 403, 404, 404, 403]),
        ("POST",   format!("{p}/incidents/1/notes"),    Some(incident_note), [401, 403, 403, 403, 200, 403, 403]),
        ("POST",   format!("{p}/incidents/1/mitigate"), Some(why), [401, 403, 403, 403, 200, 403, 403]),
        ("POST",   format!("{p}/incidents/1/resolve"),  Some(proof), [401, 403, 403, 403, 200, 403, 403]),
        // A scenario that does not exist (400 lists the scenarios).
        ("POST",   format!("{p}/drills"),               Some(r#"{"scenario":"flood","why":"t"}"#), [401, 403, 403, 403, 400, 403, 403]),
        ("GET",    format!("{p}/drills"),               None,     [401, 403, 200, 403, 200, 200, 403]),
        ("GET",    format!("{p}/drills/999"),           None,     [401, 403, 404, 403, 404, 404, 403]),
        ("POST",   "/v1/pipelines/other/pause".into(),  Some(why), [401, 403, 403, 403, 403, 403, 403]),
        ("GET",    "/v1/audit".into(),                  None,     [401, 403, 403, 403, 403, 200, 403]),
        ("GET",    "/v1/tokens".into(),                 None,     [401, 403, 403, 403, 403, 200, 403]),
        ("POST",   "/v1/tokens".into(),                 Some(new_token), [401, 403, 403, 403, 403, 200, 403]),
        ("DELETE", revoke,                              None,     [401, 403, 403, 403, 403, 200, 403]),
        ("GET",    "/v1/dashboard".into(),              None,     [401, 403, 200, 403, 200, 200, 200]),
        ("GET",    "/v1/review?since=30d".into(),       None,     [401, 403, 200, 403, 200, 200, 200]),
        ("GET",    "/metrics".into(),                   None,     [401, 403, 200, 403, 200, 200, 200]),
        ("GET",    "/v1/nothing-here".into(),           None,     [401, 404, 404, 404, 404, 404, 404]),
    ];
    let mut wrong = Vec::new();
    for (method, path, body, expected) in &table {
        for (i, token) in tokens.iter().enumerate() {
            let (code, answer) = call(method, &format!("{base}{path}"), token.as_deref(), *body);
            if code != expected[i] {
                wrong.push(format!("{method} {path} as {}: {code}, expected {}: {answer}", ROLES[i], expected[i]));
            }
            if code == 401 || code == 403 {
                let v: Value = serde_json::from_str(&answer).unwrap_or_default();
                let e = v["error"].as_str().unwrap_or_default();
                let clear =
                    if code == 401 { e.contains("token") } else { e.contains("may not") && e.contains("it may") };
                if !clear {
                    wrong.push(format!("{method} {path} as {}: {code} without a clear reason: {answer}", ROLES[i]));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{} of {} answers differ:\n{}", wrong.len(), table.len() * 7, wrong.join("\n"));

    // A wrong or malformed token is a 401 too.
    for bad in ["weir_0123456789abcdef_00", "nonsense", "weir_zz_zz"] {
        assert_eq!(call("GET", &format!("{base}/v1/pipelines"), Some(bad), None).0, 401, "{bad}");
    }
    // Raw payloads: the raw-reader's ledger has them, the reader's does not.
    let raw_ledger = call("GET", &format!("{base}{p}/ledger?why=checking%20a%20bad%20event"), raw, None).1;
    let read_ledger = call("GET", &format!("{base}{p}/ledger"), reader, None).1;
    assert!(raw_ledger.contains("\"payload\"") && raw_ledger.contains("soon"), "{raw_ledger}");
    assert!(
        !read_ledger.contains("\"payload\"") && !read_ledger.contains("soon") && read_ledger.contains("\"reason\""),
        "{read_ledger}"
    );
    // Raw reads, token changes and operator actions are in the audit log, with who, why and from where.
    let audit: Vec<Value> = call("GET", &format!("{base}/v1/audit"), admin, None)
        .1
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let actions: Vec<&str> = audit.iter().map(|a| a["action"].as_str().unwrap()).collect();
    for a in ["contract-add", "token-create", "raw-read", "annotate", "pause", "resume", "replay", "token-revoke"] {
        assert!(actions.contains(&a), "{a} not audited: {actions:?}");
    }
    let raw_read = audit.iter().rfind(|a| a["action"] == "raw-read").unwrap();
    assert_eq!(raw_read["why"], "checking a bad event");
    assert_eq!(raw_read["pipeline"], "paid");
    assert!(raw_read["who"].as_str().unwrap().starts_with("test (token "), "{raw_read}");
    assert!(raw_read["from"].as_str().unwrap().starts_with("127.0.0.1:"), "{raw_read}");
    let cli_made = audit.iter().find(|a| a["action"] == "token-create").unwrap();
    assert!(cli_made["who"].as_str().unwrap().contains("weir command line"), "{cli_made}");
    assert!(!audit.iter().any(|a| a.to_string().contains(&spare)), "a token's secret is never in the audit log");
    // The revoked spare no longer works; the listing has no secrets.
    assert_eq!(call("GET", &format!("{base}/v1/pipelines"), Some(&spare), None).0, 401);
    let listed = call("GET", &format!("{base}/v1/tokens"), admin, None).1;
    assert!(listed.contains(&spare_id) && listed.contains("\"revoked\":\"") && !listed.contains(&spare), "{listed}");

    // Refusals are counted: 401 by reason, 403 by role.
    let metrics = call("GET", &format!("{base}/metrics"), admin, None).1;
    let count = |labels: &str| -> u64 {
        metrics
            .lines()
            .find(|l| l.starts_with(&format!("weir_http_requests_denied_total{{{labels}}}")))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0)
    };
    assert!(count("status=\"401\",reason=\"missing\"") >= 23, "{metrics}");
    assert!(count("status=\"401\",reason=\"malformed\"") >= 2, "{metrics}");
    assert!(count("status=\"401\",reason=\"unknown\"") >= 1, "{metrics}");
    assert!(count("status=\"401\",reason=\"revoked\"") >= 1, "{metrics}");
    assert!(count("status=\"403\",role=\"producer\"") >= 20, "{metrics}");
    assert!(count("status=\"403\",role=\"reader\"") >= 10, "{metrics}");
}

#[test]
fn tokens_expire_and_are_revoked_and_public_metrics_are_a_choice() {
    let st = serve("access-expiry", "[auth]\npublic_metrics = true\n");
    let (base, data) = (&st.base, &st.data);
    let url = format!("{base}/v1/pipelines/paid/status");
    let brief = make_token(data, &["--role", "reader", "--pipeline", "paid", "--expires", "2s"]);
    let lasting = make_token(data, &["--role", "reader", "--pipeline", "paid"]);
    assert_eq!(call("GET", &url, Some(&brief), None).0, 200);
    std::thread::sleep(Duration::from_millis(2_200));
    let (code, answer) = call("GET", &url, Some(&brief), None);
    assert_eq!(code, 401);
    assert!(answer.contains("expired at"), "{answer}");
    assert_eq!(call("GET", &url, Some(&lasting), None).0, 200);

    let id = lasting.split('_').nth(1).unwrap();
    let out = weir(&[&"token", &"revoke", &id, &"--data", data, &"--why", &"left the team"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (code, answer) = call("GET", &url, Some(&lasting), None);
    assert_eq!(code, 401);
    assert!(answer.contains("was revoked at"), "{answer}");
    let listed = weir(&[&"token", &"list", &"--data", data]);
    let listed = text(&listed.stdout);
    assert!(listed.contains(id) && listed.contains("\"revoked\":\"") && !listed.contains(&lasting), "{listed}");
    // Refused before anything is written: a role that names what it does not use, an unknown role.
    let out = weir(&[&"token", &"create", &"--data", data, &"--role", &"producer", &"--name", &"x"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("add --topic"), "{}", text(&out.stderr));
    let out = weir(&[&"token", &"create", &"--data", data, &"--role", &"root", &"--name", &"x"]);
    assert!(text(&out.stderr).contains("is not one of"), "{}", text(&out.stderr));

    // weir.toml made /metrics public; the rest still needs a token.
    assert_eq!(call("GET", &format!("{base}/metrics"), None, None).0, 200);
    assert_eq!(call("GET", &url, None, None).0, 401);
}

#[test]
fn a_tampered_audit_log_fails_verify_at_the_entry() {
    let st = serve("access-audit", "");
    let (base, data) = (&st.base, &st.data);
    let operator = make_token(data, &["--role", "operator", "--pipeline", "paid"]);
    for why in ["one", "two", "three", "four"] {
        let body = format!("{{\"why\":\"{why}\"}}");
        assert_eq!(call("POST", &format!("{base}/v1/pipelines/paid/pause"), Some(&operator), Some(&body)).0, 200);
    }
    let verified = weir(&[&"audit", &"verify", &"--data", data]);
    assert!(verified.status.success(), "{}", text(&verified.stderr));
    let head: Value = serde_json::from_str(text(&verified.stdout).trim()).unwrap();
    let entries = head["entries"].as_i64().unwrap();
    assert!(entries >= 7, "two contracts, a token and four pauses: {head}");
    let pause_seq = |c: &rusqlite::Connection, why: &str| -> i64 {
        c.query_row("SELECT seq FROM audit WHERE why = ?1", [why], |r| r.get(0)).unwrap()
    };
    let db = rusqlite::Connection::open(data.join("weir.db")).unwrap();
    // Updates and deletes are refused by the database itself.
    assert!(db.execute("UPDATE audit SET why = 'nothing'", []).unwrap_err().to_string().contains("append-only"));

    // Someone with the file drops the trigger and rewrites why the second pause happened.
    db.execute_batch("DROP TRIGGER audit_append_only_update; DROP TRIGGER audit_append_only_delete;").unwrap();
    let two = pause_seq(&db, "two");
    db.execute("UPDATE audit SET why = 'routine' WHERE seq = ?1", [two]).unwrap();
    let out = weir(&[&"audit", &"verify", &"--data", data]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains(&format!("audit entry {two}:")) && err.contains("does not match its hash"), "{err}");
    db.execute("UPDATE audit SET why = 'two' WHERE seq = ?1", [two]).unwrap();
    assert!(weir(&[&"audit", &"verify", &"--data", data]).status.success());

    // Recomputing the changed entry's own hash does not help: the next entry names it.
    let three = pause_seq(&db, "three");
    db.execute("UPDATE audit SET hash = 'f00d' WHERE seq = ?1", [two]).unwrap();
    let err = text(&weir(&[&"audit", &"verify", &"--data", data]).stderr);
    assert!(err.contains(&format!("audit entry {two}:")), "{err}");
    let prev: String = db.query_row("SELECT prev_hash FROM audit WHERE seq = ?1", [three], |r| r.get(0)).unwrap();
    db.execute("UPDATE audit SET hash = ?2 WHERE seq = ?1", rusqlite::params![two, prev]).unwrap();
    assert!(weir(&[&"audit", &"verify", &"--data", data]).status.success(), "restored");

    // An entry removed from the middle.
    db.execute("DELETE FROM audit WHERE seq = ?1", [three]).unwrap();
    let out = weir(&[&"audit", &"verify", &"--data", data]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains(&format!("audit entry {}:", three + 1)) && err.contains("missing"), "{err}");

    // Entries removed from the end: the chain still holds, the head kept elsewhere does not.
    let st2 = serve("access-audit-tail", "");
    let data2 = &st2.data;
    let operator = make_token(data2, &["--role", "operator", "--pipeline", "paid"]);
    assert_eq!(
        call("POST", &format!("{}/v1/pipelines/paid/pause", st2.base), Some(&operator), Some("{\"why\":\"x\"}")).0,
        200
    );
    let verified = weir(&[&"audit", &"verify", &"--data", data2]);
    let kept: Value = serde_json::from_str(text(&verified.stdout).trim()).unwrap();
    let kept = kept["head"].as_str().unwrap().to_owned();
    let db2 = rusqlite::Connection::open(data2.join("weir.db")).unwrap();
    db2.execute_batch(
        "DROP TRIGGER audit_append_only_delete; DELETE FROM audit WHERE seq = (SELECT max(seq) FROM audit);",
    )
    .unwrap();
    assert!(weir(&[&"audit", &"verify", &"--data", data2]).status.success());
    let out = weir(&[&"audit", &"verify", &"--data", data2, &"--expect-head", &kept]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("removed from its end"), "{}", text(&out.stderr));
}

#[test]
fn personal_fields_appear_in_no_output_but_the_raw_readers() {
    let s = Scratch::new("access-privacy");
    std::fs::create_dir_all(s.path("contracts")).unwrap();
    let contract = CONTRACT.replace("event_id = \"id\"", "event_id = \"id\"\nwhere = 'email != \"\"'").replace(
        "[[aggregate]]",
        "[dedup]\nhorizon = \"1h\"\n\n[privacy]\npersonal = [\"email\", \"card.last4\"]\n\n[[aggregate]]",
    );
    s.write("contracts/paid.toml", &contract);
    s.write("weir.toml", "");
    let data = s.path("data");
    let admin = make_token(&data, &["--role", "admin"]);
    let (producer, reader, raw, operator) = (
        make_token(&data, &["--role", "producer", "--topic", "*"]),
        make_token(&data, &["--role", "reader", "--pipeline", "*"]),
        make_token(&data, &["--role", "raw-reader", "--topic", "*"]),
        make_token(&data, &["--role", "operator", "--pipeline", "*"]),
    );
    // The server's standard error is kept, to look for the values there too.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let log = std::fs::File::create(s.path("serve.log")).unwrap();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["serve", "--data"])
        .arg(&data)
        .arg("--contracts")
        .arg(s.path("contracts"))
        .arg("--config")
        .arg(s.path("weir.toml"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut server = common::Server { child };
    let base = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while agent().get(&format!("{base}/healthz")).call().is_err() {
        assert!(Instant::now() < deadline, "weir serve did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let secrets = ["alice.private@example.com", "4242-secret", "bob.private@example.com"];
    let with = |id: u32, t_s: i64, email: &str, time: &str| {
        let t = if time.is_empty() {
            weir_engine::time::format_rfc3339_ms(1_764_374_400_000 + t_s * 1_000)
        } else {
            time.to_owned()
        };
        format!(
            r#"{{"id":"p{id}","acct":"a1","t":"{t}","amount":2.50,"email":"{email}","card":{{"last4":"4242-secret","brand":"visa"}}}}"#
        )
    };
    let lines = [
        with(1, 0, "alice.private@example.com", ""),
        with(1, 0, "alice.private@example.com", ""), // a duplicate: in the ledger with its payload
        with(2, 5, "alice.private@example.com", "not a time"), // bad_type, its detail quoting nothing personal
        with(3, 10, "bob.private@example.com", ""),
        with(4, 200, "bob.private@example.com", ""),
        with(5, 1, "bob.private@example.com", ""), // too late once the watermark passed 1m: discarded
    ];
    let (code, answer) =
        call("POST", &format!("{base}/v1/topics/payments/events"), Some(&producer), Some(&(lines.join("\n") + "\n")));
    assert_eq!(code, 200, "{answer}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let p = format!("{base}/v1/pipelines/paid");
    while !call("GET", &format!("{p}/status"), Some(&reader), None).1.contains("\"read\":6") {
        assert!(Instant::now() < deadline, "not read");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    let note = r#"{"from":"2025-11-29T00:00:00Z","to":"2025-11-29T00:01:00Z","note":"checked"}"#;
    assert_eq!(call("POST", &format!("{p}/annotations"), Some(&operator), Some(note)).0, 200);

    // The positive control: the raw-reader sees the values, so they are in what weir holds.
    let raw_ledger = call("GET", &format!("{p}/ledger?why=privacy%20test"), Some(&raw), None).1;
    assert!(raw_ledger.contains("alice.private@example.com") && raw_ledger.contains("4242-secret"), "{raw_ledger}");
    let raw_events = call("GET", &format!("{base}/v1/topics/payments/events?why=privacy%20test"), Some(&raw), None).1;
    assert!(raw_events.contains("bob.private@example.com"), "{raw_events}");

    // Everything else, for every other role.
    let mut outputs: Vec<(String, String)> = Vec::new();
    let rows = call("GET", &format!("{p}/changes"), Some(&reader), None).1;
    assert!(rows.lines().count() >= 1, "{rows}");
    let mut urls = vec![
        format!("{base}/v1/pipelines"),
        format!("{p}/results"),
        format!("{p}/changes"),
        format!("{p}/status"),
        format!("{p}/contract"),
        format!("{p}/ledger"),
        format!("{p}/annotations"),
        format!("{base}/metrics"),
        format!("{base}/v1/dashboard"),
    ];
    for l in rows.lines() {
        let seq = serde_json::from_str::<Value>(l).unwrap()["seq"].clone();
        urls.push(format!("{p}/results/{seq}/provenance"));
    }
    for (who, token) in [("reader", &reader), ("operator", &operator), ("admin", &admin)] {
        for url in &urls {
            let (code, body) = call("GET", url, Some(token), None);
            assert_eq!(code, 200, "{who} {url}: {body}");
            outputs.push((format!("{who} {url}"), body));
        }
    }
    outputs.push(("audit".into(), call("GET", &format!("{base}/v1/audit"), Some(&admin), None).1));
    let ledger = call("GET", &format!("{p}/ledger"), Some(&reader), None).1;
    assert!(ledger.contains("duplicate") && ledger.contains("bad_type") && ledger.contains("too_late"), "{ledger}");
    let _ = server.child.kill();
    let _ = server.child.wait();
    outputs.push(("the server's standard error".into(), std::fs::read_to_string(s.path("serve.log")).unwrap()));
    outputs.push(("weir.db: results".into(), sqlite_text(&data, "SELECT row FROM results")));
    outputs.push(("weir.db: changes".into(), sqlite_text(&data, "SELECT row FROM changes")));
    // The ledger table everyone's reads come from holds masked payloads; the raw ones are in a table of their own.
    let stored = sqlite_text(&data, "SELECT entry FROM ledger");
    assert!(stored.contains("(personal)") && stored.contains("visa"), "masked, not withheld: {stored}");
    outputs.push(("weir.db: ledger".into(), stored));
    let raw_table = sqlite_text(&data, "SELECT entry FROM ledger_raw");
    assert!(raw_table.contains("alice.private@example.com"), "{raw_table}");
    for (what, text) in &outputs {
        for secret in secrets {
            assert!(!text.contains(secret), "{secret} in {what}: {text}");
        }
    }
}

/// Every value of a query's first column, joined.
fn sqlite_text(data: &std::path::Path, query: &str) -> String {
    let db = rusqlite::Connection::open(data.join("weir.db")).unwrap();
    let mut stmt = db.prepare(query).unwrap();
    let rows = stmt.query_map([], |r| r.get::<_, String>(0)).unwrap();
    rows.map(Result::unwrap).collect::<Vec<_>>().join("\n")
}

#[test]
fn ledger_payloads_past_retention_are_erased_from_answers_and_from_disk() {
    let setup = serve("access-retention", "ledger_payload_retention = \"1s\"\n");
    let (producer, raw) = (
        make_token(&setup.data, &["--role", "producer", "--topic", "*"]),
        make_token(&setup.data, &["--role", "raw-reader", "--topic", "*"]),
    );
    let marker = "payload-marker-7f3a";
    let url = format!("{}/v1/topics/payments/events", setup.base);
    let bad = format!(r#"{{"id":"x1","acct":"a1","t":"2026-11-29T00:00:00.000Z","amount":"{marker}"}}"#);
    assert_eq!(call("POST", &url, Some(&producer), Some(&(bad + "\n"))).0, 200);
    let ledger = format!("{}/v1/pipelines/paid/ledger?why=retention-test", setup.base);
    // The entry arrives with its payload; within the retention and a sweep, it loses it.
    let mut seen_payload = false;
    let deadline = Instant::now() + Duration::from_secs(20);
    let entry = loop {
        let (code, body) = call("GET", &ledger, Some(&raw), None);
        assert_eq!(code, 200, "{body}");
        if let Some(line) = body.lines().next() {
            let entry: Value = serde_json::from_str(line).unwrap();
            if entry.get("payload").is_some() {
                assert!(entry["payload"].as_str().unwrap().contains(marker), "{entry}");
                seen_payload = true;
            } else {
                break entry;
            }
        }
        assert!(Instant::now() < deadline, "the payload was not erased: {body}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(seen_payload, "the raw-reader saw the payload before its retention ran out");
    assert_eq!(entry["reason"], "bad_type", "the entry itself stays: {entry}");
    assert!(entry["detail"].as_str().unwrap().contains("erased"), "{entry}");
    // Gone from the database file and its write-ahead log, not only from answers.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let on_disk = ["weir.db", "weir.db-wal"].iter().any(|f| {
            let bytes = std::fs::read(setup.data.join(f)).unwrap_or_default();
            bytes.windows(marker.len()).any(|w| w == marker.as_bytes())
        });
        if !on_disk {
            break;
        }
        assert!(Instant::now() < deadline, "the erased payload is still in weir.db or its WAL");
        std::thread::sleep(Duration::from_millis(200));
    }
}

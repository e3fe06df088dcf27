//! `weir.toml`: what parses, and how each mistake is refused.

use weir_contract::{OtelProtocol, ServerConfig};

#[test]
fn a_full_config_parses_and_missing_topics_get_defaults() {
    let text = r#"listen = "127.0.0.1:9000"
idle_timeout = "5s"
checkpoint_interval = "250ms"
checkpoint_events = 1000

[topics.payments]
partitions = 4
key = "account_id"
retention = "7d"
max_event_bytes = 4096
"#;
    let c = ServerConfig::parse("weir.toml", text).unwrap();
    assert_eq!(c.listen.as_deref(), Some("127.0.0.1:9000"));
    assert_eq!((c.idle_timeout_ms, c.checkpoint_interval_ms, c.checkpoint_events), (5_000, 250, 1000));
    let p = c.topic("payments");
    assert_eq!(
        (p.partitions, p.key.as_deref(), p.retention_ms, p.max_event_bytes),
        (4, Some("account_id"), Some(604_800_000), 4096)
    );
    let other = c.topic("invites");
    assert_eq!((other.partitions, other.key, other.retention_ms), (1, None, None));
    assert_eq!(ServerConfig::parse("weir.toml", "").unwrap(), ServerConfig::default());
}

#[test]
fn mistakes_name_the_file_line_and_key() {
    let cases = [
        ("listen = \"x\"\nport = 1\n", "weir.toml:2: `weir.toml.port`: unknown key"),
        ("[topics.p]\npartitions = 0\n", "weir.toml:2: `topics.p.partitions`: must be a whole number from 1 to 1024"),
        ("[topics.p]\nretention = \"forever\"\n", "weir.toml:2: `topics.p.retention`"),
        ("[topics.p]\nkeys = \"a\"\n", "weir.toml:2: `topics.p.keys`: unknown key"),
        ("checkpoint_interval = \"5s\"\n", "weir.toml:1: `checkpoint_interval`: must be between 1ms and 1s"),
        ("topics = 3\n", "`topics`: must be a table"),
        ("listen = \n", "weir.toml:1: `(toml)`: not valid TOML"),
    ];
    for (text, expected) in cases {
        let err = ServerConfig::parse("weir.toml", text).unwrap_err().to_string();
        assert!(err.contains(expected), "{text:?}: got {err}");
    }
}

#[test]
fn kafka_and_postgres_sections() {
    let text = r#"
[kafka]
brokers = "127.0.0.1:9092,127.0.0.1:9093"
group = "billing"
[kafka.config]
"security.protocol" = "SASL_SSL"
"sasl.mechanism" = "SCRAM-SHA-512"
"session.timeout.ms" = 10000

[postgres]
url = "host=127.0.0.1 user=postgres dbname=test"
"#;
    let c = ServerConfig::parse("weir.toml", text).unwrap();
    let k = c.kafka.unwrap();
    assert_eq!((k.brokers.as_str(), k.group.as_deref()), ("127.0.0.1:9092,127.0.0.1:9093", Some("billing")));
    assert_eq!(k.config["security.protocol"], "SASL_SSL");
    assert_eq!(k.config["session.timeout.ms"], "10000");
    let p = c.postgres.unwrap();
    assert_eq!((p.url.as_str(), p.schema.as_str()), ("host=127.0.0.1 user=postgres dbname=test", "weir"));
    let cases = [
        ("[kafka]\ngroup = \"g\"\n", "`kafka.brokers`"),
        ("[kafka]\nbrokers = \"b\"\ntopic = \"t\"\n", "`kafka.topic`: unknown key"),
        (
            "[kafka]\nbrokers = \"b\"\n[kafka.config]\n\"a\" = [1]\n",
            "`kafka.config.a`: must be a string, number or boolean",
        ),
        ("[postgres]\nschema = \"w\"\n", "`postgres.url`"),
        ("[postgres]\nurl = \"u\"\nschema = \"x; drop\"\n", "weir.toml:3: `postgres.schema`: must be letters"),
    ];
    for (text, expected) in cases {
        let err = ServerConfig::parse("weir.toml", text).unwrap_err().to_string();
        assert!(err.contains(expected), "{text:?}: got {err}");
    }
}

#[test]
fn the_otel_section() {
    let text = r#"
[otel]
endpoint = "https://collector.example:4318/"
protocol = "http/json"
interval = "15s"
[otel.headers]
Authorization = "Bearer abc"
"#;
    let c = ServerConfig::parse("weir.toml", text).unwrap();
    let o = c.otel.unwrap();
    assert_eq!(o.endpoint, "https://collector.example:4318", "one trailing / is dropped: the signal's path is added");
    assert_eq!((o.protocol, o.interval_ms, o.service_name.as_str()), (OtelProtocol::Json, 15_000, "weir"));
    assert_eq!(o.headers.get("authorization").map(String::as_str), Some("Bearer abc"));
    // Headers over http:// to a collector on this machine stay on it.
    for local in ["http://127.0.0.1:4318", "http://localhost:4318", "http://[::1]:4318"] {
        let text = format!("[otel]\nendpoint = \"{local}\"\n[otel.headers]\nAuthorization = \"Bearer abc\"\n");
        assert!(ServerConfig::parse("weir.toml", &text).is_ok(), "{local}");
    }
    let plain = ServerConfig::parse("weir.toml", "[otel]\nendpoint = \"http://127.0.0.1:4318\"\n").unwrap();
    let o = plain.otel.unwrap();
    assert_eq!((o.protocol, o.interval_ms), (OtelProtocol::Protobuf, 60_000), "OTLP's defaults");
    let cases = [
        ("[otel]\nprotocol = \"http/json\"\n", "`otel.endpoint`"),
        (
            "[otel]\nendpoint = \"127.0.0.1:4318\"\n",
            "weir.toml:2: `otel.endpoint`: must be the collector's http:// or https:// URL",
        ),
        (
            "[otel]\nendpoint = \"http://c:4318\"\nprotocol = \"grpc\"\n",
            "weir.toml:3: `otel.protocol`: \"grpc\" is not an OTLP/HTTP encoding",
        ),
        (
            "[otel]\nendpoint = \"http://c:4318\"\ninterval = \"10ms\"\n",
            "weir.toml:3: `otel.interval`: must be between 1s and 1h",
        ),
        (
            "[otel]\nendpoint = \"http://c:4318\"\n[otel.headers]\nx = 3\n",
            "weir.toml:4: `otel.headers.x`: must be a string",
        ),
        ("[otel]\nendpoint = \"http://c:4318\"\nport = 1\n", "weir.toml:3: `otel.port`: unknown key"),
        // Issue 42, finding 8: headers (a token) over plain http:// to another machine.
        (
            "[otel]\nendpoint = \"http://collector.example:4318\"\n[otel.headers]\nAuthorization = \"Bearer abc\"\n",
            "`otel.headers`: would go to collector.example:4318 over plain http://",
        ),
        (
            "[otel]\nendpoint = \"http://10.0.0.7:4318/\"\n[otel.headers]\nx-token = \"t\"\n",
            "use an https:// endpoint, or a collector on this machine",
        ),
    ];
    for (text, expected) in cases {
        let err = ServerConfig::parse("weir.toml", text).unwrap_err().to_string();
        assert!(err.contains(expected), "{text:?}: got {err}");
    }
}

#[test]
fn connections_hold_urls_and_secrets_by_name() {
    let text = r#"[connections.dw]
url = "host=127.0.0.1 user=weir password=secret dbname=dw"

[connections.accounts]
url = "https://accounts.internal/unlock"
headers = { Authorization = "Bearer abc" }
allow_private = true
"#;
    let c = ServerConfig::parse("weir.toml", text).unwrap();
    assert_eq!(c.connections["dw"].url, "host=127.0.0.1 user=weir password=secret dbname=dw");
    assert!(!c.connections["dw"].allow_private);
    let accounts = &c.connections["accounts"];
    assert_eq!(accounts.headers.get("authorization").map(String::as_str), Some("Bearer abc"));
    assert!(accounts.allow_private);
    let cases = [
        ("[connections.a]\nheaders = {}\n", "`connections.a.url`: missing required key"),
        (
            "[connections.a]\nurl = \"x\"\nallow_private = 1\n",
            "weir.toml:3: `connections.a.allow_private`: must be true",
        ),
        ("[connections.a]\nurl = \"x\"\nheaders = { \"a b\" = \"c\" }\n", "weir.toml:3: `connections.a.headers.a b`"),
        ("[connections.a]\nurl = \"x\"\npassword = \"y\"\n", "weir.toml:3: `connections.a.password`: unknown key"),
        ("connections = 1\n", "`connections`: must be a table"),
    ];
    for (text, expected) in cases {
        let err = ServerConfig::parse("weir.toml", text).unwrap_err().to_string();
        assert!(err.contains(expected), "{text:?}: got {err}");
    }
}
